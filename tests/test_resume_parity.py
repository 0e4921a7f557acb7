"""Issue 47 ("nothing lost"), the driver's part: a run's verdict never depends on
where it was cut, and its streamed moments never turn to inf unreported.

* a streamed run resumed from a checkpoint lost its online accumulators (split R-hat,
  batch-means ESS: ``RunResult.online`` was None), so the end-of-run checks and the
  step-halving bias check were skipped ->
  test_a_resumed_stream_run_checks_what_the_whole_run_checks
* a resume did not report the chunk flags (``RunFlag``) nor the frozen chains of the
  chunks run before the cut ->
  test_a_resumed_run_reports_the_flags_of_the_chunks_before_the_cut
* a checkpoint of the format before the accumulators were saved ->
  test_a_checkpoint_without_the_accumulators_is_refused_with_a_reason
* the streamed m2 overflowed float32 (a sum over draws and particles of squared
  deviations) steps before the sampler's own divergence check: the kept moments were
  inf and the divergence was reported later ->
  test_overflowing_streamed_moments_are_a_divergence
"""

import functools
import json
import warnings
from typing import NamedTuple

import jax
import numpy as np
import pytest

import cenlmc_jax as cj
from cenlmc_jax import checkpoint
from cenlmc_jax.base import RunFlag
from cenlmc_jax.models import targets

TGT = targets.standard_gaussian(2)
# 8 chains started far out: 30 steps of LMC at h = 0.05 have neither mixed (R-hat) nor
# 400 effective draws (ESS), so the whole run warns of both
STATE = cj.ensemble.lmc_init(
    5.0 * jax.random.normal(jax.random.key(0), (8, 2)), TGT.logdensity_fn
)
STEP = functools.partial(
    cj.ensemble.lmc_step, logdensity_fn=TGT.logdensity_fn, step_size=0.05
)
KW = dict(mode="stream", chunk_size=10, burn_in=10)


def _run(path=None, **kw):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = cj.sample(
            jax.random.key(1), STEP, STATE, 30, checkpoint_path=path, **{**KW, **kw}
        )
    return res, sorted(str(w.message) for w in caught)


def _interrupted(path, monkeypatch, saves=2, run=None):
    """The run of ``run`` (default :func:`_run`) killed after ``saves`` checkpoints
    (the burn-in's, then one sampling chunk's); the steps saved."""
    run = _run if run is None else run
    real = checkpoint.save
    done = []

    def save(p, **payload):
        if len(done) == saves:
            raise KeyboardInterrupt
        done.append(payload["step"])
        real(p, **payload)

    with monkeypatch.context() as m:
        m.setattr(checkpoint, "save", save)
        with pytest.raises(KeyboardInterrupt):
            run(path)
    return done


def test_a_resumed_stream_run_checks_what_the_whole_run_checks(tmp_path, monkeypatch):
    whole, whole_warnings = _run()
    assert any("split R-hat" in w for w in whole_warnings), whole_warnings
    path = str(tmp_path / "run.ckpt")
    assert _interrupted(path, monkeypatch) == [10, 20]  # cut inside the kept steps
    resumed, resumed_warnings = _run(path)
    assert resumed.num_steps_done == 40
    np.testing.assert_allclose(resumed.moments.mean, whole.moments.mean, rtol=1e-5)
    assert resumed.online is not None
    for a, b in zip(
        jax.tree_util.tree_leaves(resumed.online),
        jax.tree_util.tree_leaves(whole.online),
        strict=True,
    ):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4)
    assert resumed_warnings == whole_warnings
    # the step-halving bias check reads the online standard errors: it runs on the
    # resumed result as on the whole one
    se = cj.diagnostics.online.moments_and_se(resumed)
    assert se is not None
    np.testing.assert_allclose(
        se[2], cj.diagnostics.online.moments_and_se(whole)[2], rtol=1e-4
    )


def test_a_checkpoint_without_the_accumulators_is_refused_with_a_reason(
    tmp_path, monkeypatch
):
    path = str(tmp_path / "run.ckpt")
    _interrupted(path, monkeypatch)
    # what the format before issue 47 wrote: the moments, no online accumulators
    with np.load(path, allow_pickle=False) as data:
        arrays = {k: data[k] for k in data.files if not k.startswith("online_")}
    header = json.loads(bytes(arrays["header"]).decode())
    header["format"] = "cenlmc_jax-checkpoint-1"
    arrays["header"] = np.frombuffer(json.dumps(header).encode(), np.uint8)
    with open(path, "wb") as fh:
        np.savez(fh, **arrays)
    with pytest.raises(ValueError, match=r"run\.ckpt.*older cenlmc_jax.*R-hat"):
        _run(path)


class _Walk(NamedTuple):
    position: jax.Array
    t: jax.Array


class _WalkInfo(NamedTuple):
    clipped: jax.Array
    run_flags = (RunFlag("clipped", lambda infos, t: f"clipped at step {t}"),)


def _walk(key, state):
    """A random walk that stays put for its first 10 steps (the driver's watch: frozen
    chains) and whose info flags its step 3 (a chunk-by-chunk RunFlag)."""
    x = state.position + 0.1 * jax.random.normal(key, state.position.shape)
    x = jax.numpy.where(state.t < 10, state.position, x)
    return _Walk(x, state.t + 1), _WalkInfo(state.t == 3)


def test_a_resumed_run_reports_the_flags_of_the_chunks_before_the_cut(
    tmp_path, monkeypatch
):
    start = _Walk(jax.numpy.zeros((8, 2)), jax.numpy.zeros((), jax.numpy.int32))

    def run(path=None):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            cj.sample(
                jax.random.key(2),
                _walk,
                start,
                30,
                chunk_size=10,
                checkpoint_path=path,
                check_convergence=False,
            )
        return sorted(str(w.message) for w in caught)

    whole = run()
    assert len(whole) == 2 and whole[1] == "clipped at step 3", whole
    assert "8 of 8 chains or particles did not move in steps 0..9" in whole[0]
    path = str(tmp_path / "walk.ckpt")
    _interrupted(path, monkeypatch, saves=2, run=run)
    assert run(path) == whole


def test_overflowing_streamed_moments_are_a_divergence():
    # float32 LMC at h = 3 on N(0, I): |1 - h| = 2, the particles double every step.
    # m2, a sum over 100 particles and the kept draws of squared deviations, leaves
    # float32 at |x| ~ 1e18, steps before the sampler's own check (its virial x·∇log p
    # overflows at |x| ~ 1e19)
    tgt = targets.standard_gaussian(2)
    state = cj.ensemble.lmc_init(
        jax.random.normal(jax.random.key(0), (100, 2)), tgt.logdensity_fn
    )
    step = functools.partial(
        cj.ensemble.lmc_step, logdensity_fn=tgt.logdensity_fn, step_size=3.0
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trace = cj.sample(jax.random.key(1), step, state, 80, chunk_size=80)
        streamed = cj.sample(
            jax.random.key(1), step, state, 80, mode="stream", chunk_size=80
        )
    sampler_stop = trace.diverged_at  # the sampler's own flag
    assert sampler_stop > 0
    x = np.asarray(trace.trace, np.float64).reshape(len(trace.trace), -1, 2)
    # the running m2 of the draws up to t, in float64: the first draw it exceeds the
    # float32 range
    m2 = [
        ((x[: t + 1] - x[: t + 1].mean((0, 1))) ** 2).sum((0, 1)) for t in range(len(x))
    ]
    first = int(np.argmax([np.any(v > np.finfo(np.float32).max) for v in m2]))
    assert 0 < first < sampler_stop, (first, sampler_stop)
    assert streamed.diverged_at == first
    assert np.isfinite(streamed.moments.m2).all()
    assert np.isfinite(streamed.moments.mean).all()
    assert float(streamed.moments.count) == first * 100  # the draws before it
    assert bool(streamed.info.diverged[first])  # info.diverged marks it
    assert any(
        f"streamed moments overflowed at step {first}" in str(w.message) for w in caught
    ), [str(w.message) for w in caught]
