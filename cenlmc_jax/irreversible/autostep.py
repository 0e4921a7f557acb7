"""AutoStep HMC: HMC whose step is chosen at each move from the local energy error.

Liu, Surjanovic, Biron-Lattes, Bouchard-Côté & Campbell (2025, "AutoStep: locally
adaptive involutive MCMC"; for one leapfrog step it is Biron-Lattes, Surjanovic,
Syed, Campbell & Bouchard-Côté's autoMALA, 2024). HMC with one step ``ε`` for the
whole posterior (:func:`cenlmc_jax.irreversible.hmc.hmc`) cannot enter a region whose
curvature that step is too long for: a funnel's neck, a banana's thin arms. Its
trajectories there diverge and are rejected; the chains stay exact but do not fill the
region (from the same hand-over, 800 moves of HMC left the banana's x₁ sd 15 % low or
13 % high, and chains started in centred eight schools' neck never moved:
benchmarks/results/autostep.md). AutoStep shortens the step where the first leapfrog
step says it is too long, and stays exact.

In the whitened coordinates of :mod:`~cenlmc_jax.irreversible.hmc` (``M = L_M L_Mᵀ``,
``r = L_Mᵀ p``, ``H(x, r) = −log π(x) + ½|r|²``), one move from ``x``::

    r ~ N(0, I),  a = min(u₁, u₂) with u₁, u₂ ~ U(0, 1),  θ₀ = ε U(1 − j, 1 + j)
    ℓ(x, r; θ) = H(x, r) − H(Φ_θ(x, r))          (one leapfrog step Φ_θ's log ratio)
    μ(x, r) = 0 if ℓ(x, r; θ₀) > log a, else the least k in 1..K with
              ℓ(x, r; θ₀ 2^−k) > log a (K if none)         (the step's halvings)
    (x', r') = Φ_θ^L(x, r),  θ = θ₀ 2^−μ(x, r)
    accept x' with probability min(1, e^−ΔH) · 1{μ(x', −r') = μ(x, r)}

``a`` is autoMALA's lower soft bound (their pair ``(a, b)``, of which a selector that
only halves needs ``a``); ``K = max_halvings``; ``j = step_jitter``.

**Why it is exact.** ``(a, θ₀, r)`` are drawn afresh each move, independent of ``x``.
For fixed ``(a, θ₀)`` the map ``(x, r) ↦ (x', −r')``, with its step set by
``μ(x, r)``, preserves volume (leapfrog does at any fixed step), and on the set where
``μ(x', −r') = μ(x, r)`` it is an involution: from ``(x', −r')`` the selector picks the
same ``θ`` and the reversed leapfrog returns to ``(x, r)``. The indicator confines the
Metropolis test to that set, so the move satisfies detailed balance with respect to
``π(x) N(r; 0, I)`` (AutoStep's theorem; involutive MCMC, Neklyudov, Welling,
Egorov & Vetrov 2020). A move whose reverse selection disagrees is a rejection.

**The reverse check costs one gradient less than it reads.** ``μ(x', −r') = μ(x, r)
= m`` holds when ``ℓ(x', −r'; θ₀ 2^−k) <= log a`` for every ``k < m`` and
``ℓ(x', −r'; θ₀ 2^−m) > log a`` (or ``m = K``). The last one needs no leapfrog step:
``θ₀ 2^−m`` is the trajectory's step, and one step from ``(x', −r')`` at it goes back to
the trajectory's point before its last, ``(x_{L−1}, −r_{L−1})`` (leapfrog is
reversible), so ``ℓ(x', −r'; θ) = H(x', r') − H(x_{L−1}, r_{L−1})``, energies the
trajectory computed. Only the ``k < m`` ones are evaluated, and the check stops at the
first that disagrees: a move that did not halve checks its reverse for free. (Exact as
leapfrog's reversibility is: to rounding, as for HMC itself.)

**Cost.** A move evaluates ``L`` gradients for the trajectory, ``1 + μ(x, r)`` for the
selection and at most ``μ(x, r)`` for its reverse (``info.grad_evals``): where ``ε``
fits, ``L + 1``. Vmapped over chains, the halvings' loops run as long as their slowest
chain. The compiled program holds one leapfrog step per loop (the selection's, the
trajectory's, the reverse check's): the selection's first ratio is its loop's first
iteration, and the trajectory carries the energy before each step instead of taking
its last step apart. The trajectory keeps ``L`` steps, so where the step is halved
it is shorter in time (AutoStep keeps the step count too); a trajectory of constant
time would need a loop whose length depends on the state, which reverse-mode
differentiation cannot go through.

**Derivative.** ``jax.grad`` through a run differentiates the leapfrog trajectory and
the Metropolis test's ratio pathwise, with the discrete decisions held fixed: the
halvings ``μ`` (computed without a derivative: they are integers), the reverse check
and the accept/reject, as for :func:`~cenlmc_jax.irreversible.hmc.hmc`.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

from cenlmc_jax._validation import (
    check_int,
    check_key,
    check_state,
)
from cenlmc_jax.base import RunFlag, SamplingAlgorithm
from cenlmc_jax.irreversible._common import (
    ZERO_ACCEPTANCE_FLAG,
)
from cenlmc_jax.irreversible.hmc import (
    DIVERGENT_FLAG,
    NECK_DEPTH,
    NECK_Z,
    HMCState,
    check_hmc_arguments,
    hmc_init,
    metropolis_end,
    neck_depth,
    neck_depth_lower,
    whitened_leapfrog,
)
from cenlmc_jax.types import Array, LogDensityFn, PRNGKey

__all__ = ["AutoStepInfo", "autostep_hmc", "halved_depth"]

#: ``K``: the step is halved at most this many times a move (``ε / 256``).
MAX_HALVINGS = 8


#: The driver's warning (the CLI's failed check) for a share of halved moves
#: (``info.halved``) that rises between the halves of the kept moves.
HALVED_FLAG = RunFlag(
    "halved",
    lambda infos, step: (
        "the share of AutoStep HMC's moves that halved their step rose between the "
        f"halves of the kept moves (from step {step}): the chains are still moving "
        "into a region whose curvature the step is too long for (a funnel's neck), "
        "where each trajectory is shorter in time, so that region fills slowly and is "
        "undersampled so far; the estimates may be biased. Reparametrise the model "
        "(non-centred), or run longer"
    ),
    kept_only=True,
    rising=True,
)


def _give_or_take(depth: float | None, lower: float | None) -> str:
    """`` (± SE)`` of a depth from its lower bound, for a message."""
    if depth is None or lower is None:
        return ""
    return f" (± {(depth - lower) / NECK_Z:.2g})"


def _neck_message(infos: Any, step: int) -> str:
    depth = neck_depth(infos)
    return (
        "AutoStep HMC's divergent trajectories start where the density is high: their "
        f"log density is on average {math.nan if depth is None else depth:.2g}"
        f"{_give_or_take(depth, neck_depth_lower(infos))} "
        "standard deviations above the ensemble's mean (kept moves from step "
        f"{step}): a narrow region that holds much mass, a funnel's neck (a scale "
        "parameter near zero in a centred hierarchical or state-space model). The "
        "halved steps let the chains into it, but there each trajectory is shorter "
        "in time, so it fills slowly: in a run of this length its mass may be "
        "undersampled and the estimates biased (that scale parameter's sd and lower "
        "tail most; centred eight schools from the warm-up: log τ's sd 15 % low "
        "after 200 moves, 5 % after 1,600). Reparametrise the model (non-centred)"
    )


#: The driver's warning (the CLI's failed check) for divergent trajectories that start
#: where the density is high (:func:`~cenlmc_jax.irreversible.hmc.neck_depth` above
#: :data:`~cenlmc_jax.irreversible.hmc.NECK_DEPTH` by
#: :data:`~cenlmc_jax.irreversible.hmc.NECK_Z` standard errors), as for ``cj.hmc``.
NECK_FLAG = RunFlag(
    "divergent",
    _neck_message,
    kept_only=True,
    statistic=neck_depth_lower,
    above=NECK_DEPTH,
)


def halved_depth(infos: Any) -> float | None:
    """Where AutoStep HMC halves its step, in the ensemble's log density:
    :func:`~cenlmc_jax.irreversible.hmc.neck_depth` of the halved moves instead of the
    divergent ones (the mean over the halved moves of the start's log density, in
    standard deviations of the ensemble's log density above its mean).

    Where the step halves, it is too long for the curvature, as where HMC's
    trajectories diverge, and AutoStep halves rather than diverges: in a funnel's neck
    its moves may not diverge at all (Brownian motion with unknown scales from the
    warm-up: none of 600,000 moves, log obs's sd 21 % low after 300 moves and 13 %
    low after the CLI's 1,600), so :data:`NECK_FLAG` cannot see the neck. Halvings in
    a tail start at low density (the banana, seeds 0-2: −1.0 to −1.1); in a neck at
    high density (centred eight schools +1.6 to +1.8, Neal's funnel at d = 10 +1.2,
    Brownian motion with unknown scales +1.0); the 103-d stochastic-volatility model,
    right, +0.1. Flagged where it is above
    :data:`~cenlmc_jax.irreversible.hmc.NECK_DEPTH` by
    :data:`~cenlmc_jax.irreversible.hmc.NECK_Z` standard errors
    (:func:`~cenlmc_jax.irreversible.hmc.neck_depth_lower` of the halved moves), as
    :data:`NECK_FLAG`.

    Args:
      infos: the kept moves' :class:`AutoStepInfo`, stacked along a leading step axis.

    Returns:
      ``depth``, or None when fewer than
      :data:`~cenlmc_jax.irreversible.hmc.NECK_MIN_RATE` of the moves halved.
    """
    return neck_depth(infos, "halved", "halved_logdensity")


def _halved_lower(infos: Any) -> float | None:
    """:func:`halved_depth` less its standard errors (``HALVED_NECK_FLAG``'s
    statistic)."""
    return neck_depth_lower(infos, "halved", "halved_logdensity")


def _halved_neck_message(infos: Any, step: int) -> str:
    depth = halved_depth(infos)
    return (
        "AutoStep HMC halves its step where the density is high: the halved moves "
        f"start on average {math.nan if depth is None else depth:.2g}"
        f"{_give_or_take(depth, _halved_lower(infos))} standard "
        "deviations above the ensemble's log density mean (kept moves from step "
        f"{step}): a narrow region that holds much mass, a funnel's neck (a scale "
        "parameter near zero in a centred hierarchical or state-space model). There "
        "each trajectory is shorter in time, so the region fills slowly and its mass "
        "may be undersampled in a run of this length, the estimates biased (that "
        "scale parameter's sd and lower tail most; Brownian motion with unknown "
        "scales: log obs's sd 13 % low after 1,600 moves with no divergent move). "
        "Reparametrise the model (non-centred)"
    )


#: The driver's warning (the CLI's failed check) for AutoStep HMC's halved moves that
#: start where the density is high (:func:`halved_depth` above
#: :data:`~cenlmc_jax.irreversible.hmc.NECK_DEPTH` by
#: :data:`~cenlmc_jax.irreversible.hmc.NECK_Z` standard errors): a funnel's neck that
#: the halvings enter without the divergences :data:`NECK_FLAG` needs.
HALVED_NECK_FLAG = RunFlag(
    "halved",
    _halved_neck_message,
    kept_only=True,
    statistic=_halved_lower,
    above=NECK_DEPTH,
)


class AutoStepInfo(NamedTuple):
    """What one AutoStep HMC move did (one chain).

    Attributes:
      acceptance_rate: ``min(1, exp(−ΔH))`` times the reverse check's indicator.
      is_accepted: the trajectory's end was accepted.
      energy_error: ``ΔH`` at the selected step (``inf`` where the trajectory left
        the finite numbers).
      grad_evals: gradients evaluated: ``L + 1 + μ(x, r)`` and the reverse check's,
        at most ``μ(x, r)`` (module docstring).
      halvings: ``μ(x, r)``, the step's halvings this move (0: the step ``ε``).
      halved: ``μ(x, r) > 0``. In a funnel's neck every move halves; the share of
        halved moves is constant at stationarity, and one that rises over the run
        says the chains are still filling such a region (:data:`HALVED_FLAG`:
        ``cj.sample`` warns, the CLI fails the run, ``cj.sample_until`` runs on).
      reversible: the reverse selection agreed (``μ(x', −r') = μ(x, r)``); where it
        did not, the move was rejected.
      divergent: ``ΔH`` above :data:`~cenlmc_jax.irreversible.hmc.DIVERGENCE_THRESHOLD`
        or not finite (Stan's divergent transition), as for ``cj.hmc``.
      diverged: the log density was NaN or ``+inf`` at a finite point the trajectory
        reached (the model's own numerical trouble: ``cj.sample`` stops and reports
        it).
      start_logdensity: ``log π`` at the move's start.
      start_logdensity_sq: its square.
      divergent_logdensity: ``start_logdensity`` where the move was divergent, else 0.
      halved_logdensity: ``start_logdensity`` where the move halved its step, else 0
        (:func:`halved_depth`).
    """

    acceptance_rate: Array
    is_accepted: Array
    energy_error: Array
    grad_evals: Array
    halvings: Array
    halved: Array
    reversible: Array
    divergent: Array
    diverged: Array
    start_logdensity: Array
    start_logdensity_sq: Array
    divergent_logdensity: Array
    halved_logdensity: Array

    # a rejection keeps the position: the driver's frozen-chain check does not apply
    may_stay = True
    # cj.hmc's checks (the neck's with its own message: NECK_FLAG), a rising share of
    # halved moves (HALVED_FLAG: the chains still moving into a stiff region) and
    # halved moves that start at high density (HALVED_NECK_FLAG: a funnel's neck,
    # where the halvings leave no divergence for NECK_FLAG to see)
    run_flags = (
        ZERO_ACCEPTANCE_FLAG,
        DIVERGENT_FLAG,
        NECK_FLAG,
        HALVED_FLAG,
        HALVED_NECK_FLAG,
    )

    @property
    def zero_acceptance(self) -> Array:
        """The acceptance probability was exactly 0 (no draw could be accepted)."""
        return jnp.asarray(self.acceptance_rate) == 0


def autostep_hmc(
    logdensity_fn: LogDensityFn,
    step_size: Any,
    num_integration_steps: int,
    *,
    inverse_mass_matrix: Any = None,
    step_jitter: float = 0.2,
    max_halvings: int = MAX_HALVINGS,
    grad_mode: str = "auto",
) -> SamplingAlgorithm:
    """AutoStep HMC as a sampler object (one chain; :func:`cenlmc_jax.vmap_chains`
    for many). Module docstring for the move.

    Args:
      logdensity_fn: ``x -> log π(x)``, a scalar.
      step_size: ``ε > 0``, the step before halvings (may be a tracer).
      num_integration_steps: ``L >= 1`` leapfrog steps a move.
      inverse_mass_matrix: ``M``: ``None`` (the identity), a positive scalar, a
        ``(d,)`` diagonal or a ``(d, d)`` symmetric positive-definite array.
      step_jitter: ``j`` in ``[0, 1)``: each move's ``θ₀`` is ``ε U(1 − j, 1 + j)``.
      max_halvings: ``K >= 0``, the most halvings of the step in a move (0: HMC with
        a reverse check that always agrees).
      grad_mode: ``"auto"``, ``"reverse"`` or ``"forward"``
        (:func:`cenlmc_jax.gradients.modes.value_and_grad`).

    Returns:
      A :class:`~cenlmc_jax.base.SamplingAlgorithm`: ``init(position, rng_key=None)``
      gives an :class:`~cenlmc_jax.irreversible.hmc.HMCState`, ``step(rng_key,
      state)`` one move and its :class:`AutoStepInfo`.

    Raises:
      ValueError: a bad step size, step count, jitter, halving count or ``M``.
    """
    n_steps, jitter, M, vg = check_hmc_arguments(
        logdensity_fn,
        step_size,
        num_integration_steps,
        step_jitter,
        inverse_mass_matrix,
        grad_mode,
    )
    halvings = check_int(max_halvings, "max_halvings", minimum=0)
    init = hmc_init(logdensity_fn, M, vg)

    def step(rng_key: PRNGKey, state: HMCState) -> tuple[HMCState, AutoStepInfo]:
        check_state(state, HMCState, "autostep_hmc(...).init")
        check_key(rng_key)
        flat, unravel, leapfrog = whitened_leapfrog(M, vg, state.position)
        d, dt = flat.size, flat.dtype

        def energy(v, r):
            return 0.5 * jnp.sum(r**2) - v

        k_mom, k_low, k_jit, k_acc = jax.random.split(rng_key, 4)
        r0 = jax.random.normal(k_mom, (d,), dt)  # r = L_Mᵀ p ~ N(0, I)
        log_a = jnp.log(jnp.min(jax.random.uniform(k_low, (2,), dt)))
        theta0 = jnp.asarray(step_size, dt) * jax.random.uniform(
            k_jit, (), dt, 1 - jitter, 1 + jitter
        )

        def select(x, v, g, r):
            """``μ(x, r)``, without a derivative (an integer, and its loop's length
            depends on the state)."""
            x, v, g, r = jax.lax.stop_gradient((x, v, g, r))
            h0 = energy(v, r)

            def ratio(k):
                _, r1, v1, _ = leapfrog(theta0 * 0.5**k, x, r, g)
                e = h0 - energy(v1, r1)
                return jnp.where(jnp.isnan(e), -jnp.inf, e)

            def short(c):
                k, e = c
                return (k < 0) | ((e <= log_a) & (k < halvings))

            # from k = -1, so that the first ratio (k = 0) is the loop's own step:
            # one copy of the model's gradient in the compiled program, not two
            k, _ = jax.lax.while_loop(
                short,
                lambda c: (c[0] + 1, ratio(c[0] + 1)),
                (jnp.int32(-1), jnp.asarray(-jnp.inf, dt)),
            )
            return k

        def reverse_agrees(x, v, g, r, mu, e_last):
            """``μ(x, r) = mu`` from the end ``(x, r)`` of a trajectory at
            ``θ₀ 2^−mu`` whose last step's ``ℓ`` back is ``e_last`` (module
            docstring): ``(agree, steps evaluated)``, without a derivative."""
            x, v, g, r, e_last = jax.lax.stop_gradient((x, v, g, r, e_last))
            h0 = energy(v, r)

            def body(c):
                k, bad = c
                _, r1, v1, _ = leapfrog(theta0 * 0.5**k, x, r, g)
                e = h0 - energy(v1, r1)
                return k + 1, jnp.where(jnp.isnan(e), -jnp.inf, e) > log_a

            bad = (mu < halvings) & ~(e_last > log_a)
            k, bad = jax.lax.while_loop(
                lambda c: ~c[1] & (c[0] < mu), body, (jnp.zeros_like(mu), bad)
            )
            return ~bad, k

        g0 = ravel_pytree(state.logdensity_grad)[0]
        mu = select(flat, state.logdensity, g0, r0)
        theta = theta0 * 0.5 ** mu.astype(dt)

        def trajectory_step(_, c):
            # the energy before each step is carried: the last one's gives ℓ back
            # from the end (reverse_agrees) with one leapfrog step in the program
            x, r, v, g, _h = c
            return (*leapfrog(theta, x, r, g), energy(v, r))

        x1, r1, v1, g1, h_prev = jax.lax.fori_loop(
            0,
            n_steps,
            trajectory_step,
            (flat, r0, state.logdensity, g0, energy(state.logdensity, r0)),
        )
        e_last = energy(v1, r1) - h_prev
        same, back = reverse_agrees(x1, v1, g1, -r1, mu, e_last)
        new, test, flags = metropolis_end(
            k_acc, state, flat, unravel, r0, (x1, r1, v1, g1), agree=same
        )
        info = AutoStepInfo(
            *test,
            (n_steps + 1 + mu + back).astype(jnp.int32),
            mu.astype(jnp.int32),
            mu > 0,
            same,
            *flags,
            jnp.where(mu > 0, state.logdensity, jnp.zeros_like(state.logdensity)),
        )
        return new, info

    return SamplingAlgorithm(init, step)
