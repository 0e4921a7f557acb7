"""Has a run converged? The end-of-run checks of ``cj.sample`` and of the CLI's verdict
(one implementation).

:func:`convergence_problems` reads a finished :class:`~cenlmc_jax.base.RunResult` and
returns one sentence per reason to distrust its draws (an empty list: none found).
``cj.sample`` warns each as a :class:`ConvergenceWarning` (``check_convergence=True``,
the default); ``cenlmc-jax sample`` prints each as an ``UNRELIABLE:`` line and exits
non-zero.

* **Frozen chains** (:func:`frozen_rows`): a chain or particle whose position at the end
  of the run equals, in every coordinate and bit for bit, its position at the start. A
  continuous sampler that moved cannot come back to the same floating-point point; one
  that never moved has a step size that collapsed (0, or so small that every step rounds
  away), rejects every proposal, or started where the density or its gradient is not
  finite. Metropolis samplers are included: the driver's per-chunk watch exempts them (a
  rejection keeps the position), this check does not.
* **R-hat**: the rank-normalised split R-hat (Vehtari et al. 2021, eq. 14-16: the larger
  of the bulk and the folded value),
  :func:`~cenlmc_jax.diagnostics.potential_scale_reduction` with ``rank=True``, the
  ``r_hat`` column of ``cj.summary``, above :data:`RHAT_MAX` = 1.01 (their recommended
  threshold) at any coordinate. The "chains" are the chains of ``cj.vmap_chains`` or the
  particles of an ensemble; one chain is split into its two halves. A converged run's
  R-hat is ``sqrt(1 + 1/ESS_c - 1/n)`` with ``ESS_c`` the effective draws of one
  half-chain of ``n`` draws: 1.01 asks every chain (particle) for about 50 effective
  draws per half, so many short chains that each explored little are flagged even when
  their pooled average is good. That is the criterion's intent (each chain must have
  forgotten its start); ``check_convergence=False`` turns it off.
* **Bulk ESS**: the rank-normalised split ESS (``ess_bulk`` of ``cj.summary``,
  :func:`~cenlmc_jax.diagnostics.effective_sample_size` with ``method="bulk"``) below
  :func:`ess_floor` ``= min(100 C, 400)`` for ``C`` chains at any coordinate: Stan's 100
  per chain, capped at Vehtari et al.'s 400 in all (§4.4: below it the R-hat and the
  Monte Carlo standard errors are themselves unreliable).

* **Many short chains with independent starts** (``many_short_chains=True``, the
  CLI's verdict; :func:`judge_short_chains`): a split R-hat above ``rhat_max`` of at
  least :data:`MIN_INDEPENDENT_CHAINS` chains whose starts are spread and not in
  superchains is judged again as many chains. Stationary chains of ``n`` draws have a
  split R-hat of about ``sqrt(1 + 2 τ / n)`` however many run; the question for many
  chains is whether they forgot their starts (:func:`independent_chain_diagnostics`:
  the chain means regressed on the starts, the ensemble's drift, the ESS from the
  chain means, the effective draws per chain). The R-hat is a problem only when one of
  those fails; otherwise a sentence in ``notes`` says why it is the floor.

What can be checked where:

* ``mode="trace"``: all three (a trace that is one array; a pytree trace gets the frozen
  check only). R-hat and ESS need at least 4 kept draws per chain (two halves of two);
  fewer is reported as a problem of its own.
* ``mode="stream"``: the frozen check only. The moments pool every chain and step, so
  the between-chain variance R-hat needs and the autocorrelation ESS needs are gone: run
  a ``mode="trace"`` pilot (or thin a trace) to check them.
* A run that diverged: nothing here (the driver reports the divergence). Inside
  ``jax.jit`` or ``jax.grad``: nothing (the values are not known while tracing).

Cost: R-hat and ESS are one jitted call per trace shape ``(chains, draws, d)``: XLA
compiles it the first time a shape is seen (seconds on a CPU:
``benchmarks/results/silent_failures.md``) and it runs in milliseconds to a second after
that. An ensemble of more than :data:`MAX_CHECKED_CHAINS` particles is checked on that
many evenly spaced particles (exchangeable: R-hat is the same diagnostic, and the bulk
ESS is scaled by ``N / 64``, exact in expectation for independent particles); the
messages say so.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import numpy as np

from cenlmc_jax._validation import is_concrete
from cenlmc_jax.base import RunResult
from cenlmc_jax.diagnostics import nested
from cenlmc_jax.diagnostics.chains import (
    effective_sample_size,
    potential_scale_reduction,
)
from cenlmc_jax.diagnostics.layout import chains_first

__all__ = [
    "ConvergenceWarning",
    "RHAT_MAX",
    "ESS_PER_CHAIN",
    "ESS_FLOOR_MAX",
    "ess_floor",
    "frozen_rows",
    "convergence_problems",
    "in_superchains",
    "MIN_INDEPENDENT_CHAINS",
    "independent_starts",
    "independent_chain_diagnostics",
    "independent_chain_problems",
    "judge_short_chains",
]

#: Vehtari et al. (2021)'s threshold for the rank-normalised split R-hat.
RHAT_MAX = 1.01
#: Bulk ESS asked per chain (Stan's), and the total above which no more is asked
#: (Vehtari et al., §4.4).
ESS_PER_CHAIN, ESS_FLOOR_MAX = 100, 400
#: Kept draws per chain that split R-hat and split ESS need (two halves of two draws).
MIN_DRAWS = 4
#: At most this many chains (particles) are checked: R-hat over 64 particles sees any
#: that has not mixed as well as over all of them, and the cost (and the compiled
#: shapes) stay bounded for large ensembles.
MAX_CHECKED_CHAINS = 64
#: Chains with independent starts from which a split R-hat above its threshold is
#: judged again as many short chains (:func:`judge_short_chains`): the regression of
#: their means on the starts then has ``C - 2 >= 30`` degrees of freedom, and the ESS
#: from the spread of the chain means a relative sd ``sqrt(2 / (C - 1)) <= 0.25``
#: (nested.TARGET_SUPERCHAINS' figure for superchains).
MIN_INDEPENDENT_CHAINS = 32
#: Effective draws per chain, ``n / τ``, below which short chains are not excused
#: (:func:`independent_chain_problems`). The drift test sees what is left of a start's
#: bias only while it still decays inside the window: for a relaxation ``e^{-t/T}``
#: with ``τ = 2 T`` (an AR(1)'s), the pooled mean's bias is ``coth(n / 2τ)`` times the
#: halves' difference in standard errors: 1.04 at ``n = 4 τ``, 1.31 at ``2 τ``, 2.2 at
#: ``τ``. And ``τ`` measured from the spread of the chain means cannot exceed ``n``, so
#: a chain far longer in ``τ`` than the run reads as ``n / τ ≈ 1``. At 4 the split
#: R-hat's own floor is ``sqrt(1 + 1 / 2) = 1.22``: the judgement excuses chains a few
#: times too short for 1.1 (5 effective draws per half-chain), not chains stuck.
MIN_EFFECTIVE_PER_CHAIN = 4.0


class ConvergenceWarning(UserWarning):
    """A run whose draws are not to be trusted.

    Frozen chains, R-hat above 1.01, bulk ESS below the floor. A ``UserWarning``
    (as scikit-learn's ``ConvergenceWarning``): the run itself worked; its
    length or tuning did not. Silence it with
    ``warnings.simplefilter("ignore", ConvergenceWarning)`` or
    ``cj.sample(..., check_convergence=False)``.
    """


def ess_floor(num_chains: int) -> int:
    """The bulk ESS asked of ``num_chains`` chains: ``min(100 num_chains, 400)``.

    Args:
      num_chains: the number of chains (or particles); at least 1 is counted.

    Returns:
      The floor, an int.
    """
    return int(min(ESS_PER_CHAIN * max(int(num_chains), 1), ESS_FLOOR_MAX))


def _rows(leaves: list) -> int:
    """Chains or particles of a position.

    The leaves' shared leading axis when some leaf has ndim >= 2, else 1.
    """
    lead = {np.shape(x)[0] if np.ndim(x) else None for x in leaves}
    if len(lead) == 1 and None not in lead and any(np.ndim(x) >= 2 for x in leaves):
        return lead.pop()
    return 1


def frozen_rows(initial_position: Any, final_position: Any) -> np.ndarray:
    """Per chain or particle: is its final position bit for bit its initial one?

    NaNs count as moved (a NaN is not equal to itself: a divergence, reported by
    the driver, not a frozen chain).

    Args:
      initial_position: the position at the start, an array or a pytree.
      final_position: the position at the end, of the same structure.

    Returns:
      ``(rows,)`` booleans, ``rows`` the positions' shared leading axis (chains,
      particles), or 1 for a single chain; ``(0,)`` when the structures differ.
    """
    start, end = (
        jax.tree_util.tree_leaves(initial_position),
        jax.tree_util.tree_leaves(final_position),
    )
    if (
        not start
        or len(start) != len(end)
        or any(np.shape(a) != np.shape(b) for a, b in zip(start, end, strict=False))
    ):
        return np.zeros((0,), bool)
    rows = _rows(start)
    same = np.ones((rows,), bool)
    for a, b in zip(start, end, strict=True):
        same &= np.all(np.reshape(np.asarray(a) == np.asarray(b), (rows, -1)), axis=1)
    return same


def _label(k: int, event_shape: tuple, labels: list | None) -> str:
    if labels is not None and k < len(labels):
        return str(labels[k])
    index = np.unravel_index(k, event_shape) if event_shape else ()
    return "x[" + ", ".join(str(int(i)) for i in index) + "]"


def _rhat_and_ess_fn(draws):
    return potential_scale_reduction(draws, rank=True), effective_sample_size(
        draws, method="bulk"
    )


#: XLA options for the check's one program: its compilation, not its run, is what
#: a short run pays (about half the compile time for twice the run time:
#: benchmarks/results/silent_failures.md).
_FAST_COMPILE = {
    "xla_backend_optimization_level": 0,
    "xla_llvm_disable_expensive_passes": True,
}


@functools.lru_cache(maxsize=32)
def _compiled(shape: tuple, dtype: str):
    spec = jax.ShapeDtypeStruct(shape, np.dtype(dtype))
    lowered = jax.jit(_rhat_and_ess_fn).lower(spec)
    try:
        return lowered.compile(compiler_options=_FAST_COMPILE)
    # a backend without these options: its defaults
    except Exception:
        return lowered.compile()


def _rhat_and_ess(draws):
    """The rank-normalised split R-hat and the bulk ESS in one compiled call.

    They share the z-scores.
    """
    # the program is compiled for one device: draws of a sharded run (on a mesh) come to
    # the host first
    draws = np.asarray(draws)
    return _compiled(tuple(draws.shape), str(draws.dtype))(draws)


def _frozen_problem(result: RunResult, initial_position: Any) -> list:
    final = getattr(result.state, "position", None)
    if initial_position is None or final is None:
        return []
    frozen = frozen_rows(initial_position, final)
    if not frozen.any():
        return []
    shown = np.flatnonzero(frozen)[:10].tolist()
    return [
        f"{int(frozen.sum())} of {frozen.size} chains or particles never moved (their "
        "position at the end of the run is their position at its start: rows "
        f"{shown}{' ...' if frozen.sum() > 10 else ''}): a step size that "
        "collapsed (0, or so small that each step rounds away), every proposal "
        "rejected, or a start where the density or its gradient is not finite; "
        "their draws are not samples"
    ]


def _mixing_problems(
    draws, rhat_max: float, ess_min: float | None, labels: list | None
) -> tuple[list, list]:
    """``(R-hat problems, ESS problems)`` of a trace, chains first."""
    num_chains, num_draws, event_shape = (
        draws.shape[0],
        draws.shape[1],
        tuple(draws.shape[2:]),
    )
    if num_draws < MIN_DRAWS:
        return [
            f"only {num_draws} kept draw{'s' if num_draws != 1 else ''} per chain: "
            f"split R-hat and the bulk ESS need at least {MIN_DRAWS}, so "
            "convergence cannot be checked; keep more draws (num_steps, thin)"
        ], []
    checked = num_chains
    # an ensemble: evenly spaced particles (exchangeable), ESS scaled up
    if num_chains > MAX_CHECKED_CHAINS:
        checked = MAX_CHECKED_CHAINS
        draws = draws[np.linspace(0, num_chains - 1, checked).round().astype(int)]
    rhat, ess = (np.asarray(v, np.float64).reshape(-1) for v in _rhat_and_ess(draws))
    ess = ess * (num_chains / checked)
    subset = (
        ""
        if checked == num_chains
        else f"; from {checked} evenly spaced of the {num_chains} particles"
    )
    out, low_ess = [], []
    # a NaN (a coordinate constant in every chain) is not above
    bad = np.flatnonzero(rhat > rhat_max)
    if bad.size:
        k = int(bad[np.argmax(rhat[bad])])
        chains = (
            f"{num_chains} chain{'s' if num_chains != 1 else ''} or particles x "
            f"{num_draws} kept draws"
        )
        out.append(
            f"the rank-normalised split R-hat of {_label(k, event_shape, labels)} is "
            f"{rhat[k]:.3g} > {rhat_max:g} ({bad.size} of {rhat.size} "
            f"coordinates above; {chains}{subset}): the chains have not mixed, "
            "the estimates depend on where they started; run longer (more steps "
            "and burn-in) or retune the step size"
        )
    floor = ess_floor(num_chains) if ess_min is None else ess_min
    low = np.flatnonzero(ess < floor)
    if low.size:
        k = int(low[np.argmin(ess[low])])
        scaled = f"{subset}, scaled to all" if subset else ""
        low_ess.append(
            f"the bulk ESS of {_label(k, event_shape, labels)} is {ess[k]:.3g} < "
            f"{floor:g} ({low.size} of {ess.size} coordinates below; the floor "
            f"is min(100 per chain, 400){scaled}): too few effective draws for "
            "the R-hat and the standard errors to be trusted; run longer"
        )
    return out, low_ess


def in_superchains(initial_position: Any) -> bool:
    """Whether chains started at ``initial_position`` are judged as many short chains:
    at least :data:`~cenlmc_jax.diagnostics.nested.MIN_SUPERCHAINS` superchains of
    ``M >= 2`` chains (:func:`~cenlmc_jax.diagnostics.nested.superchain_size`).

    Args:
      initial_position: the chains' starting positions (None: False).

    Returns:
      A bool.
    """
    if initial_position is None or not all(
        is_concrete(x) for x in jax.tree_util.tree_leaves(initial_position)
    ):
        return False
    m = nested.superchain_size(initial_position)
    rows = _rows(jax.tree_util.tree_leaves(initial_position))
    return m >= 2 and rows // m >= nested.MIN_SUPERCHAINS


def _many_chain_check(
    result: RunResult, initial_position: Any, labels: list | None, notes: list | None
) -> list | None:
    """The many-chain verdict (:mod:`cenlmc_jax.diagnostics.nested`) when the run
    started in at least :data:`~cenlmc_jax.diagnostics.nested.MIN_SUPERCHAINS`
    superchains and its per-chain moments are known (a trace, or a complete streamed
    run); None otherwise (the split R-hat checks apply)."""
    if not in_superchains(initial_position):
        return None
    m = nested.superchain_size(initial_position)
    rows = _rows(jax.tree_util.tree_leaves(initial_position))
    if isinstance(result.trace, (jax.Array, np.ndarray)):
        draws = chains_first(result)
        if draws.shape[0] != rows or draws.shape[1] < MIN_DRAWS:
            return None
        stats = nested.chain_stats(draws, m)
    else:
        stats = nested.stream_chain_stats(result.online, m)
        if stats is None or stats.mean.shape[0] != rows or stats.count < MIN_DRAWS:
            return None
    diag = nested.many_chain_diagnostics(stats, m)
    out = nested.many_chain_problems(diag, labels=labels)
    final = getattr(result.state, "position", None)
    frozen = frozen_rows(initial_position, final) if final is not None else None
    if frozen is not None and frozen.size == rows and frozen.any():
        effect = nested.stuck_effect(stats, frozen, diag)
        text = (
            f"{int(frozen.sum())} of {frozen.size} chains never moved (rows "
            f"{np.flatnonzero(frozen)[:10].tolist()}"
            f"{' ...' if frozen.sum() > 10 else ''}); leaving them out moves the "
            f"pooled estimates by at most {effect:.2g} standard errors"
        )
        if effect > 1.0:
            out.append(
                text + " (> 1): their draws change the answer; a step size too long "
                "for where they sit (a funnel's neck, a banana's arm): run longer or "
                "retune"
            )
        elif notes is not None:
            notes.append(text + " (<= 1): the answer does not depend on them")
    return out


def independent_starts(initial_position: Any) -> np.ndarray | None:
    """The starts of chains that :func:`judge_short_chains` may judge as many short
    chains, ``(C, d)`` float64; None when they are not such starts.

    They are: concrete, at least :data:`MIN_INDEPENDENT_CHAINS` rows, not laid out in
    superchains (:func:`~cenlmc_jax.diagnostics.nested.superchain_size` 1: those have
    the nested verdict), finite, and spread in every coordinate (the start's memory is
    measured by how the chain means follow the starts: identical starts hide it).

    Args:
      initial_position: the chains' starting positions, an array ``(C, ...)`` or a
        pytree of them (None: None).

    Returns:
      The starts, one row per chain (the leaves flattened and concatenated), or None.
    """
    if initial_position is None:
        return None
    leaves = jax.tree_util.tree_leaves(initial_position)
    if not leaves or not all(is_concrete(x) for x in leaves):
        return None
    rows = _rows(leaves)
    if rows < MIN_INDEPENDENT_CHAINS or nested.superchain_size(initial_position) != 1:
        return None
    starts = np.concatenate(
        [np.asarray(x, np.float64).reshape(rows, -1) for x in leaves], axis=1
    )
    if not np.all(np.isfinite(starts)) or not np.all(np.ptp(starts, axis=0) > 0):
        return None
    return starts


def independent_chain_diagnostics(
    stats: nested.ChainStats, starts: Any
) -> nested.ManyChainDiagnostics:
    """The many-chain numbers of ``C`` chains with independent starts, per quantity
    ``y = (x, x²)``: nested R-hat's ``M = 1`` case with the start's share measured by
    regression on the starts.

    Nested R-hat's start share is a one-way ANOVA of the chain means on their shared
    start. With every chain its own start (``M = 1``) there is no replicate to compare
    with, and nested R-hat is the classic R-hat of whole chains, whose floor at
    stationarity, ``τ / n``, does not fall with the number of chains. The same
    question, does a chain's mean depend on where it started, is asked of continuous
    starts by regressing each chain mean of ``y`` on the same quantity at the start
    (``x_k`` or ``x_k²``), across the ``C`` chains:

    * ``start_rhat = sqrt(1 + B_s / (W̃ + B − B_s))``, ``B = Var_c(ȳ_c)`` the chain
      means' variance, ``W̃`` the mean within-chain variance, ``B_s = B max(r² − (1 −
      r²) / (C − 2), 0)`` the part of ``B`` the start explains beyond chance
      (adjusted ``R²``, ``r`` the correlation): the start's share, as nested R-hat's;
    * ``memory_z = atanh(r) sqrt(C − 3)`` (Fisher): ``N(0, 1)`` when the chain means
      do not depend on the starts, whatever the autocorrelation;
    * ``mcse = sqrt(B / C)``, ``ess = Var(y) / mcse²`` (the ``C`` chain means are
      independent: no autocorrelation model; ``C n / τ`` at stationarity);
    * ``drift_z``: the chains' second-half mean minus their first-half mean, its mean
      over chains in standard errors (0 in expectation at stationarity).

    Memory the starts share is invisible to the regression (chains started inside one
    mode that leave it at a rate their start does not change); the drift test and the
    effective draws per chain (:data:`MIN_EFFECTIVE_PER_CHAIN`) see it.

    Args:
      stats: the window's :class:`~cenlmc_jax.diagnostics.nested.ChainStats`, each
        chain its own superchain (``superchain_size=1``).
      starts: ``(C, d)`` the chains' starts (:func:`independent_starts`).

    Returns:
      A :class:`~cenlmc_jax.diagnostics.nested.ManyChainDiagnostics` with
      ``superchain_size`` 1 and ``num_superchains`` ``C``; ``nested_rhat`` is the
      classic R-hat of the whole chains.

    Raises:
      ValueError: the starts do not match the statistics' chains and coordinates.
    """
    mean_c = np.asarray(stats.mean, np.float64)
    c, n = mean_c.shape[0], int(stats.count)
    s = np.asarray(starts, np.float64).reshape(c, -1)
    at_start = np.concatenate([s, s * s], axis=1)
    if at_start.shape != mean_c.shape or c < 4:
        raise ValueError(
            f"starts {np.shape(starts)} do not match the statistics of {c} chains x "
            f"{mean_c.shape[1]} quantities (y = (x, x²)); at least 4 chains."
        )
    m2 = np.asarray(stats.m2, np.float64)
    var_chain = m2 / (n - 1) if n > 1 else np.zeros_like(m2)
    with np.errstate(divide="ignore", invalid="ignore"):
        within = var_chain.mean(axis=0)
        dy = mean_c - mean_c.mean(axis=0)
        ds = at_start - at_start.mean(axis=0)
        between = (dy**2).sum(axis=0) / (c - 1)
        r = (dy * ds).sum(axis=0) / np.sqrt((dy**2).sum(axis=0) * (ds**2).sum(axis=0))
        r = np.where(np.isfinite(r), np.clip(r, -1.0 + 1e-15, 1.0 - 1e-15), 0.0)
        explained = between * np.maximum(r * r - (1.0 - r * r) / (c - 2), 0.0)
        rhat = np.sqrt(1.0 + between / within)
        start = np.sqrt(1.0 + explained / (within + between - explained))
        memory = np.arctanh(r) * math.sqrt(c - 3)
        mean = mean_c.mean(axis=0)
        var = (m2.sum(axis=0) + n * (dy**2).sum(axis=0)) / (c * n - 1)
        mcse = np.sqrt(between / c)
        ess = var / mcse**2
        diff = np.asarray(stats.halves[1], np.float64) - np.asarray(
            stats.halves[0], np.float64
        )
        drift = diff.mean(axis=0) / (diff.std(axis=0, ddof=1) / math.sqrt(c))
    constant = var == 0
    rhat[constant], ess[constant], start[constant] = np.nan, np.nan, np.nan
    drift[constant | ~np.isfinite(drift)] = 0.0
    memory[constant] = 0.0
    return nested.ManyChainDiagnostics(
        rhat, start, memory, ess, mcse, drift, mean, var, 1, c, n, stats
    )


def _quantity(j: int, d: int, labels: list | None) -> str:
    k = j % d
    name = str(labels[k]) if labels is not None and k < len(labels) else f"x[{k}]"
    return name if j < d else f"{name}²"


def independent_chain_problems(
    diag: nested.ManyChainDiagnostics,
    *,
    rhat_max: float = nested.NESTED_RHAT_MAX,
    ess_min: float = nested.ESS_MIN,
    labels: list | None = None,
) -> list:
    """Sentences for chains with independent starts that remember them, drift, or hold
    too few effective draws (:func:`independent_chain_diagnostics`); empty when the
    many-chain verdict holds. The rules are the nested verdict's
    (:func:`~cenlmc_jax.diagnostics.nested.many_chain_problems`): the start's share of
    R-hat above ``rhat_max`` *and* its ``|z|`` beyond the Bonferroni bound of the
    ``2 d`` quantities at a family-wise 1%; the drift's ``|z|`` beyond that bound; an
    ESS below ``ess_min``. One more: fewer than :data:`MIN_EFFECTIVE_PER_CHAIN`
    effective draws per chain (``ESS / C``), where the drift test no longer bounds a
    start's remaining bias.

    Args:
      diag: :func:`independent_chain_diagnostics`' result.
      rhat_max: the threshold of the start's share (nested R-hat's 1.01).
      ess_min: the ESS asked of every mean of ``x`` and ``x²`` (400).
      labels: coordinate names (default ``x[k]``).

    Returns:
      A list of sentences.
    """
    d, out = diag.dim, []
    bound = nested.drift_bound(d)
    shape = (
        f"{diag.num_superchains} chains with independent starts x {diag.num_draws} "
        "draws"
    )
    bad = np.flatnonzero((diag.start_rhat > rhat_max) & (np.abs(diag.memory_z) > bound))
    if bad.size:
        j = int(bad[np.argmax(diag.start_rhat[bad])])
        out.append(
            "the chains still remember where they started: their means of "
            f"{_quantity(j, d, labels)} follow their starts (the start's share of "
            f"R-hat {diag.start_rhat[j]:.4g} > {rhat_max:g}, z = "
            f"{diag.memory_z[j]:.1f} beyond ±{bound:.2f}; {bad.size} of "
            f"{diag.start_rhat.size} quantities; {shape}): the estimates depend on "
            "the start; run longer (more steps and burn-in)"
        )
    drifting = np.flatnonzero(np.abs(diag.drift_z) > bound)
    if drifting.size:
        j = int(drifting[np.argmax(np.abs(diag.drift_z[drifting]))])
        out.append(
            f"the ensemble's mean of {_quantity(j, d, labels)} drifts between the "
            f"first and second half of the run by {abs(diag.drift_z[j]):.1f} standard "
            f"errors (> {bound:.2f}, Bonferroni over {2 * d} quantities; {shape}): "
            "the chains are not stationary yet; run longer (more steps and burn-in)"
        )
    low = np.flatnonzero(diag.ess < ess_min)
    if low.size:
        j = int(low[np.argmin(diag.ess[low])])
        out.append(
            f"the ESS of the mean of {_quantity(j, d, labels)} is {diag.ess[j]:.4g} < "
            f"{ess_min:g} (from the spread of the {diag.num_superchains} chain means; "
            f"{shape}): too few effective draws for the standard errors to be "
            "trusted; run longer"
        )
    per_chain = _effective_per_chain(diag)
    if per_chain < MIN_EFFECTIVE_PER_CHAIN:
        j = int(np.nanargmin(diag.ess))
        out.append(
            f"each chain holds about {per_chain:.2g} effective draws of "
            f"{_quantity(j, d, labels)} (τ ≈ {diag.num_draws / per_chain:.3g} of its "
            f"{diag.num_draws} draws, from the spread of the chain means) < "
            f"{MIN_EFFECTIVE_PER_CHAIN:g}: chains this short cannot show whether "
            f"their start is forgotten ({shape}); run longer (more steps and burn-in)"
        )
    return out


def _effective_per_chain(diag: nested.ManyChainDiagnostics) -> float:
    """``n / τ`` of the slowest quantity, ``τ = C n / ESS`` (inf when no ESS is
    finite)."""
    ess = np.asarray(diag.ess, np.float64)
    if not np.any(np.isfinite(ess)):
        return math.inf
    return float(np.nanmin(ess)) / diag.num_superchains


def _independent_stats(result: RunResult, rows: int) -> nested.ChainStats | None:
    """Per-chain statistics of ``y = (x, x²)`` of a trace or a complete streamed run,
    each chain its own superchain (None: not known for ``rows`` chains)."""
    if isinstance(result.trace, (jax.Array, np.ndarray)):
        draws = chains_first(result)
        if draws.shape[0] != rows or draws.shape[1] < MIN_DRAWS:
            return None
        return nested.chain_stats(draws, 1)
    stats = nested.stream_chain_stats(result.online, 1)
    if stats is None or stats.mean.shape[0] != rows or stats.count < MIN_DRAWS:
        return None
    return stats


def judge_short_chains(
    result: RunResult,
    initial_position: Any,
    rhat_problems: list,
    *,
    labels: list | None = None,
    notes: list | None = None,
) -> tuple[list, nested.ManyChainDiagnostics | None]:
    """A split R-hat above its threshold, of many chains with independent starts,
    judged as many short chains: is it a failure to forget the start, or the floor of
    chains short against their autocorrelation time?

    Stationary chains of ``n`` draws per half have split R-hat ``sqrt(1 + 1/ESS_half
    − 1/n)``, ``ESS_half = n / τ``, however many chains run: 256 chains of LMC at
    ``h = 0.05`` on a standard Gaussian (``τ ≈ 2 / h = 39`` draws), 300 draws each,
    give 1.13 from starts drawn from the target itself, while their pooled means have
    an ESS of ``C n / τ ≈ 2,000``. The many-chain question (Margossian et al.; the
    nested verdict) is whether the chains forgot their starts:
    :func:`independent_chain_diagnostics` asks it of independent starts by
    regression on them, with the ensemble's drift, the ESS of every mean of ``x``
    and ``x²``, and at least :data:`MIN_EFFECTIVE_PER_CHAIN` effective draws per chain
    (so a split R-hat up to about 1.22 can be the floor; chains stuck in modes, or
    far longer in ``τ`` than the run, are not excused). When
    :func:`independent_chain_problems` finds nothing, the R-hat
    sentences become one sentence in ``notes`` (what the R-hat measured and why the
    answer stands); otherwise they stay, with the many-chain problems after them.

    Applies to chains whose starts pass :func:`independent_starts` and whose
    per-chain moments are known (a trace, or a complete streamed run:
    ``RunResult.online``); otherwise ``rhat_problems`` are returned as they are.

    Args:
      result: the run.
      initial_position: its starting positions.
      rhat_problems: the split R-hat's sentences (from
        :func:`convergence_problems` or
        :func:`cenlmc_jax.diagnostics.online.stream_problems`).
      labels: coordinate names (default ``x[k]``).
      notes: a list the note is appended to (None: not kept).

    Returns:
      ``(problems, diagnostics)``: the sentences to report, and the many-chain
      numbers (None when the judgement did not apply).
    """
    if not rhat_problems or result.diverged_at >= 0:
        return list(rhat_problems), None
    starts = independent_starts(initial_position)
    if starts is None:
        return list(rhat_problems), None
    stats = _independent_stats(result, starts.shape[0])
    if stats is None or stats.mean.shape[1] != 2 * starts.shape[1]:
        return list(rhat_problems), None
    diag = independent_chain_diagnostics(stats, starts)
    found = independent_chain_problems(diag, labels=labels)
    if found:
        return list(rhat_problems) + found, diag
    if notes is not None:
        d, c = diag.dim, diag.num_superchains
        per_half = _effective_per_chain(diag) / 2.0
        tau = diag.num_draws / 2.0 / per_half
        floor = math.sqrt(1.0 + 1.0 / per_half)
        bound = nested.drift_bound(d)
        head = str(rhat_problems[0]).split(" (", 1)[0]
        notes.append(
            f"{head}, the floor of short chains, not a failure to mix: each of the "
            f"{c} chains with independent starts kept {diag.num_draws} draws, about "
            f"{per_half:.2g} effective draws per half-chain (τ ≈ {tau:.3g} draws, "
            "from the spread of the chain means; at least "
            f"{MIN_EFFECTIVE_PER_CHAIN / 2:g} asked), and stationary chains that short "
            f"have a split R-hat of about sqrt(1 + 1/ESS_half) = {floor:.3g} however "
            "many run. Judged as many chains instead, the answer stands: the chain "
            "means do not follow the starts (the start's share of R-hat at most "
            f"{np.nanmax(diag.start_rhat):.4g}, |z| at most "
            f"{np.nanmax(np.abs(diag.memory_z)):.2f}; flagged above "
            f"{nested.NESTED_RHAT_MAX:g} with |z| > {bound:.2f}), the ensemble does "
            "not drift between the run's halves (|z| at most "
            f"{np.nanmax(np.abs(diag.drift_z)):.2f} <= {bound:.2f}), and every mean "
            f"of x and x² has an ESS of at least {np.nanmin(diag.ess):.4g} (>= "
            f"{nested.ESS_MIN:g}); more steps per chain bring the split R-hat down"
        )
    return [], diag


def convergence_problems(
    result: RunResult,
    initial_position: Any = None,
    *,
    rhat_max: float = RHAT_MAX,
    ess_min: float | None = None,
    labels: list | None = None,
    notes: list | None = None,
    many_short_chains: bool = False,
) -> list:
    """Why the draws of ``result`` are not to be trusted (module docstring).

    Chains started in superchains (:func:`cenlmc_jax.diagnostics.nested.superchain_size`
    of ``initial_position``: ``cj.langevin_warmup``'s hand-over) are judged as many
    short chains instead: nested R-hat, the ensemble's drift and the superchains' ESS
    (:func:`cenlmc_jax.diagnostics.nested.many_chain_problems`), and a chain that never
    moved only when leaving it out moves an estimate by more than its standard error
    (otherwise a sentence in ``notes``).

    Args:
      result: what ``cj.sample`` returned.
      initial_position: the position the run started from
        (``initial_state.position``); None skips the frozen check.
      rhat_max: the R-hat threshold (default :data:`RHAT_MAX`).
      ess_min: the bulk ESS floor (default :func:`ess_floor` of the number of
        chains).
      labels: coordinate names for the messages (default ``x[k]``).
      notes: a list that remarks which are not problems are appended to (None: not
        kept).
      many_short_chains: a split R-hat above ``rhat_max`` of at least
        :data:`MIN_INDEPENDENT_CHAINS` chains with independent, spread starts is
        judged again as many short chains (:func:`judge_short_chains`): it is a
        problem only when the chains remember their starts, drift, or hold too few
        effective draws; otherwise a sentence in ``notes`` says why it is the short
        chains' floor. The CLI's verdict passes True; ``cj.sample`` keeps split
        R-hat (the default, False).

    Returns:
      A list of sentences, empty if none.

    Raises:
      ValueError: ``result`` is not a ``RunResult``.
    """
    if not isinstance(result, RunResult):
        raise ValueError(
            f"result must be the RunResult of cj.sample; got {type(result).__name__}."
        )
    leaves = jax.tree_util.tree_leaves((result.state, result.trace, initial_position))
    if result.diverged_at >= 0 or not all(is_concrete(leaf) for leaf in leaves):
        return []
    many = _many_chain_check(result, initial_position, labels, notes)
    if many is not None:
        return many
    out = _frozen_problem(result, initial_position)
    if isinstance(result.trace, (jax.Array, np.ndarray)):
        high, low = _mixing_problems(
            chains_first(result), float(rhat_max), ess_min, labels
        )
        if high and many_short_chains:
            high = judge_short_chains(
                result, initial_position, high, labels=labels, notes=notes
            )[0]
        out += high + low
    return out
