"""The docs as tests: every ```python block of README.md and docs/*.md runs (sybil), in the integration tier.

The hooks and the fixture live here (linted with the tests); ``conftest.py`` at the repository root imports
them, because pytest asks the conftests above a file whether to collect it and README.md is at the root.

Each file's blocks run in order in one namespace (a later block uses what an earlier one defined), in a
fresh temporary working folder (what the blocks write, ``report.html``, ``smollm2_report/``, stays out of
the checkout). Blocks that cannot run on a CI machine (a GPU, a cluster, the Hugging Face hub, a
re-download of the zoo) carry ``<!-- skip: next "why" -->`` in the markdown; sh/console blocks are not
Python and are not run.

The blocks load the real zoo model (smollm2-135m): they are integration tests, marked ``integration``; the
README's quick command (``pytest -q tests/unit``) does not name them, ``-m "not slow and not integration"``
deselects them, and CI's integration stage names them by path (``pytest -q -m "not slow" tests/integration
tests/acceptance README.md docs``). Only these files are parsed (``DOC_FILES``; ``tests/data/**/README.md`` is
data, not docs).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from sybil import Sybil
from sybil.integration.pytest import SybilItem
from sybil.parsers.markdown import PythonCodeBlockParser, SkipParser

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


#: What reads the docs: ```python blocks and ``<!-- skip: next "why" -->`` comments (other blocks are text).
SYBIL = Sybil(
    parsers=[PythonCodeBlockParser(), SkipParser()],
    path=str(ROOT),
    patterns=["*.md"],
    fixtures=["doc_workdir"],
)
_collect_doc = SYBIL.pytest()


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    """Sybil's collector for the files of :data:`DOC_FILES`, nothing else."""
    if file_path.resolve() in DOC_FILES:
        return _collect_doc(file_path, parent)
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The doc blocks are integration tests (the real zoo model, tens of seconds)."""
    for item in items:
        if isinstance(item, SybilItem):
            item.add_marker(pytest.mark.integration)
