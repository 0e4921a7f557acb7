"""Gaussian random-walk Metropolis–Hastings: the reversible baseline.

Paper 2, App. E.1. The irreversible Gamma sampler is compared with it (paper 2,
App. E.1:
"the random walk MH method with normal proposals"). With ``L Lᵀ =
proposal_cov`` (the identity by default) and ``ε = step_size``,

    z* = z + ε L ξ,   ξ ~ N(0, I_d)
    a  = min(1, π(z*) / π(z))          (the proposal is symmetric)
    accept (prob. a) -> z ← z*,  reject -> z unchanged

which satisfies detailed balance: no direction variable, nothing to flip.
``proposal_cov`` is a scalar, a ``(d,)`` diagonal or a ``(d, d)`` SPD matrix
(the target's covariance is the right shape; warm-up adaptation estimates it);
its factor ``L`` is ``√c``, ``√v`` or the lower Cholesky factor.

Conventions as in :mod:`cenlmc_jax.irreversible.jump`: ``position: (d,)`` or a
pytree (one chain; vmap for many), raveled at the boundary of every step;
``proposal_cov`` sees the flat ``(d,)`` vector's dimension. ``rng_key`` is
split into ``(key_proposal, key_accept)``; a non-finite proposal or a NaN /
+inf log density is a rejection reported in ``info.diverged``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from cenlmc_jax import _linalg as la
from cenlmc_jax._validation import (
    check_callable,
    check_key,
    check_logdensity,
    check_positive,
    check_start_logdensity,
    check_state,
    is_concrete,
)
from cenlmc_jax.base import SamplingAlgorithm
from cenlmc_jax.gradients.estimators import flat_logdensity, ravel_position
from cenlmc_jax.irreversible._common import (
    ZERO_ACCEPTANCE_FLAG,
    from_flat,
    matrix_value,
    metropolis,
    proposal_trouble,
    spd_factor,
)
from cenlmc_jax.types import Array, LogDensityFn, PRNGKey

__all__ = ["RWMHState", "RWMHInfo", "rwmh_init", "rwmh_step", "rwmh"]


class RWMHState(NamedTuple):
    """Gaussian random-walk MH state.

    Attributes:
      position: the chain's position, shape ``(d,)``, or a pytree.
      logdensity: the scalar log density at ``position``.
    """

    position: Any
    logdensity: Array


class RWMHInfo(NamedTuple):
    """What one random-walk MH step reports.

    Attributes:
      acceptance_rate: ``min(1, π(z*)/π(z))`` (0 for a diverged proposal).
      is_accepted: the proposal was accepted.
      grad_evals: gradient evaluations of the step (always 0).
      diverged: the proposal was numerical trouble, and rejected.
    """

    acceptance_rate: Array
    is_accepted: Array
    grad_evals: Array
    diverged: Array

    # a rejection keeps the position: the driver's frozen-chain check does not apply
    may_stay = True
    # ... a zero acceptance probability at every step of a chunk does
    run_flags = (ZERO_ACCEPTANCE_FLAG,)

    @property
    def zero_acceptance(self) -> Array:
        """The acceptance probability was exactly 0 (no draw could be accepted)."""
        return jnp.asarray(self.acceptance_rate) == 0


def _proposal_root(proposal_cov: Any, d: int, dtype) -> Any:
    """The factor ``L`` of ``proposal_cov = L Lᵀ``, in ``dtype``.

    None for the identity.
    """
    if proposal_cov is None:
        return None
    m = matrix_value(proposal_cov)
    la.check_matrix_shape(m, "proposal_cov", d)
    if isinstance(m, np.ndarray):
        la.check_symmetric_psd(
            la.constant_dense(m, d),
            "proposal_cov",
            "the random-walk proposal covariance",
            definite=True,
        )
    return jnp.asarray(spd_factor(m, d)[0], dtype)


def rwmh_init(position: Any, logdensity_fn: LogDensityFn) -> RWMHState:
    """Start Gaussian random-walk MH at ``position``.

    Vmappable over chains; callable inside jit.

    Args:
      position: the starting point, shape ``(d,)``, or a pytree.
      logdensity_fn: the target's log density, ``position -> scalar``.

    Returns:
      The :class:`RWMHState` at ``position`` with its log density.

    Raises:
      ValueError: the log density is not a real scalar, or is ``-inf`` or NaN at
        ``position`` (a concrete one).
    """
    flat, unravel = ravel_position(position)
    check_logdensity(flat_logdensity(logdensity_fn, unravel), flat)
    position = from_flat(unravel, flat)
    logdensity = jnp.asarray(logdensity_fn(position), flat.dtype)
    check_start_logdensity(logdensity)
    return RWMHState(position, logdensity)


def rwmh_step(
    rng_key: PRNGKey,
    state: RWMHState,
    logdensity_fn: LogDensityFn,
    step_size: Any,
    *,
    proposal_cov: Any | None = None,
) -> tuple[RWMHState, RWMHInfo]:
    """One Gaussian random-walk Metropolis–Hastings step (the reversible baseline).

    ``z* = z + step_size·L ξ``, ``ξ ~ N(0, I_d)``, ``L Lᵀ = proposal_cov``
    (``None``: the identity, ``z* = z + step_size·ξ``, BlackJAX's
    ``normal_random_walk(sigma=step_size)`` draw for draw); symmetric, so
    ``a = min(1, π(z*)/π(z))``. ``proposal_cov``: a scalar, ``(d,)`` diagonal
    or ``(d, d)`` SPD matrix — the covariance of the target is the right shape
    (warm-up adaptation estimates it). ``rng_key`` is split into
    ``(key_proposal, key_accept)`` as in
    :func:`~cenlmc_jax.irreversible.jump.irreversible_mh_step`. Pure
    and jittable; vmap over ``(rng_key, state)``.

    Args:
      rng_key: a JAX PRNG key.
      state: the current :class:`RWMHState` (from :func:`rwmh_init`).
      logdensity_fn: the target's log density, ``position -> scalar``.
      step_size: the proposal scale ``ε > 0``.
      proposal_cov: ``None`` (the identity), a scalar, a ``(d,)`` diagonal or a
        ``(d, d)`` SPD matrix, ``d`` the flat position's dimension.

    Returns:
      ``(new_state, info)``: the next :class:`RWMHState` and its
      :class:`RWMHInfo`.
    """
    check_state(state, RWMHState, "rwmh_init, or rwmh(...).init")
    check_key(rng_key)
    check_positive(step_size, "step_size")
    z, unravel = ravel_position(state.position, check=False)
    root = _proposal_root(proposal_cov, z.shape[0], z.dtype)
    key_proposal, key_accept = jax.random.split(rng_key)
    xi = jax.random.normal(key_proposal, z.shape, dtype=z.dtype)
    z_star = z + jnp.asarray(step_size, z.dtype) * (
        xi if root is None else la.matvec(root, xi)
    )
    logdensity_new = jnp.asarray(
        flat_logdensity(logdensity_fn, unravel)(z_star), z.dtype
    )
    accepted, acceptance_rate = metropolis(
        key_accept, logdensity_new - state.logdensity
    )
    diverged = proposal_trouble(z_star, logdensity_new)
    accepted = accepted & ~diverged
    new_state = RWMHState(
        position=from_flat(unravel, jnp.where(accepted, z_star, z)),
        logdensity=jnp.where(accepted, logdensity_new, state.logdensity),
    )
    info = RWMHInfo(
        acceptance_rate=jnp.where(diverged, 0.0, acceptance_rate).astype(z.dtype),
        is_accepted=accepted,
        grad_evals=jnp.zeros((), jnp.int32),
        diverged=diverged,
    )
    return new_state, info


def rwmh(
    logdensity_fn: LogDensityFn, step_size: Any, *, proposal_cov: Any | None = None
) -> SamplingAlgorithm:
    """Gaussian random-walk MH as a sampler object.

    The proposal is ``N(z, step_size² · proposal_cov)``.

    Args:
      logdensity_fn: the target's log density, ``position -> scalar``.
      step_size: the proposal scale ``ε > 0``.
      proposal_cov: ``None`` (the identity), a scalar, a ``(d,)`` diagonal or a
        ``(d, d)`` SPD matrix (checked here when constant; its factor is taken once
        per trace).

    Returns:
      A :class:`~cenlmc_jax.base.SamplingAlgorithm` whose ``init(position,
      rng_key=None)`` calls :func:`rwmh_init` and whose ``step(rng_key, state)``
      calls :func:`rwmh_step`.

    Raises:
      ValueError: ``logdensity_fn`` is not callable, ``step_size`` is not positive,
        or ``proposal_cov`` is not a constant SPD scalar, diagonal or matrix.
    """
    check_callable(logdensity_fn, "logdensity_fn", "z -> scalar log density")
    check_positive(step_size, "step_size")
    if proposal_cov is not None:
        if callable(proposal_cov):
            raise ValueError(
                "proposal_cov must be a constant scalar, (d,) or (d, d) matrix; got "
                f"{proposal_cov!r}."
            )
        la.check_matrix_form(proposal_cov, "proposal_cov")
        if np.ndim(proposal_cov) == 0:
            check_positive(proposal_cov, "proposal_cov")
        elif is_concrete(proposal_cov):
            _proposal_root(
                proposal_cov, np.shape(proposal_cov)[0], jnp.result_type(float)
            )

    def init(position, rng_key=None):
        if rng_key is not None:
            # unused (a deterministic start), but a wrong one is a mistake to report
            check_key(rng_key)
        state = rwmh_init(position, logdensity_fn)
        if proposal_cov is not None and np.ndim(proposal_cov) > 0:
            d = ravel_position(state.position, check=False)[0].shape[0]
            la.check_matrix_shape(np.asarray(proposal_cov), "proposal_cov", d)
        return state

    def step(rng_key, state):
        return rwmh_step(
            rng_key, state, logdensity_fn, step_size, proposal_cov=proposal_cov
        )

    return SamplingAlgorithm(init, step)
