"""The one rule for skips under ``CI=1``, for both kinds of skip: a pytest test's (``pytest.skip``, ``skipif``, a
module skipped while it was collected; the hooks of tests/conftest.py) and a README/docs python block's
(``<!-- skip: next "why" -->``; the hook of tests/doc_blocks.py, which conftest.py at the root loads).

Under ``CI`` a skip fails unless :data:`CI_ALLOWED_SKIPS` names its reason (a fragment of it) and the entry applies
to this install, so no tier passes by skipping (a missing browser, a library version, a model the zoo could not
give, a doc block someone could not be bothered to run). Replayed in fresh pytest processes by
tests/integration/test_ci_skips.py.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import NamedTuple

import pytest

__all__ = ["CI_ALLOWED_SKIPS", "AllowedSkip", "ci_allows_skip", "fail_unnamed_skip", "transformer_lens_major"]


def transformer_lens_major() -> int:
    """The major version of the installed transformer-lens (0 when it is not installed)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return int(version("transformer-lens").split(".")[0])
    except (PackageNotFoundError, ValueError):
        return 0


class AllowedSkip(NamedTuple):
    """A skip CI accepts: a fragment of its reason, whether it applies to this install, and whether only a doc
    block may give it (a pytest test that takes minutes is marked ``slow``, never skipped)."""

    fragment: str
    applies: Callable[[], bool]
    docs_only: bool = False


#: The only skips CI accepts (CI=1), each with why it cannot run there. Any other skip under CI=1 is a failure.
CI_ALLOWED_SKIPS: tuple[AllowedSkip, ...] = (
    AllowedSkip("this machine has CUDA", lambda: True),  # a CPU-only check on a machine with a GPU (CI has none)
    AllowedSkip("needs CUDA", lambda: True),  # the GPU checks: CI never has a GPU (the device tool runs them)
    AllowedSkip("needs transformer-lens 3.x", lambda: transformer_lens_major() >= 4),  # HookedTransformer: 3.x only
    AllowedSkip("transformer-lens 4.x has no HookedTransformer", lambda: transformer_lens_major() >= 4),
    # the docs' blocks only:
    # CI is offline from the hub (HF_HUB_OFFLINE=1): its real models come from the zoo (tli.models)
    AllowedSkip("needs the Hugging Face hub", lambda: True, docs_only=True),
    # SLURM, Kubernetes: CI is one machine (tests/integration/studies/test_sweep.py runs LocalCluster sweeps)
    AllowedSkip("needs a cluster", lambda: True, docs_only=True),
    # minutes of work: the reason names the test that runs the same code at a test's size
    AllowedSkip("long-running", lambda: True, docs_only=True),
    # not Python but a signature: tests/unit/test_doc_skips.py checks it against the code
    AllowedSkip("a signature, not a call", lambda: True, docs_only=True),
)


def ci_allows_skip(reason: str, *, doc_block: bool = False) -> bool:
    """Whether a skip with this reason is one :data:`CI_ALLOWED_SKIPS` names for this install (``doc_block``: the
    skip of a README/docs python block, which may also give a reason marked ``docs_only``)."""
    return any(
        entry.fragment in reason and (doc_block or not entry.docs_only) and entry.applies()
        for entry in CI_ALLOWED_SKIPS
    )


def fail_unnamed_skip(rep: pytest.TestReport | pytest.CollectReport, *, doc_block: bool = False) -> None:
    """Under ``CI``, turn a skipped report whose reason :data:`CI_ALLOWED_SKIPS` does not name into a failure.

    The one rule for every skip: a test skipped while it ran (``pytest.skip`` in its body or a fixture, ``skipif``
    marks), a module skipped while it was collected (``pytest.skip(..., allow_module_level=True)``, a module-level
    ``pytest.importorskip``), and a doc block skipped by its ``<!-- skip: next "why" -->`` comment
    (``doc_block=True``).
    """
    if not os.environ.get("CI") or not rep.skipped or hasattr(rep, "wasxfail"):
        return
    reason = rep.longrepr[2] if isinstance(rep.longrepr, tuple) else str(rep.longrepr)
    if not ci_allows_skip(reason, doc_block=doc_block):
        rep.outcome = "failed"
        rep.longrepr = f"skipped under CI=1, which accepts only the skips tests/ci_skips.py names: {reason}"
