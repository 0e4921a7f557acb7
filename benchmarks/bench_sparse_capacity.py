"""The block-sparse pair list's capacity cliff, before and after (issue 17, item 6,
first row).

Before: the list held at most 2^23 tile pairs whatever N; at N = 2^20, d = 2
(CEnLMC-shaped ensemble, η = R2 = sqrt(h d), h = 0.05, the tiles 64 x 32 of
``SPARSE_BLOCK_ROWS/COLS``) the plan lists more, so every call silently ran the
dense tiles. After: ``sparse_capacity`` allows ``max(2^23, 32 N)`` entries and a
fallback warns (``SparseFallbackWarning``).

Two parts, one process:

* the plan at N = 2^20, d = 2 (skipped with ``--quick``): the listed tile
  pairs against the old and the new capacity (no force is folded: a sparse
  call there takes minutes on this machine, a dense one hours);
* the cliff scaled down to N = 32,768, d = 2 (``--quick``: 8,192): the same
  ensemble's force with the old rule's outcome (a capacity the list exceeds by
  the same factor as at N = 2^20, so the dense tiles run) and with the new
  capacity (the sparse tiles run), calls alternating, ``--repeats`` each; the
  figure is the median of the per-repeat ratios.

``python benchmarks/bench_sparse_capacity.py`` (about a minute on 2 busy cores).
Writes benchmarks/results/sparse_capacity.{json,md}.
"""

from __future__ import annotations

import functools
import math
import statistics
import sys
import time
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import base_parser, write_results  # noqa: E402
from bench_pairwise import make_ensemble  # noqa: E402

from cenlmc_jax.pairwise import tiled  # noqa: E402
from cenlmc_jax.pairwise.algebra import prepare, tile_spec  # noqa: E402
from cenlmc_jax.pairwise.sparsity import sort_spatially  # noqa: E402

H = 0.05
OLD_MAX_PAIRS = 2**23


def listed_pairs(x, f, log_p, w, eta):
    """Tile pairs the default plan lists (an unbounded list: capacity of all tile
    pairs)."""
    n, d = x.shape
    br, bc = tiled.SPARSE_BLOCK_ROWS, tiled.SPARSE_BLOCK_COLS

    @jax.jit
    def plan(x, f, log_p, w):
        _, p = sort_spatially(prepare(x, f, log_p, eta, w, eta))
        return tiled.sparse_plan(
            p, br, bc, 1, tile_spec(d, x.dtype)
        ).n_pairs  # capacity 1: counts, stores 1

    return int(plan(x, f, log_p, w))


def compiled_with_capacity(capacity, x, f, log_p, w, eta):
    """``ensemble_force_tiled(block_sparse=True)`` compiled with the pair list's
    capacity fixed to ``capacity``."""
    raw = tiled._tiled_sparse.__wrapped__
    fn = functools.partial(
        raw,
        block_size=None,
        block_cols=None,
        group=None,
        precision=None,
        distances=None,
        max_active=tiled.SPARSE_MAX_ACTIVE,
    )
    original = tiled.sparse_capacity
    tiled.sparse_capacity = lambda *a, **k: capacity
    try:
        return (
            jax.jit(fn)
            .lower(x, f, log_p, jnp.asarray(eta, x.dtype), w, jnp.asarray(eta, x.dtype))
            .compile()
        )
    finally:
        tiled.sparse_capacity = original


def main():
    args = base_parser(" ".join(__doc__.split("\n\n")[0].split())).parse_args()
    d = 2
    eta = math.sqrt(H * d)
    rows, notes = [], []
    if not args.quick:
        n = 2**20
        x, f, log_p, w, _ = make_ensemble(n, d)
        t0 = time.perf_counter()
        listed = listed_pairs(x, f, log_p, w, eta)
        plan_s = time.perf_counter() - t0
        new_cap = tiled.sparse_capacity(
            n, tiled.SPARSE_BLOCK_ROWS, tiled.SPARSE_BLOCK_COLS
        )
        rows.append(
            dict(
                part="plan",
                n=n,
                d=d,
                listed=listed,
                old_capacity=OLD_MAX_PAIRS,
                new_capacity=new_cap,
                old_runs="dense" if listed > OLD_MAX_PAIRS else "sparse",
                new_runs="dense" if listed > new_cap else "sparse",
                plan_s=round(plan_s, 1),
            )
        )
        del x, f, log_p, w
    n = 8192 if args.quick else 32768
    x, f, log_p, w, _ = make_ensemble(n, d)
    listed = listed_pairs(x, f, log_p, w, eta)
    ratio = 17_650_000 / OLD_MAX_PAIRS  # how far the N = 2^20 list exceeds the old cap
    old_cap = int(listed / ratio)
    new_cap = tiled.sparse_capacity(n, tiled.SPARSE_BLOCK_ROWS, tiled.SPARSE_BLOCK_COLS)
    calls = {
        name: compiled_with_capacity(cap, x, f, log_p, w, eta)
        for name, cap in (("old", old_cap), ("new", new_cap))
    }
    a = (x, f, log_p, jnp.asarray(eta, x.dtype), w, jnp.asarray(eta, x.dtype))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outs = {k: jax.block_until_ready(c(*a)) for k, c in calls.items()}  # warm-up
    said = [
        str(c.message)
        for c in caught
        if issubclass(c.category, tiled.SparseFallbackWarning)
    ]
    times = {k: [] for k in calls}
    for _ in range(args.repeats):
        for k, c in calls.items():
            t0 = time.perf_counter()
            jax.block_until_ready(c(*a))
            times[k].append(time.perf_counter() - t0)
    ratios = [o / s for o, s in zip(times["old"], times["new"], strict=True)]
    diff = float(jnp.max(jnp.abs(outs["old"].force_sum - outs["new"].force_sum)))
    scale = float(jnp.max(jnp.abs(outs["new"].force_sum)))
    counts_equal = bool(
        np.array_equal(np.asarray(outs["old"].n_ball), np.asarray(outs["new"].n_ball))
        and np.array_equal(np.asarray(outs["old"].n_r2), np.asarray(outs["new"].n_r2))
    )
    rows.append(
        dict(
            part="force",
            n=n,
            d=d,
            listed=listed,
            old_capacity=old_cap,
            new_capacity=new_cap,
            old_s=round(statistics.median(times["old"]), 3),
            new_s=round(statistics.median(times["new"]), 3),
            old_over_new=round(statistics.median(ratios), 1),
            warned=len(said),
            counts_equal=counts_equal,
            force_rel_diff=f"{diff / scale:.1e}",
        )
    )
    notes.append(
        "plan: the listed tile pairs at N = 2^20 against the old fixed capacity 2^23 "
        "and the new one max(2^23, 32 N); 'runs' says which tiles a call would fold."
    )
    notes.append(
        "force: the cliff scaled down: 'old' has a capacity the list exceeds by "
        f"{ratio:.2f}x (as at N = 2^20 before), so it runs the dense tiles (and now "
        f"warns); 'new' the new capacity. old_over_new: median of {args.repeats} "
        "per-repeat time ratios, calls alternating; exact either way (counts equal, "
        "forces to float32 rounding)."
    )
    if said:
        notes.append(f"the warning: {said[0]}")
    print(rows)
    columns = [
        "part",
        "n",
        "d",
        "listed",
        "old_capacity",
        "new_capacity",
        "old_runs",
        "new_runs",
        "plan_s",
        "old_s",
        "new_s",
        "old_over_new",
        "warned",
        "counts_equal",
        "force_rel_diff",
    ]
    write_results(
        "sparse_capacity",
        dict(rows=rows),
        rows,
        out_dir=args.out_dir,
        columns=columns,
        title="Block-sparse pair list: capacity from N (issue 17)",
        notes=notes,
        command="python benchmarks/bench_sparse_capacity.py"
        + (" --quick" if args.quick else ""),
    )


if __name__ == "__main__":
    main()
