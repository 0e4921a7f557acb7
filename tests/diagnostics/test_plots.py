"""Every figure of cenlmc_jax.diagnostics.plots renders to a PNG (matplotlib's Agg, no
pyplot), and draws what it says."""

import jax
import numpy as np
import pytest
from matplotlib.figure import Figure

import cenlmc_jax as cj
from cenlmc_jax.diagnostics import plots


@pytest.fixture(scope="module")
def runs():
    t = cj.models.targets.banana()
    rw = cj.vmap_chains(cj.rwmh(t.logdensity_fn, 1.2))
    gam = cj.vmap_chains(
        cj.irreversible_mh(t.logdensity_fn, cj.irreversible.gamma_proposal(2.0, 0.8))
    )
    x0 = jax.random.normal(jax.random.key(0), (6, 2))
    r1 = cj.sample(jax.random.key(1), rw, rw.init(x0), 600, burn_in=100)
    r2 = cj.sample(
        jax.random.key(2), gam, gam.init(x0, jax.random.key(3)), 600, burn_in=100
    )
    g = cj.models.targets.standard_gaussian(2)
    ce = cj.cenlmc(g.logdensity_fn, 0.05, 0.32, 0.49, 0.32, 5, 4.6, f_star=g.f_star)
    r3 = cj.sample(
        jax.random.key(4),
        ce,
        ce.init(3.0 * jax.random.normal(jax.random.key(5), (400, 2))),
        60,
        burn_in=0,
    )
    return t, r1, r2, g, r3


def render(fig, path):
    assert isinstance(fig, Figure)
    fig.savefig(path, dpi=60)
    data = path.read_bytes()
    assert (
        data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    )  # a real picture, not an empty canvas
    return fig


def test_trace_and_rank_plots(runs, tmp_path):
    _, r1, *_ = runs
    fig = render(plots.plot_trace(r1, max_chains=3), tmp_path / "trace.png")
    assert (
        len(fig.axes) == 4 and len(fig.axes[0].lines) == 3
    )  # 2 coordinates x (trace, histogram); 3 chains
    fig = render(plots.plot_rank(r1), tmp_path / "rank.png")
    ax = fig.axes[0]
    heights = np.array([p.get_height() for p in ax.patches])
    assert heights.sum() == 6 * 600  # every draw of every chain lands in one rank bin


def test_marginals_against_quadrature_and_exact_density(runs, tmp_path):
    t, r1, _, g, r3 = runs
    fig = render(plots.plot_marginals(r1, t), tmp_path / "marginals.png")
    for ax in fig.axes:
        (curve,) = ax.lines
        x, y = curve.get_data()
        # the quadrature marginal is a density over the plotted range (which holds 99.9%
        # of the draws)
        assert 0.98 < np.trapezoid(y, x) <= 1.0 + 1e-6
    fig = render(plots.plot_marginals(r3, g), tmp_path / "marginals_gauss.png")
    x, y = fig.axes[0].lines[0].get_data()
    np.testing.assert_allclose(
        y, np.exp(-0.5 * x**2) / np.sqrt(2 * np.pi), rtol=1e-12
    )  # exact N(0, 1)


def test_ensemble_pairs_gradient_savings_and_coupling(runs, tmp_path):
    _, _, _, g, r3 = runs
    fig = render(plots.plot_ensemble_pairs(r3, target=g), tmp_path / "ensemble.png")
    assert len(fig.axes) == 4 and fig.axes[0].collections[0].get_offsets().shape == (
        400,
        2,
    )
    fig = render(plots.plot_gradient_savings(r3), tmp_path / "gradients.png")
    y = fig.axes[0].lines[0].get_ydata()
    np.testing.assert_allclose(
        y, np.asarray(r3.info.grad_evals) / 400
    )  # gradients per step as a fraction of N
    d = {
        f"N={n}": cj.ensemble.coupling_distance(
            jax.random.key(0),
            jax.random.normal(jax.random.key(1), (n, 2)),
            g.logdensity_fn,
            40,
            0.05,
            0.32,
            0.49,
            0.32,
            5,
            4.6,
            g.f_star,
        )
        for n in (200, 400)
    }
    fig = render(plots.plot_coupling_distance(d), tmp_path / "coupling.png")
    assert [line.get_label() for line in fig.axes[0].lines] == ["N=200", "N=400"]


def test_acf_two_samplers_side_by_side(runs, tmp_path):
    _, r1, r2, *_ = runs
    fig = render(
        plots.plot_acf({"rwmh": r1, "irreversible Gamma": r2}, max_lag=30),
        tmp_path / "acf.png",
    )
    assert [ax.get_title() for ax in fig.axes] == ["rwmh", "irreversible Gamma"]
    y = fig.axes[0].lines[0].get_ydata()
    assert y.shape == (31,) and y[0] == 1.0


def test_plot_input_errors(runs):
    _, r1, *_ = runs
    with pytest.raises(ValueError, match="coords must be coordinate indices"):
        plots.plot_trace(r1, coords=[5])
    with pytest.raises(ValueError, match="times must be draw indices"):
        plots.plot_ensemble_pairs(r1, times=[10_000])
    with pytest.raises(ValueError, match="non-empty dict"):
        plots.plot_acf([])
