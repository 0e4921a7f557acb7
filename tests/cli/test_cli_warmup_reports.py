"""The warm-up's reports reach the CLI's verdict (issue 28: a local mode near the
start).

A posterior with a narrow, high mode at the start (a fifth of the mass) and the main
mode away from it: the mode search finds both and warns that the warm-up starts at the
highest one, whose draws then describe that mode only (mean 0 instead of 4.8). Before,
the CLI printed the warning and then "reliability checks passed", exit 0; now the
warning is an UNRELIABLE reason, exit 1.
"""

import textwrap

from cli_helpers import run_cli

TWO_MODES = """
    import jax.numpy as jnp
    from jax.scipy.special import logsumexp

    def logp(x):
        # 0.2 N(0, 0.3^2 I) + 0.8 N(6, I): the narrow mode has the higher density
        a = jnp.log(0.2) - 0.5 * jnp.sum(x ** 2) / 0.09 - x.shape[0] * jnp.log(0.3)
        b = jnp.log(0.8) - 0.5 * jnp.sum((x - 6.0) ** 2)
        return logsumexp(jnp.stack([a, b]))
"""


def test_separate_modes_found_by_the_warm_up_make_the_run_unreliable(tmp_path, capsys):
    model = tmp_path / "two_modes.py"
    model.write_text(textwrap.dedent(TWO_MODES))
    code, out, err = run_cli(
        ["sample", "--model", f"{model}:logp", "--dim", "2", "--particles", "400",
         "--steps", "300"],
        capsys,
    )
    assert code == 1, out + err
    lines = [x for x in out.splitlines() if "UNRELIABLE: the warm-up reported" in x]
    assert lines and "2 separate modes" in lines[0], out
    assert "reliability checks passed" not in out
