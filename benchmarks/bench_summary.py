"""``cj.summary`` of a large trace, before and after (issue 17, item 6: 27 s first call,
17 s after).

Before, the summary called the public diagnostics one by one
(``mcse`` x 2, ``effective_sample_size`` bulk and tail,
``potential_scale_reduction(rank=True)``): five compilations, and the ranks
(XLA's CPU sort) three times. After, ``diagnostics.chains.summary_diagnostics``:
the ranks sorted once per coordinate in NumPy, every split-chain ESS one
``_ess_core`` and one compilation per shape.

Both on the same draws in one process (a random walk plus noise, 2,000
chains x 1,000 draws x 2 coordinates; ``--quick``: 200 x 500 x 2): the first
call (compile and run) of each, then ``--repeats`` warm calls alternating; the
figures are the medians and the median of the per-repeat ratios, and the
largest relative difference between the two (they compute the same formulas).

``python benchmarks/bench_summary.py``. Writes benchmarks/results/summary.{json,md}.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import base_parser, write_results  # noqa: E402

import cenlmc_jax as cj  # noqa: E402
from cenlmc_jax import diagnostics as dg  # noqa: E402
from cenlmc_jax.diagnostics.chains import summary_diagnostics  # noqa: E402
from cenlmc_jax.diagnostics.summary import _x64  # noqa: E402

KEYS = ("mcse_mean", "mcse_sd", "ess_bulk", "ess_tail", "r_hat")


def before(x):
    """The summary's diagnostic columns as computed before (the public functions, one at
    a time)."""
    import jax.numpy as jnp

    x = jnp.asarray(x)
    out = (
        dg.mcse(x, 0, 1, split=True),
        dg.mcse(x, 0, 1, statistic="sd", split=True),
        dg.effective_sample_size(x, 0, 1, method="bulk"),
        dg.effective_sample_size(x, 0, 1, method="tail"),
        dg.potential_scale_reduction(x, 0, 1, rank=True),
    )
    return {k: np.asarray(v, np.float64) for k, v in zip(KEYS, out, strict=True)}


def timed(fn, x):
    t0 = time.perf_counter()
    out = fn(x)
    return out, time.perf_counter() - t0


def main():
    args = base_parser(" ".join(__doc__.split("\n\n")[0].split())).parse_args()
    m, n, d = (200, 500, 2) if args.quick else (2000, 1000, 2)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((m, n, d)).cumsum(axis=1) * 0.05 + rng.standard_normal(
        (m, n, d)
    )
    fns = {"before": before, "after": summary_diagnostics}
    with _x64():
        first = {k: timed(f, x) for k, f in fns.items()}
        warm = {k: [] for k in fns}
        for _ in range(args.repeats):
            for k, f in fns.items():
                warm[k].append(timed(f, x)[1])
        t0 = time.perf_counter()
        cj.summary(x)
        summary_s = time.perf_counter() - t0  # the whole summary (after), warm
    old, new = first["before"][0], first["after"][0]
    rel = max(float(np.max(np.abs(new[k] - old[k]) / np.abs(old[k]))) for k in KEYS)
    ratios = [b / a for b, a in zip(warm["before"], warm["after"], strict=True)]
    rows = [
        dict(
            shape=f"{m} x {n} x {d}",
            before_first_s=round(first["before"][1], 2),
            after_first_s=round(first["after"][1], 2),
            before_warm_s=round(statistics.median(warm["before"]), 2),
            after_warm_s=round(statistics.median(warm["after"]), 2),
            warm_ratio=round(statistics.median(ratios), 1),
            first_ratio=round(first["before"][1] / first["after"][1], 1),
            summary_warm_s=round(summary_s, 2),
            max_rel_diff=f"{rel:.1e}",
        )
    ]
    print(rows)
    notes = [
        "first: compile and run, each variant's first call in this process; warm: "
        f"medians of {args.repeats} alternating calls, warm_ratio the median of the "
        "per-repeat ratios before/after.",
        "max_rel_diff: the largest relative difference of mcse_mean, mcse_sd, "
        "ess_bulk, ess_tail, r_hat between the two (same formulas, different orders of "
        "sums and sorts).",
        "summary_warm_s: one warm cj.summary call (after), with mean, sd and "
        "quantiles.",
    ]
    write_results(
        "summary",
        dict(rows=rows),
        rows,
        out_dir=args.out_dir,
        notes=notes,
        title="cj.summary of a large trace: ranks once, one compilation (issue 17)",
        command="python benchmarks/bench_summary.py"
        + (" --quick" if args.quick else ""),
    )


if __name__ == "__main__":
    main()
