"""The ensemble force as one fused Pallas kernel (lowered to Triton on GPU).

The pair sums of docs/algorithms.md §2-4 (see :mod:`.algebra`),

    force_sum_i = Σ_{j≠i} W_ij (x_j - x_i),   n_r2_i,   n_ball_i,

computed the way flash attention computes ``softmax(QKᵀ)V``: the grid runs
over blocks of ``block_rows`` particles, and inside the kernel a
``fori_loop`` walks over blocks of ``block_cols`` columns, folding
:func:`~.algebra.tile_update` (the same function the XLA backend folds) on
tiles it loads from the refs, with the :class:`~.algebra.Partial`
accumulators in registers. Memory ``O(N d)``; nothing ``N x N`` exists, not
even in the kernel.

Distances of a tile (``distances=``):

* ``"direct"`` (default): ``Σ_k (x_jk - x_ik)²`` from a transposed
  ``(d, N)`` layout, one coordinate (a contiguous load) at a time: no
  cancellation, float32-accurate also for close pairs, which dominate the
  force at small ``d``. About ``3 d`` flops per pair on CUDA cores.
* ``"gram"``: ``|x̃_i|² + |x̃_j|² - 2 x̃_i·x̃_j`` with the products a tile
  matrix product at ``gram_precision`` (HIGHEST: IEEE float32; TF32 would
  flip a large fraction of the mask decisions; ``DotAlgorithmPreset.
  TF32_TF32_F32_X3`` is a faster near-float32 alternative): the tensor-core
  layout, cheaper for large ``d``; pairs whose distance is below the
  identity's rounding bound count as coincident (:mod:`.algebra`).

The force is one more tile product, ``W @ [x̃, 1]`` at ``precision``.

Block-sparse (``block_sparse=True``): the particles are sorted along a
Hilbert curve, each row block gets the list of column blocks whose bounding
boxes (x, and w for the R2 count) can hold a pair (:func:`sparse_tile_lists`:
``FULL`` blocks first, then ``COUNT`` blocks, whose x-boxes are apart and
which add only to ``n_r2``), and the kernel loops over its list, the lists
and their lengths being two more (whole-array) inputs read with scalar
loads. The lists have a static length (:func:`sparse_list_len`); a row block
that needs more makes the call run the dense kernel (exact either way).
Not yet timed on a GPU (``benchmarks/gpu_check.py``, section ``sparse``).

The kernel is written for Pallas' Triton lowering (``compiler_params`` is a
``jax.experimental.pallas.triton.CompilerParams``, which selects Triton even
though jax 0.10 makes Mosaic GPU the default lowering of ``pl.pallas_call``):
every tile shape is a power of two ≥ 16 (``tl.dot``'s minimum), the lanes of
``x̃`` and ``[x̃, 1]`` are padded to such widths, and ``N`` to a multiple of
the blocks with invalid particles. Off GPU it runs in Pallas' interpret mode
(slow, for tests; the tests also lower it to Triton IR for CUDA on a CPU-only
machine). Meant for moderate ``d`` (≤ 256): a ``(block_rows, d_pad)``
accumulator lives in registers; beyond that the XLA path is better.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from cenlmc_jax._validation import check_bool, check_choice, check_int
from cenlmc_jax.pairwise.algebra import (
    Partial,
    PairwiseForce,
    Prepared,
    TileSpec,
    canonical_precision,
    check_pair_inputs,
    count_update,
    empty_partial,
    finish,
    pad_particles,
    prepare,
    tile_spec,
    tile_update,
)
from cenlmc_jax.pairwise.sparsity import (
    TileBoxes,
    sort_spatially,
    tile_boxes,
    tile_kinds,
    tile_list,
    unsort,
)
from cenlmc_jax.types import Array, ArrayLike

__all__ = ["ensemble_force_pallas", "pallas_partial", "KernelOptions", "kernel_options", "sparse_tile_lists",
           "sparse_list_len", "SPARSE_LIST_BYTES"]

#: Block-sparse: memory of all row blocks' lists of column blocks together;
#: a row block that needs more entries sends the call to the dense kernel.
SPARSE_LIST_BYTES = 64 * 2**20


class KernelOptions(NamedTuple):
    """Static (hashable) settings of the kernel; see :func:`ensemble_force_pallas`."""

    block_rows: int
    block_cols: int
    distances: str
    precision: Any
    gram_precision: Any
    interpret: bool
    num_warps: int | None
    num_stages: int | None


def _padded_width(d: int) -> int:
    # Triton tiles are powers of two and tl.dot needs every dimension >= 16.
    return max(16, pl.next_power_of_2(d))


def _default_blocks(d_pad: int, distances: str) -> tuple[int, int]:
    # A (block_rows, d_pad) accumulator (and, for "gram", the row tile) stay
    # in registers: keep block_rows * d_pad around 4K-8K floats, as flash
    # attention does; "direct" holds (block_rows, block_cols) tiles instead.
    if distances == "direct":
        return (64, 64) if d_pad <= 64 else (32, 64)
    if d_pad <= 32:
        return 128, 64
    if d_pad <= 64:
        return 64, 64
    return 64, 32


def _check_block(value: int | None, name: str) -> int | None:
    if value is None:
        return None
    v = check_int(value, name, minimum=16)
    if v & (v - 1):
        raise ValueError(f"{name} must be a power of two >= 16 (a Triton tile size); got {v}.")
    return v


def kernel_options(
    d: int,
    block_rows: int | None = None,
    block_cols: int | None = None,
    distances: str = "direct",
    precision: Any = None,
    gram_precision: Any = None,
    interpret: bool | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
) -> KernelOptions:
    """Check the kernel settings and fill in the defaults for dimension ``d``."""
    block_rows = _check_block(block_rows, "block_rows")
    block_cols = _check_block(block_cols, "block_cols")
    check_choice(distances, "distances", ("direct", "gram"))
    if interpret is None:
        interpret = jax.default_backend() != "gpu"
    default_rows, default_cols = _default_blocks(_padded_width(d), distances)
    return KernelOptions(
        block_rows or default_rows,
        block_cols or default_cols,
        distances,
        canonical_precision(precision),
        canonical_precision(gram_precision),
        bool(interpret),
        num_warps,
        num_stages,
    )


def _kernel(*refs, spec: TileSpec, dim: int, has_w: bool, block_cols: int, num_col_blocks: int,
            list_len: int | None = None):
    """One row block against every column block (or, with lists, against its listed ones): fold, store."""
    n_rows, n_cols = (7, 7) if has_w else (4, 5)
    n_lists = 0 if list_len is None else 2
    row_refs, col_refs = refs[:n_rows], refs[n_rows : n_rows + n_cols]
    list_refs, out_refs = refs[n_rows + n_cols : n_rows + n_cols + n_lists], refs[n_rows + n_cols + n_lists :]

    def positions(ref, sl):
        # "direct" reads (d, n) one coordinate at a time (a register tile cannot be sliced).
        return tuple(ref[k, sl] for k in range(dim)) if spec.direct else ref[sl, :]

    everything = slice(None)
    if has_w:
        x_ref, sq_ref, f_ref, thr_ref, w_ref, sqw_ref, thrw_ref = row_refs
        rows = Prepared(positions(x_ref, everything), sq_ref[...], f_ref[...], thr_x=thr_ref[...],
                        w=positions(w_ref, everything), sq_w=sqw_ref[...], thr_w=thrw_ref[...])
    else:
        x_ref, sq_ref, f_ref, thr_ref = row_refs
        rows = Prepared(positions(x_ref, everything), sq_ref[...], f_ref[...], thr_x=thr_ref[...])

    xc_ref, sqc_ref, x1_ref, fc_ref, logs_ref = col_refs[:5]

    def columns(c):
        sl = pl.ds(pl.multiple_of(c * block_cols, block_cols), block_cols)
        cols = Prepared(positions(xc_ref, sl), sqc_ref[sl], fc_ref[sl], x1=x1_ref[sl, :], log_s=logs_ref[sl])
        if has_w:
            cols = cols._replace(w=positions(col_refs[5], sl), sq_w=col_refs[6][sl])
        return cols

    sums_ref = out_refs[0]
    acc = empty_partial(sums_ref.shape[0], sums_ref.shape[1], sums_ref.dtype)
    if list_len is None:
        acc = lax.fori_loop(0, num_col_blocks, lambda c, a: tile_update(a, rows, columns(c), spec), acc)
    else:
        # Block-sparse: this row block's list of column blocks, FULL ones first, then COUNT ones.
        tiles_ref, counts_ref = list_refs
        i = pl.program_id(0)
        n_full, n_count = counts_ref[2 * i], counts_ref[2 * i + 1]

        def listed(c):
            return columns(tiles_ref[i * list_len + c])

        acc = lax.fori_loop(0, n_full, lambda c, a: tile_update(a, rows, listed(c), spec), acc)
        if has_w:
            acc = lax.fori_loop(n_full, n_full + n_count, lambda c, a: count_update(a, rows, listed(c), spec), acc)
    for ref, value in zip(out_refs, acc):
        ref[...] = value


def _whole(a) -> pl.BlockSpec:
    """The whole array for every program (on GPU only a pointer: tiles are loaded in the loop)."""
    zeros = (0,) * a.ndim
    return pl.BlockSpec(a.shape, lambda i: zeros)


def pallas_partial(rows: Prepared, cols: Prepared, opts: KernelOptions, tile_lists: tuple | None = None) -> Partial:
    """Partial of ``rows`` over ``cols`` (both from :func:`~.algebra.prepare` with one centre): one launch.

    ``tile_lists``: None (every row block against every column block) or
    ``(lists (R, K) int32, n_full (R,), n_count (R,))`` per row block of
    ``opts.block_rows`` (:func:`sparse_tile_lists`): the kernel then folds
    only the listed column blocks of ``opts.block_cols``.
    """
    n_rows, d = rows.x.shape
    n_cols = cols.x.shape[0]
    dtype = rows.x.dtype
    has_w = rows.w is not None
    spec = tile_spec(d, dtype, distances=opts.distances, precision=opts.precision,
                     gram_precision=opts.gram_precision)
    br, bc = opts.block_rows, opts.block_cols
    rows = pad_particles(rows, -(-n_rows // br) * br)
    cols = pad_particles(cols, -(-n_cols // bc) * bc)
    n_rows_pad, n_cols_pad = rows.sq_x.shape[0], cols.sq_x.shape[0]
    d_pad, d1_pad = _padded_width(d), _padded_width(d + 1)

    def lanes(a, width):
        return jnp.pad(a, ((0, 0), (0, width - a.shape[1])))

    def positions(a):  # "direct": (d_pad, n), one coordinate per row; "gram": (n, d_pad)
        a = lanes(a, d_pad)
        return a.T if spec.direct else a

    row_args = [positions(rows.x), rows.sq_x, rows.f, rows.thr_x]
    col_args = [positions(cols.x), cols.sq_x, lanes(cols.x1, d1_pad), cols.f, cols.log_s]
    if has_w:
        row_args += [positions(rows.w), rows.sq_w, rows.thr_w]
        col_args += [positions(cols.w), cols.sq_w]
    row_vec = pl.BlockSpec((br,), lambda i: (i,))
    if spec.direct:
        row_mat = pl.BlockSpec((d_pad, br), lambda i: (0, i))
    else:
        row_mat = pl.BlockSpec((br, d_pad), lambda i: (i, 0))
    row_specs = [row_mat if a.ndim == 2 else row_vec for a in row_args]
    col_specs = [_whole(a) for a in col_args]

    list_args, list_len = [], None
    if tile_lists is not None:
        lists, n_full, n_count = tile_lists
        list_len = lists.shape[1]
        list_args = [lists.reshape(-1), jnp.stack([n_full, n_count], axis=1).reshape(-1)]
    kernel = functools.partial(_kernel, spec=spec, dim=d, has_w=has_w, block_cols=bc,
                               num_col_blocks=n_cols_pad // bc, list_len=list_len)
    sums, m, n_r2, n_ball = pl.pallas_call(
        kernel,
        grid=(n_rows_pad // br,),
        in_specs=row_specs + col_specs + [_whole(a) for a in list_args],
        out_specs=(pl.BlockSpec((br, d1_pad), lambda i: (i, 0)), row_vec, row_vec, row_vec),
        out_shape=(
            jax.ShapeDtypeStruct((n_rows_pad, d1_pad), dtype),
            jax.ShapeDtypeStruct((n_rows_pad,), dtype),
            jax.ShapeDtypeStruct((n_rows_pad,), jnp.int32),
            jax.ShapeDtypeStruct((n_rows_pad,), jnp.int32),
        ),
        # Triton CompilerParams select the Triton lowering (jax 0.10 defaults
        # to Mosaic GPU, which does not take this whole-array-pointer pattern).
        compiler_params=pltriton.CompilerParams(num_warps=opts.num_warps, num_stages=opts.num_stages),
        interpret=opts.interpret,
        name=f"ensemble_force_{opts.distances}",
    )(*row_args, *col_args, *list_args)
    return Partial(sums[:n_rows, : d + 1], m[:n_rows], n_r2[:n_rows], n_ball[:n_rows])


def sparse_list_len(n: int, opts: KernelOptions) -> int:
    """Static length ``K`` of each row block's list of column blocks (:data:`SPARSE_LIST_BYTES` in all)."""
    n_rb, n_cb = -(-n // opts.block_rows), -(-n // opts.block_cols)
    return int(max(1, min(n_cb, SPARSE_LIST_BYTES // (4 * n_rb))))


def sparse_tile_lists(p: Prepared, opts: KernelOptions, list_len: int) -> tuple[tuple[Array, Array, Array], Array]:
    """Per row block of ``p``, the column blocks the block-sparse kernel visits, and whether all lists fit.

    Returns ``((lists (R, K) int32, n_full (R,), n_count (R,)), fits)``:
    :func:`~.sparsity.tile_kinds` of each row block's boxes against every
    column block's, listed by :func:`~.sparsity.tile_list` (``FULL`` first,
    then ``COUNT``); ``fits`` is False if a row block has more than ``K``.
    ``O((N/B_r)(N/B_c) d)`` work, ``lax.map`` over the row blocks.
    """
    n, d = p.x.shape
    spec = tile_spec(d, p.x.dtype, distances=opts.distances, precision=opts.precision,
                     gram_precision=opts.gram_precision)

    def boxes(size):
        q = pad_particles(p, -(-n // size) * size)
        return tile_boxes(q.x, q.sq_x, size), None if q.w is None else tile_boxes(q.w, q.sq_w, size)

    (row_x, row_w), (col_x, col_w) = boxes(opts.block_rows), boxes(opts.block_cols)
    thr_x, thr_w = p.thr_x[0], None if p.thr_w is None else p.thr_w[0]
    n_cb = col_x.lo.shape[1]

    def one(args):
        rx, rw = args
        kinds = tile_kinds(rx, col_x, thr_x, spec, rw, col_w, thr_w)
        return tile_list(kinds, list_len, n_cb - 1)

    per_row = (jnp.moveaxis(row_x.lo, 1, 0), jnp.moveaxis(row_x.hi, 1, 0), row_x.sq)
    per_row_w = None if row_w is None else (jnp.moveaxis(row_w.lo, 1, 0), jnp.moveaxis(row_w.hi, 1, 0), row_w.sq)
    lists, n_full, n_count = lax.map(lambda a: one((TileBoxes(*a[0]), None if a[1] is None else TileBoxes(*a[1]))),
                                     (per_row, per_row_w), batch_size=8)
    return (lists, n_full, n_count), jnp.all(n_full + n_count <= list_len)


@functools.partial(jax.jit, static_argnames=("opts", "block_sparse"))
def _pallas(x, f, log_p, eta, w, r2, *, opts: KernelOptions, block_sparse: bool = False):
    p = prepare(x, f, log_p, eta, w, r2)
    if not block_sparse:
        return finish(pallas_partial(p, p, opts), p, x.shape[0])
    perm, p = sort_spatially(p)
    tile_lists, fits = sparse_tile_lists(p, opts, sparse_list_len(x.shape[0], opts))
    # A row block with more listed blocks than the list holds: the dense kernel (exact either way).
    part = lax.cond(fits, lambda: pallas_partial(p, p, opts, tile_lists), lambda: pallas_partial(p, p, opts))
    out = finish(part, p, x.shape[0])
    return unsort(out, perm)


def ensemble_force_pallas(
    x: ArrayLike,
    f: ArrayLike,
    log_p: ArrayLike,
    eta: ArrayLike,
    *,
    w: ArrayLike | None = None,
    r2: ArrayLike | None = None,
    block_rows: int | None = None,
    block_cols: int | None = None,
    distances: str = "direct",
    precision: Any = None,
    gram_precision: Any = None,
    interpret: bool | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    block_sparse: bool = False,
) -> PairwiseForce:
    """The pair sums by the fused Pallas kernel; see the module docstring.

    Args:
      x: (N, d) positions. f: (N,) ``-logdensity`` values. log_p: (N,) log
        density of the proposal each particle was drawn from.
      eta: ball radius ``η > 0``. w, r2: (N, d) deterministic parts and the
        R2 radius (both or neither).
      block_rows, block_cols: tile sizes (powers of two ≥ 16); None picks by d.
      distances: ``"direct"`` (exact differences) or ``"gram"`` (module docstring).
      precision: of the force product ``W @ [x̃, 1]``; gram_precision: of the
        Gram product deciding the masks (``"gram"`` only). None: HIGHEST
        (IEEE float32 on GPU); ``"default"`` is TF32 there.
      interpret: None runs compiled on GPU and in interpret mode elsewhere.
      num_warps, num_stages: Triton launch parameters (None: Triton's defaults).
      block_sparse: sort the particles along a Hilbert curve and let each
        row block visit only the column blocks whose bounding boxes (in x,
        and in w for the R2 count) can hold a pair (:func:`sparse_tile_lists`;
        the lists are kernel inputs). If a row block needs more than
        :func:`sparse_list_len` entries, the dense kernel runs instead.
        Same counts, forces to rounding.

    Returns:
      :class:`~.algebra.PairwiseForce` ``(force_sum (N, d), n_r2 (N,) int32,
      n_ball (N,) int32)`` in the promoted floating dtype (float32 or float64).
    """
    x, f, log_p, w = check_pair_inputs(x, f, log_p, eta, w, r2)
    check_bool(block_sparse, "block_sparse")
    opts = kernel_options(x.shape[1], block_rows, block_cols, distances, precision, gram_precision, interpret,
                          num_warps, num_stages)
    dtype = x.dtype
    return _pallas(x, f, log_p, jnp.asarray(eta, dtype), w, None if r2 is None else jnp.asarray(r2, dtype),
                   opts=opts, block_sparse=bool(block_sparse))
