"""Proposals for the irreversible jump sampler.

docs/algorithms.md §7–8; paper 2, App. C.2 and D.

A proposal is a :class:`~cenlmc_jax.irreversible.jump.Proposal`: a forward density
``f̃(z*|z, s)``, a backward density ``g̃(z|z*, s)`` paired by (docs/algorithms.md §7.1)
``f̃(·|y, -s) = g̃(·|y, s)``, and a sampler of ``f̃``; the step
(:func:`~cenlmc_jax.irreversible.jump.irreversible_mh_step`) uses only the general ratio
(7.2). Shipped:

* :func:`coordinatewise_proposal` — ``(f̃, g̃)`` built per coordinate from a pair
  ``(f_i, g_i)`` (docs/algorithms.md §7; paper 2, App. C.2, Algorithm 1): start from
  ``(f̃, g̃) = (1, 1)`` and multiply by ``(f_i, g_i)`` when ``s_i > 0``, by ``(g_i,
  f_i)`` otherwise, so (7.1) holds by construction.
* :func:`gamma_proposal` — the irreversible Gamma sampler, ``z*_i = z_i + s_i
  Gamma(k, θ)``, one direction per coordinate, ``s ∈ {-1,+1}^d``, built by
  :func:`coordinatewise_proposal`. Here ``f_i`` is a positive Gamma jump and
  ``g_i`` its mirror image, so ``g̃(z|z*, s) = f̃(z*|z, s)`` and the ratio
  reduces to ``π(z*)/π(z)`` — computed through (7.2) all the same.
* :func:`sde_proposal` — one Euler–Maruyama step of the complete recipe
  (docs/algorithms.md §5) with the irreversible part ``Q`` signed by the direction; the
  backward density is the adjoint process (``Q -> -Q``) (docs/algorithms.md §8, eq. 8.1
  at :func:`sde_proposal`; paper 2, App. D: ``π(y) P(z, t+dt|y, t) = π(z) P†(y, t+dt|z,
  t)``, eqs. (23)/(28), hence ``P(z_N|z_0)/P†(z_0|z_N) = π(z_N)/π(z_0)`` along a path,
  eq. (30)). ``Q`` couples coordinates, so the direction is ONE sign ``s`` shared by the
  whole vector, stored as a length-1 vector ``direction: (1,)`` so that every state of
  the sampler has the same fields. With ``Q = 0`` it is MALA (preconditioned by ``D``).
  Everything that depends only on constant ``D`` and ``Q`` (the Cholesky factor of
  ``D``, its inverse and log-determinant) is computed once, when the proposal is built;
  what depends on the point (:class:`SDEPoint`: ``∇log π`` and the drift pieces) is the
  proposal's ``point_fn``, kept in the chain's state.

Positions inside a proposal are flat ``(d,)`` vectors (the step ravels a
pytree position); the matrices ``D``, ``Q`` and their callables see the flat
vector, ``logdensity_fn`` (through ``point_fn``) the user's form.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree
from jax.scipy.linalg import solve_triangular
from jax.scipy.special import gammaln

import cenlmc_jax.gradients.modes as grad_modes
from cenlmc_jax import _linalg as la
from cenlmc_jax._validation import check_callable, check_positive, is_concrete
from cenlmc_jax.gradients.modes import check_grad_mode
from cenlmc_jax.irreversible._common import matrix_value, spd_factor
from cenlmc_jax.irreversible.jump import Proposal
from cenlmc_jax.types import Array, LogDensityFn, PRNGKey

__all__ = [
    "SDEPoint",
    "coordinatewise_proposal",
    "gamma_proposal",
    "sde_proposal",
]


class SDEPoint(NamedTuple):
    """What :func:`sde_proposal` keeps of a point ``z`` (its ``cache``).

    ``None`` where not needed.

    Attributes:
      grad: (d,) ``∇log π(z)``.
      drift_d: (d,) ``D(z)∇log π(z) + Γ_D(z)`` for a callable ``D``; None for a
        constant ``D`` (then ``D∇log π`` is formed from ``grad`` when used: a
        product by a scalar or a diagonal, or one ``O(d²)`` matrix-vector
        product).
      drift_q: (d,) ``Q(z)∇log π(z) + Γ_Q(z)`` for a callable ``Q``; None for a
        constant one.
      root: the factor ``L(z)`` of ``D(z) = L Lᵀ`` (scalar, (d,) or lower (d, d))
        for a callable ``D``; None for a constant ``D`` (its factor is the
        proposal's).
      half_logdet: ``½ log det D(z)`` for a callable ``D``; None otherwise.

    For constant ``D`` and ``Q`` the cache is the gradient alone: it stays
    valid when the matrices or the step size change (warm-up adaptation swaps
    them between steps without recomputing anything).
    """

    grad: Array
    drift_d: Array | None = None
    drift_q: Array | None = None
    root: Array | None = None
    half_logdet: Array | None = None


# ------------------------------------------------------------------------ helpers


def _as(x: Any, dtype) -> Any:
    return None if x is None else jnp.asarray(x, dtype)


def _log_normal(scaled_residual: Array, half_logdet: Array, var_scale: Array) -> Array:
    """log N(x; mean, var_scale · L Lᵀ).

    Given ``y = L⁻¹ (x - mean): (n,)`` and ``½ log det(L Lᵀ)``.
    """
    n = scaled_residual.shape[0]
    return (
        -0.5 * jnp.sum(scaled_residual**2) / var_scale
        - half_logdet
        - 0.5 * n * (jnp.log(var_scale) + math.log(2.0 * math.pi))
    )


# ------------------------------------------------------------ coordinatewise pairs


def coordinatewise_proposal(
    log_f: Callable[[Array, Array], Array],
    log_g: Callable[[Array, Array], Array],
    sample_f: Callable[[PRNGKey, Array], Array] | None = None,
    sample_g: Callable[[PRNGKey, Array], Array] | None = None,
    *,
    sample: Callable[[PRNGKey, Array, Array], Array] | None = None,
) -> Proposal:
    """A proposal built per coordinate from a pair ``(f_i, g_i)``.

    docs/algorithms.md §7; paper 2, App. C.2, Algorithm 1.

    ``log_f(x_new, x_old) -> (d,)`` gives ``log f_i(x_new_i | x_old_i)`` for every
    coordinate (``log_g`` likewise); then

        log f̃(z*|z, s) = Σ_i [s_i > 0] log f_i(z*_i|z_i) + [s_i < 0] log g_i(z*_i|z_i)
        log g̃(z|z*, s) = Σ_i [s_i > 0] log g_i(z_i|z*_i) + [s_i < 0] log f_i(z_i|z*_i)

    which satisfies ``f̃(·|y, -s) = g̃(·|y, s)`` by construction. Sampling: either
    ``sample_f, sample_g`` (``(rng_key, z) -> (d,)`` draws of every ``f_i`` /
    ``g_i``; both are drawn and the coordinate chosen by ``s_i``), or a direct
    ``sample(rng_key, z, s)`` when one draw per coordinate is cheaper (it must
    draw from the ``f̃`` above). No per-point cache (``point_fn = None``).

    Args:
      log_f: ``(x_new, x_old) -> (d,)``, the log densities ``log f_i(x_new_i |
        x_old_i)`` of every coordinate.
      log_g: ``(x_new, x_old) -> (d,)``, the same for ``g_i``.
      sample_f: ``(rng_key, z) -> (d,)``, a draw of every ``f_i(· | z_i)``; with
        ``sample_g``, needed unless ``sample`` is given.
      sample_g: ``(rng_key, z) -> (d,)``, a draw of every ``g_i(· | z_i)``.
      sample: ``(rng_key, z, s) -> (d,)``, a direct draw of ``f̃(·|z, s)``;
        replaces ``sample_f`` and ``sample_g``.

    Returns:
      A :class:`~cenlmc_jax.irreversible.jump.Proposal` with one direction per
      coordinate (``direction_size=None``) and ``grad_evals = 0``.

    Raises:
      ValueError: neither ``sample`` nor both ``sample_f`` and ``sample_g`` given.
    """
    if sample is None:
        if sample_f is None or sample_g is None:
            raise ValueError(
                "coordinatewise_proposal needs sample_f and sample_g, or sample=."
            )

        def sample(rng_key, z, s):
            kf, kg = jax.random.split(rng_key)
            return jnp.where(s > 0, sample_f(kf, z), sample_g(kg, z))

    def log_forward(z_star, z, s):
        return jnp.sum(jnp.where(s > 0, log_f(z_star, z), log_g(z_star, z)))

    def log_backward(z, z_star, s):
        return jnp.sum(jnp.where(s > 0, log_g(z, z_star), log_f(z, z_star)))

    return Proposal(
        sample, log_forward, log_backward, direction_size=None, grad_evals=0
    )


def _gamma_logpdf(x: Array, shape: float, scale: float) -> Array:
    """log Gamma(x; k, θ) = (k-1) log x - x/θ - log Γ(k) - k log θ.

    And -inf for x <= 0.
    """
    k = jnp.asarray(shape, x.dtype)
    theta = jnp.asarray(scale, x.dtype)
    positive = x > 0
    # keeps log and its gradient finite off the support
    safe = jnp.where(positive, x, 1.0)
    logp = (k - 1) * jnp.log(safe) - safe / theta - gammaln(k) - k * jnp.log(theta)
    return jnp.where(positive, logp, -jnp.inf)


_MAX_EXP_SUM = 8  # integer Gamma shapes up to this are drawn as sums of exponentials


def gamma_proposal(shape: float, scale: float) -> Proposal:
    """The irreversible Gamma proposal (docs/algorithms.md §7).

    ``z*_i = z_i + s_i G_i``, ``G_i ~ Gamma(k, θ)``.

    ``shape = k > 0``, ``scale = θ > 0`` (mean jump ``kθ``). Per coordinate
    ``f_i(x'|x) = Gamma(x' - x; k, θ)`` (a forward jump) and its mirror
    ``g_i(x'|x) = Gamma(x - x'; k, θ)``; combined by
    :func:`coordinatewise_proposal`. Then ``log g̃(z|z*, s) = log f̃(z*|z, s)``
    (both evaluate the Gamma density at ``|z* - z|``), so (7.2) reduces to
    ``a = min(1, π(z*)/π(z))``. One direction per coordinate: ``direction: (d,)``.
    Integer shapes ``k <= 8`` draw ``Gamma(k, 1)`` as a sum of ``k`` exponentials
    (same law, fewer operations than ``jax.random.gamma``'s rejection sampler).
    ``scale`` may also be a ``(d,)`` vector of per-coordinate scales (a
    diagonal preconditioner: ``θ_i ∝`` the target's sd of coordinate ``i``),
    and a tracer (built inside ``jit``, e.g. by warm-up adaptation).

    Args:
      shape: the Gamma shape ``k > 0``.
      scale: the Gamma scale ``θ > 0``: a scalar, or a ``(d,)`` vector of finite
        per-coordinate scales; may be a tracer.

    Returns:
      A :class:`~cenlmc_jax.irreversible.jump.Proposal` with ``direction: (d,)``
      and ``grad_evals = 0``.

    Raises:
      ValueError: ``shape`` or ``scale`` not positive, or ``scale`` neither a
        scalar nor a ``(d,)`` vector.
    """
    check_positive(shape, "shape")
    if np.ndim(scale) == 0:
        check_positive(scale, "scale")
    elif np.ndim(scale) != 1:
        raise ValueError(
            f"scale must be a scalar or a (d,) vector; got shape {np.shape(scale)}."
        )
    elif is_concrete(scale):
        v = np.asarray(scale, np.float64)
        if not np.all(np.isfinite(v) & (v > 0)):
            raise ValueError(f"scale must be finite numbers > 0; got {v}.")

    def log_f(x_new, x_old):
        return _gamma_logpdf(x_new - x_old, shape, scale)

    def log_g(x_new, x_old):
        return _gamma_logpdf(x_old - x_new, shape, scale)

    small_int = (
        is_concrete(shape)
        and float(shape).is_integer()
        and 1 <= float(shape) <= _MAX_EXP_SUM
    )

    def sample(rng_key, z, s):
        if small_int:
            # Gamma(k, 1) with integer k is a sum of k Exp(1): exact, and several times
            # cheaper than the rejection sampler of jax.random.gamma under vmap.
            jump = jnp.sum(
                jax.random.exponential(rng_key, (int(shape),) + z.shape, dtype=z.dtype),
                axis=0,
            )
        else:
            jump = jax.random.gamma(
                rng_key, jnp.asarray(shape, z.dtype), z.shape, dtype=z.dtype
            )
        return z + s * (jnp.asarray(scale, z.dtype) * jump)  # θ scales Gamma(k, 1)

    def check(position):
        # a (d,) scale must match the position: refused at init, before any step
        if np.ndim(scale) == 1 and np.shape(scale)[0] != np.size(position):
            raise ValueError(
                f"scale must be a scalar or a (d,) vector with d = {np.size(position)} "
                f"(the position's size); got shape {np.shape(scale)}."
            )

    return coordinatewise_proposal(log_f, log_g, sample=sample)._replace(check=check)


# ------------------------------------------------------------------ SDE proposals


def _eval_matrix(M: Any, z: Array, name: str) -> np.ndarray:
    """``M(z)`` (or ``M``) at a concrete ``z`` as a float64 ``(d, d)`` NumPy array.

    Eagerly, even inside jit.
    """
    d = z.shape[0]
    if M is None:
        return None
    if callable(M):
        try:
            with jax.ensure_compile_time_eval():
                m = M(z)
        # the user's callable failed on a correctly shaped point
        except Exception as exc:
            raise ValueError(
                f"{name} failed at a position of shape {tuple(z.shape)}: {exc}"
            ) from exc
        if not is_concrete(m):
            return None
    elif not is_concrete(M):
        return None  # a traced constant (built inside jit): its value is not known yet
    else:
        m = M
    m = np.asarray(m, np.float64)
    la.check_matrix_shape(m, name, d)
    return la.constant_dense(m, d)


def _check_d_q(D: Any, Q: Any, position: Array) -> None:
    """``D(z)`` symmetric positive definite and ``Q(z)`` skew-symmetric at ``z``.

    At a concrete ``z`` (NumPy only).
    """
    dm, qm = _eval_matrix(D, position, "D"), _eval_matrix(Q, position, "Q")
    if dm is not None:
        la.check_symmetric_psd(
            dm,
            "D",
            "the Gaussian proposal N(., 2 step_size D) needs a density",
            definite=True,
        )
    if qm is not None:
        la.check_skew(qm, "Q", "the irreversible part of the recipe")


def sde_proposal(
    D: Any,
    Q: Any,
    logdensity_fn: LogDensityFn,
    step_size: Any,
    *,
    grad_mode: str = "auto",
) -> Proposal:
    """One Euler–Maruyama step of the complete recipe as an irreversible proposal.

    docs/algorithms.md §8.

    With ``H = -logdensity_fn``, ``ε = step_size`` and a single direction sign
    ``s = direction[0] ∈ {-1, +1}`` (``Q`` couples coordinates, so one sign
    for the whole vector):

        f̃(z*|z, s) = N(z*; z + ε[-(D + sQ)∇H(z) + Γ_s(z)],  2ε D(z))
        g̃(z|z*, s) = N(z;  z* + ε[-(D - sQ)∇H(z*) + Γ_{-s}(z*)], 2ε D(z*))      (8.1)
        Γ_{±,i}(z) = Σ_j ∂_j (D_ij(z) ± Q_ij(z))

    (``g̃`` is the forward density of the adjoint process ``Q -> -Q``, so (7.1)
    holds). The Metropolis step (7.2) corrects the discretisation error; with
    ``Q = 0`` this is MALA preconditioned by ``D`` (with ``D = 1``: BlackJAX's
    ``mala``, the same draws from the same key).

    Args:
      D: symmetric positive definite: a scalar ``c`` (``c·I``), a ``(d,)``
        diagonal, a ``(d, d)`` array, or a callable of the flat ``z``
        returning one of these. Positive *definite*: the proposal needs a
        density, so a singular ``D`` (e.g. SGHMC's) is refused.
      Q: skew-symmetric, in the same forms; ``0`` or ``None`` for none (MALA).
      logdensity_fn: ``z -> log π(z)`` (``z`` an array or the pytree the chain
        uses); its value and gradient come from one autodiff pass in ``grad_mode``.
      step_size: ``ε > 0``; may be a tracer.
      grad_mode: ``"auto"`` (default), ``"reverse"`` (``jax.value_and_grad``, as
        BlackJAX's MALA) or ``"forward"`` (d vmapped ``jvp`` calls, the value from
        the primal): :func:`cenlmc_jax.gradients.modes.value_and_grad`; auto is
        forward for ``d <= FORWARD_MAX_D`` (benchmarks/results/grad_mode.md). The
        same chain up to rounding.

    Returns:
      A :class:`~cenlmc_jax.irreversible.jump.Proposal` with one direction sign
      (``direction_size = 1``), ``grad_evals = 1`` and a ``point_fn`` whose cache
      is an :class:`SDEPoint`.

    Raises:
      ValueError: a step size that is not positive, a bad ``grad_mode``, ``D`` or
        ``Q`` of a wrong form or of different sizes, ``D`` not symmetric positive
        definite or ``Q`` not skew-symmetric (constant concrete ones).

    Cost. Everything that depends only on constant ``D``, ``Q`` is computed
    here, once: the factor ``L`` of ``D = L Lᵀ`` (``√c``, ``√v`` or Cholesky),
    ``L⁻¹`` and ``½ log det D`` (NumPy float64 when the values are known;
    ``jnp`` when ``D`` is a tracer, e.g. a preconditioner being adapted inside
    ``jit``). The per-point pieces (:class:`SDEPoint`: ``∇log π``, and for
    callables ``D(z)∇log π + Γ_D``, ``Q(z)∇log π + Γ_Q``, ``L(z)``,
    ``½ log det D(z)``) are the proposal's ``point_fn``: computed once per
    proposed point and kept in the state, so a step costs one
    ``value_and_grad`` (``grad_evals = 1``), as BlackJAX's MALA. Scalar and
    diagonal ``D`` with ``Q = 0`` cost only elementwise work; a dense ``D`` or
    ``Q`` adds ``O(d²)`` matrix-vector products.

    Checks: constant concrete ``D``, ``Q`` here (NumPy, so also inside ``jit``);
    callables at the initial point by :func:`irreversible_mh_init` and in every
    eager step. ``Γ`` comes from :func:`cenlmc_jax._linalg.gamma_term` (zero
    for constants).
    """
    check_positive(step_size, "step_size")
    check_callable(logdensity_fn, "logdensity_fn", "z -> scalar log density")
    check_grad_mode(grad_mode)
    Q = 0.0 if Q is None else Q
    la.check_matrix_form(D, "D")
    la.check_matrix_form(Q, "Q")
    sizes = {np.shape(M)[0] for M in (D, Q) if not callable(M) and np.ndim(M) > 0}
    if len(sizes) > 1:
        raise ValueError(
            f"D and Q must have the same size; got shapes {np.shape(D)} and "
            f"{np.shape(Q)}."
        )
    # constants with known values: checked now, at a dummy point of the right size
    # (callables: at init)
    _check_d_q(
        None if callable(D) else D,
        None if callable(Q) else Q,
        np.zeros((sizes.pop() if sizes else 1,)),
    )

    d_const, q_const = not callable(D), not callable(Q)
    q_zero = q_const and is_concrete(Q) and not np.any(np.asarray(Q))
    Dc = matrix_value(D) if d_const else None
    Qc = None if (q_zero or not q_const) else matrix_value(Q)
    # (L, L⁻¹, ½ log det) of a constant D, once; a scalar's log det is per dimension (d
    # is not known yet)
    factor = spd_factor(Dc, 1 if Dc.ndim == 0 else Dc.shape[0]) if d_const else None
    value_and_grad = grad_modes.value_and_grad(logdensity_fn, grad_mode)

    def d_factor(z):
        """(L, L⁻¹, ½ log det D) of the constant D, in z's dtype."""
        root, inv, half = factor
        return (
            _as(root, z.dtype),
            _as(inv, z.dtype),
            _as(half, z.dtype) * (z.shape[0] if Dc.ndim == 0 else 1),
        )

    def point_at(z, grad):
        """SDEPoint at a flat z with ∇log π(z) = grad."""
        drift_d = drift_q = root = half = None
        if not d_const:
            dz = la.evaluate(D, z, "D")
            drift_d = la.matvec(dz, grad) + la.gamma_term(D, None, z)
            root, _, half = spd_factor(dz, z.shape[0])
        if not q_const:
            drift_q = la.matvec(la.evaluate(Q, z, "Q"), grad) + la.gamma_term(
                None, Q, z
            )
        return SDEPoint(grad, drift_d, drift_q, root, half)

    def point_fn(position):
        logdensity, grad = value_and_grad(position)
        z = ravel_pytree(position)[0]
        return logdensity, point_at(z, ravel_pytree(grad)[0].astype(z.dtype))

    def cached(z, cache):
        # called directly without a cache (an array position): compute it at z
        return point_fn(z)[1] if cache is None else cache

    def mean(z, s, point):
        """z + ε [(D + sQ)∇log π + Γ_D + sΓ_Q] at z, from its cache."""
        eps = jnp.asarray(step_size, z.dtype)
        drift = la.matvec(_as(Dc, z.dtype), point.grad) if d_const else point.drift_d
        if not q_const:
            drift = drift + s * point.drift_q
        elif not q_zero:
            drift = drift + s * la.matvec(_as(Qc, z.dtype), point.grad)
        return z + eps * drift

    def log_density(x, z, s, point):
        """log N(x; mean_s(z), 2ε D(z))."""
        var = 2.0 * jnp.asarray(step_size, z.dtype)
        r = x - mean(z, s, point)
        if d_const:
            _, inv, half = d_factor(z)
            y = la.matvec(inv, r)
        else:
            root, half = point.root, point.half_logdet
            y = solve_triangular(root, r, lower=True) if root.ndim == 2 else r / root
        return _log_normal(y, half, var)

    def sample(rng_key, z, direction, cache=None):
        point = cached(z, cache)
        root = d_factor(z)[0] if d_const else point.root
        xi = jax.random.normal(rng_key, z.shape, dtype=z.dtype)
        return mean(z, direction[0], point) + jnp.sqrt(
            2.0 * jnp.asarray(step_size, z.dtype)
        ) * la.matvec(root, xi)

    def log_forward(z_star, z, direction, cache=None):
        return log_density(z_star, z, direction[0], cached(z, cache))

    def log_backward(z, z_star, direction, cache=None):
        return log_density(z, z_star, -direction[0], cached(z_star, cache))

    def check(position):
        _check_d_q(D, Q, position)

    return Proposal(
        sample,
        log_forward,
        log_backward,
        direction_size=1,
        grad_evals=1,
        check=check,
        point_fn=point_fn,
        logdensity_fn=logdensity_fn,
    )
