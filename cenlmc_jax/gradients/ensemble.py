"""The gradient a sampler takes: the user's ``grad_fn``, or autodiff.

Every sampler with a ``grad_fn=`` / ``grad_mode=`` keyword takes its gradients from
here, one floor below the samplers (``ensemble/``, ``adaptation/``):

* :func:`gradient_fn`: ``x -> ∇log π(x)`` at one point, ``grad_fn`` if given, else
  autodiff in ``grad_mode`` (:mod:`cenlmc_jax.gradients.modes`);
* :func:`value_and_grad_ensemble`: ``log π`` and ``∇log π`` at every particle of an
  ``(N, d)`` ensemble, from one batch where the gradient is finite differences of
  the same log density (:func:`shares_values`);
* :func:`grad_cost` and :func:`value_and_grad_cost`: what those cost in model solves
  (``info.model_solves``), as a ``grad_fn`` says (``model_solves(d)``,
  ``model_solves_given_value(d)``; :func:`cenlmc_jax.gradients.finite_difference`);
* :func:`check_grad_fn` and :data:`GRAD_FN_WHAT`: a user's ``grad_fn`` checked
  against the signature ``x: (d,) -> (d,)``.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from cenlmc_jax._validation import check_function, check_output, point_like
from cenlmc_jax.gradients.modes import grad, value_and_grad
from cenlmc_jax.types import Array, LogDensityFn

__all__ = [
    "GRAD_FN_WHAT",
    "check_grad_fn",
    "shares_values",
    "grad_cost",
    "gradient_fn",
    "value_and_grad_ensemble",
    "value_and_grad_cost",
]

#: The signature of a user's ``grad_fn`` (for the messages).
GRAD_FN_WHAT = "x: (d,) -> gradient of the log density (d,)"


def check_grad_fn(
    grad_fn: Callable | None, example: Array, name: str = "grad_fn"
) -> None:
    """Checks that a user's ``grad_fn`` maps one point ``(d,)`` to a ``(d,)`` gradient.

    Floating, abstractly checked (``jax.eval_shape``: no model is evaluated).

    Args:
      grad_fn: the user's gradient, or None (nothing to check).
      example: a point ``(d,)`` (or its ``jax.ShapeDtypeStruct``).
      name: the argument's name, for the message.
    """
    if grad_fn is not None:
        check_function(grad_fn, name, (example,), what=GRAD_FN_WHAT, like=example)


def shares_values(grad_fn: Callable | None, logdensity_fn: LogDensityFn) -> bool:
    """Whether ``grad_fn`` takes its gradient from values of ``logdensity_fn`` itself.

    Such a ``grad_fn`` can reuse a value: True for
    :func:`cenlmc_jax.gradients.finite_difference` of the same function
    (``grad_fn.logdensity_fn == logdensity_fn``; whitened wrappers of the same pair
    compare equal too): then a value the sampler has already is passed to
    ``grad_fn.grad_given_value(x, value)``, and LMC takes its values and gradients
    from one ``grad_fn.value_and_grad(x)`` batch. A ``grad_fn`` of another function
    never gets the sampler's values.

    Args:
      grad_fn: the user's gradient, or None.
      logdensity_fn: the sampler's log density.

    Returns:
      True when ``grad_fn`` has ``grad_given_value`` and its ``logdensity_fn``
      equals ``logdensity_fn``.
    """
    inner = getattr(grad_fn, "logdensity_fn", None)
    return (
        inner is not None
        and hasattr(grad_fn, "grad_given_value")
        and inner == logdensity_fn
    )


def grad_cost(grad_fn: Callable | None, d: int, given_value: bool = False) -> float:
    """Model solves one gradient costs.

    Args:
      grad_fn: the user's gradient, or None (autodiff).
      d: the dimension.
      given_value: the value at the point is known
        (``grad_fn.model_solves_given_value(d)``: 2d central, d forward).

    Returns:
      ``grad_fn.model_solves(d)`` when it says (``cj.finite_difference``: 2d
      central, d + 1 forward), else 1, as a float.
    """
    cost = getattr(
        grad_fn, "model_solves_given_value" if given_value else "model_solves", None
    )
    if cost is None and given_value:
        cost = getattr(grad_fn, "model_solves", None)
    return 1.0 if cost is None else float(cost(d))


def gradient_fn(
    logdensity_fn: LogDensityFn,
    grad_fn: Callable | None,
    grad_mode: str = "auto",
    given_value: bool = False,
) -> Callable:
    """The gradient a sampler uses: ``grad_fn`` if given, else autodiff.

    Args:
      logdensity_fn: ``x: (d,) -> log π(x)``.
      grad_fn: ``x: (d,) -> ∇ log density (d,)`` (its output shape is checked when
        traced), or None: the autodiff gradient of ``logdensity_fn``.
      grad_mode: the autodiff mode (:mod:`cenlmc_jax.gradients.modes`; a
        ``grad_fn`` overrides it).
      given_value: the function takes ``(x, log density at x)`` and passes the
        value on where :func:`shares_values` (autodiff and other ``grad_fn``
        ignore it).

    Returns:
      ``x -> ∇log π(x)``, or ``(x, value) -> ∇log π(x)`` with ``given_value``.
    """
    if grad_fn is None:
        g = grad(logdensity_fn, grad_mode)
        return (lambda x, value: g(x)) if given_value else g
    reuse = given_value and shares_values(grad_fn, logdensity_fn)

    def checked(x, value=None):
        g = grad_fn.grad_given_value(x, value) if reuse else grad_fn(x)
        check_output(
            g, "grad_fn", what=GRAD_FN_WHAT, like=x
        )  # static: free at trace time
        return g

    return checked


def value_and_grad_ensemble(
    logdensity_fn: LogDensityFn,
    positions: Array,
    grad_fn: Callable | None = None,
    grad_mode: str = "auto",
) -> tuple[Array, Array]:
    """``logdensity_fn`` and its gradient at every particle.

    Without ``grad_fn`` both come from one autodiff pass per particle in
    ``grad_mode`` (:func:`cenlmc_jax.gradients.modes.value_and_grad`: reverse, or
    forward with the value as the primal). With ``grad_fn`` (which overrides
    ``grad_mode``): one ``grad_fn.value_and_grad`` batch where :func:`shares_values`
    (finite differences of ``logdensity_fn``: ``d + 1`` or ``2d + 1`` values), else
    separate calls (an adjoint solver or an external code); a Python float from
    ``logdensity_fn`` becomes an array of the positions' dtype.

    Args:
      logdensity_fn: ``x: (d,) -> log π(x)``.
      positions: the particles, ``(N, d)``.
      grad_fn: the user's gradient, or None.
      grad_mode: the autodiff mode.

    Returns:
      ``(values, gradients)``, shapes ``(N,)`` and ``(N, d)``, in the positions'
      dtype.
    """
    if grad_fn is None:
        return jax.vmap(
            value_and_grad(lambda y: jnp.asarray(logdensity_fn(y), y.dtype), grad_mode)
        )(positions)
    if shares_values(grad_fn, logdensity_fn):
        values, grads = jax.vmap(grad_fn.value_and_grad)(positions)
    else:
        values = jax.vmap(lambda y: jnp.asarray(logdensity_fn(y), y.dtype))(positions)
        grads = jax.vmap(grad_fn)(positions)
    # static shapes only (free at trace time): a scalar or (1,) per particle would
    # broadcast into the drift
    check_output(
        jax.ShapeDtypeStruct(grads.shape[1:], grads.dtype),
        "grad_fn",
        what=GRAD_FN_WHAT,
        like=point_like(positions),
    )
    return values.astype(positions.dtype), grads.astype(positions.dtype)


def value_and_grad_cost(
    grad_fn: Callable | None, logdensity_fn: LogDensityFn, d: int
) -> float:
    """Model solves of :func:`value_and_grad_ensemble` per particle with a ``grad_fn``.

    The value and a gradient (``d + 1`` forward, ``2d + 1`` central finite
    differences of ``logdensity_fn``).

    Args:
      grad_fn: the user's gradient, or None.
      logdensity_fn: the sampler's log density.
      d: the dimension.

    Returns:
      The cost per particle, a float.
    """
    return 1.0 + grad_cost(
        grad_fn, d, given_value=shares_values(grad_fn, logdensity_fn)
    )
