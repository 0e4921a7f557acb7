"""MALA: the Metropolis-adjusted Langevin algorithm, preconditioned by ``M``.

Roberts & Tweedie (1996). From ``z`` with ``ε = step_size``, the proposal is one
Euler–Maruyama step of the preconditioned Langevin diffusion,

    z* = z + ε M ∇log π(z) + sqrt(2ε) M^{1/2} ξ,    ξ ~ N(0, I),

accepted with probability ``min(1, π(z*) q(z | z*) / (π(z) q(z* | z)))``, ``q`` the
Gaussian density of that step. It is paper 2's SDE proposal (eq. 8.1) with ``D = M`` and
``Q = 0`` inside the jump sampler (:mod:`~cenlmc_jax.irreversible.jump`): with ``Q = 0``
the forward and backward proposals coincide, so the direction variable never matters and
the chain is the reversible MALA chain (with ``M = I``, BlackJAX's ``mala``: the same
draws from the same key). The state and info are the jump sampler's
(:class:`~cenlmc_jax.irreversible.jump.IrreversibleMHState`, ``info.acceptance_rate``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from cenlmc_jax._validation import check_callable
from cenlmc_jax.base import SamplingAlgorithm
from cenlmc_jax.ensemble.lmc import check_inverse_mass_matrix
from cenlmc_jax.irreversible.jump import irreversible_mh
from cenlmc_jax.irreversible.proposals import sde_proposal
from cenlmc_jax.types import LogDensityFn

__all__ = ["mala"]


def mala(
    logdensity_fn: LogDensityFn,
    step_size: Any,
    *,
    inverse_mass_matrix: Any = None,
    grad_mode: str = "auto",
) -> SamplingAlgorithm:
    """MALA as a sampler object (one chain; :func:`cenlmc_jax.vmap_chains` for many).

    Args:
      logdensity_fn: ``z -> log π(z)``, a scalar.
      step_size: ``ε > 0`` (may be a tracer).
      inverse_mass_matrix: ``M``: ``None`` (the identity), a positive scalar, a
        ``(d,)`` diagonal or a ``(d, d)`` symmetric positive-definite array.
      grad_mode: ``"auto"``, ``"reverse"`` or ``"forward"``
        (:func:`cenlmc_jax.gradients.modes.value_and_grad`).

    Returns:
      A :class:`~cenlmc_jax.base.SamplingAlgorithm`: ``init(position, rng_key=None)``
      gives an :class:`~cenlmc_jax.irreversible.jump.IrreversibleMHState`,
      ``step(rng_key, state)`` one MALA step and its info.
    """
    check_callable(logdensity_fn, "logdensity_fn", "z -> scalar log density")
    check_inverse_mass_matrix(inverse_mass_matrix)
    D = 1.0 if inverse_mass_matrix is None else inverse_mass_matrix
    inner = irreversible_mh(
        logdensity_fn,
        sde_proposal(D, None, logdensity_fn, step_size, grad_mode=grad_mode),
    )

    def init(position, rng_key=None):
        if inverse_mass_matrix is not None and hasattr(position, "shape"):
            check_inverse_mass_matrix(inverse_mass_matrix, int(np.size(position)))
        return inner.init(position, rng_key)

    return SamplingAlgorithm(init, inner.step)
