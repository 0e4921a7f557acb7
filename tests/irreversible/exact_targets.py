"""Targets with exact draws that the HMC and AutoStep HMC tests share: a banana and
Neal's funnel (d = 3), each with its log density and a function drawing from it."""

import jax
import jax.numpy as jnp


def banana(x):
    # x0 ~ N(0, 10²), x1 | x0 ~ N(0.03 (x0² - 100), 1): E x0² = 100, E x1² = 19
    return -0.5 * (x[0] / 10.0) ** 2 - 0.5 * (x[1] - 0.03 * (x[0] ** 2 - 100)) ** 2


def banana_draws(key, n):
    k0, k1 = jax.random.split(key)
    a = 10.0 * jax.random.normal(k0, (n,), jnp.float64)
    return jnp.stack([a, 0.03 * (a**2 - 100) + jax.random.normal(k1, (n,))], 1)


def funnel(x):
    # Neal's funnel, d = 3: v ~ N(0, 3²), x_i | v ~ N(0, e^v)
    v, z = x[0], x[1:]
    return -0.5 * (v / 3.0) ** 2 - 0.5 * jnp.sum(z**2) * jnp.exp(-v) - v * z.size / 2


def funnel_draws(key, n):
    k0, k1 = jax.random.split(key)
    v = 3.0 * jax.random.normal(k0, (n,), jnp.float64)
    return jnp.concatenate(
        [v[:, None], jnp.exp(v / 2)[:, None] * jax.random.normal(k1, (n, 2))], 1
    )
