"""A NumPyro model's constrained values under their names: ``cj.summary(result,
model=m)``, ``cj.to_arviz(result, model=m)`` and ``cj.diagnostics.plots.*(...,
model=m)`` (cenlmc_jax.diagnostics.named_draws), on eight schools (non-centred), checked
against formulas they cannot fake (``tau = exp(x[1])`` and ``theta = mu + tau
theta_trans`` draw by draw, ArviZ's own summary of the exported data) and against
posteriordb's reference means (copied into the repository,
cenlmc_jax/models/posteriordb/data) within the Monte Carlo error.
"""

import io
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cenlmc_jax as cj
from cenlmc_jax.models import posteriordb as pdb
from cenlmc_jax.models.numpyro import from_numpyro

pytest.importorskip("numpyro")
from test_numpyro import eight_schools  # noqa: E402  (the model of posteriordb's Stan code, written once)

az = pytest.importorskip("arviz")
pytest.importorskip("matplotlib")

NAME = "eight_schools-eight_schools_noncentered"
SITES = (
    "mu",
    "tau",
    *(f"theta[{i}]" for i in range(8)),
    *(f"theta_trans[{i}]" for i in range(8)),
)


@pytest.fixture(autouse=True, scope="module")
def _float64():
    """float64 for this module's tests only (as tests/models/test_numpyro.py: never
    jax.config.update at import)."""
    with jax.enable_x64(True):
        yield


@pytest.fixture(scope="module")
def model(_float64):
    data = pdb.load_data(NAME)
    return from_numpyro(eight_schools, int(data["J"]), data["sigma"], y=data["y"])


@pytest.fixture(scope="module")
def run(model):
    """16 chains of hand-set MALA (as tests/models/test_numpyro.py: step 0.3, D =
    diag(9, 1, ..., 1), not an adaptation, so that these tests do not depend on the
    warm-ups), 500 burn-in + 1,000 draws, one compiled chunk of 500 steps. Starts
    uniform(-2, 2) on the unconstrained scale (Stan's)."""
    chains = 16
    D = jnp.array([9.0] + [1.0] * 9)
    algo = cj.vmap_chains(
        cj.irreversible_mh(
            model.logdensity_fn,
            cj.irreversible.sde_proposal(D, 0.0, model.logdensity_fn, 0.3),
        )
    )
    x0 = jax.random.uniform(
        jax.random.key(1), (chains, model.d), jnp.float64, -2.0, 2.0
    )
    with warnings.catch_warnings():
        warnings.simplefilter(
            "ignore", cj.diagnostics.ConvergenceWarning
        )  # R-hat is asserted below, per site
        return cj.sample(
            jax.random.key(2), algo, algo.init(x0), 1000, burn_in=500, chunk_size=500
        )


def test_plate_dims_of_the_model(model):
    assert model.dims == {"theta_trans": ("J",), "theta": ("J",)}


def test_summary_shows_the_constrained_sites_by_name(model, run):
    table = cj.summary(run, model=model)
    assert table.labels == SITES
    x = np.asarray(
        cj.diagnostics.chains_first(run)
    )  # (chains, draws, 10): mu, log tau, theta_trans[0..7]
    tau = np.exp(x[..., 1])
    theta = x[..., :1] + tau[..., None] * x[..., 2:]
    col = {name: i for i, name in enumerate(table.labels)}
    # exact: the statistics are of the draws mapped one by one (not exp of the mean of
    # log tau: Jensen)
    np.testing.assert_allclose(
        table.columns["mean"][col["tau"]], tau.mean(), rtol=1e-12
    )
    np.testing.assert_allclose(
        table.columns["sd"][col["tau"]], tau.std(ddof=1), rtol=1e-12
    )
    assert abs(table.columns["mean"][col["tau"]] - np.exp(x[..., 1].mean())) > 0.1
    np.testing.assert_allclose(
        table.columns["mean"][col["theta[0]"] : col["theta[7]"] + 1],
        theta.mean((0, 1)),
        rtol=1e-12,
    )
    np.testing.assert_allclose(
        table.columns["q5"][col["theta_trans[3]"]],
        np.quantile(x[..., 5], 0.05),
        rtol=1e-12,
    )
    assert tau.min() > 0 and table.columns["q5"][col["tau"]] > 0
    # the same table from constrain= and from the draws themselves
    again = cj.summary(
        np.asarray(cj.diagnostics.chains_first(run)), constrain=model.constrain
    )
    assert again.labels == SITES
    np.testing.assert_allclose(
        again.columns["r_hat"], table.columns["r_hat"], rtol=1e-12
    )
    assert str(table).splitlines()[2].strip().startswith("tau")


def test_constrained_means_match_the_posteriordb_reference(model, run):
    """posteriordb's theta[1..8] (1-based, Stan's) are our theta[0..7]. Tolerance:
    |mean - ref| <= 4.5 sqrt(mcse² + mcse_ref²), mcse the summary's own mcse_mean (of
    the constrained draws) and mcse_ref = ref_sd / sqrt(ref_ess): 4.5 sigma over 10
    quantities is a family-wise false alarm of ~7e-5 for a correct sampler and summary,
    while a summary of the unconstrained values (log tau: mean ~0.9 against tau's 3.6)
    or exp of the mean of log tau (~2.5) is off by 10 or more. The run's R-hat
    below 1.02 over 16 chains (1,000 draws each, ESS ~ 500-1,500): the MCSE of a run
    that has not mixed is not to be trusted."""
    post = pdb.load(NAME)
    table = cj.summary(run, model=model)
    col = {name: i for i, name in enumerate(table.labels)}
    rows = [
        col[f"theta[{int(n[6:-1]) - 1}]"] if n.startswith("theta[") else col[n]
        for n in post.names
    ]
    mean, mcse = table.columns["mean"][rows], table.columns["mcse_mean"][rows]
    z = (mean - post.ref_mean) / np.sqrt(mcse**2 + post.ref_sd**2 / post.ref_ess)
    assert np.all(table.columns["r_hat"][rows] < 1.02), dict(
        zip(post.names, table.columns["r_hat"][rows], strict=True)
    )
    assert np.all(np.abs(z) < 4.5), dict(zip(post.names, z, strict=True))


def test_to_arviz_has_the_sites_with_their_shapes_and_plates(model, run):
    idata = cj.to_arviz(run, model=model, sampler="mala")
    post = idata.posterior
    assert set(post.data_vars) == {"mu", "tau", "theta", "theta_trans"}
    assert post["tau"].dims == ("chain", "draw") and post["tau"].shape == (16, 1000)
    assert post["theta"].dims == ("chain", "draw", "J") and post["theta"].shape == (
        16,
        1000,
        8,
    )
    assert post["theta_trans"].dims == ("chain", "draw", "J")
    x = np.asarray(cj.diagnostics.chains_first(run))
    np.testing.assert_allclose(post["tau"].values, np.exp(x[..., 1]), rtol=1e-12)
    np.testing.assert_allclose(post["theta_trans"].values, x[..., 2:], rtol=0, atol=0)
    # ArviZ's own summary of the export = ours (same definitions, float64): one table,
    # two implementations
    theirs = az.summary(idata, var_names=["mu", "tau", "theta"], round_to="none")
    ours = cj.summary(run, model=model)
    col = {name: i for i, name in enumerate(ours.labels)}
    for name in ("mu", "tau", "theta[0]", "theta[7]"):
        np.testing.assert_allclose(
            theirs.loc[name, "mean"], ours.columns["mean"][col[name]], rtol=1e-12
        )
        np.testing.assert_allclose(
            theirs.loc[name, "ess_bulk"], ours.columns["ess_bulk"][col[name]], rtol=1e-6
        )
        np.testing.assert_allclose(
            theirs.loc[name, "r_hat"], ours.columns["r_hat"][col[name]], rtol=1e-6
        )
    # dims given by the caller win over the model's plates
    renamed = cj.to_arviz(run, model=model, dims={"theta": ["school"]})
    assert renamed.posterior["theta"].dims == ("chain", "draw", "school")
    assert renamed.posterior["theta_trans"].dims == ("chain", "draw", "J")


def test_plots_show_the_constrained_values_under_their_names(model, run):
    x = np.asarray(cj.diagnostics.chains_first(run))
    fig = cj.diagnostics.plots.plot_trace(
        run, model=model, coords=["tau", "theta[0]"], max_chains=2
    )
    assert [ax.get_ylabel() for ax in fig.axes[::2]] == ["tau", "theta[0]"]
    np.testing.assert_allclose(
        fig.axes[0].lines[1].get_ydata(), np.exp(x[1, :, 1]), rtol=1e-12
    )
    theta0 = x[0, :, 0] + np.exp(x[0, :, 1]) * x[0, :, 2]
    np.testing.assert_allclose(fig.axes[2].lines[0].get_ydata(), theta0, rtol=1e-12)
    fig = cj.diagnostics.plots.plot_rank(run, model=model, coords=[1, "mu"])
    assert [ax.get_title() for ax in fig.axes] == ["rank plot tau", "rank plot mu"]
    fig = cj.diagnostics.plots.plot_marginals(run, model=model, coords=["tau"])
    assert fig.axes[0].get_xlabel() == "tau"
    fig = cj.diagnostics.plots.plot_ensemble_pairs(
        run, constrain=model.constrain, pair=("mu", "tau"), times=[999]
    )
    assert (fig.axes[0].get_xlabel(), fig.axes[0].get_ylabel()) == ("mu", "tau")
    assert np.all(fig.axes[0].collections[0].get_offsets()[:, 1] > 0)  # tau > 0
    fig = cj.diagnostics.plots.plot_acf(
        {"mala": run}, model=model, coords=["tau"], max_lag=10
    )
    assert [line.get_label() for line in fig.axes[0].lines[:1]] == ["tau"]
    fig.savefig(io.BytesIO(), format="png", dpi=30)  # every artist drawn


def test_bad_arguments(model, run):
    draws = np.asarray(cj.diagnostics.chains_first(run))[:2, :50]
    with pytest.raises(ValueError, match="got both"):
        cj.summary(draws, model=model, constrain=model.constrain)
    with pytest.raises(ValueError, match="constrain=3"):
        cj.summary(draws, constrain=3)
    with pytest.raises(ValueError, match="model=int"):
        cj.to_arviz(run, model=3)
    with pytest.raises(ValueError, match="expected a dict"):
        cj.summary(draws, constrain=lambda x: (x, x))
    with pytest.raises(ValueError, match="'sigma' is not a coordinate name"):
        cj.diagnostics.plots.plot_trace(draws, model=model, coords=["sigma"])
    with pytest.raises(ValueError, match="target and model"):
        cj.diagnostics.plots.plot_marginals(
            draws, cj.models.targets.gaussian(jnp.zeros(10), jnp.eye(10)), model=model
        )
    # one array out of constrain: its coordinates are x[i] (or the labels given)
    table = cj.summary(draws, constrain=lambda x: x[:2], labels=["mu", "log tau"])
    np.testing.assert_allclose(
        table.columns["mean"], draws[..., :2].mean((0, 1)), rtol=1e-12
    )
    assert table.labels == ("mu", "log tau")
    assert cj.summary(draws, constrain=lambda x: x[:2]).labels == ("x[0]", "x[1]")


def test_streaming_run(model):
    """A streaming run keeps moments of x only: no constrained summary (refused);
    to_arviz constrains its final state (one draw per chain)."""
    algo = cj.vmap_chains(cj.rwmh(model.logdensity_fn, step_size=0.3))
    x0 = jax.random.uniform(jax.random.key(3), (4, model.d), jnp.float64, -2.0, 2.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = cj.sample(jax.random.key(4), algo, algo.init(x0), 20, mode="stream")
    with pytest.raises(ValueError, match="streaming run"):
        cj.summary(res, model=model)
    idata = cj.to_arviz(res, model=model)
    assert idata.posterior["tau"].shape == (4, 1)
    np.testing.assert_allclose(
        idata.posterior["tau"].values[:, 0],
        np.exp(np.asarray(res.state.position)[:, 1]),
        rtol=1e-12,
    )
