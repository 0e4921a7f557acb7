"""The adjusted phase of ``cj.langevin_warmup``'s exact default: HMC (or MALA) tuned
on the ensemble, then frozen and handed over.

It follows the kinetic phase (:mod:`cenlmc_jax.adaptation.kinetic`), in the same
whitened coordinates ``y = L⁻¹(x − m)``, ``M = L Lᵀ``, where the posterior's scale is
about 1.

**HMC** (``kernel="hmc"``, the default; :func:`cenlmc_jax.irreversible.hmc.hmc`):
``L`` leapfrog steps of size ``ε`` (jittered, ``ε U(1 − j, 1 + j)`` a move) from a
fresh momentum, then the Metropolis test. One-step MALA moves a distance of about
``ε`` a gradient by diffusion, ``ε² k`` in ``k`` gradients squared; a leapfrog
trajectory moves ``ε k`` (ballistic), so on a curved posterior whose stiff region
caps ``ε`` (a banana's arms, a funnel's neck) HMC forgets its start in far fewer
gradients: on the banana the integrated autocorrelation time of ``x₁²`` was about
2,300 gradients with MALA and 270-340 with HMC at ``L = 10-20`` from the same
hand-over (benchmarks/results/many_chains.md). The trajectory length is tuned on the
ensemble (ChEES, Hoffman, Radul & Sountsov 2021): the candidates ``L₀/2``, ``L₀`` and
``2 L₀`` with ``L₀ = ⌈(π/2)/ε⌉`` (a quarter period of a unit-scale Gaussian
direction) are each run for ``adjust_steps`` moves of the whole ensemble, and the one
with the largest ChEES per gradient,

    ChEES / L = E[a (‖y' − ȳ‖² − ‖y − ȳ‖²)²] / (4 L),

(``a`` the acceptance probability, ``ȳ`` the ensemble's mean: the change of the
squared distance from the centre, which is what mixes the second moments) is kept.
ChEES tunes a jittered trajectory length by gradient ascent over a long adaptation;
with thousands of particles each candidate's ChEES is estimated in a couple of moves,
so a comparison of three is enough and costs ``3.5 L₀ adjust_steps`` gradients.

``ε`` is tuned before, at ``L₀``: ``log ε ← log ε + (ā − HMC_TARGET_ACCEPTANCE)``,
``ā`` the round's mean acceptance over particles and moves, divided by 2 below an
acceptance of 0.1 (the kinetic phase's ``ε`` is a one-step generalised-HMC step at a
rejection rate of about 9 %, so it is usually close already).

**MALA** (``kernel="mala"``): ``h`` starts at ``ε²/2`` (one leapfrog step of size
``ε`` from a fresh momentum is MALA at ``h = ε²/2``) and is tuned the same way to
:data:`TARGET_ACCEPTANCE`, ``log h ← log h + 2(ā − target)``, divided by 4 below 0.1
and multiplied by 4 above 0.95.

Both: rounds go on (at most :data:`MAX_ADJUST_ROUNDS`) while the mean acceptance is
outside :data:`ACCEPTANCE_BAND`. An ensemble of ``N`` estimates the acceptance to
about ``0.5/sqrt(N × moves)``, so no dual averaging is needed. The parameters are then
frozen: the handed-over sampler is a Metropolis chain with fixed parameters, so
``cj.sample`` targets ``π`` exactly.

**Stuck particles.** A particle whose acceptance over the last round is below
``STUCK_ACCEPTANCE``, or whose trajectory diverged, sits in a stiff region (a banana's
arm, a funnel's neck) where the ensemble's step is far too long for it. It is where
``π`` puts it: replacing it by a copy of a moving particle takes that mass away. With
HMC and at least :data:`AUTOSTEP_MIN_STUCK` of the particles stuck, the phase hands
over AutoStep HMC (:func:`cenlmc_jax.irreversible.autostep.autostep_hmc`) at the same
``ε``, ``L`` and ``M``: each move halves its step where the first leapfrog step's
energy error says so, and a reverse check keeps it exact. From the same hand-over, HMC
at the tuned step left the banana's x₁ sd 15 % low after 800 moves, AutoStep 0.7 %
(seed 0, benchmarks/results/autostep.md). Otherwise (MALA, or fewer stuck) the stuck
particles try the shorter steps ``ε s`` (MALA: ``h s²``), ``s`` in
:data:`SMALL_FACTORS`, one round each, until they accept at least
:data:`SMALL_ACCEPTANCE`; each handed-over move is then the shorter one with probability
``q`` (twice the stuck fraction, within :data:`SMALL_PROBABILITY`), drawn anew at each
move for each chain. Each of the two kernels leaves ``π`` invariant and the choice does
not depend on the state, so the mixture is exact too (Tierney 1994). Where no factor
helps, the particles stay (the run's verdict judges whether they move an estimate beyond
its MCSE).

**Relaxation** (``relaxation_steps``): moves per e-fold of the slowest whitened
coordinate over the phase, from the correlation over the ensemble between ``y`` at
the phase's start and end (:func:`relaxation`), counted in gradients and converted to
moves of the final ``L``.
"""

from __future__ import annotations

import math
from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from cenlmc_jax._keys import split_keys
from cenlmc_jax.adaptation.coordinates import (
    STATIC,
    to_x,
    to_y,
    value_and_grad_y,
    values_y,
    whitening_factor,
)
from cenlmc_jax.irreversible.hmc import DIVERGENCE_THRESHOLD

__all__ = [
    "AdjustedPhase",
    "adjusted_phase",
    "relaxation",
    "HMC_TARGET_ACCEPTANCE",
    "TARGET_ACCEPTANCE",
    "TRAJECTORY",
    "STEP_JITTER",
]

#: The mean MALA acceptance the phase tunes ``h`` to (Roberts & Rosenthal's optimum is
#: 0.574 in high dimension; a little above it costs little and is safer in low
#: dimension).
TARGET_ACCEPTANCE = 0.6
#: The mean HMC acceptance the phase tunes ``ε`` to (Beskos et al.'s optimum is 0.651
#: in high dimension; ChEES and Stan aim at 0.65-0.8; higher keeps fewer particles in
#: a stiff region stuck).
HMC_TARGET_ACCEPTANCE = 0.8
#: ``L₀ ε``: the first trajectory length, a quarter period of a whitened direction of
#: unit scale.
TRAJECTORY = math.pi / 2
#: Leapfrog steps a move, at most (a step that small says the posterior is stiff in a
#: region: more steps would cost more than the stuck particles' shorter step).
MAX_LEAPFROG = 128
#: The handed-over HMC's step jitter ``j``: ``ε U(1 − j, 1 + j)`` a move.
STEP_JITTER = 0.2
#: A particle whose mean acceptance over the last tuning round is below this is stuck.
STUCK_ACCEPTANCE = 0.02
#: HMC hands over AutoStep HMC when at least this share of the particles is stuck
#: (below it, the shorter-step mixture): a mass ``f`` the step cannot move shifts a
#: mean by about ``f`` times its distance in sds, under the MCSE target (5 % of the sd
#: at an ESS of 400) for ``f`` below 1 % unless it lies 5 sds out, and AutoStep costs
#: 2 or more gradients a move more (non-centred eight schools, 3 of 2,000 stuck:
#: 924 sequential gradients with AutoStep against 525).
AUTOSTEP_MIN_STUCK = 0.01
#: The shorter step's factors ``s`` tried on the stuck particles, longest first (HMC's
#: ``ε``; MALA's ``h``, whose step length goes as its square root, takes their squares).
SMALL_FACTORS = (1 / 2, 1 / 4, 1 / 8, 1 / 16)
#: The shorter step is taken at the first factor where the stuck particles accept this
#: much on average and at most ``SMALL_DIVERGENT`` of them diverge.
SMALL_ACCEPTANCE = 0.3
SMALL_DIVERGENT = 0.01
#: The shorter step's probability ``q``: ``SMALL_SHARE`` times the stuck fraction, in
#: ``SMALL_PROBABILITY``.
SMALL_SHARE = 2.0
SMALL_PROBABILITY = (0.05, 0.25)
#: Tuning goes on beyond ``adjust_rounds`` (up to ``MAX_ADJUST_ROUNDS``) while the mean
#: acceptance is outside this band.
ACCEPTANCE_BAND = (0.3, 0.9)
MAX_ADJUST_ROUNDS = 30

_STATIC = STATIC


class AdjustedPhase(NamedTuple):
    """What :func:`adjusted_phase` returns (``positions`` in ``x``)."""

    positions: jax.Array
    kernel: str
    #: HMC's ``ε`` or MALA's ``h``.
    step_size: float
    #: HMC's ``L`` (1 for MALA).
    num_integration_steps: int
    acceptance_rate: float
    #: moves of the whole ensemble, and the gradients one particle evaluated in them.
    moves: int
    gradients: int
    relaxation_steps: float
    #: ``(step, q)``: the shorter step and its probability, or None.
    small_step: tuple | None
    notes: list
    #: ``(gradients since the phase's start, E x, E x²)`` after each round.
    trajectory: list
    #: HMC with stuck particles: hand over AutoStep HMC (``cj.autostep_hmc``).
    autostep: bool = False


@partial(jax.jit, static_argnames=_STATIC)
def _mala_chunk(key, y, v, g, h, factor, mean, n, logdensity_fn, grad_fn, grad_mode):
    """``n`` MALA steps in ``y`` of the whole ensemble (``h``: one step, or ``(N,)``,
    one a particle); the summed acceptance probability per particle.
    """
    vg = partial(value_and_grad_y, logdensity_fn, grad_fn, grad_mode, factor, mean)
    h_each = jnp.broadcast_to(h, v.shape)  # a step for all, or one a particle
    hc = h_each[:, None]

    def body(t, carry):
        y, v, g, acc = carry
        k1, k2 = jax.random.split(jax.random.fold_in(key, t))
        y1 = y + hc * g + jnp.sqrt(2 * hc) * jax.random.normal(k1, y.shape, y.dtype)
        v1, g1 = vg(y1)
        fwd = jnp.sum((y1 - y - hc * g) ** 2, 1)
        bwd = jnp.sum((y - y1 - hc * g1) ** 2, 1)
        log_a = v1 - v + (fwd - bwd) / (4 * h_each)
        log_a = jnp.where(
            jnp.isfinite(log_a) & jnp.all(jnp.isfinite(g1), 1), log_a, -jnp.inf
        )
        u = jax.random.uniform(k2, v.shape, v.dtype)
        take = jnp.log(u) < log_a
        y = jnp.where(take[:, None], y1, y)
        g = jnp.where(take[:, None], g1, g)
        v = jnp.where(take, v1, v)
        return y, v, g, acc + jnp.exp(jnp.minimum(log_a, 0.0))

    return lax.fori_loop(0, n, body, (y, v, g, jnp.zeros_like(v)))


@partial(jax.jit, static_argnames=_STATIC)
def _hmc_chunk(
    key, y, v, g, eps, factor, mean, n, n_leapfrog, logdensity_fn, grad_fn, grad_mode
):
    """``n`` HMC moves in ``y`` (identity mass) of the whole ensemble, ``n_leapfrog``
    leapfrog steps each (``eps``: one step, or ``(N,)``, one a particle; jittered by
    :data:`STEP_JITTER`); the summed acceptance probability per particle, and its
    count of divergent moves (``ΔH`` above ``DIVERGENCE_THRESHOLD`` or not finite).
    """
    vg = partial(value_and_grad_y, logdensity_fn, grad_fn, grad_mode, factor, mean)
    eps_each = jnp.broadcast_to(eps, v.shape)

    def body(t, carry):
        y, v, g, acc, div = carry
        k1, k2, k3 = jax.random.split(jax.random.fold_in(key, t), 3)
        u = jax.random.uniform(k3, v.shape, y.dtype, 1 - STEP_JITTER, 1 + STEP_JITTER)
        e = (eps_each * u)[:, None]
        r0 = jax.random.normal(k1, y.shape, y.dtype)

        def leapfrog(_, c):
            yy, r, _v, gg = c
            r = r + 0.5 * e * gg
            yy = yy + e * r
            vv, gg = vg(yy)
            return yy, r + 0.5 * e * gg, vv, gg

        y1, r1, v1, g1 = lax.fori_loop(0, n_leapfrog, leapfrog, (y, r0, v, g))
        dh = (0.5 * jnp.sum(r1**2, 1) - v1) - (0.5 * jnp.sum(r0**2, 1) - v)
        fine = jnp.isfinite(dh) & jnp.all(jnp.isfinite(g1), 1)
        log_a = jnp.where(fine, -dh, -jnp.inf)
        a = jnp.exp(jnp.minimum(log_a, 0.0))
        div = div + (~fine | (dh > DIVERGENCE_THRESHOLD)).astype(jnp.int32)
        take = jnp.log(jax.random.uniform(k2, v.shape, v.dtype)) < log_a
        y = jnp.where(take[:, None], y1, y)
        g = jnp.where(take[:, None], g1, g)
        v = jnp.where(take, v1, v)
        return y, v, g, acc + a, div

    zero = jnp.zeros(v.shape, jnp.int32)
    return lax.fori_loop(0, n, body, (y, v, g, jnp.zeros_like(v), zero))


def _move(kernel, key, yvg, step, fac, mu, n, n_lf, static):
    """``n`` moves of ``kernel`` from ``yvg = (y, v, g)``: ``(y, v, g, per-particle
    acceptance, per-particle divergent moves)``."""
    if kernel == "hmc":
        *yvg, a, div = _hmc_chunk(key, *yvg, step, fac, mu, n, n_lf, **static)
    else:
        *yvg, a = _mala_chunk(key, *yvg, step, fac, mu, n, **static)
        div = np.zeros(np.shape(a), np.int32)
    return (*yvg, np.asarray(a, np.float64) / n, np.asarray(div))


def slowest_correlation(y0: np.ndarray, y1: np.ndarray) -> float:
    """The largest correlation over the ensemble between ``f(y)`` before and after,
    over the ``2d`` functions ``f = y_i, y_i²`` (the moments the many-chain verdict
    checks), clipped to ``[10⁻³, 0.999]``.

    Args:
      y0: the ensemble, ``(N, d)``.
      y1: the same particles later.

    Returns:
      The correlation, a float.
    """
    f0 = np.concatenate([y0, y0**2], 1)
    f1 = np.concatenate([y1, y1**2], 1)
    a, b = f0 - f0.mean(0), f1 - f1.mean(0)
    r = np.sum(a * b, 0) / np.sqrt(np.sum(a**2, 0) * np.sum(b**2, 0))
    return float(np.clip(np.max(np.nan_to_num(r, nan=1.0)), 1e-3, 0.999))


def _tune_step(kernel, step, acc):
    """The next step from a round's mean acceptance (module docstring)."""
    if kernel == "hmc":
        if acc < 0.1:
            return step / 2
        return step * math.exp(acc - HMC_TARGET_ACCEPTANCE)
    if acc < 0.1:
        return step / 4
    if acc > 0.95:
        return step * 4
    return step * math.exp(2.0 * (acc - TARGET_ACCEPTANCE))


def adjusted_phase(
    key,
    logdensity_fn,
    positions,
    m_mat: np.ndarray,
    mean: np.ndarray,
    eps: float,
    *,
    kernel: str = "hmc",
    grad_fn=None,
    grad_mode: str = "auto",
    adjust_rounds: int = 3,
    adjust_steps: int = 2,
    report=None,
) -> AdjustedPhase:
    """Tune HMC's ``ε`` and ``L`` (or MALA's ``h``) on the ensemble, in the coordinates
    whitened by ``m_mat`` and ``mean`` (module docstring).

    Args:
      key: the phase's key.
      logdensity_fn: ``x: (d,) -> log π(x)``.
      positions: the ensemble, ``(N, d)``, in ``x``.
      m_mat: ``M``, ``(d,)`` or ``(d, d)``.
      mean: ``m``, ``(d,)``.
      eps: the kinetic phase's step (whitened units).
      kernel: ``"hmc"`` or ``"mala"``.
      grad_fn: as for ``cj.lmc``.
      grad_mode: as for ``cj.lmc``.
      adjust_rounds: tuning rounds of the step, at least.
      adjust_steps: moves of the whole ensemble a round.
      report: ``report(message)`` when the phase ends (the warm-up's progress), or
        None.

    Returns:
      An :class:`AdjustedPhase`.
    """
    static = dict(logdensity_fn=logdensity_fn, grad_fn=grad_fn, grad_mode=grad_mode)
    x = jnp.asarray(positions)
    dt = x.dtype
    lf, lf_inv = whitening_factor(m_mat)
    fac, mu = jnp.asarray(lf, dt), jnp.asarray(mean, dt)
    y = jnp.asarray(to_y(lf_inv, mean, x), dt)
    yvg = (y, *values_y(y, fac, mu, **static))
    y0 = np.asarray(y, np.float64)
    hmc = kernel == "hmc"
    step = float(eps) if hmc else 0.5 * float(eps) ** 2
    n_lf = _leapfrogs(step) if hmc else 1
    keys = iter(split_keys(key, MAX_ADJUST_ROUNDS + 8))
    grads, moves, rounds, acc, trajectory = 0, 0, 0, float("nan"), []

    def run(step_now, n_now, k):
        """A round of ``adjust_steps`` moves: per-particle acceptance, and the
        slowest moment's decorrelation per gradient ``−log ρ / (moves L)``."""
        nonlocal yvg, grads, moves
        before = np.asarray(yvg[0], np.float64)
        *yvg_new, a, div = _move(
            kernel,
            k,
            yvg,
            # always one step a particle, (N,): a scalar step would be a second
            # program to compile (the stuck particles' round passes an (N,) step)
            jnp.broadcast_to(jnp.asarray(step_now, dt), yvg[1].shape),
            fac,
            mu,
            adjust_steps,
            n_now,
            static,
        )
        yvg = tuple(yvg_new)
        grads, moves = grads + adjust_steps * n_now, moves + adjust_steps
        after = np.asarray(yvg[0], np.float64)
        xs = to_x(lf, mean, after)
        trajectory.append((grads, xs.mean(0), (xs**2).mean(0)))
        # over the particles that move: the stuck ones (a stiff tail, whatever L)
        # would make every L look alike and the shortest look cheapest
        moving = a >= STUCK_ACCEPTANCE
        rho = slowest_correlation(before[moving], after[moving])
        return a, -math.log(rho) / (adjust_steps * n_now), div

    band = ACCEPTANCE_BAND
    while rounds < adjust_rounds or (
        rounds < MAX_ADJUST_ROUNDS and not band[0] <= acc <= band[1]
    ):
        a, score, div = run(step, n_lf, next(keys))
        acc, rounds = float(a.mean()), rounds + 1
        step = _tune_step(kernel, step, acc)
        if hmc:
            n_lf = _leapfrogs(step)
    notes = []
    if hmc:
        n_lf, a, div, acc = _trajectory_length(
            run, step, n_lf, (score, a, div), keys, notes
        )
    # stuck: accepting (almost) nothing, or a trajectory diverged (it ran into a
    # region the step is too long for: a funnel's neck)
    stuck = (a < STUCK_ACCEPTANCE) | (div > 0)
    small, autostep = None, False
    if hmc and stuck.mean() >= AUTOSTEP_MIN_STUCK:
        autostep = True
        notes.append(_autostep_note(stuck))
    elif stuck.any():
        small, a_small = _small_step(kernel, run, stuck, step, n_lf, keys)
        notes.append(_stuck_note(kernel, stuck, step, small, a_small))
    relax = relaxation(y0, np.asarray(yvg[0], np.float64), grads) / n_lf
    name = ("AutoStep HMC" if autostep else "HMC") if hmc else "MALA"
    notes.append(
        f"adjusted phase ({name}, M fixed from the ensemble): "
        + (f"ε = {step:.3g}, L = {n_lf}" if hmc else f"h = {step:.3g}")
        + f" after {rounds} rounds of {adjust_steps} moves, mean acceptance "
        f"{acc:.2f} (target "
        f"{HMC_TARGET_ACCEPTANCE if hmc else TARGET_ACCEPTANCE}); {grads} sequential "
        "gradients."
    )
    if report is not None:
        report(
            f"adjusted phase: {name} "
            + (f"ε = {step:.3g}, L = {n_lf}" if hmc else f"h = {step:.3g}")
            + f", acceptance {acc:.2f}, after {rounds} rounds"
        )
    x = jnp.asarray(to_x(lf, mean, np.asarray(yvg[0], np.float64)), dt)
    return AdjustedPhase(
        x,
        kernel,
        step,
        n_lf,
        acc,
        moves,
        grads,
        relax,
        small,
        notes,
        trajectory,
        autostep,
    )


def _trajectory_length(run, step, n_lf, last, keys, notes):
    """HMC's ``L`` by doubling from the last tuning round's (``last``: its score,
    acceptances and divergences; module docstring): ``(L, its round's per-particle
    acceptance and divergent moves, the mean acceptance)``."""
    scores = {n_lf: last}
    best = n_lf
    for direction in (2, 0.5):
        cand = best
        while True:
            cand = int(min(MAX_LEAPFROG, max(1, round(cand * direction))))
            if cand in scores:
                break
            a_c, s_c, d_c = run(step, cand, next(keys))
            scores[cand] = (s_c, a_c, d_c)
            if s_c <= scores[best][0]:
                break
            best = cand
        if best != n_lf:
            break  # longer paid: no need to look shorter
    notes.append(
        "adjusted phase (HMC): the slowest moment's decorrelation per gradient, "
        "-log ρ / (moves L), over L = "
        + ", ".join(f"{k} ({scores[k][0]:.3g})" for k in sorted(scores))
        + f": L = {best}."
    )
    _, a, div = scores[best]
    return best, a, div, float(a.mean())


def _leapfrogs(eps: float) -> int:
    return int(min(MAX_LEAPFROG, max(1, math.ceil(TRAJECTORY / eps))))


def _small_step(kernel, run, stuck, step, n_lf, keys):
    """The handed-over kernel's shorter step for the ``stuck`` particles (module
    docstring): a round of the whole ensemble, the stuck particles at ``step s`` (MALA:
    ``h s²``) for each ``s`` of :data:`SMALL_FACTORS` in turn until their mean
    acceptance reaches :data:`SMALL_ACCEPTANCE` with at most :data:`SMALL_DIVERGENT`
    of them diverging.

    Returns ``((step s, q) or None, the stuck particles' last acceptance)``.
    """
    q = float(np.clip(SMALL_SHARE * stuck.mean(), *SMALL_PROBABILITY))
    took = 0.0
    for s in SMALL_FACTORS:
        short = step * (s if kernel == "hmc" else s * s)
        each = np.where(stuck, short, step)
        a, _, div = run(each, n_lf, next(keys))
        took = float(np.mean(a[stuck]))
        if took >= SMALL_ACCEPTANCE and np.mean(div[stuck] > 0) <= SMALL_DIVERGENT:
            return (short, q), took
    return None, took


def _autostep_note(stuck) -> str:
    return (
        f"{int(stuck.sum())} of {stuck.size} particles ({stuck.mean():.1%}) accepted "
        f"less than {STUCK_ACCEPTANCE} of the last tuning round's HMC proposals or had "
        "a divergent trajectory: a region the step is too long for (a funnel's neck, "
        "a banana's arms). Handed over: AutoStep HMC (cj.autostep_hmc), which halves "
        "the step of a move where its first leapfrog step says so, exactly."
    )


def _stuck_note(kernel, stuck, step, small, took) -> str:
    n, k = stuck.size, int(stuck.sum())
    head = (
        f"{k} of {n} particles ({stuck.mean():.1%}) accepted less than "
        f"{STUCK_ACCEPTANCE} of the last tuning round's {kernel.upper()} proposals"
        " or had a divergent trajectory"
    )
    if small is None:
        return (
            head
            + f", and as little ({took:.2f}) at the shortest step tried: they stay "
            "where they are (the run's verdict judges whether they move an estimate)."
        )
    return (
        head + f" (a stiff tail); at the step {small[0]:.3g} they accept {took:.2f}: "
        f"each handed-over move takes that shorter step with probability "
        f"{small[1]:.3g} (a fixed mixture of two kernels, each exact)."
    )


def relaxation(y0: np.ndarray, y1: np.ndarray, k: int) -> float:
    """Steps (or gradients) per e-fold of the slowest whitened coordinate over ``k``
    of them: ``−k / log ρ``, ``ρ`` the largest correlation over the ensemble between
    ``y`` at the start and ``k`` later, clipped to ``[0.02, 0.999]`` (a bound when
    the correlation is lost in the noise).

    Args:
      y0: the ensemble at the start, ``(N, d)``.
      y1: the same particles ``k`` steps later.
      k: the steps between them.

    Returns:
      ``−k / log ρ``.
    """
    a, b = y0 - y0.mean(0), y1 - y1.mean(0)
    r = np.sum(a * b, 0) / np.sqrt(np.sum(a**2, 0) * np.sum(b**2, 0))
    rho = float(np.clip(np.max(np.nan_to_num(r, nan=1.0)), 0.02, 0.999))
    return -k / math.log(rho)
