"""Shared helpers for the scripts in ``benchmarks/``.

Every benchmark script does the same four things; they live here once:

    from _common import (base_parser, machine_info, time_call,
                         compiled_memory, sgemm_rate, write_results)

    # --quick --repeats --out-dir
    parser = base_parser("what this benchmark measures")
    args = parser.parse_args()
    fn = jax.jit(my_function)
    # Timing: median_s, min_s, ...
    t = time_call(fn, x, y, repeats=args.repeats)
    # dict: temp_bytes, ...
    mem = compiled_memory(my_function, x, y)
    # results/my_bench.{json,md}
    write_results("my_bench", payload, rows, columns=[...], out_dir=args.out_dir,
                  title="...", notes=["..."])

Rules the helpers enforce so numbers are comparable across scripts:

* ``time_call`` blocks on every output leaf (``jax.block_until_ready``): JAX
  dispatch is asynchronous and an unblocked timer measures only the dispatch.
  The first call (compilation + first run) is timed separately and never
  enters the statistics; the reported figure is the **median** of ``repeats``
  runs (robust against the noise of a shared machine), the minimum is kept too.
* ``compiled_memory`` reads XLA's own buffer assignment
  (``jax.jit(fn).lower(*args).compile().memory_analysis()``): ``temp_bytes`` is
  the scratch memory the compiled program needs beyond its arguments and
  outputs. This is what "the tiled version never builds an N x N array" is
  checked against.
* ``write_results`` always records ``machine_info()`` (platform, CPU count,
  JAX version, date) beside the numbers, in JSON and in the markdown header.

Scripts import this module as ``from _common import ...``: running
``python benchmarks/bench_X.py`` puts ``benchmarks/`` first on ``sys.path``.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import platform
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "RESULTS_DIR",
    "Timing",
    "base_parser",
    "machine_info",
    "time_call",
    "compiled_memory",
    "sgemm_rate",
    "markdown_table",
    "write_results",
    "fmt_bytes",
    "fmt_rate",
]

RESULTS_DIR = Path(__file__).resolve().parent / "results"


# --------------------------------------------------------------------------- cli


def base_parser(description: str) -> argparse.ArgumentParser:
    """An ``ArgumentParser`` with the flags every benchmark shares.

    ``--quick``: a small, fast run (smoke test of the script; numbers not meant
    to be quoted). ``--repeats R``: timed runs per configuration (median
    reported; default 5). ``--out-dir``: where the JSON and markdown go
    (default ``benchmarks/results``).
    """
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument(
        "--quick", action="store_true", help="small sizes, for a fast smoke run"
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=5,
        help="timed runs per configuration (median reported)",
    )
    parser.add_argument(
        "--out-dir",
        type=Path,
        default=RESULTS_DIR,
        help="directory for the JSON and markdown output",
    )
    return parser


# ------------------------------------------------------------------ machine info


def pin_to_one_cpu(cpu: int | None = None) -> int | None:
    """Pin every thread of this process to one CPU (the last allowed, by default).

    Every thread, not only the caller's: JAX's runtime threads, started at import,
    would otherwise run on another CPU, and their CPU time would enter the figures
    (bench_inverse.py measured it as overhead, not work).

    Args:
      cpu: the CPU, or None for the highest this process may run on.

    Returns:
      The CPU, or None where the platform cannot pin.
    """
    if not hasattr(os, "sched_setaffinity"):
        return None
    cpu = max(os.sched_getaffinity(0)) if cpu is None else cpu
    for tid in os.listdir("/proc/self/task"):
        os.sched_setaffinity(int(tid), {cpu})
    return cpu


def machine_info() -> dict[str, Any]:
    """Where and when the numbers were taken: platform, CPUs, versions, date (UTC)."""
    devices = jax.devices()
    try:
        affinity = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        affinity = None
    try:
        load = os.getloadavg()
    except (AttributeError, OSError):
        load = None
    return {
        "date_utc": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": platform.processor() or _cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpu_affinity": affinity,
        "load_average_1_5_15": None if load is None else [round(v, 2) for v in load],
        "python": platform.python_version(),
        "jax": jax.__version__,
        "jaxlib": getattr(jax.lib, "__version__", None) or _jaxlib_version(),
        "numpy": np.__version__,
        "backend": jax.default_backend(),
        "devices": [f"{d.platform}:{getattr(d, 'device_kind', '?')}" for d in devices],
        "x64": bool(jax.config.jax_enable_x64),
    }


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def _jaxlib_version() -> str | None:
    try:
        import jaxlib

        return jaxlib.__version__
    except Exception:  # pragma: no cover - jaxlib always ships with jax
        return None


# ----------------------------------------------------------------------- timing


class Timing(NamedTuple):
    """Wall-clock seconds of one configuration.

    median_s: median over ``repeats`` blocked runs (the figure to quote).
    min_s, max_s: spread of those runs. first_call_s: the first call,
    including compilation (not in the statistics). times_s: every timed run.
    cpu_median_s: median process CPU time per call (all threads together):
    the work done, much less sensitive than wall time to other jobs on a
    shared machine (wall ~ cpu / threads on a quiet one).
    """

    median_s: float
    min_s: float
    max_s: float
    first_call_s: float
    repeats: int
    times_s: tuple
    cpu_median_s: float = float("nan")

    def as_dict(self) -> dict[str, Any]:
        d = self._asdict()
        d["times_s"] = list(self.times_s)
        return d


def _block(out: Any) -> Any:
    return jax.block_until_ready(out)


def time_call(
    fn: Callable, *args: Any, repeats: int = 5, min_run_s: float = 0.0, **kwargs: Any
) -> Timing:
    """Time ``fn(*args, **kwargs)``: one untimed-in-stats first call, then ``repeats``
    runs.

    Every run is blocked with ``jax.block_until_ready`` on all outputs. Pass a
    jitted ``fn`` to time the compiled program (the first call absorbs the
    compilation). If ``min_run_s > 0`` and a single run is shorter, each timed
    sample loops the call until at least ``min_run_s`` has passed and reports
    the mean per call of that loop (reduces timer noise for microsecond calls).
    """
    if repeats < 1:
        raise ValueError(f"repeats must be an integer >= 1; got {repeats}.")
    t0 = time.perf_counter()
    _block(fn(*args, **kwargs))
    first = time.perf_counter() - t0

    times, cpu = [], []
    for _ in range(repeats):
        n_calls = 0
        c0 = time.process_time()
        t0 = time.perf_counter()
        while True:
            _block(fn(*args, **kwargs))
            n_calls += 1
            elapsed = time.perf_counter() - t0
            if elapsed >= min_run_s:
                break
        times.append(elapsed / n_calls)
        cpu.append((time.process_time() - c0) / n_calls)
    return Timing(
        median_s=float(statistics.median(times)),
        min_s=float(min(times)),
        max_s=float(max(times)),
        first_call_s=float(first),
        repeats=repeats,
        times_s=tuple(float(t) for t in times),
        cpu_median_s=float(statistics.median(cpu)),
    )


# ----------------------------------------------------------------------- memory


def compiled_memory(
    fn: Callable, *args: Any, static_argnums: Sequence[int] = (), **jit_kwargs: Any
) -> dict[str, Any]:
    """XLA's memory accounting of ``jax.jit(fn)`` compiled for ``args``.

    Returns bytes: ``temp_bytes`` (scratch buffers: the figure that tells a
    streaming algorithm from one that materialises an N x N array),
    ``argument_bytes``, ``output_bytes``, ``alias_bytes``, ``code_bytes``, and
    ``peak_bytes`` = temp + argument + output - alias (an upper bound of what
    the program holds at once). Values are ``None`` if the backend does not
    report them. ``args`` may be arrays or ``jax.ShapeDtypeStruct``s (nothing
    is run, only compiled). Pass an already-jitted function to reuse its
    static arguments: it is not wrapped twice.
    """
    jitted = (
        fn
        if hasattr(fn, "lower")
        else jax.jit(fn, static_argnums=tuple(static_argnums), **jit_kwargs)
    )
    compiled = jitted.lower(*args).compile()
    try:
        ma = compiled.memory_analysis()
    except Exception:  # some backends do not implement it
        ma = None

    def get(attr: str) -> int | None:
        v = getattr(ma, attr, None) if ma is not None else None
        return None if v is None else int(v)

    out = {
        "temp_bytes": get("temp_size_in_bytes"),
        "argument_bytes": get("argument_size_in_bytes"),
        "output_bytes": get("output_size_in_bytes"),
        "alias_bytes": get("alias_size_in_bytes"),
        "code_bytes": get("generated_code_size_in_bytes"),
    }
    parts = [out["temp_bytes"], out["argument_bytes"], out["output_bytes"]]
    out["peak_bytes"] = (
        None if None in parts else sum(parts) - (out["alias_bytes"] or 0)
    )
    return out


# ------------------------------------------------------------------------ sgemm


def sgemm_rate(
    n: int = 4096, repeats: int = 5, dtype: Any = jnp.float32
) -> dict[str, Any]:
    """Measured dense matmul rate: ``jnp.dot`` of two ``(n, n)`` matrices, jitted.

    Returns ``{"n", "dtype", "flops_per_s", "timing"}`` with flops = 2 n^3 and
    the median time. A machine-specific roofline for kernels made of matmuls.
    """
    k1, k2 = jax.random.split(jax.random.key(0))
    a = jax.random.normal(k1, (n, n), dtype)
    b = jax.random.normal(k2, (n, n), dtype)
    dot = jax.jit(lambda a, b: jnp.dot(a, b, precision=jax.lax.Precision.HIGHEST))
    t = time_call(dot, a, b, repeats=repeats)
    return {
        "n": n,
        "dtype": str(jnp.dtype(dtype)),
        "flops_per_s": 2.0 * n**3 / t.median_s,
        "timing": t.as_dict(),
    }


# ---------------------------------------------------------------------- output


def fmt_bytes(n: float | None) -> str:
    """``1536 -> '1.5 KiB'``; ``None -> '-'``."""
    if n is None or (isinstance(n, float) and math.isnan(n)):
        return "-"
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # unreachable


def fmt_rate(x: float | None, unit: str = "/s") -> str:
    """``1.23e9 -> '1.23e+09/s'``; ``None -> '-'``."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x:.3g}{unit}"


def markdown_table(
    rows: Iterable[dict[str, Any]], columns: Sequence[str] | None = None
) -> str:
    """A GitHub markdown table of ``rows`` (dicts). Missing cells print ``-``.

    ``columns`` fixes the order (default: keys of the first row). Floats are
    printed with 4 significant digits; pre-format a cell (a string) to control it.
    """
    rows = list(rows)
    if not rows:
        return "(no rows)\n"
    columns = list(columns) if columns is not None else list(rows[0].keys())

    def cell(v: Any) -> str:
        if v is None:
            return "-"
        if isinstance(v, float):
            return f"{v:.4g}"
        return str(v)

    lines = [
        "| " + " | ".join(columns) + " |",
        "|" + "|".join("---" for _ in columns) + "|",
    ]
    for r in rows:
        lines.append("| " + " | ".join(cell(r.get(c)) for c in columns) + " |")
    return "\n".join(lines) + "\n"


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (np.floating,)):
        v = float(obj)
        return None if not math.isfinite(v) else v
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, (np.ndarray, jax.Array)):
        return _jsonable(np.asarray(obj).tolist())
    if isinstance(obj, Path):
        return str(obj)
    return obj


def write_results(
    name: str,
    payload: dict[str, Any],
    rows: Sequence[dict[str, Any]],
    *,
    columns: Sequence[str] | None = None,
    out_dir: Path | str = RESULTS_DIR,
    title: str | None = None,
    notes: Sequence[str] = (),
    command: str | None = None,
    md_rows: Sequence[dict[str, Any]] | None = None,
) -> tuple[Path, Path]:
    """Write ``out_dir/name.json`` and ``out_dir/name.md``; return both paths.

    JSON: ``{"machine": machine_info(), "command": ..., **payload, "rows": rows}``.
    Markdown: title, machine line, the command to reproduce, ``notes`` as
    bullets, then ``markdown_table(md_rows or rows, columns)`` (pass
    ``md_rows`` to print pre-formatted cells while the JSON keeps raw numbers).
    """
    import sys

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    info = machine_info()
    command = command or "python " + " ".join(
        [os.path.relpath(sys.argv[0])] + sys.argv[1:]
    )
    doc = {"machine": info, "command": command, **payload, "rows": list(rows)}
    json_path = out_dir / f"{name}.json"
    json_path.write_text(json.dumps(_jsonable(doc), indent=2) + "\n")

    md = [f"# {title or name}", ""]
    md.append(
        f"Machine: {info['platform']}, {info['processor'] or info['machine']}, "
        f"{info['cpu_count']} CPUs (affinity {info['cpu_affinity']}), load "
        f"{info['load_average_1_5_15']}, JAX {info['jax']} ({info['backend']}), "
        f"{info['date_utc']}."
    )
    md.append("")
    md.append(f"Reproduce: `{command}`")
    md.append("")
    for n in notes:
        md.append(f"- {n}")
    if notes:
        md.append("")
    md.append(markdown_table(md_rows if md_rows is not None else rows, columns))
    md_path = out_dir / f"{name}.md"
    md_path.write_text("\n".join(md))
    return json_path, md_path
