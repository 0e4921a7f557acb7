"""Tests of the irreversible jump sampler and its proposals (docs/algorithms.md §7-8).

Statistical checks are z-tests against exact or quadrature moments with a
Monte-Carlo standard error from the effective sample size
(``cenlmc_jax.diagnostics.mcse``); many chains are vmapped in one call and run
under the driver ``cenlmc_jax.sample``.
"""

import functools
import importlib
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.scipy.stats import gamma as jgamma

import cenlmc_jax as cj
from cenlmc_jax import diagnostics as dg
from cenlmc_jax import irreversible as irr
from cenlmc_jax.models import targets
from cenlmc_jax.run import vmap_chains

# |z| below this is accepted: for a correct sampler z ~ N(0, 1), so a false
# alarm has probability 6e-5 per check.
Z_MAX = 4.0

J = np.array([[0.0, -1.0], [1.0, 0.0]])  # the rotation generator: skew-symmetric

# Step parameters at equal acceptance ~0.5 (Gamma shape k = 2 throughout),
# chosen by the grid search of benchmarks/bench_irreversible.py
# (`tune_to_acceptance`): acceptance of each sampler on a grid of scales,
# interpolated to 0.5. Equality of the acceptance is re-checked below.
GAMMA_SHAPE = 2.0
TUNED = {
    # target: (RW-MH scale, irreversible Gamma scale theta)
    "gaussian": (2.0, 0.8),
    "double_well": (1.5, 0.55),
}


def x64():
    ctx = getattr(jax, "enable_x64", None)
    if ctx is None:  # pragma: no cover - older JAX
        from jax.experimental import enable_x64 as ctx  # type: ignore
    return ctx(True)


def jv(fn):
    """jit(vmap(fn)): one compiled call instead of op-by-op dispatch of a batched
    function."""
    return jax.jit(jax.vmap(fn))


def gamma_init(x0, logdensity_fn, key, proposal=None):
    keys = jax.random.split(key, x0.shape[0])
    return jax.vmap(
        lambda x, k: irr.irreversible_mh_init(x, logdensity_fn, k, proposal=proposal)
    )(x0, keys)


def run_sampler(
    kind,
    target,
    param,
    *,
    n=500,
    steps=1000,
    burn_in=0,
    seed=0,
    x0=None,
    flip=True,
    trace_fn=None,
):
    """(n, steps, ...) trace and the reduced infos of ``kind`` in {"gamma", "rw", "sde"}
    on ``target``."""
    if x0 is None:
        x0 = jax.random.normal(jax.random.key(100 + seed), (n, target.dim))
    if kind == "gamma":
        prop = irr.gamma_proposal(GAMMA_SHAPE, param)
        state = gamma_init(x0, target.logdensity_fn, jax.random.key(200 + seed))
        step = functools.partial(
            irr.irreversible_mh_step, logdensity_fn=target.logdensity_fn, proposal=prop
        )
    elif kind == "rw":
        state = jax.vmap(lambda x: irr.rwmh_init(x, target.logdensity_fn))(x0)
        step = functools.partial(
            irr.rwmh_step, logdensity_fn=target.logdensity_fn, step_size=param
        )
    else:  # param is an SDE proposal
        state = gamma_init(
            x0, target.logdensity_fn, jax.random.key(200 + seed), proposal=param
        )
        step = functools.partial(
            irr.irreversible_mh_step,
            logdensity_fn=target.logdensity_fn,
            proposal=param,
            flip_on_reject=flip,
        )
    trace_fn = trace_fn or (lambda st: st.position)
    res = cj.sample(
        jax.random.key(seed),
        vmap_chains(step),
        state,
        steps,
        burn_in=burn_in,
        trace_fn=trace_fn,
    )
    return np.asarray(res.trace, np.float64).transpose(1, 0, 2), res.info


def z_scores(values, truth):
    """z = (mean - truth) / MCSE, MCSE from the multi-chain ESS; values: (chains, draws,
    k)."""
    est = values.mean(axis=(0, 1))
    return (est - truth) / np.asarray(dg.mcse(values)), est


def lag_acf(trace, lag):
    """Per-chain lag autocorrelation of coordinate 0 about the exact mean 0 (symmetric
    targets).

    Returns the mean over chains and its standard error (chains are independent).
    """
    x = trace[..., 0]
    per_chain = np.mean(x[:, :-lag] * x[:, lag:], axis=1) / np.mean(x**2, axis=1)
    return per_chain.mean(), per_chain.std(ddof=1) / math.sqrt(per_chain.size)


_DW_GRID = np.linspace(-6.0, 6.0, 400_001)
_DW_DENS = np.exp(-(_DW_GRID**4 - 2 * _DW_GRID**2) - 1.0)  # max of -U is 1 at θ = ±1


def double_well_moments():
    """E θ² and E θ⁴ of p ∝ exp(-(θ⁴ - 2θ²)) by the trapezoid rule (tails beyond |θ|=6
    are < e^-1000)."""
    z = np.trapezoid(_DW_DENS, _DW_GRID)
    return np.trapezoid(_DW_GRID**2 * _DW_DENS, _DW_GRID) / z, np.trapezoid(
        _DW_GRID**4 * _DW_DENS, _DW_GRID
    ) / z


def double_well_exact_draws(n, seed):
    """Exact draws by inverting the quadrature CDF: chains start in stationarity (no
    burn-in)."""
    cdf = np.concatenate(
        [[0.0], np.cumsum((_DW_DENS[1:] + _DW_DENS[:-1]) / 2 * np.diff(_DW_GRID))]
    )
    u = np.random.default_rng(seed).uniform(size=n) * cdf[-1]
    return jnp.asarray(np.interp(u, cdf, _DW_GRID)[:, None], jnp.float32)


@pytest.fixture(scope="module")
def gaussian_runs():
    tgt = targets.standard_gaussian(1)
    rw, gam = TUNED["gaussian"]
    x0 = tgt.sample(
        jax.random.key(7), 500
    )  # exact draws: chains start in stationarity, no burn-in
    # the Gamma run also records the direction: trace[..., 1] (see the uniform-direction
    # test)
    with_direction = lambda st: jnp.concatenate([st.position, st.direction], axis=-1)
    return {
        "rw": run_sampler("rw", tgt, rw, x0=x0, seed=0),
        "gamma": run_sampler("gamma", tgt, gam, x0=x0, seed=0, trace_fn=with_direction),
    }


@pytest.fixture(scope="module")
def double_well_runs():
    tgt = targets.double_well()
    rw, gam = TUNED["double_well"]
    x0 = double_well_exact_draws(500, seed=1)
    return {
        "rw": run_sampler("rw", tgt, rw, x0=x0, seed=1),
        "gamma": run_sampler("gamma", tgt, gam, x0=x0, seed=1),
    }


# ------------------------------------------------------------------ exact moments


@pytest.mark.parametrize("kind", ["gamma", "rw"])
def test_moments_on_1d_gaussian(gaussian_runs, kind):
    """E x = 0, E x² = 1, E x⁴ = 3 for N(0, 1)."""
    trace, info = gaussian_runs[kind]
    vals = np.stack([trace[..., 0], trace[..., 0] ** 2, trace[..., 0] ** 4], axis=-1)
    z, est = z_scores(vals, np.array([0.0, 1.0, 3.0]))
    assert np.all(np.abs(z) < Z_MAX), (kind, est, z)
    assert not np.any(np.asarray(info.diverged))


@pytest.mark.parametrize("kind", ["gamma", "rw"])
def test_moments_on_double_well_against_quadrature(double_well_runs, kind):
    """U = θ⁴ - 2θ²: E θ = 0 by symmetry, E θ², E θ⁴ by quadrature (computed here)."""
    m2, m4 = double_well_moments()
    np.testing.assert_allclose(
        m2, targets.double_well().cov[0, 0], rtol=1e-8
    )  # two quadratures agree
    trace, _ = double_well_runs[kind]
    vals = np.stack([trace[..., 0], trace[..., 0] ** 2, trace[..., 0] ** 4], axis=-1)
    z, est = z_scores(vals, np.array([0.0, m2, m4]))
    assert np.all(np.abs(z) < Z_MAX), (kind, est, (0.0, m2, m4), z)


@pytest.mark.parametrize("which", ["gaussian", "double_well"])
def test_irreversible_gamma_decorrelates_faster_than_rwmh_at_equal_acceptance(
    gaussian_runs, double_well_runs, which
):
    """Lag-5 autocorrelation: irreversible Gamma sampler below RW-MH at the same
    acceptance."""
    runs = gaussian_runs if which == "gaussian" else double_well_runs
    (tr_rw, info_rw), (tr_g, info_g) = runs["rw"], runs["gamma"]
    acc_rw, acc_g = (
        float(np.mean(info_rw.is_accepted)),
        float(np.mean(info_g.is_accepted)),
    )
    # 0.03: the lag-5 ACF of RW-MH changes by < 0.02 when its acceptance moves by
    # 0.03 near 0.5 (grid in bench_irreversible), far below the gap tested below.
    assert abs(acc_rw - acc_g) < 0.03 and abs(acc_rw - 0.5) < 0.05, (acc_rw, acc_g)
    r_rw, se_rw = lag_acf(tr_rw, 5)
    r_g, se_g = lag_acf(tr_g, 5)
    # the irreversible chain's ACF may be negative (it overshoots): compare |ρ5|;
    # 5 standard errors of the difference (independent chains) make a false pass
    # or failure from Monte-Carlo noise improbable (< 3e-7).
    assert abs(r_g) < r_rw - 5 * math.hypot(se_rw, se_g), (
        which,
        r_g,
        se_g,
        r_rw,
        se_rw,
    )
    ess_rw = float(dg.effective_sample_size(tr_rw)[0])
    ess_g = float(dg.effective_sample_size(tr_g)[0])
    assert ess_g > ess_rw, (
        ess_g,
        ess_rw,
    )  # the consequence for ESS, same number of draws


def test_direction_is_uniform_in_stationarity_and_flips_exactly_on_rejection(
    gaussian_runs,
):
    """π(z)·Unif(s) is stationary: the share of s = +1 over the run is 1/2 (z-test);
    the fraction of flips per step equals the fraction of rejections."""
    trace, info = gaussian_runs["gamma"]
    plus = (trace[..., 1:] > 0).astype(np.float64)  # (chains, draws, 1)
    z, est = z_scores(plus, np.array([0.5]))
    assert np.all(np.abs(z) < Z_MAX), (est, z)
    # the driver reduces both booleans to float32 fractions: equal up to float32
    # rounding of 1 - x
    np.testing.assert_allclose(
        np.asarray(info.direction_flipped),
        1.0 - np.asarray(info.is_accepted),
        rtol=0,
        atol=1e-6,
    )
    np.testing.assert_array_equal(np.asarray(info.grad_evals), 0)


# ------------------------------------------------------------ the step's formulas


def test_gamma_backward_density_cancels_through_the_general_formula():
    """log g̃(z|z*, s) = log f̃(z*|z, s) = Σ log Gamma(|z*_i - z_i|; k, θ); reversed
    jumps are impossible."""
    k, theta = 2.5, 0.3
    prop = irr.gamma_proposal(k, theta)
    key_z, key_s, key_p = jax.random.split(jax.random.key(0), 3)
    z = jax.random.normal(key_z, (200, 3))
    s = jax.random.rademacher(key_s, (200, 3), dtype=z.dtype)
    z_star = jv(prop.sample)(jax.random.split(key_p, 200), z, s)
    fwd = jv(prop.log_forward)(z_star, z, s)
    bwd = jv(prop.log_backward)(z, z_star, s)
    np.testing.assert_array_equal(
        np.asarray(bwd), np.asarray(fwd)
    )  # same expression: exact cancellation
    exact = jnp.sum(jgamma.logpdf(jnp.abs(z_star - z), k, scale=theta), axis=1)
    np.testing.assert_allclose(
        np.asarray(fwd), np.asarray(exact), rtol=1e-5, atol=1e-5
    )  # float32 rounding
    assert np.all(
        np.sign(np.asarray(z_star - z)) == np.asarray(s)
    )  # jumps go along s_i
    # the pairing f̃(·|y, -s) = g̃(·|y, s) (docs/algorithms.md §7) and zero density for
    # jumps against s
    np.testing.assert_array_equal(
        np.asarray(jv(prop.log_forward)(z, z_star, -s)),
        np.asarray(jv(prop.log_backward)(z, z_star, s)),
    )
    assert np.all(np.isneginf(np.asarray(jv(prop.log_forward)(z_star, z, -s))))


def test_coordinatewise_proposal_from_sample_f_and_sample_g():
    """The general builder: f_i = N(x + 3, 0.1²), g_i = N(x - 3, 0.1²) (a guided
    Gaussian walk). Coordinate i draws from f_i when s_i > 0 and from g_i otherwise; the
    pairing (7.1) holds."""
    norm = jax.scipy.stats.norm.logpdf
    prop = irr.coordinatewise_proposal(
        log_f=lambda xn, xo: norm(xn, xo + 3.0, 0.1),
        log_g=lambda xn, xo: norm(xn, xo - 3.0, 0.1),
        sample_f=lambda k, x: x + 3.0 + 0.1 * jax.random.normal(k, x.shape),
        sample_g=lambda k, x: x - 3.0 + 0.1 * jax.random.normal(k, x.shape),
    )
    z = jax.random.normal(jax.random.key(0), (100, 4))
    s = jax.random.rademacher(jax.random.key(1), (100, 4), dtype=z.dtype)
    z_star = jv(prop.sample)(jax.random.split(jax.random.key(2), 100), z, s)
    # jumps of ±3 with sd 0.1: the sign of every jump is the sign of s_i (a 30-sd
    # margin)
    np.testing.assert_array_equal(np.sign(np.asarray(z_star - z)), np.asarray(s))
    fwd = jv(prop.log_forward)(z_star, z, s)
    exact = jnp.sum(norm(z_star, z + 3.0 * s, 0.1), axis=1)
    np.testing.assert_allclose(
        np.asarray(fwd), np.asarray(exact), rtol=1e-5
    )  # float32 rounding
    np.testing.assert_array_equal(
        np.asarray(jv(prop.log_backward)(z, z_star, s)),
        np.asarray(jv(prop.log_forward)(z, z_star, -s)),
    )


@pytest.mark.parametrize(
    "k", [2.0, 2.5]
)  # integer k: sum of exponentials; else jax.random.gamma
def test_gamma_jumps_have_the_gamma_law(k):
    """z*_i - z_i = s_i G, G ~ Gamma(k, θ): mean kθ and variance kθ² (z-test, i.i.d.
    draws)."""
    theta, n = 0.7, 100_000
    prop = irr.gamma_proposal(k, theta)
    z = jnp.zeros((n, 1))
    s = -jnp.ones((n, 1))
    jumps = -np.asarray(jv(prop.sample)(jax.random.split(jax.random.key(1), n), z, s))[
        :, 0
    ]
    for stat, exact, sd in [
        (jumps, k * theta, math.sqrt(k) * theta),
        (
            (jumps - k * theta) ** 2,
            k * theta**2,
            math.sqrt(2 * k * theta**4 * (k + 3)),
        ),  # Var of squared dev.
    ]:
        assert abs(stat.mean() - exact) / (sd / math.sqrt(n)) < Z_MAX, (
            stat.mean(),
            exact,
        )


def _one_step_check(prop, logdensity_fn, z, s, key):
    """One step per chain; returns (state, info, z*) with z* redrawn from the documented
    key split."""
    state = jv(lambda x, d: irr.IrreversibleMHState(x, d, logdensity_fn(x)))(z, s)
    keys = jax.random.split(key, z.shape[0])
    step = jax.jit(
        jv(
            functools.partial(
                irr.irreversible_mh_step, logdensity_fn=logdensity_fn, proposal=prop
            )
        )
    )
    new, info = step(keys, state)
    z_star = jv(lambda k, x, d: prop.sample(jax.random.split(k)[0], x, d))(keys, z, s)
    return state, new, info, z_star


def test_accept_keeps_direction_and_reject_flips_the_whole_vector():
    tgt = targets.correlated_gaussian(3, 0.5)
    n = 2000
    prop = irr.gamma_proposal(GAMMA_SHAPE, 0.6)
    z = tgt.sample(jax.random.key(0), n)
    s = jax.random.rademacher(jax.random.key(1), (n, 3), dtype=z.dtype)
    state, new, info, z_star = _one_step_check(
        prop, tgt.logdensity_fn, z, s, jax.random.key(2)
    )
    acc = np.asarray(info.is_accepted)
    assert 0.2 < acc.mean() < 0.8  # both branches are exercised (acceptance ~0.5 here)
    np.testing.assert_array_equal(
        np.asarray(new.position), np.where(acc[:, None], z_star, z)
    )
    np.testing.assert_array_equal(
        np.asarray(new.direction), np.where(acc[:, None], s, -s)
    )
    np.testing.assert_array_equal(np.asarray(info.direction_flipped), ~acc)
    # the Gamma ratio cancels: a = min(1, π(z*)/π(z)) exactly as the spec says
    a = np.minimum(
        1.0,
        np.exp(np.asarray(jv(tgt.logdensity_fn)(z_star) - jv(tgt.logdensity_fn)(z))),
    )
    np.testing.assert_allclose(
        np.asarray(info.acceptance_rate), a, rtol=1e-5, atol=1e-7
    )  # float32 rounding


def _mala_log_ratio(logdensity_fn, z, z_star, tau, precond):
    """Hand-written (preconditioned) MALA: q(x'|x) = N(x + τ C ∇log π(x), 2τ C)."""
    g = jax.grad(logdensity_fn)
    cinv = jnp.linalg.inv(precond)

    def logq(xp, x):
        r = xp - x - tau * precond @ g(x)
        return (
            -r @ cinv @ r / (4 * tau)
        )  # the normalising constants are equal and cancel

    return logdensity_fn(z_star) - logdensity_fn(z) + logq(z, z_star) - logq(z_star, z)


@pytest.mark.parametrize("precond", [np.eye(2), np.array([[1.0, 0.4], [0.4, 0.5]])])
def test_sde_proposal_with_q_zero_is_mala(precond):
    """Q = 0, D = C constant: the SDE proposal step has MALA's acceptance
    probability."""
    tgt = targets.banana()
    n, tau = 500, 0.3
    prop = irr.sde_proposal(precond, 0.0, tgt.logdensity_fn, tau)
    with x64():  # exact comparison without float32 rounding of the log densities
        z = tgt.sample(jax.random.key(0), n).astype(jnp.float64)
        s = jax.random.rademacher(jax.random.key(1), (n, 1), dtype=jnp.float64)
        _, new, info, z_star = _one_step_check(
            prop, tgt.logdensity_fn, z, s, jax.random.key(2)
        )
        lr = jv(
            lambda a, b: _mala_log_ratio(
                tgt.logdensity_fn, a, b, tau, jnp.asarray(precond)
            )
        )(z, z_star)
        np.testing.assert_allclose(
            np.asarray(info.acceptance_rate),
            np.minimum(1.0, np.exp(np.asarray(lr))),
            rtol=1e-10,
            atol=1e-12,
        )  # float64 rounding
        # and MALA's proposal: z* = z + τ C ∇log π(z) + sqrt(2τ) chol(C) ξ with the
        # proposal's key
        assert 0.2 < float(np.mean(info.is_accepted)) < 0.98  # both branches exercised
        # one value_and_grad per step, at z*: the gradient at z is cached in the state
        # (as MALA's)
        np.testing.assert_array_equal(np.asarray(info.grad_evals), 1)


def test_sde_proposal_densities_are_eq_8_1_with_analytic_gamma():
    """Callable D(z), Q(z): log f̃ and log g̃ equal (8.1) written out with Γ by hand,
    for s = ±1."""
    tgt = targets.correlated_gaussian(2, 0.5)
    eps = 0.05
    Dfn = lambda z: jnp.diag(1.0 + z**2)  # Γ_D,i = ∂_i D_ii = 2 z_i
    Qfn = lambda z: (
        (1.0 + 0.5 * z[0] + 0.25 * z[1] ** 2) * jnp.asarray(J, z.dtype)
    )  # Γ_Q = J ∇q = J (0.5, 0.5 z_2)
    prop = irr.sde_proposal(Dfn, Qfn, tgt.logdensity_fn, eps)
    g = jax.grad(tgt.logdensity_fn)

    def log_n(x, z, s):  # N(x; z + ε[(D + sQ)∇log π + Γ_s], 2εD(z)) by hand
        gam = 2 * z + s * jnp.asarray(J) @ jnp.array([0.5, 0.5 * z[1]])
        mean = z + eps * ((Dfn(z) + s * Qfn(z)) @ g(z) + gam)
        var = 2 * eps * (1.0 + z**2)
        return jnp.sum(-0.5 * (x - mean) ** 2 / var - 0.5 * jnp.log(2 * math.pi * var))

    with x64():
        z = jax.random.normal(jax.random.key(0), (50, 2), jnp.float64)
        zs = jax.random.normal(jax.random.key(1), (50, 2), jnp.float64)
        for sign in (1.0, -1.0):
            d = jnp.full((1,), sign)
            fwd = jv(lambda a, b: prop.log_forward(a, b, d))(zs, z)
            bwd = jv(lambda a, b: prop.log_backward(a, b, d))(z, zs)
            np.testing.assert_allclose(
                fwd, jv(lambda a, b: log_n(a, b, sign))(zs, z), rtol=1e-12
            )  # float64
            np.testing.assert_allclose(
                bwd, jv(lambda a, b: log_n(a, b, -sign))(z, zs), rtol=1e-12
            )
        # sample draws from f̃: z* = mean + sqrt(2ε D) ξ, checked through the mean over
        # many draws
        z0 = jnp.array([0.3, -0.7])
        d = jnp.ones((1,))
        draws = jv(lambda k: prop.sample(k, z0, d))(
            jax.random.split(jax.random.key(2), 100_000)
        )
        gam = 2 * z0 + jnp.asarray(J) @ jnp.array([0.5, 0.5 * z0[1]])
        mean = z0 + eps * ((Dfn(z0) + Qfn(z0)) @ g(z0) + gam)
        se = np.sqrt(2 * eps * (1 + np.asarray(z0) ** 2) / 100_000)
        assert np.all(np.abs(np.asarray(draws.mean(0) - mean)) / se < Z_MAX)


# -------------------------------------------------------------- SDE-proposal sampler

SDE_EPS, SDE_C = (
    0.05,
    3.0,
)  # Q = 3 J; acceptance ~0.55 (see the no-flip test for why these)


@pytest.fixture(scope="module")
def rho09():
    return targets.correlated_gaussian(2, 0.9)


def _second_moments(trace):
    return np.stack(
        [trace[..., 0] ** 2, trace[..., 1] ** 2, trace[..., 0] * trace[..., 1]], axis=-1
    )


def test_sde_proposal_sampler_covariance_on_correlated_gaussian(rho09):
    """D = I, Q = 3 J on N(0, [[1, .9], [.9, 1]]): mean and covariance within MCSE."""
    prop = irr.sde_proposal(np.eye(2), SDE_C * J, rho09.logdensity_fn, SDE_EPS)
    x0 = rho09.sample(jax.random.key(11), 500)
    trace, info = run_sampler("sde", rho09, prop, n=500, steps=1000, x0=x0, seed=2)
    z, est = z_scores(
        np.concatenate([trace, _second_moments(trace)], -1),
        np.array([0, 0, 1.0, 1.0, 0.9]),
    )
    assert np.all(np.abs(z) < Z_MAX), (est, z)
    # the driver sums the int grad_evals over the 500 chains: 1 gradient per chain-step
    # (at z*)
    np.testing.assert_array_equal(np.asarray(info.grad_evals), 1 * 500)


def test_sde_proposal_without_flipping_has_a_visibly_wrong_covariance(rho09):
    """Spec 8: keeping Q but never flipping s breaks invariance (the rejection
    probabilities of s and -s differ). At ε = 0.05, Q = 3J the variances come out ~1.4
    instead of 1: visible (> 20 % off) and far outside the MCSE. (At ε = 0.1, Q = J the
    no-flip error is below the MCSE of this run size: the size of the error depends on
    the settings.)"""
    prop = irr.sde_proposal(np.eye(2), SDE_C * J, rho09.logdensity_fn, SDE_EPS)
    x0 = rho09.sample(jax.random.key(11), 500)
    trace, info = run_sampler(
        "sde", rho09, prop, n=500, steps=1000, x0=x0, seed=2, flip=False
    )
    assert float(np.max(np.asarray(info.direction_flipped))) == 0.0
    z, est = z_scores(_second_moments(trace), np.array([1.0, 1.0, 0.9]))
    assert np.all(est[:2] > 1.2), est
    assert np.all(z > 10 * Z_MAX), (est, z)  # not a fluctuation


def test_sde_proposal_with_position_dependent_d_and_q_is_exact():
    """Callable D(z), Q(z) (Cholesky and log-det of D(z) vary, Γ ≠ 0): moments within
    MCSE."""
    tgt = targets.correlated_gaussian(2, 0.5)
    Dfn = lambda z: jnp.diag(0.5 + 0.5 / (1.0 + z**2))
    Qfn = lambda z: (1.0 + 0.5 * jnp.tanh(z[0])) * jnp.asarray(J, z.dtype)
    prop = irr.sde_proposal(Dfn, Qfn, tgt.logdensity_fn, 0.2)
    x0 = tgt.sample(jax.random.key(12), 400)
    trace, info = run_sampler("sde", tgt, prop, n=400, steps=600, x0=x0, seed=3)
    assert (
        0.3 < float(np.mean(info.is_accepted)) < 0.99
    )  # a real test of the correction
    z, est = z_scores(
        np.concatenate([trace, _second_moments(trace)], -1),
        np.array([0, 0, 1.0, 1.0, 0.5]),
    )
    assert np.all(np.abs(z) < Z_MAX), (est, z)


# --------------------------------------------------------------- vmap, API, input


def test_vmapped_over_1e5_chains():
    n = 100_000
    tgt = targets.banana()
    x0 = tgt.sample(jax.random.key(0), n)
    state = jax.jit(functools.partial(gamma_init, logdensity_fn=tgt.logdensity_fn))(
        x0, key=jax.random.key(1)
    )
    # the initial direction is uniform on {-1, +1}^d: share of +1 is 1/2 ± 0.5/sqrt(n)
    d = np.asarray(state.direction)
    assert set(np.unique(d)) == {-1.0, 1.0} and d.dtype == np.float32
    assert np.all(np.abs((d > 0).mean(0) - 0.5) / (0.5 / math.sqrt(n)) < Z_MAX)
    prop = irr.gamma_proposal(GAMMA_SHAPE, 0.5)
    step = jax.jit(
        vmap_chains(
            functools.partial(
                irr.irreversible_mh_step, logdensity_fn=tgt.logdensity_fn, proposal=prop
            )
        )
    )
    new, info = step(jax.random.key(2), state)
    assert (
        new.position.shape == (n, 2)
        and new.direction.shape == (n, 2)
        and info.is_accepted.shape == (n,)
    )
    assert np.all(np.isfinite(np.asarray(new.position))) and not np.any(
        np.asarray(info.diverged)
    )
    rw = jax.jit(
        vmap_chains(
            functools.partial(
                irr.rwmh_step, logdensity_fn=tgt.logdensity_fn, step_size=1.0
            )
        )
    )
    rstate = jax.vmap(lambda x: irr.rwmh_init(x, tgt.logdensity_fn))(x0)
    rnew, rinfo = rw(jax.random.key(2), rstate)
    assert rnew.position.shape == (n, 2) and rinfo.acceptance_rate.shape == (n,)


def _all_samplers(dtype):
    tgt = targets.banana()
    z = jnp.asarray([0.3, -0.2], dtype)
    sde = irr.sde_proposal(np.eye(2), J, tgt.logdensity_fn, 0.1)
    return (
        tgt,
        z,
        [
            (
                "gamma",
                irr.irreversible_mh_init(z, tgt.logdensity_fn, jax.random.key(0)),
                functools.partial(
                    irr.irreversible_mh_step,
                    logdensity_fn=tgt.logdensity_fn,
                    proposal=irr.gamma_proposal(2.0, 0.5),
                ),
            ),
            (
                "sde",
                irr.irreversible_mh_init(
                    z, tgt.logdensity_fn, jax.random.key(0), proposal=sde
                ),
                functools.partial(
                    irr.irreversible_mh_step,
                    logdensity_fn=tgt.logdensity_fn,
                    proposal=sde,
                ),
            ),
            (
                "rw",
                irr.rwmh_init(z, tgt.logdensity_fn),
                functools.partial(
                    irr.rwmh_step, logdensity_fn=tgt.logdensity_fn, step_size=0.5
                ),
            ),
        ],
    )


def test_float64_is_preserved():
    with x64():
        _, _, samplers = _all_samplers(jnp.float64)
        for name, state, step in samplers:
            new, info = step(jax.random.key(1), state)
            for leaf in jax.tree_util.tree_leaves(new) + [info.acceptance_rate]:
                assert leaf.dtype == jnp.float64, (name, leaf.dtype)
            assert (
                info.grad_evals.dtype == jnp.int32 and info.diverged.dtype == jnp.bool_
            )


def test_same_key_same_result_typed_and_legacy_keys_and_jit_agrees():
    _, _, samplers = _all_samplers(jnp.float32)
    for name, state, step in samplers:
        for _ in range(
            2
        ):  # two steps, so that accept and reject are likely both exercised
            a, ia = step(jax.random.key(7), state)
            b, _ = step(jax.random.key(7), state)
            c, _ = step(
                jax.random.PRNGKey(7), state
            )  # same bits as key(7): same result
            d, id_ = jax.jit(step)(jax.random.key(7), state)
            for x, y in [(a, b), (a, c)]:
                jax.tree_util.tree_map(np.testing.assert_array_equal, x, y)
            # jit may fuse and reorder float32 ops: equal to rounding
            jax.tree_util.tree_map(
                lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6),
                a,
                d,
            )
            assert bool(ia.is_accepted) == bool(id_.is_accepted), name
            state = a


def test_diverged_proposal_is_rejected_and_reported():
    logp = lambda x: jnp.where(
        x[0] > 0.5, jnp.nan, -0.5 * jnp.sum(x**2)
    )  # NaN region to the right
    state = irr.irreversible_mh_init(jnp.zeros(1), logp, jax.random.key(0))
    state = state._replace(direction=jnp.ones(1))
    new, info = irr.irreversible_mh_step(
        jax.random.key(1), state, logp, irr.gamma_proposal(1.0, 100.0)
    )
    assert (
        bool(info.diverged)
        and not bool(info.is_accepted)
        and float(info.acceptance_rate) == 0.0
    )
    np.testing.assert_array_equal(np.asarray(new.position), [0.0])
    np.testing.assert_array_equal(np.asarray(new.direction), [-1.0])


def test_bad_input_raises_value_error():
    tgt = targets.standard_gaussian(2)
    lp = tgt.logdensity_fn
    for shape, scale in [
        (0.0, 1.0),
        (-1.0, 1.0),
        (1.0, 0.0),
        (1.0, -2.0),
        (float("nan"), 1.0),
    ]:
        with pytest.raises(ValueError, match="shape|scale"):
            irr.gamma_proposal(shape, scale)
    rstate = irr.rwmh_init(jnp.zeros(2), lp)
    for step_size in (0.0, -0.5):
        with pytest.raises(ValueError, match="step_size"):
            irr.rwmh_step(jax.random.key(0), rstate, lp, step_size)
    for eps in (0.0, -0.1):
        with pytest.raises(ValueError, match="step_size"):
            irr.sde_proposal(np.eye(2), J, lp, eps)
    with pytest.raises(ValueError, match="positive definite"):
        irr.sde_proposal(np.diag([1.0, -1.0]), J, lp, 0.1)
    with pytest.raises(ValueError, match="positive definite"):
        irr.sde_proposal(
            np.diag([1.0, 0.0]), J, lp, 0.1
        )  # PSD only: no proposal density
    with pytest.raises(ValueError, match="symmetric"):
        irr.sde_proposal(np.array([[1.0, 0.5], [0.0, 1.0]]), J, lp, 0.1)
    with pytest.raises(ValueError, match="skew"):
        irr.sde_proposal(np.eye(2), np.array([[0.0, 1.0], [1.0, 0.0]]), lp, 0.1)
    with pytest.raises(ValueError, match="same size"):
        irr.sde_proposal(np.eye(3), J, lp, 0.1)
    # callables are checked at the initial point
    bad_d = irr.sde_proposal(
        lambda z: jnp.diag(z), J, lp, 0.1
    )  # D(z) = diag(z): not PD at z = (1, -1)
    with pytest.raises(ValueError, match="positive definite"):
        irr.irreversible_mh_init(
            jnp.array([1.0, -1.0]), lp, jax.random.key(0), proposal=bad_d
        )
    bad_q = irr.sde_proposal(
        np.eye(2), lambda z: jnp.outer(z, z), lp, 0.1
    )  # symmetric, not skew
    with pytest.raises(ValueError, match="skew"):
        irr.irreversible_mh_init(
            jnp.array([1.0, 2.0]), lp, jax.random.key(0), proposal=bad_q
        )
    # a per-coordinate direction given to the shared-sign SDE proposal
    good = irr.sde_proposal(np.eye(2), J, lp, 0.1)
    gstate = irr.irreversible_mh_init(jnp.zeros(2), lp, jax.random.key(0))
    with pytest.raises(ValueError, match="direction"):
        irr.irreversible_mh_step(jax.random.key(0), gstate, lp, good)
    with pytest.raises(ValueError, match="position"):
        irr.irreversible_mh_init(jnp.zeros((3, 2)), lp, jax.random.key(0))
    with pytest.raises(ValueError, match="position"):
        irr.rwmh_init(jnp.array([0.0, jnp.nan]), lp)
    with pytest.raises(ValueError, match="proposal"):
        irr.irreversible_mh_step(jax.random.key(0), gstate, lp, 0.5)


# ------------------------------------------------- issue 10: cache, speed paths, jit


def _sin_logdensity(x):
    """N(0, I) plus 0·Σ sin(x): the sin marks every forward evaluation in a jaxpr (cos:
    every gradient)."""
    return -0.5 * jnp.sum(x**2) + 0.0 * jnp.sum(jnp.sin(x))


def _count_primitives(jaxpr, name):
    count = 0
    for eqn in jaxpr.eqns:
        count += eqn.primitive.name == name
        for sub in jax.core.subjaxprs(eqn) if hasattr(jax.core, "subjaxprs") else ():
            count += _count_primitives(sub, name)
        for param in eqn.params.values():
            inner = getattr(param, "jaxpr", None)
            if inner is not None:
                count += _count_primitives(getattr(inner, "jaxpr", inner), name)
    return count


@pytest.mark.parametrize("Q", [0.0, J])
@pytest.mark.parametrize("grad_mode", ["reverse", "forward"])
def test_sde_step_evaluates_the_log_density_and_its_gradient_once(Q, grad_mode):
    """One value and gradient per step (at z*), as MALA; the values at z come from
    state.cache. Reverse mode: one sin (forward) and one cos (its derivative) in the
    step's jaxpr. Forward mode (d = 2 separate jvps, cenlmc_jax.gradients.modes) traces
    the primal in each jvp; XLA merges the repeats, so the compiled step evaluates sin
    once."""
    prop = irr.sde_proposal(np.eye(2), Q, _sin_logdensity, 0.1, grad_mode=grad_mode)
    state = irr.irreversible_mh_init(
        jnp.ones(2), _sin_logdensity, jax.random.key(0), proposal=prop
    )
    step = functools.partial(
        irr.irreversible_mh_step, logdensity_fn=_sin_logdensity, proposal=prop
    )
    if grad_mode == "reverse":
        jaxpr = jax.make_jaxpr(step)(jax.random.key(1), state).jaxpr
        assert (
            _count_primitives(jaxpr, "sin") == 1
            and _count_primitives(jaxpr, "cos") == 1
        )
    else:
        hlo = jax.jit(step).lower(jax.random.key(1), state).compile().as_text()
        assert hlo.count(" sine(") == 1


@pytest.mark.parametrize(
    "D", [1.0, np.array([1.0, 0.5]), np.array([[1.0, 0.4], [0.4, 0.5]])]
)
def test_the_cache_is_the_point_s_drift_after_many_steps(D):
    """state.cache always equals the proposal's point_fn at state.position (accepted and
    rejected steps alike): D∇log π + Γ_D and Q∇log π + Γ_Q recomputed from scratch
    (float32 rounding)."""
    tgt = targets.banana()
    prop = irr.sde_proposal(D, 2.0 * J, tgt.logdensity_fn, 0.2)
    algo = cj.vmap_chains(cj.irreversible_mh(tgt.logdensity_fn, prop))
    states = algo.init(tgt.sample(jax.random.key(0), 64), jax.random.key(1))
    res = cj.sample(jax.random.key(2), algo, states, 50)
    assert (
        0.2 < float(np.mean(np.asarray(res.info.is_accepted))) < 0.95
    )  # both branches exercised
    _, fresh = jax.vmap(prop.point_fn)(res.state.position)
    for got, want in zip(
        jax.tree_util.tree_leaves(res.state.cache),
        jax.tree_util.tree_leaves(fresh),
        strict=True,
    ):
        np.testing.assert_allclose(
            np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5
        )
    np.testing.assert_allclose(
        res.state.logdensity, jax.vmap(tgt.logdensity_fn)(res.state.position), rtol=1e-5
    )


def test_constant_dense_d_precomputed_equals_the_callable_path():
    """The factors of a constant D taken once (NumPy float64) give the densities of the
    per-point path (the same D as a callable: Cholesky at every point), to float64
    rounding."""
    tgt = targets.correlated_gaussian(3, 0.5)
    Dm = np.array([[1.0, 0.3, 0.0], [0.3, 0.8, 0.1], [0.0, 0.1, 0.6]])
    Qm = np.array([[0.0, 1.0, -0.5], [-1.0, 0.0, 0.2], [0.5, -0.2, 0.0]])
    with x64():
        const = irr.sde_proposal(Dm, Qm, tgt.logdensity_fn, 0.15)
        per_point = irr.sde_proposal(
            lambda z: jnp.asarray(Dm),
            lambda z: jnp.asarray(Qm),
            tgt.logdensity_fn,
            0.15,
        )
        z = jax.random.normal(jax.random.key(0), (40, 3), jnp.float64)
        zs = jax.random.normal(jax.random.key(1), (40, 3), jnp.float64)
        for sign in (1.0, -1.0):
            s = jnp.full((1,), sign)
            for fn in ("log_forward", "log_backward"):
                a = jv(lambda x, y: getattr(const, fn)(x, y, s))(zs, z)
                b = jv(lambda x, y: getattr(per_point, fn)(x, y, s))(zs, z)
                np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
        keys = jax.random.split(jax.random.key(2), 40)
        ones = jnp.ones((1,))
        np.testing.assert_allclose(
            jv(lambda k, x: const.sample(k, x, ones))(keys, z),
            jv(lambda k, x: per_point.sample(k, x, ones))(keys, z),
            rtol=1e-12,
            atol=1e-12,
        )


def test_proposals_build_inside_jit_with_traced_step_size_and_d():
    """Issue 8: sde_proposal inside jit raised a false 'D failed'; now it builds with a
    traced step size and a traced D (as adaptation needs) and draws what the eager
    proposal draws."""
    tgt = targets.banana()
    z, s, key = jnp.array([0.3, -0.2]), jnp.ones((1,)), jax.random.key(0)

    def draw(eps, D):
        prop = irr.sde_proposal(D, J, tgt.logdensity_fn, eps)
        z_star = prop.sample(key, z, s)
        return z_star, prop.log_forward(z_star, z, s) - prop.log_backward(z, z_star, s)

    eager = draw(0.1, jnp.array([1.0, 0.5]))
    for traced in (
        jax.jit(draw)(0.1, jnp.array([1.0, 0.5])),
        jax.jit(lambda e: draw(e, np.array([1.0, 0.5])))(0.1),
    ):
        for a, b in zip(traced, eager, strict=True):
            np.testing.assert_allclose(
                a, b, rtol=1e-5, atol=1e-6
            )  # float32 rounding of fused ops
    gamma = jax.jit(lambda th: irr.gamma_proposal(2.0, th).sample(key, z, jnp.ones(2)))(
        0.5
    )
    np.testing.assert_allclose(
        gamma, irr.gamma_proposal(2.0, 0.5).sample(key, z, jnp.ones(2)), rtol=1e-6
    )


def test_init_inside_jit_on_closed_over_concrete_arrays():
    """Issue 8: rwmh_init / irreversible_mh_init inside jit on a concrete closed-over
    position hit tracer-bool errors in the input checks; they run eagerly now and give
    the eager state."""
    tgt = targets.banana()
    x = jnp.array([0.3, -0.2])
    prop = irr.sde_proposal(1.0, J, tgt.logdensity_fn, 0.1)
    for init in (
        lambda: irr.rwmh_init(x, tgt.logdensity_fn),
        lambda: irr.irreversible_mh_init(
            x, tgt.logdensity_fn, jax.random.key(0), proposal=prop
        ),
        lambda: cj.rwmh(tgt.logdensity_fn, 0.5).init(x),
    ):
        jax.tree_util.tree_map(
            lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6),
            jax.jit(init)(),
            init(),
        )
    bad = jnp.array([0.0, jnp.nan])
    with pytest.raises(ValueError, match="position must be finite"):
        jax.jit(
            lambda: irr.rwmh_init(bad, tgt.logdensity_fn)
        )()  # the check itself still runs


def test_nan_gradient_at_the_proposal_is_reported():
    """log π finite at z* but ∇log π NaN there: the proposal density is NaN; rejected
    and diverged."""
    logp = lambda x: (
        -0.5 * jnp.sum(x**2) + jnp.where(x[0] > 3.0, 0.0 * jnp.sqrt(-x[0]), 0.0)
    )
    prop = irr.sde_proposal(
        1.0, 0.0, logp, 50.0
    )  # huge steps: many proposals land at x_0 > 3
    algo = cj.vmap_chains(cj.irreversible_mh(logp, prop))
    states = algo.init(jnp.zeros((200, 1)), jax.random.key(0))
    new, info = jax.jit(algo.step)(jax.random.key(1), states)
    landed = np.asarray(info.diverged)
    assert landed.any() and not np.asarray(info.is_accepted)[landed].any()
    assert np.all(np.isfinite(np.asarray(new.position)))


def test_rwmh_with_a_dense_proposal_covariance_samples_the_target():
    """proposal_cov = Σ (the target's covariance) on N(0, Σ), ρ = 0.95: mean and
    covariance within MCSE."""
    tgt = targets.correlated_gaussian(2, 0.95)
    algo = cj.vmap_chains(cj.rwmh(tgt.logdensity_fn, 1.7, proposal_cov=tgt.cov))
    x0 = tgt.sample(jax.random.key(3), 400)
    res = cj.sample(jax.random.key(4), algo, algo.init(x0), 1000)
    trace = np.swapaxes(np.asarray(res.trace, np.float64), 0, 1)
    z, est = z_scores(
        np.concatenate([trace, _second_moments(trace)], -1),
        np.array([0, 0, 1.0, 1.0, 0.95]),
    )
    assert np.all(np.abs(z) < Z_MAX), (est, z)
    acc = float(np.mean(np.asarray(res.info.acceptance_rate)))
    assert 0.15 < acc < 0.6, acc  # a real test: neither always accepting nor frozen
    with pytest.raises(ValueError, match="proposal_cov"):
        cj.rwmh(tgt.logdensity_fn, 1.0, proposal_cov=np.array([[1.0, 2.0], [2.0, 1.0]]))
    with pytest.raises(ValueError, match="proposal_cov"):
        cj.rwmh(tgt.logdensity_fn, 1.0, proposal_cov=-1.0)


def test_gamma_proposal_with_per_coordinate_scales():
    """scale: (d,): jumps of coordinate i are Gamma(k, θ_i): mean k θ_i (z-test, i.i.d.
    draws)."""
    k, theta, n = 2.0, np.array([0.1, 1.0, 3.0]), 50_000
    prop = irr.gamma_proposal(k, theta)
    jumps = np.asarray(
        jv(prop.sample)(
            jax.random.split(jax.random.key(0), n), jnp.zeros((n, 3)), jnp.ones((n, 3))
        )
    )
    z = (jumps.mean(0) - k * theta) / (np.sqrt(k) * theta / np.sqrt(n))
    assert np.all(np.abs(z) < Z_MAX), z
    with pytest.raises(ValueError, match="scale"):
        irr.gamma_proposal(2.0, np.array([1.0, -1.0]))


def _dict_logistic():
    """The logistic regression with θ as {"b": first coordinate, "w": the rest} (ravel
    order: b, w)."""
    tgt = targets.logistic_regression(dim=4)

    def logp_dict(p):
        return tgt.logdensity_fn(jnp.concatenate([p["b"][None], p["w"]]))

    def to_dict(x):
        return {"b": x[0], "w": x[1:]}

    return tgt, logp_dict, to_dict


@pytest.mark.parametrize("which", ["rwmh", "mala", "sde", "gamma"])
def test_dict_positions_give_the_flat_chain(which):
    """A dict-shaped position is raveled at the boundary: the chain equals the flat one
    draw for draw (same keys), and the state keeps the dict."""
    tgt, logp_dict, to_dict = _dict_logistic()
    make = {
        "rwmh": lambda lp: cj.rwmh(lp, 0.1),
        "mala": lambda lp: cj.irreversible_mh(
            lp, irr.sde_proposal(1.0, 0.0, lp, 0.005)
        ),
        "sde": lambda lp: cj.irreversible_mh(
            lp, irr.sde_proposal(np.array([1.0, 0.5, 0.5, 1.0]), J4, lp, 0.005)
        ),
        "gamma": lambda lp: cj.irreversible_mh(lp, irr.gamma_proposal(2.0, 0.05)),
    }[which]
    x0 = jnp.asarray(tgt.data["theta_map"], jnp.float32)
    flat, tree = make(tgt.logdensity_fn), make(logp_dict)
    sf, st = flat.init(x0, jax.random.key(0)), tree.init(to_dict(x0), jax.random.key(0))
    assert isinstance(st.position, dict) and st.position["w"].shape == (3,)
    step_f, step_t = jax.jit(flat.step), jax.jit(tree.step)
    for t in range(20):
        sf, inf_f = step_f(jax.random.key(t), sf)
        st, inf_t = step_t(jax.random.key(t), st)
        assert bool(inf_f.is_accepted) == bool(inf_t.is_accepted)
    np.testing.assert_allclose(
        jnp.concatenate([st.position["b"][None], st.position["w"]]),
        sf.position,
        rtol=1e-6,
        atol=1e-6,
    )  # the same arithmetic, up to float32 fusion


J4 = np.kron(np.eye(2), J)  # rotations in the planes (0, 1) and (2, 3)


def test_the_package_reexports_every_name_of_its_modules():
    """``cenlmc_jax.irreversible`` is a package (jump step, proposals, RW-MH, MALA); its
    names are the modules', and its sampler constructors are also top-level names."""
    mods = {
        m: importlib.import_module(f"cenlmc_jax.irreversible.{m}")
        for m in ("jump", "proposals", "rwmh", "mala", "hmc", "autostep")
    }
    public = [n for mod in mods.values() for n in mod.__all__]
    assert sorted(public) == sorted(irr.__all__) and len(set(public)) == len(public)
    for m, mod in mods.items():
        for name in mod.__all__:
            assert getattr(irr, name) is getattr(mod, name), (m, name)
    for name in ("irreversible_mh", "rwmh", "mala", "hmc", "autostep_hmc"):
        assert name in cj.__all__ and getattr(cj, name) is getattr(irr, name)


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda lp: cj.rwmh(lp, 0.5, proposal_cov=np.eye(3)), "proposal_cov"),
        (lambda lp: cj.rwmh(lp, 0.5, proposal_cov=np.ones(3)), "proposal_cov"),
        (
            lambda lp: cj.irreversible_mh(lp, irr.gamma_proposal(2.0, jnp.ones(3))),
            "scale must be a scalar or a \\(d,\\) vector with d = 2",
        ),
    ],
)
def test_a_matrix_or_scale_of_the_wrong_size_is_refused_at_init(make, match):
    # issue 28: these ran and failed mid-run with a TypeError (or not at all)
    logdensity = lambda x: -0.5 * jnp.sum(x**2)
    with pytest.raises(ValueError, match=match):
        make(logdensity).init(jnp.zeros(2))
