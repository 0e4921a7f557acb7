"""The log density at every row of a batch, as one compiled program.

Called eagerly, ``jax.vmap(logdensity_fn)(x)`` compiles each of the model's
operations as a program of its own (a model of a few hundred operations then spends
seconds compiling where one jitted program takes a fraction of that); under
``jax.jit`` it is one program, compiled once per function and shape. ``jax.jit``
takes the function as a static argument, which must be hashable: a callable that
cannot be hashed is run eagerly instead.
"""

from __future__ import annotations

from functools import partial

import jax

from cenlmc_jax.types import Array, LogDensityFn

__all__ = ["batch_logdensity"]


@partial(jax.jit, static_argnums=1)
def _jitted(x: Array, logdensity_fn: LogDensityFn) -> Array:
    return jax.vmap(logdensity_fn)(x)


def batch_logdensity(x: Array, logdensity_fn: LogDensityFn) -> Array:
    """``log π`` at each row of ``x``: one jitted program where the function is
    hashable, else an eager ``jax.vmap``.

    Args:
      x: ``(n, d)`` points.
      logdensity_fn: ``x -> log π(x)``, a scalar.

    Returns:
      ``(n,)`` log densities.
    """
    try:
        hash(logdensity_fn)
    except TypeError:
        return jax.vmap(logdensity_fn)(x)
    return _jitted(x, logdensity_fn)
