"""What a string names, and the folder a run writes: one rule (sources/names.py, core/files.py), the same
decision on every route (report, TL-free head source, compare, sweep, the CLI's report and sweep)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import tl_idempotence as tli
from tl_idempotence.core.files import check_work_folder
from tl_idempotence.errors import MissingFileError, OptionError, OptionTypeError, ResumeError, UnknownModelError
from tl_idempotence.sources.dispatch import head_source
from tl_idempotence.sources.names import Named, path_label, resolve_name
from tl_idempotence.studies.compare import resolve_items

CLI = [sys.executable, "-m", "tl_idempotence.cli"]


def test_resolve_name_rule(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert resolve_name("minilm-l6") == Named("zoo", "minilm-l6")
    assert resolve_name("zoo:minilm-l6") == Named("zoo", "minilm-l6")
    assert resolve_name("not-a-model") == Named("unknown", "not-a-model")
    assert resolve_name(Path("nowhere")) == Named("path", Path("nowhere"))  # a Path is always a path
    with pytest.raises(UnknownModelError, match="minilm-l6"):
        resolve_name("zoo:nope")
    with pytest.raises(OptionTypeError, match="must be a str or a path; got int"):
        resolve_name(3)  # type: ignore[arg-type]
    (tmp_path / "minilm-l6").mkdir()
    with pytest.raises(
        OptionError, match=r"both a zoo model name and an existing path.*'zoo:minilm-l6'.*'\./minilm-l6'"
    ):
        resolve_name("minilm-l6")
    assert resolve_name("./minilm-l6") == Named("path", Path("minilm-l6"))
    assert resolve_name(Path("minilm-l6")) == Named("path", Path("minilm-l6"))
    assert resolve_name("zoo:minilm-l6") == Named("zoo", "minilm-l6")


def test_path_labels(tmp_path):
    ck = tmp_path / "ckpt_step200"
    ck.mkdir()
    (ck / "model.safetensors").write_bytes(b"")
    (ck / "config.json").write_text("{}")
    (tmp_path / "gemma.Q4.gguf").write_bytes(b"")
    assert path_label(ck) == "ckpt_step200"
    assert path_label(ck / "model.safetensors") == "ckpt_step200"  # a file in a checkpoint folder names the folder
    assert path_label(ck / "config.json") == "ckpt_step200"
    assert path_label(tmp_path / "gemma.Q4.gguf") == "gemma.Q4"


@pytest.mark.integration  # fresh processes or a real model's files read whole: CI's integration tier
def test_a_folder_named_like_a_zoo_model_gets_one_decision_on_every_route(tmp_path, monkeypatch):
    """Measured before: ``idempotence_report("smollm2-135m")`` read the folder while compare, sweep and the
    CLI refused the name. Now every route refuses it naming both ways out, before anything is read."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "minilm-l6").mkdir()
    match = r"both a zoo model name and an existing path"
    with pytest.raises(OptionError, match=match):
        tli.idempotence_report("minilm-l6", progress=False)
    with pytest.raises(OptionError, match=match):
        head_source("minilm-l6")
    with pytest.raises(OptionError, match=match):
        resolve_items(["minilm-l6"])
    with pytest.raises(OptionError, match=match):
        tli.sweep(["minilm-l6"], out=tmp_path / "sw", progress=False)
    assert not (tmp_path / "sw").exists()  # refused before the sweep folder (or a cluster) exists
    for argv in (["report", "minilm-l6", "--json"], ["sweep", "minilm-l6", "--out", "sw"]):
        proc = subprocess.run([*CLI, *argv], capture_output=True, text=True, cwd=tmp_path, timeout=300)
        assert proc.returncode == 2, (argv, proc.stderr)
        assert "both a zoo model name and an existing path" in proc.stderr and "zoo:minilm-l6" in proc.stderr
    # an unknown name: the same missing-path refusal from the API routes
    for call in (
        lambda: tli.idempotence_report("no-such-ckpt", progress=False),
        lambda: resolve_items(["no-such-ckpt"]),
    ):
        with pytest.raises(MissingFileError, match="'no-such-ckpt' is not an existing file or folder, nor a zoo model"):
            call()


def test_run_folders_have_one_rule(tmp_path):
    (tmp_path / "f.txt").write_text("x")
    for bad, err, match in [
        ("", OptionError, "must not be empty"),
        ("  ", OptionError, "must not be empty"),
        (str(tmp_path / "f.txt"), OptionError, "is a file"),
        (str(tmp_path / "no" / "parts"), OptionError, "does not exist"),
        (3, OptionTypeError, "must be a folder path; got int"),
    ]:
        with pytest.raises(err, match=match):
            check_work_folder(bad, "resume")
    assert check_work_folder(tmp_path / "new", "resume") == tmp_path / "new"
    # the routes use it, before any work: the API's resume= and sweep(out=), the CLI's --resume (exit 2)
    with pytest.raises(ResumeError, match="resume must not be empty"):
        tli.idempotence_report("minilm-l6", resume="", progress=False)
    with pytest.raises(OptionError, match="out must not be empty"):
        tli.sweep(["minilm-l6"], out="", progress=False)
    proc = subprocess.run([*CLI, "report", "--resume", ""], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "--resume: must not be empty" in proc.stderr


@pytest.mark.integration  # fresh processes or a real model's files read whole: CI's integration tier
def test_an_absent_device_gets_one_decision_before_any_work(tmp_path):
    """``device="cuda"`` on a machine without CUDA: refused before anything is read or started on every
    route whose work runs on this machine (a sweep with its own scheduler resolves it on the workers)."""
    import torch

    from tl_idempotence.errors import DeviceError

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    from helpers import random_heads
    from tl_idempotence.core.heads import LayerHeads

    O, V, _ = random_heads(1, 2, 2, 8, 4)
    heads = [LayerHeads(0, O[0], V[0], torch.tensor([0, 1]))]
    for call in (
        lambda: tli.idempotence_report(heads, device="cuda", progress=False),
        lambda: tli.compare({"a": heads}, device="cuda", progress=False),
        lambda: tli.sweep({"a": "minilm-l6"}, out=tmp_path / "sw", device="cuda", progress=False),
    ):
        with pytest.raises(DeviceError, match="CUDA is not available"):
            call()
    assert not (tmp_path / "sw").exists()  # no sweep folder, no cluster
    for argv in (
        ["report", "--device", "cuda"],
        ["sweep", "minilm-l6", "--out", str(tmp_path / "sw2"), "--device", "cuda"],
    ):
        proc = subprocess.run([*CLI, *argv], capture_output=True, text=True, timeout=300)
        assert proc.returncode == 2 and "CUDA is not available" in proc.stderr, (argv, proc.stderr)
    assert not (tmp_path / "sw2").exists()
