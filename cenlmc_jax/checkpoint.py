"""Checkpoints of :func:`cenlmc_jax.run.sample`: data only, with the identity of the run.

A checkpoint at ``path`` is two things:

* ``path``: an ``.npz`` (NumPy's zip of arrays, read with ``allow_pickle=False``:
  loading it never runs code) holding the carry of the run (the sampler state's
  leaves and the streaming moments) and a JSON header: the format, the step
  reached, how many chunk files are valid, ``diverged_at``, and the run's
  **identity**;
* ``path + ".chunks/"``: one ``.npz`` per finished chunk with its kept draws
  and per-step infos. Each chunk is written once, so a trace-mode checkpoint
  costs O(new data) per chunk, not O(trace so far).

Chunk files are written before the header that counts them, each atomically
(a temporary file, then ``os.replace``): a crash at any moment leaves either
the previous checkpoint or the new one.

The identity (:func:`run_identity`) records what the result depends on: the
key, the initial state (shapes, dtypes and a SHA-256 of the values), the step
function (its code and the values it closes over: a ``SamplingAlgorithm``'s
parameters, a ``functools.partial``'s arguments), ``trace_fn``, ``burn_in``,
``num_steps``, ``thin`` and ``mode``. A resume with any of them different is
refused with a ``ValueError`` naming the file and the field; so is a file that
is truncated, empty or not a checkpoint.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import os
import re
import zipfile
from typing import Any, Callable, NamedTuple, Optional

import jax
import numpy as np

from cenlmc_jax._validation import is_concrete

__all__ = ["FORMAT", "Checkpoint", "run_identity", "fingerprint", "check_path", "save", "load", "chunk_dir"]

FORMAT = "cenlmc_jax-checkpoint-1"
_MAX_DEPTH = 6
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


class Checkpoint(NamedTuple):
    """What :func:`load` returns: the header and the arrays of the carry.

    header: dict (``format``, ``identity``, ``step``, ``num_chunks``, ``diverged_at``).
    state_leaves: the sampler state's leaves, in ``jax.tree_util`` order.
    moments: the streaming ``(count, mean, m2)`` or None.
    chunks: list of ``(kept leaves or None, info leaves)`` per finished chunk.
    """

    header: dict
    state_leaves: list
    moments: Optional[tuple]
    chunks: list


def _digest(parts: list) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p if isinstance(p, bytes) else str(p).encode())
        h.update(b"\0")
    return h.hexdigest()[:24]


def _describe(obj: Any, depth: int, seen: set) -> list:
    """A process-independent description of ``obj`` (arrays by value, callables by code and closure)."""
    if depth > _MAX_DEPTH:
        return ["..."]
    if isinstance(obj, (jax.Array, np.ndarray, np.generic)):
        if not is_concrete(obj):
            return [f"traced {obj.shape} {obj.dtype}"]
        if isinstance(obj, jax.Array) and jax.dtypes.issubdtype(obj.dtype, jax.dtypes.prng_key):
            obj = jax.random.key_data(obj)
        arr = np.asarray(obj)
        return [f"array {arr.shape} {arr.dtype}", arr.tobytes()]
    if obj is None or isinstance(obj, (bool, int, float, complex, str, bytes)):
        return [repr(obj)]
    if id(obj) in seen:
        return ["<cycle>"]
    seen = seen | {id(obj)}
    if isinstance(obj, functools.partial):
        out = ["partial"] + _describe(obj.func, depth + 1, seen)
        for a in obj.args:
            out += _describe(a, depth + 1, seen)
        for k in sorted(obj.keywords):
            out += [k] + _describe(obj.keywords[k], depth + 1, seen)
        return out
    if isinstance(obj, (tuple, list)):
        out = [type(obj).__name__]
        for a in obj:
            out += _describe(a, depth + 1, seen)
        return out
    if isinstance(obj, dict):
        out = ["dict"]
        for k in sorted(obj, key=repr):
            out += [repr(k)] + _describe(obj[k], depth + 1, seen)
        return out
    if inspect.isfunction(obj):
        code = obj.__code__
        out = [f"function {obj.__module__}.{obj.__qualname__}", code.co_code, repr(code.co_names)]
        out += [_ADDRESS.sub("", repr(c)) for c in code.co_consts if not inspect.iscode(c)]
        for cell in obj.__closure__ or ():
            try:
                out += _describe(cell.cell_contents, depth + 1, seen)
            except ValueError:  # an empty cell
                out.append("<empty>")
        for d in obj.__defaults__ or ():
            out += _describe(d, depth + 1, seen)
        return out
    if callable(obj) and hasattr(obj, "__wrapped__"):
        return ["wrapped"] + _describe(obj.__wrapped__, depth + 1, seen)
    # anything else (a mesh, a jitted function, a user object): its type and an address-free repr
    return [f"{type(obj).__module__}.{type(obj).__qualname__}", _ADDRESS.sub("", repr(obj))[:200]]


def fingerprint(obj: Any) -> str:
    """A short stable hash of ``obj``'s description (same in every process for the same values and code)."""
    return _digest(_describe(obj, 0, set()))


def _state_summary(state: Any) -> str:
    leaves = jax.tree_util.tree_leaves(state)
    shapes = ", ".join(f"{np.shape(x)} {np.asarray(x).dtype if is_concrete(x) else x.dtype}" for x in leaves)
    return f"{jax.tree_util.tree_structure(state)}: {shapes}; values {fingerprint(leaves)}"


def run_identity(rng_key, step_fn: Callable, initial_state, trace_fn: Callable, *, burn_in: int, num_steps: int,
                 thin: int, mode: str) -> dict:
    """The fields a resumed run must share with the run that wrote the checkpoint."""
    return {
        "rng_key": fingerprint(rng_key),
        "initial_state": _state_summary(initial_state),
        "step_fn": fingerprint(step_fn),
        "trace_fn": fingerprint(trace_fn),
        "burn_in": burn_in,
        "num_steps": num_steps,
        "thin": thin,
        "mode": mode,
    }


def chunk_dir(path: str) -> str:
    return path + ".chunks"


def check_path(path: Any) -> str:
    """``checkpoint_path`` must be a file path whose folder exists and is writable (checked before any work)."""
    if not isinstance(path, (str, os.PathLike)):
        raise ValueError(f"checkpoint_path must be a file path (str or os.PathLike); got {path!r}.")
    path = os.fspath(path)
    if os.path.isdir(path):
        raise ValueError(f"checkpoint_path {path!r} is a directory; give a file path inside it.")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise ValueError(f"checkpoint_path {path!r}: the folder {folder!r} does not exist.")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ValueError(f"checkpoint_path {path!r}: the folder {folder!r} is not writable.")
    if os.path.exists(path) and not os.access(path, os.R_OK | os.W_OK):
        raise ValueError(f"checkpoint_path {path!r} exists but cannot be read and written.")
    return path


def _write_npz(path: str, arrays: dict) -> None:
    tmp = path + ".tmp"
    with open(tmp, "wb") as fh:  # a file object: np.savez adds no ".npz" suffix
        np.savez(fh, **arrays)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)  # atomic: a crash never leaves a half-written file


def _leaves(prefix: str, tree: Any) -> dict:
    return {f"{prefix}{i}": np.asarray(x) for i, x in enumerate(jax.tree_util.tree_leaves(jax.device_get(tree)))}


def save(path: str, *, identity: dict, step: int, state: Any, moments: Any, new_chunks: list, num_chunks: int,
         diverged_at: int) -> None:
    """Write the chunks finished since the last save, then the header and carry that count them.

    ``new_chunks``: ``(kept, infos)`` pytrees of the chunks not yet on disk; they
    become files ``num_chunks - len(new_chunks) .. num_chunks - 1``.
    """
    folder = chunk_dir(path)
    os.makedirs(folder, exist_ok=True)
    first = num_chunks - len(new_chunks)
    for k, (kept, infos) in enumerate(new_chunks, start=first):
        arrays = _leaves("info_", infos)
        if kept is not None:
            arrays.update(_leaves("kept_", kept))
        _write_npz(os.path.join(folder, f"{k:06d}.npz"), arrays)
    header = dict(format=FORMAT, identity=identity, step=int(step), num_chunks=int(num_chunks),
                  diverged_at=int(diverged_at))
    arrays = {"header": np.frombuffer(json.dumps(header).encode(), np.uint8)}
    arrays.update(_leaves("state_", state))
    if moments is not None:
        arrays.update(_leaves("moments_", tuple(moments)))
    _write_npz(path, arrays)


def _read_npz(path: str, what: str, checkpoint_path: str) -> dict:
    try:
        with np.load(path, allow_pickle=False) as data:
            return {k: data[k] for k in data.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, KeyError) as exc:
        raise ValueError(
            f"checkpoint_path {checkpoint_path!r}: {what} {path!r} is not a readable cenlmc_jax checkpoint "
            f"(truncated, empty or another kind of file: {type(exc).__name__}: {exc})."
        ) from exc


def _numbered(data: dict, prefix: str) -> list:
    keys = sorted((k for k in data if k.startswith(prefix)), key=lambda k: int(k[len(prefix):]))
    return [data[k] for k in keys]


def load(path: str) -> Checkpoint:
    """Read a checkpoint written by :func:`save`; ``ValueError`` naming ``path`` if it is not one."""
    data = _read_npz(path, "the file", path)
    try:
        header = json.loads(bytes(data["header"]).decode())
        ok = header.get("format") == FORMAT
    except (KeyError, ValueError, UnicodeDecodeError, AttributeError):
        ok = False
    if not ok:
        raise ValueError(f"checkpoint_path {path!r} is not a cenlmc_jax checkpoint (no {FORMAT} header).")
    chunks = []
    for k in range(header["num_chunks"]):
        c = _read_npz(os.path.join(chunk_dir(path), f"{k:06d}.npz"), "the chunk file", path)
        kept = _numbered(c, "kept_") or None
        chunks.append((kept, _numbered(c, "info_")))
    moments = _numbered(data, "moments_") or None
    return Checkpoint(header, _numbered(data, "state_"), None if moments is None else tuple(moments), chunks)


def check_identity(path: str, stored: dict, current: dict) -> None:
    """``ValueError`` naming the file and the first field in which the two runs differ."""
    for field, value in current.items():
        if stored.get(field) != value:
            raise ValueError(
                f"checkpoint_path {path!r} belongs to a different run: {field} differs (checkpoint: "
                f"{stored.get(field)!r}; this call: {value!r}). Use another path, or delete the file to start over."
            )
