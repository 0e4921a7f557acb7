"""The row-tiled XLA kernel of the ensemble force: the CPU production path.

Folds the blockwise reduction of :mod:`.algebra` (spec sections 2-4: the
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
near 4 MiB: measured on a 2-core Zen 4 (1 MiB L2 per core, 32 MiB L3), d = 10,
those blocks were fastest or within noise of it at N = 4096, 8192 and 16384
(B = 256, 128, 64); smaller blocks pay per-iteration overhead and leave the
second core idle, larger ones fall out of cache.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from cenlmc_jax._validation import check_choice, check_int
from cenlmc_jax.pairwise.algebra import (
    Partial,
    PairwiseForce,
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
from cenlmc_jax.types import ArrayLike

__all__ = ["ensemble_force_tiled", "tiled_partial", "default_block_size", "TILE_TARGET_BYTES", "TILE_MAX_BYTES"]

#: Default working-set target of one row block: bytes of one (B, N) temporary.
TILE_TARGET_BYTES = 4 * 2**20
#: Hard memory cap for the default block: live (B, N) temporaries x B x N x itemsize.
TILE_MAX_BYTES = 64 * 2**20
_MIN_BLOCK = 16


def default_block_size(n: int, *, itemsize: int = 4, with_w: bool = False) -> int:
    """Row-block size ``B`` for ``n`` columns when ``block_size`` is None.

    ``B`` keeps one ``(B, n)`` temporary near :data:`TILE_TARGET_BYTES` (the
    block's working set then stays in cache) but at least 16 rows (fewer
    rows per block pay the per-iteration overhead); then the rows are spread
    evenly over that many blocks (least padding) and B is rounded to a
    multiple of 8. The memory cap wins over everything: the live ``(B, n)``
    temporaries (3, or 5 with ``w``) stay under :data:`TILE_MAX_BYTES` (``B``
    may drop to 1 for huge n).
    """
    live = 5 if with_w else 3
    b_cache = TILE_TARGET_BYTES // max(1, n * itemsize)
    b_cap = TILE_MAX_BYTES // max(1, live * n * itemsize)
    b = max(1, min(max(_MIN_BLOCK, b_cache), b_cap))
    # Same number of blocks, least padding: spread n evenly over them.
    b = -(-n // -(-n // b))
    if b >= 8:
        b = -(-b // 8) * 8 if -(-b // 8) * 8 <= b_cap else (b // 8) * 8
    return int(max(1, b))


def _blocks(p: Prepared, size: int) -> Prepared:
    """Pad ``p`` to a multiple of ``size`` particles and give every field a leading block axis."""
    n_pad = -(-p.sq_x.shape[0] // size) * size
    return jax.tree.map(lambda v: v.reshape((n_pad // size, size) + v.shape[1:]), pad_particles(p, n_pad))


def tiled_partial(rows: Prepared, cols: Prepared, *, block_rows: int | None = None, block_cols: int | None = None,
                  precision: Any = None, distances: str | None = None) -> Partial:
    """Partial of ``rows`` over ``cols`` (both from :func:`~.algebra.prepare` with one centre), tile by tile.

    ``block_rows``: rows per block, at least 2 (default
    :func:`default_block_size` of the column count, at most the row count
    rounded up to 8); ``block_cols``: columns per tile (default: all columns
    in one tile); ``precision`` of both matrix products (None: HIGHEST);
    ``distances``: ``"direct"``, ``"gram"`` or None (by ``DIRECT_MAX_D``).
    Traceable; the settings are static.
    """
    n_rows, d = rows.x.shape
    n_cols = cols.x.shape[0]
    dtype = rows.x.dtype
    spec = tile_spec(d, dtype, distances=distances, precision=precision)
    # Sized by the column count, but no more rows than there are (sharded: n_rows = N/P).
    br = block_rows or min(default_block_size(n_cols, itemsize=jnp.dtype(dtype).itemsize, with_w=rows.w is not None),
                           -(-n_rows // 8) * 8)
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
            cols = cols._replace(x=tuple(cols.x.T), w=None if cols.w is None else tuple(cols.w.T))

        def rows_against_cols(one_shift):
            return lax.map(lambda r: tile_partial_with(r, cols, weights, spec, one_shift), row_blocks)

        out = lax.cond(weights.shared, lambda: rows_against_cols(True), lambda: rows_against_cols(False))
    else:
        col_blocks = _blocks(cols, bc)
        empty = empty_partial(br, d + 1, dtype)

        def fold_columns(r):
            return lax.scan(lambda acc, c: (tile_update(acc, r, c, spec), None), empty, col_blocks)[0]

        out = lax.map(fold_columns, row_blocks)
    return jax.tree.map(lambda v: v.reshape((-1,) + v.shape[2:])[:n_rows], out)


@functools.partial(jax.jit, static_argnames=("block_size", "block_cols", "precision", "distances"))
def _tiled(x, f, log_p, eta, w, r2, *, block_size, block_cols, precision, distances):
    p = prepare(x, f, log_p, eta, w, r2)
    part = tiled_partial(p, p, block_rows=block_size, block_cols=block_cols, precision=precision, distances=distances)
    return finish(part, p, x.shape[0])


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
) -> PairwiseForce:
    """The pair sums by the row-tiled XLA kernel.

    Args:
      x: (N, d) positions. f: (N,) ``-logdensity`` values. log_p: (N,) log
        density of the proposal each particle was drawn from.
      eta: ball radius ``η > 0``. w, r2: (N, d) deterministic parts and the
        R2 radius ``>= 0`` (both or neither).
      block_size: rows per block (default :func:`default_block_size`; 1 is
        taken as 2, see :func:`tiled_partial`); N need not be a multiple
        (padded, masked). The result does not depend on it beyond the
        rounding of the sums.
      block_cols: columns per tile (default all: one tile per row block).
      precision: of the matrix products (None: HIGHEST).
      distances: ``"direct"``, ``"gram"`` or None (direct for ``d <= DIRECT_MAX_D``).

    Returns:
      :class:`~.algebra.PairwiseForce` ``(force_sum (N, d), n_r2 (N,), n_ball (N,))``
      in the promoted floating dtype of the inputs.
    """
    x, f, log_p, w = check_pair_inputs(x, f, log_p, eta, w, r2)
    if block_size is not None:
        check_int(block_size, "block_size", minimum=1)
    if block_cols is not None:
        check_int(block_cols, "block_cols", minimum=1)
    if distances is not None:
        check_choice(distances, "distances", ("direct", "gram"))
    dtype = x.dtype
    return _tiled(
        x, f, log_p, jnp.asarray(eta, dtype), w, None if r2 is None else jnp.asarray(r2, dtype),
        block_size=None if block_size is None else int(block_size),
        block_cols=None if block_cols is None else int(block_cols),
        precision=canonical_precision(precision), distances=distances,
    )  # fmt: skip
