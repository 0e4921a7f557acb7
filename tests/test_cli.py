"""The main job, run as a user would (in-process, on small sizes)."""

import numpy as np
import pytest

from cenlmc_jax import cli


def test_sample_default_runs_and_prints_a_summary(capsys):
    assert cli.main(["sample", "--particles", "500", "--steps", "200", "--burn-in", "100"]) == 0
    out = capsys.readouterr().out
    assert "gradient evaluations" in out and "mean" in out and "true" in out


@pytest.mark.parametrize("sampler", sorted(set(cli.SAMPLERS) - {"enlmc"}))
def test_every_sampler_runs_from_the_command_line(sampler, tmp_path, capsys):
    path = tmp_path / "out.npz"
    code = cli.main(["sample", "--sampler", sampler, "--particles", "400", "--steps", "100",
                     "--burn-in", "50", "--output", str(path)])
    assert code == 0, capsys.readouterr().out
    data = np.load(path)
    assert data["final_position"].shape[0] == 400 and np.all(np.isfinite(data["mean"]))


def test_bad_flags_exit_with_a_message(capsys):
    with pytest.raises(SystemExit):
        cli.main(["sample", "--particles", "0"])
    assert "--particles must be >= 1" in capsys.readouterr().err


def test_enlmc_blow_up_is_reported_by_the_main_job(capsys):
    """EnLMC is provably unstable (Theorem 3.2): the job must say so and exit 1."""
    with pytest.warns(RuntimeWarning, match="diverged"):
        code = cli.main(["sample", "--sampler", "enlmc", "--dim", "1", "--particles", "400", "--steps", "300"])
    assert code == 1
    assert "DIVERGED at step" in capsys.readouterr().out
