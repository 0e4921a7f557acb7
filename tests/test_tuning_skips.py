"""``tune_cenlmc`` skips its grid where no candidate can use the ensemble (issue 17, item 6, last row).

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
        out = cj.tune_cenlmc(jax.random.key(2), gaussian, x, 0.05, f_star=0.0, steps_per_trial=8, audit_size=4,
                             skip_hopeless=skip)
    return out, len(calls)


def test_grid_skipped_when_hopeless_and_the_choice_unchanged(monkeypatch):
    assert cj.tuning.suggest_cenlmc_params(4, 0.05, num_particles=16).expected_ensemble_fraction == 0.0
    skipped, n_skipped = tuned(monkeypatch, True)
    full, n_full = tuned(monkeypatch, False)
    assert n_skipped == 1 and n_full == 1 + 12 + 1  # first burn-in; 4 r1_passes x 3 radius_scales; settling
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
