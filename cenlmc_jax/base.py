"""The sampler object every algorithm returns, what the driver returns, and the
step-size convention.

A :class:`SamplingAlgorithm` is a ``NamedTuple`` of two pure functions, in
the shape BlackJAX users know (``blackjax.base.SamplingAlgorithm``)::

    init(position_or_positions, rng_key=None) -> state
    step(rng_key, state) -> (state, info)

The constructors (``cj.lmc``, ``cj.cenlmc``, ``cj.sgld``, ...) check their
parameters once, in Python, and bind them; the free functions ``X_init`` /
``X_step`` stay the kernels underneath. ``cj.sample`` accepts the object (or
a bare step function); reusing the same object reuses its compilation.

An info class may name the flags the driver reports (``run_flags``, a tuple of
:class:`RunFlag`): ``cj.sample`` warns about them without knowing any sampler, and
the command line's verdict calls such a run UNRELIABLE
(``cenlmc_jax.cli.verdict.flag_problems``). The driver also watches the chains: one
whose ``state.position`` did not move at any step of a chunk is frozen (a step size
that reached 0, say) and reported, unless the info class declares
``may_stay = True`` (a Metropolis–Hastings sampler stays where it is on every
rejection); such a sampler reports its collapse itself, by an ``every_step`` flag
(zero acceptance probability at every step of a chunk).

:class:`RunResult` (with :class:`Moments`) is what ``cj.sample`` returns; it is
defined here, below the driver, so that the diagnostics read it without importing
the driver (which runs them at the end of a run:
``cenlmc_jax.diagnostics.convergence``). ``cenlmc_jax.run`` re-exports both.

Step sizes are ``step_size`` everywhere: a float ``> 0`` or, for ``cj.lmc`` and the
recipe family (``cj.sgld``, ``cj.sghmc``, ...) and SGRHMC, a schedule ``t -> ε_t``
of the state's step counter (an optax schedule works).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax.numpy as jnp
import numpy as np

from cenlmc_jax._host import fetch
from cenlmc_jax._validation import check_positive, is_concrete
from cenlmc_jax.types import Array

__all__ = [
    "RISING_Z",
    "rising_z",
    "SamplingAlgorithm",
    "StepSize",
    "RunFlag",
    "run_flags",
    "may_stay",
    "step_size_at",
    "Moments",
    "RunResult",
]

StepSize = float | Callable[[Array], Array]


class SamplingAlgorithm(NamedTuple):
    """A sampler: two pure functions; ``step`` is jittable.

    Attributes:
      init: ``init(position_or_positions, rng_key=None) -> state``.
      step: ``step(rng_key, state) -> (state, info)``.
    """

    init: Callable
    step: Callable


class RunFlag(NamedTuple):
    """A condition a sampler's info reports for the driver.

    ``cj.sample`` warns (``RuntimeWarning``) and the run goes on (a divergence,
    ``info.diverged``, is the driver's own and stops it).

    Attributes:
      field: the info's boolean field (per step; any particle or chain counts).
      message: ``(infos, first_step) -> str``: the warning, given the stacked infos
        of the steps checked and the first flagged step (counted from the run's
        start).
      kept_only: checked once per call on the kept steps (after ``burn_in``) when
        the run ends, instead of chunk by chunk as the run goes.
      every_step: reported only for a chain or particle whose field is set at
        *every* step of a chunk (of at least ``cj.run.WATCH_MIN_STEPS`` steps), read
        before the infos are reduced: a persistent condition (a collapsed
        acceptance rate), not one bad step. The message is then prefixed with how
        many chains, and ``first_step`` is the chunk's first step. ``field`` may
        name a property of the info class (computed from its fields).
      mean_below: with ``kept_only``, the field is a number per step (not a
        boolean) and the flag is set when its mean over the kept steps is below
        this value: a shortfall over the whole run, not one step's (CEnLMC's
        ensemble fraction). ``first_step`` is then the first kept step.
      efficiency_only: the condition costs efficiency, not correctness (CEnLMC's
        unused ensemble: LMC's answer at more cost): the CLI prints it as a warning
        naming the better choice and does not fail the run on it.
      rising: with ``kept_only``, the field is a rate per step (a boolean per chain,
        or its mean over chains) and the flag is set when its mean rises from the
        first to the second half of the kept steps by more than :data:`RISING_Z`
        standard errors (:func:`rising_z`): a rate that is fine at stationarity (HMC's
        divergent trajectories where the step is too long for a region) but whose
        drift says the chains are still moving into that region.
      steady: with ``rising``, ``(kept infos, rate) -> str``: the CLI's warning (exit 0)
        for a rate above 0 that did not rise (Stan's report of divergent
        transitions: exact all the same, but it says where the step cannot follow
        the posterior), or None.
      statistic: with ``kept_only``, ``infos -> float | None``, a number computed from
        the kept steps' infos (stacked, averaged over chains or not), and the flag is
        set when it exceeds ``above`` (None: not enough to judge). HMC's divergent
        trajectories that start where the density is high: a funnel's neck
        (:func:`cenlmc_jax.irreversible.hmc.neck_depth`).
      above: the threshold of ``statistic``.
    """

    field: str
    message: Callable[[Any, int], str]
    kept_only: bool = False
    every_step: bool = False
    mean_below: float | None = None
    efficiency_only: bool = False
    rising: bool = False
    steady: Callable[[Any, float], str] | None = None
    statistic: Callable[[Any], float | None] | None = None
    above: float = 0.0


#: :attr:`RunFlag.rising`: the rise of a rate between the halves of the kept steps, in
#: standard errors, above which the flag is set (batch means of 8 batches a half: a
#: t with 14 degrees of freedom under stationarity exceeds 5 with probability 1e-4).
RISING_Z = 5.0


def rising_z(values: Any) -> float:
    """How far a per-step rate rose from the first to the second half of its steps.

    Args:
      values: ``(steps,)`` or ``(steps, chains)`` (averaged over chains), numbers or
        booleans.

    Returns:
      ``(mean of the second half − mean of the first) / its standard error``, the
      error from batch means (the last ``16 b`` steps in 16 batches, 8 a half); 0 for
      fewer than 16 steps or a constant series.
    """
    v = np.asarray(values, np.float64)
    v = v.reshape(v.shape[0], -1).mean(1) if v.ndim > 1 else v
    n = (v.shape[0] // 16) * 16
    if n < 16:
        return 0.0
    b = v[v.shape[0] - n :].reshape(16, -1).mean(1)
    first, second = b[:8], b[8:]
    diff = float(second.mean() - first.mean())
    se = math.sqrt(float(first.var(ddof=1) + second.var(ddof=1)) / 8)
    if se == 0:
        return 0.0 if diff <= 0 else math.inf
    return diff / se


def run_flags(info: Any) -> tuple:
    """The :class:`RunFlag` s that ``info``'s class declares (``run_flags``).

    Args:
      info: a sampler's info (one step's, or stacked); only its class is read.

    Returns:
      The tuple of :class:`RunFlag` in the class's ``run_flags``, or ``()``.
    """
    flags = getattr(type(info), "run_flags", ())
    return (
        tuple(f for f in flags if isinstance(f, RunFlag))
        if isinstance(flags, tuple)
        else ()
    )


def may_stay(info: Any) -> bool:
    """Whether an unmoved chain may be legitimate for this sampler.

    True when ``info``'s class declares ``may_stay = True``: a step may
    legitimately leave the position unchanged (a Metropolis–Hastings rejection), so
    an unmoved chain is not by itself frozen.

    Args:
      info: a sampler's info; only its class is read.

    Returns:
      ``True`` if the class declares ``may_stay = True``, else ``False``.
    """
    return getattr(type(info), "may_stay", False) is True


def step_size_at(step_size: StepSize, step: Array, dtype) -> Array:
    """``ε_t``: the float itself, or the schedule evaluated at the step counter.

    Args:
      step_size: a float ``> 0`` or a schedule ``t -> ε_t`` (checked positive when
        its value is concrete).
      step: the state's step counter (an int or a traced scalar).
      dtype: the dtype of the result (the position's).

    Returns:
      ``ε_t`` as a 0-d array of ``dtype``.

    Raises:
      ValueError: a constant step size, or a schedule's concrete value, not ``> 0``.
    """
    if not callable(step_size):
        check_positive(step_size, "step_size")
        return jnp.asarray(step_size, dtype)
    eps = step_size(step)
    if is_concrete(eps):  # a constant schedule is concrete at a traced step too
        at = int(step) if is_concrete(step) else "t"
        check_positive(eps, f"step_size({at}) (the schedule's value)")
    return jnp.asarray(eps, dtype)


class Moments(NamedTuple):
    """Streaming per-coordinate moments (Chan et al. parallel update).

    Attributes:
      count: number of values combined (float, to allow > 2^31 values).
      mean: ``(d,)`` running mean.
      m2: ``(d,)`` running sum of squared deviations.
    """

    count: Array
    mean: Array
    m2: Array

    @property
    def variance(self) -> Array:
        """Population variance ``m2 / count`` (a NumPy array for concrete moments:
        computed on the host, no compiled program)."""
        if is_concrete(self.m2) and is_concrete(self.count):
            m2, count = fetch((self.m2, self.count))
            return np.asarray(m2) / np.maximum(np.asarray(count), 1)
        return self.m2 / jnp.maximum(self.count, 1)

    @property
    def std(self) -> Array:
        """Population standard deviation (NumPy for concrete moments)."""
        v = self.variance
        return np.sqrt(v) if isinstance(v, np.ndarray | np.generic) else jnp.sqrt(v)


class RunResult(NamedTuple):
    """What ``cj.sample`` (:func:`cenlmc_jax.run.sample`) returns.

    Attributes:
      state: the final state.
      trace: ``(num_kept, ...)`` stacked ``trace_fn(state)`` (``mode="trace"``),
        else None.
      moments: :class:`Moments` (``mode="stream"``), else None.
      info: the per-step (reduced) infos, leading axis ``num_steps_done``.
      num_steps_done: steps actually run, burn-in included (fewer than asked if
        the run stopped on divergence).
      diverged_at: first step whose ``info.diverged`` was true (or, with
        ``mode="stream"``, whose draw made the streamed moments overflow), or -1.
      burn_in: the burn-in steps asked for (their infos come first in ``info``).
      thin: every ``thin``-th state after the burn-in is in ``trace`` /
        ``moments``.
      online: ``mode="stream"``: the split R-hat, batch-means ESS and standard
        errors of ``x`` and ``x²`` per coordinate, accumulated as the run went
        (:class:`cenlmc_jax.diagnostics.online.StreamDiagnostics`); None in
        ``mode="trace"`` (the trace has them), for a run that diverged, kept fewer
        than 4 draws per chain (a run resumed from a checkpoint has them: the
        checkpoint keeps the accumulators).
    """

    state: Any
    trace: Array | None
    moments: Moments | None
    info: Any
    num_steps_done: int
    diverged_at: int
    burn_in: int = 0
    thin: int = 1
    online: Any = None
