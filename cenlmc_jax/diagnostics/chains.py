r"""Chain diagnostics: several dependent chains, per coordinate.

Effective sample size, R-hat, Monte-Carlo standard errors and the
multi-chain autocorrelation, after Vehtari et al. (2021) and Stan / ArviZ.
Every function takes draws chains first, ``(num_chains, num_samples,
*event_shape)``, or a :class:`~cenlmc_jax.run.RunResult` (the layout and its
checks: :mod:`.layout`), and returns one value per coordinate, shape
``event_shape``. All are jittable with static ``chain_axis``,
``sample_axis``, ``split``, ``rank``, ``method`` and ``statistic``.

With :math:`M` chains of :math:`N` draws and per-chain FFT autocovariances
:math:`\hat\gamma_c(t)`:

* :func:`autocorrelation`: :math:`\hat\rho_t = 1 - (W - \frac1M\sum_c
  \hat\gamma_c(t)) / \widehat{\operatorname{var}}^+`, with the within-chain
  variance :math:`W` and :math:`\widehat{\operatorname{var}}^+ =
  \frac{N-1}{N} W + B/N`;
* :func:`effective_sample_size`: :math:`MN / \hat\tau`, :math:`\hat\tau`
  from Geyer's (1992) initial positive and monotone sequences of the pair
  sums :math:`\hat\rho_{2k} + \hat\rho_{2k+1}`, with ArviZ's ``method``
  variants (:data:`ESS_METHODS`: split chains, rank normalisation
  :math:`\Phi^{-1}((r - 3/8)/(S + 1/4))` of Vehtari et al. 2021 eq. 14,
  quantile indicators for the tails);
* :func:`potential_scale_reduction`:
  :math:`\hat R = \sqrt{\widehat{\operatorname{var}}^+ / W}` on (split)
  chains, or with ``rank=True`` the larger of the bulk and folded
  rank-normalised :math:`\hat R` (Vehtari et al. 2021, eq. 14-16);
* :func:`mcse`: :math:`\hat\sigma / \sqrt{\widehat{\mathrm{ESS}}}` for the
  mean, the delta method on :math:`s^2` for the sd.

References
----------
A. Vehtari, A. Gelman, D. Simpson, B. Carpenter, P.-C. Bürkner (2021).
Rank-normalization, folding, and localization: an improved R-hat for
assessing convergence of MCMC. Bayesian Analysis 16(2).

C. J. Geyer (1992). Practical Markov chain Monte Carlo. Statistical Science
7(4).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import ndtri

from cenlmc_jax._validation import check_bool, check_choice, check_int
from cenlmc_jax.diagnostics.layout import check_ess, checked_chains_first
from cenlmc_jax.types import Array, ArrayLike

__all__ = [
    "ESS_METHODS",
    "autocorrelation",
    "effective_sample_size",
    "potential_scale_reduction",
    "mcse",
    "summary_diagnostics",
]

#: The ESS variants, by ArviZ's names: "identity" (no split, no ranks),
#: "mean" (split chains), "bulk" (split, rank-normalised), "tail" (split,
#: the smaller of the 5% and 95% quantile-indicator ESS).
ESS_METHODS = ("identity", "mean", "bulk", "tail")


# --------------------------------------------------------------------------
# Building blocks: autocorrelation, splitting, rank normalisation.
# --------------------------------------------------------------------------


def _autocovariance(x: Array) -> Array:
    """Biased per-chain autocovariance along axis 1 via FFT.

    ``x`` has shape (m, n, *E); returns gamma of the same shape with
    ``gamma[c, t] = (1/n) sum_{s=0}^{n-1-t} (x[c, s] - xbar_c)(x[c, s+t] - xbar_c)``.
    """
    n = x.shape[1]
    # Zero-pad to >= 2n so the circular correlation equals the linear one.
    n_fft = 1 << (2 * n - 1).bit_length()
    centred = x - jnp.mean(x, axis=1, keepdims=True)
    spec = jnp.fft.rfft(centred, n=n_fft, axis=1)
    power = spec.real**2 + spec.imag**2
    acov = jnp.fft.irfft(power, n=n_fft, axis=1)
    acov = jax.lax.slice_in_dim(acov, 0, n, axis=1)
    return (acov / n).astype(x.dtype)


def _constant(x: Array) -> Array:
    """Per coordinate: every draw of every chain equals the first one (exactly)."""
    return jnp.all(x == x[:1, :1], axis=(0, 1))


def _combined_autocorrelation(x: Array) -> Array:
    """Multi-chain autocorrelation ``rho_t`` (steps 1-3
    of :func:`effective_sample_size`), shape (n, *E).
    """
    m, n = x.shape[0], x.shape[1]
    acov = _autocovariance(x)  # (m, n, *E)
    chain_mean = jnp.mean(x, axis=1)  # (m, *E)
    # Within-chain variance W (ddof = 1) and the pooled variance estimate
    # var_plus = (n - 1)/n W + B/n, with B/n the variance of chain means.
    within = jnp.mean(acov[:, 0], axis=0) * (n / (n - 1.0))
    var_plus = within * ((n - 1.0) / n)
    if m > 1:
        var_plus = var_plus + jnp.var(chain_mean, axis=0, ddof=1)
    rho = 1.0 - (within - jnp.mean(acov, axis=0)) / var_plus  # (n, *E)
    return rho.at[0].set(1.0)


def _ess_core(x: Array) -> Array:
    m, n = x.shape[0], x.shape[1]
    dtype = x.dtype
    rho = _combined_autocorrelation(x)

    # Geyer: pair sums P_k = rho_{2k} + rho_{2k+1}, k = 0..K. As ArviZ and
    # Stan, pairs are examined while 2k - 1 < n - 3: K = len(range(1, n - 3, 2)).
    num_pairs = len(range(1, n - 3, 2)) + 1
    pairs = rho[: 2 * num_pairs].reshape((num_pairs, 2) + rho.shape[1:])
    rho_even = pairs[:, 0]
    pair_sum = pairs.sum(axis=1)  # (K + 1, *E)
    # Initial positive sequence: keep pairs up to the first non-positive one
    # (P_0 = 1 + rho_1 is always kept).
    positive = (pair_sum > 0).at[0].set(True)
    keep = jax.lax.cummin(positive.astype(jnp.int32), axis=0)
    num_kept = jnp.sum(keep, axis=0)  # (*E)
    all_kept = num_kept == num_pairs
    # Initial monotone sequence: running minimum of the pair sums.
    monotone = jax.lax.cummin(pair_sum, axis=0)
    # Stan's refinement: add the even-lag term of the first rejected pair when
    # it is positive. When no pair is rejected the last examined pair is not
    # summed and its even-lag term is added as it is (ArviZ's `_ess` exactly).
    last = (jnp.arange(num_pairs) == num_pairs - 1).reshape(
        (num_pairs,) + (1,) * (rho.ndim - 1)
    )
    summed = (keep * ~(last & all_kept)).astype(dtype)
    first_rejected = jnp.minimum(num_kept, num_pairs - 1)
    extra = jnp.take_along_axis(rho_even, first_rejected[None], axis=0)[0]
    extra = jnp.where(all_kept, extra, jnp.maximum(extra, 0.0))

    tau = -1.0 + 2.0 * jnp.sum(summed * monotone, axis=0) + extra
    total = m * n
    tau = jnp.maximum(tau, 1.0 / math.log10(total))
    return jnp.where(_constant(x), jnp.nan, total / tau).astype(dtype)


def _split_chains(x: Array) -> Array:
    """(m, n, *E) -> (2m, n // 2, *E): first and second halves; the middle draw is
    dropped when n is odd.
    """
    half = x.shape[1] // 2
    return jnp.concatenate([x[:, :half], x[:, x.shape[1] - half :]], axis=0)


def _z_scale(x: Array) -> Array:
    r"""Rank normalisation (Vehtari et al. 2021, eq. 14): ``Φ^{-1}((r - 3/8) / (S +
    1/4))``.

    ``r`` is the rank of each value among all ``S = m n`` values of its
    coordinate (ties get their average rank, 1-based), found by
    ``searchsorted`` on the sorted values: ``(#{< v} + #{<= v} + 1) / 2``.
    """
    shape = x.shape
    flat = x.reshape((shape[0] * shape[1], -1))  # (S, K)
    srt = jnp.sort(flat, axis=0)
    below = jax.vmap(
        functools.partial(jnp.searchsorted, side="left"), in_axes=1, out_axes=1
    )(srt, flat)
    upto = jax.vmap(
        functools.partial(jnp.searchsorted, side="right"), in_axes=1, out_axes=1
    )(srt, flat)
    rank = (below + upto + 1).astype(x.dtype) / 2.0
    z = ndtri((rank - 0.375) / (flat.shape[0] + 0.25))
    return z.reshape(shape).astype(x.dtype)


def _ess_tail(x: Array) -> Array:
    """min over q in (0.05, 0.95) of the split ESS of ``x <= quantile_q``.

    The indicator of the quantile.
    """
    q = jnp.quantile(
        x, jnp.asarray([0.05, 0.95], x.dtype), axis=(0, 1)
    )  # (2, *E), type 7 (ArviZ's)
    low = _ess_core(_split_chains((x <= q[0]).astype(x.dtype)))
    high = _ess_core(_split_chains((x <= q[1]).astype(x.dtype)))
    return jnp.where(_constant(x), jnp.nan, jnp.minimum(low, high))


@functools.partial(jax.jit, static_argnames=("method",))
def _ess_by_method(x: Array, method: str) -> Array:
    if method == "identity":
        return _ess_core(x)
    if method == "mean":
        return _ess_core(_split_chains(x))
    if method == "bulk":
        return jnp.where(_constant(x), jnp.nan, _ess_core(_z_scale(_split_chains(x))))
    return _ess_tail(x)


# --------------------------------------------------------------------------
# Effective sample size.
# --------------------------------------------------------------------------


def effective_sample_size(
    samples: ArrayLike,
    chain_axis: int | None = None,
    sample_axis: int | None = None,
    *,
    method: str = "identity",
) -> Array:
    r"""Multi-chain effective sample size, per coordinate.

    Estimator of Vehtari et al. (2021) / Stan. For each coordinate, with
    :math:`M` chains of :math:`N` draws:

    1. Per-chain biased autocovariance, computed by FFT,
       :math:`\hat\gamma_{c}(t) = \frac1N \sum_{s=0}^{N-1-t}
       (x_{c,s}-\bar x_c)(x_{c,s+t}-\bar x_c)`.
    2. Within-chain variance :math:`W = \frac{1}{M}\sum_c \hat\gamma_c(0)
       \frac{N}{N-1}`, variance of the chain means
       :math:`B/N = \operatorname{var}_c(\bar x_c)` (ddof 1; zero when
       :math:`M = 1`) and :math:`\widehat{\operatorname{var}}^+ =
       \frac{N-1}{N} W + B/N`.
    3. Combined autocorrelation :math:`\hat\rho_t = 1 - (W - \frac1M\sum_c
       \hat\gamma_c(t)) / \widehat{\operatorname{var}}^+`, :math:`\hat\rho_0=1`.
    4. Geyer's initial positive sequence on the pair sums
       :math:`P_k = \hat\rho_{2k} + \hat\rho_{2k+1}`, for
       :math:`2k - 1 < N - 3` as in ArviZ and Stan (truncate before the
       first :math:`P_k \le 0`), made monotone by a running minimum
       (``lax.cummin``; no Python loop over lags).
    5. :math:`\hat\tau = -1 + 2\sum_{k<K^\ast} \min_{j\le k} P_j +
       \max(\hat\rho_{2K^\ast}, 0)` (when no pair is rejected, the last one
       examined, :math:`K^\ast`, contributes its :math:`\hat\rho_{2K^\ast}`
       unclipped), floored at :math:`1/\log_{10}(MN)`, and
       :math:`\widehat{\mathrm{ESS}} = MN / \hat\tau`.

    ``method`` says what the steps are applied to (ArviZ's names and
    definitions, Vehtari et al. 2021 §3-4):

    * ``"identity"`` (default): the draws as given;
    * ``"mean"``: split chains (each chain cut in two halves, the middle draw
      dropped when ``N`` is odd) — the ESS of the mean;
    * ``"bulk"``: split chains, rank-normalised: every value replaced by
      :math:`\Phi^{-1}((r - 3/8)/(S + 1/4))`, ``r`` its average rank among
      all ``S`` values of the coordinate;
    * ``"tail"``: the smaller of the split ESS of the indicators
      :math:`I(x \le q_{0.05})` and :math:`I(x \le q_{0.95})` (type-7
      quantiles over all draws).

    Args:
      samples: a :class:`~cenlmc_jax.run.RunResult` (its trace, put chains
        first), or an array ``(num_chains, num_samples, *event_shape)`` (or
        another layout described by the axis arguments), at least 4 draws per
        chain.
      chain_axis: axis indexing chains (default 0; stating it skips the
        layout check).
      sample_axis: axis indexing draws within a chain (default 1).
      method: one of :data:`ESS_METHODS` (static under ``jit``).

    Returns:
      Array of shape ``event_shape`` with the ESS of each coordinate, in the
      floating dtype of ``samples``.  Constant coordinates give ``nan`` (ArviZ
      returns the number of draws there).  For antithetic chains the ESS can
      exceed the number of draws (it is capped at :math:`MN\log_{10}(MN)`);
      an excess beyond sampling noise raises a :class:`~.layout.LayoutWarning`.

    Raises:
      ValueError: if ``samples`` has fewer than 2 dimensions, the axes are
        invalid or equal, there are fewer than 4 draws per chain, or
        ``method`` is unknown.
    """
    check_choice(method, "method", ESS_METHODS)
    x, from_array = checked_chains_first(
        samples,
        chain_axis,
        sample_axis,
        min_draws=4,
        why=" to estimate autocorrelations",
    )
    ess = _ess_by_method(x, method)
    if from_array:
        check_ess(
            ess, x.shape[0] * x.shape[1], f"effective_sample_size (method={method!r})"
        )
    return ess


@functools.partial(jax.jit, static_argnames=("max_lag",))
def _autocorrelation_core(x: Array, max_lag: int) -> Array:
    return jnp.where(
        _constant(x), jnp.nan, _combined_autocorrelation(x)[: max_lag + 1]
    ).astype(x.dtype)


def autocorrelation(
    samples: ArrayLike,
    chain_axis: int | None = None,
    sample_axis: int | None = None,
    *,
    max_lag: int | None = None,
) -> Array:
    r"""The multi-chain autocorrelation :math:`\hat\rho_t`, per lag and coordinate.

    Step 3 of :func:`effective_sample_size`: :math:`\hat\rho_t = 1 - (W -
    \frac1M\sum_c \hat\gamma_c(t)) / \widehat{\operatorname{var}}^+` for
    :math:`t = 0 .. \text{max\_lag}` (default ``min(N - 1, 100)``), so
    :math:`\hat\rho_0 = 1`. Shape ``(max_lag + 1, *event_shape)``;
    constant coordinates give ``nan``. Same inputs as
    :func:`effective_sample_size`.

    Args:
      samples: the draws, at least 2 per chain; with the default axes
        ``(chains, draws, *event_shape)``.
      chain_axis: the axis of the chains (default 0; see
        :func:`effective_sample_size`).
      sample_axis: the axis of the draws (default 1).
      max_lag: the largest lag, in ``[0, N - 1]`` (default ``min(N - 1, 100)``).

    Returns:
      The autocorrelations, shape ``(max_lag + 1, *event_shape)``.

    Raises:
      ValueError: bad axes, fewer than 2 draws, or ``max_lag`` out of range.
    """
    x, _ = checked_chains_first(
        samples, chain_axis, sample_axis, min_draws=2, why=" for an autocorrelation"
    )
    n = x.shape[1]
    max_lag = (
        min(n - 1, 100)
        if max_lag is None
        else check_int(
            max_lag,
            "max_lag",
            minimum=0,
            maximum=n - 1,
            why=f"the chains have {n} draws",
        )
    )
    return _autocorrelation_core(x, max_lag)


# --------------------------------------------------------------------------
# R-hat.
# --------------------------------------------------------------------------


def _rhat_plain(x: Array) -> Array:
    n = x.shape[1]
    chain_mean = jnp.mean(x, axis=1)
    chain_var = jnp.var(x, axis=1, ddof=1)
    between_over_n = jnp.var(chain_mean, axis=0, ddof=1)
    within = jnp.mean(chain_var, axis=0)
    var_plus = within * ((n - 1.0) / n) + between_over_n
    return jnp.sqrt(var_plus / within)


@functools.partial(jax.jit, static_argnames=("split", "rank"))
def _rhat_core(x: Array, split: bool, rank: bool = False) -> Array:
    constant = _constant(x)
    if split:
        x = _split_chains(x)
    if rank:
        bulk = _rhat_plain(_z_scale(x))
        folded = _rhat_plain(_z_scale(jnp.abs(x - jnp.median(x, axis=(0, 1)))))
        rhat = jnp.maximum(bulk, folded)
    else:
        rhat = _rhat_plain(x)
    # A constant coordinate has W = B = 0: R-hat is undefined (rounding would give 1.2
    # or inf).
    return jnp.where(constant, jnp.nan, rhat).astype(x.dtype)


def potential_scale_reduction(
    samples: ArrayLike,
    chain_axis: int | None = None,
    sample_axis: int | None = None,
    split: bool = True,
    *,
    rank: bool = False,
) -> Array:
    r"""(Split, rank-normalised) potential scale reduction factor :math:`\hat R`, per
    coordinate.

    With ``split=True`` each chain is cut into a first and second half (the
    middle draw is dropped when the number of draws is odd), giving
    :math:`M` chains of :math:`N` draws.  Then, per coordinate,

    .. math::
        W = \frac1M \sum_c s_c^2, \qquad
        \frac{B}{N} = \frac{1}{M-1} \sum_c (\bar x_c - \bar x)^2, \qquad
        \hat R = \sqrt{\frac{\frac{N-1}{N} W + \frac{B}{N}}{W}},

    with :math:`s_c^2` the ddof-1 variance of chain :math:`c`.  With
    ``rank=True`` (Vehtari et al. 2021, eq. 14-16; ArviZ's default "rank"
    R-hat) this is computed twice, on the rank-normalised (half-)chains (bulk)
    and on the rank-normalised folded values :math:`|x - \operatorname{median}(x)|`
    (tails), and the larger is returned. Values close to 1 indicate agreement
    between (half-)chains; a common threshold for concern is :math:`\hat R > 1.01`.

    Args:
      samples: a :class:`~cenlmc_jax.run.RunResult` or an array
        ``(num_chains, num_samples, *event_shape)`` (or another layout
        described by the axis arguments).
      chain_axis: axis indexing chains (default 0).
      sample_axis: axis indexing draws within a chain (default 1).
      split: whether to split chains in halves (a Python bool; static under ``jit``).
      rank: rank-normalised bulk/tail R-hat (keyword-only; static under ``jit``).

    Returns:
      Array of shape ``event_shape``.  Constant coordinates give ``nan``
      (chains that are each constant but differ give ``inf``).

    Raises:
      ValueError: for invalid axes, fewer than 4 draws per chain with
        ``split=True`` (each half needs 2 draws for a variance), fewer than 2
        draws or fewer than 2 chains with ``split=False``.
    """
    split = check_bool(split, "split")
    rank = check_bool(rank, "rank")
    if split:
        x, _ = checked_chains_first(
            samples,
            chain_axis,
            sample_axis,
            min_draws=4,
            why=" for split R-hat (each half-chain needs 2 draws)",
        )
    else:
        x, _ = checked_chains_first(
            samples,
            chain_axis,
            sample_axis,
            min_draws=2,
            min_chains=2,
            why=" for R-hat without splitting",
        )
    return _rhat_core(x, split, rank)


# --------------------------------------------------------------------------
# Monte-Carlo standard errors.
# --------------------------------------------------------------------------


@functools.partial(jax.jit, static_argnames=("statistic", "split"))
def _mcse_core(x: Array, statistic: str = "mean", split: bool = False) -> Array:
    m, n = x.shape[0], x.shape[1]
    if statistic == "mean":
        flat = x.reshape((m * n,) + x.shape[2:])
        ess = _ess_core(_split_chains(x) if split else x)
        return (jnp.std(flat, axis=0, ddof=1) / jnp.sqrt(ess)).astype(x.dtype)
    sq = (x - jnp.mean(x, axis=(0, 1))) ** 2
    ess = _ess_core(_split_chains(sq) if split else sq)
    evar = jnp.mean(sq, axis=(0, 1))
    var_of_var = (jnp.mean(sq * sq, axis=(0, 1)) - evar**2) / ess
    return jnp.sqrt(var_of_var / evar / 4.0).astype(x.dtype)


def mcse(
    samples: ArrayLike,
    chain_axis: int | None = None,
    sample_axis: int | None = None,
    *,
    statistic: str = "mean",
    split: bool = False,
) -> Array:
    r"""Monte-Carlo standard error of the posterior mean or sd estimate, per coordinate.

    ``statistic="mean"``:

    .. math::
        \mathrm{MCSE}(\bar x) = \frac{\hat\sigma}{\sqrt{\widehat{\mathrm{ESS}}}},

    where :math:`\hat\sigma` is the ddof-1 standard deviation of all
    :math:`MN` draws pooled over chains and :math:`\widehat{\mathrm{ESS}}`
    is :func:`effective_sample_size`.  :math:`\bar x` is the mean of all
    draws.

    ``statistic="sd"`` (the delta method on :math:`s^2`, as ArviZ): with
    :math:`u = (x - \bar x)^2`, :math:`\bar u` its mean and
    :math:`\widehat{\mathrm{ESS}}_u` the ESS of :math:`u`,
    :math:`\mathrm{MCSE}(s) = \sqrt{(\overline{u^2} - \bar u^2) /
    \widehat{\mathrm{ESS}}_u / (4 \bar u)}`.

    ``split=True`` uses the split-chain ESS (``method="mean"``): this is
    ArviZ's ``mcse`` (and its summary's ``mcse_mean``, ``mcse_sd``);
    ``split=False`` (default) the plain one.

    Args:
      samples: a :class:`~cenlmc_jax.run.RunResult` or an array
        ``(num_chains, num_samples, *event_shape)`` (or another layout
        described by the axis arguments), at least 4 draws per chain.
      chain_axis: axis indexing chains (default 0).
      sample_axis: axis indexing draws within a chain (default 1).
      statistic: ``"mean"`` or ``"sd"`` (static under ``jit``).
      split: use split chains for the ESS (static under ``jit``).

    Returns:
      Array of shape ``event_shape``; ``nan`` for constant coordinates.

    Raises:
      ValueError: as for :func:`effective_sample_size`, or a bad ``statistic``.
    """
    check_choice(statistic, "statistic", ("mean", "sd"))
    split = check_bool(split, "split")
    x, _ = checked_chains_first(
        samples,
        chain_axis,
        sample_axis,
        min_draws=4,
        why=" to estimate autocorrelations",
    )
    return _mcse_core(x, statistic, split)


# --------------------------------------------------------------------------
# Every column of a summary at once.
# --------------------------------------------------------------------------


def _average_ranks(x: np.ndarray) -> np.ndarray:
    """Average 1-based ranks of each coordinate's ``S = m n`` values, on the host.

    ``(m, n, K)``. The ranks of :func:`_z_scale` (``(#{< v} + #{<= v} + 1) / 2``
    is the average rank of the ties), by one NumPy sort per coordinate
    (``scipy.stats.rankdata``): faster than XLA's CPU sort (issue 17;
    benchmarks/results/summary.md).
    """
    # imported here: scipy.stats takes ~0.6 s to import, and a streamed run (the CLI's
    # default job) never ranks draws
    from scipy.stats import rankdata

    flat = x.reshape(x.shape[0] * x.shape[1], -1)
    return rankdata(flat, method="average", axis=0).reshape(x.shape)


@jax.jit
def _summary_core(
    x: Array, rank_bulk: Array, rank_folded: Array, quantiles: Array
) -> dict:
    """The ESS, R-hat and MCSE columns from the draws ``x (m, n, K)``.

    And host-side ranks and quantiles.

    ``rank_bulk``, ``rank_folded``: the average ranks of
    the split chains and of their folded values ``|x - median|``
    (:func:`_average_ranks`); ``quantiles (2, K)``: the 5% and 95% type-7
    quantiles. Every split-chain ESS (of ``x``, of ``sq``, of the bulk
    z-scores, of the two tail indicators) is one :func:`_ess_core` over the
    stacked coordinates. The same formulas as :func:`mcse`,
    :func:`effective_sample_size` and :func:`potential_scale_reduction`
    (Vehtari et al. 2021, eq. 14-16), so equal to them to rounding.
    """
    k = x.shape[2]
    # for the sd's MCSE (delta method on s²)
    sq = (x - jnp.mean(x, axis=(0, 1))) ** 2
    constant = _constant(x)
    size = rank_bulk.shape[0] * rank_bulk.shape[1] + 0.25
    z_bulk, z_folded = (
        ndtri((rank_bulk - 0.375) / size),
        ndtri((rank_folded - 0.375) / size),
    )
    low, high = ((x <= q).astype(x.dtype) for q in quantiles)
    stacked = jnp.concatenate(
        [_split_chains(v) for v in (x, sq, low, high)] + [z_bulk], axis=2
    )
    ess = _ess_core(stacked).reshape(5, k)
    flat_sd = jnp.std(x.reshape(-1, k), axis=0, ddof=1)
    evar = jnp.mean(sq, axis=(0, 1))
    var_of_var = (jnp.mean(sq * sq, axis=(0, 1)) - evar**2) / ess[1]
    rhat = jnp.maximum(_rhat_plain(z_bulk), _rhat_plain(z_folded))
    nan = jnp.asarray(jnp.nan, x.dtype)
    return {
        "mcse_mean": flat_sd / jnp.sqrt(ess[0]),
        "mcse_sd": jnp.sqrt(var_of_var / evar / 4.0),
        "ess_bulk": jnp.where(constant, nan, ess[4]),
        "ess_tail": jnp.where(constant, nan, jnp.minimum(ess[2], ess[3])),
        "r_hat": jnp.where(constant, nan, rhat),
    }


def summary_diagnostics(x: np.ndarray) -> dict:
    """``mcse_mean``, ``mcse_sd`` (split), ``ess_bulk``, ``ess_tail`` and ``r_hat``.

    What :func:`cenlmc_jax.diagnostics.summary` shows, as :func:`mcse`
    (``split=True``), :func:`effective_sample_size` (``"bulk"``, ``"tail"``) and
    :func:`potential_scale_reduction` (``rank=True``) compute them, but with the
    ranks sorted once per coordinate on the host (the split chains' ranks serve
    both the bulk ESS and the bulk R-hat) and one compiled function per shape
    (issue 17; benchmarks/results/summary.md). Call it with x64 enabled (the
    summary does).

    Args:
      x: the draws, shape ``(m, n, K)``: chains, draws, coordinates; float64.

    Returns:
      ``{column: (K,) NumPy float64 array}`` for the five columns.
    """
    x = np.asarray(x, np.float64)
    half = x.shape[1] // 2
    # as _split_chains
    split = np.concatenate([x[:, :half], x[:, x.shape[1] - half :]], axis=0)
    folded = np.abs(split - np.median(split, axis=(0, 1)))
    quantiles = np.quantile(x, (0.05, 0.95), axis=(0, 1))
    out = _summary_core(x, _average_ranks(split), _average_ranks(folded), quantiles)
    return {key: np.asarray(v, np.float64) for key, v in out.items()}
