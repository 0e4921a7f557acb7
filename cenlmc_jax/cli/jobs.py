"""The sampling job of ``cenlmc-jax sample``: set up from the checked flags, run,
written out.

* :func:`setup`: the target (built-in, or ``--model`` with ``--data``), the
  starting positions (``--init`` or noise), the curvature ``c`` the default
  step sizes follow (:func:`curvature`), and the sampler's :class:`Job` from
  its row of :mod:`cenlmc_jax.cli.samplers`. A bad file or value is a
  :class:`~cenlmc_jax.cli.parser.UsageError` (exit 2).
* :func:`run_job`: ``cenlmc_jax.sample`` with ``--checkpoint`` every
  ``--checkpoint-every`` steps; the driver's RuntimeWarnings (divergence,
  clipping) are kept for the report; a checkpoint the driver refuses (another
  run's, damaged) is a usage error.
* :func:`ctrl_c_recorded` (around the whole command): a Ctrl-C, even one
  Python swallows, stops the job with the last chunk's checkpoint, and
  :func:`say_interrupted` says how to go on: ``--resume`` continues to the
  result of an uninterrupted run; before the first checkpoint, the same
  command (or ``--resume``) starts afresh.
* :func:`write_outputs`: ``draws.npz`` or ``moments.npz``, ``summary.csv``,
  ``run.nc`` (ArviZ), ``plots/*.png``, ``run.json`` (configuration, seed,
  version, timings, the verdict) and the ``--output`` file; a run that kept
  no draw (:func:`no_draws`: diverged at once) gets those that exist (no
  summary, ``run.nc`` or plots). :func:`remove_checkpoint` removes a finished
  run's checkpoint.

The verdict on the result is :mod:`cenlmc_jax.cli.verdict`'s.
"""

from __future__ import annotations

import _thread
import contextlib
import functools
import importlib.util
import inspect
import json
import logging
import math
import os
import shutil
import signal
import sys
import threading
import time
import warnings
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

import cenlmc_jax as cj
from cenlmc_jax import checkpoint as ckpt
from cenlmc_jax._host import backends_started
from cenlmc_jax._keys import normal
from cenlmc_jax.cli.parser import (
    DEFAULT_PARTICLES,
    DEFAULT_STEPS,
    RESUME_MAY_CHANGE,
    UNFINISHED_OUTPUTS,
    UsageError,
    effective_config,
    version_text,
    write_config,
)
from cenlmc_jax.cli.samplers import SPECS, Job, build_job, exact_warmup
from cenlmc_jax.diagnostics import convergence, online, plots
from cenlmc_jax.diagnostics.convergence import ConvergenceWarning
from cenlmc_jax.diagnostics.summary import SummaryTable, to_arviz
from cenlmc_jax.ensemble import tuning
from cenlmc_jax.models import targets as targets_mod
from cenlmc_jax.run import RunResult, step_halving_bias
from cenlmc_jax.run_until import default_segment, sample_until


class Setup(NamedTuple):
    """A job ready to run: the target, the sampler's Job, the keys, the curvature ``c``
    and where it came from (``c`` None for the exact warm-up, which needs none).
    """

    target: targets_mod.Target
    job: Job
    keys: tuple  # (starting noise, run, sampler set-up, step-halving check)
    c: float | None
    c_source: str
    model: object = (
        None  # a NumPyro model's cj.from_numpyro (its constrain and names), else None
    )


class Run(NamedTuple):
    """A finished run: the driver's result, its time, its RuntimeWarnings, the burn-in
    steps the driver ran.

    ``bias``: the step-halving bias check of an unadjusted sampler
    (:func:`step_halving_check`), None when it did not run; ``bias_note``: why not
    (None when it ran or does not apply).
    """

    result: RunResult
    seconds: float
    warnings: list
    burn_in: int
    bias: online.StepHalvingBias | None = None
    bias_note: str | None = None


# --------------------------------------------------------------------------
# Targets: built-in, or a user's model file.
# --------------------------------------------------------------------------


def _refuse_pickles(flag: str, path: str, exc: Exception) -> None:
    if "allow_pickle" in str(exc):
        raise UsageError(
            f"{flag} {path}: holds pickled Python objects, which can run code and are "
            "never loaded; save plain numeric arrays"
        ) from exc


def load_data(path: str) -> dict:
    """``--data``: an ``.npz`` (its arrays) or a ``.csv`` with a header row (its
    columns), by name; data only (an array of pickled objects, which could run code, is
    refused).
    """
    if path.endswith(".npz"):
        try:
            with np.load(path, allow_pickle=False) as f:
                return {k: f[k] for k in f.files}
        except Exception as exc:
            _refuse_pickles("--data", path, exc)
            raise UsageError(
                f"--data {path}: not a readable .npz file ({exc})"
            ) from exc
    if path.endswith(".csv"):
        try:
            table = np.genfromtxt(
                path, delimiter=",", names=True, dtype=np.float64, encoding="utf-8"
            )
        except Exception as exc:
            raise UsageError(
                f"--data {path}: not a readable .csv file with a header row ({exc})"
            ) from exc
        if table.dtype.names is None:
            raise UsageError(
                f"--data {path}: the .csv needs a header row naming its columns"
            )
        table = np.atleast_1d(table)
        data = {name: np.asarray(table[name]) for name in table.dtype.names}
        bad = [k for k, v in data.items() if np.isnan(v).any()]
        if bad:
            raise UsageError(
                f"--data {path}: columns {bad} hold empty or non-numeric values"
            )
        return data
    raise UsageError(f"--data must be an .npz or a .csv file; got {path!r}")


def _import_model(spec: str):
    """The function ``FUNCTION`` of ``--model PATH.py:FUNCTION``, its name and the
    file's module.
    """
    path, sep, name = spec.rpartition(":")
    if not sep or not path.endswith(".py") or not name.isidentifier():
        raise UsageError(f"--model must be PATH.py:FUNCTION; got {spec!r}")
    module_name = USER_MODEL_MODULE + "".join(
        c if c.isalnum() else "_" for c in os.path.abspath(path)
    )
    try:
        loader_spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(loader_spec)
        loader_spec.loader.exec_module(module)
    except Exception as exc:
        raise UsageError(
            f"--model {spec}: importing {path} failed: {type(exc).__name__}: {exc}"
        ) from exc
    # a model file that exits at import (a script's sys.exit) would end the job
    # with its status and no output
    except SystemExit as exc:
        raise UsageError(
            f"--model {spec}: importing {path} called sys.exit({exc.code!r}); a model "
            "file must define the function without exiting (guard a script's code "
            "with `if __name__ == '__main__':`)"
        ) from None
    fn = getattr(module, name, None)
    if not callable(fn):
        raise UsageError(f"--model {spec}: {path} defines no function {name!r}")
    return fn, name, module


def load_model(spec: str, data: dict | None, dim: int, fn=None) -> targets_mod.Target:
    """``--model PATH.py:FUNCTION`` (with ``--data``) as a Target of dimension ``dim``,
    its output checked; a model that calls the host (``jax.pure_callback``) checks for a
    Ctrl-C at each evaluation (:func:`ctrl_c_checked`).
    """
    fn, name = (
        (fn, spec.rpartition(":")[2]) if fn is not None else _import_model(spec)[:2]
    )
    if data is None:
        logdensity_fn = fn
    else:
        arrays = {k: jnp.asarray(v) for k, v in data.items()}

        def logdensity_fn(x):
            return fn(x, arrays)

    try:
        jaxpr, out = jax.make_jaxpr(logdensity_fn, return_shape=True)(
            jax.ShapeDtypeStruct((dim,), jnp.float32)
        )
    except Exception as exc:
        call = f"{name}(x, data)" if data is not None else f"{name}(x)"
        raise UsageError(
            f"--model {spec}: {call} failed on a point x of shape ({dim},): "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    if getattr(out, "shape", None) != () or not jnp.issubdtype(out.dtype, jnp.floating):
        raise UsageError(
            f"--model {spec}: {name} must return a floating scalar (the log density "
            "of one point); got shape "
            f"{getattr(out, 'shape', type(out).__name__)}"
        )
    if calls_the_host(jaxpr):  # a Ctrl-C must stop its computation at once
        logdensity_fn = functools.partial(ctrl_c_checked, logdensity_fn)
    path = spec.rpartition(":")[0]
    return targets_mod.Target(
        f"{os.path.basename(path)}:{name}",
        dim,
        logdensity_fn,
        None,
        None,
        None,
        None,
        data,
    )


def _imports_numpyro(module) -> bool:
    return any(
        (getattr(v, "__name__", None) or getattr(v, "__module__", None) or "").split(
            "."
        )[0]
        == "numpyro"
        for v in vars(module).values()
    )


def _numpyro_kwargs(data: dict | None) -> dict:
    """``--data`` as a NumPyro model's keyword arguments: each array by name, a 0-d
    integer (a plate's size) an int.
    """
    return {
        k: int(v)
        if np.ndim(v) == 0 and np.issubdtype(np.asarray(v).dtype, np.integer)
        else v
        for k, v in (data or {}).items()
    }


def load_numpyro_model(spec: str, fn, module, data: dict | None):
    """``--model PATH.py:MODEL`` as ``cj.from_numpyro(MODEL, **data)`` and those keyword
    arguments when MODEL is a NumPyro model, else None.

    A NumPyro model: the file imports numpyro and ``MODEL(**data)`` binds (``--data``'s
    arrays by argument name; none without ``--data``: the model's own defaults). A log
    density ``f(x)`` / ``f(x, data)`` does not bind (``x`` is missing) and goes the
    log-density way. The model then failing on the data is a usage error.
    """
    kwargs = _numpyro_kwargs(data)
    try:
        if not _imports_numpyro(module):
            return None
        inspect.signature(fn).bind(**kwargs)
    except (TypeError, ValueError):
        return None
    try:
        return cj.from_numpyro(fn, **kwargs), kwargs
    except Exception as exc:
        call = f"{spec.rpartition(':')[2]}({', '.join(f'{k}=...' for k in kwargs)})"
        raise UsageError(
            f"--model {spec}: read as a NumPyro model (the file imports numpyro), "
            f"cj.from_numpyro of {call} failed: {type(exc).__name__}: {exc}"
        ) from exc


# (model function, id of its data) -> cj.from_numpyro (a library global: not
# fingerprinted)
_FROM_NUMPYRO: dict = {}


def numpyro_target(spec: str, fn, kwargs: dict, model) -> targets_mod.Target:
    """A NumPyro model's unconstrained log density (``cj.from_numpyro``) as a Target.

    Its ``logdensity_fn`` closes over the user's model function and data only, which a
    checkpoint fingerprints (``cenlmc_jax.checkpoint``: NumPyro's ``potential_fn`` holds
    PyTreeDefs, C objects with no stable description); the NumPyroModel is looked up in
    :data:`_FROM_NUMPYRO`.
    """
    _FROM_NUMPYRO[fn, id(kwargs)] = model

    def logdensity_fn(x):
        return _FROM_NUMPYRO[fn, id(kwargs)].logdensity_fn(x)

    path, _, name = spec.rpartition(":")
    return targets_mod.Target(
        f"{os.path.basename(path)}:{name} (NumPyro, unconstrained)",
        model.d,
        logdensity_fn,
        None,
        None,
        None,
        None,
    )


def constrained(model, res: RunResult) -> tuple:
    """A NumPyro model's run with its trace mapped by ``model.constrain`` (NumPyro's
    transforms, deterministic sites included), flattened per draw (sites sorted, C
    order), and the names of those columns.
    """
    sites = jax.jit(jax.vmap(jax.vmap(model.constrain)))(
        res.trace
    )  # trace: (draws, chains, d)
    names = []
    for site in sorted(sites):
        shape = np.shape(sites[site])[2:]
        names += (
            [site]
            if shape == ()
            else [f"{site}[{','.join(map(str, i))}]" for i in np.ndindex(*shape)]
        )
    flat = jnp.concatenate(
        [jnp.reshape(sites[s], np.shape(sites[s])[:2] + (-1,)) for s in sorted(sites)],
        axis=-1,
    )
    return res._replace(trace=flat), names


def shown(setup: Setup, res: RunResult) -> tuple:
    """The run the summary and ``run.nc`` show, and its coordinate names (None:
    ``x[i]``): a NumPyro model's constrained sites (:func:`constrained`), else the run
    itself.
    """
    if setup.model is None or res.trace is None:
        return res, None
    return constrained(setup.model, res)


def load_init(path: str) -> np.ndarray:
    """``--init FILE.npy``: finite starting positions ``(N, d)`` or ``(d,)``, data only.

    Floating point of the file's precision, at least float32 (integers: float64);
    :func:`init_positions` decides the positions' dtype.
    """
    try:
        init = np.load(
            path, allow_pickle=False
        )  # data only: a pickle (code) is refused
    except Exception as exc:
        _refuse_pickles("--init", path, exc)
        raise UsageError(f"--init {path}: not a readable .npy file ({exc})") from exc
    if not isinstance(init, np.ndarray):  # an .npz archive
        init.close()
        raise UsageError(
            f"--init {path}: an .npz archive; give one array in an .npy file "
            "(numpy.save)"
        )
    if init.dtype.kind not in "biuf":
        raise UsageError(f"--init {path}: must hold numbers; got dtype {init.dtype}")
    if init.ndim not in (1, 2) or init.size == 0 or not np.all(np.isfinite(init)):
        raise UsageError(
            f"--init {path}: must hold finite positions of shape (N, d) or (d,); got "
            f"shape {init.shape}"
        )
    return init.astype(np.result_type(init.dtype, np.float32))


def init_positions(init: np.ndarray, noise: jax.Array) -> jax.Array:
    """The starting positions of ``--init``: the rows of ``init``, or ``init`` plus
    ``noise``; said on stderr with their dtype.

    The file's dtype is kept when JAX's float64 is on (``JAX_ENABLE_X64=1``, or a model
    file that sets ``jax_enable_x64``), so a float64 model runs in float64; otherwise
    float32, JAX's default.
    """
    x64 = jax.config.jax_enable_x64
    dtype = init.dtype if x64 else np.dtype(np.float32)
    if init.dtype == dtype:
        why = "the file's dtype"
    else:
        why = (
            f"the file holds {init.dtype}; JAX's float64 is off: set "
            "JAX_ENABLE_X64=1, or jax_enable_x64 in the model file, to keep it"
        )
    print(f"cenlmc-jax: --init: {dtype} starting positions ({why})", file=sys.stderr)
    positions = jnp.asarray(init, dtype)
    return positions if init.ndim == 2 else (positions + noise).astype(dtype)


def curvature(
    target: targets_mod.Target, positions: jax.Array, gradients: bool = True
) -> tuple:
    """The curvature scale ``c`` the default step sizes use, and where it came from.

    ``gradients`` False (a gradient-free sampler, whose model may be a black box that
    cannot be differentiated): no mode search or Hessian; ``c = 1`` unless the target
    states its scale.
    """
    if target.L is not None:
        return float(target.L), f"L = {target.L:.4g} of the target"
    if target.cov is not None:
        lam = float(np.linalg.eigvalsh(np.asarray(target.cov)).min())
        return 1.0 / lam, f"1/(smallest variance) = {1.0 / lam:.4g} of the target"
    if not gradients:
        return 1.0, (
            "1 (a gradient-free sampler: the model is not differentiated; the "
            "burn-in's adaptation sets the step)"
        )
    mode = tuning.find_f_star(target.logdensity_fn, positions).position

    def hvp(v):  # Hessian of f = -log p at the mode, times v
        return jax.jvp(jax.grad(lambda x: -target.logdensity_fn(x)), (mode,), (v,))[1]

    hvp = jax.jit(hvp)
    v = jnp.ones_like(mode) / math.sqrt(mode.shape[0])
    lam = float("nan")
    for _ in range(
        50
    ):  # power iteration: the largest eigenvalue of a PSD-at-the-mode Hessian
        w = hvp(v)
        lam = float(jnp.vdot(v, w))
        norm = float(jnp.linalg.norm(w))
        if not (math.isfinite(norm) and norm > 0):
            break
        v = w / norm
    if not (math.isfinite(lam) and lam > 0):
        return 1.0, "1 (no curvature found at the mode: unit scale assumed)"
    return (
        lam,
        f"{lam:.4g}, the largest Hessian eigenvalue of -log p at the mode (power "
        "iteration)",
    )


# --------------------------------------------------------------------------
# The job.
# --------------------------------------------------------------------------


def _target(args, data: dict | None, init: np.ndarray | None) -> tuple:
    """The target, and the NumPyro model it came from (None: a built-in target or a log
    density).
    """
    if args.model is not None:
        fn, _, module = _import_model(args.model)
        loaded = load_numpyro_model(args.model, fn, module, data)
        if loaded is not None:
            model, kwargs = loaded
            if args.dim is not None and args.dim != model.d:
                raise UsageError(
                    f"--dim {args.dim}: the NumPyro model has d = {model.d} "
                    "unconstrained coordinates"
                )
            args.trace = True  # the constrained summary needs the draws
            return numpyro_target(args.model, fn, kwargs, model), model
        dim = (
            args.dim
            if args.dim is not None
            else (init.shape[-1] if init is not None else None)
        )
        if dim is None:
            raise UsageError(
                "--model needs --dim D or --init FILE.npy to know the dimension"
            )
        return load_model(args.model, data, dim, fn), None
    try:
        target = targets_mod.get_target(args.target, args.dim)
    except (ValueError, TypeError) as exc:
        raise UsageError(f"--dim {args.dim} for --target {args.target}: {exc}") from exc
    if args.dim is not None and target.dim != args.dim:
        raise UsageError(
            f"--target {args.target} has a fixed dimension {target.dim}; --dim "
            f"{args.dim} does not apply"
        )
    return target, None


def checkpoint_target(args, target, data: dict | None = None):
    """The target a checkpointed job runs: ``target``, or one whose log density is
    fingerprinted by its file's text when the checkpoint cannot describe it.

    A checkpoint recognises a resume of its run by fingerprints
    (:func:`cenlmc_jax.checkpoint.fingerprint`), which refuse a model holding a C
    object (a TensorFlow-Probability-style object, a NumPy ``Generator``). ``--out``
    alone must not refuse such a model: its log density then declares a fingerprint
    (:data:`~cenlmc_jax.checkpoint.DECLARED_FINGERPRINT`) made of the ``--model``
    file's source text, ``data`` and the settings that change the result (not
    ``--steps``, which the checkpoint holds, nor :data:`RESUME_MAY_CHANGE`), and a
    note on stderr says so: a change in code the file imports is not seen.

    Args:
      args: the checked flags (``checkpoint`` None: no checkpoint, nothing to do).
      target: the job's target.
      data: ``--data``'s arrays, or None.

    Returns:
      ``target``, or a copy with the declaring log density.
    """
    if args.checkpoint is None:
        return target
    try:
        ckpt.fingerprint(target.logdensity_fn)
        return target
    except ckpt.Unfingerprintable as exc:
        reason = f"{exc.where or 'its log density'}: {exc.what}"
    path = args.model.rpartition(":")[0]
    with open(path, "rb") as fh:
        source = fh.read()
    config = {
        k: v
        for k, v in effective_config(args).items()
        if k not in RESUME_MAY_CHANGE and k != "steps"
    }
    declared = ckpt.fingerprint((source, sorted(config.items()), data))
    fn = target.logdensity_fn

    def logdensity_fn(x):
        return fn(x)

    setattr(logdensity_fn, ckpt.DECLARED_FINGERPRINT, f"--model source {declared}")
    print(
        f"cenlmc-jax: note: the model cannot be fingerprinted ({reason}); the "
        f"checkpoint recognises this run by the source text of {path} and the run's "
        "configuration instead (a change in code that file imports is not seen)",
        file=sys.stderr,
    )
    return target._replace(logdensity_fn=logdensity_fn)


#: ``--cpu-threads auto``: XLA's CPU pool gets one thread up to this many coordinates
#: ``N d`` (particles times dimension). Below it a step is many small operations, and
#: spreading each over a pool of a thread a core costs CPU without saving wall time:
#: benchmarks/results/cpu_threads.md (bench_cpu_threads.py) measures both.
ONE_THREAD_MAX_COORDS = 16_384
#: The environment variable that sets the size of XLA's CPU pool (jaxlib's CPU client
#: reads it when the backend starts; unset, a thread a core).
POOL_ENV = "PJRT_NPROC"


def _dimension_hint(args, init: np.ndarray | None) -> int | None:
    """The target's dimension where it is known before the model is loaded (loading a
    NumPyro model starts JAX's backend, after which the pool is fixed): ``--dim``,
    ``--init``'s, or a built-in target's; else None."""
    if args.dim is not None:
        return args.dim
    if init is not None:
        return init.shape[-1]
    if args.model is None and args.target in targets_mod.TARGETS:
        return targets_mod.get_target(args.target).dim
    return None


def use_cpu_threads(args, dim: int | None) -> int | None:
    """Size XLA's CPU pool for the job (``--cpu-threads``), before JAX's backend starts.

    ``auto``: one thread when ``particles * dim <= ONE_THREAD_MAX_COORDS``, nothing
    otherwise (a thread a core), nor when :data:`POOL_ENV` is already set or the
    dimension is not known yet. An integer sets the pool to that many threads. It only
    acts through :data:`POOL_ENV`, read when the backend starts: a backend already
    started (an in-process call after JAX ran, a model file that computed on import)
    keeps its pool, with a warning when the flag asked for a number.

    Args:
      args: the checked flags (``particles`` set).
      dim: the target's dimension, or None where it is not known yet.

    Returns:
      The threads set, or None where the pool was left as it is.
    """
    threads = args.cpu_threads
    if threads == "auto":
        if (
            os.environ.get(POOL_ENV)
            or dim is None
            or args.particles * dim > ONE_THREAD_MAX_COORDS
        ):
            return None
        threads = 1
    if backends_started():
        if args.cpu_threads != "auto":
            warnings.warn(
                f"--cpu-threads {threads}: JAX's backend has already started, so its "
                "CPU pool keeps its size (set PJRT_NPROC before starting Python)",
                RuntimeWarning,
                stacklevel=2,
            )
        return None
    os.environ[POOL_ENV] = str(threads)
    return threads


def cpu_pool_size() -> int:
    """The threads of XLA's CPU pool: :data:`POOL_ENV`, else the cores this process may
    run on (what jaxlib's CPU client takes), as of when the backend started.

    Returns:
      The number of threads.
    """
    try:
        return int(os.environ[POOL_ENV])
    except (KeyError, ValueError):
        return (
            len(os.sched_getaffinity(0))
            if hasattr(os, "sched_getaffinity")
            else (os.cpu_count() or 1)
        )


def job_key(seed: int) -> jax.Array:
    """The job's root key from ``--seed`` (``0 <= seed < 2^63``), one key per seed.

    ``jax.random.key(seed)`` for a seed below ``2^32``. Above, the key of its low 32
    bits folded with its high bits: ``jax.random.key`` keeps only the low 32 bits
    unless float64 is on, so seeds ``2^32`` apart would silently run the same chains.

    Args:
      seed: ``--seed``.

    Returns:
      A typed PRNG key.
    """
    key = jax.random.key(seed & 0xFFFFFFFF)
    return jax.random.fold_in(key, seed >> 32) if seed >> 32 else key


@functools.partial(jax.jit, static_argnums=(1, 2))
def _keys_and_noise(key, n: int, d: int, scale) -> tuple:
    """The job's four keys (starting noise, run, sampler set-up, the step-halving
    check's h/2 run: the run's key folded with 2) and the starting noise
    ``scale N(0, I)``, ``(n, d)``: one compiled program."""
    keys = tuple(jax.random.split(key, 3))
    check = jax.random.fold_in(keys[1], 2)
    return (*keys, check), normal(keys[0], (n, d)) * scale


def _setup(args) -> Setup:
    data = load_data(args.data) if args.data is not None else None
    init = load_init(args.init) if args.init is not None else None
    if init is not None and init.ndim == 2:
        if args.particles is not None and args.particles != init.shape[0]:
            raise UsageError(
                f"--particles {args.particles} does not match the {init.shape[0]} "
                "rows of --init"
            )
        args.particles = init.shape[0]
    args.particles = args.particles or DEFAULT_PARTICLES
    use_cpu_threads(args, _dimension_hint(args, init))
    target, model = _target(args, data, init)
    target = checkpoint_target(args, target, data)
    if init is not None and init.shape[-1] != target.dim:
        raise UsageError(
            f"--init has points of dimension {init.shape[-1]}; the target has d = "
            f"{target.dim}"
        )
    if args.n_star is not None and args.n_star > args.particles - 1:
        raise UsageError(
            f"--n-star {args.n_star} must be at most N - 1 = {args.particles - 1} "
            "(the neighbours a particle can have)"
        )
    keys, noise = _keys_and_noise(
        job_key(args.seed), args.particles, target.dim, args.init_scale
    )
    positions = noise if init is None else init_positions(init, noise)
    if exact_warmup(args):
        # the warm-up finds its own mode and step: a mode search and power
        # iteration here would only be compiled and run twice
        c, c_source = None, "not used (cj.langevin_warmup tunes the step)"
    else:
        c, c_source = curvature(
            target, positions, gradients=not SPECS[args.sampler].gradient_free
        )
    # the warm-up's reports (separate modes, an unsettled kinetic phase) are shown as
    # they come and kept for the verdict: a draw of one mode of several must not pass
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConvergenceWarning)
        job = build_job(args.sampler, args, target, positions, c, keys)
    for w in caught:
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    job = job._replace(
        warmup_problems=tuple(
            str(w.message) for w in caught if issubclass(w.category, ConvergenceWarning)
        )
    )
    # many chains in superchains (the exact warm-up's hand-over), no --steps: the run
    # goes on until the many-chain verdict holds (cj.sample_until), streamed
    args.adaptive = (
        args.steps is None
        and not args.trace
        and convergence.in_superchains(getattr(job.state, "position", None))
    )
    if args.steps is None and not args.adaptive:
        args.steps = default_steps(job, args.thin)
    return Setup(target, job, keys, c, c_source, model)


#: The R-hat the default run length aims below: the verdict's threshold
#: (``verdict.RHAT_MAX``, which imports this module; tests/cli/test_cli_posteriordb.py
#: checks that they agree).
RHAT_TARGET = 1.1
#: The longest run :func:`default_steps` asks for (a longer one would hold 2,000 x
#: 20,000 x d draws with --trace).
MAX_DEFAULT_STEPS = 20_000


def default_steps(job: Job, thin: int = 1) -> int:
    """``--steps`` unset: :data:`DEFAULT_STEPS`, or for a job warmed up by
    ``cj.langevin_warmup`` (its ``relaxation_steps`` ``τ``, steps per e-fold of the
    slowest whitened coordinate) enough steps that the split R-hat over particles stays
    below :data:`RHAT_TARGET`; a multiple of ``thin``, at
    most :data:`MAX_DEFAULT_STEPS`.

    A run of ``T`` steps has ``T / (2 τ_int)`` effective draws per half-chain, and for
    stationary chains the split R-hat is about ``sqrt(1 + 1 / ESS_half)`` (Vehtari et
    al. 2021; cenlmc_jax.diagnostics.convergence). ``τ_int`` is ``2τ`` for a Gaussian
    direction (an AR(1) of lag-1 correlation ``e^{-1/τ}``), but on a skewed posterior
    the short-lag e-fold misses the slow tail: on garch11 the bulk ESS of a run gave
    ``τ_int`` about four times the warm-up's ``τ``
    (benchmarks/results/cli_posteriordb.md); ``τ_int = 4τ`` is taken. Asking ``ESS_half
    >= 2 / (R² − 1)``, twice the value at which R-hat reaches ``R`` (its estimate from
    64 particles is noisy), gives ``T = 16τ / (R² − 1)``: ``76τ`` for R = 1.1.
    """
    tau = job.parameters.get("relaxation_steps")
    steps = DEFAULT_STEPS
    if tau is not None and math.isfinite(tau) and tau > 0:
        steps = max(
            steps,
            min(MAX_DEFAULT_STEPS, math.ceil(16.0 * tau / (RHAT_TARGET**2 - 1.0))),
        )
    return -(-steps // thin) * thin


def setup(args) -> Setup:
    """Target, starting positions, keys and the sampler, from the checked flags
    (``parser.check_args``).
    """
    try:
        return _setup(args)
    # a sampler or target refused a value: a usage error, not a traceback
    except ValueError as exc:
        raise UsageError(str(exc)) from exc


def start_out_dir(args) -> None:
    """``--out DIR``: created, with the effective configuration in ``DIR/config.toml``
    before the run.
    """
    if args.out is not None:
        os.makedirs(args.out, exist_ok=True)
        write_config(os.path.join(args.out, "config.toml"), effective_config(args))


#: The module name a ``--model`` file is imported under (:func:`_import_model`).
USER_MODEL_MODULE = "cenlmc_user_model_"


def _in_import(frame) -> bool:
    """Whether ``frame`` runs inside an import that a Ctrl-C must not stop half-way.

    The innermost import in progress is the one that matters: where that is the
    ``--model`` file's own code (its top level, or what it calls), stopping it is safe
    (Python drops the half-made module), so a slow model import is interrupted at once;
    a library it imports in turn (jaxlib's compiled modules) is not.
    """
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib._bootstrap"):
            return True
        if str(frame.f_globals.get("__name__", "")).startswith(USER_MODEL_MODULE):
            return False
        frame = frame.f_back
    return False


#: A Ctrl-C within this many seconds of the one that stopped the job is only recorded:
#: a second press (or a burst of signals) must not raise again in the middle of the stop
#: and end the command with a traceback. A later one raises again: the first may have
#: been swallowed on its way (an ``except Exception`` around an evaluation of a
#: host-callback model, whose interrupt JAX turns into an error).
REPEAT_S = 2.0

#: Set by a Ctrl-C during the job; read from any thread by :func:`ctrl_c_pending`.
_CTRL_C = threading.Event()
#: The read end of the signal wake-up pipe while :func:`ctrl_c_recorded` runs.
_WAKEUP_READ = [None]


def ctrl_c_pending() -> bool:
    """Whether a Ctrl-C has come during the job, seen from any thread.

    Python runs a signal's handler in the main thread only, between two bytecodes: while
    the main thread waits in XLA for a computation (a host-callback model's values
    computed on XLA's own threads), the handler waits with it. The signal's C handler
    writes the signal's number to the wake-up pipe at once (``signal.set_wakeup_fd``),
    and this reads it.

    Returns:
      True once a SIGINT came while :func:`ctrl_c_recorded` ran.
    """
    fd = _WAKEUP_READ[0]
    if not _CTRL_C.is_set() and fd is not None:
        try:
            if signal.SIGINT in os.read(fd, 512):
                _CTRL_C.set()
        except OSError:  # nothing written (non-blocking), or the pipe already closed
            pass
    return _CTRL_C.is_set()


class _QuietCallbackInterrupt(logging.Filter):
    """Drops JAX's log of a host callback stopped by a Ctrl-C (``jax.pure_callback
    failed`` and a traceback): the command's one line says it."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[0] if record.exc_info else None
        return not (exc is not None and issubclass(exc, KeyboardInterrupt))


#: The logger of JAX's host callbacks (``jax._src.callback``).
CALLBACK_LOGGER = "jax._src.callback"


@contextlib.contextmanager
def _wakeup_pipe():
    """The signal wake-up pipe read by :func:`ctrl_c_pending` (none where another
    wake-up file is set already, as an asyncio loop's)."""
    read, write = os.pipe()
    os.set_blocking(read, False)
    os.set_blocking(write, False)
    previous = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
    if previous != -1:
        signal.set_wakeup_fd(previous)
        os.close(read)
        os.close(write)
        yield
        return
    _WAKEUP_READ[0] = read
    try:
        yield
    finally:
        signal.set_wakeup_fd(-1)
        _WAKEUP_READ[0] = None
        os.close(read)
        os.close(write)


@contextlib.contextmanager
def ctrl_c_recorded(interrupted: list, quiet_after: bool = False):
    """Record every Ctrl-C in ``interrupted`` and stop the job with a KeyboardInterrupt
    where that is safe.

    * One KeyboardInterrupt per stop: a Ctrl-C within :data:`REPEAT_S` of the one
      raised, or after the job has stopped (the function this yields called), is only
      recorded, so two presses end the command with one line, not a traceback.
    * A KeyboardInterrupt raised while a garbage-collector callback runs (JAX
      installs one) is "unraisable": Python prints it and goes on. The
      unraisable hook keeps it quiet and delivers the signal again
      (``_thread.interrupt_main``), so the job stops at once, not at its end.
    * One that would be raised inside an import is delivered again 0.05 s
      later: an import of one of jaxlib's compiled (nanobind) modules stopped
      half-way frees the half-made module, and that crashes the interpreter.
    * A host-callback model checks :func:`ctrl_c_pending` at each evaluation
      (:func:`ctrl_c_checked`), also while the main thread waits in XLA; the
      KeyboardInterrupt raised in a callback reaches the job as JAX's error, and JAX's
      log of it is dropped.
    * A SIGINT that was ignored when the job started (a background job)
      stays ignored.

    Stopping XLA's compilation or a computation this way is clean, but leaves
    that work running on XLA's own threads; :func:`cenlmc_jax.cli.main` says
    why the command then ends without Python's shutdown.

    Args:
      interrupted: a list; a Ctrl-C appends True.
      quiet_after: after an interrupted job, leave SIGINT ignored (the command ends
        the process next) instead of putting Python's handler back.

    Yields:
      ``stopped()``: call it once the job has stopped; later Ctrl-Cs are only
      recorded.
    """
    stopped = [False]
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):
        yield lambda: None
        return
    active, raised_at = [True], []
    _CTRL_C.clear()

    def deliver_again(delay: float) -> None:
        timer = threading.Timer(
            delay, lambda: active[0] and _thread.interrupt_main(signal.SIGINT)
        )
        timer.daemon = True
        timer.start()

    def on_sigint(signum, frame):
        interrupted.append(True)
        _CTRL_C.set()
        if stopped[0] or (raised_at and time.monotonic() - raised_at[-1] < REPEAT_S):
            return
        if _in_import(frame):
            deliver_again(0.05)
            return
        raised_at.append(time.monotonic())
        raise KeyboardInterrupt

    def unraisable(info):
        if issubclass(info.exc_type, KeyboardInterrupt):
            raised_at.clear()  # swallowed: the next delivery must raise
            deliver_again(0.0)
        else:
            previous_hook(info)

    def stop() -> None:
        stopped[0] = True

    previous_hook = sys.unraisablehook
    quiet = _QuietCallbackInterrupt()
    logging.getLogger(CALLBACK_LOGGER).addFilter(quiet)
    signal.signal(signal.SIGINT, on_sigint)
    sys.unraisablehook = unraisable
    try:
        with _wakeup_pipe():
            yield stop
    finally:
        stopped[0] = True
        active[0] = False
        signal.signal(
            signal.SIGINT,
            signal.SIG_IGN
            if quiet_after and interrupted
            else signal.default_int_handler,
        )
        sys.unraisablehook = previous_hook
        logging.getLogger(CALLBACK_LOGGER).removeFilter(quiet)
        _CTRL_C.clear()


def _raise_on_ctrl_c(value: np.ndarray) -> np.ndarray:
    """The host side of :func:`ctrl_c_checked`: zeros like ``value``, or a
    KeyboardInterrupt once a Ctrl-C has come."""
    if ctrl_c_pending():
        raise KeyboardInterrupt
    return np.zeros_like(value)


def ctrl_c_checked(logdensity_fn, x):
    """``logdensity_fn(x)``, with a check for a Ctrl-C on the host beside it.

    A model whose values come from a host callback (``jax.pure_callback``) runs them on
    XLA's threads while the main thread waits in XLA for the whole computation (a
    chunk of the run: seconds to minutes), and Python's handler of a Ctrl-C runs only
    when that wait ends. A second callback after the model's, given its value, raises a
    KeyboardInterrupt once :func:`ctrl_c_pending`: XLA stops the computation there, and
    the job stops within one evaluation. Its output is zeros, added outside any
    derivative (``stop_gradient``): the value and gradient are the model's, bit for bit.

    Args:
      logdensity_fn: the model's log density of one point.
      x: a point, ``(d,)``.

    Returns:
      ``logdensity_fn(x)``.
    """
    value = logdensity_fn(x)
    shape = jax.ShapeDtypeStruct(jnp.shape(value), jnp.result_type(value))
    zero = jax.pure_callback(
        _raise_on_ctrl_c,
        shape,
        jax.lax.stop_gradient(value),
        vmap_method="expand_dims",
    )
    return value + jax.lax.stop_gradient(zero)


#: The primitives that run Python on the host during a computation.
HOST_CALLBACKS = frozenset({"pure_callback", "io_callback"})


def calls_the_host(jaxpr) -> bool:
    """Whether ``jaxpr`` calls a host callback (:data:`HOST_CALLBACKS`), in its own
    equations or any inner jaxpr (``jit``, ``scan``, ``cond``, ``custom_jvp``).

    Args:
      jaxpr: a ``Jaxpr`` or ``ClosedJaxpr`` (``jax.make_jaxpr``'s).

    Returns:
      True where a callback primitive is found.
    """
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
    for eqn in jaxpr.eqns:
        if eqn.primitive.name in HOST_CALLBACKS:
            return True
        for value in eqn.params.values():
            inner = value if isinstance(value, (tuple, list)) else (value,)
            for v in inner:
                if hasattr(v, "eqns") or hasattr(getattr(v, "jaxpr", None), "eqns"):
                    if calls_the_host(v):
                        return True
    return False


def say_interrupted(args) -> None:
    """After a Ctrl-C: what the job left and how to go on (``args`` may be unchecked if
    it came early).
    """
    out, checkpoint = args.out, args.checkpoint
    if checkpoint is not None and os.path.exists(checkpoint):
        again = (
            f"cenlmc-jax sample --resume --out {out}"
            if out
            else "the same command with --resume"
        )
        text = (
            f"interrupted; the checkpoint {checkpoint} holds the last finished "
            f"chunk. Continue with: {again}"
        )
    elif out is not None and os.path.isfile(os.path.join(out, "run.json")):
        text = f"interrupted after the run finished; its outputs in {out} are written"
    elif out is not None and not os.path.isdir(out):
        text = (
            f"interrupted before the run started: nothing was written to {out}; "
            "the same command starts it afresh"
        )
    elif out is not None and set(os.listdir(out)) & UNFINISHED_OUTPUTS:
        text = (
            "interrupted while the outputs were written (no run.json yet): the run "
            f"is not finished; the same command starts afresh in {out}, and so does "
            f"cenlmc-jax sample --resume --out {out}"
        )
    elif out is not None:
        text = (
            "interrupted before the first checkpoint (every --checkpoint-every "
            "steps): nothing to continue; the same command starts afresh in "
            f"{out}, and so does cenlmc-jax sample --resume --out {out}"
        )
    elif checkpoint is not None:
        text = (
            f"interrupted before the first checkpoint ({checkpoint}): the same "
            "command starts afresh"
        )
    else:
        text = (
            "interrupted before any checkpoint was written (--checkpoint PATH or "
            "--out DIR make runs resumable)"
        )
    print(f"\ncenlmc-jax: {text}", file=sys.stderr)


def _adaptive(args) -> bool:
    return bool(getattr(args, "adaptive", False))


def _run_until(args, job: Job, keys) -> RunResult:
    """No ``--steps``, chains in superchains: ``cj.sample_until`` (segments of one
    relaxation time, doubling; at most :data:`MAX_DEFAULT_STEPS`), a line per check on
    stderr with ``--progress`` saying why the run goes on. It keeps no checkpoint: an
    interrupted run starts afresh (the run after the warm-up is short)."""

    def show(steps, diag):
        if args.progress:
            why = diag.going_on
            state = (
                "the verdict holds, stopping"
                if not why
                else "running on: "
                + why[0].split(" (")[0]
                + (f" (and {len(why) - 1} more)" if len(why) > 1 else "")
            )
            memory = (
                ""
                if diag.half_corr is None
                else f", memory max {np.nanmax(diag.half_corr):.2f}"
            )
            print(
                f"  [{steps} steps] nested R-hat max "
                f"{np.nanmax(diag.nested_rhat):.4f}{memory}, ESS min "
                f"{np.nanmin(diag.ess):.0f}: {state}",
                file=sys.stderr,
            )

    return sample_until(
        keys[1],
        job.algorithm,
        job.state,
        max_steps=MAX_DEFAULT_STEPS,
        segment_steps=default_segment(job.parameters.get("relaxation_steps")),
        progress=show,
    )


def run_job(args, setup: Setup) -> Run:
    """The driver on the job (checkpointed with ``--checkpoint``); a Ctrl-C raises
    KeyboardInterrupt.
    """
    job, keys = setup.job, setup.keys
    chunk = (
        max(args.thin, args.checkpoint_every // args.thin * args.thin)
        if args.checkpoint
        else None
    )
    burn_in = (
        args.burn_in - job.warmup_steps
    )  # steps the driver runs unrecorded (a warm-up ran the others)
    t0 = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter(
            "always", RuntimeWarning
        )  # the driver's divergence and clipping reports
        try:
            res = (
                _run_until(args, job, keys)
                if _adaptive(args)
                else cj.sample(
                    keys[1],
                    job.algorithm,
                    job.state,
                    args.steps,
                    burn_in=burn_in,
                    thin=args.thin,
                    mode="trace" if args.trace else "stream",
                    progress=getattr(args, "progress_bar", False),
                    on_divergence="stop",
                    checkpoint_path=args.checkpoint,
                    chunk_size=chunk,
                    check_convergence=False,
                )
            )  # the verdict runs the same checks (verdict.problems)
        # the checkpoint is another run's, or damaged: checked before any step
        except ValueError as exc:
            if args.checkpoint is None or "checkpoint_path" not in str(exc):
                raise
            flag = "--resume" if args.resume else "--checkpoint"
            raise UsageError(f"{flag}: {exc}") from exc
        jax.block_until_ready(res.state)
    if _adaptive(args):  # the kept window is the run's second half
        args.steps, burn_in = res.num_steps_done - res.burn_in, res.burn_in
    if res.trace is not None and not all(
        np.shape(leaf)[0] for leaf in jax.tree_util.tree_leaves(res.trace)
    ):
        res = res._replace(trace=None)  # nothing kept: the outputs say "no draws"
    elapsed = time.perf_counter() - t0
    messages = [
        str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)
    ]
    bias, note = step_halving_check(args, setup, res)
    return Run(res, elapsed, messages, burn_in, bias, note)


# --------------------------------------------------------------------------
# The step-halving bias check of the unadjusted samplers.
# --------------------------------------------------------------------------

#: ``--sampler`` names whose chains are unadjusted discretisations (no Metropolis
#: correction): their moments carry an ``O(h)`` bias on any target. The Langevin rows
#: of the table, and SGRHMC.
UNADJUSTED_EXTRA = ("sgrhmc",)


def unadjusted(sampler: str) -> bool:
    """Whether ``--sampler`` ``sampler`` is unadjusted (the bias check applies)."""
    return SPECS[sampler].langevin or sampler in UNADJUSTED_EXTRA


def bias_check_on(args) -> bool:
    """``--bias-check`` (default on; ``--no-bias-check`` skips it), read with a default:
    the parser's ``--bias-check/--no-bias-check`` (``argparse.BooleanOptionalAction``)
    may be absent."""
    return bool(getattr(args, "bias_check", True))


def half_step_sampler(args, setup: Setup):
    """``step_size -> SamplingAlgorithm``: the job's sampler with every parameter but
    the step size kept: ``job.at_step_size`` where the job carries its step size in the
    state (:func:`~cenlmc_jax.cli.samplers.step_size_traced`: the run's own compiled
    chunk, nothing traced or compiled again); otherwise a rebuilt sampler (a job warmed
    up by ``cj.langevin_warmup`` keeps its preconditioner, mean and CEnLMC parameters;
    the others are rebuilt by their row of the sampler table with ``--step-size`` and
    the chosen parameters as flags)."""
    job, target = setup.job, setup.target
    if job.at_step_size is not None:  # the run's own step function: no new program
        return job.at_step_size
    p = job.parameters
    if "inverse_mass_matrix" in p:  # cj.langevin_warmup's handover
        m_mat = np.asarray(p["inverse_mass_matrix"])
        if "eta" in p:
            return lambda h: cj.whitened(
                cj.cenlmc,
                target.logdensity_fn,
                h,
                p["eta"],
                p["r1"],
                p["r2"],
                int(p["n_star"]),
                p["m_f"],
                f_star=p["f_star"],
                inverse_mass_matrix=m_mat,
                mean=np.asarray(p["mean"]),
            )
        return lambda h: cj.lmc(target.logdensity_fn, h, inverse_mass_matrix=m_mat)
    fixed = {k: p[k] for k in ("eta", "r1", "r2", "n_star", "m_f") if k in p}
    positions = jnp.zeros((args.particles, target.dim))

    def make(h):
        flags = argparse_copy(args, step_size=h, **fixed)
        return build_job(
            args.sampler, flags, target, positions, setup.c, setup.keys
        ).algorithm

    return make


def argparse_copy(args, **changes):
    """A copy of the parsed flags with ``changes``."""
    copy = type(args)(**vars(args))
    for key, value in changes.items():
        setattr(copy, key, value)
    return copy


def step_halving_check(args, setup: Setup, res: RunResult) -> tuple:
    """The step-halving bias check of an unadjusted sampler's run
    (:func:`cenlmc_jax.run.step_halving_bias`), and why it did not run (or None).

    Returns ``(None, None)`` where it does not apply (an adjusted sampler, a run that
    diverged or kept no draw: the verdict reports those).
    """
    if not unadjusted(args.sampler) or res.diverged_at >= 0 or no_draws(res):
        return None, None
    if not bias_check_on(args):
        return None, "--no-bias-check"
    h = setup.job.parameters.get("step_size")
    if h is None or online.moments_and_se(res, res.thin) is None:
        return None, (
            "no online R-hat/ESS to give its standard errors (fewer than 4 kept "
            "draws a chain)"
        )
    key = setup.keys[3]
    try:
        with warnings.catch_warnings():  # the h/2 run's reports are not the run's
            warnings.simplefilter("ignore")
            check = step_halving_bias(
                key,
                half_step_sampler(args, setup),
                float(h),
                res,
                relaxation_steps=setup.job.parameters.get("relaxation_steps"),
            )
    except ValueError as exc:
        return None, f"the h/2 run failed: {exc}"
    return check, None


def no_draws(res: RunResult) -> bool:
    """The run kept no draw (it diverged before its first recorded step): no estimates
    at all.
    """
    return res.trace is None and (
        res.moments is None or not float(res.moments.count) > 0
    )


def kept_steps(res: RunResult) -> int:
    """Recorded (thinned) steps of the run."""
    if res.trace is not None:
        return int(jax.tree_util.tree_leaves(res.trace)[0].shape[0])
    if res.moments is None:
        return 0
    rows = int(np.prod(np.shape(res.state.position)[:-1])) or 1
    return int(round(float(res.moments.count) / rows))


def remove_checkpoint(path: str | None) -> None:
    if path is None:
        return
    if os.path.exists(path):
        os.remove(path)
    shutil.rmtree(path + ".chunks", ignore_errors=True)


# --------------------------------------------------------------------------
# The outputs.
# --------------------------------------------------------------------------


def _infos(res: RunResult) -> dict:
    return (
        {f"info_{k}": np.asarray(v) for k, v in res.info._asdict().items()}
        if res.info is not None
        else {}
    )


def _save_outputs(
    args, setup: Setup, run: Run, table: SummaryTable | None, record: dict
) -> list:
    """draws.npz or moments.npz, and with kept draws (``table`` not None) summary.csv,
    run.nc and the plots.
    """
    out, files, res = args.out, [], run.result
    final = {"final_position": np.asarray(res.state.position)}
    if res.trace is not None:
        path = os.path.join(out, "draws.npz")
        np.savez(
            path,
            draws=np.asarray(cj.diagnostics.chains_first(res)),
            **final,
            **_infos(res),
        )
    elif res.moments is None:  # a trace run that kept no draw: (chains, 0, d) draws
        path, pos = os.path.join(out, "draws.npz"), final["final_position"]
        np.savez(
            path,
            draws=np.empty((pos.shape[0], 0) + pos.shape[1:], pos.dtype),
            **final,
            **_infos(res),
        )
    else:
        path = os.path.join(out, "moments.npz")
        np.savez(
            path,
            mean=np.asarray(res.moments.mean),
            variance=np.asarray(res.moments.variance),
            count=np.asarray(res.moments.count),
            **final,
            **_infos(res),
        )
    files.append(path)
    if table is None:
        record["warnings"].append(
            "summary.csv, run.nc and plots not written: no draw was kept"
        )
        return files
    table.to_csv(os.path.join(out, "summary.csv"))
    files.append(os.path.join(out, "summary.csv"))
    if importlib.util.find_spec("arviz") is not None:
        try:
            idata = to_arviz(
                shown(setup, res)[0],
                burn_in=run.burn_in,
                thin=args.thin,
                sampler=args.sampler,
                parameters=setup.job.parameters,
                seed=args.seed,
            )
            idata.to_netcdf(os.path.join(out, "run.nc"))
            files.append(os.path.join(out, "run.nc"))
        except Exception as exc:  # a missing netCDF engine must not lose the run
            record["warnings"].append(
                f"run.nc not written: {type(exc).__name__}: {exc}"
            )
    else:
        record["warnings"].append(
            "run.nc not written: ArviZ is not installed (pip install "
            '"cenlmc_jax[arviz]")'
        )
    if args.plots:
        files += _save_plots(args, setup.target, res, run.burn_in)
    return files


def _save_plots(args, target, res, burn_in) -> list:
    folder = os.path.join(args.out, "plots")
    os.makedirs(folder, exist_ok=True)
    figures = {}
    if res.trace is not None:
        figures["trace"] = lambda: plots.plot_trace(res)
        figures["rank"] = lambda: plots.plot_rank(res)
        if np.ndim(res.state.position) >= 2:
            figures["ensemble"] = lambda: plots.plot_ensemble_pairs(res, target=target)
    figures["marginals"] = lambda: plots.plot_marginals(res, target)
    if (
        getattr(res.info, "grad_evals", None) is not None
        and SPECS[args.sampler].langevin
    ):
        figures["gradients"] = lambda: plots.plot_gradient_savings(res, burn_in=burn_in)
    written = []
    for name, make in figures.items():
        path = os.path.join(folder, f"{name}.png")
        make().savefig(path, dpi=90)
        written.append(path)
    return written


def _write_record(
    args,
    setup: Setup,
    run: Run,
    table: SummaryTable | None,
    problems: list,
    record: dict,
    files: list,
    t_start: float,
) -> str:
    """``OUT/run.json``: what was run, how long it took, what was written and the
    verdict.
    """
    job, target, res = setup.job, setup.target, run.result
    record.update(
        version=version_text(),
        command=["cenlmc-jax"] + sys.argv[1:],
        config=effective_config(args),
        seed=args.seed,
        sampler=args.sampler,
        description=job.description,
        parameters={
            k: (float(v) if isinstance(v, float) else v)
            for k, v in job.parameters.items()
        },
        target=dict(
            name=target.name,
            dim=target.dim,
            curvature=setup.c,
            curvature_source=setup.c_source,
        ),
        steps_done=int(res.num_steps_done) + job.warmup_steps,
        warmup_steps=job.warmup_steps,
        diverged_at=int(res.diverged_at),
        kept_steps=kept_steps(res),
        timings=dict(sampling_s=run.seconds, total_s=time.perf_counter() - t_start),
        reliable=not problems,
        problems=problems,
        summary_run=None if table is None else table.run,
        summary_notes=[] if table is None else list(table.notes),
        files=[
            os.path.basename(f)
            if os.path.dirname(f) == args.out
            else os.path.relpath(f, args.out)
            for f in files
        ]
        + ["config.toml", "run.json"],
    )
    # whole or absent (a Ctrl-C while it is written): run.json marks a finished run
    path = os.path.join(args.out, "run.json")
    with open(path + ".tmp", "w") as fh:
        json.dump(record, fh, indent=2, default=float)
    os.replace(path + ".tmp", path)
    return path


def _write_output_file(path: str, res: RunResult, table: SummaryTable | None) -> None:
    """``--output FILE``: final positions, moments (nan when no draw was kept) and
    infos, to exactly that path.
    """
    if res.moments is not None:
        mean, variance = np.asarray(res.moments.mean), np.asarray(res.moments.variance)
    elif table is not None:
        mean, variance = (
            np.asarray(table.columns["mean"]),
            np.asarray(table.columns["sd"]) ** 2,
        )
    else:
        mean = variance = np.full(np.shape(res.state.position)[-1:], np.nan)
    if no_draws(res):
        mean = variance = np.full_like(mean, np.nan)
    with open(
        path, "wb"
    ) as fh:  # a file object: np.savez adds no ".npz" to the name given
        np.savez(
            fh,
            final_position=np.asarray(res.state.position),
            mean=mean,
            variance=variance,
            **_infos(res),
        )


def write_outputs(
    args,
    setup: Setup,
    run: Run,
    table: SummaryTable | None,
    problems: list,
    record: dict,
    t_start: float,
) -> list:
    """Everything ``--out DIR`` and ``--output FILE`` ask for; the paths written."""
    files = []
    if args.out is not None:
        files = _save_outputs(args, setup, run, table, record)
        files.append(
            _write_record(args, setup, run, table, problems, record, files, t_start)
        )
    if args.output:
        _write_output_file(args.output, run.result, table)
        files.append(os.path.abspath(args.output))
    return files
