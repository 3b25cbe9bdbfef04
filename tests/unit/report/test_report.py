"""Head extraction (MHA/GQA/MQA) and the report on hand-built offline TransformerLens models."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pandas as pd
import pytest
import torch

import tl_idempotence as tli
from helpers import dense_closure
from tl_idempotence.core.heads import LayerHeads
from tl_idempotence.errors import (
    OptionError,
    UnknownOptionError,
    UnsupportedModelError,
    WeightError,
)
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
    assert list(rep.heads.columns[:10]) == [
        "layer",
        "head",
        "kv_head",
        "alpha",
        "P",
        "norm",
        "norm_T2",
        "rank_O",
        "rank_V",
        "closed",
    ]
    # heads are indexed by TransformerLens labels, in (layer, head) order
    assert rep.heads.index.name == "label"
    assert list(rep.heads.index) == [f"L{l}H{h}" for l in (0, 1) for h in range(n_heads)]
    # every layer row carries its weights' sha256 fingerprint and a note ("" when nothing is NaN)
    assert {"fingerprint", "note"} <= set(rep.layers.columns)
    assert list(rep.layers["fingerprint"]) == [lh.fingerprint() for lh in head_source(model)]
    assert all(len(f) == 64 for f in rep.layers["fingerprint"]) and rep.layers["fingerprint"].nunique() == 2
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
    # to_tensor: a column in TransformerLens's [n_layers, n_heads] layout
    P = rep.to_tensor("P")
    assert P.shape == (2, n_heads) and P.dtype == torch.float64
    np.testing.assert_array_equal(P.reshape(-1).numpy(), rep.heads["P"].to_numpy())
    np.testing.assert_array_equal(rep.to_tensor("kv_head")[1].numpy(), np.arange(n_heads) // (n_heads // n_kv))


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
        n_layers=3,
        d_model=48,
        n_ctx=16,
        d_head=8,
        n_heads=6,
        d_vocab=20,
        act_fn="gelu",
        n_key_value_heads=None if n_kv == 6 else n_kv,
        normalization_type="LN",
        seed=3,
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
    from plotly.offline import get_plotlyjs_version

    rep = tiny_gqa_bridge.idempotence_report(progress=False)
    fig = rep.figure()
    assert fig.data[0].type == "heatmap" and np.asarray(fig.data[0].z).shape == (2, 9)
    out = rep.save_html(tmp_path / "r.html")
    assert out == str(tmp_path / "r.html")
    html = open(out, encoding="utf-8").read()
    # plotly.js is inlined exactly once (its licence banner names the bundled version) and every figure is drawn
    banner = f"* plotly.js v{get_plotlyjs_version()}\n* Copyright 2012-"
    assert html.count(banner) == 1
    assert html.count("Plotly.newPlot(") == len(rep.figures()) >= 1
    # no remote script or stylesheet: it renders offline
    assert not re.search(r"<script[^>]+src=[\"']?(https?:)?//", html, re.I), "report references a remote script"
    assert not re.search(r"<link[^>]+href=[\"']?(https?:)?//", html, re.I), "report references a remote stylesheet"
    assert "unpkg.com" not in html
    # the page leads with the answer: headline, closed heads (none here: the highest P), heatmap, paper comparison
    s = rep.summary
    head = f"{s['model_name']} ({s['model_class']}, "
    order = [
        html.index(x)
        for x in (
            '<p class="headline" id="headline">' + rep.headline + " " + head,  # rep.headline first
            'id="closed-heads"',
            'id="heatmap"',
            'id="paper"',
            'id="details"',
        )
    ]
    assert order == sorted(order)
    assert f"0 of 18 heads (0.00 %) are near-idempotent, P ≥ 0.9; median P {s['median_P']:.3g}." in html
    top = rep.heads.sort_values("P", ascending=False).index[0]
    assert html.index(f"<td>{top}</td>") < html.index('id="heatmap"')  # the highest-P head is in the first table
    assert "kv_head" in html


@pytest.fixture(scope="module")
def tiny_gqa_bridge(tmp_path_factory):
    path = tmp_path_factory.mktemp("tinygqa")
    tiny_hf_dir(path, n_layers=2, d_model=72, n_heads=9, n_kv_heads=3, seed=1)
    return bridge_from_dir(path)


@pytest.mark.bridge
def test_bad_input_errors(tiny_gqa_bridge):
    with pytest.raises(UnsupportedModelError, match="Cannot read attention heads from a object"):
        tli.idempotence_report(object())
    with pytest.raises(OptionError, match=r"threshold must be in \[0, 1\].*got 1.5"):
        tli.idempotence_report(tiny_gqa_bridge, threshold=1.5)
    # a wrong type is a TypeError: OptionTypeError from the library, or (in this test suite, which
    # instruments the package with jaxtyping/beartype) the annotation check that runs first
    with pytest.raises(TypeError, match="threshold"):
        tli.idempotence_report(tiny_gqa_bridge, threshold="0.5")
    with pytest.raises(OptionError, match=r"Unknown layer index \[5\]: this model's attention layers are 0\.\.1"):
        tli.idempotence_report(tiny_gqa_bridge, layers=[5], progress=False)
    with pytest.raises(TypeError, match="nulls"):
        tli.idempotence_report(tiny_gqa_bridge, nulls=1.7, progress=False)
    with pytest.raises(UnknownOptionError, match=r"'nuls' \(did you mean 'nulls'"):
        tli.idempotence_report(tiny_gqa_bridge, nuls=16)
    with pytest.raises(TypeError):  # every option is keyword-only
        tli.idempotence_report(tiny_gqa_bridge, 0.9)
    rep = tli.idempotence_report(tiny_gqa_bridge, layers=[1], progress=False)
    assert set(rep.heads.layer) == {1} and len(rep.heads) == 9
    assert list(rep.heads.index) == [f"L1H{h}" for h in range(9)]
    # a layer that was not measured is NaN in the [n_layers, n_heads] tensor
    P = rep.to_tensor("P")
    assert torch.isnan(P[0]).all() and torch.equal(P[1], torch.as_tensor(rep.heads["P"].to_numpy()))
    with pytest.raises(OptionError, match="'nope' is not a column"):
        rep.to_tensor("nope")
    with pytest.raises(OptionError, match="'reason' is not numeric"):
        rep.to_tensor("reason")


@pytest.mark.bridge
def test_another_threshold_recomputes(tiny_gqa_bridge):
    rep = tli.idempotence_report(tiny_gqa_bridge, nulls=8, progress=False)
    P = rep.heads["P"].to_numpy()
    assert rep.threshold == 0.9 and rep.summary["n_closed"] == 0
    t = float(np.sort(P)[-3])  # exactly three heads at or above it
    rep = rep.with_threshold(t)
    assert rep.threshold == t and rep.options.threshold == t and rep.summary["threshold"] == t
    assert rep.heads["closed"].sum() == 3 and rep.summary["n_closed"] == 3
    assert np.array_equal(rep.heads["closed"].to_numpy(), P >= t)
    assert list(rep.closed_heads.index) == list(rep.heads.sort_values("P", ascending=False).index[:3])
    assert rep.summary["frac_closed"] == pytest.approx(3 / 18)
    # the mismatch counts follow from the stored pairs
    pairs = rep.tables["mismatch_pairs"]
    assert rep.summary["n_mismatch_closed"] == int((pairs["P"] >= t).sum())
    # hook points of the closed heads, ready for run_with_hooks
    closed = rep.closed_heads
    assert rep.hook_points() == [(f"blocks.{l}.attn.hook_z", h) for l, h in zip(closed["layer"], closed["head"])]
    assert rep.hook_points([(1, 2)], hook="pattern") == [("blocks.1.attn.hook_pattern", 2)]
    assert len(rep.hook_points("all")) == 18
    with pytest.raises(OptionError, match="hook must be one of"):
        rep.hook_points(hook="zz")
    with pytest.raises(OptionError, match=r"threshold must be in \[0, 1\]"):
        rep.with_threshold(2.0)
    assert rep.threshold == t  # unchanged by a refused value


@pytest.mark.bridge
def test_save_and_load_round_trip(tmp_path, tiny_gqa_bridge):
    rep = tli.idempotence_report(tiny_gqa_bridge, nulls=8, algebra=True, progress=False)
    out = rep.save(tmp_path / "saved")
    assert out == str(tmp_path / "saved")
    names = sorted(p.name for p in (tmp_path / "saved").iterdir())
    assert "report.json" in names and "heads.parquet" in names and "layers.parquet" in names
    assert not [n for n in names if n.endswith((".pkl", ".pickle"))]  # no pickles
    back = tli.load_report(tmp_path / "saved")
    pd.testing.assert_frame_equal(back.heads, rep.heads)
    pd.testing.assert_frame_equal(back.layers, rep.layers)
    assert sorted(back.tables) == sorted(rep.tables)
    for k in rep.tables:
        pd.testing.assert_frame_equal(back.tables[k].reset_index(drop=True), rep.tables[k].reset_index(drop=True))
    assert back.options == rep.options and back.model is None
    # every summary number comes back, with the same key types
    assert back.summary == rep.summary
    assert {int(k): v for k, v in back.summary["closed_per_layer"].items()} == rep.summary["closed_per_layer"]
    pd.testing.assert_frame_equal(back.algebra.pairs, rep.algebra.pairs)
    with pytest.raises(OptionError, match="exists and is not empty"):
        rep.save(tmp_path / "saved")


@pytest.mark.bridge
def test_nan_weight_names_layer_and_head(tmp_path):
    path = tiny_hf_dir(tmp_path / "nanmodel", n_layers=2, d_model=72, n_heads=9, n_kv_heads=3, seed=2)
    model = bridge_from_dir(path)
    with torch.no_grad():
        model.blocks[1].attn.o.original_component.weight[5, 8 * 4 + 2] = float("nan")  # head 4 of layer 1
    with pytest.raises(WeightError, match=r"W_O of layer 1 contains NaN or inf at head 4 \(1 NaN"):
        tli.idempotence_report(model, progress=False)


def test_model_without_attention_is_rejected():
    class Cfg:
        n_heads = 4
        n_layers = 1
        d_model = 8
        d_head = 2

    class HookedTransformer(torch.nn.Module):  # a TransformerLens class name (recognised by name), no attention
        def __init__(self):
            super().__init__()
            self.cfg = Cfg()
            self.blocks = torch.nn.ModuleList([torch.nn.Linear(2, 2)])

    with pytest.raises(UnsupportedModelError, match="HookedTransformer has no attention layers"):
        TLModelSource(HookedTransformer())
    with pytest.raises(UnsupportedModelError, match="needs a TransformerLens model; got Module"):
        TLModelSource(torch.nn.Module())


def _unchecked_layer_heads(layer, O, V, kv):
    """A LayerHeads built without its (jaxtyping-instrumented) __init__, to reach its own validation."""
    lh = object.__new__(LayerHeads)
    for k, v in {"layer": layer, "O": O, "V": V, "kv_head_of": kv}.items():
        object.__setattr__(lh, k, v)
    return lh


def test_layer_heads_validates_shapes():
    O, V = torch.zeros(4, 16, 4), torch.zeros(2, 16, 4)
    kv = torch.tensor([0, 0, 1, 1])
    # LayerHeads' own checks (what users get; under this test suite jaxtyping checks the annotated
    # shapes/dtypes of __init__ first, so those cases are driven through __post_init__ directly)
    with pytest.raises(WeightError, match=r"Layer 0: O \(4, 16, 4\) and V \(2, 16, 5\) disagree"):
        _unchecked_layer_heads(0, O, torch.zeros(2, 16, 5), kv).__post_init__()
    with pytest.raises(WeightError, match=r"O has dtype torch\.int64; OV weights must be real floating point"):
        _unchecked_layer_heads(0, O.long(), V, kv).__post_init__()
    with pytest.raises(WeightError, match="kv_head_of must be an integer tensor"):
        _unchecked_layer_heads(0, O, V, kv.float()).__post_init__()
    with pytest.raises(WeightError, match=r"kv_head_of has shape \(3,\), expected \(4,\)"):
        _unchecked_layer_heads(0, O, V, kv[:3]).__post_init__()
    # ... and through the public constructor: the library's WeightError, or jaxtyping's shape check
    with pytest.raises((WeightError, TypeError)) as ei:
        LayerHeads(0, O, torch.zeros(2, 16, 5), kv)
    assert isinstance(ei.value, WeightError) or type(ei.value).__name__ == "TypeCheckError"
    # value checks no annotation can make
    with pytest.raises(WeightError, match=r"kv_head_of points outside the 2 kv heads \(\[0, 1, 2, 3\]\)"):
        LayerHeads(0, O, V, torch.tensor([0, 1, 2, 3]))
    with pytest.raises(WeightError, match="layer must be a non-negative int; got -1"):
        LayerHeads(-1, O, V, kv)
    with pytest.raises(WeightError, match="n_heads=9 is not a positive multiple of n_kv_heads=2"):
        tli.kv_layout(9, 2)


def test_layer_heads_fingerprint_is_sha256_of_the_bytes():
    g = torch.Generator().manual_seed(0)
    O, V = torch.randn(4, 16, 4, generator=g), torch.randn(2, 16, 4, generator=g)
    kv = tli.kv_layout(4, 2)
    a = LayerHeads(3, O, V, kv).fingerprint()
    assert re.fullmatch(r"[0-9a-f]{64}", a)  # a sha256 hex digest
    assert LayerHeads(3, O.clone(), V.clone(), kv.clone()).fingerprint() == a  # same bytes, same fingerprint
    assert LayerHeads(5, O, V, kv).fingerprint() == a  # the layer index is not part of the weights
    O2 = O.clone()
    O2.view(torch.int32)[2, 7, 1] ^= 1  # flip one bit
    assert LayerHeads(3, O2, V, kv).fingerprint() != a
    assert LayerHeads(3, O.double(), V.double(), kv).fingerprint() != a  # same values, other dtype
    assert LayerHeads(3, O, V, torch.tensor([0, 1, 0, 1])).fingerprint() != a  # other kv layout


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64])
def test_fingerprint_of_a_strided_layer_is_the_sha256_of_its_c_order_bytes(dtype):
    """A checkpoint's O is a strided view (o_proj split into heads), hashed head by head without a layer-sized
    copy: the digest must be exactly the sha256 of the header and the C-order bytes, as for a contiguous copy."""
    import hashlib

    g = torch.Generator().manual_seed(3)
    o_proj = torch.randn(24, 6 * 4, generator=g).to(dtype)
    O = o_proj.reshape(24, 6, 4).permute(1, 0, 2)  # [6 heads, d_model 24, d_head 4], not contiguous
    V = torch.randn(2 * 4, 24, generator=g).to(dtype).reshape(2, 4, 24).transpose(1, 2)
    kv = torch.arange(6) // 3
    assert not O.is_contiguous() and not V.is_contiguous()
    want = hashlib.sha256()
    for name, t in (("O", O.contiguous()), ("V", V.contiguous()), ("kv", kv)):
        want.update(f"{name}:{t.dtype}:{tuple(t.shape)};".encode() + t.view(torch.uint8).numpy().tobytes())
    strided = LayerHeads(0, O, V, kv).fingerprint()
    assert strided == want.hexdigest() == LayerHeads(0, O.contiguous(), V.contiguous(), kv).fingerprint()
    kv_strided = (torch.arange(12) // 6)[::2]  # a non-contiguous kv layout, same values
    assert not kv_strided.is_contiguous() and LayerHeads(0, O, V, kv_strided).fingerprint() == strided


def test_saved_summary_reads_back_exactly(tmp_path):
    lhs = [
        LayerHeads(
            l,
            torch.randn(4, 16, 4, dtype=torch.float64),
            torch.randn(2, 16, 4, dtype=torch.float64),
            tli.kv_layout(4, 2),
        )
        for l in range(2)
    ]
    rep = tli.idempotence_report(lhs, progress=False)
    assert rep.summary["closed_per_layer"] == {0: 0, 1: 0}
    back = tli.load_report(rep.save(tmp_path / "saved"))
    assert back.summary == rep.summary


def _fake_hooked_with_expanded_W_V(W_V: torch.Tensor, n_kv: int):
    """A stand-in TransformerLens model (by class name) whose attention exposes only an expanded W_V."""
    from types import SimpleNamespace

    class HookedTransformer:  # TLModelSource recognises TransformerLens models by class name
        pass

    n_heads, d_model, d_head = W_V.shape
    g = torch.Generator().manual_seed(5)
    m = HookedTransformer()
    m.cfg = SimpleNamespace(
        n_layers=1,
        n_heads=n_heads,
        n_key_value_heads=n_kv,
        d_model=d_model,
        d_head=d_head,
        model_name="fake",
        normalization_type=None,
    )
    W_O = torch.randn(n_heads, d_head, d_model, generator=g, dtype=torch.float64)
    m.blocks = [SimpleNamespace(attn=SimpleNamespace(W_O=W_O, W_V=W_V))]
    return m


def test_expanded_W_V_is_checked_before_one_copy_per_kv_head_is_kept():
    g = torch.Generator().manual_seed(4)
    V = torch.randn(2, 16, 4, generator=g, dtype=torch.float64)
    # repeat_interleave (TransformerLens's expansion): heads 0-2 read kv head 0, heads 3-5 kv head 1
    src = TLModelSource(_fake_hooked_with_expanded_W_V(V.repeat_interleave(3, dim=0), 2))
    lh = src.layer_heads(0)
    assert torch.equal(lh.V, V) and lh.kv_head_of.tolist() == [0, 0, 0, 1, 1, 1]
    # a tiled layout [k0, k1, k0, k1, k0, k1] would pair heads 1 and 4 with the wrong V: refused
    with pytest.raises(WeightError, match=r"heads \[1, 4\] differ from the first head of their kv group"):
        TLModelSource(_fake_hooked_with_expanded_W_V(V.repeat(3, 1, 1), 2)).layer_heads(0)
    # distinct values for every query head (not GQA at all): refused, not silently dropped
    with pytest.raises(WeightError, match="differ from the first head"):
        TLModelSource(
            _fake_hooked_with_expanded_W_V(torch.randn(6, 16, 4, generator=g, dtype=torch.float64), 2)
        ).layer_heads(0)


def test_a_zoo_record_of_raw_weights_is_not_trusted_after_the_model_was_processed():
    from tl_idempotence.sources.tl import tl_processing

    m = _fake_hooked_with_expanded_W_V(torch.randn(6, 16, 4, dtype=torch.float64), 6)
    m._tli_processing = {"processing": "raw", "raw": True, "fold_ln": False, "zoo_model": "fake"}
    rec = tl_processing(m)
    assert rec["raw"] is True and "stale_record" not in rec and rec["zoo_model"] == "fake"
    m.cfg.normalization_type = "RMSPre"  # what fold_ln leaves behind in a HookedTransformer
    rec = tl_processing(m)
    assert rec["raw"] is False and rec["fold_ln"] is True and rec["zoo_model"] == "fake"
    assert "processed since (fold_ln)" in rec["stale_record"]


def test_paper_table_at_another_threshold_says_the_papers_figures_are_at_0_9():
    from tl_idempotence.core.heads import kv_layout

    g = torch.Generator().manual_seed(9)
    layers = [
        LayerHeads(l, torch.randn(4, 16, 4, generator=g), torch.randn(2, 16, 4, generator=g), kv_layout(4, 2))
        for l in range(2)
    ]
    rep = tli.idempotence_report(layers, progress=False)
    assert not rep.paper_table()["note"].str.contains("paper's figure is at").any()  # at the paper's threshold
    rep = rep.with_threshold(0.01)
    tab = rep.paper_table()
    caveat = "the paper's figure is at P >= 0.9, this model's at P >= 0.01"
    assert tab.loc[0, "note"] == caveat and np.isfinite(tab.loc[0, "value"])
    assert (tab.loc[1:, "note"].str.contains("paper's figure is at").sum()) == 0  # NaN rows keep their reason only
    f = rep.paper_table(formatted=True)
    assert f.loc[0, "paper"] == f"3.98-8.00 % (per model) [{caveat}]"


def test_the_summary_is_typed_data_and_a_read_only_mapping(tmp_path):
    """rep.summary: fields by attribute, the set ones as a mapping (in order), a compact repr, JSON via to_dict,
    refused when a key is not a field; a saved report reads back the same typed summary."""
    from tl_idempotence.report.summary import ReportSummary

    g = torch.Generator().manual_seed(5)
    lhs = [
        LayerHeads(l, torch.randn(4, 16, 4, generator=g), torch.randn(2, 16, 4, generator=g), tli.kv_layout(4, 2))
        for l in range(2)
    ]
    rep = tli.idempotence_report(lhs, nulls=4, progress=False)
    s = rep.summary
    assert isinstance(s, ReportSummary) and s.n_heads == 8 and s["n_heads"] == 8 and s.n_scramble_draws == 4
    assert s.n_feasible_layers is None and "n_feasible_layers" not in s and s.get("n_feasible_layers") is None
    assert list(s)[:3] == ["model_name", "model_class", "n_layers"] and dict(s) == s.to_dict() == s
    with pytest.raises(KeyError):
        s["n_feasible_layers"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.n_closed = 3  # type: ignore[misc]
    assert len(repr(s).splitlines()) == 1 and "every field: .to_dict()" in repr(s)
    with pytest.raises(ValueError, match=r"summary keys \['n_clossed'\] are not fields"):
        ReportSummary.from_dict({**s.to_dict(), "n_clossed": 1})
    back = tli.load_report(rep.save(tmp_path / "r"))
    assert isinstance(back.summary, ReportSummary) and back.summary.closed_per_layer == s.closed_per_layer
    assert s.replace(n_params=7).n_params == 7 and s.n_params is None
