"""Inference Gym's BrownianMotionMissingMiddleObservations: the scales known (d = 30).

    x_0 ~ N(0, 0.1),  x_t ~ N(x_{t-1}, 0.1),  t = 1, ..., 29
    y_t ~ N(x_t, 0.15) observed for t < 10 and t >= 20 (t = 10, ..., 19 missing)

The posterior of x is Gaussian (its moments exact by linear algebra:
references.py). The data are brownian_missing.py's (innov 0.1, obs 0.15, the
values that generated them); brownian_missing.py is the same model with both scales
unknown (d = 32), whose posterior has a funnel.
"""

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
from brownian_missing import NUM_STEPS, OBSERVED, Y_OBSERVED  # noqa: E402

INNOV, OBS = 0.1, 0.15


def logp(x):
    steps = jnp.diff(x, prepend=0.0)  # x_0 - 0, x_1 - x_0, ...
    resid = Y_OBSERVED - x[OBSERVED]
    return -0.5 * jnp.sum(steps**2) / INNOV**2 - 0.5 * jnp.sum(resid**2) / OBS**2


assert NUM_STEPS == 30
