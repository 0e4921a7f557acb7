"""What the CLI tests share: running ``cenlmc-jax`` in-process, or in a child process
that a test can send signals to."""

import os
import subprocess
import sys
import textwrap

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


def start_cli(args, extra_code=""):
    """``cenlmc-jax ARGS`` in a child Python (stdout and stderr piped, text), with
    SIGINT as a terminal gives it (Python's KeyboardInterrupt handler): a test run
    launched in the background by a non-interactive shell inherits SIGINT ignored,
    and Python then keeps it ignored in the child. ``extra_code`` runs first."""
    code = textwrap.dedent(
        f"""
        import signal, sys
        signal.signal(signal.SIGINT, signal.default_int_handler)
        {extra_code}
        from cenlmc_jax._console import main
        sys.argv = ["cenlmc-jax"] + {list(map(str, args))!r}
        sys.exit(main())
        """
    )
    env = dict(os.environ, PYTHONUNBUFFERED="1", JAX_PLATFORMS="cpu")
    return subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
