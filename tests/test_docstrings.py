"""Every public function says what it takes and what it gives.

Google style, as the API pages render it.

Public: a function in the ``__all__`` of a module of ``cenlmc_jax`` (the top level, a
namespace or a module). It needs an ``Args:`` section when it takes parameters and a
``Returns:`` (or ``Yields:``) section unless it is annotated ``-> None``. The library's
comments and docstrings carry no measurements: those live in ``benchmarks/results/`` and
the docs' performance page, which cite the command that made them.
"""

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "cenlmc_jax"


def public_functions():
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text())
        names = set()
        for node in tree.body:
            if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
            ):
                names |= {
                    e.value for e in node.value.elts if isinstance(e, ast.Constant)
                }
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name in names:
                yield path.relative_to(PACKAGE.parent), node


def takes_parameters(fn: ast.FunctionDef) -> bool:
    a = fn.args
    return bool(a.posonlyargs or a.args or a.kwonlyargs or a.vararg or a.kwarg)


def returns_none(fn: ast.FunctionDef) -> bool:
    return isinstance(fn.returns, ast.Constant) and fn.returns.value is None


def test_every_public_function_has_args_and_returns():
    missing = []
    for path, fn in public_functions():
        doc = ast.get_docstring(fn) or ""
        if takes_parameters(fn) and not re.search(r"^\s*Args:\s*$", doc, re.M):
            missing.append(f"{path}:{fn.lineno} {fn.name}: no Args:")
        if not returns_none(fn) and not re.search(r"^\s*(Returns|Yields):", doc, re.M):
            missing.append(f"{path}:{fn.lineno} {fn.name}: no Returns:")
    assert not missing, f"{len(missing)} missing:\n" + "\n".join(missing)


#: A measurement: a duration, a speed-up or a memory figure written as a number with
#: its unit.
MEASUREMENT = re.compile(
    r"\b\d+(\.\d+)?\s?(ms|µs|us|ns|GiB|MiB|KiB|GB|MB|KB)\b"
    r"|\b\d+(\.\d+)?x (faster|slower)\b"
    r"|\bmeasured\b[^.\n]*\d"
)


def test_no_measurements_in_library_comments_or_docstrings():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if MEASUREMENT.search(line) and (
                '"""' in line
                or "#" in line
                or not line.strip().startswith(('f"', '"', "raise"))
            ):
                found.append(f"{path.relative_to(PACKAGE.parent)}:{i}: {line.strip()}")
    assert not found, f"{len(found)} lines:\n" + "\n".join(found)
