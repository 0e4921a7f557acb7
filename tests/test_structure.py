"""The package's layering, checked on the source (ast), not by convention.

* No module of ``cenlmc_jax`` imports, directly or through others, a module
  that imports it back (the import graph between submodules is acyclic).
* No module imports another module's underscore names. Private *modules*
  (``_validation``, ``_linalg``) hold the pieces several modules share, one
  floor below them; their names are public within the package.
* No ``cenlmc_jax`` import hides inside a function (a lazy import is how a
  cycle is usually dodged).
"""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "cenlmc_jax"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def imports(path: Path):
    """(module, names taken, lineno, in a function?) of every cenlmc_jax import."""
    tree = ast.parse(path.read_text())
    parents = {}
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            parents[child] = node

    def in_function(node):
        while node in parents:
            node = parents[node]
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                return True
        return False

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("cenlmc_jax"):
                    yield alias.name, [], node.lineno, in_function(node)
        elif (
            isinstance(node, ast.ImportFrom)
            and node.module
            and node.module.startswith("cenlmc_jax")
        ):
            names = [a.name for a in node.names]
            # `from cenlmc_jax import x`: x may be a submodule
            subs = [
                f"{node.module}.{n}" for n in names if f"{node.module}.{n}" in MODULES
            ]
            if subs:
                for sub in subs:
                    yield sub, [], node.lineno, in_function(node)
                names = [n for n in names if f"{node.module}.{n}" not in MODULES]
            if names:
                yield node.module, names, node.lineno, in_function(node)


def graph():
    return {
        name: {target for target, *_ in imports(path) if target != name}
        for name, path in MODULES.items()
    }


def test_import_graph_has_no_cycle():
    edges = graph()
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt not in MODULES:
                continue
            if state.get(nxt) == "open":
                cycle = stack[stack.index(nxt) :] + [nxt]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = "done"

    for name in sorted(MODULES):
        if name not in state:
            visit(name)


def test_no_module_imports_another_modules_underscore_names():
    bad = []
    for _name, path in MODULES.items():
        for target, names, lineno, _ in imports(path):
            bad += [
                f"{path.name}:{lineno} imports {n} from {target}"
                for n in names
                if n.startswith("_")
            ]
    assert not bad, bad


def test_no_lazy_imports_of_the_package():
    bad = [
        f"{path.name}:{lineno} imports {target} inside a function"
        for name, path in MODULES.items()
        for target, _, lineno, inner in imports(path)
        if inner
    ]
    assert not bad, bad


def test_the_layers_point_down():
    # the bottom floors import nothing of the samplers above them
    edges = graph()
    # (_host: pulling results to the host, itself importing nothing of the package)
    floor = ("cenlmc_jax._validation", "cenlmc_jax.types", "cenlmc_jax._host")
    assert not edges["cenlmc_jax._host"] & set(MODULES)
    for low in (
        "cenlmc_jax._validation",
        "cenlmc_jax.types",
        "cenlmc_jax.base",
        "cenlmc_jax._linalg",
    ):
        above = {t for t in edges[low] if t not in floor}
        assert not above, (low, above)
    # the pair-force backends import only the floors below them: the algebra and
    # the block sparsity built on it; the sparsity imports at most the algebra,
    # and the algebra nothing of pairwise (the lower floors never import a backend)
    algebra, sparsity = "cenlmc_jax.pairwise.algebra", "cenlmc_jax.pairwise.sparsity"
    floors = {algebra: set(), sparsity: {algebra}}
    assert set(floors) <= set(MODULES)
    backends = [
        n for n in MODULES if n.startswith("cenlmc_jax.pairwise.") and n not in floors
    ]
    assert backends
    # ... and the Pallas kernel the XLA tiles, which take a call whose per-row-block
    # tile lists overflow (one shared list; the tiles import no Pallas)
    extra = {"cenlmc_jax.pairwise.pallas": {"cenlmc_jax.pairwise.tiled"}}
    for name in backends:
        inside = {t for t in edges[name] if t.startswith("cenlmc_jax.pairwise")}
        assert inside <= set(floors) | extra.get(name, set()), (name, inside)
    for name, allowed in floors.items():
        inside = {t for t in edges[name] if t.startswith("cenlmc_jax.pairwise")}
        assert inside <= allowed, (name, inside)


def test_the_test_tree_mirrors_the_package():
    # tests/<namespace>/ holds the tests of cenlmc_jax/<namespace>/; cross-cutting tests
    # (the sampler tables, the driver, the layout) stay at the top of tests/
    tests = PACKAGE.parent / "tests"
    folders = {
        p.name
        for p in tests.iterdir()
        if p.is_dir() and not p.name.startswith((".", "_"))
    }
    packages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    assert folders <= packages, folders - packages
    assert packages - folders <= set(), packages - folders
