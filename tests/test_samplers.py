"""Cross-cutting checks, one table over every sampler object (``cj.NAME(...) ->
SamplingAlgorithm``).

Each row builds a sampler the way a user would and a starting point; every
test below runs over every row:

* jit vs eager: the same step, compiled or not, gives the same state;
* float64 in gives float64 out (every floating leaf of state and info);
* the same key gives the same samples, and a typed key equals the legacy
  ``PRNGKey`` with the same seed (same bits);
* ``cj.sample`` traces the step once, and a second run with the same object
  reuses that compilation (``chex.assert_max_traces``);
* vmap: a batch of ensembles (ensemble samplers) or of chains
  (``cj.vmap_chains``) equals the runs one by one;
* one bad value per parameter raises ``ValueError`` naming it, in Python,
  when the sampler is built or initialised (before anything is traced).

The statistical tests of each sampler live in its own test file.
"""

from __future__ import annotations

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cenlmc_jax as cj

J = np.array([[0.0, 1.0], [-1.0, 0.0]])  # a skew-symmetric Q


def logdensity(x):
    return -0.5 * jnp.sum(x**2)


EST = cj.gradients.grad_estimator_from_logdensity(logdensity)

# name -> (builder(**overrides) -> SamplingAlgorithm, ensemble?)
BUILDERS = {
    "lmc": (
        lambda **kw: cj.lmc(**{"logdensity_fn": logdensity, "step_size": 0.1, **kw}),
        True,
    ),
    "enlmc": (
        lambda **kw: cj.enlmc(
            **{"logdensity_fn": logdensity, "step_size": 0.05, "eta": 0.8, **kw}
        ),
        True,
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
    ),
    "complete_recipe": (
        lambda **kw: cj.complete_recipe(
            **{"grad_estimator": EST, "step_size": 0.05, "D": np.eye(2), "Q": J, **kw}
        ),
        False,
    ),
    "sgld": (
        lambda **kw: cj.sgld(**{"grad_estimator": EST, "step_size": 0.05, **kw}),
        False,
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
    ),
    "sghmc": (
        lambda **kw: cj.sghmc(
            **{"grad_estimator": EST, "step_size": 0.05, "friction": 1.0, **kw}
        ),
        False,
    ),
    "sgrhmc": (
        lambda **kw: cj.sgrhmc(
            **{
                "grad_estimator": EST,
                "step_size": 0.05,
                "inv_metric_fn": cj.sgmcmc.gsgrhmc_inv_metric(lambda t: -logdensity(t)),
                **kw,
            }
        ),
        False,
    ),
    "irreversible_mh_gamma": (
        lambda **kw: cj.irreversible_mh(
            **{
                "logdensity_fn": logdensity,
                "proposal": cj.irreversible.gamma_proposal(2.0, 0.5),
                **kw,
            }
        ),
        False,
    ),
    "irreversible_mh_sde": (
        lambda **kw: cj.irreversible_mh(
            **{
                "logdensity_fn": logdensity,
                "proposal": cj.irreversible.sde_proposal(1.0, J, logdensity, 0.1),
                **kw,
            }
        ),
        False,
    ),
    "rwmh": (
        lambda **kw: cj.rwmh(**{"logdensity_fn": logdensity, "step_size": 0.5, **kw}),
        False,
    ),
    "mala": (
        lambda **kw: cj.mala(**{"logdensity_fn": logdensity, "step_size": 0.3, **kw}),
        False,
    ),
    "hmc": (
        lambda **kw: cj.hmc(
            **{
                "logdensity_fn": logdensity,
                "step_size": 0.3,
                "num_integration_steps": 4,
                **kw,
            }
        ),
        False,
    ),
    "autostep_hmc": (
        lambda **kw: cj.autostep_hmc(
            **{
                "logdensity_fn": logdensity,
                "step_size": 0.3,
                "num_integration_steps": 4,
                **kw,
            }
        ),
        False,
    ),
}
NAMES = sorted(BUILDERS)


def test_every_constructor_is_in_the_table():
    # the table above must cover every sampler the package exports
    exported = {name for name in cj.SAMPLERS}
    covered = {
        "irreversible_mh" if n.startswith("irreversible_mh") else n for n in BUILDERS
    }
    assert exported == covered
    for name, make in cj.SAMPLERS.items():
        assert getattr(cj, name) is make


def start(name, dtype=jnp.float32, seed=0):
    """(algorithm, initial state) with 16 particles or one chain, in d = 2."""
    make, ensemble = BUILDERS[name]
    algo = make()
    shape = (16, 2) if ensemble else (2,)
    x = jax.random.normal(jax.random.key(seed), shape, dtype=dtype)
    state = algo.init(x, jax.random.key(seed + 1))
    assert isinstance(algo, cj.SamplingAlgorithm)
    return algo, state


def leaves_equal(a, b, **tol):
    for x, y in zip(
        jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b), strict=True
    ):
        if tol:
            np.testing.assert_allclose(
                np.asarray(x, np.float64), np.asarray(y, np.float64), **tol
            )
        else:
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.parametrize("name", NAMES)
def test_jit_matches_eager(name):
    with jax.enable_x64(True):
        algo, state = start(name, jnp.float64)
        eager, jitted = state, state
        step = jax.jit(algo.step)
        for t in range(3):
            key = jax.random.key(10 + t)
            eager, _ = algo.step(key, eager)
            jitted, _ = step(key, jitted)
        # same arithmetic, compiled or not: float64 rounding of fused operations only
        leaves_equal(eager, jitted, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name", NAMES)
def test_float64_in_float64_out(name):
    with jax.enable_x64(True):
        algo, state = start(name, jnp.float64)
        new, info = jax.jit(algo.step)(jax.random.key(3), state)
        for leaf in jax.tree_util.tree_leaves((state, new, info)):
            if jnp.issubdtype(leaf.dtype, jnp.floating):
                assert leaf.dtype == jnp.float64, (name, leaf.dtype)


@pytest.mark.parametrize("name", NAMES)
def test_same_key_same_samples_and_typed_equals_legacy_key(name):
    algo, state = start(name)
    runs = [
        cj.sample(key, algo, state, 6, thin=2)
        for key in (jax.random.key(7), jax.random.key(7), jax.random.PRNGKey(7))
    ]
    leaves_equal(runs[0].trace, runs[1].trace)
    leaves_equal(runs[0].trace, runs[2].trace)  # same seed, same bits: same samples
    other = cj.sample(jax.random.key(8), algo, state, 6, thin=2)
    assert not np.array_equal(np.asarray(other.trace), np.asarray(runs[0].trace))


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.filterwarnings("ignore:the sampler diverged")
def test_sample_compiles_once_and_reuses_the_object(name):
    algo, state = start(name)
    chex.clear_trace_counter()
    counted = cj.SamplingAlgorithm(algo.init, chex.assert_max_traces(algo.step, n=1))
    # on_divergence="warn": a stop would replay the chunk up to the diverging step
    # (EnLMC at N = 16 is flagged unstable at once), a shorter program and so one more
    # trace, by design
    first = cj.sample(jax.random.key(1), counted, state, 4, on_divergence="warn")
    second = cj.sample(
        jax.random.key(2), counted, first.state, 4, on_divergence="warn"
    )  # a second run: no retrace
    assert second.num_steps_done == 4


@pytest.mark.parametrize("name", NAMES)
def test_vmap_over_ensembles_or_chains_equals_one_by_one(name):
    make, ensemble = BUILDERS[name]
    algo = make()
    batch = 3
    shape = (batch, 16, 2) if ensemble else (batch, 2)
    x = jax.random.normal(jax.random.key(4), shape)
    keys = jax.random.split(jax.random.key(5), batch)
    if ensemble:
        states = jax.vmap(algo.init)(x)
        new, _ = jax.jit(jax.vmap(algo.step))(keys, states)
        singles = [algo.step(keys[b], algo.init(x[b]))[0] for b in range(batch)]
    else:
        chains = cj.vmap_chains(algo)
        states = chains.init(x, jax.random.key(6))
        new, _ = jax.jit(chains.step)(jax.random.key(5), states)
        init_keys = jax.random.split(jax.random.key(6), batch)
        singles = [
            algo.step(keys[b], algo.init(x[b], init_keys[b]))[0] for b in range(batch)
        ]
    for b in range(batch):
        one = jax.tree_util.tree_map(lambda a: a[b], new)
        # vmapped vs unbatched: float32 rounding of the batched kernels
        leaves_equal(one, singles[b], rtol=1e-5, atol=1e-6)


# One bad value per parameter: (sampler, overrides, the name the message must carry).
BAD = [
    ("lmc", dict(step_size=0.0), "step_size"),
    ("lmc", dict(logdensity_fn=None), "logdensity_fn"),
    ("enlmc", dict(step_size=float("nan")), "step_size"),
    ("enlmc", dict(eta=-1.0), "eta"),
    ("enlmc", dict(blowup_factor=0.0), "blowup_factor"),
    ("enlmc", dict(dense_grad="yes"), "dense_grad"),
    ("enlmc", dict(grad_capacity=0), "grad_capacity"),
    ("enlmc", dict(method="fast"), "method"),
    ("cenlmc", dict(step_size=-0.1), "step_size"),
    ("cenlmc", dict(eta=0.0), "eta"),
    ("cenlmc", dict(r1=-1.0), "r1"),
    ("cenlmc", dict(r2=float("inf")), "r2"),
    ("cenlmc", dict(n_star=1.5), "n_star"),
    ("cenlmc", dict(n_star=16), "n_star"),  # N - 1 = 15 other particles
    ("cenlmc", dict(m_f=-1.0), "m_f"),
    ("cenlmc", dict(f_star=float("nan")), "f_star"),
    ("cenlmc", dict(dense_grad=1), "dense_grad"),
    ("cenlmc", dict(grad_capacity=100), "grad_capacity"),
    ("cenlmc", dict(strategy="tree"), "strategy"),
    ("complete_recipe", dict(grad_estimator=None), "grad_estimator"),
    ("complete_recipe", dict(step_size=0.0), "step_size"),
    ("complete_recipe", dict(D=-np.eye(2)), "D must be positive semidefinite"),
    ("complete_recipe", dict(Q=np.eye(2)), "Q must be skew-symmetric"),
    ("complete_recipe", dict(B_hat=np.ones((3, 3))), "B_hat"),
    ("sgld", dict(step_size=-1.0), "step_size"),
    ("sgld", dict(B_hat=50.0), "noise covariance"),
    ("sgrld", dict(inv_metric_fn="identity"), "inv_metric_fn"),
    ("sghmc", dict(friction=-1.0), "friction"),
    ("sghmc", dict(grad_estimator=3), "grad_estimator"),
    ("sgrhmc", dict(step_size=0.0), "step_size"),
    ("sgrhmc", dict(naive="no"), "naive"),
    ("sgrhmc", dict(inv_metric_fn=lambda t: -jnp.ones(2)), "inv_metric_fn"),
    ("sgrhmc", dict(B_hat=np.ones((2, 3))), "B_hat"),
    ("irreversible_mh_gamma", dict(proposal=0.5), "proposal"),
    ("irreversible_mh_gamma", dict(flip_on_reject="always"), "flip_on_reject"),
    ("irreversible_mh_gamma", dict(logdensity_fn="logp"), "logdensity_fn"),
    ("rwmh", dict(step_size=0.0), "step_size"),
    ("rwmh", dict(logdensity_fn=None), "logdensity_fn"),
    ("rwmh", dict(proposal_cov=np.array([[1.0, 2.0], [2.0, 1.0]])), "proposal_cov"),
    ("rwmh", dict(proposal_cov=0.0), "proposal_cov"),
    ("mala", dict(step_size=0.0), "step_size"),
    ("mala", dict(logdensity_fn=None), "logdensity_fn"),
    (
        "mala",
        dict(inverse_mass_matrix=np.array([[1.0, 2.0], [2.0, 1.0]])),
        "inverse_mass_matrix",
    ),
    ("mala", dict(inverse_mass_matrix=np.ones(3)), "inverse_mass_matrix"),
]


@pytest.mark.parametrize(
    "name, overrides, match", BAD, ids=[f"{n}-{'-'.join(o)}" for n, o, _ in BAD]
)
def test_bad_parameter_raises_value_error_before_tracing(name, overrides, match):
    make, ensemble = BUILDERS[name]
    x = jnp.zeros((16, 2)) if ensemble else jnp.zeros(2)
    if ensemble:
        x = jax.random.normal(jax.random.key(0), (16, 2))
    with pytest.raises(ValueError, match=match):
        algo = make(**overrides)  # built in Python ...
        state = algo.init(x)  # ... or initialised in Python: either way before any jit
        algo.step(
            jax.random.key(0), state
        )  # (eager: pair-force options are checked by their first use)


def test_bad_state_and_positions_raise():
    algo, _ = start("cenlmc")
    with pytest.raises(ValueError, match="positions"):
        algo.init(jnp.zeros(5))
    with pytest.raises(ValueError, match="state must be a CEnLMCState"):
        algo.step(jax.random.key(0), cj.lmc(logdensity, 0.1).init(jnp.zeros((4, 2))))
    with pytest.raises(ValueError, match="position"):
        cj.rwmh(logdensity, 0.5).init(jnp.zeros((3, 2)))
    with pytest.raises(ValueError, match="step_fn"):
        cj.sample(jax.random.key(0), "not a sampler", None, 3)


def test_sample_takes_the_object_or_its_step_and_gives_the_same_samples():
    algo, state = start("cenlmc")
    a = cj.sample(jax.random.key(1), algo, state, 5)
    b = cj.sample(jax.random.key(1), algo.step, state, 5)
    c = cj.sample(
        jax.random.key(1),
        functools.partial(
            cj.ensemble.cenlmc_step,
            logdensity_fn=logdensity,
            step_size=0.05,
            eta=0.8,
            r1=0.5,
            r2=0.5,
            n_star=2,
            m_f=10.0,
        ),
        state,
        5,
    )
    leaves_equal(a.trace, b.trace)
    leaves_equal(a.trace, c.trace)


def test_vmap_chains_checks_one_chain_in_python_before_vmapping():
    # jax.vmap(sampler.init) would trace the checks away (values unknown under vmap);
    # cj.vmap_chains(sampler).init runs chain 0 eagerly first, so the noise check fires
    noisy = cj.sgrhmc(
        EST, 0.1, 1.0, B_hat=50.0
    )  # 0.1 (2 - 0.1 * 50) < 0: not a covariance
    with pytest.raises(ValueError, match="noise covariance"):
        cj.vmap_chains(noisy).init(jnp.zeros((4, 1)))
    with pytest.raises(ValueError, match="positions"):
        cj.vmap_chains(cj.rwmh(logdensity, 0.5)).init(jnp.zeros(3))
