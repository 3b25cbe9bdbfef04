"""Root conftest: the python blocks of README.md and docs/*.md as integration tests (tests/doc_blocks.py), their
skips judged under ``CI=1`` by the rule of every skip (tests/ci_skips.py)."""

from doc_blocks import (  # noqa: F401
    doc_workdir,
    pytest_collect_file,
    pytest_collection_modifyitems,
    pytest_runtest_makereport,
)
