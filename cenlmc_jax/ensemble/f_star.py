"""The minimum ``f*`` of ``f = -log π`` that CEnLMC's ``M_f`` test needs.

:func:`find_f_star` finds ``f* = min f = -max logdensity_fn`` (needed by the
``M_f`` test of eq. 3.21) with optax's L-BFGS, started from the best particle.
"""

from __future__ import annotations

import collections
import functools
import math
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from cenlmc_jax._batch import batch_logdensity
from cenlmc_jax._validation import (
    check_int,
    check_logdensity,
    check_positions,
    check_positive,
    is_concrete,
    point_like,
)
from cenlmc_jax.types import Array, ArrayLike, LogDensityFn

__all__ = ["FStarResult", "find_f_star", "with_gradient"]


# --------------------------------------------------------------------------
# f* by optimisation.
# --------------------------------------------------------------------------


class FStarResult(NamedTuple):
    """Result of :func:`find_f_star`.

    Attributes:
      f_star: ``()`` the minimum found, ``min(f(x_opt), min_i f(x_i))``.
      position: ``(d,)`` where it was found.
      grad_norm: ``()`` ``|∇f|`` there.
      num_steps: ``()`` L-BFGS iterations done.
      converged: ``()`` ``grad_norm <= tol``.
      tol: the gradient tolerance used.
    """

    f_star: Array
    position: Array
    grad_norm: Array
    num_steps: Array
    converged: Array
    tol: float


@functools.partial(jax.jit, static_argnames=("logdensity_fn",))
def _lbfgs_minimise(logdensity_fn, x0, tol, max_steps):
    # max_steps traced: a search and a short probe share one compiled program
    # imported here, not at the top: a run given f* never searches, and should not pay
    # for optax's import
    import optax
    import optax.tree_utils as otu

    def f(x):
        return -logdensity_fn(x)

    opt = optax.lbfgs()
    value_and_grad = optax.value_and_grad_from_state(f)

    def step(carry):
        x, state = carry
        value, grad = value_and_grad(x, state=state)
        updates, state = opt.update(grad, state, x, value=value, grad=grad, value_fn=f)
        return optax.apply_updates(x, updates), state

    def keep_going(carry):
        _, state = carry
        count = otu.tree_get(state, "count")
        err = otu.tree_norm(otu.tree_get(state, "grad"))
        return (count == 0) | ((count < max_steps) & (err > tol) & jnp.isfinite(err))

    x, state = jax.lax.while_loop(keep_going, step, (x0, opt.init(x0)))
    value, grad = jax.value_and_grad(f)(x)
    return x, value, jnp.linalg.norm(grad), otu.tree_get(state, "count")


class _returns_array:
    """``logdensity_fn`` with its value as an array of the input's dtype.

    Hashable: jit keys on it.
    """

    def __init__(self, fn):
        self.fn = fn

    def __call__(self, x):
        return jnp.asarray(self.fn(x), x.dtype)

    def __hash__(self):
        return hash(self.fn)

    def __eq__(self, other):
        return isinstance(other, _returns_array) and other.fn == self.fn


#: The last few L-BFGS results of :func:`find_f_star`, by (function, start point, tol,
#: max_steps).
_LBFGS_MEMO: collections.OrderedDict = collections.OrderedDict()
_LBFGS_MEMO_SIZE = 8


def _memo_lbfgs(logdensity_fn, x0, tol, max_steps):
    """:func:`_lbfgs_minimise`, run once per (function, start point, tol, max_steps).

    Once in a process, for a concrete start point. The result depends on nothing
    else, so a second :func:`find_f_star` from the same best particle (the CLI's
    curvature probe, then ``cenlmc_init``; on an ODE model the search is dear,
    issue 17) reuses it. Traced start points are never memoised.
    """
    if not (is_concrete(x0) and is_concrete(tol)):
        return _lbfgs_minimise(logdensity_fn, x0, tol, max_steps)
    start = np.asarray(x0)
    key = (
        logdensity_fn,
        start.dtype.str,
        start.shape,
        start.tobytes(),
        float(tol),
        max_steps,
    )
    if key not in _LBFGS_MEMO:
        _LBFGS_MEMO[key] = _lbfgs_minimise(logdensity_fn, x0, tol, max_steps)
        while len(_LBFGS_MEMO) > _LBFGS_MEMO_SIZE:
            _LBFGS_MEMO.popitem(last=False)
    _LBFGS_MEMO.move_to_end(key)
    return _LBFGS_MEMO[key]


def with_gradient(logdensity_fn: LogDensityFn, grad_fn: Callable) -> LogDensityFn:
    """``logdensity_fn`` whose derivative is ``grad_fn`` (a ``jax.custom_jvp``).

    A black-box model (NumPy behind ``jax.pure_callback``) has no autodiff; its
    gradient comes from ``grad_fn`` (e.g. :func:`cenlmc_jax.finite_difference`). The
    L-BFGS search for ``f*`` differentiates the log density, and through this wrapper
    it gets ``grad_fn``'s gradient.

    Args:
      logdensity_fn: ``x: (d,) -> log π(x)``, a scalar.
      grad_fn: ``x: (d,) -> ∇log π(x)``, ``(d,)``.

    Returns:
      The same function of ``x``, with ``jvp(x, t) = grad_fn(x) · t``.
    """

    @jax.custom_jvp
    def fn(x):
        return logdensity_fn(x)

    @fn.defjvp
    def _jvp(primals, tangents):
        (x,), (t,) = primals, tangents
        g = jnp.asarray(grad_fn(x), x.dtype)
        return fn(x), jnp.vdot(g, t)

    return fn


def find_f_star(
    logdensity_fn: LogDensityFn,
    positions: ArrayLike,
    *,
    tol: float | None = None,
    max_steps: int = 500,
) -> FStarResult:
    """``f* = min f = -max logdensity_fn`` by L-BFGS (optax) from the best particle.

    Starts from ``argmax_i logdensity_fn(x_i)`` over ``positions: (N, d)`` and
    runs ``optax.lbfgs`` (zoom line search, so ``f`` never increases) until
    ``|∇f| <= tol`` or ``max_steps`` iterations.

    For a non-convex ``f`` this is a local minimum near the best particle; an
    ``f*`` that is too high only loosens the ``M_f`` test. The returned value
    is never above the best particle's ``f`` (a failed or non-finite
    optimisation falls back to it, with ``converged=False``).

    Args:
      logdensity_fn: ``x: (d,) -> log π(x) + const``.
      positions: the ensemble, ``(N, d)``.
      tol: the gradient tolerance; defaults to ``sqrt(machine eps)`` of the
        positions' dtype (3.5e-4 in float32, 1.5e-8 in float64): below it the
        gradient is dominated by rounding in ``f``. For μ-convex ``f`` the error in
        ``f*`` is at most ``|∇f|²/(2μ)`` (6e-8/μ in float32). ``f*`` only shifts
        the threshold ``f* + M_f`` of eq. 3.21, so any error far below ``M_f``
        (order 1-10) is immaterial.
      max_steps: the iteration limit, ``>= 1``.

    Returns:
      An :class:`FStarResult`.

    Raises:
      ValueError: bad positions or log density, ``max_steps < 1`` or ``tol`` not
        ``> 0``.
    """
    x = check_positions(positions)
    check_logdensity(logdensity_fn, point_like(x))
    max_steps = check_int(max_steps, "max_steps", minimum=1)
    if tol is None:
        tol = math.sqrt(float(jnp.finfo(x.dtype).eps))
    check_positive(tol, "tol")
    # a Python float return would break optax
    logdensity_fn = _returns_array(logdensity_fn)
    logdensity = batch_logdensity(x, logdensity_fn)
    best = jnp.argmax(jnp.where(jnp.isfinite(logdensity), logdensity, -jnp.inf))
    x0, f0 = x[best], -logdensity[best]
    xo, fo, gnorm, count = _memo_lbfgs(
        logdensity_fn, x0, jnp.asarray(tol, x.dtype), max_steps
    )
    ok = jnp.isfinite(fo) & (fo <= f0)
    return FStarResult(
        f_star=jnp.where(ok, fo, f0),
        position=jnp.where(ok, xo, x0),
        grad_norm=gnorm,
        num_steps=count,
        converged=ok & (gnorm <= tol),
        tol=float(tol),
    )
