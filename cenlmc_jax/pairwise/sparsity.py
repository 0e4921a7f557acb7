"""Block sparsity of the masked ensemble force: which tile pairs can add anything.

The pair sums of :mod:`.algebra` (docs/algorithms.md §2-4),

    force_sum_i = Σ_{j≠i} W_ij (x_j - x_i),                       (3.19, 3.21)

    W_ij = exp(log s_j) · g_ij · 1[|x_j - x_i| ≤ η] · 1[|w_j - w_i| ≤ R2],

    n_r2_i = #{j ≠ i : |w_j - w_i| ≤ R2}                            (3.20),

only see pairs within ``η`` in x (and, for the R2 count, within ``R2`` in
w). This module is KeOps' block-sparse reduction pattern for them: order the
particles along a space-filling curve (Hilbert) so that a tile of consecutive
particles is a compact cloud, bound every tile by an axis-aligned box (in x,
and in w for the R2 test), and fold only the tile pairs whose boxes are close
enough to hold a pair that passes a mask. The order changes nothing but the
order of the sums; the box test is conservative against the rounding of the
kernel's own distances (:func:`tiles_apart`), so the skipped tiles are
exactly tiles that would have added nothing: the counts equal those of the
dense tiles and the forces agree to rounding.

* :func:`spatial_order` / :func:`sort_spatially`: the Hilbert order
  (:func:`hilbert_key`, Skilling 2004) of w (of x without w), on the
  leading principal coordinates beyond ``SPATIAL_KEY_MAX_D`` dimensions;
  :func:`unsort` puts the rows of a result back in the input order.
* :class:`TileBoxes` (:func:`tile_boxes`): the boxes of the tiles of
  consecutive particles; :func:`box_gap2` the squared gap between two boxes.
* :func:`tiles_apart`: the conservative test, ``γ² (1 - 4(d+4)ε)`` (less
  ``2κ (sq_a + sq_b)`` with the Gram identity, ``κ`` of
  :func:`~.algebra.coincident_rtol`) against the threshold.
* :func:`tile_kinds` (``FULL``, ``COUNT``, ``SKIP``): what a row tile needs
  of each column tile, the whole :func:`~.algebra.tile_update`, the R2 count
  alone (:func:`~.algebra.count_update`) or nothing; :func:`tile_list` the
  column tiles a row tile visits, ``FULL`` first.

The backends that fold a block-sparse sum (:mod:`.tiled`, :mod:`.pallas`)
import this module and :mod:`.algebra`; this module imports only
:mod:`.algebra` below it.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from cenlmc_jax.pairwise.algebra import PairwiseForce, Prepared, TileSpec, far_rows
from cenlmc_jax.types import Array

__all__ = [
    "SPATIAL_KEY_MAX_D",
    "FULL",
    "COUNT",
    "SKIP",
    "TileBoxes",
    "hilbert_key",
    "spatial_order",
    "sort_spatially",
    "unsort",
    "tile_boxes",
    "box_gap2",
    "tiles_apart",
    "tile_kinds",
    "tile_list",
]

#: The spatial key uses at most this many coordinates (the leading principal
#: coordinates beyond): 30 // 5 = 6 bits each in a 30-bit Hilbert index.
SPATIAL_KEY_MAX_D = 5
_KEY_BITS = 30
#: Tile kinds of :func:`tile_kinds`: the whole tile update; the R2 count only;
#: nothing.
FULL, COUNT, SKIP = 0, 1, 2


def hilbert_key(q: Array, bits: int) -> Array:
    """Hilbert-curve index (int32) of the grid cells ``q: (n, k)``.

    Skilling's transpose algorithm ("Programming the Hilbert curve", AIP
    Conf. Proc. 707, 2004), vectorised over the rows: undo the excess work
    of the inverse transform level by level, Gray-encode, then interleave
    the bits (most significant level first, coordinate 0 first). Consecutive
    indices are adjacent cells, so a run of them is a compact cloud (a
    Z-order run can jump across the domain).

    Args:
      q: the cells' integer coordinates, shape ``(n, k)``, int32 in
        ``[0, 2^bits)``.
      bits: the bits per coordinate, ``k * bits <= 30``.

    Returns:
      The ``(n,)`` int32 Hilbert indices.
    """
    k = q.shape[1]
    x = [q[:, j] for j in range(k)]
    level = 1 << (bits - 1)
    while level > 1:
        low = level - 1
        for i in range(k):
            high = (x[i] & level) != 0
            t = (x[0] ^ x[i]) & low
            x0 = jnp.where(high, x[0] ^ low, x[0] ^ t)
            x[i] = jnp.where(high, x[i], x[i] ^ t) if i else x0
            x[0] = x0
        level >>= 1
    for i in range(1, k):
        x[i] = x[i] ^ x[i - 1]
    t = jnp.zeros_like(x[0])
    level = 1 << (bits - 1)
    while level > 1:
        t = jnp.where((x[k - 1] & level) != 0, t ^ (level - 1), t)
        level >>= 1
    x = [xi ^ t for xi in x]
    key = jnp.zeros_like(x[0])
    for b in range(bits):
        for i in range(k):
            key = key | (((x[i] >> b) & 1) << (b * k + k - 1 - i))
    return key


def spatial_order(v: Array, ok: Array) -> Array:
    """Permutation sorting the rows of ``v`` along a Hilbert curve, rows not ok last.

    Key coordinates: ``v`` itself for ``d <= SPATIAL_KEY_MAX_D``, else its
    projections on the ``SPATIAL_KEY_MAX_D`` leading principal axes of the ok
    rows (eigenvectors of their covariance). Each is quantised to ``2^b``
    cells over the ok rows' range, ``b = 30 // (key dimensions)``, and
    ordered by :func:`hilbert_key`; ties keep the input order. Where the grid
    still has at least ``4n`` cells with ``b = (30 - index bits) // (key
    dimensions)``, the key and the row index share one int32 and a plain sort
    orders them (small ``n``). Only the speed of a block-sparse sum depends on
    the order, never its result.

    Args:
      v: the rows, shape ``(n, d)``.
      ok: which rows take part, shape ``(n,)`` bool.

    Returns:
      The ``(n,)`` int32 permutation.
    """
    dtype = v.dtype
    v = jnp.where(ok[:, None], v, 0)
    if v.shape[1] > SPATIAL_KEY_MAX_D:
        count = jnp.maximum(jnp.sum(ok, dtype=dtype), 1)
        c = jnp.where(ok[:, None], v - jnp.sum(v, axis=0) / count, 0)
        # ascending eigenvalues
        _, axes = jnp.linalg.eigh(c.T @ c / count)
        v = c @ axes[:, ::-1][:, :SPATIAL_KEY_MAX_D]
    n, k = v.shape
    # Where the particles' indices fit below a Hilbert key of at least 4n cells (and
    # one value more for the rows not ok), key and index go into one int32 and a plain
    # sort orders them (on CPU a one-operand sort costs a fraction of a stable
    # argsort's two-operand one), in the same order but for ties
    idx_bits = max(1, (n - 1).bit_length())
    packed = k * ((_KEY_BITS - idx_bits) // k) >= idx_bits + 2
    bits = (_KEY_BITS - idx_bits) // k if packed else _KEY_BITS // k
    lo = jnp.min(jnp.where(ok[:, None], v, jnp.inf), axis=0)
    hi = jnp.max(jnp.where(ok[:, None], v, -jnp.inf), axis=0)
    scale = 2.0**bits / jnp.where(hi > lo, hi - lo, 1)
    q = jnp.clip(jnp.floor((v - lo) * scale), 0, 2**bits - 1)
    q = jnp.where(ok[:, None], q, 0).astype(jnp.int32)
    key = q[:, 0] if k == 1 else hilbert_key(q, bits)
    if packed:
        key = jnp.where(ok, key, 2 ** (k * bits)) << idx_bits
        order = jnp.sort(key | jnp.arange(n, dtype=jnp.int32))
        return order & jnp.int32((1 << idx_bits) - 1)
    return jnp.argsort(jnp.where(ok, key, 2**_KEY_BITS), stable=True).astype(jnp.int32)


def sort_spatially(p: Prepared) -> tuple[Array, Prepared]:
    """``(perm, p[perm])``: the particles in the Hilbert order of ``w``.

    Of ``x`` without ``w``.

    ``w`` orders them when it is given: every R2-neighbour pair must be
    visited for ``n_r2``, so the w-boxes decide which tiles are skipped,
    and ``x`` stays close to ``w`` (``x = w + sqrt(2h) ξ``).

    Args:
      p: the :class:`~.algebra.Prepared` particles.

    Returns:
      ``(perm, p[perm])``: the ``(n,)`` int32 permutation and the permuted
      :class:`~.algebra.Prepared`.
    """
    v, ok = (p.x, p.valid) if p.w is None else (p.w, p.valid_w)
    perm = spatial_order(v, ok)
    return perm, jax.tree.map(lambda a: a[perm], p)


def unsort(out: PairwiseForce, perm: Array) -> PairwiseForce:
    """The rows of ``out`` (computed for ``p[perm]``) back in the input order.

    Args:
      out: the :class:`~.algebra.PairwiseForce` of the permuted particles.
      perm: the permutation of :func:`sort_spatially`, shape ``(n,)``.

    Returns:
      The :class:`~.algebra.PairwiseForce` in the input order.
    """
    return PairwiseForce(*(jnp.zeros_like(a).at[perm].set(a) for a in out))


class TileBoxes(NamedTuple):
    """Axis-aligned bounding boxes of tiles of consecutive particles.

    Coordinate-major. Any trailing shape broadcasts in place of ``t`` (one tile:
    ``(d,)``, ``()``).

    Attributes:
      lo: (d, t) coordinate-wise min over the tile's particles not at the far
        point (the valid ones); ``+inf`` for a tile without any.
      hi: (d, t) coordinate-wise max over them; ``-inf`` for a tile without any.
      sq: (t,) the largest ``|ṽ|²`` in the tile (0 if none): bounds the Gram
        identity's rounding error.
    """

    lo: Array
    hi: Array
    sq: Array


def tile_boxes(v: Array, sq: Array, size: int) -> TileBoxes:
    """The :class:`TileBoxes` of the tiles of ``size`` consecutive rows of ``v``.

    Rows at the far point (invalid particles, :func:`~.algebra.far_point`)
    belong to no box.

    Args:
      v: the centred positions, shape ``(n, d)``.
      sq: their squared norms, shape ``(n,)``.
      size: the rows per tile; ``n`` is a multiple of it.

    Returns:
      The :class:`TileBoxes` of the ``n // size`` tiles.
    """
    n, d = v.shape
    far = jnp.all(v == far_rows(1, d, v.dtype), axis=1).reshape(n // size, size)
    v = v.T.reshape(d, n // size, size)
    return TileBoxes(
        jnp.min(jnp.where(far, jnp.inf, v), axis=2),
        jnp.max(jnp.where(far, -jnp.inf, v), axis=2),
        jnp.max(jnp.where(far, 0, sq.reshape(n // size, size)), axis=1),
    )


def box_gap2(a: TileBoxes, b: TileBoxes) -> Array:
    """Squared minimum distance between boxes ``a`` and ``b``.

    Trailing shapes broadcast; ``inf`` if one is empty. Per coordinate the gap
    is ``max(0, lo_b - hi_a, lo_a - hi_b)``; summed one coordinate at a time (a
    fused pass over the tile pairs).

    Args:
      a: :class:`TileBoxes`.
      b: :class:`TileBoxes` whose trailing shape broadcasts with ``a``'s.

    Returns:
      The squared gaps, in the broadcast trailing shape.
    """
    total = None
    for k in range(a.lo.shape[0]):
        gap = jnp.maximum(jnp.maximum(b.lo[k] - a.hi[k], a.lo[k] - b.hi[k]), 0)
        total = gap * gap if total is None else total + gap * gap
    return total


def tiles_apart(a: TileBoxes, b: TileBoxes, thr: Array, spec: TileSpec) -> Array:
    """True where no pair of tiles ``a`` x ``b`` can pass ``d² <= thr``.

    Nor be coincident, in :func:`~.algebra.tile_partial`.

    Conservative against the rounding of both computations: the box gap
    ``γ²`` (computed with relative error below ``(d+2)ε``) is shrunk by
    ``4(d+4)ε``, which also covers the ``(d+2)ε`` of the kernel's direct
    differences; with the Gram identity, whose ``d²`` errs by at most
    ``κ (|x̃_i|² + |x̃_j|²)`` and which counts ``d² <= κ t`` as coincident,
    ``2κ (sq_a + sq_b)`` is subtracted as well. So a tile pair is apart only
    if every computed ``d²`` in it exceeds ``thr`` and the coincidence bound.

    Args:
      a: :class:`TileBoxes` of the row tiles.
      b: :class:`TileBoxes` of the column tiles (trailing shapes broadcast).
      thr: the squared radius (``η²`` or ``R2²``).
      spec: the :class:`~.algebra.TileSpec` of the kernel.

    Returns:
      A bool array in the broadcast trailing shape.
    """
    d = a.lo.shape[0]
    eps = float(jnp.finfo(a.lo.dtype).eps)
    gap2 = box_gap2(a, b) * (1 - 4 * (d + 4) * eps)
    if not spec.direct:
        gap2 = gap2 - 2 * spec.kappa * (a.sq + b.sq)
    return gap2 > thr


def tile_kinds(
    rows_x: TileBoxes,
    cols_x: TileBoxes,
    thr_x: Array,
    spec: TileSpec,
    rows_w: TileBoxes | None = None,
    cols_w: TileBoxes | None = None,
    thr_w: Array | None = None,
) -> Array:
    """What a row tile needs of each column tile: ``FULL``, ``COUNT`` or ``SKIP``.

    ``FULL`` where a pair may pass both masks (the whole
    :func:`~.algebra.tile_update`); with ``w``, ``COUNT`` where the x-boxes are
    apart but the w-boxes are not: ``n_r2`` counts w-neighbours over every
    particle, so such a tile still adds to it (:func:`~.algebra.count_update`);
    ``SKIP`` where the w-boxes are apart (without ``w``: where the x-boxes are).

    Args:
      rows_x: :class:`TileBoxes` of the row tiles in x.
      cols_x: :class:`TileBoxes` of the column tiles in x.
      thr_x: ``η²``.
      spec: the :class:`~.algebra.TileSpec` of the kernel.
      rows_w: :class:`TileBoxes` of the row tiles in w, or ``None``.
      cols_w: :class:`TileBoxes` of the column tiles in w, or ``None``.
      thr_w: ``R2²``, or ``None``.

    Returns:
      An int32 array of tile kinds in the broadcast shape.
    """
    x_apart = tiles_apart(rows_x, cols_x, thr_x, spec)
    if rows_w is None:
        return jnp.where(x_apart, SKIP, FULL).astype(jnp.int32)
    w_apart = tiles_apart(rows_w, cols_w, thr_w, spec)
    return jnp.where(w_apart, SKIP, jnp.where(x_apart, COUNT, FULL)).astype(jnp.int32)


def tile_list(kinds: Array, capacity: int, fill: int) -> tuple[Array, Array, Array]:
    """The column tiles a row tile visits.

    The list holds the ``FULL`` tiles in order, then the ``COUNT`` tiles, then
    ``fill``; entries beyond ``capacity`` are dropped (the caller checks
    ``n_full + n_count <= capacity``).

    Args:
      kinds: the row tile's kinds, shape ``(t,)``, from :func:`tile_kinds`.
      capacity: the length of the list.
      fill: the entry that pads the list.

    Returns:
      ``(list, n_full, n_count)``: the ``(capacity,)`` int32 list of column
      tiles and the int32 scalar numbers of ``FULL`` and ``COUNT`` tiles.
    """
    full, count = kinds == FULL, kinds == COUNT
    n_full = jnp.sum(full, dtype=jnp.int32)
    pos = jnp.where(
        full,
        jnp.cumsum(full) - 1,
        jnp.where(count, n_full + jnp.cumsum(count) - 1, capacity),
    )
    lst = (
        jnp.full((capacity,), fill, jnp.int32)
        .at[pos]
        .set(jnp.arange(kinds.shape[0], dtype=jnp.int32), mode="drop")
    )
    return lst, n_full, jnp.sum(count, dtype=jnp.int32)
