"""What a string names, and the folder a run writes: one rule (sources/names.py, core/files.py), the same
decision on every route (report, TL-free head source, compare, sweep, the CLI's report and sweep)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import tl_idempotence as tli
from tl_idempotence.core.files import check_work_folder
from tl_idempotence.errors import OptionError, OptionTypeError, ResumeError, UnknownModelError
from tl_idempotence.sources.names import Named, path_label, resolve_name

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
