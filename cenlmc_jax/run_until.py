"""A run as long as the ensemble needs: ``cj.sample_until``.

``cj.sample`` runs a fixed number of steps. For many short chains started in
superchains (``cj.langevin_warmup``'s hand-over, :mod:`cenlmc_jax.diagnostics.nested`)
the length that matters is how long the chains take to forget where the warm-up put
them, which a single chain's relaxation time overstates by a large factor (issue 46:
the CLI ran 76 relaxation times). :func:`sample_until` runs segments of
segments (each one ``cj.sample`` call in stream mode, the step keys
``fold_in(rng_key, segment)``): two of ``segment_steps`` steps, then each as long as all
before it, so that the last segment is the second half of the run. After each, the
many-chain verdict is checked on the last segment (the first half of the run is its
burn-in, Gelman and Rubin's rule: the start's influence on the window then decays
geometrically with the run's length, not as one over it):

* nested R-hat of every ``x_i`` and ``x_i²`` at most
  :data:`~cenlmc_jax.diagnostics.nested.NESTED_RHAT_MAX`,
* no drift of the ensemble's means between the window's halves,
* no memory across the window: the correlation across chains of each chain's mean
  over the window's first half with its mean over the second at most
  :data:`~cenlmc_jax.diagnostics.nested.MEMORY_MAX` (a slow direction the superchain
  starts were not spread along: the banana's ridge),
* an ESS of every pooled mean of ``x_i`` and ``x_i²`` of at least ``ess_min``: its MCSE
  at most ``sd / sqrt(ess_min)`` (the MCSE target: 5 % of the sd at 400),
* no rise of a rate the sampler declares as a rising
  :class:`~cenlmc_jax.base.RunFlag` (HMC's divergent trajectories) beyond
  :data:`RISING_STOP_Z` standard errors between the halves of the last two segments
  (the window and the one before it, from the third segment on; the window alone
  before that): a slow creep shows over the longer lag, where the window's halves
  can look flat (centred eight schools stopped at 800 moves with log τ's sd 10 %
  low; over the two segments it ran 3,200 and was within 8 %). Such a rate is
  concentrated where the step is too long for the curvature, so it is far more
  sensitive to chains still creeping into a neck than the ensemble's moments are:
  on Brownian motion with missing data (benchmarks/results/many_chains.md) the
  divergence rate rose from 1.7 % to 2.6 % of moves between moves 320 and 1,280
  while the sd of log obs crept from 0.50 to 0.55 (0.61 at equilibrium), and the
  moments' tests passed at 640 moves. The run goes on while it rises; a rise that is
  still there at ``max_steps`` is the kept-step flag's (``RISING_Z``), which fails
  the CLI run.

It stops at the first segment (from ``min_segments`` on) where all hold, or at
``max_steps``; the result's ``online`` is the final
:class:`~cenlmc_jax.diagnostics.nested.ManyChainDiagnostics`, whose problems
(:func:`~cenlmc_jax.diagnostics.nested.many_chain_problems`) are then empty unless the
cap was reached. Same key, same draws: the segments do not depend on when the run
stopped. Stopping on the verdict makes the run length depend on the draws; the kept
draws are those of a run of that length, which is how Stan's and BlackJAX's adaptive
schemes are used too (the bias is of the order of the MCSE the rule asks for).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from cenlmc_jax._validation import check_int, check_key
from cenlmc_jax.base import RunResult, rising_z, run_flags
from cenlmc_jax.diagnostics import nested
from cenlmc_jax.diagnostics.convergence import in_superchains
from cenlmc_jax.run import sample

__all__ = [
    "sample_until",
    "SEGMENT_MIN",
    "SEGMENT_MAX",
    "RISING_STOP_Z",
    "rising_rates",
]

#: The shortest and longest segment :func:`default_segment` gives.
SEGMENT_MIN, SEGMENT_MAX = 25, 2000

#: The run does not stop while a rising-flag rate (divergences) rose by more than this
#: many standard errors between the window's halves: a t with 14 degrees of freedom
#: under stationarity exceeds 2 with probability 0.03, so a stationary run is
#: prolonged by one doubling about one time in 30 (cost only); the flag that fails the
#: run at the cap stays at ``base.RISING_Z`` = 5.
RISING_STOP_Z = 2.0


def rising_rates(info: Any) -> dict:
    """The rise of each rate the sampler declares rising (``RunFlag.rising``)
    between the halves of ``info``'s steps, in standard errors (``base.rising_z``).

    Args:
      info: per-step infos (leading axis the steps; a rate per step or per step and
        chain).

    Returns:
      ``{field: z}``; empty for a sampler without such flags.
    """
    out = {}
    for flag in run_flags(info):
        value = getattr(info, flag.field, None) if flag.rising else None
        if value is not None:
            out[flag.field] = rising_z(value)
    return out


def _kept_flag_texts(info: Any) -> set:
    """The warnings ``cj.sample`` gives for the kept-step flags of a segment run with
    no burn-in (:class:`~cenlmc_jax.base.RunFlag` ``kept_only``): a segment before the
    kept window is burn-in of the whole run, so its warnings of that kind are not
    passed on; the window's are (a neck's divergences warned once, not once a segment).
    """
    return {flag.message(info, 0) for flag in run_flags(info) if flag.kept_only}


def _reemit(caught: list, drop: set) -> None:
    """Warn again what a segment's ``cj.sample`` warned, less the texts in ``drop``."""
    for w in caught:
        if str(w.message) not in drop:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)


def default_segment(relaxation_steps: float | None) -> int:
    """Steps between checks: one relaxation time of the warm-up (``τ``), within
    [:data:`SEGMENT_MIN`, :data:`SEGMENT_MAX`]; 100 when ``τ`` is not known."""
    if relaxation_steps is None or not math.isfinite(relaxation_steps):
        return 100
    return int(min(SEGMENT_MAX, max(SEGMENT_MIN, math.ceil(relaxation_steps))))


def sample_until(
    rng_key: Any,
    step_fn: Any,
    initial_state: Any,
    *,
    max_steps: int = 20_000,
    segment_steps: int = 100,
    min_segments: int = 2,
    ess_min: float = nested.ESS_MIN,
    rhat_max: float = nested.NESTED_RHAT_MAX,
    progress: Callable[[int, Any], None] | None = None,
) -> RunResult:
    """Run ``step_fn`` from chains in superchains until the many-chain verdict holds.

    Args:
      rng_key: a JAX key; segment ``s`` runs ``cj.sample(fold_in(rng_key, s), ...)``.
      step_fn: a sampling algorithm over the chains (``warmup.algorithm``).
      initial_state: its state, whose ``position`` is laid out in at least
        :data:`~cenlmc_jax.diagnostics.nested.MIN_SUPERCHAINS` superchains
        (``warmup.state``).
      max_steps: the cap on steps.
      segment_steps: steps between checks (:func:`default_segment` of the warm-up's
        relaxation time is a good value).
      min_segments: checks start after this many segments (the drift test needs two
        halves).
      ess_min: the ESS asked of every pooled mean (the MCSE target).
      rhat_max: the nested R-hat threshold.
      progress: called after each segment as ``progress(steps_done, diagnostics)``
        (``diagnostics.going_on``: why the run does not stop there).

    Returns:
      A :class:`~cenlmc_jax.base.RunResult` in stream form: ``moments`` over the last
      segment (the kept window), ``burn_in`` the steps before it, ``info`` of every
      step, ``online`` the final
      :class:`~cenlmc_jax.diagnostics.nested.ManyChainDiagnostics` (None if the first
      segment diverged).

    Raises:
      ValueError: a bad count or key, or chains not in superchains (before any work).
    """
    check_key(rng_key)
    check_int(max_steps, "max_steps", minimum=1)
    check_int(segment_steps, "segment_steps", minimum=4)
    check_int(min_segments, "min_segments", minimum=1)
    position = getattr(initial_state, "position", None)
    if position is None or not in_superchains(position):
        raise ValueError(
            "initial_state: cj.sample_until needs chains started in superchains (at "
            f"least {nested.MIN_SUPERCHAINS} blocks of M >= 2 identical rows: "
            "cj.langevin_warmup's hand-over); for independent starts use cj.sample "
            "with a fixed num_steps."
        )
    m = nested.superchain_size(position)
    state, infos, res, kept = initial_state, [], None, None
    steps, segment, diverged_at, diag = 0, 0, -1, None
    segment_warnings: list = []
    while steps < max_steps:
        # the window is the last segment, as long as all before it: the first half
        # of the run is its burn-in (Gelman and Rubin's rule), so the start's
        # influence on the window decays geometrically, not as 1 / length
        n = min(segment_steps if segment < 2 else steps, max_steps - steps)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            res = sample(
                jax.random.fold_in(rng_key, segment),
                step_fn,
                state,
                n,
                mode="stream",
                on_divergence="stop",
                check_convergence=False,
                # one compiled chunk for every segment (each is a multiple of the
                # first): by default each new segment length would be a program of
                # its own, about 1.5 s of compilation each for a 100-d model on a
                # 2-core CPU
                chunk_size=segment_steps,
            )
        if segment_warnings:  # the segment before: its kept-step flags were not final
            _reemit(segment_warnings, _kept_flag_texts(infos[-1]))
        segment_warnings = caught
        infos.append(res.info)
        state, segment, kept = res.state, segment + 1, res
        if res.diverged_at >= 0:
            diverged_at = steps + res.diverged_at
            steps += res.num_steps_done
            diag = None
            break
        steps += n
        stats = nested.stream_chain_stats(res.online, m)
        if stats is None:  # fewer than 4 draws in a last, short segment
            break
        diag = nested.many_chain_diagnostics(stats, m)._replace(stats=stats)
        # over the last two segments (the kept window and the one before it, half
        # its length): a rate that creeps up over hundreds of moves (chains filling
        # a funnel's neck) rises too slowly within the window's halves alone
        recent = (
            jax.tree_util.tree_map(lambda *a: jnp.concatenate(a), *infos[-2:])
            if segment >= 3
            else res.info
        )
        rising = rising_rates(recent)
        going_on = (
            [f"the checks start after {min_segments} segments"]
            if segment < min_segments
            else []
        )
        going_on += nested.many_chain_problems(diag, rhat_max=rhat_max, ess_min=ess_min)
        going_on += [
            f"the rate of info.{field} still rises ({z:.1f} standard errors > "
            f"{RISING_STOP_Z:g} between the halves of the last two segments)"
            for field, z in rising.items()
            if z > RISING_STOP_Z
        ]
        diag = diag._replace(going_on=tuple(going_on))
        if progress is not None:
            progress(steps, diag)
        if not going_on:
            break
    _reemit(segment_warnings, set())  # the kept window's: all of them
    burn_in = steps - (kept.num_steps_done if diverged_at < 0 else 0)
    info = jax.tree_util.tree_map(lambda *a: jnp.concatenate(a), *infos)
    return RunResult(
        state, None, kept.moments, info, steps, diverged_at, burn_in, 1, diag
    )
