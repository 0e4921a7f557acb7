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
) -> list:
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
        ]
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
    out = []
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
        out.append(
            f"the bulk ESS of {_label(k, event_shape, labels)} is {ess[k]:.3g} < "
            f"{floor:g} ({low.size} of {ess.size} coordinates below; the floor "
            f"is min(100 per chain, 400){scaled}): too few effective draws for "
            "the R-hat and the standard errors to be trusted; run longer"
        )
    return out


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


def convergence_problems(
    result: RunResult,
    initial_position: Any = None,
    *,
    rhat_max: float = RHAT_MAX,
    ess_min: float | None = None,
    labels: list | None = None,
    notes: list | None = None,
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
        out += _mixing_problems(chains_first(result), float(rhat_max), ess_min, labels)
    return out
