"""A short burn-in that picks CEnLMC's radii for a requested ensemble fraction.

:func:`cenlmc_jax.tuning.suggest_cenlmc_params` gives parameters from theory
for a roughly unit-scale target. :func:`tune_cenlmc` checks and adjusts them
on the user's own target, measuring what matters during a burn-in:

* the **ensemble fraction** (particles using the ensemble force instead of a
  gradient): the saving;
* the **variance inflation** from the gradient audit (true gradients at
  ``audit_size`` random particles that used the ensemble force,
  ``info.audit_variance_inflation``): the relative inflation of the
  stationary variance by the ensemble force's noise, the error that biases
  the moments (module docstring of :mod:`cenlmc_jax.ensemble`), capped by
  ``max_variance_inflation`` (default 0.03: the sd biased by ~1.5%, half
  the audit's flag ``AUDIT_BIAS_THRESHOLD``; the suggestion's budget is
  0.02, and a trial's 20 measured steps leave room for noise);
* the typical drift error of one step, ``h|F_i - ∇f(x_i)|`` in units of the
  Langevin noise length ``sqrt(2hd)`` (``info.audit_noise_error``, a median),
  capped by ``max_noise_error`` (0.25). The median alone misses a heavy tail
  (measured: 0.04-0.05 both on a healthy run and on one whose sd is 16% too
  large), which is why the variance inflation is the main criterion.

Two knobs are searched on a small grid, all from the suggested values:
``R1`` through the pass probability of the R1 test (``R1 = sqrt(2h
χ²_d.ppf(p))``, p in ``r1_passes``: the R1 test caps the fraction near p, so
p = 0.7, the suggestion, caps it near 0.63), and ``η, R2`` scaled together by
``radius_scales`` (smaller radii: a more local, less biased estimate, fewer
neighbours). A first ``steps_per_trial`` steps burn in with the suggested
values; each candidate then runs ``steps_per_trial`` steps from that same
state (so an unstable candidate cannot damage the chain the others are
measured on), and the chosen one runs them again to hand over a settled
chain; all share one compiled program (the radii are traced arguments). The choice: among the
candidates whose measured variance inflation and drift error are below their
caps and that were never flagged (biased or diverged: a trial's ``unstable``), the one with
the smallest variance inflation among those reaching ``target_fraction``; if
none reaches it, the one with the largest fraction. With no acceptable
candidate the ensemble is switched off (``r1 = 0``: CEnLMC is then LMC) and
the reasoning says so.

What a trial cannot see. The ensemble force is unbiased but heavy-tailed: its
weights ``1/p_j`` are bounded (by ``(4πh)^{d/2} exp((η+R1+R2)²/4h)``, proof of
Lemma 4.2), and a neighbour near the bound now and then kicks a particle by
tens of times its drift; a trial's steps rarely hold such a kick. So the
long-run mean of the audited inflation is above the trial's figure (2-D
banana, h = 0.05, N = 1000: 0.025-0.050 over 300 steps against 0.016-0.028
in the trials; the factor 2 between ``max_variance_inflation`` and the
audit's flag is the room for it), and "never diverged" covers the trial's
steps only: on a target whose curvature is unbounded, a kick can send a
particle where the step size is unstable, and the gradient steps there
diverge (the banana, curvature above 2/h for |x1| > ~6: 5 of 10 runs of 300
steps with the chosen parameters lost a particle; plain LMC from 3 of those
states, none). The sampler reports it (``info.diverged``; ``cj.sample`` stops
at the last finite state).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from cenlmc_jax._validation import check_bool, check_callable, check_int, check_key, check_positions, check_positive
from cenlmc_jax.base import SamplingAlgorithm
from cenlmc_jax.ensemble.audit import fresh_audit
from cenlmc_jax.ensemble.samplers import CEnLMCState, cenlmc, cenlmc_init, cenlmc_step
from cenlmc_jax.tuning import chi2_ppf, suggest_cenlmc_params
from cenlmc_jax.types import ArrayLike, LogDensityFn, PRNGKey

__all__ = ["TunedCEnLMC", "tune_cenlmc"]


class TunedCEnLMC(NamedTuple):
    """What :func:`tune_cenlmc` returns.

    params: dict ``eta, r1, r2, n_star, m_f`` (ready for ``cj.cenlmc``).
    algorithm: ``cj.cenlmc(...)`` with those parameters (its default audit: the ``biased`` flag stays on).
    state: the chain's state after the burn-in, the last ``steps_per_trial`` steps
        of which ran with the chosen parameters (continue sampling from it).
    ensemble_fraction, noise_error, drift_ratio, variance_inflation: measured for the choice in
        its trial (mean fraction; median audit noise error and drift ratio; mean variance inflation).
    trials: one dict per candidate with the same measurements.
    reasoning: a readable account of the choice.
    grad_evals: the gradients the whole burn-in computed (``info.grad_evals_padded`` summed over
        every step of every trial: buffers' padding and the audit included), the tuning's cost to set
        against what the ensemble saves afterwards.
    """

    params: dict
    algorithm: SamplingAlgorithm
    state: CEnLMCState
    ensemble_fraction: float
    noise_error: float
    drift_ratio: float
    variance_inflation: float
    trials: list
    reasoning: str
    grad_evals: int = 0


#: Below this chosen ensemble fraction :func:`tune_cenlmc` warns: the ensemble is (nearly) unused and
#: CEnLMC is LMC at the price of N values per step more.
LOW_FRACTION = 0.05
#: :func:`tune_cenlmc` skips its grid when both the predicted best fraction of any candidate and the first
#: burn-in's measured fraction are below this: no candidate can use the ensemble (issue 17: 67 s of grid on
#: a 4-parameter model whose predicted fraction was ~0).
NEGLIGIBLE_FRACTION = 0.01


def _trial_runner(logdensity_fn, step_size, n_star, m_f, num_steps, audit_size, grad_fn, kwargs):
    """One compiled program running ``num_steps`` CEnLMC steps with traced ``eta, r1, r2``."""

    @jax.jit
    def run(key, state, eta, r1, r2):
        def body(st, t):
            st, info = cenlmc_step(jax.random.fold_in(key, t), st, logdensity_fn, step_size, eta, r1, r2, n_star,
                                   m_f, audit_size=audit_size, grad_fn=grad_fn, **kwargs)
            return st, (info.ensemble_fraction, info.audit_noise_error, info.audit_drift_ratio,
                        info.audit_variance_inflation, info.biased, info.diverged,
                        info.grad_evals_padded)

        return lax.scan(body, state, jnp.arange(num_steps))

    return run


def _check_tuning_args(rng_key, logdensity_fn, positions, step_size, target_fraction, max_noise_error,
                       max_variance_inflation, steps_per_trial, audit_size, r1_passes, radius_scales):
    check_key(rng_key)
    check_callable(logdensity_fn, "logdensity_fn", "x -> scalar log density")
    x = check_positions(positions, min_particles=2)
    check_positive(step_size, "step_size")
    if not 0.0 < float(target_fraction) < 1.0:
        raise ValueError(f"target_fraction must lie in (0, 1); got {target_fraction!r}.")
    check_positive(max_noise_error, "max_noise_error")
    check_positive(max_variance_inflation, "max_variance_inflation")
    steps_per_trial = check_int(steps_per_trial, "steps_per_trial", minimum=4)
    audit_size = check_int(audit_size, "audit_size", minimum=1)
    for p in r1_passes:
        if not 0.0 < float(p) < 1.0:
            raise ValueError(f"r1_passes must hold probabilities in (0, 1); got {r1_passes!r}.")
    for c in radius_scales:
        check_positive(c, "radius_scales (each)")
    return x, steps_per_trial, audit_size


def _trial_record(outputs, half, **fields) -> dict:
    """A candidate's measurements over the second half of its trial."""
    frac, noise, ratio, inflation, flagged, diverged, _ = (np.asarray(a) for a in outputs)

    def tail(a, reduce, empty):
        a = a[half:]
        return float(reduce(a)) if np.any(np.isfinite(a)) else empty

    return dict(fields, ensemble_fraction=float(np.mean(frac[half:])), noise_error=tail(noise, np.nanmedian, 0.0),
                drift_ratio=tail(ratio, np.nanmedian, 1.0), variance_inflation=tail(inflation, np.nanmean, 0.0),
                unstable=bool(np.any(flagged) or np.any(diverged)))


def _choose(trials, base, target_fraction, max_noise_error, max_variance_inflation):
    """The rule of the module docstring: (best trial's measurements, params, a note)."""
    ok = [t for t in trials if t["noise_error"] <= max_noise_error and not t["unstable"]
          and t["variance_inflation"] <= max_variance_inflation]
    caps = f"variance inflation <= {max_variance_inflation:g} and drift error <= {max_noise_error:g}"
    if not ok:
        best = dict(ensemble_fraction=0.0, noise_error=float("nan"), drift_ratio=float("nan"),
                    variance_inflation=float("nan"))
        params = dict(eta=base.eta, r1=0.0, r2=base.r2, n_star=base.n_star, m_f=base.m_f)
        return best, params, (f"no candidate kept {caps} (never flagged); the ensemble is switched off (r1 = 0): "
                              "CEnLMC is LMC on this target at this N.")
    reach = [t for t in ok if t["ensemble_fraction"] >= target_fraction]
    if reach:
        best = min(reach, key=lambda t: (t["variance_inflation"], -t["ensemble_fraction"]))
        note = (f"chose the smallest variance inflation among the {len(reach)} candidates reaching the "
                f"target fraction {target_fraction:.2f} with {caps}.")
    else:
        best = max(ok, key=lambda t: t["ensemble_fraction"])
        note = (f"no candidate reached the target fraction {target_fraction:.2f} with {caps}; chose the "
                f"largest fraction, {best['ensemble_fraction']:.2f}.")
    return best, dict(eta=best["eta"], r1=best["r1"], r2=best["r2"], n_star=base.n_star, m_f=base.m_f), note


def tune_cenlmc(
    rng_key: PRNGKey,
    logdensity_fn: LogDensityFn,
    positions: ArrayLike,
    step_size: float,
    *,
    target_fraction: float = 0.6,
    max_noise_error: float = 0.25,
    max_variance_inflation: float = 0.03,
    f_star: float | None = None,
    L: float | None = None,
    mu: float | None = None,
    steps_per_trial: int = 40,
    audit_size: int = 64,
    r1_passes: tuple = (0.7, 0.8, 0.9, 0.95),
    radius_scales: tuple = (1.0, 0.75, 0.5),
    grad_fn: Callable | None = None,
    skip_hopeless: bool = True,
    **cenlmc_kwargs: Any,
) -> TunedCEnLMC:
    """Burn in CEnLMC while choosing ``η, R1, R2`` for ``target_fraction`` (module docstring).

    Args:
      rng_key: key of the burn-in. logdensity_fn, positions ``(N, d)``, step_size: as for ``cj.cenlmc``.
      target_fraction: the ensemble fraction asked for, in (0, 1).
      max_noise_error: the largest acceptable median drift error per step, in
        noise lengths ``sqrt(2hd)`` (measured by the gradient audit).
      max_variance_inflation: the largest acceptable relative variance inflation by the
        ensemble noise (the audit's mean ``info.audit_variance_inflation`` over a trial's second half).
      f_star, L, mu: as for ``cj.cenlmc`` / ``suggest_cenlmc_params``.
      steps_per_trial: steps per candidate (the fraction and error are measured
        over the second half of each trial).
      audit_size: audited particles per step during the burn-in.
      r1_passes, radius_scales: the grid (module docstring).
      skip_hopeless: skip the grid (and the settling run) when it cannot help (:func:`_hopeless`): the
        suggested parameters are then judged on the first burn-in alone, by the same rule.
      grad_fn, **cenlmc_kwargs: passed to ``cj.cenlmc`` (``method``, ``mesh``, ...).

    The burn-in costs ``(len(r1_passes)·len(radius_scales) + 2)·steps_per_trial``
    steps (560 by default) and ``audit_size`` extra gradients per step; the gradients it
    computed are ``TunedCEnLMC.grad_evals``. A chosen fraction below :data:`LOW_FRACTION`
    (the ensemble unused) is warned about (``UserWarning``), with the reason.
    """
    x, steps_per_trial, audit_size = _check_tuning_args(
        rng_key, logdensity_fn, positions, step_size, target_fraction, max_noise_error, max_variance_inflation,
        steps_per_trial, audit_size, r1_passes, radius_scales)
    skip_hopeless = check_bool(skip_hopeless, "skip_hopeless")
    n, d = x.shape
    h = float(step_size)
    base = suggest_cenlmc_params(d, h, L=L, mu=mu, num_particles=n)
    run = _trial_runner(logdensity_fn, h, base.n_star, base.m_f, steps_per_trial, min(audit_size, n), grad_fn,
                        cenlmc_kwargs)
    grads = 0

    def trial(k, state, eta, r1, r2):
        nonlocal grads
        radii = (jnp.asarray(v, x.dtype) for v in (eta, r1, r2))
        out_state, outputs = run(jax.random.fold_in(rng_key, k), state, *radii)
        grads += int(np.sum(np.asarray(outputs[-1], np.int64)))
        return out_state, outputs

    # a first burn-in with the suggested values; every candidate then starts from there, so a
    # bad candidate (an unstable ensemble) cannot damage the chain the others are measured on
    start, first = trial(0, cenlmc_init(x, logdensity_fn, f_star), base.eta, base.r1, base.r2)
    start = start._replace(audit=fresh_audit(x.dtype))
    first = _trial_record(first, steps_per_trial // 2, eta=base.eta, r1=base.r1, r2=base.r2,
                          r1_pass=float(base.pass_r1), radius_scale=1.0)
    if skip_hopeless and _hopeless(base, first, r1_passes):
        return _untuned(logdensity_fn, h, base, first, start, f_star, grad_fn, grads, target_fraction,
                        max_noise_error, max_variance_inflation, steps_per_trial, cenlmc_kwargs)
    trials = []
    for scale in radius_scales:
        for p in r1_passes:
            eta, r2, r1 = base.eta * scale, base.r2 * scale, math.sqrt(2.0 * h * chi2_ppf(float(p), d))
            _, outputs = trial(len(trials) + 1, start, eta, r1, r2)
            trials.append(_trial_record(outputs, steps_per_trial // 2, eta=eta, r1=r1, r2=r2, r1_pass=float(p),
                                        radius_scale=float(scale)))
    best, params, note = _choose(trials, base, target_fraction, max_noise_error, max_variance_inflation)
    notes = [f"suggested: eta={base.eta:.4g}, R1={base.r1:.4g}, R2={base.r2:.4g}, N*={base.n_star}, "
             f"M_f={base.m_f:.3g}; {len(trials)} candidates x {steps_per_trial} steps, audit of {audit_size}.", note]
    # settle the chain with the chosen parameters, then hand it over with a fresh audit
    state, outputs = trial(len(trials) + 1, start, params["eta"], params["r1"], params["r2"])
    diverged = np.asarray(outputs[5])
    if diverged.any():  # never hand over non-finite particles: keep the burn-in's state (the trials' start)
        state = start
        notes.append(f"the settling run with the chosen parameters diverged at its step {int(np.argmax(diverged))} "
                     "(a particle left the region where the step size is stable); the state handed over is the "
                     "first burn-in's, before the trials.")
    state = state._replace(audit=fresh_audit(x.dtype))
    notes.append(f"measured: ensemble fraction {best['ensemble_fraction']:.3f}, variance inflation "
                 f"{best['variance_inflation']:.3g}, drift error {best['noise_error']:.3g} noise lengths, drift ratio "
                 f"{best['drift_ratio']:.3g}; the burn-in computed {grads} gradients.")
    if best["ensemble_fraction"] < LOW_FRACTION:
        warnings.warn(f"tune_cenlmc: the chosen ensemble fraction is {best['ensemble_fraction']:.2f} (below "
                      f"{LOW_FRACTION}): the ensemble is (nearly) unused, so CEnLMC is LMC here and its N values "
                      f"per step are wasted; use cj.lmc, more particles, or a better-scaled target. {note}",
                      UserWarning, stacklevel=2)
    return _tuned(logdensity_fn, h, params, best, state, f_star, grad_fn, trials, notes, grads, cenlmc_kwargs)


def _hopeless(base, first: dict, r1_passes: tuple) -> bool:
    """Whether no candidate of the grid can use the ensemble: both below :data:`NEGLIGIBLE_FRACTION`.

    Predicted: the suggestion's fraction ``pass_r1 · pass_M_f · pass_N* · pass_ball`` with the
    R1 pass raised to the grid's largest ``p`` (the grid's radius scales are at most 1 and only
    lower the neighbour counts, so no candidate is predicted above it). Measured: the first
    burn-in's fraction (second half), with the suggested values.
    """
    best_r1 = max(max(float(p) for p in r1_passes), base.pass_r1)
    predicted = base.expected_ensemble_fraction * best_r1 / max(base.pass_r1, 1e-300)
    return predicted < NEGLIGIBLE_FRACTION and first["ensemble_fraction"] < NEGLIGIBLE_FRACTION


def _untuned(logdensity_fn, h, base, first, start, f_star, grad_fn, grads, target_fraction, max_noise_error,
             max_variance_inflation, steps_per_trial, cenlmc_kwargs) -> TunedCEnLMC:
    """:func:`tune_cenlmc`'s result without the grid: :func:`_choose` on the first burn-in alone, its state."""
    best, params, note = _choose([first], base, target_fraction, max_noise_error, max_variance_inflation)
    notes = [f"suggested: eta={base.eta:.4g}, R1={base.r1:.4g}, R2={base.r2:.4g}, N*={base.n_star}, "
             f"M_f={base.m_f:.3g}; grid skipped: the predicted fraction ({base.expected_ensemble_fraction:.3g}) "
             f"and the first burn-in's ({first['ensemble_fraction']:.3g}) are below {NEGLIGIBLE_FRACTION}, which "
             f"no candidate can change; {steps_per_trial} steps run.", note,
             f"measured: ensemble fraction {best['ensemble_fraction']:.3f}; the burn-in computed {grads} gradients."]
    warnings.warn(f"tune_cenlmc: the ensemble fraction is {best['ensemble_fraction']:.2f} (predicted "
                  f"{base.expected_ensemble_fraction:.2g}): the ensemble is unused, so CEnLMC is LMC here and its N "
                  f"values per step are wasted; use cj.lmc, more particles, or a better-scaled target. {note}",
                  UserWarning, stacklevel=3)
    return _tuned(logdensity_fn, h, params, best, start, f_star, grad_fn, [], notes, grads, cenlmc_kwargs)


def _tuned(logdensity_fn, h, params, best, state, f_star, grad_fn, trials, notes, grads, cenlmc_kwargs):
    """The :class:`TunedCEnLMC` of the chosen ``params`` (``best``: their measured trial), with its sampler."""
    algo = cenlmc(logdensity_fn, h, params["eta"], params["r1"], params["r2"], params["n_star"], params["m_f"],
                  f_star=state.f_star if f_star is None else f_star, grad_fn=grad_fn, **cenlmc_kwargs)
    return TunedCEnLMC(params, algo, state, best["ensemble_fraction"], best["noise_error"], best["drift_ratio"],
                       best["variance_inflation"], trials, "\n".join(notes), grads)
