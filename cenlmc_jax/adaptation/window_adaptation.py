"""Warm-up adaptation: step sizes by dual averaging, preconditioners from windows.

The shape of BlackJAX's ``window_adaptation`` (Stan's warm-up), for the
samplers of this package that have a Metropolis step::

    # kind, or an AdaptationSpec
    warmup = cj.adaptation.window_adaptation("mala", logdensity_fn)
    # one chain
    (state, parameters), info = warmup.run(rng_key, position, num_steps=1000)
    # (C, d): pooled
    (states, parameters), info = warmup.run_chains(rng_key, positions, 1000)
    # a ready SamplingAlgorithm, e.g. for cj.vmap_chains(sampler)
    sampler = warmup.sampler(parameters)

Kinds and what is adapted (``parameters`` are the sampler's own arguments):

* ``"rwmh"``: ``rwmh(logdensity_fn, step_size, proposal_cov=Σ)``; adapts
  ``step_size``, ``proposal_cov``.
* ``"mala"``: ``irreversible_mh(.., sde_proposal(D=Σ, 0, .., step_size))``; adapts
  ``step_size``, ``D``, ``Q`` (= 0).
* ``"sde"``: the same with ``Q = L Q_w Lᵀ`` (``Σ = L Lᵀ``); adapts ``step_size``,
  ``D``, ``Q``.
* ``"gamma"``: ``irreversible_mh(.., gamma_proposal(shape, scale))``; adapts
  ``scale`` (``= ε·sqrt(diag Σ)``).

**Step size** (the scale ``ε``; for "gamma" the Gamma scale): dual averaging
(Nesterov 2009; Hoffman & Gelman 2014, §3.2.1) drives the mean Metropolis
acceptance probability ``α_t`` to a target ``δ``. With ``x = log ε``::

    H̄_t = (1 - 1/(t + t0)) H̄_{t-1} + (δ - α_t)/(t + t0)
    x_{t+1} = μ - (√t / γ) H̄_t,      μ = log(10 ε_0)
    x̄_{t+1} = t^{-κ} x_{t+1} + (1 - t^{-κ}) x̄_t                        (DA)

(``t0 = 10``, ``γ = 0.05``, ``κ = 0.75``); the adapted value is ``exp(x̄)``.
Default targets: 0.234 for RW-MH (Roberts, Gelman & Gilks 1997), 0.574 for
MALA and SDE proposals (Roberts & Rosenthal 1998), 0.5 for the Gamma proposal
(no optimal-scaling theory; the value the tests and benchmarks use).

**Preconditioner** ``Σ ≈ Cov π`` (``preconditioner="diagonal"`` or
``"dense"``; ``None`` keeps the identity): Stan's windows. A first fast
window adapts ``ε`` only, slow windows of doubling length (25, 50, 100, ...)
accumulate Welford's mean and covariance of the positions; at the end of each
the estimate becomes ``Σ = n/(n+5) S + 10⁻³·5/(n+5) I`` (Stan's shrinkage;
``S`` the sample covariance of the ``n`` draws of the window, memoryless between
windows), and dual averaging restarts around the current ``ε``; a final fast
window (50 steps) tunes ``ε`` for the last ``Σ``. ``Σ`` is the proposal
covariance of RW-MH, the ``D`` of the SDE proposal (MALA preconditioned by
``Σ``), and the per-coordinate scale ``sqrt(Σ_ii)`` of the Gamma proposal.
The warm-up is one ``lax.scan`` (one compilation); the window boundaries,
known when ``num_steps`` is, enter as per-step flags and the window-end
updates as selects (no ``lax.cond``: nothing extra runs per step under
``vmap``). Nothing in a sampler's state depends on ``Σ`` or ``ε`` (the SDE
proposal caches only ``∇log π``), so the parameters change between steps freely.

**Pooled chains** (:meth:`WindowAdaptation.run_chains`): ``C`` chains share
one set of parameters; the acceptance fed to (DA) is the mean over chains,
and Welford's estimate pools the chains' draws. This is the warm-up for
``cj.vmap_chains`` runs (and the CLI). :meth:`WindowAdaptation.run` adapts
one chain; ``jax.vmap`` it to adapt every chain on its own.

*Stuck chains.* A chain started far in a tail (eight schools with ``tau ≈ 90``) can
reject every proposal at the step size the others need. Pooled, it feeds an
acceptance of 0 to (DA) and its unmoving point to Welford's estimate, which inflates
``Σ`` in its direction; larger ``Σ`` lowers everyone's acceptance, (DA) shrinks
``ε``, and the stuck chain stays stuck for the whole run, with a collapsed step size
and R-hat far above 1 (benchmarks/results/silent_failures.md). So, pooled: (i)
Welford's state is kept per chain and pooled at a window end (Chan et al.'s
combination, :func:`pool_welford`) over the chains that moved during the window;
(ii) at the end of every segment but the last (the initial buffer and each slow
window), a chain that did not move during it restarts from the state of a chain that
did (chosen uniformly; nothing happens when none moved). A warm-up may move chains
(Stan's discards its draws; here the chains' independence is what the sampling run
needs, and a copy of another chain's point followed by independent steps keeps it).
Adapting each chain on its own and combining (Stan, BlackJAX under ``vmap``) was the
alternative: it loses what pooling gives the early windows (``C`` times more draws
for ``Σ`` at 25-step windows) and still leaves a stuck chain stuck. Restarts are
counted in ``info.restarted``; ``info.moved`` says, per step and chain, whether the
chain moved since its segment began.

*The hand-over.* With concrete values (not under ``jit`` or ``vmap``),
:meth:`~WindowAdaptation.run_chains` and :meth:`~WindowAdaptation.run` warn
(``RuntimeWarning``, with the figures) when the step size they return is 0
or not finite, when the final window's mean acceptance is below a quarter of
the target, or when chains did not move in the final window: such
parameters, or chains, do not sample.

**Unadjusted samplers** (LMC, SGLD, SGHMC): :mod:`cenlmc_jax.adaptation.step_size`,
re-exported here (:func:`max_curvature`, :func:`langevin_step_size`).
"""

from __future__ import annotations

import functools
import inspect
import warnings
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from cenlmc_jax import _linalg as la
from cenlmc_jax._validation import (
    all_concrete,
    check_callable,
    check_choice,
    check_int,
    check_key,
    check_logdensity,
    check_positive,
    check_start_logdensity,
)
from cenlmc_jax.adaptation.mass_matrix import (
    build_schedule,
    dual_averaging_init,
    dual_averaging_update,
    pool_welford,
    restart_dual_averaging,
    robbins_monro_update,
    welford_covariance,
    welford_init,
    welford_update,
)
from cenlmc_jax.base import SamplingAlgorithm
from cenlmc_jax.gradients.estimators import flat_logdensity, ravel_position
from cenlmc_jax.irreversible import gamma_proposal, irreversible_mh, rwmh, sde_proposal
from cenlmc_jax.run import check_chain_positions
from cenlmc_jax.types import Array, LogDensityFn, PRNGKey

__all__ = [
    "WindowAdaptationInfo",
    "WindowAdaptation",
    "window_adaptation",
    "collapse_problems",
    "TARGET_ACCEPTANCE",
    "AdaptationSpec",
    "ADAPTABLE",
    "rwmh_spec",
    "mala_spec",
    "sde_spec",
    "gamma_spec",
]

# ------------------------------------------------------------------- the warm-up


class WindowAdaptationInfo(NamedTuple):
    """Per warm-up step, what the adaptation did.

    Attributes:
      step_size: the step size used.
      acceptance_rate: the acceptance rate (the mean over chains).
      restarted: the number of chains restarted at that step (pooled chains stuck
        for a whole segment; 0 for one chain).
      moved: per chain, whether it moved since the start of the segment
        (``(num_steps, C)``; ``(num_steps, 1)`` for one chain).
    """

    step_size: Array
    acceptance_rate: Array
    restarted: Array
    moved: Array


class WindowAdaptation(NamedTuple):
    """What :func:`window_adaptation` returns.

    Attributes:
      run: ``(rng_key, position, num_steps) -> ((state, parameters), info)``,
        one chain; pure (jitted, ``num_steps`` static); ``jax.vmap`` it over
        ``(keys, positions)`` to adapt each chain on its own.
      run_chains: ``(rng_key, positions, num_steps) -> ((states, parameters),
        info)``, ``positions: (C, d)`` (or a pytree with a leading chain axis); one
        parameter set for all chains (pooled acceptance and covariance).
      sampler: ``parameters -> SamplingAlgorithm`` for one chain (buildable inside
        ``jit``); the returned state continues it (``cj.vmap_chains`` for
        ``run_chains``).
    """

    run: Callable
    run_chains: Callable
    sampler: Callable[[dict], SamplingAlgorithm]


def _check_skew_q(Q: Any) -> np.ndarray | None:
    if Q is None:
        return None
    q = np.asarray(Q, np.float64)
    if q.ndim != 2 or q.shape[0] != q.shape[1]:
        raise ValueError(
            f"Q must be a (d, d) skew-symmetric matrix; got shape {q.shape}."
        )
    la.check_skew(q, "Q", "the irreversible part of the SDE proposal")
    return q


# ------------------------------------------------------------------ what is adapted,
# per sampler


class AdaptationSpec(NamedTuple):
    """What :func:`window_adaptation` needs to know of a sampler.

    One entry of the module docstring's list of kinds. Any Metropolis-adjusted
    sampler of this package or the user's can be adapted by writing one.

    Attributes:
      name: for messages.
      target_acceptance: the default ``δ`` of (DA).
      parameters: ``(ε, Σ or None, d) -> dict``: the sampler's arguments for the
        step size (or scale) ``ε`` and the preconditioner ``Σ`` (``(d,)`` diagonal
        or ``(d, d)``; None: identity).
      build: ``(logdensity_fn, parameters) -> SamplingAlgorithm`` for one chain
        (buildable inside ``jit``; its info has ``acceptance_rate``).
      dense: whether a dense ``Σ`` is meaningful (False for a coordinatewise
        proposal).
    """

    name: str
    target_acceptance: float
    parameters: Callable[[Array, Array | None, int], dict]
    build: Callable[[LogDensityFn, dict], SamplingAlgorithm]
    dense: bool = True


def rwmh_spec() -> AdaptationSpec:
    """RW-MH: ``rwmh(logdensity_fn, ε, proposal_cov=Σ)``.

    Target 0.234 (Roberts, Gelman & Gilks 1997).

    Returns:
      The :class:`AdaptationSpec` named ``"rwmh"``.
    """
    return AdaptationSpec(
        "rwmh",
        0.234,
        lambda eps, cov, d: {"step_size": eps, "proposal_cov": cov},
        lambda logdensity_fn, p: rwmh(
            logdensity_fn, p["step_size"], proposal_cov=p["proposal_cov"]
        ),
    )


def _sde_build(logdensity_fn: LogDensityFn, p: dict) -> SamplingAlgorithm:
    return irreversible_mh(
        logdensity_fn, sde_proposal(p["D"], p["Q"], logdensity_fn, p["step_size"])
    )


def sde_spec(Q: Any = None) -> AdaptationSpec:
    """The SDE proposal inside the irreversible jump sampler.

    With ``D = Σ`` and ``Q = L Q_w Lᵀ`` (``Σ = L Lᵀ``); target 0.574.

    Args:
      Q: the whitened ``(d, d)`` skew-symmetric ``Q_w``; None for 0.

    Returns:
      The :class:`AdaptationSpec` named ``"sde"``.

    Raises:
      ValueError: ``Q`` not square, or not skew-symmetric.
    """
    q_white = _check_skew_q(Q)

    def parameters(eps: Array, cov: Array | None, d: int) -> dict:
        D = 1.0 if cov is None else cov
        if (
            q_white is None
        ):  # None, also after jit and vmap: the proposal knows Q = 0 and skips it
            return {"step_size": eps, "D": D, "Q": None}
        q = jnp.asarray(q_white, eps.dtype)
        if q.shape[0] != d:
            raise ValueError(
                f"Q must have shape ({d}, {d}) for a position of dimension {d}; got "
                f"{q.shape}."
            )
        if cov is None:
            return {"step_size": eps, "D": D, "Q": q}
        L = jnp.linalg.cholesky(cov) if cov.ndim == 2 else jnp.sqrt(cov)
        LQLt = L @ q @ L.T if cov.ndim == 2 else L[:, None] * q * L[None, :]
        return {
            "step_size": eps,
            "D": D,
            "Q": 0.5 * (LQLt - LQLt.T),
        }  # skew to the last bit

    return AdaptationSpec("sde", 0.574, parameters, _sde_build)


def mala_spec() -> AdaptationSpec:
    """MALA preconditioned by ``Σ``: :func:`sde_spec` with ``Q = 0``.

    Target 0.574 (Roberts & Rosenthal 1998).

    Returns:
      The :class:`AdaptationSpec` named ``"mala"``.
    """
    return sde_spec(None)._replace(name="mala")


def gamma_spec(shape: float = 2.0) -> AdaptationSpec:
    """The Gamma proposal ``gamma_proposal(shape, scale = ε·sqrt(diag Σ))``.

    Target 0.5 (no optimal-scaling theory: the value the tests and benchmarks use);
    diagonal ``Σ`` only.

    Args:
      shape: the Gamma shape ``k > 0``.

    Returns:
      The :class:`AdaptationSpec` named ``"gamma"``.

    Raises:
      ValueError: ``shape`` not ``> 0``.
    """
    check_positive(shape, "shape")
    return AdaptationSpec(
        "gamma",
        0.5,
        lambda eps, cov, d: {
            "shape": shape,
            "scale": eps if cov is None else eps * jnp.sqrt(cov),
        },
        lambda logdensity_fn, p: irreversible_mh(
            logdensity_fn, gamma_proposal(p["shape"], p["scale"])
        ),
        dense=False,
    )


#: The samplers :func:`window_adaptation` knows by name, and the options each takes.
ADAPTABLE: dict[str, Callable[..., AdaptationSpec]] = {
    "rwmh": rwmh_spec,
    "mala": mala_spec,
    "sde": sde_spec,
    "gamma": gamma_spec,
}
#: Default target acceptance rates by name (see the module docstring).
TARGET_ACCEPTANCE = {name: make().target_acceptance for name, make in ADAPTABLE.items()}
KINDS = tuple(ADAPTABLE)


def _spec(algorithm: Any, options: dict) -> AdaptationSpec:
    """The :class:`AdaptationSpec` for a name of :data:`ADAPTABLE` (with its
    ``options``) or a spec.
    """
    given = {k: v for k, v in options.items() if v is not None}
    if isinstance(algorithm, AdaptationSpec):
        if given:
            raise ValueError(
                f"{', '.join(sorted(given))} are options of the named samplers; with "
                "an AdaptationSpec, build them into it (e.g. sde_spec(Q=...))."
            )
        return algorithm
    check_choice(algorithm, "algorithm", KINDS)
    make = ADAPTABLE[algorithm]
    takes = set(inspect.signature(make).parameters)
    for name in sorted(set(given) - takes):
        raise ValueError(
            f"{name} is not an option of algorithm {algorithm!r} (it takes "
            f"{', '.join(sorted(takes)) or 'none'}); got {name} given."
        )
    return make(**given)


# ------------------------------------------------------------------ the warm-up


def _schedule_flags(num_steps: int, windows: tuple, step_size_only: bool) -> dict:
    """Per-step flags (NumPy, static): slow (Welford), window_end, rm (final window),
    rm_start, and segment_end (the last step of every segment but the last: where pooled
    chains are checked for stuck ones).
    """
    segments = build_schedule(num_steps, *windows)
    if step_size_only:  # step size only: dual averaging, then the final window
        last = segments[-1][0] if len(segments) > 1 else 0
        segments = [(n, False, False) for n in (num_steps - last, last) if n]
    # the final fast window runs (RM); with a single segment there is none: (DA)
    # throughout
    final = len(segments) - 1 if len(segments) > 1 and not segments[-1][1] else -1
    flags = {
        k: np.zeros(num_steps, bool)
        for k in ("slow", "window_end", "rm", "rm_start", "segment_end")
    }
    t = 0
    for index, (length, slow, ends_window) in enumerate(segments):
        flags["slow"][t : t + length] = slow
        flags["window_end"][t + length - 1] = ends_window
        flags["rm"][t : t + length] = index == final
        flags["rm_start"][t] = index == final
        flags["segment_end"][t + length - 1] = index < len(segments) - 1
        t += length
    return flags


def _restart_stuck(key, states, moved: Array):
    """Chains that did not move in the segment take the state of a chain that did
    (chosen uniformly).
    """
    num_chains = moved.shape[0]
    healthy = moved.astype(jnp.float32)
    donors = jax.random.choice(
        key, num_chains, (num_chains,), p=healthy / jnp.maximum(jnp.sum(healthy), 1.0)
    )
    stuck = ~moved & jnp.any(moved)  # nobody moved: nothing to restart from

    def take(a):
        return jnp.where(stuck.reshape((-1,) + (1,) * (a.ndim - 1)), a[donors], a)

    return jax.tree_util.tree_map(take, states), jnp.sum(stuck, dtype=jnp.int32)


def _adapt(
    spec: AdaptationSpec,
    logdensity_fn,
    rng_key,
    states,
    flags: dict,
    target,
    initial_step_size,
    preconditioner: str | None,
    pooled: bool,
):
    """One lax.scan over the warm-up; the window boundaries are per-step flags (selects,
    no cond).

    Pooled (``states`` with a leading chain axis): one step size and ``Σ`` for all
    chains; Welford per chain, pooled at a window end over the chains that moved in it;
    at the end of every segment but the last, chains that never moved in it restart from
    a chain that did (module docstring).
    """
    flat = (
        jax.vmap(lambda p: ravel_position(p, check=False)[0])
        if pooled
        else (lambda p: ravel_position(p, check=False)[0][None])
    )
    x0 = flat(states.position)
    num_chains, d, dtype = x0.shape[0], x0.shape[1], x0.dtype
    dense = preconditioner == "dense"
    da = dual_averaging_init(initial_step_size, dtype)
    wf0 = jax.vmap(lambda _: welford_init(d, dense, dtype))(jnp.arange(num_chains))
    cov = None
    if preconditioner is not None:
        cov = jnp.eye(d, dtype=dtype) if dense else jnp.ones((d,), dtype)

    def pick(flag, a, b):
        return jax.tree_util.tree_map(lambda u, v: jnp.where(flag, u, v), a, b)

    num_steps = len(flags["slow"])

    def one(carry, inputs):
        states, da, wf, cov, moved = carry
        t, slow, window_end, rm, rm_start, segment_end = inputs
        da = pick(rm_start, restart_dual_averaging(da), da)
        step_size = jnp.exp(da.log_step_size)
        algo = spec.build(logdensity_fn, spec.parameters(step_size, cov, d))
        key = jax.random.fold_in(rng_key, t)
        old = flat(states.position)
        if pooled:
            states, info = jax.vmap(algo.step)(
                jax.random.split(key, num_chains), states
            )
        else:
            states, info = algo.step(key, states)
        x = flat(states.position)
        moved = moved | jnp.any(x != old, axis=1)
        acc = jnp.mean(
            jnp.where(jnp.isnan(info.acceptance_rate), 0.0, info.acceptance_rate)
        )
        da = pick(
            rm,
            robbins_monro_update(da, acc, target),
            dual_averaging_update(da, acc, target),
        )
        wf = pick(slow, jax.vmap(welford_update)(wf, x[:, None, :]), wf)
        # end of a slow window: new Σ, memoryless Welford, (DA) restarted around ε
        # (Stan)
        if cov is not None:
            weights = jnp.where(jnp.any(moved), moved, True).astype(
                dtype
            )  # nobody moved (one chain): all
            cov = jnp.where(
                window_end, welford_covariance(pool_welford(wf, weights)), cov
            )
            da = pick(window_end, dual_averaging_init(jnp.exp(da.log_step_size)), da)
            wf = pick(window_end, wf0, wf)
        restarted = jnp.zeros((), jnp.int32)
        if pooled:
            fresh, restarted = _restart_stuck(
                jax.random.fold_in(rng_key, num_steps + t), states, moved
            )
            states = pick(segment_end, fresh, states)
            restarted = jnp.where(segment_end, restarted, 0)
        moved = jnp.where(segment_end, False, moved)
        return (states, da, wf, cov, moved), WindowAdaptationInfo(
            step_size, acc, restarted, moved
        )

    inputs = (jnp.arange(num_steps),) + tuple(
        jnp.asarray(flags[k])
        for k in ("slow", "window_end", "rm", "rm_start", "segment_end")
    )
    carry = (states, da, wf0, cov, jnp.zeros((num_chains,), bool))
    (states, da, _, cov, _), info = lax.scan(one, carry, inputs)
    # (RM)'s average, or (DA)'s when there was no final window
    step_size = (
        jnp.exp(da.log_step_size_avg)
        if num_steps
        else jnp.asarray(initial_step_size, dtype)
    )
    return (states, spec.parameters(step_size, cov, d)), info


def _check_chain_positions(positions: Any, logdensity_fn: LogDensityFn) -> None:
    """Every chain checked, vectorised (:func:`cenlmc_jax.run.check_chain_positions`:
    finite, one pass naming the bad chains), the shapes once (chain 0), and the log
    density not -inf/NaN at every chain.
    """
    leaves = jax.tree_util.tree_leaves(positions)
    if (
        not leaves
        or any(np.ndim(a) < 1 for a in leaves)
        or (isinstance(positions, (jax.Array, np.ndarray)) and np.ndim(positions) != 2)
    ):
        raise ValueError(
            "positions must have a leading chain axis: shape (C, d), or a pytree of "
            f"(C, ...) arrays; got {jax.tree_util.tree_map(np.shape, positions)}."
        )
    positions, num_chains = check_chain_positions(positions)
    first = jax.tree_util.tree_map(lambda a: a[0], positions)
    flat, unravel = ravel_position(first)
    check_logdensity(flat_logdensity(logdensity_fn, unravel), flat)
    if all_concrete(positions):
        values = jax.vmap(lambda p: jnp.asarray(logdensity_fn(p), flat.dtype))(
            positions
        )
        check_start_logdensity(
            values, where=f"one of the {num_chains} chains' starting points"
        )


def collapse_problems(
    params: dict, info: WindowAdaptationInfo, target: float, final_window: int
) -> list:
    """Why adapted ``params`` (with the warm-up's ``info``) do not sample.

    The module docstring's hand-over checks, one sentence each.

    Args:
      params: the adapted parameters (``step_size`` or ``scale``, ...).
      info: the warm-up's :class:`WindowAdaptationInfo`.
      target: the target acceptance rate.
      final_window: the final window's length in steps.

    Returns:
      A list of sentences; empty with no problem, or while tracing (``jit``,
      ``vmap``).
    """
    leaves = jax.tree_util.tree_leaves((params, info))
    if not all_concrete(leaves) or np.shape(info.acceptance_rate)[-1:] in ((), (0,)):
        return []
    n = max(1, min(int(final_window), np.shape(info.acceptance_rate)[-1]))
    acc = float(np.mean(np.asarray(info.acceptance_rate)[..., -n:]))
    moved = np.asarray(info.moved)[..., -1, :].reshape(-1)
    restarted = int(np.sum(np.asarray(info.restarted)))
    eps = np.asarray(params.get("step_size", params.get("scale")), np.float64)
    what = (
        f"adapted step size {float(np.min(eps)):.3g}; final-window mean acceptance "
        f"{acc:.3g} (target {target:g}); {int((~moved).sum())} of {moved.size} chains "
        f"did not move in it; {restarted} restarts of stuck chains earlier"
    )
    out = []
    if not np.all(np.isfinite(eps)) or not np.all(eps > 0):
        out.append(
            f"the adapted step size is {eps.ravel()[:4]}: the warm-up collapsed "
            f"({what}); these parameters do not sample. Start the chains nearer the "
            "posterior's bulk, give a smaller initial_step_size, or rescale the model"
        )
    elif acc < target / 4:
        out.append(
            f"the step-size adaptation did not reach its target ({what}): the chains "
            "will mix badly. Run a longer warm-up, start nearer the bulk, or rescale "
            "the model"
        )
    elif not moved.all():
        out.append(
            f"{int((~moved).sum())} of {moved.size} chains never moved in the "
            f"warm-up's final window ({what}): they are stuck (or the step size is so "
            "small that each step rounds away) and will not sample; start nearer the "
            "bulk, or rescale the model"
        )
    return out


def warn_collapsed(
    params: dict, info: WindowAdaptationInfo, target: float, final_window: int
) -> None:
    """:func:`collapse_problems` as ``RuntimeWarning`` s."""
    for problem in collapse_problems(params, info, target, final_window):
        warnings.warn(problem, RuntimeWarning, stacklevel=3)


def window_adaptation(
    algorithm: str | AdaptationSpec,
    logdensity_fn: LogDensityFn,
    *,
    target_acceptance_rate: float | None = None,
    initial_step_size: float = 1.0,
    preconditioner: str | None = "diagonal",
    Q: Any = None,
    shape: float | None = None,
    initial_buffer: int = 75,
    first_window: int = 25,
    final_buffer: int = 50,
) -> WindowAdaptation:
    """Warm-up for ``algorithm`` (module docstring), in BlackJAX's shape.

    ``window_adaptation(algorithm, ...)`` as BlackJAX has it. The CLI's call (one
    parameter set for all chains)::

        warmup = cj.adaptation.window_adaptation(kind, target.logdensity_fn)
        (states, params), info = warmup.run_chains(
            key_warmup, positions, num_steps=burn_in
        )
        algo = cj.vmap_chains(warmup.sampler(params))
        result = cj.sample(key, algo, states, num_steps)
        # report params, and info.acceptance_rate[-final_buffer:].mean()

    Args:
      algorithm: a name of :data:`ADAPTABLE` (``"rwmh"``, ``"mala"``, ``"sde"``,
        ``"gamma"``; listed in the module docstring) or any
        :class:`AdaptationSpec` (``sde_spec(Q=...)``, or one written for another
        Metropolis-adjusted sampler).
      logdensity_fn: ``x -> log π(x)`` for one position (an array or a pytree).
      target_acceptance_rate: ``δ`` of (DA), in (0, 1); default:
        docs/algorithms.md's (:data:`TARGET_ACCEPTANCE`).
      initial_step_size: ``ε_0 > 0`` (for "gamma" the initial Gamma scale).
      preconditioner: ``"diagonal"`` (default), ``"dense"`` (not for "gamma")
        or ``None`` (identity; step size only).
      Q: "sde" only (:func:`sde_spec`): a ``(d, d)`` skew-symmetric matrix in
        whitened coordinates; the sampler uses ``L Q Lᵀ`` with ``Σ = L Lᵀ``
        (``L = sqrt(Σ)`` for a diagonal ``Σ``, its Cholesky factor for a dense
        one): irreversibility of the same strength relative to the target's
        scales.
      shape: "gamma" only (:func:`gamma_spec`): the Gamma shape ``k`` (default 2).
      initial_buffer: the first fast window (:func:`build_schedule`).
      first_window: the first slow window (:func:`build_schedule`).
      final_buffer: the last fast window (:func:`build_schedule`).

    Returns:
      A :class:`WindowAdaptation` ``(run, run_chains, sampler)``.

    Raises:
      ValueError: an unknown ``algorithm``, options it does not take, a target
        not in (0, 1), a step size not ``> 0``, a dense preconditioner for
        "gamma", or negative window sizes.
    """
    spec = _spec(algorithm, {"Q": Q, "shape": shape})
    check_callable(logdensity_fn, "logdensity_fn", "x -> scalar log density")
    target = (
        spec.target_acceptance
        if target_acceptance_rate is None
        else target_acceptance_rate
    )
    check_positive(target, "target_acceptance_rate")
    if not 0.0 < float(target) < 1.0:
        raise ValueError(f"target_acceptance_rate must be in (0, 1); got {target}.")
    check_positive(initial_step_size, "initial_step_size")
    check_choice(preconditioner, "preconditioner", (None, "diagonal", "dense"))
    if not spec.dense and preconditioner == "dense":
        raise ValueError(
            f"preconditioner must be None or 'diagonal' for algorithm {spec.name!r} (a "
            "coordinatewise proposal); got 'dense'."
        )
    windows = tuple(
        check_int(value, name, minimum=0)
        for name, value in (
            ("initial_buffer", initial_buffer),
            ("first_window", first_window),
            ("final_buffer", final_buffer),
        )
    )

    def sampler(params: dict) -> SamplingAlgorithm:
        """The ready sampler for ``params`` (one chain)."""
        return spec.build(logdensity_fn, params)

    def start(position: Any) -> SamplingAlgorithm:
        x = ravel_position(position, check=False)[0]
        return sampler(
            spec.parameters(jnp.asarray(initial_step_size, x.dtype), None, x.shape[0])
        )

    def final_window(num_steps: int) -> int:
        """Steps of the final window (of the whole warm-up when it has none)."""
        return (
            int(_schedule_flags(num_steps, windows, preconditioner is None)["rm"].sum())
            or num_steps
        )

    def adapt(key, states, num_steps, pooled):
        flags = _schedule_flags(num_steps, windows, preconditioner is None)
        return _adapt(
            spec,
            logdensity_fn,
            key,
            states,
            flags,
            target,
            initial_step_size,
            preconditioner,
            pooled,
        )

    @functools.partial(jax.jit, static_argnames=("num_steps",))
    def _run(rng_key, position, num_steps):
        key_init, key_run = jax.random.split(rng_key)
        return adapt(
            key_run, start(position).init(position, key_init), num_steps, pooled=False
        )

    @functools.partial(jax.jit, static_argnames=("num_steps",))
    def _run_chains(rng_key, positions, num_steps):
        key_init, key_run = jax.random.split(rng_key)
        algo = start(jax.tree_util.tree_map(lambda a: a[0], positions))
        num_chains = jax.tree_util.tree_leaves(positions)[0].shape[0]
        states = jax.vmap(algo.init)(positions, jax.random.split(key_init, num_chains))
        return adapt(key_run, states, num_steps, pooled=True)

    def run(rng_key: PRNGKey, position: Any, num_steps: int = 1000):
        """Adapt one chain for ``num_steps`` steps: ``((state, parameters), info)``."""
        check_key(rng_key)
        num_steps = check_int(num_steps, "num_steps", minimum=0)
        ravel_position(
            position
        )  # the checks, in Python (skipped for tracers, e.g. under vmap)
        out = _run(rng_key, position, num_steps)
        warn_collapsed(out[0][1], out[1], target, final_window(num_steps))
        return out

    def run_chains(rng_key: PRNGKey, positions: Any, num_steps: int = 1000):
        """Adapt ``C`` chains together (``positions`` with a leading chain axis).

        Returns ``((states, parameters), info)``.
        """
        check_key(rng_key)
        num_steps = check_int(num_steps, "num_steps", minimum=0)
        _check_chain_positions(positions, logdensity_fn)
        out = _run_chains(rng_key, positions, num_steps)
        warn_collapsed(out[0][1], out[1], target, final_window(num_steps))
        return out

    return WindowAdaptation(run, run_chains, sampler)
