"""Pairwise ensemble force: dense reference vs row-tiled kernel (issue 3, issue 5).

Measures, side by side in one run, for N = 1,024 ... 16,384 and d = 2, 10, 100:

* pairs/s (pairs = N²) of ``ensemble_force(method="tiled")`` and, where its
  compiled temporary memory fits (``--dense-max-bytes``), of
  ``method="dense"``; the speed-up tiled/dense;
* the compiled temporary memory (XLA ``memory_analysis().temp_size_in_bytes``)
  of both: the tiled kernel must stay O(N d + B N);
* the machine's float32 SGEMM rate (``jnp.dot`` of 4096 x 4096) and the
  fraction of it the tiled kernel reaches, counting its useful matmul flops
  ``(4d + 2)`` per pair (Gram product 2d, force product 2(d+1)).

Targets (issue 3, on the 2-core reference CPU): tiled >= 1.5e9 pairs/s and >= 5x
dense at N = 4096, d = 10. Stretch (issue 5): >= 60% of SGEMM at d = 100.

Run ``python benchmarks/bench_pairwise.py`` (full, a few minutes) or with
``--quick``. Writes benchmarks/results/pairwise.{json,md}.

Row-block sweep (issue 17, "block size by d"): ``--blocks 128 256 512 1024``
times the dense tiled force at the given row-block sizes side by side
(interleaved repeats: every size once per round, medians over ``--repeats``
rounds), together with the default before the rule took d
(``default_block_size(N)``, timed as an explicit block size) and the
default now (``block_size=None``, i.e. ``default_block_size(N, d=d)``).
Sizes over the memory cap (:data:`~cenlmc_jax.pairwise.tiled.TILE_MAX_BYTES`)
are replaced by the largest size under it. Ratios are to the old default
within the run. Writes benchmarks/results/block_by_d.{json,md} (``--name``)::

    nice -n 10 python benchmarks/bench_pairwise.py --blocks 128 256 512 1024 \
        --dims 2 10 30 100 --sizes 4096 8192 16384 --repeats 7
"""

from __future__ import annotations

import functools
import math
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import (
    base_parser,
    compiled_memory,
    fmt_bytes,
    sgemm_rate,
    time_call,
    write_results,
)  # noqa: E402

from cenlmc_jax.pairwise import default_block_size, ensemble_force  # noqa: E402
from cenlmc_jax.pairwise.tiled import TILE_MAX_BYTES  # noqa: E402


def make_ensemble(n: int, d: int, seed: int = 0, h: float = 0.05):
    """An ensemble as after an LMC step on a standard Gaussian (docs/algorithms.md
    §3)."""
    k1, k2 = jax.random.split(jax.random.key(seed))
    x_prev = jax.random.normal(k1, (n, d))
    w = x_prev - h * x_prev
    x = w + math.sqrt(2 * h) * jax.random.normal(k2, (n, d))
    f = 0.5 * jnp.sum(x**2, axis=1)
    log_p = -(d / 2) * math.log(4 * math.pi * h) - jnp.sum((x - w) ** 2, axis=1) / (
        4 * h
    )
    # η = half the typical inter-particle distance sqrt(2d): populated balls.
    eta = 0.5 * math.sqrt(2 * d)
    return x, f, log_p, w, eta


def measure(
    method: str, x, f, log_p, eta, *, w=None, r2=None, repeats: int, budget_s: float
):
    fn = jax.jit(functools.partial(ensemble_force, eta=eta, r2=r2, method=method))
    mem = (
        compiled_memory(fn, x, f, log_p, w=w)
        if w is not None
        else compiled_memory(fn, x, f, log_p)
    )
    # One run after compilation sets how many repeats fit the time budget.
    jax.block_until_ready(fn(x, f, log_p, w=w))
    t0 = time.perf_counter()
    jax.block_until_ready(fn(x, f, log_p, w=w))
    one = time.perf_counter() - t0
    reps = int(max(1, min(repeats, budget_s // max(one, 1e-9))))
    t = time_call(fn, x, f, log_p, w=w, repeats=reps)
    return t, mem


def dense_temp_bytes(x, f, log_p, eta, w=None, r2=None):
    fn = jax.jit(functools.partial(ensemble_force, eta=eta, r2=r2, method="dense"))
    shapes = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in (x, f, log_p)]
    if w is not None:
        return compiled_memory(
            lambda x, f, lp, w: fn(x, f, lp, w=w),
            *shapes,
            jax.ShapeDtypeStruct(w.shape, w.dtype),
        )
    return compiled_memory(fn, *shapes)


def cap_block(n: int, *, itemsize: int = 4, with_w: bool = False) -> int:
    """Largest multiple of 8 rows whose live (B, n) temporaries stay under
    TILE_MAX_BYTES (as in default_block_size)."""
    live = 5 if with_w else 3
    return max(8, (TILE_MAX_BYTES // (live * n * itemsize)) // 8 * 8)


def block_sweep(args, peak: float) -> None:
    """Time the tiled force at several row-block sizes side by side (interleaved
    rounds); write args.name."""
    rows, pairs_rows = [], []
    for d in args.dims:
        for n in args.sizes:
            x, f, log_p, w, eta = make_ensemble(n, d)
            wv, r2 = (w, eta) if args.with_w else (None, None)
            cap = cap_block(n, with_w=args.with_w)
            old = default_block_size(n, with_w=args.with_w)
            new = default_block_size(n, with_w=args.with_w, d=d)
            # label -> block_size argument (None: the library's default now)
            cands = {"old": old, "new": None}
            for b in args.blocks:
                b = min(b, cap)
                if b not in cands.values():
                    cands[str(b)] = b
            fns = {
                k: jax.jit(
                    functools.partial(
                        ensemble_force, eta=eta, r2=r2, method="tiled", block_size=b
                    )
                )
                for k, b in cands.items()
            }
            for fn in fns.values():  # compile and warm up
                jax.block_until_ready(fn(x, f, log_p, w=wv))
            times, cpu = {k: [] for k in fns}, {k: [] for k in fns}
            keys = list(fns)
            for r in range(args.repeats):
                for k in (
                    keys[r % len(keys) :] + keys[: r % len(keys)]
                ):  # rotated: no size always first
                    c0, t0 = time.process_time(), time.perf_counter()
                    jax.block_until_ready(fns[k](x, f, log_p, w=wv))
                    times[k].append(time.perf_counter() - t0)
                    cpu[k].append(time.process_time() - c0)
            med = {k: statistics.median(v) for k, v in times.items()}
            cmed = {k: statistics.median(v) for k, v in cpu.items()}
            flops = float(n) * n * ((4 * d + 2) + (2 * d if args.with_w else 0))
            for k, b in cands.items():
                rows.append(
                    {
                        "N": n,
                        "d": d,
                        "w": "yes" if args.with_w else "no",
                        "which": k,
                        "B": new if b is None else b,
                        "ms": med[k] * 1e3,
                        "vs_old": med["old"] / med[k],
                        "cpu_ms": cmed[k] * 1e3,
                        "cpu_vs_old": cmed["old"] / cmed[k],
                        "frac_sgemm": flops / med[k] / peak,
                        "times_s": times[k],
                        "cpu_s": cpu[k],
                    }
                )
            pairs_rows.append(
                {
                    "N": n,
                    "d": d,
                    "w": "yes" if args.with_w else "no",
                    "B_old": old,
                    "B_new": new,
                    "old_ms": med["old"] * 1e3,
                    "new_ms": med["new"] * 1e3,
                    "speedup": med["old"] / med["new"],
                    "old_cpu_ms": cmed["old"] * 1e3,
                    "new_cpu_ms": cmed["new"] * 1e3,
                    "cpu_speedup": cmed["old"] / cmed["new"],
                    "old_frac_sgemm": flops / med["old"] / peak,
                    "new_frac_sgemm": flops / med["new"] / peak,
                }
            )
            print(
                f"N={n:6d} d={d:3d} cap={cap:4d} "
                + " ".join(
                    f"{k}(B={new if b is None else b})={med[k] * 1e3:.1f}ms "
                    f"x{med['old'] / med[k]:.2f} cpu x{cmed['old'] / cmed[k]:.2f}"
                    for k, b in cands.items()
                ),
                flush=True,
            )

    notes = [
        f"float32 SGEMM ({args.sgemm_n}x{args.sgemm_n}, jnp.dot, HIGHEST): "
        f"{peak / 1e9:.1f} GFLOP/s; frac_sgemm counts 4d+2 matmul flops per pair (+2d "
        "with w).",
        f"Each cell: median wall time of {args.repeats} interleaved rounds (every "
        "block size once per round), after one compiling and one warm-up call; rounds "
        "rotate the order. vs_old / speedup = old default's time / this time (> 1: "
        "faster); cpu_* = process CPU time (both threads), less sensitive to other "
        "jobs.",
        "old = default_block_size(N) (the rule before d was taken); new = "
        "block_size=None, the library's default now (default_block_size(N, d=d)). "
        "Sizes over the memory cap TILE_MAX_BYTES are replaced by the largest multiple "
        "of 8 under it.",
        "Shared 2-core machine (other benchmarks running): compare within a row group, "
        "not across runs.",
    ]
    if any(r["frac_sgemm"] > 1 for r in rows):
        notes.append(
            "frac_sgemm > 100% in places: the SGEMM reference, timed once before the "
            "sweep, ran slower than the kernel's matrix products later (other jobs' "
            "load varies): read it as relative only."
        )
    fmt = [
        dict(
            r,
            ms=f"{r['ms']:.1f}",
            vs_old=f"{r['vs_old']:.2f}",
            frac_sgemm=f"{r['frac_sgemm']:.0%}",
            cpu_ms=f"{r['cpu_ms']:.1f}",
            cpu_vs_old=f"{r['cpu_vs_old']:.2f}",
        )
        for r in rows
    ]
    before_after = [
        dict(
            r,
            old_ms=f"{r['old_ms']:.1f}",
            new_ms=f"{r['new_ms']:.1f}",
            speedup=f"{r['speedup']:.2f}",
            old_cpu_ms=f"{r['old_cpu_ms']:.1f}",
            new_cpu_ms=f"{r['new_cpu_ms']:.1f}",
            cpu_speedup=f"{r['cpu_speedup']:.2f}",
            old_frac_sgemm=f"{r['old_frac_sgemm']:.0%}",
            new_frac_sgemm=f"{r['new_frac_sgemm']:.0%}",
        )
        for r in pairs_rows
    ]
    from _common import markdown_table

    json_path, md_path = write_results(
        args.name,
        {
            "sgemm_flops_per_s": peak,
            "args": {k: v for k, v in vars(args).items() if k != "out_dir"},
            "before_after": pairs_rows,
        },
        rows,
        columns=[
            "N",
            "d",
            "w",
            "which",
            "B",
            "ms",
            "vs_old",
            "cpu_ms",
            "cpu_vs_old",
            "frac_sgemm",
        ],
        out_dir=args.out_dir,
        title="Dense tiled force: row-block size by d (issue 17)",
        notes=notes
        + [
            "Before/after (old default vs new default, same run):\n\n"
            + markdown_table(
                before_after,
                [
                    "N",
                    "d",
                    "w",
                    "B_old",
                    "B_new",
                    "old_ms",
                    "new_ms",
                    "speedup",
                    "old_cpu_ms",
                    "new_cpu_ms",
                    "cpu_speedup",
                    "old_frac_sgemm",
                    "new_frac_sgemm",
                ],
            )
            + "\n\nSweep:"
        ],
        md_rows=fmt,
    )
    print(f"wrote {json_path} and {md_path}")


def main() -> None:
    parser = base_parser(" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument(
        "--sizes", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384]
    )
    parser.add_argument("--dims", type=int, nargs="+", default=[2, 10, 100])
    parser.add_argument(
        "--dense-max-n",
        type=int,
        default=8192,
        help="largest N for the dense reference",
    )
    parser.add_argument(
        "--dense-max-bytes",
        type=float,
        default=3 * 2**30,
        help="skip dense where its compiled temporaries exceed this (bytes)",
    )
    parser.add_argument(
        "--with-w",
        action="store_true",
        help="also time the CEnLMC variant (w, R2 masks)",
    )
    parser.add_argument(
        "--budget-s", type=float, default=10.0, help="time budget per configuration"
    )
    parser.add_argument("--sgemm-n", type=int, default=4096)
    parser.add_argument(
        "--blocks",
        type=int,
        nargs="+",
        default=None,
        help="row-block sweep: time these block sizes (and the old and new defaults) "
        "side by side",
    )
    parser.add_argument(
        "--name",
        default=None,
        help="results name (default pairwise, or block_by_d with --blocks)",
    )
    args = parser.parse_args()
    if args.quick:
        args.sizes, args.dims, args.sgemm_n, args.repeats = (
            [1024, 2048],
            [2, 10],
            1024,
            3,
        )
    if args.blocks is not None:
        args.name = args.name or "block_by_d"
        sgemm = sgemm_rate(args.sgemm_n, repeats=args.repeats)
        print(
            f"SGEMM {args.sgemm_n}: {sgemm['flops_per_s'] / 1e9:.1f} GFLOP/s",
            flush=True,
        )
        block_sweep(args, sgemm["flops_per_s"])
        return

    print(f"SGEMM {args.sgemm_n}x{args.sgemm_n} ...", flush=True)
    sgemm = sgemm_rate(args.sgemm_n, repeats=args.repeats)
    peak = sgemm["flops_per_s"]
    print(f"  {peak / 1e9:.1f} GFLOP/s", flush=True)

    rows = []
    variants = [False, True] if args.with_w else [False]
    for d in args.dims:
        for n in args.sizes:
            for with_w in variants:
                x, f, log_p, w, eta = make_ensemble(n, d)
                r2 = eta if with_w else None
                wv = w if with_w else None
                pairs = float(n) * n
                t_tiled, m_tiled = measure(
                    "tiled",
                    x,
                    f,
                    log_p,
                    eta,
                    w=wv,
                    r2=r2,
                    repeats=args.repeats,
                    budget_s=args.budget_s,
                )
                flops = pairs * ((4 * d + 2) + (2 * d if with_w else 0))
                row = {
                    "N": n,
                    "d": d,
                    "w": "yes" if with_w else "no",
                    "B": default_block_size(n, with_w=with_w, d=d),
                    "tiled_ms": t_tiled.median_s * 1e3,
                    "tiled_cpu_ms": t_tiled.cpu_median_s * 1e3,
                    "tiled_pairs_per_s": pairs / t_tiled.median_s,
                    "tiled_temp": fmt_bytes(m_tiled["temp_bytes"]),
                    "tiled_temp_bytes": m_tiled["temp_bytes"],
                    "tiled_gflops": flops / t_tiled.median_s / 1e9,
                    "frac_sgemm": flops / t_tiled.median_s / peak,
                    "tiled_timing": t_tiled.as_dict(),
                }
                dense_note = "-"
                if n <= args.dense_max_n:
                    m_dense = dense_temp_bytes(x, f, log_p, eta, wv, r2)
                    if (
                        m_dense["temp_bytes"] is not None
                        and m_dense["temp_bytes"] <= args.dense_max_bytes
                    ):
                        t_dense, m_dense = measure(
                            "dense",
                            x,
                            f,
                            log_p,
                            eta,
                            w=wv,
                            r2=r2,
                            repeats=args.repeats,
                            budget_s=args.budget_s,
                        )
                        row.update(
                            {
                                "dense_ms": t_dense.median_s * 1e3,
                                "dense_cpu_ms": t_dense.cpu_median_s * 1e3,
                                "dense_pairs_per_s": pairs / t_dense.median_s,
                                "speedup": t_dense.median_s / t_tiled.median_s,
                                "dense_timing": t_dense.as_dict(),
                            }
                        )
                        dense_note = fmt_bytes(m_dense["temp_bytes"])
                    else:
                        dense_note = f"{fmt_bytes(m_dense['temp_bytes'])} (skipped)"
                    row["dense_temp_bytes"] = m_dense["temp_bytes"]
                row["dense_temp"] = dense_note
                rows.append(row)
                print(
                    f"N={n:6d} d={d:3d} w={row['w']:3s} B={row['B']:4d} tiled "
                    f"{row['tiled_ms']:9.2f} ms {row['tiled_pairs_per_s']:.3g} pairs/s "
                    f"temp {row['tiled_temp']:>10s} ({row['frac_sgemm']:.0%} SGEMM) | "
                    "dense "
                    + (
                        f"{row['dense_ms']:9.2f} ms x{row['speedup']:.1f}"
                        if "dense_ms" in row
                        else "   -   "
                    )
                    + f" temp {dense_note}",
                    flush=True,
                )

    target = next(
        (r for r in rows if r["N"] == 4096 and r["d"] == 10 and r["w"] == "no"), None
    )
    notes = [
        f"float32 SGEMM ({args.sgemm_n}x{args.sgemm_n}, jnp.dot, HIGHEST): "
        f"{peak / 1e9:.1f} GFLOP/s.",
        "pairs = N^2; times are medians of repeated blocked runs "
        "(benchmarks/_common.time_call); *_cpu_ms = process CPU time per call, all "
        "threads (the work; wall ~ cpu/2 on a quiet 2-core machine if both cores are "
        "used); temp = XLA compiled temporary memory.",
        "frac_sgemm counts the tiled kernel's matmul flops (4d+2 per pair, +2d with w) "
        "against the SGEMM rate.",
        "dense = the N x N direct-difference reference (an (N, N, d) temporary, "
        "weights per pair in log space); skipped where its compiled temporaries exceed "
        "--dense-max-bytes.",
        "Shared machine: other jobs were running; rerun on a quiet machine for "
        "quotable numbers.",
    ]
    if target is not None:
        ok_rate = target["tiled_pairs_per_s"] >= 1.5e9
        sp = target.get("speedup")
        notes.append(
            f"Target N=4096, d=10: tiled {target['tiled_pairs_per_s']:.3g} pairs/s "
            f"({'meets' if ok_rate else 'below'} 1.5e9); speed-up over dense "
            + (
                f"{sp:.1f}x ({'meets' if sp >= 5 else 'below'} 5x)."
                if sp is not None
                else "not measured."
            )
        )
    d100 = [r for r in rows if r["d"] == 100 and r["w"] == "no"]
    if d100:
        best = max(d100, key=lambda r: r["frac_sgemm"])
        notes.append(
            f"d=100: best fraction of SGEMM {best['frac_sgemm']:.0%} at N={best['N']} "
            "(stretch goal 60%)."
        )

    columns = [
        "N",
        "d",
        "w",
        "B",
        "tiled_ms",
        "tiled_cpu_ms",
        "tiled_pairs_per_s",
        "tiled_temp",
        "tiled_gflops",
        "frac_sgemm",
        "dense_ms",
        "dense_cpu_ms",
        "dense_pairs_per_s",
        "dense_temp",
        "speedup",
    ]
    table = []
    for r in rows:
        t = dict(r)
        t["tiled_pairs_per_s"] = f"{r['tiled_pairs_per_s']:.3g}"
        t["frac_sgemm"] = f"{r['frac_sgemm']:.0%}"
        if "dense_pairs_per_s" in r:
            t["dense_pairs_per_s"] = f"{r['dense_pairs_per_s']:.3g}"
            t["speedup"] = f"{r['speedup']:.1f}x"
        table.append(t)
    json_path, md_path = write_results(
        args.name or "pairwise",
        {
            "sgemm": sgemm,
            "args": {k: v for k, v in vars(args).items() if k != "out_dir"},
        },
        rows,
        columns=columns,
        out_dir=args.out_dir,
        title="Pairwise ensemble force: tiled vs dense",
        notes=notes,
        md_rows=table,
    )
    print(f"wrote {json_path} and {md_path}")


if __name__ == "__main__":
    main()
