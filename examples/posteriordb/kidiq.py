"""posteriordb kidiq-kidscore_momiq as a user's model file, on Stan's unconstrained
scale.

    kid_score ~ N(beta[1] + beta[2] mom_iq, sigma),
    sigma ~ Cauchy(0, 2.5) on sigma > 0,  flat beta.

x = (beta[1], beta[2], log sigma); the log density carries the Jacobian of sigma =
exp(x[2]) (+ x[2]). Run (data from make_data.py: columns kid_score, mom_iq):

    cenlmc-jax sample --model examples/posteriordb/kidiq.py:logp --data kidiq.csv --dim
    3 --sampler lmc --trace
"""

import jax.numpy as jnp


def logp(x, data):
    beta1, beta2, log_sigma = x[0], x[1], x[2]
    sigma = jnp.exp(log_sigma)
    resid = data["kid_score"] - (beta1 + beta2 * data["mom_iq"])
    loglik = jnp.sum(-0.5 * (resid / sigma) ** 2 - log_sigma)
    log_prior = -jnp.log1p((sigma / 2.5) ** 2)  # half-Cauchy(0, 2.5), up to a constant
    return loglik + log_prior + log_sigma  # + log |d sigma / d log sigma|
