"""``cenlmc-jax sample --model FILE.py:logp --dim D`` on hard posteriors, as a new user
runs it: does the command line give the right answer or say that it did not?

Each case of ``benchmarks/many_chains_models/`` (a file with ``logp(x)`` of one point)
is run in a subprocess with no tuning flag, only ``--seed``, ``--out DIR`` (to read
``run.json``) and, if given here, ``--particles``; a fresh, empty compilation cache
(``JAX_COMPILATION_CACHE_DIR``), so each wall time includes compiling, as on a first
run. Recorded per case: the exit code; the verdict lines (those with ``UNRELIABLE`` or
``warning``); the printed summary table's mean, sd and MCSEs of the key coordinates
against a reference computed independently (``REFS``; how, in ``NOTES``); the steps run
after the warm-up, the warm-up's relaxation time and its sequential gradients (the
header's ``S sequential ... gradients``, else the warm-up's steps); the total
sequential gradients of one chain (warm-up + driver burn-in + steps, one gradient a
step); wall time.

Judged: an estimate (a mean or an sd) is *off* when it misses the reference by more
than ``max(5 MCSE, 0.1 ref_sd)`` (the MCSE the CLI printed). ``pass``: exit 0,
nothing off; ``flagged``: exit 1 and an UNRELIABLE line; ``silently wrong``: exit 0 and
something off; ``timeout``; ``error``: anything else (a crash, no summary table).

Run: ``python benchmarks/bench_many_chains.py [--quick] [--only NAME] [--timeout S]``
(``--quick``: banana and eight_schools_centered only). Writes
``benchmarks/results/many_chains.{json,md}``.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import RESULTS_DIR, write_results

ROOT = Path(__file__).resolve().parent.parent
MODELS = Path(__file__).resolve().parent / "many_chains_models"

#: case -> (dimension, {coordinate: (name, reference mean, reference sd)}); how each
#: reference was obtained: NOTES (references.py in the models folder recomputes them)
REFS = {
    "banana": (2, {"x[0]": ("x0", 0.0, 10.0), "x[1]": ("x1", 0.0, 4.358899)}),
    "eight_schools_centered": (10, {
        "x[0]": ("mu", 4.39682, 3.31770),
        "x[1]": ("log tau", 0.80214, 1.17123),
        "x[2]": ("theta_1", 6.21188, 5.59313),
    }),
    "eight_schools_noncentered": (10, {
        "x[0]": ("mu", 4.39682, 3.31770),
        "x[1]": ("log tau", 0.80214, 1.17123),
    }),
    "lotka_volterra": (8, {
        "x[0]": ("log alpha", -0.60214, 0.11884),
        "x[1]": ("log beta", -3.58765, 0.15350),
        "x[2]": ("log gamma", -0.23851, 0.11448),
        "x[3]": ("log delta", -3.74949, 0.15048),
    }),
    "brownian_fixed": (30, {
        "x[0]": ("x_0", -0.0141732, 0.0720760),
        "x[15]": ("x_15 (unobserved)", -0.5074801, 0.1808750),
        "x[29]": ("x_29", -0.7281539, 0.1039781),
    }),
    "brownian_missing": (32, {
        "x[30]": ("log innov", -1.92472, 0.34743),
        "x[31]": ("log obs", -2.15693, 0.61090),
        "x[15]": ("x_15 (unobserved)", -0.49026, 0.28132),
    }),
    "two_modes": (2, {"x[0]": ("x0", 0.0, math.sqrt(65.0)), "x[1]": ("x1", 0.0, 1.0)}),
    "funnel": (10, {"x[0]": ("v", 0.0, 3.0), "x[1]": ("x_1", 0.0, math.exp(2.25))}),
}  # fmt: skip
QUICK = ("banana", "eight_schools_centered")
NAME = re.compile(r"^\S+\[\d+\]$")  # a row of the summary table: x[0], ...

NOTES = [
    "The references are exact or computed without cenlmc_jax (non-exact ones by "
    "benchmarks/many_chains_models/references.py):",
    "Reference, banana: exact, mean 0, sd x0 = 10, sd x1 = sqrt(1 + 0.03^2 * 2 * "
    "10^4).",
    "Reference, eight_schools_centered: theta integrated out analytically (y_j ~ "
    "N(mu, sigma_j^2 + tau^2)), then 2-D quadrature over (mu, log tau) (1200^2 grid; "
    "halving it changes no moment by 1e-9); theta_1 from its Gaussian conditional "
    "given (mu, tau). Cross-check: posteriordb's NUTS reference of the same posterior"
    " (eight_schools_noncentered) has mu 4.41 (sd 3.31), tau 3.60 (3.20); the "
    "quadrature gives 4.40 (3.32) and 3.60 (3.22).",
    "Reference, eight_schools_noncentered: the same posterior (mu, log tau) as "
    "eight_schools_centered, written non-centred (theta_j = mu + tau z_j): its "
    "quadrature.",
    "Reference, lotka_volterra: BlackJAX 1.7.1 NUTS (window adaptation) on the model "
    "file's logp, 8 chains x 5,000 draws after 1,000 adapting, started near the "
    "literature posterior: max R-hat 1.001, min bulk ESS 10,300, MCSE of each mean <="
    " 0.0015 (100 times below the 0.1 sd tolerance). Its constrained means, alpha "
    "0.552, beta 0.0280, gamma 0.793, delta 0.0238, z_init (34.2, 6.0), sigma (0.256,"
    " 0.259), agree with the Stan case study's (0.55, 0.028, 0.80, 0.024; 34.0, 5.9; "
    "0.25, 0.25). The RK4 step (0.1 year) is 4e-6 from solve_ivp in the log "
    "populations.",
    "Reference, brownian_fixed (Inference Gym's "
    "BrownianMotionMissingMiddleObservations, the issue's d = 30 case): Gaussian, "
    "exact by linear algebra (the precision "
    "D^T D / 0.1^2 + S^T S / 0.15^2; equal to the model file's Hessian by jax.hessian "
    "to 1e-9).",
    "Reference, brownian_missing: the 30 locations integrated out analytically (y ~ "
    "N(0, innov^2 K + obs^2 I), K_st = min(s, t) + 1), then 2-D quadrature over (log "
    "innov, log obs) (1000^2 grid, halving it changes nothing); x_15 from its "
    "Gaussian conditional. Checked at three (innov, obs) against the Gaussian "
    "conditional and evidence computed from the model file's Hessian.",
    "Reference, two_modes: exact, mean 0, sd x0 = sqrt(1 + 8^2), sd x1 = 1.",
    "Reference, funnel: exact, v ~ N(0, 3^2); x_1 has mean 0, sd sqrt(E[e^v]) = "
    "e^(9/4).",
    "off: |estimate - reference| > max(5 MCSE, 0.1 ref_sd), for the mean (with the "
    "printed mcse_mean) and the sd (mcse_sd); off estimates in bold. Estimates cell: "
    "name mean ± MCSE (reference mean); sd (reference sd). silently_wrong: exit 0 and"
    " an estimate off.",
    "steps: steps run after the warm-up; relaxation: the warm-up's relaxation time "
    "(run.json); warmup_seq_grads: the header's 'S sequential' gradients of the "
    "warm-up (else its steps); total_seq_grads: warm-up + (driver burn-in + steps) x "
    "the gradients a step costs (HMC's L, run.json; AutoStep HMC's mean over the "
    "particles, L + 1 + its halvings and its reverse check's, from the printed "
    "gradient evaluations: a "
    "vmapped move waits for its slowest chain, 1.3-1.8x that, autostep.md), the"
    " gradients one chain evaluates one after another.",
    "wall_s: the whole command (start-up, compilation from an empty cache, warm-up, "
    "sampling, outputs), one run each.",
]


def cli(neck_starts: float | None = None) -> list:
    """The ``cenlmc-jax`` script beside this Python, else on PATH, else ``-m``;
    with ``neck_starts``, ``neck_starts_cli.py`` (an experiment: that share of the
    superchains started at the ensemble's highest log densities)."""
    if neck_starts is not None:
        script = MODELS.parent / "neck_starts_cli.py"
        return [sys.executable, str(script), str(neck_starts)]
    exe = Path(sys.executable).parent / "cenlmc-jax"
    found = str(exe) if exe.exists() else shutil.which("cenlmc-jax")
    return [found] if found else [sys.executable, "-m", "cenlmc_jax.cli"]


def _int(text: str) -> int:
    return int(text.replace(",", ""))


def _num(v) -> float:
    """An MCSE as a number: missing or nan counts as 0 (the 0.1 sd floor decides)."""
    return 0.0 if v is None or v != v else float(v)


def parse_stdout(text: str) -> dict:
    """The header numbers, the verdict lines and the summary table of a run's output."""
    out = {"table": {}}
    if m := re.search(r"([\d,]+) sequential", text):
        out["warmup_sequential"] = _int(m.group(1))
    if m := re.search(r"relaxation time ([\d.eE+-]+) (?:steps|moves)", text):
        out["relaxation_printed"] = float(m.group(1))
    if m := re.search(r"([\d,]+) burn-in", text):
        out["burn_in"] = _int(m.group(1))
    if m := re.search(r"burn-in \+ ([\d,]+) steps", text):  # a fixed run length
        out["steps"] = _int(m.group(1))
    if m := re.search(r"ran ([\d,]+) steps after", text):
        out["steps_run"] = _int(m.group(1))
    if m := re.search(r"gradient evaluations: ([\d,]+)", text):
        out["run_gradients"] = _int(m.group(1))
    if m := re.search(r"([\d,]+) particles", text):
        out["particles"] = _int(m.group(1))
    lines = text.splitlines()
    out["verdict_lines"] = [
        ln.strip() for ln in lines if "UNRELIABLE" in ln or "warning" in ln.lower()
    ]
    for i, ln in enumerate(lines):
        cols = ln.split()
        if "mean" in cols and "mcse_mean" in cols:
            for row in lines[i + 1 :]:
                cells = row.split()
                if len(cells) != len(cols) + 1 or not NAME.match(cells[0]):
                    break
                try:
                    out["table"][cells[0]] = dict(
                        zip(cols, map(float, cells[1:]), strict=True)
                    )
                except ValueError:
                    break
            break
    return out


def judge(table: dict, refs: dict) -> list:
    rows = []
    for coord, (name, ref_mean, ref_sd) in refs.items():
        est = table.get(coord)
        if est is None:
            rows.append(dict(coord=coord, name=name, missing=True, off=None))
            continue
        e = dict(coord=coord, name=name, ref_mean=ref_mean, ref_sd=ref_sd)
        e.update({k: est.get(k) for k in ("mean", "sd", "mcse_mean", "mcse_sd")})
        tol_mean = max(5 * _num(e["mcse_mean"]), 0.1 * ref_sd)
        e["mean_off"] = bool(abs(e["mean"] - ref_mean) > tol_mean)
        e["sd_off"] = bool(
            abs(e["sd"] - ref_sd) > max(5 * _num(e["mcse_sd"]), 0.1 * ref_sd)
        )
        e["off"] = e["mean_off"] or e["sd_off"]
        rows.append(e)
    return rows


def _text(b) -> str:
    return b.decode(errors="replace") if isinstance(b, bytes) else b or ""


def run_case(case: str, args, work: Path) -> dict:
    dim, refs = REFS[case]
    out = work / case
    flags = ["sample", "--model", f"{MODELS / case}.py:logp", "--dim", str(dim)]
    flags += ["--seed", str(args.seed), "--out", str(out)]
    if args.particles:
        flags += ["--particles", str(args.particles)]
    # an empty compilation cache, as on a new user's first run; no inherited x64
    env = dict(os.environ, JAX_COMPILATION_CACHE_DIR=str(work / f"xla_{case}"))
    env.pop("JAX_ENABLE_X64", None)
    shown = " ".join(["cenlmc-jax", *flags]).replace(str(ROOT) + "/", "")
    row = dict(case=case, dim=dim, command=shown.replace(str(work), "DIR"))
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(
            [*cli(args.neck_starts), *flags], capture_output=True, text=True, cwd=ROOT,
            env=env,
            timeout=args.timeout,
        )  # fmt: skip
        stdout, stderr, rc = proc.stdout, proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as e:
        stdout, stderr, rc = _text(e.stdout), _text(e.stderr), None
    row["wall_s"] = round(time.perf_counter() - t0, 1)
    row["exit_code"] = rc
    parsed = parse_stdout(stdout + "\n" + stderr)
    row.update({k: v for k, v in parsed.items() if k != "table"})
    csv_path = out / "summary.csv"
    if csv_path.exists():  # every coordinate (the printed table stops at 30 rows)
        with open(csv_path, newline="") as fh:
            rows = list(csv.reader(fh))
        parsed["table"] = {
            r[0]: dict(zip(rows[0][1:], map(float, r[1:]), strict=True))
            for r in rows[1:]
        }
    row["summary"] = parsed["table"]
    path = out / "run.json"
    record = json.loads(path.read_text()) if path.exists() else {}
    relax = record.get("parameters", {}).get("relaxation_steps")
    row["relaxation_steps"] = relax or row.get("relaxation_printed")
    for key in ("warmup_steps", "problems", "description"):
        row[key] = record.get(key)
    steps = row.get("steps_run", row.get("steps"))
    if steps is not None:
        # a warm-up spends warmup_steps of the burn-in; the driver runs the rest
        burn_in, spent = row.get("burn_in"), row["warmup_steps"]
        driver = burn_in - spent if None not in (burn_in, spent) else 0
        row["warmup_sequential"] = row.get("warmup_sequential", spent or burn_in or 0)
        # HMC's steps are moves of L leapfrog steps, L gradients each; AutoStep
        # HMC's cost L + 1 + its halvings and its reverse check's: the run's gradients
        # per particle-step
        per_step = record.get("parameters", {}).get("num_integration_steps") or 1
        n_grads, n_part = row.get("run_gradients"), row.get("particles")
        if record.get("parameters", {}).get("autostep") and n_grads and n_part:
            per_step = n_grads / (n_part * max(steps + max(driver, 0), 1))
        row["grads_per_step"] = per_step
        row["total_sequential"] = (
            row["warmup_sequential"] + (max(driver, 0) + steps) * per_step
        )
    row["estimates"] = judge(parsed["table"], refs)
    off = any(e["off"] for e in row["estimates"] if e["off"] is not None)
    complete = all(not e.get("missing") for e in row["estimates"])
    if rc is None:
        row["cell"], row["silently_wrong"] = "timeout", None
    elif rc == 1 and any("UNRELIABLE" in ln for ln in row["verdict_lines"]):
        row["cell"], row["silently_wrong"] = "flagged", False
    elif rc == 0 and complete:
        row["cell"], row["silently_wrong"] = ("silently wrong" if off else "pass"), off
    else:
        row["cell"], row["silently_wrong"] = f"error (exit {rc})", None
        row["stderr_tail"] = stderr[-2000:]
    return row


def short_verdict(row: dict) -> str:
    if row["exit_code"] is None:
        return f"timeout after {row['wall_s']} s"
    for ln in row["verdict_lines"]:
        if "UNRELIABLE" in ln:
            reason = ln.split("UNRELIABLE:", 1)[-1]
            return re.split(r" \(|: the chains", reason)[0].strip()
    return "; ".join(ln[:80] for ln in row["verdict_lines"]) or "reliable"


def fmt_estimates(row: dict) -> str:
    cells = []
    for e in row["estimates"]:
        if e.get("missing"):
            cells.append(f"{e['name']}: not printed")
            continue
        bold = lambda s, on: f"**{s}**" if on else s
        mean = bold(f"{e['mean']:.4g} ± {e['mcse_mean']:.2g}", e["mean_off"])
        sd = bold(f"sd {e['sd']:.4g}", e["sd_off"])
        cells.append(
            f"{e['name']} {mean} ({e['ref_mean']:.4g}); {sd} ({e['ref_sd']:.4g})"
        )
    return "<br>".join(cells)


def md_row(row: dict) -> dict:
    sw = row["silently_wrong"]
    return dict(
        case=row["case"],
        d=row["dim"],
        exit=row["exit_code"],
        cell=row["cell"],
        verdict=short_verdict(row)[:120],
        estimates=fmt_estimates(row),
        silently_wrong={True: "**yes**", False: "no"}.get(sw, "-"),
        steps=row.get("steps_run", row.get("steps")),
        relaxation=f"{row['relaxation_steps']:.3g}"
        if row["relaxation_steps"]
        else None,
        warmup_seq_grads=row.get("warmup_sequential"),
        total_seq_grads=row.get("total_sequential"),
        wall_s=row["wall_s"],
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help=f"only {', '.join(QUICK)}")
    parser.add_argument(
        "--only",
        choices=sorted(REFS),
        help="run this case alone (merged into --out-dir's many_chains.json)",
    )
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds a case")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--particles", type=int, default=None, help="default: CLI's")
    parser.add_argument("--out-dir", type=Path, default=RESULTS_DIR)
    parser.add_argument(
        "--cases", default=None, help="comma-separated cases (default: all eight)"
    )
    parser.add_argument(
        "--neck-starts",
        type=float,
        default=None,
        help="an experiment: this share of the superchains started at the warm-up "
        "ensemble's highest log densities (neck_starts_cli.py)",
    )
    args = parser.parse_args()
    cases = [args.only] if args.only else list(QUICK if args.quick else REFS)
    if args.cases:
        cases = [c for c in args.cases.split(",") if c in REFS]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for case in cases:
            row = run_case(case, args, Path(tmp))
            rows.append(row)
            keys = ("case", "cell", "exit_code", "wall_s", "steps_run", "verdict_lines")
            print(json.dumps({k: row.get(k) for k in keys}), flush=True)
    old = args.out_dir / "many_chains.json"
    if args.only and old.exists():  # one case rerun: merged into the table there
        before = json.loads(old.read_text())["rows"]
        kept = [r for r in before if r["case"] != args.only]
        rows = sorted(kept + rows, key=lambda r: list(REFS).index(r["case"]))
        cases = [r["case"] for r in rows]
    details = [
        f"`{r['command']}`: {r['description'] or r.get('stderr_tail', '')}"
        for r in rows
    ]
    cols = (
        "case d exit cell verdict estimates silently_wrong steps relaxation "
        "warmup_seq_grads total_seq_grads wall_s"
    ).split()
    write_results(
        "many_chains",
        dict(
            cases=cases,
            timeout_s=args.timeout,
            seed=args.seed,
            particles=args.particles,
            refs=REFS,
        ),  # fmt: skip
        rows,
        columns=cols,
        md_rows=[md_row(r) for r in rows],
        out_dir=args.out_dir,
        title="cenlmc-jax sample --model FILE.py:logp --dim D on hard posteriors, "
        "no tuning flag",
        notes=[*NOTES, *details],
    )


if __name__ == "__main__":
    main()
