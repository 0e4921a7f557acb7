"""Input checks shared by every sampler.

Every check runs in Python on concrete values, before anything is traced, and
raises ``ValueError`` naming the argument, the value given and what was
expected. Values that are already tracers (the caller jitted around us) are
checked for shape only: their values are not known yet.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np


def is_concrete(x: Any) -> bool:
    """True when ``x`` holds a value now (not a tracer inside jit/vmap/scan)."""
    return not isinstance(x, jax.core.Tracer)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def check_positions(positions: Any, name: str = "positions") -> jax.Array:
    """An ensemble must be a floating ``(N, d)`` array of finite values."""
    arr = positions if isinstance(positions, jax.Array) else jnp.asarray(positions)
    if arr.ndim != 2:
        raise ValueError(
            f"{name} must be an array of shape (N, d) (N particles in d dimensions); "
            f"got shape {tuple(arr.shape)} (ndim={arr.ndim})."
        )
    if arr.shape[0] < 1 or arr.shape[1] < 1:
        raise ValueError(f"{name} must have N >= 1 particles and d >= 1 dimensions; got shape {tuple(arr.shape)}.")
    if not jnp.issubdtype(arr.dtype, jnp.floating):
        arr = arr.astype(jnp.result_type(float))
    if is_concrete(arr) and not bool(jnp.all(jnp.isfinite(arr))):
        bad = int(jnp.sum(~jnp.all(jnp.isfinite(arr), axis=-1)))
        raise ValueError(f"{name} must be finite; {bad} of {arr.shape[0]} particles contain NaN or inf.")
    return arr


def check_position(position: Any, name: str = "position") -> jax.Array:
    """A single-chain position: a floating array of any shape with finite values."""
    arr = position if isinstance(position, jax.Array) else jnp.asarray(position)
    if not jnp.issubdtype(arr.dtype, jnp.floating):
        arr = arr.astype(jnp.result_type(float))
    if is_concrete(arr) and not bool(jnp.all(jnp.isfinite(arr))):
        raise ValueError(f"{name} must be finite; got {_short(np.asarray(arr))}.")
    return arr


def check_positive(value: Any, name: str, *, allow_zero: bool = False) -> None:
    """A finite scalar > 0 (or >= 0). Tracers and callables (schedules) pass."""
    if callable(value) or not is_concrete(value):
        return
    arr = np.asarray(value)
    if arr.ndim != 0:
        raise ValueError(f"{name} must be a scalar; got an array of shape {arr.shape}.")
    v = float(arr)
    ok = math.isfinite(v) and (v >= 0 if allow_zero else v > 0)
    if not ok:
        expected = "a finite number >= 0" if allow_zero else "a finite number > 0"
        raise ValueError(f"{name} must be {expected}; got {_short(value)}.")


def check_int(value: Any, name: str, *, minimum: int, maximum: int | None = None) -> int:
    """A Python integer in ``[minimum, maximum]``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be an integer; got {_short(value)} of type {type(value).__name__}.")
    v = int(value)
    if v < minimum or (maximum is not None and v > maximum):
        bound = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
        raise ValueError(f"{name} must be an integer {bound}; got {v}.")
    return v


def check_logdensity(logdensity_fn: Callable, example: jax.Array, name: str = "logdensity_fn") -> None:
    """``logdensity_fn`` must map one particle ``(d,)`` to a real scalar.

    Checked abstractly with ``jax.eval_shape``: nothing is computed.
    """
    if not callable(logdensity_fn):
        raise ValueError(f"{name} must be a callable x -> scalar log density; got {_short(logdensity_fn)}.")
    try:
        out = jax.eval_shape(logdensity_fn, jax.ShapeDtypeStruct(example.shape, example.dtype))
    except Exception as exc:  # the user's function failed on a correctly shaped input
        raise ValueError(
            f"{name} failed on an input of shape {tuple(example.shape)} and dtype {example.dtype}: {exc}"
        ) from exc
    if not hasattr(out, "shape") or out.shape != ():
        shape = getattr(out, "shape", type(out).__name__)
        raise ValueError(
            f"{name} must return a scalar for one particle of shape {tuple(example.shape)}; got output shape {shape}."
        )
    if not jnp.issubdtype(out.dtype, jnp.floating):
        raise ValueError(f"{name} must return a floating scalar; got dtype {out.dtype}.")
