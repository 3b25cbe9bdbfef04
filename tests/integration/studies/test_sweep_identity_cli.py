"""A sweep's identity checks through the CLI in fresh processes; the unit tests are
tests/unit/studies/test_sweep_identity.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

import tl_idempotence as tli
from helpers import ARRAY_INDEX_VARIABLES
from tl_idempotence.studies.sweep import ITEMS_DIR, RECORD_NAME, read_sweep_plan, run_sweep_item

CLI = [sys.executable, "-m", "tl_idempotence.cli"]


OPTS = {"nulls": 2, "seed": 1}


CLI_OPTS = ["--nulls", "2", "--seed", "1", "--quiet"]


INDEX_VARIABLES = ARRAY_INDEX_VARIABLES


def run_cli(args):
    env = {k: v for k, v in os.environ.items() if k not in INDEX_VARIABLES}
    env["HF_HUB_OFFLINE"] = "1"
    return subprocess.run([*CLI, *args], capture_output=True, text=True, env=env, timeout=600)


def replace_folder(out: Path, src: str, dst: str) -> None:
    """What the user did: the folder of item ``dst`` replaced by a copy of item ``src``'s."""
    shutil.rmtree(out / dst)
    shutil.copytree(out / src, out / dst)


@pytest.mark.integration  # the CLI in fresh processes
def test_another_items_report_in_an_items_folder_is_never_its_result(identity_ckpts, tmp_path):
    out = tmp_path / "out"
    items = {"a": identity_ckpts["A"], "b": identity_ckpts["B"]}
    for i in (0, 1):
        assert run_sweep_item(items, out, i, **OPTS)["status"] == "computed"
    replace_folder(out, "b", "a")
    with pytest.warns(UserWarning, match=r"1 of 2 sweep items failed: a: ReportMismatchError"):
        res = tli.load_sweep(out)
    st = res.tasks.set_index("label")
    assert list(st["status"]) == ["failed", "computed"]
    assert list(res.reports) == ["b"]  # a's folder holds b's numbers: they are not a's
    fb = res.reports["b"].summary["weights_fingerprint"]
    (row,) = res.failed.to_dict(orient="records")
    assert row["label"] == "a" and row["error_type"] == "ReportMismatchError"
    assert row["message"].startswith(
        f"{out / 'a'} holds a report of 'ckB' (checkpoint 'ckB', weights sha256 {fb[:12]}), "
        f"not of item 'a' (path {identity_ckpts['A']}, whose task measured weights sha256 "
    )
    assert "): the report was measured from checkpoint 'ckB', not from checkpoint 'ckA'." in row["message"]
    assert row["message"].endswith("rerun its task (it measures the item again)")
    # --collect says the same, item by item, and exits 1
    proc = run_cli(["sweep", f"a={identity_ckpts['A']}", f"b={identity_ckpts['B']}", "--out", str(out), "--collect"])
    assert proc.returncode == 1, proc.stderr
    assert "1 item(s) failed:" in proc.stderr
    assert "a: ReportMismatchError: " in proc.stderr and "not from checkpoint 'ckA'" in proc.stderr
    table = proc.stdout.splitlines()
    assert any(line.split()[:1] == ["b"] for line in table) and not any(line.split()[:1] == ["a"] for line in table)
    # its task measures it again, naming both; then the folder holds a's own report
    row = run_sweep_item(items, out, 0, **OPTS)
    assert row["status"] == "computed"
    assert row["reason"] == "the report was measured from checkpoint 'ckB', not from checkpoint 'ckA'"
    res = tli.load_sweep(out)
    assert list(res.tasks["status"]) == ["computed", "computed"] and res.failed.empty
    ref = tli.idempotence_report(identity_ckpts["A"], progress=False, **OPTS)
    pd.testing.assert_frame_equal(res.reports["a"].heads, ref.heads, check_exact=True)


@pytest.mark.integration  # the CLI in fresh processes
def test_a_task_given_another_item_list_is_refused_and_the_plan_is_unchanged(identity_ckpts, tmp_path):
    out = tmp_path / "out"
    first = [f"a={identity_ckpts['A']}", f"b={identity_ckpts['B']}"]
    proc = run_cli(["sweep", *first, "--out", str(out), "--task-index", "0", *CLI_OPTS])
    assert proc.returncode == 0, proc.stderr
    plan = (out / RECORD_NAME).read_bytes()
    other = [f"a={identity_ckpts['A']}", f"c={identity_ckpts['C']}"]
    proc = run_cli(["sweep", *other, "--out", str(out), "--task-index", "1", *CLI_OPTS])
    assert proc.returncode == 2, proc.stderr
    err = " ".join(proc.stderr.split())
    assert f"tl-idempotence: error: OptionError: {out / RECORD_NAME} is the plan of a sweep of other items" in err
    assert "items only in the folder's sweep: ['b']; items only given now: ['c']" in err
    assert "nothing was measured and sweep.json is unchanged" in err and "--replan" in err
    assert (out / RECORD_NAME).read_bytes() == plan
    assert not (out / "c").exists() and not (out / ITEMS_DIR / "c").exists()
    # the same label given another path is another list too
    moved = [f"a={identity_ckpts['A']}", f"b={identity_ckpts['C']}"]
    proc = run_cli(["sweep", *moved, "--out", str(out), "--task-index", "1", *CLI_OPTS])
    assert proc.returncode == 2 and "item 'b' is 'path " in proc.stderr
    assert (out / RECORD_NAME).read_bytes() == plan
    # --collect of the first list still sees item a (b not run yet)
    proc = run_cli(["sweep", *first, "--out", str(out), "--collect"])
    assert proc.returncode == 1 and "b: not measured yet" in proc.stderr
    # --replan says so explicitly: the new list becomes the plan
    proc = run_cli(["sweep", *other, "--out", str(out), "--task-index", "1", "--replan", *CLI_OPTS])
    assert proc.returncode == 0, proc.stderr
    assert [i[0] for i in read_sweep_plan(out).items] == ["a", "c"]
    proc = run_cli(["sweep", *other, "--out", str(out), "--collect", "--replan"])
    assert proc.returncode == 2 and "--replan does not apply with --collect" in proc.stderr


@pytest.mark.integration
def test_a_successful_sweep_writes_no_traceback_on_stderr(identity_ckpts, tmp_path):
    """The Dask route as a user runs it (a fresh process, the default LocalCluster of two workers): exit 0, the
    table on stdout, and nothing of distributed's shutdown on stderr; then the rerun that skips both items."""
    out = tmp_path / "out"
    argv = [
        "sweep",
        f"a={identity_ckpts['A']}",
        f"b={identity_ckpts['B']}",
        "--out",
        str(out),
        "--workers",
        "2",
        *CLI_OPTS,
    ]
    for status in ("computed", "skipped"):
        proc = run_cli(argv)
        assert proc.returncode == 0, proc.stderr
        assert "Traceback" not in proc.stderr and "CommClosedError" not in proc.stderr, proc.stderr
        assert "distributed." not in proc.stderr, proc.stderr
        assert json.loads((out / RECORD_NAME).read_text())["items"][0]["status"] == status


def test_two_checkpoints_of_one_name_are_told_apart_by_their_recorded_weights(identity_ckpts, tmp_path):
    out = tmp_path / "out"
    items = {"s1": identity_ckpts["s1"], "s2": identity_ckpts["s2"]}
    for i in (0, 1):
        run_sweep_item(items, out, i, **OPTS)
    f1 = tli.load_report(out / "s1").summary["weights_fingerprint"]
    f2 = tli.load_report(out / "s2").summary["weights_fingerprint"]
    assert f1 != f2
    assert json.loads((out / ITEMS_DIR / "s1" / "record.json").read_text())["weights_fingerprint"] == f1
    replace_folder(out, "s2", "s1")
    with pytest.warns(UserWarning, match=r"s1: ReportMismatchError"):
        res = tli.load_sweep(out)
    msg = res.failed.set_index("label").loc["s1", "message"]
    assert f"whose task measured weights sha256 {f1[:12]}" in msg
    assert f"the report's weights fingerprint is {f2[:12]}, not {f1[:12]}" in msg
    assert list(res.reports) == ["s2"]
    # the task reads the weights: layer 1 differs, so it measures s1 again
    row = run_sweep_item(items, out, 0, **OPTS)
    assert (row["status"], row["reason"]) == ("computed", "layer 1's attention weights differ (weight fingerprint)")
    assert tli.load_report(out / "s1").summary["weights_fingerprint"] == f1
