"""Tests of the gradient estimators (cenlmc_jax/gradients/estimators.py).

Unbiasedness is a z-test of the mean over many independent draws against the
exact full gradient, with the standard error estimated from the same draws.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cenlmc_jax import diagnostics, gradients, run
from cenlmc_jax.models import targets
from cenlmc_jax.sgmcmc import recipe

NUM_DRAWS = 4000  # independent estimator draws for the z-tests
# |z| > 4.5 has probability 7e-6 per coordinate under N(0, 1): a failure is a bug, not
# bad luck
Z_MAX = 4.5


@pytest.fixture(scope="module")
def logistic():
    t = targets.logistic_regression()
    data = (jnp.asarray(t.data["x"]), jnp.asarray(t.data["y"]))
    return t, data


def _draws(estimator, theta, num=NUM_DRAWS, seed=0):
    keys = jax.random.split(jax.random.key(seed), num)
    return np.asarray(
        jax.jit(jax.vmap(estimator, in_axes=(0, None)))(keys, theta), np.float64
    )


@pytest.mark.parametrize("replace", [False, True])
def test_minibatch_estimator_is_unbiased(logistic, replace):
    t, data = logistic
    est = gradients.minibatch_grad_estimator(
        t.data["logprior_fn"], t.data["loglik_fn"], data, 20, replace=replace
    )
    theta = (
        jnp.asarray(t.data["theta_map"], jnp.float32) + 0.3
    )  # off the MAP, so the full gradient is not 0
    full = np.asarray(jax.grad(t.logdensity_fn)(theta), np.float64)
    g = _draws(est, theta)
    se = g.std(axis=0, ddof=1) / np.sqrt(
        NUM_DRAWS
    )  # independent draws: plain standard error of the mean
    z = (g.mean(axis=0) - full) / se
    assert np.all(np.abs(z) < Z_MAX), z


def test_minibatch_variance_has_the_finite_population_factor(logistic):
    # Without replacement, Var[(n/b) Σ_B g_i] = n² (1 - b/n) S² / b (S² = ddof-1
    # population variance of the per-point gradients g_i): an exact formula.
    t, data = logistic
    n, b = data[0].shape[0], 50
    est = gradients.minibatch_grad_estimator(
        t.data["logprior_fn"], t.data["loglik_fn"], data, b, replace=False
    )
    theta = jnp.asarray(t.data["theta_map"], jnp.float32)
    per_point = np.asarray(
        jax.vmap(jax.grad(t.data["loglik_fn"]), in_axes=(None, 0, 0))(theta, *data),
        np.float64,
    )
    exact = n**2 * (1 - b / n) * per_point.var(axis=0, ddof=1) / b
    var = _draws(est, theta, seed=1).var(axis=0, ddof=1)
    # Relative SE of a sample variance is sqrt((κ - 1)/K), κ the kurtosis. A sum
    # of 50 bounded terms is near Gaussian (κ ≈ 3: 2.2%); allowing κ up to 5
    # gives 3.2%, and 5 of those (16%) keeps all 5 coordinates at |z| < 5.
    np.testing.assert_allclose(var, exact, rtol=0.16)


def test_full_batch_without_replacement_is_the_exact_gradient(logistic):
    t, data = logistic
    n = data[0].shape[0]
    est = gradients.minibatch_grad_estimator(
        t.data["logprior_fn"], t.data["loglik_fn"], data, n, replace=False
    )
    theta = jnp.linspace(-1.0, 1.0, t.dim)
    full = jax.grad(t.logdensity_fn)(theta)
    # Same sum in another order: float32 rounding of a 200-term sum of O(1) terms.
    np.testing.assert_allclose(
        est(jax.random.key(3), theta), full, rtol=1e-5, atol=1e-4
    )


def test_noisy_estimator_mean_and_variance():
    grad_fn = lambda th: th**3
    est = gradients.noisy_grad_estimator(grad_fn, 2.0)
    theta = jnp.array([0.5, -1.0, 2.0])
    g = _draws(est, theta)
    z = (g.mean(axis=0) - np.asarray(grad_fn(theta))) / (
        2.0 / np.sqrt(NUM_DRAWS)
    )  # exact SE: sd / sqrt(K)
    assert np.all(np.abs(z) < Z_MAX), z
    # Gaussian noise: the sample variance has relative SE sqrt(2/K) = 2.2%; 5 SE.
    np.testing.assert_allclose(
        g.var(axis=0, ddof=1), 4.0, rtol=5 * np.sqrt(2 / NUM_DRAWS)
    )


def test_adapters_give_the_log_density_gradient():
    logdensity = lambda th: -0.5 * jnp.sum(th**2) - jnp.sum(th)
    theta = jnp.array([1.0, -2.0])
    expected = -theta - 1.0  # ∇ log p (the BlackJAX sign)
    np.testing.assert_array_equal(
        gradients.grad_estimator_from_logdensity(logdensity)(jax.random.key(0), theta),
        expected,
    )
    np.testing.assert_array_equal(
        gradients.grad_estimator_from_grad(lambda th: -th - 1.0)(
            jax.random.key(0), theta
        ),
        expected,
    )


def _posterior_mean_by_importance_sampling(t, num=20000, seed=0):
    """Reference posterior mean: self-normalised importance sampling from the
    Laplace approximation N(θ_MAP, H^-1) (weights' ESS ≈ 90% of num here)."""
    x, y, theta_map = t.data["x"], t.data["y"], t.data["theta_map"]
    p = 1 / (1 + np.exp(-x @ theta_map))
    cov = np.linalg.inv((x.T * (p * (1 - p))) @ x + np.eye(t.dim))
    z = np.random.default_rng(seed).standard_normal((num, t.dim))
    theta = theta_map + z @ np.linalg.cholesky(cov).T
    s = theta @ x.T
    log_w = (
        (y * s - np.logaddexp(0, s)).sum(1)
        - 0.5 * np.sum(theta**2, 1)
        + 0.5 * np.sum(z**2, 1)
    )
    w = np.exp(log_w - log_w.max())
    return w @ theta / w.sum(), np.sqrt(np.diag(cov))


def test_minibatch_sgld_runs_under_the_driver_and_finds_the_posterior_mean(logistic):
    t, data = logistic
    est = gradients.minibatch_grad_estimator(
        t.data["logprior_fn"], t.data["loglik_fn"], data, 20
    )
    sampler = recipe.sgld(est, 2e-3)
    num_chains = 32
    states = jax.vmap(sampler.init)(jnp.zeros((num_chains, t.dim)))

    def step(key, s):
        return jax.vmap(sampler.step)(jax.random.split(key, num_chains), s)

    res = run.sample(jax.random.key(0), step, states, 1000, thin=10, burn_in=500)
    assert res.trace.shape == (100, num_chains, t.dim)
    assert res.diverged_at == -1
    assert (
        int(res.info.grad_evals.sum()) == 1500 * num_chains
    )  # one estimator call per chain per step
    mean_ref, sd = _posterior_mean_by_importance_sampling(t)
    draws = np.swapaxes(np.asarray(res.trace, np.float64), 0, 1)  # (chains, draws, d)
    se = np.asarray(diagnostics.mcse(draws))
    # 4 MCSE for Monte-Carlo error, plus 0.1 posterior sd for SGLD's O(ε) bias
    # (uncorrected minibatch noise inflates the spread by ~10-15% here; its effect
    # on the mean is of the order of the posterior skewness times that, well
    # under 0.1 sd). The posterior mean is 0.19 sd from the MAP in coordinate 0,
    # so comparing with the MAP would not do; a wrong sign or n/|B| scale moves
    # the mean by more than 1 sd.
    err = np.abs(draws.reshape(-1, t.dim).mean(0) - mean_ref)
    assert np.all(err < 4 * se + 0.1 * sd), (err, se, sd)


def test_float64_preserved_and_same_key_same_result():
    with jax.enable_x64(True):
        t = targets.logistic_regression()
        data = (jnp.asarray(t.data["x"]), jnp.asarray(t.data["y"]))
        est = gradients.minibatch_grad_estimator(
            t.data["logprior_fn"], t.data["loglik_fn"], data, 10
        )
        theta = jnp.ones(t.dim, jnp.float64)
        g1 = est(jax.random.key(7), theta)
        g2 = est(jax.random.key(7), theta)
        assert g1.dtype == jnp.float64
        np.testing.assert_array_equal(g1, g2)
        noisy = gradients.noisy_grad_estimator(lambda th: th, 1.0)
        assert (
            noisy(jax.random.PRNGKey(0), theta).dtype == jnp.float64
        )  # legacy keys work too


def test_single_array_data_is_passed_as_one_argument():
    data = jnp.arange(10.0)
    est = gradients.minibatch_grad_estimator(
        lambda th: 0.0 * jnp.sum(th),
        lambda th, xi: -0.5 * jnp.sum((th - xi) ** 2),
        data,
        10,
        replace=False,
    )
    # ∇ log p = Σ (x_i - θ) = 45 - 10 θ: exact for the full batch.
    np.testing.assert_allclose(
        est(jax.random.key(0), jnp.array([1.0])), [45.0 - 10.0], rtol=1e-6
    )


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(batch_size=0), "batch_size"),
        (dict(batch_size=201), "batch_size"),
        (dict(batch_size=2.5), "batch_size"),
        (dict(replace="no"), "replace"),
        (dict(data=(np.zeros((200, 5)), np.zeros(199))), "leading axis"),
        (dict(loglik_fn=3), "loglik_fn"),
    ],
)
def test_minibatch_bad_input_raises(logistic, kwargs, match):
    t, data = logistic
    args = dict(
        logprior_fn=t.data["logprior_fn"],
        loglik_fn=t.data["loglik_fn"],
        data=data,
        batch_size=10,
    )
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        gradients.minibatch_grad_estimator(**args)


def test_noisy_bad_input_raises():
    with pytest.raises(ValueError, match="noise_sd"):
        gradients.noisy_grad_estimator(lambda th: th, -1.0)
    with pytest.raises(ValueError, match="grad_fn"):
        gradients.noisy_grad_estimator(None, 1.0)


# ---------------------------------------------------------------------------
# Issue 10: Floyd's subsets, the with-replacement default, pytree positions.
# ---------------------------------------------------------------------------


def test_floyd_subsets_are_uniform_and_distinct():
    """All C(6, 3) = 20 subsets of {0..5} equally likely: each frequency within 4.5
    binomial SE of 1/20 over 40,000 draws (a false alarm over the 20 has probability <
    2e-4); entries distinct."""
    n, b, num = 6, 3, 40_000
    idx = np.asarray(
        jax.jit(jax.vmap(lambda k: gradients.floyd_subset(k, n, b)))(
            jax.random.split(jax.random.key(0), num)
        )
    )
    assert (
        np.all(np.sort(idx, 1)[:, 1:] != np.sort(idx, 1)[:, :-1])
        and idx.min() >= 0
        and idx.max() < n
    )
    codes = np.sum(2 ** np.sort(idx, 1), axis=1)  # one integer per subset
    freq = np.array([np.mean(codes == c) for c in np.unique(codes)])
    assert freq.size == 20
    p = 1 / 20
    assert np.all(np.abs(freq - p) < 4.5 * np.sqrt(p * (1 - p) / num)), freq
    np.testing.assert_array_equal(
        gradients.floyd_subset(jax.random.key(1), 7, 7), np.arange(7)
    )
    big = np.asarray(gradients.floyd_subset(jax.random.key(2), 10_000, 500))
    assert np.unique(big).size == 500


def test_with_replacement_variance_is_n2_s0_over_b(logistic):
    # i.i.d. indices: Var[(n/b) Σ_j g_{I_j}] = n² S₀² / b, S₀² the ddof-0 variance of
    # the per-point gradients (an exact formula; the default draw).
    t, data = logistic
    n, b = data[0].shape[0], 50
    est = gradients.minibatch_grad_estimator(
        t.data["logprior_fn"], t.data["loglik_fn"], data, b
    )
    theta = jnp.asarray(t.data["theta_map"], jnp.float32)
    per_point = np.asarray(
        jax.vmap(jax.grad(t.data["loglik_fn"]), in_axes=(None, 0, 0))(theta, *data),
        np.float64,
    )
    exact = n**2 * per_point.var(axis=0, ddof=0) / b
    var = _draws(est, theta, seed=2).var(axis=0, ddof=1)
    # the same allowance as the finite-population test above (sample-variance SE,
    # kurtosis up to 5)
    np.testing.assert_allclose(var, exact, rtol=0.16)
    # and it is larger than without replacement by the factor the two formulas give
    assert np.all(exact > n**2 * (1 - b / n) * per_point.var(axis=0, ddof=1) / b)


def test_minibatch_estimator_takes_a_dict_theta(logistic):
    t, data = logistic
    pack = lambda p: jnp.concatenate([p["b"][None], p["w"]])
    est = gradients.minibatch_grad_estimator(
        lambda p: t.data["logprior_fn"](pack(p)),
        lambda p, x, y: t.data["loglik_fn"](pack(p), x, y),
        data,
        200,
        replace=False,
    )
    theta = jnp.linspace(-1.0, 1.0, t.dim)
    g = est(jax.random.key(0), {"b": theta[0], "w": theta[1:]})
    assert set(g) == {"b", "w"} and g["w"].shape == (t.dim - 1,)
    full = jax.grad(t.logdensity_fn)(theta)  # full batch: the exact gradient, as a dict
    np.testing.assert_allclose(pack(g), full, rtol=1e-5, atol=1e-4)  # float32 sum order


def test_ravel_position():
    flat, unravel = gradients.ravel_position(jnp.array([1.0, 2.0]))
    assert unravel is None and flat.shape == (2,)
    flat, unravel = gradients.ravel_position(
        [0.5, 1.5]
    )  # a list of numbers is a vector, as before
    assert unravel is None and flat.shape == (2,)
    tree = {"w": jnp.ones((2, 2)), "b": jnp.array(3.0)}
    flat, unravel = gradients.ravel_position(tree)
    np.testing.assert_array_equal(
        flat, [3.0, 1.0, 1.0, 1.0, 1.0]
    )  # leaves in key order: b, w
    jax.tree_util.tree_map(np.testing.assert_array_equal, unravel(flat), tree)
    with pytest.raises(ValueError, match=r"position\['w'\] must be finite"):
        gradients.ravel_position({"w": jnp.array([jnp.nan]), "b": jnp.zeros(1)})
    with pytest.raises(ValueError, match="position must have shape"):
        gradients.ravel_position(
            jnp.zeros((2, 2))
        )  # a bare matrix is not one chain's vector
