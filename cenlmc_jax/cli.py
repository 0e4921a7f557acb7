"""The batch-job command: ``cenlmc-jax sample`` and ``cenlmc-jax summary DIR``.

``cenlmc-jax sample`` with no arguments runs the main job (CEnLMC on the
built-in 2-D Gaussian) and prints a summary. With flags it runs any sampler
on a built-in target or on your own model:

    cenlmc-jax sample --model my_model.py:logp --data data.npz --dim 3 \\
        --trace --thin 5 --plots --out runs/first

* ``--model PATH.py:FUNCTION``: ``FUNCTION(x)`` returns the log density (up
  to a constant) of one point ``x: (d,)``; with ``--data FILE`` it is called
  as ``FUNCTION(x, data)``, ``data`` a dict of arrays: the arrays of an
  ``.npz``, or the columns of a ``.csv`` with a header row, by name. The
  dimension comes from ``--dim`` or from ``--init FILE.npy`` (starting
  positions, ``(N, d)`` or one point ``(d,)``).
* ``--config run.toml``: every flag as ``name = value`` (``burn-in`` or
  ``burn_in``); flags on the command line win. The effective configuration
  is written to ``OUT/config.toml`` and ``OUT/run.json``.
* ``--out DIR`` receives ``draws.npz`` (``--trace``: chains-first draws
  ``(chains or particles, draws, d)``) or ``moments.npz`` (streaming),
  ``summary.csv``, ``run.json`` (configuration, seed, version, steps done,
  ``diverged_at``, timings, the verdict), ``run.nc`` (ArviZ, when installed)
  and ``plots/*.png`` with ``--plots``. ``cenlmc-jax summary DIR`` prints it again.
* ``--checkpoint PATH`` (default ``DIR/checkpoint.npz`` with ``--out``)
  saves the run every ``--checkpoint-every`` steps; Ctrl-C leaves it there and
  ``--resume`` (same flags, or just ``--resume --out DIR``) continues to the
  same result as an uninterrupted run. A finished run removes it.

Default step sizes follow the target's curvature ``c`` (``L`` of
:mod:`cenlmc_jax.targets`, else the inverse of the smallest variance, else the
largest Hessian eigenvalue at the mode, by power iteration): Langevin samplers
use ``h = min(0.05, sqrt(2/N)) / c``, which keeps unadjusted Langevin's sd bias
(``≈ h c / 4`` relative) below half the standard error of a streamed estimate
from ``N`` particles. The Metropolis samplers (``rwmh``, ``irreversible-mh``)
adapt during the burn-in instead (:mod:`cenlmc_jax.adaptation`: dual averaging
of the step size to the optimal acceptance, a diagonal preconditioner from
Stan's windows, pooled over the chains), starting from ``1/sqrt(c)`` scales;
``--no-adapt`` keeps those scales.

The job must not print a wrong answer with exit status 0. After the run it
checks: divergence; CEnLMC's ensemble force unused (below 5% of
particle-steps); CEnLMC's gradient audit flagging a biased ensemble force
(``info.biased`` on a kept step: the measured variance inflation above
``ensemble.AUDIT_BIAS_THRESHOLD``); Metropolis acceptance below 5%; unadjusted Langevin's known
bias (Gaussian targets) above the reported standard error; rank-normalised
R-hat above 1.1 (with --trace); estimates more than 5 standard errors from a
known truth. Any of these prints ``UNRELIABLE`` and
exits 1 unless ``--allow-unreliable``. Exit status 2 is a usage error
(message and usage, no traceback); 130 an interrupted run.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import importlib.util
import json
import math
import os
import shutil
import signal
import sys
import threading
import time
import warnings
from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

import cenlmc_jax as cj
from cenlmc_jax import adaptation, ensemble, plots
from cenlmc_jax import targets as targets_mod
from cenlmc_jax import tuning
from cenlmc_jax.base import SamplingAlgorithm
from cenlmc_jax.summary import SummaryTable, summary, to_arviz

try:  # Python >= 3.11
    import tomllib
except ImportError:  # pragma: no cover - Python 3.10
    try:
        import tomli as tomllib
    except ImportError:
        tomllib = None

MAX_SEED = 2**63 - 1
DEFAULT_PARTICLES = 2000
ENSEMBLE_MIN_FRACTION = 0.05
ACCEPTANCE_MIN = 0.05
RHAT_MAX = 1.1
ADAPT_MIN_STEPS = 20  # the warm-up's schedule needs 20 steps for its windows
TRUTH_Z_MAX = 5.0
EXIT_UNRELIABLE, EXIT_USAGE, EXIT_INTERRUPTED = 1, 2, 130
LANGEVIN = ("cenlmc", "enlmc", "lmc")


class UsageError(Exception):
    """A bad flag value found after parsing: reported like argparse's errors (exit 2)."""


class Job(NamedTuple):
    """A sampler set up for the CLI: its object, its initial state, a description and its parameters.

    warmup_steps: burn-in steps already spent by a warm-up adaptation (the driver runs the rest).
    """

    algorithm: SamplingAlgorithm
    state: object
    description: str
    parameters: dict
    warmup_steps: int = 0


# --------------------------------------------------------------------------
# Flag types: bad values are usage errors (exit 2), never silently changed.
# --------------------------------------------------------------------------


def _int_type(minimum: int, maximum: Optional[int] = None):
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer; got {text!r}") from None
        if v < minimum or (maximum is not None and v > maximum):
            bound = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
            raise argparse.ArgumentTypeError(f"must be an integer {bound}; got {text}")
        return v

    return parse


def _float_type(*, positive: bool = True):
    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a number; got {text!r}") from None
        if not math.isfinite(v) or (v <= 0 if positive else v < 0):
            raise argparse.ArgumentTypeError(f"must be a finite number {'> 0' if positive else '>= 0'}; got {text}")
        return v

    return parse


# --------------------------------------------------------------------------
# Targets: built-in, or a user's model file.
# --------------------------------------------------------------------------


def _load_data(path: str) -> dict:
    """``--data``: an ``.npz`` (its arrays) or a ``.csv`` with a header row (its columns), by name."""
    if path.endswith(".npz"):
        try:
            with np.load(path, allow_pickle=False) as f:
                return {k: f[k] for k in f.files}
        except Exception as exc:
            raise UsageError(f"--data {path}: not a readable .npz file ({exc})") from exc
    if path.endswith(".csv"):
        try:
            table = np.genfromtxt(path, delimiter=",", names=True, dtype=np.float64, encoding="utf-8")
        except Exception as exc:
            raise UsageError(f"--data {path}: not a readable .csv file with a header row ({exc})") from exc
        if table.dtype.names is None:
            raise UsageError(f"--data {path}: the .csv needs a header row naming its columns")
        table = np.atleast_1d(table)
        data = {name: np.asarray(table[name]) for name in table.dtype.names}
        bad = [k for k, v in data.items() if np.isnan(v).any()]
        if bad:
            raise UsageError(f"--data {path}: columns {bad} hold empty or non-numeric values")
        return data
    raise UsageError(f"--data must be an .npz or a .csv file; got {path!r}")


def _load_model(spec: str, data: Optional[dict], dim: int) -> targets_mod.Target:
    path, sep, name = spec.rpartition(":")
    if not sep or not path.endswith(".py") or not name.isidentifier():
        raise UsageError(f"--model must be PATH.py:FUNCTION; got {spec!r}")
    module_name = "cenlmc_user_model_" + "".join(c if c.isalnum() else "_" for c in os.path.abspath(path))
    try:
        loader_spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(loader_spec)
        loader_spec.loader.exec_module(module)
    except Exception as exc:
        raise UsageError(f"--model {spec}: importing {path} failed: {type(exc).__name__}: {exc}") from exc
    fn = getattr(module, name, None)
    if not callable(fn):
        raise UsageError(f"--model {spec}: {path} defines no function {name!r}")
    if data is None:
        logdensity_fn = fn
    else:
        arrays = {k: jnp.asarray(v) for k, v in data.items()}

        def logdensity_fn(x):
            return fn(x, arrays)

    try:
        out = jax.eval_shape(logdensity_fn, jax.ShapeDtypeStruct((dim,), jnp.float32))
    except Exception as exc:
        call = f"{name}(x, data)" if data is not None else f"{name}(x)"
        raise UsageError(f"--model {spec}: {call} failed on a point x of shape ({dim},): {type(exc).__name__}: {exc}"
                         ) from exc
    if getattr(out, "shape", None) != () or not jnp.issubdtype(out.dtype, jnp.floating):
        raise UsageError(f"--model {spec}: {name} must return a floating scalar (the log density of one point); "
                         f"got shape {getattr(out, 'shape', type(out).__name__)}")
    return targets_mod.Target(f"{os.path.basename(path)}:{name}", dim, logdensity_fn, None, None, None, None, data)


def _load_init(path: str) -> np.ndarray:
    try:
        init = np.load(path, allow_pickle=False)
    except Exception as exc:
        raise UsageError(f"--init {path}: not a readable .npy file ({exc})") from exc
    if init.ndim not in (1, 2) or init.size == 0 or not np.all(np.isfinite(init)):
        raise UsageError(f"--init {path}: must hold finite positions of shape (N, d) or (d,); got shape {init.shape}")
    return init.astype(np.float32)


def _curvature(target: targets_mod.Target, positions: jax.Array) -> tuple:
    """The curvature scale ``c`` the default step sizes use, and where it came from."""
    if target.L is not None:
        return float(target.L), f"L = {target.L:.4g} of the target"
    if target.cov is not None:
        lam = float(np.linalg.eigvalsh(np.asarray(target.cov)).min())
        return 1.0 / lam, f"1/(smallest variance) = {1.0 / lam:.4g} of the target"
    mode = tuning.find_f_star(target.logdensity_fn, positions).position

    def hvp(v):  # Hessian of f = -log p at the mode, times v
        return jax.jvp(jax.grad(lambda x: -target.logdensity_fn(x)), (mode,), (v,))[1]

    hvp = jax.jit(hvp)
    v = jnp.ones_like(mode) / math.sqrt(mode.shape[0])
    lam = float("nan")
    for _ in range(50):  # power iteration: the largest eigenvalue of a PSD-at-the-mode Hessian
        w = hvp(v)
        lam = float(jnp.vdot(v, w))
        norm = float(jnp.linalg.norm(w))
        if not (math.isfinite(norm) and norm > 0):
            break
        v = w / norm
    if not (math.isfinite(lam) and lam > 0):
        return 1.0, "1 (no curvature found at the mode: unit scale assumed)"
    return lam, f"{lam:.4g}, the largest Hessian eigenvalue of -log p at the mode (power iteration)"


# --------------------------------------------------------------------------
# Samplers.
# --------------------------------------------------------------------------


def _langevin_step(args, c) -> float:
    return args.step_size or min(0.05, math.sqrt(2.0 / args.particles)) / c


def _lmc(args, target, positions, c, keys):
    h = _langevin_step(args, c)
    algo = cj.lmc(target.logdensity_fn, h)
    return Job(algo, algo.init(positions), f"LMC (unadjusted Langevin), h={h:.4g}", dict(step_size=h))


def _cenlmc_params(args, target, h, c):
    """Flags where given, else ``tuning.suggest_cenlmc_params`` for this d, h, N and curvature."""
    mu = target.mu if target.mu is not None else c
    sug = tuning.suggest_cenlmc_params(target.dim, h, L=max(c, mu), mu=mu, num_particles=args.particles)
    pick = lambda flag, default: default if flag is None else flag  # noqa: E731
    params = dict(step_size=h, eta=pick(args.eta, sug.eta), r1=pick(args.r1, sug.r1), r2=pick(args.r2, sug.r2),
                  n_star=pick(args.n_star, sug.n_star), m_f=pick(args.m_f, sug.m_f))
    return params, sug


def _cenlmc(args, target, positions, c, keys):
    h = _langevin_step(args, c)
    p, sug = _cenlmc_params(args, target, h, c)
    algo = cj.cenlmc(target.logdensity_fn, h, p["eta"], p["r1"], p["r2"], p["n_star"], p["m_f"], f_star=target.f_star)
    desc = (f"CEnLMC (constrained ensemble Langevin), h={h:.4g}, eta={p['eta']:.3g}, r1={p['r1']:.3g}, "
            f"r2={p['r2']:.3g}, n_star={p['n_star']}, m_f={p['m_f']:.3g}")
    job = Job(algo, algo.init(positions), desc, p)
    return job, sug


def _enlmc(args, target, positions, c, keys):
    h = _langevin_step(args, c)
    eta = args.eta if args.eta is not None else _cenlmc_params(args, target, h, c)[0]["eta"]
    algo = cj.enlmc(target.logdensity_fn, h, eta)
    return Job(algo, algo.init(positions), f"EnLMC (unconstrained ensemble Langevin; provably unstable), h={h:.4g}, "
                                           f"eta={eta:.3g}", dict(step_size=h, eta=eta))


def _sgrhmc(args, target, positions, c, keys):
    """SGRHMC with the gSGRHMC metric, one chain per 'particle', noisy gradients
    (true gradient + N(0, grad_noise²)) when --grad-noise > 0."""
    eps = args.step_size or 0.05 / math.sqrt(c)
    est = (cj.noisy_grad_estimator(jax.grad(target.logdensity_fn), args.grad_noise) if args.grad_noise > 0
           else cj.grad_estimator_from_logdensity(target.logdensity_fn))
    f_star = target.f_star
    if f_star is None:
        f_star = float(tuning.find_f_star(target.logdensity_fn, positions).f_star)
    inv_metric = cj.gsgrhmc_inv_metric(lambda x: -target.logdensity_fn(x) - f_star)
    algo = cj.vmap_chains(cj.sgrhmc(est, eps, inv_metric))
    return Job(algo, algo.init(positions),
               f"gSGRHMC (metric 1.5 sqrt|U - U* + 0.5|), eps={eps:.4g}, gradient noise sd {args.grad_noise}",
               dict(step_size=eps, grad_noise=args.grad_noise, f_star=f_star))


def _plain(params: dict) -> dict:
    """Adapted parameters as JSON-friendly numbers and lists."""
    return {k: (np.asarray(v).tolist() if np.ndim(v) else float(v)) for k, v in params.items()}


def _adapted(args, kind, target, positions, keys, initial_step_size, describe):
    """Stan-style warm-up (``cenlmc_jax.adaptation``) over the burn-in: the pooled chains' step
    size by dual averaging and a diagonal preconditioner; a Job that continues from its states."""
    warm = adaptation.window_adaptation(kind, target.logdensity_fn, initial_step_size=initial_step_size)
    (states, params), info = warm.run_chains(keys[2], positions, args.burn_in)
    tail = np.asarray(info.acceptance_rate)[-max(1, args.burn_in // 4):]
    plain = _plain(params)
    desc = describe(plain) + f"; warm-up adapted over the {args.burn_in} burn-in steps (final acceptance " \
                             f"{float(tail.mean()):.2f})"
    return Job(cj.vmap_chains(warm.sampler(params)), states, desc, plain, warmup_steps=args.burn_in)


def _adapt(args) -> bool:
    return args.adapt and args.step_size is None and args.burn_in >= ADAPT_MIN_STEPS


def _irreversible_mh(args, target, positions, c, keys):
    scale = args.step_size or 0.8 / math.sqrt(c)
    if _adapt(args):
        return _adapted(args, "gamma", target, positions, keys, scale, lambda p: (
            f"irreversible MH, Gamma(2, scale) proposal, one chain per particle, scale per coordinate "
            f"{np.round(p['scale'], 4).tolist()}"))
    algo = cj.vmap_chains(cj.irreversible_mh(target.logdensity_fn, cj.gamma_proposal(2.0, scale)))
    return Job(algo, algo.init(positions, keys[2]),
               f"irreversible MH, Gamma(2, {scale:.4g}) proposal, one chain per particle", dict(scale=scale, shape=2.0))


def _rwmh(args, target, positions, c, keys):
    h = args.step_size or 2.38 / math.sqrt(target.dim * c)
    if _adapt(args):
        return _adapted(args, "rwmh", target, positions, keys, h, lambda p: (
            f"random-walk MH, N(0, {p['step_size']:.4g}^2 diag({np.round(p['proposal_cov'], 4).tolist()})) "
            "proposal, one chain per particle"))
    algo = cj.vmap_chains(cj.rwmh(target.logdensity_fn, h))
    return Job(algo, algo.init(positions), f"random-walk MH, N(0, {h:.4g}^2) proposal, one chain per particle",
               dict(step_size=h))


SAMPLERS: dict[str, Callable] = {
    "cenlmc": _cenlmc,
    "enlmc": _enlmc,
    "lmc": _lmc,
    "sgrhmc": _sgrhmc,
    "irreversible-mh": _irreversible_mh,
    "rwmh": _rwmh,
}
DEFAULT_SAMPLER = "cenlmc"


# --------------------------------------------------------------------------
# The parser and the configuration file.
# --------------------------------------------------------------------------


def _version_text() -> str:
    try:
        version = importlib.metadata.version("cenlmc_jax")
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover
        version = cj.__version__
    return f"cenlmc-jax {version} (jax {jax.__version__})"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cenlmc-jax", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=_version_text())
    sub = parser.add_subparsers(dest="command")
    p = sub.add_parser("sample", help="run a sampler on a built-in target or a model file; print a summary",
                       description="Run a sampler and print a summary (see the module docstring of cenlmc_jax.cli).")
    g = p.add_argument_group("what to sample")
    g.add_argument("--config", metavar="FILE.toml", help="read every flag from a TOML file (command line wins)")
    g.add_argument("--sampler", choices=sorted(SAMPLERS), default=DEFAULT_SAMPLER, help="(default: %(default)s)")
    g.add_argument("--target", choices=sorted(targets_mod.TARGETS), default=None,
                   help="built-in target (default: gaussian; not with --model)")
    g.add_argument("--model", metavar="PATH.py:FUNCTION",
                   help="your log density of one point x: (d,); FUNCTION(x, data) with --data")
    g.add_argument("--data", metavar="FILE", help=".npz (arrays) or .csv (columns, header row) passed to the model")
    g.add_argument("--init", metavar="FILE.npy", help="starting positions (N, d), or one point (d,) plus noise")
    g.add_argument("--dim", type=_int_type(1), default=None,
                   help="dimension (targets that take one; required by --model without --init)")
    g = p.add_argument_group("run length and sampler parameters")
    g.add_argument("--particles", type=_int_type(2), default=None,
                   help=f"particles or chains (default: {DEFAULT_PARTICLES}, or the rows of --init)")
    g.add_argument("--steps", type=_int_type(1), default=1000, help="recorded steps (default: %(default)s)")
    g.add_argument("--burn-in", type=_int_type(0), default=200, help="steps run first, not recorded (default: %(default)s)")
    g.add_argument("--step-size", type=_float_type(), default=None,
                   help="h (Langevin), eps (SGRHMC) or proposal scale (MH) (default: from the target's curvature)")
    for name, kind in (("eta", _float_type()), ("r1", _float_type()), ("r2", _float_type()), ("n-star", _int_type(1)),
                       ("m-f", _float_type())):
        g.add_argument(f"--{name}", type=kind, default=None,
                       help=f"cenlmc/enlmc: {name.replace('-', '_')} (default: tuning.suggest_cenlmc_params)")
    g.add_argument("--adapt", action=argparse.BooleanOptionalAction, default=True,
                   help="rwmh, irreversible-mh: adapt the step size and a diagonal preconditioner during the "
                        "burn-in (cenlmc_jax.adaptation; Stan's windows); off, or with --step-size: the "
                        "curvature rule (default: on)")
    g.add_argument("--grad-noise", type=_float_type(positive=False), default=0.0,
                   help="sgrhmc: sd of Gaussian noise added to gradients (default: %(default)s)")
    g.add_argument("--init-scale", type=_float_type(), default=1.0,
                   help="initial particles ~ N(0, scale^2 I), or around a --init point (default: %(default)s)")
    g.add_argument("--seed", type=_int_type(0, MAX_SEED), default=0, help="(default: %(default)s)")
    g = p.add_argument_group("output")
    g.add_argument("--out", metavar="DIR", help="write draws or moments, summary.csv, run.json, run.nc, plots here")
    g.add_argument("--trace", action=argparse.BooleanOptionalAction, default=False,
                   help="keep the draws (default: stream the moments only, O(N d) memory)")
    g.add_argument("--thin", type=_int_type(1), default=1, help="with --trace: keep every K-th step (default: 1)")
    g.add_argument("--plots", action=argparse.BooleanOptionalAction, default=False,
                   help="write OUT/plots/*.png (needs matplotlib and --out)")
    g.add_argument("--output", metavar="FILE.npz",
                   help="also write final particles, moments and infos to this exact file")
    g.add_argument("--checkpoint", metavar="PATH",
                   help="save the run here as it goes (default with --out: DIR/checkpoint.npz)")
    g.add_argument("--checkpoint-every", type=_int_type(1), default=100,
                   help="steps between checkpoints (default: %(default)s)")
    g.add_argument("--resume", action="store_true", help="continue the run in the checkpoint (same flags, or "
                                                         "--out DIR alone: its config.toml is read)")
    g.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress bar (default: on when stderr is a terminal and tqdm is installed)")
    g.add_argument("--allow-unreliable", action="store_true",
                   help="exit 0 even when the result fails the reliability checks (they are still printed)")
    s = sub.add_parser("summary", help="print the summary of a finished run directory")
    s.add_argument("dir", metavar="DIR", help="a --out directory of cenlmc-jax sample")
    return parser


_NOT_IN_CONFIG = {"command", "config", "resume", "dir"}


def _config_tokens(path: str, parser: argparse.ArgumentParser) -> list:
    """The flags of a TOML file, as command-line tokens (so argparse checks them like typed flags)."""
    if tomllib is None:
        raise UsageError("--config needs Python >= 3.11 (tomllib) or the tomli package: pip install tomli")
    if not os.path.isfile(path):
        raise UsageError(f"--config {path}: no such file")
    try:
        with open(path, "rb") as fh:
            table = tomllib.load(fh)
    except Exception as exc:
        raise UsageError(f"--config {path}: not valid TOML ({exc})") from exc
    sample = parser._subparsers._group_actions[0].choices["sample"]  # noqa: SLF001 - argparse has no public way
    known = {a.dest: a for a in sample._actions if a.option_strings}  # noqa: SLF001
    tokens = []
    for key, value in table.items():
        dest = key.replace("-", "_")
        if dest not in known or dest in _NOT_IN_CONFIG:
            raise UsageError(f"--config {path}: unknown setting {key!r} (expected flag names such as 'steps', "
                             "'burn-in', 'sampler')")
        flag = "--" + dest.replace("_", "-")
        action = known[dest]
        if isinstance(action, argparse.BooleanOptionalAction):
            if not isinstance(value, bool):
                raise UsageError(f"--config {path}: {key} must be true or false; got {value!r}")
            tokens.append(flag if value else "--no-" + flag[2:])
        elif action.nargs == 0:  # store_true
            if not isinstance(value, bool):
                raise UsageError(f"--config {path}: {key} must be true or false; got {value!r}")
            if value:
                tokens.append(flag)
        else:
            if isinstance(value, (dict, list)):
                raise UsageError(f"--config {path}: {key} must be a single value; got {value!r}")
            tokens += [flag, repr(value) if isinstance(value, float) else str(value)]
    return tokens


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    return json.dumps(str(v))  # a TOML basic string is a JSON string


def _effective_config(args) -> dict:
    skip = _NOT_IN_CONFIG | {"progress"}
    return {k.replace("_", "-"): v for k, v in sorted(vars(args).items()) if k not in skip and v is not None}


def _write_config(path: str, config: dict) -> None:
    lines = ["# cenlmc-jax sample: the effective configuration of this run (cenlmc-jax sample --config THIS_FILE)"]
    lines += [f"{k} = {_toml_value(v)}" for k, v in config.items()]
    with open(path, "w") as fh:
        fh.write("\n".join(lines) + "\n")


# --------------------------------------------------------------------------
# Checks before the run (exit 2) and after it (exit 1).
# --------------------------------------------------------------------------


def _abs(path: Optional[str]) -> Optional[str]:
    return None if path is None else os.path.abspath(path)


def _check_args(args) -> None:
    """Flag combinations and paths, before any work."""
    if args.model is None:
        args.target = args.target or "gaussian"
        if args.data is not None:
            raise UsageError("--data is passed to a --model; the built-in targets take none")
    elif args.target is not None:
        raise UsageError("give --target or --model, not both")
    for name in ("model", "data", "init"):
        value = getattr(args, name)
        if value is None:
            continue
        path = value.rpartition(":")[0] if name == "model" else value
        if not os.path.isfile(path):
            raise UsageError(f"--{name} {value}: no such file {path!r}")
    if args.model is not None:
        path, _, fn = args.model.rpartition(":")
        args.model = f"{os.path.abspath(path)}:{fn}"
    args.data, args.init = _abs(args.data), _abs(args.init)
    if args.steps % args.thin:
        raise UsageError(f"--thin must divide --steps; got --thin {args.thin}, --steps {args.steps}")
    if args.thin > 1 and not args.trace:
        raise UsageError("--thin applies to kept draws: add --trace")
    if args.plots and args.out is None:
        raise UsageError("--plots writes into the --out directory: add --out DIR")
    if args.plots:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise UsageError('--plots needs matplotlib: pip install "cenlmc_jax[plots]"') from None
    if args.output is not None:
        folder = os.path.dirname(os.path.abspath(args.output))
        if not os.path.isdir(folder):
            raise UsageError(f"--output {args.output}: the folder {folder!r} does not exist")
    if args.out is not None:
        args.out = os.path.abspath(args.out)
        if os.path.exists(args.out) and not os.path.isdir(args.out):
            raise UsageError(f"--out {args.out}: exists and is not a directory")
        if not args.resume and os.path.isdir(args.out) and os.listdir(args.out):
            raise UsageError(f"--out {args.out}: the directory is not empty (a finished or interrupted run?); "
                             "use another directory, remove it, or add --resume to continue an interrupted run")
        if args.checkpoint is None:
            args.checkpoint = os.path.join(args.out, "checkpoint.npz")
    if args.checkpoint is not None:
        args.checkpoint = os.path.abspath(args.checkpoint)
        folder = os.path.dirname(args.checkpoint)
        if args.out is None or folder != args.out:
            if not os.path.isdir(folder):
                raise UsageError(f"--checkpoint {args.checkpoint}: the folder {folder!r} does not exist")
        exists = os.path.exists(args.checkpoint)
        if args.resume and not exists:
            raise UsageError(f"--resume: no checkpoint at {args.checkpoint} (nothing to resume)")
        if exists and not args.resume:
            raise UsageError(f"--checkpoint {args.checkpoint} exists (an interrupted run): add --resume to continue "
                             "it, or remove it to start again")
    elif args.resume:
        raise UsageError("--resume needs --out DIR or --checkpoint PATH")
    if args.progress is None:
        args.progress = sys.stderr.isatty() and importlib.util.find_spec("tqdm") is not None
    elif args.progress and importlib.util.find_spec("tqdm") is None:
        raise UsageError('--progress needs tqdm: pip install "cenlmc_jax[progress]"')


def _ula_sd(target, h: float) -> Optional[np.ndarray]:
    """Stationary sd of unadjusted Langevin with step h on a Gaussian target: Σ_h = (P - h P²/2)⁻¹, P = ∇²f."""
    if target.hessian is None:
        return None
    p = np.asarray(target.hessian, np.float64)
    return np.sqrt(np.diag(np.linalg.inv(p - 0.5 * h * p @ p)))


@contextlib.contextmanager
def _ctrl_c_recorded(interrupted: list):
    """Record every Ctrl-C during the run in ``interrupted``, even one Python swallows.

    A KeyboardInterrupt raised while a garbage-collector callback runs (JAX
    installs one) is "unraisable": Python prints it and the run goes on. The
    handler records the signal before raising, and the unraisable hook keeps
    such an interrupt quiet, so the job still stops with the checkpoint (exit
    130) once the driver returns. A SIGINT that was ignored when the job
    started (a background job) stays ignored.
    """
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield
        return

    def on_sigint(signum, frame):
        interrupted.append(True)
        raise KeyboardInterrupt

    def unraisable(info):
        if not issubclass(info.exc_type, KeyboardInterrupt):
            previous_hook(info)

    previous_hook = sys.unraisablehook
    signal.signal(signal.SIGINT, on_sigint)
    sys.unraisablehook = unraisable
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        sys.unraisablehook = previous_hook


def _problems(args, target, job, res, table: SummaryTable) -> list:
    """Why the result is not to be trusted (empty: no known reason)."""
    out = []
    if res.diverged_at >= 0:
        out.append(f"DIVERGED at step {res.diverged_at} (info.diverged: non-finite or exploding values); the run "
                   "stopped and its estimates are not valid")
    frac = table.run.get("ensemble_fraction")
    if args.sampler == "cenlmc" and frac is not None and not frac >= ENSEMBLE_MIN_FRACTION:
        out.append(f"the ensemble force was used by {frac:.1%} of particle-steps after burn-in (< "
                   f"{ENSEMBLE_MIN_FRACTION:.0%}): CEnLMC did LMC's work at extra cost; raise --particles or use "
                   "--sampler lmc")
    biased = getattr(res.info, "biased", None)
    kept = args.burn_in - job.warmup_steps  # the driver's burn-in: its infos come first
    if biased is not None and np.any(np.asarray(biased)[kept:]):
        v = np.asarray(res.info.audit_variance_inflation, np.float64)[kept:]
        v = float(np.nanmean(v)) if np.any(np.isfinite(v)) else float("nan")
        out.append(f"the gradient audit measured that the ensemble force's noise inflates the variance by about "
                   f"{v:.1%} (the sd by about {math.sqrt(max(1 + v, 0.0)) - 1:.1%}), more than {ensemble.AUDIT_BIAS_THRESHOLD:.0%} "
                   "(info.biased): the estimates are biased; lower --eta, --r1, --r2, raise --n-star or "
                   "--particles, or use --sampler lmc")
    acc = table.run.get("acceptance_rate")
    if acc is not None and not acc >= ACCEPTANCE_MIN:
        out.append(f"mean acceptance rate {acc:.3f} < {ACCEPTANCE_MIN}: the chains barely move; lower --step-size")
    h = job.parameters.get("step_size")
    sd_ula = _ula_sd(target, h) if args.sampler in LANGEVIN and h is not None else None
    if sd_ula is not None:
        bias = np.abs(sd_ula - np.sqrt(np.diag(target.cov)))
        se = table.columns["mcse_sd"]
        worst = int(np.nanargmax(bias - se))
        if bias[worst] > se[worst]:
            out.append(f"at h={h:.4g} unadjusted Langevin's own sd of x[{worst}] is off by {bias[worst]:.3g} (exact "
                       f"for this Gaussian target), more than the standard error {se[worst]:.3g} of the estimate: "
                       "the error bars understate the error; lower --step-size (the bias is proportional to h)")
    rhat = table.columns.get("r_hat")
    if rhat is not None and np.any(rhat > RHAT_MAX):
        k = int(np.nanargmax(rhat))
        out.append(f"rank-normalised R-hat of x[{k}] is {rhat[k]:.3f} > {RHAT_MAX}: the chains (particles) have not "
                   "mixed over the kept draws; run longer (--steps, --burn-in) or with a larger --step-size")
    for col, what in (("z_mean", "mean"), ("z_sd", "sd")):
        z = table.columns.get(col)
        if z is not None and np.any(np.abs(z) > TRUTH_Z_MAX):
            k = int(np.nanargmax(np.abs(z)))
            out.append(f"the {what} of x[{k}] is {abs(z[k]):.1f} standard errors from the target's known {what} "
                       f"(> {TRUTH_Z_MAX:g})")
    return out


# --------------------------------------------------------------------------
# The run.
# --------------------------------------------------------------------------


def _setup(args):
    """Target, starting positions, keys and the sampler, from the checked flags."""
    data = _load_data(args.data) if args.data is not None else None
    init = _load_init(args.init) if args.init is not None else None
    if init is not None and init.ndim == 2:
        if args.particles is not None and args.particles != init.shape[0]:
            raise UsageError(f"--particles {args.particles} does not match the {init.shape[0]} rows of --init")
        args.particles = init.shape[0]
    args.particles = args.particles or DEFAULT_PARTICLES
    if args.model is not None:
        dim = args.dim if args.dim is not None else (init.shape[-1] if init is not None else None)
        if dim is None:
            raise UsageError("--model needs --dim D or --init FILE.npy to know the dimension")
        target = _load_model(args.model, data, dim)
    else:
        try:
            target = targets_mod.get_target(args.target, args.dim)
        except (ValueError, TypeError) as exc:
            raise UsageError(f"--dim {args.dim} for --target {args.target}: {exc}") from exc
        if args.dim is not None and target.dim != args.dim:
            raise UsageError(f"--target {args.target} has a fixed dimension {target.dim}; --dim {args.dim} does not "
                             "apply")
    if init is not None and init.shape[-1] != target.dim:
        raise UsageError(f"--init has points of dimension {init.shape[-1]}; the target has d = {target.dim}")
    if args.n_star is not None and args.n_star > args.particles - 1:
        raise UsageError(f"--n-star {args.n_star} must be at most N - 1 = {args.particles - 1} (the neighbours a "
                         "particle can have)")
    keys = jax.random.split(jax.random.key(args.seed), 3)
    noise = jax.random.normal(keys[0], (args.particles, target.dim)) * args.init_scale
    positions = noise if init is None else (jnp.asarray(init) if init.ndim == 2 else jnp.asarray(init) + noise)
    c, c_source = _curvature(target, positions)
    built = SAMPLERS[args.sampler](args, target, positions, c, keys)
    job, sug = (built, None) if isinstance(built, Job) else built
    return target, job, keys, c, c_source, sug


def _save_outputs(args, target, job, res, table, record, burn_in) -> list:
    out, files = args.out, []
    info = {f"info_{k}": np.asarray(v) for k, v in res.info._asdict().items()} if res.info is not None else {}
    final = {"final_position": np.asarray(res.state.position)}
    if res.trace is not None:
        path = os.path.join(out, "draws.npz")
        np.savez(path, draws=np.asarray(cj.diagnostics.chains_first(res)), **final, **info)
    else:
        path = os.path.join(out, "moments.npz")
        np.savez(path, mean=np.asarray(res.moments.mean), variance=np.asarray(res.moments.variance),
                 count=np.asarray(res.moments.count), **final, **info)
    files.append(path)
    table.to_csv(os.path.join(out, "summary.csv"))
    files.append(os.path.join(out, "summary.csv"))
    if importlib.util.find_spec("arviz") is not None:
        try:
            idata = to_arviz(res, burn_in=burn_in, thin=args.thin, sampler=args.sampler,
                             parameters=job.parameters, seed=args.seed)
            idata.to_netcdf(os.path.join(out, "run.nc"))
            files.append(os.path.join(out, "run.nc"))
        except Exception as exc:  # a missing netCDF engine must not lose the run
            record["warnings"].append(f"run.nc not written: {type(exc).__name__}: {exc}")
    else:
        record["warnings"].append('run.nc not written: ArviZ is not installed (pip install "cenlmc_jax[arviz]")')
    if args.plots:
        files += _save_plots(args, target, res, burn_in)
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
    if getattr(res.info, "grad_evals", None) is not None and args.sampler in LANGEVIN:
        figures["gradients"] = lambda: plots.plot_gradient_savings(res, burn_in=burn_in)
    written = []
    for name, make in figures.items():
        path = os.path.join(folder, f"{name}.png")
        make().savefig(path, dpi=90)
        written.append(path)
    return written


def _remove_checkpoint(path: Optional[str]) -> None:
    if path is None:
        return
    if os.path.exists(path):
        os.remove(path)
    shutil.rmtree(path + ".chunks", ignore_errors=True)


def _print_table(table: SummaryTable, indent: str = "  ", footer: bool = True) -> None:
    print("\n".join(indent + line for line in table.format(footer=footer).splitlines()))


def cmd_sample(args) -> int:
    t_start = time.perf_counter()
    _check_args(args)
    try:
        target, job, keys, c, c_source, sug = _setup(args)
    except ValueError as exc:  # a sampler or target refused a value: a usage error, not a traceback
        raise UsageError(str(exc)) from exc
    if args.out is not None:
        os.makedirs(args.out, exist_ok=True)
        config = _effective_config(args)
        _write_config(os.path.join(args.out, "config.toml"), config)
    record = {"warnings": []}
    print(f"cenlmc-jax: {job.description}")
    print(f"  target {target.name} (d={target.dim}), {args.particles} particles, {args.burn_in} burn-in + "
          f"{args.steps} steps, seed {args.seed}, backend {jax.default_backend()}")
    if args.step_size is None and not job.warmup_steps:
        rule = {"cenlmc": "min(0.05, sqrt(2/N)) / c", "enlmc": "min(0.05, sqrt(2/N)) / c",
                "lmc": "min(0.05, sqrt(2/N)) / c", "sgrhmc": "0.05 / sqrt(c)", "irreversible-mh": "0.8 / sqrt(c)",
                "rwmh": "2.38 / sqrt(d c)"}[args.sampler]
        print(f"  default step size = {rule}, curvature c = {c_source}")
    if sug is not None:
        print(f"  tuner: predicted ensemble fraction {sug.expected_ensemble_fraction:.2f}")
        for line in sug.reasoning.splitlines():
            if "too small" in line or "unknown" in line:
                print(f"  tuner warning: {line}")
                record["warnings"].append("tuner: " + line)
    chunk = max(args.thin, args.checkpoint_every // args.thin * args.thin) if args.checkpoint else None
    burn_in = args.burn_in - job.warmup_steps  # steps the driver runs unrecorded (a warm-up ran the others)
    t0 = time.perf_counter()
    interrupted = []
    try:
        with warnings.catch_warnings(record=True) as caught, _ctrl_c_recorded(interrupted):
            warnings.simplefilter("always", RuntimeWarning)  # the driver's divergence and clipping reports
            res = cj.sample(keys[1], job.algorithm, job.state, args.steps, burn_in=burn_in, thin=args.thin,
                            mode="trace" if args.trace else "stream", progress=args.progress, on_divergence="stop",
                            checkpoint_path=args.checkpoint, chunk_size=chunk)
            jax.block_until_ready(res.state)
    except KeyboardInterrupt:
        interrupted.append(True)
    if interrupted:
        if args.checkpoint is not None and os.path.exists(args.checkpoint):
            again = f"cenlmc-jax sample --resume --out {args.out}" if args.out else "the same command with --resume"
            print(f"\ncenlmc-jax: interrupted; the checkpoint {args.checkpoint} holds the last finished chunk. "
                  f"Continue with: {again}", file=sys.stderr)
        else:
            print("\ncenlmc-jax: interrupted before any checkpoint was written (--checkpoint PATH or --out DIR "
                  "make runs resumable)", file=sys.stderr)
        return EXIT_INTERRUPTED
    elapsed = time.perf_counter() - t0
    for w in caught:
        if not issubclass(w.category, RuntimeWarning):
            continue
        print(f"  warning: {w.message}")
        record["warnings"].append(str(w.message))
    table = summary(res, truth=target if target.mean is not None else None, burn_in=burn_in)
    run = table.run
    full = res.num_steps_done * args.particles
    warm = f" after {job.warmup_steps} warm-up steps" if job.warmup_steps else ""
    print(f"  ran {res.num_steps_done} steps{warm} in {elapsed:.2f} s (compilation included)")
    if "grad_evals" in run:
        ge = run["grad_evals"]
        print(f"  gradient evaluations: {ge:,} ({ge / full:.1%} of one per particle-step)")
        audit = getattr(res.info, "audit_grad_evals", None)
        audit = int(np.sum(np.asarray(audit))) if audit is not None else 0
        if audit:
            v = np.asarray(res.info.audit_variance_inflation, np.float64)[burn_in:]
            v = float(np.nanmean(v)) if np.any(np.isfinite(v)) else float("nan")
            print(f"  gradient audit: {audit:,} more ({audit / full:.1%}); ensemble-noise variance inflation {v:.3f} "
                  f"(the sd off by ~{math.sqrt(max(1 + v, 0.0)) - 1:.1%}; flagged above {ensemble.AUDIT_BIAS_THRESHOLD:g})")
        if args.sampler in ("cenlmc", "enlmc"):
            saved = full - ge - audit
            print(f"  saved against LMC (N gradients per step): {saved:,} ({saved / full:.1%}, the audit's included)")
    if "acceptance_rate" in run:
        print(f"  mean acceptance rate {run['acceptance_rate']:.3f}")
    if "ensemble_fraction" in run:
        print(f"  ensemble force used by {run['ensemble_fraction']:.1%} of particle-steps after burn-in")
    print("  estimates over kept steps and particles:" if res.trace is None else "  estimates over the kept draws:")
    _print_table(table, footer=False)
    problems = _problems(args, target, job, res, table)
    for p in problems:
        print(f"  UNRELIABLE: {p}")
    if not problems:
        print("  reliability checks passed (divergence, ensemble use, ensemble-force audit, acceptance, known bias, "
              "R-hat, known truth)")
    elif args.allow_unreliable:
        print("  (--allow-unreliable: exit status 0 all the same)")
    files = []
    if args.out is not None:
        files = _save_outputs(args, target, job, res, table, record, burn_in)
        record.update(
            version=_version_text(), command=["cenlmc-jax"] + sys.argv[1:], config=_effective_config(args),
            seed=args.seed, sampler=args.sampler, description=job.description,
            parameters={k: (float(v) if isinstance(v, float) else v) for k, v in job.parameters.items()},
            target=dict(name=target.name, dim=target.dim, curvature=c, curvature_source=c_source),
            steps_done=int(res.num_steps_done) + job.warmup_steps, warmup_steps=job.warmup_steps,
            diverged_at=int(res.diverged_at),
            timings=dict(sampling_s=elapsed, total_s=time.perf_counter() - t_start), reliable=not problems,
            problems=problems, summary_run=run, summary_notes=list(table.notes),
            files=[os.path.basename(f) if os.path.dirname(f) == args.out else os.path.relpath(f, args.out)
                   for f in files] + ["config.toml", "run.json"],
        )
        with open(os.path.join(args.out, "run.json"), "w") as fh:
            json.dump(record, fh, indent=2, default=float)
        files.append(os.path.join(args.out, "run.json"))
    if args.output:
        with open(args.output, "wb") as fh:  # a file object: np.savez adds no ".npz" to the name given
            np.savez(fh, final_position=np.asarray(res.state.position),
                     mean=np.asarray(res.moments.mean if res.moments is not None else table.columns["mean"]),
                     variance=np.asarray(res.moments.variance if res.moments is not None else table.columns["sd"] ** 2),
                     **{f"info_{k}": np.asarray(v) for k, v in res.info._asdict().items()})
        files.append(os.path.abspath(args.output))
    _remove_checkpoint(args.checkpoint)
    for f in files:
        print(f"  wrote {f}")
    return EXIT_UNRELIABLE if problems and not args.allow_unreliable else 0


def cmd_summary(args) -> int:
    folder = args.dir
    csv_path, json_path = os.path.join(folder, "summary.csv"), os.path.join(folder, "run.json")
    for path in (csv_path, json_path):
        if not os.path.isfile(path):
            raise UsageError(f"{folder}: no {os.path.basename(path)} (not a finished cenlmc-jax sample --out "
                             "directory)")
    with open(json_path) as fh:
        record = json.load(fh)
    table = SummaryTable.from_csv(csv_path, run=record.get("summary_run"), notes=tuple(record.get("summary_notes", ())))
    print(f"cenlmc-jax: {record.get('description', record.get('sampler'))}")
    tgt = record.get("target", {})
    print(f"  target {tgt.get('name')} (d={tgt.get('dim')}), seed {record.get('seed')}, "
          f"{record.get('steps_done')} steps done, {record.get('version')}")
    _print_table(table)
    for p in record.get("problems", []):
        print(f"  UNRELIABLE: {p}")
    if record.get("reliable"):
        print("  reliability checks passed (divergence, ensemble use, ensemble-force audit, acceptance, known bias, "
              "R-hat, known truth)")
    return 0


def main(argv=None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    sub = parser._subparsers._group_actions[0].choices[args.command]  # noqa: SLF001
    try:
        if args.command == "sample":
            config = args.config
            if config is None and args.resume and args.out and os.path.isfile(os.path.join(args.out, "config.toml")):
                config = os.path.join(args.out, "config.toml")
            if config is not None:
                args = parser.parse_args([argv[0]] + _config_tokens(config, parser) + argv[1:])
                args.config = config
            return cmd_sample(args)
        return cmd_summary(args)
    except UsageError as exc:
        sub.print_usage(sys.stderr)
        print(f"cenlmc-jax {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
