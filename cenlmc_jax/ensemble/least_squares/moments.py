"""The least-squares ensemble gradient's moments, their monoid and their solve.

This module is below every backend. For particle ``i`` and a column ``j`` with
``u = (x_j - x_i)/η``, features ``φ(u)`` (``u``, and with ``quadratic`` the
products ``u_k u_l``, ``k ≤ l``) and kernel weight ``k_ij = k(|u|)``, the
moments are::

    A_i = Σ_j k_ij φ φᵀ,   b_i = Σ_j k_ij δf φ,   c_i = Σ_j k_ij δf²,
    m_i = Σ_j k_ij,        count_i = #{k_ij > 0}

(:class:`LSMoments`; a monoid: zeros, add). :func:`tile_moments` is the sum
over one tile of rows against one of columns, the definition every backend
(:mod:`cenlmc_jax.ensemble.least_squares`'s dense, tiled and block-sparse XLA
folds, the Pallas kernel of :mod:`.pallas`, the sharded fold) sums in its own
order. :func:`solve_moments` turns them into the gradient and its tests
(:mod:`cenlmc_jax.ensemble.least_squares`, "When a particle uses it"). This
module is the floor those backends stand on, as
:mod:`cenlmc_jax.pairwise.algebra` is for the pair force.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from cenlmc_jax._validation import (
    check_bool,
    check_choice,
    check_nonnegative,
    check_positive,
)
from cenlmc_jax.types import Array, ArrayLike

__all__ = [
    "KERNELS",
    "DEFAULT_MIN_EIG",
    "LSMoments",
    "LSGradient",
    "num_features",
    "empty_moments",
    "combine_moments",
    "tile_moments",
    "solve_moments",
    "prepare",
    "check_inputs",
    "scalars",
]

KERNELS = ("epanechnikov", "uniform")
#: Default floor on the gradient block's ``λ_min`` (:func:`solve_moments`):
#: a fifth of a full uniform ball's ``1/(d+2)`` at d = 2.
DEFAULT_MIN_EIG = 0.05


class LSMoments(NamedTuple):
    """The accumulators of some rows over some columns.

    A monoid under :func:`combine_moments`.

    Attributes:
      a: ``(n, p, p)`` ``Σ k φφᵀ``.
      b: ``(n, p)`` ``Σ k δf φ``.
      c: ``(n,)`` ``Σ k δf²``.
      mass: ``(n,)`` ``Σ k``.
      count: ``(n,)`` int32, neighbours with ``k > 0``.
    """

    a: Array
    b: Array
    c: Array
    mass: Array
    count: Array


class LSGradient(NamedTuple):
    """The least-squares gradient and its tests, per particle.

    Attributes:
      grad: ``(N, d)`` ``ĝ`` (0 where refused).
      ok: ``(N,)`` bool, the tests passed.
      cond: ``(N,)`` ``λ_min`` of the gradient block (:func:`solve_moments`).
      residual: ``(N,)`` ``sqrt(rss/m)/η``.
      count: ``(N,)`` neighbours used.
    """

    grad: Array
    ok: Array
    cond: Array
    residual: Array
    count: Array


def num_features(d: int, quadratic: bool) -> int:
    """The number of features ``p``.

    Args:
      d: the dimension.
      quadratic: with the quadratic features.

    Returns:
      ``p = d`` (linear) or ``d + d(d+1)/2`` (quadratic).
    """
    return d + (d * (d + 1) // 2 if quadratic else 0)


def empty_moments(n: int, p: int, dtype) -> LSMoments:
    """The moments over no columns: the identity of :func:`combine_moments`.

    Args:
      n: rows.
      p: features.
      dtype: the dtype of the sums.

    Returns:
      An :class:`LSMoments` of zeros.
    """
    z = jnp.zeros((n,), dtype)
    return LSMoments(
        jnp.zeros((n, p, p), dtype),
        jnp.zeros((n, p), dtype),
        z,
        z,
        jnp.zeros((n,), jnp.int32),
    )


def combine_moments(s: LSMoments, t: LSMoments) -> LSMoments:
    """Moments over disjoint column sets add.

    Args:
      s: an :class:`LSMoments`.
      t: an :class:`LSMoments` of the same rows.

    Returns:
      Their sum, an :class:`LSMoments`.
    """
    return LSMoments(*(u + v for u, v in zip(s, t, strict=True)))


def _features(u: Array, quadratic: bool) -> Array:
    """``φ(u)``: ``u`` and, with ``quadratic``, ``u_k u_l`` for ``k ≤ l``.

    Along the last axis.
    """
    if not quadratic:
        return u
    d = u.shape[-1]
    quad = [u[..., k] * u[..., m] for k in range(d) for m in range(k, d)]
    return jnp.concatenate([u, jnp.stack(quad, axis=-1)], axis=-1)


def _kernel(r2: Array, kernel: str) -> Array:
    """``k`` as a function of ``r² = |u|²`` (0 outside the unit ball)."""
    inside = r2 <= 1
    return jnp.where(inside, 1 - r2 if kernel == "epanechnikov" else 1, 0).astype(
        r2.dtype
    )


def tile_moments(
    xr: Array,
    fr: Array,
    vr: Array,
    xc: Array,
    fc: Array,
    vc: Array,
    eta: Array,
    *,
    kernel: str,
    quadratic: bool,
) -> LSMoments:
    """The moments of rows ``(B, d)`` against columns ``(C, d)``.

    Temporaries ``B × C × p``.

    Args:
      xr: row positions, ``(B, d)``.
      fr: row values, ``(B,)``.
      vr: row validity, ``(B,)`` bool.
      xc: column positions, ``(C, d)``.
      fc: column values, ``(C,)``.
      vc: column validity, ``(C,)`` bool.
      eta: the ball radius ``η``.
      kernel: ``"epanechnikov"`` or ``"uniform"``.
      quadratic: with the quadratic features.

    Returns:
      The rows' :class:`LSMoments` over these columns.
    """
    u = (xc[None, :, :] - xr[:, None, :]) / eta  # [i, j] = (x_j - x_i)/η
    r2 = jnp.sum(u * u, axis=-1)
    use = vr[:, None] & vc[None, :] & (r2 > 0)
    k = jnp.where(use, _kernel(r2, kernel), 0)
    df = jnp.where(use, fc[None, :] - fr[:, None], 0)
    phi = _features(u, quadratic)
    kphi = k[..., None] * phi
    hi = lax.Precision.HIGHEST
    a = jnp.einsum("bcp,bcq->bpq", kphi, phi, precision=hi)
    b = jnp.einsum("bcp,bc->bp", kphi, df, precision=hi)
    count = jnp.sum(k > 0, axis=1, dtype=jnp.int32)
    return LSMoments(a, b, jnp.sum(k * df * df, axis=1), jnp.sum(k, axis=1), count)


def _gradient_conditioning(scaled: Array, d: int) -> Array:
    """``λ_min`` of the gradient block's Schur complement of ``A/m``.

    ``S = A_gg - A_gq A_qq⁻¹ A_qg``. ``S⁻¹ = (A⁻¹)[:d, :d]`` is the block the
    gradient's error goes through; for the linear fit ``S = A/m``. 0 where ``A/m``
    is singular to working precision (smallest eigenvalue below ``100 p ε`` of the
    largest).
    """
    p = scaled.shape[-1]
    eig = jnp.linalg.eigvalsh(scaled)
    full = eig[:, 0] > 100 * p * jnp.finfo(scaled.dtype).eps * eig[:, -1]
    if p == d:
        return jnp.where(full, eig[:, 0], 0)
    safe = jnp.where(full[:, None, None], scaled, jnp.eye(p, dtype=scaled.dtype))
    agq, aqq = safe[:, :d, d:], safe[:, d:, d:]
    schur = safe[:, :d, :d] - agq @ jnp.linalg.solve(aqq, jnp.swapaxes(agq, 1, 2))
    return jnp.where(full, jnp.linalg.eigvalsh(schur)[:, 0], 0)


def solve_moments(
    mo: LSMoments, eta: Array, d: int, min_eig: ArrayLike, max_residual: ArrayLike
) -> LSGradient:
    """``θ = A⁻¹b``, ``ĝ = θ[:d]/η`` and the two tests (module docstring).

    Args:
      mo: the particles' :class:`LSMoments`.
      eta: the ball radius ``η``.
      d: the dimension.
      min_eig: the conditioning floor.
      max_residual: the rms misfit ceiling.

    Returns:
      An :class:`LSGradient`.
    """
    dtype = mo.b.dtype
    p = mo.b.shape[-1]
    mass = jnp.where(mo.mass > 0, mo.mass, 1)
    scaled = mo.a / mass[:, None, None]
    cond = lax.stop_gradient(_gradient_conditioning(scaled, d))
    well = (mo.count >= 2 * p) & (cond >= jnp.asarray(min_eig, dtype))
    eye = jnp.eye(p, dtype=dtype)
    theta = jnp.linalg.solve(
        jnp.where(well[:, None, None], scaled, eye), (mo.b / mass[:, None])[..., None]
    )[..., 0]
    rss = jnp.maximum(mo.c / mass - jnp.sum(theta * mo.b / mass[:, None], axis=-1), 0)
    residual = lax.stop_gradient(jnp.sqrt(rss) / eta)
    ok = well & (residual <= jnp.asarray(max_residual, dtype))
    grad = jnp.where(ok[:, None], theta[:, :d] / eta, 0)
    return LSGradient(
        grad,
        ok,
        jnp.where(mo.count > 0, cond, 0),
        jnp.where(well, residual, jnp.inf),
        mo.count,
    )


def prepare(x: Array, f: Array) -> tuple[Array, Array, Array]:
    """Invalid rows (a non-finite coordinate or value) zeroed, and which are valid.

    Args:
      x: ``(N, d)`` particles.
      f: ``(N,)`` values.

    Returns:
      ``(x, f, valid)``, ``valid`` an ``(N,)`` bool.
    """
    valid = jnp.all(jnp.isfinite(x), axis=-1) & jnp.isfinite(f)
    return jnp.where(valid[:, None], x, 0), jnp.where(valid, f, 0), valid


def check_inputs(x, f, eta, kernel, quadratic, min_eig, max_residual):
    """The estimator's argument checks (Python, before tracing).

    Args:
      x: ``(N, d)`` particles.
      f: ``(N,)`` values.
      eta: ``η > 0``.
      kernel: one of :data:`KERNELS`.
      quadratic: a bool.
      min_eig: ``>= 0``.
      max_residual: ``>= 0`` (inf allowed).

    Returns:
      ``(x, f, dtype)``, in the promoted float dtype.

    Raises:
      ValueError: a bad argument.
    """
    x = x if isinstance(x, jax.Array) else jnp.asarray(x)
    if x.ndim != 2 or x.shape[0] < 1 or x.shape[1] < 1:
        raise ValueError(
            "x must be an array of shape (N, d) with N, d >= 1; got shape "
            f"{tuple(x.shape)}."
        )
    f = f if isinstance(f, jax.Array) else jnp.asarray(f)
    if f.shape != x.shape[:1]:
        raise ValueError(
            f"f must have shape (N,) = ({x.shape[0]},) to match x; got shape "
            f"{tuple(f.shape)}."
        )
    check_positive(eta, "eta")
    check_choice(kernel, "kernel", KERNELS)
    check_bool(quadratic, "quadratic")
    check_nonnegative(min_eig, "min_eig")
    check_nonnegative(max_residual, "max_residual", allow_inf=True)
    dtype = jnp.promote_types(jnp.result_type(x.dtype, f.dtype), jnp.float32)
    if not jnp.issubdtype(dtype, jnp.floating):
        dtype = jnp.result_type(float)
    return x.astype(dtype), f.astype(dtype), dtype


def scalars(dtype, eta, min_eig, max_residual):
    """``eta``, ``min_eig``, ``max_residual`` as arrays of ``dtype``.

    Args:
      dtype: the dtype.
      eta: ``η``.
      min_eig: the conditioning floor.
      max_residual: the rms misfit ceiling.

    Returns:
      The three 0-d arrays.
    """
    return tuple(jnp.asarray(v, dtype) for v in (eta, min_eig, max_residual))
