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

Compile time (issue 48). The loop runs in Python around two compiled programs, each
holding the model once: :func:`_derivatives` (``f``, ``∇f`` and ``∇²f`` at a fixed
number ``K·S`` of points: the starts, padded, or their ``S`` trial steps) and
:func:`_values` (``f`` at the ``K·(T − S)`` shorter steps); the direction, the
Armijo test and the bookkeeping are NumPy on the host. One ``lax.while_loop`` holding
the whole iteration inlined the model's Hessian three times (at the starts, at the
trial steps, where the search lands), each vmapped over points and tangents: on a
stochastic-volatility model whose recursion is a Python loop (``T = 100`` steps
unrolled) it compiled in 24-35x the gradient's time
(benchmarks/results/compile_scale.md).

The Hessian (:func:`hessian_method`): by autodiff (``jax.jacfwd`` of the gradient,
forward over reverse) where the log density is a small program, by central
differences of the gradient, ``∇²f e_i ≈ (∇f(x + h_i e_i) − ∇f(x − h_i e_i)) /
(2 h_i)`` with ``h_i = ε^{1/3} max(|x_i|, 1)`` (``ε`` the dtype's machine epsilon;
relative error about ``ε^{2/3}``: 4·10⁻¹¹ in float64), where it is large: a log
density of more than :data:`AUTODIFF_HESSIAN_MAX_EQUATIONS` jaxpr equations (an
unrolled loop), or one with a ``lax.scan`` or ``lax.while_loop``, whose forward over
reverse is a loop of tangents over the reverse loop (the stochastic-volatility model
with ``lax.scan`` at d = 100 and 500: :func:`_derivatives` by autodiff compiled in
4.2x and 4.4x the gradient's time, by differences in 2.2x and 2.5x; the Hessians
agree to 2·10⁻¹⁰ of the largest entry). XLA compiles a long unrolled chain of
scalar operations slowly and duplicates it into its fusions; a second-order program
of it is several times larger: on the Python-loop model a single Hessian-vector
product compiled in 4x the gradient's time, the Hessian as ``lax.map`` over them in
6x, ``jax.jacfwd`` of the gradient in 10x, while the differences need only the
gradient, vmapped: :func:`_derivatives` at
the 16 points of a pass in 1.5x (the median of three compilations of each).
"""

from __future__ import annotations

from functools import lru_cache, partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend import core as jax_core

from cenlmc_jax.gradients import modes
from cenlmc_jax.gradients.ensemble import gradient_fn

__all__ = [
    "NewtonResult",
    "newton_modes",
    "hessian_at",
    "hessian_method",
    "LINE_SEARCH_POINTS",
]

#: Trial step lengths ``1, 1/2, ..., 2^−(T−1)`` of the batched line search.
LINE_SEARCH_POINTS = 24
#: Step lengths ``1, 1/2, ..., 2^−(S−1)`` tried with their derivatives in one batched
#: pass per iteration (``S`` Hessians per start: the iteration costs one sequential
#: pass wherever one of them passes Armijo).
ONE_PASS_STEPS = 4
#: Armijo's sufficient-decrease constant.
ARMIJO = 1e-4
#: The Hessian by autodiff up to this many equations in the log density's jaxpr (a
#: loop's body counted once), by central differences of the gradient above
#: (:func:`hessian_method`; module docstring, "Compile time"). A vectorised model has
#: tens (the stochastic-volatility model of benchmarks/bench_compile_scale.py with
#: ``lax.scan``: 50); its recursion unrolled by a Python loop about 7 per step (735 at
#: T = 100).
AUTODIFF_HESSIAN_MAX_EQUATIONS = 400
#: Points per vmapped batch of the difference Hessian's gradient pass (``lax.map``
#: over batches: the memory of ``2d`` gradients per point stays bounded).
DIFFERENCE_CHUNK = 512


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
    """``(p, δ, positive definite)`` of saddle-free Newton (module docstring), per
    start: ``g`` ``(K, d)``, ``f_hess`` ``(K, d, d)``, float64 NumPy.
    """
    lam, vec = np.linalg.eigh(0.5 * (f_hess + np.swapaxes(f_hess, 1, 2)))
    top = np.max(np.abs(lam), 1)
    floor = np.maximum(np.abs(lam), 1e-10 * top[:, None])
    proj = np.einsum("kji,kj->ki", vec, g)
    with np.errstate(divide="ignore", invalid="ignore"):
        # a zero Hessian (a piecewise-linear density): a non-finite direction, which
        # ends the start
        coef = proj / floor
    p = -np.einsum("kij,kj->ki", vec, coef)
    delta = np.sum(proj * coef, 1)
    return p, delta, np.all(lam > 0, 1) & (top > 0)


def _count_equations(jaxpr) -> int:
    """Equations of a jaxpr, those of its sub-jaxprs (a loop's body, a branch)
    counted once each."""
    n = 0
    for eqn in jaxpr.eqns:
        n += 1
        for sub in jax_core.jaxprs_in_params(eqn.params):
            n += _count_equations(sub)
    return n


#: Primitives whose second derivative by autodiff compiles slowly: forward over
#: reverse of a loop is a loop of the tangents over the reverse loop (module
#: docstring, "Compile time").
LOOP_PRIMITIVES = ("scan", "while")


def _has_loop(jaxpr) -> bool:
    """Whether a jaxpr (or one of its sub-jaxprs) holds a ``lax.scan`` or
    ``lax.while_loop``."""
    return any(
        eqn.primitive.name in LOOP_PRIMITIVES
        or any(_has_loop(sub) for sub in jax_core.jaxprs_in_params(eqn.params))
        for eqn in jaxpr.eqns
    )


def hessian_method(logdensity_fn, x) -> str:
    """How :func:`newton_modes` and the Laplace start take the Hessian of
    ``logdensity_fn`` (module docstring, "Compile time").

    Args:
      logdensity_fn: ``x: (d,) -> log π(x)``.
      x: a point, ``(d,)`` (only its shape and dtype are used).

    Returns:
      ``"autodiff"`` (forward over reverse) where the log density's jaxpr has at most
      :data:`AUTODIFF_HESSIAN_MAX_EQUATIONS` equations and no loop
      (:data:`LOOP_PRIMITIVES`), ``"differences"`` (central differences of the
      gradient) otherwise.
    """
    return _method(logdensity_fn, tuple(jnp.shape(x)), jnp.result_type(x).name)


@lru_cache(maxsize=64)
def _method(logdensity_fn, shape, dtype) -> str:
    """:func:`hessian_method`, once per model and shape (a trace of the model: a
    second each for a Python loop of hundreds of steps)."""
    spec = jax.ShapeDtypeStruct(shape, jnp.dtype(dtype))
    jaxpr = jax.make_jaxpr(logdensity_fn)(spec).jaxpr
    small = _count_equations(jaxpr) <= AUTODIFF_HESSIAN_MAX_EQUATIONS
    return "autodiff" if small and not _has_loop(jaxpr) else "differences"


def _f(logdensity_fn, x):
    """``f = −log π`` at ``x``, ``+inf`` where it is not finite."""
    v = -logdensity_fn(x)
    return jnp.where(jnp.isfinite(v), v, jnp.inf)


_STATIC = ("logdensity_fn", "grad_fn", "grad_mode", "method")


@partial(jax.jit, static_argnames=_STATIC)
def _derivatives(points, logdensity_fn, grad_fn, grad_mode, method):
    """``(f, ∇f, ∇²f)`` of ``f = −log π`` at each row of ``points`` ``(P, d)``:
    ``(P,)``, ``(P, d)``, ``(P, d, d)``; the Hessian by ``method``
    (:func:`hessian_method`). One program for every pass of the search: the model's
    second-order pass appears in it once, not once per phase of an iteration.
    """
    grad = gradient_fn(logdensity_fn, grad_fn, grad_mode)
    if method == "autodiff":

        def one(x):
            # f, ∇f and ∇²f at x from one forward-over-reverse pass
            hess, g = jax.jacfwd(lambda z: (grad(z), grad(z)), has_aux=True)(x)
            return _f(logdensity_fn, x), -g, -hess

        return jax.vmap(one)(points)
    p, d = points.shape
    dt = points.dtype
    # central differences of the gradient: the value and the gradient at each point
    # and at its 2d neighbours x ± h_i e_i, in batches of one vmapped gradient pass;
    # row j of the pass is built inside it (no (P, 2d, d) array of neighbours)
    h = jnp.finfo(dt).eps ** (1.0 / 3.0) * jnp.maximum(jnp.abs(points), 1.0)
    h = (points + h) - points  # exactly representable steps
    rows = p * (2 * d + 1)
    chunk = min(rows, DIFFERENCE_CHUNK)

    if grad_fn is None:
        # the value and the gradient from one pass (one copy of the model)
        vg = modes.value_and_grad(logdensity_fn, grad_mode)
    else:
        vg = lambda x: (logdensity_fn(x), grad(x))  # noqa: E731

    def row(j):
        # rows 0..P-1: the points; then point k's neighbours, +h e_i for r = i < d,
        # −h e_i for r = d + i
        j = jnp.minimum(j, rows - 1)  # the padding repeats the last row
        k = jnp.where(j < p, j, (j - p) // (2 * d))
        r = (j - p) % (2 * d)
        i = r % d
        step = jnp.where(j < p, 0.0, jnp.where(r < d, 1.0, -1.0) * h[k, i])
        v, g = vg(points[k].at[i].add(step.astype(dt)))
        v = -jnp.asarray(v, dt)
        return jnp.where(jnp.isfinite(v), v, jnp.inf), g

    js = jnp.arange(-(-rows // chunk) * chunk).reshape(-1, chunk)
    v, g = lax.map(jax.vmap(row), js)
    v, g = v.reshape(-1)[:rows], g.reshape(-1, d)[:rows]
    up, down = g[p:].reshape(p, 2, d, d).transpose(1, 0, 2, 3)
    hess = (up - down) / (2.0 * h)[:, :, None]  # row i: ∂(∇ log π)/∂x_i
    hess = 0.5 * (hess + jnp.swapaxes(hess, 1, 2))
    return v[:p], -g[:p], -hess


@partial(jax.jit, static_argnames=("logdensity_fn",))
def _values(points, logdensity_fn):
    """``f = −log π`` at each row of ``points`` (``+inf`` where not finite)."""
    return jax.vmap(partial(_f, logdensity_fn))(points)


def hessian_at(logdensity_fn, x, *, grad_fn=None, grad_mode="auto"):
    """``∇² log π(x)`` and ``∇ log π(x)`` by :func:`hessian_method`'s method.

    Args:
      logdensity_fn: ``x: (d,) -> log π(x)``.
      x: the point, ``(d,)``.
      grad_fn: as for ``cj.lmc`` (None: autodiff).
      grad_mode: as for ``cj.lmc``.

    Returns:
      ``(hessian, grad)``: ``(d, d)`` and ``(d,)`` arrays of ``x``'s dtype.
    """
    x = jnp.asarray(x)
    method = hessian_method(logdensity_fn, x)
    _, g, hess = _derivatives(x[None], logdensity_fn, grad_fn, grad_mode, method)
    return -hess[0], -g[0]


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
    starts = jnp.asarray(starts)
    dt = starts.dtype
    k, d = starts.shape
    tol, max_steps, probe_steps = float(tol), int(max_steps), int(probe_steps)
    method = hessian_method(logdensity_fn, np.zeros((d,), dt))  # shape, dtype
    near = 2.0 ** -np.arange(ONE_PASS_STEPS, dtype=np.float64)
    steps = 2.0 ** -np.arange(ONE_PASS_STEPS, LINE_SEARCH_POINTS, dtype=np.float64)

    def passes(points):
        # the derivatives at (K, S, d) points, or at K points padded to K·S: one
        # compiled program for every pass
        flat = points.reshape(-1, d)
        rows = flat.shape[0]
        if rows < k * ONE_PASS_STEPS:
            flat = np.concatenate(
                [flat, np.broadcast_to(flat[:1], (k * ONE_PASS_STEPS - rows, d))]
            )
        out = _derivatives(
            jnp.asarray(flat, dt), logdensity_fn, grad_fn, grad_mode, method
        )
        fs, gs, hs = (np.asarray(a, np.float64)[:rows] for a in out)
        return (
            fs.reshape(points.shape[:-1]),
            gs.reshape(points.shape),
            hs.reshape(points.shape + (d,)),
        )

    def check(g, hess, done, delta, pd):
        # the direction at each start's point and the convergence test there: a start
        # is done when converged or non-finite (δ and definiteness kept once done)
        p, d_new, pd_new = _direction(g, hess)
        finite = np.isfinite(d_new) & np.all(np.isfinite(p), 1)
        delta = np.where(done, delta, d_new)
        pd = np.where(done, pd, pd_new)
        done = done | ~finite | (pd_new & (d_new <= tol))
        return np.where(done[:, None], 0.0, p), done, delta, pd

    x = np.asarray(starts, np.float64)
    fx, g, hess = passes(x)
    count = 1
    p, done, delta, pd = check(
        g, hess, np.zeros(k, bool), np.full(k, np.inf), np.zeros(k, bool)
    )
    it = 0
    with np.errstate(invalid="ignore", over="ignore"):
        while it < max_steps and not done.all() and not (done[0] and it >= probe_steps):
            # the first ONE_PASS_STEPS step lengths 1, 1/2, ... with their
            # derivatives in one batched pass
            trial = _cast(x[:, None] + near[None, :, None] * p[:, None], dt)
            fz, gz, hz = passes(trial)
            ok = fz <= fx[:, None] - ARMIJO * near[None, :] * delta[:, None]
            full = ~done & ok.any(1)
            i = np.argmax(ok, 1)  # the longest step that passes
            rows = np.arange(k)
            xz, fz, gz, hz = trial[rows, i], fz[rows, i], gz[rows, i], hz[rows, i]
            need = ~done & ~full
            moved = np.zeros(k, bool)
            xs, fs, gs, hs = x, fx, g, hess
            if need.any():
                # every one-pass step failed Armijo somewhere: the shorter steps in
                # one batched value pass, then the derivatives where each start lands
                # (two passes)
                pts = _cast(x[:, None] + steps[None, :, None] * p[:, None], dt)
                vals = np.asarray(
                    _values(jnp.asarray(pts.reshape(-1, d), dt), logdensity_fn),
                    np.float64,
                ).reshape(k, -1)
                ok = vals <= fx[:, None] - ARMIJO * steps[None, :] * delta[:, None]
                moved = need & ok.any(1)
                t = steps[np.argmax(ok, 1)]
                xs = np.where(moved[:, None], _cast(x + t[:, None] * p, dt), x)
                fs, gs, hs = passes(xs)
            x = _pick(full, moved, xz, xs, x)
            fx = _pick(full, moved, fz, fs, fx)
            g = _pick(full, moved, gz, gs, g)
            hess = _pick(full, moved, hz, hs, hess)
            count += 1 + 2 * bool(need.any())
            # a start the line search could not move is done where it is
            p, done, delta, pd = check(g, hess, done | (need & ~moved), delta, pd)
            it += 1
    # δ and definiteness are those at each start's point once it is done
    return NewtonResult(
        jnp.asarray(fx, dt),
        jnp.asarray(x, dt),
        jnp.asarray(-g, dt),
        jnp.asarray(-hess, dt),
        jnp.asarray(delta, dt),
        jnp.asarray(done & pd & (delta <= tol)),
        jnp.asarray(count),
    )


def _cast(a, dt):
    """``a`` rounded to the positions' dtype (the point the programs evaluate), kept
    as float64."""
    return np.asarray(a, dt).astype(np.float64)


def _pick(full, moved, a, b, c):
    """Per start: ``a`` where the one-pass step passed, ``b`` where the search moved
    it, ``c`` (unchanged) otherwise."""
    shape = (-1,) + (1,) * (a.ndim - 1)
    return np.where(full.reshape(shape), a, np.where(moved.reshape(shape), b, c))
