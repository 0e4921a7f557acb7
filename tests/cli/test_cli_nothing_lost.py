"""Issue 47 ("Nothing lost"): the command's files, each with the test that failed
before its fix (the checkpoint's own files: tests/test_checkpoint_files.py).

* a symlink, a directory or an unreadable file at the checkpoint's lock: followed
  out of the folder, or a traceback after the work ->
  test_a_bad_lock_path_is_a_usage_error_before_any_work
* ``--out`` with non-BMP characters, quotes or backslashes: config.toml written as
  invalid TOML (an escaped surrogate), so ``--config`` and ``--resume`` of the folder
  failed -> test_config_toml_writes_and_reads_back_any_text,
  test_a_run_folder_with_any_name_reruns_and_resumes
* a finished run left ``checkpoint.npz.lock`` in ``--out`` ->
  test_a_finished_run_leaves_no_lock_file
* ``--out`` with a model the checkpoint cannot fingerprint: exit 2 before any work ->
  test_a_model_the_checkpoint_cannot_fingerprint_runs_with_out,
  test_the_fallback_fingerprint_follows_the_model_files_text
* ``--init FILE.npy`` cast to float32 even with float64 on ->
  test_init_keeps_float64_when_x64_is_on
"""

import argparse
import json
import os
import textwrap

import jax
import numpy as np
import pytest
from cli_helpers import run_cli

from cenlmc_jax import checkpoint as ckpt
from cenlmc_jax.cli import jobs, parser

TINY = ["--sampler", "lmc", "--particles", "50", "--steps", "20", "--burn-in", "0"]
QUICK = ["--allow-unreliable", "--no-bias-check"]


def usage_error(code, out, err, *texts):
    assert code == 2, out + err
    assert "usage:" in err and "Traceback" not in out + err, err
    for text in texts:
        assert text in err, (text, err)


@pytest.fixture
def no_work(monkeypatch):
    def setup(args):
        raise AssertionError("the job was set up: the check came after work started")

    monkeypatch.setattr(jobs, "setup", setup)


# --------------------------------------------------------------------------
# The lock file
# --------------------------------------------------------------------------


def test_a_bad_lock_path_is_a_usage_error_before_any_work(tmp_path, capsys, no_work):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    ck = tmp_path / "ck.npz"
    lock = tmp_path / "ck.npz.lock"
    os.symlink(elsewhere / "target", lock)
    code, out, err = run_cli(["sample", *TINY, "--checkpoint", ck], capsys)
    usage_error(code, out, err, f"'{lock}' is a symbolic link", "remove the link")
    assert os.listdir(elsewhere) == []
    lock.unlink()
    lock.mkdir()
    code, out, err = run_cli(["sample", *TINY, "--checkpoint", ck], capsys)
    usage_error(code, out, err, f"its lock file '{lock}' is a directory", "remove it")


def test_a_finished_run_leaves_no_lock_file(tmp_path, capsys):
    run = tmp_path / "run"
    code, out, err = run_cli(["sample", *TINY, *QUICK, "--out", run], capsys)
    assert code == 0, out + err
    listed = set(json.loads((run / "run.json").read_text())["files"])
    assert set(os.listdir(run)) == listed, (os.listdir(run), listed)
    assert not (run / "checkpoint.npz.lock").exists()


# --------------------------------------------------------------------------
# config.toml: any path a file system takes
# --------------------------------------------------------------------------

ODD = [
    "run 😀 x",
    'a "quoted" name',
    "back\\slash\\",
    "tab\tand\x7fdel\x01",
    "é ü 中文 \U0001f9ea",
    "",
]


def test_config_toml_writes_and_reads_back_any_text(tmp_path):
    config = {f"k{i}": text for i, text in enumerate(ODD)}
    config.update(n=3, x=0.25, flag=True)
    path = tmp_path / "config.toml"
    parser.write_config(str(path), config)
    assert parser.read_config(str(path)) == config
    # a name no TOML string can hold (undecodable bytes, as os.fsdecode gives them)
    with pytest.raises(parser.UsageError, match=r"--out .*not valid UTF-8"):
        parser.toml_value("run\udcff", "out")


def test_a_run_folder_with_any_name_reruns_and_resumes(tmp_path, capsys, monkeypatch):
    folder = tmp_path / 'run 😀 "x" \\ y'
    args = ["sample", *TINY, *QUICK]

    def interrupted(args, setup):
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(jobs, "run_job", interrupted)
        code, out, err = run_cli(args + ["--out", folder], capsys)
    assert code == 130, out + err
    table = parser.read_config(str(folder / "config.toml"))
    assert table["out"] == str(folder)
    code, out, err = run_cli(["sample", "--resume", "--out", folder], capsys)
    assert code == 0, out + err
    assert "starting from the beginning" in err
    again = tmp_path / "again"
    code, out, err = run_cli(
        ["sample", "--config", folder / "config.toml", "--out", again], capsys
    )
    assert code == 0, out + err
    np.testing.assert_array_equal(
        np.load(folder / "moments.npz")["mean"], np.load(again / "moments.npz")["mean"]
    )


# --------------------------------------------------------------------------
# A model the checkpoint cannot fingerprint
# --------------------------------------------------------------------------

TFP_LIKE = """
    import jax
    import jax.numpy as jnp

    class Normal:  # holds a PyTreeDef, as TensorFlow Probability's objects do
        def __init__(self, loc, scale):
            self.params = [loc, scale]
            self.treedef = jax.tree_util.tree_structure({"loc": 0, "scale": 0})

        def log_prob(self, x):
            p = jax.tree_util.tree_unflatten(self.treedef, self.params)
            return -0.5 * jnp.sum(((x - p["loc"]) / p["scale"]) ** 2)

    PRIOR = Normal(0.0, 1.0)

    def logp(x):
        return PRIOR.log_prob(x)
"""


def write_model(folder, body, name="tfp_like.py"):
    path = folder / name
    path.write_text(textwrap.dedent(body))
    return path


def test_a_model_the_checkpoint_cannot_fingerprint_runs_with_out(tmp_path, capsys):
    """The identity of its checkpoint across imports of the model file:
    test_the_fallback_fingerprint_follows_the_model_files_text."""
    model = write_model(tmp_path, TFP_LIKE)
    with pytest.raises(ckpt.Unfingerprintable):  # the model this test is about
        ckpt.fingerprint(jobs._import_model(f"{model}:logp")[0])
    run = tmp_path / "run"
    flags = ["--model", f"{model}:logp", "--dim", "2", *TINY, *QUICK]
    code, out, err = run_cli(["sample", *flags, "--out", run], capsys)
    assert code == 0, out + err
    assert "note: the model cannot be fingerprinted" in err
    assert f"source text of {model}" in err
    assert (run / "run.json").exists()


def _fallback(model, **flags):
    settings = dict(seed=0, sampler="lmc", particles=50, out=None, checkpoint="c")
    args = argparse.Namespace(model=f"{model}:logp", **{**settings, **flags})
    fn = jobs._import_model(args.model)[0]
    target = jobs.load_model(args.model, None, 2, fn)
    return ckpt.fingerprint(jobs.checkpoint_target(args, target).logdensity_fn)


def test_the_fallback_fingerprint_follows_the_model_files_text(tmp_path, capsys):
    model = write_model(tmp_path, TFP_LIKE)
    first = _fallback(model)
    assert _fallback(model) == first  # a new import: the same identity
    assert _fallback(model, steps=10) == first  # the run length: not the model's
    assert _fallback(model, seed=1) != first  # the run's configuration
    model.write_text(model.read_text().replace("Normal(0.0, 1.0)", "Normal(0.0, 2.0)"))
    assert _fallback(model) != first  # the model's text
    capsys.readouterr()
    # a model the checkpoint can fingerprint is taken as it is, without a note
    plain = write_model(tmp_path, "def logp(x):\n    return -(x**2).sum()\n", "p.py")
    args = argparse.Namespace(model=f"{plain}:logp", checkpoint="c")
    target = jobs.load_model(args.model, None, 2, jobs._import_model(args.model)[0])
    assert jobs.checkpoint_target(args, target) is target
    assert "note" not in "".join(capsys.readouterr())


# --------------------------------------------------------------------------
# --init's dtype
# --------------------------------------------------------------------------


def test_init_keeps_float64_when_x64_is_on(tmp_path, capsys):
    init = np.random.default_rng(0).normal(size=(50, 2))  # float64
    np.save(tmp_path / "init.npy", init)
    flags = ["sample", *TINY[:2], "--steps", "4", "--burn-in", "0", *QUICK]
    flags += ["--init", tmp_path / "init.npy", "--output", tmp_path / "final.npz"]
    with jax.enable_x64(True):
        code, out, err = run_cli(flags, capsys)
    assert code == 0, out + err
    assert "--init: float64 starting positions (the file's dtype)" in err
    assert np.load(tmp_path / "final.npz")["final_position"].dtype == np.float64
    # float64 off (JAX's default): float32, and said so
    noise = np.zeros(2, np.float32)
    assert jobs.init_positions(init, noise).dtype == np.float32
    assert jobs.init_positions(init[0], noise).dtype == np.float32
    err = capsys.readouterr().err
    assert "--init: float32 starting positions (the file holds float64" in err
    assert "jax_enable_x64" in err
