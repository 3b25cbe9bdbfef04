"""Interruptible reports: ``idempotence_report(..., resume=dir)`` (issue 6, SPEC section 9)."""

from __future__ import annotations

import json
import os

import pandas as pd
import pytest
import torch

import tl_idempotence as tli
import tl_idempotence.report as report_mod
from tl_idempotence import sources
from test_sources import llama_like

os.environ.setdefault("HF_HUB_OFFLINE", "1")


class Interrupting:
    """A HeadSource that dies on reading layer ``stop_at`` and counts the layers it read."""

    def __init__(self, src, stop_at=None):
        self.src, self.stop_at, self.read = src, stop_at, []
        self.info = src.info

    def layers(self):
        return self.src.layers()

    def layer_heads(self, layer):
        if layer == self.stop_at:
            raise KeyboardInterrupt(f"killed at layer {layer}")
        self.read.append(layer)
        return self.src.layer_heads(layer)

    def __iter__(self):
        return (self.layer_heads(l) for l in self.layers())

    def fingerprint(self):
        return self.src.fingerprint()


@pytest.fixture
def ckpt(tmp_path):
    d, _, _ = llama_like(tmp_path / "ck", n_layers=5)
    return d


def parts(d):
    return sorted(p.name for p in d.iterdir() if p.name.startswith("layer_"))


def test_interrupt_then_resume_equals_full_run(ckpt, tmp_path):
    full = tli.idempotence_report(str(ckpt), nulls=8, progress=False)
    rd = tmp_path / "parts"
    src = Interrupting(sources.maybe_source(ckpt), stop_at=3)
    with pytest.raises(KeyboardInterrupt):
        tli.idempotence_report(src, nulls=8, progress=False, resume=rd)
    assert parts(rd) == ["layer_00000.pkl", "layer_00001.pkl", "layer_00002.pkl"]
    manifest = json.loads((rd / "manifest.json").read_text())
    assert manifest["options"]["nulls"] == 8 and manifest["options"]["threshold"] == 0.9
    assert len(manifest["source"]["layer0_sha256"]) == 64

    src2 = Interrupting(sources.maybe_source(ckpt))
    resumed = tli.idempotence_report(src2, nulls=8, progress=False, resume=rd)
    assert src2.read == [3, 4]  # finished layers are not read again
    pd.testing.assert_frame_equal(resumed.heads, full.heads)
    pd.testing.assert_frame_equal(resumed.layers, full.layers)
    assert resumed.summary["n_closed"] == full.summary["n_closed"]
    assert resumed.summary["median_P"] == full.summary["median_P"]
    # a third call reads nothing
    src3 = Interrupting(sources.maybe_source(ckpt))
    tli.idempotence_report(src3, nulls=8, progress=False, resume=rd)
    assert src3.read == []


def test_layers_subset_then_rest(ckpt, tmp_path):
    rd = tmp_path / "parts"
    tli.idempotence_report(str(ckpt), layers=[0, 1], progress=False, resume=rd)
    assert parts(rd) == ["layer_00000.pkl", "layer_00001.pkl"]
    full = tli.idempotence_report(str(ckpt), progress=False)
    pd.testing.assert_frame_equal(tli.idempotence_report(str(ckpt), progress=False, resume=rd).heads, full.heads)


@pytest.mark.parametrize("change", [{"threshold": 0.5}, {"nulls": 4}, {"seed": 1},
                                    {"compute_dtype": torch.float32}])
def test_resume_with_other_options_refuses(ckpt, tmp_path, change):
    rd = tmp_path / "parts"
    tli.idempotence_report(str(ckpt), layers=[0], progress=False, resume=rd)
    key = next(iter(change))
    with pytest.raises(ValueError, match=rf"Cannot resume in .*options\.{key}.*new directory"):
        tli.idempotence_report(str(ckpt), progress=False, resume=rd, **change)


def test_resume_on_another_checkpoint_refuses(ckpt, tmp_path):
    """Same names, shapes and config, other weights: the layer-0 weight hash tells them apart."""
    rd = tmp_path / "parts"
    tli.idempotence_report(str(ckpt), layers=[0], progress=False, resume=rd)
    other, _, _ = llama_like(tmp_path / "other", n_layers=5)
    # same config and index, different weights
    from safetensors.torch import load_file, save_file

    for f in other.glob("model-*.safetensors"):
        save_file({k: v * 1.5 for k, v in load_file(str(f)).items()}, str(f))
    with pytest.raises(ValueError, match=r"another checkpoint.*source\.layer0_sha256"):
        tli.idempotence_report(str(other), progress=False, resume=rd)
    # a moved (renamed) copy of the same checkpoint still resumes
    moved = tmp_path / "moved"
    ckpt.rename(moved)
    tli.idempotence_report(str(moved), progress=False, resume=rd)


def test_resume_with_transformerlens_model(tmp_path):
    from tl_idempotence.testing import bridge_from_dir, tiny_hf_dir

    model = bridge_from_dir(tiny_hf_dir(tmp_path / "tiny", n_layers=3))
    rd = tmp_path / "parts"
    tli.idempotence_report(model, layers=[1], progress=False, resume=rd)
    resumed = tli.idempotence_report(model, progress=False, resume=rd)
    pd.testing.assert_frame_equal(resumed.heads, tli.idempotence_report(model, progress=False).heads)


def test_nothing_half_written_looks_complete(ckpt, tmp_path, monkeypatch):
    """A crash while a part is being written leaves only a temp file, which is ignored; the layer is redone."""
    rd = tmp_path / "parts"
    real_replace = os.replace
    calls = {"n": 0}

    def crashing_replace(src, dst):
        if str(dst).endswith("layer_00001.pkl"):
            calls["n"] += 1
            raise OSError("disk full")
        return real_replace(src, dst)

    monkeypatch.setattr(report_mod.os, "replace", crashing_replace)
    with pytest.raises(OSError, match="disk full"):
        tli.idempotence_report(str(ckpt), progress=False, resume=rd)
    monkeypatch.setattr(report_mod.os, "replace", real_replace)
    assert calls["n"] == 1
    assert parts(rd)[0] == "layer_00000.pkl" and "layer_00001.pkl" not in parts(rd)
    assert any(".tmp" in n for n in parts(rd))  # the partial file never got a final name
    src = Interrupting(sources.maybe_source(ckpt))
    resumed = tli.idempotence_report(src, progress=False, resume=rd)
    assert src.read == [1, 2, 3, 4]
    pd.testing.assert_frame_equal(resumed.heads, tli.idempotence_report(str(ckpt), progress=False).heads)
