"""posteriordb earnings-earn_height as a user's model file, on Stan's unconstrained
scale.

    earn ~ N(beta[1] + beta[2] height, sigma),  flat priors,  sigma > 0
    (earnings in dollars).

x = (beta[1], beta[2], log sigma); the log density carries the Jacobian of sigma =
exp(x[2]) (+ x[2]). Run (data from make_data.py: columns earn, height):

    cenlmc-jax sample --model examples/posteriordb/earnings.py:logp --data earnings.csv
    --dim 3 --sampler lmc --trace
"""

import jax.numpy as jnp


def logp(x, data):
    beta1, beta2, log_sigma = x[0], x[1], x[2]
    resid = data["earn"] - (beta1 + beta2 * data["height"])
    loglik = jnp.sum(-0.5 * (resid * jnp.exp(-log_sigma)) ** 2 - log_sigma)
    return loglik + log_sigma  # + log |d sigma / d log sigma|
