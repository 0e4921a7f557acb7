"""Neal's funnel, centred (float64, d = 10).

    v ~ N(0, 3^2),  x_i | v ~ N(0, e^v) (variance e^v), i = 1, ..., 9

x = (v, x_1, ..., x_9). Exact: mean v = 0, sd v = 3; mean x_i = 0,
sd x_i = sqrt(E[e^v]) = e^(9/4) = 9.4877.
"""

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402


def logp(x):
    v, rest = x[0], x[1:]
    log_prior_v = -0.5 * (v / 3.0) ** 2
    return log_prior_v - 0.5 * jnp.sum(rest**2) * jnp.exp(-v) - 0.5 * rest.size * v
