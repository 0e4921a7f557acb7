"""Langevin Monte Carlo on an ensemble (spec section 1).

Ding & Li, *Constrained Ensemble Langevin Monte Carlo*: LMC (the unadjusted
Langevin algorithm, ULA) is the baseline every ensemble method is measured
against. With ``f = -logdensity_fn``,

    x^{m+1} = x^m - h ∇f(x^m) + sqrt(2h) ξ^m,      ξ^m ~ N(0, I_d).

For ``f(x) = |x|²/(2σ²)`` the chain is Gaussian with stationary variance
``σ² / (1 - h/(2σ²))`` per coordinate: the discretisation bias of ULA.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from cenlmc_jax._validation import check_callable, check_logdensity, check_positions, check_positive, check_state
from cenlmc_jax.base import SamplingAlgorithm
from cenlmc_jax.types import Array, ArrayLike, LogDensityFn, PRNGKey

__all__ = ["LMCState", "LMCInfo", "lmc_init", "lmc_step", "lmc"]


class LMCState(NamedTuple):
    """Ensemble state of LMC.

    position: (N, d) particles.
    logdensity: (N,) ``logdensity_fn`` at each particle.
    logdensity_grad: (N, d) its gradient, reused by the next step.
    """

    position: Array
    logdensity: Array
    logdensity_grad: Array


class LMCInfo(NamedTuple):
    """What one LMC step did.

    grad_evals: gradient evaluations done this step (= N).
    num_nonfinite: particles whose new position or log density is NaN/inf.
    diverged: ``num_nonfinite > 0``.
    """

    grad_evals: Array
    num_nonfinite: Array
    diverged: Array


def value_and_grad_ensemble(logdensity_fn: LogDensityFn, positions: Array) -> tuple[Array, Array]:
    """``logdensity_fn`` and its gradient at every particle: (N,), (N, d)."""
    return jax.vmap(jax.value_and_grad(logdensity_fn))(positions)


def count_nonfinite(position: Array, logdensity: Array) -> Array:
    """Number of particles whose position or log density is not finite."""
    bad = ~jnp.all(jnp.isfinite(position), axis=-1) | ~jnp.isfinite(logdensity)
    return jnp.sum(bad, dtype=jnp.int32)


def lmc_init(positions: ArrayLike, logdensity_fn: LogDensityFn) -> LMCState:
    """Start LMC from ``positions: (N, d)``; evaluates the N gradients once."""
    positions = check_positions(positions)
    check_logdensity(logdensity_fn, positions[0])
    logdensity, grad = value_and_grad_ensemble(logdensity_fn, positions)
    return LMCState(positions, logdensity, grad)


def lmc_step(
    rng_key: PRNGKey,
    state: LMCState,
    logdensity_fn: LogDensityFn,
    step_size: float,
) -> tuple[LMCState, LMCInfo]:
    """One unadjusted Langevin step for every particle.

    ``x' = x + h ∇log p(x) + sqrt(2h) ξ`` with ``h = step_size``; pure and
    jittable. The gradient at ``x'`` is evaluated here (N evaluations) and
    stored in the state for the next step.
    """
    check_state(state, LMCState, "lmc_init")
    check_positive(step_size, "step_size")
    x = state.position
    h = jnp.asarray(step_size, dtype=x.dtype)
    noise = jax.random.normal(rng_key, x.shape, dtype=x.dtype)
    new_x = x + h * state.logdensity_grad + jnp.sqrt(2.0 * h) * noise
    logdensity, grad = value_and_grad_ensemble(logdensity_fn, new_x)
    bad = count_nonfinite(new_x, logdensity)
    info = LMCInfo(
        grad_evals=jnp.asarray(x.shape[0], jnp.int32),
        num_nonfinite=bad,
        diverged=bad > 0,
    )
    return LMCState(new_x, logdensity, grad), info


def lmc(logdensity_fn: LogDensityFn, step_size: float) -> SamplingAlgorithm:
    """LMC (ULA) on an ensemble as a sampler object.

    ``init(positions, rng_key=None)``: :func:`lmc_init` on ``positions: (N, d)``.
    ``step(rng_key, state)``: :func:`lmc_step` with this ``step_size``.
    """
    check_callable(logdensity_fn, "logdensity_fn", "x -> scalar log density")
    check_positive(step_size, "step_size")

    def init(positions, rng_key=None):
        del rng_key  # deterministic start
        return lmc_init(positions, logdensity_fn)

    def step(rng_key, state):
        return lmc_step(rng_key, state, logdensity_fn, step_size)

    return SamplingAlgorithm(init, step)
