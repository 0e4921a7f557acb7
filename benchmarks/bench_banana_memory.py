"""The CLI default on the banana over seeds and chain counts: how long the many-chain
verdict runs, and whether the answer it passes is right (session 59).

``cenlmc-jax sample --model benchmarks/many_chains_models/banana.py:logp --dim 2
--seed S [--particles N]`` as a new user runs it, for each seed and chain count; the
table gives the exit code, the moves the verdict ran after the warm-up, x0's and x1's
sd with the CLI's own MCSE, and how far each sd is from the exact one (10 and
sqrt(1 + 0.03^2 * 2 * 10^4) = 4.359) in MCSEs and in per cent. ``--code DIR`` runs
the CLI of another checkout (a git worktree at an older commit: its package first on
PYTHONPATH), so a change of the verdict is measured side by side; each run's rows
carry ``--label`` and are merged into ``--out-dir``'s banana_memory.json.

Run: ``python benchmarks/bench_banana_memory.py --label after`` and, from a worktree
at the commit before, ``--code /path/to/worktree --label before``.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import machine_info  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
MODEL = os.path.join(HERE, "many_chains_models", "banana.py") + ":logp"
TRUE_SD = {"x[0]": 10.0, "x[1]": math.sqrt(1 + 0.03**2 * 2 * 10**4)}
# a run passes a wrong answer silently when it exits 0 with an sd off by more than
# 3 of its MCSEs and 10 % (bench_many_chains.py's 'off' is 5 MCSEs or 10 %: here
# the stricter of the two, as the question is whether the verdict lets a bias pass)
OFF_Z, OFF_FRAC = 3.0, 0.10


def run_case(seed: int, particles: int | None, code: str | None, timeout: float):
    env = dict(os.environ)
    if code:
        env["PYTHONPATH"] = code + os.pathsep + env.get("PYTHONPATH", "")
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "run")
        cmd = [sys.executable, "-m", "cenlmc_jax.cli", "sample", "--model", MODEL]
        cmd += ["--dim", "2", "--seed", str(seed), "--out", out, "--progress"]
        if particles:
            cmd += ["--particles", str(particles)]
        t0 = time.perf_counter()
        p = subprocess.run(
            cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=tmp
        )
        wall = time.perf_counter() - t0
        steps = [int(m) for m in re.findall(r"\[(\d+) steps\]", p.stdout + p.stderr)]
        row = dict(
            seed=seed,
            particles=particles or "CLI default",
            exit_code=p.returncode,
            moves=steps[-1] if steps else None,
            wall_s=round(wall, 1),
        )
        path = os.path.join(out, "summary.csv")
        if os.path.exists(path):
            with open(path) as fh:
                for r in csv.DictReader(fh):
                    if r["name"] in TRUE_SD:
                        sd, se = float(r["sd"]), float(r["mcse_sd"])
                        true = TRUE_SD[r["name"]]
                        row[r["name"]] = dict(
                            sd=sd,
                            mcse_sd=se,
                            z=(sd - true) / se,
                            off_pct=100 * (sd - true) / true,
                        )
        wrong = [
            k
            for k in TRUE_SD
            if k in row
            and abs(row[k]["z"]) > OFF_Z
            and abs(row[k]["off_pct"]) > 100 * OFF_FRAC
        ]
        row["silently_wrong"] = bool(wrong) and p.returncode == 0
        return row


def markdown(doc: dict) -> str:
    lines = [
        "# The CLI default on the banana: the run's length and its answer (session 59)",
        "",
        "Machine: {platform}, {processor}, {cpu_count} CPUs (affinity "
        "{cpu_affinity}), load {load_average_1_5_15}, JAX {jax} ({backend}), "
        "{date_utc} (the last label's run).".format(**doc["machine"]),
        "",
        f"Reproduce: `{doc['command']}`",
        "",
        f"- silently_wrong: exit 0 with x0's or x1's sd off by more than {OFF_Z:g} "
        f"of its MCSEs and {100 * OFF_FRAC:g} %. sd (z, %): the CLI's pooled sd, its "
        "distance from the exact one in the CLI's mcse_sd and in per cent. moves: "
        "the verdict's last check (`--progress`).",
    ]
    for note in doc.get("notes", []):
        lines.append(f"- {note}")
    lines += [
        "",
        "| label | seed | chains | exit | moves | x0 sd (z, %) | x1 sd (z, %) | "
        "silently_wrong | wall_s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]

    def cell(c):
        if not c:
            return "-"
        return f"{c['sd']:.3f} ({c['z']:+.1f}, {c['off_pct']:+.1f} %)"

    for r in doc["rows"]:
        lines.append(
            f"| {r['label']} | {r['seed']} | {r['particles']} | {r['exit_code']} | "
            f"{r['moves']} | {cell(r.get('x[0]'))} | {cell(r.get('x[1]'))} | "
            f"{'**yes**' if r['silently_wrong'] else 'no'} | {r['wall_s']} |"
        )
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0,1,2,3,4,5")
    ap.add_argument(
        "--particles",
        default="0",
        help="comma-separated chain counts (0: the CLI's default, 2,000)",
    )
    ap.add_argument("--extra", default="0:512,0:256,1:256", help="seed:chains pairs")
    ap.add_argument("--code", default=None, help="a checkout whose CLI to run")
    ap.add_argument("--label", default="this commit")
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--out-dir", default=os.path.join(HERE, "results"))
    args = ap.parse_args()
    cases = [
        (int(s), int(p) or None)
        for p in args.particles.split(",")
        for s in args.seeds.split(",")
    ]
    if args.extra:
        cases += [
            (int(a), int(b)) for a, b in (x.split(":") for x in args.extra.split(","))
        ]
    os.makedirs(args.out_dir, exist_ok=True)
    path = os.path.join(args.out_dir, "banana_memory.json")
    doc = dict(rows=[])
    if os.path.exists(path):
        with open(path) as fh:
            doc = json.load(fh)
    doc["rows"] = [r for r in doc["rows"] if r["label"] != args.label]
    doc["machine"] = machine_info()
    doc["command"] = "python benchmarks/bench_banana_memory.py " + " ".join(
        sys.argv[1:]
    )
    for seed, n in cases:
        row = dict(label=args.label, **run_case(seed, n, args.code, args.timeout))
        print(json.dumps(row), flush=True)
        doc["rows"].append(row)
        with open(path, "w") as fh:
            json.dump(doc, fh, indent=2, ensure_ascii=False)
        with open(os.path.join(args.out_dir, "banana_memory.md"), "w") as fh:
            fh.write(markdown(doc))


if __name__ == "__main__":
    main()
