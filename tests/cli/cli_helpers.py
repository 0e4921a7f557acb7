"""What the CLI tests share: running ``cenlmc-jax`` in-process."""

from cenlmc_jax import cli


def run_cli(args, capsys):
    """(exit status, stdout, stderr) of ``cenlmc-jax ARGS`` run in-process; argparse's
    own errors exit too."""
    try:
        code = cli.main([str(a) for a in args])
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err
