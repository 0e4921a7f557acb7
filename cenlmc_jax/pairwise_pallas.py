"""The masked ensemble force as one fused Pallas kernel (spec sections 2-4).

For every particle ``i`` of an ensemble ``x: (N, d)`` (with ``f = -log p``
values ``f: (N,)``, proposal log densities ``log_p: (N,)`` and, for CEnLMC,
deterministic parts ``w: (N, d)``):

    W_ij = exp(log α_d - log p_j) (f_j - f_i) / |x_j - x_i|²
           · 1[|x_j - x_i| ≤ η] · 1[|w_j - w_i| ≤ R2]            (j ≠ i)
    force_sum_i = Σ_j W_ij (x_j - x_i)                          (3.19, 3.21)
    n_r2_i      = #{j ≠ i : |w_j - w_i| ≤ R2}                   (3.20)
    n_ball_i    = #{j ≠ i : |x_j - x_i| ≤ η, |w_j - w_i| ≤ R2}

with ``α_d = d / V_η`` and ``V_η = π^{d/2} η^d / Γ(d/2 + 1)`` (section 2).
``cenlmc_jax.pairwise.ensemble_force`` is the XLA version of the same
quantity; this module computes it without ever holding an ``N × N`` array,
the way flash attention computes softmax(QKᵀ)V: the grid runs over blocks of
``block_rows`` particles, and inside the kernel a ``fori_loop`` walks over
blocks of ``block_cols`` neighbours, keeping per-row accumulators (the force,
the running log-weight maximum, ``n_r2``, ``n_ball``) in registers. Memory is
``O(N d)``; nothing ``N × N`` exists, not even in the kernel.

Two ways to get the distances of a tile (``distances=``):

* ``"direct"`` (default): ``Σ_k (x_jk - x_ik)²`` and ``Σ_j W_ij (x_jk - x_ik)``
  coordinate by coordinate, from a transposed ``(d, N)`` layout so that one
  coordinate of a tile is a contiguous load. No cancellation: float32
  accurate also for close pairs, which dominate the force at small ``d``.
  About ``5 d`` flops per pair on CUDA cores, no tensor cores.
* ``"gram"``: the flash-attention layout. ``D = |a|² + |b|² - 2 a·b`` with
  ``a·b`` a tile matrix product at ``gram_precision=HIGHEST`` (IEEE float32
  on GPU: TF32 would flip a large fraction of the mask decisions), and
  ``Σ_j W_ij x_j`` as ``W @ X`` at ``precision`` (None: DEFAULT, TF32 on
  GPU), from which ``x_i Σ_j W_ij`` is subtracted at the end. The Gram
  identity's relative error in ``D`` is ``ε (|x_i|² + |x_j|²) / D`` and the
  TF32 product's error is about ``2^-11 |x| / |x_j - x_i|`` of a pair's term,
  so close pairs are poorly resolved; cheaper for large ``d``.

Numerics (the conventions of ``pairwise.ensemble_force``):

* Coordinates are centred (on the mean of the valid particles) and divided by
  ``η`` (``w`` by ``R2``) outside the kernel, so the masks become ``D ≤ 1``
  and no scalar parameter enters the kernel. Centring keeps the Gram
  identity's cancellation small.
* ``1/p_j`` overflows float32 easily (spec section 2). The log weight
  ``log s_j = log α_d - log p_j - log η`` is rescaled online per row, as the
  softmax maximum in flash attention: the kernel keeps ``m_i``, the largest
  ``log s_j`` among the neighbours seen so far, accumulates
  ``exp(log s_j - m_i) ...`` and rescales the accumulators when ``m_i`` grows;
  ``force_sum_i = acc_i · exp(m_i)`` is formed at the end. A particle with a
  huge weight therefore does not wipe out the rows that do not see it (a
  global rescale would underflow them to 0), and a force that truly exceeds
  the float range comes out as ``inf``, which ``diverged`` flags report.
* Coincident pairs contribute no force but are counted in ``n_ball``. With
  ``distances="direct"`` (the default: ``Σ_k (x_jk - x_ik)²``, no
  cancellation) those are the pairs with ``x_j = x_i`` exactly; with
  ``distances="gram"`` the pairs whose Gram distance is below the identity's
  own rounding error, ``D ≤ (2d+4) ε (|x_i|² + |x_j|²)`` (the rule of
  ``pairwise.ensemble_force``'s tiled method). The diagonal ``j = i`` is
  excluded by index, never by distance.
* Rows with a non-finite ``x``, ``f``, ``log_p`` or ``w`` contribute nothing
  and receive force 0 and ``n_ball = 0``; ``n_r2`` looks at ``w`` only (0 for
  rows with a non-finite ``w``; ``N - 1`` when ``w`` is None).

The kernel is written for Pallas' Triton lowering (``compiler_params`` is a
``jax.experimental.pallas.triton.CompilerParams``, which selects Triton even
though jax 0.10 makes Mosaic GPU the default lowering of ``pl.pallas_call``):
every tile shape is a power of two ≥ 16 (``tl.dot``'s minimum), ``d`` is
padded to such a width, and ``N`` to a multiple of the blocks, the padded rows
being flagged invalid. Off GPU it runs in Pallas' interpret mode (slow, for
tests, and checked to lower to Triton IR for CUDA on a CPU-only machine).
It is meant for moderate ``d`` (≤ 256): a ``(block_rows, d_pad)``
accumulator lives in registers; beyond that the XLA row-tiled path is better.

Building blocks for other callers (the sharded force of
:mod:`cenlmc_jax.sharding`): :func:`prepare` (per-particle inputs with a given
centre and global ids), :func:`pallas_partial` (rows against a column set),
:func:`combine` (merge partials over disjoint column sets) and :func:`finish`.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from cenlmc_jax._validation import check_int, check_positive
from cenlmc_jax.pairwise import PairwiseForce, log_alpha_d
from cenlmc_jax.types import Array, ArrayLike

__all__ = [
    "ensemble_force_pallas",
    "pallas_partial",
    "prepare",
    "combine",
    "finish",
    "Prepared",
    "Partial",
    "KernelOptions",
    "kernel_options",
    "check_inputs",
    "coincident_rtol",
]


def coincident_rtol(d: int, dtype: Any) -> float:
    """``κ = (2d + 4) ε``: a Gram distance ``D ≤ κ (|x_i|² + |x_j|²)`` has no correct digit.

    Such a pair contributes no force with ``distances="gram"`` (the same rule
    as ``pairwise.ensemble_force(method="tiled")``); ``"direct"`` drops only
    exactly coincident pairs.
    """
    return (2 * d + 4) * float(jnp.finfo(dtype).eps)


# A finite "minus infinity" for the running maximum: exp(_NEG - m) is exactly
# 0 and _NEG - _NEG is 0, so empty rows never produce inf - inf = NaN.
_NEG = -1e30

# Flags per particle: 0 = invalid (or padding), 1 = only w finite, 2 = all finite.
_VALID_W = 1
_VALID_ALL = 2


def _round_up(n: int, k: int) -> int:
    return -(-n // k) * k


def _padded_width(d: int) -> int:
    # Triton tiles are powers of two and tl.dot needs every dimension >= 16.
    return max(16, pl.next_power_of_2(d))


class Prepared(NamedTuple):
    """Per-particle quantities every pair computation reads (O(N d), unpadded).

    x: (n, d) positions minus the centre, divided by η; 0 on invalid rows.
    sq_x: (n,) ``|x|²`` of those.
    f: (n,) f values, 0 on invalid rows.
    log_s: (n,) ``log α_d - log p_j - log η`` (the ``- log η`` turns
        ``(x_j - x_i)/|x_j - x_i|²`` in scaled coordinates back into original
        units), 0 on invalid rows.
    flag: (n,) int32, 0 invalid / 1 only ``w`` finite / 2 all finite.
    ids: (n,) int32 global particle indices (the diagonal ``j = i`` is
        excluded by index).
    w, sq_w: ``(w - centre_w) / R2`` and its squared norm (None without w;
        ``R2 = 0`` leaves ``w`` unscaled).
    w_thr: (n,) the squared w-radius in those units: 1, or 0 when ``R2 = 0``.
    """

    x: Array
    sq_x: Array
    f: Array
    log_s: Array
    flag: Array
    ids: Array
    w: Array | None
    sq_w: Array | None
    w_thr: Array | None


class Partial(NamedTuple):
    """Pair sums of some rows over some columns, before the final rescale.

    scaled: (n, d) ``exp(-m_i) Σ_j W_ij (x_j - x_i)`` over the columns seen.
    m: (n,) the largest ``log s_j`` among the columns used (``_NEG`` if none).
    n_r2, n_ball: (n,) int32 counts over the columns seen.
    Two partials over disjoint column sets combine with :func:`combine`.
    """

    scaled: Array
    m: Array
    n_r2: Array
    n_ball: Array


def validity(x: Array, f: Array, log_p: Array, w: Array | None) -> tuple[Array, Array]:
    """(valid, valid_w): rows with all inputs finite, rows with a finite ``w``."""
    valid_w = jnp.ones(x.shape[:1], bool) if w is None else jnp.all(jnp.isfinite(w), axis=-1)
    valid = jnp.all(jnp.isfinite(x), axis=-1) & jnp.isfinite(f) & jnp.isfinite(log_p) & valid_w
    return valid, valid_w


def masked_sum(v: Array, ok: Array) -> tuple[Array, Array]:
    """(Σ over ok rows of v, number of ok rows): the pieces of a (global) mean."""
    return jnp.sum(jnp.where(ok[:, None], v, 0), axis=0), jnp.sum(ok, dtype=v.dtype)


def prepare(
    x: Array,
    f: Array,
    log_p: Array,
    eta: ArrayLike,
    w: Array | None = None,
    r2: ArrayLike | None = None,
    *,
    centre_x: Array | None = None,
    centre_w: Array | None = None,
    ids: Array | None = None,
) -> Prepared:
    """Centre, scale and flag the per-particle inputs (O(N d) work).

    The centre defaults to the mean of the valid particles: the force depends
    only on differences, and centring keeps the Gram identity accurate. A
    sharded caller passes the global centre (and the global ``ids``).
    """
    n, d = x.shape
    dtype = x.dtype
    valid, valid_w = validity(x, f, log_p, w)
    eta = jnp.asarray(eta, dtype)

    def centre_scale(v, ok, centre, scale):
        if centre is None:
            total, count = masked_sum(v, ok)
            centre = total / jnp.maximum(count, 1)
        return jnp.where(ok[:, None], (v - centre) / scale, 0)

    xs = centre_scale(x, valid, centre_x, eta)
    out = dict(
        x=xs,
        sq_x=jnp.sum(xs * xs, axis=-1),
        f=jnp.where(valid, f, 0).astype(dtype),
        log_s=jnp.where(valid, log_alpha_d(d, eta, dtype) - log_p.astype(dtype) - jnp.log(eta), 0),
        flag=jnp.where(valid, _VALID_ALL, jnp.where(valid_w, _VALID_W, 0)).astype(jnp.int32),
        ids=jnp.arange(n, dtype=jnp.int32) if ids is None else ids.astype(jnp.int32),
        w=None,
        sq_w=None,
        w_thr=None,
    )
    if w is not None:
        r2 = jnp.asarray(r2, dtype)
        positive = r2 > 0
        ws = centre_scale(w.astype(dtype), valid_w, centre_w, jnp.where(positive, r2, 1))
        thr = jnp.broadcast_to(jnp.where(positive, 1, 0).astype(dtype), (n,))
        out.update(w=ws, sq_w=jnp.sum(ws * ws, axis=-1), w_thr=thr)
    return Prepared(**out)


def empty_partial(n: int, d: int, dtype: Any) -> Partial:
    """The partial over no columns: the identity of :func:`combine`."""
    return Partial(
        jnp.zeros((n, d), dtype), jnp.full((n,), _NEG, dtype), jnp.zeros((n,), jnp.int32), jnp.zeros((n,), jnp.int32)
    )


def combine(a: Partial, b: Partial) -> Partial:
    """Merge partials over disjoint column sets (the flash-attention rescale)."""
    m = jnp.maximum(a.m, b.m)
    scaled = a.scaled * jnp.exp(a.m - m)[:, None] + b.scaled * jnp.exp(b.m - m)[:, None]
    return Partial(scaled, m, a.n_r2 + b.n_r2, a.n_ball + b.n_ball)


def finish(p: Partial, n_total: int, has_w: bool) -> PairwiseForce:
    """``force_sum = scaled · exp(m)`` and the counts (``n_r2 = N - 1`` without w).

    ``exp(m)`` is applied as ``exp(m/2)²`` so that a representable force whose
    weight alone overflows still comes out finite; the where keeps ``0 · inf``
    from turning rows without neighbours into NaN.
    """
    half = jnp.exp(0.5 * p.m)[:, None]
    force = jnp.where(p.scaled == 0, 0, (p.scaled * half) * half)
    n_r2 = p.n_r2 if has_w else jnp.full(p.m.shape, n_total - 1, jnp.int32)
    return PairwiseForce(force, n_r2, p.n_ball)


def _force_kernel(
    *refs,
    block_rows: int,
    block_cols: int,
    num_col_blocks: int,
    dim: int,
    dim_w: int,
    has_w: bool,
    distances: str,
    coincident_rtol: float,
    precision: Any,
    gram_precision: Any,
):
    """One row block against every column block (the flash-attention pattern).

    Row-side refs hold this block's rows; column-side refs the whole padded
    ensemble (on GPU only a pointer: tiles are loaded inside the loop). With
    ``distances="gram"`` positions are ``(rows, d_pad)`` and their squared
    norms are passed; with ``"direct"`` positions are transposed,
    ``(d_pad, rows)``, so that one coordinate of a tile is a contiguous load.
    """
    refs = list(refs)
    gram = distances == "gram"
    take = lambda k: [refs.pop(0) for _ in range(k)]  # noqa: E731
    xi_ref, fi_ref, flagi_ref, idi_ref = take(4)
    sxi_ref = refs.pop(0) if gram else None
    wi_ref, swi_ref = (take(2) if gram else [refs.pop(0), None]) if has_w else (None, None)
    thri_ref = refs.pop(0) if has_w else None
    x_ref, f_ref, logs_ref, flag_ref, id_ref = take(5)
    sx_ref = refs.pop(0) if gram else None
    w_ref, sw_ref = (take(2) if gram else [refs.pop(0), None]) if has_w else (None, None)
    out_ref, m_ref, nr2_ref, nball_ref = refs

    dtype = out_ref.dtype
    d_pad = out_ref.shape[1]
    rows = idi_ref[...]
    fi = fi_ref[...]
    flagi = flagi_ref[...]
    row_ok = flagi >= _VALID_ALL
    row_w_ok = flagi >= _VALID_W
    lanes = jnp.arange(d_pad, dtype=jnp.int32)
    thr_w = thri_ref[...] if has_w else None

    def squared_distances(ai_ref, sai_ref, a_ref, sa_ref, cols_sl, width):
        """(block_rows, block_cols) squared distances and the coincidence floor."""
        if gram:
            ai = ai_ref[...]
            aj = a_ref[cols_sl, :]
            size = sai_ref[...][:, None] + sa_ref[cols_sl][None, :]
            prod = pltriton.dot(ai, aj, trans_b=True, precision=gram_precision)
            return jnp.maximum(size - 2 * prod, 0), coincident_rtol * size

        # Σ_k (a_jk - a_ik)²: no cancellation, so only exact coincidence is 0.
        def coord(k, acc):
            diff = a_ref[k, cols_sl][None, :] - ai_ref[k, :][:, None]
            return acc + diff * diff

        return lax.fori_loop(0, width, coord, jnp.zeros((block_rows, block_cols), dtype)), 0

    def body(c, carry):
        acc_x, acc_w, m, nr2, nball = carry
        start = pl.multiple_of(c * block_cols, block_cols)
        cols_sl = pl.ds(start, block_cols)
        cols = id_ref[cols_sl]
        fj = f_ref[cols_sl]
        logsj = logs_ref[cols_sl]
        flagj = flag_ref[cols_sl]

        off_diag = rows[:, None] != cols[None, :]
        dist2, floor = squared_distances(xi_ref, sxi_ref, x_ref, sx_ref, cols_sl, dim)
        pair = off_diag & row_ok[:, None] & (flagj >= _VALID_ALL)[None, :] & (dist2 <= 1)
        if has_w:
            dist2_w, floor_w = squared_distances(wi_ref, swi_ref, w_ref, sw_ref, cols_sl, dim_w)
            # w-pairs below the rounding floor count as equal (matters for R2 = 0)
            close_w = (dist2_w <= thr_w[:, None]) | (dist2_w <= floor_w)
            near_w = off_diag & row_w_ok[:, None] & (flagj >= _VALID_W)[None, :] & close_w
            nr2 = nr2 + jnp.sum(near_w, axis=1, dtype=jnp.int32)
            pair = pair & near_w
        nball = nball + jnp.sum(pair, axis=1, dtype=jnp.int32)

        use = pair & (dist2 > floor)
        logs_use = jnp.where(use, logsj[None, :], _NEG)
        m_new = jnp.maximum(m, jnp.max(logs_use, axis=1))
        correction = jnp.exp(m - m_new)
        scale = jnp.exp(logs_use - m_new[:, None])  # 0 where not used
        weight = jnp.where(use, scale * (fj[None, :] - fi[:, None]) / jnp.where(use, dist2, 1), 0)
        if gram:
            # Σ_j W_ij x_j now, minus x_i Σ_j W_ij at the end (tensor cores).
            wx = pltriton.dot(weight.astype(x_ref.dtype), x_ref[cols_sl, :], precision=precision)
            acc_w = acc_w * correction + jnp.sum(weight, axis=1)
        else:
            # Σ_j W_ij (x_jk - x_ik) coordinate by coordinate: exact differences,
            # no cancellation against x_i Σ_j W_ij for close pairs.
            def coord(k, acc):
                diff = x_ref[k, cols_sl][None, :] - xi_ref[k, :][:, None]
                fk = jnp.sum(weight * diff, axis=1)
                return acc + fk[:, None] * (lanes == k).astype(dtype)[None, :]

            wx = lax.fori_loop(0, dim, coord, jnp.zeros((block_rows, d_pad), dtype))
        acc_x = acc_x * correction[:, None] + wx
        return acc_x, acc_w, m_new, nr2, nball

    init = (
        jnp.zeros((block_rows, d_pad), dtype),
        jnp.zeros((block_rows,), dtype),
        jnp.full((block_rows,), _NEG, dtype),
        jnp.zeros((block_rows,), jnp.int32),
        jnp.zeros((block_rows,), jnp.int32),
    )
    acc_x, acc_w, m, nr2, nball = lax.fori_loop(0, num_col_blocks, body, init)
    if gram:
        # Σ_j W_ij (x_j - x_i) = Σ_j W_ij x_j - x_i Σ_j W_ij, still scaled by exp(-m_i).
        acc_x = acc_x - xi_ref[...] * acc_w[:, None]
    out_ref[...] = acc_x.astype(out_ref.dtype)
    m_ref[...] = m
    nr2_ref[...] = nr2
    nball_ref[...] = nball


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


def check_inputs(x, f, log_p, eta, w, r2):
    """Shapes and radii checked in Python; returns (x, f, log_p, w) in x's float dtype."""
    x = jnp.asarray(x)
    if x.ndim != 2 or x.shape[0] < 1 or x.shape[1] < 1:
        raise ValueError(f"x must be an array of shape (N, d) with N, d >= 1; got shape {tuple(x.shape)}.")
    dtype = jnp.promote_types(x.dtype, jnp.float32) if jnp.issubdtype(x.dtype, jnp.floating) else jnp.float32
    if dtype not in (jnp.float32, jnp.float64):
        dtype = jnp.float32
    x = x.astype(dtype)
    n = x.shape[0]
    f = jnp.asarray(f)
    log_p = jnp.asarray(log_p)
    for name, v in (("f", f), ("log_p", log_p)):
        if v.shape != (n,):
            raise ValueError(f"{name} must have shape (N,) = ({n},) to match x; got shape {tuple(v.shape)}.")
    check_positive(eta, "eta")
    if (w is None) != (r2 is None):
        raise ValueError(
            "w and r2 go together (the R2 mask |w_j - w_i| <= r2 needs both); "
            f"got w={'None' if w is None else 'an array'} and r2={r2!r}."
        )
    if w is not None:
        w = jnp.asarray(w)
        if w.ndim != 2 or w.shape[0] != n:
            raise ValueError(f"w must have shape (N, d_w) with N = {n}; got shape {tuple(w.shape)}.")
        check_positive(r2, "r2", allow_zero=True)
        w = w.astype(dtype)
    return x, f.astype(dtype), log_p.astype(dtype), w


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
    gram_precision: Any = lax.Precision.HIGHEST,
    interpret: bool | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
) -> PairwiseForce:
    """Masked ensemble force by a fused Pallas kernel; see the module docstring.

    Args:
      x: (N, d) positions. f: (N,) ``-logdensity`` values. log_p: (N,) log
        density of the proposal each particle was drawn from (``log p_j``).
      eta: ball radius η > 0. w, r2: (N, d_w) deterministic parts and the R2
        radius (both or neither).
      block_rows, block_cols: tile sizes (powers of two ≥ 16); None picks by d.
      distances: ``"direct"`` (default) sums ``(x_jk - x_ik)²`` and
        ``W_ij (x_jk - x_ik)`` coordinate by coordinate: float32-accurate for
        close pairs, about ``5 d`` flops per pair on CUDA cores.
        ``"gram"`` uses the Gram identity and two matrix products (the
        flash-attention layout): cheaper for large ``d`` but its relative
        error in ``|x_j - x_i|²`` is ``ε (|x_i|² + |x_j|²) / |x_j - x_i|²``,
        so pairs closer than about ``4 sqrt(ε)·|x|`` are dropped as coincident.
      precision: ``"gram"`` only: precision of the ``W @ X`` product (None:
        DEFAULT, TF32 on GPU). gram_precision: ``"gram"`` only: precision of
        the Gram products deciding the masks (HIGHEST: IEEE float32;
        ``lax.DotAlgorithmPreset.TF32_TF32_F32_X3`` is a faster near-float32
        alternative on GPU).
      interpret: None runs compiled on GPU and in interpret mode elsewhere.
      num_warps, num_stages: Triton launch parameters (None: Triton's defaults).

    Returns:
      ``PairwiseForce(force_sum (N, d), n_r2 (N,) int32, n_ball (N,) int32)``
      in the floating dtype of ``x`` (float32 or float64).
    """
    x, f, log_p, w = check_inputs(x, f, log_p, eta, w, r2)
    opts = kernel_options(
        x.shape[1], block_rows, block_cols, distances, precision, gram_precision, interpret, num_warps, num_stages
    )
    return _ensemble_force_pallas(
        x, f, log_p, jnp.asarray(eta, x.dtype), w, None if r2 is None else jnp.asarray(r2, x.dtype), opts=opts
    )


class KernelOptions(NamedTuple):
    """Static (hashable) settings of the kernel; see ``ensemble_force_pallas``."""

    block_rows: int
    block_cols: int
    distances: str
    precision: Any
    gram_precision: Any
    interpret: bool
    num_warps: int | None
    num_stages: int | None


def kernel_options(
    d: int,
    block_rows: int | None = None,
    block_cols: int | None = None,
    distances: str = "direct",
    precision: Any = None,
    gram_precision: Any = lax.Precision.HIGHEST,
    interpret: bool | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
) -> KernelOptions:
    """Check the kernel settings and fill in the defaults for dimension ``d``."""
    block_rows = _check_block(block_rows, "block_rows")
    block_cols = _check_block(block_cols, "block_cols")
    if distances not in ("direct", "gram"):
        raise ValueError(f"distances must be 'direct' or 'gram'; got {distances!r}.")
    if interpret is None:
        interpret = jax.default_backend() != "gpu"
    default_rows, default_cols = _default_blocks(_padded_width(d), distances)
    return KernelOptions(
        block_rows or default_rows,
        block_cols or default_cols,
        distances,
        lax.Precision.DEFAULT if precision is None else precision,
        gram_precision,
        bool(interpret),
        num_warps,
        num_stages,
    )


@functools.partial(jax.jit, static_argnames=("opts",))
def _ensemble_force_pallas(x, f, log_p, eta, w, r2, *, opts: KernelOptions):
    prepared = prepare(x, f, log_p, eta, w, r2)
    return finish(pallas_partial(prepared, prepared, opts), x.shape[0], w is not None)


def _pad_prepared(p: Prepared, n_pad: int, transpose: bool) -> dict:
    """Kernel operands of one side, padded; padded rows are flagged invalid."""
    n = p.x.shape[0]

    def rows(v, value=0):
        return jnp.pad(v, [(0, n_pad - n)] + [(0, 0)] * (v.ndim - 1), constant_values=value)

    def mat(v):
        v = jnp.pad(v, ((0, n_pad - n), (0, _padded_width(v.shape[1]) - v.shape[1])))
        return v.T if transpose else v

    out = dict(x=mat(p.x), sq_x=rows(p.sq_x), f=rows(p.f), log_s=rows(p.log_s), flag=rows(p.flag), ids=rows(p.ids, -1))
    if p.w is not None:
        out.update(w=mat(p.w), sq_w=rows(p.sq_w), w_thr=rows(p.w_thr))
    return out


def pallas_partial(rows: Prepared, cols: Prepared, opts: KernelOptions) -> Partial:
    """Pair sums of the particles ``rows`` over the particles ``cols`` (one kernel launch).

    Both sides come from :func:`prepare` with the same centre, η and R2; the
    pair ``(i, j)`` is skipped when ``rows.ids[i] == cols.ids[j]``. Returns a
    :class:`Partial` of ``rows``' length, to be combined over column sets
    (a sharded ring) or finished with :func:`finish`.
    """
    n_rows, d = rows.x.shape
    dtype = rows.x.dtype
    has_w = rows.w is not None
    gram = opts.distances == "gram"
    br, bc = opts.block_rows, opts.block_cols
    d_pad = _padded_width(d)
    n_rows_pad = _round_up(n_rows, br)
    n_cols_pad = _round_up(cols.x.shape[0], bc)
    row_ops = _pad_prepared(rows, n_rows_pad, transpose=not gram)
    col_ops = _pad_prepared(cols, n_cols_pad, transpose=not gram)

    kernel = functools.partial(
        _force_kernel,
        block_rows=br,
        block_cols=bc,
        num_col_blocks=n_cols_pad // bc,
        dim=d,
        dim_w=rows.w.shape[1] if has_w else 0,
        has_w=has_w,
        distances=opts.distances,
        coincident_rtol=coincident_rtol(d, dtype),
        precision=opts.precision,
        gram_precision=opts.gram_precision,
    )
    row_vec = pl.BlockSpec((br,), lambda i: (i,))
    col_vec = pl.BlockSpec((n_cols_pad,), lambda i: (0,))
    col_mat = lambda a: pl.BlockSpec(a.shape, lambda i: (0, 0))  # noqa: E731
    if gram:  # (rows, width): row blocks of a matrix
        row_mat = lambda a: pl.BlockSpec((br, a.shape[1]), lambda i: (i, 0))  # noqa: E731
    else:  # (width, rows): one coordinate of a tile is a contiguous load
        row_mat = lambda a: pl.BlockSpec((a.shape[0], br), lambda i: (0, i))  # noqa: E731

    def side(ops, mat, vec, is_rows):
        names = ["x", "f"] + ([] if is_rows else ["log_s"]) + ["flag", "ids"] + (["sq_x"] if gram else [])
        if has_w:
            names += ["w"] + (["sq_w"] if gram else []) + (["w_thr"] if is_rows else [])
        args = [ops[k] for k in names]
        specs = [mat(ops[k]) if k in ("x", "w") else vec for k in names]
        return args, specs

    row_args, row_specs = side(row_ops, row_mat, row_vec, True)
    col_args, col_specs = side(col_ops, col_mat, col_vec, False)
    out_shape = (
        jax.ShapeDtypeStruct((n_rows_pad, d_pad), dtype),
        jax.ShapeDtypeStruct((n_rows_pad,), dtype),
        jax.ShapeDtypeStruct((n_rows_pad,), jnp.int32),
        jax.ShapeDtypeStruct((n_rows_pad,), jnp.int32),
    )
    out_specs = (pl.BlockSpec((br, d_pad), lambda i: (i, 0)), row_vec, row_vec, row_vec)
    scaled, m, nr2, nball = pl.pallas_call(
        kernel,
        grid=(n_rows_pad // br,),
        in_specs=row_specs + col_specs,
        out_specs=out_specs,
        out_shape=out_shape,
        # Triton CompilerParams select the Triton lowering (jax 0.10 defaults
        # to Mosaic GPU, which does not take this whole-array-pointer pattern).
        compiler_params=pltriton.CompilerParams(num_warps=opts.num_warps, num_stages=opts.num_stages),
        interpret=opts.interpret,
        name=f"ensemble_force_{opts.distances}",
    )(*row_args, *col_args)
    return Partial(scaled[:n_rows, :d], m[:n_rows], nr2[:n_rows], nball[:n_rows])
