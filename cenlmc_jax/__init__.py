"""cenlmc_jax: ensemble, constrained-ensemble and irreversible Langevin samplers in JAX.

Every sampler is a constructor returning a :class:`SamplingAlgorithm`
``(init, step)`` (the BlackJAX shape); ``sample`` drives it with ``lax.scan``:

    algo = cj.cenlmc(logdensity_fn, step_size=0.05, eta=0.3, r1=0.5, r2=0.3, n_star=20, m_f=10.0)
    state = algo.init(positions)                      # positions: (N, d)
    result = cj.sample(key, algo, state, num_steps=1000)

Paper 1 (Ding & Li): ``lmc``, ``enlmc``, ``cenlmc`` on an ensemble
``positions: (N, d)``. Paper 2 (Ma, Fox, Chen, Wu): the complete recipe
(``complete_recipe``; ``sgld``, ``sgrld``, ``sghmc``), ``sgrhmc``, and
``irreversible_mh`` with Gamma and SDE proposals; ``rwmh`` is the reversible
baseline. The free functions ``X_init`` / ``X_step`` are the kernels underneath.
"""

from cenlmc_jax import (
    adaptation,
    checkpoint,
    diagnostics,
    ensemble,
    gradients,
    irreversible,
    pairwise,
    plots,
    posteriordb,
    problems,
    sgmcmc,
    targets,
    tuning,
)
from cenlmc_jax._host import fetch as to_host
from cenlmc_jax.base import SamplingAlgorithm, StepSize
from cenlmc_jax.diagnostics.convergence import ConvergenceWarning
from cenlmc_jax.ensemble import (
    CEnLMCInfo,
    CEnLMCState,
    EnLMCInfo,
    EnLMCState,
    EnsembleOptions,
    TunedCEnLMC,
    cenlmc,
    cenlmc_init,
    cenlmc_step,
    coupling_distance,
    enlmc,
    enlmc_init,
    enlmc_step,
    tune_cenlmc,
)
from cenlmc_jax.finite_difference import finite_difference
from cenlmc_jax.gradients import (
    grad_estimator_from_grad,
    grad_estimator_from_logdensity,
    minibatch_grad_estimator,
    noisy_grad_estimator,
)
from cenlmc_jax.irreversible import (
    IrreversibleMHInfo,
    IrreversibleMHState,
    Proposal,
    RWMHInfo,
    RWMHState,
    SDEPoint,
    coordinatewise_proposal,
    gamma_proposal,
    irreversible_mh,
    irreversible_mh_init,
    irreversible_mh_step,
    rwmh,
    rwmh_init,
    rwmh_step,
    sde_proposal,
)
from cenlmc_jax.langevin import LMCInfo, LMCState, lmc, lmc_init, lmc_step
from cenlmc_jax.langevin_adaptation import LangevinWarmup, LangevinWarmupInfo, langevin_warmup
from cenlmc_jax.numpyro_model import NumPyroModel, from_numpyro
from cenlmc_jax.preconditioning import WhitenedState, Whitening, whitened
from cenlmc_jax.run import Moments, RunResult, sample, vmap_chains
from cenlmc_jax.sgmcmc.recipe import (
    RecipeInfo,
    RecipeState,
    SGHMCState,
    complete_recipe,
    recipe_init,
    recipe_step,
    sghmc,
    sghmc_init,
    sghmc_step,
    sgld,
    sgrld,
)
from cenlmc_jax.sgmcmc.sgrhmc import (
    SGRHMCInfo,
    SGRHMCState,
    gsgrhmc_inv_metric,
    sgrhmc,
    sgrhmc_init,
    sgrhmc_step,
)
from cenlmc_jax.summary import SummaryTable, summary, to_arviz

__version__ = "0.1.0"

#: Every sampler constructor, by the name users call: ``cj.SAMPLERS["cenlmc"] is cj.cenlmc``.
SAMPLERS = {
    "lmc": lmc,
    "enlmc": enlmc,
    "cenlmc": cenlmc,
    "complete_recipe": complete_recipe,
    "sgld": sgld,
    "sgrld": sgrld,
    "sghmc": sghmc,
    "sgrhmc": sgrhmc,
    "irreversible_mh": irreversible_mh,
    "rwmh": rwmh,
}

__all__ = [
    "diagnostics",
    "ensemble",
    "gradients",
    "irreversible",
    "pairwise",
    "sgmcmc",
    "targets",
    "tuning",
    "problems",
    "posteriordb",
    "from_numpyro",
    "whitened",
    "langevin_warmup",
    "LangevinWarmup",
    "LangevinWarmupInfo",
    "Whitening",
    "WhitenedState",
    "ConvergenceWarning",
    "to_host",
    "NumPyroModel",
    "SamplingAlgorithm",
    "StepSize",
    "SAMPLERS",
    "checkpoint",
    "tune_cenlmc",
    "TunedCEnLMC",
    "EnsembleOptions",
    "finite_difference",
    "lmc",
    "enlmc",
    "cenlmc",
    "sgld",
    "sgrld",
    "sghmc",
    "sgrhmc",
    "complete_recipe",
    "irreversible_mh",
    "rwmh",
    "LMCState",
    "LMCInfo",
    "lmc_init",
    "lmc_step",
    "EnLMCState",
    "EnLMCInfo",
    "enlmc_init",
    "enlmc_step",
    "CEnLMCState",
    "CEnLMCInfo",
    "cenlmc_init",
    "cenlmc_step",
    "coupling_distance",
    "sample",
    "RunResult",
    "Moments",
    "vmap_chains",
    "summary",
    "to_arviz",
    "SummaryTable",
    "plots",
    "RecipeState",
    "RecipeInfo",
    "recipe_init",
    "recipe_step",
    "SGHMCState",
    "SGRHMCState",
    "SGRHMCInfo",
    "sgrhmc_init",
    "sgrhmc_step",
    "gsgrhmc_inv_metric",
    "grad_estimator_from_grad",
    "grad_estimator_from_logdensity",
    "minibatch_grad_estimator",
    "noisy_grad_estimator",
    "Proposal",
    "IrreversibleMHState",
    "IrreversibleMHInfo",
    "irreversible_mh_init",
    "irreversible_mh_step",
    "coordinatewise_proposal",
    "gamma_proposal",
    "sde_proposal",
    "RWMHState",
    "RWMHInfo",
    "rwmh_init",
    "rwmh_step",
    "adaptation",
    "SDEPoint",
    "sghmc_init",
    "sghmc_step",
]
