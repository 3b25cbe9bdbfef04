"""The result contract's record-field test with EVERY field of every stored type edited (the quick tier edits a
seeded sample of 24 per type: tests/unit/test_result_contract.py, ``QUICK_FIELDS``), in a fresh process as CI runs
it. About 20 CPU-s."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_record_field_of_every_stored_type_is_refused_when_edited():
    env = {**os.environ, "TLI_CONTRACT_FIELDS": "all"}
    test = "tests/unit/test_result_contract.py::test_every_record_field_edited_with_its_digest_recomputed_is_refused"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and "skipped" not in done.stdout.splitlines()[-1], done.stdout[-2000:]
