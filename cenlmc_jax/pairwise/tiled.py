"""The row-tiled XLA kernel of the ensemble force: the CPU production path.

Folds the blockwise reduction of :mod:`.algebra` (docs/algorithms.md §2-4: the
pair sums ``force_sum_i = Σ_{j≠i} W_ij (x_j - x_i)``, ``n_r2``, ``n_ball``)
with XLA loops: ``lax.map`` over blocks of ``B`` rows, and per row block one
:func:`~.algebra.tile_partial` against all ``N`` columns (or a ``lax.scan`` of
:func:`~.algebra.tile_update` over blocks of ``block_cols`` columns). Temporary
memory ``O(N d + B N)``: no ``N x N`` array, never ``N x N x d``. Per block: a
Gram matrix product (or, for ``d ≤ DIRECT_MAX_D``, exact differences), one
fused elementwise pass over the ``(B, N)`` pairs, the force as one matrix
product ``g · (c ⊙ [x̃, 1])`` with ``c_j = exp(log s_j - m)`` (so the ``exp``
is taken per column, not per pair, unless the weights spread beyond
``max_shared_spread``) and row sums for the counts. With one column tile, the
column work (the weights and the overflow rule's decision) is done once,
outside the loop over row blocks.

The default ``B`` (:func:`default_block_size`) keeps one ``(B, N)`` temporary
near :data:`TILE_TARGET_BYTES`, the block size that was fastest or within noise
of it at d = 10 (benchmarks/results/block_by_d.md); smaller blocks pay per-iteration
overhead and leave the second core idle, larger ones fall out of cache. But at
least ``2 (d + 1)`` rows (issue 17): every row block streams the ``2 (d + 1)``
column numbers of the two matrix products, so few rows at large d waste the
block on them (the same file).

Block-sparse (``block_sparse=True``; KeOps' block-sparse reduction): the
particles are sorted along a Hilbert curve of w (of x without w:
:func:`~.sparsity.sort_spatially`), cut into row tiles of ``B`` and column tiles
of ``C`` particles with bounding boxes in x and w, and :func:`sparse_plan`
lists the tile pairs whose boxes are within η (and R2) up to rounding
(:func:`~.sparsity.tiles_apart`): for the R2 count every pair within R2 in w
is visited, whatever its x-boxes. :func:`block_sparse_partial` then folds
``group`` listed tile pairs per step, side by side, and scatter-adds them to
their rows; the outputs are unsorted. The list has a static capacity (a
fraction ``max_active`` of all tile pairs); when more are active, or when the
weights need a shift per row (the overflow rule), the dense tiles run
instead (a :class:`SparseFallbackWarning` says so, once per reason and
capacity; the capacity grows with N: :func:`sparse_capacity`), so the
result is always exact: the same counts as the dense tiles
(a borderline pair, within rounding of a threshold, may fall either way with
the Gram identity, whose rounding depends on the product's blocking) and
forces equal to rounding. Measured speed-ups: ``pairwise.AUTO_SPARSE_RULE``.

Derivatives: both forms are differentiable in forward and reverse mode
(``jax.jvp``, ``jax.grad``, their ``vmap``s). Every tile is finite (invalid
particles at the far point of :mod:`.algebra`, the double ``where`` on
``1/d²``) and is recomputed in the backward pass (``jax.checkpoint``), so
``jax.grad`` keeps ``O(N d)`` memory, not ``O(N²)``; the block-sparse loop,
a ``while_loop`` over the listed tile pairs, is differentiated through a
loop of static length with the same sums (:func:`_fold_tiles`).
"""

from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from cenlmc_jax._host import warn as host_warn
from cenlmc_jax._validation import check_bool, check_choice, check_int, check_positive
from cenlmc_jax.pairwise.algebra import (
    ColumnWeights,
    PairwiseForce,
    Partial,
    Prepared,
    canonical_precision,
    check_pair_inputs,
    column_weights,
    empty_partial,
    finish,
    pad_particles,
    prepare,
    tile_partial_with,
    tile_spec,
    tile_update,
)
from cenlmc_jax.pairwise.sparsity import (
    SKIP,
    TileBoxes,
    sort_spatially,
    tile_boxes,
    tile_kinds,
    unsort,
)
from cenlmc_jax.types import Array, ArrayLike

__all__ = [
    "ensemble_force_tiled",
    "tiled_partial",
    "block_sparse_partial",
    "sparse_partial",
    "default_block_size",
    "TILE_TARGET_BYTES",
    "TILE_MAX_BYTES",
    "SPARSE_BLOCK_ROWS",
    "SPARSE_BLOCK_COLS",
    "SPARSE_GROUP",
    "LIFT_COLUMNS",
    "SPARSE_SMALL_N",
    "sparse_group",
    "SPARSE_MAX_ACTIVE",
    "SPARSE_MAX_PAIRS",
    "SPARSE_PAIRS_PER_PARTICLE",
    "SparseFallbackWarning",
    "SparseFallback",
    "warn_fallback",
    "SparsePlan",
    "sparse_plan",
    "sparse_capacity",
    "PLAN_SUPER",
]

#: Default working-set target of one row block: bytes of one (B, N) temporary.
TILE_TARGET_BYTES = 4 * 2**20
#: Hard memory cap for the default block: live (B, N) temporaries x B x N x
#: itemsize.
TILE_MAX_BYTES = 64 * 2**20
_MIN_BLOCK = 16
#: Block-sparse defaults: rows per row tile and columns per column tile (the
#: box granularity: smaller boxes skip more), and tile pairs per step (one
#: (group, B, C) pass per step: large enough to amortise the loop).
SPARSE_BLOCK_ROWS = 64
SPARSE_BLOCK_COLS = 32
SPARSE_GROUP = 128
#: The block-sparse fold pads the columns' force operand ``(C, d+1)`` with zero
#: columns to a multiple of this: XLA:CPU's library dot is about a quarter faster
#: on a 32 x 32 tile with 8 columns than with 3, the zeros included (issue 30,
#: benchmarks/results/waste.md (e)).
LIFT_COLUMNS = 8
#: Up to this many particles (columns) the default row tiles are half as tall
#: (tighter boxes skip more of the few tile pairs there are) and a step folds twice
#: as many tile pairs (the same work a step); beyond it the loop's overhead and the
#: longer lists make them slower (benchmarks/results/sparse_tiles.md).
SPARSE_SMALL_N = 4096
#: The pair lists hold at most this fraction of all tile pairs; beyond it the
#: block-sparse call runs the dense tiles instead (decided at run time; both
#: exact) ...
SPARSE_MAX_ACTIVE = 0.5
#: ... and at most ``max(SPARSE_MAX_PAIRS, SPARSE_PAIRS_PER_PARTICLE · N)`` entries:
#: a floor of 2^23 (4 int32 lists of them: 2^27 bytes) and beyond it 32 per
#: particle (512 bytes a particle for the 4 lists), so the cap grows with N. A
#: fixed 2^23 made N = 2^20, d = 2 run the dense tiles, far slower than the sparse
#: sum (issue 17; benchmarks/results/sparse_capacity.md). The lists stay below
#: 2^30 entries (int32 offsets).
SPARSE_MAX_PAIRS = 2**23
SPARSE_PAIRS_PER_PARTICLE = 32
_LIST_MAX = 2**30
#: Tile pairs whose kinds one step of :func:`sparse_plan` decides.
PLAN_CHUNK = 2**18
#: Column tiles per super tile of the two-level :func:`sparse_plan` (used beyond
#: ``2 · PLAN_SUPER`` column tiles, N > 4096 with the default tiles): the row tiles
#: are tested against the super tiles' boxes first, then against the column tiles of
#: the near ones, so the plan costs ``O(N)`` for a localised kernel up to N ~ 2^20,
#: not ``O(N²)`` (benchmarks/results/waste.md, item (d)).
PLAN_SUPER = 64


def sparse_capacity(
    n: int,
    block_rows: int,
    block_cols: int,
    max_active: float = SPARSE_MAX_ACTIVE,
    n_cols: int | None = None,
) -> int:
    """Static length of the block-sparse pair lists for ``n`` rows.

    A fraction ``max_active`` of all tile pairs, at most ``max(SPARSE_MAX_PAIRS,
    SPARSE_PAIRS_PER_PARTICLE · n)`` (memory linear in N, as the number of
    tile pairs within reach of a localised kernel is).

    Args:
      n: the number of rows.
      block_rows: rows per row tile.
      block_cols: columns per column tile.
      max_active: the fraction of all tile pairs the list may hold.
      n_cols: the number of columns (default ``n``).

    Returns:
      The capacity, an int ``>= 1``.
    """
    total = -(-n // block_rows) * -(-(n if n_cols is None else n_cols) // block_cols)
    cap = min(max(SPARSE_MAX_PAIRS, SPARSE_PAIRS_PER_PARTICLE * n), _LIST_MAX)
    return int(max(1, min(math.ceil(max_active * total), cap)))


class SparseFallbackWarning(RuntimeWarning):
    """A block-sparse sum ran the dense tiles instead.

    Exact, but it may be much slower: see :func:`dense_instead`.
    """


class SparseFallback(NamedTuple):
    """Why a block-sparse sum ran the dense tiles, as the compiled program returns it.

    The program returns these flags instead of calling back to the host: a host
    callback's function pointer enters JAX's persistent-cache key (and JAX does not
    write programs with host callbacks to that cache), so a program holding one is
    recompiled in every process (issue 30: ~14 s for the CEnLMC step). The caller
    warns from them (:func:`warn_fallback`) or reports them (the CEnLMC step's
    ``info.dense_fallback``).

    Attributes:
      fits: the pair list held every active tile pair (within its capacity).
      shared: the weights fit one shared shift (no shift per row needed).
      n_pairs: the active tile pairs listed.
    """

    fits: Array
    shared: Array
    n_pairs: Array

    @property
    def ran_dense(self) -> Array:
        """True where the dense tiles ran (any call, under ``vmap``)."""
        return jnp.any(~(self.fits & self.shared))


#: (reason, capacity) pairs already warned about in this process: one warning each,
#: not one per step.
_WARNED: set = set()


def _warn_fallback(fits, shared, n_pairs, *, capacity: int, max_pairs: int) -> None:
    """Host side of :func:`warn_fallback`: warn once per (reason, capacity).

    If a call did fall back. Under ``vmap`` both branches of the ``cond`` run, so
    the flags (batched) decide, not the branch: nothing is said where every call
    took the sparse branch.
    """
    fits, shared, n_pairs = (np.asarray(a) for a in (fits, shared, n_pairs))
    if np.all(fits & shared):
        return
    kind = "shift" if np.all(fits) else "capacity"
    if (kind, capacity) in _WARNED:
        return
    _WARNED.add((kind, capacity))
    if kind == "capacity":
        why = (
            "its memory cap"
            if capacity >= max_pairs
            else "max_active of all tile pairs"
        )
        reason = (
            f"lists {int(np.max(n_pairs)):,} tile pairs, over its capacity of "
            f"{capacity:,} ({why})"
        )
    else:
        reason = (
            "needs a weight shift per row (the weights spread beyond one shared shift)"
        )
    host_warn(
        f"block-sparse ensemble force {reason}: the dense tiles ran instead (exact; "
        "cost O(N^2) pairs)",
        SparseFallbackWarning,
        # points at this function: the caller is ensemble_force_tiled or the callback
        # machinery
        stacklevel=1,
    )


def _max_pairs(n: int) -> int:
    """The pair list's memory cap at ``n`` columns (as :func:`sparse_capacity`)."""
    return min(max(SPARSE_MAX_PAIRS, SPARSE_PAIRS_PER_PARTICLE * n), _LIST_MAX)


def warn_fallback(fallback: SparseFallback, capacity: int, n: int) -> None:
    """Warn (:class:`SparseFallbackWarning`, once per reason and capacity) if
    ``fallback`` says the dense tiles ran.

    On the host when the flags have values (an eager call: nothing enters a
    compiled program); inside a caller's trace (its ``jit``, ``vmap``, ``grad``) a
    ``jax.debug.callback`` in the caller's program, which then cannot be kept in
    the persistent compilation cache (the CEnLMC step reports the flags in its
    info instead).

    Args:
      fallback: the flags :func:`_tiled_sparse` returned.
      capacity: the tile-pair list's capacity (named in the warning).
      n: the number of particles (for the largest possible number of tile pairs).

    Returns:
      None.
    """
    warn = functools.partial(_warn_fallback, capacity=capacity, max_pairs=_max_pairs(n))
    if any(isinstance(a, jax.core.Tracer) for a in fallback):
        _host_callback(warn, *fallback)
    else:
        warn(*fallback)


def _host_callback(fn, *args) -> None:
    """``jax.debug.callback(fn, *args)``, lowered only for the platforms this process
    has a backend for.

    A host callback cannot be lowered for CUDA from a CPU-only host
    (``.lower(lowering_platforms=("cuda",))``, the CI's lowering tests); on a GPU
    host the GPU's program calls back as the CPU's does.
    """
    here = {
        p: lambda: jax.debug.callback(fn, *args)
        for p in ("cpu", "cuda", "rocm")
        if _has_backend(p)
    }
    jax.lax.platform_dependent(default=lambda: None, **here)


def dense_instead(
    dense, plan: SparsePlan, weights: ColumnWeights, capacity: int, n: int
):
    """``dense`` (a thunk) that first reports why the block-sparse sum fell back.

    Once per process. Used by the sharded sum (:func:`sparse_partial`), whose
    ``shard_map`` body has no output for the flags; the single-device sum returns
    them instead (:class:`SparseFallback`).

    A ``jax.debug.callback`` inside the dense branch of the ``lax.cond``:
    it costs nothing where the sparse branch runs (except under ``vmap``,
    where both run and the flags decide). The warning is a
    :class:`SparseFallbackWarning`.
    """
    max_pairs = _max_pairs(n)

    def run():
        _host_callback(
            functools.partial(_warn_fallback, capacity=capacity, max_pairs=max_pairs),
            plan.fits,
            weights.shared,
            plan.n_pairs,
        )
        return dense()

    return run


def _has_backend(platform: str) -> bool:
    try:
        return bool(jax.devices(platform))
    except RuntimeError:
        return False


def default_block_size(
    n: int, *, itemsize: int = 4, with_w: bool = False, d: int | None = None
) -> int:
    """Row-block size ``B`` for ``n`` columns of dimension ``d``.

    When ``block_size`` is None.

    ``B`` keeps one ``(B, n)`` temporary near :data:`TILE_TARGET_BYTES` (the
    block's working set then stays in cache) but at least 16 rows (fewer
    rows per block pay the per-iteration overhead) and, given ``d``, at
    least ``2 (d + 1)`` rows (:func:`_min_block_rows`): every row block
    streams all the column data, ``x̃`` for the Gram product and
    ``c ⊙ [x̃, 1]`` for the force product, ``2 (d + 1)`` numbers a column,
    and these are then no more than the block's own ``B`` pair values a
    column. Then the rows are spread evenly over that many blocks (least
    padding) and B is rounded to a multiple of 8. The memory cap wins over
    everything: the live ``(B, n)`` temporaries (3, or 5 with ``w``) stay
    under :data:`TILE_MAX_BYTES` (``B`` may drop to 1 for huge n).
    ``d=None``: the rule by ``n`` alone (the default before issue 17).

    The floor by ``d`` was timed against the rule by ``n`` alone (issue 17):
    faster at large ``d``, and at small ``d``, where larger blocks were slower,
    it leaves the blocks as they were (benchmarks/results/block_by_d.md).

    Args:
      n: the number of columns.
      itemsize: bytes per number of the dtype.
      with_w: the sum has ``w`` (5 live temporaries, not 3).
      d: the dimension, or ``None`` for the rule by ``n`` alone.

    Returns:
      ``B``, an int ``>= 1``.
    """
    live = 5 if with_w else 3
    b_cache = TILE_TARGET_BYTES // max(1, n * itemsize)
    b_cap = TILE_MAX_BYTES // max(1, live * n * itemsize)
    b = max(1, min(max(_min_block_rows(d), b_cache), b_cap))
    # Same number of blocks, least padding: spread n evenly over them.
    b = -(-n // -(-n // b))
    if b >= 8:
        b = -(-b // 8) * 8 if -(-b // 8) * 8 <= b_cap else (b // 8) * 8
    return int(max(1, b))


def _min_block_rows(d: int | None) -> int:
    """The fewest rows a default row block gets (before the memory cap).

    16, and ``2 (d + 1)`` given ``d``.

    See :func:`default_block_size` for why and the measurement.
    """
    return _MIN_BLOCK if d is None else max(_MIN_BLOCK, 2 * (int(d) + 1))


def _remat(fn):
    """``fn`` recomputed in reverse mode (``jax.checkpoint``).

    A tile keeps no ``(B, C)`` residual.

    Without it ``jax.grad`` would store every tile's temporaries, ``O(N²)``
    memory; with it the backward pass recomputes each tile from its inputs
    (flash attention's trade). A plain or forward-mode call is unchanged.
    """
    return jax.checkpoint(fn, prevent_cse=False)


def _blocks(p: Prepared, size: int) -> Prepared:
    """Pad ``p`` to a multiple of ``size`` particles; a leading block axis per field."""
    n_pad = -(-p.sq_x.shape[0] // size) * size
    return jax.tree.map(
        lambda v: v.reshape((n_pad // size, size) + v.shape[1:]),
        pad_particles(p, n_pad),
    )


def tiled_partial(
    rows: Prepared,
    cols: Prepared,
    *,
    block_rows: int | None = None,
    block_cols: int | None = None,
    precision: Any = None,
    distances: str | None = None,
) -> Partial:
    """Partial of ``rows`` over ``cols``, tile by tile.

    Traceable; the settings are static.

    Args:
      rows: :func:`~.algebra.prepare` output for the rows.
      cols: :func:`~.algebra.prepare` output for the columns, with the same
        centre.
      block_rows: rows per block, at least 2 (default :func:`default_block_size`
        of the column count and ``d``, at most the row count rounded up to 8).
      block_cols: columns per tile (default: all columns in one tile).
      precision: of both matrix products (None: HIGHEST).
      distances: ``"direct"``, ``"gram"`` or None (by ``DIRECT_MAX_D``).

    Returns:
      The :class:`~.algebra.Partial` of the rows over all the columns.
    """
    n_rows, d = rows.x.shape
    n_cols = cols.x.shape[0]
    dtype = rows.x.dtype
    spec = tile_spec(d, dtype, distances=distances, precision=precision)
    # Sized by the column count, but no more rows than there are (sharded: n_rows =
    # N/P).
    br = block_rows or min(
        default_block_size(
            n_cols, itemsize=jnp.dtype(dtype).itemsize, with_w=rows.w is not None, d=d
        ),
        -(-n_rows // 8) * 8,
    )
    # A one-row block would make the Gram product a matrix-vector product, which
    # XLA rounds differently: a pair at the threshold could then be decided
    # differently than with any other block size.
    br = max(br, 2)
    bc = n_cols if block_cols is None else min(block_cols, n_cols)
    row_blocks = _blocks(rows, br)
    if bc == n_cols:
        # One column tile for every row block: its work once, outside the loop
        # (the weights, the overflow rule's decision, and for direct distances
        # the coordinate vectors rather than a strided slice per block).
        weights = column_weights(cols, spec)
        if spec.direct:
            cols = cols._replace(
                x=tuple(cols.x.T), w=None if cols.w is None else tuple(cols.w.T)
            )

        def rows_against_cols(one_shift):
            return lax.map(
                _remat(lambda r: tile_partial_with(r, cols, weights, spec, one_shift)),
                row_blocks,
            )

        out = lax.cond(
            weights.shared,
            lambda: rows_against_cols(True),
            lambda: rows_against_cols(False),
        )
    else:
        col_blocks = _blocks(cols, bc)
        empty = empty_partial(br, d + 1, dtype)

        def fold_columns(r):
            return lax.scan(
                _remat(lambda acc, c: (tile_update(acc, r, c, spec), None)),
                empty,
                col_blocks,
            )[0]

        out = lax.map(fold_columns, row_blocks)
    return jax.tree.map(lambda v: v.reshape((-1,) + v.shape[2:])[:n_rows], out)


def _boxes(p: Prepared, size: int) -> tuple[TileBoxes, TileBoxes | None]:
    """x- and w-boxes of the tiles of ``size`` consecutive particles.

    ``p`` padded to a multiple of ``size``.
    """
    p = pad_particles(p, -(-p.sq_x.shape[0] // size) * size)
    return tile_boxes(p.x, p.sq_x, size), None if p.w is None else tile_boxes(
        p.w, p.sq_w, size
    )


class SparsePlan(NamedTuple):
    """The tile pairs a block-sparse sum visits.

    Compacted into a list of static capacity ``P``.

    Attributes:
      pairs: (P + K,) int32 codes ``r * (column tiles) + c`` of the visited
        (row tile r, column tile c) pairs (``FULL`` or ``COUNT``), in
        row-major order; entries from ``n_pairs`` on are stale.
      n_pairs: () int32 how many.
      fits: () bool, ``n_pairs <= P``.
    """

    pairs: Array
    n_pairs: Array
    fits: Array


def _kinds(row_x, row_w, cols_x, cols_w, thr_x, thr_w, spec):
    return tile_kinds(row_x, cols_x, thr_x, spec, row_w, cols_w, thr_w)


def sparse_plan(
    p: Prepared,
    block_rows: int,
    block_cols: int,
    capacity: int,
    spec,
    cols: Prepared | None = None,
) -> SparsePlan:
    """Which tile pairs of ``p`` to visit.

    Rows in tiles of ``block_rows``, columns in tiles of ``block_cols``; the list
    holds the (row tile, column tile) pairs that are not ``SKIP``
    (:func:`~.sparsity.tile_kinds`) in row-major order.

    With few column tiles (at most ``2 · PLAN_SUPER``) every pair of tile boxes is
    tested (:func:`_pair_list`): ``O((N/B)(N/C) d)`` work, which is ``O(N²)``. With
    more, two levels: the column tiles are grouped into super tiles of
    :data:`PLAN_SUPER` consecutive tiles (in the spatial order, a compact cloud) whose
    box is the union of theirs; the row tiles are tested against the super boxes
    (``O(N² d / (B C S))`` work: 8.4 million box tests at N = 2^20), and only the
    column tiles of the super tiles not ``SKIP`` are then tested one by one
    (:func:`_expand`): for a localised kernel a row tile is near a bounded number of
    super tiles, so this is ``O(N S)``. A tile whose super box is apart is apart
    itself (its box lies inside the union and its ``|ṽ|²`` bound is below the
    union's, :func:`~.sparsity.tiles_apart`), and the tiles of a super tile are
    tested by the same test in the same row-major order: the list is the one-level
    list, entry for entry (``tests/pairwise/test_plan.py``).

    ``COUNT`` tiles are visited as whole tiles: their pairs fail the x-mask, so the
    tile update adds only their R2 counts. The plan is a function of the boxes'
    comparisons alone, so it carries no derivative (``lax.stop_gradient``). The
    codes must fit int32: ``(N/B)(N/C) < 2^31``.

    Args:
      p: :func:`~.algebra.prepare` output (the rows).
      block_rows: rows per row tile.
      block_cols: columns per column tile.
      capacity: the static length ``P`` of the list (:func:`sparse_capacity`).
      spec: the :class:`~.algebra.TileSpec` of the kernel.
      cols: the columns, if not ``p`` itself (a device's rows against the
        whole ensemble, prepared with the same centre: :mod:`.sharded`).

    Returns:
      The :class:`SparsePlan`; ``fits`` is False (and ``n_pairs`` above the
      capacity) also when the super-tile list of the two-level plan overflows.
    """
    p, cols = lax.stop_gradient((p, cols))
    row_x, row_w = _boxes(p, block_rows)
    col_x, col_w = _boxes(p if cols is None else cols, block_cols)
    thr_x, thr_w = p.thr_x[0], None if p.thr_w is None else p.thr_w[0]
    n_rt, n_ct = row_x.lo.shape[1], col_x.lo.shape[1]
    if n_ct <= 2 * PLAN_SUPER:
        pairs, count = _pair_list(
            row_x, row_w, col_x, col_w, thr_x, thr_w, spec, capacity
        )
        return SparsePlan(pairs, count, count <= capacity)
    n_st = -(-n_ct // PLAN_SUPER)
    sup_x, sup_w = _super_boxes(col_x, n_st), _super_boxes(col_w, n_st)
    cap1 = min(n_rt * n_st, capacity)
    near, n_near = _pair_list(row_x, row_w, sup_x, sup_w, thr_x, thr_w, spec, cap1)
    pairs, count = _expand(
        near,
        jnp.minimum(n_near, cap1),
        (row_x, row_w, col_x, col_w, thr_x, thr_w),
        n_st,
        spec,
        capacity,
    )
    # an overflowing super-tile list leaves the tile list incomplete: not fitting
    count = jnp.where(n_near > cap1, jnp.maximum(count, capacity + 1), count)
    return SparsePlan(pairs, count, count <= capacity)


def _super_boxes(boxes: TileBoxes | None, n_st: int) -> TileBoxes | None:
    """The union boxes of :data:`PLAN_SUPER` consecutive tiles (empty tiles pad)."""
    if boxes is None:
        return None
    pad = n_st * PLAN_SUPER - boxes.sq.shape[0]

    def group(v, fill, reduce):
        v = jnp.pad(v, [(0, 0)] * (v.ndim - 1) + [(0, pad)], constant_values=fill)
        return reduce(v.reshape(v.shape[:-1] + (n_st, PLAN_SUPER)), axis=-1)

    return TileBoxes(
        group(boxes.lo, jnp.inf, jnp.min),
        group(boxes.hi, -jnp.inf, jnp.max),
        group(boxes.sq, 0, jnp.max),
    )


def _pair_list(row_x, row_w, col_x, col_w, thr_x, thr_w, spec, capacity):
    """The (row, column) box pairs not ``SKIP``, every pair tested.

    One ``lax.scan`` over chunks of rows (about :data:`PLAN_CHUNK` pairs each):
    :func:`~.sparsity.tile_kinds` of the chunk's boxes against every column box, the
    pairs not ``SKIP`` compacted (cumsum and scatter) and written as codes
    ``r · (columns) + c`` at the running end of the list; a write's stale tail is
    overwritten by the next one. No ``(rows, columns)`` array.

    Returns:
      ``(codes (capacity + chunk,), count)``: entries from ``count`` on are stale;
      ``count`` may exceed ``capacity`` (the list then holds its first entries).
    """
    n_rt, n_ct = row_x.lo.shape[1], col_x.lo.shape[1]
    chunk = max(1, min(n_rt, PLAN_CHUNK // n_ct))
    n_chunks = -(-n_rt // chunk)
    size = chunk * n_ct

    # lo, hi (n_chunks, d, chunk, 1), sq (n_chunks, chunk, 1): empty boxes pad the last
    # chunk
    def split(boxes):
        if boxes is None:
            return None
        pad = n_chunks * chunk - n_rt

        def cut(v, fill):
            v = jnp.pad(v, [(0, 0)] * (v.ndim - 1) + [(0, pad)], constant_values=fill)
            return jnp.moveaxis(v.reshape(v.shape[:-1] + (n_chunks, chunk, 1)), -3, 0)

        return TileBoxes(
            cut(boxes.lo, jnp.inf), cut(boxes.hi, -jnp.inf), cut(boxes.sq, 0)
        )

    def step(carry, args):
        pairs, count = carry
        first, rx, rw = args
        visit = _kinds(rx, rw, col_x, col_w, thr_x, thr_w, spec).reshape(-1) != SKIP
        pos = jnp.where(visit, jnp.cumsum(visit) - 1, size)
        codes = (
            jnp.zeros((size,), jnp.int32)
            .at[pos]
            .set(first + jnp.arange(size, dtype=jnp.int32), mode="drop")
        )
        pairs = lax.dynamic_update_slice(pairs, codes, (jnp.minimum(count, capacity),))
        return (pairs, count + jnp.sum(visit, dtype=jnp.int32)), None

    firsts = jnp.arange(n_chunks, dtype=jnp.int32) * size
    init = (jnp.zeros((capacity + size,), jnp.int32), jnp.zeros((), jnp.int32))
    (pairs, count), _ = lax.scan(step, init, (firsts, split(row_x), split(row_w)))
    return pairs, count


def _expand(near, n_near, boxes, n_st, spec, capacity):
    """The second level of :func:`sparse_plan`: the tiles of the near super tiles.

    ``near[:n_near]``: codes ``r · n_st + s`` of the (row tile, super tile) pairs not
    ``SKIP``, row-major. A loop over chunks of them (about :data:`PLAN_CHUNK` tile
    pairs each): each entry's :data:`PLAN_SUPER` column tiles ``s · PLAN_SUPER + k``
    tested against its row tile, the pairs not ``SKIP`` compacted as in
    :func:`_pair_list` (so in row-major order, the super tiles of a row tile being in
    order and their tiles consecutive).
    """
    row_x, row_w, col_x, col_w, thr_x, thr_w = boxes
    n_ct = col_x.lo.shape[1]
    # entries a step: about one a row tile (a row tile is near a few super tiles, so a
    # few steps), at most PLAN_CHUNK tile pairs; every step tests per · PLAN_SUPER
    # pairs, live or not
    per = max(1, min(PLAN_CHUNK // PLAN_SUPER, row_x.lo.shape[1]))
    size = per * PLAN_SUPER
    near = jnp.concatenate([near, jnp.zeros((per,), jnp.int32)])
    k = jnp.arange(PLAN_SUPER, dtype=jnp.int32)

    def take(b, idx, rows):
        if b is None:
            return None
        if rows:  # (d, per, 1), (per, 1)
            return TileBoxes(
                b.lo[:, idx][..., None], b.hi[:, idx][..., None], b.sq[idx][:, None]
            )
        return TileBoxes(b.lo[:, idx], b.hi[:, idx], b.sq[idx])

    def step(i, carry):
        pairs, count = carry
        e = lax.dynamic_slice(near, (i * per,), (per,))
        live = i * per + jnp.arange(per) < n_near
        r, s = e // n_st, e % n_st
        c = s[:, None] * PLAN_SUPER + k  # (per, PLAN_SUPER)
        ok = live[:, None] & (c < n_ct)
        cc = jnp.minimum(c, n_ct - 1)
        kinds = _kinds(
            take(row_x, r, True),
            take(row_w, r, True),
            take(col_x, cc, False),
            take(col_w, cc, False),
            thr_x,
            thr_w,
            spec,
        )
        visit = (ok & (kinds != SKIP)).reshape(-1)
        pos = jnp.where(visit, jnp.cumsum(visit) - 1, size)
        codes = (
            jnp.zeros((size,), jnp.int32)
            .at[pos]
            .set((r[:, None] * n_ct + c).reshape(-1), mode="drop")
        )
        pairs = lax.dynamic_update_slice(pairs, codes, (jnp.minimum(count, capacity),))
        return pairs, count + jnp.sum(visit, dtype=jnp.int32)

    init = (jnp.zeros((capacity + size,), jnp.int32), jnp.zeros((), jnp.int32))
    return lax.fori_loop(0, -(-n_near // per), step, init)


def block_sparse_partial(
    p: Prepared,
    plan: SparsePlan,
    weights: ColumnWeights,
    *,
    block_rows: int,
    block_cols: int,
    group: int,
    spec,
    cols: Prepared | None = None,
) -> Partial:
    """Partial of every particle of ``p`` over all of them (or over ``cols``).

    Folding only the tile pairs of ``plan``. Each step gathers ``group`` tile
    pairs of the list, computes their :func:`~.algebra.tile_partial_with` side
    by side (``vmap``: one ``(group, B, C)`` pass) and scatter-adds them to their
    row tiles; the last step pads with an empty column tile. Temporaries
    ``O(N d + group B C)``. Differentiable in both modes (:func:`_fold_tiles`).

    Args:
      p: :func:`~.algebra.prepare` output, best in a spatial order
        (:func:`sort_spatially`; any order is exact, only slower).
      plan: its :func:`sparse_plan` for these tiles.
      weights: the :func:`~.algebra.column_weights` of all of ``p`` (of
        ``cols`` when given), which must be shared (one shift for every tile:
        the sums of the tiles then simply add).
      block_rows: rows per row tile.
      block_cols: columns per column tile.
      group: tile pairs per step.
      spec: the :class:`~.algebra.TileSpec` of the kernel.
      cols: the columns (same centre as ``p``), if not ``p`` itself; ``plan``
        and ``weights`` are then those of ``p`` against ``cols``.

    Returns:
      The :class:`~.algebra.Partial` of the rows of ``p``.
    """
    n, d = p.x.shape
    c = p if cols is None else cols
    br, bc = block_rows, block_cols
    # Only the fields a tile reads (a step gathers what it is given).
    rows_b = _blocks(
        Prepared(p.x, p.sq_x, p.f, thr_x=p.thr_x, w=p.w, sq_w=p.sq_w, thr_w=p.thr_w), br
    )
    n_tiles = -(-c.x.shape[0] // bc)
    # the force operand's columns padded with zeros to a multiple of LIFT_COLUMNS
    lift = jnp.pad(weights.lift, ((0, 0), (0, -(d + 1) % LIFT_COLUMNS)))
    cols = Prepared(c.x, c.sq_x, c.f, x1=lift, w=c.w, sq_w=c.sq_w)
    # tile n_tiles is empty
    cols_b = _blocks(pad_particles(cols, (n_tiles + 1) * bc), bc)
    acc = _fold_tiles(
        rows_b, cols_b, plan.pairs, plan.n_pairs, weights.top, group, spec
    )
    sums, n_r2, n_ball = (a.reshape((-1,) + a.shape[2:])[:n] for a in acc)
    return Partial(sums, jnp.full((n,), weights.top, p.x.dtype), n_r2, n_ball)


@functools.partial(jax.custom_jvp, nondiff_argnums=(5, 6))
def _fold_tiles(
    rows_b: Prepared,
    cols_b: Prepared,
    pairs: Array,
    n_pairs: Array,
    top: Array,
    group: int,
    spec,
) -> tuple[Array, Array, Array]:
    """The sums ``(R, B, d+1)`` and counts ``(R, B)`` of the row tiles.

    Over the listed tile pairs.

    ``rows_b``, ``cols_b``: the tiles (leading tile axis; the last column
    tile empty); ``pairs``, ``n_pairs``: the list (:class:`SparsePlan`);
    ``top``: the shared shift. Evaluated by a loop of ``ceil(n_pairs /
    group)`` steps (a ``while_loop``: no step past the list). Reverse mode
    needs a known trip count, so derivatives (both modes: ``custom_jvp``)
    come from :func:`_fold_steps` with ``static=True``, the same sums in
    the same order (plus exact zeros).
    """
    return _fold_steps(rows_b, cols_b, pairs, n_pairs, top, group, spec, static=False)


@_fold_tiles.defjvp
def _fold_tiles_jvp(group, spec, primals, tangents):
    return jax.jvp(
        functools.partial(_fold_steps, group=group, spec=spec, static=True),
        primals,
        tangents,
    )


def _fold_steps(rows_b, cols_b, pairs, n_pairs, top, group, spec, *, static: bool):
    """:func:`_fold_tiles` by a ``while_loop`` or by loops of static length.

    ``static=False``: the ``while_loop``. Static: ``ceil(P / group)`` steps in
    chunks of about ``sqrt`` of that many, each chunk a ``lax.cond`` that runs
    its steps only if the list reaches it, each step's tiles a ``lax.cond`` on
    the step being live (so at most one chunk of steps past the list costs its
    gathers). Somewhat slower than the ``while_loop``, hence only for
    derivatives. Chunks and steps are recomputed in the backward pass
    (``jax.checkpoint``), so ``jax.grad`` stores ``O(N d)``, not the tiles, and
    the gathers' cotangents add in place within a chunk (a ``cond`` around them
    would add an ``O(N)`` array per step, several times slower).
    """
    n_rows, br, d = rows_b.x.shape
    n_tiles = cols_b.sq_x.shape[0] - 1
    dtype = rows_b.x.dtype

    def full_tile(rows, cols):
        weights = ColumnWeights(jnp.asarray(True), top, cols.x1)
        part = tile_partial_with(rows, cols, weights, spec, True)
        return part.sums[:, : d + 1], part.n_r2, part.n_ball

    def no_tiles(rows, cols):
        return (
            jnp.zeros((group, br, d + 1), dtype),
            jnp.zeros((group, br), jnp.int32),
            jnp.zeros((group, br), jnp.int32),
        )

    steps = -(-pairs.shape[0] // group)
    # static: steps per chunk
    inner = max(1, math.isqrt(steps))
    chunks = -(-steps // inner)
    live_steps = -(-n_pairs // group)
    # A step may read past the end of the list.
    codes = jnp.concatenate(
        [pairs, jnp.zeros((chunks * inner * group - pairs.shape[0],), jnp.int32)]
    )

    def step(s, acc):
        pos = s * group + jnp.arange(group)
        code = lax.dynamic_slice(codes, (s * group,), (group,))
        live = pos < n_pairs
        # a dead entry: any row tile, against the empty column tile
        r = jnp.where(live, code // n_tiles, 0)
        c = jnp.where(live, code % n_tiles, n_tiles)
        rows, cols = (
            jax.tree.map(lambda v, i=i: v[i], b) for b, i in ((rows_b, r), (cols_b, c))
        )
        parts = (
            lax.cond(s < live_steps, jax.vmap(full_tile), no_tiles, rows, cols)
            if static
            else jax.vmap(full_tile)(rows, cols)
        )
        return tuple(a.at[r].add(v) for a, v in zip(acc, parts, strict=True))

    zeros = jnp.zeros((n_rows, br), jnp.int32)
    acc = (jnp.zeros((n_rows, br, d + 1), dtype), zeros, zeros)
    if not static:
        return lax.fori_loop(0, live_steps, step, acc)

    # outside the cond: the loop's constants are then hoisted, not kept per chunk
    @_remat
    def chunk(k, acc):
        def run(acc):
            return lax.fori_loop(
                0, inner, lambda j, acc: _remat(step)(k * inner + j, acc), acc
            )

        return lax.cond(k * inner < live_steps, run, lambda acc: acc, acc)

    return lax.fori_loop(0, chunks, chunk, acc)


def sparse_tiles(
    n_rows: int, n_cols: int, block_size: int | None, block_cols: int | None
) -> tuple[int, int]:
    """Row and column tile sizes of a block-sparse sum.

    Defaults :data:`SPARSE_BLOCK_ROWS` (half of it for at most
    :data:`SPARSE_SMALL_N` columns), :data:`SPARSE_BLOCK_COLS`, doubled until
    the int32 pair codes fit (``N`` beyond ~2.9 million).
    """
    rows = SPARSE_BLOCK_ROWS // (2 if n_cols <= SPARSE_SMALL_N else 1)
    br, bc = block_size or rows, block_cols or SPARSE_BLOCK_COLS
    while -(-n_rows // br) * -(-n_cols // bc) >= 2**31:
        br, bc = 2 * br, 2 * bc
    return br, bc


def sparse_group(block_rows: int, group: int | None) -> int:
    """Tile pairs a step of the block-sparse fold takes.

    By default :data:`SPARSE_GROUP` scaled to the same rows a step as with
    :data:`SPARSE_BLOCK_ROWS`-row tiles.

    Args:
      block_rows: rows per row tile.
      group: the caller's choice, or None for the default.

    Returns:
      The tile pairs a step, an int ``>= 1``.
    """
    return group or max(1, SPARSE_GROUP * SPARSE_BLOCK_ROWS // block_rows)


def sparse_partial(
    rows: Prepared,
    cols: Prepared,
    *,
    block_rows: int | None = None,
    block_cols: int | None = None,
    group: int | None = None,
    precision: Any = None,
    distances: str | None = None,
    max_active: float = SPARSE_MAX_ACTIVE,
    axis_name: str | None = None,
) -> Partial:
    """Block-sparse partial of ``rows`` over ``cols`` (one centre).

    A ``partial_fn`` of :mod:`.sharded`.

    :func:`sparse_plan` of the row tiles of ``rows`` against the column tiles
    of ``cols`` (each device its own list), folded by
    :func:`block_sparse_partial`; where the lists overflow or the weights
    need a shift per row, :func:`tiled_partial` instead (exact either way,
    as in :func:`ensemble_force_tiled`). Fast when both are in one spatial
    order (:func:`~.sparsity.sort_spatially` of the whole ensemble, ``rows``
    a run of it); correct in any order.

    ``axis_name`` (inside ``shard_map``, ``rows`` one device's run of all
    ``cols``): the decision is the single device's, over the whole ensemble:
    sparse when the devices' lists hold together at most ``max_active`` of
    ALL tile pairs (``psum`` of their lengths), each list sized for that
    total. With ``N/P`` a multiple of the row tile the devices' tiles are the
    single device's, so they take the same branch and sum the same tiles in
    the same order. Without ``axis_name``: ``max_active`` of ``rows``' own
    tile pairs.

    Args:
      rows: :func:`~.algebra.prepare` output for the rows.
      cols: :func:`~.algebra.prepare` output for the columns, same centre.
      block_rows: rows per row tile (default: :func:`sparse_tiles`).
      block_cols: columns per column tile (default :data:`SPARSE_BLOCK_COLS`).
      group: tile pairs per step (default: :func:`sparse_group`).
      precision: of the matrix products (None: HIGHEST).
      distances: ``"direct"``, ``"gram"`` or None (by ``DIRECT_MAX_D``).
      max_active: the lists' capacity as a fraction of all tile pairs.
      axis_name: the ``shard_map`` axis of the particles, or ``None``.

    Returns:
      The :class:`~.algebra.Partial` of the rows over all the columns.
    """
    n_rows, d = rows.x.shape
    n_cols = cols.x.shape[0]
    br, bc = sparse_tiles(n_rows, n_cols, block_rows, block_cols)
    spec = tile_spec(d, rows.x.dtype, distances=distances, precision=precision)
    capacity = sparse_capacity(
        n_rows if axis_name is None else n_cols, br, bc, max_active, n_cols=n_cols
    )
    plan = sparse_plan(rows, br, bc, capacity, spec, cols=cols)
    if axis_name is not None:
        plan = plan._replace(fits=lax.psum(plan.n_pairs, axis_name) <= capacity)
    weights = column_weights(cols, spec)

    def sparse():
        return block_sparse_partial(
            rows,
            plan,
            weights,
            block_rows=br,
            block_cols=bc,
            group=sparse_group(br, group),
            spec=spec,
            cols=cols,
        )

    def dense():
        return tiled_partial(rows, cols, precision=precision, distances=distances)

    return lax.cond(
        plan.fits & weights.shared,
        sparse,
        dense_instead(dense, plan, weights, capacity, n_cols),
    )


@functools.partial(
    jax.jit, static_argnames=("block_size", "block_cols", "precision", "distances")
)
def _tiled(x, f, log_p, eta, w, r2, *, block_size, block_cols, precision, distances):
    p = prepare(x, f, log_p, eta, w, r2)
    part = tiled_partial(
        p,
        p,
        block_rows=block_size,
        block_cols=block_cols,
        precision=precision,
        distances=distances,
    )
    return finish(part, p, x.shape[0])


@functools.partial(
    jax.jit,
    static_argnames=(
        "block_size",
        "block_cols",
        "group",
        "precision",
        "distances",
        "max_active",
    ),
)
def _tiled_sparse(
    x,
    f,
    log_p,
    eta,
    w,
    r2,
    *,
    block_size,
    block_cols,
    group,
    precision,
    distances,
    max_active,
):
    n, d = x.shape
    perm, p = sort_spatially(prepare(x, f, log_p, eta, w, r2))
    br, bc = sparse_tiles(n, n, block_size, block_cols)
    g = sparse_group(br, group)
    spec = tile_spec(d, x.dtype, distances=distances, precision=precision)
    capacity = sparse_capacity(n, br, bc, max_active)
    plan = sparse_plan(p, br, bc, capacity, spec)
    weights = column_weights(p, spec)

    def sparse():
        return block_sparse_partial(
            p, plan, weights, block_rows=br, block_cols=bc, group=g, spec=spec
        )

    def dense():
        return tiled_partial(p, p, precision=precision, distances=distances)

    # Exact either way: the dense tiles where the list overflows its capacity
    # (too many active tiles to gain) or the weights need a shift per row. The flags
    # go out with the result, not to a host callback (SparseFallback: a callback would
    # keep this program out of the persistent compilation cache).
    part = lax.cond(plan.fits & weights.shared, sparse, dense)
    out = finish(part, p, n)
    return unsort(out, perm), SparseFallback(plan.fits, weights.shared, plan.n_pairs)


def ensemble_force_tiled(
    x: ArrayLike,
    f: ArrayLike,
    log_p: ArrayLike,
    eta: ArrayLike,
    *,
    w: ArrayLike | None = None,
    r2: ArrayLike | None = None,
    block_size: int | None = None,
    block_cols: int | None = None,
    precision: Any = None,
    distances: str | None = None,
    block_sparse: bool = False,
    group: int | None = None,
    max_active: float = SPARSE_MAX_ACTIVE,
    return_fallback: bool = False,
) -> PairwiseForce | tuple[PairwiseForce, Array]:
    """The pair sums by the row-tiled XLA kernel, dense or block-sparse.

    Args:
      x: (N, d) positions.
      f: (N,) ``-logdensity`` values.
      log_p: (N,) log density of the proposal each particle was drawn from.
      eta: ball radius ``η > 0``.
      w: (N, d) deterministic parts, or ``None``; with ``r2``, both or neither.
      r2: the R2 radius ``>= 0``, or ``None``.
      block_size: rows per block (default :func:`default_block_size`; 1 is
        taken as 2, see :func:`tiled_partial`); N need not be a multiple
        (padded, masked). The result does not depend on it beyond the
        rounding of the sums.
      block_cols: columns per tile (default all: one tile per row block).
      precision: of the matrix products (None: HIGHEST).
      distances: ``"direct"``, ``"gram"`` or None (direct for
        ``d <= DIRECT_MAX_D``).
      block_sparse: sort the particles along a space-filling curve and fold
        only the tile pairs whose bounding boxes can hold a pair
        (:func:`block_sparse_partial`); then ``block_size`` and ``block_cols``
        are the row and column tile sizes (default :func:`sparse_tiles`) and
        ``group`` the tile pairs per step (:func:`sparse_group`). Same counts as
        the dense tiles (the skipped tiles hold no pair within rounding of a
        mask), forces to rounding.
      max_active: block-sparse only: the capacity of the pair lists as a
        fraction of all tile pairs (at most ``max(SPARSE_MAX_PAIRS,
        SPARSE_PAIRS_PER_PARTICLE · N)`` entries: :func:`sparse_capacity`); if
        more are active, or if the weights spread beyond one shared shift
        (:func:`~.algebra.max_shared_spread`), the dense tiles run instead,
        decided at run time: the result is exact either way, and a
        :class:`SparseFallbackWarning` says so (once per reason and capacity;
        on the host after the call, or, inside a caller's trace, by a
        ``jax.debug.callback`` in the caller's program: :func:`warn_fallback`).
      return_fallback: return ``(force, ran_dense)`` and warn of nothing:
        ``ran_dense`` a bool scalar, True where the block-sparse sum ran the
        dense tiles (always False for the dense form). For a caller that
        reports it itself (the CEnLMC step's ``info.dense_fallback``), so that
        its compiled program holds no host callback and stays in the persistent
        compilation cache.

    Returns:
      :class:`~.algebra.PairwiseForce`
      ``(force_sum (N, d), n_r2 (N,), n_ball (N,))`` in the promoted floating
      dtype of the inputs; with ``return_fallback``, ``(force, ran_dense)``.

    Raises:
      ValueError: the checks of :func:`~.algebra.check_pair_inputs`, or a bad
        block size, ``distances``, ``group`` or ``max_active``.
    """
    x, f, log_p, w = check_pair_inputs(x, f, log_p, eta, w, r2)
    if block_size is not None:
        check_int(block_size, "block_size", minimum=1)
    if block_cols is not None:
        check_int(block_cols, "block_cols", minimum=1)
    if distances is not None:
        check_choice(distances, "distances", ("direct", "gram"))
    check_bool(block_sparse, "block_sparse")
    check_bool(return_fallback, "return_fallback")
    dtype = x.dtype
    if block_sparse:
        if group is not None:
            check_int(group, "group", minimum=1)
        check_positive(max_active, "max_active")
        out, fallback = _tiled_sparse(
            x,
            f,
            log_p,
            jnp.asarray(eta, dtype),
            w,
            None if r2 is None else jnp.asarray(r2, dtype),
            block_size=None if block_size is None else max(2, int(block_size)),
            block_cols=None if block_cols is None else int(block_cols),
            group=None if group is None else int(group),
            precision=canonical_precision(precision),
            distances=distances,
            max_active=float(max_active),
        )
        if return_fallback:
            return out, fallback.ran_dense
        n = x.shape[0]
        rows, cols = sparse_tiles(
            n, n, None if block_size is None else max(2, int(block_size)), block_cols
        )
        warn_fallback(fallback, sparse_capacity(n, rows, cols, float(max_active)), n)
        return out
    out = _tiled(
        x,
        f,
        log_p,
        jnp.asarray(eta, dtype),
        w,
        None if r2 is None else jnp.asarray(r2, dtype),
        block_size=None if block_size is None else int(block_size),
        block_cols=None if block_cols is None else int(block_cols),
        precision=canonical_precision(precision),
        distances=distances,
    )
    return (out, jnp.asarray(False)) if return_fallback else out
