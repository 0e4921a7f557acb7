"""``--progress`` on a fresh install (issue 48: a new user's venv has no tqdm, and a
warm-up that compiles for minutes printed nothing): the warm-up's phases are plain
lines on stderr and show without tqdm; only the sampling bar needs it."""

import importlib.util

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
