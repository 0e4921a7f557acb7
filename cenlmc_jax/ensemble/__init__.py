"""Ensemble Langevin Monte Carlo (Ding & Li): EnLMC and constrained EnLMC.

Modules, along their seams:

* :mod:`~cenlmc_jax.ensemble.samplers`: EnLMC (Algorithm 3.1) and CEnLMC
  (Algorithm 3.2): ``*_init``, ``*_step`` and the sampler objects;
* :mod:`~cenlmc_jax.ensemble.states`: their states and infos;
* :mod:`~cenlmc_jax.ensemble.options`: :class:`EnsembleOptions`, how a step is computed;
* :mod:`~cenlmc_jax.ensemble.buffers`: the true gradients at only the particles that need one;
* :mod:`~cenlmc_jax.ensemble.audit`: the gradient audit (EnLMC's ``info.unstable``, ``info.biased``);
* :mod:`~cenlmc_jax.ensemble.coupling`: the coupling with LMC of Theorem 3.3;
* :mod:`~cenlmc_jax.ensemble.tuning`: :func:`tune_cenlmc`, a burn-in that picks the radii.
"""

from cenlmc_jax.ensemble.audit import (
    AUDIT_BIAS_MIN_STEPS,
    AUDIT_BIAS_THRESHOLD,
    AUDIT_BIAS_WEIGHT,
    AUDIT_DRIFT_BIAS_THRESHOLD,
    AUDIT_EMA_WEIGHT,
    AUDIT_MIN_STEPS,
    AUDIT_UNSTABLE_RATIO,
    CENLMC_AUDIT_SIZE,
    Audit,
    fresh_audit,
)
from cenlmc_jax.ensemble.buffers import GRAD_BUCKETS
from cenlmc_jax.ensemble.coupling import coupling_distance
from cenlmc_jax.ensemble.options import EnsembleOptions, ensemble_options
from cenlmc_jax.ensemble.samplers import (
    ENLMC_AUDIT_SIZE,
    CEnLMCInfo,
    CEnLMCState,
    EnLMCInfo,
    EnLMCState,
    cenlmc,
    cenlmc_init,
    cenlmc_step,
    enlmc,
    enlmc_init,
    enlmc_step,
    log_gaussian_step_density,
)
from cenlmc_jax.ensemble.tuning import TunedCEnLMC, tune_cenlmc

__all__ = [
    "EnLMCState", "EnLMCInfo", "enlmc_init", "enlmc_step", "enlmc",
    "CEnLMCState", "CEnLMCInfo", "cenlmc_init", "cenlmc_step", "cenlmc",
    "coupling_distance", "EnsembleOptions", "ensemble_options", "Audit", "fresh_audit",
    "TunedCEnLMC", "tune_cenlmc", "log_gaussian_step_density", "GRAD_BUCKETS", "ENLMC_AUDIT_SIZE",
    "AUDIT_EMA_WEIGHT", "AUDIT_UNSTABLE_RATIO", "AUDIT_MIN_STEPS", "CENLMC_AUDIT_SIZE", "AUDIT_BIAS_WEIGHT",
    "AUDIT_BIAS_THRESHOLD", "AUDIT_BIAS_MIN_STEPS", "AUDIT_DRIFT_BIAS_THRESHOLD",
]
