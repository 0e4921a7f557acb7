"""The ensemble force with the particles sharded over several devices.

The ensemble ``x: (N, d)`` is split over a 1-D device mesh along its particle
axis (``PartitionSpec(axis_name)``): device ``k`` owns ``N/P`` particles and
computes, for those rows only, the pair sums of docs/algorithms.md §2-4
(:mod:`.algebra`)

    force_sum_i = Σ_{j≠i} W_ij (x_j - x_i),   n_r2_i,   n_ball_i,

against *all* ``N`` particles, as a fold of :func:`~.algebra.combine` over
column sets. Per-particle work (gradients, noise, the ``w`` / ``x`` updates
of the sampler) then stays on the device that owns the particle; only the
pair sums need the other devices' particles. Two ways to bring them
(``strategy=``):

``"allgather"`` (default): one ``all_gather`` of the inputs (``(2d + 2) N``
    numbers) to every device, which prepares the whole ensemble as a single
    device would (same centre, same operands) and computes one local
    rows-against-all-columns partial. One collective per call and one long
    local computation. ``O(N d)`` memory per device: ``10^7`` particles with
    ``d = 10`` are ``(2d + 2) N ≈ 2·10^8`` float32 numbers, fine on any
    accelerator. With ``N`` a multiple of the device count and the default
    tiles each row is summed as on one device, bit for bit
    (tests/pairwise/test_sharded.py checks it on 4 CPU devices).
``"ring"``: ``P - 1`` ``ppermute`` steps pass the column blocks around a ring
    (as in ring attention); each device combines the partial of its rows
    against each block as it arrives (:func:`~.algebra.combine`, the
    flash-attention rescale). ``O(N d / P)`` memory per device, and the
    transfer of the next block can overlap the compute of the current one.

Block-sparse (``spatial_sort=True``, all-gather only; ``ensemble_force(...,
mesh=mesh, block_sparse=True)``): every device sorts the gathered ensemble
along the Hilbert curve (:func:`~.sparsity.sort_spatially`, the same sort
on every device and as on one device), takes the ``k``-th run of ``N/P``
sorted particles as its rows, and folds them against all the sorted columns
with its own tile list (:func:`~.tiled.sparse_partial`: its row tiles
against every column tile, the boxes' test deciding which to visit). The
rows' results are then all-gathered once more (``(d + 2) N`` numbers),
unsorted, and each device keeps the rows it owns. Sparse or dense is decided
as on one device, over the whole ensemble: when the devices' lists together
exceed ``max_active`` of all tile pairs (a ``psum`` of their lengths), every
device runs its dense tiles, exact either way. With ``N/P`` a multiple of the
64-row tiles the devices fold the single device's tiles in its order: the
result is the single-device block-sparse one bit for bit
(tests/pairwise/test_sharded.py, on 4 CPU devices).

Both are exact re-orderings of the same sums: they agree with a single-device
computation up to float rounding of the summation order (and, for the ring,
of the global mean used for centring, computed with ``psum``).

The local rows-against-columns partial is passed in (``partial_fn``, e.g.
:func:`~.tiled.tiled_partial` or :func:`~.pallas.pallas_partial` with their
settings bound); :func:`cenlmc_jax.pairwise.ensemble_force` with ``mesh=``
builds it from ``method`` and ``precision``.

``N`` need not be divisible by the number of devices: the ensemble is padded
with invalid particles (``f = NaN``: they contribute nothing and are no one's
neighbour) and the result is cut back to ``N`` rows. That padding is a
re-layout on every call and the cut result is no longer split evenly (XLA
returns it replicated): keep ``N`` a multiple of the device count in a long
run (:func:`shard_ensemble` insists on it). With such an ``N`` the result is
sharded like ``x``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from cenlmc_jax._validation import check_bool, check_callable, check_choice, check_int
from cenlmc_jax.pairwise.algebra import (
    PairwiseForce,
    Partial,
    Prepared,
    centre_terms,
    check_pair_inputs,
    combine,
    empty_partial,
    finish,
    prepare,
    validity,
)
from cenlmc_jax.pairwise.sparsity import sort_spatially, unsort
from cenlmc_jax.types import Array, ArrayLike

__all__ = [
    "make_mesh",
    "shard_ensemble",
    "ensemble_force_sharded",
    "particle_axis",
    "STRATEGIES",
]

STRATEGIES = ("allgather", "ring")

PartialFn = Callable[[Prepared, Prepared], Partial]


def make_mesh(
    num_devices: int | None = None, axis_name: str = "particles", *, devices=None
) -> Mesh:
    """A 1-D mesh over the first ``num_devices`` devices (default: all of them).

    Args:
      num_devices: how many devices, ``1 <= num_devices <= len(devices)``;
        ``None`` for all.
      axis_name: the name of the mesh's one axis.
      devices: the devices to take them from (default: ``jax.devices()``).

    Returns:
      A ``jax.sharding.Mesh`` with the one axis ``axis_name``.

    Raises:
      ValueError: ``num_devices`` out of range.
    """
    devices = list(jax.devices() if devices is None else devices)
    if num_devices is None:
        num_devices = len(devices)
    check_int(num_devices, "num_devices", minimum=1, maximum=len(devices))
    return Mesh(np.array(devices[:num_devices]), (axis_name,))


def particle_axis(mesh: Mesh, axis_name: str | None = None) -> str:
    """The particle axis of ``mesh``.

    Args:
      mesh: a ``jax.sharding.Mesh``.
      axis_name: the particle axis's name, or ``None`` for the mesh's only axis.

    Returns:
      The axis name.

    Raises:
      ValueError: ``axis_name`` is not an axis of ``mesh``, or is ``None`` for a
        mesh of several axes.
    """
    if axis_name is None:
        if len(mesh.axis_names) != 1:
            raise ValueError(
                "axis_name must name the particle axis of a mesh with axes "
                f"{tuple(mesh.shape)}; got None."
            )
        return mesh.axis_names[0]
    if axis_name not in mesh.shape:
        raise ValueError(
            f"axis_name {axis_name!r} is not an axis of the mesh; its axes are "
            f"{tuple(mesh.shape)}."
        )
    return axis_name


def shard_ensemble(
    positions: ArrayLike, mesh: Mesh, axis_name: str = "particles"
) -> Array:
    """Place an array with leading particle axis (``(N, ...)``) split over ``mesh``.

    Any per-particle array (positions ``(N, d)``, log densities ``(N,)``, a
    whole sampler state via ``jax.tree.map``) can be placed this way; ``N``
    must be a multiple of the mesh size (``ValueError`` otherwise: pad the
    ensemble, or let :func:`ensemble_force_sharded` pad per call).

    Args:
      positions: an array of shape ``(N, ...)``.
      mesh: the ``jax.sharding.Mesh``.
      axis_name: the mesh axis of the particles.

    Returns:
      The array placed on ``mesh``, split along its first axis.

    Raises:
      ValueError: ``N`` is not a multiple of the number of devices on the axis,
        or ``axis_name`` is not an axis of ``mesh``.
    """
    arr = positions if isinstance(positions, jax.Array) else jnp.asarray(positions)
    size = int(mesh.shape[particle_axis(mesh, axis_name)])
    if arr.ndim < 1 or arr.shape[0] % size:
        raise ValueError(
            f"positions must have a leading particle axis divisible by the {size} "
            f"devices of the mesh; got shape {tuple(arr.shape)}."
        )
    spec = P(axis_name, *([None] * (arr.ndim - 1)))
    return jax.device_put(arr, NamedSharding(mesh, spec))


def ensemble_force_sharded(
    x: ArrayLike,
    f: ArrayLike,
    log_p: ArrayLike,
    eta: ArrayLike,
    *,
    partial_fn: PartialFn,
    w: ArrayLike | None = None,
    r2: ArrayLike | None = None,
    mesh: Mesh | None = None,
    axis_name: str | None = None,
    strategy: str = "allgather",
    spatial_sort: bool = False,
) -> PairwiseForce:
    """The pair sums with the particles sharded over ``mesh``.

    Args:
      x, f, log_p, eta, w, r2: ``x: (N, d)``, ``f, log_p: (N,)``, ``w: (N, d)``
        with ``r2`` (both or neither), as in ``pairwise.ensemble_force``.
        Already sharded inputs are used in place; others are split by the call.
      partial_fn: ``(rows: Prepared, cols: Prepared) -> Partial``, the local
        computation. It is a static argument of the compiled program: pass
        the same object on repeated calls, or each call compiles anew.
      mesh: a mesh (default: :func:`make_mesh` over all devices).
      axis_name: the mesh axis of the particles (default: the mesh's only axis).
      strategy: ``"allgather"`` or ``"ring"`` (module docstring).
      spatial_sort: all-gather only: sort the gathered ensemble spatially and
        give each device a run of it (module docstring, "Block-sparse"; for a
        block-sparse ``partial_fn``).

    Returns:
      :class:`~.algebra.PairwiseForce` ``(force_sum (N, d), n_r2, n_ball)``,
      sharded like ``x`` along the particle axis.
    """
    x, f, log_p, w = check_pair_inputs(x, f, log_p, eta, w, r2)
    check_choice(strategy, "strategy", STRATEGIES)
    check_callable(
        partial_fn, "partial_fn", "(rows: Prepared, cols: Prepared) -> Partial"
    )
    check_bool(spatial_sort, "spatial_sort")
    if spatial_sort and strategy != "allgather":
        raise ValueError(
            "spatial_sort=True needs strategy 'allgather' (a ring never holds the "
            f"whole ensemble to sort); got strategy {strategy!r}."
        )
    mesh = make_mesh() if mesh is None else mesh
    dtype = x.dtype
    return _sharded(
        x,
        f,
        log_p,
        jnp.asarray(eta, dtype),
        w,
        None if r2 is None else jnp.asarray(r2, dtype),
        partial_fn=partial_fn,
        mesh=mesh,
        axis_name=particle_axis(mesh, axis_name),
        strategy=strategy,
        spatial_sort=bool(spatial_sort),
    )


@functools.partial(
    jax.jit,
    static_argnames=("partial_fn", "mesh", "axis_name", "strategy", "spatial_sort"),
)
def _sharded(
    x,
    f,
    log_p,
    eta,
    w,
    r2,
    *,
    partial_fn,
    mesh,
    axis_name,
    strategy,
    spatial_sort=False,
):
    n, d = x.shape
    num = int(mesh.shape[axis_name])
    n_pad = -(-n // num) * num
    if n_pad != n:
        # Padding particles are invalid (NaN f, log p, w): no one's neighbour.
        extra = n_pad - n
        x = jnp.concatenate([x, jnp.zeros((extra, d), x.dtype)])
        f = jnp.concatenate([f, jnp.full((extra,), jnp.nan, f.dtype)])
        log_p = jnp.concatenate([log_p, jnp.full((extra,), jnp.nan, log_p.dtype)])
        if w is not None:
            w = jnp.concatenate([w, jnp.full((extra, d), jnp.nan, w.dtype)])
    ax = axis_name

    def per_device(x, f, log_p, w, eta, r2):
        if strategy == "allgather":
            # Every device prepares the whole gathered ensemble, as one device
            # would (same centre, same operands), and takes its rows from it.
            gathered = jax.tree.map(
                lambda a: lax.all_gather(a, ax, tiled=True), (x, f, log_p, w)
            )
            everyone = prepare(*gathered[:3], eta, gathered[3], r2)
            if spatial_sort:
                perm, everyone = sort_spatially(everyone)
            start = lax.axis_index(ax) * x.shape[0]
            mine = jax.tree.map(
                lambda a: lax.dynamic_slice_in_dim(a, start, x.shape[0]), everyone
            )
            out = finish(partial_fn(mine, everyone), mine, n)
            if spatial_sort:
                # the rows of a run of the sorted order: gather them all, unsort, keep
                # this device's
                out = unsort(
                    PairwiseForce(*(lax.all_gather(a, ax, tiled=True) for a in out)),
                    perm,
                )
                out = [lax.dynamic_slice_in_dim(a, start, x.shape[0]) for a in out]
            return tuple(out)
        # Ring: centre on the GLOBAL mean of the valid particles: every device
        # must use the same centre, or rows and visiting columns would not be
        # in the same coordinates.
        valid, valid_w = validity(x, f, log_p, w)

        def centre(v, ok):
            count = jnp.maximum(lax.psum(jnp.sum(ok, dtype=v.dtype), ax), 1)
            return lax.psum(centre_terms(v, ok, count), ax)

        mine = prepare(
            x,
            f,
            log_p,
            eta,
            w,
            r2,
            centre_x=centre(x, valid),
            centre_w=None if w is None else centre(w, valid_w),
        )
        # Block k visits device k, k+1, ...; the send of the next block
        # does not depend on this step's compute and can overlap it.
        perm = [(k, (k + 1) % num) for k in range(num)]

        def step(_, carry):
            part, block = carry
            nxt = jax.tree.map(lambda a: lax.ppermute(a, ax, perm), block)
            return combine(part, partial_fn(mine, block)), nxt

        empty = empty_partial(mine.x.shape[0], d + 1, mine.x.dtype)
        part, last = lax.fori_loop(0, num - 1, step, (empty, mine))
        part = combine(part, partial_fn(mine, last))
        return tuple(finish(part, mine, n))

    row = P(ax)
    in_specs = (
        P(ax, None),
        row,
        row,
        None if w is None else P(ax, None),
        P(),
        None if r2 is None else P(),
    )
    out = jax.shard_map(
        per_device,
        mesh=mesh,
        in_specs=in_specs,
        out_specs=(P(ax, None), row, row),
        check_vma=False,
    )(x, f, log_p, w, eta, r2)
    if n_pad != n:
        # Cutting the padding off changes the layout; XLA picks it (typically
        # replicated). Keep N a multiple of the device count to avoid this.
        return PairwiseForce(*(o[:n] for o in out))
    return PairwiseForce(*out)
