"""Ours against BlackJAX NUTS on two bigger models, side by side in one run (issue 48):
right, and within NUTS's CPU time?

Models (``benchmarks/big_models/``, plain-JAX float64 log densities, data from fixed
seeds, the math in each file's docstring): ``sv``, stochastic volatility of 100 daily
returns, non-centred, d = 103 (``lax.scan``); ``irt``, a Rasch item-response model,
448 persons x 50 items with a hierarchical item scale (centred), d = 500.

Per model, one after the other in this one run, each in a fresh subprocess (so each
figure includes Python's start-up, importing JAX and compiling from an empty
compilation cache, as on a first run):

* **ours**, as a new user runs it: ``cenlmc-jax sample --model FILE:logp --dim d
  --particles N --seed S --out DIR`` (no tuning flag: the exact default,
  ``cj.langevin_warmup``'s HMC handed to ``cj.sample_until``, which runs until the
  many-chain verdict holds). Read: its exit code and verdict lines, ``summary.csv``
  (mean, sd and MCSE of the coordinates), the final positions of the N chains in
  ``moments.npz`` (for the derived quantities: phi, sigma, h_t, ...), and the stderr
  lines of ``--progress`` stamped with the seconds since the start (where the time
  went: compile and mode search, kinetic rounds, adjusted phase, sampling).
* **NUTS**: BlackJAX ``window_adaptation(blackjax.nuts)`` (diagonal metric, target
  acceptance 0.8) for 1,000 steps then 1,000 NUTS draws, 4 chains one after another
  (one compiled program run 4 times), each started ~ uniform(-2, 2)^d as Stan does.

Wall time is the subprocess's; CPU time is ``resource.getrusage(RUSAGE_CHILDREN)``'s
user + system time of that subprocess (all its threads).

Right: a named quantity's mean and sd are *off* when they miss the reference by more
than ``max(5 MCSE, 0.1 ref_sd)``. The reference (``big_models/refs.json``, made by
``--make-refs``): BlackJAX NUTS, 4 chains x 5,000 draws after 1,000 window-adaptation
steps at target acceptance 0.95, seed 12345, started ~ uniform(-2, 2) (sv: max R-hat
1.001, min bulk ESS 5,072, 9 divergences in 20,000; irt: 1.0004, 12,953, none). The
MCSE: for NUTS, ArviZ's (ESS-based) of the 4 x 1,000 draws; for ours, the CLI's own
for the coordinates (summary.csv) and, for derived quantities, ``sd / sqrt(N)`` (mean)
and ``sd / sqrt(2 N)`` (sd) of the N final positions, counted as independent draws.

Run: ``python benchmarks/bench_big_models.py [--quick] [--only sv|irt] [--particles N
...]`` (one row of ours per N, default 1024; ``--quick``: NUTS 200 + 200, ours 256
chains; a smoke run, numbers not to quote). Writes
``benchmarks/results/big_models.{json,md}``; ``--make-refs`` writes
``benchmarks/big_models/refs.json``.
"""

from __future__ import annotations

import argparse
import csv
import importlib
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
MODELS = HERE / "big_models"
REFS = MODELS / "refs.json"
sys.path.insert(0, str(HERE))

CASES = ("sv", "irt")
#: the reference's NUTS target acceptance: higher than Stan's 0.8 (smaller steps), so
#: that a divergence does not cut the thin tail of sigma near 0 short
REF_TARGET = 0.95

NOTES = [
    "The machine has 2 CPU cores shared with other workers: wall times are noisy, "
    "CPU times less so; ours and NUTS ran one after the other in the same run, each "
    "in a fresh subprocess (start-up, import, compilation from an empty cache "
    "included), one run each.",
    "ours: `cenlmc-jax sample --model benchmarks/big_models/M.py:logp --dim d "
    "--particles N --seed 0 --out DIR --progress` (the exact default: "
    "cj.langevin_warmup's HMC, then cj.sample_until to the many-chain verdict). "
    "NUTS: BlackJAX window_adaptation(blackjax.nuts) 1,000 steps + 1,000 draws, 4 "
    "chains one after another, start ~ uniform(-2, 2)^d.",
    "CPU s: user + system time of the subprocess (getrusage RUSAGE_CHILDREN), all "
    "threads. ratio: ours / NUTS (CPU and wall).",
    "right: every named quantity's mean and sd within max(5 MCSE, 0.1 ref sd) of the "
    "reference (BlackJAX NUTS 4 x 5,000 draws after 1,000 adapting at target "
    "acceptance 0.95, seed 12345; "
    "big_models/refs.json). ours' MCSE: the CLI's own for coordinates (summary.csv);"
    " for derived quantities (phi, sigma, h_t, b_1) from the N final positions "
    "counted as independent draws (sd / sqrt(N), sd / sqrt(2N)).",
]


WARM_NOTE = (
    "warm cache (--warm): the same command again, from the compilation cache its "
    "first run left (its ratio against NUTS run again the same way): cold minus warm"
    " is roughly the compilation's share."
)

# ----------------------------------------------------------------------- NUTS child

NUTS_CHILD = r"""
import json, sys, time
import numpy as np
t_start = time.perf_counter()
import jax
jax.config.update("jax_enable_x64", True)
# the persistent cache (JAX_COMPILATION_CACHE_DIR) for every program, as the CLI's
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
import jax.numpy as jnp
import blackjax
sys.path.insert(0, sys.argv[1])
model = __import__(sys.argv[2])
n_chains, n_warm, n_draws, seed = map(int, sys.argv[3:7])
out, target = sys.argv[7], float(sys.argv[8])
t_import = time.perf_counter() - t_start


def run_chain(key, x0):
    k_adapt, k_draw = jax.random.split(key)
    adapt = blackjax.window_adaptation(
        blackjax.nuts, model.logp, target_acceptance_rate=target
    )
    (state, params), ainfo = adapt.run(k_adapt, x0, num_steps=n_warm)
    step = blackjax.nuts(model.logp, **params).step

    def one(state, k):
        state, info = step(k, state)
        return state, (state.position, info.num_integration_steps, info.is_divergent,
                       info.acceptance_rate)

    keys = jax.random.split(k_draw, n_draws)
    _, (xs, n_grad, div, acc) = jax.lax.scan(one, state, keys)
    warm_grads = jnp.sum(ainfo.info.num_integration_steps)
    return xs, n_grad, div, acc, warm_grads, params["step_size"]


key = jax.random.key(seed)
keys = jax.random.split(key, n_chains + 1)
x0 = jax.random.uniform(keys[0], (n_chains, model.DIM), jnp.float64, -2.0, 2.0)
t0 = time.perf_counter()
compiled = jax.jit(run_chain).lower(keys[1], x0[0]).compile()
t_compile = time.perf_counter() - t0
runs, chain_s = [], []
for c in range(n_chains):
    t0 = time.perf_counter()
    runs.append(jax.block_until_ready(compiled(keys[c + 1], x0[c])))
    chain_s.append(time.perf_counter() - t0)
draws = np.stack([np.asarray(r[0]) for r in runs])  # (chains, draws, d)
np.save(out, draws)
print(json.dumps(dict(
    import_s=t_import, compile_s=t_compile, chain_s=chain_s,
    grads_per_draw=[float(np.mean(r[1])) for r in runs],
    divergences=[int(np.sum(r[2])) for r in runs],
    acceptance=[float(np.mean(r[3])) for r in runs],
    warmup_grads=[int(r[4]) for r in runs],
    draw_grads=[int(np.sum(r[1])) for r in runs],
    step_size=[float(r[5]) for r in runs],
)))
"""


def _child_usage() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def timed_subprocess(cmd, env, timeout, stamp_stderr=False):
    """Run ``cmd``; return (stdout, stderr, rc, wall s, CPU s, stamped stderr lines)."""
    cpu0, t0 = _child_usage(), time.perf_counter()
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=ROOT
    )
    out_chunks, err_chunks, stamped = [], [], []

    def read_out():
        out_chunks.append(proc.stdout.read())

    def read_err():
        buf = b""
        while chunk := proc.stderr.read1(4096):
            err_chunks.append(chunk)
            buf += chunk
            *lines, buf = re.split(rb"[\r\n]", buf)
            now = round(time.perf_counter() - t0, 1)
            stamped.extend(
                (now, ln.decode(errors="replace").strip()) for ln in lines if ln.strip()
            )
        if buf.strip():
            stamped.append((round(time.perf_counter() - t0, 1), buf.decode().strip()))

    threads = [threading.Thread(target=f) for f in (read_out, read_err)]
    for t in threads:
        t.start()
    try:
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        rc = None
        proc.wait()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    cpu = _child_usage() - cpu0
    stdout = b"".join(out_chunks).decode(errors="replace")
    stderr = b"".join(err_chunks).decode(errors="replace")
    if not stamp_stderr:
        stamped = []
    return stdout, stderr, rc, wall, cpu, stamped


def run_nuts(
    case, n_chains, n_warm, n_draws, seed, work, timeout, target=0.8, cache=None
):
    out = work / f"nuts_{case}_{seed}.npy"
    cache = cache or f"xla_nuts_{case}"
    env = dict(os.environ, JAX_COMPILATION_CACHE_DIR=str(work / cache))
    cmd = [sys.executable, "-c", NUTS_CHILD, str(MODELS), case, str(n_chains)]
    cmd += [str(n_warm), str(n_draws), str(seed), str(out), str(target)]
    stdout, stderr, rc, wall, cpu, _ = timed_subprocess(cmd, env, timeout)
    if rc != 0:
        raise RuntimeError(f"NUTS child failed ({rc}): {stderr[-3000:]}")
    info = json.loads(stdout.strip().splitlines()[-1])
    info.update(wall_s=round(wall, 1), cpu_s=round(cpu, 1))
    import numpy as np

    return info, np.load(out)


# ----------------------------------------------------------------------- summaries


def nuts_summary(model, draws) -> dict:
    """Mean, sd, ArviZ MCSEs, bulk ESS and R-hat of every named quantity (derived and
    coordinates) of draws (chains, draws, d)."""
    import arviz as az
    import numpy as np

    qs = dict(model.derived(draws))
    for name, i in model.COORDS.items():
        qs.setdefault(name, draws[..., i])
    out = {}
    for name, v in qs.items():
        v = np.asarray(v, dtype=float)
        out[name] = dict(
            mean=float(v.mean()),
            sd=float(v.std(ddof=1)),
            mcse_mean=float(az.mcse(v, method="mean")),
            mcse_sd=float(az.mcse(v, method="sd")),
            ess_bulk=float(az.ess(v, method="bulk")),
            r_hat=float(az.rhat(v)),
        )
    return out


def ours_summary(model, out_dir: Path) -> dict:
    """Coordinates from the CLI's summary.csv (its MCSE); derived quantities from the
    final positions in moments.npz (N chains counted as independent draws)."""
    import numpy as np

    out = {}
    csv_path = out_dir / "summary.csv"
    table = {}
    if csv_path.exists():
        with open(csv_path, newline="") as fh:
            rows = list(csv.reader(fh))
        table = {
            r[0]: dict(zip(rows[0][1:], map(float, r[1:]), strict=True))
            for r in rows[1:]
        }
    final = out_dir / "moments.npz"
    if final.exists():
        pos = np.load(final)["final_position"]
        n = pos.shape[0]
        coords = set(model.COORDS)
        for name, v in model.derived(pos).items():
            if name in coords:
                continue
            sd = float(np.std(v, ddof=1))
            out[name] = dict(
                mean=float(np.mean(v)),
                sd=sd,
                mcse_mean=sd / n**0.5,
                mcse_sd=sd / (2 * n) ** 0.5,
                source=f"{n} final positions",
            )
    for name, i in model.COORDS.items():
        row = table.get(f"x[{i}]")
        if row is not None:
            out[name] = dict(
                mean=row["mean"],
                sd=row["sd"],
                mcse_mean=row.get("mcse_mean"),
                mcse_sd=row.get("mcse_sd"),
                source="summary.csv",
            )
    return out


def judge(est: dict, ref: dict) -> list:
    rows = []
    for name, r in ref.items():
        e = est.get(name)
        if e is None:
            rows.append(dict(name=name, missing=True, off=None))
            continue

        def num(v):
            return 0.0 if v is None or v != v else float(v)

        tol_m = max(5 * num(e["mcse_mean"]), 0.1 * r["sd"])
        tol_s = max(5 * num(e["mcse_sd"]), 0.1 * r["sd"])
        row = dict(name=name, mean=e["mean"], sd=e["sd"], mcse_mean=e["mcse_mean"])
        row.update(mcse_sd=e["mcse_sd"], ref_mean=r["mean"], ref_sd=r["sd"])
        row["mean_off"] = bool(abs(e["mean"] - r["mean"]) > tol_m)
        row["sd_off"] = bool(abs(e["sd"] - r["sd"]) > tol_s)
        row["off"] = row["mean_off"] or row["sd_off"]
        rows.append(row)
    return rows


# ----------------------------------------------------------------------- ours


def cli() -> list:
    exe = Path(sys.executable).parent / "cenlmc-jax"
    found = str(exe) if exe.exists() else shutil.which("cenlmc-jax")
    return [found] if found else [sys.executable, "-m", "cenlmc_jax.cli"]


def run_ours(case, dim, particles, seed, work, timeout, cache=None):
    out = work / f"ours_{case}"
    flags = ["sample", "--model", f"{MODELS / case}.py:logp", "--dim", str(dim)]
    flags += ["--particles", str(particles), "--seed", str(seed), "--out", str(out)]
    flags += ["--progress"]
    cache = cache or f"xla_ours_{case}_{particles}"
    env = dict(os.environ, JAX_COMPILATION_CACHE_DIR=str(work / cache))
    env.pop("JAX_ENABLE_X64", None)
    stdout, stderr, rc, wall, cpu, stamped = timed_subprocess(
        [*cli(), *flags], env, timeout, stamp_stderr=True
    )
    shown = " ".join(["cenlmc-jax", *flags]).replace(str(ROOT) + "/", "")
    text = stdout + "\n" + stderr
    row = dict(
        command=shown.replace(str(work), "DIR"),
        exit_code=rc,
        wall_s=round(wall, 1),
        cpu_s=round(cpu, 1),
        verdict_lines=[
            ln.strip()
            for ln in text.splitlines()
            if "UNRELIABLE" in ln or "warning" in ln.lower()
        ],
        # the warm-up's phases and the run's last progress lines, with seconds
        timeline=[s for s in stamped if "warm-up" in s[1] or "it/s" not in s[1]][:60],
        stdout_tail=stdout[-4000:],
    )
    if m := re.search(r"([\d,]+) sequential and ([\d,]+) gradients", text):
        row["warmup_sequential"] = int(m.group(1).replace(",", ""))
        row["warmup_gradients"] = int(m.group(2).replace(",", ""))
    if m := re.search(r"ran ([\d,]+) steps after", text):
        row["steps_run"] = int(m.group(1).replace(",", ""))
    if m := re.search(r"ε=([\d.eE+-]+), L=(\d+)", text):
        row["step_size"], row["L"] = float(m.group(1)), int(m.group(2))
    rec = out / "run.json"
    if rec.exists():
        record = json.loads(rec.read_text())
        row["description"] = record.get("description")
        row["problems"] = record.get("problems")
        row["warmup_steps"] = record.get("warmup_steps")
    if rc is not None and rc not in (0, 1):
        row["stderr_tail"] = stderr[-3000:]
    return row, out


# ----------------------------------------------------------------------- main


def load_model(case):
    return importlib.import_module(f"big_models.{case}")


def make_refs(args):
    refs = json.loads(REFS.read_text()) if REFS.exists() else {}
    cases = [args.only] if args.only else list(CASES)
    with tempfile.TemporaryDirectory() as tmp:
        for case in cases:
            model = load_model(case)
            info, draws = run_nuts(
                case, 4, 1000, 5000, 12345, Path(tmp), 3600, REF_TARGET
            )
            summ = nuts_summary(model, draws)
            refs[case] = dict(
                how="BlackJAX "
                + _blackjax_version()
                + f" NUTS, window_adaptation (diagonal, target {REF_TARGET}) 1,000 "
                "steps, "
                "then 4 chains x 5,000 draws, seed 12345, start ~ uniform(-2, 2)^d "
                "(python benchmarks/bench_big_models.py --make-refs)",
                max_r_hat=max(v["r_hat"] for v in summ.values()),
                min_ess_bulk=min(v["ess_bulk"] for v in summ.values()),
                divergences=sum(info["divergences"]),
                wall_s=info["wall_s"],
                quantities=summ,
            )
            print(case, json.dumps(refs[case], indent=1), flush=True)
    REFS.write_text(json.dumps(refs, indent=1) + "\n")


def _blackjax_version():
    import blackjax

    return blackjax.__version__


def fmt_est(rows) -> str:
    cells = []
    for e in rows:
        if e.get("missing"):
            cells.append(f"{e['name']}: missing")
            continue

        def b(text, on):
            return f"**{text}**" if on else text

        mean = b(f"{e['mean']:.4g} ± {e['mcse_mean']:.2g}", e["mean_off"])
        sd = b(f"sd {e['sd']:.4g}", e["sd_off"])
        cells.append(
            f"{e['name']} {mean} ({e['ref_mean']:.4g}); {sd} ({e['ref_sd']:.4g})"
        )
    return "<br>".join(cells)


def main():
    from _common import write_results

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="NUTS 200+200, ours 256 chains")
    p.add_argument("--only", choices=CASES)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--particles",
        type=int,
        nargs="+",
        default=None,
        help="chains of ours, one row each (default 1024; --quick 256)",
    )
    p.add_argument("--timeout", type=float, default=3000.0, help="seconds a run")
    p.add_argument(
        "--make-refs", action="store_true", help="write big_models/refs.json"
    )
    p.add_argument(
        "--warm",
        action="store_true",
        help="run each method again from its compilation cache (the compile share)",
    )
    p.add_argument("--out-dir", type=Path, default=HERE / "results")
    args = p.parse_args()
    if args.make_refs:
        return make_refs(args)
    refs = json.loads(REFS.read_text())
    n_warm = n_draws = 200 if args.quick else 1000
    particles = args.particles or ([256] if args.quick else [1024])
    cases = [args.only] if args.only else list(CASES)
    rows, md = [], []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for case in cases:
            model = load_model(case)
            ref = refs[case]["quantities"]
            runs = []
            for n in particles:
                ours, out = run_ours(case, model.DIM, n, args.seed, work, args.timeout)
                ours["estimates"] = judge(ours_summary(model, out), ref)
                ours.update(method=f"ours, {n} chains", particles=n)
                keys = ("exit_code", "wall_s", "cpu_s", "verdict_lines", "steps_run")
                print(json.dumps({k: ours.get(k) for k in keys}), flush=True)
                runs.append(ours)
                shutil.rmtree(out, ignore_errors=True)
            nuts, draws = run_nuts(
                case, 4, n_warm, n_draws, args.seed, work, args.timeout
            )
            nuts["estimates"] = judge(nuts_summary(model, draws), ref)
            nuts["method"] = f"BlackJAX NUTS, 4 chains, {n_warm:,} + {n_draws:,}"
            print(json.dumps({k: nuts.get(k) for k in ("wall_s", "cpu_s")}), flush=True)
            runs.append(nuts)
            if args.warm:  # again, each from the compilation cache its first run left
                for n in particles:
                    again, out = run_ours(
                        case, model.DIM, n, args.seed, work, args.timeout
                    )
                    again["estimates"] = judge(ours_summary(model, out), ref)
                    again.update(method=f"ours, {n} chains, warm cache", particles=n)
                    runs.append(again)
                    shutil.rmtree(out, ignore_errors=True)
                again, draws = run_nuts(
                    case, 4, n_warm, n_draws, args.seed, work, args.timeout
                )
                again["estimates"] = judge(nuts_summary(model, draws), ref)
                again["method"] = nuts["method"] + ", warm cache"
                runs.append(again)
            for r in runs:
                off = [e for e in r["estimates"] if e.get("off")]
                right = not off and all(not e.get("missing") for e in r["estimates"])
                r.update(case=case, dim=model.DIM, right=right)
                # against NUTS run the same way (cold, or from its cache)
                base = runs[-1] if r["method"].endswith("warm cache") else nuts
                r["ratio_cpu"] = r["cpu_s"] / base["cpu_s"]
                r["ratio_wall"] = r["wall_s"] / base["wall_s"]
                rows.append(r)
                md.append(md_row(r))
    write_results(
        "big_models"
        + ("_quick" if args.quick else "")
        + ("_warm" if args.warm else ""),
        dict(
            cases=cases,
            particles=particles,
            nuts=dict(chains=4, warmup=n_warm, draws=n_draws),
            refs={c: refs[c] for c in cases},
        ),
        rows,
        columns="model d method wall_s cpu_s ratio_cpu ratio_wall right estimates "
        "notes".split(),
        md_rows=md,
        out_dir=args.out_dir,
        title="Ours (cenlmc-jax sample, the exact default) against BlackJAX NUTS on a "
        "100-d stochastic-volatility and a 500-d item-response model",
        notes=NOTES + [WARM_NOTE] * args.warm,
    )


def phases(timeline) -> str:
    """Seconds at which the warm-up's first message, its hand-over and the run's last
    check were printed (start-up + import + first compile; warm-up; sampling)."""
    first = next((t for t, ln in timeline if "warm-up" in ln), None)
    hand = next((t for t, ln in timeline if "hand-over" in ln), None)
    last = [t for t, ln in timeline if "nested R-hat" in ln]
    return (
        f"first warm-up message at {first} s, hand-over at {hand} s, last check at "
        f"{last[-1] if last else None} s"
    )


def md_row(r) -> dict:
    if r["method"].startswith("ours"):
        notes = (
            f"exit {r['exit_code']}; "
            + ("; ".join(v[:100] for v in r["verdict_lines"]) or "reliable")
            + f"; warm-up {r.get('warmup_sequential')} sequential / "
            f"{r.get('warmup_gradients')} gradients, then {r.get('steps_run')} "
            f"steps of HMC (ε={r.get('step_size')}, L={r.get('L')}); "
            + phases(r["timeline"])
        )
    else:
        notes = (
            f"compile {r['compile_s']:.1f} s, chains "
            + ", ".join(f"{s:.1f}" for s in r["chain_s"])
            + f" s; {sum(r['warmup_grads']):,} + {sum(r['draw_grads']):,} gradients"
            " (adapt + draws); mean tree "
            + ", ".join(f"{g:.0f}" for g in r["grads_per_draw"])
            + f"; divergences {sum(r['divergences'])}"
        )
    return dict(
        model=r["case"],
        d=r["dim"],
        method=r["method"],
        wall_s=r["wall_s"],
        cpu_s=r["cpu_s"],
        ratio_cpu=f"{r['ratio_cpu']:.2f}",
        ratio_wall=f"{r['ratio_wall']:.2f}",
        right="yes" if r["right"] else "**no**",
        estimates=fmt_est(r["estimates"]),
        notes=notes,
    )


if __name__ == "__main__":
    main()
