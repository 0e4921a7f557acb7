"""The two-level block-sparse plan (cenlmc_jax/pairwise/tiled.py, ``sparse_plan``).

Beyond ``2 · PLAN_SUPER`` column tiles the plan tests the row tiles against super
tiles (unions of ``PLAN_SUPER`` column tiles) first and only then against the column
tiles of the near super tiles, so that it costs O(N) rather than O(N²) box tests.
It must list exactly the tile pairs of the one-level plan, in the same order: then
the block-sparse sums are the same sums, bit for bit. Checked entry by entry on
small ensembles with small super tiles (``PLAN_SUPER`` patched, a fresh trace for
each value), and end to end at the default tiles on N = 8192,
where the two-level plan runs unpatched: the force equals the one-level one exactly
and the dense tiles' counts exactly, its sums to float64 rounding.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_pairwise import eta_for_neighbours, lmc_like_ensemble

from cenlmc_jax.pairwise import ensemble_force, ensemble_force_tiled, tiled
from cenlmc_jax.pairwise.algebra import prepare, tile_spec
from cenlmc_jax.pairwise.sparsity import sort_spatially


def _plans(monkeypatch, x, f, log_p, eta, w, r2, tile, super_tiles, rows=None):
    """(one-level plan, two-level plan, level-1 pairs visited / all) of the inputs."""
    n, d = x.shape
    p = prepare(
        jnp.asarray(x),
        jnp.asarray(f),
        jnp.asarray(log_p),
        eta,
        None if w is None else jnp.asarray(w),
        r2,
    )
    _, p = sort_spatially(p)
    spec = tile_spec(d, p.x.dtype)
    # rows: a device's run of the sorted ensemble against all of it (the sharded form)
    cols = None if rows is None else p
    own = p if rows is None else jax.tree.map(lambda a: a[rows], p)
    n_rows = own.x.shape[0]
    capacity = tiled.sparse_capacity(n_rows, tile, tile, 1.0, n_cols=n)

    def plan(super_tiles):
        # a fresh jit (a new function, so a new trace) reads the patched value
        monkeypatch.setattr(tiled, "PLAN_SUPER", super_tiles)
        return jax.jit(
            lambda own, cols: tiled.sparse_plan(
                own, tile, tile, capacity, spec, cols=cols
            )
        )(own, cols)

    flat, two = plan(10**9), plan(super_tiles)
    n_ct = -(-n // tile)
    assert n_ct > 2 * super_tiles  # the two-level path ran
    # level 1 alone: how many (row tile, super tile) pairs it kept
    n_st = -(-n_ct // super_tiles)

    @jax.jit
    def level_one(own, p):
        row_x, row_w = tiled._boxes(own, tile)
        col_x, col_w = tiled._boxes(p, tile)
        sup = tiled._super_boxes(col_x, n_st), tiled._super_boxes(col_w, n_st)
        thr_w = None if p.thr_w is None else p.thr_w[0]
        return tiled._pair_list(row_x, row_w, *sup, p.thr_x[0], thr_w, spec, 1)[1]

    total = -(-n_rows // tile) * n_st
    n_near = level_one(own, p)
    return flat, two, int(n_near) / total


@pytest.mark.parametrize(
    "n, d, with_w, super_tiles",
    [(1200, 1, True, 4), (1500, 2, True, 3), (1500, 2, False, 4), (1400, 3, True, 5)],
)
def test_two_level_plan_lists_the_one_level_list(
    monkeypatch, n, d, with_w, super_tiles
):
    # N not a multiple of the 8-particle tiles nor of the super tiles (a partial
    # last super tile); small radii so that most super tiles are skipped
    tile = 8
    x, f, log_p, w = lmc_like_ensemble(40 + d, n, d)
    eta = eta_for_neighbours(x, 8)
    r2 = eta_for_neighbours(w, 16) if with_w else None
    flat, two, near = _plans(
        monkeypatch, x, f, log_p, eta, w if with_w else None, r2, tile, super_tiles
    )
    k = int(flat.n_pairs)
    assert int(two.n_pairs) == k and bool(two.fits) and bool(flat.fits)
    np.testing.assert_array_equal(np.asarray(two.pairs[:k]), np.asarray(flat.pairs[:k]))
    assert near < 0.5  # level 1 skipped most super tiles (not a vacuous comparison)
    assert k < 0.5 * (-(-n // tile)) ** 2  # and the list is sparse


def test_two_level_plan_of_a_device_run(monkeypatch):
    # the sharded form: the rows are a run of the sorted ensemble, the columns all
    x, f, log_p, w = lmc_like_ensemble(7, 1600, 2)
    eta, r2 = eta_for_neighbours(x, 8), eta_for_neighbours(w, 16)
    flat, two, near = _plans(
        monkeypatch, x, f, log_p, eta, w, r2, 8, 4, rows=slice(400, 800)
    )
    k = int(flat.n_pairs)
    assert int(two.n_pairs) == k and k > 0
    np.testing.assert_array_equal(np.asarray(two.pairs[:k]), np.asarray(flat.pairs[:k]))
    assert near < 0.5


def test_overflowing_super_tile_list_does_not_fit(monkeypatch):
    # a capacity below the level-1 count: the tile list would be incomplete, so the
    # plan must say it does not fit (the caller then runs the dense tiles)
    n, d, tile = 1500, 2, 8
    x, f, log_p, w = lmc_like_ensemble(3, n, d)
    p = prepare(*(jnp.asarray(a) for a in (x, f, log_p)), 0.3, jnp.asarray(w), 0.3)
    _, p = sort_spatially(p)
    monkeypatch.setattr(tiled, "PLAN_SUPER", 4)
    plan = tiled.sparse_plan(p, tile, tile, 20, tile_spec(d, p.x.dtype))
    assert not bool(plan.fits) and int(plan.n_pairs) > 20


def test_default_tiles_at_8192_equal_the_dense_tiles():
    # N = 8192, d = 2, the CEnLMC shape at suggest_cenlmc_params' radii for this N
    # (sqrt(h d) = 0.32, h = 0.05): 256 column tiles of 32, so the default plan is
    # two-level (PLAN_SUPER = 64) without any patch
    n, d = 8192, 2
    assert -(-n // tiled.SPARSE_BLOCK_COLS) > 2 * tiled.PLAN_SUPER
    with jax.enable_x64(True):
        x, f, log_p, w = (
            jnp.asarray(a) for a in lmc_like_ensemble(11, n, d, dtype=np.float64)
        )
        eta = r2 = 0.32
        auto = ensemble_force(x, f, log_p, eta, w=w, r2=r2)  # block-sparse by the rule
        dense = ensemble_force_tiled(x, f, log_p, eta, w=w, r2=r2)
        one_level = _one_level(x, f, log_p, eta, w, r2)
    # the same list: the same sums in the same order, bit for bit
    for a, b in zip(auto, one_level, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # exact differences (d <= DIRECT_MAX_D): every pair decided as the dense tiles do
    np.testing.assert_array_equal(np.asarray(auto.n_r2), np.asarray(dense.n_r2))
    np.testing.assert_array_equal(np.asarray(auto.n_ball), np.asarray(dense.n_ball))
    assert float(jnp.mean(auto.n_ball)) > 5  # populated balls, not zeros compared
    # the force: the same terms summed in another order; float64 rounding of sums of
    # at most ~300 terms errs by ~300 · 2.2e-16 of the sum of their sizes, which is
    # within 1e3 of the largest force here: 1e-9 of it leaves a margin of ~15
    got, ref = np.asarray(auto.force_sum), np.asarray(dense.force_sum)
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-9 * np.max(np.abs(ref)))


def _one_level(x, f, log_p, eta, w, r2):
    old = tiled.PLAN_SUPER
    tiled.PLAN_SUPER = 10**9
    try:
        # a fresh trace (another static max_active than the default call's), so the
        # patched value is read
        return ensemble_force_tiled(
            x, f, log_p, eta, w=w, r2=r2, block_sparse=True, max_active=0.4999
        )
    finally:
        tiled.PLAN_SUPER = old


def test_reverse_mode_through_the_two_level_plan():
    # N = 4500: 141 column tiles of 32, above 2 · PLAN_SUPER, so the default plan is
    # two-level; the plan carries no derivative (stop_gradient) and the block-sparse
    # sums must differentiate as the dense tiles do
    n, d = 4500, 2
    assert -(-n // tiled.SPARSE_BLOCK_COLS) > 2 * tiled.PLAN_SUPER
    with jax.enable_x64(True):
        x, f, log_p, w = (
            jnp.asarray(a) for a in lmc_like_ensemble(5, n, d, dtype=np.float64)
        )
        c = jnp.asarray(np.random.default_rng(0).normal(size=(n, d)))

        def loss(x, sparse):
            out = ensemble_force_tiled(
                x, f, log_p, 0.3, w=w, r2=0.3, block_sparse=sparse
            )
            return jnp.sum(c * out.force_sum)

        g_sparse = jax.grad(loss)(x, True)
        g_dense = jax.grad(loss)(x, False)
    # the same terms' derivatives summed in another order: float64 rounding, as in
    # the forward comparison above (1e-9 of the largest entry)
    ref = np.asarray(g_dense)
    np.testing.assert_allclose(
        np.asarray(g_sparse), ref, rtol=0, atol=1e-9 * np.max(np.abs(ref))
    )
    assert np.max(np.abs(ref)) > 0
