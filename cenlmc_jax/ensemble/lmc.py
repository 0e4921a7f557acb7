"""Langevin Monte Carlo on an ensemble (docs/algorithms.md §1).

Ding & Li, *Constrained Ensemble Langevin Monte Carlo*: LMC (the unadjusted
Langevin algorithm, ULA) is the baseline every ensemble method is measured
against. With ``f = -logdensity_fn``::

    x^{m+1} = x^m - h ∇f(x^m) + sqrt(2h) ξ^m,      ξ^m ~ N(0, I_d).

For ``f(x) = |x|²/(2σ²)`` the chain is Gaussian with stationary variance
``σ² / (1 - h/(2σ²))`` per coordinate: the discretisation bias of ULA.

A step-size schedule (``step_size`` a callable ``t -> h_t`` of the int32 step
counter ``state.step``, as the recipe family takes; an optax schedule works)
gives ``x^{m+1} = x^m - h_m ∇f(x^m) + sqrt(2 h_m) ξ^m``. On
``f(x) = (x - μ)²/(2σ²)`` the chain stays Gaussian, with the exact recursions
``E x^{m+1} = (1 - h_m/σ²) E x^m + h_m μ/σ²`` and
``Var x^{m+1} = (1 - h_m/σ²)² Var x^m + 2 h_m`` (``tests/test_schedules.py``).

Preconditioned LMC (``inverse_mass_matrix=M``, BlackJAX's name): with ``M``
symmetric positive definite (a scalar ``c·I``, a ``(d,)`` diagonal or a
``(d, d)`` matrix, the forms of :mod:`cenlmc_jax._linalg`)::

    x^{m+1} = x^m + h M ∇log π(x^m) + sqrt(2h) M^{1/2} ξ^m,

the Euler step of the Langevin diffusion
``dX = M ∇log π dt + sqrt(2) M^{1/2} dW``, which keeps π invariant for any
constant ``M``. It is LMC in the coordinates ``y = M^{-1/2} x`` (``M^{1/2}`` the
symmetric root): there the step is plain LMC on ``y ↦ π(M^{1/2} y)``, whose
Hessian is ``M^{1/2} H M^{1/2}``. On ``π = N(0, Σ)`` the chain is linear,
``x' = A x + sqrt(2h) M^{1/2} ξ`` with ``A = I - h M Σ⁻¹``, so its stationary
covariance ``S`` solves the discrete Lyapunov equation ``S = A S Aᵀ + 2h M``; for
``M = Σ``, ``A = (1 - h) I`` and ``S = Σ / (1 - h/2)``: the isotropic ULA bias,
whatever the condition number of ``Σ``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from cenlmc_jax._linalg import (
    check_matrix_form,
    check_matrix_shape,
    check_symmetric_psd,
    np_psd_sqrt,
    psd_sqrt,
)
from cenlmc_jax._steps import bound_step
from cenlmc_jax._validation import (
    check_callable,
    check_key,
    check_logdensity,
    check_positions,
    check_schedule,
    check_start_logdensity,
    check_state,
    is_concrete,
    point_like,
)
from cenlmc_jax.base import SamplingAlgorithm, StepSize, step_size_at
from cenlmc_jax.gradients.ensemble import (
    GRAD_FN_WHAT,
    check_grad_fn,
    grad_cost,
    gradient_fn,
    shares_values,
    value_and_grad_cost,
    value_and_grad_ensemble,
)
from cenlmc_jax.gradients.modes import check_grad_mode
from cenlmc_jax.types import Array, ArrayLike, LogDensityFn, PRNGKey

__all__ = [
    "LMCState",
    "LMCInfo",
    "lmc_init",
    "lmc_step",
    "lmc",
    "check_inverse_mass_matrix",
    "mass_root",
    "untracked_nonfinite",
    "lmc_move",
    # re-exported from cenlmc_jax.gradients.ensemble, where they live now
    "grad_cost",
    "gradient_fn",
    "value_and_grad_ensemble",
    "shares_values",
    "value_and_grad_cost",
]


class LMCState(NamedTuple):
    """Ensemble state of LMC.

    Attributes:
      position: ``(N, d)`` particles.
      logdensity: ``(N,)`` ``logdensity_fn`` at each particle; with
        ``track_logdensity=False`` (the default of :func:`lmc` and :func:`lmc_step`)
        the values of :func:`lmc_init`, carried unchanged: the drift needs only the
        gradient, so a step does not evaluate the log density.
      logdensity_grad: ``(N, d)`` its gradient, reused by the next step.
      step: ``()`` int32, the steps taken (the ``t`` of a step-size schedule
        ``t -> h_t``).
    """

    position: Array
    logdensity: Array
    logdensity_grad: Array
    step: Array


class LMCInfo(NamedTuple):
    """What one LMC step did.

    Attributes:
      grad_evals: gradient evaluations done this step (= N).
      model_solves: the step's cost in evaluations of the model: N with autodiff;
        with ``grad_fn``, N × :func:`~cenlmc_jax.gradients.ensemble.grad_cost` (N ×
        :func:`~cenlmc_jax.gradients.ensemble.value_and_grad_cost`
        when the log density is tracked; finite differences of ``logdensity_fn``:
        ``d + 1`` forward, ``2d + 1`` central); N more at a step whose values
        were evaluated because a gradient was exactly 0
        (:func:`untracked_nonfinite`).
      num_nonfinite: particles whose new position or gradient is NaN/inf (or log
        density, when tracked; untracked, the checks of
        :func:`untracked_nonfinite`: the virial ``x · ∇log p``, and the log
        density where the gradient is exactly 0).
      diverged: ``num_nonfinite > 0``, or a step size (traced, or a schedule's
        value) that is not > 0.
    """

    grad_evals: Array
    model_solves: Array
    num_nonfinite: Array
    diverged: Array


def count_nonfinite(position: Array, logdensity: Array) -> Array:
    """Number of particles whose position (or its square) or log density is not
    finite.

    ``logdensity``: ``(N,)`` values, or ``(N, d)`` gradients (a step that does not
    evaluate the log density checks the drift it will take instead).
    """
    finite = jnp.isfinite(logdensity)
    if finite.ndim == position.ndim:
        finite = jnp.all(finite, axis=-1)
    # a position whose square overflows has exploded too: the streamed moments square
    # it, and without the log density (which would be -inf there) nothing else says so
    bad = ~jnp.isfinite(jnp.sum(position * position, axis=-1)) | ~finite
    return jnp.sum(bad, dtype=jnp.int32)


def untracked_nonfinite(
    logdensity_fn: LogDensityFn, position: Array, grad: Array
) -> tuple[Array, Array]:
    """The diverged particles of a step that evaluates the gradient only.

    Without the log density, at no model call: a particle whose position (or its
    square) or gradient is not finite (a NaN gradient included), or whose virial
    ``x · ∇log p(x)`` is not finite (for a log density growing like ``|x|^k``,
    ``k log p``: it overflows when the log density would, where ``4 x³`` of a
    quartic is still finite; ``E_π[x · ∇log π] = -d``, so no target in its range
    comes near). And where a particle's gradient is exactly 0 (every coordinate),
    which is all a NaN or ``-inf`` region written with ``jnp.where`` gives (the
    untaken branch's gradient), its log density is evaluated and a NaN or
    infinite value counts: one evaluation of the ensemble's values, under a
    ``lax.cond``, only at a step where some gradient vanishes (under ``jax.vmap``
    the cond is a select, and the values are evaluated at every step).

    Args:
      logdensity_fn: ``x: (d,) -> log π(x) + const``.
      position: ``(N, d)`` the new positions.
      grad: ``(N, d)`` the gradients there.

    Returns:
      ``(count, valued)``: the number of diverged particles (int32) and whether
      the log density was evaluated (bool).
    """
    square = jnp.sum(position * position, axis=-1)
    virial = jnp.sum(position * grad, axis=-1)
    bad = (
        ~jnp.isfinite(square)
        | ~jnp.all(jnp.isfinite(grad), axis=-1)
        | ~jnp.isfinite(virial)
    )
    flat = jnp.all(grad == 0, axis=-1)
    valued = jnp.any(flat)

    def values(_):
        v = jax.vmap(logdensity_fn)(position)
        return flat & ~jnp.isfinite(v)

    bad = bad | jax.lax.cond(valued, values, lambda _: jnp.zeros_like(flat), None)
    return jnp.sum(bad, dtype=jnp.int32), valued


MASS_WHAT = "the inverse mass matrix M of x' = x + h M ∇log π(x) + sqrt(2h) M^{1/2} ξ"


def check_inverse_mass_matrix(
    M: Any, d: int | None = None, name: str = "inverse_mass_matrix"
) -> Any:
    """Checks that ``M`` is a constant symmetric positive definite matrix.

    A scalar ``c > 0`` (``c·I``), a ``(d,)`` diagonal of positive entries or a
    ``(d, d)`` SPD matrix (:func:`cenlmc_jax._linalg.check_symmetric_psd` with
    ``definite=True``). ``None`` passes (no preconditioner); a traced ``M`` passes
    unchecked (its value is not known).

    Args:
      M: the inverse mass matrix, or None.
      d: the dimension, when known.
      name: its name, for the message.

    Returns:
      ``M``.

    Raises:
      ValueError: naming ``name``: a callable, the wrong shape, or not positive
        definite.
    """
    if M is None or not is_concrete(M):
        return M
    if callable(M):
        raise ValueError(
            f"{name} must be a constant matrix (a scalar, a (d,) diagonal or a (d, d) "
            f"SPD matrix); got a callable {M!r}: a position-dependent preconditioner "
            "needs the Γ term of the complete recipe (cj.sgrld / cj.complete_recipe)."
        )
    check_matrix_form(M, name)
    m = np.asarray(M)
    if d is not None:
        check_matrix_shape(m, name, d)
    if m.ndim < 2:
        if not np.all(m > 0):
            raise ValueError(
                f"{name} must be positive ({MASS_WHAT}); got "
                f"{'a scalar' if m.ndim == 0 else 'a diagonal'} with smallest entry "
                f"{float(np.min(m)):.4g}."
            )
    else:
        check_symmetric_psd(M, name, MASS_WHAT, definite=True)
    return M


def mass_root(M: Any) -> Any:
    """``M^{1/2}``: ``sqrt`` of a scalar or a diagonal, the symmetric root of a matrix.

    Float64 NumPy for a constant, :func:`cenlmc_jax._linalg.psd_sqrt` for a traced
    one.

    Args:
      M: a scalar, ``(d,)`` or ``(d, d)`` SPD matrix.

    Returns:
      ``M^{1/2}`` in the same form.
    """
    if is_concrete(M):
        m = np.asarray(M, np.float64)
        return np_psd_sqrt(m) if m.ndim == 2 else np.sqrt(m)
    m = jnp.asarray(M)
    return psd_sqrt(m) if m.ndim == 2 else jnp.sqrt(m)


def _rows_times(m: Array, v: Array) -> Array:
    """``m v_i`` for every row of ``v: (N, d)``; ``m`` a scalar, a diagonal or dense."""
    return v @ m.T if m.ndim == 2 else v * m


def lmc_init(
    positions: ArrayLike,
    logdensity_fn: LogDensityFn,
    *,
    grad_fn: Callable | None = None,
    grad_mode: str = "auto",
) -> LMCState:
    """Start LMC from ``positions: (N, d)``; evaluates the N gradients once.

    Args:
      positions: the ensemble, ``(N, d)``.
      logdensity_fn: ``x: (d,) -> log π(x) + const``.
      grad_fn: ``x: (d,) -> ∇ log π(x)``, or None: autodiff in ``grad_mode``.
      grad_mode: ``"auto"``, ``"reverse"`` or ``"forward"``.

    Returns:
      The :class:`LMCState` at ``positions``, ``step = 0``.

    Raises:
      ValueError: bad positions, a ``logdensity_fn`` or ``grad_fn`` with the wrong
        output, or a log density ``-inf``/NaN at every particle.
    """
    check_grad_mode(grad_mode)
    positions = check_positions(positions)
    check_logdensity(logdensity_fn, point_like(positions))
    check_grad_fn(grad_fn, point_like(positions))
    logdensity, g = value_and_grad_ensemble(
        logdensity_fn, positions, grad_fn, grad_mode
    )
    check_start_logdensity(logdensity, where="particle of positions")
    return LMCState(positions, logdensity, g, jnp.zeros((), jnp.int32))


def lmc_step(
    rng_key: PRNGKey,
    state: LMCState,
    logdensity_fn: LogDensityFn,
    step_size: StepSize,
    *,
    grad_fn: Callable | None = None,
    grad_mode: str = "auto",
    inverse_mass_matrix: Any = None,
    track_logdensity: bool = False,
) -> tuple[LMCState, LMCInfo]:
    """One unadjusted Langevin step for every particle.

    ``x' = x + h ∇log p(x) + sqrt(2h) ξ`` with ``h = step_size``; pure and
    jittable. The gradient at ``x'`` is evaluated here (N evaluations) and stored
    in the state for the next step; the log density only with
    ``track_logdensity`` (the step does not need it: on a logistic regression its
    ``softplus`` terms cost about a tenth of the step, benchmarks/results/waste.md).
    Both gradient modes give the same chain up to rounding.

    Args:
      rng_key: the step's key.
      state: an :class:`LMCState`.
      logdensity_fn: ``x: (d,) -> log π(x) + const``.
      step_size: ``h``, a number > 0 or a schedule ``t -> h_t`` evaluated at
        ``state.step`` (module docstring).
      grad_fn: ``x: (d,) -> ∇ log π(x)``, or None: autodiff in ``grad_mode``.
      grad_mode: ``"auto"``, ``"reverse"`` or ``"forward"``
        (:mod:`cenlmc_jax.gradients.modes`).
      inverse_mass_matrix: ``M`` (default None, the identity): the preconditioned
        step ``x' = x + h M ∇log p(x) + sqrt(2h) M^{1/2} ξ`` (module docstring),
        ``M`` a scalar, a ``(d,)`` diagonal or a ``(d, d)`` SPD matrix, checked
        (:func:`check_inverse_mass_matrix`) before tracing; ``M^{1/2}`` is the
        symmetric root, and ``ξ`` is the same draw as without ``M``.
      track_logdensity: evaluate ``logdensity_fn`` at ``x'`` too (one
        ``value_and_grad``) and store it in ``state.logdensity``; a particle whose
        value is NaN or ``-inf`` then counts as diverged. False (default): only the
        gradient, ``state.logdensity`` carried unchanged, a particle diverged when
        its position, gradient or virial ``x · ∇log p`` is not finite, or when its
        gradient is exactly 0 and its log density, then evaluated, is NaN or
        infinite (a NaN or ``-inf`` region written with ``jnp.where``, whose
        gradient is 0: :func:`untracked_nonfinite`).

    Returns:
      ``(state, info)``: the new :class:`LMCState` and an :class:`LMCInfo`.

    Raises:
      ValueError: a bad argument (state, key, step size, mode, ``M``).
    """
    check_grad_mode(grad_mode)
    check_state(state, LMCState, "lmc_init")
    check_key(rng_key)
    check_schedule(step_size, "step_size")
    mass = None
    if inverse_mass_matrix is not None:
        check_inverse_mass_matrix(inverse_mass_matrix, state.position.shape[-1])
        mass = (inverse_mass_matrix, mass_root(inverse_mass_matrix))
    return lmc_move(
        rng_key,
        state,
        logdensity_fn,
        step_size,
        grad_fn,
        grad_mode,
        mass,
        track_logdensity=track_logdensity,
    )


def lmc_move(
    rng_key,
    state,
    logdensity_fn,
    step_size,
    grad_fn,
    grad_mode,
    mass,
    *,
    track_logdensity: bool = True,
):
    """The step of :func:`lmc_step` without its checks.

    For callers that made them: the sampler object, the warm-up.

    Args:
      rng_key, state, logdensity_fn, grad_fn, grad_mode: as for :func:`lmc_step`.
      step_size: ``h`` (traced allowed) or a schedule of ``state.step``.
      mass: ``(M, M^{1/2})`` (traced allowed) or None.
      track_logdensity: as for :func:`lmc_step` (default True here: the
        warm-up's callers keep the values).

    Returns:
      ``(state, info)``: the new :class:`LMCState` and an :class:`LMCInfo`.
    """
    x = state.position
    h = (
        step_size_at(step_size, state.step, x.dtype)
        if callable(step_size)
        else jnp.asarray(step_size, x.dtype)
    )
    noise = jax.random.normal(rng_key, x.shape, dtype=x.dtype)
    drift, kick = state.logdensity_grad, noise
    if mass is not None:
        m, root = (jnp.asarray(a, x.dtype) for a in mass)
        drift, kick = _rows_times(m, drift), _rows_times(root, noise)
    new_x = x + h * drift + jnp.sqrt(2.0 * h) * kick
    n, d = x.shape
    if track_logdensity:
        logdensity, g = value_and_grad_ensemble(
            logdensity_fn, new_x, grad_fn, grad_mode
        )
        bad = count_nonfinite(new_x, logdensity)
        cost = value_and_grad_cost(grad_fn, logdensity_fn, d)
    else:
        g = jax.vmap(gradient_fn(logdensity_fn, grad_fn, grad_mode))(new_x)
        g = g.astype(x.dtype)
        logdensity = state.logdensity
        bad, valued = untracked_nonfinite(logdensity_fn, new_x, g)
        cost = grad_cost(grad_fn, d)
    solves = n * (cost if grad_fn is not None else 1)
    if not track_logdensity:
        solves = solves + n * valued.astype(x.dtype)  # the values, where they were
    info = LMCInfo(
        grad_evals=jnp.asarray(n, jnp.int32),
        model_solves=jnp.asarray(solves, x.dtype),
        num_nonfinite=bad,
        diverged=(bad > 0) | ~(h > 0),
    )
    return LMCState(new_x, logdensity, g, state.step + 1), info


def lmc(
    logdensity_fn: LogDensityFn,
    step_size: StepSize,
    *,
    inverse_mass_matrix: Any = None,
    grad_fn: Callable | None = None,
    grad_mode: str = "auto",
    track_logdensity: bool = False,
) -> SamplingAlgorithm:
    """LMC (ULA) on an ensemble as a sampler object.

    ``init(positions, rng_key=None)``: :func:`lmc_init` on ``positions: (N, d)``.
    ``step(rng_key, state)``: :func:`lmc_step` with these parameters.

    Args:
      logdensity_fn: ``x: (d,) -> log π(x) + const``.
      step_size: a number > 0 or a schedule ``t -> h_t`` of ``state.step`` (its
        output and its value at 0 checked here).
      inverse_mass_matrix: the preconditioner ``M`` of :func:`lmc_step` (a scalar,
        ``(d,)`` or ``(d, d)`` SPD; checked here, its dimension at ``init``; its
        root is taken once, here). ``cj.langevin_warmup`` estimates it.
      grad_fn: ``x: (d,) -> ∇ log density (d,)`` (an adjoint solver, finite
        differences, an external code); it overrides ``grad_mode``.
      grad_mode: how the autodiff gradient is taken without ``grad_fn``:
        ``"reverse"`` (``jax.value_and_grad``), ``"forward"`` (d ``jvp`` calls, the
        value from the primal: faster on an ODE model at small d), or ``"auto"``
        (default: forward for ``d <= cenlmc_jax.gradients.modes.FORWARD_MAX_D``,
        the crossover of benchmarks/results/grad_mode.md,
        :func:`cenlmc_jax.gradients.modes.resolve_grad_mode`).
      track_logdensity: evaluate the log density at every step too (for
        ``state.logdensity``, and to count a ``-inf`` value as a divergence); False
        (default): the gradient only, as :func:`lmc_step`.

    Returns:
      A :class:`~cenlmc_jax.base.SamplingAlgorithm` ``(init, step)``.

    Raises:
      ValueError: a bad argument, checked here.
    """
    check_callable(logdensity_fn, "logdensity_fn", "x -> scalar log density")
    check_schedule(step_size, "step_size")
    check_grad_mode(grad_mode)
    check_inverse_mass_matrix(inverse_mass_matrix)
    mass = (
        None
        if inverse_mass_matrix is None
        else (inverse_mass_matrix, mass_root(inverse_mass_matrix))
    )
    if grad_fn is not None:
        check_callable(grad_fn, "grad_fn", GRAD_FN_WHAT)

    def init(positions, rng_key=None):
        if rng_key is not None:
            # unused (a deterministic start), but a wrong one is a mistake to report
            check_key(rng_key)
        state = lmc_init(positions, logdensity_fn, grad_fn=grad_fn, grad_mode=grad_mode)
        check_inverse_mass_matrix(inverse_mass_matrix, state.position.shape[-1])
        return state

    # one function per distinct parameters (_steps.bound_step): a rebuilt sampler reuses
    # cj.sample's compiled run (a preconditioner, an array, gives a fresh one)
    step = bound_step(
        _sampler_step,
        logdensity_fn=logdensity_fn,
        step_size=step_size,
        grad_fn=grad_fn,
        grad_mode=grad_mode,
        mass=mass,
        track_logdensity=track_logdensity,
    )
    return SamplingAlgorithm(init, step)


def _sampler_step(
    rng_key,
    state,
    *,
    logdensity_fn,
    step_size,
    grad_fn,
    grad_mode,
    mass,
    track_logdensity,
):
    """The step of :func:`lmc`'s sampler object: the state and key checked, then
    :func:`lmc_move`."""
    check_state(state, LMCState, "lmc_init")
    check_key(rng_key)
    if mass is not None and is_concrete(mass[0]):
        check_matrix_shape(
            np.asarray(mass[0]), "inverse_mass_matrix", state.position.shape[-1]
        )
    return lmc_move(
        rng_key,
        state,
        logdensity_fn,
        step_size,
        grad_fn,
        grad_mode,
        mass,
        track_logdensity=track_logdensity,
    )
