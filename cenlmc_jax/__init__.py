"""cenlmc_jax: ensemble, constrained-ensemble and irreversible Langevin samplers in JAX.

Paper 1 (Ding & Li): ``lmc_step``, ``enlmc_step``, ``cenlmc_step`` on an
ensemble ``positions: (N, d)``. Paper 2 (Ma, Fox, Chen, Wu): the complete
recipe (``recipe_step``; ``sgld``, ``sgrld``, ``sghmc``, ``sgrhmc``),
``sgrhmc_step``, ``irreversible_mh_step`` with Gamma and SDE proposals.
``sample`` drives any step with ``lax.scan``.
"""

from cenlmc_jax import diagnostics, gradients, irreversible, recipe, targets, tuning
from cenlmc_jax.cenlmc import (
    CEnLMCInfo,
    CEnLMCState,
    EnLMCInfo,
    EnLMCState,
    cenlmc_init,
    cenlmc_step,
    coupling_distance,
    enlmc_init,
    enlmc_step,
)
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
    coordinatewise_proposal,
    gamma_proposal,
    irreversible_mh_init,
    irreversible_mh_step,
    rwmh_init,
    rwmh_step,
    sde_proposal,
)
from cenlmc_jax.langevin import LMCInfo, LMCState, lmc_init, lmc_step
from cenlmc_jax.recipe import (
    SGMCMC,
    RecipeInfo,
    RecipeState,
    SGRHMCInfo,
    SGRHMCState,
    gsgrhmc_inv_metric,
    recipe_init,
    recipe_step,
    sghmc,
    sgld,
    sgrhmc,
    sgrhmc_init,
    sgrhmc_step,
    sgrld,
)
from cenlmc_jax.run import Moments, RunResult, sample, vmap_chains

__version__ = "0.1.0"

__all__ = [
    "diagnostics", "gradients", "irreversible", "recipe", "targets", "tuning",
    "EnLMCState", "EnLMCInfo", "enlmc_init", "enlmc_step",
    "CEnLMCState", "CEnLMCInfo", "cenlmc_init", "cenlmc_step", "coupling_distance",
    "LMCState", "LMCInfo", "lmc_init", "lmc_step",
    "sample", "RunResult", "Moments", "vmap_chains",
    "RecipeState", "RecipeInfo", "recipe_init", "recipe_step", "SGMCMC", "sgld", "sgrld", "sghmc", "sgrhmc",
    "SGRHMCState", "SGRHMCInfo", "sgrhmc_init", "sgrhmc_step", "gsgrhmc_inv_metric",
    "grad_estimator_from_grad", "grad_estimator_from_logdensity", "minibatch_grad_estimator", "noisy_grad_estimator",
    "Proposal", "IrreversibleMHState", "IrreversibleMHInfo", "irreversible_mh_init", "irreversible_mh_step",
    "coordinatewise_proposal", "gamma_proposal", "sde_proposal", "RWMHState", "RWMHInfo", "rwmh_init", "rwmh_step",
]
