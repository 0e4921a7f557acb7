"""A local least-squares ensemble gradient (beyond the paper).

The paper's estimator stays the default.

Ding & Li estimate ``∇f(x_i)`` from the neighbours in the η-ball by an
importance-weighted Monte Carlo integral (eq. 3.19-3.21,
:mod:`cenlmc_jax.pairwise`). This module fits the neighbours' values instead:
a kernel-weighted local regression, with no proposal density in it::

    ĝ_i = argmin_g Σ_{j≠i} k(|x_j - x_i|/η) (f_j - f_i - g·(x_j - x_i))²  (linear)

or, with ``quadratic=True``, the gradient part of the fit
``f_j - f_i ≈ g·δ + ½ δᵀ Q δ`` (``δ = x_j - x_i``). In the scaled offsets
``u = δ/η`` with features ``φ(u) = u`` (linear) or
``φ(u) = [u, u_k u_l (k ≤ l)]`` (quadratic, ``p = d + d(d+1)/2`` of them) the
fit is the normal equations of the per-particle moments::

    A_i = Σ_j k_ij φ φᵀ,   b_i = Σ_j k_ij δf φ,   c_i = Σ_j k_ij δf²,
    m_i = Σ_j k_ij,

``θ_i = A_i⁻¹ b_i`` and ``ĝ_i = θ_i[:d] / η``. The moments are sums over the
columns j: a monoid (identity: zeros, combine: add, :func:`combine_moments`),
so a row tile folds them over column tiles exactly as the pair force folds its
:class:`~cenlmc_jax.pairwise.algebra.Partial` (:func:`least_squares_tiled`
never builds an ``N × N × d`` array; its temporaries are ``B × C × p``), and
:func:`least_squares_sparse` folds only the column tiles within ``η`` of the
row tile, the particles in the Hilbert order of the pair force's block-sparse
plan (:func:`~cenlmc_jax.pairwise.sparsity.spatial_order`): the same moments,
summed in another order. The other backends of the pair force carry over too:
``method="pallas"`` folds them in one fused kernel (:mod:`.pallas`, Triton on
GPU; all pairs, no tile list), and ``mesh=`` splits the row tiles of the tiled
or block-sparse fold over a 1-D device mesh, every device folding its rows
against all the columns in the single device's order (bit for bit the
single-device result; tests/ensemble/test_least_squares_backends.py).
CEnLMC's step passes its ``EnsembleOptions.method`` (``"pallas"``) and
``mesh`` on to the fit. The moments and their solve are in :mod:`.moments`,
below every backend.

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
residual has degrees of freedom: ``p`` neighbours are fitted exactly). A
refused particle gets ``grad = 0`` and ``ok = False``: its caller takes the
true gradient.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from cenlmc_jax._validation import check_bool, check_choice, check_int
from cenlmc_jax.ensemble.least_squares.moments import (
    DEFAULT_MIN_EIG,
    KERNELS,
    LSGradient,
    LSMoments,
    check_inputs,
    combine_moments,
    empty_moments,
    num_features,
    prepare,
    scalars,
    solve_moments,
    tile_moments,
)
from cenlmc_jax.ensemble.least_squares.pallas import least_squares_pallas
from cenlmc_jax.pairwise.sharded import particle_axis
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


@functools.partial(jax.jit, static_argnames=("kernel", "quadratic"))
def _dense(x, f, eta, min_eig, max_residual, *, kernel, quadratic):
    x, f, valid = prepare(x, f)
    mo = tile_moments(x, f, valid, x, f, valid, eta, kernel=kernel, quadratic=quadratic)
    return solve_moments(mo, eta, x.shape[1], min_eig, max_residual)


def _tiles(x: Array, f: Array, valid: Array, block_size: int) -> tuple[Array, ...]:
    """``(xs (nb, B, d), fs (nb, B), vs (nb, B), lo (nb, d), hi (nb, d))``: tiles of
    ``block_size`` rows (padding: invalid, no one's neighbour) and each tile's box of
    valid rows (``±inf`` if none).
    """
    n, d = x.shape
    nb = -(-n // block_size)
    pad = nb * block_size - n
    xs = jnp.pad(x, ((0, pad), (0, 0))).reshape(nb, block_size, d)
    fs = jnp.pad(f, (0, pad)).reshape(nb, block_size)
    vs = jnp.pad(valid, (0, pad)).reshape(nb, block_size)
    lo = jnp.min(jnp.where(vs[..., None], xs, jnp.inf), axis=1)
    hi = jnp.max(jnp.where(vs[..., None], xs, -jnp.inf), axis=1)
    return xs, fs, vs, lo, hi


def _fold(rows, cols, eta, *, kernel: str, quadratic: bool, skip_far: bool):
    """The moments of the row tiles against every column tile: ``(LSMoments (nr, B,
    ...), visited (nr,))``.

    ``skip_far``: a column tile whose box is farther than ``η`` from the row tile's box
    holds no pair with ``k > 0`` and is skipped (a ``lax.cond``), with a margin for
    rounding, so the moments are the dense ones summed in another order (the
    block-sparse plan; useful in a spatial order).
    """
    xs = cols[0]
    block, d = xs.shape[1], xs.shape[2]
    p = num_features(d, quadratic)
    margin = 1 + 16 * (d + 4) * float(
        jnp.finfo(xs.dtype).eps
    )  # the gap, and |u|² = |δ/η|², each within (d+4)ε

    def row_tile(row):
        xr, fr, vr, lo_r, hi_r = row

        def step(acc, col):
            xc, fc, vc, lo_c, hi_c = col

            def moments():
                return tile_moments(
                    xr, fr, vr, xc, fc, vc, eta, kernel=kernel, quadratic=quadratic
                )

            if not skip_far:
                return combine_moments(acc, moments()), jnp.ones((), bool)
            gap = jnp.maximum(jnp.maximum(lo_c - hi_r, lo_r - hi_c), 0)
            near = (
                jnp.sum(gap * gap) <= eta * eta * margin
            )  # an empty tile's gap is inf: skipped
            part = lax.cond(near, moments, lambda: empty_moments(block, p, xs.dtype))
            return combine_moments(acc, part), near

        acc, near = lax.scan(step, empty_moments(block, p, xs.dtype), cols)
        return acc, jnp.sum(near, dtype=jnp.int32)

    return lax.map(row_tile, rows)


def _fold_over(tiles, eta, mesh, **kw):
    """:func:`_fold` of all row tiles, on one device or split over the 1-D ``mesh``.

    The split is a ``jax.shard_map``.
    With a mesh each device folds its run of row tiles against all the column tiles
    (replicated: ``(d + 2) N`` numbers, as the pair force's all-gather); the row tiles
    are padded with invalid ones to a multiple of the device count. The per-row solve
    after it stays on the rows' device.
    """
    if mesh is None:
        return _fold(tiles, tiles, eta, **kw)
    axis = particle_axis(mesh)
    num = int(mesh.shape[axis])
    nb = tiles[0].shape[0]
    extra = -(-nb // num) * num - nb
    fills = (
        0,
        0,
        False,
        jnp.inf,
        -jnp.inf,
    )  # invalid tiles with empty boxes: nothing, skipped
    rows = tuple(
        jnp.concatenate([t, jnp.full((extra,) + t.shape[1:], v, t.dtype)])
        for t, v in zip(tiles, fills, strict=True)
    )
    fold = jax.shard_map(
        lambda r, c: _fold(r, c, eta, **kw),
        mesh=mesh,
        in_specs=(P(axis), P()),
        out_specs=P(axis),
        check_vma=False,
    )
    mo, visited = fold(rows, tiles)
    return LSMoments(*(v[:nb] for v in mo)), visited[:nb]


@functools.partial(
    jax.jit, static_argnames=("kernel", "quadratic", "block_size", "sparse", "mesh")
)
def _folded(
    x, f, eta, min_eig, max_residual, *, kernel, quadratic, block_size, sparse, mesh
):
    """Row tiles folding the moments over column tiles; ``sparse``: the particles in
    Hilbert order (:func:`~cenlmc_jax.pairwise.sparsity.spatial_order`, so that a tile
    of consecutive particles is a compact cloud) and the far tile pairs skipped. Returns
    ``(LSGradient, visited fraction)``.
    """
    n, d = x.shape
    x, f, valid = prepare(x, f)
    if sparse:
        perm = spatial_order(x, valid)
        x, f, valid = x[perm], f[perm], valid[perm]
    tiles = _tiles(x, f, valid, block_size)
    mo, visited = _fold_over(
        tiles, eta, mesh, kernel=kernel, quadratic=quadratic, skip_far=sparse
    )
    mo = LSMoments(*(v.reshape((-1,) + v.shape[2:])[:n] for v in mo))
    out = solve_moments(mo, eta, d, min_eig, max_residual)
    if sparse:
        out = LSGradient(*(jnp.zeros_like(a).at[perm].set(a) for a in out))
    nb = tiles[0].shape[0]
    return out, jnp.sum(visited) / (nb * nb)


def least_squares_dense(
    x: ArrayLike,
    f: ArrayLike,
    eta: ArrayLike,
    *,
    quadratic: bool = False,
    kernel: str = "epanechnikov",
    min_eig: ArrayLike = DEFAULT_MIN_EIG,
    max_residual: ArrayLike = math.inf,
) -> LSGradient:
    """The estimator with all ``N × N`` pairs at once (``N × N × p`` temporaries).

    The reference.

    Args:
      x: ``(N, d)`` particles.
      f: ``(N,)`` potential values.
      eta: the ball radius ``η > 0``.
      quadratic: as for :func:`least_squares_gradient`.
      kernel: as for :func:`least_squares_gradient`.
      min_eig: as for :func:`least_squares_gradient`.
      max_residual: as for :func:`least_squares_gradient`.

    Returns:
      An :class:`LSGradient`.

    Raises:
      ValueError: a bad argument, before tracing.
    """
    x, f, dtype = check_inputs(x, f, eta, kernel, quadratic, min_eig, max_residual)
    return _dense(
        x,
        f,
        *scalars(dtype, eta, min_eig, max_residual),
        kernel=kernel,
        quadratic=quadratic,
    )


def least_squares_tiled(
    x: ArrayLike,
    f: ArrayLike,
    eta: ArrayLike,
    *,
    quadratic: bool = False,
    kernel: str = "epanechnikov",
    min_eig: ArrayLike = DEFAULT_MIN_EIG,
    max_residual: ArrayLike = math.inf,
    block_size: int = 128,
    mesh=None,
) -> LSGradient:
    """The estimator by row tiles folding the moments over column tiles.

    Tiles of ``block_size`` rows; ``O(B² p)`` scratch.

    Args:
      x: ``(N, d)`` particles.
      f: ``(N,)`` potential values.
      eta: the ball radius ``η > 0``.
      quadratic: as for :func:`least_squares_gradient`.
      kernel: as for :func:`least_squares_gradient`.
      min_eig: as for :func:`least_squares_gradient`.
      max_residual: as for :func:`least_squares_gradient`.
      block_size: rows (and columns) per tile, ``>= 1`` (at most N).
      mesh: a 1-D device mesh; each device folds its share of the row tiles
        (:func:`_fold_over`).

    Returns:
      An :class:`LSGradient`.

    Raises:
      ValueError: a bad argument, before tracing.
    """
    x, f, dtype = check_inputs(x, f, eta, kernel, quadratic, min_eig, max_residual)
    block_size = min(check_int(block_size, "block_size", minimum=1), x.shape[0])
    return _folded(
        x,
        f,
        *scalars(dtype, eta, min_eig, max_residual),
        kernel=kernel,
        quadratic=quadratic,
        block_size=block_size,
        sparse=False,
        mesh=check_mesh(mesh),
    )[0]


def least_squares_sparse(
    x: ArrayLike,
    f: ArrayLike,
    eta: ArrayLike,
    *,
    quadratic: bool = False,
    kernel: str = "epanechnikov",
    min_eig: ArrayLike = DEFAULT_MIN_EIG,
    max_residual: ArrayLike = math.inf,
    block_size: int = 32,
    return_visited: bool = False,
    mesh=None,
):
    """The estimator by row tiles against the column tiles within ``η`` only.

    The particles in Hilbert order. Equal to :func:`least_squares_dense` up to the
    order of the sums.

    Args:
      x: ``(N, d)`` particles.
      f: ``(N,)`` potential values.
      eta: the ball radius ``η > 0``.
      quadratic: as for :func:`least_squares_gradient`.
      kernel: as for :func:`least_squares_gradient`.
      min_eig: as for :func:`least_squares_gradient`.
      max_residual: as for :func:`least_squares_gradient`.
      block_size: rows (and columns) per tile, ``>= 1`` (at most N).
      return_visited: also return the fraction of tile pairs folded (the rest
        were skipped).
      mesh: as :func:`least_squares_tiled`.

    Returns:
      An :class:`LSGradient`; with ``return_visited``, ``(LSGradient, fraction)``.

    Raises:
      ValueError: a bad argument, before tracing.
    """
    x, f, dtype = check_inputs(x, f, eta, kernel, quadratic, min_eig, max_residual)
    check_bool(return_visited, "return_visited")
    block_size = min(check_int(block_size, "block_size", minimum=1), x.shape[0])
    out, visited = _folded(
        x,
        f,
        *scalars(dtype, eta, min_eig, max_residual),
        kernel=kernel,
        quadratic=quadratic,
        block_size=block_size,
        sparse=True,
        mesh=check_mesh(mesh),
    )
    return (out, visited) if return_visited else out


#: ``method="auto"``: dense up to this N, then block-sparse tiles for d <= this, dense
#: tiles above (benchmarks/results/least_squares_sparse.md)
LS_DENSE_MAX_N = 64
LS_SPARSE_MAX_D = 3


def check_mesh(mesh):
    """Checks for None, or a device mesh with one particle axis.

    Raises ``ValueError`` otherwise; returns ``mesh``.
    """
    if mesh is not None:
        if not isinstance(mesh, Mesh):
            raise ValueError(
                "mesh must be a jax.sharding.Mesh with one particle axis, or None; "
                f"got {mesh!r}."
            )
        particle_axis(mesh)
    return mesh


def least_squares_gradient(
    x: ArrayLike,
    f: ArrayLike,
    eta: ArrayLike,
    *,
    quadratic: bool = False,
    kernel: str = "epanechnikov",
    min_eig: ArrayLike = DEFAULT_MIN_EIG,
    max_residual: ArrayLike = math.inf,
    method: str = "auto",
    block_size: int | None = None,
    mesh=None,
    interpret: bool | None = None,
) -> LSGradient:
    """The local least-squares gradient of ``f`` at every particle (module docstring).

    Jittable and vmappable.

    Args:
      x: ``(N, d)`` particles.
      f: ``(N,)`` potential values ``f = -log density`` (any constant).
      eta: the ball radius ``η > 0`` (may be traced).
      quadratic: fit the quadratic term too (exact on quadratic ``f``;
        ``p = d + d(d+1)/2`` unknowns).
      kernel: ``"epanechnikov"`` (default) or ``"uniform"``.
      min_eig: the conditioning floor on ``λ_min(A/m)`` (default
        :data:`DEFAULT_MIN_EIG`).
      max_residual: the ceiling on the rms misfit over η (default inf: no
        residual test).
      method: ``"dense"``, ``"tiled"``, ``"sparse"`` (block-sparse tiles: only the
        tile pairs within η, the particles in Hilbert order), ``"pallas"`` (one
        fused kernel, Triton on GPU, interpreted elsewhere: :mod:`.pallas`; all
        pairs, d ≤ its ``MAX_D``) or ``"auto"`` (dense for
        N ≤ :data:`LS_DENSE_MAX_N`, then sparse for d ≤ :data:`LS_SPARSE_MAX_D`,
        tiled above).
      block_size: rows (and columns) per tile of ``"tiled"`` (default 128) and
        ``"sparse"`` (default 32: small tiles skip more pairs;
        benchmarks/results/least_squares_sparse.md).
      mesh: a 1-D device mesh: the tiled / sparse fold split over its devices by
        row tiles (``"auto"`` then never takes ``"dense"``; ``"dense"`` and
        ``"pallas"`` refuse a mesh).
      interpret: the Pallas kernel's mode (``"pallas"`` only; None: by the
        platform).

    Returns:
      An :class:`LSGradient` in the promoted floating dtype (float64 in, float64
      out).

    Raises:
      ValueError: a bad argument, before tracing.
    """
    check_choice(method, "method", ("auto", "dense", "tiled", "sparse", "pallas"))
    mesh = check_mesh(mesh)
    n, d = jnp.shape(x) if jnp.ndim(x) == 2 else (0, 0)
    if method == "auto":
        small = 0 < n <= LS_DENSE_MAX_N and mesh is None
        method = "dense" if small else "sparse" if d <= LS_SPARSE_MAX_D else "tiled"
    if mesh is not None and method in ("dense", "pallas"):
        raise ValueError(
            f"mesh is for method 'tiled', 'sparse' or 'auto'; got method={method!r} "
            "with a mesh."
        )
    if method == "dense":
        return least_squares_dense(
            x,
            f,
            eta,
            quadratic=quadratic,
            kernel=kernel,
            min_eig=min_eig,
            max_residual=max_residual,
        )
    if method == "pallas":
        return least_squares_pallas(
            x,
            f,
            eta,
            quadratic=quadratic,
            kernel=kernel,
            min_eig=min_eig,
            max_residual=max_residual,
            interpret=interpret,
        )
    if method == "sparse":
        return least_squares_sparse(
            x,
            f,
            eta,
            quadratic=quadratic,
            kernel=kernel,
            min_eig=min_eig,
            max_residual=max_residual,
            block_size=32 if block_size is None else block_size,
            mesh=mesh,
        )
    return least_squares_tiled(
        x,
        f,
        eta,
        quadratic=quadratic,
        kernel=kernel,
        min_eig=min_eig,
        max_residual=max_residual,
        block_size=128 if block_size is None else block_size,
        mesh=mesh,
    )


#: The ``estimator`` choices of :func:`cenlmc_jax.cenlmc_step`: the paper's (default)
#: and the fits here.
ESTIMATORS = ("paper", "least_squares", "least_squares_quadratic")


def check_estimator(estimator: str) -> str:
    """Checks that ``estimator`` is one of :data:`ESTIMATORS` (Python, before tracing).

    Args:
      estimator: the argument.

    Returns:
      ``estimator``.

    Raises:
      ValueError: any other value.
    """
    return check_choice(estimator, "estimator", ESTIMATORS)


def least_squares_force(
    x: Array,
    f: Array,
    eta: ArrayLike,
    need: Array,
    estimator: str,
    method: str = "auto",
    mesh=None,
    interpret: bool | None = None,
) -> tuple[Array, Array]:
    """CEnLMC's ensemble force by the fit (beyond the paper).

    A particle the fit refuses (:func:`solve_moments`) joins those that take their
    true gradient; the paper's R1 / M_f / N* tests stay as they were (``need``).

    Args:
      x: ``(N, d)`` particles.
      f: ``(N,)`` potential values.
      eta: the ball radius ``η``.
      need: ``(N,)`` bool, the particles that take their true gradient.
      estimator: ``"least_squares"`` or ``"least_squares_quadratic"``.
      method: the pair force's (``EnsembleOptions.method``): ``"pallas"`` runs the
        fit's Pallas kernel too (on one device), anything else the fit's
        ``"auto"``.
      mesh: the fold split over the mesh's devices, as the pair force.
      interpret: the Pallas kernel's mode.

    Returns:
      ``(ĝ, need | ~ok)``: the force ``(N, d)`` and the particles that take their
      true gradient.
    """
    pallas = method == "pallas" and mesh is None
    res = least_squares_gradient(
        x,
        f,
        jnp.asarray(eta, x.dtype),
        quadratic=estimator == "least_squares_quadratic",
        method="pallas" if pallas else "auto",
        mesh=mesh,
        interpret=interpret if pallas else None,
    )
    return res.grad, need | ~res.ok
