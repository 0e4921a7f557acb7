"""What a run produced, for people and for ArviZ: :func:`summary` and :func:`to_arviz`.

:func:`summary` takes a :class:`~cenlmc_jax.run.RunResult` (or chains-first
draws ``(chains, draws, *event)``) and returns a :class:`SummaryTable`: per
coordinate the mean, sd, their Monte-Carlo standard errors, bulk and tail
ESS, rank-normalised split R-hat and quantiles (the columns of NumPyro's
``print_summary`` and ArviZ's ``summary``, computed by
:mod:`cenlmc_jax.diagnostics` with ArviZ's definitions), plus the z-scores
against a known truth, and for the run the divergences and gradient
evaluations. Print it, or write it with :meth:`SummaryTable.to_csv`.

Streaming runs (``mode="stream"``) keep only the moments and the final
state; their summary says so and gives what can be known from that:

* mean and sd over all kept steps and particles (the streamed moments);
* standard errors that are **upper bounds**: an average over ``T`` kept
  steps of per-step ensemble means (each with variance ``σ²/N``, for nearly
  independent particles) has variance at most ``σ²/N`` whatever the
  correlation between steps (Cauchy–Schwarz), so ``mcse_mean <= sd/sqrt(N)``;
  likewise ``mcse_sd <= sqrt((m4 - s⁴)/N) / (2s)`` with the fourth central
  moment ``m4`` of the final ensemble;
* quantiles of the final ensemble; no ESS and no R-hat (``nan``).

Chains that come in superchains (``K`` blocks of ``M`` chains sharing a start:
``cj.langevin_warmup``'s hand-over, many short chains) get one more column,
``nested_r_hat``: nested R-hat (Margossian et al.;
:func:`cenlmc_jax.diagnostics.nested.nested_rhat`), whose question is whether the
chains forgot their starts, not whether each crossed the posterior. It is computed
from the draws, or for a streaming run from its online per-chain moments. ``r_hat``
stays (few long chains; ArviZ's column).

:func:`to_arviz` needs the optional ArviZ (``pip install "cenlmc_jax[arviz]"``).
"""

from __future__ import annotations

import csv
import importlib.metadata
import json
import math
import warnings
from typing import Any, NamedTuple

import jax
import numpy as np

from cenlmc_jax._host import fetch
from cenlmc_jax.base import RunResult
from cenlmc_jax.diagnostics import nested
from cenlmc_jax.diagnostics.layout import chains_first
from cenlmc_jax.diagnostics.named_draws import (
    flatten_sites,
    resolve_constrain,
    site_draws,
)

__all__ = ["SummaryTable", "summary", "to_arviz", "QUANTILES", "STAT_FIELDS"]

#: Quantile levels of the table (NumPyro's 5%, median, 95%).
QUANTILES = (0.05, 0.5, 0.95)
#: Info fields exported per step when a sampler has them.
STAT_FIELDS = ("diverged", "grad_evals", "acceptance_rate", "ensemble_fraction")
_STREAM_NOTE = (
    "streaming run (mode='stream'): moments only. mean and sd are over all kept "
    "steps and particles; mcse_mean and mcse_sd are upper bounds from the final "
    "ensemble (sd/sqrt(N)); quantiles are of the final ensemble; the split R-hat "
    "and ESS of a streamed run are computed online (RunResult.online; the CLI's "
    "verdict checks them), not shown per column here"
)


def _version() -> str:
    try:
        return importlib.metadata.version("cenlmc_jax")
    except (
        importlib.metadata.PackageNotFoundError
    ):  # pragma: no cover - running from a source tree
        return "unknown"


# --------------------------------------------------------------------------
# The table.
# --------------------------------------------------------------------------


def _fmt(name: str, value: float) -> str:
    if value is None or not np.isfinite(value):
        return (
            "nan"
            if value is None or np.isnan(value)
            else ("inf" if value > 0 else "-inf")
        )
    if name.startswith("ess"):
        return f"{value:.0f}"
    if name in ("r_hat", "nested_r_hat"):
        return f"{value:.3f}"
    if name.startswith("z"):
        return f"{value:.2f}"
    return (
        f"{value:.4g}"
        if abs(value) >= 1e4 or (value != 0 and abs(value) < 1e-3)
        else f"{value:.4f}"
    )


class SummaryTable(NamedTuple):
    """A run's summary (see :func:`summary`). ``str(table)`` prints it.

    labels: one name per coordinate, ``("x[0]", "x[1]", ...)``.
    columns: ``{column name: (num_coordinates,) float64 array}``, in display order.
    run: run-level figures (``num_chains``, ``num_draws``, ``divergences``,
        ``grad_evals``, ...; absent when unknown).
    notes: sentences that qualify the numbers (streaming, warnings).
    """

    labels: tuple
    columns: dict
    run: dict
    notes: tuple = ()

    def format(self, max_rows: int | None = 30, footer: bool = True) -> str:
        """The table as text (at most ``max_rows`` coordinates; ``None``: all), then the
        run figures and notes.

        Columns that are ``nan`` for every coordinate are left out (the CSV keeps them);
        ``footer=False`` leaves out the run figures (not the notes).
        """
        # columns with no value at all (a streaming run's ESS and R-hat) are left out of
        # the text
        names = [
            n
            for n in self.columns
            if not np.all(np.isnan(np.asarray(self.columns[n], np.float64)))
        ]
        rows = list(range(len(self.labels)))
        hidden = 0
        if max_rows is not None and len(rows) > max_rows:
            hidden = len(rows) - max_rows
            rows = rows[:max_rows]
        cells = [[_fmt(n, float(self.columns[n][i])) for n in names] for i in rows]
        label_w = max([len(str(self.labels[i])) for i in rows] + [4])
        widths = [
            max([len(n)] + [len(c[j]) for c in cells]) for j, n in enumerate(names)
        ]
        lines = [
            " " * label_w
            + "  "
            + "  ".join(n.rjust(w) for n, w in zip(names, widths, strict=True))
        ]
        for i, c in zip(rows, cells, strict=True):
            lines.append(
                str(self.labels[i]).rjust(label_w)
                + "  "
                + "  ".join(v.rjust(w) for v, w in zip(c, widths, strict=True))
            )
        if hidden:
            lines.append(
                f"... {hidden} more coordinates (SummaryTable.format(max_rows=None) "
                "shows all)"
            )
        lines += self._footer() if footer else []
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)

    def _footer(self) -> list:
        run, lines = self.run, []
        facts = []
        if "stream_count" in run:
            facts.append(
                f"moments over {run['stream_count']:,.0f} values (kept steps x "
                f"particles); final ensemble of {run.get('num_chains', 0)}"
            )
        elif "num_chains" in run:
            facts.append(
                f"{run['num_chains']} chains or particles x {run['num_draws']} draws"
            )
        if "num_steps_done" in run:
            facts.append(f"{run['num_steps_done']} steps")
        if facts:
            lines.append("; ".join(facts))
        if "divergences" in run:
            at = (
                f" (first at step {run['diverged_at']})"
                if run.get("diverged_at", -1) >= 0
                else ""
            )
            lines.append(f"divergences: {run['divergences']} steps{at}")
        if "grad_evals" in run:
            lines.append(
                f"gradient evaluations: {run['grad_evals']:,} "
                f"({run['grad_evals_per_step']:.4g} per step)"
            )
        for key, text in (
            ("acceptance_rate", "mean acceptance rate"),
            ("ensemble_fraction", "mean ensemble fraction"),
        ):
            if key in run:
                lines.append(f"{text}: {run[key]:.3f}")
        return lines

    def __str__(self) -> str:
        return self.format()

    def to_csv(self, path) -> None:
        """Write the table (one row per coordinate, full precision) to ``path``."""
        with open(path, "w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(["name"] + list(self.columns))
            for i, label in enumerate(self.labels):
                w.writerow(
                    [label] + [repr(float(self.columns[n][i])) for n in self.columns]
                )

    @classmethod
    def from_csv(cls, path, run: dict | None = None, notes: tuple = ()) -> SummaryTable:
        """Read a table written by :meth:`to_csv` (``run`` and ``notes`` are not in the
        file).
        """
        with open(path, newline="") as fh:
            rows = list(csv.reader(fh))
        if not rows or rows[0][:1] != ["name"]:
            raise ValueError(
                f"path {str(path)!r} is not a summary table written by "
                "SummaryTable.to_csv."
            )
        header, body = rows[0][1:], rows[1:]
        columns = {
            n: np.array([float(r[j + 1]) for r in body]) for j, n in enumerate(header)
        }
        return cls(tuple(r[0] for r in body), columns, dict(run or {}), tuple(notes))


# --------------------------------------------------------------------------
# summary()
# --------------------------------------------------------------------------


def _truth_moments(truth: Any, d: int):
    """(true mean or None, true sd or None).

    From a Target, a dict or an array of means.
    """
    if truth is None:
        return None, None
    if hasattr(truth, "mean") and hasattr(truth, "cov"):  # a Target
        mean, cov, sd = truth.mean, truth.cov, None
    elif isinstance(truth, dict):
        unknown = set(truth) - {"mean", "sd", "cov"}
        if unknown:
            raise ValueError(
                f"truth must have keys among 'mean', 'sd', 'cov'; got {sorted(truth)}."
            )
        mean, cov, sd = truth.get("mean"), truth.get("cov"), truth.get("sd")
    else:
        mean, cov, sd = truth, None, None
    if cov is not None and sd is None:
        sd = np.sqrt(np.diag(np.asarray(cov, np.float64)))
    out = []
    for name, v in (("mean", mean), ("sd", sd)):
        if v is not None:
            v = (
                np.broadcast_to(np.asarray(v, np.float64), (d,))
                if np.ndim(v) == 0
                else np.asarray(v, np.float64)
            )
            if v.shape != (d,):
                raise ValueError(
                    f"truth's {name} must have shape ({d},) to match the draws; got "
                    f"shape {v.shape}."
                )
        out.append(v)
    return tuple(out)


def _per_step(info: Any, name: str) -> np.ndarray | None:
    """``info.<name>`` reduced to one value per step (mean over chains/particles), or
    None.
    """
    leaf = getattr(info, name, None)
    if leaf is None:
        return None
    a = np.asarray(leaf)
    return a.reshape(a.shape[0], -1).mean(axis=1) if a.ndim > 1 else a


def _run_figures(result: RunResult, burn_in: int) -> dict:
    run = {
        "num_steps_done": int(result.num_steps_done),
        "diverged_at": int(result.diverged_at),
    }
    info = result.info
    if info is None:
        return run
    div = getattr(info, "diverged", None)
    if div is not None:
        d = np.asarray(div)
        d = (
            d.reshape(d.shape[0], -1).astype(bool).any(axis=1)
            if d.ndim > 1
            else d.astype(bool)
        )
        run["divergences"] = int(np.count_nonzero(d))
    ge = getattr(info, "grad_evals", None)
    if ge is not None:
        g = np.asarray(ge, np.float64)
        total = float(g.sum())
        run["grad_evals"] = int(round(total))
        run["grad_evals_per_step"] = total / max(g.shape[0], 1)
    for name in ("acceptance_rate", "ensemble_fraction"):
        v = _per_step(info, name)
        if v is not None:
            v = v[burn_in:] if v.shape[0] > burn_in else v
            run[name] = float(np.mean(v)) if v.size else float("nan")
    return run


def _stream_columns(result: RunResult) -> tuple:
    m = result.moments
    mean = np.asarray(m.mean, np.float64)
    sd = np.asarray(m.std, np.float64)
    d = mean.shape[0]
    nan = np.full(d, np.nan)
    pos = getattr(result.state, "position", None)
    se_mean = se_sd = nan
    quants = [nan] * len(QUANTILES)
    n = 0
    if pos is not None and np.ndim(pos) >= 2:
        final = np.asarray(pos, np.float64).reshape(-1, d)
        n = final.shape[0]
        quants = list(np.quantile(final, QUANTILES, axis=0))
        if n >= 2:
            c = final - final.mean(axis=0)
            var = np.mean(c**2, axis=0)
            m4 = np.mean(c**4, axis=0)
            se_mean = np.sqrt(var * n / (n - 1) / n)
            with np.errstate(divide="ignore", invalid="ignore"):
                se_sd = np.sqrt(np.maximum(m4 - var**2, 0.0) / n) / (2.0 * np.sqrt(var))
    cols = {
        "mean": mean,
        "sd": sd,
        "mcse_mean": se_mean,
        "mcse_sd": se_sd,
        "ess_bulk": nan,
        "ess_tail": nan,
        "r_hat": nan,
    }
    for q, v in zip(QUANTILES, quants, strict=True):
        cols[f"q{100 * q:g}"] = v
    return cols, {
        "num_chains": n,
        "num_draws": 1 if n else 0,
        "stream_count": float(m.count),
    }


def _x64():
    """A context in which JAX computes in float64 (the summary's diagnostics, to match
    ArviZ to round-off).
    """
    ctx = getattr(jax, "enable_x64", None)
    if ctx is None:  # pragma: no cover - older JAX
        from jax.experimental import enable_x64 as ctx
    return ctx(True)


def _trace_columns(x: np.ndarray) -> tuple:
    x = np.asarray(x, np.float64)
    return _diagnostic_columns(x), {
        "num_chains": int(x.shape[0]),
        "num_draws": int(x.shape[1]),
    }


# --------------------------------------------------------------------------
# The diagnostic columns, in NumPy.
#
# The same formulas as cenlmc_jax.diagnostics.chains (mcse with split chains,
# the bulk and tail ESS, the rank-normalised R-hat; Vehtari et al. 2021 eq.
# 14-16, ArviZ's definitions), equal to them to rounding (the tests compare
# them). On the host because a summary is computed once per run, from draws
# already there: NumPy runs it at once where the jitted version first compiled
# for about a second (issue 30; benchmarks/results/waste.md).
# --------------------------------------------------------------------------


def _split(x: np.ndarray) -> np.ndarray:
    """(m, n, K) -> (2m, n // 2, K): first and second halves (the middle draw of an
    odd n dropped).
    """
    half = x.shape[1] // 2
    return np.concatenate([x[:, :half], x[:, x.shape[1] - half :]], axis=0)


def _ess(x: np.ndarray) -> np.ndarray:
    """Geyer's initial-monotone-sequence ESS of every coordinate of ``x (m, n, K)``
    (Stan's and ArviZ's, with the multi-chain autocorrelation; as ``chains._ess_core``).
    """
    # imported here, as ndtri in _z_scores: a streamed run's summary needs neither,
    # and should not pay for scipy's imports
    import scipy.fft

    m, n = x.shape[0], x.shape[1]
    n_fft = 1 << (2 * n - 1).bit_length()  # >= 2n: circular = linear correlation
    # (K m, n): the FFT's axis contiguous; in blocks of rows, whose buffers stay in
    # cache (the whole spectrum of a large trace is hundreds of MB)
    centred = np.moveaxis(x - x.mean(axis=1, keepdims=True), 2, 0).reshape(-1, n)
    acov_sum = np.zeros((x.shape[2], n))  # n x the autocovariance, summed over chains
    rows = max(1, (1 << 20) // n_fft)
    for start in range(0, centred.shape[0], rows):
        block = centred[start : start + rows]
        spec = scipy.fft.rfft(block, n=n_fft, axis=-1)
        power = np.square(spec.real)
        power += np.square(spec.imag)
        acov = scipy.fft.irfft(power, n=n_fft, axis=-1)[:, :n]
        coord = np.arange(start, start + block.shape[0]) // m
        for k in np.unique(coord):
            acov_sum[k] += acov[coord == k].sum(axis=0)
    within = acov_sum[:, 0] / (m * (n - 1.0))
    var_plus = within * ((n - 1.0) / n)
    if m > 1:
        var_plus = var_plus + np.var(x.mean(axis=1), axis=0, ddof=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        rho = 1.0 - (within - acov_sum.T / (m * n)) / var_plus  # (n, K)
    rho[0] = 1.0
    num_pairs = len(range(1, n - 3, 2)) + 1
    pairs = rho[: 2 * num_pairs].reshape((num_pairs, 2) + rho.shape[1:])
    rho_even, pair_sum = pairs[:, 0], pairs.sum(axis=1)
    positive = pair_sum > 0
    positive[0] = True
    keep = np.minimum.accumulate(positive.astype(np.int32), axis=0)
    num_kept = keep.sum(axis=0)
    all_kept = num_kept == num_pairs
    monotone = np.minimum.accumulate(pair_sum, axis=0)
    last = (np.arange(num_pairs) == num_pairs - 1)[:, None]
    summed = keep * ~(last & all_kept)
    first_rejected = np.minimum(num_kept, num_pairs - 1)
    extra = np.take_along_axis(rho_even, first_rejected[None], axis=0)[0]
    extra = np.where(all_kept, extra, np.maximum(extra, 0.0))
    tau = -1.0 + 2.0 * np.sum(summed * monotone, axis=0) + extra
    total = m * n
    tau = np.maximum(tau, 1.0 / math.log10(total))
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(_constant(x), np.nan, total / tau)


def _constant(x: np.ndarray) -> np.ndarray:
    """Per coordinate: every draw of every chain equals the first one."""
    return np.all(x == x[:1, :1], axis=(0, 1))


def _z_scores(x: np.ndarray) -> np.ndarray:
    """Rank normalisation ``Φ^{-1}((r - 3/8) / (S + 1/4))`` of each coordinate's
    ``S = m n`` values, ``r`` the average 1-based rank of the ties (Vehtari et al.
    2021, eq. 14).
    """
    from scipy.special import ndtri  # as scipy.fft in _ess

    columns = np.ascontiguousarray(x.reshape(x.shape[0] * x.shape[1], -1).T)
    size = columns.shape[1]
    rank = np.empty_like(columns)
    for col, out in zip(columns, rank, strict=True):
        order = np.argsort(col)
        srt = col[order]
        new = np.empty(size, bool)  # the first of each run of equal values
        new[0] = True
        np.not_equal(srt[1:], srt[:-1], out=new[1:])
        if new.all():
            out[order] = np.arange(1.0, size + 1.0)
            continue
        # ties: each run of equal values gets its average rank
        bounds = np.r_[np.flatnonzero(new), size]
        run = np.cumsum(new) - 1
        out[order] = (bounds[run] + bounds[run + 1] + 1) / 2.0
    z = ndtri((rank - 0.375) / (size + 0.25))
    return z.T.reshape(x.shape)


def _rhat(x: np.ndarray) -> np.ndarray:
    n = x.shape[1]
    within = np.var(x, axis=1, ddof=1).mean(axis=0)
    var_plus = within * ((n - 1.0) / n) + np.var(x.mean(axis=1), axis=0, ddof=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.sqrt(var_plus / within)


def _diagnostic_columns(x: np.ndarray) -> dict:
    """Every column of the table from the draws ``x (m, n, K)``, float64."""
    flat = x.reshape(-1, x.shape[2])
    mean = flat.mean(axis=0)
    sd = flat.std(axis=0, ddof=1)
    constant = _constant(x)
    sq = (x - mean) ** 2  # for the sd's MCSE (delta method on s²)
    split = _split(x)
    low, high = (
        (x <= q).astype(np.float64) for q in np.quantile(x, (0.05, 0.95), axis=(0, 1))
    )
    z_bulk = _z_scores(split)
    z_folded = _z_scores(np.abs(split - np.median(split, axis=(0, 1))))
    # every split-chain ESS in one pass over the stacked coordinates
    ess = _ess(
        np.concatenate([_split(v) for v in (x, sq, low, high)] + [z_bulk], axis=2)
    ).reshape(5, -1)
    evar = sq.mean(axis=(0, 1))
    with np.errstate(divide="ignore", invalid="ignore"):
        var_of_var = ((sq * sq).mean(axis=(0, 1)) - evar**2) / ess[1]
        cols = {
            "mean": mean,
            "sd": sd,
            "mcse_mean": sd / np.sqrt(ess[0]),
            "mcse_sd": np.sqrt(var_of_var / evar / 4.0),
            "ess_bulk": np.where(constant, np.nan, ess[4]),
            "ess_tail": np.where(constant, np.nan, np.minimum(ess[2], ess[3])),
            "r_hat": np.where(
                constant, np.nan, np.maximum(_rhat(z_bulk), _rhat(z_folded))
            ),
        }
    for q, v in zip(QUANTILES, np.quantile(flat, QUANTILES, axis=0), strict=True):
        cols[f"q{100 * q:g}"] = v
    return {k: np.asarray(v, np.float64).reshape(-1) for k, v in cols.items()}


def _nested_rhat(mean: np.ndarray, var: np.ndarray, m: int) -> np.ndarray:
    """Nested R-hat from chain means and within-chain variances ``(chains, K)``,
    superchain ``k`` the chains ``k M .. k M + M - 1``: the formula of
    :func:`cenlmc_jax.diagnostics.nested.nested_rhat` (paper, eq. 15-18), in float64
    NumPy (the summary's other columns are; no compilation)."""
    k = mean.shape[0] // m
    mean = mean.reshape(k, m, -1)
    sc_mean = mean.mean(axis=1)
    between_super = sc_mean.var(axis=0, ddof=1)
    between_chain = mean.var(axis=1, ddof=1) if m > 1 else np.zeros_like(sc_mean)
    within = (between_chain + var.reshape(k, m, -1).mean(axis=1)).mean(axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.sqrt(1.0 + between_super / within)


def _superchains(superchain_size: Any, initial_position: Any) -> int:
    """``M`` from ``superchain_size`` or the layout of ``initial_position`` (1: no
    superchains)."""
    if superchain_size is not None and initial_position is not None:
        raise ValueError(
            "superchain_size and initial_position: give one of them (the size, or the "
            "starts it is read from)."
        )
    if initial_position is not None:
        return nested.superchain_size(fetch(initial_position))
    if superchain_size is None:
        return 1
    m = superchain_size
    if isinstance(m, bool) or not isinstance(m, (int, np.integer)) or m < 1:
        raise ValueError(f"superchain_size must be an int >= 1; got {m!r}.")
    return int(m)


def _check_superchains(m: int, chains: int) -> None:
    if chains % m or chains // m < 2:
        raise ValueError(
            f"superchain_size {m} must divide the {chains} chains into at least 2 "
            "superchains."
        )


def _nested_column(result_or_draws: Any, x: np.ndarray | None, m: int, d: int):
    """The ``nested_r_hat`` column: from the draws ``x (chains, n, K)``, else from a
    streaming run's online per-chain moments (``nan`` when it has none)."""
    if x is not None:
        _check_superchains(m, x.shape[0])
        var = x.var(axis=1, ddof=1)  # the summary has at least 4 draws per chain
        out = _nested_rhat(x.mean(axis=1), var, m)
        return np.where(_constant(x), np.nan, out)
    stats = nested.stream_chain_stats(getattr(result_or_draws, "online", None), m)
    if stats is None or stats.mean.shape[1] != 2 * d:
        return np.full(d, np.nan)
    _check_superchains(m, stats.mean.shape[0])
    mean = np.asarray(stats.mean, np.float64)[:, :d]
    m2 = np.asarray(stats.m2, np.float64)[:, :d]
    var = m2 / (stats.count - 1) if stats.count > 1 else np.zeros_like(m2)
    constant = np.all(var == 0, axis=0) & np.all(mean == mean[:1], axis=0)
    return np.where(constant, np.nan, _nested_rhat(mean, var, m))


def summary(
    result_or_draws: Any,
    truth: Any = None,
    *,
    burn_in: int = 0,
    labels: list | None = None,
    model: Any = None,
    constrain: Any = None,
    superchain_size: int | None = None,
    initial_position: Any = None,
) -> SummaryTable:
    r"""The summary table of a run, or of chains-first draws.

    Columns, per coordinate (all with ArviZ's definitions; Vehtari et al. 2021):

    * ``mean``, ``sd`` (ddof 1) over all chains and draws;
    * ``mcse_mean``, ``mcse_sd``: :func:`~cenlmc_jax.diagnostics.mcse` with
      split chains;
    * ``ess_bulk``, ``ess_tail``: rank-normalised split ESS and the tail ESS
      (5% and 95% quantile indicators);
    * ``r_hat``: rank-normalised split R-hat (max of bulk and folded);
    * ``nested_r_hat``, only for chains in superchains (``superchain_size`` ``M >=
      2``, or starts laid out that way: ``initial_position``): nested R-hat
      (:func:`cenlmc_jax.diagnostics.nested.nested_rhat`, not split, not
      rank-normalised; Margossian et al.'s threshold 1.01), the many-chain
      counterpart of ``r_hat``: it asks whether the chains forgot their shared
      starts, so it can be near 1 for many short chains whose ``r_hat`` is not;
    * ``q5``, ``q50``, ``q95``: type-7 quantiles;
    * with ``truth``: ``true_mean`` and ``z_mean = (mean - true_mean) /
      mcse_mean``; ``true_sd`` and ``z_sd = (sd - true_sd) / mcse_sd`` when
      the sd is known. ``|z| > 4`` is unlikely (6e-5) for a correct sampler.

    For a streaming run (``mode="stream"``) see the module docstring: the
    MCSEs are upper bounds, ESS and R-hat are ``nan``, and a note says so.

    A model with named, constrained parameters (a NumPyro model)::

        m = cj.from_numpyro(eight_schools, J, sigma, y=y)
        ...  # a run on m.logdensity_fn, with a trace
        # rows mu, tau, theta[0], ..., theta_trans[7]
        print(cj.summary(result, model=m))

    shows each draw mapped by ``m.constrain``
    (:mod:`cenlmc_jax.diagnostics.named_draws`): the statistics of ``tau`` are of
    ``exp(x[1])`` draw by draw, deterministic sites included, sites sorted by name,
    array sites as ``theta[0]``, ... (``labels=m.names`` instead names the unconstrained
    coordinates).

    Args:
      result_or_draws: a :class:`~cenlmc_jax.run.RunResult` (trace or stream
        mode) or draws ``(chains, draws, *event)`` (chains first; see
        :func:`cenlmc_jax.diagnostics.chains_first`).
      truth: a :class:`~cenlmc_jax.models.targets.Target` (its ``mean`` and ``cov``),
        a dict with ``mean`` and ``sd`` or ``cov``, or an array of means.
      burn_in: steps of a RunResult's info to leave out of the mean
        acceptance rate and ensemble fraction (the draws already exclude them).
      labels: names of the coordinates (default ``x[0]``, ``x[1]``, ...; with
        ``model`` or ``constrain``, the sites' names).
      model: what :func:`cenlmc_jax.from_numpyro` returns (its ``constrain``
        is used), or None.
      constrain: ``x: (d,) -> {site: array}`` (or one array), mapped over the
        draws before anything is computed; not with ``model``, and not for a
        streaming run (moments of ``x`` do not give those of ``constrain(x)``).
      superchain_size: ``M``, chains per superchain (superchain ``k`` the chains
        ``k M .. k M + M - 1``; ``M`` must divide the chains into at least 2
        superchains); 2 or more adds the ``nested_r_hat`` column, 1 or None
        (default) does not.
      initial_position: the chains' starting positions instead (e.g.
        ``warm.state.position`` of ``cj.langevin_warmup``): ``M`` is read from
        them (:func:`cenlmc_jax.diagnostics.nested.superchain_size`: contiguous
        blocks of identical rows; independent starts give 1). Not with
        ``superchain_size``.

    Returns:
      A :class:`SummaryTable`; ``print`` it. With superchains its ``run`` has
      ``superchain_size`` and a note says what ``nested_r_hat`` measures.

    Raises:
      ValueError: bad ``truth``, ``labels``, ``constrain`` for a streaming run,
        fewer than 4 draws per chain, or a ``superchain_size`` (given or read) that
        does not divide the chains into at least 2 superchains, or both
        ``superchain_size`` and ``initial_position``.
    """
    notes = []
    run: dict = {}
    constrain = resolve_constrain(model, constrain)
    m = _superchains(superchain_size, initial_position)
    result_or_draws = fetch(
        result_or_draws
    )  # on the host; gathered when sharded over several processes
    names = None
    if isinstance(result_or_draws, RunResult) and result_or_draws.trace is None:
        if result_or_draws.moments is None:
            raise ValueError(
                "result_or_draws is a RunResult with neither a trace nor moments."
            )
        if constrain is not None:
            raise ValueError(
                "model/constrain: result_or_draws is a streaming run (moments of the "
                "unconstrained x only, which do not give the constrained "
                "moments); run with a trace."
            )
        cols, shape = _stream_columns(result_or_draws)
        notes.append(_STREAM_NOTE)
        x = None
    else:
        x = np.asarray(chains_first(result_or_draws))
        if x.shape[1] < 4:
            raise ValueError(
                f"the draws have {x.shape[1]} draws per chain (shape "
                f"{tuple(x.shape)}); the summary needs at least 4 (split chains "
                "of 2 draws)."
            )
        if constrain is None:
            x = x.reshape(x.shape[:2] + (-1,))
        else:
            x, names = flatten_sites(site_draws(x, constrain))
        cols, shape = _trace_columns(x)
    run.update(shape)
    if isinstance(result_or_draws, RunResult):
        run.update(_run_figures(result_or_draws, burn_in))
    d = cols["mean"].shape[0]
    if m >= 2:
        column = _nested_column(
            result_or_draws, None if x is None else np.asarray(x, np.float64), m, d
        )
        order = list(cols)
        order.insert(order.index("r_hat") + 1, "nested_r_hat")
        cols = {n: column if n == "nested_r_hat" else cols[n] for n in order}
        run["superchain_size"] = m
        notes.append(
            f"nested_r_hat: {run.get('num_chains', 0) // m} superchains of {m} chains "
            "sharing a start (Margossian et al.): whether the chains forgot their "
            "starts. It includes a floor above 1 that a run of few draws has even at "
            "stationarity; the many-chain verdict (cj.sample_until, the CLI) tests "
            "the starts' share alone against 1.01, where it is significant "
            "(diagnostics.nested), so a value a little above 1.01 here can pass; "
            "r_hat asks each chain to have crossed the posterior, which many short "
            "chains need not"
        )
    true_mean, true_sd = _truth_moments(truth, d)
    with np.errstate(divide="ignore", invalid="ignore"):
        if true_mean is not None:
            cols["true_mean"] = true_mean
            cols["z_mean"] = (cols["mean"] - true_mean) / cols["mcse_mean"]
        if true_sd is not None:
            cols["true_sd"] = true_sd
            cols["z_sd"] = (cols["sd"] - true_sd) / cols["mcse_sd"]
    if labels is None:
        labels = names if names is not None else [f"x[{i}]" for i in range(d)]
    elif len(labels) != d:
        raise ValueError(
            f"labels must name the {d} coordinates; got {len(labels)} labels."
        )
    if run.get("divergences"):
        notes.append(
            f"the run diverged ({run['divergences']} steps with info.diverged, the "
            f"first at step {run.get('diverged_at')}): the estimates are not "
            "valid"
        )
    return SummaryTable(tuple(labels), cols, run, tuple(notes))


# --------------------------------------------------------------------------
# to_arviz()
# --------------------------------------------------------------------------


def _blocks(leaf: np.ndarray, thin: int, flag: bool = False) -> np.ndarray:
    """Per-step values ``(steps, *rest)`` -> per kept draw ``(chains, draws)``: thin
    blocks summed (integer counts), or-ed (flags; with ``flag`` a reduced fraction > 0
    counts as set) or averaged (rates).
    """
    if flag:
        leaf = leaf > 0
    steps = leaf.shape[0] // thin * thin
    a = leaf[:steps].reshape((steps // thin, thin) + leaf.shape[1:])
    if a.dtype == np.bool_:
        a = a.any(axis=1)
    elif np.issubdtype(a.dtype, np.integer):
        a = a.sum(axis=1)
    else:
        a = a.mean(axis=1)
    a = a.reshape(a.shape[0], -1)  # (draws, chains or 1)
    return np.ascontiguousarray(a.T)


def _sample_stats(info: Any, start: int, stop: int, thin: int) -> dict:
    out = {}
    for name in STAT_FIELDS:
        leaf = getattr(info, name, None)
        if leaf is not None:
            out[name] = _blocks(
                np.asarray(leaf)[start:stop], thin, flag=name == "diverged"
            )
    return out


def _jsonable(value: Any) -> Any:
    if isinstance(value, (np.generic, np.ndarray, jax.Array)):
        return np.asarray(value).tolist()
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return (
        value
        if isinstance(value, (int, float, str, bool)) or value is None
        else repr(value)
    )


def _arviz_draws(result: RunResult, thin: int, burn_in: int | None) -> tuple:
    """:func:`to_arviz`'s ``(posterior (chain, draw, ...), kept draws, burn_in)``, the
    burn-in checked against the run (a streaming run: its final state as one draw per
    chain or particle).
    """
    if result.trace is None:
        if result.moments is None:
            raise ValueError("result has neither a trace nor moments.")
        pos = np.asarray(result.state.position)
        posterior = pos[:, None] if pos.ndim >= 2 else pos[None, None]
        per_draw = max(posterior.shape[0], 1)
        num_kept = int(round(float(result.moments.count) / per_draw))
    else:
        posterior = np.asarray(chains_first(result))
        num_kept = posterior.shape[1]
    inferred = int(result.num_steps_done) - num_kept * thin
    if burn_in is None:
        burn_in = max(inferred, 0)
    elif burn_in < 0 or (result.diverged_at < 0 and burn_in != inferred):
        raise ValueError(
            f"burn_in={burn_in} and thin={thin} do not match the run: "
            f"{result.num_steps_done} steps done, {num_kept} kept draws (pass "
            "the burn_in and thin given to cj.sample)."
        )
    return posterior, num_kept, burn_in


def to_arviz(
    result: RunResult,
    *,
    burn_in: int | None = None,
    thin: int | None = None,
    sampler: str | None = None,
    parameters: dict | None = None,
    seed: int | None = None,
    var_name: str = "x",
    coords: dict | None = None,
    dims: dict | None = None,
    model: Any = None,
    constrain: Any = None,
):
    """A run for ArviZ (needs ArviZ: ``pip install "cenlmc_jax[arviz]"``).

    With ArviZ 0.x an ``arviz.InferenceData``; with ArviZ 1.x (Python >= 3.12),
    which replaced it by xarray's DataTree, an ``xarray.DataTree`` with the same
    groups (children) and attributes. Both read the same way
    (``idata.posterior["x"]``, ``idata.sample_stats``, ``idata.posterior.attrs``),
    both go to ``az.summary`` and both write ``idata.to_netcdf("run.nc")``.

    * ``posterior``: ``var_name`` with dims ``(chain, draw, *event)``, where a
      chain is a chain of ``vmap_chains`` or a particle of an ensemble sampler.
    * ``sample_stats``: the per-step info fields the sampler has among
      :data:`STAT_FIELDS` (``diverged``, ``grad_evals``, ``acceptance_rate``,
      ``ensemble_fraction``), one value per kept draw: the ``thin`` steps that
      led to it are summed (counts), or-ed (flags) or averaged (rates). Infos
      reduced over the chains by the driver (its default ``info_reduce="mean"``)
      have a chain axis of length 1; with ``info_reduce=None`` they have one
      value per chain.
    * ``warmup_sample_stats``: the same for the ``burn_in`` steps.
    * attributes (of the InferenceData or the DataTree root, and of ``posterior``):
      ``sampler``, ``parameters`` (JSON), ``seed``, ``inference_library``
      ("cenlmc_jax"), ``inference_library_version``, ``num_steps_done``,
      ``diverged_at``, ``mode``.

    A streaming run (``mode="stream"``) has no draws: ``posterior`` holds its
    final state as one draw per chain or particle, and the attributes
    ``stream_count``, ``stream_mean``, ``stream_sd`` and a ``note`` say so.

    With ``model`` (what :func:`cenlmc_jax.from_numpyro` returns) or
    ``constrain``, ``posterior`` holds the constrained values instead, one
    variable per site with its shape, as ArviZ's ``from_numpyro`` lays them out
    (``posterior["tau"]``: ``(chain, draw)``, ``posterior["theta"]``: ``(chain,
    draw, J)``); a NumPyro model's plates name the dims (``model.dims``;
    ``dims`` given here take precedence), other axes get ArviZ's
    ``theta_dim_0``. A streaming run's final state is constrained likewise; its
    ``stream_*`` attributes stay those of the unconstrained ``x``.

    Args:
      result: what :func:`cenlmc_jax.sample` returned.
      burn_in: the run's ``burn_in`` (default: ``result.burn_in``, recorded by
        :func:`cenlmc_jax.sample`).
      thin: the run's ``thin`` (default: ``result.thin``).
      sampler, parameters, seed: recorded as attributes.
      var_name, coords, dims: passed to ``arviz.from_dict`` (default dims:
        ArviZ's ``x_dim_0``, ...); ``var_name`` names the posterior when there
        are no sites (no ``constrain``, or one returning an array).
      model, constrain: as for :func:`summary`; one of them, or neither.

    Returns:
      An ``arviz.InferenceData`` (ArviZ 0.x) or an ``xarray.DataTree`` (ArviZ
      1.x) with the groups and attributes above.

    Raises:
      ImportError: without ArviZ.
      ValueError: ``result`` not a RunResult, or ``burn_in`` / ``thin`` that do
        not match the run.
    """
    try:
        import arviz as az
    except ImportError as exc:
        raise ImportError(
            'cj.to_arviz needs ArviZ: pip install "cenlmc_jax[arviz]" (or pip '
            "install arviz)"
        ) from exc
    if not isinstance(result, RunResult):
        raise ValueError(
            "result must be a RunResult (what cj.sample returns); got "
            f"{type(result).__name__}."
        )
    constrain_fn = resolve_constrain(model, constrain)
    # on the host; gathered when sharded over several processes
    result = fetch(result)
    thin = result.thin if thin is None else thin
    burn_in = result.burn_in if burn_in is None else burn_in
    if thin < 1 or int(thin) != thin:
        raise ValueError(f"thin must be an integer >= 1; got {thin!r}.")
    stream = result.trace is None
    posterior, num_kept, burn_in = _arviz_draws(result, thin, burn_in)
    stats = warm = {}
    if result.info is not None:
        stats = _sample_stats(result.info, burn_in, burn_in + num_kept * thin, thin)
        warm = _sample_stats(result.info, 0, burn_in, 1) if burn_in else {}
    attrs = {
        "inference_library": "cenlmc_jax",
        "inference_library_version": _version(),
        "sampler": "" if sampler is None else str(sampler),
        "parameters": json.dumps(_jsonable(parameters or {})),
        "seed": "" if seed is None else str(seed),
        "num_steps_done": int(result.num_steps_done),
        "diverged_at": int(result.diverged_at),
        "burn_in": int(burn_in),
        "thin": int(thin),
        "mode": "stream" if stream else "trace",
    }
    if stream:
        attrs.update(
            stream_count=float(result.moments.count),
            stream_mean=np.asarray(result.moments.mean, np.float64),
            stream_sd=np.asarray(result.moments.std, np.float64),
            note=(
                "streaming run (mode='stream'): no draws were kept; posterior holds "
                "the final state (one draw per chain or particle); stream_mean "
                "and stream_sd are the moments over all kept steps"
            ),
        )
    variables, dims = _posterior(posterior, constrain_fn, model, var_name, dims)
    groups = {"posterior": variables}
    if stats:
        groups["sample_stats"] = stats
    if warm:
        groups["warmup_sample_stats"] = warm
    with warnings.catch_warnings():
        # ensembles have more "chains" (particles) than draws: by design here (0.x:
        # "More chains ...", 1.x: "Found chain dimension to be longer than draw
        # dimension ...")
        warnings.filterwarnings("ignore", message="More chains", category=UserWarning)
        warnings.filterwarnings(
            "ignore", message="Found chain dimension to be longer", category=UserWarning
        )
        if _arviz_major(az) >= 1:
            # ArviZ 1.x: from_dict takes the groups as one mapping and returns an
            # xarray.DataTree; attrs go per group, "/" being the root (the
            # InferenceData's attrs in 0.x)
            idata = az.from_dict(
                groups,
                coords=coords,
                dims=dims,
                save_warmup=True,
                attrs={"/": dict(attrs), "posterior": dict(attrs)},
            )
        else:
            kwargs = dict(groups, coords=coords, dims=dims, attrs=dict(attrs))
            if warm:
                kwargs["save_warmup"] = True
            idata = az.from_dict(**kwargs)
    idata.posterior.attrs.update(attrs)
    return idata


def _posterior(
    posterior: np.ndarray, constrain: Any, model: Any, var_name: str, dims: dict | None
) -> tuple:
    """``(variables, dims)`` of the posterior group: the draws as ``var_name``, or each
    draw constrained, one variable per site, the model's plates naming their axes
    (``model.dims``) unless ``dims`` names them.
    """
    if constrain is None:
        return {var_name: posterior}, dims
    sites = site_draws(posterior, constrain, var_name)
    plates = {
        k: list(v)
        for k, v in (getattr(model, "dims", None) or {}).items()
        if k in sites
    }
    return sites, ({**plates, **(dims or {})} or None)


def _arviz_major(az: Any) -> int:
    """The major version of the imported ArviZ.

    0: InferenceData, 1: xarray.DataTree.
    """
    version = str(getattr(az, "__version__", "0"))
    digits = ""
    for ch in version:
        if not ch.isdigit():
            break
        digits += ch
    return int(digits or 0)
