"""Ensemble Langevin samplers of paper 1 (Ding & Li), one module per algorithm.

* :mod:`~cenlmc_jax.ensemble.lmc`: Langevin Monte Carlo on an ensemble
  (``LMCState``, ``LMCInfo``, ``lmc_init``, ``lmc_step``; preconditioned by ``M``);
* :mod:`~cenlmc_jax.ensemble.enlmc`: EnLMC (Algorithm 3.1), neighbours' values
  replace the gradient (provably unstable);
* :mod:`~cenlmc_jax.ensemble.cenlmc`: CEnLMC (Algorithm 3.2), the ensemble
  estimate only where three tests pass;
* :mod:`~cenlmc_jax.ensemble.least_squares`: a local least-squares ensemble
  gradient (beyond the paper), with its Pallas kernel and moments;
* :mod:`~cenlmc_jax.ensemble.whitened`: any ensemble sampler in whitened
  coordinates ``y = L⁻¹(x − m)``;
* :mod:`~cenlmc_jax.ensemble.tuning` and :mod:`~cenlmc_jax.ensemble.f_star`:
  CEnLMC's parameters from theory, the burn-in tuner, and ``f*``;
* :mod:`~cenlmc_jax.ensemble.options`, :mod:`~cenlmc_jax.ensemble.buffers`,
  :mod:`~cenlmc_jax.ensemble.audit`, :mod:`~cenlmc_jax.ensemble.coupling`: how a
  step is computed, the gradient buffers, the gradient audit and Theorem 3.3's
  coupling with LMC.

The sampler constructors are ``cj.lmc``, ``cj.enlmc`` and ``cj.cenlmc``.
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
from cenlmc_jax.ensemble.cenlmc import CEnLMCInfo, CEnLMCState, cenlmc_init, cenlmc_step
from cenlmc_jax.ensemble.coupling import coupling_distance
from cenlmc_jax.ensemble.enlmc import (
    ENLMC_AUDIT_SIZE,
    EnLMCInfo,
    EnLMCState,
    enlmc_init,
    enlmc_step,
    log_gaussian_step_density,
)
from cenlmc_jax.ensemble.ensemble_mala import ensemble_mala as ensemble_mala
from cenlmc_jax.ensemble.f_star import FStarResult, find_f_star
from cenlmc_jax.ensemble.lmc import LMCInfo, LMCState, lmc_init, lmc_step
from cenlmc_jax.ensemble.options import EnsembleOptions, ensemble_options
from cenlmc_jax.ensemble.tuning import (
    CEnLMCParams,
    TunedCEnLMC,
    suggest_cenlmc_params,
    tune_cenlmc,
)
from cenlmc_jax.ensemble.whitened import WhitenedState, Whitening, whitened, whitening

__all__ = [
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
    "EnsembleOptions",
    "ensemble_options",
    "Audit",
    "fresh_audit",
    "TunedCEnLMC",
    "tune_cenlmc",
    "CEnLMCParams",
    "suggest_cenlmc_params",
    "FStarResult",
    "find_f_star",
    "Whitening",
    "WhitenedState",
    "whitened",
    "whitening",
    "log_gaussian_step_density",
    "GRAD_BUCKETS",
    "ENLMC_AUDIT_SIZE",
    "AUDIT_EMA_WEIGHT",
    "AUDIT_UNSTABLE_RATIO",
    "AUDIT_MIN_STEPS",
    "CENLMC_AUDIT_SIZE",
    "AUDIT_BIAS_WEIGHT",
    "AUDIT_BIAS_THRESHOLD",
    "AUDIT_BIAS_MIN_STEPS",
    "AUDIT_DRIFT_BIAS_THRESHOLD",
]
