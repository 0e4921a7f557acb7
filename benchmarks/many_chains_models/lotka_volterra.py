"""posteriordb's hudson_lynx_hare-lotka_volterra (float64, d = 8).

    du/dt = (alpha - beta v) u,  dv/dt = (-gamma + delta u) v   (u: hare, v: lynx)
    theta = (alpha, beta, gamma, delta) > 0:  alpha, gamma ~ N(1, 0.5);
                                               beta, delta ~ N(0.05, 0.05)
    z_init ~ LogNormal(log 10, 1),  sigma ~ LogNormal(-1, 1)
    y_init[k] ~ LogNormal(log z_init[k], sigma[k]),
    y[n, k] ~ LogNormal(log z(t_n)[k], sigma[k]),  t_n = 1, ..., 20 (years after 1900)

x = log(alpha, beta, gamma, delta, z_init[0], z_init[1], sigma[0], sigma[1]); the
density carries the Jacobian (+ sum(x)). The ODE is integrated by fixed-step RK4
(STEPS_PER_YEAR steps a year, lax.scan) in the log populations, d log u / dt =
alpha - beta v, d log v / dt = -gamma + delta u: the same ODE, positive populations
under any step. Data: Hudson's Bay Company pelts (thousands), 1900-1920.
"""

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402

HARE = [30.0, 47.2, 70.2, 77.4, 36.3, 20.6, 18.1, 21.4, 22.0, 25.4, 27.1,
        40.3, 57.0, 76.6, 52.3, 19.5, 11.2, 7.6, 14.6, 16.2, 24.7]  # fmt: skip
LYNX = [4.0, 6.1, 9.8, 35.2, 59.4, 41.7, 19.0, 13.0, 8.3, 9.1, 7.4,
        8.0, 12.3, 19.5, 45.7, 51.1, 29.7, 15.8, 9.7, 10.1, 8.6]  # fmt: skip
LOG_Y = jnp.log(jnp.array([HARE, LYNX]).T)  # (21, 2): year 1900 is y_init
STEPS_PER_YEAR = 10  # log-population error < 4e-6 against solve_ivp at the mean
DT = 1.0 / STEPS_PER_YEAR


def log_trajectory(theta, log_z0):
    """log (u, v) at t = 1, ..., 20: (20, 2)."""
    alpha, beta, gamma, delta = theta

    def rhs(s):
        u, v = jnp.exp(s[0]), jnp.exp(s[1])
        return jnp.stack([alpha - beta * v, -gamma + delta * u])

    def rk4(s, _):
        k1 = rhs(s)
        k2 = rhs(s + 0.5 * DT * k1)
        k3 = rhs(s + 0.5 * DT * k2)
        k4 = rhs(s + DT * k3)
        return s + DT / 6.0 * (k1 + 2.0 * k2 + 2.0 * k3 + k4), None

    def year(s, _):
        s, _ = jax.lax.scan(rk4, s, None, length=STEPS_PER_YEAR)
        return s, s

    _, out = jax.lax.scan(year, log_z0, None, length=LOG_Y.shape[0] - 1)
    return out


def _lognormal(log_y, mu, sigma):  # log LogNormal(y; mu, sigma) + log y
    return -jnp.log(sigma) - 0.5 * ((log_y - mu) / sigma) ** 2


def logp(x):
    theta, log_z0, log_sigma = jnp.exp(x[:4]), x[4:6], x[6:8]
    sigma = jnp.exp(log_sigma)
    lp = -0.5 * jnp.sum(((theta[jnp.array([0, 2])] - 1.0) / 0.5) ** 2)
    lp += -0.5 * jnp.sum(((theta[jnp.array([1, 3])] - 0.05) / 0.05) ** 2)
    lp += jnp.sum(_lognormal(log_sigma, -1.0, 1.0))  # sigma ~ LogNormal(-1, 1)
    lp += jnp.sum(_lognormal(log_z0, jnp.log(10.0), 1.0))  # z_init ~ LogN(log 10, 1)
    lp += jnp.sum(_lognormal(LOG_Y[0], log_z0, sigma))
    lp += jnp.sum(_lognormal(LOG_Y[1:], log_trajectory(theta, log_z0), sigma))
    return lp + jnp.sum(x)  # Jacobian of the exp transform
