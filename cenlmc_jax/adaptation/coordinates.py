"""The whitened coordinates of ``cj.langevin_warmup``'s exact phases.

``y = L⁻¹(x − m)`` with ``M = L Lᵀ`` (:func:`whitening_factor`): the kinetic phase
(:mod:`cenlmc_jax.adaptation.kinetic`) and the adjusted phase
(:mod:`cenlmc_jax.adaptation.adjusted`) move the ensemble in ``y``, where the
posterior's scale is about 1, and share these conversions and the log density with
its ``y``-gradient ``Lᵀ ∇log π``.
"""

from __future__ import annotations

from functools import partial

import jax
import numpy as np

from cenlmc_jax.gradients.ensemble import value_and_grad_ensemble

__all__ = [
    "STATIC",
    "whitening_factor",
    "to_x",
    "to_y",
    "value_and_grad_y",
    "values_y",
]

#: The static arguments of the phases' jitted programs: the model is part of the
#: program, so a second call with the same function reuses its compilation.
STATIC = ("logdensity_fn", "grad_fn", "grad_mode")


def to_x(factor, mean, y):
    """``x = m + L y`` for each row of ``y``.

    Args:
      factor: ``L``, ``(d, d)`` or a ``(d,)`` diagonal.
      mean: ``m``, ``(d,)``.
      y: ``(N, d)``.

    Returns:
      ``(N, d)`` in ``x``.
    """
    return mean + (y @ factor.T if factor.ndim == 2 else y * factor)


def value_and_grad_y(logdensity_fn, grad_fn, grad_mode, factor, mean, y):
    """``log π(m + L y)`` and its ``y``-gradient ``Lᵀ ∇log π`` at every particle.

    Args:
      logdensity_fn: ``x: (d,) -> log π(x)``.
      grad_fn: the user's gradient, or None (autodiff).
      grad_mode: the autodiff mode.
      factor: ``L``.
      mean: ``m``.
      y: ``(N, d)``.

    Returns:
      ``(values (N,), y-gradients (N, d))``.
    """
    v, g = value_and_grad_ensemble(
        logdensity_fn, to_x(factor, mean, y), grad_fn, grad_mode
    )
    return v, (g @ factor if factor.ndim == 2 else g * factor)


@partial(jax.jit, static_argnames=STATIC)
def values_y(y, factor, mean, logdensity_fn, grad_fn, grad_mode):
    """:func:`value_and_grad_y` as one jitted program (the model static).

    Args:
      y: ``(N, d)``.
      factor: ``L``.
      mean: ``m``.
      logdensity_fn: ``x: (d,) -> log π(x)``.
      grad_fn: the user's gradient, or None.
      grad_mode: the autodiff mode.

    Returns:
      ``(values (N,), y-gradients (N, d))``.
    """
    return value_and_grad_y(logdensity_fn, grad_fn, grad_mode, factor, mean, y)


def whitening_factor(m_mat: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(L, L⁻¹)`` with ``L Lᵀ = M``: ``L = V Λ^{1/2}`` from ``M``'s eigenvectors
    (eigenvalues floored at ``10⁻¹²`` of the largest, so a Laplace ``M`` of condition
    near 10¹⁰ still factors); the square root of a diagonal.

    Args:
      m_mat: ``M``, ``(d, d)`` or a ``(d,)`` diagonal.

    Returns:
      ``(L, L⁻¹)`` in ``M``'s form.
    """
    if m_mat.ndim == 1:
        root = np.sqrt(m_mat)
        return root, 1.0 / root
    lam, vec = np.linalg.eigh(0.5 * (m_mat + m_mat.T))
    lam = np.maximum(lam, 1e-12 * np.max(lam))
    return vec * np.sqrt(lam), (vec / np.sqrt(lam)).T


def to_y(inverse_factor: np.ndarray, mean: np.ndarray, x) -> np.ndarray:
    """``y = L⁻¹(x − m)`` for each row of ``x``, in float64 NumPy.

    Args:
      inverse_factor: ``L⁻¹``.
      mean: ``m``.
      x: ``(N, d)``.

    Returns:
      ``(N, d)`` in ``y``.
    """
    x = np.asarray(x, np.float64) - mean
    return x @ inverse_factor.T if inverse_factor.ndim == 2 else x * inverse_factor
