"""posteriordb garch-garch11 as a user's model file, on Stan's unconstrained scale.

    sigma[1] = sigma1,
    sigma[t]^2 = alpha0 + alpha1 (y[t-1] - mu)^2 + beta1 sigma[t-1]^2,
    y ~ N(mu, sigma);  alpha0 > 0,  0 < alpha1 < 1,  0 < beta1 < 1 - alpha1;
    flat priors on the constrained scale.

x = (mu, log alpha0, logit alpha1, logit(beta1 / (1 - alpha1))), Stan's transforms; the
log density carries their log-Jacobian: x[1] + log σ(x[2]) σ(-x[2]) + log (1 - alpha1)
σ(x[3]) σ(-x[3]). Run (data from make_data.py: arrays y (T,) and sigma1 ()):

    cenlmc-jax sample --model examples/posteriordb/garch11.py:logp --data garch11.npz
    --dim 4 --sampler lmc --trace
"""

import jax
import jax.numpy as jnp


def logp(x, data):
    y, sigma1 = data["y"], data["sigma1"]
    mu = x[0]
    alpha0 = jnp.exp(x[1])
    alpha1 = jax.nn.sigmoid(x[2])
    beta1 = (1 - alpha1) * jax.nn.sigmoid(x[3])
    log_jac = x[1] + jax.nn.log_sigmoid(x[2]) + jax.nn.log_sigmoid(-x[2])
    log_jac += jnp.log1p(-alpha1) + jax.nn.log_sigmoid(x[3]) + jax.nn.log_sigmoid(-x[3])

    def step(var_prev, y_prev):
        var = alpha0 + alpha1 * (y_prev - mu) ** 2 + beta1 * var_prev
        return var, var

    _, var = jax.lax.scan(step, sigma1**2, y[:-1])
    var = jnp.concatenate([jnp.reshape(sigma1**2, (1,)), var])
    loglik = jnp.sum(-0.5 * (y - mu) ** 2 / var - 0.5 * jnp.log(var))
    return loglik + log_jac
