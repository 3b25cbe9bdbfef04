"""Shared fixtures: tests/ on the import path (for ``helpers``) and the real zoo models.

Real-model fixtures load from the offline model zoo cache. Where the zoo cannot provide a
model the tests that need it are skipped on a developer machine, but FAIL when the ``CI``
environment variable is set: CI must never pass by silently skipping the real-model checks.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from ci_skips import CI_ALLOWED_SKIPS, ci_allows_skip, fail_unnamed_skip  # noqa: F401 - the rule, used here too
from ci_skips import transformer_lens_major as _transformer_lens_major  # noqa: F401 - tests/unit/test_tiers.py
from helpers import LINEAGE_KW  # needs tests/ on the path (set just above)

#: The fixtures several test modules share (tests/shared_fixtures.py), for every tier.
pytest_plugins = ("shared_fixtures",)  # not "fixtures": pytest has a plugin of that name

#: The tier folders: a test's tier is told by its path (CONTRIBUTING.md, "The test tiers").
TESTS = Path(__file__).resolve().parent
TIERS = ("unit", "integration", "acceptance")
#: Marks that name a tier, and the folders where each may appear (``slow``: the heavier integration tests).
TIER_MARKS = {"integration": ("integration",), "slow": ("integration",), "acceptance": ("acceptance",)}


def tier_of(path: Path) -> str | None:
    """``unit``, ``integration`` or ``acceptance`` for a test file under that folder of tests/; None elsewhere."""
    try:
        rel = Path(path).resolve().relative_to(TESTS)
    except ValueError:
        return None  # README.md and docs/*.md (their blocks are integration tests: doc_blocks.py)
    return rel.parts[0] if len(rel.parts) > 1 and rel.parts[0] in TIERS else ""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tiers by path: ``tests/integration`` is marked ``integration`` and ``tests/acceptance`` ``acceptance``
    and ``integration`` (so ``-m "not integration"`` is still the unit tier); a test file outside the three tier
    folders, or a tier mark that contradicts its folder (an ``integration`` or ``slow`` test under tests/unit),
    is a collection error, so a test's tier cannot silently differ from its path.

    Raises:
        pytest.UsageError: a test outside the tier folders or a mark that contradicts its folder.
    """
    wrong = []
    for item in items:
        tier = tier_of(item.path)
        if tier is None:
            continue
        if tier == "":
            wrong.append(f"{item.nodeid}: not under tests/unit, tests/integration or tests/acceptance")
            continue
        for mark, allowed in TIER_MARKS.items():
            if item.get_closest_marker(mark) is not None and tier not in allowed:
                wrong.append(f"{item.nodeid}: marked {mark!r} under tests/{tier} (move it to tests/{allowed[0]})")
        if tier in ("integration", "acceptance") and item.get_closest_marker("integration") is None:
            item.add_marker(pytest.mark.integration)
        if tier == "acceptance" and item.get_closest_marker("acceptance") is None:
            item.add_marker(pytest.mark.acceptance)
    if wrong:
        raise pytest.UsageError("a test's tier is its folder:\n  " + "\n  ".join(wrong))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Generator[None, Any, None]:
    """A test's skip under ``CI``: :func:`ci_skips.fail_unnamed_skip` (the one rule, ``CI_ALLOWED_SKIPS``)."""
    outcome = yield
    fail_unnamed_skip(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Generator[None, Any, None]:
    """A module (or class) skipped while it was collected, under ``CI``: :func:`ci_skips.fail_unnamed_skip`."""
    outcome = yield
    fail_unnamed_skip(outcome.get_result())


def unavailable(what: str, err: BaseException | None = None) -> None:
    """Skip (developer machine) or fail (``CI`` set) a test whose real model / data is unavailable."""
    msg = f"{what} not available" + (f": {type(err).__name__}: {err}" if err is not None else "")
    if os.environ.get("CI"):
        pytest.fail(f"{msg} (CI is set, so this is a failure, not a skip)", pytrace=False)
    pytest.skip(msg)


def load_zoo_model(name: str, **kwargs):
    """``tli.models.load(name, progress=False, **kwargs)``, or skip/fail (see :func:`unavailable`)."""
    import tl_idempotence as tli

    try:
        return tli.models.load(name, progress=False, **kwargs)
    except Exception as e:  # the zoo could not provide the model (offline, no cache, ...)
        unavailable(f"zoo model {name!r}", e)


def zoo_gguf_path(name: str = "smollm2-135m"):
    """``tli.models.gguf_path(name)``, or skip/fail (see :func:`unavailable`)."""
    import tl_idempotence as tli

    try:
        return tli.models.gguf_path(name, progress=False)
    except Exception as e:  # see load_zoo_model
        unavailable(f"zoo GGUF file of {name!r}", e)


@pytest.fixture(scope="module")
def smollm2():
    """SmolLM2-135M-Instruct from the zoo (a TransformerBridge, raw weights), once per module."""
    return load_zoo_model("smollm2-135m")


@pytest.fixture(scope="module")
def smollm2_gguf():
    """Path of the zoo's SmolLM2-135M-Instruct Q4_1 GGUF file."""
    return zoo_gguf_path("smollm2-135m")


@pytest.fixture(scope="module")
def minilm():
    """all-MiniLM-L6-v2 from the zoo (a BERT encoder), once per module."""
    return load_zoo_model("minilm-l6")


@pytest.fixture(scope="session")
def lineage(tmp_path_factory):
    """The tiny trained lineage (6 checkpoints of an attention-only model), trained once per session."""
    from tl_idempotence.sources.lineage import train_lineage

    return train_lineage(tmp_path_factory.getbasetemp() / "tli_lineage", **LINEAGE_KW)


@pytest.fixture
def no_dask_cluster(monkeypatch):
    """``distributed.LocalCluster`` replaced by one that records the attempt and refuses to start: a test of
    checks made "before any work" asserts the list it yields is empty (instead of timing the call)."""
    distributed = pytest.importorskip("distributed")
    started: list[tuple] = []

    def refuse(*args, **kwargs):
        started.append((args, kwargs))
        raise AssertionError("a LocalCluster was started")

    monkeypatch.setattr(distributed, "LocalCluster", refuse)
    return started
