"""Irreversible jump sampler ("irreversible Metropolis–Hastings", spec sections 7–8).

Ma, Fox, Chen & Wu, *A unifying framework for irreversible MCMC*. The state
``z`` is lifted with a direction ``s`` (uniform marginal). With a forward
proposal density ``f̃(z*|z, s)`` and a backward density ``g̃(z|z*, s)`` that
satisfy the pairing (spec 7)

    f̃(· | y, -s) = g̃(· | y, s),                                            (7.1)

one step is

    z* ~ f̃(· | z, s)
    a  = min(1, π(z*) g̃(z | z*, s) / (π(z) f̃(z* | z, s)))                   (7.2)
    accept (prob. a) -> z ← z*,  s unchanged
    reject           -> z unchanged, s ← -s   (the WHOLE direction vector)

``π(z)·Unif(s)`` is stationary without detailed balance: by (7.1) the move
``(z, s) -> (z*, s)`` is balanced by the move ``(z*, -s) -> (z, -s)`` (skew
detailed balance), and the flip on rejection supplies exactly the mass that
the unequal rejection probabilities of ``s`` and ``-s`` remove. The chain keeps
moving in one direction until a rejection turns it around.

Proposals are pluggable: a :class:`Proposal` is a NamedTuple of pure functions
``sample(rng_key, position, direction) -> z*``, ``log_forward(z*, z, s) =
log f̃(z*|z, s)`` and ``log_backward(z, z*, s) = log g̃(z|z*, s)``; the step
only ever uses the general ratio (7.2). A proposal whose densities need
``∇log π`` (the SDE proposal) also gives ``point_fn(z) -> (log π(z), cache)``:
everything that depends on the point alone (the gradient and the drift
pieces), computed once when the point is proposed and kept in the state
(``state.cache``), as BlackJAX's MALA keeps its gradient. Its three functions
then take that cache as a fourth argument, so a step evaluates ``∇log π``
once, at ``z*``. Shipped:

* :func:`gamma_proposal` — the irreversible Gamma sampler, ``z*_i = z_i + s_i
  Gamma(k, θ)``, one direction per coordinate, ``s ∈ {-1,+1}^d``. Its densities
  are built per coordinate from the pair ``(f_i, g_i)`` by
  :func:`coordinatewise_proposal` (spec 7): ``(f̃, g̃)`` takes the factor
  ``(f_i, g_i)`` when ``s_i > 0`` and ``(g_i, f_i)`` otherwise. Here ``f_i`` is a
  positive Gamma jump and ``g_i`` its mirror image, so ``g̃(z|z*, s) = f̃(z*|z, s)``
  and the ratio reduces to ``π(z*)/π(z)`` — computed through (7.2) all the same.
* :func:`sde_proposal` — one Euler–Maruyama step of the complete recipe
  (spec 5) with the irreversible part ``Q`` signed by the direction; the
  backward density is the adjoint process (``Q -> -Q``) (spec 8, eq. 8.1 below).
  ``Q`` couples coordinates, so the direction is ONE sign ``s`` shared by the
  whole vector, stored as a length-1 vector ``direction: (1,)`` so that every
  state of this module has the same fields. With ``Q = 0`` it is MALA
  (preconditioned by ``D``). Everything that depends only on constant ``D``
  and ``Q`` (the Cholesky factor of ``D``, its inverse and log-determinant)
  is computed once, when the proposal is built.

:func:`rwmh_step` (Gaussian random-walk Metropolis–Hastings, proposal
``N(z, step_size² Σ)``) is the reversible baseline.

Positions: one chain's ``position`` is a ``(d,)`` array or a pytree (a dict
of parameters); a pytree is flattened with ``jax.flatten_util.ravel_pytree``
at the boundary of every step (:func:`cenlmc_jax.gradients.ravel_position`):
``logdensity_fn`` sees the pytree, proposals and matrices (``D``, ``Q``,
``proposal_cov`` and their callables) see the flat ``(d,)`` vector, and the
state keeps the pytree.

Conventions: ``position: (d,)`` or a pytree (one chain; vmap for many), ``logdensity_fn(z)
= log π(z) + const = -H(z)``. The direction has the dtype of the position
(so ``s * jump`` needs no cast). ``rng_key`` is split once,
``key_proposal, key_accept = jax.random.split(rng_key)``: ``key_proposal`` goes
to ``proposal.sample``. Inside a run, numerical trouble (a non-finite proposal,
a NaN or +inf log density) is a rejection and is reported in
``info.diverged``; ``-inf`` (zero density) at a finite ``z*`` is an ordinary
rejection.
"""

from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree
from jax.scipy.linalg import solve_triangular
from jax.scipy.special import gammaln

from cenlmc_jax import _linalg as la
from cenlmc_jax._validation import (
    check_bool,
    check_callable,
    check_logdensity,
    check_positive,
    is_concrete,
)
from cenlmc_jax.base import SamplingAlgorithm
from cenlmc_jax.gradients import flat_logdensity, ravel_position
from cenlmc_jax.types import Array, LogDensityFn, PRNGKey

__all__ = [
    "Proposal",
    "SDEPoint",
    "IrreversibleMHState",
    "IrreversibleMHInfo",
    "irreversible_mh_init",
    "irreversible_mh_step",
    "irreversible_mh",
    "coordinatewise_proposal",
    "gamma_proposal",
    "sde_proposal",
    "RWMHState",
    "RWMHInfo",
    "rwmh_init",
    "rwmh_step",
    "rwmh",
]


# --------------------------------------------------------------------------- types


class Proposal(NamedTuple):
    """A forward/backward proposal pair for :func:`irreversible_mh_step`.

    Positions here are flat ``(d,)`` vectors (a pytree position is raveled by the step).

    sample: ``(rng_key, position, direction[, cache]) -> z*``, a draw from
      ``f̃(· | position, direction)``.
    log_forward: ``(z_star, position, direction[, cache]) -> log f̃(z* | z, s)``
      (scalar); ``cache`` is the one at ``position``.
    log_backward: ``(position, z_star, direction[, cache]) -> log g̃(z | z*, s)``
      (scalar); ``cache`` is the one at ``z_star``. The pair must satisfy
      ``f̃(·|y, -s) = g̃(·|y, s)`` (spec 7) for the chain to leave ``π`` invariant.
    direction_size: ``None`` for one sign per coordinate (``direction: (d,)``),
      ``1`` for one sign shared by the whole vector (``direction: (1,)``).
    grad_evals: gradients of ``logdensity_fn`` one step needs (Python int).
    check: ``position -> None``; raises ``ValueError`` when the proposal cannot
      be used at this (concrete) point (e.g. ``D(z)`` not positive definite).
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
    direction_size: Optional[int] = None
    grad_evals: int = 0
    check: Callable[[Array], None] = lambda position: None
    point_fn: Optional[Callable[[Any], tuple[Array, Any]]] = None
    logdensity_fn: Optional[Callable] = None


class SDEPoint(NamedTuple):
    """What :func:`sde_proposal` keeps of a point ``z`` (its ``cache``); ``None`` where not needed.

    grad: (d,) ``∇log π(z)``.
    drift_d: (d,) ``D(z)∇log π(z) + Γ_D(z)`` for a callable ``D``; None for a
      constant ``D`` (then ``D∇log π`` is formed from ``grad`` when used: a
      product by a scalar or a diagonal, or one ``O(d²)`` matrix-vector product).
    drift_q: (d,) ``Q(z)∇log π(z) + Γ_Q(z)`` for a callable ``Q``; None for a constant one.
    root: the factor ``L(z)`` of ``D(z) = L Lᵀ`` (scalar, (d,) or lower (d, d))
      for a callable ``D``; None for a constant ``D`` (its factor is the proposal's).
    half_logdet: ``½ log det D(z)`` for a callable ``D``; None otherwise.

    For constant ``D`` and ``Q`` the cache is the gradient alone: it stays
    valid when the matrices or the step size change (warm-up adaptation swaps
    them between steps without recomputing anything).
    """

    grad: Array
    drift_d: Optional[Array] = None
    drift_q: Optional[Array] = None
    root: Optional[Array] = None
    half_logdet: Optional[Array] = None


class IrreversibleMHState(NamedTuple):
    """State of the irreversible jump sampler (one chain).

    position: (d,) or a pytree, the sample ``z``.
    direction: (d,) or (1,) signs in {-1, +1}, dtype of ``position``
      (see :attr:`Proposal.direction_size`).
    logdensity: scalar ``logdensity_fn(position)``.
    cache: the proposal's per-point values at ``position`` (``()`` for a
      proposal without ``point_fn``; an :class:`SDEPoint` for :func:`sde_proposal`).
    """

    position: Any
    direction: Array
    logdensity: Array
    cache: Any = ()


class IrreversibleMHInfo(NamedTuple):
    """What one step did (one chain).

    acceptance_rate: ``a`` of (7.2), in [0, 1].
    is_accepted: the proposal was accepted.
    direction_flipped: the direction was reversed (a rejection, unless
      ``flip_on_reject=False``).
    grad_evals: gradient evaluations of ``logdensity_fn`` (0 for the Gamma
      proposal, 1 for an SDE proposal: at ``z*``; the one at ``z`` is in the state).
    diverged: the proposal, its log density or its proposal density was
      NaN/inf where the target density is positive (the move was rejected).
    """

    acceptance_rate: Array
    is_accepted: Array
    direction_flipped: Array
    grad_evals: Array
    diverged: Array


class RWMHState(NamedTuple):
    """Gaussian random-walk MH state: ``position: (d,)`` or a pytree, scalar ``logdensity``."""

    position: Any
    logdensity: Array


class RWMHInfo(NamedTuple):
    """acceptance_rate ``min(1, π(z*)/π(z))``, is_accepted, grad_evals (= 0), diverged."""

    acceptance_rate: Array
    is_accepted: Array
    grad_evals: Array
    diverged: Array


# ------------------------------------------------------------------------ helpers


def _direction_shape(proposal: Optional[Proposal], position: Array) -> tuple:
    size = getattr(proposal, "direction_size", None)
    return position.shape if size is None else (size,)


def _metropolis(rng_key: PRNGKey, log_ratio: Array) -> tuple[Array, Array]:
    """Accept with probability ``a = min(1, exp(log_ratio))``; a NaN ratio is a rejection."""
    log_ratio = jnp.where(jnp.isnan(log_ratio), -jnp.inf, log_ratio)
    acceptance_rate = jnp.exp(jnp.minimum(log_ratio, 0.0))
    # u in [0, 1): P(u < a) = a exactly, a = 0 never accepts and a = 1 always does.
    # (the draw of jax.random.bernoulli(key, a): the same key gives BlackJAX's decision)
    u = jax.random.uniform(rng_key, (), dtype=acceptance_rate.dtype)
    return u < acceptance_rate, acceptance_rate


def _proposal_trouble(z_star: Array, logdensity_new: Array) -> Array:
    """Non-finite proposal, or a NaN / +inf log density there (``-inf`` is a legal zero density)."""
    return ~jnp.all(jnp.isfinite(z_star)) | jnp.isnan(logdensity_new) | (logdensity_new == jnp.inf)


def _select(accepted: Array, new: Any, old: Any) -> Any:
    return jax.tree_util.tree_map(lambda a, b: jnp.where(accepted, a, b), new, old)


def _unravel(unravel, flat: Array) -> Any:
    return flat if unravel is None else unravel(flat)


def _matrix_value(M: Any) -> Any:
    """A constant matrix argument in NumPy float64 when its value is known, else as given (a tracer)."""
    return np.asarray(M, np.float64) if is_concrete(M) else M


def _factor(m: Any, d: int) -> tuple[Any, Any, Any]:
    """``(L, L⁻¹, ½ log det)`` of a symmetric positive definite ``m`` in a matrix form.

    Scalar ``c``: ``(√c, 1/√c, (d/2) log c)``; diagonal ``v``: elementwise;
    ``(d, d)``: the lower Cholesky factor and its inverse. NumPy float64 for a
    NumPy ``m`` (once, when a proposal is built), ``jnp`` for a traced one.
    """
    xp = np if isinstance(m, np.ndarray) else jnp
    if m.ndim == 0:
        root = xp.sqrt(m)
        return root, 1.0 / root, 0.5 * d * xp.log(m)
    if m.ndim == 1:
        root = xp.sqrt(m)
        return root, 1.0 / root, 0.5 * xp.sum(xp.log(m))
    chol = xp.linalg.cholesky(m)
    inv = np.linalg.inv(chol) if xp is np else solve_triangular(chol, jnp.eye(d, dtype=chol.dtype), lower=True)
    return chol, inv, xp.sum(xp.log(xp.diagonal(chol)))


def _as(x: Any, dtype) -> Any:
    return None if x is None else jnp.asarray(x, dtype)


def _log_normal(scaled_residual: Array, half_logdet: Array, var_scale: Array) -> Array:
    """log N(x; mean, var_scale · L Lᵀ) given ``y = L⁻¹ (x - mean): (n,)`` and ``½ log det(L Lᵀ)``."""
    n = scaled_residual.shape[0]
    return (
        -0.5 * jnp.sum(scaled_residual**2) / var_scale
        - half_logdet
        - 0.5 * n * (jnp.log(var_scale) + math.log(2.0 * math.pi))
    )


# ----------------------------------------------------------------- the jump sampler


def _check_proposal(proposal: Any) -> None:
    if not all(callable(getattr(proposal, f, None)) for f in ("sample", "log_forward", "log_backward")):
        raise ValueError(
            "proposal must be a Proposal (sample, log_forward, log_backward callables), e.g. "
            f"gamma_proposal(...) or sde_proposal(...); got {type(proposal).__name__}."
        )


def _point(proposal: Optional[Proposal], logdensity_fn: LogDensityFn, position: Any, flat_fn) -> tuple[Array, Any]:
    """``(log π(position), cache)``: through ``proposal.point_fn`` when it has one."""
    point_fn = getattr(proposal, "point_fn", None)
    if point_fn is None:
        return flat_fn(position), ()
    logdensity, cache = point_fn(position)
    if getattr(proposal, "logdensity_fn", None) is not logdensity_fn:
        logdensity = logdensity_fn(position)  # the chain's target, not the proposal's
    return logdensity, cache


def irreversible_mh_init(
    position: Any,
    logdensity_fn: LogDensityFn,
    rng_key: Optional[PRNGKey] = None,
    *,
    proposal: Optional[Proposal] = None,
) -> IrreversibleMHState:
    """Start a chain at ``position: (d,)`` (or a pytree).

    With ``rng_key`` the direction is drawn uniformly (its stationary law)
    from ``{-1, +1}^d`` (or ``{-1, +1}^1`` when ``proposal.direction_size == 1``,
    as for :func:`sde_proposal`); without, every sign is ``+1`` (a valid start:
    the direction is part of the chain's state, like a momentum at rest). The
    direction has the dtype of ``position``. Passing ``proposal`` also runs its
    checks at this initial point (``D`` positive definite, ``Q``
    skew-symmetric, ...) and fills ``state.cache`` (for the SDE proposal: one
    gradient evaluation, as BlackJAX's MALA init). Vmappable over
    ``(position, rng_key)``, and callable inside ``jit``.
    """
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
    position = _unravel(unravel, flat)
    logdensity, cache = _point(proposal, logdensity_fn, position, logdensity_fn)
    return IrreversibleMHState(position, direction, jnp.asarray(logdensity, flat.dtype), cache)


def irreversible_mh_step(
    rng_key: PRNGKey,
    state: IrreversibleMHState,
    logdensity_fn: LogDensityFn,
    proposal: Proposal,
    *,
    flip_on_reject: bool = True,
) -> tuple[IrreversibleMHState, IrreversibleMHInfo]:
    """One step of the irreversible jump sampler (spec 7, eq. 7.2).

    Propose ``z* ~ f̃(·|z, s)``, accept with ``a = min(1, π(z*) g̃(z|z*, s) /
    (π(z) f̃(z*|z, s)))``; accept keeps ``s``, reject flips the whole ``s``.

    Args:
      rng_key: split into ``(key_proposal, key_accept)``.
      state: :class:`IrreversibleMHState` of one chain.
      logdensity_fn: ``z -> log π(z) + const``.
      proposal: a :class:`Proposal` (e.g. :func:`gamma_proposal`, :func:`sde_proposal`).
      flip_on_reject: keep ``True``. ``False`` never flips ``s``: the chain is
        then NOT ``π``-invariant in general (only where the rejection
        probabilities of ``s`` and ``-s`` agree); it exists to demonstrate that
        the flip is essential (spec 8).

    With a ``point_fn`` proposal the cache of ``z`` comes from the state (a
    state made by hand without one gets it computed here) and that of ``z*``
    is computed once, for ``g̃`` and for the next step.
    Pure and jittable; vmap it over ``(rng_key, state)`` for many chains.
    """
    check_bool(flip_on_reject, "flip_on_reject")
    _check_proposal(proposal)
    z, unravel = ravel_position(state.position, check=False)
    s = state.direction
    expected = _direction_shape(proposal, z)
    if tuple(s.shape) != tuple(expected):
        raise ValueError(
            f"state.direction must have shape {expected} for this proposal (direction_size="
            f"{getattr(proposal, 'direction_size', None)}); got {tuple(s.shape)}. Start the chain with "
            f"irreversible_mh_init(..., proposal=proposal)."
        )
    if is_concrete(z) and callable(getattr(proposal, "check", None)):
        proposal.check(z)
    flat_fn = flat_logdensity(logdensity_fn, unravel)
    key_proposal, key_accept = jax.random.split(rng_key)
    if getattr(proposal, "point_fn", None) is None:
        z_star = proposal.sample(key_proposal, z, s).astype(z.dtype)
        logdensity_new = jnp.asarray(flat_fn(z_star), z.dtype)
        cache, cache_new = (), ()
        log_q = proposal.log_backward(z, z_star, s) - proposal.log_forward(z_star, z, s)
    else:
        cache = state.cache
        if not jax.tree_util.tree_leaves(cache):  # a state made by hand: no cache yet
            cache = proposal.point_fn(state.position)[1]
        z_star = proposal.sample(key_proposal, z, s, cache).astype(z.dtype)
        logdensity_new, cache_new = _point(proposal, logdensity_fn, _unravel(unravel, z_star), flat_fn)
        logdensity_new = jnp.asarray(logdensity_new, z.dtype)
        log_q = proposal.log_backward(z, z_star, s, cache_new) - proposal.log_forward(z_star, z, s, cache)
    log_ratio = logdensity_new - state.logdensity + log_q
    accepted, acceptance_rate = _metropolis(key_accept, log_ratio)
    # a NaN proposal density (e.g. ∇log π non-finite) where π(z*) > 0 is trouble too
    diverged = _proposal_trouble(z_star, logdensity_new) | ((logdensity_new > -jnp.inf) & jnp.isnan(log_ratio))
    accepted = accepted & ~diverged
    flipped = ~accepted if flip_on_reject else jnp.zeros((), bool)
    new_state = IrreversibleMHState(
        position=_unravel(unravel, jnp.where(accepted, z_star, z)),
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


# ---------------------------------------------------------------------- proposals


def coordinatewise_proposal(
    log_f: Callable[[Array, Array], Array],
    log_g: Callable[[Array, Array], Array],
    sample_f: Optional[Callable[[PRNGKey, Array], Array]] = None,
    sample_g: Optional[Callable[[PRNGKey, Array], Array]] = None,
    *,
    sample: Optional[Callable[[PRNGKey, Array, Array], Array]] = None,
) -> Proposal:
    """A proposal built per coordinate from a pair ``(f_i, g_i)`` (spec 7).

    ``log_f(x_new, x_old) -> (d,)`` gives ``log f_i(x_new_i | x_old_i)`` for every
    coordinate (``log_g`` likewise); then

        log f̃(z*|z, s) = Σ_i [s_i > 0] log f_i(z*_i|z_i) + [s_i < 0] log g_i(z*_i|z_i)
        log g̃(z|z*, s) = Σ_i [s_i > 0] log g_i(z_i|z*_i) + [s_i < 0] log f_i(z_i|z*_i)

    which satisfies ``f̃(·|y, -s) = g̃(·|y, s)`` by construction. Sampling: either
    ``sample_f, sample_g`` (``(rng_key, z) -> (d,)`` draws of every ``f_i`` /
    ``g_i``; both are drawn and the coordinate chosen by ``s_i``), or a direct
    ``sample(rng_key, z, s)`` when one draw per coordinate is cheaper (it must
    draw from the ``f̃`` above). No per-point cache (``point_fn = None``).
    """
    if sample is None:
        if sample_f is None or sample_g is None:
            raise ValueError("coordinatewise_proposal needs sample_f and sample_g, or sample=.")

        def sample(rng_key, z, s):
            kf, kg = jax.random.split(rng_key)
            return jnp.where(s > 0, sample_f(kf, z), sample_g(kg, z))

    def log_forward(z_star, z, s):
        return jnp.sum(jnp.where(s > 0, log_f(z_star, z), log_g(z_star, z)))

    def log_backward(z, z_star, s):
        return jnp.sum(jnp.where(s > 0, log_g(z, z_star), log_f(z, z_star)))

    return Proposal(sample, log_forward, log_backward, direction_size=None, grad_evals=0)


def _gamma_logpdf(x: Array, shape: float, scale: float) -> Array:
    """log Gamma(x; k, θ) = (k-1) log x - x/θ - log Γ(k) - k log θ, and -inf for x <= 0."""
    k = jnp.asarray(shape, x.dtype)
    theta = jnp.asarray(scale, x.dtype)
    positive = x > 0
    safe = jnp.where(positive, x, 1.0)  # keeps log and its gradient finite off the support
    logp = (k - 1) * jnp.log(safe) - safe / theta - gammaln(k) - k * jnp.log(theta)
    return jnp.where(positive, logp, -jnp.inf)


_MAX_EXP_SUM = 8  # integer Gamma shapes up to this are drawn as sums of exponentials


def gamma_proposal(shape: float, scale: float) -> Proposal:
    """The irreversible Gamma proposal (spec 7): ``z*_i = z_i + s_i G_i``, ``G_i ~ Gamma(k, θ)``.

    ``shape = k > 0``, ``scale = θ > 0`` (mean jump ``kθ``). Per coordinate
    ``f_i(x'|x) = Gamma(x' - x; k, θ)`` (a forward jump) and its mirror
    ``g_i(x'|x) = Gamma(x - x'; k, θ)``; combined by
    :func:`coordinatewise_proposal`. Then ``log g̃(z|z*, s) = log f̃(z*|z, s)``
    (both evaluate the Gamma density at ``|z* - z|``), so (7.2) reduces to
    ``a = min(1, π(z*)/π(z))``. One direction per coordinate: ``direction: (d,)``.
    Integer shapes ``k <= 8`` draw ``Gamma(k, 1)`` as a sum of ``k`` exponentials
    (same law, fewer operations than ``jax.random.gamma``'s rejection sampler).
    ``scale`` may also be a ``(d,)`` vector of per-coordinate scales (a
    diagonal preconditioner: ``θ_i ∝`` the target's sd of coordinate ``i``),
    and a tracer (built inside ``jit``, e.g. by warm-up adaptation).
    """
    check_positive(shape, "shape")
    if np.ndim(scale) == 0:
        check_positive(scale, "scale")
    elif np.ndim(scale) != 1:
        raise ValueError(f"scale must be a scalar or a (d,) vector; got shape {np.shape(scale)}.")
    elif is_concrete(scale):
        v = np.asarray(scale, np.float64)
        if not np.all(np.isfinite(v) & (v > 0)):
            raise ValueError(f"scale must be finite numbers > 0; got {v}.")

    def log_f(x_new, x_old):
        return _gamma_logpdf(x_new - x_old, shape, scale)

    def log_g(x_new, x_old):
        return _gamma_logpdf(x_old - x_new, shape, scale)

    small_int = is_concrete(shape) and float(shape).is_integer() and 1 <= float(shape) <= _MAX_EXP_SUM

    def sample(rng_key, z, s):
        if small_int:
            # Gamma(k, 1) with integer k is a sum of k Exp(1): exact, and several times
            # cheaper than the rejection sampler of jax.random.gamma under vmap.
            jump = jnp.sum(jax.random.exponential(rng_key, (int(shape),) + z.shape, dtype=z.dtype), axis=0)
        else:
            jump = jax.random.gamma(rng_key, jnp.asarray(shape, z.dtype), z.shape, dtype=z.dtype)
        return z + s * (jnp.asarray(scale, z.dtype) * jump)  # θ scales Gamma(k, 1)

    return coordinatewise_proposal(log_f, log_g, sample=sample)


def _eval_matrix(M: Any, z: Array, name: str) -> np.ndarray:
    """``M(z)`` (or ``M``) at a concrete ``z`` as a float64 ``(d, d)`` NumPy array (eagerly, even inside jit)."""
    d = z.shape[0]
    if M is None:
        return None
    if callable(M):
        try:
            with jax.ensure_compile_time_eval():
                m = M(z)
        except Exception as exc:  # the user's callable failed on a correctly shaped point
            raise ValueError(f"{name} failed at a position of shape {tuple(z.shape)}: {exc}") from exc
        if not is_concrete(m):
            return None
    elif not is_concrete(M):
        return None  # a traced constant (built inside jit): its value is not known yet
    else:
        m = M
    m = np.asarray(m, np.float64)
    la.check_matrix_shape(m, name, d)
    return la.constant_dense(m, d)


def _check_d_q(D: Any, Q: Any, position: Array) -> None:
    """``D(z)`` symmetric positive definite and ``Q(z)`` skew-symmetric at a concrete ``z`` (NumPy only)."""
    dm, qm = _eval_matrix(D, position, "D"), _eval_matrix(Q, position, "Q")
    if dm is not None:
        la.check_symmetric_psd(dm, "D", "the Gaussian proposal N(., 2 step_size D) needs a density", definite=True)
    if qm is not None:
        la.check_skew(qm, "Q", "the irreversible part of the recipe")


def sde_proposal(D: Any, Q: Any, logdensity_fn: LogDensityFn, step_size: Any) -> Proposal:
    """One Euler–Maruyama step of the complete recipe as an irreversible proposal (spec 8).

    With ``H = -logdensity_fn``, ``ε = step_size`` and a single direction sign
    ``s = direction[0] ∈ {-1, +1}`` (``Q`` couples coordinates, so one sign
    for the whole vector):

        f̃(z*|z, s) = N(z*; z + ε[-(D + sQ)∇H(z) + Γ_s(z)],  2ε D(z))
        g̃(z|z*, s) = N(z;  z* + ε[-(D - sQ)∇H(z*) + Γ_{-s}(z*)], 2ε D(z*))      (8.1)
        Γ_{±,i}(z) = Σ_j ∂_j (D_ij(z) ± Q_ij(z))

    (``g̃`` is the forward density of the adjoint process ``Q -> -Q``, so (7.1)
    holds). The Metropolis step (7.2) corrects the discretisation error; with
    ``Q = 0`` this is MALA preconditioned by ``D`` (with ``D = 1``: BlackJAX's
    ``mala``, the same draws from the same key).

    Args:
      D: symmetric positive definite: a scalar ``c`` (``c·I``), a ``(d,)``
        diagonal, a ``(d, d)`` array, or a callable of the flat ``z``
        returning one of these. Positive *definite*: the proposal needs a
        density, so a singular ``D`` (e.g. SGHMC's) is refused.
      Q: skew-symmetric, in the same forms; ``0`` or ``None`` for none (MALA).
      logdensity_fn: ``z -> log π(z)`` (``z`` an array or the pytree the chain
        uses); its value and gradient come from one ``jax.value_and_grad``.
      step_size: ``ε > 0``; may be a tracer.

    Cost. Everything that depends only on constant ``D``, ``Q`` is computed
    here, once: the factor ``L`` of ``D = L Lᵀ`` (``√c``, ``√v`` or Cholesky),
    ``L⁻¹`` and ``½ log det D`` (NumPy float64 when the values are known;
    ``jnp`` when ``D`` is a tracer, e.g. a preconditioner being adapted inside
    ``jit``). The per-point pieces (:class:`SDEPoint`: ``∇log π``, and for
    callables ``D(z)∇log π + Γ_D``, ``Q(z)∇log π + Γ_Q``, ``L(z)``,
    ``½ log det D(z)``) are the proposal's ``point_fn``: computed once per
    proposed point and kept in the state, so a step costs one
    ``value_and_grad`` (``grad_evals = 1``), as BlackJAX's MALA. Scalar and
    diagonal ``D`` with ``Q = 0`` cost only elementwise work; a dense ``D`` or
    ``Q`` adds ``O(d²)`` matrix-vector products.

    Checks: constant concrete ``D``, ``Q`` here (NumPy, so also inside ``jit``);
    callables at the initial point by :func:`irreversible_mh_init` and in every
    eager step. ``Γ`` comes from :func:`cenlmc_jax._linalg.gamma_term` (zero
    for constants).
    """
    check_positive(step_size, "step_size")
    check_callable(logdensity_fn, "logdensity_fn", "z -> scalar log density")
    Q = 0.0 if Q is None else Q
    la.check_matrix_form(D, "D")
    la.check_matrix_form(Q, "Q")
    sizes = {np.shape(M)[0] for M in (D, Q) if not callable(M) and np.ndim(M) > 0}
    if len(sizes) > 1:
        raise ValueError(f"D and Q must have the same size; got shapes {np.shape(D)} and {np.shape(Q)}.")
    # constants with known values: checked now, at a dummy point of the right size (callables: at init)
    _check_d_q(None if callable(D) else D, None if callable(Q) else Q, np.zeros((sizes.pop() if sizes else 1,)))

    d_const, q_const = not callable(D), not callable(Q)
    q_zero = q_const and is_concrete(Q) and not np.any(np.asarray(Q))
    Dc = _matrix_value(D) if d_const else None
    Qc = None if (q_zero or not q_const) else _matrix_value(Q)
    # (L, L⁻¹, ½ log det) of a constant D, once; a scalar's log det is per dimension (d is not known yet)
    factor = _factor(Dc, 1 if Dc.ndim == 0 else Dc.shape[0]) if d_const else None
    value_and_grad = jax.value_and_grad(logdensity_fn)

    def d_factor(z):
        """(L, L⁻¹, ½ log det D) of the constant D, in z's dtype."""
        root, inv, half = factor
        return _as(root, z.dtype), _as(inv, z.dtype), _as(half, z.dtype) * (z.shape[0] if Dc.ndim == 0 else 1)

    def point_at(z, grad):
        """SDEPoint at a flat z with ∇log π(z) = grad."""
        drift_d = drift_q = root = half = None
        if not d_const:
            dz = la.evaluate(D, z, "D")
            drift_d = la.matvec(dz, grad) + la.gamma_term(D, None, z)
            root, _, half = _factor(dz, z.shape[0])
        if not q_const:
            drift_q = la.matvec(la.evaluate(Q, z, "Q"), grad) + la.gamma_term(None, Q, z)
        return SDEPoint(grad, drift_d, drift_q, root, half)

    def point_fn(position):
        logdensity, grad = value_and_grad(position)
        z = ravel_pytree(position)[0]
        return logdensity, point_at(z, ravel_pytree(grad)[0].astype(z.dtype))

    def cached(z, cache):
        # called directly without a cache (an array position): compute it at z
        return point_fn(z)[1] if cache is None else cache

    def mean(z, s, point):
        """z + ε [(D + sQ)∇log π + Γ_D + sΓ_Q] at z, from its cache."""
        eps = jnp.asarray(step_size, z.dtype)
        drift = la.matvec(_as(Dc, z.dtype), point.grad) if d_const else point.drift_d
        if not q_const:
            drift = drift + s * point.drift_q
        elif not q_zero:
            drift = drift + s * la.matvec(_as(Qc, z.dtype), point.grad)
        return z + eps * drift

    def log_density(x, z, s, point):
        """log N(x; mean_s(z), 2ε D(z))."""
        var = 2.0 * jnp.asarray(step_size, z.dtype)
        r = x - mean(z, s, point)
        if d_const:
            _, inv, half = d_factor(z)
            y = la.matvec(inv, r)
        else:
            root, half = point.root, point.half_logdet
            y = solve_triangular(root, r, lower=True) if root.ndim == 2 else r / root
        return _log_normal(y, half, var)

    def sample(rng_key, z, direction, cache=None):
        point = cached(z, cache)
        root = d_factor(z)[0] if d_const else point.root
        xi = jax.random.normal(rng_key, z.shape, dtype=z.dtype)
        return mean(z, direction[0], point) + jnp.sqrt(2.0 * jnp.asarray(step_size, z.dtype)) * la.matvec(root, xi)

    def log_forward(z_star, z, direction, cache=None):
        return log_density(z_star, z, direction[0], cached(z, cache))

    def log_backward(z, z_star, direction, cache=None):
        return log_density(z, z_star, -direction[0], cached(z_star, cache))

    def check(position):
        _check_d_q(D, Q, position)

    return Proposal(sample, log_forward, log_backward, direction_size=1, grad_evals=1, check=check,
                    point_fn=point_fn, logdensity_fn=logdensity_fn)


# ----------------------------------------------------------- random-walk baseline


def _proposal_root(proposal_cov: Any, d: int, dtype) -> Any:
    """The factor ``L`` of ``proposal_cov = L Lᵀ`` (None for the identity), in ``dtype``."""
    if proposal_cov is None:
        return None
    m = _matrix_value(proposal_cov)
    la.check_matrix_shape(m, "proposal_cov", d)
    if isinstance(m, np.ndarray):
        la.check_symmetric_psd(la.constant_dense(m, d), "proposal_cov", "the random-walk proposal covariance",
                               definite=True)
    return jnp.asarray(_factor(m, d)[0], dtype)


def rwmh_init(position: Any, logdensity_fn: LogDensityFn) -> RWMHState:
    """Start Gaussian random-walk MH at ``position: (d,)`` or a pytree (vmappable over chains; callable inside jit)."""
    flat, unravel = ravel_position(position)
    check_logdensity(flat_logdensity(logdensity_fn, unravel), flat)
    position = _unravel(unravel, flat)
    return RWMHState(position, jnp.asarray(logdensity_fn(position), flat.dtype))


def rwmh_step(
    rng_key: PRNGKey,
    state: RWMHState,
    logdensity_fn: LogDensityFn,
    step_size: Any,
    *,
    proposal_cov: Optional[Any] = None,
) -> tuple[RWMHState, RWMHInfo]:
    """One Gaussian random-walk Metropolis–Hastings step (the reversible baseline).

    ``z* = z + step_size·L ξ``, ``ξ ~ N(0, I_d)``, ``L Lᵀ = proposal_cov``
    (``None``: the identity, ``z* = z + step_size·ξ``, BlackJAX's
    ``normal_random_walk(sigma=step_size)`` draw for draw); symmetric, so
    ``a = min(1, π(z*)/π(z))``. ``proposal_cov``: a scalar, ``(d,)`` diagonal
    or ``(d, d)`` SPD matrix — the covariance of the target is the right shape
    (warm-up adaptation estimates it). ``rng_key`` is split into
    ``(key_proposal, key_accept)`` as in :func:`irreversible_mh_step`. Pure
    and jittable; vmap over ``(rng_key, state)``.
    """
    check_positive(step_size, "step_size")
    z, unravel = ravel_position(state.position, check=False)
    root = _proposal_root(proposal_cov, z.shape[0], z.dtype)
    key_proposal, key_accept = jax.random.split(rng_key)
    xi = jax.random.normal(key_proposal, z.shape, dtype=z.dtype)
    z_star = z + jnp.asarray(step_size, z.dtype) * (xi if root is None else la.matvec(root, xi))
    logdensity_new = jnp.asarray(flat_logdensity(logdensity_fn, unravel)(z_star), z.dtype)
    accepted, acceptance_rate = _metropolis(key_accept, logdensity_new - state.logdensity)
    diverged = _proposal_trouble(z_star, logdensity_new)
    accepted = accepted & ~diverged
    new_state = RWMHState(
        position=_unravel(unravel, jnp.where(accepted, z_star, z)),
        logdensity=jnp.where(accepted, logdensity_new, state.logdensity),
    )
    info = RWMHInfo(
        acceptance_rate=jnp.where(diverged, 0.0, acceptance_rate).astype(z.dtype),
        is_accepted=accepted,
        grad_evals=jnp.zeros((), jnp.int32),
        diverged=diverged,
    )
    return new_state, info


# ------------------------------------------------------------------ sampler objects


def irreversible_mh(logdensity_fn: LogDensityFn, proposal: Proposal, *, flip_on_reject: bool = True) -> SamplingAlgorithm:
    """The irreversible jump sampler (spec 7) as a sampler object.

    ``init(position, rng_key=None)``: :func:`irreversible_mh_init` with this
    proposal (its checks run at the initial point; the direction is uniform
    with a key, all ``+1`` without). ``step(rng_key, state)``: :func:`irreversible_mh_step`.
    MALA is ``irreversible_mh(logdensity_fn, sde_proposal(1.0, 0.0, logdensity_fn, step_size))``.
    """
    check_callable(logdensity_fn, "logdensity_fn", "z -> scalar log density")
    _check_proposal(proposal)
    check_bool(flip_on_reject, "flip_on_reject")

    def init(position, rng_key=None):
        return irreversible_mh_init(position, logdensity_fn, rng_key, proposal=proposal)

    def step(rng_key, state):
        return irreversible_mh_step(rng_key, state, logdensity_fn, proposal, flip_on_reject=flip_on_reject)

    return SamplingAlgorithm(init, step)


def rwmh(logdensity_fn: LogDensityFn, step_size: Any, *, proposal_cov: Optional[Any] = None) -> SamplingAlgorithm:
    """Gaussian random-walk MH with proposal ``N(z, step_size² · proposal_cov)`` as a sampler object.

    ``proposal_cov``: ``None`` (the identity), a scalar, a ``(d,)`` diagonal or
    a ``(d, d)`` SPD matrix (checked here when constant; its factor is taken once per trace).
    """
    check_callable(logdensity_fn, "logdensity_fn", "z -> scalar log density")
    check_positive(step_size, "step_size")
    if proposal_cov is not None:
        if callable(proposal_cov):
            raise ValueError(f"proposal_cov must be a constant scalar, (d,) or (d, d) matrix; got {proposal_cov!r}.")
        la.check_matrix_form(proposal_cov, "proposal_cov")
        if np.ndim(proposal_cov) == 0:
            check_positive(proposal_cov, "proposal_cov")
        elif is_concrete(proposal_cov):
            _proposal_root(proposal_cov, np.shape(proposal_cov)[0], jnp.result_type(float))

    def init(position, rng_key=None):
        del rng_key  # deterministic start
        return rwmh_init(position, logdensity_fn)

    def step(rng_key, state):
        return rwmh_step(rng_key, state, logdensity_fn, step_size, proposal_cov=proposal_cov)

    return SamplingAlgorithm(init, step)
