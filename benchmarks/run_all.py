"""Run every benchmark in sequence: ``python benchmarks/run_all.py [--quick]``.

Each script runs in its own process (the sharding benchmark must set its
device-count flag before JAX starts) and writes its own
``benchmarks/results/NAME.{json,md}``; this file then lists what was written.
Extra arguments (e.g. ``--quick``, ``--repeats 3``) go to every script.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SCRIPTS = [
    "bench_pairwise.py",  # issue 3/5: dense vs tiled force, SGEMM fraction
    "bench_scale.py",  # issue 5: N up to 10^6, mask flips, cenlmc_step time and memory
    "bench_sharding.py",  # issue 5: 4 forced CPU devices vs 1
    "bench_cenlmc.py",  # issue 3: CEnLMC vs LMC with an expensive gradient
    "bench_lmc_stream.py",  # issue 2: 10^5 particles x 10^3 steps, streaming
    "bench_irreversible.py",  # issue 4: Gamma vs RW-MH ESS
    "bench_sgrhmc.py",  # issue 4: sgrhmc_step vs SGHMC step
    "bench_fraction.py",  # issue 12: CEnLMC's ensemble fraction against accuracy
    "bench_peers.py",  # issue 10: against BlackJAX 1.7.1 (the bench extra); the Q-sweep
    # issue 12: time and model solves to equal accuracy on inverse problems
    "bench_inverse.py",
    # issue 29: 1,024 chains, gradients to b2max < 0.01 (LAPS, MEADS, ChEES, NUTS)
    "bench_parallel.py",
    # issue 29: a second identical cj.langevin_warmup call compiles nothing
    "bench_warmup_compile.py",
]


def main() -> int:
    failed = []
    for script in SCRIPTS:
        t0 = time.perf_counter()
        print(f"== {script}", flush=True)
        code = subprocess.call([sys.executable, str(HERE / script), *sys.argv[1:]])
        print(
            f"== {script}: exit {code} after {time.perf_counter() - t0:.0f} s",
            flush=True,
        )
        if code:
            failed.append(script)
    print(
        "results:", ", ".join(sorted(p.name for p in (HERE / "results").glob("*.md")))
    )
    if failed:
        print("FAILED:", ", ".join(failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
