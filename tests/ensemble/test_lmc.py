"""Tests of lmc_init / lmc_step (docs/algorithms.md §1) against exact formulas."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cenlmc_jax as cj
from cenlmc_jax.models import targets

# |z| below this is accepted: for a correct sampler z ~ N(0, 1), so a false
# alarm has probability 6e-5 per check.
Z_MAX = 4.0


def _per_particle_means(trace, fn):
    """Time average of fn(x) for each particle: (N, ...). Particles are independent
    chains, so these N averages are i.i.d. and their sample sd / sqrt(N) is an
    exact standard error of the grand mean, with no autocorrelation estimate."""
    return np.asarray(fn(trace)).mean(axis=0)


def _run_lmc(
    target, step_size, key, n=2000, steps=2000, burn_in=300, thin=2, dtype=jnp.float32
):
    x0 = jax.random.normal(jax.random.key(100), (n, target.dim), dtype=dtype)
    state = cj.ensemble.lmc_init(x0, target.logdensity_fn)
    step = functools.partial(
        cj.ensemble.lmc_step, logdensity_fn=target.logdensity_fn, step_size=step_size
    )
    return cj.sample(key, step, state, steps, thin=thin, burn_in=burn_in)


@pytest.mark.parametrize("h", [0.05, 0.2])
def test_lmc_stationary_variance_is_the_exact_ula_variance(h):
    """ULA on f = x²/2 has stationary variance 1/(1 - h/2) per coordinate."""
    res = _run_lmc(targets.standard_gaussian(2), h, jax.random.key(0))
    per = _per_particle_means(
        res.trace, lambda t: t**2
    )  # (N, d), mean 0 is known exactly
    est, se = per.mean(axis=0), per.std(axis=0, ddof=1) / np.sqrt(per.shape[0])
    exact = 1.0 / (1.0 - h / 2.0)
    assert np.all(np.abs(est - exact) / se < Z_MAX), (est, exact, se)
    if h == 0.2:
        # the bias 1/(1-0.1) - 1 = 0.111 must be visible: many MCSEs away from 1
        assert np.all((est - 1.0) / se > 10.0), (est, se)


def test_lmc_mean_and_covariance_on_correlated_gaussian():
    """ULA on N(0, Σ) has stationary covariance (P (I - hP/2))^{-1}, P = Σ^{-1}:
    z-test of every mean and covariance entry against it."""
    h = 0.1
    tgt = targets.correlated_gaussian(3, 0.6)
    res = _run_lmc(tgt, h, jax.random.key(1), n=2000, steps=2000, burn_in=300, thin=4)
    P = np.linalg.inv(tgt.cov)
    sigma_h = np.linalg.inv(P @ (np.eye(3) - h * P / 2))
    trace = np.asarray(res.trace, np.float64)
    m = _per_particle_means(trace, lambda t: t)
    z_mean = m.mean(axis=0) / (m.std(axis=0, ddof=1) / np.sqrt(m.shape[0]))
    assert np.all(np.abs(z_mean) < Z_MAX), z_mean
    c = _per_particle_means(
        trace, lambda t: t[..., :, None] * t[..., None, :]
    )  # mean is 0 exactly
    z_cov = (c.mean(axis=0) - sigma_h) / (c.std(axis=0, ddof=1) / np.sqrt(c.shape[0]))
    assert np.all(np.abs(z_cov) < Z_MAX), z_cov
    # ...and the exact ULA covariance differs from Σ by more than the test resolves
    assert np.max(np.abs(sigma_h - tgt.cov)) > 5 * np.max(
        c.std(axis=0, ddof=1) / np.sqrt(c.shape[0])
    )


def test_same_key_same_samples_and_typed_and_legacy_keys():
    tgt = targets.standard_gaussian(2)
    x0 = jax.random.normal(jax.random.key(3), (50, 2))
    state = cj.ensemble.lmc_init(x0, tgt.logdensity_fn)
    a, _ = cj.ensemble.lmc_step(jax.random.key(7), state, tgt.logdensity_fn, 0.1)
    b, _ = cj.ensemble.lmc_step(jax.random.key(7), state, tgt.logdensity_fn, 0.1)
    c, _ = cj.ensemble.lmc_step(jax.random.PRNGKey(7), state, tgt.logdensity_fn, 0.1)
    np.testing.assert_array_equal(a.position, b.position)
    # a legacy PRNGKey(7) and a typed key(7) hold the same bits: same samples
    np.testing.assert_array_equal(a.position, c.position)


def test_jit_and_no_jit_agree():
    tgt = targets.correlated_gaussian(2, 0.5)
    x0 = jax.random.normal(jax.random.key(3), (64, 2))
    state = cj.ensemble.lmc_init(x0, tgt.logdensity_fn)
    eager, info_e = cj.ensemble.lmc_step(
        jax.random.key(1), state, tgt.logdensity_fn, 0.1
    )
    jitted, info_j = jax.jit(cj.ensemble.lmc_step, static_argnums=(2,))(
        jax.random.key(1), state, tgt.logdensity_fn, 0.1
    )
    # same operations, possibly fused differently by XLA: float32 rounding only
    np.testing.assert_allclose(eager.position, jitted.position, rtol=1e-6, atol=1e-6)
    assert int(info_e.grad_evals) == int(info_j.grad_evals) == 64


def test_float64_in_float64_out():
    with jax.enable_x64(True):
        tgt = targets.standard_gaussian(3)
        x0 = jnp.zeros((10, 3), jnp.float64)
        state = cj.ensemble.lmc_init(x0, tgt.logdensity_fn)
        new, _ = cj.ensemble.lmc_step(jax.random.key(0), state, tgt.logdensity_fn, 0.1)
        assert new.position.dtype == jnp.float64
        assert new.logdensity.dtype == jnp.float64
        step = functools.partial(
            cj.ensemble.lmc_step, logdensity_fn=tgt.logdensity_fn, step_size=0.1
        )
        res = cj.sample(jax.random.key(0), step, state, 4, mode="stream")
        assert (
            res.state.position.dtype == jnp.float64
            and res.moments.mean.dtype == jnp.float64
        )


def test_info_reports_divergence():
    """h = 5 on f = x²/2 multiplies x by (1 - h) = -4 each step: overflow to inf."""
    tgt = targets.standard_gaussian(1)
    state = cj.ensemble.lmc_init(jnp.ones((8, 1)), tgt.logdensity_fn)
    step = functools.partial(
        cj.ensemble.lmc_step, logdensity_fn=tgt.logdensity_fn, step_size=5.0
    )
    with pytest.warns(RuntimeWarning, match="diverged"):
        res = cj.sample(jax.random.key(0), step, state, 200, chunk_size=50)
    assert 0 < res.diverged_at < 200
    assert res.num_steps_done < 200  # stopped at the end of the chunk that diverged
    assert bool(res.info.diverged[res.diverged_at]) and not bool(res.info.diverged[0])


@pytest.mark.parametrize(
    "positions, match",
    [
        (np.zeros(5), "shape \\(N, d\\)"),
        (np.zeros((2, 3, 4)), "shape \\(N, d\\)"),
        (np.array([[0.0, np.nan]]), "finite"),
        (np.array([[np.inf, 0.0]]), "finite"),
    ],
)
def test_bad_positions_raise(positions, match):
    with pytest.raises(ValueError, match=match):
        cj.ensemble.lmc_init(
            positions, targets.standard_gaussian(positions.shape[-1]).logdensity_fn
        )


def test_non_scalar_logdensity_raises():
    with pytest.raises(ValueError, match="logdensity_fn must return a scalar"):
        cj.ensemble.lmc_init(np.zeros((4, 2)), lambda x: x**2)


@pytest.mark.parametrize("h", [0.0, -0.1, float("nan"), float("inf")])
def test_bad_step_size_raises(h):
    tgt = targets.standard_gaussian(2)
    state = cj.ensemble.lmc_init(np.zeros((4, 2)), tgt.logdensity_fn)
    with pytest.raises(ValueError, match="step_size"):
        cj.ensemble.lmc_step(jax.random.key(0), state, tgt.logdensity_fn, h)


def test_a_rebuilt_lmc_shares_its_step_and_compiled_run():
    # the same parameters give the same step function (_steps.bound_step): cj.sample
    # keeps one compiled chunk per step function, so the second run compiles nothing
    from cenlmc_jax import run as run_mod

    logp = lambda x: -0.5 * jnp.sum(x**2)  # noqa: E731
    a, b = cj.lmc(logp, 0.1), cj.lmc(logp, 0.1)
    assert a.step is b.step and cj.lmc(logp, 0.2).step is not a.step
    x0 = jnp.zeros((8, 2))
    cj.sample(jax.random.key(0), a, a.init(x0), 5, check_convergence=False)
    before = run_mod._chunk_fn.cache_info()
    cj.sample(jax.random.key(0), b, b.init(x0), 5, check_convergence=False)
    assert run_mod._chunk_fn.cache_info().misses == before.misses
