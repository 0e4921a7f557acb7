"""cj.from_numpyro (cenlmc_jax.models.numpyro): a NumPyro model's unconstrained log
density, through NumPyro's own initialize_model / potential_fn, checked on eight schools
(non-centred) against the posteriordb transcription (cenlmc_jax.models.posteriordb,
itself checked against scipy in tests/models/test_posteriordb.py) and by a sampler run
against posteriordb's reference means.
"""

import builtins
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cenlmc_jax as cj
from cenlmc_jax.models import posteriordb as pdb
from cenlmc_jax.models.numpyro import from_numpyro

numpyro = pytest.importorskip("numpyro")
dist = pytest.importorskip("numpyro.distributions")


@pytest.fixture(autouse=True, scope="module")
def _float64():
    """float64 for this module's tests only (a global ``jax.config.update`` at import
    would switch it on for every test collected after this file, in every pytest-xdist
    worker)."""
    with jax.enable_x64(True):
        yield


NAME = "eight_schools-eight_schools_noncentered"


def eight_schools(J, sigma, y=None):
    mu = numpyro.sample("mu", dist.Normal(0, 5))
    tau = numpyro.sample("tau", dist.HalfCauchy(5))
    with numpyro.plate("J", J):
        theta_trans = numpyro.sample("theta_trans", dist.Normal(0, 1))
        theta = numpyro.deterministic("theta", mu + tau * theta_trans)
        numpyro.sample("obs", dist.Normal(theta, sigma), obs=y)


@pytest.fixture(scope="module")
def model():
    data = pdb.load_data(NAME)
    return from_numpyro(eight_schools, int(data["J"]), data["sigma"], y=data["y"])


def to_posteriordb(m, x):
    """NumPyro's flat point (sites sorted: mu, tau, theta_trans) -> posteriordb's
    (theta_trans, mu, log tau)."""
    z = m.unravel(x)
    return jnp.concatenate([z["theta_trans"], z["mu"][None], z["tau"][None]])


def test_names_d_and_flattening(model):
    assert model.d == 10
    assert model.names == ("mu", "tau") + tuple(f"theta_trans[{i}]" for i in range(8))
    assert (
        model.initial_position.shape == (10,)
        and model.initial_position.dtype == jnp.float64
    )
    x = jnp.arange(10.0) / 10
    z = model.unravel(x)
    assert float(z["tau"]) == pytest.approx(
        0.1
    )  # the unconstrained (log) tau is coordinate 1
    c = model.constrain(x)
    np.testing.assert_allclose(
        c["tau"], np.exp(0.1), rtol=1e-12
    )  # HalfCauchy's support: tau = exp(u)
    np.testing.assert_allclose(
        c["theta"], 0.0 + np.exp(0.1) * np.arange(2, 10) / 10, rtol=1e-12
    )


def test_log_density_equals_the_posteriordb_one_up_to_a_constant(model):
    # NumPyro's HalfCauchy(5) is 2x Stan's Cauchy(0, 5) on tau > 0 (log 2), otherwise
    # the same terms and the same log-Jacobian u of tau = exp(u): the difference is one
    # constant at every point, to float64 round-off.
    post = pdb.load(NAME)
    points = jax.random.uniform(jax.random.key(0), (6, 10), jnp.float64, -2.0, 2.0)
    ours = jax.jit(jax.vmap(model.logdensity_fn))(points)
    theirs = jax.jit(jax.vmap(lambda x: post.logdensity_fn(to_posteriordb(model, x))))(
        points
    )
    diff = np.asarray(ours - theirs)
    assert np.all(np.isfinite(diff))
    np.testing.assert_allclose(diff - diff[0], 0.0, atol=1e-10)
    np.testing.assert_allclose(diff[0], np.log(2.0), atol=1e-10)
    g = jax.jit(jax.vmap(jax.grad(model.logdensity_fn)))(points)
    assert bool(jnp.all(jnp.isfinite(g)))
    # float32 in -> float32 out (the potential is cast to x's dtype)
    assert model.logdensity_fn(points[0].astype(jnp.float32)).dtype == jnp.float32


def test_mala_run_matches_the_posteriordb_reference_means(model):
    """16 chains of MALA (cj.irreversible_mh with an SDE proposal, Q = 0), 1,000
    burn-in + 2,000 draws each.

    A fixed, hand-set sampler (step 0.3, D = diag(9, 1, ..., 1): mu's posterior sd is
    ~3.3, the others' ~1 on the unconstrained scale), not an adaptation: the test is
    about the log density and ``constrain``, and must not depend on the adaptation being
    worked on elsewhere. Starts: uniform(-2, 2) (Stan's). Tolerance, per reported
    quantity (theta[1..8], mu, tau): |mean - ref| <= 4.5 sqrt(MCSE_run² + MCSE_ref²),
    MCSE_run = sd / sqrt(ESS) from the run's own bulk ESS (cj.diagnostics; ~1,500-3,000
    here), MCSE_ref from posteriordb's ESS. 4.5 sigma over 10 quantities is a
    family-wise false alarm of ~7e-5 for a correct sampler, while a wrong log density
    (e.g. a missing log-Jacobian of tau, which moves tau's mean by ~1 sd) is off by tens
    of MCSE. Also R-hat below 1.01 (rank-normalised split) and the sd within 10 %: 2,000
    x 16 draws at ESS >= 1,500 give the sd to ~2-3 % (MCSE of an sd ~ sd / sqrt(2 ESS)).
    ~15 s of CPU here, most of it compiling the 1,000-step chunk (30-50 s wall on the
    shared 2-core machine at a load of 7-11).
    """
    post = pdb.load(NAME)
    chains, burn_in, draws = 16, 1000, 2000
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
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # burn-in kept in the trace and dropped here: one compiled chunk of 1,000 steps
        # serves all three chunks
        result = cj.sample(
            jax.random.key(2), algo, algo.init(x0), burn_in + draws, chunk_size=1000
        )
    # no divergence and no frozen chain (convergence warnings over the whole trace,
    # burn-in included, may come)
    assert not [
        w
        for w in caught
        if "diverg" in str(w.message) or "did not move" in str(w.message)
    ]
    trace = result.trace[burn_in:]
    c = jax.jit(jax.vmap(jax.vmap(model.constrain)))(
        trace
    )  # sites: (draws, chains, ...)
    cols = {f"theta[{i + 1}]": c["theta"][..., i] for i in range(8)} | {
        "mu": c["mu"],
        "tau": c["tau"],
    }
    q = np.stack([np.asarray(cols[n]) for n in post.names], axis=-1).swapaxes(
        0, 1
    )  # (chains, draws, 10)
    ess = np.asarray(cj.diagnostics.effective_sample_size(q, method="bulk"))
    rhat = np.asarray(cj.diagnostics.potential_scale_reduction(q))
    sd = q.reshape(-1, 10).std(axis=0, ddof=1)
    mcse = np.sqrt(sd**2 / ess + post.ref_sd**2 / post.ref_ess)
    z = (q.reshape(-1, 10).mean(axis=0) - post.ref_mean) / mcse
    assert np.all(ess > 500), dict(zip(post.names, ess, strict=True))
    assert np.all(rhat < 1.01), dict(zip(post.names, rhat, strict=True))
    assert np.all(np.abs(z) < 4.5), dict(zip(post.names, z, strict=True))
    np.testing.assert_allclose(sd / post.ref_sd, 1.0, atol=0.10)


def test_bad_input_and_a_missing_numpyro(monkeypatch):
    with pytest.raises(ValueError, match="model=3"):
        from_numpyro(3)

    def all_observed(y):
        numpyro.sample("y", dist.Normal(0, 1), obs=y)

    with pytest.raises(ValueError, match="no|none"):
        from_numpyro(all_observed, 1.0)

    def discrete(y):
        k = numpyro.sample("k", dist.Poisson(3.0))
        numpyro.sample("y", dist.Normal(k, 1), obs=y)

    with pytest.raises(ValueError, match="'k' is discrete"):
        from_numpyro(discrete, 1.0)

    real_import = builtins.__import__

    def no_numpyro(name, *args, **kwargs):
        if name == "numpyro" or name.startswith("numpyro."):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_numpyro)
    with pytest.raises(ImportError, match="pip install numpyro"):
        from_numpyro(eight_schools, 8, np.ones(8), y=np.zeros(8))


def test_an_improper_latent_site_is_accepted_as_numpyro_accepts_it():
    # issue 47: a latent ImproperUniform site was refused (issue 28 had turned NumPyro's
    # bare NotImplementedError from a prior draw into a ValueError), though NumPyro's
    # own initialize_model accepts it (it starts from an init strategy, not the
    # prior); now it starts from init_to_uniform as NumPyro does
    def model(y):
        mu = numpyro.sample("mu", dist.ImproperUniform(dist.constraints.real, (), ()))
        sigma = numpyro.sample(
            "sigma", dist.ImproperUniform(dist.constraints.positive, (), ())
        )
        with numpyro.plate("N", y.shape[0]):
            numpyro.sample("y", dist.Normal(mu, sigma), obs=y)

    y = np.array([0.3, -1.2, 2.0, 0.7, 1.1])
    m = cj.from_numpyro(model, y)
    assert m.d == 2 and m.names == ("mu", "sigma")
    # the start is NumPyro's init_to_uniform: uniform on (-2, 2), unconstrained
    assert np.all(np.abs(np.asarray(m.initial_position)) < 2.0)
    x = jnp.array([0.4, -0.3])  # mu = 0.4, log sigma = -0.3
    want = -numpyro.infer.util.potential_energy(model, (y,), {}, m.unravel(x))
    # the same float64 computation by NumPyro's potential_fn: equal to rounding
    np.testing.assert_allclose(m.logdensity_fn(x), want, rtol=1e-12)
    # and by hand: the Normal likelihood plus log sigma's log-Jacobian (the flat
    # prior adds nothing); float64 rounding of a sum of 5 terms
    sigma = np.exp(-0.3)
    by_hand = np.sum(
        -0.5 * ((y - 0.4) / sigma) ** 2 - np.log(sigma) - 0.5 * np.log(2 * np.pi)
    ) + np.log(sigma)
    np.testing.assert_allclose(m.logdensity_fn(x), by_hand, rtol=1e-12)
    assert m.constrain(x)["sigma"] == pytest.approx(sigma, rel=1e-12)


def test_a_subsampled_plate_is_refused_before_the_first_evaluation():
    # issue 28: a minibatch log density was accepted and changed at every evaluation
    def model(y):
        mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
        with numpyro.plate("data", y.shape[0], subsample_size=5) as idx:
            numpyro.sample("y", dist.Normal(mu, 1.0), obs=y[idx])

    with pytest.raises(ValueError, match="plate 'data' subsamples 5 of 20"):
        cj.from_numpyro(model, np.zeros(20))
