"""Real inverse problems with reference posteriors.

An epidemic ODE and a Darcy-flow PDE.

Each constructor returns an :class:`InverseProblem`: the fields of a
:class:`cenlmc_jax.models.targets.Target` (``name``, ``dim``, ``logdensity_fn``,
``mean``, ``cov``, ``f_star``, ...) followed by what a user of the model needs
(the data, the forward model, a simulator, the MAP, the whitening transform).
Data are synthetic, drawn from fixed seeds; nothing is downloaded.

**Whitened coordinates.** The samplers see ``z``, not the physical parameters
``θ`` (log-rates, log-conductivities): with ``θ_MAP`` the posterior mode and
``H = -∇² log π(θ_MAP)`` the Hessian there, ``C = chol(H⁻¹)`` (lower) and

    θ = θ_MAP + C z,        z = C⁻¹ (θ - θ_MAP),

so the posterior in ``z`` has its mode at 0 with unit Hessian there: a
roughly unit-scale target, which is what ``cj.ensemble.tuning.suggest_cenlmc_params``
assumes (``L = mu = 1``). ``logdensity_fn(z)`` is the log posterior in ``z``
(the Jacobian ``|det C|`` is a constant), normalised when the reference comes
from quadrature; ``mean``, ``cov`` are the posterior moments of ``z``;
``param_mean``, ``param_cov`` the same in ``θ`` (``θ`` is linear in ``z``).

**References.** ``d <= 3``: tensor-product trapezoidal quadrature over
``z ∈ [-half_width, half_width]^d`` in float64 (:func:`quadrature_moments`).
For a smooth density decaying like a Gaussian the trapezoidal rule converges
exponentially in the spacing; the constructor checks it by repeating the sum
on every second node (twice the spacing) and records the largest moment
difference as ``data["quadrature_error"]``, and the density on the boundary of
the box relative to the mode as ``data["boundary_density"]``. ``d > 3``:
``mean``/``cov`` are None and :func:`mala_reference` computes them by long
MALA runs (``cj.irreversible_mh`` with an SDE proposal, ``Q = 0``) with R-hat.

**Problems.**

* :func:`sir_epidemic` — SIR model ``S' = -β S I``, ``I' = β S I - γ I``,
  fixed-step RK4 in ``lax.scan``; log-normal observations of the prevalence
  ``I``; ``θ = (log β, log γ)``, d = 2.
* :func:`sir_epidemic_black_box` — the same posterior, but the model is NumPy
  code behind ``jax.pure_callback`` (JAX cannot differentiate it) and
  ``grad_fn`` is a central finite difference (``2d`` values per gradient,
  one batched call). The NumPy RK4 repeats the JAX one operation for
  operation, so the two log densities agree to rounding and share the
  reference; ``data["counter"]`` counts the model's calls and points.
* :func:`darcy_flow` — 1-D Darcy flow ``-(k(s) u'(s))' = 1`` on ``(0, 1)``,
  ``u(0) = u(1) = 0``, ``log k`` piecewise constant on ``d`` equal zones,
  finite volumes on ``num_nodes`` interior nodes: one tridiagonal solve
  (``lax.linalg.tridiagonal_solve``) per value; noisy observations of ``u``;
  ``θ = log k`` per zone, d = ``num_coefficients``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from cenlmc_jax import diagnostics
from cenlmc_jax._validation import check_int, check_key, check_positive
from cenlmc_jax.gradients.finite_difference import finite_difference
from cenlmc_jax.irreversible import irreversible_mh, sde_proposal
from cenlmc_jax.models.targets import Target
from cenlmc_jax.run import sample, vmap_chains

__all__ = [
    "InverseProblem",
    "ModelCounter",
    "Reference",
    "sir_epidemic",
    "sir_epidemic_black_box",
    "darcy_flow",
    "quadrature_moments",
    "mala_reference",
    "PROBLEMS",
]


class InverseProblem(NamedTuple):
    """A Bayesian inverse problem, sampled in whitened coordinates ``z``.

    Module docstring.

    The first eleven fields are those of :class:`~cenlmc_jax.models.targets.Target`
    (``as_target()`` returns that Target), for ``z``; then what a user needs
    besides.

    Attributes:
      name: the problem's name.
      dim: the dimension ``d``.
      logdensity_fn: ``z: (d,) -> log π(z)``.
      mean: ``(d,)`` mean of ``z`` under the posterior (None without a
        reference).
      cov: ``(d, d)`` covariance of ``z`` under the posterior (None without a
        reference).
      f_star: ``-max log π = -logdensity_fn(0)``.
      sample: None (no exact sampler).
      data: the raw data and reference details.
      L: None (no global curvature bounds).
      mu: None.
      hessian: None (the Hessian at the mode is I by construction).
      grad_fn: ``z: (d,) -> ∇ log π(z)`` to pass as ``grad_fn=`` to the
        samplers (None: autodiff; the black box: finite differences carrying
        ``model_solves``).
      param_names: names of ``θ``'s coordinates.
      theta_true: ``(d,)`` the parameters the data were simulated from.
      theta_map: ``(d,)`` the posterior mode in ``θ``.
      whitening: ``C: (d, d)``, lower triangular, ``θ = θ_MAP + C z``.
      observations: the data ``y``.
      forward_fn: ``θ: (d,) -> predicted observations`` (JAX, or NumPy for the
        black box).
      simulate: ``(rng_key, θ) -> y`` (forward model plus observation noise,
        JAX).
      logposterior_fn: ``θ: (d,) -> log prior + log likelihood``
        (unnormalised).
      param_mean: posterior mean of ``θ`` (None without a reference).
      param_cov: posterior covariance of ``θ`` (None without a reference).
      reference: how ``mean``/``cov`` were obtained (a sentence).
    """

    name: str
    dim: int
    logdensity_fn: Callable
    mean: np.ndarray | None
    cov: np.ndarray | None
    f_star: float | None
    sample: Callable | None
    data: dict | None
    L: float | None
    mu: float | None
    hessian: np.ndarray | None
    grad_fn: Callable | None
    param_names: tuple
    theta_true: np.ndarray
    theta_map: np.ndarray
    whitening: np.ndarray
    observations: np.ndarray
    forward_fn: Callable
    simulate: Callable
    logposterior_fn: Callable
    param_mean: np.ndarray | None
    param_cov: np.ndarray | None
    reference: str

    def to_params(self, z: Any) -> Any:
        """``θ = θ_MAP + C z`` for ``z: (..., d)``.

        Keeps ``z``'s array type and dtype.

        Args:
          z: whitened coordinates, shape ``(..., d)``.

        Returns:
          ``θ``, shape ``(..., d)``.
        """
        xp = jnp if isinstance(z, jax.Array) else np
        z = xp.asarray(z)
        return xp.asarray(self.theta_map, z.dtype) + z @ xp.asarray(
            self.whitening.T, z.dtype
        )

    def from_params(self, theta: Any) -> Any:
        """``z = C⁻¹ (θ - θ_MAP)`` for ``theta: (..., d)``.

        Args:
          theta: parameters, shape ``(..., d)``.

        Returns:
          ``z``, shape ``(..., d)``, in ``theta``'s array type and dtype.
        """
        xp = jnp if isinstance(theta, jax.Array) else np
        theta = xp.asarray(theta)
        inv = np.linalg.inv(self.whitening)
        return (theta - xp.asarray(self.theta_map, theta.dtype)) @ xp.asarray(
            inv.T, theta.dtype
        )

    def as_target(self) -> Target:
        """The :class:`~cenlmc_jax.models.targets.Target` in whitened coordinates."""
        return Target(*self[:11])


class ModelCounter:
    """Counts what a black-box model was asked for.

    ``calls`` (batched calls) and ``points``.
    """

    def __init__(self):
        self.calls = 0
        self.points = 0

    def reset(self) -> None:
        self.calls = 0
        self.points = 0

    def __repr__(self) -> str:
        return f"ModelCounter(calls={self.calls}, points={self.points})"


class Reference(NamedTuple):
    """Posterior moments of ``z`` from a reference computation.

    Attributes:
      mean: (d,) the mean.
      cov: (d, d) the covariance.
      sd: (d,) the standard deviations.
      error: a bound on the error of the moments (quadrature: the change when
        the spacing doubles; MALA: the largest MCSE of mean and sd).
      log_z: ``log ∫ exp(logdensity_fn)`` (quadrature only).
      rhat: (d,) split R-hat of the MALA chains (None for quadrature).
      acceptance_rate: of the MALA chains (None for quadrature).
      method: a sentence.
    """

    mean: np.ndarray
    cov: np.ndarray
    sd: np.ndarray
    error: float
    log_z: float | None
    rhat: np.ndarray | None
    acceptance_rate: float | None
    method: str


# ----------------------------------------------------------------- references


def quadrature_moments(
    logdensity_fn: Callable,
    dim: int,
    *,
    half_width: float = 7.0,
    spacing: float = 0.1,
    batch_size: int = 8192,
) -> Reference:
    """Mean and covariance of ``exp(logdensity_fn)`` by trapezoidal quadrature, float64.

    Nodes ``z_k ∈ {-a, -a + Δ, ..., a}^d`` (``a = half_width``, ``Δ = spacing``);
    with ``w_k`` the trapezoid weights and ``p_k = exp(logdensity_fn(z_k) - max)``:
    ``Z = Δ^d Σ w_k p_k``, ``mean = Σ w_k p_k z_k / Σ w_k p_k``, ``cov`` likewise.
    ``error`` is the largest change of mean and cov entries when the sum is
    repeated on every second node (spacing 2Δ). The density must be negligible
    on the boundary (checked by the callers through ``boundary_density``,
    returned in ``method``'s sentence and by :func:`_grid_logdensity`).
    ``logdensity_fn`` is evaluated in float64 (``jax.enable_x64``),
    ``batch_size`` points at a time. Practical for ``d <= 3``.

    Args:
      logdensity_fn: ``z: (d,) -> scalar`` log density (vmappable).
      dim: the dimension ``d``.
      half_width: ``a > 0``.
      spacing: ``Δ > 0``.
      batch_size: points per call.

    Returns:
      The :class:`Reference` (``log_z`` set, ``rhat`` and ``acceptance_rate``
      None).
    """
    ref, _ = _quadrature(logdensity_fn, dim, half_width, spacing, batch_size)
    return ref


def _quadrature(logdensity_fn, dim, half_width, spacing, batch_size):
    dim = check_int(
        dim,
        "dim",
        minimum=1,
        maximum=3,
        why=" (a tensor grid in more dimensions is too large)",
    )
    check_positive(half_width, "half_width")
    check_positive(spacing, "spacing")
    m = int(round(half_width / spacing))
    axis = np.linspace(-m * spacing, m * spacing, 2 * m + 1)
    with jax.enable_x64(True):
        grid = np.stack(np.meshgrid(*([axis] * dim), indexing="ij"), axis=-1).reshape(
            -1, dim
        )
        logp = jax.lax.map(
            lambda z: jnp.asarray(logdensity_fn(z), jnp.float64),
            jnp.asarray(grid, jnp.float64),
            batch_size=batch_size,
        )
        logp = np.asarray(logp, np.float64).reshape((2 * m + 1,) * dim)
    if not np.all(np.isfinite(logp)):
        raise ValueError(
            "logdensity_fn is not finite on the quadrature grid "
            f"({np.sum(~np.isfinite(logp))} nodes)."
        )
    top = logp.max()
    on_edge = np.zeros(logp.shape, bool)
    for k in range(dim):
        idx = [slice(None)] * dim
        idx[k] = [0, -1]
        on_edge[tuple(idx)] = True
    boundary = float(np.exp(logp[on_edge].max() - top))

    def moments(lp, ax, h):
        w1 = np.ones(ax.size)
        w1[[0, -1]] = 0.5
        w = np.ones(lp.shape)
        for k in range(dim):
            shape = [1] * dim
            shape[k] = -1
            w = w * w1.reshape(shape)
        p = (w * np.exp(lp - top)).reshape(-1)
        total = p.sum()
        pts = np.stack(np.meshgrid(*([ax] * dim), indexing="ij"), axis=-1).reshape(
            -1, dim
        )
        mean = p @ pts / total
        c = pts - mean
        cov = (c * p[:, None]).T @ c / total
        log_z = top + math.log(total) + dim * math.log(h)
        return mean, cov, log_z

    mean, cov, log_z = moments(logp, axis, spacing)
    coarse = logp[(slice(None, None, 2),) * dim]
    mean2, cov2, _ = moments(coarse, axis[::2], 2 * spacing)
    error = float(max(np.max(np.abs(mean - mean2)), np.max(np.abs(cov - cov2))))
    method = (
        f"trapezoidal quadrature on a {2 * m + 1}^{dim} grid over [-{half_width:g}, "
        f"{half_width:g}]^{dim} (spacing {spacing:g}), float64; moment change at "
        f"twice the spacing {error:.1e}, boundary density / mode {boundary:.1e}"
    )
    return Reference(
        mean, cov, np.sqrt(np.diag(cov)), error, float(log_z), None, None, method
    ), boundary


def mala_reference(
    problem: InverseProblem,
    rng_key: Any,
    *,
    num_chains: int = 32,
    num_steps: int = 4000,
    burn_in: int = 1000,
    step_size: float | None = None,
) -> Reference:
    """Posterior moments of ``z`` by MALA chains started from N(0, I).

    N(0, I) is the Laplace approximation. MALA is
    ``cj.irreversible_mh(logdensity_fn, cj.irreversible.sde_proposal(1, 0,
    logdensity_fn, ε))``: proposal ``z* = z + ε ∇log π(z) + sqrt(2ε) ξ`` with the
    Metropolis–Hastings correction, so the chains have no discretisation bias.
    Runs in the dtype of the default float (enable x64 for a float64 reference).

    Args:
      problem: the :class:`InverseProblem`.
      rng_key: a JAX PRNG key.
      num_chains: chains, ``>= 2``.
      num_steps: kept steps per chain, ``>= 4``.
      burn_in: steps discarded per chain.
      step_size: ``ε``; default ``0.6 d^{-1/3}`` (a unit-scale target:
        acceptance about 0.7).

    Returns:
      The :class:`Reference`: the pooled mean and covariance of
      ``num_chains × num_steps`` draws after ``burn_in``, ``error`` = the largest
      MCSE of the means and sds, and the split R-hat per coordinate (check
      ``rhat < 1.01``).

    Raises:
      ValueError: ``problem`` not an :class:`InverseProblem`, a bad key, or a
        count out of range.
    """
    if not isinstance(problem, InverseProblem):
        raise ValueError(
            f"problem must be an InverseProblem; got {type(problem).__name__}."
        )
    check_key(rng_key, "rng_key")
    num_chains = check_int(num_chains, "num_chains", minimum=2)
    num_steps = check_int(num_steps, "num_steps", minimum=4)
    burn_in = check_int(burn_in, "burn_in", minimum=0)
    d = problem.dim
    eps = 0.6 * d ** (-1.0 / 3.0) if step_size is None else step_size
    check_positive(eps, "step_size")
    k0, k1 = jax.random.split(rng_key)
    algo = vmap_chains(
        irreversible_mh(
            problem.logdensity_fn, sde_proposal(1.0, 0.0, problem.logdensity_fn, eps)
        )
    )
    state = algo.init(jax.random.normal(k0, (num_chains, d)))
    res = sample(
        k1, algo, state, burn_in + num_steps
    )  # one chunk length: one compilation
    draws = np.asarray(res.trace, np.float64)[burn_in:].transpose(
        1, 0, 2
    )  # (chains, draws, d)
    flat = draws.reshape(-1, d)
    mean, cov = flat.mean(axis=0), np.cov(flat, rowvar=False).reshape(d, d)
    err = max(
        float(np.max(diagnostics.mcse(draws, statistic="mean"))),
        float(np.max(diagnostics.mcse(draws, statistic="sd"))),
    )
    rhat = np.asarray(diagnostics.potential_scale_reduction(draws))
    acc = float(np.mean(np.asarray(res.info.acceptance_rate)[burn_in:]))
    method = (
        f"MALA, {num_chains} chains x {num_steps} draws after {burn_in} burn-in, step "
        f"{eps:.3g}, acceptance {acc:.2f}, max R-hat {rhat.max():.4f}, max MCSE "
        f"{err:.1e}"
    )
    return Reference(mean, cov, np.sqrt(np.diag(cov)), err, None, rhat, acc, method)


# ------------------------------------------------------------ shared assembly


def _newton_map(logpost64: Callable, theta0: np.ndarray, max_steps: int = 100):
    """Mode of ``logpost64`` by damped Newton (backtracking on the value), float64.

    Returns ``(θ_MAP, -∇² log π(θ_MAP), log π(θ_MAP))``.
    """
    with jax.enable_x64(True):
        value = jax.jit(logpost64)
        derivatives = jax.jit(
            lambda t: (logpost64(t), jax.grad(logpost64)(t), -jax.hessian(logpost64)(t))
        )
        theta = np.asarray(theta0, np.float64)
        for _ in range(max_steps):
            f0, g, h = (np.asarray(v, np.float64) for v in derivatives(theta))
            eig = np.linalg.eigvalsh(h)
            shift = (
                0.0 if eig.min() > 0 else 1e-3 - eig.min()
            )  # a descent direction away from the mode
            direction = np.linalg.solve(h + shift * np.eye(theta.size), g)
            # converged: a tiny gradient, or a Newton decrement gᵀH⁻¹g (twice the
            # predicted gain) at float64 rounding of the value
            if np.max(np.abs(g)) < 1e-9 or (
                shift == 0.0 and g @ direction < 1e-14 * max(1.0, abs(float(f0)))
            ):
                return theta, h, float(f0)
            t = 1.0
            while (
                not float(value(theta + t * direction)) >= f0 and t > 1e-8
            ):  # NaN backtracks too
                t *= 0.5
            theta = theta + t * direction
    raise RuntimeError(
        "Newton's method did not find the posterior mode (gradient "
        f"{np.max(np.abs(g)):.2e})."
    )


def _assemble(
    name,
    param_names,
    logpost,
    forward_fn,
    simulate,
    theta_true,
    observations,
    data,
    *,
    quadrature_spacing,
    quadrature_half_width,
    grad_fn=None,
    logpost_for_sampling=None,
):
    """MAP, whitening, the z-space log density and the quadrature reference (d <= 3)."""
    d = len(param_names)
    theta_map, neg_hess, lp_map = _newton_map(logpost, theta_true)
    chol = np.linalg.cholesky(np.linalg.inv(neg_hess))
    lp_fn = logpost if logpost_for_sampling is None else logpost_for_sampling

    def unnormalised(z):
        theta = jnp.asarray(theta_map, z.dtype) + jnp.asarray(chol, z.dtype) @ z
        return lp_fn(theta)

    def shifted(
        z,
    ):  # log π(z) - log π(0): the mode of the whitened posterior has value 0
        theta = jnp.asarray(theta_map, z.dtype) + jnp.asarray(chol, z.dtype) @ z
        return logpost(theta) - jnp.asarray(lp_map, z.dtype)

    data = dict(data)
    ref = None
    if d <= 3:
        ref, boundary = _quadrature(
            shifted, d, quadrature_half_width, quadrature_spacing, 8192
        )
        data.update(
            quadrature_error=ref.error, boundary_density=boundary, log_z=ref.log_z
        )
        log_norm = lp_map + ref.log_z  # log ∫ exp(logpost(θ_MAP + C z)) dz
        reference = ref.method
    else:
        log_norm = lp_map
        reference = "none: d > 3, use mala_reference(problem, key)"

    def logdensity_fn(z):
        return unnormalised(z) - jnp.asarray(log_norm, z.dtype)

    param_mean = None if ref is None else theta_map + chol @ ref.mean
    param_cov = None if ref is None else chol @ ref.cov @ chol.T
    return InverseProblem(
        name=name,
        dim=d,
        logdensity_fn=logdensity_fn,
        mean=None if ref is None else ref.mean,
        cov=None if ref is None else ref.cov,
        f_star=float(log_norm - lp_map),
        sample=None,
        data=data,
        L=None,
        mu=None,
        hessian=None,
        grad_fn=grad_fn,
        param_names=tuple(param_names),
        theta_true=np.asarray(theta_true, np.float64),
        theta_map=theta_map,
        whitening=chol,
        observations=np.asarray(observations, np.float64),
        forward_fn=forward_fn,
        simulate=simulate,
        logposterior_fn=logpost,
        param_mean=param_mean,
        param_cov=param_cov,
        reference=reference,
    )


# -------------------------------------------------------------- SIR epidemic

SIR_HORIZON = 60.0  # days
SIR_INITIAL_INFECTED = 0.01  # fraction of the population at t = 0
SIR_TRUE = (0.5, 0.2)  # β, γ per day: R0 = 2.5
SIR_PRIOR_MEAN = (math.log(0.4), math.log(0.25))  # of (log β, log γ)
SIR_PRIOR_SD = 0.5


def _sir_settings(num_rk4_steps, num_observations, noise_sd):
    num_rk4_steps = check_int(num_rk4_steps, "num_rk4_steps", minimum=1)
    num_observations = check_int(num_observations, "num_observations", minimum=1)
    if num_rk4_steps % num_observations:
        raise ValueError(
            "num_rk4_steps must be a multiple of num_observations "
            f"({num_observations}); got {num_rk4_steps}."
        )
    check_positive(noise_sd, "noise_sd")
    return num_rk4_steps, num_observations, num_rk4_steps // num_observations


def _sir_prevalence(theta, num_observations, steps_per_obs, dt):
    """RK4 for (S, I) with ``(β, γ) = exp(θ)``: ``I`` at the observation times.

    JAX; ``num_observations`` times.
    """
    beta, gamma = jnp.exp(theta[0]), jnp.exp(theta[1])
    dt = jnp.asarray(dt, theta.dtype)

    def rhs(s, i):
        infection = beta * s * i
        return -infection, infection - gamma * i

    def rk4(y, _):
        s, i = y
        a1, b1 = rhs(s, i)
        a2, b2 = rhs(s + 0.5 * dt * a1, i + 0.5 * dt * b1)
        a3, b3 = rhs(s + 0.5 * dt * a2, i + 0.5 * dt * b2)
        a4, b4 = rhs(s + dt * a3, i + dt * b3)
        return (
            s + dt / 6 * (a1 + 2 * a2 + 2 * a3 + a4),
            i + dt / 6 * (b1 + 2 * b2 + 2 * b3 + b4),
        ), None

    def observe(y, _):
        y, _ = jax.lax.scan(rk4, y, None, length=steps_per_obs)
        return y, y[1]

    y0 = (
        jnp.asarray(1.0 - SIR_INITIAL_INFECTED, theta.dtype),
        jnp.asarray(SIR_INITIAL_INFECTED, theta.dtype),
    )
    _, prevalence = jax.lax.scan(observe, y0, None, length=num_observations)
    return prevalence


def _sir_prevalence_numpy(theta, num_observations, steps_per_obs, dt):
    """The same RK4 in NumPy, float64, vectorised over ``theta: (..., 2)``.

    Returns ``(..., num_observations)``.
    """
    theta = np.asarray(theta, np.float64)
    beta, gamma = np.exp(theta[..., 0]), np.exp(theta[..., 1])

    def rhs(s, i):
        infection = beta * s * i
        return -infection, infection - gamma * i

    s = np.full(beta.shape, 1.0 - SIR_INITIAL_INFECTED)
    i = np.full(beta.shape, SIR_INITIAL_INFECTED)
    out = []
    for _ in range(num_observations):
        for _ in range(steps_per_obs):
            a1, b1 = rhs(s, i)
            a2, b2 = rhs(s + 0.5 * dt * a1, i + 0.5 * dt * b1)
            a3, b3 = rhs(s + 0.5 * dt * a2, i + 0.5 * dt * b2)
            a4, b4 = rhs(s + dt * a3, i + dt * b3)
            s, i = (
                s + dt / 6 * (a1 + 2 * a2 + 2 * a3 + a4),
                i + dt / 6 * (b1 + 2 * b2 + 2 * b3 + b4),
            )
        out.append(i)
    return np.stack(out, axis=-1)


def _sir_parts(num_rk4_steps, num_observations, noise_sd, seed):
    num_rk4_steps, num_observations, per_obs = _sir_settings(
        num_rk4_steps, num_observations, noise_sd
    )
    dt = SIR_HORIZON / num_rk4_steps
    times = SIR_HORIZON * np.arange(1, num_observations + 1) / num_observations
    theta_true = np.log(np.asarray(SIR_TRUE))
    rng = np.random.default_rng(seed)
    clean = _sir_prevalence_numpy(theta_true, num_observations, per_obs, dt)
    y = clean * np.exp(
        noise_sd * rng.standard_normal(num_observations)
    )  # log-normal noise
    log_y = np.log(y)
    prior_mean = np.asarray(SIR_PRIOR_MEAN)
    log_c = -0.5 * num_observations * math.log(2 * math.pi * noise_sd**2) - 2 * (
        0.5 * math.log(2 * math.pi) + math.log(SIR_PRIOR_SD)
    )

    def forward_fn(theta):
        return _sir_prevalence(theta, num_observations, per_obs, dt)

    def logpost(theta):
        r = (jnp.asarray(log_y, theta.dtype) - jnp.log(forward_fn(theta))) / noise_sd
        p = (theta - jnp.asarray(prior_mean, theta.dtype)) / SIR_PRIOR_SD
        return -0.5 * jnp.sum(r**2) - 0.5 * jnp.sum(p**2) + log_c

    def logpost_numpy(theta):
        theta = np.asarray(theta, np.float64)
        r = (
            log_y - np.log(_sir_prevalence_numpy(theta, num_observations, per_obs, dt))
        ) / noise_sd
        p = (theta - prior_mean) / SIR_PRIOR_SD
        return -0.5 * np.sum(r**2, axis=-1) - 0.5 * np.sum(p**2, axis=-1) + log_c

    def simulate(rng_key, theta):
        theta = jnp.asarray(theta)
        noise = jax.random.normal(rng_key, (num_observations,), theta.dtype)
        return forward_fn(theta) * jnp.exp(noise_sd * noise)

    data = dict(
        times=times,
        observations=y,
        noise_sd=noise_sd,
        num_rk4_steps=num_rk4_steps,
        rk4_step=dt,
        horizon=SIR_HORIZON,
        initial_infected=SIR_INITIAL_INFECTED,
        prior_mean=prior_mean,
        prior_sd=SIR_PRIOR_SD,
        seed=seed,
        logposterior_numpy=logpost_numpy,
    )
    return (
        logpost,
        forward_fn,
        simulate,
        theta_true,
        y,
        data,
        logpost_numpy,
        (num_observations, per_obs, dt),
    )


def sir_epidemic(
    *,
    num_rk4_steps: int = 1000,
    num_observations: int = 20,
    noise_sd: float = 0.25,
    seed: int = 0,
    quadrature_spacing: float = 0.1,
    quadrature_half_width: float = 7.0,
) -> InverseProblem:
    """Calibrate an SIR epidemic to noisy prevalence data.

    d = 2, ``θ = (log β, log γ)``.

    Model (population fractions, ``R = 1 - S - I``): ``S' = -β S I``,
    ``I' = β S I - γ I``, ``S(0) = 0.99``, ``I(0) = 0.01``, on ``[0, 60]`` days,
    integrated by classical RK4 with ``num_rk4_steps`` fixed steps (a nested
    ``lax.scan``: the autodiff gradient differentiates through every step).
    Data: ``y_k = I(t_k) exp(σ ε_k)``, ``ε_k ~ N(0, 1)``, at
    ``t_k = 60 k / num_observations`` with ``σ = noise_sd``, simulated from
    ``β = 0.5, γ = 0.2`` (R0 = 2.5) with ``np.random.default_rng(seed)``.
    Prior: ``log β ~ N(log 0.4, 0.5²)``, ``log γ ~ N(log 0.25, 0.5²)``.
    Reference: quadrature (module docstring). ``data`` holds the times, the
    data and the settings, and ``logposterior_numpy`` (the NumPy twin used
    by :func:`sir_epidemic_black_box`).

    Args:
      num_rk4_steps: RK4 steps on ``[0, 60]``, a multiple of
        ``num_observations``.
      num_observations: observation times.
      noise_sd: ``σ > 0``.
      seed: the NumPy seed of the simulated data.
      quadrature_spacing: the spacing ``Δ`` of the reference quadrature.
      quadrature_half_width: its half-width ``a`` (the grid is ``[-a, a]^d`` in
        ``z``).

    Returns:
      The :class:`InverseProblem` (autodiff gradient).

    Raises:
      ValueError: a setting out of range.
    """
    logpost, forward_fn, simulate, theta_true, y, data, _, _ = _sir_parts(
        num_rk4_steps, num_observations, noise_sd, seed
    )
    return _assemble(
        "sir_epidemic",
        ("log_beta", "log_gamma"),
        logpost,
        forward_fn,
        simulate,
        theta_true,
        y,
        data,
        quadrature_spacing=quadrature_spacing,
        quadrature_half_width=quadrature_half_width,
    )


def sir_epidemic_black_box(
    *,
    num_rk4_steps: int = 1000,
    num_observations: int = 20,
    noise_sd: float = 0.25,
    seed: int = 0,
    quadrature_spacing: float = 0.1,
    quadrature_half_width: float = 7.0,
    fd_scheme: str = "central",
) -> InverseProblem:
    """:func:`sir_epidemic` with the model as a NumPy black box.

    Behind ``jax.pure_callback``.

    ``logdensity_fn(z)`` whitens in JAX and calls the NumPy log posterior
    (``pure_callback(..., vmap_method="expand_dims")``: a vmapped call sends
    the whole batch in one NumPy call, computed in float64 and returned in
    ``z``'s dtype). JAX cannot differentiate it: ``grad_fn`` is
    ``finite_difference(logdensity_fn, scheme=fd_scheme)`` (2d values per
    gradient, all in one batched call; ``grad_fn.model_solves(d)``).
    ``data["counter"]`` (:class:`ModelCounter`) counts the NumPy calls and the
    points evaluated. MAP, whitening and reference are those of the JAX model
    (the NumPy RK4 repeats it operation for operation; the log densities agree
    to rounding). ``forward_fn`` is the NumPy forward model.

    Args:
      num_rk4_steps: RK4 steps on ``[0, 60]``, a multiple of
        ``num_observations``.
      num_observations: observation times.
      noise_sd: ``σ > 0``.
      seed: the NumPy seed of the simulated data.
      quadrature_spacing: the spacing ``Δ`` of the reference quadrature.
      quadrature_half_width: its half-width ``a`` (the grid is ``[-a, a]^d`` in
        ``z``).
      fd_scheme: the finite-difference scheme of ``grad_fn`` (``"central"`` or
        another scheme of ``finite_difference``).

    Returns:
      The :class:`InverseProblem` with the finite-difference ``grad_fn``.

    Raises:
      ValueError: a setting out of range.
    """
    logpost, _, simulate, theta_true, y, data, logpost_numpy, (n_obs, per_obs, dt) = (
        _sir_parts(num_rk4_steps, num_observations, noise_sd, seed)
    )
    counter = ModelCounter()

    def numpy_logpost(theta):
        theta = np.asarray(theta)
        counter.calls += 1
        counter.points += int(np.prod(theta.shape[:-1]))
        return np.asarray(logpost_numpy(theta), theta.dtype)

    def black_box(theta):
        return jax.pure_callback(
            numpy_logpost,
            jax.ShapeDtypeStruct(theta.shape[:-1], theta.dtype),
            theta,
            vmap_method="expand_dims",
        )

    def forward_numpy(theta):
        return _sir_prevalence_numpy(theta, n_obs, per_obs, dt)

    data = dict(data, counter=counter)
    problem = _assemble(
        "sir_epidemic_black_box",
        ("log_beta", "log_gamma"),
        logpost,
        forward_numpy,
        simulate,
        theta_true,
        y,
        data,
        quadrature_spacing=quadrature_spacing,
        quadrature_half_width=quadrature_half_width,
        logpost_for_sampling=black_box,
    )
    return problem._replace(
        grad_fn=finite_difference(problem.logdensity_fn, scheme=fd_scheme)
    )


# ---------------------------------------------------------------- Darcy flow


def _darcy_operator(theta, num_nodes):
    """Tridiagonal finite-volume matrix of ``-(k u')'``: (dl, diag, du).

    With ``log k`` = θ on equal zones.
    """
    n, d = num_nodes, theta.shape[-1]
    ds = 1.0 / (n + 1)
    # the n + 1 cell faces between nodes (and walls)
    faces = (np.arange(n + 1) + 0.5) * ds
    zone = np.minimum((faces * d).astype(np.int32), d - 1)
    k = jnp.exp(theta[zone]) / ds**2
    zero = jnp.zeros((1,), theta.dtype)
    return (
        jnp.concatenate([zero, -k[1:n]]),
        k[:n] + k[1:],
        jnp.concatenate([-k[1:n], zero]),
    )


def _darcy_solve(theta, num_nodes, obs_idx):
    dl, diag, du = _darcy_operator(theta, num_nodes)
    u = jax.lax.linalg.tridiagonal_solve(
        dl, diag, du, jnp.ones((num_nodes, 1), theta.dtype)
    )[:, 0]
    return u[np.asarray(obs_idx, np.int32)]


def darcy_flow(
    num_coefficients: int = 3,
    *,
    num_nodes: int = 99,
    num_observations: int = 12,
    noise_sd: float = 0.002,
    seed: int = 0,
    quadrature_spacing: float = 0.2,
    quadrature_half_width: float = 7.0,
) -> InverseProblem:
    """Recover a piecewise-constant conductivity from pressures: 1-D Darcy flow.

    d = ``num_coefficients``.

    ``-(k(s) u'(s))' = 1`` on ``(0, 1)``, ``u(0) = u(1) = 0``,
    ``log k(s) = θ_j`` on zone ``j`` of ``d`` equal zones. Finite volumes on
    ``num_nodes`` interior nodes (spacing ``1/(num_nodes + 1)``, ``k`` at the
    cell faces) give a symmetric tridiagonal system, solved by
    ``lax.linalg.tridiagonal_solve`` (O(num_nodes) per value; autodiff
    differentiates through the solve). Data: ``u`` at ``num_observations``
    equally spaced interior nodes plus ``N(0, noise_sd²)`` noise
    (``max u ≈ 0.125`` for ``k = 1``), simulated from ``θ_true ~ N(0, 0.5² I)``
    drawn with ``np.random.default_rng(seed)``. Prior: ``θ ~ N(0, I)``.
    Reference: quadrature for ``d <= 3``; for more, ``mean``/``cov`` are None:
    use :func:`mala_reference`.

    Args:
      num_coefficients: ``d >= 1``, the zones.
      num_nodes: interior nodes, ``>= max(2, d)``.
      num_observations: observed nodes, in ``[1, num_nodes]``, distinct after
        rounding.
      noise_sd: the observation noise, ``> 0``.
      seed: the NumPy seed of ``θ_true`` and the data.
      quadrature_spacing: the spacing ``Δ`` of the reference quadrature.
      quadrature_half_width: its half-width ``a`` (the grid is ``[-a, a]^d`` in
        ``z``).

    Returns:
      The :class:`InverseProblem` (autodiff gradient).

    Raises:
      ValueError: a setting out of range.
    """
    d = check_int(num_coefficients, "num_coefficients", minimum=1)
    num_nodes = check_int(num_nodes, "num_nodes", minimum=max(2, d))
    num_observations = check_int(
        num_observations, "num_observations", minimum=1, maximum=num_nodes
    )
    check_positive(noise_sd, "noise_sd")
    obs_idx = np.unique(
        np.round(np.linspace(0, num_nodes - 1, num_observations + 2)[1:-1]).astype(
            np.int32
        )
    )
    if obs_idx.size != num_observations:
        raise ValueError(
            f"num_observations must leave distinct nodes; got {num_observations} of "
            f"{num_nodes}."
        )
    rng = np.random.default_rng(seed)
    theta_true = 0.5 * rng.standard_normal(d)
    with jax.enable_x64(True):
        clean = np.asarray(
            jax.jit(_darcy_solve, static_argnums=(1, 2))(
                jnp.asarray(theta_true), num_nodes, tuple(obs_idx)
            )
        )
    y = clean + noise_sd * rng.standard_normal(num_observations)
    log_c = -0.5 * num_observations * math.log(
        2 * math.pi * noise_sd**2
    ) - 0.5 * d * math.log(2 * math.pi)

    def forward_fn(theta):
        return _darcy_solve(jnp.asarray(theta), num_nodes, obs_idx)

    def logpost(theta):
        r = (jnp.asarray(y, theta.dtype) - forward_fn(theta)) / noise_sd
        return -0.5 * jnp.sum(r**2) - 0.5 * jnp.sum(theta**2) + log_c

    def simulate(rng_key, theta):
        theta = jnp.asarray(theta)
        return forward_fn(theta) + noise_sd * jax.random.normal(
            rng_key, (num_observations,), theta.dtype
        )

    data = dict(
        nodes=(np.arange(num_nodes) + 1) / (num_nodes + 1),
        observed_nodes=obs_idx,
        observations=y,
        noise_sd=noise_sd,
        seed=seed,
    )
    names = tuple(f"log_k{j}" for j in range(d))
    return _assemble(
        f"darcy_flow_{d}d",
        names,
        logpost,
        forward_fn,
        simulate,
        theta_true,
        y,
        data,
        quadrature_spacing=quadrature_spacing,
        quadrature_half_width=quadrature_half_width,
    )


#: The problems by name, with their defaults: ``PROBLEMS["sir"]()``.
PROBLEMS = {
    "sir": sir_epidemic,
    "sir_black_box": sir_epidemic_black_box,
    "darcy": darcy_flow,
}
