"""The notebooks' code cells run as written (a notebook that breaks is a bug)."""

import json
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_code_cells_run(path):
    cells = json.loads(path.read_text())["cells"]
    code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    namespace = {}
    exec(compile(code, str(path), "exec"), namespace)  # noqa: S102 - our own notebook
    assert "cj" in namespace
