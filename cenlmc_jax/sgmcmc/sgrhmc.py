"""Stochastic-gradient Riemann HMC and the paper's gSGRHMC metric.

docs/algorithms.md §6.

Ma, Chen & Fox: with ``z = (θ, r)``, ``H = U(θ) + ½ rᵀr`` (``U = -log π``)
and a position-dependent metric ``G(θ)``, the complete recipe with

    D = [[0, 0], [0, G^{-1}]],   Q = [[0, -G^{-1/2}], [G^{-1/2}, 0]]

gives, in explicit Euler form (all at ``θ = θ_t``),

    θ' = θ + ε G^{-1/2} r
    r' = r + ε G^{-1/2} g̃(θ) + ε Γ_r(θ) - ε G^{-1} r + N(0, ε(2 G^{-1} - ε B̂))
    Γ_r,i = Σ_j ∂_{θ_j} (G(θ)^{-1/2})_ij            (the recipe's Γ, _linalg.gamma_term)

with ``g̃ ≈ ∇log π(θ)`` from a gradient estimator. Written block-wise so the
noise lives in ``r`` only; :func:`sgrhmc_dq` gives the ``D``, ``Q`` above so
the tests can check this step against :func:`cenlmc_jax.sgmcmc.recipe.recipe_step`.
Dropping ``Γ_r`` (``naive=True``) samples the wrong distribution: it exists
to show the difference (the paper's synthetic figure).

A metric that is not positive semidefinite somewhere (``G^{-1}(θ)`` with a
negative eigenvalue, or NaN) cannot be caught in Python once the step is
traced; there the root ``G^{-1/2}`` is clipped to 0, which freezes ``θ``. The
step reports it: ``info.invalid_metric``, and ``info.diverged`` with it, so
the driver warns and stops instead of returning a frozen chain.

Positions may be pytrees (flattened with ``ravel_pytree`` at each step's
boundary); ``inv_metric_fn`` and ``B_hat`` callables see the flat ``(d,)`` θ.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from cenlmc_jax import _linalg as la
from cenlmc_jax._validation import (
    check_bool,
    check_callable,
    check_key,
    check_positive,
    check_schedule,
    check_state,
    is_concrete,
)
from cenlmc_jax.base import SamplingAlgorithm, StepSize, step_size_at
from cenlmc_jax.gradients.estimators import flat_grad_estimator, ravel_position
from cenlmc_jax.sgmcmc.recipe import (
    NOISE_CLIPPED_FLAG,
    check_grad_estimator,
    initial_momentum,
)
from cenlmc_jax.types import Array, ArrayLike, GradEstimator, PRNGKey

__all__ = [
    "SGRHMCState",
    "SGRHMCInfo",
    "sgrhmc_init",
    "sgrhmc_step",
    "sgrhmc",
    "sgrhmc_dq",
    "gsgrhmc_inv_metric",
    "metric_invalid",
]

_GRAD_WHAT = "(rng_key, theta) -> estimate of the gradient of the log density at theta"


class SGRHMCState(NamedTuple):
    """State of an SGRHMC chain.

    Attributes:
      position: (d,) the parameter ``θ`` (what :func:`cenlmc_jax.run.sample`
        traces by default), or a pytree.
      momentum: the momentum ``r``, shaped like ``θ``.
      step: int32 step counter (drives a step-size schedule).
    """

    position: Array
    momentum: Array
    step: Array


class SGRHMCInfo(NamedTuple):
    """What one SGRHMC step did.

    Attributes:
      grad_evals: calls of ``grad_estimator`` (1).
      num_nonfinite: 1 when the new ``θ`` or ``r`` holds a NaN/inf, else 0
        (chains, as the ensembles count particles; explicit Euler can blow up
        where ``Γ_r`` is singular, e.g. gSGRHMC on the double well).
      diverged: ``num_nonfinite > 0``, ``invalid_metric``, or a step size ``ε_t`` not
        > 0.
      step_size: ``ε_t`` used.
      noise_clipped: ``ε(2G^{-1} - εB̂)`` had a clearly negative eigenvalue
        (clipped).
      gamma_norm: ``|Γ_r(θ)|`` (large values flag the neighbourhood of a
        singularity).
      invalid_metric: ``G^{-1}(θ)`` was not positive semidefinite (a negative
        diagonal entry, a dense matrix with a clearly negative eigenvalue, or
        NaN): its root was clipped and ``θ`` could not move as the recipe says.
    """

    grad_evals: Array
    num_nonfinite: Array
    diverged: Array
    step_size: Array
    noise_clipped: Array
    gamma_norm: Array
    invalid_metric: Array

    # cj.sample warns from the first clipped step
    run_flags = (NOISE_CLIPPED_FLAG,)


def _inv_metric(inv_metric_fn: la.MatrixLike, theta: Array) -> Array:
    """``G^{-1}(θ)`` as a ``(d,)`` diagonal (scalars broadcast) or a ``(d, d)``."""
    g = la.evaluate(inv_metric_fn, theta, "inv_metric_fn")
    return jnp.broadcast_to(g, theta.shape) if g.ndim == 0 else g


def _sqrt_inv_metric(inv_metric_fn: la.MatrixLike, theta: Array) -> tuple[Array, Array]:
    """``(G^{-1/2}(θ), G^{-1}(θ))``.

    ``sqrt`` of a diagonal, :func:`~cenlmc_jax._linalg.psd_sqrt` of a matrix.
    """
    g = _inv_metric(inv_metric_fn, theta)
    half = jnp.sqrt(jnp.clip(g, 0.0)) if g.ndim == 1 else la.psd_sqrt(g)
    return half, g


def metric_invalid(inv_metric_fn: la.MatrixLike, theta: Array) -> Array:
    """``G^{-1}(θ)`` clearly not positive semidefinite, or NaN.

    The traced check behind ``info.invalid_metric``. Diagonal (and scalar): any
    entry ``< 0``. Dense: smallest eigenvalue below ``-eig_tol(d)·max|G^{-1}|``
    (rounding of a PSD matrix stays above). A zero entry is allowed: gSGRHMC's
    ``D·sqrt(|U + C|)`` vanishes where ``U = -C``.

    Args:
      inv_metric_fn: ``G(θ)^{-1}``: a callable of θ or a constant, as a scalar,
        a ``(d,)`` diagonal or a ``(d, d)`` matrix.
      theta: the flat position, shape ``(d,)``.

    Returns:
      A scalar bool array: the metric's inverse at ``theta`` is invalid.
    """
    g = _inv_metric(inv_metric_fn, theta)
    if g.ndim == 1:
        # NaN counts as invalid
        return jnp.any(~(g >= 0))
    size = jnp.max(jnp.abs(g))
    lam_min = jnp.linalg.eigvalsh(0.5 * (g + g.T))[0]
    return ~(lam_min >= -la.eig_tol(g.shape[0]) * size)


def gamma_r(inv_metric_fn: la.MatrixLike, theta: Array) -> tuple[Array, Array, Array]:
    """``Γ_r,i = Σ_j ∂_{θ_j} (G^{-1/2})_ij``, with ``G^{-1/2}`` and ``G^{-1}`` at ``θ``.

    The recipe's one ``Γ`` (:func:`cenlmc_jax._linalg.gamma_term`) of the
    section-6 ``D``, ``Q`` (:func:`sgrhmc_dq`) is ``(0, Γ_r)``: neither matrix
    depends on ``r``, so the one block whose derivative enters is ``Q``'s
    ``G^{-1/2}(θ)`` (``r`` rows, ``θ`` columns). So ``Γ_r`` is ``gamma_term`` of
    ``G^{-1/2}`` as a ``d``-dimensional matrix of ``θ`` (forward mode; the roots
    come out of the same pass). For a diagonal metric only
    ``∂_{θ_i} (G^{-1/2})_i`` survives; a constant metric gives 0.
    """
    if not callable(inv_metric_fn):
        half, g = _sqrt_inv_metric(inv_metric_fn, theta)
        return jnp.zeros_like(theta), half, g

    def half_with_aux(t):
        half, g = _sqrt_inv_metric(inv_metric_fn, t)
        return half, (half, g)

    gamma, (_, (half, g)) = la.gamma_term(None, half_with_aux, theta, has_aux=True)
    return gamma, half, g


def sgrhmc_mean_and_root(theta, r, grad, eps, inv_metric_fn, B_hat, naive: bool):
    """Deterministic parts of θ', r', the noise root for r, noise_clipped, Γ_r.

    docs/algorithms.md §6.

    The root is (d,) for a diagonal covariance, (d, d) otherwise.
    """
    gamma, half, g = gamma_r(inv_metric_fn, theta)
    if naive:
        gamma = jnp.zeros_like(gamma)
    theta_mean = theta + eps * la.matvec(half, r)
    r_mean = r + eps * (la.matvec(half, grad) + gamma - la.matvec(g, r))
    if B_hat is None:
        # sqrt(2εG^{-1}) = sqrt(2ε)·G^{-1/2}: no second eigendecomposition.
        return theta_mean, r_mean, jnp.sqrt(2.0 * eps) * half, jnp.asarray(False), gamma
    b = la.evaluate(B_hat, theta, "B_hat")
    if g.ndim == 1 and b.ndim <= 1:
        two_g, eb = 2.0 * eps * g, eps * eps * b
        cov = two_g - eb
        tol = la.eig_tol(1) * jnp.maximum(jnp.abs(two_g), jnp.abs(eb))
        return (
            theta_mean,
            r_mean,
            jnp.sqrt(jnp.clip(cov, 0.0)),
            jnp.any(cov < -tol),
            gamma,
        )
    d = theta.shape[0]
    two_g, eb = 2.0 * eps * la.to_dense(g, d), eps * eps * la.to_dense(b, d)
    root, clipped = la.noise_root(
        two_g - eb, jnp.maximum(jnp.max(jnp.abs(two_g)), jnp.max(jnp.abs(eb)))
    )
    return theta_mean, r_mean, root, clipped, gamma


def check_sgrhmc_inputs(theta: Array, inv_metric_fn, B_hat, eps: Array | None) -> None:
    """At a concrete θ: ``G^{-1}(θ)`` symmetric PSD and the noise covariance PSD.

    The callables' output shapes at any θ, abstractly.
    """
    la.check_matrix_fn(inv_metric_fn, theta, "inv_metric_fn")
    la.check_matrix_fn(B_hat, theta, "B_hat")
    if not is_concrete(theta):
        return
    d = theta.shape[0]
    g = _inv_metric(inv_metric_fn, theta)
    if not is_concrete(g):
        return
    gm = la.constant_dense(g, d)
    la.check_symmetric_psd(
        gm, "inv_metric_fn(position)", "G(theta)^-1, the metric's inverse"
    )
    if B_hat is None or eps is None or not is_concrete(eps):
        return
    b = la.evaluate(B_hat, theta, "B_hat")
    if not is_concrete(b):
        return
    e = float(eps)
    la.check_noise_cov(
        e,
        gm,
        la.constant_dense(b, d),
        "the noise covariance step_size*(2*G^-1 - step_size*B_hat)",
        f"step_size={e:g}; B_hat too large for this step size",
    )


def sgrhmc_init(
    position: ArrayLike,
    rng_key: PRNGKey | None = None,
    *,
    momentum: ArrayLike | None = None,
    inv_metric_fn: la.MatrixLike | None = None,
    step_size: StepSize | None = None,
    B_hat: la.MatrixLike | None = None,
) -> SGRHMCState:
    """Start SGRHMC at ``θ = position: (d,)`` (or a pytree; callable inside jit).

    Momentum: ``r = 0`` by default (deterministic, like a fresh HMC chain at
    rest); ``r ~ N(0, I_d)``, the exact stationary law of ``r``, when
    ``rng_key`` is given; or ``momentum`` as given. With ``inv_metric_fn``
    (and ``step_size``, ``B_hat``) the metric and the noise covariance are
    checked at the initial point (``ValueError`` if not PSD). This is the
    function to call for a given momentum: the sampler object's
    ``init(position, rng_key=None)`` takes the arguments of every sampler's
    (so that :func:`cenlmc_jax.run.vmap_chains` can pass them).

    Args:
      position: θ, shape ``(d,)``, or a pytree.
      rng_key: ``None``, or a JAX PRNG key to draw ``r ~ N(0, I_d)``.
      momentum: ``None``, or the momentum, like ``position``.
      inv_metric_fn: ``None`` (no checks), or ``G(θ)^{-1}`` as in
        :func:`sgrhmc_step`.
      step_size: ``ε > 0`` or a schedule; ``None`` skips the noise covariance
        check.
      B_hat: ``None`` (0), or the ``r``-block gradient-noise covariance.

    Returns:
      The :class:`SGRHMCState` ``(θ, r, step=0)``, ``θ`` and ``r`` in the form of
      ``position``.

    Raises:
      ValueError: a bad key, both ``momentum`` and ``rng_key``, a momentum of
        another shape, or a metric or noise covariance that is not PSD.
    """
    if rng_key is not None:
        check_key(rng_key)
    theta, unravel = ravel_position(position)
    r = initial_momentum(theta, momentum, rng_key)
    step = jnp.zeros((), jnp.int32)
    if inv_metric_fn is not None:
        # checks on concrete values run eagerly, even inside jit
        with jax.ensure_compile_time_eval():
            eps = (
                None
                if step_size is None
                else step_size_at(step_size, step, theta.dtype)
            )
            check_sgrhmc_inputs(theta, inv_metric_fn, B_hat, eps)
    if unravel is None:
        return SGRHMCState(theta, r, step)
    return SGRHMCState(unravel(theta), unravel(r), step)


def sgrhmc_step(
    rng_key: PRNGKey,
    state: SGRHMCState,
    grad_estimator: GradEstimator,
    step_size: StepSize,
    inv_metric_fn: la.MatrixLike,
    B_hat: la.MatrixLike | None = None,
    *,
    naive: bool = False,
) -> tuple[SGRHMCState, SGRHMCInfo]:
    """One SGRHMC step (docs/algorithms.md §6, module docstring), one chain.

    Args:
      rng_key: split into ``(key_grad, key_noise)``; ``ξ ~ N(0, I_d)`` from
        ``key_noise`` in ``θ.dtype`` (with ``inv_metric_fn = 1``, ``B_hat =
        None``: BlackJAX's ``sgmcmc.diffusions.sghmc(alpha=1)`` from the same
        keys).
      state: :class:`SGRHMCState`.
      grad_estimator: ``(rng_key, θ) -> g̃(θ): (d,)``, an estimate of
        ``∇log π(θ)``.
      step_size: ``ε > 0`` or a schedule ``t -> ε_t``.
      inv_metric_fn: ``G(θ)^{-1}``: a callable of θ or a constant, as a scalar,
        a ``(d,)`` diagonal (root by ``sqrt``) or a ``(d, d)`` SPD matrix
        (root by :func:`~cenlmc_jax._linalg.psd_sqrt`).
      B_hat: ``None`` (0), a scalar, (d,), (d, d), or a callable of θ: the
        ``r``-block gradient-noise covariance entering the dynamics. For
        ``g̃ = ∇log π + ν``, ``Cov ν = V``: ``B̂ = G^{-1/2} V G^{-1/2}`` (e.g.
        ``lambda θ: V * inv_metric_fn(θ)`` for scalar ``V`` and a diagonal
        metric).
      naive: drop ``Γ_r`` ("naive SGRHMC"; samples the wrong distribution).

    Returns:
      ``(new_state, info)``: the next :class:`SGRHMCState` (``step + 1``) and its
      :class:`SGRHMCInfo`.

    Raises:
      ValueError: a state or key of the wrong kind, a non-callable estimator, or
        (at a concrete θ) a metric or noise covariance that is not PSD.
    """
    check_state(state, SGRHMCState, "sgrhmc_init, or sgrhmc(...).init")
    check_key(rng_key)
    check_callable(grad_estimator, "grad_estimator", _GRAD_WHAT)
    theta, unravel = ravel_position(state.position, check=False)
    r = ravel_position(state.momentum, "momentum", check=False)[0]
    eps = step_size_at(step_size, state.step, theta.dtype)
    check_sgrhmc_inputs(theta, inv_metric_fn, B_hat, eps)
    key_grad, key_noise = jax.random.split(rng_key)
    grad = jnp.asarray(
        flat_grad_estimator(grad_estimator, unravel)(key_grad, theta), theta.dtype
    )
    new_theta, r_mean, root, clipped, gamma = sgrhmc_mean_and_root(
        theta, r, grad, eps, inv_metric_fn, B_hat, naive
    )
    new_r = r_mean + la.matvec(
        root, jax.random.normal(key_noise, theta.shape, dtype=theta.dtype)
    )
    # chains: 0 or 1
    bad = (~(jnp.all(jnp.isfinite(new_theta)) & jnp.all(jnp.isfinite(new_r)))).astype(
        jnp.int32
    )
    invalid = metric_invalid(inv_metric_fn, theta)
    info = SGRHMCInfo(
        jnp.asarray(1, jnp.int32),
        bad,
        (bad > 0) | invalid | ~(eps > 0),
        eps,
        clipped,
        jnp.linalg.norm(gamma),
        invalid,
    )
    if unravel is not None:
        new_theta, new_r = unravel(new_theta), unravel(new_r)
    return SGRHMCState(new_theta, new_r, state.step + 1), info


def sgrhmc_dq(inv_metric_fn: la.MatrixLike) -> tuple[Callable, Callable]:
    """The section-6 recipe matrices as callables of ``z = (θ, r): (2d,)``.

    ``D(z) = [[0, 0], [0, G^{-1}]]``, ``Q(z) = [[0, -G^{-1/2}], [G^{-1/2}, 0]]``.
    With these, :func:`cenlmc_jax.sgmcmc.recipe.recipe_step` is SGRHMC (slower:
    its ``Γ`` differentiates ``2d × 2d`` matrices); :func:`sgrhmc_step` is the
    fast form.

    Args:
      inv_metric_fn: ``G(θ)^{-1}``: a callable of θ or a constant, as a scalar,
        a ``(d,)`` diagonal or a ``(d, d)`` matrix.

    Returns:
      ``(D, Q)``: two callables ``z -> (2d, 2d)`` array.
    """

    def blocks(z):
        d = z.shape[0] // 2
        half, g = _sqrt_inv_metric(inv_metric_fn, z[:d])
        return d, la.to_dense(half, d), la.to_dense(g, d)

    def D(z):
        d, _, g = blocks(z)
        zero = jnp.zeros((d, d), z.dtype)
        return jnp.block([[zero, zero], [zero, g]])

    def Q(z):
        d, half, _ = blocks(z)
        zero = jnp.zeros((d, d), z.dtype)
        return jnp.block([[zero, -half], [half, zero]])

    return D, Q


def sgrhmc(
    grad_estimator: GradEstimator,
    step_size: StepSize,
    inv_metric_fn: la.MatrixLike,
    *,
    B_hat: la.MatrixLike | None = None,
    naive: bool = False,
) -> SamplingAlgorithm:
    """SGRHMC as a sampler object.

    ``init(position, rng_key=None)`` (checks the metric at the initial point;
    ``r ~ N(0, I)`` from the key, ``r = 0`` without; for a momentum of your own
    call :func:`sgrhmc_init`) and ``step(rng_key, state)`` (:func:`sgrhmc_step`).

    Args:
      grad_estimator: ``(rng_key, θ) -> g̃(θ): (d,)``, an estimate of
        ``∇log π(θ)``.
      step_size: ``ε > 0`` or a schedule ``t -> ε_t``.
      inv_metric_fn: ``G(θ)^{-1}``: a callable of θ or a constant, as a scalar,
        a ``(d,)`` diagonal or a ``(d, d)`` SPD matrix.
      B_hat: ``None`` (0), or the ``r``-block gradient-noise covariance (see
        :func:`sgrhmc_step`).
      naive: drop ``Γ_r`` ("naive SGRHMC"; samples the wrong distribution).

    Returns:
      A :class:`~cenlmc_jax.base.SamplingAlgorithm` with :class:`SGRHMCState`
      states.

    Raises:
      ValueError: a non-callable estimator, a bad step size or schedule, a
        non-bool ``naive``, or a matrix of a wrong form.
    """
    check_callable(grad_estimator, "grad_estimator", _GRAD_WHAT)
    check_schedule(step_size, "step_size")
    check_bool(naive, "naive")
    la.check_matrix_form(inv_metric_fn, "inv_metric_fn")
    if B_hat is not None:
        la.check_matrix_form(B_hat, "B_hat")

    def init(position, rng_key=None):
        state = sgrhmc_init(
            position,
            rng_key,
            inv_metric_fn=inv_metric_fn,
            step_size=step_size,
            B_hat=B_hat,
        )
        check_grad_estimator(grad_estimator, state.position)
        return state

    def step(rng_key, state):
        return sgrhmc_step(
            rng_key, state, grad_estimator, step_size, inv_metric_fn, B_hat, naive=naive
        )

    return SamplingAlgorithm(init, step)


def gsgrhmc_inv_metric(
    potential_fn: Callable[[Array], Array], D: float = 1.5, C: float = 0.5
) -> Callable:
    """The paper's gSGRHMC metric (docs/algorithms.md §6).

    ``G(θ)^{-1} = D·sqrt(|U(θ) + C|)·I``, as a (d,) diagonal. Larger ``U`` (lower
    density) gives larger ``D, Q``: faster moves in the tails, more accuracy near
    the modes. Where ``U + C`` changes sign (``U = θ⁴ - 2θ²``, ``C = 0.5``)
    ``G^{-1/2} ∝ |U + C|^{1/4}`` has an infinite derivative and ``Γ_r`` is
    singular.

    Args:
      potential_fn: ``θ -> U(θ)`` (scalar; ``-logdensity_fn`` up to a constant;
        the paper uses the minibatch ``Ũ``, here any deterministic potential).
      D: the scale ``D > 0``.
      C: the finite offset ``C``.

    Returns:
      ``inv_metric_fn``: ``θ -> (d,)`` diagonal of ``G(θ)^{-1}``.

    Raises:
      ValueError: a non-callable ``potential_fn``, ``D`` not positive, or ``C``
        not a finite number.
    """
    check_callable(potential_fn, "potential_fn", "theta -> U(theta) (scalar)")
    check_positive(D, "D")
    if not (isinstance(C, (int, float, np.floating)) and math.isfinite(float(C))):
        raise ValueError(f"C must be a finite number; got {C!r}.")

    def inv_metric_fn(theta):
        u = jnp.asarray(potential_fn(theta), theta.dtype)
        return jnp.full(theta.shape, D, theta.dtype) * jnp.sqrt(jnp.abs(u + C))

    return inv_metric_fn
