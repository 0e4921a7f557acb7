"""The CEnLMC burn-in tuner (cenlmc_jax/ensemble/tuning.py).

What cannot be faked: the tuner's figures are measured by the gradient audit
(true gradients), and a fresh run with the chosen parameters must reproduce
them; an impossible error cap must switch the ensemble off.
"""

import jax
import numpy as np
import pytest

import cenlmc_jax as cj
from cenlmc_jax.ensemble import AUDIT_BIAS_THRESHOLD, tune_cenlmc

H = 0.05


@pytest.mark.parametrize(
    "target",
    [cj.models.targets.standard_gaussian(2), cj.models.targets.banana()],
    ids=lambda t: t.name,
)
def test_tuner_reaches_the_fraction_and_a_fresh_run_reproduces_it(target, recwarn):
    """N = 1000: a fraction of 0.5 is reachable within the tuner's cap on the variance
    inflation (0.03); 0.6 is not on these targets (its candidates measured 0.02-0.09:
    the sd biased by 1-4.5%; the next test checks what the tuner does then).

    On the banana a run with the chosen parameters can lose a particle, and the test
    allows it there (only there). The ensemble force's weights ``1/p_j`` are bounded, by
    ``(4πh) exp((η+R1+R2)²/4h) = 345`` for the chosen radii, but heavy-tailed: now and
    then a particle is kicked by tens of times its drift (measured: h|F| = 29.8 against
    h|∇f| = 0.35 from one neighbour with 1/p_j = 94, the force equal to a float64
    recomputation). On N(0, I) such a kick is pulled back (curvature 1: every step
    contracts); on the banana, whose curvature ``1 + x1² + ...`` exceeds 2/h = 40 for
    |x1| > ~6, the gradient steps that follow diverge. Measured over 10 seeds of the
    whole test (jax 0.10): 5 of the banana's 300-step runs diverged (at steps 4, 75,
    126, 164, 281), none of 4 on the Gaussian; the seeds of this test diverge at step
    164 on jax 0.10, 141 on jax 0.9 and not on jax 0.8 (the float
    rounding differs, and the ensemble amplifies it: another realisation). Plain LMC (R1
    = 0) from the same states did not diverge (3 of the diverging seeds). So what the
    tuner promises is checked on the steps run, and a divergence must be the sampler's
    report of a lost particle, the run
    stopped at the last finite state."""
    x0 = jax.random.normal(jax.random.key(0), (1000, 2))
    tuned = tune_cenlmc(
        jax.random.key(1),
        target.logdensity_fn,
        x0,
        H,
        target_fraction=0.5,
        f_star=target.f_star,
    )
    assert tuned.ensemble_fraction >= 0.5 and tuned.noise_error <= 0.25, tuned.reasoning
    assert tuned.variance_inflation <= 0.03, tuned.reasoning
    assert (
        set(tuned.params) == {"eta", "r1", "r2", "n_star", "m_f"}
        and len(tuned.trials) == 12
    )
    # never non-finite particles (on the banana the settling run can lose one, as above;
    # the tuner then hands over the first burn-in's state and says so)
    assert bool(np.all(np.isfinite(np.asarray(tuned.state.position)))), tuned.reasoning
    # continue from the burnt-in state with the chosen parameters, audit on, and measure
    # again
    p = tuned.params
    check = cj.cenlmc(
        target.logdensity_fn,
        H,
        p["eta"],
        p["r1"],
        p["r2"],
        p["n_star"],
        p["m_f"],
        f_star=target.f_star,
        audit_size=64,
    )
    res = cj.sample(jax.random.key(2), check, tuned.state, 300, mode="stream")
    reported = [w for w in recwarn if "sampler diverged" in str(w.message)]
    assert len(reported) == (res.diverged_at >= 0), [
        str(w.message) for w in reported
    ]  # warned, once
    if res.diverged_at >= 0:
        assert target.name == "banana", res.diverged_at  # never on the Gaussian
        assert (
            res.num_steps_done == res.diverged_at
            and int(res.info.num_nonfinite[-1]) > 0
        )
        assert bool(np.all(np.isfinite(np.asarray(res.state.position))))
    # the figures over the steps run, a diverging step's included (its tests and audit
    # ran at finite positions): 300 steps x 1000 particles give the fraction a sampling
    # sd of ~0.01, one step ~0.02; the tuner measured 20 steps
    frac = float(np.mean(res.info.ensemble_fraction))
    assert abs(frac - tuned.ensemble_fraction) < 0.08, (frac, tuned.ensemble_fraction)
    assert float(np.nanmedian(np.asarray(res.info.audit_noise_error))) <= 0.25
    if res.diverged_at == -1:
        # the choice is not what the audit flags. The trial's 20 steps rarely hold a
        # kick, the 300 steps do: measured 0.011-0.028 in the trials, 0.014-0.019
        # (Gaussian) and 0.025-0.050 (banana) over these runs, inside the factor 2
        # between the tuner's cap and the flag. A run cut short ends on the kick that
        # began its divergence, which dominates its mean and the audit's running
        # estimate (measured: a mean of 0.31 over a run stopped at step 4): they say
        # nothing about the choice then, and only the figures above are checked.
        assert float(np.mean(res.info.audit_variance_inflation)) < AUDIT_BIAS_THRESHOLD
        assert not bool(np.any(res.info.biased))


def test_an_unreachable_fraction_takes_the_largest_candidate_within_the_caps():
    """R1 passing 90% reaches a fraction of ~0.76 on the 2-D Gaussian at N = 1000, but
    its measured inflation (0.05) is above the cap (0.03): the tuner keeps the
    suggestion's 70% (~0.59) and says so."""
    target = cj.models.targets.standard_gaussian(2)
    x0 = jax.random.normal(jax.random.key(0), (1000, 2))
    tuned = tune_cenlmc(
        jax.random.key(1),
        target.logdensity_fn,
        x0,
        H,
        target_fraction=0.75,
        f_star=target.f_star,
        r1_passes=(0.7, 0.9),
        radius_scales=(1.0,),
    )
    high = tuned.trials[1]
    assert high["ensemble_fraction"] >= 0.7 and high["variance_inflation"] > 0.03, (
        tuned.trials
    )
    assert (
        tuned.params["r1"] == tuned.trials[0]["r1"]
        and "no candidate reached" in tuned.reasoning
    )
    assert (
        tuned.ensemble_fraction == tuned.trials[0]["ensemble_fraction"]
        and tuned.variance_inflation <= 0.03
    )


def test_an_impossible_error_cap_switches_the_ensemble_off():
    target = cj.models.targets.standard_gaussian(2)
    x0 = jax.random.normal(jax.random.key(0), (500, 2))
    tuned = tune_cenlmc(
        jax.random.key(1),
        target.logdensity_fn,
        x0,
        H,
        max_noise_error=1e-6,
        f_star=target.f_star,
        steps_per_trial=8,
        r1_passes=(0.7,),
        radius_scales=(1.0,),
    )
    assert tuned.params["r1"] == 0.0 and "switched off" in tuned.reasoning
    res = cj.sample(jax.random.key(2), tuned.algorithm, tuned.state, 20, mode="stream")
    assert float(np.max(res.info.ensemble_fraction)) == 0.0  # CEnLMC is LMC now


def test_tuner_bad_input():
    target = cj.models.targets.standard_gaussian(2)
    x0 = jax.random.normal(jax.random.key(0), (100, 2))
    for kwargs, match in [
        (dict(target_fraction=1.5), "target_fraction"),
        (dict(max_noise_error=0.0), "max_noise"),
        (dict(max_variance_inflation=-1.0), "max_variance_inflation"),
        (dict(steps_per_trial=2), "steps_per_trial"),
        (dict(r1_passes=(1.2,)), "r1_passes"),
    ]:
        with pytest.raises(ValueError, match=match):
            tune_cenlmc(jax.random.key(1), target.logdensity_fn, x0, H, **kwargs)
