"""The adversarial probe's CLI defects, each with the test that failed before its fix.

* a config file's or a run folder's ``model`` entry was imported (code run) without
  ``--model`` -> test_a_config_or_run_folder_model_entry_is_never_imported,
     test_data_init_and_checkpoint_files_holding_pickles_are_refused_unread
* --output, --out, --checkpoint checked after the whole job, then a traceback ->
  test_paths_are_usage_errors_before_any_work,
  test_a_folder_that_cannot_be_written_is_a_usage_error
* the verdict crashed on h >= 2/c and on a divergence at step 0 (trace None), summary's
  ValueError -> test_step_size_at_the_stability_limit_is_unreliable_not_a_crash,
     test_divergence_at_step_0_writes_what_exists_says_unreliable_and_exits_as_the_verdict_says,
     test_ula_sd_has_no_value_beyond_the_stability_limit
* Ctrl-C during the first compile ended in SIGSEGV (139); the folder it left was refused
  by a rerun and by --resume ->
  test_ctrl_c_in_the_first_compile_exits_130_and_the_folder_reruns_and_resumes
* summary on a damaged folder, --resume with a changed flag: tracebacks
  -> test_summary_of_a_damaged_run_folder_is_a_usage_error_naming_the_file,
     test_resume_with_a_changed_flag_is_a_usage_error_naming_it,
     test_resume_of_another_runs_checkpoint_is_a_usage_error
"""

import json
import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from cli_helpers import run_cli

from cenlmc_jax import cli
from cenlmc_jax.cli import jobs, parser, verdict
from cenlmc_jax.models.targets import get_target

TINY = ["--sampler", "lmc", "--particles", "50", "--steps", "20", "--burn-in", "0"]


def usage_error(code, out, err, *texts):
    assert code == 2, out + err
    assert "usage:" in err and "Traceback" not in out + err, err
    for text in texts:
        assert text in err, (text, err)


@pytest.fixture
def no_work(monkeypatch):
    """Any setup (the target, the curvature, a warm-up: the first work) fails the
    test."""

    def setup(args):
        raise AssertionError(
            "the job was set up: the check came after work had started"
        )

    monkeypatch.setattr(jobs, "setup", setup)


def marker_model(folder, name, marker):
    """A model file that leaves ``marker`` behind when imported (stands for any
    code)."""
    path = folder / name
    path.write_text(
        textwrap.dedent(f"""
        open({str(marker)!r}, "w").write("imported")
        import jax.numpy as jnp

        def logp(x):
            return -0.5 * jnp.sum(x ** 2)
    """)
    )
    return path


class _Boom:
    """Unpickling it creates a file: what a pickle in a data file could do (run
    code)."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


# --------------------------------------------------------------------------
# 1. A config file or run folder never names code to import
# --------------------------------------------------------------------------


def test_a_config_or_run_folder_model_entry_is_never_imported(
    tmp_path, capsys, no_work
):
    marker = tmp_path / "IMPORTED"
    theirs = marker_model(tmp_path, "their_model.py", marker)
    mine = marker_model(tmp_path, "my_model.py", marker)
    (tmp_path / "run.toml").write_text(f'model = "{theirs}:logp"\ndim = 2\n')
    code, out, err = run_cli(["sample", "--config", tmp_path / "run.toml"], capsys)
    usage_error(
        code,
        out,
        err,
        "names a model file",
        "never names code to import",
        "--model PATH",
    )
    # a run folder someone sent: --resume --out DIR reads DIR/config.toml; its model is
    # not imported
    sent = tmp_path / "sent"
    sent.mkdir()
    parser.write_config(
        sent / "config.toml",
        {
            "model": f"{theirs}:logp",
            "dim": 2,
            "sampler": "lmc",
            "particles": 50,
            "steps": 20,
            "burn-in": 0,
            "out": str(sent),
        },
    )
    (sent / "checkpoint.npz").write_bytes(b"")
    code, out, err = run_cli(["sample", "--resume", "--out", sent], capsys)
    usage_error(code, out, err, "sent/config.toml names a model file", "--model PATH")
    # --model on the command line is the one used; on --resume it must be the run's own
    code, out, err = run_cli(
        ["sample", "--resume", "--out", sent, "--model", f"{mine}:logp"], capsys
    )
    usage_error(
        code,
        out,
        err,
        f"--model {mine}:logp is not the interrupted run's --model {theirs}:logp",
    )
    assert not marker.exists()  # neither file was imported


def test_data_init_and_checkpoint_files_holding_pickles_are_refused_unread(
    tmp_path, capsys
):
    marker = tmp_path / "UNPICKLED"
    boom = np.array([_Boom(marker)], dtype=object)
    np.save(tmp_path / "init.npy", boom, allow_pickle=True)
    code, out, err = run_cli(["sample", *TINY, "--init", tmp_path / "init.npy"], capsys)
    usage_error(code, out, err, "--init", "holds pickled Python objects")
    np.savez(tmp_path / "data.npz", mu=boom)
    model = tmp_path / "m.py"
    model.write_text("def logp(x, data):\n    return -0.5 * (x ** 2).sum()\n")
    code, out, err = run_cli(
        [
            "sample",
            *TINY,
            "--model",
            f"{model}:logp",
            "--dim",
            "2",
            "--data",
            tmp_path / "data.npz",
        ],
        capsys,
    )
    usage_error(code, out, err, "--data", "holds pickled Python objects")
    np.savez(tmp_path / "init.npz", x=np.zeros((3, 2)))
    code, out, err = run_cli(["sample", *TINY, "--init", tmp_path / "init.npz"], capsys)
    usage_error(code, out, err, "an .npz archive")
    # the checkpoint --resume reads (a run folder's, named by its config.toml or by
    # --checkpoint)
    np.savez(tmp_path / "ck.npz", header=boom)
    code, out, err = run_cli(
        ["sample", *TINY, "--resume", "--checkpoint", tmp_path / "ck.npz"], capsys
    )
    usage_error(code, out, err, "--resume: checkpoint_path", "ck.npz")
    assert not marker.exists()


# --------------------------------------------------------------------------
# 2. Paths are checked before any work
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--output", "{d}/adir"], "--output {d}/adir: is a directory"),
        (["--output", "{d}/nowhere/x.npz"], "the folder '{d}/nowhere' does not exist"),
        (["--output", "{d}/afile/x.npz"], "the folder '{d}/afile' is not a directory"),
        (["--out", "{d}/afile"], "--out {d}/afile: exists and is not a directory"),
        (
            ["--out", "{d}/afile/run"],
            "--out {d}/afile/run: '{d}/afile' is not a directory",
        ),
        (["--checkpoint", "{d}/adir"], "--checkpoint {d}/adir: is a directory"),
        (
            ["--checkpoint", "{d}/afile/ck.npz"],
            "the folder '{d}/afile' is not a directory",
        ),
        (
            ["--out", "{d}/run", "--output", "{d}/run/run.json"],
            "the run writes {d}/run/run.json itself",
        ),
        (
            ["--checkpoint", "{d}/ck.npz", "--output", "{d}/ck.npz"],
            "the run writes {d}/ck.npz itself",
        ),
    ],
)
def test_paths_are_usage_errors_before_any_work(
    flags, message, tmp_path, capsys, no_work
):
    (tmp_path / "adir").mkdir()
    (tmp_path / "afile").write_text("x")
    d = str(tmp_path)
    code, out, err = run_cli(["sample", *TINY, *[f.format(d=d) for f in flags]], capsys)
    usage_error(code, out, err, message.format(d=d))
    assert not (tmp_path / "run").exists()


def test_a_folder_that_cannot_be_written_is_a_usage_error(
    tmp_path, capsys, no_work, monkeypatch
):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        probe = locked / "probe"
        try:
            probe.write_text(
                ""
            )  # root writes anyway: then make the write test itself fail there
            probe.unlink()
            real = parser.tempfile.mkstemp

            def mkstemp(dir=None, **kw):
                if os.path.abspath(dir).startswith(str(locked)):
                    raise PermissionError(13, "Permission denied")
                return real(dir=dir, **kw)

            monkeypatch.setattr(parser.tempfile, "mkstemp", mkstemp)
        except PermissionError:
            pass
        for flags in (
            ["--output", locked / "x.npz"],
            ["--out", locked / "run"],
            ["--out", locked],
            ["--checkpoint", locked / "ck.npz"],
        ):
            code, out, err = run_cli(["sample", *TINY, *flags], capsys)
            usage_error(code, out, err, f"cannot write in the folder '{locked}'")
    finally:
        locked.chmod(0o755)


# --------------------------------------------------------------------------
# 3. The verdict of a run that diverged or kept nothing
# --------------------------------------------------------------------------


def test_ula_sd_has_no_value_beyond_the_stability_limit():
    """Before: nan (h = 2.5: 'All-NaN slice' in the verdict) and a singular matrix (h =
    2: LinAlgError)."""
    target = get_target("gaussian")  # precision I: the limit is h = 2
    np.testing.assert_allclose(verdict.ula_sd(target, 1.0), [1 / np.sqrt(0.5)] * 2)
    assert verdict.ula_sd(target, 2.0) is None and verdict.ula_sd(target, 2.5) is None


def test_step_size_at_the_stability_limit_is_unreliable_not_a_crash(tmp_path, capsys):
    code, out, err = run_cli(
        ["sample", *TINY, "--step-size", "2.0", "--out", tmp_path / "run"], capsys
    )
    assert code == 1, out + err
    assert (
        "UNRELIABLE: the step size h=2 is at or above 2/c = 2" in out
        and "Traceback" not in out + err
    )
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    assert record["reliable"] is False and any(
        "stability limit" in p for p in record["problems"]
    )


def test_divergence_at_step_0_writes_what_exists_says_unreliable_and_exits_as_the_verdict_says(  # noqa: E501
    tmp_path, capsys
):
    """cj.sample keeps no draw when it diverges at step 0: before, summary's ValueError
    ('neither a trace nor moments'), no outputs and exit 1 even with
    --allow-unreliable."""
    run = tmp_path / "run"
    code, out, err = run_cli(
        [
            "sample",
            *TINY,
            "--step-size",
            "1e30",
            "--trace",
            "--out",
            run,
            "--output",
            tmp_path / "final.npz",
        ],
        capsys,
    )
    assert code == 1, out + err
    assert (
        "Traceback" not in out + err and "neither a trace nor moments" not in out + err
    )
    assert (
        "UNRELIABLE: DIVERGED at step 0" in out
        and "UNRELIABLE: no draw was kept" in out
    )
    assert "no estimates: no draw was kept" in out
    draws = np.load(run / "draws.npz")
    assert draws["draws"].shape == (50, 0, 2) and draws["final_position"].shape == (
        50,
        2,
    )
    assert np.all(np.isnan(np.load(tmp_path / "final.npz")["mean"]))
    record = json.loads((run / "run.json").read_text())
    assert (
        record["kept_steps"] == 0
        and record["reliable"] is False
        and record["diverged_at"] == 0
    )
    assert not (run / "summary.csv").exists() and not (run / "checkpoint.npz").exists()
    code, out, err = run_cli(["summary", run], capsys)
    assert code == 0, err
    assert (
        "no estimates: no draw was kept" in out
        and "UNRELIABLE: DIVERGED at step 0" in out
    )
    # streaming, --allow-unreliable: the verdict's exit status 0, the moments file says
    # count 0
    code, out, err = run_cli(
        [
            "sample",
            *TINY,
            "--step-size",
            "1e30",
            "--allow-unreliable",
            "--out",
            tmp_path / "stream",
        ],
        capsys,
    )
    assert code == 0, out + err
    assert (
        "UNRELIABLE: no draw was kept" in out
        and "--allow-unreliable: exit status 0" in out
    )
    assert float(np.load(tmp_path / "stream" / "moments.npz")["count"]) == 0


# --------------------------------------------------------------------------
# 4, 5. Ctrl-C in the first compile; the folder it leaves
# --------------------------------------------------------------------------


# The child: SIGINT's handler put back (a test run in the background ignores SIGINT),
# then the CLI, with a Ctrl-C sent 0.05 s into the first XLA compilation after the
# header that lasts that long (the run's own): jax's backend_compile_and_load is wrapped
# to arm a timer while it runs.
_CTRL_C_IN_COMPILE_CHILD = textwrap.dedent("""
    import os, runpy, signal, sys, threading
    signal.signal(signal.SIGINT, signal.default_int_handler)
    from jax._src import compiler
    from cenlmc_jax.cli import verdict
    armed, sent = [], []
    compile_, print_header = compiler.backend_compile_and_load, verdict.print_header

    def header_then_arm(*a, **k):
        print_header(*a, **k)
        armed.append(True)

    def ctrl_c():
        sent.append(True)
        os.kill(os.getpid(), signal.SIGINT)

    def compile_with_ctrl_c(*a, **k):
        timer = threading.Timer(0.05, ctrl_c) if armed and not sent else None
        if timer is not None:
            timer.start()
        try:
            return compile_(*a, **k)
        finally:
            if timer is not None:
                timer.cancel()

    compiler.backend_compile_and_load, verdict.print_header = (
        compile_with_ctrl_c, header_then_arm)
    sys.argv[0] = "cenlmc-jax"
    runpy.run_module("cenlmc_jax.cli", run_name="__main__")
""")


def test_ctrl_c_in_the_first_compile_exits_130_and_the_folder_reruns_and_resumes(
    tmp_path, capsys
):
    """Before: SIGSEGV (exit 139) at Python's shutdown, which freed the XLA client while
    XLA's thread still compiled the interrupted program; then both a rerun ('not empty')
    and --resume ('nothing to resume') refused the folder, which held only
    config.toml."""
    folder = tmp_path / "run"
    # CEnLMC: a compilation of seconds, still running on XLA's thread when Python shut
    # down
    args = [
        "sample",
        "--particles",
        "100",
        "--steps",
        "100",
        "--burn-in",
        "0",
        "--allow-unreliable",
        "--out",
        str(folder),
    ]
    env = dict(os.environ, PYTHONUNBUFFERED="1", JAX_PLATFORMS="cpu")
    proc = subprocess.Popen(
        [sys.executable, "-X", "faulthandler", "-c", _CTRL_C_IN_COMPILE_CHILD] + args,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, (proc.returncode, out, err)
    assert (
        "Segmentation fault" not in err
        and "Fatal Python error" not in err
        and "Traceback" not in err
    ), err
    assert "interrupted before the first checkpoint" in err
    assert sorted(os.listdir(folder)) == ["config.toml"]
    again = tmp_path / "again"
    shutil.copytree(folder, again)
    # the same command starts afresh; --resume starts from the beginning and says so
    code, out, err = run_cli(args[:-1] + [str(again)], capsys)
    assert code == 0 and f"wrote {again / 'run.json'}" in out, out + err
    code, out, err = run_cli(["sample", "--resume", "--out", folder], capsys)
    assert code == 0, out + err
    assert (
        f"no checkpoint in {folder} yet" in err and "starting from the beginning" in err
    )
    np.testing.assert_array_equal(
        np.load(folder / "moments.npz")["mean"], np.load(again / "moments.npz")["mean"]
    )
    code, out, err = run_cli(["sample", "--resume", "--out", folder], capsys)
    usage_error(code, out, err, "holds a finished run")


# --------------------------------------------------------------------------
# 6. Damaged run folders, changed flags
# --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("finished") / "run"
    assert (
        cli.main([*map(str, ["sample", *TINY, "--allow-unreliable", "--out", folder])])
        == 0
    )
    return folder


def _damage_json(text):
    return lambda folder: (folder / "run.json").write_text(text)


@pytest.mark.parametrize(
    "damage, file, message",
    [
        (
            _damage_json('{"seed": 0, "summary_run": '),
            "run.json",
            "damaged, not the run.json",
        ),
        (_damage_json("[1, 2]"), "run.json", "a JSON list, not an object"),
        (
            _damage_json('{"target": "banana", "summary_run": {}}'),
            "run.json",
            "target should be a JSON dict",
        ),
        (
            _damage_json('{"problems": [1]}'),
            "run.json",
            "problems should be a list of strings",
        ),
        (
            lambda f: (f / "run.json").write_bytes(b"\xff\xfe\x00"),
            "run.json",
            "damaged",
        ),
        (
            lambda f: (f / "summary.csv").write_text("hello\n"),
            "summary.csv",
            "damaged, not the summary.csv",
        ),
        (
            lambda f: (f / "summary.csv").write_text(
                (f / "summary.csv").read_text()[:-20]
            ),
            "summary.csv",
            "damaged",
        ),
        (lambda f: (f / "summary.csv").unlink(), "", "no summary.csv"),
    ],
)
def test_summary_of_a_damaged_run_folder_is_a_usage_error_naming_the_file(
    damage, file, message, finished_run, tmp_path, capsys
):
    folder = tmp_path / "run"
    shutil.copytree(finished_run, folder)
    code, out, _ = run_cli(["summary", folder], capsys)
    assert code == 0 and "x[1]" in out  # intact, it prints
    damage(folder)
    code, out, err = run_cli(["summary", folder], capsys)
    usage_error(code, out, err, str(folder / file), message)


def test_resume_with_a_changed_flag_is_a_usage_error_naming_it(
    tmp_path, capsys, no_work
):
    folder = tmp_path / "run"
    folder.mkdir()
    parser.write_config(
        folder / "config.toml",
        {
            "sampler": "lmc",
            "particles": 50,
            "steps": 20,
            "burn-in": 0,
            "target": "gaussian",
            "out": str(folder),
        },
    )
    (folder / "checkpoint.npz").write_bytes(b"")
    for flags, message in (
        (["--steps", "40"], "--steps 40 is not the interrupted run's --steps 20"),
        (["--trace"], "--trace is not the interrupted run's --no-trace"),
        (["--seed", "1"], "--seed 1 is not the interrupted run's --seed 0"),
        (
            ["--sampler", "cenlmc"],
            "--sampler cenlmc is not the interrupted run's --sampler lmc",
        ),
    ):
        code, out, err = run_cli(
            ["sample", "--resume", "--out", folder, *flags], capsys
        )
        usage_error(code, out, err, message, str(folder / "config.toml"))


def test_resume_of_another_runs_checkpoint_is_a_usage_error(
    tmp_path, capsys, monkeypatch
):
    """--resume --checkpoint PATH (no run folder to compare with): the driver's refusal,
    named, not a traceback."""
    ck = tmp_path / "ck.npz"
    with monkeypatch.context() as m:
        m.setattr(
            jobs, "remove_checkpoint", lambda path: None
        )  # keep the checkpoint of a finished run
        code, out, err = run_cli(
            ["sample", *TINY, "--checkpoint", ck, "--checkpoint-every", "10"], capsys
        )
    assert code in (0, 1) and ck.exists(), out + err
    code, out, err = run_cli(
        [
            "sample",
            *TINY[:-4],
            "--steps",
            "40",
            "--burn-in",
            "0",
            "--resume",
            "--checkpoint",
            ck,
        ],
        capsys,
    )
    usage_error(
        code,
        out,
        err,
        f"--resume: checkpoint_path '{ck}' belongs to a different run: num_steps "
        "differs",
    )
    ck.write_bytes(b"not a checkpoint")
    code, out, err = run_cli(["sample", *TINY, "--resume", "--checkpoint", ck], capsys)
    usage_error(code, out, err, "is not a readable cenlmc_jax checkpoint")
