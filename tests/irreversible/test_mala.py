"""``cj.mala``: MALA preconditioned by ``M``, against exact moments (MCSE z-tests).

MALA is exact: its chain leaves the target invariant at any step size, so the
moments of many independent chains must agree with the exact ones within their
Monte-Carlo standard error. The chains are independent, so the standard error of
a moment is the spread of the per-chain averages over ``sqrt(C)``: no ESS estimate
is involved. A check passes when ``|z| < 4`` (false alarm 6e-5 per check).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cenlmc_jax as cj
from cenlmc_jax.models import targets

Z_MAX = 4.0
CHAINS, BURN_IN, STEPS = 128, 300, 600


def chain_moments(algo, x0, seed):
    """Per-chain means of x and x**2 over the kept draws, each ``(C, d)``."""
    batched = cj.vmap_chains(algo)
    state = batched.init(x0, jax.random.key(seed))
    res = cj.sample(
        jax.random.key(seed + 1),
        batched,
        state,
        STEPS,
        burn_in=BURN_IN,
        check_convergence=False,
    )
    draws = np.asarray(res.trace, np.float64)  # (STEPS, C, d)
    return draws.mean(0), (draws**2).mean(0), res


def z_scores(per_chain, exact):
    c = per_chain.shape[0]
    return (per_chain.mean(0) - exact) / (per_chain.std(0, ddof=1) / np.sqrt(c))


@pytest.mark.parametrize("preconditioned", [False, True])
def test_correlated_gaussian_moments(preconditioned):
    t = targets.gaussian([1.0, -2.0], [[2.0, 1.2], [1.2, 1.0]])
    # with M = cov the whitened target is N(0, I): a larger step keeps the acceptance
    m = t.cov if preconditioned else None
    algo = cj.mala(
        t.logdensity_fn, 0.5 if preconditioned else 0.15, inverse_mass_matrix=m
    )
    x0 = jnp.zeros((CHAINS, 2))
    mean, second, res = chain_moments(algo, x0, seed=0)
    assert np.all(np.abs(z_scores(mean, t.mean)) < Z_MAX)
    assert np.all(np.abs(z_scores(second, np.diag(t.cov) + t.mean**2)) < Z_MAX)
    # an adjusted chain that never moves would pass the moment test only by luck
    assert 0.3 < float(np.mean(res.info.acceptance_rate)) < 0.95


def test_banana_moments_at_a_large_step():
    # a curved target at a step where unadjusted Langevin would be biased: MALA is not
    t = targets.banana()
    algo = cj.mala(t.logdensity_fn, 0.3)
    x0 = jnp.zeros((CHAINS, 2))
    mean, second, res = chain_moments(algo, x0, seed=3)
    assert np.all(np.abs(z_scores(mean, t.mean)) < Z_MAX)
    assert np.all(np.abs(z_scores(second, np.diag(t.cov) + t.mean**2)) < Z_MAX)


def test_mala_is_the_sde_proposal_with_q_zero():
    # same key, same draws: MALA is paper 2's SDE proposal with D = M and Q = 0
    t = targets.correlated_gaussian()
    m = np.array([1.5, 0.5])
    a = cj.mala(t.logdensity_fn, 0.2, inverse_mass_matrix=m)
    b = cj.irreversible_mh(
        t.logdensity_fn, cj.irreversible.sde_proposal(m, None, t.logdensity_fn, 0.2)
    )
    x = jnp.array([0.3, -0.2])
    ra = cj.sample(jax.random.key(7), a, a.init(x), 50, check_convergence=False)
    rb = cj.sample(jax.random.key(7), b, b.init(x), 50, check_convergence=False)
    np.testing.assert_array_equal(np.asarray(ra.trace), np.asarray(rb.trace))


def test_bad_inverse_mass_matrix_is_refused_before_work():
    t = targets.standard_gaussian(2)
    with pytest.raises(ValueError, match="inverse_mass_matrix"):
        cj.mala(
            t.logdensity_fn, 0.1, inverse_mass_matrix=np.array([[1.0, 2.0], [2.0, 1.0]])
        )
    algo = cj.mala(t.logdensity_fn, 0.1, inverse_mass_matrix=np.ones(3))
    with pytest.raises(ValueError, match="inverse_mass_matrix"):
        algo.init(jnp.zeros(2))
