"""A folder ``rep.save`` wrote, given where a model goes, is named as a saved report (it read as a checkpoint
without config.json, exit 1): the API raises OptionError, the CLI exits 2 saying to use tli.load_report."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import tl_idempotence as tli
from tl_idempotence.core.heads import LayerHeads, kv_layout
from tl_idempotence.errors import OptionError

pytestmark = pytest.mark.bridge


@pytest.fixture
def saved(tmp_path: Path) -> Path:
    g = torch.Generator().manual_seed(0)
    V = torch.randn(2, 8, 2, generator=g, dtype=torch.float64)
    rep = tli.idempotence_report([LayerHeads(0, V.clone(), V, kv_layout(2, 2))], progress=False)
    return Path(rep.save(tmp_path / "rep_saved"))


def test_the_library_names_a_saved_report_where_a_model_goes(saved):
    with pytest.raises(OptionError, match=r"holds a saved idempotence report .* tli\.load_report\(path\)"):
        tli.idempotence_report(str(saved), progress=False)
    assert tli.load_report(saved).summary["n_heads"] == 2  # and it still loads as what it is


def test_the_cli_exits_2_and_says_what_the_folder_is(saved):
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(Path(tli.__file__).parents[1]), os.environ.get("PYTHONPATH", "")]),
    }
    r = subprocess.run(
        [sys.executable, "-m", "tl_idempotence.cli", "report", str(saved), "--out", str(saved.parent / "r.html")],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert r.returncode == 2, r.stderr
    assert "holds a saved idempotence report" in r.stderr and "tli.load_report" in r.stderr
