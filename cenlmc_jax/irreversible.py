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
only ever uses the general ratio (7.2). Shipped:

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
  (preconditioned by ``D``).

:func:`rwmh_step` (Gaussian random-walk Metropolis–Hastings) is the reversible
baseline.

Conventions: ``position: (d,)`` (one chain; vmap for many), ``logdensity_fn(z)
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
from jax.scipy.linalg import solve_triangular
from jax.scipy.special import gammaln

from cenlmc_jax import _linalg as la
from cenlmc_jax._validation import (
    check_bool,
    check_callable,
    check_logdensity,
    check_position,
    check_positive,
    is_concrete,
)
from cenlmc_jax.base import SamplingAlgorithm
from cenlmc_jax.types import Array, ArrayLike, LogDensityFn, PRNGKey

__all__ = [
    "Proposal",
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

    sample: ``(rng_key, position (d,), direction) -> z* (d,)``, a draw from
      ``f̃(· | position, direction)``.
    log_forward: ``(z_star, position, direction) -> log f̃(z* | z, s)`` (scalar).
    log_backward: ``(position, z_star, direction) -> log g̃(z | z*, s)`` (scalar).
      The pair must satisfy ``f̃(·|y, -s) = g̃(·|y, s)`` (spec 7) for the chain
      to leave ``π`` invariant.
    direction_size: ``None`` for one sign per coordinate (``direction: (d,)``),
      ``1`` for one sign shared by the whole vector (``direction: (1,)``).
    grad_evals: gradients of ``logdensity_fn`` one step needs (Python int).
    check: ``position -> None``; raises ``ValueError`` when the proposal cannot
      be used at this (concrete) point (e.g. ``D(z)`` not positive definite).
    """

    sample: Callable[[PRNGKey, Array, Array], Array]
    log_forward: Callable[[Array, Array, Array], Array]
    log_backward: Callable[[Array, Array, Array], Array]
    direction_size: Optional[int] = None
    grad_evals: int = 0
    check: Callable[[Array], None] = lambda position: None


class IrreversibleMHState(NamedTuple):
    """State of the irreversible jump sampler (one chain).

    position: (d,) the sample ``z``.
    direction: (d,) or (1,) signs in {-1, +1}, dtype of ``position``
      (see :attr:`Proposal.direction_size`).
    logdensity: scalar ``logdensity_fn(position)``.
    """

    position: Array
    direction: Array
    logdensity: Array


class IrreversibleMHInfo(NamedTuple):
    """What one step did (one chain).

    acceptance_rate: ``a`` of (7.2), in [0, 1].
    is_accepted: the proposal was accepted.
    direction_flipped: the direction was reversed (a rejection, unless
      ``flip_on_reject=False``).
    grad_evals: gradient evaluations of ``logdensity_fn`` (0 for the Gamma
      proposal, 2 for an SDE proposal: at ``z`` and at ``z*``).
    diverged: the proposal or its log density was NaN/inf (the move was rejected).
    """

    acceptance_rate: Array
    is_accepted: Array
    direction_flipped: Array
    grad_evals: Array
    diverged: Array


class RWMHState(NamedTuple):
    """Gaussian random-walk MH state: ``position: (d,)``, scalar ``logdensity``."""

    position: Array
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
    u = jax.random.uniform(rng_key, (), dtype=acceptance_rate.dtype)
    return u < acceptance_rate, acceptance_rate


def _proposal_trouble(z_star: Array, logdensity_new: Array) -> Array:
    """Non-finite proposal, or a NaN / +inf log density there (``-inf`` is a legal zero density)."""
    return ~jnp.all(jnp.isfinite(z_star)) | jnp.isnan(logdensity_new) | (logdensity_new == jnp.inf)


# ----------------------------------------------------------------- the jump sampler


def _check_proposal(proposal: Any) -> None:
    if not all(callable(getattr(proposal, f, None)) for f in ("sample", "log_forward", "log_backward")):
        raise ValueError(
            "proposal must be a Proposal (sample, log_forward, log_backward callables), e.g. "
            f"gamma_proposal(...) or sde_proposal(...); got {type(proposal).__name__}."
        )


def irreversible_mh_init(
    position: ArrayLike,
    logdensity_fn: LogDensityFn,
    rng_key: Optional[PRNGKey] = None,
    *,
    proposal: Optional[Proposal] = None,
) -> IrreversibleMHState:
    """Start a chain at ``position: (d,)``.

    With ``rng_key`` the direction is drawn uniformly (its stationary law)
    from ``{-1, +1}^d`` (or ``{-1, +1}^1`` when ``proposal.direction_size == 1``,
    as for :func:`sde_proposal`); without, every sign is ``+1`` (a valid start:
    the direction is part of the chain's state, like a momentum at rest). The
    direction has the dtype of ``position``. Passing ``proposal`` also runs its checks at this
    initial point (``D`` positive definite, ``Q`` skew-symmetric, ...).
    Vmappable over ``(position, rng_key)`` for many chains.
    """
    position = check_position(position, ndim=1)
    check_logdensity(logdensity_fn, position)
    if proposal is not None and is_concrete(position) and callable(getattr(proposal, "check", None)):
        proposal.check(position)
    shape = _direction_shape(proposal, position)
    if rng_key is None:
        direction = jnp.ones(shape, position.dtype)
    else:
        direction = jax.random.rademacher(rng_key, shape, dtype=position.dtype)
    return IrreversibleMHState(position, direction, jnp.asarray(logdensity_fn(position), position.dtype))


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
      state: :class:`IrreversibleMHState` of one chain (``position: (d,)``).
      logdensity_fn: ``z -> log π(z) + const``.
      proposal: a :class:`Proposal` (e.g. :func:`gamma_proposal`, :func:`sde_proposal`).
      flip_on_reject: keep ``True``. ``False`` never flips ``s``: the chain is
        then NOT ``π``-invariant in general (only where the rejection
        probabilities of ``s`` and ``-s`` agree); it exists to demonstrate that
        the flip is essential (spec 8).

    Pure and jittable; vmap it over ``(rng_key, state)`` for many chains.
    """
    check_bool(flip_on_reject, "flip_on_reject")
    _check_proposal(proposal)
    z, s = state.position, state.direction
    expected = _direction_shape(proposal, z)
    if tuple(s.shape) != tuple(expected):
        raise ValueError(
            f"state.direction must have shape {expected} for this proposal (direction_size="
            f"{getattr(proposal, 'direction_size', None)}); got {tuple(s.shape)}. Start the chain with "
            f"irreversible_mh_init(..., proposal=proposal)."
        )
    if is_concrete(z) and callable(getattr(proposal, "check", None)):
        proposal.check(z)
    key_proposal, key_accept = jax.random.split(rng_key)
    z_star = proposal.sample(key_proposal, z, s).astype(z.dtype)
    logdensity_new = jnp.asarray(logdensity_fn(z_star), z.dtype)
    log_ratio = (
        logdensity_new
        - state.logdensity
        + proposal.log_backward(z, z_star, s)
        - proposal.log_forward(z_star, z, s)
    )
    accepted, acceptance_rate = _metropolis(key_accept, log_ratio)
    diverged = _proposal_trouble(z_star, logdensity_new)
    accepted = accepted & ~diverged
    flipped = ~accepted if flip_on_reject else jnp.zeros((), bool)
    new_state = IrreversibleMHState(
        position=jnp.where(accepted, z_star, z),
        direction=jnp.where(flipped, -s, s),
        logdensity=jnp.where(accepted, logdensity_new, state.logdensity),
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
    draw from the ``f̃`` above).
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
    """
    check_positive(shape, "shape")
    check_positive(scale, "scale")

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


def _check_d_q(D: Any, Q: Any, position: Array) -> None:
    """``D(z)`` symmetric positive definite and ``Q(z)`` skew-symmetric at a concrete ``z``."""
    d = position.shape[0]
    mats = {}
    for name, M in (("D", D), ("Q", Q)):
        try:
            m = la.evaluate(M, position, name)
        except ValueError:
            raise
        except Exception as exc:  # the user's callable failed on a correctly shaped point
            raise ValueError(f"{name} failed at a position of shape {tuple(position.shape)}: {exc}") from exc
        mats[name] = la.constant_dense(m, d)
    la.check_symmetric_psd(mats["D"], "D", "the Gaussian proposal N(., 2 step_size D) needs a density", definite=True)
    la.check_skew(mats["Q"], "Q", "the irreversible part of the recipe")


def _log_normal_chol(x: Array, mean: Array, chol: Array, var_scale: Array) -> Array:
    """log N(x; mean, var_scale · L Lᵀ) for lower-triangular ``L``."""
    n = x.shape[0]
    y = solve_triangular(chol, (x - mean) / jnp.sqrt(var_scale), lower=True)
    return (
        -0.5 * jnp.sum(y**2)
        - jnp.sum(jnp.log(jnp.diagonal(chol)))
        - 0.5 * n * (jnp.log(var_scale) + math.log(2.0 * math.pi))
    )


def sde_proposal(D: Any, Q: Any, logdensity_fn: LogDensityFn, step_size: float) -> Proposal:
    """One Euler–Maruyama step of the complete recipe as an irreversible proposal (spec 8).

    With ``H = -logdensity_fn``, ``ε = step_size`` and a single direction sign
    ``s = direction[0] ∈ {-1, +1}`` (``Q`` couples coordinates, so one sign
    for the whole vector):

        f̃(z*|z, s) = N(z*; z + ε[-(D + sQ)∇H(z) + Γ_s(z)],  2ε D(z))
        g̃(z|z*, s) = N(z;  z* + ε[-(D - sQ)∇H(z*) + Γ_{-s}(z*)], 2ε D(z*))      (8.1)
        Γ_{±,i}(z) = Σ_j ∂_j (D_ij(z) ± Q_ij(z))

    (``g̃`` is the forward density of the adjoint process ``Q -> -Q``, so (7.1)
    holds). The Metropolis step (7.2) corrects the discretisation error; with
    ``Q = 0`` this is MALA preconditioned by ``D``.

    Args:
      D: symmetric positive definite: a scalar ``c`` (``c·I``), a ``(d,)``
        diagonal, a ``(d, d)`` array, or a callable of ``z`` returning one of these. Positive *definite*: the
        proposal needs a density, so a singular ``D`` (e.g. SGHMC's) is refused.
      Q: skew-symmetric, in the same forms (0 allowed).
      logdensity_fn: ``z -> log π(z)``; its gradient comes from ``jax.grad``.
      step_size: ``ε > 0``.

    Constant ``D, Q`` are checked here; callables at the initial point by
    :func:`irreversible_mh_init` (``proposal=``) and in every eager step.
    ``Γ`` comes from :func:`cenlmc_jax._linalg.gamma_term` (zero for constants).
    ``grad_evals = 2`` (``∇H`` at ``z`` and at ``z*``): under ``jit`` the
    repeated evaluation at ``z`` in ``sample`` and ``log_forward`` is one
    computation after XLA's common-subexpression elimination.
    """
    check_positive(step_size, "step_size")
    check_callable(logdensity_fn, "logdensity_fn", "z -> scalar log density")
    la.check_matrix_form(D, "D")
    la.check_matrix_form(Q, "Q")
    sizes = {np.shape(M)[0] for M in (D, Q) if not callable(M) and np.ndim(M) > 0}
    if len(sizes) > 1:
        raise ValueError(f"D and Q must have the same size; got shapes {np.shape(D)} and {np.shape(Q)}.")
    if not callable(D) and not callable(Q) and is_concrete(D) and is_concrete(Q):
        # both constant: check them now at a dummy point of the right size (no logdensity needed)
        _check_d_q(D, Q, jnp.zeros((sizes.pop() if sizes else 1,), jnp.result_type(float)))

    grad_fn = jax.grad(logdensity_fn)

    def mean_and_chol(z, s):
        eps = jnp.asarray(step_size, z.dtype)
        d = z.shape[0]
        Dz, Qz = la.to_dense(la.evaluate(D, z, "D"), d), la.to_dense(la.evaluate(Q, z, "Q"), d)
        # -(D + sQ)∇H = (D + sQ)∇log π
        drift = (Dz + s * Qz) @ grad_fn(z).astype(z.dtype) + la.gamma_term(D, Q, z, sign=s)
        return z + eps * drift, jnp.linalg.cholesky(Dz)

    def sample(rng_key, z, direction):
        s = direction[0]
        mean, chol = mean_and_chol(z, s)
        xi = jax.random.normal(rng_key, z.shape, dtype=z.dtype)
        return mean + jnp.sqrt(2.0 * jnp.asarray(step_size, z.dtype)) * (chol @ xi)

    def log_forward(z_star, z, direction):
        mean, chol = mean_and_chol(z, direction[0])
        return _log_normal_chol(z_star, mean, chol, 2.0 * jnp.asarray(step_size, z.dtype))

    def log_backward(z, z_star, direction):
        mean, chol = mean_and_chol(z_star, -direction[0])
        return _log_normal_chol(z, mean, chol, 2.0 * jnp.asarray(step_size, z.dtype))

    def check(position):
        _check_d_q(D, Q, position)

    return Proposal(sample, log_forward, log_backward, direction_size=1, grad_evals=2, check=check)


# ----------------------------------------------------------- random-walk baseline


def rwmh_init(position: ArrayLike, logdensity_fn: LogDensityFn) -> RWMHState:
    """Start Gaussian random-walk MH at ``position: (d,)`` (vmappable over chains)."""
    position = check_position(position, ndim=1)
    check_logdensity(logdensity_fn, position)
    return RWMHState(position, jnp.asarray(logdensity_fn(position), position.dtype))


def rwmh_step(
    rng_key: PRNGKey,
    state: RWMHState,
    logdensity_fn: LogDensityFn,
    step_size: float,
) -> tuple[RWMHState, RWMHInfo]:
    """One Gaussian random-walk Metropolis–Hastings step (the reversible baseline).

    ``z* = z + step_size·ξ``, ``ξ ~ N(0, I_d)``; symmetric, so ``a = min(1, π(z*)/π(z))``.
    ``rng_key`` is split into ``(key_proposal, key_accept)`` as in
    :func:`irreversible_mh_step`. Pure and jittable; vmap over ``(rng_key, state)``.
    """
    check_positive(step_size, "step_size")
    z = state.position
    key_proposal, key_accept = jax.random.split(rng_key)
    z_star = z + jnp.asarray(step_size, z.dtype) * jax.random.normal(key_proposal, z.shape, dtype=z.dtype)
    logdensity_new = jnp.asarray(logdensity_fn(z_star), z.dtype)
    accepted, acceptance_rate = _metropolis(key_accept, logdensity_new - state.logdensity)
    diverged = _proposal_trouble(z_star, logdensity_new)
    accepted = accepted & ~diverged
    new_state = RWMHState(
        position=jnp.where(accepted, z_star, z),
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
    """
    check_callable(logdensity_fn, "logdensity_fn", "z -> scalar log density")
    _check_proposal(proposal)
    check_bool(flip_on_reject, "flip_on_reject")

    def init(position, rng_key=None):
        return irreversible_mh_init(position, logdensity_fn, rng_key, proposal=proposal)

    def step(rng_key, state):
        return irreversible_mh_step(rng_key, state, logdensity_fn, proposal, flip_on_reject=flip_on_reject)

    return SamplingAlgorithm(init, step)


def rwmh(logdensity_fn: LogDensityFn, step_size: float) -> SamplingAlgorithm:
    """Gaussian random-walk MH with proposal ``N(z, step_size² I)`` as a sampler object."""
    check_callable(logdensity_fn, "logdensity_fn", "z -> scalar log density")
    check_positive(step_size, "step_size")

    def init(position, rng_key=None):
        del rng_key  # deterministic start
        return rwmh_init(position, logdensity_fn)

    def step(rng_key, state):
        return rwmh_step(rng_key, state, logdensity_fn, step_size)

    return SamplingAlgorithm(init, step)
