"""Models to sample.

Demo targets with exact moments, inverse problems, posteriordb, NumPyro, LDA.

* :mod:`~cenlmc_jax.models.targets`: test and demo targets with known moments;
* :mod:`~cenlmc_jax.models.inverse_problems`: simulator-based posteriors (SIR
  epidemic, Darcy flow, ...) with references they cannot fake;
* :mod:`~cenlmc_jax.models.posteriordb`: posteriordb models transcribed from
  their Stan code, with the reference draws;
* :mod:`~cenlmc_jax.models.numpyro`: :func:`from_numpyro`, a NumPyro model's
  unconstrained log density;
* :mod:`~cenlmc_jax.models.lda`: online latent Dirichlet allocation (paper 2,
  appendix F.2) for the stochastic-gradient samplers.
"""

from cenlmc_jax.models import inverse_problems, lda, posteriordb, targets
from cenlmc_jax.models.numpyro import NumPyroModel, from_numpyro

__all__ = [
    "targets",
    "inverse_problems",
    "posteriordb",
    "lda",
    "NumPyroModel",
    "from_numpyro",
]
