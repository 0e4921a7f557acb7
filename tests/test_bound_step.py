"""A rebuilt sampler with equal parameters reuses cj.sample's compiled run
(cenlmc_jax/_steps.py)."""

import jax
import jax.numpy as jnp
import numpy as np

import cenlmc_jax as cj
from cenlmc_jax import run
from cenlmc_jax._steps import bound_step

TGT = cj.models.targets.standard_gaussian(2)
X0 = jax.random.normal(
    jax.random.key(0), (16, 2)
)  # small: the test is about compiling, not sampling


def _build(name, step_size=0.05):
    if name == "cenlmc":
        return cj.cenlmc(
            TGT.logdensity_fn, step_size, 0.3, 0.5, 0.3, 5, 10.0, f_star=TGT.f_star
        )
    return cj.enlmc(TGT.logdensity_fn, step_size, 0.3)


def test_a_rebuilt_sampler_compiles_the_run_once():
    first, second = _build("cenlmc"), _build("cenlmc")
    assert first.step is second.step  # equal parameters: the same step function
    before = run._chunk_fn.cache_info()
    a = cj.sample(
        jax.random.key(1),
        first,
        first.init(X0),
        5,
        check_convergence=False,
        on_divergence="warn",
    )
    mid = run._chunk_fn.cache_info()
    b = cj.sample(
        jax.random.key(1),
        second,
        second.init(X0),
        5,
        check_convergence=False,
        on_divergence="warn",
    )
    after = run._chunk_fn.cache_info()
    assert mid.misses > before.misses  # the first run built its chunk
    assert after.misses == mid.misses and after.hits > mid.hits  # the second found it
    np.testing.assert_array_equal(
        np.asarray(a.trace), np.asarray(b.trace)
    )  # and it is the same run


def test_other_parameters_or_functions_are_other_steps():
    base = _build("cenlmc")
    assert (
        _build("enlmc").step is _build("enlmc").step
        and _build("enlmc").step is not base.step
    )
    assert base.step is not _build("cenlmc", step_size=0.06).step
    assert (
        base.step
        is not cj.cenlmc(
            lambda x: -0.5 * jnp.sum(x**2), 0.05, 0.3, 0.5, 0.3, 5, 10.0, f_star=0.0
        ).step
    )
    # 1 == 1.0, but an int and a float parameter may trace differently: the type is part
    # of the key
    assert bound_step(max, step_size=1) is not bound_step(max, step_size=1.0)
    assert bound_step(max, step_size=1.0) is bound_step(max, step_size=1.0)


def test_an_unhashable_parameter_gives_a_fresh_step():
    # an array (or a tracer, under jax.grad) cannot be hashed: a fresh closure, shared
    # with nothing
    h = jnp.asarray(0.05)
    assert bound_step(cj.ensemble.cenlmc_step, step_size=h) is not bound_step(
        cj.ensemble.cenlmc_step, step_size=h
    )

    def traced(step_size):
        a, b = (
            bound_step(cj.ensemble.enlmc_step, step_size=step_size),
            bound_step(cj.ensemble.enlmc_step, step_size=step_size),
        )
        assert a is not b
        return step_size

    assert (
        jax.grad(traced)(0.05) == 1.0
    )  # (jax.grad through cj.sample itself: tests/test_differentiable.py)
    step = bound_step(cj.ensemble.enlmc_step, step_size=0.05)
    assert step.__name__ == "enlmc_step" and callable(
        step
    )  # a plain function (inspect, chex see one)
