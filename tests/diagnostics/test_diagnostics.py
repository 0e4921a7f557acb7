"""Tests for cenlmc_jax.diagnostics.

Statistical tolerances are stated next to each assertion together with the
reason (the estimator's own sampling spread); all randomness uses fixed seeds
and the tolerances were set from that spread, not by trying seeds.
"""

import contextlib
import functools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cenlmc_jax as cj
from cenlmc_jax import diagnostics as D

# --------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------


def ar1(phi, num_chains, num_samples, num_coords, seed):
    """Stationary AR(1) chains x_t = phi x_{t-1} + sqrt(1 - phi^2) e_t, N(0,1)
    marginals."""
    rng = np.random.default_rng(seed)
    x = np.empty((num_chains, num_samples, num_coords))
    x[:, 0] = rng.standard_normal((num_chains, num_coords))
    noise = np.sqrt(1.0 - phi**2) * rng.standard_normal(
        (num_chains, num_samples, num_coords)
    )
    for t in range(1, num_samples):
        x[:, t] = phi * x[:, t - 1] + noise[:, t]
    return x.astype(np.float32)


def ar1_ess(phi, n_total):
    """Exact ESS of the mean for AR(1): n_total / tau with tau = (1 + phi)/(1 - phi)."""
    return n_total * (1.0 - phi) / (1.0 + phi)


@contextlib.contextmanager
def x64():
    """Enable float64 for the block and restore the previous setting afterwards."""
    ctx = getattr(jax, "enable_x64", None)
    if ctx is None:  # older JAX
        from jax.experimental import enable_x64 as ctx  # type: ignore
    with ctx(True):
        yield


def stan_ess_reference(x):
    """Loop-based Stan/Geyer ESS for one coordinate, x of shape (m, n), float64.

    Written independently of the library: direct-sum autocovariances and
    explicit while loops over lags.
    """
    x = np.asarray(x, np.float64)
    m, n = x.shape
    acov = np.empty((m, n))
    for c in range(m):
        xc = x[c] - x[c].mean()
        acov[c] = [np.dot(xc[: n - t], xc[t:]) / n for t in range(n)]
    w = acov[:, 0].mean() * n / (n - 1)
    var_plus = w * (n - 1) / n + (x.mean(axis=1).var(ddof=1) if m > 1 else 0.0)
    rho = 1.0 - (w - acov.mean(axis=0)) / var_plus
    rho[0] = 1.0
    pairs = [rho[2 * k] + rho[2 * k + 1] for k in range(n // 2)]
    kept = [pairs[0]]
    k = 1
    while k < len(pairs) and pairs[k] > 0:
        kept.append(min(pairs[k], kept[-1]))  # monotone: never larger than previous
        k += 1
    extra = max(rho[2 * k], 0.0) if k < len(pairs) else 0.0
    tau = -1.0 + 2.0 * sum(kept) + extra
    tau = max(tau, 1.0 / np.log10(m * n))
    return m * n / tau


# --------------------------------------------------------------------------
# Effective sample size
# --------------------------------------------------------------------------

# Spread of the ESS estimate: by Sokal's formula var(tau_hat)/tau^2 ~ 2(2M+1)/N_total,
# with M the Geyer truncation lag.  N_total = 16000.  iid: M ~ 3 -> rel sd ~ 0.03;
# phi = 0.5 (tau = 3): M ~ 10 -> ~0.05; phi = 0.9 (tau = 19): M ~ 40 -> ~0.10.
# Per-coordinate bounds are ~5 sd; the mean over 16 independent coordinates has
# sd / 4, and its bound is ~5 of those plus ~0.01 for the estimator's small
# negative (truncation) bias.
ESS_CASES = [
    # phi, per-coordinate rel tol, rel tol of the mean over coordinates
    (0.0, 0.15, 0.05),
    (0.5, 0.25, 0.07),
    (0.9, 0.50, 0.14),
]


@pytest.mark.parametrize("phi, tol_coord, tol_mean", ESS_CASES)
def test_ess_ar1_matches_theory(phi, tol_coord, tol_mean):
    num_chains, num_samples, num_coords = 4, 4000, 16
    x = ar1(phi, num_chains, num_samples, num_coords, seed=0)
    ess = np.asarray(D.effective_sample_size(x))
    assert ess.shape == (num_coords,)
    rel = ess / ar1_ess(phi, num_chains * num_samples) - 1.0
    assert np.all(np.abs(rel) < tol_coord), rel  # ~5 sd of one estimate (see ESS_CASES)
    assert abs(rel.mean()) < tol_mean, (
        rel.mean()
    )  # ~5 sd of a 16-coordinate mean + bias


def test_ess_iid_close_to_number_of_draws():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 4000, 16)).astype(np.float32)
    ess = np.asarray(D.effective_sample_size(x))
    # iid: tau = 1, estimator rel sd ~ 0.03 (Geyer window of a few lags), 5 sd.
    np.testing.assert_allclose(ess, 16000.0, rtol=0.15)


def test_ess_matches_loop_reference():
    x = ar1(0.7, 3, 301, 5, seed=0).astype(np.float64)
    ref = np.array([stan_ess_reference(x[..., i]) for i in range(x.shape[-1])])
    with x64():
        got = np.asarray(D.effective_sample_size(jnp.asarray(x)))
    # Same algorithm, float64, FFT vs direct sums: agreement to round-off.
    np.testing.assert_allclose(got, ref, rtol=1e-9)


def test_ess_single_chain_and_event_shape_and_axes():
    x = ar1(0.5, 4, 1000, 6, seed=0).reshape(4, 1000, 2, 3)
    ess = np.asarray(D.effective_sample_size(x))
    assert ess.shape == (2, 3)
    # Moving the axes around must give the same numbers (pure relabelling).
    xt = np.transpose(x, (2, 1, 3, 0))  # (2, draws, 3, chains)
    ess_t = np.asarray(D.effective_sample_size(xt, chain_axis=-1, sample_axis=1))
    np.testing.assert_allclose(ess_t, ess, rtol=1e-5)  # float32 round-off only
    one = np.asarray(D.effective_sample_size(x[:1]))
    assert one.shape == (2, 3) and np.all(np.isfinite(one))
    # One chain of 1000 draws, tau = 3 -> ESS ~ 333; rel sd ~ sqrt(2*21/1000) ~ 0.2, 2.5
    # sd.
    np.testing.assert_allclose(one, ar1_ess(0.5, 1000), rtol=0.5)


# --------------------------------------------------------------------------
# R-hat
# --------------------------------------------------------------------------


def test_rhat_well_mixed_close_to_one():
    x = ar1(0.5, 4, 4000, 16, seed=0)
    rhat = np.asarray(D.potential_scale_reduction(x))
    assert rhat.shape == (16,)
    # 8 half-chains of 2000, tau = 3: R-hat - 1 ~ (tau * chi2_7/7 - 1) / (2 * 2000) ~
    # 5e-4, and exceeding 0.01 would need chi2_7/7 > 13.7 (essentially impossible).
    assert np.all(np.abs(rhat - 1.0) < 0.01), rhat
    rhat_nosplit = np.asarray(D.potential_scale_reduction(x, split=False))
    # Same bound for 4 chains of 4000 (needs chi2_3/3 > 27).
    assert np.all(np.abs(rhat_nosplit - 1.0) < 0.01), rhat_nosplit


def test_rhat_slow_chain_bound():
    x = ar1(0.9, 4, 4000, 16, seed=0)
    rhat = np.asarray(D.potential_scale_reduction(x))
    # tau = 19: R-hat - 1 ~ 19 * chi2_7/7 / 4000 ~ 0.005; > 0.03 needs chi2_7/7 > 6.5 (p
    # ~ 1e-7).
    assert np.all(np.abs(rhat - 1.0) < 0.03), rhat


def test_rhat_detects_shifted_chain():
    x = ar1(0.5, 4, 4000, 8, seed=0)
    x[0] += 5.0  # one chain shifted by 5 marginal sd
    rhat = np.asarray(D.potential_scale_reduction(x))
    # Expected sqrt(1 + var of half-chain means) = sqrt(1 + 25*(2/8)*(6/8)*8/7) ~ 2.5.
    assert np.all(rhat > 1.1), rhat
    assert np.all(rhat > 2.0), rhat  # ~2.5 expected; noise in it is ~1e-2


def test_split_rhat_detects_within_chain_trend():
    rng = np.random.default_rng(0)
    drift = np.linspace(0.0, 3.0, 2000)[None, :, None]
    x = (rng.standard_normal((4, 2000, 4)) + drift).astype(np.float32)
    split = np.asarray(D.potential_scale_reduction(x, split=True))
    nosplit = np.asarray(D.potential_scale_reduction(x, split=False))
    # Every chain drifts identically: between-chain spread is noise only (|R-1| ~ 1e-3),
    # but half-chain means differ by 1.5 -> split R-hat ~ sqrt(1 + 0.75^2*8/7 / (1 +
    # 1.5^2/12)) ~ 1.24.
    assert np.all(np.abs(nosplit - 1.0) < 0.01), nosplit
    assert np.all(split > 1.1), split


def test_rhat_odd_number_of_draws_drops_middle():
    x = ar1(0.5, 2, 101, 3, seed=0)
    expected = D.potential_scale_reduction(
        np.concatenate([x[:, :50], x[:, 51:]], axis=1)
    )
    got = D.potential_scale_reduction(x)
    np.testing.assert_allclose(got, expected, rtol=1e-6)  # identical computation


# --------------------------------------------------------------------------
# MCSE and z-scores
# --------------------------------------------------------------------------


def test_mcse_z_scores_are_standard_normal():
    # 200 independent replications, stored as 200 coordinates (each an independent
    # set of 4 AR(1) chains with phi = 0.9 and known mean 0).
    x = ar1(0.9, 4, 2000, 200, seed=0)
    se = D.mcse(x)
    z = np.asarray(D.z_score(jnp.mean(x, axis=(0, 1)), 0.0, se))
    assert z.shape == (200,)
    # sd of the sample sd of 200 N(0,1) values is 1/sqrt(2*199) ~ 0.05; ESS noise adds
    # ~1-3 %: [0.8, 1.2] is a ~4 sd band around 1.
    assert 0.8 < np.std(z) < 1.2, np.std(z)
    assert abs(np.mean(z)) < 0.3  # mean of 200 N(0,1): sd 0.07, ~4 sd


def test_mcse_formula():
    x = ar1(0.9, 4, 2000, 200, seed=1)
    ess = np.asarray(D.effective_sample_size(x))
    sd = x.reshape(-1, 200).std(axis=0, ddof=1)
    np.testing.assert_allclose(
        D.mcse(x), sd / np.sqrt(ess), rtol=1e-5
    )  # float32 round-off


def test_ensemble_mcse_iid():
    rng = np.random.default_rng(0)
    pos = rng.standard_normal((1000, 500)).astype(np.float32) * 2.0 + 1.0
    se = np.asarray(D.ensemble_mcse(pos))
    np.testing.assert_allclose(
        se, pos.std(axis=0, ddof=1) / np.sqrt(1000), rtol=1e-5
    )  # same formula, float32 round-off
    z = np.asarray(D.z_score(pos.mean(axis=0), 1.0, se))
    # sd of the sample sd of 500 N(0,1) z-scores is ~0.03: [0.8, 1.2] is > 6 sd.
    assert 0.8 < np.std(z) < 1.2, np.std(z)


def test_z_score_broadcasts():
    z = D.z_score(jnp.array([1.0, 2.0, 4.0]), 1.0, jnp.array([2.0]))
    np.testing.assert_allclose(z, [0.0, 0.5, 1.5])  # exact arithmetic


# --------------------------------------------------------------------------
# Moment errors
# --------------------------------------------------------------------------


def test_moment_errors_formula():
    rng = np.random.default_rng(0)
    pos = rng.standard_normal((50, 3))
    mean = np.array([0.1, -0.2, 0.3])
    cov = np.array([[2.0, 0.3, 0.0], [0.3, 1.0, 0.1], [0.0, 0.1, 0.5]])
    out = D.moment_errors(pos, mean, cov)
    assert isinstance(out, D.MomentErrors)
    mu = pos.mean(axis=0)
    s = np.cov(pos, rowvar=False)
    err = np.abs(mu - mean)
    expected = [
        err.max(),
        (err / np.sqrt(np.diag(cov))).max(),
        np.abs(np.diag(s) / np.diag(cov) - 1).max(),
        np.linalg.norm(s - cov) / np.linalg.norm(cov),
    ]
    # float32 computation vs float64 numpy.
    np.testing.assert_allclose([float(v) for v in out], expected, rtol=1e-4)


def test_moment_errors_exact_draws_small():
    rng = np.random.default_rng(0)
    cov = np.array([[1.0, 0.5], [0.5, 2.0]])
    mean = np.array([1.0, -1.0])
    pos = rng.multivariate_normal(mean, cov, size=20000)
    out = D.moment_errors(pos, mean, cov)
    # Standardised mean error of N = 20000 exact draws has sd 1/sqrt(N) = 0.007: 5 sd.
    assert float(out.mean_std_error) < 0.035
    # Relative variance/covariance errors have sd ~ sqrt(2/N) = 0.01 per entry: ~5-8 sd.
    assert float(out.var_rel_error) < 0.05
    assert float(out.cov_rel_error) < 0.05
    shifted = D.moment_errors(pos + np.array([0.5, 0.0]), mean, cov)
    # A 0.5 shift dominates the ~0.01 sampling error.
    assert abs(float(shifted.mean_abs_error) - 0.5) < 0.05


# --------------------------------------------------------------------------
# MMD
# --------------------------------------------------------------------------


def numpy_median_bandwidth(x, y):
    z = np.concatenate([x, y]).astype(np.float64)
    d = np.sqrt(((z[:, None] - z[None]) ** 2).sum(-1))
    return np.median(d[np.triu_indices(len(z), 1)])


def numpy_mmd(x, y, h):
    x = np.asarray(x, np.float64)
    y = np.asarray(y, np.float64)

    def k(a, b):
        return np.exp(-((a[:, None] - b[None]) ** 2).sum(-1) / (2 * h * h))

    n, m = len(x), len(y)
    kxx, kyy = k(x, x), k(y, y)
    return (
        (kxx.sum() - np.trace(kxx)) / (n * (n - 1))
        + (kyy.sum() - np.trace(kyy)) / (m * (m - 1))
        - 2 * k(x, y).mean()
    )


def test_mmd_matches_bruteforce():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1000, 2)).astype(np.float32)
    y = (rng.standard_normal((1000, 2)) + 0.3).astype(np.float32)
    # The median heuristic uses every 2nd point of each sample (<= 500 per side).
    h = numpy_median_bandwidth(x[::2], y[::2])
    # float32 kernel sums vs float64 numpy.
    np.testing.assert_allclose(D.mmd(x, y), numpy_mmd(x, y, h), rtol=1e-3, atol=1e-6)
    np.testing.assert_allclose(
        D.mmd(x, y, 0.7), numpy_mmd(x, y, 0.7), rtol=1e-3, atol=1e-6
    )


def test_mmd_same_vs_shifted_gaussians():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1000, 2))
    y = rng.standard_normal((1000, 2))
    same = float(D.mmd(x, y, bandwidth=1.0))
    shifted = float(D.mmd(x, y + np.array([1.0, 0.0]), bandwidth=1.0))
    # Null: degenerate U-statistic, fluctuations O(1/n) ~ 7e-4 here; 0.005 is ~7 sd.
    assert abs(same) < 0.005, same
    # Closed form for N(0,I_2) vs N(mu,I_2), h = 1: 2 c (1 - exp(-|mu|^2 / (2 (h^2 +
    # 2)))), c = (h^2 / (h^2 + 2))^(d/2) = 1/3 -> 0.1023.  Non-degenerate: sd ~ 0.011;
    # 0.05 is ~4.5 sd.
    expected = 2.0 / 3.0 * (1.0 - np.exp(-1.0 / 6.0))
    assert abs(shifted - expected) < 0.05, shifted
    # Median-heuristic bandwidth: same qualitative separation (null ~1e-3, shifted
    # ~0.1).
    assert abs(float(D.mmd(x, y))) < 0.005
    assert float(D.mmd(x, y + np.array([1.0, 0.0]))) > 0.05


def test_mmd_5000_points_runs():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5000, 10)).astype(np.float32)
    y = rng.standard_normal((5000, 10)).astype(np.float32)
    val = float(D.mmd(x, y))
    # Null at n = 5000: fluctuations O(1/n) ~ 2e-4; 0.002 is ~10 sd.
    assert np.isfinite(val) and abs(val) < 0.002, val


# --------------------------------------------------------------------------
# Sliced Wasserstein
# --------------------------------------------------------------------------


def test_sliced_wasserstein_1d_shift():
    rng = np.random.default_rng(0)
    x = rng.standard_normal(2000)
    y = rng.standard_normal(3000) + 1.5
    key = jax.random.key(0)
    sw = float(D.sliced_wasserstein(key, x, y))
    # W2(N(0,1), N(1.5,1)) = 1.5; the empirical value is driven by the difference of
    # sample means, sd sqrt(1/2000 + 1/3000) ~ 0.03: 0.15 is ~5 sd.
    assert abs(sw - 1.5) < 0.15, sw
    same = float(D.sliced_wasserstein(key, x, y - 1.5))
    # Same law: empirical W2 ~ 0.05 (tail quantile noise); 0.2 is far below the 1.5
    # signal.
    assert same < 0.2, same


def test_sliced_wasserstein_exact_unequal_sizes():
    rng = np.random.default_rng(0)
    x = rng.standard_normal(40)
    y = rng.standard_normal(60) * 2.0 + 0.5
    # Empirical laws on 40 and 60 points equal the laws of 120 points obtained by
    # repeating each point 3 and 2 times; for equal sizes W2 pairs sorted values.
    xr = np.sort(np.repeat(x, 3))
    yr = np.sort(np.repeat(y, 2))
    expected = np.sqrt(np.mean((xr - yr) ** 2))
    got = float(D.sliced_wasserstein(jax.random.key(1), x, y, num_projections=4))
    np.testing.assert_allclose(
        got, expected, rtol=1e-5
    )  # exact up to float32 round-off
    xs, ys = np.sort(x), np.sort(rng.standard_normal(40))
    got_eq = float(D.sliced_wasserstein(jax.random.key(1), x, ys))
    np.testing.assert_allclose(got_eq, np.sqrt(np.mean((xs - ys) ** 2)), rtol=1e-5)


def test_sliced_wasserstein_3d_shift():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2000, 3))
    y = rng.standard_normal((2000, 3)) + np.array([2.0, 0.0, 0.0])
    sw = float(D.sliced_wasserstein(jax.random.PRNGKey(0), x, y, num_projections=1024))
    # SW2 = |mu| / sqrt(d) = 1.155; 1024 directions give ~1.4 % projection noise and the
    # samples ~1 %: combined sd ~ 0.025, 0.12 is ~5 sd.
    assert abs(sw - 2.0 / np.sqrt(3.0)) < 0.12, sw


# --------------------------------------------------------------------------
# jit, dtypes
# --------------------------------------------------------------------------


def test_jit_matches_eager():
    # Shapes shared with other tests so the eager side is mostly already compiled.
    x = ar1(0.5, 4, 4000, 16, seed=0)
    rng = np.random.default_rng(0)
    a = rng.standard_normal((1000, 2)).astype(np.float32)
    b = (rng.standard_normal((1000, 2)) + 0.5).astype(np.float32)
    key = jax.random.key(0)
    axes = dict(static_argnames=("chain_axis", "sample_axis"))
    pairs = [
        (D.effective_sample_size(x), jax.jit(D.effective_sample_size, **axes)(x)),
        (D.mcse(x), jax.jit(D.mcse, **axes)(x)),
        (
            D.potential_scale_reduction(x, split=False),
            jax.jit(
                D.potential_scale_reduction,
                static_argnames=("chain_axis", "sample_axis", "split"),
            )(x, split=False),
        ),
        (D.potential_scale_reduction(x), jax.jit(D.potential_scale_reduction)(x)),
        (D.ensemble_mcse(a), jax.jit(D.ensemble_mcse)(a)),
        (D.z_score(a, 0.1, 2.0), jax.jit(D.z_score)(a, 0.1, 2.0)),
        (D.mmd(a, b), jax.jit(lambda p, q: D.mmd(p, q))(a, b)),
        (D.mmd(a, b, 0.8), jax.jit(D.mmd)(a, b, 0.8)),  # traced bandwidth
        (
            D.sliced_wasserstein(key, a, b, 64),
            jax.jit(D.sliced_wasserstein, static_argnames="num_projections")(
                key, a, b, num_projections=64
            ),
        ),
    ]
    pairs += list(
        zip(
            D.moment_errors(a, np.zeros(2), np.eye(2)),
            jax.jit(D.moment_errors)(a, np.zeros(2), np.eye(2)),
            strict=True,
        )
    )
    for eager, jitted in pairs:
        # Same XLA program up to fusion/reassociation: float32 round-off.
        np.testing.assert_allclose(eager, jitted, rtol=1e-5, atol=1e-7)


def test_vmap_over_replications():
    x = ar1(0.5, 4, 1000, 6, seed=0).reshape(4, 1000, 2, 3)
    xs = np.stack([x, 2.0 * x])
    batched = jax.vmap(D.effective_sample_size)(xs)
    # ESS is scale invariant; vmap must reproduce the unbatched result (round-off).
    np.testing.assert_allclose(batched[0], batched[1], rtol=1e-4)
    np.testing.assert_allclose(batched[0], D.effective_sample_size(x), rtol=1e-5)


def test_float64_in_float64_out():
    x64_samples = ar1(0.5, 2, 200, 3, seed=0).astype(np.float64)
    rng = np.random.default_rng(0)
    a = rng.standard_normal((100, 2))
    b = rng.standard_normal((80, 2))
    before = jax.config.jax_enable_x64
    with x64():
        xs = jnp.asarray(x64_samples, dtype=jnp.float64)
        pa = jnp.asarray(a, dtype=jnp.float64)
        pb = jnp.asarray(b, dtype=jnp.float64)
        key = jax.random.key(0)
        # Output dtypes from tracing (jax.eval_shape: same trace as a real call,
        # without paying for ten float64 compilations).
        calls = [
            (D.effective_sample_size, (xs,)),
            (D.potential_scale_reduction, (xs,)),
            (D.mcse, (xs,)),
            (D.ensemble_mcse, (pa,)),
            (D.z_score, (pa, 0.0, 1.0)),
            (D.mmd, (pa, pb)),
            (D.mmd, (pa, pb, 1.0)),
            (D.sliced_wasserstein, (key, pa, pb)),
            (D.moment_errors, (pa, jnp.zeros(2), jnp.eye(2))),
        ]
        for fn, args in calls:
            for leaf in jax.tree_util.tree_leaves(jax.eval_shape(fn, *args)):
                assert leaf.dtype == jnp.float64, (fn.__name__, leaf.dtype)
        # And two real float64 computations.
        ess64 = D.effective_sample_size(xs)
        mmd64 = D.mmd(pa, pb)
        assert ess64.dtype == jnp.float64 and mmd64.dtype == jnp.float64
        ess64 = np.asarray(ess64)
    assert jax.config.jax_enable_x64 == before  # the context restored the setting
    ess32 = np.asarray(D.effective_sample_size(x64_samples.astype(np.float32)))
    assert ess32.dtype == np.float32
    np.testing.assert_allclose(ess32, ess64, rtol=1e-3)  # float32 vs float64 round-off


def test_integer_input_promoted_to_float():
    rng = np.random.default_rng(0)
    ints = rng.integers(0, 10, size=(2, 50, 2))
    out = D.potential_scale_reduction(ints)
    assert jnp.issubdtype(out.dtype, jnp.floating) and np.all(np.isfinite(out))


# --------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------

_GOOD = (
    np.zeros((2, 10, 3), np.float32) + np.arange(10, dtype=np.float32)[None, :, None]
)
_PTS = np.ones((5, 2), np.float32)

BAD_INPUTS = [
    (
        "ess 1-D",
        lambda: D.effective_sample_size(np.ones(10)),
        r"samples.*shape \(10,\)",
    ),
    (
        "ess 3 draws",
        lambda: D.effective_sample_size(np.ones((2, 3))),
        r"samples.*3 draws.*at least 4",
    ),
    (
        "ess same axes",
        lambda: D.effective_sample_size(_GOOD, 1, 1),
        r"chain_axis.*sample_axis.*distinct",
    ),
    (
        "ess axis range",
        lambda: D.effective_sample_size(_GOOD, 0, 5),
        r"sample_axis.*=5.*ndim=3",
    ),
    ("ess axis type", lambda: D.effective_sample_size(_GOOD, 0.0, 1), r"chain_axis"),
    (
        "ess complex",
        lambda: D.effective_sample_size(_GOOD.astype(np.complex64)),
        r"samples.*real",
    ),
    (
        "ess method",
        lambda: D.effective_sample_size(_GOOD, method="rank"),
        r"method must be one of",
    ),
    (
        "mcse statistic",
        lambda: D.mcse(_GOOD, statistic="median"),
        r"statistic must be one of",
    ),
    (
        "rhat rank type",
        lambda: D.potential_scale_reduction(_GOOD, rank=1),
        r"rank must be True or False",
    ),
    (
        "acf max_lag",
        lambda: D.autocorrelation(_GOOD, max_lag=10),
        r"max_lag.*\[0, 9\].*10 draws",
    ),
    (
        "rhat 3 draws",
        lambda: D.potential_scale_reduction(np.ones((4, 3))),
        r"samples.*3 draws.*split R-hat",
    ),
    (
        "rhat 1 chain",
        lambda: D.potential_scale_reduction(_GOOD[:1], split=False),
        r"samples.*1 chain",
    ),
    (
        "rhat split type",
        lambda: D.potential_scale_reduction(_GOOD, split="yes"),
        r"split must be True or False",
    ),
    ("mcse 2 draws", lambda: D.mcse(np.ones((4, 2, 3))), r"samples.*2 draws"),
    (
        "ens 1 particle",
        lambda: D.ensemble_mcse(np.ones((1, 3))),
        r"positions.*N >= 2.*\(1, 3\)",
    ),
    ("ens scalar", lambda: D.ensemble_mcse(1.0), r"positions"),
    (
        "z shapes",
        lambda: D.z_score(np.ones(3), np.ones(4), 1.0),
        r"estimate.*\(3,\).*truth.*\(4,\)",
    ),
    (
        "mom positions",
        lambda: D.moment_errors(np.ones(5), np.zeros(1), np.eye(1)),
        r"positions.*\(5,\)",
    ),
    (
        "mom mean",
        lambda: D.moment_errors(_PTS, np.zeros(3), np.eye(2)),
        r"mean.*\(2,\).*\(3,\)",
    ),
    (
        "mom cov",
        lambda: D.moment_errors(_PTS, np.zeros(2), np.eye(3)),
        r"cov.*\(2, 2\).*\(3, 3\)",
    ),
    ("mmd dims", lambda: D.mmd(_PTS, np.ones((5, 3))), r"x and y.*d=2.*d=3"),
    ("mmd 1 point", lambda: D.mmd(np.ones((1, 2)), _PTS), r"x has 1 point"),
    ("mmd 3-D", lambda: D.mmd(np.ones((2, 2, 2)), _PTS), r"x.*\(2, 2, 2\)"),
    ("mmd bw neg", lambda: D.mmd(_PTS, _PTS, -1.0), r"bandwidth.*> 0.*-1.0"),
    ("mmd bw shape", lambda: D.mmd(_PTS, _PTS, np.ones(2)), r"bandwidth.*scalar"),
    (
        "sw dims",
        lambda: D.sliced_wasserstein(jax.random.key(0), _PTS, np.ones((5, 3))),
        r"x and y",
    ),
    (
        "sw nproj 0",
        lambda: D.sliced_wasserstein(jax.random.key(0), _PTS, _PTS, 0),
        r"num_projections.*0",
    ),
    (
        "sw nproj float",
        lambda: D.sliced_wasserstein(jax.random.key(0), _PTS, _PTS, 2.5),
        r"num_projections.*2.5",
    ),
    (
        "sw key batch",
        lambda: D.sliced_wasserstein(
            jax.random.split(jax.random.key(0), 2), _PTS, _PTS
        ),
        r"rng_key.*\(2,\)",
    ),
    (
        "sw key dtype",
        lambda: D.sliced_wasserstein(np.zeros(2, np.float32), _PTS, _PTS),
        r"rng_key.*float32",
    ),
]


@pytest.mark.parametrize(
    "name, call, pattern", BAD_INPUTS, ids=[c[0] for c in BAD_INPUTS]
)
def test_bad_inputs_raise_value_error(name, call, pattern):
    with pytest.raises(ValueError, match=pattern):
        call()


def test_validation_happens_before_tracing():
    # Shape errors surface as ValueError even when the call is being traced by jit.
    f = jax.jit(functools.partial(D.effective_sample_size, chain_axis=0, sample_axis=1))
    with pytest.raises(ValueError, match="samples"):
        f(jnp.ones((2, 3)))


# --------------------------------------------------------------------------
# ArviZ's definitions: rank-normalised, split and plain variants
# --------------------------------------------------------------------------


def awkward_chains(num_draws, seed):
    """4 AR(1) chains, 4 coordinates: plain, skewed (exp), one chain shifted (slow
    Geyer truncation: every pair sum positive), and rounded (ties for the ranks)."""
    x = ar1(0.7, 4, num_draws, 4, seed=seed).astype(np.float64)
    x[..., 1] = np.exp(x[..., 1])
    x[1, :, 2] += 0.3
    x[..., 3] = np.round(x[..., 3])
    return x


@pytest.mark.parametrize("num_draws", [500, 37])
def test_ess_rhat_mcse_match_arviz_on_the_same_chains(num_draws):
    """Every variant against ArviZ's own code on the same float64 chains (even and odd
    draws, ties, a shifted chain). Same estimator, float64: agreement to round-off; the
    issue asks for 1e-6 relative, we check 1e-9."""
    import arviz as az

    x = awkward_chains(num_draws, seed=num_draws)
    ds = az.convert_to_dataset({"x": x})
    with x64():
        xj = jnp.asarray(x)
        for method in D.ESS_METHODS:
            np.testing.assert_allclose(
                np.asarray(D.effective_sample_size(xj, method=method)),
                az.ess(ds, method=method)["x"].values,
                rtol=1e-9,
                err_msg=method,
            )
        for ours, theirs in (
            ({"rank": True}, "rank"),
            ({}, "split"),
            ({"split": False}, "identity"),
        ):
            np.testing.assert_allclose(
                np.asarray(D.potential_scale_reduction(xj, **ours)),
                az.rhat(ds, method=theirs)["x"].values,
                rtol=1e-9,
                err_msg=theirs,
            )
        for statistic in ("mean", "sd"):
            np.testing.assert_allclose(
                np.asarray(D.mcse(xj, statistic=statistic, split=True)),
                az.mcse(ds, method=statistic)["x"].values,
                rtol=1e-9,
                err_msg=statistic,
            )


def test_rank_normalised_rhat_sees_a_scale_difference_plain_rhat_misses():
    """Vehtari et al. (2021) §4.1: chains with equal means but different scales fool
    the plain R-hat; the folded (tail) half of the rank R-hat catches them."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 1000, 1))
    x[0] *= 3.0
    plain = float(D.potential_scale_reduction(x)[0])
    ranked = float(D.potential_scale_reduction(x, rank=True)[0])
    # plain: between-chain spread of means is noise only (|R-1| ~ 1e-3); ranked, folded:
    # the wide chain's |x - median| are ~3x larger: R-hat ~ 1.1 or more
    assert abs(plain - 1.0) < 0.01, plain
    assert ranked > 1.05, ranked


def test_autocorrelation_of_ar1_is_phi_to_the_lag():
    x = ar1(0.8, 8, 4000, 2, seed=1)
    rho = np.asarray(D.autocorrelation(x, max_lag=10))
    assert rho.shape == (11, 2) and np.all(rho[0] == 1.0)
    # rho_t estimates have sd ~ sqrt((1 + phi^2)/(1 - phi^2) / 32000) ~ 0.01 for small
    # t; 0.05 is 5 sd
    np.testing.assert_allclose(
        rho, (0.8 ** np.arange(11))[:, None] * np.ones((1, 2)), atol=0.05
    )


# --------------------------------------------------------------------------
# One layout, checked (issue 9, item 1)
# --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def rwmh_run():
    t = cj.models.targets.standard_gaussian(2)
    algo = cj.vmap_chains(cj.rwmh(t.logdensity_fn, 0.5))
    return cj.sample(
        jax.random.key(1),
        algo,
        algo.init(jax.random.normal(jax.random.key(0), (4, 2))),
        2000,
    )


def layout_warnings(fn, *args, **kwargs):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = fn(*args, **kwargs)
    return out, [w for w in caught if issubclass(w.category, D.LayoutWarning)]


def test_a_run_result_is_taken_directly_chains_first(rwmh_run):
    chains = np.swapaxes(np.asarray(rwmh_run.trace), 0, 1)  # (4 chains, 2000 draws, 2)
    for fn in (
        D.effective_sample_size,
        D.mcse,
        D.potential_scale_reduction,
        D.autocorrelation,
    ):
        got, warned = layout_warnings(fn, rwmh_run)
        np.testing.assert_array_equal(np.asarray(got), np.asarray(fn(chains)))
        assert not warned, fn.__name__
    np.testing.assert_array_equal(np.asarray(D.chains_first(rwmh_run)), chains)


def test_the_drivers_trace_passed_as_chains_first_warns(rwmh_run):
    """The issue's report: cj.sample's (draws, chains, d) trace passed straight in gave
    an ESS above the number of draws, silently. Now both symptoms warn."""
    ess, warned = layout_warnings(D.effective_sample_size, rwmh_run.trace)
    assert np.all(
        np.asarray(ess) > 8000
    )  # the wrong answer itself (4 chains x 2000 draws)
    text = " ".join(str(w.message) for w in warned)
    assert "chain means are autocorrelated along the chain axis" in text
    assert "exceeds the 8000 draws" in text and "pass the RunResult itself" in text
    _, warned = layout_warnings(D.potential_scale_reduction, rwmh_run.trace)
    assert warned  # R-hat sees the same swapped layout
    # stating the axes is a decision: no layout guess, and the right numbers
    ess, warned = layout_warnings(
        D.effective_sample_size, rwmh_run.trace, chain_axis=1, sample_axis=0
    )
    assert not warned
    np.testing.assert_array_equal(
        np.asarray(ess), np.asarray(D.effective_sample_size(rwmh_run))
    )


def test_independent_chains_in_the_right_layout_do_not_warn():
    # 200 chains of 300 draws (more chains than a layout heuristic on shapes would
    # accept)
    x = ar1(0.5, 200, 300, 3, seed=2)
    _, warned = layout_warnings(D.effective_sample_size, x)
    assert not warned
    # mildly antithetic chains (phi = -0.05: ESS = 1.1 MN) are not mistaken for a
    # swapped layout
    ess, warned = layout_warnings(
        D.effective_sample_size, ar1(-0.05, 4, 4000, 2, seed=3)
    )
    assert np.all(np.asarray(ess) > 16000) and not warned


def test_a_streaming_result_is_refused_with_a_message():
    t = cj.models.targets.standard_gaussian(2)
    algo = cj.lmc(t.logdensity_fn, 0.1)
    res = cj.sample(
        jax.random.key(0), algo, algo.init(jnp.zeros((50, 2))), 20, mode="stream"
    )
    with pytest.raises(ValueError, match="mode='stream' keeps moments only"):
        D.effective_sample_size(res)
    with pytest.raises(ValueError, match="a RunResult's layout is known"):
        D.effective_sample_size(
            res._replace(trace=jnp.zeros((20, 50, 2))), chain_axis=0
        )


@pytest.mark.parametrize("value", [0.1, 3.0, 0.0, -7.25])
def test_constant_chains_give_nan_as_documented(value):
    """Issue 8: R-hat of constant chains returned inf (3.0) or 1.18 (0.1) where the
    docstring says nan; ESS returned 2.6 or 4.0. Every chain diagnostic now gives
    nan."""
    x = np.full((4, 100, 2), value, np.float32)
    for fn in (D.potential_scale_reduction, D.effective_sample_size, D.mcse):
        assert np.all(np.isnan(np.asarray(fn(x)))), (fn.__name__, fn(x))
    assert np.all(np.isnan(np.asarray(D.potential_scale_reduction(x, rank=True))))
    for method in D.ESS_METHODS:
        assert np.all(
            np.isnan(np.asarray(D.effective_sample_size(x, method=method)))
        ), method
    # chains that are each constant but differ have not mixed at all: R-hat is +inf
    y = np.concatenate([np.zeros((2, 100, 1)), np.ones((2, 100, 1))]).astype(np.float32)
    assert np.isinf(float(D.potential_scale_reduction(y, split=False)[0]))
