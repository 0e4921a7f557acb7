"""The posteriordb models (cenlmc_jax.models.posteriordb) against an independent
transcription of each Stan model.

The reference here is written separately from the library's JAX code: NumPy loops as the
Stan code reads (``for (t in ...)``), scipy.stats densities, and Stan's constraining
transforms with their log-Jacobians written out by hand (lower bound: ``exp``, Jacobian
``u``; interval ``(a, b)``: ``a + (b - a) logistic(u)``, Jacobian ``log(b - a) + log l +
log(1 - l)``). Each model is compared at three unconstrained points: the reference's
posterior mean (mapped to the unconstrained scale by the inverse transforms written
here) and two points around it. Log densities are defined up to a constant, so the check
is on differences between points, to ``1e-9`` relative to the largest |log density|
(float64 round-off of sums over <= 5,000 terms is ~1e-13 relative; a wrong term, prior
or Jacobian changes the difference by O(1)). Nothing here reads ``../shared``: the data
and reference moments are the package's own copies. No sampler runs here (the samplers
are checked against the references by benchmarks/bench_posteriordb.py and
tests/models/test_numpyro.py).
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg
import scipy.special
import scipy.stats as st

from cenlmc_jax.models import posteriordb as pdb


@pytest.fixture(autouse=True, scope="module")
def _float64():
    """float64 for this module's tests only (a global ``jax.config.update`` at import
    would switch it on for every test collected after this file, in every pytest-xdist
    worker)."""
    with jax.enable_x64(True):
        yield


# ------------------------------------------------------------------ the independent
# transcription (NumPy/scipy)


def logistic(u):
    return 1.0 / (1.0 + math.exp(-u))


def lp_ark(data, p):
    K, T, y = int(data["K"]), int(data["T"]), data["y"]
    lp = st.norm.logpdf(p["alpha"], 0, 10) + st.norm.logpdf(p["beta"], 0, 10).sum()
    lp += st.cauchy.logpdf(p["sigma"], 0, 2.5)
    for t in range(K, T):  # Stan's t = K+1..T, 0-based
        mu = p["alpha"]
        for k in range(1, K + 1):
            mu = mu + p["beta"][k - 1] * y[t - k]
        lp += st.norm.logpdf(y[t], mu, p["sigma"])
    return lp


def lp_arma(data, p):
    y, T = data["y"], int(data["T"])
    mu, phi, theta, sigma = p["mu"], p["phi"], p["theta"], p["sigma"]
    err = np.zeros(T)
    err[0] = y[0] - (mu + phi * mu)
    for t in range(1, T):
        err[t] = y[t] - (mu + phi * y[t - 1] + theta * err[t - 1])
    lp = (
        st.norm.logpdf(mu, 0, 10)
        + st.norm.logpdf(phi, 0, 2)
        + st.norm.logpdf(theta, 0, 2)
    )
    return lp + st.cauchy.logpdf(sigma, 0, 2.5) + st.norm.logpdf(err, 0, sigma).sum()


def lp_diamonds(data, p):
    X, Y = data["X"].astype(float), data["Y"].astype(float)
    Xc = X[:, 1:] - X[:, 1:].mean(axis=0)
    lp = (
        st.norm.logpdf(p["b"], 0, 1).sum()
        + st.t.logpdf(p["Intercept"], 3, 8, 10)
        + st.t.logpdf(p["sigma"], 3, 0, 10)
    )
    return lp + st.norm.logpdf(Y, p["Intercept"] + Xc @ p["b"], p["sigma"]).sum()


def lp_earnings(data, p):
    return st.norm.logpdf(
        data["earn"], p["beta"][0] + p["beta"][1] * data["height"], p["sigma"]
    ).sum()


def lp_eight_schools(data, p):
    theta = p["theta_trans"] * p["tau"] + p["mu"]
    lp = (
        st.norm.logpdf(p["theta_trans"], 0, 1).sum()
        + st.norm.logpdf(data["y"], theta, data["sigma"]).sum()
    )
    return lp + st.norm.logpdf(p["mu"], 0, 5) + st.cauchy.logpdf(p["tau"], 0, 5)


def lp_garch(data, p):
    y, T = data["y"], int(data["T"])
    sigma = np.zeros(T)
    sigma[0] = float(data["sigma1"])
    for t in range(1, T):
        sigma[t] = math.sqrt(
            p["alpha0"]
            + p["alpha1"] * (y[t - 1] - p["mu"]) ** 2
            + p["beta1"] * sigma[t - 1] ** 2
        )
    return st.norm.logpdf(y, p["mu"], sigma).sum()


def lp_gp(data, p):
    x, k, N = data["x"].astype(float), data["k"], int(data["N"])
    cov = np.array(
        [
            [
                p["alpha"] ** 2 * math.exp(-((x[i] - x[j]) ** 2) / (2 * p["rho"] ** 2))
                for j in range(N)
            ]
            for i in range(N)
        ]
    ) + 1e-10 * np.eye(N)
    f = scipy.linalg.cholesky(cov, lower=True) @ p["f_tilde"]
    lp = st.gamma.logpdf(p["rho"], 25, scale=1 / 4) + st.norm.logpdf(p["alpha"], 0, 2)
    return (
        lp
        + st.norm.logpdf(p["f_tilde"], 0, 1).sum()
        + st.poisson.logpmf(k, np.exp(f)).sum()
    )


def lp_kidiq(data, p):
    mean = p["beta"][0] + p["beta"][1] * data["mom_iq"]
    return (
        st.cauchy.logpdf(p["sigma"], 0, 2.5)
        + st.norm.logpdf(data["kid_score"], mean, p["sigma"]).sum()
    )


def lp_mesquite(data, p):
    b = p["beta"]
    mean = b[0] + b[6] * data["group"]
    for j, col in enumerate(
        ("diam1", "diam2", "canopy_height", "total_height", "density")
    ):
        mean = mean + b[j + 1] * np.log(data[col])
    return st.norm.logpdf(np.log(data["weight"]), mean, p["sigma"]).sum()


def lp_blr(data, p):
    lp = st.norm.logpdf(p["beta"], 0, 10).sum() + st.norm.logpdf(p["sigma"], 0, 10)
    return lp + st.norm.logpdf(data["y"], data["X"] @ p["beta"], p["sigma"]).sum()


# Stan's parameters block of each model, in order: (name, size (0: scalar), transform)
POSITIVE, FREE, UNIT, GARCH_BETA = "positive", "free", "unit", "upper 1 - alpha1"
MODELS = {
    "arK-arK": (
        lp_ark,
        [("alpha", 0, FREE), ("beta", 5, FREE), ("sigma", 0, POSITIVE)],
    ),
    "arma-arma11": (
        lp_arma,
        [("mu", 0, FREE), ("phi", 0, FREE), ("theta", 0, FREE), ("sigma", 0, POSITIVE)],
    ),
    "diamonds-diamonds": (
        lp_diamonds,
        [("b", 24, FREE), ("Intercept", 0, FREE), ("sigma", 0, POSITIVE)],
    ),
    "earnings-earn_height": (lp_earnings, [("beta", 2, FREE), ("sigma", 0, POSITIVE)]),
    "eight_schools-eight_schools_noncentered": (
        lp_eight_schools,
        [("theta_trans", 8, FREE), ("mu", 0, FREE), ("tau", 0, POSITIVE)],
    ),
    "garch-garch11": (
        lp_garch,
        [
            ("mu", 0, FREE),
            ("alpha0", 0, POSITIVE),
            ("alpha1", 0, UNIT),
            ("beta1", 0, GARCH_BETA),
        ],
    ),
    "gp_pois_regr-gp_pois_regr": (
        lp_gp,
        [("rho", 0, POSITIVE), ("alpha", 0, POSITIVE), ("f_tilde", 11, FREE)],
    ),
    "kidiq-kidscore_momiq": (lp_kidiq, [("beta", 2, FREE), ("sigma", 0, POSITIVE)]),
    "mesquite-logmesquite": (lp_mesquite, [("beta", 7, FREE), ("sigma", 0, POSITIVE)]),
    "sblrc-blr": (lp_blr, [("beta", 5, FREE), ("sigma", 0, POSITIVE)]),
}


def constrain_by_hand(spec, u):
    """Stan's transforms, one coordinate at a time: (constrained dict, log-Jacobian)."""
    out, log_j, i = {}, 0.0, 0
    for name, size, kind in spec:
        n = max(size, 1)
        v = np.asarray(u[i : i + n], float)
        i += n
        if kind == POSITIVE:
            c, log_j = np.exp(v), log_j + v.sum()
        elif kind == UNIT:
            lg = np.array([logistic(a) for a in v])
            c, log_j = lg, log_j + np.sum(np.log(lg) + np.log1p(-lg))
        elif kind == GARCH_BETA:
            ub = 1.0 - out["alpha1"]
            lg = np.array([logistic(a) for a in v])
            c, log_j = (
                ub * lg,
                log_j + np.sum(math.log(ub) + np.log(lg) + np.log1p(-lg)),
            )
        else:
            c = v
        out[name] = c if size else float(c[0])
    assert i == len(u)
    return out, log_j


def unconstrain_by_hand(spec, p):
    """The inverse transforms (log, logit), for a point at the reference's mean."""
    u = []
    for name, _, kind in spec:
        v = np.atleast_1d(np.asarray(p[name], float))
        if kind == POSITIVE:
            v = np.log(v)
        elif kind == UNIT:
            v = scipy.special.logit(v)
        elif kind == GARCH_BETA:
            v = scipy.special.logit(v / (1.0 - p["alpha1"]))
        u += list(v)
    return np.array(u)


def reference_centre(name, post):
    """The reference means as a dict of Stan parameters (eight schools: theta_trans = 0;
    GP: f_tilde = L⁻¹ f)."""
    ref = dict(zip(post.names, post.ref_mean, strict=True))
    p = {}
    for n, v in ref.items():
        base = n.split("[")[0]
        p.setdefault(base, []).append(v)
    p = {k: np.array(v) if len(v) > 1 else v[0] for k, v in p.items()}
    if name.startswith("eight_schools"):
        p["theta_trans"] = np.zeros(8)
    if name.startswith("gp_pois"):
        x = pdb.load_data(name)["x"].astype(float)
        cov = p["alpha"] ** 2 * np.exp(
            -((x[:, None] - x[None, :]) ** 2) / (2 * p["rho"] ** 2)
        ) + 1e-10 * np.eye(11)
        p["f_tilde"] = scipy.linalg.solve_triangular(
            np.linalg.cholesky(cov), p["f"], lower=True
        )
    return p


# --------------------------------------------------------------------------------------
# tests


def test_names_cover_the_ten_posteriors_and_the_reference_table_loads():
    assert set(pdb.NAMES) == set(MODELS) and len(pdb.NAMES) == 10
    for name in pdb.NAMES:
        post = pdb.load(name)
        ref = pdb.reference(name)
        assert ref["num_draws"] == 10_000
        assert (
            post.names == tuple(ref["names"])
            and len(post.unconstrained_names) == post.d
        )
        assert (
            post.ref_mean.shape
            == post.ref_sd.shape
            == post.ref_ess.shape
            == (len(post.names),)
        )
        assert np.all(post.ref_sd > 0) and np.all(post.ref_ess > 1_000)
        assert post.d == sum(max(size, 1) for _, size, _ in MODELS[name][1])


@pytest.mark.parametrize("name", sorted(MODELS))
def test_log_density_equals_the_independent_transcription_up_to_a_constant(name):
    lp_ref, spec = MODELS[name]
    post = pdb.load(name)
    data = pdb.load_data(name)
    centre = unconstrain_by_hand(spec, reference_centre(name, post))
    rng = np.random.default_rng(0)
    points = [centre] + [centre + 0.3 * rng.standard_normal(post.d) for _ in range(2)]
    ours, theirs = [], []
    logdensity = jax.jit(
        post.logdensity_fn
    )  # one compilation for the three points (eager ops are slow here)
    for u in points:
        p, log_j = constrain_by_hand(spec, u)
        theirs.append(lp_ref(data, p) + log_j)
        ours.append(float(logdensity(jnp.asarray(u))))
    ours, theirs = np.array(ours), np.array(theirs)
    assert np.all(np.isfinite(ours))
    scale = np.max(np.abs(theirs))
    np.testing.assert_allclose(
        ours - ours[0], theirs - theirs[0], rtol=0, atol=1e-9 * scale + 1e-9
    )


@pytest.mark.parametrize("name", sorted(MODELS))
def test_gradients_are_finite_and_constrain_matches_the_hand_transforms(name):
    _, spec = MODELS[name]
    post = pdb.load(name)
    rng = np.random.default_rng(1)
    u = unconstrain_by_hand(
        spec, reference_centre(name, post)
    ) + 0.3 * rng.standard_normal(post.d)
    g = jax.jit(jax.grad(post.logdensity_fn))(jnp.asarray(u))
    assert (
        g.shape == (post.d,)
        and g.dtype == jnp.float64
        and bool(jnp.all(jnp.isfinite(g)))
    )
    p, _ = constrain_by_hand(spec, u)
    c = jax.jit(post.constrain)(jnp.asarray(u))
    assert set(c) == set(post.names)  # (jit returns a dict's keys sorted)
    for n, v in c.items():
        base, _, idx = n.partition("[")
        if base in p:  # a Stan parameter (not a transformed one such as theta or f)
            want = p[base] if not idx else p[base][int(idx[:-1]) - 1]
            np.testing.assert_allclose(float(v), want, rtol=1e-12)
    np.testing.assert_allclose(
        jax.jit(post.constrain_array)(jnp.asarray(u)), [float(c[n]) for n in post.names]
    )


def test_hand_computed_values():
    # eight schools at x = 0: theta_trans = 0, mu = 0, tau = e^0 = 1 (log-Jacobian 0),
    # theta = 0
    post = pdb.load("eight_schools-eight_schools_noncentered")
    y, s = (
        np.array([28, 8, -3, 7, -1, 1, 18, 12.0]),
        np.array([15, 10, 16, 11, 9, 11, 10, 18.0]),
    )
    want = (
        8 * -0.5 * math.log(2 * math.pi)
        + np.sum(-0.5 * (y / s) ** 2 - np.log(s) - 0.5 * math.log(2 * math.pi))
        + (-0.5 * math.log(2 * math.pi) - math.log(5))
        + -math.log(math.pi * 5 * (1 + 1 / 25))
    )
    np.testing.assert_allclose(
        float(post.logdensity_fn(jnp.zeros(10))), want, rtol=1e-12
    )
    c = post.constrain(jnp.array([1.0] * 8 + [2.0, math.log(3.0)]))
    assert float(c["tau"]) == pytest.approx(3.0) and float(
        c["theta[1]"]
    ) == pytest.approx(2.0 + 3.0)
    # garch at x = 0: alpha0 = 1, alpha1 = 1/2, beta1 = (1 - 1/2)/2 = 1/4
    c = pdb.load("garch-garch11").constrain(jnp.zeros(4))
    assert [float(c[k]) for k in ("mu", "alpha0", "alpha1", "beta1")] == pytest.approx(
        [0.0, 1.0, 0.5, 0.25]
    )


def test_float32_in_float32_out_and_bad_names_are_refused():
    post = pdb.load("kidiq-kidscore_momiq")
    x = jnp.array([26.0, 0.6, 2.9], jnp.float32)
    assert post.logdensity_fn(x).dtype == jnp.float32
    with pytest.raises(ValueError, match="name='kidiq'"):
        pdb.load("kidiq")
