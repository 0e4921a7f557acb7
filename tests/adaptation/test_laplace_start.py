"""The start of ``cj.langevin_warmup``: the Laplace approximation, or the given
positions where its "mode" is a spike that says nothing of the posterior (issue 48)."""

import math

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
    nutpie's M₀, and says why. After its steps the ensemble's v is nowhere near
    the neck: the starts are in [−2, 2], v's posterior is N(0, 3²), and a median
    below −10 would be 3.3 posterior sds off."""
    x0 = jax.random.uniform(jax.random.key(0), (64, 10), jnp.float64, -2.0, 2.0)
    wu = cj.langevin_warmup(jax.random.key(1), _centred_funnel, x0, num_steps=20)
    reasoning = wu.info.reasoning
    assert wu.info.start == "positions", reasoning
    assert "not the Laplace approximation" in reasoning, reasoning
    assert "funnel's neck" in reasoning and "condition number" in reasoning
    assert "nutpie's diagonal" in reasoning
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
def test_a_laplace_start_with_the_lower_elbo_gives_way_to_the_given_positions(
    monkeypatch,
):
    """Pathfinder's criterion. The banana's Laplace approximation at its mode (0, −3)
    is N((0, −3), diag(100, 1)); its draws with |x0| large fall far off the curved
    ridge, tens of nats below the quadratic's value, so its ELBO is below that of the
    Uniform(-2, 2) starts (bench_start_depth.py: −8.2 against −1.8 over 1,024 draws).
    The warm-up starts from the given positions, says why, with nutpie's metric, and
    counts the mode search's passes all the same; with the test off
    (ELBO_MARGIN = inf) it keeps the Laplace start."""
    x0 = jax.random.uniform(jax.random.key(0), (64, 2), jnp.float64, -2.0, 2.0)
    wu = cj.langevin_warmup(jax.random.key(1), _banana, x0, num_steps=20)
    reasoning = wu.info.reasoning
    assert wu.info.start == "positions", reasoning
    assert "Pathfinder's criterion" in reasoning, reasoning
    assert "nutpie's diagonal" in reasoning, reasoning
    # Newton's passes, the Hessian, the ELBO's pass of values and the metric's
    # gradients
    assert wu.info.lbfgs_steps >= 4, wu.info.lbfgs_steps
    assert wu.info.trajectory[0][0] == wu.info.lbfgs_steps + 1
    laplace, given = (
        float(reasoning.split(" is ")[-2].split(",")[0]),
        float(reasoning.split("given positions' ")[-1].split(" ")[0]),
    )
    assert laplace < given, (laplace, given)
    monkeypatch.setattr(cj.adaptation.start, "ELBO_MARGIN", math.inf)
    wu = cj.langevin_warmup(jax.random.key(1), _banana, x0, num_steps=20)
    assert wu.info.start == "laplace", wu.info.reasoning


@pytest.mark.parametrize("scale", [1.0, 0.5])
def test_elbo_of_gaussian_draws_matches_its_closed_form(scale):
    """start._elbo against the exact ELBO of q = N(0, s² I) for π = N(0, I) (d = 6,
    normalised, so log Z = 0): −KL(q‖π) = −(d/2)(s² − 1 − log s²), 0 at s = 1 and
    −0.636 d/2 at s = 1/2. Tolerance: 5 standard errors of the mean of log π over
    the 4,096 draws (its sd is s² sqrt(d/2))."""
    d, n = 6, 4096
    z = scale * np.asarray(jax.random.normal(jax.random.key(7), (n, d)))
    values = -0.5 * np.sum(z**2, 1) - 0.5 * d * math.log(2 * math.pi)
    got = cj.adaptation.start._elbo(values, d * math.log(scale**2), d)
    exact = -0.5 * d * (scale**2 - 1 - math.log(scale**2))
    se = scale**2 * math.sqrt(d / 2) / math.sqrt(n)
    assert abs(got - exact) < 5 * se, (got, exact, se)


def test_the_positions_metric_is_a_gaussians_variance_wherever_the_positions_are():
    """nutpie's diagonal sqrt(Var[x] / Var[∂ log π]): for a Gaussian posterior the
    gradient is −(x − m)/σ², so the estimate is σ² exactly (up to Stan's
    regularisation n/(n + 5) S + 10⁻³ · 5/(n + 5)) from Uniform(-2, 2) positions,
    whose own variance is 4/3 in every coordinate."""
    sigma2 = np.array([100.0, 1.0, 0.01])

    def logp(x):
        return -0.5 * jnp.sum((x - 3.0) ** 2 / sigma2)

    n = 512
    x0 = jax.random.uniform(jax.random.key(0), (n, 3), jnp.float64, -2.0, 2.0)
    m, note = cj.adaptation.start._positions_metric(x0, logp, None, "auto", False)
    expected = n / (n + 5.0) * sigma2 + 1e-3 * 5.0 / (n + 5.0)
    np.testing.assert_allclose(m, expected, rtol=1e-9)
    assert "nutpie" in note
    dense, _ = cj.adaptation.start._positions_metric(x0, logp, None, "auto", True)
    np.testing.assert_allclose(dense, np.diag(expected), rtol=1e-9)
