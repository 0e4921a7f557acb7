"""The algebra of the masked ensemble force, written once (docs/algorithms.md §2-4).

For particles ``x_1..x_N`` (``x: (N, d)``) with potential values ``f_i`` (the
papers' ``f = -logdensity_fn``), proposal log densities ``log p_j`` and, for
CEnLMC, deterministic parts ``w_j``, the ensemble gradient estimate needs

    force_sum_i = Σ_{j≠i} W_ij (x_j - x_i),                       (3.19, 3.21)

    W_ij = exp(log s_j) · g_ij · 1[|x_j - x_i| ≤ η] · 1[|w_j - w_i| ≤ R2]
           (the last factor only with w)

    log s_j = log α_d - log p_j,   g_ij = (f_j - f_i) / |x_j - x_i|²

    α_d = d / V_η,   V_η = π^{d/2} η^d / Γ(d/2 + 1)               (section 2)

    n_r2_i   = #{j ≠ i : |w_j - w_i| ≤ R2}                        (3.20; N-1 without w)
    n_ball_i = #{j ≠ i : |x_j - x_i| ≤ η  and  |w_j - w_i| ≤ R2 (if w given)}.

The caller divides: EnLMC ``F_i = force_sum_i / (N - 1)`` (section 3), CEnLMC
``F_i = force_sum_i / n_r2_i`` (eq. 3.19). ``force_sum`` approximates
``(N-1)·∇f(x_i)`` resp. ``n_r2_i·∇f(x_i)``: the gradient of ``f``.

The backends (:mod:`.dense`, :mod:`.tiled`, :mod:`.pallas`, :mod:`.sharded`)
all sum this; every one except the dense reference folds the same blockwise
reduction defined here, the flash-attention pattern (KeOps'
``Max_SumShiftExpWeight`` reduction):

* :func:`prepare` turns the inputs into per-particle operands
  (:class:`Prepared`, O(N d)): centred positions ``x̃ = x - centre`` and their
  lift ``[x̃, 1]``, squared norms, ``f``, the log weights ``log s_j`` and
  the squared radii.
* A column set's contribution to a row set is a :class:`Partial`:
  ``sums_i = exp(-m_i) Σ_j W_ij [x̃_j, 1]`` (``Σ_j W_ij x̃_j`` and ``Σ_j W_ij``
  in one product), the shift ``m_i`` and the two counts. :func:`empty_partial`
  is the identity, :func:`combine` the associative merge of two partials over
  disjoint column sets (rescale both to the larger shift, add),
  :func:`tile_partial` one tile of rows against one tile of columns and
  :func:`tile_update` ``= combine(acc, tile_partial(...))`` the fold step.
  (:func:`column_weights` is the tile's column-only part and
  :func:`tile_partial_with` the tile with the overflow rule's decision made,
  for a caller that folds many row tiles against one column set and hoists
  both out of its loop.)
* :func:`finish` turns a partial over all columns into :class:`PairwiseForce`:
  ``force_sum_i = exp(m_i) (Σ_j W_ij x̃_j - (Σ_j W_ij) x̃_i)``.

Which tile pairs a block-sparse fold may skip (the Hilbert order, the tiles'
bounding boxes and the conservative box test) is :mod:`.sparsity`, one floor
above this module: it imports this one, never the reverse.

The log weights (one overflow rule for every backend). ``exp(log s_j)``
overflows float32 already at d = 50 with a small η (docs/algorithms.md §2), and
the weights of one ensemble may spread over more than the exponent range (EnLMC
blow-ups, Theorem 3.2). A tile therefore sums ``exp(log s_j - m)`` and carries
the shift ``m``; the largest weight in scope becomes 1:

* if the tile's columns spread by at most :func:`max_shared_spread` nats
  (``-log(tiny) - 20``: 67 in float32, 688 in float64), one shift for the
  tile, ``m = max_j log s_j``: one ``exp`` per column, every weight in
  ``[e^20 tiny, 1]``, so a term ``W_ij`` stays a normal number while
  ``|g_ij| ≥ e^-20``;
* otherwise each row takes its own shift, the largest ``log s_j`` among the
  pairs it uses: one ``exp`` per pair, and a heavy particle does not wipe out
  the rows that do not see it (one shift for all would underflow their
  weights to 0).

A row whose tile sums are exactly 0 carries no shift (``m = NEG``), so
:func:`combine` never rescales a row by a tile it takes nothing from. The
shift is undone in :func:`finish` as ``exp(m/2)²`` (a representable force
whose weight alone overflows stays finite); a force that exceeds the range
comes out inf, which the samplers' ``diverged`` flag reports.

Distances (``TileSpec.direct``):

* Gram identity on centred coordinates, ``|x̃_i|² + |x̃_j|² - 2 x̃_i·x̃_j``
  with the products as one matrix product per tile. Centring keeps ``|x̃|²``
  small so the identity does not lose the distance to cancellation when the
  ensemble sits far from the origin. Its absolute error is at most about
  ``(d+1)·ε·(|x̃_i|² + |x̃_j|²)`` (``ε`` of the product's precision:
  :func:`precision_eps`).
* Direct differences ``Σ_k (x̃_jk - x̃_ik)²``, relative error ``(d+1)ε``, for
  ``d ≤ DIRECT_MAX_D`` by default: there they cost no more, and the Gram
  error would dominate the force, because at low ``d`` many pairs are very
  close and each contributes ``~|∇f|`` whatever its distance (the sum of
  ``ε|x̃|²/|x_j - x_i|²`` over a ball diverges for ``d ≤ 2``, so on a
  Gaussian ensemble in d = 1 the Gram identity's error in the force is orders
  of magnitude above that of exact differences).

Numerical conventions (every backend):

* Masks compare squared distances with ``η²`` (``R2²``); pairs within the
  distances' rounding error of the threshold may be decided either way.
* Coincident pairs contribute no force (their ``1/|x_j - x_i|²`` is undefined)
  but count as neighbours. Direct: pairs with ``x_j == x_i`` exactly. Gram:
  pairs whose ``d²`` is at most the identity's rounding bound
  ``κ (|x̃_i|² + |x̃_j|²)``, ``κ = (2d + 4) ε`` (:func:`coincident_rtol`),
  where ``d²`` has no correct digit: for float32 at HIGHEST, d = 10 and an
  ensemble of unit spread, ``|x_j - x_i| ≲ 8e-3``. A w-pair below its
  rounding bound counts as equal (matters for ``R2 = 0``). The diagonal
  ``j = i`` is coincident with itself in both, so it is counted in every
  tile that holds it, and :func:`finish` subtracts it exactly.
* The force is ``Σ_j W_ij x̃_j - (Σ_j W_ij) x̃_i``: a pair at distance ``r``
  has a rounding error of about ``ε |x̃| / r`` relative to its own term.
* Non-finite rows: a particle whose ``x``, ``f``, ``log p`` or ``w`` has a
  NaN/inf is no one's neighbour and gets ``force_sum = 0``, ``n_ball = 0``.
  ``n_r2`` lives in w-space only: it counts the neighbours of every particle
  with a finite ``w`` and is 0 for a particle whose ``w`` is not finite
  (``w = +inf`` is the CEnLMC initialisation). Inside the tiles an invalid
  particle (and a padding one) sits at the far point ``F e_1`` (its ``x̃``
  and ``w̃``; ``F = 2^(e/2 - 3)`` for the dtype's largest exponent ``e``,
  :func:`far_point`: ``2^61`` in float32, ``2^509`` in float64), so every
  distance from a particle within ``F/4`` of the centre to it exceeds any
  radius and the coincidence bound, with no mask per pair; two invalid
  particles coincide (no force). Its lift ``[x̃, 1]`` and weight are 0.
  (A valid particle at ``|x̃| ≳ F/4`` is outside this promise; its squared
  norm is then within a factor 64 of overflow.)
* Reverse mode: every value in the tiles is finite (no NaN sentinel), and the
  one division, ``(f_j - f_i) / d²``, divides by 1 instead of the ``d²`` of an
  unused pair (``0`` for coincident ones) before the pair is dropped (the
  "double where"): ``0 / 0`` would put ``0 · NaN = NaN`` into the cotangents.
"""

from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.scipy.special import gammaln

from cenlmc_jax._validation import check_nonnegative, check_positive, describe
from cenlmc_jax.types import Array, ArrayLike

__all__ = [
    "DIRECT_MAX_D",
    "NEG",
    "PairwiseForce",
    "Prepared",
    "Partial",
    "TileSpec",
    "ColumnWeights",
    "log_alpha_d",
    "check_pair_inputs",
    "canonical_precision",
    "precision_eps",
    "coincident_rtol",
    "max_shared_spread",
    "tile_spec",
    "validity",
    "centre_terms",
    "far_point",
    "far_rows",
    "prepare",
    "pad_particles",
    "empty_partial",
    "combine",
    "column_weights",
    "tile_partial",
    "tile_partial_with",
    "tile_update",
    "count_update",
    "r2_counts",
    "finish",
]

#: Up to this dimension distances are exact differences by default (module
#: docstring).
DIRECT_MAX_D = 3
#: A finite "minus infinity" for shifts and invalid log weights: ``exp(NEG - m)``
#: is exactly 0 and ``NEG - NEG`` is 0, so empty rows never produce ``inf - inf``.
NEG = -1e30
#: Nats kept between the smallest shared-shift weight and the smallest normal number.
UNDERFLOW_MARGIN = 20.0


class PairwiseForce(NamedTuple):
    """The pair sums of the ensemble force.

    Attributes:
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


def log_alpha_d(d: int, eta: ArrayLike, dtype: Any = None) -> Array:
    """``log α_d = log d - log V_η``, ``V_η = π^{d/2} η^d / Γ(d/2+1)``.

    docs/algorithms.md §2. Computed with ``gammaln`` so it stays finite for any
    ``d`` (``α_d`` itself overflows float32 already for moderate ``d`` and small
    ``η``).

    Args:
      d: the dimension.
      eta: the ball radius ``η > 0`` (a scalar, may be traced).
      dtype: the floating dtype of the result (default: JAX's default float).

    Returns:
      The scalar ``log α_d`` in ``dtype``.
    """
    dtype = jnp.result_type(float) if dtype is None else dtype
    eta = jnp.asarray(eta, dtype)
    half = jnp.asarray(d / 2.0, dtype)
    log_v = (
        half * jnp.log(jnp.asarray(jnp.pi, dtype))
        + d * jnp.log(eta)
        - gammaln(half + 1)
    )
    return jnp.log(jnp.asarray(d, dtype)) - log_v


# ----------------------------------------------------------------------------- checks


def check_pair_inputs(
    x, f, log_p, eta, w=None, r2=None
) -> tuple[Array, Array, Array, Array | None]:
    """The checks every pair-force entry point runs, in Python before tracing.

    Args:
      x: particle positions, shape ``(N, d)``, ``N, d >= 1``.
      f: potential values, shape ``(N,)``.
      log_p: proposal log densities, shape ``(N,)``.
      eta: the ball radius, ``> 0``.
      w: CEnLMC's deterministic parts, shape ``(N, d)``, or ``None``; with
        ``r2``, both or neither.
      r2: the R2 radius, ``>= 0``, or ``None``.

    Returns:
      ``(x, f, log_p, w)`` as JAX arrays in one floating dtype: the promoted
      dtype of the inputs, at least float32 (float64 in, float64 out); ``w``
      ``None`` when not given.

    Raises:
      ValueError: a shape that does not fit, ``eta`` not positive, ``r2``
        negative, or only one of ``w`` and ``r2``.
    """
    x = x if isinstance(x, jax.Array) else jnp.asarray(x)
    if x.ndim != 2 or x.shape[0] < 1 or x.shape[1] < 1:
        raise ValueError(
            "x must be an array of shape (N, d) with N, d >= 1; got shape "
            f"{tuple(x.shape)}."
        )
    n = x.shape[0]
    f = f if isinstance(f, jax.Array) else jnp.asarray(f)
    log_p = log_p if isinstance(log_p, jax.Array) else jnp.asarray(log_p)
    for name, v in (("f", f), ("log_p", log_p)):
        if v.shape != (n,):
            raise ValueError(
                f"{name} must have shape (N,) = ({n},) to match x of shape "
                f"{tuple(x.shape)}; got shape {tuple(v.shape)}."
            )
    check_positive(eta, "eta")
    if (w is None) != (r2 is None):
        raise ValueError(
            "w and r2 go together (the R2 mask |w_j - w_i| <= r2 needs both); got "
            + ("w is None" if w is None else "w = an array")
            + " and "
            + ("r2 is None." if r2 is None else f"r2 = {describe(r2)}.")
        )
    if w is not None:
        w = w if isinstance(w, jax.Array) else jnp.asarray(w)
        if w.shape != x.shape:
            raise ValueError(
                f"w must have the shape of x, {tuple(x.shape)}; got shape "
                f"{tuple(w.shape)}."
            )
        check_nonnegative(r2, "r2")
    arrays = [x, f, log_p] + ([] if w is None else [w])
    dtype = jnp.result_type(*(a.dtype for a in arrays))
    dtype = (
        jnp.promote_types(dtype, jnp.float32)
        if jnp.issubdtype(dtype, jnp.floating)
        else jnp.result_type(float)
    )
    x, f, log_p = (a.astype(dtype) for a in (x, f, log_p))
    return x, f, log_p, None if w is None else w.astype(dtype)


def canonical_precision(precision: Any) -> Any:
    """None -> ``Precision.HIGHEST``; a ``Precision``, its name or a preset as given.

    HIGHEST by default so that distance masks are float32-accurate on GPU/TPU
    as well (on CPU every setting is exact float32).

    Args:
      precision: ``None``, a ``jax.lax.Precision``, its name (``"default"``,
        ``"high"``, ``"highest"``) or a ``jax.lax.DotAlgorithmPreset``.

    Returns:
      A ``jax.lax.Precision`` or the ``DotAlgorithmPreset`` given.

    Raises:
      ValueError: anything else.
    """
    if precision is None:
        return lax.Precision.HIGHEST
    if isinstance(precision, (lax.Precision, lax.DotAlgorithmPreset)):
        return precision
    try:
        return lax.Precision(precision)
    # a string jax does not know, a tuple, ...
    except Exception as exc:
        raise ValueError(
            "precision must be None, a jax.lax.Precision (or one of 'default', "
            "'high', 'highest') or a jax.lax.DotAlgorithmPreset; got "
            f"{describe(precision)}."
        ) from exc


def precision_eps(precision: Any, dtype: Any) -> float:
    """Relative accuracy of one product term of a matrix product at this precision.

    HIGHEST (and the F32/F64 presets): the dtype's epsilon. 3xTF32: 2^-21.
    HIGH / DEFAULT may run as TF32 (GPU, 10-bit mantissa) or bfloat16 passes
    (TPU, 7-bit): HIGH 2^-10, anything else 2^-7. On CPU every setting is
    exact, so the bound is only conservative there.

    Args:
      precision: a canonical precision (:func:`canonical_precision`).
      dtype: the floating dtype of the product.

    Returns:
      The relative accuracy ``ε`` as a Python float.
    """
    eps = float(jnp.finfo(dtype).eps)
    preset = lax.DotAlgorithmPreset
    if precision in (lax.Precision.HIGHEST, preset.F32_F32_F32, preset.F64_F64_F64):
        return eps
    if precision == preset.TF32_TF32_F32_X3:
        return max(eps, 2.0**-21)
    if precision == lax.Precision.HIGH:
        return max(eps, 2.0**-10)
    return max(eps, 2.0**-7)


def coincident_rtol(d: int, dtype: Any, precision: Any = None) -> float:
    """``κ = (2d + 4) ε``: a Gram ``d² ≤ κ (|x̃_i|² + |x̃_j|²)`` has no correct digit.

    Args:
      d: the dimension.
      dtype: the floating dtype of the Gram product.
      precision: its precision (``None``: HIGHEST).

    Returns:
      ``κ`` as a Python float.
    """
    return (2 * d + 4) * precision_eps(canonical_precision(precision), dtype)


def max_shared_spread(dtype: Any) -> float:
    """Largest spread of a tile's log weights for one shift per tile.

    ``-log(tiny) - 20`` nats.

    Args:
      dtype: the floating dtype of the weights.

    Returns:
      The spread in nats, a Python float.
    """
    return -math.log(float(jnp.finfo(dtype).tiny)) - UNDERFLOW_MARGIN


class TileSpec(NamedTuple):
    """Static settings of :func:`tile_partial` (hashable: a jit static argument).

    Attributes:
      direct: exact-difference distances (else the Gram identity).
      kappa: coincidence factor of the Gram identity (:func:`coincident_rtol`).
      gram_precision: the precision of the Gram product.
      precision: the precision of the force product.
      max_spread: :func:`max_shared_spread` of the dtype.
    """

    direct: bool
    kappa: float
    gram_precision: Any
    precision: Any
    max_spread: float


def tile_spec(
    d: int,
    dtype: Any,
    *,
    distances: str | None = None,
    precision: Any = None,
    gram_precision: Any = None,
) -> TileSpec:
    """The :class:`TileSpec` for dimension ``d``.

    Args:
      d: the dimension.
      dtype: the floating dtype of the particles.
      distances: ``"direct"``, ``"gram"`` or None (direct for
        ``d <= DIRECT_MAX_D``).
      precision: the force product's precision (default HIGHEST).
      gram_precision: the Gram product's precision (default ``precision``).

    Returns:
      The :class:`TileSpec`.
    """
    precision = canonical_precision(precision)
    gram_precision = (
        precision if gram_precision is None else canonical_precision(gram_precision)
    )
    direct = d <= DIRECT_MAX_D if distances is None else distances == "direct"
    return TileSpec(
        direct,
        coincident_rtol(d, dtype, gram_precision),
        gram_precision,
        precision,
        max_shared_spread(dtype),
    )


# ------------------------------------------------------------------------ operands


class Prepared(NamedTuple):
    """Per-particle operands of the pair sums (O(N d)).

    A tile is a Prepared of some particles.

    Attributes:
      x: (n, d) centred positions ``x̃ = x - centre``, the far point
        ``F e_1`` on invalid rows (:func:`far_point`: farther than any
        radius from every valid particle, finite). A tile may hold them
        as d coordinate vectors ``(n,)`` instead (direct distances read one
        coordinate at a time; a kernel cannot slice a register tile).
      sq_x: (n,) ``|x̃|²`` (``F²`` on invalid rows).
      f: (n,) potential values, 0 on invalid rows.
      x1: (n, d+1) the lift ``[x̃, 1]``, 0 on invalid rows: the force operand.
      log_s: (n,) ``log α_d - log p``; ``NEG`` on invalid rows.
      thr_x: (n,) ``η²`` per row (no scalar enters a kernel).
      w: the same as ``x`` for ``w`` (``(n, d)``, the far point where ``w`` is
        not finite); None without w.
      sq_w: (n,) ``|w̃|²``; None without w.
      thr_w: (n,) ``R2²`` per row; None without w.
      valid: (n,) bool, all inputs finite.
      valid_w: (n,) bool, ``w`` finite.

    :func:`tile_partial` reads ``x, sq_x, f, thr_x`` (and ``w, sq_w,
    thr_w``) of the rows and ``x, sq_x, f, x1, log_s`` (and ``w, sq_w``) of the
    columns; the other fields of a tile may be None.
    """

    x: Any
    sq_x: Array
    f: Array
    x1: Array | None = None
    log_s: Array | None = None
    thr_x: Array | None = None
    w: Any = None
    sq_w: Array | None = None
    thr_w: Array | None = None
    valid: Array | None = None
    valid_w: Array | None = None


def far_point(dtype: Any) -> float:
    """``F = 2^(e/2 - 3)``, ``e`` the largest exponent of ``dtype``.

    An invalid particle sits at ``F e_1``. A power of two, so ``F²`` and
    ``F · F`` are exact in every precision of a product and two invalid
    particles are exactly coincident. Sums of ``F²`` with the squared norm of a
    particle within ``F/2`` of the centre do not overflow, and every such
    particle is farther than ``F/2`` from it.

    Args:
      dtype: the floating dtype.

    Returns:
      ``F`` as a Python float.
    """
    return 2.0 ** (jnp.finfo(dtype).maxexp // 2 - 3)


def far_rows(n: int, d: int, dtype: Any) -> Array:
    """(n, d) copies of the far point ``F e_1``.

    Args:
      n: the number of rows.
      d: the dimension.
      dtype: the floating dtype.

    Returns:
      An ``(n, d)`` array of ``dtype``.
    """
    return jnp.broadcast_to(
        jnp.where(jnp.arange(d) == 0, far_point(dtype), 0).astype(dtype), (n, d)
    )


# Values of an invalid (padding) particle, per Prepared field: finite, so that
# reverse mode never meets a NaN (x and w: the far point, far_rows).
_INVALID = dict(f=0, x1=0, log_s=NEG, thr_x=0, thr_w=0, valid=False, valid_w=False)


def validity(x: Array, f: Array, log_p: Array, w: Array | None) -> tuple[Array, Array]:
    """(valid, valid_w): rows with all inputs finite, rows with a finite ``w``.

    Args:
      x: positions, shape ``(n, d)``.
      f: potential values, shape ``(n,)``.
      log_p: proposal log densities, shape ``(n,)``.
      w: deterministic parts, shape ``(n, d)``, or ``None``.

    Returns:
      ``(valid, valid_w)``, two ``(n,)`` bool arrays (``valid_w`` all true
      without ``w``).
    """
    valid_w = (
        jnp.ones(x.shape[:1], bool) if w is None else jnp.all(jnp.isfinite(w), axis=-1)
    )
    valid = (
        jnp.all(jnp.isfinite(x), axis=-1)
        & jnp.isfinite(f)
        & jnp.isfinite(log_p)
        & valid_w
    )
    return valid, valid_w


def centre_terms(v: Array, ok: Array, count: Array) -> Array:
    """``Σ_{ok rows} v / count`` for ``v: (n, d)``.

    The mean of the ok rows when ``count`` is their number.

    The division sits inside the reduction on purpose: the centre must reach
    every consumer as one stored value. A centre computed as ``total /
    count`` is recomputed by XLA inside each fused consumer as ``x - total *
    (1/count)``, which LLVM contracts into an FMA in some code paths and not
    in others; the particle's coordinates then differ by an ulp between the
    rows and the columns of a tile, an error of ``ulp / |x_j - x_i|`` in
    every close pair.

    Args:
      v: the rows, shape ``(n, d)``.
      ok: which rows count, shape ``(n,)`` bool.
      count: the divisor, a scalar (the number of ok rows, at least 1).

    Returns:
      The ``(d,)`` centre.
    """
    return jnp.sum(jnp.where(ok[:, None], v / count, 0), axis=0)


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
) -> Prepared:
    """Centre and flag the per-particle inputs (O(n d)).

    The centre defaults to the mean of the valid particles (of the finite
    ``w`` for ``w``); a sharded caller passes the global centre.

    Args:
      x: positions, shape ``(n, d)``.
      f: potential values, shape ``(n,)``.
      log_p: proposal log densities, shape ``(n,)``.
      eta: the ball radius ``η``.
      w: deterministic parts, shape ``(n, d)``, or ``None``.
      r2: the R2 radius (with ``w``), or ``None``.
      centre_x: the centre of ``x``, shape ``(d,)``, or ``None`` (the mean).
      centre_w: the centre of ``w``, shape ``(d,)``, or ``None`` (the mean).

    Returns:
      The :class:`Prepared` operands of the ``n`` particles.
    """
    n, d = x.shape
    dtype = x.dtype
    valid, valid_w = validity(x, f, log_p, w)
    eta = jnp.asarray(eta, dtype)

    def centred(v, ok, centre):
        if centre is None:
            centre = centre_terms(v, ok, jnp.maximum(jnp.sum(ok, dtype=dtype), 1))
        vc = jnp.where(ok[:, None], v - centre, far_rows(n, d, dtype))
        # F² exactly on the far rows
        return vc, jnp.sum(vc * vc, axis=1)

    xc, sq_x = centred(x, valid, centre_x)
    prepared = Prepared(
        x=xc,
        sq_x=sq_x,
        f=jnp.where(valid, f, 0),
        x1=jnp.where(
            valid[:, None], jnp.concatenate([xc, jnp.ones((n, 1), dtype)], axis=1), 0
        ),
        log_s=jnp.where(valid, log_alpha_d(d, eta, dtype) - log_p, NEG),
        thr_x=jnp.full((n,), eta * eta),
        valid=valid,
        valid_w=valid_w,
    )
    if w is not None:
        wc, sq_w = centred(w, valid_w, centre_w)
        r2 = jnp.asarray(r2, dtype)
        prepared = prepared._replace(w=wc, sq_w=sq_w, thr_w=jnp.full((n,), r2 * r2))
    return prepared


def pad_particles(p: Prepared, n_pad: int) -> Prepared:
    """Append invalid particles up to ``n_pad`` rows.

    They add nothing and are no one's neighbour.

    Args:
      p: the :class:`Prepared` operands of ``n <= n_pad`` particles.
      n_pad: the number of rows wanted.

    Returns:
      A :class:`Prepared` of ``n_pad`` rows (the fields that are None stay None).
    """

    far = far_point(p.f.dtype)

    def pad(name, v):
        if v is None:
            return None
        if name in ("x", "w"):
            return jnp.concatenate(
                [v, far_rows(n_pad - v.shape[0], v.shape[1], v.dtype)]
            )
        fill = far * far if name in ("sq_x", "sq_w") else _INVALID[name]
        widths = [(0, n_pad - v.shape[0])] + [(0, 0)] * (v.ndim - 1)
        return jnp.pad(v, widths, constant_values=fill)

    return Prepared(*(pad(name, v) for name, v in zip(p._fields, p, strict=True)))


# --------------------------------------------------------------------------- monoid


class Partial(NamedTuple):
    """Pair sums of some rows over some columns, before the final rescale.

    Attributes:
      sums: (n, d+1) ``exp(-m_i) Σ_j W_ij [x̃_j, 1]`` over the columns seen
        (a kernel may carry zero lanes beyond d+1).
      m: (n,) the shift: ``NEG`` while the row has taken nothing.
      n_r2: (n,) int32 R2 counts over the columns seen, the diagonal included
        (:func:`finish` removes it).
      n_ball: (n,) int32 ball counts over the columns seen, the diagonal
        included.
    """

    sums: Array
    m: Array
    n_r2: Array
    n_ball: Array


def empty_partial(n: int, width: int, dtype: Any) -> Partial:
    """The partial over no columns: the identity of :func:`combine`.

    Args:
      n: the number of rows.
      width: the width of ``sums`` (``d + 1``, or more for a kernel's lanes).
      dtype: the floating dtype.

    Returns:
      The empty :class:`Partial`.
    """
    zeros = jnp.zeros((n,), jnp.int32)
    return Partial(
        jnp.zeros((n, width), dtype), jnp.full((n,), NEG, dtype), zeros, zeros
    )


def combine(a: Partial, b: Partial) -> Partial:
    """Merge partials over disjoint column sets.

    Rescale both to the larger shift and add.

    Args:
      a: a :class:`Partial` of some rows.
      b: a :class:`Partial` of the same rows over other columns.

    Returns:
      The :class:`Partial` over the columns of both.
    """
    m = jnp.maximum(a.m, b.m)
    sums = a.sums * jnp.exp(a.m - m)[:, None] + b.sums * jnp.exp(b.m - m)[:, None]
    return Partial(sums, m, a.n_r2 + b.n_r2, a.n_ball + b.n_ball)


def _coordinates(a: Any) -> list:
    """The coordinate vectors of a tile's positions."""
    return (
        list(a)
        if isinstance(a, (tuple, list))
        else [a[:, k] for k in range(a.shape[1])]
    )


def squared_distances(
    a_rows: Any, sq_rows: Array, a_cols: Any, sq_cols: Array, spec: TileSpec
) -> tuple[Array, Array]:
    """(rows, cols) squared distances and the coincidence mask (module docstring)."""
    if spec.direct:
        d2 = None
        for r, c in zip(_coordinates(a_rows), _coordinates(a_cols), strict=True):
            diff = c[None, :] - r[:, None]
            d2 = diff * diff if d2 is None else d2 + diff * diff
        return d2, d2 <= 0
    t = sq_rows[:, None] + sq_cols[None, :]
    gram = lax.dot_general(
        a_rows, a_cols, (((1,), (1,)), ((), ())), precision=spec.gram_precision
    )
    d2 = t - 2 * gram
    return d2, d2 <= spec.kappa * t


def _count(mask: Array) -> Array:
    # An int32 sum: XLA:CPU fuses it with the elementwise pass that makes the mask (a
    # float sum goes to a library reduction, which first writes the (B, C) mask out).
    return jnp.sum(mask.astype(jnp.int32), axis=1, dtype=jnp.int32)


def _count_both(a: Array, b: Array) -> tuple[Array, Array]:
    """The row counts of two ``(B, C)`` masks, by one int32 sum where they fit.

    ``a + K b`` with ``K`` the power of two above ``C`` holds both counts in one sum
    (``a``'s in the low bits): one pass over the pairs instead of two (about a fifth
    of a 32 x 32 tile's time on XLA:CPU). Exact while ``K (C + 1) < 2^31``; wider
    tiles take two sums.
    """
    shift = a.shape[1].bit_length()
    if (a.shape[1] + 1) << shift >= 2**31:
        return _count(a), _count(b)
    both = jnp.sum(
        a.astype(jnp.int32) + (b.astype(jnp.int32) << shift), axis=1, dtype=jnp.int32
    )
    return both & ((1 << shift) - 1), both >> shift


class ColumnWeights(NamedTuple):
    """What the overflow rule needs of a column tile (module docstring).

    Attributes:
      shared: () bool, the tile's log weights spread by at most ``max_spread``.
      top: () the largest log weight ``max_j log s_j``.
      lift: (C, d+1) ``exp(log s_j - top) [x̃_j, 1]``: the columns' force
        operand under the shared shift (an exp per column).
    """

    shared: Array
    top: Array
    lift: Array


def column_weights(cols: Prepared, spec: TileSpec) -> ColumnWeights:
    """The :class:`ColumnWeights` of a column tile.

    O(C d); computed once when the columns are fixed.

    Args:
      cols: the :class:`Prepared` column tile (C particles).
      spec: the :class:`TileSpec`.

    Returns:
      The tile's :class:`ColumnWeights`.
    """
    top = jnp.max(cols.log_s)
    low = jnp.min(jnp.where(cols.log_s > NEG, cols.log_s, top))
    return ColumnWeights(
        top - low <= spec.max_spread, top, jnp.exp(cols.log_s - top)[:, None] * cols.x1
    )


def tile_partial_with(
    rows: Prepared,
    cols: Prepared,
    weights: ColumnWeights,
    spec: TileSpec,
    one_shift: bool,
) -> Partial:
    """:func:`tile_partial` with the rule's decision made.

    The tile's shared shift, or a shift per row. For a caller that folds many
    row tiles against one column set and decides once (``weights.shared``)
    outside its loop.

    Args:
      rows: the :class:`Prepared` row tile (B particles).
      cols: the :class:`Prepared` column tile (C particles).
      weights: :func:`column_weights` of ``cols``.
      spec: the :class:`TileSpec`.
      one_shift: use the tile's shared shift (else a shift per row).

    Returns:
      The tile's :class:`Partial` over the ``B`` rows.
    """
    d2, coincident = squared_distances(rows.x, rows.sq_x, cols.x, cols.sq_x, spec)
    in_ball = d2 <= rows.thr_x[:, None]
    # counted (the diagonal among them)
    near = in_ball | coincident
    # summed: 1/|x_j - x_i|² needs a distance
    use = in_ball & ~coincident
    if rows.w is None:
        n_r2 = jnp.zeros(rows.f.shape, jnp.int32)
    else:
        dw2, w_coincident = squared_distances(
            rows.w, rows.sq_w, cols.w, cols.sq_w, spec
        )
        in_r2 = (dw2 <= rows.thr_w[:, None]) | w_coincident
        near, use = near & in_r2, use & in_r2
    # The "double where": an unused pair divides by 1, not by its d² (0 when coincident,
    # whose 0/0 would put 0 · NaN into the cotangents in reverse mode), then drops out.
    g = jnp.where(use, (cols.f[None, :] - rows.f[:, None]) / jnp.where(use, d2, 1), 0)
    if one_shift:  # an exp per column (in the weights)
        sums = jnp.dot(g, weights.lift, precision=spec.precision)
        m = jnp.full(g.shape[:1], weights.top)
    else:  # an exp per pair
        log_s = jnp.where(g != 0, cols.log_s[None, :], NEG)
        m = jnp.max(log_s, axis=1)
        sums = jnp.dot(
            g * jnp.exp(log_s - m[:, None]), cols.x1, precision=spec.precision
        )
    # took nothing: no shift
    m = jnp.where(jnp.max(jnp.abs(sums), axis=1) == 0, NEG, m)
    if rows.w is None:
        n_ball = _count(near)
    else:
        n_ball, n_r2 = _count_both(near, in_r2)
    return Partial(sums, m, n_r2, n_ball)


def tile_partial(
    rows: Prepared, cols: Prepared, spec: TileSpec, weights: ColumnWeights | None = None
) -> Partial:
    """The partial of one tile: ``rows`` (B particles) against ``cols`` (C particles).

    Pure ``jnp``/``lax`` on arrays: the XLA backend maps and scans it, the
    Pallas kernel calls it on the tiles it loaded. Temporaries are ``(B, C)``.
    ``weights``: :func:`column_weights` of ``cols`` if already computed. The
    overflow rule picks one of two versions of the whole tile, so that each
    fuses into one pass over the pairs.

    Args:
      rows: the :class:`Prepared` row tile (B particles).
      cols: the :class:`Prepared` column tile (C particles).
      spec: the :class:`TileSpec`.
      weights: :func:`column_weights` of ``cols``, or ``None`` (computed here).

    Returns:
      The tile's :class:`Partial` over the ``B`` rows.
    """
    weights = column_weights(cols, spec) if weights is None else weights
    one_shift = functools.partial(tile_partial_with, spec=spec, one_shift=True)
    row_shifts = functools.partial(tile_partial_with, spec=spec, one_shift=False)
    return lax.cond(weights.shared, one_shift, row_shifts, rows, cols, weights)


def tile_update(
    acc: Partial, rows: Prepared, cols: Prepared, spec: TileSpec
) -> Partial:
    """One fold step: ``combine(acc, tile_partial(rows, cols, spec))``.

    Args:
      acc: the :class:`Partial` of ``rows`` so far.
      rows: the :class:`Prepared` row tile.
      cols: the :class:`Prepared` column tile.
      spec: the :class:`TileSpec`.

    Returns:
      The :class:`Partial` of ``rows`` with ``cols`` added.
    """
    return combine(acc, tile_partial(rows, cols, spec))


def count_update(
    acc: Partial, rows: Prepared, cols: Prepared, spec: TileSpec
) -> Partial:
    """A fold step over a tile whose x-boxes are apart: only ``n_r2`` grows.

    A :func:`~.sparsity.tile_kinds` ``COUNT`` tile. No pair of such a tile is
    within η, so it adds nothing to the sums or to ``n_ball``; its R2 count is
    that of :func:`tile_partial` (the same distances and comparisons), at the
    cost of the w distances alone.

    Args:
      acc: the :class:`Partial` of ``rows`` so far.
      rows: the :class:`Prepared` row tile (with ``w``).
      cols: the :class:`Prepared` column tile (with ``w``).
      spec: the :class:`TileSpec`.

    Returns:
      ``acc`` with the tile's R2 counts added to ``n_r2``.
    """
    return acc._replace(n_r2=acc.n_r2 + r2_counts(rows, cols, spec))


def r2_counts(rows: Prepared, cols: Prepared, spec: TileSpec) -> Array:
    """``#{j in cols : |w_j - w_i| <= R2}`` per row, as :func:`tile_partial` counts.

    Args:
      rows: the :class:`Prepared` row tile (B particles, with ``w``).
      cols: the :class:`Prepared` column tile (with ``w``).
      spec: the :class:`TileSpec`.

    Returns:
      A ``(B,)`` int32 array.
    """
    dw2, w_coincident = squared_distances(rows.w, rows.sq_w, cols.w, cols.sq_w, spec)
    return _count((dw2 <= rows.thr_w[:, None]) | w_coincident)


def finish(p: Partial, rows: Prepared, n_total: int) -> PairwiseForce:
    """:class:`PairwiseForce` of ``rows`` from their partial over all particles.

    ``force_sum = exp(m) (Σ_j W_ij x̃_j - (Σ_j W_ij) x̃_i)``, with ``exp(m)``
    applied as ``exp(m/2)²`` and an exact 0 kept 0 (not ``0 · inf``); the
    diagonal, counted as coincident, is subtracted from the counts.

    Args:
      p: the :class:`Partial` of ``rows`` over all particles.
      rows: the :class:`Prepared` rows.
      n_total: the number of particles (``N``; ``n_r2 = N - 1`` without ``w``).

    Returns:
      The rows' :class:`PairwiseForce`.
    """
    d = rows.x.shape[1]
    # 0 on invalid rows (no pair used), dropped below
    total = p.sums[:, :d] - p.sums[:, d : d + 1] * rows.x
    half = jnp.exp(0.5 * p.m)[:, None]
    force = jnp.where((total == 0) | ~rows.valid[:, None], 0, total * half * half)
    n_ball = jnp.where(rows.valid, p.n_ball - 1, 0)
    if rows.w is None:
        n_r2 = jnp.full(p.m.shape, n_total - 1, jnp.int32)
    else:
        n_r2 = jnp.where(rows.valid_w, p.n_r2 - 1, 0)
    return PairwiseForce(force, n_r2, n_ball)
