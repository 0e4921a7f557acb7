"""posteriordb conformance: every sampler at its documented default workflow, on ten
posteriors nobody here wrote.

For each posterior of :mod:`cenlmc_jax.models.posteriordb` (the model in JAX on Stan's
unconstrained scale; reference means and sds from posteriordb's 10 x 1,000 NUTS draws)
and each sampler below, one run from the same starts (uniform(-2, 2) on the
unconstrained scale, Stan's default), judged on the reference's quantities (the
constrained parameters and the transformed ones it reports):

* **pass**: every quantity's mean within ``0.1·ref_sd + 3·MCSE`` (MCSE = the run's sd /
  sqrt(bulk ESS) of that quantity, cj.diagnostics) and its sd within 10 % of the
  reference's;
* **flagged**: not a pass, and the run said so: a warning was raised anywhere in the
  workflow (captured: divergence, frozen chains, CEnLMC's audit, the tuner, a new
  convergence warning), or it raised an error;
* **silently wrong**: not a pass and nothing said so.

The workflows (README "Warm-up adaptation" and
cenlmc_jax/adaptation/window_adaptation.py), with ``C`` chains:

* ``nuts`` (the reference workflow): BlackJAX 1.7.1
  ``window_adaptation(blackjax.nuts)``, per chain (vmapped), then NUTS; gradients =
  leapfrog steps (warm-up included).
* ``mala``, ``rwmh``, ``gamma`` (the irreversible jump sampler with the Gamma proposal,
  the CLI's ``irreversible-mh``): ``cj.adaptation.window_adaptation(kind,
  logp).run_chains`` (pooled chains), then ``cj.vmap_chains(warmup.sampler(params))``
  from the warm-up's states.
* ``lmc`` and ``cenlmc`` (d <= 5 only): ``cj.langevin_warmup(sampler=...)`` over
  ``warmup`` steps (README "Badly scaled posteriors"; the CLI's default for
  ``--model``): the Laplace start, Stan's windows of preconditioned LMC, the step size
  for a bias of 0.05 in the whitened coordinates, and for CEnLMC the suggested
  parameters in them; then ``wu.algorithm`` from ``wu.state`` for the CLI's default run
  length, ``max(lmc_draws, 16 tau / (1.1^2 - 1))`` with ``tau`` the warm-up's relaxation
  time (at most 20,000; ``cenlmc_jax.cli.jobs.default_steps``), thinned to about
  ``draws`` kept draws per chain. LMC runs the ``C`` chains; CEnLMC the CLI's 2,000
  particles (``particles``) from Stan's uniform(-2, 2) starts, each particle counting as
  a chain. Gradients: the warm-up's (its LMC steps, 2 per Hessian-vector product, 1 per
  L-BFGS iteration) and the run's.
* ``sgld``, ``sghmc``: the step size of the library's rule,
  ``langevin_step_size(max_curvature(...), sampler=..., bias=0.05)`` with the curvature
  taken at the states of the ``mala`` warm-up (as the ``max_curvature`` docstring says;
  that warm-up's gradients and CPU time are counted in these cells too); then the
  sampler from those states, a burn-in and the draws, with the full-batch gradient
  (``cj.gradients.grad_estimator_from_logdensity``), SGHMC friction 1. No
  preconditioner: these take none.

CPU time is ``time.process_time`` over the whole workflow, compilation included (every
cell compiles its own
programs: on small runs compilation is a large share, so the CPU ratios are upper bounds
  for long runs). The
machine is shared (2 cores, other jobs running): CPU times are noisy, to ~30 %. One run
per cell, no repeats (``--size full`` is the run to quote).

Run: ``python benchmarks/bench_posteriordb.py --size small|full [--only NAME ...]
  [--samplers a,b]``.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
import traceback
import warnings
from pathlib import Path

import jax

jax.config.update(
    "jax_enable_x64", True
)  # gp_pois_regr's Cholesky needs it; every model runs in float64

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from _common import RESULTS_DIR, write_results  # noqa: E402

import cenlmc_jax as cj  # noqa: E402
from cenlmc_jax import posteriordb as pdb  # noqa: E402

SIZES = {
    # chains, warm-up steps (MH and NUTS warm-ups, cj.langevin_warmup, SG burn-in),
    # draws kept, CEnLMC particles, the Langevin samplers' least run length
    "small": dict(chains=8, warmup=500, draws=1000, particles=2000, lmc_draws=2000),
    "full": dict(chains=16, warmup=1000, draws=5000, particles=2000, lmc_draws=10000),
}
#: the small size on a posterior with d > BIG_D (diamonds, d = 26, whose NUTS runs
#: ~1,000 leapfrog steps per draw) uses these instead, to keep the small run near 15
#: minutes on the shared 2-core machine
SMALL_BIG = dict(chains=4, warmup=300, draws=300, lmc_draws=1000)
BIG_D = 20
SAMPLERS = ("nuts", "mala", "rwmh", "gamma", "lmc", "sgld", "sghmc", "cenlmc")
CENLMC_MAX_D = 5


# --------------------------------------------------------------------------------------
# judging a run


_CONSTRAIN = {}


def _constrain_draws(post):
    """``(C, n, d) -> (C, n, k)``, compiled once per posterior."""
    if post.name not in _CONSTRAIN:
        _CONSTRAIN[post.name] = jax.jit(jax.vmap(jax.vmap(post.constrain_array)))
    return _CONSTRAIN[post.name]


def judge(post, draws: np.ndarray, warned: list, error: str | None) -> dict:
    """``draws: (chains, draws, d)`` unconstrained -> the verdict and per-quantity
    figures (module docstring)."""
    out = {"warnings": warned, "error": error}
    if draws is None or not np.all(np.isfinite(draws)):
        out.update(
            status="flagged" if (warned or error) else "silently wrong",
            reason="no finite draws",
        )
        return out
    q = np.asarray(_constrain_draws(post)(jnp.asarray(draws)))  # (C, n, k)
    flat = q.reshape(-1, q.shape[-1])
    mean, sd = flat.mean(axis=0), flat.std(axis=0, ddof=1)
    # axes given: CEnLMC's particles start from repeated warm-up states, so neighbouring
    # 'chains' are alike
    ess = np.asarray(
        cj.diagnostics.effective_sample_size(
            q, chain_axis=0, sample_axis=1, method="bulk"
        )
    )
    rhat = np.asarray(
        cj.diagnostics.potential_scale_reduction(q, chain_axis=0, sample_axis=1)
    )
    mcse = sd / np.sqrt(np.maximum(ess, 1.0))
    mean_ok = np.abs(mean - post.ref_mean) <= 0.1 * post.ref_sd + 3.0 * mcse
    sd_ok = np.abs(sd / post.ref_sd - 1.0) <= 0.10
    ok = bool(np.all(mean_ok & sd_ok))
    bad = [
        n for n, a, b in zip(post.names, mean_ok, sd_ok, strict=True) if not (a and b)
    ]
    status = "pass" if ok else ("flagged" if (warned or error) else "silently wrong")
    out.update(
        status=status,
        failed=bad,
        max_rhat=float(np.nanmax(rhat)),
        min_ess=float(np.nanmin(ess)),
        max_abs_z=float(
            np.max(np.abs(mean - post.ref_mean) / np.maximum(mcse, 1e-300))
        ),
        max_sd_error=float(np.max(np.abs(sd / post.ref_sd - 1.0))),
        ess_total=float(np.sum(ess)),
    )
    return out


# --------------------------------------------------------------------------------------
# the workflows


def starts(key, chains, d):
    return jax.random.uniform(key, (chains, d), jnp.float64, -2.0, 2.0)


def run_nuts(post, x0, key, size, cache):
    import blackjax

    warmup = blackjax.window_adaptation(blackjax.nuts, post.logdensity_fn)
    keys = jax.random.split(key, x0.shape[0] + 1)

    @jax.jit
    def one_chain(k, x):
        k1, k2 = jax.random.split(k)
        (state, params), winfo = warmup.run(k1, x, size["warmup"])
        kernel = blackjax.nuts(post.logdensity_fn, **params)

        def step(s, kk):
            s, info = kernel.step(kk, s)
            return s, (s.position, info.num_integration_steps, info.is_divergent)

        _, (pos, n_int, div) = jax.lax.scan(
            step, state, jax.random.split(k2, size["draws"])
        )
        return (
            pos,
            jnp.sum(winfo.info.num_integration_steps) + jnp.sum(n_int),
            jnp.sum(div),
            params["step_size"],
        )

    pos, grads, div, eps = jax.vmap(one_chain)(keys[1:], x0)
    if int(np.sum(div)):
        warnings.warn(
            f"NUTS: {int(np.sum(div))} divergent transitions",
            RuntimeWarning,
            stacklevel=1,
        )
    return (
        np.asarray(pos),
        int(np.sum(grads)),
        {"step_size": np.asarray(eps).round(4).tolist()},
    )


def mh_warmup(kind, post, x0, key, size, cache):
    warm = cj.adaptation.window_adaptation(kind, post.logdensity_fn)
    (states, params), info = warm.run_chains(key, x0, num_steps=size["warmup"])
    return warm, states, params, info


def run_mh(kind):
    grads_per_step = {"mala": 1, "rwmh": 0, "gamma": 0}[kind]

    def run(post, x0, key, size, cache):
        k1, k2 = jax.random.split(key)
        t0 = time.process_time()
        warm, states, params, _ = mh_warmup(kind, post, x0, k1, size, cache)
        if kind == "mala":
            cache["mala_warmup"] = (states, params, time.process_time() - t0)
        algo = cj.vmap_chains(warm.sampler(params))
        res = cj.sample(k2, algo, states, size["draws"], chunk_size=size["draws"])
        draws = np.asarray(res.trace).swapaxes(0, 1)
        grads = grads_per_step * x0.shape[0] * (size["warmup"] + size["draws"])
        eps = params.get("step_size", params.get("scale"))
        return (
            draws,
            grads,
            {
                "step_size": np.round(np.asarray(eps), 5).tolist(),
                "acceptance": float(np.mean(res.info.acceptance_rate)),
            },
        )

    return run


def langevin_rule(post, x0, key, size, cache, sampler):
    """The library's step-size rule at the MALA warm-up's states: (states, params, h, c,
    gradients spent)."""
    k1, k2 = jax.random.split(key)
    if "mala_warmup" not in cache:
        t0 = time.process_time()
        warm, states, params, _ = mh_warmup("mala", post, x0, k1, size, cache)
        cache["mala_warmup"] = (states, params, time.process_time() - t0)
    states, params, warmup_cpu = cache["mala_warmup"]
    cache["shared_cpu_s"] = (
        warmup_cpu  # the MALA warm-up's CPU time, added to this cell's (run_cell)
    )
    est = cj.gradients.grad_estimator_from_logdensity(post.logdensity_fn)
    c = float(cj.adaptation.max_curvature(est, states.position, k2))
    h = cj.adaptation.langevin_step_size(c, sampler=sampler, bias=0.05)
    spent = (
        x0.shape[0] * size["warmup"] + x0.shape[0] * 2 * 31
    )  # the MALA warm-up; 31 HVPs of 2 gradients each
    return states, params, h, c, spent


def run_sg(name):
    def run(post, x0, key, size, cache):
        k1, k2 = jax.random.split(key)
        states, _, h, c, spent = langevin_rule(post, x0, k1, size, cache, name)
        est = cj.gradients.grad_estimator_from_logdensity(post.logdensity_fn)
        algo = cj.vmap_chains(
            cj.sgld(est, h) if name == "sgld" else cj.sghmc(est, h, friction=1.0)
        )
        n, burn = size["lmc_draws"], size["warmup"]
        res = cj.sample(
            k2,
            algo,
            algo.init(states.position),
            n,
            burn_in=burn,
            chunk_size=min(n, 1000),
        )
        draws = np.asarray(res.trace).swapaxes(0, 1)
        grads = spent + x0.shape[0] * (burn + n)
        return draws, grads, {"step_size": h, "curvature": c}

    return run


def run_warmed(sampler):
    """LMC or CEnLMC after ``cj.langevin_warmup`` (module docstring)."""
    from cenlmc_jax.cli.jobs import MAX_DEFAULT_STEPS, RHAT_TARGET

    def run(post, x0, key, size, cache):
        k1, k2, k3 = jax.random.split(key, 3)
        positions = x0 if sampler == "lmc" else starts(k1, size["particles"], post.d)
        wu = cj.langevin_warmup(
            k2, post.logdensity_fn, positions, sampler=sampler, num_steps=size["warmup"]
        )
        i = wu.info
        tau = i.relaxation_steps
        steps = size["lmc_draws"]
        if math.isfinite(tau) and tau > 0:
            steps = max(
                steps,
                min(MAX_DEFAULT_STEPS, math.ceil(16.0 * tau / (RHAT_TARGET**2 - 1.0))),
            )
        thin = max(1, steps // size["draws"])
        steps = -(-steps // thin) * thin
        res = cj.sample(
            k3,
            wu.algorithm,
            wu.state,
            steps,
            thin=thin,
            chunk_size=min(steps, 100 * thin),
        )
        draws = np.asarray(res.trace).swapaxes(0, 1)
        run_grads = (
            int(np.sum(np.asarray(res.info.grad_evals, np.int64)))
            if sampler == "cenlmc"
            else positions.shape[0] * steps
        )
        grads = i.grad_evals + 2 * i.hvp_evals + i.lbfgs_steps + run_grads
        extra = {
            "step_size": round(i.step_size, 5),
            "curvature": round(i.curvature, 3),
            "condition_number": float(f"{i.condition_number:.3g}"),
            "relaxation": round(tau, 1),
            "steps": steps,
        }
        if sampler == "cenlmc":
            extra["ensemble_fraction"] = round(
                float(np.mean(res.info.ensemble_fraction)), 3
            )
            extra["expected_ensemble_fraction"] = round(
                i.cenlmc["expected_ensemble_fraction"], 3
            )
            extra["params"] = {
                k: float(wu.parameters[k]) for k in ("eta", "r1", "r2", "n_star", "m_f")
            }
        return draws, grads, extra

    return run


WORKFLOWS = {
    "nuts": run_nuts,
    "mala": run_mh("mala"),
    "rwmh": run_mh("rwmh"),
    "gamma": run_mh("gamma"),
    "lmc": run_warmed("lmc"),
    "sgld": run_sg("sgld"),
    "sghmc": run_sg("sghmc"),
    "cenlmc": run_warmed("cenlmc"),
}


def run_cell(sampler, post, x0, key, size, cache) -> dict:
    t0, w0 = time.process_time(), time.perf_counter()
    draws, grads, extra, error = None, None, {}, None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            draws, grads, extra = WORKFLOWS[sampler](post, x0, key, size, cache)
        except (
            Exception
        ) as err:  # a workflow that raises is "flagged": it said something
            error = f"{type(err).__name__}: {str(err)[:300]}"
            traceback.print_exc(limit=2)
    cpu, wall = (
        time.process_time() - t0 + cache.pop("shared_cpu_s", 0.0),
        time.perf_counter() - w0,
    )
    warned = sorted(
        {
            f"{w.category.__name__}: {str(w.message)[:200]}"
            for w in caught
            if not issubclass(w.category, DeprecationWarning)
        }
    )
    row = {
        "posterior": post.name,
        "sampler": sampler,
        "d": post.d,
        "grad_evals": grads,
        "cpu_s": cpu,
        "wall_s": wall,
    }
    row.update(judge(post, draws, warned, error))
    row["details"] = extra
    return row


# --------------------------------------------------------------------------------------
# the report


def commit() -> str:
    """HEAD's short hash, and the library files changed in the working tree (other
    engineers' edits in progress)."""
    git = lambda *a: subprocess.run(
        ["git", *a],
        capture_output=True,
        text=True,  # noqa: E731
        cwd=Path(__file__).parent,
        check=True,
    ).stdout.rstrip()
    try:
        dirty = git("status", "--porcelain", "--", "../cenlmc_jax").splitlines()
        head = git("rev-parse", "--short", "HEAD").strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + (
        f" + uncommitted changes in {', '.join(x[3:] for x in dirty)}" if dirty else ""
    )


def fmt_ratio(x):
    return (
        "-"
        if x is None or not math.isfinite(x)
        else (f"{x:.2g}" if x < 10 else f"{x:.0f}")
    )


def per_ess(r) -> float | None:
    """Gradients per effective draw of the worst quantity (its bulk ESS), for a run that
    passed."""
    ok = (
        r is not None and r["status"] == "pass" and r.get("min_ess") and r["grad_evals"]
    )
    return r["grad_evals"] / r["min_ess"] if ok else None


def matrix_rows(rows, samplers):
    by = {(r["posterior"], r["sampler"]): r for r in rows}
    out = []
    for name in dict.fromkeys(r["posterior"] for r in rows):
        nuts = by.get((name, "nuts"))
        line = {"posterior": name, "d": by[next(k for k in by if k[0] == name)]["d"]}
        for s in samplers:
            r = by.get((name, s))
            if r is None:
                line[s] = "n/a"
                continue
            g = (
                r["grad_evals"] / nuts["grad_evals"]
                if nuts and nuts["grad_evals"] and r["grad_evals"]
                else None
            )
            e = (
                per_ess(r) / per_ess(nuts)
                if g is not None and per_ess(r) and per_ess(nuts)
                else None
            )
            t = r["cpu_s"] / nuts["cpu_s"] if nuts else None
            cell = {
                "pass": "pass",
                "flagged": "FLAGGED",
                "silently wrong": "**SILENTLY WRONG**",
            }[r["status"]]
            if r["status"] == "pass" and (r["warnings"] or r["error"]):
                # right, and warned anyway (a conservative warning, e.g. an ESS floor)
                cell = "pass*"
            line[s] = (
                cell
                if s == "nuts"
                else f"{cell} (g {fmt_ratio(g)}, e {fmt_ratio(e)}, t {fmt_ratio(t)})"
            )
        out.append(line)
    return out


def detail_table(rows) -> str:
    lines = [
        "| posterior | sampler | status | grads | cpu s | max R-hat | min ESS | max "
        "abs z | max sd err | failed | warnings / error | chosen |",
        "|" + "---|" * 12,
    ]
    for r in rows:
        w = "; ".join(r["warnings"]) + ("; " + r["error"] if r.get("error") else "")
        det = r["details"]
        chosen = ", ".join(
            f"{k}={v}"
            for k, v in det.items()
            if k
            in (
                "step_size",
                "curvature",
                "acceptance",
                "condition_number",
                "relaxation",
                "steps",
                "ensemble_fraction",
                "expected_ensemble_fraction",
            )
        )
        fmt = lambda v, p=3: "-" if v is None else f"{v:.{p}g}"  # noqa: E731
        lines.append(
            f"| {r['posterior']} | {r['sampler']} | {r['status']} | {r['grad_evals']} "
            f"| {r['cpu_s']:.1f} | {fmt(r.get('max_rhat'))} | {fmt(r.get('min_ess'))} "
            f"| {fmt(r.get('max_abs_z'))} | {fmt(r.get('max_sd_error'), 2)} | "
            f"{', '.join(r.get('failed', [])[:4])} | {w[:300].replace('|', '/')} | "
            f"{chosen[:160]} |"
        )
    return "\n".join(lines) + "\n"


def report(
    rows,
    args,
    base_size,
    samplers,
    head,
    wall_s,
    complete,
    rerendered_from=None,
    run_machine=None,
):
    """Write results/posteriordb.{json,md} for the rows so far (after every posterior: a
    run stopped keeps them)."""
    counts = {
        k: sum(r["status"] == k for r in rows if r["sampler"] != "nuts")
        for k in ("pass", "flagged", "silently wrong")
    }
    notes = [
        f"Size `{args.size}` ({base_size}; at the small size d > {BIG_D} uses "
        f"{SMALL_BIG}).",
        f"Library commit `{head}` (main at the start of the run).",
        "Cell: pass / pass* (passed, and warned anyway) / FLAGGED / **SILENTLY WRONG** "
        "(module docstring of benchmarks/bench_posteriordb.py), then `g` = gradient "
        "evaluations / NUTS's, `e` = gradients per effective draw (of the quantity "
        "with the smallest bulk ESS; passed cells only) / NUTS's, and `t` = CPU time / "
        "NUTS's on the same posterior (whole workflow, warm-up and compilation "
        "included; RW-MH and the Gamma sampler use no gradients: g -). CEnLMC runs "
        "only where d <= 5 (n/a elsewhere).",
        "Pass: every reference quantity's mean within 0.1 ref_sd + 3 MCSE and sd "
        "within 10 %. At the small size a correct sampler with a bulk ESS near 100 can "
        "miss the sd criterion by noise (MCSE of an sd ~ sd/sqrt(2 ESS) = 7 %): the "
        "detail table gives min ESS and max sd error beside each verdict.",
        f"Totals over the library's cells (NUTS excluded): {counts}."
        + (
            ""
            if complete
            else " (INCOMPLETE: the run was stopped; the posteriors listed are those "
            "done)"
        ),
        "Shared 2-core machine, other jobs running: CPU times are noisy (~30 %), one "
        "run per cell.",
    ]
    nuts_of = {r["posterior"]: r for r in rows if r["sampler"] == "nuts"}
    mala = [r for r in rows if r["sampler"] == "mala"]
    within = sum(
        1
        for r in mala
        if per_ess(r)
        and per_ess(nuts_of.get(r["posterior"]))
        and per_ess(r) <= 1.5 * per_ess(nuts_of[r["posterior"]])
    )
    notes.insert(
        -1,
        f"MALA within 1.5x NUTS's gradients per effective draw (e <= 1.5): {within} of "
        f"{len(mala)} posteriors (issue 18's goal: at least half).",
    )
    if rerendered_from:
        ended = (
            f" (which ended {run_machine['date_utc']} at load "
            f"{run_machine['load_average_1_5_15']})"
            if run_machine
            else ""
        )
        notes.append(
            "These tables were written again (`--from-json`, the machine line above "
            "is that of the rewrite) from the rows of the run "
            f"`{rerendered_from}`{ended}; reproduce with that command."
        )
    payload = {
        "size": args.size,
        "sizes": base_size,
        "small_big": SMALL_BIG,
        "commit": head,
        "samplers": samplers,
        "counts": counts,
        "total_wall_s": wall_s,
        "complete": complete,
    }
    _, md_path = write_results(
        "posteriordb",
        payload,
        rows,
        out_dir=args.out_dir,
        notes=notes,
        command=rerendered_from,
        title="posteriordb conformance: posterior x sampler at the default workflows",
        md_rows=matrix_rows(rows, samplers),
        columns=["posterior", "d", *samplers],
    )
    with open(md_path, "a") as f:
        f.write("\n## Per cell\n\n" + detail_table(rows))
    return md_path


def main():
    parser = argparse.ArgumentParser(
        description=" ".join(__doc__.split("\n\n")[0].split())
    )
    parser.add_argument("--size", choices=tuple(SIZES), default="small")
    parser.add_argument(
        "--only", nargs="*", default=None, help="posteriordb names (default: all ten)"
    )
    parser.add_argument("--samplers", default=",".join(SAMPLERS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out-dir", type=Path, default=RESULTS_DIR)
    parser.add_argument(
        "--from-json",
        type=Path,
        default=None,
        help="write the tables again from an earlier run's posteriordb.json (no "
        "sampling)",
    )
    args = parser.parse_args()
    if args.from_json is not None:
        old = json.loads(args.from_json.read_text())
        args.size = old["size"]
        md = report(
            old["rows"],
            args,
            old["sizes"],
            old["samplers"],
            old["commit"],
            old["total_wall_s"],
            old["complete"],
            rerendered_from=old.get("command", str(args.from_json)),
            run_machine=old.get("machine"),
        )
        print(f"wrote {md} from {args.from_json}")
        return 0
    size = SIZES[args.size]
    samplers = [s for s in args.samplers.split(",") if s]
    for s in samplers:
        if s not in WORKFLOWS:
            parser.error(f"--samplers: {s!r} is not one of {', '.join(SAMPLERS)}")
    names = args.only or sorted(
        pdb.NAMES, key=lambda n: pdb.load(n).d
    )  # the cheapest first, diamonds last
    rows, t_start = [], time.perf_counter()
    base_size, head = size, commit()
    for i, name in enumerate(names):
        post = pdb.load(name)
        size = (
            base_size | SMALL_BIG
            if args.size == "small" and post.d > BIG_D
            else base_size
        )
        x0 = starts(
            jax.random.fold_in(jax.random.key(args.seed), i), size["chains"], post.d
        )
        cache = {}
        for j, s in enumerate(samplers):
            if s == "cenlmc" and post.d > CENLMC_MAX_D:
                continue
            row = run_cell(
                s,
                post,
                x0,
                jax.random.fold_in(jax.random.key(args.seed + 1), 100 * i + j),
                size,
                cache,
            )
            rows.append(row)
            print(
                f"[{time.perf_counter() - t_start:6.0f} s] {name:42s} {s:7s} "
                f"{row['status']:15s} grads {row['grad_evals']} cpu "
                f"{row['cpu_s']:.1f}s rhat {row.get('max_rhat', float('nan')):.3g} "
                f"failed {row.get('failed', [])[:3]} warn {len(row['warnings'])} err "
                f"{bool(row['error'])}",
                flush=True,
            )
        md_path = report(
            rows,
            args,
            base_size,
            samplers,
            head,
            time.perf_counter() - t_start,
            i == len(names) - 1,
        )
    print(f"wrote {md_path} ({time.perf_counter() - t_start:.0f} s)")


if __name__ == "__main__":
    sys.exit(main())
