"""Sweeps on a real Dask cluster: a ``distributed.LocalCluster`` with 2 worker processes (started once for
the module) on small checkpoints written here.

What is checked: the sweep's per-head tables equal single-process reports bit for bit; a task that raises
once is retried and succeeds; a task that always fails lands in ``.failed`` (after exactly ``retries + 1``
attempts) while the others are kept; a rerun skips only items whose saved report matches their current
weights and options — a deleted, half-written or damaged report folder, a changed checkpoint layer or other
options are recomputed; trajectories run the same way; every argument is checked before a cluster starts.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import subprocess
import sys
from pathlib import Path

import cloudpickle
import pandas as pd
import pytest
from safetensors.torch import load_file, save_file

import tl_idempotence as tli
from helpers import gpt2_like, llama_like, neox_like
from tl_idempotence.errors import OptionError, OptionTypeError, UnknownOptionError
from tl_idempotence.studies.sweep import (
    LOCK_NAME,
    RECORD_NAME,
    item_dirname,
    saved_report_matches,
    sweep,
)

# The callables below are defined in this test module, which the worker processes cannot import:
# ship them by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

OPTS = {"nulls": 4, "seed": 1}
# checkpoints B and C hold the same heads (asserted where it matters); elsewhere that warning is expected
# integration tier: Dask clusters
pytestmark = [
    pytest.mark.filterwarnings("ignore:Models with identical measured weights:UserWarning"),
    pytest.mark.integration,
]


class FlakyOnce:
    """An item that raises on its first call (leaving a marker file) and returns its checkpoint path after."""

    def __init__(self, path: Path, marker: Path):
        self.path, self.marker = str(path), str(marker)

    def __call__(self):
        m = Path(self.marker)
        if not m.exists():
            m.write_text("failed once")
            raise RuntimeError("transient failure (first attempt)")
        return self.path


class AlwaysFails:
    """An item that records every attempt in a file and always raises."""

    def __init__(self, log: Path):
        self.log = str(log)

    def __call__(self):
        with open(self.log, "a") as f:
            f.write("attempt\n")
        raise ValueError("this checkpoint is broken for good")


@pytest.fixture(scope="module")
def client():
    import dask
    from distributed import Client, LocalCluster

    # as docs/sweeps.md advises for a cluster of one's own: a worker restart on a loaded machine can take more
    # than Dask's 15 s lost-worker-timeout, after which the LocalCluster would drop that worker for good
    with dask.config.set({"distributed.deploy.lost-worker-timeout": "10 minutes"}):
        cluster = LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0", silence_logs=logging.ERROR
        )
        c = Client(cluster)
        yield c
        c.close()
        cluster.close()


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("sweep_ckpts")
    return {
        "A": llama_like(root / "ckA")[0],
        "B": neox_like(root / "ckB")[0],
        "C": gpt2_like(root / "ckC")[0],
        "D": llama_like(root / "ckD", n_layers=2, nq=4, nkv=4, dm=40)[0],
    }


@pytest.fixture(scope="module")
def reference(ckpts):
    """Single-process reports of every checkpoint, made with the same options."""
    return {k: tli.idempotence_report(p, **OPTS, progress=False) for k, p in ckpts.items()}


def assert_same_report(got, ref):
    pd.testing.assert_frame_equal(got.heads, ref.heads, check_exact=True)
    pd.testing.assert_frame_equal(got.layers, ref.layers, check_exact=True)
    assert sorted(got.tables) == sorted(ref.tables)
    for name in ref.tables:
        pd.testing.assert_frame_equal(got.tables[name], ref.tables[name], check_exact=True)


def mtimes(out: Path) -> dict[str, float]:
    return {p.parent.name: p.stat().st_mtime_ns for p in out.glob("*/report.json")}


def test_sweep_equals_single_process_bit_for_bit(client, ckpts, reference, tmp_path):
    out = tmp_path / "out"
    with pytest.warns(UserWarning, match=r"identical measured weights .*\[\['B', 'C'\]\]"):
        res = sweep(ckpts, out, client=client, progress=False, **OPTS)
    assert list(res.tasks["status"]) == ["computed"] * 4
    assert list(res.reports) == ["A", "B", "C", "D"]
    assert res.failed.empty
    for k, ref in reference.items():
        assert_same_report(res.reports[k], ref)
        assert (out / k / "report.json").is_file()
    # two worker processes shared the work
    assert res.tasks["pid"].nunique() == 2
    # the combined table is compare()'s table of the same reports (n_params from the checkpoint headers)
    expected = tli.compare(dict(ckpts), **OPTS, progress=False).table
    pd.testing.assert_frame_equal(res.table, expected, check_exact=True)
    n_params = sum(t.numel() for f in Path(ckpts["A"]).glob("*.safetensors") for t in load_file(f).values())
    assert res.table.set_index("model").loc["A", "n_params"] == n_params
    heads = res.heads[res.heads["model"] == "B"].drop(columns=["model", "head_label"]).reset_index(drop=True)
    pd.testing.assert_frame_equal(heads, reference["B"].heads.reset_index(drop=True), check_exact=True)
    # B (GPT-NeoX fused qkv) and C (GPT-2 Conv1D) hold the same random heads in two layouts: same weights
    t = res.table.set_index("model")
    assert list(t["identical_weights"][:4]) == [False, True, True, False]
    assert list(t["weights_group"][:4]) == [1, 2, 2, 3]
    rec = json.loads((out / RECORD_NAME).read_text())
    assert [i["status"] for i in rec["items"]] == ["computed"] * 4
    assert rec["options"]["nulls"] == 4
    assert "n_computed=4" in repr(res)
    # the page never goes over an item's checkpoint file or the sweep's own plan
    for path, says in [(ckpts["A"] / "config.json", "a file of the checkpoint of item 'A'"), (out / RECORD_NAME, "")]:
        with pytest.raises(tli.errors.OutputOverInputError, match="which this run reads") as e:
            res.save_html(path)
        assert says in str(e.value) and "a file of the" in str(e.value)
    assert json.loads((out / RECORD_NAME).read_text()) == rec


def test_rerun_finishes_only_missing_damaged_or_changed_items(client, ckpts, reference, tmp_path):
    out = tmp_path / "out"
    sweep(ckpts, out, client=client, progress=False, **OPTS)
    before = mtimes(out)
    shutil.rmtree(out / "A")  # killed before A was written
    (out / "B" / "report.json").unlink()  # half-written: tables but no record
    heads = out / "C" / "heads.parquet"  # damaged after writing: sha256 no longer matches
    data = bytearray(heads.read_bytes())
    data[len(data) // 2] ^= 0x01
    heads.write_bytes(bytes(data))
    (out / ".tli-tmp-D-deadbeef").mkdir()  # a temp folder left by a killed task
    res = sweep(ckpts, out, client=client, progress=False, **OPTS)
    st = res.tasks.set_index("label")
    assert st.loc["A", "status"] == "computed" and st.loc["A", "reason"] == "no saved report"
    assert st.loc["B", "status"] == "computed" and st.loc["B", "reason"] == "no report.json"
    assert st.loc["C", "status"] == "computed" and "unreadable" in st.loc["C", "reason"]
    assert st.loc["D", "status"] == "skipped"
    assert mtimes(out)["D"] == before["D"]  # D was not rewritten
    assert not (out / ".tli-tmp-D-deadbeef").exists()
    for k, ref in reference.items():
        assert_same_report(res.reports[k], ref)
    # a third run has nothing to do
    res = sweep(ckpts, out, client=client, progress=False, **OPTS)
    assert list(res.tasks["status"]) == ["skipped"] * 4
    for k, ref in reference.items():
        assert_same_report(res.reports[k], ref)
    # other options: everything is recomputed, with the new options
    res = sweep(ckpts, out, client=client, progress=False, nulls=4, seed=2)
    assert list(res.tasks["status"]) == ["computed"] * 4
    assert all(r.startswith("options differ: seed 1 -> 2") for r in res.tasks["reason"])
    assert all(rep.options.seed == 2 for rep in res.reports.values())


def test_changed_checkpoint_is_recomputed(client, tmp_path):
    ck = {"A": llama_like(tmp_path / "ckA")[0], "D": llama_like(tmp_path / "ckD", n_layers=2)[0]}
    out = tmp_path / "out"
    first = sweep(ck, out, client=client, progress=False, **OPTS)
    # re-save checkpoint A with layer 2's value weights changed (same names, shapes and dtype)
    name = "model.layers.2.self_attn.v_proj.weight"
    shard = next(f for f in Path(ck["A"]).glob("*.safetensors") if name in load_file(f))
    tensors = load_file(shard)
    tensors[name] = tensors[name] * 1.5 + 0.01
    save_file(tensors, str(shard), metadata={"format": "pt"})
    res = sweep(ck, out, client=client, progress=False, **OPTS)
    st = res.tasks.set_index("label")
    assert st.loc["A", "status"] == "computed"
    assert st.loc["A", "reason"] == "layer 2's attention weights differ (weight fingerprint)"
    assert st.loc["D", "status"] == "skipped"
    fresh = tli.idempotence_report(ck["A"], **OPTS, progress=False)
    assert_same_report(res.reports["A"], fresh)
    old, new = first.reports["A"].heads, res.reports["A"].heads
    pd.testing.assert_frame_equal(old[old["layer"] < 2], new[new["layer"] < 2], check_exact=True)
    assert not (old.loc[old["layer"] == 2, "P"].to_numpy() == new.loc[new["layer"] == 2, "P"].to_numpy()).any()


def test_retried_and_failed_tasks(client, ckpts, reference, tmp_path):
    out = tmp_path / "out"
    items = {
        "flaky": FlakyOnce(ckpts["A"], tmp_path / "marker"),
        "broken": AlwaysFails(tmp_path / "attempts.log"),
        "bad-config": tmp_path / "bad",
        "D": ckpts["D"],
    }
    shutil.copytree(ckpts["D"], tmp_path / "bad")
    (tmp_path / "bad" / "config.json").write_text("[1, 2")
    with pytest.warns(UserWarning, match=r"2 of 4 sweep items failed after 1 retries"):
        res = sweep(items, out, client=client, retries=1, progress=False, **OPTS)
    st = res.tasks.set_index("label")["status"].to_dict()
    assert st == {"flaky": "computed", "broken": "failed", "bad-config": "failed", "D": "computed"}
    assert (tmp_path / "marker").read_text() == "failed once"  # the first attempt did fail
    assert (tmp_path / "attempts.log").read_text().count("attempt") == 2  # 1 try + 1 retry
    f = res.failed.set_index("label")
    # the callable's own error, named with its item (ItemError; the ValueError is chained on the worker)
    assert f.loc["broken", "error_type"] == "ItemError"
    assert f.loc["broken", "message"] == (
        "The callable of item 'broken' (callable AlwaysFails) raised ValueError: this checkpoint is broken for good"
    )
    assert f.loc["bad-config", "error_type"] == "CheckpointError"
    assert "config.json" in f.loc["bad-config", "message"] and "not valid JSON" in f.loc["bad-config", "message"]
    assert list(res.reports) == ["flaky", "D"]
    assert_same_report(res.reports["flaky"], reference["A"])
    assert_same_report(res.reports["D"], reference["D"])
    assert list(res.table["model"]) == ["flaky", "D", "paper (low)", "paper (high)"]
    assert not (out / "broken").exists()
    rec = json.loads((out / RECORD_NAME).read_text())
    assert {r["label"] for r in rec["failed"]} == {"broken", "bad-config"}


def test_a_sweep_where_everything_failed_still_reports(client, tmp_path):
    with pytest.warns(UserWarning, match="1 of 1 sweep items failed after 0 retries"):
        res = sweep(
            {"broken": AlwaysFails(tmp_path / "log")}, tmp_path / "out", client=client, retries=0, progress=False
        )
    assert res.reports == {} and list(res.failed["label"]) == ["broken"]
    assert list(res.table["model"]) == ["paper (low)", "paper (high)"]
    assert "No model finished" in Path(res.save_html(tmp_path / "page.html")).read_text(encoding="utf-8")
    assert res.summary["n_failed"] == 1 and res.summary["n_models"] == 0


def test_trajectory_on_the_cluster_equals_serial(client, ckpts, tmp_path):
    copy = tmp_path / "ckA_copy"
    shutil.copytree(ckpts["A"], copy)
    points = [("step0", ckpts["A"]), ("step1", copy), ("step2", ckpts["A"])]
    with pytest.warns(UserWarning, match="identical"):
        serial = tli.trajectory(points, nulls=4, progress=False)
    with pytest.warns(UserWarning, match="identical"):
        dist = tli.trajectory(points, nulls=4, progress=False, client=client, cache_dir=tmp_path / "cache")
    pd.testing.assert_frame_equal(dist.heads, serial.heads, check_exact=True)
    assert list(dist.checkpoints["identical_to"]) == ["", "step0", "step0"]
    assert len(list((tmp_path / "cache").glob("*/manifest.json"))) == 3
    # one cache, whichever route fills it: the serial route reuses what the cluster wrote, layer for layer
    with pytest.warns(UserWarning, match="identical"):
        again = tli.trajectory(points, nulls=4, progress=False, cache_dir=tmp_path / "cache")
    assert again.checkpoints["cached"].all()
    assert len(list((tmp_path / "cache").glob("*/manifest.json"))) == 3
    pd.testing.assert_frame_equal(again.heads, serial.heads, check_exact=True)
    with pytest.raises(OptionError, match="not paths"):
        tli.trajectory([("a", lambda: ckpts["A"])], client=client, progress=False)
    with pytest.raises(OptionError, match="cannot be combined"):
        tli.trajectory(points, client=client, loader=lambda spec: spec, progress=False)


def test_saved_report_matches_reads_current_weights(ckpts, tmp_path):
    rep = tli.idempotence_report(ckpts["D"], **OPTS, progress=False)
    rep.save(tmp_path / "D")
    opts = rep.options
    assert saved_report_matches(tmp_path / "D", ckpts["D"], opts) is None
    other = tli.ReportOptions(nulls=4, seed=1, threshold=0.5)
    assert saved_report_matches(tmp_path / "D", ckpts["D"], other) == "options differ: threshold 0.9 -> 0.5"
    # another checkpoint: named by what the saved report records and what the source reads
    assert saved_report_matches(tmp_path / "D", ckpts["A"], opts) == (
        "the report was measured from checkpoint 'ckD', not from checkpoint 'ckA'"
    )
    shutil.copytree(ckpts["A"], tmp_path / "elsewhere" / "ckD")  # the same folder name, other sizes
    assert saved_report_matches(tmp_path / "D", tmp_path / "elsewhere" / "ckD", opts).startswith(
        "model sizes differ: n_layers 2 vs 3"
    )
    part = tli.ReportOptions(nulls=4, seed=1, layers=[0])
    assert saved_report_matches(tmp_path / "D", ckpts["D"], part).startswith("options differ: layers")
    (tmp_path / "D" / "layers.parquet").write_bytes(b"junk")
    assert "unreadable" in saved_report_matches(tmp_path / "D", ckpts["D"], opts)
    assert saved_report_matches(tmp_path / "nothing", ckpts["D"], opts) == "no report.json"


def test_the_device_is_recorded_and_keys_reuse(client, ckpts, tmp_path):
    out = tmp_path / "out"
    res = sweep({"D": ckpts["D"]}, out, client=client, progress=False, device="auto", **OPTS)
    # "auto" is resolved on the workers (no GPU here): every record says what the numbers were computed on
    assert res.tasks["device"].tolist() == ["cpu"]
    assert res.options.device.type == "cpu" and res.summary["device"] == "cpu" and res.device == "auto"
    rec = json.loads((out / RECORD_NAME).read_text())
    assert rec["options"]["device"] == "cpu" and rec["device_asked"] == "auto"
    assert [i["device"] for i in rec["items"]] == ["cpu"]
    # a saved report computed on another device is not reused (the device changes the last bits)
    opts = tli.ReportOptions(**OPTS)
    assert saved_report_matches(out / "D", ckpts["D"], opts) is None
    on_gpu = tli.ReportOptions.from_record({**opts.as_dict(), "device": "cuda"})
    assert saved_report_matches(out / "D", ckpts["D"], on_gpu) == "options differ: device 'cpu' -> 'cuda'"


def test_labels_that_are_paths_or_reserved_names_are_refused(ckpts, tmp_path):
    for label in ("sweep", "Sweep.JSON", ".tli-sweep.lock", "runs/a", "runs\\a"):
        with pytest.raises(OptionError, match=r"path separator|keeps for itself"):
            sweep({label: ckpts["A"]}, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()  # refused before the folder was made


def test_labels_become_safe_folder_names():
    assert item_dirname("EleutherAI/pythia-70m@step1000") == "EleutherAI_pythia-70m_step1000"
    assert item_dirname("../../etc") == "_.._etc"
    assert item_dirname("a" * 300) == "a" * 100
    with pytest.raises(OptionError, match="no usable folder name"):
        item_dirname("...")


@pytest.mark.parametrize(
    "kwargs, err, match",
    [
        ({"retries": -1}, OptionError, "retries must be >= 0"),
        # a wrong type is the library's OptionTypeError naming the argument (the options are Any-annotated:
        # checked where they enter, not by the annotation checks this test suite instruments the package with)
        ({"retries": 1.5}, OptionTypeError, "retries"),
        ({"workers": 0}, OptionError, "workers must be >= 1"),
        ({"threshold": 1.5}, OptionError, r"threshold must be in \[0, 1\]"),
        ({"nulls": "many"}, OptionTypeError, "nulls"),
        ({"device": "tpu"}, OptionError, "device='tpu'"),
        ({"device": 3}, OptionTypeError, "device must be a device name"),
        ({"client": object()}, OptionTypeError, "client must be a distributed.Client"),
        ({"scheduler": "tcp://x:1", "workers": 2}, OptionError, "workers sizes a LocalCluster"),
        ({"retrys": 2}, UnknownOptionError, "did you mean 'retries'"),
        ({"scheduler": "nonsense://x"}, OptionError, r"Cannot connect to the Dask scheduler.*unknown address scheme"),
        # --workers 1000 used to start hundreds of processes: bounded by the cores unless asked for
        ({"workers": 1000}, OptionError, r"workers=1000 is more worker processes than the \d+ cores.*oversubscribe"),
        ({"workers": 5000, "oversubscribe": True}, OptionError, "workers must be <= 4096"),
        ({"oversubscribe": "yes"}, OptionTypeError, "oversubscribe"),
        ({"worker_timeout": 0}, OptionError, r"worker_timeout must be in \[1, 604800\]"),
        ({"worker_timeout": float("nan")}, OptionError, "worker_timeout must be in"),
        ({"worker_timeout": "60"}, OptionTypeError, "worker_timeout must be a number"),
        ({"device": "cuda:9"}, tli.errors.DeviceError, "cuda:9"),  # the LocalCluster's workers are this machine
    ],
)
def test_bad_arguments_are_refused_before_any_work(ckpts, tmp_path, kwargs, err, match, no_dask_cluster):
    with pytest.raises(err, match=match):
        sweep({"A": ckpts["A"]}, tmp_path / "out", progress=False, **kwargs)
    assert no_dask_cluster == []  # no cluster was started


def test_bad_items_and_folders_are_refused_before_any_work(ckpts, tmp_path):
    out = tmp_path / "out"
    with pytest.raises(OptionError, match="map to the same folder 'a_b'"):
        sweep({"a b": ckpts["A"], "a_b": ckpts["D"]}, out, progress=False)
    with pytest.raises(OptionError, match="same folder"):
        sweep({"Model": ckpts["A"], "model": ckpts["D"]}, out, progress=False)
    with pytest.raises(OptionError, match="not a loaded model"):
        sweep({"r": tli.idempotence_report(ckpts["D"], progress=False)}, out, progress=False)
    shutil.copytree(ckpts["A"], tmp_path / "x" / "ckA")
    with pytest.raises(OptionError, match=r"repeated labels \['ckA'\].*dict"):
        sweep([ckpts["A"], tmp_path / "x" / "ckA"], out, progress=False)
    with pytest.raises(tli.errors.MissingFileError, match="does not exist"):
        sweep([tmp_path / "nope"], out, progress=False)
    with pytest.raises(OptionError, match="has no name"):
        sweep([lambda: ckpts["A"]], out, progress=False)
    (tmp_path / "file").write_text("x")
    with pytest.raises(OptionError, match="is a file"):
        sweep({"A": ckpts["A"]}, tmp_path / "file", progress=False)
    listing = sorted(p.name for p in ckpts["A"].iterdir())
    with pytest.raises(tli.errors.OutputOverInputError, match="is the checkpoint of item 'A'"):
        sweep({"A": ckpts["A"]}, ckpts["A"], progress=False)  # the reports never go into an item's checkpoint
    assert sorted(p.name for p in ckpts["A"].iterdir()) == listing
    (out / "A").mkdir(parents=True, exist_ok=True)
    (out / "A" / "notes.txt").write_text("mine")
    with pytest.raises(OptionError, match="holds files that are not a saved report"):
        sweep({"A": ckpts["A"]}, out, progress=False)
    assert (out / "A" / "notes.txt").read_text() == "mine"
    from filelock import FileLock

    other = tmp_path / "busy"
    other.mkdir()
    with FileLock(str(other / LOCK_NAME)), pytest.raises(OptionError, match="Another sweep is writing"):
        sweep({"A": ckpts["A"]}, other, progress=False)


class DiesOnTheWorker:
    """An item whose worker process dies (what an OOM kill or a wall-time kill looks like)."""

    def __call__(self):
        import os

        os._exit(1)


def test_a_cluster_without_workers_ends_the_sweep(ckpts, tmp_path):
    """No worker, none coming back: a ClusterError after worker_timeout, not a hang."""
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=0, processes=False, dashboard_address=":0", silence_logs=logging.ERROR) as cl:
        with Client(cl) as c:
            with pytest.raises(tli.errors.ClusterError, match=r"no worker for 1 s with 1 of 1 tasks unfinished \(D\)"):
                sweep({"D": ckpts["D"]}, tmp_path / "out", client=c, worker_timeout=1, progress=False)
    assert not (tmp_path / "out" / "D").exists()
    assert json.loads((tmp_path / "out" / RECORD_NAME).read_text())["items"][0]["label"] == "D"  # the plan


@pytest.mark.slow
def test_a_dying_worker_on_a_users_cluster(client, ckpts, reference, tmp_path):
    """On a cluster the sweep did not start (Dask's allowed-failures 3: Dask reruns the task itself, each
    run killing a worker), the dying item is still the only failure and the healthy one is computed once."""
    with pytest.warns(UserWarning, match="1 of 2 sweep items failed after 0 retries: dies: WorkerDied"):
        res = sweep(
            {"D": ckpts["D"], "dies": DiesOnTheWorker()},
            tmp_path / "out",
            client=client,
            retries=0,
            progress=False,
            **OPTS,
        )
    st = res.tasks.set_index("label")
    assert st.loc["D", "status"] == "computed" and st.loc["dies", "status"] == "failed"
    (f,) = res.failed.itertuples()
    assert f.label == "dies" and f.error_type == "WorkerDied" and "retries=0" in f.message
    # Dask ran it allowed-failures + 1 = 4 times, each death charged to it; exit codes from the nannies' logs,
    # asked through the scheduler (best effort, bounded: a loaded CI machine once answered none in time), never
    # a wrong one
    deaths = re.findall(r"worker process \d+ (exited with status -?\d+|died \(exit code unknown\))", f.message)
    assert len(deaths) == 4 and set(deaths) <= {"exited with status 1", "died (exit code unknown)"}, f.message
    assert_same_report(res.reports["D"], reference["D"])
    assert not list((tmp_path / "out" / ".tli-items").glob("*/started-*"))  # every death accounted for


@pytest.mark.slow
def test_default_local_cluster(ckpts, reference, tmp_path):
    res = sweep({"A": ckpts["A"], "D": ckpts["D"]}, tmp_path / "out", workers=2, progress=False, **OPTS)
    assert_same_report(res.reports["A"], reference["A"])
    assert_same_report(res.reports["D"], reference["D"])
    assert res.tasks["pid"].nunique() == 2


_PARTLY_FAILED_SCRIPT = """
import sys
import tl_idempotence as tli

if __name__ == "__main__":
    good, bad, out = sys.argv[1:4]
    res = tli.sweep({"good": good, "bad": bad}, out, workers=1, retries=1, progress=False, nulls=0)
    for row in res.tasks.itertuples():
        print(row.label, row.status, row.attempts, row.reason, sep="|")
"""


def test_a_partly_failed_sweep_leaves_no_traceback_on_stderr(ckpts, tmp_path):
    """An item whose shard is truncated (CheckpointError on every attempt) must not make each worker print
    distributed's "Compute Failed" record with the whole traceback on stderr, once per attempt: the sweep
    records the failure. In a fresh process: the failure is in res.tasks with its reason and attempts, and stderr
    holds only the sweep's one-line warning."""
    bad = tmp_path / "bad"
    shutil.copytree(ckpts["D"], bad)
    shard = sorted(bad.glob("*.safetensors"))[0]
    shard.write_bytes(shard.read_bytes()[:-100])
    script = tmp_path / "run.py"
    script.write_text(_PARTLY_FAILED_SCRIPT)
    proc = subprocess.run(
        [sys.executable, str(script), str(ckpts["D"]), str(bad), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    rows = {line.split("|")[0]: line.split("|")[1:] for line in proc.stdout.splitlines()}
    assert rows["good"][:2] == ["computed", "1"]
    assert rows["bad"][:2] == ["failed", "2"] and rows["bad"][2].startswith(f"CheckpointError: shard {shard} is trunc")
    for noise in ("Traceback", "Compute Failed", "distributed.worker", "ERROR", 'File "'):
        assert noise not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert (
        len(lines) == 1 and "UserWarning: 1 of 2 sweep items failed after 1 retries: bad: CheckpointError" in lines[0]
    )
