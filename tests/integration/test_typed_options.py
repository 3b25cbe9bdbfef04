"""mypy refuses a misspelled report option: ReportOptions declares a typed attribute per option (no ``Any``)."""

from __future__ import annotations

from pathlib import Path

import pytest

api = pytest.importorskip("mypy.api")

SRC = Path(__file__).resolve().parents[2] / "src"


def test_mypy_refuses_a_misspelled_option_and_types_the_right_one(tmp_path, monkeypatch):
    snippet = tmp_path / "snippet.py"
    snippet.write_text(
        "from tl_idempotence.analyses.report_options import ReportOptions\n"
        "opts = ReportOptions(nulls=4)\n"
        "n: int = opts.nulls\n"
        "reveal_type(opts.nulls)\n"
        "reveal_type(opts.search)\n"
        "opts.nullz\n",
        encoding="utf-8",
    )
    monkeypatch.setenv("MYPYPATH", str(SRC))
    out, err, status = api.run(
        [str(snippet), "--follow-imports=silent", "--ignore-missing-imports", "--cache-dir", str(tmp_path / "cache")]
    )
    assert status == 1, out + err
    assert 'snippet.py:6: error: "ReportOptions" has no attribute "nullz"' in out, out
    assert 'snippet.py:4: note: Revealed type is "int"' in out, out
    assert 'snippet.py:5: note: Revealed type is "bool"' in out, out
    assert out.count("error:") == 1, out  # the right name and its type pass
