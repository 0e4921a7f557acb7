"""The pieces of a warm-up (:mod:`cenlmc_jax.adaptation` combines them).

* dual averaging of the log step size (Nesterov 2009; Hoffman & Gelman 2014,
  §3.2.1) and a Robbins-Monro step for the fast phase;
* Welford's running mean and (co)variance, and their combination over chains
  (Chan et al.'s parallel update, weighted);
* Stan's window schedule (fast, slow doubling windows, fast).

Pure functions on ``NamedTuple`` states, so they ``jit``, ``vmap`` and ``scan``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax.numpy as jnp

from cenlmc_jax.types import Array

__all__ = [
    "DualAveragingState",
    "dual_averaging_init",
    "dual_averaging_update",
    "restart_dual_averaging",
    "robbins_monro_update",
    "WelfordState",
    "welford_init",
    "welford_update",
    "welford_covariance",
    "pool_welford",
    "build_schedule",
]


# ------------------------------------------------------------------ dual averaging


class DualAveragingState(NamedTuple):
    """State of dual averaging (DA).

    Attributes:
      log_step_size: ``x_t``.
      log_step_size_avg: ``x̄_t``.
      step: ``t`` (from 1).
      avg_error: ``H̄_t``.
      mu: ``μ``, the point the iterates shrink towards.
    """

    log_step_size: Array
    log_step_size_avg: Array
    step: Array
    avg_error: Array
    mu: Array


def dual_averaging_init(step_size: Any, dtype=None) -> DualAveragingState:
    """Start (DA) at ``ε_0 = step_size``, shrinking towards ``μ = log(10 ε_0)``.

    Args:
      step_size: ``ε_0 > 0``, a scalar.
      dtype: the dtype of the log step sizes (None: from ``step_size``).

    Returns:
      A :class:`DualAveragingState` with ``t = 1``.
    """
    x = jnp.log(jnp.asarray(step_size, dtype))
    zero = jnp.zeros_like(x)
    return DualAveragingState(x, x, jnp.ones((), jnp.int32), zero, jnp.log(10.0) + x)


def dual_averaging_update(
    state: DualAveragingState,
    acceptance_rate: Array,
    target: float,
    *,
    t0: float = 10.0,
    gamma: float = 0.05,
    kappa: float = 0.75,
) -> DualAveragingState:
    """One step of (DA) with the observed acceptance probability ``α_t``.

    Args:
      state: the current :class:`DualAveragingState`.
      acceptance_rate: ``α_t``, a scalar (a NaN counts as 0).
      target: the acceptance ``δ`` aimed at.
      t0: the iteration offset ``t_0``.
      gamma: the shrinkage ``γ``.
      kappa: the averaging exponent ``κ``.

    Returns:
      The next :class:`DualAveragingState`.
    """
    t = state.step.astype(state.log_step_size.dtype)
    alpha = jnp.where(jnp.isnan(acceptance_rate), 0.0, acceptance_rate).astype(t.dtype)
    w = 1.0 / (t + t0)
    avg_error = (1.0 - w) * state.avg_error + w * (target - alpha)
    x = state.mu - jnp.sqrt(t) / gamma * avg_error
    eta = t ** (-kappa)
    x_avg = eta * x + (1.0 - eta) * state.log_step_size_avg
    return DualAveragingState(x, x_avg, state.step + 1, avg_error, state.mu)


def restart_dual_averaging(state: DualAveragingState) -> DualAveragingState:
    """Start (RM) at (DA)'s average: ``x = x̄ = x̄_t``, ``t = 1``.

    Right after a window end, ``x̄ = x``.

    Args:
      state: the (DA) state to restart from.

    Returns:
      The restarted :class:`DualAveragingState`.
    """
    x = state.log_step_size_avg
    return DualAveragingState(x, x, jnp.ones((), jnp.int32), state.avg_error, state.mu)


def robbins_monro_update(
    state: DualAveragingState,
    acceptance_rate: Array,
    target: float,
    *,
    gain: float = 2.0,
    power: float = 0.6,
    t0: float = 10.0,
) -> DualAveragingState:
    """One step of the final window's iteration (RM).

    In the fields of :class:`DualAveragingState`::

        x_{t+1} = x_t + gain (α_t - δ) / (t + t0)^power
        x̄_{t+1} = x̄_t + (x_{t+1} - x̄_t) / t                            (RM)

    (Robbins & Monro 1951 with Polyak-Ruppert averaging: ``x̄`` is the plain
    mean of the iterates.) Its gain decreases, so the iterates settle on the
    step whose *fixed-ε* mean acceptance is ``δ``; dual averaging's iterates
    keep moving by ``O(1/γ)·|δ - α_t|``, and when ``α_t`` is one chain's
    single-proposal acceptance that noise, through the curvature of
    ``α(log ε)``, biases its average (on one chain with RW-MH, well below a
    target of 0.234). ``avg_error`` and ``mu`` are carried unchanged.

    Args:
      state: the current state.
      acceptance_rate: ``α_t``, a scalar (a NaN counts as 0).
      target: ``δ``.
      gain: the gain.
      power: the gain's decay exponent.
      t0: the iteration offset.

    Returns:
      The next :class:`DualAveragingState`.
    """
    t = state.step.astype(state.log_step_size.dtype)
    alpha = jnp.where(jnp.isnan(acceptance_rate), 0.0, acceptance_rate).astype(t.dtype)
    x = state.log_step_size + gain * (alpha - target) / (t + t0) ** power
    x_avg = state.log_step_size_avg + (x - state.log_step_size_avg) / t
    return DualAveragingState(x, x_avg, state.step + 1, state.avg_error, state.mu)


# ---------------------------------------------------------------------- Welford


class WelfordState(NamedTuple):
    """Welford's running moments.

    Attributes:
      count: the number of points added.
      mean: ``(d,)`` running mean.
      m2: ``(d,)`` sums of squared deviations (diagonal) or ``(d, d)`` of outer
        products (dense).
    """

    count: Array
    mean: Array
    m2: Array


def welford_init(d: int, dense: bool, dtype) -> WelfordState:
    """An empty :class:`WelfordState`.

    Args:
      d: the dimension.
      dense: keep ``(d, d)`` outer products (else ``(d,)`` squares).
      dtype: the dtype of the moments.

    Returns:
      A :class:`WelfordState` with count 0.
    """
    return WelfordState(
        jnp.zeros((), dtype),
        jnp.zeros((d,), dtype),
        jnp.zeros((d, d) if dense else (d,), dtype),
    )


def welford_update(state: WelfordState, x: Array) -> WelfordState:
    """Add a batch ``x: (n, d)``.

    Chan et al.'s pairwise combination; ``n = 1`` is Welford's step.

    Args:
      state: the current :class:`WelfordState`.
      x: the batch, shape ``(n, d)``.

    Returns:
      The updated :class:`WelfordState`.
    """
    n_b = jnp.asarray(x.shape[0], state.mean.dtype)
    mean_b = jnp.mean(x, axis=0)
    dev = x - mean_b
    dense = state.m2.ndim == 2
    m2_b = dev.T @ dev if dense else jnp.sum(dev**2, axis=0)
    n = state.count + n_b
    delta = mean_b - state.mean
    mean = state.mean + delta * (n_b / n)
    cross = jnp.outer(delta, delta) if dense else delta**2
    return WelfordState(n, mean, state.m2 + m2_b + cross * (state.count * n_b / n))


def welford_covariance(state: WelfordState) -> Array:
    """Stan's regularised estimate ``n/(n+5) S + 10⁻³·5/(n+5) I`` (``S`` with ddof 1).

    Args:
      state: a :class:`WelfordState`.

    Returns:
      The estimate, ``(d,)`` (diagonal) or ``(d, d)`` (dense).
    """
    n = state.count
    s = state.m2 / jnp.maximum(n - 1.0, 1.0)
    shrink = 1e-3 * 5.0 / (n + 5.0)
    if s.ndim == 1:
        return n / (n + 5.0) * s + shrink
    return n / (n + 5.0) * s + shrink * jnp.eye(s.shape[0], dtype=s.dtype)


# --------------------------------------------------------------------- schedule


def build_schedule(
    num_steps: int,
    initial_buffer: int = 75,
    first_window: int = 25,
    final_buffer: int = 50,
) -> list[tuple[int, bool, bool]]:
    """Stan's warm-up windows as segments ``(length, slow, ends_window)``.

    A fast segment adapts the step size only; a slow one also accumulates the
    covariance, and ``ends_window`` marks where the preconditioner is updated.
    Fewer than 20 steps: one fast segment. When the three buffers do not fit,
    they become 15% / 75% / 10% of ``num_steps``. Slow windows double in
    length; the last one is stretched to the final buffer.

    Args:
      num_steps: the warm-up's length.
      initial_buffer: the first fast segment's length.
      first_window: the first slow window's length.
      final_buffer: the last fast segment's length.

    Returns:
      The list of ``(length, slow, ends_window)``, lengths summing to
      ``num_steps``.
    """
    if num_steps < 20:
        return [(num_steps, False, False)] if num_steps else []
    if initial_buffer + first_window + final_buffer > num_steps:
        initial_buffer = int(0.15 * num_steps)
        final_buffer = int(0.1 * num_steps)
        first_window = num_steps - initial_buffer - final_buffer
    segments = [(initial_buffer, False, False)] if initial_buffer else []
    start, size, end_slow = initial_buffer, first_window, num_steps - final_buffer
    while start < end_slow:
        if (
            start + 3 * size > end_slow
        ):  # the next window would not fit: stretch this one
            size = end_slow - start
        segments.append((size, True, True))
        start += size
        size *= 2
    if final_buffer:
        segments.append((final_buffer, False, False))
    return segments


def pool_welford(state: WelfordState, weights: Array) -> WelfordState:
    """Chan et al.'s combination of per-chain Welford states.

    Over the chains with ``weights`` 1 (0: left out): ``n = Σ n_c``,
    ``mean = Σ n_c mean_c / n``, ``m2 = Σ m2_c + Σ n_c δ_c δ_cᵀ``.

    Args:
      state: per-chain :class:`WelfordState` (leading chain axis ``C``).
      weights: ``(C,)`` of 1 (pooled) or 0 (left out).

    Returns:
      The pooled :class:`WelfordState` (no chain axis).
    """
    n_c = state.count * weights
    n = jnp.sum(n_c)
    mean = jnp.sum(n_c[:, None] * state.mean, axis=0) / jnp.maximum(n, 1.0)
    dev = state.mean - mean
    w = weights.reshape((-1,) + (1,) * (state.m2.ndim - 1))
    cross = (
        jnp.einsum("c,ci,cj->ij", n_c, dev, dev)
        if state.m2.ndim == 3
        else jnp.sum(n_c[:, None] * dev**2, axis=0)
    )
    return WelfordState(n, mean, jnp.sum(w * state.m2, axis=0) + cross)
