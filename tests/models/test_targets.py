"""The targets' stated exact quantities, checked independently."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cenlmc_jax.models import targets

Z_MAX = 4.0  # z-tests of exact draws: false alarm 6e-5 per check


@pytest.mark.parametrize(
    "tgt",
    [
        targets.standard_gaussian(3),
        targets.correlated_gaussian(3, 0.7),
        targets.anisotropic_gaussian([2.0, 0.5]),
        targets.banana(),
        targets.gaussian_mixture(),
    ],
    ids=lambda t: t.name,
)
def test_exact_sampler_matches_stated_mean_and_variance(tgt):
    n = 200_000
    x = np.asarray(tgt.sample(jax.random.key(0), n), np.float64)
    se_mean = np.sqrt(np.diag(tgt.cov) / n)
    assert np.all(np.abs(x.mean(0) - tgt.mean) / se_mean < Z_MAX)
    # variance z-test with the sample fourth central moment: Var(s²) ≈ (m4 - σ⁴)/n
    c = x - tgt.mean
    m4 = np.mean(c**4, axis=0)
    se_var = np.sqrt((m4 - np.diag(tgt.cov) ** 2) / n)
    assert np.all(np.abs(np.mean(c**2, axis=0) - np.diag(tgt.cov)) / se_var < Z_MAX)


@pytest.mark.parametrize(
    "tgt",
    [
        targets.standard_gaussian(2),
        targets.correlated_gaussian(2, 0.9),
        targets.banana(),
        targets.gaussian_mixture(),
        targets.double_well(),
        targets.logistic_regression(),
    ],
    ids=lambda t: t.name,
)
def test_f_star_is_minus_the_max_log_density(tgt):
    """f_star = -max logdensity: no point of a random cloud beats it, and a
    float64 L-BFGS from the best point reaches it."""
    from scipy.optimize import minimize

    with jax.enable_x64(True):
        f = jax.jit(lambda x: -tgt.logdensity_fn(x))
        g = jax.jit(jax.grad(lambda x: -tgt.logdensity_fn(x)))
        cloud = np.random.default_rng(0).normal(size=(2000, tgt.dim)) * 2
        vals = np.array([float(f(jnp.asarray(c))) for c in cloud[:200]])
        assert vals.min() >= tgt.f_star - 1e-9
        best = minimize(
            lambda z: float(f(jnp.asarray(z))),
            cloud[np.argmin(vals)],
            jac=lambda z: np.asarray(g(jnp.asarray(z))),
            method="L-BFGS-B",
            tol=1e-12,
        )
        # both are optima of a smooth function in float64: agree to ~1e-8
        assert abs(best.fun - tgt.f_star) < 1e-6, (best.fun, tgt.f_star)


def test_densities_are_normalised():
    """Quadrature on a grid: the normalised targets integrate to 1."""
    g = np.linspace(-8, 8, 801)
    xx, yy = np.meshgrid(g, g, indexing="ij")
    pts = jnp.asarray(np.stack([xx.ravel(), yy.ravel()], 1))
    for tgt in [
        targets.correlated_gaussian(2, 0.5),
        targets.banana(b=0.3),
        targets.gaussian_mixture(),
    ]:
        dens = np.exp(np.asarray(jax.vmap(tgt.logdensity_fn)(pts), np.float64)).reshape(
            xx.shape
        )
        mass = np.trapezoid(np.trapezoid(dens, g, axis=1), g)
        assert abs(mass - 1) < 1e-4, (
            tgt.name,
            mass,
        )  # grid error of a smooth density, far below 1e-4
    t = np.linspace(-4, 4, 40_001)
    dw = targets.double_well()
    dens = np.exp(
        np.asarray(jax.vmap(dw.logdensity_fn)(jnp.asarray(t)[:, None]), np.float64)
    )
    assert (
        abs(np.trapezoid(dens, t) - 1) < 1e-5
    )  # float32 log density: relative error ~1e-6


def test_logistic_regression_data_and_map():
    tgt = targets.logistic_regression(num_data=100, dim=3, seed=0)
    d = tgt.data
    assert (
        d["x"].shape == (100, 3)
        and d["y"].shape == (100,)
        and set(np.unique(d["y"])) <= {0.0, 1.0}
    )
    again = targets.logistic_regression(num_data=100, dim=3, seed=0)
    np.testing.assert_array_equal(again.data["x"], d["x"])  # fixed seed: same data set
    with jax.enable_x64(True):
        grad = jax.grad(tgt.logdensity_fn)(jnp.asarray(d["theta_map"]))
    assert np.max(np.abs(grad)) < 1e-8  # Newton converged to 1e-10


def test_bad_target_arguments_raise():
    with pytest.raises(ValueError, match="rho"):
        targets.correlated_gaussian(3, -0.6)
    with pytest.raises(ValueError, match="cov"):
        targets.gaussian([0.0, 0.0], [[1.0, 2.0], [2.0, 1.0]])
    with pytest.raises(ValueError, match="target must be one of"):
        targets.get_target("nope")
    with pytest.raises(ValueError, match="dim"):
        targets.standard_gaussian(0)
    assert math.isfinite(targets.double_well().f_star)


@pytest.mark.parametrize(
    "tgt",
    [
        targets.standard_gaussian(3),
        targets.correlated_gaussian(3, 0.7),
        targets.anisotropic_gaussian([2.0, 0.5]),
        targets.gaussian_mixture(),
        targets.gaussian_mixture(means=((1.0, 2.0),), sd=0.5),
        targets.logistic_regression(num_data=50, dim=3),
    ],
    ids=lambda t: t.name,
)
def test_curvature_bounds_hold_at_every_point_tried(tgt):
    """mu I <= hessian of f = -log p <= L I, checked by autodiff in float64 at
    2,000 points spread over 3x the target's scale (tails included); the
    Gaussians attain both bounds and carry their constant Hessian exactly."""
    with jax.enable_x64(True):
        hess = jax.jit(jax.vmap(jax.hessian(lambda x: -tgt.logdensity_fn(x))))
        pts = jnp.asarray(np.random.default_rng(0).normal(size=(2000, tgt.dim)) * 3.0)
        eig = np.linalg.eigvalsh(np.asarray(hess(pts)))
        first = np.asarray(hess(pts[:3]))
    # float64 autodiff of a smooth function: round-off ~1e-12 relative
    assert eig.max() <= tgt.L * (1 + 1e-9), (eig.max(), tgt.L)
    if tgt.mu is not None:
        assert eig.min() >= tgt.mu * (1 - 1e-9), (eig.min(), tgt.mu)
    if tgt.hessian is not None:
        np.testing.assert_allclose(
            first,
            np.broadcast_to(tgt.hessian, (3, tgt.dim, tgt.dim)),
            rtol=1e-9,
            atol=1e-12,
        )
        np.testing.assert_allclose([eig.min(), eig.max()], [tgt.mu, tgt.L], rtol=1e-9)


def test_targets_without_global_curvature_bounds_say_so():
    for tgt in (targets.banana(), targets.double_well()):
        assert tgt.L is None and tgt.mu is None and tgt.hessian is None, tgt.name
    mix = targets.gaussian_mixture()
    assert mix.mu is None and mix.hessian is None  # two modes: not convex, not Gaussian
    # a mixture's f is non-convex: the Hessian between the modes has a negative
    # eigenvalue
    h = np.linalg.eigvalsh(
        np.asarray(jax.hessian(lambda x: -mix.logdensity_fn(x))(jnp.zeros(2)))
    )
    assert h.min() < 0
