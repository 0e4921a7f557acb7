"""``cenlmc-jax`` with a quarter (or ``FRAC``) of the superchains started at the warm-up
ensemble's highest-log-density particles: an experiment, not a feature (session 58).

A funnel's neck is a region of high density that the warm-up's ensemble fills too
thinly (centred eight schools: 1.2-1.6 % of the particles below log τ = -2 against
2.8 % of the posterior). ``cj.langevin_warmup`` starts every superchain at a particle
pushed out 1.2x from the ensemble's mean (``nested.superchain_starts``), away from the
density's peak. Starting some superchains inside the neck lets nested R-hat compare
chains that start there with chains that start outside it.
``bench_many_chains.py --neck-starts FRAC`` runs the CLI through this script.

    python benchmarks/neck_starts_cli.py FRAC sample --model ... (the CLI's arguments)
"""

from __future__ import annotations

import sys

import jax
import jax.numpy as jnp
import numpy as np

import cenlmc_jax.diagnostics.nested as nested
from cenlmc_jax import cli

_DEFAULT = nested.superchain_starts


def neck_starts(frac: float):
    """``nested.superchain_starts`` with its first ``frac`` of the superchains moved to
    the particles of the highest log density (not pushed out)."""

    def starts(rng_key, positions, superchain_size, overdispersion=1.2, **kw):
        s = _DEFAULT(rng_key, positions, superchain_size, overdispersion, **kw)
        s = np.array(s)
        logdensity_fn = kw.get("logdensity_fn")
        if logdensity_fn is None:
            return jnp.asarray(s)
        x = np.asarray(positions)
        lp = np.asarray(jax.vmap(logdensity_fn)(jnp.asarray(x)))
        m = superchain_size
        for j, i in enumerate(np.argsort(-lp)[: int(frac * (s.shape[0] // m))]):
            s[j * m : (j + 1) * m] = x[i]
        return jnp.asarray(s)

    return starts


if __name__ == "__main__":
    nested.superchain_starts = neck_starts(float(sys.argv[1]))
    sys.exit(cli.main(sys.argv[2:]))
