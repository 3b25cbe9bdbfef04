"""Under ``CI=1`` a skip is a failure unless tests/conftest.py's ``CI_ALLOWED_SKIPS`` names it (issue 30):
replayed in a fresh pytest process on the probes below, which skip only when that process asks them to."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

PROBE = "TLI_CI_SKIP_PROBE"


@pytest.mark.parametrize("reason", ["Chromium is not installed", "needs CUDA"])
def test_probe(reason):
    if os.environ.get(PROBE) == reason:
        pytest.skip(reason)


def run_probe(reason: str, ci: bool) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env[PROBE] = reason
    if ci:
        env["CI"] = "1"
    node = f"{Path(__file__)}::test_probe[{reason}]"
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", node],
        capture_output=True,
        text=True,
        env=env,
        cwd=Path(__file__).resolve().parents[2],
        timeout=300,
    )


def test_an_unnamed_skip_fails_under_ci_and_skips_elsewhere():
    ci = run_probe("Chromium is not installed", ci=True)
    assert ci.returncode == 1, ci.stdout
    assert "1 failed" in ci.stdout and "skipped under CI=1" in ci.stdout, ci.stdout
    dev = run_probe("Chromium is not installed", ci=False)
    assert dev.returncode == 0 and "1 skipped" in dev.stdout, dev.stdout


def test_a_named_skip_stays_a_skip_under_ci():
    ci = run_probe("needs CUDA", ci=True)
    assert ci.returncode == 0 and "1 skipped" in ci.stdout, ci.stdout
