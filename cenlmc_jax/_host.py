"""Pulling results to the host, on one process or several (``jax.distributed``).

With several processes (one per host, ``jax.distributed.initialize``), a sharded
array holds only this process's shards: ``np.asarray`` on it raises
("Fetching value for jax.Array that spans non-addressable devices"). Every
place that brings a result to the host (the summary, the ArviZ export, the
checkpoint, the checks of a starting ensemble) goes through :func:`fetch`,
which all-gathers such arrays first (``multihost_utils.process_allgather``:
a collective, so every process must call it, in the same order, as SPMD code
does anyway), and returns NumPy arrays. On one process it is
``jax.device_get``.

Files and messages come from one process: :func:`is_writer` is True on
process 0 only, which writes checkpoints and prints progress and warnings
(:func:`warn`). :func:`gather` gathers only what spans processes and leaves
the rest on the device (the driver's checks of every chunk).
"""

from __future__ import annotations

import warnings
from typing import Any

import jax
import numpy as np
from jax._src import xla_bridge

__all__ = [
    "backends_started",
    "fetch",
    "gather",
    "is_writer",
    "spans_processes",
    "warn",
]


def backends_started() -> bool:
    """Whether JAX's backends have started (its CPU client's thread pool is then fixed).

    Returns:
      True once any computation, ``jax.devices()`` or the like has started them.
    """
    started = getattr(xla_bridge, "backends_are_initialized", None)
    return True if started is None else bool(started())


def spans_processes(x: Any) -> bool:
    """Whether ``x`` is a ``jax.Array`` with shards on another process.

    Args:
      x: any pytree leaf.

    Returns:
      True for a concrete ``jax.Array`` that is not fully addressable here (a
      tracer, a NumPy array or a Python object gives False).
    """
    # a tracer (inside jit, grad, vmap) has no shards yet: nothing to gather
    return (
        isinstance(x, jax.Array)
        and not isinstance(x, jax.core.Tracer)
        and not x.is_fully_addressable
    )


def _leaf(x: Any) -> Any:
    if spans_processes(x):
        from jax.experimental import (
            multihost_utils,
        )  # imported only where several processes run

        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            impl = jax.random.key_impl(x)
            data = multihost_utils.process_allgather(jax.random.key_data(x), tiled=True)
            return jax.random.wrap_key_data(np.asarray(data), impl=impl)
        return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    if (
        isinstance(x, jax.Array)
        and not isinstance(x, jax.core.Tracer)
        and not jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)
    ):
        return np.asarray(jax.device_get(x))
    return x


def fetch(tree: Any) -> Any:
    """``tree`` with every array leaf on the host, gathered across processes.

    Args:
      tree: a pytree of arrays (and other leaves).

    Returns:
      The same pytree with every ``jax.Array`` leaf as a NumPy array (keys stay
      keys, gathered; tracers and non-array leaves untouched).
    """
    return jax.tree_util.tree_map(_leaf, tree)


def gather(tree: Any) -> Any:
    """``tree`` with only the arrays that span processes gathered.

    Args:
      tree: a pytree of arrays (and other leaves).

    Returns:
      The same pytree, with the leaves that span processes as NumPy arrays and the
      rest untouched (on device).
    """
    return jax.tree_util.tree_map(lambda x: _leaf(x) if spans_processes(x) else x, tree)


def warn(message: str, category: type = RuntimeWarning, stacklevel: int = 2) -> None:
    """``warnings.warn`` on the writing process only.

    One message per run, not one per process.

    Args:
      message: the warning's text.
      category: the warning class (default ``RuntimeWarning``).
      stacklevel: as for ``warnings.warn``, counted from the caller of this function.
    """
    if is_writer():
        warnings.warn(message, category, stacklevel=stacklevel + 1)


def is_writer() -> bool:
    """Whether this is the one process that writes files and prints.

    Returns:
      True on process 0 (always True on one process).
    """
    return jax.process_index() == 0
