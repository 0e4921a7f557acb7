"""The masked ensemble force of EnLMC and CEnLMC (spec sections 2-4).

For particles ``x_1..x_N`` (``x: (N, d)``) with potential values ``f_i`` (the
papers' ``f = -logdensity_fn``) and proposal log densities ``log p_j``, the
ensemble gradient estimate of Ding & Li needs, for every particle ``i``,

    force_sum_i = Σ_{j≠i} W_ij (x_j - x_i),

    W_ij = exp(log α_d - log p_j) · (f_j - f_i) / |x_j - x_i|²
           · 1[|x_j - x_i| ≤ η] · 1[|w_j - w_i| ≤ R2]   (last factor only when w is given)

    α_d = d / V_η,   V_η = π^{d/2} η^d / Γ(d/2 + 1)       (spec section 2)

and the neighbour counts

    n_r2_i   = #{j ≠ i : |w_j - w_i| ≤ R2}                 (spec eq. 3.20; N-1 without w)
    n_ball_i = #{j ≠ i : |x_j - x_i| ≤ η  and  |w_j - w_i| ≤ R2 (if w given)}.

The caller turns the sum into the force:

* EnLMC (spec section 3):   ``F_i = force_sum_i / (N - 1)``;
* CEnLMC (spec eq. 3.19):   ``F_i = force_sum_i / n_r2_i`` for the particles
  that pass the three tests of eq. 3.21 (``n_r2_i >= N*`` among them), the
  true gradient for the others.

``force_sum`` approximates ``(N-1)·∇f(x_i)`` (EnLMC) or ``n_r2_i·∇f(x_i)``
(CEnLMC): it is the *gradient of f*, i.e. minus the gradient of the log
density. This module only computes the sums; it does not divide.

Two implementations sit behind :func:`ensemble_force`:

``method="dense"``: the reference. All ``N x N`` pairs at once, direct
    differences ``x_j - x_i`` (an ``(N, N, d)`` temporary), each weight
    exponentiated in log space. Simple, accurate, memory ``O(N² d)``: small N only.

``method="tiled"``: the production kernel. Rows are processed in blocks of
    ``B`` (``lax.map`` over ``ceil(N/B)`` blocks) against all ``N`` columns, so
    temporary memory is ``O(N d + B N)``: no ``N x N`` array, never
    ``N x N x d``. Per block: a Gram matrix product, one fused elementwise
    pass over the ``(B, N)`` pairs, the force matrix product, and row sums
    for the counts:

    1. squared distances by the Gram identity on *centred* coordinates
       ``x̃ = x - mean`` (the mask and the force are translation invariant;
       centring keeps ``|x̃|²`` small so the identity does not lose the
       distance to cancellation when the ensemble sits far from the origin):
       ``d²_ij = |x̃_i|² + |x̃_j|² - 2 x̃_i·x̃_j`` with ``X̃_B X̃ᵀ`` as a matmul.
       For ``d ≤ 3`` (:data:`DIRECT_MAX_D`) exact differences
       ``Σ_k (x̃_ik - x̃_jk)²`` are used instead: there they cost no more, and
       the Gram identity's absolute error ``~ε|x̃|²`` would dominate the force,
       because at low ``d`` many pairs are very close and each contributes
       ``~|∇f|`` whatever its distance (the sum of ``ε|x̃|²/|x_j - x_i|²``
       over a ball diverges for ``d ≤ 2``; measured on 2,000 Gaussian
       particles in d = 1: 3e-2 relative error with the Gram identity, 2e-4
       with exact differences);
    2. ``g_ij = (f_j - f_i) / d²_ij`` on the masked pairs, 0 elsewhere;
    3. the force as matrix products: with the per-column weight
       ``c_j = exp(log α_d - log p_j)`` folded into the right-hand side
       ``Y = [c ⊙ X̃, c]`` (``(N, d+1)``, built once), ``P = g Y`` gives
       ``Σ_j W_ij x̃_j`` and ``Σ_j W_ij`` and
       ``force_sum_i = P_i[:d] - P_i[d] x̃_i``.

    The ``exp`` is thus taken ``N`` times, not ``N²`` times. ``c`` is computed
    as ``exp(log α_d - log p_j - s)`` with a shift ``s >= 0`` chosen so that no
    ``c_j`` overflows (``s = 0`` unless some ``log α_d - log p_j`` exceeds half
    the log of the dtype's largest number, as at d = 50 with a small η);
    ``exp(s)`` multiplies the result back at the end.

    ``method="auto"`` takes ``dense`` when ``N ≤ 64`` and the ``(N, N, d)``
    temporary is at most 16 MiB (there it costs about the same as tiled,
    measured on CPU, and it is the more accurate one), ``tiled`` otherwise
    (already at N = 128 tiled was 2-4x faster).

Numerical conventions (both methods unless stated):

* Mask decisions ``|x_j - x_i| ≤ η`` compare squared distances with ``η²``.
  The Gram identity computes ``d²`` with an absolute error of at most about
  ``(d+1)·ε·(|x̃_i|² + |x̃_j|²)`` (``ε`` the dtype's machine epsilon), exact
  differences with a relative error of about ``(d+1)ε``: pairs that close to
  the threshold may be decided either way. Matmuls run at
  ``precision=jax.lax.Precision.HIGHEST`` by default so that ``ε`` is the
  float32 one on GPUs/TPUs too (with a lower precision the coincidence bound
  below grows accordingly: 2^-10 for HIGH, 2^-7 for DEFAULT).
* Coincident particles contribute 0 (their ``1/|x_j - x_i|²`` is undefined).
  ``dense`` and ``tiled`` with ``d ≤ 3``: pairs with ``x_j == x_i`` exactly.
  ``tiled`` with ``d > 3``: pairs whose Gram ``d²`` is below the identity's
  rounding bound ``κ (|x̃_i|² + |x̃_j|²)``, ``κ = (2d + 4) ε``, where ``d²``
  has no correct digit; for float32, d = 10 and an ensemble of unit spread
  (``|x̃|² ≈ d``), ``|x_j - x_i| ≲ 8e-3`` (a pair that close in 10 dimensions
  is rare).
  Coincident pairs still count as neighbours in ``n_ball`` / ``n_r2`` (they
  are within η of each other); in the tiled kernel this makes the diagonal
  ``j = i`` count for certain, and it is subtracted exactly.
* The force uses ``Σ_j W_ij x̃_j - (Σ_j W_ij) x̃_i``: a pair at distance
  ``r`` has a rounding error of about ``ε |x̃| / r`` relative to its own
  term (``ε|x̃|/r ≤ 1`` since distinct float32 points are at least one ulp apart).
* Non-finite rows: a particle whose ``x``, ``f``, ``log p`` or ``w`` has a
  NaN/inf is no one's neighbour and gets ``force_sum = 0``, ``n_ball = 0``.
  ``n_r2`` lives in w-space only (eq. 3.20): it counts the neighbours of every
  particle with a finite ``w`` (whatever its ``x``) and is 0 for a particle
  whose ``w`` is not finite (``w = +inf`` is the CEnLMC initialisation).
  No NaN reaches the other rows.
* A row whose exact sum exceeds the dtype's range (an EnLMC blow-up,
  spec Theorem 3.2) comes back inf or NaN; the caller's ``diverged`` flag
  should catch it. The other rows are unaffected.
"""

from __future__ import annotations

import functools
import math
import os
import warnings
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import gammaln

from cenlmc_jax._validation import check_int, check_positive
from cenlmc_jax.types import Array, ArrayLike

__all__ = [
    "PairwiseForce",
    "ensemble_force",
    "ensemble_force_dense",
    "ensemble_force_tiled",
    "ensemble_force_reference_numpy",
    "log_alpha_d",
    "default_block_size",
    "AUTO_DENSE_MAX_N",
    "DIRECT_MAX_D",
]

#: ``method="auto"`` uses the dense reference up to this many particles ...
AUTO_DENSE_MAX_N = 64
#: ... provided its (N, N, d) difference array is at most this many bytes.
AUTO_DENSE_MAX_BYTES = 16 * 2**20
#: On a GPU, ``method="auto"`` uses the fused Pallas kernel from this many particles
#: (it lowers to Triton for CUDA; not yet timed on a GPU: set CENLMC_JAX_PALLAS=0 to opt out;
#: a kernel that fails to build or to match the tiled one on first use is never auto-selected).
PALLAS_AUTO_MIN_N = 4096
#: Default working-set target of one row block: bytes of one (B, N) temporary.
#: Measured on a 2-core Zen 4 (1 MiB L2 per core, 32 MiB L3), d = 10: 4 MiB
#: blocks were fastest or within noise of it at N = 4096, 8192 and 16384
#: (B = 256, 128, 64); smaller blocks pay per-iteration overhead and leave the
#: second core idle, larger ones fall out of cache.
TILE_TARGET_BYTES = 4 * 2**20
#: Hard memory cap for the default block: live (B, N) temporaries x B x N x itemsize.
TILE_MAX_BYTES = 64 * 2**20
#: Up to this dimension the tiled kernel uses exact differences instead of the
#: Gram identity (see module docstring).
DIRECT_MAX_D = 3
_MIN_BLOCK = 16
_METHODS = ("auto", "dense", "tiled", "pallas")


class PairwiseForce(NamedTuple):
    """Output of :func:`ensemble_force`.

    force_sum: (N, d) ``Σ_{j≠i} W_ij (x_j - x_i)``; divide by ``N-1``
        (EnLMC) or by ``n_r2`` (CEnLMC, eq. 3.19) to get the force.
    n_r2: (N,) int32 ``#{j≠i : |w_j - w_i| ≤ R2}`` (eq. 3.20); ``N-1`` when
        ``w`` is None; 0 for rows whose ``w`` is not finite.
    n_ball: (N,) int32 ``#{j≠i : |x_j - x_i| ≤ η and |w_j - w_i| ≤ R2}``
        (the w condition only when ``w`` is given).
    """

    force_sum: Array
    n_r2: Array
    n_ball: Array


# ----------------------------------------------------------------------------- helpers


def log_alpha_d(d: int, eta: ArrayLike, dtype: Any = None) -> Array:
    """``log α_d = log d - log V_η``, ``V_η = π^{d/2} η^d / Γ(d/2+1)`` (spec section 2).

    Computed with ``gammaln`` so it stays finite for any ``d`` (``α_d`` itself
    overflows float32 already for moderate ``d`` and small ``η``).
    """
    dtype = jnp.result_type(float) if dtype is None else dtype
    eta = jnp.asarray(eta, dtype)
    half = jnp.asarray(d / 2.0, dtype)
    log_v = half * jnp.log(jnp.asarray(jnp.pi, dtype)) + d * jnp.log(eta) - gammaln(half + 1)
    return jnp.log(jnp.asarray(d, dtype)) - log_v


def default_block_size(n: int, *, itemsize: int = 4, with_w: bool = False) -> int:
    """Row-block size ``B`` used by ``method="tiled"`` when ``block_size`` is None.

    ``B`` keeps one ``(B, N)`` temporary near :data:`TILE_TARGET_BYTES` (the
    block's working set then stays in cache) but at least 16 rows (fewer
    rows per block pay the per-iteration overhead); then N is spread evenly
    over that many blocks (least padding) and B is rounded to a multiple of 8.
    The memory cap wins over everything: the live ``(B, N)`` temporaries (3,
    or 5 with ``w``: the Gram products, the weights, the masks) never exceed
    :data:`TILE_MAX_BYTES` (``B`` may drop to 1 for huge N).
    """
    live = 5 if with_w else 3
    b_cache = TILE_TARGET_BYTES // max(1, n * itemsize)
    b_cap = TILE_MAX_BYTES // max(1, live * n * itemsize)
    b = max(1, min(max(_MIN_BLOCK, b_cache), b_cap))
    # Same number of blocks, least padding: spread N evenly over them.
    b = -(-n // -(-n // b))
    if b >= 8:
        b = -(-b // 8) * 8 if -(-b // 8) * 8 <= b_cap else (b // 8) * 8
    return int(max(1, b))


def _precision_eps(precision: Any, dtype: Any) -> float:
    """Relative accuracy of one product term of the matmuls at this precision.

    HIGHEST: the dtype's own epsilon. HIGH / DEFAULT may run as TF32 (GPU,
    10-bit mantissa) or bfloat16 passes (TPU, 7-bit): assume the worse one.
    On CPU every setting is exact float32, so the bound is only conservative.
    """
    eps = float(jnp.finfo(dtype).eps)
    if precision == jax.lax.Precision.HIGHEST:
        return eps
    if precision == jax.lax.Precision.HIGH:
        return max(eps, 2.0**-10)
    return max(eps, 2.0**-7)


def _canonical_precision(precision: Any) -> jax.lax.Precision:
    if precision is None:
        return jax.lax.Precision.HIGHEST
    if isinstance(precision, jax.lax.Precision):
        return precision
    try:
        return jax.lax.Precision(precision)
    except Exception as exc:  # a string jax does not know, a tuple, a DotAlgorithm ...
        raise ValueError(
            f"precision must be None, a jax.lax.Precision or one of 'default', 'high', 'highest'; "
            f"got {precision!r}."
        ) from exc


def _validate(x, f, log_p, eta, w, r2, method, block_size):
    """Shape and value checks in Python, before tracing; returns jnp arrays in one dtype."""
    if method not in _METHODS:
        raise ValueError(f"method must be one of {_METHODS}; got {method!r}.")
    x = x if isinstance(x, jax.Array) else jnp.asarray(x)
    if x.ndim != 2 or x.shape[0] < 1 or x.shape[1] < 1:
        raise ValueError(f"x must be an array of shape (N, d) with N, d >= 1; got shape {tuple(x.shape)}.")
    n, d = x.shape
    f = f if isinstance(f, jax.Array) else jnp.asarray(f)
    if f.shape != (n,):
        raise ValueError(f"f must have shape (N,) = ({n},) to match x of shape {tuple(x.shape)}; got {tuple(f.shape)}.")
    log_p = log_p if isinstance(log_p, jax.Array) else jnp.asarray(log_p)
    if log_p.shape != (n,):
        raise ValueError(
            f"log_p must have shape (N,) = ({n},) to match x of shape {tuple(x.shape)}; got {tuple(log_p.shape)}."
        )
    check_positive(eta, "eta")
    if w is None:
        if r2 is not None:
            raise ValueError(f"r2 = {r2!r} was given but w is None; pass w (N, d) together with r2, or neither.")
    else:
        w = w if isinstance(w, jax.Array) else jnp.asarray(w)
        if w.shape != x.shape:
            raise ValueError(f"w must have the shape of x, {tuple(x.shape)}; got {tuple(w.shape)}.")
        if r2 is None:
            raise ValueError("w was given but r2 is None; the R2 radius is needed to compare w-neighbours.")
        check_positive(r2, "r2", allow_zero=True)
    if block_size is not None:
        check_int(block_size, "block_size", minimum=1)
    arrays = [x, f, log_p] + ([w] if w is not None else [])
    dtype = jnp.result_type(*[a.dtype for a in arrays])
    if not jnp.issubdtype(dtype, jnp.floating):
        dtype = jnp.result_type(float)
    x, f, log_p = (a.astype(dtype) for a in (x, f, log_p))
    if w is not None:
        w = w.astype(dtype)
    return x, f, log_p, w, dtype


def _row_finite(a: Array) -> Array:
    return jnp.all(jnp.isfinite(a), axis=-1) if a.ndim == 2 else jnp.isfinite(a)


def _masked_mean(a: Array, valid: Array) -> Array:
    """Mean of the valid rows of ``a: (N, d)``; 0 if none is valid."""
    cnt = jnp.maximum(jnp.sum(valid), 1).astype(a.dtype)
    return jnp.sum(jnp.where(valid[:, None], a, 0), axis=0) / cnt


# ------------------------------------------------------------------------------- dense


def _dense_impl(x, f, log_p, eta, w, r2, *, precision):
    """Direct-difference N x N reference (see module docstring)."""
    n, d = x.shape
    dtype = x.dtype
    has_w = w is not None
    valid_w = _row_finite(w) if has_w else jnp.ones((n,), bool)
    valid = _row_finite(x) & jnp.isfinite(f) & jnp.isfinite(log_p) & valid_w
    # Zero the invalid rows so their NaNs never meet a 0 weight (0 * NaN = NaN).
    x = jnp.where(valid[:, None], x, 0)
    f = jnp.where(valid, f, 0)
    log_w = jnp.where(valid, log_alpha_d(d, eta, dtype) - log_p, 0)
    offdiag = ~jnp.eye(n, dtype=bool)

    dx = x[None, :, :] - x[:, None, :]  # [i, j] = x_j - x_i
    d2 = jnp.sum(dx * dx, axis=-1)
    eta2 = jnp.asarray(eta, dtype) ** 2
    pair = valid[:, None] & valid[None, :] & offdiag
    if has_w:
        w0 = jnp.where(valid_w[:, None], w, 0)
        dw = w0[None, :, :] - w0[:, None, :]
        in_r2 = (jnp.sum(dw * dw, axis=-1) <= jnp.asarray(r2, dtype) ** 2) & valid_w[:, None] & valid_w[None, :]
        in_r2 = in_r2 & offdiag
        n_r2 = jnp.sum(in_r2, axis=1, dtype=jnp.int32)
        pair = pair & in_r2
    else:
        n_r2 = jnp.full((n,), n - 1, jnp.int32)
    ball = pair & (d2 <= eta2)
    df = f[None, :] - f[:, None]
    # |W| in log space: the weight exp(log α_d - log p_j) alone can overflow
    # float32 at d = 50 while the product with (f_j - f_i)/|dx|² does not.
    use = ball & (d2 > 0) & (df != 0)
    safe_d2 = jnp.where(use, d2, 1)
    safe_df = jnp.where(use, df, 1)
    log_mag = log_w[None, :] + jnp.log(jnp.abs(safe_df)) - jnp.log(safe_d2)
    weight = jnp.where(use, jnp.sign(safe_df) * jnp.exp(log_mag), 0)
    force = jnp.einsum("ij,ijk->ik", weight, dx, precision=precision)
    n_ball = jnp.sum(ball, axis=1, dtype=jnp.int32)
    return PairwiseForce(force, n_r2, n_ball)


_dense_jit = jax.jit(_dense_impl, static_argnames=("precision",))


# ------------------------------------------------------------------------------- tiled


def _tiled_impl(x, f, log_p, eta, w, r2, *, block_size, precision, direct=None):
    """Row-tiled streaming kernel (see module docstring).

    ``direct``: exact-difference distances instead of the Gram identity
    (default: ``d <= DIRECT_MAX_D``); exposed for tests and benchmarks.
    """
    n, d = x.shape
    dtype = x.dtype
    has_w = w is not None
    B = block_size
    nb = -(-n // B)
    pad = nb * B - n
    finfo = jnp.finfo(dtype)
    kappa = (2 * d + 4) * _precision_eps(precision, dtype)
    direct = d <= DIRECT_MAX_D if direct is None else direct
    dot = lambda a, b: jnp.dot(a, b, precision=precision)  # noqa: E731

    valid_w = _row_finite(w) if has_w else jnp.ones((n,), bool)
    valid = _row_finite(x) & jnp.isfinite(f) & jnp.isfinite(log_p) & valid_w

    # Centred coordinates; invalid rows sit at 0 and carry a NaN squared norm,
    # so every comparison involving them is False (NaN <= t is False) and the
    # selects below drop them; their rows of Y are 0.
    xc = jnp.where(valid[:, None], x - _masked_mean(x, valid), 0)
    sq = jnp.where(valid, jnp.sum(xc * xc, axis=1), jnp.nan)
    f0 = jnp.where(valid, f, 0)

    log_w = log_alpha_d(d, eta, dtype) - log_p
    # Shift so no c_j overflows: s = 0 unless some log-weight exceeds log(max)/2.
    half_log_max = 0.5 * math.log(float(finfo.max))
    shift = jnp.maximum(jnp.max(jnp.where(valid, log_w, -jnp.inf)) - half_log_max, 0)
    c = jnp.where(valid, jnp.exp(jnp.where(valid, log_w, 0) - shift), 0)
    Y = jnp.concatenate([c[:, None] * xc, c[:, None]], axis=1)  # (N, d+1)
    # Transposed column operand. In direct mode it carries the NaN sentinel itself.
    xcT = jnp.where(valid[None, :], xc.T, jnp.nan) if direct else xc.T

    eta2 = jnp.asarray(eta, dtype) ** 2
    rows = [
        jnp.pad(jnp.where(valid[:, None], xc, jnp.nan) if direct else xc, ((0, pad), (0, 0)),
                constant_values=jnp.nan if direct else 0).reshape(nb, B, d),
        jnp.pad(sq, (0, pad), constant_values=jnp.nan).reshape(nb, B),
        jnp.pad(f0, (0, pad)).reshape(nb, B),
    ]
    if has_w:
        wc = jnp.where(valid_w[:, None], w - _masked_mean(w, valid_w), 0)
        sqw = jnp.where(valid_w, jnp.sum(wc * wc, axis=1), jnp.nan)
        wcT = jnp.where(valid_w[None, :], wc.T, jnp.nan) if direct else wc.T
        r2sq = jnp.asarray(r2, dtype) ** 2
        rows += [
            jnp.pad(jnp.where(valid_w[:, None], wc, jnp.nan) if direct else wc, ((0, pad), (0, 0)),
                    constant_values=jnp.nan if direct else 0).reshape(nb, B, d),
            jnp.pad(sqw, (0, pad), constant_values=jnp.nan).reshape(nb, B),
        ]

    def sqdist(ar, sr, a, aT, sa):
        """(B, N) squared distances and their 'no correct digit' threshold."""
        if direct:
            # Exact differences: no cancellation, d2 == 0 only for equal points.
            # aT carries NaN in invalid columns, ar in invalid (padding) rows.
            diff = [ar[:, k, None] - aT[k][None, :] for k in range(d)]
            d2 = sum(dk * dk for dk in diff)
            return d2, d2 <= 0
        t = sr[:, None] + sa[None, :]
        d2 = t - 2 * dot(ar, aT)
        return d2, d2 <= kappa * t

    def block(args, per_row_shift):
        if has_w:
            xr, sr, fr, wr, swr = args
        else:
            xr, sr, fr = args
        d2, coincident = sqdist(xr, sr, xc, xcT, sq)
        in_eta = d2 <= eta2
        # Coincident pairs (below the rounding bound of the Gram identity d2
        # has no correct digit) give no force but count as neighbours; that
        # makes the diagonal always counted, so it is subtracted exactly below.
        near = in_eta | coincident
        use = in_eta & ~coincident
        if has_w:
            dw2, w_coincident = sqdist(wr, swr, wc, wcT, sqw)
            in_r2 = (dw2 <= r2sq) | w_coincident
            use = use & in_r2
            near = near & in_r2
            n_r2 = jnp.sum(jnp.where(in_r2, 1.0, 0.0).astype(dtype), axis=1)
        g = jnp.where(use, (f0[None, :] - fr[:, None]) / d2, 0)
        if per_row_shift:
            # Weights spanning more than the dtype's exponent range (rare: EnLMC
            # blow-ups, d in the hundreds): shift each row by the largest weight
            # it uses, at the cost of an exp per pair, so that rows that never
            # see the heaviest particle keep their weights instead of
            # underflowing to 0 under the global shift.
            lw = jnp.where(use, log_w[None, :], -jnp.inf)
            s_r = jnp.max(lw, axis=1, keepdims=True)
            s_r = jnp.where(jnp.isfinite(s_r), s_r, 0)
            gw = jnp.where(use, g * jnp.exp(lw - s_r), 0)
            P = dot(gw, jnp.concatenate([xc, jnp.ones((n, 1), dtype)], axis=1))
            half_r = jnp.exp(s_r / 2)  # two half-factors: exp(s) alone may overflow
            force = P[:, :d] - P[:, d:] * xr
            force = jnp.where(force != 0, force * half_r * half_r, 0)  # 0 stays 0, not 0 * inf
        else:
            P = dot(g, Y)
            # (In direct mode invalid rows of xr are NaN; they are zeroed at the end.)
            force = P[:, :d] - P[:, d:] * xr
            # Undo the global shift; an exact 0 stays 0 (not 0 * inf).
            force = jnp.where(force != 0, force * half * half, 0)
        # Float sums of 0/1 fuse with the elementwise pass on XLA:CPU and are
        # exact up to 2^24 (float32) neighbours.
        n_near = jnp.sum(jnp.where(near, 1.0, 0.0).astype(dtype), axis=1)
        out = (force, n_near)
        return out + (n_r2,) if has_w else out

    # Undo the shift: two half-factors so exp(s) alone cannot overflow while
    # the product is representable; an exact 0 stays 0 (not 0 * inf).
    half = jnp.exp(shift / 2)
    # With the global shift the smallest weight is exp(min log_w - shift): keep
    # it 20 nats above the smallest normal number (so g_ij c_j stays normal for
    # |g| >= e^-20); otherwise -- a log-weight spread beyond ~110 nats in float32,
    # e.g. EnLMC blow-ups or d in the hundreds -- pay for a shift per row.
    min_lw = jnp.min(jnp.where(valid, log_w, jnp.inf))
    global_ok = (min_lw - shift >= math.log(float(finfo.tiny)) + 20) | ~jnp.any(valid)
    outs = jax.lax.cond(
        global_ok,
        lambda r: jax.lax.map(lambda a: block(a, False), r),
        lambda r: jax.lax.map(lambda a: block(a, True), r),
        tuple(rows),
    )
    force = outs[0].reshape(nb * B, d)[:n]
    force = jnp.where(valid[:, None], force, 0)
    # The diagonal was counted (coincident with itself) for every valid row.
    n_ball = jnp.where(valid, outs[1].reshape(-1)[:n].astype(jnp.int32) - 1, 0)
    if has_w:
        n_r2 = jnp.where(valid_w, outs[2].reshape(-1)[:n].astype(jnp.int32) - 1, 0)
    else:
        n_r2 = jnp.full((n,), n - 1, jnp.int32)
    return PairwiseForce(force, n_r2, n_ball)


_tiled_jit = jax.jit(_tiled_impl, static_argnames=("block_size", "precision", "direct"))


@functools.lru_cache(maxsize=None)
def _pallas_usable() -> bool:
    """Whether ``method="auto"`` may use the Pallas kernel on this machine.

    Checked once per process: not opted out (``CENLMC_JAX_PALLAS=0``), and the
    kernel compiles and matches the tiled kernel (float32 rounding, 1e-4) on a
    small ensemble. A toolchain that cannot build it (an old Triton, a new
    GPU) then costs a warning and the tiled kernel, not a failed job. Runs
    on concrete arrays, so it is safe to call while tracing.
    """
    if os.environ.get("CENLMC_JAX_PALLAS", "1") == "0":
        return False
    try:
        from cenlmc_jax.pairwise_pallas import ensemble_force_pallas

        k1, k2 = jax.random.split(jax.random.key(0))
        x = jax.random.normal(k1, (300, 4))
        f = 0.5 * jnp.sum(x * x, axis=1)
        log_p = jax.random.normal(k2, (300,))
        got = ensemble_force_pallas(x, f, log_p, 1.0)
        ref = _tiled_jit(x, f, log_p, 1.0, None, None, block_size=64, precision=_canonical_precision(None))
        scale = float(jnp.max(jnp.abs(ref.force_sum))) + 1e-30
        ok = (float(jnp.max(jnp.abs(got.force_sum - ref.force_sum))) <= 1e-4 * scale
              and bool(jnp.all(got.n_ball == ref.n_ball)))
        if not ok:
            warnings.warn("the Pallas pairwise kernel disagrees with the tiled kernel here; using tiled",
                          RuntimeWarning, stacklevel=3)
        return ok
    except Exception as exc:  # any build or runtime failure means: do not auto-select it
        warnings.warn(f"the Pallas pairwise kernel is unavailable here ({type(exc).__name__}: {exc}); "
                      "using the tiled kernel", RuntimeWarning, stacklevel=3)
        return False


# ------------------------------------------------------------------------------ public


def ensemble_force(
    x: ArrayLike,
    f: ArrayLike,
    log_p: ArrayLike,
    eta: ArrayLike,
    *,
    w: ArrayLike | None = None,
    r2: ArrayLike | None = None,
    method: str = "auto",
    block_size: int | None = None,
    precision: Any = None,
    mesh: Any = None,
    strategy: str = "allgather",
) -> PairwiseForce:
    """Pairwise sums of the EnLMC / CEnLMC ensemble force (spec sections 2-4).

    Args:
      x: (N, d) particle positions ``x_i^m``.
      f: (N,) potential ``f(x_i) = -logdensity_fn(x_i)`` (any additive constant).
      log_p: (N,) log density of the proposal each particle was drawn from,
        ``log p_j^m = -(d/2) log(4πh) - |x_j - w_j|²/(4h)`` (spec section 3).
      eta: ball radius ``η > 0``.
      w: optional (N, d) deterministic parts ``w_j^m`` (CEnLMC); rows may be
        ``+inf`` (the initialisation) or otherwise non-finite.
      r2: ``R2 >= 0``, the w-space radius; required with ``w``, forbidden without.
      method: ``"dense"`` (N x N reference), ``"tiled"`` (row-blocked,
        ``O(N d + B N)`` memory) or ``"auto"`` (dense for ``N <= 64`` when its
        ``(N, N, d)`` temporary is at most 16 MiB, tiled otherwise).
      block_size: rows per block for ``tiled`` (default
        :func:`default_block_size`); N need not be a multiple (padded, masked).
      precision: matmul precision (default ``jax.lax.Precision.HIGHEST`` so
        distance masks are float32-accurate on GPU/TPU as well).
      mesh: a 1-D ``jax.sharding.Mesh``: shard the particles over its devices
        and compute with :func:`cenlmc_jax.sharding.ensemble_force_sharded`
        (``strategy="allgather"`` or ``"ring"``); the result equals the
        single-device one up to float rounding.

    ``method="pallas"`` is the fused GPU kernel of
    :mod:`cenlmc_jax.pairwise_pallas` (interpret mode off GPU). On a GPU,
    ``"auto"`` picks it for ``N >= PALLAS_AUTO_MIN_N`` and ``d <= 256`` unless
    the environment sets ``CENLMC_JAX_PALLAS=0``.

    Returns:
      :class:`PairwiseForce` ``(force_sum (N, d), n_r2 (N,), n_ball (N,))`` in
      the promoted floating dtype of the inputs (float64 in, float64 out).
      The force is ``force_sum / (N-1)`` for EnLMC and ``force_sum / n_r2``
      for CEnLMC (eq. 3.19): dividing is the caller's job.

    Jittable; ``eta`` and ``r2`` may be traced. Raises ``ValueError`` for
    mismatched shapes, ``eta <= 0``, ``r2 < 0``, an unknown ``method`` or
    ``block_size < 1``.
    """
    x, f, log_p, w, dtype = _validate(x, f, log_p, eta, w, r2, method, block_size)
    n, d = x.shape
    if mesh is not None:
        from cenlmc_jax.sharding import ensemble_force_sharded  # imports this module

        return ensemble_force_sharded(x, f, log_p, eta, w=w, r2=r2, mesh=mesh, strategy=strategy,
                                      block_size=block_size)
    if method == "auto":
        dense_bytes = n * n * d * jnp.dtype(dtype).itemsize * (2 if w is not None else 1)
        if n <= AUTO_DENSE_MAX_N and dense_bytes <= AUTO_DENSE_MAX_BYTES:
            method = "dense"
        elif jax.default_backend() == "gpu" and n >= PALLAS_AUTO_MIN_N and d <= 256 and _pallas_usable():
            method = "pallas"
        else:
            method = "tiled"
    if method == "pallas":
        from cenlmc_jax.pairwise_pallas import ensemble_force_pallas  # imports this module

        return ensemble_force_pallas(x, f, log_p, eta, w=w, r2=r2)
    precision = _canonical_precision(precision)
    if method == "dense":
        return _dense_jit(x, f, log_p, eta, w, r2, precision=precision)
    if block_size is None:
        block_size = default_block_size(n, itemsize=jnp.dtype(dtype).itemsize, with_w=w is not None)
    return _tiled_jit(x, f, log_p, eta, w, r2, block_size=int(block_size), precision=precision)


def ensemble_force_dense(x, f, log_p, eta, *, w=None, r2=None, precision=None) -> PairwiseForce:
    """``ensemble_force(..., method="dense")``."""
    return ensemble_force(x, f, log_p, eta, w=w, r2=r2, method="dense", precision=precision)


def ensemble_force_tiled(x, f, log_p, eta, *, w=None, r2=None, block_size=None, precision=None) -> PairwiseForce:
    """``ensemble_force(..., method="tiled")``."""
    return ensemble_force(x, f, log_p, eta, w=w, r2=r2, method="tiled", block_size=block_size, precision=precision)


# ------------------------------------------------------------------------------ oracle


def ensemble_force_reference_numpy(
    x: ArrayLike,
    f: ArrayLike,
    log_p: ArrayLike,
    eta: float,
    *,
    w: ArrayLike | None = None,
    r2: float | None = None,
) -> PairwiseForce:
    """Float64 NumPy oracle of :func:`ensemble_force` by direct differences.

    Loop-free, ``O(N² d)`` memory: for tests on small N. Same conventions as
    the JAX versions: non-finite rows contribute nothing and get 0 force and
    ``n_ball = 0``; ``n_r2`` is ``N-1`` without ``w`` and 0 for non-finite
    ``w`` rows; exactly coincident pairs (``x_j == x_i``) contribute 0 but
    count as neighbours. Returns NumPy arrays (float64 force, int32 counts).
    """
    x = np.asarray(x, np.float64)
    f = np.asarray(f, np.float64)
    log_p = np.asarray(log_p, np.float64)
    n, d = x.shape
    if f.shape != (n,) or log_p.shape != (n,):
        raise ValueError(f"f and log_p must have shape ({n},); got {f.shape} and {log_p.shape}.")
    if not eta > 0:
        raise ValueError(f"eta must be > 0; got {eta!r}.")
    log_alpha = math.log(d) - (0.5 * d * math.log(math.pi) + d * math.log(eta) - math.lgamma(0.5 * d + 1))
    offdiag = ~np.eye(n, dtype=bool)
    if w is not None:
        if r2 is None or not r2 >= 0:
            raise ValueError(f"r2 must be >= 0 when w is given; got {r2!r}.")
        w = np.asarray(w, np.float64)
        valid_w = np.all(np.isfinite(w), axis=1)
    else:
        valid_w = np.ones(n, bool)
    valid = np.all(np.isfinite(x), axis=1) & np.isfinite(f) & np.isfinite(log_p) & valid_w
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        x0 = np.where(valid[:, None], x, 0.0)
        dx = x0[None, :, :] - x0[:, None, :]
        d2 = np.sum(dx * dx, axis=-1)
        pair = valid[:, None] & valid[None, :] & offdiag
        if w is not None:
            w0 = np.where(valid_w[:, None], w, 0.0)
            dw = w0[None, :, :] - w0[:, None, :]
            in_r2 = (np.sum(dw * dw, axis=-1) <= float(r2) ** 2) & valid_w[:, None] & valid_w[None, :] & offdiag
            n_r2 = in_r2.sum(axis=1).astype(np.int32)
            pair &= in_r2
        else:
            n_r2 = np.full(n, n - 1, np.int32)
        ball = pair & (d2 <= float(eta) ** 2)
        f0 = np.where(valid, f, 0.0)
        cw = np.exp(np.where(valid, log_alpha - log_p, 0.0))
        use = ball & (d2 > 0)
        weight = np.where(use, cw[None, :] * (f0[None, :] - f0[:, None]) / np.where(use, d2, 1.0), 0.0)
        force = np.einsum("ij,ijk->ik", weight, dx)
    return PairwiseForce(force, n_r2, ball.sum(axis=1).astype(np.int32))
