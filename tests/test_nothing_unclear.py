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
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cenlmc_jax as cj


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
