"""One table of bad inputs over every sampler in ``cj.SAMPLERS`` (the adversarial
probe's cases, kept).

Each sampler gets a small target (a standard Gaussian in d = 2: an ensemble
of 8 particles, or one chain) built the way a user would. Each case says what
is passed and what must come back: a ``ValueError`` naming the argument, in
Python, before anything is traced, or a ``RuntimeWarning`` naming the flag
(the driver's, for what only a run can show). A case applies to the samplers
that take that argument; the table runs every pair.

The mechanisms behind them (one check each, in ``cenlmc_jax._validation``
unless said): ``check_key`` in every ``init`` / ``step`` taking a key and in
``cj.vmap_chains``; ``check_state`` in every step (each sampler's state its
own class); ``check_position(s)`` (``d >= 1``); ``check_function`` /
``check_output`` (``jax.eval_shape``: the output shape and dtype of every user
function: log densities, gradients, estimators, matrices, schedules);
``check_schedule``; ``check_start_logdensity``; the driver's watch of the
chains (``cj.run._chunk_fn``: a chain that never moves in a chunk, or, for
Metropolis–Hastings samplers, whose acceptance probability is 0 at every step
of it).
"""

from __future__ import annotations

import inspect
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cenlmc_jax as cj

J = np.array([[0.0, 1.0], [-1.0, 0.0]])  # a skew-symmetric Q


def logdensity(x):
    return -0.5 * jnp.sum(x**2)


EST = cj.gradients.grad_estimator_from_logdensity(logdensity)

# name -> (build(**overrides) -> SamplingAlgorithm, ensemble?, the name of its user
# function)
MAKE = {
    "lmc": (
        lambda **kw: cj.lmc(**{"logdensity_fn": logdensity, "step_size": 0.1, **kw}),
        True,
        "logdensity_fn",
    ),
    "enlmc": (
        lambda **kw: cj.enlmc(
            **{"logdensity_fn": logdensity, "step_size": 0.05, "eta": 0.8, **kw}
        ),
        True,
        "logdensity_fn",
    ),
    "cenlmc": (
        lambda **kw: cj.cenlmc(
            **{
                "logdensity_fn": logdensity,
                "step_size": 0.05,
                "eta": 0.8,
                "r1": 0.5,
                "r2": 0.5,
                "n_star": 2,
                "m_f": 10.0,
                "f_star": 0.0,
                **kw,
            }
        ),
        True,
        "logdensity_fn",
    ),
    "complete_recipe": (
        lambda **kw: cj.complete_recipe(
            **{"grad_estimator": EST, "step_size": 0.05, "D": np.eye(2), "Q": J, **kw}
        ),
        False,
        "grad_estimator",
    ),
    "sgld": (
        lambda **kw: cj.sgld(**{"grad_estimator": EST, "step_size": 0.05, **kw}),
        False,
        "grad_estimator",
    ),
    "sgrld": (
        lambda **kw: cj.sgrld(
            **{
                "grad_estimator": EST,
                "step_size": 0.05,
                "inv_metric_fn": lambda t: 1.0 + t**2,
                **kw,
            }
        ),
        False,
        "grad_estimator",
    ),
    "sghmc": (
        lambda **kw: cj.sghmc(
            **{"grad_estimator": EST, "step_size": 0.05, "friction": 1.0, **kw}
        ),
        False,
        "grad_estimator",
    ),
    "sgrhmc": (
        lambda **kw: cj.sgrhmc(
            **{
                "grad_estimator": EST,
                "step_size": 0.05,
                "inv_metric_fn": cj.sgmcmc.gsgrhmc_inv_metric(
                    lambda t: 0.5 * jnp.sum(t**2)
                ),
                **kw,
            }
        ),
        False,
        "grad_estimator",
    ),
    "irreversible_mh": (
        lambda **kw: cj.irreversible_mh(
            **{
                "logdensity_fn": logdensity,
                "proposal": cj.irreversible.gamma_proposal(2.0, 0.5),
                **kw,
            }
        ),
        False,
        "logdensity_fn",
    ),
    "rwmh": (
        lambda **kw: cj.rwmh(**{"logdensity_fn": logdensity, "step_size": 0.5, **kw}),
        False,
        "logdensity_fn",
    ),
    "mala": (
        lambda **kw: cj.mala(**{"logdensity_fn": logdensity, "step_size": 0.5, **kw}),
        False,
        "logdensity_fn",
    ),
    "hmc": (
        lambda **kw: cj.hmc(
            **{
                "logdensity_fn": logdensity,
                "step_size": 0.5,
                "num_integration_steps": 3,
                **kw,
            }
        ),
        False,
        "logdensity_fn",
    ),
    "autostep_hmc": (
        lambda **kw: cj.autostep_hmc(
            **{
                "logdensity_fn": logdensity,
                "step_size": 0.5,
                "num_integration_steps": 3,
                **kw,
            }
        ),
        False,
        "logdensity_fn",
    ),
}
NAMES = sorted(cj.SAMPLERS)
ENSEMBLE = {n for n in NAMES if MAKE[n][1]}
SINGLE = set(NAMES) - ENSEMBLE
WITH_LOGDENSITY = {n for n in NAMES if MAKE[n][2] == "logdensity_fn"}
WITH_GRADIENT = {"lmc", "enlmc", "cenlmc"} | {
    n for n in NAMES if MAKE[n][2] == "grad_estimator"
}
WITH_SCHEDULE = {"complete_recipe", "sgld", "sgrld", "sghmc", "sgrhmc"}
MH = {"rwmh", "irreversible_mh", "mala"}
KEY = jax.random.key(0)


def x0(name, d=2, dtype=jnp.float32):
    shape = (8, d) if name in ENSEMBLE else (d,)
    return jax.random.normal(jax.random.key(1), shape, dtype)


def build(name, **kw):
    return MAKE[name][0](**kw)


def gradient_override(name, fn):
    """The user's gradient argument replaced by ``fn`` (a ``(d,) -> ?`` gradient)."""
    if MAKE[name][2] == "grad_estimator":
        return {"grad_estimator": lambda key, x: fn(x)}
    return {"grad_fn": fn}


def function_override(name, logdensity_fn):
    """The user's target function, from a log density (the estimator of it for the
    gradient samplers)."""
    if MAKE[name][2] == "grad_estimator":
        return {
            "grad_estimator": cj.gradients.grad_estimator_from_logdensity(logdensity_fn)
        }
    return {"logdensity_fn": logdensity_fn}


def state_of(name):
    return build(name).init(x0(name), jax.random.key(2))


# a state made by another sampler, for each sampler (the confusions that were silent:
# SGLD took an SGHMC state and dropped its momentum, RW-MH took an irreversible state
# and dropped its direction)
FOREIGN = {
    "lmc": "cenlmc",
    "enlmc": "cenlmc",
    "cenlmc": "enlmc",
    "complete_recipe": "sghmc",
    "sgld": "sghmc",
    "sgrld": "sgrhmc",
    "sghmc": "sgrhmc",
    "sgrhmc": "sghmc",
    "irreversible_mh": "rwmh",
    "rwmh": "irreversible_mh",
    "mala": "rwmh",
    "hmc": "mala",
    "autostep_hmc": "mala",
}


def run(name, algo, x, num_steps=40, chunk_size=20, **kw):
    state = algo.init(x, jax.random.key(2))
    return cj.sample(KEY, algo, state, num_steps, chunk_size=chunk_size, **kw)


def huge_positions(name):
    # 1e10 in float32: one ulp is 1024, the noise sqrt(2h) ~ 0.3: every step rounds away
    # (the chain is frozen)
    x = 1e10 + 1e5 * jnp.arange(16.0).reshape(8, 2)
    flat = lambda y: -0.5e-30 * jnp.sum(y**2)  # noqa: E731  (a nearly flat target: no drift to speak of)
    # EnLMC's audit also flags its (zero) ensemble force as unstable: go on, to see the
    # frozen chunks
    return run(
        name,
        build(name, logdensity_fn=flat),
        x,
        on_divergence="warn" if name == "enlmc" else "stop",
    )


def schedule_reaching_zero(name):
    # 0.05 for 10 steps, then 0: the chains freeze (no error inside the run: only the
    # driver can see it)
    return run(
        name, build(name, step_size=lambda t: jnp.where(t < 10, 0.05, 0.0)), x0(name)
    )


def zero_density_proposals(name):
    # a box of half-width 1e-3 and jumps of size ~1: every proposal lands where the
    # density is 0
    box = lambda z: jnp.where(jnp.all(jnp.abs(z) < 1e-3), 0.0, -jnp.inf)  # noqa: E731
    kw = (
        {"proposal": cj.irreversible.gamma_proposal(4.0, 1.0)}
        if name == "irreversible_mh"
        else {"step_size": 5.0}
    )
    return run(name, build(name, logdensity_fn=box, **kw), jnp.zeros(2))


def one_nan_chain(name):
    x = jnp.zeros((3, 2)).at[1, 0].set(jnp.nan)
    return cj.vmap_chains(build(name)).init(x, jax.random.key(2))


def minus_inf_at_every_chain(name):
    outside = lambda z: jnp.where(z[0] > 10.0, logdensity(z), -jnp.inf)  # noqa: E731
    return cj.vmap_chains(build(name, logdensity_fn=outside)).init(jnp.zeros((3, 2)))


def minus_inf_at_chain_zero_only(name):
    # the other chains start inside the support: fine (it used to check chain 0 only,
    # eagerly)
    half = lambda z: jnp.where(z[0] > 0.0, logdensity(z), -jnp.inf)  # noqa: E731
    chains = cj.vmap_chains(build(name, logdensity_fn=half))
    states = chains.init(jnp.array([[-1.0, 0.0], [1.0, 0.0], [2.0, 0.0]]))
    assert np.isneginf(np.asarray(states.logdensity)[0])


def uniform_init_through_vmap_chains(name):
    algo = build(name)
    params = list(inspect.signature(algo.init).parameters.values())
    assert [(p.name, p.default) for p in params[1:]] == [("rng_key", None)], (
        params
    )  # every init alike
    states = cj.vmap_chains(algo).init(jnp.zeros((3, 2)), jax.random.key(2))
    new, _ = jax.jit(cj.vmap_chains(algo).step)(KEY, states)
    assert np.all(np.isfinite(np.asarray(jax.tree_util.tree_leaves(new.position)[0])))


def dict_position(name):
    tree_logdensity = lambda p: -0.5 * (jnp.sum(p["w"] ** 2) + p["b"] ** 2)  # noqa: E731
    q3 = np.array(
        [[0.0, 1.0, 0.0], [-1.0, 0.0, 0.0], [0.0, 0.0, 0.0]]
    )  # the matrices see the flat (3,) vector
    extra = {"D": np.eye(3), "Q": q3} if name == "complete_recipe" else {}
    algo = build(name, **function_override(name, tree_logdensity), **extra)
    state = algo.init(
        {"w": jnp.array([0.3, -0.2]), "b": jnp.asarray(0.5)}, jax.random.key(2)
    )
    res = cj.sample(KEY, algo, state, 5, trace_fn=lambda s: s.position["w"])
    assert res.trace.shape == (5, 2) and np.all(np.isfinite(np.asarray(res.trace)))
    assert isinstance(res.state.position, dict)


def unstable_sghmc(name):
    # ε = 1.5 on N(0, I): unstable; flagged at the kick bound (step 4), long before the
    # float overflow (step ~300 with blowup_factor=inf), so the moments kept are finite
    res = run(
        name,
        build(name, step_size=1.5),
        jnp.ones(2),
        num_steps=500,
        chunk_size=500,
        mode="stream",
    )
    assert 0 <= res.diverged_at < 50 and np.all(
        np.isfinite(np.asarray(res.moments.mean))
    )


def _step_with_key(key):
    return lambda name: build(name).step(key, state_of(name))


# (case, samplers it applies to, what is passed, "raises" / "warns", the message must
# match)
CASES = [
    ("step: a Python int key", NAMES, _step_with_key(0), "raises", "rng_key"),
    ("step: a string key", NAMES, _step_with_key("key"), "raises", "rng_key"),
    ("step: float (2,) key", NAMES, _step_with_key(jnp.zeros(2)), "raises", "rng_key"),
    (
        "step: uint32 (3,) key",
        NAMES,
        _step_with_key(jnp.zeros(3, jnp.uint32)),
        "raises",
        "rng_key",
    ),
    (
        "step: a batch of keys",
        NAMES,
        _step_with_key(jax.random.split(KEY, 2)),
        "raises",
        "rng_key",
    ),
    ("init: a bad key", NAMES, lambda n: build(n).init(x0(n), 3), "raises", "rng_key"),
    (
        "vmap_chains init: a bad key",
        SINGLE,
        lambda n: cj.vmap_chains(build(n)).init(jnp.zeros((3, 2)), "k"),
        "raises",
        "rng_key",
    ),
    (
        "vmap_chains step: a bad key",
        SINGLE,
        lambda n: cj.vmap_chains(build(n)).step(
            0, cj.vmap_chains(build(n)).init(jnp.zeros((3, 2)))
        ),
        "raises",
        "rng_key",
    ),
    (
        "cj.sample: a bad key",
        NAMES,
        lambda n: cj.sample(1, build(n), state_of(n), 3),
        "raises",
        "rng_key",
    ),
    (
        "step: another sampler's state",
        NAMES,
        lambda n: build(n).step(KEY, state_of(FOREIGN[n])),
        "raises",
        "state must be a",
    ),
    (
        "step: a batch of chains' states",
        SINGLE,
        lambda n: build(n).step(KEY, cj.vmap_chains(build(n)).init(jnp.zeros((3, 2)))),
        "raises",
        r"position must have shape \(d,\)",
    ),
    (
        "init: d = 0",
        NAMES,
        lambda n: build(n).init(jnp.zeros((8, 0) if n in ENSEMBLE else (0,))),
        "raises",
        r"positions? must have .*d >= 1",
    ),
    (
        "vmap_chains init: d = 0",
        SINGLE,
        lambda n: cj.vmap_chains(build(n)).init(jnp.zeros((3, 0))),
        "raises",
        r"positions must have d >= 1",
    ),
    (
        "gradient returns a scalar",
        WITH_GRADIENT,
        lambda n: build(n, **gradient_override(n, lambda x: jnp.sum(x))).init(x0(n)),
        "raises",
        r"(grad_fn|grad_estimator) must return shape \(2,\)",
    ),
    (
        "gradient returns (1,)",
        WITH_GRADIENT,
        lambda n: build(
            n, **gradient_override(n, lambda x: jnp.sum(x, keepdims=True))
        ).init(x0(n)),
        "raises",
        r"(grad_fn|grad_estimator) must return shape \(2,\)",
    ),
    (
        "gradient returns an integer array",
        WITH_GRADIENT,
        lambda n: build(
            n, **gradient_override(n, lambda x: jnp.zeros(2, jnp.int32))
        ).init(x0(n)),
        "raises",
        r"(grad_fn|grad_estimator) must return a floating",
    ),
    (
        "log density returns a vector",
        WITH_LOGDENSITY,
        lambda n: build(n, logdensity_fn=lambda x: -(x**2)).init(x0(n)),
        "raises",
        "logdensity_fn must return a scalar",
    ),
    (
        "log density -inf at every starting point",
        WITH_LOGDENSITY,
        lambda n: build(
            n, logdensity_fn=lambda x: jnp.where(jnp.sum(x) > 1e6, 0.0, -jnp.inf)
        ).init(x0(n)),
        "raises",
        "logdensity_fn is -inf or NaN at every",
    ),
    (
        "log density NaN at every starting point",
        WITH_LOGDENSITY,
        lambda n: build(n, logdensity_fn=lambda x: jnp.sum(x) * jnp.nan).init(x0(n)),
        "raises",
        "logdensity_fn is -inf or NaN at every",
    ),
    (
        "schedule returns a vector",
        WITH_SCHEDULE,
        lambda n: build(n, step_size=lambda t: jnp.full(2, 0.1)),
        "raises",
        "step_size must return a scalar",
    ),
    (
        "schedule is 0 at the first step",
        WITH_SCHEDULE,
        lambda n: build(n, step_size=lambda t: 0.0 * t),
        "raises",
        r"step_size\(0\)",
    ),
    (
        "schedule reaches 0 in the run",
        WITH_SCHEDULE,
        schedule_reaching_zero,
        "warns",
        "diverged",
    ),
    (
        "positions beyond the float's resolution",
        ENSEMBLE,
        huge_positions,
        "warns",
        "did not move",
    ),
    (
        "every proposal into zero density",
        MH,
        zero_density_proposals,
        "warns",
        "acceptance probability collapsed to 0",
    ),
    (
        "vmap_chains: one chain NaN",
        SINGLE,
        one_nan_chain,
        "raises",
        r"positions must be finite.*chains \[1\]",
    ),
    (
        "vmap_chains: -inf at every chain",
        SINGLE & WITH_LOGDENSITY,
        minus_inf_at_every_chain,
        "raises",
        "every one of the 3 chains",
    ),
    (
        "vmap_chains: -inf at chain 0 only",
        SINGLE & WITH_LOGDENSITY,
        minus_inf_at_chain_zero_only,
        "ok",
        None,
    ),
    (
        "init(position, rng_key=None) for vmap_chains",
        SINGLE,
        uniform_init_through_vmap_chains,
        "ok",
        None,
    ),
    ("a dict position", SINGLE, dict_position, "ok", None),
    (
        "SGRLD metric not PSD",
        {"sgrld"},
        lambda n: build(n, inv_metric_fn=lambda t: -jnp.ones(2)).init(x0(n)),
        "raises",
        "inv_metric_fn must be positive semidefinite",
    ),
    (
        "SGRLD metric of the wrong shape",
        {"sgrld"},
        lambda n: build(n, inv_metric_fn=lambda t: jnp.ones(3)).init(x0(n)),
        "raises",
        "inv_metric_fn must return shape",
    ),
    ("SGHMC at an unstable step size", {"sghmc"}, unstable_sghmc, "warns", "diverged"),
]
TABLE = [(n, case) for case in CASES for n in NAMES if n in case[1]]


@pytest.mark.parametrize("name, case", TABLE, ids=[f"{n}: {c[0]}" for n, c in TABLE])
def test_input_table(name, case):
    _, _, passed, expect, match = case
    if expect == "raises":
        with pytest.raises(ValueError, match=match):
            passed(name)
    elif expect == "warns":
        with pytest.warns(RuntimeWarning, match=match):
            passed(name)
    else:
        with warnings.catch_warnings():
            warnings.simplefilter(
                "error", RuntimeWarning
            )  # a correct input: no flag either
            passed(name)


def test_the_table_covers_every_sampler():
    assert set(MAKE) == set(cj.SAMPLERS)
    for name in NAMES:
        assert sum(name in case[1] for case in CASES) >= 12, name


def test_a_healthy_run_raises_no_flag():
    # the watch must not cry wolf: every sampler on its target, 60 steps in chunks of
    # 20, no warning
    for name in NAMES:
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)
            algo = build(name)
            # EnLMC is unstable by design (Theorem 3.2): its own flags are its business
            if name == "enlmc":
                continue
            cj.sample(
                KEY, algo, algo.init(x0(name), jax.random.key(2)), 60, chunk_size=20
            )
