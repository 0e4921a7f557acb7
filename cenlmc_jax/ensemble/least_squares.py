"""A local least-squares ensemble gradient (beyond the paper; the paper's estimator stays the default).

Ding & Li estimate ``∇f(x_i)`` from the neighbours in the η-ball by an
importance-weighted Monte Carlo integral (eq. 3.19-3.21,
:mod:`cenlmc_jax.pairwise`). This module fits the neighbours' values instead:
a kernel-weighted local regression, with no proposal density in it,

    ĝ_i = argmin_g Σ_{j≠i} k(|x_j - x_i|/η) (f_j - f_i - g·(x_j - x_i))²      (linear)

or, with ``quadratic=True``, the gradient part of the fit
``f_j - f_i ≈ g·δ + ½ δᵀ Q δ`` (``δ = x_j - x_i``). In the scaled offsets
``u = δ/η`` with features ``φ(u) = u`` (linear) or ``φ(u) = [u, u_k u_l
(k ≤ l)]`` (quadratic, ``p = d + d(d+1)/2`` of them) the fit is the normal
equations of the per-particle moments

    A_i = Σ_j k_ij φ φᵀ,   b_i = Σ_j k_ij δf φ,   c_i = Σ_j k_ij δf²,   m_i = Σ_j k_ij,

``θ_i = A_i⁻¹ b_i`` and ``ĝ_i = θ_i[:d] / η``. The moments are sums over the
columns j: a monoid (identity: zeros, combine: add, :func:`combine_moments`),
so a row tile folds them over column tiles exactly as the pair force folds its
:class:`~cenlmc_jax.pairwise.algebra.Partial` (:func:`least_squares_tiled`
never builds an ``N × N × d`` array; its temporaries are ``B × C × p``), and
:func:`least_squares_sparse` folds only the column tiles within ``η`` of the row
tile, the particles in the Hilbert order of the pair force's block-sparse plan
(:func:`~cenlmc_jax.pairwise.sparsity.spatial_order`): the same moments, summed
in another order. Not carried over from the pair force: its Pallas kernels and
its sharding over a mesh (the fit runs as XLA tiles on one device).

Kernels ``k(r)``: ``"uniform"`` ``1[r ≤ 1]`` (the paper's ball) and
``"epanechnikov"`` ``(1 - r²)₊`` (the default; far pairs, whose curvature
error is largest, weigh less).

Bias (no noise in ``f``, so the error is the fit's alone):

* exact (to rounding) on a linear ``f`` for any design with ``A`` invertible,
  and with ``quadratic=True`` on a quadratic ``f``;
* linear fit on ``f = g·x + ½ xᵀHx``: ``ĝ - g = (η/2) A⁻¹ Σ_j k_ij u (uᵀHu)``,
  zero for a design symmetric about ``x_i`` (odd moments vanish); for a design
  drawn from a smooth density the odd moment is itself ``O(η)``, so the bias
  is ``O(η²)``; on a cubic with a symmetric design it is
  ``(η²/6) A⁻¹ Σ_j k_ij u T[u,u,u]``, exactly ``O(η²)``.

When a particle uses it (:func:`solve_moments`): the design must be well
conditioned, ``λ_min(S_i) ≥ min_eig`` with ``S_i`` the gradient block's Schur
complement of ``A_i / m_i`` (``(A⁻¹)[:d,:d] = S⁻¹``, the block the gradient's
error goes through; ``S = A/m`` for the linear fit). On a full ball with the
uniform kernel it is ``1/(d+2)`` for both fits (odd moments vanish); it is
``0`` when the neighbours lie on a hyperplane through ``x_i``, or when ``A``
is singular to working precision, and the fit must explain the values,
``sqrt((c_i - b_iᵀθ_i)/m_i) / η ≤ max_residual`` (the rms misfit in units of
a gradient; off by default), with at least ``2p`` neighbours (so that the
residual has degrees of freedom: ``p`` neighbours are fitted exactly). A refused particle gets ``grad = 0`` and
``ok = False``: its caller takes the true gradient.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from cenlmc_jax._validation import check_bool, check_choice, check_int, check_nonnegative, check_positive
from cenlmc_jax.pairwise.sparsity import spatial_order
from cenlmc_jax.types import Array, ArrayLike

__all__ = [
    "KERNELS",
    "LSMoments",
    "LSGradient",
    "num_features",
    "empty_moments",
    "combine_moments",
    "tile_moments",
    "solve_moments",
    "least_squares_dense",
    "least_squares_tiled",
    "least_squares_sparse",
    "least_squares_gradient",
    "ESTIMATORS",
    "check_estimator",
    "least_squares_force",
]

KERNELS = ("epanechnikov", "uniform")
#: Default floor on the gradient block's ``λ_min`` (:func:`solve_moments`):
#: a fifth of a full uniform ball's ``1/(d+2)`` at d = 2.
DEFAULT_MIN_EIG = 0.05


class LSMoments(NamedTuple):
    """The accumulators of some rows over some columns (a monoid under :func:`combine_moments`).

    a: (n, p, p) ``Σ k φφᵀ``.  b: (n, p) ``Σ k δf φ``.  c: (n,) ``Σ k δf²``.
    mass: (n,) ``Σ k``.  count: (n,) int32 neighbours with ``k > 0``.
    """

    a: Array
    b: Array
    c: Array
    mass: Array
    count: Array


class LSGradient(NamedTuple):
    """grad: (N, d) ``ĝ`` (0 where refused).  ok: (N,) bool, the tests passed.

    cond: (N,) ``λ_min`` of the gradient block (:func:`solve_moments`).
    residual: (N,) ``sqrt(rss/m)/η``.  count: (N,) neighbours used.
    """

    grad: Array
    ok: Array
    cond: Array
    residual: Array
    count: Array


def num_features(d: int, quadratic: bool) -> int:
    """``p = d`` (linear) or ``d + d(d+1)/2`` (quadratic)."""
    return d + (d * (d + 1) // 2 if quadratic else 0)


def empty_moments(n: int, p: int, dtype) -> LSMoments:
    """The moments over no columns: the identity of :func:`combine_moments`."""
    z = jnp.zeros((n,), dtype)
    return LSMoments(jnp.zeros((n, p, p), dtype), jnp.zeros((n, p), dtype), z, z, jnp.zeros((n,), jnp.int32))


def combine_moments(s: LSMoments, t: LSMoments) -> LSMoments:
    """Moments over disjoint column sets add."""
    return LSMoments(*(u + v for u, v in zip(s, t, strict=True)))


def _features(u: Array, quadratic: bool) -> Array:
    """``φ(u)``: ``u`` and, with ``quadratic``, ``u_k u_l`` for ``k ≤ l`` (last axis)."""
    if not quadratic:
        return u
    d = u.shape[-1]
    quad = [u[..., k] * u[..., m] for k in range(d) for m in range(k, d)]
    return jnp.concatenate([u, jnp.stack(quad, axis=-1)], axis=-1)


def _kernel(r2: Array, kernel: str) -> Array:
    """``k`` as a function of ``r² = |u|²`` (0 outside the unit ball)."""
    inside = r2 <= 1
    return jnp.where(inside, 1 - r2 if kernel == "epanechnikov" else 1, 0).astype(r2.dtype)


def tile_moments(xr: Array, fr: Array, vr: Array, xc: Array, fc: Array, vc: Array, eta: Array, *,
                 kernel: str, quadratic: bool) -> LSMoments:
    """The moments of rows ``(B, d)`` against columns ``(C, d)`` (``v*``: validity; temporaries ``B × C × p``)."""
    u = (xc[None, :, :] - xr[:, None, :]) / eta  # [i, j] = (x_j - x_i)/η
    r2 = jnp.sum(u * u, axis=-1)
    use = vr[:, None] & vc[None, :] & (r2 > 0)
    k = jnp.where(use, _kernel(r2, kernel), 0)
    df = jnp.where(use, fc[None, :] - fr[:, None], 0)
    phi = _features(u, quadratic)
    kphi = k[..., None] * phi
    hi = lax.Precision.HIGHEST
    a = jnp.einsum("bcp,bcq->bpq", kphi, phi, precision=hi)
    b = jnp.einsum("bcp,bc->bp", kphi, df, precision=hi)
    count = jnp.sum(k > 0, axis=1, dtype=jnp.int32)
    return LSMoments(a, b, jnp.sum(k * df * df, axis=1), jnp.sum(k, axis=1), count)


def _gradient_conditioning(scaled: Array, d: int) -> Array:
    """``λ_min`` of the gradient block's Schur complement ``S = A_gg - A_gq A_qq⁻¹ A_qg`` of ``A/m``.

    ``S⁻¹ = (A⁻¹)[:d, :d]`` is the block the gradient's error goes through; for
    the linear fit ``S = A/m``. 0 where ``A/m`` is singular to working precision
    (smallest eigenvalue below ``100 p ε`` of the largest).
    """
    p = scaled.shape[-1]
    eig = jnp.linalg.eigvalsh(scaled)
    full = eig[:, 0] > 100 * p * jnp.finfo(scaled.dtype).eps * eig[:, -1]
    if p == d:
        return jnp.where(full, eig[:, 0], 0)
    safe = jnp.where(full[:, None, None], scaled, jnp.eye(p, dtype=scaled.dtype))
    agq, aqq = safe[:, :d, d:], safe[:, d:, d:]
    schur = safe[:, :d, :d] - agq @ jnp.linalg.solve(aqq, jnp.swapaxes(agq, 1, 2))
    return jnp.where(full, jnp.linalg.eigvalsh(schur)[:, 0], 0)


def solve_moments(mo: LSMoments, eta: Array, d: int, min_eig: ArrayLike, max_residual: ArrayLike) -> LSGradient:
    """``θ = A⁻¹b``, ``ĝ = θ[:d]/η`` and the two tests (module docstring)."""
    dtype = mo.b.dtype
    p = mo.b.shape[-1]
    mass = jnp.where(mo.mass > 0, mo.mass, 1)
    scaled = mo.a / mass[:, None, None]
    cond = lax.stop_gradient(_gradient_conditioning(scaled, d))
    well = (mo.count >= 2 * p) & (cond >= jnp.asarray(min_eig, dtype))
    eye = jnp.eye(p, dtype=dtype)
    theta = jnp.linalg.solve(jnp.where(well[:, None, None], scaled, eye), (mo.b / mass[:, None])[..., None])[..., 0]
    rss = jnp.maximum(mo.c / mass - jnp.sum(theta * mo.b / mass[:, None], axis=-1), 0)
    residual = lax.stop_gradient(jnp.sqrt(rss) / eta)
    ok = well & (residual <= jnp.asarray(max_residual, dtype))
    grad = jnp.where(ok[:, None], theta[:, :d] / eta, 0)
    return LSGradient(grad, ok, jnp.where(mo.count > 0, cond, 0), jnp.where(well, residual, jnp.inf), mo.count)


def _prepare(x: Array, f: Array) -> tuple[Array, Array, Array]:
    valid = jnp.all(jnp.isfinite(x), axis=-1) & jnp.isfinite(f)
    return jnp.where(valid[:, None], x, 0), jnp.where(valid, f, 0), valid


@functools.partial(jax.jit, static_argnames=("kernel", "quadratic"))
def _dense(x, f, eta, min_eig, max_residual, *, kernel, quadratic):
    x, f, valid = _prepare(x, f)
    mo = tile_moments(x, f, valid, x, f, valid, eta, kernel=kernel, quadratic=quadratic)
    return solve_moments(mo, eta, x.shape[1], min_eig, max_residual)


@functools.partial(jax.jit, static_argnames=("kernel", "quadratic", "block_size"))
def _tiled(x, f, eta, min_eig, max_residual, *, kernel, quadratic, block_size):
    n, d = x.shape
    x, f, valid = _prepare(x, f)
    nb = -(-n // block_size)
    pad = nb * block_size - n
    xs = jnp.pad(x, ((0, pad), (0, 0))).reshape(nb, block_size, d)
    fs = jnp.pad(f, (0, pad)).reshape(nb, block_size)
    vs = jnp.pad(valid, (0, pad)).reshape(nb, block_size)  # padding: invalid, no one's neighbour
    p = num_features(d, quadratic)

    def row_tile(rows):
        xr, fr, vr = rows

        def step(acc, cols):
            part = tile_moments(xr, fr, vr, *cols, eta, kernel=kernel, quadratic=quadratic)
            return combine_moments(acc, part), None

        acc, _ = lax.scan(step, empty_moments(block_size, p, x.dtype), (xs, fs, vs))
        return acc

    mo = lax.map(row_tile, (xs, fs, vs))
    mo = LSMoments(*(v.reshape((nb * block_size,) + v.shape[2:])[:n] for v in mo))
    return solve_moments(mo, eta, d, min_eig, max_residual)


def _tile_boxes(xs: Array, vs: Array) -> tuple[Array, Array]:
    """Per tile ``(nb, B, d)``: the box ``(lo, hi)`` of its valid rows, ``(nb, d)`` each (``±inf`` if none)."""
    lo = jnp.min(jnp.where(vs[..., None], xs, jnp.inf), axis=1)
    hi = jnp.max(jnp.where(vs[..., None], xs, -jnp.inf), axis=1)
    return lo, hi


@functools.partial(jax.jit, static_argnames=("kernel", "quadratic", "block_size"))
def _sparse(x, f, eta, min_eig, max_residual, *, kernel, quadratic, block_size):
    """:func:`_tiled` over the tile pairs whose boxes are within ``η``, the particles in Hilbert order.

    The order (:func:`~cenlmc_jax.pairwise.sparsity.spatial_order`) makes a tile of consecutive
    particles a compact cloud; a column tile whose box is farther than ``η`` from the row tile's
    box holds no pair with ``k > 0`` and is skipped (a ``lax.cond``), with a margin for rounding,
    so the moments are the dense ones summed in another order.
    """
    n, d = x.shape
    x, f, valid = _prepare(x, f)
    perm = spatial_order(x, valid)
    x, f, valid = x[perm], f[perm], valid[perm]
    nb = -(-n // block_size)
    pad = nb * block_size - n
    xs = jnp.pad(x, ((0, pad), (0, 0))).reshape(nb, block_size, d)
    fs = jnp.pad(f, (0, pad)).reshape(nb, block_size)
    vs = jnp.pad(valid, (0, pad)).reshape(nb, block_size)
    lo, hi = _tile_boxes(xs, vs)
    p = num_features(d, quadratic)
    margin = 1 + 16 * (d + 4) * float(jnp.finfo(x.dtype).eps)  # the gap, and |u|² = |δ/η|², each within (d+4)ε

    def row_tile(rows):
        xr, fr, vr, lo_r, hi_r = rows

        def step(acc, cols):
            xc, fc, vc, lo_c, hi_c = cols
            gap = jnp.maximum(jnp.maximum(lo_c - hi_r, lo_r - hi_c), 0)
            near = jnp.sum(gap * gap) <= eta * eta * margin  # an empty tile's gap is inf: skipped
            part = lax.cond(near, lambda: tile_moments(xr, fr, vr, xc, fc, vc, eta, kernel=kernel,
                                                       quadratic=quadratic),
                            lambda: empty_moments(block_size, p, x.dtype))
            return combine_moments(acc, part), near

        acc, near = lax.scan(step, empty_moments(block_size, p, x.dtype), (xs, fs, vs, lo, hi))
        return acc, jnp.sum(near, dtype=jnp.int32)

    mo, visited = lax.map(row_tile, (xs, fs, vs, lo, hi))
    mo = LSMoments(*(v.reshape((nb * block_size,) + v.shape[2:])[:n] for v in mo))
    out = solve_moments(mo, eta, d, min_eig, max_residual)
    back = LSGradient(*(jnp.zeros_like(a).at[perm].set(a) for a in out))
    return back, jnp.sum(visited) / (nb * nb)


def _check(x, f, eta, kernel, quadratic, min_eig, max_residual):
    x = x if isinstance(x, jax.Array) else jnp.asarray(x)
    if x.ndim != 2 or x.shape[0] < 1 or x.shape[1] < 1:
        raise ValueError(f"x must be an array of shape (N, d) with N, d >= 1; got shape {tuple(x.shape)}.")
    f = f if isinstance(f, jax.Array) else jnp.asarray(f)
    if f.shape != x.shape[:1]:
        raise ValueError(f"f must have shape (N,) = ({x.shape[0]},) to match x; got shape {tuple(f.shape)}.")
    check_positive(eta, "eta")
    check_choice(kernel, "kernel", KERNELS)
    check_bool(quadratic, "quadratic")
    check_nonnegative(min_eig, "min_eig")
    check_nonnegative(max_residual, "max_residual", allow_inf=True)
    dtype = jnp.promote_types(jnp.result_type(x.dtype, f.dtype), jnp.float32)
    if not jnp.issubdtype(dtype, jnp.floating):
        dtype = jnp.result_type(float)
    return x.astype(dtype), f.astype(dtype), dtype


def _scalars(dtype, eta, min_eig, max_residual):
    return tuple(jnp.asarray(v, dtype) for v in (eta, min_eig, max_residual))


def least_squares_dense(x: ArrayLike, f: ArrayLike, eta: ArrayLike, *, quadratic: bool = False,
                        kernel: str = "epanechnikov", min_eig: ArrayLike = DEFAULT_MIN_EIG,
                        max_residual: ArrayLike = math.inf) -> LSGradient:
    """The estimator with all ``N × N`` pairs at once (``N × N × p`` temporaries): the reference."""
    x, f, dtype = _check(x, f, eta, kernel, quadratic, min_eig, max_residual)
    return _dense(x, f, *_scalars(dtype, eta, min_eig, max_residual), kernel=kernel, quadratic=quadratic)


def least_squares_tiled(x: ArrayLike, f: ArrayLike, eta: ArrayLike, *, quadratic: bool = False,
                        kernel: str = "epanechnikov", min_eig: ArrayLike = DEFAULT_MIN_EIG,
                        max_residual: ArrayLike = math.inf, block_size: int = 128) -> LSGradient:
    """The estimator by row tiles of ``block_size`` folding the moments over column tiles (``O(B² p)`` scratch)."""
    x, f, dtype = _check(x, f, eta, kernel, quadratic, min_eig, max_residual)
    block_size = min(check_int(block_size, "block_size", minimum=1), x.shape[0])
    return _tiled(x, f, *_scalars(dtype, eta, min_eig, max_residual), kernel=kernel, quadratic=quadratic,
                  block_size=block_size)


def least_squares_sparse(x: ArrayLike, f: ArrayLike, eta: ArrayLike, *, quadratic: bool = False,
                         kernel: str = "epanechnikov", min_eig: ArrayLike = DEFAULT_MIN_EIG,
                         max_residual: ArrayLike = math.inf, block_size: int = 32,
                         return_visited: bool = False):
    """The estimator by row tiles against the column tiles within ``η`` only (particles in Hilbert order).

    Equal to :func:`least_squares_dense` up to the order of the sums. ``return_visited``: also the
    fraction of tile pairs folded (the rest were skipped).
    """
    x, f, dtype = _check(x, f, eta, kernel, quadratic, min_eig, max_residual)
    check_bool(return_visited, "return_visited")
    block_size = min(check_int(block_size, "block_size", minimum=1), x.shape[0])
    out, visited = _sparse(x, f, *_scalars(dtype, eta, min_eig, max_residual), kernel=kernel, quadratic=quadratic,
                           block_size=block_size)
    return (out, visited) if return_visited else out


#: ``method="auto"``: dense up to this N, then block-sparse tiles for d <= this, dense tiles above
#: (benchmarks/results/least_squares_sparse.md)
LS_DENSE_MAX_N = 64
LS_SPARSE_MAX_D = 3


def least_squares_gradient(x: ArrayLike, f: ArrayLike, eta: ArrayLike, *, quadratic: bool = False,
                           kernel: str = "epanechnikov", min_eig: ArrayLike = DEFAULT_MIN_EIG,
                           max_residual: ArrayLike = math.inf, method: str = "auto",
                           block_size: int | None = None) -> LSGradient:
    """The local least-squares gradient of ``f`` at every particle (module docstring).

    Args:
      x: (N, d) particles.  f: (N,) potential values ``f = -log density`` (any constant).
      eta: the ball radius ``η > 0`` (may be traced).
      quadratic: fit the quadratic term too (exact on quadratic ``f``; ``p = d + d(d+1)/2`` unknowns).
      kernel: ``"epanechnikov"`` (default) or ``"uniform"``.
      min_eig: the conditioning floor on ``λ_min(A/m)`` (default :data:`DEFAULT_MIN_EIG`).
      max_residual: the ceiling on the rms misfit over η (default inf: no residual test).
      method: ``"dense"``, ``"tiled"``, ``"sparse"`` (block-sparse tiles: only the tile pairs within
        η, the particles in Hilbert order) or ``"auto"`` (dense for N ≤ :data:`LS_DENSE_MAX_N`, then
        sparse for d ≤ :data:`LS_SPARSE_MAX_D`, tiled above).
      block_size: rows (and columns) per tile of ``"tiled"`` (default 128) and ``"sparse"`` (default 32:
        small tiles skip more pairs; benchmarks/results/least_squares_sparse.md).

    Returns :class:`LSGradient` in the promoted floating dtype (float64 in, float64 out).
    Jittable and vmappable; ``ValueError`` for a bad argument, before tracing.
    """
    check_choice(method, "method", ("auto", "dense", "tiled", "sparse"))
    n, d = jnp.shape(x) if jnp.ndim(x) == 2 else (0, 0)
    if method == "auto":
        method = "dense" if 0 < n <= LS_DENSE_MAX_N else "sparse" if d <= LS_SPARSE_MAX_D else "tiled"
    if method == "dense":
        return least_squares_dense(x, f, eta, quadratic=quadratic, kernel=kernel, min_eig=min_eig,
                                   max_residual=max_residual)
    if method == "sparse":
        return least_squares_sparse(x, f, eta, quadratic=quadratic, kernel=kernel, min_eig=min_eig,
                                    max_residual=max_residual, block_size=32 if block_size is None else block_size)
    return least_squares_tiled(x, f, eta, quadratic=quadratic, kernel=kernel, min_eig=min_eig,
                               max_residual=max_residual, block_size=128 if block_size is None else block_size)


#: The ``estimator`` choices of :func:`cenlmc_jax.cenlmc_step`: the paper's (default) and the fits here.
ESTIMATORS = ("paper", "least_squares", "least_squares_quadratic")


def check_estimator(estimator: str) -> str:
    """``estimator`` must be one of :data:`ESTIMATORS` (Python, before tracing)."""
    return check_choice(estimator, "estimator", ESTIMATORS)


def least_squares_force(x: Array, f: Array, eta: ArrayLike, need: Array, estimator: str) -> tuple[Array, Array]:
    """CEnLMC's ensemble force by the fit (beyond the paper): ``(ĝ, need | ~ok)``.

    A particle the fit refuses (:func:`solve_moments`) joins those that take
    their true gradient; the paper's R1 / M_f / N* tests stay as they were (``need``).
    """
    res = least_squares_gradient(x, f, jnp.asarray(eta, x.dtype), quadratic=estimator == "least_squares_quadratic")
    return res.grad, need | ~res.ok
