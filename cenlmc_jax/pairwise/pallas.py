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

Block-sparse (``block_sparse=True``): the particles are sorted along a Hilbert
curve, each row block gets the list of column blocks whose bounding boxes (x, and
w for the R2 count) can hold a pair (:func:`sparse_tile_lists`: ``FULL`` blocks
first, then ``COUNT`` blocks, whose x-boxes are apart and which add only to
``n_r2``), and the kernel loops over its list, the lists and their lengths being
two more (whole-array) inputs read with scalar loads. The lists have a static
length (:func:`sparse_list_len`); a row block that needs more (a block in the
thin tails whose box reaches into the dense core) makes the call run the
block-sparse XLA tiles instead, whose single list all row blocks share (exact
either way; the dense kernel it ran before was a hundred times slower on an H200
at N = 2^20, benchmarks/results/gpu/gpu_check.md).

Timed on an H200 (benchmarks/results/gpu/): block-sparse at d = 2 as fast as
the XLA tiles; dense at d = 100 slower than them, in both distance forms.
``method="auto"`` never takes it.

Tiles and launch (``block_rows``, ``block_cols``, ``num_warps``,
``num_stages``) default per ``(distances, dtype, d)`` to :data:`KERNEL_DEFAULTS`,
a frozen table chosen so that the kernel compiled for sm_90 does not spill
registers (benchmarks/bench_spills.py compiles the TTIR of the CUDA lowering
with the ``triton`` wheel's ptxas on a CPU; tests/pairwise/test_pallas_spills.py).
The kernel's refs are named arguments (as in jax's attention kernel); the
optional ones (``w`` and the block-sparse lists) are None when absent.

The kernel is written for Pallas' Triton lowering (``compiler_params`` is a
``jax.experimental.pallas.triton.CompilerParams``, which selects Triton even
though jax 0.10 makes Mosaic GPU the default lowering of ``pl.pallas_call``):
every tile shape is a power of two ≥ 16 (``tl.dot``'s minimum), the lanes of
``x̃`` and ``[x̃, 1]`` are padded to such widths, and ``N`` to a multiple of the
blocks with invalid particles. Off GPU it runs in Pallas' interpret mode (slow,
for tests), chosen by the platform the program is lowered for
(``interpret=None``, ``lax.platform_dependent``), not by the default backend:
lowering for CUDA on a CPU-only machine gives the Triton kernel
(tests/pairwise/test_lowering.py). Meant for moderate ``d`` (≤ 256): a
``(block_rows, d_pad)`` accumulator lives in registers; beyond that the XLA path
is better.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from cenlmc_jax._validation import check_bool, check_choice, check_int
from cenlmc_jax.pairwise.algebra import (
    PairwiseForce,
    Partial,
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
from cenlmc_jax.pairwise.tiled import ensemble_force_tiled
from cenlmc_jax.types import Array, ArrayLike

__all__ = [
    "ensemble_force_pallas",
    "pallas_partial",
    "KernelOptions",
    "KernelConfig",
    "KERNEL_DEFAULTS",
    "default_config",
    "kernel_options",
    "sparse_tile_lists",
    "sparse_list_len",
    "SPARSE_LIST_BYTES",
]

#: Block-sparse: memory of all row blocks' lists of column blocks together;
#: a row block that needs more entries sends the call to the block-sparse XLA tiles.
#: (2^27 bytes: with the 64 x 32 tiles of :data:`KERNEL_DEFAULTS` at d <= 16 a
#: list covers as many columns as half of it did with 64 x 64 tiles.)
SPARSE_LIST_BYTES = 128 * 2**20


class KernelOptions(NamedTuple):
    """Static (hashable) settings of the kernel; see :func:`ensemble_force_pallas`.

    Attributes:
      block_rows: rows per program (a power of two >= 16).
      block_cols: columns per tile of the inner loop (a power of two >= 16).
      distances: ``"direct"`` or ``"gram"``.
      precision: of the force product.
      gram_precision: of the Gram product.
      interpret: Pallas' interpret mode; ``None``: by the lowering platform.
      num_warps: Triton's warps per program.
      num_stages: Triton's pipeline stages.
    """

    block_rows: int
    block_cols: int
    distances: str
    precision: Any
    gram_precision: Any
    interpret: bool | None
    num_warps: int | None
    num_stages: int | None


def _padded_width(d: int) -> int:
    # Triton tiles are powers of two and tl.dot needs every dimension >= 16.
    return max(16, 1 << (max(int(d), 1) - 1).bit_length())


class KernelConfig(NamedTuple):
    """Tile sizes and Triton launch of the kernel: one row of :data:`KERNEL_DEFAULTS`.

    Attributes:
      block_rows: rows per program.
      block_cols: columns per tile.
      num_warps: Triton's warps per program.
      num_stages: Triton's pipeline stages.
    """

    block_rows: int
    block_cols: int
    num_warps: int
    num_stages: int


#: The defaults of :func:`kernel_options`, per ``(distances, dtype)``: rows
#: ``(max d, KernelConfig)``, the first whose ``max d`` holds ``d`` applies.
#: Chosen so that the CEnLMC kernel (w and the R2 count, HIGHEST precision),
#: its TTIR compiled for sm_90a by the ``triton`` wheel, does not spill: the
#: registers and spill bytes per thread of every row (ptxas -v, before and
#: after) are benchmarks/results/spills.md, by benchmarks/bench_spills.py; the
#: float32 rows at d = 2, 3, 10, 100 are asserted by
#: tests/pairwise/test_pallas_spills.py. What decides it:
#:
#: * num_warps = 8, not Triton's 4: the per-thread share of each
#:   (block_rows, block_cols) tile halves; 16 warps cap a thread at 128
#:   registers (65,536 per SM) and spilled again.
#: * block_cols = 32 (16 for float64): the K side of the ``W @ [x̃, 1]``
#:   product, which HIGHEST precision runs as FMAs with its operands in
#:   registers: 64 -> 32 removed the spills at d = 2 and d = 3.
#: * block_rows = 64 at d <= 16, where block-sparse pays: the lists hold
#:   ``SPARSE_LIST_BYTES`` / 4 entries over all row blocks, so the columns a
#:   row block's list covers scale with ``block_rows * block_cols``; with
#:   32-wide column blocks ``SPARSE_LIST_BYTES`` is twice the earlier budget,
#:   which keeps the coverage of the earlier 64 x 64 tiles.
#: * num_stages = 3 (Triton's default): 1 changed nothing.
#:
#: Triton's default launch with the earlier tiles spilled everywhere
#: (spills.md, "before"). The direct rows beyond d = 16 (direct distances there
#: only on request) are not compiled there: extrapolated (tiles no larger per
#: thread than a compiled row's). float64 at d = 100 still spills at the smallest tiles
#: ``tl.dot`` takes (16 x 16): the 128-wide float64 row tiles of x̃ and w̃ alone
#: are 32 registers a thread, and 4 or 16 warps spill more.
KERNEL_DEFAULTS: Mapping[tuple[str, str], tuple[tuple[int, KernelConfig], ...]] = (
    MappingProxyType(
        {
            ("direct", "float32"): (
                (16, KernelConfig(64, 32, 8, 3)),
                (1024, KernelConfig(32, 32, 8, 3)),
            ),
            ("gram", "float32"): (
                (16, KernelConfig(64, 32, 8, 3)),
                (1024, KernelConfig(32, 32, 8, 3)),
            ),
            ("direct", "float64"): (
                (16, KernelConfig(32, 16, 8, 3)),
                (1024, KernelConfig(16, 16, 8, 3)),
            ),
            ("gram", "float64"): (
                (16, KernelConfig(32, 16, 8, 3)),
                (1024, KernelConfig(16, 16, 8, 3)),
            ),
        }
    )
)


def default_config(d: int, distances: str, dtype: Any = jnp.float32) -> KernelConfig:
    """The :data:`KERNEL_DEFAULTS` row for dimension ``d``.

    Float64 rows for float64, float32 otherwise.

    Args:
      d: the dimension.
      distances: ``"direct"`` or ``"gram"``.
      dtype: the particles' dtype.

    Returns:
      The :class:`KernelConfig` (the last row beyond the table's largest ``d``).
    """
    key = "float64" if jnp.dtype(dtype) == jnp.float64 else "float32"
    for max_d, config in KERNEL_DEFAULTS[(distances, key)]:
        if d <= max_d:
            return config
    return KERNEL_DEFAULTS[(distances, key)][-1][1]


def _check_block(value: int | None, name: str) -> int | None:
    if value is None:
        return None
    v = check_int(value, name, minimum=16)
    if v & (v - 1):
        raise ValueError(
            f"{name} must be a power of two >= 16 (a Triton tile size); got {v}."
        )
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
    *,
    dtype: Any = jnp.float32,
) -> KernelOptions:
    """Check the kernel settings and fill in the defaults for ``d`` and ``dtype``.

    Each setting left None comes from :func:`default_config` (the
    :data:`KERNEL_DEFAULTS` row of ``(distances, dtype, d)``), independently:
    a ``block_rows`` given alone keeps the row's ``num_warps``.

    Args:
      d: the dimension.
      block_rows: rows per program, a power of two >= 16, or None.
      block_cols: columns per tile, a power of two >= 16, or None.
      distances: ``"direct"`` or ``"gram"``.
      precision: of the force product (None: HIGHEST).
      gram_precision: of the Gram product (None: ``precision``).
      interpret: Pallas' interpret mode, or None (by the lowering platform).
      num_warps: a power of two in [1, 32], or None.
      num_stages: Triton's pipeline stages, or None.
      dtype: the particles' dtype.

    Returns:
      The :class:`KernelOptions`.

    Raises:
      ValueError: a setting out of its range.
    """
    block_rows = _check_block(block_rows, "block_rows")
    block_cols = _check_block(block_cols, "block_cols")
    check_choice(distances, "distances", ("direct", "gram"))
    if interpret is not None:
        check_bool(interpret, "interpret")
    if num_warps is not None:
        num_warps = check_int(num_warps, "num_warps", minimum=1, maximum=32)
        if num_warps & (num_warps - 1):
            raise ValueError(
                f"num_warps must be a power of two in [1, 32]; got {num_warps}."
            )
    if num_stages is not None:
        num_stages = check_int(num_stages, "num_stages", minimum=1)
    default = default_config(d, distances, dtype)
    return KernelOptions(
        block_rows or default.block_rows,
        block_cols or default.block_cols,
        distances,
        canonical_precision(precision),
        canonical_precision(gram_precision),
        None if interpret is None else bool(interpret),
        num_warps or default.num_warps,
        num_stages or default.num_stages,
    )


def _kernel(
    # rows: this program's block of block_rows particles
    x_ref,
    sq_ref,
    f_ref,
    thr_ref,  # x̃ ((d_pad, B_r) "direct", (B_r, d_pad) "gram"), |x̃|², f, η²
    w_ref,
    sq_w_ref,
    thr_w_ref,  # w̃, |w̃|², R2² (None without w)
    # columns: the whole ensemble, loaded block_cols at a time
    xc_ref,
    sqc_ref,
    x1c_ref,
    fc_ref,
    log_s_ref,  # x̃, |x̃|², [x̃, 1] (N, d1_pad), f, log α_d - log p
    wc_ref,
    sq_wc_ref,  # w̃, |w̃|² (None without w)
    # block-sparse: the column blocks of every row block and their counts (None: visit
    # all)
    tiles_ref,
    counts_ref,  # (R K,) int32 lists; (2 R,) n_full, n_count per row block
    # outputs of the row block
    sums_ref,
    m_ref,
    n_r2_ref,
    # Σ_j W_ij [x̃_j, 1] (B_r, d1_pad), log-scale m, n_r2, n_ball
    n_ball_ref,
    *,
    spec: TileSpec,
    dim: int,
    block_cols: int,
    num_col_blocks: int,
    list_len: int | None = None,
):
    """One row block against every column block: fold, store.

    With lists, against its listed ones.
    """
    # imported here, not at the top: only method='pallas' needs Pallas and its Triton
    # module, and a run on the XLA tiles should not pay for their import
    from jax.experimental import pallas as pl

    has_w = w_ref is not None

    def positions(ref, sl):
        # "direct" reads (d, n) one coordinate at a time (a register tile cannot be
        # sliced).
        return tuple(ref[k, sl] for k in range(dim)) if spec.direct else ref[sl, :]

    everything = slice(None)
    rows = Prepared(
        positions(x_ref, everything), sq_ref[...], f_ref[...], thr_x=thr_ref[...]
    )
    if has_w:
        rows = rows._replace(
            w=positions(w_ref, everything), sq_w=sq_w_ref[...], thr_w=thr_w_ref[...]
        )

    def columns(c):
        sl = pl.ds(pl.multiple_of(c * block_cols, block_cols), block_cols)
        cols = Prepared(
            positions(xc_ref, sl),
            sqc_ref[sl],
            fc_ref[sl],
            x1=x1c_ref[sl, :],
            log_s=log_s_ref[sl],
        )
        if has_w:
            cols = cols._replace(w=positions(wc_ref, sl), sq_w=sq_wc_ref[sl])
        return cols

    acc = empty_partial(sums_ref.shape[0], sums_ref.shape[1], sums_ref.dtype)
    if list_len is None:
        acc = lax.fori_loop(
            0, num_col_blocks, lambda c, a: tile_update(a, rows, columns(c), spec), acc
        )
    else:
        # Block-sparse: this row block's list of column blocks, FULL ones first, then
        # COUNT ones.
        i = pl.program_id(0)
        n_full, n_count = counts_ref[2 * i], counts_ref[2 * i + 1]

        def listed(c):
            return columns(tiles_ref[i * list_len + c])

        acc = lax.fori_loop(
            0, n_full, lambda c, a: tile_update(a, rows, listed(c), spec), acc
        )
        if has_w:
            acc = lax.fori_loop(
                n_full,
                n_full + n_count,
                lambda c, a: count_update(a, rows, listed(c), spec),
                acc,
            )
    for ref, value in zip((sums_ref, m_ref, n_r2_ref, n_ball_ref), acc, strict=True):
        ref[...] = value


def _whole(a) -> Any:
    """The whole array for every program.

    On GPU only a pointer: tiles are loaded in the loop.
    """
    from jax.experimental import pallas as pl  # as in _kernel

    zeros = (0,) * a.ndim
    return pl.BlockSpec(a.shape, lambda i: zeros)


def pallas_partial(
    rows: Prepared, cols: Prepared, opts: KernelOptions, tile_lists: tuple | None = None
) -> Partial:
    """Partial of ``rows`` over ``cols``: one launch.

    Args:
      rows: :func:`~.algebra.prepare` output for the rows.
      cols: :func:`~.algebra.prepare` output for the columns, same centre.
      opts: the :class:`KernelOptions`.
      tile_lists: None (every row block against every column block) or
        ``(lists (R, K) int32, n_full (R,), n_count (R,))`` per row block of
        ``opts.block_rows`` (:func:`sparse_tile_lists`): the kernel then folds
        only the listed column blocks of ``opts.block_cols``.

    Returns:
      The :class:`~.algebra.Partial` of the rows over all the columns.
    """
    from jax.experimental import pallas as pl  # as in _kernel
    from jax.experimental.pallas import triton as pltriton

    n_rows, d = rows.x.shape
    n_cols = cols.x.shape[0]
    dtype = rows.x.dtype
    has_w = rows.w is not None
    spec = tile_spec(
        d,
        dtype,
        distances=opts.distances,
        precision=opts.precision,
        gram_precision=opts.gram_precision,
    )
    br, bc = opts.block_rows, opts.block_cols
    rows = pad_particles(rows, -(-n_rows // br) * br)
    cols = pad_particles(cols, -(-n_cols // bc) * bc)
    n_rows_pad, n_cols_pad = rows.sq_x.shape[0], cols.sq_x.shape[0]
    d_pad, d1_pad = _padded_width(d), _padded_width(d + 1)

    def lanes(a, width):
        return jnp.pad(a, ((0, 0), (0, width - a.shape[1])))

    def positions(
        a,
    ):  # "direct": (d_pad, n), one coordinate per row; "gram": (n, d_pad)
        a = lanes(a, d_pad)
        return a.T if spec.direct else a

    # In _kernel's order; None for what this call lacks (no w, no lists): an
    # empty pytree, passed to the kernel as a None ref (as jax's attention
    # kernel passes its optional segment ids).
    row_args = [positions(rows.x), rows.sq_x, rows.f, rows.thr_x]
    row_args += [positions(rows.w), rows.sq_w, rows.thr_w] if has_w else [None] * 3
    col_args = [
        positions(cols.x),
        cols.sq_x,
        lanes(cols.x1, d1_pad),
        cols.f,
        cols.log_s,
    ]
    col_args += [positions(cols.w), cols.sq_w] if has_w else [None] * 2
    row_vec = pl.BlockSpec((br,), lambda i: (i,))
    if spec.direct:
        row_mat = pl.BlockSpec((d_pad, br), lambda i: (0, i))
    else:
        row_mat = pl.BlockSpec((br, d_pad), lambda i: (i, 0))
    row_specs = [
        None if a is None else row_mat if a.ndim == 2 else row_vec for a in row_args
    ]
    col_specs = [None if a is None else _whole(a) for a in col_args]

    list_args, list_len = [None, None], None
    if tile_lists is not None:
        lists, n_full, n_count = tile_lists
        list_len = lists.shape[1]
        list_args = [
            lists.reshape(-1),
            jnp.stack([n_full, n_count], axis=1).reshape(-1),
        ]
    list_specs = [None if a is None else _whole(a) for a in list_args]
    kernel = functools.partial(
        _kernel,
        spec=spec,
        dim=d,
        block_cols=bc,
        num_col_blocks=n_cols_pad // bc,
        list_len=list_len,
    )

    def launch(*args, interpret: bool):
        return pl.pallas_call(
            kernel,
            grid=(n_rows_pad // br,),
            in_specs=row_specs + col_specs + list_specs,
            out_specs=(
                pl.BlockSpec((br, d1_pad), lambda i: (i, 0)),
                row_vec,
                row_vec,
                row_vec,
            ),
            out_shape=(
                jax.ShapeDtypeStruct((n_rows_pad, d1_pad), dtype),
                jax.ShapeDtypeStruct((n_rows_pad,), dtype),
                jax.ShapeDtypeStruct((n_rows_pad,), jnp.int32),
                jax.ShapeDtypeStruct((n_rows_pad,), jnp.int32),
            ),
            # Triton CompilerParams select the Triton lowering (jax 0.10 defaults
            # to Mosaic GPU, which does not take this whole-array-pointer pattern).
            compiler_params=pltriton.CompilerParams(
                num_warps=opts.num_warps, num_stages=opts.num_stages
            ),
            interpret=interpret,
            name=f"ensemble_force_{opts.distances}",
        )(*args)

    args = (*row_args, *col_args, *list_args)
    if opts.interpret is None:
        # Decided by the platform the program is lowered for, not by the
        # default backend: both forms are traced, and lowering keeps the one
        # of its platform (``.lower(lowering_platforms=("cuda",))`` on a CPU
        # host embeds the Triton kernel; a CPU run interprets).
        compiled = functools.partial(launch, interpret=False)
        sums, m, n_r2, n_ball = lax.platform_dependent(
            *args,
            cuda=compiled,
            rocm=compiled,
            default=functools.partial(launch, interpret=True),
        )
    else:
        sums, m, n_r2, n_ball = launch(*args, interpret=opts.interpret)
    return Partial(sums[:n_rows, : d + 1], m[:n_rows], n_r2[:n_rows], n_ball[:n_rows])


def sparse_list_len(n: int, opts: KernelOptions) -> int:
    """Static length ``K`` of each row block's list of column blocks.

    :data:`SPARSE_LIST_BYTES` in all.

    Args:
      n: the number of particles.
      opts: the :class:`KernelOptions` (its block sizes).

    Returns:
      ``K``, an int ``>= 1``.
    """
    n_rb, n_cb = -(-n // opts.block_rows), -(-n // opts.block_cols)
    return int(max(1, min(n_cb, SPARSE_LIST_BYTES // (4 * n_rb))))


def sparse_tile_lists(
    p: Prepared, opts: KernelOptions, list_len: int
) -> tuple[tuple[Array, Array, Array], Array]:
    """Per row block of ``p``, the column blocks the block-sparse kernel visits.

    And whether all lists fit. :func:`~.sparsity.tile_kinds` of each row
    block's boxes against every column block's, listed by
    :func:`~.sparsity.tile_list` (``FULL`` first, then ``COUNT``).
    ``O((N/B_r)(N/B_c) d)`` work, ``lax.map`` over the row blocks.

    Args:
      p: :func:`~.algebra.prepare` output, in a spatial order.
      opts: the :class:`KernelOptions` (its block sizes and distances).
      list_len: the static length ``K`` (:func:`sparse_list_len`).

    Returns:
      ``((lists (R, K) int32, n_full (R,), n_count (R,)), fits)``; ``fits`` is
      False if a row block has more than ``K``.
    """
    n, d = p.x.shape
    spec = tile_spec(
        d,
        p.x.dtype,
        distances=opts.distances,
        precision=opts.precision,
        gram_precision=opts.gram_precision,
    )

    def boxes(size):
        q = pad_particles(p, -(-n // size) * size)
        return tile_boxes(q.x, q.sq_x, size), None if q.w is None else tile_boxes(
            q.w, q.sq_w, size
        )

    (row_x, row_w), (col_x, col_w) = boxes(opts.block_rows), boxes(opts.block_cols)
    thr_x, thr_w = p.thr_x[0], None if p.thr_w is None else p.thr_w[0]
    n_cb = col_x.lo.shape[1]

    def one(args):
        rx, rw = args
        kinds = tile_kinds(rx, col_x, thr_x, spec, rw, col_w, thr_w)
        return tile_list(kinds, list_len, n_cb - 1)

    per_row = (jnp.moveaxis(row_x.lo, 1, 0), jnp.moveaxis(row_x.hi, 1, 0), row_x.sq)
    per_row_w = (
        None
        if row_w is None
        else (jnp.moveaxis(row_w.lo, 1, 0), jnp.moveaxis(row_w.hi, 1, 0), row_w.sq)
    )
    lists, n_full, n_count = lax.map(
        lambda a: one((TileBoxes(*a[0]), None if a[1] is None else TileBoxes(*a[1]))),
        (per_row, per_row_w),
        batch_size=8,
    )
    return (lists, n_full, n_count), jnp.all(n_full + n_count <= list_len)


@functools.partial(jax.jit, static_argnames=("opts", "block_sparse", "return_fallback"))
def _pallas(
    x,
    f,
    log_p,
    eta,
    w,
    r2,
    *,
    opts: KernelOptions,
    block_sparse: bool = False,
    return_fallback: bool = False,
):
    p = prepare(x, f, log_p, eta, w, r2)
    if not block_sparse:
        out = finish(pallas_partial(p, p, opts), p, x.shape[0])
        return (out, jnp.asarray(False)) if return_fallback else out
    perm, p = sort_spatially(p)
    tile_lists, fits = sparse_tile_lists(p, opts, sparse_list_len(x.shape[0], opts))

    def kernel():
        out = unsort(
            finish(pallas_partial(p, p, opts, tile_lists), p, x.shape[0]), perm
        )
        return (out, jnp.asarray(False)) if return_fallback else out

    def xla_tiles():
        # A row block with more listed blocks than its list holds (a block in the
        # thin tails whose box reaches into the dense core): the block-sparse XLA
        # tiles, whose one list is shared by all row blocks, at the same distances
        # and the precision that decides the masks (exact either way). Not the
        # dense kernel: O(N^2) (benchmarks/results/gpu/gpu_check.md).
        gram = opts.distances == "gram"
        return ensemble_force_tiled(
            x,
            f,
            log_p,
            eta,
            w=w,
            r2=r2,
            precision=opts.gram_precision if gram else opts.precision,
            distances=opts.distances,
            block_sparse=True,
            return_fallback=return_fallback,
        )

    return lax.cond(fits, kernel, xla_tiles)


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
    return_fallback: bool = False,
) -> PairwiseForce | tuple[PairwiseForce, Array]:
    """The pair sums by the fused Pallas kernel; see the module docstring.

    Args:
      x: (N, d) positions. f: (N,) ``-logdensity`` values. log_p: (N,) log
        density of the proposal each particle was drawn from.
      eta: ball radius ``η > 0``. w, r2: (N, d) deterministic parts and the
        R2 radius (both or neither).
      block_rows, block_cols: tile sizes (powers of two ≥ 16).
      distances: ``"direct"`` (exact differences) or ``"gram"`` (module docstring).
      precision: of the force product ``W @ [x̃, 1]``; gram_precision: of the
        Gram product deciding the masks (``"gram"`` only). None: HIGHEST
        (IEEE float32 on GPU); ``"default"`` is TF32 there.
      interpret: None (default): by the platform the program is lowered for
        (``lax.platform_dependent``): the Triton kernel on CUDA and ROCm,
        Pallas' interpret mode elsewhere. So ``jax.jit(...).lower(...,
        lowering_platforms=("cuda",))`` on a CPU host embeds the Triton
        kernel, and the same call run on CPU interprets. True: interpret
        everywhere (slow; a debugging aid); False: always the Triton kernel
        (lowering for CPU then raises).
      num_warps, num_stages: Triton launch parameters.
        None picks tiles and launch by ``(distances, dtype, d)`` from
        :data:`KERNEL_DEFAULTS` (chosen so the compiled kernel does not spill
        on sm_90; each None filled on its own).
      block_sparse: sort the particles along a Hilbert curve and let each
        row block visit only the column blocks whose bounding boxes (in x,
        and in w for the R2 count) can hold a pair (:func:`sparse_tile_lists`;
        the lists are kernel inputs). If a row block needs more than
        :func:`sparse_list_len` entries, the block-sparse XLA tiles
        (:func:`~.tiled.ensemble_force_tiled`, one list for all row blocks)
        run instead, at the same distances and the precision of the masks
        (``gram_precision`` for the Gram form, else ``precision``). Same
        counts, forces to rounding.
      return_fallback: return ``(force, ran_dense)`` as
        :func:`~cenlmc_jax.pairwise.ensemble_force` does: ``ran_dense`` is
        True where those XLA tiles ran their dense tiles (their own list
        overflowed); False for the kernel. Without it, they warn
        (:class:`~.tiled.SparseFallbackWarning`).

    Returns:
      :class:`~.algebra.PairwiseForce` ``(force_sum (N, d), n_r2 (N,) int32,
      n_ball (N,) int32)`` in the promoted floating dtype (float32 or float64);
      with ``return_fallback``, ``(force, ran_dense)``.
    """
    x, f, log_p, w = check_pair_inputs(x, f, log_p, eta, w, r2)
    check_bool(block_sparse, "block_sparse")
    check_bool(return_fallback, "return_fallback")
    opts = kernel_options(
        x.shape[1],
        block_rows,
        block_cols,
        distances,
        precision,
        gram_precision,
        interpret,
        num_warps,
        num_stages,
        dtype=x.dtype,
    )
    dtype = x.dtype
    return _pallas(
        x,
        f,
        log_p,
        jnp.asarray(eta, dtype),
        w,
        None if r2 is None else jnp.asarray(r2, dtype),
        opts=opts,
        block_sparse=bool(block_sparse),
        return_fallback=bool(return_fallback),
    )
