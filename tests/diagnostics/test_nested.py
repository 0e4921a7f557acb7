"""Nested R-hat and the many-chain verdict (cenlmc_jax/diagnostics/nested.py)."""

import warnings
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cenlmc_jax as cj
from cenlmc_jax.base import RunFlag
from cenlmc_jax.diagnostics import nested
from cenlmc_jax.run_until import RISING_STOP_Z, rising_rates


def test_nested_rhat_matches_a_hand_worked_example_of_the_formula():
    # 2 superchains of 2 chains, 2 draws each (Margossian et al. 2024, eq. 15-18):
    # chain means 2, 3 | 6, 8, within-chain variances 2, 2 | 2, 8; superchain means
    # 2.5, 7: B_nu = var(2.5, 7) = 10.125; B~ = 0.5, 2; W~ = 2, 5; W_nu = (2.5 + 7) / 2
    # = 4.75; nR = sqrt(1 + 10.125 / 4.75)
    draws = np.array([[1.0, 3.0], [2.0, 4.0], [5.0, 7.0], [6.0, 10.0]])[..., None]
    got = float(nested.nested_rhat(draws, 2)[0])
    assert got == pytest.approx(np.sqrt(1.0 + 10.125 / 4.75), rel=1e-6)
    # M = 1: each chain its own superchain, W = the within-chain variances only
    one = float(nested.nested_rhat(draws, 1)[0])
    means = np.array([2.0, 3.0, 6.0, 8.0])
    assert one == pytest.approx(np.sqrt(1 + np.var(means, ddof=1) / 3.5), rel=1e-6)


def test_nested_rhat_refuses_a_superchain_size_that_does_not_divide():
    with pytest.raises(ValueError, match="superchain_size must be an int >= 1"):
        nested.nested_rhat(np.zeros((6, 3, 1)), 4)


def test_superchain_layout_is_found_again_from_the_starts():
    x = jnp.repeat(jax.random.normal(jax.random.key(0), (8, 3)), 4, axis=0)
    assert nested.superchain_size(x) == 4
    assert nested.superchain_size(x.at[5].add(1.0)) == 1  # a broken block: none
    assert nested.superchain_size(jax.random.normal(jax.random.key(1), (32, 3))) == 1
    assert nested.default_superchain_size(1024) == 16
    assert nested.default_superchain_size(256) == 8
    assert nested.default_superchain_size(8) == 1


def _ar1_superchains(key, k, m, n, rho, start_sd, offset=0.0):
    """K superchains of M AR(1) chains of stationary variance 1, each superchain
    started at one point ~ N(offset, start_sd²): exact stationarity when start_sd = 1
    and offset = 0."""
    k1, k2 = jax.random.split(key)
    starts = offset + start_sd * jax.random.normal(k1, (k, 1))
    x0 = jnp.repeat(starts, m, axis=0)
    noise = jax.random.normal(k2, (n, k * m)) * np.sqrt(1 - rho**2)

    def step(x, e):
        x = rho * x + e
        return x, x

    _, xs = jax.lax.scan(step, x0[:, 0], noise)
    return np.asarray(xs).T[..., None]  # chains first (K M, n, 1)


def test_the_verdict_passes_stationary_chains_and_flags_ones_that_remember():
    # tau = (1 + rho) / (1 - rho) = 19 steps; 64 superchains x 16 chains. The seeds
    # are the first ones tried. Stationary starts (sd 1) and 400 draws: about 20
    # relaxation times, forgotten: no problem. Overdispersed starts (sd 3) and 20
    # draws (one relaxation time): the superchain means remember their starts.
    k, m = 64, 16
    ok = _ar1_superchains(jax.random.key(0), k, m, 400, 0.9, 1.0)
    diag = nested.many_chain_diagnostics(nested.chain_stats(ok, m), m)
    assert nested.many_chain_problems(diag) == []
    short = _ar1_superchains(jax.random.key(1), k, m, 20, 0.9, 3.0)
    diag = nested.many_chain_diagnostics(nested.chain_stats(short, m), m)
    found = nested.many_chain_problems(diag)
    assert any("remember where they started" in p for p in found), found
    # a biased start (all chains from 4 sds off) relaxing: the drift test sees it
    biased = _ar1_superchains(jax.random.key(2), k, m, 60, 0.9, 1.0, offset=4.0)
    diag = nested.many_chain_diagnostics(nested.chain_stats(biased, m), m)
    assert any("drifts" in p for p in nested.many_chain_problems(diag))


def test_half_correlation_matches_a_hand_worked_example():
    # 3 chains of 2 draws (halves of one draw): x = (1, 2), (2, 2), (3, 5). First
    # halves 1, 2, 3 (centred -1, 0, 1), second 2, 2, 5 (centred -1, -1, 2):
    # r = (1 + 0 + 2) / sqrt(2 * 6) for x; x² gives (1, 4, 9) and (4, 4, 25)
    draws = np.array([[1.0, 2.0], [2.0, 2.0], [3.0, 5.0]])[..., None]
    r = nested.half_correlation(nested.chain_stats(draws))
    a, b = np.array([1.0, 4.0, 9.0]), np.array([4.0, 4.0, 25.0])
    a, b = a - a.mean(), b - b.mean()
    want = (a * b).sum() / np.sqrt((a * a).sum() * (b * b).sum())
    np.testing.assert_allclose(r, [3.0 / np.sqrt(12.0), want], rtol=1e-12)
    # the stream accumulators keep the same per-chain halves
    from cenlmc_jax.diagnostics import online

    x = _ar1_superchains(jax.random.key(4), 8, 4, 40, 0.5, 1.0)
    np.testing.assert_allclose(
        nested.half_correlation(nested.stream_chain_stats(online.from_draws(x), 4)),
        nested.half_correlation(nested.chain_stats(x, 4)),
        rtol=1e-4,
    )
    # merged windows re-form the halves per chain as they do per superchain: two
    # windows of 20 draws merged are the 40-draw window's halves
    parts = [nested.chain_stats(x[:, :20], 4), nested.chain_stats(x[:, 20:], 4)]
    np.testing.assert_allclose(
        nested.merge_chain_stats(parts).chain_halves,
        nested.chain_stats(x, 4).chain_halves,
        rtol=1e-12,
    )


def test_the_memory_check_fires_on_chains_slow_beside_the_window_only():
    # AR(1) chains of stationary variance 1 started at stationarity, 64 superchains
    # of 16. rho = 0.995 (memory scale 200 steps) over a 100-step window: each
    # chain's halves share their level, and the check says so (the estimates may be
    # right here, but nothing in the window can tell this chain from one still
    # carrying a biased start: run longer). rho = 0.9 (scale 10) over 400 steps:
    # quiet. Each r is checked against AR(1)'s exact correlation of adjacent block
    # means, to 4 standard errors of Fisher's z (1 / sqrt(K − 3): the 16 chains of a
    # superchain share their start, so the K superchains are the independent units).
    # The seeds are the first ones tried.
    def exact(rho, h):
        i = np.arange(2 * h)
        c = rho ** np.abs(i[:, None] - i[None, :])
        return c[:h, h:].sum() / c[:h, :h].sum()

    k, m = 64, 16
    for rho, n, key in ((0.995, 100, 5), (0.9, 400, 6)):
        x = _ar1_superchains(jax.random.key(key), k, m, n, rho, 1.0)
        diag = nested.many_chain_diagnostics(nested.chain_stats(x, m), m)
        want = exact(rho, n // 2)
        gap = abs(np.arctanh(diag.half_corr[0]) - np.arctanh(want))
        assert gap < 4.0 / np.sqrt(k - 3), (rho, diag.half_corr[0], want)
        fired = any("memory" in p for p in nested.many_chain_problems(diag))
        assert fired == (rho > 0.99), (rho, diag.half_corr[0])


def test_sample_until_does_not_stop_while_a_slow_direction_keeps_a_narrow_start():
    # The banana (x0 ~ N(0, 10²), x1 | x0 ~ N(0.03 (x0² − 100), 1)), AutoStep HMC as
    # the warm-up tunes it (ε 0.19, L 9, M = diag(Var x)), 32 superchains of 16 from
    # exact draws shrunk 0.6x about their mean, then pushed out 1.2x as the hand-over
    # does: an ensemble 40 % narrow, as a warm-up that stopped early hands over (the
    # CLI at 512 chains: x1's sd 21 % low after 50 moves with every other check
    # passing). The push relaxes along the fast directions in a few moves, the
    # narrowness along the ridge over hundreds: without the memory check the run
    # stops after 50 moves with E[x0²] and E[x1²] 3-4 MCSEs low. With it, it runs on
    # and its answer is within 5 MCSEs (a bound no healthy run reaches by chance at 4
    # quantities). Seeds: the first ones tried.
    def logp(x):
        return -0.5 * (x[0] / 10.0) ** 2 - 0.5 * (x[1] - 0.03 * (x[0] ** 2 - 100)) ** 2

    z = jax.random.normal(jax.random.key(0), (512, 2))
    exact = jnp.stack([10 * z[:, 0], 3 * (z[:, 0] ** 2 - 1) + z[:, 1]], 1)
    narrow = exact.mean(0) + 0.6 * (exact - exact.mean(0))
    starts = nested.superchain_starts(jax.random.key(1), narrow, 16, logdensity_fn=logp)
    algo = cj.vmap_chains(
        cj.autostep_hmc(logp, 0.19, 9, inverse_mass_matrix=jnp.array([100.0, 19.0]))
    )
    res = cj.sample_until(jax.random.key(2), algo, algo.init(starts), segment_steps=25)
    diag = res.online
    assert res.num_steps_done > 50
    z = (diag.mean[2:] - np.array([100.0, 19.0])) / diag.mcse[2:]
    assert np.all(np.abs(z) < 5.0), z


def test_a_frozen_ensemble_is_flagged():
    # every chain stays at its superchain's start: B_nu is the starts' spread, the
    # within-superchain variance 0 -> nR infinite and the start's share too
    x = np.repeat(np.random.default_rng(0).normal(size=(32, 1, 2)), 8, axis=0)
    x = np.repeat(x, 10, axis=1) + 1e-9 * np.random.default_rng(1).normal(
        size=(256, 10, 2)
    )
    diag = nested.many_chain_diagnostics(nested.chain_stats(x, 8), 8)
    assert nested.many_chain_problems(diag)


def test_stream_statistics_equal_the_trace_ones():
    # the online accumulators' two halves give the same chain means, sums of squares
    # and superchain half-means as the draws (rounding only)
    x = _ar1_superchains(jax.random.key(3), 8, 4, 40, 0.5, 1.0)
    from cenlmc_jax.diagnostics import online

    a = nested.stream_chain_stats(online.from_draws(x), 4)
    b = nested.chain_stats(x, 4)
    np.testing.assert_allclose(a.mean, b.mean, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(a.m2, b.m2, rtol=1e-4)
    np.testing.assert_allclose(a.halves, b.halves, rtol=1e-5, atol=1e-6)


def test_sample_until_stops_on_the_verdict_and_is_reproducible():
    # a standard Gaussian, MALA over 512 chains in 32 superchains of 16 started at
    # N(0, 1.5² I) draws: stops once forgotten, with the right moments (z-test at the
    # superchains' MCSE, 5 sds: a bound no healthy run reaches by chance at 2 d tests)
    def logp(x):
        return -0.5 * jnp.sum(x**2)

    algo = cj.vmap_chains(cj.mala(logp, 0.5))
    starts = jnp.repeat(1.5 * jax.random.normal(jax.random.key(0), (32, 2)), 16, 0)
    state = algo.init(starts)
    res = cj.sample_until(jax.random.key(1), algo, state, segment_steps=25)
    diag = res.online
    assert nested.many_chain_problems(diag) == []
    assert res.num_steps_done < 20_000 and res.burn_in == res.num_steps_done // 2
    z = diag.mean / diag.mcse
    z[2:] = (diag.mean[2:] - 1.0) / diag.mcse[2:]
    assert np.all(np.abs(z) < 5.0), z
    again = cj.sample_until(jax.random.key(1), algo, state, segment_steps=25)
    np.testing.assert_array_equal(res.state.position, again.state.position)


def test_sample_until_refuses_independent_starts_before_work():
    algo = cj.vmap_chains(cj.mala(lambda x: -0.5 * jnp.sum(x**2), 0.5))
    state = algo.init(jax.random.normal(jax.random.key(0), (64, 2)))
    with pytest.raises(ValueError, match="superchains"):
        cj.sample_until(jax.random.key(1), algo, state)


class _RateInfo(NamedTuple):
    # a sampler's per-chain rate declared rising, as HMC's divergences are
    rate: jax.Array
    run_flags = (
        RunFlag("rate", lambda info, t: f"rate rose from step {t}", True, rising=True),
    )


class _DrawState(NamedTuple):
    position: jax.Array
    t: jax.Array


def _exact_draws_with_rate(ramp_steps):
    """Independent N(0, I) draws each step (the many-chain verdict holds as soon as
    it is checked) and a per-chain Bernoulli rate rising linearly from 0 to 0.5 over
    ``ramp_steps`` steps, then constant."""

    def init(x, rng_key=None):
        return _DrawState(x, jnp.zeros((), jnp.int32))

    def step(key, state):
        k1, k2 = jax.random.split(key)
        p = 0.5 * jnp.minimum(1.0, state.t / max(ramp_steps, 1))
        rate = jax.random.uniform(k2, state.position.shape[:1]) < p
        new = jax.random.normal(k1, state.position.shape)
        return _DrawState(new, state.t + 1), _RateInfo(rate)

    return cj.SamplingAlgorithm(init, step)


def test_sample_until_compares_the_rate_over_the_last_two_segments():
    # a rate that creeps up over hundreds of moves (centred eight schools' chains
    # filling the funnel's neck: the CLI stopped at 800 moves with log tau's sd 10 %
    # low, benchmarks/results/many_chains.md) can look flat within the kept window's
    # halves; from the third segment on the test spans the window and the segment
    # before it. Here the rate rises until step 400 (as below): at 800 steps the
    # window 400-800 is flat (the check on it alone would stop), but with the
    # segment 200-400 before it the rate rose, so the run goes on to 1,600 steps,
    # where the last two segments (400-800, 800-1,600) are flat; a flat pair's z
    # exceeds 2 with probability ~0.03, which would only double the run once more.
    starts = jnp.repeat(jax.random.normal(jax.random.key(0), (64, 2)), 16, 0)
    ramp = _exact_draws_with_rate(400)
    res = cj.sample_until(jax.random.key(1), ramp, ramp.init(starts), segment_steps=25)
    assert 1600 <= res.num_steps_done <= 3200, res.num_steps_done

    def steps(a, b):
        return jax.tree_util.tree_map(lambda v: v[a:b], res.info)

    # what the two rules saw at 800 steps: the window alone flat, with the segment
    # before it rising
    assert rising_rates(steps(400, 800))["rate"] <= RISING_STOP_Z
    assert rising_rates(steps(200, 800))["rate"] > RISING_STOP_Z


def test_sample_until_goes_on_while_a_declared_rate_rises():
    # the run must not stop while the divergence-like rate still rises (chains
    # creeping into a neck), and must stop as before once it is flat. 512 chains in
    # 32 superchains, segments of 25: with a constant rate the verdict holds at the
    # first check (50 steps); with a rate rising until step 400 the window (the
    # run's second half) is flat only from 800 steps on (segments 25, 25, 50, ...,
    # 400), the last two segments from 1,600 (the test above). 1,024 chains: the
    # first window (steps 25-50) rises by about 0.016 against a batch-means error of
    # about 0.003 (z ~ 5 > RISING_STOP_Z), the later ones by far more. A flat
    # window's z exceeds 2 with probability ~0.03, which would only double the run
    # once more (hence <= 3200).
    # Each check tells its progress callback why the run goes on (the CLI prints it
    # with --progress): the first check, that the checks have not started; while
    # the rate rises, that; at the check where the run stops, nothing.
    starts = jnp.repeat(jax.random.normal(jax.random.key(0), (64, 2)), 16, 0)

    def run(ramp_steps):
        algo, seen = _exact_draws_with_rate(ramp_steps), []
        res = cj.sample_until(
            jax.random.key(1),
            algo,
            algo.init(starts),
            segment_steps=25,
            progress=lambda steps, diag: seen.append((steps, diag.going_on)),
        )
        return res, seen

    res, seen = run(0)
    assert res.num_steps_done == 50
    assert seen == [(25, ("the checks start after 2 segments",)), (50, ())], seen
    assert res.online.going_on == ()
    res, seen = run(400)
    assert 800 <= res.num_steps_done <= 3200, res.num_steps_done
    window = jax.tree_util.tree_map(lambda a: a[res.burn_in :], res.info)
    assert rising_rates(window)["rate"] <= RISING_STOP_Z  # it stopped on a flat rate
    assert [steps for steps, _ in seen][-1] == res.num_steps_done
    assert all(why for _, why in seen[:-1]) and seen[-1][1] == ()
    assert any("the rate of info.rate still rises" in w for _, why in seen for w in why)


class _DepthRateInfo(NamedTuple):
    # the rising rate above, and a number whose mean over the kept steps is judged
    # (HMC's neck_depth's kind of flag), set at every step
    rate: jax.Array
    depth: jax.Array
    run_flags = (
        RunFlag("rate", lambda info, t: f"rate rose from step {t}", True, rising=True),
        RunFlag(
            "depth",
            lambda info, t: f"depth {float(np.mean(info.depth)):.1f} from step {t}",
            kept_only=True,
            statistic=lambda info: float(np.mean(np.asarray(info.depth))),
            above=0.5,
        ),
    )


def test_sample_until_warns_of_a_kept_step_flag_once_on_its_window():
    # each segment is a cj.sample call whose steps are all "kept" for it: a flag judged
    # on the kept steps (a funnel's neck) would be warned once a segment (the CLI
    # printed the same neck warning 6 times). The segments before the window are the
    # run's burn-in: their kept-step warnings are dropped, the window's is given once.
    ramp = _exact_draws_with_rate(400)

    def step(key, state):
        new, info = ramp.step(key, state)
        return new, _DepthRateInfo(info.rate, jnp.ones_like(info.rate, jnp.float32))

    starts = jnp.repeat(jax.random.normal(jax.random.key(0), (64, 2)), 16, 0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = cj.sample_until(
            jax.random.key(1),
            cj.SamplingAlgorithm(ramp.init, step),
            ramp.init(starts),
            segment_steps=25,
        )
    assert res.num_steps_done >= 800  # several segments, each with the flag set
    depth = [str(w.message) for w in caught if str(w.message).startswith("depth")]
    assert depth == ["depth 1.0 from step 0"], depth
