"""A warm-up for the unadjusted and ensemble samplers: ``cj.langevin_warmup``.

It is to LMC and CEnLMC what ``window_adaptation`` is to MH. LMC and CEnLMC have
no acceptance rate to aim at: their step size comes from the curvature
(:func:`cenlmc_jax.adaptation.step_size.langevin_step_size`: the step at which
ULA inflates the variance of the stiffest Gaussian direction by ``bias``). On a
badly scaled posterior that step is tiny and the chain does not move in the wide
directions (kidiq on the raw scale: benchmarks/results/langevin_warmup.md). The
warm-up estimates a preconditioner ``M`` with which the curvature, measured in
the whitened coordinates ``y = L⁻¹(x − m)`` (``M = L Lᵀ``), is about 1, and hands
over:

* ``sampler="lmc"``: ``cj.lmc(logdensity_fn, h, inverse_mass_matrix=M)``;
* ``sampler="cenlmc"``: ``cj.whitened(cj.cenlmc, logdensity_fn, h, η, R1, R2, N*,
  M_f, inverse_mass_matrix=M, mean=m)`` with the parameters of
  :func:`cenlmc_jax.ensemble.tuning.suggest_cenlmc_params` for ``d``, ``h``, the
  whitened curvature and the ensemble size. (:func:`cenlmc_jax.ensemble.tune_cenlmc`
  can be run in ``y`` on top: ``cj.tune_cenlmc(key, whiten_logdensity(logdensity_fn,
  w), w.to_y(positions), h, L=c)`` with ``w = cj.ensemble.whitened.whitening(M, m)``;
  it is not wired in here.) The suggestion is made for ``L = c̄`` (the mean whitened
  curvature) and ``μ = min(1, c̄)``: in ``y`` the covariance is about ``I``, the
  Gaussian proxy ``N(y*, I/μ)`` of the suggestion with ``μ = 1``.

Start (``start="laplace"``, the default): the Laplace approximation at the mode, or
the given positions where it does not describe the posterior's bulk
(:mod:`cenlmc_jax.adaptation.start`, whose module docstring says when and why). The
LMC windows below then start in the coordinates ``y`` it gives (``M₀ = H⁻¹``, or
nutpie's diagonal over the positions); from ``start="positions"`` (``M₀ = I``) the
windows have to find the scale from the ensemble alone, which works from a start whose
curvature is not far above the posterior's.

Schedule (Stan's windows, :func:`cenlmc_jax.adaptation.mass_matrix.build_schedule`):
an initial buffer, slow windows that double in length, a final buffer. Every step
is preconditioned LMC on the whole ensemble,
``x' = x + h M ∇log π(x) + sqrt(2h) M^{1/2} ξ`` (also for ``sampler="cenlmc"``:
the warm-up needs the ensemble's moments, and the gradient step is the one whose
bias is known). During a slow window the positions of all ``N`` particles at every
step go into one Welford accumulator (over the ensemble and over time, Chan et
al.'s batch update); at the window's end::

    M = n/(n + 5) S + 10⁻³ · 5/(n + 5) I    (Stan's regularisation,
                                              n = N × window length),
    m = the window's mean,
    c_i = λ_max(Lᵀ ∇²(−log π)(x_i) L)       by power iteration at
                                              ``curvature_points`` particles x_i
                                              (cj.adaptation.max_curvature),
    h = min(2 bias / ((1 + bias) c̄), 1 / c_max)
                                             (c̄ the mean of the c_i, c_max
                                              their maximum),

``S`` the window's sample covariance (dense, or its diagonal). Each window thus
starts in coordinates whitened by the previous one: a direction the previous
estimate made too narrow is wide in ``y``, where it does not limit ``h`` (the
stiff, well-estimated directions do, with curvature about 1), so the ensemble
spreads into it within the next window, which is twice as long. After the final
buffer the curvature is measured once more at the final positions (pooled with the
last: the mean of the two means, the larger maximum) and ``h`` is not raised. A
window whose run produced a non-finite particle is run again from its start with
``h`` halved (at most ``max_retries`` times; the info lists it). ``M`` and ``m``
are then frozen: the sampler that is handed over keeps them fixed
(cenlmc_jax/ensemble/whitened.py says why refreshing them would bias the ensemble
estimate).

Step size. :func:`cenlmc_jax.adaptation.step_size.langevin_step_size` is exact for
a Gaussian: ULA at ``h`` inflates the variance of a direction of curvature ``λ`` by
``hλ/2 / (1 − hλ/2)``. On a non-Gaussian posterior the curvature varies over it,
and ULA's O(h) bias is an expectation over the target, so the bias rule takes the
mean ``c̄`` over the ensemble; the maximum enters through the stability limit
``2 / c`` of ULA at the stiffest point, with a factor 2 of margin
(``h c_max <= 1``). On garch11 (raw scale) the whitened curvature over the warm-up
particles has a long upper tail: the rule at the maximum of 16 points gave a step
too small to mix in the default run (R-hat well above 1.1), the rule at the mean a
larger one (benchmarks/results/langevin_warmup.md and cli_posteriordb.md).

Relaxation (``info.relaxation_steps``): over the final buffer, ``ρ_k`` = the
largest correlation, over the ensemble, of a whitened coordinate at the buffer's
start and ``k`` steps later (``k ≈ 1/h`` and the buffer's length);
``τ = −k / log ρ_k`` steps per e-fold (``1 / (hλ)`` for a Gaussian direction of
whitened curvature ``λ``), rescaled to the final ``h`` (:func:`_relaxation`). The
integrated autocorrelation time is about ``2τ``: a run of ``T`` steps has about
``T / (2τ)`` effective draws per particle, which is what the split R-hat over
particles needs (the CLI sets its default run length from it:
cenlmc_jax.cli.jobs.default_steps).

Cost (``info``): ``grad_evals``, the gradients of the LMC steps (``N`` per step,
retries included, and ``N`` at the start); ``hvp_evals``, the Hessian-vector
products of the curvature estimates (``curvature_points × (curvature_iters + 1)``
per estimate, each one ``jax.jvp`` of the gradient); and for CEnLMC the L-BFGS
iterations of ``f*`` (none after a Laplace start: its mode's ``f`` is ``f*``, the
same in ``y`` since ``whiten_logdensity`` drops no ``x``-dependent term).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from cenlmc_jax._keys import split_keys
from cenlmc_jax._validation import (
    check_bool,
    check_choice,
    check_int,
    check_key,
    check_logdensity,
    check_positions,
    check_positive,
    point_like,
)
from cenlmc_jax.adaptation.adjusted import STEP_JITTER, adjusted_phase
from cenlmc_jax.adaptation.kinetic import fit_dtype, kinetic_phase
from cenlmc_jax.adaptation.mass_matrix import (
    build_schedule,
    welford_covariance,
    welford_init,
    welford_update,
)
from cenlmc_jax.adaptation.start import (
    LAPLACE_MAX_D,
    choose_start,
    metric_condition,
    valid_starts,
)
from cenlmc_jax.adaptation.step_size import langevin_step_size, max_curvature
from cenlmc_jax.base import SamplingAlgorithm
from cenlmc_jax.diagnostics import nested
from cenlmc_jax.ensemble.cenlmc import cenlmc
from cenlmc_jax.ensemble.f_star import with_gradient
from cenlmc_jax.ensemble.lmc import lmc, lmc_init, lmc_move, mass_root
from cenlmc_jax.ensemble.tuning import find_f_star, suggest_cenlmc_params
from cenlmc_jax.ensemble.whitened import (
    Whitening,
    whiten_grad_fn,
    whiten_logdensity,
    whitened,
    whitening,
)
from cenlmc_jax.gradients.ensemble import check_grad_fn, gradient_fn
from cenlmc_jax.gradients.modes import check_grad_mode
from cenlmc_jax.irreversible.autostep import autostep_hmc
from cenlmc_jax.irreversible.hmc import hmc
from cenlmc_jax.irreversible.mala import mala
from cenlmc_jax.run import vmap_chains
from cenlmc_jax.types import LogDensityFn, PRNGKey

__all__ = [
    "LangevinWarmup",
    "LangevinWarmupInfo",
    "langevin_warmup",
    "DENSE_MAX_D",
    "DENSE_MAX_D_EXACT",
    "LAPLACE_MAX_D",
    "two_step_mala",
]

#: The exact samplers the warm-up can hand over (its default first).
EXACT = ("hmc", "mala")
#: ``dense=None`` estimates a dense ``M`` up to this dimension, a diagonal one above it.
DENSE_MAX_D = 50
#: ``dense=None`` with an exact sampler (``"hmc"``, ``"mala"``): dense up to this
#: dimension. Its cost is a ``(d, d)`` product per particle and step, small beside a
#: gradient at these sizes, and a diagonal ``M`` leaves a rotated badly scaled
#: posterior badly scaled (issue 29's 100-d Gaussian of condition 10⁴).
DENSE_MAX_D_EXACT = 200


class LangevinWarmupInfo(NamedTuple):
    """What :func:`langevin_warmup` chose and what it cost.

    Attributes:
      step_size: ``h`` handed over (in the whitened coordinates; for LMC the same
        number).
      curvature: the whitened curvature ``c`` that set it
        (``h = 2 bias / ((1 + bias) c)``).
      bias: the stated discretisation bias (variance inflation of the stiffest
        direction).
      condition_number: of ``M`` (the ratio of its extreme eigenvalues), how badly
        scaled the target was.
      windows: one dict per segment: ``start, length, slow, step_size, curvature,
        retries`` (and, after a slow window, ``condition_number`` of the new ``M``).
      grad_evals: gradients of the LMC steps (``N`` per step and at the start,
        retries included).
      hvp_evals: Hessian-vector products of the curvature estimates and of the
        Laplace start's Hessian.
      start: ``"laplace"`` or ``"positions"`` (what the warm-up started from).
      lbfgs_steps: the mode search's sequential passes: Newton's method's
        gradient-and-Hessian and batched value passes (``d <=`` :data:`NEWTON_MAX_D`),
        or L-BFGS's iterations (each one or more gradients: optax's zoom line search)
        and its Hessian passes.
      cenlmc: for ``sampler="cenlmc"``, the chosen ``eta, r1, r2, n_star, m_f,
        f_star`` and the suggestion's figures: ``expected_ensemble_fraction``,
        ``f_star_lbfgs_steps``, ``reasoning``; None for LMC.
      reasoning: a readable account of the choices.
      curvature_max: the largest whitened curvature seen at the curvature points
        (``h <= 1 / curvature_max``).
      relaxation_steps: steps per e-fold of the slowest whitened coordinate at
        ``h``, measured over the final buffer (:func:`_relaxation`; module
        docstring); the integrated autocorrelation time is about twice it on a
        Gaussian, more on a skewed posterior such as garch11's
        (cenlmc_jax.cli.jobs.default_steps).
      sequential_grads: gradient evaluations one particle waited for, in order:
        the mode search's passes (``lbfgs_steps``, the Hessian's included), and one
        per warm-up step (the curvature
        estimates' Hessian-vector products not counted: ``hvp_evals``).
      acceptance_rate: for ``sampler="hmc"`` or ``"mala"``, the mean acceptance at the
        handed-over step size (the last tuning round's); NaN for LMC/CEnLMC.
      trajectory: for the exact samplers, the ensemble's moments along the warm-up:
        ``(sequential_grads, E[x], E[x²])`` (``(d,)`` float64 each) after the Laplace
        start (and after its resampling), after each of the kinetic phase's first
        ``RECORD_EVERY_STEP`` steps, then every ``check_every`` steps, and after every
        tuning round, to
        see (or measure) how fast it converged; None for LMC/CEnLMC.
    """

    step_size: float
    curvature: float
    bias: float
    condition_number: float
    windows: list
    grad_evals: int
    hvp_evals: int
    start: str
    lbfgs_steps: int
    cenlmc: dict | None
    reasoning: str
    curvature_max: float = float("nan")
    relaxation_steps: float = float("nan")
    sequential_grads: int = -1
    acceptance_rate: float = float("nan")
    trajectory: list | None = None


class LangevinWarmup(NamedTuple):
    """What :func:`langevin_warmup` returns.

    Attributes:
      algorithm: the tuned sampler (``cj.hmc(..., inverse_mass_matrix=M)`` over the
        chains, with a shorter step now and then where a few particles were stuck at
        its step, or ``cj.autostep_hmc`` where at least 1 % were;
        ``cj.mala(..., inverse_mass_matrix=M)``, or :func:`two_step_mala` where
        particles were stuck at its ``h``;
        ``cj.lmc(..., inverse_mass_matrix=M)`` or ``cj.whitened(cj.cenlmc, ...)``).
      state: where sampling starts (``cj.sample(key, algorithm, state, ...)``):
        ``algorithm.init(positions)``, except for the exact samplers with superchains
        (``parameters["superchain_size"] > 1``), where it starts ``N / M`` points of
        ``positions``, pushed out 1.2x from their mean, each ``M`` times
        (:func:`cenlmc_jax.diagnostics.nested.superchain_starts`).
      positions: the ensemble after the warm-up, ``(N, d)``, in the original
        coordinates.
      parameters: ``step_size``, ``inverse_mass_matrix`` (``(d,)`` or ``(d, d)``,
        float64), ``mean``; for HMC ``num_integration_steps``, ``step_jitter`` and
        ``autostep`` (whether ``cj.autostep_hmc`` was handed over); with a few stuck
        particles ``small_step_size`` and ``small_step_probability`` (HMC's
        ``small_step``, :func:`two_step_mala`'s); for CEnLMC ``eta, r1,
        r2, n_star, m_f, f_star``: enough to rebuild ``algorithm``.
      info: :class:`LangevinWarmupInfo`.
    """

    algorithm: SamplingAlgorithm
    state: Any
    positions: Any
    parameters: dict
    info: LangevinWarmupInfo


_STATIC = ("logdensity_fn", "grad_fn", "grad_mode")


@partial(jax.jit, static_argnames=_STATIC)
def _window_run(key, state, m, root, h, n, probe, logdensity_fn, grad_fn, grad_mode):
    """``n`` preconditioned LMC steps (a traced length: one compiled program for every
    window), the positions of every step accumulated, and the positions after
    ``probe`` steps (for :func:`_relaxation`): ``(state, welford, diverged,
    snapshot)``. The model is a static argument: a second warm-up of the same
    function reuses the compilation.
    """

    def body(t, carry):
        st, wf, bad, snap = carry
        st, info = lmc_move(
            jax.random.fold_in(key, t),
            st,
            logdensity_fn,
            h,
            grad_fn,
            grad_mode,
            (m, root),
        )
        snap = jnp.where(t == probe - 1, st.position, snap)
        return st, welford_update(wf, st.position), bad | info.diverged, snap

    x = state.position
    wf = welford_init(x.shape[1], m.ndim == 2, x.dtype)
    return lax.fori_loop(0, n, body, (state, wf, jnp.asarray(False), x))


def _window_runner(logdensity_fn, grad_fn, grad_mode):
    """:func:`_window_run` with the model bound."""
    return partial(
        _window_run, logdensity_fn=logdensity_fn, grad_fn=grad_fn, grad_mode=grad_mode
    )


@partial(jax.jit, static_argnames=(*_STATIC, "iters"))
def _curvature_run(key, y, factor, mean, logdensity_fn, grad_fn, grad_mode, iters):
    """``λ_max(y_i)`` per point: :func:`max_curvature` of ``−log π`` in ``y`` at each
    of the points ``y`` (``(C,)``), with ``L`` and ``m`` traced.
    """
    w = Whitening(None, mean, factor, None)  # to_x and grad_to_y only: traced L, m
    grad_y = gradient_fn(
        whiten_logdensity(logdensity_fn, w), whiten_grad_fn(grad_fn, w), grad_mode
    )

    def one(k, z):
        return max_curvature(lambda _, u: grad_y(u), z[None], k, num_iters=iters)

    return jax.vmap(one)(jax.random.split(key, y.shape[0]), y)


def _curvature_runner(logdensity_fn, grad_fn, grad_mode, iters):
    """:func:`_curvature_run` with the model bound: one compiled program for every
    window and every call with the same model.
    """
    return partial(
        _curvature_run,
        logdensity_fn=logdensity_fn,
        grad_fn=grad_fn,
        grad_mode=grad_mode,
        iters=iters,
    )


class _Curvature(NamedTuple):
    """The whitened curvature at the curvature points: ``mean`` (sets ``h`` for the
    bias), ``max`` (stability).
    """

    mean: float
    max: float


def _curvature(run, key, x, m_mat, mean, points, iters):
    """``(_Curvature, hvps)``: :func:`_curvature_runner`'s ``run`` at ``points`` evenly
    spaced particles of ``x``.
    """
    w = whitening(m_mat, mean)
    idx = np.linspace(0, x.shape[0] - 1, min(points, x.shape[0])).round().astype(int)
    dt = x.dtype
    lam = np.asarray(
        run(key, w.to_y(x[idx]), jnp.asarray(w.factor, dt), jnp.asarray(w.mean, dt)),
        np.float64,
    )
    return _Curvature(float(np.mean(lam)), float(np.max(lam))), len(idx) * (iters + 1)


def _step(c: _Curvature, bias: float) -> float:
    """``h = min(2 bias / ((1 + bias) c̄), 1 / c_max)``: the bias rule at the mean
    curvature ``c̄`` over the ensemble (ULA's O(h) bias is an average over the target,
    not its worst point), and at most half of ULA's stability limit ``2 / c_max`` at the
    stiffest point seen (module docstring, "Step size").
    """
    if not (math.isfinite(c.mean) and c.mean > 0):
        # a piecewise-linear log density (a Laplace or L1 term): its Hessian vanishes
        # almost everywhere, so the bias rule has nothing to go on, and an unadjusted
        # sampler's bias at a kink is not bounded by it
        raise ValueError(
            "the warm-up measured a curvature of the log density of "
            f"{c.mean!r} at the particles (a piecewise-linear or flat log density, "
            "e.g. a Laplace/L1 term): the Langevin step-size rule needs a positive "
            "curvature. Use an exact sampler (cj.window_adaptation('mala', ...) or "
            "'rwmh'), or smooth the kink."
        )
    return min(langevin_step_size(c.mean, bias=bias), 1.0 / c.max)


def _check_args(
    rng_key,
    logdensity_fn,
    positions,
    sampler,
    start,
    num_steps,
    bias,
    dense,
    curvature_points,
    curvature_iters,
    max_retries,
    grad_mode,
):
    check_key(rng_key)
    check_choice(sampler, "sampler", (*EXACT, "lmc", "cenlmc"))
    check_choice(start, "start", ("laplace", "positions"))
    x = check_positions(positions, min_particles=2)
    check_int(
        num_steps,
        "num_steps",
        minimum=20,
        why="a warm-up needs at least one slow window",
    )
    check_positive(bias, "bias")
    if dense is not None:
        check_bool(dense, "dense")
    check_int(curvature_points, "curvature_points", minimum=1)
    check_int(curvature_iters, "curvature_iters", minimum=1)
    check_int(max_retries, "max_retries", minimum=0)
    check_grad_mode(grad_mode)
    return x


def _reporter(progress) -> Callable[[str], None]:
    """``progress`` as a function of one message: stderr lines for True, the user's
    callable, or nothing."""
    if callable(progress):
        return progress
    if progress is True:
        return lambda m: print(f"langevin_warmup: {m}", file=sys.stderr, flush=True)
    if progress is False:
        return lambda m: None
    raise ValueError(
        f"progress must be True, False or a function of one message; got {progress!r}"
    )


def _check_superchains(superchain_size, sampler: str, n: int) -> int:
    """``superchain_size`` checked: None -> the default for ``n`` chains (1 for the
    unadjusted samplers, whose particles interact or must stay distinct)."""
    if sampler not in EXACT:
        if superchain_size not in (None, 1):
            raise ValueError(
                f"superchain_size={superchain_size!r} is for sampler='hmc' or 'mala' "
                "(the "
                f"handed-over chains); sampler={sampler!r} hands over an ensemble of "
                "distinct particles."
            )
        return 1
    if superchain_size is None:
        return nested.default_superchain_size(n)
    if superchain_size == 1 and not isinstance(superchain_size, bool):
        return 1
    nested._check_size(superchain_size, n)
    return int(superchain_size)


def langevin_warmup(
    rng_key: PRNGKey,
    logdensity_fn: LogDensityFn,
    positions: Any,
    *,
    sampler: str = "hmc",
    start: str = "laplace",
    num_steps: int = 1000,
    bias: float = 0.05,
    dense: bool | None = None,
    initial_buffer: int = 75,
    first_window: int = 25,
    final_buffer: int = 50,
    curvature_points: int = 16,
    curvature_iters: int = 30,
    max_retries: int = 5,
    grad_fn: Callable | None = None,
    grad_mode: str = "auto",
    f_star: float | None = None,
    superchain_size: int | None = None,
    progress: bool | Callable[[str], None] = False,
    **sampler_kwargs: Any,
) -> LangevinWarmup:
    """Warm up an ensemble and tune an exact sampler (HMC, the default, or MALA), LMC
    or CEnLMC on it (see the module docstring).

    Args:
      rng_key: the warm-up's key.
      logdensity_fn: ``x: (d,) -> log π(x) + const``.
      positions: the ensemble, ``(N, d)`` with ``N >= 2``.
      sampler: the sampler handed over: ``"hmc"`` (the default: the kinetic phase,
        then HMC with ``ε``, ``L`` and ``M`` tuned on the ensemble and frozen,
        :mod:`cenlmc_jax.adaptation.adjusted`), ``"mala"`` (the same with one-step
        MALA), ``"lmc"`` or ``"cenlmc"`` (the windows below; biased by design).
      start: ``"laplace"`` (default: the mode's Laplace approximation, module
        docstring) or ``"positions"``.
      num_steps: warm-up steps (>= 20), split by Stan's schedule
        (``initial_buffer``, ``first_window``, ``final_buffer``; shrunk to 15% /
        75% / 10% when they do not fit).
      bias: the discretisation bias asked for: ULA's inflation of the variance of
        the stiffest whitened direction (0.05: its sd 2.5% too large; the others
        less).
      dense: a dense ``M`` (True) or a diagonal one (False); None: dense for
        ``d <=`` :data:`DENSE_MAX_D`.
      initial_buffer: the schedule's first fast segment.
      first_window: the schedule's first slow window.
      final_buffer: the schedule's last fast segment.
      curvature_points: particles of each curvature estimate.
      curvature_iters: power iterations of each curvature estimate.
      max_retries: reruns of a window that diverged, each with ``h`` halved.
      grad_fn: the gradient, as for ``cj.lmc`` (a user's ``x: (d,) -> ∇ log π`` is
        mapped to ``y`` where needed).
      grad_mode: as for ``cj.lmc``.
      f_star: CEnLMC's ``f* = min f`` (None: L-BFGS in ``y``, its iterations
        reported).
      superchain_size: the exact samplers: chains per superchain of the hand-over,
        ``M`` (:mod:`cenlmc_jax.diagnostics.nested`): ``N / M`` points of the final
        ensemble, each repeated ``M`` times, so that nested R-hat can tell whether the
        chains have forgotten their starts. None:
        :func:`~cenlmc_jax.diagnostics.nested.default_superchain_size` (16 for 1,024
        chains; 1, none, below 16 chains); 1: every chain starts at its own particle.
      progress: report each phase as it ends (the start, each kinetic round, the
        adjusted phase, the hand-over; the windows of LMC/CEnLMC): True prints a line
        to stderr (a notebook shows it under the cell), a callable gets each line
        (``progress(message)``); the first line comes before the first program is
        compiled, so a long compile is not mistaken for a hang.
      **sampler_kwargs: passed to ``cj.cenlmc`` (``min_ball_neighbours``,
        ``options``, ``audit_size``, ...).

    Returns:
      A :class:`LangevinWarmup`; ``info`` says what was chosen and what it cost.

    Raises:
      ValueError: a bad argument (the positions, a count, ``sampler`` or
        ``start``), or CEnLMC options with ``sampler="lmc"``.
    """
    x = _check_args(
        rng_key,
        logdensity_fn,
        positions,
        sampler,
        start,
        num_steps,
        bias,
        dense,
        curvature_points,
        curvature_iters,
        max_retries,
        grad_mode,
    )
    sc_size = _check_superchains(superchain_size, sampler, x.shape[0])
    report = _reporter(progress)
    x = valid_starts(jax.random.fold_in(rng_key, 17), logdensity_fn, x)
    if sampler != "cenlmc" and (sampler_kwargs or f_star is not None):
        raise ValueError(
            f"sampler={sampler!r} takes no CEnLMC options (f_star, "
            f"{', '.join(sampler_kwargs) or 'sampler keywords'}); use sampler='cenlmc' "
            "for them."
        )
    n, d = x.shape
    if dense is None:
        dense = d <= (DENSE_MAX_D_EXACT if sampler in EXACT else DENSE_MAX_D)
    keys = iter(split_keys(rng_key, 64))

    report(
        f"{n} particles, d = {d}: "
        + ("searching for the mode (Laplace start)" if start == "laplace" else "start")
    )
    if sampler in EXACT:
        # the checks of lmc_init without its eager pass of the model (it would
        # compile each of the model's operations on its own): the start phase's
        # jitted values (valid_starts, above) have checked the values
        check_logdensity(logdensity_fn, point_like(x))
        check_grad_fn(grad_fn, point_like(x))
    else:
        state = lmc_init(
            x, logdensity_fn, grad_fn=grad_fn, grad_mode=grad_mode
        )  # checks logdensity_fn, grad_fn
    notes = []
    # the Laplace draws' key (none for the given positions: their keys as before)
    k_start = next(keys) if start == "laplace" else None
    st = choose_start(
        k_start, logdensity_fn, grad_fn, grad_mode, x, start, dense, notes
    )
    report(
        "start: "
        + ("the Laplace approximation" if st.started == "laplace" else "the positions")
    )
    if sampler in EXACT:
        return _exact(
            next(keys),
            logdensity_fn,
            st.positions if st.started == "laplace" else x,
            st.inverse_mass_matrix,
            st.mean,
            st.lbfgs_steps,
            st.hvp_evals,
            st.started,
            notes,
            grad_fn,
            grad_mode,
            num_steps,
            sc_size,
            sampler,
            report,
        )
    if st.started == "laplace":
        state = lmc_init(
            st.positions, logdensity_fn, grad_fn=grad_fn, grad_mode=grad_mode
        )
    schedule = build_schedule(num_steps, initial_buffer, first_window, final_buffer)
    return _unadjusted(
        rng_key,
        keys,
        logdensity_fn,
        grad_fn,
        grad_mode,
        state,
        st,
        schedule,
        dict(
            num_steps=num_steps,
            bias=bias,
            max_retries=max_retries,
            curvature_points=curvature_points,
            curvature_iters=curvature_iters,
            dense=dense,
        ),
        sampler,
        f_star,
        sampler_kwargs,
        notes,
        report,
    )


def _unadjusted(
    rng_key,
    keys,
    logdensity_fn,
    grad_fn,
    grad_mode,
    state,
    st,
    schedule,
    opts: dict,
    sampler: str,
    f_star,
    sampler_kwargs: dict,
    notes: list,
    report,
) -> LangevinWarmup:
    """The LMC windows of the module docstring from the start ``st`` (a
    :class:`~cenlmc_jax.adaptation.start.Start`), then LMC or CEnLMC handed over."""
    n = state.position.shape[0]
    bias, max_retries = opts["bias"], opts["max_retries"]
    curvature_points = opts["curvature_points"]
    curvature_iters = opts["curvature_iters"]
    m_mat, mean, hvps = st.inverse_mass_matrix, st.mean, st.hvp_evals
    run = _window_runner(logdensity_fn, grad_fn, grad_mode)
    curv = _curvature_runner(logdensity_fn, grad_fn, grad_mode, curvature_iters)
    measure = lambda s_, mm, mn: _curvature(  # noqa: E731
        curv,
        next(keys),
        s_.position,
        mm,
        mn,
        curvature_points,  # noqa: E731
        curvature_iters,
    )
    c, k = measure(state, m_mat, mean)
    hvps += k
    num_steps = opts["num_steps"]
    report(f"{len(schedule)} windows of preconditioned LMC ({num_steps} steps)")
    state, m_mat, mean, c, h, windows, grads, k, relax = _run_windows(
        run, measure, rng_key, state, m_mat, mean, c, bias, schedule, max_retries
    )
    report(f"windows done: h = {h:.4g}, relaxation {relax:.3g} steps")
    hvps += k
    grads += n * (2 if st.started == "laplace" else 1)
    notes += [
        f"{len(windows)} segments, {num_steps} steps of preconditioned LMC on {n} "
        f"particles; {'dense' if opts['dense'] else 'diagonal'} M with condition "
        f"number {metric_condition(m_mat):.3g}; whitened curvature over "
        f"{min(curvature_points, n)} "
        f"particles: mean {c.mean:.4g}, max {c.max:.4g} -> h = min(bias rule at the "
        f"mean, 1/max) = {h:.4g} for a bias of {bias}; relaxation (the final buffer's "
        f"autocorrelation, at this h) {relax:.3g} steps."
    ]
    positions = state.position
    m_mat, alpha = fit_dtype(m_mat, positions.dtype)
    if alpha:
        notes.append(
            f"M's correlations shrunk by {alpha:.3g} towards its diagonal so that "
            f"{jnp.dtype(positions.dtype).name} can factor it (fit_dtype)."
        )
    params = dict(step_size=h, inverse_mass_matrix=m_mat, mean=mean)
    if sampler == "lmc":
        algo = lmc(
            logdensity_fn,
            h,
            inverse_mass_matrix=m_mat,
            grad_fn=grad_fn,
            grad_mode=grad_mode,
        )
        out_state, extra = algo.init(positions), None
    else:
        f_star = st.f_mode if f_star is None else f_star
        algo, out_state, extra = _cenlmc(
            logdensity_fn,
            positions,
            h,
            c.mean,
            m_mat,
            mean,
            f_star,
            grad_fn,
            grad_mode,
            sampler_kwargs,
            notes,
        )
        params.update(
            {k: extra[k] for k in ("eta", "r1", "r2", "n_star", "m_f", "f_star")}
        )
    info = LangevinWarmupInfo(
        h,
        c.mean,
        float(bias),
        metric_condition(m_mat),
        windows,
        grads,
        hvps,
        st.started,
        st.lbfgs_steps,
        extra,
        "\n".join(notes),
        c.max,
        relax,
        # the mode search (its Hessian passes included), the LMC steps (retries
        # included)
        sequential_grads=st.lbfgs_steps + grads // n,
    )
    return LangevinWarmup(algo, out_state, positions, params, info)


def _run_windows(
    run, measure, rng_key, state, m_mat, mean, c, bias, schedule, max_retries
):
    """The schedule's segments; after each slow window ``M``, ``m``, the curvature and
    ``h`` anew; at the end the curvature once more (pooled with the last) and the
    relaxation time of the final buffer (:func:`_relaxation`).

    Returns ``(state, M, m, curvature, h, windows, grads, hvps, relaxation_steps)``.
    """
    n = state.position.shape[0]
    h, grads, hvps, windows, begin = _step(c, bias), 0, 0, [], 0
    for t, (length, slow, ends) in enumerate(schedule):
        root = mass_root(m_mat)
        start = state.position
        for retry in range(max_retries + 1):
            dt = state.position.dtype
            probe = int(
                min(length, max(1, round(1.0 / h)))
            )  # ~1 e-fold of a whitened direction of curvature 1
            out, wf, bad, snap = run(
                jax.random.fold_in(rng_key, t * (max_retries + 1) + retry),
                state,
                jnp.asarray(m_mat, dt),
                jnp.asarray(root, dt),
                jnp.asarray(h, dt),
                length,
                probe,
            )
            grads += n * length
            if not bool(bad):
                break
            h *= 0.5
        else:
            raise RuntimeError(
                f"langevin_warmup: window {t} (steps {begin}..{begin + length - 1}) "
                f"diverged {max_retries + 1} times, the last at h = {2 * h:.3g}: the "
                "log density or its gradient is not finite where the chain goes; "
                "check the model or the start. A log density must be finite wherever "
                "the target has mass; an unadjusted sampler (LMC, CEnLMC) also steps "
                "out of a support bounded by -inf: sample an unconstrained transform "
                "of the parameters (a positive one through its log, an interval "
                "through a logit), or warm up the exact default (sampler='hmc'), "
                "which rejects a step outside the support."
            )
        last = (start, snap, probe, h)
        state = out
        record = dict(
            start=begin,
            length=length,
            slow=slow,
            step_size=h,
            curvature=c.mean,
            curvature_max=c.max,
            retries=retry,
        )
        begin += length
        if ends:
            m_mat = fit_dtype(np.asarray(welford_covariance(wf), np.float64), dt)[0]
            mean = np.asarray(wf.mean, np.float64)
            c, k = measure(state, m_mat, mean)
            hvps += k
            h = _step(c, bias)
            record["condition_number"] = metric_condition(m_mat)
        windows.append(record)
    c_end, k = measure(state, m_mat, mean)
    hvps += k
    c = _Curvature(0.5 * (c.mean + c_end.mean), max(c.max, c_end.max))
    h_end = min(h, _step(c, bias))
    start, snap, probe, h_last = last
    steps = (
        _relaxation(
            start, [(snap, probe), (state.position, windows[-1]["length"])], m_mat, mean
        )
        * h_last
        / h_end
    )
    return state, m_mat, mean, c, h_end, windows, grads, hvps, steps


def _relaxation(x0, later: list, m_mat, mean) -> float:
    """Steps per e-fold of the slowest whitened coordinate: ``−k / log ρ_k``, ``ρ_k``
    the largest correlation over the ensemble between a whitened coordinate at ``x0``
    and ``k`` steps later (``later``: ``(x_k, k)`` pairs; the largest of their estimates
    with ``max(0.05, 4/sqrt(N)) <= ρ_k <= 0.95``, where the correlation's error ``(1 −
    ρ²)/sqrt(N)`` is small against ``ρ`` and ``1 − ρ``; none such: the longest lag's,
    ``ρ`` clipped to ``[0.02, 0.999]``, a bound).

    For ULA on a Gaussian direction of curvature ``λ`` (in ``y``) the lag ``k``
    correlation is ``(1 − hλ)^k``, so this is ``−1 / log(1 − hλ) ≈ 1 / (hλ)``, and the
    integrated autocorrelation time is ``(1 + ρ₁)/(1 − ρ₁) ≈ 2`` times it.
    """
    w = whitening(m_mat, mean)

    def rho(x1):
        y0, y1 = (np.asarray(w.to_y(v), np.float64) for v in (x0, x1))
        y0, y1 = y0 - y0.mean(0), y1 - y1.mean(0)
        r = np.sum(y0 * y1, 0) / np.sqrt(np.sum(y0**2, 0) * np.sum(y1**2, 0))
        return float(np.max(np.nan_to_num(r, nan=1.0)))

    est = [(rho(x1), k) for x1, k in later]
    low = max(
        0.05, 4.0 / math.sqrt(np.shape(x0)[0])
    )  # 4 sd of a zero correlation above 0
    good = [-k / math.log(r) for r, k in est if low <= r <= 0.95]
    if good:
        return max(good)
    r, k = max(est, key=lambda e: e[1])
    return -k / math.log(float(np.clip(r, 0.02, 0.999)))


def _cenlmc(
    logdensity_fn,
    positions,
    h,
    c,
    m_mat,
    mean,
    f_star,
    grad_fn,
    grad_mode,
    kwargs,
    notes,
):
    """CEnLMC's suggested parameters in ``y``.

    ``f*`` by L-BFGS in ``y`` when not given.
    """
    n, d = positions.shape
    w = whitening(m_mat, mean)
    lbfgs = 0
    if f_star is None:
        res = find_f_star(whiten_logdensity(logdensity_fn, w), w.to_y(positions))
        f_star, lbfgs = float(res.f_star), int(res.num_steps)
    s = suggest_cenlmc_params(
        d, h, L=c, mu=min(1.0, c), num_particles=n
    )  # in y: covariance ~ I, mu ~ 1
    p = dict(eta=s.eta, r1=s.r1, r2=s.r2, n_star=s.n_star, m_f=s.m_f)
    algo = whitened(
        cenlmc,
        logdensity_fn,
        h,
        p["eta"],
        p["r1"],
        p["r2"],
        p["n_star"],
        p["m_f"],
        f_star=f_star,
        inverse_mass_matrix=m_mat,
        mean=mean,
        grad_fn=grad_fn,
        grad_mode=grad_mode,
        **kwargs,
    )
    notes.append(
        f"CEnLMC in y (suggested): eta={p['eta']:.4g}, R1={p['r1']:.4g}, "
        f"R2={p['r2']:.4g}, N*={p['n_star']}, M_f={p['m_f']:.3g}, f*={f_star:.6g}; "
        f"expected ensemble fraction {s.expected_ensemble_fraction:.2f}."
    )
    extra = dict(
        p,
        f_star=f_star,
        expected_ensemble_fraction=float(s.expected_ensemble_fraction),
        f_star_lbfgs_steps=lbfgs,
        reasoning=s.reasoning,
    )
    return algo, algo.init(positions), extra


def _exact(
    key,
    logdensity_fn,
    positions,
    m_mat,
    mean,
    lbfgs,
    hvps,
    started,
    notes,
    grad_fn,
    grad_mode,
    num_steps,
    superchain_size,
    kernel,
    report,
) -> LangevinWarmup:
    """``sampler="hmc"`` or ``"mala"``: the kinetic phase
    (:mod:`cenlmc_jax.adaptation.kinetic`), the adjusted one
    (:mod:`cenlmc_jax.adaptation.adjusted`), and the adjusted kernel with every
    parameter frozen, started in superchains (``superchain_size`` chains from each of
    ``N / M`` points of the final ensemble:
    :func:`cenlmc_jax.diagnostics.nested.superchain_starts`).
    """
    n, d = positions.shape
    k_kin, k_adj, k_sc = split_keys(key, 3)
    kin = kinetic_phase(
        k_kin,
        logdensity_fn,
        positions,
        np.asarray(m_mat, np.float64),
        np.asarray(mean, np.float64),
        grad_fn=grad_fn,
        grad_mode=grad_mode,
        max_kinetic_steps=num_steps,
        laplace=started == "laplace",
        report=report,
    )
    adj = adjusted_phase(
        k_adj,
        logdensity_fn,
        kin.positions,
        kin.inverse_mass_matrix,
        kin.mean,
        kin.step_size,
        kernel=kernel,
        grad_fn=grad_fn,
        grad_mode=grad_mode,
        report=report,
    )
    notes += kin.notes + adj.notes
    # a user's gradient reaches the handed-over kernel as the derivative of the model
    target = logdensity_fn if grad_fn is None else with_gradient(logdensity_fn, grad_fn)
    m_fin = kin.inverse_mass_matrix
    if kernel == "hmc" and adj.autostep:
        one = autostep_hmc(
            target,
            adj.step_size,
            adj.num_integration_steps,
            inverse_mass_matrix=m_fin,
            step_jitter=STEP_JITTER,
            grad_mode=grad_mode,
        )
    elif kernel == "hmc":
        one = hmc(
            target,
            adj.step_size,
            adj.num_integration_steps,
            inverse_mass_matrix=m_fin,
            step_jitter=STEP_JITTER,
            small_step=adj.small_step,
            grad_mode=grad_mode,
        )
    else:
        one = two_step_mala(
            target,
            adj.step_size,
            adj.small_step,
            inverse_mass_matrix=m_fin,
            grad_mode=grad_mode,
        )
    algo = vmap_chains(one)
    offset = lbfgs + 1
    seq = offset + kin.kinetic_steps + adj.gradients + 1
    trajectory = [(offset + k, m1, m2) for k, m1, m2 in kin.trajectory] + [
        (offset + kin.kinetic_steps + k, m1, m2) for k, m1, m2 in adj.trajectory
    ]
    info = LangevinWarmupInfo(
        step_size=adj.step_size,
        curvature=float("nan"),
        bias=0.0,
        condition_number=metric_condition(m_fin),
        windows=kin.rounds,
        grad_evals=n * (kin.kinetic_steps + adj.gradients + 2),
        hvp_evals=hvps,
        start=started,
        lbfgs_steps=lbfgs,
        cenlmc=None,
        reasoning="\n".join(notes),
        relaxation_steps=adj.relaxation_steps,
        sequential_grads=seq,
        acceptance_rate=adj.acceptance_rate,
        trajectory=trajectory,
    )
    params = dict(
        step_size=adj.step_size,
        inverse_mass_matrix=m_fin,
        mean=kin.mean,
        superchain_size=superchain_size,
    )
    if kernel == "hmc":
        params.update(
            num_integration_steps=adj.num_integration_steps,
            step_jitter=STEP_JITTER,
            autostep=adj.autostep,
        )
    if adj.small_step is not None:
        params.update(
            small_step_size=adj.small_step[0], small_step_probability=adj.small_step[1]
        )
    starts = adj.positions
    if superchain_size > 1:
        starts = nested.superchain_starts(
            k_sc, adj.positions, superchain_size, logdensity_fn=logdensity_fn
        )
        info = info._replace(
            reasoning=info.reasoning
            + f"\nhand-over: {n // superchain_size} superchains of {superchain_size} "
            "chains, each started at one particle of the final ensemble pushed out "
            f"{nested.OVERDISPERSION:g}x from its mean (nested R-hat checks that they "
            "forget it)."
        )
    report(
        f"hand-over: {n} chains"
        + (
            f" in {n // superchain_size} superchains of {superchain_size}"
            if superchain_size > 1
            else ""
        )
    )
    return LangevinWarmup(algo, algo.init(starts), adj.positions, params, info)


def two_step_mala(
    logdensity_fn: LogDensityFn,
    step_size: float,
    small_step: tuple | None,
    *,
    inverse_mass_matrix: Any = None,
    grad_mode: str = "auto",
) -> SamplingAlgorithm:
    """MALA (one chain) whose step is ``h_s`` with probability ``p``, else ``h``.

    With ``small_step = (h_s, p)``: at every step the chain draws ``u ~ U(0, 1)`` from
    its key and takes one MALA step of size ``h_s`` if ``u < p``, else of size ``h``.
    Both MALA kernels leave ``π`` invariant and the choice does not depend on the
    state, so the mixture does too (Tierney 1994). The exact warm-up hands this over
    when particles were stuck at ``h`` (:mod:`~cenlmc_jax.adaptation.kinetic`, "Stuck
    particles"). ``small_step=None``: :func:`~cenlmc_jax.mala` itself (the same draws
    from the same keys).

    Args:
      logdensity_fn: ``z -> log π(z)``.
      step_size: ``h > 0``.
      small_step: ``(h_s, p)``: the shorter step and its probability, or None.
      inverse_mass_matrix: as for :func:`~cenlmc_jax.mala`.
      grad_mode: as for :func:`~cenlmc_jax.mala`.

    Returns:
      A :class:`~cenlmc_jax.base.SamplingAlgorithm` over one chain.
    """
    base = mala(
        logdensity_fn,
        step_size,
        inverse_mass_matrix=inverse_mass_matrix,
        grad_mode=grad_mode,
    )
    if small_step is None:
        return base
    small, p = float(small_step[0]), float(small_step[1])

    def step(rng_key, state):
        k_pick, k_step = jax.random.split(rng_key)
        h = jnp.where(jax.random.uniform(k_pick) < p, small, step_size)
        return mala(
            logdensity_fn,
            h,
            inverse_mass_matrix=inverse_mass_matrix,
            grad_mode=grad_mode,
        ).step(k_step, state)

    return SamplingAlgorithm(base.init, step)
