"""Root conftest: the python blocks of README.md and docs/*.md as integration tests (tests/doc_blocks.py)."""

from doc_blocks import doc_workdir, pytest_collect_file, pytest_collection_modifyitems  # noqa: F401
