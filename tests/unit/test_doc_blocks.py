"""The docs-as-tests machinery (tests/doc_blocks.py, conftest.py at the root): the python blocks of README.md and
docs/*.md are integration tests only, python blocks run and other blocks do not, a failing block fails, and
every skipped block says why."""

from __future__ import annotations

from pathlib import Path
from unittest import SkipTest

import pytest
from sybil.evaluators.skip import Skipper

from doc_blocks import DOC_FILES, SYBIL

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
