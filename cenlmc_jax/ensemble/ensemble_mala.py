"""Ensemble MALA: a gradient-free, exact sampler for black-box models.

Paper 1's idea (Ding & Li, *Constrained ensemble Langevin Monte Carlo*, eq. 3.9: the
particles' own values replace ``∇log π`` in the Langevin step) made exact by the
two-system construction (Chok, Lee, Paulin & Vasil 2025, arXiv:2509.09162; the
red-blue split of emcee's stretch move): the estimate is used only inside a
Metropolis–Hastings proposal, so its error costs acceptance, never bias.

**State and target.** The state is the whole ensemble ``x = (x_1, ..., x_N)``,
``positions: (N, d)``, ``N`` even, split once into the halves ``A`` (rows
``0 .. N/2 - 1``) and ``B`` (rows ``N/2 .. N - 1``). The target is the product
``π^{⊗N}``: every particle is a draw from ``π``.

**Moving A given B.** Everything the proposal needs is built from half ``B``'s stored
positions ``x_B`` and log densities ``ℓ_B = log π(x_B)`` (no model call):

* the frame ``u = L_B⁻¹ (x - m_B)``: ``m_B`` the mean of ``B``, ``L_B L_Bᵀ = M_B``
  the Cholesky factor of ``B``'s covariance (plus a jitter): the two halves
  precondition each other (``precondition=False``: ``M_B = I``);
* the ensemble gradient ``g_B`` (in ``u``; ``∇_x log π ≈ L_B^{-T} g_B``), by
  ``estimator``:

  - ``"quadratic"``: the least-squares quadratic
    ``ℓ ≈ c + bᵀu + ½ uᵀ H u`` through the ``N/2`` pairs ``(u_j, ℓ_j)`` of ``B``
    (a ridge ``ridge · mean diag(ΦᵀΦ)`` on the non-constant coefficients), and
    ``g_B(u) = b + H u``: exact for a Gaussian ``π`` once ``N/2 ≥ 1 + d + d(d+1)/2``;
  - ``"local_linear"``: paper 1's finite difference (eq. 3.9: ``δℓ_ij δx_ij /
    |δx_ij|²`` over neighbours) as a kernel-weighted least-squares fit at ``u``,
    ``g_B(u) = argmin_g Σ_j w_j (ℓ_j - ℓ(u) - gᵀ(u_j - u))²`` with
    ``w_j = exp(-|u_j - u|² / (2 bandwidth²))`` (plus the ridge); it uses the value
    ``ℓ(u)`` at the point itself, which the state caches (a function of the point,
    so the kernel below stays a fixed Markov kernel).

The metric (with ``precondition``): ``M_B = (-H_B)⁻¹`` in the frame, the fitted
quadratic's curvature with its eigenvalues floored at :data:`CURVATURE_FLOOR` (in ``x``:
``L_B M_B L_Bᵀ``, a Newton-like preconditioner from B's data only), ``R_B R_Bᵀ = M_B``;
without it ``M_B = I``. For each particle ``x ∈ A`` (``u`` its frame coordinates,
``h = step_size``)::

    u* = u + h M_B g_B(u) + sqrt(2h) R_B ξ,      ξ ~ N(0, I_d),      y = m_B + L_B u*
    log q(y | x) = -|R_B⁻¹(u* - u - h M_B g_B(u))|² / (4h)   (+ a constant, both ways)
    a = min(1, π(y) q(x | y) / (π(x) q(y | x)))                             (MH)

``π(y)`` is the one model evaluation per particle; ``π(x)`` is cached in the state, and
``g_B(u*)`` in the reverse density ``q(x | y)`` is built from ``B``'s stored data again.
Then ``B`` moves given the new ``A`` in the same way. One step: ``N`` model values
(``info.model_evals``).

**Why ``π^{⊗N}`` is invariant (exactness).** While ``A`` moves, ``x_B`` and ``ℓ_B`` are
fixed, so ``m_B``, ``L_B`` and ``g_B`` are fixed functions: for each particle of ``A``
the update is a Metropolis–Hastings kernel ``K_B(x, dy)`` with proposal ``q_B`` and
target ``π``, reversible w.r.t. ``π`` whatever ``q_B`` is (detailed balance
``π(x) q_B(y|x) a(x, y) = π(y) q_B(x|y) a(y, x)``). The particles of ``A`` move
independently given ``B``, so the half-update ``∏_{i∈A} K_B(x_i, dy_i)`` leaves
``π^{⊗|A|}`` invariant conditionally on ``x_B``, hence ``π^{⊗N}`` (a Gibbs-type move
of the ``A`` block). The same for ``B`` given ``A``; a composition of
``π^{⊗N}``-invariant kernels is ``π^{⊗N}``-invariant. An estimator as poor as one
likes (few particles, a bad fit, a non-concave ``H``) only lowers the acceptance rate.
What must not happen, and does not: the drift of a particle depending on the
particle's own half.

**Step size.** ``h`` is fixed during sampling (an adapted ``h`` would make the kernel
depend on the chain's past); :func:`ensemble_mala_warmup` tunes it on the ensemble's
mean acceptance (target 0.6 by default) during a warm-up whose draws are discarded.

**Differentiation.** ``jax.grad`` through ``cj.sample`` with this sampler gives the
pathwise derivative: the noise ``ξ`` and the uniforms of the accept test are fixed by
the key, and each accept/reject decision is held where the run put it (the derivative of
the indicator is taken as 0). It is the derivative of the realised path; it equals the
derivative of the expectation only as far as no decision flips under a small change of
the parameter (the score of the accept decisions is omitted).
The fits make every particle depend on the other half's points, so reverse mode sums
cotangents that cancel only in exact arithmetic, each scaled by the fits' sensitivity.
With halves of fewer points than the quadratic's ``1 + d + d(d+1)/2`` coefficients the
fit is the ridge's interpolant, its sensitivity is huge, and float32 can lose the
derivative entirely (tests/ensemble/test_ensemble_mala.py, the pathwise-derivative
test): give each half at least that many points, or differentiate in float64.

Conventions: ``positions: (N, d)`` float32 or float64 (kept: float64 in, float64 out),
``logdensity_fn: (d,) -> scalar`` (vmapped over a half; a ``jax.pure_callback`` black
box with ``vmap_method="expand_dims"`` gets one batched call per half-step). The key of
a step is split once into the two half-steps', each into the noise's and the
uniforms'. A proposal whose log density is NaN or ``+inf``, or that is not finite, is
rejected and reported in ``info.diverged``; ``-inf`` (zero density) is an ordinary
rejection.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.linalg import solve_triangular

from cenlmc_jax._validation import (
    check_bool,
    check_callable,
    check_choice,
    check_int,
    check_key,
    check_logdensity,
    check_nonnegative,
    check_positions,
    check_positive,
    check_state,
    is_concrete,
    point_like,
)
from cenlmc_jax.base import RunFlag, SamplingAlgorithm
from cenlmc_jax.types import Array, ArrayLike, LogDensityFn, PRNGKey

__all__ = [
    "EnsembleMALAState",
    "EnsembleMALAInfo",
    "ENSEMBLE_MALA_ESTIMATORS",
    "ensemble_mala_init",
    "ensemble_mala_step",
    "ensemble_mala",
    "ensemble_mala_warmup",
    "ensemble_gradient",
]

#: The ensemble gradient estimators (module docstring).
ENSEMBLE_MALA_ESTIMATORS = ("quadratic", "local_linear")

#: The covariance jitter, relative to the mean variance of a half: keeps ``L_B``
#: invertible for a degenerate half (N/2 ≤ d, or particles that coincide).
COV_JITTER = 1e-8

#: The floor of the metric's curvatures (eigenvalues of ``-H`` in the frame, whose unit
#: is the other half's spread): a direction the fit finds flat or convex moves on the
#: scale of that spread.
CURVATURE_FLOOR = 0.05

#: A collapsed acceptance rate (a particle whose acceptance probability was exactly 0
#: at every step of a chunk): the driver's warning (as for MALA and RW-MH).
ZERO_ACCEPTANCE_FLAG = RunFlag(
    "zero_acceptance",
    lambda infos, step: (
        "the acceptance probability of a particle collapsed to 0 "
        "(info.acceptance_rate): every proposal went where the density is 0 or was "
        "so improbable that exp underflows; lower the step size"
    ),
    every_step=True,
)


class EnsembleMALAState(NamedTuple):
    """The ensemble of :func:`ensemble_mala`.

    Attributes:
      position: ``(N, d)`` the particles (halves ``A = [:N/2]``, ``B = [N/2:]``).
      logdensity: ``(N,)`` ``logdensity_fn`` at each particle (cached: a step
        evaluates the model only at the proposals).
    """

    position: Array
    logdensity: Array


class EnsembleMALAInfo(NamedTuple):
    """What one step (``A`` given ``B``, then ``B`` given ``A``) did.

    Attributes:
      acceptance_rate: ``(N,)`` each particle's MH acceptance probability ``a``.
      is_accepted: ``(N,)`` bool, the particle's proposal was accepted.
      model_evals: ``()`` int32, model (log density) evaluations this step: ``N``,
        one per particle.
      diverged: ``()`` bool, a proposal that was not finite or whose log density
        was NaN or ``+inf`` (rejected).
    """

    acceptance_rate: Array
    is_accepted: Array
    model_evals: Array
    diverged: Array

    # a rejection keeps the particle: the driver's frozen-chain check does not apply
    may_stay = True
    run_flags = (ZERO_ACCEPTANCE_FLAG,)

    @property
    def zero_acceptance(self) -> Array:
        """A particle's acceptance probability was exactly 0."""
        return jnp.asarray(self.acceptance_rate) == 0


class _Frame(NamedTuple):
    """Half ``B``'s frame and fit: ``x = mean + chol u``; ``g_B`` needs the rest."""

    mean: Array  # (d,)
    chol: Array  # (d, d) lower
    u: Array  # (n, d) B's points in the frame
    value: Array  # (n,) B's log densities
    b: Array  # (d,) quadratic fit: g(u) = b + H u
    hess: Array  # (d, d)
    metric: Array  # (d, d) the proposal's M in the frame: (-H)⁻¹, clipped
    root: Array  # (d, d) R, R Rᵀ = M
    root_inv: Array  # (d, d) R⁻¹


# ------------------------------------------------------------------ checks


def _check_params(step_size, estimator, precondition, ridge, bandwidth) -> None:
    if callable(step_size):
        raise ValueError(
            "step_size must be a number > 0 (fixed while sampling: a schedule would "
            f"make the kernel change with time); got {step_size!r}. Tune it with "
            "ensemble_mala_warmup."
        )
    check_positive(step_size, "step_size")
    check_choice(estimator, "estimator", ENSEMBLE_MALA_ESTIMATORS)
    check_bool(precondition, "precondition")
    check_nonnegative(ridge, "ridge")
    check_positive(bandwidth, "bandwidth")


def _check_ensemble(positions: Any, precondition: bool) -> Array:
    positions = check_positions(positions, min_particles=4)
    n, d = positions.shape
    if n % 2:
        raise ValueError(
            "positions must have an even number N of particles (two halves of N/2); "
            f"got N = {n}."
        )
    if precondition and n // 2 < d + 1:
        raise ValueError(
            f"positions must have N >= 2(d + 1) = {2 * (d + 1)} particles with "
            f"precondition=True (a half's covariance must be of full rank d = {d}); "
            f"got N = {n}."
        )
    return positions


# -------------------------------------------------------------- the estimate


def _features(u: Array) -> Array:
    """``[1, u, u_i u_j (i ≤ j)]`` for ``u: (n, d)``: ``(n, 1 + d + d(d+1)/2)``."""
    d = u.shape[-1]
    i, j = np.triu_indices(d)
    return jnp.concatenate(
        [jnp.ones(u.shape[:-1] + (1,), u.dtype), u, u[:, i] * u[:, j]], -1
    )


def _fit_frame(x_b: Array, l_b: Array, precondition: bool, ridge: Any) -> _Frame:
    """Half ``B``'s frame and least-squares quadratic (module docstring)."""
    n, d = x_b.shape
    dtype = x_b.dtype
    mean = jnp.mean(x_b, axis=0)
    centred = x_b - mean
    if precondition:
        cov = centred.T @ centred / (n - 1)
        scale = jnp.trace(cov) / d
        chol = jnp.linalg.cholesky(cov + COV_JITTER * scale * jnp.eye(d, dtype=dtype))
        u = solve_triangular(chol, centred.T, lower=True).T
    else:
        chol = jnp.eye(d, dtype=dtype)
        u = centred
    phi = _features(u)
    p = phi.shape[-1]
    gram = phi.T @ phi
    lam = jnp.asarray(ridge, dtype) * jnp.mean(jnp.diagonal(gram))
    penalty = jnp.concatenate([jnp.zeros((1,), dtype), jnp.ones((p - 1,), dtype)])
    coef = jnp.linalg.solve(gram + lam * jnp.diag(penalty), phi.T @ l_b)
    b = coef[1 : d + 1]
    i, j = np.triu_indices(d)
    quad = jnp.zeros((d, d), dtype).at[i, j].set(coef[d + 1 :])
    hess = quad + quad.T  # u_i² has coefficient H_ii / 2, u_i u_j (i<j) H_ij
    if precondition:
        # the fitted curvature -H as the metric, its eigenvalues floored (a flat or
        # convex fit in some direction: B's own spread, the frame's unit, sets it)
        w, v = jnp.linalg.eigh(-0.5 * (hess + hess.T))
        w = jnp.maximum(w, CURVATURE_FLOOR)
        metric = (v / w) @ v.T
        root = v / jnp.sqrt(w)
        root_inv = (v * jnp.sqrt(w)).T
    else:
        metric = root = root_inv = jnp.eye(d, dtype=dtype)
    return _Frame(mean, chol, u, l_b, b, hess, metric, root, root_inv)


def _to_frame(frame: _Frame, x: Array) -> Array:
    return solve_triangular(frame.chol, (x - frame.mean).T, lower=True).T


def _gradient(
    frame: _Frame, u: Array, value: Array, estimator: str, ridge, bandwidth
) -> Array:
    """``g_B`` at ``u: (n, d)`` (log density ``value: (n,)``), in the frame."""
    if estimator == "quadratic":
        return frame.b + u @ frame.hess.T
    dtype = u.dtype
    d = u.shape[-1]

    def one(ui, li):
        delta = frame.u - ui  # (nB, d)
        r = frame.value - li
        logw = -0.5 * jnp.sum(delta**2, -1) / jnp.asarray(bandwidth, dtype) ** 2
        w = jnp.exp(logw - jnp.max(logw))
        a = (delta * w[:, None]).T @ delta
        lam = jnp.asarray(ridge, dtype) * jnp.trace(a) / d
        return jnp.linalg.solve(a + lam * jnp.eye(d, dtype=dtype), delta.T @ (w * r))

    return jax.vmap(one)(u, value)


def ensemble_gradient(
    positions_b: ArrayLike,
    logdensity_b: ArrayLike,
    points: ArrayLike,
    logdensity_points: ArrayLike,
    *,
    estimator: str = "quadratic",
    precondition: bool = True,
    ridge: float = 1e-3,
    bandwidth: float = 1.5,
) -> Array:
    """The ensemble estimate of ``∇log π`` at ``points`` from one half's data.

    ``∇_x log π(x) ≈ L_B^{-T} g_B(u)``, ``u = L_B⁻¹(x - m_B)`` (module docstring): what
    the proposal's drift ``M_B ∇log π ≈ L_B g_B`` is made of. For inspection and tests;
    no model call.

    Args:
      positions_b: ``(n, d)`` the half's particles.
      logdensity_b: ``(n,)`` their log densities.
      points: ``(m, d)`` where to estimate.
      logdensity_points: ``(m,)`` the log density there (read by
        ``"local_linear"`` only).
      estimator: one of :data:`ENSEMBLE_MALA_ESTIMATORS`.
      precondition: use the half's covariance as the frame (else the identity).
      ridge: the ridge of the fits, ``>= 0`` (relative).
      bandwidth: the kernel width of ``"local_linear"``, in frame units.

    Returns:
      ``(m, d)`` the estimated gradients of ``log π`` in ``x``.
    """
    check_choice(estimator, "estimator", ENSEMBLE_MALA_ESTIMATORS)
    x_b = jnp.asarray(positions_b)
    frame = _fit_frame(
        x_b,
        jnp.asarray(logdensity_b, x_b.dtype),
        check_bool(precondition, "precondition"),
        ridge,
    )
    pts = jnp.asarray(points, x_b.dtype)
    g = _gradient(
        frame,
        _to_frame(frame, pts),
        jnp.asarray(logdensity_points, x_b.dtype),
        estimator,
        ridge,
        bandwidth,
    )
    return solve_triangular(frame.chol.T, g.T, lower=False).T


# ------------------------------------------------------------------ the move


def _half_move(rng_key, x_a, l_a, x_b, l_b, h, logdensity_fn, options):
    """Move half ``A`` (``x_a: (n, d)``, ``l_a: (n,)``) given half ``B``.

    Returns ``(x_a', l_a', acceptance_rate, accepted, diverged)``.
    """
    estimator, precondition, ridge, bandwidth = options
    dtype = x_a.dtype
    frame = _fit_frame(x_b, l_b, precondition, ridge)
    key_noise, key_accept = jax.random.split(rng_key)
    u = _to_frame(frame, x_a)
    g = _gradient(frame, u, l_a, estimator, ridge, bandwidth)
    xi = jax.random.normal(key_noise, x_a.shape, dtype)
    u_star = u + h * g @ frame.metric + jnp.sqrt(2.0 * h) * xi @ frame.root.T
    y = frame.mean + u_star @ frame.chol.T
    l_y = jax.vmap(logdensity_fn)(y).astype(dtype)
    finite_y = jnp.all(jnp.isfinite(y), axis=-1)
    trouble = ~finite_y | jnp.isnan(l_y) | (l_y == jnp.inf)
    # the reverse drift at y from B's data; a bad value gets a harmless stand-in (the
    # move is rejected anyway) so that no NaN reaches the fit of a local estimator
    l_safe = jnp.where(trouble | ~jnp.isfinite(l_y), l_a, l_y)
    g_star = _gradient(frame, u_star, l_safe, estimator, ridge, bandwidth)
    log_forward = -0.5 * jnp.sum(xi**2, -1)  # = -|R⁻¹(u* - u - h M g(u))|² / (4h)
    back = (u - u_star - h * g_star @ frame.metric) @ frame.root_inv.T
    log_backward = -jnp.sum(back**2, -1) / (4.0 * h)
    log_ratio = l_y - l_a + log_backward - log_forward
    log_ratio = jnp.where(trouble | jnp.isnan(log_ratio), -jnp.inf, log_ratio)
    acceptance_rate = jnp.exp(jnp.minimum(log_ratio, 0.0))
    uniform = jax.random.uniform(key_accept, l_a.shape, dtype)
    accepted = uniform < acceptance_rate
    x_new = jnp.where(accepted[:, None], y, x_a)
    l_new = jnp.where(accepted, l_y, l_a)
    return x_new, l_new, acceptance_rate, accepted, jnp.any(trouble)


def _move(rng_key, state, logdensity_fn, step_size, options):
    """One step (both halves) without the checks."""
    x, ell = state.position, state.logdensity
    n = x.shape[0] // 2
    h = jnp.asarray(step_size, x.dtype)
    key_a, key_b = jax.random.split(rng_key)
    x_a, l_a, acc_a, ok_a, bad_a = _half_move(
        key_a, x[:n], ell[:n], x[n:], ell[n:], h, logdensity_fn, options
    )
    x_b, l_b, acc_b, ok_b, bad_b = _half_move(
        key_b, x[n:], ell[n:], x_a, l_a, h, logdensity_fn, options
    )
    state = EnsembleMALAState(jnp.concatenate([x_a, x_b]), jnp.concatenate([l_a, l_b]))
    info = EnsembleMALAInfo(
        acceptance_rate=jnp.concatenate([acc_a, acc_b]),
        is_accepted=jnp.concatenate([ok_a, ok_b]),
        model_evals=jnp.asarray(2 * n, jnp.int32),
        diverged=bad_a | bad_b | ~(h > 0),
    )
    return state, info


# -------------------------------------------------------------- public face


def ensemble_mala_init(
    positions: ArrayLike,
    logdensity_fn: LogDensityFn,
    *,
    precondition: bool = True,
) -> EnsembleMALAState:
    """Start from ``positions: (N, d)``: ``N`` model evaluations, cached in the state.

    Args:
      positions: the ensemble, ``(N, d)``, ``N`` even and ``>= 4`` (``>= 2(d + 1)``
        with ``precondition``).
      logdensity_fn: ``x: (d,) -> log π(x) + const``.
      precondition: as for :func:`ensemble_mala` (only the particle count is
        checked against it here).

    Returns:
      The :class:`EnsembleMALAState`.

    Raises:
      ValueError: bad positions, a ``logdensity_fn`` with the wrong output, or a log
        density that is not finite at some particle (a half's fit needs every value).
    """
    precondition = check_bool(precondition, "precondition")
    positions = _check_ensemble(positions, precondition)
    check_logdensity(logdensity_fn, point_like(positions))
    logdensity = jax.vmap(logdensity_fn)(positions).astype(positions.dtype)
    if is_concrete(logdensity):
        bad = ~np.isfinite(np.asarray(logdensity))
        if bad.any():
            raise ValueError(
                f"logdensity_fn must be finite at every particle of positions; got "
                f"-inf or NaN at {int(bad.sum())} of {bad.size} (the fits of a half "
                "need every value): start inside the support of the target."
            )
    return EnsembleMALAState(positions, logdensity)


def ensemble_mala_step(
    rng_key: PRNGKey,
    state: EnsembleMALAState,
    logdensity_fn: LogDensityFn,
    step_size: float,
    *,
    estimator: str = "quadratic",
    precondition: bool = True,
    ridge: float = 1e-3,
    bandwidth: float = 1.5,
) -> tuple[EnsembleMALAState, EnsembleMALAInfo]:
    """One step: half ``A`` given ``B``, then ``B`` given ``A`` (module docstring).

    Args:
      rng_key: the step's key.
      state: an :class:`EnsembleMALAState`.
      logdensity_fn: ``x: (d,) -> log π(x) + const``.
      step_size: ``h > 0`` (may be a tracer: the warm-up adapts it).
      estimator, precondition, ridge, bandwidth: as for :func:`ensemble_mala`.

    Returns:
      ``(state, info)``: the new :class:`EnsembleMALAState` and an
      :class:`EnsembleMALAInfo`.

    Raises:
      ValueError: a bad argument.
    """
    check_state(state, EnsembleMALAState, "ensemble_mala_init")
    check_key(rng_key)
    _check_params(step_size, estimator, precondition, ridge, bandwidth)
    options = (estimator, bool(precondition), ridge, bandwidth)
    return _move(rng_key, state, logdensity_fn, step_size, options)


def ensemble_mala(
    logdensity_fn: LogDensityFn,
    step_size: float,
    *,
    estimator: str = "quadratic",
    precondition: bool = True,
    ridge: float = 1e-3,
    bandwidth: float = 1.5,
) -> SamplingAlgorithm:
    """Ensemble MALA: gradient-free and exact, one model value per particle-step.

    The drift of half ``A``'s Langevin proposal is half ``B``'s ensemble gradient
    estimate, fixed while ``A`` moves; an MH test makes each half-move reversible
    w.r.t. ``π`` given the other half, so ``π^{⊗N}`` is invariant (module docstring)::

        u* = u + h g_B(u) + sqrt(2h) ξ,  y = m_B + L_B u*,
        a = min(1, π(y) q_B(x | y) / (π(x) q_B(y | x))).

    Args:
      logdensity_fn: ``x: (d,) -> log π(x) + const`` (a black box is fine: it is
        never differentiated).
      step_size: ``h > 0`` (with ``precondition`` and a near-Gaussian ``π`` the
        proposal is ``u* ≈ μ + (1 - h)(u - μ) + sqrt(2h) Σ^{1/2} ξ``: ``h`` of order 1
        at small ``d``; :func:`ensemble_mala_warmup` tunes it).
      estimator: ``"quadratic"`` (default: the least-squares quadratic through the
        other half) or ``"local_linear"`` (paper 1's neighbour finite difference as
        a kernel-weighted linear fit).
      precondition: the other half's frame (its mean and covariance) and metric (its
        fitted curvature ``(-H_B)⁻¹``, floored) (default True; needs
        ``N >= 2(d + 1)``); False: ``M = I`` in ``x``.
      ridge: the fits' ridge, ``>= 0``, relative to the mean diagonal of their
        normal matrix (default ``1e-3``: it only tames an under-determined fit).
      bandwidth: ``"local_linear"``'s kernel width in the frame's units (> 0).

    Returns:
      A :class:`~cenlmc_jax.base.SamplingAlgorithm`: ``init(positions, rng_key=None)``
      gives an :class:`EnsembleMALAState` (``position: (N, d)``, ``logdensity:
      (N,)``), ``step(rng_key, state)`` a new state and an :class:`EnsembleMALAInfo`
      (``acceptance_rate: (N,)``, ``is_accepted: (N,)``, ``model_evals = N``,
      ``diverged``).

    Raises:
      ValueError: a bad argument, naming it.
    """
    check_callable(logdensity_fn, "logdensity_fn", "x -> scalar log density")
    _check_params(step_size, estimator, precondition, ridge, bandwidth)
    options = (estimator, bool(precondition), ridge, bandwidth)

    def init(positions, rng_key=None):
        if rng_key is not None:
            check_key(rng_key)  # unused (a deterministic start)
        return ensemble_mala_init(positions, logdensity_fn, precondition=precondition)

    def step(rng_key, state):
        check_state(state, EnsembleMALAState, "ensemble_mala_init")
        check_key(rng_key)
        return _move(rng_key, state, logdensity_fn, step_size, options)

    return SamplingAlgorithm(init, step)


def ensemble_mala_warmup(
    rng_key: PRNGKey,
    positions: ArrayLike,
    logdensity_fn: LogDensityFn,
    *,
    num_steps: int,
    initial_step_size: float = 0.5,
    target_acceptance: float = 0.6,
    estimator: str = "quadratic",
    precondition: bool = True,
    ridge: float = 1e-3,
    bandwidth: float = 1.5,
) -> tuple[EnsembleMALAState, Array, EnsembleMALAInfo]:
    """Warm the ensemble up and tune ``h`` on its mean acceptance rate.

    Robbins–Monro on ``log h``: after step ``t`` with mean acceptance ``ā_t`` over the
    ``N`` particles, ``log h ← log h + (ā_t - target) / sqrt(t + 1)``. The returned
    ``h`` is ``exp`` of the mean of ``log h`` over the second half of the warm-up, to
    be fixed for sampling (:func:`ensemble_mala`, or :func:`ensemble_mala_step` inside
    ``jax.vmap``: the warm-up is jittable and vmappable over keys and positions); the
    warm-up's draws are not samples of ``π^{⊗N}`` (``h`` moved) and are discarded.
    Costs ``N (num_steps + 1)`` model evaluations (the ``init`` included).

    Args:
      rng_key: the warm-up's key.
      positions: the starting ensemble ``(N, d)``.
      logdensity_fn: ``x: (d,) -> log π(x) + const``.
      num_steps: warm-up steps, ``>= 2``.
      initial_step_size: the first ``h > 0``.
      target_acceptance: the mean acceptance rate aimed at, in ``(0, 1)``.
      estimator, precondition, ridge, bandwidth: as for :func:`ensemble_mala`.

    Returns:
      ``(state, step_size, infos)``: the warmed-up :class:`EnsembleMALAState`, the
      tuned ``h`` (a 0-d array of the positions' dtype) and the stacked
      :class:`EnsembleMALAInfo` of the warm-up steps.

    Raises:
      ValueError: a bad argument, naming it.
    """
    check_key(rng_key)
    num_steps = check_int(num_steps, "num_steps", minimum=2)
    _check_params(initial_step_size, estimator, precondition, ridge, bandwidth)
    check_positive(target_acceptance, "target_acceptance")
    if not 0.0 < float(target_acceptance) < 1.0:
        raise ValueError(
            f"target_acceptance must be in (0, 1); got {target_acceptance!r}."
        )
    state = ensemble_mala_init(positions, logdensity_fn, precondition=precondition)
    options = (estimator, bool(precondition), ridge, bandwidth)
    dtype = state.position.dtype

    def body(carry, t):
        state, log_h = carry
        state, info = _move(
            jax.random.fold_in(rng_key, t),
            state,
            logdensity_fn,
            jnp.exp(log_h),
            options,
        )
        rate = jnp.mean(info.acceptance_rate)
        log_h = log_h + (rate - target_acceptance) / jnp.sqrt(t + 1.0).astype(dtype)
        return (state, log_h), (info, log_h)

    log_h0 = jnp.asarray(math.log(float(initial_step_size)), dtype)
    (state, _), (infos, log_hs) = jax.lax.scan(
        body, (state, log_h0), jnp.arange(num_steps)
    )
    step_size = jnp.exp(jnp.mean(log_hs[num_steps // 2 :]))
    return state, step_size, infos
