"""A sweep's collect step (a fresh process) on an edited stored summary; the store's hostile-input unit tests are
tests/unit/report/test_store_hostile.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from helpers import llama_like, rewrite_record
from tl_idempotence.report.store import RECORD


@pytest.mark.integration
def test_sweep_collect_reports_an_edited_summary_as_missing_with_the_field(tmp_path):
    """The CLI as a user runs it: one array task saves a report, an edit with the digest recomputed, then
    ``--collect`` names the item without a report, the field and both values (exit 1)."""
    ck = llama_like(tmp_path / "ckA")[0]
    out = tmp_path / "out"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    for k in ("SLURM_ARRAY_TASK_ID", "PBS_ARRAY_INDEX", "PBS_ARRAYID", "LSB_JOBINDEX", "SGE_TASK_ID"):
        env.pop(k, None)
    cli = [sys.executable, "-m", "tl_idempotence.cli", "sweep", str(ck), "--out", str(out), "--quiet"]
    first = subprocess.run([*cli, "--task-index", "0"], capture_output=True, text=True, env=env, timeout=600)
    assert first.returncode == 0, first.stderr
    [record] = [p for p in out.rglob(RECORD)]
    s = json.loads(record.read_text())["summary"]
    n_closed, per_layer = s["n_closed"], s["closed_per_layer"]["__int_keys__"]
    # a consistent forgery (the counts add up, and stay within the heads of the layer, which from_dict bounds):
    # only the recomputation from the tables can refuse it
    layer = next(i for i, (_lay, k) in enumerate(per_layer) if k < s["n_heads_per_layer"])
    per_layer[layer][1] += 1
    forged = {
        "n_closed": n_closed + 1,
        "frac_closed": (n_closed + 1) / s["n_heads"],
        "closed_per_layer": s["closed_per_layer"],
    }
    rewrite_record(record.parent, lambda r: r["summary"].update(forged))
    collect = subprocess.run([*cli, "--collect"], capture_output=True, text=True, env=env, timeout=600)
    said = collect.stdout + collect.stderr
    assert f"summary['n_closed'] is {n_closed + 1} in the record but {n_closed} from its tables" in said, said
    assert "1 item(s) have no report yet:" in said and "ckA: its saved report is unreadable (ReportFileError" in said
    assert collect.returncode == 1, collect.returncode  # not every item has a report
