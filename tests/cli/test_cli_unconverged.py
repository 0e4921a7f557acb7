"""The CLI on a model that does not converge (issue 18): it says what happened and exits
non-zero.

* A raw-scale regression (predictor ~100, as kidiq's mom_iq) with LMC at the curvature
  rule (``--no-adapt``; by default a ``--model`` is warmed up by cj.langevin_warmup,
  tests/cli/test_cli_langevin_warmup.py) diverges at step 0; the CLI crashed in
  ``summary`` with a traceback (``result_or_draws is a RunResult with neither a trace
  nor moments``). It must name the step, advise, and exit 1 without a traceback.
* The verdict runs the same convergence checks as ``cj.sample``
  (``cenlmc_jax.diagnostics.convergence``): an unmixed ``--trace`` run is UNRELIABLE by
  its R-hat and ESS, streamed too (the split R-hat and ESS computed online,
  ``RunResult.online``), and a run whose chains never move by the frozen check, in
  stream mode too.
"""

import textwrap

import numpy as np
from cli_helpers import run_cli

RAW_REGRESSION = """
    import jax.numpy as jnp

    def logp(x, data):
        # kid_score ~ normal(b0 + b1 mom_iq, sigma), sigma = exp(x[2]) with its
        # log-Jacobian; cauchy(0, 2.5) prior
        b0, b1, log_sigma = x[0], x[1], x[2]
        sigma = jnp.exp(log_sigma)
        r = (data["y"] - b0 - b1 * data["x"]) / sigma
        return (-0.5 * jnp.sum(r**2) - data["y"].shape[0] * log_sigma
                - jnp.log1p((sigma / 2.5) ** 2) + log_sigma)
"""


def raw_model(tmp_path):
    path = tmp_path / "raw_model.py"
    path.write_text(textwrap.dedent(RAW_REGRESSION))
    rng = np.random.default_rng(0)
    x = rng.normal(
        100.0, 15.0, 40
    )  # raw predictor: the curvature in b1 is ~ sum x^2 / sigma^2, 1e4 times b0's
    np.savez(tmp_path / "data.npz", x=x, y=26.0 + 0.6 * x + rng.normal(0.0, 18.0, 40))
    return [f"{path}:logp", "--data", tmp_path / "data.npz", "--dim", "3"]


def test_default_lmc_on_a_raw_scale_model_says_it_diverged_and_exits_1(
    tmp_path, capsys
):
    code, out, err = run_cli(
        [
            "sample",
            "--sampler",
            "lmc",
            "--no-adapt",
            "--model",
            *raw_model(tmp_path),
            "--out",
            tmp_path / "run",
        ],
        capsys,
    )
    assert code == 1, out + err
    assert (
        "Traceback" not in out + err and "neither a trace nor moments" not in out + err
    )
    assert "UNRELIABLE: DIVERGED at step 0" in out, out
    line = next(line for line in out.splitlines() if "DIVERGED" in line)
    for advice in ("from the default rule", "--step-size", "--init", "standardise"):
        assert advice in line, (advice, line)
    code, out, err = run_cli(
        ["summary", tmp_path / "run"], capsys
    )  # the report again: no traceback either
    assert "UNRELIABLE: DIVERGED at step 0" in out and "Traceback" not in out + err


def test_the_verdict_uses_the_convergence_checks_of_cj_sample(tmp_path, capsys):
    # 60 steps of LMC at h = 0.002 on N(0, I) from starts spread by 10: the particles
    # cannot mix (relaxation ~ 1/h = 500 steps), so the rank-normalised R-hat is far
    # above 1.01 and the bulk ESS far below 400
    base = [
        "sample",
        "--sampler",
        "lmc",
        "--target",
        "gaussian",
        "--dim",
        "2",
        "--particles",
        "16",
        "--burn-in",
        "0",
        "--steps",
        "60",
        "--step-size",
        "0.002",
        "--init-scale",
        "10",
    ]
    code, out, err = run_cli([*base, "--trace"], capsys)
    assert code == 1, out + err
    assert "UNRELIABLE: the rank-normalised split R-hat of x[" in out, out
    assert "UNRELIABLE: the bulk ESS of x[" in out, out
    # streamed (the default): the same run fails on the R-hat and ESS computed online
    code, out, err = run_cli(base, capsys)
    assert code == 1, out + err
    assert "UNRELIABLE: the split R-hat of x[" in out, out
    assert "computed online" in out and "UNRELIABLE: the ESS of x[" in out, out
    # a Metropolis sampler whose step size rejects everything: no chain moves, stream
    # mode included
    code, out, err = run_cli(
        [
            "sample",
            "--sampler",
            "rwmh",
            "--target",
            "gaussian",
            "--dim",
            "2",
            "--particles",
            "8",
            "--burn-in",
            "0",
            "--steps",
            "50",
            "--step-size",
            "1e6",
            "--no-adapt",
        ],
        capsys,
    )
    assert code == 1, out + err
    assert "UNRELIABLE: 8 of 8 chains or particles never moved" in out, out
