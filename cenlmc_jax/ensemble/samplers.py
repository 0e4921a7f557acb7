"""Ensemble Langevin Monte Carlo: EnLMC and constrained EnLMC (spec sections 2-4).

Ding & Li, *Constrained Ensemble Langevin Monte Carlo*. Both samplers run
Langevin Monte Carlo on an ensemble ``x_1..x_N`` but replace the gradient
``∇f(x_i)`` (``f = -logdensity_fn``) by an estimate built from the values
``f(x_j)`` of the other particles, so that a step costs N evaluations of
``f`` and (ideally) few gradients.

Ensemble gradient estimate (spec section 2). Conditioned on the past, particle
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

EnLMC (Algorithm 3.1, spec section 3):

    F_i = 1/(N-1) Σ_{j≠i} F_ij,   w_i' = x_i - h F_i,   x_i' = w_i' + sqrt(2h) ξ_i.

Theorem 3.2: for ``d = 1, f = x²/2`` the ``1/p_j`` weight has infinite
variance and ``E|x_i^m|² = ∞`` for ``m > 1``. :func:`enlmc_step` is faithful,
instability included: it reports non-finite particles (``info.diverged``,
``info.num_nonfinite``) and the largest force (``info.max_force_norm``).

CEnLMC (Algorithm 3.2, eq. 3.19-3.21, spec section 4): with
``N_i = #{j ≠ i : |w_j - w_i| ≤ R2}`` (3.20),

    F_i = ∇f(x_i)                      if |x_i - w_i| > R1  or  f(x_i) > f* + M_f  or  N_i < N*,
    F_i = 1/N_i Σ_{j≠i} F_ij 1[|w_j - w_i| ≤ R2]   otherwise          (3.19, 3.21)

then the same ``w``, ``x`` update. Only the particles that fail a test get a
gradient, and only those gradients are computed (see :func:`_needed_grads`):
they are gathered into buffers of ``grad_capacity`` particles and a bounded
``lax.scan`` of ``lax.cond``s runs one vmapped gradient per buffer, so a step costs
``ceil(count / grad_capacity)·grad_capacity`` gradients, not ``N``.

Initialisation: nothing is known about how ``x^0`` was drawn, so
``w = +inf`` and ``log p = -inf`` (spec: ``w^{-1} = +∞``). For CEnLMC the R1
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

Gradient audit (not in the paper; ``audit_size``: 32 particles per step for
EnLMC, :data:`CENLMC_AUDIT_SIZE` = 8 for CEnLMC). Each step draws
``audit_size`` particles among those that used the ensemble force, evaluates
their true gradients and reports the median drift ratio
``F_i·∇f(x_i)/|∇f(x_i)|²`` (1 for an exact gradient), the median relative
error ``|F_i - ∇f(x_i)|/|∇f(x_i)|``, the median drift error of one step in
noise lengths ``h|F_i - ∇f(x_i)|/sqrt(2hd)`` and the variance inflation
below. It costs ``audit_size`` gradients per step (``info.audit_grad_evals``),
computed in the step's one gradient call with the particles that need theirs
(counted in ``grad_evals_padded`` and ``model_solves``, not in ``grad_evals``):
for CEnLMC at N = 2,000, 8 gradients a step are 0.4% of LMC's N and 0.5-1% of
CEnLMC's own.

*Instability (EnLMC).* EnLMC's instability (Theorem 3.2) shows first as a
drift deficit: its heavy-tailed weights make the typical force far below
``∇f`` (a median ratio near 0.5 from the first steps in d = 1), so particles
drift outwards and the second moment grows, long before any kick explodes.
The state keeps an exponential moving average of the median ratio
(:data:`AUDIT_EMA_WEIGHT`); when it falls below :data:`AUDIT_UNSTABLE_RATIO`
after :data:`AUDIT_MIN_STEPS` audited steps, ``info.unstable`` (and so
``info.diverged``) is set. CEnLMC never sets it: its tests bound the weights
(``1/p_j <= (4πh)^{d/2} exp((η+R1+R2)²/(4h))``, proof of Lemma 4.2), so its
force has a finite variance, and a median ratio far below 1 there means a
noisy but unbiased force (measured: 0.4-0.6 on the 3-D Darcy problem, where
the chain is stationary with an inflated variance), which the bias flag
measures.

*Bias (CEnLMC and EnLMC).* With an unbiased force ``∇f + e`` (``E[e | x] = 0``,
exact for a quadratic f, see above) the chain is LMC with extra noise ``h e``,
and its stationary covariance solves ``Σ = AΣAᵀ + 2hI + h² C_e``
(``A = I - h∇²f``): each variance is inflated by the relative amount
``h C_e,kk / 2`` whatever the curvature (to first order in h). Averaged over
coordinates, that is the ensemble mean of ``h|e_i|²/(2d)``, the squared drift
error in noise lengths (zero for particles that took their gradient):

    v = (fraction using the ensemble) × E[h|F_i - ∇f(x_i)|² / (2d) | i used it],

and the sd is biased by about ``v/2`` (on top of unadjusted Langevin's own
``h/4`` at unit curvature). ``|e|²`` is heavy-tailed (rare neighbours with a
huge ``1/p_j``), so the mean over 8 audited particles is a poor estimate of
its mean (on the Darcy problem with the former N* = 5, a 50-step average of
it sat at 0.57x the true value in the median and ranged 0.16-39x), and the
median drift error does not see the tail at all (0.033-0.05 both on healthy
2-D runs and on one whose sd is 16% too large). The audit therefore uses
``|F_i|²`` as a control variate: it is known at every particle without a
gradient, and ``|e|² = |F|² - |∇f|² - 2 e·∇f``, so

    info.audit_variance_inflation = (1/N) Σ_{i used} h|F_i|²/(2d)
                                    + fraction × mean_audited h(|e_i|² - |F_i|²)/(2d)

is unbiased for the step's ``v`` (the audited particles are a uniform sample
of the users) and the audit only samples the light-tailed ``-|∇f|² - 2e·∇f``
(same Darcy runs: 0.88x in the median, 0.58-3.1x). A systematic error (a
force too weak, e.g. an empty ball with ``min_ball_neighbours=0``) enters
through the audited ``e`` as well. The state keeps a running mean of it
(``state.audit.inflation``: the plain mean over the first 200 steps, then an
EMA of weight :data:`AUDIT_BIAS_WEIGHT`), and ``info.biased`` is set when it
exceeds :data:`AUDIT_BIAS_THRESHOLD` = 0.06 after
:data:`AUDIT_BIAS_MIN_STEPS` = 200 steps.

The number, from measurements (``v`` computed with every particle's true
gradient over the second half of each run, and in brackets the relative
variance error it predicts, measured against the exact or quadrature value):
healthy runs, the README quickstart 0.005 (0.005), the command line's default
run 0.009 (0.003-0.02), SIR with the suggested parameters at N = 500 / 2,000
0.019 / 0.009 (-0.01-0.03), this module's 2-D test configurations (N = 1,000,
N* = 5) 0.015-0.018 (standard) and 0.037-0.046 (anisotropic: 0.02-0.06 by
coordinate), the Darcy problem with the suggestion's noise budget 0.019-0.022
(0.02-0.027); and the runs to flag, the Darcy problem with the former N* = 5
in the benchmark's runs 0.068 at N = 2,000 and 0.069 at N = 4,000 (sd 5-9%
and 5-35% off), the 2-D Gaussian with R1 passing 95% 0.066 (0.065-0.067) and
with η, R2 × 1.5 as well 0.14 (0.13-0.19). 0.06 lies between the largest
healthy value (0.046) and the flagged Darcy runs (0.068), and means an sd
biased by ~3%: with unadjusted Langevin's own 1.3% at h = 0.05, inside the 5%
tolerance of ``benchmarks/bench_inverse.py`` (a Darcy run at ``v = 0.053``,
sd 4% off, is not flagged). Simulating the 8-particle audit 60 times on each
recorded run: the running estimate never crossed 0.06 after step 200 on the
healthy runs and always did on the others. ``benchmarks/bench_fraction.py``
lists the estimate beside the measured variance error as R1's pass
probability grows.

``biased`` is not a divergence: the run goes on, ``cj.sample`` warns once and
the command-line job reports UNRELIABLE (exit 1). The remedies are smaller
``η, R1, R2``, a larger N* or more particles (the suggestion's noise budget,
:func:`cenlmc_jax.tuning.suggest_cenlmc_params`; :func:`cenlmc_jax.tune_cenlmc`
caps the measured inflation), or LMC. No automatic fall-back to gradients:
the flag is about the whole ensemble (an average over steps), not about
particles, and switching the ensemble off mid-run would leave the draws
before the switch biased while making the cost LMC's.

Parameters (names of the paper): ``step_size`` = h > 0; ``eta`` = η > 0, the
ball radius; ``r1`` = R1 >= 0, bound on ``|x_i - w_i| = sqrt(2h)|ξ_i|``;
``r2`` = R2 >= 0, radius in ``w``-space; ``n_star`` = N*, an integer in
``[0, N-1]``; ``m_f`` = M_f >= 0 (``inf`` switches the test off); ``f_star`` =
f* = min f. ``r1 = 0`` or ``r2 = 0`` are allowed and switch the ensemble off
(every particle fails a test almost surely): the sampler is then LMC.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from cenlmc_jax._validation import (
    check_bool,
    check_callable,
    check_choice,
    check_finite_scalar,
    check_int,
    check_key,
    check_logdensity,
    check_nonnegative,
    check_positions,
    check_positive,
    check_state,
    is_concrete,
)
from cenlmc_jax.base import SamplingAlgorithm
from cenlmc_jax.langevin import count_nonfinite, grad_cost, gradient_fn, lmc_init, lmc_step
from cenlmc_jax.pairwise import METHODS, STRATEGIES, ensemble_force
from cenlmc_jax.tuning import find_f_star
from cenlmc_jax.types import Array, ArrayLike, LogDensityFn, PRNGKey

__all__ = [
    "EnLMCState",
    "EnLMCInfo",
    "enlmc_init",
    "enlmc_step",
    "CEnLMCState",
    "CEnLMCInfo",
    "cenlmc_init",
    "cenlmc_step",
    "coupling_distance",
    "enlmc",
    "cenlmc",
    "Audit",
    "fresh_audit",
]


# --------------------------------------------------------------------------
# States and infos.
# --------------------------------------------------------------------------


class Audit(NamedTuple):
    """Running state of the gradient audit (spec: not in the paper; module docstring, "Gradient audit").

    drift_ratio: () exponential moving average (weight :data:`AUDIT_EMA_WEIGHT`
       per audited step) of the median drift ratio ``F_i·∇f_i / |∇f_i|²``; starts at 1.
    steps: () int32, steps that audited at least one particle.
    inflation: () running mean of the per-step variance-inflation estimate
       ``info.audit_variance_inflation``: the plain mean over the first
       ``1/AUDIT_BIAS_WEIGHT`` steps the audit ran, then an exponential moving
       average of weight :data:`AUDIT_BIAS_WEIGHT`; starts at 0.
    bias_steps: () int32, steps the audit ran (a step with no ensemble user counts: its inflation is 0).
    """

    drift_ratio: Array
    steps: Array
    inflation: Array
    bias_steps: Array


#: Weight of each audited step in the running drift ratio (about 10 steps of memory).
AUDIT_EMA_WEIGHT = 0.2
#: The ensemble is flagged unstable when the running drift ratio falls below this ...
AUDIT_UNSTABLE_RATIO = 0.6
#: ... after at least this many audited steps.
AUDIT_MIN_STEPS = 5
#: Particles audited per CEnLMC step by default (module docstring, "Gradient audit": cost and noise).
CENLMC_AUDIT_SIZE = 8
#: Weight of each step in the running variance-inflation estimate (a plain mean over the first 200
#: steps, then about 200 steps of memory).
AUDIT_BIAS_WEIGHT = 0.005
#: ``info.biased`` is set when the running variance-inflation estimate exceeds this (the sd biased
#: by about 3%; module docstring, "Gradient audit", for the measurements behind the number) ...
AUDIT_BIAS_THRESHOLD = 0.06
#: ... after at least this many steps of audit (the plain-mean window: 1,600 audited particles at 8 a step).
AUDIT_BIAS_MIN_STEPS = 200


class EnLMCState(NamedTuple):
    """Ensemble state of EnLMC.

    position: (N, d) particles ``x^m``.
    logdensity: (N,) ``logdensity_fn(x^m) = -f(x^m) + const``.
    w: (N, d) deterministic part of the last update ``x^{m-1} - h F^{m-1}``
       (``+inf`` at initialisation).
    log_p: (N,) ``log p_j = -(d/2) log(4πh) - |x_j - w_j|²/(4h)``, the density
       of ``x_j`` given the past (``-inf`` at initialisation).
    audit: :class:`Audit`, the running gradient-audit statistic (see :func:`enlmc_step`).
    """

    position: Array
    logdensity: Array
    w: Array
    log_p: Array
    audit: "Audit"


class EnLMCInfo(NamedTuple):
    """What one EnLMC step did (all scalars).

    grad_evals: gradients evaluated = particles without a previous step (N at step 0, then 0).
    grad_evals_padded: gradients computed including buffer padding and the audited particles.
    f_evals: evaluations of ``logdensity_fn`` (N: at the new positions).
    model_solves: the step's cost in model evaluations: ``f_evals`` plus every
       gradient computed (padding and audit included) at ``grad_fn.model_solves(d)``
       solves each (1 for autodiff; ``cj.gradients.finite_difference``: 2d or d).
    max_force_norm: ``max_i |F_i|`` over particles using the ensemble force.
    num_exploded: particles kicked by ``h|F_i| > blowup_factor · sqrt(2hd)``, more
       than ``blowup_factor`` noise lengths (the heavy tail of Theorem 3.2).
    num_isolated: particles using the ensemble force with no neighbour in their
       η-ball: their force is exactly 0 (no restoring drift; not counted as divergence).
    audit_grad_evals: particles audited (``audit_size``, or fewer when fewer used the ensemble
       force); their gradients are computed in the step's one gradient call, counted in
       ``grad_evals_padded`` and ``model_solves``, not in ``grad_evals``.
    audit_drift_ratio: median over the audited particles of ``F_i·∇f(x_i) / |∇f(x_i)|²``
       (1 for an exact gradient; NaN when nothing was audited).
    audit_error: median over the audited particles of ``|F_i - ∇f(x_i)| / |∇f(x_i)|``.
    audit_noise_error: median over the audited particles of the step's drift error
       ``h|F_i - ∇f(x_i)|`` in units of the Langevin noise length ``sqrt(2hd)``.
    audit_variance_inflation: this step's estimate of ``v = (fraction of particles using the
       ensemble force) × E[h|F_i - ∇f(x_i)|² / (2d)]``, the relative stationary variance inflation
       the ensemble noise causes (module docstring: |F|² as a control variate; NaN without audit).
    unstable: the running drift ratio (``state.audit``) fell below
       :data:`AUDIT_UNSTABLE_RATIO` after :data:`AUDIT_MIN_STEPS` audited steps.
    biased: the running variance-inflation estimate (``state.audit.inflation``) exceeds
       :data:`AUDIT_BIAS_THRESHOLD` after :data:`AUDIT_BIAS_MIN_STEPS` steps (not a divergence).
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
    unstable: Array
    biased: Array
    num_nonfinite: Array
    diverged: Array


class CEnLMCState(NamedTuple):
    """Ensemble state of CEnLMC.

    position, logdensity, w, log_p: as in :class:`EnLMCState`.
    f_star: () ``f* = min f = -max logdensity_fn``, used by the M_f test when the
       step's ``f_star`` argument is None.
    f_star_estimated: () bool, True when ``f_star`` was found numerically by
       :func:`cenlmc_jax.tuning.find_f_star` in :func:`cenlmc_init`.
    audit: :class:`Audit` (see :func:`cenlmc_step`).
    ball_count: (N,) int32, each particle's η-ball R2-neighbour count at the
       previous step (read by the guard); the int32 maximum ("unknown, do not
       guard") until a particle has a previous step.
    """

    position: Array
    logdensity: Array
    w: Array
    log_p: Array
    f_star: Array
    f_star_estimated: Array
    audit: "Audit"
    ball_count: Array


class CEnLMCInfo(NamedTuple):
    """What one CEnLMC step did (all scalars).

    grad_evals: gradients needed = particles failing at least one test of (3.21).
    grad_evals_padded: gradients computed: the buffers holding the ``grad_evals`` particles and
       the audited ones, ``ceil((grad_evals + audit_grad_evals) / capacity) · capacity`` (the
       padding overhead; ``N`` with ``dense_grad=True``).
    f_evals: evaluations of ``logdensity_fn`` (N every step: the algorithm needs f everywhere).
    model_solves: the step's cost in model evaluations (as :class:`EnLMCInfo`).
    ensemble_fraction: fraction of particles that used the ensemble force.
    mean_num_neighbours: mean over particles of ``N_i`` (3.20).
    mean_ball_neighbours: mean over particles of ``#{j: |x_j-x_i| ≤ η, |w_j-w_i| ≤ R2}``.
    num_fail_r1: particles with ``|x_i - w_i| > R1`` (or non-finite).
    num_fail_m_f: particles with ``f(x_i) > f* + M_f`` (or non-finite).
    num_fail_n_star: particles with ``N_i < max(N*, 1)``. The three counts overlap.
    num_fail_ball: particles that passed (3.21) but had fewer than
       ``min_ball_neighbours`` neighbours in their η-ball (the guard), so took the gradient.
    audit_grad_evals: particles audited (``audit_size``, or fewer when fewer used the ensemble
       force); their gradients are computed in the step's one gradient call, counted in
       ``grad_evals_padded`` and ``model_solves``, not in ``grad_evals``.
    audit_drift_ratio: median over the audited particles of ``F_i·∇f(x_i) / |∇f(x_i)|²``
       (1 for an exact gradient; NaN when nothing was audited).
    audit_error: median over the audited particles of ``|F_i - ∇f(x_i)| / |∇f(x_i)|``.
    audit_noise_error: median over the audited particles of the step's drift error
       ``h|F_i - ∇f(x_i)|`` in units of the Langevin noise length ``sqrt(2hd)``.
    audit_variance_inflation: as in :class:`EnLMCInfo`: this step's estimate of the relative
       stationary variance inflation caused by the ensemble noise (NaN without audit).
    unstable: always False for CEnLMC (kept for one info shape with EnLMC): its weights are
       bounded by the tests, so EnLMC's instability cannot occur; a heavy-tailed
       ensemble force shows as ``biased`` (module docstring, "Gradient audit").
    biased: the running variance-inflation estimate (``state.audit.inflation``) exceeds
       :data:`AUDIT_BIAS_THRESHOLD` after :data:`AUDIT_BIAS_MIN_STEPS` steps: the moments are
       biased beyond the audit's tolerance. Reported (``cj.sample`` warns, the CLI says
       UNRELIABLE), never a divergence: the run goes on.
    num_nonfinite: particles whose new position or log density is NaN/inf.
    diverged: ``num_nonfinite > 0`` (or a traced parameter is NaN / out of range).
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
    unstable: Array
    biased: Array
    num_nonfinite: Array
    diverged: Array


# --------------------------------------------------------------------------
# Input checks (Python, before tracing).
# --------------------------------------------------------------------------


def _check_cenlmc_params(n: Optional[int], step_size, eta, r1, r2, n_star, m_f) -> None:
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


def _capacity(grad_capacity: Optional[int], n: int) -> Optional[int]:
    """Gradient buffer size, or None: one call per step sized by :data:`GRAD_BUCKETS`."""
    if grad_capacity is None:
        return None
    return check_int(grad_capacity, "grad_capacity", minimum=1, maximum=n, why=f"N = {n}")


def _check_switches(dense_grad: bool, method: str, block_size: Optional[int], strategy: str) -> None:
    """``dense_grad`` and the options passed through to :func:`cenlmc_jax.pairwise.ensemble_force`."""
    check_bool(dense_grad, "dense_grad")
    check_choice(method, "method", METHODS)
    check_choice(strategy, "strategy", STRATEGIES)
    if block_size is not None:
        check_int(block_size, "block_size", minimum=1)


def _check_enlmc_params(step_size, eta, blowup_factor, dense_grad, method, block_size, strategy) -> None:
    check_positive(step_size, "step_size")
    check_positive(eta, "eta")
    check_positive(blowup_factor, "blowup_factor", allow_inf=True)
    _check_switches(dense_grad, method, block_size, strategy)


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


#: With ``grad_capacity=None`` one gradient call per step is sized to the next of
#: these fractions of N above the number of particles that need a gradient.
GRAD_BUCKETS = 8


def _needed_grads(grad_one: Callable, x: Array, need: Array, capacity: Optional[int], dense: bool):
    """Gradient (``grad_one: (d,) -> (d,)``) at the particles with ``need``; zeros elsewhere.

    Returns ``(grad (N, d), num_computed ())``. The flagged indices are
    compacted to the front (``jnp.nonzero(size=N)``); only those particles are
    differentiated, in one of two batchings:

    * ``capacity=None`` (default): ONE vmapped call per step on the first
      ``B`` compacted particles, ``B`` the smallest of ``ceil(N·k/8)``, k = 1..8,
      that holds them all (``lax.switch`` over the 8 sizes, plus a branch for
      none): at most N/8 padding, and one call, which is what a black-box model
      with a fixed cost per call needs.
    * ``capacity=C``: buffers of C particles, a bounded ``lax.scan`` of
      ``lax.cond``s running ``ceil(count / C)`` calls (padding < C).

    Both are reverse-differentiable (no ``while_loop``); under ``vmap`` the
    switch / cond become selects and every size is computed. Padding slots
    point to index N: they read some real particle and their result is
    dropped. ``dense=True`` is the debugging reference: every gradient, then a mask.
    """
    n, _ = x.shape
    grad_fn = jax.vmap(grad_one)
    if dense:
        return jnp.where(need[:, None], grad_fn(x), 0.0), jnp.asarray(n, jnp.int32)
    idx = jnp.nonzero(need, size=n, fill_value=n)[0].astype(jnp.int32)
    count = jnp.sum(need, dtype=jnp.int32)

    def gradients_at(g, ids):
        xs = x[jnp.minimum(ids, n - 1)]
        return g.at[ids].set(grad_fn(xs).astype(g.dtype), mode="drop")

    zeros = jnp.zeros_like(x)
    if capacity is None:
        sizes = sorted({-(-n * k // GRAD_BUCKETS) for k in range(1, GRAD_BUCKETS + 1)})
        branches = [lambda g: g] + [functools.partial(lambda b, g: gradients_at(g, idx[:b]), b) for b in sizes]
        which = jnp.searchsorted(jnp.asarray([0] + sizes, jnp.int32), count, side="left").astype(jnp.int32)
        return lax.switch(which, branches, zeros), jnp.asarray([0] + sizes, jnp.int32)[which]
    num_buffers_max = -(-n // capacity)
    idx = jnp.concatenate([idx, jnp.full((num_buffers_max * capacity - n,), n, jnp.int32)])
    num_buffers = (count + capacity - 1) // capacity

    def buffer(g, b):
        ids = lax.dynamic_slice(idx, (b * capacity,), (capacity,))
        return lax.cond(b < num_buffers, lambda g: gradients_at(g, ids), lambda g: g, g), None

    grad, _ = lax.scan(buffer, zeros, jnp.arange(num_buffers_max, dtype=jnp.int32))
    return grad, num_buffers * capacity


class _AuditInfo(NamedTuple):
    """The audit's info fields of one step (see :class:`CEnLMCInfo`)."""

    grad_evals: Array
    drift_ratio: Array
    error: Array
    noise_error: Array
    variance_inflation: Array
    unstable: Array
    biased: Array

    def info_fields(self) -> dict:
        """These figures under their names in :class:`EnLMCInfo` / :class:`CEnLMCInfo`."""
        return dict(audit_grad_evals=self.grad_evals, audit_drift_ratio=self.drift_ratio, audit_error=self.error,
                    audit_noise_error=self.noise_error, audit_variance_inflation=self.variance_inflation,
                    unstable=self.unstable, biased=self.biased)


def _audit_pick(rng_key: PRNGKey, used: Array, size: int) -> tuple[Array, Array, Array]:
    """The audit's particles: ``size`` indices drawn without replacement (Gumbel top-k) among those with
    ``used``, and which of them are real (with fewer such particles, fewer are audited). Returns
    ``(idx (size,), ok (size,), mask (N,))``, the mask to add them to the step's gradient call."""
    score = jnp.where(used, jax.random.gumbel(jax.random.fold_in(rng_key, 0x5EED), used.shape), -jnp.inf)
    top, idx = lax.top_k(score, size)
    ok = jnp.isfinite(top)
    mask = jnp.zeros(used.shape, bool).at[idx].set(ok, mode="drop")
    return idx, ok, mask


def _audit(grad: Array, idx: Array, ok: Array, force: Array, used: Array, running: Audit, h: Array,
           flag_unstable: bool) -> tuple[Audit, _AuditInfo]:
    """The gradient audit's figures at the picked particles (:func:`_audit_pick`), whose true gradients
    ``grad: (N, d)`` (of the log density) the step's gradient call computed with the others.

    Returns ``(new running Audit, _AuditInfo)``. ``flag_unstable``: whether
    the running drift ratio may set ``unstable`` (EnLMC only).
    """
    dt = force.dtype
    d = force.shape[-1]
    grad_f = -grad[idx]  # ∇f = -∇ log density
    err = force[idx] - grad_f
    norm2 = jnp.maximum(jnp.sum(grad_f**2, axis=-1), jnp.finfo(dt).tiny)
    ratio = jnp.nanmedian(jnp.where(ok, jnp.sum(force[idx] * grad_f, axis=-1) / norm2, jnp.nan))
    err2 = jnp.sum(err**2, axis=-1)
    error = jnp.nanmedian(jnp.where(ok, jnp.sqrt(err2 / norm2), jnp.nan))
    # the drift error of one step, h|F - ∇f|, in units of the noise length sqrt(2hd)
    to_noise = h / (2.0 * d)
    noise2 = to_noise * err2
    noise_error = jnp.nanmedian(jnp.where(ok, jnp.sqrt(noise2), jnp.nan))
    audited = jnp.any(ok)
    num_ok = jnp.sum(ok, dtype=jnp.int32)
    # the step's variance inflation: the users' mean of h|e|²/(2d) times their fraction, estimated with
    # |F|² as a control variate (module docstring): known at every user, it brings in the whole ensemble's
    # heavy tail; the audit only samples |e|² - |F|² = -|∇f|² - 2 e·∇f
    force2 = to_noise * jnp.sum(force**2, axis=-1)
    used_fraction = jnp.mean(used.astype(dt))
    audited_gap = jnp.sum(jnp.where(ok, noise2 - force2[idx], 0.0)) / jnp.maximum(num_ok, 1).astype(dt)
    inflation = jnp.sum(jnp.where(used, force2, 0.0)) / used.shape[0] + used_fraction * audited_gap
    ema = jnp.where(audited, (1 - AUDIT_EMA_WEIGHT) * running.drift_ratio + AUDIT_EMA_WEIGHT * ratio,
                    running.drift_ratio)
    steps = running.steps + audited.astype(jnp.int32)
    unstable = (steps >= AUDIT_MIN_STEPS) & ~(ema >= AUDIT_UNSTABLE_RATIO) if flag_unstable else jnp.zeros((), bool)
    bias_steps = running.bias_steps + 1
    weight = jnp.maximum(1.0 / bias_steps.astype(dt), AUDIT_BIAS_WEIGHT)  # a plain mean, then an EMA
    running_inflation = running.inflation + weight * (inflation - running.inflation)
    # NaN compares False: a non-finite estimate is flagged too (the run's own checks catch non-finite particles)
    biased = (bias_steps >= AUDIT_BIAS_MIN_STEPS) & ~(running_inflation <= AUDIT_BIAS_THRESHOLD)
    info = _AuditInfo(num_ok, ratio, error, noise_error, inflation, unstable, biased)
    return Audit(ema, steps, running_inflation, bias_steps), info


def _gradients_and_audit(rng_key, grad_one, x, need, ens, capacity, dense, audit_size, running, h, flag_unstable):
    """The step's one gradient call, for the particles that ``need`` it and the audit's, and the force.

    Returns ``(running Audit, _AuditInfo, force (N, d), gradients computed ())``: the force is
    ``∇f`` where ``need`` and the ensemble estimate ``ens`` elsewhere (audited particles keep it).
    The audited particles ride in the same call (one call per step for a black-box model).
    """
    if audit_size == 0:
        grad, padded = _needed_grads(grad_one, x, need, capacity, dense)
        return (*_no_audit(running, x.dtype), jnp.where(need[:, None], -grad, ens), padded)
    idx, ok, audited = _audit_pick(rng_key, ~need, audit_size)
    grad, padded = _needed_grads(grad_one, x, need | audited, capacity, dense)
    force = jnp.where(need[:, None], -grad, ens)
    audit, info = _audit(grad, idx, ok, force, ~need, running, h, flag_unstable)
    return audit, info, force, padded


def _no_audit(running: Audit, dtype) -> tuple[Audit, _AuditInfo]:
    """``audit_size=0``: the running state unchanged, NaN figures, no flag."""
    nan, false = jnp.asarray(jnp.nan, dtype), jnp.zeros((), bool)
    return running, _AuditInfo(jnp.zeros((), jnp.int32), nan, nan, nan, nan, false, false)


def _values(logdensity_fn: LogDensityFn, x: Array) -> Array:
    """``logdensity_fn`` at every particle, (N,) in x's dtype (a Python float return is fine too)."""
    return jax.vmap(lambda y: jnp.asarray(logdensity_fn(y), y.dtype))(x)


def fresh_audit(dtype) -> Audit:
    """The audit's running state before any step: drift ratio 1, inflation 0, no steps."""
    return Audit(jnp.ones((), dtype), jnp.zeros((), jnp.int32), jnp.zeros((), dtype), jnp.zeros((), jnp.int32))


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
    grad_capacity: Optional[int] = None,
    blowup_factor: float = 10.0,
    dense_grad: bool = False,
    method: str = "auto",
    block_size: Optional[int] = None,
    precision: Any = None,
    mesh: Any = None,
    strategy: str = "allgather",
    block_sparse: Optional[bool] = None,
    audit_size: int = 32,
    grad_fn: Optional[Callable] = None,
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
      grad_capacity: gradient buffer size (default ``ceil(N/16)``); only used at step 0.
      blowup_factor: kick size, in noise lengths ``sqrt(2hd)``, counted as a blow-up (> 0).
      dense_grad: debugging switch: compute all N gradients and mask.
      method, block_size, precision, block_sparse: passed to ``pairwise.ensemble_force``
        (``block_sparse=None``: its ``auto`` rule; True / False force the block-sparse
        tile skipping on or off).
      mesh, strategy: a 1-D device mesh: the pairwise force runs sharded over it
        (``pairwise.ensemble_force(..., mesh=mesh, strategy=strategy)``, strategy
        ``"allgather"`` or ``"ring"``); per step equal to the unsharded force up to rounding.
      audit_size: the gradient audit: true gradients at this many random
        particles that used the ensemble force, compared with it (module
        docstring, "Gradient audit"); 0 switches it off (default 32: EnLMC is
        unstable, and the audit is what flags it early).
      grad_fn: ``x: (d,) -> ∇ log density (d,)`` for the particles that need a
        true gradient (an adjoint solver, ``cj.gradients.finite_difference``, an
        external code); default ``jax.grad(logdensity_fn)``.
    """
    _check_ensemble_state(state, EnLMCState, "enlmc_init")
    check_key(rng_key)
    _check_enlmc_params(step_size, eta, blowup_factor, dense_grad, method, block_size, strategy)
    x = state.position
    n, d = x.shape
    capacity = _capacity(grad_capacity, n)
    audit_size = min(check_int(audit_size, "audit_size", minimum=0), n)
    if grad_fn is not None:
        check_callable(grad_fn, "grad_fn", "x: (d,) -> gradient of the log density (d,)")
    h = jnp.asarray(step_size, x.dtype)
    f = -state.logdensity
    pf = ensemble_force(x, f, state.log_p, jnp.asarray(eta, x.dtype), method=method, block_size=block_size,
                        precision=precision, mesh=mesh, strategy=strategy,
                        block_sparse=block_sparse)
    ens = pf.force_sum / jnp.asarray(n - 1, x.dtype)
    need = ~jnp.isfinite(state.log_p)  # no previous step: p_j unknown, use ∇f
    grad_one = gradient_fn(logdensity_fn, grad_fn)
    audit, a, force, padded = _gradients_and_audit(rng_key, grad_one, x, need, ens, capacity, dense_grad,
                                                   audit_size, state.audit, h, flag_unstable=True)
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
        model_solves=(n + padded * grad_cost(grad_fn, d)).astype(x.dtype),
        max_force_norm=jnp.max(ens_norm),
        num_exploded=exploded,
        num_isolated=jnp.sum(~need & (pf.n_ball == 0), dtype=jnp.int32),
        **a.info_fields(),
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
    f_star: Optional[float] = None,
    *,
    f_star_tol: Optional[float] = None,
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
    f_star: Optional[float] = None,
    *,
    grad_capacity: Optional[int] = None,
    dense_grad: bool = False,
    method: str = "auto",
    block_size: Optional[int] = None,
    precision: Any = None,
    mesh: Any = None,
    strategy: str = "allgather",
    block_sparse: Optional[bool] = None,
    audit_size: int = CENLMC_AUDIT_SIZE,
    grad_fn: Optional[Callable] = None,
    min_ball_neighbours: Optional[int] = None,
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
      grad_capacity: gradient buffer size, in ``[1, N]`` (default ``ceil(N/16)``).
      dense_grad: debugging switch: compute all N gradients, then select
        (same trajectory, no saving).
      method, block_size, precision, block_sparse: passed to ``pairwise.ensemble_force``
        (``block_sparse=None``: its ``auto`` rule; True / False force the block-sparse
        tile skipping on or off).
      mesh, strategy: a 1-D device mesh: the pairwise force runs sharded over it
        (``pairwise.ensemble_force(..., mesh=mesh, strategy=strategy)``, strategy
        ``"allgather"`` or ``"ring"``); per step equal to the unsharded force up to rounding.
      audit_size: the gradient audit: true gradients at this many random
        particles that used the ensemble force, compared with it, and the
        ``biased`` flag (module docstring, "Gradient audit"); default
        :data:`CENLMC_AUDIT_SIZE` (8); 0 switches it off.
      grad_fn: ``x: (d,) -> ∇ log density (d,)`` for the particles that need a
        true gradient (an adjoint solver, ``cj.gradients.finite_difference``, an
        external code); default ``jax.grad(logdensity_fn)``.
      min_ball_neighbours: the guard (module docstring, "Departure from the
        paper"): a particle whose η-ball held fewer than this many
        R2-neighbours at the previous step takes its true gradient. Default 1
        (an empty ball: a force of exactly 0); 0 restores rule (3.21) exactly.
    """
    _check_ensemble_state(state, CEnLMCState, "cenlmc_init")
    check_key(rng_key)
    x = state.position
    n, d = x.shape
    _check_cenlmc_params(n, step_size, eta, r1, r2, n_star, m_f)
    _check_f_star(f_star)
    _check_switches(dense_grad, method, block_size, strategy)
    capacity = _capacity(grad_capacity, n)
    audit_size = min(check_int(audit_size, "audit_size", minimum=0), n)
    min_ball = 1 if min_ball_neighbours is None else check_int(
        min_ball_neighbours, "min_ball_neighbours", minimum=0, maximum=n - 1)
    if grad_fn is not None:
        check_callable(grad_fn, "grad_fn", "x: (d,) -> gradient of the log density (d,)")

    dt = x.dtype
    h = jnp.asarray(step_size, dt)
    fs = state.f_star if f_star is None else jnp.asarray(f_star, dt)
    f = -state.logdensity
    pf = ensemble_force(x, f, state.log_p, jnp.asarray(eta, dt), w=state.w, r2=jnp.asarray(r2, dt), method=method,
                        block_size=block_size, precision=precision, mesh=mesh, strategy=strategy,
                        block_sparse=block_sparse)
    # comparisons written so that NaN/inf fail the test (w = +inf at init gives NaN/inf here)
    fail_r1 = ~(jnp.linalg.norm(x - state.w, axis=-1) <= jnp.asarray(r1, dt))
    fail_mf = ~(f <= fs + jnp.asarray(m_f, dt))
    fail_n = pf.n_r2 < jnp.maximum(jnp.asarray(n_star, jnp.int32), 1)
    # the guard reads the previous step's η-ball count: a function of the past only, so
    # selecting on it keeps the ensemble force unbiased given the past (today's count is not)
    fail_ball = state.ball_count < min_ball
    need = fail_r1 | fail_mf | fail_n | fail_ball
    ens = pf.force_sum / jnp.maximum(pf.n_r2, 1).astype(dt)[:, None]
    grad_one = gradient_fn(logdensity_fn, grad_fn)
    audit, a, force, padded = _gradients_and_audit(rng_key, grad_one, x, need, ens, capacity, dense_grad,
                                                   audit_size, state.audit, h, flag_unstable=False)
    w_new, x_new, log_p_new = _move(rng_key, x, force, h)
    logdensity = _values(logdensity_fn, x_new)
    bad = count_nonfinite(x_new, logdensity)
    num_need = jnp.sum(need, dtype=jnp.int32)
    info = CEnLMCInfo(
        grad_evals=num_need,
        grad_evals_padded=jnp.asarray(padded, jnp.int32),
        f_evals=jnp.asarray(n, jnp.int32),
        model_solves=(n + padded * grad_cost(grad_fn, d)).astype(x.dtype),
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
# Theorem 3.3: coupling with LMC.
# --------------------------------------------------------------------------


@functools.partial(jax.jit, static_argnames=("logdensity_fn", "num_steps", "n_star", "step_kwargs"))
def _coupled_run(rng_key, cstate, lstate, logdensity_fn, num_steps, step_size, eta, r1, r2, n_star, m_f,
                 step_kwargs):
    kwargs = dict(step_kwargs)

    def body(carry, t):
        cs, ls = carry
        key = jax.random.fold_in(rng_key, t)  # one key per step, used by both samplers
        cs, info = cenlmc_step(key, cs, logdensity_fn, step_size, eta, r1, r2, n_star, m_f, **kwargs)
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
    f_star: Optional[float] = None,
    *,
    return_info: bool = False,
    **step_kwargs: Any,
):
    """The coupling of Theorem 3.3: ``E|x_i^m - z_i^m|`` for m = 1..num_steps, shape (num_steps,).

    Runs CEnLMC (``x``) and LMC (``z``, eq. 3.24) from the same ``positions``
    with the same noise ``ξ^m`` (both steps draw ``jax.random.normal(key_m, (N, d))``
    from ``key_m = fold_in(rng_key, m)``) and returns the particle average of
    ``|x_i^m - z_i^m|`` after each step. The theorem bounds it (μ-convex f) by
    ``O(sqrt(R1^d κ M_f d / (μ η^d N*)) · exp(R1(R1+R2)/(2h)) + κ η d)``.
    With ``return_info=True`` returns ``(distance, infos)`` where ``infos``
    are the stacked :class:`CEnLMCInfo` of the CEnLMC run. ``step_kwargs``
    (``grad_capacity``, ``method``, ...) go to :func:`cenlmc_step`.
    """
    num_steps = check_int(num_steps, "num_steps", minimum=1)
    check_bool(return_info, "return_info")
    cstate = cenlmc_init(positions, logdensity_fn, f_star)
    lstate = lmc_init(cstate.position, logdensity_fn)
    # validate the step's parameters once, in Python, before tracing
    _check_cenlmc_params(cstate.position.shape[0], step_size, eta, r1, r2, n_star, m_f)
    dist, infos = _coupled_run(rng_key, cstate, lstate, logdensity_fn, int(num_steps), step_size, eta, r1, r2,
                               int(n_star), m_f, tuple(sorted(step_kwargs.items())))
    return (dist, infos) if return_info else dist


# --------------------------------------------------------------------------
# Sampler objects.
# --------------------------------------------------------------------------


def enlmc(
    logdensity_fn: LogDensityFn,
    step_size: float,
    eta: float,
    *,
    grad_capacity: Optional[int] = None,
    blowup_factor: float = 10.0,
    dense_grad: bool = False,
    method: str = "auto",
    block_size: Optional[int] = None,
    precision: Any = None,
    mesh: Any = None,
    strategy: str = "allgather",
    block_sparse: Optional[bool] = None,
    audit_size: int = 32,
    grad_fn: Optional[Callable] = None,
) -> SamplingAlgorithm:
    """EnLMC (Algorithm 3.1) as a sampler object; see :func:`enlmc_step` (provably unstable).

    ``init(positions, rng_key=None)``: :func:`enlmc_init` on ``positions: (N, d)``.
    ``step(rng_key, state)``: :func:`enlmc_step` with these parameters.
    """
    check_callable(logdensity_fn, "logdensity_fn", "x -> scalar log density")
    _check_enlmc_params(step_size, eta, blowup_factor, dense_grad, method, block_size, strategy)
    check_int(audit_size, "audit_size", minimum=0)
    kwargs = dict(grad_capacity=grad_capacity, blowup_factor=blowup_factor, dense_grad=dense_grad, method=method,
                  block_size=block_size, precision=precision, mesh=mesh, strategy=strategy, audit_size=audit_size,
                  grad_fn=grad_fn, block_sparse=block_sparse)

    def init(positions, rng_key=None):
        del rng_key  # deterministic start
        return enlmc_init(positions, logdensity_fn)

    def step(rng_key, state):
        return enlmc_step(rng_key, state, logdensity_fn, step_size, eta, **kwargs)

    return SamplingAlgorithm(init, step)


def cenlmc(
    logdensity_fn: LogDensityFn,
    step_size: float,
    eta: float,
    r1: float,
    r2: float,
    n_star: int,
    m_f: float,
    *,
    f_star: Optional[float] = None,
    f_star_tol: Optional[float] = None,
    f_star_max_steps: int = 500,
    grad_capacity: Optional[int] = None,
    dense_grad: bool = False,
    method: str = "auto",
    block_size: Optional[int] = None,
    precision: Any = None,
    mesh: Any = None,
    strategy: str = "allgather",
    block_sparse: Optional[bool] = None,
    audit_size: int = CENLMC_AUDIT_SIZE,
    grad_fn: Optional[Callable] = None,
    min_ball_neighbours: Optional[int] = None,
) -> SamplingAlgorithm:
    """CEnLMC (Algorithm 3.2) as a sampler object; see :func:`cenlmc_step`.

    ``init(positions, rng_key=None)``: :func:`cenlmc_init` on ``positions: (N, d)``
    with ``f_star`` (found by L-BFGS when None). ``step(rng_key, state)``:
    :func:`cenlmc_step` with these parameters (``f*`` read from the state).
    ``N* <= N - 1`` is checked when the ensemble is known (at ``init``).
    """
    check_callable(logdensity_fn, "logdensity_fn", "x -> scalar log density")
    _check_cenlmc_params(None, step_size, eta, r1, r2, n_star, m_f)
    _check_f_star(f_star)
    _check_switches(dense_grad, method, block_size, strategy)
    check_int(audit_size, "audit_size", minimum=0)
    kwargs = dict(grad_capacity=grad_capacity, dense_grad=dense_grad, method=method, block_size=block_size,
                  precision=precision, mesh=mesh, strategy=strategy, audit_size=audit_size, grad_fn=grad_fn,
                  min_ball_neighbours=min_ball_neighbours, block_sparse=block_sparse)

    def init(positions, rng_key=None):
        del rng_key  # deterministic start
        state = cenlmc_init(positions, logdensity_fn, f_star, f_star_tol=f_star_tol, f_star_max_steps=f_star_max_steps)
        _check_cenlmc_params(state.position.shape[0], step_size, eta, r1, r2, n_star, m_f)
        return state

    def step(rng_key, state):
        return cenlmc_step(rng_key, state, logdensity_fn, step_size, eta, r1, r2, n_star, m_f, **kwargs)

    return SamplingAlgorithm(init, step)
