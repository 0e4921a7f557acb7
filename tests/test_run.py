"""Tests of the lax.scan driver: thinning, streaming moments, compile-once,
checkpoints."""

import functools
import os
import warnings
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cenlmc_jax as cj
from cenlmc_jax.models import targets

TGT = targets.standard_gaussian(3)
STATE = cj.ensemble.lmc_init(
    jax.random.normal(jax.random.key(0), (200, 3)), TGT.logdensity_fn
)
STEP = functools.partial(
    cj.ensemble.lmc_step, logdensity_fn=TGT.logdensity_fn, step_size=0.1
)


def test_trace_shape_thinning_and_reduced_info():
    res = cj.sample(
        jax.random.key(1), STEP, STATE, 60, thin=3, burn_in=7, chunk_size=30
    )
    assert res.trace.shape == (20, 200, 3)
    assert res.info.grad_evals.shape == (67,)  # burn-in steps' infos are kept
    assert int(res.info.grad_evals.sum()) == 67 * 200
    assert res.num_steps_done == 67 and res.diverged_at == -1


def test_chunking_does_not_change_the_samples():
    """Step t uses fold_in(key, t): any chunking gives the same run."""
    a = cj.sample(jax.random.key(1), STEP, STATE, 60, thin=3, chunk_size=60)
    b = cj.sample(jax.random.key(1), STEP, STATE, 60, thin=3, chunk_size=12)
    # identical operations per step; only the grouping into XLA programs differs
    np.testing.assert_allclose(a.trace, b.trace, rtol=1e-6, atol=1e-6)


def test_stream_moments_equal_moments_of_the_trace():
    tr = cj.sample(jax.random.key(2), STEP, STATE, 40, thin=2, burn_in=10)
    st = cj.sample(
        jax.random.key(2),
        STEP,
        STATE,
        40,
        thin=2,
        burn_in=10,
        mode="stream",
        chunk_size=20,
    )
    assert st.trace is None
    flat = np.asarray(tr.trace, np.float64).reshape(-1, 3)
    assert float(st.moments.count) == flat.shape[0]
    # Chan's update in float32 vs a float64 two-pass: agreement to float32 rounding
    np.testing.assert_allclose(st.moments.mean, flat.mean(axis=0), atol=1e-5)
    np.testing.assert_allclose(st.moments.variance, flat.var(axis=0), rtol=1e-5)
    np.testing.assert_allclose(
        st.state.position, tr.state.position, rtol=1e-6, atol=1e-6
    )


def test_compiles_once_per_configuration():
    @chex.assert_max_traces(n=1)
    def step(key, state):
        return cj.ensemble.lmc_step(key, state, TGT.logdensity_fn, 0.1)

    cj.sample(
        jax.random.key(0), step, STATE, 20, chunk_size=5
    )  # 4 chunks, one compilation
    cj.sample(jax.random.key(1), step, STATE, 20, chunk_size=5)  # cached: no new trace


def test_burn_in_sampling_a_short_chunk_and_a_replay_share_one_compilation():
    """One compiled chunk serves every call of a run (issue 17, item 6): the burn-in (7
    steps), the sampling chunks (10, 10) and the short last one (4); a traced step count
    skips the rest. The draws are the step's own, step by step (keys fold_in(key, t)),
    and the burn-in's are not recorded. (The stream run is another program; JAX's trace
    cache hands it the step's jaxpr without a new trace.)"""
    chex.clear_trace_counter()

    @chex.assert_max_traces(n=1)
    def step(key, state):
        return cj.ensemble.lmc_step(key, state, TGT.logdensity_fn, 0.1)

    res = cj.sample(
        jax.random.key(3), step, STATE, 24, thin=2, burn_in=7, chunk_size=10
    )
    st = cj.sample(
        jax.random.key(3),
        step,
        STATE,
        24,
        thin=2,
        burn_in=7,
        chunk_size=10,
        mode="stream",
    )
    assert (
        res.trace.shape == (12, 200, 3)
        and res.info.grad_evals.shape == (31,)
        and res.num_steps_done == 31
    )
    state, kept = STATE, []
    for t in range(31):  # the same steps one by one, outside the driver
        state, _ = jax.jit(cj.ensemble.lmc_step, static_argnums=2)(
            jax.random.fold_in(jax.random.key(3), t), state, TGT.logdensity_fn, 0.1
        )
        if t >= 7 and (t - 7) % 2 == 1:
            kept.append(state.position)
    # the same operations per step, in other XLA programs: float32 rounding only
    np.testing.assert_allclose(res.trace, np.stack(kept), rtol=1e-5, atol=1e-5)
    flat = np.asarray(res.trace, np.float64).reshape(-1, 3)
    assert (
        float(st.moments.count) == flat.shape[0]
    )  # the burn-in and the skipped steps streamed nothing
    np.testing.assert_allclose(st.moments.mean, flat.mean(axis=0), atol=1e-5)


def test_checkpoint_resume_reproduces_the_uninterrupted_run(tmp_path, monkeypatch):
    path = str(tmp_path / "run.ckpt")
    kwargs = dict(thin=2, chunk_size=10, burn_in=5)
    full = cj.sample(jax.random.key(5), STEP, STATE, 40, **kwargs)

    from cenlmc_jax import checkpoint

    real_save, saves = checkpoint.save, []

    def crash_on_third_save(p, **payload):  # the job dies after writing two checkpoints
        if len(saves) == 2:
            raise KeyboardInterrupt
        saves.append(payload["step"])
        real_save(p, **payload)

    monkeypatch.setattr(checkpoint, "save", crash_on_third_save)
    with pytest.raises(KeyboardInterrupt):
        cj.sample(jax.random.key(5), STEP, STATE, 40, checkpoint_path=path, **kwargs)
    monkeypatch.setattr(checkpoint, "save", real_save)
    assert saves == [5, 15]  # burn-in chunk, then one sampling chunk
    resumed = cj.sample(
        jax.random.key(5), STEP, STATE, 40, checkpoint_path=path, **kwargs
    )
    assert resumed.num_steps_done == 45
    # same steps with the same keys; only the split into XLA calls differs
    np.testing.assert_allclose(resumed.trace, full.trace, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(resumed.info.grad_evals, full.info.grad_evals)
    with pytest.raises(
        ValueError, match="checkpoint_path"
    ):  # a different job must not resume it
        cj.sample(jax.random.key(5), STEP, STATE, 20, checkpoint_path=path, **kwargs)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(num_steps=0), "num_steps"),
        (dict(num_steps=10, thin=3), "thin must divide num_steps"),
        (dict(num_steps=12, thin=3, chunk_size=4), "thin must divide chunk_size"),
        (dict(num_steps=10, mode="all"), "mode"),
        (dict(num_steps=10, thin=0), "thin"),
        (dict(num_steps=2.5), "num_steps"),
    ],
)
def test_bad_driver_arguments_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        cj.sample(jax.random.key(0), STEP, STATE, **kwargs)


def test_gradient_through_the_driver_is_exact():
    """d/dμ of the streamed mean of LMC on N(μ, 1): every path has
    x_t = μ + (1-h)^t (x_0 - μ) + noise, so the derivative is exactly
    1 - mean_t (1-h)^t over the kept steps t = burn_in+1 .. burn_in+T."""
    h, burn_in, steps = 0.1, 20, 100

    def streamed_mean(mu):
        logdensity = lambda x: -0.5 * jnp.sum((x - mu) ** 2)  # noqa: E731
        state = cj.ensemble.lmc_init(jnp.zeros((64, 1)), logdensity)
        step = functools.partial(
            cj.ensemble.lmc_step, logdensity_fn=logdensity, step_size=h
        )
        return cj.sample(
            jax.random.key(0), step, state, steps, burn_in=burn_in, mode="stream"
        ).moments.mean[0]

    t = np.arange(burn_in + 1, burn_in + steps + 1)
    exact = 1 - np.mean((1 - h) ** t)
    # float32 arithmetic along 120 steps: rounding far below 1e-5
    np.testing.assert_allclose(float(jax.grad(streamed_mean)(1.5)), exact, rtol=1e-5)


def test_progress_bar_counts_every_step(capsys):
    res = cj.sample(
        jax.random.key(0), STEP, STATE, 20, burn_in=5, chunk_size=10, progress=True
    )
    err = capsys.readouterr().err
    assert res.num_steps_done == 25 and "25/25" in err  # tqdm writes its bar to stderr


# ---------------------------------------------------------------------------
# Checkpoints: a resume is the same run, or it is refused (issue "nothing lost").
# ---------------------------------------------------------------------------

KW = dict(thin=2, chunk_size=10, burn_in=5)


def _write_checkpoint(path, key=5, step=STEP, state=STATE, num_steps=20, **kw):
    return cj.sample(
        jax.random.key(key),
        step,
        state,
        num_steps,
        checkpoint_path=path,
        **{**KW, **kw},
    )


@pytest.mark.parametrize(
    "change, field",
    [
        (dict(key=6), "rng_key"),
        (
            dict(
                step=functools.partial(
                    cj.ensemble.lmc_step, logdensity_fn=TGT.logdensity_fn, step_size=0.2
                )
            ),
            "step_fn",
        ),
        (
            dict(state=cj.ensemble.lmc_init(jnp.zeros((100, 3)), TGT.logdensity_fn)),
            "initial_state",
        ),  # another N
        (
            dict(state=cj.ensemble.lmc_init(jnp.ones((200, 3)), TGT.logdensity_fn)),
            "initial_state",
        ),  # same shape, other values
        (dict(burn_in=7, num_steps=18), "burn_in"),  # same total, another split
        (dict(thin=1), "thin"),
        (dict(mode="stream"), "mode"),
    ],
)
def test_a_different_run_does_not_resume_a_checkpoint(tmp_path, change, field):
    path = str(tmp_path / "run.ckpt")
    _write_checkpoint(path)
    with pytest.raises(ValueError, match=rf"run.ckpt.*{field} differs"):
        _write_checkpoint(path, **change)


def test_the_same_sampler_object_resumes_and_another_step_size_does_not(tmp_path):
    path = str(tmp_path / "run.ckpt")
    algo = cj.lmc(TGT.logdensity_fn, 0.1)
    first = cj.sample(jax.random.key(1), algo, STATE, 20, checkpoint_path=path, **KW)
    again = cj.sample(
        jax.random.key(1),
        cj.lmc(TGT.logdensity_fn, 0.1),
        STATE,
        20,
        checkpoint_path=path,
        **KW,
    )
    np.testing.assert_array_equal(first.trace, again.trace)  # read back: bitwise
    with pytest.raises(ValueError, match="step_fn differs"):
        cj.sample(
            jax.random.key(1),
            cj.lmc(TGT.logdensity_fn, 0.2),
            STATE,
            20,
            checkpoint_path=path,
            **KW,
        )


@pytest.mark.parametrize("content", [b"", b"garbage, not a zip", None, "pickle"])
def test_a_damaged_or_foreign_checkpoint_is_refused_by_name(tmp_path, content):
    import pickle

    path = tmp_path / "run.ckpt"
    if content is None:  # a real checkpoint, truncated
        _write_checkpoint(str(path))
        path.write_bytes(path.read_bytes()[:200])
    elif content == "pickle":  # a crafted pickle: must never be unpickled
        path.write_bytes(pickle.dumps({"step": 0, "state": [os.system]}))
    else:
        path.write_bytes(content)
    with pytest.raises(ValueError, match="checkpoint_path.*run.ckpt"):
        _write_checkpoint(str(path))


def test_checkpoint_paths_are_checked_before_any_work(tmp_path, monkeypatch):
    calls = []

    def counting_step(key, state):
        calls.append(1)
        return STEP(key, state)

    for bad, match in [
        (tmp_path / "missing" / "run.ckpt", "does not exist"),
        (tmp_path, "is a directory"),
    ]:
        with pytest.raises(ValueError, match=match):
            cj.sample(
                jax.random.key(0), counting_step, STATE, 10, checkpoint_path=str(bad)
            )
    monkeypatch.setattr(
        os, "access", lambda *a, **k: False
    )  # a read-only folder (tests may run as root)
    with pytest.raises(ValueError, match="not writable"):
        cj.sample(
            jax.random.key(0),
            counting_step,
            STATE,
            10,
            checkpoint_path=str(tmp_path / "run.ckpt"),
        )
    assert not calls  # nothing was traced or run


def test_trace_checkpoints_write_each_chunk_once(tmp_path, monkeypatch):
    from cenlmc_jax import checkpoint

    real, written = checkpoint.save, []

    def spy(p, **payload):
        written.append(len(payload["new_chunks"]))
        real(p, **payload)

    monkeypatch.setattr(checkpoint, "save", spy)
    path = tmp_path / "run.ckpt"
    res = cj.sample(
        jax.random.key(0),
        STEP,
        STATE,
        40,
        checkpoint_path=str(path),
        thin=1,
        chunk_size=10,
    )
    assert written == [
        1,
        1,
        1,
        1,
    ]  # every save writes only the chunk it finished: O(new data)
    files = sorted(p.name for p in (tmp_path / "run.ckpt.chunks").iterdir())
    assert files == [f"{k:06d}.npz" for k in range(4)]
    monkeypatch.setattr(checkpoint, "save", real)
    again = cj.sample(
        jax.random.key(0),
        STEP,
        STATE,
        40,
        checkpoint_path=str(path),
        thin=1,
        chunk_size=10,
    )
    np.testing.assert_array_equal(
        again.trace, res.trace
    )  # the whole trace, read back from the chunk files


def test_divergence_survives_a_resume(tmp_path):
    path = str(tmp_path / "div.ckpt")
    bad = functools.partial(
        cj.ensemble.lmc_step, logdensity_fn=TGT.logdensity_fn, step_size=2.5
    )
    with pytest.warns(RuntimeWarning, match="diverged"):
        first = cj.sample(
            jax.random.key(0), bad, STATE, 400, chunk_size=50, checkpoint_path=path
        )
    with pytest.warns(RuntimeWarning, match="diverged at step"):
        again = cj.sample(
            jax.random.key(0), bad, STATE, 400, chunk_size=50, checkpoint_path=path
        )
    assert (
        again.diverged_at == first.diverged_at >= 0
        and again.num_steps_done == first.num_steps_done
    )


def test_stop_returns_the_last_good_step_not_the_end_of_the_chunk():
    # LMC at h = 2.5 on N(0, I) is unstable (|1 - h| > 1): it overflows somewhere
    # mid-chunk
    bad = functools.partial(
        cj.ensemble.lmc_step, logdensity_fn=TGT.logdensity_fn, step_size=2.5
    )
    with pytest.warns(RuntimeWarning, match="stopped with the state"):
        res = cj.sample(
            jax.random.key(0), bad, STATE, 1000, mode="stream", chunk_size=1000
        )
    t = res.diverged_at
    assert 0 < t < 1000 and res.num_steps_done == t
    assert bool(np.all(np.isfinite(res.moments.mean))) and bool(
        np.all(np.isfinite(res.state.position))
    )
    assert float(res.moments.count) == t * 200  # every good step, every particle
    assert res.info.diverged.shape == (t + 1,) and bool(
        res.info.diverged[-1]
    )  # the diverging step's info is kept
    # exactly the run of the t good steps (same keys)
    ref = cj.sample(jax.random.key(0), bad, STATE, t, mode="stream", chunk_size=t)
    np.testing.assert_array_equal(res.state.position, ref.state.position)
    np.testing.assert_array_equal(res.moments.mean, ref.moments.mean)


def test_noise_clipping_is_surfaced_as_a_warning():
    est = cj.gradients.grad_estimator_from_grad(lambda th: -th)
    algo = cj.sgld(
        est, 0.1, B_hat=lambda z: 50.0 * jnp.eye(2)
    )  # traced B_hat: cannot be refused up front
    state = cj.sgmcmc.recipe_init(jnp.zeros(2))
    with pytest.warns(RuntimeWarning, match="noise_clipped"):
        cj.sample(jax.random.key(0), algo, state, 5)


@pytest.mark.parametrize(
    "key", [0, "key", jnp.zeros(3, jnp.uint32), jax.random.split(jax.random.key(0), 2)]
)
def test_a_bad_key_is_a_value_error(key):
    with pytest.raises(ValueError, match="rng_key"):
        cj.sample(key, STEP, STATE, 5)


class _BiasInfo(NamedTuple):
    biased: jax.Array
    audit_variance_inflation: jax.Array
    diverged: jax.Array

    run_flags = (
        cj.ensemble.audit.BIASED_FLAG,
    )  # the hook EnLMC's and CEnLMC's infos provide


class _UndeclaredInfo(NamedTuple):
    biased: jax.Array
    diverged: jax.Array


def _flagged_from(step_flagged, inflation):
    """A step function whose info says ``biased`` from step ``step_flagged`` on (the
    state counts the steps)."""

    def step(key, t):
        del key
        info = _BiasInfo(
            t >= step_flagged, jnp.asarray(inflation, jnp.float32), jnp.zeros((), bool)
        )
        return t + 1, info

    return step


def test_a_biased_kept_step_warns_once_with_the_measured_inflation():
    # flagged from step 30 of 10 burn-in + 60 kept steps, in 3 chunks: one warning,
    # naming the mean inflation over the kept steps (0.12 every step: exactly 12.0%) and
    # the first flagged step
    with pytest.warns(RuntimeWarning) as caught:
        res = cj.sample(
            jax.random.key(0),
            _flagged_from(30, 0.12),
            jnp.zeros((), jnp.int32),
            60,
            burn_in=10,
            chunk_size=20,
            trace_fn=lambda t: t,
        )
    msgs = [str(w.message) for w in caught if "gradient audit" in str(w.message)]
    assert len(msgs) == 1, msgs
    assert "12.0%" in msgs[0] and "step 30" in msgs[0] and "info.biased" in msgs[0]
    assert (
        res.num_steps_done == 70 and res.diverged_at == -1
    )  # a biased run is not stopped


def test_a_bias_flag_during_the_burn_in_only_does_not_warn():
    # flagged on the burn-in steps only (an over-dispersed start): the kept draws are
    # not concerned
    def step(key, t):
        del key
        return t + 1, _BiasInfo(
            t < 10, jnp.asarray(0.3, jnp.float32), jnp.zeros((), bool)
        )

    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        cj.sample(
            jax.random.key(0),
            step,
            jnp.zeros((), jnp.int32),
            20,
            burn_in=10,
            trace_fn=lambda t: t,
        )


def test_the_driver_warns_only_of_the_flags_an_info_declares():
    # the driver knows no sampler: a field named `biased` that no RunFlag declares is
    # the info's own business
    def step(key, t):
        del key
        return t + 1, _UndeclaredInfo(jnp.asarray(True), jnp.zeros((), bool))

    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        res = cj.sample(
            jax.random.key(0), step, jnp.zeros((), jnp.int32), 20, trace_fn=lambda t: t
        )
    assert bool(np.all(res.info.biased))
    assert cj.base.run_flags(res.info) == () and cj.base.run_flags(None) == ()
    cenlmc_info = cj.ensemble.CEnLMCInfo(*[0] * len(cj.ensemble.CEnLMCInfo._fields))
    assert [f.field for f in cj.base.run_flags(cenlmc_info)] == [
        "biased",
        "ensemble_fraction",
        "dense_fallback",
    ]
    assert [
        f.field for f in cj.base.run_flags(cj.sgmcmc.RecipeInfo(0, 0, 0, 0, 0))
    ] == ["noise_clipped"]


def test_the_driver_runs_inside_jit_grad_and_warns_of_a_divergence_at_run_time(
    tmp_path,
):
    """``jax.jit(jax.grad(...))`` through ``cj.sample``: the same exact derivative as
    eagerly (the formula of test_gradient_through_the_driver_is_exact); a divergence
    inside jit cannot stop the run, but it warns at run time with the step the eager
    driver reports; checkpoints are refused."""
    h, steps = 0.1, 60

    def streamed_mean(mu, step_size=h, **kw):
        algo = cj.lmc(lambda x: -0.5 * jnp.sum((x - mu) ** 2), step_size)
        return cj.sample(
            jax.random.key(0),
            algo,
            algo.init(jnp.zeros((64, 1))),
            steps,
            mode="stream",
            **kw,
        ).moments.mean[0]

    exact = 1 - np.mean((1 - h) ** np.arange(1, steps + 1))
    # float32 arithmetic along 60 steps: rounding far below 1e-5
    np.testing.assert_allclose(
        float(jax.jit(jax.grad(streamed_mean))(1.5)), exact, rtol=1e-5
    )

    bad = functools.partial(
        cj.ensemble.lmc_step, logdensity_fn=TGT.logdensity_fn, step_size=2.5
    )  # |1 - h| > 1
    with pytest.warns(RuntimeWarning, match="stopped with the state"):
        eager_at = cj.sample(
            jax.random.key(0), bad, STATE, 1000, mode="stream"
        ).diverged_at
    with pytest.warns(
        RuntimeWarning, match=f"info.diverged is set from step {eager_at} "
    ):
        res = jax.jit(
            lambda s: cj.sample(jax.random.key(0), bad, s, 1000, mode="stream")
        )(STATE)
        jax.block_until_ready(res)
    assert int(res.diverged_at) == -1 and bool(np.any(res.info.diverged))
    with pytest.raises(
        ValueError, match="checkpoint_path cannot be used inside jax.jit"
    ):
        jax.jit(lambda m: streamed_mean(m, checkpoint_path=str(tmp_path / "c.npz")))(
            1.5
        )


# --------------------------------------------------------------------------- Run
# identity: what a resume compares is followed all the way down (issue "a resume accepts
# another run").
# ---------------------------------------------------------------------------


def _gauss(mu):
    return lambda x: -0.5 * jnp.sum((x - mu) ** 2)


class _Target:
    def __init__(self, mu):
        self.mu = mu

    def logdensity(self, x):
        return -0.5 * jnp.sum((x - self.mu) ** 2)

    def __call__(self, x):
        return self.logdensity(x)


_X0 = jax.random.normal(jax.random.key(0), (8, 2))
# pairs of samplers that differ only where the old fingerprint (depth 6, then repr)
# could not see
_HIDDEN = {
    "grad_estimator_from_logdensity": lambda mu: cj.sgld(
        cj.gradients.grad_estimator_from_logdensity(_gauss(mu)), 0.1
    ),
    "finite_difference": lambda mu: cj.lmc(
        _gauss(0.0), 0.1, grad_fn=cj.finite_difference(_gauss(mu))
    ),
    "bound_method": lambda mu: cj.lmc(_Target(mu).logdensity, 0.1),
    "callable_object": lambda mu: cj.lmc(_Target(mu), 0.1),
    "partial_of_a_closure": lambda mu: functools.partial(
        cj.ensemble.lmc_step, logdensity_fn=_gauss(mu), step_size=0.1
    ),
}


@pytest.mark.parametrize("case", sorted(_HIDDEN))
def test_a_resume_sees_differences_deep_in_the_step_function(tmp_path, case):
    path = str(tmp_path / "run.ckpt")
    make = _HIDDEN[case]
    algo = make(0.0)
    state = (
        algo.init(_X0[0])
        if case == "grad_estimator_from_logdensity"
        else cj.ensemble.lmc_init(_X0, _gauss(0.0))
    )
    cj.sample(jax.random.key(0), algo, state, 4, checkpoint_path=path)
    cj.sample(
        jax.random.key(0), make(0.0), state, 4, checkpoint_path=path
    )  # the same run, rebuilt: resumes
    with pytest.raises(ValueError, match="step_fn differs"):
        cj.sample(jax.random.key(0), make(1.0), state, 4, checkpoint_path=path)


def test_the_fingerprint_is_the_same_in_another_process():
    import subprocess
    import sys

    code = (
        "import jax.numpy as jnp, cenlmc_jax as cj; from cenlmc_jax.checkpoint import "
        "fingerprint; f = lambda x: -0.5 * jnp.sum((x - 1.0) ** 2); "
        "print(fingerprint(cj.sgld(cj.gradients.grad_estimator_from_logdensity(f), "
        "0.1).step), fingerprint(cj.irreversible_mh(f, "
        "cj.irreversible.sde_proposal(1.0, 0.0, f, 0.1)).step))"
    )
    runs = [
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "JAX_PLATFORMS": "cpu"},
        ).stdout
        for _ in range(2)
    ]
    assert runs[0] == runs[1] and len(runs[0].split()) == 2


def test_what_cannot_be_fingerprinted_refuses_checkpointing():
    rng = np.random.default_rng(
        0
    )  # a C object: its state is not readable, so two runs cannot be told apart

    def noisy(x):
        return -0.5 * jnp.sum(x**2) + 0.0 * float(rng.normal())

    algo = cj.lmc(noisy, 0.1)
    with pytest.raises(
        ValueError,
        match="checkpoint_path.*step_fn cannot be fingerprinted.*rng.*Generator",
    ):
        cj.sample(
            jax.random.key(0), algo, STATE, 4, checkpoint_path="/tmp/never-written.ckpt"
        )
    from cenlmc_jax.checkpoint import Unfingerprintable, fingerprint

    cycle = [1.0]
    cycle.append(cycle)
    assert (
        fingerprint(cycle) == fingerprint(cycle) != fingerprint([2.0, cycle])
    )  # cycles end, values count
    with pytest.raises(Unfingerprintable):
        fingerprint({"lock": __import__("threading").Lock()})


def test_info_reduce_is_part_of_the_run_identity(tmp_path):
    path = str(tmp_path / "run.ckpt")
    cj.sample(jax.random.key(0), STEP, STATE, 10, chunk_size=5, checkpoint_path=path)
    with pytest.raises(
        ValueError, match="info_reduce differs"
    ):  # before: every step ran, then a crash
        cj.sample(
            jax.random.key(0),
            STEP,
            STATE,
            10,
            chunk_size=5,
            checkpoint_path=path,
            info_reduce=None,
        )


# --------------------------------------------------------------------------- Checkpoint
# headers: every field checked, against the arrays too (issue "a wrong-length trace, no
# error").
# ---------------------------------------------------------------------------


def _rewrite(path, header=None, drop=None, arrays=None):
    """Rewrite the checkpoint ``path`` with ``header`` updates (``header(h) -> h``) or
    without some arrays."""
    import json

    with np.load(path) as data:
        content = {k: data[k] for k in data.files}
    if header is not None:
        h = header(json.loads(bytes(content["header"]).decode()))
        content["header"] = np.frombuffer(
            json.dumps(h).encode() if not isinstance(h, bytes) else h, np.uint8
        )
    for k in drop or ():
        content.pop(k)
    content.update(arrays or {})
    with open(path, "wb") as fh:
        np.savez(fh, **content)


def _set(**fields):
    return lambda h: {**h, **fields}


def _chunk(path, k=0):
    return os.path.join(path + ".chunks", f"{k:06d}.npz")


_HEADERS = [
    (_set(num_chunks=0), "num_chunks"),
    (_set(num_chunks=-1), "num_chunks"),
    (
        _set(num_chunks=1),
        "step",
    ),  # 2 chunks of 10 steps written: one counts 10 steps, not 20
    (_set(num_chunks="2"), "num_chunks"),
    (_set(step=7), "step"),
    (_set(step=-3), "step"),
    (_set(step=True), "step"),
    (_set(step=10**9), "step"),
    (_set(step=2.5), "step"),
    (_set(diverged_at=-7), "diverged_at"),
    (_set(diverged_at=99), "diverged_at"),
    (_set(identity=[1, 2]), "identity"),
    (_set(identity=None), "identity"),
    (lambda h: [h], "header"),
    (lambda h: {k: v for k, v in h.items() if k != "num_chunks"}, "num_chunks"),
    (lambda h: {k: v for k, v in h.items() if k != "step"}, "step"),
    (
        lambda h: b"[" * 100_000 + b"]" * 100_000,
        "header",
    ),  # json.loads: RecursionError before
]


@pytest.mark.parametrize(
    "change, field", _HEADERS, ids=[f"{i}-{f}" for i, (_, f) in enumerate(_HEADERS)]
)
def test_a_malformed_header_is_a_value_error_naming_the_file_and_the_field(
    tmp_path, change, field
):
    path = str(tmp_path / "run.ckpt")
    cj.sample(jax.random.key(0), STEP, STATE, 20, chunk_size=10, checkpoint_path=path)
    _rewrite(path, header=change)
    with pytest.raises(ValueError, match=rf"run.ckpt.*{field}"):
        cj.sample(
            jax.random.key(0), STEP, STATE, 20, chunk_size=10, checkpoint_path=path
        )


def test_arrays_that_disagree_with_the_header_or_the_run_are_refused(tmp_path):
    path = str(tmp_path / "run.ckpt")
    run = functools.partial(
        cj.sample,
        jax.random.key(0),
        STEP,
        STATE,
        20,
        chunk_size=10,
        checkpoint_path=path,
    )
    run()
    with np.load(_chunk(path, 1)) as data:
        chunk = {k: data[k] for k in data.files}
    short = {k: (v[:4] if k.startswith("info_") else v) for k, v in chunk.items()}
    cases = [
        (
            lambda: _rewrite(_chunk(path, 1), arrays=short),
            "step is 20, but the chunk files hold .* 14 steps",
        ),
        (
            lambda: _rewrite(_chunk(path, 1), arrays={"info_0": chunk["info_0"][:4]}),
            "chunk 1",
        ),  # one of them
        (
            lambda: _rewrite(_chunk(path, 1), arrays={"kept_0": chunk["kept_0"][:3]}),
            "chunk 1",
        ),  # kept != infos
        (
            lambda: _rewrite(_chunk(path, 1), drop=["info_0"]),
            "chunk 1",
        ),  # a hole in the numbering
        (
            lambda: _rewrite(path, arrays={"state_0": np.zeros((200, 2), np.float32)}),
            "state",
        ),
        (
            lambda: _rewrite(path, arrays={"moments_0": np.zeros(())}),
            "moments",
        ),  # moments in a trace run
    ]
    for damage, field in cases:
        run()  # a good checkpoint (resumed: nothing left to run)
        with np.load(_chunk(path, 1)) as data:
            # the per-step arrays (the chunk's watch is per chunk, not per step)
            steps = [k for k in data.files if k.startswith(("info_", "kept_"))]
            assert steps and all(data[k].shape[0] == 10 for k in steps)
        damage()
        with pytest.raises(ValueError, match=rf"run.ckpt.*{field}"):
            run()
        os.remove(path)
        run()  # rewritten from scratch for the next case


# --------------------------------------------------------------------------- The
# driver's watch: a chain frozen for a whole chunk is reported (issue "frozen chains, no
# flag").
# ---------------------------------------------------------------------------


class _PosState(NamedTuple):
    position: jax.Array


class _PlainInfo(NamedTuple):
    diverged: jax.Array


class _StayInfo(NamedTuple):
    diverged: jax.Array

    may_stay = True  # an MH-like sampler: staying put is a rejection, not a freeze


def _moving_except(frozen_rows, info_cls=_PlainInfo):
    """Rows of a (4, 2) position move by fresh noise every step, except
    ``frozen_rows``."""
    mask = jnp.zeros((4, 1), bool).at[jnp.asarray(frozen_rows, jnp.int32)].set(True)

    def step(key, state):
        moved = state.position + jax.random.normal(key, state.position.shape)
        return _PosState(jnp.where(mask, state.position, moved)), info_cls(
            jnp.zeros((), bool)
        )

    return step


def test_a_chain_frozen_for_a_whole_chunk_is_reported_once():
    with pytest.warns(
        RuntimeWarning,
        match=r"1 of 4 chains or particles did not move in steps 0\.\.19",
    ) as rec:
        cj.sample(
            jax.random.key(0),
            _moving_except([2]),
            _PosState(jnp.zeros((4, 2))),
            60,
            chunk_size=20,
        )
    assert (
        sum("did not move" in str(w.message) for w in rec) == 1
    )  # once per call, not per chunk


def test_moving_chains_short_chunks_and_mh_samplers_are_not_reported():
    for step, chunk in [
        (_moving_except([]), 20),
        (_moving_except([1]), cj.run.WATCH_MIN_STEPS - 1),
        (_moving_except([0, 1, 2, 3], _StayInfo), 20),
    ]:
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)
            cj.sample(
                jax.random.key(0),
                step,
                _PosState(jnp.zeros((4, 2))),
                2 * chunk,
                chunk_size=chunk,
            )


def test_a_frozen_chain_inside_jit_is_reported_at_run_time():
    run = jax.jit(
        lambda s: cj.sample(jax.random.key(0), _moving_except([3]), s, 20).state
    )
    with pytest.warns(
        RuntimeWarning, match=r"1 of 4 chains .*did not move.*inside jax.jit"
    ):
        jax.block_until_ready(run(_PosState(jnp.zeros((4, 2)))))


def test_a_notebook_function_is_fingerprinted_by_its_code(monkeypatch):
    # a notebook's __main__ has no __file__: its functions are the user's code, not a
    # library's
    import sys

    from cenlmc_jax.checkpoint import fingerprint

    main = sys.modules["__main__"]
    monkeypatch.delattr(main, "__file__", raising=False)
    prints = []
    for mu in (0.0, 1.0):
        f = _gauss(mu)
        f.__module__, f.__qualname__ = "__main__", "logp"
        monkeypatch.setattr(
            main, "logp", f, raising=False
        )  # importable as __main__.logp, as in a notebook
        prints.append(fingerprint(f))
    assert prints[0] != prints[1]


def test_a_scalar_trace_fn_in_stream_mode_is_refused_before_work():
    # issue 28: an IndexError from the moments; now a ValueError naming trace_fn
    algo = cj.lmc(lambda x: -0.5 * jnp.sum(x**2), 0.1)
    state = algo.init(jnp.zeros((8, 2)))
    with pytest.raises(ValueError, match="trace_fn must return one array"):
        cj.sample(
            jax.random.key(0),
            algo,
            state,
            5,
            mode="stream",
            trace_fn=lambda s: jnp.sum(s.position),
        )


def test_a_divergence_in_the_burn_in_leaves_an_empty_trace_not_none():
    # issue 28: trace=None when no step was kept; now zero draws of the right shape
    algo = cj.lmc(lambda x: -0.5e30 * jnp.sum(x**2), 10.0)
    state = algo.init(jax.random.normal(jax.random.key(0), (8, 2)))
    with pytest.warns(RuntimeWarning, match="diverged"):
        res = cj.sample(jax.random.key(1), algo, state, 5, burn_in=3)
    assert res.trace.shape == (0, 8, 2) and res.diverged_at == 0


def test_two_runs_on_one_checkpoint_never_mix(tmp_path):
    # issue 28: two runs shared the .tmp file and mixed their chunks; now the second
    # is refused before any work while the first holds the checkpoint
    from cenlmc_jax import checkpoint as ckpt

    path = str(tmp_path / "run.npz")
    algo = cj.lmc(lambda x: -0.5 * jnp.sum(x**2), 0.1)
    state = algo.init(jnp.zeros((8, 2)))
    with ckpt.writer_lock(path):
        with pytest.raises(ValueError, match="in use by another run"):
            cj.sample(jax.random.key(0), algo, state, 10, checkpoint_path=path)
    assert not os.path.exists(path)  # the refused run wrote nothing
    # released: a run goes ahead, and a resume of the finished run gives the same draws
    a = cj.sample(jax.random.key(0), algo, state, 10, checkpoint_path=path)
    b = cj.sample(jax.random.key(0), algo, state, 10, checkpoint_path=path)
    np.testing.assert_array_equal(np.asarray(a.trace), np.asarray(b.trace))
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]


def test_a_checkpoint_whose_state_is_nan_is_refused(tmp_path):
    path = str(tmp_path / "run.npz")
    algo = cj.lmc(lambda x: -0.5 * jnp.sum(x**2), 0.1)
    state = algo.init(jnp.zeros((8, 2)))
    cj.sample(jax.random.key(0), algo, state, 10, checkpoint_path=path)
    with np.load(path) as data:
        arrays = {k: data[k] for k in data.files}
    arrays["state_0"] = np.full_like(arrays["state_0"], np.nan)
    with open(path, "wb") as fh:
        np.savez(fh, **arrays)
    with pytest.raises(ValueError, match="saved state holds NaN"):
        cj.sample(jax.random.key(0), algo, state, 20, checkpoint_path=path)
