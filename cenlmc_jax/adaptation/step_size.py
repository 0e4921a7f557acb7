"""Step sizes for the unadjusted samplers (LMC, SGLD, SGHMC) from warm-up curvature.

The unadjusted samplers have no acceptance to aim at; their
step size comes from the curvature met during warm-up:
:func:`max_curvature` (power iteration on Hessian-vector products of the
gradient at warm-up draws) and :func:`langevin_step_size` (the step whose
discretisation inflates the variance of the stiffest Gaussian direction by a
chosen ``bias``, exactly for ULA, by the discrete Lyapunov equation for SGHMC).
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from cenlmc_jax._validation import (
    check_callable,
    check_choice,
    check_int,
    check_positive,
)
from cenlmc_jax.gradients.modes import check_grad_mode
from cenlmc_jax.types import Array, GradEstimator, PRNGKey

__all__ = ["max_curvature", "langevin_step_size"]


def max_curvature(
    grad_estimator: GradEstimator,
    positions: Array,
    rng_key: PRNGKey,
    *,
    num_iters: int = 30,
    grad_mode: str = "auto",
) -> Array:
    """The largest ``|λ|`` of the Hessian of ``log π`` at ``positions``.

    By power iteration.

    At each position ``x``, ``v ← H v / |H v|`` with ``H v`` the Hessian-vector
    product ``jax.jvp`` of ``x -> grad_estimator(key, x)`` (one key per
    position, fixed over the iterations: for a minibatch estimator this is the
    Hessian of one minibatch, unbiased for the full one). For a Gaussian the
    result is ``1 / λ_min(Σ)`` at any point; pass draws from a warm-up (e.g. the
    states of :func:`window_adaptation`'s ``"mala"`` run) so that the stiffest
    region the sampler visits is covered.

    Args:
      grad_estimator: ``(rng_key, x) -> ∇log π(x)``, ``x: (d,)``.
      positions: the points, shape ``(C, d)``.
      rng_key: split into one key per position.
      num_iters: power iterations, ``>= 1``.
      grad_mode: how ``H v`` is differentiated from the estimator: ``"forward"``
        (``jax.jvp``: forward-over-whatever the estimator does, e.g.
        ``grad_estimator_from_logdensity(..., grad_mode=...)``), ``"reverse"``
        (``jax.vjp``: ``vᵀH = (Hv)ᵀ`` for the symmetric Hessian; for an estimator
        that only has a reverse rule, a ``jax.custom_vjp`` adjoint), or ``"auto"``
        (default) = forward: ``H v`` is ONE directional derivative of the
        gradient whatever d is, so the d-based crossover of
        :func:`cenlmc_jax.gradients.modes.resolve_grad_mode` does not apply here;
        the gradient's own mode is the estimator's. Both give the same result up
        to rounding.

    Returns:
      The maximum over positions of ``|vᵀ H v|`` after ``num_iters`` iterations (a
      lower bound of each ``|λ_max|`` that converges geometrically), a scalar.

    Raises:
      ValueError: ``grad_estimator`` not callable, ``num_iters < 1``, an unknown
        ``grad_mode``, or ``positions`` not of shape ``(C, d)``.
    """
    check_callable(
        grad_estimator,
        "grad_estimator",
        "(rng_key, x) -> gradient of the log density at x",
    )
    num_iters = check_int(num_iters, "num_iters", minimum=1)
    forward = check_grad_mode(grad_mode) != "reverse"
    positions = jnp.asarray(positions)
    if positions.ndim != 2:
        raise ValueError(
            f"positions must have shape (C, d); got {tuple(positions.shape)}."
        )

    def at(key, x):
        def g(y):
            return jnp.asarray(grad_estimator(key, y), x.dtype)

        def hvp(v):
            if forward:
                return jax.jvp(g, (x,), (v,))[1]
            return jax.vjp(g, x)[1](v)[0]

        v0 = jnp.ones_like(x) / math.sqrt(x.shape[0])

        def body(_, v):
            hv = hvp(v)
            return hv / jnp.maximum(jnp.linalg.norm(hv), jnp.finfo(x.dtype).tiny)

        v = lax.fori_loop(0, num_iters, body, v0)
        return jnp.abs(v @ hvp(v))

    keys = jax.random.split(rng_key, positions.shape[0])
    return jnp.max(jax.jit(jax.vmap(at))(keys, positions))


def _sghmc_variance_ratio(h: float, friction: float) -> float:
    """Stationary ``L·Var θ`` of SGHMC's Euler recursion on ``U = L θ²/2``.

    ``h = ε²L``, friction scaled. With ``ε`` and ``L``: ``θ' = θ + ε r``,
    ``r' = (1 - εC) r - εLθ + sqrt(2Cε) ξ``; in units ``u = sqrt(L) θ`` it depends
    on ``a = ε sqrt(L)`` and ``c = εC`` only. Solved exactly: ``P = A P Aᵀ + N``
    (discrete Lyapunov), ``vec P = (I - A⊗A)⁻¹ vec N``.
    """
    a = math.sqrt(h)
    c = friction
    A = np.array([[1.0, a], [-a, 1.0 - c]])
    N = np.diag([0.0, 2.0 * c])
    if (
        np.max(np.abs(np.linalg.eigvals(A))) >= 1.0 - 1e-9
    ):  # unstable (or on the edge): no stationary law
        return math.inf
    P = np.linalg.solve(np.eye(4) - np.kron(A, A), N.reshape(-1)).reshape(2, 2)
    return float(P[0, 0])


def langevin_step_size(
    curvature: Any, *, sampler: str = "lmc", bias: float = 0.05, friction: float = 1.0
) -> float:
    """The step size at which discretisation inflates the stiffest variance by ``bias``.

    The stiffest direction is a Gaussian of precision ``L = curvature``.
    ``sampler="lmc"`` (also SGLD: the same Euler step; SGLD's gradient noise adds
    to this): ULA on ``N(0, 1/L)`` has stationary variance ``1 / (L (1 - εL/2))``
    (docs/algorithms.md §1), so ``ε = 2 bias / ((1 + bias) L)``, below ULA's
    stability limit ``2/L``. ``sampler="sghmc"`` (``cj.sghmc`` with
    ``friction = C``, a scalar): the variance of ``θ`` from the exact stationary
    covariance of the Euler recursion (:func:`_sghmc_variance_ratio`), solved for
    ``ε`` by bisection.

    Use it with :func:`max_curvature` at warm-up draws. The bias in directions
    of smaller curvature is smaller; the step trades that bias against mixing
    (a smaller ``bias`` means slower mixing in the flat directions).

    Args:
      curvature: ``L > 0``, e.g. from :func:`max_curvature`.
      sampler: ``"lmc"``, ``"sgld"`` or ``"sghmc"``.
      bias: the relative inflation of the stationary variance, ``> 0``.
      friction: SGHMC's friction ``C > 0`` (unused for LMC / SGLD).

    Returns:
      The step size ``ε``, a Python float.

    Raises:
      ValueError: an unknown ``sampler``, or a parameter not ``> 0``.
    """
    check_choice(sampler, "sampler", ("lmc", "sgld", "sghmc"))
    check_positive(curvature, "curvature")
    check_positive(bias, "bias")
    check_positive(friction, "friction")
    L, b = float(curvature), float(bias)
    if sampler in ("lmc", "sgld"):
        return 2.0 * b / ((1.0 + b) * L)

    def ratio(eps):
        return _sghmc_variance_ratio(eps * eps * L, eps * friction)

    lo, hi = 0.0, 1e-3 / (friction + math.sqrt(L))
    while (
        ratio(hi) < 1.0 + b
    ):  # bracket: double until the bias is reached (or the recursion is unstable)
        lo, hi = hi, 2.0 * hi
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        if ratio(mid) > 1.0 + b:
            hi = mid
        else:
            lo = mid
    return lo
