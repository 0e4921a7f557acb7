"""Tests of the pairwise ensemble force: the dispatch, the dense and the tiled backends
(cenlmc_jax/pairwise/).

Two independent references:

* the float64 NumPy oracle ``ensemble_force_reference_numpy`` (direct
  differences, the formula of docs/algorithms.md §2-4 written out), compared with
  an explicit rounding-error bound, not a tuned tolerance (see
  ``assert_matches_oracle``);
* for the formula itself (``α_d``, signs, the ``1/p_j`` weight), exact
  volumes of balls and the unbiasedness of the estimator for a linear ``f``
  (a Monte-Carlo z-test), which the oracle cannot fake because it shares the
  formula.

How near-threshold pairs are handled: a pair whose exact squared distance is
within the float32 rounding error of ``η²`` (or of ``R2²``) may be decided
either way by float32 code. The oracle marks such pairs "ambiguous": the counts
may differ by at most the number of ambiguous pairs in the row, and the force
by at most their total contribution. Rows without ambiguous pairs must have
exactly equal counts, and most rows have none (asserted, so the test is not
vacuous).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cenlmc_jax.pairwise import (
    DIRECT_MAX_D,
    PairwiseForce,
    default_block_size,
    ensemble_force,
    ensemble_force_reference_numpy,
    ensemble_force_tiled,
    log_alpha_d,
)
from cenlmc_jax.pairwise.algebra import _count_both, max_shared_spread

EPS32 = float(np.finfo(np.float32).eps)


# ----------------------------------------------------------------------------- data


def lmc_like_ensemble(
    seed, n, d, *, h=0.05, scale=1.0, offset=0.0, dtype=np.float32, log_p_shift=0.0
):
    """Particles as after an (En)LMC step on f(x) = |x|²/(2 scale²) (docs/algorithms.md
    §3).

    w = x_prev - h ∇f(x_prev), x = w + sqrt(2h) ξ and the exact Gaussian log density
    log p_j = -(d/2) log(4πh) - |x_j - w_j|²/(4h) (+ log_p_shift, to push the weights
    towards the float32 overflow range in one test).
    """
    rng = np.random.default_rng(seed)
    x_prev = offset + scale * rng.normal(size=(n, d))
    w = x_prev - h * (x_prev - offset) / scale**2
    x = w + math.sqrt(2 * h) * rng.normal(size=(n, d))
    f = 0.5 * np.sum((x - offset) ** 2, axis=1) / scale**2
    log_p = (
        -(d / 2) * math.log(4 * math.pi * h)
        - np.sum((x - w) ** 2, axis=1) / (4 * h)
        + log_p_shift
    )
    return tuple(a.astype(dtype) for a in (x, f, log_p, w))


def eta_for_neighbours(x, k):
    """The radius holding about k neighbours on average (median k-th neighbour
    distance)."""
    x = np.asarray(x, np.float64)
    d2 = np.sum((x[:, None, :] - x[None, :, :]) ** 2, axis=-1)
    return float(np.median(np.sqrt(np.sort(d2, axis=1)[:, k])))


# ---------------------------------------------------------------------- oracle check


def assert_matches_oracle(
    out, x, f, log_p, eta, *, w=None, r2=None, gram, eps=EPS32, max_ambiguous_rows=0.05
):
    """``out`` equals the float64 oracle up to an explicit rounding-error bound.

    Per pair (i, j) in the oracle's ball, with term T_ij = W_ij (x_j - x_i),
    float arithmetic errs by at most ~eps times
      * L_ij = |log α_d| + |log p_j| + |log|g_ij|| + 4: exp of a rounded log-weight
        (relative error = absolute error of the exponent);
      * D_ij = (2d + 4) t_ij / d2_ij with the Gram identity (t = |x̃_i|² + |x̃_j|²:
        absolute error of d², relative to d²), 2(d + 1) with exact differences;
      * X_ij = (|x̃_i| + |x̃_j|) / |x_j - x_i|: the force is Σ W x̃_j - (Σ W) x̃_i;
    so |error_i| <= K eps Σ_j |T_ij| (L_ij + D_ij + X_ij) with K = 4 sqrt(N)
    (N-term sums of rounded terms with mixed signs grow like sqrt(N); 4 is a
    safety factor, not a fit). Pairs whose d² is within the rounding error of
    η² / R2² (or, with the Gram identity, within its coincidence bound) are
    ambiguous: their |T_ij| is added to the allowance, and the counts may
    differ by their number.
    """
    x64 = np.asarray(x, np.float64)
    n, d = x64.shape
    ref = ensemble_force_reference_numpy(x, f, log_p, eta, w=w, r2=r2)
    force = np.asarray(out.force_sum, np.float64)
    n_ball = np.asarray(out.n_ball)
    n_r2 = np.asarray(out.n_r2)
    assert (
        out.force_sum.shape == (n, d)
        and out.n_ball.shape == (n,)
        and out.n_r2.shape == (n,)
    )
    assert out.n_ball.dtype == jnp.int32 and out.n_r2.dtype == jnp.int32
    assert np.all(np.isfinite(force))

    f64 = np.asarray(f, np.float64)
    lp64 = np.asarray(log_p, np.float64)
    valid_w = (
        np.ones(n, bool)
        if w is None
        else np.all(np.isfinite(np.asarray(w, np.float64)), axis=1)
    )
    valid = (
        np.all(np.isfinite(x64), axis=1)
        & np.isfinite(f64)
        & np.isfinite(lp64)
        & valid_w
    )
    xc = np.where(valid[:, None], x64 - x64[valid].mean(axis=0), 0.0)
    sq = np.sum(xc**2, axis=1)
    t = sq[:, None] + sq[None, :]
    dx = xc[None, :, :] - xc[:, None, :]
    d2 = np.sum(dx**2, axis=-1)
    pair = valid[:, None] & valid[None, :] & ~np.eye(n, dtype=bool)
    band = ((2 * d + 4) * t if gram else 4 * (d + 1) * d2) * eps + 2 * eps * eta**2
    ambiguous = pair & (np.abs(d2 - eta**2) <= band)
    # Force only: with the Gram identity such a pair may be dropped as coincident
    # (it is still counted as a neighbour, like in the oracle).
    coincident = (
        pair & (d2 <= 2 * (2 * d + 4) * eps * t) if gram else np.zeros_like(pair)
    )
    in_r2 = pair.copy()
    amb_w = np.zeros_like(pair)
    if w is not None:
        w64 = np.where(valid_w[:, None], np.asarray(w, np.float64), 0.0)
        wc = w64 - w64[valid_w].mean(axis=0)
        sqw = np.sum(wc**2, axis=1)
        dw2 = np.sum((wc[None, :, :] - wc[:, None, :]) ** 2, axis=-1)
        pw = valid_w[:, None] & valid_w[None, :] & ~np.eye(n, dtype=bool)
        bandw = (
            (2 * d + 4) * (sqw[:, None] + sqw[None, :]) if gram else 4 * (d + 1) * dw2
        ) * eps + 2 * eps * r2**2
        amb_w = pw & (np.abs(dw2 - r2**2) <= bandw)
        in_r2 = pw & (dw2 <= r2**2)
    ball = pair & in_r2 & (d2 <= eta**2)

    log_alpha = math.log(d) - (
        0.5 * d * math.log(math.pi) + d * math.log(eta) - math.lgamma(0.5 * d + 1)
    )
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        # g and |T_ij| for every valid pair (ambiguous pairs may sit just outside the
        # ball).
        g = np.where(
            pair & (d2 > 0),
            (f64[None, :] - f64[:, None]) / np.where(d2 > 0, d2, 1),
            0.0,
        )
        weight = np.exp(np.where(valid, log_alpha - lp64, 0.0))[None, :] * g
        term = np.abs(weight) * np.sqrt(d2)  # |T_ij|
        L = (
            abs(log_alpha)
            + np.abs(lp64)[None, :]
            + np.abs(np.log(np.where(g != 0, np.abs(g), 1)))
            + 4
        )
        D = (2 * d + 4) * t / np.where(d2 > 0, d2, 1) if gram else 2 * (d + 1)
        X = (np.sqrt(sq)[:, None] + np.sqrt(sq)[None, :]) / np.where(
            d2 > 0, np.sqrt(d2), 1
        )
        per_pair = np.where(ball, term * (L + D + X), 0.0)
    amb_pairs = (ambiguous | amb_w) & pair
    allowance = 4 * math.sqrt(n) * eps * per_pair.sum(axis=1) + np.where(
        amb_pairs | coincident, term, 0
    ).sum(axis=1)
    allowance += 1e-30  # rows with no term at all must be exactly 0 (up to denormals)
    err = np.max(np.abs(force - ref.force_sum), axis=1)
    bad = err > allowance
    assert not bad.any(), (
        f"{bad.sum()} rows exceed the rounding bound; worst excess ratio "
        f"{np.max(err / allowance):.3g} at row {int(np.argmax(err / allowance))}"
    )
    n_amb = amb_pairs.sum(axis=1)
    assert np.all(np.abs(n_ball - ref.n_ball) <= n_amb)
    assert np.all(np.abs(n_r2 - ref.n_r2) <= amb_w.sum(axis=1))
    clean = n_amb == 0
    np.testing.assert_array_equal(n_ball[clean], ref.n_ball[clean])
    # Non-vacuous: most rows are decided without any near-threshold pair.
    assert clean.mean() >= 1 - max_ambiguous_rows, (
        f"only {clean.mean():.2%} rows without ambiguous pairs"
    )
    return ref


# (method, rows per block); "tiled_cols" is the tiled kernel folding several
# column tiles of 48 per row block (the blockwise combine of the algebra).
METHODS = [("dense", None), ("tiled", 64), ("tiled", None), ("tiled_cols", 64)]


def force(method, block, x, f, log_p, eta, **kw):
    if method == "tiled_cols":
        return ensemble_force_tiled(
            x, f, log_p, eta, block_size=block, block_cols=48, **kw
        )
    return ensemble_force(x, f, log_p, eta, method=method, block_size=block, **kw)


def uses_gram(method, d):
    return method in ("tiled", "tiled_cols") and d > DIRECT_MAX_D


# --------------------------------------------------------------------------- formula


@pytest.mark.parametrize(
    "d, volume",
    [
        (1, lambda e: 2 * e),
        (2, lambda e: math.pi * e**2),
        (3, lambda e: 4 / 3 * math.pi * e**3),
    ],
)
def test_log_alpha_d_known_ball_volumes(d, volume):
    # α_d = d / V_η with the textbook volumes of the interval, disc and ball.
    for eta in (0.1, 1.0, 2.5):
        with jax.enable_x64(True):
            got = float(log_alpha_d(d, eta, jnp.float64))
        assert got == pytest.approx(
            math.log(d / volume(eta)), rel=1e-12, abs=1e-12
        )  # float64 rounding


def test_log_alpha_d_finite_where_alpha_overflows():
    # d = 50, η = 0.1: α_d ≈ e^148 overflows float32; its log must not.
    la = log_alpha_d(50, 0.1, jnp.float32)
    expected = math.log(50) - (
        25 * math.log(math.pi) + 50 * math.log(0.1) - math.lgamma(26)
    )
    assert np.isfinite(float(la))
    assert float(la) == pytest.approx(
        expected, rel=1e-5
    )  # float32 of a value ~148: a few ulp


def test_estimator_unbiased_for_linear_f():
    """For f(x) = a·x and neighbours iid uniform (q = 1/(2L)^d), docs/algorithms.md §2
    gives E[α_d/q · (f_j - f_i)(x_j - x_i)/|x_j - x_i|² 1[ball]] = a exactly
    (E[(a·u)u] = a/d over directions). Query points on a grid with disjoint balls
    give independent estimates: z-test of their mean against a."""
    d, L, eta, n_rand = 2, 1.0, 0.15, 4000
    a = np.array([1.5, -0.7])
    rng = np.random.default_rng(0)
    grid1 = np.arange(
        -0.8, 0.81, 0.4
    )  # spacing 0.4 > 2η: disjoint balls, all inside the box
    queries = np.stack(np.meshgrid(grid1, grid1), -1).reshape(-1, d)
    pts = rng.uniform(-L, L, size=(n_rand, d))
    x = np.concatenate([queries, pts]).astype(np.float32)
    f = (x @ a).astype(np.float32)
    log_p = np.full(len(x), -d * math.log(2 * L), np.float32)
    out = ensemble_force(x, f, log_p, eta)
    est = (
        np.asarray(out.force_sum[: len(queries)], np.float64) / n_rand
    )  # only the random points contribute
    assert np.all(np.asarray(out.n_ball[: len(queries)]) > 0)
    mean = est.mean(axis=0)
    se = est.std(axis=0, ddof=1) / math.sqrt(len(queries))
    z = (mean - a) / se
    assert np.all(np.abs(z) < 4), (
        mean,
        se,
    )  # 4 standard errors: two-sided p ≈ 6e-5 per coordinate


# ------------------------------------------------------------------------ vs oracle


@pytest.mark.parametrize("method, block", METHODS)
@pytest.mark.parametrize(
    "n, d, with_w",
    [
        (300, 2, False),
        (257, 1, True),  # N not a multiple of the block
        (240, 3, True),
        (300, 10, True),
        (200, 10, False),
    ],
)
def test_matches_float64_oracle_random(method, block, n, d, with_w):
    x, f, log_p, w = lmc_like_ensemble(0, n, d)
    eta = eta_for_neighbours(x, 20)
    kw = dict(w=w, r2=eta_for_neighbours(w, 40)) if with_w else {}
    out = force(method, block, x, f, log_p, eta, **kw)
    ref = assert_matches_oracle(out, x, f, log_p, eta, gram=uses_gram(method, d), **kw)
    assert (
        ref.n_ball.mean() > 5
    )  # the balls are populated: the comparison is not of zeros
    if with_w:
        assert 0 < ref.n_r2.mean() < n - 1  # the R2 mask does something


@pytest.mark.parametrize(
    "method, block", [("dense", None), ("tiled", 48), ("tiled_cols", 48)]
)
def test_d50_weights_beyond_float32_range(method, block):
    """d = 50 with log α_d - log p_j around 80 ± 15: exp of the weight alone
    overflows float32 (> e^88.7) for some j, while f differences ~1e-16 keep
    every term and sum representable. The tiled kernel must shift the
    log-weights, the dense one work in log space; the oracle is float64."""
    n, d = 160, 50
    x, f, log_p, w = lmc_like_ensemble(1, n, d, scale=0.05, h=0.01)
    f = (f * 1e-15).astype(np.float32)
    eta = eta_for_neighbours(x, 15)
    la = float(log_alpha_d(d, eta, jnp.float32))
    lw = la - log_p.astype(np.float64)
    log_p = (log_p + (lw.mean() - 80.0)).astype(
        np.float32
    )  # centre the log-weights at 80
    lw = la - log_p.astype(np.float64)
    assert lw.max() > 89  # exp(lw) is inf in float32 for some particles
    out = force(method, block, x, f, log_p, eta)
    ref = assert_matches_oracle(out, x, f, log_p, eta, gram=uses_gram(method, d))
    assert ref.n_ball.mean() > 5


@pytest.mark.parametrize("method, block", METHODS)
def test_offset_ensemble_centring(method, block):
    """All points around 1e3 (float32 resolution there ~6e-5): without centring,
    the Gram identity would compute d² ~ 1 with an error ~ (2d+4)·ε·2·6·10^6 ≈ 23
    and every mask would be noise; with centring the bound uses |x̃|² ~ d."""
    n, d = 256, 6
    x, f, log_p, w = lmc_like_ensemble(2, n, d, offset=1000.0)
    eta, r2 = eta_for_neighbours(x, 20), eta_for_neighbours(w, 40)
    out = force(method, block, x, f, log_p, eta, w=w, r2=r2)
    assert_matches_oracle(out, x, f, log_p, eta, w=w, r2=r2, gram=uses_gram(method, d))


@pytest.mark.parametrize("method, block", METHODS)
def test_two_far_clusters(method, block):
    """Two clusters at ±30 along one axis: centring cannot bring |x̃| below 30,
    so the Gram rounding band ~(2d+4)ε·1800 ≈ 6e-3 is wide; the bound accounts
    for it and rows with near-threshold pairs stay few."""
    n, d = 240, 5
    x, f, log_p, w = lmc_like_ensemble(3, n, d)
    shift = np.zeros(d, np.float32)
    shift[0] = 30.0
    x = x + np.where(np.arange(n)[:, None] < n // 2, shift, -shift).astype(np.float32)
    eta = eta_for_neighbours(x, 20)
    out = force(method, block, x, f, log_p, eta)
    ref = assert_matches_oracle(
        out, x, f, log_p, eta, gram=uses_gram(method, d), max_ambiguous_rows=0.2
    )
    assert ref.n_ball.mean() > 5


# ------------------------------------------------------------------- special rows


@pytest.mark.parametrize("method, block", METHODS)
@pytest.mark.parametrize("d", [2, 8])
def test_isolated_and_all_masked_rows(method, block, d):
    n = 150
    x, f, log_p, w = lmc_like_ensemble(4, n, d)
    eta, r2 = eta_for_neighbours(x, 15), eta_for_neighbours(w, 40)
    x[0] = 50.0  # far from everyone: no η-neighbour
    w[
        1
    ] = (
        -50.0
    )  # far from everyone in w-space: no R2-neighbour, so all of its pairs are masked
    out = force(method, block, x, f, log_p, eta, w=w, r2=r2)
    assert int(out.n_ball[0]) == 0 and np.all(np.asarray(out.force_sum[0]) == 0)
    assert (
        int(out.n_r2[1]) == 0
        and int(out.n_ball[1]) == 0
        and np.all(np.asarray(out.force_sum[1]) == 0)
    )
    assert_matches_oracle(out, x, f, log_p, eta, w=w, r2=r2, gram=uses_gram(method, d))


@pytest.mark.parametrize("method, block", METHODS)
@pytest.mark.parametrize("d", [2, 8])
def test_nonfinite_rows_are_ignored(method, block, d):
    """w = +inf rows (CEnLMC init), NaN in x, inf in f and -inf in log_p: those
    rows get 0 force / 0 n_ball (n_r2 = 0 for the non-finite w), and the other
    rows equal the result on the ensemble without them."""
    n = 160
    x, f, log_p, w = lmc_like_ensemble(5, n, d)
    eta, r2 = eta_for_neighbours(x, 15), eta_for_neighbours(w, 40)
    w[[3, 40]] = np.inf
    x[7, 0] = np.nan
    f[11] = np.inf
    log_p[19] = -np.inf
    bad = np.array([3, 40, 7, 11, 19])
    good = np.setdiff1d(np.arange(n), bad)
    out = force(method, block, x, f, log_p, eta, w=w, r2=r2)
    assert np.all(np.isfinite(np.asarray(out.force_sum)))
    assert np.all(np.asarray(out.force_sum[bad]) == 0) and np.all(
        np.asarray(out.n_ball[bad]) == 0
    )
    assert np.all(np.asarray(out.n_r2[np.array([3, 40])]) == 0)
    # n_r2 lives in w-space only: rows 7, 11, 19 have a finite w and keep their
    # w-neighbours.
    sub = force(method, block, x[good], f[good], log_p[good], eta, w=w[good], r2=r2)
    np.testing.assert_array_equal(np.asarray(out.n_ball[good]), np.asarray(sub.n_ball))
    scale = np.abs(np.asarray(sub.force_sum)).max()
    # Same centred inputs, same pairs; only the matmul blocking over N differs: float32
    # rounding.
    np.testing.assert_allclose(
        np.asarray(out.force_sum[good]),
        np.asarray(sub.force_sum),
        rtol=0,
        atol=1e-5 * scale,
    )
    assert_matches_oracle(out, x, f, log_p, eta, w=w, r2=r2, gram=uses_gram(method, d))


@pytest.mark.parametrize("method, block", METHODS)
def test_all_rows_nonfinite_w(method, block):
    # The CEnLMC initial state: every w = +inf. Everything is 0, nothing is NaN.
    x, f, log_p, w = lmc_like_ensemble(6, 100, 4)
    w[:] = np.inf
    out = force(method, block, x, f, log_p, 1.0, w=w, r2=0.5)
    assert np.all(np.asarray(out.force_sum) == 0)
    assert np.all(np.asarray(out.n_r2) == 0) and np.all(np.asarray(out.n_ball) == 0)


@pytest.mark.parametrize("method, block", METHODS)
@pytest.mark.parametrize("d", [1, 10])
def test_coincident_particles(method, block, d):
    """Exact duplicates contribute 0 force and count as neighbours; nothing is
    NaN. In d = 10 a pair at distance 1e-5 lies below the Gram identity's
    resolution: the bound treats it as ambiguous (dropped or kept)."""
    n = 120
    x, f, log_p, w = lmc_like_ensemble(7, n, d)
    x[10:20] = x[0]  # ten copies of particle 0
    f[10:20] = f[0]
    x[30] = x[31] + 1e-5
    f[30] = f[31] + np.float32(1e-5)
    eta = eta_for_neighbours(x, 20)
    out = force(method, block, x, f, log_p, eta)
    assert np.all(np.isfinite(np.asarray(out.force_sum)))
    ref = assert_matches_oracle(out, x, f, log_p, eta, gram=uses_gram(method, d))
    assert np.all(ref.n_ball[[0] + list(range(10, 20))] >= 10)


def test_huge_r2_equals_no_w():
    # Every pair within R2: the w mask is all ones, so force and n_ball are those
    # without w.
    x, f, log_p, w = lmc_like_ensemble(8, 200, 5)
    eta = eta_for_neighbours(x, 20)
    a = ensemble_force(x, f, log_p, eta, w=w, r2=1e3, method="tiled")
    b = ensemble_force(x, f, log_p, eta, method="tiled")
    np.testing.assert_array_equal(np.asarray(a.n_r2), np.full(200, 199))
    np.testing.assert_array_equal(np.asarray(a.n_ball), np.asarray(b.n_ball))
    np.testing.assert_array_equal(
        np.asarray(a.force_sum), np.asarray(b.force_sum)
    )  # same float ops


def test_no_w_gives_n_minus_one():
    x, f, log_p, _ = lmc_like_ensemble(9, 77, 3)
    for method in ("dense", "tiled"):
        out = ensemble_force(x, f, log_p, 1.0, method=method)
        np.testing.assert_array_equal(np.asarray(out.n_r2), np.full(77, 76))


# ------------------------------------------------------------------ blocking, jit


@pytest.mark.parametrize("d", [2, 7])
def test_block_size_does_not_matter(d):
    x, f, log_p, w = lmc_like_ensemble(10, 203, d)
    eta, r2 = eta_for_neighbours(x, 20), eta_for_neighbours(w, 40)
    outs = [
        ensemble_force(x, f, log_p, eta, w=w, r2=r2, method="tiled", block_size=b)
        for b in (1, 7, 203, 300)
    ]
    for o in outs[1:]:
        np.testing.assert_array_equal(np.asarray(o.n_ball), np.asarray(outs[0].n_ball))
        np.testing.assert_array_equal(np.asarray(o.n_r2), np.asarray(outs[0].n_r2))
        scale = np.abs(np.asarray(outs[0].force_sum)).max()
        # Rows are computed independently; only the matmul kernel's blocking may change
        # rounding.
        np.testing.assert_allclose(
            np.asarray(o.force_sum),
            np.asarray(outs[0].force_sum),
            rtol=0,
            atol=1e-5 * scale,
        )


def test_default_block_size_respects_budget():
    for n in (10, 1000, 4096, 16384, 10**6):
        for with_w in (False, True):
            b = default_block_size(n, with_w=with_w)
            assert 1 <= b <= -(-n // 8) * 8 and (b % 8 == 0 or b < 8)
            live = 5 if with_w else 3
            assert (
                b * n * 4 * live <= 64 * 2**20 or b == 1
            )  # the 64 MiB cap of the docstring
            if n <= 10**5:
                assert b >= 16 or b >= n  # small enough N: never starved blocks


@pytest.mark.parametrize("method", ["dense", "tiled"])
def test_jit_matches_eager_and_traced_radii(method):
    x, f, log_p, w = lmc_like_ensemble(11, 130, 4)
    eta, r2 = eta_for_neighbours(x, 20), eta_for_neighbours(w, 40)
    eager = ensemble_force(x, f, log_p, eta, w=w, r2=r2, method=method)
    jitted = jax.jit(functools.partial(ensemble_force, method=method))(
        x, f, log_p, eta, w=w, r2=r2
    )
    for a, b in zip(eager, jitted, strict=True):
        # The eager call runs the same jitted kernel; only the scalar eta/r2
        # (Python float vs traced array) may change constant folding: 1e-6 relative.
        scale = float(np.abs(eager.force_sum).max())
        np.testing.assert_allclose(
            np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-6 * scale
        )


def test_auto_picks_dense_for_small_and_tiled_for_large():
    x, f, log_p, _ = lmc_like_ensemble(12, 64, 3)
    a = ensemble_force(x, f, log_p, 1.0)
    b = ensemble_force(x, f, log_p, 1.0, method="dense")
    np.testing.assert_array_equal(np.asarray(a.force_sum), np.asarray(b.force_sum))
    x, f, log_p, _ = lmc_like_ensemble(12, 65, 3)
    a = ensemble_force(x, f, log_p, 1.0)
    b = ensemble_force(x, f, log_p, 1.0, method="tiled")
    np.testing.assert_array_equal(np.asarray(a.force_sum), np.asarray(b.force_sum))


# ------------------------------------------------------------------------- float64


@pytest.mark.parametrize("method, d", [("dense", 3), ("tiled", 2), ("tiled", 9)])
def test_float64_in_float64_out(method, d):
    x, f, log_p, w = lmc_like_ensemble(13, 150, d, dtype=np.float64)
    eta, r2 = eta_for_neighbours(x, 20), eta_for_neighbours(w, 40)
    with jax.enable_x64(True):
        x, f, log_p, w = (jnp.asarray(a) for a in (x, f, log_p, w))
        out = ensemble_force(x, f, log_p, eta, w=w, r2=r2, method=method)
        assert out.force_sum.dtype == jnp.float64
        # The float64 bound is 2^29 times tighter than the float32 one.
        eps64 = float(np.finfo(np.float64).eps)
        assert_matches_oracle(
            out, x, f, log_p, eta, w=w, r2=r2, gram=uses_gram(method, d), eps=eps64
        )


# --------------------------------------------------------------------- bad inputs


def _ok():
    x, f, log_p, w = lmc_like_ensemble(14, 10, 2)
    return x, f, log_p, w


@pytest.mark.parametrize(
    "change, match",
    [
        (dict(x=np.zeros(10, np.float32)), "x must be an array of shape"),
        (dict(f=np.zeros(9, np.float32)), "f must have shape"),
        (dict(log_p=np.zeros((10, 1), np.float32)), "log_p must have shape"),
        (dict(w=np.zeros((10, 3), np.float32), r2=0.1), "w must have the shape of x"),
        (dict(eta=0.0), "eta must be"),
        (dict(eta=-1.0), "eta must be"),
        (dict(eta=float("nan")), "eta must be"),
        (dict(w="ok", r2=-0.1), "r2 must be"),
        (dict(w="ok", r2=None), "r2 is None"),
        (dict(r2=0.1), "w is None"),
        (dict(method="sparse"), "method must be one of"),
        (dict(method="tiled", block_size=0), "block_size must be an integer >= 1"),
        (dict(method="tiled", block_size=2.5), "block_size must be an integer"),
        (dict(precision="nonsense"), "precision must be"),
    ],
)
def test_bad_input_raises_value_error(change, match):
    x, f, log_p, w = _ok()
    args = dict(
        x=x,
        f=f,
        log_p=log_p,
        eta=0.5,
        w=None,
        r2=None,
        method="auto",
        block_size=None,
        precision=None,
    )
    args.update(change)
    if isinstance(args["w"], str):
        args["w"] = w
    with pytest.raises(ValueError, match=match):
        ensemble_force(
            args["x"],
            args["f"],
            args["log_p"],
            args["eta"],
            w=args["w"],
            r2=args["r2"],
            method=args["method"],
            block_size=args["block_size"],
            precision=args["precision"],
        )


def test_returns_pairwise_force_namedtuple():
    x, f, log_p, _ = _ok()
    out = ensemble_force(x, f, log_p, 0.5)
    assert isinstance(out, PairwiseForce) and out.force_sum.dtype == jnp.float32


@pytest.mark.parametrize("block_cols", [None, 32])
@pytest.mark.parametrize("d", [2, 6])
def test_tiled_huge_weight_spread_keeps_every_row(d, block_cols):
    """One particle with log p = -150 (a weight e^150 times the others, beyond
    float32's exponent range): rows that see it get inf (the true sum is not
    representable), every other row must match the float64 oracle -- a single
    global rescale would underflow their weights to 0."""
    rng = np.random.default_rng(3)
    n = 120
    x = rng.standard_normal((n, d)).astype(np.float32)
    f = (0.5 * np.sum(x**2, axis=1)).astype(np.float32)
    log_p = rng.normal(-2.0, 0.5, n).astype(np.float32)
    eta = 0.8 if d == 2 else 2.0  # a ball holding a few dozen neighbours at this N, d
    near = np.sum((x[:, None] - x[None]) ** 2, axis=-1) <= eta * eta
    np.fill_diagonal(near, False)
    heavy = int(np.argmax(near.sum(axis=1)))
    log_p[heavy] = -150.0
    res = ensemble_force_tiled(x, f, log_p, eta, block_size=16, block_cols=block_cols)
    ref = ensemble_force_reference_numpy(x, f, log_p, eta)
    force = np.asarray(res.force_sum, np.float64)
    sees = near[:, heavy]
    assert sees.sum() >= 3 and (~sees).sum() > 60
    assert not np.any(np.isnan(force))
    ok = ~sees
    ok[heavy] = True  # the heavy particle's own row uses ordinary weights
    scale = np.max(np.abs(ref.force_sum[ok]), axis=1) + 1e-30
    rel = np.max(np.abs(force[ok] - ref.force_sum[ok]), axis=1) / scale
    # float32 sums of <= 120 terms of one sign pattern: 1e-3 leaves room for
    # cancellation; the bug this guards against gives a relative error of 1
    assert np.all(rel < 1e-3), rel.max()
    assert np.count_nonzero(force[ok]) > 0.5 * ok.sum()


@pytest.mark.parametrize("d", [2, 6])
def test_column_tile_of_heavy_particles_leaves_other_rows(d):
    """A column tile holding only heavy particles (log p = -150: weights e^150
    times the others, beyond float32) has no spread, so it takes one shift for
    the tile, ~150 nats above the other tiles'. A row that uses none of its
    columns must not take that shift: rescaling its other tiles' sums by
    e^-150 would underflow them to 0. Those rows must match the float64
    oracle (as in the test above); rows that see a heavy particle are beyond
    the float range and may be inf, never NaN."""
    rng = np.random.default_rng(4)
    n, tile = 160, 16
    x = rng.standard_normal((n, d)).astype(np.float32)
    centre = x[0].copy()
    x = x[np.argsort(np.sum((x - centre) ** 2, axis=1))]  # the first tile: one cluster
    f = (0.5 * np.sum(x**2, axis=1)).astype(np.float32)
    log_p = rng.normal(-2.0, 0.5, n).astype(np.float32)
    log_p[:tile] = -150.0
    eta = 0.6 if d == 2 else 1.6
    near = np.sum((x[:, None] - x[None]) ** 2, axis=-1) <= eta * eta
    np.fill_diagonal(near, False)
    sees = near[:, :tile].any(axis=1)
    assert sees.sum() >= 3 and (~sees).sum() > 60
    spread = float(log_p[tile:].max() - log_p[tile:].min())
    assert (
        spread < max_shared_spread(np.float32) < 140
    )  # the other tiles share a shift too
    res = ensemble_force_tiled(x, f, log_p, eta, block_size=16, block_cols=tile)
    ref = ensemble_force_reference_numpy(x, f, log_p, eta)
    force = np.asarray(res.force_sum, np.float64)
    assert not np.any(np.isnan(force))
    ok = ~sees
    scale = np.max(np.abs(ref.force_sum[ok]), axis=1) + 1e-30
    rel = np.max(np.abs(force[ok] - ref.force_sum[ok]), axis=1) / scale
    # float32 sums of <= 160 terms: 1e-3 leaves room for cancellation; the
    # bug this guards against gives a relative error of 1
    assert np.all(rel < 1e-3), rel.max()
    assert np.count_nonzero(force[ok]) > 0.5 * ok.sum()


# ------------------------------------------------------------- block size by d (issue
# 17)


def test_default_block_size_by_d_values():
    """The rule of ``default_block_size(n, d=d)``: at least 2 (d + 1) rows, the memory
    cap first."""
    for n in (1000, 4096, 8192, 16384):
        for with_w in (False, True):
            old = default_block_size(n, with_w=with_w)
            # d = 2, 10, 30 keep the rule by n alone up to N = 16384 (measured: larger
            # blocks were slower there)
            for d in (2, 10, 30):
                assert default_block_size(n, with_w=with_w, d=d) == old
    # d = 100: the floor 2 (d + 1) = 202 rows, spread evenly (82 blocks of 200 at N =
    # 16384) and rounded to 8
    assert default_block_size(16384, d=100) == 200
    assert default_block_size(8192, d=100) == 200
    assert (
        default_block_size(4096, d=100) == 256
    )  # the cache target already gives more rows
    assert default_block_size(1000, d=100) == 1000
    # The memory cap wins over the floor: 64 MiB / (3 (B, n) float32 temporaries) = 341
    # rows -> 336, with w (5 temporaries) 204 -> 200; at huge n a handful of rows,
    # whatever d.
    assert default_block_size(16384, d=1000) == 336
    assert default_block_size(16384, d=1000, with_w=True) == 200
    assert default_block_size(10**6, d=100) == default_block_size(10**6) == 5
    assert default_block_size(10**6, d=1000, with_w=True) == 3
    for n in (10, 1000, 4096, 16384, 65536, 10**6):
        for with_w in (False, True):
            live = 5 if with_w else 3
            prev = 0
            for d in (None, 1, 2, 10, 30, 50, 100, 200, 1000):
                b = default_block_size(n, with_w=with_w, d=d)
                assert (
                    b * n * 4 * live <= 64 * 2**20 or b == 1
                )  # the 64 MiB cap of the docstring
                assert 1 <= b <= -(-n // 8) * 8 and (b % 8 == 0 or b < 8)
                assert b >= prev  # more rows for larger d, never fewer
                prev = b


def test_default_block_by_d_matches_oracle_d100(monkeypatch):
    """The force with the d-aware default equals the float64 oracle at d = 100.

    At a small N every default is one block; the cache target is shrunk so that
    the rule by N alone would take 32 rows, and the d-aware one takes
    2 (d + 1) = 202 rows spread over 2 blocks of 136 (15 padded rows): the
    force is then folded over several, padded blocks of the new size.
    """
    from cenlmc_jax.pairwise import tiled
    from cenlmc_jax.pairwise.algebra import finish, prepare

    n, d = 257, 100
    monkeypatch.setattr(tiled, "TILE_TARGET_BYTES", n * 4 * 32)
    assert tiled.default_block_size(n) == 32
    assert tiled.default_block_size(n, d=d) == 136
    x, f, log_p, _ = lmc_like_ensemble(3, n, d)
    eta = eta_for_neighbours(x, 20)

    def run(
        x, f, log_p
    ):  # a fresh jit: traced with the patched target, not a cached default
        p = prepare(x, f, log_p, eta)
        return finish(tiled.tiled_partial(p, p), p, n)

    out = jax.jit(run)(jnp.asarray(x), jnp.asarray(f), jnp.asarray(log_p))
    ref = assert_matches_oracle(out, x, f, log_p, eta, gram=True)
    assert ref.n_ball.mean() > 5  # populated balls: the comparison is not of zeros


@pytest.mark.parametrize("cols", [1, 32, 1000, 2**15, 2**16])
def test_packed_counts_equal_two_sums(cols):
    # The tile kernel counts both masks in one int32 sum, a + (b << shift), where the
    # packed value fits (< 2^31) and by two sums beyond (2^15 columns and up): the
    # counts are integers, so they must equal NumPy's row sums exactly. Densities 0.5
    # and 0.9 (seed 0): every row's counts are far from 0 and from the full row, and
    # the all-true row is the largest packed value there is.
    rng = np.random.default_rng(0)
    a = rng.random((3, cols)) < 0.5
    b = rng.random((3, cols)) < 0.9
    a[0], b[0] = True, True
    n_a, n_b = jax.jit(_count_both)(jnp.asarray(a), jnp.asarray(b))
    assert n_a.dtype == n_b.dtype == jnp.int32
    np.testing.assert_array_equal(np.asarray(n_a), a.sum(axis=1))
    np.testing.assert_array_equal(np.asarray(n_b), b.sum(axis=1))
