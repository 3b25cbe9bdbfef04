"""A report with every analysis saved and loaded back identically (a real model's report: moved out of the unit tier
for its time); the store's unit tests are tests/unit/report/test_store.py.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import tl_idempotence as tli
from helpers import assert_same_value, frames_identical
from tl_idempotence.report.store import RECORD
from tl_idempotence.views.page import report_html

pytestmark = pytest.mark.bridge  # checkpoint files only: must also pass on transformer-lens 4.x


#: plotly's and itables' element ids are random per render; everything else of the page is deterministic.
RANDOM_IDS = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|itables_[0-9a-f_]{20,}")


def page(rep) -> str:
    return RANDOM_IDS.sub("ID", report_html(rep))


def test_save_load_round_trip_is_identical(smol_full, smol_saved):
    back = tli.load_report(smol_saved)
    assert sorted(p.name for p in smol_saved.iterdir()) == sorted(
        [RECORD, "heads.parquet", "layers.parquet"] + [f"{k}.parquet" for k in smol_full.tables]
    )
    assert {"scramble_draws", "mismatch_pairs", "algebra_pairs", "algebra_closed_ranges"} <= set(smol_full.tables)
    frames_identical(back.heads, smol_full.heads, "heads")
    assert list(back.heads.index) == list(smol_full.heads.index) and back.heads.index.name == "label"
    frames_identical(back.layers, smol_full.layers, "layers")
    assert sorted(back.tables) == sorted(smol_full.tables)
    for k in smol_full.tables:
        frames_identical(back.tables[k], smol_full.tables[k], k)
    assert_same_value(back.summary, smol_full.summary)  # every value, type and key order; floats bit for bit
    assert back.info == smol_full.info and back.options == smol_full.options and back.threshold == 0.9
    # what the report shows: the same closed heads, figures (plotly JSON) and page
    assert list(back.closed_heads.index) == ["L10H8", "L5H2", "L10H6"]
    assert back.closed_heads["P"].iloc[0] == smol_full.heads.loc["L10H8", "P"] == pytest.approx(0.953258, abs=5e-7)
    figs, figs_back = smol_full.figures(), back.figures()
    assert len(figs) == len(figs_back) == 4  # heatmap, two scramble figures, algebra summary
    assert [f.to_json() for f in figs_back] == [f.to_json() for f in figs]
    assert page(back) == page(smol_full)
    assert back.paper_table().equals(smol_full.paper_table())
    # a loaded report is a report: its threshold can move, and it saves again to the same bytes
    assert list(back.with_threshold(0.95).closed_heads.index) == ["L10H8"]
    back = back.with_threshold(0.95).with_threshold(0.9)
    again = Path(back.save(smol_saved.parent / "again"))
    for f in smol_saved.iterdir():
        assert (again / f.name).read_bytes() == f.read_bytes(), f.name
