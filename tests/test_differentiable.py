"""``jax.grad`` through ``cj.sample`` for every sampler: the pathwise derivative.

The derivative of a run's streamed mean with respect to a parameter ``μ`` of
the target (here a shift: ``log π(x) = -|x - μ|²/2``) is checked against a
central finite difference with common random numbers (the same key, so the
same noise): ``(m(μ + ε) - m(μ - ε)) / 2ε``.

What the derivative means: the noise is reparameterised (fixed by the key),
and every discrete decision (CEnLMC's masks and tests, a Metropolis accept or
reject, a direction flip) is held where the run put it: a pathwise
derivative. The finite difference agrees with it as long as no decision flips
between ``μ - ε`` and ``μ + ε``; the tests check that none did (the same
accept pattern, the same gradient counts), so a disagreement is a real error.
For LMC the value is known exactly (``test_run.py``).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cenlmc_jax as cj

J = np.array([[0.0, 1.0], [-1.0, 0.0]])


def shifted(mu):
    return lambda x: -0.5 * jnp.sum((x - mu) ** 2)


# name -> (build(mu) -> SamplingAlgorithm, ensemble?, steps)
SAMPLERS = {
    "lmc": (lambda mu: cj.lmc(shifted(mu), 0.1), True, 30),
    "enlmc": (lambda mu: cj.enlmc(shifted(mu), 0.05, 0.8, audit_size=0), True, 5),
    "cenlmc": (lambda mu: cj.cenlmc(shifted(mu), 0.05, 0.8, 0.5, 0.5, 2, 10.0, f_star=0.0), True, 20),
    "cenlmc_dense_grad": (lambda mu: cj.cenlmc(shifted(mu), 0.05, 0.8, 0.5, 0.5, 2, 10.0, f_star=0.0,
                                               dense_grad=True), True, 20),
    "complete_recipe": (lambda mu: cj.complete_recipe(cj.grad_estimator_from_logdensity(shifted(mu)), 0.05,
                                                      np.eye(2), J), False, 30),
    "sgld": (lambda mu: cj.sgld(cj.grad_estimator_from_logdensity(shifted(mu)), 0.05), False, 30),
    "sgrld": (lambda mu: cj.sgrld(cj.grad_estimator_from_logdensity(shifted(mu)), 0.05, lambda t: 1.0 + 0.1 * t**2),
              False, 30),
    "sghmc": (lambda mu: cj.sghmc(cj.grad_estimator_from_logdensity(shifted(mu)), 0.05), False, 30),
    "sgrhmc": (lambda mu: cj.sgrhmc(cj.grad_estimator_from_logdensity(shifted(mu)), 0.05,
                                    cj.gsgrhmc_inv_metric(lambda t: 0.5 * jnp.sum(t**2))), False, 30),
    "irreversible_mh_sde": (lambda mu: cj.irreversible_mh(shifted(mu), cj.sde_proposal(1.0, J, shifted(mu), 0.1)),
                            False, 20),
    "irreversible_mh_gamma": (lambda mu: cj.irreversible_mh(shifted(mu), cj.gamma_proposal(2.0, 0.3)), False, 20),
    "rwmh": (lambda mu: cj.rwmh(shifted(mu), 0.5), False, 20),
}


def run(name, mu):
    """(streamed mean of coordinate 0, per-step infos) of a short float64 run."""
    build, ensemble, steps = SAMPLERS[name]
    algo = build(mu)
    x0 = jax.random.normal(jax.random.key(0), (32, 2), jnp.float64)
    if not ensemble:
        algo = cj.vmap_chains(algo)
    state = algo.init(x0, jax.random.key(1))
    res = cj.sample(jax.random.key(2), algo, state, steps, mode="stream", info_reduce=None)
    return res.moments.mean[0], res.info


@pytest.mark.parametrize("name", sorted(SAMPLERS))
def test_pathwise_derivative_matches_common_random_numbers_finite_difference(name):
    with jax.enable_x64(True):
        mu0, eps = 0.3, 1e-5
        grad = float(jax.grad(lambda m: run(name, m)[0])(jnp.float64(mu0)))
        (hi, info_hi), (lo, info_lo) = run(name, mu0 + eps), run(name, mu0 - eps)
        # the discrete decisions must be the same on both sides, or the finite difference is not pathwise
        for field in ("is_accepted", "direction_flipped", "grad_evals", "ensemble_fraction"):
            if hasattr(info_hi, field):
                np.testing.assert_array_equal(np.asarray(getattr(info_hi, field)), np.asarray(getattr(info_lo, field)))
        fd = (float(hi) - float(lo)) / (2 * eps)
        assert np.isfinite(grad), grad
        # float64 central difference: truncation O(ε²) and rounding ~1e-16/ε, both far below 1e-6
        np.testing.assert_allclose(grad, fd, rtol=1e-5, atol=1e-6)


def test_jacfwd_through_a_cenlmc_run_is_finite_at_n_1000():
    build, _, _ = SAMPLERS["cenlmc"]

    def final_mean(mu):
        algo = build(mu)
        x0 = jax.random.normal(jax.random.key(0), (1000, 2))
        res = cj.sample(jax.random.key(2), algo, algo.init(x0), 5, mode="stream")
        return res.moments.mean

    jac = jax.jacfwd(final_mean)(jnp.float32(0.3))
    assert bool(jnp.all(jnp.isfinite(jac))), jac


def test_f_star_may_be_traced():
    def final(fs):
        algo = cj.cenlmc(shifted(0.0), 0.05, 0.8, 0.5, 0.5, 2, 10.0, f_star=fs)
        x0 = jax.random.normal(jax.random.key(0), (64, 2))
        return cj.sample(jax.random.key(1), algo, algo.init(x0), 3, mode="stream").moments.mean[0]

    assert np.isfinite(float(jax.grad(final)(jnp.float32(0.0))))  # (zero: f* only enters a test)
