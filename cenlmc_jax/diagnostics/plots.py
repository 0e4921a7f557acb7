"""Figures of a run (needs matplotlib: ``pip install "cenlmc_jax[plots]"``).

Every function returns a ``matplotlib.figure.Figure`` built without pyplot
(no backend or global state is touched): show it in a notebook by leaving it
as the cell's value, or write it with ``fig.savefig("name.png")``.

* :func:`plot_trace`: draws against step per chain, and their histogram;
* :func:`plot_rank`: rank histograms per chain (Vehtari et al. 2021, §4.2):
  flat when the chains mix, tilted or humped when they disagree;
* :func:`plot_marginals`: marginal histograms against the exact density
  (Gaussian targets) or a quadrature of the target's density (d <= 2);
* :func:`plot_ensemble_pairs`: an ensemble at a few times, in a coordinate plane;
* :func:`plot_gradient_savings`: CEnLMC's gradient evaluations per step as a
  fraction of LMC's ``N``, and its ensemble fraction;
* :func:`plot_coupling_distance`: ``E|x_i^m - z_i^m|`` of Theorem 3.3
  (``cj.ensemble.coupling_distance``) against the step ``m``;
* :func:`plot_acf`: the multi-chain autocorrelation against the lag, one
  panel per sampler, side by side.

Draws are taken as in :mod:`cenlmc_jax.diagnostics`: a ``RunResult`` or a
chains-first array ``(chains, draws, *event)``.

A model with named, constrained parameters: pass ``model=`` (what
:func:`cenlmc_jax.from_numpyro` returns) or ``constrain=`` (``x -> {site:
array}``) to :func:`plot_trace`, :func:`plot_rank`, :func:`plot_marginals`,
:func:`plot_ensemble_pairs` or :func:`plot_acf`: each draw is mapped by it
(:mod:`cenlmc_jax.diagnostics.named_draws`), the axes carry the sites' names, and
``coords`` (``pair``) may name them: ``plot_trace(result, model=m,
coords=["mu", "tau", "theta[0]"])``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from cenlmc_jax import diagnostics as dg
from cenlmc_jax.diagnostics.named_draws import (
    flatten_sites,
    named_draws,
    resolve_constrain,
    site_draws,
)
from cenlmc_jax.models.targets import Target
from cenlmc_jax.run import RunResult

__all__ = [
    "plot_trace",
    "plot_rank",
    "plot_marginals",
    "plot_ensemble_pairs",
    "plot_gradient_savings",
    "plot_coupling_distance",
    "plot_acf",
]

_MAX_COORDS = 4


def _figure(nrows: int, ncols: int, width: float = 4.0, height: float = 2.6, **kw):
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise ImportError(
            "cenlmc_jax.diagnostics.plots needs matplotlib: pip install "
            '"cenlmc_jax[plots]"'
        ) from exc
    fig = Figure(figsize=(width * ncols, height * nrows), layout="constrained")
    axes = np.atleast_2d(fig.subplots(nrows, ncols, squeeze=False, **kw))
    return fig, axes


def _draws(result_or_draws: Any, model: Any = None, constrain: Any = None) -> tuple:
    """``(x: (chains, draws, k) float64, names)``: the event axes flattened, or each
    draw constrained (``model`` / ``constrain``) with the sites' names; ``names[c]``
    labels column ``c`` (``x[c]`` by default).
    """
    x, names = named_draws(result_or_draws, resolve_constrain(model, constrain))
    return x, (names if names is not None else _default_names(x.shape[2]))


def _default_names(k: int) -> tuple:
    return tuple(f"x[{c}]" for c in range(k))


def _coords(
    coords: Sequence | None, names: Sequence[str], what: str = "coords"
) -> list:
    """Column indices from ``coords``: indices in ``[0, k)`` or names among ``names``
    (default: the first 4).
    """
    k = len(names)
    if coords is None:
        return list(range(min(k, _MAX_COORDS)))
    out = []
    for c in coords:
        if isinstance(c, str):
            if c not in names:
                raise ValueError(
                    f"{what}: {c!r} is not a coordinate name; expected one of "
                    f"{list(names)}."
                )
            out.append(list(names).index(c))
        else:
            out.append(int(c))
    bad = [c for c in out if not 0 <= c < k]
    if bad or not out:
        raise ValueError(
            f"{what} must be coordinate indices in [0, {k - 1}] or names; got "
            f"{list(coords)}."
        )
    return out


def plot_trace(
    result_or_draws: Any,
    *,
    coords: Sequence | None = None,
    max_chains: int = 8,
    model: Any = None,
    constrain: Any = None,
):
    """Trace plot of the draws.

    Per coordinate, the draws of up to ``max_chains`` chains against the draw
    index (left) and the histogram of all draws (right).

    Args:
      result_or_draws: a RunResult with a trace, or chains-first draws.
      coords: the coordinates to show (indices or names; default all).
      max_chains: the most chains drawn in the trace panels.
      model: a model with ``.constrain`` (e.g. :func:`cenlmc_jax.from_numpyro`'s):
        the constrained values under their names (module docstring).
      constrain: ``x: (d,) -> {site: array}`` instead of ``model``.

    Returns:
      The matplotlib ``Figure``.

    Raises:
      ValueError: bad ``coords``, or both ``model`` and ``constrain``.
    """
    x, names = _draws(result_or_draws, model, constrain)
    cs = _coords(coords, names)
    fig, axes = _figure(len(cs), 2, width=4.5)
    for row, c in enumerate(cs):
        ax_t, ax_h = axes[row]
        for ch in range(min(max_chains, x.shape[0])):
            ax_t.plot(x[ch, :, c], lw=0.6, alpha=0.8)
        ax_t.set_xlabel("draw")
        ax_t.set_ylabel(names[c])
        ax_h.hist(x[:, :, c].ravel(), bins=60, density=True, color="0.4")
        ax_h.set_xlabel(names[c])
        ax_h.set_ylabel("density")
    axes[0, 0].set_title(
        f"trace ({min(max_chains, x.shape[0])} of {x.shape[0]} chains)"
    )
    axes[0, 1].set_title(f"all {x.shape[0] * x.shape[1]:,} draws")
    return fig


def plot_rank(
    result_or_draws: Any,
    *,
    coords: Sequence | None = None,
    max_chains: int = 8,
    bins: int = 20,
    model: Any = None,
    constrain: Any = None,
):
    """Rank plot of the draws.

    The draws of up to ``max_chains`` chains are ranked together, per
    coordinate; each chain's histogram of ranks is drawn on its own baseline,
    with the uniform count (what mixing chains give) dashed.

    Args:
      result_or_draws: a RunResult with a trace, or chains-first draws.
      coords: the coordinates to show (indices or names; default all).
      max_chains: the most chains ranked.
      bins: histogram bins.
      model: a model with ``.constrain`` (e.g. :func:`cenlmc_jax.from_numpyro`'s):
        the constrained values under their names (module docstring).
      constrain: ``x: (d,) -> {site: array}`` instead of ``model``.

    Returns:
      The matplotlib ``Figure``.

    Raises:
      ValueError: bad ``coords``, or both ``model`` and ``constrain``.
    """
    x, names = _draws(result_or_draws, model, constrain)
    x = x[: min(max_chains, x.shape[0])]
    m, n = x.shape[:2]
    cs = _coords(coords, names)
    fig, axes = _figure(1, len(cs), width=3.6, height=3.2)
    edges = np.linspace(0, m * n, bins + 1)
    expected = n / bins
    for ax, c in zip(axes[0], cs, strict=True):
        ranks = np.argsort(
            np.argsort(x[:, :, c].ravel(), kind="stable"), kind="stable"
        ).reshape(m, n)
        for ch in range(m):
            counts, _ = np.histogram(ranks[ch], bins=edges)
            base = ch * 2.0 * expected
            ax.bar(
                edges[:-1],
                counts,
                width=np.diff(edges),
                bottom=base,
                align="edge",
                edgecolor="white",
                lw=0.4,
            )
            ax.axhline(base + expected, color="k", ls="--", lw=0.7)
        ax.set_yticks(
            [ch * 2.0 * expected for ch in range(m)], [str(ch) for ch in range(m)]
        )
        ax.set_xlabel(f"rank of {names[c]} among {m * n:,} draws")
        ax.set_ylabel("chain")
        ax.set_title(f"rank plot {names[c]}")
    return fig


def _reference_marginal(target: Target, c: int, grid: np.ndarray) -> tuple:
    """(density on grid, label) of coordinate ``c``'s marginal, or (None, None)."""
    if (
        target.hessian is not None
        and target.mean is not None
        and target.cov is not None
    ):
        m, s = float(target.mean[c]), math.sqrt(float(target.cov[c, c]))
        return np.exp(-0.5 * ((grid - m) / s) ** 2) / (
            s * math.sqrt(2 * math.pi)
        ), "exact (Gaussian)"
    logp = jax.jit(jax.vmap(target.logdensity_fn))
    if target.dim == 1:
        lp = np.asarray(logp(jnp.asarray(grid[:, None])), np.float64)
        dens = np.exp(lp - lp.max())
        return dens / np.trapezoid(dens, grid), "quadrature"
    if target.dim == 2:
        if target.mean is not None and target.cov is not None:
            o = 1 - c
            sd = math.sqrt(float(target.cov[o, o]))
            other = np.linspace(target.mean[o] - 8 * sd, target.mean[o] + 8 * sd, 801)
        else:
            other = np.linspace(grid[0], grid[-1], 801)
        g1, g2 = np.meshgrid(grid, other, indexing="ij")
        pts = np.stack([g1, g2], axis=-1) if c == 0 else np.stack([g2, g1], axis=-1)
        lp = np.asarray(logp(jnp.asarray(pts.reshape(-1, 2))), np.float64).reshape(
            g1.shape
        )
        dens = np.trapezoid(np.exp(lp - lp.max()), other, axis=1)
        return dens / np.trapezoid(dens, grid), "quadrature"
    return None, None


def plot_marginals(
    result_or_draws: Any,
    target: Target | None = None,
    *,
    coords: Sequence | None = None,
    bins: int = 60,
    model: Any = None,
    constrain: Any = None,
):
    """Marginal histograms of the draws against the target's marginal density.

    Exact for a Gaussian target (one with a constant ``hessian``), by
    trapezoidal quadrature of ``exp(logdensity_fn)`` on a grid for d = 1 and
    d = 2 (the other coordinate integrated over ±8 sd or the plotted range). A
    streaming run contributes its final ensemble.

    Args:
      result_or_draws: a RunResult (with a trace, or streaming) or chains-first
        draws.
      target: the :class:`~cenlmc_jax.models.targets.Target` whose marginals
        are drawn, or None.
      coords: the coordinates to show (indices or names; default all).
      bins: histogram bins.
      model: a model with ``.constrain`` (e.g. :func:`cenlmc_jax.from_numpyro`'s):
        the constrained values under their names (module docstring).
      constrain: ``x: (d,) -> {site: array}`` instead of ``model``. Not with
        ``target``, whose density is of the unconstrained ``x``.

    Returns:
      The matplotlib ``Figure``.

    Raises:
      ValueError: ``target`` with ``model`` or ``constrain``, or bad ``coords``.
    """
    if target is not None and (model is not None or constrain is not None):
        raise ValueError(
            "target and model/constrain: the target's density is of the "
            "unconstrained x, the histograms would be of the constrained "
            "values; pass one of them."
        )
    if isinstance(result_or_draws, RunResult) and result_or_draws.trace is None:
        pos = np.asarray(result_or_draws.state.position)
        x, fn = (
            pos.reshape(pos.shape[0] if pos.ndim > 1 else 1, 1, -1),
            resolve_constrain(model, constrain),
        )
        x, names = (
            (x.astype(np.float64), _default_names(x.shape[2]))
            if fn is None
            else flatten_sites(site_draws(x, fn))
        )
        what = "final ensemble"
    else:
        x, names = _draws(result_or_draws, model, constrain)
        what = "draws"
    cs = _coords(coords, names)
    fig, axes = _figure(1, len(cs), width=3.6, height=3.0)
    for ax, c in zip(axes[0], cs, strict=True):
        v = x[:, :, c].ravel()
        lo, hi = np.quantile(v, [0.0005, 0.9995])
        pad = 0.1 * (hi - lo + 1e-12)
        grid = np.linspace(lo - pad, hi + pad, 400)
        ax.hist(
            v,
            bins=bins,
            range=(grid[0], grid[-1]),
            density=True,
            color="0.7",
            label=f"{what} ({v.size:,})",
        )
        if target is not None:
            dens, label = _reference_marginal(target, c, grid)
            if dens is not None:
                ax.plot(grid, dens, color="C3", lw=1.5, label=label)
        ax.set_xlabel(names[c])
        ax.set_ylabel("density")
        ax.legend(fontsize="small")
    if target is not None:
        fig.suptitle(f"marginals vs {target.name}")
    return fig


def plot_ensemble_pairs(
    result_or_trace: Any,
    *,
    times: Sequence[int] | None = None,
    pair: tuple = (0, 1),
    max_points: int = 2000,
    target: Target | None = None,
    model: Any = None,
    constrain: Any = None,
):
    """An ensemble at a few kept draws, in the plane of two coordinates.

    A 1-D ensemble: its histogram. With a Gaussian ``target`` its 1- and 2-sd
    ellipses are drawn.

    Args:
      result_or_trace: a RunResult of an ensemble or of ``vmap_chains`` run
        with a trace, or chains-first draws.
      times: draw indices (default four, first to last).
      pair: the two coordinates of the plane (indices or names).
      max_points: the most particles drawn.
      target: a Gaussian :class:`~cenlmc_jax.models.targets.Target`, or None.
      model: a model with ``.constrain`` (e.g. :func:`cenlmc_jax.from_numpyro`'s):
        the constrained values under their names (module docstring).
      constrain: ``x: (d,) -> {site: array}`` instead of ``model``. Not with ``target``.

    Returns:
      The matplotlib ``Figure``.

    Raises:
      ValueError: ``target`` with ``model`` or ``constrain``, or ``times`` or
        ``pair`` out of range.
    """
    if target is not None and (model is not None or constrain is not None):
        raise ValueError(
            "target and model/constrain: the target's ellipses are of the "
            "unconstrained x; pass one."
        )
    x, names = _draws(result_or_trace, model, constrain)
    n_draws = x.shape[1]
    if times is None:
        times = sorted({0, n_draws // 3, (2 * n_draws) // 3, n_draws - 1})
    times = [int(t) for t in times]
    if any(not 0 <= t < n_draws for t in times):
        raise ValueError(
            f"times must be draw indices in [0, {n_draws - 1}]; got {times}."
        )
    keep = np.linspace(0, x.shape[0] - 1, min(max_points, x.shape[0])).astype(int)
    fig, axes = _figure(1, len(times), width=3.2, height=3.2, sharex=True, sharey=True)
    one_d = x.shape[2] == 1
    i, j = (0, 0) if one_d else _coords(pair, names, "pair")
    for ax, t in zip(axes[0], times, strict=True):
        if one_d:
            ax.hist(x[:, t, 0], bins=40, density=True, color="0.5")
            ax.set_xlabel(names[0])
        else:
            ax.scatter(x[keep, t, i], x[keep, t, j], s=3, alpha=0.5, lw=0)
            if target is not None and target.hessian is not None:
                cov = np.asarray(target.cov)[np.ix_([i, j], [i, j])]
                w, v = np.linalg.eigh(cov)
                th = np.linspace(0, 2 * np.pi, 200)
                for r in (1.0, 2.0):
                    ell = (
                        v @ (np.sqrt(w)[:, None] * np.stack([np.cos(th), np.sin(th)]))
                    ) * r
                    ax.plot(
                        target.mean[i] + ell[0], target.mean[j] + ell[1], "k-", lw=0.8
                    )
            ax.set_xlabel(names[i])
            ax.set_ylabel(names[j])
            ax.set_aspect("equal", adjustable="box")
        ax.set_title(f"draw {t}")
    fig.suptitle(f"ensemble of {x.shape[0]:,} (showing {len(keep):,}) over time")
    return fig


def plot_gradient_savings(
    result: RunResult, *, num_particles: int | None = None, burn_in: int = 0
):
    """Per step, gradient evaluations as a fraction of LMC's ``N``.

    One per particle, with the cumulative fraction saved, and the ensemble
    fraction (CEnLMC: particles whose gradient the ensemble force replaced).

    Args:
      result: the RunResult of ``cj.sample``, with per-step infos.
      num_particles: ``N`` (default: the position's leading axis, 1 for one
        chain).
      burn_in: the step where the burn-in ended (drawn as a line), 0 for none.

    Returns:
      The matplotlib ``Figure``.

    Raises:
      ValueError: ``result`` without per-step infos or without ``grad_evals``.
    """
    if not isinstance(result, RunResult) or result.info is None:
        raise ValueError(
            "result must be a RunResult with per-step infos (what cj.sample returns)."
        )
    ge = getattr(result.info, "grad_evals", None)
    if ge is None:
        raise ValueError("result.info has no grad_evals field: nothing to plot.")
    if num_particles is None:
        pos = getattr(result.state, "position", None)
        num_particles = (
            int(np.shape(pos)[0]) if pos is not None and np.ndim(pos) >= 2 else 1
        )
    g = np.asarray(ge, np.float64)
    g = g.reshape(g.shape[0], -1).sum(axis=1) / num_particles
    frac = getattr(result.info, "ensemble_fraction", None)
    fig, axes = _figure(1, 2 if frac is not None else 1, width=4.5, height=3.0)
    ax = axes[0, 0]
    steps = np.arange(g.shape[0])
    ax.plot(steps, g, lw=0.8, label="gradients / N this step")
    saved = 1.0 - np.cumsum(g) / (steps + 1)
    ax.plot(steps, saved, lw=1.5, label="fraction saved so far")
    if burn_in:
        ax.axvline(burn_in, color="k", ls=":", lw=0.8, label="end of burn-in")
    ax.set_ylim(-0.02, 1.05)
    ax.set_xlabel("step")
    ax.set_title(f"gradient evaluations (N = {num_particles:,})")
    ax.legend(fontsize="small")
    if frac is not None:
        f = np.asarray(frac, np.float64)
        f = f.reshape(f.shape[0], -1).mean(axis=1)
        ax2 = axes[0, 1]
        ax2.plot(steps[: f.shape[0]], f, lw=0.8, color="C2")
        ax2.set_ylim(-0.02, 1.05)
        ax2.set_xlabel("step")
        ax2.set_title("ensemble fraction")
    return fig


def plot_coupling_distance(
    distances: Any, *, labels: Sequence[str] | None = None, logy: bool = True
):
    """Theorem 3.3's coupling distance ``E|x_i^m - z_i^m|`` against the step ``m``.

    CEnLMC ``x`` vs LMC ``z`` with the same noise
    (``cj.ensemble.coupling_distance``).

    Args:
      distances: one ``(num_steps,)`` array, a list of them, or a dict
        ``{label: array}`` (e.g. several ``N``).
      labels: the series' labels (default: the dict's keys, or none).
      logy: a logarithmic y axis.

    Returns:
      The matplotlib ``Figure``.

    Raises:
      ValueError: ``labels`` of another length than the series.
    """
    if isinstance(distances, dict):
        labels, series = list(distances), list(distances.values())
    elif isinstance(distances, (list, tuple)):
        series = list(distances)
    else:
        series = [distances]
    labels = list(labels) if labels is not None else [None] * len(series)
    if len(labels) != len(series):
        raise ValueError(
            f"labels must name the {len(series)} series; got {len(labels)}."
        )
    fig, axes = _figure(1, 1, width=5.0, height=3.4)
    ax = axes[0, 0]
    for lab, d in zip(labels, series, strict=True):
        d = np.asarray(d, np.float64).reshape(-1)
        ax.plot(np.arange(1, d.size + 1), d, lw=1.2, label=lab)
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel("step m")
    ax.set_ylabel("mean |x_i - z_i| (CEnLMC vs LMC)")
    ax.set_title("coupling distance (Thm 3.3)")
    if any(lab is not None for lab in labels):
        ax.legend(fontsize="small")
    return fig


def plot_acf(
    results: dict,
    *,
    max_lag: int = 50,
    coords: Sequence | None = None,
    model: Any = None,
    constrain: Any = None,
):
    """The multi-chain autocorrelation ``rho_t`` against the lag ``t``.

    :func:`cenlmc_jax.diagnostics.autocorrelation`, one panel per sampler side
    by side (shared axes), one line per coordinate.

    Args:
      results: ``{name: RunResult or chains-first draws}``.
      max_lag: the largest lag.
      coords: the coordinates to show (indices or names; default all).
      model: a model with ``.constrain`` (e.g. :func:`cenlmc_jax.from_numpyro`'s):
        the constrained values under their names (module docstring).
      constrain: ``x: (d,) -> {site: array}`` instead of ``model``. One for all.

    Returns:
      The matplotlib ``Figure``.

    Raises:
      ValueError: ``results`` not a non-empty dict, or bad ``coords``.
    """
    if not isinstance(results, dict) or not results:
        raise ValueError(
            "results must be a non-empty dict {sampler name: RunResult or draws}."
        )
    fig, axes = _figure(1, len(results), width=3.8, height=3.0, sharey=True)
    for ax, (name, res) in zip(axes[0], results.items(), strict=True):
        x, names = _draws(res, model, constrain)
        lag = min(max_lag, x.shape[1] - 1)
        rho = np.asarray(dg.autocorrelation(x, 0, 1, max_lag=lag), np.float64)
        for c in _coords(coords, names):
            ax.plot(np.arange(lag + 1), rho[:, c], lw=1.2, label=names[c])
        ax.axhline(0.0, color="k", lw=0.6)
        ax.set_xlabel("lag")
        ax.set_title(name)
        ax.legend(fontsize="small")
    axes[0, 0].set_ylabel("autocorrelation")
    return fig
