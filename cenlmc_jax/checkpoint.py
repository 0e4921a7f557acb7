"""Checkpoints of :func:`cenlmc_jax.run.sample`: data only, with the run's identity.

A checkpoint at ``path`` is two things:

* ``path``: an ``.npz`` (NumPy's zip of arrays, read with ``allow_pickle=False``:
  loading it never runs code) holding the carry of the run (the sampler state's
  leaves, the streaming moments and the online diagnostics' accumulators: what the
  end-of-run checks of a streamed run read, so that a resumed run checks what the
  whole run would have) and a JSON header: the format, the step
  reached, how many chunk files are valid, ``diverged_at``, and the run's
  **identity**;
* ``path + ".chunks/"``: one ``.npz`` per finished chunk with its kept draws,
  per-step infos and its *watch* (the chains frozen for the whole chunk and the
  every-step flags' counts, which a resume reports again as the run did). Each
  chunk is written once, so a trace-mode checkpoint
  costs O(new data) per chunk, not O(trace so far).

Chunk files are written before the header that counts them, each atomically
(a temporary file, then ``os.replace``): a crash at any moment leaves either
the previous checkpoint or the new one.

The identity (:func:`run_identity`) records what the result depends on: the
key, the initial state (shapes, dtypes and a SHA-256 of the values), the step
function, ``trace_fn``, ``burn_in``, ``num_steps``, ``thin``, ``mode`` and
``info_reduce``. Functions are fingerprinted all the way down
(:func:`fingerprint`): their code, closure cells, defaults and the globals a
user's function reads; bound methods with their ``__self__``, callable
objects with their ``__dict__``, partials with their arguments, containers,
NamedTuples and dataclasses field by field, arrays by a hash of their bytes,
with a guard against cycles; a function may declare its fingerprint
(:data:`DECLARED_FINGERPRINT`). Library code (cenlmc_jax, the standard library,
installed packages) is named by its import path: its code is versioned. What
has no process-independent description (a C object such as a NumPy
``Generator`` or a lock) makes ``checkpoint_path=`` refuse the run up front
(``ValueError``), never a ``repr`` that could hide a difference.

A resume with any field different is refused with a ``ValueError`` naming
the file and the field; so is a file that is truncated, empty or not a
checkpoint, and one whose header disagrees with itself or with its arrays
(:func:`load`: types and ranges of ``step``, ``num_chunks``, ``diverged_at``,
``identity``; the chunk files must count ``step`` steps;
:func:`check_against_run`: the arrays' shapes and dtypes, the kept draws per
chunk).
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import functools
import hashlib
import json
import os
import sys
import sysconfig
import types
import uuid
import zipfile
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import numpy as np

try:
    import fcntl
except ImportError:  # Windows: no advisory locks
    fcntl = None

from cenlmc_jax._host import fetch, is_writer

__all__ = [
    "FORMAT",
    "FORMAT_1",
    "Checkpoint",
    "DECLARED_FINGERPRINT",
    "Unfingerprintable",
    "run_identity",
    "fingerprint",
    "check_path",
    "save",
    "load",
    "chunk_dir",
    "writer_lock",
]

FORMAT = "cenlmc_jax-checkpoint-2"
#: The format before the online accumulators were saved (issue 47): read, and resumed
#: only where it lacks nothing (a trace, or a streamed run that kept no draw yet).
FORMAT_1 = "cenlmc_jax-checkpoint-1"
#: A function whose ``__dict__`` holds this name, a string, is fingerprinted by that
#: string alone (its code, closure and globals unread): how a caller names a function
#: that has no description of its own (the CLI: a model file's text and the run's
#: configuration).
DECLARED_FINGERPRINT = "__cenlmc_jax_fingerprint__"


class Checkpoint(NamedTuple):
    """What :func:`load` returns: the header and the arrays of the carry.

    Attributes:
      header: dict (``format``, ``identity``, ``step``, ``num_chunks``,
        ``diverged_at``).
      state_leaves: the sampler state's leaves, in ``jax.tree_util`` order.
      moments: the streaming ``(count, mean, m2)`` or None.
      chunks: list of ``(kept leaves or None, info leaves)`` per finished chunk.
      online: the online diagnostics' accumulators' leaves
        (:class:`~cenlmc_jax.diagnostics.online.OnlineAccumulator`) of a streamed
        run, or None (a trace, or a file of :data:`FORMAT_1`).
      watches: per chunk, its watch ``(frozen rows or None, [flag counts])``, or
        None (a chunk cut at a divergence, or a file of :data:`FORMAT_1`).
    """

    header: dict
    state_leaves: list
    moments: tuple | None
    chunks: list
    online: list | None = None
    watches: list | None = None


_LIBRARY_ROOTS = ("cenlmc_jax",)


class Unfingerprintable(TypeError):
    """An object with no process-independent description.

    Raised by :func:`fingerprint`.

    Attributes:
      where: the path to it from the fingerprinted object
        (``"closure 'f' -> global 'rng'"``).
      what: what the object is and why it cannot be described.
    """

    def __init__(self, where: str, what: str):
        super().__init__(f"{where or 'the object'}: {what}")
        self.where, self.what = where, what


@functools.cache
def _library_module(name: str) -> bool:
    """True for cenlmc_jax, the standard library and installed packages: code versioned
    outside the run, whose importable functions and classes are described by their
    qualified name alone.
    """
    if (
        not name or name == "__main__"
    ):  # a script or a notebook (which has no __file__): the user's code
        return False
    if name.split(".")[0] in _LIBRARY_ROOTS or name in sys.builtin_module_names:
        return True
    module = sys.modules.get(name)
    path = getattr(module, "__file__", None)
    if module is None or path is None:
        return name.split(".")[0] in sys.builtin_module_names or name.startswith("_")
    path = os.path.realpath(path)
    roots = {
        os.path.realpath(p)
        for k, p in sysconfig.get_paths().items()
        if k in ("stdlib", "purelib", "platlib")
    }
    return any(path.startswith(r + os.sep) for r in roots)


def _import_name(obj: Any) -> str | None:
    """``module.qualname`` when importing that name gives back ``obj`` itself (a stable
    identity), else None.
    """
    module, qualname = (
        getattr(obj, "__module__", None),
        getattr(obj, "__qualname__", None),
    )
    if not isinstance(module, str) or not isinstance(qualname, str) or "<" in qualname:
        return None
    target = sys.modules.get(module)
    for part in qualname.split("."):
        target = getattr(target, part, None)
        if target is None:
            return None
    return f"{module}.{qualname}" if target is obj else None


def _global_names(code: types.CodeType) -> list:
    names = set(code.co_names)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            names.update(_global_names(c))
    return sorted(names)


class _Describer:
    """A process-independent description of an object graph: the parts of its hash.

    Everything the value of a computation can depend on is followed all the way
    down: arrays by a SHA-256 of their bytes, functions by their code (bytecode,
    constants, names, nested code objects), closure cells, defaults and the
    globals they read (of user code: library code is versioned, named by its
    import path), bound methods by ``__self__``, partials by their arguments,
    containers, NamedTuples and dataclasses by their fields, other objects by
    their type and ``__dict__`` / ``__slots__`` (and ``__call__`` for a user's
    callable class). An object met again is a back-reference (cycles end).
    What has no such description (a C object with no state to read: a lock, a
    file, a NumPy ``Generator``, a tracer) raises :class:`Unfingerprintable`:
    never a ``repr`` that would hide a difference.
    """

    def __init__(self):
        self.h = hashlib.sha256()
        self.memo: dict = {}
        # objects made while describing stay alive: their ids are not reused
        self.keep: list = []

    def emit(self, *parts) -> None:
        for p in parts:
            self.h.update(p if isinstance(p, bytes) else str(p).encode())
            self.h.update(b"\0")

    def __call__(self, obj: Any, where: str) -> None:
        if (
            obj is None
            or obj is Ellipsis
            or isinstance(obj, (bool, int, float, complex, str, bytes))
        ):
            self.emit(type(obj).__name__, repr(obj))
            return
        if isinstance(obj, jax.core.Tracer):
            raise Unfingerprintable(
                where, "a traced value (its value is not known while tracing)"
            )
        if isinstance(obj, (jax.Array, np.ndarray, np.generic)):
            self.array(obj, where)
            return
        if id(obj) in self.memo:
            self.emit("ref", self.memo[id(obj)])
            return
        self.memo[id(obj)] = len(self.memo)
        self.keep.append(obj)
        self.compound(obj, where)

    def array(self, obj: Any, where: str) -> None:
        if isinstance(obj, jax.Array) and jax.dtypes.issubdtype(
            obj.dtype, jax.dtypes.prng_key
        ):
            self.emit("key", str(jax.random.key_impl(obj)))
            obj = jax.random.key_data(obj)
        arr = np.asarray(fetch(obj))  # gathered when sharded over several processes
        if arr.dtype == object:
            self.emit("object array", arr.shape)
            for i, item in enumerate(arr.ravel()):
                self(item, f"{where}[{i}]")
            return
        self.emit(
            "array",
            arr.shape,
            arr.dtype.str,
            hashlib.sha256(np.ascontiguousarray(arr).tobytes()).hexdigest(),
        )

    def items(self, pairs, where: str) -> None:
        for name, value in pairs:
            self.emit(name)
            self(value, f"{where}.{name}" if where else str(name))

    def compound(self, obj: Any, where: str) -> None:
        t = type(obj)
        name = (
            None if isinstance(obj, (type, types.FunctionType)) else _import_name(obj)
        )
        if name is not None and _library_module(obj.__module__):
            self.emit(
                "library object", name
            )  # jnp.sin, jax.nn.relu, math.exp: by import path
        elif isinstance(obj, types.ModuleType):
            self.emit("module", obj.__name__)
        elif isinstance(obj, type):
            self.cls(obj, where)
        elif isinstance(obj, np.dtype):
            self.emit("dtype", obj.str)
        elif isinstance(obj, functools.partial):
            self.emit("partial", f"{t.__module__}.{t.__qualname__}")
            self(obj.func, f"{where}.func")
            self.emit(len(obj.args))
            for i, a in enumerate(obj.args):
                self(a, f"{where}.args[{i}]")
            self.items(sorted(obj.keywords.items()), f"{where}.keywords")
        elif isinstance(obj, types.MethodType):
            self.emit("method")
            self(obj.__func__, f"{where}.__func__")
            self(obj.__self__, f"{where}.__self__")
        elif isinstance(obj, types.FunctionType):
            self.function(obj, where)
        elif isinstance(obj, (types.BuiltinFunctionType, types.BuiltinMethodType)):
            owner = getattr(obj, "__self__", None)
            name = _import_name(obj)
            if name is not None or owner is None or isinstance(owner, types.ModuleType):
                self.emit(
                    "builtin",
                    name or f"{getattr(owner, '__name__', '')}.{obj.__name__}",
                )
            else:
                self.emit("builtin method", obj.__name__)
                self(owner, f"{where}.__self__")
        elif isinstance(obj, types.CodeType):
            self.code(obj, where)
        elif isinstance(obj, np.ufunc):
            self.emit("ufunc", obj.__name__)
        elif isinstance(obj, (tuple, list)) and not hasattr(obj, "_fields"):
            self.emit(f"{t.__module__}.{t.__qualname__}", len(obj))
            for i, a in enumerate(obj):
                self(a, f"{where}[{i}]")
        elif isinstance(obj, tuple):  # a NamedTuple: its type and fields
            self.cls(t, where)
            self.items(zip(obj._fields, obj, strict=True), where)
        elif (
            hasattr(obj, "__wrapped__")
            and _library_module(t.__module__)
            # its type, not callable()
            and not isinstance(getattr(t, "__call__", None), types.FunctionType)  # noqa: B004
        ):
            # a library's C wrapper (jax.jit's PjitFunction): the function it wraps, not
            # its caches
            self.emit("wrapper", f"{t.__module__}.{t.__qualname__}")
            self(obj.__wrapped__, f"{where} -> __wrapped__")
        elif isinstance(obj, (dict, types.MappingProxyType)):
            self.emit(f"{t.__module__}.{t.__qualname__}", len(obj))
            for k, v in sorted(obj.items(), key=lambda kv: _sort_key(kv[0])):
                self(k, f"{where} key")
                self(v, f"{where}[{k!r}]")
        elif isinstance(obj, (set, frozenset)):
            subs = sorted(
                fingerprint(v) for v in obj
            )  # order-free: by each element's own hash
            self.emit(t.__name__, *subs)
        elif isinstance(obj, enum.Enum):
            self.cls(t, where)
            self.emit(obj.name)
        elif dataclasses.is_dataclass(obj):
            self.cls(t, where)
            self.items(
                [(f.name, getattr(obj, f.name)) for f in dataclasses.fields(obj)], where
            )
        elif isinstance(obj, jax.Device):
            self.emit("device", obj.platform, obj.id)
        elif isinstance(obj, jax.sharding.Mesh):
            self.emit("mesh", repr(obj.axis_names))
            self(obj.devices, f"{where}.devices")
        else:
            self.instance(obj, where)

    def cls(self, c: type, where: str) -> None:
        name = _import_name(c)
        if name is not None and _library_module(c.__module__):
            self.emit("class", name)
            return
        # a user's class: its name and the code of its methods (they are part of the
        # run)
        self.emit("class", f"{c.__module__}.{c.__qualname__}")
        for k, v in sorted(vars(c).items()):
            if isinstance(v, (staticmethod, classmethod)):
                v = v.__func__
            # methods written by the user (not those generated by namedtuple /
            # dataclass: code from "<string>")
            if isinstance(
                v, types.FunctionType
            ) and not v.__code__.co_filename.startswith("<"):
                self.emit(k)
                self(v, f"{where}.{k}")

    def function(self, fn: types.FunctionType, where: str) -> None:
        declared = fn.__dict__.get(DECLARED_FINGERPRINT)
        if isinstance(declared, str):
            self.emit("declared", declared)
            return
        name = _import_name(fn)
        library = _library_module(fn.__module__)
        if name is not None and library:
            self.emit(
                "function", name
            )  # a library function by its import path (its code is versioned)
            return
        self.emit("function", f"{fn.__module__}.{fn.__qualname__}")
        self.code(fn.__code__, f"{where} (code)")
        for var, cell in zip(
            fn.__code__.co_freevars, fn.__closure__ or (), strict=True
        ):
            self.emit("cell", var)
            try:
                value = cell.cell_contents
            except ValueError:  # an empty cell (a name not assigned yet)
                self.emit("<empty>")
                continue
            self(value, f"{where} -> closure {var!r}")
        self.emit("defaults")
        self(fn.__defaults__, f"{where} -> defaults")
        self(fn.__kwdefaults__, f"{where} -> kwdefaults")
        if fn.__dict__:
            self.items(
                sorted((k, v) for k, v in fn.__dict__.items() if k != "__wrapped__"),
                where,
            )
            if "__wrapped__" in fn.__dict__:
                self.emit("__wrapped__")
                self(fn.__wrapped__, f"{where} -> __wrapped__")
        # the module-level values a user's function reads (library ones are versioned)
        if not library:
            g = fn.__globals__
            for gname in _global_names(fn.__code__):
                if gname in g and not gname.startswith("__"):
                    self.emit("global", gname)
                    self(g[gname], f"{where} -> global {gname!r}")

    def code(self, code: types.CodeType, where: str) -> None:
        self.emit(
            "code",
            code.co_name,
            code.co_argcount,
            code.co_posonlyargcount,
            code.co_kwonlyargcount,
            code.co_flags,
            code.co_code,
            repr(code.co_names),
            repr(code.co_varnames),
            repr(code.co_freevars),
            repr(code.co_cellvars),
        )
        for c in code.co_consts:
            self(c, f"{where} const")

    def instance(self, obj: Any, where: str) -> None:
        t = type(obj)
        state = getattr(obj, "__dict__", None)
        slots = [
            s
            for k in t.__mro__
            for s in getattr(k, "__slots__", ())
            if isinstance(s, str)
        ]
        slots = [
            s for s in slots if s not in ("__dict__", "__weakref__") and hasattr(obj, s)
        ]
        if not isinstance(state, dict) and not slots:
            raise Unfingerprintable(
                where,
                f"an object of type {t.__module__}.{t.__qualname__} with no state "
                "Python can read (a C object: no stable identity across processes)",
            )
        self.cls(t, where)
        if isinstance(state, dict):
            self.items(sorted(state.items(), key=lambda kv: str(kv[0])), where)
        self.items([(s, getattr(obj, s)) for s in slots], where)


def _sort_key(k: Any) -> str:
    return (
        f"{type(k).__name__}:{k!r}"
        if isinstance(k, (str, int, float, bool, bytes, type(None)))
        else fingerprint(k)
    )


def fingerprint(obj: Any) -> str:
    """A short stable hash of ``obj``.

    The same in every process for the same values and code.

    Args:
      obj: any value: a function, a pytree, an array, an object.

    Returns:
      The hash, 24 hex digits of a SHA-256.

    Raises:
      Unfingerprintable: ``obj`` holds something with no process-independent
        description (see :class:`_Describer`).
    """
    d = _Describer()
    try:
        d(obj, "")
    except RecursionError as exc:
        raise Unfingerprintable("", "nested too deeply to fingerprint") from exc
    return d.h.hexdigest()[:24]


def _state_summary(state: Any) -> str:
    leaves = jax.tree_util.tree_leaves(state)
    shapes = ", ".join(
        f"{np.shape(x)} {x.dtype if hasattr(x, 'dtype') else np.asarray(x).dtype}"
        for x in leaves
    )
    return (
        f"{jax.tree_util.tree_structure(state)}: {shapes}; values {fingerprint(leaves)}"
    )


def run_identity(
    rng_key,
    step_fn: Callable,
    initial_state,
    trace_fn: Callable,
    *,
    burn_in: int,
    num_steps: int,
    thin: int,
    mode: str,
    info_reduce: str | None = "mean",
    path: str = "",
) -> dict:
    """The fields a resumed run must share with the run that wrote the checkpoint.

    Args:
      rng_key: the run's key.
      step_fn: the step function (fingerprinted with its parameters).
      initial_state: the initial state (shapes, dtypes and a hash of the values).
      trace_fn: what the run records of a state.
      burn_in: as for :func:`~cenlmc_jax.run.sample`.
      num_steps: as for :func:`~cenlmc_jax.run.sample`.
      thin: as for :func:`~cenlmc_jax.run.sample`.
      mode: as for :func:`~cenlmc_jax.run.sample`.
      info_reduce: as for :func:`~cenlmc_jax.run.sample`.
      path: the checkpoint path, for the message.

    Returns:
      A JSON-serialisable dict from field name to fingerprint or value.

    Raises:
      ValueError: naming ``checkpoint_path`` and the field when one of them cannot
        be fingerprinted (:class:`Unfingerprintable`): a resume could not tell
        whether it is the same run, so it is refused before any work.
    """

    def fp(field, value, summary=None):
        try:
            return (summary or fingerprint)(value)
        except Unfingerprintable as exc:
            raise ValueError(
                f"checkpoint_path {path!r}: {field} cannot be fingerprinted, so a "
                "resume could not tell whether it is the same run: "
                f"{field}{' ' if exc.where else ''}{exc.where}: {exc.what}. Pass it "
                "through values Python can read (arrays, numbers, functions, "
                "partials, NamedTuples, dataclasses, objects with a __dict__), or run "
                "without checkpoint_path."
            ) from exc

    return {
        "rng_key": fp("rng_key", rng_key),
        "initial_state": fp("initial_state", initial_state, _state_summary),
        "step_fn": fp("step_fn", step_fn),
        "trace_fn": fp("trace_fn", trace_fn),
        "burn_in": burn_in,
        "num_steps": num_steps,
        "thin": thin,
        "mode": mode,
        "info_reduce": info_reduce,
    }


def chunk_dir(path: str) -> str:
    """The folder of a checkpoint's chunk files.

    Args:
      path: the checkpoint file.

    Returns:
      ``path + ".chunks"``.
    """
    return path + ".chunks"


def check_path(path: Any) -> str:
    """Checks that ``checkpoint_path`` is a file path in a writable folder.

    Checked before any work.

    Args:
      path: the ``checkpoint_path`` argument (``str`` or ``os.PathLike``).

    Returns:
      The path as a ``str``.

    Raises:
      ValueError: not a path, a directory, a folder that does not exist or is not
        writable, an existing file that cannot be read and written, or a lock file
        (``path + ".lock"``) or chunk folder that is a symbolic link (the run would
        write where it points), a lock file that is a directory or cannot be opened.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise ValueError(
            f"checkpoint_path must be a file path (str or os.PathLike); got {path!r}."
        )
    path = os.fspath(path)
    if os.path.isdir(path):
        raise ValueError(
            f"checkpoint_path {path!r} is a directory; give a file path inside it."
        )
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise ValueError(
            f"checkpoint_path {path!r}: the folder {folder!r} does not exist."
        )
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ValueError(
            f"checkpoint_path {path!r}: the folder {folder!r} is not writable."
        )
    if os.path.exists(path) and not os.access(path, os.R_OK | os.W_OK):
        raise ValueError(
            f"checkpoint_path {path!r} exists but cannot be read and written."
        )
    lock = path + ".lock"
    for side in (lock, chunk_dir(path)):
        if os.path.islink(side):
            raise _symlink_error(path, side)
    if os.path.isdir(lock):
        raise _lock_error(path, lock, "is a directory")
    if os.path.exists(lock) and not os.access(lock, os.R_OK | os.W_OK):
        raise _lock_error(path, lock, "cannot be opened for writing (another user's?)")
    return path


def _symlink_error(path: str, side: str) -> ValueError:
    return ValueError(
        f"checkpoint_path {path!r}: {side!r} is a symbolic link (to "
        f"{os.readlink(side)!r}), and a checkpoint never writes through one, out of "
        "its folder: remove the link, or give this run another path."
    )


def _lock_error(path: str, lock: str, what: str) -> ValueError:
    return ValueError(
        f"checkpoint_path {path!r}: its lock file {lock!r} {what}: remove it if no run "
        "is using it, or give this run another path."
    )


def _open_lock(path: str, lock: str) -> int:
    """The lock file's descriptor, never through a symbolic link (``O_NOFOLLOW``)."""
    flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0)
    try:
        return os.open(lock, flags | getattr(os, "O_CLOEXEC", 0), 0o644)
    except OSError as exc:
        if os.path.islink(lock):
            raise _symlink_error(path, lock) from None
        if os.path.isdir(lock):
            raise _lock_error(path, lock, "is a directory") from None
        raise _lock_error(
            path, lock, f"cannot be opened ({exc.strerror or exc}; another user's?)"
        ) from None


def _names(fd: int, lock: str) -> bool:
    """Whether the path ``lock`` still names the file open as ``fd``."""
    try:
        return os.path.samestat(os.fstat(fd), os.stat(lock, follow_symlinks=False))
    except OSError:
        return False


@contextlib.contextmanager
def writer_lock(path: str):
    """Holds ``path``'s lock file for the duration of a run: one writer at a time.

    Two runs on one checkpoint would write their chunks into the same folder and
    mix them; the second is refused before any work. The lock is an exclusive
    ``flock`` on ``path + ".lock"``, opened without following a symbolic link
    (``O_NOFOLLOW``: nothing is created out of the checkpoint's folder), and
    removed when the run ends (also by an error), while still held: a run that
    opened the file meanwhile finds it gone and takes a new one. A lock left by a
    process that died is held by nobody and is taken over. Only the writing
    process (process 0 of several) takes it. Where ``fcntl`` is missing (Windows)
    nothing is locked.

    Args:
      path: the checked checkpoint path.

    Yields:
      None, while the lock is held.

    Raises:
      ValueError: another run holds the lock, or the lock path is a symbolic
        link, a directory or a file that cannot be opened (naming it).
    """
    if fcntl is None or not is_writer():
        yield
        return
    lock = path + ".lock"
    for _ in range(100):
        fd = _open_lock(path, lock)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise ValueError(
                f"checkpoint_path {path!r} is in use by another run (it holds "
                f"{lock!r}): two runs on one checkpoint would mix their chunks. Wait "
                "for it to finish, or give this run another path."
            ) from None
        if _names(fd, lock):
            break
        os.close(fd)  # removed by the run that held it: take the new file
    else:
        raise ValueError(
            f"checkpoint_path {path!r}: its lock file {lock!r} is removed as fast as "
            "it is taken (other runs on this path?); give this run another path."
        )
    try:
        yield
    finally:
        if _names(fd, lock):  # the file this run holds, nobody else's
            with contextlib.suppress(OSError):
                os.remove(lock)
        os.close(fd)  # releases the lock


def _write_npz(path: str, arrays: dict) -> None:
    # a name of this writer's own: another process's file is never overwritten
    tmp = f"{path}.{os.getpid()}.{uuid.uuid4().hex}.tmp"
    with open(tmp, "wb") as fh:  # a file object: np.savez adds no ".npz" suffix
        np.savez(fh, **arrays)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)  # atomic: a crash never leaves a half-written file


def _leaves(prefix: str, tree: Any) -> dict:
    return {
        f"{prefix}{i}": np.asarray(x)
        for i, x in enumerate(jax.tree_util.tree_leaves(fetch(tree)))
    }


def save(
    path: str,
    *,
    identity: dict,
    step: int,
    state: Any,
    moments: Any,
    new_chunks: list,
    num_chunks: int,
    diverged_at: int,
    online: Any = None,
    new_watches: list | None = None,
) -> None:
    """Writes the chunks finished since the last save, then the header and carry.

    The header counts the chunks. With several processes (``jax.distributed``)
    every process calls it (the arrays are gathered, a collective) and process 0
    alone writes; a resume reads the file on every process, so ``path`` must be on
    a file system they share.

    Args:
      path: the checkpoint file.
      identity: the run's :func:`run_identity`.
      step: the steps done.
      state: the sampler state after ``step`` steps.
      moments: the streaming moments, or None.
      new_chunks: ``(kept, infos)`` pytrees of the chunks not yet on disk; they
        become files ``num_chunks - len(new_chunks) .. num_chunks - 1``.
      num_chunks: the chunk files valid after this save.
      diverged_at: the first diverging step, or -1.
      online: the online diagnostics' accumulators, or None.
      new_watches: the new chunks' watches ``(frozen or None, flag counts)`` (None
        for a chunk without one), or None.
    """
    first = num_chunks - len(new_chunks)
    if new_watches is None:
        new_watches = [None] * len(new_chunks)
    chunks = [
        (
            {**_leaves("info_", infos), **_watch_arrays(watch)},
            None if kept is None else _leaves("kept_", kept),
        )
        for (kept, infos), watch in zip(new_chunks, new_watches, strict=True)
    ]
    header = dict(
        format=FORMAT,
        identity=identity,
        step=int(step),
        num_chunks=int(num_chunks),
        diverged_at=int(diverged_at),
    )
    arrays = {"header": np.frombuffer(json.dumps(header).encode(), np.uint8)}
    arrays.update(_leaves("state_", state))
    if moments is not None:
        arrays.update(_leaves("moments_", tuple(moments)))
    if online is not None:
        arrays.update(_leaves("online_", online))
    if not is_writer():
        return
    folder = chunk_dir(path)
    os.makedirs(folder, exist_ok=True)
    for k, (info_arrays, kept_arrays) in enumerate(chunks, start=first):
        _write_npz(
            os.path.join(folder, f"{k:06d}.npz"), {**info_arrays, **(kept_arrays or {})}
        )
    _write_npz(path, arrays)


def _watch_arrays(watch: Any) -> dict:
    """A chunk's watch as arrays: ``watch`` (a marker), ``watch_frozen`` (when the
    state has a position), ``watch_count_0 ..``."""
    if watch is None:
        return {}
    frozen, counts = watch
    out = {"watch": np.asarray(True)}
    if frozen is not None:
        out["watch_frozen"] = np.asarray(fetch(frozen))
    out.update(_leaves("watch_count_", list(counts)))
    return out


def _read_npz(path: str, what: str, checkpoint_path: str) -> dict:
    try:
        with np.load(path, allow_pickle=False) as data:
            return {k: data[k] for k in data.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, KeyError) as exc:
        raise ValueError(
            f"checkpoint_path {checkpoint_path!r}: {what} {path!r} is not a readable "
            "cenlmc_jax checkpoint (truncated, empty or another kind of file: "
            f"{type(exc).__name__}: {exc})."
        ) from exc


def _numbered(data: dict, prefix: str, path: str, where: str) -> list:
    """The arrays ``prefix0, prefix1, ...`` of ``data`` in order (``ValueError`` if the
    numbering has holes).
    """
    keys = [k for k in data if k.startswith(prefix)]
    numbers = sorted(int(k[len(prefix) :]) for k in keys if k[len(prefix) :].isdigit())
    if numbers != list(range(len(keys))):
        raise _bad(
            path,
            where,
            f"holds the arrays {sorted(keys)}: {prefix}0..{prefix}{len(keys) - 1} "
            "expected",
        )
    return [data[f"{prefix}{i}"] for i in numbers]


def _bad(path: str, field: str, what: str) -> ValueError:
    return ValueError(
        f"checkpoint_path {path!r}: the header's {field} {what}; the file is damaged "
        "or was not written by cenlmc_jax (delete it to start over)."
    )


def _header_int(path: str, header: dict, field: str, minimum: int) -> int:
    value = header.get(field)
    if type(value) is not int:  # JSON: no bools, no floats, no strings here
        raise _bad(path, field, f"must be an integer; got {value!r}")
    if value < minimum:
        raise _bad(path, field, f"must be >= {minimum}; got {value}")
    return value


def _check_header(path: str, header: Any) -> dict:
    """Types and ranges of every header field (``ValueError`` naming the file and the
    field).
    """
    if not isinstance(header, dict):
        raise _bad(
            path, "header", f"must be a JSON object; got {type(header).__name__}"
        )
    if header.get("format") not in (FORMAT, FORMAT_1):
        raise ValueError(
            f"checkpoint_path {path!r} is not a cenlmc_jax checkpoint (no {FORMAT} "
            "header)."
        )
    identity = header.get("identity")
    if not isinstance(identity, dict) or not all(
        isinstance(k, str) and (v is None or isinstance(v, str) or type(v) is int)
        for k, v in identity.items()
    ):
        raise _bad(path, "identity", "must be an object of strings and integers")
    step = _header_int(path, header, "step", 0)
    num_chunks = _header_int(path, header, "num_chunks", 0)
    diverged_at = _header_int(path, header, "diverged_at", -1)
    if (step > 0) != (num_chunks > 0):
        raise _bad(
            path,
            "num_chunks",
            f"is {num_chunks} for step {step} (every step run is in a chunk file)",
        )
    if num_chunks > step + 1:
        raise _bad(
            path,
            "num_chunks",
            f"is {num_chunks}, more than the {step} steps run could fill",
        )
    if diverged_at > step:
        raise _bad(
            path, "diverged_at", f"is {diverged_at}, after the step reached ({step})"
        )
    return header


def _length(path: str, arrays: list, what: str, k: int) -> int | None:
    """The common leading length of ``arrays`` (chunk ``k``'s infos or kept draws), None
    without arrays.
    """
    lengths = {a.shape[0] if a.ndim else None for a in arrays}
    if None in lengths or len(lengths) > 1 or (lengths and min(lengths) < 1):
        raise _bad(
            path,
            f"chunk {k}",
            f"has {what} arrays of leading lengths {sorted(map(str, lengths))}: one "
            "length >= 1 expected",
        )
    return lengths.pop() if lengths else None


def load(path: str) -> Checkpoint:
    """Reads a checkpoint written by :func:`save`.

    Every header field is checked (types, ranges) and against the arrays: the
    chunks' info arrays must count ``step`` steps (``step + 1`` when the run
    stopped at its divergence, whose info is kept), every array of a chunk the
    same number of steps, and the moments three arrays ``(count, mean, m2)``.
    The run-dependent checks (shapes against this run's state and infos) are
    :func:`check_against_run`'s.

    Args:
      path: the checkpoint file.

    Returns:
      A :class:`Checkpoint`.

    Raises:
      ValueError: naming ``path``, when it is not a checkpoint (truncated, empty,
        another format, a header that disagrees with itself or its arrays).
    """
    data = _read_npz(path, "the file", path)
    try:
        header = json.loads(bytes(data["header"]).decode())
    except (KeyError, ValueError, UnicodeDecodeError, AttributeError, TypeError):
        raise ValueError(
            f"checkpoint_path {path!r} is not a cenlmc_jax checkpoint (no {FORMAT} "
            "header)."
        ) from None
    except RecursionError:
        raise _bad(path, "header", "is nested too deeply to be read") from None
    header = _check_header(path, header)
    chunks, watches, total = [], [], 0
    for k in range(header["num_chunks"]):
        c = _read_npz(
            os.path.join(chunk_dir(path), f"{k:06d}.npz"), "the chunk file", path
        )
        watches.append(
            (c.get("watch_frozen"), _numbered(c, "watch_count_", path, f"chunk {k}"))
            if "watch" in c
            else None
        )
        kept = _numbered(c, "kept_", path, f"chunk {k}") or None
        infos = _numbered(c, "info_", path, f"chunk {k}")
        n = _length(path, infos, "info", k)
        n_kept = _length(path, kept or [], "kept", k)
        if n is None and n_kept is None:
            raise _bad(path, f"chunk {k}", "holds no arrays")
        total += n if n is not None else n_kept
        chunks.append((kept, infos))
    step, diverged_at = header["step"], header["diverged_at"]
    stopped = (
        diverged_at >= 0 and diverged_at == step and total == step + 1
    )  # the diverging step's info kept
    if chunks and total != step and not stopped and all(i for _, i in chunks):
        raise _bad(
            path,
            "step",
            f"is {step}, but the chunk files hold the infos of {total} steps",
        )
    moments = _numbered(data, "moments_", path, "moments") or None
    if moments is not None:
        shapes = [m.shape for m in moments]
        if (
            len(moments) != 3
            or shapes[0] != ()
            or len(shapes[1]) != 1
            or shapes[1] != shapes[2]
        ):
            raise _bad(
                path,
                "moments",
                f"must be (count: (), mean: (d,), m2: (d,)); got shapes {shapes}",
            )
    online = _numbered(data, "online_", path, "online accumulators") or None
    if online is not None and moments is None:
        raise _bad(path, "online accumulators", "are present without the moments")
    state = _numbered(data, "state_", path, "state")
    for leaf in state:
        if np.issubdtype(leaf.dtype, np.inexact) and not np.all(np.isfinite(leaf)):
            raise ValueError(
                f"checkpoint_path {path!r}: the saved state holds NaN or infinite "
                "values, and a run cannot go on from it (the run diverged with "
                "on_divergence='warn', or the file was altered); delete it to start "
                "over."
            )
    return Checkpoint(
        header,
        state,
        None if moments is None else tuple(moments),
        chunks,
        online,
        watches,
    )


def _same_arrays(path: str, field: str, arrays: list, expected: list) -> None:
    """``arrays`` (one per leaf, leading step axis dropped if ``expected`` says so)
    match ``expected`` shapes/dtypes.
    """
    if len(arrays) != len(expected):
        raise _bad(
            path, field, f"holds {len(arrays)} arrays; this run's has {len(expected)}"
        )
    for i, (a, e) in enumerate(zip(arrays, expected, strict=True)):
        if tuple(a.shape) != tuple(e.shape) or np.dtype(a.dtype) != np.dtype(e.dtype):
            raise _bad(
                path,
                field,
                f"array {i} has shape {tuple(a.shape)}, dtype {a.dtype}; this run's "
                f"has shape {tuple(e.shape)}, dtype {np.dtype(e.dtype)}",
            )


def check_against_run(
    path: str,
    ck: Checkpoint,
    *,
    state: list,
    info: list,
    kept: list,
    burn_in: int,
    total: int,
    thin: int,
    mode: str,
    trace_dim: int | None,
    online: list | None = None,
) -> None:
    """The checkpoint of this very run (identity already matched) must fit it:
    ``ValueError`` naming the field.

    ``state``: this run's state leaves (shape, dtype); ``info`` / ``kept``: one step's
    info leaves and one kept ``trace_fn`` value (shape, dtype); ``trace_dim``: the
    moments' ``d`` (stream mode); ``online``: this run's fresh online accumulators'
    leaves (stream mode; the last is the run's plan, whose values must match).

    A streamed run's file of :data:`FORMAT_1` (no accumulators) that kept draws is
    refused: resumed, its R-hat, ESS and step-size bias checks could not be made, and
    its verdict would depend on where the run was cut.
    """
    step = ck.header["step"]
    if step > total:
        raise _bad(path, "step", f"is {step}, beyond this run's {total} steps")
    _same_arrays(path, "state", ck.state_leaves, state)
    if (ck.moments is not None) != (mode == "stream"):
        raise _bad(
            path,
            "moments",
            f"are {'present' if ck.moments is not None else 'absent'} for mode "
            f"{mode!r}",
        )
    if ck.moments is not None and ck.moments[1].shape != (trace_dim,):
        raise _bad(
            path,
            "moments",
            f"have shape {ck.moments[1].shape}; this run's trace has d = {trace_dim}",
        )
    _check_online(path, ck, mode, online)
    start = 0
    for k, (kept_k, info_k) in enumerate(ck.chunks):
        n = info_k[0].shape[0] if info_k else None
        if n is None:
            raise _bad(path, f"chunk {k}", "holds no info arrays")
        _same_arrays(path, f"chunk {k} info", [a[0] for a in info_k], info)
        burning = start < burn_in
        if burning and start + n > burn_in:
            raise _bad(
                path,
                f"chunk {k}",
                f"runs steps {start}..{start + n - 1} across the end of the burn-in "
                f"({burn_in})",
            )
        last = (
            k == len(ck.chunks) - 1
            and ck.header["diverged_at"] == step
            and start + n == step + 1
        )
        expect = (
            None if burning or mode != "trace" else (n - (1 if last else 0)) // thin
        )
        got = None if kept_k is None else kept_k[0].shape[0]
        if expect is not None and expect == 0 and got is None:
            pass  # a replay shorter than thin keeps nothing
        elif got != expect:
            raise _bad(
                path,
                f"chunk {k}",
                f"holds {got} kept draws for {n} steps; this run keeps {expect}",
            )
        if kept_k is not None:
            _same_arrays(path, f"chunk {k} kept", [a[0] for a in kept_k], kept)
        start += n


def _check_online(path: str, ck: Checkpoint, mode: str, online: list | None) -> None:
    """The saved online accumulators fit this run (see :func:`check_against_run`)."""
    if mode != "stream":
        if ck.online is not None:
            raise _bad(path, "online accumulators", f"are present for mode {mode!r}")
        return
    if ck.online is None:
        if not float(ck.moments[0]) > 0:
            return  # nothing kept yet: the accumulators start afresh
        if ck.header["format"] == FORMAT_1:
            raise ValueError(
                f"checkpoint_path {path!r} was written by an older cenlmc_jax "
                f"({FORMAT_1}), which did not save a streamed run's online "
                "accumulators: resumed, the run could not check its split R-hat, "
                "ESS or step-size bias, and its verdict would depend on where it was "
                "cut. Finish it with the version that wrote it, or delete the file to "
                "start over."
            )
        raise _bad(path, "online accumulators", "are absent for mode 'stream'")
    if online is None:
        return
    _same_arrays(path, "online accumulators", ck.online, online)
    if not np.array_equal(ck.online[-1], np.asarray(online[-1])):
        raise _bad(
            path,
            "online accumulators",
            f"have the plan {ck.online[-1].tolist()}; this run's is "
            f"{np.asarray(online[-1]).tolist()}",
        )
    rows = online[1].shape[1]  # half_mean: (2, chains, 2d)
    # the moments' count is a float (rounded beyond 2**24 in float32)
    if not np.isclose(float(ck.online[0]) * rows, float(ck.moments[0]), rtol=1e-3):
        raise _bad(
            path,
            "online accumulators",
            f"count {int(ck.online[0])} draws of {rows} chains, but the moments "
            f"count {float(ck.moments[0]):g} values",
        )


def check_identity(path: str, stored: dict, current: dict) -> None:
    """``ValueError`` naming the file and the first field where the two runs differ."""
    for field, value in current.items():
        if stored.get(field) != value:
            raise ValueError(
                f"checkpoint_path {path!r} belongs to a different run: {field} differs "
                f"(checkpoint: {stored.get(field)!r}; this call: {value!r}). Use "
                "another path, or delete the file to start over."
            )
