"""Trajectories that mix what should not be mixed.

Checkpoints that are byte-identical to an earlier one, or that hold another checkpoint's shard
(both happen in published lineages), are fingerprinted layer by layer and marked in
``Trajectory.checkpoints`` (``identical_to``, ``shares_layers_with``, ``n_shared_layers``) and in
both figures, with a warning. Raw and TransformerLens-processed weights of the same model are
refused (``OptionError``) and, with ``allow_mixed_processing=True``, measured, marked
(``processing_differs``) and warned about; sources whose processing is the same, or unknown,
are not refused.
"""

from __future__ import annotations

import re
import shutil
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from safetensors.torch import load_file, save_file

import tl_idempotence as tli
from helpers import rewrite_saved
from shared_fixtures import MIXED_LINEAGE_LAYERS as N_LAYERS
from tl_idempotence.core.heads import LayerHeads, ModelInfo, kv_layout
from tl_idempotence.errors import OptionError, ReportFileError


def test_identical_and_shared_checkpoints_are_marked_in_the_table(mixed_traj, mixed_lineage_dirs):
    t, _ = mixed_traj
    ck = t.checkpoints.set_index("checkpoint")
    assert ck.loc["step0", "identical_to"] == "" and ck.loc["step0", "shares_layers_with"] == ""
    assert ck.loc["step1", "identical_to"] == "" and ck.loc["step1", "n_shared_layers"] == 0
    assert ck.loc["step2", "identical_to"] == "step1"  # a byte copy
    assert ck.loc["step2", "n_shared_layers"] == N_LAYERS
    assert ck.loc["step3", "identical_to"] == ""
    assert set(ck.loc["step3", "shares_layers_with"].split(",")) == {"step0", "step1", "step2"}
    assert ck.loc["step3", "n_shared_layers"] == N_LAYERS  # every layer is a copy of an earlier one
    assert t.summary["n_identical"] == 1 and t.summary["n_mixed"] == 1
    # the per-layer fingerprints say which layer came from where
    fp = t.layers.pivot(index="layer", columns="checkpoint", values="fingerprint")
    for layer in range(N_LAYERS):
        src = "step0" if layer in mixed_lineage_dirs["from_A"] else "step1"
        assert fp.loc[layer, "step3"] == fp.loc[layer, src]
        assert fp.loc[layer, "step0"] != fp.loc[layer, "step1"]
    # and the numbers of the copied layers are those of the checkpoint they came from
    h = t.heads.set_index(["checkpoint", "layer", "head"])["P"]
    for layer in range(N_LAYERS):
        src = "step0" if layer in mixed_lineage_dirs["from_A"] else "step1"
        np.testing.assert_array_equal(h.loc["step3", layer].to_numpy(), h.loc[src, layer].to_numpy())


def test_identical_and_shared_checkpoints_are_warned_about(mixed_traj):
    _, msgs = mixed_traj
    m = [x for x in msgs if "not genuine distinct points" in x]
    assert len(m) == 1
    assert "step2 is identical to step1" in m[0]
    assert f"step3 shares {N_LAYERS} layer(s) with step0,step1,step2" in m[0]


def test_distinct_checkpoints_are_not_marked(mixed_lineage_dirs):
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # no warning at all
        t = tli.trajectory([("a", mixed_lineage_dirs["A"]), ("b", mixed_lineage_dirs["B"])], progress=False)
    assert (t.checkpoints["identical_to"] == "").all() and (t.checkpoints["shares_layers_with"] == "").all()
    assert (t.checkpoints["n_shared_layers"] == 0).all()


# --------------------------------------------------------------------------- processed vs raw weights


@pytest.fixture(scope="module")
def raw_and_processed(tmp_path_factory):
    """The same tiny Llama as a raw TransformerBridge and a processed one (enable_compatibility_mode on a
    second instance: the first is never touched), with non-trivial RMSNorm scales so fold_ln changes W_V."""
    from tl_idempotence.sources.tl import bridge_from_dir
    from tl_idempotence.testing import tiny_hf_dir

    d = tiny_hf_dir(
        tmp_path_factory.mktemp("proc") / "tiny", n_layers=2, d_model=32, n_heads=4, n_kv_heads=2, vocab_size=64
    )
    f = d / "model.safetensors"
    t = load_file(str(f))
    g = torch.Generator().manual_seed(3)
    for name in t:
        if name.endswith("input_layernorm.weight"):
            t[name] = (0.2 + 2 * torch.rand(t[name].shape, generator=g)).to(t[name].dtype)
    save_file(t, str(f), metadata={"format": "pt"})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        raw = bridge_from_dir(d)
        proc = bridge_from_dir(d)
        proc.enable_compatibility_mode()
    return d, raw, proc


def test_mixing_raw_and_processed_weights_is_refused(raw_and_processed):
    _, raw, proc = raw_and_processed
    with pytest.raises(OptionError) as ei:
        tli.trajectory([("raw", raw), ("processed", proc)], progress=False)
    msg = str(ei.value)
    assert type(ei.value) is OptionError
    for w in (
        "processed differently",
        "raw: raw=True",
        "processed: raw=False",
        "fold_ln=True",
        "allow_mixed_processing=True",
    ):
        assert w in msg, msg


def test_mixing_allowed_is_marked_and_warned(raw_and_processed, tmp_path):
    _, raw, proc = raw_and_processed
    with pytest.warns(UserWarning, match="processed differently"):
        t = tli.trajectory([("raw", raw), ("processed", proc)], progress=False, allow_mixed_processing=True)
    ck = t.checkpoints.set_index("checkpoint")
    assert ck.loc["raw", "processing_differs"] == ""
    assert "fold_ln=True (first checkpoint: False)" in ck.loc["processed", "processing_differs"]
    assert bool(ck.loc["raw", "processing_raw"]) and not bool(ck.loc["processed", "processing_raw"])
    # the jump the flags warn about is real: folding the norm scales into W_V moved P
    P = t.wide("P")
    back = tli.load_trajectory(t.save(tmp_path / "saved"))  # processing_differs recomputed from the flags
    pd.testing.assert_frame_equal(back.checkpoints, t.checkpoints, check_exact=True)
    assert not np.allclose(P["raw"].to_numpy(), P["processed"].to_numpy(), rtol=0, atol=1e-6)


def test_same_processing_through_different_routes_is_not_refused(raw_and_processed):
    d, raw, _ = raw_and_processed
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # identical weights are warned about, not refused
        t = tli.trajectory([("file", d), ("bridge", raw)], progress=False)
    ck = t.checkpoints.set_index("checkpoint")
    assert ck.loc["bridge", "identical_to"] == "file"  # the same raw weights, read from the file and the bridge
    assert (t.checkpoints["processing_differs"] == "").all()


class InfoSource:
    """A LayerHeads-based user HeadSource with the processing record it is given."""

    def __init__(self, processing, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.lh = {
            l: LayerHeads(l, torch.randn(4, 16, 4, generator=g), torch.randn(2, 16, 4, generator=g), kv_layout(4, 2))
            for l in range(2)
        }
        self.info = ModelInfo(n_layers=2, n_heads=4, n_kv_heads=2, d_model=16, d_head=4, processing=processing)

    def layers(self):
        return iter(self.lh)

    def layer_heads(self, layer):
        return self.lh[layer]

    def __iter__(self):
        return iter(self.lh.values())


def test_user_sources_with_different_processing_are_refused_and_unknown_processing_is_not():
    raw = InfoSource({"raw": True, "fold_ln": False}, seed=0)
    folded = InfoSource({"raw": False, "fold_ln": True}, seed=1)
    unknown = InfoSource({"source": "my own loader"}, seed=2)
    with pytest.raises(OptionError, match="fold_ln"):
        tli.trajectory([("a", raw), ("b", folded)], progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        t = tli.trajectory([("a", raw), ("b", unknown), ("c", raw.__class__({"raw": True}, seed=3))], progress=False)
    assert (t.checkpoints["processing_differs"] == "").all()


def test_a_saved_trajectory_is_what_its_tables_give(mixed_traj, tmp_path):
    """A saved trajectory reads back equal, and each checkpoint's numbers and relations are recomputed from its heads
    and layers: an edit of a table, its sha256 and the record's digest recomputed, is refused naming the file (the
    contract test, tests/unit/test_result_contract.py, edits every field of the record)."""
    t, _ = mixed_traj
    d = Path(t.save(tmp_path / "t"))
    back = tli.load_trajectory(d)
    for name in ("heads", "layers", "checkpoints"):
        pd.testing.assert_frame_equal(getattr(back, name), getattr(t, name), check_exact=True)
    assert back.summary == t.summary and back.options == t.options
    first_fp = lambda df: df.assign(fingerprint=["0" * 64, *df["fingerprint"].iloc[1:]])  # noqa: E731
    edits = [
        ("checkpoints", lambda c: c.assign(identical_to=["", "", "", "step1"]), "checkpoints.parquet"),
        ("checkpoints", lambda c: c.assign(n_closed=c["n_closed"] + 1), "checkpoints.parquet"),
        ("layers", first_fp, "checkpoints.parquet"),  # step0's layer 0: its weights fingerprint and relations
        ("heads", lambda h: h.assign(P=h["P"] * 0.999), "checkpoints.parquet"),  # every median_P
        ("heads", lambda h: h.assign(closed=~h["closed"]), "heads.parquet"),
        ("layers", lambda df: df.assign(step=df["step"] + 1), "layers.parquet"),
    ]
    for i, (table, edit, named) in enumerate(edits):
        e = tmp_path / f"edit{i}"
        shutil.copytree(d, e)
        rewrite_saved(e, "trajectory.json", table, edit)
        with pytest.raises(ReportFileError, match=re.escape(str(e / named))):
            tli.load_trajectory(e)
