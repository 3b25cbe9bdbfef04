"""The docs-as-tests machinery (tests/doc_blocks.py, conftest.py at the root): the python blocks of README.md and
docs/*.md are integration tests only, python blocks run and other blocks do not, a failing block fails, and
every skipped block says why."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from unittest import SkipTest

import pytest
from sybil.evaluators.skip import Skipper

from doc_blocks import DOC_FILES, ROOT, SYBIL

DOC_DEMO = """# A page

```sh
exit 1
```

```python
x = 1
```

<!-- skip: next "needs a GPU" -->
```python
raise RuntimeError("never run")
```

```python
assert x == 2, "the docs are wrong"
```
"""


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
    assert n >= 20  # README.md and docs/*.md: python blocks and skip comments
    quick = _collect("-m", "not slow and not integration")  # the README's quick command
    assert f"no tests collected ({n} deselected)" in quick, quick
    integration = _collect("-m", "integration")
    ids = re.findall(r"^(\S+\.md)::line:(\d+),column:1$", integration, flags=re.M)
    assert len(ids) == n and {f for f, _ in ids} >= {"README.md", "docs/models.md", "docs/errors.md"}
    assert not any(f.startswith("tests/") for f, _ in ids)  # tests/data/**/README.md is data, not docs


def test_python_blocks_run_in_order_other_blocks_do_not_and_a_wrong_block_fails(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(DOC_DEMO, encoding="utf-8")
    examples = list(SYBIL.parse(page).examples())
    assert len(examples) == 4  # the python blocks and the skip comment; the sh block is text
    examples[0].evaluate()  # x = 1
    assert examples[0].namespace["x"] == 1
    examples[1].evaluate()  # the skip comment
    with pytest.raises(SkipTest, match="needs a GPU"):
        examples[2].evaluate()
    with pytest.raises(AssertionError, match="the docs are wrong"):
        examples[3].evaluate()  # sees x from the first block


def test_every_skipped_block_says_why():
    skips = []
    for path in sorted(DOC_FILES):
        for ex in SYBIL.parse(path).examples():
            if isinstance(ex.region.evaluator, Skipper):
                action, reason = ex.parsed
                skips.append((Path(path).name, ex.line, action, reason))
    assert skips, "no skip comments found"
    for name, line, action, reason in skips:
        assert action == "next", f"{name}:{line}: skip: {action} (use 'skip: next \"why\"', one block at a time)"
        assert reason and len(eval(reason)) > 10, f"{name}:{line}: a skip without its reason"
