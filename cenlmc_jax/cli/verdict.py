"""What ``cenlmc-jax`` prints about a run, and whether its answer is to be trusted.

The job must not print a wrong answer with exit status 0. :func:`problems`
checks a finished run for every known reason to distrust it:

* divergence (``info.diverged``: the driver stopped the run), and no draw
  kept at all (a divergence before the first recorded step: no estimates);
* a Langevin step size at or above ``2/c`` (:func:`stability_problem`), the
  stability limit of unadjusted Langevin at the target's curvature ``c``;
* every flag the sampler's infos declare (``run_flags``,
  :class:`cenlmc_jax.base.RunFlag`: the hook ``cj.sample`` warns through, so the verdict
  names no sampler's fields; :func:`flag_problems`): EnLMC's and CEnLMC's gradient audit
  measuring a biased force (``biased``), CEnLMC's ensemble force used by fewer than
  ``ENSEMBLE_MIN_FRACTION`` (5%) of the kept particle-steps (``ensemble_fraction``:
  LMC's work at extra cost), the recipe's and SGRHMC's clipped noise
  (``noise_clipped``), the Metropolis samplers' collapsed acceptance
  (``zero_acceptance``), and whatever a sampler declares next;
* Metropolis acceptance below :data:`ACCEPTANCE_MIN`;
* unadjusted Langevin's own sd bias, exact on Gaussian targets
  (:func:`ula_sd`), above the reported standard error;
* the end-of-run convergence checks of ``cj.sample``, the same function
  (:func:`cenlmc_jax.diagnostics.convergence.convergence_problems`): chains or particles
  that never moved, the rank-normalised split R-hat above :data:`RHAT_MAX` (1.1 here,
  1.01 in ``cj.sample``) and the bulk ESS below ``min(100 per chain, 400)``; for a
  streamed run the same thresholds on the split R-hat and batch-means ESS computed
  online (``RunResult.online``, :mod:`cenlmc_jax.diagnostics.online`); a split R-hat
  above 1.1 of at least 32 chains with independent, spread starts is judged again as
  many short chains (:func:`cenlmc_jax.diagnostics.convergence.judge_short_chains`:
  their means must not follow their starts, the ensemble must not drift, every mean
  needs an ESS of 400 and every chain 4 effective draws), since stationary chains
  short against their autocorrelation time have a split R-hat above 1 however many
  run;
* an unadjusted sampler's step-size bias measured by step halving
  (``cenlmc_jax.cli.jobs.step_halving_check``, :func:`cenlmc_jax.run.step_halving_bias`:
  a rerun at ``h/2`` from the final ensemble) beyond ``z`` standard errors, on any
  target; ``--no-bias-check`` skips it;
* estimates more than :data:`TRUTH_Z_MAX` standard errors from a known truth;
* what the set-up's warm-up reported as a ``ConvergenceWarning``
  (``Job.warmup_problems``: separate modes found by the mode search, whose draws then
  describe one of them; a kinetic phase that did not settle).

Each prints an ``UNRELIABLE: ...`` line naming the flags to change, and the
job exits :data:`EXIT_UNRELIABLE` unless ``--allow-unreliable``
(:func:`exit_status`). The other exit codes: :data:`EXIT_USAGE` for a usage
error, :data:`EXIT_INTERRUPTED` for a Ctrl-C. Which checks apply to which
sampler is the sampler table's (:mod:`cenlmc_jax.cli.samplers`).

The report itself: :func:`print_header` before the run (the sampler, the
target, the default step-size rule, the tuner's warnings), :func:`report`
after it (the driver's warnings, timings, gradient savings and audit,
acceptance, the summary table, the verdict); :func:`cmd_summary` prints a
finished ``--out`` directory's report again (a damaged one is a usage error
naming the file).
"""

from __future__ import annotations

import csv
import json
import math
import os
import re

import jax
import numpy as np

from cenlmc_jax import ensemble
from cenlmc_jax._host import fetch
from cenlmc_jax.base import RISING_Z, RunFlag, rising_z, run_flags
from cenlmc_jax.cli.jobs import (
    MAX_DEFAULT_STEPS,
    Run,
    Setup,
    cpu_pool_size,
    kept_steps,
    no_draws,
    shown,
)
from cenlmc_jax.cli.parser import UsageError
from cenlmc_jax.cli.samplers import SPECS
from cenlmc_jax.diagnostics import convergence, nested, online
from cenlmc_jax.diagnostics.summary import SummaryTable, summary
from cenlmc_jax.run import WATCH_MIN_STEPS

ACCEPTANCE_MIN = 0.05
#: The CLI's R-hat threshold, passed to the shared check (cj.sample warns above 1.01,
#: convergence.RHAT_MAX). The CLI keeps its documented 1.1 until the 200-particle x
#: 150-draw run of tests/cli/test_cli.py (R-hat 1.02: ~19 effective draws per particle's
#: half-chain) is long enough for 1.01.
RHAT_MAX = 1.1
TRUTH_Z_MAX = 5.0
EXIT_UNRELIABLE, EXIT_USAGE, EXIT_INTERRUPTED = 1, 2, 130
#: The verdict line of a run with no known problem (before issue 28 every run said it
#: passed every check; now :func:`checks_made` says which checks it made).
RELIABLE = "  reliability checks passed"


# --------------------------------------------------------------------------
# The checks.
# --------------------------------------------------------------------------


def ula_sd(target, h: float) -> np.ndarray | None:
    """Stationary sd of unadjusted Langevin with step h on a Gaussian target: Σ_h = (P -
    h P²/2)⁻¹, P = ∇²f.

    None when the target is not Gaussian, or when ``h >= 2 / λ_max(P)``: then there is
    no stationary distribution (the iterates grow without bound;
    :func:`stability_problem` says so).
    """
    if target.hessian is None:
        return None
    p = np.asarray(target.hessian, np.float64)
    if not h * float(np.linalg.eigvalsh(p).max()) < 2.0:
        return None
    return np.sqrt(np.diag(np.linalg.inv(p - 0.5 * h * p @ p)))


def stability_problem(args, job, c: float | None) -> list:
    """A Langevin step size at or above ``2/c``: beyond unadjusted Langevin's stability
    limit at curvature ``c`` (exact on a Gaussian target, where ``c`` is the largest
    eigenvalue of the precision).
    """
    h = job.parameters.get("step_size")
    c = job.parameters.get(
        "whitened_curvature", c
    )  # preconditioned (cj.langevin_warmup): the limit is in y
    if not SPECS[args.sampler].langevin or h is None or c is None or not h * c >= 2.0:
        return []
    return [
        f"the step size h={h:.4g} is at or above 2/c = {2.0 / c:.4g}, unadjusted "
        f"Langevin's stability limit at the target's curvature c = {c:.4g}: the "
        "iterates do not settle to a stationary distribution (on a Gaussian "
        f"target they grow without bound); lower --step-size below {2.0 / c:.4g}"
    ]


def _mean_inflation(res, kept: int) -> float:
    """The audit's measured variance inflation, averaged over the kept steps (nan when
    never measured).
    """
    v = np.asarray(res.info.audit_variance_inflation, np.float64)[kept:]
    return float(np.nanmean(v)) if np.any(np.isfinite(v)) else float("nan")


def _rows(flag: np.ndarray) -> np.ndarray:
    """Per-step booleans ``(steps, chains or particles)`` (a scalar per step is one
    row).
    """
    flag = np.asarray(flag).astype(bool)
    return flag.reshape(flag.shape[0], -1)


def _longest_runs(flag: np.ndarray) -> tuple:
    """Per column of ``flag: (steps, rows)``: the longest stretch of consecutive set
    steps, and where it starts.
    """
    run = np.zeros(flag.shape[1], np.int64)
    best, start = run.copy(), run.copy()
    for t, row in enumerate(flag):
        run = np.where(row, run + 1, 0)
        longer = run > best
        best, start = np.where(longer, run, best), np.where(longer, t - run + 1, start)
    return best, start


def _flag_problem(flag: RunFlag, info, burn_in: int) -> str | None:
    """The driver's warning for ``flag`` on this run's per-step infos, or None when it
    is not set.

    The driver's rules (:class:`~cenlmc_jax.base.RunFlag`): ``kept_only`` flags on the
    steps after ``burn_in``; the others on any step; ``every_step`` flags for a chain
    set at every step of one of the driver's chunks (of at least
    ``cj.run.WATCH_MIN_STEPS`` steps). The verdict sees neither the chunks
    (``--checkpoint-every`` changes them) nor, in infos averaged over the chains
    (``info_reduce="mean"``, the driver's default and the CLI's), which chain was set:
    it reports a stretch of ``WATCH_MIN_STEPS`` consecutive steps at each of which the
    flag is set (on some chain, for averaged infos). That contains every case the driver
    reports, whatever its chunking.
    """
    if flag.kept_only:
        # on the host (NumPy): an eager slice of a jax.Array compiles a program
        info = jax.tree_util.tree_map(lambda a: a[burn_in:], fetch(info))
        offset = burn_in
    else:
        offset = 0
    value = getattr(info, flag.field, None)
    if value is None or np.shape(value)[0] == 0:
        return None
    if flag.statistic is not None:  # kept_only: a number of the kept steps
        stat = flag.statistic(info)
        return (
            None if stat is None or stat <= flag.above else flag.message(info, offset)
        )
    if flag.rising:  # kept_only: a rate that rose between the halves of the kept steps
        z = rising_z(value)
        return None if z <= RISING_Z else flag.message(info, offset) + f" (z = {z:.3g})"
    if (
        flag.mean_below is not None
    ):  # kept_only: the mean over the kept steps below a floor
        return (
            None
            if np.mean(np.asarray(value, np.float64)) >= flag.mean_below
            else flag.message(info, offset)
        )
    rows = _rows(value)
    if not flag.every_step:
        steps = rows.any(axis=1)
        return (
            flag.message(info, offset + int(np.argmax(steps))) if steps.any() else None
        )
    longest, starts = _longest_runs(rows)
    stuck = longest >= WATCH_MIN_STEPS
    if not stuck.any():
        return None
    k = int(
        np.argmin(np.where(stuck, starts, np.iinfo(np.int64).max))
    )  # the chain whose stretch starts first
    first, last = offset + int(starts[k]), offset + int(starts[k] + longest[k]) - 1
    if np.ndim(value) > 1:  # per chain or particle
        return (
            f"{int(stuck.sum())} of {stuck.size} chains: "
            + flag.message(info, first)
            + f" (at every step of {first}..{last})"
        )
    return flag.message(info, first) + (
        f" (at every step of {first}..{last}, on some chain or particle: the infos "
        "are averaged over them, so which is not known)"
    )


def _steady_rate(flag: RunFlag, info, burn_in: int) -> float:
    """The mean over the kept steps (and chains) of a rising flag's rate."""
    value = getattr(fetch(info), flag.field, None)
    if value is None or np.shape(value)[0] <= burn_in:
        return 0.0
    return float(np.mean(np.asarray(value, np.float64)[burn_in:]))


def flag_problems(args, res, notes: list | None = None) -> list:
    """One problem per :class:`~cenlmc_jax.base.RunFlag` that the infos' class declares
    (``run_flags``) and this run set, worded as ``cj.sample``'s warning, plus the
    sampler's tuning flags on the command line. A flag that costs only efficiency
    (``efficiency_only``: CEnLMC's unused ensemble) goes to ``notes`` instead: a
    warning that names the better choice, not a failed run.
    """
    if res.info is None:
        return []
    tuning_flags = ", ".join(
        f"--{f}" for f in ("step-size",) + tuple(SPECS[args.sampler].flags)
    )
    out = []
    for flag in run_flags(res.info):
        text = _flag_problem(flag, res.info, res.burn_in)
        if text is None and flag.steady is not None and notes is not None:
            rate = _steady_rate(flag, res.info, res.burn_in)
            if rate > 0:
                kept = jax.tree_util.tree_map(
                    lambda a: a[res.burn_in :], fetch(res.info)
                )
                notes.append(f"{flag.steady(kept, rate)} [info.{flag.field}]")
        if text is not None and flag.efficiency_only:
            if notes is not None:
                notes.append(
                    f"{text} [info.{flag.field}; efficiency only: the answer "
                    "is not affected]"
                )
        elif text is not None:
            out.append(
                f"{text} [info.{flag.field}; on the command line: {tuning_flags}]"
            )
    return out


def _known_bias_problem(args, target, job, table: SummaryTable) -> list:
    h = job.parameters.get("step_size")
    sd_ula = (
        ula_sd(target, h) if SPECS[args.sampler].langevin and h is not None else None
    )
    if sd_ula is None:
        return []
    bias = np.abs(sd_ula - np.sqrt(np.diag(target.cov)))
    se = table.columns["mcse_sd"]
    if not np.any(np.isfinite(bias - se)):  # no standard error to compare with
        return []
    worst = int(np.nanargmax(bias - se))
    if not bias[worst] > se[worst]:
        return []
    return [
        f"at h={h:.4g} unadjusted Langevin's own sd of x[{worst}] is off by "
        f"{bias[worst]:.3g} (exact for this Gaussian target), more than the "
        f"standard error {se[worst]:.3g} of the estimate: the error bars "
        "understate the error; lower --step-size (the bias is proportional to h)"
    ]


def divergence_problem(args, job, res, c: float | None) -> str:
    """What a divergence means and what to change: the step size, the start, the model's
    scale.
    """
    h, parts = job.parameters.get("step_size"), []
    if h is not None:
        parts.append(
            f"h={h:.4g}" + (" from the default rule" if args.step_size is None else "")
        )
    if c is not None:
        parts.append(f"c = {c:.4g} the curvature at the mode")
    rule = f" ({', '.join(parts)})" if parts else ""
    return (
        f"DIVERGED at step {res.diverged_at} (info.diverged: non-finite or exploding "
        "values); the run stopped and its estimates are not valid. The step "
        f"size{rule} is too large where the chains are: lower --step-size, start "
        "nearer the mode (--init FILE.npy), or rescale a badly scaled model "
        "(centre and standardise its predictors and parameters: away from the "
        "mode its curvature can be orders of magnitude above c)"
    )


def problems(
    args,
    target,
    job,
    res,
    table: SummaryTable | None,
    c: float | None = None,
    bias: online.StepHalvingBias | None = None,
    notes: list | None = None,
) -> list:
    """Why the result is not to be trusted (empty: no known reason); ``table`` None: no
    draw was kept; ``c``: the curvature the step size is compared with
    (:func:`stability_problem`); ``bias``: the step-halving check of an unadjusted
    sampler (``cenlmc_jax.cli.jobs.step_halving_check``), None when it did not run;
    ``notes``: a list that what costs only efficiency, or does not change the answer, is
    appended to (printed as warnings; exit 0).

    Chains started in superchains (``cj.langevin_warmup``'s hand-over) are judged as
    many short chains (:mod:`cenlmc_jax.diagnostics.nested`), not by split R-hat. At
    least 32 chains with independent, spread starts (the built-in targets' ``N(0,
    scale² I)``) whose split R-hat is above :data:`RHAT_MAX` are judged again as many
    short chains (:func:`cenlmc_jax.diagnostics.convergence.judge_short_chains`): the
    R-hat fails the run only when the chains remember their starts, drift, or hold
    fewer than 400 effective draws per mean or 4 per chain; otherwise it is a note.
    """
    out = [f"the warm-up reported: {text}" for text in job.warmup_problems]
    if res.diverged_at >= 0:
        out.append(divergence_problem(args, job, res, c))
    out += stability_problem(args, job, c)
    out += flag_problems(args, res, notes)
    if table is None:
        out.append(
            f"no draw was kept: the run stopped after {res.num_steps_done} of the "
            f"driver's {res.burn_in} burn-in + {args.steps} steps, before its "
            "first recorded step; there are no estimates"
        )
        return out
    acc = table.run.get("acceptance_rate")
    if acc is not None and not acc >= ACCEPTANCE_MIN:
        out.append(
            f"mean acceptance rate {acc:.3f} < {ACCEPTANCE_MIN}: the chains barely "
            "move; lower --step-size"
        )
    out += _known_bias_problem(args, target, job, table)
    start = getattr(job.state, "position", None)
    out += convergence.convergence_problems(
        res, start, rhat_max=RHAT_MAX, notes=notes, many_short_chains=True
    )
    many = convergence.in_superchains(start)
    if res.trace is None and res.diverged_at < 0 and not many:  # streamed: online
        # the split R-hat of many chains with independent starts is judged again as
        # many short chains (convergence.judge_short_chains), as for a trace
        high = online.stream_problems(res.online, rhat_max=RHAT_MAX, ess_min=-math.inf)
        out += convergence.judge_short_chains(res, start, high, notes=notes)[0]
        out += online.stream_problems(res.online, rhat_max=math.inf)
    out += online.bias_problems(bias)
    for col, what in (("z_mean", "mean"), ("z_sd", "sd")):
        z = table.columns.get(col)
        if z is not None and np.any(np.abs(z) > TRUTH_Z_MAX):
            k = int(np.nanargmax(np.abs(z)))
            out.append(
                f"the {what} of x[{k}] is {abs(z[k]):.1f} standard errors from the "
                f"target's known {what} (> {TRUTH_Z_MAX:g})"
            )
    return out


def exit_status(args, found: list) -> int:
    """:data:`EXIT_UNRELIABLE` when a check failed, else 0.

    Unless ``--allow-unreliable``.
    """
    return EXIT_UNRELIABLE if found and not args.allow_unreliable else 0


# --------------------------------------------------------------------------
# The report.
# --------------------------------------------------------------------------


def print_table(table: SummaryTable, indent: str = "  ", footer: bool = True) -> None:
    print("\n".join(indent + line for line in table.format(footer=footer).splitlines()))


def _pool_text() -> str:
    """``(N XLA threads)`` on the CPU backend (``--cpu-threads``), else nothing."""
    if jax.default_backend() != "cpu":
        return ""
    n = cpu_pool_size()
    return f" ({n} XLA thread{'s' if n != 1 else ''}, --cpu-threads)"


def print_header(args, setup: Setup, record: dict) -> None:
    """Before the run: the sampler, the target and the run's size, the default step-size
    rule, the tuner.
    """
    job, target = setup.job, setup.target
    print(f"cenlmc-jax: {job.description}")
    steps = (
        f"{args.steps} steps"
        if args.steps is not None
        else "steps until the many-chain verdict holds (nested R-hat, drift, ESS >= "
        f"400; at most {MAX_DEFAULT_STEPS:,}, the first half burn-in)"
    )
    print(
        f"  target {target.name} (d={target.dim}), {args.particles} particles, "
        f"{args.burn_in} burn-in + {steps}, seed {args.seed}, backend "
        f"{jax.default_backend()}{_pool_text()}"
    )
    if setup.model is not None:
        print(
            "  NumPyro model (cj.from_numpyro): sampled on the unconstrained scale; "
            "the summary shows the constrained sites, by name (--trace on)"
        )
    if args.step_size is None and not job.warmup_steps:
        print(
            f"  default step size = {SPECS[args.sampler].step_rule}, curvature c = "
            f"{setup.c_source}"
        )
    sug = job.suggestion
    if sug is not None:
        print(
            f"  tuner: predicted ensemble fraction {sug.expected_ensemble_fraction:.2f}"
        )
        for line in sug.reasoning.splitlines():
            if "too small" in line or "unknown" in line:
                print(f"  tuner warning: {line}")
                record["warnings"].append("tuner: " + line)


def _print_gradients(args, setup: Setup, run: Run, ge: int) -> None:
    """Gradient evaluations, the audit's extra ones and its measured inflation, the
    savings against LMC.
    """
    res = run.result
    full = res.num_steps_done * args.particles
    print(f"  gradient evaluations: {ge:,} ({ge / full:.1%} of one per particle-step)")
    audit = getattr(res.info, "audit_grad_evals", None)
    audit = int(np.sum(np.asarray(audit))) if audit is not None else 0
    if audit:
        v = _mean_inflation(res, run.burn_in)
        print(
            f"  gradient audit: {audit:,} more ({audit / full:.1%}); ensemble-noise "
            f"variance inflation {v:.3f} (the sd off by "
            f"~{math.sqrt(max(1 + v, 0.0)) - 1:.1%}; flagged above "
            f"{ensemble.AUDIT_BIAS_THRESHOLD:g})"
        )
    if SPECS[args.sampler].ensemble:
        saved = full - ge - audit
        print(
            f"  saved against LMC (N gradients per step): {saved:,} "
            f"({saved / full:.1%}, the audit's included)"
        )


def _print_run(args, setup: Setup, run: Run, table: SummaryTable | None) -> None:
    res, job = run.result, setup.job
    warm = f" after {job.warmup_steps} warm-up steps" if job.warmup_steps else ""
    print(
        f"  ran {res.num_steps_done} steps{warm} in {run.seconds:.2f} s (compilation "
        "included)"
    )
    if table is None:
        print("  no estimates: no draw was kept")
        return
    if "grad_evals" in table.run:
        _print_gradients(args, setup, run, table.run["grad_evals"])
    if "acceptance_rate" in table.run:
        print(f"  mean acceptance rate {table.run['acceptance_rate']:.3f}")
    if "ensemble_fraction" in table.run:
        print(
            f"  ensemble force used by {table.run['ensemble_fraction']:.1%} of "
            "particle-steps after burn-in"
        )
    if run.bias is not None:
        _print_bias_check(res, run.bias)
    print(
        "  estimates over kept steps and particles:"
        if res.trace is None
        else "  estimates over the kept draws:"
    )
    print_table(table, footer=False)


def _run_gradients(res) -> int:
    """Gradients of the run: ``info.grad_evals`` when counted, else one per chain or
    particle and step."""
    evals = getattr(res.info, "grad_evals", None)
    if evals is not None:
        return int(np.sum(np.asarray(evals)))
    return int(np.prod(np.shape(res.state.position)[:-1]) or 1) * res.num_steps_done


def _print_bias_check(res, check: online.StepHalvingBias) -> None:
    """The step-halving check's run and its extra gradient cost."""
    main = _run_gradients(res)
    share = f" ({check.grad_evals / main:.0%} of the run's)" if main else ""
    worst = np.nanmax(
        np.abs(np.concatenate([check.bias_mean, check.bias_sq]))
        / np.concatenate([check.se_mean, check.se_sq])
    )
    print(
        f"  step-halving bias check: h/2 = {check.step_size / 2:.4g} from the final "
        f"ensemble, {check.burn_in} relaxation + {check.num_steps} steps, "
        f"{check.grad_evals:,} more gradients{share}; largest |bias| / se "
        f"{worst:.2f} (flagged above z = {check.z:.2f})"
    )


def _bias_record(check: online.StepHalvingBias) -> dict:
    """run.json's ``bias_check``: what the step-halving check measured."""
    return dict(
        step_size=check.step_size,
        burn_in=check.burn_in,
        num_steps=check.num_steps,
        grad_evals=check.grad_evals,
        z=check.z,
        bias_mean=np.asarray(check.bias_mean).tolist(),
        se_mean=np.asarray(check.se_mean).tolist(),
        bias_sq=np.asarray(check.bias_sq).tolist(),
        se_sq=np.asarray(check.se_sq).tolist(),
    )


def checks_made(
    args,
    target,
    res,
    table: SummaryTable | None,
    bias: online.StepHalvingBias | None = None,
    bias_note: str | None = None,
    many: bool = False,
    short: bool = False,
) -> tuple[list, list]:
    """The checks :func:`problems` made on this run, and those it could not make.

    The verdict names both: a check that did not run is never reported as passed (a
    streamed run's R-hat and ESS are computed online, ``RunResult.online``, resumed
    or not, with at least 4 kept draws per chain; the step-size bias of unadjusted
    Langevin is known exactly only on a Gaussian target, and measured on any by the
    step-halving check unless ``--no-bias-check``).

    Args:
      args: the parsed command line.
      target: the run's target.
      res: the ``RunResult``.
      table: the summary of the kept draws, None when none was kept.
      bias: the step-halving check, None when it did not run.
      bias_note: why it did not run (None: it ran, or does not apply).
      many: the chains started in superchains (the many-chain verdict).
      short: the chains have independent, spread starts, at least 32 of them: a split
        R-hat above :data:`RHAT_MAX` is judged again as many short chains.

    Returns:
      ``(made, not_made)``: two lists of short descriptions.
    """
    made = [
        "divergence",
        "step-size stability",
        "the sampler's flags: ensemble-force audit and the others, ensemble use",
    ]
    if table is None:
        return made, ["the estimates (no draw was kept)"]
    not_made = []
    if table.run.get("acceptance_rate") is not None:
        made.append("acceptance")
    if SPECS[args.sampler].langevin and getattr(target, "hessian", None) is not None:
        made.append("the step size's known bias")
    if bias is not None:
        made.append("step-size bias by step halving")
    elif bias_note is not None:
        not_made.append(f"the step size's bias by step halving ({bias_note})")
    made.append("frozen chains")
    if many:
        made.append("many chains: nested R-hat, the ensemble's drift, ESS")
    elif isinstance(res.trace, (jax.Array, np.ndarray)):
        made.append("R-hat, bulk ESS")
    elif res.online is not None:
        made.append("split R-hat and ESS (online, streamed)")
    else:
        not_made.append(
            "R-hat and ESS (a streamed run's online statistics need 4 kept draws "
            "per chain and no divergence; --trace)"
        )
    if short and not many and (res.online is not None or res.trace is not None):
        made.append(
            f"a split R-hat above {RHAT_MAX:g} judged as many short chains: start "
            "memory, drift, ESS, effective draws per chain"
        )
    if table.columns.get("z_mean") is not None:
        made.append("known truth")
    return made, not_made


def print_verdict(args, found: list, checked: tuple[list, list] | None = None) -> None:
    for p in found:
        print(f"  UNRELIABLE: {p}")
    if not found:
        made, not_made = checked if checked is not None else ([], [])
        print(RELIABLE + (f" ({', '.join(made)})" if made else ""))
        if not_made:
            print(f"  not checked: {'; '.join(not_made)}")
    elif args.allow_unreliable:
        print("  (--allow-unreliable: exit status 0 all the same)")


_STRETCH = re.compile(
    r"^(\d+) of (\d+) chains: (.*) \(at every step of (\d+)\.\.(\d+)\)$"
)


def merge_stretches(messages: list) -> list:
    """The driver's warnings with those that differ only in how many chains and which
    stretch of steps (``"K of M chains: ... (at every step of a..b)"``, one per chunk
    or ``cj.sample_until`` segment in which some chains were stuck) merged into one
    line: the most chains at once, the number of stretches and the steps they span.
    The others are kept as they are, in order.

    Args:
      messages: the warnings' texts.

    Returns:
      The texts to print.
    """
    groups, order = {}, []
    for message in messages:
        m = _STRETCH.match(message)
        if m is None:
            order.append((False, message))
            continue
        k, n, text, lo, hi = m.groups()
        if (text, n) not in groups:
            groups[text, n] = [int(k), 0, int(lo), int(hi)]
            order.append((True, (text, n)))
        g = groups[text, n]
        g[0], g[1] = max(g[0], int(k)), g[1] + 1
        g[2], g[3] = min(g[2], int(lo)), max(g[3], int(hi))
    out = []
    for grouped, item in order:
        if not grouped:
            out.append(item)
            continue
        (text, n), (k, count, lo, hi) = item, groups[item]
        out.append(
            f"{k} of {n} chains: {text} (at every step of {lo}..{hi})"
            if count == 1
            else f"up to {k} of {n} chains at once: {text} (at every step of "
            f"{count} stretches within steps {lo}..{hi})"
        )
    return out


def report(args, setup: Setup, run: Run, record: dict) -> tuple:
    """After the run: everything it measured and the verdict; ``(summary table,
    problems)``.
    """
    for message in merge_stretches(run.warnings):
        print(f"  warning: {message}")
        record["warnings"].append(message)
    target, table = setup.target, None
    few = run.result.trace is not None and 0 < kept_steps(run.result) < 4
    if few:
        # a run stopped by a divergence after its first kept step or so: what was
        # kept is written, but split R-hat and the summary need 4 draws per chain
        message = (
            f"only {kept_steps(run.result)} kept draw(s) per chain before the run "
            "stopped: too few for a summary (it needs 4)"
        )
        print(f"  warning: {message}")
        record["warnings"].append(message)
    elif not no_draws(run.result):
        res, labels = shown(
            setup, run.result
        )  # a NumPyro model: its constrained sites, by name
        start = getattr(setup.job.state, "position", None)
        in_blocks = start is not None and convergence.in_superchains(start)
        table = summary(
            res,
            truth=target if target.mean is not None else None,
            burn_in=run.burn_in,
            labels=labels,
            # chains started in superchains (the exact default's hand-over): the
            # nested R-hat column beside split R-hat
            superchain_size=nested.superchain_size(start) if in_blocks else None,
        )
    _print_run(args, setup, run, table)
    notes = []
    found = problems(
        args,
        target,
        setup.job,
        run.result,
        table,
        c=setup.c,
        bias=run.bias,
        notes=notes,
    )
    for message in notes:
        print(f"  warning: {message}")
        record["warnings"].append(message)
    start = getattr(setup.job.state, "position", None)
    many = convergence.in_superchains(start)
    short = convergence.independent_starts(start) is not None
    checked = checks_made(
        args, target, run.result, table, run.bias, run.bias_note, many=many, short=short
    )
    if run.bias is not None:
        record["bias_check"] = _bias_record(run.bias)
    record["checks"], record["not_checked"] = checked
    print_verdict(args, found, checked)
    return table, found


#: The fields of run.json that cmd_summary reads, and their JSON types (None allowed).
_RECORD_FIELDS = {
    "description": str,
    "sampler": str,
    "target": dict,
    "seed": int,
    "steps_done": int,
    "version": str,
    "summary_run": dict,
    "summary_notes": list,
    "problems": list,
    "reliable": bool,
    "checks": list,
    "not_checked": list,
    "kept_steps": int,
}


def _read_record(folder: str) -> dict:
    """A run folder's run.json, its fields checked (a usage error naming the file if it
    is damaged).
    """
    path = os.path.join(folder, "run.json")
    try:
        with open(path, encoding="utf-8") as fh:
            record = json.load(fh)
    except (
        OSError,
        ValueError,
    ) as exc:  # ValueError: JSONDecodeError, UnicodeDecodeError
        raise UsageError(
            f"{path}: damaged, not the run.json of cenlmc-jax sample "
            f"({type(exc).__name__}: {exc})"
        ) from None
    if not isinstance(record, dict):
        raise UsageError(
            f"{path}: damaged, not the run.json of cenlmc-jax sample (a JSON "
            f"{type(record).__name__}, not an object)"
        )
    for key, kind in _RECORD_FIELDS.items():
        value = record.get(key)
        if value is not None and (
            not isinstance(value, kind) or (kind is int and isinstance(value, bool))
        ):
            raise UsageError(
                f"{path}: damaged: {key} should be a JSON {kind.__name__}; got "
                f"{value!r}"
            )
    if not all(isinstance(p, str) for p in record.get("problems") or ()):
        raise UsageError(f"{path}: damaged: problems should be a list of strings")
    return record


def _read_table(folder: str, record: dict) -> SummaryTable | None:
    """A run folder's summary.csv with run.json's run statistics and notes (None: no
    draw was kept).
    """
    path = os.path.join(folder, "summary.csv")
    if not os.path.isfile(path):
        if record.get("kept_steps") == 0:
            return None
        raise UsageError(
            f"{folder}: no summary.csv (not a finished cenlmc-jax sample --out "
            "directory)"
        )
    try:
        table = SummaryTable.from_csv(
            path,
            run=record.get("summary_run"),
            notes=tuple(str(n) for n in record.get("summary_notes") or ()),
        )
    except (OSError, ValueError, IndexError, csv.Error) as exc:
        raise UsageError(
            f"{path}: damaged, not the summary.csv of cenlmc-jax sample "
            f"({type(exc).__name__}: {exc})"
        ) from None
    try:
        table.format()
    except (
        Exception
    ) as exc:  # columns of the csv and statistics of run.json that do not fit together
        raise UsageError(
            f"{path} and {os.path.join(folder, 'run.json')} do not fit together "
            f"(damaged: {type(exc).__name__}: {exc})"
        ) from None
    return table


def cmd_summary(args) -> int:
    """``cenlmc-jax summary DIR``: a finished run's report and verdict, from its
    summary.csv and run.json.
    """
    folder = args.dir
    missing = [
        name
        for name in ("summary.csv", "run.json")
        if not os.path.isfile(os.path.join(folder, name))
    ]
    if "run.json" in missing:
        raise UsageError(
            f"{folder}: no {' or '.join(missing)} (not a finished cenlmc-jax sample "
            "--out directory)"
        )
    record = _read_record(folder)
    table = _read_table(folder, record)
    print(f"cenlmc-jax: {record.get('description') or record.get('sampler')}")
    tgt = record.get("target") or {}
    print(
        f"  target {tgt.get('name')} (d={tgt.get('dim')}), seed {record.get('seed')}, "
        f"{record.get('steps_done')} steps done, {record.get('version')}"
    )
    if table is None:
        print("  no estimates: no draw was kept")
    else:
        print_table(table)
    for p in record.get("problems") or ():
        print(f"  UNRELIABLE: {p}")
    if record.get("reliable"):
        made, not_made = record.get("checks") or [], record.get("not_checked") or []
        print(RELIABLE + (f" ({', '.join(made)})" if made else ""))
        if not_made:
            print(f"  not checked: {'; '.join(not_made)}")
    return 0
