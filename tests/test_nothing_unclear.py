"""Issue 47 ("Nothing lost, nothing unclear"): the samplers' defects, each with the
test that failed before its fix.

* a log density that raises (a Python exception inside the model) came back as a
  ``ValueError`` wrapping it, the model's own exception type lost ->
  test_a_raising_model_keeps_its_exception_type
* ``mesh=`` with ``method="dense"`` was accepted by ``cj.cenlmc`` / ``cj.enlmc`` and
  ``init``, and refused only when ``cj.sample`` traced the first step ->
  test_a_mesh_with_the_dense_method_is_refused_at_construction
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

import cenlmc_jax as cj


class ModelError(Exception):
    """A user's own exception class, raised inside a model."""


def raises_model_error(x):
    raise ModelError("the model's own failure")


def divides_by_zero(x):
    return -0.5 * jnp.sum(x**2) + 1 / 0


class NeedsTwoArguments(Exception):
    """An exception whose class cannot be rebuilt from one message."""

    def __init__(self, code, detail):
        super().__init__(f"{code}: {detail}")


def raises_unrebuildable(x):
    raise NeedsTwoArguments(7, "detail")


@pytest.mark.parametrize(
    ("fn", "exc_type", "text"),
    [
        (raises_model_error, ModelError, "the model's own failure"),
        (divides_by_zero, ZeroDivisionError, "division by zero"),
        (raises_unrebuildable, NeedsTwoArguments, "7: detail"),
    ],
)
@pytest.mark.parametrize("entry", ["lmc", "mala", "vmap_chains"])
def test_a_raising_model_keeps_its_exception_type(fn, exc_type, text, entry):
    build = {
        "lmc": lambda: cj.lmc(fn, 0.1).init(jnp.zeros((8, 2))),
        "mala": lambda: cj.mala(fn, 0.1).init(jnp.zeros(2)),
        "vmap_chains": lambda: cj.vmap_chains(cj.mala(fn, 0.1)).init(
            jnp.zeros((3, 2)), jax.random.key(0)
        ),
    }[entry]
    with pytest.raises(exc_type, match=text) as info:
        build()
    # the model is named, and its exception is kept (chained, or itself with a note)
    shown = str(info.value) + "".join(getattr(info.value, "__notes__", []))
    assert "logdensity_fn" in shown, shown
    assert info.value.__cause__ is not None or exc_type is NeedsTwoArguments


def gaussian(x):
    return -0.5 * jnp.sum(x**2)


@pytest.mark.parametrize(
    "build",
    [
        lambda **kw: cj.cenlmc(
            gaussian, 0.05, 0.4, 0.5, 0.4, 5, 10.0, f_star=0.0, **kw
        ),
        lambda **kw: cj.enlmc(gaussian, 0.05, 0.4, **kw),
    ],
    ids=["cenlmc", "enlmc"],
)
def test_a_mesh_with_the_dense_method_is_refused_at_construction(build):
    mesh = cj.pairwise.make_mesh(1)  # one device is enough: the refusal is static
    with pytest.raises(ValueError, match=r"mesh=.*method='dense'") as info:
        build(mesh=mesh, method="dense")
    assert "'auto', 'tiled' or 'pallas'" in str(info.value)
    # the same options are fine without the mesh, or with a method that shards
    build(method="dense")
    build(mesh=mesh, method="tiled")
