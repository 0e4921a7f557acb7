"""Tests of the warm-up adaptation (cenlmc_jax/adaptation/window_adaptation.py).

What cannot be faked here: Stan's window schedule, Welford's estimate against
NumPy's mean and covariance, the step-size iterations against the root of a
known acceptance curve, the acceptance reached after warm-up (the mean over
many chain-steps, whose Monte-Carlo error is far below the ±0.05 allowed),
moments of the adapted chains against exact values (Gaussian) and against an
importance-sampling reference (logistic regression: ``cj.models.targets`` knows only
its MAP, so the posterior moments are computed here, with their own standard
error), and the curvature step sizes against the exact stationary variance of
ULA and of SGHMC's Euler recursion.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cenlmc_jax as cj
from cenlmc_jax import adaptation as ad
from cenlmc_jax import diagnostics as dg
from cenlmc_jax.models import targets

# |z| > 4.5 has probability 7e-6 under N(0, 1): a failure is a bug, not bad luck
Z_MAX = 4.5
# the tolerance; measured bias of the adapted acceptance < 0.015 (pooled and
# single)
ACC_TOL = 0.05

J2 = np.array([[0.0, -1.0], [1.0, 0.0]])
J4 = np.kron(np.eye(2), J2)


def anisotropic():
    return targets.gaussian(
        np.zeros(4), np.diag([0.01, 0.1, 1.0, 4.0]), name="anisotropic_4d"
    )


@pytest.fixture(scope="module")
def logistic():
    return targets.logistic_regression(dim=4)


@pytest.fixture(scope="module")
def logistic_reference(logistic):
    """Posterior E θ and E θ² by self-normalised importance sampling from the Laplace
    approximation N(θ_MAP, H⁻¹) inflated 1.2x (heavier than the posterior: bounded
    weights), 60,000 draws, with delta-method standard errors (weights' ESS is
    reported; > 80% here)."""
    t = logistic
    x, y, theta_map = t.data["x"], t.data["y"], t.data["theta_map"]
    p = 1 / (1 + np.exp(-x @ theta_map))
    cov = 1.2**2 * np.linalg.inv((x.T * (p * (1 - p))) @ x + np.eye(t.dim))
    chol = np.linalg.cholesky(cov)
    z = np.random.default_rng(1).standard_normal((60_000, t.dim))
    theta = theta_map + z @ chol.T
    log_w = (
        np.concatenate(
            [(y * s - np.logaddexp(0, s)).sum(1) for s in np.split(theta @ x.T, 6)]
        )
        - 0.5 * np.sum(theta**2, 1)
        + 0.5 * np.sum(z**2, 1)
    )
    w = np.exp(log_w - log_w.max())
    w /= w.sum()
    assert (
        1 / np.sum(w**2) > 0.8 * theta.shape[0]
    )  # the proposal is close: IS is reliable here
    f = np.concatenate([theta, theta**2], axis=1)
    mean = w @ f
    se = np.sqrt(
        np.sum(w[:, None] ** 2 * (f - mean) ** 2, axis=0)
    )  # delta method for a ratio estimator
    return mean, se


def z_scores(draws, reference, reference_se=0.0):
    """draws: (chains, draws, d); z of E x and E x² with the ESS-based MCSE (plus the
    reference's SE)."""
    f = np.concatenate([draws, draws**2], axis=-1)
    est = f.mean(axis=(0, 1))
    se = np.asarray(dg.mcse(f, chain_axis=0, sample_axis=1))
    return (est - reference) / np.sqrt(se**2 + np.asarray(reference_se) ** 2), est


def run_adapted(warm, params, states, num_steps, seed=1):
    algo = cj.vmap_chains(warm.sampler(params))
    res = cj.sample(jax.random.key(seed), algo, states, num_steps)
    return np.swapaxes(np.asarray(res.trace, np.float64), 0, 1), float(
        np.mean(np.asarray(res.info.acceptance_rate))
    )


# ---------------------------------------------------------------- the pieces


def test_build_schedule_is_stans():
    # Stan's default warm-up of 1000: 75 fast, slow windows 25, 50, 100, 200, 500 (the
    # last one stretched), 50 fast
    assert [n for n, _, _ in ad.build_schedule(1000)] == [75, 25, 50, 100, 200, 500, 50]
    assert [(slow, end) for _, slow, end in ad.build_schedule(1000)][1:-1] == [
        (True, True)
    ] * 5
    assert ad.build_schedule(10) == [(10, False, False)]  # too short for windows
    assert [n for n, _, _ in ad.build_schedule(100)] == [15, 75, 10]  # 15% / 75% / 10%
    for n in (20, 137, 500, 1999, 5000):
        assert sum(length for length, _, _ in ad.build_schedule(n)) == n


def test_welford_batches_give_numpy_mean_and_covariance():
    with jax.enable_x64(True):
        x = np.random.default_rng(0).standard_normal((300, 3)) @ np.array(
            [[1, 0, 0], [0.5, 1, 0], [0, 2, 0.1]]
        )
        for dense in (False, True):
            state = ad.welford_init(3, dense, jnp.float64)
            for chunk in np.split(
                x, [1, 7, 100, 250]
            ):  # Welford's single draws and Chan's batches
                state = ad.welford_update(state, jnp.asarray(chunk))
            np.testing.assert_allclose(state.mean, x.mean(0), rtol=1e-12)
            cov = np.cov(x.T)
            n = 300
            expected = n / (n + 5) * (cov if dense else np.diag(cov)) + 1e-3 * 5 / (
                n + 5
            ) * (np.eye(3) if dense else 1.0)
            np.testing.assert_allclose(
                ad.welford_covariance(state), expected, rtol=1e-12
            )  # float64 rounding


def test_step_size_iterations_find_the_root_of_the_acceptance_curve():
    """α(x) = 1/(1 + e^{x - 1}) with target 0.3: root x* = 1 + log(1/0.3 - 1) = 1.847.
    Exact α: dual averaging's and Robbins-Monro's averages converge to x*. Noisy α (a
    Bernoulli draw per step, as one chain's acceptance): Robbins-Monro's Polyak average
    still lands on x*
    (error ~ 0.5 / (α'(x*) √T) = 0.03 at T = 5000; allowed 0.15, 5 SE)."""
    with jax.enable_x64(True):
        alpha = lambda x: 1 / (1 + jnp.exp(x - 1.0))
        root = 1.0 + math.log(1 / 0.3 - 1)

        def run(update, noisy, steps):
            def body(state, key):
                a = alpha(state.log_step_size)
                a = jax.random.bernoulli(key, a).astype(a.dtype) if noisy else a
                return update(state, a, 0.3), None

            state, _ = jax.lax.scan(
                body,
                ad.dual_averaging_init(1.0, jnp.float64),
                jax.random.split(jax.random.key(0), steps),
            )
            return float(state.log_step_size_avg)

        assert abs(run(ad.dual_averaging_update, False, 3000) - root) < 0.02
        assert abs(run(ad.robbins_monro_update, False, 3000) - root) < 0.02
        assert abs(run(ad.robbins_monro_update, True, 5000) - root) < 0.15


# -------------------------------------------------------------- acceptance


@pytest.mark.parametrize("kind", ["rwmh", "mala", "sde", "gamma"])
@pytest.mark.parametrize("which", ["gaussian", "logistic"])
def test_pooled_warmup_reaches_the_target_acceptance(kind, which, logistic):
    target = anisotropic() if which == "gaussian" else logistic
    warm = ad.window_adaptation(
        kind, target.logdensity_fn, Q=J4 if kind == "sde" else None
    )
    x0 = 0.1 * jax.random.normal(jax.random.key(0), (16, 4))
    (states, params), info = warm.run_chains(jax.random.key(1), x0, 400)
    assert info.acceptance_rate.shape == (400,)
    _, acc = run_adapted(warm, params, states, 200)
    # the mean of 3,200 chain-step acceptance probabilities: Monte-Carlo SE < 0.015
    assert abs(acc - ad.TARGET_ACCEPTANCE[kind]) < ACC_TOL, (kind, which, acc, params)


def test_adaptation_under_vmap_over_chains(logistic):
    """warm.run adapts one chain; vmapped, every chain gets its own parameters, equal to
    running it alone, and every chain's sampler reaches the target acceptance on
    average."""
    warm = ad.window_adaptation("mala", logistic.logdensity_fn)
    x0 = jnp.asarray(logistic.data["theta_map"], jnp.float32) + 0.1 * jax.random.normal(
        jax.random.key(0), (16, 4)
    )
    keys = jax.random.split(jax.random.key(1), 16)
    (states, params), info = jax.vmap(lambda k, x: warm.run(k, x, 500))(keys, x0)
    assert (
        params["step_size"].shape == (16,)
        and params["D"].shape == (16, 4)
        and info.step_size.shape == (16, 500)
    )
    with jax.enable_x64(
        True
    ):  # vmapped = alone; float64, so no rounding flips an accept decision
        x64 = x0[:3].astype(jnp.float64)
        (_, p_all), _ = jax.vmap(lambda k, x: warm.run(k, x, 100))(keys[:3], x64)
        (_, p_one), _ = warm.run(keys[2], x64[2], 100)
        for name in ("step_size", "D"):
            np.testing.assert_allclose(
                p_one[name], p_all[name][2], rtol=1e-9
            )  # float64 rounding of batching

    def step(
        key, s
    ):  # each chain with its own adapted sampler (built under vmap, parameters traced)
        return jax.vmap(lambda k, st, p: warm.sampler(p).step(k, st))(
            jax.random.split(key, 16), s, params
        )

    res = cj.sample(jax.random.key(2), step, states, 300)
    acc = float(np.mean(np.asarray(res.info.acceptance_rate)))
    assert abs(acc - ad.TARGET_ACCEPTANCE["mala"]) < ACC_TOL, acc


# ------------------------------------------------------------------- moments


@pytest.mark.parametrize(
    "kind, preconditioner",
    [("rwmh", "dense"), ("mala", "diagonal"), ("gamma", "diagonal")],
)
def test_adapted_chains_have_the_gaussian_moments(kind, preconditioner):
    target = anisotropic()
    warm = ad.window_adaptation(
        kind, target.logdensity_fn, preconditioner=preconditioner
    )
    (states, params), _ = warm.run_chains(jax.random.key(3), jnp.zeros((64, 4)), 400)
    draws, _ = run_adapted(warm, params, states, 600)
    z, est = z_scores(draws, np.concatenate([np.zeros(4), np.diag(target.cov)]))
    assert np.all(np.abs(z) < Z_MAX), (kind, est, z)


@pytest.mark.parametrize("kind", ["rwmh", "mala"])
def test_adapted_chains_on_a_dict_position_have_the_logistic_posterior_moments(
    kind, logistic, logistic_reference
):
    """θ = {"b": θ_0, "w": θ_1:} (raveled at the boundary) on the logistic regression: E
    θ and E θ² against the importance-sampling reference, z with the MCSE and the
    reference's SE."""
    pack = lambda p: jnp.concatenate([p["b"][..., None], p["w"]], axis=-1)
    logp = lambda p: logistic.logdensity_fn(pack(p))
    warm = ad.window_adaptation(kind, logp)
    x0 = jnp.asarray(logistic.data["theta_map"], jnp.float32) + 0.1 * jax.random.normal(
        jax.random.key(4), (64, 4)
    )
    (states, params), _ = warm.run_chains(
        jax.random.key(5), {"b": x0[:, 0], "w": x0[:, 1:]}, 400
    )
    assert isinstance(states.position, dict)
    algo = cj.vmap_chains(warm.sampler(params))
    res = cj.sample(
        jax.random.key(6), algo.step, states, 600, trace_fn=lambda s: pack(s.position)
    )
    draws = np.swapaxes(np.asarray(res.trace, np.float64), 0, 1)
    mean, se = logistic_reference
    z, est = z_scores(draws, mean, se)
    assert np.all(np.abs(z) < Z_MAX), (kind, est, mean, z)


def test_dense_preconditioner_learns_the_covariance_and_whitens_q():
    """RW-MH with a dense preconditioner on N(0, Σ), ρ = 0.9: the adapted proposal
    covariance is Σ (Welford over the last window, 300 steps x 64 chains, ~2,000
    effective draws: relative SE of a variance ~3%; allowed 15%). For kind "sde" the
    sampler's Q is L Q_w Lᵀ with Σ = L Lᵀ."""
    target = targets.correlated_gaussian(2, 0.9)
    warm = ad.window_adaptation("rwmh", target.logdensity_fn, preconditioner="dense")
    (_, params), _ = warm.run_chains(jax.random.key(7), jnp.zeros((64, 2)), 600)
    np.testing.assert_allclose(
        params["proposal_cov"], target.cov, rtol=0.15, atol=0.15 * 0.9
    )
    warm = ad.window_adaptation(
        "sde", target.logdensity_fn, preconditioner="dense", Q=2.0 * J2
    )
    (_, params), _ = warm.run_chains(jax.random.key(8), jnp.zeros((8, 2)), 100)
    L = np.linalg.cholesky(np.asarray(params["D"], np.float64))
    np.testing.assert_allclose(
        params["Q"], L @ (2.0 * J2) @ L.T, rtol=1e-5, atol=1e-6
    )  # float32 rounding


# ------------------------------------------------------- unadjusted samplers


def test_max_curvature_is_the_largest_precision_of_a_gaussian():
    target = anisotropic()  # precisions 100, 10, 1, 0.25
    est = cj.gradients.grad_estimator_from_logdensity(target.logdensity_fn)
    points = jax.random.normal(jax.random.key(0), (8, 4))
    # power iteration: the error shrinks by (10/100)^2 per iteration: exact to float32
    # rounding
    np.testing.assert_allclose(
        ad.max_curvature(est, points, jax.random.key(1)), 100.0, rtol=1e-4
    )


@pytest.mark.parametrize("sampler", ["lmc", "sghmc"])
def test_langevin_step_size_gives_the_chosen_variance_bias(sampler):
    """On N(0, diag(0.01, 1)) (L = 100) the step from langevin_step_size(L, bias=0.2)
    makes the stiff coordinate's stationary variance (1 + 0.2)/L: exactly for ULA
    (1/(L(1 - hL/2))), by the discrete Lyapunov equation for SGHMC; checked by
    simulation (z-test with the MCSE)."""
    target = targets.gaussian(np.zeros(2), np.diag([0.01, 1.0]))
    L = 100.0
    h = ad.langevin_step_size(
        L, sampler=sampler, bias=0.2, friction=10.0
    )  # C = √L: critically damped
    if sampler == "lmc":
        np.testing.assert_allclose(
            1 / (L * (1 - h * L / 2)), 1.2 / L, rtol=1e-12
        )  # the closed form
        algo = cj.lmc(target.logdensity_fn, h)
        state = algo.init(target.sample(jax.random.key(0), 2000))
        res = cj.sample(jax.random.key(1), algo, state, 600, burn_in=100)
    else:
        algo = cj.vmap_chains(
            cj.sghmc(
                cj.gradients.grad_estimator_from_logdensity(target.logdensity_fn),
                h,
                friction=10.0,
            )
        )
        state = algo.init(target.sample(jax.random.key(0), 2000), jax.random.key(2))
        res = cj.sample(jax.random.key(1), algo, state, 600, burn_in=400)
    x0sq = (
        np.swapaxes(np.asarray(res.trace, np.float64), 0, 1)[..., :1] ** 2
    )  # (particles, draws, 1)
    z = (x0sq.mean() - 1.2 / L) / float(dg.mcse(x0sq, chain_axis=0, sample_axis=1)[0])
    assert abs(z) < Z_MAX, (sampler, h, x0sq.mean() * L, z)


# ----------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(kind="nuts"), "algorithm"),
        (dict(target_acceptance_rate=1.5), "target_acceptance_rate"),
        (dict(target_acceptance_rate=0.0), "target_acceptance_rate"),
        (dict(preconditioner="full"), "preconditioner"),
        (dict(kind="gamma", preconditioner="dense"), "preconditioner"),
        (dict(kind="mala", Q=J2), "Q is not an option of algorithm 'mala'"),
        (dict(kind="rwmh", shape=3.0), "shape is not an option of algorithm 'rwmh'"),
        (dict(kind=ad.mala_spec(), Q=J2), "AdaptationSpec"),
        (dict(kind="sde", Q=np.eye(2)), "skew"),
        (dict(initial_step_size=-1.0), "initial_step_size"),
        (dict(logdensity_fn=None), "logdensity_fn"),
    ],
)
def test_bad_input_raises(kwargs, match):
    args = dict(kind="rwmh", logdensity_fn=lambda x: -0.5 * jnp.sum(x**2))
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        ad.window_adaptation(args.pop("kind"), args.pop("logdensity_fn"), **args)


def test_bad_run_arguments_raise():
    warm = ad.window_adaptation("mala", lambda x: -0.5 * jnp.sum(x**2))
    with pytest.raises(ValueError, match="num_steps"):
        warm.run(jax.random.key(0), jnp.zeros(2), -1)
    with pytest.raises(ValueError, match="positions"):
        warm.run_chains(jax.random.key(0), jnp.zeros(2), 10)
    with pytest.raises(ValueError, match="position"):
        warm.run(jax.random.key(0), jnp.array([0.0, jnp.nan]), 10)
    with pytest.raises(ValueError, match="curvature"):
        ad.langevin_step_size(-1.0)
    with pytest.raises(ValueError, match="sampler"):
        ad.langevin_step_size(1.0, sampler="hmc")
