"""The demo notebooks are stored without outputs (the demos run in tests/integration/test_demos.py)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="demo tests need the 'test' extra (nbformat, nbclient, ipykernel)")


DEMOS = Path(__file__).resolve().parents[2] / "demos"


#: notebook -> minimum number of plotly figures its execution must display
NOTEBOOKS = {
    "01_quickstart.ipynb": 1,
    "02_geometry.ipynb": 3,
    "03_algebra_activations.ipynb": 1,
    "04_trajectories.ipynb": 3,
}


def test_notebooks_stored_without_outputs():
    found = sorted(p.name for p in DEMOS.glob("*.ipynb"))
    assert found == sorted(NOTEBOOKS)
    for name in NOTEBOOKS:
        nb = nbformat.read(DEMOS / name, as_version=4)
        nbformat.validate(nb)
        code = [c for c in nb.cells if c.cell_type == "code"]
        assert code, name
        assert nb.cells[0].cell_type == "markdown", f"{name} should open with a title/explanation"
        for c in code:
            assert c.outputs == [] and c.execution_count is None, f"{name}: stored with outputs"
            ast.parse(c.source)  # plain Python, no magics: runs the same in any kernel
