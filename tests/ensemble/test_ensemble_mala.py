"""Ensemble MALA (``cenlmc_jax.ensemble.ensemble_mala``): exact, gradient-free.

Statistics: every z-test compares an estimate with an exact value (a closed form), its
standard error from independent replicates (independent ensembles, or independent
one-step transitions), so the standard error is exact up to its own sampling noise.
``Z_MAX = 4.5``: with R = 32 replicates the statistic is t-distributed with 31 degrees
of freedom, P(|t| > 4.5) ≈ 1e-4, and this module makes about 60 such comparisons: a
false-alarm rate under 1 % for the module (with large replicate counts the normal tail,
7e-6, applies). Seeds are fixed (0, 1, ...) in the order written, never searched.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cenlmc_jax as cj
from cenlmc_jax.ensemble import ensemble_mala
from cenlmc_jax.ensemble.ensemble_mala import (
    EnsembleMALAInfo,
    EnsembleMALAState,
    ensemble_gradient,
    ensemble_mala_step,
    ensemble_mala_warmup,
)

Z_MAX = 4.5  # module docstring: ≈ 1e-4 per comparison at 31 degrees of freedom

# ---------------------------------------------------------------- targets
# Each: (log density, exact mean, exact variance, dimension).

COV = np.array([[1.0, 0.9, 0.0], [0.9, 1.0, 0.3], [0.0, 0.3, 2.0]])
PREC = np.linalg.inv(COV)


def gaussian(x):
    return -0.5 * x @ jnp.asarray(PREC, x.dtype) @ x


B_BANANA = 0.5  # x1 | x0 ~ N(b (x0² - 1), 1): moderate curvature


def banana(x):
    return -0.5 * x[0] ** 2 - 0.5 * (x[1] - B_BANANA * (x[0] ** 2 - 1.0)) ** 2


A_SKEW = 3.0  # x0 = log G, G ~ Gamma(3, 1); x1 | x0 ~ N(0, e^{x0}): skewed funnel
PSI_3 = 1.5 - 0.5772156649015329  # digamma(3)
PSI1_3 = math.pi**2 / 6 - 1.25  # trigamma(3)
PSI2_3 = -2 * 1.2020569031595942 + 2.25  # tetragamma(3)


def skew_funnel(x):
    return A_SKEW * x[0] - jnp.exp(x[0]) - 0.5 * x[1] ** 2 * jnp.exp(-x[0]) - 0.5 * x[0]


TARGETS = {
    # Var x1 of the banana: 1 + b² Var(x0²) = 1 + 2b²; the funnel: E e^{x0} = E G = a
    "gaussian": (gaussian, np.zeros(3), np.diag(COV), 3),
    "banana": (banana, np.zeros(2), np.array([1.0, 1.0 + 2 * B_BANANA**2]), 2),
    "skew_funnel": (skew_funnel, np.array([PSI_3, 0.0]), np.array([PSI1_3, A_SKEW]), 2),
}


def replicate_moments(logdensity_fn, d, estimator, *, reps=32, n=24, h, burn, steps):
    """Per-replicate time-and-particle averages of x and x² of independent ensembles.

    Float64; each replicate its own key and start ``N(0, I)``.
    """
    with jax.enable_x64(True):

        def one(key):
            k0, k1 = jax.random.split(key)
            x0 = jax.random.normal(k0, (n, d), jnp.float64)
            algo = ensemble_mala(logdensity_fn, h, estimator=estimator)
            state = algo.init(x0)

            def body(s, k):
                s, info = algo.step(k, s)
                return s, (s.position, info.acceptance_rate.mean())

            _, (xs, acc) = jax.lax.scan(body, state, jax.random.split(k1, burn + steps))
            xs = xs[burn:]
            return xs.mean((0, 1)), (xs**2).mean((0, 1)), acc[burn:].mean()

        keys = jax.random.split(jax.random.key(0), reps)
        m1, m2, acc = jax.jit(jax.vmap(one))(keys)
        return np.asarray(m1), np.asarray(m2), np.asarray(acc)


# h: a priori moderate steps in the frame's units (the warm-up's value on these
# targets is of this order); burn-in 200 steps from N(0, I) (these targets mix in tens
# of steps at these h), 600 kept steps per replicate.
@pytest.mark.parametrize(
    "name,estimator,h",
    [
        ("gaussian", "quadratic", 0.8),
        ("gaussian", "local_linear", 0.3),
        ("banana", "quadratic", 0.5),
        ("banana", "local_linear", 0.3),
        ("skew_funnel", "quadratic", 0.5),
    ],
)
def test_moments_match_exact_values(name, estimator, h):
    logdensity_fn, mean, var, d = TARGETS[name]
    m1, m2, acc = replicate_moments(
        logdensity_fn, d, estimator, h=h, burn=200, steps=600
    )
    r = m1.shape[0]
    z_mean = (m1.mean(0) - mean) / (m1.std(0, ddof=1) / math.sqrt(r))
    second = var + mean**2
    z_second = (m2.mean(0) - second) / (m2.std(0, ddof=1) / math.sqrt(r))
    assert np.all(np.abs(z_mean) < Z_MAX), (name, estimator, z_mean)
    assert np.all(np.abs(z_second) < Z_MAX), (name, estimator, z_second)
    assert acc.mean() > 0.2, acc.mean()  # the estimate is useful, not only exact


# ------------------------------------------------------- one step from π^{⊗N}


def log_gamma_target(x):  # d = 1: x = log G, G ~ Gamma(3, 1)
    return A_SKEW * x[0] - jnp.exp(x[0])


def one_step_from_pi(step, reps, key):
    """``reps`` independent ensembles of N = 4 exact draws of π, one step each."""
    k0, k1 = jax.random.split(key)
    x0 = jnp.log(jax.random.gamma(k0, A_SKEW, (reps, 4, 1), jnp.float64))
    return jax.jit(jax.vmap(step))(jax.random.split(k1, reps), x0)


def transition_z_scores(x):
    """z-scores of each particle's mean, 2nd and 3rd central moments, and of
    ``E[(x_A - μ)(x_B - μ)] = 0``, against the exact log-gamma values."""
    reps = x.shape[0]
    x = np.asarray(x)[..., 0]  # (reps, 4)
    c = x - PSI_3
    stats = {
        "mean": (x, PSI_3),
        "var": (c**2, PSI1_3),
        "third": (c**3, PSI2_3),
        "cross": (c[:, :1] * c[:, 2:3], 0.0),
    }
    return {
        k: (s.mean(0) - exact) / (s.std(0, ddof=1) / math.sqrt(reps))
        for k, (s, exact) in stats.items()
    }


@pytest.mark.parametrize("estimator", ["quadratic", "local_linear"])
def test_one_step_from_pi_stays_pi(estimator):
    # d = 1, N = 4 (halves of 2): both half-moves from exact draws of π; after the step
    # every particle and the pair (A, B) must still be distributed as π ⊗ π. h = 1 is a
    # large step (the drift matters), 200,000 replicas: a wrong reverse density or a
    # drift that reads its own half moves these moments by many standard errors
    # (the unadjusted move below, by more than 10).
    with jax.enable_x64(True):
        algo = ensemble_mala(log_gamma_target, 1.0, estimator=estimator)

        def step(k, x):
            state, info = algo.step(k, algo.init(x))
            return state.position, info.acceptance_rate.mean()

        x, acc = one_step_from_pi(step, 200_000, jax.random.key(1))
    z = transition_z_scores(x)
    for k, v in z.items():
        assert np.all(np.abs(v) < Z_MAX), (estimator, k, v)
    assert 0.05 < float(acc.mean()) < 0.99  # proposals move and are sometimes refused


def test_one_step_test_detects_the_unadjusted_move():
    # The same statistic on the same replicas, with the MH test removed (always accept
    # the proposal, A's drift from B's estimate): the power check of the test above.
    h = 1.0
    with jax.enable_x64(True):

        def step(k, x):
            lp = jax.vmap(log_gamma_target)(x)
            a, b = x[:2], x[2:]
            g = ensemble_gradient(b, lp[2:], a, lp[:2])
            var = jnp.var(b[:, 0], ddof=1)
            noise = jax.random.normal(k, a.shape, a.dtype)
            a_new = a + h * var * g + jnp.sqrt(2 * h * var) * noise
            return jnp.concatenate([a_new, b]), jnp.zeros(())

        x, _ = one_step_from_pi(step, 200_000, jax.random.key(1))
    z = transition_z_scores(x)
    worst = max(float(np.max(np.abs(v[:2]))) for k, v in z.items() if k != "cross")
    assert worst > 10 * Z_MAX / 4.5, z  # detected by far, not at the margin


# --------------------------------------------------------------- the estimate


def test_quadratic_estimate_is_exact_for_a_gaussian():
    # a quadratic log density is fitted exactly by the quadratic (ridge 0, N/2 = 12 >=
    # 1 + 3 + 6 = 10 points): the gradient to float64 rounding of the normal equations
    with jax.enable_x64(True):
        x = jax.random.normal(jax.random.key(2), (12, 3), jnp.float64)
        pts = jax.random.normal(jax.random.key(3), (5, 3), jnp.float64) * 2
        lb, lp = jax.vmap(gaussian)(x), jax.vmap(gaussian)(pts)
        g = ensemble_gradient(x, lb, pts, lp, ridge=0.0)
        g_plain = ensemble_gradient(x, lb, pts, lp, ridge=0.0, precondition=False)
    exact = -np.asarray(pts) @ PREC
    np.testing.assert_allclose(np.asarray(g), exact, atol=1e-8)
    np.testing.assert_allclose(np.asarray(g_plain), exact, atol=1e-8)


# ------------------------------------------------------------- determinism


@jax.enable_x64(True)
def test_same_key_same_draws_and_another_key_other_draws():
    # float64: jitted and eager steps round differently, and the fit's normal
    # equations on 4 points amplify that; in float32 the two differed by 7.9e-4 on an
    # AVX2 host (and passed 1e-5 on another), in float64 by 4.7e-13
    algo = ensemble_mala(banana, 0.5)
    state = algo.init(jax.random.normal(jax.random.key(4), (8, 2), jnp.float64))
    step = jax.jit(algo.step)
    a, ia = step(jax.random.key(5), state)
    b, ib = step(jax.random.key(5), state)
    c, _ = algo.step(jax.random.key(5), state)  # not jitted: the same draws
    np.testing.assert_array_equal(np.asarray(a.position), np.asarray(b.position))
    np.testing.assert_array_equal(
        np.asarray(ia.acceptance_rate), np.asarray(ib.acceptance_rate)
    )
    # float64 rounding amplified by the fits' conditioning (up to ~1e3)
    np.testing.assert_allclose(
        np.asarray(a.position), np.asarray(c.position), rtol=1e-9, atol=1e-10
    )
    d, _ = step(jax.random.key(6), state)
    assert not np.array_equal(np.asarray(a.position), np.asarray(d.position))


@pytest.mark.parametrize("estimator", ["quadratic", "local_linear"])
def test_dtype_is_preserved(estimator):
    with jax.enable_x64(True):
        for dtype in (jnp.float32, jnp.float64):
            algo = ensemble_mala(banana, 0.5, estimator=estimator)
            state = algo.init(jnp.arange(16.0).reshape(8, 2).astype(dtype) ** 0.5)
            state, info = algo.step(jax.random.key(7), state)
            assert state.position.dtype == dtype
            assert state.logdensity.dtype == dtype
            assert info.acceptance_rate.dtype == dtype
            w_state, h, _ = ensemble_mala_warmup(
                jax.random.key(8), state.position, banana, num_steps=4
            )
            assert w_state.position.dtype == dtype and h.dtype == dtype


# ------------------------------------------------------------- model calls


def test_one_model_evaluation_per_particle_per_half_step():
    calls = {"points": 0, "calls": 0}

    def numpy_banana(x):
        x = np.asarray(x)
        calls["points"] += int(np.prod(x.shape[:-1]))
        calls["calls"] += 1
        return (
            -0.5 * x[..., 0] ** 2 - 0.5 * (x[..., 1] - 0.5 * x[..., 0] ** 2) ** 2
        ).astype(x.dtype)

    def black_box(x):
        return jax.pure_callback(
            numpy_banana,
            jax.ShapeDtypeStruct(x.shape[:-1], x.dtype),
            x,
            vmap_method="expand_dims",
        )

    n, steps = 10, 7
    algo = ensemble_mala(black_box, 0.5)
    state = algo.init(jax.random.normal(jax.random.key(9), (n, 2)))
    assert calls == {"points": n, "calls": 1}
    step = jax.jit(algo.step)
    for t in range(steps):
        state, info = step(jax.random.key(10 + t), state)
        assert int(info.model_evals) == n
    jax.block_until_ready(state)
    # one batched call of N/2 points per half-step
    assert calls == {"points": n * (1 + steps), "calls": 1 + 2 * steps}


# ------------------------------------------------------------- the driver


@jax.enable_x64(True)
@pytest.mark.parametrize(
    "dtype, n", [(jnp.float32, 12), (jnp.float64, 8)], ids=["float32-N12", "float64-N8"]
)
def test_runs_under_sample_and_grad_through_it_is_the_pathwise_derivative(dtype, n):
    # log π(x) = -|x - μ|²/2 and the start x0 + μ: the sampler is translation
    # equivariant (frame mean shifts by μ; frame coordinates, values, drifts and the
    # accept decisions do not change), so the pathwise derivative (noise and decisions
    # held) of each coordinate's streamed mean is exactly 1, and of their sum d = 2.
    # Reverse mode sums cotangents that cancel only in exact arithmetic, each scaled by
    # the fits' sensitivity to B's points. N = 12 is the smallest ensemble whose
    # halves determine the quadratic (6 points, 1 + d + d(d+1)/2 = 6 coefficients):
    # float32 then measured 2 - 6e-5. With N = 8 (4 points) the fit is the ridge's
    # interpolant, its sensitivity is huge, and float32 gave 768 on an AVX2 host
    # (forward mode 2.0; docstring "Differentiation"); float64 still gives 2.0 there.
    # Tolerance 1e-3: 16x the float32 error measured at N = 12, and far from the
    # wrong answers this tells apart (derivatives cut at the fit: 1 or 0).
    x0 = jax.random.normal(jax.random.key(11), (n, 2), dtype)
    key = jax.random.key(12)

    def run(mu):
        def f(x):
            return -0.5 * jnp.sum((x - mu) ** 2)

        algo = ensemble_mala(f, 0.5)
        res = cj.sample(
            key,
            algo,
            algo.init(x0 + mu),
            20,
            mode="stream",
            info_reduce=None,
            check_convergence=False,
        )
        return jnp.sum(res.moments.mean), res.info.is_accepted

    g = jax.grad(lambda mu: run(mu)[0])(jnp.asarray(0.3, dtype))
    _, accepted = run(jnp.asarray(0.3, dtype))
    assert g.dtype == dtype
    assert 0 < float(np.mean(np.asarray(accepted))) < 1  # decisions were made
    assert abs(float(g) - 2.0) < 1e-3, float(g)


def test_info_declares_a_metropolis_sampler():
    assert EnsembleMALAInfo.may_stay is True
    assert any(f.field == "zero_acceptance" for f in EnsembleMALAInfo.run_flags)


# ------------------------------------------------------------- the warm-up


def test_warmup_reaches_the_target_acceptance():
    # on the Gaussian the acceptance falls with h continuously; 300 steps of
    # Robbins-Monro on log h bring the mean acceptance of the last 100 steps (N = 24,
    # ~2,400 particle-steps: sd of the mean ~0.01) within 0.1 of the target
    state, h, infos = ensemble_mala_warmup(
        jax.random.key(13),
        jax.random.normal(jax.random.key(14), (24, 3)),
        gaussian,
        num_steps=300,
    )
    assert isinstance(state, EnsembleMALAState)
    assert float(h) > 0
    assert abs(float(np.mean(np.asarray(infos.acceptance_rate)[-100:])) - 0.6) < 0.1


# ------------------------------------------------------------- bad arguments


def lp(x):
    return -0.5 * jnp.sum(x**2)


@pytest.mark.parametrize(
    "kwargs,name",
    [
        (dict(step_size=0.0), "step_size"),
        (dict(step_size=-1.0), "step_size"),
        (dict(step_size=float("nan")), "step_size"),
        (dict(step_size=lambda t: 0.1), "step_size"),
        (dict(estimator="paper"), "estimator"),
        (dict(precondition="yes"), "precondition"),
        (dict(ridge=-1.0), "ridge"),
        (dict(bandwidth=0.0), "bandwidth"),
        (dict(logdensity_fn=3.0), "logdensity_fn"),
    ],
)
def test_bad_constructor_arguments_raise(kwargs, name):
    args = dict(logdensity_fn=lp, step_size=0.5) | kwargs
    with pytest.raises(ValueError, match=name):
        ensemble_mala(**args)


@pytest.mark.parametrize(
    "positions,match",
    [
        (np.zeros((7, 2)), "even"),  # odd N
        (np.zeros((4, 2)), "N >= 2"),  # N/2 = 2 < d + 1 = 3
        (np.zeros(6), "positions"),  # not (N, d)
        (np.full((6, 2), np.nan), "positions"),
    ],
)
def test_bad_positions_raise(positions, match):
    with pytest.raises(ValueError, match=match):
        ensemble_mala(lp, 0.5).init(positions)


def test_bad_state_key_logdensity_and_warmup_arguments_raise():
    algo = ensemble_mala(lp, 0.5)
    state = algo.init(np.ones((6, 2)) * np.arange(6.0)[:, None])
    with pytest.raises(ValueError, match="state"):
        algo.step(jax.random.key(0), (state.position, state.logdensity))
    with pytest.raises(ValueError, match="rng_key"):
        algo.step(0, state)
    with pytest.raises(ValueError, match="logdensity_fn"):
        ensemble_mala(lambda x: -jnp.inf * jnp.sum(x**2), 0.5).init(np.ones((6, 2)))
    with pytest.raises(ValueError, match="logdensity_fn"):
        ensemble_mala(lambda x: x, 0.5).init(np.ones((6, 2)))  # not a scalar
    with pytest.raises(ValueError, match="target_acceptance"):
        ensemble_mala_warmup(
            jax.random.key(0), state.position, lp, num_steps=4, target_acceptance=1.5
        )
    with pytest.raises(ValueError, match="num_steps"):
        ensemble_mala_warmup(jax.random.key(0), state.position, lp, num_steps=1)
    with pytest.raises(ValueError, match="step_size"):
        ensemble_mala_step(jax.random.key(0), state, lp, 0.0)
