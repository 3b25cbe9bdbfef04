"""The docs-as-tests machinery (tests/doc_blocks.py, conftest.py at the root): the python blocks of README.md and
docs/*.md are integration tests only, python blocks run and other blocks do not, a failing block fails, a
``>>>`` block whose shown output differs from what its code prints fails, every python block checks what it
shows or carries a skip reason, and every skipped block says why."""

from __future__ import annotations

from pathlib import Path
from unittest import SkipTest

import pytest
from sybil.evaluators.skip import Skipper

from doc_blocks import DOC_FILES, ROOT, SYBIL, unchecked_blocks

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


DOCTEST_DEMO = """# A page

<!-- invisible-code-block: python
hidden = 0.953258
-->

```python
>>> hidden                 # the page shows 4 digits of a float: compared to those 4 (sybil's NUMBER)
0.9533
>>> list(range(12))
[0, 1, ..., 11]
>>> __name__               # a page runs as a script
'__main__'
```

```python
>>> hidden * 2             # 1.906516: off by 2 in the last digit shown
1.9063
```
"""


def test_a_doctest_block_checks_what_it_shows_to_the_digits_shown_and_fails_when_it_differs(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(DOCTEST_DEMO, encoding="utf-8")
    document = SYBIL.parse(page)
    SYBIL.setup(document.namespace)  # what sybil's pytest file collector does before a page's first block
    examples = list(document.examples())
    assert len(examples) == 5  # the invisible block, then one example per >>> statement
    for ex in examples[:4]:
        ex.evaluate()
    with pytest.raises(Exception, match=r"Expected:\s+1\.9063\s+Got:\s+1\.906516"):
        examples[4].evaluate()  # a number the code does not give fails


UNCHECKED_DEMO = """# A page

```python
x = 1                      # shows nothing, checks nothing
```

```python
>>> y = 2                  # a session without an output line checks nothing
```

<!-- skip: next "needs a GPU and a cluster" -->
```python
>>> z = 3                  # sybil would skip this line only
>>> z
3
```

<!-- skip: next "a signature, not a call" -->
```python
f(a, *, b=1)
```

```python
>>> 1 + 1
2
```

```python
assert 1 + 1 == 2
```

```sh
echo not python
```
"""


def test_unchecked_blocks_names_each_python_block_that_checks_nothing():
    assert unchecked_blocks(UNCHECKED_DEMO) == [
        (3, "neither a >>> session with its output, nor an assert, nor a skip reason"),
        (7, "a >>> block that shows no output checks nothing"),
        (12, "a skip comment above a >>> block skips only its first statement"),
    ]


def test_every_python_block_of_the_docs_checks_its_output_or_says_why_it_is_skipped():
    found = {
        f"{Path(path).relative_to(ROOT)}:{line}": why
        for path in sorted(DOC_FILES)
        for line, why in unchecked_blocks(Path(path).read_text(encoding="utf-8"))
    }
    assert not found, found


def test_only_the_blocks_that_cannot_run_here_are_skipped_and_the_sweep_page_runs_on_a_cluster():
    skipped: dict[str, int] = {}
    for path in DOC_FILES:
        for ex in SYBIL.parse(path).examples():
            if isinstance(ex.region.evaluator, Skipper):
                name = str(Path(path).relative_to(ROOT))
                skipped[name] = skipped.get(name, 0) + 1
    # README: the Hugging Face hub + a GPU, the 2-CPU-minute ablation; api.md and sweeps.md: a signature each;
    # models.md: re-downloading the wheel; sweeps.md: SLURM + dask-jobqueue, a Kubernetes scheduler
    assert skipped == {"README.md": 2, "docs/api.md": 1, "docs/models.md": 1, "docs/sweeps.md": 3}
    sweeps = (ROOT / "docs" / "sweeps.md").read_text(encoding="utf-8")
    assert sweeps.count("tli.sweep(items") >= 2 and "LocalCluster(n_workers=2" in sweeps
    assert "run_sweep_item(items" in sweeps and 'tli.load_sweep("DIR")' in sweeps  # a job array's folder
