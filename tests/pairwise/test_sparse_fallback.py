"""The block-sparse pair list's capacity and its reported fallback to the dense tiles
(issue 17, item 6).

A block-sparse sum lists the tile pairs it visits in a list of static
capacity; where more are active (or the weights need a shift per row) the
dense tiles run instead. Both are exact, so every test holds the result to
the float64 oracle of ``test_pairwise`` whichever branch ran, and checks
which branch ran by the :class:`SparseFallbackWarning` (said once per
reason and capacity in a process: ``tiled._WARNED`` is cleared per test).
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import pytest
from test_pairwise import assert_matches_oracle, eta_for_neighbours, lmc_like_ensemble

import cenlmc_jax as cj
from cenlmc_jax.pairwise import ensemble_force, tiled
from cenlmc_jax.pairwise.tiled import (
    SPARSE_MAX_PAIRS,
    SPARSE_PAIRS_PER_PARTICLE,
    SparseFallbackWarning,
    ensemble_force_tiled,
    sparse_capacity,
)

TILE = 16


@pytest.fixture(autouse=True)
def fresh_warnings():
    tiled._WARNED.clear()
    yield
    tiled._WARNED.clear()


def ensemble(seed=8, n=500, d=2):
    x, f, log_p, w = lmc_like_ensemble(seed, n, d)
    return x, f, log_p, w, eta_for_neighbours(x, 12), eta_for_neighbours(w, 24)


def force(x, f, log_p, w, eta, r2, max_active):
    return ensemble_force_tiled(
        x,
        f,
        log_p,
        eta,
        w=w,
        r2=r2,
        block_sparse=True,
        block_size=TILE,
        block_cols=TILE,
        group=8,
        max_active=max_active,
    )


def fallbacks(fn):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = jax.block_until_ready(fn())
    return out, [
        str(c.message) for c in caught if issubclass(c.category, SparseFallbackWarning)
    ]


def test_capacity_grows_with_n():
    # The case: N = 2^20, d = 2, default tiles (64 x 32) lists 17.65 M tile
    # pairs; the old fixed cap of 2^23 = 8.39 M made it run dense. Below 2^23 / 32 =
    # 262,144 particles the cap is unchanged.
    assert (
        sparse_capacity(2**20, 64, 32) == SPARSE_PAIRS_PER_PARTICLE * 2**20 > 17_650_000
    )
    assert (
        sparse_capacity(2**17, 64, 32) == 2**17 // 64 * 2**17 // 32 // 2
    )  # half the tile pairs, below 2^23
    assert sparse_capacity(2**18, 64, 32) == SPARSE_MAX_PAIRS  # the floor binds at 2^18
    assert sparse_capacity(2**26, 64, 32) <= 2**30  # int32 offsets


def test_sparse_branch_says_nothing_and_matches_the_oracle():
    x, f, log_p, w, eta, r2 = ensemble()
    out, said = fallbacks(lambda: force(x, f, log_p, w, eta, r2, 1.0))
    assert said == []
    assert_matches_oracle(out, x, f, log_p, eta, w=w, r2=r2, gram=False)


def test_fallback_over_max_active_is_reported_once_and_exact():
    x, f, log_p, w, eta, r2 = ensemble()
    out, said = fallbacks(lambda: force(x, f, log_p, w, eta, r2, 0.01))
    assert (
        len(said) == 1 and "max_active" in said[0] and "dense tiles ran" in said[0]
    ), said
    assert_matches_oracle(out, x, f, log_p, eta, w=w, r2=r2, gram=False)
    _, again = fallbacks(lambda: force(x, f, log_p, w, eta, r2, 0.01))
    assert again == []  # once per process, not once per step


def test_fallback_over_the_memory_cap_is_reported(monkeypatch):
    # A memory cap below the list (the N = 2^20 cliff, scaled down): reported as the
    # memory cap.
    monkeypatch.setattr(tiled, "SPARSE_MAX_PAIRS", 4)
    monkeypatch.setattr(tiled, "SPARSE_PAIRS_PER_PARTICLE", 0)
    x, f, log_p, w, eta, r2 = ensemble(
        n=496
    )  # a shape of its own: traced with the patched caps
    out, said = fallbacks(lambda: force(x, f, log_p, w, eta, r2, 1.0))
    assert len(said) == 1 and "memory cap" in said[0] and "capacity of 4 " in said[0], (
        said
    )
    assert_matches_oracle(out, x, f, log_p, eta, w=w, r2=r2, gram=False)


def test_vmap_reports_only_a_real_fallback():
    # Under vmap both branches of the cond run: the flags, not the branch, decide the
    # warning.
    x, f, log_p, w, eta, r2 = ensemble(n=480)
    xs, fs, ls, ws = (jnp.stack([a, a]) for a in (x, f, log_p, w))

    def batched(max_active):
        return jax.vmap(lambda *a: force(*a, eta, r2, max_active))(xs, fs, ls, ws)

    out, said = fallbacks(lambda: batched(1.0))
    assert said == []
    assert_matches_oracle(
        jax.tree.map(lambda a: a[0], out), x, f, log_p, eta, w=w, r2=r2, gram=False
    )
    _, said = fallbacks(lambda: batched(0.01))
    assert len(said) == 1


def test_grad_through_a_fallback():
    # The callback sits in the dense branch; reverse mode through it still works and
    # equals the sparse branch's.
    x, f, log_p, w, eta, r2 = ensemble(n=464)

    def loss(x, max_active):
        return jnp.sum(force(x, f, log_p, w, eta, r2, max_active).force_sum ** 2)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SparseFallbackWarning)
        g_dense, g_sparse = (
            jax.grad(loss)(jnp.asarray(x), 0.01),
            jax.grad(loss)(jnp.asarray(x), 1.0),
        )
    scale = float(jnp.max(jnp.abs(g_sparse)))
    assert (
        float(jnp.max(jnp.abs(g_dense - g_sparse))) <= 1e-3 * scale
    )  # float32 sums in two orders


def test_return_fallback_flags_without_warning_and_equals_the_warned_call():
    # The flag form (the CEnLMC step's) says nothing and returns which branch ran; its
    # sums are the same program's, so they equal the warning form's exactly.
    x, f, log_p, w, eta, r2 = ensemble(n=448)
    for max_active, fell_back in ((1.0, False), (0.01, True)):
        (out, ran_dense), said = fallbacks(
            lambda max_active=max_active: ensemble_force_tiled(
                x,
                f,
                log_p,
                eta,
                w=w,
                r2=r2,
                block_sparse=True,
                block_size=TILE,
                block_cols=TILE,
                group=8,
                max_active=max_active,
                return_fallback=True,
            )
        )
        assert said == [] and bool(ran_dense) is fell_back
        warned, _ = fallbacks(lambda m=max_active: force(x, f, log_p, w, eta, r2, m))
        for a, b in zip(out, warned, strict=True):
            assert jnp.array_equal(a, b)


def _host_callbacks(lowered) -> int:
    # a host callback lowers to a custom call whose target name ends in "callback"
    return lowered.as_text().count("callback")


def test_block_sparse_program_holds_no_host_callback():
    # Issue 30: a host callback's pointer enters the persistent-cache key (and JAX
    # writes no program holding one to that cache), so the block-sparse program was
    # compiled again in every process. The jitted sum and the CEnLMC step hold none now.
    x, f, log_p, w, eta, r2 = ensemble(n=416)
    sum_program = jax.jit(
        lambda x: ensemble_force(
            x, f, log_p, eta, w=w, r2=r2, block_sparse=True, return_fallback=True
        )
    ).lower(x)
    assert _host_callbacks(sum_program) == 0

    sampler = cj.cenlmc(
        lambda z: -0.5 * jnp.sum(z**2),
        0.05,
        0.25,
        1.0,
        0.5,
        5,
        10.0,
        f_star=0.0,
        block_sparse=True,
    )
    state = sampler.init(x)
    step_program = jax.jit(sampler.step).lower(jax.random.key(1), state)
    assert _host_callbacks(step_program) == 0
    # the check can fail: the warning form, traced, holds one
    warned = jax.jit(lambda x: force(x, f, log_p, w, eta, r2, 0.5)).lower(x)
    assert _host_callbacks(warned) > 0


def test_cenlmc_reports_a_fallback_in_its_info_and_sample_warns(monkeypatch):
    # A memory cap below the list (as above) makes every block-sparse step run the
    # dense tiles: info.dense_fallback says so at each step and cj.sample warns once.
    monkeypatch.setattr(tiled, "SPARSE_MAX_PAIRS", 4)
    monkeypatch.setattr(tiled, "SPARSE_PAIRS_PER_PARTICLE", 0)
    x = jax.random.normal(jax.random.key(0), (400, 2))  # a shape of its own: traced
    # with the patched caps

    def run(block_sparse):
        sampler = cj.cenlmc(
            lambda z: -0.5 * jnp.sum(z**2),
            0.05,
            0.25,
            1.0,
            0.5,
            5,
            10.0,
            f_star=0.0,
            block_sparse=block_sparse,
        )
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            res = cj.sample(
                jax.random.key(2), sampler, sampler.init(x), 4, info_reduce=None
            )
        return res, [str(c.message) for c in caught if "dense tiles" in str(c.message)]

    sparse, said = run(True)
    assert bool(jnp.all(sparse.info.dense_fallback[1:])) and len(said) == 1, said
    dense, said = run(False)
    assert not bool(jnp.any(dense.info.dense_fallback)) and said == []
    # same key, nearly the same samples: the fallback ran the dense tiles, over the
    # sorted ensemble, so the same float32 sums in another order (rounding ~1e-7
    # relative a step, 4 steps)
    assert jnp.allclose(sparse.trace, dense.trace, rtol=0, atol=1e-4)
