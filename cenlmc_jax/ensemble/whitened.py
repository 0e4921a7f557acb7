"""``cj.whitened``: samplers in whitened coordinates ``y = L⁻¹(x − m)``.

``M = L Lᵀ`` is fixed.

A badly scaled posterior (condition number κ of its covariance) makes every
Langevin sampler with an isotropic step slow: the step is set by the stiffest
direction, ``h ≈ 2 bias / L_max``
(:func:`cenlmc_jax.adaptation.step_size.langevin_step_size`), and the widest
direction then needs ``~κ/bias`` steps to relax. For LMC the cure is a
preconditioner (``cj.lmc(..., inverse_mass_matrix=M)``). For the ensemble samplers
(EnLMC, CEnLMC) the same thing is done by running the *whole* step in whitened
coordinates: :func:`whitened` builds the sampler on::

    π_y(y) ∝ π(m + L y),      f_y(y) = f(m + L y),
    ∇f_y(y) = Lᵀ ∇f(x),       ∇²f_y = Lᵀ ∇²f L,

so the η-ball, R1, R2, the ``w_j``, ``log p_j``, the neighbour counts and the
gradient audit all live in ``y``, where the target is roughly isotropic (exactly
``N(0, I)`` for a Gaussian whitened by its own mean and covariance). ``L`` is the
symmetric root ``M^{1/2}`` (``sqrt`` of a scalar or a diagonal), so
``cj.whitened(cj.lmc, ...)`` is the same chain as
``cj.lmc(..., inverse_mass_matrix=M)`` (same key, same draws, up to rounding).
The log density is not changed (``log |det L|`` is a constant and is left out),
so ``f_star`` and ``m_f`` are the same numbers in both coordinates; the radii
``eta, r1, r2`` and the step size are in ``y``-units. A user's ``grad_fn`` (of
``x``) is mapped to ``y ↦ Lᵀ grad_fn(m + L y)``. The state keeps the inner
sampler's state (in ``y``) and the positions mapped back, ``x = m + L y``
(:class:`WhitenedState`), so ``cj.sample`` traces, streams and checks ``x``.

Why the ensemble estimate stays unbiased given the past (``M``, ``m`` fixed). In
``y`` the sampler is CEnLMC (or EnLMC) on ``π_y``, unchanged: particle j's last
update was ``y_j = w_j + sqrt(2h) ξ_j`` with ``w_j = y_j^{prev} − h F_j^{prev}`` a
function of the past, so given the past ``y_j ~ N(w_j, 2h I)`` exactly, the
density ``p_j`` the weights divide by. The tests of (3.21) read ``|y_i − w_i|``,
``f_y(y_i) = f(x_i)``, ``|w_j − w_i|`` and the previous step's ball count:
functions of ``y_i`` and the past. The paper's argument (docs/algorithms.md §2)
then gives, for each selected pair::

    E[F_ij | past, y_i]
        = α_d ∫_{|z − y_i| ≤ η} (f_y(z) − f_y(y_i)) (z − y_i) / |z − y_i|² dz
        = ∇f_y(y_i) + O(L_y η d),

exactly ``∇f_y(y_i)`` for a quadratic ``f`` (the Hessian term is odd in
``z − y_i``). Mapped back, the move ``x' = x − h L F^y + sqrt(2h) L ξ`` has
``E[L F^y_i | past] = L Lᵀ ∇f(x_i) = M ∇f(x_i)``: it is preconditioned LMC,
``x' = x + h M ∇log π(x) + sqrt(2h) M^{1/2} ξ``, with a drift error of mean zero
given the past, and ``L_y = λ_max(Lᵀ ∇²f L)``, about 1 after a good warm-up, in
place of ``λ_max(∇²f)``. ``tests/ensemble/test_whitened.py`` measures the error
``e = F^y − ∇f_y`` of a whitened run: ``E[e] = 0`` and ``E[e yᵀ] = 0`` within
their MCSE.

What changes if ``M`` is refreshed from the ensemble during the run (``L_m`` from
the particles at step ``m``, as ensemble Kalman samplers and ALDI do). (1)
``y_j = L_m⁻¹(x_j − m_m)`` then depends on the current draws, ``x_j`` and ``x_i``
among them, so ``y_j`` given the past is no longer ``N(w_j, 2h I)``: the weights
``1/p_j`` divide by the wrong density and the pair estimate loses its
unbiasedness (the same selection effect that makes the guard read the
*previous* ball count). (2) Even with ``L_m`` a function of the past only (the
previous step's ensemble), ``x_j`` was drawn with ``L_{m−1}``, so in the new
coordinates it is ``N(., 2h L_m⁻¹ L_{m−1} L_{m−1}ᵀ L_m⁻ᵀ)``, not isotropic, and
``log p_j`` is wrong unless ``L_m = L_{m−1}``. (3) A state-dependent ``M(x)``
needs the divergence term ``Γ = Σ_j ∂_j M_ij`` of the complete recipe to keep π
invariant; an ensemble-dependent one needs ALDI's correction
``(d + 1)/N (x − m)``. None of this is done here: ``M`` and ``m`` are frozen
after the warm-up (:func:`cenlmc_jax.langevin_warmup`), which is what keeps the
estimate unbiased and π the target.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from cenlmc_jax._validation import (
    check_callable,
    check_key,
    check_positions,
    is_concrete,
)
from cenlmc_jax.base import SamplingAlgorithm
from cenlmc_jax.ensemble.lmc import check_inverse_mass_matrix, mass_root
from cenlmc_jax.types import Array, LogDensityFn

__all__ = ["Whitening", "WhitenedState", "whitening", "whitened"]


class Whitening(NamedTuple):
    """The affine map ``x = m + L y`` with ``M = L Lᵀ`` (``L = M^{1/2}``, symmetric).

    As float64 NumPy.

    Attributes:
      inverse_mass_matrix: ``M`` as given (a scalar, ``(d,)`` or ``(d, d)``).
      mean: ``m``: ``(d,)``, or the scalar 0 when none was given.
      factor: ``L`` in ``M``'s form.
      inverse_factor: ``L⁻¹`` in the same form.
    """

    inverse_mass_matrix: Any
    mean: np.ndarray
    factor: np.ndarray
    inverse_factor: np.ndarray

    def to_x(self, y: Array) -> Array:
        """``m + L y`` for ``y: (..., d)``, in ``y``'s dtype.

        Args:
          y: whitened positions, ``(..., d)``.

        Returns:
          ``x``, the same shape.
        """
        return jnp.asarray(self.mean, y.dtype) + _times(
            jnp.asarray(self.factor, y.dtype), y
        )

    def to_y(self, x: Array) -> Array:
        """``L⁻¹ (x − m)`` for ``x: (..., d)``, in ``x``'s dtype.

        Args:
          x: positions, ``(..., d)``.

        Returns:
          ``y``, the same shape.
        """
        return _times(
            jnp.asarray(self.inverse_factor, x.dtype),
            x - jnp.asarray(self.mean, x.dtype),
        )

    def grad_to_y(self, g: Array) -> Array:
        """``Lᵀ g`` (``= L g``, ``L`` symmetric): a gradient in ``x`` as one in ``y``.

        Args:
          g: a gradient in ``x``, ``(..., d)``.

        Returns:
          The gradient in ``y``, the same shape.
        """
        return _times(jnp.asarray(self.factor, g.dtype), g)

    def check_dim(self, d: int) -> None:
        """Checks that ``M`` and ``m`` fit positions of dimension ``d``.

        Args:
          d: the dimension.

        Raises:
          ValueError: naming ``inverse_mass_matrix`` or ``mean``.
        """
        check_inverse_mass_matrix(self.inverse_mass_matrix, d)
        if self.mean.ndim and self.mean.shape != (d,):
            raise ValueError(
                f"mean must have shape ({d},) for positions of dimension {d}; got "
                f"{self.mean.shape}."
            )


def _times(m: Array, v: Array) -> Array:
    """``m v`` along the last axis of ``v``: a scalar, a diagonal or a dense ``m``.

    A dense ``m`` is symmetric.
    """
    return v @ m.T if m.ndim == 2 else v * m


def whitening(inverse_mass_matrix: Any, mean: Any = None) -> Whitening:
    """The map ``x = m + L y`` for a constant SPD ``inverse_mass_matrix`` ``M``.

    Checked in Python; ``M`` may not be traced.

    Args:
      inverse_mass_matrix: ``M``, a scalar, a ``(d,)`` diagonal or a ``(d, d)``
        SPD matrix.
      mean: ``m: (d,)`` (default 0).

    Returns:
      The :class:`Whitening`.

    Raises:
      ValueError: naming ``inverse_mass_matrix`` or ``mean``: None, traced, not
        SPD, a mean not finite or not ``(d,)``, or of another dimension.
    """
    if inverse_mass_matrix is None or not is_concrete(inverse_mass_matrix):
        raise ValueError(
            "inverse_mass_matrix must be a concrete scalar, (d,) diagonal or (d, d) "
            "SPD matrix for cj.whitened; got "
            f"{'None' if inverse_mass_matrix is None else 'a tracer'}."
        )
    check_inverse_mass_matrix(inverse_mass_matrix)
    root = np.asarray(mass_root(inverse_mass_matrix), np.float64)
    if root.ndim == 2:
        w, v = np.linalg.eigh(np.asarray(inverse_mass_matrix, np.float64))
        inverse = (v / np.sqrt(w)) @ v.T
    else:
        inverse = 1.0 / root
    if mean is None:
        m = np.zeros(())
    else:
        if not is_concrete(mean):
            raise ValueError(
                "mean must be a concrete (d,) array for cj.whitened; got a tracer."
            )
        m = np.asarray(mean, np.float64)
        if m.ndim != 1 or not np.all(np.isfinite(m)):
            raise ValueError(
                "mean must be a finite (d,) array (the centre m of y = L⁻¹(x − m)); "
                f"got shape {m.shape}"
                f"{'' if m.ndim != 1 else ' with non-finite entries'}."
            )
        if root.ndim and root.shape[0] != m.shape[0]:
            raise ValueError(
                f"mean has shape {m.shape} but inverse_mass_matrix is for d = "
                f"{root.shape[0]}."
            )
    return Whitening(inverse_mass_matrix, m, root, inverse)


class WhitenedState(NamedTuple):
    """State of a :func:`whitened` sampler.

    Attributes:
      position: the positions in the original coordinates, ``x = m + L y`` (what
        ``cj.sample`` records).
      logdensity: the inner state's ``logdensity`` (the same values in both
        coordinates), or None.
      inner: the wrapped sampler's own state, in ``y``
        (``inner.position = L⁻¹(x − m)``; ``inner.w``, ...).
    """

    position: Array
    logdensity: Array | None
    inner: Any


def _wrap_state(w: Whitening, inner: Any) -> WhitenedState:
    return WhitenedState(
        w.to_x(inner.position), getattr(inner, "logdensity", None), inner
    )


class WhitenedLogdensity:
    """``y ↦ logdensity_fn(m + L y)`` (the constant ``log |det L|`` left out).

    Equal for the same pair.
    """

    def __init__(self, logdensity_fn: LogDensityFn, w: Whitening):
        self.base, self.w = logdensity_fn, w

    def __call__(self, y: Array) -> Array:
        return self.base(self.w.to_x(y))

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, WhitenedLogdensity)
            and other.base == self.base
            and other.w is self.w
        )

    def __hash__(self) -> int:
        return hash((self.base, id(self.w)))


class WhitenedGrad:
    """``y ↦ Lᵀ grad_fn(m + L y)``, keeping what ``grad_fn`` says of cost and values.

    A value of the whitened density at ``y`` is the value of the original one at
    ``x = m + L y``, so a finite-difference ``grad_fn`` still reuses it
    (:func:`cenlmc_jax.gradients.ensemble.shares_values`).
    """

    def __init__(self, grad_fn: Callable, w: Whitening):
        self.grad_fn, self.w = grad_fn, w
        for cost in ("model_solves", "model_solves_given_value"):
            if hasattr(grad_fn, cost):
                setattr(self, cost, getattr(grad_fn, cost))
        inner = getattr(grad_fn, "logdensity_fn", None)
        if inner is not None and hasattr(grad_fn, "grad_given_value"):
            self.logdensity_fn = WhitenedLogdensity(inner, w)
        if hasattr(grad_fn, "values_and_grads"):  # CEnLMC's lookahead asks by hasattr
            self.values_and_grads = self._values_and_grads

    def _to_y(self, g: Array, y: Array) -> Array:
        return self.w.grad_to_y(jnp.asarray(g, y.dtype))

    def __call__(self, y: Array) -> Array:
        return self._to_y(self.grad_fn(self.w.to_x(y)), y)

    def grad_given_value(self, y: Array, value: Array) -> Array:
        return self._to_y(self.grad_fn.grad_given_value(self.w.to_x(y), value), y)

    def value_and_grad(self, y: Array) -> tuple[Array, Array]:
        value, g = self.grad_fn.value_and_grad(self.w.to_x(y))
        return value, self._to_y(g, y)

    def _values_and_grads(self, y: Array, rows: Array) -> tuple[Array, Array]:
        values, g = self.grad_fn.values_and_grads(jax.vmap(self.w.to_x)(y), rows)
        return values, jax.vmap(self._to_y)(g, y[rows])


def whiten_logdensity(logdensity_fn: LogDensityFn, w: Whitening) -> LogDensityFn:
    """``y ↦ logdensity_fn(m + L y)`` (the constant ``log |det L|`` left out)."""
    return WhitenedLogdensity(logdensity_fn, w)


def whiten_grad_fn(grad_fn: Callable | None, w: Whitening) -> Callable | None:
    """``y ↦ Lᵀ grad_fn(m + L y)``, or None."""
    if grad_fn is None:
        return None
    check_callable(grad_fn, "grad_fn", "x: (d,) -> gradient of the log density (d,)")
    return WhitenedGrad(grad_fn, w)


def _whiten_kwargs(kwargs: dict, w: Whitening) -> dict:
    """The inner sampler's keywords with a user's ``grad_fn`` mapped to ``y``.

    A ``grad_fn`` keyword or ``options.grad_fn``.
    """
    kwargs = dict(kwargs)
    if kwargs.get("grad_fn") is not None:
        kwargs["grad_fn"] = whiten_grad_fn(kwargs["grad_fn"], w)
    options = kwargs.get("options")
    if options is not None and getattr(options, "grad_fn", None) is not None:
        kwargs["options"] = options._replace(grad_fn=whiten_grad_fn(options.grad_fn, w))
    return kwargs


def whitened(
    sampler: Callable[..., SamplingAlgorithm],
    logdensity_fn: LogDensityFn,
    *args: Any,
    inverse_mass_matrix: Any,
    mean: Any = None,
    **kwargs: Any,
) -> SamplingAlgorithm:
    """``sampler(logdensity_fn, *args, **kwargs)`` run in whitened coordinates.

    ``y = L⁻¹(x − m)``, ``M = L Lᵀ``. ``init(positions, rng_key=None)`` takes
    positions in ``x`` (``(N, d)``) and returns a :class:`WhitenedState`;
    ``step(rng_key, state)`` steps the inner sampler in ``y`` and maps the
    positions back, so ``cj.sample``'s trace, moments and checks are in ``x``. The
    infos are the inner sampler's (its audit, ensemble fraction, ... in ``y``).

    Args:
      sampler: a constructor taking the log density first (``cj.cenlmc``,
        ``cj.enlmc``, ``cj.lmc``; ``cj.lmc`` is better given
        ``inverse_mass_matrix`` directly, the same chain).
      logdensity_fn: ``x: (d,) -> log π(x) + const``.
      *args: the sampler's parameters, in ``y``-units (``step_size``, ``eta``,
        ``r1``, ``r2``; ``f_star`` and ``m_f`` are the same in both).
      inverse_mass_matrix: ``M``, a constant SPD scalar, ``(d,)`` or ``(d, d)``;
        fixed for the run (module docstring: why refreshing it from the ensemble
        is not done).
      mean: ``m: (d,)`` (default 0: only the origin of ``y`` moves, not the
        dynamics); fixed for the run.
      **kwargs: the sampler's keyword parameters, in ``y``-units. A ``grad_fn`` of
        ``x`` (keyword or ``options.grad_fn``) is mapped to
        ``Lᵀ grad_fn(m + L y)``.

    Returns:
      A :class:`~cenlmc_jax.base.SamplingAlgorithm` ``(init, step)`` whose states
      are :class:`WhitenedState`.

    Raises:
      ValueError: ``sampler`` or ``logdensity_fn`` not callable, a bad ``M`` or
        ``m`` (:func:`whitening`), or the inner sampler's own checks.
    """
    check_callable(
        sampler,
        "sampler",
        "a sampler constructor (logdensity_fn, ...) -> SamplingAlgorithm",
    )
    check_callable(logdensity_fn, "logdensity_fn", "x -> scalar log density")
    w = whitening(inverse_mass_matrix, mean)
    inner = sampler(
        whiten_logdensity(logdensity_fn, w), *args, **_whiten_kwargs(kwargs, w)
    )

    def init(positions, rng_key=None):
        if rng_key is not None:
            check_key(rng_key)
        x = check_positions(positions)
        w.check_dim(x.shape[-1])
        state = (
            inner.init(w.to_y(x)) if rng_key is None else inner.init(w.to_y(x), rng_key)
        )
        return _wrap_state(w, state)

    def step(rng_key, state):
        if not isinstance(state, WhitenedState):
            raise ValueError(
                "state must be the WhitenedState of this sampler's init; got "
                f"{type(state).__name__}."
            )
        new, info = inner.step(rng_key, state.inner)
        return _wrap_state(w, new), info

    return SamplingAlgorithm(init, step)
