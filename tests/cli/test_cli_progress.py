"""``--progress`` on a fresh install (issue 48: a new user's venv has no tqdm, and a
warm-up that compiles for minutes printed nothing): the warm-up's phases are plain
lines on stderr and show without tqdm; only the sampling bar needs it."""

import importlib.util
import re

from cli_helpers import run_cli

MODEL = "import jax.numpy as jnp\n\ndef logp(x):\n    return -0.5 * jnp.sum(x**2)\n"


def test_progress_without_tqdm_prints_the_warm_up_phases(tmp_path, capsys, monkeypatch):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "tqdm" else find_spec(name, *a),
    )
    model = tmp_path / "m.py"
    model.write_text(MODEL)
    code, out, err = run_cli(
        ["sample", "--model", f"{model}:logp", "--dim", 2, "--particles", 64]
        + ["--steps", 20, "--progress"],
        capsys,
    )
    assert "needs tqdm" not in err and code == 0, out + err
    assert "warm-up:" in err, err  # the phases, as they end


def test_progress_of_the_default_run_says_why_it_goes_on(tmp_path, capsys):
    # without --steps a --model job runs cj.sample_until; each check prints a line
    # that ends with why the run goes on, and the last one (the run stopped on the
    # verdict, exit 0) that it holds
    model = tmp_path / "m.py"
    model.write_text(MODEL)
    code, out, err = run_cli(
        ["sample", "--model", f"{model}:logp", "--dim", 2, "--particles", 64]
        + ["--progress"],
        capsys,
    )
    assert code == 0, out + err
    checks = re.findall(
        r"\[(\d+) steps\] nested R-hat max [0-9.]+, memory max -?[0-9.]+, ESS min "
        r"\d+: (.*)",
        err,
    )
    assert checks, err
    assert checks[0][1] == "running on: the checks start after 2 segments", checks
    assert checks[-1][1] == "the verdict holds, stopping", checks
    assert all(why.startswith("running on: ") for _, why in checks[:-1]), checks
