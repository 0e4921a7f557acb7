"""The kinetic phase of ``cj.langevin_warmup``'s exact default.

After the Laplace start (:mod:`cenlmc_jax.adaptation.langevin_warmup`: ``N`` particles
drawn from ``N(mode, M₀)``, ``M₀ = H⁻¹``), the ensemble is moved in whitened
coordinates ``y = L⁻¹(x − m)``, ``M = L Lᵀ``, in two phases. The idea is LAPS's
(Robnik & Seljak 2026, BlackJAX's ``adaptation/laps.py``): let a kinetic sampler carry
the ensemble to the typical set fast, its step steered by an ensemble estimate every
step, with a stopping rule on the ensemble's own convergence, then hand it to a
Metropolis-adjusted sampler, which is exact.

**Resampling the Laplace start.** The Laplace draws miss the posterior's skew (their
mean is the mode). Where the importance weights ``π(y) / N(y; 0, I)`` are even
(effective sample size at least ``RESAMPLE_MIN_ESS · N``) the draws are resampled by
them (systematic resampling) before the first step: the values come from the pass
the kinetic phase makes at its start anyway, so it costs no gradient. Where the
weights are uneven (a tail the Gaussian is too narrow for) the draws are kept and the
kinetic phase moves them.

**Kinetic phase** (paper 2's complete recipe with ``D = [[0, 0], [0, γI]]`` and
``Q = [[0, −I], [I, 0]]``: underdamped Langevin, unit mass, full gradients), one OBABO
step of size ``ε`` per iteration::

    p ← c p + sqrt(1 − c²) ξ,   c = exp(−γ ε / 2)          (O)
    p ← p + ε/2 ∇log π_y(y);  y ← y + ε p;  p ← p + ε/2 ∇log π_y(y)   (BAB)
    p ← c p + sqrt(1 − c²) ξ'                              (O)

with ``γ = FRICTION`` (the whitened scale is about 1, so about critical damping), the
momenta of each round drawn from ``N(0, I)`` (from ``p = 0`` an ensemble already at
``π`` would first contract towards the mode, with too little kinetic energy). Each
particle's BAB part is then Metropolis-tested: accepted with probability
``min(1, e^{−ΔH})``, ``ΔH`` its energy error, and on rejection the particle stays and
its momentum flips (Horowitz's generalised HMC, 1991). At a fixed ``ε`` this step
leaves ``π(y) N(p; 0, I)`` invariant; LAPS runs this phase unadjusted, which lets a
few particles escape into a heavy tail (eight schools: the ensemble's ``E y²`` jumped
by hundreds of its standard errors between checks), and the test costs no gradient.
Each particle has its own step ``ε_i``. Their cap ``ε̄ = max_i ε_i`` is steered every
step so that the ensemble's ``E[ΔH²]`` stays at ``ENERGY_ERROR`` (MCLMC and LAPS steer
``E[ΔH²]/d``, their measure of an unadjusted step's bias; with the test it measures the
rejection rate, about ``0.4 sqrt(E[ΔH²])``, whatever ``d``):
``ε̄ ← ε̄ (target / E[ΔH²])^{1/6}`` (leapfrog's ``ΔH`` is ``O(ε³)``), the factor
clipped to ``[0.8, 1.25]`` and ``0.5`` after a step that gave a non-finite value. Each
``ε_i`` follows the same rule on its own running mean of ``ΔH²`` (the newest step
weighted ``SMOOTH``, each ``ΔH²`` capped at ``DH2_CAP``), and is kept ``<= ε̄``. A
proposal where ``log π`` is ``−inf`` (outside the support) is rejected and halves only
its particle's step; one where it is NaN or ``+inf`` halves ``ε̄`` too, and a phase
whose ``ε̄`` falls below ``COLLAPSED_STEP`` that way stops with a ``ValueError`` naming
the model and a point of the region (a step cannot cure it).
With one ``ε`` for all, a few particles in a stiff region (the Laplace draws in
eight schools' large-``τ`` tail, where the whitened curvature is large) dominate
``E[ΔH²]`` and shrink everyone's step by orders
of magnitude; with their own steps they move slowly and the rest at the bulk's step.
A particle's ``ε_i`` depends on its past, so the phase is not exactly ``π``-invariant;
it is a warm-up, and what it hands over is exact (below). The round's median ``ε_i`` is
the ``ε`` the stopping rule's spacing, the next round's start and the adjusted phase
use.

**Stopping rule.** Every ``max(check_every, 2 / (γ ε))`` steps (a time ``2/γ``,
about the relaxation time of a direction of unit scale) the ensemble's first and
second moments of ``y`` are compared with those at the check half the round ago (a
slow drift adds up over that lag, where two neighbouring checks would both look
quiet):
``δ = max_i max((Δ E y_i)² / Var y_i, (Δ E y_i²)² / Var y_i²)`` (the LAPS paper's
``b₂`` of the change, the variances the larger of the two checks'). The phase stops
after two successive checks with ``δ <=`` :func:`stop_threshold` (the noise level of
the largest of ``2d`` such ratios at stationarity) or after ``max_kinetic_steps``.
The ensemble's covariance in ``y`` (Stan's regularised estimate of the ``N``
particles, dense when ``N >= 4 d``, else diagonal) then says whether the coordinates
fit: if its eigenvalues spread more than 25 % beyond the sampling noise of an identity
(:func:`_spread`), ``M`` and ``m`` are re-estimated from the ensemble and the phase is
run again in the new coordinates (at most ``MAX_ROUNDS`` rounds); otherwise the ``M``
it ran with is kept. Round ``r`` also ends before it settles, after
``ROUND_STEPS · 2^r`` steps, when the covariance already says the coordinates are off
(Stan's doubling windows: the Laplace approximation of a hierarchical posterior is
often several times too narrow in its scale parameters).

**Then** the adjusted phase (:mod:`cenlmc_jax.adaptation.adjusted`) tunes HMC (or
MALA) on the ensemble in the final coordinates, and hands it over with every
parameter frozen.

Why not the two-system move (Chok, Lee, Paulin, Vasil 2025: halves preconditioning
each other) for the sampling phase? Its point is to keep adapting ``M`` while
sampling, exactly. Here ``M`` is frozen at the warm-up's end (as Stan does), which is
exact already; the gradient-free ensemble sampler ``cj.ensemble_mala`` is where the
halves are needed (its drift comes from the other half).

Every jitted program here takes the log density as a static argument, so a second
call with the same function reuses the compilation (issue 29: a second identical
``cj.langevin_warmup`` call costs a fraction of the first).
"""

from __future__ import annotations

import math
import warnings
from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from cenlmc_jax._keys import normal, split_keys
from cenlmc_jax.adaptation.coordinates import (
    STATIC,
    to_x,
    to_y,
    value_and_grad_y,
    values_y,
    whitening_factor,
)
from cenlmc_jax.diagnostics.convergence import ConvergenceWarning

__all__ = [
    "ENERGY_ERROR",
    "FRICTION",
    "MAX_ROUNDS",
    "STOP_B2",
    "stop_threshold",
    "KineticResult",
    "fit_dtype",
    "kinetic_phase",
]

#: ``E[ΔH²]`` per kinetic step (over the ensemble) that ``ε`` is steered to: with the
#: Metropolis test, a rejection rate of about ``0.4 sqrt(E[ΔH²]) ≈ 9 %``.
ENERGY_ERROR = 0.05
#: Weight of the newest step in each particle's running mean of ``ΔH²`` (its own
#: step's control, module docstring).
SMOOTH = 0.3
#: ``ΔH²`` enters a particle's running mean at most this large: a step far too long
#: (``ΔH`` in the tens) would otherwise keep shrinking its step for dozens of steps
#: after the step is right.
DH2_CAP = 1.0
#: ``γ`` of the kinetic phase, in whitened units (the posterior's scale there is ~1).
FRICTION = 1.0
#: The stopping rule's threshold on the change ``δ`` of the ensemble's moments.
STOP_B2 = 2.5e-3
#: Checks a round makes at least before it may stop (the lag of the stopping rule's
#: comparison is then at least 4 checks: on a banana, shorter lags stopped the phase
#: while the ensemble was still drifting along the ridge).
MIN_CHECKS = 8
#: The kinetic phase's first steps, each recorded in ``KineticResult.trajectory``
#: (after them, every ``check_every`` steps).
RECORD_EVERY_STEP = 20
#: The Laplace draws are importance-resampled towards ``π`` when their weights'
#: effective sample size is at least this fraction of ``N`` (:func:`_resample_laplace`).
RESAMPLE_MIN_ESS = 0.5
#: The ensemble's cap ``ε̄`` (whitened units) below which a phase that met the model's
#: NaN or ``+inf`` stops with an error (:func:`_model_trouble`): 19 halvings from 0.5.
COLLAPSED_STEP = 1e-6
#: Rounds of the kinetic phase, each in the coordinates whitened by the last.
MAX_ROUNDS = 5
#: Round ``r`` may end before it settles after ``ROUND_STEPS · 2^r`` steps when the
#: ensemble's covariance says the coordinates are off (Stan's doubling windows).
#: 10 reached non-centred eight schools' and the banana's first b2max < 0.01 sooner,
#: but the centred eight schools' runs then stopped earlier with log τ's sd further
#: below the posterior's (benchmarks/results/start_depth.md): kept at 25.
ROUND_STEPS = 25


class KineticResult(NamedTuple):
    """What :func:`kinetic_phase` returns (``positions`` in ``x``)."""

    positions: jax.Array
    inverse_mass_matrix: np.ndarray
    mean: np.ndarray
    #: the last round's median ``ε`` (whitened units).
    step_size: float
    kinetic_steps: int
    rounds: list
    notes: list
    #: ``(step, E x, E x²)`` along the phase.
    trajectory: list


_STATIC = STATIC


@partial(jax.jit, static_argnames=_STATIC)
def _kinetic_chunk(
    key, y, p, v, g, eps, e2, factor, mean, n, logdensity_fn, grad_fn, grad_mode
):
    """``n`` OBABO steps of the whole ensemble with the per-step control of the
    particles' steps ``ε_i`` (``eps``, ``(N,)``; ``e2`` their running mean ``ΔH²``),
    each particle's BAB part Metropolis-tested (generalised HMC); the count of
    rejections, and the first proposal ``y`` where the log density was NaN or
    ``+inf`` or its gradient not finite (``(found, y)``).

    A proposal where the log density is ``−inf`` (outside the support) is a rejection
    and shortens that particle's step only; any other non-finite value or gradient
    also halves the ensemble's cap ``ε̄``.
    """
    vg = partial(value_and_grad_y, logdensity_fn, grad_fn, grad_mode, factor, mean)

    def body(t, carry):
        y, p, v, g, eps, e2, undone, found, at = carry
        k1, k2, k3 = jax.random.split(jax.random.fold_in(key, t), 3)
        c = jnp.exp(-FRICTION * eps / 2)[:, None]
        s = jnp.sqrt(1 - c**2)
        e = eps[:, None]
        p = c * p + s * jax.random.normal(k1, p.shape, p.dtype)
        half = p + 0.5 * e * g
        y1 = y + e * half
        v1, g1 = vg(y1)
        p1 = half + 0.5 * e * g1
        dh = (-v1 + 0.5 * jnp.sum(p1**2, 1)) - (-v + 0.5 * jnp.sum(p**2, 1))
        fine = jnp.isfinite(dh) & jnp.all(jnp.isfinite(g1), 1)
        # -inf: a proposal outside the support, rejected (dh = +inf); NaN, +inf or a
        # gradient that is not finite at a finite value: trouble in the model
        outside = v1 == -jnp.inf
        broken = jnp.all(jnp.isfinite(y1), 1) & (
            jnp.isnan(v1)
            | (v1 == jnp.inf)
            | (jnp.isfinite(v1) & ~jnp.all(jnp.isfinite(g1), 1))
        )
        at = jnp.where(found, at, y1[jnp.argmax(broken)])
        found = found | jnp.any(broken)
        # each particle's ε_i follows its own running mean of ΔH², capped at the
        # ensemble's ε̄ = max ε_i, which follows the ensemble's E[ΔH²] (module
        # docstring): a few particles in a stiff region shorten their own steps,
        # not everyone's
        dh2 = jnp.minimum(jnp.where(fine, dh, 0) ** 2, DH2_CAP)
        e2 = jnp.where(fine, (1 - SMOOTH) * e2 + SMOOTH * dh2, DH2_CAP)
        tiny = jnp.finfo(y.dtype).tiny
        own = jnp.where(
            fine,
            jnp.clip((ENERGY_ERROR / jnp.maximum(e2, tiny)) ** (1 / 6), 0.8, 1.25),
            0.5,
        )
        var_e = jnp.mean(jnp.where(fine, dh, 0.0) ** 2)
        ratio = ENERGY_ERROR / jnp.maximum(var_e, tiny)
        ens = jnp.where(
            jnp.all(fine | outside), jnp.clip(ratio ** (1 / 6), 0.8, 1.25), 0.5
        )
        new_eps = jnp.minimum(eps * own, jnp.max(eps) * ens)
        # Horowitz's generalised HMC: each particle's leapfrog step is accepted with
        # probability min(1, e^{-ΔH}); a rejected one stays and flips its momentum
        u = jax.random.uniform(k2, v.shape, v.dtype)
        take = fine & (jnp.log(u) < -dh)
        y = jnp.where(take[:, None], y1, y)
        g = jnp.where(take[:, None], g1, g)
        v = jnp.where(take, v1, v)
        p = jnp.where(take[:, None], p1, -p)
        p = c * p + s * jax.random.normal(k3, p.shape, p.dtype)
        rejected = undone + jnp.sum(~take).astype(jnp.int32)
        return y, p, v, g, new_eps, e2, rejected, found, at

    start = (y, p, v, g, eps, e2, jnp.int32(0), jnp.bool_(False), y[0])
    y, p, v, g, eps, e2, bad, found, at = lax.fori_loop(0, n, body, start)
    return y, p, v, g, eps, e2, bad, (found, at)


def fit_dtype(m_mat: np.ndarray, dtype) -> tuple[np.ndarray, float]:
    """``(M', α)``: ``M`` shrunk towards its diagonal, ``M' = (1 − α) M + α diag(M)``,
    just enough that the samplers' check of ``M`` in ``dtype`` accepts it
    (:func:`cenlmc_jax._linalg.check_symmetric_psd`: the smallest eigenvalue of the
    correlation matrix of ``M`` above ``100 d ε``), with a factor 10 of margin.

    In float32 a dense ``M`` estimated on a badly scaled posterior can have a
    correlation matrix whose smallest eigenvalue is at float32's rounding level
    (issue 28: the warm-up's own ``M`` was refused by ``cj.lmc``). Shrinking the
    correlations keeps every variance, and the samplers stay exact (MALA) or keep
    their stated bias (the step size is set after).

    Args:
      m_mat: ``M``, ``(d,)`` or ``(d, d)``, float64.
      dtype: the dtype the sampler runs in.

    Returns:
      ``M'`` and ``α`` (0 when ``M`` passes as it is; always for a diagonal).
    """
    if m_mat.ndim < 2:
        return m_mat, 0.0
    d = m_mat.shape[0]
    eps = max(float(np.finfo(dtype).eps), float(np.finfo(jnp.result_type(float)).eps))
    need = min(0.5, 1000.0 * d * eps)
    root = 1.0 / np.sqrt(np.diag(m_mat))
    lam = float(np.linalg.eigvalsh(root[:, None] * m_mat * root[None, :]).min())
    if lam >= need:
        return m_mat, 0.0
    alpha = (need - lam) / (1.0 - lam)
    return (1 - alpha) * m_mat + alpha * np.diag(np.diag(m_mat)), float(alpha)


def _resample_laplace(key, y, v, g):
    """``(y, v, g, ess)``: the Laplace draws ``y ~ N(0, I)`` importance-resampled
    towards ``π`` (systematic resampling with weights ``w ∝ π(y) / N(y; 0, I)``, from
    the values the kinetic phase computes at its start anyway: no gradient), when
    their effective sample size ``1 / Σ w²`` is at least ``RESAMPLE_MIN_ESS · N``;
    else the draws as they are and ``ess = None``.

    The Laplace approximation misses a posterior's skew (its mean is the mode), which
    the weights correct where they are even; where they are not (a heavy tail the
    Gaussian is too narrow for: few particles would carry the ensemble) resampling
    would collapse the ensemble, and the kinetic phase has to move it instead. Draws
    outside the support (``log π = −inf``, weight 0) are never kept: without the
    resampling each is replaced by a copy of a draw inside, picked uniformly.
    """
    n = y.shape[0]
    log_w = np.asarray(v, np.float64) + 0.5 * np.sum(np.asarray(y, np.float64) ** 2, 1)
    if np.any(np.isnan(log_w) | (log_w == np.inf)) or np.all(log_w == -np.inf):
        return y, v, g, None
    w = np.exp(log_w - log_w.max())  # 0 for a draw outside the support (log π = -inf)
    w /= w.sum()
    ess = 1.0 / float(np.sum(w**2))
    if ess < RESAMPLE_MIN_ESS * n:
        # a draw outside the support would never move (every step from it is
        # rejected): a copy of a draw inside instead
        outside = np.flatnonzero(log_w == -np.inf)
        if outside.size == 0:
            return y, v, g, None
        inside = np.flatnonzero(log_w > -np.inf)
        idx = np.arange(n)
        pick = jax.random.randint(key, (outside.size,), 0, inside.size)
        idx[outside] = inside[np.asarray(pick)]
        return y[idx], v[idx], g[idx], None
    u = (float(jax.random.uniform(key, ())) + np.arange(n)) / n
    idx = np.minimum(np.searchsorted(np.cumsum(w), u), n - 1)
    return y[idx], v[idx], g[idx], ess


def _moments(y: np.ndarray) -> tuple:
    return y.mean(0), (y**2).mean(0), y.var(0), (y**2).var(0)


def _change(a: tuple, b: tuple) -> float:
    """The stopping rule's ``δ`` between two checks' moments (module docstring)."""
    m1, m2, v1, v2 = a
    n1, n2, w1, w2 = b
    tiny = 1e-300
    return float(
        max(
            np.max((n1 - m1) ** 2 / np.maximum(np.maximum(v1, w1), tiny)),
            np.max((n2 - m2) ** 2 / np.maximum(np.maximum(v2, w2), tiny)),
        )
    )


def stop_threshold(n: int, d: int) -> float:
    """The stopping rule's threshold on ``δ``: ``max(STOP_B2, (2/N)(2 ln(2d) + 3))``.

    Between two checks each of the ``2d`` ratios is at most about ``(2/N) χ²₁`` when
    the ensemble is stationary (two estimates of ``N`` particles, correlated or not),
    and the largest of ``2d`` such ``χ²₁`` is about ``2 ln(2d)``; ``+ 3`` is the margin
    that makes two quiet checks in a row likely at stationarity.

    Args:
      n: the number of particles ``N``.
      d: the dimension.

    Returns:
      The threshold, a float.
    """
    return max(STOP_B2, 2.0 / n * (2.0 * math.log(2 * d) + 3.0))


def _spread(y: np.ndarray, dense: bool, n: int, d: int) -> tuple[float, np.ndarray]:
    """``(spread, cov)``: the ensemble's regularised covariance in ``y`` (dense when
    ``N >= 4d``) and how far it is from ``I``: ``max(λ_max, 1/λ_min)``. The sample
    covariance of ``N`` draws of ``N(0, I_d)`` has eigenvalues spread over
    ``(1 ± sqrt(d/N))²`` (Marchenko–Pastur), the noise level it is compared with.
    """
    cov = _ensemble_cov(y, dense and n >= 4 * d)
    ev = np.linalg.eigvalsh(cov) if cov.ndim == 2 else cov
    return float(max(np.max(ev), 1 / np.min(ev))), cov


def _ensemble_cov(y: np.ndarray, dense: bool) -> np.ndarray:
    """Stan's regularised covariance of the particles (``n/(n+5) S + 10⁻³ 5/(n+5)``)."""
    n = y.shape[0]
    w = n / (n + 5.0)
    if dense:
        return w * np.cov(y, rowvar=False, ddof=1) + 1e-3 * (1 - w) * np.eye(y.shape[1])
    return w * y.var(0, ddof=1) + 1e-3 * (1 - w)


class _Round(NamedTuple):
    y: jax.Array
    eps: float
    steps: int
    rejected: int
    change: float
    stopped: bool
    #: where the step collapsed: a proposal (``y``) where the model was NaN or +inf
    trouble: np.ndarray | None = None


def _kinetic_round(
    key, y, v, g, eps, r, used, budget, check_every, fac, mu, static, record, shape
):
    """One round of the kinetic phase in fixed coordinates (module docstring): steps
    until the stopping rule holds twice in a row, the coordinates look off (after
    ``ROUND_STEPS · 2^r`` steps) or ``used + steps`` reaches ``budget``."""
    n, d, dense, noise = shape
    dt = y.dtype
    # momenta from their stationary law N(0, I): from p = 0 an ensemble already at π
    # would first contract towards the mode (too little kinetic energy)
    k_p, k = split_keys(key, 2)
    p = normal(k_p, y.shape, dt)
    history = [_moments(np.asarray(y, np.float64))]
    quiet, steps, undone, change = 0, 0, 0, math.inf
    # every particle starts the round at the last round's median step (built on the
    # host: jnp.full would compile a program of its own)
    eps_v = jnp.asarray(np.full((n,), eps, dt))
    e2_v = jnp.asarray(np.full((n,), ENERGY_ERROR, dt))
    trouble = None
    while used + steps < budget:
        # checks a time 2/γ apart (about the relaxation time of a whitened direction
        # of unit scale), and at least check_every steps
        m = min(
            max(check_every, math.ceil(2.0 / (FRICTION * eps))), budget - used - steps
        )
        j = 0
        while j < m:
            # single steps over the first RECORD_EVERY_STEP steps of the phase (where
            # the ensemble moves most), then pieces of check_every: the ensemble's
            # moments are recorded after each (info.trajectory)
            fine = r == 0 and steps < RECORD_EVERY_STEP
            piece = min(1 if fine else check_every, m - j)
            y, p, v, g, eps_v, e2_v, bad, (found, at) = _kinetic_chunk(
                jax.random.fold_in(k, steps),
                y,
                p,
                v,
                g,
                eps_v,
                e2_v,
                fac,
                mu,
                piece,
                **static,
            )
            eps_host = np.asarray(eps_v)  # (jnp.median would compile a program)
            eps = float(np.median(eps_host))
            steps, undone, j = steps + piece, undone + int(bad), j + piece
            if bool(found):
                trouble = np.asarray(at, np.float64)
            # halved after every step that met the model's NaN or +inf: the region
            # is not a question of the step (_model_trouble says what it is)
            if trouble is not None and float(eps_host.max()) < COLLAPSED_STEP:
                return _Round(y, eps, steps, undone, change, False, trouble)
            # a round that has not settled after ROUND_STEPS·2^r steps ends early when
            # the ensemble already says the coordinates are off (the next round runs
            # in better ones); tested after every piece, so a small ε (checks far
            # apart) does not hold a refit back
            early = (
                steps >= ROUND_STEPS * 2**r
                and r < MAX_ROUNDS - 1
                and _spread(np.asarray(y, np.float64), dense, n, d)[0] > 1.25 * noise
            )
            if early or j < m:
                record(used + steps, y)
            if early:
                return _Round(y, eps, steps, undone, change, False)
        history.append(_moments(np.asarray(y, np.float64)))
        # against the moments at half the round's elapsed checks: a slow drift adds up
        # over the lag, where two neighbouring checks would both look quiet
        change = _change(history[(len(history) - 1) // 2], history[-1])
        settled = change <= stop_threshold(n, d) and len(history) > MIN_CHECKS
        quiet = quiet + 1 if settled else 0
        record(used + steps, y)
        if quiet >= 2:
            return _Round(y, eps, steps, undone, change, True)
    return _Round(y, eps, steps, undone, change, False)


def kinetic_phase(
    key,
    logdensity_fn,
    positions,
    m_mat: np.ndarray,
    mean: np.ndarray,
    *,
    grad_fn=None,
    grad_mode: str = "auto",
    max_kinetic_steps: int = 1000,
    check_every: int = 10,
    initial_step: float = 0.5,
    laplace: bool = False,
    report=None,
) -> KineticResult:
    """The kinetic phase of the module docstring, from ``positions`` (``(N, d)``,
    ``x``) whitened by ``m_mat`` (``M``, ``(d,)`` or ``(d, d)``) and ``mean``, in
    rounds that re-estimate ``M`` and ``m`` while the ensemble says they are off.

    Args:
      key: the phase's key.
      logdensity_fn: ``x: (d,) -> log π(x)``.
      positions: the ensemble, ``(N, d)``.
      m_mat: the starting ``M`` (the Laplace start's ``H⁻¹``, or ``I``).
      mean: the starting ``m``.
      grad_fn: as for ``cj.lmc``.
      grad_mode: as for ``cj.lmc``.
      max_kinetic_steps: the kinetic steps of all rounds together, at most.
      check_every: kinetic steps between the stopping rule's checks.
      initial_step: the first ``ε``.
      laplace: ``positions`` are draws from ``N(mean, m_mat)`` (the Laplace start):
        they are importance-resampled towards ``π`` first when the weights allow
        (:func:`_resample_laplace`).
      report: ``report(message)`` after each round (the warm-up's progress), or
        None.

    Returns:
      A :class:`KineticResult` (``M`` fitted to the dtype: :func:`fit_dtype`).
    """
    x = jnp.asarray(positions)
    dt = x.dtype
    n, d = x.shape
    dense = m_mat.ndim == 2
    keys = iter(split_keys(key, 2 * MAX_ROUNDS + 1))
    static = dict(logdensity_fn=logdensity_fn, grad_fn=grad_fn, grad_mode=grad_mode)
    eps, used, rounds, notes = float(initial_step), 0, [], []
    m_mat, mean = np.asarray(m_mat, np.float64), np.asarray(mean, np.float64)
    trajectory = []
    noise = (
        (1 + math.sqrt(d / n)) ** 2
        if dense and n >= 4 * d
        else 1 + 4 * math.sqrt(2 / n)
    )
    for r in range(MAX_ROUNDS):
        lf, lf_inv = whitening_factor(m_mat)
        fac, mu = jnp.asarray(lf, dt), jnp.asarray(mean, dt)

        def record(seq, y, lf=lf, mean=mean):
            xs = to_x(lf, mean, np.asarray(y, np.float64))
            trajectory.append((int(seq), xs.mean(0), (xs**2).mean(0)))

        y = jnp.asarray(to_y(lf_inv, mean, x), dt)
        v, g = values_y(y, fac, mu, **static)
        if r == 0:
            record(0, y)
            if laplace:
                y, v, g, ess = _resample_laplace(next(keys), y, v, g)
                if ess is not None:
                    notes.append(
                        f"Laplace draws importance-resampled towards π (effective "
                        f"sample size {ess:.0f} of {n})."
                    )
                    record(0, y)
        rd = _kinetic_round(
            next(keys),
            y,
            v,
            g,
            eps,
            r,
            used,
            max_kinetic_steps,
            check_every,
            fac,
            mu,
            static,
            record,
            (n, d, dense, noise),
        )
        if rd.trouble is not None:
            raise _model_trouble(logdensity_fn, to_x(lf, mean, rd.trouble), rd.eps)
        eps, used = rd.eps, used + rd.steps
        ynp = np.asarray(rd.y, np.float64)
        x = jnp.asarray(to_x(lf, mean, ynp), dt)
        spread, cov_y = _spread(ynp, dense, n, d)
        # only a spread beyond the noise (_spread), by 25 %, says the coordinates were
        # off; then M and m are re-estimated and the phase run again in the new
        # coordinates, else the M it ran with is kept (a noisy ensemble estimate would
        # only degrade an M that fits, e.g. a Laplace M of a Gaussian)
        refit = spread > 1.25 * noise
        if report is not None:
            report(
                f"kinetic round {r + 1}: {rd.steps} steps (ε = {eps:.3g}), "
                + (
                    "settled"
                    if rd.stopped
                    else f"moments still moving (δ = {rd.change:.3g})"
                )
                + ("; coordinates refitted" if refit else "")
            )
        rounds.append(
            dict(
                kinetic_steps=rd.steps,
                step_size=eps,
                rejected=rd.rejected,
                last_change=rd.change,
                stopped=rd.stopped,
                whitened_cov_spread=spread,
                refit=refit,
            )
        )
        if not refit:
            break
        mean = mean + (lf @ ynp.mean(0) if dense else lf * ynp.mean(0))
        if dense:
            c = cov_y if cov_y.ndim == 2 else np.diag(cov_y)
            new_m = lf @ c @ lf.T
            m_mat = 0.5 * (new_m + new_m.T)
        else:
            m_mat = lf**2 * cov_y
        if used >= max_kinetic_steps:
            break
    last = rounds[-1]
    notes.append(
        f"kinetic phase (generalised HMC, γ = {FRICTION}, E[ΔH²] steered to "
        f"{ENERGY_ERROR}): {used} steps in {len(rounds)} round(s), final ε = {eps:.3g}"
        + (
            ""
            if last["stopped"]
            else "; the stopping rule did not settle (last change "
            f"{last['last_change']:.3g})"
        )
        + "."
    )
    if not last["stopped"]:
        _warn_unsettled(last, max_kinetic_steps, n, d, eps)
    m_mat, alpha = fit_dtype(m_mat, dt)
    if alpha:
        notes.append(
            f"M's correlations shrunk by {alpha:.3g} towards its diagonal: as "
            f"estimated, M is at the rounding level of {jnp.dtype(dt).name} "
            "(fit_dtype)."
        )
    return KineticResult(x, m_mat, mean, eps, used, rounds, notes, trajectory)


def _model_trouble(logdensity_fn, x: np.ndarray, eps: float) -> ValueError:
    """The error of a kinetic phase whose step collapsed on a region where the log
    density is NaN or ``+inf`` (or its gradient is not finite): what, where, and what
    to do."""
    name = getattr(logdensity_fn, "__name__", None) or repr(logdensity_fn)
    point = jnp.asarray(x, jnp.result_type(float))
    try:
        value = float(logdensity_fn(point))
    except Exception:  # a model that cannot be called eagerly: the phase saw it
        value = math.nan
    if math.isnan(value) or value == math.inf:
        what = "is NaN at" if math.isnan(value) else "is +inf at"
    else:
        what = f"is {value:.6g}, with a gradient that is not finite, at"
    shown = np.array2string(np.asarray(x), precision=6, threshold=12)
    return ValueError(
        f"langevin_warmup: the log density {name} {what} x = {shown} (a point the "
        "kinetic phase proposed): a step into such a region halves the step size, "
        f"and it has fallen to {eps:.3g}, so the warm-up cannot go on. The log density "
        "must be finite wherever the target has mass, and -inf outside its support: "
        "return -inf there (jnp.where(in_support, logp, -jnp.inf)), or sample an "
        "unconstrained transform of the parameters (a positive one through its log, "
        "an interval through a logit), as Stan and NumPyro do."
    )


def _warn_unsettled(last: dict, budget: int, n: int, d: int, eps: float) -> None:
    """The budget ran out before the stopping rule settled: the hand-over is not known
    to be at stationarity (a centred funnel: the Laplace start at its neck, ε
    collapsed; a banana cut short). Said now, not only after sampling."""
    moving = last["last_change"] > stop_threshold(n, d)
    warnings.warn(
        ConvergenceWarning(
            f"langevin_warmup: the kinetic phase did not settle in {budget} steps: "
            + (
                f"the ensemble's moments still moved by δ = {last['last_change']:.3g} "
                f"between its last checks (stationary noise {stop_threshold(n, d):.3g}"
                f"), at a step ε = {eps:.3g} in the whitened coordinates"
                if moving
                else "its last round ended before the stopping rule could confirm "
                f"stationarity (it needs {MIN_CHECKS + 2} checks)"
            )
            + ". The handed-over chains may start away from the posterior; more "
            "warm-up steps (num_steps), a funnel-like posterior reparametrised "
            "(non-centred), or start='positions' may help. The run's verdict will "
            "tell."
        ),
        stacklevel=4,
    )
