"""cenlmc_jax: ensemble, constrained-ensemble and irreversible Langevin samplers in JAX."""

from cenlmc_jax import diagnostics, targets
from cenlmc_jax.langevin import LMCInfo, LMCState, lmc_init, lmc_step
from cenlmc_jax.run import Moments, RunResult, sample

__version__ = "0.1.0"

__all__ = [
    "diagnostics",
    "targets",
    "LMCState",
    "LMCInfo",
    "lmc_init",
    "lmc_step",
    "sample",
    "RunResult",
    "Moments",
]
