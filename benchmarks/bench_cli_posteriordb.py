"""``cenlmc-jax sample --sampler hmc | mala | lmc | cenlmc`` on raw-scale posteriordb
models, as a user runs it (issue 18; ``mala`` the exact default with ``--model`` in
issue 29, ``hmc`` since issue 46).

For kidiq, garch11 and earnings, the model files
``examples/posteriordb/{kidiq,garch11,earnings}.py`` (written
as a user would: JAX log densities on Stan's unconstrained scale, data from ``--data``)
are run through the command line in a subprocess with no tuning flag:

    cenlmc-jax sample --model examples/posteriordb/M.py:logp --data M.csv --dim D
    --sampler S --trace --out DIR

(``--trace`` keeps the draws: the reference is on the constrained scale, ``sigma =
exp(x[2])`` etc., and the R-hat / ESS checks of the verdict need them). Everything else
is the CLI's default: 2,000 particles, its burn-in and steps, and for MALA, LMC and
CEnLMC with a ``--model`` the warm-up ``cj.langevin_warmup`` (MALA's: Laplace start,
kinetic phase, then MALA tuned on the ensemble; an exact chain).

Judged on the reference's quantities (``cenlmc_jax.models.posteriordb``: 10 x 1,000 NUTS
draws of posteriordb): a parameter passes when its mean is within ``0.1 ref_sd + 3
MCSE`` (split-chain MCSE over the particles as chains) and its sd within 10%. A cell is
``pass`` (exit 0, every parameter passes), ``flagged`` (exit 1: the CLI said UNRELIABLE)
or ``silently wrong`` (exit 0 and some parameter fails). Wall time: one run each, the
whole command (import, compilation, warm-up, sampling, outputs) on a shared 2-core
machine.

Run: ``python benchmarks/bench_cli_posteriordb.py [--only kidiq ...] [--samplers mala
  lmc cenlmc]``.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import jax
import numpy as np
from _common import base_parser, write_results

from cenlmc_jax.diagnostics import mcse
from cenlmc_jax.models import posteriordb as pdb

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples" / "posteriordb"
sys.path.insert(0, str(EXAMPLES))
from make_data import write as write_data  # noqa: E402

#: model file -> (posteriordb name, data file suffix, dimension)
MODELS = {
    "kidiq": ("kidiq-kidscore_momiq", "csv", 3),
    "garch11": ("garch-garch11", "npz", 4),
    "earnings": ("earnings-earn_height", "csv", 3),
}


def command(model: str, sampler: str, data_dir: Path, out: Path) -> list:
    _, ext, d = MODELS[model]
    return [
        "cenlmc-jax",
        "sample",
        "--model",
        f"{EXAMPLES / model}.py:logp",
        "--data",
        f"{data_dir / model}.{ext}",
        "--dim",
        str(d),
        "--sampler",
        sampler,
        "--trace",
        "--out",
        str(out),
    ]


def judge(post, draws: np.ndarray) -> list:
    """Per reference quantity: mean, sd, MCSE and pass/fail; ``draws`` chains-first
    ``(N, T, d)``, unconstrained."""
    z = np.asarray(
        jax.vmap(jax.vmap(post.constrain_array))(draws.astype(np.float64)), np.float64
    )
    flat = z.reshape(-1, z.shape[-1])
    mean, sd = flat.mean(0), flat.std(0, ddof=1)
    se = np.asarray(mcse(z, chain_axis=0, sample_axis=1, split=True))
    rows = []
    for k, name in enumerate(post.names):
        mean_ok = abs(mean[k] - post.ref_mean[k]) <= 0.1 * post.ref_sd[k] + 3 * se[k]
        sd_ok = abs(sd[k] / post.ref_sd[k] - 1) <= 0.1
        rows.append(
            dict(
                name=name,
                mean=float(mean[k]),
                ref_mean=float(post.ref_mean[k]),
                mcse=float(se[k]),
                sd=float(sd[k]),
                ref_sd=float(post.ref_sd[k]),
                mean_err=float(abs(mean[k] - post.ref_mean[k]) / post.ref_sd[k]),
                sd_err=float(sd[k] / post.ref_sd[k] - 1),
                passed=bool(mean_ok and sd_ok),
            )
        )
    return rows


def run_one(model: str, sampler: str, data_dir: Path, work: Path) -> dict:
    out = work / f"{model}_{sampler}"
    cmd = command(model, sampler, data_dir, out)
    t = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "cenlmc_jax.cli"] + cmd[1:],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    wall = time.perf_counter() - t
    shown = (
        " ".join(["cenlmc-jax"] + cmd[1:])
        .replace(str(ROOT) + "/", "")
        .replace(str(data_dir) + "/", "")
    )
    row = dict(
        model=model,
        sampler=sampler,
        command=shown.replace(str(work), "DIR"),
        exit_code=proc.returncode,
        wall_s=round(wall, 1),
    )
    record_path = out / "run.json"
    if not record_path.exists():
        return dict(
            row, cell="error", stderr=proc.stderr[-2000:], stdout=proc.stdout[-2000:]
        )
    record = json.loads(record_path.read_text())
    row.update(
        description=record["description"],
        problems=record["problems"],
        warmup_steps=record["warmup_steps"],
        steps_done=record["steps_done"],
        sampling_s=round(record["timings"]["sampling_s"], 1),
        parameters={
            k: v for k, v in record["parameters"].items() if not isinstance(v, list)
        },
    )
    params = []
    if (out / "draws.npz").exists():
        with np.load(out / "draws.npz") as f:
            draws = f["draws"]
        if draws.shape[1] > 0 and np.all(np.isfinite(draws)):
            params = judge(pdb.load(MODELS[model][0]), draws)
    row["params"] = params
    all_pass = bool(params) and all(p["passed"] for p in params)
    row["cell"] = (
        "flagged"
        if proc.returncode == 1
        else "pass"
        if proc.returncode == 0 and all_pass
        else "silently wrong"
        if proc.returncode == 0
        else f"exit {proc.returncode}"
    )
    row["summary_run"] = record.get("summary_run") or {}
    row["steps"] = record["config"].get("steps")
    if (out / "summary.csv").exists():
        with open(out / "summary.csv") as fh:
            table = list(csv.DictReader(fh))
        row["max_rhat"] = max(float(t["r_hat"]) for t in table if t.get("r_hat"))
    return row


def md_rows(rows: list) -> list:
    out = []
    for r in rows:
        fails = [p["name"] for p in r.get("params", []) if not p["passed"]]
        worst_mean = max(
            (p["mean_err"] for p in r.get("params", [])), default=float("nan")
        )
        worst_sd = max(
            (abs(p["sd_err"]) for p in r.get("params", [])), default=float("nan")
        )
        par = r.get("parameters", {})
        out.append(
            dict(
                model=r["model"],
                sampler=r["sampler"],
                cell=r["cell"],
                exit=r["exit_code"],
                wall_s=r["wall_s"],
                steps=r.get("steps"),
                max_rhat=f"{r.get('max_rhat', float('nan')):.3f}",
                relaxation=f"{par.get('relaxation_steps', float('nan')):.3g}",
                failing=", ".join(fails) or "none",
                mean_err=f"{worst_mean:.3g}",
                sd_err=f"{worst_sd:.3g}",
                h=f"{par.get('step_size', float('nan')):.3g}",
                curvature=f"{par.get('whitened_curvature', float('nan')):.3g}",
                problems="; ".join(r.get("problems", []))[:300],
            )
        )
    return out


def main():
    parser = base_parser(" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--only", nargs="*", default=None, choices=sorted(MODELS))
    parser.add_argument(
        "--samplers",
        nargs="*",
        default=["mala", "lmc", "cenlmc"],
        choices=["hmc", "mala", "lmc", "cenlmc"],
    )
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        data_dir = work / "data"
        write_data(data_dir)
        for model in args.only or MODELS:
            for sampler in args.samplers:
                row = run_one(model, sampler, data_dir, work)
                rows.append(row)
                print(
                    json.dumps(
                        {
                            k: row.get(k)
                            for k in (
                                "model",
                                "sampler",
                                "cell",
                                "exit_code",
                                "wall_s",
                                "problems",
                            )
                        }
                    ),
                    flush=True,
                )
    details = []
    for r in rows:
        details.append(
            f"`{r['command']}`: exit {r['exit_code']}, {r['wall_s']} s; warm-up: "
            f"{r.get('description', r.get('stderr', ''))}"
        )
        for p in r.get("params", []):
            details.append(
                f"  {r['model']}/{r['sampler']} {p['name']}: mean {p['mean']:.5g} (ref "
                f"{p['ref_mean']:.5g}, MCSE {p['mcse']:.2g}), sd {p['sd']:.4g} (ref "
                f"{p['ref_sd']:.4g}): {'pass' if p['passed'] else 'FAIL'}"
            )
    cols = [
        "model",
        "sampler",
        "cell",
        "exit",
        "wall_s",
        "steps",
        "relaxation",
        "max_rhat",
        "failing",
        "mean_err",
        "sd_err",
        "h",
        "curvature",
        "problems",
    ]
    write_results(
        "cli_posteriordb",
        dict(
            models=MODELS,
            environment=dict(JAX_ENABLE_X64=os.environ.get("JAX_ENABLE_X64")),
        ),
        rows,
        columns=cols,
        md_rows=md_rows(rows),
        out_dir=args.out_dir,
        title="cenlmc-jax sample --sampler mala / lmc / cenlmc on raw-scale "
        "posteriordb model files, no tuning flag",
        notes=[
            "pass: exit 0 and every reference quantity's mean within 0.1 ref_sd + 3 "
            "MCSE and sd within 10%; flagged: exit 1 (UNRELIABLE); silently wrong: "
            "exit 0 and a quantity fails.",
            "mean_err = max |mean - ref| / ref_sd; sd_err = max |sd / ref_sd - 1|; h "
            "and curvature: the warm-up's step size and whitened curvature (run.json "
            "parameters); relaxation: its measured steps per e-fold, which set steps "
            "(jobs.default_steps: max(1000, 76 relaxation)); max_rhat: the summary's "
            "largest rank-normalised split R-hat over all particles (the verdict's "
            "check uses 64 of them, threshold 1.1).",
            "wall_s: the whole command, one run each (import, compilation, warm-up, "
            "sampling, outputs) on a shared machine.",
            *details,
        ],
    )


if __name__ == "__main__":
    main()
