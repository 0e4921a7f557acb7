"""Gradients by finite differences, for models JAX cannot differentiate.

For a black-box log density (a NumPy or SciPy model behind
``jax.pure_callback``, an external simulator) ``jax.grad`` has nothing to
differentiate. A finite-difference gradient needs values only::

    central:  ∂_k log π(x) ≈ (log π(x + δ_k e_k) - log π(x - δ_k e_k)) / (2 δ_k)
              2d values, error O(δ²)
    forward:  ∂_k log π(x) ≈ (log π(x + δ_k e_k) - log π(x)) / δ_k
              d + 1 values, error O(δ)

with ``δ_k = step · max(1, |x_k|)`` (a relative step away from 0). The default
steps balance truncation against rounding of the values: ``ε^{1/3}`` (central)
and ``ε^{1/2}`` (forward) in the dtype's machine epsilon ``ε``. All the
shifted points are evaluated in ONE vmapped call of ``logdensity_fn``, so a
model behind ``pure_callback(..., vmap_method="expand_dims")`` sees one
batched call per gradient.

No value is computed twice. The returned object also has

* ``value_and_grad(x)``: ``(log π(x), ∇ log π(x))`` from ONE batched call of
  ``2d + 1`` (central) or ``d + 1`` (forward) points: LMC's step;
* ``grad_given_value(x, value)``: the gradient where ``log π(x)`` is already
  known: ``2d`` (central) or ``d`` (forward) points. CEnLMC knows the value
  at every particle (its ensemble needs them), so its forward differences
  cost ``d`` values, not ``d + 1``;
* ``values_and_grads(x, rows)``: the values at ``M`` points and the gradients
  at the rows ``rows`` of them, in one batched call: CEnLMC's lookahead.

Their costs, ``model_solves(d)`` (a gradient alone: 2d or d + 1) and
``model_solves_given_value(d)`` (2d or d), are what the samplers count a
step's cost with (``info.model_solves``). A user's own ``grad_fn`` may carry
the same four attributes (:func:`cenlmc_jax.gradients.ensemble.grad_cost`).
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from cenlmc_jax._validation import check_callable, check_choice, check_positive
from cenlmc_jax.types import Array, LogDensityFn

__all__ = ["FiniteDifferenceGrad", "finite_difference"]


class FiniteDifferenceGrad:
    """``x: (d,) -> ∇ log π(x) (d,)`` by finite differences.

    Made by :func:`finite_difference`, which says what its arguments are.
    """

    def __init__(self, logdensity_fn: LogDensityFn, step: float | None, scheme: str):
        self.logdensity_fn = logdensity_fn
        self.step = step
        self.scheme = scheme

    def model_solves(self, d: int) -> int:
        """Evaluations of ``logdensity_fn`` per gradient alone.

        Args:
          d: the dimension.

        Returns:
          2d (central) or d + 1 (forward).
        """
        return 2 * d if self.scheme == "central" else d + 1

    def model_solves_given_value(self, d: int) -> int:
        """Evaluations per gradient when the value at ``x`` is known.

        Args:
          d: the dimension.

        Returns:
          2d (central) or d (forward).
        """
        return 2 * d if self.scheme == "central" else d

    def _shifted(self, x: Array) -> tuple[Array, Array]:
        """``(δ (d,), the shifted points (2d or d, d))``.

        The points are ``x + δ_k e_k`` (then ``x - δ_k e_k`` if central).
        """
        eps = jnp.finfo(x.dtype).eps
        step = (
            self.step
            if self.step is not None
            else (eps ** (1 / 3) if self.scheme == "central" else eps**0.5)
        )
        delta = jnp.asarray(step, x.dtype) * jnp.maximum(1.0, jnp.abs(x))
        shifts = jnp.eye(x.shape[-1], dtype=x.dtype) * delta  # row k: δ_k e_k
        points = (
            jnp.concatenate([x + shifts, x - shifts])
            if self.scheme == "central"
            else x + shifts
        )
        return delta, points

    def _values(self, points: Array) -> Array:
        return jax.vmap(lambda y: jnp.asarray(self.logdensity_fn(y), points.dtype))(
            points
        )

    def _differences(self, delta: Array, shifted: Array, value: Array) -> Array:
        d = delta.shape[-1]
        if self.scheme == "central":
            return (shifted[:d] - shifted[d:]) / (2 * delta)
        return (shifted - value) / delta

    def value_and_grad(self, x: Array) -> tuple[Array, Array]:
        """``(log π(x), ∇ log π(x))`` from one batched call.

        ``x`` itself is the last point of the call.

        Args:
          x: the point, shape ``(d,)``.

        Returns:
          ``(value, gradient)``: a scalar and a ``(d,)`` array.
        """
        delta, points = self._shifted(x)
        values = self._values(jnp.concatenate([points, x[None, :]]))
        return values[-1], self._differences(delta, values[:-1], values[-1])

    def grad_given_value(self, x: Array, value: Array) -> Array:
        """The gradient at ``x`` where ``value = log π(x)`` is known.

        Forward differences reuse it.

        Args:
          x: the point, shape ``(d,)``.
          value: ``log π(x)``, a scalar.

        Returns:
          The gradient, shape ``(d,)``.
        """
        delta, points = self._shifted(x)
        return self._differences(
            delta, self._values(points), jnp.asarray(value, x.dtype)
        )

    def values_and_grads(self, x: Array, rows: Array) -> tuple[Array, Array]:
        """The values at every point and the gradients at some, from one batched call.

        The call holds the ``M`` points and the shifted points of the ``B`` rows
        (``M + B·2d`` central, ``M + B·d`` forward: the value at a row is reused),
        so a model with a fixed cost per call pays it once. CEnLMC's lookahead
        (:func:`cenlmc_jax.ensemble.cenlmc.cenlmc_step`) evaluates the moved
        particles and the next step's gradients this way.

        Args:
          x: the points, ``(M, d)``.
          rows: ``(B,)`` int indices into ``x`` (repeats allowed).

        Returns:
          ``(values (M,), gradients (B, d))``: ``gradients[b]`` is the gradient at
          ``x[rows[b]]``, the same numbers as ``grad_given_value`` there when the
          model's value at a point does not depend on the batch it rides in.
        """
        m = x.shape[0]
        delta, points = jax.vmap(self._shifted)(x[rows])
        values = self._values(jnp.concatenate([x, points.reshape(-1, x.shape[-1])]))
        shifted = values[m:].reshape(points.shape[:2])
        grads = jax.vmap(self._differences)(delta, shifted, values[:m][rows])
        return values[:m], grads

    def __call__(self, x: Array) -> Array:
        if self.scheme == "central":  # 2d points; the value at x is not needed
            delta, points = self._shifted(x)
            return self._differences(
                delta, self._values(points), jnp.zeros((), x.dtype)
            )
        return self.value_and_grad(x)[1]

    def __repr__(self) -> str:
        return (
            f"finite_difference({self.logdensity_fn!r}, step={self.step!r}, "
            f"scheme={self.scheme!r})"
        )


def finite_difference(
    logdensity_fn: LogDensityFn, *, step: float | None = None, scheme: str = "central"
) -> Callable[[Array], Array]:
    """A gradient ``x: (d,) -> ∇ log π(x)`` by finite differences of ``logdensity_fn``.

    See the module docstring. Pass it as ``grad_fn=`` to ``cj.lmc``, ``cj.enlmc``
    or ``cj.cenlmc``.

    Args:
      logdensity_fn: ``x: (d,) -> scalar``; may be a black box behind
        ``jax.pure_callback``.
      step: relative step ``δ_k / max(1, |x_k|)``; None: ``ε^{1/3}`` (central) or
        ``ε^{1/2}`` (forward).
      scheme: ``"central"`` (2d values, O(δ²)) or ``"forward"`` (d + 1 values,
        O(δ)).

    Returns:
      A :class:`FiniteDifferenceGrad`: callable ``x: (d,) -> (d,)``, with
      ``value_and_grad``, ``grad_given_value`` and the cost methods
      ``model_solves`` / ``model_solves_given_value``.

    Raises:
      ValueError: ``logdensity_fn`` not callable, an unknown ``scheme``, or a
        ``step`` not ``> 0``.
    """
    check_callable(logdensity_fn, "logdensity_fn", "x -> scalar log density")
    check_choice(scheme, "scheme", ("central", "forward"))
    if step is not None:
        check_positive(step, "step")
    return FiniteDifferenceGrad(logdensity_fn, step, scheme)
