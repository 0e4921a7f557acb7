"""Finite-difference gradients and black-box models (``grad_fn=``;
``jax.pure_callback``).

What cannot be faked: the finite-difference gradient against the exact one
(its error bound is O(δ²) / O(δ) plus rounding ε/δ), a NumPy model behind
``pure_callback`` that counts its own calls, and the moments of a run on that
black box against the target's exact ones (MCSE z-test).
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cenlmc_jax as cj
from cenlmc_jax.gradients.finite_difference import finite_difference


def smooth(x):
    return -0.5 * jnp.sum(x**2) + jnp.sum(jnp.sin(x)) - 0.1 * jnp.sum(x**4)


@pytest.mark.parametrize("scheme, rtol", [("central", 1e-8), ("forward", 2e-6)])
def test_finite_difference_matches_the_exact_gradient(scheme, rtol):
    # float64: central δ = ε^(1/3) ≈ 6e-6 gives truncation δ²|f'''| ~ 1e-10 and rounding
    # ε/δ ~ 4e-11; forward δ = ε^(1/2) ≈ 1.5e-8 gives δ|f''| and ε/δ ~ 1.5e-8, both
    # times |x|-scaled steps
    with jax.enable_x64(True):
        x = jnp.array([0.3, -1.7, 2.5, 0.0], jnp.float64)
        fd = finite_difference(smooth, scheme=scheme)
        np.testing.assert_allclose(fd(x), jax.grad(smooth)(x), rtol=rtol, atol=rtol)
        assert fd.model_solves(4) == (8 if scheme == "central" else 5)


def test_finite_difference_bad_input():
    with pytest.raises(ValueError, match="scheme"):
        finite_difference(smooth, scheme="backward")
    with pytest.raises(ValueError, match="step"):
        finite_difference(smooth, step=0.0)
    with pytest.raises(ValueError, match="logdensity_fn"):
        finite_difference(None)


def black_box(calls, mean=1.0):
    """A NumPy model N(mean, I) behind jax.pure_callback, vectorised over leading axes;
    logs each call."""

    def numpy_logdensity(x):
        calls.append(x.shape)
        return (-0.5 * np.sum((np.asarray(x) - mean) ** 2, axis=-1)).astype(x.dtype)

    def logdensity(x):
        return jax.pure_callback(
            numpy_logdensity,
            jax.ShapeDtypeStruct((), x.dtype),
            x,
            vmap_method="expand_dims",
        )

    return logdensity


def test_black_box_model_through_cenlmc_and_the_driver():
    calls = []
    logdensity = black_box(calls)
    fd = finite_difference(logdensity)
    n, d, h = 1000, 2, 0.05
    algo = cj.cenlmc(
        logdensity, h, 0.3, 0.5, 0.3, 5, 10.0, f_star=0.0, grad_fn=fd
    )  # f* = min(-log π) = 0
    x0 = 1.0 + jax.random.normal(jax.random.key(0), (n, d))
    state = algo.init(x0)
    calls.clear()
    step = jax.jit(algo.step)
    state, info = step(
        jax.random.key(1), state
    )  # step 0: everyone takes a gradient (w = +inf)
    jax.block_until_ready(state)
    # one batched call for the N new values and one for all the gradients' shifted
    # points
    assert len(calls) == 2, calls
    assert float(info.model_solves) == n + int(info.grad_evals_padded) * 2 * d
    res = cj.sample(
        jax.random.key(2), algo, state, 300, burn_in=50, trace_fn=lambda s: s.position
    )
    assert res.diverged_at == -1
    frac = float(np.mean(res.info.ensemble_fraction[50:]))
    assert frac > 0.4  # the ensemble replaces most gradients on the black box too
    per = np.asarray(res.trace, np.float64).mean(axis=0)  # (N, d) per-particle averages
    z = (per.mean(axis=0) - 1.0) / (per.std(axis=0, ddof=1) / math.sqrt(n))
    assert np.all(np.abs(z) < 4.0), (
        z
    )  # the mean is exact (1) for ULA on a Gaussian; 4 MCSE


def test_lmc_with_a_finite_difference_gradient_tracks_autodiff():
    with jax.enable_x64(True):
        x0 = jax.random.normal(jax.random.key(0), (50, 4), jnp.float64)
        exact = cj.lmc(smooth, 0.05)
        # track_logdensity: the value with every gradient (the count below is of both)
        fd = cj.lmc(
            smooth, 0.05, grad_fn=finite_difference(smooth), track_logdensity=True
        )
        a = cj.sample(jax.random.key(1), exact, exact.init(x0), 20, mode="stream")
        b = cj.sample(jax.random.key(1), fd, fd.init(x0), 20, mode="stream")
        # the same noise; gradients differ by ~1e-10 per step, amplified at most (1 + h
        # L)^20
        np.testing.assert_allclose(
            a.state.position, b.state.position, rtol=1e-7, atol=1e-7
        )
        assert float(b.info.model_solves[0]) == 50 * (2 * 4 + 1)


def point_counter(points):
    """A NumPy N(1, I) model that counts the points it evaluates (one per row of a
    batched call)."""

    def numpy_logdensity(x):
        points.append(int(np.prod(x.shape[:-1])))
        return (-0.5 * np.sum((np.asarray(x) - 1.0) ** 2, axis=-1)).astype(x.dtype)

    def logdensity(x):
        return jax.pure_callback(
            numpy_logdensity,
            jax.ShapeDtypeStruct((), x.dtype),
            x,
            vmap_method="expand_dims",
        )

    return logdensity


@pytest.mark.parametrize("scheme", ["central", "forward"])
def test_value_and_grad_and_grad_given_value_are_the_gradient_with_no_value_twice(
    scheme,
):
    with jax.enable_x64(True):
        x = jnp.array([0.3, -1.7, 2.5, 0.0], jnp.float64)
        fd = finite_difference(smooth, scheme=scheme)
        value, g = fd.value_and_grad(x)
        # the same points, the same arithmetic: bitwise equal to the value and the plain
        # gradient
        assert float(value) == float(smooth(x))
        np.testing.assert_array_equal(g, fd(x))
        np.testing.assert_array_equal(fd.grad_given_value(x, smooth(x)), fd(x))
        assert fd.model_solves_given_value(4) == (8 if scheme == "central" else 4)
        # the forward difference uses the value it is given (a wrong one moves every
        # component by -1/δ); the central one does not read it
        off = fd.grad_given_value(x, smooth(x) + 1.0)
        if scheme == "forward":
            assert np.all(np.asarray(off - fd(x)) < -1e6)
        else:
            np.testing.assert_array_equal(off, fd(x))


#: eta, R1, R2, N*, M_f of the CEnLMC runs below
CENLMC_PARAMS = (0.3, 0.5, 0.3, 5, 10.0)


@pytest.mark.parametrize("scheme", ["central", "forward"])
def test_the_samplers_evaluate_each_point_once_and_count_what_they_evaluate(scheme):
    n, d, h = 400, 2, 0.05
    points = []
    logdensity = point_counter(points)
    fd = finite_difference(logdensity, scheme=scheme)
    x0 = 1.0 + jax.random.normal(jax.random.key(0), (n, d))
    per_grad = 2 * d if scheme == "central" else d  # the value at the particle is known

    # with the log density kept every step, the values come with the gradients (cj.lmc's
    # default evaluates the gradient only: n * 2d points for central differences)
    lmc = cj.lmc(logdensity, h, grad_fn=fd, track_logdensity=True)
    state = lmc.init(x0)
    points.clear()
    _, info = jax.jit(lmc.step)(jax.random.key(1), state)
    jax.block_until_ready(info)
    assert points == [
        n * (per_grad + 1)
    ]  # one batched call: the values come with the gradients
    assert float(info.model_solves) == n * (per_grad + 1)

    for lookahead in (False, None):
        cen = cj.cenlmc(
            logdensity, h, *CENLMC_PARAMS, f_star=0.0, grad_fn=fd, lookahead=lookahead
        )
        state = cen.init(x0)
        step = jax.jit(cen.step)
        state, _ = step(jax.random.key(1), state)  # step 0: every particle's gradient
        points.clear()
        state, info = step(jax.random.key(2), state)
        jax.block_until_ready(state)
        padded = int(info.grad_evals_padded)
        assert 0 < padded < n  # the step used the ensemble and some true gradients
        if lookahead is False:
            # the gradients' call (d or 2d points each: the values at the particles
            # are the state's) and the N new values
            assert sorted(points) == sorted([padded * per_grad, n]), points
        else:
            # the lookahead: the N new values and the next step's gradients in one
            # call (this step's came with the last one: no miss here)
            assert int(info.lookahead_misses) == 0
            assert points == [n + padded * per_grad], points
        assert float(info.model_solves) == n + padded * per_grad


def test_a_finite_difference_of_another_density_never_gets_the_samplers_values():
    # grad_fn differentiates log π + 1: its forward difference must not be taken against
    # log π's values
    with jax.enable_x64(True):
        shifted = lambda x: smooth(x) + 1.0  # noqa: E731
        fd = finite_difference(shifted, scheme="forward")
        assert not cj.langevin.shares_values(fd, smooth) and cj.langevin.shares_values(
            fd, shifted
        )
        x0 = jax.random.normal(jax.random.key(0), (200, 3), jnp.float64)
        cen = cj.cenlmc(smooth, 0.05, 0.3, 0.5, 0.3, 5, 10.0, grad_fn=fd)
        state = cen.init(x0)
        state, info = jax.jit(cen.step)(jax.random.key(1), state)
        # every particle took a gradient at step 0: d + 1 values each, none reused
        assert float(info.model_solves) == 200 + int(info.grad_evals_padded) * 4
        # the samplers' gradient given log π's value is grad_fn's own forward
        # difference, bitwise
        x = x0[0]
        grad_one = cj.langevin.gradient_fn(smooth, fd, given_value=True)
        np.testing.assert_array_equal(grad_one(x, smooth(x)), fd(x))


def test_whitened_finite_differences_keep_their_cost_and_reuse_the_value():
    # y = L⁻¹(x − m): the whitened density's value at y is the model's at x, so the
    # reuse carries over; before, the wrapper lost model_solves and a whitened run
    # counted 1 solve per gradient
    n, d = 300, 2
    points = []
    logdensity = point_counter(points)
    fd = finite_difference(logdensity, scheme="forward")
    algo = cj.whitened(
        cj.cenlmc,
        logdensity,
        0.05,
        *CENLMC_PARAMS,
        f_star=0.0,
        grad_fn=fd,
        inverse_mass_matrix=jnp.array([4.0, 0.25]),
        mean=jnp.ones(2),
    )
    x0 = 1.0 + jax.random.normal(jax.random.key(0), (n, d)) * jnp.array([2.0, 0.5])
    state = algo.init(x0)
    step = jax.jit(algo.step)
    state, _ = step(jax.random.key(1), state)
    points.clear()
    state, info = step(jax.random.key(2), state)
    jax.block_until_ready(state)
    padded = int(info.grad_evals_padded)
    # one call: the lookahead's (the whitened grad_fn keeps values_and_grads)
    assert int(info.lookahead_misses) == 0
    assert points == [n + padded * d], points
    assert float(info.model_solves) == n + padded * d


@pytest.mark.parametrize("scheme", ["central", "forward"])
def test_values_and_grads_is_one_call_of_the_values_and_the_rows_gradients(scheme):
    """values_and_grads(x, rows): the values at every point and grad_given_value at
    the rows (repeats allowed), from ONE call of M + B·(2d or d) points; bit for bit
    on a NumPy model, whose value at a point does not depend on its batch."""
    with jax.enable_x64(True):
        points = []
        logdensity = point_counter(points)
        fd = finite_difference(logdensity, scheme=scheme)
        x = jax.random.normal(jax.random.key(0), (7, 3), jnp.float64)
        rows = jnp.array([4, 0, 4], jnp.int32)
        values, grads = jax.jit(fd.values_and_grads)(x, rows)
        per_point = 2 * 3 if scheme == "central" else 3
        assert points == [7 + 3 * per_point]
        np.testing.assert_array_equal(values, jax.vmap(logdensity)(x))
        expect = jax.vmap(fd.grad_given_value)(x[rows], values[rows])
        np.testing.assert_array_equal(grads, expect)
        np.testing.assert_allclose(grads, 1.0 - x[rows], atol=1e-6)  # N(1, I)
        # no rows: the values alone
        values0, grads0 = fd.values_and_grads(x, jnp.zeros((0,), jnp.int32))
        np.testing.assert_array_equal(values0, values)
        assert grads0.shape == (0, 3)
