"""The start of ``cj.langevin_warmup``: the Laplace approximation, or the given
positions where its "mode" is a spike that says nothing of the posterior (issue 48)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cenlmc_jax as cj


@pytest.fixture(autouse=True)
def _x64():
    with jax.enable_x64(True):
        yield


def _centred_funnel(x):
    # Neal's funnel, centred, d = 10: v ~ N(0, 3²), x_i | v ~ N(0, e^v); the joint
    # density's maximum is the neck, v = −40.5 with x = 0
    v, th = x[0], x[1:]
    return -0.5 * v**2 / 9.0 + jnp.sum(-0.5 * th**2 * jnp.exp(-v) - 0.5 * v)


# the warm-ups here are 20 steps, too short for the kinetic phase to settle: the tests
# are about the start
@pytest.mark.filterwarnings("ignore:langevin_warmup. the kinetic phase did not settle")
def test_a_funnels_neck_is_not_taken_for_the_laplace_start():
    """Issue 48: on the centred funnel the mode search ends at the neck (v = −40.5,
    H's condition number above 10¹⁵), and a Laplace start there kept every chain at
    v < −39 (measured before the check: v's 5-95% range −40.7 to −40.0 after a
    300-step warm-up). The warm-up now starts from the given positions, with their
    variances as M₀, and says why. After its steps the ensemble's v is nowhere near
    the neck: the starts are in [−2, 2], v's posterior is N(0, 3²), and a median
    below −10 would be 3.3 posterior sds off."""
    x0 = jax.random.uniform(jax.random.key(0), (64, 10), jnp.float64, -2.0, 2.0)
    wu = cj.langevin_warmup(jax.random.key(1), _centred_funnel, x0, num_steps=20)
    reasoning = wu.info.reasoning
    assert wu.info.start == "positions", reasoning
    assert "not the Laplace approximation" in reasoning, reasoning
    assert "funnel's neck" in reasoning and "condition number" in reasoning
    assert "M₀ = the given positions' variances" in reasoning
    assert np.median(np.asarray(wu.positions[:, 0])) > -10.0


@pytest.mark.filterwarnings("ignore:langevin_warmup. the kinetic phase did not settle")
def test_a_gaussian_still_gets_the_laplace_start():
    """A correlated Gaussian (d = 10, condition number 10⁴): its mode and Hessian are
    the posterior's, the given positions' log densities fit the quadratic exactly (the
    mismatch the check measures is 1 for a Gaussian, to rounding), and the warm-up
    starts from the Laplace approximation."""
    d = 10
    rng = np.random.default_rng(0)
    q, _ = np.linalg.qr(rng.normal(size=(d, d)))
    prec = jnp.asarray(q @ np.diag(np.logspace(0, 4, d)) @ q.T)
    mu = jnp.asarray(rng.normal(size=d))

    def logp(x):
        return -0.5 * (x - mu) @ prec @ (x - mu)

    x0 = jax.random.uniform(jax.random.key(0), (64, d), jnp.float64, -2.0, 2.0)
    wu = cj.langevin_warmup(jax.random.key(1), logp, x0, num_steps=20)
    reasoning = wu.info.reasoning
    assert wu.info.start == "laplace", reasoning
    assert "start: Laplace at the mode found by Newton's method" in reasoning
    # the positions lie farther from the mode than d/2 nats below it, so the ratio is
    # the Gaussian's exact 1 (printed to 3 digits)
    assert "log densities fit it within 1x" in reasoning, reasoning


def _banana(x):
    # Inference Gym's banana: x0 ~ N(0, 10²), x1 | x0 ~ N(0.03 (x0² − 100), 1)
    return -0.5 * x[0] ** 2 / 100.0 - 0.5 * (x[1] - 0.03 * (x[0] ** 2 - 100.0)) ** 2


@pytest.mark.filterwarnings("ignore:langevin_warmup. the kinetic phase did not settle")
def test_laplace_draws_far_below_the_mode_start_from_the_given_positions(monkeypatch):
    """The depth test (off by default: start.LAPLACE_MAX_DEPTH says why). The banana's
    Laplace approximation at its mode (0, −3) is N((0, −3), diag(100, 1)); its draws
    with |x0| large fall far off the curved ridge, tens of nats below the
    quadratic's value, so their mean depth E[f(x) − f*] is about 13 times a
    Gaussian's d/2 (bench_start_depth.py: 13.4 over 1,024 draws). With the test set
    at 3 the warm-up starts from the given positions, says why, and counts the mode
    search's passes all the same (before, a refused start counted them as 0); by
    default it keeps the Laplace start."""
    x0 = jax.random.uniform(jax.random.key(0), (64, 2), jnp.float64, -2.0, 2.0)
    wu = cj.langevin_warmup(jax.random.key(1), _banana, x0, num_steps=20)
    assert wu.info.start == "laplace", wu.info.reasoning
    monkeypatch.setattr(cj.adaptation.start, "LAPLACE_MAX_DEPTH", 3.0)
    wu = cj.langevin_warmup(jax.random.key(1), _banana, x0, num_steps=20)
    reasoning = wu.info.reasoning
    assert wu.info.start == "positions", reasoning
    assert "deeper below the mode than a Gaussian's" in reasoning, reasoning
    assert "M₀ = the given positions' variances" in reasoning
    # Newton's passes, the Hessian and the depth's pass of values
    assert wu.info.lbfgs_steps >= 3, wu.info.lbfgs_steps
    assert wu.info.trajectory[0][0] == wu.info.lbfgs_steps + 1
    depth = float(reasoning.split("its draws lie ")[1].split("x deeper")[0])
    assert depth > 3.0, depth
