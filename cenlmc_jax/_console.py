"""The ``cenlmc-jax`` console script's entry point.

It imports the command line (:mod:`cenlmc_jax.cli`, which imports JAX: seconds on a
cold or busy machine) inside a Ctrl-C guard, so an interrupt during that import ends
the command with exit status 130 and one line, as an interrupt during the job does,
instead of a traceback.
"""

from __future__ import annotations

import os
import sys

EXIT_INTERRUPTED = 130  # cenlmc_jax.cli.verdict.EXIT_INTERRUPTED (not imported yet)

try:
    from cenlmc_jax.cli import main as cli_main
except KeyboardInterrupt:
    print("cenlmc-jax: interrupted while starting; nothing ran", file=sys.stderr)
    sys.stderr.flush()
    os._exit(EXIT_INTERRUPTED)  # a half-imported JAX: no Python shutdown


def main() -> int:
    """Run ``cenlmc-jax`` (:func:`cenlmc_jax.cli.main`) on ``sys.argv``.

    Returns:
      The command's exit status.
    """
    return cli_main()
