"""The notebooks run as written, at their small size (a notebook that breaks, or whose
checks fail, is a bug).

Every notebook reads ``SIZE = os.environ.get("CENLMC_NOTEBOOK_SIZE", "full")``; here it
is ``"small"``. The code cells run in order in one namespace, in this process, the way
IPython
runs them: a cell whose last statement is an expression displays its value, so the
figures a notebook shows are drawn here too (rendered to PNG in memory by Agg). Each
notebook asserts its own checks in a code cell (exact values, quadrature references,
MCSE z-tests), so a notebook that runs but computes the wrong thing fails.

The saved files are checked as well: executed at full size with their outputs and
figures, no error outputs, under 2 MB, an install cell that does nothing where the
package is importable, and a word on GPU runtimes.
"""

import ast
import io
import json
from pathlib import Path

import matplotlib
import pytest
from matplotlib.figure import Figure

matplotlib.use("Agg")

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
MAX_BYTES = 2_000_000


def _cells(path, kind):
    return [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == kind]


def _source(cell):
    return "".join(cell["source"])


def run_notebook(path):
    """Run the code cells of ``path`` in order; returns (namespace, number of figures
    drawn)."""
    drawn = []

    def display(*objects, **kwargs):
        for obj in objects:
            if isinstance(obj, Figure):
                obj.savefig(
                    io.BytesIO(), format="png", dpi=40
                )  # draws every artist: plotting bugs surface here
                drawn.append(obj)

    namespace = {"__name__": "__main__", "display": display}
    for i, cell in enumerate(_cells(path, "code")):
        name = f"{path.name}, code cell {i}"
        tree = ast.parse(_source(cell), filename=name)
        last = (
            tree.body.pop()
            if tree.body and isinstance(tree.body[-1], ast.Expr)
            else None
        )
        exec(compile(tree, name, "exec"), namespace)  # noqa: S102 - our own notebook
        if last is not None:
            value = eval(compile(ast.Expression(last.value), name, "eval"), namespace)  # noqa: S307
            if value is not None:
                display(value)
    return namespace, len(drawn)


def test_there_are_notebooks():
    names = {p.stem for p in NOTEBOOKS}
    assert {
        "quickstart",
        "inverse_problem",
        "paper2_experiments",
        "sgmcmc_logistic",
        "differentiable",
        "online_lda",
        "eight_schools",
    } <= names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs_at_small_size(path, monkeypatch):
    monkeypatch.setenv("CENLMC_NOTEBOOK_SIZE", "small")
    namespace, figures = run_notebook(path)
    assert namespace["SIZE"] == "small"
    assert "cj" in namespace
    assert figures >= 2, f"{path.name} drew {figures} figures"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_opens_with_the_install_cell(path):
    first = _source(_cells(path, "code")[0])
    assert 'CENLMC_JAX_SOURCE = "cenlmc_jax"' in first
    tree = ast.parse(first)
    handlers = [
        h for node in ast.walk(tree) if isinstance(node, ast.Try) for h in node.handlers
    ]
    # try: import cenlmc_jax / except ImportError: pip install CENLMC_JAX_SOURCE
    assert any(
        isinstance(h.type, ast.Name) and h.type.id == "ImportError" for h in handlers
    )
    assert (
        "pip" in first and "CENLMC_JAX_SOURCE" in first.split("except ImportError")[1]
    )
    assert "%" not in first  # plain Python, so it also runs outside IPython
    markdown = "\n".join(_source(c) for c in _cells(path, "markdown"))
    assert "GPU runtime" in markdown and "jax[cuda12]" in markdown
    assert "CENLMC_NOTEBOOK_SIZE" in markdown


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_saved_notebook_has_its_full_size_outputs(path):
    assert path.stat().st_size < MAX_BYTES, (
        f"{path.name} is {path.stat().st_size:,} bytes"
    )
    code = _cells(path, "code")
    assert all(c.get("execution_count") for c in code), "every code cell was executed"
    outputs = [o for c in code for o in c.get("outputs", [])]
    assert not [o for o in outputs if o["output_type"] == "error"]
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(images) >= 2, f"{path.name} was saved with {len(images)} figures"
    text = "".join(
        "".join(o.get("text", "")) for o in outputs if o["output_type"] == "stream"
    )
    assert "size: full" in text, "saved from a run at full size"


def test_notebooks_readme_lists_every_notebook():
    readme = (ROOT / "notebooks" / "README.md").read_text()
    for path in NOTEBOOKS:
        assert path.name in readme
    assert "CENLMC_NOTEBOOK_SIZE=small" in readme and "nbconvert" in readme
