"""The irreversible jump sampler with a direction variable.

docs/algorithms.md §7; paper 2, App. C.

Ma, Fox, Chen & Wu, *A unifying framework for irreversible MCMC*. The state
``z`` is lifted with a direction ``s`` (the paper's ``z^p``, uniform
marginal). With a forward proposal density ``f̃(z*|z, s)`` and a backward
density ``g̃(z|z*, s)`` that satisfy the pairing (docs/algorithms.md §7; the identity
``f̃(z, ·|y, -y^p) = g̃(z, ·|y, y^p)`` of paper 2, App. C.3, that makes the
anti-symmetric kernel ``A`` of eq. (20) integrate to zero, eqs. (21)–(22))

    f̃(· | y, -s) = g̃(· | y, s),                                            (7.1)

one step is

    z* ~ f̃(· | z, s)
    a  = min(1, π(z*) g̃(z | z*, s) / (π(z) f̃(z* | z, s)))                   (7.2)
    accept (prob. a) -> z ← z*,  s unchanged
    reject           -> z unchanged, s ← -s   (the WHOLE direction vector)

``π(z)·Unif(s)`` is stationary without detailed balance: by (7.1) the move
``(z, s) -> (z*, s)`` is balanced by the move ``(z*, -s) -> (z, -s)`` (skew
detailed balance; the jump operator split into a symmetric kernel ``S`` and an
anti-symmetric one ``A``, paper 2, App. C.1, eqs. (14)–(19)), and the flip on
rejection supplies exactly the mass that the unequal rejection probabilities
of ``s`` and ``-s`` remove. The chain keeps moving in one direction until a
rejection turns it around.

Proposals are pluggable: a :class:`Proposal` is a NamedTuple of pure functions
``sample(rng_key, position, direction) -> z*``, ``log_forward(z*, z, s) =
log f̃(z*|z, s)`` and ``log_backward(z, z*, s) = log g̃(z|z*, s)``; the step
only ever uses the general ratio (7.2). A proposal whose densities need
``∇log π`` (the SDE proposal) also gives ``point_fn(z) -> (log π(z), cache)``:
everything that depends on the point alone (the gradient and the drift
pieces), computed once when the point is proposed and kept in the state
(``state.cache``), as BlackJAX's MALA keeps its gradient. Its three functions
then take that cache as a fourth argument, so a step evaluates ``∇log π``
once, at ``z*``. The shipped proposals (the Gamma and SDE ones) are in
:mod:`cenlmc_jax.irreversible.proposals`.

Positions: one chain's ``position`` is a ``(d,)`` array or a pytree (a dict
of parameters); a pytree is flattened with ``jax.flatten_util.ravel_pytree``
at the boundary of every step (:func:`cenlmc_jax.gradients.estimators.ravel_position`):
``logdensity_fn`` sees the pytree, proposals see the flat ``(d,)`` vector,
and the state keeps the pytree.

Conventions: ``position: (d,)`` or a pytree (one chain; vmap for many),
``logdensity_fn(z) = log π(z) + const = -H(z)``. The direction has the dtype of the
position (so ``s * jump`` needs no cast). ``rng_key`` is split once, ``key_proposal,
key_accept = jax.random.split(rng_key)``: ``key_proposal`` goes to ``proposal.sample``.
Inside a run, numerical trouble (a non-finite proposal, a NaN or +inf log density) is a
rejection and is reported in ``info.diverged``; ``-inf`` (zero density) at a finite
``z*`` is an ordinary rejection.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from cenlmc_jax._validation import (
    check_bool,
    check_callable,
    check_key,
    check_logdensity,
    check_output,
    check_start_logdensity,
    check_state,
    is_concrete,
)
from cenlmc_jax.base import SamplingAlgorithm
from cenlmc_jax.gradients.estimators import flat_logdensity, ravel_position
from cenlmc_jax.irreversible._common import (
    ZERO_ACCEPTANCE_FLAG,
    from_flat,
    metropolis,
    proposal_trouble,
)
from cenlmc_jax.types import Array, LogDensityFn, PRNGKey

__all__ = [
    "Proposal",
    "IrreversibleMHState",
    "IrreversibleMHInfo",
    "irreversible_mh_init",
    "irreversible_mh_step",
    "irreversible_mh",
]


# --------------------------------------------------------------------------- types


class Proposal(NamedTuple):
    """A forward/backward proposal pair for :func:`irreversible_mh_step`.

    Positions here are flat ``(d,)`` vectors (a pytree position is raveled by the
    step).

    Attributes:
      sample: ``(rng_key, position, direction[, cache]) -> z*``, a draw from
        ``f̃(· | position, direction)``.
      log_forward: ``(z_star, position, direction[, cache]) -> log f̃(z* | z, s)``
        (scalar); ``cache`` is the one at ``position``.
      log_backward: ``(position, z_star, direction[, cache]) -> log g̃(z | z*, s)``
        (scalar); ``cache`` is the one at ``z_star``. The pair must satisfy
        ``f̃(·|y, -s) = g̃(·|y, s)`` (docs/algorithms.md §7) for the chain to
        leave ``π`` invariant.
      direction_size: ``None`` for one sign per coordinate
        (``direction: (d,)``), ``1`` for one sign shared by the whole vector
        (``direction: (1,)``).
      grad_evals: gradients of ``logdensity_fn`` one step needs (Python int).
      check: ``position -> None``; raises ``ValueError`` when the proposal
        cannot be used at this (concrete) point (e.g. ``D(z)`` not positive
        definite).
      point_fn: ``None``, or ``position -> (log π(position), cache)`` with
        ``cache`` a pytree of what the three functions need at a point (e.g.
        ``∇log π`` and the drift). ``position`` is in the user's form (array or
        pytree). With it, the three functions are called with the cache as a
        fourth argument, and the state carries the cache of its point: one
        evaluation per proposed point. Without it, they are called with three.
      logdensity_fn: the log density ``point_fn`` evaluates. When it is the
        sampler's own ``logdensity_fn`` (the same object), the step takes
        ``log π(z*)`` from ``point_fn`` instead of evaluating it again.
    """

    sample: Callable[..., Array]
    log_forward: Callable[..., Array]
    log_backward: Callable[..., Array]
    direction_size: int | None = None
    grad_evals: int = 0
    check: Callable[[Array], None] = lambda position: None
    point_fn: Callable[[Any], tuple[Array, Any]] | None = None
    logdensity_fn: Callable | None = None


class IrreversibleMHState(NamedTuple):
    """State of the irreversible jump sampler (one chain).

    Attributes:
      position: (d,) or a pytree, the sample ``z``.
      direction: (d,) or (1,) signs in {-1, +1}, dtype of ``position``
        (see :attr:`Proposal.direction_size`).
      logdensity: scalar ``logdensity_fn(position)``.
      cache: the proposal's per-point values at ``position`` (``()`` for a
        proposal without ``point_fn``; an
        :class:`~cenlmc_jax.irreversible.proposals.SDEPoint` for
        :func:`~cenlmc_jax.irreversible.proposals.sde_proposal`).
    """

    position: Any
    direction: Array
    logdensity: Array
    cache: Any = ()


class IrreversibleMHInfo(NamedTuple):
    """What one step did (one chain).

    Attributes:
      acceptance_rate: ``a`` of (7.2), in [0, 1].
      is_accepted: the proposal was accepted.
      direction_flipped: the direction was reversed (a rejection, unless
        ``flip_on_reject=False``).
      grad_evals: gradient evaluations of ``logdensity_fn`` (0 for the Gamma
        proposal, 1 for an SDE proposal: at ``z*``; the one at ``z`` is in the
        state).
      diverged: the proposal, its log density or its proposal density was
        NaN/inf where the target density is positive (the move was rejected).
    """

    acceptance_rate: Array
    is_accepted: Array
    direction_flipped: Array
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


# ------------------------------------------------------------------------ helpers


def _direction_shape(proposal: Proposal | None, position: Array) -> tuple:
    size = getattr(proposal, "direction_size", None)
    return position.shape if size is None else (size,)


def _select(accepted: Array, new: Any, old: Any) -> Any:
    return jax.tree_util.tree_map(lambda a, b: jnp.where(accepted, a, b), new, old)


def _checked_sample(z_star: Any, z: Array) -> Array:
    """``proposal.sample``'s draw, shaped like the flat position.

    A static check: free when traced.
    """
    check_output(
        z_star,
        "proposal.sample",
        what="(rng_key, position, direction) -> z* shaped like position",
        like=z,
    )
    return jnp.asarray(z_star).astype(z.dtype)


def _log_q(log_backward: Any, log_forward: Any) -> Array:
    """``log g̃ - log f̃``, each a scalar.

    A ``(d,)`` one would turn the accept decision into a per-coordinate one.
    """
    for name, v in (
        ("proposal.log_backward", log_backward),
        ("proposal.log_forward", log_forward),
    ):
        check_output(v, name, what="a scalar log proposal density", shapes=((),))
    return log_backward - log_forward


def _check_proposal(proposal: Any) -> None:
    if not all(
        callable(getattr(proposal, f, None))
        for f in ("sample", "log_forward", "log_backward")
    ):
        raise ValueError(
            "proposal must be a Proposal (sample, log_forward, log_backward "
            "callables), e.g. gamma_proposal(...) or sde_proposal(...); got "
            f"{type(proposal).__name__}."
        )


def _point(
    proposal: Proposal | None, logdensity_fn: LogDensityFn, position: Any, flat_fn
) -> tuple[Array, Any]:
    """``(log π(position), cache)``: through ``proposal.point_fn`` when it has one."""
    point_fn = getattr(proposal, "point_fn", None)
    if point_fn is None:
        return flat_fn(position), ()
    logdensity, cache = point_fn(position)
    if getattr(proposal, "logdensity_fn", None) is not logdensity_fn:
        logdensity = logdensity_fn(position)  # the chain's target, not the proposal's
    return logdensity, cache


# ----------------------------------------------------------------- the jump sampler


def irreversible_mh_init(
    position: Any,
    logdensity_fn: LogDensityFn,
    rng_key: PRNGKey | None = None,
    *,
    proposal: Proposal | None = None,
) -> IrreversibleMHState:
    """Start a chain at ``position: (d,)`` (or a pytree).

    With ``rng_key`` the direction is drawn uniformly (its stationary law)
    from ``{-1, +1}^d`` (or ``{-1, +1}^1`` when ``proposal.direction_size == 1``,
    as for :func:`~cenlmc_jax.irreversible.proposals.sde_proposal`); without,
    every sign is ``+1`` (a valid start: the direction is part of the chain's
    state, like a momentum at rest). The
    direction has the dtype of ``position``. Passing ``proposal`` also runs its
    checks at this initial point (``D`` positive definite, ``Q``
    skew-symmetric, ...) and fills ``state.cache`` (for the SDE proposal: one
    gradient evaluation, as BlackJAX's MALA init). Vmappable over
    ``(position, rng_key)``, and callable inside ``jit``.

    Args:
      position: the starting point, shape ``(d,)``, or a pytree.
      logdensity_fn: the target's log density, ``z -> log π(z) + const``.
      rng_key: a JAX PRNG key for a uniform direction, or ``None`` for all ``+1``.
      proposal: the :class:`Proposal` the chain will use, or ``None`` (no checks,
        no cache, a ``(d,)`` direction).

    Returns:
      The :class:`IrreversibleMHState` at ``position``: the direction (shape
      ``(d,)``, or ``(1,)`` when ``proposal.direction_size == 1``), the scalar log
      density and the proposal's cache.

    Raises:
      ValueError: a bad key or proposal, a log density that is not a real scalar,
        or ``-inf`` / NaN at ``position``, or a failed proposal check.
    """
    if rng_key is not None:
        check_key(rng_key)
    flat, unravel = ravel_position(position)
    check_logdensity(flat_logdensity(logdensity_fn, unravel), flat)
    if proposal is not None:
        _check_proposal(proposal)
        if is_concrete(flat) and callable(getattr(proposal, "check", None)):
            proposal.check(flat)
    shape = _direction_shape(proposal, flat)
    if rng_key is None:
        direction = jnp.ones(shape, flat.dtype)
    else:
        direction = jax.random.rademacher(rng_key, shape, dtype=flat.dtype)
    position = from_flat(unravel, flat)
    logdensity, cache = _point(proposal, logdensity_fn, position, logdensity_fn)
    check_start_logdensity(logdensity)
    return IrreversibleMHState(
        position, direction, jnp.asarray(logdensity, flat.dtype), cache
    )


def irreversible_mh_step(
    rng_key: PRNGKey,
    state: IrreversibleMHState,
    logdensity_fn: LogDensityFn,
    proposal: Proposal,
    *,
    flip_on_reject: bool = True,
) -> tuple[IrreversibleMHState, IrreversibleMHInfo]:
    """One step of the irreversible jump sampler (docs/algorithms.md §7, eq. 7.2).

    Propose ``z* ~ f̃(·|z, s)``, accept with ``a = min(1, π(z*) g̃(z|z*, s) /
    (π(z) f̃(z*|z, s)))``; accept keeps ``s``, reject flips the whole ``s``.

    With a ``point_fn`` proposal the cache of ``z`` comes from the state (a
    state made by hand without one gets it computed here) and that of ``z*``
    is computed once, for ``g̃`` and for the next step.
    Pure and jittable; vmap it over ``(rng_key, state)`` for many chains.

    Args:
      rng_key: split into ``(key_proposal, key_accept)``.
      state: :class:`IrreversibleMHState` of one chain.
      logdensity_fn: ``z -> log π(z) + const``.
      proposal: a :class:`Proposal` (e.g.
        :func:`~cenlmc_jax.irreversible.proposals.gamma_proposal`,
        :func:`~cenlmc_jax.irreversible.proposals.sde_proposal`).
      flip_on_reject: keep ``True``. ``False`` never flips ``s``: the chain is
        then NOT ``π``-invariant in general (only where the rejection
        probabilities of ``s`` and ``-s`` agree); it exists to demonstrate that
        the flip is essential (docs/algorithms.md §8).

    Returns:
      ``(new_state, info)``: the next :class:`IrreversibleMHState` and its
      :class:`IrreversibleMHInfo`.

    Raises:
      ValueError: a state, key or proposal of the wrong kind, or a direction whose
        shape does not fit the proposal.
    """
    check_state(
        state, IrreversibleMHState, "irreversible_mh_init, or irreversible_mh(...).init"
    )
    check_key(rng_key)
    check_bool(flip_on_reject, "flip_on_reject")
    _check_proposal(proposal)
    z, unravel = ravel_position(state.position, check=False)
    s = state.direction
    expected = _direction_shape(proposal, z)
    if tuple(s.shape) != tuple(expected):
        raise ValueError(
            f"state.direction must have shape {expected} for this proposal "
            f"(direction_size={getattr(proposal, 'direction_size', None)}); got "
            f"{tuple(s.shape)}. Start the chain with irreversible_mh_init(..., "
            "proposal=proposal)."
        )
    if is_concrete(z) and callable(getattr(proposal, "check", None)):
        proposal.check(z)
    flat_fn = flat_logdensity(logdensity_fn, unravel)
    key_proposal, key_accept = jax.random.split(rng_key)
    if getattr(proposal, "point_fn", None) is None:
        z_star = _checked_sample(proposal.sample(key_proposal, z, s), z)
        logdensity_new = jnp.asarray(flat_fn(z_star), z.dtype)
        cache, cache_new = (), ()
        log_q = _log_q(
            proposal.log_backward(z, z_star, s), proposal.log_forward(z_star, z, s)
        )
    else:
        cache = state.cache
        if not jax.tree_util.tree_leaves(cache):  # a state made by hand: no cache yet
            cache = proposal.point_fn(state.position)[1]
        z_star = _checked_sample(proposal.sample(key_proposal, z, s, cache), z)
        logdensity_new, cache_new = _point(
            proposal, logdensity_fn, from_flat(unravel, z_star), flat_fn
        )
        check_output(
            logdensity_new,
            "proposal.point_fn",
            what="position -> (scalar log density, cache)",
            shapes=((),),
        )
        logdensity_new = jnp.asarray(logdensity_new, z.dtype)
        log_q = _log_q(
            proposal.log_backward(z, z_star, s, cache_new),
            proposal.log_forward(z_star, z, s, cache),
        )
    log_ratio = logdensity_new - state.logdensity + log_q
    accepted, acceptance_rate = metropolis(key_accept, log_ratio)
    # a NaN proposal density (e.g. ∇log π non-finite) where π(z*) > 0 is trouble too
    diverged = proposal_trouble(z_star, logdensity_new) | (
        (logdensity_new > -jnp.inf) & jnp.isnan(log_ratio)
    )
    accepted = accepted & ~diverged
    flipped = ~accepted if flip_on_reject else jnp.zeros((), bool)
    new_state = IrreversibleMHState(
        position=from_flat(unravel, jnp.where(accepted, z_star, z)),
        direction=jnp.where(flipped, -s, s),
        logdensity=jnp.where(accepted, logdensity_new, state.logdensity),
        cache=_select(accepted, cache_new, cache),
    )
    info = IrreversibleMHInfo(
        acceptance_rate=jnp.where(diverged, 0.0, acceptance_rate).astype(z.dtype),
        is_accepted=accepted,
        direction_flipped=flipped,
        grad_evals=jnp.asarray(getattr(proposal, "grad_evals", 0), jnp.int32),
        diverged=diverged,
    )
    return new_state, info


# ------------------------------------------------------------------- sampler object


def irreversible_mh(
    logdensity_fn: LogDensityFn, proposal: Proposal, *, flip_on_reject: bool = True
) -> SamplingAlgorithm:
    """The irreversible jump sampler (docs/algorithms.md §7) as a sampler object.

    ``init(position, rng_key=None)``: :func:`irreversible_mh_init` with this proposal
    (its checks run at the initial point; the direction is uniform with a key, all
    ``+1`` without). ``step(rng_key, state)``: :func:`irreversible_mh_step`. MALA is
    ``irreversible_mh(logdensity_fn, sde_proposal(1.0, 0.0, logdensity_fn,
    step_size))``.

    Args:
      logdensity_fn: the target's log density, ``z -> log π(z) + const``.
      proposal: a :class:`Proposal` (e.g.
        :func:`~cenlmc_jax.irreversible.proposals.gamma_proposal`,
        :func:`~cenlmc_jax.irreversible.proposals.sde_proposal`).
      flip_on_reject: keep ``True`` (see :func:`irreversible_mh_step`).

    Returns:
      A :class:`~cenlmc_jax.base.SamplingAlgorithm` with the ``init`` and ``step``
      above.

    Raises:
      ValueError: ``logdensity_fn`` is not callable, ``proposal`` is not a
        :class:`Proposal`, or ``flip_on_reject`` is not a bool.
    """
    check_callable(logdensity_fn, "logdensity_fn", "z -> scalar log density")
    _check_proposal(proposal)
    check_bool(flip_on_reject, "flip_on_reject")

    def init(position, rng_key=None):
        return irreversible_mh_init(position, logdensity_fn, rng_key, proposal=proposal)

    def step(rng_key, state):
        return irreversible_mh_step(
            rng_key, state, logdensity_fn, proposal, flip_on_reject=flip_on_reject
        )

    return SamplingAlgorithm(init, step)
