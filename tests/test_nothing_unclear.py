"""Issue 47 ("Nothing lost, nothing unclear"): the samplers' defects, each with the
test that failed before its fix.

* a log density that raises (a Python exception inside the model) came back as a
  ``ValueError`` wrapping it, the model's own exception type lost ->
  test_a_raising_model_keeps_its_exception_type
* ``mesh=`` with ``method="dense"`` was accepted by ``cj.cenlmc`` / ``cj.enlmc`` and
  ``init``, and refused only when ``cj.sample`` traced the first step ->
  test_a_mesh_with_the_dense_method_is_refused_at_construction
* default LMC (no log density evaluated) flagged a divergence only when the gradient
  or the square of a position overflowed: a region where log p is NaN with a zero
  gradient went unflagged (``diverged_at = -1``), and on a quartic a streamed run kept
  moments of 1e16 one step after the tracked run had stopped ->
  test_lmc_flags_a_nan_region_with_a_zero_gradient,
  test_lmc_flags_an_exploding_quartic_when_the_tracked_run_does
* CEnLMC with radii a user may well try returned sds off by 1.1-2x with the gradient
  audit quiet in a run under 200 steps (its flag waited for 200 steps whatever the
  evidence) -> test_cenlmc_radii_that_bias_the_sds_are_flagged (and the suggested
  parameters stay quiet)
"""

from __future__ import annotations

import math
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cenlmc_jax as cj
from cenlmc_jax.ensemble.audit import AUDIT_EARLY_MIN_STEPS


class ModelError(Exception):
    """A user's own exception class, raised inside a model."""


def raises_model_error(x):
    raise ModelError("the model's own failure")


def divides_by_zero(x):
    return -0.5 * jnp.sum(x**2) + 1 / 0


class NeedsTwoArguments(Exception):
    """An exception whose class cannot be rebuilt from one message."""

    def __init__(self, code, detail):
        super().__init__(f"{code}: {detail}")


def raises_unrebuildable(x):
    raise NeedsTwoArguments(7, "detail")


@pytest.mark.parametrize(
    ("fn", "exc_type", "text"),
    [
        (raises_model_error, ModelError, "the model's own failure"),
        (divides_by_zero, ZeroDivisionError, "division by zero"),
        (raises_unrebuildable, NeedsTwoArguments, "7: detail"),
    ],
)
@pytest.mark.parametrize("entry", ["lmc", "mala", "vmap_chains"])
def test_a_raising_model_keeps_its_exception_type(fn, exc_type, text, entry):
    build = {
        "lmc": lambda: cj.lmc(fn, 0.1).init(jnp.zeros((8, 2))),
        "mala": lambda: cj.mala(fn, 0.1).init(jnp.zeros(2)),
        "vmap_chains": lambda: cj.vmap_chains(cj.mala(fn, 0.1)).init(
            jnp.zeros((3, 2)), jax.random.key(0)
        ),
    }[entry]
    with pytest.raises(exc_type, match=text) as info:
        build()
    # the model is named, and its exception is kept (chained, or itself with a note)
    shown = str(info.value) + "".join(getattr(info.value, "__notes__", []))
    assert "logdensity_fn" in shown, shown
    assert info.value.__cause__ is not None or exc_type is NeedsTwoArguments


def gaussian(x):
    return -0.5 * jnp.sum(x**2)


@pytest.mark.parametrize(
    "build",
    [
        lambda **kw: cj.cenlmc(
            gaussian, 0.05, 0.4, 0.5, 0.4, 5, 10.0, f_star=0.0, **kw
        ),
        lambda **kw: cj.enlmc(gaussian, 0.05, 0.4, **kw),
    ],
    ids=["cenlmc", "enlmc"],
)
def test_a_mesh_with_the_dense_method_is_refused_at_construction(build):
    mesh = cj.pairwise.make_mesh(1)  # one device is enough: the refusal is static
    with pytest.raises(ValueError, match=r"mesh=.*method='dense'") as info:
        build(mesh=mesh, method="dense")
    assert "'auto', 'tiled' or 'pallas'" in str(info.value)
    # the same options are fine without the mesh, or with a method that shards
    build(method="dense")
    build(mesh=mesh, method="tiled")


def nan_beyond_three(x):
    # NaN beyond |x0| > 3; the gradient of the untaken branch of a where is 0 there
    return jnp.where(jnp.abs(x[0]) > 3, jnp.nan, -0.5 * x @ x)


def test_lmc_flags_a_nan_region_with_a_zero_gradient():
    # h = 1.5 from x0 = 2.5: x' = -1.25 + sqrt(3) xi, beyond |x0| = 3 with probability
    # ~0.1 per particle and step, so 16 particles reach the NaN region within a step or
    # two (seed fixed)
    x0 = jnp.zeros((16, 2)).at[:, 0].set(2.5)
    algo = cj.lmc(nan_beyond_three, 1.5)
    with pytest.warns(RuntimeWarning, match="diverged"):
        res = cj.sample(jax.random.key(0), algo, algo.init(x0), 20)
    assert res.diverged_at >= 0
    assert bool(res.info.diverged[res.diverged_at])
    # the first flagged step is the first that put a particle beyond |x0| = 3
    positions = np.asarray(res.trace)  # the kept states, up to the last good step
    assert positions.shape[0] == res.diverged_at
    assert np.all(np.abs(positions[..., 0]) <= 3)


def test_lmc_checks_the_value_only_where_a_gradient_vanishes():
    # a Gaussian: no gradient is exactly 0, so no log density is evaluated (the cost
    # stays N model solves a step) and nothing is flagged
    x0 = jax.random.normal(jax.random.key(0), (16, 2))
    algo = cj.lmc(nan_beyond_three, 0.1)
    state = algo.init(x0)
    state, info = algo.step(jax.random.key(1), state)
    assert not bool(info.diverged) and float(info.model_solves) == 16
    # a particle on the NaN side: its gradient is 0, its value is evaluated and NaN
    state = state._replace(position=state.position.at[3, 0].set(5.0))
    state = state._replace(logdensity_grad=state.logdensity_grad.at[3].set(0.0))
    _, info = algo.step(jax.random.key(2), state)
    # x' = 5 + sqrt(0.2) xi stays beyond 3 (a 4.5 sigma move back is needed)
    assert bool(info.diverged) and int(info.num_nonfinite) == 1
    assert float(info.model_solves) == 32  # the gradients, then the values


def quartic(x):
    return -jnp.sum(x**4)


def test_lmc_flags_an_exploding_quartic_when_the_tracked_run_does():
    # h = 0.3 on -x^4 from N(0, I) starts overshoots (x' = x - 1.2 x^3): the tracked run
    # stops when log p = -x^4 overflows; the default run now stops at the same step (x
    # times the gradient, 4 x^4, overflows with it), not one step later with moments
    # of 1e16 (10 steps: the divergence comes at step 2)
    x0 = jax.random.normal(jax.random.key(0), (64, 2))
    runs = {}
    for tracked in (False, True):
        algo = cj.lmc(quartic, 0.3, track_logdensity=tracked)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            runs[tracked] = cj.sample(
                jax.random.key(1), algo, algo.init(x0), 10, mode="stream"
            )
    assert runs[True].diverged_at >= 0
    assert runs[False].diverged_at == runs[True].diverged_at
    # the same kept steps, so the same moments (bit for bit: the same positions)
    np.testing.assert_array_equal(runs[False].moments.m2, runs[True].moments.m2)
    assert np.all(np.isfinite(np.asarray(runs[False].moments.m2)))


# CEnLMC on N(0, diag(1, 0.1²)) (curvatures 1 and 100), N = 512, h = 0.002 (ULA's own
# bias on the narrow sd: 1/sqrt(1 - hL/2) = +5.4%), from the suggestion for d = 2 and
# this h (unit scale: eta = R2 = sqrt(hd) = 0.063, R1 = 0.098, N* = 5, M_f = 4.6), and
# four changes a user may well try. Measured over this test's 300 kept steps (seeds as
# below, jax 0.10 CPU), the narrow sd against ULA's, the kept mean of
# audit_variance_inflation / audit_drift_bias and the first flagged step: suggested
# +2.6%, 0.032 / -0.012, none; eta = r1 = 0.1 (the narrow sd) +3.9%, 0.051 / -0.022,
# step 330; r1 = r2 = 5 +99%, 1.14 / -0.71, step 19; eta = 100 +10%, 0.012 / -0.34,
# step 19; n_star = 1 +5.7%, 0.069 / -0.014, step 199. The systematic ones (the force
# too weak along the gradient) are flagged by the early flag at its first chance; the
# noisy ones by the 200-step rule (the inflation is a mean over coordinates: the
# narrow coordinate's is about twice it here).
NARROW = jnp.array([1.0, 0.1])
SUGGESTED = dict(eta=0.0632456, r1=0.0981416, r2=0.0632456, n_star=5, m_f=4.60517)


def narrow_gaussian(x):
    return -0.5 * jnp.sum((x / NARROW) ** 2)


@pytest.mark.parametrize(
    ("change", "expect"),
    [
        ({}, "quiet"),
        # borderline here: over seeds 2-4 its narrow sd was +5.5%, +3.1% and +6.2%
        # against ULA, flagged in the two beyond the audit's ~3% sd tolerance; this
        # seed's run (+4%) is flagged, and what is asserted is the audit's contract
        (dict(eta=0.1, r1=0.1), "flagged_or_within"),
        (dict(r1=5.0, r2=5.0), "early"),
        (dict(eta=100.0), "early"),
        # flagged on seeds 2-4 too (narrow sd +6.8% to +7.5%)
        (dict(n_star=1), "flagged"),
    ],
    ids=["suggested", "eta=r1=narrow_sd", "r1=r2=5", "huge_eta", "n_star=1"],
)
def test_cenlmc_radii_that_bias_the_sds_are_flagged(change, expect):
    h, n, burn_in, steps = 0.002, 512, 100, 300
    suggested = cj.ensemble.tuning.suggest_cenlmc_params(2, h, num_particles=n)
    got = {k: getattr(suggested, k) for k in SUGGESTED}
    # the configuration is the one measured above (the suggestion's rounding)
    assert got == pytest.approx(SUGGESTED, rel=1e-5)
    p = {**got, **change}
    algo = cj.cenlmc(
        narrow_gaussian,
        h,
        p["eta"],
        p["r1"],
        p["r2"],
        p["n_star"],
        p["m_f"],
        f_star=0.0,
    )
    x0 = jax.random.normal(jax.random.key(0), (n, 2)) * NARROW
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = cj.sample(
            jax.random.key(1),
            algo,
            algo.init(x0),
            steps,
            burn_in=burn_in,
            mode="stream",
            check_convergence=False,
        )
    warned = [str(w.message) for w in caught if "gradient audit" in str(w.message)]
    biased = np.asarray(res.info.biased)
    # the narrow sd against ULA's (a stream of 512 x 300 draws: its Monte-Carlo error
    # is ~1%, the narrow coordinate relaxing in ~5 steps)
    sd = np.sqrt(np.asarray(res.moments.m2 / res.moments.count))
    off = sd[1] / (0.1 / math.sqrt(1 - h * 100 / 2)) - 1
    if expect == "quiet":  # the suggestion: no false alarm
        assert not biased.any() and not warned, warned
        assert off < 0.035, off  # and rightly so (+2.6% measured)
        return
    if expect == "flagged_or_within":
        # the audit's tolerance: AUDIT_BIAS_THRESHOLD 0.06 on the variance, the sd
        # ~3% (0.035: 3% and the stream's Monte-Carlo error)
        assert biased[burn_in:].any() or off < 0.035, off
        return
    assert biased[burn_in:].any() and len(warned) == 1
    assert off > 0.03, off  # the flag is right: beyond the suggestion's +2.6%
    if expect == "early":
        # the force systematically too weak along the gradient, beyond its noise long
        # before the 200-step window: flagged at its first chance (20 audited steps)
        assert int(np.argmax(biased)) == AUDIT_EARLY_MIN_STEPS - 1
