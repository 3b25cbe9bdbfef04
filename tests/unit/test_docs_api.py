"""docs/api.md has an entry for every public name: each function and module of ``tli.__all__`` in the call column
of a table (``tli.head_tokens(...)``), each result class in a table, each public method and property of
``IdempotenceReport`` in the call column (``rep.mechanism(...)``); a row that shows a signature names every
parameter of it. The README's cost table has a row with CPU seconds for each slow probe."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

import tl_idempotence as tli

ROOT = Path(__file__).resolve().parents[2]
API = (ROOT / "docs/api.md").read_text(encoding="utf-8")


def _rows(text: str) -> list[list[str]]:
    """The table rows of a markdown text, split into cells (an escaped ``\\|`` stays in its cell)."""
    return [
        [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
        for line in text.splitlines()
        if line.startswith("|") and not re.fullmatch(r"\|( *-+ *\|)+", line.strip())
    ]


CALLS = "\n".join(r[0] for r in _rows(API) if r)
TABLES = "\n".join(" | ".join(r) for r in _rows(API))


def _report_members() -> list[str]:
    """IdempotenceReport's public methods (classmethods too) and properties: not its class-level settings."""
    out = []
    for name in dir(tli.IdempotenceReport):
        if name.startswith("_"):
            continue
        attr = inspect.getattr_static(tli.IdempotenceReport, name)
        if inspect.isfunction(attr) or isinstance(attr, (classmethod, staticmethod, property)):
            out.append(name)
    return out


def test_every_public_function_and_module_has_a_row():
    missing = [n for n in tli.__all__ if not inspect.isclass(getattr(tli, n)) and not re.search(rf"`tli\.{n}\b", CALLS)]
    assert not missing, f"docs/api.md has no row whose call column names tli.{missing}"


def test_every_result_class_is_in_a_table():
    missing = [n for n in tli.__all__ if inspect.isclass(getattr(tli, n)) and not re.search(rf"`{n}`", TABLES)]
    assert not missing, f"docs/api.md's tables do not name the classes {missing}"


def test_every_report_method_and_property_has_a_row():
    members = _report_members()
    assert {"mechanism", "roles", "ablation", "save_html", "heads", "load"} <= set(members)  # what the rule reads
    missing = [n for n in members if not re.search(rf"`(rep|tli\.IdempotenceReport)\.{n}\b", CALLS)]
    assert not missing, f"docs/api.md has no row for rep.{missing}"


def _signature_cell(call: str) -> str:
    hits = [c for c in CALLS.splitlines() if c.startswith(f"`{call}(")]
    assert len(hits) == 1, (call, hits)
    return hits[0]


@pytest.mark.parametrize(
    "call, fn",
    [
        ("rep.mechanism", tli.IdempotenceReport.mechanism),
        ("rep.roles", tli.IdempotenceReport.roles),
        ("tli.head_roles", tli.head_roles),
        ("tli.head_tokens", tli.head_tokens),
        ("tli.attended_token_effect", tli.attended_token_effect),
    ],
)
def test_a_row_that_shows_a_signature_shows_all_of_it(call, fn):
    cell = _signature_cell(call)
    deprecated = {"n_tokens"} if call in ("rep.roles", "tli.head_roles") else set()  # documented as deprecated
    for name, p in inspect.signature(fn).parameters.items():
        if name == "self" or name in deprecated:
            continue
        # (None: "the callee's default", which a row may state: rep.roles shows repeat_len=24)
        shown = name if p.default is p.empty else f"{name}=" if p.default is None else f"{name}={p.default!r}"
        shown = shown.replace("'", '"')
        assert shown in cell, f"docs/api.md's {call} row does not show {shown!r}: {cell}"


def test_the_readme_cost_table_has_cpu_seconds_for_each_slow_probe():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## What each analysis costs", 1)[1].split("\n## ", 1)[0]
    rows = {r[1]: r for r in _rows(section) if len(r) >= 3}
    for call in ("tli.head_tokens(model)", "tli.attended_token_effect(model)", "rep.mechanism(model=model)",
                 "rep.roles(model=model)", "tli.head_roles(model)"):  # fmt: skip
        row = rows.get(f"`{call}`")
        assert row is not None, f"the README's cost table has no row for {call}"
        assert re.fullmatch(r"[\d.]+ s", row[2]), f"{call}: CPU time {row[2]!r}"
