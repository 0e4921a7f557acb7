"""A second identical ``cj.langevin_warmup`` call compiles nothing (issue 29, item 4).

kidiq (posteriordb, d = 3), N = 256 particles from ``Uniform(-2, 2)``, float64: three
identical calls of ``cj.langevin_warmup`` in one process, per sampler (``mala``, the
default, and ``lmc``), each sampler in a fresh process. Per call: the wall time and
the XLA compilations it made (``jax.monitoring``'s backend-compile events). The
target: the second call takes <= 10 % of the first.

``python benchmarks/bench_warmup_compile.py`` writes
``benchmarks/results/warmup_compile.{json,md}``.
"""

from __future__ import annotations

import json
import subprocess
import sys

from _common import base_parser, write_results

CHILD = r"""
import json, sys, time
import jax
jax.config.update("jax_enable_x64", True)
import cenlmc_jax as cj
from cenlmc_jax.models import posteriordb

compiles = []
jax.monitoring.register_event_duration_secs_listener(
    lambda name, secs, **kw: compiles.append(secs)
    if name == "/jax/core/compile/backend_compile_duration"
    else None
)
post = posteriordb.load("kidiq-kidscore_momiq")
x0 = jax.random.uniform(jax.random.key(0), (256, post.d), minval=-2.0, maxval=2.0)
out = []
for i in range(int(sys.argv[2])):
    before = len(compiles)
    t = time.perf_counter()
    w = cj.langevin_warmup(
        jax.random.key(1), post.logdensity_fn, x0, sampler=sys.argv[1]
    )
    jax.block_until_ready(w.positions)
    out.append(dict(seconds=time.perf_counter() - t, compiles=len(compiles) - before))
print(json.dumps(out))
"""


def main():
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=3)
    args = parser.parse_args()
    rows = []
    for sampler in ("mala", "lmc"):
        proc = subprocess.run(
            [sys.executable, "-c", CHILD, sampler, str(args.calls)],
            capture_output=True,
            text=True,
            check=True,
        )
        calls = json.loads(proc.stdout.strip().splitlines()[-1])
        first = calls[0]["seconds"]
        for i, c in enumerate(calls):
            rows.append(
                dict(
                    sampler=sampler,
                    call=i + 1,
                    seconds=round(c["seconds"], 3),
                    compiles=c["compiles"],
                    of_first=round(c["seconds"] / first, 4),
                )
            )
        print(rows[-args.calls :], flush=True)
    write_results(
        "warmup_compile",
        dict(calls=args.calls),
        rows,
        title="A second identical cj.langevin_warmup call (issue 29, item 4)",
        notes=[
            "kidiq, N = 256, float64; one fresh process per sampler, its calls in "
            "order; compiles: XLA backend compilations during the call; of_first: "
            "the call's wall time over the first call's (target <= 0.10 for the "
            "second).",
            "Shared 2-core machine: wall times are noisy; the compile counts are not.",
        ],
    )


if __name__ == "__main__":
    main()
