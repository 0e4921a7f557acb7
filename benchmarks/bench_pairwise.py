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
"""

from __future__ import annotations

import functools
import math
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import base_parser, compiled_memory, fmt_bytes, sgemm_rate, time_call, write_results  # noqa: E402

from cenlmc_jax.pairwise import default_block_size, ensemble_force  # noqa: E402


def make_ensemble(n: int, d: int, seed: int = 0, h: float = 0.05):
    """An ensemble as after an LMC step on a standard Gaussian (docs/algorithms.md §3)."""
    k1, k2 = jax.random.split(jax.random.key(seed))
    x_prev = jax.random.normal(k1, (n, d))
    w = x_prev - h * x_prev
    x = w + math.sqrt(2 * h) * jax.random.normal(k2, (n, d))
    f = 0.5 * jnp.sum(x**2, axis=1)
    log_p = -(d / 2) * math.log(4 * math.pi * h) - jnp.sum((x - w) ** 2, axis=1) / (4 * h)
    # η = half the typical inter-particle distance sqrt(2d): populated balls.
    eta = 0.5 * math.sqrt(2 * d)
    return x, f, log_p, w, eta


def measure(method: str, x, f, log_p, eta, *, w=None, r2=None, repeats: int, budget_s: float):
    fn = jax.jit(functools.partial(ensemble_force, eta=eta, r2=r2, method=method))
    mem = compiled_memory(fn, x, f, log_p, w=w) if w is not None else compiled_memory(fn, x, f, log_p)
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
        return compiled_memory(lambda x, f, lp, w: fn(x, f, lp, w=w), *shapes, jax.ShapeDtypeStruct(w.shape, w.dtype))
    return compiled_memory(fn, *shapes)


def main() -> None:
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    parser.add_argument("--dims", type=int, nargs="+", default=[2, 10, 100])
    parser.add_argument("--dense-max-n", type=int, default=8192, help="largest N for the dense reference")
    parser.add_argument("--dense-max-bytes", type=float, default=3 * 2**30,
                        help="skip dense where its compiled temporaries exceed this (bytes)")
    parser.add_argument("--with-w", action="store_true", help="also time the CEnLMC variant (w, R2 masks)")
    parser.add_argument("--budget-s", type=float, default=10.0, help="time budget per configuration")
    parser.add_argument("--sgemm-n", type=int, default=4096)
    args = parser.parse_args()
    if args.quick:
        args.sizes, args.dims, args.sgemm_n, args.repeats = [1024, 2048], [2, 10], 1024, 3

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
                t_tiled, m_tiled = measure("tiled", x, f, log_p, eta, w=wv, r2=r2,
                                           repeats=args.repeats, budget_s=args.budget_s)
                flops = pairs * ((4 * d + 2) + (2 * d if with_w else 0))
                row = {
                    "N": n, "d": d, "w": "yes" if with_w else "no",
                    "B": default_block_size(n, with_w=with_w),
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
                    if m_dense["temp_bytes"] is not None and m_dense["temp_bytes"] <= args.dense_max_bytes:
                        t_dense, m_dense = measure("dense", x, f, log_p, eta, w=wv, r2=r2,
                                                   repeats=args.repeats, budget_s=args.budget_s)
                        row.update({
                            "dense_ms": t_dense.median_s * 1e3,
                            "dense_cpu_ms": t_dense.cpu_median_s * 1e3,
                            "dense_pairs_per_s": pairs / t_dense.median_s,
                            "speedup": t_dense.median_s / t_tiled.median_s,
                            "dense_timing": t_dense.as_dict(),
                        })
                        dense_note = fmt_bytes(m_dense["temp_bytes"])
                    else:
                        dense_note = f"{fmt_bytes(m_dense['temp_bytes'])} (skipped)"
                    row["dense_temp_bytes"] = m_dense["temp_bytes"]
                row["dense_temp"] = dense_note
                rows.append(row)
                print(
                    f"N={n:6d} d={d:3d} w={row['w']:3s} B={row['B']:4d} tiled {row['tiled_ms']:9.2f} ms "
                    f"{row['tiled_pairs_per_s']:.3g} pairs/s temp {row['tiled_temp']:>10s} "
                    f"({row['frac_sgemm']:.0%} SGEMM) | dense "
                    + (f"{row['dense_ms']:9.2f} ms x{row['speedup']:.1f}" if "dense_ms" in row else "   -   ")
                    + f" temp {dense_note}",
                    flush=True,
                )

    target = next((r for r in rows if r["N"] == 4096 and r["d"] == 10 and r["w"] == "no"), None)
    notes = [
        f"float32 SGEMM ({args.sgemm_n}x{args.sgemm_n}, jnp.dot, HIGHEST): {peak / 1e9:.1f} GFLOP/s.",
        "pairs = N^2; times are medians of repeated blocked runs (benchmarks/_common.time_call); "
        "*_cpu_ms = process CPU time per call, all threads (the work; wall ~ cpu/2 on a quiet 2-core machine "
        "if both cores are used); temp = XLA compiled temporary memory.",
        "frac_sgemm counts the tiled kernel's matmul flops (4d+2 per pair, +2d with w) against the SGEMM rate.",
        "dense = the N x N direct-difference reference (an (N, N, d) temporary, weights per pair in log space); "
        "skipped where its compiled temporaries exceed --dense-max-bytes.",
        "Shared machine: other jobs were running; rerun on a quiet machine for quotable numbers.",
    ]
    if target is not None:
        ok_rate = target["tiled_pairs_per_s"] >= 1.5e9
        sp = target.get("speedup")
        notes.append(
            f"Target N=4096, d=10: tiled {target['tiled_pairs_per_s']:.3g} pairs/s "
            f"({'meets' if ok_rate else 'below'} 1.5e9); speed-up over dense "
            + (f"{sp:.1f}x ({'meets' if sp >= 5 else 'below'} 5x)." if sp is not None else "not measured.")
        )
    d100 = [r for r in rows if r["d"] == 100 and r["w"] == "no"]
    if d100:
        best = max(d100, key=lambda r: r["frac_sgemm"])
        notes.append(f"d=100: best fraction of SGEMM {best['frac_sgemm']:.0%} at N={best['N']} (stretch goal 60%).")

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
        "pairwise",
        {"sgemm": sgemm, "args": {k: v for k, v in vars(args).items() if k != "out_dir"}},
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
