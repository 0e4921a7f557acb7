"""The block-sparse ensemble force (cenlmc_jax/pairwise: tiled and Pallas backends)
against the float64 oracle.

Block-sparse sums sort the particles along a Hilbert curve, bound every tile
by a box in x (and in w) and skip the tile pairs whose boxes are farther
apart than η (R2) by more than the rounding of the distances. Skipping must
change nothing but the order of the sums, so every test holds the result to
the same references as the dense tiles:

* ``assert_matches_oracle`` of ``test_pairwise`` (float64 direct
  differences with a pair-by-pair rounding bound; counts exact except for
  pairs within rounding of a threshold, which most rows do not have);
* ``oracle_with_bound`` of ``test_pairwise_pallas`` for the Pallas kernel.

The tiles here are small (16 particles) so that a few hundred particles make
dozens of tiles and most tile pairs are skipped; each test checks that tiles
were skipped (``visited < 1``), or the comparison would only repeat the dense
one. ``max_active=1`` keeps the block-sparse path even where it visits most
tiles (by default it hands such ensembles to the dense tiles).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_pairwise import assert_matches_oracle, eta_for_neighbours, lmc_like_ensemble
from test_pallas import assert_matches, cenlmc_like_inputs, oracle_with_bound

from cenlmc_jax import pairwise
from cenlmc_jax.pairwise import (
    AUTO_SPARSE_RULE,
    DIRECT_MAX_D,
    coincident_rtol,
    ensemble_force,
    ensemble_force_pallas,
    ensemble_force_reference_numpy,
    ensemble_force_tiled,
)
from cenlmc_jax.pairwise.algebra import prepare, tile_spec
from cenlmc_jax.pairwise.pallas import (
    kernel_options,
    sparse_list_len,
    sparse_tile_lists,
)
from cenlmc_jax.pairwise.sparsity import (
    TileBoxes,
    hilbert_key,
    sort_spatially,
    tiles_apart,
)
from cenlmc_jax.pairwise.tiled import sparse_capacity, sparse_plan

TILE = 16  # rows and columns per tile in these tests


def sparse(x, f, log_p, eta, **kw):
    return ensemble_force_tiled(
        x,
        f,
        log_p,
        eta,
        block_sparse=True,
        block_size=TILE,
        block_cols=TILE,
        group=8,
        max_active=1.0,
        **kw,
    )


def visited(x, f, log_p, eta, w=None, r2=None):
    """Fraction of tile pairs the block-sparse plan of these tests visits."""
    n, d = np.shape(x)
    _, p = sort_spatially(
        prepare(
            jnp.asarray(x),
            jnp.asarray(f),
            jnp.asarray(log_p),
            eta,
            None if w is None else jnp.asarray(w),
            r2,
        )
    )
    plan = sparse_plan(
        p, TILE, TILE, sparse_capacity(n, TILE, TILE, 1.0), tile_spec(d, p.x.dtype)
    )
    return int(plan.n_pairs) / (-(-n // TILE)) ** 2


def gram(d):
    return d > DIRECT_MAX_D


# --------------------------------------------------------------------------- order


@pytest.mark.parametrize("k, bits", [(2, 5), (3, 3), (5, 2)])
def test_hilbert_key_is_a_bijection_along_adjacent_cells(k, bits):
    # Every cell of the 2^bits grid gets its own index, and consecutive
    # indices are cells one step apart (the defining property of the curve).
    grid = np.stack(np.meshgrid(*[np.arange(2**bits)] * k, indexing="ij"), -1).reshape(
        -1, k
    )
    key = np.asarray(hilbert_key(jnp.asarray(grid, jnp.int32), bits))
    assert sorted(key.tolist()) == list(range(len(grid)))
    steps = np.abs(np.diff(grid[np.argsort(key)], axis=0)).sum(axis=1)
    assert np.all(steps == 1)


def test_tiles_apart_never_separates_a_pair_the_kernel_keeps():
    """Boxes whose gap is η(1 + δ) for δ down to 1e-7: a pair at exactly the
    gap is within η² in float32 only if δ is below rounding; the test must
    call the tiles apart only when the kernel's own d² exceeds η²."""
    eta = np.float32(0.7)
    for delta in (1e-3, 1e-5, 1e-6, 2e-7, 0.0):
        gap = np.float32(eta * (1 + delta))
        a = np.array(
            [[0.0, 0.0], [0.3, 0.1]], np.float32
        )  # two particles, one at the box corner (0.3, 0.1)
        b = a + np.array(
            [0.3 + gap, 0.0], np.float32
        )  # b's corner at x = 0.3 + 0.3 + gap: the boxes are gap apart
        d2 = (
            np.float32(b[0, 0] - a[1, 0]) ** 2 + np.float32(b[0, 1] - a[1, 1]) ** 2
        )  # the kernel's direct d²
        boxes = [
            TileBoxes(
                jnp.asarray(v.min(0)),
                jnp.asarray(v.max(0)),
                jnp.asarray(np.max(np.sum(v**2, 1))),
            )
            for v in (a, b)
        ]
        for distances in ("direct", "gram"):
            apart = bool(
                tiles_apart(
                    boxes[0],
                    boxes[1],
                    jnp.float32(eta * eta),
                    tile_spec(2, jnp.float32, distances=distances),
                )
            )
            if d2 <= eta * eta:
                assert not apart, (delta, distances)
        assert apart == (
            delta >= 1e-5
        )  # far enough beyond rounding: skipped (the test is not vacuous)


# ------------------------------------------------------------------- vs the oracle


@pytest.mark.parametrize(
    "n, d, with_w",
    [
        (601, 1, True),
        (601, 2, True),
        (601, 2, False),
        (801, 3, True),
        (500, 4, False),
        (500, 5, True),
        (400, 7, True),
        (400, 10, False),
    ],
)
def test_matches_float64_oracle(n, d, with_w):
    # N = 601, 801, 500, 400: not multiples of the 16-particle tiles. Small
    # radii (10 x-neighbours, 20 w-neighbours) so that at d <= 3 most tile
    # pairs are skipped; at d >= 4 these N leave no box apart (the skipping
    # of Gram tiles is tested on clustered ensembles below).
    x, f, log_p, w = lmc_like_ensemble(20 + d, n, d)
    eta = eta_for_neighbours(x, 10)
    kw = dict(w=w, r2=eta_for_neighbours(w, 20)) if with_w else {}
    ref = assert_matches_oracle(
        sparse(x, f, log_p, eta, **kw), x, f, log_p, eta, gram=gram(d), **kw
    )
    assert ref.n_ball.mean() > 0.5  # populated balls: not a comparison of zeros
    if d <= 3:
        frac = visited(x, f, log_p, eta, **kw)
        assert frac < (0.6 if d <= 2 else 0.8), (
            frac
        )  # tile pairs were skipped (at d <= 2: most of them)


@pytest.mark.parametrize(
    "kind, d",
    [("skewed", 3), ("clustered", 3), ("clustered", 6), ("offset", 3), ("line", 3)],
)
def test_awkward_ensembles(kind, d):
    """Skewed (coordinate scales 1 : 30), two far clusters (±30: the Gram
    bound, d = 6, is wide there, and the boxes of the two clusters are apart),
    an ensemble at +100 (float32 spacing 8e-6 there) and a 1-D line embedded
    in d = 3 (every key coordinate but one constant)."""
    n = 480
    x, f, log_p, w = lmc_like_ensemble(30, n, d)
    if kind == "skewed":
        x[:, 0] *= 30
        w[:, 0] *= 30
    elif kind == "clustered":
        shift = np.where(np.arange(n)[:, None] < n // 2, 30.0, -30.0) * np.eye(d)[0]
        x, w = (x + shift).astype(np.float32), (w + shift).astype(np.float32)
    elif kind == "offset":
        x, w = x + np.float32(100), w + np.float32(100)
    else:
        x[:, 1:] = 0.5
        w[:, 1:] = 0.5
    eta = eta_for_neighbours(x, 12)
    r2 = eta_for_neighbours(w, 24)
    out = sparse(x, f, log_p, eta, w=w, r2=r2)
    ref = assert_matches_oracle(
        out, x, f, log_p, eta, w=w, r2=r2, gram=gram(d), max_ambiguous_rows=0.2
    )
    assert ref.n_ball.mean() > 1
    assert visited(x, f, log_p, eta, w=w, r2=r2) < (
        0.6 if kind == "clustered" else 1.0
    )  # tiles were skipped


def test_d50_principal_axes_key_and_weights_beyond_float32():
    """d = 50 (the key uses the 5 leading principal axes), log-weights around
    80 ± 15 (exp overflows float32 for some columns, one shared shift fits):
    as test_pairwise's d = 50 test, through the block-sparse path."""
    n, d = 160, 50
    x, f, log_p, w = lmc_like_ensemble(1, n, d, scale=0.05, h=0.01)
    f = (f * 1e-15).astype(np.float32)
    eta = eta_for_neighbours(x, 15)
    la = float(pairwise.log_alpha_d(d, eta, jnp.float32))
    log_p = (log_p + (np.mean(la - log_p.astype(np.float64)) - 80.0)).astype(np.float32)
    assert (
        np.max(la - log_p.astype(np.float64)) > 89
    )  # exp(log s) is inf in float32 for some particles
    out = sparse(x, f, log_p, eta)
    ref = assert_matches_oracle(out, x, f, log_p, eta, gram=True)
    assert ref.n_ball.mean() > 5


def test_weights_beyond_one_shift_fall_back_exactly():
    """One particle with log p = -150: the weights spread beyond one shared
    shift, so the block-sparse call runs the dense tiles (a shift per row):
    the rows that do not see the heavy particle match the oracle, the others
    are inf or finite but never NaN, exactly as test_pairwise's version."""
    rng = np.random.default_rng(3)
    n, d = 300, 2
    x = rng.standard_normal((n, d)).astype(np.float32)
    f = (0.5 * np.sum(x**2, axis=1)).astype(np.float32)
    log_p = rng.normal(-2.0, 0.5, n).astype(np.float32)
    eta = 0.5
    near = np.sum((x[:, None] - x[None]) ** 2, axis=-1) <= eta * eta
    np.fill_diagonal(near, False)
    heavy = int(np.argmax(near.sum(axis=1)))
    log_p[heavy] = -150.0
    out = sparse(x, f, log_p, eta)
    ref = ensemble_force_reference_numpy(x, f, log_p, eta)
    force = np.asarray(out.force_sum, np.float64)
    assert not np.any(np.isnan(force))
    ok = ~near[:, heavy]
    scale = np.max(np.abs(ref.force_sum[ok]), axis=1) + 1e-30
    # float32 sums of <= 300 terms: 1e-3 leaves room for cancellation; a
    # global shift would underflow these rows (relative error 1)
    assert np.all(np.max(np.abs(force[ok] - ref.force_sum[ok]), axis=1) / scale < 1e-3)
    np.testing.assert_array_equal(np.asarray(out.n_ball), ref.n_ball)


@pytest.mark.parametrize("d", [2, 6])
def test_nonfinite_rows(d):
    """w = +inf (CEnLMC's first step), NaN in x, inf in f, -inf in log p: no
    one's neighbour, 0 force, n_ball = 0; n_r2 counts w-neighbours over all
    rows with a finite w (so rows 7, 11, 19 keep theirs)."""
    n = 400
    x, f, log_p, w = lmc_like_ensemble(5, n, d)
    eta, r2 = eta_for_neighbours(x, 12), eta_for_neighbours(w, 24)
    w[[3, 40]] = np.inf
    x[7, 0] = np.nan
    f[11] = np.inf
    log_p[19] = -np.inf
    out = sparse(x, f, log_p, eta, w=w, r2=r2)
    bad = np.array([3, 40, 7, 11, 19])
    assert np.all(np.asarray(out.force_sum[bad]) == 0) and np.all(
        np.asarray(out.n_ball[bad]) == 0
    )
    n_r2 = np.asarray(out.n_r2)
    assert np.all(n_r2[[3, 40]] == 0) and np.all(n_r2[[7, 11, 19]] > 0)
    assert_matches_oracle(out, x, f, log_p, eta, w=w, r2=r2, gram=gram(d))


def test_all_w_infinite_and_r2_zero():
    x, f, log_p, w = lmc_like_ensemble(6, 300, 2)
    w_inf = np.full_like(w, np.inf)
    out = sparse(
        x, f, log_p, 0.5, w=w_inf, r2=0.5
    )  # the CEnLMC initial state: nothing at all
    assert np.all(np.asarray(out.force_sum) == 0) and not np.any(np.asarray(out.n_r2))
    assert not np.any(np.asarray(out.n_ball))
    w[1] = w[0]  # R2 = 0: only identical w are neighbours
    w[250] = w[0]
    out = sparse(x, f, log_p, 0.5, w=w, r2=0.0)
    expected = np.zeros(300, int)
    expected[[0, 1, 250]] = 2
    np.testing.assert_array_equal(np.asarray(out.n_r2), expected)


@pytest.mark.parametrize("n", [40, 300])
def test_default_tiles_on_small_ensembles(n):
    # The default tiles (64 x 32, 128 pairs a step) on fewer particles than
    # one step holds: the list is shorter than a step.
    x, f, log_p, w = lmc_like_ensemble(15, n, 2)
    eta, r2 = eta_for_neighbours(x, 10), eta_for_neighbours(w, 20)
    out = ensemble_force(
        x, f, log_p, eta, w=w, r2=r2, method="tiled", block_sparse=True
    )
    assert_matches_oracle(out, x, f, log_p, eta, w=w, r2=r2, gram=False)


def test_overflowing_list_falls_back_to_dense_tiles():
    # A list capacity of 1% of the tile pairs overflows here: the call runs the
    # dense tiles and must give their result (same program, same order of sums).
    x, f, log_p, w = lmc_like_ensemble(8, 500, 2)
    eta, r2 = eta_for_neighbours(x, 12), eta_for_neighbours(w, 24)
    out = ensemble_force_tiled(
        x,
        f,
        log_p,
        eta,
        w=w,
        r2=r2,
        block_sparse=True,
        block_size=TILE,
        block_cols=TILE,
        max_active=0.01,
    )
    assert visited(x, f, log_p, eta, w=w, r2=r2) > 0.01
    assert_matches_oracle(out, x, f, log_p, eta, w=w, r2=r2, gram=False)


def test_float64_in_float64_out():
    with jax.enable_x64(True):
        x, f, log_p, w = lmc_like_ensemble(13, 400, 3, dtype=np.float64)
        eta, r2 = eta_for_neighbours(x, 12), eta_for_neighbours(w, 24)
        out = sparse(
            *(jnp.asarray(a) for a in (x, f, log_p)), eta, w=jnp.asarray(w), r2=r2
        )
        assert out.force_sum.dtype == jnp.float64
        assert_matches_oracle(
            out,
            x,
            f,
            log_p,
            eta,
            w=w,
            r2=r2,
            gram=False,
            eps=float(np.finfo(np.float64).eps),
        )


def test_jit_with_traced_radii_matches_eager():
    x, f, log_p, w = lmc_like_ensemble(11, 400, 2)
    eta, r2 = eta_for_neighbours(x, 12), eta_for_neighbours(w, 24)
    eager = sparse(x, f, log_p, eta, w=w, r2=r2)
    traced = jax.jit(lambda e, r: sparse(x, f, log_p, e, w=w, r2=r))(
        jnp.float32(eta), jnp.float32(r2)
    )
    np.testing.assert_array_equal(np.asarray(traced.n_ball), np.asarray(eager.n_ball))
    np.testing.assert_array_equal(np.asarray(traced.n_r2), np.asarray(eager.n_r2))
    # the same program up to where eta enters (a Python float vs a traced one): a few
    # ulps
    scale = float(jnp.max(jnp.abs(eager.force_sum)))
    np.testing.assert_allclose(
        traced.force_sum, eager.force_sum, rtol=0, atol=1e-5 * scale
    )


# -------------------------------------------------------------------------- dispatch


def test_auto_takes_block_sparse_by_the_rule():
    d, n = AUTO_SPARSE_RULE[0]
    x, f, log_p, w = lmc_like_ensemble(12, n, d)
    eta = r2 = 0.3
    auto = ensemble_force(x, f, log_p, eta, w=w, r2=r2)
    forced = ensemble_force(
        x, f, log_p, eta, w=w, r2=r2, method="tiled", block_sparse=True
    )
    np.testing.assert_array_equal(
        np.asarray(auto.force_sum), np.asarray(forced.force_sum)
    )  # the same program
    dense = ensemble_force(x, f, log_p, eta, w=w, r2=r2, block_sparse=False)
    np.testing.assert_array_equal(np.asarray(auto.n_ball), np.asarray(dense.n_ball))
    np.testing.assert_array_equal(np.asarray(auto.n_r2), np.asarray(dense.n_r2))
    assert pairwise.auto_block_sparse(n, d) and not pairwise.auto_block_sparse(n, 10)
    assert not pairwise.auto_block_sparse(n // 2, d) and not pairwise.auto_block_sparse(
        10**6, 6
    )


def test_auto_under_a_mesh_takes_the_same_rule():
    # with mesh= and strategy "allgather", auto decides block-sparse by the same rule as
    # on one device: the program equals the forced block-sparse mesh call (bitwise), the
    # counts the dense tiles'
    from cenlmc_jax.pairwise import make_mesh

    d, n = AUTO_SPARSE_RULE[0]
    x, f, log_p, w = lmc_like_ensemble(13, n, d)
    mesh = make_mesh(1)
    auto = ensemble_force(x, f, log_p, 0.3, w=w, r2=0.3, mesh=mesh)
    forced = ensemble_force(x, f, log_p, 0.3, w=w, r2=0.3, mesh=mesh, block_sparse=True)
    dense = ensemble_force(x, f, log_p, 0.3, w=w, r2=0.3, mesh=mesh, block_sparse=False)
    np.testing.assert_array_equal(
        np.asarray(auto.force_sum), np.asarray(forced.force_sum)
    )
    np.testing.assert_array_equal(np.asarray(auto.n_r2), np.asarray(dense.n_r2))
    np.testing.assert_array_equal(np.asarray(auto.n_ball), np.asarray(dense.n_ball))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(method="dense", block_sparse=True), "block_sparse=True needs method"),
        (dict(block_sparse="yes"), "block_sparse must be True or False"),
        (dict(method="tiled", block_sparse=1), "block_sparse must be True or False"),
    ],
)
def test_bad_input(kwargs, match):
    x, f, log_p, _ = lmc_like_ensemble(14, 10, 2)
    with pytest.raises(ValueError, match=match):
        ensemble_force(x, f, log_p, 0.5, **kwargs)


@pytest.mark.parametrize(
    "kwargs, match",
    [(dict(group=0), "group must be"), (dict(max_active=0.0), "max_active")],
)
def test_bad_tiled_options(kwargs, match):
    x, f, log_p, _ = lmc_like_ensemble(14, 10, 2)
    with pytest.raises(ValueError, match=match):
        ensemble_force_tiled(x, f, log_p, 0.5, block_sparse=True, **kwargs)


# ---------------------------------------------------------------------------- Pallas


def pallas_lists(
    x, f, log_p, eta, w=None, r2=None, *, block_rows, block_cols, distances
):
    n, d = x.shape
    opts = kernel_options(d, block_rows, block_cols, distances)
    _, p = sort_spatially(
        prepare(
            jnp.asarray(x),
            jnp.asarray(f),
            jnp.asarray(log_p),
            eta,
            None if w is None else jnp.asarray(w),
            r2,
        )
    )
    (lists, n_full, n_count), fits = sparse_tile_lists(
        p, opts, sparse_list_len(n, opts)
    )
    return np.asarray(n_full), np.asarray(n_count), bool(fits), -(-n // block_cols)


@pytest.mark.parametrize(
    "n, d, with_w, distances, r2_scale",
    # sizes kept small: interpret mode runs the kernel body in Python, (N/16)² tile
    # visits
    [
        (209, 2, True, "direct", 1.0),
        (200, 3, False, "direct", 1.0),
        (300, 2, True, "direct", 4.0),
        (176, 5, True, "gram", 1.0),
    ],
)
def test_pallas_block_sparse_matches_float64_oracle(n, d, with_w, distances, r2_scale):
    """Interpret mode. r2_scale = 4 widens R2 beyond η: tiles whose x-boxes are
    apart but whose w-boxes are not are visited for the R2 count only. At
    d = 5 half the ensemble sits 30 away (the clusters' boxes are apart)."""
    x, f, log_p, eta, w, r2 = cenlmc_like_inputs(0, n, d)
    if d > 3:
        shift = (
            np.where(np.arange(n)[:, None] < n // 2, np.float32(30), np.float32(0))
            * np.eye(d, dtype=np.float32)[0]
        )
        x, w = x + shift, w + shift
    eta = eta_for_neighbours(x, 10)
    r2 = r2_scale * eta_for_neighbours(w, 10)
    kw = dict(w=w, r2=r2) if with_w else {}
    result = ensemble_force_pallas(
        x,
        f,
        log_p,
        eta,
        block_rows=16,
        block_cols=16,
        distances=distances,
        block_sparse=True,
        **kw,
    )
    ref = oracle_with_bound(
        x,
        f,
        log_p,
        eta,
        gram=distances == "gram",
        coincident_rtol=coincident_rtol(d, np.float32),
        **kw,
    )
    assert ref["n_ball"].mean() > 2
    assert_matches(result, ref, label=f"pallas block-sparse n={n} d={d}")
    n_full, n_count, fits, n_cols = pallas_lists(
        x, f, log_p, eta, block_rows=16, block_cols=16, distances=distances, **kw
    )
    skipped = (
        0.6 if d <= 2 and r2_scale == 1 else 1.0
    )  # at d <= 2 most blocks, elsewhere some
    assert fits and (n_full + n_count).mean() < skipped * n_cols
    if r2_scale > 1:
        assert n_count.sum() > 0  # the count-only branch of the kernel ran


@pytest.mark.parametrize("n, tiles_dense", [(600, False), (400, True)])
def test_pallas_overflowing_lists_run_the_xla_tiles(monkeypatch, n, tiles_dense):
    # Lists of one entry per row block cannot hold the visited blocks: the
    # block-sparse XLA tiles run (exact either way), not the dense kernel, which
    # took 7.3 s where they take 58 ms at N = 2^20 on an H200 (gpu_check.md).
    # About 10 ball and R2 neighbours a particle: at 600 the XLA tiles' one list
    # holds them; at 400 they would not pay, run their dense tiles, and say so.
    monkeypatch.setattr(pairwise.pallas, "SPARSE_LIST_BYTES", 1)
    x, f, log_p, eta, w, r2 = cenlmc_like_inputs(1, n, 2)
    eta, r2 = eta_for_neighbours(x, 10), eta_for_neighbours(w, 10)
    force = functools.partial(
        ensemble_force_pallas,
        w=w,
        r2=r2,
        block_rows=16,
        block_cols=16,
        block_sparse=True,
        return_fallback=True,
        interpret=True,  # one form of each kernel in the program, not two
    )
    result, ran_dense = force(x, f, log_p, eta)
    n_full, n_count, fits, _ = pallas_lists(
        x, f, log_p, eta, w=w, r2=r2, block_rows=16, block_cols=16, distances="direct"
    )
    assert not fits
    assert bool(ran_dense) == tiles_dense  # the XLA tiles' own flag, passed on
    assert_matches(
        result, oracle_with_bound(x, f, log_p, eta, w=w, r2=r2), label="pallas overflow"
    )
    # one Pallas call in the program (the sparse kernel), not a second, dense one
    # for the overflow branch
    jaxpr = str(jax.make_jaxpr(lambda *a: force(*a))(x, f, log_p, eta))
    assert jaxpr.count("pallas_call[") == 1, jaxpr.count("pallas_call[")


def test_pallas_block_sparse_lowers_to_triton_for_cuda(monkeypatch):
    # As test_pairwise_pallas's lowering test: the list loads and the
    # data-dependent loop bounds must pass the Pallas -> Triton translation.
    try:
        from jax._src.pallas.triton import gpu_info
    except ImportError:
        pass
    else:
        h200 = gpu_info.get_gpu_info_from_version(gpu_info.GpuVersion.H200)
        monkeypatch.setattr(gpu_info, "get_gpu_info", lambda: h200)
    n, d = 1000, 3
    s = jax.ShapeDtypeStruct
    vec, mat, scalar = s((n,), jnp.float32), s((n, d), jnp.float32), s((), jnp.float32)
    force = functools.partial(ensemble_force_pallas, interpret=False, block_sparse=True)
    text = (
        jax.jit(lambda x, f, lp, e, w, r: force(x, f, lp, e, w=w, r2=r))
        .trace(mat, vec, vec, scalar, mat, scalar)
        .lower(lowering_platforms=("cuda",))
        .as_text()
    )
    assert "__gpu$xla.gpu.triton" in text
