"""Two well-separated modes (float64, d = 2): 1/2 N((-8, 0), I) + 1/2 N((8, 0), I).

Exact: mean (0, 0); sd x0 = sqrt(1 + 8^2) = sqrt(65) = 8.0623, sd x1 = 1. A warm-up
that settles around one mode (16 sds from the other) reports mean x0 = -8 or 8.
"""

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402

SHIFT = 8.0


def logp(x):
    left = -0.5 * ((x[0] + SHIFT) ** 2 + x[1] ** 2)
    right = -0.5 * ((x[0] - SHIFT) ** 2 + x[1] ** 2)
    return jnp.logaddexp(left, right)
