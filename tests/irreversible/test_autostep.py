"""cj.autostep_hmc: exactness (exact draws kept exact on a banana and a funnel whose
fixed-step HMC diverges; detailed balance on a 1-D case; a kernel without the reverse
check fails the same test), the halvings where the step is too long, its gradient
count, keys, dtypes and bad input."""

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


@pytest.fixture(autouse=True)
def _x64():
    # float64 draws and moments: the z-tests' sums over 10⁵ terms stay exact
    with jax.enable_x64(True):
        yield


def _moments(name, y):
    """The statistics the exactness test compares, and their exact values."""
    if name == "funnel":
        # x_i² has an infinite-variance-like tail (E x⁴ = 3 e^{18}): v, v² and the
        # log-scale moment E[log x_i²] = E v + E log χ²₁ = -1.2704 instead
        f = np.stack([y[:, 0], y[:, 0] ** 2, np.log(y[:, 1] ** 2)], 1)
        return f, np.array([0.0, 9.0, -1.2704])
    return np.stack([y[:, 0] ** 2, y[:, 1] ** 2, y[:, 1]], 1), np.array([100, 19, 0])


@pytest.mark.parametrize(
    "name, logp, draws, m_mat, eps",
    [
        # M = the banana's covariance diag(100, 19); ε = 0.5 is far too long for its
        # arms (fixed-step HMC at 0.35 already sticks there)
        ("banana", _banana, _banana_draws, np.array([100.0, 19.0]), 0.5),
        # ε = 0.5 in the unit metric: fine at v ~ 3, about 20x too long in the neck
        ("funnel", _funnel, _funnel_draws, None, 0.5),
    ],
)
def test_exact_draws_stay_exact_where_the_step_must_halve(
    name, logp, draws, m_mat, eps
):
    """Started at 4,096 exact draws of π, 30 moves of L = 8 leave π invariant: each
    chain is at π after every move, so the ensemble's moments (independent chains,
    MCSE from their spread) stay at the exact values. A large share of the moves
    halve their step (the test exercises the selection and its reverse check)."""
    x = draws(jax.random.key(3), 4096)
    algo = cj.vmap_chains(cj.autostep_hmc(logp, eps, 8, inverse_mass_matrix=m_mat))
    state = algo.init(x)
    step = jax.jit(algo.step)
    halved, agreed = [], []
    for t in range(30):
        state, info = step(jax.random.key(100 + t), state)
        halved.append(np.mean(np.asarray(info.halvings) > 0))
        agreed.append(np.mean(np.asarray(info.reversible)))
    assert np.mean(halved) > 0.05, np.mean(halved)
    assert np.mean(agreed) < 0.99, np.mean(agreed)  # reverse checks that disagree
    f, truth = _moments(name, np.asarray(state.position, np.float64))
    z = (f.mean(0) - truth) / (f.std(0, ddof=1) / np.sqrt(len(f)))
    # |z| < 4 over 3 statistics: a false alarm below 2e-4 under exactness
    assert np.all(np.abs(z) < 4), z


def _mixture(x):
    return jnp.logaddexp(
        -0.5 * jnp.sum((x - 1.0) ** 2), -0.5 * jnp.sum((x + 1.5) ** 2 / 0.01) + 0.3
    )


def _mixture_draws(key, n):
    k1, k2, k3 = jax.random.split(key, 3)
    w = jnp.exp(0.3) * 0.1 / (1.0 + jnp.exp(0.3) * 0.1)  # the narrow component's
    pick = jax.random.uniform(k1, (n,)) < w
    return jnp.where(
        pick,
        -1.5 + 0.1 * jax.random.normal(k2, (n,)),
        1.0 + jax.random.normal(k3, (n,)),
    )[:, None]


def _one_move_pairs(algo, n=200_000):
    x = _mixture_draws(jax.random.key(7), n)
    s1, info = jax.jit(algo.step)(jax.random.key(8), algo.init(x))
    a, b = np.asarray(x[:, 0], np.float64), np.asarray(s1.position[:, 0], np.float64)
    return a, b, info


def _asymmetry(a, b):
    """z of the differences E[x x'³] − E[x³ x'] and E[x'²] − E[x²] (both 0 when the
    pair's law is symmetric: detailed balance)."""
    n = a.size
    out = []
    for diff in (a * b**3 - a**3 * b, b**2 - a**2):
        out.append(diff.mean() / (diff.std(ddof=1) / np.sqrt(n)))
    return np.array(out)


def test_autostep_is_reversible_on_a_small_case():
    """Detailed balance: from x ~ π exactly (a 1-D mixture of N(1, 1) and a narrow
    N(-1.5, 0.1²), 200,000 draws), one move (ε = 1.2, L = 2: too long for the narrow
    component by a factor of about 10, so the moves there halve) gives a pair whose law
    is symmetric: z-tests on the differences."""
    algo = cj.vmap_chains(cj.autostep_hmc(_mixture, 1.2, 2))
    a, b, info = _one_move_pairs(algo)
    assert 0.05 < float(np.mean(np.asarray(info.halvings) > 0)) < 0.9
    acc = float(np.mean(info.acceptance_rate))
    assert 0.3 < acc < 0.95, acc  # the test has rejections to see
    z = _asymmetry(a, b)
    # |z| < 4 for two statistics: a false alarm 1.3e-4 under detailed balance
    assert np.all(np.abs(z) < 4), z


def test_without_the_reverse_check_the_same_test_fails(monkeypatch):
    """The reverse check is what makes the halvings exact: with it forced to agree
    (the step chosen at the start only), the pair of the test above is no longer
    symmetric (|z| far above 4). The test can tell."""
    real = jax.lax.while_loop
    calls = []

    def forward_only(cond, body, init):
        out = real(cond, body, init)
        calls.append(out)
        # the second loop of a move (the reverse check, carry (steps, disagreed))
        # answers that nothing disagreed: the indicator is then always 1
        return (out[0], jnp.zeros_like(out[1])) if len(calls) % 2 == 0 else out

    monkeypatch.setattr(jax.lax, "while_loop", forward_only)
    algo = cj.vmap_chains(cj.autostep_hmc(_mixture, 1.2, 2))
    a, b, _ = _one_move_pairs(algo)
    assert np.max(np.abs(_asymmetry(a, b))) > 8


def test_halvings_follow_the_step_and_grad_evals_count_them():
    """On a standard normal in d = 1, a step of 8 makes one leapfrog step's energy
    error huge: the move halves (to 1 or 0.5, where it is moderate); at a step of 0.01
    it never halves. grad_evals = L + 1 + the halvings, and the reverse check's steps:
    as many as the halvings where it agreed (the last of them comes free from the
    trajectory), fewer where it stopped at a disagreement."""
    logp = lambda x: -0.5 * jnp.sum(x**2)  # noqa: E731
    x = jnp.full((512, 1), 0.5)
    for eps, expect_halved in ((8.0, True), (0.01, False)):
        algo = cj.vmap_chains(cj.autostep_hmc(logp, eps, 3, step_jitter=0.0))
        _, info = jax.jit(algo.step)(jax.random.key(1), algo.init(x))
        mu = np.asarray(info.halvings)
        assert (np.mean(mu > 0) > 0.9) == expect_halved, mu[:8]
        ge = np.asarray(info.grad_evals)
        assert np.all(ge >= 3 + 1 + mu) and np.all(ge <= 3 + 1 + 2 * mu), ge[:8]
        agreed = np.asarray(info.reversible)
        assert np.all(ge[agreed] == (3 + 1 + 2 * mu)[agreed])


def test_same_key_same_draws_float64_stays_float64_and_max_halvings_zero():
    """Keys fix the draws; float64 in, float64 out; with max_halvings = 0 the move
    never halves, its reverse check always agrees, and it costs L + 1 gradients (the
    selection's step and the trajectory's; the reverse check's one comes from the
    trajectory)."""
    x = jnp.array([0.3, -0.2], jnp.float64)
    algo = cj.autostep_hmc(_banana, 0.2, 5)
    state = algo.init(x)
    key = jax.random.key(4)
    a = algo.step(key, state)
    b = cj.autostep_hmc(_banana, 0.2, 5).step(key, state)
    np.testing.assert_array_equal(a[0].position, b[0].position)
    assert a[0].position.dtype == jnp.float64 and a[0].logdensity.dtype == jnp.float64
    zero = cj.autostep_hmc(_banana, 0.2, 5, max_halvings=0).step(key, state)[1]
    assert int(zero.halvings) == 0 and bool(zero.reversible)
    assert int(zero.grad_evals) == 5 + 1


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(step_size=0.0, num_integration_steps=3), "step_size must be a finite"),
        (dict(step_size=0.1, num_integration_steps=0), "num_integration_steps"),
        (dict(step_size=0.1, num_integration_steps=3, step_jitter=1.0), "step_jitter"),
        (dict(step_size=0.1, num_integration_steps=3, max_halvings=-1), "max_halvings"),
        (
            dict(step_size=0.1, num_integration_steps=3, inverse_mass_matrix=-1.0),
            "inverse_mass_matrix",
        ),
    ],
)
def test_bad_arguments_are_refused_before_tracing(kwargs, match):
    with pytest.raises(ValueError, match=match):
        cj.autostep_hmc(_banana, **kwargs)


def test_a_rising_share_of_halved_moves_says_a_neck_is_still_filling():
    """Both ways, on Neal's funnel (d = 3), 1,024 chains, 300 moves of ε = 0.8,
    L = 5. Started in the funnel's mouth (v > 2, as a warm-up that never entered the
    neck leaves it) the chains move into the neck, so the share of moves that halve
    rises (the halves of the run differ by 3.6 standard errors in the run measured:
    above ``cj.sample_until``'s 2, which runs on); started at exact draws it is flat
    (|z| < 4: a false alarm 2e-3 under stationarity, a t with 14 degrees of freedom),
    and the driver's flag (5) stays quiet."""
    from cenlmc_jax.run_until import RISING_STOP_Z, rising_rates

    v = 3.0 * jax.random.normal(jax.random.key(11), (20000,), jnp.float64)
    runs = {}
    for start, keep in (("mouth", v[v > 2.0][:1024]), ("exact", v[:1024])):
        z = jnp.exp(keep / 2)[:, None] * jax.random.normal(
            jax.random.key(12), (1024, 2)
        )
        algo = cj.vmap_chains(cj.autostep_hmc(_funnel, 0.8, 5))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            res = cj.sample(
                jax.random.key(13),
                algo,
                algo.init(jnp.concatenate([keep[:, None], z], 1)),
                300,
                check_convergence=False,
            )
        runs[start] = (rising_rates(res.info)["halved"], caught)
    z_mouth, _ = runs["mouth"]
    z_exact, caught = runs["exact"]
    assert z_mouth > RISING_STOP_Z, z_mouth
    assert abs(z_exact) < 4, z_exact
    assert not any("halved their step rose" in str(w.message) for w in caught)


def _funnel10(x):
    # Neal's funnel, d = 10 (the CLI's case): v ~ N(0, 3²), x_i | v ~ N(0, e^v)
    v, z = x[0], x[1:]
    return -0.5 * (v / 3.0) ** 2 - 0.5 * jnp.sum(z**2) * jnp.exp(-v) - v * z.size / 2


def test_halved_moves_that_start_at_high_density_flag_a_neck():
    """Both ways, from exact draws (1,024 chains, 200 moves, M = I, L = 5): in the
    centred funnel of d = 10 the step halves in the neck, a narrow region of high
    density, so the halved moves start well above the ensemble's mean log density and
    the driver warns (the CLI fails the run: with the halvings there need be no
    divergent move for NECK_FLAG to see, as on Brownian motion with unknown scales);
    on the banana it halves in the arms, at low density, and stays quiet. The threshold
    is hmc.NECK_DEPTH (0.5); measured here +0.92 (funnel) and -1.30 (banana); in the
    CLI's cases +1.0 to +1.8 in necks, -1.0 to -1.1 on the banana, +0.1 on the 103-d
    SV model (autostep.halved_depth's docstring). The check fires from exact draws
    too: like NECK_FLAG it says the sampler cannot be trusted to fill a neck in a run
    of this length, not that this run missed it."""
    from cenlmc_jax.irreversible.autostep import halved_depth
    from cenlmc_jax.irreversible.hmc import NECK_DEPTH

    k0, k1 = jax.random.split(jax.random.key(21))
    v = 3.0 * jax.random.normal(k0, (1024,), jnp.float64)
    funnel_x = jnp.concatenate(
        [v[:, None], jnp.exp(v / 2)[:, None] * jax.random.normal(k1, (1024, 9))], 1
    )
    cases = {
        "funnel": (_funnel10, funnel_x, 0.5),
        "banana": (_banana, _banana_draws(jax.random.key(22), 1024), 0.5),
    }
    depth, said = {}, {}
    for name, (logp, x, eps) in cases.items():
        algo = cj.vmap_chains(cj.autostep_hmc(logp, eps, 5))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            res = cj.sample(
                jax.random.key(23), algo, algo.init(x), 200, check_convergence=False
            )
        depth[name] = halved_depth(res.info)
        said[name] = any(
            "halves its step where the density" in str(w.message) for w in caught
        )
    assert depth["funnel"] is not None and depth["funnel"] > NECK_DEPTH, depth
    assert said["funnel"], depth
    assert depth["banana"] is not None and depth["banana"] < NECK_DEPTH, depth
    assert not said["banana"], depth
