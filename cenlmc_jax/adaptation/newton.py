"""Newton's method for the Laplace start of ``cj.langevin_warmup`` (issue 29).

The Laplace start needs the mode and the Hessian there. L-BFGS finds the mode with
gradients only, one after another: 363 iterations on a rotated 100-d Gaussian of
condition 10⁴, three quarters of the whole warm-up's sequential gradients. The warm-up
takes the Hessian at the mode anyway (``d`` Hessian-vector products in one batched
pass, whose depth is that of a gradient), so Newton's method costs one such pass per
iteration (with the value, from the same pass) and converges in one iteration on a
Gaussian and in a handful on a log-concave posterior. Minimising ``f = −log π`` from a
start ``x``:

    g = ∇f(x),  F = ∇²f(x) = V diag(λ) Vᵀ,
    p = −V diag(1/|λ|₊) Vᵀ g         (|λ|₊ = max(|λ|, 10⁻¹⁰ max|λ|): saddle-free
                                      Newton, a descent direction where F is
                                      indefinite; Dauphin et al. 2014)
    δ = −gᵀp                          (the Newton decrement: f − f* ≈ δ/2 near a
                                      minimum)
    x ← x + t p,  t the largest of 1, 1/2, ..., 2^−(T−1) with
    f(x + t p) <= f(x) − 10⁻⁴ t δ     (Armijo)

The first ``S = ONE_PASS_STEPS`` step lengths ``t = 1, 1/2, ..., 2^−(S−1)`` are tried
with the next iteration's derivatives at each of them, in one batched pass (the values
come with them; ``S`` Hessians per start, side by side, so the pass's depth is still
that of one gradient): far from a mode, where the full step fails Armijo, a halved
one usually passes, and the iteration costs one pass. Only where all ``S`` fail are the
shorter steps evaluated, all ``T − S`` in one batched value pass, and the derivatives
taken where each start lands (two more passes).

until ``δ <= NEWTON_DECREMENT_MAX`` with ``F`` positive definite (the mode within 0.1
posterior sd; the caller then takes the final Newton step, which is free), or the line
search finds no decrease (``converged`` then says whether the point passes the same
test), or ``max_steps``.

Several starts run side by side (``vmap``): the best particle first, then dispersed
ones (the mode search of issue 28: chains that all start in a local mode agree there).
The loop ends when every start is done, or when the first is done and the others
have had ``probe_steps`` iterations (a probe that has not converged by then is
dropped, as the L-BFGS probes were). ``num_steps`` counts the sequential passes
(each counted as a gradient): one at the start, then one per iteration, three where
some start needed the value search below ``2^−(S−1)``.
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
#: Step lengths ``1, 1/2, ..., 2^−(S−1)`` tried with their derivatives in one batched
#: pass per iteration (``S`` Hessians per start: the iteration costs one sequential
#: pass wherever one of them passes Armijo).
ONE_PASS_STEPS = 4
#: Armijo's sufficient-decrease constant.
ARMIJO = 1e-4


class NewtonResult(NamedTuple):
    """Per start (leading axis ``K``): ``f_star`` (``f`` at ``position``),
    ``position``, ``grad`` and ``hessian`` (of ``log π`` there: the Laplace start needs
    no pass of its own), ``decrement`` (``δ`` there), ``converged`` (``δ <=`` the
    tolerance and ``F`` positive definite), and ``num_steps`` (the loop's sequential
    passes, shared: module docstring).
    """

    f_star: jax.Array
    position: jax.Array
    grad: jax.Array
    hessian: jax.Array
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

    def one_pass(x):
        # f, ∇f and ∇²f at x from one forward-over-reverse pass
        hess, g = jax.jacfwd(lambda z: (grad(z), grad(z)), has_aux=True)(x)
        return f(x), -g, -hess

    passes = jax.vmap(one_pass)
    # the first ONE_PASS_STEPS step lengths 1, 1/2, ... with their derivatives in one
    # batched pass; the rest, where all of those fail Armijo, by the search below
    near = 2.0 ** -jnp.arange(ONE_PASS_STEPS, dtype=x0.dtype)
    steps = 2.0 ** -jnp.arange(ONE_PASS_STEPS, LINE_SEARCH_POINTS, dtype=x0.dtype)
    passes_near = jax.vmap(
        lambda xi, pi: jax.vmap(lambda t: one_pass(xi + t * pi))(near)
    )

    def search(args):
        # every one-pass step failed Armijo somewhere: the shorter steps in one
        # batched value pass, then the derivatives where each start lands (two
        # passes)
        x, fx, g, hess, p, delta, need = args
        trial = jax.vmap(lambda xi, pi: jax.vmap(lambda t: f(xi + t * pi))(steps))(x, p)
        ok = trial <= fx[:, None] - ARMIJO * steps[None, :] * delta[:, None]
        moved = need & jnp.any(ok, 1)
        t = steps[jnp.argmax(ok, 1)]
        xs = jnp.where(moved[:, None], x + t[:, None] * p, x)
        fs, gs, hs = passes(xs)
        return xs, fs, gs, hs, moved

    def check(g, hess, done, delta, pd):
        # the direction at each start's point and the convergence test there: a start
        # is done when converged or non-finite (δ and definiteness kept once done)
        p, d_new, pd_new = jax.vmap(_direction)(g, hess)
        finite = jnp.isfinite(d_new) & jnp.all(jnp.isfinite(p), 1)
        delta = jnp.where(done, delta, d_new)
        pd = jnp.where(done, pd, pd_new)
        done = done | ~finite | (pd_new & (d_new <= tol))
        return jnp.where(done[:, None], 0.0, p), done, delta, pd

    def cond(c):
        it, done = c[0], c[7]
        return (it < max_steps) & ~jnp.all(done) & ~(done[0] & (it >= probe_steps))

    def body(c):
        it, count, x, fx, g, hess, p, done, delta, pd = c
        fz, gz, hz = passes_near(x, p)
        ok = fz <= fx[:, None] - ARMIJO * near[None, :] * delta[:, None]
        full = ~done & jnp.any(ok, 1)
        i = jnp.argmax(ok, 1)  # the longest step that passes
        take = lambda a: jnp.take_along_axis(  # noqa: E731
            a, i.reshape((-1,) + (1,) * (a.ndim - 1)), 1
        )[:, 0]
        xz = x + near[i][:, None] * p
        fz, gz, hz = take(fz), take(gz), take(hz)
        need = ~done & ~full
        xs, fs, gs, hs, moved = lax.cond(
            jnp.any(need),
            search,
            lambda a: (a[0], a[1], a[2], a[3], jnp.zeros_like(a[6])),
            (x, fx, g, hess, p, delta, need),
        )

        def pick(a, b, c_):
            shape = (-1,) + (1,) * (a.ndim - 1)
            return jnp.where(
                full.reshape(shape), a, jnp.where(moved.reshape(shape), b, c_)
            )

        x, fx, g, hess = (
            pick(xz, xs, x),
            pick(fz, fs, fx),
            pick(gz, gs, g),
            pick(hz, hs, hess),
        )
        count = count + 1 + 2 * jnp.any(need)
        # a start the line search could not move is done where it is
        p, done, delta, pd = check(g, hess, done | (need & ~moved), delta, pd)
        return it + 1, count, x, fx, g, hess, p, done, delta, pd

    k = x0.shape[0]
    f0, g0, h0 = passes(x0)
    p0, done0, delta0, pd0 = check(
        g0, h0, jnp.zeros(k, bool), jnp.full(k, jnp.inf, x0.dtype), jnp.zeros(k, bool)
    )
    init = (jnp.asarray(0), jnp.asarray(1), x0, f0, g0, h0, p0, done0, delta0, pd0)
    it, count, x, fx, g, hess, p, done, delta, pd = lax.while_loop(cond, body, init)
    # δ and definiteness are those at each start's point once it is done
    return NewtonResult(fx, x, -g, -hess, delta, done & pd & (delta <= tol), count)


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
    """Newton's method from each row of ``starts`` side by side (module docstring).

    Args:
      logdensity_fn: ``x: (d,) -> log π(x)``.
      starts: ``(K, d)``; ``starts[0]`` is the main search, the others probes.
      tol: the Newton decrement ``δ = gᵀF⁻¹g`` at which a start is converged.
      grad_fn: as for ``cj.lmc`` (None: autodiff).
      grad_mode: as for ``cj.lmc``.
      max_steps: iterations at most.
      probe_steps: iterations the probes get once the main search is done.

    Returns:
      A :class:`NewtonResult`, one row per start.
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
