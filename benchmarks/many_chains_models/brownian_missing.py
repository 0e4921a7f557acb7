"""Inference Gym's BrownianMotion with missing middle observations (float64, d = 32).

    innov ~ LogNormal(0, 2),  obs ~ LogNormal(0, 2)
    x_0 ~ N(0, innov),  x_t ~ N(x_{t-1}, innov),  t = 1, ..., 29
    y_t ~ N(x_t, obs) observed for t < 10 and t >= 20 (t = 10, ..., 19 missing)

x = (x_0, ..., x_29, log innov, log obs). A LogNormal(0, 2) scale is N(0, 2) on its
log, Jacobian included. The data: numpy.random.default_rng(20240), a path
x = cumsum(0.1 z), y = x + 0.15 z' (innov 0.1, obs 0.15), y rounded to 4 digits.
"""

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402

Y_OBSERVED = jnp.array([
    0.0561, 0.0315, -0.477, -0.054, 0.1304, -0.1743, 0.1568, -0.1525, -0.1457,
    -0.1249,  # t = 0, ..., 9
    -0.7419, -0.8188, -1.1479, -1.04, -1.0995, -0.8373, -0.6416, -0.7301, -0.804,
    -0.6676,  # t = 20, ..., 29
])  # fmt: skip
OBSERVED = jnp.concatenate([jnp.arange(10), jnp.arange(20, 30)])  # t of Y_OBSERVED
NUM_STEPS = 30


def logp(x):
    locs, log_innov, log_obs = x[:NUM_STEPS], x[NUM_STEPS], x[NUM_STEPS + 1]
    lp = -0.5 * (log_innov / 2.0) ** 2 - 0.5 * (log_obs / 2.0) ** 2  # the two priors
    steps = jnp.diff(locs, prepend=0.0)  # x_0 - 0, x_1 - x_0, ...
    lp += -0.5 * jnp.sum(steps**2) * jnp.exp(-2 * log_innov) - NUM_STEPS * log_innov
    resid = Y_OBSERVED - locs[OBSERVED]
    lp += -0.5 * jnp.sum(resid**2) * jnp.exp(-2 * log_obs) - resid.size * log_obs
    return lp
