"""One table of the draw counts' defaults (core/defaults.py): every entry point reads its default from it, and
docs/api.md's table is generated from it (scripts/docs/defaults_table.py rewrites it)."""

from __future__ import annotations

import importlib.util
import inspect
import re
from pathlib import Path

import pytest

import tl_idempotence as tli
from tl_idempotence.analyses.report_options import ReportOptions, default
from tl_idempotence.cli import build_parser
from tl_idempotence.core.defaults import DEFAULTS_TABLE, default_of

ROOT = Path(__file__).resolve().parents[3]


def _script():
    spec = importlib.util.spec_from_file_location("defaults_table", ROOT / "scripts" / "docs" / "defaults_table.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_docs_api_holds_the_generated_table():
    text = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    assert _script().generated(text) == text, "docs/api.md differs: run python scripts/docs/defaults_table.py"


def test_the_generated_text_changes_with_the_table(monkeypatch):
    import tl_idempotence.core.defaults as d

    text = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    row = d.DEFAULTS_TABLE[2]
    monkeypatch.setattr(d, "DEFAULTS_TABLE", (*d.DEFAULTS_TABLE[:2], row._replace(value=65), *d.DEFAULTS_TABLE[3:]))
    assert _script().generated(text) != text


def test_each_entry_point_reads_its_default_from_the_table():
    assert default("nulls") == default_of("tli.idempotence_report", "nulls") == 0
    assert ReportOptions().nulls == 0 and ReportOptions(nulls=True).nulls == default_of("nulls=True", "nulls") == 64
    assert build_parser().parse_args(["report"]).nulls == 0
    sig = inspect.signature
    assert sig(tli.orientation_scramble).parameters["nulls"].default == default_of("tli.orientation_scramble", "nulls")
    assert sig(tli.activation_returns).parameters["nulls"].default == default_of("tli.activation_returns", "nulls")
    assert sig(tli.ablation).parameters["n_controls"].default == default_of("tli.ablation", "n_controls") == 39
    assert [(d.option, d.value) for d in DEFAULTS_TABLE] == [
        ("nulls", 0),
        ("nulls", 64),
        ("nulls", 64),
        ("nulls", 4),
        ("n_controls", 39),
    ]
    with pytest.raises(KeyError, match=re.escape("no default of 'nulls' at 'tli.head_roles'")):
        default_of("tli.head_roles", "nulls")
