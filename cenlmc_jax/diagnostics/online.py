r"""Split R-hat and ESS of a streamed run, accumulated as it goes, and the step-halving
bias check of unadjusted samplers.

``cj.sample(..., mode="stream")`` keeps no draws, so the trace estimators of
:mod:`cenlmc_jax.diagnostics.chains` cannot run on it. This module accumulates, in
the driver's ``lax.scan`` carry, what split R-hat and a batch-means ESS need, per
chain (or particle) ``c`` and coordinate, of ``y = (x, x²)``:

* for each half of the run (the split chains of Vehtari et al. 2021: the first and
  the last ``n_h = n // 2`` kept draws, the middle one dropped when ``n`` is odd), a
  Welford mean and sum of squared deviations;
* the running mean of the current batch of ``m`` draws, and a Welford mean and sum
  of squares of the chain's finished batch means (``b`` batches per half, ``2b``
  per chain; ``m = n_h // b``, the ``n_h - b m`` last draws of a half in no batch).

Memory: ``7`` arrays ``(rows, 2d)``, O(N d) whatever the run's length (the batches'
means are folded as they finish, so ``b`` costs nothing). :func:`finish` then gives
a :class:`StreamDiagnostics`:

* **split R-hat** (:math:`\hat R = \sqrt{\widehat{\mathrm{var}}^+/W}` on the ``2C``
  half-chains, the ``rank=False`` value of
  :func:`~cenlmc_jax.diagnostics.potential_scale_reduction`: equal to it up to
  rounding, ``tests/diagnostics/test_online.py``). Not rank-normalised (ranks need
  every draw), so it is the classic R-hat of ``x`` and of ``x²`` (``x²`` stands in
  for the folded R-hat: chains that agree on the mean but not on the spread).
* **batch-means ESS**: with the ``C·2b`` batch means :math:`\bar y_{cb}` about the
  grand mean,
  :math:`S^2 = \frac{1}{2bC - 1}\sum_{c,b} (\bar y_{cb} - \bar y)^2`, the
  integrated autocorrelation time is :math:`\hat\tau = m S^2 /
  \widehat{\mathrm{var}}^+` and :math:`\widehat{\mathrm{ESS}} = C\,2n_h/\hat\tau`
  (capped as Stan: :math:`\hat\tau \ge 1/\log_{10}(C\,2n_h)`). Chains stuck apart
  put their disagreement in :math:`S^2` (batch means about the grand mean, not the
  chain's): their ESS is small, as Stan's multi-chain ESS.

Batch means see the autocorrelation up to lags of about ``m``: for an AR(1) with
``τ`` they give ``τ (1 - O(τ / m))``. The batches are therefore few and long:
``b = 2`` per half for 8 chains or more (the chains supply the degrees of freedom,
``4C - 1``), up to 16 per half for one chain (:func:`batches_per_half`). A run
with ``n_h`` below ``~10 τ`` has its ESS overestimated (it is a short run: its
R-hat then says so, ``R ≈ sqrt(1 + 1 / ESS_half)``).

:func:`stream_problems` words the checks as
:func:`~cenlmc_jax.diagnostics.convergence.convergence_problems` does for a trace
(``R-hat > rhat_max``, ``ESS < min(100 per chain, 400)``);
:func:`step_halving_bias` compares the moments of an unadjusted sampler at ``h``
and ``h / 2`` (module section below).
"""

from __future__ import annotations

import math
import statistics
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from cenlmc_jax.diagnostics.convergence import MIN_DRAWS, ess_floor
from cenlmc_jax.diagnostics.layout import chains_first
from cenlmc_jax.types import Array

__all__ = [
    "OnlineAccumulator",
    "StreamDiagnostics",
    "StepHalvingBias",
    "batches_per_half",
    "plan",
    "init",
    "update",
    "finish",
    "from_draws",
    "stream_problems",
    "bonferroni_z",
    "moments_and_se",
    "bias_problems",
]


class OnlineAccumulator(NamedTuple):
    """The scan carry of the online diagnostics (module docstring), of ``y = (x, x²)``.

    Attributes:
      count: kept draws seen, ``()`` int32.
      half_mean: ``(2, rows, 2d)`` Welford mean per half-chain.
      half_m2: ``(2, rows, 2d)`` sum of squared deviations per half-chain.
      batch_mean: ``(rows, 2d)`` running mean of the current batch.
      batches_mean: ``(rows, 2d)`` Welford mean of the chain's finished batch means.
      batches_m2: ``(rows, 2d)`` their sum of squared deviations.
      plan: ``(4,)`` int32 ``(n, n_h, m, b)``: kept draws, draws per half, batch
        size, batches per half (traced: one compiled chunk serves any run length).
    """

    count: Array
    half_mean: Array
    half_m2: Array
    batch_mean: Array
    batches_mean: Array
    batches_m2: Array
    plan: Array


class StreamDiagnostics(NamedTuple):
    """Split R-hat, ESS and standard errors of a streamed run, per coordinate ``(d,)``.

    Attributes:
      rhat: split R-hat of ``x`` (classic, not rank-normalised; module docstring).
      ess: batch-means ESS of the mean of ``x``, all chains together.
      mcse_mean: Monte-Carlo standard error of the mean of ``x``,
        ``sqrt(var+ / ess)``.
      rhat_sq: split R-hat of ``x²``.
      ess_sq: batch-means ESS of the mean of ``x²``.
      mean_sq: the mean of ``x²`` over the two halves' draws.
      mcse_sq: its standard error.
      num_chains: chains or particles (rows of ``trace_fn``'s output).
      num_draws: kept draws per chain.
      batch_size: ``m``, draws per batch.
      num_batches: batches per chain (``2b``).
      half_mean: ``(2, chains, 2 d)`` the accumulator's mean of ``y = (x, x²)`` per
        half-chain (what nested R-hat needs:
        :func:`cenlmc_jax.diagnostics.nested.stream_chain_stats`).
      half_m2: ``(2, chains, 2 d)`` its sums of squared deviations.
    """

    rhat: Array
    ess: Array
    mcse_mean: Array
    rhat_sq: Array
    ess_sq: Array
    mean_sq: Array
    mcse_sq: Array
    num_chains: int
    num_draws: int
    batch_size: int
    num_batches: int
    half_mean: Any = None
    half_m2: Any = None


def batches_per_half(num_chains: int) -> int:
    """``b``: 2 per half from 8 chains on, up to 16 for one chain (``ceil(16 / C)``).

    The pooled batch means have ``2bC - 1`` degrees of freedom: at least 31 for any
    ``C``, while each batch stays as long as the chains allow (module docstring).

    Args:
      num_chains: chains or particles ``C``.

    Returns:
      ``b``, an int in ``[2, 16]``.
    """
    return int(min(16, max(2, math.ceil(16 / max(int(num_chains), 1)))))


def plan(num_draws: int, num_chains: int, num_batches: int | None = None) -> tuple:
    """``(n, n_h, m, b)`` for ``num_draws`` kept draws of ``num_chains`` chains.

    Args:
      num_draws: kept draws per chain ``n``.
      num_chains: chains or particles.
      num_batches: batches per half ``b`` (default :func:`batches_per_half`); fewer
        when a half has fewer draws.

    Returns:
      Four Python ints.

    Raises:
      ValueError: ``num_batches`` not an int >= 1.
    """
    b = batches_per_half(num_chains) if num_batches is None else num_batches
    if isinstance(b, bool) or not isinstance(b, (int, np.integer)) or b < 1:
        raise ValueError(f"num_batches must be an int >= 1; got {num_batches!r}.")
    half = int(num_draws) // 2
    b = max(1, min(int(b), half))
    return int(num_draws), half, max(half // b, 1), b


def _as_rows(x: Array) -> Array:
    """``x: (..., d)`` as ``y = (x, x²)``, ``(rows, 2d)``."""
    x = jnp.reshape(x, (-1, x.shape[-1]))
    return jnp.concatenate([x, x * x], axis=-1)


def init(x: Array, run_plan: tuple) -> OnlineAccumulator:
    """Empty accumulators for draws shaped as ``x: (..., d)``.

    Args:
      x: one draw, ``(..., d)``: the leading axes are the chains (flattened).
      run_plan: the run's :func:`plan`.

    Returns:
      An :class:`OnlineAccumulator` of zeros.
    """
    return _init(
        x, tuple(v if isinstance(v, jax.core.Tracer) else int(v) for v in run_plan)
    )


@jax.jit
def _init(x: Array, run_plan: tuple) -> OnlineAccumulator:
    y = _as_rows(x)
    zeros = jnp.zeros(y.shape, y.dtype)
    return OnlineAccumulator(
        jnp.zeros((), jnp.int32),
        jnp.zeros((2,) + y.shape, y.dtype),
        jnp.zeros((2,) + y.shape, y.dtype),
        zeros,
        zeros,
        zeros,
        jnp.asarray(run_plan, jnp.int32),
    )


def update(acc: OnlineAccumulator, x: Array) -> OnlineAccumulator:
    """Fold one kept draw into the accumulators (jittable: masks, no branch).

    Args:
      acc: the accumulators so far.
      x: the draw, ``(..., d)``, shaped as :func:`init`'s.

    Returns:
      The accumulators with ``x`` folded in.
    """
    y = _as_rows(x).astype(acc.half_mean.dtype)
    n, half, m, b = (acc.plan[i] for i in range(4))
    k = acc.count
    second = k >= n - half
    active = (k < half) | (second & (k < n))
    pos = jnp.where(second, k - (n - half), k)  # index within its half
    # Welford per half-chain: only the half the draw is in moves
    sel = (jnp.arange(2) == second.astype(jnp.int32)) & active
    sel = sel[:, None, None]
    delta = y - acc.half_mean
    half_mean = acc.half_mean + jnp.where(sel, delta / (pos + 1).astype(y.dtype), 0)
    half_m2 = acc.half_m2 + jnp.where(sel, delta * (y - half_mean), 0)
    # the current batch, and the chain's finished batch means
    q, r = pos // m, pos % m
    in_batch = active & (q < b)
    running = jnp.where(
        r == 0, y, acc.batch_mean + (y - acc.batch_mean) / (r + 1).astype(y.dtype)
    )
    batch_mean = jnp.where(in_batch, running, acc.batch_mean)
    done = in_batch & (r == m - 1)
    finished = (second.astype(jnp.int32) * b + q).astype(y.dtype)  # batches before
    d_b = batch_mean - acc.batches_mean
    batches_mean = acc.batches_mean + jnp.where(done, d_b / (finished + 1), 0)
    batches_m2 = acc.batches_m2 + jnp.where(done, d_b * (batch_mean - batches_mean), 0)
    return OnlineAccumulator(
        k + 1, half_mean, half_m2, batch_mean, batches_mean, batches_m2, acc.plan
    )


def finish(acc: OnlineAccumulator, run_plan: tuple) -> StreamDiagnostics | None:
    """The diagnostics of a complete run (``acc.count == n``; None with fewer than
    :data:`~cenlmc_jax.diagnostics.convergence.MIN_DRAWS` kept draws per chain).

    Jittable (the count is not checked here: the driver passes only complete runs).

    Args:
      acc: the accumulators after the run's last kept draw.
      run_plan: the same :func:`plan` as :func:`init`'s, as Python ints.

    Returns:
      A :class:`StreamDiagnostics`, or None.
    """
    n, half, m, b = run_plan
    if n < MIN_DRAWS:
        return None
    rows = acc.half_mean.shape[1]
    # the plan's numbers as traced Python scalars (weakly typed, as they were in
    # eager arithmetic): one compiled program serves every run length
    total = 2.0 * half * rows
    scalars = (
        half - 1.0,
        (half - 1.0) / half,
        2.0 * b,
        2.0 * b * rows - 1.0,
        float(m),
        total,
        1.0 / math.log10(max(total, 10.0)),
    )
    return StreamDiagnostics(
        *_finish_arrays(acc, scalars),
        int(rows),
        int(n),
        int(m),
        int(2 * b),
        acc.half_mean,
        acc.half_m2,
    )


@jax.jit
def _finish_arrays(acc: OnlineAccumulator, scalars: tuple) -> tuple:
    """:func:`finish`'s R-hat, ESS and MCSE of ``x``, then R-hat, ESS, mean and MCSE of
    ``x²`` (the first seven fields of :class:`StreamDiagnostics`): one compiled
    program (eagerly, each operation or slice would be a program of its own).
    ``scalars``: :func:`finish`'s numbers of the plan.
    """
    half_less_1, half_ratio, two_b, s2_denominator, m, total, tau_floor = scalars
    dtype = acc.half_mean.dtype
    rows, two_d = acc.half_mean.shape[1], acc.half_mean.shape[2]
    mean = acc.half_mean.reshape(2 * rows, two_d)
    within = jnp.mean(acc.half_m2.reshape(2 * rows, two_d), axis=0) / half_less_1
    var_plus = within * half_ratio + jnp.var(mean, axis=0, ddof=1)
    rhat = jnp.sqrt(var_plus / within)
    grand = jnp.mean(acc.batches_mean, axis=0)
    spread = jnp.sum(acc.batches_m2, axis=0) + two_b * jnp.sum(
        (acc.batches_mean - grand) ** 2, axis=0
    )
    s2 = spread / s2_denominator
    tau = jnp.maximum(m * s2 / var_plus, tau_floor)
    constant = within == 0  # W = B = 0: undefined, as the trace estimators say (NaN)
    ess = jnp.where(constant, jnp.nan, total / tau).astype(dtype)
    rhat = jnp.where(constant, jnp.nan, rhat).astype(dtype)
    mcse = jnp.sqrt(var_plus / ess).astype(dtype)
    mean = jnp.mean(mean, axis=0).astype(dtype)
    d = two_d // 2
    return rhat[:d], ess[:d], mcse[:d], rhat[d:], ess[d:], mean[d:], mcse[d:]


def from_draws(draws: Any, num_batches: int | None = None) -> StreamDiagnostics | None:
    """:class:`StreamDiagnostics` of kept draws, chains first ``(chains, n, d)``.

    The streamed computation run over a trace (one ``lax.scan``): what a
    ``mode="stream"`` run of the same draws reports.

    Args:
      draws: ``(chains, n, d)``; ``(n, d)`` is one chain.
      num_batches: batches per half (default :func:`batches_per_half`).

    Returns:
      The diagnostics, or None with fewer than 4 draws per chain.

    Raises:
      ValueError: ``draws`` not 2- or 3-dimensional.
    """
    draws = jnp.asarray(draws)
    if draws.ndim == 2:
        draws = draws[None]
    if draws.ndim != 3:
        raise ValueError(
            "draws must be chains first, (chains, draws, d) or (draws, d); got shape "
            f"{tuple(draws.shape)}."
        )
    run_plan = plan(draws.shape[1], draws.shape[0], num_batches)
    acc = init(draws[:, 0], run_plan)
    acc, _ = lax.scan(lambda a, x: (update(a, x), None), acc, jnp.swapaxes(draws, 0, 1))
    return finish(acc, run_plan)


def _label(k: int, labels: list | None) -> str:
    return str(labels[k]) if labels is not None and k < len(labels) else f"x[{k}]"


def stream_problems(
    diag: StreamDiagnostics | None,
    *,
    rhat_max: float,
    ess_min: float | None = None,
    labels: list | None = None,
) -> list:
    """Sentences for a streamed run's R-hat above ``rhat_max`` and ESS below the floor.

    The thresholds are the trace checks'
    (:func:`~cenlmc_jax.diagnostics.convergence.convergence_problems`): ``rhat_max``,
    and ``ess_min`` defaulting to ``min(100 per chain, 400)``. The R-hat checked is the
    larger of those of ``x`` and ``x²``, the ESS that of ``x``.

    Args:
      diag: the run's :class:`StreamDiagnostics` (None: nothing to check).
      rhat_max: the R-hat threshold.
      ess_min: the ESS floor (default :func:`~cenlmc_jax.diagnostics.convergence.
        ess_floor` of the chains).
      labels: coordinate names (default ``x[k]``).

    Returns:
      A list of sentences, empty if none.
    """
    if diag is None:
        return []
    shape = f"{diag.num_chains} chains or particles x {diag.num_draws} kept draws"
    out = []
    rhat = np.fmax(np.asarray(diag.rhat, np.float64), np.asarray(diag.rhat_sq))
    bad = np.flatnonzero(rhat > rhat_max)
    if bad.size:
        k = int(bad[np.argmax(rhat[bad])])
        which = "x²" if diag.rhat_sq[k] > diag.rhat[k] else "x"
        out.append(
            f"the split R-hat of {_label(k, labels)} is {rhat[k]:.3g} > {rhat_max:g} "
            f"({bad.size} of {rhat.size} coordinates above; of {which}, computed "
            f"online from the streamed halves; {shape}): the chains have not mixed, "
            "the estimates depend on where they started; run longer (more steps and "
            "burn-in) or retune the step size"
        )
    ess = np.asarray(diag.ess, np.float64)
    floor = ess_floor(diag.num_chains) if ess_min is None else ess_min
    low = np.flatnonzero(ess < floor)
    if low.size:
        k = int(low[np.argmin(ess[low])])
        out.append(
            f"the ESS of {_label(k, labels)} is {ess[k]:.3g} < {floor:g} ({low.size} "
            f"of {ess.size} coordinates below; the floor is min(100 per chain, 400); "
            f"batch means of {diag.batch_size} draws, computed online): too few "
            "effective draws for the R-hat and the standard errors to be trusted; "
            "run longer"
        )
    return out


# --------------------------------------------------------------------------
# The step-halving bias check of unadjusted samplers.
# --------------------------------------------------------------------------

#: e-folds of the slowest coordinate the ``h / 2`` run relaxes for before it records:
#: from the ``h``-stationary ensemble the residual of the ``O(h)`` difference is
#: ``e^{-5}``, under 1% of what is measured.
RELAX_EFOLDS = 5.0
#: The family-wise false-alarm rate of the bias check over its ``2d`` z-tests (the
#: mean and the second moment of each coordinate; Bonferroni).
BIAS_FALSE_ALARM = 0.01


class StepHalvingBias(NamedTuple):
    """The step-halving comparison of :func:`step_halving_bias`, per coordinate.

    Attributes:
      bias_mean: ``2 (m_h - m_{h/2})`` of ``E[x]``: the bias of the ``h`` run's mean
        (first order in ``h``).
      se_mean: its standard error, ``2 sqrt(se_h² + se_{h/2}²)``.
      bias_sq: the same for ``E[x²]``.
      se_sq: its standard error.
      z: the threshold: a coordinate is flagged when ``|bias| > z se``.
      step_size: ``h``.
      num_steps: recorded steps of the ``h / 2`` run.
      burn_in: its relaxation steps before recording.
      grad_evals: gradients it cost (``info.grad_evals`` when the sampler counts them,
        else one per chain or particle and step).
      result: its :class:`~cenlmc_jax.base.RunResult` (``mode="stream"``).
    """

    bias_mean: np.ndarray
    se_mean: np.ndarray
    bias_sq: np.ndarray
    se_sq: np.ndarray
    z: float
    step_size: float
    num_steps: int
    burn_in: int
    grad_evals: int
    result: Any

    @property
    def flagged(self) -> np.ndarray:
        """``(2, d)`` booleans: row 0 ``E[x]``, row 1 ``E[x²]``, ``|bias| > z se``."""
        return np.abs(np.stack([self.bias_mean, self.bias_sq])) > self.z * np.stack(
            [self.se_mean, self.se_sq]
        )


def bonferroni_z(num_tests: int, false_alarm: float = BIAS_FALSE_ALARM) -> float:
    """The two-sided z threshold of ``num_tests`` tests at a family-wise rate.

    Args:
      num_tests: the number of tests (at least 1 is counted).
      false_alarm: the family-wise false-alarm rate.

    Returns:
      ``Φ⁻¹(1 - false_alarm / (2 num_tests))``.
    """
    # the standard library's normal quantile (Wichura's AS241, full double precision),
    # so that the CLI does not import scipy.special for it
    p = false_alarm / (2.0 * max(int(num_tests), 1))
    return -statistics.NormalDist().inv_cdf(p)


def moments_and_se(res: Any, thin: int = 1) -> tuple | None:
    """``(mean of x, mean of x², their standard errors, τ_int in steps)`` of a
    ``cj.sample`` result: its streamed moments and online diagnostics, or its trace
    (None without either). ``τ_int``: the largest over ``x`` and ``x²``, times
    ``thin``.

    Args:
      res: a ``cj.sample`` result that recorded ``state.position``.
      thin: the run's ``thin`` (kept draws to steps).

    Returns:
      A 5-tuple, or None.
    """
    if getattr(res, "trace", None) is not None:
        draws = np.asarray(chains_first(res), np.float64)
        draws = draws.reshape(draws.shape[0], draws.shape[1], -1)
        diag = from_draws(draws)
        mean = draws.mean(axis=(0, 1))
        mean_sq = (draws**2).mean(axis=(0, 1))
    else:
        diag = getattr(res, "online", None)
        if res.moments is None or diag is None:
            return None
        mean = np.asarray(res.moments.mean, np.float64)
        mean_sq = np.asarray(res.moments.variance, np.float64) + mean**2
    if diag is None:
        return None
    total = diag.num_chains * diag.num_draws
    ess = np.concatenate([np.asarray(diag.ess), np.asarray(diag.ess_sq)])
    tau = float(np.nanmax(total / ess)) * thin if np.any(np.isfinite(ess)) else None
    return (
        mean,
        mean_sq,
        np.asarray(diag.mcse_mean, np.float64),
        np.asarray(diag.mcse_sq, np.float64),
        tau,
    )


def bias_problems(check: StepHalvingBias | None, labels: list | None = None) -> list:
    """One sentence naming the worst flagged coordinate of a step-halving check (an
    empty list when none is flagged).

    Args:
      check: :func:`step_halving_bias`'s result (None: nothing to report).
      labels: coordinate names (default ``x[k]``).

    Returns:
      A list of at most one sentence.
    """
    if check is None:
        return []
    flagged = check.flagged
    if not flagged.any():
        return []
    bias = np.stack([check.bias_mean, check.bias_sq])
    se = np.stack([check.se_mean, check.se_sq])
    score = np.where(flagged, np.abs(bias) / se, -np.inf)
    row, k = np.unravel_index(int(np.argmax(score)), score.shape)
    what = ("E[{}]", "E[{}²]")[row].format(_label(int(k), labels))
    return [
        f"step-size bias: halving h = {check.step_size:.4g} moves {what} by "
        f"{bias[row, k] / 2:.3g}, so its bias at h is about {bias[row, k]:.3g}, "
        f"{abs(bias[row, k]) / se[row, k]:.1f} standard errors ({se[row, k]:.3g}) > "
        f"z = {check.z:.2f} ({int(flagged.sum())} of {flagged.size} moments "
        "flagged): unadjusted Langevin's bias is proportional to h; lower "
        "--step-size"
    ]
