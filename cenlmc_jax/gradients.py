"""Gradient estimators for the stochastic-gradient samplers (spec section 6).

A gradient estimator is a pure function

    grad_estimator(rng_key, theta) -> ∇Ũ(theta)        theta: (d,) -> (d,)

returning an (unbiased) estimate of the gradient of the **log density**
``∇log π`` (the sign BlackJAX uses; the potential ``U = -log π`` appears
only where a formula needs it, as ``potential_fn``).
Everything here is jittable and vmaps over chains; the minibatch is drawn
inside the step from the key, so the data stay on the device and nothing
returns to Python between steps.

- :func:`grad_estimator_from_grad`: a deterministic ``grad_fn(θ) = ∇log π(θ)``.
- :func:`grad_estimator_from_logdensity`: ``∇ logdensity_fn`` (full gradient).
- :func:`noisy_grad_estimator`: ``∇log π + N(0, noise_sd² I)`` (paper 2's synthetic experiment).
- :func:`minibatch_grad_estimator`:
  ``g̃(θ) = ∇log prior(θ) + (n/|B|) Σ_{i∈B} ∇log lik(x_i | θ)``.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from cenlmc_jax._validation import check_bool, check_callable, check_int, check_positive
from cenlmc_jax.types import Array, GradEstimator, PyTree

__all__ = [
    "grad_estimator_from_grad",
    "grad_estimator_from_logdensity",
    "noisy_grad_estimator",
    "minibatch_grad_estimator",
]

def grad_estimator_from_grad(grad_fn: Callable[[Array], Array]) -> GradEstimator:
    """Adapter: a deterministic ``grad_fn(θ) = ∇log π(θ)`` as an estimator (the key is ignored)."""
    check_callable(grad_fn, "grad_fn", "theta -> gradient of the log density at theta")

    def grad_estimator(rng_key, theta):
        del rng_key  # exact gradient: no randomness
        return jnp.asarray(grad_fn(theta), theta.dtype)

    return grad_estimator


def grad_estimator_from_logdensity(logdensity_fn: Callable[[Array], Array]) -> GradEstimator:
    """The full gradient of ``logdensity_fn``: ``(key, θ) -> ∇ logdensity_fn(θ)``."""
    check_callable(logdensity_fn, "logdensity_fn", "theta -> scalar log density")
    grad = jax.grad(logdensity_fn)

    def grad_estimator(rng_key, theta):
        del rng_key
        return grad(theta).astype(theta.dtype)

    return grad_estimator


def noisy_grad_estimator(grad_fn: Callable[[Array], Array], noise_sd: float) -> GradEstimator:
    """``g̃(θ) = grad_fn(θ) + noise_sd · ν``, ``ν ~ N(0, I_d)`` drawn in ``θ.dtype``.

    The stochastic gradient of paper 2's synthetic experiment (true gradient
    plus Gaussian noise): unbiased, ``Cov = noise_sd² I``, so the matching
    ``B̂`` of SGRHMC is ``noise_sd² · G^{-1}(θ)`` for a diagonal metric.
    ``grad_fn(θ) = ∇log π(θ)``.
    """
    check_callable(grad_fn, "grad_fn", "theta -> gradient of the log density at theta")
    check_positive(noise_sd, "noise_sd", allow_zero=True)

    def grad_estimator(rng_key, theta):
        g = jnp.asarray(grad_fn(theta), theta.dtype)
        return g + jnp.asarray(noise_sd, theta.dtype) * jax.random.normal(rng_key, g.shape, dtype=theta.dtype)

    return grad_estimator


def _num_data(data: PyTree) -> int:
    leaves = jax.tree_util.tree_leaves(data)
    if not leaves:
        raise ValueError("data must be an array or a pytree of arrays with a leading axis n; got no arrays.")
    sizes = {np.shape(leaf)[0] if np.ndim(leaf) > 0 else None for leaf in leaves}
    if None in sizes or len(sizes) != 1:
        shapes = [tuple(np.shape(leaf)) for leaf in leaves]
        raise ValueError(f"every array in data must share the leading axis n (one row per data point); got shapes {shapes}.")
    return sizes.pop()


def minibatch_grad_estimator(
    logprior_fn: Callable[[Array], Array],
    loglik_fn: Callable[..., Array],
    data: PyTree,
    batch_size: int,
    *,
    replace: bool = False,
) -> GradEstimator:
    """Minibatch estimate of the gradient of ``log π(θ) = log p(θ) + Σ_{i=1}^n log p(x_i | θ)``:

        g̃(θ) = ∇log p(θ) + (n / |B|) Σ_{i∈B} ∇_θ log p(x_i | θ)          (spec 6)

    Args:
      logprior_fn: ``θ -> log p(θ)`` (scalar).
      loglik_fn: ``(θ, *data_point) -> log p(x_i | θ)`` (scalar) for one data
        point; if ``data`` is a tuple or list its entries are passed as
        separate arguments (``loglik_fn(θ, x_i, y_i)`` for ``data = (x, y)``),
        otherwise the one point is passed as one argument.
      data: an array or a pytree of arrays sharing the leading axis ``n``;
        moved to the device once, here.
      batch_size: ``|B|``, a static integer in ``[1, n]``.
      replace: ``False`` (default): ``B`` is a uniformly random subset
        (``jax.random.choice`` without replacement; O(n) work per draw).
        ``True``: ``|B|`` independent uniform indices (O(|B|)), also unbiased.

    Returns ``grad_estimator(rng_key, θ) -> (d,)``, unbiased for ``∇log π(θ)``:
    each index is in ``B`` with probability ``|B|/n`` (expected count ``|B|/n``
    with replacement). With ``batch_size = n`` and ``replace=False`` it is the
    exact full gradient.
    """
    check_callable(logprior_fn, "logprior_fn", "theta -> scalar log prior")
    check_callable(loglik_fn, "loglik_fn", "(theta, *data_point) -> scalar log likelihood")
    check_bool(replace, "replace")
    n = _num_data(data)
    batch_size = check_int(batch_size, "batch_size", minimum=1, maximum=n)
    data = jax.tree_util.tree_map(jnp.asarray, data)  # one transfer to the device
    unpack = isinstance(data, (tuple, list))

    def one_loglik(theta, point):
        return loglik_fn(theta, *point) if unpack else loglik_fn(theta, point)

    grad_lik = jax.grad(one_loglik)
    grad_prior = jax.grad(logprior_fn)

    def grad_estimator(rng_key, theta):
        idx = jax.random.choice(rng_key, n, (batch_size,), replace=bool(replace))
        batch = jax.tree_util.tree_map(lambda a: jnp.take(a, idx, axis=0), data)
        per_point = jax.vmap(grad_lik, in_axes=(None, 0))(theta, batch)
        scale = jnp.asarray(n / batch_size, theta.dtype)
        g = grad_prior(theta) + scale * jnp.sum(per_point, axis=0)
        return g.astype(theta.dtype)

    return grad_estimator
