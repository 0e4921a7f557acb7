"""The complete recipe for stochastic-gradient MCMC.

Ma, Chen & Fox; docs/algorithms.md §5-6.

:mod:`~cenlmc_jax.sgmcmc.recipe`: the recipe step for any ``D``, ``Q`` and
SGLD / SGRLD / SGHMC as choices of them; :mod:`~cenlmc_jax.sgmcmc.sgrhmc`:
stochastic-gradient Riemann HMC and the paper's gSGRHMC metric. The sampler
objects are ``cj.complete_recipe``, ``cj.sgld``, ``cj.sgrld``, ``cj.sghmc`` and
``cj.sgrhmc``; the online-LDA model of appendix F.2 is :mod:`cenlmc_jax.models.lda`.
"""

from cenlmc_jax.sgmcmc.recipe import (
    RecipeInfo,
    RecipeState,
    SGHMCState,
    recipe_init,
    recipe_step,
    sghmc_init,
    sghmc_step,
)
from cenlmc_jax.sgmcmc.sgrhmc import (
    SGRHMCInfo,
    SGRHMCState,
    gsgrhmc_inv_metric,
    sgrhmc_init,
    sgrhmc_step,
)

__all__ = [
    "RecipeState",
    "RecipeInfo",
    "recipe_init",
    "recipe_step",
    "SGHMCState",
    "sghmc_init",
    "sghmc_step",
    "SGRHMCState",
    "SGRHMCInfo",
    "sgrhmc_init",
    "sgrhmc_step",
    "gsgrhmc_inv_metric",
]
