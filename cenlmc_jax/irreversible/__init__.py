"""Irreversible jump sampler, its proposals and the RW-MH baseline.

docs/algorithms.md §7–8; paper 2.

Ma, Fox, Chen & Wu, *A unifying framework for irreversible MCMC*: the state
``z`` is lifted with a direction ``s``; a forward/backward pair ``(f̃, g̃)``
with ``f̃(·|y, -s) = g̃(·|y, s)`` (7.1) and the ratio
``a = min(1, π(z*) g̃(z|z*, s) / (π(z) f̃(z*|z, s)))`` (7.2), keeping ``s`` on
acceptance and flipping it on rejection, leave ``π(z)·Unif(s)`` invariant
without detailed balance. The modules:

* :mod:`~cenlmc_jax.irreversible.jump` — the step (7.2) with the direction
  variable: :class:`Proposal`, :class:`IrreversibleMHState`,
  :class:`IrreversibleMHInfo`, :func:`irreversible_mh_init`,
  :func:`irreversible_mh_step`, :func:`irreversible_mh`;
* :mod:`~cenlmc_jax.irreversible.proposals` — :func:`coordinatewise_proposal`
  (App. C.2, Algorithm 1), :func:`gamma_proposal` (the irreversible Gamma
  sampler) and :func:`sde_proposal` (an Euler–Maruyama step of the complete
  recipe with its adjoint, docs/algorithms.md §8, eq. 8.1; App. D), :class:`SDEPoint`;
* :mod:`~cenlmc_jax.irreversible.rwmh` — Gaussian random-walk MH, the
  reversible baseline: :class:`RWMHState`, :class:`RWMHInfo`,
  :func:`rwmh_init`, :func:`rwmh_step`, :func:`rwmh`;
* :mod:`~cenlmc_jax.irreversible.mala` — :func:`mala`: ``sde_proposal`` with
  ``Q = 0`` (the reversible MALA chain, preconditioned by ``M``);
* :mod:`~cenlmc_jax.irreversible.hmc` — :func:`hmc` (a fixed step) and
  :mod:`~cenlmc_jax.irreversible.autostep` — :func:`autostep_hmc` (the step halved
  each move where the first leapfrog step's energy error says so, exactly);
* ``_common`` — the Metropolis decision and the matrix factor they share.

Only re-exports here: every name is ``cenlmc_jax.irreversible.X`` as before,
and the sampler objects are also at the top level (``cj.irreversible_mh``, ...).
Note that ``cenlmc_jax.irreversible.rwmh`` is the sampler constructor (the
function re-exported here), which shadows the submodule of the same name as
an attribute; ``from cenlmc_jax.irreversible.rwmh import rwmh_step`` still
reaches the module.
"""

from cenlmc_jax.irreversible.autostep import AutoStepInfo, autostep_hmc, halved_depth
from cenlmc_jax.irreversible.hmc import (
    HMCInfo,
    HMCState,
    hmc,
    neck_depth,
    neck_depth_lower,
)
from cenlmc_jax.irreversible.jump import (
    IrreversibleMHInfo,
    IrreversibleMHState,
    Proposal,
    irreversible_mh,
    irreversible_mh_init,
    irreversible_mh_step,
)
from cenlmc_jax.irreversible.mala import mala
from cenlmc_jax.irreversible.proposals import (
    SDEPoint,
    coordinatewise_proposal,
    gamma_proposal,
    sde_proposal,
)
from cenlmc_jax.irreversible.rwmh import RWMHInfo, RWMHState, rwmh, rwmh_init, rwmh_step

__all__ = [
    "Proposal",
    "SDEPoint",
    "IrreversibleMHState",
    "IrreversibleMHInfo",
    "irreversible_mh_init",
    "irreversible_mh_step",
    "irreversible_mh",
    "coordinatewise_proposal",
    "gamma_proposal",
    "sde_proposal",
    "RWMHState",
    "RWMHInfo",
    "rwmh_init",
    "rwmh_step",
    "rwmh",
    "mala",
    "HMCState",
    "HMCInfo",
    "hmc",
    "neck_depth",
    "neck_depth_lower",
    "halved_depth",
    "AutoStepInfo",
    "autostep_hmc",
]
