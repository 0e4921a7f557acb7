"""Tests of the lax.scan driver: thinning, streaming moments, compile-once, checkpoints."""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cenlmc_jax as cj
from cenlmc_jax import targets

TGT = targets.standard_gaussian(3)
STATE = cj.lmc_init(jax.random.normal(jax.random.key(0), (200, 3)), TGT.logdensity_fn)
STEP = functools.partial(cj.lmc_step, logdensity_fn=TGT.logdensity_fn, step_size=0.1)


def test_trace_shape_thinning_and_reduced_info():
    res = cj.sample(jax.random.key(1), STEP, STATE, 60, thin=3, burn_in=7, chunk_size=30)
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
    st = cj.sample(jax.random.key(2), STEP, STATE, 40, thin=2, burn_in=10, mode="stream", chunk_size=20)
    assert st.trace is None
    flat = np.asarray(tr.trace, np.float64).reshape(-1, 3)
    assert float(st.moments.count) == flat.shape[0]
    # Chan's update in float32 vs a float64 two-pass: agreement to float32 rounding
    np.testing.assert_allclose(st.moments.mean, flat.mean(axis=0), atol=1e-5)
    np.testing.assert_allclose(st.moments.variance, flat.var(axis=0), rtol=1e-5)
    np.testing.assert_allclose(st.state.position, tr.state.position, rtol=1e-6, atol=1e-6)


def test_compiles_once_per_configuration():
    @chex.assert_max_traces(n=1)
    def step(key, state):
        return cj.lmc_step(key, state, TGT.logdensity_fn, 0.1)

    cj.sample(jax.random.key(0), step, STATE, 20, chunk_size=5)  # 4 chunks, one compilation
    cj.sample(jax.random.key(1), step, STATE, 20, chunk_size=5)  # cached: no new trace


def test_checkpoint_resume_reproduces_the_uninterrupted_run(tmp_path, monkeypatch):
    path = str(tmp_path / "run.ckpt")
    kwargs = dict(thin=2, chunk_size=10, burn_in=5)
    full = cj.sample(jax.random.key(5), STEP, STATE, 40, **kwargs)

    from cenlmc_jax import run as run_module

    real_save, saves = run_module._save_checkpoint, []

    def crash_on_third_save(p, payload):  # the job dies after writing two checkpoints
        if len(saves) == 2:
            raise KeyboardInterrupt
        saves.append(payload["step"])
        real_save(p, payload)

    monkeypatch.setattr(run_module, "_save_checkpoint", crash_on_third_save)
    with pytest.raises(KeyboardInterrupt):
        cj.sample(jax.random.key(5), STEP, STATE, 40, checkpoint_path=path, **kwargs)
    monkeypatch.setattr(run_module, "_save_checkpoint", real_save)
    assert saves == [5, 15]  # burn-in chunk, then one sampling chunk
    resumed = cj.sample(jax.random.key(5), STEP, STATE, 40, checkpoint_path=path, **kwargs)
    assert resumed.num_steps_done == 45
    # same steps with the same keys; only the split into XLA calls differs
    np.testing.assert_allclose(resumed.trace, full.trace, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(resumed.info.grad_evals, full.info.grad_evals)
    with pytest.raises(ValueError, match="checkpoint_path"):  # a different job must not resume it
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
        state = cj.lmc_init(jnp.zeros((64, 1)), logdensity)
        step = functools.partial(cj.lmc_step, logdensity_fn=logdensity, step_size=h)
        return cj.sample(jax.random.key(0), step, state, steps, burn_in=burn_in, mode="stream").moments.mean[0]

    t = np.arange(burn_in + 1, burn_in + steps + 1)
    exact = 1 - np.mean((1 - h) ** t)
    # float32 arithmetic along 120 steps: rounding far below 1e-5
    np.testing.assert_allclose(float(jax.grad(streamed_mean)(1.5)), exact, rtol=1e-5)


def test_progress_bar_counts_every_step(capsys):
    res = cj.sample(jax.random.key(0), STEP, STATE, 20, burn_in=5, chunk_size=10, progress=True)
    err = capsys.readouterr().err
    assert res.num_steps_done == 25 and "25/25" in err  # tqdm writes its bar to stderr
