"""Shared fixtures: tests/ on the import path (for ``helpers``) and the real zoo models.

Real-model fixtures load from the offline model zoo cache. Where the zoo cannot provide a
model the tests that need it are skipped on a developer machine, but FAIL when the ``CI``
environment variable is set: CI must never pass by silently skipping the real-model checks.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from helpers import LINEAGE_KW  # needs tests/ on the path (set just above)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tiers: a user's workflow replayed in a fresh process (``acceptance``) belongs to the integration tier
    too, so ``-m "not integration"`` (the README's quick command) is the unit tier."""
    for item in items:
        if item.get_closest_marker("acceptance") is not None and item.get_closest_marker("integration") is None:
            item.add_marker(pytest.mark.integration)


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
