"""Tests of cenlmc_jax.adaptation.newton: the Laplace start's mode search."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cenlmc_jax.adaptation import newton
from cenlmc_jax.adaptation.newton import newton_modes


@pytest.fixture(autouse=True)
def _x64():
    with jax.enable_x64(True):
        yield


def test_one_newton_step_lands_on_a_gaussians_mode():
    """On a quadratic ``f`` the full Newton step is exact: from any start the loop
    moves once and is then done: two sequential passes (the derivatives at the starts
    and at the mode), whatever the condition number (10⁴ here, rotated)."""
    d = 30
    rng = np.random.default_rng(0)
    q, _ = np.linalg.qr(rng.normal(size=(d, d)))
    prec = jnp.asarray(q @ np.diag(np.logspace(0, 4, d)) @ q.T)
    mu = jnp.asarray(rng.normal(size=d))

    def logp(x):
        return -0.5 * (x - mu) @ prec @ (x - mu)

    starts = jnp.asarray(rng.uniform(-5, 5, size=(3, d)))
    r = newton_modes(logp, starts, tol=0.01)
    assert int(r.num_steps) == 2
    assert bool(np.all(r.converged))
    # rounding of a solve with condition 10⁴ in float64: ~1e-12 relative
    np.testing.assert_allclose(np.asarray(r.position), np.tile(mu, (3, 1)), atol=1e-8)


def _logistic():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(200, 5))
    y = (x @ np.array([1.0, -2.0, 0.5, 0.0, 3.0]) + rng.normal(size=200) > 0) * 1.0
    x, y = jnp.asarray(x), jnp.asarray(y)

    def logp(b):
        z = x @ b
        return jnp.sum(y * z - jnp.logaddexp(0.0, z)) - 0.5 * b @ b / 25.0

    return logp


def test_logistic_regression_mode_matches_a_tight_reference_in_few_iterations():
    """A log-concave posterior: the mode where the gradient is zero to rounding
    (the reference: 100 undamped Newton steps from the origin, quadratic convergence
    to |∇f| < 1e-12) is reached within 0.1 posterior sd (the stopping rule,
    gᵀH⁻¹g <= 0.01), in at most 40 sequential passes from starts 10 prior sds out (24
    seen: far out the log-likelihood is nearly linear and the full steps fail Armijo;
    a damped iteration costs one pass where a step of 1/2 to 1/8 passes, three where
    a shorter one is needed)."""
    logp = _logistic()
    grad = jax.grad(logp)
    hess = jax.hessian(logp)
    ref = jnp.zeros(5)
    for _ in range(100):
        ref = ref - jnp.linalg.solve(hess(ref), grad(ref))
    assert float(jnp.linalg.norm(grad(ref))) < 1e-12
    starts = jnp.asarray(np.random.default_rng(2).uniform(-50, 50, size=(4, 5)))
    r = newton_modes(logp, starts, tol=0.01)
    assert bool(np.all(r.converged))
    assert int(r.num_steps) <= 40
    sd = jnp.sqrt(jnp.diag(jnp.linalg.inv(-hess(ref))))
    assert float(jnp.max(jnp.abs(r.position - ref) / sd)) < 0.1


def test_a_start_at_a_saddle_point_descends_to_a_mode():
    """Saddle-free Newton (|λ|): at a non-stationary point near the saddle of a
    double well, plain Newton would step towards the saddle; the |λ| step is a
    descent direction, and the line search makes it move to one of the wells
    (x₀ = ±1)."""

    def logp(x):
        return -((x[0] ** 2 - 1.0) ** 2) - 0.5 * x[1] ** 2

    r = newton_modes(logp, jnp.asarray([[0.05, 0.3]]), tol=1e-6)
    assert bool(r.converged[0])
    np.testing.assert_allclose(np.abs(np.asarray(r.position[0])), [1.0, 0.0], atol=1e-3)


def test_a_density_without_a_mode_is_not_converged():
    """A centred funnel (log τ = v, θ | v ~ N(0, e^v)) without v's prior has no mode:
    the density grows without bound as v → −∞ with θ = 0. Newton's method must not
    call any point there a mode (the caller then falls back to L-BFGS and, failing
    that, to the given positions)."""

    def logp(x):
        v, theta = x[0], x[1:]
        return jnp.sum(-0.5 * theta**2 * jnp.exp(-v) - 0.5 * v)

    starts = jnp.asarray(np.random.default_rng(3).normal(size=(2, 4)))
    r = newton_modes(logp, starts, tol=0.01, max_steps=30)
    assert not bool(np.any(r.converged))


def test_probes_stop_with_the_main_search():
    """The loop ends when the first start is done and the probes have had
    ``probe_steps`` iterations: a probe in a modeless region does not hold the main
    search's result for ``max_steps``."""

    def logp(x):
        # a Gaussian well at 0 for x₀ < 5; beyond it a linear slope with no mode
        return jnp.where(x[0] < 5.0, -0.5 * x @ x, x[0] - 17.5 - 0.5 * x[1] ** 2)

    starts = jnp.asarray([[0.5, 0.5], [8.0, 0.0]])
    r = newton_modes(logp, starts, tol=0.01, max_steps=50, probe_steps=6)
    assert bool(r.converged[0]) and not bool(r.converged[1])
    # the loop's passes: one at the starts, then one per iteration (every full step
    # of the probe decreases f along the slope: no line search), 6 iterations
    assert int(r.num_steps) == 1 + 6


def test_a_halved_step_costs_one_pass():
    """f = sqrt(1 + x²) from x = 1: the Newton step p = −x (1 + x²) = −2 lands on
    x = −1, where f is the same (Armijo fails); the halved step lands on the mode 0.
    The step lengths 1, 1/2, ... are tried with their derivatives in one pass, so
    the iteration costs one pass: two in all with the one at the start (the value
    search after a failed full step would make it four)."""
    r = newton_modes(
        lambda x: -jnp.sqrt(1.0 + x[0] ** 2), jnp.asarray([[1.0]]), tol=0.01
    )
    assert bool(r.converged[0])
    assert int(r.num_steps) == 2
    # exact but for the rounding of the step through the eigendecomposition
    assert abs(float(r.position[0, 0])) < 1e-12


def _random_walk(x):
    # a Gaussian random walk with a quartic pull to 0, written as a Python loop: 80
    # steps unrolled, about 8 jaxpr equations a step (issue 48's kind of model)
    lp = -0.5 * x[0] ** 2
    for t in range(1, x.shape[0]):
        lp = lp - 0.5 * (x[t] - x[t - 1]) ** 2 - 0.025 * x[t] ** 4
    return lp


def _random_walk_hessian(x):
    """``∇² log π`` of :func:`_random_walk`, by hand: tridiagonal plus the quartic's
    diagonal ``−0.3 x_t²``."""
    d = x.shape[0]
    h = np.zeros((d, d))
    for t in range(1, d):
        h[t, t] -= 1.0
        h[t - 1, t - 1] -= 1.0
        h[t, t - 1] += 1.0
        h[t - 1, t] += 1.0
        h[t, t] -= 0.3 * x[t] ** 2
    h[0, 0] -= 1.0
    return h


def test_a_long_unrolled_model_gets_its_hessian_from_gradient_differences():
    """Issue 48: a log density unrolled by a Python loop is a large program, and XLA
    compiles a second-order program of it many times slower than its gradient; the
    Hessian is then taken by central differences of the gradient, a small
    vectorised model keeps autodiff. The differences match the Hessian by hand to
    1e-8 of its largest entry (2e-11 measured): the truncation error is about
    h²·|∂⁴ log π| / 6 ≈ (1.2e-5)² · 0.6 / 6 ≈ 1e-11 (h = ε^{1/3} max(|x|, 1)), the
    rounding error about ε |∇ log π| / h ≈ 2.2e-16 · 7 / 6e-6 ≈ 3e-10 at most."""
    d = 81
    x = jnp.asarray(np.random.default_rng(4).uniform(-2, 2, d))
    assert newton.hessian_method(_random_walk, x) == "differences"
    assert newton.hessian_method(lambda z: -0.5 * z @ z, x) == "autodiff"
    hess, grad = newton.hessian_at(_random_walk, x)
    ref = _random_walk_hessian(np.asarray(x))
    np.testing.assert_allclose(
        np.asarray(hess), ref, rtol=0, atol=1e-8 * np.abs(ref).max()
    )
    np.testing.assert_allclose(grad, jax.grad(_random_walk)(x), rtol=1e-12)


def _random_walk_scan(x):
    # _random_walk with its recursion as lax.scan: a small program with a loop
    def step(prev, xt):
        return xt, -0.5 * (xt - prev) ** 2 - 0.025 * xt**4

    _, terms = jax.lax.scan(step, x[0], x[1:])
    return -0.5 * x[0] ** 2 + jnp.sum(terms)


def test_a_model_with_a_scan_gets_its_hessian_from_gradient_differences():
    """Issue 48: forward over reverse of a ``lax.scan`` compiles in about 4x the
    gradient's time (the stochastic-volatility model: benchmarks/results/
    compile_scale.md), differences of the gradient in about 2x; a model with a loop
    takes the differences, however few its equations. Checked against the Hessian by
    hand, to the same 1e-8 of its largest entry as the unrolled model (the same
    truncation and rounding errors: the same log density), and the scan's value and
    gradient against the unrolled one's."""
    d = 81
    x = jnp.asarray(np.random.default_rng(5).uniform(-2, 2, d))
    assert newton.hessian_method(_random_walk_scan, x) == "differences"
    hess, grad = newton.hessian_at(_random_walk_scan, x)
    ref = _random_walk_hessian(np.asarray(x))
    np.testing.assert_allclose(
        np.asarray(hess), ref, rtol=0, atol=1e-8 * np.abs(ref).max()
    )
    np.testing.assert_allclose(grad, jax.grad(_random_walk)(x), rtol=1e-12)
    # a while loop counts as a loop too; a vectorised model keeps autodiff
    loop = lambda z: jax.lax.fori_loop(0, 3, lambda i, a: a - 0.5 * z @ z, 0.0)  # noqa: E731
    assert newton.hessian_method(loop, x) == "differences"
    assert newton.hessian_method(lambda z: -0.5 * z @ z, x) == "autodiff"


def test_newton_with_difference_hessians_reaches_the_mode_in_one_program():
    """The loop calls one compiled derivative program, at a fixed number of points,
    for every pass (issue 48: one while loop holding the model's Hessian three times
    compiled in 24-35x the gradient's time): after a search from two starts the
    program has one compilation more. The random walk's mode is 0 (a concave
    log density, even in x); Newton's method with difference Hessians gets there to
    the tolerance asked for."""
    d = 81
    starts = jnp.asarray(np.random.default_rng(5).uniform(-2, 2, (2, d)))
    before = newton._derivatives._cache_size()
    r = newton_modes(_random_walk, starts, tol=1e-12)
    assert newton._derivatives._cache_size() == before + 1
    assert bool(np.all(r.converged))
    # a decrement <= 1e-12 puts the point within 1e-6 of the mode in H's metric; the
    # widest direction at 0 has sd 52 (the walk's softest mode; the quartic's
    # curvature vanishes there): within 5.2e-5 in x (5e-11 measured: the last steps
    # converge quadratically)
    np.testing.assert_allclose(np.asarray(r.position), 0.0, atol=5.2e-5)
