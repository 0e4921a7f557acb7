"""cenlmc_jax: ensemble, constrained-ensemble and irreversible Langevin samplers in JAX.

Every sampler is a constructor returning a :class:`SamplingAlgorithm`
``(init, step)`` (the BlackJAX shape); :func:`sample` drives it with ``lax.scan``::

    algo = cj.cenlmc(
        logdensity_fn, step_size=0.05, eta=0.3, r1=0.5, r2=0.3, n_star=20, m_f=10.0
    )
    state = algo.init(positions)                      # positions: (N, d)
    result = cj.sample(key, algo, state, num_steps=1000)

Paper 1 (Ding & Li): :func:`lmc`, :func:`enlmc`, :func:`cenlmc` on an ensemble
``positions: (N, d)``. Paper 2 (Ma, Fox, Chen, Wu): the complete recipe
(:func:`complete_recipe`; :func:`sgld`, :func:`sgrld`, :func:`sghmc`),
:func:`sgrhmc`, and :func:`irreversible_mh` with Gamma and SDE proposals;
:func:`mala` and :func:`rwmh` are the reversible baselines. The kernels
underneath (``X_init`` / ``X_step``), their states and infos live in the
namespaces ``ensemble``, ``irreversible`` and ``sgmcmc``.
"""

import sys as _sys

from cenlmc_jax import (
    _compat,
    adaptation,
    diagnostics,
    ensemble,
    gradients,
    irreversible,
    models,
    pairwise,
    sgmcmc,
)
from cenlmc_jax._host import fetch as to_host
from cenlmc_jax.adaptation import langevin_warmup, window_adaptation
from cenlmc_jax.base import SamplingAlgorithm
from cenlmc_jax.diagnostics.convergence import ConvergenceWarning
from cenlmc_jax.diagnostics.summary import summary, to_arviz
from cenlmc_jax.ensemble.cenlmc import cenlmc
from cenlmc_jax.ensemble.enlmc import enlmc
from cenlmc_jax.ensemble.lmc import lmc
from cenlmc_jax.ensemble.options import EnsembleOptions
from cenlmc_jax.ensemble.tuning import tune_cenlmc
from cenlmc_jax.ensemble.whitened import whitened
from cenlmc_jax.gradients.finite_difference import finite_difference
from cenlmc_jax.irreversible import irreversible_mh, mala, rwmh
from cenlmc_jax.models.numpyro import from_numpyro
from cenlmc_jax.run import RunResult, sample, vmap_chains
from cenlmc_jax.sgmcmc.recipe import complete_recipe, sghmc, sgld, sgrld
from cenlmc_jax.sgmcmc.sgrhmc import sgrhmc

__version__ = "0.2.0"

#: Every sampler constructor, by the name users call: ``cj.SAMPLERS["cenlmc"] is
#: cj.cenlmc``.
SAMPLERS = {
    "lmc": lmc,
    "enlmc": enlmc,
    "cenlmc": cenlmc,
    "mala": mala,
    "rwmh": rwmh,
    "irreversible_mh": irreversible_mh,
    "complete_recipe": complete_recipe,
    "sgld": sgld,
    "sgrld": sgrld,
    "sghmc": sghmc,
    "sgrhmc": sgrhmc,
}

__all__ = [
    # samplers: each returns a SamplingAlgorithm (init, step)
    "lmc",
    "enlmc",
    "cenlmc",
    "mala",
    "rwmh",
    "irreversible_mh",
    "complete_recipe",
    "sgld",
    "sgrld",
    "sghmc",
    "sgrhmc",
    "SAMPLERS",
    "SamplingAlgorithm",
    # running
    "sample",
    "vmap_chains",
    "RunResult",
    "to_host",
    # warm-ups and tuning
    "langevin_warmup",
    "window_adaptation",
    "tune_cenlmc",
    "whitened",
    # inputs
    "EnsembleOptions",
    "finite_difference",
    "from_numpyro",
    # results
    "summary",
    "to_arviz",
    "ConvergenceWarning",
    # namespaces
    "adaptation",
    "diagnostics",
    "ensemble",
    "gradients",
    "irreversible",
    "models",
    "pairwise",
    "sgmcmc",
]


def __getattr__(name):
    return _compat.old_name(name)


def __dir__():
    return sorted(__all__)


_sys.modules[__name__].__class__ = _compat.Package
_sys.meta_path.append(_compat.OldModuleFinder())
