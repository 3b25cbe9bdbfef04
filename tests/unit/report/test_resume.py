"""Interruptible reports: ``idempotence_report(..., resume=dir)`` (SPEC section 9).

Resume format 2: no pickles; per layer ``layer_NNNNN.json`` (the record, written last) plus
``layer_NNNNN.heads.parquet`` and ``layer_NNNNN.<table>.parquet``. Every part is keyed on the
layer's weight sha256 fingerprint and the options key: the loop reads (fingerprints) every layer
again but does not re-analyse a layer whose part matches; a part that does not match is recomputed
with a ``UserWarning`` naming its file.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import warnings

import pandas as pd
import pytest
import torch

import tl_idempotence as tli
import tl_idempotence.core.files as files_mod
import tl_idempotence.report.report as report_mod
from helpers import Interrupting, llama_like
from tl_idempotence.analyses.report_options import ReportOptions
from tl_idempotence.errors import OptionTypeError, ResumeError
from tl_idempotence.sources.checkpoint import from_path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

OPTION_KEYS = ["algebra", "compute_dtype", "device", "nulls", "search", "seed", "threshold"]


@pytest.fixture
def ckpt(tmp_path):
    d, _, _ = llama_like(tmp_path / "ck", n_layers=5)
    return d


def parts(d):
    """The finished parts: their records (``layer_NNNNN.json``, written last)."""
    return sorted(p.name for p in d.iterdir() if p.name.startswith("layer_") and p.name.endswith(".json"))


def layer_files(d, layer):
    return sorted(p.name for p in d.iterdir() if p.name.startswith(f"layer_{layer:05d}."))


def no_resume_keys(summary):
    return {k: v for k, v in summary.items() if k != "n_layers_resumed"}


def test_interrupt_then_resume_equals_full_run(ckpt, tmp_path, analysed):
    full = tli.idempotence_report(str(ckpt), nulls=8, progress=False)
    assert "n_layers_resumed" not in full.summary
    analysed.clear()
    rd = tmp_path / "parts"
    src = Interrupting(from_path(ckpt), stop_at=3)
    with pytest.raises(KeyboardInterrupt):
        tli.idempotence_report(src, nulls=8, progress=False, resume=rd)
    assert analysed == [0, 1, 2]
    assert parts(rd) == ["layer_00000.json", "layer_00001.json", "layer_00002.json"]
    # no pickles: one JSON record and parquet tables per layer, plus the manifest
    assert layer_files(rd, 0) == [
        "layer_00000.heads.parquet",
        "layer_00000.json",
        "layer_00000.mismatch_pairs.parquet",
        "layer_00000.scramble_draws.parquet",
    ]
    assert not [p for p in rd.iterdir() if p.suffix in (".pkl", ".pickle")]
    manifest = json.loads((rd / "manifest.json").read_text())
    assert manifest["format"] == "tl_idempotence.resume/2"
    assert sorted(manifest["options"]) == OPTION_KEYS
    assert manifest["options"]["nulls"] == 8 and manifest["options"]["threshold"] == 0.9
    assert manifest["options"]["compute_dtype"] == "float64" and manifest["options"]["device"] == "cpu"
    assert manifest["model"]["n_layers"] == 5 and manifest["model"]["n_heads"] == 6
    rec = json.loads((rd / "layer_00001.json").read_text())
    assert rec["layer"] == 1 and rec["options"] == manifest["options"]
    assert rec["fingerprint"] == from_path(ckpt).layer_heads(1).fingerprint()
    assert rec["fingerprint"] == full.layers.loc[1, "fingerprint"]

    analysed.clear()
    src2 = Interrupting(from_path(ckpt))
    resumed = tli.idempotence_report(src2, nulls=8, progress=False, resume=rd)
    assert src2.read == [0, 1, 2, 3, 4]  # every layer is read again (to fingerprint it) ...
    assert analysed == [3, 4]  # ... but finished layers are not analysed again
    assert resumed.summary["n_layers_resumed"] == 3
    pd.testing.assert_frame_equal(resumed.heads, full.heads)
    # same layer rows (column order: see test_resumed_layers_keep_the_column_order, a known src bug)
    pd.testing.assert_frame_equal(resumed.layers[list(full.layers.columns)], full.layers)
    assert sorted(resumed.layers.columns) == sorted(full.layers.columns)
    assert sorted(resumed.tables) == sorted(full.tables) == ["mismatch_pairs", "scramble_draws"]
    for k in full.tables:
        pd.testing.assert_frame_equal(resumed.tables[k], full.tables[k])
    assert no_resume_keys(resumed.summary) == full.summary
    # a third call analyses nothing
    analysed.clear()
    third = tli.idempotence_report(str(ckpt), nulls=8, progress=False, resume=rd)
    assert analysed == [] and third.summary["n_layers_resumed"] == 5
    pd.testing.assert_frame_equal(third.heads, full.heads)


def test_resumed_layers_keep_the_column_order(ckpt, tmp_path):
    rd = tmp_path / "parts"
    full = tli.idempotence_report(str(ckpt), nulls=8, progress=False, resume=rd)
    resumed = tli.idempotence_report(str(ckpt), nulls=8, progress=False, resume=rd)
    assert resumed.summary["n_layers_resumed"] == 5
    assert list(resumed.layers.columns) == list(full.layers.columns)


def test_layers_subset_then_rest(ckpt, tmp_path, analysed):
    rd = tmp_path / "parts"
    first = tli.idempotence_report(str(ckpt), layers=[0, 1], progress=False, resume=rd)
    assert parts(rd) == ["layer_00000.json", "layer_00001.json"] and first.summary["n_layers_resumed"] == 0
    full = tli.idempotence_report(str(ckpt), progress=False)
    analysed.clear()
    rest = tli.idempotence_report(str(ckpt), progress=False, resume=rd)
    assert analysed == [2, 3, 4] and rest.summary["n_layers_resumed"] == 2
    pd.testing.assert_frame_equal(rest.heads, full.heads)
    assert parts(rd) == [f"layer_{l:05d}.json" for l in range(5)]


@pytest.mark.parametrize(
    "change,old,new",
    [
        ({"threshold": 0.5}, "0.9", "0.5"),
        ({"nulls": 4}, "0", "4"),
        ({"seed": 1}, "0", "1"),
        ({"compute_dtype": torch.float32}, "'float64'", "'float32'"),
        ({"search": True}, "False", "True"),
        ({"algebra": True}, "False", "True"),
    ],
)
def test_resume_with_other_options_refuses(ckpt, tmp_path, change, old, new):
    rd = tmp_path / "parts"
    tli.idempotence_report(str(ckpt), layers=[0], progress=False, resume=rd)
    key = next(iter(change))
    with pytest.raises(
        ResumeError,
        match=rf"Cannot resume in .*different options \(options\.{key}: {old} -> {new}\)"
        r".*new directory",
    ):
        tli.idempotence_report(str(ckpt), progress=False, resume=rd, **change)
    assert parts(rd) == ["layer_00000.json"]  # nothing was touched


def test_layers_is_not_part_of_the_options_key(ckpt, tmp_path):
    """A layer's numbers do not depend on which other layers ran: another ``layers=`` resumes."""
    rd = tmp_path / "parts"
    tli.idempotence_report(str(ckpt), layers=[3], progress=False, resume=rd)
    rep = tli.idempotence_report(str(ckpt), layers=[1, 3], progress=False, resume=rd)
    assert rep.summary["n_layers_resumed"] == 1 and list(rep.layers["layer"]) == [1, 3]


def test_resume_on_another_checkpoint_recomputes_with_a_warning(ckpt, tmp_path, analysed):
    """Same names, shapes and config, other weights: each part's weight fingerprint tells them apart, so
    every part is recomputed (and overwritten), with a UserWarning naming the file."""
    rd = tmp_path / "parts"
    tli.idempotence_report(str(ckpt), layers=[0, 1], progress=False, resume=rd)
    other, _, _ = llama_like(tmp_path / "other", n_layers=5)
    from safetensors.torch import load_file, save_file

    for f in other.glob("model-*.safetensors"):
        save_file({k: v * 1.5 for k, v in load_file(str(f)).items()}, str(f))
    analysed.clear()
    with pytest.warns(UserWarning) as rec:
        rep = tli.idempotence_report(str(other), progress=False, resume=rd)
    msgs = [str(w.message) for w in rec if issubclass(w.category, UserWarning)]
    for layer in (0, 1):
        assert any(
            m.startswith(
                f"Resume part {rd / f'layer_{layer:05d}.json'}: the layer's weights changed since it was "
                "written (sha256 fingerprint differs); recomputing layer"
            )
            for m in msgs
        ), msgs
    assert analysed == [0, 1, 2, 3, 4] and rep.summary["n_layers_resumed"] == 0
    pd.testing.assert_frame_equal(rep.heads, tli.idempotence_report(str(other), progress=False).heads)
    # the parts now belong to the other checkpoint: it resumes silently
    analysed.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        again = tli.idempotence_report(str(other), progress=False, resume=rd)
    assert analysed == [] and again.summary["n_layers_resumed"] == 5
    # a moved (renamed) copy of the same weights still resumes: parts are keyed on content, not on paths
    moved = tmp_path / "moved"
    other.rename(moved)
    analysed.clear()
    assert tli.idempotence_report(str(moved), progress=False, resume=rd).summary["n_layers_resumed"] == 5
    assert analysed == []


def test_a_part_from_another_layer_or_damaged_is_recomputed(ckpt, tmp_path, analysed):
    rd = tmp_path / "parts"
    full = tli.idempotence_report(str(ckpt), progress=False, resume=rd)
    # layer 2's part replaced by a copy of layer 1's: its record says layer 1
    for f in layer_files(rd, 1):
        shutil.copy(rd / f, rd / f.replace("layer_00001", "layer_00002"))
    # layer 4's heads table damaged
    (rd / "layer_00004.heads.parquet").write_bytes(b"not parquet")
    analysed.clear()
    with pytest.warns(UserWarning) as rec:
        rep = tli.idempotence_report(str(ckpt), progress=False, resume=rd)
    msgs = [str(w.message) for w in rec]
    assert any(m.startswith(f"Resume part {rd / 'layer_00002.json'}: it records layer 1") for m in msgs), msgs
    assert any(
        m.startswith(
            f"Resume part {rd / 'layer_00004.json'}: layer_00004.heads.parquet does not match its recorded sha256"
        )
        for m in msgs
    ), msgs
    assert analysed == [2, 4] and rep.summary["n_layers_resumed"] == 3
    pd.testing.assert_frame_equal(rep.heads, full.heads)


def test_resume_with_transformerlens_model(tmp_path, analysed):
    from tl_idempotence.testing import bridge_from_dir, tiny_hf_dir

    model = bridge_from_dir(tiny_hf_dir(tmp_path / "tiny", n_layers=3))
    rd = tmp_path / "parts"
    tli.idempotence_report(model, layers=[1], progress=False, resume=rd)
    analysed.clear()
    resumed = tli.idempotence_report(model, progress=False, resume=rd)
    assert analysed == [0, 2] and resumed.summary["n_layers_resumed"] == 1
    pd.testing.assert_frame_equal(resumed.heads, tli.idempotence_report(model, progress=False).heads)


def test_manifest_of_another_format_refuses(ckpt, tmp_path):
    rd = tmp_path / "parts"
    rd.mkdir()
    (rd / "manifest.json").write_text(json.dumps({"format": "tl_idempotence.resume/1", "options": {}}))
    with pytest.raises(ResumeError, match=r"manifest\.json is not a tl_idempotence\.resume/2 manifest .*new directory"):
        tli.idempotence_report(str(ckpt), progress=False, resume=rd)
    (tmp_path / "afile").write_text("x")
    with pytest.raises(ResumeError, match="is a file, not a directory"):
        tli.idempotence_report(str(ckpt), progress=False, resume=tmp_path / "afile")


@pytest.mark.parametrize("bad", [123, 1.5, True, b"parts", ["parts"]], ids=["int", "float", "bool", "bytes", "list"])
def test_resume_that_is_not_a_path_is_refused_before_any_folder_is_made(ckpt, tmp_path, monkeypatch, analysed, bad):
    """resume=123 used to make ./123 (str(123)): a resume folder is a str or os.PathLike, refused otherwise
    before anything is read, created or measured (every route goes through report_with_options)."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    with pytest.raises(OptionTypeError, match=rf"resume must be a folder path; got {type(bad).__name__}\."):
        tli.idempotence_report(str(ckpt), progress=False, resume=bad)
    with pytest.raises(OptionTypeError, match="resume must be a folder path"):
        report_mod.report_with_options(str(ckpt), ReportOptions(), progress=False, resume=bad)
    # the sweep's and the cluster trajectory's route (measure_item), and the parts folder itself
    from tl_idempotence.report.parts import ResumeDir
    from tl_idempotence.studies.items import measure_item, resolve_items

    (item,) = resolve_items([str(ckpt)])
    with pytest.raises(OptionTypeError, match=rf"resume must be a folder path; got {type(bad).__name__}\."):
        measure_item(item, ReportOptions(), resume=bad)
    info = tli.idempotence_report(str(ckpt), progress=False, nulls=0, layers=[0]).info
    analysed.clear()
    with pytest.raises(OptionTypeError, match=rf"resume must be a folder path; got {type(bad).__name__}\."):
        ResumeDir(bad, ReportOptions(), info)
    assert list(cwd.iterdir()) == [] and analysed == []
    # a folder name that is a number is a str: made, and used
    rep = tli.idempotence_report(str(ckpt), progress=False, resume="123")
    assert (cwd / "123" / "manifest.json").is_file() and len(rep.heads) == 5 * 6


def test_nothing_half_written_looks_complete(ckpt, tmp_path, monkeypatch, analysed):
    """A crash while a part is being written (here: its record, written last) leaves no record under its
    final name and no temp file; the layer is redone on the next call."""
    rd = tmp_path / "parts"
    real_replace = os.replace
    calls = {"n": 0}

    def crashing_replace(src, dst):
        if str(dst).endswith("layer_00001.json"):
            calls["n"] += 1
            raise OSError(28, "No space left on device")
        return real_replace(src, dst)

    monkeypatch.setattr(files_mod.os, "replace", crashing_replace)
    with pytest.raises(
        ResumeError, match=rf"Cannot write resume part of layer 1 in {re.escape(str(rd))} .*No space left on device"
    ):
        tli.idempotence_report(str(ckpt), progress=False, resume=rd)
    monkeypatch.setattr(files_mod.os, "replace", real_replace)
    assert calls["n"] == 1
    assert parts(rd) == ["layer_00000.json"]  # layer 1's tables were written, its record was not
    assert "layer_00001.heads.parquet" in layer_files(rd, 1)
    assert not [p.name for p in rd.iterdir() if ".tmp" in p.name]  # the temp file was removed
    analysed.clear()
    src = Interrupting(from_path(ckpt))
    resumed = tli.idempotence_report(src, progress=False, resume=rd)
    assert analysed == [1, 2, 3, 4] and resumed.summary["n_layers_resumed"] == 1
    pd.testing.assert_frame_equal(resumed.heads, tli.idempotence_report(str(ckpt), progress=False).heads)
