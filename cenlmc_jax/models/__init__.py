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

import importlib as _importlib

from cenlmc_jax.models import targets
from cenlmc_jax.models.numpyro import NumPyroModel, from_numpyro

__all__ = [
    "targets",
    "inverse_problems",
    "posteriordb",
    "lda",
    "NumPyroModel",
    "from_numpyro",
]

#: Imported on first use (``cj.models.lda``, ``from cenlmc_jax.models import lda``):
#: the command line and a session that samples a built-in target need none of them.
_LAZY_MODULES = ("inverse_problems", "posteriordb", "lda")


def __getattr__(name):
    if name not in _LAZY_MODULES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = _importlib.import_module(f"{__name__}.{name}")
    globals()[name] = module
    return module


def __dir__():
    return sorted(__all__)
