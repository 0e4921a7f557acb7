"""The README's main job as a new user runs it, warm: its CPU time, run after run,
beside a fixed reference workload that says how fast the shared host was then.

Issue 30 asks for ``cenlmc-jax sample`` (the main job) in at most 8 s of CPU on a warm
compilation cache. On these 2-core machines, shared with other jobs, the same job's CPU
time moves by a third within minutes; one median hides whether a slow figure is the
job's or the host's. So each round runs, in fresh processes, one after the other:

* ``cenlmc-jax sample`` on a warm cache (user + sys CPU of the child);
* the reference: a fixed NumPy workload (float32 matrix products and elementwise
  functions on 256 x 256 arrays, one thread), whose CPU time (of the loop alone,
  imports excluded) changes only with the host's speed.

The environment is a fresh virtual environment with ``pip install <this checkout>``
(what the README's first command makes; removed afterwards), or ``--venv PATH``. One
untimed run fills the compilation cache of its own folder first.

Reported: every round's job and reference CPU; the job's median, 90th percentile and
maximum, and how many rounds went over 8 s; the reference's spread (each round over the
fastest round), and the correlation of the two over rounds.

Run: ``python benchmarks/bench_cli_cpu.py [--repeats 15] [--venv PATH]``
(result: ``benchmarks/results/cli_cpu.md``; ``docs/guide/cli.md``, "CPU time", quotes
it).
"""

from __future__ import annotations

import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: issue 30's goal for the warm main job, CPU s
GOAL_S = 8.0
#: The reference: about 0.5 s of CPU on this host when it is quiet; one BLAS thread.
REFERENCE = """
import time
import numpy as np
a = np.random.default_rng(0).standard_normal((256, 256)).astype(np.float32) / 16
t = time.process_time()
for _ in range(1000):
    b = np.tanh(a @ a)
    a = (a + 0.5 * np.exp(-b * b)) / 1.5
print(time.process_time() - t)
"""
ONE_THREAD = {
    "OMP_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}


def child_cpu(cmd: list, env: dict) -> float:
    """User + sys CPU seconds of a child process (which must succeed)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(cmd, check=True, capture_output=True, env=env)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def make_venv(folder: Path) -> Path:
    """A fresh virtual environment with this checkout installed; its ``bin``."""
    subprocess.run([sys.executable, "-m", "venv", str(folder)], check=True)
    py = folder / "bin" / "python"
    subprocess.run([py, "-m", "pip", "install", "-q", "--upgrade", "pip"], check=True)
    subprocess.run([py, "-m", "pip", "install", "-q", str(REPO)], check=True)
    return py.parent


def percentile(values: list, q: float) -> float:
    """The ``q``-quantile by linear interpolation between order statistics."""
    s = sorted(values)
    pos = q * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (pos - lo) * (s[hi] - s[lo])


def main():
    from _common import base_parser

    parser = base_parser(" ".join(__doc__.split("\n\n")[0].split()))
    parser.set_defaults(repeats=15)
    parser.add_argument(
        "--venv", type=Path, default=None, help="an existing environment to time"
    )
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench_cli_cpu_"))
    try:
        run(args, work)
    finally:  # the venv (~0.7 GB) and the cache
        shutil.rmtree(work, ignore_errors=True)


def run(args, work: Path) -> None:
    from _common import write_results

    repeats = 3 if args.quick else args.repeats
    if args.venv is None:
        print("fresh venv: pip install . ...", flush=True)
        bin_dir = make_venv(work / "venv")
    else:
        bin_dir = args.venv / "bin"
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("CENLMC_JAX_", "JAX_", "XLA_", "PJRT_"))
    }
    env.update(ONE_THREAD)
    py = bin_dir / "python"
    versions = subprocess.run(
        [
            py,
            "-c",
            "import jax, ml_dtypes, numpy, sys; print(jax.__version__, "
            "ml_dtypes.__version__, numpy.__version__, sys.version.split()[0])",
        ],
        check=True,
        capture_output=True,
        text=True,
        env=env,
    ).stdout.split()
    job = [str(bin_dir / "cenlmc-jax"), "sample", "--compile-cache", str(work / "xla")]
    subprocess.run(job, check=True, capture_output=True, env=env)  # fills the cache
    jobs, refs = [], []
    for i in range(repeats):
        jobs.append(child_cpu(job, env))
        out = subprocess.run(
            [py, "-c", REFERENCE], check=True, capture_output=True, text=True, env=env
        )
        refs.append(float(out.stdout))
        print(
            f"round {i + 1}: job {jobs[-1]:.2f} s, reference {refs[-1]:.3f} s",
            flush=True,
        )
    fastest = min(refs)
    corr = statistics.correlation(jobs, refs) if len(jobs) > 2 else float("nan")
    rows = [
        dict(
            round=i + 1,
            job_cpu_s=round(j, 2),
            reference_cpu_s=round(r, 3),
            host_slowdown=round(r / fastest, 2),
        )
        for i, (j, r) in enumerate(zip(jobs, refs, strict=True))
    ]
    summary = dict(
        job_median_s=statistics.median(jobs),
        job_p90_s=percentile(jobs, 0.9),
        job_max_s=max(jobs),
        job_min_s=min(jobs),
        rounds_over_goal=sum(j > GOAL_S for j in jobs),
        rounds=repeats,
        reference_spread=max(refs) / fastest,
        correlation_job_reference=corr,
    )
    print(summary, flush=True)
    where = "a fresh venv (pip install .)" if args.venv is None else "the venv given"
    write_results(
        "cli_cpu",
        dict(
            summary=summary,
            goal_s=GOAL_S,
            jax=versions[0],
            ml_dtypes=versions[1],
            numpy=versions[2],
            python=versions[3],
            environment=where,
        ),
        rows,
        out_dir=args.out_dir,
        title="The CLI's main job, warm: CPU time by round, beside the host's speed",
        notes=[
            "`cenlmc-jax sample`, warm compilation cache, user + sys CPU of the "
            f"child; {where}: JAX {versions[0]}, ml_dtypes {versions[1]}, "
            f"NumPy {versions[2]}, Python {versions[3]}.",
            f"Job: median **{summary['job_median_s']:.2f} s**, 90th percentile "
            f"{summary['job_p90_s']:.2f} s, range {summary['job_min_s']:.2f}-"
            f"{summary['job_max_s']:.2f} s; {summary['rounds_over_goal']} of "
            f"{repeats} rounds over the {GOAL_S:g} s goal.",
            f"Reference (a fixed NumPy workload, one thread, run right after each "
            f"job): its slowest round took {summary['reference_spread']:.2f}x its "
            f"fastest; correlation of job and reference over the rounds "
            f"{corr:.2f}. host_slowdown: the round's reference over the fastest.",
        ],
    )


if __name__ == "__main__":
    main()
