"""The probe's remaining CLI defects of issue 28, each with the test that failed before
its fix.

* a Ctrl-C during a slow ``--model`` import waited for the import to end (the handler
  deferred every interrupt inside an import, to protect jaxlib's compiled modules) ->
  test_ctrl_c_during_a_slow_model_import_stops_it_at_once
* a Ctrl-C while the command itself was still importing JAX printed a traceback ->
  test_ctrl_c_while_the_command_starts_is_exit_130_without_a_traceback
* a gradient-free sampler on a model that cannot be differentiated (a host callback)
  was refused: the default step's curvature came from a Hessian at the mode ->
  test_a_gradient_free_sampler_runs_a_model_that_cannot_be_differentiated
* ``--model file.py`` without ``:FUNCTION`` said "no such file ''" ->
  test_a_model_without_its_function_name_names_the_format
"""

import json
import signal
import textwrap
import time

import numpy as np
from cli_helpers import run_cli, start_cli

#: How long the slow model's import would run on its own: far beyond the test's wait
#: for exit 130 (TIMEOUT_S), so a prompt exit can only come from the Ctrl-C.
SLOW_IMPORT_S = 300
TIMEOUT_S = 60


def test_ctrl_c_during_a_slow_model_import_stops_it_at_once(tmp_path):
    marker = tmp_path / "importing"
    model = tmp_path / "slow.py"
    model.write_text(
        textwrap.dedent(
            f"""
            import pathlib, time
            pathlib.Path({str(marker)!r}).write_text("started")
            t0 = time.time()
            while time.time() - t0 < {SLOW_IMPORT_S}:  # a slow set-up, in Python
                sum(range(1000))

            def logdensity_fn(x):
                return -0.5 * (x ** 2).sum()
            """
        )
    )
    proc = start_cli(["sample", "--model", f"{model}:logdensity_fn", "--dim", "2"])
    deadline = time.time() + TIMEOUT_S * 5  # JAX's import on a loaded 2-core machine
    while not marker.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.1)
    assert marker.exists(), proc.communicate()
    proc.send_signal(signal.SIGINT)
    # before the fix the import ran on to its end (SLOW_IMPORT_S): TimeoutExpired here
    out, err = proc.communicate(timeout=TIMEOUT_S)
    assert proc.returncode == 130, (proc.returncode, out, err)
    assert "Traceback" not in err and "interrupted" in err, err


def test_ctrl_c_while_the_command_starts_is_exit_130_without_a_traceback():
    # the interrupt arrives while the command's own modules are being imported (as a
    # Ctrl-C during JAX's import does): an import hook raises it there
    hook = textwrap.dedent(
        """
        import os, signal
        class _CtrlC:
            def find_spec(self, name, path=None, target=None):
                if name == "cenlmc_jax.cli.jobs":
                    os.kill(os.getpid(), signal.SIGINT)
                return None
        sys.meta_path.insert(0, _CtrlC())
        """
    )
    proc = start_cli(["sample"], extra_code=hook.replace("\n", "\n        "))
    out, err = proc.communicate(timeout=TIMEOUT_S * 5)
    assert proc.returncode == 130, (proc.returncode, out, err)
    assert "Traceback" not in err and "interrupted while starting" in err, err


def test_a_gradient_free_sampler_runs_a_model_that_cannot_be_differentiated(
    tmp_path, capsys
):
    model = tmp_path / "black_box.py"
    model.write_text(
        textwrap.dedent(
            """
            import jax, numpy as np

            def _numpy_logp(x):  # a black box: NumPy, no derivative for JAX
                x = np.asarray(x)
                return (-0.5 * (x ** 2).sum(-1)).astype(x.dtype)

            def logdensity_fn(x):
                out = jax.ShapeDtypeStruct(x.shape[:-1], x.dtype)
                return jax.pure_callback(
                    _numpy_logp, out, x, vmap_method="expand_dims")
            """
        )
    )
    for sampler, says in (("rwmh", "random-walk MH"), ("irreversible-mh", "Gamma(2")):
        code, out, err = run_cli(
            [
                "sample",
                "--model",
                f"{model}:logdensity_fn",
                "--dim",
                "2",
                "--sampler",
                sampler,
                "--particles",
                "16",
                "--steps",
                "100",
                "--burn-in",
                "100",
                "--allow-unreliable",
            ],
            capsys,
        )
        assert code == 0, (sampler, out, err)
        assert "JVP" not in out + err and says in out, out + err


def test_a_model_without_its_function_name_names_the_format(tmp_path, capsys):
    model = tmp_path / "m.py"
    model.write_text("def logdensity_fn(x):\n    return -(x ** 2).sum()\n")
    code, out, err = run_cli(["sample", "--model", model, "--dim", "2"], capsys)
    assert code == 2 and "Traceback" not in err, err
    assert "--model must be PATH.py:FUNCTION" in err and str(model) in err, err


#: A run of seconds that writes its --out files: rwmh, 20 particles, 100 burn-in and 100
#: kept steps (200 done), exit 0 whatever the verdict.
SMALL_RUN = ["--sampler", "rwmh", "--particles", "20", "--steps", "100", "--burn-in",
             "100", "--allow-unreliable"]  # fmt: skip


def _hooked(marker):
    """``extra_code`` for :func:`_child`: an ``atexit`` hook that writes ``marker``."""
    hook = f"pathlib.Path({str(marker)!r}).write_text"
    return f"import atexit, pathlib; atexit.register({hook}, 'ran')"


def test_the_command_skips_pythons_shutdown_and_still_writes_everything(tmp_path):
    # The command ends by os._exit once its output is flushed (the shutdown cost ~0.35 s
    # of CPU, docs/guide/cli.md "CPU time"): an atexit hook registered before it never
    # runs, while the printed report, the --out files and the compilation cache's
    # entries are all there.
    marker, out, cache = (tmp_path / n for n in ("hook", "out", "cache"))
    args = ["sample", *SMALL_RUN, "--out", out, "--compile-cache", cache]
    proc = start_cli(args, extra_code=_hooked(marker))
    stdout, err = proc.communicate(timeout=TIMEOUT_S * 5)
    assert proc.returncode == 0, (proc.returncode, stdout, err)
    assert not marker.exists(), "Python's shutdown ran"
    # the report's last lines, flushed before the exit
    assert f"wrote {out / 'run.json'}" in stdout, stdout
    record = json.loads((out / "run.json").read_text())
    assert record["steps_done"] == 200, record  # burn-in and kept
    with np.load(out / "moments.npz") as moments:
        assert np.all(np.isfinite(moments["mean"])), dict(moments)
    assert any(cache.iterdir()), "no compilation cache entry was written"


def test_a_models_own_buffered_file_and_atexit_hook_survive_the_command(tmp_path):
    # --model brings in the user's code: the command then ends by Python's shutdown, so
    # the model's buffered file is flushed and its atexit hook runs (os._exit would
    # lose both)
    model, log, marker = (tmp_path / n for n in ("m.py", "model.log", "hook"))
    model.write_text(
        textwrap.dedent(
            f"""
            import atexit, pathlib
            LOG = open({str(log)!r}, "w")  # never closed by the model
            LOG.write("opened\\n")
            atexit.register(pathlib.Path({str(marker)!r}).write_text, "ran")

            def logdensity_fn(x):
                return -0.5 * (x ** 2).sum()
            """
        )
    )
    args = ["sample", "--model", f"{model}:logdensity_fn", "--dim", "2", *SMALL_RUN]
    proc = start_cli(args)
    stdout, err = proc.communicate(timeout=TIMEOUT_S * 5)
    assert proc.returncode == 0, (proc.returncode, stdout, err)
    assert log.read_text() == "opened\n" and marker.read_text() == "ran", err


def test_a_reader_that_ends_first_stops_neither_the_run_nor_its_files(tmp_path):
    # `cenlmc-jax sample --out DIR | head -1`: the pipe's reader is gone before the
    # report is printed. Before the fix the next print raised BrokenPipeError: a
    # traceback, exit 1, and no run.json or moments.npz in DIR (the files are written
    # after the report).
    out = tmp_path / "out"
    args = ["sample", *SMALL_RUN, "--out", out]
    proc = start_cli(args)
    first = proc.stdout.readline()
    proc.stdout.close()  # as `head -1` does, long before the run ends
    proc.wait(timeout=TIMEOUT_S * 5)
    err = proc.stderr.read()
    assert first.startswith("cenlmc-jax: random-walk MH"), first
    assert proc.returncode == 0 and "Traceback" not in err, (proc.returncode, err)
    assert json.loads((out / "run.json").read_text())["steps_done"] == 200
    with np.load(out / "moments.npz") as moments:
        assert np.all(np.isfinite(moments["mean"]))
