"""Draws under their names: a model's constrained values,
for :func:`cenlmc_jax.diagnostics.summary`, :func:`cenlmc_jax.to_arviz`
and :mod:`cenlmc_jax.diagnostics.plots`.

The samplers move a flat unconstrained point ``x: (d,)``. A model written with named,
constrained parameters (a NumPyro model through :func:`cenlmc_jax.from_numpyro`, or a
hand-written map) has a ``constrain`` function ``x -> {site: array}`` (e.g. ``tau =
exp(x[1])`` for a positive scale, plus any deterministic sites). Each draw is mapped by
it, ``z_t^{(c)} = constrain(x_t^{(c)})`` for chain ``c`` and draw ``t``, and every
statistic is computed on ``z``: the mean of ``tau`` is ``mean_t exp(x_t)``, not
``exp(mean_t x_t)`` (Jensen: they differ), which is why the summaries take the draws,
never the moments.

Sites are laid out in sorted name order, each flattened in C order; a scalar site is
named ``site``, an array site ``site[i]`` (``site[i,j]``, ...), 0-based, as
``NumPyroModel.names`` names the unconstrained coordinates. ``constrain`` may also
return one array, whose coordinates are ``x[i]``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from cenlmc_jax import diagnostics as dg

__all__ = [
    "resolve_constrain",
    "site_draws",
    "site_names",
    "flatten_sites",
    "named_draws",
]


def resolve_constrain(model: Any = None, constrain: Any = None) -> Callable | None:
    """The constrain function from ``model`` or ``constrain`` itself.

    Args:
      model: anything with a callable ``.constrain`` (e.g. what
        :func:`cenlmc_jax.from_numpyro` returns), or None.
      constrain: a function ``x: (d,) -> {site: array}`` (or one array), or None.

    Returns:
      The constrain function; None when neither is given.

    Raises:
      ValueError: both given, a ``model`` without a callable ``.constrain``, or a
        ``constrain`` that is not callable.
    """
    if model is not None and constrain is not None:
        raise ValueError(
            "model and constrain: pass one of them (model=m uses m.constrain); got "
            "both."
        )
    if model is not None:
        fn = getattr(model, "constrain", None)
        if not callable(fn):
            raise ValueError(
                f"model={type(model).__name__}: expected what cj.from_numpyro returns "
                "(an object with a callable .constrain: x -> {site: array})."
            )
        return fn
    if constrain is not None and not callable(constrain):
        raise ValueError(
            f"constrain={constrain!r}: expected a function x: (d,) -> {{site: array}} "
            "or an array."
        )
    return constrain


def _as_sites(out: Any, var_name: str) -> dict:
    if isinstance(out, dict):
        bad = [k for k in out if not isinstance(k, str)]
        if bad or not out:
            raise ValueError(
                f"constrain returned a dict with keys {sorted(map(repr, out))}; "
                "expected a non-empty dict of site names (str) to arrays."
            )
        return {k: out[k] for k in sorted(out)}
    if isinstance(out, (jax.Array, np.ndarray, jax.ShapeDtypeStruct)):
        return {var_name: out}
    raise ValueError(
        f"constrain returned a {type(out).__name__}; expected a dict {{site: array}} "
        "or one array."
    )


def site_draws(x: Any, constrain: Callable, var_name: str = "x") -> dict:
    """The constrained sites of chains-first unconstrained draws.

    Each draw mapped by ``constrain`` (jitted, vmapped twice; in float64 for
    float64 draws).

    Args:
      x: the draws, shape ``(chains, draws, d)``
        (:func:`cenlmc_jax.diagnostics.chains_first`).
      constrain: ``x: (d,) -> {site: array}`` or one array.
      var_name: the site name of a ``constrain`` that returns one array.

    Returns:
      ``{site: (chains, draws, *site_shape) float64 NumPy array}``, sites sorted.

    Raises:
      ValueError: ``x`` not of 3 dimensions, or ``constrain`` returning something
        else than a non-empty dict of arrays or one array.
    """
    x = jax.numpy.asarray(x)
    if x.ndim != 3:
        raise ValueError(
            "constrain maps a flat point x: (d,); the draws have shape "
            f"{tuple(x.shape)} (expected (chains, draws, d))."
        )
    f64 = x.dtype == np.float64
    # a float64 run is constrained in float64
    with jax.enable_x64(True) if f64 else contextlib.nullcontext():
        # what it returns, checked on shapes first
        _as_sites(jax.eval_shape(constrain, x[0, 0]), var_name)
        out = jax.jit(jax.vmap(jax.vmap(constrain)))(x)
    sites = _as_sites(out, var_name)
    return {k: np.asarray(v, np.float64) for k, v in sites.items()}


def site_names(sites: dict, lead: int = 2) -> tuple:
    """The column names of :func:`flatten_sites`.

    Args:
      sites: ``{site: array}``.
      lead: the leading axes of each array that are not the site's own
        (``(chains, draws)``: 2).

    Returns:
      A tuple of ``site`` or ``site[i,...]`` (C order), sites sorted.
    """
    names = []
    for site in sorted(sites):
        shape = np.shape(sites[site])[lead:]
        names += (
            [site]
            if shape == ()
            else [f"{site}[{','.join(map(str, i))}]" for i in np.ndindex(*shape)]
        )
    return tuple(names)


def flatten_sites(sites: dict) -> tuple:
    """The sites side by side, sorted by name, each in C order.

    Args:
      sites: ``{site: (chains, draws, *site_shape) array}``.

    Returns:
      ``(z: (chains, draws, k), names)``, ``names`` of :func:`site_names`.
    """
    cols = [np.reshape(sites[s], np.shape(sites[s])[:2] + (-1,)) for s in sorted(sites)]
    return np.concatenate(cols, axis=-1), site_names(sites)


def named_draws(draws: Any, constrain: Callable | None) -> tuple:
    """The constrained draws and their names.

    Or, without ``constrain``, the draws themselves with their event axes
    flattened and no names.

    Args:
      draws: a RunResult or chains-first draws.
      constrain: ``x: (d,) -> {site: array}``, or None.

    Returns:
      ``(z: (chains, draws, k) float64, names or None)``.
    """
    x = dg.chains_first(draws)
    if constrain is None:
        x = np.asarray(x, np.float64)
        return x.reshape(x.shape[:2] + (-1,)), None
    return flatten_sites(site_draws(x, constrain))
