"""What the CLI checks on a streamed run (issue 28, "never silently wrong"): the split
R-hat and ESS computed online (``RunResult.online``), and, for the unadjusted samplers,
the step-halving bias check, with its gradient cost printed.

* The default kind of run (streamed, LMC, 2000 particles on a Gaussian) is checked by
  both and passes; the verdict names them among the checks made.
* A curved banana (a ``--model``) at a large ``--step-size`` is UNRELIABLE by
  "step-size bias", naming the coordinate.
* ``--no-bias-check`` skips it and the verdict says so ("not checked").
"""

import json
import textwrap

from cli_helpers import run_cli

from cenlmc_jax import cli

BANANA = """
    def logp(x):
        # x0 ~ N(0, 1), x1 | x0 ~ N(0.25 (x0^2 - 1), 0.5^2)
        return -0.5 * x[0] ** 2 - 0.5 * ((x[1] - 0.25 * (x[0] ** 2 - 1)) / 0.5) ** 2
"""


def test_a_streamed_default_run_is_checked_online_and_by_step_halving(tmp_path, capsys):
    # LMC at the default h = sqrt(2/2000) = 0.032 on N(0, I): tau_int ~ 2 / h = 63, so
    # 1000 steps give ~8 effective draws per half-chain, R-hat ~ sqrt(1 + 1/8) = 1.06
    # < 1.1 and ESS ~ 3e4 > 400; the bias of E[x²], h/2, is ~0.8 of its step-halving
    # standard error (tests/diagnostics/test_online.py), below z = 3.02
    code, out, err = run_cli(
        ["sample", "--sampler", "lmc", "--dim", "2", "--out", tmp_path / "run"],
        capsys,
    )
    assert code == 0, out + err
    line = next(x for x in out.splitlines() if "reliability checks passed" in x)
    assert "split R-hat and ESS (online, streamed)" in line, line
    assert "step-size bias by step halving" in line, line
    assert "not checked" not in out, out
    cost = next(x for x in out.splitlines() if "step-halving bias check" in x)
    assert "more gradients" in cost and "of the run's" in cost, cost
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    assert record["bias_check"]["grad_evals"] > 0 and record["not_checked"] == []


def test_a_curved_banana_at_a_large_step_fails_on_step_size_bias(tmp_path, capsys):
    # the banana of tests/diagnostics/test_online.py at h = 0.12: ULA inflates
    # Var(x1 | x0) by 1 / (1 - 2h) = 1.3, a bias of E[x1²] of 4-10 standard errors
    model = tmp_path / "banana.py"
    model.write_text(textwrap.dedent(BANANA))
    code, out, err = run_cli(
        [
            "sample",
            "--sampler",
            "lmc",
            "--model",
            f"{model}:logp",
            "--dim",
            "2",
            "--step-size",
            "0.12",
            "--particles",
            "512",
            "--steps",
            "1000",
            "--burn-in",
            "300",
            "--compile-cache",
            "off",
        ],
        capsys,
    )
    assert code == 1, out + err
    bias = [x for x in out.splitlines() if "UNRELIABLE: step-size bias" in x]
    assert bias and "E[x[1]²]" in bias[0], out


def test_no_bias_check_skips_it_and_says_so(capsys):
    # --no-bias-check sets args.bias_check = False (the job reads it with a default of
    # on, so this runs with or without the flag in the parser)
    args = cli.build_parser().parse_args(
        ["sample", "--sampler", "lmc", "--dim", "2", "--particles", "300"]
    )
    args.bias_check = False
    code = cli.cmd_sample(args)
    out = capsys.readouterr().out
    assert "step-halving bias check" not in out
    assert "not checked: the step size's bias by step halving (--no-bias-check)" in (
        out
    ), out
    assert code in (0, 1)
