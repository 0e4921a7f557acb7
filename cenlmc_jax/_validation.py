"""Input checks shared by every module: one set of helpers, one message style.

Every check runs in Python on concrete values, before anything is traced, and
raises ``ValueError`` of the form::

    "<name> must be <what was expected>; got <what came>."

Values that are already tracers (the caller jitted around us) are checked for
what is known while tracing (shape, dtype) only: their values are not known yet.

The user's functions (log densities, gradients, gradient estimators, the
recipe's matrices, step-size schedules, proposals) pass one output check,
:func:`check_output` (structure, shapes and dtype of an output, from static
information only), called on ``jax.eval_shape`` of the function where it
enters (:func:`check_function`, at build or ``init`` time) and on the traced
output inside the steps (free at trace time): a scalar or a ``(1,)`` where a
``(d,)`` is expected is refused, never broadcast into the drift.
:func:`check_key` is the one key check of every ``init`` / ``step`` that
takes a key, of ``cj.sample`` and of ``cj.vmap_chains``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from cenlmc_jax._host import fetch

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
    "point_like",
    "check_logdensity",
    "check_output",
    "check_function",
    "raise_as_own",
    "check_schedule",
    "check_start_logdensity",
    "check_state",
    "check_key",
]


def is_concrete(x: Any) -> bool:
    """Whether ``x`` holds a value now (not a tracer inside jit/vmap/scan).

    Args:
      x: any value.

    Returns:
      True unless ``x`` is a ``jax.core.Tracer``.
    """
    return not isinstance(x, jax.core.Tracer)


def all_concrete(*xs: Any) -> bool:
    """Whether no leaf of ``xs`` is a tracer.

    Args:
      *xs: any values or pytrees.

    Returns:
      True when every leaf is concrete.
    """
    return all(is_concrete(x) for x in jax.tree_util.tree_leaves(xs))


def describe(value: Any) -> str:
    """A short ``repr`` for error messages; 0-d arrays show their value.

    Args:
      value: any value.

    Returns:
      Its ``repr``, cut to at most 80 characters.
    """
    if (
        isinstance(value, (np.ndarray, np.generic, jax.Array))
        and np.ndim(value) == 0
        and is_concrete(value)
    ):
        value = np.asarray(value).item()
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def check_callable(fn: Any, name: str, what: str) -> None:
    """Checks that ``fn`` is callable.

    Args:
      fn: the argument.
      name: its name, for the message.
      what: its signature, e.g. ``"x -> scalar log density"``.

    Raises:
      ValueError: ``fn`` is not callable.
    """
    if not callable(fn):
        raise ValueError(f"{name} must be a callable {what}; got {describe(fn)}.")


def check_choice(value: Any, name: str, choices: Iterable[Any]) -> Any:
    """Checks that ``value`` is one of ``choices``.

    Args:
      value: the argument.
      name: its name, for the message.
      choices: the allowed values (compared by identity, or by type and ``==``).

    Returns:
      ``value``.

    Raises:
      ValueError: ``value`` is none of ``choices``.
    """
    choices = tuple(choices)
    if not any(value is c or (type(value) is type(c) and value == c) for c in choices):
        raise ValueError(f"{name} must be one of {choices}; got {describe(value)}.")
    return value


def check_bool(value: Any, name: str) -> bool:
    """Checks that a switch is ``True`` or ``False`` (not a string, not an array).

    Args:
      value: the argument.
      name: its name, for the message.

    Returns:
      ``value`` as a Python bool.

    Raises:
      ValueError: ``value`` is not a bool (Python or NumPy).
    """
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
        raise ValueError(
            f"{name} must be a real number; got {describe(value)}."
        ) from exc
    if arr.ndim != 0:
        raise ValueError(f"{name} must be a scalar; got an array of shape {arr.shape}.")
    if not (
        np.issubdtype(arr.dtype, np.integer) or np.issubdtype(arr.dtype, np.floating)
    ):
        raise ValueError(
            f"{name} must be a real number; got {describe(value)} of dtype {arr.dtype}."
        )
    return float(arr)


def check_positive(
    value: Any, name: str, *, allow_zero: bool = False, allow_inf: bool = False
) -> None:
    """Checks for a scalar > 0 (``>= 0`` with ``allow_zero``).

    Finite unless ``allow_inf``.

    Tracers and callables (step-size schedules) pass: their values are checked
    where they become concrete.

    Args:
      value: the argument.
      name: its name, for the message.
      allow_zero: accept 0.
      allow_inf: accept ``inf``.

    Raises:
      ValueError: not a real scalar, NaN, out of bounds, or infinite.
    """
    v = _real_scalar(value, name)
    if v is None:
        return
    ok = (
        not math.isnan(v)
        and (v >= 0 if allow_zero else v > 0)
        and (allow_inf or math.isfinite(v))
    )
    if not ok:
        bound = ">= 0" if allow_zero else "> 0"
        kind = "a number" if allow_inf else "a finite number"
        extra = " (inf allowed)" if allow_inf else ""
        raise ValueError(
            f"{name} must be {kind} {bound}{extra}; got {describe(value)}."
        )


def check_nonnegative(value: Any, name: str, *, allow_inf: bool = False) -> None:
    """Checks for a scalar >= 0 (finite unless ``allow_inf``); tracers pass.

    Args:
      value: the argument.
      name: its name, for the message.
      allow_inf: accept ``inf``.

    Raises:
      ValueError: not a real scalar, NaN, negative, or infinite.
    """
    check_positive(value, name, allow_zero=True, allow_inf=allow_inf)


def check_finite_scalar(value: Any, name: str, what: str = "a finite scalar") -> None:
    """Checks for any finite real scalar; tracers pass.

    Args:
      value: the argument.
      name: its name, for the message.
      what: what was expected, for the message.

    Raises:
      ValueError: not a real scalar, or not finite.
    """
    v = _real_scalar(value, name)
    if v is not None and not math.isfinite(v):
        raise ValueError(f"{name} must be {what}; got {describe(value)}.")


def check_int(
    value: Any, name: str, *, minimum: int, maximum: int | None = None, why: str = ""
) -> int:
    """Checks for an integer in ``[minimum, maximum]``.

    A Python int, a NumPy integer or a 0-d integer array.

    Args:
      value: the argument.
      name: its name, for the message.
      minimum: the smallest value allowed.
      maximum: the largest value allowed (None: no bound).
      why: (optional) explains the bound in the message.

    Returns:
      The value as a Python int.

    Raises:
      ValueError: a bool, a tracer, a non-integer, or out of bounds.
    """
    if isinstance(value, (bool, np.bool_)):
        raise ValueError(
            f"{name} must be an integer; got {describe(value)} of type bool."
        )
    if isinstance(value, (int, np.integer)):
        v = int(value)
    else:
        if not is_concrete(value):
            raise ValueError(
                f"{name} must be a concrete integer (it sets a shape or a loop "
                "length); got a tracer."
            )
        arr = np.asarray(value) if isinstance(value, (np.ndarray, jax.Array)) else None
        if arr is None or arr.ndim != 0 or not np.issubdtype(arr.dtype, np.integer):
            kind = (
                type(value).__name__
                if arr is None
                else f"{type(value).__name__} of shape {arr.shape}, dtype {arr.dtype}"
            )
            raise ValueError(
                f"{name} must be an integer; got {describe(value)} ({kind})."
            )
        v = int(arr)
    if v < minimum or (maximum is not None and v > maximum):
        bound = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
        reason = f" ({why})" if why else ""
        raise ValueError(f"{name} must be an integer {bound}{reason}; got {v}.")
    return v


def _as_float_array(value: Any, name: str) -> jax.Array:
    """A real float32/float64 array.

    Integers and bools are promoted to the default float.

    Complex values are refused (they would be cast to real silently), and so
    are float16 / bfloat16: Langevin noise of size sqrt(2h) and the ensemble's
    log weights need more than their 8-11 bits (NaN moments, unreported).
    """
    try:
        arr = value if isinstance(value, jax.Array) else jnp.asarray(value)
    except (TypeError, ValueError) as exc:
        raise ValueError(
            f"{name} must be a numeric array; got {describe(value)}."
        ) from exc
    if jnp.issubdtype(arr.dtype, jnp.complexfloating):
        raise ValueError(f"{name} must be real; got dtype {arr.dtype}.")
    if arr.dtype in (jnp.float16, jnp.bfloat16):
        raise ValueError(
            f"{name} must be float32 or float64; got dtype {arr.dtype} (too few bits "
            "for the noise and weights of these samplers: cast to float32)."
        )
    if not (
        jnp.issubdtype(arr.dtype, jnp.floating)
        or jnp.issubdtype(arr.dtype, jnp.integer)
        or arr.dtype == jnp.bool_
    ):
        raise ValueError(f"{name} must be a numeric array; got dtype {arr.dtype}.")
    if not jnp.issubdtype(arr.dtype, jnp.floating):
        arr = arr.astype(jnp.result_type(float))
    return arr


def check_positions(
    positions: Any, name: str = "positions", *, min_particles: int = 1
) -> jax.Array:
    """Checks an ensemble: a floating ``(N, d)`` array of finite values.

    Args:
      positions: the ensemble, shape ``(N, d)``.
      name: its name, for the message.
      min_particles: the smallest ``N`` allowed.

    Returns:
      The positions as a floating ``jax.Array`` (integers promoted).

    Raises:
      ValueError: not numeric, complex, half precision, not 2-D,
        ``N < min_particles``, ``d = 0``, or (when concrete) NaN or inf in a particle.
    """
    arr = _as_float_array(positions, name)
    if arr.ndim != 2:
        raise ValueError(
            f"{name} must be an array of shape (N, d) (N particles in d dimensions); "
            f"got shape {tuple(arr.shape)} (ndim={arr.ndim})."
        )
    if arr.shape[0] < max(1, min_particles) or arr.shape[1] < 1:
        raise ValueError(
            f"{name} must have N >= {max(1, min_particles)} particles and d >= 1 "
            f"dimensions; got shape {tuple(arr.shape)}."
        )
    if is_concrete(arr):  # NumPy, not jnp: inside a jit trace jnp would stage the check
        finite = np.isfinite(fetch(arr))  # gathered when sharded over several processes
        if not finite.all():
            bad = int(np.sum(~finite.all(axis=-1)))
            raise ValueError(
                f"{name} must be finite; {bad} of {arr.shape[0]} particles contain NaN "
                "or inf."
            )
    return arr


def check_position(
    position: Any,
    name: str = "position",
    *,
    ndim: int | None = None,
    finite: bool = True,
) -> jax.Array:
    """Checks a single-chain position: a floating array of finite values, ``d >= 1``.

    Args:
      position: the position, shape ``(d,)`` (or ``ndim`` dimensions).
      name: its name, for the message.
      ndim: the number of dimensions required (None: any).
      finite: check the values are finite (``False``: the caller checks them
        itself).

    Returns:
      The position as a floating ``jax.Array`` (integers promoted).

    Raises:
      ValueError: not numeric, complex, half precision, the wrong ``ndim``,
        ``d = 0``, or (when concrete and ``finite``) NaN or inf.
    """
    arr = _as_float_array(position, name)
    if ndim is not None and arr.ndim != ndim:
        shape = (
            "(d,) (one chain; vmap over chains for many)"
            if ndim == 1
            else f"{ndim} dimensions"
        )
        raise ValueError(
            f"{name} must have shape {shape}; got shape {tuple(arr.shape)}."
        )
    if arr.ndim >= 1 and arr.shape[-1] == 0:
        raise ValueError(
            f"{name} must have d >= 1 dimensions; got shape {tuple(arr.shape)}."
        )
    if finite and is_concrete(arr) and not np.isfinite(np.asarray(arr)).all():
        raise ValueError(f"{name} must be finite; got {describe(np.asarray(arr))}.")
    return arr


def check_vector(value: Any, name: str, size: int) -> np.ndarray:
    """Checks for a concrete real ``(size,)`` vector (a scalar is broadcast).

    Args:
      value: a scalar or a ``(size,)`` vector.
      name: its name, for the message.
      size: the length required.

    Returns:
      A float64 NumPy array of shape ``(size,)``.

    Raises:
      ValueError: any other shape.
    """
    arr = np.asarray(value, dtype=np.float64)
    if arr.ndim == 0:
        arr = np.full((size,), float(arr))
    if arr.shape != (size,):
        raise ValueError(
            f"{name} must be a scalar or a ({size},) vector; got shape {arr.shape}."
        )
    return arr


def _struct(x: Any) -> str:
    shape = getattr(x, "shape", None)
    return (
        type(x).__name__ if shape is None else f"shape {tuple(shape)}, dtype {x.dtype}"
    )


def check_output(
    out: Any,
    name: str,
    *,
    what: str,
    like: Any = None,
    shapes: tuple | None = None,
    kind: str = "floating",
) -> None:
    """Checks the output of a user function: structure, shapes and dtype kind.

    The output may be concrete, traced or abstract (``jax.eval_shape``): only
    static information is read, so this costs nothing inside a trace and raises at
    trace time, before anything runs.

    Args:
      out: the function's output.
      name: the function's name, for the message.
      what: the function's signature for the message, e.g.
        ``"x -> scalar log density"``.
      like: a pytree (arrays or ``ShapeDtypeStruct``) the output must match leaf
        by leaf (same structure, same shapes): a gradient is shaped like its
        position. Exact shapes: a scalar or a ``(1,)`` where ``(d,)`` is expected
        would be broadcast into the drift silently.
      shapes: the allowed shapes of a single-array output (``((),)`` a scalar; a
        matrix form ``((), (d,), (d, d))``).
      kind: ``"floating"`` (a real float dtype) or ``"real"`` (float, integer or
        bool: a number cast later).

    Raises:
      ValueError: another structure, a shape not allowed, or a dtype not of
        ``kind``.
    """

    def dtype_ok(leaf):
        dt = getattr(leaf, "dtype", None)
        if dt is None:
            return False
        if kind == "floating":
            return jnp.issubdtype(dt, jnp.floating)
        return (
            jnp.issubdtype(dt, jnp.floating)
            or jnp.issubdtype(dt, jnp.integer)
            or dt == jnp.bool_
        )

    sig = f" ({name}: {what})"
    if like is not None:
        out_leaves, out_def = jax.tree_util.tree_flatten(out)
        like_leaves, like_def = jax.tree_util.tree_flatten(like)
        if out_def != like_def:
            raise ValueError(
                f"{name} must return a pytree like the position ({like_def}); got "
                f"{out_def}{sig}."
            )
        for o, e in zip(out_leaves, like_leaves, strict=True):
            if tuple(getattr(o, "shape", (None,))) != tuple(np.shape(e)):
                raise ValueError(
                    f"{name} must return shape {tuple(np.shape(e))}, like the "
                    f"position; got {_struct(o)} (it would be broadcast silently){sig}."
                )
            if not dtype_ok(o):
                raise ValueError(
                    f"{name} must return a {kind} dtype; got {_struct(o)}{sig}."
                )
        return
    if not hasattr(out, "shape") and isinstance(out, (bool, int, float, list, tuple)):
        # a Python number or a list of numbers from the user's function (abstractly:
        # nothing runs)
        try:
            out = jax.eval_shape(jnp.asarray, out)
        except Exception:
            pass
    if not hasattr(out, "shape") or (
        shapes is not None and tuple(out.shape) not in shapes
    ):
        allowed = " or ".join(str(tuple(sh)) for sh in (shapes or ()))
        expected = "a scalar (shape ())" if shapes == ((),) else f"shape {allowed}"
        raise ValueError(f"{name} must return {expected}; got {_struct(out)}{sig}.")
    if not dtype_ok(out):
        kind_text = (
            "a floating scalar"
            if shapes == ((),) and kind == "floating"
            else f"a {kind} dtype"
        )
        raise ValueError(f"{name} must return {kind_text}; got {_struct(out)}{sig}.")


def raise_as_own(exc: BaseException, context: str) -> None:
    """Raises ``exc`` again, as its own type, with ``context`` (which of the user's
    functions raised it, on what) in front of its message.

    A model's exception is the model's: a ``ZeroDivisionError`` or the user's own
    exception class comes back as that class (``except`` clauses around the call
    keep working), chained to the original (``from exc``). Where the class cannot be
    rebuilt from one message (its ``__init__`` takes other arguments), the original
    exception itself is raised again with ``context`` added as a note.

    Args:
      exc: the exception the user's function raised.
      context: the function's name and the inputs it failed on.

    Raises:
      BaseException: always: ``type(exc)`` with the message
        ``"<context>: <exc>"``, or ``exc`` itself with ``context`` as a note.
    """
    message = f"{context}: {exc}"
    try:
        rebuilt = type(exc)(message)
    except Exception:
        rebuilt = None
    if rebuilt is None or str(exc) not in str(rebuilt):
        exc.add_note(context)
        raise exc
    raise rebuilt from exc


def check_function(
    fn: Any,
    name: str,
    args: tuple,
    *,
    what: str,
    like: Any = None,
    shapes: tuple | None = None,
    kind: str = "floating",
) -> Any:
    """``fn(*args)`` evaluated abstractly and checked by :func:`check_output`.

    ``jax.eval_shape``: nothing is computed. An exception inside ``fn`` is raised
    again as its own type, with ``name`` and the inputs in front of its message
    (:func:`raise_as_own`).

    Args:
      fn: the user's function.
      name: its name, for the message.
      args: its arguments: concrete arrays, tracers or ``ShapeDtypeStruct`` s.
      what: its signature, for the message.
      like: as for :func:`check_output`.
      shapes: as for :func:`check_output`.
      kind: as for :func:`check_output`.

    Returns:
      The abstract output (``ShapeDtypeStruct`` s).

    Raises:
      ValueError: ``fn`` is not callable, or its output fails
        :func:`check_output`.
      Exception: what ``fn`` raised on these inputs, as its own type
        (:func:`raise_as_own`).
    """
    check_callable(fn, name, what)
    specs = jax.tree_util.tree_map(
        lambda a: (
            jax.ShapeDtypeStruct(np.shape(a), a.dtype) if hasattr(a, "dtype") else a
        ),
        args,
    )
    try:
        out = jax.eval_shape(fn, *specs)
    except Exception as exc:  # the user's function failed on correctly shaped inputs
        shown = ", ".join(_struct(a) for a in jax.tree_util.tree_leaves(specs))
        raise_as_own(
            exc, f"{name} ({what}) raised {type(exc).__name__} on inputs of {shown}"
        )
    check_output(out, name, what=what, like=like, shapes=shapes, kind=kind)
    return out


def point_like(positions: Any) -> jax.ShapeDtypeStruct:
    """One point of ``positions: (N, ...)``, abstractly: the example of
    :func:`check_logdensity` without slicing (an eager ``positions[0]`` compiles a
    program).

    Args:
      positions: the particles or chains, an array with a leading axis.

    Returns:
      A ``jax.ShapeDtypeStruct`` of shape ``positions.shape[1:]``.
    """
    return jax.ShapeDtypeStruct(np.shape(positions)[1:], positions.dtype)


def check_logdensity(
    logdensity_fn: Any, example: Any, name: str = "logdensity_fn"
) -> None:
    """Checks that ``logdensity_fn`` maps one point to a real floating scalar.

    The point is shaped like ``example``; the check is :func:`check_function`
    (abstract, nothing is computed).

    Args:
      logdensity_fn: the log density.
      example: a point (or an array shaped like one).
      name: its name, for the message.

    Raises:
      ValueError: not callable, or does not return a floating scalar.
      Exception: what ``logdensity_fn`` raised, as its own type, the model named
        (:func:`raise_as_own`).
    """
    check_function(
        logdensity_fn, name, (example,), what="x -> scalar log density", shapes=((),)
    )


def check_schedule(step_size: Any, name: str = "step_size") -> None:
    """Checks a step size: a number > 0, or a schedule ``t -> ε_t``.

    A schedule takes the int32 step counter and returns a real scalar whose value
    at ``t = 0`` is > 0 (values at later steps are checked where they are
    concrete, and a chain frozen by a schedule that reached 0 is reported by the
    driver).

    Args:
      step_size: the number or the schedule.
      name: its name, for the message.

    Raises:
      ValueError: a number not > 0, or a schedule that fails, does not return a
        real scalar, or is not > 0 at ``t = 0``.
    """
    if not callable(step_size):
        check_positive(step_size, name)
        return
    t0 = jnp.zeros((), jnp.int32)
    check_function(
        step_size,
        name,
        (t0,),
        what="schedule t (int32 step counter) -> step size (scalar)",
        shapes=((),),
        kind="real",
    )
    with jax.ensure_compile_time_eval():
        value = step_size(t0)
    if is_concrete(value):
        check_positive(value, f"{name}(0) (the schedule's value at the first step)")


def check_start_logdensity(
    values: Any, name: str = "logdensity_fn", where: str = "starting point"
) -> None:
    """Checks that the log density is finite at one starting point at least.

    Concrete values only. ``-inf`` or NaN at every one leaves the chains nowhere
    to go (a zero density everywhere, or a log density of the wrong sign or
    normalisation).

    Args:
      values: the log density at the starting points (any shape).
      name: the log density's name, for the message.
      where: what the points are, for the message.

    Raises:
      ValueError: every value is ``-inf`` or NaN.
    """
    if not is_concrete(values):
        return
    v = np.asarray(
        fetch(values), np.float64
    ).ravel()  # gathered when sharded over several processes
    if v.size and not np.isfinite(v).any():
        shown = (
            describe(v[0]) if v.size == 1 else f"{describe(v[:4])[:60]} (all {v.size})"
        )
        raise ValueError(
            f"{name} is -inf or NaN at every {where} ({shown}): the density is zero or "
            "undefined where the chains start; start inside the support of the target."
        )


def check_state(state: Any, cls: type, init_name: str) -> None:
    """Checks that ``state`` is a ``cls`` (as made by ``init_name``).

    Args:
      state: the argument.
      cls: the state class required.
      init_name: the function that makes it, for the message.

    Raises:
      ValueError: ``state`` is not a ``cls``.
    """
    if not isinstance(state, cls):
        raise ValueError(
            f"state must be a {cls.__name__} (from {init_name}); got "
            f"{type(state).__name__}."
        )


def check_key(rng_key: Any, name: str = "rng_key") -> None:
    """Checks for a single PRNG key.

    A typed key of shape ``()`` (``jax.random.key``) or a legacy uint32 ``(2,)``
    ``PRNGKey``.

    Args:
      rng_key: the argument.
      name: its name, for the message.

    Raises:
      ValueError: a batch of typed keys, or anything else.
    """
    dtype = getattr(rng_key, "dtype", None)
    shape = tuple(getattr(rng_key, "shape", ()))
    if dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
        if shape != ():
            raise ValueError(
                f"{name} must be a single key (shape ()); got a batch of keys of shape "
                f"{shape}."
            )
        return
    if dtype is None or dtype != jnp.uint32 or shape != (2,):
        raise ValueError(
            f"{name} must be a PRNG key: jax.random.key(seed) or "
            f"jax.random.PRNGKey(seed); got {describe(rng_key)}"
            + (f" (dtype {dtype}, shape {shape})." if dtype is not None else ".")
        )
