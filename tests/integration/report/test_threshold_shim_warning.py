"""The deprecated ``rep.threshold = t`` warns at the user's line (CHANGELOG's deprecation policy), so Python's
default filters show it in a script: it was attributed to report/report.py (reached through ``__setattr__``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

import tl_idempotence as tli
from tl_idempotence.core.heads import LayerHeads, kv_layout

pytestmark = pytest.mark.bridge


def _rep():
    g = torch.Generator().manual_seed(0)
    V = torch.randn(2, 8, 2, generator=g, dtype=torch.float64)
    O = torch.randn(2, 8, 2, generator=g, dtype=torch.float64)
    return tli.idempotence_report([LayerHeads(0, O, V, kv_layout(2, 2))], progress=False)


def test_the_deprecation_warning_names_the_assignment_line():
    rep = _rep()
    with pytest.warns(DeprecationWarning, match="rep.with_threshold") as rec:
        rep.threshold = 0.5  # <- the line the warning must name
    (w,) = [w for w in rec if issubclass(w.category, DeprecationWarning)]
    assert Path(w.filename).resolve() == Path(__file__).resolve()
    assert "rep.threshold = 0.5  # <- the line" in Path(__file__).read_text("utf-8").splitlines()[w.lineno - 1]
    assert rep.threshold == 0.5


def test_a_script_under_default_filters_shows_it(tmp_path):
    script = tmp_path / "s.py"
    script.write_text(
        "import torch, tl_idempotence as tli\n"
        "from tl_idempotence.core.heads import LayerHeads, kv_layout\n"
        "V = torch.ones(1, 4, 1, dtype=torch.float64); O = torch.ones(1, 4, 1, dtype=torch.float64)\n"
        "rep = tli.idempotence_report([LayerHeads(0, O, V, kv_layout(1, 1))], progress=False)\n"
        "rep.threshold = 0.5\n"
    )
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "s.py:5: DeprecationWarning: Assigning rep.threshold is deprecated" in r.stderr
