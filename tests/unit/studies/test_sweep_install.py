"""A sweep task puts its item's report in place through THE store (core/store.py ``install_folder``): in one step
where the system exchanges folders atomically, else by two renames whose gap a reader sees through (the earlier
report, kept beside ``OUT/<dir>``, is read until the new one is in place, then removed).

Tiny synthetic checkpoints on disk (``helpers.identity_checkpoints``); array tasks in this process
(``run_sweep_item``).
"""

from __future__ import annotations

import shutil

import pytest

import tl_idempotence as tli
from tl_idempotence.core import store
from tl_idempotence.core.files import sha256_file
from tl_idempotence.studies.sweep import ITEMS_DIR, run_sweep_item
from tl_idempotence.studies.sweep.task import ItemFiles

OPTS = {"nulls": 2, "seed": 1}

pytestmark = pytest.mark.usefixtures("no_array_environment")


@pytest.mark.parametrize("exchange", [True, False], ids=["exchange", "two-renames"])
def test_a_recomputed_item_replaces_its_report_in_one_step(identity_ckpts, tmp_path, monkeypatch, exchange):
    out = tmp_path / "out"
    items = {"a": identity_ckpts["A"]}
    run_sweep_item(items, out, 0, **OPTS)
    heads = out / "a" / "heads.parquet"  # damaged after it was written: the next task measures the item again
    data = bytearray(heads.read_bytes())
    data[len(data) // 2] ^= 0x01
    heads.write_bytes(bytes(data))
    if not exchange:
        monkeypatch.setattr(store, "exchange", lambda a, b: False)
    steps: list[str] = []
    monkeypatch.setattr(store, "step_hook", lambda step, path: steps.append(step))
    row = run_sweep_item(items, out, 0, **OPTS)
    assert row["status"] == "computed" and "unreadable" in row["reason"]
    two = ["rename target to old", "rename new to target"]
    installed = steps[steps.index("done") + 1 :]  # after the report's own save into its temporary folder
    assert installed == ["exchange new and target", *([] if exchange else two), "remove old"]
    assert sorted(p.name for p in out.iterdir()) == sorted([ITEMS_DIR, "a", "sweep.json"])
    res = tli.load_sweep(out)
    assert list(res.tasks["status"]) == ["computed"] and "a" in res.reports


def test_a_report_kept_by_a_stopped_replacement_is_read_until_one_is_in_place(identity_ckpts, tmp_path):
    """What a kill between the two renames leaves: no ``OUT/a``, the earlier report beside it. The sweep reads that
    one (as every loader does) and removes it only once a report is in place again."""
    out = tmp_path / "out"
    items = {"a": identity_ckpts["A"]}
    run_sweep_item(items, out, 0, **OPTS)
    kept = out / f".a{store.OLD_MARK}0123abcd"
    (out / "a").rename(kept)
    files = ItemFiles(out, "a")
    assert files.report_digest() == sha256_file(kept / "report.json")
    res = tli.load_sweep(out)
    assert list(res.tasks["status"]) == ["computed"] and "a" in res.reports
    files.clean_leftovers()
    assert kept.is_dir()  # the only copy of the report
    shutil.copytree(kept, out / "a")
    files.clean_leftovers()
    assert not kept.exists() and (out / "a" / "report.json").is_file()
