"""Inference Gym's BrownianMotionMissingMiddleObservations: the scales known (d = 30).

    x_0 ~ N(0, 0.1),  x_t ~ N(x_{t-1}, 0.1),  t = 1, ..., 29
    y_t ~ N(x_t, 0.15) observed for t < 10 and t >= 20 (t = 10, ..., 19 missing)

The posterior of x is Gaussian (its moments exact by linear algebra:
references.py). The data are brownian_missing.py's (copied) (innov 0.1, obs 0.15, the
values that generated them); brownian_missing.py is the same model with both scales
unknown (d = 32), whose posterior has a funnel.
"""

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402

INNOV, OBS = 0.1, 0.15
# brownian_missing.py's data (a model file the CLI loads stands alone)
Y_OBSERVED = jnp.array([
    0.0561, 0.0315, -0.477, -0.054, 0.1304, -0.1743, 0.1568, -0.1525, -0.1457,
    -0.1249,  # t = 0, ..., 9
    -0.7419, -0.8188, -1.1479, -1.04, -1.0995, -0.8373, -0.6416, -0.7301, -0.804,
    -0.6676,  # t = 20, ..., 29
])  # fmt: skip
OBSERVED = jnp.concatenate([jnp.arange(10), jnp.arange(20, 30)])  # t of Y_OBSERVED
NUM_STEPS = 30


def logp(x):
    steps = jnp.diff(x, prepend=0.0)  # x_0 - 0, x_1 - x_0, ...
    resid = Y_OBSERVED - x[OBSERVED]
    return -0.5 * jnp.sum(steps**2) / INNOV**2 - 0.5 * jnp.sum(resid**2) / OBS**2
