"""The demo notebooks are stored without outputs (the demos run in tests/integration/test_demos.py)."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="demo tests need the 'test' extra (nbformat, nbclient, ipykernel)")


DEMOS = Path(__file__).resolve().parents[2] / "demos"


def _notebooks() -> dict[str, int]:
    """tests/integration/test_demos.py's ``NOTEBOOKS`` (notebook -> the plotly figures its run must show): one list."""
    path = Path(__file__).resolve().parent.parent / "integration" / "test_demos.py"
    spec = importlib.util.spec_from_file_location("integration_test_demos", path)
    assert spec is not None and spec.loader is not None, path
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.NOTEBOOKS


def test_notebooks_stored_without_outputs():
    NOTEBOOKS = _notebooks()
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
