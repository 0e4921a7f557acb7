"""Issue 47 ("Nothing lost"), item 1: Ctrl-C in ``cenlmc-jax sample``, each with the
test that failed before its fix.

* Ctrl-C twice (50 ms apart, or more): one that came after the job's handler was put
  back raised KeyboardInterrupt while the command said it stopped: exit 1 and a
  traceback -> test_ctrl_c_again_while_the_command_stops_is_one_line_and_exit_130,
  test_a_burst_of_ctrl_cs_is_one_line_and_exit_130
* a Ctrl-C while the outputs were written (after the run, before run.json): the
  message said "nothing to continue; the same command starts afresh", and the same
  command refused the folder (exit 2, "not empty"); one while run.json itself was
  written left it half-written -> test_a_run_stopped_while_writing_its_outputs_reruns
* a Ctrl-C while a host-callback model computes its values: raised inside the
  callback, exit 1 with JAX's traceback ("jax.pure_callback failed"); where XLA runs
  the callback on its own thread, the main thread's handler waited for the end of
  the chunk (minutes for a 1,000-step chunk) ->
  test_ctrl_c_stops_a_host_callback_model_at_once_and_resume_runs
* a Ctrl-C before the run started (in the warm-up, or a callback model's first values)
  said that nothing was written, not how to go on ->
  test_a_run_stopped_in_its_set_up_says_the_same_command_starts_it
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from cli_helpers import run_cli, start_cli

from cenlmc_jax.cli import jobs

TINY = ["--sampler", "lmc", "--particles", "50", "--steps", "20", "--burn-in", "0"]
QUICK = ["--allow-unreliable", "--no-bias-check"]
#: A Ctrl-C must end the command this soon (a loaded 2-core machine included).
STOP_S = 10


def _one_interrupted_line(code, err):
    assert code == 130, (code, err)
    assert "Traceback" not in err and "pure_callback failed" not in err, err
    assert err.count("cenlmc-jax: interrupted") == 1, err


#: The child of test_ctrl_c_again_while_the_command_stops_is_one_line_and_exit_130: the
#: job's run stopped by a Ctrl-C, another while the command says so, and a third just
#: before the process ends.
AGAIN_CHILD = """
import os, signal, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)
from cenlmc_jax import cli
from cenlmc_jax.cli import jobs

say, end = jobs.say_interrupted, cli._end_process

def ctrl_c():
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.05)

def run_job(args, setup):
    ctrl_c()
    raise AssertionError("the Ctrl-C did not stop the job")

def say_after_another(args):
    ctrl_c()
    say(args)

def end_after_another(code):
    ctrl_c()
    end(code)

jobs.run_job, jobs.say_interrupted, cli._end_process = (
    run_job, say_after_another, end_after_another)
sys.argv = ["cenlmc-jax"] + sys.argv[1:]
sys.exit(cli.main())
"""


def test_ctrl_c_again_while_the_command_stops_is_one_line_and_exit_130(tmp_path):
    # before: the second Ctrl-C raised KeyboardInterrupt in the stopping command
    # (Python's handler was back): exit 1 and a traceback
    env = dict(os.environ, PYTHONUNBUFFERED="1", JAX_PLATFORMS="cpu")
    args = ["sample", *TINY, "--out", str(tmp_path / "run")]
    proc = subprocess.run(
        [sys.executable, "-c", AGAIN_CHILD, *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=STOP_S * 30,
    )
    _one_interrupted_line(proc.returncode, proc.stderr)


def test_a_burst_of_ctrl_cs_is_one_line_and_exit_130(tmp_path):
    # the default job (CEnLMC, 2,000 particles) for many steps: the signals come while
    # it runs, and go on while the command stops (Ctrl-C twice 50 ms apart, and more)
    proc = start_cli(["sample", "--steps", "100000", "--out", tmp_path / "run"])
    header = proc.stdout.readline()  # printed just before the run starts
    assert header.startswith("cenlmc-jax: "), (header, proc.communicate())
    for _ in range(60):
        if proc.poll() is not None:
            break
        proc.send_signal(signal.SIGINT)
        time.sleep(0.01)
    out, err = proc.communicate(timeout=STOP_S * 6)
    _one_interrupted_line(proc.returncode, err)


@pytest.mark.parametrize("where", ["outputs", "run.json"])
def test_a_run_stopped_while_writing_its_outputs_reruns(
    tmp_path, capsys, monkeypatch, where
):
    # the folder as a run of cj.sample_until (a --model's default run) leaves it: no
    # checkpoint (a run of cj.sample keeps its last one until its outputs are written,
    # and --resume finishes it)
    folder = tmp_path / "run"
    args = ["sample", *TINY, *QUICK, "--trace", "--out", folder]

    def ctrl_c():
        jobs.remove_checkpoint(str(folder / "checkpoint.npz"))
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        if where == "outputs":  # after draws.npz and summary.csv, before run.json
            m.setattr(jobs, "_write_record", lambda *a, **k: ctrl_c())
        else:  # half-way through run.json

            def half_written(record, fh, **k):
                fh.write('{"seed": ')
                ctrl_c()

            m.setattr(jobs.json, "dump", half_written)
        code, out, err = run_cli(args, capsys)
    assert code == 130, out + err
    said = err
    assert not (folder / "run.json").exists(), os.listdir(folder)
    assert {"draws.npz", "summary.csv"} <= set(os.listdir(folder))
    again = tmp_path / "again"
    shutil.copytree(folder, again)
    code, out, err = run_cli(args, capsys)  # before: exit 2, "not empty"
    assert code == 0, out + err
    assert "interrupted while the outputs were written" in said, said
    assert "the same command starts afresh" in said, said
    assert json.loads((folder / "run.json").read_text())["steps_done"] == 20
    code, out, err = run_cli(["sample", "--resume", "--out", again], capsys)
    assert code == 0 and "starting from the beginning" in err, out + err
    np.testing.assert_array_equal(
        np.load(folder / "draws.npz")["draws"], np.load(again / "draws.npz")["draws"]
    )


def test_a_run_stopped_in_its_set_up_says_the_same_command_starts_it(
    tmp_path, capsys, monkeypatch
):
    # a Ctrl-C in the warm-up or a host-callback model's first values: nothing written
    folder = tmp_path / "run"
    args = ["sample", *TINY, *QUICK, "--out", folder]
    with monkeypatch.context() as m:
        m.setattr(jobs, "setup", lambda args: (_ for _ in ()).throw(KeyboardInterrupt))
        code, out, err = run_cli(args, capsys)
    assert code == 130 and not folder.exists(), out + err
    assert "nothing was written" in err and "the same command starts it" in err, err
    code, out, err = run_cli(args, capsys)
    assert code == 0, out + err


#: A host-callback model whose values take ``SLOW_S`` seconds an evaluation while the
#: file ``slow`` exists, and that writes ``started`` once it is evaluated after the
#: run's folder has its config.toml (the run has begun).
CALLBACK_MODEL = """
import os, time
import jax, numpy as np

HERE = {here!r}

def _values(x):
    if os.path.exists(os.path.join(HERE, "slow")):
        if os.path.exists(os.path.join(HERE, "run", "config.toml")):
            open(os.path.join(HERE, "started"), "w").close()
        time.sleep({slow_s})
    x = np.asarray(x)
    return (-0.5 * (x ** 2).sum(-1)).astype(x.dtype)

def logdensity_fn(x):
    out = jax.ShapeDtypeStruct(x.shape[:-1], x.dtype)
    return jax.pure_callback(_values, out, x, vmap_method="expand_dims")
"""
#: An evaluation of the slow model: a 100-step chunk takes 100 of them (20 s).
SLOW_S = 0.2


def test_ctrl_c_stops_a_host_callback_model_at_once_and_resume_runs(tmp_path, capsys):
    model = tmp_path / "black_box.py"
    model.write_text(CALLBACK_MODEL.format(here=str(tmp_path), slow_s=SLOW_S))
    (tmp_path / "slow").touch()
    folder = tmp_path / "run"
    args = ["sample", "--model", f"{model}:logdensity_fn", "--dim", "2", "--sampler",
            "rwmh", "--particles", "16", "--steps", "200", "--burn-in", "0",
            "--checkpoint-every", "100", "--allow-unreliable", "--no-bias-check",
            "--out", folder]  # fmt: skip
    proc = start_cli(args)
    deadline = time.monotonic() + 300  # JAX's import on a loaded machine
    started = tmp_path / "started"
    while not started.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert started.exists(), proc.communicate()
    time.sleep(0.5)  # well inside the first chunk's 20 s
    proc.send_signal(signal.SIGINT)
    t0 = time.monotonic()
    out, err = proc.communicate(timeout=STOP_S * 6)
    # before: exit 1 and JAX's traceback, or exit 130 at the chunk's end (~20 s)
    _one_interrupted_line(proc.returncode, err)
    assert time.monotonic() - t0 < STOP_S, time.monotonic() - t0
    (tmp_path / "slow").unlink()
    code, out, err = run_cli(
        ["sample", "--resume", "--out", folder, "--model", f"{model}:logdensity_fn"],
        capsys,
    )
    assert code == 0, out + err
    assert json.loads((folder / "run.json").read_text())["steps_done"] == 200


def test_the_ctrl_c_check_of_a_callback_model_keeps_its_values_and_gradient():
    # the check is added only where the model calls the host, and changes nothing of
    # its value or (custom) derivative
    @jax.custom_jvp
    def black_box(x):
        out = jax.ShapeDtypeStruct(x.shape[:-1], x.dtype)
        return jax.pure_callback(
            lambda v: (-0.5 * (v**2).sum(-1)).astype(v.dtype),
            out,
            x,
            vmap_method="expand_dims",
        )

    black_box.defjvps(lambda t, ans, x: -(x * t).sum(-1))

    def plain(x):
        return -0.5 * jnp.sum(x**2)

    spec = jax.ShapeDtypeStruct((3,), jnp.float32)
    assert jobs.calls_the_host(jax.make_jaxpr(lambda x: jax.jit(black_box)(x))(spec))
    assert not jobs.calls_the_host(jax.make_jaxpr(plain)(spec))
    x = jnp.array([[0.5, -1.0, 2.0], [1.0, 0.0, -3.0]])
    checked = jax.vmap(lambda p: jobs.ctrl_c_checked(black_box, p))
    np.testing.assert_array_equal(checked(x), jax.vmap(black_box)(x))
    np.testing.assert_array_equal(
        jax.vmap(jax.grad(lambda p: jobs.ctrl_c_checked(black_box, p)))(x), -x
    )
