"""The researcher's workflow (``workflow.py``) replayed in a fresh Python process, on whatever
transformer-lens this environment has. CI runs it in a venv installed as the README says (3.9) and in an
unpinned one (``pip install -e .``: 4.x today); see ``.ci/run``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

WORKFLOW = Path(__file__).with_name("workflow.py")


@pytest.mark.acceptance
@pytest.mark.bridge
def test_notebook_workflow_in_a_fresh_process(tmp_path):
    """Import TL first, then the plugin; tiny GQA and MHA models on every TL class; report with controls
    against dense float64; to_tensor; every hook kind in run_with_hooks; save/load; CLI --json; the zoo model."""
    from conftest import unavailable

    try:
        import tl_idempotence as tli

        tli.models.checkpoint_dir("smollm2-135m", progress=False)
    except Exception as e:  # the zoo cannot provide the real model here
        unavailable("zoo model 'smollm2-135m'", e)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    r = subprocess.run(
        [sys.executable, str(WORKFLOW), "--zoo", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    out = r.stdout + r.stderr[-4000:]
    assert r.returncode == 0 and "WORKFLOW OK" in r.stdout, out
    # every step reported itself
    for step in (
        "idempotence_report on",
        "hook_v points",
        "zeroing hook_v",
        "hook_result refused",
        "keeps the user's file",
        "save/load_roles gives the same tables",
        "CLI report gqa",
        "13 closed heads",
        "--processing tl --json: exit 0",
    ):
        assert step in r.stdout, f"missing step {step!r}:\n{out}"
