"""The log density at every row of a batch, as one compiled program.

Called eagerly, ``jax.vmap(logdensity_fn)(x)`` compiles each of the model's
operations as a program of its own (a model of a few hundred operations then spends
seconds compiling where one jitted program takes a fraction of that); under
``jax.jit`` it is one program, compiled once per function and shape. ``jax.jit``
takes the function as a static argument, which must be hashable: a callable that
cannot be hashed is run eagerly instead.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from cenlmc_jax.types import Array, LogDensityFn

__all__ = ["batch_logdensity"]


def _values(x: Array, logdensity_fn: LogDensityFn) -> Array:
    return jax.vmap(lambda y: jnp.asarray(logdensity_fn(y), y.dtype))(x)


_jitted = jax.jit(_values, static_argnums=1)


def batch_logdensity(x: Array, logdensity_fn: LogDensityFn) -> Array:
    """``log π`` at each row of ``x``, in ``x``'s dtype: one jitted program where the
    function is hashable (one per function, shape and dtype, shared by every caller:
    the warm-up's start checks and the superchain starts' check use the same ``(N,
    d)`` program), else an eager ``jax.vmap``.

    Args:
      x: ``(n, d)`` points.
      logdensity_fn: ``x -> log π(x)``, a scalar.

    Returns:
      ``(n,)`` log densities.
    """
    try:
        hash(logdensity_fn)
    except TypeError:
        return _values(x, logdensity_fn)
    return _jitted(x, logdensity_fn)
