"""A sweep folder's contents are checked against what its plan says they are.

* Another item's report copied into an item's folder (``cp -r DIR/b DIR/a``) is never that item's result:
  ``load_sweep`` and ``--collect`` list the item as failed (``ReportMismatchError``, naming both), its task
  measures it again, naming both. Told apart by the plan's checkpoint name, and — for two checkpoints with
  one folder name — by the weights fingerprint the item's own task recorded.
* A job-array task given another item list than ``DIR/sweep.json`` is refused (exit 2, the file byte for byte
  unchanged, nothing measured); ``--replan`` makes the new list the plan.
* A successful Dask sweep writes no library traceback on stderr.

Tiny synthetic checkpoints on disk (``helpers``); array tasks in this process (``run_sweep_item``) and, where
the user's route is the CLI, in fresh processes (those tests are in the integration tier).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import tl_idempotence as tli
from helpers import ARRAY_INDEX_VARIABLES
from tl_idempotence.errors import OptionError, ReportFileError
from tl_idempotence.report.identity import Origin
from tl_idempotence.studies.sweep import ITEMS_DIR, RECORD_NAME, read_sweep_plan, run_sweep_item

OPTS = {"nulls": 2, "seed": 1}
INDEX_VARIABLES = ARRAY_INDEX_VARIABLES

pytestmark = pytest.mark.usefixtures("no_array_environment")


def replace_folder(out: Path, src: str, dst: str) -> None:
    """What the user did: the folder of item ``dst`` replaced by a copy of item ``src``'s."""
    shutil.rmtree(out / dst)
    shutil.copytree(out / src, out / dst)


def test_a_copied_report_without_a_task_record_is_checked_against_the_plan(identity_ckpts, tmp_path):
    """The item's folder and its task record both gone, another item's report copied in: the plan's checkpoint
    name is what is left to tell, and it does."""
    out = tmp_path / "out"
    items = {"a": identity_ckpts["A"], "b": identity_ckpts["B"]}
    for i in (0, 1):
        run_sweep_item(items, out, i, **OPTS)
    replace_folder(out, "b", "a")
    shutil.rmtree(out / ITEMS_DIR / "a")
    with pytest.warns(UserWarning, match=r"a: ReportMismatchError"):
        res = tli.load_sweep(out)
    msg = res.failed.set_index("label").loc["a", "message"]
    assert f"not of item 'a' (path {identity_ckpts['A']}): the report was measured from checkpoint 'ckB'" in msg
    assert list(res.tasks["status"]) == ["failed", "computed"]


def test_a_plan_whose_origin_lies_is_refused_by_name(identity_ckpts, tmp_path):
    out = tmp_path / "out"
    run_sweep_item({"a": identity_ckpts["A"]}, out, 0, **OPTS)
    plan = json.loads((out / RECORD_NAME).read_text())
    assert plan["items"][0]["origin"] == {"kind": "checkpoint", "name": "ckA"}
    assert read_sweep_plan(out).origins == (Origin("checkpoint", "ckA"),)
    plan["items"][0]["origin"] = {"kind": "url", "name": "x"}
    (out / RECORD_NAME).write_text(json.dumps(plan))
    with pytest.raises(ReportFileError, match="gives item 'a' an origin that is not a checkpoint or zoo model"):
        tli.load_sweep(out)


def test_the_library_refuses_another_item_list_the_same_way(identity_ckpts, tmp_path):
    out = tmp_path / "out"
    run_sweep_item({"a": identity_ckpts["A"], "b": identity_ckpts["B"]}, out, 0, **OPTS)
    plan = (out / RECORD_NAME).read_bytes()
    with pytest.raises(OptionError, match=r"is the plan of a sweep of other items \(items only given now: \['c'\]\)"):
        run_sweep_item({"a": identity_ckpts["A"], "b": identity_ckpts["B"], "c": identity_ckpts["C"]}, out, 2, **OPTS)
    # a Dask sweep too, before any cluster starts
    with pytest.raises(OptionError, match=r"items only in the folder's sweep: \['b'\]"):
        tli.sweep({"a": identity_ckpts["A"]}, out, workers=1, progress=False, **OPTS)
    assert (out / RECORD_NAME).read_bytes() == plan and not (out / "c").exists()
    # the same items with other options rewrite the plan (each item is then measured with the new ones)
    run_sweep_item({"a": identity_ckpts["A"], "b": identity_ckpts["B"]}, out, 1, nulls=3, seed=1)
    assert read_sweep_plan(out).options["nulls"] == 3
    row = run_sweep_item({"a": identity_ckpts["A"]}, out, 0, replan=True, **OPTS)
    assert row["status"] == "skipped" and [i[0] for i in read_sweep_plan(out).items] == ["a"]


def test_an_item_folder_copied_with_its_task_record_is_refused_by_its_full_source(identity_ckpts, tmp_path):
    """Two checkpoints with one folder name (seed1/step200, seed2/step200): item p's folder and task record copied
    over item q's. The task record names the full source, so q is refused; with q's record gone
    (only the report copied), the shared folder name cannot tell them apart and q is missing, never p's numbers."""
    out = tmp_path / "out"
    items = {"p": identity_ckpts["s1"], "q": identity_ckpts["s2"]}
    for i in (0, 1):
        run_sweep_item(items, out, i, **OPTS)
    replace_folder(out, "p", "q")
    shutil.rmtree(out / ITEMS_DIR / "q")
    shutil.copytree(out / ITEMS_DIR / "p", out / ITEMS_DIR / "q")
    with pytest.warns(UserWarning, match=r"q: ReportMismatchError"):
        res = tli.load_sweep(out)
    msg = res.failed.set_index("label").loc["q", "message"]
    assert f"{out / 'q'} is not of item 'q' (path {identity_ckpts['s2']}): its task record" in msg
    assert list(res.tasks["status"]) == ["computed", "failed"] and list(res.reports) == ["p"]
    # the record edited to name q's folder: its item (the full source) is still p's
    rec = json.loads((out / ITEMS_DIR / "q" / "record.json").read_text())
    (out / ITEMS_DIR / "q" / "record.json").write_text(json.dumps({**rec, "dir": "q", "label": "q"}))
    with pytest.warns(UserWarning, match=r"q: ReportMismatchError"):
        res = tli.load_sweep(out)
    assert f"is of 'path {identity_ckpts['s1']}'" in res.failed.set_index("label").loc["q", "message"]
    # no task record at all: the folder name is shared with p, so q's report cannot be told from p's
    shutil.rmtree(out / ITEMS_DIR / "q")
    with pytest.warns(UserWarning):
        res = tli.load_sweep(out)
    assert (
        list(res.reports) == ["p"]
        and "share its checkpoint 'step200'" in res.missing.set_index("label").loc["q", "reason"]
    )
