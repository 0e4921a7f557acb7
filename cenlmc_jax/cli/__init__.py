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
  positions, ``(N, d)`` or one point ``(d,)``; the file's dtype when JAX's
  float64 is on, else float32, said on stderr).
* ``--model PATH.py:MODEL`` with a NumPyro model (the file imports numpyro
  and ``MODEL(**data)`` binds: ``--data``'s arrays by argument name, a 0-d
  integer as an int; without ``--data`` the model's own defaults):
  ``cj.from_numpyro(MODEL, **data)`` gives the unconstrained log density and
  ``d``; the run keeps its draws (``--trace``) and the summary shows the
  constrained sites by name (NumPyro's transforms, deterministic sites too).
* ``--config run.toml``: every flag as ``name = value`` (``burn-in`` or
  ``burn_in``); flags on the command line win. The effective configuration
  is written to ``OUT/config.toml`` (UTF-8: any path that is valid UTF-8) and
  ``OUT/run.json``. A configuration
  file or run folder never names code to import: one with a ``model`` entry
  is refused unless ``--model`` is on the command line (that file is used),
  and ``--resume`` refuses a ``--model`` other than the run's.
* ``--out DIR`` receives ``draws.npz`` (``--trace``: chains-first draws
  ``(chains or particles, draws, d)``) or ``moments.npz`` (streaming),
  ``summary.csv``, ``run.json`` (configuration, seed, version, steps done,
  ``diverged_at``, timings, the verdict), ``run.nc`` (ArviZ, when installed)
  and ``plots/*.png`` with ``--plots``. ``cenlmc-jax summary DIR`` prints it again.
* ``--checkpoint PATH`` (default ``DIR/checkpoint.npz`` with ``--out``)
  saves the run every ``--checkpoint-every`` steps; Ctrl-C leaves it there and
  ``--resume`` (same flags, or just ``--resume --out DIR`` plus ``--model`` for
  a model run) continues to the same result as an uninterrupted run; a flag
  that changes the result is refused. A finished run removes it (its lock
  file ``PATH.lock`` goes when the run ends). A run stopped before its first
  checkpoint is started afresh by the same command, or by ``--resume``. A
  model the checkpoint cannot fingerprint (a C object in it) is recognised by
  its file's source text and the run's configuration instead, with a note.

Default step sizes follow the target's curvature ``c`` (``L`` of
:mod:`cenlmc_jax.models.targets`, else the inverse of the smallest variance, else the
largest Hessian eigenvalue at the mode, by power iteration): Langevin samplers
use ``h = min(0.05, sqrt(2/N)) / c``, which keeps unadjusted Langevin's sd bias
(``≈ h c / 4`` relative) below half the standard error of a streamed estimate
from ``N`` particles. The Metropolis samplers (``rwmh``, ``irreversible-mh``)
adapt during the burn-in instead (:mod:`cenlmc_jax.adaptation`: dual averaging
of the step size to the optimal acceptance, a diagonal preconditioner from
Stan's windows, pooled over the chains), starting from ``1/sqrt(c)`` scales;
``--no-adapt`` keeps those scales.

The job must not print a wrong answer with exit status 0. After the run it
checks: divergence; CEnLMC's ensemble force unused (below 5% of particle-steps); every
flag the sampler's infos declare for ``cj.sample``'s warnings (``run_flags``: CEnLMC's
gradient audit measuring a biased force, ``info.biased``; clipped noise; a collapsed
acceptance); Metropolis acceptance below 5%; unadjusted Langevin's known bias (Gaussian
targets) above the reported standard error; rank-normalised R-hat above 1.1 (with
--trace); estimates more than 5 standard errors from a known truth; a Langevin step size
at or above ``2/c``; no draw kept (a divergence before the first recorded step: the
outputs that exist are written). Any of these prints ``UNRELIABLE`` and exits 1 unless
``--allow-unreliable``. Exit status 2 is a usage error (message and usage, no
traceback), paths included: they are checked before any work; 130 an interrupted run.

The package: :mod:`~cenlmc_jax.cli.samplers` (the ``--sampler`` choices: the
library's registry ``cenlmc_jax.SAMPLERS`` and one table of what the command
knows of each), :mod:`~cenlmc_jax.cli.parser` (flags, their checks, the
configuration file), :mod:`~cenlmc_jax.cli.jobs` (setting up, running,
checkpointing and writing out the job), :mod:`~cenlmc_jax.cli.verdict` (the
report, the checks above and the exit codes); here, :func:`main` and the
``sample`` command that strings them together. ``python -m cenlmc_jax.cli``
runs :func:`main` too.
"""

from __future__ import annotations

import os
import sys
import time

import jax

from cenlmc_jax.cli import jobs, verdict
from cenlmc_jax.cli.parser import (
    UsageError,
    build_parser,
    check_args,
    config_tokens,
    read_config,
    refuse_config_model,
    run_folder_table,
    subparser,
)
from cenlmc_jax.cli.samplers import CHOICES as SAMPLER_CHOICES

__all__ = ["main", "cmd_sample", "build_parser", "UsageError", "SAMPLER_CHOICES"]


def cmd_sample(args) -> int:
    """``cenlmc-jax sample``: check the flags, set up, run, report, write out.

    A Ctrl-C raises KeyboardInterrupt (:func:`main` catches it: exit status 130).

    Args:
      args: the parsed command line of ``sample`` (an ``argparse.Namespace``,
        with a ``--config`` file already merged in).

    Returns:
      The exit status: 0, or 1 when a reliability check failed (unless
      ``--allow-unreliable``).

    Raises:
      UsageError: a flag value found bad after parsing.
    """
    t_start = time.perf_counter()
    check_args(args)
    setup = jobs.setup(args)
    jobs.start_out_dir(args)
    record = {"warnings": []}
    verdict.print_header(args, setup, record)
    run = jobs.run_job(args, setup)
    table, found = verdict.report(args, setup, run, record)
    files = jobs.write_outputs(args, setup, run, table, found, record, t_start)
    jobs.remove_checkpoint(args.checkpoint)
    for f in files:
        print(f"  wrote {f}")
    return verdict.exit_status(args, found)


def _with_config(parser, args, argv: list):
    """``--config FILE`` (or, with ``--resume --out DIR``, ``DIR/config.toml``) read
    under the command line.

    ``args``: the command line alone, whose ``--model`` is the only one ever imported: a
    file's ``model`` entry without it is a usage error
    (:func:`~cenlmc_jax.cli.parser.refuse_config_model`).
    """
    config, run_folder = args.config, False
    if (
        config is None
        and args.resume
        and args.out
        and os.path.isfile(os.path.join(args.out, "config.toml"))
    ):
        config, run_folder = os.path.join(args.out, "config.toml"), True
    if config is None:
        return args
    table = read_config(config)
    refuse_config_model(table, config, args.model)
    if run_folder:
        table = run_folder_table(table)
    merged = parser.parse_args(
        [argv[0]] + config_tokens(table, config, parser) + argv[1:]
    )
    merged.config = config
    return merged


def _sample(parser, args, argv: list, command_line: bool = False) -> int:
    """The ``sample`` command under :func:`~cenlmc_jax.cli.jobs.ctrl_c_recorded`: a
    Ctrl-C anywhere in it, however many come, is exit status 130, with one line on what
    the run left and how to go on (``command_line``: SIGINT stays ignored after it, as
    the process ends next).
    """
    interrupted, current = [], [args]
    use_compile_cache(args.compile_cache)
    try:
        with jobs.ctrl_c_recorded(interrupted, quiet_after=command_line) as stopped:
            try:
                current[0] = _with_config(parser, args, argv)
                code = cmd_sample(current[0])
            except KeyboardInterrupt:
                stopped()
                interrupted.append(True)
            # a Ctrl-C raised in a host callback reaches here as JAX's error about it
            except Exception:
                stopped()
                if not (interrupted or jobs.ctrl_c_pending()):
                    raise
                interrupted.append(True)
            stopped()
            if interrupted:
                jobs.say_interrupted(current[0])
                return verdict.EXIT_INTERRUPTED
    except KeyboardInterrupt:  # before the handler was set, or after it was put back
        jobs.say_interrupted(current[0])
        return verdict.EXIT_INTERRUPTED
    return code


#: Environment variables of the compilation cache: a folder, or any non-empty value
#: but ``0`` to switch it off (``--compile-cache`` wins over both).
CACHE_DIR_ENV, NO_CACHE_ENV = "CENLMC_JAX_CACHE_DIR", "CENLMC_JAX_NO_CACHE"


def default_cache_dir() -> str:
    """``$XDG_CACHE_HOME/cenlmc_jax/xla`` (``~/.cache/cenlmc_jax/xla`` without it)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(
        os.path.expanduser("~"), ".cache"
    )
    return os.path.join(base, "cenlmc_jax", "xla")


def use_compile_cache(folder: str | None) -> None:
    """JAX's persistent compilation cache for the job (``--compile-cache``).

    A CLI job builds new closures every time, so nothing of an earlier job's compilation
    is reused in memory; on disk, a program whose HLO is the same (the same job, or one
    with other output flags) is loaded instead of compiled (measured on the default job:
    benchmarks/results/waste.md). Every program is cached, however quick its compilation
    (a job compiles dozens of small ones: together they are most of a warm job's time).

    ``folder``: ``--compile-cache``; ``"off"``: no cache. None: ``$CENLMC_JAX_NO_CACHE``
    (set, not ``0``) switches it off; else the folder of ``$CENLMC_JAX_CACHE_DIR``, else
    the cache JAX is already configured with (``$JAX_COMPILATION_CACHE_DIR``), else
    :func:`default_cache_dir`. JAX writes an entry without a lock (unless the
    ``filelock`` package is installed and a size limit set), so jobs that run at the
    same time should each get their own folder.
    """
    if folder is None:
        if os.environ.get(NO_CACHE_ENV, "") not in ("", "0"):
            return
        folder = os.environ.get(CACHE_DIR_ENV) or None
    if folder == "off" or (folder is None and jax.config.jax_compilation_cache_dir):
        return
    folder = folder or default_cache_dir()
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as exc:
        raise UsageError(
            f"--compile-cache {folder}: cannot create it ({exc.strerror}); give "
            "another folder or 'off'."
        ) from exc
    jax.config.update("jax_compilation_cache_dir", folder)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


class _ReaderMayGo:
    """The command's stdout or stderr, which outlives its reader.

    When the reader of a pipe ends first (``cenlmc-jax sample --out run1 | head``),
    a write raises ``BrokenPipeError``: the command stopped there with a traceback,
    before it wrote its files. Here the stream's descriptor is pointed at the null
    device instead, and the command carries on to its files and its exit status.
    """

    def __init__(self, stream):
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._to_null()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._to_null()

    def _to_null(self) -> None:
        # what the stream's buffer still holds, and every later write, go there
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, self._stream.fileno())
        os.close(null)

    def __getattr__(self, name):
        return getattr(self._stream, name)


def _end_process(code: int) -> None:
    """End the process now, without Python's shutdown (why: :func:`main`)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # pragma: no cover - a closed stream
            pass
    os._exit(code)


def main(argv=None) -> int:
    """The ``cenlmc-jax`` console script: ``sample`` or ``summary``.

    Module docstring.

    ``argv`` None is the command itself (the console script, ``python -m
    cenlmc_jax.cli``): the process then ends with ``os._exit(status)`` once the
    command has returned and its output is flushed, without Python's shutdown.

    * An interrupted run: a Ctrl-C stops XLA's compilation or computation where the
      main thread waits for it, but the work goes on in XLA's own threads; Python's
      shutdown would then free the XLA client (its devices) under the compiling
      thread, which crashes with SIGSEGV (jaxlib: ``PjRtClient``'s destructor frees
      the devices before it joins its compile threads). The checkpoint is written
      atomically, so nothing is lost by skipping the shutdown.
    * Any other end, unless ``--model`` brought in the user's code (which may hold
      buffered files or ``atexit`` hooks of its own): the shutdown (JAX's ``atexit``
      clearing of its backends and caches, then freeing every module) costs about
      0.35 s of CPU after the work is done (``docs/guide/cli.md``, "CPU time").
      Every file the command writes is closed before it returns (outputs,
      checkpoints, the compilation cache's entries, which JAX writes as it
      compiles), so nothing waits for it.

    Called with ``argv`` (in-process), it returns the status instead. As a command,
    its output may outlive its reader (``| head``: :class:`_ReaderMayGo`).

    Args:
      argv: the arguments after the program name, or None for ``sys.argv[1:]``
        (the console script).

    Returns:
      The exit status (2 for a usage error, 130 for an interrupted run).
    """
    command_line = argv is None
    if command_line:
        sys.stdout, sys.stderr = _ReaderMayGo(sys.stdout), _ReaderMayGo(sys.stderr)
    parser = build_parser(__doc__.splitlines()[0])
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return verdict.EXIT_USAGE
    try:
        if args.command != "sample":
            code = verdict.cmd_summary(args)
        else:
            code = _sample(parser, args, argv, command_line)
    except UsageError as exc:
        subparser(parser, args.command).print_usage(sys.stderr)
        print(f"cenlmc-jax {args.command}: error: {exc}", file=sys.stderr)
        code = verdict.EXIT_USAGE
    # a --model's own code may hold buffered files or atexit hooks: Python's shutdown
    # for it, unless interrupted
    user_code = getattr(args, "model", None) is not None
    if command_line and (code == verdict.EXIT_INTERRUPTED or not user_code):
        _end_process(code)
    return code
