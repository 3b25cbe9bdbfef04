"""The docs' python blocks are collected in the integration tier only (a fresh pytest process collects them);
the docs-as-tests machinery's unit tests are tests/unit/test_doc_blocks.py."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from doc_blocks import DOC_FILES, ROOT, SYBIL


def _collect(*marker: str) -> str:
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
    cmd = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *marker]
    proc = subprocess.run(
        [*cmd, "README.md", "docs"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode in (0, 5), proc.stdout + proc.stderr
    return proc.stdout


def _n_examples() -> int:
    return sum(len(list(SYBIL.parse(path).examples())) for path in DOC_FILES)


def test_the_docs_blocks_are_collected_in_the_integration_tier_only():
    n = _n_examples()
    # README.md and docs/*.md: each >>> statement of a doctest block, the other python blocks (visible or
    # invisible) and the skip comments (88 when the doc blocks began checking their output)
    assert n >= 80
    quick = _collect("-m", "not slow and not integration")  # the unit tier's marks
    assert f"no tests collected ({n} deselected)" in quick, quick
    integration = _collect("-m", "integration")
    ids = re.findall(r"^(\S+\.md)::line:(\d+),column:1$", integration, flags=re.M)
    assert len(ids) == n
    assert {f for f, _ in ids} >= {"README.md", "docs/models.md", "docs/errors.md", "docs/sweeps.md"}
    assert not any(f.startswith("tests/") for f, _ in ids)  # tests/data/**/README.md is data, not docs
