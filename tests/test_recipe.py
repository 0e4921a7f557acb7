"""Tests of the complete recipe, SGLD / SGRLD / SGHMC as D, Q choices, and SGRHMC.

What cannot be faked here: hand-derived Γ formulas, hand-written updates of
SGLD / SGHMC / SGRLD driven by the same key, the block SGRHMC step against the
generic recipe with the section-6 D, Q, the exact law of one step, and a
stationary variance against the truth with a Monte-Carlo standard error (ESS
from cenlmc_jax.diagnostics) plus a discretisation allowance computed exactly
for the frozen-metric linear recursion.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import scipy.linalg

from cenlmc_jax import diagnostics, gradients, recipe, run

ROUNDING64 = dict(rtol=1e-12, atol=1e-12)  # same formula, different operation order: float64 rounding only


def quadratic_potential(theta):
    return 0.5 * jnp.sum(theta**2)


# ---------------------------------------------------------------------------
# Γ by autodiff against hand-derived formulas.
# ---------------------------------------------------------------------------


def test_gamma_term_matches_hand_divergence():
    D = lambda z: jnp.diag(z**2)  # Γ_D = (2 z_0, 2 z_1)
    Q = lambda z: jnp.array([[0.0, z[1]], [-z[1], 0.0]])  # Γ_Q = (∂_1 z_1, ∂_0 (-z_1)) = (1, 0)
    z = jnp.array([1.5, -2.0])
    np.testing.assert_allclose(recipe.gamma_term(D, Q, z), [3.0 + 1.0, -4.0], rtol=1e-6)
    np.testing.assert_allclose(recipe.gamma_term(D, Q, z, sign=-1.0), [3.0 - 1.0, -4.0], rtol=1e-6)
    np.testing.assert_array_equal(recipe.gamma_term(np.eye(2), np.zeros((2, 2)), z), [0.0, 0.0])


@pytest.mark.parametrize("theta", [-2.0, -0.3, 0.0, 0.7, 3.0])
def test_gsgrhmc_gamma_1d_matches_analytic(theta):
    # G^{-1/2} = sqrt(D) |U + C|^{1/4}  =>  Γ_r = sqrt(D)/4 |U + C|^{-3/4} sign(U + C) U'(θ).
    D, C = 1.5, 0.5
    inv = recipe.gsgrhmc_inv_metric(quadratic_potential, D, C)
    u = theta**2 / 2
    expected = np.sqrt(D) / 4 * abs(u + C) ** -0.75 * np.sign(u + C) * theta
    with jax.enable_x64(True):
        gamma, half, g = recipe._gamma_r(inv, jnp.array([theta]))
        np.testing.assert_allclose(gamma, [expected], **ROUNDING64)
        np.testing.assert_allclose(g, [D * np.sqrt(u + C)], **ROUNDING64)


def _rotated_metric(theta):
    """G^{-1} = R(φ) diag(a², b²) R(φ)ᵀ with φ = θ_1, a = exp(θ_0), b = 2 + θ_1²;
    its PSD root is S = R diag(a, b) Rᵀ."""
    a, b, phi = jnp.exp(theta[0]), 2.0 + theta[1] ** 2, theta[1]
    c, s = jnp.cos(phi), jnp.sin(phi)
    rot = jnp.array([[c, -s], [s, c]])
    return rot @ jnp.diag(jnp.array([a**2, b**2])) @ rot.T


def _rotated_metric_gamma(theta):
    """Γ_i = Σ_j ∂_j S_ij by hand, with S_00 = a c² + b s², S_01 = (a - b) c s,
    S_11 = a s² + b c² (c = cos θ_1, s = sin θ_1, ∂_0 a = a, ∂_1 b = 2 θ_1):
      Γ_0 = ∂_0 S_00 + ∂_1 S_01 = a c² - 2θ_1 c s + (a - b) cos 2θ_1
      Γ_1 = ∂_0 S_10 + ∂_1 S_11 = a c s + 2 (a - b) s c + 2 θ_1 c²"""
    t0, t1 = theta
    a, b, c, s = np.exp(t0), 2.0 + t1**2, np.cos(t1), np.sin(t1)
    return np.array([a * c * c - 2 * t1 * c * s + (a - b) * np.cos(2 * t1), a * c * s + 2 * (a - b) * s * c + 2 * t1 * c * c])


@pytest.mark.parametrize("theta", [(0.3, -0.4), (-1.0, 1.2), (0.0, 0.0)])
def test_dense_metric_gamma_2d_matches_analytic(theta):
    with jax.enable_x64(True):
        theta = jnp.array(theta, jnp.float64)
        gamma, half, _ = recipe._gamma_r(_rotated_metric, theta)
        # eigh-based root and Sylvester-equation derivative vs the closed form:
        # float64 eigen-decomposition error, ~1e-14 relative.
        np.testing.assert_allclose(gamma, _rotated_metric_gamma(np.asarray(theta)), rtol=1e-10, atol=1e-10)
        # The generic recipe with the section-6 D, Q: Γ = (0, Γ_r).
        D, Q = recipe.sgrhmc_dq(_rotated_metric)
        z = jnp.concatenate([theta, jnp.array([0.1, -0.2])])
        np.testing.assert_allclose(recipe.gamma_term(D, Q, z), np.concatenate([[0.0, 0.0], gamma]), rtol=1e-10, atol=1e-10)


def test_gamma_is_finite_for_a_metric_with_repeated_eigenvalues():
    # G^{-1} = (1 + θ_0²) I: eigh's own derivative divides by the eigenvalue gap (0)
    # and gives NaN; the Sylvester form does not. G^{-1/2} = sqrt(1 + θ_0²) I, so
    # Γ = (θ_0 / sqrt(1 + θ_0²), 0).
    with jax.enable_x64(True):
        theta = jnp.array([0.8, -0.5])
        gamma, _, _ = recipe._gamma_r(lambda t: (1.0 + t[0] ** 2) * jnp.eye(2), theta)
        np.testing.assert_allclose(gamma, [0.8 / np.sqrt(1.64), 0.0], **ROUNDING64)


# ---------------------------------------------------------------------------
# Special cases from D, Q reproduce the hand-written updates with the same key.
# ---------------------------------------------------------------------------


def test_sgld_from_recipe_is_the_hand_written_update():
    with jax.enable_x64(True):
        est = gradients.noisy_grad_estimator(lambda th: th**3 - th, 0.5)
        eps = 0.05
        sampler = recipe.sgld(est, eps)
        theta = jnp.array([0.4, -1.1, 2.0])
        key = jax.random.key(11)
        new, info = sampler.step(key, sampler.init(theta))
        # hand-written SGLD: θ' = θ - ε∇Ũ(θ) + sqrt(2ε) ξ, keys split as documented
        key_grad, key_noise = jax.random.split(key)
        hand = theta - eps * est(key_grad, theta) + jnp.sqrt(2 * eps) * jax.random.normal(key_noise, (3,), jnp.float64)
        np.testing.assert_allclose(new.position, hand, **ROUNDING64)
        assert int(new.step) == 1 and int(info.grad_evals) == 1 and not bool(info.diverged)


@pytest.mark.parametrize("friction", [1.0, 0.3])
def test_sghmc_from_recipe_is_the_hand_written_update(friction):
    with jax.enable_x64(True):
        est = gradients.noisy_grad_estimator(lambda th: 2.0 * th, 1.0)
        eps = 0.1
        sampler = recipe.sghmc(est, eps, friction=friction)
        theta, r = jnp.array([0.5, -0.7]), jnp.array([1.2, 0.3])
        state = sampler.init(theta, momentum=r)
        key = jax.random.key(5)
        new, _ = sampler.step(key, state)
        # hand-written SGHMC (Chen et al., M = I): θ' = θ + ε r,
        # r' = r - ε∇Ũ(θ) - ε C r + sqrt(2 C ε) ξ_r, ξ = the r half of one N(0, I_2d) draw
        key_grad, key_noise = jax.random.split(key)
        xi = jax.random.normal(key_noise, (4,), jnp.float64)[2:]
        hand_theta = theta + eps * r
        hand_r = r - eps * est(key_grad, theta) - eps * friction * r + jnp.sqrt(2 * friction * eps) * xi
        np.testing.assert_allclose(new.position, jnp.concatenate([hand_theta, hand_r]), **ROUNDING64)
        np.testing.assert_allclose(sampler.theta(new), hand_theta, **ROUNDING64)


def test_sgrld_from_recipe_is_the_hand_written_update():
    with jax.enable_x64(True):
        inv = lambda th: 1.0 + th**2  # diagonal G^{-1}: Γ_i = ∂_i (1 + θ_i²) = 2 θ_i
        est = gradients.grad_estimator_from_grad(lambda th: th)
        eps = 0.02
        sampler = recipe.sgrld(est, eps, inv)
        theta = jnp.array([0.5, -1.5])
        key = jax.random.key(2)
        new, _ = sampler.step(key, sampler.init(theta))
        _, key_noise = jax.random.split(key)
        xi = jax.random.normal(key_noise, (2,), jnp.float64)
        hand = theta + eps * (-inv(theta) * theta + 2 * theta) + jnp.sqrt(2 * eps * inv(theta)) * xi
        np.testing.assert_allclose(new.position, hand, **ROUNDING64)


@pytest.mark.parametrize("metric", ["diagonal", "dense"])
@pytest.mark.parametrize("with_b_hat", [False, True])
@pytest.mark.parametrize("naive", [False, True])
def test_sgrhmc_step_is_the_recipe_with_section6_D_Q(metric, with_b_hat, naive):
    with jax.enable_x64(True):
        inv = recipe.gsgrhmc_inv_metric(lambda t: jnp.sum(t**4 - t**2)) if metric == "diagonal" else _rotated_metric
        theta, r = jnp.array([0.6, -0.2]), jnp.array([0.3, 1.1])
        grad = jnp.array([0.7, -0.4])
        eps = jnp.asarray(0.05, jnp.float64)
        B = (lambda t: 0.5 * jnp.eye(2)) if with_b_hat else None
        th_mean, r_mean, root, _, gamma = recipe._sgrhmc_mean_and_root(theta, r, grad, eps, inv, B, naive)
        D, Q = recipe.sgrhmc_dq(inv)
        z = jnp.concatenate([theta, r])
        B_full = (lambda z: jnp.zeros((4, 4)).at[2:, 2:].set(0.5 * jnp.eye(2))) if with_b_hat else None
        if naive:  # naive SGRHMC = recipe minus Γ: compare against the recipe mean with Γ_r removed
            z_mean, root_full, _ = recipe._recipe_mean_and_root(z, jnp.concatenate([grad, r]), eps, D, Q, B_full)
            z_mean = z_mean - eps * recipe.gamma_term(D, Q, z)
        else:
            z_mean, root_full, _ = recipe._recipe_mean_and_root(z, jnp.concatenate([grad, r]), eps, D, Q, B_full)
        np.testing.assert_allclose(jnp.concatenate([th_mean, r_mean]), z_mean, rtol=1e-10, atol=1e-12)
        root_r = jnp.diag(root) if root.ndim == 1 else root
        expected_root = jnp.zeros((4, 4)).at[2:, 2:].set(root_r)  # the symmetric PSD root is unique
        np.testing.assert_allclose(root_full, expected_root, rtol=1e-10, atol=1e-12)


# ---------------------------------------------------------------------------
# Statistical behaviour.
# ---------------------------------------------------------------------------


def _frozen_metric_euler_bias(eps, g_values):
    """Exact stationary Var θ - 1 of the explicit-Euler SGRHMC recursion for
    U = θ²/2 with the metric frozen at G^{-1} = g (a linear AR(1) system,
    solved by the discrete Lyapunov equation)."""
    out = []
    for g in g_values:
        s = np.sqrt(g)
        A = np.array([[1.0, eps * s], [-eps * s, 1.0 - eps * g]])
        cov = scipy.linalg.solve_discrete_lyapunov(A, np.diag([0.0, 2.0 * eps * g]))
        out.append(cov[0, 0] - 1.0)
    return np.array(out)


def _run_gsgrhmc(naive, eps, num_chains, num_steps, thin):
    inv = recipe.gsgrhmc_inv_metric(quadratic_potential, 1.5, 0.5)
    est = gradients.noisy_grad_estimator(jax.grad(quadratic_potential), 2.0)  # true gradient + N(0, 4)
    b_hat = lambda th: 4.0 * inv(th)  # G^{-1/2} V G^{-1/2} with V = 4: cancels the gradient noise exactly
    single = functools.partial(recipe.sgrhmc_step, grad_estimator=est, step_size=eps, inv_metric_fn=inv,
                               B_hat=b_hat, naive=naive)

    def step(key, states):
        return jax.vmap(single)(jax.random.split(key, num_chains), states)

    # start in the target's θ-marginal and r's stationary law: burn-in only has
    # to absorb the discretisation / naive-bias transient
    states = jax.vmap(lambda k: recipe.sgrhmc_init(jnp.zeros(1), rng_key=k))(jax.random.split(jax.random.key(1), num_chains))
    states = states._replace(position=jax.random.normal(jax.random.key(2), (num_chains, 1)))
    res = run.sample(jax.random.key(0), step, states, num_steps, thin=thin, burn_in=int(10 / eps))
    assert res.diverged_at == -1
    assert res.trace.shape == (num_steps // thin, num_chains, 1)  # the driver traces θ
    sq = np.swapaxes(np.asarray(res.trace, np.float64) ** 2, 0, 1)  # (chains, draws, 1)
    return float(sq.mean()), float(diagnostics.mcse(sq)[0]), res


def test_gsgrhmc_stationary_variance_and_naive_is_wrong():
    # U = θ²/2 (Var θ = 1), G^{-1} = 1.5 sqrt(U + 0.5), gradients with N(0, 4) noise.
    eps = 0.025
    var, se, res = _run_gsgrhmc(False, eps, num_chains=1000, num_steps=4000, thin=20)
    var_naive, se_naive, _ = _run_gsgrhmc(True, eps, num_chains=1000, num_steps=4000, thin=20)
    print(f"gSGRHMC Var θ = {var:.4f} ± {se:.4f}; naive SGRHMC Var θ = {var_naive:.4f} ± {se_naive:.4f} (truth 1)")
    assert float(np.mean(res.info.noise_clipped)) == 0.0  # ε(2 - 4ε) G^{-1} > 0: B̂ never exceeds the budget
    # Discretisation allowance: explicit Euler's variance bias for the metric
    # frozen at every value G^{-1} takes on |θ| ≤ 3 (99.7% of the mass); exact
    # (Lyapunov), ≈ +1.05 ε, one-sided (Euler inflates the variance).
    g_range = 1.5 * np.sqrt(np.linspace(0.0, 4.5, 46) + 0.5)
    allowance = float(np.max(_frozen_metric_euler_bias(eps, g_range)))
    # 4 MCSE (ESS-based): a false alarm has probability < 1e-4.
    assert -4 * se < var - 1.0 < allowance + 4 * se, (var, se, allowance)
    # Naive SGRHMC at the same settings sits far outside that band (its ε -> 0
    # limit is ≈ 0.84, not 1).
    assert var_naive < 1.0 - 4 * se_naive - allowance, (var_naive, se_naive)
    assert var - var_naive > 10 * np.hypot(se, se_naive)


def test_one_vmapped_step_over_1e5_chains_has_the_exact_law():
    # From θ = 0, r = 0 with the full gradient: θ' = 0 and r' ~ N(0, 2ε G^{-1}(0))
    # exactly (Γ_r(0) = 0, ∇U(0) = 0). G^{-1}(0) = 1.5 sqrt(0.5).
    num_chains, eps = 100_000, 0.1
    inv = recipe.gsgrhmc_inv_metric(quadratic_potential)
    est = gradients.grad_estimator_from_grad(jax.grad(quadratic_potential))
    states = jax.vmap(lambda _: recipe.sgrhmc_init(jnp.zeros(1)))(jnp.arange(num_chains))
    keys = jax.random.split(jax.random.key(0), num_chains)
    step = jax.jit(jax.vmap(functools.partial(recipe.sgrhmc_step, grad_estimator=est, step_size=eps, inv_metric_fn=inv)))
    new, info = step(keys, states)
    assert new.position.shape == (num_chains, 1) and new.momentum.shape == (num_chains, 1)
    np.testing.assert_array_equal(new.position, 0.0)
    assert not bool(jnp.any(info.diverged)) and int(info.grad_evals.sum()) == num_chains
    var = float(jnp.var(new.momentum))
    exact = 2 * eps * 1.5 * np.sqrt(0.5)
    # Gaussian sample variance: relative SE sqrt(2/N) = 0.45%; 5 SE.
    assert abs(var / exact - 1) < 5 * np.sqrt(2 / num_chains)


def test_schedule_drives_the_step_size_and_the_counter():
    # Paper 2's SGRLD schedule ε_t = (a (1 + t/b))^{-c}, one line; and an optax schedule.
    a, b, c = 10.0, 100.0, 0.55
    paper = lambda t: (a * (1.0 + t / b)) ** (-c)
    est = gradients.grad_estimator_from_grad(lambda th: th)
    for schedule, expected in [
        (paper, [(a * (1 + t / b)) ** (-c) for t in range(3)]),
        (optax.exponential_decay(0.1, transition_steps=1, decay_rate=0.5), [0.1, 0.05, 0.025]),
    ]:
        sampler = recipe.sgld(est, schedule)
        state = sampler.init(jnp.zeros(2))
        step = jax.jit(sampler.step)
        got = []
        for t in range(3):
            state, info = step(jax.random.key(t), state)
            got.append(float(info.step_size))
        assert int(state.step) == 3
        np.testing.assert_allclose(got, expected, rtol=1e-6)  # float32 evaluation of the same formula


def test_double_well_singular_gamma_is_reported_not_raised():
    # gSGRHMC's Γ_r ∝ |U + C|^{-3/4} is singular where U + C = 0. With U = θ²/2,
    # C = -0.5, that is θ = 1 exactly: the step must flag divergence, not raise.
    inv = recipe.gsgrhmc_inv_metric(quadratic_potential, 1.5, -0.5)
    est = gradients.grad_estimator_from_grad(jax.grad(quadratic_potential))
    state = recipe.sgrhmc_init(jnp.ones(1), inv_metric_fn=inv, step_size=0.1)
    new, info = jax.jit(functools.partial(recipe.sgrhmc_step, grad_estimator=est, step_size=0.1, inv_metric_fn=inv))(
        jax.random.key(0), state
    )
    assert bool(info.diverged) and not np.isfinite(float(info.gamma_norm))
    # naive SGRHMC has no Γ: the same step stays finite
    _, info_naive = recipe.sgrhmc_step(jax.random.key(0), state, est, 0.1, inv, naive=True)
    assert not bool(info_naive.diverged)


def test_noise_clipping_is_reported_inside_jit():
    # B̂ = 50 I with ε = 0.1: 2·1 - 0.1·50 < 0. Traced, it cannot raise: info says so.
    est = gradients.grad_estimator_from_grad(lambda th: th)
    D = lambda z: jnp.eye(2)
    step = jax.jit(lambda k, s: recipe.recipe_step(k, s, est, 0.1, D, np.zeros((2, 2)), lambda z: 50.0 * jnp.eye(2)))
    _, info = step(jax.random.key(0), recipe.recipe_init(jnp.zeros(2)))
    assert bool(info.noise_clipped)


# ---------------------------------------------------------------------------
# Dtypes, keys, reproducibility.
# ---------------------------------------------------------------------------


def test_float64_preserved_same_key_same_result_typed_and_legacy_keys():
    with jax.enable_x64(True):
        est = gradients.noisy_grad_estimator(lambda th: th, 1.0)
        inv = recipe.gsgrhmc_inv_metric(quadratic_potential)
        theta = jnp.array([0.3, -0.2], jnp.float64)
        for key in (jax.random.key(4), jax.random.PRNGKey(4)):
            s1, i1 = recipe.sgrhmc_step(key, recipe.sgrhmc_init(theta), est, 0.1, inv)
            s2, _ = recipe.sgrhmc_step(key, recipe.sgrhmc_init(theta), est, 0.1, inv)
            assert s1.position.dtype == s1.momentum.dtype == i1.step_size.dtype == jnp.float64
            np.testing.assert_array_equal(s1.momentum, s2.momentum)
            for sampler in (recipe.sgld(est, 0.1), recipe.sghmc(est, 0.1)):
                a, _ = sampler.step(key, sampler.init(theta))
                b, _ = sampler.step(key, sampler.init(theta))
                assert a.position.dtype == jnp.float64
                np.testing.assert_array_equal(a.position, b.position)
        r0 = recipe.sgrhmc_init(theta, rng_key=jax.random.key(0)).momentum
        assert r0.dtype == jnp.float64 and r0.shape == (2,)


# ---------------------------------------------------------------------------
# Bad input.
# ---------------------------------------------------------------------------

_EST = gradients.grad_estimator_from_grad(lambda th: th)


@pytest.mark.parametrize("eps", [0.0, -0.1, float("nan")])
def test_bad_step_size_raises(eps):
    with pytest.raises(ValueError, match="step_size"):
        recipe.recipe_step(jax.random.key(0), recipe.recipe_init(jnp.zeros(2)), _EST, eps, np.eye(2), np.zeros((2, 2)))
    with pytest.raises(ValueError, match="step_size"):
        recipe.sgrhmc_step(jax.random.key(0), recipe.sgrhmc_init(jnp.zeros(1)), _EST, eps, lambda t: jnp.ones(1))
    for make in (lambda: recipe.sgld(_EST, eps), lambda: recipe.sghmc(_EST, eps)):
        with pytest.raises(ValueError, match="step_size"):
            make()


def test_schedule_reaching_zero_raises_when_concrete():
    sampler = recipe.sgld(_EST, lambda t: 0.1 - 0.1 * t)
    state, _ = sampler.step(jax.random.key(0), sampler.init(jnp.zeros(1)))
    with pytest.raises(ValueError, match=r"step_size\(1\)"):
        sampler.step(jax.random.key(1), state)


def test_D_not_psd_and_Q_not_skew_raise_at_the_initial_point():
    z = jnp.array([1.0, 2.0])
    with pytest.raises(ValueError, match="D must be positive semidefinite"):
        recipe.recipe_init(z, D=np.diag([1.0, -0.5]), Q=np.zeros((2, 2)))
    with pytest.raises(ValueError, match="D must be positive semidefinite"):
        recipe.recipe_init(z, D=lambda z: jnp.diag(jnp.array([1.0, 1.0 - z[1]])), Q=np.zeros((2, 2)))  # -1 at z_1 = 2
    with pytest.raises(ValueError, match="D must be symmetric"):
        recipe.recipe_init(z, D=np.array([[1.0, 0.5], [0.0, 1.0]]), Q=np.zeros((2, 2)))
    with pytest.raises(ValueError, match="Q must be skew-symmetric"):
        recipe.recipe_init(z, D=np.eye(2), Q=lambda z: jnp.array([[0.0, z[0]], [z[0], 0.0]]))
    with pytest.raises(ValueError, match=r"\(n, n\)"):
        recipe.recipe_init(z, D=np.eye(3), Q=np.zeros((2, 2)))
    with pytest.raises(ValueError, match="D must be positive semidefinite"):  # constant D: checked at every step too
        recipe.recipe_step(jax.random.key(0), recipe.recipe_init(z), _EST, 0.1, -np.eye(2), np.zeros((2, 2)))
    with pytest.raises(ValueError, match="friction"):
        recipe.sghmc(_EST, 0.1, friction=-1.0).init(jnp.zeros(2))
    with pytest.raises(ValueError, match="inv_metric_fn"):
        recipe.sgrhmc_init(jnp.zeros(2), inv_metric_fn=lambda t: jnp.array([1.0, -1.0]))
    with pytest.raises(ValueError, match="inv_metric_fn"):
        recipe.sgrhmc_init(jnp.zeros(2), inv_metric_fn=lambda t: jnp.ones(3))


def test_negative_definite_noise_covariance_raises():
    z = jnp.zeros(2)
    # ε(2D - εB̂) with D = I, B̂ = 50 I, ε = 0.1: eigenvalues 0.1·(2 - 5) < 0
    with pytest.raises(ValueError, match="noise covariance"):
        recipe.recipe_init(z, D=np.eye(2), Q=np.zeros((2, 2)), step_size=0.1, B_hat=50 * np.eye(2))
    with pytest.raises(ValueError, match="noise covariance"):
        recipe.recipe_step(jax.random.key(0), recipe.recipe_init(z), _EST, 0.1, np.eye(2), np.zeros((2, 2)), 50 * np.eye(2))
    with pytest.raises(ValueError, match="noise covariance"):
        recipe.sgld(_EST, 0.1, B_hat=lambda z: 50 * jnp.eye(2)).init(z)
    with pytest.raises(ValueError, match="noise covariance"):
        recipe.sgrhmc_init(jnp.zeros(1), inv_metric_fn=lambda t: jnp.ones(1), step_size=0.1, B_hat=50.0)
    # PSD but singular is fine: SGHMC's θ block is 0, and B̂ = 2C/ε cancels the r block
    # exactly (0.1·(2 - 0.1·20) = 0 up to rounding, judged against the size 0.2 of the terms)
    recipe.sghmc(_EST, 0.1, B_hat=np.diag([0.0, 0.0, 20.0, 20.0])).init(z)
    recipe.sghmc(_EST, 0.1, B_hat=np.diag([0.0, 0.0, 10.0, 10.0])).init(z)


def test_bad_shapes_and_callables_raise():
    with pytest.raises(ValueError, match="position"):
        recipe.recipe_init(jnp.zeros((2, 2)))
    with pytest.raises(ValueError, match="position"):
        recipe.sgrhmc_init(jnp.array([jnp.nan]))
    with pytest.raises(ValueError, match="grad_estimator"):
        recipe.recipe_step(jax.random.key(0), recipe.recipe_init(jnp.zeros(2)), None, 0.1, np.eye(2), np.zeros((2, 2)))
    with pytest.raises(ValueError, match="momentum"):
        recipe.sgrhmc_init(jnp.zeros(2), momentum=jnp.zeros(3))
    with pytest.raises(ValueError, match="C must be"):
        recipe.gsgrhmc_inv_metric(quadratic_potential, 1.5, float("inf"))
