"""Ensemble Langevin Monte Carlo: EnLMC and constrained EnLMC (docs/algorithms.md §2-4).

Ding & Li, *Constrained Ensemble Langevin Monte Carlo*. Both samplers run
Langevin Monte Carlo on an ensemble ``x_1..x_N`` but replace the gradient
``∇f(x_i)`` (``f = -logdensity_fn``) by an estimate built from the values
``f(x_j)`` of the other particles, so that a step costs N evaluations of
``f`` and (ideally) few gradients.

Ensemble gradient estimate (docs/algorithms.md §2). Conditioned on the past, particle
``j`` was drawn from ``p_j = N(w_j, 2h I)`` where ``w_j = x_j^{m-1} - h F_j^{m-1}``
is the deterministic part of its last update, so

    log p_j = -(d/2) log(4πh) - |x_j - w_j|² / (4h),

and each neighbour gives an unbiased (up to O(L η d)) estimate of ``∇f(x_i)``:

    F_ij = α_d (f(x_j) - f(x_i)) / |x_j - x_i|² · 1[|x_j - x_i| ≤ η] / p_j · (x_j - x_i),
    α_d  = d / V_η,  V_η = π^{d/2} η^d / Γ(d/2 + 1).

For a quadratic ``f`` the estimate is exactly unbiased: the second-order term
``(uᵀHu) u / |u|²`` is odd in ``u = x_j - x_i`` and integrates to zero over
the ball. The pair sums are computed by :func:`cenlmc_jax.pairwise.ensemble_force`
(``log α_d - log p_j`` is combined before exponentiating, so the weight does
not overflow in float32 for moderate ``d``).

EnLMC (Algorithm 3.1, docs/algorithms.md §3):

    F_i = 1/(N-1) Σ_{j≠i} F_ij,   w_i' = x_i - h F_i,   x_i' = w_i' + sqrt(2h) ξ_i.

Theorem 3.2: for ``d = 1, f = x²/2`` the ``1/p_j`` weight has infinite
variance and ``E|x_i^m|² = ∞`` for ``m > 1``. :func:`enlmc_step` is faithful,
instability included: it reports non-finite particles (``info.diverged``,
``info.num_nonfinite``) and the largest force (``info.max_force_norm``).

CEnLMC (Algorithm 3.2, eq. 3.19-3.21, docs/algorithms.md §4): with
``N_i = #{j ≠ i : |w_j - w_i| ≤ R2}`` (3.20),

    F_i = ∇f(x_i)                      if |x_i - w_i| > R1  or  f(x_i) > f* + M_f  or  N_i < N*,
    F_i = 1/N_i Σ_{j≠i} F_ij 1[|w_j - w_i| ≤ R2]   otherwise          (3.19, 3.21)

then the same ``w``, ``x`` update. Only the particles that fail a test get a
gradient, and only those gradients are computed (:func:`cenlmc_jax.ensemble.buffers.needed_grads`):
they are gathered into buffers of ``grad_capacity`` particles and a bounded
``lax.scan`` of ``lax.cond``s runs one vmapped gradient per buffer, so a step costs
``ceil(count / grad_capacity)·grad_capacity`` gradients, not ``N``.

Initialisation: nothing is known about how ``x^0`` was drawn, so
``w = +inf`` and ``log p = -inf`` (docs/algorithms.md: ``w^{-1} = +∞``). For CEnLMC the R1
test then fails for everyone and step 0 uses true gradients; EnLMC uses true
gradients exactly for the particles whose ``log p`` is ``-inf`` (only at step
0: after a step ``log p = -(d/2) log(4πh) - |ξ|²/2`` is finite whatever
happened to ``x``). Rule (3.21) is undefined for ``N_i = 0`` (0/0), so a
particle with no ``R2``-neighbour always takes its gradient, also when
``n_star = 0``.

Departure from the paper (the guard, on by default). Rule (3.21) counts
``R2``-neighbours in ``w``-space, but the force sums over the η-ball in
``x``-space. When the η-ball is empty (``d`` of 5 or more with too few
particles), a particle can pass every test and receive a force of exactly 0:
it diffuses, and the moments are wrong. So a particle whose η-ball held fewer
than ``min_ball_neighbours`` (default 1: an empty ball) R2-neighbours at the
previous step takes its true gradient (``info.num_fail_ball``);
``min_ball_neighbours=0`` restores (3.21) exactly. The previous step's count,
not the current one: the current count depends on the very draws ``x_j`` the
estimate averages, and selecting on it biases the force (measured: a 6%
over-estimate of ``∇f`` on the 2-D Gaussian with the current count); the
previous count is a function of the past, so the force stays unbiased given
the past, as in the paper's argument.

Gradient audit (beyond the paper; :mod:`cenlmc_jax.ensemble.audit`): each step
compares the ensemble force with true gradients at a few random particles that
used it; ``info.unstable`` flags EnLMC's drift deficit (Theorem 3.2) and
``info.biased`` a variance inflation beyond
:data:`~cenlmc_jax.ensemble.audit.AUDIT_BIAS_THRESHOLD`.

How a step is computed (pair-force backend, gradient buffers, sharding, the
audit's size, a user's gradient) is one :class:`~cenlmc_jax.ensemble.options.EnsembleOptions`.

``r2`` = R2 >= 0, radius in ``w``-space; ``n_star`` = N*, an integer in
``[0, N-1]``; ``m_f`` = M_f >= 0 (``inf`` switches the test off); ``f_star`` =
f* = min f. ``r1 = 0`` or ``r2 = 0`` are allowed and switch the ensemble off
(every particle fails a test almost surely): the sampler is then LMC.
"""

from __future__ import annotations

import warnings
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from cenlmc_jax._steps import bound_step
from cenlmc_jax._validation import (
    check_callable,
    check_finite_scalar,
    check_int,
    check_key,
    check_logdensity,
    check_nonnegative,
    check_positions,
    check_positive,
    check_start_logdensity,
    check_state,
    is_concrete,
)
from cenlmc_jax.base import SamplingAlgorithm
from cenlmc_jax.ensemble.audit import CENLMC_AUDIT_SIZE, fresh_audit, gradients_and_audit
from cenlmc_jax.ensemble.least_squares import check_estimator, least_squares_force
from cenlmc_jax.ensemble.options import EnsembleOptions, ensemble_options
from cenlmc_jax.ensemble.states import CEnLMCInfo, CEnLMCState, EnLMCInfo, EnLMCState
from cenlmc_jax.langevin import check_grad_fn, count_nonfinite, grad_cost, gradient_fn, shares_values
from cenlmc_jax.pairwise import ensemble_force
from cenlmc_jax.tuning import find_f_star
from cenlmc_jax.types import Array, ArrayLike, LogDensityFn, PRNGKey

__all__ = [
    "EnLMCState", "EnLMCInfo", "enlmc_init", "enlmc_step", "enlmc",
    "CEnLMCState", "CEnLMCInfo", "cenlmc_init", "cenlmc_step", "cenlmc",
    "ENLMC_AUDIT_SIZE", "check_cenlmc_params",
]

#: Particles audited per EnLMC step by default (EnLMC is unstable, and the audit is what flags it early).
ENLMC_AUDIT_SIZE = 32


# --------------------------------------------------------------------------
# Input checks (Python, before tracing).
# --------------------------------------------------------------------------


def check_cenlmc_params(n: int | None, step_size, eta, r1, r2, n_star, m_f) -> None:
    """The scalar parameters of Algorithm 3.2 for an ensemble of ``n`` particles (None: not known yet).

    Traced values pass (their values are checked where they are concrete)."""
    check_positive(step_size, "step_size")
    check_positive(eta, "eta")
    check_nonnegative(r1, "r1")
    check_nonnegative(r2, "r2")
    if is_concrete(n_star):
        why = "" if n is None else f"N* cannot exceed the N-1 = {n - 1} other particles"
        check_int(n_star, "n_star", minimum=0, maximum=None if n is None else n - 1, why=why)
    check_nonnegative(m_f, "m_f", allow_inf=True)


def _check_ensemble_state(state: Any, cls: type, init_name: str) -> None:
    check_state(state, cls, init_name)
    if state.position.ndim != 2:
        raise ValueError(f"state.position must have shape (N, d); got {tuple(state.position.shape)}.")


def _check_enlmc_params(step_size, eta, blowup_factor) -> None:
    check_positive(step_size, "step_size")
    check_positive(eta, "eta")
    check_positive(blowup_factor, "blowup_factor", allow_inf=True)


def _check_min_ball(min_ball_neighbours: int | None, n: int | None) -> int:
    """The guard's threshold (default 1), in ``[0, N-1]`` when N is known."""
    if min_ball_neighbours is None:
        return 1
    return check_int(min_ball_neighbours, "min_ball_neighbours", minimum=0, maximum=None if n is None else n - 1)


def _valid_params(dtype, h, eta, r1, r2, m_f) -> Array:
    """Traced parameters cannot be refused up front: a NaN or out-of-range one marks the step diverged."""
    a = lambda v: jnp.asarray(v, dtype)  # noqa: E731
    return (a(h) > 0) & (a(eta) > 0) & (a(r1) >= 0) & (a(r2) >= 0) & (a(m_f) >= 0)


def _check_f_star(f_star: Any) -> None:
    if f_star is not None:
        check_finite_scalar(f_star, "f_star", "a finite scalar (min f = -max logdensity_fn) or None")


# --------------------------------------------------------------------------
# Shared pieces.
# --------------------------------------------------------------------------


def log_gaussian_step_density(noise: Array, step_size: Array) -> Array:
    """``log p_j`` of ``x_j = w_j + sqrt(2h) ξ_j``: ``-(d/2) log(4πh) - |ξ_j|²/2``, (N,).

    Computed from ξ rather than ``x_j - w_j`` (same value, no cancellation).
    """
    d = noise.shape[-1]
    return -0.5 * d * jnp.log(4.0 * jnp.pi * step_size) - 0.5 * jnp.sum(noise**2, axis=-1)



def _values(logdensity_fn: LogDensityFn, x: Array) -> Array:
    """``logdensity_fn`` at every particle, (N,) in x's dtype (a Python float return is fine too)."""
    return jax.vmap(lambda y: jnp.asarray(logdensity_fn(y), y.dtype))(x)



def _move(rng_key: PRNGKey, x: Array, force: Array, h: Array):
    """``w' = x - h F``, ``x' = w' + sqrt(2h) ξ``, ``log p'``. The noise is drawn exactly
    as in :func:`cenlmc_jax.langevin.lmc_step` (same key => same ξ; Theorem 3.3 coupling)."""
    noise = jax.random.normal(rng_key, x.shape, dtype=x.dtype)
    w_new = x - h * force
    return w_new, w_new + jnp.sqrt(2.0 * h) * noise, log_gaussian_step_density(noise, h)


def _init_common(positions: ArrayLike, logdensity_fn: LogDensityFn):
    x = check_positions(positions, min_particles=2)
    check_logdensity(logdensity_fn, x[0])
    # a Python float from logdensity_fn becomes an array of the positions' dtype
    logdensity = _values(logdensity_fn, x)
    check_start_logdensity(logdensity, where="particle of positions")
    w = jnp.full_like(x, jnp.inf)
    log_p = jnp.full(x.shape[:1], -jnp.inf, dtype=x.dtype)
    return x, logdensity, w, log_p



# --------------------------------------------------------------------------
# EnLMC.
# --------------------------------------------------------------------------


def enlmc_init(positions: ArrayLike, logdensity_fn: LogDensityFn) -> EnLMCState:
    """Start EnLMC from ``positions: (N, d)``, ``N >= 2``.

    Evaluates ``logdensity_fn`` at every particle (N values, no gradient) and
    sets ``w = +inf``, ``log p = -inf``: the first step uses true gradients.
    """
    x, logdensity, w, log_p = _init_common(positions, logdensity_fn)
    return EnLMCState(x, logdensity, w, log_p, fresh_audit(x.dtype))


def enlmc_step(
    rng_key: PRNGKey,
    state: EnLMCState,
    logdensity_fn: LogDensityFn,
    step_size: float,
    eta: float,
    *,
    blowup_factor: float = 10.0,
    options: EnsembleOptions | None = None,
    **option_fields: Any,
) -> tuple[EnLMCState, EnLMCInfo]:
    """One step of EnLMC (Algorithm 3.1) for every particle; pure and jittable.

    ``F_i = 1/(N-1) Σ_{j≠i} α_d (f_j - f_i)/|x_j - x_i|² 1[|x_j - x_i| ≤ η] / p_j (x_j - x_i)``
    (eq. 3.9), ``w_i' = x_i - h F_i``, ``x_i' = w_i' + sqrt(2h) ξ_i`` (3.10).

    Unstable by design (Theorem 3.2): a neighbour with a large ``|ξ_j|`` has a
    tiny ``p_j`` and an enormous weight. Blow-ups are reported in the info,
    never raised. In float arithmetic the infinite second moment rarely
    produces inf/NaN (the log-space weight does not overflow); it shows as
    a realised force that is typically far below ``∇f`` (the mean sits in
    rare, huge values): particles drift into the tails, where they have few
    or no neighbours (``info.num_isolated``: force exactly 0), and the
    ensemble's second moment keeps growing, with occasional huge kicks. So
    besides non-finite particles a step counts as diverged when some ensemble
    force moves a particle by more than ``blowup_factor`` noise lengths,
    ``h|F_i| > blowup_factor · sqrt(2hd)``
    (``info.num_exploded``). With the true gradient, such a kick would need
    ``h L |x - x*| > 10 sqrt(2hd)`` (default 10): a particle far outside the
    target, not a Langevin step. ``blowup_factor=inf`` keeps only the
    non-finite test.

    Args:
      rng_key: typed or legacy key; the noise is ``jax.random.normal(rng_key, (N, d))``.
      state: an :class:`EnLMCState`.
      logdensity_fn: ``x: (d,) -> log p(x) + const``; ``f = -logdensity_fn``.
      step_size: h > 0.  eta: η > 0, the ball radius.
      blowup_factor: kick size, in noise lengths ``sqrt(2hd)``, counted as a blow-up (> 0).
      options: how the step is computed (:class:`~cenlmc_jax.ensemble.options.EnsembleOptions`:
        pair-force backend, gradient buffers, mesh, ``audit_size`` (default 32: EnLMC is unstable,
        and the audit is what flags it early), ``grad_fn``, ``grad_mode``); its fields may also be given as
        keywords (``grad_capacity=64``), which replace those of ``options``.
    """
    _check_ensemble_state(state, EnLMCState, "enlmc_init")
    check_key(rng_key)
    _check_enlmc_params(step_size, eta, blowup_factor)
    opts = ensemble_options(options, **option_fields)
    x = state.position
    n, d = x.shape
    capacity = opts.capacity(n)
    audit_size = opts.audit(n, ENLMC_AUDIT_SIZE)
    h = jnp.asarray(step_size, x.dtype)
    f = -state.logdensity
    pf = ensemble_force(x, f, state.log_p, jnp.asarray(eta, x.dtype), **opts.force_kwargs())
    ens = pf.force_sum / jnp.asarray(n - 1, x.dtype)
    need = ~jnp.isfinite(state.log_p)  # no previous step: p_j unknown, use ∇f
    grad_one = gradient_fn(logdensity_fn, opts.grad_fn, opts.grad_mode, given_value=True)
    per_grad = grad_cost(opts.grad_fn, d, given_value=shares_values(opts.grad_fn, logdensity_fn))
    audit, a, force, padded = gradients_and_audit(rng_key, grad_one, x, need, ens, capacity, opts.dense_grad,
                                                  audit_size, state.audit, h, flag_unstable=True, mesh=opts.mesh,
                                                  values=state.logdensity)
    w_new, x_new, log_p_new = _move(rng_key, x, force, h)
    logdensity = _values(logdensity_fn, x_new)
    bad = count_nonfinite(x_new, logdensity)
    ens_norm = jnp.where(need, 0.0, jnp.linalg.norm(force, axis=-1))
    kick = jnp.asarray(blowup_factor, x.dtype) * jnp.sqrt(2.0 * h * d)
    exploded = jnp.sum(h * ens_norm > kick, dtype=jnp.int32)
    info = EnLMCInfo(
        grad_evals=jnp.sum(need, dtype=jnp.int32),
        grad_evals_padded=jnp.asarray(padded, jnp.int32),
        f_evals=jnp.asarray(n, jnp.int32),
        model_solves=(n + padded * per_grad).astype(x.dtype),
        max_force_norm=jnp.max(ens_norm),
        num_exploded=exploded,
        num_isolated=jnp.sum(~need & (pf.n_ball == 0), dtype=jnp.int32),
        **a.info_fields(),
        unstable=a.unstable,
        num_nonfinite=bad,
        diverged=((bad + exploded) > 0) | a.unstable | ~_valid_params(x.dtype, h, eta, 0.0, 0.0, 0.0),
    )
    return EnLMCState(x_new, logdensity, w_new, log_p_new, audit), info



# --------------------------------------------------------------------------
# CEnLMC.
# --------------------------------------------------------------------------


def cenlmc_init(
    positions: ArrayLike,
    logdensity_fn: LogDensityFn,
    f_star: float | None = None,
    *,
    f_star_tol: float | None = None,
    f_star_max_steps: int = 500,
) -> CEnLMCState:
    """Start CEnLMC from ``positions: (N, d)``, ``N >= 2``.

    Evaluates ``logdensity_fn`` at every particle and sets ``w = +inf``,
    ``log p = -inf`` (``w^{-1} = +∞`` of Algorithm 3.2): step 0 uses true
    gradients for everyone.

    ``f_star`` (``f* = min f = -max logdensity_fn``, in the normalisation of
    ``logdensity_fn``): if None it is found by
    :func:`cenlmc_jax.tuning.find_f_star` (L-BFGS from the best particle,
    stopped when ``|∇f| <= f_star_tol``) and ``state.f_star_estimated`` is True.
    A given ``f_star`` above ``min_i f(x_i)`` cannot be the minimum (often a
    different normalisation of ``logdensity_fn``): ValueError.
    """
    x, logdensity, w, log_p = _init_common(positions, logdensity_fn)
    _check_f_star(f_star)
    if f_star is None:
        res = find_f_star(logdensity_fn, x, tol=f_star_tol, max_steps=f_star_max_steps)
        fs, estimated = jnp.asarray(res.f_star, x.dtype), True
    else:
        if is_concrete(f_star) and is_concrete(logdensity):
            arr = np.asarray(f_star)
            f_min = float(-jnp.max(logdensity))
            # a little slack for rounding in the user's value and in logdensity_fn
            if float(arr) > f_min + 1e-6 * max(1.0, abs(f_min)):
                raise ValueError(
                    f"f_star must be min f = -max logdensity_fn; got f_star={float(arr)!r}, but a particle has "
                    f"f = {f_min!r} < f_star (is logdensity_fn normalised differently?)."
                )
        fs, estimated = jnp.asarray(f_star, x.dtype), False
    return CEnLMCState(x, logdensity, w, log_p, fs, jnp.asarray(estimated), fresh_audit(x.dtype),
                       jnp.full(x.shape[:1], jnp.iinfo(jnp.int32).max, jnp.int32))


def cenlmc_step(
    rng_key: PRNGKey,
    state: CEnLMCState,
    logdensity_fn: LogDensityFn,
    step_size: float,
    eta: float,
    r1: float,
    r2: float,
    n_star: int,
    m_f: float,
    f_star: float | None = None,
    *,
    min_ball_neighbours: int | None = None,
    estimator: str = "paper",
    options: EnsembleOptions | None = None,
    **option_fields: Any,
) -> tuple[CEnLMCState, CEnLMCInfo]:
    """One step of CEnLMC (Algorithm 3.2, eq. 3.19-3.21) for every particle; pure and jittable.

    With ``f = -logdensity_fn`` and ``N_i = #{j ≠ i: |w_j - w_i| ≤ R2}`` (3.20):
    particle i takes the true gradient ``∇f(x_i)`` if ``|x_i - w_i| > R1``,
    ``f(x_i) > f* + M_f`` or ``N_i < max(N*, 1)``; otherwise

        F_i = 1/N_i Σ_{j≠i} α_d (f_j - f_i)/|x_j - x_i|² 1[|x_j-x_i| ≤ η, |w_j-w_i| ≤ R2] / p_j (x_j - x_i).

    Then ``w_i' = x_i - h F_i``, ``x_i' = w_i' + sqrt(2h) ξ_i`` with
    ``ξ = jax.random.normal(rng_key, (N, d))`` (the same draw as
    :func:`cenlmc_jax.lmc_step`), and ``logdensity_fn`` at the N new positions.

    Cost: N values of ``logdensity_fn``, one O(N²) pair sum and gradients
    only for the ``info.grad_evals`` particles that failed a test (computed in
    buffers of ``grad_capacity``; ``info.grad_evals_padded`` counts the padding).

    Args:
      rng_key: typed or legacy key.
      state: a :class:`CEnLMCState` from :func:`cenlmc_init`.
      logdensity_fn: ``x: (d,) -> log p(x) + const``.
      step_size: h > 0.  eta: η > 0.  r1: R1 >= 0.  r2: R2 >= 0.
      n_star: N*, integer in ``[0, N-1]``.  m_f: M_f >= 0 (inf: no M_f test).
      f_star: f* = min f; None uses ``state.f_star`` (set by :func:`cenlmc_init`).
      min_ball_neighbours: the guard (module docstring, "Departure from the
        paper"): a particle whose η-ball held fewer than this many
        R2-neighbours at the previous step takes its true gradient. Default 1
        (an empty ball: a force of exactly 0); 0 restores rule (3.21) exactly.
      estimator: ``"paper"`` (default, eq. 3.19) or, beyond the paper, ``"least_squares"`` /
        ``"least_squares_quadratic"``: the local fit of :mod:`cenlmc_jax.ensemble.least_squares`
        (a particle whose fit it refuses takes its true gradient). The audit's variance inflation
        does not measure the fit's bias; its drift bias sees the part along the gradient
        (:data:`LEAST_SQUARES_CAVEAT`; ``cj.cenlmc`` warns of it).
      options: how the step is computed (:class:`~cenlmc_jax.ensemble.options.EnsembleOptions`:
        pair-force backend, gradient buffers (``grad_capacity``; default one bucketed call a step),
        mesh, ``audit_size`` (default :data:`~cenlmc_jax.ensemble.audit.CENLMC_AUDIT_SIZE`),
        ``grad_fn``, ``grad_mode``); its fields may also be given as keywords, which replace those of
        ``options``.
    """
    _check_ensemble_state(state, CEnLMCState, "cenlmc_init")
    check_key(rng_key)
    x = state.position
    n, d = x.shape
    check_cenlmc_params(n, step_size, eta, r1, r2, n_star, m_f)
    _check_f_star(f_star)
    opts = ensemble_options(options, **option_fields)
    capacity = opts.capacity(n)
    audit_size = opts.audit(n, CENLMC_AUDIT_SIZE)
    min_ball = _check_min_ball(min_ball_neighbours, n)
    check_estimator(estimator)

    dt = x.dtype
    h = jnp.asarray(step_size, dt)
    fs = state.f_star if f_star is None else jnp.asarray(f_star, dt)
    f = -state.logdensity
    pf = ensemble_force(x, f, state.log_p, jnp.asarray(eta, dt), w=state.w, r2=jnp.asarray(r2, dt),
                        **opts.force_kwargs())
    # comparisons written so that NaN/inf fail the test (w = +inf at init gives NaN/inf here)
    fail_r1 = ~(jnp.linalg.norm(x - state.w, axis=-1) <= jnp.asarray(r1, dt))
    fail_mf = ~(f <= fs + jnp.asarray(m_f, dt))
    fail_n = pf.n_r2 < jnp.maximum(jnp.asarray(n_star, jnp.int32), 1)
    # the guard reads the previous step's η-ball count: a function of the past only, so
    # selecting on it keeps the ensemble force unbiased given the past (today's count is not)
    fail_ball = state.ball_count < min_ball
    need = fail_r1 | fail_mf | fail_n | fail_ball
    ens = pf.force_sum / jnp.maximum(pf.n_r2, 1).astype(dt)[:, None]
    if estimator != "paper":
        ens, need = least_squares_force(x, f, eta, need, estimator, opts.method, opts.mesh, opts.interpret)
    grad_one = gradient_fn(logdensity_fn, opts.grad_fn, opts.grad_mode, given_value=True)
    per_grad = grad_cost(opts.grad_fn, d, given_value=shares_values(opts.grad_fn, logdensity_fn))
    audit, a, force, padded = gradients_and_audit(rng_key, grad_one, x, need, ens, capacity, opts.dense_grad,
                                                  audit_size, state.audit, h, flag_unstable=False, mesh=opts.mesh,
                                                  values=state.logdensity)
    w_new, x_new, log_p_new = _move(rng_key, x, force, h)
    logdensity = _values(logdensity_fn, x_new)
    bad = count_nonfinite(x_new, logdensity)
    num_need = jnp.sum(need, dtype=jnp.int32)
    info = CEnLMCInfo(
        grad_evals=num_need,
        grad_evals_padded=jnp.asarray(padded, jnp.int32),
        f_evals=jnp.asarray(n, jnp.int32),
        model_solves=(n + padded * per_grad).astype(x.dtype),
        ensemble_fraction=(n - num_need).astype(dt) / n,
        mean_num_neighbours=jnp.mean(pf.n_r2.astype(dt)),
        mean_ball_neighbours=jnp.mean(pf.n_ball.astype(dt)),
        num_fail_r1=jnp.sum(fail_r1, dtype=jnp.int32),
        num_fail_m_f=jnp.sum(fail_mf, dtype=jnp.int32),
        num_fail_n_star=jnp.sum(fail_n, dtype=jnp.int32),
        num_fail_ball=jnp.sum(fail_ball & ~(fail_r1 | fail_mf | fail_n), dtype=jnp.int32),
        **a.info_fields(),
        num_nonfinite=bad,
        diverged=(bad > 0) | ~_valid_params(dt, h, eta, r1, r2, m_f),
    )
    # rows without a previous step (w = +inf) have no meaningful count yet: "unknown" does not guard
    known = jnp.all(jnp.isfinite(state.w), axis=-1)
    ball_count = jnp.where(known, pf.n_ball, jnp.iinfo(jnp.int32).max)
    new_state = CEnLMCState(x_new, logdensity, w_new, log_p_new, state.f_star, state.f_star_estimated, audit,
                            ball_count)
    return new_state, info



# --------------------------------------------------------------------------
# Sampler objects.
# --------------------------------------------------------------------------


def enlmc(
    logdensity_fn: LogDensityFn,
    step_size: float,
    eta: float,
    *,
    blowup_factor: float = 10.0,
    options: EnsembleOptions | None = None,
    **option_fields: Any,
) -> SamplingAlgorithm:
    """EnLMC (Algorithm 3.1) as a sampler object; see :func:`enlmc_step` (provably unstable).

    ``init(positions, rng_key=None)``: :func:`enlmc_init` on ``positions: (N, d)``.
    ``step(rng_key, state)``: :func:`enlmc_step` with these parameters.
    ``options`` / ``option_fields``: :class:`~cenlmc_jax.ensemble.options.EnsembleOptions`.
    """
    check_callable(logdensity_fn, "logdensity_fn", "x -> scalar log density")
    _check_enlmc_params(step_size, eta, blowup_factor)
    opts = ensemble_options(options, **option_fields)

    def init(positions, rng_key=None):
        if rng_key is not None:
            check_key(rng_key)  # unused (a deterministic start), but a wrong one is a mistake to report
        state = enlmc_init(positions, logdensity_fn)
        check_grad_fn(opts.grad_fn, state.position[0], "grad_fn")
        return state

    # one function per distinct parameters: a rebuilt sampler reuses cj.sample's compiled run
    step = bound_step(enlmc_step, logdensity_fn=logdensity_fn, step_size=step_size, eta=eta,
                     blowup_factor=blowup_factor, options=opts)
    return SamplingAlgorithm(init, step)


#: What ``cj.cenlmc(..., estimator="least_squares" | "least_squares_quadratic")`` warns of (beyond the paper).
LEAST_SQUARES_CAVEAT = (
    "the least-squares ensemble gradient is beyond the paper, and its error is a systematic O(eta^2) bias (none on a "
    "quadratic with the quadratic term) that the audit's variance inflation does not see: measured on N(0, I_3) "
    "(benchmarks/results/frontier.md), variance errors of 0.4%, 7% and 17% at eta = 1, 2, 3 x the suggested one, with "
    "an audited inflation below 0.1% on every row. The audit's drift bias (info.audit_drift_bias, "
    "benchmarks/results/drift_bias.md) measures the part along the gradient and sets info.biased above 6%; an error "
    "across the gradient is not seen. Check the moments against cj.lmc on your problem.")


def cenlmc(
    logdensity_fn: LogDensityFn,
    step_size: float,
    eta: float,
    r1: float,
    r2: float,
    n_star: int,
    m_f: float,
    *,
    f_star: float | None = None,
    f_star_tol: float | None = None,
    f_star_max_steps: int = 500,
    min_ball_neighbours: int | None = None,
    estimator: str = "paper",
    options: EnsembleOptions | None = None,
    **option_fields: Any,
) -> SamplingAlgorithm:
    """CEnLMC (Algorithm 3.2) as a sampler object; see :func:`cenlmc_step`.

    ``init(positions, rng_key=None)``: :func:`cenlmc_init` on ``positions: (N, d)``
    with ``f_star`` (found by L-BFGS when None). ``step(rng_key, state)``:
    :func:`cenlmc_step` with these parameters (``f*`` read from the state).
    ``N* <= N - 1`` is checked when the ensemble is known (at ``init``).
    ``options`` / ``option_fields``: :class:`~cenlmc_jax.ensemble.options.EnsembleOptions`.
    """
    check_callable(logdensity_fn, "logdensity_fn", "x -> scalar log density")
    check_cenlmc_params(None, step_size, eta, r1, r2, n_star, m_f)
    _check_f_star(f_star)
    _check_min_ball(min_ball_neighbours, None)
    check_estimator(estimator)
    if estimator != "paper":
        warnings.warn(LEAST_SQUARES_CAVEAT, UserWarning, stacklevel=2)
    opts = ensemble_options(options, **option_fields)

    def init(positions, rng_key=None):
        if rng_key is not None:
            check_key(rng_key)  # unused (a deterministic start), but a wrong one is a mistake to report
        state = cenlmc_init(positions, logdensity_fn, f_star, f_star_tol=f_star_tol, f_star_max_steps=f_star_max_steps)
        n = state.position.shape[0]
        check_cenlmc_params(n, step_size, eta, r1, r2, n_star, m_f)
        _check_min_ball(min_ball_neighbours, n)
        opts.capacity(n)
        check_grad_fn(opts.grad_fn, state.position[0], "grad_fn")
        return state

    # one function per distinct parameters: a rebuilt sampler reuses cj.sample's compiled run
    step = bound_step(cenlmc_step, logdensity_fn=logdensity_fn, step_size=step_size, eta=eta, r1=r1, r2=r2,
                     n_star=n_star, m_f=m_f, min_ball_neighbours=min_ball_neighbours, estimator=estimator,
                     options=opts)

    return SamplingAlgorithm(init, step)
