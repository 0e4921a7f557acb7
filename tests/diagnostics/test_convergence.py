"""Issue 18's silent failures: each with the mechanism it had, fixed, and a test that
failed before.

* ``cj.sample`` warns (:class:`ConvergenceWarning`) when a chain never moved, when the
  rank-normalised split R-hat is above 1.01, and when the bulk ESS is below ``min(100 C,
  400)``; ``check_convergence=False`` is silent; a healthy run (exact i.i.d. draws) is
  silent.
* The pooled warm-up (``run_chains``) restarts chains stuck in a tail; its hand-over
  warns on a collapse.
* The positive-definite check is scale-invariant: the adapted diagonal of a raw-scale
  regression passes.

What cannot be faked: i.i.d. draws have R-hat 1 and an ESS equal to the draws (their
false-alarm probability is stated beside each test); a chain that never moved is one
whose position is bit for bit its start; the stuck chains' positions are read directly.
"""

import warnings
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cenlmc_jax as cj
from cenlmc_jax import _linalg as la
from cenlmc_jax import adaptation as ad
from cenlmc_jax.diagnostics.convergence import (
    ConvergenceWarning,
    convergence_problems,
    ess_floor,
    frozen_rows,
)
from cenlmc_jax.irreversible import sde_proposal


class Position(NamedTuple):
    position: jax.Array


def iid_step(key, state):
    """A 'sampler' of exact N(0, 1) draws, every chain: the healthy control (R-hat 1,
    ESS = the draws)."""
    return Position(
        jax.random.normal(key, state.position.shape, state.position.dtype)
    ), ()


def quartic(x):
    return -0.25 * jnp.sum(x**4)


def convergence_messages(caught):
    return [
        str(w.message) for w in caught if issubclass(w.category, ConvergenceWarning)
    ]


def test_iid_draws_raise_no_warning_and_check_convergence_false_is_silent():
    # 4 chains x 1000 i.i.d. draws in d = 3: R-hat - 1 has sd ~ 1e-3 and the bulk ESS ~
    # 4000 (floor 400): a false alarm needs a 10-sd excursion
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        res = cj.sample(jax.random.key(0), iid_step, Position(jnp.zeros((4, 3))), 1000)
    assert res.trace.shape == (1000, 4, 3)
    stuck = Position(
        jnp.zeros((4, 3))
    )  # never moves: the driver's own watch says so (RuntimeWarning), not the check
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        warnings.simplefilter("ignore", RuntimeWarning)
        cj.sample(
            jax.random.key(0), lambda k, s: (s, ()), stuck, 20, check_convergence=False
        )


def test_chains_that_have_not_mixed_warn_with_the_summarys_rhat():
    # LMC on N(0, diag(1, 1e4)) with h = 0.01 (set by the stiff direction, as a
    # curvature rule does): the wide direction relaxes over ~1e6 steps; 4 particles
    # started at +-300 there are still apart after 300 steps. This is the issue's
    # max_curvature failure (c = 30,856, h = 1.6e-6, R-hat 36) in miniature: silent
    # before.
    var = jnp.array([1.0, 1e4])
    algo = cj.lmc(lambda x: -0.5 * jnp.sum(x**2 / var), 0.01)
    x0 = jnp.array([[0.0, -300.0], [0.0, -100.0], [0.0, 100.0], [0.0, 300.0]])
    with pytest.warns(ConvergenceWarning) as caught:
        res = cj.sample(jax.random.key(1), algo, algo.init(x0), 300)
    messages = convergence_messages(caught)
    assert any("R-hat of x[1]" in m and "> 1.01" in m for m in messages), messages
    assert any("bulk ESS of x[" in m and "< 400" in m for m in messages), messages
    # the value in the message is cj.summary's r_hat (the same function)
    rhat = float(cj.summary(res).columns["r_hat"][1])
    assert f"{rhat:.3g}" in " ".join(messages), (rhat, messages)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        cj.sample(jax.random.key(1), algo, algo.init(x0), 300, check_convergence=False)


def test_a_metropolis_chain_that_never_moves_is_reported_in_both_modes():
    """The driver's per-chunk watch exempts MH samplers (a rejection keeps the
    position); 3 of 16 chains never moving on gp_pois_regr went unflagged (mean
    acceptance 0.61). Here chain 0 starts where every proposal of MALA's step size 0.5
    is rejected (log density -x^4/4 at x = 30: the drift proposes |x| ~ 1e4)."""
    mala = ad.window_adaptation("mala", quartic).sampler(
        {"step_size": 0.5, "D": 1.0, "Q": None}
    )
    algo = cj.vmap_chains(mala)
    x0 = jnp.zeros((16, 2)).at[0].set(30.0)
    for mode in ("trace", "stream"):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            cj.sample(
                jax.random.key(2),
                algo,
                algo.init(x0),
                400,
                mode=mode,
                check_convergence=True,
            )
        frozen = [m for m in convergence_messages(caught) if "never moved" in m]
        assert (
            len(frozen) == 1
            and "1 of 16 chains" in frozen[0]
            and "rows [0]" in frozen[0]
        ), (mode, frozen)
        rhat = [m for m in convergence_messages(caught) if "R-hat" in m]
        assert bool(rhat) == (mode == "trace"), (
            mode,
            rhat,
        )  # stream mode has no per-chain draws for R-hat


def test_the_pieces():
    assert [ess_floor(c) for c in (1, 2, 4, 16, 10_000)] == [100, 200, 400, 400, 400]
    start = {"a": jnp.zeros((3, 2)), "b": jnp.ones((3,))}
    end = {
        "a": jnp.zeros((3, 2)).at[1, 0].set(1.0),
        "b": jnp.ones((3,)).at[2].set(jnp.nan),
    }
    np.testing.assert_array_equal(
        frozen_rows(start, end), [True, False, False]
    )  # NaN: moved (diverged)
    np.testing.assert_array_equal(
        frozen_rows(jnp.zeros(3), jnp.zeros(3)), [True]
    )  # one chain
    res = cj.sample(
        jax.random.key(0),
        iid_step,
        Position(jnp.zeros((2, 1))),
        3,
        check_convergence=False,
    )
    assert "only 3 kept draws" in convergence_problems(res)[0]
    with pytest.raises(ValueError, match="result must be the RunResult"):
        convergence_problems(np.zeros((2, 10)))
    with pytest.raises(ValueError, match="check_convergence"):
        cj.sample(
            jax.random.key(0),
            iid_step,
            Position(jnp.zeros((2, 1))),
            3,
            check_convergence="yes",
        )


# ------------------------------------------------------------ the pooled warm-up


def test_pooled_warmup_restarts_chains_stuck_in_a_tail():
    """Eight schools' mechanism: 2 of 16 chains start where the bulk's step size rejects
    every proposal (x = 6 on exp(-x^4/4): curvature 108 there, ~1 in the bulk). Pooled,
    before: they never moved in 400 warm-up steps (their points inflated Welford's
    variance and (DA) shrank the step size for everyone). Now they restart from moving
    chains at the end of the first segment, and the step size is the one a warm-up from
    good starts finds (within 1.5x: the measured spread over seeds of a 400-step warm-up
    is 10%)."""
    x0 = 0.3 * jax.random.normal(jax.random.key(3), (16, 3))
    far = x0.at[:2].set(6.0)
    warm = ad.window_adaptation("mala", quartic)
    with warnings.catch_warnings():
        warnings.simplefilter(
            "error", RuntimeWarning
        )  # the hand-over is healthy: no collapse warning
        (states, params), info = warm.run_chains(jax.random.key(4), far, 400)
        (_, good), _ = warm.run_chains(jax.random.key(4), x0, 400)
    pos = np.asarray(states.position)
    assert np.all(np.abs(pos[:2]) < 3.0), pos[
        :2
    ]  # out of the tail (|x| < 3 has density e^-20 of the mode)
    assert int(np.sum(info.restarted)) >= 2 and bool(np.all(info.moved[-1]))
    ratio = float(params["step_size"]) / float(good["step_size"])
    assert 1 / 1.5 < ratio < 1.5, (params["step_size"], good["step_size"])
    np.testing.assert_array_equal(np.asarray(info.restarted).shape, (400,))


@pytest.mark.parametrize("x64", [False, True])
def test_a_collapsed_warmup_warns_with_what_happened(x64):
    """A density that is -inf off the start: every proposal that moves is rejected, so
    (DA) drives the step size down until proposals round to the start itself (accepted,
    but no chain moves). Silent before; now the hand-over warns with the step size, the
    acceptance and the chains that never moved."""
    with jax.enable_x64(x64):
        dtype = jnp.float64 if x64 else jnp.float32
        start = jnp.ones((4, 2), dtype)
        logp = lambda x: jnp.where(jnp.all(x == 1.0), 0.0, -jnp.inf)  # noqa: E731
        warm = ad.window_adaptation("mala", logp, preconditioner=None)
        with pytest.warns(RuntimeWarning, match="step size") as caught:
            warm.run_chains(jax.random.key(5), start, 150)
        text = " ".join(str(w.message) for w in caught)
        assert "adapted step size" in text and "4 of 4 chains never moved" in text, text


# ------------------------------------------------------------ positive definite,
# scale-invariant


KIDIQ_DIAGONAL = [
    34.8,
    3.6e-3,
    8.9e-4,
]  # window_adaptation's diagonal on the raw kidiq posterior (issue 18)


@pytest.mark.parametrize("x64", [False, True])
def test_the_adapted_diagonal_of_a_raw_scale_regression_is_positive_definite(x64):
    with jax.enable_x64(x64):
        dtype = jnp.float64 if x64 else jnp.float32
        D = jnp.asarray(KIDIQ_DIAGONAL, dtype)
        la.check_symmetric_psd(
            jnp.diag(D), "D", "test", definite=True
        )  # refused before: cond 3.9e4 > 8.4e4/3
        logp = lambda x: -0.5 * jnp.sum(x**2 / D)  # noqa: E731
        warm = ad.window_adaptation("mala", logp)
        sampler = warm.sampler(
            {"step_size": jnp.asarray(0.5, dtype), "D": D, "Q": None}
        )
        state = sampler.init(jnp.zeros(3, dtype), jax.random.key(0))
        state, info = sampler.step(jax.random.key(1), state)
        assert state.position.dtype == dtype and np.isfinite(
            float(info.acceptance_rate)
        )
        sde_proposal(
            jnp.diag(D) * 1e6, None, logp, 0.1
        )  # any scale: the test is on diag(D)^-1/2 D diag(D)^-1/2


def test_what_stays_refused_is_singular_at_the_dtypes_rounding():
    for bad in (
        np.diag([1.0, -1.0]),
        np.diag([1.0, 0.0]),
        np.array([[1.0, 1.0], [1.0, 1.0]]) * 1e-3,
    ):
        with pytest.raises(ValueError, match="positive definite"):
            la.check_symmetric_psd(bad, "D", "test", definite=True)
    # correlation 1 - 1e-9: definite in exact arithmetic, not at float32's rounding,
    # fine in float64
    m = (
        np.array([[1.0, 1.0 - 1e-9], [1.0 - 1e-9, 1.0]])
        * np.array([[1e3], [1e-3]]) ** 0.5
        * np.array([[1e3, 1e-3]]) ** 0.5
    )
    with pytest.raises(ValueError, match="rounding level"):
        la.check_symmetric_psd(m.astype(np.float32), "D", "test", definite=True)
    with jax.enable_x64(True):
        la.check_symmetric_psd(m, "D", "test", definite=True)


# ------------------------------------------------------------ many short chains with
# independent starts (convergence.judge_short_chains)

#: AR(1) of lag-1 correlation 0.96: tau = (1 + rho) / (1 - rho) = 49 draws. 300 draws
#: per chain: stationary chains have a split R-hat of about sqrt(1 / (1 - tau_150 /
#: 150)) = 1.17 (tau_150 = 41, the finite-n value) however many run, and 300 / tau_300
#: = 6.7 effective draws per chain (tau_300 = 45): the least of the 4 quantities' is
#: above MIN_EFFECTIVE_PER_CHAIN = 4 by ~3 sd of its estimate from 256 chain means (9%).
RHO, N_DRAWS, N_CHAINS = 0.96, 300, 256


class ModeState(NamedTuple):
    position: jax.Array
    centre: jax.Array


def ar1_step(key, state):
    z = jax.random.normal(key, state.position.shape, state.position.dtype)
    return Position(RHO * state.position + np.sqrt(1 - RHO**2) * z), ()


def two_mode_step(flip_rate):
    """Chains at +-2 (an AR(1) of sd 0.5 about their mode) that switch mode with
    probability ``flip_rate`` per step: a two-mode target's chains in miniature."""

    def step(key, state):
        k1, k2 = jax.random.split(key)
        flip = jax.random.uniform(k1, state.centre.shape) < flip_rate
        centre = jnp.where(flip, -state.centre, state.centre)
        z = jax.random.normal(k2, state.position.shape, state.position.dtype)
        pos = (
            centre
            + RHO * (state.position - state.centre)
            + 0.5 * np.sqrt(1 - RHO**2) * z
        )
        return ModeState(pos, centre), ()

    return step


def quiet_sample(seed, step, state, mode="trace", burn_in=0):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return cj.sample(
            jax.random.key(seed), step, state, N_DRAWS, mode=mode, burn_in=burn_in
        )


def test_short_chains_from_the_target_pass_as_many_chains_and_far_starts_do_not():
    from cenlmc_jax.diagnostics import nested, online
    from cenlmc_jax.diagnostics.convergence import (
        independent_chain_diagnostics,
        judge_short_chains,
    )
    from cenlmc_jax.diagnostics.layout import chains_first

    # starts from the target's own law and a burn-in of 200 steps, as the CLI's
    # built-in jobs: what the kept draws keep of the start is rho^200 = 1e-3 of it
    x0 = jax.random.normal(jax.random.key(0), (N_CHAINS, 2))
    res = quiet_sample(1, ar1_step, Position(x0), burn_in=200)
    # split R-hat alone fails them: 1.17 is the floor of chains this short (from 64 of
    # the 256, rank-normalised; its R² - 1 has a relative sd of ~12%: 1.15-1.19)
    plain = convergence_problems(res, x0, rhat_max=1.1)
    assert any("split R-hat of x[" in p and "> 1.1" in p for p in plain), plain
    notes = []
    assert (
        convergence_problems(res, x0, rhat_max=1.1, notes=notes, many_short_chains=True)
        == []
    )
    assert len(notes) == 1 and "the floor of short chains" in notes[0], notes
    # the same judgement of the streamed run's online split R-hat (the CLI's path)
    streamed = quiet_sample(1, ar1_step, Position(x0), mode="stream", burn_in=200)
    high = online.stream_problems(streamed.online, rhat_max=1.1, ess_min=-np.inf)
    assert high, "the online split R-hat is above 1.1 too"
    found, diag = judge_short_chains(streamed, x0, high, notes=notes)
    assert found == [] and diag.num_superchains == N_CHAINS and len(notes) == 2
    # each chain its own superchain: nested R-hat is the classic R-hat of whole chains
    # (float32 draws against the float64 statistics: 1e-4)
    stats = nested.chain_stats(chains_first(res), 1)
    diag = independent_chain_diagnostics(stats, x0)
    np.testing.assert_allclose(
        diag.nested_rhat[:2], nested.nested_rhat(chains_first(res), 1), rtol=1e-4
    )
    # the ESS of the pooled means is C n / tau_300 = 256 x 300 / 45 = 1,700; from 256
    # chain means its relative sd is sqrt(2 / 255) = 9%, 25% is ~3 sd
    np.testing.assert_allclose(diag.ess[:2], N_CHAINS * N_DRAWS / 45.0, rtol=0.25)
    # starts 5x wider than the target, no burn-in: a chain's mean keeps
    # x0 rho (1 - rho^n) / (n (1 - rho)) = 0.08 x0 of its start: a correlation of
    # ~0.7 with it (z ~ 14; at the target's own starts without burn-in, 0.2)
    far = 5.0 * x0
    found = convergence_problems(
        quiet_sample(1, ar1_step, Position(far)),
        far,
        rhat_max=1.1,
        many_short_chains=True,
    )
    assert any("split R-hat of x[" in p for p in found), found
    assert any("still remember where they started" in p for p in found), found


def test_chains_stuck_in_modes_are_not_excused():
    from cenlmc_jax.diagnostics.convergence import judge_short_chains

    x0 = 2.0 * jax.random.normal(jax.random.key(0), (N_CHAINS, 1))
    # each chain stays in the mode its start is nearest: its mean is 2 sign(x0), a
    # correlation of ~0.8 with its start (z ~ 18)
    stuck = quiet_sample(2, two_mode_step(0.0), ModeState(x0, 2.0 * jnp.sign(x0)))
    found = convergence_problems(stuck, x0, rhat_max=1.1, many_short_chains=True)
    assert any("split R-hat of x[0]" in p for p in found), found
    assert any("still remember where they started" in p for p in found), found
    # every chain starts in the mode at +2 and leaves it at a rate (1 in 400 steps) its
    # start does not change: the regression cannot see that memory, but each chain's
    # mean is mostly one mode's: about 2 effective draws per chain (< 4)
    one = 2.0 + 0.5 * x0 / 2.0
    res = quiet_sample(
        3, two_mode_step(1 / 400), ModeState(one, jnp.full_like(one, 2.0))
    )
    high = convergence_problems(res, one, rhat_max=1.1)
    assert high, "chains in different modes: split R-hat far above 1.1"
    found, diag = judge_short_chains(res, one, high)
    assert diag is not None and found[: len(high)] == high, found
    assert any("effective draws of x[0]" in p and "< 4" in p for p in found), found


def test_which_starts_are_judged_as_independent():
    from cenlmc_jax.diagnostics.convergence import (
        MIN_INDEPENDENT_CHAINS,
        independent_starts,
    )

    spread = jax.random.normal(jax.random.key(0), (MIN_INDEPENDENT_CHAINS, 3))
    np.testing.assert_array_equal(independent_starts(spread), np.asarray(spread))
    assert independent_starts(spread[:-1]) is None  # too few chains
    assert independent_starts(jnp.repeat(spread[:8], 4, axis=0)) is None  # superchains
    assert independent_starts(spread.at[:, 1].set(0.0)) is None  # a coordinate unspread
    assert independent_starts(spread.at[0, 0].set(jnp.nan)) is None
    assert independent_starts(None) is None
