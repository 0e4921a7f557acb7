"""The gradient audit of EnLMC and CEnLMC (beyond the papers): is the force right?

``audit_size`` (32 particles per step for EnLMC, :data:`CENLMC_AUDIT_SIZE` = 8 for
CEnLMC; ``EnsembleOptions.audit_size``). Each step draws
``audit_size`` particles among those that used the ensemble force, evaluates
their true gradients and reports the median drift ratio
``F_i·∇f(x_i)/|∇f(x_i)|²`` (1 for an exact gradient), the median relative
error ``|F_i - ∇f(x_i)|/|∇f(x_i)|``, the median drift error of one step in
noise lengths ``h|F_i - ∇f(x_i)|/sqrt(2hd)`` and the variance inflation
below. It costs ``audit_size`` gradients per step (``info.audit_grad_evals``),
computed in the step's one gradient call with the particles that need theirs
(counted in ``grad_evals_padded`` and ``model_solves``, not in ``grad_evals``):
for CEnLMC at N = 2,000, 8 gradients a step are 0.4% of LMC's N and a small
fraction of CEnLMC's own.

*Instability (EnLMC).* EnLMC's instability (Theorem 3.2) shows first as a
drift deficit: its heavy-tailed weights make the typical force far below
``∇f`` (a median ratio well below 1 from the first steps in d = 1), so
particles drift outwards and the second moment grows, long before any kick
explodes. The state keeps an exponential moving average of the median ratio
(:data:`AUDIT_EMA_WEIGHT`); when it falls below :data:`AUDIT_UNSTABLE_RATIO`
after :data:`AUDIT_MIN_STEPS` audited steps, ``info.unstable`` (and so
``info.diverged``) is set. CEnLMC has no such field: its tests bound the weights
(``1/p_j <= (4πh)^{d/2} exp((η+R1+R2)²/(4h))``, proof of Lemma 4.2), so its
force has a finite variance, and a median ratio far below 1 there means a
noisy but unbiased force (as on the 3-D Darcy problem, where the chain is
stationary with an inflated variance), which the bias flag measures.

*Bias (CEnLMC and EnLMC).* With an unbiased force ``∇f + e`` (``E[e | x] = 0``,
exact for a quadratic f, see above) the chain is LMC with extra noise ``h e``,
and its stationary covariance solves ``Σ = AΣAᵀ + 2hI + h² C_e``
(``A = I - h∇²f``): each variance is inflated by the relative amount
``h C_e,kk / 2`` whatever the curvature (to first order in h). Averaged over
coordinates, that is the ensemble mean of ``h|e_i|²/(2d)``, the squared drift
error in noise lengths (zero for particles that took their gradient)::

    v = (fraction using the ensemble) × E[h|F_i - ∇f(x_i)|² / (2d) | i used it],

and the sd is biased by about ``v/2`` (on top of unadjusted Langevin's own
``h/4`` at unit curvature). ``|e|²`` is heavy-tailed (rare neighbours with a
huge ``1/p_j``), so the mean over 8 audited particles is a poor estimate of
its mean (on the Darcy problem with the former N* = 5 a 50-step average of it
sat well below the true value in the median and ranged over two orders of
magnitude), and the median drift error does not see the tail at all (the same
on healthy 2-D runs as on one whose sd is too large). The audit therefore
uses ``|F_i|²`` as a control variate: it is known at every particle without a
gradient, and ``|e|² = |F|² - |∇f|² - 2 e·∇f``, so::

    info.audit_variance_inflation
        = (1/N) Σ_{i used} h|F_i|²/(2d)
          + fraction × mean_audited h(|e_i|² - |F_i|²)/(2d)

is unbiased for the step's ``v`` (the audited particles are a uniform sample
of the users) and the audit only samples the light-tailed ``-|∇f|² - 2e·∇f``
(on the same Darcy runs, much closer to the true value and far less spread). A
systematic error (a force too weak, e.g. an empty ball with
``min_ball_neighbours=0``) enters through the audited ``e`` as well. The state
keeps a running mean of it (``state.audit.inflation``: the plain mean over the
first 200 steps, then an EMA of weight :data:`AUDIT_BIAS_WEIGHT`), and
``info.biased`` is set when it exceeds :data:`AUDIT_BIAS_THRESHOLD` = 0.06 after
:data:`AUDIT_BIAS_MIN_STEPS` = 200 steps (or earlier: "Early flag" below).

The threshold's measurements (healthy and biased runs, the audit simulated on
recorded runs, the Darcy runs above) are in
``benchmarks/results/audit_threshold.md``.

*Systematic bias.* The inflation above is second order in the force error: it
sees noise, but a force that is wrong by the same amount at every step (the
least-squares fit of :mod:`~cenlmc_jax.ensemble.least_squares`, whose error
is an ``O(η²)`` bias with almost no noise) moves the stationary distribution
at first order while ``h|e|²`` stays tiny (on N(0, I_3) the fit at 3x the
suggested η made the variance too large at a negligible audited inflation:
``benchmarks/results/frontier.md``). The audit therefore also measures the
force's error along the gradient::

    info.audit_drift_bias = β
        = fraction × Σ_audited e_i·∇f(x_i) / Σ_audited |∇f(x_i)|²,

zero in expectation for an unbiased force (``E[e | x] = 0``). A force
``(1 + b)∇f`` used by a fraction ``φ`` of the particle-steps gives ``β = φ b``,
and on a Gaussian target Langevin with that drift has its stationary variance
scaled by ``1/(1 + β)``: off by about ``-β``, relative (the fit shrinks the
gradient, ``β < 0``, and the variance grows). Elsewhere ``-β`` is a first-order
guide, and an error orthogonal to ``∇f`` is not seen. ``state.audit.drift_bias``
keeps its running mean (the inflation's weights) and ``info.biased`` is set
too when ``|β|`` exceeds :data:`AUDIT_DRIFT_BIAS_THRESHOLD` = 0.06 after
:data:`AUDIT_BIAS_MIN_STEPS` steps. Measurements:
``benchmarks/results/drift_bias.md``.

*Early flag.* A run shorter than :data:`AUDIT_BIAS_MIN_STEPS` steps could never
be flagged, however wrong its force (issue 47: ``r1 = r2 = 5`` or ``eta = 100`` on
N(0, diag(1, 0.1²)) at h = 0.002 moved the narrow sd by +99% and +10% in 150-step
runs that said nothing). The state also keeps the running means of the squares of
the two per-step estimates (``inflation_sq``, ``drift_bias_sq``), so the running
means' standard errors (their spread over the effective number of steps: the plain
mean's k, then the EMA's ``(2 - w)/w``), and ``info.biased`` is set from
:data:`AUDIT_EARLY_MIN_STEPS` = 20 steps when a running estimate exceeds its
threshold by more than :data:`AUDIT_EARLY_Z` = 4 standard errors: a bias beyond the
audit's noise. A systematic error (a force too weak by the same amount at every
step) has a small spread and is flagged at its first chance; a heavy-tailed noise
has a large one (one rare kick moves the mean and the standard error alike) and
waits for the 200-step rule. Per-step estimates are correlated over a few steps, so
the standard error is optimistic by about the square root of that correlation time;
4 of them leave that margin (the suggested parameters of
tests/test_nothing_unclear.py stay quiet, at 0.032 against 0.06).

The inflation is a mean over coordinates: where the force's error lies along one
coordinate (a narrow direction of an anisotropic target), that coordinate's
variance is inflated by up to ``d`` times it, which the flag does not see (on
N(0, diag(1, 0.1²)) about twice the mean).

``biased`` is not a divergence: the run goes on, ``cj.sample`` warns once and
the command-line job reports UNRELIABLE (exit 1). The remedies are smaller
``η, R1, R2``, a larger N* or more particles (the suggestion's noise budget,
:func:`cenlmc_jax.ensemble.tuning.suggest_cenlmc_params`;
:func:`cenlmc_jax.tune_cenlmc` caps the measured inflation), or LMC. No automatic
fall-back to gradients: the flag is about the whole ensemble (an average over
steps), not about particles, and switching the ensemble off mid-run would leave
the draws before the switch biased while making the cost LMC's.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from cenlmc_jax.base import RunFlag
from cenlmc_jax.ensemble.buffers import needed_grads
from cenlmc_jax.types import Array, PRNGKey

__all__ = [
    "Audit",
    "AuditInfo",
    "BIASED_FLAG",
    "fresh_audit",
    "fresh_audit_like",
    "audit_pick",
    "audit_figures",
    "gradients_and_audit",
    "no_audit",
    "AUDIT_EMA_WEIGHT",
    "AUDIT_UNSTABLE_RATIO",
    "AUDIT_MIN_STEPS",
    "CENLMC_AUDIT_SIZE",
    "AUDIT_BIAS_WEIGHT",
    "AUDIT_BIAS_THRESHOLD",
    "AUDIT_BIAS_MIN_STEPS",
    "AUDIT_DRIFT_BIAS_THRESHOLD",
    "AUDIT_EARLY_MIN_STEPS",
    "AUDIT_EARLY_Z",
]


class Audit(NamedTuple):
    """Running state of the gradient audit (beyond the paper; module docstring).

    Attributes:
      drift_ratio: ``()`` exponential moving average (weight
        :data:`AUDIT_EMA_WEIGHT` per audited step) of the median drift ratio
        ``F_i·∇f_i / |∇f_i|²``; starts at 1.
      steps: ``()`` int32, steps that audited at least one particle.
      inflation: ``()`` running mean of the per-step variance-inflation estimate
        ``info.audit_variance_inflation``: the plain mean over the first
        ``1/AUDIT_BIAS_WEIGHT`` steps the audit ran, then an exponential moving
        average of weight :data:`AUDIT_BIAS_WEIGHT`; starts at 0.
      bias_steps: ``()`` int32, steps the audit ran (a step with no ensemble user
        counts: its inflation is 0).
      drift_bias: ``()`` running mean of the per-step drift-bias estimate
        ``info.audit_drift_bias``, with the same weights as ``inflation``; starts
        at 0.
      inflation_sq: ``()`` running mean of the square of the per-step
        variance-inflation estimate (the same weights): with ``inflation``, the
        spread of the per-step estimates, so the noise of the running mean (the
        early flag, module docstring "Early flag"); starts at 0.
      drift_bias_sq: ``()`` the same for the drift bias; starts at 0.
    """

    drift_ratio: Array
    steps: Array
    inflation: Array
    bias_steps: Array
    drift_bias: Array
    inflation_sq: Array
    drift_bias_sq: Array


#: Weight of each audited step in the running drift ratio (about 10 steps of memory).
AUDIT_EMA_WEIGHT = 0.2
#: The ensemble is flagged unstable when the running drift ratio falls below this ...
AUDIT_UNSTABLE_RATIO = 0.6
#: ... after at least this many audited steps.
AUDIT_MIN_STEPS = 5
#: Particles audited per CEnLMC step by default (module docstring: cost and noise).
CENLMC_AUDIT_SIZE = 8
#: Weight of each step in the running variance-inflation estimate (a plain mean over the
#: first 200 steps, then about 200 steps of memory).
AUDIT_BIAS_WEIGHT = 0.005
#: ``info.biased`` is set when the running variance-inflation estimate exceeds this (the
#: sd biased by about 3%; module docstring, for the measurements behind the number) ...
AUDIT_BIAS_THRESHOLD = 0.06
#: ... after at least this many steps of audit (the plain-mean window: 1,600 audited
#: particles at 8 a step).
AUDIT_BIAS_MIN_STEPS = 200
#: ``info.biased`` is also set when the running drift bias ``|β|`` exceeds this (the
#: variance off by about as much, relative, as the noise threshold allows; module
#: docstring, "Systematic bias").
AUDIT_DRIFT_BIAS_THRESHOLD = 0.06
#: The early flag (module docstring, "Early flag"): from this many steps of audit ...
AUDIT_EARLY_MIN_STEPS = 20
#: ... ``info.biased`` is set when a running estimate exceeds its threshold by more than
#: this many standard errors of the running mean.
AUDIT_EARLY_Z = 4.0


class AuditInfo(NamedTuple):
    """The audit's info fields of one step (see :class:`CEnLMCInfo`)."""

    grad_evals: Array
    drift_ratio: Array
    error: Array
    noise_error: Array
    variance_inflation: Array
    drift_bias: Array
    unstable: Array
    biased: Array

    def info_fields(self) -> dict:
        """These figures under their names in :class:`EnLMCInfo` / :class:`CEnLMCInfo`.

        ``unstable`` is EnLMC's alone: its step passes it itself.

        Returns:
          A dict from info field name to value.
        """
        return dict(
            audit_grad_evals=self.grad_evals,
            audit_drift_ratio=self.drift_ratio,
            audit_error=self.error,
            audit_noise_error=self.noise_error,
            audit_variance_inflation=self.variance_inflation,
            audit_drift_bias=self.drift_bias,
            biased=self.biased,
        )


def audit_pick(rng_key: PRNGKey, used: Array, size: int) -> tuple[Array, Array, Array]:
    """The audit's particles: ``size`` indices drawn without replacement among ``used``.

    By Gumbel top-k; with fewer such particles, fewer are audited.

    Args:
      rng_key: the step's key (folded with a constant, so the draw is independent
        of the step's noise).
      used: ``(N,)`` bool, the particles that used the ensemble force.
      size: the number to audit (static).

    Returns:
      ``(idx, ok, mask)``: the indices ``(size,)``, which of them are real
      ``(size,)``, and the ``(N,)`` mask to add them to the step's gradient call.
    """
    score = jnp.where(
        used,
        jax.random.gumbel(jax.random.fold_in(rng_key, 0x5EED), used.shape),
        -jnp.inf,
    )
    top, idx = lax.top_k(score, size)
    ok = jnp.isfinite(top)
    mask = jnp.zeros(used.shape, bool).at[idx].set(ok, mode="drop")
    return idx, ok, mask


def audit_figures(
    grad: Array,
    idx: Array,
    ok: Array,
    force: Array,
    used: Array,
    running: Audit,
    h: Array,
    flag_unstable: bool,
) -> tuple[Audit, AuditInfo]:
    """The gradient audit's figures at the picked particles (:func:`audit_pick`).

    Their true gradients ``grad: (N, d)`` (of the log density) were computed by the
    step's gradient call with the others.

    Args:
      grad: the gradients of the log density, ``(N, d)`` (valid at the picked
        particles).
      idx: the picked indices, ``(size,)``.
      ok: which of them are real, ``(size,)``.
      force: the step's force ``F``, ``(N, d)``.
      used: ``(N,)`` bool, the particles that used the ensemble force.
      running: the running :class:`Audit`.
      h: the step size.
      flag_unstable: whether the running drift ratio may set ``unstable`` (EnLMC
        only).

    Returns:
      ``(new running Audit, AuditInfo)``.
    """
    dt = force.dtype
    d = force.shape[-1]
    grad_f = -grad[idx]  # ∇f = -∇ log density
    err = force[idx] - grad_f
    norm2 = jnp.maximum(jnp.sum(grad_f**2, axis=-1), jnp.finfo(dt).tiny)
    ratio = jnp.nanmedian(
        jnp.where(ok, jnp.sum(force[idx] * grad_f, axis=-1) / norm2, jnp.nan)
    )
    err2 = jnp.sum(err**2, axis=-1)
    error = jnp.nanmedian(jnp.where(ok, jnp.sqrt(err2 / norm2), jnp.nan))
    # the drift error of one step, h|F - ∇f|, in units of the noise length sqrt(2hd)
    to_noise = h / (2.0 * d)
    noise2 = to_noise * err2
    noise_error = jnp.nanmedian(jnp.where(ok, jnp.sqrt(noise2), jnp.nan))
    audited = jnp.any(ok)
    num_ok = jnp.sum(ok, dtype=jnp.int32)
    # the step's variance inflation: the users' mean of h|e|²/(2d) times their fraction,
    # estimated with |F|² as a control variate (module docstring): known at every user,
    # it brings in the whole ensemble's heavy tail; the audit only samples
    # |e|² - |F|² = -|∇f|² - 2 e·∇f
    force2 = to_noise * jnp.sum(force**2, axis=-1)
    used_fraction = jnp.mean(used.astype(dt))
    audited_gap = jnp.sum(jnp.where(ok, noise2 - force2[idx], 0.0)) / jnp.maximum(
        num_ok, 1
    ).astype(dt)
    inflation = (
        jnp.sum(jnp.where(used, force2, 0.0)) / used.shape[0]
        + used_fraction * audited_gap
    )
    # the systematic part (module docstring, "Systematic bias"): the users' force along
    # ∇f, relative to |∇f|², as a ratio of sums over the audited (an unbiased force
    # gives 0 in expectation), times their fraction
    along = jnp.sum(jnp.where(ok, jnp.sum(err * grad_f, axis=-1), 0.0))
    drift_bias = (
        used_fraction
        * along
        / jnp.maximum(jnp.sum(jnp.where(ok, norm2, 0.0)), jnp.finfo(dt).tiny)
    )
    ema = jnp.where(
        audited,
        (1 - AUDIT_EMA_WEIGHT) * running.drift_ratio + AUDIT_EMA_WEIGHT * ratio,
        running.drift_ratio,
    )
    steps = running.steps + audited.astype(jnp.int32)
    unstable = (
        (steps >= AUDIT_MIN_STEPS) & ~(ema >= AUDIT_UNSTABLE_RATIO)
        if flag_unstable
        else jnp.zeros((), bool)
    )
    bias_steps = running.bias_steps + 1
    weight = jnp.maximum(
        1.0 / bias_steps.astype(dt), AUDIT_BIAS_WEIGHT
    )  # a plain mean, then an EMA
    running_inflation = running.inflation + weight * (inflation - running.inflation)
    running_bias = running.drift_bias + weight * (drift_bias - running.drift_bias)
    inflation_sq = running.inflation_sq + weight * (inflation**2 - running.inflation_sq)
    bias_sq = running.drift_bias_sq + weight * (drift_bias**2 - running.drift_bias_sq)
    # NaN compares False: a non-finite estimate is flagged too (the run's own checks
    # catch non-finite particles)
    within = (running_inflation <= AUDIT_BIAS_THRESHOLD) & (
        jnp.abs(running_bias) <= AUDIT_DRIFT_BIAS_THRESHOLD
    )
    # the early flag (module docstring): beyond the threshold by more than the running
    # mean's noise, from the spread of the per-step estimates over its effective count
    # (the plain mean's k steps, then the EMA's (2 - w)/w)
    k = bias_steps.astype(dt)
    n_eff = jnp.minimum(k, (2.0 - AUDIT_BIAS_WEIGHT) / AUDIT_BIAS_WEIGHT)
    per_step = jnp.maximum(n_eff - 1.0, 1.0)

    def standard_error(mean, mean_sq):
        return jnp.sqrt(jnp.maximum(mean_sq - mean**2, 0.0) / per_step)

    beyond = (
        running_inflation
        - AUDIT_EARLY_Z * standard_error(running_inflation, inflation_sq)
        > AUDIT_BIAS_THRESHOLD
    ) | (
        jnp.abs(running_bias) - AUDIT_EARLY_Z * standard_error(running_bias, bias_sq)
        > AUDIT_DRIFT_BIAS_THRESHOLD
    )
    biased = ((bias_steps >= AUDIT_BIAS_MIN_STEPS) & ~within) | (
        (bias_steps >= AUDIT_EARLY_MIN_STEPS) & beyond
    )
    info = AuditInfo(
        num_ok, ratio, error, noise_error, inflation, drift_bias, unstable, biased
    )
    new_running = Audit(
        ema, steps, running_inflation, bias_steps, running_bias, inflation_sq, bias_sq
    )
    return new_running, info


def gradients_and_audit(
    rng_key,
    grad_one,
    x,
    need,
    ens,
    capacity,
    dense,
    audit_size,
    running,
    h,
    flag_unstable,
    mesh=None,
    values=None,
):
    """The step's one gradient call and the force.

    The call serves the particles that ``need`` a gradient and the audit's. The
    force is ``∇f`` where ``need`` and the ensemble estimate ``ens`` elsewhere
    (audited particles keep it). The audited particles ride in the same call (one
    call per step for a black-box model).

    Args:
      rng_key: the step's key.
      grad_one: ``(x_i, value_i) -> ∇log π(x_i)``.
      x: the particles, ``(N, d)``.
      need: ``(N,)`` bool, the particles that take their true gradient.
      ens: the ensemble force estimate, ``(N, d)``.
      capacity: the gradient buffer's size (:func:`~.buffers.needed_grads`).
      dense: compute every particle's gradient (``dense_grad``).
      audit_size: particles to audit (0: no audit).
      running: the running :class:`Audit`.
      h: the step size.
      flag_unstable: as for :func:`audit_figures`.
      mesh: each device computes the gradients of its own particles
        (:func:`~.buffers.needed_grads`).
      values: the log density at ``x``, for a ``grad_one(x_i, value_i)`` that
        reuses it.

    Returns:
      ``(running Audit, AuditInfo, force (N, d), gradients computed ())``.
    """
    if audit_size == 0:
        grad, padded = needed_grads(grad_one, x, need, capacity, dense, mesh, values)
        return (
            *no_audit(running, x.dtype),
            jnp.where(need[:, None], -grad, ens),
            padded,
        )
    idx, ok, audited = audit_pick(rng_key, ~need, audit_size)
    grad, padded = needed_grads(
        grad_one, x, need | audited, capacity, dense, mesh, values
    )
    force = jnp.where(need[:, None], -grad, ens)
    audit, info = audit_figures(grad, idx, ok, force, ~need, running, h, flag_unstable)
    return audit, info, force, padded


def no_audit(running: Audit, dtype) -> tuple[Audit, AuditInfo]:
    """``audit_size=0``: the running state unchanged, NaN figures, no flag.

    Args:
      running: the running :class:`Audit`.
      dtype: the dtype of the figures.

    Returns:
      ``(running, AuditInfo)``.
    """
    nan, false = jnp.asarray(jnp.nan, dtype), jnp.zeros((), bool)
    return running, AuditInfo(
        jnp.zeros((), jnp.int32), nan, nan, nan, nan, nan, false, false
    )


def fresh_audit(dtype) -> Audit:
    """The audit's running state before any step.

    Drift ratio 1, inflation and drift bias 0, no steps.

    Args:
      dtype: the dtype of the figures.

    Returns:
      An :class:`Audit`.
    """
    zero = jnp.zeros((), dtype)
    return Audit(
        jnp.ones((), dtype),
        jnp.zeros((), jnp.int32),
        zero,
        jnp.zeros((), jnp.int32),
        zero,
        zero,
        zero,
    )


@jax.jit
def fresh_audit_like(x: Array) -> Audit:
    """:func:`fresh_audit` in the dtype of ``x``: one compiled program (eagerly, each
    figure is one).

    Args:
      x: any array of the figures' dtype (the particles).

    Returns:
      An :class:`Audit`.
    """
    return fresh_audit(x.dtype)


def _kept_mean(kept: Any, field: str) -> float:
    """The mean of an info field over the kept steps (nan when never measured)."""
    v = np.asarray(getattr(kept, field, np.full(1, np.nan)), np.float64)
    return float(np.nanmean(v)) if np.any(np.isfinite(v)) else float("nan")


def _biased_message(kept: Any, first_step: int) -> str:
    """``cj.sample``'s warning for ``info.biased``.

    With the measured inflation and drift bias over the kept steps.
    """
    v, beta = (
        _kept_mean(kept, "audit_variance_inflation"),
        _kept_mean(kept, "audit_drift_bias"),
    )
    noise = (
        f"the ensemble force's noise inflates the stationary variance by about {v:.1%} "
        f"(the sd by about {np.sqrt(max(1 + v, 0.0)) - 1:.1%}; mean of "
        "info.audit_variance_inflation)"
    )
    drift = (
        f"the force is systematically {abs(beta):.1%} too "
        f"{'weak' if beta < 0 else 'strong'} along the gradient, which moves the "
        f"stationary variance by about {-beta:+.1%} (mean of info.audit_drift_bias)"
    )
    first, second = (
        (drift, noise)
        if abs(beta) > AUDIT_DRIFT_BIAS_THRESHOLD and not v > AUDIT_BIAS_THRESHOLD
        else (noise, drift)
    )
    return (
        f"the gradient audit measured over the kept steps that {first}, and that "
        f"{second}: above the audit's thresholds from step {first_step} (info.biased), "
        "so the moments are biased. Use smaller eta, r1, r2 or a larger n_star (or "
        "more particles), e.g. from cj.ensemble.tuning.suggest_cenlmc_params or "
        "cj.tune_cenlmc, the paper's estimator in place of a least-squares one, or "
        "cj.lmc"
    )


#: The driver's warning for ``info.biased`` (EnLMC's and CEnLMC's infos declare it),
#: once per call on kept steps.
BIASED_FLAG = RunFlag("biased", _biased_message, kept_only=True)
