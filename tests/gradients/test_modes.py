"""``grad_mode``: forward and reverse autodiff give the same gradients and the same
samples (cenlmc_jax.gradients.modes).

Both modes apply the same chain rule and sum its terms in another order, so
they agree up to rounding: an entry of the gradient sums O(10) terms of size
at most ``max |∇|`` here, and each mode rounds every term once, so they differ
by a few ulp of ``max |∇|``: RTOL_32 = 1e-5 (≈ 80 ε in float32) and
RTOL_64 = 1e-12 (≈ 4,500 ε in float64) leave room for the O(10) terms and the
transcendental functions (sin, exp) whose last bit differs by implementation.

Samples: the same key gives the same noise; the trajectories then differ by
the rounding of the gradients only, which a contracting drift (every target
here is log-concave or mildly curved, h·L < 1) does not amplify: float64
trajectories agree to 1e-10 and every discrete decision (a Metropolis accept,
CEnLMC's tests) is the same. A run in float64 is used for the samplers with
such decisions, so that no decision sits within rounding of its threshold.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cenlmc_jax as cj
from cenlmc_jax.adaptation.step_size import max_curvature
from cenlmc_jax.ensemble import EnsembleOptions
from cenlmc_jax.gradients.modes import (
    FORWARD_MAX_D,
    GRAD_MODES,
    resolve_grad_mode,
    value_and_grad,
)

RTOL_32, RTOL_64 = 1e-5, 1e-12
MODES = ("reverse", "forward")
A = np.array([[2.0, 0.6, 0.0], [0.6, 1.0, 0.3], [0.0, 0.3, 0.5]])


def curved(x):
    """A correlated Gaussian plus a banana-like term: gradient and Hessian vary with x
    (d = 3)."""
    a = jnp.asarray(A, x.dtype)
    return (
        -0.5 * x @ (a @ x) - 0.1 * (x[1] - x[0] ** 2) ** 2 + 0.05 * jnp.sum(jnp.sin(x))
    )


def gaussian(x):
    return -0.5 * jnp.sum(x**2)


# ------------------------------------------------------------------ the gradient itself


@pytest.mark.parametrize("dtype,rtol", [(jnp.float32, RTOL_32), (jnp.float64, RTOL_64)])
def test_forward_and_reverse_give_the_same_value_and_gradient(dtype, rtol):
    with jax.enable_x64(dtype == jnp.float64):
        x = jnp.asarray(np.random.default_rng(0).normal(size=(64, 3)), dtype)
        (vr, gr), (vf, gf) = (
            jax.jit(jax.vmap(value_and_grad(curved, m)))(x) for m in MODES
        )
        assert gr.dtype == gf.dtype == vf.dtype == dtype  # float64 in, float64 out
        scale = float(jnp.max(jnp.abs(gr)))
        np.testing.assert_allclose(
            np.asarray(gf), np.asarray(gr), rtol=0, atol=rtol * scale
        )
        np.testing.assert_allclose(np.asarray(vf), np.asarray(vr), rtol=rtol)


@pytest.mark.parametrize("d,n", [(3, 16000), (5, 8000)])
def test_forward_mode_is_right_where_xla_miscompiles_vmapped_jacfwd(d, n):
    """On XLA CPU (jaxlib 0.10.2) ``jit(vmap(jacfwd(f)))`` is wrong at these shapes
    (measured: rows shifted by a few particles); the library's forward mode must not be
    (exact gradient cos x - x)."""
    f = lambda t: -0.5 * jnp.sum(t**2) + jnp.sum(jnp.sin(t))
    x = jnp.asarray(np.random.default_rng(1).normal(0.0, 0.3, (n, d)), jnp.float32)
    g = np.asarray(jax.jit(jax.vmap(value_and_grad(f, "forward")))(x)[1])
    exact = np.cos(np.asarray(x, np.float64)) - np.asarray(x, np.float64)
    np.testing.assert_allclose(
        g, exact, rtol=0, atol=1e-6
    )  # float32 rounding of O(1) entries: ~1e-7


def test_pytree_positions_in_both_modes():
    def lp(p):
        return (
            -0.5 * jnp.sum(p["a"] ** 2)
            - jnp.sum(p["b"] ** 4)
            + p["a"][0] * p["b"][1, 0]
        )

    p = {"a": jnp.asarray([0.3, -1.0]), "b": jnp.asarray([[0.5, -0.2], [0.1, 0.7]])}
    (vr, gr), (vf, gf) = (value_and_grad(lp, m)(p) for m in MODES)
    assert jax.tree_util.tree_structure(gf) == jax.tree_util.tree_structure(p)
    jax.tree_util.tree_map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=RTOL_32, atol=1e-7), gf, gr
    )
    np.testing.assert_allclose(vf, vr, rtol=RTOL_32)
    est = {
        m: cj.gradients.grad_estimator_from_logdensity(lp, grad_mode=m)(
            jax.random.key(0), p
        )
        for m in MODES
    }
    jax.tree_util.tree_map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=RTOL_32, atol=1e-7),
        est["forward"],
        est["reverse"],
    )


# ------------------------------------------------------------------ the auto rule


def _jaxpr(fn, x):
    return str(jax.make_jaxpr(fn)(x))


def test_auto_is_forward_at_small_d_and_reverse_at_large_d():
    assert [
        resolve_grad_mode("auto", d) for d in (1, FORWARD_MAX_D, FORWARD_MAX_D + 1, 100)
    ] == ["forward", "forward", "reverse", "reverse"]
    for d, expect in (
        (2, "forward"),
        (FORWARD_MAX_D, "forward"),
        (FORWARD_MAX_D + 1, "reverse"),
    ):
        x = jnp.ones((d,))
        assert _jaxpr(value_and_grad(gaussian, "auto"), x) == _jaxpr(
            value_and_grad(gaussian, expect), x
        ), d
    # a pytree counts its total size: two leaves of 3 are d = 6
    p = {"a": jnp.ones(3), "b": jnp.ones(3)}
    lp = lambda q: gaussian(q["a"]) + gaussian(q["b"])
    assert _jaxpr(value_and_grad(lp, "auto"), p) == _jaxpr(
        value_and_grad(lp, resolve_grad_mode("auto", 6)), p
    )


def test_auto_falls_back_to_reverse_for_a_custom_vjp_log_density_and_grad_fn_overrides_the_mode():  # noqa: E501
    @jax.custom_vjp
    def adjoint(x):
        return gaussian(x)

    adjoint.defvjp(lambda x: (gaussian(x), x), lambda x, g: (-g * x,))
    x = jnp.asarray([0.5, -1.0])
    np.testing.assert_allclose(value_and_grad(adjoint, "auto")(x)[1], -x)
    with pytest.raises(TypeError, match="custom_vjp"):
        value_and_grad(adjoint, "forward")(x)
    # a grad_fn is used as it is, whatever grad_mode says (the log density is only
    # evaluated)
    algo = cj.lmc(adjoint, 0.1, grad_fn=lambda y: -y, grad_mode="forward")
    state, _ = algo.step(jax.random.key(0), algo.init(jnp.ones((4, 2))))
    np.testing.assert_allclose(state.logdensity_grad, -state.position)


@pytest.mark.parametrize(
    "make",
    [
        lambda m: cj.lmc(gaussian, 0.1, grad_mode=m),
        lambda m: cj.cenlmc(
            gaussian, 0.05, 0.8, 0.5, 0.5, 2, 10.0, f_star=0.0, grad_mode=m
        ),
        lambda m: cj.enlmc(gaussian, 0.05, 0.8, options=EnsembleOptions(grad_mode=m)),
        lambda m: cj.irreversible.sde_proposal(1.0, 0.0, gaussian, 0.1, grad_mode=m),
        lambda m: cj.gradients.grad_estimator_from_logdensity(gaussian, grad_mode=m),
        lambda m: max_curvature(
            cj.gradients.grad_estimator_from_logdensity(gaussian),
            jnp.ones((2, 2)),
            jax.random.key(0),
            grad_mode=m,
        ),
        lambda m: cj.ensemble.lmc_step(
            jax.random.key(0),
            cj.ensemble.lmc_init(jnp.ones((3, 2)), gaussian),
            gaussian,
            0.1,
            grad_mode=m,
        ),
        lambda m: value_and_grad(gaussian, m),
    ],
)
def test_a_bad_grad_mode_is_a_value_error_naming_it(make):
    assert GRAD_MODES == ("auto", "reverse", "forward")
    for bad in ("fwd", None, 1):
        with pytest.raises(ValueError, match="grad_mode"):
            make(bad)


# ------------------------------------------------------------------ same samples for
# the same key


def _positions(n, d, dtype):
    return jnp.asarray(np.random.default_rng(2).normal(0.0, 1.5, (n, d)), dtype)


def test_lmc_same_samples_in_both_modes_float64_in_float64_out():
    with jax.enable_x64(True):
        runs = {
            m: cj.sample(
                jax.random.key(3),
                cj.lmc(curved, 0.1, grad_mode=m),
                cj.lmc(curved, 0.1, grad_mode=m).init(_positions(64, 3, jnp.float64)),
                20,
                check_convergence=False,
            )
            for m in GRAD_MODES
        }
        assert runs["auto"].trace.dtype == runs["forward"].trace.dtype == jnp.float64
        np.testing.assert_allclose(
            runs["forward"].trace, runs["reverse"].trace, rtol=0, atol=1e-10
        )
        np.testing.assert_array_equal(
            runs["auto"].trace, runs["forward"].trace
        )  # d = 3: auto is forward


@pytest.mark.parametrize("sampler", ["enlmc", "cenlmc"])
def test_ensemble_samplers_same_samples_and_same_gradient_counts(sampler):
    with jax.enable_x64(True):

        def build(m):
            if sampler == "enlmc":
                return cj.enlmc(curved, 0.02, 0.8, audit_size=4, grad_mode=m)
            return cj.cenlmc(
                curved, 0.05, 0.8, 0.5, 0.5, 3, 10.0, f_star=0.0, grad_mode=m
            )

        steps = (
            4 if sampler == "enlmc" else 10
        )  # EnLMC is unstable: a short run, before it blows up
        runs = {
            m: cj.sample(
                jax.random.key(4),
                build(m),
                build(m).init(_positions(64, 3, jnp.float64)),
                steps,
                info_reduce=None,
                check_convergence=False,
            )
            for m in MODES
        }
        assert not np.any(runs["reverse"].info.diverged)
        np.testing.assert_allclose(
            runs["forward"].trace, runs["reverse"].trace, rtol=0, atol=1e-10
        )
        np.testing.assert_array_equal(
            runs["forward"].info.grad_evals, runs["reverse"].info.grad_evals
        )
        assert (
            int(np.sum(runs["forward"].info.grad_evals)) > 0
        )  # the true gradients were taken


def test_mala_same_samples_and_decisions_in_both_modes_with_a_pytree_position():
    with jax.enable_x64(True):
        lp = lambda p: curved(jnp.concatenate([p["a"], p["b"]]))
        p0 = {"a": jnp.asarray([0.5, -0.3]), "b": jnp.asarray([1.0])}
        runs = {}
        for m in MODES:
            algo = cj.vmap_chains(
                cj.irreversible_mh(
                    lp, cj.irreversible.sde_proposal(1.0, 0.0, lp, 0.4, grad_mode=m)
                )
            )
            start = jax.tree_util.tree_map(
                lambda v: jnp.broadcast_to(v, (8, *v.shape)), p0
            )
            runs[m] = cj.sample(
                jax.random.key(5),
                algo,
                algo.init(start, jax.random.key(6)),
                30,
                info_reduce=None,
                check_convergence=False,
            )
        jax.tree_util.tree_map(
            lambda a, b: np.testing.assert_allclose(a, b, rtol=0, atol=1e-10),
            runs["forward"].trace,
            runs["reverse"].trace,
        )
        np.testing.assert_array_equal(
            runs["forward"].info.is_accepted, runs["reverse"].info.is_accepted
        )


@pytest.mark.parametrize("mode", GRAD_MODES)
def test_max_curvature_in_every_mode_on_a_gaussian(mode):
    """For a Gaussian the Hessian is -A everywhere: the result is λ_max(A), whichever
    modes differentiate it."""
    with jax.enable_x64(True):
        for est_mode in MODES:
            est = cj.gradients.grad_estimator_from_logdensity(
                lambda x: -0.5 * x @ (jnp.asarray(A) @ x), grad_mode=est_mode
            )
            lam = max_curvature(
                est,
                _positions(4, 3, jnp.float64),
                jax.random.key(0),
                num_iters=200,
                grad_mode=mode,
            )
            np.testing.assert_allclose(
                float(lam), np.linalg.eigvalsh(A).max(), rtol=1e-10
            )


def test_grad_through_sample_is_the_same_in_both_modes():
    def mean_of_run(mu, m):
        lp = lambda x: -0.5 * jnp.sum((x - mu) ** 2)
        algo = cj.lmc(lp, 0.1, grad_mode=m)
        return jnp.mean(
            cj.sample(
                jax.random.key(7),
                algo,
                algo.init(jnp.zeros((16, 2))),
                20,
                check_convergence=False,
            ).trace
        )

    grads = [float(jax.grad(mean_of_run)(0.7, m)) for m in MODES]
    np.testing.assert_allclose(grads[0], grads[1], rtol=RTOL_32)
