"""The masked ensemble force of EnLMC and CEnLMC: one entry point.

docs/algorithms.md §2-4.

For particles ``x: (N, d)`` with potential values ``f`` (``-logdensity_fn``),
proposal log densities ``log p`` and, for CEnLMC, deterministic parts ``w``::

    force_sum_i = Σ_{j≠i} W_ij (x_j - x_i),
    W_ij = exp(log α_d - log p_j) (f_j - f_i) / |x_j - x_i|²
           · 1[|x_j - x_i| ≤ η] · 1[|w_j - w_i| ≤ R2],
    n_r2_i = #{j ≠ i : |w_j - w_i| ≤ R2} (3.20),   n_ball_i = #{j ≠ i : both masks},

``α_d = d / V_η`` (section 2). EnLMC divides ``force_sum`` by ``N - 1``,
CEnLMC by ``n_r2`` (eq. 3.19); this package only sums.

Layers (each imports only those below it)::

    algebra   the formulas once: PairwiseForce, log α_d, input checks,
              precision, prepare, and the blockwise sum as a monoid
              (empty_partial, combine, tile_partial / tile_update, finish)
    sparsity  block sparsity on top of the algebra: the Hilbert order, tile
              boxes and the conservative test of which tile pairs to skip
    dense     the N x N reference and the float64 NumPy oracle
    tiled     XLA row tiles folding the algebra's tile update (CPU path),
              dense or block-sparse (only tile pairs whose boxes are near)
    pallas    a fused Pallas/Triton kernel folding the same tile update,
              dense or over per-row-block lists of column blocks
    sharded   shard_map over a device mesh, folding combines (all-gather,
              ring) of a local partial it is given
    __init__  :func:`ensemble_force`: picks the backend
"""

from __future__ import annotations

import functools
from typing import Any

import jax.numpy as jnp

from cenlmc_jax._validation import check_bool, check_choice, check_int
from cenlmc_jax.pairwise.algebra import (
    DIRECT_MAX_D,
    PairwiseForce,
    canonical_precision,
    check_pair_inputs,
    coincident_rtol,
    log_alpha_d,
)
from cenlmc_jax.pairwise.dense import (
    ensemble_force_dense,
    ensemble_force_reference_numpy,
)
from cenlmc_jax.pairwise.pallas import (
    ensemble_force_pallas,
    kernel_options,
    pallas_partial,
)
from cenlmc_jax.pairwise.sharded import (
    STRATEGIES,
    ensemble_force_sharded,
    make_mesh,
    particle_axis,
    shard_ensemble,
)
from cenlmc_jax.pairwise.tiled import (
    default_block_size,
    ensemble_force_tiled,
    sparse_partial,
    tiled_partial,
)
from cenlmc_jax.types import Array, ArrayLike

__all__ = [
    "PairwiseForce",
    "ensemble_force",
    "ensemble_force_dense",
    "ensemble_force_tiled",
    "ensemble_force_pallas",
    "ensemble_force_sharded",
    "ensemble_force_reference_numpy",
    "log_alpha_d",
    "coincident_rtol",
    "default_block_size",
    "make_mesh",
    "shard_ensemble",
    "tiled_partial",
    "pallas_partial",
    "kernel_options",
    "METHODS",
    "STRATEGIES",
    "AUTO_DENSE_MAX_N",
    "AUTO_DENSE_MAX_BYTES",
    "AUTO_SPARSE_RULE",
    "auto_block_sparse",
    "DIRECT_MAX_D",
]

METHODS = ("auto", "dense", "tiled", "pallas")
#: ``method="auto"`` uses the dense reference up to this many particles ...
AUTO_DENSE_MAX_N = 64
#: ... provided its (N, N, d) difference array is at most this many bytes
#: (there it costs about the same as tiled on CPU and is the more accurate;
#: beyond it tiled is faster).
AUTO_DENSE_MAX_BYTES = 16 * 2**20
#: ``method="auto"`` (with ``block_sparse=None``) takes the block-sparse tiled
#: path where a row ``(max d, min N)`` of this rule holds: ``d <= max d`` and
#: ``N >= min N``: each row is the smallest N from which the block-sparse sum
#: was faster than the dense tiles at that d (benchmarks/bench_sparse.py on
#: CEnLMC-shaped ensembles, η = R2 = sqrt(h d), h = 0.05; the ratios are
#: benchmarks/results/sparse.md and benchmarks/results/sparse_small.md; d = 10
#: never pays). Measured on CPU, not on a GPU. d <= 2 from 1,792 (issue 30, was
#: 2,048): the sum's CPU time, tiled/sparse, median of 21 interleaved calls, was
#: 1.22x (η = 0.316, h = 0.05 as above) and 1.07x (η = R2 = sqrt(h d) with the
#: CLI's h = sqrt(2/N): 0.258) at N = 1,792; 1.2-1.5x and 1.3-1.5x at 2,000 (the
#: CLI's N, two runs); 0.93-0.97x at 1,536 and 0.64-0.83x at 1,024. Only since the
#: block-sparse program holds no host callback does it pay in a short run: before,
#: it was compiled again in every process (~14 s, never from the persistent cache).
AUTO_SPARSE_RULE = ((2, 1792), (3, 4096), (4, 8192), (5, 32768))


def auto_block_sparse(n: int, d: int) -> bool:
    """The ``method="auto"`` rule: block-sparse where a row of the rule holds.

    The rule is :data:`AUTO_SPARSE_RULE`.

    Args:
      n: the number of particles ``N``.
      d: the dimension.

    Returns:
      True where ``method="auto"`` takes the block-sparse tiles.
    """
    return any(d <= max_d and n >= min_n for max_d, min_n in AUTO_SPARSE_RULE)


@functools.cache
def _local_partial(
    method: str,
    d: int,
    block_size: int | None,
    precision: Any,
    interpret: bool | None = None,
    dtype: str = "float32",
    axis_name: str | None = None,
):
    """The rows-against-columns partial of a backend, one object per setting.

    A jit static argument.
    """
    # the block-sparse XLA tiles (block_size: rows per row tile), decided over the mesh
    if method == "sparse":
        return functools.partial(
            sparse_partial,
            block_rows=block_size,
            precision=precision,
            axis_name=axis_name,
        )
    if method == "pallas":
        distances = "direct" if d <= DIRECT_MAX_D else "gram"
        opts = kernel_options(
            d,
            distances=distances,
            precision=precision,
            gram_precision=precision,
            interpret=interpret,
            dtype=dtype,
        )
        return functools.partial(pallas_partial, opts=opts)
    return functools.partial(tiled_partial, block_rows=block_size, precision=precision)


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
    block_sparse: bool | None = None,
    interpret: bool | None = None,
    return_fallback: bool = False,
) -> PairwiseForce | tuple[PairwiseForce, Array]:
    """Pairwise sums of the EnLMC / CEnLMC ensemble force (docs/algorithms.md §2-4).

    Args:
      x: (N, d) particle positions ``x_i^m``.
      f: (N,) potential ``f(x_i) = -logdensity_fn(x_i)`` (any additive
        constant).
      log_p: (N,) log density of the proposal each particle was drawn from,
        ``log p_j^m = -(d/2) log(4πh) - |x_j - w_j|²/(4h)``
        (docs/algorithms.md §3).
      eta: ball radius ``η > 0``.
      w: optional (N, d) deterministic parts ``w_j^m`` (CEnLMC); rows may be
        ``+inf`` (the initialisation) or otherwise non-finite.
      r2: ``R2 >= 0``, the w-space radius; required with ``w``, forbidden
        without.
      method: ``"dense"`` (N x N reference), ``"tiled"`` (XLA row tiles,
        ``O(N d + B N)`` memory), ``"pallas"`` (the fused kernel; interpret
        mode off GPU (``interpret``), not yet timed on a GPU) or ``"auto"``
        (dense for ``N <= 64`` when its ``(N, N, d)`` temporary is at most
        :data:`AUTO_DENSE_MAX_BYTES`, tiled otherwise, block-sparse by
        :func:`auto_block_sparse`; never pallas).
      block_size: rows per block of ``tiled`` (default
        :func:`default_block_size`); N need not be a multiple. The dense and
        Pallas backends choose their own tiles.
      precision: matrix-product precision of every backend (default
        ``jax.lax.Precision.HIGHEST`` so distance masks are float32-accurate
        on GPU/TPU as well); it also sets the Gram coincidence bound. A
        lower one runs TF32 or bfloat16 products on a GPU, whose bound can
        hold every pair: keep HIGHEST unless ``d`` is small
        (benchmarks/results/gpu/README.md: the Pallas kernel's Gram form at
        TF32 put every pair in the ball at d = 100 on an H200).
      mesh: a 1-D ``jax.sharding.Mesh``: shard the particles over its devices
        (:mod:`.sharded`, ``strategy="allgather"`` or ``"ring"``); the local
        partials are those of ``method`` (``"tiled"``/``"auto"``: XLA tiles,
        ``"pallas"``: the kernel; ``"dense"`` has no sharded form and raises)
        with ``block_size`` and ``precision``. Same result as without a mesh
        up to float rounding.
      block_sparse: skip the tile pairs whose bounding boxes are farther
        apart than η (or, with ``w``, than R2): the particles are sorted
        along a Hilbert curve, the skipped tiles hold no pair that passes a
        mask, so the counts equal the dense tiles' and the forces agree to
        rounding (:func:`.tiled.block_sparse_partial`,
        :func:`.pallas.sparse_tile_lists`). True: ``tiled``/``pallas``
        (and ``auto``, as tiled) run block-sparse; False: never; None
        (default): ``auto`` decides by :func:`auto_block_sparse`, the named
        methods run dense tiles. Not with ``method="dense"``. With a
        ``mesh``: True (``auto``/``tiled``, ``strategy="allgather"``) sorts
        the gathered ensemble and gives each device a run of it with its own
        tile list (:mod:`.sharded`); None: ``auto`` with all-gather decides by
        :func:`auto_block_sparse` as on one device, the rest run dense tiles.
        Cost (XLA tiles): the sort, ``O(N log N)``; the plan of which tile
        pairs to visit, ``O(N)`` box tests up to N ~ 2^20 (two levels,
        :func:`.tiled.sparse_plan`); the visited tiles, ``O(N k)`` pair terms
        for ``k`` neighbours a particle within R2 (η without ``w``), against
        ``O(N²)`` for the dense tiles.
      interpret: the Pallas kernel's mode (``method="pallas"``, with or
        without a mesh; the other backends ignore it). None (default): by the
        platform the program is lowered for, not by ``jax.default_backend()``:
        the Triton kernel when lowered for CUDA/ROCm (also from a CPU host,
        ``.lower(lowering_platforms=("cuda",))``), interpret mode otherwise.
        True: always interpret; False: always Triton
        (:func:`.pallas.ensemble_force_pallas`).
      return_fallback: return ``(force, ran_dense)``: ``ran_dense`` a bool
        scalar, True where the single-device block-sparse XLA tiles ran the
        dense tiles instead (their list overflowed, or the weights needed a
        shift per row; the block-sparse Pallas kernel hands a row block whose
        list overflows to those tiles), and then no
        :class:`~.tiled.SparseFallbackWarning`:
        the caller reports it (the CEnLMC step's ``info.dense_fallback``), so
        its program holds no host callback and the persistent compilation
        cache keeps it. False for every other form (the sharded block-sparse
        sums still warn themselves).

    ``tiled`` and ``pallas`` (and the sharded forms) use the same distances
    (exact differences for ``d <= DIRECT_MAX_D``, the Gram identity above) and
    the same overflow rule: they differ only in the order of summation.

    Returns:
      :class:`PairwiseForce` ``(force_sum (N, d), n_r2 (N,), n_ball (N,))`` in
      the promoted floating dtype of the inputs (float64 in, float64 out); with
      ``return_fallback``, ``(force, ran_dense)``.

    Jittable; ``eta`` and ``r2`` may be traced. Raises ``ValueError`` for
    mismatched shapes, ``eta <= 0``, ``r2 < 0``, an unknown ``method`` or
    ``strategy``, ``block_size < 1`` or an unknown ``precision``.
    """
    check_choice(method, "method", METHODS)
    check_choice(strategy, "strategy", STRATEGIES)
    x, f, log_p, w = check_pair_inputs(x, f, log_p, eta, w, r2)
    if block_size is not None:
        block_size = check_int(block_size, "block_size", minimum=1)
    precision = canonical_precision(precision)
    if interpret is not None:
        check_bool(interpret, "interpret")
    check_bool(return_fallback, "return_fallback")

    def done(out):
        # the forms with no flags of their own: nothing fell back here
        return (out, jnp.asarray(False)) if return_fallback else out

    n, d = x.shape
    if block_sparse is not None:
        check_bool(block_sparse, "block_sparse")
        if block_sparse and method == "dense":
            raise ValueError(
                "block_sparse=True needs method 'auto', 'tiled' or 'pallas' (the "
                "dense reference has no block-sparse form); got method 'dense'."
            )
        if (
            block_sparse
            and mesh is not None
            and (method == "pallas" or strategy != "allgather")
        ):
            raise ValueError(
                "block_sparse=True with a mesh needs method 'auto' or 'tiled' and "
                "strategy 'allgather' (the sharded block-sparse sums are XLA "
                "tiles over the gathered, sorted ensemble); got method "
                f"{method!r}, strategy {strategy!r}."
            )
    if mesh is not None:
        if method == "dense":
            raise ValueError(
                "method must be 'auto', 'tiled' or 'pallas' with a mesh (the dense "
                "reference has no sharded form); got 'dense'."
            )
        # auto under a mesh: the same rule as on one device (the sharded block-sparse
        # sums need all-gather)
        auto_sparse = (
            block_sparse is None and method == "auto" and strategy == "allgather"
        )
        sparse = auto_block_sparse(n, d) if auto_sparse else bool(block_sparse)
        if method == "pallas":
            local = _local_partial(
                "pallas", d, block_size, precision, interpret, jnp.dtype(x.dtype).name
            )
        else:
            local = (
                _local_partial(
                    "sparse", d, block_size, precision, axis_name=particle_axis(mesh)
                )
                if sparse
                else _local_partial("tiled", d, block_size, precision)
            )
        return done(
            ensemble_force_sharded(
                x,
                f,
                log_p,
                eta,
                partial_fn=local,
                w=w,
                r2=r2,
                mesh=mesh,
                strategy=strategy,
                spatial_sort=sparse,
            )
        )
    if method == "auto":
        dense_bytes = n * n * d * jnp.dtype(x.dtype).itemsize * (1 if w is None else 2)
        if block_sparse is None:
            block_sparse = auto_block_sparse(n, d)
        small = n <= AUTO_DENSE_MAX_N and dense_bytes <= AUTO_DENSE_MAX_BYTES
        method = "dense" if small and not block_sparse else "tiled"
    sparse = bool(block_sparse)
    if method == "dense":
        return done(
            ensemble_force_dense(x, f, log_p, eta, w=w, r2=r2, precision=precision)
        )
    if method == "pallas":
        distances = "direct" if d <= DIRECT_MAX_D else "gram"
        return ensemble_force_pallas(
            x,
            f,
            log_p,
            eta,
            w=w,
            r2=r2,
            distances=distances,
            precision=precision,
            gram_precision=precision,
            block_sparse=sparse,
            interpret=interpret,
            return_fallback=return_fallback,
        )
    return ensemble_force_tiled(
        x,
        f,
        log_p,
        eta,
        w=w,
        r2=r2,
        block_size=block_size,
        precision=precision,
        block_sparse=sparse,
        return_fallback=return_fallback,
    )
