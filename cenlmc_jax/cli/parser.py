"""The command line of ``cenlmc-jax``: its flags, their checks, and the TOML configuration file.

* :func:`build_parser`: the ``sample`` and ``summary`` subcommands. The
  ``--sampler`` choices, and the samplers the help of ``--eta``, ``--adapt``,
  ``--grad-noise`` ... names, come from :mod:`cenlmc_jax.cli.samplers` (the
  library's registry ``cenlmc_jax.SAMPLERS``), not from a list kept here.
* Flag types (:func:`int_type`, :func:`float_type`) refuse bad values as
  usage errors; :func:`check_args` then checks flag combinations and paths
  before any work. Both end in exit status 2 with the message and the usage,
  never a traceback; a check after parsing raises :class:`UsageError`.
* ``--config FILE.toml``: :func:`config_tokens` turns every ``name = value``
  into command-line tokens placed before the real ones, so argparse checks
  them like typed flags and the command line wins; :func:`effective_config`
  and :func:`write_config` write back the configuration a run used
  (``OUT/config.toml``, which ``--config`` reads to rerun it exactly).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import math
import os
import sys
from typing import Any, Optional

import jax

import cenlmc_jax as cj
from cenlmc_jax import targets as targets_mod
from cenlmc_jax.cli.samplers import CHOICES, DEFAULT_SAMPLER, takes

try:  # Python >= 3.11
    import tomllib
except ImportError:  # pragma: no cover - Python 3.10
    try:
        import tomli as tomllib
    except ImportError:
        tomllib = None

PROG = "cenlmc-jax"
MAX_SEED = 2**63 - 1
DEFAULT_PARTICLES = 2000
#: Flags that are not settings of a run: never read from, nor written to, a configuration file.
NOT_IN_CONFIG = {"command", "config", "resume", "dir"}


class UsageError(Exception):
    """A bad flag value found after parsing: reported like argparse's errors (exit 2)."""


# --------------------------------------------------------------------------
# Flag types: bad values are usage errors (exit 2), never silently changed.
# --------------------------------------------------------------------------


def int_type(minimum: int, maximum: Optional[int] = None):
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


def float_type(*, positive: bool = True):
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
# The parser.
# --------------------------------------------------------------------------


def version_text() -> str:
    try:
        version = importlib.metadata.version("cenlmc_jax")
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover
        version = cj.__version__
    return f"{PROG} {version} (jax {jax.__version__})"


def _add_what_to_sample(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("what to sample")
    g.add_argument("--config", metavar="FILE.toml", help="read every flag from a TOML file (command line wins)")
    g.add_argument("--sampler", choices=CHOICES, default=DEFAULT_SAMPLER, help="(default: %(default)s)")
    g.add_argument("--target", choices=sorted(targets_mod.TARGETS), default=None,
                   help="built-in target (default: gaussian; not with --model)")
    g.add_argument("--model", metavar="PATH.py:FUNCTION",
                   help="your log density of one point x: (d,); FUNCTION(x, data) with --data")
    g.add_argument("--data", metavar="FILE", help=".npz (arrays) or .csv (columns, header row) passed to the model")
    g.add_argument("--init", metavar="FILE.npy", help="starting positions (N, d), or one point (d,) plus noise")
    g.add_argument("--dim", type=int_type(1), default=None,
                   help="dimension (targets that take one; required by --model without --init)")


def _add_run_length_and_parameters(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("run length and sampler parameters")
    g.add_argument("--particles", type=int_type(2), default=None,
                   help=f"particles or chains (default: {DEFAULT_PARTICLES}, or the rows of --init)")
    g.add_argument("--steps", type=int_type(1), default=1000, help="recorded steps (default: %(default)s)")
    g.add_argument("--burn-in", type=int_type(0), default=200, help="steps run first, not recorded (default: %(default)s)")
    g.add_argument("--step-size", type=float_type(), default=None,
                   help="h (Langevin), eps (SGRHMC) or proposal scale (MH) (default: from the target's curvature)")
    for name, kind in (("eta", float_type()), ("r1", float_type()), ("r2", float_type()), ("n-star", int_type(1)),
                       ("m-f", float_type())):
        g.add_argument(f"--{name}", type=kind, default=None,
                       help=f"{'/'.join(takes(name))}: {name.replace('-', '_')} (default: tuning.suggest_cenlmc_params)")
    g.add_argument("--adapt", action=argparse.BooleanOptionalAction, default=True,
                   help=f"{', '.join(takes('adapt'))}: adapt the step size and a diagonal preconditioner during the "
                        "burn-in (cenlmc_jax.adaptation; Stan's windows); off, or with --step-size: the "
                        "curvature rule (default: on)")
    g.add_argument("--grad-noise", type=float_type(positive=False), default=0.0,
                   help=f"{'/'.join(takes('grad-noise'))}: sd of Gaussian noise added to gradients "
                        "(default: %(default)s)")
    g.add_argument("--init-scale", type=float_type(), default=1.0,
                   help="initial particles ~ N(0, scale^2 I), or around a --init point (default: %(default)s)")
    g.add_argument("--seed", type=int_type(0, MAX_SEED), default=0, help="(default: %(default)s)")


def _add_output(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("output")
    g.add_argument("--out", metavar="DIR", help="write draws or moments, summary.csv, run.json, run.nc, plots here")
    g.add_argument("--trace", action=argparse.BooleanOptionalAction, default=False,
                   help="keep the draws (default: stream the moments only, O(N d) memory)")
    g.add_argument("--thin", type=int_type(1), default=1, help="with --trace: keep every K-th step (default: 1)")
    g.add_argument("--plots", action=argparse.BooleanOptionalAction, default=False,
                   help="write OUT/plots/*.png (needs matplotlib and --out)")
    g.add_argument("--output", metavar="FILE.npz",
                   help="also write final particles, moments and infos to this exact file")
    g.add_argument("--checkpoint", metavar="PATH",
                   help="save the run here as it goes (default with --out: DIR/checkpoint.npz)")
    g.add_argument("--checkpoint-every", type=int_type(1), default=100,
                   help="steps between checkpoints (default: %(default)s)")
    g.add_argument("--resume", action="store_true", help="continue the run in the checkpoint (same flags, or "
                                                         "--out DIR alone: its config.toml is read)")
    g.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress bar (default: on when stderr is a terminal and tqdm is installed)")
    g.add_argument("--allow-unreliable", action="store_true",
                   help="exit 0 even when the result fails the reliability checks (they are still printed)")


def build_parser(description: Optional[str] = None) -> argparse.ArgumentParser:
    """The ``cenlmc-jax`` parser; ``description``: its ``--help`` headline (the CLI package passes its own)."""
    parser = argparse.ArgumentParser(prog=PROG, description=description)
    parser.add_argument("--version", action="version", version=version_text())
    sub = parser.add_subparsers(dest="command")
    p = sub.add_parser("sample", help="run a sampler on a built-in target or a model file; print a summary",
                       description="Run a sampler and print a summary (see the module docstring of cenlmc_jax.cli).")
    _add_what_to_sample(p)
    _add_run_length_and_parameters(p)
    _add_output(p)
    s = sub.add_parser("summary", help="print the summary of a finished run directory")
    s.add_argument("dir", metavar="DIR", help="a --out directory of cenlmc-jax sample")
    return parser


def subparser(parser: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser:
    """The parser of one subcommand (``sample``, ``summary``)."""
    return parser._subparsers._group_actions[0].choices[command]  # noqa: SLF001 - argparse has no public way


# --------------------------------------------------------------------------
# The configuration file.
# --------------------------------------------------------------------------


def _read_toml(path: str) -> dict:
    if tomllib is None:
        raise UsageError("--config needs Python >= 3.11 (tomllib) or the tomli package: pip install tomli")
    if not os.path.isfile(path):
        raise UsageError(f"--config {path}: no such file")
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except Exception as exc:
        raise UsageError(f"--config {path}: not valid TOML ({exc})") from exc


def config_tokens(path: str, parser: argparse.ArgumentParser) -> list:
    """The flags of a TOML file, as command-line tokens (so argparse checks them like typed flags)."""
    table = _read_toml(path)
    known = {a.dest: a for a in subparser(parser, "sample")._actions if a.option_strings}  # noqa: SLF001
    tokens = []
    for key, value in table.items():
        dest = key.replace("-", "_")
        if dest not in known or dest in NOT_IN_CONFIG:
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


def toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    return json.dumps(str(v))  # a TOML basic string is a JSON string


def effective_config(args) -> dict:
    skip = NOT_IN_CONFIG | {"progress"}
    return {k.replace("_", "-"): v for k, v in sorted(vars(args).items()) if k not in skip and v is not None}


def write_config(path: str, config: dict) -> None:
    lines = [f"# {PROG} sample: the effective configuration of this run ({PROG} sample --config THIS_FILE)"]
    lines += [f"{k} = {toml_value(v)}" for k, v in config.items()]
    with open(path, "w") as fh:
        fh.write("\n".join(lines) + "\n")


# --------------------------------------------------------------------------
# Checks after parsing, before any work (exit 2).
# --------------------------------------------------------------------------


def _abs(path: Optional[str]) -> Optional[str]:
    return None if path is None else os.path.abspath(path)


def _check_inputs(args) -> None:
    """--target or --model; --model, --data, --init exist (made absolute, so a config reruns anywhere)."""
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


def _check_outputs(args) -> None:
    """--thin, --plots, --output and --out: what is kept and where it goes (never over a finished run)."""
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


def _check_checkpoint(args) -> None:
    """--checkpoint and --resume: a checkpoint is continued only with --resume, and --resume needs one."""
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


def check_args(args) -> None:
    """Flag combinations and paths, before any work (in place: defaults filled, paths made absolute)."""
    _check_inputs(args)
    _check_outputs(args)
    _check_checkpoint(args)
    if args.progress is None:
        args.progress = sys.stderr.isatty() and importlib.util.find_spec("tqdm") is not None
    elif args.progress and importlib.util.find_spec("tqdm") is None:
        raise UsageError('--progress needs tqdm: pip install "cenlmc_jax[progress]"')
