"""``tune_cenlmc`` skips its grid where no candidate can use the ensemble (issue 17,
item 6, last row).

On a 4-D standard Gaussian with 16 particles the suggestion predicts an
ensemble fraction of exactly 0 (no particle can have N* neighbours), and the
first burn-in measures 0: the grid of 12 candidates and the settling run
cannot change that. The skip must run one trial instead of 14 and choose what
the full grid chooses (the same parameters, fraction 0); counted by wrapping
the compiled trial runner.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

import cenlmc_jax as cj
from cenlmc_jax.ensemble import tuning


def gaussian(x):
    return -0.5 * jnp.sum(x**2)


def tuned(monkeypatch, skip):
    calls = []
    make = tuning._trial_runner

    def counting(*args, **kwargs):
        run = make(*args, **kwargs)
        return lambda *a: calls.append(1) or run(*a)

    monkeypatch.setattr(tuning, "_trial_runner", counting)
    x = jax.random.normal(jax.random.key(1), (16, 4))
    with pytest.warns(UserWarning, match="ensemble"):
        out = cj.tune_cenlmc(
            jax.random.key(2),
            gaussian,
            x,
            0.05,
            f_star=0.0,
            steps_per_trial=8,
            audit_size=4,
            skip_hopeless=skip,
        )
    return out, len(calls)


def test_grid_skipped_when_hopeless_and_the_choice_unchanged(monkeypatch):
    assert (
        cj.ensemble.tuning.suggest_cenlmc_params(
            4, 0.05, num_particles=16
        ).expected_ensemble_fraction
        == 0.0
    )
    skipped, n_skipped = tuned(monkeypatch, True)
    full, n_full = tuned(monkeypatch, False)
    assert (
        n_skipped == 1 and n_full == 1 + 12 + 1
    )  # first burn-in; 4 r1_passes x 3 radius_scales; settling
    assert skipped.trials == [] and len(full.trials) == 12
    assert skipped.ensemble_fraction == full.ensemble_fraction == 0.0
    assert skipped.params.keys() == full.params.keys()
    for key, value in full.params.items():
        assert skipped.params[key] == pytest.approx(value, rel=1e-12), key
    assert skipped.grad_evals < full.grad_evals
    assert "grid skipped" in skipped.reasoning


def test_skip_hopeless_must_be_a_bool():
    x = jnp.zeros((16, 4))
    with pytest.raises(ValueError, match="skip_hopeless"):
        cj.tune_cenlmc(jax.random.key(0), gaussian, x, 0.05, skip_hopeless="yes")


def test_find_f_star_runs_lbfgs_once_per_start(monkeypatch):
    # The CLI finds the mode for its curvature probe, then cenlmc_init finds f* from the
    # same positions: one L-BFGS.
    from cenlmc_jax.ensemble import f_star as tn

    calls = []
    run = tn._lbfgs_minimise
    monkeypatch.setattr(tn, "_lbfgs_minimise", lambda *a: calls.append(1) or run(*a))
    monkeypatch.setattr(tn, "_LBFGS_MEMO", type(tn._LBFGS_MEMO)())

    def banana(x):
        return -0.5 * (x[0] ** 2 + 4.0 * (x[1] - x[0] ** 2) ** 2)

    x = jax.random.normal(jax.random.key(3), (32, 2))
    first = tn.find_f_star(banana, x)
    state = cj.ensemble.cenlmc_init(x, banana)
    assert len(calls) == 1
    assert float(state.f_star) == float(first.f_star) and bool(state.f_star_estimated)
    again = tn.find_f_star(banana, x + 0.1)  # another start point: its own L-BFGS
    # the mode has f = 0; stopped at |∇f| <= 3.5e-4 (float32), so f* errs by about
    # |∇f|²/(2μ) < 1e-6
    assert len(calls) == 2 and float(again.f_star) == pytest.approx(0.0, abs=1e-6)
