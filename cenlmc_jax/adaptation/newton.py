"""Newton's method for the Laplace start of ``cj.langevin_warmup`` (issue 29).

The Laplace start needs the mode and the Hessian there. L-BFGS finds the mode with
gradients only, one after another: 363 iterations on a rotated 100-d Gaussian of
condition 10⁴, three quarters of the whole warm-up's sequential gradients. The warm-up
takes the Hessian at the mode anyway (``d`` Hessian-vector products in one batched
pass, whose depth is that of a gradient), so Newton's method costs one such pass per
iteration and converges in one iteration on a Gaussian and in a handful on a
log-concave posterior. Minimising ``f = −log π`` from a start ``x``:

    g = ∇f(x),  F = ∇²f(x) = V diag(λ) Vᵀ,
    p = −V diag(1/|λ|₊) Vᵀ g         (|λ|₊ = max(|λ|, 10⁻¹⁰ max|λ|): saddle-free
                                      Newton, a descent direction where F is
                                      indefinite; Dauphin et al. 2014)
    δ = −gᵀp                          (the Newton decrement: f − f* ≈ δ/2 near a
                                      minimum)
    x ← x + t p,  t the largest of 1, 1/2, ..., 2^−(T−1) with
    f(x + t p) <= f(x) − 10⁻⁴ t δ     (Armijo; all ``T`` trial points evaluated in
                                      one batch: one value pass, not ``T``)

until ``δ <= NEWTON_DECREMENT_MAX`` with ``F`` positive definite (the mode within 0.1
posterior sd; the caller then takes the final Newton step, which is free), or the line
search finds no decrease (``converged`` then says whether the point passes the same
test), or ``max_steps``.

Several starts run side by side (``vmap``): the best particle first, then dispersed
ones (the mode search of issue 28: chains that all start in a local mode agree there).
The loop ends when every start is done, or when the first is done and the others
have had ``probe_steps`` iterations (a probe that has not converged by then is
dropped, as the L-BFGS probes were). Sequential cost: one gradient-and-Hessian pass
and one batched value pass per iteration, counted as two gradients.
"""

from __future__ import annotations

from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from cenlmc_jax.ensemble.lmc import gradient_fn

__all__ = ["NewtonResult", "newton_modes", "LINE_SEARCH_POINTS"]

#: Trial step lengths ``1, 1/2, ..., 2^−(T−1)`` of the batched line search.
LINE_SEARCH_POINTS = 24
#: Armijo's sufficient-decrease constant.
ARMIJO = 1e-4


class NewtonResult(NamedTuple):
    """Per start (leading axis ``K``): ``f_star`` (``f`` at ``position``),
    ``position``, ``decrement`` (``δ`` there), ``converged`` (``δ <=`` the tolerance
    and ``F`` positive definite), and ``num_steps`` (the loop's iterations, shared).
    """

    f_star: jax.Array
    position: jax.Array
    decrement: jax.Array
    converged: jax.Array
    num_steps: jax.Array


def _direction(g, f_hess):
    """``(p, δ, positive definite)`` of saddle-free Newton (module docstring)."""
    lam, vec = jnp.linalg.eigh(0.5 * (f_hess + f_hess.T))
    top = jnp.max(jnp.abs(lam))
    floor = jnp.maximum(jnp.abs(lam), 1e-10 * top)
    coef = (vec.T @ g) / floor
    p = -(vec @ coef)
    delta = jnp.sum((vec.T @ g) * coef)
    return p, delta, jnp.all(lam > 0) & (top > 0)


@partial(
    jax.jit,
    static_argnames=(
        "logdensity_fn",
        "grad_fn",
        "grad_mode",
        "max_steps",
        "probe_steps",
    ),
)
def _newton(
    x0, tol, logdensity_fn, grad_fn, grad_mode, max_steps, probe_steps
) -> NewtonResult:
    grad = gradient_fn(logdensity_fn, grad_fn, grad_mode)

    def f(x):
        v = -logdensity_fn(x)
        return jnp.where(jnp.isfinite(v), v, jnp.inf)

    def derivatives(x):
        # ∇²log π and ∇log π from one forward-over-reverse pass
        hess, g = jax.jacfwd(lambda z: (grad(z), grad(z)), has_aux=True)(x)
        return -g, -hess

    steps = 2.0 ** -jnp.arange(LINE_SEARCH_POINTS, dtype=x0.dtype)

    def one(x, fx, done):
        g, f_hess = derivatives(x)
        p, delta, pd = _direction(g, f_hess)
        finite = jnp.isfinite(delta) & jnp.all(jnp.isfinite(p))
        stop = done | ~finite | (pd & (delta <= tol))
        trial = jax.vmap(lambda t: f(x + t * p))(steps)
        ok = trial <= fx - ARMIJO * steps * delta
        first = jnp.argmax(ok)
        moved = ~stop & jnp.any(ok)
        x_new = jnp.where(moved, x + steps[first] * p, x)
        f_new = jnp.where(moved, trial[first], fx)
        # done: converged, stuck (no decrease), or non-finite
        return x_new, f_new, stop | ~moved, delta, pd

    def cond(c):
        it, _, _, done, _, _ = c
        return (it < max_steps) & ~jnp.all(done) & ~(done[0] & (it >= probe_steps))

    def body(c):
        it, x, fx, done, delta, pd = c
        x, fx, now, d_new, pd_new = jax.vmap(one)(x, fx, done)
        # δ and definiteness of the point each start ends at (kept once done)
        delta = jnp.where(done, delta, d_new)
        pd = jnp.where(done, pd, pd_new)
        return it + 1, x, fx, done | now, delta, pd

    k = x0.shape[0]
    init = (
        jnp.asarray(0),
        x0,
        jax.vmap(f)(x0),
        jnp.zeros(k, bool),
        jnp.full(k, jnp.inf, x0.dtype),
        jnp.zeros(k, bool),
    )
    it, x, fx, done, delta, pd = lax.while_loop(cond, body, init)
    # a start that moved on its last iteration has δ of the point before; the caller
    # recomputes the Hessian at the chosen point anyway
    return NewtonResult(fx, x, delta, done & pd & (delta <= tol), it)


def newton_modes(
    logdensity_fn,
    starts,
    *,
    tol,
    grad_fn=None,
    grad_mode="auto",
    max_steps=50,
    probe_steps=20,
) -> NewtonResult:
    """Newton's method from each row of ``starts`` ``(K, d)`` side by side (module
    docstring); ``starts[0]`` is the main search, the others probes.
    """
    return _newton(
        starts,
        jnp.asarray(tol, starts.dtype),
        logdensity_fn,
        grad_fn,
        grad_mode,
        int(max_steps),
        int(probe_steps),
    )
