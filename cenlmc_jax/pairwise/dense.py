"""The dense references of the ensemble force: all N x N pairs at once.

The pair sums of docs/algorithms.md §2-4 (see :mod:`.algebra`),

    force_sum_i = Σ_{j≠i} W_ij (x_j - x_i),
    W_ij = exp(log α_d - log p_j) (f_j - f_i) / |x_j - x_i|²
           · 1[|x_j - x_i| ≤ η] · 1[|w_j - w_i| ≤ R2],

written out directly, without the blockwise reduction:

* :func:`ensemble_force_dense`: JAX, direct differences ``x_j - x_i`` (an
  ``(N, N, d)`` temporary), each weight exponentiated in log space
  (``sign(g) exp(log s_j + log|g_ij|)``, so a weight that alone overflows
  but whose term does not stays finite). Accurate, memory ``O(N² d)``: the
  reference for small N (``method="auto"`` takes it for N ≤ 64).
* :func:`ensemble_force_reference_numpy`: the float64 NumPy oracle of the tests.

Both drop exactly coincident pairs (``x_j == x_i``: no force, counted as
neighbours), give non-finite rows 0 force and ``n_ball = 0``, and count
``n_r2`` in w-space only (0 for a non-finite ``w``; ``N-1`` without ``w``).
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from cenlmc_jax.pairwise.algebra import (
    PairwiseForce,
    canonical_precision,
    check_pair_inputs,
    log_alpha_d,
    validity,
)
from cenlmc_jax.types import ArrayLike

__all__ = ["ensemble_force_dense", "ensemble_force_reference_numpy"]


@functools.partial(jax.jit, static_argnames=("precision",))
def _dense(x, f, log_p, eta, w, r2, *, precision):
    n, d = x.shape
    dtype = x.dtype
    valid, valid_w = validity(x, f, log_p, w)
    # Zero the invalid rows so their NaNs never meet a 0 weight (0 * NaN = NaN).
    x = jnp.where(valid[:, None], x, 0)
    f = jnp.where(valid, f, 0)
    log_w = jnp.where(valid, log_alpha_d(d, eta, dtype) - log_p, 0)
    offdiag = ~jnp.eye(n, dtype=bool)

    dx = x[None, :, :] - x[:, None, :]  # [i, j] = x_j - x_i
    d2 = jnp.sum(dx * dx, axis=-1)
    pair = valid[:, None] & valid[None, :] & offdiag
    if w is None:
        n_r2 = jnp.full((n,), n - 1, jnp.int32)
    else:
        w0 = jnp.where(valid_w[:, None], w, 0)
        dw = w0[None, :, :] - w0[:, None, :]
        in_r2 = (
            (jnp.sum(dw * dw, axis=-1) <= jnp.asarray(r2, dtype) ** 2)
            & valid_w[:, None]
            & valid_w[None, :]
        )
        in_r2 = in_r2 & offdiag
        n_r2 = jnp.sum(in_r2, axis=1, dtype=jnp.int32)
        pair = pair & in_r2
    ball = pair & (d2 <= jnp.asarray(eta, dtype) ** 2)
    df = f[None, :] - f[:, None]
    use = ball & (d2 > 0) & (df != 0)
    safe_d2 = jnp.where(use, d2, 1)
    safe_df = jnp.where(use, df, 1)
    log_mag = log_w[None, :] + jnp.log(jnp.abs(safe_df)) - jnp.log(safe_d2)
    weight = jnp.where(use, jnp.sign(safe_df) * jnp.exp(log_mag), 0)
    force = jnp.einsum("ij,ijk->ik", weight, dx, precision=precision)
    return PairwiseForce(force, n_r2, jnp.sum(ball, axis=1, dtype=jnp.int32))


def ensemble_force_dense(
    x: ArrayLike,
    f: ArrayLike,
    log_p: ArrayLike,
    eta: ArrayLike,
    *,
    w: ArrayLike | None = None,
    r2: ArrayLike | None = None,
    precision: Any = None,
) -> PairwiseForce:
    """The pair sums by the N x N direct-difference reference.

    Jittable; ``eta`` and ``r2`` may be traced.

    Args:
      x: particle positions, shape ``(N, d)``.
      f: potential values, shape ``(N,)``.
      log_p: proposal log densities, shape ``(N,)``.
      eta: the ball radius ``η > 0``.
      w: CEnLMC's deterministic parts, shape ``(N, d)``, or ``None``; with
        ``r2``, both or neither.
      r2: the R2 radius ``>= 0``, or ``None``.
      precision: of the final contraction (None: HIGHEST).

    Returns:
      :class:`~.algebra.PairwiseForce` in the promoted floating dtype.

    Raises:
      ValueError: the checks of :func:`~.algebra.check_pair_inputs`.
    """
    x, f, log_p, w = check_pair_inputs(x, f, log_p, eta, w, r2)
    dtype = x.dtype
    return _dense(
        x,
        f,
        log_p,
        jnp.asarray(eta, dtype),
        w,
        None if r2 is None else jnp.asarray(r2, dtype),
        precision=canonical_precision(precision),
    )


def ensemble_force_reference_numpy(
    x: ArrayLike,
    f: ArrayLike,
    log_p: ArrayLike,
    eta: float,
    *,
    w: ArrayLike | None = None,
    r2: float | None = None,
) -> PairwiseForce:
    """Float64 NumPy oracle of the pair sums by direct differences.

    Loop-free, ``O(N² d)`` memory: for tests on small N. Same conventions as
    the JAX versions: non-finite rows contribute nothing and get 0 force and
    ``n_ball = 0``; ``n_r2`` is ``N-1`` without ``w`` and 0 for non-finite
    ``w`` rows; exactly coincident pairs (``x_j == x_i``) contribute 0 but
    count as neighbours.

    Args:
      x: particle positions, shape ``(N, d)``.
      f: potential values, shape ``(N,)``.
      log_p: proposal log densities, shape ``(N,)``.
      eta: the ball radius ``η > 0``.
      w: CEnLMC's deterministic parts, shape ``(N, d)``, or ``None``.
      r2: the R2 radius ``>= 0``; required with ``w``.

    Returns:
      :class:`~.algebra.PairwiseForce` of NumPy arrays (float64 force, int32
      counts).

    Raises:
      ValueError: ``f`` or ``log_p`` not of shape ``(N,)``, ``eta`` not positive,
        or ``w`` without a non-negative ``r2``.
    """
    x = np.asarray(x, np.float64)
    f = np.asarray(f, np.float64)
    log_p = np.asarray(log_p, np.float64)
    n, d = x.shape
    if f.shape != (n,) or log_p.shape != (n,):
        raise ValueError(
            f"f and log_p must have shape ({n},); got {f.shape} and {log_p.shape}."
        )
    if not eta > 0:
        raise ValueError(f"eta must be > 0; got {eta!r}.")
    log_alpha = math.log(d) - (
        0.5 * d * math.log(math.pi) + d * math.log(eta) - math.lgamma(0.5 * d + 1)
    )
    offdiag = ~np.eye(n, dtype=bool)
    if w is not None:
        if r2 is None or not r2 >= 0:
            raise ValueError(f"r2 must be >= 0 when w is given; got {r2!r}.")
        w = np.asarray(w, np.float64)
        valid_w = np.all(np.isfinite(w), axis=1)
    else:
        valid_w = np.ones(n, bool)
    valid = (
        np.all(np.isfinite(x), axis=1) & np.isfinite(f) & np.isfinite(log_p) & valid_w
    )
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        x0 = np.where(valid[:, None], x, 0.0)
        dx = x0[None, :, :] - x0[:, None, :]
        d2 = np.sum(dx * dx, axis=-1)
        pair = valid[:, None] & valid[None, :] & offdiag
        if w is not None:
            w0 = np.where(valid_w[:, None], w, 0.0)
            dw = w0[None, :, :] - w0[:, None, :]
            in_r2 = (
                (np.sum(dw * dw, axis=-1) <= float(r2) ** 2)
                & valid_w[:, None]
                & valid_w[None, :]
                & offdiag
            )
            n_r2 = in_r2.sum(axis=1).astype(np.int32)
            pair &= in_r2
        else:
            n_r2 = np.full(n, n - 1, np.int32)
        ball = pair & (d2 <= float(eta) ** 2)
        f0 = np.where(valid, f, 0.0)
        cw = np.exp(np.where(valid, log_alpha - log_p, 0.0))
        use = ball & (d2 > 0)
        weight = np.where(
            use, cw[None, :] * (f0[None, :] - f0[:, None]) / np.where(use, d2, 1.0), 0.0
        )
        force = np.einsum("ij,ijk->ik", weight, dx)
    return PairwiseForce(force, n_r2, ball.sum(axis=1).astype(np.int32))
