"""The complete recipe for stochastic-gradient MCMC, and SGLD, SGRLD, SGHMC.

docs/algorithms.md §5.

Ma, Chen & Fox, *A Complete Recipe for Stochastic Gradient MCMC* (the
"unifying framework" paper). Any SDE whose stationary density is
``π(z) ∝ exp(-H(z))`` can be written

    dz = [ (D(z) + Q(z)) ∇log π(z) + Γ(z) ] dt + sqrt(2 D(z)) dW,
    Γ_i(z) = Σ_j ∂_{z_j} (D_ij(z) + Q_ij(z)),         (docs/algorithms.md §5)

with ``D`` symmetric positive semidefinite and ``Q`` skew-symmetric
(``(D + Q)∇log π = -(D + Q)∇H``). The Euler step with a (stochastic)
gradient estimate ``g̃ ≈ ∇log π`` is

    z_{t+1} = z_t + ε_t [ (D + Q) g̃(z_t) + Γ(z_t) ] + N(0, ε_t (2 D(z_t) - ε_t B̂_t)).

Gradient estimators return the gradient of the **log density**, as
BlackJAX's do: ``grad_estimator(rng_key, z) -> g̃(z)``
(:mod:`cenlmc_jax.gradients.estimators` builds them from a ``logdensity_fn``, a
deterministic gradient, minibatches or added noise).

``B̂_t`` is the covariance of the gradient noise *as it enters the dynamics*:
if ``g̃ = ∇log π + ν`` with ``Cov ν = V``, the drift injects ``ε² (D+Q) V (D+Q)ᵀ``
of noise; choosing ``B̂ = (D+Q) V (D+Q)ᵀ`` makes the total injected
covariance exactly ``2 ε D`` when ``ν`` is Gaussian. ``B̂ = None`` means 0.

Matrix arguments (``D``, ``Q``, ``B_hat``, the SGHMC friction) take the forms
of :mod:`cenlmc_jax._linalg`: a scalar ``c`` (``c·I``), a ``(d,)`` diagonal,
a ``(d, d)`` array, or a callable of the position returning one of these.
The noise covariance may be singular (SGHMC has ``D = [[0, 0], [0, C]]``): its
square root is the symmetric PSD root with eigenvalues clipped at 0, after
checking, whenever the values are concrete, that none is clearly negative
(``ValueError``). Inside a traced run the check cannot raise; a clearly
negative eigenvalue is reported in ``info.noise_clipped``.

SGLD, SGRLD and SGHMC (:func:`sgld`, :func:`sgrld`, :func:`sghmc`) only choose ``D`` and
``Q`` and return a :class:`~cenlmc_jax.base.SamplingAlgorithm`. SGRHMC
(docs/algorithms.md §6) has its own block step in :mod:`cenlmc_jax.sgmcmc.sgrhmc`.

All steps act on one chain (``position: (d,)``, or a pytree such as a dict
of parameters: it is flattened with ``jax.flatten_util.ravel_pytree`` at the
boundary of each step; ``grad_estimator`` sees the pytree, matrices and their
callables see the flat ``(d,)`` vector, the state keeps the pytree) and vmap
over chains (:func:`cenlmc_jax.run.vmap_chains`).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from cenlmc_jax import _linalg as la
from cenlmc_jax._validation import (
    check_callable,
    check_function,
    check_key,
    check_positive,
    check_schedule,
    check_state,
    is_concrete,
)
from cenlmc_jax.base import RunFlag, SamplingAlgorithm, StepSize, step_size_at
from cenlmc_jax.gradients.estimators import (
    GRAD_ESTIMATOR_WHAT,
    flat_grad_estimator,
    ravel_position,
)
from cenlmc_jax.types import Array, ArrayLike, GradEstimator, PRNGKey

__all__ = [
    "RecipeState",
    "RecipeInfo",
    "recipe_init",
    "recipe_step",
    "complete_recipe",
    "SGHMCState",
    "sgld",
    "sgrld",
    "sghmc",
    "sghmc_init",
    "sghmc_step",
    "initial_momentum",
]

_GRAD_WHAT = GRAD_ESTIMATOR_WHAT


def check_grad_estimator(
    grad_estimator, position, name: str = "grad_estimator"
) -> None:
    """A user's estimator maps ``(key, position)`` to a gradient like ``position``.

    Abstractly checked.
    """
    check_function(
        grad_estimator,
        name,
        (jax.random.key(0), position),
        what=_GRAD_WHAT,
        like=position,
    )


class RecipeState(NamedTuple):
    """State of a complete-recipe chain.

    Attributes:
      position: (d,) the state ``z`` (or a pytree of parameters).
      step: int32 step counter ``t`` (drives a step-size schedule).
    """

    position: Array
    step: Array


#: The driver's warning for ``info.noise_clipped`` (the recipe's and SGRHMC's infos
#: declare it).
NOISE_CLIPPED_FLAG = RunFlag(
    "noise_clipped",
    lambda infos, step: (
        "the noise covariance step_size*(2D - step_size*B_hat) was clipped "
        f"(info.noise_clipped) from step {step}: B_hat is too large for this "
        "step size, so the chain injects less noise than the recipe needs; "
        "lower step_size or B_hat"
    ),
)


class RecipeInfo(NamedTuple):
    """What one recipe step did.

    Attributes:
      grad_evals: calls of ``grad_estimator`` (1; a minibatch call counts once).
      num_nonfinite: chains whose new position is not finite (0 or 1 for one
        chain; under ``vmap_chains`` ``cj.sample``'s default
        ``info_reduce="mean"`` sums integer fields, so it counts chains, as the
        ensemble samplers' infos count particles).
      diverged: ``num_nonfinite > 0``, or a step size ``ε_t`` (a schedule's value)
        that is not > 0.
      step_size: ``ε_t`` used.
      noise_clipped: the noise covariance ``ε(2D - εB̂)`` had an eigenvalue
        clearly below 0 that was clipped (``B̂`` too large for this ``ε``: the
        step injected less noise than the recipe needs).
    """

    grad_evals: Array
    num_nonfinite: Array
    diverged: Array
    step_size: Array
    noise_clipped: Array

    # cj.sample warns from the first clipped step
    run_flags = (NOISE_CLIPPED_FLAG,)


def check_recipe_inputs(
    z: Array, D, Q, B_hat, eps: Array | None, *, d_name: str = "D"
) -> None:
    """Everything that can be checked in Python.

    Constant matrices always, callables at a concrete z (their output shapes at any
    z, abstractly).

    ``D`` symmetric PSD, ``Q`` skew-symmetric, ``B_hat`` of a matrix form, and
    the noise covariance ``ε(2D - εB̂)`` PSD. ``d_name``: what the user called
    ``D`` (SGRLD's ``inv_metric_fn``), for the messages.
    """
    d = z.shape[0]
    vals = {}
    for key, name, M in (("D", d_name, D), ("Q", "Q", Q), ("B_hat", "B_hat", B_hat)):
        m = la.concrete_value(M, z, name)
        if m is None:
            continue
        la.check_matrix_shape(m, name, d)
        vals[key] = la.constant_dense(m, d)
    if "D" in vals:
        la.check_symmetric_psd(vals["D"], d_name, "the reversible part of the recipe")
    if "Q" in vals:
        la.check_skew(vals["Q"], "Q", "the irreversible part of the recipe")
    if "D" in vals and "B_hat" in vals and eps is not None and is_concrete(eps):
        e = float(eps)
        la.check_noise_cov(
            e,
            vals["D"],
            vals["B_hat"],
            f"the noise covariance step_size*(2*{d_name} - step_size*B_hat)",
            f"step_size={e:g}; B_hat too large for this step size, or {d_name} not PSD",
        )


def recipe_init(
    position: ArrayLike,
    D: la.MatrixLike | None = None,
    Q: la.MatrixLike | None = None,
    step_size: StepSize | None = None,
    B_hat: la.MatrixLike | None = None,
    *,
    d_name: str = "D",
) -> RecipeState:
    """Start a recipe chain at ``position: (d,)`` with ``step = 0``.

    When ``D``, ``Q`` (and ``step_size``, ``B_hat``) are given they are
    checked at the initial point: ``D`` symmetric PSD, ``Q`` skew-symmetric,
    the noise covariance ``ε_0(2D - ε_0 B̂)`` PSD; ``ValueError`` otherwise
    (``d_name``: the name of ``D`` in the messages).

    Args:
      position: the starting point ``z``, shape ``(d,)``, or a pytree.
      D: the diffusion matrix (symmetric PSD): a scalar, ``(d,)``, ``(d, d)`` or a
        callable of the flat ``z``; ``None`` skips its checks.
      Q: the curl matrix (skew-symmetric), in the same forms; ``None`` skips them.
      step_size: ``ε > 0`` or a schedule ``t -> ε_t``; ``None`` skips the noise
        covariance check.
      B_hat: the gradient-noise covariance estimate, in the forms of ``D``, or
        ``None`` (0).
      d_name: the name of ``D`` in the messages.

    Returns:
      The :class:`RecipeState` at ``position`` with ``step = 0``.

    Raises:
      ValueError: a matrix of a wrong form or shape, ``D`` not symmetric PSD, ``Q``
        not skew-symmetric, or the noise covariance not PSD.
    """
    z, unravel = ravel_position(position)
    step = jnp.zeros((), jnp.int32)
    # checks on concrete values run eagerly, even inside jit
    with jax.ensure_compile_time_eval():
        eps = None if step_size is None else step_size_at(step_size, step, z.dtype)
        check_recipe_inputs(z, D, Q, B_hat, eps, d_name=d_name)
    return RecipeState(z if unravel is None else unravel(z), step)


def _noise_root(
    z: Array, eps: Array, D, B_hat, d_name: str = "D"
) -> tuple[Array, Array]:
    """Root of the noise covariance ``ε(2D - εB̂)``, and ``noise_clipped``.

    The root is in a matrix form.

    Constant ``D`` (and ``B̂``) are factored once, in NumPy, outside the trace;
    a constant scalar or diagonal ``D`` without ``B̂`` gives an elementwise root.
    """
    d = z.shape[0]
    if la.is_constant(D) and B_hat is None:
        two_d = 2.0 * np.asarray(D, np.float64)
        base = (
            np.sqrt(np.clip(two_d, 0, None))
            if two_d.ndim <= 1
            else la.np_psd_sqrt(two_d)
        )
        return jnp.sqrt(eps) * jnp.asarray(base, z.dtype), jnp.asarray(False)
    if la.is_constant(D) and la.is_constant(B_hat) and is_concrete(eps):
        e = float(eps)  # checked PSD in Python by check_recipe_inputs
        cov = e * (2.0 * la.constant_dense(D, d) - e * la.constant_dense(B_hat, d))
        return jnp.asarray(la.np_psd_sqrt(cov), z.dtype), jnp.asarray(False)
    two_d = 2.0 * eps * la.to_dense(la.evaluate(D, z, d_name), d)
    if B_hat is None:
        return la.noise_root(two_d, jnp.max(jnp.abs(two_d)))
    b = eps * eps * la.to_dense(la.evaluate(B_hat, z, "B_hat"), d)
    return la.noise_root(
        two_d - b, jnp.maximum(jnp.max(jnp.abs(two_d)), jnp.max(jnp.abs(b)))
    )


def recipe_mean_and_root(
    z: Array, grad: Array, eps: Array, D, Q, B_hat, d_name: str = "D"
) -> tuple[Array, Array, Array]:
    """Deterministic part ``z + ε[(D+Q) g̃ + Γ]``, noise root ``(ε(2D - εB̂))^{1/2}``.

    Returns (mean: (d,), root: (), (d,) or (d, d), noise_clipped: bool).
    """
    drift = la.matvec(la.evaluate(D, z, d_name), grad)
    # Q = 0 (SGLD, SGRLD) costs nothing
    if callable(Q) or not is_concrete(Q) or np.any(np.asarray(Q)):
        drift = drift + la.matvec(la.evaluate(Q, z, "Q"), grad)
    if callable(D) or callable(Q):
        drift = drift + la.gamma_term(D, Q, z)
    mean = z + eps * drift
    root, clipped = _noise_root(z, eps, D, B_hat, d_name)
    return mean, root, clipped


def recipe_step(
    rng_key: PRNGKey,
    state: RecipeState,
    grad_estimator: GradEstimator,
    step_size: StepSize,
    D: la.MatrixLike,
    Q: la.MatrixLike,
    B_hat: la.MatrixLike | None = None,
    *,
    d_name: str = "D",
) -> tuple[RecipeState, RecipeInfo]:
    """One Euler step of the complete recipe (docs/algorithms.md §5), one chain.

        z' = z + ε_t [ (D(z) + Q(z)) g̃(z) + Γ(z) ] + N(0, ε_t (2 D(z) - ε_t B̂(z)))

    ``Γ`` is computed by ``jax.jacfwd`` of the callables (constant matrices are not
    differentiated). Constant ``D``, ``Q``, ``B_hat`` are checked on every trace;
    callables are checked when ``z`` is concrete (eager calls), their output shapes
    on every trace, as is the estimator's (shaped like the position).

    Args:
      rng_key: split into ``(key_grad, key_noise)``: ``key_grad`` goes to
        ``grad_estimator``, ``key_noise`` draws ``ξ ~ N(0, I_d)`` in ``z.dtype``
        and the noise is ``S ξ`` with ``S`` the symmetric PSD root of the
        covariance.
      state: :class:`RecipeState`, ``position: (d,)``.
      grad_estimator: ``(rng_key, z) -> g̃(z): (d,)``, an estimate of
        ``∇log π(z)``.
      step_size: ``ε > 0`` or a schedule ``t -> ε_t`` of ``state.step``.
      D: symmetric PSD: a scalar, ``(d,)``, ``(d, d)`` or a callable of ``z``.
      Q: skew-symmetric, in the same forms.
      B_hat: ``None`` (0) or PSD-compatible noise covariance, in the same forms.
      d_name: what the user called ``D``, for the messages (SGRLD's
        ``inv_metric_fn``).

    Returns:
      ``(new_state, info)``: the next :class:`RecipeState` (``step + 1``) and its
      :class:`RecipeInfo`.

    Raises:
      ValueError: a state or key of the wrong kind, a bad estimator, or matrices
        that fail the checks of :func:`recipe_init`.
    """
    check_state(
        state, RecipeState, "recipe_init, or the init of complete_recipe / sgld / sgrld"
    )
    check_key(rng_key)
    check_callable(grad_estimator, "grad_estimator", _GRAD_WHAT)
    z, unravel = ravel_position(state.position, check=False)
    eps = step_size_at(step_size, state.step, z.dtype)
    check_recipe_inputs(z, D, Q, B_hat, eps, d_name=d_name)
    key_grad, key_noise = jax.random.split(rng_key)
    grad = jnp.asarray(
        flat_grad_estimator(grad_estimator, unravel)(key_grad, z), z.dtype
    )
    mean, root, clipped = recipe_mean_and_root(z, grad, eps, D, Q, B_hat, d_name)
    new_z = mean + la.matvec(root, jax.random.normal(key_noise, z.shape, dtype=z.dtype))
    # chains (0 or 1), as the ensembles count particles
    bad = (~jnp.all(jnp.isfinite(new_z))).astype(jnp.int32)
    # a schedule that reached 0 (or below) freezes the chain: a divergence, not silence
    info = RecipeInfo(
        jnp.asarray(1, jnp.int32), bad, (bad > 0) | ~(eps > 0), eps, clipped
    )
    return RecipeState(
        new_z if unravel is None else unravel(new_z), state.step + 1
    ), info


# ---------------------------------------------------------------------------
# Sampler objects: the recipe, and SGLD / SGRLD as choices of D and Q.
# ---------------------------------------------------------------------------


def complete_recipe(
    grad_estimator: GradEstimator,
    step_size: StepSize,
    D: la.MatrixLike,
    Q: la.MatrixLike,
    *,
    B_hat: la.MatrixLike | None = None,
    d_name: str = "D",
) -> SamplingAlgorithm:
    """The complete recipe with your own ``D`` and ``Q`` as a sampler object.

    docs/algorithms.md §5. ``init(position, rng_key=None)`` checks ``D``, ``Q``,
    ``B̂`` at the initial point and the estimator's output shape;
    ``step(rng_key, state)`` is :func:`recipe_step`.

    Args:
      grad_estimator: ``(rng_key, z) -> g̃(z)``, an estimate of ``∇log π(z)``
        shaped like ``z``.
      step_size: a number > 0 or a schedule ``t -> ε_t`` (its output and its
        value at 0 checked here).
      D: symmetric PSD: a scalar, ``(d,)``, ``(d, d)`` or a callable of ``z``.
      Q: skew-symmetric, in the same forms.
      B_hat: ``None`` (0) or the gradient-noise covariance, in the same forms.
      d_name: what ``D`` is called in the messages (SGRLD: ``inv_metric_fn``).

    Returns:
      A :class:`~cenlmc_jax.base.SamplingAlgorithm` with :class:`RecipeState`
      states.

    Raises:
      ValueError: a non-callable estimator, a bad step size or schedule, or a
        matrix of a wrong form.
    """
    check_callable(grad_estimator, "grad_estimator", _GRAD_WHAT)
    check_schedule(step_size, "step_size")
    for name, M in ((d_name, D), ("Q", Q), ("B_hat", B_hat)):
        if M is not None or name != "B_hat":
            la.check_matrix_form(M, name)

    def init(position, rng_key=None):
        if rng_key is not None:
            # unused (the recipe's state has no random part), but checked
            check_key(rng_key)
        state = recipe_init(position, D, Q, step_size, B_hat, d_name=d_name)
        check_grad_estimator(grad_estimator, state.position)
        return state

    def step(rng_key, state):
        return recipe_step(
            rng_key, state, grad_estimator, step_size, D, Q, B_hat, d_name=d_name
        )

    return SamplingAlgorithm(init, step)


def sgld(
    grad_estimator: GradEstimator,
    step_size: StepSize,
    *,
    B_hat: la.MatrixLike | None = None,
) -> SamplingAlgorithm:
    """SGLD (docs/algorithms.md §5): ``D = I``, ``Q = 0``.

    ``θ' = θ + ε g̃(θ) + N(0, ε(2I - εB̂))``; state position ``θ: (d,)``.

    Args:
      grad_estimator: ``(rng_key, θ) -> g̃(θ) ≈ ∇log π(θ)``.
      step_size: ``ε > 0`` or a schedule ``t -> ε_t``.
      B_hat: ``None`` (0) or the gradient-noise covariance: a scalar, ``(d,)``,
        ``(d, d)`` or a callable of ``θ``.

    Returns:
      A :class:`~cenlmc_jax.base.SamplingAlgorithm` (:func:`complete_recipe` with
      ``D = 1``, ``Q = 0``).
    """
    return complete_recipe(grad_estimator, step_size, 1.0, 0.0, B_hat=B_hat)


def sgrld(
    grad_estimator: GradEstimator,
    step_size: StepSize,
    inv_metric_fn: la.MatrixLike,
    *,
    B_hat: la.MatrixLike | None = None,
) -> SamplingAlgorithm:
    """SGRLD (docs/algorithms.md §5): ``D = G(θ)^{-1}``, ``Q = 0``.

    ``Γ_i = Σ_j ∂_j (G^{-1})_ij`` by autodiff.

    Args:
      grad_estimator: ``(rng_key, θ) -> g̃(θ) ≈ ∇log π(θ)``.
      step_size: ``ε > 0`` or a schedule ``t -> ε_t``.
      inv_metric_fn: ``θ -> G(θ)^{-1}`` (a scalar, ``(d,)`` diagonal or
        ``(d, d)``), or a constant of those forms.
      B_hat: ``None`` (0) or the gradient-noise covariance, in the same forms.

    Returns:
      A :class:`~cenlmc_jax.base.SamplingAlgorithm` (:func:`complete_recipe` with
      ``D = inv_metric_fn``, ``Q = 0``).

    Raises:
      ValueError: ``inv_metric_fn`` of a wrong form.
    """
    la.check_matrix_form(inv_metric_fn, "inv_metric_fn")
    return complete_recipe(
        grad_estimator,
        step_size,
        inv_metric_fn,
        0.0,
        B_hat=B_hat,
        d_name="inv_metric_fn",
    )


# ---------------------------------------------------------------------------
# SGHMC: z = (θ, r), kept apart in the state.
# ---------------------------------------------------------------------------


class SGHMCState(NamedTuple):
    """State of an SGHMC chain.

    Attributes:
      position: θ, shape ``(d,)``, or a pytree.
      momentum: r, like θ.
      step: int32 step counter ``t`` (drives a step-size schedule).
    """

    position: Array
    momentum: Array
    step: Array


def initial_momentum(
    theta: Array, momentum: ArrayLike | None, rng_key: PRNGKey | None
) -> Array:
    """``r = 0``, the given ``momentum``, or ``r ~ N(0, I)`` when a key is given.

    ``N(0, I)`` is the momentum's stationary law.

    Args:
      theta: the flat position, shape ``(d,)``.
      momentum: ``None``, or the momentum, a ``(d,)`` array or a pytree like the
        position (it is flattened the same way).
      rng_key: ``None``, or a JAX PRNG key to draw ``r ~ N(0, I)``.

    Returns:
      The flat ``r: (d,)`` in ``theta.dtype``.

    Raises:
      ValueError: both ``momentum`` and ``rng_key`` given, or a momentum of
        another shape than ``theta``.
    """
    if momentum is not None and rng_key is not None:
        raise ValueError(
            "give either momentum or rng_key (to draw r ~ N(0, I)), not both."
        )
    if momentum is not None:
        r = ravel_position(momentum, "momentum")[0].astype(theta.dtype)
        if r.shape != theta.shape:
            raise ValueError(
                f"momentum must have the shape of position {tuple(theta.shape)}; got "
                f"{tuple(r.shape)}."
            )
        return r
    if rng_key is not None:
        return jax.random.normal(rng_key, theta.shape, dtype=theta.dtype)
    return jnp.zeros_like(theta)


def _sghmc_dq(friction: la.MatrixLike, d: int, B_hat: la.MatrixLike | None):
    """``D = [[0, 0], [0, C]]``, ``Q = [[0, -I], [I, 0]]`` and ``B̂`` on ``z = (θ, r)``.

    ``(2d, 2d)`` arrays.

    :func:`sghmc_step` is :func:`recipe_step` with these (the tests check it); it
    never builds them.
    """
    c = la.constant_dense(friction, d)
    D = np.zeros((2 * d, 2 * d))
    D[d:, d:] = c
    Q = np.zeros((2 * d, 2 * d))
    Q[:d, d:] = -np.eye(d)
    Q[d:, :d] = np.eye(d)
    if B_hat is None:
        return D, Q, None
    if callable(B_hat):

        def B(z):
            full = jnp.zeros((2 * d, 2 * d), z.dtype)
            return full.at[d:, d:].set(
                la.to_dense(la.evaluate(B_hat, z[:d], "B_hat"), d)
            )

        return D, Q, B
    la.check_matrix_shape(B_hat, "B_hat", d)
    B = np.zeros((2 * d, 2 * d))
    B[d:, d:] = la.constant_dense(B_hat, d)
    return D, Q, B


def _check_sghmc_inputs(theta: Array, friction, B_hat, eps: Array | None) -> None:
    """Friction symmetric PSD, ``B̂`` of a matrix form, and ``ε(2C - εB̂)`` PSD.

    Where the values are known.
    """
    d = theta.shape[0]
    la.check_matrix_shape(friction, "friction", d)
    c = la.constant_dense(friction, d)
    la.check_symmetric_psd(c, "friction", "the SGHMC friction C")
    b = la.concrete_value(B_hat, theta, "B_hat")
    if b is None:
        return
    la.check_matrix_shape(b, "B_hat", d)
    if eps is not None and is_concrete(eps):
        e = float(eps)
        la.check_noise_cov(
            e,
            c,
            la.constant_dense(b, d),
            "the noise covariance step_size*(2*friction - step_size*B_hat)",
            f"step_size={e:g}; B_hat too large for this step size",
        )


def sghmc_init(
    position: ArrayLike,
    rng_key: PRNGKey | None = None,
    *,
    momentum: ArrayLike | None = None,
    friction: ArrayLike = 1.0,
    step_size: StepSize | None = None,
    B_hat: la.MatrixLike | None = None,
) -> SGHMCState:
    """Start SGHMC at ``θ = position`` (``(d,)`` or a pytree) with ``step = 0``.

    Momentum ``r = 0``, the given ``momentum``, or ``r ~ N(0, I)`` (its
    stationary law) when ``rng_key`` is given. The friction (symmetric PSD)
    and the noise covariance ``ε_0(2C - ε_0 B̂)`` (PSD) are checked here.
    This is the function to call for a given momentum: the sampler object's
    ``init(position, rng_key=None)`` takes the arguments of every sampler's (so that
    :func:`cenlmc_jax.run.vmap_chains` can pass them) and draws ``r`` from the key.

    Args:
      position: θ, shape ``(d,)``, or a pytree.
      rng_key: ``None``, or a JAX PRNG key to draw ``r ~ N(0, I)``.
      momentum: ``None``, or the momentum, like ``position``.
      friction: ``C``, a constant scalar, ``(d,)`` diagonal or ``(d, d)`` PSD
        matrix.
      step_size: ``ε > 0`` or a schedule; ``None`` skips the noise covariance
        check.
      B_hat: ``None`` (0), or the ``r``-block gradient-noise covariance.

    Returns:
      The :class:`SGHMCState` ``(θ, r, step=0)``, ``θ`` and ``r`` in the form of
      ``position``.

    Raises:
      ValueError: a bad key, both ``momentum`` and ``rng_key``, a momentum of
        another shape, the friction not symmetric PSD, or the noise covariance not
        PSD.
    """
    if rng_key is not None:
        check_key(rng_key)
    theta, unravel = ravel_position(position)
    r = initial_momentum(theta, momentum, rng_key)
    step = jnp.zeros((), jnp.int32)
    # checks on concrete values run eagerly, even inside jit
    with jax.ensure_compile_time_eval():
        eps = None if step_size is None else step_size_at(step_size, step, theta.dtype)
        _check_sghmc_inputs(theta, friction, B_hat, eps)
    if unravel is None:
        return SGHMCState(theta, r, step)
    return SGHMCState(unravel(theta), unravel(r), step)


def _sghmc_noise_root(theta: Array, eps: Array, friction, B_hat) -> tuple[Array, Array]:
    """Root of ``ε(2C - εB̂)`` and ``noise_clipped``.

    Elementwise for scalar / diagonal ``C`` and ``B̂``.
    """
    c = np.asarray(friction, np.float64)
    b = None if B_hat is None else la.evaluate(B_hat, theta, "B_hat")
    if c.ndim <= 1 and (b is None or b.ndim <= 1):
        two_c = 2.0 * jnp.asarray(c, theta.dtype)
        if b is None:
            # the order of BlackJAX's sghmc diffusion
            return jnp.sqrt(eps * two_c), jnp.asarray(False)
        cov = eps * (two_c - eps * b)
        tol = la.eig_tol(1) * jnp.max(
            jnp.maximum(jnp.abs(eps * two_c), jnp.abs(eps * eps * b))
        )
        return jnp.sqrt(jnp.clip(cov, 0.0)), jnp.any(cov < -tol)
    return _noise_root(theta, eps, friction, B_hat)


def sghmc_step(
    rng_key: PRNGKey,
    state: SGHMCState,
    grad_estimator: GradEstimator,
    step_size: StepSize,
    friction: ArrayLike = 1.0,
    B_hat: la.MatrixLike | None = None,
    *,
    blowup_factor: float = 10.0,
) -> tuple[SGHMCState, RecipeInfo]:
    """One SGHMC step (docs/algorithms.md §5).

    The recipe on ``z = (θ, r)`` with ``H = U(θ) + ½ rᵀr``,
    ``D = [[0, 0], [0, C]]``, ``Q = [[0, -I], [I, 0]]`` (so ``Γ = 0`` and
    ``(D + Q)∇log π(z) = (r, g̃ - C r)``), written block-wise:

        θ' = θ + ε r
        r' = (I - εC) r + ε g̃(θ) + (ε(2C - εB̂))^{1/2} ξ,     ξ ~ N(0, I_d)

    Args:
      rng_key: split into ``(key_grad, key_noise)``; ``ξ`` from ``key_noise``
        in ``θ.dtype`` (BlackJAX's ``sgmcmc.diffusions.sghmc`` with
        ``alpha = C``, ``beta = B̂`` takes the same draw and the same operations).
      state: :class:`SGHMCState`.
      grad_estimator: ``(rng_key, θ) -> g̃(θ)``, an estimate of ``∇log π(θ)``.
      step_size: ``ε > 0`` or a schedule ``t -> ε_t``.
      friction: ``C``: a constant scalar, ``(d,)`` diagonal or ``(d, d)`` PSD
        matrix.
      B_hat: ``None`` (0), or the ``r``-block gradient-noise covariance (any
        matrix form, or a callable of θ).
      blowup_factor: the divergence bound (> 0; ``inf``: non-finite values only),
        below.

    Returns:
      ``(new_state, info)``: the next :class:`SGHMCState` (``step + 1``) and its
      :class:`RecipeInfo`.

    Raises:
      ValueError: a state or key of the wrong kind, ``blowup_factor`` not
        positive, a non-callable estimator, a callable or non-PSD friction, or a
        noise covariance that is not PSD.

    Scalar and diagonal ``C``, ``B̂`` cost elementwise work only; the noise
    root of a dense one is taken once per trace when constant (NumPy), per
    step otherwise (``info.noise_clipped`` reports a clearly negative
    eigenvalue).

    Divergence (``info.diverged``): besides non-finite values, a step whose
    deterministic kick to the momentum, ``ε|g̃(θ) - C r|``, exceeds
    ``blowup_factor·sqrt(d)``: ``blowup_factor`` times the stationary length of
    the momentum (``r ~ N(0, I)``, ``|r| ≈ sqrt(d)``). A chain that samples
    its target (curvature ``L``: ``Var θ = 1/L``, ``Var r = 1``) kicks by about
    ``ε sqrt((L + c²) d)``, a tenth of the bound or less for
    ``ε sqrt(L + c²) <= 1``. An unstable step size makes ``r`` grow geometrically
    and the kick with it, so the run is flagged (and stopped by ``cj.sample``)
    within a few steps, while its moments are still finite, long before the float
    overflow; a step size at the edge of stability is flagged later, and a stable
    one not at all (tests/test_input_table.py, ``unstable_sghmc``). With an exact
    gradient a kick
    that large also needs ``|∇log π(θ)| > blowup_factor·sqrt(d)/ε``: a start far
    outside the target, not an SGHMC step.
    """
    check_state(state, SGHMCState, "sghmc_init, or sghmc(...).init")
    check_key(rng_key)
    check_positive(blowup_factor, "blowup_factor", allow_inf=True)
    check_callable(grad_estimator, "grad_estimator", _GRAD_WHAT)
    if callable(friction):
        raise ValueError(
            "friction must be a constant scalar, (d,) or (d, d) PSD matrix; got "
            f"{friction!r}."
        )
    theta, unravel = ravel_position(state.position, check=False)
    r = ravel_position(state.momentum, "momentum", check=False)[0]
    eps = step_size_at(step_size, state.step, theta.dtype)
    _check_sghmc_inputs(theta, friction, B_hat, eps)
    key_grad, key_noise = jax.random.split(rng_key)
    grad = jnp.asarray(
        flat_grad_estimator(grad_estimator, unravel)(key_grad, theta), theta.dtype
    )
    root, clipped = _sghmc_noise_root(theta, eps, friction, B_hat)
    c = jnp.asarray(friction, theta.dtype)
    decay = (1.0 - c * eps) * r if c.ndim <= 1 else r - eps * (c @ r)
    new_theta = theta + eps * r
    # ε(g̃ - C r): the deterministic change of the momentum
    kick = decay + eps * grad - r
    new_r = (
        decay
        + eps * grad
        + la.matvec(root, jax.random.normal(key_noise, theta.shape, dtype=theta.dtype))
    )
    # chains: 0 or 1
    bad = (~(jnp.all(jnp.isfinite(new_theta)) & jnp.all(jnp.isfinite(new_r)))).astype(
        jnp.int32
    )
    bound = jnp.asarray(blowup_factor, theta.dtype) * jnp.sqrt(
        jnp.asarray(theta.shape[0], theta.dtype)
    )
    exploded = ~(jnp.linalg.norm(kick) <= bound)  # NaN counts
    info = RecipeInfo(
        jnp.asarray(1, jnp.int32), bad, (bad > 0) | exploded | ~(eps > 0), eps, clipped
    )
    if unravel is not None:
        new_theta, new_r = unravel(new_theta), unravel(new_r)
    return SGHMCState(new_theta, new_r, state.step + 1), info


def sghmc(
    grad_estimator: GradEstimator,
    step_size: StepSize,
    *,
    friction: ArrayLike = 1.0,
    B_hat: la.MatrixLike | None = None,
    blowup_factor: float = 10.0,
) -> SamplingAlgorithm:
    """SGHMC (docs/algorithms.md §5) as a sampler object: :func:`sghmc_step`.

    ::

        θ' = θ + ε r,   r' = r + ε g̃(θ) - ε C r + N(0, ε(2C - εB̂))

    ``init(position, rng_key=None)``: ``r ~ N(0, I)`` (its stationary law) drawn
    from the key, ``r = 0`` without one; for a momentum of your own call
    :func:`sghmc_init` (``momentum=``). The state keeps ``θ`` in ``position`` and
    ``r`` in ``momentum`` (:class:`SGHMCState`).

    Args:
      grad_estimator: ``(rng_key, θ) -> g̃(θ)``, an estimate of ``∇log π(θ)``.
      step_size: ``ε > 0`` or a schedule ``t -> ε_t``.
      friction: ``C``, a constant scalar, ``(d,)`` diagonal or ``(d, d)`` PSD
        matrix.
      B_hat: the ``r``-block gradient-noise covariance (any matrix form, or a
        callable of θ).
      blowup_factor: a step whose kick to the momentum exceeds
        ``blowup_factor·sqrt(d)`` diverged (:func:`sghmc_step`).

    Returns:
      A :class:`~cenlmc_jax.base.SamplingAlgorithm` with :class:`SGHMCState`
      states.

    Raises:
      ValueError: a non-callable estimator, a bad step size or schedule,
        ``blowup_factor`` not positive, or a callable friction or matrix of a
        wrong form.
    """
    check_callable(grad_estimator, "grad_estimator", _GRAD_WHAT)
    check_schedule(step_size, "step_size")
    check_positive(blowup_factor, "blowup_factor", allow_inf=True)
    if callable(friction):
        raise ValueError(
            "friction must be a constant scalar, (d,) or (d, d) PSD matrix; got "
            f"{friction!r}."
        )
    la.check_matrix_form(friction, "friction")
    if B_hat is not None:
        la.check_matrix_form(B_hat, "B_hat")

    def init(position, rng_key=None):
        state = sghmc_init(
            position, rng_key, friction=friction, step_size=step_size, B_hat=B_hat
        )
        check_grad_estimator(grad_estimator, state.position)
        return state

    def step(rng_key, state):
        return sghmc_step(
            rng_key,
            state,
            grad_estimator,
            step_size,
            friction,
            B_hat,
            blowup_factor=blowup_factor,
        )

    return SamplingAlgorithm(init, step)
