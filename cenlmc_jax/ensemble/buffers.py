"""Gradient buffers: true gradients at only the particles that need one (CEnLMC's saving).

CEnLMC (Algorithm 3.2) needs ``∇f(x_i)`` only at the particles that fail a test
of (3.21); EnLMC only at step 0. :func:`needed_grads` gathers those particles
and differentiates them alone, so a step costs about ``count`` gradients, not N.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax import lax

from cenlmc_jax.types import Array

__all__ = ["GRAD_BUCKETS", "needed_grads"]

#: With ``grad_capacity=None`` one gradient call per step is sized to the next of
#: these fractions of N above the number of particles that need a gradient.
GRAD_BUCKETS = 8


def needed_grads(grad_one: Callable, x: Array, need: Array, capacity: int | None, dense: bool):
    """Gradient (``grad_one: (d,) -> (d,)``) at the particles with ``need``; zeros elsewhere.

    Returns ``(grad (N, d), num_computed ())``. The flagged indices are
    compacted to the front (``jnp.nonzero(size=N)``); only those particles are
    differentiated, in one of two batchings:

    * ``capacity=None`` (default): ONE vmapped call per step on the first
      ``B`` compacted particles, ``B`` the smallest of ``ceil(N·k/8)``, k = 1..8,
      that holds them all (``lax.switch`` over the 8 sizes, plus a branch for
      none): at most N/8 padding, and one call, which is what a black-box model
      with a fixed cost per call needs.
    * ``capacity=C``: buffers of C particles, a bounded ``lax.scan`` of
      ``lax.cond``s running ``ceil(count / C)`` calls (padding < C).

    Both are reverse-differentiable (no ``while_loop``); under ``vmap`` the
    switch / cond become selects and every size is computed. Padding slots
    point to index N: they read some real particle and their result is
    dropped. ``dense=True`` is the debugging reference: every gradient, then a mask.
    """
    n, _ = x.shape
    grad_fn = jax.vmap(grad_one)
    if dense:
        return jnp.where(need[:, None], grad_fn(x), 0.0), jnp.asarray(n, jnp.int32)
    idx = jnp.nonzero(need, size=n, fill_value=n)[0].astype(jnp.int32)
    count = jnp.sum(need, dtype=jnp.int32)

    def gradients_at(g, ids):
        xs = x[jnp.minimum(ids, n - 1)]
        return g.at[ids].set(grad_fn(xs).astype(g.dtype), mode="drop")

    zeros = jnp.zeros_like(x)
    if capacity is None:
        sizes = sorted({-(-n * k // GRAD_BUCKETS) for k in range(1, GRAD_BUCKETS + 1)})
        branches = [lambda g: g] + [functools.partial(lambda b, g: gradients_at(g, idx[:b]), b) for b in sizes]
        which = jnp.searchsorted(jnp.asarray([0] + sizes, jnp.int32), count, side="left").astype(jnp.int32)
        return lax.switch(which, branches, zeros), jnp.asarray([0] + sizes, jnp.int32)[which]
    num_buffers_max = -(-n // capacity)
    idx = jnp.concatenate([idx, jnp.full((num_buffers_max * capacity - n,), n, jnp.int32)])
    num_buffers = (count + capacity - 1) // capacity

    def buffer(g, b):
        ids = lax.dynamic_slice(idx, (b * capacity,), (capacity,))
        return lax.cond(b < num_buffers, lambda g: gradients_at(g, ids), lambda g: g, g), None

    grad, _ = lax.scan(buffer, zeros, jnp.arange(num_buffers_max, dtype=jnp.int32))
    return grad, num_buffers * capacity

