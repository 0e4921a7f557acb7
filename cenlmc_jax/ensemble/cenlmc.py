"""CEnLMC: constrained ensemble Langevin Monte Carlo (Ding & Li, Algorithm 3.2).

The ensemble estimate ``F_ij`` and the step are EnLMC's
(:mod:`cenlmc_jax.ensemble.enlmc`).

CEnLMC (Algorithm 3.2, eq. 3.19-3.21, docs/algorithms.md §4): with
``N_i = #{j ≠ i : |w_j - w_i| ≤ R2}`` (3.20)::

    F_i = ∇f(x_i)     if |x_i - w_i| > R1  or  f(x_i) > f* + M_f  or  N_i < N*,
    F_i = 1/N_i Σ_{j≠i} F_ij 1[|w_j - w_i| ≤ R2]     otherwise    (3.19, 3.21)

then the same ``w``, ``x`` update. Only the particles that fail a test get a
gradient, and only those gradients are computed
(:func:`cenlmc_jax.ensemble.buffers.needed_grads`): they are gathered into buffers
of ``grad_capacity`` particles and a bounded ``lax.scan`` of ``lax.cond`` s runs one
vmapped gradient per buffer, so a step costs
``ceil(count / grad_capacity)·grad_capacity`` gradients, not ``N``.

Initialisation: nothing is known about how ``x^0`` was drawn, so ``w = +inf`` and
``log p = -inf`` (docs/algorithms.md: ``w^{-1} = +∞``). For CEnLMC the R1 test then
fails for everyone and step 0 uses true gradients; EnLMC uses true gradients
exactly for the particles whose ``log p`` is ``-inf`` (only at step 0: after a step
``log p = -(d/2) log(4πh) - |ξ|²/2`` is finite whatever happened to ``x``). Rule
(3.21) is undefined for ``N_i = 0`` (0/0), so a particle with no ``R2``-neighbour
always takes its gradient, also when ``n_star = 0``.

Departure from the paper (the guard, on by default). Rule (3.21) counts
``R2``-neighbours in ``w``-space, but the force sums over the η-ball in
``x``-space. When the η-ball is empty (``d`` of 5 or more with too few
particles), a particle can pass every test and receive a force of exactly 0:
it diffuses, and the moments are wrong. So a particle whose η-ball held fewer
than ``min_ball_neighbours`` (default 1: an empty ball) R2-neighbours at the
previous step takes its true gradient (``info.num_fail_ball``);
``min_ball_neighbours=0`` restores (3.21) exactly. The previous step's count,
not the current one: the current count depends on the very draws ``x_j`` the
estimate averages, and selecting on it biases the force (with the current
count, the force over-estimates ``∇f`` on the 2-D Gaussian); the previous count
is a function of the past, so the force stays unbiased given the past, as in
the paper's argument.

Gradient audit (beyond the paper; :mod:`cenlmc_jax.ensemble.audit`): each step
compares the ensemble force with true gradients at a few random particles that
used it; ``info.unstable`` flags EnLMC's drift deficit (Theorem 3.2) and
``info.biased`` a variance inflation beyond
:data:`~cenlmc_jax.ensemble.audit.AUDIT_BIAS_THRESHOLD`.

Lookahead (beyond the paper; the same chain). A black-box model often costs
much per call whatever the batch (a simulator's start-up, a Python loop over
time steps), and a step makes two calls: the gradients of the particles that
fail a test, then the values at the moved particles. Three of the tests of the
next step are known once the particles have moved: R1 (``|x' - w'|``, the
noise), the guard (this step's ball counts) and N* (a count of R2-neighbours
among the new ``w'``, one more pair pass). So where ``grad_fn`` can
(``values_and_grads``, :func:`cenlmc_jax.gradients.finite_difference`), the
values at the moved particles and the gradients of the particles that will
fail those tests ride in ONE call, with those of the particles whose linear
prediction ``f(x) + F·(x' - x)`` of ``f(x')`` comes within
:data:`LOOKAHEAD_M_F_MARGIN` of the M_f bound, and of the next step's audit
candidates. The next step uses those gradients; a particle that needs one that
was not computed (``info.lookahead_misses``) gets it in a second call. The
gradients are the same numbers at the same points, so the chain is the same
(``EnsembleOptions(lookahead=False)`` gives two calls a step, as do the
least-squares estimators by default, whose own refusals cannot be foreseen; bit
for bit where
the values are computed outside JAX, up to the last-bit rounding of two compiled
programs where they are computed in JAX). The audit's
particles are then drawn one step early, among the particles predicted to use
the ensemble, and audited if they did.

How a step is computed (pair-force backend, gradient buffers, sharding, the
audit's size, a user's gradient) is one
:class:`~cenlmc_jax.ensemble.options.EnsembleOptions`.

``r2`` = R2 >= 0, radius in ``w``-space; ``n_star`` = N*, an integer in
``[0, N-1]``; ``m_f`` = M_f >= 0 (``inf`` switches the test off); ``f_star`` =
f* = min f. ``r1 = 0`` or ``r2 = 0`` are allowed and switch the ensemble off
(every particle fails a test almost surely): the sampler is then LMC.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from cenlmc_jax._host import fetch
from cenlmc_jax._steps import bound_step
from cenlmc_jax._validation import (
    check_callable,
    check_finite_scalar,
    check_int,
    check_key,
    check_nonnegative,
    check_positive,
    is_concrete,
    point_like,
)
from cenlmc_jax.base import RunFlag, SamplingAlgorithm
from cenlmc_jax.ensemble.audit import (
    BIASED_FLAG,
    CENLMC_AUDIT_SIZE,
    Audit,
    audit_figures,
    audit_pick,
    fresh_audit,
    gradients_and_audit,
    no_audit,
)
from cenlmc_jax.ensemble.buffers import needed_grads, values_and_needed_grads
from cenlmc_jax.ensemble.enlmc import (
    UNUSED_ENSEMBLE_FLAG,
    check_ensemble_state,
    ensemble_values,
    init_ensemble,
    log_gaussian_step_density,
    valid_params,
)
from cenlmc_jax.ensemble.f_star import find_f_star, with_gradient
from cenlmc_jax.ensemble.least_squares import check_estimator, least_squares_force
from cenlmc_jax.ensemble.lmc import count_nonfinite
from cenlmc_jax.ensemble.options import EnsembleOptions, ensemble_options
from cenlmc_jax.gradients.ensemble import (
    check_grad_fn,
    grad_cost,
    gradient_fn,
    shares_values,
)
from cenlmc_jax.pairwise import PairwiseForce, ensemble_force
from cenlmc_jax.types import Array, ArrayLike, LogDensityFn, PRNGKey

__all__ = [
    "CEnLMCState",
    "Lookahead",
    "CEnLMCInfo",
    "cenlmc_init",
    "cenlmc_step",
    "cenlmc",
    "check_cenlmc_params",
]


class CEnLMCState(NamedTuple):
    """Ensemble state of CEnLMC.

    Attributes:
      position: as in :class:`EnLMCState`.
      logdensity: as in :class:`EnLMCState`.
      w: as in :class:`EnLMCState`.
      log_p: as in :class:`EnLMCState`.
      f_star: ``()`` ``f* = min f = -max logdensity_fn``, used by the M_f test when
        the step's ``f_star`` argument is None.
      f_star_estimated: ``()`` bool, True when ``f_star`` was found numerically by
        :func:`cenlmc_jax.ensemble.tuning.find_f_star` in :func:`cenlmc_init`.
      audit: :class:`Audit` (see :func:`cenlmc_step`).
      ball_count: ``(N,)`` int32, each particle's η-ball R2-neighbour count at the
        previous step (read by the guard); the int32 maximum ("unknown, do not
        guard") until a particle has a previous step.
      lookahead: :class:`Lookahead`, the gradients the last model call computed
        for this step (none without the lookahead).
    """

    position: Array
    logdensity: Array
    w: Array
    log_p: Array
    f_star: Array
    f_star_estimated: Array
    audit: Audit
    ball_count: Array
    lookahead: Lookahead


#: The lookahead's margin on the M_f test, in units of f: a particle whose
#: predicted ``f(x) + F·(x' - x)`` is above ``f* + M_f - margin`` gets its gradient
#: in the lookahead call. The prediction's error is the second-order term
#: ``(x' - x)ᵀ∇²f(x' - x)/2`` and the force's error along the move; a miss costs a
#: second call, not a different chain.
LOOKAHEAD_M_F_MARGIN = 1.0


class Lookahead(NamedTuple):
    """The gradients the previous step's model call computed for this step.

    Attributes:
      grad: ``(N, d)`` ``∇log π`` at the particles with ``have`` (zeros elsewhere).
      have: ``(N,)`` bool.
      audit: ``(N,)`` bool, the audit's candidates for this step (a subset of
        ``have``): audited where they use the ensemble force.
    """

    grad: Array
    have: Array
    audit: Array


def no_lookahead(x: Array) -> Lookahead:
    """A :class:`Lookahead` with no gradient (the start; lookahead off).

    Args:
      x: the particles, ``(N, d)``.

    Returns:
      The empty :class:`Lookahead`.
    """
    none = jnp.zeros(x.shape[:1], bool)
    return Lookahead(jnp.zeros_like(x), none, none)


def _dense_fallback_message(infos: Any, first_step: int) -> str:
    return (
        f"the block-sparse ensemble force ran the dense tiles instead from step "
        f"{first_step} (info.dense_fallback: its tile list overflowed its capacity, "
        "or the weights needed a shift per row): exact, but it costs O(N^2) pairs "
        "a step (block_sparse=False runs the dense tiles without the sparse plan)"
    )


#: The driver's warning when the block-sparse pair sums fell back to the dense tiles
#: (what :class:`~cenlmc_jax.pairwise.tiled.SparseFallbackWarning` says for a direct
#: call).
DENSE_FALLBACK_FLAG = RunFlag("dense_fallback", _dense_fallback_message)


class CEnLMCInfo(NamedTuple):
    """What one CEnLMC step did (all scalars).

    No ``unstable`` field (EnLMC's drift-deficit flag): the tests of (3.21) bound
    the weights (proof of Lemma 4.2), so EnLMC's instability (Theorem 3.2) cannot
    occur, and a low audited drift ratio here is a noisy but unbiased force, which
    ``biased`` measures (the audit's module docstring, "Instability").

    Attributes:
      grad_evals: gradients needed = particles failing at least one test of
        (3.21).
      grad_evals_padded: gradients computed: the buffers holding the
        ``grad_evals`` particles and the audited ones,
        ``ceil((grad_evals + audit_grad_evals) / capacity) · capacity`` (the
        padding overhead; ``N`` with ``dense_grad=True``).
      f_evals: evaluations of ``logdensity_fn`` (N every step: the algorithm needs
        f everywhere).
      model_solves: the step's cost in model evaluations (as
        :class:`EnLMCInfo`).
      ensemble_fraction: fraction of particles that used the ensemble force.
      mean_num_neighbours: mean over particles of ``N_i`` (3.20); 0 on a step
        where every particle failed the R1 or M_f test (the pair sums are then
        not computed: no particle could use them).
      mean_ball_neighbours: mean over particles of
        ``#{j: |x_j-x_i| ≤ η, |w_j-w_i| ≤ R2}``; 0 on such a step.
      num_fail_r1: particles with ``|x_i - w_i| > R1`` (or non-finite).
      num_fail_m_f: particles with ``f(x_i) > f* + M_f`` (or non-finite).
      num_fail_n_star: particles with ``N_i < max(N*, 1)``. The three counts
        overlap.
      num_fail_ball: particles that passed (3.21) but had fewer than
        ``min_ball_neighbours`` neighbours in their η-ball (the guard), so took the
        gradient.
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
      audit_variance_inflation: as in :class:`EnLMCInfo`: this step's estimate of
        the relative stationary variance inflation caused by the ensemble noise
        (NaN without audit).
      audit_drift_bias: as in :class:`EnLMCInfo`: this step's estimate of the
        force's systematic error along the gradient (the stationary variance is
        off by about ``-β``, relative).
      biased: the running variance-inflation estimate (``state.audit.inflation``)
        exceeds :data:`AUDIT_BIAS_THRESHOLD`, or the running drift bias's size
        (``state.audit.drift_bias``) :data:`AUDIT_DRIFT_BIAS_THRESHOLD`, after
        :data:`AUDIT_BIAS_MIN_STEPS` steps, or from
        :data:`~cenlmc_jax.ensemble.audit.AUDIT_EARLY_MIN_STEPS` steps by more
        than :data:`~cenlmc_jax.ensemble.audit.AUDIT_EARLY_Z` standard errors of
        the running mean (the early flag): the moments are biased beyond the
        audit's tolerance. Reported (``cj.sample`` warns, the CLI says
        UNRELIABLE), never a divergence: the run goes on.
      num_nonfinite: particles whose new position or log density is NaN/inf.
      diverged: ``num_nonfinite > 0`` (or a traced parameter is NaN / out of
        range).
      dense_fallback: the block-sparse pair sums ran the dense tiles instead
        (their tile list overflowed, or the weights needed a shift per row):
        exact, but ``O(N²)``. ``cj.sample`` warns once. A flag in the info, not
        a warning from inside the step, so the compiled step holds no host
        callback and the persistent compilation cache keeps it.
      lookahead_misses: with the lookahead (module docstring), the particles that
        needed a gradient the previous step's call had not computed: this step
        made a second model call for them when > 0. 0 without the lookahead.
    """

    grad_evals: Array
    grad_evals_padded: Array
    f_evals: Array
    model_solves: Array
    ensemble_fraction: Array
    mean_num_neighbours: Array
    mean_ball_neighbours: Array
    num_fail_r1: Array
    num_fail_m_f: Array
    num_fail_n_star: Array
    num_fail_ball: Array
    audit_grad_evals: Array
    audit_drift_ratio: Array
    audit_error: Array
    audit_noise_error: Array
    audit_variance_inflation: Array
    audit_drift_bias: Array
    biased: Array
    num_nonfinite: Array
    diverged: Array
    dense_fallback: Array
    lookahead_misses: Array

    # cj.sample warns once when a kept step is biased, when the ensemble went unused
    # over the kept steps, and when the block-sparse pair sums ran dense
    run_flags = (BIASED_FLAG, UNUSED_ENSEMBLE_FLAG, DENSE_FALLBACK_FLAG)


# --------------------------------------------------------------------------
# Input checks (Python, before tracing).
# --------------------------------------------------------------------------


def check_cenlmc_params(n: int | None, step_size, eta, r1, r2, n_star, m_f) -> None:
    """Checks the scalar parameters of Algorithm 3.2 for an ensemble of ``n`` particles.

    Traced values pass (their values are checked where they are concrete).

    Args:
      n: the number of particles (None: not known yet).
      step_size: h > 0.
      eta: η > 0.
      r1: R1 >= 0.
      r2: R2 >= 0.
      n_star: N*, an integer in ``[0, n-1]``.
      m_f: M_f >= 0 (``inf`` allowed).

    Raises:
      ValueError: a parameter out of range.
    """
    check_positive(step_size, "step_size")
    check_positive(eta, "eta")
    check_nonnegative(r1, "r1")
    check_nonnegative(r2, "r2")
    if is_concrete(n_star):
        why = "" if n is None else f"N* cannot exceed the N-1 = {n - 1} other particles"
        check_int(
            n_star, "n_star", minimum=0, maximum=None if n is None else n - 1, why=why
        )
    check_nonnegative(m_f, "m_f", allow_inf=True)


def _check_min_ball(min_ball_neighbours: int | None, n: int | None) -> int:
    """The guard's threshold (default 1), in ``[0, N-1]`` when N is known."""
    if min_ball_neighbours is None:
        return 1
    return check_int(
        min_ball_neighbours,
        "min_ball_neighbours",
        minimum=0,
        maximum=None if n is None else n - 1,
    )


def _check_f_star_search(f_star_tol: Any, f_star_max_steps: Any) -> None:
    if f_star_tol is not None:
        check_positive(f_star_tol, "f_star_tol")
    check_int(f_star_max_steps, "f_star_max_steps", minimum=1)


def _check_f_star(f_star: Any) -> None:
    if f_star is not None:
        check_finite_scalar(
            f_star, "f_star", "a finite scalar (min f = -max logdensity_fn) or None"
        )


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
    grad_fn: Callable | None = None,
) -> CEnLMCState:
    """Start CEnLMC from ``positions: (N, d)``, ``N >= 2``.

    Evaluates ``logdensity_fn`` at every particle and sets ``w = +inf``,
    ``log p = -inf`` (``w^{-1} = +∞`` of Algorithm 3.2): step 0 uses true
    gradients for everyone.

    Args:
      positions: the ensemble, ``(N, d)``.
      logdensity_fn: ``x: (d,) -> log π(x) + const``.
      f_star: ``f* = min f = -max logdensity_fn``, in the normalisation of
        ``logdensity_fn``; if None it is found by
        :func:`cenlmc_jax.ensemble.tuning.find_f_star` (L-BFGS from the best
        particle, stopped when ``|∇f| <= f_star_tol``) and
        ``state.f_star_estimated`` is True.
      f_star_tol: the gradient tolerance of that search (None: its default).
      f_star_max_steps: its iteration limit.
      grad_fn: the gradient of a log density without autodiff (a black box:
        :func:`cenlmc_jax.finite_difference`); the search for ``f*`` uses it.

    Returns:
      The :class:`CEnLMCState`.

    Raises:
      ValueError: bad positions or log density, or a given ``f_star`` above
        ``min_i f(x_i)``, which cannot be the minimum (often a different
        normalisation of ``logdensity_fn``).
    """
    _check_f_star(f_star)
    _check_f_star_search(f_star_tol, f_star_max_steps)
    x, logdensity, w, log_p = init_ensemble(positions, logdensity_fn)
    if f_star is None:
        # a black box (grad_fn=) has no autodiff: the search takes grad_fn's gradient
        search_fn = (
            logdensity_fn if grad_fn is None else with_gradient(logdensity_fn, grad_fn)
        )
        res = find_f_star(search_fn, x, tol=f_star_tol, max_steps=f_star_max_steps)
        fs, estimated = res.f_star, True
    else:
        if is_concrete(f_star) and is_concrete(logdensity):
            arr = np.asarray(f_star)
            f_min = float(-np.max(fetch(logdensity)))
            # a little slack for rounding in the user's value and in logdensity_fn
            if float(arr) > f_min + 1e-6 * max(1.0, abs(f_min)):
                raise ValueError(
                    "f_star must be min f = -max logdensity_fn; got "
                    f"f_star={float(arr)!r}, but a particle has f = {f_min!r} < f_star "
                    "(is logdensity_fn normalised differently?)."
                )
        fs, estimated = f_star, False
    return CEnLMCState(x, logdensity, w, log_p, *_fresh_state(x, fs, estimated))


@functools.partial(jax.jit, static_argnums=2)
def _fresh_state(x: Array, f_star: Any, estimated: bool) -> tuple:
    """The fields of a :class:`CEnLMCState` after ``log_p``, before any step: one
    compiled program (eagerly, each field is one or two)."""
    return (
        jnp.asarray(f_star, x.dtype),
        jnp.asarray(estimated),
        fresh_audit(x.dtype),
        jnp.full(x.shape[:1], jnp.iinfo(jnp.int32).max, jnp.int32),
        no_lookahead(x),
    )


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
    """One step of CEnLMC (Algorithm 3.2, eq. 3.19-3.21) for every particle.

    Pure and jittable. With ``f = -logdensity_fn`` and
    ``N_i = #{j ≠ i: |w_j - w_i| ≤ R2}`` (3.20): particle i takes the true gradient
    ``∇f(x_i)`` if ``|x_i - w_i| > R1``, ``f(x_i) > f* + M_f`` or
    ``N_i < max(N*, 1)``; otherwise::

        F_i = 1/N_i Σ_{j≠i} α_d (f_j - f_i)/|x_j - x_i|²
              1[|x_j-x_i| ≤ η, |w_j-w_i| ≤ R2] / p_j (x_j - x_i).

    Then ``w_i' = x_i - h F_i``, ``x_i' = w_i' + sqrt(2h) ξ_i`` with
    ``ξ = jax.random.normal(rng_key, (N, d))`` (the same draw as
    :func:`cenlmc_jax.lmc_step`), and ``logdensity_fn`` at the N new positions.

    Cost: N values of ``logdensity_fn``, the pair sums, and gradients only for
    the ``info.grad_evals`` particles that failed a test (computed in buffers of
    ``grad_capacity``; ``info.grad_evals_padded`` counts the padding). With the
    lookahead (module docstring; a finite-difference ``grad_fn`` by default) the
    values and the next step's gradients come from one model call, after a count
    pass over the new ``w``: the gradients counted in a step's info are those its
    calls computed, the next step's included.

    Scaling with N. The pair sums (:func:`cenlmc_jax.pairwise.ensemble_force`,
    ``method="auto"``) are block-sparse where
    :func:`~cenlmc_jax.pairwise.auto_block_sparse` says so (d <= 5 from a few
    thousand particles; d = 2 from N = 1792): a Hilbert sort, ``O(N log N)``, then
    only the tiles of particles within η in x and R2 in w, ``O(N k)`` for ``k``
    R2-neighbours a particle, and a plan of which tiles to visit that is ``O(N)``
    up to N ~ 2^20 (``O(N²/131072)`` box tests beyond). With the radii of
    ``suggest_cenlmc_params(..., num_particles=N)`` ``k`` stays bounded
    (``max_neighbours``), so a step is about ``O(N)`` (at d = 2 from 8192 to 2^20
    particles: the exponent of N and the cost of a step are in
    benchmarks/results/waste.md). Fixed radii make ``k`` grow like N
    and the step ``O(N²)``, as do the dense tiles (larger d, or
    ``block_sparse=False``). A step where every particle fails the R1 or M_f test
    (step 0; an R1 below the noise's reach) skips the pair sums and takes one
    vmapped gradient: about an LMC step.

    Args:
      rng_key: typed or legacy key.
      state: a :class:`CEnLMCState` from :func:`cenlmc_init`.
      logdensity_fn: ``x: (d,) -> log p(x) + const``.
      step_size: h > 0.
      eta: η > 0.
      r1: R1 >= 0.
      r2: R2 >= 0.
      n_star: N*, integer in ``[0, N-1]``.
      m_f: M_f >= 0 (inf: no M_f test).
      f_star: f* = min f; None uses ``state.f_star`` (set by :func:`cenlmc_init`).
      min_ball_neighbours: the guard (module docstring, "Departure from the
        paper"): a particle whose η-ball held fewer than this many
        R2-neighbours at the previous step takes its true gradient. Default 1
        (an empty ball: a force of exactly 0); 0 restores rule (3.21) exactly.
      estimator: ``"paper"`` (default, eq. 3.19) or, beyond the paper,
        ``"least_squares"`` / ``"least_squares_quadratic"``: the local fit of
        :mod:`cenlmc_jax.ensemble.least_squares` (a particle whose fit it refuses
        takes its true gradient). The audit's variance inflation does not measure
        the fit's bias; its drift bias sees the part along the gradient
        (:data:`LEAST_SQUARES_CAVEAT`; ``cj.cenlmc`` warns of it).
      options: how the step is computed
        (:class:`~cenlmc_jax.ensemble.options.EnsembleOptions`: pair-force
        backend, gradient buffers (``grad_capacity``; default one bucketed call a
        step), mesh, ``audit_size`` (default
        :data:`~cenlmc_jax.ensemble.audit.CENLMC_AUDIT_SIZE`), ``grad_fn``,
        ``grad_mode``).
      **option_fields: fields of ``options`` given as keywords; they replace those
        of ``options``.

    Returns:
      ``(new_state, info)``: a :class:`CEnLMCState` and a :class:`CEnLMCInfo`.

    Raises:
      ValueError: a bad state, key, parameter, estimator or option.
    """
    check_ensemble_state(state, CEnLMCState, "cenlmc_init")
    check_key(rng_key)
    n = state.position.shape[0]
    check_cenlmc_params(n, step_size, eta, r1, r2, n_star, m_f)
    _check_f_star(f_star)
    opts = ensemble_options(options, **option_fields)
    opts.capacity(n)
    uses_lookahead(opts, logdensity_fn, estimator)
    min_ball = _check_min_ball(min_ball_neighbours, n)
    check_estimator(estimator)
    return cenlmc_move(
        rng_key,
        state,
        logdensity_fn,
        step_size,
        eta,
        r1,
        r2,
        n_star,
        m_f,
        f_star,
        min_ball=min_ball,
        estimator=estimator,
        options=opts,
    )


def cenlmc_move(
    rng_key: PRNGKey,
    state: CEnLMCState,
    logdensity_fn: LogDensityFn,
    step_size: float,
    eta: float,
    r1: float,
    r2: float,
    n_star: int,
    m_f: float,
    f_star: float | None,
    *,
    min_ball: int,
    estimator: str,
    options: EnsembleOptions,
) -> tuple[CEnLMCState, CEnLMCInfo]:
    """The step of :func:`cenlmc_step` without its parameter checks: the kernel.

    For callers that checked the parameters once, when they were given (the sampler
    object :func:`cenlmc` checks them at build time and the ensemble's size at
    ``init``), so that tracing a step runs no Python validation.

    Args:
      rng_key, state, logdensity_fn, step_size, eta, r1, r2, n_star, m_f, f_star: as
        :func:`cenlmc_step`, already checked.
      min_ball: the guard's threshold, an int (:func:`cenlmc_step`'s
        ``min_ball_neighbours``, 1 for None).
      estimator: ``"paper"``, ``"least_squares"`` or ``"least_squares_quadratic"``.
      options: a checked :class:`~cenlmc_jax.ensemble.options.EnsembleOptions`.

    Returns:
      ``(new_state, info)``: a :class:`CEnLMCState` and a :class:`CEnLMCInfo`.
    """
    # the arguments, not the parameters
    check_ensemble_state(state, CEnLMCState, "cenlmc_init")
    check_key(rng_key)
    opts = options
    x = state.position
    n, d = x.shape
    capacity = opts.capacity(n)
    audit_size = opts.audit(n, CENLMC_AUDIT_SIZE)
    dt = x.dtype
    h = jnp.asarray(step_size, dt)
    fs = state.f_star if f_star is None else jnp.asarray(f_star, dt)
    f = -state.logdensity
    # comparisons written so that NaN/inf fail the test (w = +inf at init gives NaN/inf
    # here)
    fail_r1 = ~(jnp.linalg.norm(x - state.w, axis=-1) <= jnp.asarray(r1, dt))
    fail_mf = ~(f <= fs + jnp.asarray(m_f, dt))
    # the guard reads the previous step's η-ball count: a function of the past only, so
    # selecting on it keeps the ensemble force unbiased given the past (today's count is
    # not)
    fail_ball = state.ball_count < min_ball

    def pair_force(_):
        return ensemble_force(
            x,
            f,
            state.log_p,
            jnp.asarray(eta, dt),
            w=state.w,
            r2=jnp.asarray(r2, dt),
            return_fallback=True,  # reported in the info, not by a host callback
            **opts.force_kwargs(),
        )

    def no_pair_force(_):
        # every particle fails the R1 or the M_f test, which read no other particle:
        # none can use the ensemble, so the O(N²) pair sums are not computed (step 0,
        # an R1 below the noise's reach sqrt(2hd)); the ball counts of the last step
        # that computed them stay (a function of the past, as the guard needs)
        zero = jnp.zeros((n,), jnp.int32)
        return PairwiseForce(jnp.zeros_like(x), zero, state.ball_count), jnp.asarray(
            False
        )

    eligible = jnp.any(~(fail_r1 | fail_mf))
    pf, dense_fallback = lax.cond(eligible, pair_force, no_pair_force, None)
    # (n_r2 of a skipped step is 0: every particle fails the N* test too)
    fail_n = eligible & (pf.n_r2 < jnp.maximum(jnp.asarray(n_star, jnp.int32), 1))
    need = fail_r1 | fail_mf | fail_n | fail_ball
    ens = pf.force_sum / jnp.maximum(pf.n_r2, 1).astype(dt)[:, None]
    if estimator != "paper":
        ens, need = least_squares_force(
            x, f, eta, need, estimator, opts.method, opts.mesh, opts.interpret
        )
    grad_one = gradient_fn(
        logdensity_fn, opts.grad_fn, opts.grad_mode, given_value=True
    )
    per_grad = grad_cost(
        opts.grad_fn, d, given_value=shares_values(opts.grad_fn, logdensity_fn)
    )

    look = uses_lookahead(opts, logdensity_fn, estimator)
    la = state.lookahead

    def lookahead_gradients(_):
        # the gradients the previous step's call computed; the others (a miss) now
        if audit_size == 0:
            audited = jnp.zeros((n,), bool)
        else:
            idx = jnp.nonzero(la.audit, size=audit_size, fill_value=n)[0]
            idx = idx.astype(jnp.int32)
            ok = (idx < n) & ~need[jnp.minimum(idx, n - 1)]
            audited = la.audit & ~need
        missing = (need | audited) & ~la.have
        grad, padded = needed_grads(
            grad_one, x, missing, None, False, values=state.logdensity
        )
        grad = jnp.where(la.have[:, None], la.grad.astype(grad.dtype), grad)
        force = jnp.where(need[:, None], -grad, ens)
        if audit_size == 0:
            audit, a = no_audit(state.audit, dt)
        else:
            idx = jnp.minimum(idx, n - 1)
            audit, a = audit_figures(
                grad, idx, ok, force, ~need, state.audit, h, flag_unstable=False
            )
        return audit, a, force, padded, jnp.sum(missing, dtype=jnp.int32)

    def some_gradients(_):
        if look:
            return lookahead_gradients(None)
        return *gradients_and_audit(
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
            flag_unstable=False,
            mesh=opts.mesh,
            values=state.logdensity,
        ), jnp.zeros((), jnp.int32)

    def all_gradients(_):
        # every particle takes its gradient (step 0, an R1 below the noise's reach):
        # the step is LMC's, one vmapped gradient over x, with no compaction into
        # buffers and no audit draw (no particle used the ensemble force)
        grad = jax.vmap(grad_one)(x, state.logdensity).astype(dt)
        if audit_size == 0:
            audit, a = no_audit(state.audit, dt)
        else:
            # the audit of a step without users, from the audit's own formulas on
            # placeholders: nothing audited, inflation and drift bias 0 (the same
            # figures as gradients_and_audit's, whatever the placeholders hold)
            idx = jnp.zeros((audit_size,), jnp.int32)
            off = jnp.zeros((audit_size,), bool)
            zeros = jnp.zeros((audit_size, d), dt)
            audit, a = audit_figures(
                zeros, idx, off, zeros, off, state.audit, h, flag_unstable=False
            )
        misses = jnp.sum(need & ~la.have) if look else 0
        misses = jnp.asarray(misses, jnp.int32)
        return audit, a, -grad, jnp.asarray(n, jnp.int32), misses

    # one vmapped gradient where the buffers would hold every particle anyway (the
    # default buckets; not a user's buffer size, a mesh or the dense_grad reference)
    if capacity is None and opts.mesh is None and not opts.dense_grad:
        every = jnp.all(need) & ~jnp.any(la.have) if look else jnp.all(need)
        audit, a, force, padded, misses = lax.cond(
            every, all_gradients, some_gradients, None
        )
    else:
        audit, a, force, padded, misses = some_gradients(None)
    w_new, x_new, log_p_new = _move(rng_key, x, force, h)
    # rows without a previous step (w = +inf) have no meaningful count yet: "unknown"
    # does not guard
    unknown = eligible & ~jnp.all(jnp.isfinite(state.w), axis=-1)
    ball_count = jnp.where(unknown, jnp.iinfo(jnp.int32).max, pf.n_ball)
    if look:
        logdensity, la_new, ahead, count_fallback = _lookahead_call(
            rng_key,
            opts,
            x,
            f,
            force,
            x_new,
            w_new,
            ball_count,
            fs,
            (r1, r2, n_star, m_f, min_ball),
            audit_size,
        )
        dense_fallback = dense_fallback | count_fallback
    else:
        logdensity = ensemble_values(logdensity_fn, x_new)
        la_new, ahead = la, 0
    padded = padded + ahead
    bad = count_nonfinite(x_new, logdensity)
    num_need = jnp.sum(need, dtype=jnp.int32)
    info = CEnLMCInfo(
        grad_evals=num_need,
        grad_evals_padded=jnp.asarray(padded, jnp.int32),
        f_evals=jnp.asarray(n, jnp.int32),
        model_solves=(n + padded * per_grad).astype(x.dtype),
        ensemble_fraction=(n - num_need).astype(dt) / n,
        mean_num_neighbours=jnp.mean(pf.n_r2.astype(dt)),
        mean_ball_neighbours=jnp.where(eligible, jnp.mean(pf.n_ball.astype(dt)), 0),
        num_fail_r1=jnp.sum(fail_r1, dtype=jnp.int32),
        num_fail_m_f=jnp.sum(fail_mf, dtype=jnp.int32),
        num_fail_n_star=jnp.sum(fail_n, dtype=jnp.int32),
        num_fail_ball=jnp.sum(
            fail_ball & ~(fail_r1 | fail_mf | fail_n), dtype=jnp.int32
        ),
        **a.info_fields(),
        num_nonfinite=bad,
        diverged=(bad > 0) | ~valid_params(dt, h, eta, r1, r2, m_f),
        dense_fallback=dense_fallback,
        lookahead_misses=jnp.asarray(misses, jnp.int32),
    )
    new_state = CEnLMCState(
        x_new,
        logdensity,
        w_new,
        log_p_new,
        state.f_star,
        state.f_star_estimated,
        audit,
        ball_count,
        la_new,
    )
    return new_state, info


def uses_lookahead(
    options: EnsembleOptions, logdensity_fn: LogDensityFn, estimator: str = "paper"
) -> bool:
    """Whether a CEnLMC step takes the lookahead (module docstring).

    Args:
      options: the checked options.
      logdensity_fn: the sampler's log density.
      estimator: the ensemble estimator. By default only the paper's: a
        least-squares fit also refuses particles by its own tests, which read the
        values and cannot be foreseen, so most of its steps would make a second
        call (``lookahead=True`` takes it anyway).

    Returns:
      ``options.lookahead`` where given, else whether it applies.

    Raises:
      ValueError: ``lookahead=True`` where it does not apply.
    """
    grad_fn = options.grad_fn
    applies = (
        hasattr(grad_fn, "values_and_grads")
        and shares_values(grad_fn, logdensity_fn)
        and options.grad_capacity is None
        and options.mesh is None
        and not options.dense_grad
    )
    if options.lookahead and not applies:
        raise ValueError(
            "lookahead=True needs a grad_fn with values_and_grads of the sampler's "
            "own logdensity_fn (cj.finite_difference(logdensity_fn)), the default "
            "grad_capacity=None, no mesh and dense_grad=False; got grad_fn "
            f"{grad_fn!r}, grad_capacity={options.grad_capacity!r}, mesh "
            f"{options.mesh!r}, dense_grad={options.dense_grad!r}."
        )
    if options.lookahead is None:
        return applies and estimator == "paper"
    return options.lookahead


def _lookahead_call(
    rng_key, opts, x, f, force, x_new, w_new, ball_count, fs, params, audit_size
):
    """The values at the moved particles and the next step's known gradients.

    In one model call (module docstring, "Lookahead"). ``params`` is
    ``(r1, r2, n_star, m_f, min_ball)``.

    Returns:
      ``(logdensity (N,), Lookahead, gradients computed (), count pass fell back
      to the dense tiles ())``.
    """
    r1, r2, n_star, m_f, min_ball = params
    n, dt = x.shape[0], x.dtype
    # the next step's R1 and guard tests, as it will compute them
    fail_r1 = ~(jnp.linalg.norm(x_new - w_new, axis=-1) <= jnp.asarray(r1, dt))
    fail_ball = ball_count < min_ball
    # its N* test: the R2-neighbours among the new w (one pair pass, counts only)
    zero = jnp.zeros((n,), dt)
    tiny = jnp.finfo(dt).tiny
    counts, fallback = ensemble_force(
        w_new,
        zero,
        zero,
        jnp.maximum(jnp.asarray(r2, dt), tiny),
        return_fallback=True,
        **opts.force_kwargs(),
    )
    fail_n = counts.n_ball < jnp.maximum(jnp.asarray(n_star, jnp.int32), 1)
    known = fail_r1 | fail_ball | fail_n
    # its M_f test, predicted to first order (force = ∇f or its estimate)
    f_lin = f + jnp.sum(force * (x_new - x), axis=-1)
    risk = ~(f_lin <= fs + jnp.asarray(m_f, dt) - LOOKAHEAD_M_F_MARGIN)
    if audit_size == 0:
        candidates = jnp.zeros((n,), bool)
    else:
        # drawn among the particles predicted to use the ensemble (not the risk
        # set's filter: the M_f test decides next step, independently of the draw)
        candidates = audit_pick(jax.random.fold_in(rng_key, 1), ~known, audit_size)[2]
    ahead = known | risk | candidates
    values, grad, padded = values_and_needed_grads(opts.grad_fn, x_new, ahead)
    return values, Lookahead(grad, ahead, candidates), padded, fallback


def _move(rng_key: PRNGKey, x: Array, force: Array, h: Array):
    """:func:`~cenlmc_jax.ensemble.enlmc.ensemble_move` with the noise drawn once.

    The same ``ξ = jax.random.normal(rng_key, (N, d))`` as ``lmc_step``, then
    ``w' = x - h F``, ``x' = w' + sqrt(2h) ξ`` and ``log p'`` from ξ. ξ has two
    consumers (``x'`` and ``log p'``), and XLA on CPU fused its threefry draw into
    both, computing it twice: the draw is most of a step when the gradient is cheap
    (a d = 10 Gaussian: the step took 1.2x LMC's time at ensemble fraction 0, 0.8x
    with the draw kept once; benchmarks/results/waste.md, item (d)). The
    ``optimization_barrier`` keeps ξ one array; the numbers are the same ops (a
    last-bit difference in ``x'`` where XLA contracted ``w' + sqrt(2h) ξ``
    differently).
    """
    noise = lax.optimization_barrier(jax.random.normal(rng_key, x.shape, dtype=x.dtype))
    w_new = x - h * force
    return w_new, w_new + jnp.sqrt(2.0 * h) * noise, log_gaussian_step_density(noise, h)


# --------------------------------------------------------------------------
# Sampler objects.
# --------------------------------------------------------------------------


#: What ``cj.cenlmc(..., estimator="least_squares" | "least_squares_quadratic")`` warns
#: of (beyond the paper).
LEAST_SQUARES_CAVEAT = (
    "the least-squares ensemble gradient is beyond the paper, and its error is a "
    "systematic O(eta^2) bias (none on a quadratic with the quadratic term) that the "
    "audit's variance inflation does not see: measured on N(0, I_3) "
    "(benchmarks/results/frontier.md), variance errors of 0.4%, 7% and 17% at eta = 1, "
    "2, 3 x the suggested one, with an audited inflation below 0.1% on every row. The "
    "audit's drift bias (info.audit_drift_bias, benchmarks/results/drift_bias.md) "
    "measures the part along the gradient and sets info.biased above 6%; an error "
    "across the gradient is not seen. Check the moments against cj.lmc on your problem."
)


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

    Args:
      logdensity_fn: ``x: (d,) -> log π(x) + const``.
      step_size: h > 0.
      eta: η > 0.
      r1: R1 >= 0.
      r2: R2 >= 0.
      n_star: N*, an integer in ``[0, N-1]``.
      m_f: M_f >= 0 (inf: no M_f test).
      f_star: f* = min f, or None (found at ``init``).
      f_star_tol: as for :func:`cenlmc_init`.
      f_star_max_steps: as for :func:`cenlmc_init`.
      min_ball_neighbours: as for :func:`cenlmc_step`.
      estimator: as for :func:`cenlmc_step` (a least-squares estimator warns
        :data:`LEAST_SQUARES_CAVEAT`).
      options: :class:`~cenlmc_jax.ensemble.options.EnsembleOptions`.
      **option_fields: its fields as keywords.

    Returns:
      A :class:`~cenlmc_jax.base.SamplingAlgorithm` ``(init, step)``.

    Raises:
      ValueError: a bad argument, checked here (and the ensemble's size at
        ``init``).
    """
    check_callable(logdensity_fn, "logdensity_fn", "x -> scalar log density")
    check_cenlmc_params(None, step_size, eta, r1, r2, n_star, m_f)
    _check_f_star(f_star)
    _check_f_star_search(f_star_tol, f_star_max_steps)
    _check_min_ball(min_ball_neighbours, None)
    check_estimator(estimator)
    if estimator != "paper":
        warnings.warn(LEAST_SQUARES_CAVEAT, UserWarning, stacklevel=2)
    opts = ensemble_options(options, **option_fields)
    uses_lookahead(opts, logdensity_fn, estimator)

    def init(positions, rng_key=None):
        if rng_key is not None:
            # unused (a deterministic start), but a wrong one is a mistake to report
            check_key(rng_key)
        state = cenlmc_init(
            positions,
            logdensity_fn,
            f_star,
            f_star_tol=f_star_tol,
            f_star_max_steps=f_star_max_steps,
            grad_fn=opts.grad_fn,
        )
        n = state.position.shape[0]
        check_cenlmc_params(n, step_size, eta, r1, r2, n_star, m_f)
        _check_min_ball(min_ball_neighbours, n)
        opts.capacity(n)
        check_grad_fn(opts.grad_fn, point_like(state.position), "grad_fn")
        return state

    # one function per distinct parameters: a rebuilt sampler reuses cj.sample's
    # compiled run
    # the kernel without checks: they ran above and at init, not at every trace
    step = bound_step(
        cenlmc_move,
        logdensity_fn=logdensity_fn,
        step_size=step_size,
        eta=eta,
        r1=r1,
        r2=r2,
        n_star=n_star,
        m_f=m_f,
        f_star=None,
        min_ball=_check_min_ball(min_ball_neighbours, None),
        estimator=estimator,
        options=opts,
    )

    return SamplingAlgorithm(init, step)
