"""Stochastic volatility, 100 daily returns, non-centred (float64, d = 103).

    y_t ~ N(0, exp(h_t)),                               t = 1, ..., T = 100
    h_1 = mu + sigma / sqrt(1 - phi^2) z_1,             (stationary start)
    h_t = mu + phi (h_{t-1} - mu) + sigma z_t,          z_t ~ N(0, 1)
    mu ~ N(0, 10^2),  (phi + 1) / 2 ~ Beta(5, 1.5),  sigma ~ HalfNormal(1)

(the priors of the R package stochvol's defaults). Unconstrained coordinates
x = (mu, u, s, z_1, ..., z_T) with phi = tanh(u), sigma = exp(s); the density carries
the Jacobians: log(1 - phi^2) for u (so phi's Beta prior becomes
5 log(1 + phi) + 1.5 log(1 - phi) up to a constant, written with softplus for
large |u|) and s for sigma. Non-centred: the innovations z_t are the coordinates, h_t
is computed from them by lax.scan.

Data: numpy default_rng(20261207) simulates T = 100 returns (in percent) from
mu = 0, phi = 0.95, sigma = 0.25.

``derived(x)`` maps draws x (..., d) to the named quantities (mu, phi, sigma, h_1,
h_50, h_100) that the benchmark checks.
"""

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402

T = 100
DIM = T + 3
TRUE = dict(mu=0.0, phi=0.95, sigma=0.25)


def _simulate(seed=20261207):
    rng = np.random.default_rng(seed)
    mu, phi, sigma = TRUE["mu"], TRUE["phi"], TRUE["sigma"]
    h = np.empty(T)
    h[0] = mu + sigma / np.sqrt(1.0 - phi**2) * rng.normal()
    for t in range(1, T):
        h[t] = mu + phi * (h[t - 1] - mu) + sigma * rng.normal()
    return rng.normal(size=T) * np.exp(h / 2.0)


Y = jnp.asarray(_simulate())


def log_vol(mu, phi, sigma, z):
    """h (T,) from the innovations z (T,) by lax.scan."""
    h1 = mu + sigma * z[0] / jnp.sqrt(1.0 - phi**2)

    def step(h_prev, z_t):
        h_t = mu + phi * (h_prev - mu) + sigma * z_t
        return h_t, h_t

    _, rest = lax.scan(step, h1, z[1:])
    return jnp.concatenate([h1[None], rest])


def logp(x):
    mu, u, s, z = x[0], x[1], x[2], x[3:]
    phi, sigma = jnp.tanh(u), jnp.exp(s)
    # log(1 + tanh u) = log 2 - softplus(-2u); log(1 - tanh u) = log 2 - softplus(2u)
    log_1p_phi = -jax.nn.softplus(-2.0 * u)
    log_1m_phi = -jax.nn.softplus(2.0 * u)
    lp = -0.5 * (mu / 10.0) ** 2
    lp += 5.0 * log_1p_phi + 1.5 * log_1m_phi  # Beta(5, 1.5) prior + Jacobian
    lp += -0.5 * sigma**2 + s  # HalfNormal(1) + Jacobian
    lp += -0.5 * jnp.sum(z**2)
    h = log_vol(mu, phi, sigma, z)
    return lp + jnp.sum(-0.5 * h - 0.5 * Y**2 * jnp.exp(-h))


def derived(x):
    """Named quantities of draws x (..., d): a dict of arrays (...,)."""
    x = jnp.asarray(x)
    flat = x.reshape(-1, DIM)
    mu, phi, sigma = flat[:, 0], jnp.tanh(flat[:, 1]), jnp.exp(flat[:, 2])
    h = jax.vmap(log_vol)(mu, phi, sigma, flat[:, 3:])
    out = dict(mu=mu, phi=phi, sigma=sigma, h_1=h[:, 0], h_50=h[:, 49], h_100=h[:, -1])
    return {k: np.asarray(v).reshape(x.shape[:-1]) for k, v in out.items()}


#: coordinates the CLI's summary reports, by name (index into x)
COORDS = {"mu": 0, "atanh(phi)": 1, "log sigma": 2, "z_1": 3, "z_100": DIM - 1}
