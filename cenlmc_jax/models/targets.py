"""Test and demo targets with what is known about them exactly.

Each constructor returns a :class:`Target`: ``logdensity_fn(x)`` for one
point ``x: (d,)`` (normalised where the normaliser is known), the dimension,
and the known quantities: ``mean: (d,)``, ``cov: (d, d)``,
``f_star = -max_x logdensity_fn(x)`` (the papers' ``min f``), and an exact
sampler ``sample(rng_key, n) -> (n, d)`` where one exists. Unknown entries are
``None``. These are the shared problems of the tests, benchmarks and CLI.

Scale and curvature, for choosing step sizes: with ``f = -log π``,
``mu I ⪯ ∇²f(x) ⪯ L I`` for every ``x`` (``L``: smoothness, the papers' L;
``mu``: strong convexity, the papers' μ), each ``None`` where no such global
bound exists (the banana and the double well have no finite ``L``; only the
Gaussians and the logistic regression are strongly convex). ``hessian`` is
``∇²f`` where it is constant (the Gaussians: the precision matrix), else
``None``; a target with a constant Hessian is Gaussian, so the stationary law
of unadjusted Langevin on it is known exactly.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import logsumexp

from cenlmc_jax._validation import check_int, check_positive

__all__ = [
    "Target",
    "gaussian",
    "standard_gaussian",
    "anisotropic_gaussian",
    "correlated_gaussian",
    "banana",
    "gaussian_mixture",
    "double_well",
    "logistic_regression",
    "get_target",
    "TARGETS",
]


class Target(NamedTuple):
    """A target density and what is known about it (``None`` when unknown).

    Attributes:
      name: the target's name.
      dim: the dimension ``d``.
      logdensity_fn: ``x: (d,) -> scalar`` log density.
      mean: the exact mean, ``(d,)``.
      cov: the exact covariance, ``(d, d)``.
      f_star: ``-max_x logdensity_fn(x)``.
      sample: an exact sampler ``(rng_key, n) -> (n, d)``.
      data: the data of a data-based target (e.g. for minibatching).
      L: global upper bound ``∇²f ⪯ L I`` of ``f = -logdensity_fn`` (see the
        module docstring).
      mu: global lower bound ``mu I ⪯ ∇²f``.
      hessian: ``∇²f: (d, d)`` where it is constant.
    """

    name: str
    dim: int
    logdensity_fn: Callable
    mean: np.ndarray | None
    cov: np.ndarray | None
    f_star: float | None
    sample: Callable | None
    data: dict | None = None
    L: float | None = None
    mu: float | None = None
    hessian: np.ndarray | None = None


def gaussian(mean: Any, cov: Any, name: str = "gaussian") -> Target:
    """N(mean, cov) for a symmetric positive definite ``cov: (d, d)``.

    ``∇²f = cov⁻¹`` everywhere: ``L = λ_max(cov⁻¹)``, ``mu = λ_min(cov⁻¹)``.

    Args:
      mean: the mean, shape ``(d,)``.
      cov: the covariance, shape ``(d, d)``, symmetric positive definite.
      name: the target's name.

    Returns:
      The :class:`Target` with every entry known.

    Raises:
      ValueError: ``cov`` of another shape, or not symmetric positive definite.
    """
    mean = np.asarray(mean, dtype=np.float64)
    cov = np.asarray(cov, dtype=np.float64)
    if mean.ndim != 1 or cov.shape != (mean.size, mean.size):
        raise ValueError(
            f"cov must have shape (d, d) = {(mean.size, mean.size)} for mean of shape "
            f"{mean.shape}; got {cov.shape}."
        )
    if not np.allclose(cov, cov.T) or np.linalg.eigvalsh(cov).min() <= 0:
        raise ValueError(
            "cov must be symmetric positive definite; its smallest eigenvalue is "
            f"{np.linalg.eigvalsh((cov + cov.T) / 2).min():.3g}."
        )
    d = mean.size
    chol = np.linalg.cholesky(cov)
    prec = np.linalg.inv(cov)
    log_norm = -0.5 * d * math.log(2 * math.pi) - np.sum(np.log(np.diag(chol)))

    def logdensity_fn(x):
        dx = x - jnp.asarray(mean, x.dtype)
        return log_norm - 0.5 * dx @ (jnp.asarray(prec, x.dtype) @ dx)

    def sample(rng_key, n):
        z = jax.random.normal(rng_key, (n, d))
        return jnp.asarray(mean, z.dtype) + z @ jnp.asarray(chol.T, z.dtype)

    eig = np.linalg.eigvalsh(prec)
    return Target(
        name,
        d,
        logdensity_fn,
        mean,
        cov,
        float(-log_norm),
        sample,
        L=float(eig.max()),
        mu=float(eig.min()),
        hessian=prec,
    )


def standard_gaussian(dim: int = 2) -> Target:
    """N(0, I_d).

    Args:
      dim: the dimension ``d >= 1``.

    Returns:
      The :class:`Target` (:func:`gaussian`).
    """
    dim = check_int(dim, "dim", minimum=1)
    return gaussian(np.zeros(dim), np.eye(dim), name=f"standard_gaussian_{dim}d")


def anisotropic_gaussian(scales: Any = (1.0, 0.5)) -> Target:
    """N(0, diag(scales²)): coordinates with different scales.

    Args:
      scales: the standard deviations, a 1-D array of positive numbers.

    Returns:
      The :class:`Target` (:func:`gaussian`).

    Raises:
      ValueError: ``scales`` not a 1-D array of positive numbers.
    """
    scales = np.asarray(scales, dtype=np.float64)
    if scales.ndim != 1 or np.any(scales <= 0):
        raise ValueError(
            f"scales must be a 1-D array of positive numbers; got {scales}."
        )
    return gaussian(
        np.zeros(scales.size),
        np.diag(scales**2),
        name=f"anisotropic_gaussian_{scales.size}d",
    )


def correlated_gaussian(dim: int = 2, rho: float = 0.9) -> Target:
    """N(0, Σ) with unit variances and equal correlation ``rho``.

    Args:
      dim: the dimension ``d >= 2``.
      rho: the correlation, ``-1/(d-1) < rho < 1``.

    Returns:
      The :class:`Target` (:func:`gaussian`).

    Raises:
      ValueError: ``rho`` out of its range.
    """
    dim = check_int(dim, "dim", minimum=2)
    if not (-1.0 / (dim - 1) < rho < 1.0):
        raise ValueError(
            f"rho must lie in (-1/(dim-1), 1) = ({-1.0 / (dim - 1):.3g}, 1); got {rho}."
        )
    cov = np.full((dim, dim), rho) + (1 - rho) * np.eye(dim)
    return gaussian(np.zeros(dim), cov, name=f"correlated_gaussian_{dim}d_rho{rho:g}")


def banana(a: float = 1.0, b: float = 0.5) -> Target:
    """2-D banana: ``x1 ~ N(0, a²)``, ``x2 | x1 ~ N(b (x1² - a²), 1)``.

    Exact: mean 0, Var x1 = a², Var x2 = 1 + 2 b² a⁴, Cov = 0;
    max log density at (0, -b a²), so ``f_star = log(2π a)``.
    ``∂²f/∂x1² = 1/a² - 2b(x2 - b(x1² - a²)) + 4b²x1²`` is unbounded: no ``L``,
    and ``f`` is not convex: no ``mu``.

    Args:
      a: the scale of ``x1``, ``> 0``.
      b: the curvature of the banana.

    Returns:
      The :class:`Target` (exact mean, covariance, ``f_star`` and sampler).
    """
    check_positive(a, "a")
    log_norm = -math.log(2 * math.pi * a)

    def logdensity_fn(x):
        x1, x2 = x[0], x[1]
        return log_norm - 0.5 * (x1 / a) ** 2 - 0.5 * (x2 - b * (x1**2 - a**2)) ** 2

    def sample(rng_key, n):
        z = jax.random.normal(rng_key, (n, 2))
        x1 = a * z[:, 0]
        return jnp.stack([x1, b * (x1**2 - a**2) + z[:, 1]], axis=1)

    cov = np.diag([a**2, 1 + 2 * b**2 * a**4])
    return Target("banana", 2, logdensity_fn, np.zeros(2), cov, -log_norm, sample)


def gaussian_mixture(
    means: Any = ((-2.0, 0.0), (2.0, 0.0)), weights: Any = None, sd: float = 1.0
) -> Target:
    """Mixture ``Σ_k w_k N(μ_k, sd² I)``.

    Exact mean ``Σ w_k μ_k`` and covariance
    ``sd² I + Σ w_k μ_k μ_kᵀ - mean meanᵀ``. ``f_star`` is found by gradient
    ascent from every component mean (float64 NumPy, converged to 1e-12 in the
    gradient); it is exact up to that tolerance. ``∇²f = I/sd² - Cov_r(μ_k)/sd⁴``
    (``Cov_r``: covariance of the means under the responsibilities), so
    ``L = 1/sd²``; two or more components make ``f`` non-convex: no ``mu``.

    Args:
      means: the component means, shape ``(k, d)``.
      weights: ``k`` positive weights summing to 1 (default: equal).
      sd: the components' standard deviation, ``> 0``.

    Returns:
      The :class:`Target` (exact mean, covariance and sampler).

    Raises:
      ValueError: bad weights or ``sd``.
    """
    means = np.atleast_2d(np.asarray(means, dtype=np.float64))
    k, d = means.shape
    weights = (
        np.full(k, 1.0 / k)
        if weights is None
        else np.asarray(weights, dtype=np.float64)
    )
    if (
        weights.shape != (k,)
        or np.any(weights <= 0)
        or not np.isclose(weights.sum(), 1.0)
    ):
        raise ValueError(
            f"weights must be {k} positive numbers summing to 1; got {weights}."
        )
    check_positive(sd, "sd")
    log_w = np.log(weights)
    log_c = -0.5 * d * math.log(2 * math.pi * sd**2)

    def logdensity_fn(x):
        sq = jnp.sum((x[None, :] - jnp.asarray(means, x.dtype)) ** 2, axis=1)
        return logsumexp(jnp.asarray(log_w, x.dtype) + log_c - 0.5 * sq / sd**2)

    def np_logp_grad(x):
        sq = np.sum((x - means) ** 2, axis=1)
        a = log_w - 0.5 * sq / sd**2
        r = np.exp(a - a.max())
        r /= r.sum()
        return log_c + a.max() + np.log(np.sum(np.exp(a - a.max()))), -(
            r @ (x - means)
        ) / sd**2

    best = -np.inf
    # the modes lie near the component means
    for mu in means:
        x = mu.copy()
        for _ in range(10_000):
            _, g = np_logp_grad(x)
            x = x + sd**2 * g
            if np.max(np.abs(g)) < 1e-12:
                break
        best = max(best, np_logp_grad(x)[0])

    mean = weights @ means
    cov = sd**2 * np.eye(d) + (means.T * weights) @ means - np.outer(mean, mean)

    def sample(rng_key, n):
        k1, k2 = jax.random.split(rng_key)
        comp = jax.random.choice(k1, k, (n,), p=jnp.asarray(weights))
        return jnp.asarray(means)[comp] + sd * jax.random.normal(k2, (n, d))

    return Target(
        f"gaussian_mixture_{k}x{d}d",
        d,
        logdensity_fn,
        mean,
        cov,
        float(-best),
        sample,
        L=1.0 / sd**2,
        mu=1.0 / sd**2 if k == 1 else None,
    )


def double_well(scale: float = 1.0) -> Target:
    """1-D double well ``U(θ) = scale·(θ⁴ - 2θ²)``, ``p ∝ exp(-U)``.

    Paper 2's test target. Mean 0 by symmetry; variance and normaliser by
    trapezoidal quadrature on [-6, 6] with 200,001 points (tails beyond are
    below e^-1000). ``U'' = scale (12θ² - 4)`` is unbounded and negative near 0:
    no ``L``, no ``mu``.

    Args:
      scale: the scale of ``U``, ``> 0``.

    Returns:
      The :class:`Target` (no exact sampler).
    """
    check_positive(scale, "scale")
    grid = np.linspace(-6.0, 6.0, 200_001)
    u = scale * (grid**4 - 2 * grid**2)
    dens = np.exp(-(u - u.min()))
    z = np.trapezoid(dens, grid)
    var = np.trapezoid(grid**2 * dens, grid) / z
    log_z = math.log(z) - u.min()

    def logdensity_fn(x):
        t = x[0]
        return -scale * (t**4 - 2 * t**2) - log_z

    return Target(
        "double_well",
        1,
        logdensity_fn,
        np.zeros(1),
        np.array([[var]]),
        float(u.min() + log_z),
        None,
    )


def logistic_regression(
    num_data: int = 200, dim: int = 5, prior_scale: float = 1.0, seed: int = 0
) -> Target:
    """Bayesian logistic regression on synthetic data from a fixed seed.

    ``x_i ~ N(0, I_d)``, ``θ_true ~ N(0, I_d)``,
    ``y_i ~ Bernoulli(σ(x_iᵀθ_true))``, prior ``θ ~ N(0, prior_scale² I)``. The
    posterior moments are not known in closed form (``mean``/``cov`` are None);
    ``f_star`` is the negative
    log posterior at the MAP found by Newton's method (concave problem, to
    1e-10 in the gradient). ``data`` holds ``x``, ``y``, ``theta_true`` and
    ``loglik_fn(theta, x_i, y_i)``, ``logprior_fn(theta)`` for minibatching.
    ``∇²f = Xᵀ diag(σ'(Xθ)) X + I/prior_scale²`` with ``0 < σ' <= 1/4``, so
    ``L = λ_max(XᵀX)/4 + 1/prior_scale²`` and ``mu = 1/prior_scale²``.

    Args:
      num_data: the number of data points, ``>= 1``.
      dim: the dimension ``d >= 1``.
      prior_scale: the prior's standard deviation, ``> 0``.
      seed: the NumPy seed of the synthetic data.

    Returns:
      The :class:`Target` (``mean`` and ``cov`` None, ``data`` filled).
    """
    num_data = check_int(num_data, "num_data", minimum=1)
    dim = check_int(dim, "dim", minimum=1)
    check_positive(prior_scale, "prior_scale")
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((num_data, dim))
    theta_true = rng.standard_normal(dim)
    y = (rng.random(num_data) < 1 / (1 + np.exp(-x @ theta_true))).astype(np.float64)

    def loglik_fn(theta, xi, yi):
        z = xi @ theta
        return yi * z - jnp.logaddexp(0.0, z)

    def logprior_fn(theta):
        return -0.5 * jnp.sum(theta**2) / prior_scale**2 - 0.5 * theta.size * math.log(
            2 * math.pi * prior_scale**2
        )

    def logdensity_fn(theta):
        xs, ys = jnp.asarray(x, theta.dtype), jnp.asarray(y, theta.dtype)
        return logprior_fn(theta) + jnp.sum(loglik_fn(theta, xs, ys))

    theta = np.zeros(dim)
    # Newton's method on a strictly concave log posterior
    for _ in range(100):
        p = 1 / (1 + np.exp(-x @ theta))
        grad = x.T @ (y - p) - theta / prior_scale**2
        hess = -(x.T * (p * (1 - p))) @ x - np.eye(dim) / prior_scale**2
        theta = theta - np.linalg.solve(hess, grad)
        if np.max(np.abs(grad)) < 1e-10:
            break
    z = x @ theta
    log_post = (
        np.sum(y * z - np.logaddexp(0, z))
        - 0.5 * theta @ theta / prior_scale**2
        - 0.5 * dim * math.log(2 * math.pi * prior_scale**2)
    )
    data = dict(
        x=x,
        y=y,
        theta_true=theta_true,
        theta_map=theta,
        loglik_fn=loglik_fn,
        logprior_fn=logprior_fn,
    )
    lam_max = float(np.linalg.eigvalsh(x.T @ x).max())
    return Target(
        f"logistic_regression_{dim}d",
        dim,
        logdensity_fn,
        None,
        None,
        float(-log_post),
        None,
        data,
        L=lam_max / 4 + 1 / prior_scale**2,
        mu=1 / prior_scale**2,
    )


TARGETS = {
    "gaussian": lambda dim=2: standard_gaussian(dim),
    "correlated": lambda dim=2: correlated_gaussian(dim, 0.9),
    "anisotropic": lambda dim=2: anisotropic_gaussian(np.linspace(1.0, 0.25, dim)),
    "banana": lambda dim=2: banana(),
    "mixture": lambda dim=2: gaussian_mixture(),
    "double_well": lambda dim=1: double_well(),
    "logistic": lambda dim=5: logistic_regression(dim=dim),
}


def get_target(name: str, dim: int | None = None) -> Target:
    """A built-in target by name (see ``TARGETS``), with ``dim`` where it applies.

    Args:
      name: a key of ``TARGETS``.
      dim: the dimension, or ``None`` for the target's default.

    Returns:
      The :class:`Target`.

    Raises:
      ValueError: an unknown ``name``, or a ``dim`` the target's constructor
        refuses.
    """
    if name not in TARGETS:
        raise ValueError(f"target must be one of {sorted(TARGETS)}; got {name!r}.")
    return TARGETS[name]() if dim is None else TARGETS[name](dim)
