"""Theorem 3.3 of Ding & Li: CEnLMC and LMC coupled by the same noise stay close.

CEnLMC (``x``) and LMC (``z``, eq. 3.24) start from the same positions and
draw the same ``ξ^m`` at every step; the theorem bounds ``E|x_i^m - z_i^m|``
(μ-convex f) by
``O(sqrt(R1^d κ M_f d / (μ η^d N*)) · exp(R1(R1+R2)/(2h)) + κ η d)``.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from cenlmc_jax._validation import check_bool, check_int
from cenlmc_jax.ensemble.cenlmc import cenlmc_init, cenlmc_step, check_cenlmc_params
from cenlmc_jax.ensemble.lmc import lmc_init, lmc_step
from cenlmc_jax.types import ArrayLike, LogDensityFn, PRNGKey

__all__ = ["coupling_distance"]


@functools.partial(
    jax.jit, static_argnames=("logdensity_fn", "num_steps", "n_star", "step_kwargs")
)
def _coupled_run(
    rng_key,
    cstate,
    lstate,
    logdensity_fn,
    num_steps,
    step_size,
    eta,
    r1,
    r2,
    n_star,
    m_f,
    step_kwargs,
):
    kwargs = dict(step_kwargs)

    def body(carry, t):
        cs, ls = carry
        key = jax.random.fold_in(rng_key, t)  # one key per step, used by both samplers
        cs, info = cenlmc_step(
            key, cs, logdensity_fn, step_size, eta, r1, r2, n_star, m_f, **kwargs
        )
        ls, _ = lmc_step(key, ls, logdensity_fn, step_size)
        dist = jnp.mean(jnp.linalg.norm(cs.position - ls.position, axis=-1))
        return (cs, ls), (dist, info)

    _, (dist, infos) = lax.scan(body, (cstate, lstate), jnp.arange(num_steps))
    return dist, infos


def coupling_distance(
    rng_key: PRNGKey,
    positions: ArrayLike,
    logdensity_fn: LogDensityFn,
    num_steps: int,
    step_size: float,
    eta: float,
    r1: float,
    r2: float,
    n_star: int,
    m_f: float,
    f_star: float | None = None,
    *,
    return_info: bool = False,
    **step_kwargs: Any,
):
    """The coupling of Theorem 3.3: ``E|x_i^m - z_i^m|`` for m = 1..num_steps.

    Runs CEnLMC (``x``) and LMC (``z``, eq. 3.24) from the same ``positions``
    with the same noise ``ξ^m`` (both steps draw
    ``jax.random.normal(key_m, (N, d))`` from ``key_m = fold_in(rng_key, m)``) and
    returns the particle average of ``|x_i^m - z_i^m|`` after each step. The
    theorem bounds it (μ-convex f) by
    ``O(sqrt(R1^d κ M_f d / (μ η^d N*)) · exp(R1(R1+R2)/(2h)) + κ η d)``.

    Args:
      rng_key: the run's key.
      positions: the common start, ``(N, d)``.
      logdensity_fn: ``x: (d,) -> log π(x) + const``.
      num_steps: steps, ``>= 1``.
      step_size: h > 0.
      eta: η > 0.
      r1: R1 >= 0.
      r2: R2 >= 0.
      n_star: N*, an integer in ``[0, N-1]``.
      m_f: M_f >= 0.
      f_star: f* = min f, or None (found by :func:`cenlmc_init`).
      return_info: also return the stacked :class:`CEnLMCInfo` of the CEnLMC run.
      **step_kwargs: go to :func:`cenlmc_step` (``grad_capacity``, ``method``,
        ...).

    Returns:
      The distances, shape ``(num_steps,)``; with ``return_info=True``,
      ``(distance, infos)``.

    Raises:
      ValueError: a bad argument (checked before tracing).
    """
    num_steps = check_int(num_steps, "num_steps", minimum=1)
    check_bool(return_info, "return_info")
    cstate = cenlmc_init(positions, logdensity_fn, f_star)
    lstate = lmc_init(cstate.position, logdensity_fn)
    # validate the step's parameters once, in Python, before tracing
    check_cenlmc_params(cstate.position.shape[0], step_size, eta, r1, r2, n_star, m_f)
    dist, infos = _coupled_run(
        rng_key,
        cstate,
        lstate,
        logdensity_fn,
        int(num_steps),
        step_size,
        eta,
        r1,
        r2,
        int(n_star),
        m_f,
        tuple(sorted(step_kwargs.items())),
    )
    return (dist, infos) if return_info else dist
