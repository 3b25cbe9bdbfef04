"""The docs as tests: every ```python block of README.md and docs/*.md runs (sybil), in the integration tier.

The hooks and the fixture live here (linted with the tests); ``conftest.py`` at the repository root imports
them, because pytest asks the conftests above a file whether to collect it and README.md is at the root.

Each file's blocks run in order in one namespace (a later block uses what an earlier one defined), in a
fresh temporary working folder (what the blocks write, ``report.html``, ``smollm2_report/``, stays out of
the checkout); the namespace is a script's (``__name__ == "__main__"``), so a block's
``if __name__ == "__main__":`` body runs. Every python block checks what it shows (:func:`unchecked_blocks`,
tests/unit/test_doc_blocks.py): a ``>>>`` block is a doctest whose printed lines are compared with what the
code prints (ELLIPSIS, NORMALIZE_WHITESPACE, and sybil's NUMBER: a float agrees to within one unit of the
last digit the page shows), another block asserts. Blocks that cannot run on a CI machine (a GPU, a SLURM
or Kubernetes cluster, the Hugging Face hub, minutes of work) carry ``<!-- skip: next "why" -->`` in the
markdown; under ``CI=1`` such a skip fails unless its reason is one tests/ci_skips.py allows (the one rule for
every skip, ``CI_ALLOWED_SKIPS``: :func:`pytest_runtest_makereport`). A page prepares what its blocks need
(tiny checkpoints) in ``<!-- invisible-code-block: python -->`` comments, which run but are not shown;
sh/console blocks are not Python and are not run.

The blocks load the real zoo model (smollm2-135m): they are integration tests, marked ``integration``; the
README's quick command (``pytest -q tests/unit``) does not name them, ``-m "not slow and not integration"``
deselects them, and CI's integration stage names them by path (``pytest -q -m "not slow" tests/integration
tests/acceptance README.md docs``). Only these files are parsed (``DOC_FILES``; ``tests/data/**/README.md`` is
data, not docs).
"""

from __future__ import annotations

import doctest
import os
import re
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest
from sybil import Sybil
from sybil.evaluators.doctest import NUMBER
from sybil.integration.pytest import SybilFile, SybilItem
from sybil.parsers.markdown import PythonCodeBlockParser, SkipParser

from ci_skips import fail_unnamed_skip

ROOT = Path(__file__).resolve().parents[1]
#: The markdown files whose python blocks are tests.
DOC_FILES = frozenset([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])


@pytest.fixture(scope="module")  # module scope: one per markdown file (sybil's file collector)
def doc_workdir(tmp_path_factory: pytest.TempPathFactory):
    """A fresh working folder for one markdown file's blocks (what they write goes there)."""
    folder = tmp_path_factory.mktemp("doc")
    old = os.getcwd()
    os.chdir(folder)
    try:
        yield folder
    finally:
        os.chdir(old)


#: How a ``>>>`` block's shown output is compared with what its code prints.
DOCTEST_FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE | NUMBER


def _as_script(namespace: dict) -> None:
    """A page runs as a script: its ``if __name__ == "__main__":`` bodies run (exec's default would be
    ``builtins``, and such a body would silently do nothing)."""
    namespace["__name__"] = "__main__"


#: What reads the docs: ```python blocks (``>>>`` ones as doctests), ``<!-- invisible-code-block: python -->``
#: comments and ``<!-- skip: next "why" -->`` comments (other blocks are text).
SYBIL = Sybil(
    parsers=[PythonCodeBlockParser(doctest_optionflags=DOCTEST_FLAGS), SkipParser()],
    path=str(ROOT),
    patterns=["*.md"],
    fixtures=["doc_workdir"],
    setup=_as_script,
)

_FENCE = re.compile(r"^```(\S*)\s*$")
_SKIP = re.compile(r'^<!--\s*skip:\s*next\s+"[^"]{10,}"\s*-->\s*$')
_ASSERT = re.compile(r"^\s*assert\b", re.M)


def unchecked_blocks(text: str) -> list[tuple[int, str]]:
    """The ```python blocks of a markdown page that check nothing: ``(line, why)`` for each.

    A block checks what it shows when it is a ``>>>`` session with at least one expected-output line (a
    doctest: sybil compares it with what the code prints) or holds an ``assert``; otherwise the line right
    above its fence must be a ``<!-- skip: next "why" -->`` comment with a reason. A skip comment above a
    ``>>>`` block is refused too: sybil would skip only its first statement and run the rest.
    """
    lines = text.splitlines()
    found: list[tuple[int, str]] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        start, lang = i, m.group(1)
        i += 1
        while i < len(lines) and lines[i].rstrip() != "```":
            i += 1
        body = lines[start + 1 : i]
        i += 1
        if lang != "python":
            continue
        skipped = start > 0 and _SKIP.match(lines[start - 1]) is not None
        session = bool(body) and body[0].startswith(">>>")
        shown = any(line.strip() and not line.startswith((">>>", "...")) for line in body[1:])
        if skipped and session:
            found.append((start + 1, "a skip comment above a >>> block skips only its first statement"))
        elif skipped:
            continue
        elif session and not shown:
            found.append((start + 1, "a >>> block that shows no output checks nothing"))
        elif not session and not _ASSERT.search("\n".join(body)):
            found.append((start + 1, "neither a >>> session with its output, nor an assert, nor a skip reason"))
    return found


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    """Sybil's collector for the files of :data:`DOC_FILES`, nothing else (the list decides, not sybil's patterns:
    tests/integration/test_ci_skips.py replays the hooks on a page of its own)."""
    if file_path.resolve() in DOC_FILES:
        return SybilFile.from_parent(parent, path=file_path, sybils=[SYBIL])
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The doc blocks are integration tests (the real zoo model, tens of seconds)."""
    for item in items:
        if isinstance(item, SybilItem):
            item.add_marker(pytest.mark.integration)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Generator[None, Any, None]:
    """A doc block skipped by its ``<!-- skip: next "why" -->`` comment, under ``CI``: a failure unless the reason is
    one tests/ci_skips.py allows (:func:`ci_skips.fail_unnamed_skip`, the rule of every pytest skip too)."""
    outcome = yield
    if isinstance(item, SybilItem):
        fail_unnamed_skip(outcome.get_result(), doc_block=True)
