"""cj.hmc: exactness (MCSE z-tests on a quartic, a banana and a funnel), detailed
balance on a 1-D case, the shorter-step mixture, keys, dtypes and bad input."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from exact_targets import banana as _banana
from exact_targets import banana_draws as _banana_draws
from exact_targets import funnel as _funnel
from exact_targets import funnel_draws as _funnel_draws

import cenlmc_jax as cj
from cenlmc_jax.irreversible.hmc import (
    DIVERGENT_FLAG,
    NECK_DEPTH,
    NECK_FLAG,
    NECK_MIN_RATE,
    NECK_Z,
    HMCInfo,
    neck_depth,
    neck_depth_lower,
)


@pytest.fixture(autouse=True)
def _x64():
    # float64 draws and moments: the z-tests' sums over 10⁵ terms stay exact
    with jax.enable_x64(True):
        yield


def _quartic(x):
    # π(x) ∝ exp(-x⁴/4) (1-D): E x² = 2 Γ(3/4) / Γ(1/4)
    return -0.25 * jnp.sum(x**4)


QUARTIC_EX2 = 2 * 1.2254167024651776 / 3.6256099082219083


def _z(trace, f, truth):
    """z of the mean of f over chains' time means (chains independent)."""
    per_chain = np.mean(f(np.asarray(trace, np.float64)), axis=0)
    return (per_chain.mean(0) - truth) / (
        per_chain.std(0, ddof=1) / np.sqrt(len(per_chain))
    )


def test_hmc_with_a_shorter_step_is_exact_on_a_quartic():
    """512 chains, 600 moves after 100, ε = 0.9 (long enough that an unadjusted
    integrator would be far off on exp(-x⁴/4)), L = 3, the default jitter and a
    shorter step 0.1 half the time: z-test of E x² over the chains' time means."""
    algo = cj.vmap_chains(cj.hmc(_quartic, 0.9, 3, small_step=(0.1, 0.5)))
    x0 = jax.random.normal(jax.random.key(0), (512, 1)) * 0.8
    res = cj.sample(jax.random.key(1), algo, algo.init(x0), 600, burn_in=100)
    z = _z(res.trace, lambda t: t**2, QUARTIC_EX2)
    # |z| < 4: a false alarm 6e-5 under exactness
    assert np.all(np.abs(z) < 4), z
    assert 0.3 < float(np.mean(res.info.acceptance_rate)) < 1.0


@pytest.mark.parametrize(
    "name, logp, draws, m_mat, eps, truth2",
    [
        # the banana's covariance diag(100, 19) as M, as the warm-up would give
        (
            "banana",
            _banana,
            _banana_draws,
            np.array([100.0, 19.0]),
            0.15,
            [100.0, 19.0],
        ),
        # a funnel's neck needs short steps: ε = 0.05 in the unit metric (v's sd is 3)
        ("funnel", _funnel, _funnel_draws, None, 0.05, [9.0, np.exp(4.5), np.exp(4.5)]),
    ],
)
def test_hmc_keeps_exact_draws_exact(name, logp, draws, m_mat, eps, truth2):
    """Started at 4,096 exact draws of π, 40 moves of L = 10 leave π invariant: the
    ensemble's E x² (independent chains: MCSE from the ensemble's spread, since each
    chain is at π at every step) stays at the exact value. Curved (banana) and
    funnel-shaped targets, where a leapfrog step too long for a region is rejected,
    not taken."""
    x = draws(jax.random.key(3), 4096)
    algo = cj.vmap_chains(cj.hmc(logp, eps, 10, inverse_mass_matrix=m_mat))
    state = algo.init(x)
    step = jax.jit(algo.step)
    for t in range(40):
        state, info = step(jax.random.key(100 + t), state)
    y = np.asarray(state.position, np.float64)
    if name == "funnel":
        # x_i² has an infinite-variance-like tail (E x⁴ = 3 e^{18}): test v² and the
        # log-scale moment E[log x_i²] = E v + E log χ²₁ = -1.2704 instead
        f = np.stack([y[:, 0] ** 2, np.log(y[:, 1] ** 2), np.log(y[:, 2] ** 2)], 1)
        truth = np.array([9.0, -1.2704, -1.2704])
    else:
        f, truth = y**2, np.asarray(truth2)
    z = (f.mean(0) - truth) / (f.std(0, ddof=1) / np.sqrt(len(f)))
    # |z| < 4 over 2-3 statistics: a false alarm below 2e-4 under exactness
    assert np.all(np.abs(z) < 4), (z, float(np.mean(info.acceptance_rate)))


def test_hmc_is_reversible_on_a_small_case():
    """Detailed balance: from x ~ π exactly (a 1-D Gaussian mixture, 200,000 draws),
    one move x' (ε = 1.2, L = 2: about a third rejected, jittered, with the shorter
    step half the time) gives a pair whose law is symmetric, so E[x x'³] = E[x³ x'],
    and E[x'²] = E[x²] (invariance): z-tests on the differences."""

    def mix(x):
        return jnp.logaddexp(
            -0.5 * jnp.sum((x - 1.0) ** 2), -0.5 * jnp.sum((x + 1.5) ** 2 / 0.25) + 0.3
        )

    n = 200_000
    k1, k2, k3 = jax.random.split(jax.random.key(7), 3)
    w = jnp.exp(0.3) * 0.5 / (1.0 + jnp.exp(0.3) * 0.5)  # the narrow component's weight
    pick = jax.random.uniform(k1, (n,)) < w
    x = jnp.where(
        pick,
        -1.5 + 0.5 * jax.random.normal(k2, (n,)),
        1.0 + jax.random.normal(k3, (n,)),
    )[:, None]
    algo = cj.vmap_chains(cj.hmc(mix, 1.2, 2, small_step=(0.3, 0.5)))
    s1, info = jax.jit(algo.step)(jax.random.key(8), algo.init(x))
    a, b = np.asarray(x[:, 0], np.float64), np.asarray(s1.position[:, 0], np.float64)
    acc = float(np.mean(info.acceptance_rate))
    assert 0.3 < acc < 0.95, acc  # the test has rejections to see
    for diff in (a * b**3 - a**3 * b, b**2 - a**2):
        z = diff.mean() / (diff.std(ddof=1) / np.sqrt(n))
        # |z| < 4: a false alarm 6e-5 under detailed balance
        assert abs(z) < 4, z


def test_same_key_same_draws_float64_stays_float64_and_small_step_selects():
    """Keys fix the draws; float64 in, float64 out; with q = 1 every move is HMC at
    the shorter step (the step key's jitter applies to it the same way)."""
    x = jnp.array([0.3, -0.2], jnp.float64)
    state = cj.hmc(_banana, 0.2, 5).init(x)
    key = jax.random.key(4)
    a = cj.hmc(_banana, 0.2, 5).step(key, state)[0]
    b = cj.hmc(_banana, 0.2, 5).step(key, state)[0]
    np.testing.assert_array_equal(a.position, b.position)
    assert a.position.dtype == jnp.float64 and a.logdensity.dtype == jnp.float64
    always = cj.hmc(_banana, 0.2, 5, small_step=(0.05, 1.0)).step(key, state)[0]
    at_small = cj.hmc(_banana, 0.05, 5).step(key, state)[0]
    np.testing.assert_allclose(always.position, at_small.position, rtol=1e-12)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(step_size=0.0, num_integration_steps=3), "step_size must be a finite"),
        (dict(step_size=0.1, num_integration_steps=0), "num_integration_steps"),
        (dict(step_size=0.1, num_integration_steps=3, step_jitter=1.0), "step_jitter"),
        (
            dict(step_size=0.1, num_integration_steps=3, small_step=(0.01, 1.5)),
            r"small_step\[1\]",
        ),
        (
            dict(step_size=0.1, num_integration_steps=3, inverse_mass_matrix=-1.0),
            "inverse_mass_matrix",
        ),
    ],
)
def test_bad_arguments_are_refused_before_tracing(kwargs, match):
    with pytest.raises(ValueError, match=match):
        cj.hmc(_quartic, **kwargs)


def _infos(logp, divergent):
    """HMCInfo of ``(steps, chains)`` start log densities and divergent flags (the
    other fields zero), as the driver stacks them with ``info_reduce=None``."""
    v = jnp.asarray(logp, jnp.float64)
    div = jnp.asarray(divergent, bool)
    zero = jnp.zeros_like(v)
    return HMCInfo(
        zero, div, zero, zero.astype(jnp.int32), div, div & False,
        v, v * v, jnp.where(div, v, 0.0),
    )  # fmt: skip


def test_neck_depth_is_the_mean_standardised_log_density_of_divergent_starts():
    """By hand: step 0 has log densities (-1, -2, -3, -6) (mean -3, sd sqrt(3.5)) and
    chain 0 diverged, z = 2 / sqrt(3.5) = 1.0690; step 1 has (0, -4, -4, -8) (mean -4,
    sd sqrt(8)) and chains 0 and 3 diverged, z = ±4 / sqrt(8) = ±1.4142. The mean of
    the three is 1.0690 / 3 = 0.35635, from the per-chain infos and from their means
    over the chains (the CLI's)."""
    logp = [[-1.0, -2.0, -3.0, -6.0], [0.0, -4.0, -4.0, -8.0]]
    div = [[True, False, False, False], [True, False, False, True]]
    infos = _infos(logp, div)
    expected = (2 / np.sqrt(3.5)) / 3
    assert neck_depth(infos) == pytest.approx(expected, rel=1e-12)
    reduced = jax.tree_util.tree_map(
        lambda a: jnp.mean(a.astype(jnp.float64), axis=1), infos
    )
    assert neck_depth(reduced) == pytest.approx(expected, rel=1e-12)
    # the CLI's warning for a steady rate says where they start
    assert "They start +0.36 standard deviations" in DIVERGENT_FLAG.steady(infos, 0.3)
    assert "not at high density" in DIVERGENT_FLAG.steady(infos, 0.3)
    # nothing diverged, or one chain (no spread to measure against): nothing to judge
    assert neck_depth(_infos(logp, np.zeros((2, 4), bool))) is None
    assert neck_depth(_infos([[-1.0], [-2.0]], [[True], [True]])) is None
    # float32 log densities near -1e5 whose spread (0.5) is below the rounding of
    # E[log π²] - (E log π)²: left out, not read as a huge depth
    v32 = (-1e5 + np.array([[0.0, 0.5, 1.0, 1.5]] * 2)).astype(np.float32)
    f32 = jax.tree_util.tree_map(
        lambda a: np.asarray(a, np.float32) if a.dtype == jnp.float64 else a,
        _infos(v32, div),
    )
    assert neck_depth(f32) is None


def test_neck_depth_lower_is_the_depth_less_two_batch_mean_standard_errors():
    """By hand, the two steps of the test above, one batch each: per step
    ``u_t = (c_t − r_t ā_t) / s_t`` is 0.5 / sqrt(3.5) = 0.26726 (r = 1/4) and
    (−2 + 2) / sqrt(8) = 0 (r = 1/2); depth = 0.26726 / 0.75 = 0.35635; the batch
    residuals ``u_t − depth r_t`` are ±0.17817, so SE = sqrt(2 · 2 · 0.17817²) / 0.75 =
    0.47513 and the bound is 0.35635 − 2 · 0.47513 = −0.59391."""
    logp = [[-1.0, -2.0, -3.0, -6.0], [0.0, -4.0, -4.0, -8.0]]
    div = [[True, False, False, False], [True, False, False, True]]
    u0, depth = 0.5 / np.sqrt(3.5), (0.5 / np.sqrt(3.5)) / 0.75
    se = np.sqrt(2 * ((u0 - depth / 4) ** 2 + (depth / 2) ** 2)) / 0.75
    assert NECK_Z == 2.0
    assert neck_depth_lower(_infos(logp, div)) == pytest.approx(
        depth - 2 * se, rel=1e-12
    )
    # one step: no spread between batches to measure, nothing to judge
    assert neck_depth_lower(_infos(logp[:1], div[:1])) is None


def test_a_depth_from_a_few_divergent_moves_is_not_a_neck_and_from_many_it_is():
    """The same depth, about +0.7 (above NECK_DEPTH), read from 24 divergent moves
    and from 2,400, in 24 steps of 2,000 chains whose log densities are N(0, 1)
    (seed 0); the divergent moves' log densities are 0.7 ± 1 alternately. From 24
    (0.05 % of the moves, NECK_MIN_RATE; non-centred eight schools, right, gave +0.53
    and +0.60 from about 25 at seeds 3 and 4 and failed the CLI run) its standard
    error is about 1 / sqrt(24) = 0.2 and the bound about 0.3: NECK_FLAG stays quiet.
    From 2,400 the standard error is about 0.02 and the bound about 0.63: it fires."""
    rng = np.random.default_rng(0)
    steps, chains = 24, 2000
    for per_step, fires in ((1, False), (100, True)):
        logp = rng.normal(size=(steps, chains))
        div = np.zeros((steps, chains), bool)
        k = per_step * steps
        cells = rng.choice(steps * chains, k, replace=False)
        t, c = np.unravel_index(cells, (steps, chains))
        div[t, c] = True
        logp[t, c] = 0.7 + np.where(np.arange(k) % 2, 1.0, -1.0)
        infos = _infos(logp, div)
        depth, lower = neck_depth(infos), neck_depth_lower(infos)
        # each step's own mean and sd, which the divergent moves shift (by 100 · 0.7
        # / 2,000 = 0.035 of a unit at most), standardise them
        assert abs(depth - 0.7) < 0.06, depth
        assert depth > NECK_DEPTH
        assert (lower > NECK_DEPTH) is fires, (per_step, depth, lower)
        assert (NECK_FLAG.statistic(infos) > NECK_FLAG.above) is fires


def test_divergences_in_an_unfilled_neck_fail_and_at_a_bananas_tips_do_not():
    """Both ways, on real HMC runs (1,024 chains, 150 moves, L = 10).

    Neal's funnel (d = 3) started without its neck (v ~ N(0, 3²) kept above -1, as a
    warm-up that never entered it leaves it), ε = 0.4: the chains do not fill the neck
    in the run, E v is far above its 0 (a wrong answer) and the divergent moves start
    at high density: ``cj.sample`` warns (NECK_FLAG). The banana from exact draws,
    ε = 0.35 (its arms' tips diverge; some chains stick there for the whole run): the
    answer is right (E x² within 4 MCSE) and its divergent moves start at low
    density, below 0: no warning."""
    key = jax.random.key(11)
    v = 3.0 * jax.random.normal(key, (4096,), jnp.float64)
    v = v[v > -1.0][:1024]
    z = jnp.exp(v / 2)[:, None] * jax.random.normal(jax.random.key(12), (1024, 2))
    algo = cj.vmap_chains(cj.hmc(_funnel, 0.4, 10))
    with pytest.warns(RuntimeWarning, match="start where the density is high"):
        res = cj.sample(
            jax.random.key(13),
            algo,
            algo.init(jnp.concatenate([v[:, None], z], 1)),
            150,
            trace_fn=lambda s: s.position[:, 0],
            check_convergence=False,
        )
    assert float(np.mean(np.asarray(res.info.divergent))) > NECK_MIN_RATE
    assert neck_depth(res.info) > NECK_DEPTH
    # the wrong answer it flags: E v over the run, MCSE from the chains' time means
    zv = _z(np.asarray(res.trace)[:, :, None], lambda t: t, np.zeros(1))
    assert zv[0] > 10, zv  # the neck (v < -1) is missing: E v far above 0

    algo = cj.vmap_chains(cj.hmc(_banana, 0.35, 10, inverse_mass_matrix=[100.0, 19.0]))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = cj.sample(
            jax.random.key(14),
            algo,
            algo.init(_banana_draws(jax.random.key(15), 1024)),
            150,
            check_convergence=False,
        )
    assert float(np.mean(np.asarray(res.info.divergent))) > NECK_MIN_RATE
    assert neck_depth(res.info) < 0
    assert not [w for w in caught if "density is high" in str(w.message)]
    zb = _z(res.trace, lambda t: t**2, np.array([100.0, 19.0]))
    # |z| < 4 over 2 statistics: a false alarm below 1.3e-4 under exactness
    assert np.all(np.abs(zb) < 4), zb
