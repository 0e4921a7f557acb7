"""Pieces the jump sampler, its proposals and the RW-MH baseline share.

One floor below them.

* :func:`metropolis`: the accept/reject decision of every step here, accept
  with probability ``a = min(1, exp(log_ratio))`` (eq. 7.2 of docs/algorithms.md for
  the jump sampler, ``min(1, π(z*)/π(z))`` for RW-MH); ``u ~ U[0, 1)`` and accept
  iff ``u < a``, so ``a = 0`` never accepts and ``a = 1`` always does.
* :func:`proposal_trouble`: what counts as numerical trouble (``info.diverged``).
* :func:`spd_factor`: ``(L, L⁻¹, ½ log det M)`` of a symmetric positive
  definite ``M = L Lᵀ`` in the scalar / diagonal / dense forms of
  :mod:`cenlmc_jax._linalg` (the SDE proposal's ``D``, RW-MH's ``proposal_cov``).
* :func:`matrix_value`, :func:`from_flat`: small conversions.

The names are public within the package (a private *module*), not re-exported.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.linalg import solve_triangular

from cenlmc_jax._validation import is_concrete
from cenlmc_jax.base import RunFlag
from cenlmc_jax.types import Array, PRNGKey

__all__ = [
    "metropolis",
    "proposal_trouble",
    "from_flat",
    "matrix_value",
    "spd_factor",
    "ZERO_ACCEPTANCE_FLAG",
]

#: The driver's warning for a collapsed acceptance rate (RW-MH's and the jump sampler's
#: infos declare it, with ``may_stay = True``: a rejection leaves the position where it
#: was, so an unmoved chain is not frozen by itself). Raised for a chain whose
#: acceptance probability was exactly 0 at every step of a chunk: no draw could have
#: been accepted, so the chain is stuck with certainty, not by bad luck (a zero-density
#: proposal, or a log ratio below the float's exp underflow, at every step).
ZERO_ACCEPTANCE_FLAG = RunFlag(
    "zero_acceptance",
    lambda infos, step: (
        "the acceptance probability collapsed to 0 (info.acceptance_rate; every "
        "proposal went where the density is 0, or was so improbable that exp "
        "underflows): the chain is stuck; lower the step size, or start inside the "
        "support of the target"
    ),
    every_step=True,
)


def metropolis(rng_key: PRNGKey, log_ratio: Array) -> tuple[Array, Array]:
    """Accept with probability ``a = min(1, exp(log_ratio))``.

    A NaN ratio is a rejection.

    Args:
      rng_key: a JAX PRNG key, consumed by one ``U[0, 1)`` draw.
      log_ratio: the scalar log acceptance ratio (``log π(z*) - log π(z)`` plus any
        proposal correction); NaN counts as ``-inf``.

    Returns:
      ``(accepted, acceptance_rate)``: a scalar bool, and the scalar
      ``a = min(1, exp(log_ratio))`` in the ratio's dtype.
    """
    log_ratio = jnp.where(jnp.isnan(log_ratio), -jnp.inf, log_ratio)
    acceptance_rate = jnp.exp(jnp.minimum(log_ratio, 0.0))
    # u in [0, 1): P(u < a) = a exactly, a = 0 never accepts and a = 1 always does.
    # (the draw of jax.random.bernoulli(key, a): the same key gives BlackJAX's decision)
    u = jax.random.uniform(rng_key, (), dtype=acceptance_rate.dtype)
    return u < acceptance_rate, acceptance_rate


def proposal_trouble(z_star: Array, logdensity_new: Array) -> Array:
    """Non-finite proposal, or a NaN / +inf log density there.

    ``-inf`` is a legal zero density, not trouble.

    Args:
      z_star: the flat proposal, shape ``(d,)``.
      logdensity_new: the scalar log density at ``z_star``.

    Returns:
      A scalar bool: the proposal is numerical trouble (``info.diverged``).
    """
    return (
        ~jnp.all(jnp.isfinite(z_star))
        | jnp.isnan(logdensity_new)
        | (logdensity_new == jnp.inf)
    )


def from_flat(unravel, flat: Array) -> Any:
    """The position in the user's form.

    Args:
      unravel: the function that rebuilds the user's pytree from a flat vector, or
        ``None`` for an array position.
      flat: the flat position, shape ``(d,)``.

    Returns:
      ``unravel(flat)``, or ``flat`` itself when ``unravel is None``.
    """
    return flat if unravel is None else unravel(flat)


def matrix_value(M: Any) -> Any:
    """A constant matrix argument in NumPy float64 when its value is known.

    Args:
      M: a scalar, ``(d,)`` diagonal or ``(d, d)`` matrix, concrete or traced.

    Returns:
      ``M`` as a NumPy float64 array when its value is known, else ``M`` as given
      (a tracer).
    """
    return np.asarray(M, np.float64) if is_concrete(M) else M


def spd_factor(m: Any, d: int) -> tuple[Any, Any, Any]:
    """``(L, L⁻¹, ½ log det)`` of a symmetric positive definite ``m`` in a matrix form.

    Scalar ``c``: ``(√c, 1/√c, (d/2) log c)``; diagonal ``v``: elementwise;
    ``(d, d)``: the lower Cholesky factor and its inverse. NumPy float64 for a
    NumPy ``m`` (once, when a proposal is built), ``jnp`` for a traced one.

    Args:
      m: a symmetric positive definite matrix in one of the forms: a scalar ``c``
        (``c I_d``), a ``(d,)`` diagonal or a ``(d, d)`` matrix; a NumPy array or a
        JAX array / tracer.
      d: the dimension of the space ``m`` acts on.

    Returns:
      ``(L, L⁻¹, ½ log det m)``, ``L`` and ``L⁻¹`` in the form of ``m`` (scalar,
      ``(d,)`` or ``(d, d)`` lower triangular), the log determinant a scalar.
    """
    xp = np if isinstance(m, np.ndarray) else jnp
    if m.ndim == 0:
        root = xp.sqrt(m)
        return root, 1.0 / root, 0.5 * d * xp.log(m)
    if m.ndim == 1:
        root = xp.sqrt(m)
        return root, 1.0 / root, 0.5 * xp.sum(xp.log(m))
    chol = xp.linalg.cholesky(m)
    inv = (
        np.linalg.inv(chol)
        if xp is np
        else solve_triangular(chol, jnp.eye(d, dtype=chol.dtype), lower=True)
    )
    return chol, inv, xp.sum(xp.log(xp.diagonal(chol)))
