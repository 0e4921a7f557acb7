"""EnLMC: ensemble Langevin Monte Carlo (Ding & Li, Algorithm 3.1).

See docs/algorithms.md §2-3. Ding & Li, *Constrained Ensemble Langevin Monte
Carlo*. Both samplers run Langevin Monte Carlo on an ensemble ``x_1..x_N`` but
replace the gradient ``∇f(x_i)`` (``f = -logdensity_fn``) by an estimate built
from the values ``f(x_j)`` of the other particles, so that a step costs N
evaluations of ``f`` and (ideally) few gradients.

Ensemble gradient estimate (docs/algorithms.md §2). Conditioned on the past,
particle ``j`` was drawn from ``p_j = N(w_j, 2h I)`` where
``w_j = x_j^{m-1} - h F_j^{m-1}`` is the deterministic part of its last update,
so::

    log p_j = -(d/2) log(4πh) - |x_j - w_j|² / (4h),

and each neighbour gives an unbiased (up to O(L η d)) estimate of ``∇f(x_i)``::

    F_ij = α_d (f(x_j) - f(x_i)) / |x_j - x_i|² · 1[|x_j - x_i| ≤ η] / p_j
           · (x_j - x_i),
    α_d  = d / V_η,  V_η = π^{d/2} η^d / Γ(d/2 + 1).

For a quadratic ``f`` the estimate is exactly unbiased: the second-order term
``(uᵀHu) u / |u|²`` is odd in ``u = x_j - x_i`` and integrates to zero over
the ball. The pair sums are computed by :func:`cenlmc_jax.pairwise.ensemble_force`
(``log α_d - log p_j`` is combined before exponentiating, so the weight does
not overflow in float32 for moderate ``d``).

EnLMC (Algorithm 3.1, docs/algorithms.md §3)::

    F_i = 1/(N-1) Σ_{j≠i} F_ij,   w_i' = x_i - h F_i,   x_i' = w_i' + sqrt(2h) ξ_i.

Theorem 3.2: for ``d = 1, f = x²/2`` the ``1/p_j`` weight has infinite
variance and ``E|x_i^m|² = ∞`` for ``m > 1``. :func:`enlmc_step` is faithful,
instability included: it reports non-finite particles (``info.diverged``,
``info.num_nonfinite``) and the largest force (``info.max_force_norm``).

Initialisation: nothing is known about how ``x^0`` was drawn, so ``w = +inf``
and ``log p = -inf``: EnLMC uses true gradients exactly for the particles whose
``log p`` is ``-inf`` (only at step 0).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from cenlmc_jax._steps import bound_step
from cenlmc_jax._validation import (
    check_callable,
    check_key,
    check_logdensity,
    check_positions,
    check_positive,
    check_start_logdensity,
    check_state,
    point_like,
)
from cenlmc_jax.base import RunFlag, SamplingAlgorithm
from cenlmc_jax.ensemble.audit import (
    BIASED_FLAG,
    Audit,
    fresh_audit_like,
    gradients_and_audit,
)
from cenlmc_jax.ensemble.lmc import count_nonfinite
from cenlmc_jax.ensemble.options import EnsembleOptions, ensemble_options
from cenlmc_jax.gradients.ensemble import (
    check_grad_fn,
    grad_cost,
    gradient_fn,
    shares_values,
)
from cenlmc_jax.pairwise import ensemble_force
from cenlmc_jax.types import Array, ArrayLike, LogDensityFn, PRNGKey

__all__ = [
    "EnLMCState",
    "EnLMCInfo",
    "enlmc_init",
    "enlmc_step",
    "enlmc_move",
    "enlmc",
    "ENLMC_AUDIT_SIZE",
    "UNUSED_ENSEMBLE_FLAG",
    "ENSEMBLE_MIN_FRACTION",
    "check_ensemble_state",
    "valid_params",
    "ensemble_values",
    "ensemble_move",
    "init_ensemble",
    "log_gaussian_step_density",
]

#: Particles audited per EnLMC step by default (EnLMC is unstable, and the audit is what
#: flags it early).
ENLMC_AUDIT_SIZE = 32

#: CEnLMC's ensemble force used by fewer particle-steps than this (mean of
#: ``info.ensemble_fraction`` over the kept steps): it did LMC's work at extra cost (the
#: pair sums), and ``cj.sample`` and the CLI say so.
ENSEMBLE_MIN_FRACTION = 0.05


def _unused_message(kept: Any, first_step: int) -> str:
    frac = float(np.mean(np.asarray(kept.ensemble_fraction, np.float64)))
    return (
        f"the ensemble force was used by {frac:.1%} of particle-steps after burn-in (< "
        f"{ENSEMBLE_MIN_FRACTION:.0%}, mean of info.ensemble_fraction over the kept "
        "steps): CEnLMC did LMC's work at extra cost. The eta-ball holds too few "
        "neighbours at this dimension and number of particles "
        "(cj.ensemble.tuning.suggest_cenlmc_params's reasoning says how many would "
        "fill it): use more particles, or cj.lmc"
    )


#: The driver's warning for an unused ensemble (CEnLMC's info declares it), once per
#: call on the kept steps.
UNUSED_ENSEMBLE_FLAG = RunFlag(
    "ensemble_fraction",
    _unused_message,
    kept_only=True,
    mean_below=ENSEMBLE_MIN_FRACTION,
    efficiency_only=True,
)


class EnLMCState(NamedTuple):
    """Ensemble state of EnLMC.

    Attributes:
      position: ``(N, d)`` particles ``x^m``.
      logdensity: ``(N,)`` ``logdensity_fn(x^m) = -f(x^m) + const``.
      w: ``(N, d)`` deterministic part of the last update ``x^{m-1} - h F^{m-1}``
        (``+inf`` at initialisation).
      log_p: ``(N,)`` ``log p_j = -(d/2) log(4πh) - |x_j - w_j|²/(4h)``, the
        density of ``x_j`` given the past (``-inf`` at initialisation).
      audit: :class:`Audit`, the running gradient-audit statistic (see
        :func:`enlmc_step`).
    """

    position: Array
    logdensity: Array
    w: Array
    log_p: Array
    audit: Audit


class EnLMCInfo(NamedTuple):
    """What one EnLMC step did (all scalars).

    Attributes:
      grad_evals: gradients evaluated = particles without a previous step (N at
        step 0, then 0).
      grad_evals_padded: gradients computed including buffer padding and the
        audited particles.
      f_evals: evaluations of ``logdensity_fn`` (N: at the new positions).
      model_solves: the step's cost in model evaluations: ``f_evals`` plus every
        gradient computed (padding and audit included) at
        ``grad_fn.model_solves_given_value(d)`` solves each (1 for autodiff;
        ``cj.finite_difference`` of ``logdensity_fn``: 2d central, d forward, the
        value at the particle being known).
      max_force_norm: ``max_i |F_i|`` over particles using the ensemble force.
      num_exploded: particles kicked by ``h|F_i| > blowup_factor · sqrt(2hd)``,
        more than ``blowup_factor`` noise lengths (the heavy tail of Theorem 3.2).
      num_isolated: particles using the ensemble force with no neighbour in their
        η-ball: their force is exactly 0 (no restoring drift; not counted as
        divergence).
      audit_grad_evals: particles audited (``audit_size``, or fewer when fewer used
        the ensemble force); their gradients are computed in the step's one
        gradient call, counted in ``grad_evals_padded`` and ``model_solves``, not in
        ``grad_evals``.
      audit_drift_ratio: median over the audited particles of
        ``F_i·∇f(x_i) / |∇f(x_i)|²`` (1 for an exact gradient; NaN when nothing was
        audited).
      audit_error: median over the audited particles of
        ``|F_i - ∇f(x_i)| / |∇f(x_i)|``.
      audit_noise_error: median over the audited particles of the step's drift
        error ``h|F_i - ∇f(x_i)|`` in units of the Langevin noise length
        ``sqrt(2hd)``.
      audit_variance_inflation: this step's estimate of ``v = (fraction of
        particles using the ensemble force) × E[h|F_i - ∇f(x_i)|² / (2d)]``, the
        relative stationary variance inflation the ensemble noise causes (module
        docstring: ``|F|²`` as a control variate; NaN without audit).
      audit_drift_bias: this step's estimate of the force's systematic error along
        the gradient, ``β = (fraction using the ensemble force) ×
        Σ (F_i - ∇f_i)·∇f_i / Σ |∇f_i|²`` over the audited particles (0 for an
        unbiased force; a force ``(1 + b)∇f`` gives ``fraction × b``, and then the
        stationary variance is off by about ``-β``, relative; NaN without audit).
      unstable: the running drift ratio (``state.audit``) fell below
        :data:`AUDIT_UNSTABLE_RATIO` after :data:`AUDIT_MIN_STEPS` audited steps.
      biased: the running variance-inflation estimate (``state.audit.inflation``)
        exceeds :data:`AUDIT_BIAS_THRESHOLD`, or the running drift bias's size
        (``state.audit.drift_bias``) :data:`AUDIT_DRIFT_BIAS_THRESHOLD`, after
        :data:`AUDIT_BIAS_MIN_STEPS` steps, or from
        :data:`~cenlmc_jax.ensemble.audit.AUDIT_EARLY_MIN_STEPS` steps by more
        than :data:`~cenlmc_jax.ensemble.audit.AUDIT_EARLY_Z` standard errors of
        the running mean (the early flag; not a divergence).
      num_nonfinite: particles whose new position or log density is NaN/inf.
      diverged: ``num_nonfinite + num_exploded > 0`` or ``unstable`` (or a traced
        parameter is NaN / out of range).
    """

    grad_evals: Array
    grad_evals_padded: Array
    f_evals: Array
    model_solves: Array
    max_force_norm: Array
    num_exploded: Array
    num_isolated: Array
    audit_grad_evals: Array
    audit_drift_ratio: Array
    audit_error: Array
    audit_noise_error: Array
    audit_variance_inflation: Array
    audit_drift_bias: Array
    unstable: Array
    biased: Array
    num_nonfinite: Array
    diverged: Array

    run_flags = (BIASED_FLAG,)  # cj.sample warns once when a kept step is biased


# --------------------------------------------------------------------------
# Input checks and pieces CEnLMC shares.
# --------------------------------------------------------------------------


def check_ensemble_state(state: Any, cls: type, init_name: str) -> None:
    """Checks that ``state`` is a ``cls`` with ``position`` of shape ``(N, d)``.

    Args:
      state: the argument.
      cls: the state class required.
      init_name: the function that makes it, for the message.

    Raises:
      ValueError: another class, or a position that is not 2-D.
    """
    check_state(state, cls, init_name)
    if state.position.ndim != 2:
        raise ValueError(
            f"state.position must have shape (N, d); got {tuple(state.position.shape)}."
        )


def check_enlmc_params(step_size, eta, blowup_factor) -> None:
    check_positive(step_size, "step_size")
    check_positive(eta, "eta")
    check_positive(blowup_factor, "blowup_factor", allow_inf=True)


def valid_params(dtype, h, eta, r1, r2, m_f) -> Array:
    """Whether the (possibly traced) parameters are in range.

    Traced parameters cannot be refused up front: a NaN or out-of-range one marks
    the step diverged.

    Args:
      dtype: the dtype to compare in.
      h: the step size (> 0).
      eta: the ball radius (> 0).
      r1: CEnLMC's ``R1`` (>= 0).
      r2: CEnLMC's ``R2`` (>= 0).
      m_f: CEnLMC's ``M_f`` (>= 0).

    Returns:
      A boolean scalar, True when every parameter is in range (False for a NaN).
    """
    a = lambda v: jnp.asarray(v, dtype)  # noqa: E731
    return (a(h) > 0) & (a(eta) > 0) & (a(r1) >= 0) & (a(r2) >= 0) & (a(m_f) >= 0)


def log_gaussian_step_density(noise: Array, step_size: Array) -> Array:
    """``log p_j`` of ``x_j = w_j + sqrt(2h) ξ_j``: ``-(d/2) log(4πh) - |ξ_j|²/2``.

    Computed from ξ rather than ``x_j - w_j`` (same value, no cancellation).

    Args:
      noise: ``ξ``, shape ``(N, d)``.
      step_size: ``h``.

    Returns:
      ``log p``, shape ``(N,)``.
    """
    d = noise.shape[-1]
    return -0.5 * d * jnp.log(4.0 * jnp.pi * step_size) - 0.5 * jnp.sum(
        noise**2, axis=-1
    )


def ensemble_values(logdensity_fn: LogDensityFn, x: Array) -> Array:
    """``logdensity_fn`` at every particle (a Python float return is fine too).

    Args:
      logdensity_fn: ``x: (d,) -> log π(x)``.
      x: the particles, ``(N, d)``.

    Returns:
      The values, ``(N,)`` in ``x``'s dtype.
    """
    return jax.vmap(lambda y: jnp.asarray(logdensity_fn(y), y.dtype))(x)


def ensemble_move(rng_key: PRNGKey, x: Array, force: Array, h: Array):
    """``w' = x - h F``, ``x' = w' + sqrt(2h) ξ``, ``log p'``.

    The noise is drawn exactly as in :func:`cenlmc_jax.ensemble.lmc.lmc_step` (same
    key => same ξ; Theorem 3.3 coupling).

    Args:
      rng_key: the step's key.
      x: the particles, ``(N, d)``.
      force: ``F``, the force on each particle, ``(N, d)``.
      h: the step size.

    Returns:
      ``(w', x', log p')``, shapes ``(N, d)``, ``(N, d)``, ``(N,)``.
    """
    noise = jax.random.normal(rng_key, x.shape, dtype=x.dtype)
    w_new = x - h * force
    return w_new, w_new + jnp.sqrt(2.0 * h) * noise, log_gaussian_step_density(noise, h)


def init_ensemble(positions: ArrayLike, logdensity_fn: LogDensityFn):
    """The start shared by EnLMC and CEnLMC.

    Checks the positions (``N >= 2``) and the log density, evaluates it at every
    particle, and sets ``w = +inf``, ``log p = -inf``.

    Args:
      positions: the ensemble, ``(N, d)``.
      logdensity_fn: ``x: (d,) -> log π(x) + const``.

    Returns:
      ``(x, logdensity, w, log_p)``.

    Raises:
      ValueError: bad positions, a bad log density, or one that is ``-inf``/NaN at
        every particle.
    """
    x = check_positions(positions, min_particles=2)
    check_logdensity(logdensity_fn, point_like(x))
    # a Python float from logdensity_fn becomes an array of the positions' dtype
    logdensity = ensemble_values(logdensity_fn, x)
    check_start_logdensity(logdensity, where="particle of positions")
    w, log_p = _unknown_past(x)
    return x, logdensity, w, log_p


@jax.jit
def _unknown_past(x: Array) -> tuple[Array, Array]:
    """``w = +inf`` and ``log p = -inf``: one compiled program (eagerly, each constant
    is two)."""
    return jnp.full_like(x, jnp.inf), jnp.full(x.shape[:1], -jnp.inf, dtype=x.dtype)


# --------------------------------------------------------------------------
# EnLMC.
# --------------------------------------------------------------------------


def enlmc_init(positions: ArrayLike, logdensity_fn: LogDensityFn) -> EnLMCState:
    """Start EnLMC from ``positions: (N, d)``, ``N >= 2``.

    Evaluates ``logdensity_fn`` at every particle (N values, no gradient) and
    sets ``w = +inf``, ``log p = -inf``: the first step uses true gradients.

    Args:
      positions: the ensemble, ``(N, d)``.
      logdensity_fn: ``x: (d,) -> log π(x) + const``.

    Returns:
      The :class:`EnLMCState`.

    Raises:
      ValueError: as :func:`init_ensemble`.
    """
    x, logdensity, w, log_p = init_ensemble(positions, logdensity_fn)
    return EnLMCState(x, logdensity, w, log_p, fresh_audit_like(x))


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

    The step (eq. 3.9, 3.10)::

        F_i = 1/(N-1) Σ_{j≠i} α_d (f_j - f_i)/|x_j - x_i|² 1[|x_j - x_i| ≤ η] / p_j
              (x_j - x_i),
        w_i' = x_i - h F_i,   x_i' = w_i' + sqrt(2h) ξ_i.

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
    ``h|F_i| > blowup_factor · sqrt(2hd)`` (``info.num_exploded``). With the true
    gradient, such a kick would need ``h L |x - x*| > 10 sqrt(2hd)`` (default 10):
    a particle far outside the target, not a Langevin step.
    ``blowup_factor=inf`` keeps only the non-finite test.

    Args:
      rng_key: typed or legacy key; the noise is
        ``jax.random.normal(rng_key, (N, d))``.
      state: an :class:`EnLMCState`.
      logdensity_fn: ``x: (d,) -> log p(x) + const``; ``f = -logdensity_fn``.
      step_size: h > 0.
      eta: η > 0, the ball radius.
      blowup_factor: kick size, in noise lengths ``sqrt(2hd)``, counted as a
        blow-up (> 0).
      options: how the step is computed
        (:class:`~cenlmc_jax.ensemble.options.EnsembleOptions`: pair-force
        backend, gradient buffers, mesh, ``audit_size`` (default 32: EnLMC is
        unstable, and the audit is what flags it early), ``grad_fn``,
        ``grad_mode``).
      **option_fields: fields of ``options`` given as keywords
        (``grad_capacity=64``); they replace those of ``options``.

    Returns:
      ``(new_state, info)``: an :class:`EnLMCState` and an :class:`EnLMCInfo`.

    Raises:
      ValueError: a bad state, key, parameter or option.
    """
    check_ensemble_state(state, EnLMCState, "enlmc_init")
    check_key(rng_key)
    check_enlmc_params(step_size, eta, blowup_factor)
    opts = ensemble_options(options, **option_fields)
    opts.capacity(state.position.shape[0])
    return enlmc_move(
        rng_key, state, logdensity_fn, step_size, eta, blowup_factor, opts
    )


def enlmc_move(
    rng_key: PRNGKey,
    state: EnLMCState,
    logdensity_fn: LogDensityFn,
    step_size: float,
    eta: float,
    blowup_factor: float,
    options: EnsembleOptions,
) -> tuple[EnLMCState, EnLMCInfo]:
    """The step of :func:`enlmc_step` without its parameter checks: the kernel.

    For callers that checked the parameters when they were given (the sampler object
    :func:`enlmc`), so that tracing a step runs no Python validation.

    Args:
      rng_key, state, logdensity_fn, step_size, eta, blowup_factor: as
        :func:`enlmc_step`, already checked.
      options: a checked :class:`~cenlmc_jax.ensemble.options.EnsembleOptions`.

    Returns:
      ``(new_state, info)``: an :class:`EnLMCState` and an :class:`EnLMCInfo`.
    """
    # the arguments, not the parameters
    check_ensemble_state(state, EnLMCState, "enlmc_init")
    check_key(rng_key)
    opts = options
    x = state.position
    n, d = x.shape
    capacity = opts.capacity(n)
    audit_size = opts.audit(n, ENLMC_AUDIT_SIZE)
    h = jnp.asarray(step_size, x.dtype)
    f = -state.logdensity
    pf = ensemble_force(
        x, f, state.log_p, jnp.asarray(eta, x.dtype), **opts.force_kwargs()
    )
    ens = pf.force_sum / jnp.asarray(n - 1, x.dtype)
    need = ~jnp.isfinite(state.log_p)  # no previous step: p_j unknown, use ∇f
    grad_one = gradient_fn(
        logdensity_fn, opts.grad_fn, opts.grad_mode, given_value=True
    )
    per_grad = grad_cost(
        opts.grad_fn, d, given_value=shares_values(opts.grad_fn, logdensity_fn)
    )
    audit, a, force, padded = gradients_and_audit(
        rng_key,
        grad_one,
        x,
        need,
        ens,
        capacity,
        opts.dense_grad,
        audit_size,
        state.audit,
        h,
        flag_unstable=True,
        mesh=opts.mesh,
        values=state.logdensity,
    )
    w_new, x_new, log_p_new = ensemble_move(rng_key, x, force, h)
    logdensity = ensemble_values(logdensity_fn, x_new)
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
        diverged=((bad + exploded) > 0)
        | a.unstable
        | ~valid_params(x.dtype, h, eta, 0.0, 0.0, 0.0),
    )
    return EnLMCState(x_new, logdensity, w_new, log_p_new, audit), info


def enlmc(
    logdensity_fn: LogDensityFn,
    step_size: float,
    eta: float,
    *,
    blowup_factor: float = 10.0,
    options: EnsembleOptions | None = None,
    **option_fields: Any,
) -> SamplingAlgorithm:
    """EnLMC (Algorithm 3.1) as a sampler object (provably unstable).

    ``init(positions, rng_key=None)``: :func:`enlmc_init` on ``positions: (N, d)``.
    ``step(rng_key, state)``: :func:`enlmc_step` with these parameters.

    Args:
      logdensity_fn: ``x: (d,) -> log π(x) + const``.
      step_size: h > 0.
      eta: η > 0, the ball radius.
      blowup_factor: as for :func:`enlmc_step`.
      options: :class:`~cenlmc_jax.ensemble.options.EnsembleOptions`.
      **option_fields: its fields as keywords.

    Returns:
      A :class:`~cenlmc_jax.base.SamplingAlgorithm` ``(init, step)``.

    Raises:
      ValueError: a bad argument, checked here.
    """
    check_callable(logdensity_fn, "logdensity_fn", "x -> scalar log density")
    check_enlmc_params(step_size, eta, blowup_factor)
    opts = ensemble_options(options, **option_fields)

    def init(positions, rng_key=None):
        if rng_key is not None:
            # unused (a deterministic start), but a wrong one is a mistake to report
            check_key(rng_key)
        state = enlmc_init(positions, logdensity_fn)
        check_grad_fn(opts.grad_fn, point_like(state.position), "grad_fn")
        return state

    # one function per distinct parameters: a rebuilt sampler reuses cj.sample's
    # compiled run
    # the kernel without checks: they ran above and at init, not at every trace
    step = bound_step(
        enlmc_move,
        logdensity_fn=logdensity_fn,
        step_size=step_size,
        eta=eta,
        blowup_factor=blowup_factor,
        options=opts,
    )
    return SamplingAlgorithm(init, step)
