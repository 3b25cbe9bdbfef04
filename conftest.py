"""Root conftest: the python blocks of README.md and docs/*.md as integration tests (tests/doc_blocks.py), their
skips judged under ``CI=1`` by the rule of every skip (tests/ci_skips.py); and, first, the shape checks of every
run (tests/shapecheck.py: jaxtyping's import hook on the modules with shape annotations)."""

import shapecheck

shapecheck.install_unless_switched_off()  # before anything imports tl_idempotence

from doc_blocks import (  # noqa: E402, F401
    doc_workdir,
    pytest_collect_file,
    pytest_collection_modifyitems,
    pytest_runtest_makereport,
)
