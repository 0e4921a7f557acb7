"""``python -m cenlmc_jax.cli``: the ``cenlmc-jax`` command
(:func:`cenlmc_jax.cli.main`).
"""

import sys

from cenlmc_jax.cli import main

if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
