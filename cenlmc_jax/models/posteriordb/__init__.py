"""Ten posteriors of the posterior database (posteriordb), written in JAX.

With their reference moments.

``post = cenlmc_jax.models.posteriordb.load("eight_schools-eight_schools_noncentered")``
returns a :class:`Posterior`: the log density on Stan's unconstrained scale
(``post.logdensity_fn(x)``, ``x: (d,)``, Jacobians of the constraining transforms
included; see :mod:`cenlmc_jax.models.posteriordb.models`), ``d``, ``post.constrain(x)``
(a dict keyed by the reference's parameter names, ``"beta[1]"``, ``"sigma"``, ..., each
a scalar for one ``x``; ``jax.vmap`` it over draws) and the reference means and sds of
those quantities (10 chains x 1,000 NUTS draws of posteriordb, computed by
``benchmarks/posteriordb_refs.py``).

The data, the Stan code and the reference moments live in ``data/`` inside this package
(nothing is read from outside it); they come from stan-dev/posteriordb under its BSD
3-Clause licence (``LICENCE-posteriordb.md`` beside this file; ``README.md`` says what
was copied). ``NAMES`` lists them.
"""

from __future__ import annotations

import gzip
import json
import re
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any, NamedTuple

import jax.numpy as jnp
import numpy as np

from .models import BUILDERS, Model

__all__ = ["NAMES", "Posterior", "load", "load_data", "reference"]

DATA_DIR = Path(__file__).resolve().parent / "data"

#: the posteriordb names of the ten posteriors, sorted
NAMES: tuple = tuple(sorted(BUILDERS))

_NAME = re.compile(r"^(?P<base>[A-Za-z_][A-Za-z0-9_]*)(\[(?P<index>\d+)\])?$")


class Posterior(NamedTuple):
    """One posteriordb posterior on the unconstrained scale, with its reference moments.

    ``names`` are the reference's quantities (constrained parameters and the transformed
    parameters it reports), in its order; ``ref_mean``, ``ref_sd``, ``ref_ess`` (the
    reference's bulk ESS) are ``(len(names),)`` float64 arrays in that order.
    ``unconstrained_names`` name the coordinates of ``x``. ``constrain_array(x)`` is
    ``constrain(x)`` stacked in ``names`` order, ``(len(names),)``.
    """

    name: str
    logdensity_fn: Callable[[Any], Any]
    d: int
    constrain: Callable[[Any], dict]
    constrain_array: Callable[[Any], Any]
    names: tuple
    unconstrained_names: tuple
    ref_mean: np.ndarray
    ref_sd: np.ndarray
    ref_ess: np.ndarray


def _check_name(name: Any) -> str:
    if not isinstance(name, str) or name not in BUILDERS:
        raise ValueError(
            f"name={name!r}: expected one of the posteriordb names {', '.join(NAMES)}"
        )
    return name


@cache
def _read_data(name: str) -> str:
    plain = DATA_DIR / f"{name}.json"
    if plain.exists():
        return plain.read_text()
    with gzip.open(DATA_DIR / f"{name}.json.gz", "rt", encoding="utf-8") as f:
        return f.read()


def load_data(name: str) -> dict:
    """The posterior's data as in posteriordb's ``data.json``.

    Lists turned into float64 / int NumPy arrays.

    Args:
      name: one of :data:`NAMES`.

    Returns:
      ``{field: NumPy array}``.

    Raises:
      ValueError: an unknown ``name``.
    """
    raw = json.loads(_read_data(_check_name(name)))
    return {k: np.asarray(v) for k, v in raw.items()}


@cache
def _refs() -> dict:
    return json.loads((DATA_DIR / "refs.json").read_text())


def reference(name: str) -> dict:
    """The reference moments of a posterior.

    Args:
      name: one of :data:`NAMES`.

    Returns:
      ``{"names": [...], "num_draws": 10000, "params": {name: {"mean", "sd",
      "ess_bulk"}}}``.

    Raises:
      ValueError: an unknown ``name``.
    """
    return _refs()[_check_name(name)]


def _flatten(model: Model, names: tuple) -> Callable[[Any], dict]:
    parsed = []
    for n in names:
        m = _NAME.match(n)
        parsed.append(
            (n, m["base"], None if m["index"] is None else int(m["index"]) - 1)
        )

    def constrain(x):
        c = model.constrain(x)
        return {n: c[base] if i is None else c[base][i] for n, base, i in parsed}

    return constrain


def load(name: str) -> Posterior:
    """The posterior ``name``: log density, ``d``, ``constrain`` and reference moments.

    Args:
      name: one of :data:`NAMES`.

    Returns:
      The :class:`Posterior`.

    Raises:
      ValueError: an unknown ``name``.

    >>> post = load("kidiq-kidscore_momiq")
    >>> post.d, post.names
    (3, ('beta[1]', 'beta[2]', 'sigma'))
    """
    model = BUILDERS[_check_name(name)](load_data(name))
    ref = reference(name)
    names = tuple(ref["names"])
    constrain = _flatten(model, names)
    stat = lambda key: np.array([ref["params"][n][key] for n in names], np.float64)  # noqa: E731
    return Posterior(
        name=name,
        logdensity_fn=model.logdensity,
        d=model.d,
        constrain=constrain,
        constrain_array=lambda x: jnp.stack([v for v in constrain(x).values()]),
        names=names,
        unconstrained_names=model.unconstrained_names,
        ref_mean=stat("mean"),
        ref_sd=stat("sd"),
        ref_ess=stat("ess_bulk"),
    )
