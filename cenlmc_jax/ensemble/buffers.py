"""Gradient buffers: true gradients at only the particles that need one.

CEnLMC's saving. CEnLMC (Algorithm 3.2) needs ``∇f(x_i)`` only at the particles
that fail a test of (3.21); EnLMC only at step 0. :func:`needed_grads` gathers
those particles and differentiates them alone, so a step costs about ``count``
gradients, not N.

With a device mesh (``EnsembleOptions.mesh``) each device compacts and
differentiates the particles it owns (:func:`sharded_needed_grads`), so the
gradient work per device is about ``1/P`` of the work of one device.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

from cenlmc_jax.pairwise.sharded import particle_axis
from cenlmc_jax.types import Array

__all__ = [
    "GRAD_BUCKETS",
    "needed_grads",
    "sharded_needed_grads",
    "shard_capacity",
    "values_and_needed_grads",
]

#: With ``grad_capacity=None`` one gradient call per step is sized to the next of
#: these fractions of N above the number of particles that need a gradient. A padded
#: row costs a black-box model a full evaluation (the callback evaluates every row it
#: is sent), but each size is one more branch of the switch to compile (and, under
#: ``vmap``, to run): 16 halved the padding, but the black-box SIR step was not
#: measurably faster and compiled more slowly (issue 30, item 3).
GRAD_BUCKETS = 8


def needed_grads(
    grad_one: Callable,
    x: Array,
    need: Array,
    capacity: int | None,
    dense: bool,
    mesh=None,
    values: Array | None = None,
):
    """Gradients at the particles with ``need``; zeros elsewhere.

    The flagged indices are compacted to the front (``jnp.nonzero(size=N)``); only
    those particles are differentiated, in one of two batchings:

    * ``capacity=None`` (default): ONE vmapped call per step on the first
      ``B`` compacted particles, ``B`` the smallest of ``ceil(N·k/G)``, k = 1..G
      (``G`` = :data:`GRAD_BUCKETS`), that holds them all (``lax.switch`` over the
      G sizes, plus a branch for none): at most N/G padding, and one call, which
      is what a black-box model with a fixed cost per call needs.
    * ``capacity=C``: buffers of C particles, a bounded ``lax.scan`` of
      ``lax.cond`` s running ``ceil(count / C)`` calls (padding < C).

    Both are reverse-differentiable (no ``while_loop``); under ``vmap`` the
    switch / cond become selects and every size is computed. Padding slots
    point to index N: they read some real particle and their result is
    dropped.

    Args:
      grad_one: ``(d,) -> (d,)``, or ``(x_i (d,), value_i ()) -> (d,)`` when
        ``values`` is given (a finite-difference gradient reuses the value).
      x: the particles, ``(N, d)``.
      need: ``(N,)`` bool, the particles to differentiate.
      capacity: ``None`` (one bucketed call) or the buffer size ``C``.
      dense: the debugging reference: every gradient, then a mask.
      mesh: a 1-D device mesh: each device does this for its own particles
        (:func:`sharded_needed_grads`; with ``dense=True`` XLA splits the vmap
        itself).
      values: ``(N,)`` the log density at ``x``, known already.

    Returns:
      ``(grad (N, d), num_computed ())``: the gradients (zeros where not needed)
      and the gradients computed, padding included.
    """
    if mesh is not None and not dense:
        return sharded_needed_grads(grad_one, x, need, capacity, mesh, values)
    n, _ = x.shape
    rows = (x,) if values is None else (x, values)
    grad_fn = jax.vmap(grad_one)
    if dense:
        return jnp.where(need[:, None], grad_fn(*rows), 0.0), jnp.asarray(n, jnp.int32)
    idx = jnp.nonzero(need, size=n, fill_value=n)[0].astype(jnp.int32)
    count = jnp.sum(need, dtype=jnp.int32)

    def gradients_at(g, ids):
        at = jnp.minimum(ids, n - 1)
        return g.at[ids].set(
            grad_fn(*(r[at] for r in rows)).astype(g.dtype), mode="drop"
        )

    zeros = jnp.zeros_like(x)
    if capacity is None:
        return _one_bucketed_call(
            need, lambda ids: gradients_at(zeros, ids), lambda: zeros
        )
    num_buffers_max = -(-n // capacity)
    idx = jnp.concatenate(
        [idx, jnp.full((num_buffers_max * capacity - n,), n, jnp.int32)]
    )
    num_buffers = (count + capacity - 1) // capacity

    def buffer(g, b):
        ids = lax.dynamic_slice(idx, (b * capacity,), (capacity,))
        return lax.cond(
            b < num_buffers, lambda g: gradients_at(g, ids), lambda g: g, g
        ), None

    grad, _ = lax.scan(buffer, zeros, jnp.arange(num_buffers_max, dtype=jnp.int32))
    return grad, num_buffers * capacity


def bucket_sizes(n: int, buckets: int = GRAD_BUCKETS) -> list:
    """The call sizes of the default batching: ``ceil(n·k/G)``, k = 1..G, distinct.

    Args:
      n: the number of particles.
      buckets: ``G``.

    Returns:
      The sizes, ascending.
    """
    return sorted({-(-n * k // buckets) for k in range(1, buckets + 1)})


def values_and_needed_grads(grad_fn: Callable, x: Array, need: Array):
    """The values at every particle and the gradients where ``need``, in ONE call.

    ``grad_fn.values_and_grads(x, rows)`` (a finite-difference gradient,
    :meth:`cenlmc_jax.gradients.finite_difference`) evaluates the ``N`` particles
    and the shifted points of ``rows`` in one batched call of the model, so a model
    with a fixed cost per call pays it once. ``rows`` are the flagged particles,
    compacted as in :func:`needed_grads` (``capacity=None``): the smallest bucket
    of :func:`bucket_sizes` that holds them, ``lax.switch`` over the sizes and a
    branch with none (the values alone).

    Args:
      grad_fn: a gradient with ``values_and_grads``.
      x: the particles, ``(N, d)``.
      need: ``(N,)`` bool, the particles to differentiate.

    Returns:
      ``(values (N,), grad (N, d), num_computed ())``: the log density at every
      particle, the gradients (zeros where not needed) and the gradients
      computed, padding included.
    """
    n, _ = x.shape

    def call(ids):
        values, g = grad_fn.values_and_grads(x, jnp.minimum(ids, n - 1))
        grad = jnp.zeros_like(x).at[ids].set(g.astype(x.dtype), mode="drop")
        return values.astype(x.dtype), grad

    (values, grad), computed = _one_bucketed_call(
        need, call, lambda: call(jnp.zeros((0,), jnp.int32))
    )
    return values, grad, computed


def _one_bucketed_call(need: Array, call: Callable, none: Callable):
    """``call(ids)`` on the flagged indices, compacted and padded to a bucket.

    ``ids`` are the first ``B`` of ``jnp.nonzero(need, size=N, fill_value=N)``,
    ``B`` the smallest of :func:`bucket_sizes` that holds them all (``lax.switch``
    over the sizes); ``none()`` where nothing is flagged.

    Returns:
      ``(call's result, B ())``.
    """
    n = need.shape[0]
    idx = jnp.nonzero(need, size=n, fill_value=n)[0].astype(jnp.int32)
    count = jnp.sum(need, dtype=jnp.int32)
    sizes = [0] + bucket_sizes(n)
    branches = [lambda _: none()] + [
        functools.partial(lambda b, _: call(idx[:b]), b) for b in sizes[1:]
    ]
    which = jnp.searchsorted(jnp.asarray(sizes, jnp.int32), count, side="left")
    which = which.astype(jnp.int32)
    return lax.switch(which, branches, None), jnp.asarray(sizes, jnp.int32)[which]


def shard_capacity(capacity: int | None, n_local: int, num_devices: int) -> int | None:
    """The per-device buffer size of a sharded step: ``min(ceil(C / P), N / P)``.

    Args:
      capacity: ``C``, or None.
      n_local: ``N / P``, the rows a device owns.
      num_devices: ``P``.

    Returns:
      The per-device size (None stays None).
    """
    return None if capacity is None else min(-(-capacity // num_devices), n_local)


def sharded_needed_grads(
    grad_one: Callable,
    x: Array,
    need: Array,
    capacity: int | None,
    mesh,
    values: Array | None = None,
):
    """:func:`needed_grads` with the particles split over ``mesh``: each device its own.

    By ``jax.shard_map``. Device ``k`` owns rows ``[k N/P, (k+1) N/P)`` (as the
    sharded pair force, :mod:`cenlmc_jax.pairwise.sharded`) and compacts and
    differentiates only the flagged ones among them, with the single-device
    batching applied to its ``N/P`` rows: ``capacity=None``: one call on the
    smallest of ``ceil((N/P)·k/G)`` rows that holds its ``count_k``;
    ``capacity=C``: buffers of ``c = min(ceil(C/P), N/P)`` rows,
    ``ceil(count_k / c)`` calls. Per device that is ``1/P`` of the gradient shapes
    of one device, and every flagged particle still gets its gradient: a device
    holding more than its share of the flagged particles runs a larger bucket or
    more buffers (there is no overflow that drops a gradient, on one device or
    several).

    The gradients are those of one device whenever ``grad_one`` at a particle
    does not depend on the batch it rides in (bitwise equal on CPU for autodiff
    and explicit gradients). What differs is the padding count: the returned
    ``num_computed`` is ``Σ_k`` (device k's bucket, or its buffers × c), not one
    device's figure (it may be larger or smaller). N not a multiple of P: the
    ensemble is padded per call with particles that need nothing (their rows are
    cut off again).

    Args:
      grad_one: as for :func:`needed_grads`.
      x: the particles, ``(N, d)``.
      need: ``(N,)`` bool.
      capacity: ``None`` or the buffer size ``C`` (split over the devices).
      mesh: a 1-D device mesh.
      values: as for :func:`needed_grads`.

    Returns:
      ``(grad (N, d), num_computed ())``.
    """
    axis = particle_axis(mesh)
    num = int(mesh.shape[axis])
    n, d = x.shape
    plain = values is None
    n_pad = -(-n // num) * num
    values = jnp.zeros((n,), x.dtype) if values is None else values
    if n_pad != n:
        x = jnp.concatenate([x, jnp.zeros((n_pad - n, d), x.dtype)])
        need = jnp.concatenate([need, jnp.zeros((n_pad - n,), bool)])
        values = jnp.concatenate([values, jnp.zeros((n_pad - n,), values.dtype)])
    local_capacity = shard_capacity(capacity, n_pad // num, num)

    def per_device(x, need, values):
        grad, computed = needed_grads(
            grad_one, x, need, local_capacity, False, values=None if plain else values
        )
        return grad, lax.psum(computed, axis)

    grad, computed = jax.shard_map(
        per_device,
        mesh=mesh,
        in_specs=(P(axis, None), P(axis), P(axis)),
        out_specs=(P(axis, None), P()),
        check_vma=False,
    )(x, need, values)
    return (grad if n_pad == n else grad[:n]), computed
