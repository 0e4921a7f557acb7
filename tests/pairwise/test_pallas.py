"""The fused Pallas force kernel (cenlmc_jax/pairwise/pallas.py) against a float64
oracle.

The kernel runs in Pallas' interpret mode on CPU.

The oracle (``oracle_with_bound``) sums docs/algorithms.md's formula (section 4, eqs.
3.19-3.21) pair by pair in float64 with direct differences ``x_j - x_i``, on
the float32-rounded inputs. Every comparison is held to a first-order
rounding-error bound computed pair by pair from the same data, so that a
tolerance is never a number chosen to pass:

* ``|x_j - x_i|²``: ``(d + 16) ε`` relative for direct differences, plus
  ``8 ε a / r`` for the rounding of the centred, η-scaled coordinates
  (``a = |x_i - c| + |x_j - c|``, ``r = |x_j - x_i|``); the Gram identity adds
  ``(d + 2) ε (|x_i - c|² + |x_j - c|²) / r²``.
* ``f_j - f_i``: ``ε (|f_i| + |f_j|)`` absolute; ``exp(log α - log p_j - m)``:
  ``2 ε`` times the size of its arguments; the sum over ``j``: ``N ε``
  relative (worst case of a float32 running sum).
* pairs whose distance lies within that error of ``η`` (or ``R2``, or the
  coincidence floor) may fall on either side: their whole contribution is
  added to the bound and they may change the counts by one each.

The bound carries a factor 2 for second-order terms; a wrong mask, a missed
block or a wrong weight moves the force by a whole pair contribution
(``≥ 1e3`` times the bound here, as ``test_bound_is_tight`` checks).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from scipy.special import gammaln

from cenlmc_jax.ensemble.least_squares import pallas as ls_pallas
from cenlmc_jax.pairwise import (
    coincident_rtol,
    ensemble_force,
    ensemble_force_pallas,
    ensemble_force_reference_numpy,
)
from cenlmc_jax.pairwise import pallas as pair_pallas

EPS32 = 2.0**-24  # unit roundoff of float32
EPS64 = 2.0**-53


def cenlmc_like_inputs(seed: int, n: int, d: int, h: float = 0.05, dtype=np.float32):
    """A CEnLMC-shaped ensemble: x ~ N(0, I), w = x - sqrt(2h) ξ, log p_j = log N(x_j;
    w_j, 2h I).

    f = |x|²/2 (standard Gaussian target). eta and r2 are the 4% and 30%
    quantiles of the pair distances, so a row has ~0.04 N ball neighbours.
    """
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d))
    w = x - math.sqrt(2 * h) * rng.normal(size=(n, d))
    f = 0.5 * np.sum(x * x, axis=1)
    log_p = -0.5 * d * math.log(4 * math.pi * h) - np.sum((x - w) ** 2, axis=1) / (
        4 * h
    )
    iu = np.triu_indices(n, 1)
    dist_x = np.sqrt(np.sum((x[:, None] - x[None]) ** 2, -1))[iu]
    dist_w = np.sqrt(np.sum((w[:, None] - w[None]) ** 2, -1))[iu]
    eta = float(np.quantile(dist_x, 0.04))
    r2 = float(np.quantile(dist_w, 0.3))
    cast = lambda a: np.asarray(a, dtype)  # noqa: E731
    return cast(x), cast(f), cast(log_p), eta, cast(w), r2


def oracle_with_bound(
    x, f, log_p, eta, w=None, r2=None, *, eps=EPS32, gram=False, coincident_rtol=0.0
):
    """Float64 force, counts, and the rounding-error bound of a float computation.

    Returns dict with ``force (N, d)``, ``n_r2``, ``n_ball`` (int arrays),
    ``bound (N,)`` (max-norm bound on the force error per row) and
    ``ambiguous (N,)`` (pairs per row that may fall on either side of a mask).
    Non-finite rows contribute nothing and get 0 (``n_r2`` looks at ``w`` only).
    """
    x = np.asarray(x, np.float64)
    f = np.asarray(f, np.float64)
    log_p = np.asarray(log_p, np.float64)
    n, d = x.shape
    valid_w = np.ones(n, bool) if w is None else np.all(np.isfinite(w), axis=1)
    valid = (
        np.all(np.isfinite(x), axis=1) & np.isfinite(f) & np.isfinite(log_p) & valid_w
    )
    log_alpha = math.log(d) - (
        0.5 * d * math.log(math.pi) + d * math.log(eta) - gammaln(0.5 * d + 1)
    )
    f = np.where(valid, f, 0.0)
    log_s = np.where(valid, log_alpha - log_p, 0.0)
    centre = x[valid].mean(axis=0)
    xc = np.where(valid[:, None], x - centre, 0.0)
    size = np.sum(xc * xc, axis=1)
    if w is not None:
        w = np.asarray(w, np.float64)
        wc = np.where(valid_w[:, None], w - w[valid_w].mean(axis=0), 0.0)
        size_w = np.sum(wc * wc, axis=1)
    big_l = (
        np.abs(log_alpha)
        + abs(math.log(eta))
        + np.abs(np.where(valid, log_p, 0))
        + np.max(np.abs(log_s))
    )

    out = {k: np.zeros(n) for k in ("bound", "ambiguous")}
    force = np.zeros((n, d))
    n_r2 = np.zeros(n, int)
    n_ball = np.zeros(n, int)
    for i in range(n):
        others = np.arange(n) != i
        if w is None:
            near_w = others.copy()
            n_r2[i] = n - 1
            amb_w = np.zeros(n, bool)
        else:
            dist2_w = np.sum((wc - wc[i]) ** 2, axis=1)
            near_w = others & valid_w & valid_w[i] & (dist2_w <= r2 * r2)
            n_r2[i] = near_w.sum()
            tol_w = r2 * r2 * eps * (d + 16) + 8 * eps * r2 * (
                np.sqrt(size_w) + math.sqrt(size_w[i])
            )
            if gram:
                tol_w = tol_w + (w.shape[1] + 2) * eps * (size_w + size_w[i])
            amb_w = others & valid_w & valid_w[i] & (np.abs(dist2_w - r2 * r2) <= tol_w)
            out["ambiguous"][i] += np.sum(amb_w)
        if not valid[i]:
            continue
        dx = xc - xc[i]
        dist2 = np.sum(dx * dx, axis=1)
        r = np.sqrt(dist2)
        a = np.sqrt(size) + math.sqrt(size[i])
        tol_x = eta * eta * eps * (d + 16) + 8 * eps * eta * a
        floor = 0.0
        if gram:
            tol_x = tol_x + (d + 2) * eps * (size + size[i])
            floor = coincident_rtol * (size + size[i])
        in_ball = others & valid & near_w & (dist2 <= eta * eta)
        n_ball[i] = in_ball.sum()
        use = in_ball & (dist2 > floor)
        safe = np.where(dist2 > 0, dist2, 1.0)
        weight = np.where(use, np.exp(log_s) * (f - f[i]) / safe, 0.0)
        force[i] = weight @ dx
        # first-order error of every pair term |W_ij| r_ij (see module docstring)
        term = np.abs(weight) * r
        rel = eps * (n + d + 16 + 2 * big_l + 8 * a / np.where(r > 0, r, np.inf))
        if gram:
            rel = rel + (d + 2) * eps * (size + size[i]) / safe
        err = (
            term * rel + eps * np.exp(log_s) * (np.abs(f) + abs(f[i])) * r / safe * use
        )
        if gram:
            err = err + eps * np.abs(weight) * a  # x_i Σ W_ij cancellation in W @ X
        amb = others & valid & (np.abs(dist2 - eta * eta) <= tol_x) & (near_w | amb_w)
        amb |= others & valid & in_ball & amb_w
        if gram:
            amb |= in_ball & (np.abs(dist2 - floor) <= 2 * floor)
        all_w = np.exp(log_s) * np.abs(f - f[i]) / safe * r * (others & valid)
        out["bound"][i] = 2 * np.sum(err) + np.sum(all_w * amb)
        out["ambiguous"][i] += np.sum(amb & ~amb_w)
    out.update(force=force, n_r2=n_r2, n_ball=n_ball, valid=valid)
    return out


def assert_matches(result, ref, *, label=""):
    force = np.asarray(result.force_sum, np.float64)
    assert force.shape == ref["force"].shape
    assert np.all(np.isfinite(force)), label
    err = np.max(np.abs(force - ref["force"]), axis=1)
    worst = int(np.argmax(err - ref["bound"]))
    assert np.all(err <= ref["bound"]), (
        f"{label}: row {worst} error {err[worst]:.3e} > bound "
        f"{ref['bound'][worst]:.3e} (|F| = {np.max(np.abs(ref['force'][worst])):.3e})"
    )
    for name in ("n_r2", "n_ball"):
        got = np.asarray(getattr(result, name))
        assert got.dtype == np.int32, name
        assert np.all(np.abs(got - ref[name]) <= ref["ambiguous"]), (
            f"{label}: {name} differs beyond ambiguous pairs"
        )


# (n, d, with w) -- n deliberately not a multiple of any block size.
CASES = [(200, 1, False), (333, 3, True), (250, 10, True), (150, 50, False)]


@pytest.mark.parametrize("n, d, with_w", CASES)
def test_direct_matches_float64_oracle(n, d, with_w):
    x, f, log_p, eta, w, r2 = cenlmc_like_inputs(0, n, d)
    kw = dict(w=w, r2=r2) if with_w else {}
    result = ensemble_force_pallas(x, f, log_p, eta, block_rows=32, block_cols=16, **kw)
    ref = oracle_with_bound(x, f, log_p, eta, **kw)
    assert (
        ref["n_ball"].mean() > 2
    )  # the masks select something: the test is not vacuous
    assert_matches(result, ref, label=f"direct n={n} d={d}")
    # this oracle and dense.py's agree: two float64 sums of the same terms
    # in a different order, equal to ~1e-13 of the sum of |terms|
    other = ensemble_force_reference_numpy(x, f, log_p, eta, **kw)
    np.testing.assert_allclose(
        other.force_sum, ref["force"], rtol=0, atol=1e-10 * np.max(np.abs(ref["force"]))
    )
    np.testing.assert_array_equal(other.n_ball, ref["n_ball"])
    np.testing.assert_array_equal(other.n_r2, ref["n_r2"])


@pytest.mark.parametrize("n, d, with_w", [(333, 3, True), (150, 50, False)])
def test_gram_matches_float64_oracle(n, d, with_w):
    x, f, log_p, eta, w, r2 = cenlmc_like_inputs(1, n, d)
    kw = dict(w=w, r2=r2) if with_w else {}
    result = ensemble_force_pallas(
        x, f, log_p, eta, distances="gram", block_rows=16, block_cols=32, **kw
    )
    ref = oracle_with_bound(
        x,
        f,
        log_p,
        eta,
        gram=True,
        coincident_rtol=coincident_rtol(d, np.float32),
        **kw,
    )
    assert_matches(result, ref, label=f"gram n={n} d={d}")


def test_bound_is_tight():
    # The bound must be far below the force itself, or the tests above could
    # not see a wrong mask or a missed block: median ratio below 1e-3.
    x, f, log_p, eta, w, r2 = cenlmc_like_inputs(0, 333, 3)
    ref = oracle_with_bound(x, f, log_p, eta, w=w, r2=r2)
    norm = np.max(np.abs(ref["force"]), axis=1)
    has = norm > 0
    assert np.median(ref["bound"][has] / norm[has]) < 1e-3


def test_nonfinite_rows_and_coincident_pairs():
    x, f, log_p, eta, w, r2 = cenlmc_like_inputs(2, 150, 3)
    x[3] = np.nan
    f[5] = np.inf
    log_p[7] = np.nan
    w[9, 1] = np.inf  # as at CEnLMC's first step, where w = +inf
    x[12], f[12], log_p[12], w[12] = (
        x[11],
        f[11],
        log_p[11],
        w[11],
    )  # an exact duplicate
    result = ensemble_force_pallas(x, f, log_p, eta, w=w, r2=r2)
    ref = oracle_with_bound(x, f, log_p, eta, w=w, r2=r2)
    assert_matches(result, ref, label="non-finite")
    force = np.asarray(result.force_sum)
    for bad in (3, 5, 7, 9):
        assert np.all(force[bad] == 0) and int(result.n_ball[bad]) == 0
    assert int(result.n_r2[9]) == 0  # non-finite w: no R2 neighbours
    assert int(result.n_r2[3]) == ref["n_r2"][3] > 0  # n_r2 looks at w only
    # the duplicate pair is counted in the ball but adds no force
    assert ref["n_ball"][11] >= 1 and int(result.n_ball[11]) == ref["n_ball"][11]


def test_r2_zero_counts_exact_w_duplicates_only():
    # R2 = 0 switches CEnLMC's ensemble off: only identical w are neighbours.
    x, f, log_p, eta, w, _ = cenlmc_like_inputs(5, 100, 2)
    w[1] = w[0]
    w[50] = w[0]
    result = ensemble_force_pallas(x, f, log_p, eta, w=w, r2=0.0)
    expected = np.zeros(100, int)
    expected[[0, 1, 50]] = 2
    np.testing.assert_array_equal(result.n_r2, expected)
    ref = ensemble_force_reference_numpy(x, f, log_p, eta, w=w, r2=0.0)
    np.testing.assert_array_equal(result.n_ball, ref.n_ball)


def test_huge_weight_does_not_wipe_out_other_rows():
    # exp(150) overflows float32: the rows that see the heavy particle get a force
    # beyond the float range (inf is the honest answer); the others must be
    # unaffected -- a single global rescale by the largest weight would
    # underflow all their weights to 0.
    x, f, log_p, eta, _, _ = cenlmc_like_inputs(3, 120, 2)
    near = np.sum((x[:, None] - x[None]) ** 2, axis=-1) <= eta * eta
    np.fill_diagonal(near, False)
    heavy = int(np.argmax(near.sum(axis=1)))  # the particle with the most neighbours
    log_p[heavy] = -150.0
    result = ensemble_force_pallas(x, f, log_p, eta)
    ref = oracle_with_bound(x, f, log_p, eta)
    force = np.asarray(result.force_sum, np.float64)
    sees_heavy = near[:, heavy]
    assert sees_heavy.sum() >= 3 and (~sees_heavy).sum() > 100
    assert not np.any(np.isnan(force))
    huge = np.max(np.abs(ref["force"]), axis=1) > np.finfo(np.float32).max
    assert np.all(np.isinf(force[huge]).any(axis=1))
    ok = ~huge & ~sees_heavy
    err = np.max(np.abs(force[ok] - ref["force"][ok]), axis=1)
    assert np.all(err <= ref["bound"][ok])
    assert np.count_nonzero(force[ok]) > 0


def test_float64_in_float64_out():
    with jax.enable_x64(True):
        x, f, log_p, eta, w, r2 = cenlmc_like_inputs(4, 140, 3, dtype=np.float64)
        result = ensemble_force_pallas(x, f, log_p, eta, w=w, r2=r2)
        assert result.force_sum.dtype == jnp.float64
        ref = oracle_with_bound(x, f, log_p, eta, w=w, r2=r2, eps=EPS64)
        assert_matches(result, ref, label="float64")


def test_jit_and_traced_radii():
    # eta and r2 may be traced (tuned inside a jitted loop): same numbers.
    x, f, log_p, eta, w, r2 = cenlmc_like_inputs(0, 333, 3)
    direct = ensemble_force_pallas(
        x, f, log_p, eta, w=w, r2=r2, block_rows=32, block_cols=16
    )
    jitted = jax.jit(
        lambda e, r: ensemble_force_pallas(
            x, f, log_p, e, w=w, r2=r, block_rows=32, block_cols=16
        )
    )
    traced = jitted(jnp.float32(eta), jnp.float32(r2))
    np.testing.assert_array_equal(np.asarray(traced.n_ball), np.asarray(direct.n_ball))
    # identical programs up to where eta enters: a few ulps of the force
    np.testing.assert_allclose(
        traced.force_sum,
        direct.force_sum,
        rtol=1e-5,
        atol=1e-5 * float(jnp.max(jnp.abs(direct.force_sum))),
    )


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(x=np.zeros((4,))), "x must be an array of shape"),
        (dict(f=np.zeros((5,))), "f must have shape"),
        (dict(eta=0.0), "eta must be"),
        (dict(w=np.zeros((4, 2))), "w and r2 go together"),
        (dict(w=np.zeros((3, 2)), r2=1.0), "w must have the shape of x"),
        (dict(r2=-1.0, w=np.zeros((4, 2))), "r2 must be"),
        (dict(r2=1.0), "w and r2 go together"),
        (dict(block_rows=48), "power of two"),
        (dict(distances="exact"), "distances must be"),
    ],
)
def test_bad_input_raises(kwargs, match):
    args = dict(x=np.zeros((4, 2)), f=np.zeros(4), log_p=np.zeros(4), eta=1.0)
    args.update(kwargs)
    x, f, log_p, eta = (args.pop(k) for k in ("x", "f", "log_p", "eta"))
    with pytest.raises(ValueError, match=match):
        ensemble_force_pallas(x, f, log_p, eta, **args)


@pytest.mark.parametrize("distances", ["direct", "gram"])
def test_kernel_lowers_to_triton_for_cuda(distances, monkeypatch):
    # No GPU here, but JAX lowers for another platform on request, and the
    # Pallas -> Triton-IR translation (where unsupported ops, non-power-of-two
    # tiles and bad dot shapes are rejected) runs in Python. Newer JAX asks
    # which GPU to lower for: answer "an H200" when that hook exists.
    try:
        from jax._src.pallas.triton import gpu_info
    except ImportError:  # JAX 0.10 needs no device description
        pass
    else:
        h200 = gpu_info.get_gpu_info_from_version(gpu_info.GpuVersion.H200)
        monkeypatch.setattr(gpu_info, "get_gpu_info", lambda: h200)

    n, d = 1000, 10
    s = jax.ShapeDtypeStruct
    vec, mat, scalar = s((n,), jnp.float32), s((n, d), jnp.float32), s((), jnp.float32)

    def force(x, f, lp, eta, w, r2):
        return ensemble_force_pallas(
            x, f, lp, eta, w=w, r2=r2, distances=distances, interpret=False
        )

    text = (
        jax.jit(force)
        .trace(mat, vec, vec, scalar, mat, scalar)
        .lower(lowering_platforms=("cuda",))
        .as_text()
    )
    assert "__gpu$xla.gpu.triton" in text


def test_build_and_match_probe_passes_in_interpret_mode():
    """The check benchmarks/gpu_check.py runs before it uses the kernel on a GPU:
    the kernel builds and matches the tiled XLA kernel on a small ensemble --
    forces to 1e-4 of their scale (float32 sums of a few hundred terms in
    another order; a wrong mask or weight moves a row by a whole pair term:
    2e-2 of the scale at the median, 3e-4 at the 1% quantile here) and
    identical ball counts."""
    k1, k2 = jax.random.split(jax.random.key(0))
    x = jax.random.normal(k1, (300, 4))
    f = 0.5 * jnp.sum(x * x, axis=1)
    log_p = jax.random.normal(k2, (300,))
    got = ensemble_force_pallas(x, f, log_p, 1.0, interpret=True)
    ref = ensemble_force(x, f, log_p, 1.0, method="tiled", block_size=64)
    scale = float(jnp.max(jnp.abs(ref.force_sum)))
    assert scale > 0 and float(jnp.mean(ref.n_ball)) > 5  # not a comparison of zeros
    assert float(jnp.max(jnp.abs(got.force_sum - ref.force_sum))) <= 1e-4 * scale
    np.testing.assert_array_equal(np.asarray(got.n_ball), np.asarray(ref.n_ball))


def test_padded_widths_are_pallas_powers_of_two():
    # The kernels' padded widths are computed without importing Pallas (its import
    # is deferred to a launch); they must be what pl.next_power_of_2 gave, floored at
    # Triton's 16: exact integers, so compared exactly.
    for n in range(0, 300):
        want = max(16, pl.next_power_of_2(n))
        assert pair_pallas._padded_width(n) == want, n
        assert ls_pallas._width(n) == want, n
