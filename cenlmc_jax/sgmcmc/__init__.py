"""The complete recipe for stochastic-gradient MCMC (Ma, Chen & Fox; docs/algorithms.md §5-6).

:mod:`~cenlmc_jax.sgmcmc.recipe`: the recipe step for any ``D``, ``Q`` and
SGLD / SGRLD / SGHMC as choices of them; :mod:`~cenlmc_jax.sgmcmc.sgrhmc`:
stochastic-gradient Riemann HMC and the paper's gSGRHMC metric. The sampler
objects are re-exported at the top level (``cj.sgld``, ``cj.sgrhmc``, ...).
"""
