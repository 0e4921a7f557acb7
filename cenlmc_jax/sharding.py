"""The ensemble force with the particles sharded over several devices.

The ensemble ``x: (N, d)`` is split over a 1-D device mesh along its particle
axis (``PartitionSpec(axis_name)``): device ``k`` owns ``N/P`` particles and
computes, for those particles only, the pair sums of
``cenlmc_jax.pairwise.ensemble_force`` (spec sections 2-4)

    force_sum_i = Σ_{j≠i} W_ij (x_j - x_i),   n_r2_i,   n_ball_i,

against *all* ``N`` particles. Per-particle work (gradients, noise, the
``w`` / ``x`` updates of the sampler) then stays on the device that owns the
particle; only the pair sums need the other devices' particles. Two ways to
bring them (``strategy=``):

``"allgather"`` (default): one ``all_gather`` of the per-particle inputs
    (centred ``x``, ``f``, ``log p``, ``w``: ``(d + d_w + 5) N`` numbers) to
    every device, then one local rows-against-all-columns computation. One
    collective per call, the simplest schedule, and the compute runs as one
    long kernel. Costs ``O(N d)`` memory per device: ``10^7`` particles with
    ``d = 10`` are about 1 GB in float32, fine on any accelerator, which is
    why it is the default.
``"ring"``: ``P - 1`` ``ppermute`` steps pass the column blocks around a ring
    (as in ring attention); each device combines the partial sums of its rows
    against each block as it arrives, with the same rescale as flash attention
    (:func:`cenlmc_jax.pairwise_pallas.combine`). ``O(N d / P)`` memory per
    device and the transfer of the next block can overlap the compute of the
    current one. For ensembles whose gathered inputs do not fit a device.

Both strategies are exact re-orderings of the same sums: they agree with a
single-device computation up to float rounding of the summation order (and
of the global mean used for centring, computed with ``psum``).

``N`` need not be divisible by the number of devices: the ensemble is padded
with invalid particles (``f = NaN``: they contribute nothing and are no one's
neighbour) to the next multiple and the result is cut back to ``N`` rows.
That padding is a re-layout on every call and the cut result is no longer
split evenly (XLA returns it replicated): keep ``N`` a multiple of the device
count in a long run (:func:`shard_ensemble` insists on it). With such an
``N`` the result is sharded like ``x``.

The local rows-against-columns work is :func:`local_partial`: the Pallas
kernel of :mod:`cenlmc_jax.pairwise_pallas` on GPU, and otherwise an XLA
version of the same tile algorithm (row blocks mapped, column blocks scanned,
the log weights rescaled online per row), never holding more than a
``block_rows × block_cols`` tile.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from cenlmc_jax._validation import check_int
from cenlmc_jax.pairwise import DIRECT_MAX_D, PairwiseForce
from cenlmc_jax.pairwise_pallas import (
    _NEG,
    _VALID_ALL,
    _VALID_W,
    KernelOptions,
    Partial,
    Prepared,
    check_inputs,
    coincident_rtol,
    combine,
    empty_partial,
    finish,
    kernel_options,
    masked_sum,
    pallas_partial,
    prepare,
    validity,
)
from cenlmc_jax.types import Array, ArrayLike

__all__ = [
    "make_mesh",
    "shard_ensemble",
    "ensemble_force_sharded",
    "local_partial",
    "xla_partial",
    "STRATEGIES",
]

STRATEGIES = ("allgather", "ring")
#: Elements of one (block_rows, block_cols) temporary of the XLA tile loop
#: when block_cols is not given: 1 MiB in float32 (a dozen such live at
#: once); 512 x 512 was the fastest of five shapes tried on a 2-core CPU.
TILE_ELEMENTS = 2**18


def make_mesh(num_devices: int | None = None, axis_name: str = "particles", *, devices=None) -> Mesh:
    """A 1-D mesh over the first ``num_devices`` devices (default: all of them)."""
    devices = list(jax.devices() if devices is None else devices)
    if num_devices is None:
        num_devices = len(devices)
    check_int(num_devices, "num_devices", minimum=1, maximum=len(devices))
    return Mesh(np.array(devices[:num_devices]), (axis_name,))


def _axis_size(mesh: Mesh, axis_name: str) -> int:
    if axis_name not in mesh.shape:
        raise ValueError(f"axis_name {axis_name!r} is not an axis of the mesh; its axes are {tuple(mesh.shape)}.")
    return int(mesh.shape[axis_name])


def shard_ensemble(positions: ArrayLike, mesh: Mesh, axis_name: str = "particles") -> Array:
    """Place an array with leading particle axis (``(N, ...)``) split over ``mesh``.

    Any per-particle array (positions ``(N, d)``, log densities ``(N,)``, a
    whole sampler state via ``jax.tree.map``) can be placed this way; ``N``
    must be a multiple of the mesh size (``ValueError`` otherwise: pad the
    ensemble, or let :func:`ensemble_force_sharded` pad per call).
    """
    arr = positions if isinstance(positions, jax.Array) else jnp.asarray(positions)
    size = _axis_size(mesh, axis_name)
    if arr.ndim < 1 or arr.shape[0] % size:
        raise ValueError(
            f"positions must have a leading particle axis divisible by the {size} devices of the mesh; "
            f"got shape {tuple(arr.shape)}."
        )
    spec = P(axis_name, *([None] * (arr.ndim - 1)))
    return jax.device_put(arr, NamedSharding(mesh, spec))


# ----------------------------------------------------------------------- local


def xla_partial(
    rows: Prepared,
    cols: Prepared,
    *,
    block_rows: int | None = None,
    block_cols: int | None = None,
    distances: str | None = None,
    precision: Any = lax.Precision.HIGHEST,
) -> Partial:
    """Pair sums of ``rows`` over ``cols`` in XLA, tile by tile (the Pallas kernel's algorithm).

    ``lax.map`` over blocks of ``block_rows`` rows, ``lax.scan`` over blocks
    of ``block_cols`` columns; per tile the masks, the weights with the
    running per-row maximum of ``log s_j``, and the force as in
    ``pairwise_pallas._force_kernel``. Temporaries: a few
    ``(block_rows, block_cols)`` arrays. ``distances``: ``"direct"`` (exact
    differences, one pass per coordinate) or ``"gram"`` (matrix products at
    ``precision``); None takes ``"direct"`` for ``d <= 2`` as
    ``pairwise.ensemble_force`` does.

    Cost: the per-row rescale takes one ``exp`` per pair (``pairwise``'s
    tiled method takes ``N``, with one global shift), so on a CPU this is
    2-3 times slower than ``pairwise.ensemble_force(method="tiled")``; it
    stays exact when the log weights of the ensemble spread over more than
    the float range (large ``d``, a diverging EnLMC), where a global shift
    underflows the rows that do not see the heaviest particles.
    """
    n_rows, d = rows.x.shape
    n_cols = cols.x.shape[0]
    dtype = rows.x.dtype
    has_w = rows.w is not None
    direct = (d <= DIRECT_MAX_D) if distances is None else distances == "direct"
    br = block_rows or min(512, n_rows)
    bc = block_cols or max(1, min(n_cols, TILE_ELEMENTS // br))
    n_rows_pad = -(-n_rows // br) * br
    n_cols_pad = -(-n_cols // bc) * bc
    kappa = coincident_rtol(d, dtype)
    dot = functools.partial(jnp.dot, precision=precision)

    def pad(v, n_pad, value=0):
        return jnp.pad(v, [(0, n_pad - v.shape[0])] + [(0, 0)] * (v.ndim - 1), constant_values=value)

    def blocks(p: Prepared, n_pad, b, with_thr):
        keys = ["x", "sq_x", "f", "log_s", "flag", "ids"] + (["w", "sq_w"] if has_w else [])
        keys += ["w_thr"] if (has_w and with_thr) else []
        out = {}
        for k in keys:
            v = pad(getattr(p, k), n_pad, -1 if k == "ids" else 0)
            out[k] = v.reshape((n_pad // b, b) + v.shape[1:])
        return out

    def sqdist(a_i, s_i, a_j, s_j):
        if direct:
            d2 = sum((a_j[None, :, k] - a_i[:, k, None]) ** 2 for k in range(a_i.shape[1]))
            return d2, 0
        size = s_i[:, None] + s_j[None, :]
        return jnp.maximum(size - 2 * dot(a_i, a_j.T), 0), kappa * size

    def row_block(r):
        row_ok = r["flag"] >= _VALID_ALL
        row_w_ok = r["flag"] >= _VALID_W

        def col_step(carry, c):
            acc, m, nr2, nball = carry
            off_diag = r["ids"][:, None] != c["ids"][None, :]
            d2, floor = sqdist(r["x"], r["sq_x"], c["x"], c["sq_x"])
            pair = off_diag & row_ok[:, None] & (c["flag"] >= _VALID_ALL)[None, :] & (d2 <= 1)
            if has_w:
                d2w, floor_w = sqdist(r["w"], r["sq_w"], c["w"], c["sq_w"])
                close_w = (d2w <= r["w_thr"][:, None]) | (d2w <= floor_w)
                near_w = off_diag & row_w_ok[:, None] & (c["flag"] >= _VALID_W)[None, :] & close_w
                nr2 = nr2 + jnp.sum(near_w, axis=1, dtype=jnp.int32)
                pair = pair & near_w
            nball = nball + jnp.sum(pair, axis=1, dtype=jnp.int32)
            use = pair & (d2 > floor)
            logs_use = jnp.where(use, c["log_s"][None, :], _NEG)
            m_new = jnp.maximum(m, jnp.max(logs_use, axis=1))
            scale = jnp.exp(logs_use - m_new[:, None])
            weight = jnp.where(use, scale * (c["f"][None, :] - r["f"][:, None]) / jnp.where(use, d2, 1), 0)
            if direct:
                wx = jnp.stack([jnp.sum(weight * (c["x"][None, :, k] - r["x"][:, k, None]), axis=1) for k in range(d)], 1)
            else:
                wx = dot(weight, c["x"]) - jnp.sum(weight, axis=1)[:, None] * r["x"]
            acc = acc * jnp.exp(m - m_new)[:, None] + wx
            return (acc, m_new, nr2, nball), None

        init = tuple(empty_partial(br, d, dtype))
        out, _ = lax.scan(col_step, init, col_blocks)
        return out

    col_blocks = blocks(cols, n_cols_pad, bc, with_thr=False)
    acc, m, nr2, nball = lax.map(row_block, blocks(rows, n_rows_pad, br, with_thr=True))
    flat = lambda v: v.reshape((n_rows_pad,) + v.shape[2:])[:n_rows]  # noqa: E731
    return Partial(flat(acc), flat(m), flat(nr2), flat(nball))


def local_partial(rows: Prepared, cols: Prepared, local: str, opts: KernelOptions | None, block_size, block_cols):
    """Dispatch the rows-against-columns block to the Pallas kernel or the XLA tiles."""
    if local == "pallas":
        return pallas_partial(rows, cols, opts)
    return xla_partial(rows, cols, block_rows=block_size, block_cols=block_cols)


# --------------------------------------------------------------------- sharded


def ensemble_force_sharded(
    x: ArrayLike,
    f: ArrayLike,
    log_p: ArrayLike,
    eta: ArrayLike,
    *,
    w: ArrayLike | None = None,
    r2: ArrayLike | None = None,
    mesh: Mesh | None = None,
    axis_name: str = "particles",
    strategy: str = "allgather",
    block_size: int | None = None,
    block_cols: int | None = None,
    local: str = "auto",
    kernel: KernelOptions | None = None,
) -> PairwiseForce:
    """``pairwise.ensemble_force`` with the particles sharded over ``mesh``.

    Args:
      x, f, log_p, eta, w, r2: as in ``pairwise.ensemble_force``: ``x: (N, d)``,
        ``f, log_p: (N,)``, ``w: (N, d_w)`` with ``r2`` (both or neither).
        Already sharded inputs are used in place; others are split by the call.
      mesh: a mesh with axis ``axis_name`` (default: :func:`make_mesh` over
        all devices).
      strategy: ``"allgather"`` or ``"ring"`` (module docstring).
      block_size, block_cols: row / column tile of the XLA local computation
        (None: ``min(512, N/P)`` rows, columns for a ``2^18``-element tile).
      local: ``"pallas"`` (the fused kernel), ``"xla"``, or ``"auto"``
        (Pallas on GPU, XLA elsewhere).
      kernel: :class:`~cenlmc_jax.pairwise_pallas.KernelOptions` for
        ``local="pallas"`` (default ``kernel_options(d)``).

    Returns:
      :class:`~cenlmc_jax.pairwise.PairwiseForce` ``(force_sum (N, d), n_r2,
      n_ball)``, sharded like ``x`` along the particle axis.
    """
    x, f, log_p, w = check_inputs(x, f, log_p, eta, w, r2)
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {STRATEGIES}; got {strategy!r}.")
    if local not in ("auto", "xla", "pallas"):
        raise ValueError(f"local must be 'auto', 'xla' or 'pallas'; got {local!r}.")
    if block_size is not None:
        check_int(block_size, "block_size", minimum=1)
    if block_cols is not None:
        check_int(block_cols, "block_cols", minimum=1)
    mesh = make_mesh(axis_name=axis_name) if mesh is None else mesh
    _axis_size(mesh, axis_name)
    if local == "auto":
        local = "pallas" if jax.default_backend() == "gpu" else "xla"
    opts = (kernel or kernel_options(x.shape[1])) if local == "pallas" else None
    dtype = x.dtype
    return _sharded(
        x, f, log_p, jnp.asarray(eta, dtype), w, None if r2 is None else jnp.asarray(r2, dtype),
        mesh=mesh, axis_name=axis_name, strategy=strategy, local=local, opts=opts,
        block_size=block_size, block_cols=block_cols,
    )  # fmt: skip


@functools.partial(
    jax.jit, static_argnames=("mesh", "axis_name", "strategy", "local", "opts", "block_size", "block_cols")
)
def _sharded(x, f, log_p, eta, w, r2, *, mesh, axis_name, strategy, local, opts, block_size, block_cols):
    n, d = x.shape
    num = int(mesh.shape[axis_name])
    n_pad = -(-n // num) * num
    has_w = w is not None
    if n_pad != n:
        # Padding particles are invalid (NaN f, log p, w): no one's neighbour.
        extra = n_pad - n
        x = jnp.concatenate([x, jnp.zeros((extra, d), x.dtype)])
        f = jnp.concatenate([f, jnp.full((extra,), jnp.nan, f.dtype)])
        log_p = jnp.concatenate([log_p, jnp.full((extra,), jnp.nan, log_p.dtype)])
        if has_w:
            w = jnp.concatenate([w, jnp.full((extra, w.shape[1]), jnp.nan, w.dtype)])
    ids = jnp.arange(n_pad, dtype=jnp.int32)
    compute = functools.partial(local_partial, local=local, opts=opts, block_size=block_size, block_cols=block_cols)
    ax = axis_name

    def per_device(x, f, log_p, w, ids, eta, r2):
        # Centre on the GLOBAL mean of the valid particles: every device must
        # use the same centre, or the rows and the gathered columns would not
        # be in the same coordinates.
        valid, valid_w = validity(x, f, log_p, w)
        sx, cx = lax.psum(masked_sum(x, valid), ax)
        centre_w = None
        if has_w:
            sw, cw = lax.psum(masked_sum(w, valid_w), ax)
            centre_w = sw / jnp.maximum(cw, 1)
        mine = prepare(x, f, log_p, eta, w, r2, centre_x=sx / jnp.maximum(cx, 1), centre_w=centre_w, ids=ids)
        if strategy == "allgather":
            everyone = jax.tree.map(lambda a: lax.all_gather(a, ax, tiled=True), mine)
            part = compute(mine, everyone)
        else:
            # Ring: block k visits device k, k+1, ...; the send of the next
            # block does not depend on this step's compute and can overlap it.
            perm = [(k, (k + 1) % num) for k in range(num)]

            def step(_, carry):
                part, block = carry
                nxt = jax.tree.map(lambda a: lax.ppermute(a, ax, perm), block)
                return combine(part, compute(mine, block)), nxt

            part, last = lax.fori_loop(0, num - 1, step, (empty_partial(*mine.x.shape, mine.x.dtype), mine))
            part = combine(part, compute(mine, last))
        return tuple(finish(part, n, has_w))

    row = P(ax)
    in_specs = (P(ax, None), row, row, None if w is None else P(ax, None), row, P(), None if r2 is None else P())
    out = jax.shard_map(
        per_device,
        mesh=mesh,
        in_specs=in_specs,
        out_specs=(P(ax, None), row, row),
        check_vma=False,
    )(x, f, log_p, w, ids, eta, r2)
    if n_pad != n:
        # Cutting the padding off changes the layout; XLA picks it (typically
        # replicated). Keep N a multiple of the device count to avoid this.
        return PairwiseForce(*(o[:n] for o in out))
    return PairwiseForce(*out)
