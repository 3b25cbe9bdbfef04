"""Under ``CI=1`` a skip is a failure unless tests/ci_skips.py's ``CI_ALLOWED_SKIPS`` names it — a test's skip, a
module's skip at collection and a README/docs block's ``<!-- skip: next "why" -->``: replayed in a fresh pytest
process on the probes below, which skip only when that process asks them to."""

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


MODULE_SKIP = """
import pytest

pytest.skip({reason!r}, allow_module_level=True)


def test_never_runs():
    raise AssertionError("the module was skipped")
"""

IMPORT_SKIP = """
import pytest

pytest.importorskip("tli_no_such_module_for_the_skip_probe")


def test_never_runs():
    raise AssertionError("the module was skipped")
"""


def run_module_probe(tmp_path: Path, source: str, ci: bool) -> subprocess.CompletedProcess:
    """A temporary test module outside the checkout, collected with tests/conftest.py loaded as a plugin (the
    hooks every test of tests/ gets), in a fresh pytest process with or without ``CI=1``."""
    (tmp_path / "test_module_probe.py").write_text(source)
    tests = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["PYTHONPATH"] = os.pathsep.join([str(tests), *filter(None, [env.get("PYTHONPATH")])])
    if ci:
        env["CI"] = "1"
    return subprocess.run(
        [
            *(sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "conftest"),
            *("--rootdir", str(tmp_path), "-c", str(tmp_path / "pytest.ini"), "test_module_probe.py"),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )


@pytest.mark.parametrize("source", [MODULE_SKIP.format(reason="Chromium is not installed"), IMPORT_SKIP])
def test_a_module_skipped_at_collection_fails_under_ci(tmp_path, source):
    """``pytest.skip(..., allow_module_level=True)`` or a module-level ``importorskip``: the module's collection
    is skipped; under CI=1 that is a failure like any unnamed skip, elsewhere a skip."""
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    ci = run_module_probe(tmp_path, source, ci=True)
    assert ci.returncode != 0, ci.stdout
    assert "skipped under CI=1" in ci.stdout and "1 error" in ci.stdout, ci.stdout
    dev = run_module_probe(tmp_path, source, ci=False)
    assert dev.returncode == 5 and "1 skipped" in dev.stdout, dev.stdout  # 5: the module collected no test


def test_a_named_module_skip_stays_a_skip_under_ci(tmp_path):
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    ci = run_module_probe(tmp_path, MODULE_SKIP.format(reason="needs CUDA"), ci=True)
    assert ci.returncode == 5 and "1 skipped" in ci.stdout, ci.stdout  # 5: the module collected no test


# ------------------------------------------------------------------ the docs' blocks: the same rule (tests/ci_skips.py)
DOC_PAGE = """# A page

<!-- skip: next "{reason}" -->
```python
raise RuntimeError("a skipped block ran")
```

```python
assert 1 + 1 == 2
```
"""


def run_doc_probe(tmp_path: Path, reason: str, ci: bool) -> subprocess.CompletedProcess:
    """A temporary markdown page collected by the repository's own root conftest.py (copied beside it, its list of
    doc files pointed at the page), in a fresh pytest process with or without ``CI=1``."""
    root = Path(__file__).resolve().parents[2]
    (tmp_path / "page.md").write_text(DOC_PAGE.format(reason=reason), encoding="utf-8")
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "conftest.py").write_text(
        (root / "conftest.py").read_text(encoding="utf-8")
        + "\nimport pathlib\n\nimport doc_blocks\n\n"
        + "doc_blocks.DOC_FILES = frozenset([pathlib.Path(__file__).resolve().parent / 'page.md'])\n",
        encoding="utf-8",
    )
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "PYTEST_ADDOPTS")}
    env["PYTHONPATH"] = os.pathsep.join([str(root / "tests"), *filter(None, [env.get("PYTHONPATH")])])
    if ci:
        env["CI"] = "1"
    return subprocess.run(
        [*(sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider"), "page.md"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )


def test_a_doc_block_skipped_without_an_allowed_reason_fails_under_ci_and_skips_elsewhere(tmp_path):
    reason = "the author could not be bothered to run it"
    ci = run_doc_probe(tmp_path, reason, ci=True)
    assert ci.returncode == 1, ci.stdout + ci.stderr
    assert "1 failed, 2 passed" in ci.stdout and "skipped under CI=1, which accepts only the skips" in ci.stdout
    assert reason in ci.stdout and "a skipped block ran" not in ci.stdout, ci.stdout
    dev = run_doc_probe(tmp_path, reason, ci=False)
    assert dev.returncode == 0 and "2 passed, 1 skipped" in dev.stdout, dev.stdout + dev.stderr


@pytest.mark.parametrize("reason", ["needs CUDA: device='cuda'", "needs a cluster (SLURM)", "long-running: minutes"])
def test_a_doc_block_skipped_with_an_allowed_reason_stays_a_skip_under_ci(tmp_path, reason):
    ci = run_doc_probe(tmp_path, reason, ci=True)
    assert ci.returncode == 0 and "2 passed, 1 skipped" in ci.stdout, ci.stdout + ci.stderr
