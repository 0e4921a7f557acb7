"""Rasch item-response model, 448 persons x 50 items, hierarchical item scale
(float64, d = 500).

    y_pi ~ Bernoulli(logistic(theta_p - b_i)),      p = 1..P = 448, i = 1..I = 50
    theta_p ~ N(0, 1)                                (abilities; fixes the scale)
    b_i ~ N(mu_b, sigma_b^2)                        (item difficulties, centred)
    mu_b ~ N(0, 5^2),  sigma_b ~ HalfNormal(2)

Unconstrained coordinates x = (mu_b, log sigma_b, b_1..b_I, theta_1..theta_P),
d = 2 + 50 + 448 = 500; the density carries log sigma_b's Jacobian (+ log sigma_b).
Every person answers every item (22,400 responses, 448 an item), so each b_i is
well identified by its data and the centred form is the natural one: the non-centred
b_i = mu_b + sigma_b z_i ties every z_i to (mu_b, sigma_b) (a first version of this
file had it; BlackJAX NUTS's reference then took 15 minutes, the warm-up of ours did
not settle).

Data: numpy default_rng(4821) draws theta_p ~ N(0, 1), b_i ~ N(0.3, 1.2^2), then
the responses.

``derived(x)`` maps draws x (..., d) to the named quantities the benchmark checks
(mu_b, sigma_b, theta_1, theta_2, b_1).
"""

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

P, I = 448, 50  # noqa: E741
DIM = 2 + I + P


def _simulate(seed=4821):
    rng = np.random.default_rng(seed)
    theta = rng.normal(size=P)
    b = 0.3 + 1.2 * rng.normal(size=I)
    prob = 1.0 / (1.0 + np.exp(-(theta[:, None] - b[None, :])))
    return (rng.uniform(size=(P, I)) < prob).astype(np.float64)


Y = jnp.asarray(_simulate())


def logp(x):
    mu_b, log_sigma_b = x[0], x[1]
    b, theta = x[2 : 2 + I], x[2 + I :]
    sigma_b = jnp.exp(log_sigma_b)
    eta = theta[:, None] - b[None, :]
    # Bernoulli-logit: y eta - log(1 + e^eta)
    loglik = jnp.sum(Y * eta - jax.nn.softplus(eta))
    prior = (
        -0.5 * (mu_b / 5.0) ** 2
        - 0.5 * (sigma_b / 2.0) ** 2
        + log_sigma_b
        - 0.5 * jnp.sum(((b - mu_b) / sigma_b) ** 2)
        - I * log_sigma_b
        - 0.5 * jnp.sum(theta**2)
    )
    return loglik + prior


def derived(x):
    """Named quantities of draws x (..., d): a dict of arrays (...,)."""
    x = np.asarray(x)
    sigma_b = np.exp(x[..., 1])
    return dict(
        mu_b=x[..., 0],
        sigma_b=sigma_b,
        theta_1=x[..., 2 + I],
        theta_2=x[..., 3 + I],
        b_1=x[..., 2],
    )


#: coordinates the CLI's summary reports, by name (index into x)
COORDS = {"mu_b": 0, "log sigma_b": 1, "b_1": 2, "theta_1": 2 + I, "theta_2": 3 + I}
