"""Eight schools, centred (float64, d = 10).

    mu ~ N(0, 5),  tau ~ half-Cauchy(0, 5),
    theta_j ~ N(mu, tau),  y_j ~ N(theta_j, sigma_j),  j = 1, ..., 8

x = (mu, log tau, theta_1, ..., theta_8); the density carries the Jacobian of
tau = exp(x[1]) (+ x[1]). The centred form has a funnel in (log tau, theta).
"""

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402

Y = jnp.array([28.0, 8.0, -3.0, 7.0, -1.0, 1.0, 18.0, 12.0])
SIGMA = jnp.array([15.0, 10.0, 16.0, 11.0, 9.0, 11.0, 10.0, 18.0])


def logp(x):
    mu, log_tau, theta = x[0], x[1], x[2:]
    tau = jnp.exp(log_tau)
    lp = -0.5 * (mu / 5.0) ** 2  # mu ~ N(0, 5)
    lp += -jnp.log1p((tau / 5.0) ** 2) + log_tau  # half-Cauchy(0, 5) + Jacobian
    # theta_j ~ N(mu, tau)
    lp += jnp.sum(-0.5 * ((theta - mu) / tau) ** 2) - 8 * log_tau
    lp += jnp.sum(-0.5 * ((Y - theta) / SIGMA) ** 2)  # y_j ~ N(theta_j, sigma_j)
    return lp
