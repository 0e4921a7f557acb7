"""Gradient estimators for the stochastic-gradient samplers (docs/algorithms.md §6).

A gradient estimator is a pure function::

    grad_estimator(rng_key, theta) -> ∇Ũ(theta)        theta: (d,) -> (d,)

returning an (unbiased) estimate of the gradient of the **log density**
``∇log π`` (the sign BlackJAX uses; the potential ``U = -log π`` appears
only where a formula needs it, as ``potential_fn``).
Everything here is jittable and vmaps over chains; the minibatch is drawn
inside the step from the key, so the data stay on the device and nothing
returns to Python between steps.

- :func:`grad_estimator_from_grad`: a deterministic ``grad_fn(θ) = ∇log π(θ)``.
- :func:`grad_estimator_from_logdensity`: ``∇ logdensity_fn`` (full gradient).
- :func:`noisy_grad_estimator`: ``∇log π + N(0, noise_sd² I)`` (paper 2's
  synthetic experiment).
- :func:`minibatch_grad_estimator`:
  ``g̃(θ) = ∇log prior(θ) + (n/|B|) Σ_{i∈B} ∇log lik(x_i | θ)``; the subset
  ``B`` is drawn with replacement (default, ``O(|B|)``) or without, by Floyd's
  algorithm (``O(|B|²)`` work, independent of ``n``).

Positions may be pytrees (a dict of parameters, as BlackJAX users write them):
:func:`ravel_position` flattens one to a ``(d,)`` vector with
``jax.flatten_util.ravel_pytree`` at the samplers' boundary, and
:func:`flat_logdensity` / :func:`flat_grad_estimator` wrap the user's
functions to act on that vector. The single-chain samplers
(``irreversible``, ``sgmcmc``) use them; everything inside a step is flat.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

import cenlmc_jax.gradients.modes as grad_modes
from cenlmc_jax._validation import (
    check_bool,
    check_callable,
    check_int,
    check_output,
    check_position,
    check_positive,
)
from cenlmc_jax.gradients.modes import check_grad_mode
from cenlmc_jax.types import Array, GradEstimator, PyTree

__all__ = [
    "grad_estimator_from_grad",
    "grad_estimator_from_logdensity",
    "noisy_grad_estimator",
    "minibatch_grad_estimator",
    "floyd_subset",
    "ravel_position",
    "flat_logdensity",
    "flat_grad_estimator",
]

Unravel = Callable[[Array], PyTree] | None


# ------------------------------------------------------------------ pytree positions


def ravel_position(
    position: Any, name: str = "position", *, check: bool = True
) -> tuple[Array, Unravel]:
    """A single-chain position as a flat ``(d,)`` vector, and how to rebuild it.

    A bare array must have shape ``(d,)``: it is returned as it is, with
    ``unravel = None`` (nothing is wrapped, nothing costs). A pytree (a dict,
    tuple, list or NamedTuple of floating arrays of any shapes) is flattened by
    ``jax.flatten_util.ravel_pytree``: ``d`` is its total size, in the order of
    ``jax.tree_util.tree_leaves``, and ``unravel(flat) -> pytree``.

    Args:
      position: an array ``(d,)``, a list of numbers, or a pytree of floating
        arrays.
      name: its name, for error messages.
      check: run the position checks (floating, finite) on every leaf whose value
        is known; they run eagerly even inside ``jit`` on closed-over concrete
        arrays (``jax.ensure_compile_time_eval``), so a sampler can be initialised
        inside a jitted function.

    Returns:
      ``(flat, unravel)``: the ``(d,)`` vector and ``unravel`` (None for a bare
      array).

    Raises:
      ValueError: a bare array not of shape ``(d,)``, or (with ``check``) a leaf
        that is not floating or not finite.
    """
    plain_list = (
        isinstance(position, (list, tuple))
        and not hasattr(position, "_fields")
        and all(isinstance(v, (int, float, np.generic)) for v in position)
    )  # [0.0, 1.0]: a vector, as before
    if (
        plain_list
        or isinstance(position, (jax.Array, np.ndarray, np.generic, float, int))
        or not jax.tree_util.tree_leaves(position)
    ):
        if check:
            with jax.ensure_compile_time_eval():
                position = check_position(position, name, ndim=1)
        elif (
            np.ndim(position) != 1
        ):  # static, so free inside a step: a batch of chains is not one chain
            raise ValueError(
                f"{name} must have shape (d,) (one chain; cj.vmap_chains for many); "
                f"got shape {tuple(np.shape(position))}."
            )
        return jnp.asarray(position), None
    if check:
        with jax.ensure_compile_time_eval():
            position = jax.tree_util.tree_map_with_path(
                lambda path, leaf: check_position(
                    leaf, name + jax.tree_util.keystr(path)
                ),
                position,
            )
    flat, unravel = ravel_pytree(position)
    return flat, unravel


def flat_logdensity(
    logdensity_fn: Callable, unravel: Unravel
) -> Callable[[Array], Array]:
    """``x: (d,) -> logdensity_fn(unravel(x))``.

    Args:
      logdensity_fn: the user's log density of a (pytree) position.
      unravel: from :func:`ravel_position`, or None.

    Returns:
      The log density of the flat vector; ``logdensity_fn`` itself when
      ``unravel`` is None.
    """
    if unravel is None:
        return logdensity_fn
    return lambda x: logdensity_fn(unravel(x))


GRAD_ESTIMATOR_WHAT = (
    "(rng_key, position) -> estimate of the gradient of the log density, shaped like "
    "position"
)


def flat_grad_estimator(
    grad_estimator: Callable, unravel: Unravel, name: str = "grad_estimator"
) -> GradEstimator:
    """The estimator on the flat vector.

    ``(key, x: (d,)) -> ravel(grad_estimator(key, unravel(x)))``.

    Its output must be shaped like the position, leaf by leaf (checked on static
    shapes when traced: free; a scalar or a ``(1,)`` would otherwise be broadcast
    into the drift).

    Args:
      grad_estimator: the user's ``(rng_key, position) -> gradient``.
      unravel: from :func:`ravel_position`, or None.
      name: its name, for error messages.

    Returns:
      ``(rng_key, x: (d,)) -> (d,)``.
    """

    def flat(rng_key, x):
        position = x if unravel is None else unravel(x)
        g = grad_estimator(rng_key, position)
        check_output(g, name, what=GRAD_ESTIMATOR_WHAT, like=position)
        return g if unravel is None else ravel_pytree(g)[0]

    return flat


def _cast_like(g: PyTree, theta: PyTree) -> PyTree:
    """``g`` leaf by leaf in the dtypes of ``theta``.

    ``theta`` is a pytree position (a dict of parameters works); a ``g`` of another
    structure is returned as it is, for the samplers' output check to name.
    """
    if jax.tree_util.tree_structure(g) != jax.tree_util.tree_structure(theta):
        return g
    return jax.tree_util.tree_map(
        lambda t, x: jnp.asarray(x, jnp.result_type(t)), theta, g
    )


def grad_estimator_from_grad(grad_fn: Callable[[Array], Array]) -> GradEstimator:
    """Adapter: a deterministic ``grad_fn(θ) = ∇log π(θ)`` as an estimator.

    Args:
      grad_fn: ``θ -> ∇log π(θ)``, shaped like ``θ``.

    Returns:
      ``grad_estimator(rng_key, θ) -> grad_fn(θ)`` (the key is ignored), in the
      dtypes of ``θ``.

    Raises:
      ValueError: ``grad_fn`` is not callable.
    """
    check_callable(grad_fn, "grad_fn", "theta -> gradient of the log density at theta")

    def grad_estimator(rng_key, theta):
        del rng_key  # exact gradient: no randomness
        return _cast_like(grad_fn(theta), theta)

    return grad_estimator


def grad_estimator_from_logdensity(
    logdensity_fn: Callable[[Array], Array], *, grad_mode: str = "auto"
) -> GradEstimator:
    """The full gradient of ``logdensity_fn``: ``(key, θ) -> ∇ logdensity_fn(θ)``.

    Args:
      logdensity_fn: ``θ -> log π(θ)`` (scalar); ``θ`` may be a pytree.
      grad_mode: ``"auto"`` (default), ``"reverse"`` (``jax.grad``) or
        ``"forward"`` (d ``jvp`` calls): :func:`cenlmc_jax.gradients.modes.grad`;
        auto is forward for ``d <= FORWARD_MAX_D`` (the crossover of
        benchmarks/results/grad_mode.md). The same gradient up to rounding.

    Returns:
      ``grad_estimator(rng_key, θ)`` (the key is ignored), shaped like ``θ``.

    Raises:
      ValueError: ``logdensity_fn`` is not callable, or an unknown ``grad_mode``.
    """
    check_callable(logdensity_fn, "logdensity_fn", "theta -> scalar log density")
    check_grad_mode(grad_mode)
    grad = grad_modes.grad(logdensity_fn, grad_mode)

    def grad_estimator(rng_key, theta):
        del rng_key
        return _cast_like(grad(theta), theta)

    return grad_estimator


def noisy_grad_estimator(
    grad_fn: Callable[[Array], Array], noise_sd: float
) -> GradEstimator:
    """``g̃(θ) = grad_fn(θ) + noise_sd · ν``, ``ν ~ N(0, I_d)`` drawn in ``θ.dtype``.

    The stochastic gradient of paper 2's synthetic experiment (true gradient
    plus Gaussian noise): unbiased, ``Cov = noise_sd² I``, so the matching
    ``B̂`` of SGRHMC is ``noise_sd² · G^{-1}(θ)`` for a diagonal metric.

    Args:
      grad_fn: ``θ -> ∇log π(θ)``, shaped like ``θ``.
      noise_sd: the noise's standard deviation, ``>= 0``.

    Returns:
      ``grad_estimator(rng_key, θ)``, shaped like ``θ`` (one draw for all leaves
      of a pytree).

    Raises:
      ValueError: ``grad_fn`` is not callable, or ``noise_sd`` is negative or not
        finite.
    """
    check_callable(grad_fn, "grad_fn", "theta -> gradient of the log density at theta")
    check_positive(noise_sd, "noise_sd", allow_zero=True)

    def grad_estimator(rng_key, theta):
        g, unravel = ravel_pytree(
            _cast_like(grad_fn(theta), theta)
        )  # a pytree position: one draw for all leaves
        noise = jnp.asarray(noise_sd, g.dtype) * jax.random.normal(
            rng_key, g.shape, dtype=g.dtype
        )
        return unravel(g + noise)

    return grad_estimator


def _num_data(data: PyTree) -> int:
    leaves = jax.tree_util.tree_leaves(data)
    if not leaves:
        raise ValueError(
            "data must be an array or a pytree of arrays with a leading axis n; got no "
            "arrays."
        )
    sizes = {np.shape(leaf)[0] if np.ndim(leaf) > 0 else None for leaf in leaves}
    if None in sizes or len(sizes) != 1:
        shapes = [tuple(np.shape(leaf)) for leaf in leaves]
        raise ValueError(
            "every array in data must share the leading axis n (one row per data "
            f"point); got shapes {shapes}."
        )
    return sizes.pop()


def floyd_subset(rng_key: Array, n: int, size: int) -> Array:
    """A uniformly random ``size``-subset of ``{0, ..., n-1}`` (without replacement).

    Floyd's algorithm: for ``j = n - size, ..., n - 1`` draw ``t ~ U{0, ..., j}``
    and add ``t``, or ``j`` if ``t`` is already in the set. Every subset has
    probability ``1 / C(n, size)`` (Bentley & Floyd, CACM 1987). Work is
    ``O(size²)`` comparisons in ``size`` rounds and does not depend on ``n``;
    ``jax.random.choice(..., replace=False)`` permutes all ``n`` (a sort per
    draw). The order of the indices is not uniform; a sum over them does not care.

    Args:
      rng_key: the key of the draw.
      n: the population size (static).
      size: the subset size, in ``[1, n]`` (static).

    Returns:
      The indices, a ``(size,)`` int32 array; ``size == n`` returns ``arange(n)``.
    """
    if size == n:
        return jnp.arange(n, dtype=jnp.int32)
    js = jnp.arange(n - size, n, dtype=jnp.int32)
    draws = jax.random.randint(
        rng_key, (size,), 0, js + 1, dtype=jnp.int32
    )  # t_i ~ U{0, ..., j_i}

    def add(i, chosen):
        t = draws[i]
        pick = jnp.where(
            jnp.any(chosen == t), js[i], t
        )  # j itself is never in the set yet
        return chosen.at[i].set(pick)

    return jax.lax.fori_loop(0, size, add, jnp.full((size,), -1, jnp.int32))


def minibatch_grad_estimator(
    logprior_fn: Callable[[Array], Array],
    loglik_fn: Callable[..., Array],
    data: PyTree,
    batch_size: int,
    *,
    replace: bool = True,
) -> GradEstimator:
    """Minibatch estimate of the gradient of the log posterior.

    For ``log π(θ) = log p(θ) + Σ_{i=1}^n log p(x_i | θ)`` the estimate
    (docs/algorithms.md §6) is::

        g̃(θ) = ∇log p(θ) + (n / |B|) Σ_{i∈B} ∇_θ log p(x_i | θ)

    Args:
      logprior_fn: ``θ -> log p(θ)`` (scalar).
      loglik_fn: ``(θ, *data_point) -> log p(x_i | θ)`` (scalar) for one data
        point; if ``data`` is a tuple or list its entries are passed as
        separate arguments (``loglik_fn(θ, x_i, y_i)`` for ``data = (x, y)``),
        otherwise the one point is passed as one argument.
      data: an array or a pytree of arrays sharing the leading axis ``n``;
        moved to the device once, here.
      batch_size: ``|B|``, a static integer in ``[1, n]``.
      replace: ``True`` (default): ``|B|`` independent uniform indices,
        ``O(|B|)`` work, unbiased. ``False``: ``B`` is a uniformly random
        subset, drawn by Floyd's algorithm (:func:`floyd_subset`: ``O(|B|²)``
        comparisons in ``|B|`` sequential rounds, independent of ``n``; no sort
        of ``n``). With replacement is the default because it is the fast one:
        Floyd's draw makes an estimator call slower, the more so the larger
        ``|B|`` (``benchmarks/results/peers.md``), while the variance it saves is
        the finite-population factor ``1 - |B|/n`` (Var is ``n² S₀²/|B|`` with
        replacement, ``n² (1 - |B|/n) S²/|B|`` without; ``S₀², S²`` the ddof-0 /
        ddof-1 variances of the per-point gradients): nothing at the usual
        ``|B| ≪ n``. Take ``False`` when ``|B|`` is a good fraction of ``n``, or
        ``|B| = n`` for the exact full gradient.

    Returns:
      ``grad_estimator(rng_key, θ) -> (d,)`` (a pytree like ``θ`` if ``θ`` is
      one), unbiased for ``∇log π(θ)``: each index is in ``B`` with probability
      ``|B|/n`` (expected count ``|B|/n`` with replacement). With
      ``batch_size = n`` and ``replace=False`` it is the exact full gradient.

    Raises:
      ValueError: a function not callable, ``data`` without a shared leading
        axis, or ``batch_size`` not in ``[1, n]``.
    """
    check_callable(logprior_fn, "logprior_fn", "theta -> scalar log prior")
    check_callable(
        loglik_fn, "loglik_fn", "(theta, *data_point) -> scalar log likelihood"
    )
    check_bool(replace, "replace")
    n = _num_data(data)
    batch_size = check_int(batch_size, "batch_size", minimum=1, maximum=n)
    data = jax.tree_util.tree_map(jnp.asarray, data)  # one transfer to the device
    unpack = isinstance(data, (tuple, list))

    def one_loglik(theta, point):
        return loglik_fn(theta, *point) if unpack else loglik_fn(theta, point)

    def minibatch_logdensity(theta, batch):
        """``log p(θ) + (n/|B|) Σ_{i∈B} log p(x_i | θ)``.

        Its gradient is ``g̃`` (one backward pass, no ``(|B|, d)`` array).
        """
        lik = jnp.sum(jax.vmap(one_loglik, in_axes=(None, 0))(theta, batch))
        return logprior_fn(theta) + (n / batch_size) * lik

    grad = jax.grad(minibatch_logdensity)

    def grad_estimator(rng_key, theta):
        if replace:
            idx = jax.random.randint(rng_key, (batch_size,), 0, n, dtype=jnp.int32)
        else:
            idx = floyd_subset(rng_key, n, batch_size)
        batch = jax.tree_util.tree_map(lambda a: jnp.take(a, idx, axis=0), data)
        # leaf by leaf, so that θ may be a pytree (a dict of parameters)
        return jax.tree_util.tree_map(
            lambda t, g: g.astype(t.dtype), theta, grad(theta, batch)
        )

    return grad_estimator
