"""Warm-ups: how a sampler's step size, metric and start are chosen before sampling.

* :mod:`~cenlmc_jax.adaptation.langevin_warmup`: :func:`langevin_warmup`, the
  ensemble warm-up (mode and Laplace start, metric, step size); by default it hands
  over exact HMC, or MALA, LMC / CEnLMC by name;
* :mod:`~cenlmc_jax.adaptation.start`: its start phase (the Laplace approximation at
  the mode, or the given positions where it does not describe the bulk; starts
  whose log density is not finite redrawn, as Stan does);
* :mod:`~cenlmc_jax.adaptation.kinetic`: the next phase of its exact default (a
  generalised-HMC phase steered and stopped by the ensemble);
* :mod:`~cenlmc_jax.adaptation.adjusted`: the last (HMC's step and trajectory
  length, or MALA's step, tuned on the ensemble, with a shorter step for the
  particles in stiff regions);
* :mod:`~cenlmc_jax.adaptation.coordinates`: the whitened coordinates both use;
* :mod:`~cenlmc_jax.adaptation.window_adaptation`: :func:`window_adaptation`,
  Stan's windowed adaptation of the single-chain samplers (RW-MH, MALA, SDE and
  Gamma proposals);
* :mod:`~cenlmc_jax.adaptation.step_size`: the largest curvature by power
  iteration and the Langevin step size it allows;
* :mod:`~cenlmc_jax.adaptation.mass_matrix`: the pieces both share (dual
  averaging, Welford covariance, the window schedule).
"""

from cenlmc_jax.adaptation.langevin_warmup import (
    LangevinWarmup,
    LangevinWarmupInfo,
    langevin_warmup,
)
from cenlmc_jax.adaptation.mass_matrix import (
    DualAveragingState,
    WelfordState,
    build_schedule,
    dual_averaging_init,
    dual_averaging_update,
    robbins_monro_update,
    welford_covariance,
    welford_init,
    welford_update,
)
from cenlmc_jax.adaptation.step_size import langevin_step_size, max_curvature
from cenlmc_jax.adaptation.window_adaptation import (
    ADAPTABLE,
    TARGET_ACCEPTANCE,
    AdaptationSpec,
    WindowAdaptation,
    WindowAdaptationInfo,
    collapse_problems,
    gamma_spec,
    mala_spec,
    rwmh_spec,
    sde_spec,
    window_adaptation,
)

__all__ = [
    "LangevinWarmup",
    "LangevinWarmupInfo",
    "langevin_warmup",
    "langevin_step_size",
    "max_curvature",
    "DualAveragingState",
    "WelfordState",
    "build_schedule",
    "dual_averaging_init",
    "dual_averaging_update",
    "robbins_monro_update",
    "welford_covariance",
    "welford_init",
    "welford_update",
    "ADAPTABLE",
    "TARGET_ACCEPTANCE",
    "AdaptationSpec",
    "WindowAdaptation",
    "WindowAdaptationInfo",
    "window_adaptation",
    "collapse_problems",
    "rwmh_spec",
    "mala_spec",
    "sde_spec",
    "gamma_spec",
]
