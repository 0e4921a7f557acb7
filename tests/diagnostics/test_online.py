"""Online split R-hat and ESS of streamed runs, and the step-halving bias check (issue
28: "never silently wrong").

* The streamed R-hat is the trace's ``rank=False`` split R-hat, computed from the same
  sums: equal up to float32 rounding.
* The streamed ESS is a batch-means estimate; the trace's is Geyer's. On the same run
  they agree within the batch-means estimator's own error (test below says how much).
* Chains stuck in different places are flagged in stream mode.
* ``step_halving_bias`` flags a curved banana sampled by LMC at a large step, and
  passes a standard Gaussian at the CLI's default step.
"""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.special import ndtri

import cenlmc_jax as cj
from cenlmc_jax.diagnostics import online
from cenlmc_jax.diagnostics.chains import (
    effective_sample_size,
    potential_scale_reduction,
)
from cenlmc_jax.diagnostics.convergence import ConvergenceWarning
from cenlmc_jax.run import step_halving_bias

H, CHAINS, DRAWS = 0.2, 64, 2000


def std_gaussian(x):
    return -0.5 * jnp.sum(x**2)


@pytest.fixture(scope="module")
def both_modes():
    """The same LMC run (same key, same start) streamed and traced."""
    algo = cj.lmc(std_gaussian, H)
    x0 = jax.random.normal(jax.random.key(0), (CHAINS, 2))
    kw = dict(burn_in=50, check_convergence=False)
    streamed = cj.sample(
        jax.random.key(1), algo, algo.init(x0), DRAWS, mode="stream", **kw
    )
    traced = cj.sample(jax.random.key(1), algo, algo.init(x0), DRAWS, **kw)
    return streamed, np.asarray(cj.diagnostics.chains_first(traced))


def test_streamed_split_rhat_is_the_traces_split_rhat(both_modes):
    streamed, draws = both_modes
    diag = streamed.online
    assert (diag.num_chains, diag.num_draws) == (CHAINS, DRAWS)
    # the same formula on the same half-chain means and variances: float32 rounding of
    # Welford against two-pass sums, ~1e-6 relative
    np.testing.assert_allclose(
        diag.rhat, potential_scale_reduction(draws, rank=False), rtol=1e-4
    )
    np.testing.assert_allclose(
        diag.rhat_sq, potential_scale_reduction(draws**2, rank=False), rtol=1e-4
    )
    # the stream's moments and the online mean of x² are those of the draws
    np.testing.assert_allclose(diag.mean_sq, (draws**2).mean(axis=(0, 1)), rtol=1e-4)


def test_streamed_ess_is_the_batch_means_formula_and_near_the_traces_ess(both_modes):
    streamed, draws = both_modes
    diag = streamed.online
    # exactly the batch-means formula of the module docstring, in float64 NumPy
    m, b = diag.batch_size, diag.num_batches // 2
    half = DRAWS // 2
    halves = np.concatenate([draws[:, :half], draws[:, DRAWS - half :]], axis=0)
    within = halves.var(axis=1, ddof=1).mean(axis=0)
    var_plus = within * (half - 1) / half + halves.mean(axis=1).var(axis=0, ddof=1)
    batches = halves[:, : b * m].reshape(2 * CHAINS, b, m, -1).mean(axis=2)
    batches = batches.reshape(2 * CHAINS * b, -1)
    tau = m * batches.var(axis=0, ddof=1) / var_plus
    np.testing.assert_allclose(diag.ess, 2 * half * CHAINS / tau, rtol=1e-3)
    # against Geyer's split ESS of the trace: the batch-means S² has 2bC - 1 = 255
    # degrees of freedom, a relative sd of sqrt(2 / 255) = 8.9%; its batch bias is
    # O(tau / m) = 9 / 500 ~ 2% (AR(1) of rho = 1 - h: tau = (2 - h) / h = 9). 3 sd
    # plus the bias: 0.3 (Geyer's own error, a few %, is inside it: same draws)
    traced = np.asarray(effective_sample_size(draws, method="mean"))
    np.testing.assert_allclose(diag.ess, traced, rtol=0.3)
    # and both near the exact AR(1) value C n / tau
    np.testing.assert_allclose(diag.ess, CHAINS * DRAWS / 9.0, rtol=0.3)


def test_from_draws_reproduces_the_stream_and_thin_counts_kept_draws(both_modes):
    streamed, draws = both_modes
    offline = online.from_draws(draws)
    np.testing.assert_allclose(offline.rhat, streamed.online.rhat, rtol=1e-5)
    np.testing.assert_allclose(offline.ess, streamed.online.ess, rtol=1e-4)
    algo = cj.lmc(std_gaussian, H)
    res = cj.sample(
        jax.random.key(2),
        algo,
        algo.init(jnp.zeros((8, 2))),
        200,
        thin=4,
        mode="stream",
        check_convergence=False,
    )
    assert res.online.num_draws == 50 and res.online.num_chains == 8
    assert res.trace is None and traced_none(res)


def traced_none(res):
    """A trace run has no online diagnostics (the trace has them)."""
    algo = cj.lmc(std_gaussian, H)
    traced = cj.sample(
        jax.random.key(2),
        algo,
        algo.init(jnp.zeros((8, 2))),
        8,
        check_convergence=False,
    )
    return traced.online is None


def test_chains_stuck_apart_are_flagged_in_stream_mode():
    # LMC at h = 0.002 on N(0, I) from starts spread by 10: relaxation ~ 1/h = 500
    # steps, 60 steps kept: the half-chains' means stay where they started
    algo = cj.lmc(std_gaussian, 0.002)
    x0 = 10.0 * jax.random.normal(jax.random.key(3), (16, 2))
    with pytest.warns(ConvergenceWarning) as caught:
        res = cj.sample(jax.random.key(4), algo, algo.init(x0), 60, mode="stream")
    assert np.all(np.asarray(res.online.rhat) > 1.1)
    messages = [str(w.message) for w in caught]
    assert any("split R-hat of x[" in m and "online" in m for m in messages), messages
    assert any("the ESS of x[" in m for m in messages), messages
    problems = online.stream_problems(res.online, rhat_max=1.1)
    assert len(problems) == 2


def test_a_healthy_streamed_run_raises_no_convergence_warning():
    # LMC at h = 0.5 on N(0, I): tau = (2 - h) / h = 3, so 64 chains x 4000 draws
    # have ~670 effective draws per half-chain: R-hat - 1 ~ 1 / (2 x 670) = 0.0008,
    # its sd about as large; 1.01 is ~10 sd away, and the ESS (~85,000) is far above
    # the floor of 400
    algo = cj.lmc(std_gaussian, 0.5)
    x0 = jax.random.normal(jax.random.key(5), (64, 2))
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        res = cj.sample(
            jax.random.key(6), algo, algo.init(x0), 4000, burn_in=100, mode="stream"
        )
    assert res.online is not None


def banana(b=0.25, s=0.5):
    """x0 ~ N(0, 1), x1 | x0 ~ N(b (x0² - 1), s²): curvature 1/s² = 4 across the
    banana, so ULA's variance of x1 | x0 is inflated by 1 / (1 - 2h) at step h."""

    def logdensity_fn(x):
        return -0.5 * x[0] ** 2 - 0.5 * ((x[1] - b * (x[0] ** 2 - 1)) / s) ** 2

    return logdensity_fn


def test_step_halving_flags_lmc_on_a_curved_banana_at_a_large_step():
    # h = 0.12: Var(x1 | x0) = 0.25 / (1 - 0.24) = 0.33 instead of 0.25 (the bias of
    # E[x1²] ~ +0.08, halved at h/2); 512 particles x 1000 steps give its standard error
    # ~0.01 (measured: 4-10 se over three seeds): flagged beyond z = 3.02 (Bonferroni
    # at 1% over the 4 moments)
    logp = banana()
    h = 0.12
    x0 = jax.random.normal(jax.random.key(7), (512, 2)) * jnp.array([1.0, 0.5])
    res = cj.sample(
        jax.random.key(8),
        cj.lmc(logp, h),
        cj.lmc(logp, h).init(x0),
        1000,
        burn_in=300,
        mode="stream",
        check_convergence=False,
    )
    assert res.diverged_at < 0
    check = step_halving_bias(jax.random.key(9), lambda s: cj.lmc(logp, s), h, res)
    assert check.flagged[1, 1], (check.bias_sq, check.se_sq)
    assert check.bias_sq[1] > 0  # ULA inflates the variance across the banana
    (text,) = online.bias_problems(check)
    assert text.startswith("step-size bias") and "E[x[1]²]" in text
    assert check.grad_evals == 512 * (check.burn_in + check.num_steps)


def test_step_halving_passes_a_standard_gaussian_at_the_default_step():
    # the CLI's rule h = min(0.05, sqrt(2/N)) / c at N = 2000: the bias of E[x²] is
    # h/2 = 0.016, its estimate's standard error ~0.02 (1000 steps at h and at h/2):
    # below z = 3.02 se (not detectable at this run length: the check's power is
    # stated, not hidden)
    n = 2000
    h = min(0.05, np.sqrt(2.0 / n))
    algo = cj.lmc(std_gaussian, h)
    x0 = jax.random.normal(jax.random.key(10), (n, 2))
    res = cj.sample(
        jax.random.key(11),
        algo,
        algo.init(x0),
        1000,
        burn_in=200,
        mode="stream",
        check_convergence=False,
    )
    check = step_halving_bias(
        jax.random.key(12), lambda s: cj.lmc(std_gaussian, s), h, res
    )
    assert not check.flagged.any(), (check.bias_sq, check.se_sq)
    assert online.bias_problems(check) == []


def test_step_halving_refuses_bad_arguments_early():
    algo = cj.lmc(std_gaussian, 0.1)
    res = cj.sample(
        jax.random.key(0),
        algo,
        algo.init(jnp.zeros((4, 2))),
        16,
        mode="stream",
        check_convergence=False,
    )
    make = lambda s: cj.lmc(std_gaussian, s)  # noqa: E731
    with pytest.raises(ValueError, match="make_algorithm must be a callable"):
        step_halving_bias(jax.random.key(0), None, 0.1, res)
    with pytest.raises(ValueError, match="step_size must be a number > 0; got -1"):
        step_halving_bias(jax.random.key(0), make, -1.0, res)
    with pytest.raises(ValueError, match="num_steps must be an int >= 8; got 2"):
        step_halving_bias(jax.random.key(0), make, 0.1, res, num_steps=2)
    with pytest.raises(ValueError, match="reference must be a cj.sample result"):
        step_halving_bias(jax.random.key(0), make, 0.1, res._replace(online=None))
    with pytest.raises(ValueError, match="num_batches must be an int >= 1"):
        online.plan(100, 4, 0)


def test_bonferroni_z_is_the_two_sided_normal_quantile():
    # Phi^-1(1 - a / (2 m)) by the standard library against scipy's ndtri, over test
    # counts and rates spanning the CLI's use (2 d tests at 0.01) and far tails: both
    # are full double precision, so a relative 1e-12 is rounding, not method error.
    for m in (1, 2, 4, 10, 200, 10**6):
        for a in (0.5, 0.05, 0.01, 1e-6):
            want = -float(ndtri(a / (2 * m)))
            assert online.bonferroni_z(m, a) == pytest.approx(want, rel=1e-12)
    # the CLI's d = 2 threshold (its header prints z = 3.02)
    assert online.bonferroni_z(4) == pytest.approx(3.0233414397, abs=1e-9)
    # no test is counted as one
    assert online.bonferroni_z(0) == online.bonferroni_z(1)
