"""A sampler object's ``step``: one function per distinct set of parameters.

A rebuilt sampler thereby reuses its compiled run. ``cj.sample`` keeps one jitted
chunk per step function (``run._chunk_fn`` is an ``lru_cache`` keyed on it). A step
written as a fresh closure is a new key every time a sampler is built, so
``cj.cenlmc(logp, ...)`` called again with the same parameters (a notebook cell run
twice, a loop over seeds) traced and compiled the whole run again (issue 17's
compile cliff; the cost on an ODE model is in ``benchmarks/results/recompile.md``).
:func:`bound_step` returns the *same* function object for the same step function
and equal parameters (each with its type: ``1 == 1.0``, but an int and a float
parameter may trace differently), so the second ``cj.sample`` finds the first one's
compiled chunk. The step stays a plain function (``inspect``,
``chex.assert_max_traces`` and the checkpoint's fingerprint see a function with its
closure, as before).

A parameter that cannot be hashed (a JAX or NumPy array, a tracer: a step size
differentiated by ``jax.grad``) gives a fresh closure, shared with nothing.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from typing import Any

#: Distinct (step function, parameters) kept; a step evicted is rebuilt (and its run
#: compiled) again.
MAX_SHARED_STEPS = 128


def bound_step(fn: Callable, **params: Any) -> Callable:
    """``step(rng_key, state) = fn(rng_key, state, **params)``, shared for equal params.

    Args:
      fn: the kernel, ``fn(rng_key, state, **params) -> (state, info)``.
      **params: the sampler's parameters, bound by keyword.

    Returns:
      The step function; the same object for the same ``fn`` and equal ``params``
      (of the same types) while it stays in the cache.
    """
    key = tuple((name, type(value), value) for name, value in sorted(params.items()))
    try:
        return _shared(fn, key)
    # unhashable (arrays, tracers) or a user's __eq__ that does not give a bool
    except Exception:  # noqa: BLE001
        return _closure(fn, params)


@functools.lru_cache(maxsize=MAX_SHARED_STEPS)
def _shared(fn: Callable, key: tuple) -> Callable:
    return _closure(fn, {name: value for name, _, value in key})


#: step -> (fn, params) of every step :func:`bound_step` made (:func:`bound_parts`).
_PARTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def bound_parts(step: Callable) -> tuple[Callable, dict] | None:
    """``(fn, params)`` of a step made by :func:`bound_step`, else None.

    For a caller that runs the same kernel with one parameter changed as a traced
    argument (the CLI's step-halving check: the step size, so that the run at ``h/2``
    reuses the compiled run at ``h``).
    """
    try:
        return _PARTS.get(step)
    except TypeError:  # not weak-referenceable: not one of ours
        return None


def _closure(fn: Callable, params: dict) -> Callable:
    def step(rng_key, state):
        return fn(rng_key, state, **params)

    _PARTS[step] = (fn, dict(params))

    step.__name__ = step.__qualname__ = getattr(fn, "__name__", "step")
    step.__doc__ = (
        f"``{step.__name__}(rng_key, state, **params)`` with this sampler's "
        "parameters bound."
    )
    return step
