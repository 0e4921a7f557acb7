"""What ``ml_dtypes``'s version costs the CLI's main job: fresh virtual environments
that differ only in it, timed interleaved.

Why: JAX imports ``ml_dtypes``; version 0.7.0 registers its dtypes' NumPy loops one at
a time, and on NumPy 2.4 each registration scans NumPy's loop list, so importing it
costs a large share of a warm ``cenlmc-jax sample``. The package therefore excludes
that one release (``ml_dtypes!=0.7.0``: ``docs/dependencies.md``);
``docs/guide/cli.md`` ("CPU time") quotes this file.

For each version a virtual environment is made (``pip install <this checkout>``,
then ``pip install --no-deps ml_dtypes==V`` over the package's own exclusion of
0.7.0, from the package registry), then each is run once untimed (the
compilation cache of its own folder fills), then ``--repeats`` rounds each time, in
every environment in turn: ``import ml_dtypes`` after ``import numpy`` (process CPU of
the import), and ``cenlmc-jax sample`` on its warm cache (user + sys CPU of the child).
Reported: medians, and the median over rounds of the paired difference from the first
version.

Run: ``python benchmarks/bench_ml_dtypes.py [--versions 0.6.0 0.7.0] [--repeats 5]``
(result: benchmarks/results/ml_dtypes.md).
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
IMPORT = (
    "import time, numpy; t = time.process_time(); import ml_dtypes; "
    "print(time.process_time() - t, ml_dtypes.__version__)"
)


def child_cpu(cmd: list) -> float:
    """User + sys CPU seconds of a child process (which must succeed)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(cmd, check=True, capture_output=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def make_venv(folder: Path, version: str) -> Path:
    subprocess.run([sys.executable, "-m", "venv", str(folder)], check=True)
    py = folder / "bin" / "python"
    subprocess.run([py, "-m", "pip", "install", "-q", str(REPO)], check=True)
    # over the package's own requirement (it excludes 0.7.0: docs/dependencies.md)
    subprocess.run(
        [py, "-m", "pip", "install", "-q", "--no-deps", f"ml_dtypes=={version}"],
        check=True,
    )
    return py


def main():
    from _common import base_parser

    parser = base_parser(" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--versions", nargs="+", default=["0.6.0", "0.7.0"])
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench_ml_dtypes_"))
    try:
        run(args, work)
    finally:  # the venvs and caches (~1 GB)
        shutil.rmtree(work, ignore_errors=True)


def run(args, work: Path) -> None:
    from _common import write_results

    repeats = 2 if args.quick else args.repeats
    envs = {}
    for v in args.versions:
        print(f"venv with ml_dtypes {v} ...", flush=True)
        py = make_venv(work / f"venv-{v}", v)
        cli = [str(py.parent / "cenlmc-jax"), "sample", "--compile-cache"]
        envs[v] = (py, cli + [str(work / f"cache-{v}")])
        subprocess.run(envs[v][1], check=True, capture_output=True)  # fills the cache
    times = {v: {"import": [], "cli": []} for v in envs}
    for _ in range(repeats):
        for v, (py, cli) in envs.items():
            out = subprocess.run(
                [py, "-c", IMPORT], check=True, capture_output=True, text=True
            )
            seconds, found = out.stdout.split()
            assert found == v, (found, v)
            times[v]["import"].append(float(seconds))
            times[v]["cli"].append(child_cpu(cli))
    first = args.versions[0]
    rows = []
    for v in envs:
        pairs = zip(times[first]["cli"], times[v]["cli"], strict=True)
        diff = [b - a for a, b in pairs]
        rows.append(
            dict(
                ml_dtypes=v,
                import_s=statistics.median(times[v]["import"]),
                cli_warm_cpu_s=statistics.median(times[v]["cli"]),
                cli_minus_first_s=statistics.median(diff),
                cli_all_s=[round(t, 2) for t in times[v]["cli"]],
            )
        )
        print(rows[-1], flush=True)
    write_results(
        "ml_dtypes",
        dict(repeats=repeats, versions=args.versions, cores=os.cpu_count()),
        rows,
        out_dir=args.out_dir,
        title="ml_dtypes's version and the CLI's main job (fresh venvs, interleaved)",
        notes=[
            "import_s: process CPU of `import ml_dtypes` after `import numpy`, "
            "median; cli_warm_cpu_s: user + sys CPU of `cenlmc-jax sample` on its "
            "environment's warm compilation cache, median; cli_minus_first_s: the "
            "median over rounds of this version's job minus ml_dtypes "
            f"{first}'s in the same round.",
            "The environments differ only in ml_dtypes (the same checkout, the same "
            "JAX, NumPy and the rest, as pip resolves them).",
        ],
    )


if __name__ == "__main__":
    main()
