"""Input checks shared by every module: one set of helpers, one message style.

Every check runs in Python on concrete values, before anything is traced, and
raises ``ValueError`` of the form

    "<name> must be <what was expected>; got <what came>."

Values that are already tracers (the caller jitted around us) are checked for
what is known while tracing (shape, dtype) only: their values are not known yet.
"""

from __future__ import annotations

import math
from typing import Any, Iterable

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "is_concrete",
    "all_concrete",
    "describe",
    "check_callable",
    "check_choice",
    "check_bool",
    "check_positive",
    "check_nonnegative",
    "check_finite_scalar",
    "check_int",
    "check_positions",
    "check_position",
    "check_vector",
    "check_logdensity",
    "check_state",
    "check_key",
]


def is_concrete(x: Any) -> bool:
    """True when ``x`` holds a value now (not a tracer inside jit/vmap/scan)."""
    return not isinstance(x, jax.core.Tracer)


def all_concrete(*xs: Any) -> bool:
    """True when no leaf of ``xs`` is a tracer."""
    return all(is_concrete(x) for x in jax.tree_util.tree_leaves(xs))


def describe(value: Any) -> str:
    """A short ``repr`` for error messages (at most 80 characters); 0-d arrays show their value."""
    if isinstance(value, (np.ndarray, np.generic, jax.Array)) and np.ndim(value) == 0 and is_concrete(value):
        value = np.asarray(value).item()
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def check_callable(fn: Any, name: str, what: str) -> None:
    """``fn`` must be callable; ``what`` says its signature, e.g. ``"x -> scalar log density"``."""
    if not callable(fn):
        raise ValueError(f"{name} must be a callable {what}; got {describe(fn)}.")


def check_choice(value: Any, name: str, choices: Iterable[Any]) -> Any:
    """``value`` must be one of ``choices``."""
    choices = tuple(choices)
    if not any(value is c or (type(value) is type(c) and value == c) for c in choices):
        raise ValueError(f"{name} must be one of {choices}; got {describe(value)}.")
    return value


def check_bool(value: Any, name: str) -> bool:
    """A switch must be ``True`` or ``False`` (not a string, not an array)."""
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name} must be True or False; got {describe(value)}.")
    return bool(value)


def _real_scalar(value: Any, name: str) -> float | None:
    """The float value of a concrete real scalar; None for tracers and callables."""
    if callable(value) or not is_concrete(value):
        return None
    if value is None or isinstance(value, (str, bytes, bool, np.bool_)):
        raise ValueError(f"{name} must be a real number; got {describe(value)}.")
    try:
        arr = np.asarray(value)
    except Exception as exc:  # an object numpy cannot read
        raise ValueError(f"{name} must be a real number; got {describe(value)}.") from exc
    if arr.ndim != 0:
        raise ValueError(f"{name} must be a scalar; got an array of shape {arr.shape}.")
    if not (np.issubdtype(arr.dtype, np.integer) or np.issubdtype(arr.dtype, np.floating)):
        raise ValueError(f"{name} must be a real number; got {describe(value)} of dtype {arr.dtype}.")
    return float(arr)


def check_positive(value: Any, name: str, *, allow_zero: bool = False, allow_inf: bool = False) -> None:
    """A scalar > 0 (``>= 0`` with ``allow_zero``), finite unless ``allow_inf``.

    Tracers and callables (step-size schedules) pass: their values are checked
    where they become concrete.
    """
    v = _real_scalar(value, name)
    if v is None:
        return
    ok = not math.isnan(v) and (v >= 0 if allow_zero else v > 0) and (allow_inf or math.isfinite(v))
    if not ok:
        bound = ">= 0" if allow_zero else "> 0"
        kind = "a number" if allow_inf else "a finite number"
        extra = " (inf allowed)" if allow_inf else ""
        raise ValueError(f"{name} must be {kind} {bound}{extra}; got {describe(value)}.")


def check_nonnegative(value: Any, name: str, *, allow_inf: bool = False) -> None:
    """A scalar >= 0 (finite unless ``allow_inf``); tracers pass."""
    check_positive(value, name, allow_zero=True, allow_inf=allow_inf)


def check_finite_scalar(value: Any, name: str, what: str = "a finite scalar") -> None:
    """Any finite real scalar; tracers pass."""
    v = _real_scalar(value, name)
    if v is not None and not math.isfinite(v):
        raise ValueError(f"{name} must be {what}; got {describe(value)}.")


def check_int(value: Any, name: str, *, minimum: int, maximum: int | None = None, why: str = "") -> int:
    """An integer in ``[minimum, maximum]``: a Python int, a NumPy integer or a 0-d integer array.

    ``why`` (optional) explains the bound in the message.
    """
    if isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name} must be an integer; got {describe(value)} of type bool.")
    if isinstance(value, (int, np.integer)):
        v = int(value)
    else:
        if not is_concrete(value):
            raise ValueError(f"{name} must be a concrete integer (it sets a shape or a loop length); got a tracer.")
        arr = np.asarray(value) if isinstance(value, (np.ndarray, jax.Array)) else None
        if arr is None or arr.ndim != 0 or not np.issubdtype(arr.dtype, np.integer):
            kind = type(value).__name__ if arr is None else f"{type(value).__name__} of shape {arr.shape}, dtype {arr.dtype}"
            raise ValueError(f"{name} must be an integer; got {describe(value)} ({kind}).")
        v = int(arr)
    if v < minimum or (maximum is not None and v > maximum):
        bound = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
        reason = f" ({why})" if why else ""
        raise ValueError(f"{name} must be an integer {bound}{reason}; got {v}.")
    return v


def _as_float_array(value: Any, name: str) -> jax.Array:
    """A real float32/float64 array (integers and bools are promoted to the default float).

    Complex values are refused (they would be cast to real silently), and so
    are float16 / bfloat16: Langevin noise of size sqrt(2h) and the ensemble's
    log weights need more than their 8-11 bits (NaN moments, unreported).
    """
    try:
        arr = value if isinstance(value, jax.Array) else jnp.asarray(value)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must be a numeric array; got {describe(value)}.") from exc
    if jnp.issubdtype(arr.dtype, jnp.complexfloating):
        raise ValueError(f"{name} must be real; got dtype {arr.dtype}.")
    if arr.dtype in (jnp.float16, jnp.bfloat16):
        raise ValueError(f"{name} must be float32 or float64; got dtype {arr.dtype} (too few bits for the noise "
                         "and weights of these samplers: cast to float32).")
    if not (jnp.issubdtype(arr.dtype, jnp.floating) or jnp.issubdtype(arr.dtype, jnp.integer)
            or arr.dtype == jnp.bool_):
        raise ValueError(f"{name} must be a numeric array; got dtype {arr.dtype}.")
    if not jnp.issubdtype(arr.dtype, jnp.floating):
        arr = arr.astype(jnp.result_type(float))
    return arr


def check_positions(positions: Any, name: str = "positions", *, min_particles: int = 1) -> jax.Array:
    """An ensemble: a floating ``(N, d)`` array of finite values with ``N >= min_particles``."""
    arr = _as_float_array(positions, name)
    if arr.ndim != 2:
        raise ValueError(
            f"{name} must be an array of shape (N, d) (N particles in d dimensions); "
            f"got shape {tuple(arr.shape)} (ndim={arr.ndim})."
        )
    if arr.shape[0] < max(1, min_particles) or arr.shape[1] < 1:
        raise ValueError(
            f"{name} must have N >= {max(1, min_particles)} particles and d >= 1 dimensions; "
            f"got shape {tuple(arr.shape)}."
        )
    if is_concrete(arr):  # NumPy, not jnp: inside a jit trace jnp would stage the check
        finite = np.isfinite(np.asarray(arr))
        if not finite.all():
            bad = int(np.sum(~finite.all(axis=-1)))
            raise ValueError(f"{name} must be finite; {bad} of {arr.shape[0]} particles contain NaN or inf.")
    return arr


def check_position(position: Any, name: str = "position", *, ndim: int | None = None) -> jax.Array:
    """A single-chain position: a floating array of finite values (``ndim`` dimensions if given)."""
    arr = _as_float_array(position, name)
    if ndim is not None and arr.ndim != ndim:
        shape = "(d,) (one chain; vmap over chains for many)" if ndim == 1 else f"{ndim} dimensions"
        raise ValueError(f"{name} must have shape {shape}; got shape {tuple(arr.shape)}.")
    if is_concrete(arr) and not np.isfinite(np.asarray(arr)).all():
        raise ValueError(f"{name} must be finite; got {describe(np.asarray(arr))}.")
    return arr


def check_vector(value: Any, name: str, size: int) -> np.ndarray:
    """A concrete real ``(size,)`` vector (also accepts a scalar, broadcast)."""
    arr = np.asarray(value, dtype=np.float64)
    if arr.ndim == 0:
        arr = np.full((size,), float(arr))
    if arr.shape != (size,):
        raise ValueError(f"{name} must be a scalar or a ({size},) vector; got shape {arr.shape}.")
    return arr


def check_logdensity(logdensity_fn: Any, example: jax.Array, name: str = "logdensity_fn") -> None:
    """``logdensity_fn`` must map one point ``example.shape`` to a real scalar.

    Checked abstractly with ``jax.eval_shape``: nothing is computed.
    """
    check_callable(logdensity_fn, name, "x -> scalar log density")
    try:
        out = jax.eval_shape(logdensity_fn, jax.ShapeDtypeStruct(example.shape, example.dtype))
    except Exception as exc:  # the user's function failed on a correctly shaped input
        raise ValueError(
            f"{name} failed on an input of shape {tuple(example.shape)} and dtype {example.dtype}: {exc}"
        ) from exc
    if not hasattr(out, "shape") or out.shape != ():
        shape = getattr(out, "shape", type(out).__name__)
        raise ValueError(
            f"{name} must return a scalar for one point of shape {tuple(example.shape)}; got output shape {shape}."
        )
    if not jnp.issubdtype(out.dtype, jnp.floating):
        raise ValueError(f"{name} must return a floating scalar; got dtype {out.dtype}.")


def check_state(state: Any, cls: type, init_name: str) -> None:
    """``state`` must be a ``cls`` (as made by ``init_name``)."""
    if not isinstance(state, cls):
        raise ValueError(f"state must be a {cls.__name__} (from {init_name}); got {type(state).__name__}.")


def check_key(rng_key: Any, name: str = "rng_key") -> None:
    """A single PRNG key: a typed key of shape () (``jax.random.key``) or a legacy uint32 ``(2,)`` ``PRNGKey``."""
    dtype = getattr(rng_key, "dtype", None)
    shape = tuple(getattr(rng_key, "shape", ()))
    if dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
        if shape != ():
            raise ValueError(f"{name} must be a single key (shape ()); got a batch of keys of shape {shape}.")
        return
    if dtype is None or dtype != jnp.uint32 or shape != (2,):
        raise ValueError(
            f"{name} must be a PRNG key: jax.random.key(seed) or jax.random.PRNGKey(seed); got "
            f"{describe(rng_key)}" + (f" (dtype {dtype}, shape {shape})." if dtype is not None else ".")
        )
