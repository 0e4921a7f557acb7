"""The states and infos of EnLMC and CEnLMC (Ding & Li, Algorithms 3.1 and 3.2).

Plain ``NamedTuple`` pytrees, so ``jit``, ``vmap``, ``scan`` and checkpoints need nothing
special; :mod:`cenlmc_jax.ensemble.samplers` builds and steps them.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from cenlmc_jax.base import RunFlag
from cenlmc_jax.ensemble.audit import BIASED_FLAG, Audit
from cenlmc_jax.types import Array

#: CEnLMC's ensemble force used by fewer particle-steps than this (mean of ``info.ensemble_fraction`` over the
#: kept steps): it did LMC's work at extra cost (the pair sums), and ``cj.sample`` and the CLI say so.
ENSEMBLE_MIN_FRACTION = 0.05


def _unused_message(kept: Any, first_step: int) -> str:
    frac = float(np.mean(np.asarray(kept.ensemble_fraction, np.float64)))
    return (f"the ensemble force was used by {frac:.1%} of particle-steps after burn-in "
            f"(< {ENSEMBLE_MIN_FRACTION:.0%}, mean of info.ensemble_fraction over the kept steps): CEnLMC did "
            "LMC's work at extra cost. The eta-ball holds too few neighbours at this dimension and number of "
            "particles (cj.tuning.suggest_cenlmc_params's reasoning says how many would fill it): use more "
            "particles, or cj.lmc")


#: The driver's warning for an unused ensemble (CEnLMC's info declares it), once per call on the kept steps.
UNUSED_ENSEMBLE_FLAG = RunFlag("ensemble_fraction", _unused_message, kept_only=True,
                               mean_below=ENSEMBLE_MIN_FRACTION)

__all__ = ["EnLMCState", "EnLMCInfo", "CEnLMCState", "CEnLMCInfo"]


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
    audit: Audit


class EnLMCInfo(NamedTuple):
    """What one EnLMC step did (all scalars).

    grad_evals: gradients evaluated = particles without a previous step (N at step 0, then 0).
    grad_evals_padded: gradients computed including buffer padding and the audited particles.
    f_evals: evaluations of ``logdensity_fn`` (N: at the new positions).
    model_solves: the step's cost in model evaluations: ``f_evals`` plus every
       gradient computed (padding and audit included) at ``grad_fn.model_solves_given_value(d)``
       solves each (1 for autodiff; ``cj.finite_difference`` of ``logdensity_fn``: 2d central,
       d forward, the value at the particle being known).
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
    audit_drift_bias: this step's estimate of the force's systematic error along the gradient,
       ``β = (fraction using the ensemble force) × Σ (F_i - ∇f_i)·∇f_i / Σ |∇f_i|²`` over the
       audited particles (0 for an unbiased force; a force ``(1 + b)∇f`` gives ``fraction × b``, and
       then the stationary variance is off by about ``-β``, relative; NaN without audit).
    unstable: the running drift ratio (``state.audit``) fell below
       :data:`AUDIT_UNSTABLE_RATIO` after :data:`AUDIT_MIN_STEPS` audited steps.
    biased: the running variance-inflation estimate (``state.audit.inflation``) exceeds
       :data:`AUDIT_BIAS_THRESHOLD`, or the running drift bias's size (``state.audit.drift_bias``)
       :data:`AUDIT_DRIFT_BIAS_THRESHOLD`, after :data:`AUDIT_BIAS_MIN_STEPS` steps (not a divergence).
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
    audit: Audit
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
    audit_drift_bias: as in :class:`EnLMCInfo`: this step's estimate of the force's systematic
       error along the gradient (the stationary variance is off by about ``-β``, relative).
    biased: the running variance-inflation estimate (``state.audit.inflation``) exceeds
       :data:`AUDIT_BIAS_THRESHOLD`, or the running drift bias's size (``state.audit.drift_bias``)
       :data:`AUDIT_DRIFT_BIAS_THRESHOLD`, after :data:`AUDIT_BIAS_MIN_STEPS` steps: the moments are
       biased beyond the audit's tolerance. Reported (``cj.sample`` warns, the CLI says
       UNRELIABLE), never a divergence: the run goes on.
    num_nonfinite: particles whose new position or log density is NaN/inf.
    diverged: ``num_nonfinite > 0`` (or a traced parameter is NaN / out of range).

    No ``unstable`` field (EnLMC's drift-deficit flag): the tests of (3.21) bound the weights
    (proof of Lemma 4.2), so EnLMC's instability (Theorem 3.2) cannot occur, and a low audited
    drift ratio here is a noisy but unbiased force, which ``biased`` measures (the audit's module
    docstring, "Instability").
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

    # cj.sample warns once when a kept step is biased, and when the ensemble went unused over the kept steps
    run_flags = (BIASED_FLAG, UNUSED_ENSEMBLE_FLAG)
