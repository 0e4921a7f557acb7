"""The least-squares gradient's moments as one fused Pallas kernel (Triton on GPU).

The sums of :func:`~cenlmc_jax.ensemble.least_squares.tile_moments`, over all
``N`` columns for each of the ``N`` rows: with ``u_ij = (x_j - x_i)/η``,
``r²_ij = |u_ij|²``, ``use_ij = valid_i ∧ valid_j ∧ r²_ij > 0``,
``k_ij = use_ij k(r²_ij)`` (``"epanechnikov"`` ``(1 - r²)₊``, ``"uniform"``
``1[r² ≤ 1]``), ``δf_ij = use_ij (f_j - f_i)`` and ``φ`` the ``p`` features
(``u``, and with ``quadratic`` the ``u_k u_l``, ``k ≤ l``)::

    A_i[q, r] = Σ_j k_ij φ_q φ_r   (q ≤ r: p(p+1)/2 sums; A is symmetric),
    b_i[q] = Σ_j k_ij δf_ij φ_q,   c_i = Σ_j k_ij δf_ij²,   m_i = Σ_j k_ij,
    count_i = #{j : k_ij > 0}.

The kernel is laid out as the pair force's (:mod:`cenlmc_jax.pairwise.pallas`):
the grid runs over blocks of ``block_rows`` particles; inside, a ``fori_loop``
walks over blocks of ``block_cols`` columns, loading each coordinate of the
columns as a contiguous ``(block_cols,)`` vector from a transposed ``(d, N)``
layout, and adds the tile's ``(block_rows, block_cols)`` terms, reduced over
the columns, to ``p(p+1)/2 + p + 3`` accumulators of shape ``(block_rows,)``
kept in registers (a Python loop over the upper triangle of ``A``, unrolled at
trace time). The only two-dimensional values are that tile's ``u_k``,
``r²``, ``k``, ``δf`` and features; nothing ``N × N`` exists, and no
``B × C × p`` array beyond one tile's. The upper triangle is mirrored into
``A`` outside the kernel.

Exact up to the order of the sums: each term is computed by the same
floating-point operations as in ``tile_moments`` (``(x_j - x_i)/η``, then
``r²`` as ``u_1² + u_2² + …``, the same kernel and mask), so the masks agree;
only the sums over ``j`` run in another order (per column block, then across
blocks). Each moment is a sum of at most ``N`` terms, so it differs from the
XLA fold by at most ``~N ε`` times the sum of the terms' magnitudes.

Tiles and padding as in the pair force's kernel: ``block_rows`` and
``block_cols`` are powers of two ``≥ 16`` (Triton tiles), ``N`` is padded to a
multiple of both with invalid particles (no one's neighbour, adding nothing),
the coordinate axis to a power of two ``≥ 16``. The defaults
(:data:`TILE_DEFAULTS`, by ``p`` and dtype) keep the compiled kernel from
spilling registers on sm_90a, except float64 quadratic at ``d = 4``. ``d`` is
capped (:data:`MAX_D`: 8 for the linear fit, 4 for the quadratic, i.e. at most
36 and 105 sums of ``A``): the accumulators live in registers, and beyond that
the XLA tiles are the better path. ``interpret=None``: the Triton kernel when
the program is lowered for CUDA or ROCm, Pallas' interpret mode elsewhere
(chosen by ``lax.platform_dependent``, not by the default backend); float64
in, float64 out (interpret mode on CPU; Triton on CUDA). Not yet run or timed
on a GPU.

Not here: the block-sparse tile lists of the pair force's kernel (every row
block visits every column block, ``O(N²)`` work, however small ``η``), and
the sharding over a mesh.

Differentiation: a ``pallas_call`` has no derivative rule of its own, so
:func:`least_squares_moments_pallas` is a ``jax.custom_vjp`` whose forward pass
is the kernel and whose backward pass is the vjp of the XLA fold of
``tile_moments`` (row tiles of 128, :func:`xla_moments`, the tiles of
``least_squares_tiled``), recomputed from ``x, f, valid, η``; ``jax.grad``
through :func:`least_squares_pallas` therefore equals ``jax.grad`` through
``least_squares_tiled`` up to rounding. Forward-mode (``jax.jvp``,
``jax.jacfwd``) is not defined for a ``custom_vjp`` and raises.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

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
from cenlmc_jax.types import Array, ArrayLike

__all__ = [
    "MAX_D",
    "TILE_DEFAULTS",
    "MomentsOptions",
    "moments_options",
    "xla_moments",
    "least_squares_moments_pallas",
    "least_squares_pallas",
]

#: The largest ``d`` of the kernel, per ``quadratic``: ``p(p+1)/2 + p + 3``
#: accumulators a row (47 linear at d = 8, 122 quadratic at d = 4).
MAX_D = {False: 8, True: 4}

#: Rows of the XLA fold of the backward pass (least_squares_tiled's default).
XLA_BLOCK = 128


class MomentsOptions(NamedTuple):
    """Static (hashable) settings of the kernel.

    See :func:`least_squares_moments_pallas`.

    Attributes:
      kernel: ``"epanechnikov"`` or ``"uniform"``.
      quadratic: with the quadratic features.
      block_rows: rows per grid block (a power of two ``≥ 16``).
      block_cols: columns per inner block (a power of two ``≥ 16``).
      interpret: None (by the lowering platform), True or False.
      num_warps: Triton's warps per block.
      num_stages: Triton's pipeline stages.
    """

    kernel: str
    quadratic: bool
    block_rows: int
    block_cols: int
    interpret: bool | None
    num_warps: int
    num_stages: int


def _check_block(value: int | None, name: str, default: int) -> int:
    if value is None:
        return default
    v = check_int(value, name, minimum=16)
    if v & (v - 1):
        raise ValueError(
            f"{name} must be a power of two >= 16 (a Triton tile size); got {v}."
        )
    return v


#: Tiles and launch of the kernel compiled for sm_90a, by the features ``p`` (rows:
#: ``(max p, float32 tiles, float64 tiles, num_warps)``, the first whose ``max p`` holds
#: ``p``). Chosen so that it does not spill registers: ptxas -v of the CUDA lowering's
#: TTIR compiled by the ``triton`` 3.9 wheel, as benchmarks/bench_spills.py does for
#: the pair force (whose figures are in benchmarks/results/spills.md). The
#: ``p(p+1)/2 + p + 2`` float accumulators hold at least one value each a thread (two
#: registers in float64), so the many-feature fits take the small tiles and 8 warps;
#: float64 quadratic d = 4 (121 accumulators, 242 registers) cannot fit in 255 and
#: spills.
TILE_DEFAULTS = (
    # p <= 4 (d <= 4 linear, d = 1 quadratic): float32 32 x 32, float64 32 x 16
    (4, (32, 32), (32, 16), 4),
    # the rest: 16 x 16 and 8 warps (4 warps spill more); float64 d = 4 quadratic still
    # spills
    (math.inf, (16, 16), (16, 16), 8),
)


def moments_options(
    d: int,
    dtype,
    *,
    kernel: str,
    quadratic: bool,
    block_rows: int | None = None,
    block_cols: int | None = None,
    interpret: bool | None = None,
) -> MomentsOptions:
    """Checks the kernel's settings and fills in the defaults (:data:`TILE_DEFAULTS`).

    Args:
      d: the dimension (at most :data:`MAX_D`).
      dtype: the dtype of the sums.
      kernel: ``"epanechnikov"`` or ``"uniform"``.
      quadratic: with the quadratic features.
      block_rows: a power of two ``≥ 16``, or None (the default for ``p`` and
        ``dtype``).
      block_cols: likewise.
      interpret: None, True or False.

    Returns:
      The :class:`MomentsOptions`.

    Raises:
      ValueError: naming the argument: ``d`` above :data:`MAX_D`, a block size
        that is not a power of two ``≥ 16``, an unknown kernel.
    """
    check_choice(kernel, "kernel", KERNELS)
    quadratic = check_bool(quadratic, "quadratic")
    if d > MAX_D[quadratic]:
        fit = "quadratic" if quadratic else "linear"
        raise ValueError(
            f"d must be <= {MAX_D[quadratic]} for the {fit} fit's Pallas kernel (its "
            "accumulators live in registers; use least_squares_tiled beyond); got d = "
            f"{d}."
        )
    if interpret is not None:
        interpret = check_bool(interpret, "interpret")
    p = num_features(d, quadratic)
    _, tiles32, tiles64, warps = next(row for row in TILE_DEFAULTS if p <= row[0])
    rows, cols = tiles64 if jnp.dtype(dtype) == jnp.float64 else tiles32
    return MomentsOptions(
        kernel,
        quadratic,
        _check_block(block_rows, "block_rows", rows),
        _check_block(block_cols, "block_cols", cols),
        interpret,
        warps,
        3,
    )


def _upper(p: int) -> list[tuple[int, int]]:
    """The entries ``(q, r)``, ``q ≤ r``, of a symmetric ``p × p`` matrix, by rows."""
    return [(q, r) for q in range(p) for r in range(q, p)]


def _width(n: int) -> int:
    return max(16, 1 << (max(int(n), 1) - 1).bit_length())


def _kernel(
    xt_ref,
    f_ref,
    valid_ref,
    eta_ref,  # rows: x (d_pad, B_r) transposed, f, valid (int32), η broadcast
    xtc_ref,
    fc_ref,
    validc_ref,  # columns: the whole ensemble, loaded block_cols at a time
    sums_ref,
    count_ref,  # out: (W_pad, B_r) [A's upper triangle, b, c, m], count (B_r,)
    *,
    dim: int,
    kernel: str,
    quadratic: bool,
    block_cols: int,
    num_col_blocks: int,
):
    """One row block against every column block: the moments' sums, then stored.

    Folded in registers.
    """
    from jax.experimental import pallas as pl  # as in _pallas_moments

    xr = [xt_ref[k, :] for k in range(dim)]
    fr, vr, eta = f_ref[...], valid_ref[...] != 0, eta_ref[...]
    p = num_features(dim, quadratic)
    pairs = _upper(p)

    def step(c, acc):
        sl = pl.ds(pl.multiple_of(c * block_cols, block_cols), block_cols)
        # as tile_moments: u = (x_j - x_i)/η, r² = Σ_k u_k², the same mask and kernel
        u = [
            (xtc_ref[k, sl][None, :] - xr[k][:, None]) / eta[:, None]
            for k in range(dim)
        ]
        r2 = u[0] * u[0]
        for uk in u[1:]:
            r2 = r2 + uk * uk
        use = vr[:, None] & (validc_ref[sl] != 0)[None, :] & (r2 > 0)
        zero = jnp.zeros_like(r2)
        w = jnp.where(
            use & (r2 <= 1),
            1 - r2 if kernel == "epanechnikov" else jnp.ones_like(r2),
            zero,
        )
        df = jnp.where(use, fc_ref[sl][None, :] - fr[:, None], zero)
        phi = u + (
            [u[k] * u[m] for k in range(dim) for m in range(k, dim)]
            if quadratic
            else []
        )
        wphi = [w * q for q in phi]
        terms = (
            [wphi[q] * phi[r] for q, r in pairs]
            + [wq * df for wq in wphi]
            + [w * df * df, w]
        )
        sums = tuple(s + jnp.sum(t, axis=1) for s, t in zip(acc[0], terms, strict=True))
        return sums, acc[1] + jnp.sum(
            (w > 0).astype(jnp.int32), axis=1, dtype=jnp.int32
        )

    rows = xt_ref.shape[1]
    init = (
        tuple(jnp.zeros((rows,), sums_ref.dtype) for _ in range(len(pairs) + p + 2)),
        jnp.zeros((rows,), jnp.int32),
    )
    sums, count = lax.fori_loop(0, num_col_blocks, step, init)
    for j, s in enumerate(sums):
        sums_ref[j, :] = s
    count_ref[...] = count


def _pallas_moments(
    x: Array, f: Array, valid: Array, eta: Array, opts: MomentsOptions
) -> LSMoments:
    """The kernel's launch: pad, call, mirror the upper triangle of ``A``.

    See the module docstring.
    """
    # imported here, not at the top: only the Pallas moments need Pallas and its
    # Triton module, and the XLA moments should not pay for their import
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import triton as pltriton

    n, d = x.shape
    dtype = x.dtype
    p = num_features(d, opts.quadratic)
    pairs = _upper(p)
    br, bc = opts.block_rows, opts.block_cols
    n_pad = -(-n // max(br, bc)) * max(br, bc)  # both powers of two: a multiple of each
    d_pad, w_pad = _width(d), _width(len(pairs) + p + 2)
    # padding: invalid particles at the origin (no one's neighbour; finite, so 0 · φ
    # stays 0)
    xt = jnp.pad(x, ((0, n_pad - n), (0, d_pad - d))).T
    fp = jnp.pad(f, (0, n_pad - n))
    vp = jnp.pad(valid.astype(jnp.int32), (0, n_pad - n))
    eta_rows = jnp.full((br,), eta, dtype)

    row_vec = pl.BlockSpec((br,), lambda i: (i,))
    row_mat = pl.BlockSpec((d_pad, br), lambda i: (0, i))
    kernel = functools.partial(
        _kernel,
        dim=d,
        kernel=opts.kernel,
        quadratic=opts.quadratic,
        block_cols=bc,
        num_col_blocks=n_pad // bc,
    )

    def launch(*args, interpret: bool):
        return pl.pallas_call(
            kernel,
            grid=(n_pad // br,),
            # rows: their block; η: the same (B_r,) for every program; columns: the
            # whole arrays
            in_specs=[
                row_mat,
                row_vec,
                row_vec,
                pl.BlockSpec((br,), lambda i: (0,)),
                pl.BlockSpec((d_pad, n_pad), lambda i: (0, 0)),
                pl.BlockSpec((n_pad,), lambda i: (0,)),
                pl.BlockSpec((n_pad,), lambda i: (0,)),
            ],
            out_specs=(pl.BlockSpec((w_pad, br), lambda i: (0, i)), row_vec),
            out_shape=(
                jax.ShapeDtypeStruct((w_pad, n_pad), dtype),
                jax.ShapeDtypeStruct((n_pad,), jnp.int32),
            ),
            # Triton CompilerParams select the Triton lowering (as the pair force's
            # kernel)
            compiler_params=pltriton.CompilerParams(
                num_warps=opts.num_warps, num_stages=opts.num_stages
            ),
            interpret=interpret,
            name=f"least_squares_moments_{'quadratic' if opts.quadratic else 'linear'}",
        )(*args)

    args = (xt, fp, vp, eta_rows, xt, fp, vp)
    if opts.interpret is None:
        # by the platform the program is lowered for (as the pair force's kernel)
        compiled = functools.partial(launch, interpret=False)
        sums, count = lax.platform_dependent(
            *args,
            cuda=compiled,
            rocm=compiled,
            default=functools.partial(launch, interpret=True),
        )
    else:
        sums, count = launch(*args, interpret=opts.interpret)
    sums = sums[:, :n].T
    where = np.zeros((p, p), np.int32)
    for j, (q, r) in enumerate(pairs):
        where[q, r] = where[r, q] = j
    a = sums[:, where]  # (n, p, p): the upper triangle mirrored
    npr = len(pairs)
    return LSMoments(
        a, sums[:, npr : npr + p], sums[:, npr + p], sums[:, npr + p + 1], count[:n]
    )


def xla_moments(
    x: Array,
    f: Array,
    valid: Array,
    eta: Array,
    *,
    kernel: str,
    quadratic: bool,
    block_size: int = XLA_BLOCK,
) -> LSMoments:
    """The same moments by the XLA fold of ``tile_moments``.

    Row tiles by ``lax.map``, column tiles by ``lax.scan``. The backward pass of
    :func:`least_squares_moments_pallas`, and its reference. ``tile_moments`` is
    rematerialised (``jax.checkpoint``) so that its vjp keeps a tile's inputs, not
    its ``B × C × p`` temporaries, for every tile pair.

    Args:
      x: ``(N, d)`` positions (invalid rows zeroed).
      f: ``(N,)`` values.
      valid: ``(N,)`` bool.
      eta: the radius ``η``.
      kernel: ``"epanechnikov"`` or ``"uniform"``.
      quadratic: with the quadratic features.
      block_size: rows per tile.

    Returns:
      The :class:`~cenlmc_jax.ensemble.least_squares.LSMoments` of all rows.
    """
    n, d = x.shape
    block_size = min(block_size, n)
    nb = -(-n // block_size)
    pad = nb * block_size - n
    xs = jnp.pad(x, ((0, pad), (0, 0))).reshape(nb, block_size, d)
    fs = jnp.pad(f, (0, pad)).reshape(nb, block_size)
    vs = jnp.pad(valid, (0, pad)).reshape(nb, block_size)
    p = num_features(d, quadratic)
    tile = jax.checkpoint(
        functools.partial(tile_moments, kernel=kernel, quadratic=quadratic)
    )

    def row_tile(rows):
        def step(acc, cols):
            return combine_moments(acc, tile(*rows, *cols, eta)), None

        return lax.scan(step, empty_moments(block_size, p, x.dtype), (xs, fs, vs))[0]

    mo = lax.map(row_tile, (xs, fs, vs))
    return LSMoments(*(v.reshape((nb * block_size,) + v.shape[2:])[:n] for v in mo))


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _moments(x, f, valid, eta, opts):
    return _pallas_moments(x, f, valid, eta, opts)


def _moments_fwd(x, f, valid, eta, opts):
    return _pallas_moments(x, f, valid, eta, opts), (x, f, valid, eta)


def _moments_bwd(opts, res, ct):
    x, f, valid, eta = res
    _, vjp = jax.vjp(
        lambda x, f, eta: xla_moments(
            x, f, valid, eta, kernel=opts.kernel, quadratic=opts.quadratic
        ),
        x,
        f,
        eta,
    )
    gx, gf, geta = vjp(ct)
    return gx, gf, None, geta


_moments.defvjp(_moments_fwd, _moments_bwd)


def least_squares_moments_pallas(
    x: ArrayLike,
    f: ArrayLike,
    valid: ArrayLike,
    eta: ArrayLike,
    *,
    kernel: str,
    quadratic: bool,
    block_rows: int | None = None,
    block_cols: int | None = None,
    interpret: bool | None = None,
) -> LSMoments:
    """The moments of all ``N`` rows against all ``N`` columns by the Pallas kernel.

    See the module docstring. Differentiable in reverse mode (``x``, ``f``,
    ``eta``) through the XLA fold's vjp.

    Args:
      x: ``(N, d)`` finite positions (invalid rows zeroed, as
        ``least_squares``'s ``_prepare`` leaves them; a NaN would reach the sums
        through ``0 · φ``).
      f: ``(N,)`` finite values.
      valid: ``(N,)`` bool.
      eta: the radius ``η > 0`` (may be traced).
      kernel: ``"epanechnikov"`` or ``"uniform"``.
      quadratic: the quadratic features too.
      block_rows: tile rows (a power of two ``≥ 16``; None:
        :func:`moments_options`).
      block_cols: tile columns (likewise).
      interpret: None (by the lowering platform: Triton on CUDA/ROCm, interpret
        mode elsewhere), True (interpret everywhere), False (always Triton).

    Returns:
      :class:`~cenlmc_jax.ensemble.least_squares.LSMoments` in ``x``'s dtype:
      ``a`` (N, p, p) symmetric, ``b`` (N, p), ``c``, ``mass`` (N,), ``count``
      (N,) int32.
    """
    x, f, valid = jnp.asarray(x), jnp.asarray(f), jnp.asarray(valid)
    if (
        x.ndim != 2
        or x.shape[0] < 1
        or x.shape[1] < 1
        or not jnp.issubdtype(x.dtype, jnp.floating)
    ):
        raise ValueError(
            "x must be a floating array of shape (N, d) with N, d >= 1; got "
            f"{x.dtype}{tuple(x.shape)}."
        )
    if f.shape != x.shape[:1] or valid.shape != x.shape[:1] or valid.dtype != jnp.bool_:
        raise ValueError(
            f"f and valid must have shape (N,) = ({x.shape[0]},), valid bool; got f "
            f"{tuple(f.shape)}, valid {valid.dtype}{tuple(valid.shape)}."
        )
    opts = moments_options(
        x.shape[1],
        x.dtype,
        kernel=kernel,
        quadratic=quadratic,
        block_rows=block_rows,
        block_cols=block_cols,
        interpret=interpret,
    )
    return _moments(x, f.astype(x.dtype), valid, jnp.asarray(eta, x.dtype), opts)


@functools.partial(jax.jit, static_argnames=("opts",))
def _least_squares(x, f, eta, min_eig, max_residual, *, opts: MomentsOptions):
    x, f, valid = prepare(x, f)
    mo = _moments(x, f, valid, eta, opts)
    return solve_moments(mo, eta, x.shape[1], min_eig, max_residual)


def least_squares_pallas(
    x: ArrayLike,
    f: ArrayLike,
    eta: ArrayLike,
    *,
    quadratic: bool = False,
    kernel: str = "epanechnikov",
    min_eig: ArrayLike = DEFAULT_MIN_EIG,
    max_residual: ArrayLike = math.inf,
    block_rows: int | None = None,
    block_cols: int | None = None,
    interpret: bool | None = None,
) -> LSGradient:
    """The local least-squares gradient with its moments from the Pallas kernel.

    Equal to ``least_squares_dense`` up to the order of the sums. NaN particles
    are invalid: no one's neighbour, refused.

    Args:
      x: ``(N, d)`` particles, ``d`` at most :data:`MAX_D`.
      f: ``(N,)`` potential values.
      eta: the ball radius ``η > 0``.
      quadratic: as for ``least_squares_tiled``.
      kernel: as for ``least_squares_tiled``.
      min_eig: as for ``least_squares_tiled``.
      max_residual: as for ``least_squares_tiled``.
      block_rows: as for :func:`least_squares_moments_pallas`.
      block_cols: as for :func:`least_squares_moments_pallas`.
      interpret: as for :func:`least_squares_moments_pallas`.

    Returns:
      An :class:`~cenlmc_jax.ensemble.least_squares.LSGradient`.

    Raises:
      ValueError: a bad argument, or ``d`` above :data:`MAX_D`.
    """
    # the same argument checks as the XLA paths, so that every backend refuses alike
    x, f, dtype = check_inputs(x, f, eta, kernel, quadratic, min_eig, max_residual)
    opts = moments_options(
        x.shape[1],
        dtype,
        kernel=kernel,
        quadratic=quadratic,
        block_rows=block_rows,
        block_cols=block_cols,
        interpret=interpret,
    )
    return _least_squares(x, f, *scalars(dtype, eta, min_eig, max_residual), opts=opts)
