"""The driver's frozen-chain watch on a run whose last chunk is short."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np

import cenlmc_jax as cj


def test_a_short_last_chunk_does_not_report_a_collapsed_acceptance():
    """The last chunk of 250 steps runs in the 100-step program with 50 steps
    skipped; a skipped step's blank info has ``acceptance_rate = 0``, which read as a
    collapsed acceptance at 50 >= 50 steps (seen: 1,024 MALA chains on a banana, all
    accepting ~0.59, reported stuck at every step of 3000..3441). The chains here
    accept about half their proposals, so the warning must not fire; and a chain
    that really is stuck (every proposal at density 0) still must be reported."""

    def logp(x):
        return -0.5 * jnp.sum(x**2)

    algo = cj.vmap_chains(cj.rwmh(logp, 1.0))
    x0 = jax.random.normal(jax.random.key(0), (8, 2))
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        res = cj.sample(
            jax.random.key(1),
            algo,
            algo.init(x0),
            250,
            chunk_size=100,
            check_convergence=False,
        )
    assert 0.2 < float(np.mean(np.asarray(res.info.acceptance_rate))) < 0.9

    def support(x):
        return jnp.where(x[0] > 0, -0.5 * jnp.sum(x**2), -jnp.inf)

    # proposals of sd 10⁶: each lands where the density is 0 (x₀ < 0) or so far out
    # that exp(log ratio) underflows to exactly 0
    algo = cj.vmap_chains(cj.rwmh(support, 1e6))
    stuck = jnp.ones((8, 2))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        cj.sample(
            jax.random.key(2),
            algo,
            algo.init(stuck),
            250,
            chunk_size=100,
            check_convergence=False,
        )
    assert any("collapsed to 0" in str(w.message) for w in seen)
