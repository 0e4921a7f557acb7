"""The ``lax.scan`` driver: run any ``(rng_key, state) -> (state, info)`` step.

One function, :func:`sample`, runs a step for ``num_steps`` steps and returns
a :class:`RunResult`. The run is split into jitted chunks of ``chunk_size``
steps (each chunk is one ``lax.scan``); between chunks the driver updates a
progress bar, writes an optional checkpoint and checks for divergence. The
key of step ``t`` is ``jax.random.fold_in(rng_key, t)``, so the samples do not
depend on the chunking, and a resumed run reproduces an uninterrupted one.

Two modes:

* ``mode="trace"`` keeps ``trace_fn(state)`` every ``thin`` steps: ``trace`` has
  shape ``(num_steps // thin, *trace_shape)``.
* ``mode="stream"`` keeps only the final state and streaming per-coordinate mean
  and variance of ``trace_fn(state)`` over kept steps and over every leading axis
  (the particles), by Chan's parallel update of (count, mean, M2). Memory is
  O(N d), whatever ``num_steps``: a 10^6-particle, 10^4-step run never holds the
  trace. A draw whose update leaves the moments non-finite (M2 overflows the
  dtype long before one ``x²`` does) is a divergence at its step.

Infos are reduced per step (``info_reduce="mean"``): leaves that are already
scalars are kept; per-particle leaves become a sum (integers), a fraction
(booleans) or a mean (floats). ``info_reduce=None`` keeps them whole.

``burn_in`` steps run first (their infos are kept, their states are not
recorded in the trace or moments).

At the end of a run that did not diverge, ``check_convergence=True`` (the
default) warns, as a ``ConvergenceWarning``, when a chain or particle never
moved, when the rank-normalised split R-hat exceeds 1.01 or when the bulk ESS
is below ``min(100 per chain, 400)``: :mod:`cenlmc_jax.diagnostics.convergence`,
the same function the CLI's verdict runs (R-hat and ESS need the trace).
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend.core import jaxpr_as_fun

from cenlmc_jax import checkpoint as ckpt
from cenlmc_jax._host import fetch, gather, is_writer
from cenlmc_jax._host import warn as host_warn
from cenlmc_jax._validation import (
    check_bool,
    check_callable,
    check_choice,
    check_int,
    check_key,
    check_position,
    check_start_logdensity,
    is_concrete,
)
from cenlmc_jax.base import (
    RISING_Z,
    Moments,
    RunResult,
    SamplingAlgorithm,
    may_stay,
    rising_z,
    run_flags,
)
from cenlmc_jax.diagnostics import online
from cenlmc_jax.diagnostics.convergence import (
    RHAT_MAX,
    ConvergenceWarning,
    convergence_problems,
    in_superchains,
    judge_short_chains,
)
from cenlmc_jax.types import Array, PRNGKey, PyTree, StepFn

__all__ = [
    "sample",
    "RunResult",
    "Moments",
    "reduce_info",
    "vmap_chains",
    "step_halving_bias",
]


def _check_stream_trace(trace_fn: Callable, state: Any) -> None:
    """``mode="stream"`` keeps moments per coordinate: ``trace_fn`` must give one array
    whose last axis holds the coordinates."""
    out = jax.eval_shape(trace_fn, state)
    if not hasattr(out, "shape") or len(out.shape) < 1:
        shape = tuple(out.shape) if hasattr(out, "shape") else type(out).__name__
        raise ValueError(
            "trace_fn must return one array (..., d) in mode='stream' (the moments "
            f"are per coordinate, the last axis); got {shape}. Return x[None] for a "
            "scalar, or use mode='trace'."
        )


@functools.partial(jax.jit, static_argnums=(1, 2))
def _rows(tree: PyTree, start: int, stop: int | None) -> PyTree:
    """``a[start:stop]`` of every leaf: one compiled program (eagerly, each leaf's slice
    is a program of its own, each lowered and loaded in a new process).
    """
    return jax.tree_util.tree_map(lambda a: a[start:stop], tree)


def _concatenated(trees: list) -> PyTree:
    """The leaves of ``trees`` (a list of like pytrees) concatenated along their first
    axis: one compiled program, as :func:`_rows`; a run of one chunk is its chunk.
    """
    return trees[0] if len(trees) == 1 else _concatenate(trees)


@jax.jit
def _concatenate(trees: list) -> PyTree:
    return jax.tree_util.tree_map(lambda *a: jnp.concatenate(a), *trees)


@jax.jit
def _init_stream(x: Array, stream_plan: tuple) -> tuple:
    """Stream mode's carry before any draw shaped as ``x``: the moments and the online
    diagnostics' accumulators (:func:`~cenlmc_jax.diagnostics.online.init`), one
    compiled program for every run length (``stream_plan`` is traced)."""
    d = x.shape[-1]
    zeros = jnp.zeros((d,), x.dtype)
    return Moments(jnp.zeros((), x.dtype), zeros, zeros), online.init(x, stream_plan)


def _update_moments(m: Moments, x: Array) -> Moments:
    x = x.reshape(-1, x.shape[-1])
    nb = jnp.asarray(x.shape[0], x.dtype)
    mb = jnp.mean(x, axis=0)
    m2b = jnp.sum((x - mb) ** 2, axis=0)
    n = m.count + nb
    delta = mb - m.mean
    mean = m.mean + delta * (nb / n)
    m2 = m.m2 + m2b + delta**2 * (m.count * nb / n)
    return Moments(n, mean, m2)


def _finite_moments(m: Moments) -> Array:
    """Whether the streamed mean and ``m2`` are finite: ``m2``, a sum over the kept
    draws and the particles of squared deviations, overflows long before one draw's
    ``x²`` (float32 positions of 1e15 over 10^6 particle-draws), steps before a
    sampler's own divergence check; the driver counts it as a divergence at that step.
    """
    return jnp.all(jnp.isfinite(m.mean)) & jnp.all(jnp.isfinite(m.m2))


def _with_overflow(infos: Any, overflow: Any) -> tuple:
    """``(infos, per-step moment overflows)``: the chunk's infos with ``diverged`` set
    at the steps whose draw made the streamed moments non-finite
    (:func:`_mark_diverged`), and those steps as NumPy booleans (None outside stream
    mode, and inside a trace: there the marked ``info.diverged`` is what the run-time
    warning reads).
    """
    if overflow is None:
        return infos, None
    if not is_concrete(overflow):
        return _mark_diverged(infos, overflow), None
    over = np.asarray(gather(overflow)).astype(bool)
    return (_mark_diverged(infos, over) if over.any() else infos), over


def _mark_diverged(infos: Any, over: Any) -> Any:
    """``infos`` with ``diverged`` set at the steps whose streamed moments overflowed
    (a bool or'ed, a number raised to at least 1; every chain of per-chain infos), so
    that ``info.diverged`` marks the step ``diverged_at`` names; infos without that
    field, or not a NamedTuple, are returned as they are.
    """
    flag = getattr(infos, "diverged", None)
    if flag is None or not hasattr(infos, "_replace"):
        return infos
    mask = jnp.reshape(jnp.asarray(over), (-1,) + (1,) * (np.ndim(flag) - 1))
    if flag.dtype == jnp.bool_:
        marked = flag | mask
    else:
        marked = jnp.where(mask, jnp.maximum(flag, 1), flag).astype(flag.dtype)
    return infos._replace(diverged=marked)


def _overflow_message(step: int, dtype: Any) -> str:
    return (
        f"the streamed moments overflowed at step {step}: their running sum of squared "
        f"deviations (Moments.m2) is no longer finite in {np.dtype(dtype)}, before "
        "info.diverged was set: the run is diverging (values growing without bound), "
        "or its values are too large for the dtype (enable float64: "
        "jax.config.update('jax_enable_x64', True), and a float64 state); counted as "
        "a divergence"
    )


def _update_stream(carry: tuple, x: Array) -> tuple:
    """The stream mode's carry ``(Moments, OnlineAccumulator or None)`` after one kept
    draw ``x``.
    """
    moments, acc = carry
    return _update_moments(moments, x), (None if acc is None else online.update(acc, x))


def _stream_plan(trace_fn: Callable, state: Any, num_steps: int, thin: int) -> tuple:
    """The online diagnostics' :func:`~cenlmc_jax.diagnostics.online.plan` of a run:
    its kept draws per chain and its chains (the leading axes of ``trace_fn``'s
    output).
    """
    shape = jax.eval_shape(trace_fn, state).shape
    return online.plan(num_steps // thin, int(np.prod(shape[:-1], dtype=np.int64)))


def reduce_info(info: PyTree) -> PyTree:
    """Per-step reduction of an info pytree (see the module docstring).

    Leaves that are already scalars are kept; per-particle leaves become a sum
    (integers), a fraction (booleans) or a mean (floats).

    Args:
      info: one step's info, a pytree of arrays (per particle or per chain).

    Returns:
      The same pytree with every leaf a scalar.
    """

    def red(leaf):
        leaf = jnp.asarray(leaf)
        if leaf.ndim == 0:
            return leaf
        if leaf.dtype == jnp.bool_:
            return jnp.mean(leaf.astype(jnp.float32))
        if jnp.issubdtype(leaf.dtype, jnp.integer):
            return jnp.sum(leaf)
        return jnp.mean(leaf)

    return jax.tree_util.tree_map(red, info)


#: Chunks shorter than this are not judged for frozen chains (momentum samplers start at
#: rest, so their position moves from the second step; an MH chain may meet a few
#: zero-density proposals in a row).
WATCH_MIN_STEPS = 10


def _num_rows(leaves: list) -> int:
    """Chains or particles in a position: the shared leading axis when some leaf has
    ndim >= 2, else 1.
    """
    lead = {np.shape(x)[0] if np.ndim(x) else None for x in leaves}
    if len(lead) == 1 and None not in lead and any(np.ndim(x) >= 2 for x in leaves):
        return lead.pop()
    return 1


def _moved_rows(old: Any, new: Any) -> Array | None:
    """Per chain or particle (:func:`_num_rows`): did ``state.position`` change this
    step? None without one.
    """
    po, pn = getattr(old, "position", None), getattr(new, "position", None)
    if po is None or pn is None:
        return None
    lo, ln = jax.tree_util.tree_leaves(po), jax.tree_util.tree_leaves(pn)
    if not lo:
        return None
    rows = _num_rows(lo)
    moved = [
        jnp.any(jnp.reshape(a != b, (rows, -1)), axis=1)
        for a, b in zip(lo, ln, strict=True)
    ]
    return functools.reduce(jnp.logical_or, moved)


def _watched(info: Any) -> tuple:
    """The infos' every-step flags (:class:`~cenlmc_jax.base.RunFlag` with
    ``every_step``), as booleans.
    """
    return tuple(
        jnp.asarray(getattr(info, f.field)).astype(bool)
        for f in run_flags(info)
        if f.every_step
    )


def _traced_once(step_fn: StepFn, key: Array, state: Any) -> tuple[Callable, Any]:
    """``step_fn`` traced once, as a function of ``(key, state)``, and the shape of its
    ``(state, info)``.

    The chunk runs the step inside a ``lax.cond`` whose other branch returns a blank
    info: that branch needs the info's shape, and asking ``jax.eval_shape`` for it would
    trace the step a second time. Here the step is traced once to a jaxpr (values it
    closes over, tracers of an outer ``grad`` or ``jit`` included, become its constants,
    so derivatives flow through), and both the shape and the function come from that one
    trace.
    """
    closed, shapes = jax.make_jaxpr(step_fn, return_shape=True)(key, state)
    out_tree = jax.tree_util.tree_structure(shapes)
    run = jaxpr_as_fun(closed)

    def traced(k, s):
        return jax.tree_util.tree_unflatten(
            out_tree, run(*jax.tree_util.tree_leaves((k, s)))
        )

    return traced, shapes


@functools.lru_cache(maxsize=64)
def _chunk_fn(
    step_fn: StepFn,
    num_outer: int,
    thin: int,
    mode: str,
    trace_fn: Callable,
    info_reduce: str | None,
):
    """A jitted function running up to ``num_outer * thin`` steps (cached per
    configuration).

    One compilation serves every chunk of a run: the burn-in, the sampling chunks, a
    shorter last chunk and the replay up to a diverging step. Its traced arguments say
    how: ``n``, the steps that run (the later ones are skipped by a ``lax.cond``: the
    state is kept and the step is not computed; their infos are blank and the caller
    drops them), and ``record``: whether the ``thin``-th states are kept (or streamed
    into the moments); only outer steps whose ``thin`` steps all ran are (the burn-in
    passes False, and the caller drops what it returns).

    Besides the state, moments, kept draws and infos it returns the chunk's *watch*
    (below) and, per step, whether the streamed moments stopped being finite at its
    draw (:func:`_finite_moments`; always False in trace mode). The *watch*: per
    chain or particle, whether its position stayed the same at every step (None for
    states without ``position``; all False for samplers whose infos declare
    ``may_stay``: MH chains legitimately stay), and for each every-step flag of the
    infos the number of steps it was set (before ``info_reduce``). The step is traced
    once (:func:`_traced_once`): the watch and the blank infos need no trace of their
    own.
    """

    def run_chunk(key, state, moments, start, n, record):
        step, (_, info_shape) = _traced_once(step_fn, key, state)
        blank = jax.tree_util.tree_map(
            lambda a: jnp.zeros(a.shape, a.dtype), info_shape
        )
        stays = may_stay(blank)  # the info's class declares it: no value needed

        def one_step(carry, t):
            state, moved = carry
            new_state, info = lax.cond(
                t < start + n,
                lambda s: step(jax.random.fold_in(key, t), s),
                lambda s: (s, blank),
                state,
            )
            if (
                moved is not None
            ):  # an MH sampler's rejections keep the position: never "frozen" by itself
                moved = (
                    jnp.ones_like(moved)
                    if stays
                    else moved | _moved_rows(state, new_state)
                )
            # per step, before the reduction (one value per chain); False where the
            # step was skipped: a blank info's derived flags need not be (a zero
            # acceptance_rate reads as a collapsed one)
            flags = tuple(f & (t < start + n) for f in _watched(info))
            if info_reduce == "mean":
                info = reduce_info(info)
            return (new_state, moved), (info, flags)

        def outer(carry, j):
            state, moments, moved = carry
            steps = start + j * thin + jnp.arange(thin)
            (state, moved), (infos, flags) = lax.scan(one_step, (state, moved), steps)
            keep = record & ((j + 1) * thin <= n)
            kept, overflow = None, jnp.zeros((), bool)
            if mode == "trace":
                kept = trace_fn(state)
            elif mode == "stream":
                finite = _finite_moments(moments[0])
                moments = lax.cond(
                    keep,
                    lambda m: _update_stream(m, trace_fn(state)),
                    lambda m: m,
                    moments,
                )
                overflow = keep & finite & ~_finite_moments(moments[0])
            return (state, moments, moved), (kept, infos, flags, overflow)

        # the rows of the position, from its shape (no extra trace of the step)
        position = getattr(state, "position", None)
        leaves = [] if position is None else jax.tree_util.tree_leaves(position)
        moved = jnp.zeros((_num_rows(leaves),), bool) if leaves else None
        (state, moments, moved), (kept, infos, flags, overflow) = lax.scan(
            outer, (state, moments, moved), jnp.arange(num_outer)
        )
        # per step: the recording step (the last of its thin) whose draw overflowed
        overflow = jnp.zeros((num_outer, thin), bool).at[:, -1].set(overflow)
        # infos: (num_outer, thin, ...) -> (num_outer * thin, ...)
        infos = jax.tree_util.tree_map(
            lambda a: a.reshape((num_outer * thin,) + a.shape[2:]), infos
        )
        counts = tuple(jnp.sum(f, axis=(0, 1), dtype=jnp.int32) for f in flags)
        frozen = None if moved is None else ~moved
        return state, moments, kept, infos, (frozen, counts), overflow.reshape(-1)

    return jax.jit(run_chunk)


def _report_watch(watch: tuple, infos: Any, start: int, n: int, warned: set) -> None:
    """Warn (once per kind and call of :func:`sample`) of chains frozen for the whole
    chunk of steps ``start .. start + n - 1``: positions that never moved, or an
    every-step flag set at every step.
    """
    if watch is None or n < WATCH_MIN_STEPS:
        return
    frozen, counts = watch
    checks = []
    if frozen is not None:
        checks.append(
            (
                "frozen",
                frozen,
                lambda k, total: (
                    f"{k} of {total} chains or particles did not move in steps "
                    f"{start}..{start + n - 1} (the same state.position at every step "
                    "of the chunk): a step size or schedule that reached 0, a zero "
                    "drift with no noise, or positions so large that each step rounds "
                    "away; the draws are not samples"
                ),
            )
        )
    flags = [f for f in run_flags(infos) if f.every_step]
    for flag, count in zip(flags, counts, strict=True):
        checks.append(
            (
                flag.field,
                count >= n,
                lambda k, total, flag=flag: (
                    f"{k} of {total} chains: "
                    + flag.message(infos, start)
                    + f" (at every step of {start}..{start + n - 1})"
                ),
            )
        )
    for name, frozen, message in checks:
        if name in warned:
            continue
        if isinstance(frozen, jax.core.Tracer):
            jax.debug.callback(
                functools.partial(_warn_frozen_at_run_time, name, message, warned),
                frozen,
            )
            continue
        frozen = np.asarray(gather(frozen)).ravel()
        if frozen.any():
            warned.add(name)
            _warn(message(int(frozen.sum()), frozen.size))


def _warn_frozen_at_run_time(name: str, message: Callable, warned: set, frozen) -> None:
    frozen = np.asarray(frozen).ravel()
    if frozen.any() and name not in warned:
        warned.add(name)
        host_warn(
            message(int(frozen.sum()), frozen.size) + " (inside jax.jit)",
            RuntimeWarning,
            stacklevel=2,
        )


def _warn(msg: str, depth: int = 0) -> None:
    """A RuntimeWarning at the caller of :func:`sample` (``depth``: helpers between
    ``sample`` and here).
    """
    host_warn(msg, RuntimeWarning, stacklevel=3 + depth)


def _progress_bar(total: int, step: int):
    """:func:`sample`'s ``progress=True`` bar (tqdm), from ``step`` of ``total``."""
    try:
        from tqdm.auto import tqdm
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ValueError("progress=True needs tqdm: pip install tqdm") from exc
    return tqdm(total=total, initial=step, unit="step", disable=not is_writer())


def _warn_chunk_flags(
    infos: Any, step: int, flagged_at: dict, traced_warned: set
) -> None:
    """One warning per chunk-by-chunk :class:`~cenlmc_jax.base.RunFlag` (neither
    ``every_step`` nor ``kept_only``) at its first flagged step, once per call of
    :func:`sample` (``flagged_at``: field -> step).
    """
    for flag in run_flags(infos):
        if flag.every_step or flag.kept_only or flag.field in flagged_at:
            continue
        flags = _flag_steps(infos, flag.field, step, traced_warned)
        if flags is not None and flags.any():
            flagged_at[flag.field] = step + int(np.argmax(flags))
            _warn(flag.message(infos, flagged_at[flag.field]), depth=1)


def _flag_steps(
    infos: PyTree, name: str, first_step: int = 0, warned: set | None = None
) -> np.ndarray:
    """Per-step booleans from ``info.<name>`` (any particle or chain), or None without
    that field.

    Inside a trace (``jax.jit``, ``vmap``) the flags have no value yet: then
    this returns None and, when ``warned`` is given, arranges a warning at run
    time (``jax.debug.callback``, once per ``name`` and call of :func:`sample`)
    naming the first flagged step.
    """
    flag = getattr(infos, name, None)
    if flag is None:
        return None
    if isinstance(flag, jax.core.Tracer):
        if warned is not None:
            per_step = jnp.any(
                jnp.reshape(flag, (flag.shape[0], -1)).astype(bool), axis=1
            )
            jax.debug.callback(
                functools.partial(_warn_at_run_time, name, first_step, warned),
                jnp.any(per_step),
                jnp.argmax(per_step),
            )
        return None
    flag = np.asarray(gather(flag))
    return (
        flag.reshape(flag.shape[0], -1).astype(bool).any(axis=1)
        if flag.ndim > 1
        else flag.astype(bool)
    )


def _warn_at_run_time(name: str, first_step: int, warned: set, any_flag, first) -> None:
    if not np.any(any_flag) or name in warned:
        return
    warned.add(name)
    step = first_step + int(
        np.min(
            np.where(np.asarray(any_flag), np.asarray(first), np.iinfo(np.int64).max)
        )
    )
    host_warn(
        f"info.{name} is set from step {step} (inside jax.jit the run cannot stop "
        "there: it ran to the end; see RunResult.info)",
        RuntimeWarning,
        stacklevel=2,
    )


def sample(
    rng_key: PRNGKey,
    step_fn: SamplingAlgorithm | StepFn,
    initial_state: Any,
    num_steps: int,
    *,
    thin: int = 1,
    burn_in: int = 0,
    mode: str = "trace",
    trace_fn: Callable[[Any], Array] = lambda state: state.position,
    chunk_size: int | None = None,
    info_reduce: str | None = "mean",
    progress: bool = False,
    checkpoint_path: str | None = None,
    on_divergence: str = "stop",
    check_convergence: bool = True,
) -> RunResult:
    """Run ``step_fn`` for ``burn_in + num_steps`` steps with ``lax.scan``.

    Args:
      rng_key: a typed key or a legacy ``PRNGKey``. Step ``t`` uses
        ``fold_in(rng_key, t)``.
      step_fn: a :class:`~cenlmc_jax.base.SamplingAlgorithm` (``cj.lmc(...)``,
        ``cj.cenlmc(...)``, ...: its ``step`` is run) or any
        ``(rng_key, state) -> (state, info)``, e.g.
        ``functools.partial(lmc_step, logdensity_fn=f, step_size=0.1)``. Keep the
        same object between calls to reuse its compilation.
      initial_state: the sampler's state (any pytree).
      num_steps: recorded steps (after ``burn_in``), ``>= 1``.
      thin: keep every ``thin``-th state; must divide ``num_steps`` and ``chunk_size``.
      burn_in: steps run first and not recorded (a multiple of ``thin`` is not needed).
      mode: ``"trace"`` (stack kept states) or ``"stream"`` (moments only).
      trace_fn: what to record of a state, default ``state.position``.
      chunk_size: steps per jitted call (default: ``num_steps`` up to 1000, a
        multiple of ``thin``). A final shorter chunk compiles once more.
      info_reduce: ``"mean"`` (default) or ``None`` (keep per-particle infos).
      progress: show a tqdm bar updated between chunks (needs ``tqdm``).
      checkpoint_path: if given, the run is written there after every chunk
        (data only: :mod:`cenlmc_jax.checkpoint`), and a run started with an
        existing file resumes from it: same key and arguments give the same
        result as an uninterrupted run; a different run (key, initial state,
        step function or its parameters, ``trace_fn``, ``burn_in``,
        ``num_steps``, ``thin``, ``mode``, ``info_reduce``) is refused with a
        ``ValueError``, and so is a step function that cannot be fingerprinted
        (:func:`cenlmc_jax.checkpoint.fingerprint`). The folder is checked
        before any work.
      on_divergence: ``"stop"`` (warn and return the state, trace and moments
        of the last good step: the chunk is replayed up to the diverging step),
        ``"warn"`` (warn and keep going) or ``"raise"`` (``FloatingPointError``).
        A step diverges when its ``info.diverged`` is set or, in
        ``mode="stream"``, when the streamed moments stop being finite at its
        draw (``m2`` overflows the dtype steps before a sampler's own check).
      check_convergence: at the end of a run that did not diverge, warn
        (:class:`~cenlmc_jax.diagnostics.convergence.ConvergenceWarning`, one per
        problem) when a chain or particle never moved, when the rank-normalised
        split R-hat exceeds 1.01, or when the bulk ESS is below
        ``min(100 per chain, 400)``
        (:func:`~cenlmc_jax.diagnostics.convergence.convergence_problems`:
        R-hat and ESS need ``mode="trace"``; stream mode checks frozen chains
        only). The first check of a trace shape compiles the diagnostics once.

    Inside ``jax.jit`` (e.g. ``jax.jit(jax.grad(loss))`` with ``cj.sample`` in
    ``loss``) the flags are not known while tracing: the run cannot stop or
    raise at a diverging step, so it runs to the end, warns at run time (a
    ``jax.debug.callback``) naming the first flagged step, and returns
    ``diverged_at = -1``; look at ``RunResult.info.diverged``.
    ``checkpoint_path`` is refused there (``ValueError``).

    Warnings (``RuntimeWarning``) also report steps whose info sets
    ``noise_clipped`` (the recipe's noise covariance was clipped: too large a
    ``B_hat`` for the step size), and, once per call, kept steps (after
    ``burn_in``) whose info sets ``biased`` (CEnLMC's gradient audit: the
    ensemble force's noise inflates the variance beyond the audit's threshold;
    the warning gives the mean of ``info.audit_variance_inflation`` over the
    kept steps). Neither stops the run.

    Returns:
      A :class:`~cenlmc_jax.base.RunResult`: the final state, the trace
      (``mode="trace"``) or the moments (``mode="stream"``), the per-step
      (reduced) infos, the steps done and the first diverging step (or -1).

    Raises:
      ValueError: a bad argument (a key, a step function, counts, a mode, a
        checkpoint of another run or inside ``jax.jit``), checked before any
        work.
      FloatingPointError: the run diverged and ``on_divergence="raise"``.
    """
    step_fn, num_steps, thin, burn_in, chunk_size = _check_run_args(
        rng_key,
        step_fn,
        num_steps,
        thin,
        burn_in,
        mode,
        trace_fn,
        chunk_size,
        info_reduce,
        progress,
        on_divergence,
        check_convergence,
    )
    # stream mode's carry: the moments and the online diagnostics' accumulators
    moments, stream_plan = None, None
    if mode == "stream":
        _check_stream_trace(trace_fn, initial_state)
        first = trace_fn(initial_state)
        stream_plan = _stream_plan(trace_fn, initial_state, num_steps, thin)
        moments = _init_stream(first, tuple(int(v) for v in stream_plan))
    # a checkpoint is written by one run at a time: its lock is held until the run ends
    with contextlib.ExitStack() as held:
        state, step, chunks, diverged_at = initial_state, 0, [], -1
        watched = []  # per chunk, its watch (None: cut at a divergence): saved
        total = burn_in + num_steps
        identity = None
        if checkpoint_path is not None:
            checkpoint_path, identity, resumed = _open_checkpoint(
                checkpoint_path,
                rng_key,
                step_fn,
                initial_state,
                trace_fn,
                burn_in,
                num_steps,
                thin,
                mode,
                info_reduce,
                on_divergence,
                held,
                moments,
            )
            if resumed is not None:
                state, step, moments, chunks, watched, diverged_at = resumed
        saved = len(chunks)

        bar = _progress_bar(total, step) if progress else None
        flagged_at, traced_warned = {}, set()
        done = 0
        # a resume reports the chunks run before the cut as they did
        for (_, infos), watch in zip(chunks, watched, strict=True):
            n = np.shape(jax.tree_util.tree_leaves(infos)[0])[0]
            _report_watch(watch, infos, done, n, traced_warned)
            _warn_chunk_flags(infos, done, flagged_at, traced_warned)
            done += n
        while step < total and not (diverged_at >= 0 and on_divergence == "stop"):
            burning = step < burn_in
            n = min(chunk_size, (burn_in if burning else total) - step)
            start_state, start_moments = state, moments
            state, moments, kept, infos, watches, overflow = _run_chunk(
                step_fn,
                rng_key,
                state,
                moments,
                step,
                n,
                burning,
                thin,
                chunk_size,
                mode,
                trace_fn,
                info_reduce,
            )
            infos, over = _with_overflow(infos, overflow)
            flags = _flag_steps(infos, "diverged", step, traced_warned)
            if over is not None:  # infos with no diverged field: the overflow alone
                flags = over if flags is None else flags | over
            if flags is not None and flags.any() and diverged_at < 0:
                first = int(np.argmax(flags))
                diverged_at = step + first
                msg = (
                    _overflow_message(diverged_at, moments[0].m2.dtype)
                    if over is not None and over[first]
                    else "the sampler diverged (info.diverged: non-finite or exploding "
                    f"values) at step {diverged_at}; see RunResult.info for the "
                    "per-step counts"
                )
                if on_divergence == "raise":
                    raise FloatingPointError(msg)
                if on_divergence == "stop":
                    # replay the chunk up to the last good step (same keys, so the same
                    # states)
                    state, moments, kept, _, _, _ = _run_chunk(
                        step_fn,
                        rng_key,
                        start_state,
                        start_moments,
                        step,
                        first,
                        burning,
                        thin,
                        chunk_size,
                        mode,
                        trace_fn,
                        info_reduce,
                    )
                    # the chunk ended at its divergence: not a frozen chain
                    watches = []
                    infos = jax.tree_util.tree_map(
                        lambda a, n=first + 1: a[:n], infos
                    )  # the diverging step's info too
                    n = first
                    msg += (
                        "; stopped with the state, trace and moments after step "
                        f"{diverged_at - 1}"
                        if diverged_at > 0
                        else "; stopped at the initial state, nothing kept"
                    )
                _warn(msg)
            for w_start, w_n, watch in watches:
                _report_watch(watch, infos, w_start, w_n, traced_warned)
            watched.append(watches[0][2] if watches else None)
            _warn_chunk_flags(infos, step, flagged_at, traced_warned)
            chunks.append((kept, infos))
            step += n
            if bar is not None:
                bar.update(n)
            if checkpoint_path is not None:
                ckpt.save(
                    checkpoint_path,
                    identity=identity,
                    step=step,
                    state=state,
                    moments=None if moments is None else moments[0],
                    new_chunks=chunks[saved:],
                    num_chunks=len(chunks),
                    diverged_at=diverged_at,
                    online=None if moments is None else moments[1],
                    new_watches=watched[saved:],
                )
                saved = len(chunks)
        if bar is not None:
            bar.close()

        kept_all = [k for k, _ in chunks if k is not None]
        if kept_all:
            trace = _concatenated(kept_all)
        elif mode == "trace":
            # nothing kept (a divergence in the burn-in): an empty trace of the right
            # shape, not None, so that code reading result.trace sees zero draws
            trace = jax.tree_util.tree_map(
                lambda s: jnp.zeros((0, *s.shape), s.dtype),
                jax.eval_shape(trace_fn, state),
            )
        else:
            trace = None
        info = _concatenated([i for _, i in chunks]) if chunks else None
        _warn_kept_flags(info, burn_in, traced_warned)
        result = RunResult(
            state,
            trace,
            None if moments is None else moments[0],
            info,
            step,
            diverged_at,
            burn_in,
            thin,
            _stream_diagnostics(moments, stream_plan, diverged_at),
        )
        if check_convergence:
            _warn_unconverged(result, initial_state, traced_warned)
        return result


def step_halving_bias(
    rng_key: Any,
    make_algorithm: Callable[[float], Any],
    step_size: float,
    reference: Any,
    *,
    num_steps: int | None = None,
    burn_in: int | None = None,
    relaxation_steps: float | None = None,
    z: float | None = None,
) -> online.StepHalvingBias:
    r"""Estimate the step-size bias of an unadjusted sampler's moments by halving ``h``.

    Unadjusted Langevin (LMC, EnLMC, CEnLMC, the SG-MCMC family) samples a
    distribution :math:`\pi_h` whose moments are off by :math:`b(h) = c\,h + O(h^2)`,
    on any target. From the final ensemble of the ``h`` run (``reference``) the
    sampler is run again at ``h / 2``, relaxed for ``burn_in`` steps and streamed for
    ``num_steps``; then :math:`m_h - m_{h/2} = c h / 2`, so
    :math:`\hat b = 2 (m_h - m_{h/2})` estimates the bias of the reference's
    ``E[x]`` and ``E[x²]``, with standard error
    :math:`2\sqrt{se_h^2 + se_{h/2}^2}` from the two runs' ESS (online, or from the
    trace). A coordinate whose :math:`|\hat b|` exceeds ``z`` standard errors is
    flagged (``StepHalvingBias.flagged``): its bias is then certainly beyond the
    reference's own standard error (:math:`z\cdot 2 se \ge se_h`), so the error bars
    understate the error. A bias below ``z`` standard errors is not detected: the
    check's power grows with the runs' length.

    Example, after ``cj.langevin_warmup``::

        wu = cj.langevin_warmup(k0, logdensity_fn, positions)
        res = cj.sample(k1, wu.algorithm, wu.state, 2000, mode="stream")
        M = wu.parameters["inverse_mass_matrix"]
        check = cenlmc_jax.run.step_halving_bias(
            k2, lambda h: cj.lmc(logdensity_fn, h, inverse_mass_matrix=M),
            wu.parameters["step_size"], res,
            relaxation_steps=wu.info.relaxation_steps)
        check.flagged.any()

    Args:
      rng_key: the ``h / 2`` run's key.
      make_algorithm: ``step_size -> SamplingAlgorithm``: the reference's sampler with
        every parameter but the step size the same.
      step_size: the reference's ``h`` (> 0).
      reference: the ``cj.sample`` result at ``h`` that recorded ``state.position``:
        ``mode="stream"`` (its moments and online diagnostics) or ``mode="trace"``.
      num_steps: recorded steps at ``h / 2`` (default: the reference's, ``thin``
        included: as many gradients as it spent).
      burn_in: relaxation steps at ``h / 2`` (default:
        :data:`~cenlmc_jax.diagnostics.online.RELAX_EFOLDS` = 5 e-folds of the
        slowest coordinate, each of ``2 relaxation_steps`` steps at ``h / 2``;
        without ``relaxation_steps`` the e-fold at ``h`` is taken as half the
        reference's largest ``τ_int`` (an AR(1)'s); at most ``2 num_steps``).
      relaxation_steps: steps per e-fold at ``h``
        (``LangevinWarmupInfo.relaxation_steps``); default from the reference's ESS.
      z: the threshold (default: Bonferroni over the ``2d`` tests at a family-wise
        false-alarm rate of :data:`~cenlmc_jax.diagnostics.online.BIAS_FALSE_ALARM`).

    Returns:
      A :class:`~cenlmc_jax.diagnostics.online.StepHalvingBias`.

    Raises:
      ValueError: a bad argument, or a reference that diverged, kept no draws or has
        no online diagnostics (fewer than 4 kept draws per chain).
    """
    if not callable(make_algorithm):
        raise ValueError(
            "make_algorithm must be a callable step_size -> SamplingAlgorithm; got "
            f"{type(make_algorithm).__name__}."
        )
    if isinstance(step_size, bool) or not (
        isinstance(step_size, (int, float, np.floating)) and step_size > 0
    ):
        raise ValueError(f"step_size must be a number > 0; got {step_size!r}.")
    if getattr(reference, "diverged_at", -1) >= 0:
        raise ValueError(
            f"reference diverged (at step {reference.diverged_at}): its moments are "
            "not estimates; there is no bias to measure."
        )
    thin = int(getattr(reference, "thin", 1))
    stats = online.moments_and_se(reference, thin)
    if stats is None:
        raise ValueError(
            "reference must be a cj.sample result with kept draws (mode='trace') or "
            "streamed moments with their online diagnostics (mode='stream', at least "
            "4 kept draws per chain); got one without."
        )
    mean_h, sq_h, se_mean_h, se_sq_h, tau_int = stats
    kept = int(
        getattr(reference.online, "num_draws", 0)
        if reference.trace is None
        else np.shape(jax.tree_util.tree_leaves(reference.trace)[0])[0]
    )
    if num_steps is None:
        num_steps = max(kept * thin, 8)
    if isinstance(num_steps, bool) or not isinstance(num_steps, (int, np.integer)):
        raise ValueError(f"num_steps must be an int >= 8; got {num_steps!r}.")
    if num_steps < 8:
        raise ValueError(f"num_steps must be an int >= 8; got {num_steps!r}.")
    if burn_in is None:
        if relaxation_steps is not None and math.isfinite(relaxation_steps):
            efold = float(relaxation_steps)
        else:  # an AR(1)'s e-fold time is about half its τ_int
            efold = 0.5 * (tau_int if tau_int is not None else num_steps)
        burn_in = min(math.ceil(2.0 * online.RELAX_EFOLDS * efold), 2 * int(num_steps))
    if isinstance(burn_in, bool) or not isinstance(burn_in, (int, np.integer)):
        raise ValueError(f"burn_in must be an int >= 0; got {burn_in!r}.")
    if burn_in < 0:
        raise ValueError(f"burn_in must be an int >= 0; got {burn_in!r}.")
    d = mean_h.size
    z = online.bonferroni_z(2 * d) if z is None else float(z)
    half = make_algorithm(0.5 * float(step_size))
    state = half.init(reference.state.position)
    res = sample(
        rng_key,
        half,
        state,
        int(num_steps),
        burn_in=int(burn_in),
        mode="stream",
        check_convergence=False,
    )
    if res.diverged_at >= 0:
        raise ValueError(
            f"the h/2 = {0.5 * step_size:g} run diverged at step {res.diverged_at}: "
            "the sampler is unstable at the smaller step too; fix the run first."
        )
    mean_2, sq_2, se_mean_2, se_sq_2, _ = online.moments_and_se(res, 1)
    rows = int(np.prod(np.shape(reference.state.position)[:-1])) or 1
    evals = getattr(res.info, "grad_evals", None)
    grad_evals = (
        int(np.sum(np.asarray(evals)))
        if evals is not None
        else rows * int(res.num_steps_done)
    )
    return online.StepHalvingBias(
        2.0 * (mean_h - mean_2),
        2.0 * np.hypot(se_mean_h, se_mean_2),
        2.0 * (sq_h - sq_2),
        2.0 * np.hypot(se_sq_h, se_sq_2),
        z,
        float(step_size),
        int(num_steps),
        int(burn_in),
        grad_evals,
        res,
    )


def _stream_diagnostics(moments, stream_plan, diverged_at: int):
    """The online diagnostics of a complete streamed run (None otherwise:
    ``RunResult.online``).
    """
    if moments is None or moments[1] is None or diverged_at >= 0:
        return None
    acc = moments[1]
    if is_concrete(acc.count) and int(acc.count) != stream_plan[0]:
        return None
    return online.finish(acc, stream_plan)


def _warn_unconverged(result: RunResult, initial_state: Any, warned: set) -> None:
    """The end-of-run checks
    (:func:`~cenlmc_jax.diagnostics.convergence.convergence_problems`), one warning
    each; the frozen check is skipped when the per-chunk watch already reported frozen
    chains.
    """
    position = getattr(initial_state, "position", None)
    many = position is not None and in_superchains(gather(position))
    start = position if many or "frozen" not in warned else None
    # a split R-hat above RHAT_MAX of many chains with independent, spread starts is
    # judged again as many short chains (convergence.judge_short_chains), as the CLI
    # does: stationary chains short against their autocorrelation time have a split
    # R-hat above 1 however many run
    found = convergence_problems(
        gather(result), gather(start), many_short_chains=start is not None
    )
    diag = result.online
    if (
        not many
        and diag is not None
        and all(map(is_concrete, jax.tree_util.tree_leaves(diag)))
    ):
        diag = gather(diag)
        high = online.stream_problems(diag, rhat_max=RHAT_MAX, ess_min=-math.inf)
        if position is not None:
            high = judge_short_chains(gather(result), gather(position), high)[0]
        found += high + online.stream_problems(diag, rhat_max=math.inf)
    for problem in found:
        host_warn(
            problem + " (cj.sample(..., check_convergence=False) turns this check off)",
            ConvergenceWarning,
            stacklevel=3,
        )


def _check_run_args(
    rng_key,
    step_fn,
    num_steps,
    thin,
    burn_in,
    mode,
    trace_fn,
    chunk_size,
    info_reduce,
    progress,
    on_divergence,
    check_convergence=True,
):
    """:func:`sample`'s arguments, checked in Python.

    Returns ``(step_fn, num_steps, thin, burn_in, chunk_size)``.
    """
    if isinstance(step_fn, SamplingAlgorithm):
        step_fn = step_fn.step
    check_callable(
        step_fn, "step_fn", "(rng_key, state) -> (state, info), or a SamplingAlgorithm"
    )
    check_key(rng_key, "rng_key")
    num_steps = check_int(num_steps, "num_steps", minimum=1)
    thin = check_int(thin, "thin", minimum=1)
    burn_in = check_int(burn_in, "burn_in", minimum=0)
    if num_steps % thin:
        raise ValueError(
            f"thin must divide num_steps; got thin={thin}, num_steps={num_steps}."
        )
    check_choice(mode, "mode", ("trace", "stream"))
    check_choice(info_reduce, "info_reduce", ("mean", None))
    check_choice(on_divergence, "on_divergence", ("stop", "warn", "raise"))
    check_bool(progress, "progress")
    check_bool(check_convergence, "check_convergence")
    if chunk_size is None:
        chunk_size = max(thin, (min(num_steps, 1000) // thin) * thin)
    chunk_size = check_int(chunk_size, "chunk_size", minimum=1)
    if chunk_size % thin:
        raise ValueError(
            f"thin must divide chunk_size; got thin={thin}, chunk_size={chunk_size}."
        )
    check_callable(trace_fn, "trace_fn", "state -> array to record")
    return step_fn, num_steps, thin, burn_in, chunk_size


def _open_checkpoint(
    checkpoint_path,
    rng_key,
    step_fn,
    initial_state,
    trace_fn,
    burn_in,
    num_steps,
    thin,
    mode,
    info_reduce,
    on_divergence,
    held,
    stream,
):
    """The checked path, the run's identity, and the resumed ``(state, step, stream
    carry, chunks, watches, diverged_at)`` when the file exists (None otherwise).

    ``stream``: the stream mode's fresh carry ``(Moments, OnlineAccumulator)`` (None in
    trace mode): the template of the saved one.
    """
    if any(
        isinstance(leaf, jax.core.Tracer)
        for leaf in jax.tree_util.tree_leaves((rng_key, initial_state))
    ):
        raise ValueError(
            "checkpoint_path cannot be used inside jax.jit, vmap or grad tracing (a "
            "checkpoint needs the values); call cj.sample outside the transformation "
            "to checkpoint."
        )
    checkpoint_path = ckpt.check_path(checkpoint_path)
    held.enter_context(ckpt.writer_lock(checkpoint_path))
    identity = ckpt.run_identity(
        rng_key,
        step_fn,
        initial_state,
        trace_fn,
        burn_in=burn_in,
        num_steps=num_steps,
        thin=thin,
        mode=mode,
        info_reduce=info_reduce,
        path=checkpoint_path,
    )
    if not os.path.exists(checkpoint_path):
        return checkpoint_path, identity, None
    resumed = _resume(
        checkpoint_path,
        identity,
        rng_key,
        step_fn,
        initial_state,
        trace_fn,
        info_reduce,
        burn_in,
        burn_in + num_steps,
        thin,
        mode,
        on_divergence,
        stream,
    )
    if resumed[-1] >= 0:
        _warn(
            f"the resumed run had diverged at step {resumed[-1]} (info.diverged); it "
            "stopped there"
        )
    return checkpoint_path, identity, resumed


def _warn_kept_flags(info: PyTree, burn_in: int, traced_warned: set) -> None:
    """One warning per ``kept_only`` :class:`~cenlmc_jax.base.RunFlag` set on a kept
    step (after ``burn_in``).
    """
    if info is None:
        return
    leaves = jax.tree_util.tree_leaves(info)
    if burn_in == 0:
        kept = info
    elif all(map(is_concrete, leaves)):  # on the host: no program to slice them
        kept = jax.tree_util.tree_map(lambda a: np.asarray(gather(a))[burn_in:], info)
    else:
        kept = _rows(info, burn_in, None)
    for flag in run_flags(info):
        if not flag.kept_only:
            continue
        if flag.mean_below is not None:
            _warn_mean_below(flag, kept, burn_in, traced_warned)
            continue
        if flag.statistic is not None:  # a number of the kept steps above a threshold
            if all(map(is_concrete, jax.tree_util.tree_leaves(kept))):
                value = flag.statistic(jax.tree_util.tree_map(gather, kept))
                if value is not None and value > flag.above:
                    host_warn(flag.message(kept, burn_in), RuntimeWarning, stacklevel=3)
            continue
        if flag.rising:
            value = getattr(kept, flag.field, None)
            if (
                value is not None
                and is_concrete(value)
                and rising_z(gather(value)) > RISING_Z
            ):
                host_warn(flag.message(kept, burn_in), RuntimeWarning, stacklevel=3)
            continue
        flags = _flag_steps(
            kept, flag.field, burn_in, traced_warned
        )  # None inside a trace: warned at run time
        if flags is not None and flags.any():
            host_warn(
                flag.message(kept, burn_in + int(np.argmax(flags))),
                RuntimeWarning,
                stacklevel=3,
            )


def _warn_mean_below(flag: Any, kept: PyTree, burn_in: int, traced_warned: set) -> None:
    """The warning of a ``mean_below`` :class:`~cenlmc_jax.base.RunFlag`: the field's
    mean over the kept steps below the flag's floor (inside a trace: at run time,
    ``jax.debug.callback``).
    """
    value = getattr(kept, flag.field, None)
    if value is None or np.shape(value)[0] == 0:
        return
    if isinstance(value, jax.core.Tracer):
        if flag.field not in traced_warned:
            traced_warned.add(flag.field)
            jax.debug.callback(
                functools.partial(_warn_mean_below_at_run_time, flag, burn_in), value
            )
        return
    _warn_mean_below_at_run_time(flag, burn_in, gather(value))


def _warn_mean_below_at_run_time(flag: Any, burn_in: int, value) -> None:
    """``value``: the field on the kept steps; the message reads it as
    ``infos.<field>``.
    """
    value = np.asarray(value, np.float64)
    if (
        not float(np.mean(value)) >= flag.mean_below
    ):  # NaN (no kept value) does not pass either
        host_warn(
            flag.message(SimpleNamespace(**{flag.field: value}), burn_in),
            RuntimeWarning,
            stacklevel=3,
        )


def _resume(
    path,
    identity,
    rng_key,
    step_fn,
    initial_state,
    trace_fn,
    info_reduce,
    burn_in,
    total,
    thin,
    mode,
    on_divergence,
    stream,
):
    """Read a checkpoint of this very run: ``(state, step, stream carry, chunks,
    watches, diverged_at)``.

    After the identity, every array is checked against this run (state leaves, one
    step's info and trace, kept draws per chunk, moments, the online accumulators and
    their plan): ``ValueError`` naming the file and the field. The stream carry is the
    saved moments and online accumulators (``stream``'s fresh accumulators where
    nothing was kept yet and a file of the older format saved none), None in trace
    mode.
    """
    ck = ckpt.load(path)
    ckpt.check_identity(path, ck.header["identity"], identity)

    def reduced_step(key, st):
        st, info = step_fn(key, st)
        return st, (reduce_info(info) if info_reduce == "mean" else info)

    state_shape, info_shape = jax.eval_shape(
        reduced_step, rng_key, initial_state
    )  # what the run saves
    kept_shape = jax.eval_shape(trace_fn, initial_state)
    leaves = jax.tree_util.tree_leaves
    ckpt.check_against_run(
        path,
        ck,
        state=leaves(state_shape),
        info=leaves(info_shape),
        kept=leaves(kept_shape),
        burn_in=burn_in,
        total=total,
        thin=thin,
        mode=mode,
        trace_dim=leaves(kept_shape)[0].shape[-1] if mode == "stream" else None,
        online=None if stream is None else leaves(fetch(stream[1])),
    )
    step, diverged_at = ck.header["step"], ck.header["diverged_at"]
    if diverged_at >= 0 and diverged_at == step and on_divergence != "stop":
        raise ValueError(
            f"checkpoint_path {path!r}: the run stopped at its divergence at step "
            f"{diverged_at} (on_divergence='stop'); it cannot go on with "
            f"on_divergence={on_divergence!r} (its trace ends mid-chunk). Resume with "
            "on_divergence='stop', or use another path."
        )
    treedef = jax.tree_util.tree_structure(initial_state)
    state = jax.tree_util.tree_unflatten(
        treedef, [jnp.asarray(a) for a in ck.state_leaves]
    )
    moments = None
    if stream is not None:
        acc = stream[1]
        if ck.online is not None:
            acc = jax.tree_util.tree_unflatten(
                jax.tree_util.tree_structure(acc), [jnp.asarray(a) for a in ck.online]
            )
        moments = (Moments(*map(jnp.asarray, ck.moments)), acc)
    info_def, kept_def = (
        jax.tree_util.tree_structure(info_shape),
        jax.tree_util.tree_structure(kept_shape),
    )
    chunks = []
    for kept, infos in ck.chunks:
        kept = (
            None
            if kept is None
            else jax.tree_util.tree_unflatten(kept_def, [jnp.asarray(a) for a in kept])
        )
        chunks.append(
            (
                kept,
                jax.tree_util.tree_unflatten(info_def, [jnp.asarray(a) for a in infos]),
            )
        )
    watches = ck.watches or [None] * len(chunks)
    return state, step, moments, chunks, watches, diverged_at


def _run_chunk(
    step_fn,
    rng_key,
    state,
    moments,
    start,
    n,
    burning,
    thin,
    capacity,
    mode,
    trace_fn,
    info_reduce,
):
    """Run ``n <= capacity`` steps from step ``start``: ``(state, moments, kept or None,
    infos or None, watches, overflow or None)``.

    Every call of a run uses the same compiled chunk of ``capacity`` steps
    (:func:`_chunk_fn`). A sampling chunk records every ``thin``-th state; a length that
    is not a multiple of ``thin`` (a replay up to a diverging step) records the whole
    multiples and runs the rest unrecorded. ``watches``: ``[(start, n, watch)]``.
    ``overflow``: per step, the streamed moments stopped being finite there (None
    outside stream mode).
    """
    if n == 0:
        return state, moments, None, None, [], None
    fn = _chunk_fn(step_fn, capacity // thin, thin, mode, trace_fn, info_reduce)
    new_state, new_moments, kept, infos, watch, overflow = fn(
        rng_key, state, moments, start, n, not burning
    )
    if (
        n < capacity
    ):  # a shorter chunk: drop the skipped steps' blank infos and the unrecorded rows
        infos, overflow = _rows((infos, overflow), 0, n)
        kept = _rows(kept, 0, n // thin) if kept is not None and n // thin else None
    if burning or mode != "trace":
        kept = None
    return (
        new_state,
        moments if burning else new_moments,
        kept,
        infos,
        [(start, n, watch)],
        overflow if mode == "stream" else None,
    )


def vmap_chains(algorithm: SamplingAlgorithm | StepFn) -> SamplingAlgorithm | StepFn:
    """Turn a single-chain sampler into one over a batch of chains.

    Given a :class:`~cenlmc_jax.base.SamplingAlgorithm` ``(init, step)`` for
    one chain (``position: (d,)`` or a pytree), returns one whose

    * ``init(positions, rng_key=None)`` takes ``positions: (C, d)`` (or a
      pytree whose leaves share a leading chain axis ``C``) and checks every
      chain: the positions finite, all chains at once (vectorised, one NumPy
      pass naming the bad chains); the single-chain ``init`` ``vmap``-ed over
      the chains; the log density of the states (when they carry one) not
      ``-inf``/NaN at every chain; then the single-chain ``init`` once more,
      eagerly, on one chain whose log density is finite (its checks that need
      real values: matrices at the point, parameters, shapes, run once).
      With a key, chain ``c`` gets ``split(rng_key, C)[c]``;
    * ``step(rng_key, states)`` runs chain ``c`` with ``split(rng_key, C)[c]``.

    Given a bare step function ``(rng_key, state) -> (state, info)``, returns the
    batched step function. The driver then reduces the per-chain infos per step
    (means, fractions). Keys are checked (:func:`~cenlmc_jax._validation.check_key`).

    Args:
      algorithm: a single-chain :class:`~cenlmc_jax.base.SamplingAlgorithm`, or a
        bare step function ``(rng_key, state) -> (state, info)``.

    Returns:
      A :class:`~cenlmc_jax.base.SamplingAlgorithm` over chains (for an
      algorithm) or the batched step function (for a step function).

    Raises:
      ValueError: ``algorithm`` is neither; at run time, states without a shared
        leading chain axis, non-finite positions, or a log density that is
        ``-inf``/NaN at every chain.
    """

    def step(rng_key, states):
        check_key(rng_key)
        leaves = jax.tree_util.tree_leaves(states)
        if (
            not leaves
            or any(np.ndim(x) < 1 for x in leaves)
            or len({np.shape(x)[0] for x in leaves}) != 1
        ):
            raise ValueError(
                "states must be a batch of chain states (every leaf with the leading "
                "chain axis C), from vmap_chains(...).init; got leaf shapes "
                f"{[np.shape(x) for x in leaves]}."
            )
        return jax.vmap(one_step)(
            jax.random.split(rng_key, np.shape(leaves[0])[0]), states
        )

    if not isinstance(algorithm, SamplingAlgorithm):
        check_callable(
            algorithm,
            "algorithm",
            "SamplingAlgorithm or (rng_key, state) -> (state, info)",
        )
        one_step = algorithm
        return step
    one_step = algorithm.step

    def init(positions, rng_key=None):
        if rng_key is not None:
            check_key(rng_key)
        positions, num_chains = check_chain_positions(positions)
        keys = None if rng_key is None else jax.random.split(rng_key, num_chains)
        args = (positions,) if keys is None else (positions, keys)
        states = jax.vmap(algorithm.init)(
            *args
        )  # traced: the checks that need values are skipped here ...
        logdensity = getattr(states, "logdensity", None)
        first = 0
        if logdensity is not None and is_concrete(logdensity):
            values = np.asarray(logdensity, np.float64).reshape(num_chains, -1)
            check_start_logdensity(
                values, where=f"one of the {num_chains} chains' starting points"
            )
            first = int(np.argmax(np.isfinite(values).all(axis=1)))
        one = jax.tree_util.tree_map(lambda a: a[first], args)
        algorithm.init(*one)  # ... and run on one chain, eagerly, with real values
        return states

    return SamplingAlgorithm(init, step)


def check_chain_positions(positions: Any) -> tuple:
    """``(positions, C)``: an array ``(C, d)`` or a pytree of arrays sharing the leading
    chain axis ``C >= 1``, finite, checked for all chains at once (``ValueError`` naming
    ``positions`` and the bad chains).
    """
    is_array = not isinstance(positions, (dict, list, tuple)) or hasattr(
        positions, "shape"
    )
    check = functools.partial(
        check_position, finite=False
    )  # finiteness: per chain, below
    if is_array:
        positions = check(positions, "positions")
        if positions.ndim < 2 or positions.shape[0] < 1:
            raise ValueError(
                "positions must have a leading chain axis, shape (C, d); got shape "
                f"{tuple(positions.shape)}."
            )
        leaves = [positions]
    else:
        positions = jax.tree_util.tree_map_with_path(
            lambda path, leaf: check(leaf, "positions" + jax.tree_util.keystr(path)),
            positions,
        )
        leaves = jax.tree_util.tree_leaves(positions)
        sizes = {x.shape[0] if x.ndim else None for x in leaves}
        if not leaves or None in sizes or len(sizes) != 1 or 0 in sizes:
            raise ValueError(
                "positions must be an array (C, d) or a pytree whose leaves share a "
                "leading chain axis C >= 1; got leaf shapes "
                f"{[tuple(x.shape) for x in leaves]}."
            )
    num_chains = leaves[0].shape[0]
    bad = np.zeros(num_chains, bool)
    for leaf in leaves:
        if is_concrete(leaf):  # one vectorised pass over all chains
            bad |= ~np.isfinite(np.asarray(gather(leaf))).reshape(num_chains, -1).all(
                axis=1
            )
    if bad.any():
        shown = np.flatnonzero(bad)[:10].tolist()
        raise ValueError(
            f"positions must be finite; {int(bad.sum())} of {num_chains} chains "
            f"contain NaN or inf (chains {shown}{' ...' if bad.sum() > 10 else ''})."
        )
    return positions, num_chains
