"""Tests of stochastic-gradient Riemann HMC (docs/algorithms.md §6) and the gSGRHMC
metric.

What cannot be faked here: hand-derived Γ_r formulas (diagonal and dense
metrics), the block SGRHMC step against the generic recipe with the section-6
D, Q, the exact law of one step, and a stationary variance against the truth
with a Monte-Carlo standard error (ESS from cenlmc_jax.diagnostics) plus a
discretisation allowance computed exactly for the frozen-metric linear
recursion; naive SGRHMC must miss it.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg

from cenlmc_jax import _linalg, diagnostics, gradients, run
from cenlmc_jax.sgmcmc import recipe, sgrhmc

ROUNDING64 = dict(
    rtol=1e-12, atol=1e-12
)  # same formula, different operation order: float64 rounding only


def quadratic_potential(theta):
    return 0.5 * jnp.sum(theta**2)


@pytest.mark.parametrize("theta", [-2.0, -0.3, 0.0, 0.7, 3.0])
def test_gsgrhmc_gamma_1d_matches_analytic(theta):
    # G^{-1/2} = sqrt(D) |U + C|^{1/4}  =>  Γ_r = sqrt(D)/4 |U + C|^{-3/4} sign(U + C)
    # U'(θ).
    D, C = 1.5, 0.5
    inv = sgrhmc.gsgrhmc_inv_metric(quadratic_potential, D, C)
    u = theta**2 / 2
    expected = np.sqrt(D) / 4 * abs(u + C) ** -0.75 * np.sign(u + C) * theta
    with jax.enable_x64(True):
        gamma, half, g = sgrhmc.gamma_r(inv, jnp.array([theta]))
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
    return np.array(
        [
            a * c * c - 2 * t1 * c * s + (a - b) * np.cos(2 * t1),
            a * c * s + 2 * (a - b) * s * c + 2 * t1 * c * c,
        ]
    )


@pytest.mark.parametrize("theta", [(0.3, -0.4), (-1.0, 1.2), (0.0, 0.0)])
def test_dense_metric_gamma_2d_matches_analytic(theta):
    with jax.enable_x64(True):
        theta = jnp.array(theta, jnp.float64)
        gamma, half, _ = sgrhmc.gamma_r(_rotated_metric, theta)
        # eigh-based root and Sylvester-equation derivative vs the closed form:
        # float64 eigen-decomposition error, ~1e-14 relative.
        np.testing.assert_allclose(
            gamma, _rotated_metric_gamma(np.asarray(theta)), rtol=1e-10, atol=1e-10
        )
        # The generic recipe with the section-6 D, Q: Γ = (0, Γ_r).
        D, Q = sgrhmc.sgrhmc_dq(_rotated_metric)
        z = jnp.concatenate([theta, jnp.array([0.1, -0.2])])
        np.testing.assert_allclose(
            _linalg.gamma_term(D, Q, z),
            np.concatenate([[0.0, 0.0], gamma]),
            rtol=1e-10,
            atol=1e-10,
        )


def test_gamma_is_finite_for_a_metric_with_repeated_eigenvalues():
    # G^{-1} = (1 + θ_0²) I: eigh's own derivative divides by the eigenvalue gap (0)
    # and gives NaN; the Sylvester form does not. G^{-1/2} = sqrt(1 + θ_0²) I, so
    # Γ = (θ_0 / sqrt(1 + θ_0²), 0).
    with jax.enable_x64(True):
        theta = jnp.array([0.8, -0.5])
        gamma, _, _ = sgrhmc.gamma_r(lambda t: (1.0 + t[0] ** 2) * jnp.eye(2), theta)
        np.testing.assert_allclose(gamma, [0.8 / np.sqrt(1.64), 0.0], **ROUNDING64)


def _jacfwd_gamma_r(inv_metric_fn, theta):
    """Γ_r straight from jax.jacfwd of G^{-1/2} (the reference for the one Γ of
    _linalg.gamma_term)."""
    half_fn = lambda t: sgrhmc._sqrt_inv_metric(inv_metric_fn, t)[0]  # noqa: E731
    jac = jax.jacfwd(half_fn)(theta)
    return jnp.diagonal(jac) if jac.ndim == 2 else jnp.einsum("ijj->i", jac)


@pytest.mark.parametrize(
    "metric", ["gsgrhmc", "scalar", "rotated", "repeated", "constant"]
)
@pytest.mark.parametrize("x64", [False, True])
def test_gamma_r_is_the_recipes_gamma_term(metric, x64):
    """SGRHMC's Γ_r goes through _linalg.gamma_term: the same values as jacfwd of
    G^{-1/2} and as the recipe's Γ of the section-6 D, Q (whose θ rows are 0), to
    rounding; G^{-1/2}, G^{-1} as evaluated."""
    inv = {
        "gsgrhmc": sgrhmc.gsgrhmc_inv_metric(lambda t: jnp.sum(t**4 - t**2)),
        "scalar": lambda t: 1.0 + t[0] ** 2,
        "rotated": _rotated_metric,
        "repeated": lambda t: (1.0 + t[0] ** 2) * jnp.eye(2),
        "constant": np.array([1.0, 2.0]),
    }[metric]
    with jax.enable_x64(x64):
        dtype = jnp.float64 if x64 else jnp.float32
        tol = ROUNDING64 if x64 else dict(rtol=1e-5, atol=1e-6)
        theta = jnp.array([0.6, -0.2], dtype)
        gamma, half, g = sgrhmc.gamma_r(inv, theta)
        assert gamma.dtype == half.dtype == g.dtype == dtype
        ref_half, ref_g = sgrhmc._sqrt_inv_metric(inv, theta)
        np.testing.assert_allclose(half, ref_half, **tol)
        np.testing.assert_allclose(g, ref_g, **tol)
        expected = _jacfwd_gamma_r(inv, theta) if callable(inv) else np.zeros(2)
        np.testing.assert_allclose(gamma, expected, **tol)
        D, Q = sgrhmc.sgrhmc_dq(inv)
        z = jnp.concatenate([theta, jnp.array([0.1, -0.2], dtype)])
        np.testing.assert_allclose(
            _linalg.gamma_term(D, Q, z), np.concatenate([[0.0, 0.0], gamma]), **tol
        )
        np.testing.assert_allclose(
            jax.jit(lambda t: sgrhmc.gamma_r(inv, t)[0])(theta), gamma, **tol
        )


def test_gamma_term_has_aux_returns_the_values_of_the_same_pass():
    with jax.enable_x64(True):
        z = jnp.array([0.4, -1.3])
        D = lambda y: (jnp.exp(y), jnp.sum(y))  # noqa: E731 - a (d,) diagonal and an aux value
        Q = lambda y: (y[0] * jnp.array([[0.0, 1.0], [-1.0, 0.0]]), 2.0 * y[1])  # noqa: E731
        gamma, (aux_d, aux_q) = _linalg.gamma_term(D, Q, z, sign=-1.0, has_aux=True)
        np.testing.assert_array_equal(
            gamma,
            _linalg.gamma_term(lambda y: D(y)[0], lambda y: Q(y)[0], z, sign=-1.0),
        )
        np.testing.assert_allclose(aux_d, -0.9, **ROUNDING64)
        np.testing.assert_allclose(aux_q, -2.6, **ROUNDING64)
        gamma, aux = _linalg.gamma_term(np.eye(2), None, z, has_aux=True)
        np.testing.assert_array_equal(gamma, [0.0, 0.0])
        assert aux == (None, None)


@pytest.mark.parametrize("metric", ["diagonal", "dense"])
@pytest.mark.parametrize("with_b_hat", [False, True])
@pytest.mark.parametrize("naive", [False, True])
def test_sgrhmc_step_is_the_recipe_with_section6_D_Q(metric, with_b_hat, naive):
    with jax.enable_x64(True):
        inv = (
            sgrhmc.gsgrhmc_inv_metric(lambda t: jnp.sum(t**4 - t**2))
            if metric == "diagonal"
            else _rotated_metric
        )
        theta, r = jnp.array([0.6, -0.2]), jnp.array([0.3, 1.1])
        grad = jnp.array([0.7, -0.4])
        eps = jnp.asarray(0.05, jnp.float64)
        B = (lambda t: 0.5 * jnp.eye(2)) if with_b_hat else None
        th_mean, r_mean, root, _, gamma = sgrhmc.sgrhmc_mean_and_root(
            theta, r, grad, eps, inv, B, naive
        )
        D, Q = sgrhmc.sgrhmc_dq(inv)
        z = jnp.concatenate([theta, r])
        B_full = (
            (lambda z: jnp.zeros((4, 4)).at[2:, 2:].set(0.5 * jnp.eye(2)))
            if with_b_hat
            else None
        )
        # naive SGRHMC = recipe minus Γ: compare against the recipe mean with Γ_r
        # removed
        if naive:
            z_mean, root_full, _ = recipe.recipe_mean_and_root(
                z, jnp.concatenate([grad, -r]), eps, D, Q, B_full
            )
            z_mean = z_mean - eps * _linalg.gamma_term(D, Q, z)
        else:
            z_mean, root_full, _ = recipe.recipe_mean_and_root(
                z, jnp.concatenate([grad, -r]), eps, D, Q, B_full
            )
        np.testing.assert_allclose(
            jnp.concatenate([th_mean, r_mean]), z_mean, rtol=1e-10, atol=1e-12
        )
        root_r = jnp.diag(root) if root.ndim == 1 else root
        expected_root = (
            jnp.zeros((4, 4)).at[2:, 2:].set(root_r)
        )  # the symmetric PSD root is unique
        np.testing.assert_allclose(root_full, expected_root, rtol=1e-10, atol=1e-12)


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
    inv = sgrhmc.gsgrhmc_inv_metric(quadratic_potential, 1.5, 0.5)
    est = gradients.noisy_grad_estimator(
        lambda t: -jax.grad(quadratic_potential)(t), 2.0
    )  # true ∇log π + N(0, 4)
    b_hat = lambda th: (
        4.0 * inv(th)
    )  # G^{-1/2} V G^{-1/2} with V = 4: cancels the gradient noise exactly
    single = functools.partial(
        sgrhmc.sgrhmc_step,
        grad_estimator=est,
        step_size=eps,
        inv_metric_fn=inv,
        B_hat=b_hat,
        naive=naive,
    )

    def step(key, states):
        return jax.vmap(single)(jax.random.split(key, num_chains), states)

    # start in the target's θ-marginal and r's stationary law: burn-in only has
    # to absorb the discretisation / naive-bias transient
    states = jax.vmap(lambda k: sgrhmc.sgrhmc_init(jnp.zeros(1), rng_key=k))(
        jax.random.split(jax.random.key(1), num_chains)
    )
    states = states._replace(
        position=jax.random.normal(jax.random.key(2), (num_chains, 1))
    )
    res = run.sample(
        jax.random.key(0), step, states, num_steps, thin=thin, burn_in=int(10 / eps)
    )
    assert res.diverged_at == -1
    assert res.trace.shape == (num_steps // thin, num_chains, 1)  # the driver traces θ
    sq = np.swapaxes(np.asarray(res.trace, np.float64) ** 2, 0, 1)  # (chains, draws, 1)
    return float(sq.mean()), float(diagnostics.mcse(sq)[0]), res


def test_gsgrhmc_stationary_variance_and_naive_is_wrong():
    # U = θ²/2 (Var θ = 1), G^{-1} = 1.5 sqrt(U + 0.5), gradients with N(0, 4) noise.
    eps = 0.025
    var, se, res = _run_gsgrhmc(False, eps, num_chains=1000, num_steps=4000, thin=20)
    var_naive, se_naive, _ = _run_gsgrhmc(
        True, eps, num_chains=1000, num_steps=4000, thin=20
    )
    print(
        f"gSGRHMC Var θ = {var:.4f} ± {se:.4f}; naive SGRHMC Var θ = {var_naive:.4f} ± "
        f"{se_naive:.4f} (truth 1)"
    )
    assert (
        float(np.mean(res.info.noise_clipped)) == 0.0
    )  # ε(2 - 4ε) G^{-1} > 0: B̂ never exceeds the budget
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
    inv = sgrhmc.gsgrhmc_inv_metric(quadratic_potential)
    est = gradients.grad_estimator_from_grad(
        lambda t: -jax.grad(quadratic_potential)(t)
    )
    states = jax.vmap(lambda _: sgrhmc.sgrhmc_init(jnp.zeros(1)))(
        jnp.arange(num_chains)
    )
    keys = jax.random.split(jax.random.key(0), num_chains)
    step = jax.jit(
        jax.vmap(
            functools.partial(
                sgrhmc.sgrhmc_step, grad_estimator=est, step_size=eps, inv_metric_fn=inv
            )
        )
    )
    new, info = step(keys, states)
    assert new.position.shape == (num_chains, 1) and new.momentum.shape == (
        num_chains,
        1,
    )
    np.testing.assert_array_equal(new.position, 0.0)
    assert not bool(jnp.any(info.diverged)) and int(info.grad_evals.sum()) == num_chains
    var = float(jnp.var(new.momentum))
    exact = 2 * eps * 1.5 * np.sqrt(0.5)
    # Gaussian sample variance: relative SE sqrt(2/N) = 0.45%; 5 SE.
    assert abs(var / exact - 1) < 5 * np.sqrt(2 / num_chains)


def test_double_well_singular_gamma_is_reported_not_raised():
    # gSGRHMC's Γ_r ∝ |U + C|^{-3/4} is singular where U + C = 0. With U = θ²/2,
    # C = -0.5, that is θ = 1 exactly: the step must flag divergence, not raise.
    inv = sgrhmc.gsgrhmc_inv_metric(quadratic_potential, 1.5, -0.5)
    est = gradients.grad_estimator_from_grad(
        lambda t: -jax.grad(quadratic_potential)(t)
    )
    state = sgrhmc.sgrhmc_init(jnp.ones(1), inv_metric_fn=inv, step_size=0.1)
    new, info = jax.jit(
        functools.partial(
            sgrhmc.sgrhmc_step, grad_estimator=est, step_size=0.1, inv_metric_fn=inv
        )
    )(jax.random.key(0), state)
    assert bool(info.diverged) and not np.isfinite(float(info.gamma_norm))
    # naive SGRHMC has no Γ: the same step stays finite
    _, info_naive = sgrhmc.sgrhmc_step(
        jax.random.key(0), state, est, 0.1, inv, naive=True
    )
    assert not bool(info_naive.diverged)


@pytest.mark.parametrize(
    "inv_metric_fn",
    [
        lambda t: (
            -jnp.ones_like(t)
        ),  # diagonal, negative: the root is clipped to 0 and θ freezes
        lambda t: jnp.array([[1.0, 2.0], [2.0, 1.0]]),  # dense, eigenvalues 3 and -1
    ],
)
def test_a_negative_metric_under_jit_is_reported_not_frozen_silently(inv_metric_fn):
    """Issue 8: G^{-1}(θ) not PSD inside jit cannot raise; the step reports
    invalid_metric and diverged, and the driver stops with a warning instead of
    returning a frozen chain."""
    est = gradients.grad_estimator_from_grad(lambda t: -t)
    step = functools.partial(
        sgrhmc.sgrhmc_step,
        grad_estimator=est,
        step_size=0.1,
        inv_metric_fn=inv_metric_fn,
    )
    state = sgrhmc.sgrhmc_init(jnp.ones(2))
    _, info = jax.jit(step)(jax.random.key(0), state)
    assert bool(info.invalid_metric) and bool(info.diverged)
    with pytest.warns(RuntimeWarning, match="diverged"):
        res = run.sample(jax.random.key(1), step, state, 20)
    assert res.diverged_at == 0
    # a valid metric is not flagged (gSGRHMC's, which is 0 exactly where U = -C, is
    # allowed)
    _, ok = jax.jit(
        functools.partial(
            step, inv_metric_fn=sgrhmc.gsgrhmc_inv_metric(quadratic_potential)
        )
    )(jax.random.key(0), state)
    assert not bool(ok.invalid_metric) and not bool(ok.diverged)


def test_sgrhmc_takes_a_dict_position():
    """θ = {"a": (1,), "b": (1,)}: the same chain as the flat θ = (a, b), and the state
    keeps the dict."""
    inv = lambda t: 1.0 + 0.1 * t**2  # a diagonal metric of the flat θ
    est_flat = gradients.grad_estimator_from_grad(lambda t: -t)
    est_dict = lambda key, p: {"a": -p["a"], "b": -p["b"]}
    flat = sgrhmc.sgrhmc(est_flat, 0.05, inv)
    tree = sgrhmc.sgrhmc(est_dict, 0.05, inv)
    sf = flat.init(jnp.array([0.5, -0.5]), jax.random.key(0))
    st = tree.init({"a": jnp.array([0.5]), "b": jnp.array([-0.5])}, jax.random.key(0))
    for t in range(10):
        sf, _ = flat.step(jax.random.key(t), sf)
        st, _ = tree.step(jax.random.key(t), st)
    assert set(st.position) == {"a", "b"}
    np.testing.assert_allclose(
        jnp.concatenate([st.position["a"], st.position["b"]]), sf.position, rtol=1e-6
    )
