"""The samplers ``cenlmc-jax sample --sampler NAME`` runs: one table over the library's
registry.

The names are those of :data:`cenlmc_jax.SAMPLERS`, spelled with dashes on the
command line (``irreversible_mh`` is ``--sampler irreversible-mh``), and every
job is built from the registry's constructor. :data:`TABLE` says, once, what the
command needs to know about each sampler it offers:

* ``build``: how the flags and the target become a :class:`Job` (the default
  step size from the curvature ``c``, CEnLMC's parameters from the tuner, a
  warm-up for the Metropolis samplers);
* ``step_rule``: the default step-size rule, as the job prints it;
* ``flags``: the sampler-specific flags it reads (the help of ``--eta``,
  ``--grad-noise``, ... names the samplers from here);
* ``adapt_kind``: the :func:`cenlmc_jax.adaptation.window_adaptation` kind of
  its burn-in warm-up (``--adapt``), or None;
* ``langevin``, ``ensemble``, ``constrained``: which of the job's checks and
  report lines apply (unadjusted Langevin's known bias; the gradients an
  ensemble force saves against LMC; CEnLMC's ensemble-use check).

Registry samplers without a row (``sgld``, ``sgrld``, ``sghmc``,
``complete_recipe``) take a minibatch gradient estimator, which the command
has no flags for; they are not ``--sampler`` choices.

This module sits below the parser (which takes its choices and help from
:data:`SPECS`) and the job (which calls :func:`build_job`).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

import cenlmc_jax as cj
from cenlmc_jax._steps import bound_parts, bound_step
from cenlmc_jax.base import SamplingAlgorithm
from cenlmc_jax.ensemble import tuning

ADAPT_MIN_STEPS = 20  # the warm-up's schedule needs 20 steps for its windows
#: The exact warm-up's (--sampler mala) kinetic budget at least: cj.langevin_warmup's
#: default; its stopping rule ends it when the ensemble settles
EXACT_WARMUP_MIN_STEPS = 1000
LANGEVIN_RULE = "min(0.05, sqrt(2/N)) / c"


class Job(NamedTuple):
    """A sampler set up for the CLI: its object, its initial state, a description and
    its parameters.

    warmup_steps: burn-in steps already spent by a warm-up adaptation (the driver runs
      the rest).
    suggestion: CEnLMC's ``tuning.suggest_cenlmc_params`` result (its reasoning is
      printed), else None.
    warmup_problems: what the set-up's warm-up reported as a ``ConvergenceWarning``
      (separate modes, a kinetic phase that did not settle): each makes the verdict
      UNRELIABLE (``cenlmc_jax.cli.jobs.setup`` fills it).
    """

    algorithm: SamplingAlgorithm
    state: object
    description: str
    parameters: dict
    warmup_steps: int = 0
    suggestion: tuning.CEnLMCParams | None = None
    at_step_size: Callable | None = None
    warmup_problems: tuple = ()


class SamplerSpec(NamedTuple):
    """What the command knows about one sampler of the registry (module docstring)."""

    registry: str  # its key in cenlmc_jax.SAMPLERS
    build: Callable  # (this spec, args, target, positions, c, keys) -> Job
    step_rule: str
    flags: tuple = ()
    adapt_kind: str | None = None
    langevin: bool = False
    ensemble: bool = False
    constrained: bool = False
    gradient_free: bool = False  # it never differentiates the model (no Hessian either)

    @property
    def constructor(self) -> Callable:
        return cj.SAMPLERS[self.registry]


# -------------------------------------------------------------------------- The
# builders: (their row of TABLE, flags, target, positions, curvature c, keys) -> Job;
# each makes its sampler with spec.constructor, the registry's.
# --------------------------------------------------------------------------


def langevin_step(args, c) -> float:
    return args.step_size or min(0.05, math.sqrt(2.0 / args.particles)) / c


def _langevin_warmed(args) -> bool:
    """``cj.langevin_warmup`` over the burn-in: for a ``--model`` given no tuning flag
    (``--adapt``, on by default).
    """
    flags = (args.step_size, args.eta, args.r1, args.r2, args.n_star, args.m_f)
    return (
        args.model is not None
        and args.adapt
        and args.burn_in >= ADAPT_MIN_STEPS
        and all(f is None for f in flags)
    )


def _warmed(spec, args, target, positions, keys):
    """LMC or CEnLMC tuned by ``cj.langevin_warmup`` over the burn-in; what it chose
    goes in the description.
    """
    extra = (
        {}
        if spec.registry == "lmc" or target.f_star is None
        else dict(f_star=target.f_star)
    )
    wu = cj.langevin_warmup(
        keys[2],
        target.logdensity_fn,
        positions,
        sampler=spec.registry,
        num_steps=args.burn_in,
        progress=warmup_progress(args),
        **extra,
    )
    i, p = wu.info, wu.parameters
    desc = (
        ("LMC" if spec.registry == "lmc" else "CEnLMC, whitened (y = L^-1 (x - m))")
        + ", "
        f"h={i.step_size:.4g} (whitened curvature {i.curvature:.3g}, bias "
        f"{i.bias:g}), preconditioner M of condition number "
        f"{i.condition_number:.3g} from cj.langevin_warmup over the "
        f"{args.burn_in} burn-in steps (start: {i.start}; {i.grad_evals:,} "
        f"gradients, {i.hvp_evals:,} Hessian-vector products; relaxation time "
        f"{i.relaxation_steps:.3g} steps)"
    )
    if i.cenlmc:
        desc += (
            f"; in y: eta={p['eta']:.3g}, r1={p['r1']:.3g}, r2={p['r2']:.3g}, "
            f"n_star={p['n_star']}, m_f={p['m_f']:.3g} (expected ensemble "
            f"fraction {i.cenlmc['expected_ensemble_fraction']:.2f})"
        )
    params = _plain(
        dict(
            p,
            whitened_curvature=i.curvature,
            whitened_curvature_max=i.curvature_max,
            relaxation_steps=i.relaxation_steps,
        )
    )
    return Job(wu.algorithm, wu.state, desc, params, warmup_steps=args.burn_in)


def _lmc(spec, args, target, positions, c, keys):
    if _langevin_warmed(args):
        return _warmed(spec, args, target, positions, keys)
    h = langevin_step(args, c)
    # the command line keeps the log density of every step (cj.lmc's default skips
    # it for speed): a step out of the support or an overflow is then caught at
    # the step it happens, and the CLI never reports a chain that left the support
    algo = spec.constructor(target.logdensity_fn, h, track_logdensity=True)
    return Job(
        algo,
        algo.init(positions),
        f"LMC (unadjusted Langevin), h={h:.4g}",
        dict(step_size=h),
    )


def cenlmc_params(args, target, h, c):
    """Flags where given, else ``tuning.suggest_cenlmc_params`` for this d, h, N and
    curvature.
    """
    mu = target.mu if target.mu is not None else c
    sug = tuning.suggest_cenlmc_params(
        target.dim, h, L=max(c, mu), mu=mu, num_particles=args.particles
    )
    pick = lambda flag, default: default if flag is None else flag  # noqa: E731
    params = dict(
        step_size=h,
        eta=pick(args.eta, sug.eta),
        r1=pick(args.r1, sug.r1),
        r2=pick(args.r2, sug.r2),
        n_star=pick(args.n_star, sug.n_star),
        m_f=pick(args.m_f, sug.m_f),
    )
    return params, sug


def _cenlmc(spec, args, target, positions, c, keys):
    if _langevin_warmed(args):
        return _warmed(spec, args, target, positions, keys)
    h = langevin_step(args, c)
    p, sug = cenlmc_params(args, target, h, c)
    algo = spec.constructor(
        target.logdensity_fn,
        h,
        p["eta"],
        p["r1"],
        p["r2"],
        p["n_star"],
        p["m_f"],
        f_star=target.f_star,
    )
    desc = (
        f"CEnLMC (constrained ensemble Langevin), h={h:.4g}, eta={p['eta']:.3g}, "
        f"r1={p['r1']:.3g}, r2={p['r2']:.3g}, n_star={p['n_star']}, "
        f"m_f={p['m_f']:.3g}"
    )
    return Job(algo, algo.init(positions), desc, p, suggestion=sug)


def _enlmc(spec, args, target, positions, c, keys):
    h = langevin_step(args, c)
    eta = (
        args.eta
        if args.eta is not None
        else cenlmc_params(args, target, h, c)[0]["eta"]
    )
    algo = spec.constructor(target.logdensity_fn, h, eta)
    return Job(
        algo,
        algo.init(positions),
        f"EnLMC (unconstrained ensemble Langevin; provably unstable), h={h:.4g}, "
        f"eta={eta:.3g}",
        dict(step_size=h, eta=eta),
    )


def _sgrhmc(spec, args, target, positions, c, keys):
    """SGRHMC with the gSGRHMC metric, one chain per 'particle', noisy gradients
    (true gradient + N(0, grad_noise²)) when --grad-noise > 0."""
    eps = args.step_size or 0.05 / math.sqrt(c)
    est = (
        cj.gradients.noisy_grad_estimator(
            jax.grad(target.logdensity_fn), args.grad_noise
        )
        if args.grad_noise > 0
        else cj.gradients.grad_estimator_from_logdensity(target.logdensity_fn)
    )
    f_star = target.f_star
    if f_star is None:
        f_star = float(tuning.find_f_star(target.logdensity_fn, positions).f_star)
    inv_metric = cj.sgmcmc.gsgrhmc_inv_metric(
        lambda x: -target.logdensity_fn(x) - f_star
    )
    algo = cj.vmap_chains(spec.constructor(est, eps, inv_metric))
    return Job(
        algo,
        algo.init(positions),
        f"gSGRHMC (metric 1.5 sqrt|U - U* + 0.5|), eps={eps:.4g}, gradient noise sd "
        f"{args.grad_noise}",
        dict(step_size=eps, grad_noise=args.grad_noise, f_star=f_star),
    )


def _plain(params: dict) -> dict:
    """Adapted parameters as JSON-friendly numbers and lists."""
    return {
        k: (np.asarray(v).tolist() if np.ndim(v) else float(v))
        for k, v in params.items()
    }


def _adapt(args) -> bool:
    return args.adapt and args.step_size is None and args.burn_in >= ADAPT_MIN_STEPS


def exact_warmup(args) -> bool:
    """Whether the job is ``cj.langevin_warmup``'s exact default (HMC or MALA with the
    warm-up on): it finds its own mode and step, so no curvature ``c`` is needed.

    Args:
      args: the checked flags.

    Returns:
      True for ``--sampler hmc|mala`` with the warm-up on.
    """
    return args.sampler in ("hmc", "mala") and _adapt(args)


def _adapted(args, kind, target, positions, keys, initial_step_size, describe):
    """Stan-style warm-up (``cenlmc_jax.adaptation``) over the burn-in: the pooled
    chains' step size by dual averaging and a diagonal preconditioner; a Job that
    continues from its states.
    """
    warm = cj.window_adaptation(
        kind, target.logdensity_fn, initial_step_size=initial_step_size
    )
    (states, params), info = warm.run_chains(keys[2], positions, args.burn_in)
    tail = np.asarray(info.acceptance_rate)[-max(1, args.burn_in // 4) :]
    plain = _plain(params)
    desc = (
        describe(plain)
        + f"; warm-up adapted over the {args.burn_in} burn-in steps (final acceptance "
        f"{float(tail.mean()):.2f})"
    )
    return Job(
        cj.vmap_chains(warm.sampler(params)),
        states,
        desc,
        plain,
        warmup_steps=args.burn_in,
    )


def warmup_progress(args):
    """The warm-up's progress lines on stderr (``  warm-up: ...``) with
    ``--progress`` (on by default at a terminal), else none.

    Args:
      args: the parsed command line.

    Returns:
      ``progress`` for ``cj.langevin_warmup``: a function of one message, or False.
    """
    if not getattr(args, "progress", False):
        return False
    return lambda m: print(f"  warm-up: {m}", file=sys.stderr, flush=True)


def _warmed_exact(kind, args, target, positions, keys) -> Job:
    """``cj.langevin_warmup``'s exact default with ``sampler=kind`` (Laplace start,
    kinetic phase, the adjusted kernel tuned on the ensemble and frozen:
    cenlmc_jax/adaptation/kinetic.py and adjusted.py)."""
    # the kinetic phase stops itself once the ensemble settles: --burn-in below
    # EXACT_WARMUP_MIN_STEPS is its budget raised to that (a banana needs ~460; 200
    # handed over an unsettled ensemble and R-hat 1.56)
    wu = cj.langevin_warmup(
        keys[2],
        target.logdensity_fn,
        positions,
        sampler=kind,
        num_steps=max(args.burn_in, EXACT_WARMUP_MIN_STEPS),
        progress=warmup_progress(args),
    )
    i, p = wu.info, wu.parameters
    head = (
        f"{'AutoStep HMC' if p.get('autostep') else 'HMC'} (exact), "
        f"ε={i.step_size:.4g}, L={p['num_integration_steps']}"
        if kind == "hmc"
        else f"MALA (exact), h={i.step_size:.4g}"
    )
    desc = (
        f"{head}, acceptance {i.acceptance_rate:.2f}, "
        f"preconditioner M of condition number {i.condition_number:.3g} from "
        f"cj.langevin_warmup (start: {i.start}; kinetic and adjusted phases: "
        f"{i.sequential_grads:,} sequential and {i.grad_evals:,} gradients in all; "
        f"relaxation time {i.relaxation_steps:.3g} "
        f"{'moves' if kind == 'hmc' else 'steps'})"
    )
    params = _plain(
        dict(p, acceptance_rate=i.acceptance_rate, relaxation_steps=i.relaxation_steps)
    )
    return Job(wu.algorithm, wu.state, desc, params, warmup_steps=args.burn_in)


def _mala(spec, args, target, positions, c, keys):
    """MALA, one chain per particle. With a warm-up (the burn-in, no ``--step-size``):
    ``cj.langevin_warmup(sampler="mala")``."""
    if _adapt(args):
        return _warmed_exact("mala", args, target, positions, keys)
    h = args.step_size or 0.5 / (c * target.dim ** (1 / 3))
    algo = cj.vmap_chains(spec.constructor(target.logdensity_fn, h))
    return Job(
        algo,
        algo.init(positions),
        f"MALA (exact), h={h:.4g}, one chain per particle",
        dict(step_size=h),
    )


def _hmc(spec, args, target, positions, c, keys):
    """HMC, one chain per particle. With a warm-up (the burn-in, no ``--step-size``):
    ``cj.langevin_warmup``'s exact default (the model default). With
    ``--step-size ε``: ``L = ⌈(π/2)/ε⌉`` leapfrog steps, no preconditioner."""
    if _adapt(args):
        return _warmed_exact("hmc", args, target, positions, keys)
    eps = args.step_size or 0.5 / (math.sqrt(c) * target.dim**0.25)
    n_lf = max(1, math.ceil(math.pi / 2 / (eps * math.sqrt(c))))
    algo = cj.vmap_chains(spec.constructor(target.logdensity_fn, eps, n_lf))
    return Job(
        algo,
        algo.init(positions),
        f"HMC (exact), ε={eps:.4g}, L={n_lf}, one chain per particle",
        dict(step_size=eps, num_integration_steps=n_lf),
    )


def _irreversible_mh(spec, args, target, positions, c, keys):
    scale = args.step_size or 0.8 / math.sqrt(c)
    if _adapt(args):
        return _adapted(
            args,
            spec.adapt_kind,
            target,
            positions,
            keys,
            scale,
            lambda p: (
                "irreversible MH, Gamma(2, scale) proposal, one chain per particle, "
                f"scale per coordinate {np.round(p['scale'], 4).tolist()}"
            ),
        )
    algo = cj.vmap_chains(
        spec.constructor(
            target.logdensity_fn, cj.irreversible.gamma_proposal(2.0, scale)
        )
    )
    return Job(
        algo,
        algo.init(positions, keys[2]),
        f"irreversible MH, Gamma(2, {scale:.4g}) proposal, one chain per particle",
        dict(scale=scale, shape=2.0),
    )


def _rwmh(spec, args, target, positions, c, keys):
    h = args.step_size or 2.38 / math.sqrt(target.dim * c)
    if _adapt(args):
        return _adapted(
            args,
            spec.adapt_kind,
            target,
            positions,
            keys,
            h,
            lambda p: (
                f"random-walk MH, N(0, {p['step_size']:.4g}^2 "
                f"diag({np.round(p['proposal_cov'], 4).tolist()})) proposal, one "
                "chain per particle"
            ),
        )
    algo = cj.vmap_chains(spec.constructor(target.logdensity_fn, h))
    return Job(
        algo,
        algo.init(positions),
        f"random-walk MH, N(0, {h:.4g}^2) proposal, one chain per particle",
        dict(step_size=h),
    )


# --------------------------------------------------------------------------
# The table: the registry's samplers the command offers, and what it knows of each.
# --------------------------------------------------------------------------

CENLMC_FLAGS = ("eta", "r1", "r2", "n-star", "m-f")

#: By registry name; the order is the help's ("cenlmc/enlmc: eta", "rwmh,
#: irreversible-mh: adapt ...").
TABLE: dict[str, SamplerSpec] = {
    "cenlmc": SamplerSpec(
        "cenlmc",
        _cenlmc,
        LANGEVIN_RULE,
        flags=CENLMC_FLAGS,
        langevin=True,
        ensemble=True,
        constrained=True,
    ),
    "enlmc": SamplerSpec(
        "enlmc", _enlmc, LANGEVIN_RULE, flags=("eta",), langevin=True, ensemble=True
    ),
    "lmc": SamplerSpec("lmc", _lmc, LANGEVIN_RULE, langevin=True),
    "sgrhmc": SamplerSpec("sgrhmc", _sgrhmc, "0.05 / sqrt(c)", flags=("grad-noise",)),
    "mala": SamplerSpec("mala", _mala, "0.5 / (c d^(1/3))", adapt_kind="mala"),
    "hmc": SamplerSpec("hmc", _hmc, "0.5 / (sqrt(c) d^(1/4))", adapt_kind="hmc"),
    "rwmh": SamplerSpec(
        "rwmh", _rwmh, "2.38 / sqrt(d c)", adapt_kind="rwmh", gradient_free=True
    ),
    "irreversible_mh": SamplerSpec(
        "irreversible_mh",
        _irreversible_mh,
        "0.8 / sqrt(c)",
        adapt_kind="gamma",
        gradient_free=True,
    ),
}


def cli_name(registry_name: str) -> str:
    """The ``--sampler`` spelling of a registry name: ``irreversible_mh`` ->
    ``irreversible-mh``.
    """
    return registry_name.replace("_", "-")


def _specs() -> dict:
    unknown = sorted(set(TABLE) - set(cj.SAMPLERS))
    if (
        unknown
    ):  # a row for a sampler the library does not have: a bug here, caught at import
        raise ImportError(
            f"cenlmc_jax.cli.samplers: {unknown} are not in cenlmc_jax.SAMPLERS"
        )
    return {cli_name(name): spec for name, spec in TABLE.items()}


#: By ``--sampler`` name, in the table's order.
SPECS: dict[str, SamplerSpec] = _specs()
#: The ``--sampler`` choices, sorted (as ``--help`` lists them).
CHOICES: tuple = tuple(sorted(SPECS))
#: Without ``--model``: the built-in targets' main job shows CEnLMC (its truth is known,
#: and the verdict checks the moments against it).
DEFAULT_SAMPLER = "cenlmc"
#: With ``--model`` (a posterior whose truth nobody knows): the exact default of
#: ``cj.langevin_warmup`` (issue 29).
DEFAULT_MODEL_SAMPLER = "hmc"


def takes(flag: str) -> list:
    """The ``--sampler`` names that read ``--FLAG`` (the table's ``flags``; ``adapt``:
    those with a warm-up).
    """
    if flag == "adapt":
        return [name for name, spec in SPECS.items() if spec.adapt_kind is not None]
    return [name for name, spec in SPECS.items() if flag in spec.flags]


def build_job(name: str, args, target, positions, c, keys) -> Job:
    """The job of ``--sampler NAME``, built by its row of the table, with its step
    size made a traced argument where the sampler allows (:func:`step_size_traced`).
    """
    spec = SPECS[name]
    job = spec.build(spec, args, target, positions, c, keys)
    # the unadjusted Langevin samplers: those the step-halving check reruns at h/2
    return step_size_traced(job) if spec.langevin else job


class AtStepSize(NamedTuple):
    """A sampler's state and the step size its step runs at (:func:`step_size_traced`).

    ``position`` is the sampler's, so that ``cj.sample`` (its default ``trace_fn``, the
    frozen-chain watch) and the command read the state as the sampler's own.
    """

    inner: object
    step_size: jax.Array

    @property
    def position(self):
        return self.inner.position


def _step_at(rng_key, state: AtStepSize, kernel: Callable, **params):
    """One step of ``kernel`` at the step size the state carries."""
    new, info = kernel(rng_key, state.inner, step_size=state.step_size, **params)
    return AtStepSize(new, state.step_size), info


def _scalar(value: float, like) -> jax.Array:
    """``value`` as a scalar array of ``like``'s dtype, put on the device (an eager
    ``jnp.asarray`` would compile a program for it)."""
    return jax.device_put(np.asarray(value, jnp.result_type(like)))


def step_size_traced(job: Job) -> Job:
    """The job with its step size in the state, a traced argument of the compiled run.

    The step-halving bias check runs the sampler again at ``h/2``
    (:func:`cenlmc_jax.cli.jobs.step_halving_check`). With ``h`` a constant of the step
    function, that run is another program: traced, lowered and compiled (or loaded from
    the persistent cache) again, about 6.6 s of CPU on an empty cache and 1.5 s on a
    warm one for the main job (benchmarks/results/waste.md, item (e)). Here the step is
    the sampler's kernel (``_steps.bound_parts``: the samplers built by ``bound_step``,
    CEnLMC and LMC among them) with ``step_size`` read from the state, one function for
    every ``h``: the ``h/2`` run finds the run's compiled chunk (``cj.sample`` keeps one
    per step function). ``job.at_step_size(h)`` is the sampler at ``h``, sharing it.

    A job whose step was not made by ``bound_step``, or whose step size is not a plain
    number (a schedule), is returned as it is (``at_step_size`` None: the check
    rebuilds the sampler).
    """
    parts = bound_parts(job.algorithm.step)
    if parts is None:
        return job
    kernel, params = parts
    h = params.get("step_size")
    if isinstance(h, bool) or not isinstance(h, (int, float)):
        return job
    rest = {k: v for k, v in params.items() if k != "step_size"}
    step, init = bound_step(_step_at, kernel=kernel, **rest), job.algorithm.init

    def at_step_size(step_size: float) -> SamplingAlgorithm:
        def init_at(positions, rng_key=None):
            inner = init(positions, rng_key)
            return AtStepSize(inner, _scalar(step_size, inner.position))

        return SamplingAlgorithm(init_at, step)

    state = AtStepSize(job.state, _scalar(h, job.state.position))
    return job._replace(
        algorithm=at_step_size(h), state=state, at_step_size=at_step_size
    )
