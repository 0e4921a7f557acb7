"""HMC: Hamiltonian Monte Carlo, ``L`` leapfrog steps a move, preconditioned by ``M``.

Duane, Kennedy, Pendleton & Roweth (1987); Neal (2011, "MCMC using Hamiltonian
dynamics"). In paper 2's complete recipe it is the Hamiltonian system
``z = (x, p)``, ``H(x, p) = −log π(x) + ½ pᵀ M p``, ``D = 0``,
``Q = [[0, −I], [I, 0]]``, discretised by the leapfrog integrator and corrected by a
Metropolis test (paper 2, section 8's SDE proposals with the noise moved into a fresh
momentum). From ``x`` with ``ε = step_size`` and ``L = num_integration_steps``:

    p ~ N(0, M⁻¹)                                     (fresh momentum)
    L times:  p ← p + ε/2 ∇log π(x);  x ← x + ε M p;  p ← p + ε/2 ∇log π(x)
    accept (x_L, p_L) with probability min(1, exp(−ΔH)),  ΔH = H(x_L, p_L) − H(x, p)

Leapfrog is volume-preserving and reversible, so the move leaves ``π`` invariant
exactly (detailed balance of the momentum-flipped proposal). Written with
``M = L_M L_Mᵀ`` and ``r = L_Mᵀ p ~ N(0, I)`` the kinetic energy is ``½|r|²`` and a
position step is ``x ← x + ε L_M r``: HMC with the identity mass in the whitened
coordinates ``y = L_M⁻¹ x``, which is how it is computed here.

**Step jitter** (Neal 2011, section 5.4): each step draws its own
``ε_t = ε · U(1 − j, 1 + j)``, ``j = step_jitter``, so that no trajectory length is
a period of the dynamics for every chain. **A shorter step now and then**
(``small_step = (ε_s, q)``): with probability ``q`` a step uses ``ε_s`` instead of
``ε``, jittered the same way. Both choices are drawn from the step's key alone, not
from the state, so each step is a fixed mixture of HMC kernels, each of which leaves
``π`` invariant; so does the mixture (Tierney 1994). ``cj.langevin_warmup``'s exact
default hands over this sampler, with ``ε``, ``L``, ``M`` and the shorter step tuned
on the ensemble (:mod:`cenlmc_jax.adaptation.adjusted`).

The state carries the log density and its gradient at ``x`` (a rejected step costs
no recomputation); a step costs ``L`` gradients (``info.grad_evals``).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from cenlmc_jax._validation import (
    check_callable,
    check_int,
    check_key,
    check_logdensity,
    check_start_logdensity,
    check_state,
    is_concrete,
)
from cenlmc_jax.base import RunFlag, SamplingAlgorithm
from cenlmc_jax.ensemble.lmc import check_inverse_mass_matrix
from cenlmc_jax.gradients.estimators import flat_logdensity, ravel_position
from cenlmc_jax.gradients.modes import check_grad_mode, value_and_grad
from cenlmc_jax.irreversible._common import (
    ZERO_ACCEPTANCE_FLAG,
    from_flat,
    matrix_value,
    metropolis,
    spd_factor,
)
from cenlmc_jax.types import Array, LogDensityFn, PRNGKey

__all__ = ["HMCState", "HMCInfo", "hmc", "neck_depth", "neck_depth_lower"]


class HMCState(NamedTuple):
    """State of one HMC chain.

    Attributes:
      position: ``(d,)`` or a pytree, the sample ``x``.
      logdensity: scalar ``log π(x)``.
      logdensity_grad: ``∇log π(x)``, shaped like ``position``.
    """

    position: Any
    logdensity: Array
    logdensity_grad: Any


#: ``ΔH`` above this is a divergent move in Stan's and BlackJAX's terms (their
#: threshold).
DIVERGENCE_THRESHOLD = 1000.0

#: :func:`neck_depth` above this (standard deviations of the ensemble's log density)
#: says the divergent trajectories start in a funnel's neck. With 2,000 chains after
#: ``cj.langevin_warmup`` (benchmarks/results/neck_depth.md) Neal's funnel (d = 10),
#: centred eight schools and Brownian motion with unknown scales, whose necks the
#: chains do not fill, lie well above it, and the banana, whose divergences start at its
#: arms' tips, well below zero; a 3-d funnel's neck, where the log density varies less,
#: a little above it (tests/irreversible/test_hmc.py). The checks compare
#: :func:`neck_depth_lower` with it: the depth less :data:`NECK_Z` standard errors.
NECK_DEPTH = 0.5
#: :func:`neck_depth` judges only a run whose kept moves diverged at least this often
#: (a few divergent moves say little about where they start).
NECK_MIN_RATE = 5e-4
#: The neck checks fire where the depth less this many of its standard errors
#: (:func:`neck_depth_lower`) is above :data:`NECK_DEPTH`. Judged on the point
#: estimate, non-centred eight schools, right, failed the CLI run at seeds 3 and 4
#: (depth +0.53 and +0.60 from about 25 divergent moves, 0.05 % of the kept ones).
NECK_Z = 2.0
#: Batches of consecutive kept steps for :func:`neck_depth_lower`'s standard error.
NECK_BATCHES = 16


def _depth_terms(infos: Any, indicator: str, weighted: str):
    """Per kept step ``t`` that can be judged: ``(Σ_chains z · 1{counted}) / N`` and
    ``r_t`` (module :func:`neck_depth`), or None when there is nothing to judge."""

    def per_step(name):
        v = np.asarray(getattr(infos, name), np.float64)
        return v.reshape(v.shape[0], -1).mean(1) if v.ndim else v.reshape(1)

    r = per_step(indicator)
    if r.size == 0 or not float(np.mean(r)) >= NECK_MIN_RATE:
        return None
    a, b = per_step("start_logdensity"), per_step("start_logdensity_sq")
    c = per_step(weighted)
    var = b - a * a
    eps = float(np.finfo(np.asarray(infos.start_logdensity).dtype).eps)
    ok = np.isfinite(var) & (var > 100.0 * eps * a * a) & (r > 0)
    if not np.sum(r[ok]) > 0.0:
        return None
    return (c[ok] - r[ok] * a[ok]) / np.sqrt(var[ok]), r[ok]


def neck_depth(
    infos: Any,
    indicator: str = "divergent",
    weighted: str = "divergent_logdensity",
) -> float | None:
    """Where HMC's divergent trajectories start, in the ensemble's log density.

    A trajectory diverges where the step is too long for the curvature. In a tail (a
    banana's arms) that is a region of low density which the chains visit now and
    then, and the rejections cost only efficiency. In a funnel's neck (a scale
    parameter near zero in a centred hierarchical or state-space model) it is a
    narrow region of *high* density: the chains cannot enter it, started outside it
    (as every warm-up starts them) they do not fill it, and the estimates miss its mass
    (centred eight schools: log τ's sd 8 % low after 3,200 moves; Brownian motion with
    unknown scales: log obs's sd 15 % low after 6,400). Stan's advice for divergences
    that concentrate in one region.

    With ``r_t`` the share of the chains whose move ``t`` diverged, ``ā_t`` and
    ``s_t`` the mean and standard deviation over the chains of the log density at the
    moves' starts, and ``c_t`` the mean over the chains of that log density times the
    divergent indicator (the infos' ``divergent``, ``start_logdensity``,
    ``start_logdensity_sq`` and ``divergent_logdensity``, per chain or averaged)::

        depth = Σ_t (c_t − r_t ā_t) / s_t  /  Σ_t r_t,

    the mean over the divergent moves of ``(log π(start) − ā_t) / s_t``. A step whose
    ``s_t²`` is within ``100 ε ā_t²`` of zero (``ε`` the infos' float precision: the
    rounding of ``E[log π²] − ā²``, or a single chain) is left out. The checks judge
    it by its lower confidence bound, :func:`neck_depth_lower`.

    Args:
      infos: the kept moves' :class:`HMCInfo`, stacked along a leading step axis.
      indicator: the infos' field of the moves counted (``divergent``; AutoStep HMC's
        ``halved`` too: :func:`cenlmc_jax.irreversible.autostep.halved_depth`).
      weighted: the field holding the start's log density where ``indicator`` is
        set, else 0.

    Returns:
      ``depth``, or None when fewer than :data:`NECK_MIN_RATE` of the moves were
      counted or no step could be judged.
    """
    terms = _depth_terms(infos, indicator, weighted)
    if terms is None:
        return None
    u, r = terms
    return float(np.sum(u) / np.sum(r))


def neck_depth_lower(
    infos: Any,
    indicator: str = "divergent",
    weighted: str = "divergent_logdensity",
) -> float | None:
    """:func:`neck_depth` less :data:`NECK_Z` of its standard errors: what the neck
    checks compare with :data:`NECK_DEPTH`, so that a depth read from a few dozen
    divergent moves does not fail a right run.

    The standard error is the ratio estimator's, from batch means: the kept steps
    that can be judged are cut into ``B = min(steps, NECK_BATCHES)`` runs of
    consecutive steps, with sums ``U_b = Σ (c_t − r_t ā_t) / s_t`` and ``R_b = Σ r_t``
    over each, and ``SE² = B / (B − 1) · Σ_b (U_b − depth · R_b)² / (Σ_b R_b)²``. The
    batches take in the spread between the chains of a step and between steps,
    and the correlation of a chain that diverges on consecutive moves within a batch.

    Args:
      infos: as for :func:`neck_depth`.
      indicator: as for :func:`neck_depth`.
      weighted: as for :func:`neck_depth`.

    Returns:
      ``depth − NECK_Z · SE``, or None where :func:`neck_depth` is None or fewer than
      two steps could be judged.
    """
    terms = _depth_terms(infos, indicator, weighted)
    if terms is None or terms[0].size < 2:
        return None
    u, r = terms
    depth = float(np.sum(u) / np.sum(r))
    batches = np.array_split(np.arange(u.size), min(u.size, NECK_BATCHES))
    e = np.array([np.sum(u[i]) - depth * np.sum(r[i]) for i in batches])
    k = len(batches)
    se = math.sqrt(k / (k - 1) * float(np.sum(e**2))) / float(np.sum(r))
    return depth - NECK_Z * se


def _steady_message(infos: Any, rate: float) -> str:
    """The CLI's warning for a steady rate of divergent trajectories, with where they
    start (:func:`neck_depth` of the kept moves ``infos``)."""
    text = (
        f"{rate:.2%} of the kept moves had divergent trajectories (Stan's divergent "
        "transitions), at a steady rate: each is a rejected move, so the draws stay "
        "exact, but the step is too long for the curvature of a region the chains "
        "visit. "
    )
    depth, lower = neck_depth(infos), neck_depth_lower(infos)
    if depth is None:
        return text + (
            "Where they start in a tail, at low density (a banana's arms), they cost "
            "efficiency; where they start at high density (a funnel's neck) the chains "
            "cannot enter the region and the run fails its verdict (neck_depth)"
        )
    where = (
        "at high density: a funnel's neck (the run fails its verdict)"
        if lower is not None and lower > NECK_DEPTH
        else "not at high density (where it is above "
        f"{NECK_DEPTH:g} by {NECK_Z:g} standard errors, a funnel's neck, the run "
        "would fail): in a region the chains visit, at a cost in efficiency"
    )
    return text + (
        f"They start {depth:+.2g} standard deviations of the ensemble's log density "
        f"from its mean{_uncertainty(depth, lower)} (neck_depth), {where}"
    )


def _uncertainty(depth: float | None, lower: float | None) -> str:
    """`` ± SE`` of a depth from :func:`neck_depth_lower`'s bound, for a message."""
    if depth is None or lower is None:
        return ""
    return f" (± {(depth - lower) / NECK_Z:.2g})"


def _neck_message(infos: Any, step: int) -> str:
    depth = neck_depth(infos)
    return (
        "HMC's divergent trajectories start where the density is high: their log "
        f"density is on average {math.nan if depth is None else depth:.2g}"
        f"{_uncertainty(depth, neck_depth_lower(infos))} standard deviations above "
        f"the ensemble's mean (kept moves from step {step}). The "
        "step is too long for a narrow region that holds much mass, a funnel's neck "
        "(a scale parameter near zero in a centred hierarchical or state-space "
        "model): the chains cannot enter it, so its mass is undersampled and the "
        "estimates are biased (that scale parameter's sd and lower tail most). A "
        "smaller step only hides the divergences: reparametrise the model "
        "(non-centred)"
    )


#: The driver's warning (the CLI's failed check) for a rate of divergent trajectories
#: (``info.divergent``) that rises between the halves of the kept moves.
DIVERGENT_FLAG = RunFlag(
    "divergent",
    lambda infos, step: (
        "the rate of HMC's divergent trajectories (energy error above "
        f"{DIVERGENCE_THRESHOLD:g} or not finite) rose between the halves of the "
        f"kept moves (from step {step}): the chains are still moving into a region "
        "whose curvature the step is too long for (a funnel's neck), which is "
        "undersampled so far; the estimates may be biased. Reparametrise the model "
        "(non-centred), or run longer"
    ),
    kept_only=True,
    rising=True,
    steady=_steady_message,
)

#: The driver's warning (the CLI's failed check) for divergent trajectories that start
#: where the density is high (:func:`neck_depth_lower` above :data:`NECK_DEPTH`).
NECK_FLAG = RunFlag(
    "divergent",
    _neck_message,
    kept_only=True,
    statistic=neck_depth_lower,
    above=NECK_DEPTH,
)


class HMCInfo(NamedTuple):
    """What one HMC step did (one chain).

    Attributes:
      acceptance_rate: ``min(1, exp(−ΔH))``.
      is_accepted: the trajectory's end was accepted.
      energy_error: ``ΔH`` (``inf`` where the trajectory left the finite numbers);
        above :data:`DIVERGENCE_THRESHOLD` Stan and BlackJAX call the move divergent.
        Here such a move is a rejection like any other (exact either way) and the
        run goes on.
      grad_evals: gradients evaluated, ``L``.
      divergent: a divergent trajectory (``ΔH`` above :data:`DIVERGENCE_THRESHOLD` or
        not finite: Stan's divergent transition; a trajectory that left the support,
        ``-inf``, is a plain rejection). Each is a rejected move, so the chain stays
        exact; at stationarity their rate is a constant (a banana's arms: about 4 %
        of moves, the shorter step covering them). A rate that rises over the kept
        moves says that the chains are still moving into a region where the step is
        too long (centred eight schools: 0.3 % of moves in the first 200, 1.7 % in
        the fifth 200): ``cj.sample`` warns and the CLI fails the run
        (:data:`DIVERGENT_FLAG`).
      diverged: the log density was NaN or ``+inf`` at a finite point the
        trajectory reached (the model's own numerical trouble: the move was
        rejected, and ``cj.sample`` stops and reports it). ``-inf`` is a legal zero
        density, and a trajectory that left the finite numbers (leapfrog is unstable
        where the step is too long for the curvature) is a rejected move with
        ``energy_error = inf``, as in Stan, not a reason to stop the run: the chain
        stays exact, and whether a region is undersampled is the many-chain
        verdict's question.
      start_logdensity: ``log π`` at the move's start (averaged over chains by the
        driver: the ensemble's mean).
      start_logdensity_sq: its square (with it, the ensemble's spread of ``log π``).
      divergent_logdensity: ``start_logdensity`` where the move was divergent, else
        0 (:func:`neck_depth` reads where the divergent moves start from these).
    """

    acceptance_rate: Array
    is_accepted: Array
    energy_error: Array
    grad_evals: Array
    divergent: Array
    diverged: Array
    start_logdensity: Array
    start_logdensity_sq: Array
    divergent_logdensity: Array

    # a rejection keeps the position: the driver's frozen-chain check does not apply
    may_stay = True
    run_flags = (ZERO_ACCEPTANCE_FLAG, DIVERGENT_FLAG, NECK_FLAG)

    @property
    def zero_acceptance(self) -> Array:
        """The acceptance probability was exactly 0 (no draw could be accepted)."""
        return jnp.asarray(self.acceptance_rate) == 0


def check_step_size(step_size: Any, name: str) -> None:
    """A ``ValueError`` naming ``name`` unless a concrete ``step_size`` is a finite
    number ``> 0`` (a tracer passes).

    Args:
      step_size: the step.
      name: the argument's name, for the message.
    """
    if is_concrete(step_size):
        s = float(np.asarray(step_size))
        if not (np.isfinite(s) and s > 0):
            raise ValueError(f"{name} must be a finite number > 0; got {step_size!r}")


def hmc(
    logdensity_fn: LogDensityFn,
    step_size: Any,
    num_integration_steps: int,
    *,
    inverse_mass_matrix: Any = None,
    step_jitter: float = 0.2,
    small_step: tuple | None = None,
    grad_mode: str = "auto",
) -> SamplingAlgorithm:
    """HMC as a sampler object (one chain; :func:`cenlmc_jax.vmap_chains` for many).

    Args:
      logdensity_fn: ``x -> log π(x)``, a scalar.
      step_size: the leapfrog step ``ε > 0`` (may be a tracer).
      num_integration_steps: ``L >= 1`` leapfrog steps a move.
      inverse_mass_matrix: ``M``: ``None`` (the identity), a positive scalar, a
        ``(d,)`` diagonal or a ``(d, d)`` symmetric positive-definite array.
      step_jitter: ``j`` in ``[0, 1)``: each move's step is ``ε U(1 − j, 1 + j)``.
      small_step: ``(ε_s, q)``: a move uses ``ε_s`` instead of ``ε`` with probability
        ``q`` in ``[0, 1]``, or None (module docstring).
      grad_mode: ``"auto"``, ``"reverse"`` or ``"forward"``
        (:func:`cenlmc_jax.gradients.modes.value_and_grad`).

    Returns:
      A :class:`~cenlmc_jax.base.SamplingAlgorithm`: ``init(position, rng_key=None)``
      gives an :class:`HMCState`, ``step(rng_key, state)`` one HMC move and its
      :class:`HMCInfo`.

    Raises:
      ValueError: a bad step size, step count, jitter, shorter step or ``M``.
    """
    n_steps, jitter, M, vg = check_hmc_arguments(
        logdensity_fn,
        step_size,
        num_integration_steps,
        step_jitter,
        inverse_mass_matrix,
        grad_mode,
    )
    if small_step is not None:
        if len(small_step) != 2:
            raise ValueError(
                f"small_step must be (step, probability) or None; got {small_step!r}"
            )
        check_step_size(small_step[0], "small_step[0]")
        q = float(small_step[1])
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"small_step[1] must be in [0, 1]; got {small_step[1]!r}")
    init = hmc_init(logdensity_fn, M, vg)

    def step(rng_key: PRNGKey, state: HMCState) -> tuple[HMCState, HMCInfo]:
        check_state(state, HMCState, "hmc(...).init")
        check_key(rng_key)
        flat, unravel, leapfrog = whitened_leapfrog(M, vg, state.position)
        d, dt = flat.size, flat.dtype
        k_mom, k_jit, k_small, k_acc = jax.random.split(rng_key, 4)
        eps = jnp.asarray(step_size, dt)
        if small_step is not None:
            pick = jax.random.uniform(k_small, (), dt) < small_step[1]
            eps = jnp.where(pick, jnp.asarray(small_step[0], dt), eps)
        eps = eps * jax.random.uniform(k_jit, (), dt, 1 - jitter, 1 + jitter)
        r0 = jax.random.normal(k_mom, (d,), dt)  # r = L_Mᵀ p ~ N(0, I)
        g0 = ravel_pytree(state.logdensity_grad)[0]
        x1, r1, v1, g1 = jax.lax.fori_loop(
            0,
            n_steps,
            lambda _, c: leapfrog(eps, c[0], c[1], c[3]),
            (flat, r0, state.logdensity, g0),
        )
        new, test, flags = metropolis_end(
            k_acc, state, flat, unravel, r0, (x1, r1, v1, g1)
        )
        info = HMCInfo(*test, jnp.asarray(n_steps, jnp.int32), *flags)
        return new, info

    return SamplingAlgorithm(init, step)


def metropolis_end(key, state, flat, unravel, r0, end, agree=True) -> tuple:
    """The Metropolis test of a leapfrog trajectory from ``state`` (``flat``, its
    position as a vector, with momentum ``r0``) to ``end = (x, r, log π(x), ∇log
    π(x))``, the move HMC and AutoStep HMC share.

    A trajectory that left the finite numbers has ``ΔH = inf`` (a rejection); one that
    left the support (``-inf`` at a finite point) is a plain rejection, not a
    divergence.

    Args:
      key: the accept/reject key.
      state: the chain's :class:`HMCState`.
      flat: its position as a vector.
      unravel: the map back to the position's shape.
      r0: the starting momentum (whitened).
      end: the trajectory's end, vectors.
      agree: False (or a traced False) rejects the move whatever ``ΔH``
        (AutoStep's reverse check).

    Returns:
      ``(new state, (acceptance_rate, is_accepted, energy_error), (divergent,
      diverged, start_logdensity, start_logdensity_sq, divergent_logdensity))``:
      the fields of :class:`HMCInfo` around its ``grad_evals``.
    """
    x1, r1, v1, g1 = end
    v0 = state.logdensity
    g0 = ravel_pytree(state.logdensity_grad)[0]
    dh = (0.5 * jnp.sum(r1**2) - v1) - (0.5 * jnp.sum(r0**2) - v0)
    fine = jnp.all(jnp.isfinite(x1)) & jnp.all(jnp.isfinite(g1))
    bad = ~(fine & jnp.isfinite(v1))
    dh = jnp.where(bad | jnp.isnan(dh), jnp.inf, dh)
    log_ratio = -dh if agree is True else jnp.where(agree, -dh, -jnp.inf)
    accepted, rate = metropolis(key, log_ratio)
    new = HMCState(
        unravel(jnp.where(accepted, x1, flat)),
        jnp.where(accepted, v1, v0),
        unravel(jnp.where(accepted, g1, g0)),
    )
    divergent = (dh > DIVERGENCE_THRESHOLD) & ~(fine & (v1 == -jnp.inf))
    flags = (
        divergent,
        fine & (jnp.isnan(v1) | (v1 == jnp.inf)),
        v0,
        v0 * v0,
        jnp.where(divergent, v0, jnp.zeros_like(v0)),
    )
    return new, (rate, accepted, dh), flags


def check_hmc_arguments(
    logdensity_fn: Any,
    step_size: Any,
    num_integration_steps: Any,
    step_jitter: Any,
    inverse_mass_matrix: Any,
    grad_mode: str,
) -> tuple:
    """The arguments HMC and AutoStep HMC share, checked before tracing (a
    ``ValueError`` naming the argument).

    Args:
      logdensity_fn: ``x -> log π(x)``.
      step_size: ``ε``.
      num_integration_steps: ``L``.
      step_jitter: ``j``.
      inverse_mass_matrix: ``M`` or None.
      grad_mode: as for :func:`hmc`.

    Returns:
      ``(L, j, M's value or None, x -> (log π(x), ∇log π(x)))``.
    """
    check_callable(logdensity_fn, "logdensity_fn", "x -> scalar log density")
    check_step_size(step_size, "step_size")
    n_steps = check_int(num_integration_steps, "num_integration_steps", minimum=1)
    jitter = float(step_jitter)
    if not 0.0 <= jitter < 1.0:
        raise ValueError(f"step_jitter must be in [0, 1); got {step_jitter!r}")
    check_grad_mode(grad_mode)
    check_inverse_mass_matrix(inverse_mass_matrix)
    M = None if inverse_mass_matrix is None else matrix_value(inverse_mass_matrix)
    return n_steps, jitter, M, value_and_grad(logdensity_fn, grad_mode)


def hmc_init(logdensity_fn: LogDensityFn, M: Any, vg: Any) -> Any:
    """HMC's ``init(position, rng_key=None)``: the position checked (its log density
    finite, ``M`` of its size) with its value and gradient, as an :class:`HMCState`.

    Args:
      logdensity_fn: ``x -> log π(x)``.
      M: the inverse mass matrix's value, or None.
      vg: ``x -> (log π(x), ∇log π(x))``.

    Returns:
      The ``init`` function.
    """
    # the start's value and gradient as one compiled program: called eagerly (or
    # vmapped eagerly over chains), the model would compile each of its operations
    # on its own, which was a quarter of a small model's warm-up
    vg_start = jax.jit(vg)

    def init(position, rng_key=None):
        if rng_key is not None:
            # unused (a deterministic start), but a wrong one is a mistake to report
            check_key(rng_key)
        flat, unravel = ravel_position(position)
        check_logdensity(flat_logdensity(logdensity_fn, unravel), flat)
        if M is not None:
            check_inverse_mass_matrix(M, int(flat.size))
        position = from_flat(unravel, flat)
        value, grad = vg_start(position)
        check_start_logdensity(value)
        return HMCState(position, jnp.asarray(value, flat.dtype), grad)

    return init


def whitened_leapfrog(M: Any, vg: Any, position: Any) -> tuple:
    """A chain's position flattened, and the leapfrog step in the coordinates
    whitened by ``M`` that HMC and AutoStep HMC take.

    Args:
      M: the inverse mass matrix's value, or None (the identity).
      vg: ``x -> (log π(x), ∇log π(x))`` of a position as the user gives it.
      position: the chain's position (an array or a pytree).

    Returns:
      ``(flat, unravel, leapfrog)``: the position as a vector, the map back, and
      ``leapfrog(ε, x, r, g) -> (x', r', log π(x'), ∇log π(x'))`` (one step from
      ``x`` with momentum ``r = L_Mᵀ p`` and gradient ``g``, all vectors).
    """
    flat, unravel = ravel_position(position, check=False)
    unravel = unravel or (lambda z: z)
    times, times_t = whitened_factor(M, flat.size, flat.dtype)

    def leapfrog(eps, x, r, g):
        r = r + 0.5 * eps * times_t(g)
        x = x + eps * times(r)
        v, g = vg(unravel(x))
        g = ravel_pytree(g)[0]
        return x, r + 0.5 * eps * times_t(g), v, g

    return flat, unravel, leapfrog


def whitened_factor(M: Any, d: int, dt: Any) -> tuple:
    """``(v ↦ L_M v, v ↦ L_Mᵀ v)`` for ``M = L_M L_Mᵀ`` (the identity when ``M`` is
    None), in ``dt``: the leapfrog step in whitened coordinates.

    Args:
      M: the inverse mass matrix's value, or None.
      d: the dimension.
      dt: the dtype.

    Returns:
      The two products.
    """
    root = (
        jnp.ones((), dt)
        if M is None
        else jnp.asarray(spd_factor(jnp.asarray(M, dt), d)[0], dt)
    )

    def times(v):  # L_M v
        return root @ v if root.ndim == 2 else root * v

    def times_t(v):  # L_Mᵀ v
        return root.T @ v if root.ndim == 2 else root * v

    return times, times_t
