"""Sweeps without Dask and sweeps whose workers die.

* Job arrays: ``tl-idempotence sweep ITEMS --out DIR --task-index I`` run as concurrent processes on one
  folder (while a Dask sweep's folder lock is held: array tasks never take it), then ``tli.load_sweep(DIR)``
  and ``--collect``: per-head tables equal to single in-process reports bit for bit.
* What the folder says after array tasks: computed, skipped, failed (a task that raised; a process killed
  mid-item), missing (not run, damaged, other options); ``sweep.json`` files that lie are refused by name.
* A task that ran twice (its first result lost with a worker) is "computed" once, from its record on disk.
* The CLI's items (checkpoint paths labelled by folder, made unique), its bounds (``--workers`` and the
  cores, ``--device``) and its argument conflicts, all before any cluster starts.
* A script without ``if __name__ == "__main__":`` gets one line with the fix, not Dask's tracebacks.
* A sweep with a dying worker, replayed as a user runs it (fresh process, default LocalCluster).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pandas as pd
import pytest

import tl_idempotence as tli
from helpers import ARRAY_INDEX_VARIABLES, gpt2_like, llama_like, neox_like
from tl_idempotence.cli import main
from tl_idempotence.errors import (
    MissingFileError,
    OptionError,
    OptionTypeError,
    ReportFileError,
    UnknownOptionError,
)
from tl_idempotence.studies.compare import Item
from tl_idempotence.studies.sweep import (
    ITEMS_DIR,
    LOCK_NAME,
    RECORD_NAME,
    SweepResult,
    SweepTask,
    array_task_index,
    read_sweep_plan,
    run_sweep_item,
    run_sweep_task,
)

# integration tier: array tasks in fresh processes
pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("no_array_environment")]

CLI = [sys.executable, "-m", "tl_idempotence.cli"]
TESTS = Path(__file__).resolve().parents[2]
INDEX_VARIABLES = ARRAY_INDEX_VARIABLES


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("array_ckpts")
    return {
        "ckA": llama_like(root / "ckA")[0],
        "ckB": neox_like(root / "ckB")[0],
        "ckC": gpt2_like(root / "ckC", n_layers=3)[0],
    }


@pytest.fixture(scope="module")
def reference(ckpts):
    return {k: tli.idempotence_report(p, nulls=4, seed=1, progress=False) for k, p in ckpts.items()}


def assert_same_report(got, ref):
    pd.testing.assert_frame_equal(got.heads, ref.heads, check_exact=True)
    pd.testing.assert_frame_equal(got.layers, ref.layers, check_exact=True)
    for name in ref.tables:
        pd.testing.assert_frame_equal(got.tables[name], ref.tables[name], check_exact=True)


def run_cli(args, env_extra=None, **kw):
    env = {k: v for k, v in os.environ.items() if k not in INDEX_VARIABLES}
    env.update({"HF_HUB_OFFLINE": "1", **(env_extra or {})})
    return subprocess.run([*CLI, *args], capture_output=True, text=True, env=env, timeout=600, **kw)


# --------------------------------------------------------------------------- job arrays


def test_two_array_tasks_at_once_on_one_folder_equal_single_reports(ckpts, reference, tmp_path):
    """Two processes, ``--task-index 0`` and ``1``, started together on one DIR with plain checkpoint paths as
    items, while a Dask sweep's lock on DIR is held (array tasks take only their items' locks); then
    load_sweep and --collect."""
    from filelock import FileLock

    out = tmp_path / "out"
    out.mkdir()
    items = [str(ckpts["ckA"]), str(ckpts["ckB"])]
    opts = ["--nulls", "4", "--seed", "1", "--quiet"]
    env = {k: v for k, v in os.environ.items() if k not in INDEX_VARIABLES}
    with FileLock(str(out / LOCK_NAME)):
        procs = [
            subprocess.Popen(
                [*CLI, "sweep", *items, "--out", str(out), "--task-index", str(i), *opts],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
            )
            for i in (0, 1)
        ]
        results = [p.communicate(timeout=600) for p in procs]
    for p, (_, stderr) in zip(procs, results):
        assert p.returncode == 0, stderr
    assert results[0][0].startswith("ckA: computed (no saved report)"), results[0][0]
    assert results[1][0].startswith("ckB: computed (no saved report)"), results[1][0]
    assert "item 1 of 2, index from argument" in results[1][0]
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # nothing failed, nothing missing, nothing to warn about
        res = tli.load_sweep(out)
    assert type(res) is SweepResult
    assert list(res.reports) == ["ckA", "ckB"]
    assert list(res.tasks["status"]) == ["computed", "computed"]
    assert list(res.tasks["reason"]) == ["no saved report", "no saved report"]
    assert res.failed.empty and res.missing.empty
    assert res.summary["n_computed"] == 2 and res.summary["n_missing"] == 0
    for k in ("ckA", "ckB"):
        assert_same_report(res.reports[k], reference[k])
    # the same comparison object a Dask sweep returns: compare()'s table of the same reports
    pd.testing.assert_frame_equal(
        res.table, tli.compare(res.reports, nulls=4, seed=1, progress=False).table, check_exact=True
    )
    proc = run_cli(["sweep", *items, "--out", str(out), "--collect", *opts])
    assert proc.returncode == 0, proc.stderr
    assert "ckA" in proc.stdout and "ckB" in proc.stdout and "paper (low)" in proc.stdout


def test_an_item_held_by_another_process_is_refused_and_others_run(ckpts, tmp_path):
    from filelock import FileLock

    out = tmp_path / "out"
    items = {"ckA": ckpts["ckA"], "ckB": ckpts["ckB"]}
    (out / ITEMS_DIR / "ckB").mkdir(parents=True)
    with FileLock(str(out / ITEMS_DIR / "ckB" / "lock")):
        with pytest.raises(OptionError, match=r"Item 'ckB' is being measured by another process"):
            run_sweep_item(items, out, 1)
        assert run_sweep_item(items, out, 0)["status"] == "computed"  # another item's lock does not block it
        with pytest.warns(UserWarning, match=r"ckB: being measured now \(its lock is held\)"):
            res = tli.load_sweep(out)
    assert list(res.tasks["status"]) == ["computed", "missing"]
    assert not (out / "ckB").exists()


def test_reruns_skip_and_what_the_folder_says(ckpts, tmp_path):
    out = tmp_path / "out"
    items = {"ckA": ckpts["ckA"], "ckC": ckpts["ckC"], "ckB": ckpts["ckB"]}
    first = run_sweep_item(items, out, 0)
    assert first["status"] == "computed" and first["attempts"] == 1 and first["index_from"] == "argument"
    assert run_sweep_item(items, out, 0)["status"] == "skipped"  # a new run: the saved report matches
    with pytest.warns(UserWarning, match=r"2 of 3 sweep items have no report yet: ckC: not measured yet"):
        res = tli.load_sweep(out)
    assert list(res.tasks["status"]) == ["skipped", "missing", "missing"]
    assert list(res.missing["label"]) == ["ckC", "ckB"] and list(res.reports) == ["ckA"]
    run_sweep_item(items, out, 1)
    # damaged after writing: its table no longer matches its recorded sha256 -> missing, named
    heads = out / "ckC" / "heads.parquet"
    data = bytearray(heads.read_bytes())
    data[len(data) // 2] ^= 0x01
    heads.write_bytes(bytes(data))
    with pytest.warns(UserWarning, match=r"ckC: its saved report is unreadable \(ReportFileError"):
        res = tli.load_sweep(out)
    assert res.tasks.set_index("label").loc["ckC", "status"] == "missing"
    # rerunning its task repairs it ("the saved report is unreadable" is the reason it was computed)
    row = run_sweep_item(items, out, 1)
    assert row["status"] == "computed" and "unreadable" in row["reason"]
    # item 2 measured with other options: the plan now says nulls=2; item 0's report (nulls=0) is not used
    run_sweep_item(items, out, 2, nulls=2)
    assert read_sweep_plan(out).options["nulls"] == 2
    with pytest.warns(UserWarning, match=r"made with other options \(nulls 0, the sweep asks 2\)"):
        res = tli.load_sweep(out)
    assert list(res.tasks["status"]) == ["missing", "missing", "computed"]
    assert list(res.reports) == ["ckB"] and res.options.nulls == 2


class Dies:
    """An item whose process dies mid-item (what an OOM or wall-time kill looks like)."""

    def __call__(self):
        os._exit(9)


def test_an_array_task_killed_mid_item_is_listed_as_failed(ckpts, tmp_path):
    """A process killed while it measures its item leaves a start marker: load_sweep lists the item as
    WorkerDied (when, where, which pid), and the next run of that index says an earlier attempt died."""
    out = tmp_path / "out"
    script = tmp_path / "task.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import os
            from tl_idempotence.studies.sweep import run_sweep_item


            class Dies:
                def __call__(self):
                    os._exit(9)


            if __name__ == "__main__":
                run_sweep_item({{"ckA": {str(ckpts["ckA"])!r}, "dies": Dies()}}, {str(out)!r}, 1)
            """
        )
    )
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=600, env={**os.environ}
    )
    assert proc.returncode == 9, proc.stderr
    items = {"ckA": ckpts["ckA"], "dies": Dies()}
    run_sweep_item(items, out, 0)
    with pytest.warns(UserWarning, match="1 of 2 sweep items failed: dies: WorkerDied"):
        res = tli.load_sweep(out)
    f = res.failed.set_index("label")
    assert list(f.index) == ["dies"] and f.loc["dies", "error_type"] == "WorkerDied"
    assert "the process measuring it died: started " in f.loc["dies", "message"]
    assert "never finished" in f.loc["dies", "message"] and "(pid " in f.loc["dies", "message"]
    assert list(res.tasks["status"]) == ["computed", "failed"] and list(res.reports) == ["ckA"]


class Flaky:
    """Raises on its first call in a process, returns the checkpoint after."""

    calls = 0

    def __init__(self, path):
        self.path = str(path)

    def __call__(self):
        type(self).calls += 1
        if type(self).calls == 1:
            raise RuntimeError("transient")
        return self.path


def test_array_task_retries_and_failures(ckpts, tmp_path):
    out = tmp_path / "out"
    Flaky.calls = 0
    items = {"flaky": Flaky(ckpts["ckA"]), "broken": lambda: (_ for _ in ()).throw(ValueError("broken for good"))}
    row = run_sweep_item(items, out, 0, retries=1)
    assert row["status"] == "computed" and row["attempts"] == 2
    with pytest.raises(tli.errors.ItemError, match="broken for good"):
        run_sweep_item(items, out, 1, retries=0)
    with pytest.warns(UserWarning, match="1 of 2 sweep items failed: broken: ItemError"):
        res = tli.load_sweep(out)
    assert list(res.tasks["status"]) == ["computed", "failed"]
    assert "broken for good" in res.failed.set_index("label").loc["broken", "message"]


def test_a_task_that_ran_twice_is_computed_once(ckpts, tmp_path):
    """What a rescheduled Dask task sees: its first run saved the report and its record, then the result was
    lost with the worker. The second run of the same sweep run is "computed" (nothing recomputed); a later
    sweep run is "skipped"."""
    from tl_idempotence.analyses.report_options import ReportOptions

    record = {k: v for k, v in ReportOptions(nulls=4, seed=1).as_dict().items() if k != "device"}
    item = Item("ckA", "path", Path(ckpts["ckA"]))
    task = SweepTask(item, "ckA", str(tmp_path), record, "cpu", run="0123456789ab")
    first = run_sweep_task(task, 1)
    mtime = (tmp_path / "ckA" / "report.json").stat().st_mtime_ns
    second = run_sweep_task(task, 2)
    assert (first["status"], second["status"]) == ("computed", "computed")
    assert second["reason"] == first["reason"] == "no saved report"
    assert second["report_sha256"] == first["report_sha256"]
    assert (tmp_path / "ckA" / "report.json").stat().st_mtime_ns == mtime  # not measured again
    later = SweepTask(item, "ckA", str(tmp_path), record, "cpu", run="ba9876543210")
    assert run_sweep_task(later, 1)["status"] == "skipped"
    assert not list((tmp_path / ITEMS_DIR / "ckA").glob("started-*"))  # every attempt removed its marker


# --------------------------------------------------------------------------- the plan and hostile folders


def test_load_sweep_refuses_lying_folders_by_name(ckpts, tmp_path):
    out = tmp_path / "out"
    items = {"ckA": ckpts["ckA"], "ckB": ckpts["ckB"]}
    run_sweep_item(items, out, 0)
    plan = json.loads((out / RECORD_NAME).read_text())
    assert plan["format"] == "tl_idempotence.sweep/2" and [i["dir"] for i in plan["items"]] == ["ckA", "ckB"]
    assert plan["items"][0]["item"] == f"path {Path(ckpts['ckA']).absolute()}"
    good = (out / RECORD_NAME).read_text()
    for bad, match in [
        ("{", "not valid JSON"),
        (json.dumps({**plan, "format": "x"}), "not a sweep record of a known format"),
        (json.dumps({**plan, "items": [{**plan["items"][0], "dir": "../../etc"}]}), "gives item 'ckA' the folder"),
        (json.dumps({**plan, "items": plan["items"] + plan["items"]}), "lists one folder twice"),
        (json.dumps({**plan, "items": []}), "has no list of items"),
        (json.dumps({**plan, "options": {**plan["options"], "threshold": 5}}), "options that are not valid"),
        (json.dumps({**plan, "options": {**plan["options"], "nul": 1}}), "options that are not valid"),
    ]:
        (out / RECORD_NAME).write_text(bad)
        with pytest.raises(ReportFileError, match=match) as e:
            tli.load_sweep(out)
        assert str(out / RECORD_NAME) in str(e.value)
    (out / RECORD_NAME).write_text(good)
    # a task record that lies is not trusted: the (verified) report is used, the reason says why
    (out / ITEMS_DIR / "ckA" / "record.json").write_text('{"status": "computed"')
    with pytest.warns(UserWarning, match="ckB: not measured yet"):
        res = tli.load_sweep(out)
    row = res.tasks.set_index("label").loc["ckA"]
    assert row["status"] == "computed" and "record.json is not valid JSON" in row["reason"]
    with pytest.raises(OptionError, match=r"sweep of other items: items only given now: \['ckC'\]"):
        tli.load_sweep(out, items={**items, "ckC": ckpts["ckC"]})
    with pytest.raises(OptionError, match="item 'ckB' is 'path "):
        tli.load_sweep(out, items={"ckA": ckpts["ckA"], "ckB": ckpts["ckC"]})
    with pytest.raises(MissingFileError, match="no sweep has started"):
        tli.load_sweep(tmp_path)
    with pytest.raises(MissingFileError, match="is not a folder"):
        tli.load_sweep(tmp_path / "nothing")
    with pytest.raises(OptionTypeError, match="out must be a folder path"):
        tli.load_sweep(123)
    with pytest.raises(UnknownOptionError, match="did you mean 'items'"):
        tli.load_sweep(out, item=items)


@pytest.mark.parametrize(
    "kwargs, err, match",
    [
        ({"index": 2}, OptionError, r"Task index 2 \(argument\) is outside the 2 items"),
        ({"index": -1}, OptionError, "index must be >= 0"),
        ({"index": 1.0}, OptionTypeError, "index"),
        ({"index": None}, OptionError, "No task index given and none of SLURM_ARRAY_TASK_ID"),
        ({"retries": -1}, OptionError, "retries must be >= 0"),
        ({"device": "cuda:7"}, tli.errors.DeviceError, "cuda"),
        ({"nulls": "x"}, OptionTypeError, "nulls"),
        ({"retrys": 1}, UnknownOptionError, "did you mean 'retries'"),
    ],
)
def test_run_sweep_item_refuses_bad_arguments_before_any_work(ckpts, tmp_path, kwargs, err, match):
    with pytest.raises(err, match=match):
        run_sweep_item({"ckA": ckpts["ckA"], "ckB": ckpts["ckB"]}, tmp_path / "out", **{"index": 0, **kwargs})
    assert not (tmp_path / "out").exists()


def test_array_index_from_the_scheduler_environment(ckpts, tmp_path, monkeypatch, capsys):
    assert array_task_index({}) is None
    assert array_task_index({"SLURM_ARRAY_TASK_ID": "3"}) == (3, "SLURM_ARRAY_TASK_ID=3")
    assert array_task_index({"PBS_ARRAY_INDEX": "0"}) == (0, "PBS_ARRAY_INDEX=0")
    assert array_task_index({"PBS_ARRAYID": "2"}) == (2, "PBS_ARRAYID=2")
    assert array_task_index({"LSB_JOBINDEX": "1"}) == (0, "LSB_JOBINDEX=1")  # LSF counts from 1
    assert array_task_index({"LSB_JOBINDEX": "0"}) is None  # LSF outside an array
    assert array_task_index({"SGE_TASK_ID": "undefined"}) is None
    assert array_task_index({"SGE_TASK_ID": "2"}) == (1, "SGE_TASK_ID=2")
    assert array_task_index({"SLURM_ARRAY_TASK_ID": "1", "LSB_JOBINDEX": "5"}) == (1, "SLURM_ARRAY_TASK_ID=1")
    for env, match in [
        ({"SLURM_ARRAY_TASK_ID": "abc"}, "is not an array task index"),
        ({"SLURM_ARRAY_TASK_ID": "-1"}, "start at 0"),
        ({"SGE_TASK_ID": "0"}, "start at 1"),
    ]:
        with pytest.raises(OptionError, match=match):
            array_task_index(env)
    out = tmp_path / "out"
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "1")
    assert main(["sweep", str(ckpts["ckA"]), str(ckpts["ckB"]), "--out", str(out), "--task-index", "--quiet"]) == 0
    line = capsys.readouterr().out
    assert line.startswith("ckB: computed") and "index from SLURM_ARRAY_TASK_ID=1" in line
    assert (out / "ckB" / "report.json").is_file() and not (out / "ckA").exists()
    monkeypatch.delenv("SLURM_ARRAY_TASK_ID")
    monkeypatch.setenv("LSB_JOBINDEX", "1")
    assert main(["sweep", str(ckpts["ckA"]), str(ckpts["ckB"]), "--out", str(out), "--task-index", "--quiet"]) == 0
    assert capsys.readouterr().out.startswith("ckA: computed")


# --------------------------------------------------------------------------- the CLI


def test_checkpoint_paths_are_items_labelled_by_folder(ckpts, tmp_path, capsys):
    runs = tmp_path / "runs"
    for seed in ("seed1", "seed2"):
        shutil.copytree(ckpts["ckA"], runs / seed / "step200")
    out = tmp_path / "out"
    argv = [str(runs / "seed1" / "step200"), str(runs / "seed2" / "step200"), f"B={ckpts['ckB']}", str(ckpts["ckC"])]
    for i in range(4):
        assert main(["sweep", *argv, "--out", str(out), "--task-index", str(i), "--quiet"]) == 0
    capsys.readouterr()
    assert [i[0] for i in read_sweep_plan(out).items] == ["seed1_step200", "seed2_step200", "B", "ckC"]
    with pytest.warns(UserWarning, match="identical measured weights"):  # the two copies hold the same heads
        assert main(["sweep", *argv, "--out", str(out), "--collect"]) == 0
    table = capsys.readouterr().out
    assert all(lab in table for lab in ("seed1_step200", "seed2_step200", "B", "ckC"))


def usage_error(argv, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    return capsys.readouterr().err


def test_cli_sweep_usage_errors_exit_2_before_any_work(ckpts, tmp_path, capsys, monkeypatch, no_dask_cluster):
    ck = str(ckpts["ckA"])
    out = str(tmp_path / "out")
    for argv, fragment in [
        ([ck, "--out", out, "--task-index", "0", "--workers", "2"], "--workers does not apply with --task-index"),
        ([ck, "--out", out, "--task-index", "0", "--collect"], "--collect does not apply with --task-index"),
        ([ck, "--out", out, "--task-index", "0", "--html", str(tmp_path / "p.html")], "--html does not apply"),
        ([ck, "--out", out, "--collect", "--scheduler", "tcp://x:1"], "--scheduler does not apply with --collect"),
        ([ck, "--out", out, "--task-index", "x"], "--task-index: not an integer"),
        ([ck, "--out", out, "--task-index", "-1"], "--task-index: must be >= 0"),
        ([ck, "--out", out, "--worker-timeout", "0"], "--worker-timeout: must be in [1, 604800]"),
        ([ck, "--out", out, "--worker-timeout", "nan"], "--worker-timeout: must be in [1, 604800]"),
        ([ck, "--out", out, "--retries", "-1"], "--retries: must be >= 0"),
        (["runs/a=x", "--out", out], "the label 'runs/a' holds a path separator"),
        ([ck, ck, "--out", out], "are the same checkpoint"),
        ([f"A={ck}", f"A={ckpts['ckB']}", "--out", out], "would both be labelled 'A'"),
        (["./no-such-ckpt", "--out", out], "no such file or folder"),
        ([ck, "--out", out, "--collect"], "--collect: " + out + " is not a folder: no sweep to read there"),
        ([ck, "--out", ck], f"--out {ck} is the checkpoint {ck}"),  # the reports never go into an item's folder
    ]:
        err = usage_error(["sweep", *argv], capsys)
        assert fragment in err, (argv, err)
    # checked by the library, still exit 2 and still before a cluster or a folder exists
    for argv, env, fragment in [
        ([ck, "--out", out, "--workers", "1000"], {}, "more worker processes than the"),
        ([ck, "--out", out, "--task-index", "5"], {}, "Task index 5 (argument) is outside the 1 items"),
        ([ck, "--out", out, "--task-index"], {}, "No task index given"),
        ([ck, "--out", out, "--task-index"], {"SLURM_ARRAY_TASK_ID": "x"}, "SLURM_ARRAY_TASK_ID='x' is not"),
        ([ck, "--out", out, "--device", "cuda:9"], {}, "cuda:9"),
    ]:
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        code = main(["sweep", *argv, "--quiet"])
        for k in env:
            monkeypatch.delenv(k)
        err = capsys.readouterr().err
        assert code == 2, (argv, err)
        assert fragment in err, (argv, err)
    assert not Path(out).exists()
    assert no_dask_cluster == []  # no cluster was started


def test_collect_takes_the_folders_options(ckpts, tmp_path, capsys):
    out = str(tmp_path / "out")
    ck = str(ckpts["ckA"])
    assert main(["sweep", ck, "--out", out, "--task-index", "0", "--nulls", "2", "--quiet"]) == 0
    capsys.readouterr()
    assert main(["sweep", ck, "--out", out, "--collect"]) == 0  # options left out: the folder's
    assert "ckA" in capsys.readouterr().out
    err = usage_error(["sweep", ck, "--out", out, "--collect", "--nulls", "3"], capsys)
    assert "--nulls 3: the sweep in" in err and "was made with 2" in err
    err = usage_error(["sweep", ck, "--out", out, "--collect", "--device", "cuda"], capsys)
    assert "--device cuda" in err
    code = main(["sweep", str(ckpts["ckB"]), "--out", out, "--collect"])
    assert code == 2 and "is a sweep of other items" in capsys.readouterr().err


# --------------------------------------------------------------------------- the __main__ guard


UNGUARDED = """
import sys
sys.path.insert(0, {tests!r})
import tl_idempotence as tli

{call}
"""


@pytest.mark.parametrize(
    "call",
    [
        "tli.sweep({{'A': {ck!r}}}, {out!r}, workers=1, progress=False)",
        "def main():\n    tli.sweep({{'A': {ck!r}}}, {out!r}, workers=1, progress=False)\n\nmain()",
    ],
    ids=["top-level", "function-called-at-top-level"],
)
def test_a_script_without_the_main_guard_gets_one_line(ckpts, tmp_path, call):
    script = tmp_path / "my_sweep.py"
    out = tmp_path / "out"
    script.write_text(UNGUARDED.format(tests=str(TESTS), call=call.format(ck=str(ckpts["ckA"]), out=str(out))))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("tl_idempotence.errors.ClusterError: ")
    assert f"{script}, line " in last and 'put the call under `if __name__ == "__main__":`' in last
    # Python's traceback of the user's call and one line of answer, instead of ~480 lines from Dask's nannies
    assert "Nanny" not in proc.stderr and len(proc.stderr.splitlines()) < 30, proc.stderr
    assert not out.exists()  # refused before anything was made


def test_the_main_guard_check_reads_the_script():
    from tl_idempotence.studies.cluster import main_guard_problem

    # pytest's own __main__ is guarded; this call is not at a script's top level
    assert main_guard_problem("tli.sweep()") is None
    from tl_idempotence.studies import cluster

    src = 'x = 1\nif "__main__" == __name__:\n    run()\n    more()\nelse:\n    other()\n'
    assert cluster._guarded_lines(src) == [(3, 4)]
    assert cluster._guarded_lines("if __name__ != '__main__':\n    run()\n") == []


# --------------------------------------------------------------------------- the dying worker, as a user runs it


DYING = """
import json, os, sys, time, warnings
import tl_idempotence as tli


def dies():
    os._exit(1)


if __name__ == "__main__":
    items = {items!r}
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = tli.sweep({{**items, "dies": dies}}, out={out!r}, workers=2, progress=False, nulls=4, seed=1)
    print(json.dumps({{
        "seconds": time.perf_counter() - t0,
        "tasks": res.tasks[["label", "status", "reason", "attempts"]].to_dict(orient="records"),
        "failed": res.failed.to_dict(orient="records"),
        "reports": list(res.reports),
    }}))
"""


@pytest.mark.slow
def test_a_dying_worker_fails_only_its_item(ckpts, reference, tmp_path):
    """A worker that dies: ``tli.sweep({"good0": ck0, "good1": ck1, "good2": ck2, "dies": f}, out=NEW_DIR,
    workers=2)`` where ``f`` calls ``os._exit(1)`` on the worker, in a fresh process: it ends within 3 minutes,
    ``.failed`` is exactly the dying item (WorkerDied, exit status 1), the healthy items are computed and
    equal to single in-process reports."""
    items = {"good0": str(ckpts["ckA"]), "good1": str(ckpts["ckB"]), "good2": str(ckpts["ckC"])}
    out = tmp_path / "out"
    script = tmp_path / "dying.py"
    script.write_text(DYING.format(items=items, out=str(out)))
    # "ends within 3 minutes": a hang raises TimeoutExpired (a bound on a hang, not a measurement)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    status = {t["label"]: t["status"] for t in got["tasks"]}
    assert status == {"good0": "computed", "good1": "computed", "good2": "computed", "dies": "failed"}
    assert [f["label"] for f in got["failed"]] == ["dies"]
    (f,) = got["failed"]
    assert f["error_type"] == "WorkerDied"
    assert f["message"].count("exited with status 1") == 3 and "3 attempt(s), retries=2" in f["message"]
    assert got["reports"] == ["good0", "good1", "good2"]
    for label, key in (("good0", "ckA"), ("good1", "ckB"), ("good2", "ckC")):
        assert_same_report(tli.load_report(out / label), reference[key])
    # the folder says the same afterwards
    with pytest.warns(UserWarning, match="dies: WorkerDied"):
        again = tli.load_sweep(out)
    assert list(again.tasks["status"]) == ["computed", "computed", "computed", "failed"]
