"""cj.summary and cj.to_arviz, checked against ArviZ on the same draws and against the
run they describe.

They run with ArviZ 0.x (``arviz.InferenceData``; Python 3.11 gets 0.23) and with ArviZ
1.x (``xarray.DataTree``; Python >= 3.12): ``cj.to_arviz`` builds the one the installed
ArviZ has.
"""

import json
import math

import arviz as az
import jax
import numpy as np
import pytest

import cenlmc_jax as cj
from cenlmc_jax import diagnostics as D
from cenlmc_jax.diagnostics.summary import SummaryTable

COLUMNS = ("mean", "sd", "mcse_mean", "mcse_sd", "ess_bulk", "ess_tail", "r_hat")
AZ_MAJOR = int(az.__version__.split(".")[0])
GROUPS = {"posterior", "sample_stats", "warmup_sample_stats"}


def az_summary(data):
    """``az.summary(data)`` unrounded, with the tail ESS at the 5% and 95% quantiles
    (cj.summary's and ArviZ 0.x's) on either major version: ArviZ 1.x takes the tail
    quantiles from ``stats.ci_prob`` (1 - 0.89 and 0.89 by default)."""
    if AZ_MAJOR >= 1:
        with az.rc_context({"stats.ci_prob": 0.95}):
            return az.summary(data, round_to="none")
    return az.summary(data, round_to="none")


def groups(idata):
    """The group names of an InferenceData (ArviZ 0.x) or the children of a DataTree
    (1.x)."""
    return set(idata.children) if AZ_MAJOR >= 1 else set(idata.groups())


@pytest.fixture(scope="module")
def chains_run():
    """RW-MH on the 2-D banana: 6 chains, burn-in 50, thin 2 (a trace and per-step
    infos)."""
    t = cj.models.targets.banana()
    algo = cj.vmap_chains(cj.rwmh(t.logdensity_fn, 1.0))
    res = cj.sample(
        jax.random.key(3),
        algo,
        algo.init(jax.random.normal(jax.random.key(2), (6, 2))),
        800,
        burn_in=50,
        thin=2,
    )
    return t, res


@pytest.fixture(scope="module")
def ensemble_run():
    """CEnLMC on N(0, I_2), 400 particles, burn-in 20, thin 5."""
    t = cj.models.targets.standard_gaussian(2)
    algo = cj.cenlmc(t.logdensity_fn, 0.05, 0.32, 0.49, 0.32, 5, 4.6, f_star=t.f_star)
    res = cj.sample(
        jax.random.key(1),
        algo,
        algo.init(jax.random.normal(jax.random.key(0), (400, 2))),
        100,
        burn_in=20,
        thin=5,
    )
    return t, res


def test_summary_and_to_arviz_agree_with_arviz_summary(chains_run):
    """The issue's 'done when': the same draws through cj.summary and through
    az.summary(cj.to_arviz(result)): ESS and R-hat (and the rest) to 1e-6 relative
    (the summary computes in float64; measured ~1e-15)."""
    _, res = chains_run
    ours = cj.summary(res)
    theirs = az_summary(cj.to_arviz(res, thin=2))
    for col in COLUMNS:
        np.testing.assert_allclose(
            ours.columns[col], theirs[col].values, rtol=1e-6, err_msg=col
        )
    # and az.summary on the raw chains-first array gives the same table
    raw = az_summary(
        az.convert_to_dataset({"x": np.asarray(D.chains_first(res), np.float64)})
    )
    for col in COLUMNS:
        np.testing.assert_allclose(
            ours.columns[col], raw[col].values, rtol=1e-6, err_msg=col
        )


def test_summary_of_an_array_is_chains_first_and_quantiles_are_type_7(chains_run):
    _, res = chains_run
    x = np.asarray(D.chains_first(res), np.float64)
    table = cj.summary(x)
    np.testing.assert_allclose(
        table.columns["q5"], np.quantile(x.reshape(-1, 2), 0.05, axis=0), rtol=1e-12
    )
    np.testing.assert_allclose(
        table.columns["q50"], np.median(x.reshape(-1, 2), axis=0), rtol=1e-12
    )
    assert table.run == {"num_chains": 6, "num_draws": 400}


def test_summary_reports_the_run_and_z_scores_against_the_truth(chains_run):
    t, res = chains_run
    table = cj.summary(res, truth=t, burn_in=50)
    run = table.run
    assert (
        run["num_chains"] == 6
        and run["num_draws"] == 400
        and run["num_steps_done"] == 850
    )
    assert run["divergences"] == 0 and run["grad_evals"] == 0
    acc = np.asarray(res.info.acceptance_rate)[50:].mean()
    assert run["acceptance_rate"] == pytest.approx(float(acc), rel=1e-6)
    np.testing.assert_allclose(
        table.columns["z_mean"],
        (table.columns["mean"] - t.mean) / table.columns["mcse_mean"],
    )
    np.testing.assert_allclose(table.columns["true_sd"], np.sqrt(np.diag(t.cov)))
    # a correct sampler: z-scores of a 2-coordinate check stay within 5 (false alarm <
    # 1e-5)
    assert np.all(np.abs(table.columns["z_mean"]) < 5) and np.all(
        np.abs(table.columns["z_sd"]) < 5
    )
    text = str(table)
    for word in (
        "mean",
        "sd",
        "mcse_mean",
        "ess_bulk",
        "ess_tail",
        "r_hat",
        "q5",
        "q95",
        "z_mean",
        "x[1]",
        "divergences: 0",
        "gradient evaluations",
        "mean acceptance rate",
    ):
        assert word in text, word


def test_summary_csv_round_trip(chains_run, tmp_path):
    _, res = chains_run
    table = cj.summary(res)
    table.to_csv(tmp_path / "s.csv")
    back = SummaryTable.from_csv(tmp_path / "s.csv", run=table.run)
    assert back.labels == table.labels and list(back.columns) == list(table.columns)
    for col in table.columns:
        np.testing.assert_array_equal(
            back.columns[col], table.columns[col]
        )  # repr() round-trips floats
    assert str(back) == str(table)


def test_streaming_summary_says_what_it_has_and_its_errors_are_upper_bounds():
    """Stream and trace runs of the same chains (same key): the stream table's mcse
    bounds (sd/sqrt(N) from the final ensemble) are at least the trace's MCSE, as
    Cauchy-Schwarz promises for any correlation between steps; ESS and R-hat are nan."""
    t = cj.models.targets.standard_gaussian(2)
    algo = cj.vmap_chains(cj.rwmh(t.logdensity_fn, 0.8))
    state = algo.init(jax.random.normal(jax.random.key(0), (200, 2)))
    stream = cj.sample(jax.random.key(5), algo, state, 300, burn_in=50, mode="stream")
    trace = cj.sample(jax.random.key(5), algo, state, 300, burn_in=50)
    s, tr = cj.summary(stream, truth=t, burn_in=50), cj.summary(trace, truth=t)
    assert any("streaming run" in n for n in s.notes)
    assert np.all(np.isnan(s.columns["ess_bulk"])) and np.all(
        np.isnan(s.columns["r_hat"])
    )
    assert "ess_bulk" not in str(s) and "streaming run" in str(s)
    np.testing.assert_allclose(
        s.columns["mean"], tr.columns["mean"], rtol=1e-4
    )  # same draws, float32 sums
    assert np.all(s.columns["mcse_mean"] >= tr.columns["mcse_mean"])
    assert np.all(s.columns["mcse_sd"] >= tr.columns["mcse_sd"])
    final = np.asarray(stream.state.position, np.float64)
    np.testing.assert_allclose(
        s.columns["mcse_mean"], final.std(axis=0, ddof=1) / math.sqrt(200), rtol=1e-6
    )


def test_summary_rejects_bad_truth_and_labels(chains_run):
    _, res = chains_run
    with pytest.raises(ValueError, match=r"truth's mean must have shape \(2,\)"):
        cj.summary(res, truth=np.zeros(3))
    with pytest.raises(ValueError, match="keys among"):
        cj.summary(res, truth={"median": 0.0})
    with pytest.raises(ValueError, match="labels must name the 2"):
        cj.summary(res, labels=["a"])
    table = cj.summary(
        res, truth={"mean": 0.0, "sd": [1.0, 1.5]}, labels=["alpha", "beta"]
    )
    assert table.labels == ("alpha", "beta") and "z_sd" in table.columns


def test_to_arviz_groups_align_with_the_run(ensemble_run, tmp_path):
    t, res = ensemble_run
    idata = cj.to_arviz(
        res,
        thin=5,
        sampler="cenlmc",
        parameters={"step_size": 0.05, "n_star": 5},
        seed=1,
    )
    post = idata.posterior["x"].values
    np.testing.assert_array_equal(
        post, np.asarray(D.chains_first(res))
    )  # chain = particle
    assert post.shape == (400, 20, 2)
    ss = idata.sample_stats
    g = np.asarray(res.info.grad_evals)
    # each kept draw's stats sum the 5 steps that led to it, after the 20 burn-in steps
    np.testing.assert_array_equal(
        ss["grad_evals"].values[0], g[20:].reshape(20, 5).sum(axis=1)
    )
    np.testing.assert_allclose(
        ss["ensemble_fraction"].values[0],
        np.asarray(res.info.ensemble_fraction)[20:].reshape(20, 5).mean(axis=1),
        rtol=1e-6,
    )
    assert ss["diverged"].dtype == bool and not ss["diverged"].values.any()
    np.testing.assert_array_equal(
        idata.warmup_sample_stats["grad_evals"].values[0], g[:20]
    )
    attrs = idata.posterior.attrs
    assert (
        attrs["sampler"] == "cenlmc"
        and attrs["seed"] == "1"
        and attrs["inference_library"] == "cenlmc_jax"
    )
    assert json.loads(attrs["parameters"]) == {"step_size": 0.05, "n_star": 5}
    assert (
        attrs["inference_library_version"] == cj.__version__ and attrs["burn_in"] == 20
    )
    assert (
        idata.attrs["sampler"] == "cenlmc" and idata.attrs["burn_in"] == 20
    )  # the root's (InferenceData's)
    assert groups(idata) == GROUPS
    idata.to_netcdf(tmp_path / "run.nc")  # what cenlmc-jax sample writes as run.nc
    back = az.from_netcdf(tmp_path / "run.nc")
    assert groups(back) == GROUPS
    np.testing.assert_array_equal(back.posterior["x"].values, post)
    np.testing.assert_array_equal(
        back.sample_stats["grad_evals"].values, ss["grad_evals"].values
    )
    assert back.posterior.attrs["sampler"] == "cenlmc"
    with pytest.raises(ValueError, match="do not match the run"):
        cj.to_arviz(res, burn_in=7, thin=5)


def test_to_arviz_builds_the_container_of_the_installed_arviz(ensemble_run):
    """ArviZ 0.x: an InferenceData; ArviZ 1.x: an xarray.DataTree whose children are the
    same groups."""
    _, res = ensemble_run
    idata = cj.to_arviz(res)
    if AZ_MAJOR >= 1:
        import xarray as xr

        assert isinstance(idata, xr.DataTree)
    else:
        assert isinstance(idata, az.InferenceData)
    assert groups(idata) == GROUPS
    assert idata.posterior["x"].dims == ("chain", "draw", "x_dim_0")
    assert idata.sample_stats["grad_evals"].dims == ("chain", "draw")


def test_to_arviz_of_a_streaming_run_exports_the_final_state_and_the_moments(tmp_path):
    t = cj.models.targets.standard_gaussian(2)
    algo = cj.lmc(t.logdensity_fn, 0.05)
    res = cj.sample(
        jax.random.key(0),
        algo,
        algo.init(jax.random.normal(jax.random.key(1), (300, 2))),
        50,
        burn_in=10,
        mode="stream",
    )
    idata = cj.to_arviz(res)
    np.testing.assert_array_equal(
        idata.posterior["x"].values[:, 0], np.asarray(res.state.position)
    )
    attrs = idata.posterior.attrs
    assert (
        attrs["mode"] == "stream"
        and "no draws were kept" in attrs["note"]
        and attrs["burn_in"] == 10
    )
    np.testing.assert_allclose(attrs["stream_mean"], np.asarray(res.moments.mean))
    assert idata.sample_stats["grad_evals"].shape == (1, 50)
    idata.to_netcdf(
        tmp_path / "run.nc"
    )  # array attributes (stream_mean, stream_sd) included
    back = az.from_netcdf(tmp_path / "run.nc")
    np.testing.assert_allclose(
        back.posterior.attrs["stream_mean"], np.asarray(res.moments.mean)
    )
    assert back.posterior.attrs["mode"] == "stream"


# --------------------------------------------------------------------------
# nested_r_hat: chains in superchains
# --------------------------------------------------------------------------


def ar1_superchain_draws(key, k=8, m=4, n=40, d=2, rho=0.9):
    """``k`` superchains of ``m`` AR(1) chains, each superchain from its own start
    (N(0, 3²): overdispersed), ``n`` draws: (k m, n, d), float64 NumPy."""
    rng = np.random.default_rng(key)
    x = np.empty((k * m, n, d))
    x[:, 0] = np.repeat(3.0 * rng.standard_normal((k, d)), m, axis=0)
    for t in range(1, n):
        x[:, t] = rho * x[:, t - 1] + math.sqrt(1 - rho**2) * rng.standard_normal(
            (k * m, d)
        )
    return x


def test_nested_r_hat_is_nested_rhat_of_the_draws():
    x = ar1_superchain_draws(0)
    with jax.enable_x64(True):  # nested_rhat in float64, as the summary's NumPy
        want = np.asarray(D.nested.nested_rhat(x, 4))
    table = cj.summary(x, superchain_size=4)
    names = list(table.columns)
    assert names[names.index("r_hat") + 1] == "nested_r_hat"
    # the same formula in float64 both ways; XLA sums its reductions in another order
    # than NumPy's pairwise sums (differences of ~1e-9 seen): 1e-8
    np.testing.assert_allclose(table.columns["nested_r_hat"], want, rtol=1e-8)
    assert table.run["superchain_size"] == 4 and "nested_r_hat" in str(table)
    assert any("8 superchains of 4 chains" in n for n in table.notes), table.notes
    # read from the starts: the same column; independent starts: no column
    starts = x[:, 0]
    read = cj.summary(x, initial_position=starts)
    np.testing.assert_array_equal(
        read.columns["nested_r_hat"], table.columns["nested_r_hat"]
    )
    distinct = starts + np.arange(32.0)[:, None]
    assert "nested_r_hat" not in cj.summary(x, initial_position=distinct).columns
    assert "nested_r_hat" not in cj.summary(x).columns  # no superchains said: r_hat
    # 40 draws from superchain starts s ~ N(0, 3²), rho = 0.9: a superchain's mean
    # keeps 0.25 s of its start (the mean of 0.9^t over 40 draws), ~0.7 sd for a
    # typical |s| = 3: the superchains still remember their starts, nested R-hat
    # above 1.01 (1.22 and 1.06 here)
    assert np.all(table.columns["nested_r_hat"] > 1.01)


def test_nested_r_hat_of_a_streaming_run_is_that_of_its_draws():
    """Stream and trace runs of the same chains (same key) from 16 superchains of 4:
    the streamed column comes from the online per-chain moments of the two halves (an
    even number of draws: every draw is in one), the traced one from the draws."""
    t = cj.models.targets.standard_gaussian(2)
    algo = cj.vmap_chains(cj.rwmh(t.logdensity_fn, 0.8))
    starts = np.repeat(
        2.0 * np.asarray(jax.random.normal(jax.random.key(0), (16, 2))), 4, axis=0
    )
    state = algo.init(jax.numpy.asarray(starts, jax.numpy.float32))
    kw = dict(burn_in=0, check_convergence=False)
    stream = cj.sample(jax.random.key(5), algo, state, 200, mode="stream", **kw)
    trace = cj.sample(jax.random.key(5), algo, state, 200, **kw)
    s = cj.summary(stream, initial_position=starts)
    tr = cj.summary(trace, superchain_size=4)
    # float32 draws; the stream's Welford sums against the trace's two-pass ones
    np.testing.assert_allclose(
        s.columns["nested_r_hat"], tr.columns["nested_r_hat"], rtol=1e-4
    )
    with jax.enable_x64(True):
        want = np.asarray(
            D.nested.nested_rhat(np.asarray(D.chains_first(trace), np.float64), 4)
        )
    np.testing.assert_allclose(tr.columns["nested_r_hat"], want, rtol=1e-8)
    assert np.all(np.isnan(s.columns["r_hat"])) and "nested_r_hat" in str(s)


def test_summary_refuses_a_superchain_size_that_does_not_fit():
    x = ar1_superchain_draws(1)  # 32 chains
    with pytest.raises(ValueError, match="divide the 32 chains"):
        cj.summary(x, superchain_size=5)
    with pytest.raises(ValueError, match="divide the 32 chains"):
        cj.summary(x, superchain_size=32)  # one superchain
    with pytest.raises(ValueError, match="int >= 1"):
        cj.summary(x, superchain_size=0)
    with pytest.raises(ValueError, match="give one of them"):
        cj.summary(x, superchain_size=4, initial_position=x[:, 0])
    # 1: every chain its own start, no column
    assert "nested_r_hat" not in cj.summary(x, superchain_size=1).columns
