"""A sweep's task record is strict JSON under the one record NaN policy (core/jsonio.py) and reads back exactly."""

from __future__ import annotations

import json
import math
from pathlib import Path

from tl_idempotence.studies.compare import Item
from tl_idempotence.studies.sweep.task import ITEM_FORMAT, ItemFiles


def test_a_task_record_with_inf_is_strict_json_and_reads_back_the_same_values(tmp_path: Path) -> None:
    files = ItemFiles(tmp_path, "a")
    row = {"dir": "a", "status": "failed", "run": "r1", "reason": "NaN", "pid": 7}
    files.write_record({**row, "seconds": math.inf}, Item("a", "zoo", "smollm2-135m"))
    text = files.record_path.read_text("utf-8")

    def refuse(token: str) -> float:
        raise AssertionError(f"bare {token} in a record: not JSON")

    raw = json.loads(text, parse_constant=refuse)  # strict: no bare NaN/Infinity literal
    assert raw["seconds"] == "Infinity" and raw["reason"] == "NaN"
    rec, why = files.read_record()
    assert why is None and rec is not None
    assert rec["format"] == ITEM_FORMAT
    assert rec["seconds"] == math.inf  # a float field: the string is read back as the float
    assert rec["reason"] == "NaN"  # a text field that reads "NaN" stays text
    assert rec["pid"] == 7 and rec["status"] == "failed"


def test_a_record_written_by_0_2_with_bare_nan_still_reads(tmp_path: Path) -> None:
    files = ItemFiles(tmp_path, "a")
    files.folder.mkdir(parents=True)
    rec = {"format": ITEM_FORMAT, "dir": "a", "status": "computed", "run": "r", "reason": "", "seconds": math.nan}
    files.record_path.write_text(json.dumps(rec), "utf-8")  # 0.2 wrote Python's bare NaN
    got, why = files.read_record()
    assert why is None and got is not None and math.isnan(got["seconds"])
