"""Forward or reverse mode for the gradient of a log density.

The one implementation every sampler uses. ``grad_mode`` is a keyword of
``cj.lmc``, ``cj.enlmc`` / ``cj.cenlmc`` (through
:class:`~cenlmc_jax.ensemble.EnsembleOptions`), ``cj.irreversible.sde_proposal``,
``cj.gradients.grad_estimator_from_logdensity`` and ``cj.max_curvature``:

* ``"reverse"``: ``jax.value_and_grad`` (one forward sweep, then one backward
  sweep through the stored intermediates: about 3-4 values' work whatever d is,
  plus the memory of the whole computation, e.g. an ODE trajectory);
* ``"forward"``: ``jax.jvp`` along each of the d basis vectors ``e_1..e_d``:
  ``∂_k log π = jvp(e_k)``, the value the primal output; about ``d·c`` values'
  work (``c`` ≈ 1.5-3), no stored trajectory (:func:`_forward_value_and_grad`
  says why the d ``jvp`` calls are not one ``jax.jacfwd``);
* ``"auto"``: forward when ``d <= FORWARD_MAX_D``, else reverse
  (:func:`resolve_grad_mode`); reverse also where the log density has no forward
  rule (a ``jax.custom_vjp`` adjoint).

Both give the same gradient up to rounding (they are the same chain rule,
summed in another order). d is the flat size of the position (a pytree is
counted leaf by leaf), known at trace time, so the choice is static.
A user's ``grad_fn`` (an adjoint solver, finite differences) overrides the mode.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

from cenlmc_jax._validation import check_choice

__all__ = [
    "GRAD_MODES",
    "FORWARD_MAX_D",
    "check_grad_mode",
    "resolve_grad_mode",
    "value_and_grad",
    "grad",
]

GRAD_MODES = ("auto", "reverse", "forward")

#: ``grad_mode="auto"`` takes forward mode for ``d <= FORWARD_MAX_D`` (see
#: :func:`resolve_grad_mode`).
FORWARD_MAX_D = 5


def check_grad_mode(grad_mode: Any, name: str = "grad_mode") -> str:
    """Checks that ``grad_mode`` is ``"auto"``, ``"reverse"`` or ``"forward"``.

    Args:
      grad_mode: the argument.
      name: its name, for the message.

    Returns:
      ``grad_mode``.

    Raises:
      ValueError: naming it, for any other value.
    """
    return check_choice(grad_mode, name, GRAD_MODES)


def resolve_grad_mode(grad_mode: str, d: int) -> str:
    """``"forward"`` or ``"reverse"`` for a position of flat size ``d``.

    ``"auto"`` is forward for ``d <= FORWARD_MAX_D`` = 5, reverse above. The
    choice rests on ``benchmarks/bench_grad_mode.py`` (CPU time, one pinned
    thread, float32, N particles vmapped, reverse / forward time per gradient; the
    ratios are in benchmarks/results/grad_mode.md) on two model kinds:

    * an ODE model, the SIR epidemic of :mod:`cenlmc_jax.models.inverse_problems`
      (RK4, 1,000 steps in ``lax.scan``) with d parameters of its contact rate:
      forward is faster up to d = 5, by less as d grows, and slower from d = 10;
      the library's own SIR problem (d = 2) gains as much. The crossover lies
      between 5 and 10.
    * cheap closed-form densities: a Gaussian with a dense precision and a
      logistic regression on 200 points: reverse is a little faster at every d.
    * not in the benchmark: ``cj.models.inverse_problems.darcy_flow(3)`` (one
      tridiagonal solve a value, d = 3): reverse is faster.

    So at ``d <= 5`` auto gains where the gradient is dear (an ODE solve, the case
    the ensemble samplers exist for) and loses a little on the gradient of a
    closed-form density or a linear-solve model; pass ``grad_mode="reverse"`` for
    such a model, ``"forward"`` for an ODE model a little above d = 5 (bench it).

    Args:
      grad_mode: ``"auto"``, ``"reverse"`` or ``"forward"``.
      d: the flat size of the position.

    Returns:
      ``"forward"`` or ``"reverse"``.

    Raises:
      ValueError: an unknown ``grad_mode``.
    """
    check_grad_mode(grad_mode)
    if grad_mode != "auto":
        return grad_mode
    return "forward" if d <= FORWARD_MAX_D else "reverse"


def _flat_size(x: Any) -> int:
    return sum(int(leaf.size) for leaf in jax.tree_util.tree_leaves(x))


def _forward_value_and_grad(fn: Callable, x: Any) -> tuple[Any, Any]:
    """``(fn(x), ∇fn(x))`` by d ``jvp`` calls along the basis vectors ``e_k``.

    The value is the first one's primal. The d ``jvp`` calls are separate, not one
    ``vmap`` over the basis (``jax.jacfwd``): on XLA CPU (jaxlib 0.10.2) the
    vmapped form, vmapped again over particles, is miscompiled for some shapes (the
    YNNPACK reduce fusion of the ``(N, d, d)`` tangent product: wrong gradients,
    e.g. at d = 3, N = 16,000 and d = 5, N = 8,000, correct with
    ``XLA_FLAGS=--xla_cpu_experimental_ynn_fusion_type=-reduce``;
    tests/gradients/test_modes.py holds this form to reverse mode there). Separate
    ``jvp`` calls build no such array. Each computes the primal too: XLA merges the
    repeats of straight-line code; inside a ``lax.scan`` (an ODE solve) they stay,
    which costs some time over the vmapped form at d = 2-5 and still beats reverse
    mode there (benchmarks/results/grad_mode.md).
    """
    flat, unravel = ravel_pytree(x)
    basis = jnp.eye(flat.shape[0], dtype=flat.dtype)
    outs = [
        jax.jvp(lambda y: fn(unravel(y)), (flat,), (basis[k],))
        for k in range(flat.shape[0])
    ]
    tangents = jnp.stack([jnp.asarray(t, flat.dtype) for _, t in outs])
    return outs[0][0], unravel(tangents)


def _has_forward_rule(fn: Callable, x: Any) -> bool:
    """Whether ``fn`` can be differentiated in forward mode at ``x``'s shapes.

    Abstractly: no work. A ``jax.custom_vjp`` function (an adjoint solver, a model
    behind ``pure_callback`` with a hand-written vjp) has no forward rule:
    ``jax.jvp`` raises a ``TypeError`` while tracing.
    """

    def batched_jvp(
        x,
    ):  # vmapped: a plain staged jvp of a custom_vjp raises only when lowered
        flat, unravel = ravel_pytree(x)
        return jax.vmap(lambda v: jax.jvp(lambda z: fn(unravel(z)), (flat,), (v,)))(
            flat[None]
        )

    shapes = jax.tree_util.tree_map(
        lambda leaf: jax.ShapeDtypeStruct(jnp.shape(leaf), jnp.result_type(leaf)), x
    )
    try:  # on shapes only: nothing enters the caller's computation
        jax.eval_shape(batched_jvp, shapes)
    except TypeError:
        return False
    return True


def value_and_grad(fn: Callable, grad_mode: str = "auto") -> Callable:
    """``x -> (fn(x), ∇fn(x))`` in ``grad_mode`` (see the module docstring).

    ``"reverse"`` is ``jax.value_and_grad(fn)``; the gradient has the structure of
    ``x`` in both modes. ``"auto"`` falls back to reverse mode where ``fn`` has no
    forward rule (a ``jax.custom_vjp`` function; checked abstractly at trace time);
    an explicit ``"forward"`` raises JAX's error there.

    Args:
      fn: a function of an array or a pytree ``x`` returning a scalar.
      grad_mode: ``"auto"``, ``"reverse"`` or ``"forward"``.

    Returns:
      A function ``x -> (value, gradient)``, the gradient shaped like ``x``.

    Raises:
      ValueError: an unknown ``grad_mode``.
    """
    check_grad_mode(grad_mode)
    reverse = jax.value_and_grad(fn)

    def vg(x):
        if resolve_grad_mode(grad_mode, _flat_size(x)) == "reverse":
            return reverse(x)
        if grad_mode == "auto" and not _has_forward_rule(fn, x):
            return reverse(x)  # e.g. a jax.custom_vjp adjoint: reverse mode only
        return _forward_value_and_grad(fn, x)

    return vg


def grad(fn: Callable, grad_mode: str = "auto") -> Callable:
    """``x -> ∇fn(x)`` in ``grad_mode``: :func:`value_and_grad` without the value.

    Args:
      fn: a function of an array or a pytree ``x`` returning a scalar.
      grad_mode: ``"auto"``, ``"reverse"`` or ``"forward"``.

    Returns:
      A function ``x -> gradient``, the gradient shaped like ``x``.

    Raises:
      ValueError: an unknown ``grad_mode``.
    """
    vg = value_and_grad(fn, grad_mode)
    return lambda x: vg(x)[1]
