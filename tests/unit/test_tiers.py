"""The test tiers are folders (CONTRIBUTING.md, "The test tiers"): tests/conftest.py gives a test the marks of its
folder and refuses a test outside the three tier folders or a tier mark that contradicts its folder; the CI-skip
rule (tests/conftest.py ``ci_allows_skip``; replayed in fresh pytest processes by
tests/integration/test_ci_skips.py); and every test path scripts/mutation.py names exists
(and every hand-written change of scripts/mutation.py still applies)."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from conftest import TESTS, _transformer_lens_major, ci_allows_skip, pytest_collection_modifyitems, tier_of

ROOT = TESTS.parent


class FakeItem:
    """What the tier hook reads of a pytest item: its path, node id and marks."""

    def __init__(self, rel: str, *marks: str):
        self.path = ROOT / rel
        self.nodeid = f"{rel}::test_x"
        self.marks = set(marks)

    def get_closest_marker(self, name: str):
        return name if name in self.marks else None

    def add_marker(self, mark) -> None:
        self.marks.add(mark.name)


def test_the_tier_of_a_path():
    assert tier_of(TESTS / "unit" / "core" / "test_closure.py") == "unit"
    assert tier_of(TESTS / "integration" / "test_demos.py") == "integration"
    assert tier_of(TESTS / "acceptance" / "test_workflow.py") == "acceptance"
    assert tier_of(TESTS / "test_loose.py") == ""  # under tests/ but in no tier folder
    assert tier_of(TESTS / "data" / "test_x.py") == ""
    assert tier_of(ROOT / "README.md") is None and tier_of(ROOT / "docs" / "api.md") is None  # the docs' blocks


def test_the_folder_gives_the_marks():
    unit = FakeItem("tests/unit/core/test_a.py", "bridge")
    integ = FakeItem("tests/integration/test_b.py", "slow")
    acc = FakeItem("tests/acceptance/test_c.py")
    doc = FakeItem("README.md", "integration")
    pytest_collection_modifyitems(None, [unit, integ, acc, doc])  # type: ignore[arg-type, list-item]
    assert unit.marks == {"bridge"}
    assert integ.marks == {"slow", "integration"}
    assert acc.marks == {"acceptance", "integration"}
    assert doc.marks == {"integration"}


@pytest.mark.parametrize(
    ("rel", "marks", "says"),
    [
        ("tests/unit/core/test_a.py", ("integration",), "marked 'integration' under tests/unit"),
        ("tests/unit/core/test_a.py", ("slow",), "marked 'slow' under tests/unit (move it to tests/integration)"),
        ("tests/unit/test_a.py", ("acceptance",), "marked 'acceptance' under tests/unit"),
        ("tests/integration/test_a.py", ("acceptance",), "marked 'acceptance' under tests/integration"),
        ("tests/acceptance/test_a.py", ("slow",), "marked 'slow' under tests/acceptance"),
        ("tests/test_a.py", (), "not under tests/unit, tests/integration or tests/acceptance"),
        ("tests/core/test_a.py", (), "not under tests/unit, tests/integration or tests/acceptance"),
    ],
    ids=[
        "unit-integration",
        "unit-slow",
        "unit-acceptance",
        "integration-acceptance",
        "acceptance-slow",
        "root",
        "old",
    ],
)
def test_a_tier_that_contradicts_the_folder_is_refused(rel, marks, says):
    ok = FakeItem("tests/unit/test_ok.py")
    with pytest.raises(pytest.UsageError) as ei:
        pytest_collection_modifyitems(None, [ok, FakeItem(rel, *marks)])  # type: ignore[arg-type, list-item]
    msg = str(ei.value)
    assert msg.startswith("a test's tier is its folder:") and f"{rel}::test_x: {says}" in msg, msg
    assert "test_ok" not in msg


def test_only_the_named_skips_are_allowed_under_ci():
    assert ci_allows_skip("needs CUDA") and ci_allows_skip("this machine has CUDA, the check is for CPUs")
    assert not ci_allows_skip("Chromium is not installed")
    assert not ci_allows_skip("zoo model 'smollm2-135m' not available: OSError: offline")
    assert not ci_allows_skip("")
    tl4 = _transformer_lens_major() >= 4
    assert ci_allows_skip("HookedTransformer needs transformer-lens 3.x") is tl4


def _mutation_targets(monkeypatch: pytest.MonkeyPatch) -> dict:
    spec = importlib.util.spec_from_file_location("tli_mutation_script", ROOT / "scripts" / "mutation.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, mod)  # its dataclasses look their module up while it runs
    spec.loader.exec_module(mod)
    return mod.TARGETS


def _hand_mutants(monkeypatch: pytest.MonkeyPatch) -> tuple:
    _mutation_targets(monkeypatch)
    return sys.modules["tli_mutation_script"].HAND_MUTANTS


def test_every_hand_written_mutant_still_applies(monkeypatch):
    """``mutation.py --by-hand`` replaces each mutant's text, which must be exactly once in its file (a text the code
    no longer holds would mutate nothing), and runs tests that exist; at least 8 are run, of distinct names."""
    mutants = _hand_mutants(monkeypatch)
    live = [m for m in mutants if m.pending is None]
    assert len(live) >= 8 and len({m.name for m in mutants}) == len(mutants)
    for m in live:
        assert m.old != m.new and (ROOT / m.file).read_text(encoding="utf-8").count(m.old) == 1, (m.name, m.old)
        assert m.tests and all(t.startswith("tests/unit/") and (ROOT / t.split("::")[0]).exists() for t in m.tests)
    for m in mutants:
        assert m.pending is None or m.pending.strip(), m.name


def test_every_test_path_of_the_mutation_targets_exists(monkeypatch):
    """scripts/mutation.py runs each target's tests by path: a path that moved would select nothing."""
    targets = _mutation_targets(monkeypatch)
    assert {"kv_map", "closure", "resume_key", "store_digest", "scramble_summary"} <= set(targets)
    for name, t in targets.items():
        assert (ROOT / t.source).is_file(), (name, t.source)
        assert t.tests and t.tests[0].startswith("tests/unit/"), (name, t.tests)  # the fast tests first
        for sel in t.tests:
            path, _, test = sel.partition("::")
            assert path.startswith(("tests/unit/", "tests/integration/")) and (ROOT / path).is_file(), (name, sel)
            if test:
                assert f"def {test.split('[')[0]}(" in (ROOT / path).read_text(encoding="utf-8"), (name, sel)


def test_the_readme_and_ci_run_the_unit_tier_by_its_folder():
    """The README's test command and CI's first test stage are ``pytest -q tests/unit``; every stage names folders."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert readme[2].endswith(".venv/bin/python -m pytest -q tests/unit"), readme[2]
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    for stage in (
        'run_tier "$V/python" "tests/unit" ',
        'run_tier "$V/python" "tests/integration tests/acceptance README.md docs" ',
        'run_tier "$V/python" "tests/integration" "slow" "slow"',
        'run_tier "$V4/python" "tests/acceptance" ',
        'run_tier "$V4/python" "tests/unit tests/integration" ',
    ):
        assert stage in ci, stage
