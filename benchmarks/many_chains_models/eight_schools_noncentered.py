"""Eight schools, non-centred (float64, d = 10): the same posterior as
``eight_schools_centered.py``, written without its funnel.

    mu ~ N(0, 5),  tau ~ half-Cauchy(0, 5),  z_j ~ N(0, 1),
    theta_j = mu + tau z_j,  y_j ~ N(theta_j, sigma_j),  j = 1, ..., 8

x = (mu, log tau, z_1, ..., z_8); the density carries the Jacobian of tau = exp(x[1])
(+ x[1]). theta is a deterministic function of x, so the z_j are a priori independent
of tau: no neck as tau goes to 0 (what the run's neck check asks for when the centred
form fails it; docs/guide/reliability.md).
"""

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402

Y = jnp.array([28.0, 8.0, -3.0, 7.0, -1.0, 1.0, 18.0, 12.0])
SIGMA = jnp.array([15.0, 10.0, 16.0, 11.0, 9.0, 11.0, 10.0, 18.0])


def logp(x):
    mu, log_tau, z = x[0], x[1], x[2:]
    tau = jnp.exp(log_tau)
    lp = -0.5 * (mu / 5.0) ** 2  # mu ~ N(0, 5)
    lp += -jnp.log1p((tau / 5.0) ** 2) + log_tau  # half-Cauchy(0, 5) + Jacobian
    lp += jnp.sum(-0.5 * z**2)  # z_j ~ N(0, 1)
    theta = mu + tau * z
    lp += jnp.sum(-0.5 * ((Y - theta) / SIGMA) ** 2)  # y_j ~ N(theta_j, sigma_j)
    return lp
