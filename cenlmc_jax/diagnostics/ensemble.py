r"""Ensemble diagnostics: independent particles, against reference values.

For the final states of an ensemble (or of independent chains),
``positions: (N, *event_shape)``, treated as :math:`N` independent draws:

* :func:`ensemble_mcse`: the standard error of the ensemble mean,
  :math:`\hat\sigma_i / \sqrt N` (ddof-1 :math:`\hat\sigma_i`); for a
  trajectory use :func:`~.chains.mcse`;
* :func:`z_score`: :math:`(\hat\theta - \theta) / \mathrm{se}`, about
  :math:`\mathcal N(0, 1)` for a calibrated standard error;
* :func:`moment_errors` (:class:`MomentErrors`): the ensemble mean and
  ddof-1 covariance against reference moments :math:`\mu`, :math:`\Sigma`
  (max absolute and standardised mean errors, max relative variance error,
  relative Frobenius covariance error).

The two-sample distances to reference draws (MMD, sliced Wasserstein) are in
:mod:`.distances`. All functions are jittable; floating dtypes are preserved.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from cenlmc_jax.diagnostics.layout import as_float_array, common_float_dtype
from cenlmc_jax.types import Array, ArrayLike

__all__ = [
    "ensemble_mcse",
    "z_score",
    "MomentErrors",
    "moment_errors",
]


@jax.jit
def _ensemble_mcse_core(x: Array) -> Array:
    return (jnp.std(x, axis=0, ddof=1) / jnp.sqrt(x.shape[0])).astype(x.dtype)


def ensemble_mcse(positions: ArrayLike) -> Array:
    r"""Standard error of the ensemble mean, assuming i.i.d. particles.

    .. math::
        \mathrm{SE}_i = \frac{\hat\sigma_i}{\sqrt N},\qquad
        \hat\sigma_i^2 = \frac{1}{N-1}\sum_{p=1}^N (x_{p,i} - \bar x_i)^2 .

    This is only valid when the :math:`N` particles are (approximately)
    independent draws, e.g. the final states of independent chains.  For
    interacting particle systems (ensemble samplers with a shared
    preconditioner or mean-field coupling) the particles are correlated and
    the true error can be larger; for a trajectory use :func:`~.chains.mcse`.

    Args:
      positions: array of shape ``(N, *event_shape)``, typically ``(N, d)``,
        with :math:`N \ge 2`.

    Returns:
      Array of shape ``event_shape``.

    Raises:
      ValueError: if ``positions`` is a scalar or has fewer than 2 particles.
    """
    x = as_float_array(positions, "positions")
    if x.ndim < 1 or x.shape[0] < 2:
        raise ValueError(
            f"positions must have shape (N, *event_shape) with N >= 2 "
            f"particles; got shape {tuple(x.shape)}."
        )
    return _ensemble_mcse_core(x)


def z_score(estimate: ArrayLike, truth: ArrayLike, se: ArrayLike) -> Array:
    r"""Standardised error :math:`z = (\hat\theta - \theta) / \mathrm{se}`.

    Element-wise with NumPy broadcasting.  If ``se`` is a calibrated standard
    error, :math:`z` is approximately :math:`\mathcal N(0, 1)`.  A zero ``se``
    gives ``inf``/``nan``.

    Args:
      estimate: estimated values, any shape.
      truth: reference values, broadcastable with ``estimate``.
      se: standard errors, broadcastable with both.

    Returns:
      Array of the broadcast shape.

    Raises:
      ValueError: if the three shapes are not broadcast-compatible.
    """
    est = as_float_array(estimate, "estimate")
    tru = as_float_array(truth, "truth")
    s = as_float_array(se, "se")
    try:
        jnp.broadcast_shapes(est.shape, tru.shape, s.shape)
    except ValueError as err:
        raise ValueError(
            f"estimate (shape {tuple(est.shape)}), truth (shape "
            f"{tuple(tru.shape)}) and se (shape {tuple(s.shape)}) must be "
            "broadcast-compatible."
        ) from err
    return (est - tru) / s


# --------------------------------------------------------------------------
# Ensemble accuracy against known moments.
# --------------------------------------------------------------------------


class MomentErrors(NamedTuple):
    """Errors of ensemble moments against reference moments (all scalars).

    Attributes:
      mean_abs_error: :math:`\\max_i |\\hat\\mu_i - \\mu_i|`.
      mean_std_error: :math:`\\max_i |\\hat\\mu_i - \\mu_i| / \\sqrt{\\Sigma_{ii}}`
        (mean error in units of the reference standard deviation).
      var_rel_error: :math:`\\max_i |\\hat\\Sigma_{ii} / \\Sigma_{ii} - 1|`.
      cov_rel_error: relative Frobenius error
        :math:`\\|\\hat\\Sigma - \\Sigma\\|_F / \\|\\Sigma\\|_F`.
    """

    mean_abs_error: Array
    mean_std_error: Array
    var_rel_error: Array
    cov_rel_error: Array


@jax.jit
def _moment_errors_core(x: Array, mean: Array, cov: Array) -> MomentErrors:
    mu_hat = jnp.mean(x, axis=0)
    centred = x - mu_hat
    cov_hat = centred.T @ centred / (x.shape[0] - 1)
    abs_err = jnp.abs(mu_hat - mean)
    ref_var = jnp.diagonal(cov)
    return MomentErrors(
        mean_abs_error=jnp.max(abs_err),
        mean_std_error=jnp.max(abs_err / jnp.sqrt(ref_var)),
        var_rel_error=jnp.max(jnp.abs(jnp.diagonal(cov_hat) / ref_var - 1.0)),
        cov_rel_error=jnp.linalg.norm(cov_hat - cov) / jnp.linalg.norm(cov),
    )


def moment_errors(
    positions: ArrayLike, mean: ArrayLike, cov: ArrayLike
) -> MomentErrors:
    r"""Compare the ensemble mean and covariance with reference moments.

    With :math:`\hat\mu = \frac1N\sum_p x_p` and the ddof-1 sample covariance
    :math:`\hat\Sigma = \frac{1}{N-1}\sum_p (x_p-\hat\mu)(x_p-\hat\mu)^\top`,
    returns a :class:`MomentErrors` with

    * ``mean_abs_error`` :math:`= \max_i |\hat\mu_i - \mu_i|`,
    * ``mean_std_error`` :math:`= \max_i |\hat\mu_i - \mu_i|/\sqrt{\Sigma_{ii}}`,
    * ``var_rel_error`` :math:`= \max_i |\hat\Sigma_{ii}/\Sigma_{ii} - 1|`,
    * ``cov_rel_error`` :math:`= \|\hat\Sigma-\Sigma\|_F / \|\Sigma\|_F`.

    For i.i.d. exact draws, ``mean_std_error`` is of order
    :math:`\sqrt{2\log d / N}` and ``cov_rel_error`` of order
    :math:`\sqrt{d/N}` (for well-conditioned :math:`\Sigma`).

    Args:
      positions: array of shape ``(N, d)`` with :math:`N\ge 2`.
      mean: reference mean, shape ``(d,)``.
      cov: reference covariance, shape ``(d, d)``, positive diagonal.

    Returns:
      :class:`MomentErrors` of scalar arrays.

    Raises:
      ValueError: if ``positions`` is not 2-D with at least 2 rows, or the
        shapes of ``mean`` / ``cov`` do not match ``d``.
    """
    x = as_float_array(positions, "positions")
    if x.ndim != 2 or x.shape[0] < 2:
        raise ValueError(
            f"positions must have shape (N, d) with N >= 2; got shape {tuple(x.shape)}."
        )
    d = x.shape[1]
    mu = as_float_array(mean, "mean")
    if mu.shape != (d,):
        raise ValueError(
            f"mean must have shape ({d},) to match positions of shape "
            f"{tuple(x.shape)}; got shape {tuple(mu.shape)}."
        )
    sigma = as_float_array(cov, "cov")
    if sigma.shape != (d, d):
        raise ValueError(
            f"cov must have shape ({d}, {d}) to match positions of shape "
            f"{tuple(x.shape)}; got shape {tuple(sigma.shape)}."
        )
    dtype = common_float_dtype(x, mu, sigma)
    return _moment_errors_core(x.astype(dtype), mu.astype(dtype), sigma.astype(dtype))
