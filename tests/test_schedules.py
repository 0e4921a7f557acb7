"""Step-size schedules ``t -> h_t`` in ``cj.lmc`` (new, issue 19: "schedules exist only
in the recipe family") and in ``cj.sgld`` / ``cj.sghmc``, against the exact law of the
chain on a Gaussian target.

With an exact gradient on ``π = N(μ, diag(σ²))`` (precision ``λ = 1/σ²``) each chain is
linear and Gaussian, so its mean and variance after every step follow closed recursions
in the varying ``h_t``:

* LMC and SGLD (``x' = x + h ∇log π(x) + sqrt(2h) ξ``): ``m' = (1 - h λ) m + h λ μ``,
  ``v' = (1 - h λ)² v + 2h``;
* SGHMC (``θ' = θ + h r``, ``r' = (1 - hC) r - h λ (θ - μ) + sqrt(2Ch) ξ``): with ``A =
  [[1, h], [-hλ, 1 - hC]]``, ``m' = A m + (0, hλμ)``, ``S' = A S Aᵀ + diag(0, 2Ch)``.

The empirical moments of many chains after every step are z-tested against them (the
draws are exactly
Gaussian: se of the mean ``sqrt(v/N)``, of the variance ``v sqrt(2/(N-1))``); the same
moments are also z-tested against the recursion at the constant ``h_0``, which they must
fail (a sampler that ignored the schedule would pass that one instead).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cenlmc_jax as cj

MU, VAR = np.array([1.0, -2.0]), np.array([1.0, 4.0])
LAM = 1.0 / VAR
N, T, C = 20_000, 20, 1.0  # chains, steps, SGHMC's friction
#: 80 z-scores per run (T steps x 2 coordinates x mean and variance): at 4.5 each
#: (two-sided p 6.8e-6), a false alarm somewhere has probability below 80 * 6.8e-6 =
#: 5.4e-4 (Bonferroni).
Z_MAX = 4.5


def schedule(t):
    return 0.4 / (
        1.0 + t / 4.0
    )  # 0.4 at t = 0, 0.07 at t = 19: a sixfold change over the run


def logdensity(x):
    return -0.5 * jnp.sum((x - MU) ** 2 * LAM)


def langevin_moments(hs):
    """(mean, variance) after each step, (T, d), of LMC/SGLD from x = 0."""
    m, v, out = np.zeros(2), np.zeros(2), []
    for h in hs:
        m, v = (1 - h * LAM) * m + h * LAM * MU, (1 - h * LAM) ** 2 * v + 2 * h
        out.append((m, v))
    return np.array([o[0] for o in out]), np.array([o[1] for o in out])


def sghmc_moments(hs):
    """(mean, variance) of θ after each step, (T, d), of SGHMC from θ = 0, r = 0 (per
    coordinate)."""
    means, variances = [], []
    for k in range(2):
        m, s, row_m, row_v = np.zeros(2), np.zeros((2, 2)), [], []
        for h in hs:
            a = np.array([[1.0, h], [-h * LAM[k], 1.0 - h * C]])
            m = a @ m + np.array([0.0, h * LAM[k] * MU[k]])
            s = a @ s @ a.T + np.diag([0.0, 2.0 * C * h])
            row_m.append(m[0])
            row_v.append(s[0, 0])
        means.append(row_m)
        variances.append(row_v)
    return np.array(means).T, np.array(variances).T


def max_z(draws, mean, var):
    """Largest |z| of the per-step sample means and variances of ``draws: (T, N, d)``
    (steps where the exact variance is 0 must have every draw at the exact mean)."""
    draws = np.asarray(draws, np.float64)
    xbar, s2 = draws.mean(axis=1), draws.var(axis=1, ddof=1)
    zero = var < 1e-12
    assert np.allclose(xbar[zero], mean[zero], atol=1e-5) and np.all(s2[zero] < 1e-10)
    v = np.where(zero, 1.0, var)
    z_mean = np.where(zero, 0.0, (xbar - mean) / np.sqrt(v / draws.shape[1]))
    z_var = np.where(zero, 0.0, (s2 - var) / (v * np.sqrt(2.0 / (draws.shape[1] - 1))))
    return float(max(np.abs(z_mean).max(), np.abs(z_var).max()))


def run(name, step_size):
    est = cj.gradients.grad_estimator_from_logdensity(logdensity)
    x0 = jnp.zeros((N, 2))
    if name == "lmc":
        algo = cj.lmc(logdensity, step_size)
    elif name == "sgld":
        algo = cj.vmap_chains(cj.sgld(est, step_size))
    else:
        algo = cj.vmap_chains(cj.sghmc(est, step_size, friction=C))
    state = algo.init(x0)  # SGHMC without a key: r = 0
    res = cj.sample(jax.random.key(7), algo, state, T, check_convergence=False)
    return res


@pytest.mark.parametrize("name", ["lmc", "sgld", "sghmc"])
def test_a_schedule_gives_the_exact_moment_recursion(name):
    hs = np.array([schedule(t) for t in range(T)])
    exact = sghmc_moments if name == "sghmc" else langevin_moments
    res = run(name, schedule)
    assert res.diverged_at == -1 and int(np.max(np.asarray(res.state.step))) == T
    assert max_z(res.trace, *exact(hs)) < Z_MAX
    # the same draws against the constant step size h_0: far off (the test sees the
    # schedule)
    assert max_z(res.trace, *exact(np.full(T, hs[0]))) > 10 * Z_MAX


def test_lmc_with_a_constant_schedule_is_lmc_with_the_number_bit_for_bit():
    a = run("lmc", lambda t: 0.25)
    b = run("lmc", 0.25)
    np.testing.assert_array_equal(np.asarray(a.trace), np.asarray(b.trace))


def test_lmc_schedule_float64_in_float64_out():
    with jax.enable_x64(
        True
    ):  # a log density of its own: no float32 constant from the module's (MU, LAM)
        algo = cj.lmc(lambda x: -0.5 * jnp.sum(x**2), lambda t: 0.1 / (1.0 + t))
        state, info = jax.jit(algo.step)(
            jax.random.key(0), algo.init(jnp.zeros((4, 2), jnp.float64))
        )
        assert (
            state.position.dtype == jnp.float64
            and int(state.step) == 1
            and not bool(info.diverged)
        )


@pytest.mark.parametrize(
    "bad, match",
    [
        (lambda t: 0.0 * t, r"step_size\(0\)"),  # 0 at the first step
        (lambda t: jnp.full(2, 0.1), "step_size"),  # not a scalar
        (-0.1, "step_size"),
    ],
)
def test_lmc_refuses_a_bad_schedule_by_name(bad, match):
    with pytest.raises(ValueError, match=match):
        cj.lmc(logdensity, bad)
    state = cj.ensemble.lmc_init(jnp.zeros((4, 2)), logdensity)
    with pytest.raises(ValueError, match=match):
        cj.ensemble.lmc_step(jax.random.key(0), state, logdensity, bad)


def test_jax_grad_through_cj_sample_with_an_lmc_schedule_is_the_central_difference():
    """The pathwise derivative of a run's last draws in the schedule's scale ``h0``
    (same key, so the same noise) against a central difference: the LMC map is smooth in
    ``h0``, so they agree to O(e²) + rounding."""
    with jax.enable_x64(True):

        def loss(h0):
            algo = cj.lmc(lambda x: -0.5 * jnp.sum(x**2), lambda t: h0 / (1.0 + t))
            res = cj.sample(
                jax.random.key(0),
                algo,
                algo.init(jnp.ones((3, 2))),
                5,
                check_convergence=False,
            )
            return jnp.sum(res.trace[-1])

        e = 1e-6
        fd = (loss(0.1 + e) - loss(0.1 - e)) / (2 * e)
        np.testing.assert_allclose(float(jax.grad(loss)(0.1)), float(fd), rtol=1e-7)


@pytest.mark.parametrize("name", ["sgld", "sghmc", "sgrhmc"])
def test_a_schedule_that_reaches_zero_is_a_divergence(name):
    # issue 28: SGLD's schedule reaching 0 froze the chain silently
    logdensity = lambda x: -0.5 * jnp.sum(x**2)
    est = cj.gradients.grad_estimator_from_logdensity(logdensity)
    schedule = lambda t: 0.02 * (5 - t)  # exactly 0 at t = 5
    make = {
        "sgld": lambda: cj.sgld(est, schedule),
        "sghmc": lambda: cj.sghmc(est, schedule),
        "sgrhmc": lambda: cj.sgrhmc(
            est, schedule, cj.sgmcmc.gsgrhmc_inv_metric(lambda t: 0.5 * jnp.sum(t**2))
        ),
    }[name]
    algo = make()
    state = algo.init(jnp.zeros(2), jax.random.key(0))
    with pytest.warns(RuntimeWarning, match="diverged"):
        res = cj.sample(jax.random.key(1), algo, state, 10, check_convergence=False)
    assert res.diverged_at == 5
