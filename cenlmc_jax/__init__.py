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

import importlib as _importlib
import importlib.util
import sys as _sys

from cenlmc_jax import _compat

#: Every public name -> the module that defines it (the namespaces: the module
#: itself). Importing the package imports none of them (nor JAX): a name is imported
#: the first time it is used (PEP 562), so ``import cenlmc_jax`` and the command's
#: ``--help`` cost no JAX start-up.
_LAZY = {
    "to_host": ("cenlmc_jax._host", "fetch"),
    "langevin_warmup": ("cenlmc_jax.adaptation", "langevin_warmup"),
    "window_adaptation": ("cenlmc_jax.adaptation", "window_adaptation"),
    "SamplingAlgorithm": ("cenlmc_jax.base", "SamplingAlgorithm"),
    "ConvergenceWarning": ("cenlmc_jax.diagnostics.convergence", "ConvergenceWarning"),
    "summary": ("cenlmc_jax.diagnostics.summary", "summary"),
    "sample_until": ("cenlmc_jax.run_until", "sample_until"),
    "to_arviz": ("cenlmc_jax.diagnostics.summary", "to_arviz"),
    "cenlmc": ("cenlmc_jax.ensemble.cenlmc", "cenlmc"),
    "enlmc": ("cenlmc_jax.ensemble.enlmc", "enlmc"),
    "ensemble_mala": ("cenlmc_jax.ensemble.ensemble_mala", "ensemble_mala"),
    "lmc": ("cenlmc_jax.ensemble.lmc", "lmc"),
    "EnsembleOptions": ("cenlmc_jax.ensemble.options", "EnsembleOptions"),
    "tune_cenlmc": ("cenlmc_jax.ensemble.tuning", "tune_cenlmc"),
    "whitened": ("cenlmc_jax.ensemble.whitened", "whitened"),
    "finite_difference": (
        "cenlmc_jax.gradients.finite_difference",
        "finite_difference",
    ),
    "irreversible_mh": ("cenlmc_jax.irreversible", "irreversible_mh"),
    "mala": ("cenlmc_jax.irreversible", "mala"),
    "hmc": ("cenlmc_jax.irreversible", "hmc"),
    "autostep_hmc": ("cenlmc_jax.irreversible", "autostep_hmc"),
    "rwmh": ("cenlmc_jax.irreversible", "rwmh"),
    "from_numpyro": ("cenlmc_jax.models.numpyro", "from_numpyro"),
    "RunResult": ("cenlmc_jax.run", "RunResult"),
    "sample": ("cenlmc_jax.run", "sample"),
    "vmap_chains": ("cenlmc_jax.run", "vmap_chains"),
    "complete_recipe": ("cenlmc_jax.sgmcmc.recipe", "complete_recipe"),
    "sghmc": ("cenlmc_jax.sgmcmc.recipe", "sghmc"),
    "sgld": ("cenlmc_jax.sgmcmc.recipe", "sgld"),
    "sgrld": ("cenlmc_jax.sgmcmc.recipe", "sgrld"),
    "sgrhmc": ("cenlmc_jax.sgmcmc.sgrhmc", "sgrhmc"),
    **{
        namespace: (f"cenlmc_jax.{namespace}", None)
        for namespace in (
            "adaptation",
            "diagnostics",
            "ensemble",
            "gradients",
            "irreversible",
            "models",
            "pairwise",
            "sgmcmc",
        )
    },
}

#: The names of :data:`SAMPLERS`, each the top-level constructor of that name.
_SAMPLER_NAMES = (
    "lmc",
    "enlmc",
    "cenlmc",
    "mala",
    "hmc",
    "autostep_hmc",
    "rwmh",
    "irreversible_mh",
    "complete_recipe",
    "sgld",
    "sgrld",
    "sghmc",
    "sgrhmc",
)

__version__ = "0.2.0"

__all__ = [
    # samplers: each returns a SamplingAlgorithm (init, step)
    *_SAMPLER_NAMES,
    # gradient-free and exact (two halves; not in SAMPLERS: its state is the whole
    # ensemble, not one chain per row)
    "ensemble_mala",
    "SAMPLERS",
    "SamplingAlgorithm",
    # running
    "sample",
    "sample_until",
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


class _Samplers(dict):
    """Every sampler constructor, by the name users call: ``cj.SAMPLERS["cenlmc"] is
    cj.cenlmc`` (a dict).
    """


def __getattr__(name):
    if name == "SAMPLERS":
        value = _Samplers({n: __getattr__(n) for n in _SAMPLER_NAMES})
    elif name in _LAZY:
        module, attr = _LAZY[name]
        value = _importlib.import_module(module)
        if attr is not None:
            value = getattr(value, attr)
    elif (
        name in _compat.OLD_NAMES
        or _importlib.util.find_spec(f"{__name__}.{name}") is None
    ):
        return _compat.old_name(name)
    else:
        value = _importlib.import_module(f"{__name__}.{name}")  # a module: cj.run
    globals()[name] = value
    return value


def __dir__():
    return sorted(__all__)


_sys.modules[__name__].__class__ = _compat.Package
_sys.meta_path.append(_compat.OldModuleFinder())
