"""The complete recipe for stochastic-gradient MCMC (spec sections 5-6).

Ma, Chen & Fox, *A Complete Recipe for Stochastic Gradient MCMC* (the
"unifying framework" paper). Any SDE whose stationary density is
``∝ exp(-H(z))`` can be written

    dz = [ -(D(z) + Q(z)) ∇H(z) + Γ(z) ] dt + sqrt(2 D(z)) dW,
    Γ_i(z) = Σ_j ∂_{z_j} (D_ij(z) + Q_ij(z)),                          (spec 5)

with ``D`` symmetric positive semidefinite and ``Q`` skew-symmetric. The
Euler step with a (stochastic) gradient estimate ``∇H̃`` is

    z_{t+1} = z_t + ε_t [ -(D + Q) ∇H̃(z_t) + Γ(z_t) ] + N(0, ε_t (2 D(z_t) - ε_t B̂_t)).

Sign convention (read this once): the recipe works with the **potential**
``H`` (the papers' ``U``, ``f``), not with a log density. A
``grad_estimator(rng_key, z) -> ∇H̃(z)`` returns the gradient of the
*negative* log density; :mod:`cenlmc_jax.gradients` builds estimators from a
``logdensity_fn``, a deterministic gradient, minibatches or added noise.

``B̂_t`` is the covariance of the gradient noise *as it enters the dynamics*:
if ``∇H̃ = ∇H + ν`` with ``Cov ν = V``, the drift injects ``ε² (D+Q) V (D+Q)ᵀ``
of noise; choosing ``B̂ = (D+Q) V (D+Q)ᵀ`` makes the total injected
covariance exactly ``2 ε D`` when ``ν`` is Gaussian. (This is Ma et al.'s
``B̂``; Chen et al.'s SGHMC writes ``2(C - B̂_Chen) ε`` with ``B̂_Chen = ε V / 2``,
the same thing.) ``B̂ = None`` means 0 (full gradients, or noise ignored).

The noise covariance may be singular (SGHMC has ``D = [[0, 0], [0, C]]``): its
square root is the symmetric PSD root from ``eigh`` with eigenvalues clipped
at 0 — after checking, whenever the values are concrete, that no eigenvalue
is below ``-tol·scale`` (``tol = 100·n·machine-eps``, ``scale`` = the size
of the terms ``2εD`` and ``ε²B̂``, since the cancellation error is relative
to them), else ``ValueError``. Inside a traced run the check cannot
raise; a clearly negative eigenvalue is reported in ``info.noise_clipped``.

SGLD, SGRLD and SGHMC are constructors that only choose ``D`` and ``Q``
(:func:`sgld`, :func:`sgrld`, :func:`sghmc`); SGRHMC (spec 6) has its own
block-structured step :func:`sgrhmc_step`, checked in the tests to equal the
recipe with the section-6 ``D, Q`` (:func:`sgrhmc_dq`).

Step sizes are a positive float or a schedule ``t -> ε_t`` of the step
counter ``state.step`` (an optax schedule works). The paper's SGRLD schedule
``ε_t = (a (1 + t/b))^{-c}`` is one line::

    step_size = lambda t: (a * (1.0 + t / b)) ** (-c)

All steps act on one chain (``z: (n,)``) and vmap over chains::

    keys = jax.random.split(key, num_chains)
    states, infos = jax.vmap(lambda k, s: recipe_step(k, s, ...))(keys, states)
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable, NamedTuple, Optional, Union

import jax
import jax.numpy as jnp
import numpy as np

from cenlmc_jax._validation import check_position, check_positive, is_concrete
from cenlmc_jax.types import Array, ArrayLike, PRNGKey

MatrixFn = Union[Callable[[Array], Array], ArrayLike]
GradEstimator = Callable[[PRNGKey, Array], Array]  # (rng_key, z) -> ∇H̃(z), same shape as z
StepSize = Union[float, Callable[[Array], Array]]

__all__ = [
    "gamma_term",
    "evaluate_matrix",
    "psd_sqrt",
    "RecipeState",
    "RecipeInfo",
    "recipe_init",
    "recipe_step",
    "SGMCMC",
    "sgld",
    "sgrld",
    "sghmc",
    "sgrhmc",
    "sgrhmc_dq",
    "SGRHMCState",
    "SGRHMCInfo",
    "sgrhmc_init",
    "sgrhmc_step",
    "gsgrhmc_inv_metric",
]


# ---------------------------------------------------------------------------
# Building blocks: Γ by autodiff, a PSD square root with a stable derivative.
# ---------------------------------------------------------------------------


def evaluate_matrix(M: MatrixFn, z: Array) -> Array:
    """``M(z)`` if ``M`` is callable, else ``jnp.asarray(M)`` (a constant matrix)."""
    return M(z) if callable(M) else jnp.asarray(M)


def gamma_term(D: MatrixFn, Q: MatrixFn, z: Array, sign: float = 1.0) -> Array:
    """``Γ_i(z) = Σ_j ∂_{z_j} (D_ij(z) + sign·Q_ij(z))`` (spec sections 5 and 8), shape (n,).

    D, Q: callables ``z -> (n, n)`` or constant arrays. A constant matrix has
    zero divergence, so it is not differentiated; when both are constant the
    result is zeros. ``sign = -1`` gives the adjoint process' ``Γ_-`` (section 8).
    """
    z = jnp.asarray(z)
    gamma = jnp.zeros(z.shape, dtype=z.dtype)
    for M, s in ((D, 1.0), (Q, sign)):
        if callable(M):
            # jacfwd: n forward passes; jac[i, j, k] = ∂_{z_k} M_ij(z) and the
            # divergence of row i is the trace over (j, k).
            jac = jax.jacfwd(M)(z)
            gamma = gamma + s * jnp.einsum("ijj->i", jac).astype(z.dtype)
    return gamma


def _eig_tol(n: int, dtype: Any) -> float:
    """Relative tolerance for "clearly negative" eigenvalues: eigh's backward
    error is O(n·eps·|A|), so anything above 100·n·eps is not rounding."""
    return 100.0 * n * float(jnp.finfo(dtype).eps)


@jax.custom_jvp
def psd_sqrt(a: Array) -> Array:
    """Symmetric PSD square root ``S = V diag(sqrt(max(w, 0))) Vᵀ`` of a symmetric ``a: (n, n)``.

    Eigenvalues below 0 (rounding) are clipped. The derivative is not eigh's
    (which divides by eigenvalue gaps and is NaN at repeated eigenvalues, e.g.
    any metric ``c(θ)·I``): it solves the Sylvester equation
    ``S dS + dS S = dA`` in the eigenbasis, ``dS'_ij = dA'_ij / (s_i + s_j)``,
    finite whenever ``s_i + s_j > 0``. Where both vanish the square root is
    genuinely not differentiable and the derivative is ±inf (0 for a zero
    tangent), so a singular ``Γ`` shows up as non-finite values, not silence.
    """
    a = 0.5 * (a + a.T)
    w, v = jnp.linalg.eigh(a)
    return (v * jnp.sqrt(jnp.clip(w, 0.0))) @ v.T


@psd_sqrt.defjvp
def _psd_sqrt_jvp(primals, tangents):
    (a,), (da,) = primals, tangents
    a = 0.5 * (a + a.T)
    da = 0.5 * (da + da.T)
    w, v = jnp.linalg.eigh(a)
    s = jnp.sqrt(jnp.clip(w, 0.0))
    out = (v * s) @ v.T
    dap = v.T @ da @ v
    denom = s[:, None] + s[None, :]
    dsp = jnp.where(dap == 0, jnp.zeros_like(dap), dap / denom)
    return out, v @ dsp @ v.T


def _noise_root(cov: Array, scale: Array) -> tuple[Array, Array]:
    """PSD root of a noise covariance and whether it was clearly negative (traced path).

    ``scale``: size of the terms ``cov`` was computed from (cancellation error is relative to it).
    """
    cov = 0.5 * (cov + cov.T)
    w, v = jnp.linalg.eigh(cov)
    clipped = jnp.min(w) < -_eig_tol(cov.shape[0], cov.dtype) * scale
    return (v * jnp.sqrt(jnp.clip(w, 0.0))) @ v.T, clipped


def _np_psd_sqrt(a: np.ndarray) -> np.ndarray:
    w, v = np.linalg.eigh(0.5 * (a + a.T))
    return (v * np.sqrt(np.clip(w, 0.0, None))) @ v.T


def _check_psd(m: Any, name: str, what: str, scale: Optional[float] = None) -> None:
    """ValueError if the concrete symmetric matrix ``m`` has a clearly negative eigenvalue.

    ``scale``: the size of the terms ``m`` was computed from (default: ``m``'s
    largest |eigenvalue|); for ``ε(2D - εB̂)`` the cancellation error is
    relative to ``|2εD|``, not to the (possibly zero) result.
    """
    m = np.asarray(m, dtype=np.float64)
    if not np.all(np.isfinite(m)):
        raise ValueError(f"{name} must be finite; got a matrix with NaN or inf entries.")
    w = np.linalg.eigvalsh(0.5 * (m + m.T))
    if scale is None:
        scale = float(np.max(np.abs(w)))
    scale = max(scale, np.finfo(np.float64).tiny)
    tol = _eig_tol(m.shape[0], np.float32)  # float32 rounding is the worst a user's D carries
    if w.min() < -tol * scale:
        raise ValueError(
            f"{name} must be positive semidefinite ({what}); its smallest eigenvalue is "
            f"{w.min():.4g} (scale of the matrix {scale:.4g})."
        )


def _noise_cov_checked(eps: float, D: Any, B: Any, name: str, what: str) -> np.ndarray:
    """``ε(2D - εB̂)`` in float64, checked PSD relative to the size of its two terms."""
    two_d = 2.0 * eps * np.asarray(D, np.float64)
    b = eps * eps * np.asarray(B, np.float64)
    cov = two_d - b
    scale = float(max(np.max(np.abs(two_d)), np.max(np.abs(b))))
    _check_psd(cov, name, what, scale)
    return cov


def _check_square(m: Any, n: int, name: str) -> None:
    shape = tuple(np.shape(m))
    if shape != (n, n):
        raise ValueError(f"{name} must be an (n, n) = ({n}, {n}) matrix for a position of shape ({n},); got shape {shape}.")


def _check_D(m: Any, n: int, name: str = "D") -> None:
    _check_square(m, n, name)
    m = np.asarray(m, dtype=np.float64)
    scale = max(float(np.max(np.abs(m))), np.finfo(np.float64).tiny)
    asym = float(np.max(np.abs(m - m.T)))
    if asym > _eig_tol(n, np.float32) * scale:
        raise ValueError(f"{name} must be symmetric; max |{name} - {name}ᵀ| = {asym:.4g} (max |{name}| = {scale:.4g}).")
    _check_psd(m, name, "the reversible part of the recipe")


def _check_Q(m: Any, n: int, name: str = "Q") -> None:
    _check_square(m, n, name)
    m = np.asarray(m, dtype=np.float64)
    if not np.all(np.isfinite(m)):
        raise ValueError(f"{name} must be finite; got a matrix with NaN or inf entries.")
    scale = max(float(np.max(np.abs(m))), 1.0)
    sym = float(np.max(np.abs(m + m.T)))
    if sym > _eig_tol(n, np.float32) * scale:
        raise ValueError(
            f"{name} must be skew-symmetric (the irreversible part of the recipe); "
            f"max |{name} + {name}ᵀ| = {sym:.4g}."
        )


def _all_concrete(*xs: Any) -> bool:
    return all(is_concrete(x) for x in jax.tree_util.tree_leaves(xs))


def _step_size_at(step_size: StepSize, step: Array, dtype: Any) -> Array:
    """``ε_t``: the float itself or the schedule evaluated at the step counter."""
    eps = step_size(step) if callable(step_size) else step_size
    if not callable(step_size):
        check_positive(step_size, "step_size")
    elif is_concrete(eps):
        check_positive(eps, f"step_size({int(step)}) (the schedule's value)")
    return jnp.asarray(eps, dtype=dtype)


def _check_callable(fn: Any, name: str, what: str) -> None:
    if not callable(fn):
        raise ValueError(f"{name} must be a callable {what}; got {fn!r}.")


# ---------------------------------------------------------------------------
# The complete recipe.
# ---------------------------------------------------------------------------


class RecipeState(NamedTuple):
    """State of a complete-recipe chain.

    position: (n,) the augmented state ``z`` (``θ`` for SGLD/SGRLD, ``(θ, r)`` for SGHMC).
    step: int32 step counter ``t`` (drives a step-size schedule).
    """

    position: Array
    step: Array


class RecipeInfo(NamedTuple):
    """What one recipe step did.

    grad_evals: calls of ``grad_estimator`` (1; a minibatch call counts once).
    diverged: the new position has NaN/inf entries.
    step_size: ``ε_t`` used.
    noise_clipped: the noise covariance ``ε(2D - εB̂)`` had an eigenvalue
      clearly below 0 that was clipped (``B̂`` too large for this ``ε``: the
      step injected less noise than the recipe needs).
    """

    grad_evals: Array
    diverged: Array
    step_size: Array
    noise_clipped: Array


def _check_recipe_inputs(
    z: Array, D: MatrixFn, Q: MatrixFn, B_hat: Optional[MatrixFn], eps: Optional[Array]
) -> None:
    """Everything that can be checked in Python: constant matrices always, callables at a concrete z."""
    n = z.shape[0]
    concrete_z = is_concrete(z)
    vals = {}
    for name, M in (("D", D), ("Q", Q), ("B_hat", B_hat)):
        if M is None:
            continue
        if callable(M):
            if not concrete_z:
                continue
            try:
                vals[name] = M(z)
            except Exception as exc:
                raise ValueError(f"{name} failed on a position of shape {z.shape}: {exc}") from exc
        else:
            vals[name] = M
        if not is_concrete(vals[name]):
            del vals[name]
    if "D" in vals:
        _check_D(vals["D"], n, "D")
    if "Q" in vals:
        _check_Q(vals["Q"], n, "Q")
    if "B_hat" in vals:
        _check_square(vals["B_hat"], n, "B_hat")
    if "D" in vals and "B_hat" in vals and eps is not None and is_concrete(eps):
        e = float(eps)
        _noise_cov_checked(e, vals["D"], vals["B_hat"], "the noise covariance step_size*(2*D - step_size*B_hat)",
                           f"step_size={e:g}; B_hat too large for this step size, or D not PSD")


def recipe_init(
    position: ArrayLike,
    D: Optional[MatrixFn] = None,
    Q: Optional[MatrixFn] = None,
    step_size: Optional[StepSize] = None,
    B_hat: Optional[MatrixFn] = None,
) -> RecipeState:
    """Start a recipe chain at ``position: (n,)`` with ``step = 0``.

    When ``D``, ``Q`` (and ``step_size``, ``B_hat``) are given they are
    checked at the initial point: ``D`` symmetric PSD, ``Q`` skew-symmetric,
    the noise covariance ``ε_0(2D - ε_0 B̂)`` PSD — ``ValueError`` otherwise.
    """
    z = check_position(position)
    if z.ndim != 1:
        raise ValueError(f"position must be a vector of shape (n,); got shape {tuple(z.shape)}.")
    step = jnp.zeros((), jnp.int32)
    eps = None
    if step_size is not None:
        eps = _step_size_at(step_size, step, z.dtype)
    if D is not None or Q is not None:
        D_ = D if D is not None else np.zeros((z.shape[0],) * 2)
        Q_ = Q if Q is not None else np.zeros((z.shape[0],) * 2)
        _check_recipe_inputs(z, D_, Q_, B_hat, eps)
    return RecipeState(z, step)


def _recipe_mean_and_root(
    z: Array, grad: Array, eps: Array, D: MatrixFn, Q: MatrixFn, B_hat: Optional[MatrixFn]
) -> tuple[Array, Array, Array]:
    """Deterministic part ``z + ε[-(D+Q)∇H̃ + Γ]`` and the noise root ``(ε(2D - εB̂))^{1/2}``.

    Returns (mean: (n,), root: (n, n), noise_clipped: bool).
    """
    dtype = z.dtype
    Dz = jnp.asarray(evaluate_matrix(D, z), dtype)
    Qz = jnp.asarray(evaluate_matrix(Q, z), dtype)
    gamma = gamma_term(D, Q, z)
    mean = z + eps * (-(Dz + Qz) @ grad + gamma)
    constant_D = not callable(D) and is_concrete(D)
    if constant_D and B_hat is None:
        # sqrt(2εD) = sqrt(ε)·sqrt(2D): the root of the constant part is taken once, in numpy.
        root = jnp.sqrt(eps) * jnp.asarray(_np_psd_sqrt(2.0 * np.asarray(D, np.float64)), dtype)
        return mean, root, jnp.asarray(False)
    if constant_D and not callable(B_hat) and is_concrete(B_hat) and is_concrete(eps):
        e = float(eps)
        cov = e * (2.0 * np.asarray(D, np.float64) - e * np.asarray(B_hat, np.float64))
        return mean, jnp.asarray(_np_psd_sqrt(cov), dtype), jnp.asarray(False)  # checked PSD in Python
    two_d = 2.0 * eps * Dz
    if B_hat is None:
        root, clipped = _noise_root(two_d, jnp.max(jnp.abs(two_d)))
        return mean, root, clipped
    b = eps * eps * jnp.asarray(evaluate_matrix(B_hat, z), dtype)
    root, clipped = _noise_root(two_d - b, jnp.maximum(jnp.max(jnp.abs(two_d)), jnp.max(jnp.abs(b))))
    return mean, root, clipped


def recipe_step(
    rng_key: PRNGKey,
    state: RecipeState,
    grad_estimator: GradEstimator,
    step_size: StepSize,
    D: MatrixFn,
    Q: MatrixFn,
    B_hat: Optional[MatrixFn] = None,
) -> tuple[RecipeState, RecipeInfo]:
    """One Euler step of the complete recipe (spec section 5), one chain.

        z' = z + ε_t [ -(D(z) + Q(z)) ∇H̃(z) + Γ(z) ] + N(0, ε_t (2 D(z) - ε_t B̂(z)))

    Args:
      rng_key: split into ``(key_grad, key_noise)``: ``key_grad`` goes to
        ``grad_estimator``, ``key_noise`` draws ``ξ ~ N(0, I_n)`` in ``z.dtype``
        and the noise is ``S ξ`` with ``S`` the symmetric PSD root of the covariance.
      state: :class:`RecipeState`, ``position: (n,)``.
      grad_estimator: ``(rng_key, z) -> ∇H̃(z): (n,)``, the gradient of the
        potential ``H = -log density`` (full or stochastic).
      step_size: ``ε > 0`` or a schedule ``t -> ε_t`` of ``state.step``.
      D: ``z -> (n, n)`` symmetric PSD, or a constant array.
      Q: ``z -> (n, n)`` skew-symmetric, or a constant array.
      B_hat: ``None`` (0), a constant ``(n, n)`` array or ``z -> (n, n)``:
        the gradient-noise covariance as it enters the dynamics (module docstring).

    ``Γ`` is computed by ``jax.jacfwd`` of the callables (constant matrices
    are not differentiated). Constant ``D``, ``Q``, ``B_hat`` are checked on
    every trace; callables are checked when ``z`` is concrete (eager calls).
    """
    _check_callable(grad_estimator, "grad_estimator", "(rng_key, z) -> gradient of H at z")
    z = state.position
    eps = _step_size_at(step_size, state.step, z.dtype)
    _check_recipe_inputs(z, D, Q, B_hat, eps)
    key_grad, key_noise = jax.random.split(rng_key)
    grad = jnp.asarray(grad_estimator(key_grad, z), z.dtype)
    mean, root, clipped = _recipe_mean_and_root(z, grad, eps, D, Q, B_hat)
    xi = jax.random.normal(key_noise, z.shape, dtype=z.dtype)
    new_z = mean + root @ xi
    info = RecipeInfo(
        grad_evals=jnp.asarray(1, jnp.int32),
        diverged=~jnp.all(jnp.isfinite(new_z)),
        step_size=eps,
        noise_clipped=clipped,
    )
    return RecipeState(new_z, state.step + 1), info


# ---------------------------------------------------------------------------
# Special cases as choices of D and Q.
# ---------------------------------------------------------------------------


class SGMCMC(NamedTuple):
    """A sampler built from the recipe: ``init`` / ``step`` pure functions (optax-style).

    init: ``position -> state`` (checks D, Q at the initial point).
    step: ``(rng_key, state) -> (state, info)``, ready for :func:`cenlmc_jax.run.sample`.
    theta: ``state -> θ`` (the parameter block of ``state.position``), a ``trace_fn``.
    """

    init: Callable
    step: Callable
    theta: Callable


def _metric_matrix(inv_metric_fn: Callable, theta: Array) -> Array:
    """``G(θ)^{-1}`` as a dense (d, d) matrix (a (d,) return is a diagonal)."""
    g = jnp.asarray(inv_metric_fn(theta))
    return jnp.diag(g) if g.ndim == 1 else g


def sgld(grad_estimator: GradEstimator, step_size: StepSize, B_hat: Optional[MatrixFn] = None) -> SGMCMC:
    """SGLD (spec 5): ``H = U``, ``D = I``, ``Q = 0``: ``θ' = θ - ε∇Ũ(θ) + N(0, ε(2I - εB̂))``.

    ``grad_estimator(rng_key, θ) -> ∇Ũ(θ)``. State position is ``θ: (d,)``.
    """
    _check_callable(grad_estimator, "grad_estimator", "(rng_key, theta) -> gradient of U at theta")
    check_positive(step_size, "step_size")

    def dq(d):
        return np.eye(d), np.zeros((d, d))

    def init(position):
        z = check_position(position)
        D, Q = dq(z.shape[-1])
        return recipe_init(z, D, Q, step_size, B_hat)

    def step(rng_key, state):
        D, Q = dq(state.position.shape[-1])
        return recipe_step(rng_key, state, grad_estimator, step_size, D, Q, B_hat)

    return SGMCMC(init, step, lambda state: state.position)


def sgrld(
    grad_estimator: GradEstimator, step_size: StepSize, inv_metric_fn: Callable, B_hat: Optional[MatrixFn] = None
) -> SGMCMC:
    """SGRLD (spec 5): ``D = G(θ)^{-1}``, ``Q = 0``; ``Γ_i = Σ_j ∂_j (G^{-1})_ij`` by autodiff.

    ``inv_metric_fn(θ)`` returns ``G(θ)^{-1}`` as a (d, d) matrix or a (d,) diagonal.
    """
    _check_callable(grad_estimator, "grad_estimator", "(rng_key, theta) -> gradient of U at theta")
    _check_callable(inv_metric_fn, "inv_metric_fn", "theta -> G(theta)^-1 ((d, d) or (d,))")
    check_positive(step_size, "step_size")
    D = functools.partial(_metric_matrix, inv_metric_fn)

    def init(position):
        z = check_position(position)
        return recipe_init(z, D, np.zeros((z.shape[-1],) * 2), step_size, B_hat)

    def step(rng_key, state):
        Q = np.zeros((state.position.shape[-1],) * 2)
        return recipe_step(rng_key, state, grad_estimator, step_size, D, Q, B_hat)

    return SGMCMC(init, step, lambda state: state.position)


def _momentum_grad_estimator(grad_estimator: GradEstimator) -> GradEstimator:
    """``∇H̃(θ, r) = (∇Ũ(θ), r)`` for ``H = U(θ) + ½ rᵀr``."""

    def grad_h(rng_key, z):
        d = z.shape[0] // 2
        return jnp.concatenate([jnp.asarray(grad_estimator(rng_key, z[:d]), z.dtype), z[d:]])

    return grad_h


def sghmc(
    grad_estimator: GradEstimator, step_size: StepSize, friction: ArrayLike = 1.0, B_hat: Optional[MatrixFn] = None
) -> SGMCMC:
    """SGHMC (spec 5): ``z = (θ, r)``, ``H = U(θ) + ½ rᵀr``,
    ``D = [[0, 0], [0, C]]``, ``Q = [[0, -I], [I, 0]]``:

        θ' = θ + ε r,   r' = r - ε∇Ũ(θ) - ε C r + N(0, ε(2C - εB̂_r))

    friction: ``C`` as a scalar, a (d,) diagonal or a (d, d) PSD matrix.
    B_hat: ``(2d, 2d)`` for the whole ``z`` (only its ``r`` block is non-zero in practice).
    ``init(theta, momentum=None, rng_key=None)``: ``r = 0``, the given
    momentum, or ``r ~ N(0, I)`` (its stationary law) when a key is given.
    State position is ``z = (θ, r): (2d,)``; ``theta(state)`` is ``z[..., :d]``.
    """
    _check_callable(grad_estimator, "grad_estimator", "(rng_key, theta) -> gradient of U at theta")
    check_positive(step_size, "step_size")
    c = np.asarray(friction, dtype=np.float64)
    grad_h = _momentum_grad_estimator(grad_estimator)

    def dq(d):
        if np.ndim(c) == 0:
            cm = float(c) * np.eye(d)
        elif np.ndim(c) == 1:
            cm = np.diag(c)
        else:
            cm = np.asarray(c)
        _check_square(cm, d, "friction")
        _check_psd(cm, "friction", "the SGHMC friction C")
        D = np.zeros((2 * d, 2 * d))
        D[d:, d:] = cm
        Q = np.zeros((2 * d, 2 * d))
        Q[:d, d:] = -np.eye(d)
        Q[d:, :d] = np.eye(d)
        return D, Q

    def init(position, momentum=None, rng_key=None):
        theta = check_position(position)
        if theta.ndim != 1:
            raise ValueError(f"position must be a vector of shape (d,); got shape {tuple(theta.shape)}.")
        r = _initial_momentum(theta, momentum, rng_key)
        D, Q = dq(theta.shape[0])
        return recipe_init(jnp.concatenate([theta, r]), D, Q, step_size, B_hat)

    def step(rng_key, state):
        D, Q = dq(state.position.shape[-1] // 2)
        return recipe_step(rng_key, state, grad_h, step_size, D, Q, B_hat)

    return SGMCMC(init, step, lambda state: state.position[..., : state.position.shape[-1] // 2])


def _initial_momentum(theta: Array, momentum: Optional[ArrayLike], rng_key: Optional[PRNGKey]) -> Array:
    if momentum is not None and rng_key is not None:
        raise ValueError("give either momentum or rng_key (to draw r ~ N(0, I)), not both.")
    if momentum is not None:
        r = check_position(momentum, "momentum").astype(theta.dtype)
        if r.shape != theta.shape:
            raise ValueError(f"momentum must have the shape of position {tuple(theta.shape)}; got {tuple(r.shape)}.")
        return r
    if rng_key is not None:
        return jax.random.normal(rng_key, theta.shape, dtype=theta.dtype)
    return jnp.zeros_like(theta)


# ---------------------------------------------------------------------------
# SGRHMC (spec section 6).
# ---------------------------------------------------------------------------


class SGRHMCState(NamedTuple):
    """State of an SGRHMC chain.

    position: (d,) the parameter ``θ`` (what :func:`cenlmc_jax.run.sample` traces by default).
    momentum: (d,) the momentum ``r``.
    step: int32 step counter (drives a step-size schedule).
    """

    position: Array
    momentum: Array
    step: Array


class SGRHMCInfo(NamedTuple):
    """What one SGRHMC step did.

    grad_evals: calls of ``grad_estimator`` (1).
    diverged: the new ``θ`` or ``r`` has NaN/inf entries (explicit Euler can
      blow up where ``Γ_r`` is singular, e.g. gSGRHMC on the double well).
    step_size: ``ε_t`` used.
    noise_clipped: ``ε(2G^{-1} - εB̂)`` had a clearly negative eigenvalue (clipped).
    gamma_norm: ``|Γ_r(θ)|`` (large values flag the neighbourhood of a singularity).
    """

    grad_evals: Array
    diverged: Array
    step_size: Array
    noise_clipped: Array
    gamma_norm: Array


def _inv_metric(inv_metric_fn: Callable, theta: Array) -> Array:
    g = jnp.asarray(inv_metric_fn(theta))
    d = theta.shape[0]
    if g.shape not in ((d,), (d, d)):
        raise ValueError(
            f"inv_metric_fn must return G(theta)^-1 as a (d, d) matrix or a (d,) diagonal with d = {d}; "
            f"got shape {tuple(g.shape)}."
        )
    return g.astype(theta.dtype)


def _sqrt_inv_metric(inv_metric_fn: Callable, theta: Array) -> tuple[Array, Array]:
    """``(G^{-1/2}(θ), G^{-1}(θ))``: ``sqrt`` of a diagonal, :func:`psd_sqrt` of a matrix."""
    g = _inv_metric(inv_metric_fn, theta)
    half = jnp.sqrt(jnp.clip(g, 0.0)) if g.ndim == 1 else psd_sqrt(g)
    return half, g


def _gamma_r(inv_metric_fn: Callable, theta: Array) -> tuple[Array, Array, Array]:
    """``Γ_r,i = Σ_j ∂_{θ_j} (G^{-1/2})_ij`` by ``jacfwd``, with ``G^{-1/2}`` and ``G^{-1}``.

    For a diagonal metric only ``∂_{θ_i} (G^{-1/2})_i`` survives.
    """

    def half_with_aux(t):
        half, g = _sqrt_inv_metric(inv_metric_fn, t)
        return half, (half, g)

    jac, (half, g) = jax.jacfwd(half_with_aux, has_aux=True)(theta)
    gamma = jnp.diagonal(jac) if half.ndim == 1 else jnp.einsum("ijj->i", jac)
    return gamma, half, g


def _matvec(m: Array, x: Array) -> Array:
    return m * x if m.ndim == 1 else m @ x


def _sgrhmc_b_hat(B_hat: Optional[MatrixFn], theta: Array) -> Optional[Array]:
    if B_hat is None:
        return None
    b = jnp.asarray(evaluate_matrix(B_hat, theta), theta.dtype)
    d = theta.shape[0]
    if b.shape not in ((), (d,), (d, d)):
        raise ValueError(f"B_hat must be a scalar, a (d,) diagonal or a (d, d) matrix with d = {d}; got shape {tuple(b.shape)}.")
    return b


def _sgrhmc_mean_and_root(
    theta: Array, r: Array, grad: Array, eps: Array, inv_metric_fn: Callable, B_hat: Optional[MatrixFn], naive: bool
) -> tuple[Array, Array, Array, Array, Array]:
    """Deterministic parts of θ', r' (spec 6), the noise root for r, noise_clipped, Γ_r.

    Root is (d,) for a diagonal covariance, (d, d) otherwise.
    """
    gamma, half, g = _gamma_r(inv_metric_fn, theta)
    if naive:
        gamma = jnp.zeros_like(gamma)
    theta_mean = theta + eps * _matvec(half, r)
    r_mean = r + eps * (-_matvec(half, grad) + gamma - _matvec(g, r))
    b = _sgrhmc_b_hat(B_hat, theta)
    if b is None:
        # sqrt(2εG^{-1}) = sqrt(2ε)·G^{-1/2}: no second eigendecomposition.
        return theta_mean, r_mean, jnp.sqrt(2.0 * eps) * half, jnp.asarray(False), gamma
    if g.ndim == 1 and b.ndim <= 1:
        two_g, eb = 2.0 * eps * g, eps * eps * b
        cov = two_g - eb
        tol = _eig_tol(1, cov.dtype) * jnp.maximum(jnp.abs(two_g), jnp.abs(eb))
        return theta_mean, r_mean, jnp.sqrt(jnp.clip(cov, 0.0)), jnp.any(cov < -tol), gamma
    gm = jnp.diag(g) if g.ndim == 1 else g
    bm = b * jnp.eye(theta.shape[0], dtype=theta.dtype) if b.ndim == 0 else (jnp.diag(b) if b.ndim == 1 else b)
    two_g, eb = 2.0 * eps * gm, eps * eps * bm
    root, clipped = _noise_root(two_g - eb, jnp.maximum(jnp.max(jnp.abs(two_g)), jnp.max(jnp.abs(eb))))
    return theta_mean, r_mean, root, clipped, gamma


def _check_sgrhmc_inputs(theta: Array, inv_metric_fn: Callable, B_hat: Optional[MatrixFn], eps: Optional[Array]) -> None:
    """At a concrete θ: ``G^{-1}(θ)`` symmetric PSD, noise covariance PSD."""
    if not is_concrete(theta):
        return
    g = np.asarray(_inv_metric(inv_metric_fn, theta), np.float64)
    gm = np.diag(g) if g.ndim == 1 else g
    _check_D(gm, theta.shape[0], "inv_metric_fn(position)")
    if B_hat is None or eps is None or not is_concrete(eps):
        return
    b = _sgrhmc_b_hat(B_hat, theta)
    if not is_concrete(b):
        return
    b = np.asarray(b, np.float64)
    d = theta.shape[0]
    bm = b * np.eye(d) if b.ndim == 0 else (np.diag(b) if b.ndim == 1 else b)
    e = float(eps)
    _noise_cov_checked(e, gm, bm, "the noise covariance step_size*(2*G^-1 - step_size*B_hat)",
                       f"step_size={e:g}; B_hat too large for this step size")


def sgrhmc_init(
    position: ArrayLike,
    rng_key: Optional[PRNGKey] = None,
    momentum: Optional[ArrayLike] = None,
    inv_metric_fn: Optional[Callable] = None,
    step_size: Optional[StepSize] = None,
    B_hat: Optional[MatrixFn] = None,
) -> SGRHMCState:
    """Start SGRHMC at ``θ = position: (d,)``.

    Momentum: ``r = 0`` by default (deterministic, like a fresh HMC chain at
    rest); ``r ~ N(0, I_d)``, the exact stationary law of ``r`` under
    ``H = U(θ) + ½ rᵀr``, when ``rng_key`` is given; or ``momentum`` as given.
    With ``inv_metric_fn`` (and ``step_size``, ``B_hat``) the metric and the
    noise covariance are checked at the initial point (``ValueError`` if not PSD).
    """
    theta = check_position(position)
    if theta.ndim != 1:
        raise ValueError(f"position must be a vector of shape (d,); got shape {tuple(theta.shape)}.")
    r = _initial_momentum(theta, momentum, rng_key)
    step = jnp.zeros((), jnp.int32)
    if inv_metric_fn is not None:
        _check_callable(inv_metric_fn, "inv_metric_fn", "theta -> G(theta)^-1 ((d, d) or (d,))")
        eps = None if step_size is None else _step_size_at(step_size, step, theta.dtype)
        _check_sgrhmc_inputs(theta, inv_metric_fn, B_hat, eps)
    return SGRHMCState(theta, r, step)


def sgrhmc_step(
    rng_key: PRNGKey,
    state: SGRHMCState,
    grad_estimator: GradEstimator,
    step_size: StepSize,
    inv_metric_fn: Callable,
    B_hat: Optional[MatrixFn] = None,
    naive: bool = False,
) -> tuple[SGRHMCState, SGRHMCInfo]:
    """One SGRHMC step (spec section 6), one chain, ``z = (θ, r)``, ``H = U(θ) + ½ rᵀr``:

        θ' = θ + ε G^{-1/2} r
        r' = r - ε G^{-1/2} ∇Ũ(θ) + ε Γ_r(θ) - ε G^{-1} r + N(0, ε(2 G^{-1} - ε B̂))
        Γ_r,i = Σ_j ∂_{θ_j} (G(θ)^{-1/2})_ij                         (by jax.jacfwd)

    all evaluated at ``θ = θ_t`` (explicit Euler). This is the complete
    recipe with ``D = [[0, 0], [0, G^{-1}]]`` and
    ``Q = [[0, -G^{-1/2}], [G^{-1/2}, 0]]`` (:func:`sgrhmc_dq`), written
    block-wise so the noise lives in ``r`` only.

    Args:
      rng_key: split into ``(key_grad, key_noise)``; ``ξ ~ N(0, I_d)`` from
        ``key_noise`` in ``θ.dtype``.
      grad_estimator: ``(rng_key, θ) -> ∇Ũ(θ): (d,)``, gradient of the potential.
      step_size: ``ε > 0`` or a schedule ``t -> ε_t``.
      inv_metric_fn: ``θ -> G(θ)^{-1}``, a (d, d) SPD matrix (root by
        :func:`psd_sqrt`) or a (d,) diagonal (root by ``sqrt``).
      B_hat: ``None`` (0), a scalar, (d,), (d, d), or ``θ -> `` one of these:
        the ``r``-block gradient-noise covariance entering the dynamics. For
        ``∇Ũ = ∇U + ν``, ``Cov ν = V``: ``B̂ = G^{-1/2} V G^{-1/2}`` (e.g.
        ``lambda θ: V * inv_metric_fn(θ)`` for scalar ``V`` and a diagonal metric).
      naive: drop ``Γ_r`` ("naive SGRHMC"). It samples the wrong
        distribution; provided only to show the difference.
    """
    _check_callable(grad_estimator, "grad_estimator", "(rng_key, theta) -> gradient of U at theta")
    _check_callable(inv_metric_fn, "inv_metric_fn", "theta -> G(theta)^-1 ((d, d) or (d,))")
    theta, r = state.position, state.momentum
    eps = _step_size_at(step_size, state.step, theta.dtype)
    _check_sgrhmc_inputs(theta, inv_metric_fn, B_hat, eps)
    key_grad, key_noise = jax.random.split(rng_key)
    grad = jnp.asarray(grad_estimator(key_grad, theta), theta.dtype)
    theta_mean, r_mean, root, clipped, gamma = _sgrhmc_mean_and_root(theta, r, grad, eps, inv_metric_fn, B_hat, naive)
    xi = jax.random.normal(key_noise, theta.shape, dtype=theta.dtype)
    new_theta = theta_mean
    new_r = r_mean + _matvec(root, xi)
    info = SGRHMCInfo(
        grad_evals=jnp.asarray(1, jnp.int32),
        diverged=~(jnp.all(jnp.isfinite(new_theta)) & jnp.all(jnp.isfinite(new_r))),
        step_size=eps,
        noise_clipped=clipped,
        gamma_norm=jnp.linalg.norm(gamma),
    )
    return SGRHMCState(new_theta, new_r, state.step + 1), info


def sgrhmc_dq(inv_metric_fn: Callable) -> tuple[Callable, Callable]:
    """The section-6 recipe matrices as callables of ``z = (θ, r): (2d,)``:
    ``D(z) = [[0, 0], [0, G^{-1}]]``, ``Q(z) = [[0, -G^{-1/2}], [G^{-1/2}, 0]]``.

    With these, :func:`recipe_step` is SGRHMC (slower: its ``Γ`` differentiates
    ``2d × 2d`` matrices in ``2d`` directions); :func:`sgrhmc_step` is the fast form.
    """

    def blocks(z):
        d = z.shape[0] // 2
        half, g = _sqrt_inv_metric(inv_metric_fn, z[:d])
        half = jnp.diag(half) if half.ndim == 1 else half
        g = jnp.diag(g) if g.ndim == 1 else g
        return d, half, g

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
    inv_metric_fn: Callable,
    B_hat: Optional[MatrixFn] = None,
    naive: bool = False,
) -> SGMCMC:
    """SGRHMC as an :class:`SGMCMC` pair: ``init(position, rng_key=None, momentum=None)``
    and ``step(rng_key, state)`` wrapping :func:`sgrhmc_init` / :func:`sgrhmc_step`."""
    _check_callable(grad_estimator, "grad_estimator", "(rng_key, theta) -> gradient of U at theta")
    _check_callable(inv_metric_fn, "inv_metric_fn", "theta -> G(theta)^-1 ((d, d) or (d,))")
    check_positive(step_size, "step_size")

    def init(position, rng_key=None, momentum=None):
        return sgrhmc_init(position, rng_key, momentum, inv_metric_fn, step_size, B_hat)

    def step(rng_key, state):
        return sgrhmc_step(rng_key, state, grad_estimator, step_size, inv_metric_fn, B_hat, naive)

    return SGMCMC(init, step, lambda state: state.position)


def gsgrhmc_inv_metric(potential_fn: Callable[[Array], Array], D: float = 1.5, C: float = 0.5) -> Callable:
    """The paper's gSGRHMC metric (spec 6): ``G(θ)^{-1} = D·sqrt(|U(θ) + C|)·I``, as a (d,) diagonal.

    potential_fn: ``θ -> U(θ)`` (scalar; ``-logdensity_fn`` up to a constant;
    the paper uses the minibatch ``Ũ``, here any deterministic potential).
    Larger ``U`` (lower density) gives larger ``D, Q``: faster moves in the
    tails, more accuracy near the modes. Where ``U + C`` changes sign
    (``U = θ⁴ - 2θ²``, ``C = 0.5``) ``G^{-1/2} ∝ |U + C|^{1/4}`` has an infinite
    derivative and ``Γ_r`` is singular.
    """
    _check_callable(potential_fn, "potential_fn", "theta -> U(theta) (scalar)")
    check_positive(D, "D")
    if not (isinstance(C, (int, float, np.floating)) and math.isfinite(float(C))):
        raise ValueError(f"C must be a finite number; got {C!r}.")

    def inv_metric_fn(theta):
        u = jnp.asarray(potential_fn(theta), theta.dtype)
        return jnp.full(theta.shape, D, theta.dtype) * jnp.sqrt(jnp.abs(u + C))

    return inv_metric_fn
