"""Keys for host-side loops, without a compilation per count; normal draws that
compile faster.

The warm-up's Python code walks through keys (``next(keys)``). Iterating over
``jax.random.split(key, n)`` compiles JAX's ``unstack`` for each ``n``, and the split
itself compiles once per ``n``: five counts cost about 1 s of compilation on a
2-core CPU, a sixth of a small model's whole warm-up. :func:`split_keys` gives the
same keys, bit for bit, from one split of :data:`BLOCK` keys (with JAX's
partitionable threefry, the default, the ``i``-th key of a split does not depend on
the count) read on the host, so every count shares one compiled program and the
unstacking compiles nothing.

:func:`normal` draws ``jax.random.normal(key, shape)`` as a flat vector reshaped: the
same numbers (threefry counts the flattened index either way), but XLA's CPU compiler
takes several times longer over the counters of a 2-D shape than over a flat one
(benchmarks/results/compile_scale.md), and every program of the warm-up draws an
``(N, d)`` momentum or noise each step.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["BLOCK", "split_keys", "normal"]

#: Keys drawn in one split (the most the warm-up asks for at once).
BLOCK = 64


def _prefix_stable(key: Any) -> bool:
    """Whether ``split(key, m)[:n] == split(key, n)`` for this key's generator."""
    if not jax.config.jax_threefry_partitionable:
        return False
    if jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
        return str(jax.random.key_impl(key)) in ("threefry2x32", "fry")
    return jax.config.jax_default_prng_impl == "threefry2x32"


def split_keys(key: Any, n: int) -> list:
    """``list(jax.random.split(key, n))``, the same keys, computed without compiling
    a program for each ``n`` (module docstring).

    Args:
      key: a typed key or a legacy ``uint32`` key, one key (not a batch).
      n: how many keys.

    Returns:
      A list of ``n`` keys of ``key``'s kind.
    """
    m = max(n, BLOCK) if _prefix_stable(key) else n
    keys = jax.random.split(key, m)
    if jax.dtypes.issubdtype(keys.dtype, jax.dtypes.prng_key):
        impl = jax.random.key_impl(key)
        data = np.asarray(jax.random.key_data(keys))
        return [jax.random.wrap_key_data(data[i], impl=impl) for i in range(n)]
    data = np.asarray(keys)
    return [jnp.asarray(data[i]) for i in range(n)]


def normal(key: Any, shape: tuple, dtype: Any = None) -> jax.Array:
    """``jax.random.normal(key, shape, dtype)``, the same numbers, drawn flat and
    reshaped (module docstring: it compiles faster).

    Args:
      key: a typed key or a legacy ``uint32`` key.
      shape: the draw's shape.
      dtype: a float dtype (JAX's default float when None).

    Returns:
      An array of ``shape``.
    """
    shape = tuple(shape)
    size = int(np.prod(shape, dtype=np.int64))
    if dtype is None:
        return jax.random.normal(key, (size,)).reshape(shape)
    return jax.random.normal(key, (size,), dtype).reshape(shape)
