"""The layout of draws and the argument checks every diagnostic shares.

Argument checking happens in Python on shapes and dtypes only, *before* any
tracing, and raises :class:`ValueError` naming the offending argument, what
was given and what was expected.

Layout of draws (one layout, checked)
-------------------------------------
Chain diagnostics take draws **chains first**: ``(num_chains, num_samples,
*event_shape)``, as ArviZ, NumPyro (``group_by_chain=True``) and BlackJAX do;
for an ensemble sampler a "chain" is a particle. They also take a
:class:`~cenlmc_jax.run.RunResult` directly: its trace, which ``cj.sample``
stores as ``(draws, chains, *event)`` (or ``(draws, d)`` for one chain), is
put chains first for you. Results are per coordinate, shape ``event_shape``.

A plain array cannot say which axis is which, so when the axes are not given
(``chain_axis=None, sample_axis=None``: chains first) and the values are
concrete, two symptoms of a swapped layout raise a :class:`LayoutWarning`:

* the chain means are autocorrelated along the chain axis (lag-1
  correlation above 5 standard errors, ``5/sqrt(M)``): independent chains
  have no order, consecutive draws of a chain do;
* an ESS far above the number of draws ``M N``: above ``M N max(1.5, 1 +
  10/sqrt(M N))`` (5 standard errors of the estimate for iid draws, and
  room for mildly antithetic chains such as the irreversible Gamma
  sampler's, 1.05 M N): short "chains" that are really time points give
  such values (strongly antithetic chains can too).

Passing ``chain_axis``/``sample_axis`` explicitly states the layout and
silences the first check. Other layouts are described with these keywords.

Floating dtypes are preserved (float64 in, float64 out when
``jax_enable_x64`` is on); integer and boolean inputs are promoted to the
default floating dtype.

Names: :func:`chains_first` and :class:`LayoutWarning` (public, re-exported
by :mod:`cenlmc_jax.diagnostics`); :func:`checked_chains_first` (the layout
with the draw/chain counts a diagnostic needs), :func:`check_ess` (the
second symptom), :func:`as_float_array` and :func:`common_float_dtype`, the
pieces the diagnostics' modules share.
"""

from __future__ import annotations

import math
import operator
import warnings
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from cenlmc_jax._validation import is_concrete
from cenlmc_jax.base import RunResult
from cenlmc_jax.types import Array, ArrayLike

__all__ = [
    "LayoutWarning",
    "chains_first",
    "checked_chains_first",
    "check_ess",
    "as_float_array",
    "common_float_dtype",
]

# Layout check: lag-1 correlation of chain means along the chain axis has
# sd 1/sqrt(M) for independent chains; 5 sd is a false alarm of 3e-7.
_LAYOUT_Z = 5.0
# ESS check: for iid draws ESS/(MN) - 1 ~ -2 rho_1 with sd 2/sqrt(MN), so 1 +
# 10/sqrt(MN) is 5 sd; and at least 1.5, since antithetic chains exceed MN a little (the
# irreversible Gamma sampler on a 2-D Gaussian: 1.05 MN) while a swapped layout gave
# 1.5-4 MN.
_ESS_EXCESS_SD = 10.0
_ESS_EXCESS_MIN = 1.5


class LayoutWarning(UserWarning):
    """Draws whose layout looks swapped: e.g. ``cj.sample``'s ``(draws, chains, d)``
    read as ``(chains, draws, d)``.
    """


# --------------------------------------------------------------------------
# Validation helpers (pure Python, shape/dtype only; safe under tracing).
# --------------------------------------------------------------------------


def as_float_array(x: ArrayLike, name: str) -> Array:
    """Convert to a jax array with a real floating dtype, or raise.

    Integer and bool arrays become JAX's default float.

    Args:
      x: array-like.
      name: its name in the messages.

    Returns:
      A JAX array of a real floating dtype.

    Raises:
      ValueError: ``x`` is not array-like, is complex, or is not numeric.
    """
    try:
        arr = jnp.asarray(x)
    except (TypeError, ValueError) as err:
        raise ValueError(
            f"{name} must be array-like with a numeric dtype (or a RunResult); got an "
            f"object of type {type(x).__name__}."
        ) from err
    if jnp.issubdtype(arr.dtype, jnp.complexfloating):
        raise ValueError(f"{name} must be real-valued; got dtype {arr.dtype}.")
    if not jnp.issubdtype(arr.dtype, jnp.floating):
        if not (jnp.issubdtype(arr.dtype, jnp.integer) or arr.dtype == jnp.bool_):
            raise ValueError(
                f"{name} must have a real numeric dtype; got dtype {arr.dtype}."
            )
        arr = arr.astype(jnp.result_type(float))
    return arr


def _normalize_axis(axis: Any, ndim: int, name: str) -> int:
    try:
        axis = operator.index(axis)
    except TypeError as err:
        raise ValueError(
            f"{name} must be an integer axis; got {axis!r} of type "
            f"{type(axis).__name__}."
        ) from err
    if not -ndim <= axis < ndim:
        raise ValueError(
            f"{name}={axis} is out of range for samples with ndim={ndim}; "
            f"expected an integer in [{-ndim}, {ndim - 1}]."
        )
    return axis % ndim


def _trace_chains_first(result: RunResult) -> Array:
    """A :class:`RunResult`'s trace as ``(chains, draws, *event)``.

    ``cj.sample`` stacks ``trace_fn(state)`` on a leading draws axis. When the
    state's position is one point ``(d,)`` the run had one chain; otherwise
    the position's leading axis (chains of ``vmap_chains``, particles of an
    ensemble) is axis 1 of the trace.
    """
    if result.trace is None:
        raise ValueError(
            "samples is a RunResult without a trace (mode='stream' keeps moments "
            "only): run cj.sample with mode='trace' to keep draws, or use "
            "cj.summary(result), which summarises the moments."
        )
    trace = result.trace
    if not isinstance(trace, (jax.Array, np.ndarray)):
        raise ValueError(
            f"samples is a RunResult whose trace is a {type(trace).__name__}; the "
            "diagnostics need one array (a trace_fn returning an array)."
        )
    position = getattr(result.state, "position", None)
    single = trace.ndim == 2 if position is None else jnp.ndim(position) == 1
    if single or trace.ndim < 2:
        return as_float_array(trace, "samples")[None]
    return jnp.swapaxes(as_float_array(trace, "samples"), 0, 1)


def _check_layout(x: Array) -> None:
    """Warn when chain means are autocorrelated along the chain axis.

    See the module docstring.
    """
    m = x.shape[0]
    if m < 3 or not is_concrete(x):
        return
    means = np.asarray(jnp.mean(x, axis=1), np.float64).reshape(m, -1)
    centred = means - means.mean(axis=0)
    den = np.sum(centred * centred, axis=0)
    num = np.sum(centred[:-1] * centred[1:], axis=0)
    r = np.divide(num, den, out=np.zeros_like(num), where=den > 0)
    z = r * math.sqrt(m)
    if np.max(z) > _LAYOUT_Z:
        warnings.warn(
            f"samples of shape {tuple(x.shape)} was read as (chains, draws, ...) = "
            f"({m} chains of {x.shape[1]} draws), but the chain means are "
            "autocorrelated along the chain axis (lag-1 correlation "
            f"{float(r[np.argmax(z)]):.2f}, {float(np.max(z)):.0f} standard "
            "errors): consecutive 'chains' look like consecutive draws. "
            "cj.sample's trace is (draws, chains, d): pass the RunResult "
            "itself, or swapaxes(trace, 0, 1). If the chains really are ordered "
            "(started on a sorted grid, not yet mixed), pass chain_axis and "
            "sample_axis explicitly.",
            LayoutWarning,
            stacklevel=4,
        )


def check_ess(ess: Array, total: int, what: str) -> None:
    """Warn when an ESS exceeds the number of draws by more than its noise.

    See the module docstring; a :class:`LayoutWarning`, nothing for a traced
    ``ess``.

    Args:
      ess: the effective sample sizes (any shape).
      total: the number of draws, chains times draws per chain.
      what: what ``ess`` is, for the message.
    """
    if not is_concrete(ess):
        return
    e = np.asarray(ess, np.float64)
    limit = total * max(_ESS_EXCESS_MIN, 1.0 + _ESS_EXCESS_SD / math.sqrt(total))
    if e.size and np.nanmax(e, initial=-np.inf) > limit:
        warnings.warn(
            f"{what} {float(np.nanmax(e)):.6g} exceeds the {total} draws by more than "
            f"its sampling noise allows (> {limit:.6g}): the usual cause is a "
            "(draws, chains, ...) array read as (chains, draws, ...); "
            "cj.sample's trace is (draws, chains, d): pass the RunResult "
            "itself, or swapaxes(trace, 0, 1). (Antithetic chains also do this.)",
            LayoutWarning,
            stacklevel=3,
        )


def checked_chains_first(
    samples: ArrayLike,
    chain_axis: Any,
    sample_axis: Any,
    *,
    min_draws: int,
    min_chains: int = 1,
    why: str = "",
) -> tuple:
    """Validate ``samples`` and lay them out chains first.

    Args:
      samples: a :class:`RunResult` with a trace, or an array of at least 2
        dimensions.
      chain_axis: the array's chain axis (default 0); None for a RunResult.
      sample_axis: the array's draw axis (default 1); None for a RunResult.
      min_draws: the fewest draws per chain accepted.
      min_chains: the fewest chains accepted.
      why: what the minimum is for, appended to the message.

    Returns:
      ``(x, from_array)``: ``x`` laid out ``(chain, draw, *event)``, and whether
      ``samples`` was an array (not a RunResult).

    Raises:
      ValueError: a RunResult without an array trace or with axes given, an
        array of fewer than 2 dimensions, bad or equal axes, or too few draws or
        chains.
    """
    if isinstance(samples, RunResult):
        if chain_axis is not None or sample_axis is not None:
            raise ValueError(
                "chain_axis and sample_axis describe an array; a RunResult's layout "
                f"is known (pass neither); got chain_axis={chain_axis!r}, "
                f"sample_axis={sample_axis!r}."
            )
        x = _trace_chains_first(samples)
        shape, from_array = tuple(samples.trace.shape), False
        chain_axis, sample_axis = 1, 0
    else:
        x = as_float_array(samples, "samples")
        shape, from_array = tuple(x.shape), True
        if x.ndim < 2:
            raise ValueError(
                "samples must have at least 2 dimensions (chains and draws); got "
                f"shape {tuple(x.shape)}. Expected (num_chains, num_samples, "
                "*event_shape); add a chain axis of size 1 for a single chain."
            )
        stated = chain_axis is not None or sample_axis is not None
        chain_axis = 0 if chain_axis is None else chain_axis
        sample_axis = 1 if sample_axis is None else sample_axis
        c_ax = _normalize_axis(chain_axis, x.ndim, "chain_axis")
        s_ax = _normalize_axis(sample_axis, x.ndim, "sample_axis")
        if c_ax == s_ax:
            raise ValueError(
                f"chain_axis ({chain_axis}) and sample_axis ({sample_axis}) "
                f"refer to the same axis of samples with shape {tuple(x.shape)}; "
                "expected two distinct axes."
            )
        x = jnp.moveaxis(x, (c_ax, s_ax), (0, 1))
        if not stated:
            _check_layout(x)
    num_chains, num_draws = x.shape[0], x.shape[1]
    if num_draws < min_draws:
        raise ValueError(
            f"samples has {num_draws} draws per chain along sample_axis="
            f"{sample_axis} (shape {shape}); expected at "
            f"least {min_draws}{why}."
        )
    if num_chains < min_chains:
        raise ValueError(
            f"samples has {num_chains} chain(s) along chain_axis="
            f"{chain_axis} (shape {shape}); expected at "
            f"least {min_chains}{why}."
        )
    return x, from_array


def chains_first(
    samples: ArrayLike, chain_axis: int | None = None, sample_axis: int | None = None
) -> Array:
    """The draws as ``(chains, draws, *event)``: from a :class:`RunResult` or an array.

    A ``RunResult``'s trace ``(draws, chains, *event)`` is transposed (a
    single-chain ``(draws, d)`` trace gets a chain axis of 1); an array is
    taken chains first unless the axes are given, with the layout check of
    the module docstring. What every chain diagnostic, ``cj.summary``,
    ``cj.to_arviz`` and ``cenlmc_jax.diagnostics.plots`` use.

    Args:
      samples: a :class:`RunResult` with a trace, or an array.
      chain_axis: the array's chain axis (default 0).
      sample_axis: the array's draw axis (default 1).

    Returns:
      The draws as a JAX array ``(chains, draws, *event)``.

    Raises:
      ValueError: as :func:`checked_chains_first`.
    """
    return checked_chains_first(samples, chain_axis, sample_axis, min_draws=1)[0]


def common_float_dtype(*arrays: Array):
    """The promoted dtype of ``arrays``.

    Args:
      *arrays: JAX or NumPy arrays.

    Returns:
      ``jnp.result_type`` of their dtypes.
    """
    return jnp.result_type(*[a.dtype for a in arrays])
