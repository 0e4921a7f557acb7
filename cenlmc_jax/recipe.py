"""The complete recipe for SG-MCMC (spec section 5) — work in progress.

``gamma_term`` and ``evaluate_matrix`` are stable: other modules import them.
"""

from __future__ import annotations

from typing import Callable, Union

import jax
import jax.numpy as jnp

from cenlmc_jax.types import Array

MatrixFn = Union[Callable[[Array], Array], Array]

__all__ = ["gamma_term", "evaluate_matrix"]


def evaluate_matrix(M: MatrixFn, z: Array) -> Array:
    """``M(z)`` if ``M`` is callable, else ``jnp.asarray(M)`` (a constant matrix)."""
    return M(z) if callable(M) else jnp.asarray(M)


def gamma_term(D: MatrixFn, Q: MatrixFn, z: Array, sign: float = 1.0) -> Array:
    """``Γ_i(z) = Σ_j ∂_{z_j} (D_ij(z) + sign·Q_ij(z))`` (spec section 5 / 8), shape (n,).

    D, Q: callables ``z -> (n, n)`` or constant arrays. A constant matrix has
    zero divergence, so it is not differentiated; when both are constant the
    result is zeros. ``sign = -1`` gives the adjoint process' ``Γ_-`` (section 8).
    """
    z = jnp.asarray(z)
    gamma = jnp.zeros(z.shape, dtype=z.dtype)
    for M, s in ((D, 1.0), (Q, sign)):
        if callable(M):
            # jacfwd: n forward passes, jac[i, j, k] = ∂_{z_k} M_ij(z); the
            # divergence of row i is the trace over (j, k).
            jac = jax.jacfwd(M)(z)
            gamma = gamma + s * jnp.einsum("ijj->i", jac).astype(z.dtype)
    return gamma
