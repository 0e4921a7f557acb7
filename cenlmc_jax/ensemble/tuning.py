"""Tuning CEnLMC: parameters from theory, then a short burn-in that checks them.

:func:`suggest_cenlmc_params` proposes ``η, R1, R2, N*, M_f`` for a step size
``h``, following Theorem 3.3 / Corollary 3.1 of Ding & Li (docs/algorithms.md §4)
where they give an order of magnitude, the probabilities of the three
tests (Theorem 3.5) where they give a number, and a budget on the ensemble
noise for N*: Theorem 3.3's first term with its constant
(:func:`ensemble_noise_constant`) turned into the relative inflation of the
stationary variance (:func:`predicted_variance_inflation`), the quantity the
gradient audit measures (``info.audit_variance_inflation``).

**The burn-in tuner.** :func:`suggest_cenlmc_params` gives parameters from theory
for a roughly unit-scale target. :func:`tune_cenlmc` checks and adjusts them
on the user's own target, measuring what matters during a burn-in:

* the **ensemble fraction** (particles using the ensemble force instead of a
  gradient): the saving;
* the **variance inflation** from the gradient audit (true gradients at
  ``audit_size`` random particles that used the ensemble force,
  ``info.audit_variance_inflation``): the relative inflation of the
  stationary variance by the ensemble force's noise, the error that biases
  the moments (module docstring of :mod:`cenlmc_jax.ensemble`), capped by
  ``max_variance_inflation`` (default 0.03: the sd biased by ~1.5%, half
  the audit's flag ``AUDIT_BIAS_THRESHOLD``; the suggestion's budget is
  0.02, and a trial's 20 measured steps leave room for noise);
* the typical drift error of one step, ``h|F_i - ∇f(x_i)|`` in units of the
  Langevin noise length ``sqrt(2hd)`` (``info.audit_noise_error``, a median),
  capped by ``max_noise_error`` (0.25). The median alone misses a heavy tail
  (it is about the same on a healthy run and on one whose sd is much too
  large), which is why the variance inflation is the main criterion.

Two knobs are searched on a small grid, all from the suggested values: ``R1`` through
the pass probability of the R1 test (``R1 = sqrt(2h χ²_d.ppf(p))``, p in ``r1_passes``:
the R1 test caps the fraction near p, so p = 0.7, the suggestion, caps it near 0.63),
and ``η, R2`` scaled together by ``radius_scales`` (smaller radii: a more local, less
biased estimate, fewer neighbours). A first ``steps_per_trial`` steps burn in with the
suggested values; each candidate then runs ``steps_per_trial`` steps from that same
state (so an unstable candidate cannot damage the chain the others are measured on), and
the chosen one runs them again to hand over a settled chain; all share one compiled
program (the radii are traced arguments). The choice: among the candidates whose
measured variance inflation and drift error are below their caps and that were never
flagged (biased or diverged: a trial's ``unstable``), the one with the smallest variance
inflation among those reaching ``target_fraction``; if none reaches it, the one with the
largest fraction. With no acceptable candidate the ensemble is switched off (``r1 = 0``:
CEnLMC is then LMC) and the reasoning says so.

What a trial cannot see. The ensemble force is unbiased but heavy-tailed: its
weights ``1/p_j`` are bounded (by ``(4πh)^{d/2} exp((η+R1+R2)²/4h)``, proof of
Lemma 4.2), and a neighbour near the bound now and then kicks a particle by
tens of times its drift; a trial's steps rarely hold such a kick. So the
long-run mean of the audited inflation is above the trial's figure (on a 2-D
banana, above every trial's; the factor 2 between ``max_variance_inflation``
and the audit's flag is the room for it), and "never diverged" covers the
trial's steps only: on a target whose curvature is unbounded, a kick can send
a particle where the step size is unstable, and the gradient steps there
diverge (the banana, curvature above 2/h for ``|x1| > ~6``: runs with the chosen
parameters could lose a particle where plain LMC from the same states did
not). The sampler reports it (``info.diverged``; ``cj.sample`` stops
at the last finite state).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from cenlmc_jax._validation import (
    check_bool,
    check_callable,
    check_int,
    check_key,
    check_positions,
    check_positive,
)
from cenlmc_jax.base import SamplingAlgorithm
from cenlmc_jax.ensemble.audit import fresh_audit
from cenlmc_jax.ensemble.cenlmc import CEnLMCState, cenlmc, cenlmc_init, cenlmc_step
from cenlmc_jax.ensemble.f_star import FStarResult, find_f_star
from cenlmc_jax.types import ArrayLike, LogDensityFn, PRNGKey

__all__ = [
    "CEnLMCParams",
    "suggest_cenlmc_params",
    "ensemble_noise_constant",
    "predicted_variance_inflation",
    "ball_volume",
    "chi2_cdf",
    "chi2_ppf",
    "TunedCEnLMC",
    "tune_cenlmc",
    "FStarResult",
    "find_f_star",
]


# --------------------------------------------------------------------------
# Parameter guidance.
# --------------------------------------------------------------------------


def chi2_cdf(x: float, dof: int) -> float:
    """``P(χ²_dof <= x)``: the regularised lower incomplete gamma ``P(dof/2, x/2)``.

    Series for ``x/2 < dof/2 + 1``, Lentz continued fraction otherwise
    (Numerical Recipes 6.2); relative accuracy ~1e-14. Pure Python, so the
    package does not need SciPy.

    Args:
      x: the point.
      dof: the degrees of freedom, ``>= 1``.

    Returns:
      The probability, a float in ``[0, 1]``.
    """
    a, z = 0.5 * dof, 0.5 * x
    if z <= 0.0:
        return 0.0
    log_pre = a * math.log(z) - z - math.lgamma(a)
    if z < a + 1.0:
        term = total = 1.0 / a
        ap = a
        for _ in range(10_000):
            ap += 1.0
            term *= z / ap
            total += term
            if abs(term) < abs(total) * 1e-16:
                break
        return min(1.0, math.exp(log_pre) * total)
    tiny = 1e-300
    b = z + 1.0 - a
    c, dd = 1.0 / tiny, 1.0 / b
    hh = dd
    for i in range(1, 10_000):
        an = -i * (i - a)
        b += 2.0
        dd = an * dd + b
        dd = tiny if abs(dd) < tiny else dd
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        dd = 1.0 / dd
        delta = dd * c
        hh *= delta
        if abs(delta - 1.0) < 1e-16:
            break
    return max(0.0, 1.0 - math.exp(log_pre) * hh)


def chi2_ppf(q: float, dof: int) -> float:
    """Inverse of :func:`chi2_cdf` by bisection (to 1e-12 relative).

    Args:
      q: the probability, in ``(0, 1)``.
      dof: the degrees of freedom, ``>= 1``.

    Returns:
      ``x`` with ``chi2_cdf(x, dof) = q``.
    """
    lo, hi = 0.0, max(1.0, 2.0 * dof)
    while chi2_cdf(hi, dof) < q:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if chi2_cdf(mid, dof) < q:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-12 * hi:
            break
    return 0.5 * (lo + hi)


def ball_volume(dim: int, radius: float) -> float:
    """Volume ``π^{d/2} r^d / Γ(d/2 + 1)`` of the d-ball of radius r.

    Args:
      dim: ``d``.
      radius: ``r > 0``.

    Returns:
      The volume, a float.
    """
    return math.exp(
        0.5 * dim * math.log(math.pi)
        + dim * math.log(radius)
        - math.lgamma(0.5 * dim + 1.0)
    )


def _uniform_ball(
    rng: np.random.Generator, num: int, dim: int, radius: float
) -> np.ndarray:
    """``num`` points uniform in the d-ball of the given radius, (num, dim)."""
    v = rng.standard_normal((num, dim))
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    return v * (radius * rng.random(num) ** (1.0 / dim))[:, None]


def ensemble_noise_constant(
    dim: int,
    step_size: float,
    eta: float,
    r1: float,
    r2: float,
    *,
    num_samples: int = 1 << 15,
) -> float:
    """``K = N_i · E|F_i - ∇f(x_i)|² / |∇f(x_i)|²``, the force's relative noise.

    Theorem 3.3's first term. For ``f`` linear across the η-ball, each of the
    ``N_i`` R2-neighbours j contributes
    ``T_j = α_d (∇f·u) u/|u|² 1[|u| <= η] / p_j(x_i + u)``, ``u = x_j - x_i``,
    with ``E T_j = ∇f`` and (isotropic average of ``(∇f·û)² = |∇f|²/d``)
    ``E|T_j|² = α_d² (|∇f|²/d) ∫_{|u|<=η} du / p_j(x_i + u)``. With
    ``1/p_j(y) = (4πh)^{d/2} exp(|y - w_j|²/(4h))`` and ``y - w_j = a + b + u``
    (``a = x_i - w_i``, ``b = w_i - w_j``), the average ``F_i`` of the N_i terms
    has::

        E|F_i - ∇f|² = K |∇f|² / N_i,
        K = (d / V_η) (4πh)^{d/2} E[exp(|a + b + u|² / (4h))] - 1,

    ``a = sqrt(2h) ξ`` with ``ξ ~ N(0, I)`` conditioned on the R1 test
    ``|a| <= R1``, ``b`` uniform in the R2-ball (the w-density is locally
    flat), ``u`` uniform in the η-ball; the ``-1`` is ``|E T_j|² = |∇f|²``.
    This is the square of Theorem 3.3's first term,
    ``(R1/η)^d d exp(R1(R1+R2)/h) / N*`` in order of magnitude
    (docs/algorithms.md §4; the weight bound of Lemma 4.2), with its constant: the
    expectation is computed by Monte Carlo (``num_samples`` draws, a fixed seed:
    the same value on every call; relative error about 1%). ``K`` depends on ``h``
    only through ``η/sqrt(h)``, ``R1/sqrt(h)``, ``R2/sqrt(h)``. Checked against
    the gradient audit (2-D Gaussian; the Darcy problem, d = 3): the predicted
    variance inflation (:func:`predicted_variance_inflation`) is close to the
    audited one on Gaussians and above it on Darcy (the audited figures:
    benchmarks/results/inverse.md and frontier_inverse.md).

    Args:
      dim: ``d >= 1``.
      step_size: ``h > 0``.
      eta: ``η > 0``.
      r1: ``R1 > 0``.
      r2: ``R2 > 0``.
      num_samples: Monte Carlo draws.

    Returns:
      ``K``, a float.

    Raises:
      ValueError: ``dim < 1`` or a radius or step not ``> 0``.
    """
    dim = check_int(dim, "dim", minimum=1)
    for name, value in (("step_size", step_size), ("eta", eta), ("r1", r1), ("r2", r2)):
        check_positive(value, name)
    h = float(step_size)
    rng = np.random.default_rng(0)
    a = np.empty((0, dim))
    while a.shape[0] < num_samples:  # ξ ~ N(0, I) given sqrt(2h)|ξ| <= R1, by rejection
        xi = rng.standard_normal((num_samples, dim))
        a = np.concatenate(
            [
                a,
                math.sqrt(2.0 * h)
                * xi[math.sqrt(2.0 * h) * np.linalg.norm(xi, axis=1) <= r1],
            ]
        )
    a = a[:num_samples]
    y = (
        a
        + _uniform_ball(rng, num_samples, dim, r2)
        + _uniform_ball(rng, num_samples, dim, eta)
    )
    log_mean = float(np.logaddexp.reduce(np.sum(y**2, axis=1) / (4.0 * h))) - math.log(
        num_samples
    )
    return (
        math.exp(
            math.log(dim)
            - math.log(ball_volume(dim, eta))
            + 0.5 * dim * math.log(4.0 * math.pi * h)
            + log_mean
        )
        - 1.0
    )


def predicted_variance_inflation(
    dim: int,
    step_size: float,
    noise_constant: float,
    pass_r1: float,
    num_peak: float,
    n_star: float,
    *,
    mu: float = 1.0,
) -> float:
    """Relative stationary variance inflation by the ensemble noise.

    For a Gaussian proxy ``N(x*, I/μ)``. LMC with force ``∇f + e`` (``E[e | x] = 0``,
    independent across steps) has the stationary covariance
    ``Σ = AΣAᵀ + 2hI + h² C_e`` (``A = I - h∇²f``), so the relative inflation of
    each variance is ``h C_e,kk / 2`` whatever the curvature (to first order in h):
    on average over coordinates, the mean over particles of ``h|e|² / (2d)``, the
    squared drift error of one step in noise lengths (what the gradient audit
    measures, ``info.audit_variance_inflation``). Under the proxy,
    ``|∇f|² = μ s`` with ``s = μ|x - x*|² ~ χ²_d``, a particle has
    ``N_i ≈ num_peak · exp(-s/2)`` R2-neighbours (``num_peak``: at the mode), uses
    the ensemble when the R1 test passes (``pass_r1``) and ``N_i >= N*``, i.e.
    ``s <= q = 2 log(num_peak / N*)``, and then (:func:`ensemble_noise_constant`)
    ``h|e|²/(2d) = h K μ s e^{s/2} / (2 d num_peak)``. Averaging over ``s``::

        v = pass_r1 · h K μ / (2 d num_peak) · ∫_0^q s e^{s/2} χ²_d(s) ds
          = pass_r1 · h K μ q^{d/2+1} / (2 d num_peak (d/2 + 1) 2^{d/2} Γ(d/2)).

    The M_f test and the guard only remove users: ``v`` is an upper estimate.

    Args:
      dim: ``d``.
      step_size: ``h``.
      noise_constant: ``K`` of :func:`ensemble_noise_constant`.
      pass_r1: the R1 test's pass probability.
      num_peak: the R2-neighbours of a particle at the mode.
      n_star: N*.
      mu: the proxy's precision ``μ``.

    Returns:
      ``v``, a float (0 when ``N* >= num_peak``).
    """
    if n_star >= num_peak:
        return 0.0
    q = 2.0 * math.log(num_peak / max(n_star, 1e-300))
    half = 0.5 * dim
    return (
        pass_r1
        * step_size
        * noise_constant
        * mu
        * q ** (half + 1.0)
        / (2.0 * dim * num_peak * (half + 1.0) * 2.0**half * math.gamma(half))
    )


class CEnLMCParams(NamedTuple):
    """Suggested CEnLMC parameters and why (see :func:`suggest_cenlmc_params`).

    Attributes:
      eta: η, ready for ``cenlmc_step``.
      r1: R1.
      r2: R2.
      n_star: N*.
      m_f: M_f.
      expected_ensemble_fraction: predicted stationary fraction of particles
        using the ensemble force (product of the three pass probabilities).
      pass_r1: predicted pass probability of the R1 test.
      pass_m_f: predicted pass probability of the M_f test.
      pass_n_star: predicted pass probability of the N* test.
      typical_num_neighbours: predicted mean ``N_i`` under the Gaussian proxy
        (None without ``num_particles``).
      typical_ball_neighbours: predicted mean number of particles in the η-ball
        (None without ``num_particles``); below ``ball_min`` (5) the reasoning
        says the ensemble will not be used.
      exp_factor: ``exp(R1 (R1 + R2) / (2h))`` of Theorem 3.3.
      n_star_corollary: N* of Corollary 3.1 for accuracy ``epsilon`` (order of
        magnitude).
      bias_bound: ``κ η d``, the finite-difference term of Theorem 3.3.
      noise_constant: ``K`` of :func:`ensemble_noise_constant` for these η, R1,
        R2 (relative squared error of the ensemble force times the number of
        R2-neighbours).
      variance_inflation: predicted relative inflation of the stationary variance
        by the ensemble noise, :func:`predicted_variance_inflation` (None without
        ``num_particles``); kept at most ``max_variance_inflation`` by the choice
        of N*.
      reasoning: a readable account of every choice.
    """

    eta: float
    r1: float
    r2: float
    n_star: int
    m_f: float
    expected_ensemble_fraction: float
    pass_r1: float
    pass_m_f: float
    pass_n_star: float
    typical_num_neighbours: float | None
    typical_ball_neighbours: float | None
    exp_factor: float
    n_star_corollary: float
    bias_bound: float
    noise_constant: float
    variance_inflation: float | None
    reasoning: str


def suggest_cenlmc_params(
    dim: int,
    step_size: float,
    *,
    L: float | None = None,
    mu: float | None = None,
    num_particles: int | None = None,
    epsilon: float = 1.0,
    rho: float = 0.5,
    r1_pass: float = 0.7,
    n_star_pass: float = 0.9,
    m_f_pass: float = 0.99,
    n_star_min: int = 5,
    n_star_default: int = 20,
    ball_min: int = 5,
    max_variance_inflation: float = 0.02,
    max_neighbours: float | None = 256,
) -> CEnLMCParams:
    """Propose ``η, R1, R2, N*, M_f`` for CEnLMC with step size ``h``.

    The theory (Theorem 3.3, μ-convex f, κ = L/μ) bounds the distance to LMC by::

        O( sqrt(R1^d κ M_f d / (μ η^d N*)) · exp(R1(R1+R2)/(2h))  +  κ η d ),

    and Corollary 3.1 turns it into ``M_f = (N*)^ρ``, ``η < ε/(κd)`` and a
    value of N* that is an order of magnitude only (reported as
    ``n_star_corollary``; it is usually astronomically large). The suggestion
    below follows the structure of the bound and sets the constants from the
    pass probabilities of the three tests (Theorem 3.5), for a Gaussian proxy
    target ``N(x*, I/μ)``:

    * ``R1``: ``|x_i - w_i| = sqrt(2h)|ξ|`` with ``|ξ|² ~ χ²_d``, so
      ``R1 = sqrt(2h · χ²_d.ppf(r1_pass))`` passes exactly a fraction
      ``r1_pass`` (default 0.7). R1 is of order ``sqrt(2hd)``, as the
      ``exp(R1(R1+R2)/2h)`` factor demands (it stays ``exp(O(d))``).
    * ``R2 = min(sqrt(hd), R1)``: a fraction ``1/sqrt(2)`` of the noise length
      ``sqrt(2hd)``: ``w``-neighbours closer than that are the ones whose
      ``x_j`` can land near ``x_i`` with a moderate weight ``1/p_j``; a
      neighbour at w-distance r has weight variance growing like
      ``exp(r²/(4h))``, so a larger R2 buys neighbours with noisier terms.
    * ``η = min(sqrt(hd), ε/(κ d))``: the worst weight ``1/p_j`` is
      ``exp((η + R1 + R2)²/(4h))`` (proof of Lemma 4.2), so η is taken of
      the same order as R1, R2 unless the finite-difference bias bound
      ``η < ε/(κd)`` of Corollary 3.1 asks for less. (For d = 2 both scales
      are ``sqrt(2h)``, docs/algorithms.md's choice.)
    * ``N*``: with N particles, ``N_i ≈ (N-1) V_{R2} p(w_i)``; under the proxy
      the test ``N_i >= N*`` passes for a fraction ``n_star_pass`` (0.9) of
      particles when
      ``N* = (N-1) V_{R2} (2π/μ)^{-d/2} exp(-χ²_d.ppf(n_star_pass)/2)``.
      Then the **noise budget**: Theorem 3.3's first term, the ensemble
      force's noise, falls like ``1/N*``; with its constant
      (:func:`ensemble_noise_constant`) it inflates the stationary variance by
      ``v`` (:func:`predicted_variance_inflation`), and N* is raised, if
      needed, to the smallest value with ``v <= max_variance_inflation``
      (default 0.02: the sd biased by at most ~1%, below unadjusted
      Langevin's own 1.3% at h = 0.05 and well below the gradient audit's
      flag, ``AUDIT_BIAS_THRESHOLD`` of :mod:`cenlmc_jax.ensemble.audit`). In
      d <= 2 the pass-probability rule already meets the budget; in d = 3 the
      weights ``1/p_j`` are heavier (``E exp(|a+b+u|²/4h)`` grows with d) and the
      balls emptier, and the budget raises N* and lowers the predicted fraction
      (the measurements on the Darcy problem: ``benchmarks/results/inverse.md``).
      Clipped to ``[n_star_min, N-1]``; without ``num_particles``,
      ``n_star_default`` (20) and the reasoning says how many particles that
      needs.
    * η-ball occupancy: the force sums over x-neighbours within η: with
      ``num_particles`` the mean count ``(N-1) V_η (4π/μ)^{-d/2}`` is
      predicted; the predicted fraction includes the chance that the ball is
      empty (Poisson), and below ``ball_min`` the reasoning says that the
      ensemble will not be used (CEnLMC is then LMC: the sampler's guard sends
      particles with an empty ball to their gradient) and how many particles
      would fill it. The suggestion never predicts ensemble use from an empty
      ball.
    * **Scaling with N** (``max_neighbours``, default 256): at fixed radii the
      typical R2-neighbour count ``(N-1) V_{R2} (4π/μ)^{-d/2}`` grows like N, and
      so does the work of a step (the block-sparse pair sums visit every pair
      within R2 in w and η in x: ``O(N²)``). When that count would exceed
      ``max_neighbours``, R2 and η are both shrunk by
      ``(max_neighbours / count)^{1/d}``: they fall like ``N^{-1/d}``, the
      neighbour counts (and N*) stay bounded, and a step costs ``O(N)`` pair
      terms (plus the ``O(N log N)`` spatial sort and the tile plan's box tests,
      ``O(N)`` up to N ~ 2^20; the exponent of N from 8192 to 2^20 at d = 2 is
      in benchmarks/results/waste.md). The larger ensemble then buys more
      particles per unit of the target, not a smaller force noise; the
      finite-difference bias ``κ η d`` falls with η. None keeps the radii of a
      small N at every N.
    * ``M_f = max((N*)^ρ, χ²_d.ppf(m_f_pass)/2)``: Corollary 3.1's
      ``(N*)^ρ`` (ρ = 1/2 as in Theorem 3.5), but never so small that typical
      particles fail: for a Gaussian ``f - f* ~ χ²_d/2`` exactly, so the test
      passes with probability ``m_f_pass`` (0.99).

    Unknown ``L``/``mu`` default to 1 (κ = 1): the formulas then assume a
    target of unit scale: standardise the problem, or pass the constants.

    Checked on the configuration of docs/algorithms.md §4 (2-D standard Gaussian,
    h = 0.05, N = 4000) by ``tests/ensemble/test_f_star.py``.

    Args:
      dim: ``d >= 1``.
      step_size: ``h > 0``.
      L: the largest curvature (None: 1).
      mu: the smallest curvature, the proxy's precision (None: 1).
      num_particles: N (None: ``n_star_default`` and no occupancy prediction).
      epsilon: Corollary 3.1's accuracy ``ε``.
      rho: Corollary 3.1's ``ρ`` in ``M_f = (N*)^ρ``.
      r1_pass: the R1 test's pass probability.
      n_star_pass: the N* test's pass probability.
      m_f_pass: the M_f test's pass probability.
      n_star_min: the smallest N* suggested.
      n_star_default: N* without ``num_particles``.
      ball_min: the mean η-ball count below which the ensemble is said unused.
      max_variance_inflation: the noise budget ``v``.
      max_neighbours: the largest typical R2-neighbour count the radii give
        (above: R2 and η shrunk with N, as said), or None.

    Returns:
      A :class:`CEnLMCParams`, with the reasoning.

    Raises:
      ValueError: a parameter out of range.
    """
    dim = check_int(dim, "dim", minimum=1)
    check_positive(step_size, "step_size")
    check_positive(epsilon, "epsilon")
    for name, value in (
        ("rho", rho),
        ("r1_pass", r1_pass),
        ("n_star_pass", n_star_pass),
        ("m_f_pass", m_f_pass),
    ):
        if not (0.0 < float(value) < 1.0):
            raise ValueError(f"{name} must lie in (0, 1); got {value!r}.")
    n_star_min = check_int(n_star_min, "n_star_min", minimum=1)
    ball_min = check_int(ball_min, "ball_min", minimum=1)
    n_star_default = check_int(n_star_default, "n_star_default", minimum=1)
    check_positive(max_variance_inflation, "max_variance_inflation")
    if max_neighbours is not None:
        check_positive(max_neighbours, "max_neighbours")
    L_ = 1.0 if L is None else float(L)
    mu_ = 1.0 if mu is None else float(mu)
    check_positive(L_, "L")
    check_positive(mu_, "mu")
    if mu_ > L_:
        raise ValueError(
            f"mu must be <= L (strong convexity below smoothness); got mu={mu_}, "
            f"L={L_}."
        )
    if num_particles is not None:
        num_particles = check_int(num_particles, "num_particles", minimum=2)
    h, d = float(step_size), dim
    kappa = L_ / mu_
    notes = []
    if L is None or mu is None:
        notes.append(
            "L and/or mu unknown: using L = mu = 1 (a unit-scale, well-conditioned "
            "target)."
        )
    eta, r1, r2 = _suggest_radii(d, h, r1_pass, epsilon, kappa, notes)
    if num_particles is not None and max_neighbours is not None:
        eta, r2 = _bounded_neighbours(
            d, num_particles, eta, r2, mu_, float(max_neighbours), notes
        )
    noise_k = ensemble_noise_constant(d, h, eta, r1, r2)
    if num_particles is not None:
        n_star, pass_n, typical, inflation = _suggest_n_star(
            d,
            h,
            num_particles,
            r1_pass,
            n_star_pass,
            n_star_min,
            max_variance_inflation,
            mu_,
            r2,
            noise_k,
            notes,
        )
        ball_mean, pass_ball = _ball_occupancy(
            d, num_particles, eta, mu_, ball_min, notes
        )
    else:
        n_star, pass_n, typical, inflation, ball_mean, pass_ball = (
            n_star_default,
            n_star_pass,
            None,
            None,
            None,
            1.0,
        )
        needed = 1 + n_star / (
            ball_volume(d, r2)
            * (2.0 * math.pi / mu_) ** (-0.5 * d)
            * math.exp(-0.5 * chi2_ppf(n_star_pass, d))
        )
        notes.append(
            f"N* = {n_star} (default, num_particles not given); N_i >= N* for "
            f"{n_star_pass:.0%} of particles needs N >= {math.ceil(needed)}."
        )
    m_f_chi = 0.5 * chi2_ppf(m_f_pass, d)
    m_f = max(n_star**rho, m_f_chi)
    pass_mf = float(chi2_cdf(2.0 * m_f, d))
    notes.append(
        f"M_f = max(N*^rho = {n_star**rho:.3g}, chi2_{d}.ppf({m_f_pass})/2 = "
        f"{m_f_chi:.3g}) = {m_f:.3g}: a Gaussian has f - f* ~ chi2_d/2, so "
        f"{pass_mf:.1%} pass."
    )
    expo, n_cor = _corollary_n_star(d, h, eta, r1, r2, kappa, mu_, epsilon, rho, notes)
    frac = r1_pass * pass_mf * pass_n * pass_ball
    notes.append(
        f"Predicted stationary ensemble fraction ~ {r1_pass:.2f} x {pass_mf:.3f} x "
        f"{pass_n:.2f} x {pass_ball:.2f} (ball not empty) = {frac:.2f}."
    )
    return CEnLMCParams(
        eta=float(eta),
        r1=float(r1),
        r2=float(r2),
        n_star=int(n_star),
        m_f=float(m_f),
        expected_ensemble_fraction=float(frac),
        pass_r1=float(r1_pass),
        pass_m_f=pass_mf,
        pass_n_star=float(pass_n),
        typical_num_neighbours=None if typical is None else float(typical),
        typical_ball_neighbours=None if ball_mean is None else float(ball_mean),
        exp_factor=math.exp(expo),
        n_star_corollary=n_cor,
        bias_bound=kappa * eta * d,
        noise_constant=float(noise_k),
        variance_inflation=None if inflation is None else float(inflation),
        reasoning="\n".join(notes),
    )


def _suggest_radii(
    d: int, h: float, r1_pass: float, epsilon: float, kappa: float, notes: list
):
    """``η, R1, R2`` of :func:`suggest_cenlmc_params` (its docstring), with the
    reasoning appended to ``notes``.
    """
    scale = math.sqrt(h * d)
    r1 = math.sqrt(2.0 * h * chi2_ppf(r1_pass, d))
    notes.append(
        f"R1 = sqrt(2h chi2_{d}.ppf({r1_pass})) = {r1:.4g}: sqrt(2h)|xi| <= R1 for "
        f"{r1_pass:.0%} of particles."
    )
    r2 = min(scale, r1)
    notes.append(
        f"R2 = min(sqrt(hd), R1) = {r2:.4g}: w-neighbours within 1/sqrt(2) of the "
        "noise length sqrt(2hd)."
    )
    eta_bias = epsilon / (kappa * d)
    eta = min(scale, eta_bias)
    notes.append(
        f"eta = min(sqrt(hd) = {scale:.4g}, eps/(kappa d) = {eta_bias:.4g}) = "
        f"{eta:.4g}: same order as R1, R2 in the worst weight exp((eta+R1+R2)^2/(4h)), "
        "and within the finite-difference bias bound."
    )
    return eta, r1, r2


def _bounded_neighbours(d, num_particles, eta, r2, mu_, max_neighbours, notes: list):
    """``(η, R2)`` shrunk by one factor so that the typical R2-neighbour count
    ``(N-1) V_{R2} (4π/μ)^{-d/2}`` is at most ``max_neighbours`` (unchanged below).
    """
    typical = (
        (num_particles - 1) * ball_volume(d, r2) * (4.0 * math.pi / mu_) ** (-0.5 * d)
    )
    if typical <= max_neighbours:
        return eta, r2
    scale = (max_neighbours / typical) ** (1.0 / d)
    notes.append(
        f"R2 and eta shrunk by (max_neighbours / {typical:.4g})^(1/d) = {scale:.4g} "
        f"(to {r2 * scale:.4g}, {eta * scale:.4g}): at N = {num_particles} the typical "
        f"R2-neighbour count would be {typical:.4g} > max_neighbours = "
        f"{max_neighbours:g}, and a step's pair work grows with it; bounded, it is "
        "O(N)."
    )
    return eta * scale, r2 * scale


def _suggest_n_star(
    d,
    h,
    num_particles,
    r1_pass,
    n_star_pass,
    n_star_min,
    max_variance_inflation,
    mu_,
    r2,
    noise_k,
    notes: list,
):
    """N* from the pass rule and the noise budget: ``(n_star, pass_n, typical N_i,
    predicted inflation)``.
    """
    v_r2 = ball_volume(d, r2)
    peak = (2.0 * math.pi / mu_) ** (-0.5 * d)  # proxy N(x*, I/mu): density at the mode
    num_peak = (
        (num_particles - 1) * v_r2 * peak
    )  # R2-neighbours of a particle at the mode
    n_cal = num_peak * math.exp(-0.5 * chi2_ppf(n_star_pass, d))
    # the noise budget: v(N*) = c · q^{d/2+1} with q = 2 log(num_peak / N*), c the value
    # at q = 1
    c = predicted_variance_inflation(
        d, h, noise_k, r1_pass, num_peak, num_peak * math.exp(-0.5), mu=mu_
    )
    n_noise = num_peak * math.exp(
        -0.5 * (max_variance_inflation / c) ** (1.0 / (0.5 * d + 1.0))
    )
    n_star = int(
        min(max(round(n_cal), math.ceil(n_noise), n_star_min), num_particles - 1)
    )
    # mean density of the proxy under itself: (4π/mu)^{-d/2}
    typical = (num_particles - 1) * v_r2 * (4.0 * math.pi / mu_) ** (-0.5 * d)
    pass_n = float(chi2_cdf(2.0 * math.log(max(num_peak / n_star, 1.0)), d))
    inflation = predicted_variance_inflation(
        d, h, noise_k, r1_pass, num_peak, n_star, mu=mu_
    )
    notes.append(
        f"N* = {n_star}: with N = {num_particles}, N_i ~ (N-1) V_R2 p(w) (typical "
        f"{typical:.3g}); N_i >= N* holds for about {pass_n:.0%} of particles under "
        "the proxy."
    )
    if math.ceil(n_noise) > max(round(n_cal), n_star_min):
        notes.append(
            f"N* raised from {max(round(n_cal), n_star_min)} (the {n_star_pass:.0%} "
            "pass rule) by the noise budget: the ensemble force's relative squared "
            f"error is K/N_i with K = {noise_k:.3g}, so its noise would inflate the "
            f"variance by more than {max_variance_inflation:g}."
        )
    notes.append(
        f"Predicted variance inflation by the ensemble noise: {inflation:.3g} (the sd "
        f"by ~{math.sqrt(max(1 + inflation, 0.0)) - 1:.2%}; budget "
        f"{max_variance_inflation:g}; the gradient audit measures it as "
        "info.audit_variance_inflation)."
    )
    if n_cal < n_star_min:
        notes.append(
            "N is too small for the ensemble to pay off at this step size: N* would "
            f"be {n_cal:.2g} < {n_star_min}; increase N."
        )
    return n_star, pass_n, typical, inflation


def _ball_occupancy(d, num_particles, eta, mu_, ball_min, notes: list):
    """Mean η-ball count under the proxy and the chance it is not empty: ``(ball_mean,
    pass_ball)``.

    The force sums over x-neighbours within η (and R2 in w), so an empty ball gives a
    force of exactly 0. Mean count: ``(N-1) V_η (4π/μ)^{-d/2}`` (the proxy's mean
    density); Poisson for the chance of an empty ball. η stays within the bias bound;
    the reasoning says when the ball is too empty for the ensemble to be used.
    """
    density = (4.0 * math.pi / mu_) ** (-0.5 * d)
    ball_mean = (num_particles - 1) * ball_volume(d, eta) * density
    if ball_mean < ball_min:
        notes.append(
            f"N = {num_particles} is too small in d = {d}: the eta-ball holds "
            f"{ball_mean:.2g} particles on average at eta = {eta:.4g}, so the ensemble "
            "is rarely used and CEnLMC is LMC here (the guard sends particles with an "
            "empty ball to their gradient); about "
            f"{1 + ball_min / (ball_volume(d, eta) * density):.3g} particles would "
            f"hold {ball_min}."
        )
    return ball_mean, 1.0 - math.exp(-ball_mean)


def _corollary_n_star(d, h, eta, r1, r2, kappa, mu_, epsilon, rho, notes: list):
    """Theorem 3.3's factor ``R1(R1+R2)/(2h)`` and Corollary 3.1's N* (an order of
    magnitude).
    """
    expo = r1 * (r1 + r2) / (2.0 * h)
    log_nc = (
        d * math.log(r1)
        + math.log(kappa)
        + 2.0 * math.log(d)
        - math.log(mu_)
        - d * math.log(eta)
        - 2.0 * math.log(epsilon)
        + expo
    ) / (1.0 - rho)
    n_cor = math.exp(min(log_nc, 700.0))
    notes.append(
        f"Theorem 3.3 factor exp(R1(R1+R2)/2h) = exp({expo:.3g}) = "
        f"{math.exp(expo):.3g}; Corollary 3.1 would ask N* ~ {n_cor:.3g} for eps = "
        f"{epsilon} (order of magnitude only; the bound is loose)."
    )
    return expo, n_cor


# --------------------------------------------------------------------------
# The burn-in tuner.
# --------------------------------------------------------------------------


class TunedCEnLMC(NamedTuple):
    """What :func:`tune_cenlmc` returns.

    Attributes:
      params: dict ``eta, r1, r2, n_star, m_f`` (ready for ``cj.cenlmc``).
      algorithm: ``cj.cenlmc(...)`` with those parameters (its default audit: the
        ``biased`` flag stays on).
      state: the chain's state after the burn-in, the last ``steps_per_trial``
        steps of which ran with the chosen parameters (continue sampling from it).
      ensemble_fraction: measured for the choice in its trial (mean fraction).
      noise_error: measured for the choice (median audit noise error).
      drift_ratio: measured for the choice (median audit drift ratio).
      variance_inflation: measured for the choice (mean variance inflation).
      trials: one dict per candidate with the same measurements.
      reasoning: a readable account of the choice.
      grad_evals: the gradients the whole burn-in computed
        (``info.grad_evals_padded`` summed over every step of every trial: buffers'
        padding and the audit included), the tuning's cost to set against what the
        ensemble saves afterwards.
    """

    params: dict
    algorithm: SamplingAlgorithm
    state: CEnLMCState
    ensemble_fraction: float
    noise_error: float
    drift_ratio: float
    variance_inflation: float
    trials: list
    reasoning: str
    grad_evals: int = 0


#: Below this chosen ensemble fraction :func:`tune_cenlmc` warns: the ensemble is
#: (nearly) unused and CEnLMC is LMC at the price of N values per step more.
LOW_FRACTION = 0.05
#: :func:`tune_cenlmc` skips its grid when both the predicted best fraction of any
#: candidate and the first burn-in's measured fraction are below this: no candidate can
#: use the ensemble (issue 17: a whole grid run on a 4-parameter model whose predicted
#: fraction was ~0).
NEGLIGIBLE_FRACTION = 0.01


def _trial_runner(
    logdensity_fn, step_size, n_star, m_f, num_steps, audit_size, grad_fn, kwargs
):
    """One compiled program running ``num_steps`` CEnLMC steps with traced ``eta, r1,
    r2``.
    """

    @jax.jit
    def run(key, state, eta, r1, r2):
        def body(st, t):
            st, info = cenlmc_step(
                jax.random.fold_in(key, t),
                st,
                logdensity_fn,
                step_size,
                eta,
                r1,
                r2,
                n_star,
                m_f,
                audit_size=audit_size,
                grad_fn=grad_fn,
                **kwargs,
            )
            return st, (
                info.ensemble_fraction,
                info.audit_noise_error,
                info.audit_drift_ratio,
                info.audit_variance_inflation,
                info.biased,
                info.diverged,
                info.grad_evals_padded,
            )

        return lax.scan(body, state, jnp.arange(num_steps))

    return run


def _check_tuning_args(
    rng_key,
    logdensity_fn,
    positions,
    step_size,
    target_fraction,
    max_noise_error,
    max_variance_inflation,
    steps_per_trial,
    audit_size,
    r1_passes,
    radius_scales,
):
    check_key(rng_key)
    check_callable(logdensity_fn, "logdensity_fn", "x -> scalar log density")
    x = check_positions(positions, min_particles=2)
    check_positive(step_size, "step_size")
    if not 0.0 < float(target_fraction) < 1.0:
        raise ValueError(
            f"target_fraction must lie in (0, 1); got {target_fraction!r}."
        )
    check_positive(max_noise_error, "max_noise_error")
    check_positive(max_variance_inflation, "max_variance_inflation")
    steps_per_trial = check_int(steps_per_trial, "steps_per_trial", minimum=4)
    audit_size = check_int(audit_size, "audit_size", minimum=1)
    for p in r1_passes:
        if not 0.0 < float(p) < 1.0:
            raise ValueError(
                f"r1_passes must hold probabilities in (0, 1); got {r1_passes!r}."
            )
    for c in radius_scales:
        check_positive(c, "radius_scales (each)")
    return x, steps_per_trial, audit_size


def _trial_record(outputs, half, **fields) -> dict:
    """A candidate's measurements over the second half of its trial."""
    frac, noise, ratio, inflation, flagged, diverged, _ = (
        np.asarray(a) for a in outputs
    )

    def tail(a, reduce, empty):
        a = a[half:]
        return float(reduce(a)) if np.any(np.isfinite(a)) else empty

    return dict(
        fields,
        ensemble_fraction=float(np.mean(frac[half:])),
        noise_error=tail(noise, np.nanmedian, 0.0),
        drift_ratio=tail(ratio, np.nanmedian, 1.0),
        variance_inflation=tail(inflation, np.nanmean, 0.0),
        unstable=bool(np.any(flagged) or np.any(diverged)),
    )


def _choose(trials, base, target_fraction, max_noise_error, max_variance_inflation):
    """The rule of the module docstring: (best trial's measurements, params, a note)."""
    ok = [
        t
        for t in trials
        if t["noise_error"] <= max_noise_error
        and not t["unstable"]
        and t["variance_inflation"] <= max_variance_inflation
    ]
    caps = (
        f"variance inflation <= {max_variance_inflation:g} and drift error <= "
        f"{max_noise_error:g}"
    )
    if not ok:
        best = dict(
            ensemble_fraction=0.0,
            noise_error=float("nan"),
            drift_ratio=float("nan"),
            variance_inflation=float("nan"),
        )
        params = dict(
            eta=base.eta, r1=0.0, r2=base.r2, n_star=base.n_star, m_f=base.m_f
        )
        return (
            best,
            params,
            (
                f"no candidate kept {caps} (never flagged); the ensemble is switched "
                "off (r1 = 0): CEnLMC is LMC on this target at this N."
            ),
        )
    reach = [t for t in ok if t["ensemble_fraction"] >= target_fraction]
    if reach:
        best = min(
            reach, key=lambda t: (t["variance_inflation"], -t["ensemble_fraction"])
        )
        note = (
            f"chose the smallest variance inflation among the {len(reach)} candidates "
            f"reaching the target fraction {target_fraction:.2f} with {caps}."
        )
    else:
        best = max(ok, key=lambda t: t["ensemble_fraction"])
        note = (
            f"no candidate reached the target fraction {target_fraction:.2f} with "
            f"{caps}; chose the largest fraction, {best['ensemble_fraction']:.2f}."
        )
    return (
        best,
        dict(
            eta=best["eta"],
            r1=best["r1"],
            r2=best["r2"],
            n_star=base.n_star,
            m_f=base.m_f,
        ),
        note,
    )


def tune_cenlmc(
    rng_key: PRNGKey,
    logdensity_fn: LogDensityFn,
    positions: ArrayLike,
    step_size: float,
    *,
    target_fraction: float = 0.6,
    max_noise_error: float = 0.25,
    max_variance_inflation: float = 0.03,
    f_star: float | None = None,
    L: float | None = None,
    mu: float | None = None,
    steps_per_trial: int = 40,
    audit_size: int = 64,
    r1_passes: tuple = (0.7, 0.8, 0.9, 0.95),
    radius_scales: tuple = (1.0, 0.75, 0.5),
    grad_fn: Callable | None = None,
    skip_hopeless: bool = True,
    **cenlmc_kwargs: Any,
) -> TunedCEnLMC:
    """Burn in CEnLMC while choosing ``η, R1, R2`` for ``target_fraction``.

    See the module docstring. The burn-in costs
    ``(len(r1_passes)·len(radius_scales) + 2)·steps_per_trial`` steps (560 by
    default) and ``audit_size`` extra gradients per step; the gradients it computed
    are ``TunedCEnLMC.grad_evals``. A chosen fraction below :data:`LOW_FRACTION`
    (the ensemble unused) is warned about (``UserWarning``), with the reason.

    Args:
      rng_key: key of the burn-in.
      logdensity_fn: as for ``cj.cenlmc``.
      positions: the ensemble, ``(N, d)``.
      step_size: ``h``, as for ``cj.cenlmc``.
      target_fraction: the ensemble fraction asked for, in (0, 1).
      max_noise_error: the largest acceptable median drift error per step, in
        noise lengths ``sqrt(2hd)`` (measured by the gradient audit).
      max_variance_inflation: the largest acceptable relative variance inflation
        by the ensemble noise (the audit's mean ``info.audit_variance_inflation``
        over a trial's second half).
      f_star: as for ``cj.cenlmc``.
      L: as for :func:`suggest_cenlmc_params`.
      mu: as for :func:`suggest_cenlmc_params`.
      steps_per_trial: steps per candidate (the fraction and error are measured
        over the second half of each trial).
      audit_size: audited particles per step during the burn-in.
      r1_passes: the grid's R1 pass probabilities (module docstring).
      radius_scales: the grid's scales of ``η, R2`` (module docstring).
      grad_fn: passed to ``cj.cenlmc``.
      skip_hopeless: skip the grid (and the settling run) when it cannot help
        (:func:`_hopeless`): the suggested parameters are then judged on the
        first burn-in alone, by the same rule.
      **cenlmc_kwargs: passed to ``cj.cenlmc`` (``method``, ``mesh``, ...).

    Returns:
      A :class:`TunedCEnLMC`.

    Raises:
      ValueError: a bad argument, checked before any work.
    """
    x, steps_per_trial, audit_size = _check_tuning_args(
        rng_key,
        logdensity_fn,
        positions,
        step_size,
        target_fraction,
        max_noise_error,
        max_variance_inflation,
        steps_per_trial,
        audit_size,
        r1_passes,
        radius_scales,
    )
    skip_hopeless = check_bool(skip_hopeless, "skip_hopeless")
    n, d = x.shape
    h = float(step_size)
    base = suggest_cenlmc_params(d, h, L=L, mu=mu, num_particles=n)
    run = _trial_runner(
        logdensity_fn,
        h,
        base.n_star,
        base.m_f,
        steps_per_trial,
        min(audit_size, n),
        grad_fn,
        cenlmc_kwargs,
    )
    grads = 0

    def trial(k, state, eta, r1, r2):
        nonlocal grads
        radii = (jnp.asarray(v, x.dtype) for v in (eta, r1, r2))
        out_state, outputs = run(jax.random.fold_in(rng_key, k), state, *radii)
        grads += int(np.sum(np.asarray(outputs[-1], np.int64)))
        return out_state, outputs

    # a first burn-in with the suggested values; every candidate then starts from there,
    # so a bad candidate (an unstable ensemble) cannot damage the chain the others are
    # measured on
    start, first = trial(
        0, cenlmc_init(x, logdensity_fn, f_star), base.eta, base.r1, base.r2
    )
    start = start._replace(audit=fresh_audit(x.dtype))
    first = _trial_record(
        first,
        steps_per_trial // 2,
        eta=base.eta,
        r1=base.r1,
        r2=base.r2,
        r1_pass=float(base.pass_r1),
        radius_scale=1.0,
    )
    if skip_hopeless and _hopeless(base, first, r1_passes):
        return _untuned(
            logdensity_fn,
            h,
            base,
            first,
            start,
            f_star,
            grad_fn,
            grads,
            target_fraction,
            max_noise_error,
            max_variance_inflation,
            steps_per_trial,
            cenlmc_kwargs,
        )
    trials = []
    for scale in radius_scales:
        for p in r1_passes:
            eta, r2, r1 = (
                base.eta * scale,
                base.r2 * scale,
                math.sqrt(2.0 * h * chi2_ppf(float(p), d)),
            )
            _, outputs = trial(len(trials) + 1, start, eta, r1, r2)
            trials.append(
                _trial_record(
                    outputs,
                    steps_per_trial // 2,
                    eta=eta,
                    r1=r1,
                    r2=r2,
                    r1_pass=float(p),
                    radius_scale=float(scale),
                )
            )
    best, params, note = _choose(
        trials, base, target_fraction, max_noise_error, max_variance_inflation
    )
    notes = [
        f"suggested: eta={base.eta:.4g}, R1={base.r1:.4g}, R2={base.r2:.4g}, "
        f"N*={base.n_star}, M_f={base.m_f:.3g}; {len(trials)} candidates x "
        f"{steps_per_trial} steps, audit of {audit_size}.",
        note,
    ]
    # settle the chain with the chosen parameters, then hand it over with a fresh audit
    state, outputs = trial(
        len(trials) + 1, start, params["eta"], params["r1"], params["r2"]
    )
    diverged = np.asarray(outputs[5])
    # never hand over non-finite particles: keep the burn-in's state (the trials' start)
    if diverged.any():
        state = start
        notes.append(
            "the settling run with the chosen parameters diverged at its step "
            f"{int(np.argmax(diverged))} (a particle left the region where the step "
            "size is stable); the state handed over is the first burn-in's, before "
            "the trials."
        )
    state = state._replace(audit=fresh_audit(x.dtype))
    notes.append(
        f"measured: ensemble fraction {best['ensemble_fraction']:.3f}, variance "
        f"inflation {best['variance_inflation']:.3g}, drift error "
        f"{best['noise_error']:.3g} noise lengths, drift ratio "
        f"{best['drift_ratio']:.3g}; the burn-in computed {grads} gradients."
    )
    if best["ensemble_fraction"] < LOW_FRACTION:
        warnings.warn(
            "tune_cenlmc: the chosen ensemble fraction is "
            f"{best['ensemble_fraction']:.2f} (below {LOW_FRACTION}): the ensemble is "
            "(nearly) unused, so CEnLMC is LMC here and its N values per step are "
            f"wasted; use cj.lmc, more particles, or a better-scaled target. {note}",
            UserWarning,
            stacklevel=2,
        )
    return _tuned(
        logdensity_fn,
        h,
        params,
        best,
        state,
        f_star,
        grad_fn,
        trials,
        notes,
        grads,
        cenlmc_kwargs,
    )


def _hopeless(base, first: dict, r1_passes: tuple) -> bool:
    """Whether no candidate of the grid can use the ensemble: both below
    :data:`NEGLIGIBLE_FRACTION`.

    Predicted: the suggestion's fraction ``pass_r1 · pass_M_f · pass_N* · pass_ball``
    with the R1 pass raised to the grid's largest ``p`` (the grid's radius scales are at
    most 1 and only lower the neighbour counts, so no candidate is predicted above it).
    Measured: the first burn-in's fraction (second half), with the suggested values.
    """
    best_r1 = max(max(float(p) for p in r1_passes), base.pass_r1)
    predicted = base.expected_ensemble_fraction * best_r1 / max(base.pass_r1, 1e-300)
    return (
        predicted < NEGLIGIBLE_FRACTION
        and first["ensemble_fraction"] < NEGLIGIBLE_FRACTION
    )


def _untuned(
    logdensity_fn,
    h,
    base,
    first,
    start,
    f_star,
    grad_fn,
    grads,
    target_fraction,
    max_noise_error,
    max_variance_inflation,
    steps_per_trial,
    cenlmc_kwargs,
) -> TunedCEnLMC:
    """:func:`tune_cenlmc`'s result without the grid.

    :func:`_choose` on the first burn-in alone, and its state.
    """
    best, params, note = _choose(
        [first], base, target_fraction, max_noise_error, max_variance_inflation
    )
    notes = [
        f"suggested: eta={base.eta:.4g}, R1={base.r1:.4g}, R2={base.r2:.4g}, "
        f"N*={base.n_star}, M_f={base.m_f:.3g}; grid skipped: the predicted fraction "
        f"({base.expected_ensemble_fraction:.3g}) and the first burn-in's "
        f"({first['ensemble_fraction']:.3g}) are below {NEGLIGIBLE_FRACTION}, which no "
        f"candidate can change; {steps_per_trial} steps run.",
        note,
        f"measured: ensemble fraction {best['ensemble_fraction']:.3f}; the burn-in "
        f"computed {grads} gradients.",
    ]
    warnings.warn(
        f"tune_cenlmc: the ensemble fraction is {best['ensemble_fraction']:.2f} "
        f"(predicted {base.expected_ensemble_fraction:.2g}): the ensemble is unused, "
        "so CEnLMC is LMC here and its N values per step are wasted; use cj.lmc, more "
        f"particles, or a better-scaled target. {note}",
        UserWarning,
        stacklevel=3,
    )
    return _tuned(
        logdensity_fn,
        h,
        params,
        best,
        start,
        f_star,
        grad_fn,
        [],
        notes,
        grads,
        cenlmc_kwargs,
    )


def _tuned(
    logdensity_fn,
    h,
    params,
    best,
    state,
    f_star,
    grad_fn,
    trials,
    notes,
    grads,
    cenlmc_kwargs,
):
    """The :class:`TunedCEnLMC` of the chosen ``params`` (``best``: their measured
    trial), with its sampler.
    """
    algo = cenlmc(
        logdensity_fn,
        h,
        params["eta"],
        params["r1"],
        params["r2"],
        params["n_star"],
        params["m_f"],
        f_star=state.f_star if f_star is None else f_star,
        grad_fn=grad_fn,
        **cenlmc_kwargs,
    )
    return TunedCEnLMC(
        params,
        algo,
        state,
        best["ensemble_fraction"],
        best["noise_error"],
        best["drift_ratio"],
        best["variance_inflation"],
        trials,
        "\n".join(notes),
        grads,
    )
