"""Tests of the complete recipe and SGLD / SGRLD / SGHMC as D, Q choices.

What cannot be faked here: hand-derived Γ formulas and hand-written updates of
SGLD / SGHMC / SGRLD driven by the same key (float64 rounding only), schedules
evaluated at the step counter, and the PSD / skew / noise-covariance checks.
(SGRHMC's tests are in test_sgrhmc.py.)
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from cenlmc_jax import _linalg, gradients
from cenlmc_jax.models import targets
from cenlmc_jax.sgmcmc import recipe, sgrhmc

ROUNDING64 = dict(
    rtol=1e-12, atol=1e-12
)  # same formula, different operation order: float64 rounding only


def quadratic_potential(theta):
    return 0.5 * jnp.sum(theta**2)


# ---------------------------------------------------------------------------
# Γ by autodiff against hand-derived formulas.
# ---------------------------------------------------------------------------


def test_gamma_term_matches_hand_divergence():
    D = lambda z: jnp.diag(z**2)  # Γ_D = (2 z_0, 2 z_1)
    Q = lambda z: jnp.array(
        [[0.0, z[1]], [-z[1], 0.0]]
    )  # Γ_Q = (∂_1 z_1, ∂_0 (-z_1)) = (1, 0)
    z = jnp.array([1.5, -2.0])
    np.testing.assert_allclose(
        _linalg.gamma_term(D, Q, z), [3.0 + 1.0, -4.0], rtol=1e-6
    )
    np.testing.assert_allclose(
        _linalg.gamma_term(D, Q, z, sign=-1.0), [3.0 - 1.0, -4.0], rtol=1e-6
    )
    np.testing.assert_array_equal(
        _linalg.gamma_term(np.eye(2), np.zeros((2, 2)), z), [0.0, 0.0]
    )


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
        # hand-written SGLD: θ' = θ + ε g̃(θ) + sqrt(2ε) ξ, keys split as documented
        key_grad, key_noise = jax.random.split(key)
        hand = (
            theta
            + eps * est(key_grad, theta)
            + jnp.sqrt(2 * eps) * jax.random.normal(key_noise, (3,), jnp.float64)
        )
        np.testing.assert_allclose(new.position, hand, **ROUNDING64)
        assert (
            int(new.step) == 1 and int(info.grad_evals) == 1 and not bool(info.diverged)
        )


@pytest.mark.parametrize("friction", [1.0, 0.3])
def test_sghmc_from_recipe_is_the_hand_written_update(friction):
    with jax.enable_x64(True):
        est = gradients.noisy_grad_estimator(lambda th: 2.0 * th, 1.0)
        eps = 0.1
        sampler = recipe.sghmc(est, eps, friction=friction)
        theta, r = jnp.array([0.5, -0.7]), jnp.array([1.2, 0.3])
        state = recipe.sghmc_init(
            theta, momentum=r, friction=friction, step_size=eps
        )  # a momentum of our own
        key = jax.random.key(5)
        new, _ = sampler.step(key, state)
        # hand-written SGHMC (Chen et al., M = I): θ' = θ + ε r, r' = r + ε g̃(θ) - ε C
        # r + sqrt(2 C ε) ξ_r, ξ ~ N(0, I_d) from key_noise (as BlackJAX's diffusion)
        key_grad, key_noise = jax.random.split(key)
        xi = jax.random.normal(key_noise, (2,), jnp.float64)
        hand_theta = theta + eps * r
        hand_r = (
            r
            + eps * est(key_grad, theta)
            - eps * friction * r
            + jnp.sqrt(2 * friction * eps) * xi
        )
        np.testing.assert_allclose(new.position, hand_theta, **ROUNDING64)
        np.testing.assert_allclose(new.momentum, hand_r, **ROUNDING64)


def test_sgrld_from_recipe_is_the_hand_written_update():
    with jax.enable_x64(True):
        inv = lambda th: 1.0 + th**2  # diagonal G^{-1}: Γ_i = ∂_i (1 + θ_i²) = 2 θ_i
        est = gradients.grad_estimator_from_grad(lambda th: -th)  # ∇log π of N(0, I)
        eps = 0.02
        sampler = recipe.sgrld(est, eps, inv)
        theta = jnp.array([0.5, -1.5])
        key = jax.random.key(2)
        new, _ = sampler.step(key, sampler.init(theta))
        _, key_noise = jax.random.split(key)
        xi = jax.random.normal(key_noise, (2,), jnp.float64)
        hand = (
            theta
            + eps * (-inv(theta) * theta + 2 * theta)
            + jnp.sqrt(2 * eps * inv(theta)) * xi
        )
        np.testing.assert_allclose(new.position, hand, **ROUNDING64)


# ---------------------------------------------------------------------------
# Statistical behaviour.
# ---------------------------------------------------------------------------


def test_schedule_drives_the_step_size_and_the_counter():
    # Paper 2's SGRLD schedule ε_t = (a (1 + t/b))^{-c}, one line; and an optax
    # schedule.
    a, b, c = 10.0, 100.0, 0.55
    paper = lambda t: (a * (1.0 + t / b)) ** (-c)
    est = gradients.grad_estimator_from_grad(lambda th: th)
    for schedule, expected in [
        (paper, [(a * (1 + t / b)) ** (-c) for t in range(3)]),
        (
            optax.exponential_decay(0.1, transition_steps=1, decay_rate=0.5),
            [0.1, 0.05, 0.025],
        ),
    ]:
        sampler = recipe.sgld(est, schedule)
        state = sampler.init(jnp.zeros(2))
        step = jax.jit(sampler.step)
        got = []
        for t in range(3):
            state, info = step(jax.random.key(t), state)
            got.append(float(info.step_size))
        assert int(state.step) == 3
        np.testing.assert_allclose(
            got, expected, rtol=1e-6
        )  # float32 evaluation of the same formula


def test_noise_clipping_is_reported_inside_jit():
    # B̂ = 50 I with ε = 0.1: 2·1 - 0.1·50 < 0. Traced, it cannot raise: info says so.
    est = gradients.grad_estimator_from_grad(lambda th: th)
    D = lambda z: jnp.eye(2)
    step = jax.jit(
        lambda k, s: recipe.recipe_step(
            k, s, est, 0.1, D, np.zeros((2, 2)), lambda z: 50.0 * jnp.eye(2)
        )
    )
    _, info = step(jax.random.key(0), recipe.recipe_init(jnp.zeros(2)))
    assert bool(info.noise_clipped)


# ---------------------------------------------------------------------------
# Dtypes, keys, reproducibility.
# ---------------------------------------------------------------------------


def test_float64_preserved_same_key_same_result_typed_and_legacy_keys():
    with jax.enable_x64(True):
        est = gradients.noisy_grad_estimator(lambda th: th, 1.0)
        inv = sgrhmc.gsgrhmc_inv_metric(quadratic_potential)
        theta = jnp.array([0.3, -0.2], jnp.float64)
        for key in (jax.random.key(4), jax.random.PRNGKey(4)):
            s1, i1 = sgrhmc.sgrhmc_step(key, sgrhmc.sgrhmc_init(theta), est, 0.1, inv)
            s2, _ = sgrhmc.sgrhmc_step(key, sgrhmc.sgrhmc_init(theta), est, 0.1, inv)
            assert (
                s1.position.dtype
                == s1.momentum.dtype
                == i1.step_size.dtype
                == jnp.float64
            )
            np.testing.assert_array_equal(s1.momentum, s2.momentum)
            for sampler in (recipe.sgld(est, 0.1), recipe.sghmc(est, 0.1)):
                a, _ = sampler.step(key, sampler.init(theta))
                b, _ = sampler.step(key, sampler.init(theta))
                assert a.position.dtype == jnp.float64
                np.testing.assert_array_equal(a.position, b.position)
        r0 = sgrhmc.sgrhmc_init(theta, rng_key=jax.random.key(0)).momentum
        assert r0.dtype == jnp.float64 and r0.shape == (2,)


# ---------------------------------------------------------------------------
# Bad input.
# ---------------------------------------------------------------------------

_EST = gradients.grad_estimator_from_grad(lambda th: th)


@pytest.mark.parametrize("eps", [0.0, -0.1, float("nan")])
def test_bad_step_size_raises(eps):
    with pytest.raises(ValueError, match="step_size"):
        recipe.recipe_step(
            jax.random.key(0),
            recipe.recipe_init(jnp.zeros(2)),
            _EST,
            eps,
            np.eye(2),
            np.zeros((2, 2)),
        )
    with pytest.raises(ValueError, match="step_size"):
        sgrhmc.sgrhmc_step(
            jax.random.key(0),
            sgrhmc.sgrhmc_init(jnp.zeros(1)),
            _EST,
            eps,
            lambda t: jnp.ones(1),
        )
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
        recipe.recipe_init(
            z, D=lambda z: jnp.diag(jnp.array([1.0, 1.0 - z[1]])), Q=np.zeros((2, 2))
        )  # -1 at z_1 = 2
    with pytest.raises(ValueError, match="D must be symmetric"):
        recipe.recipe_init(z, D=np.array([[1.0, 0.5], [0.0, 1.0]]), Q=np.zeros((2, 2)))
    with pytest.raises(ValueError, match="Q must be skew-symmetric"):
        recipe.recipe_init(
            z, D=np.eye(2), Q=lambda z: jnp.array([[0.0, z[0]], [z[0], 0.0]])
        )
    with pytest.raises(ValueError, match="D must be a scalar"):
        recipe.recipe_init(z, D=np.eye(3), Q=np.zeros((2, 2)))
    with pytest.raises(
        ValueError, match="D must be positive semidefinite"
    ):  # constant D: checked at every step too
        recipe.recipe_step(
            jax.random.key(0),
            recipe.recipe_init(z),
            _EST,
            0.1,
            -np.eye(2),
            np.zeros((2, 2)),
        )
    with pytest.raises(ValueError, match="friction"):
        recipe.sghmc(_EST, 0.1, friction=-1.0).init(jnp.zeros(2))
    with pytest.raises(ValueError, match="inv_metric_fn"):
        sgrhmc.sgrhmc_init(jnp.zeros(2), inv_metric_fn=lambda t: jnp.array([1.0, -1.0]))
    with pytest.raises(ValueError, match="inv_metric_fn"):
        sgrhmc.sgrhmc_init(jnp.zeros(2), inv_metric_fn=lambda t: jnp.ones(3))


def test_negative_definite_noise_covariance_raises():
    z = jnp.zeros(2)
    # ε(2D - εB̂) with D = I, B̂ = 50 I, ε = 0.1: eigenvalues 0.1·(2 - 5) < 0
    with pytest.raises(ValueError, match="noise covariance"):
        recipe.recipe_init(
            z, D=np.eye(2), Q=np.zeros((2, 2)), step_size=0.1, B_hat=50 * np.eye(2)
        )
    with pytest.raises(ValueError, match="noise covariance"):
        recipe.recipe_step(
            jax.random.key(0),
            recipe.recipe_init(z),
            _EST,
            0.1,
            np.eye(2),
            np.zeros((2, 2)),
            50 * np.eye(2),
        )
    with pytest.raises(ValueError, match="noise covariance"):
        recipe.sgld(_EST, 0.1, B_hat=lambda z: 50 * jnp.eye(2)).init(z)
    with pytest.raises(ValueError, match="noise covariance"):
        sgrhmc.sgrhmc_init(
            jnp.zeros(1), inv_metric_fn=lambda t: jnp.ones(1), step_size=0.1, B_hat=50.0
        )
    # PSD but singular is fine: SGHMC's θ block is 0, and B̂ = 2C/ε cancels the r block
    # exactly (0.1·(2 - 0.1·20) = 0 up to rounding, judged against the size 0.2 of the
    # terms)
    recipe.sghmc(_EST, 0.1, B_hat=20.0).init(z)
    recipe.sghmc(_EST, 0.1, B_hat=np.diag([10.0, 10.0])).init(z)


def test_bad_shapes_and_callables_raise():
    with pytest.raises(ValueError, match="position"):
        recipe.recipe_init(jnp.zeros((2, 2)))
    with pytest.raises(ValueError, match="position"):
        sgrhmc.sgrhmc_init(jnp.array([jnp.nan]))
    with pytest.raises(ValueError, match="grad_estimator"):
        recipe.recipe_step(
            jax.random.key(0),
            recipe.recipe_init(jnp.zeros(2)),
            None,
            0.1,
            np.eye(2),
            np.zeros((2, 2)),
        )
    with pytest.raises(ValueError, match="momentum"):
        sgrhmc.sgrhmc_init(jnp.zeros(2), momentum=jnp.zeros(3))
    with pytest.raises(ValueError, match="C must be"):
        sgrhmc.gsgrhmc_inv_metric(quadratic_potential, 1.5, float("inf"))


# ---------------------------------------------------------------------------
# Issue 10: SGHMC block step = the recipe; pytree positions; init inside jit.
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "friction", [0.7, np.array([0.5, 1.5]), np.array([[1.0, 0.3], [0.3, 0.6]])]
)
def test_sghmc_step_is_the_recipe_with_its_D_and_Q(friction):
    """The block-wise SGHMC step has the recipe's mean and noise covariance on z = (θ,
    r) with D = [[0, 0], [0, C]], Q = [[0, -I], [I, 0]] (built by _sghmc_dq), for a
    scalar, diagonal and dense friction, with and without B̂ (float64 rounding only)."""
    with jax.enable_x64(True):
        grad = jnp.array([0.4, -0.9])
        est = gradients.grad_estimator_from_grad(lambda th: grad)
        theta, r, eps = jnp.array([0.3, -1.2]), jnp.array([0.8, 0.1]), 0.05
        for B_hat in (None, 0.5 * np.eye(2)):
            state = recipe.SGHMCState(theta, r, jnp.zeros((), jnp.int32))
            key = jax.random.key(3)
            new, info = recipe.sghmc_step(key, state, est, eps, friction, B_hat)
            D, Q, B = recipe._sghmc_dq(friction, 2, B_hat)
            z = jnp.concatenate([theta, r])
            mean, root, _ = recipe.recipe_mean_and_root(
                z, jnp.concatenate([grad, -r]), jnp.asarray(eps), D, Q, B
            )
            xi = jax.random.normal(jax.random.split(key)[1], (2,), jnp.float64)
            root_r = root[2:, 2:]  # the θ block of the recipe's root is 0
            np.testing.assert_allclose(root[:2], 0.0, atol=1e-12)
            np.testing.assert_allclose(new.position, mean[:2], **ROUNDING64)
            np.testing.assert_allclose(
                new.momentum, mean[2:] + root_r @ xi, **ROUNDING64
            )
            assert not bool(info.noise_clipped)


def test_sghmc_noise_clipping_is_reported_inside_jit():
    # B̂(θ) = 50 I with ε = 0.1, C = 1: 2·1 - 0.1·50 < 0. Traced, it cannot raise: info
    # says so.
    est = gradients.grad_estimator_from_grad(lambda th: -th)
    sampler = recipe.sghmc(est, 0.1, B_hat=lambda th: 50.0 * jnp.ones(2))
    state = recipe.SGHMCState(jnp.zeros(2), jnp.zeros(2), jnp.zeros((), jnp.int32))
    _, info = jax.jit(sampler.step)(jax.random.key(0), state)
    assert bool(info.noise_clipped)


def test_recipe_samplers_take_dict_positions_and_give_the_flat_chain():
    """θ = {"b": scalar, "w": (3,)} on the logistic regression with minibatch gradients
    of the dict: SGLD and SGHMC equal their runs on the flat vector (b, w), draw for
    draw."""
    tgt = targets.logistic_regression(dim=4)
    data = (
        jnp.asarray(tgt.data["x"], jnp.float32),
        jnp.asarray(tgt.data["y"], jnp.float32),
    )
    pack = lambda p: jnp.concatenate([p["b"][None], p["w"]])
    est_flat = gradients.minibatch_grad_estimator(
        tgt.data["logprior_fn"], tgt.data["loglik_fn"], data, 20
    )
    est_dict = gradients.minibatch_grad_estimator(
        lambda p: tgt.data["logprior_fn"](pack(p)),
        lambda p, x, y: tgt.data["loglik_fn"](pack(p), x, y),
        data,
        20,
    )
    x0 = jnp.asarray(tgt.data["theta_map"], jnp.float32)
    for make in (
        lambda e: recipe.sgld(e, 1e-3),
        lambda e: recipe.sghmc(e, 1e-2, friction=2.0),
    ):
        flat, tree = make(est_flat), make(est_dict)
        sf, st = flat.init(x0), tree.init({"b": x0[0], "w": x0[1:]})
        for t in range(10):
            sf, _ = jax.jit(flat.step)(jax.random.key(t), sf)
            st, _ = jax.jit(tree.step)(jax.random.key(t), st)
        assert isinstance(st.position, dict)
        np.testing.assert_allclose(
            pack(st.position), sf.position, rtol=1e-5, atol=1e-6
        )  # float32 sum order


def test_recipe_and_sghmc_init_inside_jit():
    """Issue 8: init inside jit on a concrete closed-over position (the checks run
    eagerly)."""
    x = jnp.array([0.5, -1.0])
    for init in (
        lambda: recipe.recipe_init(x, np.eye(2), np.zeros((2, 2)), 0.1),
        lambda: recipe.sghmc_init(x, momentum=jnp.ones(2), step_size=0.1),
        lambda: sgrhmc.sgrhmc_init(
            x, inv_metric_fn=lambda t: jnp.ones(2), step_size=0.1
        ),
    ):
        jax.tree_util.tree_map(np.testing.assert_array_equal, jax.jit(init)(), init())
