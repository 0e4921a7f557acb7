"""Gradients: estimators for the SG-MCMC samplers, finite differences, autodiff modes.

* :mod:`~cenlmc_jax.gradients.estimators`: ``(rng_key, position) -> gradient``
  estimators (exact, noisy, minibatch) that the SG-MCMC samplers take;
* :mod:`~cenlmc_jax.gradients.finite_difference`: :func:`finite_difference`,
  gradients of a black-box model from its values (``grad_fn=``);
* :mod:`~cenlmc_jax.gradients.modes`: forward- or reverse-mode autodiff
  (``grad_mode=``);
* :mod:`~cenlmc_jax.gradients.ensemble`: the gradient a sampler takes (the user's
  ``grad_fn``, else autodiff), at one point or at every particle of an ensemble,
  and its cost in model solves.
"""

from cenlmc_jax.gradients.estimators import (
    flat_grad_estimator,
    flat_logdensity,
    floyd_subset,
    grad_estimator_from_grad,
    grad_estimator_from_logdensity,
    minibatch_grad_estimator,
    noisy_grad_estimator,
    ravel_position,
)
from cenlmc_jax.gradients.finite_difference import (
    FiniteDifferenceGrad,
    finite_difference,
)

__all__ = [
    "grad_estimator_from_grad",
    "grad_estimator_from_logdensity",
    "noisy_grad_estimator",
    "minibatch_grad_estimator",
    "floyd_subset",
    "ravel_position",
    "flat_logdensity",
    "flat_grad_estimator",
    "FiniteDifferenceGrad",
    "finite_difference",
]
