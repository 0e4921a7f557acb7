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

import pytest
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


@pytest.mark.parametrize("sampler", ["cenlmc", "lmc"])
def test_the_bias_check_reuses_the_runs_compiled_chunk(sampler, capsys):
    # the step size is carried in the state (samplers.step_size_traced): the h/2 run of
    # the step-halving check finds the run's jitted chunk (one new entry of cj.sample's
    # per-step-function cache for the whole job, not two) and JAX traces it once
    from cenlmc_jax import run as run_mod

    before = run_mod._chunk_fn.cache_info()
    code, out, err = run_cli(
        [
            "sample",
            "--sampler",
            sampler,
            "--particles",
            "300",
            "--steps",
            "100",
            "--burn-in",
            "50",
            "--seed",
            "3",
            "--compile-cache",
            "off",
        ],
        capsys,
    )
    after = run_mod._chunk_fn.cache_info()
    assert "step-halving bias check" in out, out + err
    assert after.misses - before.misses == 1, (before, after)


def test_the_traced_step_size_runs_the_samplers_chain():
    # the job's sampler at h/2 (the step size a traced argument) against cj.cenlmc built
    # at h/2 (a constant): the same kernel and keys, so the same chain up to float32
    # rounding of the step's arithmetic (h enters as a runtime value, not a folded
    # constant): 1e-5 relative over 20 steps of a unit-scale ensemble
    import jax
    import numpy as np

    import cenlmc_jax as cj
    from cenlmc_jax.cli import samplers

    logp = cj.models.targets.standard_gaussian(2).logdensity_fn
    algo = cj.cenlmc(logp, 0.05, 0.3, 0.4, 0.3, 5, 5.0, f_star=0.0)
    x0 = jax.random.normal(jax.random.key(0), (256, 2))
    job = samplers.step_size_traced(samplers.Job(algo, algo.init(x0), "", {}))
    assert job.at_step_size is not None
    half, ref = (
        job.at_step_size(0.025),
        cj.cenlmc(logp, 0.025, 0.3, 0.4, 0.3, 5, 5.0, f_star=0.0),
    )
    a = cj.sample(jax.random.key(1), half, half.init(x0), 20, check_convergence=False)
    b = cj.sample(jax.random.key(1), ref, ref.init(x0), 20, check_convergence=False)
    np.testing.assert_allclose(a.trace, b.trace, rtol=1e-5, atol=1e-5)
    assert isinstance(a.state, samplers.AtStepSize) and a.state.step_size == np.float32(
        0.025
    )
