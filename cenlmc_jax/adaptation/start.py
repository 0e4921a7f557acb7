"""The start phase of ``cj.langevin_warmup``: where the ensemble starts, and in which
coordinates.

``start="laplace"`` (the default). A far-out start is where the warm-up's later phases
fail first: on kidiq from ``Uniform(-2, 2)`` draws, ``log σ ≈ -2`` makes the curvature
orders of magnitude larger than at the mode, the step as many smaller, and nothing
moves. So the warm-up first finds the mode from the best particle and
``MODE_STARTS − 1`` dispersed ones (Newton's method side by side for ``d <=``
:data:`NEWTON_MAX_D`, or :data:`LAPLACE_MAX_D` where the Hessian is taken by
differences, :mod:`cenlmc_jax.adaptation.newton`; L-BFGS,
:func:`cenlmc_jax.ensemble.tuning.find_f_star`, above it or where Newton fails), takes
the Hessian there (``jax.jacfwd`` of the gradient: ``d`` Hessian-vector products in
one pass, or, for a log density that is a large program such as a Python loop
unrolled, central differences of the gradient, which compile faster:
:func:`cenlmc_jax.adaptation.newton.hessian_method`; Newton's method ends with it)
and starts from its Laplace approximation: ``M₀ = H⁻¹`` (eigenvalues of ``H`` taken
in absolute value and floored at ``10⁻¹⁰ λ_max``, so ``M₀`` is SPD even off a strict
maximum; for a diagonal ``M`` its diagonal) and the ``N`` particles drawn from
``N(mode, M₀)``. Separate modes found by the dispersed starts are reported when they
hold mass (their Laplace weight at least :data:`MODE_MIN_MASS` of the total).

The Laplace start is refused where its "mode" is a spike that says nothing of the
bulk (a centred funnel's neck): ``H``'s condition number above
:data:`LAPLACE_MAX_CONDITION` and the given positions' log densities
:data:`LAPLACE_MAX_MISMATCH` times higher than its quadratic says
(:func:`_laplace_mismatch`); and where it describes the posterior worse than the
given positions do, by Pathfinder's criterion (Zhang, Carpenter, Gelman & Vehtari
2022): the ELBO ``E_q[log π] + H[q]`` of ``N(mode, H⁻¹)`` over its draws below that
of the positions (their log densities, and the entropy of a Gaussian with their
variances), by more than :data:`ELBO_MARGIN` (a mode far from the bulk:
non-centred eight schools' log τ, a banana's ridge). Then, when both searches fail,
or ``d > LAPLACE_MAX_D``, the warm-up starts from ``positions`` with ``M₀`` nutpie's
diagonal ``sqrt(Var[x] / Var[∇log π])`` over them (:func:`_positions_metric`: the
posterior's variance for a Gaussian, wherever the positions are), and the
reasoning says why.
``start="positions"`` always starts there, with ``M₀ = I`` (e.g. to keep a
multimodal spread).

Before any of it, starts whose log density is NaN or ``-inf`` are redrawn, as Stan
redraws its initial points (:func:`valid_starts`).

The next phase is the kinetic one (:mod:`cenlmc_jax.adaptation.kinetic`) for the
exact samplers, or the LMC windows of :mod:`cenlmc_jax.adaptation.langevin_warmup`.
"""

from __future__ import annotations

import math
import warnings
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from cenlmc_jax._batch import batch_logdensity
from cenlmc_jax._keys import normal
from cenlmc_jax.adaptation.coordinates import values_y
from cenlmc_jax.adaptation.kinetic import fit_dtype
from cenlmc_jax.adaptation.newton import hessian_at, hessian_method, newton_modes
from cenlmc_jax.diagnostics.convergence import ConvergenceWarning
from cenlmc_jax.ensemble.lmc import mass_root
from cenlmc_jax.ensemble.tuning import find_f_star
from cenlmc_jax.gradients.ensemble import gradient_fn
from cenlmc_jax.types import Array, LogDensityFn

__all__ = [
    "Start",
    "choose_start",
    "LAPLACE_MAX_D",
    "LAPLACE_MAX_CONDITION",
    "LAPLACE_MAX_MISMATCH",
    "ELBO_MARGIN",
    "MODE_MIN_MASS",
    "START_TRIES",
    "metric_condition",
    "valid_starts",
]


#: ``start="laplace"`` takes the Hessian (``d`` HVPs, a ``(d, d)`` array) up to this
#: dimension.
LAPLACE_MAX_D = 1000


#: An L-BFGS that stopped above its gradient tolerance is still taken as the mode when
#: ``H`` is positive definite and the Newton step to the mode is this small in ``H``'s
#: metric: ``gᵀH⁻¹g <= 0.01`` (the mode within 0.1 posterior sd of the point). In
#: float32 the tolerance ``sqrt(eps)`` on ``|∇f|`` can be below the rounding of a
#: gradient of a large ``f`` (earnings on the raw scale, whose ``f`` at the mode is
#: large).
NEWTON_DECREMENT_MAX = 0.01


#: The Laplace start finds the mode by Newton's method up to this dimension (a
#: ``(d, d)`` Hessian and its eigendecomposition per iteration), by L-BFGS above it
#: and where Newton's method fails.
NEWTON_MAX_D = 200


#: Newton iterations of the mode search at most.
NEWTON_MAX_STEPS = 50


#: The first, loose L-BFGS of the Laplace start stops at ``|∇f| <=`` this (then a
#: Newton step; the default tolerance only where the Newton decrement is too large).
LBFGS_LOOSE_TOL = 1e-3


#: The mode search starts L-BFGS from this many dispersed particles.
MODE_STARTS = 4


#: Iterations of each extra start's probe (the main search runs to convergence).
MODE_PROBE_STEPS = 30


#: Two L-BFGS results are separate modes when they are more than this many posterior
#: sds apart in the best mode's Hessian metric.
MODE_SEPARATION = 3.0


def _hessian(mode, logdensity_fn, grad_fn, grad_mode):
    """``∇²log π`` at ``mode`` (:func:`cenlmc_jax.adaptation.newton.hessian_at`:
    ``jax.jacfwd`` of the gradient, ``d`` HVPs, or central differences of the gradient
    for a large program).
    """
    return hessian_at(logdensity_fn, mode, grad_fn=grad_fn, grad_mode=grad_mode)[0]


def _laplace(key, logdensity_fn, grad_fn, grad_mode, x, dense, notes):
    """``(draw, steps, hvps)``: ``draw = (positions, M₀, mean, f*)`` of the Laplace
    start, or None where it is not used (reasoning in ``notes``); ``steps`` and
    ``hvps`` what the search cost either way (sequential passes, Hessian-vector
    products).
    """
    n, d = x.shape
    if d > LAPLACE_MAX_D:
        notes.append(
            f"start: the given positions (d = {d} > LAPLACE_MAX_D = {LAPLACE_MAX_D}: "
            "no Hessian)."
        )
        return None, 0, 0
    grad = gradient_fn(logdensity_fn, grad_fn, grad_mode)

    def at(res):
        mode = res.position
        # Newton's method ends with the derivatives at its point; L-BFGS takes a pass
        given = getattr(res, "hessian", None)
        hess = -np.asarray(
            _hessian(mode, logdensity_fn, grad_fn, grad_mode)
            if given is None
            else given,
            np.float64,
        )
        lam, vec = np.linalg.eigh(0.5 * (hess + hess.T))
        g = np.asarray(grad(mode) if given is None else res.grad, np.float64)
        if not np.all(np.isfinite(lam)) or np.max(np.abs(lam)) == 0:
            return mode, lam, vec, g, math.inf
        floor = np.maximum(np.abs(lam), 1e-10 * np.max(np.abs(lam)))
        return mode, lam, vec, g, float(np.sum((vec.T @ g) ** 2 / floor))

    # a loose L-BFGS first (|∇f| <= LBFGS_LOOSE_TOL): the Laplace start needs the mode
    # only to a Newton decrement of NEWTON_DECREMENT_MAX, and the Newton step below
    # takes it the rest of the way; on a rotated Gaussian of condition 10⁴ (d = 100)
    # the default tolerance cost 500 iterations. The tight search runs only when the
    # loose point fails that test.
    found, steps, how = _newton_search(logdensity_fn, grad_fn, grad_mode, x)
    if not found:
        found, more = _mode_search(logdensity_fn, x)
        steps, how = steps + more, "L-BFGS"
    res = found[0]
    # steps: the mode search's sequential passes, and each Hessian pass of at()
    steps += getattr(res, "hessian", None) is None
    mode, lam, vec, g, newton = at(res)
    if len(found) > 1 and np.all(np.isfinite(lam)):
        _report_modes(found, lam, vec, notes)
    if not (np.all(lam > 0) and newton <= NEWTON_DECREMENT_MAX):
        res = find_f_star(logdensity_fn, jnp.asarray(mode)[None])
        steps += int(res.num_steps) + 1
        mode, lam, vec, g, newton = at(res)
    else:
        # one Newton step to the mode: exact for a Gaussian, no gradient needed
        mode = jnp.asarray(
            np.asarray(mode, np.float64) + (vec / lam) @ (vec.T @ g), x.dtype
        )
    if not np.all(np.isfinite(lam)) or np.max(np.abs(lam)) == 0:
        notes.append(
            "start: the given positions (the Hessian at the L-BFGS point is not "
            f"finite or zero; {steps} L-BFGS iterations)."
        )
        return None, steps, d
    if not bool(res.converged) and not (
        np.all(lam > 0) and newton <= NEWTON_DECREMENT_MAX
    ):
        notes.append(
            "start: the given positions (L-BFGS from the best particle did not "
            f"converge in {steps} iterations: |∇f| = {float(res.grad_norm):.3g}, "
            f"Newton decrement gᵀH⁻¹g = {newton:.3g})."
        )
        return None, steps, d
    clipped = int(np.sum(lam <= 0))
    lam = np.maximum(np.abs(lam), 1e-10 * np.max(np.abs(lam)))
    cov = (vec / lam) @ vec.T
    found = (
        f"the mode found by {how} ({steps} sequential gradients, f* = "
        f"{float(res.f_star):.6g}, Newton decrement {newton:.2g}; the Hessian by "
        + (
            "autodiff)"
            if hessian_method(logdensity_fn, _point_like(x)) == "autodiff"
            else "central differences of the gradient: the log density is a large "
            "program or holds a loop, whose second derivatives XLA compiles slowly)"
        )
    )
    cond = float(np.max(lam) / np.min(lam))
    values = np.asarray(batch_logdensity(x, logdensity_fn), np.float64)
    mismatch = _laplace_mismatch(values, x, mode, lam, vec, res.f_star)
    if cond > LAPLACE_MAX_CONDITION and mismatch > LAPLACE_MAX_MISMATCH:
        notes.append(
            f"start: the given positions, not the Laplace approximation at {found}: "
            f"it is a spike, not the posterior's bulk (a funnel's neck): H's condition "
            f"number {cond:.3g} > {LAPLACE_MAX_CONDITION:g}, and the given positions "
            f"lie {mismatch:.3g}x farther below the mode in H's metric than their log "
            f"densities say (the median over the particles of ½(x − mode)ᵀH(x − mode) "
            f"/ (f(x) − f*), > {LAPLACE_MAX_MISMATCH:g}); a metric from H would not "
            "let the chains leave it."
        )
        return None, steps, d
    m0 = cov if dense else np.diag(cov).copy()
    xi = normal(key, x.shape, x.dtype)
    root = jnp.asarray(mass_root(m0), x.dtype)
    positions = jnp.asarray(mode, x.dtype) + (xi @ root.T if dense else xi * root)
    # Pathfinder's choice between two Gaussians: the Laplace one and the given
    # positions' (one batched pass of values at the draws; the positions' values are
    # the mismatch test's)
    drawn = np.asarray(batch_logdensity(positions, logdensity_fn), np.float64)
    steps += 1
    logdet = np.linalg.slogdet(m0)[1] if dense else float(np.sum(np.log(m0)))
    elbo_laplace = _elbo(drawn, logdet, d)
    elbo_given = _elbo(values, float(np.sum(np.log(_variances(x)))), d)
    if elbo_given > elbo_laplace + ELBO_MARGIN:
        notes.append(
            f"start: the given positions, not the Laplace approximation at {found}: "
            f"its ELBO (E_q[log π] + H[q] over its {n} draws, Pathfinder's "
            f"criterion) is {elbo_laplace:.4g}, below the given positions' "
            f"{elbo_given:.4g} (their log densities and the entropy of a Gaussian "
            "with their variances): N(mode, H⁻¹) describes the posterior worse than "
            "they do (a mode far from the bulk: a hierarchical scale, a banana's "
            "ridge)."
        )
        return None, steps, d
    notes.append(
        f"start: Laplace at {found}; condition number of H⁻¹ "
        f"{metric_condition(cov):.3g}"
        + (
            f"; {clipped} non-positive Hessian eigenvalues taken in absolute value"
            if clipped
            else ""
        )
        + f"; the given positions' log densities fit it within {mismatch:.3g}x "
        "(the median over the particles of ½(x − mode)ᵀH(x − mode) / (f(x) − f*))."
    )
    return (positions, m0, np.asarray(mode, np.float64), float(res.f_star)), steps, d


#: The Laplace start is refused (:func:`_laplace`) where the given positions' ELBO is
#: above its own by more than this (nats). Pathfinder's criterion (Zhang, Carpenter,
#: Gelman & Vehtari 2022) for which Gaussian describes ``π`` best,
#: ``E_q[log π] + H[q]``: for ``N(mode, H⁻¹)`` over its ``N`` draws; for the positions
#: their own log densities and the entropy of a Gaussian with their variances. From
#: Uniform(-2, 2) starts (benchmarks/results/start_depth.md) the Laplace start wins by
#: 24 to 10¹¹⁸ nats on the ten posteriordb posteriors but one, a 100-d Gaussian, a
#: logistic regression, Lotka-Volterra, Brownian motion and two modes, and loses on
#: non-centred eight schools (its mode's log τ is 3.4, the posterior's mass near 1)
#: and the banana (the mode is off the ridge's bulk). ``inf`` turns the test off.
ELBO_MARGIN = 0.0
#: The Laplace start is refused (:func:`_laplace`) where ``H``'s condition number is
#: above this and :func:`_laplace_mismatch` above :data:`LAPLACE_MAX_MISMATCH`.
#: Alone the condition number is no sign: earnings on the raw scale has 10¹⁰ and a
#: good Laplace start.
LAPLACE_MAX_CONDITION = 1e8


#: See :data:`LAPLACE_MAX_CONDITION`. Measured (Uniform(-2, 2) starts): 0.009-73 on
#: the posteriordb models of cenlmc_jax.models.posteriordb (diamonds the largest),
#: 7.6·10⁶ and 2·10¹⁶ on centred funnels of d = 5 and 10, whose "mode" is the neck.
LAPLACE_MAX_MISMATCH = 1e4


def _laplace_mismatch(values, x, mode, lam, vec, f_star) -> float:
    """How much narrower the Laplace approximation ``N(mode, H⁻¹)`` is than the given
    positions' log densities say: the median over the particles of
    ``½(x − mode)ᵀH(x − mode) / max(f(x) − f*, d/2)`` (``H = V diag(λ) Vᵀ``, ``λ``
    floored). About 1 for a Gaussian, larger where the tails are lighter than the
    quadratic (a logistic regression's linear tails: tens), astronomically large at a
    spike whose curvature says nothing of the bulk: a centred funnel's neck, where a
    particle at ``v = 0`` is ``10¹⁷`` Laplace units but 100 nats below the "mode".
    """
    d = x.shape[1]
    r = (np.asarray(x, np.float64) - np.asarray(mode, np.float64)) @ vec
    quad = 0.5 * np.sum(lam * r**2, 1)
    drop = np.maximum(-values - float(f_star), 0.5 * d)
    ratio = quad / drop
    ratio = ratio[np.isfinite(ratio)]
    return float(np.median(ratio)) if ratio.size else math.inf


def _regularised(var: np.ndarray, n: int) -> np.ndarray:
    """Variances from ``n`` draws regularised as Stan regularises its windows'
    (``n/(n + 5) S + 10⁻³ · 5/(n + 5)``); ones where they are not all finite."""
    var = n / (n + 5.0) * var + 1e-3 * 5.0 / (n + 5.0)
    return var if np.all(np.isfinite(var)) else np.ones(var.shape)


def _variances(x) -> np.ndarray:
    """The positions' variances, :func:`_regularised`."""
    return _regularised(np.var(np.asarray(x, np.float64), 0), x.shape[0])


def _elbo(values: np.ndarray, log_det: float, d: int) -> float:
    """``E_q[log π] + H[q]`` for a Gaussian ``q`` of covariance log-determinant
    ``log_det`` from the log densities of draws from it (the finite ones: a draw
    outside a support is replaced later, kinetic._resample_laplace); ``-inf`` where
    none is finite."""
    finite = values[np.isfinite(values)]
    if not finite.size:
        return -math.inf
    return float(np.mean(finite)) + 0.5 * (d * math.log(2 * math.pi * math.e) + log_det)


def _positions_metric(x, logdensity_fn, grad_fn, grad_mode, dense: bool):
    """``M₀`` where the Laplace start is not used: per coordinate
    ``sqrt(Var[x_i] / Var[∂_i log π])`` over the given positions (nutpie's diagonal,
    Seyboldt et al.; Tran & Kleppe 2024). For a Gaussian posterior it is its variance
    whatever the positions' spread (``∂_i log π = −(x_i − m_i)/σ_i²``), where the
    positions' own variance is only their spread: non-centred eight schools from
    Uniform(-2, 2) starts has ``μ``'s variance about 11 and the starts' 1.3, so the
    kinetic phase would first spend a slow round widening ``μ``. Regularised as
    :func:`_regularised`; the positions' variance where the gradient's is zero or not
    finite. One batched pass of gradients (the kinetic phase's first program: the
    same shapes, so no compilation of its own).

    Returns:
      ``(M₀, note)``: ``(d,)``, or its ``(d, d)`` diagonal matrix where ``dense``.
    """
    n, d = x.shape
    var = np.var(np.asarray(x, np.float64), 0)
    eye = np.eye(d) if dense else np.ones(d)
    _, g = values_y(
        jnp.asarray(x),
        jnp.asarray(eye, x.dtype),
        jnp.zeros(d, x.dtype),
        logdensity_fn=logdensity_fn,
        grad_fn=grad_fn,
        grad_mode=grad_mode,
    )
    g = np.asarray(g, np.float64)
    var_g = np.var(g, 0) if np.all(np.isfinite(g)) else np.zeros(d)
    use = np.isfinite(var_g) & (var_g > 0)
    m = _regularised(np.where(use, np.sqrt(var / np.where(use, var_g, 1.0)), var), n)
    note = (
        "M₀ = sqrt(Var[x] / Var[∇log π]) over the given positions (nutpie's diagonal"
        f": {m.min():.3g} to {m.max():.3g}; their variances span {var.min():.3g} to "
        f"{var.max():.3g})"
        + ("" if use.all() else f", their variance in {int((~use).sum())} coordinates")
        + ", m₀ = their mean."
    )
    return (np.diag(m) if dense else m), note


def _dispersed(x: np.ndarray, values: np.ndarray, k: int) -> list:
    """``k`` particle indices to start the mode search from: the best one, then
    farthest-point sampling (in coordinates scaled by the ensemble's sd) over all
    particles, so the starts cover the ensemble's spread, not one basin (the better
    half of the particles may all lie in a local mode's basin).
    """
    pool = np.argsort(-values)
    z = x[pool] / np.maximum(x.std(0), 1e-300)
    chosen = [0]
    dist = np.sum((z - z[0]) ** 2, 1)
    while len(chosen) < min(k, len(pool)):
        i = int(np.argmax(dist))
        if dist[i] == 0:
            break
        chosen.append(i)
        dist = np.minimum(dist, np.sum((z - z[i]) ** 2, 1))
    return [int(pool[i]) for i in chosen]


def _rounded(x) -> list:
    return np.round(np.asarray(x, np.float64), 3).tolist()


def _point_like(x) -> np.ndarray:
    """A point of ``x``'s rows' shape and dtype (zeros, on the host): what
    :func:`~cenlmc_jax.adaptation.newton.hessian_method` reads of a point."""
    return np.zeros(x.shape[1:], x.dtype)


class _Mode(NamedTuple):
    """A converged start of :func:`_newton_search` (the fields :func:`_laplace` and
    :func:`_report_modes` read, as in ``FStarResult``).
    """

    f_star: float
    position: Array
    grad: Array
    hessian: Array
    converged: bool = True


def _newton_search(logdensity_fn, grad_fn, grad_mode, x):
    """``(modes, sequential gradients, "Newton's method")``: Newton's method
    (:mod:`cenlmc_jax.adaptation.newton`) from the best particle and
    :data:`MODE_STARTS` − 1 dispersed ones, side by side; the converged ends, best
    first (empty: none converged, or ``d >`` :data:`NEWTON_MAX_D` with an autodiff
    Hessian; the caller falls back to L-BFGS). A model whose Hessian is taken by
    differences of the gradient (a large program, issue 48) keeps Newton's method up
    to :data:`LAPLACE_MAX_D`: its programs are the gradient's, batched, where L-BFGS
    would compile the model into two more (the main search's and the probes'
    ``max_steps``).
    """
    d = x.shape[1]
    if d > NEWTON_MAX_D and hessian_method(logdensity_fn, _point_like(x)) == "autodiff":
        return [], 0, ""
    xs = np.asarray(x, np.float64)
    # the compiled program valid_starts ran (no op-by-op trace of the model)
    values = np.asarray(batch_logdensity(x, logdensity_fn), np.float64)
    values = np.where(np.isfinite(values), values, -np.inf)
    starts = _dispersed(xs, values, MODE_STARTS)
    r = newton_modes(
        logdensity_fn,
        np.asarray(x)[np.asarray(starts)],
        tol=NEWTON_DECREMENT_MAX,
        grad_fn=grad_fn,
        grad_mode=grad_mode,
        max_steps=NEWTON_MAX_STEPS,
        probe_steps=MODE_PROBE_STEPS,
    )
    # read on the host: indexing the device arrays would compile a program a field
    f_star, pos, grad, hess, conv = (
        np.asarray(a) for a in (r.f_star, r.position, r.grad, r.hessian, r.converged)
    )
    found = [
        _Mode(float(f_star[i]), pos[i], grad[i], hess[i])
        for i in range(len(starts))
        if bool(conv[i])
    ]
    found.sort(key=lambda m: m.f_star)
    # a probe's mode that is better than the main one's is kept; the main search's
    # failure alone sends the start to L-BFGS (a funnel's neck has no mode)
    if not bool(conv[0]):
        found = []
    return found, int(r.num_steps), "Newton's method"


def _mode_search(logdensity_fn, x):
    """``(results, L-BFGS iterations)``: loose L-BFGS (``|∇f| <= LBFGS_LOOSE_TOL``)
    from the best particle, and probes of at most :data:`MODE_PROBE_STEPS` iterations
    from :data:`MODE_STARTS` − 1 more dispersed particles (:func:`_dispersed`); a
    probe that ends lower than the main search is followed to its mode. The
    converged results, best first: the best is the Laplace start's mode, and
    :func:`_report_modes` names separate ones (issue 28: all chains started in a
    local mode and agreed there, R-hat 1.04). The searches run one after another;
    their iterations are summed.
    """
    xs = np.asarray(x, np.float64)
    # the compiled program valid_starts ran (no op-by-op trace of the model)
    values = np.asarray(batch_logdensity(x, logdensity_fn), np.float64)
    values = np.where(np.isfinite(values), values, -np.inf)
    starts = _dispersed(xs, values, MODE_STARTS)
    main = find_f_star(logdensity_fn, x[starts[0]][None], tol=LBFGS_LOOSE_TOL)
    steps, found = int(main.num_steps), []
    for i in starts[1:]:
        # a probe: a few iterations, enough to fall into a well-scaled basin; one
        # that ends lower than the main search is followed to its mode
        r = find_f_star(
            logdensity_fn, x[i][None], tol=LBFGS_LOOSE_TOL, max_steps=MODE_PROBE_STEPS
        )
        steps += int(r.num_steps)
        if not np.isfinite(float(r.f_star)):
            continue
        if float(r.f_star) < float(main.f_star) - 1e-3 and not bool(r.converged):
            r = find_f_star(logdensity_fn, r.position[None], tol=LBFGS_LOOSE_TOL)
            steps += int(r.num_steps)
        if bool(r.converged):
            found.append(r)
    if np.isfinite(float(main.f_star)):
        found.append(main)
    if not found:
        r = find_f_star(logdensity_fn, x, tol=LBFGS_LOOSE_TOL)
        return [r], steps + int(r.num_steps)
    found.sort(key=lambda r: float(r.f_star))
    return found, steps


#: A separate mode counts (is warned of) only when its Laplace weight is at least this
#: share of the modes' total: Lotka-Volterra's other modes, 40 and 116 nats below the
#: first, hold none (issue 46).
MODE_MIN_MASS = 1e-3


def _laplace_masses(modes: list, lam_best: np.ndarray) -> list:
    """Each mode's share of the Laplace mass ``e^{-f} det(H)^{-1/2}`` (``H`` its own
    Hessian where the search kept it, else the best mode's eigenvalues ``lam_best``)."""
    logs = []
    for r in modes:
        h = getattr(r, "hessian", None)
        ev = lam_best
        if h is not None and np.all(np.isfinite(np.asarray(h))):
            h = np.asarray(h, np.float64)
            ev = np.abs(np.linalg.eigvalsh(0.5 * (h + h.T)))
            ev = np.maximum(ev, 1e-12 * max(float(ev.max()), 1e-300))
        logs.append(-float(r.f_star) - 0.5 * float(np.sum(np.log(ev))))
    logs = np.asarray(logs) - max(logs)
    w = np.exp(logs)
    return (w / w.sum()).tolist()


def _report_modes(found, lam, vec, notes) -> None:
    """Separate modes among the L-BFGS results ``found`` (best first): more than
    ``MODE_SEPARATION`` posterior sds from every mode kept before, measured in the
    metric of the best mode's Hessian ``H = V diag(λ) Vᵀ`` (scale-aware: a loose
    L-BFGS stop far along a flat direction is not a mode), are listed in ``notes``
    and named by a ``ConvergenceWarning``.
    """
    lam = np.maximum(np.abs(lam), 1e-12 * np.max(np.abs(lam)))
    modes = []
    for r in found:
        p = np.asarray(r.position, np.float64)
        if all(
            np.sum(lam * (vec.T @ (p - np.asarray(q.position, np.float64))) ** 2)
            > MODE_SEPARATION**2
            for q in modes
        ):
            modes.append(r)
    if len(modes) < 2:
        return
    mass = _laplace_masses(modes, lam)
    held = [r for r, w in zip(modes, mass, strict=True) if w >= MODE_MIN_MASS]
    if len(held) < 2:
        notes.append(
            f"modes: {len(modes) - 1} other separate mode(s) found, holding "
            f"{1.0 - max(mass):.2g} of the Laplace mass in all (each below "
            f"{MODE_MIN_MASS:g}): ignored ("
            + "; ".join(
                f"f = {float(r.f_star):.6g}, mass {w:.2g}"
                for r, w in zip(modes, mass, strict=True)
            )
            + ")."
        )
        return
    listed = "; ".join(
        f"f = {float(r.f_star):.6g} at {_rounded(r.position)}, Laplace mass {w:.2g}"
        for r, w in zip(modes, mass, strict=True)
    )
    message = (
        f"langevin_warmup: the mode search from {len(found)} dispersed particles "
        f"found {len(held)} separate modes that hold mass ({listed}); the warm-up "
        "starts at the best one, and chains started there do not visit the others: "
        "the draws describe that mode only. Check the model, or sample the modes "
        "apart."
    )
    notes.append("modes: " + message.split(": ", 1)[1])
    warnings.warn(ConvergenceWarning(message), stacklevel=4)


def metric_condition(m: np.ndarray) -> float:
    """The condition number of ``M`` (its extreme eigenvalues' ratio).

    Args:
      m: ``M``, ``(d, d)`` symmetric positive definite, or its diagonal ``(d,)``.

    Returns:
      ``λ_max / λ_min``, a float.
    """
    ev = np.linalg.eigvalsh(m) if m.ndim == 2 else m
    return float(np.max(ev) / np.min(ev))


#: Rounds of redrawing a start whose log density is not finite (Stan: 100 tries).
START_TRIES = 100


def valid_starts(rng_key, logdensity_fn: LogDensityFn, x: Array) -> Array:
    """Every starting particle inside the support, as Stan makes its starts.

    A particle whose log density is NaN or ``-inf`` (an ODE that fails there, a
    parameter outside its support) gives no gradient and no curvature. As Stan redraws
    such an initial point (up to 100 times), each bad particle is redrawn uniformly in
    the box the finite starts span, coordinate by coordinate (Stan's ``uniform(-2, 2)``
    when none is finite), up to :data:`START_TRIES` rounds (one batched evaluation
    each); one still bad after that takes a copy of a finite start. A warning says how
    many were redrawn. Refused (``ValueError``) only when no finite start is found,
    naming the first bad particle and its value.

    Args:
      rng_key: the redraws' key.
      logdensity_fn: ``x: (d,) -> log π(x)``.
      x: the starts, ``(N, d)``.

    Returns:
      ``x`` with every start whose log density was not finite redrawn, ``(N, d)``.

    Raises:
      ValueError: no start with a finite log density was found.
    """
    values = np.asarray(batch_logdensity(x, logdensity_fn), np.float64)
    bad = ~np.isfinite(values)
    if not bad.any():
        return x
    first = int(np.flatnonzero(bad)[0])
    first_text = (
        f"particle {first}, at {np.asarray(x[first]).tolist()}, has log density "
        f"{float(values[first])}"
    )
    n_bad = int(bad.sum())
    xs = np.array(x)
    good = xs[~bad]
    lo, hi = (good.min(0), good.max(0)) if good.size else (-2.0, 2.0)
    if good.shape[0] == 1 or not good.size:
        lo, hi = lo - 2.0, hi + 2.0
    key = rng_key
    for _ in range(START_TRIES):
        key, sub = jax.random.split(key)
        u = np.asarray(jax.random.uniform(sub, xs.shape, dtype=x.dtype))
        trial = np.where(bad[:, None], lo + (hi - lo) * u, xs).astype(xs.dtype)
        tried = batch_logdensity(jnp.asarray(trial), logdensity_fn)
        ok = np.isfinite(np.asarray(tried))
        xs = np.where((bad & ok)[:, None], trial, xs)
        bad = bad & ~ok
        if not bad.any():
            break
    if bad.all():
        raise ValueError(
            f"positions: no start with a finite log density was found ({first_text}; "
            f"{START_TRIES} rounds of redraws in the box of the starts found none): "
            "outside the support, or a log density that fails everywhere tried. Start "
            "where logdensity_fn is finite (e.g. transform a constrained parameter to "
            "the real line)."
        )
    if bad.any():
        ok_rows = np.flatnonzero(~bad)
        xs[bad] = xs[ok_rows[np.arange(int(bad.sum())) % ok_rows.size]]
    warnings.warn(
        f"positions: {n_bad} of {x.shape[0]} starts had a log density that is NaN or "
        f"-inf (the first: {first_text}); they were redrawn in the box the finite "
        f"starts span, as Stan redraws its initial values"
        + (f" ({int(bad.sum())} copied from finite starts)" if bad.any() else ""),
        UserWarning,
        stacklevel=3,
    )
    return jnp.asarray(xs)


class Start(NamedTuple):
    """Where the next phase starts: what :func:`choose_start` returns."""

    #: the particles, ``(N, d)`` (Laplace draws, or the given positions)
    positions: Any
    #: ``M₀`` (``(d, d)`` or ``(d,)``) and ``m₀`` of the coordinates the next phase
    #: whitens by
    inverse_mass_matrix: np.ndarray
    mean: np.ndarray
    #: the mode search's sequential passes and the Hessian's HVPs
    lbfgs_steps: int
    hvp_evals: int
    #: ``"laplace"`` or ``"positions"``
    started: str
    #: ``f*`` at the mode (None without one)
    f_mode: float | None


def choose_start(
    rng_key, logdensity_fn, grad_fn, grad_mode, x, start: str, dense: bool, notes
) -> Start:
    """The start of the module docstring: the Laplace approximation at the mode where
    ``start="laplace"`` and it describes the posterior's bulk, else the given
    positions.

    Args:
      rng_key: the Laplace draws' key (None with ``start="positions"``).
      logdensity_fn: ``x: (d,) -> log π(x)``.
      grad_fn: as for ``cj.lmc``.
      grad_mode: as for ``cj.lmc``.
      x: the given positions, ``(N, d)``, every log density finite
        (:func:`valid_starts`).
      start: ``"laplace"`` or ``"positions"``.
      dense: a dense ``M₀`` (else its diagonal).
      notes: the warm-up's reasoning; what was chosen and why is appended.

    Returns:
      A :class:`Start`.
    """
    d = x.shape[1]
    lap, lbfgs, hvps = (
        _laplace(rng_key, logdensity_fn, grad_fn, grad_mode, x, dense, notes)
        if start == "laplace"
        else (None, 0, 0)
    )
    if lap is None:
        mean = np.asarray(jnp.mean(x, 0), np.float64)
        if start == "positions":
            notes.append("start: the given positions, M = I.")
            m_eye = np.eye(d) if dense else np.ones(d)
            return Start(x, m_eye, mean, 0, 0, "positions", None)
        # the Laplace start was asked for and is not used: the scale the posterior
        # has about the given positions, not I; the search's passes count all the
        # same, and the gradients' pass
        m_mat, note = _positions_metric(x, logdensity_fn, grad_fn, grad_mode, dense)
        notes.append("start: " + note)
        return Start(x, m_mat, mean, lbfgs + 1, hvps, "positions", None)
    x, m_mat, mean, f_mode = lap
    m_mat, alpha = fit_dtype(m_mat, x.dtype)
    if alpha:
        notes.append(
            f"the Laplace M's correlations shrunk by {alpha:.3g} towards its "
            f"diagonal so that {jnp.dtype(x.dtype).name} can factor it (fit_dtype)."
        )
    return Start(x, m_mat, mean, lbfgs, hvps, "laplace", f_mode)
