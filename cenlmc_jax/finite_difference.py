"""Gradients by finite differences, for models JAX cannot differentiate.

For a black-box log density (a NumPy or SciPy model behind
``jax.pure_callback``, an external simulator) ``jax.grad`` has nothing to
differentiate. A finite-difference gradient needs values only:

    central:  ∂_k log π(x) ≈ (log π(x + δ_k e_k) - log π(x - δ_k e_k)) / (2 δ_k)    2d values, error O(δ²)
    forward:  ∂_k log π(x) ≈ (log π(x + δ_k e_k) - log π(x)) / δ_k                 d + 1 values, error O(δ)

with ``δ_k = step · max(1, |x_k|)`` (a relative step away from 0). The default
steps balance truncation against rounding of the values: ``ε^{1/3}`` (central)
and ``ε^{1/2}`` (forward) in the dtype's machine epsilon ``ε``. All the
shifted points are evaluated in ONE vmapped call of ``logdensity_fn``, so a
model behind ``pure_callback(..., vmap_method="expand_dims")`` sees one
batched call per gradient.

The returned function carries ``model_solves(d)`` (2d or d + 1), which the
samplers use to count a step's cost in model evaluations (``info.model_solves``).
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from cenlmc_jax._validation import check_callable, check_choice, check_positive
from cenlmc_jax.types import Array, LogDensityFn

__all__ = ["FiniteDifferenceGrad", "finite_difference"]


class FiniteDifferenceGrad:
    """``x: (d,) -> ∇ log π(x) (d,)`` by finite differences (see :func:`finite_difference`)."""

    def __init__(self, logdensity_fn: LogDensityFn, step: float | None, scheme: str):
        self.logdensity_fn = logdensity_fn
        self.step = step
        self.scheme = scheme

    def model_solves(self, d: int) -> int:
        """Evaluations of ``logdensity_fn`` per gradient: 2d (central) or d + 1 (forward)."""
        return 2 * d if self.scheme == "central" else d + 1

    def __call__(self, x: Array) -> Array:
        d = x.shape[-1]
        eps = jnp.finfo(x.dtype).eps
        step = self.step if self.step is not None else (eps ** (1 / 3) if self.scheme == "central" else eps**0.5)
        delta = jnp.asarray(step, x.dtype) * jnp.maximum(1.0, jnp.abs(x))
        shifts = jnp.eye(d, dtype=x.dtype) * delta  # row k: δ_k e_k
        if self.scheme == "central":
            points = jnp.concatenate([x + shifts, x - shifts])
        else:
            points = jnp.concatenate([x + shifts, x[None, :]])
        values = jax.vmap(lambda y: jnp.asarray(self.logdensity_fn(y), x.dtype))(points)
        if self.scheme == "central":
            return (values[:d] - values[d:]) / (2 * delta)
        return (values[:d] - values[d]) / delta

    def __repr__(self) -> str:
        return f"finite_difference({self.logdensity_fn!r}, step={self.step!r}, scheme={self.scheme!r})"


def finite_difference(logdensity_fn: LogDensityFn, *, step: float | None = None,
                      scheme: str = "central") -> Callable[[Array], Array]:
    """A gradient ``x: (d,) -> ∇ log π(x)`` by finite differences of ``logdensity_fn`` (module docstring).

    Args:
      logdensity_fn: ``x: (d,) -> scalar``; may be a black box behind ``jax.pure_callback``.
      step: relative step ``δ_k / max(1, |x_k|)``; None: ``ε^{1/3}`` (central) or ``ε^{1/2}`` (forward).
      scheme: ``"central"`` (2d values, O(δ²)) or ``"forward"`` (d + 1 values, O(δ)).

    Pass it as ``grad_fn=`` to ``cj.lmc``, ``cj.enlmc`` or ``cj.cenlmc``.
    """
    check_callable(logdensity_fn, "logdensity_fn", "x -> scalar log density")
    check_choice(scheme, "scheme", ("central", "forward"))
    if step is not None:
        check_positive(step, "step")
    return FiniteDifferenceGrad(logdensity_fn, step, scheme)
