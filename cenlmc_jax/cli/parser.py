"""The command line of ``cenlmc-jax``: its flags, their checks, and the TOML
configuration file.

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
* A configuration file or a run folder never names code to import: its
  ``model`` entry is not a flag (:func:`config_tokens` drops it) and a file
  with one is refused unless ``--model`` is on the command line
  (:func:`refuse_config_model`); ``--resume`` compares the stored ``model``
  (and every flag that changes the result, :func:`check_same_run`) with the
  command line's and refuses a different one. Everything else a file can
  name is data, read without pickle (``--data``, ``--init``, the checkpoint).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import math
import os
import sys
import tempfile
from typing import Any

import jax

import cenlmc_jax as cj
from cenlmc_jax import checkpoint as ckpt
from cenlmc_jax.cli.samplers import (
    CHOICES,
    DEFAULT_MODEL_SAMPLER,
    DEFAULT_SAMPLER,
    takes,
)
from cenlmc_jax.models import targets as targets_mod

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
#: ``--steps`` unset: this, or more for a warmed-up lmc / cenlmc
#: (cenlmc_jax.cli.jobs.default_steps).
DEFAULT_STEPS = 1000
#: Flags that are not settings of a run: never read from, nor written to, a
#: configuration file.
NOT_IN_CONFIG = {"command", "config", "resume", "dir", "adaptive"}
#: Settings a resumed run may change: where and how it reports, not what it computes.
RESUME_MAY_CHANGE = {
    "bias-check",
    "out",
    "checkpoint",
    "checkpoint-every",
    "output",
    "plots",
    "allow-unreliable",
    "progress",
    "compile-cache",
    "cpu-threads",
}
#: The files ``--out DIR`` receives (``--output`` may not be one of them).
OUT_FILES = (
    "config.toml",
    "run.json",
    "summary.csv",
    "run.nc",
    "draws.npz",
    "moments.npz",
)
#: What a run stopped while it wrote its outputs may have left in ``--out`` beside
#: config.toml: run.json, written last (through ``run.json.tmp``), marks a finished run.
UNFINISHED_OUTPUTS = frozenset(
    {"summary.csv", "run.nc", "draws.npz", "moments.npz", "plots", "run.json.tmp"}
)


class UsageError(Exception):
    """A bad flag value found after parsing: reported like argparse's errors.

    Exit status 2.
    """


# --------------------------------------------------------------------------
# Flag types: bad values are usage errors (exit 2), never silently changed.
# --------------------------------------------------------------------------


def int_type(minimum: int, maximum: int | None = None):
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"must be an integer; got {text!r}"
            ) from None
        if v < minimum or (maximum is not None and v > maximum):
            bound = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
            raise argparse.ArgumentTypeError(f"must be an integer {bound}; got {text}")
        return v

    return parse


def threads_type(text: str) -> str | int:
    """``--cpu-threads``: ``auto`` or a positive integer."""
    if text == "auto":
        return text
    try:
        return int_type(1)(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"must be 'auto' or an integer >= 1; got {text!r}"
        ) from None


def float_type(*, positive: bool = True):
    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"must be a number; got {text!r}"
            ) from None
        if not math.isfinite(v) or (v <= 0 if positive else v < 0):
            raise argparse.ArgumentTypeError(
                f"must be a finite number {'> 0' if positive else '>= 0'}; got {text}"
            )
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
    g.add_argument(
        "--config",
        metavar="FILE.toml",
        help="read every flag from a TOML file (command line wins)",
    )
    g.add_argument(
        "--sampler",
        choices=CHOICES,
        default=None,
        help=f"(default: {DEFAULT_MODEL_SAMPLER} with --model, the exact "
        f"Metropolis-adjusted default of cj.langevin_warmup; {DEFAULT_SAMPLER} on "
        "the built-in targets)",
    )
    g.add_argument(
        "--target",
        choices=sorted(targets_mod.TARGETS),
        default=None,
        help="built-in target (default: gaussian; not with --model)",
    )
    g.add_argument(
        "--model",
        metavar="PATH.py:FUNCTION",
        help="your log density of one point x: (d,), FUNCTION(x, data) with --data; "
        "or a NumPyro model (the file imports numpyro and FUNCTION(**data) "
        "binds): cj.from_numpyro, sampled unconstrained, summarised by "
        "constrained site name",
    )
    g.add_argument(
        "--data",
        metavar="FILE",
        help=".npz (arrays) or .csv (columns, header row) passed to the model",
    )
    g.add_argument(
        "--init",
        metavar="FILE.npy",
        help="starting positions (N, d), or one point (d,) plus noise",
    )
    g.add_argument(
        "--dim",
        type=int_type(1),
        default=None,
        help="dimension (targets that take one; required by --model without --init)",
    )


def _add_run_length_and_parameters(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("run length and sampler parameters")
    g.add_argument(
        "--bias-check",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="unadjusted samplers (lmc, cenlmc, enlmc, sgrhmc): after the run, run "
        "again at h/2 from its final ensemble and flag a moment whose step-size bias "
        "2 (m_h - m_{h/2}) exceeds z standard errors (about the run's gradients "
        "again; default: on)",
    )
    g.add_argument(
        "--particles",
        type=int_type(2),
        default=None,
        help=f"particles or chains (default: {DEFAULT_PARTICLES}, or the rows of "
        "--init)",
    )
    g.add_argument(
        "--steps",
        type=int_type(1),
        default=None,
        help=f"recorded steps (default: {DEFAULT_STEPS}) or, for lmc / cenlmc warmed "
        "up by cj.langevin_warmup, more where the warm-up's measured relaxation "
        "time asks for more for the R-hat check",
    )
    g.add_argument(
        "--burn-in",
        type=int_type(0),
        default=200,
        help="steps run first, not recorded (default: %(default)s); for the exact "
        "warm-up (hmc, the default with --model, or mala) the budget of its kinetic "
        "phase, at least 1000: it stops once the ensemble settles",
    )
    g.add_argument(
        "--step-size",
        type=float_type(),
        default=None,
        help="h (Langevin), eps (SGRHMC, HMC) or proposal scale (MH) (default: from "
        "the target's curvature)",
    )
    for name, kind in (
        ("eta", float_type()),
        ("r1", float_type()),
        ("r2", float_type()),
        ("n-star", int_type(1)),
        ("m-f", float_type()),
    ):
        g.add_argument(
            f"--{name}",
            type=kind,
            default=None,
            help=f"{'/'.join(takes(name))}: {name.replace('-', '_')} (default: "
            "tuning.suggest_cenlmc_params)",
        )
    g.add_argument(
        "--adapt",
        action=argparse.BooleanOptionalAction,
        default=True,
        help=f"{', '.join(takes('adapt'))}: adapt the step size and a diagonal "
        "preconditioner during the burn-in (cenlmc_jax.adaptation; Stan's "
        "windows); off, or with --step-size: the curvature rule (default: on)",
    )
    g.add_argument(
        "--grad-noise",
        type=float_type(positive=False),
        default=0.0,
        help=f"{'/'.join(takes('grad-noise'))}: sd of Gaussian noise added to "
        "gradients (default: %(default)s)",
    )
    g.add_argument(
        "--init-scale",
        type=float_type(),
        default=1.0,
        help="initial particles ~ N(0, scale^2 I), or around a --init point "
        "(default: %(default)s)",
    )
    g.add_argument(
        "--seed", type=int_type(0, MAX_SEED), default=0, help="(default: %(default)s)"
    )


def _add_output(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("output")
    g.add_argument(
        "--out",
        metavar="DIR",
        help="write draws or moments, summary.csv, run.json, run.nc, plots here",
    )
    g.add_argument(
        "--trace",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="keep the draws (default: stream the moments only, O(N d) memory)",
    )
    g.add_argument(
        "--thin",
        type=int_type(1),
        default=1,
        help="with --trace: keep every K-th step (default: 1)",
    )
    g.add_argument(
        "--plots",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="write OUT/plots/*.png (needs matplotlib and --out)",
    )
    g.add_argument(
        "--output",
        metavar="FILE.npz",
        help="also write final particles, moments and infos to this exact file",
    )
    g.add_argument(
        "--checkpoint",
        metavar="PATH",
        help="save the run here as it goes (default with --out: DIR/checkpoint.npz)",
    )
    g.add_argument(
        "--checkpoint-every",
        type=int_type(1),
        default=100,
        help="steps between checkpoints (default: %(default)s)",
    )
    g.add_argument(
        "--resume",
        action="store_true",
        help="continue the run in the checkpoint (same flags, or "
        "--out DIR alone: its config.toml is read)",
    )
    g.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="the warm-up's phases as they end and the run's checks, on stderr, and "
        "a progress bar where tqdm is installed (default: on when stderr is a "
        "terminal)",
    )
    g.add_argument(
        "--compile-cache",
        metavar="DIR",
        default=None,
        help="keep compiled programs in DIR, so that a rerun of the same job skips "
        "most of its compilation ('off': none; default: "
        "$JAX_COMPILATION_CACHE_DIR if set, else ~/.cache/cenlmc_jax/xla)",
    )
    g.add_argument(
        "--cpu-threads",
        type=threads_type,
        default="auto",
        help="threads of XLA's CPU pool (PJRT_NPROC; set before JAX starts): "
        "'auto' takes one for a small job (particles x d <= 16384, where spreading "
        "small operations over a pool costs more CPU than it saves) and leaves a "
        "PJRT_NPROC already set, else a thread a core (default: %(default)s)",
    )
    g.add_argument(
        "--allow-unreliable",
        action="store_true",
        help="exit 0 even when the result fails the reliability checks (they are "
        "still printed)",
    )


def build_parser(description: str | None = None) -> argparse.ArgumentParser:
    """The ``cenlmc-jax`` parser; ``description``: its ``--help`` headline (the CLI
    package passes its own).
    """
    parser = argparse.ArgumentParser(prog=PROG, description=description)
    parser.add_argument("--version", action="version", version=version_text())
    sub = parser.add_subparsers(dest="command")
    p = sub.add_parser(
        "sample",
        help="run a sampler on a built-in target or a model file; print a summary",
        description="Run a sampler and print a summary (see the module docstring of "
        "cenlmc_jax.cli).",
    )
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


def read_config(path: str) -> dict:
    """The table of a TOML configuration file; a usage error when it is missing or not
    TOML.
    """
    if tomllib is None:
        raise UsageError(
            "--config needs Python >= 3.11 (tomllib) or the tomli package: pip "
            "install tomli"
        )
    if not os.path.isfile(path):
        raise UsageError(f"--config {path}: no such file")
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except Exception as exc:
        raise UsageError(f"--config {path}: not valid TOML ({exc})") from exc


def _config_model(table: dict) -> Any | None:
    return next((v for k, v in table.items() if k.replace("-", "_") == "model"), None)


def refuse_config_model(
    table: dict, path: str, model_on_command_line: str | None
) -> None:
    """A configuration file or run folder never names code to import: a ``model`` entry
    needs ``--model``.

    ``model_on_command_line``: the ``--model`` of the command line alone (None when it
    has none). The file's entry is never imported; with ``--model`` given, the command
    line's file is the one used.
    """
    model = _config_model(table)
    if model is not None and model_on_command_line is None:
        raise UsageError(
            f"{path} names a model file (model = {model!r}), and a configuration file "
            "or run folder never names code to import: read that file, and if "
            "you trust it pass --model PATH.py:FUNCTION explicitly on the "
            "command line"
        )


def run_folder_table(table: dict) -> dict:
    """``DIR/config.toml`` as ``--resume --out DIR`` reads it: a checkpoint at the
    default place of the folder it was written in is dropped, so a moved folder resumes
    from its own ``DIR/checkpoint.npz``.
    """
    table = dict(table)
    out, checkpoint = table.get("out"), table.get("checkpoint")
    if isinstance(out, str) and checkpoint == os.path.join(out, "checkpoint.npz"):
        del table["checkpoint"]
    return table


def config_tokens(table: dict, path: str, parser: argparse.ArgumentParser) -> list:
    """The flags of a configuration table (:func:`read_config`) as command-line tokens,
    so argparse checks them like typed flags. Its ``model`` entry is no token: the model
    comes from the command line only (:func:`refuse_config_model`).
    """
    known = {
        a.dest: a for a in subparser(parser, "sample")._actions if a.option_strings
    }  # noqa: SLF001
    tokens = []
    for key, value in table.items():
        dest = key.replace("-", "_")
        if dest not in known or dest in NOT_IN_CONFIG:
            raise UsageError(
                f"--config {path}: unknown setting {key!r} (expected flag names such "
                "as 'steps', 'burn-in', 'sampler')"
            )
        if dest == "model":
            continue
        flag = "--" + dest.replace("_", "-")
        action = known[dest]
        if isinstance(action, argparse.BooleanOptionalAction):
            if not isinstance(value, bool):
                raise UsageError(
                    f"--config {path}: {key} must be true or false; got {value!r}"
                )
            tokens.append(flag if value else "--no-" + flag[2:])
        elif action.nargs == 0:  # store_true
            if not isinstance(value, bool):
                raise UsageError(
                    f"--config {path}: {key} must be true or false; got {value!r}"
                )
            if value:
                tokens.append(flag)
        else:
            if isinstance(value, (dict, list)):
                raise UsageError(
                    f"--config {path}: {key} must be a single value; got {value!r}"
                )
            tokens += [flag, repr(value) if isinstance(value, float) else str(value)]
    return tokens


def toml_value(v: Any, key: str = "value") -> str:
    """``v`` as a TOML value: a boolean, a number, or a basic string holding any text.

    In the string, ``\\`` and ``"`` are escaped, control characters written as
    ``\\uXXXX``, every other character (non-BMP ones too) as itself (the file is
    UTF-8). A lone surrogate (a name with bytes that are not UTF-8, as
    ``os.fsdecode`` gives it) has no TOML form: a usage error.

    Args:
      v: the setting's value.
      key: the setting's name, for the message.

    Returns:
      The TOML text of the value.

    Raises:
      UsageError: ``v`` holds a lone surrogate.
    """
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    out = []
    for ch in str(v):
        code = ord(ch)
        if ch in '"\\':
            out.append("\\" + ch)
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\u{code:04X}")
        elif 0xD800 <= code <= 0xDFFF:
            raise UsageError(
                f"--{key} {str(v)!r}: not valid UTF-8 (a name with undecodable "
                "bytes), which config.toml cannot hold; give a name in UTF-8"
            )
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def effective_config(args) -> dict:
    """The settings of a run, by flag name (a checkpoint at the default place of
    ``--out`` left out).
    """
    skip = NOT_IN_CONFIG | {"progress", "progress_bar", "compile_cache", "cpu_threads"}
    config = {
        k.replace("_", "-"): v
        for k, v in sorted(vars(args).items())
        if k not in skip and v is not None
    }
    if args.out is not None and args.checkpoint == os.path.join(
        args.out, "checkpoint.npz"
    ):
        config.pop("checkpoint", None)
    return config


def write_config(path: str, config: dict) -> None:
    lines = [
        f"# {PROG} sample: the effective configuration of this run ({PROG} sample "
        "--config THIS_FILE; a model run needs its --model again)"
    ]
    lines += [f"{k} = {toml_value(v, k)}" for k, v in config.items()]
    with open(path, "w", encoding="utf-8") as fh:
        fh.write("\n".join(lines) + "\n")


# --------------------------------------------------------------------------
# Checks after parsing, before any work (exit 2).
# --------------------------------------------------------------------------


def _abs(path: str | None) -> str | None:
    return None if path is None else os.path.abspath(path)


def _check_inputs(args) -> None:
    """--target or --model; --model, --data, --init exist (made absolute, so a config
    reruns anywhere).
    """
    if args.sampler is None:
        args.sampler = DEFAULT_MODEL_SAMPLER if args.model else DEFAULT_SAMPLER
    if args.model is None:
        args.target = args.target or "gaussian"
        if args.data is not None:
            raise UsageError(
                "--data is passed to a --model; the built-in targets take none"
            )
    elif args.target is not None:
        raise UsageError("give --target or --model, not both")
    for name in ("model", "data", "init"):
        value = getattr(args, name)
        if value is None:
            continue
        path = value.rpartition(":")[0] if name == "model" else value
        if name == "model" and not (
            path.endswith(".py") and value.rpartition(":")[2].isidentifier()
        ):
            raise UsageError(
                f"--model must be PATH.py:FUNCTION (the file, a colon, the name of its "
                f"log-density function); got {value!r}"
            )
        if not os.path.isfile(path):
            raise UsageError(f"--{name} {value}: no such file {path!r}")
    if args.model is not None:
        path, _, fn = args.model.rpartition(":")
        args.model = f"{os.path.abspath(path)}:{fn}"
    args.data, args.init = _abs(args.data), _abs(args.init)


def _probe_writable(folder: str, flag: str, value: str) -> None:
    """Create and remove a file in ``folder``: unlike ``os.access``, also right for root
    and read-only mounts.
    """
    try:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".cenlmc-jax-write-test-")
        os.close(fd)
        os.remove(tmp)
    except OSError as exc:
        raise UsageError(
            f"{flag} {value}: cannot write in the folder {folder!r} "
            f"({exc.strerror or exc})"
        ) from None


def _check_file_path(flag: str, value: str, out: str | None) -> str:
    """A file the run writes (``--output``, ``--checkpoint``), made absolute: not a
    directory, its folder an existing writable directory (or ``out``, the --out
    directory, checked and created on its own), an existing file readable and writable.
    """
    path = os.path.abspath(value)
    if os.path.isdir(path):
        raise UsageError(f"{flag} {value}: is a directory; give a file path")
    folder = os.path.dirname(path)
    if folder != out:
        if not os.path.isdir(folder):
            what = "is not a directory" if os.path.lexists(folder) else "does not exist"
            raise UsageError(f"{flag} {value}: the folder {folder!r} {what}")
        _probe_writable(folder, flag, value)
    if os.path.lexists(path) and not (
        os.path.isfile(path) and os.access(path, os.R_OK | os.W_OK)
    ):
        raise UsageError(
            f"{flag} {value}: exists and is not a readable and writable file"
        )
    return path


def interrupted_leftovers(out: str, checkpoint: str | None) -> bool:
    """``out`` holds only what a run stopped before its outputs were complete leaves:
    its config.toml, checkpoint files, and the outputs written before the stop, but no
    run.json (written last: :data:`UNFINISHED_OUTPUTS`).
    """
    names = set(os.listdir(out))
    allowed = {"config.toml", *UNFINISHED_OUTPUTS}
    if checkpoint is not None and os.path.dirname(checkpoint) == out:
        base = os.path.basename(checkpoint)
        allowed |= {base, base + ".tmp", base + ".chunks", base + ".lock"}
    return "config.toml" in names and names <= allowed


def _check_out_dir(args) -> None:
    """--out: a directory, or one ``os.makedirs`` can create, writable; never over a
    finished run (a run interrupted before its first checkpoint, which left only its
    config.toml, is started afresh).
    """
    value = args.out
    args.out = out = os.path.abspath(value)
    if os.path.lexists(out) and not os.path.isdir(out):
        raise UsageError(f"--out {value}: exists and is not a directory")
    existing = out
    while not os.path.lexists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise UsageError(f"--out {value}: {existing!r} is not a directory")
    _probe_writable(existing, "--out", value)
    if args.checkpoint is None:
        args.checkpoint = os.path.join(out, "checkpoint.npz")
    if (
        not args.resume
        and os.path.isdir(out)
        and os.listdir(out)
        and not interrupted_leftovers(out, os.path.abspath(args.checkpoint))
    ):
        raise UsageError(
            f"--out {value}: the directory is not empty (a finished or interrupted "
            "run?); use another directory, remove it, or add --resume to "
            "continue an interrupted run"
        )


def _check_outputs(args) -> None:
    """--thin, --plots and --out: what is kept and where it goes."""
    if (
        args.steps is not None and args.steps % args.thin
    ):  # unset: the job picks a multiple of --thin
        raise UsageError(
            f"--thin must divide --steps; got --thin {args.thin}, --steps {args.steps}"
        )
    if args.thin > 1 and not args.trace:
        raise UsageError("--thin applies to kept draws: add --trace")
    if args.plots and args.out is None:
        raise UsageError("--plots writes into the --out directory: add --out DIR")
    if args.plots:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise UsageError(
                '--plots needs matplotlib: pip install "cenlmc_jax[plots]"'
            ) from None
    if args.out is not None:
        _check_out_dir(args)


def _flag_text(key: str, value: Any) -> str:
    if value is None:
        return f"--{key} unset"
    if isinstance(value, bool):
        return f"--{key}" if value else f"--no-{key}"
    return f"--{key} {value}"


def check_same_run(args) -> None:
    """``--resume --out DIR``: the settings that change the result (all
    but :data:`RESUME_MAY_CHANGE`, the model's path included) must be those of
    ``DIR/config.toml`` (a setting it lacks: the default); a usage error names the first
    that is not.
    """
    path = (
        os.path.join(args.out, "config.toml")
        if args.resume and args.out is not None
        else None
    )
    if path is None or not os.path.isfile(path):
        return
    stored = {k.replace("_", "-"): v for k, v in read_config(path).items()}
    current = effective_config(args)
    defaults = {
        a.dest.replace("_", "-"): a.default
        for a in subparser(build_parser(), "sample")._actions
    }  # noqa: SLF001
    for key in sorted(set(stored) | set(current)):
        here, there = (
            current.get(key),
            stored.get(key, defaults.get(key)),
        )  # a setting not written: its default
        if key in RESUME_MAY_CHANGE or (
            key == "particles" and here is None
        ):  # particles: from --init later
            continue
        if here != there:
            raise UsageError(
                f"--resume: {_flag_text(key, here)} is not the interrupted run's "
                f"{_flag_text(key, there)} ({path}); resume with the run's own "
                "flags (--resume --out DIR alone reads them), or start a new "
                "run in another --out directory"
            )


def _resume_from_the_start(args) -> None:
    """--resume and no checkpoint: a run folder stopped before its first checkpoint
    starts afresh (said so).
    """
    out = args.out
    if out is not None and os.path.isfile(os.path.join(out, "run.json")):
        raise UsageError(
            f"--resume: {out} holds a finished run (run.json; a finished run removes "
            f"its checkpoint): nothing to resume; cenlmc-jax summary {out} "
            "prints it"
        )
    if (
        out is not None
        and os.path.isdir(out)
        and interrupted_leftovers(out, args.checkpoint)
    ):
        print(
            f"cenlmc-jax: --resume: no checkpoint in {out} yet (the run stopped "
            "before its first one): starting from the beginning",
            file=sys.stderr,
        )
        return
    raise UsageError(
        f"--resume: no checkpoint at {args.checkpoint} (nothing to resume; a run "
        "stopped before its first checkpoint is run again without --resume)"
    )


def _check_checkpoint(args) -> None:
    """--checkpoint and --resume: a checkpoint is continued only with --resume; --resume
    needs one, or a run folder stopped before its first one.
    """
    if args.checkpoint is None:
        if args.resume:
            raise UsageError("--resume needs --out DIR or --checkpoint PATH")
        return
    args.checkpoint = _check_file_path("--checkpoint", args.checkpoint, args.out)
    exists = os.path.exists(args.checkpoint)
    if exists and not args.resume:
        raise UsageError(
            f"--checkpoint {args.checkpoint} exists (an interrupted run): add "
            "--resume to continue it, or remove it to start again"
        )
    if os.path.isdir(os.path.dirname(args.checkpoint)):
        try:  # its lock and chunk folder: no symlink, no directory at the lock
            ckpt.check_path(args.checkpoint)
        except ValueError as exc:
            flag = "--resume" if args.resume else "--checkpoint"
            raise UsageError(f"{flag}: {exc}") from None
    if args.resume and not exists:
        _resume_from_the_start(args)


def _check_output_file(args) -> None:
    """--output: a writable file path that is none of the run's own files."""
    if args.output is None:
        return
    path = _check_file_path("--output", args.output, args.out)
    own = set()
    if args.checkpoint is not None:
        own |= {args.checkpoint, args.checkpoint + ".tmp", args.checkpoint + ".lock"}
    if args.out is not None:
        own |= {os.path.join(args.out, name) for name in OUT_FILES}
    if path in own:
        raise UsageError(
            f"--output {args.output}: the run writes {path} itself (an --out file or "
            "the checkpoint); choose another file"
        )
    args.output = path


def check_args(args) -> None:
    """Flag combinations and paths, before any work (in place: defaults filled, paths
    made absolute).
    """
    _check_inputs(args)
    _check_outputs(args)
    check_same_run(args)
    _check_checkpoint(args)
    _check_output_file(args)
    for key, value in effective_config(args).items():
        toml_value(value, key)  # config.toml can hold it
    # the warm-up's phases and cj.sample_until's checks are plain lines on stderr;
    # only the sampling bar needs tqdm (a new user's fresh install has none: the
    # lines still show that a long warm-up is working, issue 48)
    have_tqdm = importlib.util.find_spec("tqdm") is not None
    if args.progress is None:
        args.progress = sys.stderr.isatty()
    args.progress_bar = bool(args.progress) and have_tqdm
