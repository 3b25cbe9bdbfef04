"""Head extraction (MHA/GQA/MQA) and the report on hand-built offline TransformerLens models."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest
import torch
from helpers import dense_closure

import tl_idempotence as tli
from tl_idempotence.core.heads import LayerHeads
from tl_idempotence.sources.dispatch import head_source
from tl_idempotence.sources.tl import TLModelSource
from tl_idempotence.testing import bridge_from_dir, hooked_from_dir, tiny_hf_dir

try:
    from transformer_lens import HookedTransformer  # noqa: F401  (removed in transformer-lens 4.x)

    HAS_HOOKED = True
except ImportError:
    HAS_HOOKED = False
needs_hooked = pytest.mark.skipif(not HAS_HOOKED, reason="HookedTransformer needs transformer-lens 3.x")

LAYOUTS = {"mha": 6, "gqa": 3, "mqa": 1}  # n_kv_heads for 6 query heads (gqa: 9/3 below)


@pytest.fixture(scope="module", params=["mha", "gqa", "mqa"])
def tiny_dir(request, tmp_path_factory):
    n_heads = 9 if request.param == "gqa" else 6
    n_kv = {"mha": n_heads, "gqa": 3, "mqa": 1}[request.param]
    d_model = 8 * n_heads
    path = tmp_path_factory.mktemp(f"tiny_{request.param}")
    tiny_hf_dir(path, n_layers=2, d_model=d_model, n_heads=n_heads, n_kv_heads=n_kv, seed=7)
    return path, n_heads, n_kv


def _raw_attention(path, layer):
    """O and V of a layer straight from the safetensors file (column form)."""
    from safetensors import safe_open

    with safe_open(str(path / "model.safetensors"), framework="pt") as f:
        v = f.get_tensor(f"model.layers.{layer}.self_attn.v_proj.weight")  # [n_kv*d_head, d_model]
        o = f.get_tensor(f"model.layers.{layer}.self_attn.o_proj.weight")  # [d_model, n_heads*d_head]
    return o, v


@pytest.mark.bridge
def test_bridge_layer_heads_match_checkpoint(tiny_dir):
    path, n_heads, n_kv = tiny_dir
    model = bridge_from_dir(path)
    src = head_source(model)
    d_model, d_head = 8 * n_heads, 8
    assert (src.info.n_heads, src.info.n_kv_heads, src.info.d_head) == (n_heads, n_kv, d_head)
    for lh in src:
        o, v = _raw_attention(path, lh.layer)
        V = v.T.reshape(d_model, n_kv, d_head).permute(1, 0, 2)
        O = o.reshape(d_model, n_heads, d_head).permute(1, 0, 2)
        assert torch.equal(lh.V, V) and torch.equal(lh.O, O)
        assert torch.equal(lh.kv_head_of, torch.arange(n_heads) // (n_heads // n_kv))


@pytest.mark.bridge
def test_bridge_report_matches_dense_reference(tiny_dir):
    path, n_heads, n_kv = tiny_dir
    model = bridge_from_dir(path)
    rep = model.idempotence_report(progress=False)
    assert len(rep.heads) == 2 * n_heads
    assert list(rep.heads.columns[:10]) == ["layer", "head", "kv_head", "alpha", "P", "norm", "norm_T2", "rank_O", "rank_V", "closed"]
    for layer in (0, 1):
        o, v = _raw_attention(path, layer)
        d_model = o.shape[0]
        O = o.reshape(d_model, n_heads, 8).permute(1, 0, 2)
        V = v.T.reshape(d_model, n_kv, 8).permute(1, 0, 2)[torch.arange(n_heads) // (n_heads // n_kv)]
        ref = dense_closure(O, V)
        rows = rep.heads[rep.heads.layer == layer]
        np.testing.assert_allclose(rows.P.to_numpy(), ref["P"].numpy(), rtol=1e-10)
        np.testing.assert_allclose(rows.alpha.to_numpy(), ref["alpha"].numpy(), rtol=1e-10)
        # heads sharing a kv head read the same V: identical rank_V and kv_head
        assert (rows.kv_head.to_numpy() == (np.arange(n_heads) // (n_heads // n_kv))).all()
    s = rep.summary
    assert s["n_heads"] == 2 * n_heads and s["n_kv_heads"] == n_kv and s["d_model"] == 8 * n_heads and s["d_head"] == 8
    assert s["processing"]["fold_ln"] is False
    assert s["versions"]["transformer_lens"]
    # tli.closure(model.OV) gives the same numbers
    c = tli.closure(model.OV)
    np.testing.assert_allclose(c.P.numpy().ravel(), rep.heads.P.to_numpy(), rtol=1e-10)


@needs_hooked
def test_hooked_and_bridge_give_identical_tables(tiny_dir):
    path, n_heads, n_kv = tiny_dir
    ht = hooked_from_dir(path)
    br = bridge_from_dir(path)
    # same raw weights (HookedTransformer keeps GQA values unexpanded in _W_V)
    src_h, src_b = TLModelSource(ht), TLModelSource(br)
    for a, b in zip(src_h, src_b):
        assert torch.equal(a.V, b.V) and torch.equal(a.O, b.O) and torch.equal(a.kv_head_of, b.kv_head_of)
    if n_kv < n_heads:
        # the expanded W_V equals V[kv_head_of]: query heads of one group share V
        lh = src_h.layer_heads(0)
        assert torch.equal(ht.W_V[0], lh.V[lh.kv_head_of])
    rh = ht.idempotence_report(progress=False).heads
    rb = br.idempotence_report(progress=False).heads
    cols = ["layer", "head", "kv_head", "alpha", "P", "norm", "rank_O", "rank_V", "closed"]
    pd.testing.assert_frame_equal(rh[cols], rb[cols], check_exact=False, rtol=1e-12)


@needs_hooked
@pytest.mark.parametrize("n_kv", [6, 2, 1])
def test_hooked_transformer_from_config(n_kv):
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    cfg = HookedTransformerConfig(
        n_layers=3, d_model=48, n_ctx=16, d_head=8, n_heads=6, d_vocab=20, act_fn="gelu",
        n_key_value_heads=None if n_kv == 6 else n_kv, normalization_type="LN", seed=3,
    )
    model = HookedTransformer(cfg)
    rep = tli.idempotence_report(model, progress=False)
    assert len(rep.heads) == 18 and rep.summary["n_kv_heads"] == n_kv
    assert (rep.heads.groupby("layer").kv_head.nunique() == n_kv).all()
    W_V = model.W_V.detach()  # expanded [L, n_heads, d_model, d_head]
    ref = dense_closure(model.W_O.detach().transpose(-1, -2), W_V)
    np.testing.assert_allclose(rep.heads.P.to_numpy(), ref["P"].numpy().ravel(), rtol=1e-9)
    assert rep.summary["processing"]["fold_ln"] is False


@needs_hooked
def test_processing_flags_recorded_for_folded_model():
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    cfg = HookedTransformerConfig(
        n_layers=1, d_model=32, n_ctx=8, d_head=8, n_heads=4, d_vocab=10, act_fn="gelu", normalization_type="LN", seed=1
    )
    model = HookedTransformer(cfg)
    model.load_and_process_state_dict(model.state_dict(), fold_ln=True, center_writing_weights=True)
    proc = tli.idempotence_report(model, progress=False).summary["processing"]
    assert proc["fold_ln"] is True and proc["center_writing_weights"] is True and proc["raw"] is False


@pytest.mark.bridge
def test_report_html_is_standalone(tmp_path, tiny_gqa_bridge):
    rep = tiny_gqa_bridge.idempotence_report(progress=False)
    fig = rep.figure()
    assert fig.data[0].type == "heatmap" and np.asarray(fig.data[0].z).shape == (2, 9)
    out = rep.save_html(tmp_path / "r.html")
    html = open(out, encoding="utf-8").read()
    assert "Plotly.newPlot" in html or "plotly" in html.lower()
    assert not re.search(r"<script[^>]+src=[\"']https?://", html), "report references a remote script"
    assert "kv_head" in html


@pytest.fixture(scope="module")
def tiny_gqa_bridge(tmp_path_factory):
    path = tmp_path_factory.mktemp("tinygqa")
    tiny_hf_dir(path, n_layers=2, d_model=72, n_heads=9, n_kv_heads=3, seed=1)
    return bridge_from_dir(path)


@pytest.mark.bridge
def test_bad_input_errors(tiny_gqa_bridge):
    with pytest.raises(TypeError, match="Cannot read attention heads"):
        tli.idempotence_report(object())
    with pytest.raises(ValueError, match="threshold"):
        tli.idempotence_report(tiny_gqa_bridge, threshold=1.5)
    with pytest.raises(ValueError, match="Unknown layer"):
        tli.idempotence_report(tiny_gqa_bridge, layers=[5], progress=False)
    rep = tli.idempotence_report(tiny_gqa_bridge, layers=[1], progress=False)
    assert set(rep.heads.layer) == {1} and len(rep.heads) == 9


@pytest.mark.bridge
def test_nan_weight_names_layer_and_head(tmp_path):
    path = tiny_hf_dir(tmp_path / "nanmodel", n_layers=2, d_model=72, n_heads=9, n_kv_heads=3, seed=2)
    model = bridge_from_dir(path)
    with torch.no_grad():
        model.blocks[1].attn.o.original_component.weight[5, 8 * 4 + 2] = float("nan")  # head 4 of layer 1
    with pytest.raises(ValueError, match=r"layer 1.*head=4"):
        tli.idempotence_report(model, progress=False)


def test_model_without_attention_is_rejected():
    class Cfg:
        n_heads = 4
        n_layers = 1
        d_model = 8
        d_head = 2

    class NoAttn(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.cfg = Cfg()
            self.blocks = torch.nn.ModuleList([torch.nn.Linear(2, 2)])

    with pytest.raises(ValueError, match="no attention layers"):
        TLModelSource(NoAttn())


def test_layer_heads_validates_shapes():
    with pytest.raises(ValueError, match="disagree"):
        LayerHeads(0, torch.zeros(4, 16, 4), torch.zeros(2, 16, 5), torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match="outside"):
        LayerHeads(0, torch.zeros(4, 16, 4), torch.zeros(2, 16, 4), torch.tensor([0, 1, 2, 3]))
    with pytest.raises(ValueError, match="multiple"):
        tli.kv_layout(9, 2)
