"""Checkpoint sources (SPEC section 9): safetensors dirs, GGUF, transformers models.

Synthetic checkpoints are written here with ``safetensors`` using the real tensor
names and layouts; every source must give back exactly the per-head O and V the
test put in, and the report must equal the in-memory computation on those tensors.
Layouts are also checked against TransformerLens's own conversion (TransformerBridge)
on tiny random ``transformers`` models of every architecture in the table.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

import tl_idempotence as tli
from helpers import (
    assert_matches,
    gpt2_like,
    llama_like,
    neox_like,
    random_heads,
    write_checkpoint,
)
from tl_idempotence.core.heads import Sizes, kv_layout
from tl_idempotence.errors import (
    CheckpointError,
    MissingFileError,
    UnknownOptionError,
    UnsupportedModelError,
    WeightError,
)
from tl_idempotence.sources.architectures import architecture_table, supported_architectures
from tl_idempotence.sources.checkpoint import _find_root, from_path
from tl_idempotence.sources.dispatch import head_source
from tl_idempotence.testing import bridge_from_dir, tiny_hf_dir

os.environ.setdefault("HF_HUB_OFFLINE", "1")


# --------------------------------------------------------------------------- layouts


def test_llama_gqa_sharded_exact(tmp_path):
    d, O, V = llama_like(tmp_path / "ck", nq=6, nkv=2, dm=48, dh=8, n_shards=3)
    src = from_path(d)
    assert src.info.n_kv_heads == 2 and src.info.d_head == 8 and src.info.processing["raw"] is True
    assert len(set(json.loads((d / "model.safetensors.index.json").read_text())["weight_map"].values())) == 3
    for l in range(3):
        lh = src.layer_heads(l)
        assert torch.equal(lh.O, O[l]) and torch.equal(lh.V, V[l])
        assert lh.kv_head_of.tolist() == [0, 0, 0, 1, 1, 1]
    rep = tli.idempotence_report(str(d), progress=False)
    assert len(rep.heads) == 18
    assert_matches(rep, O, V, 6, 2)
    p = rep.summary["processing"]
    assert p["source"] == "checkpoint file" and len(p["files"]) == 3 and len(p["index_sha256"]) == 64


def test_qwen3_moe_bf16_never_reads_experts(tmp_path, monkeypatch):
    """Attention tensors are read as stored (bf16); expert tensors are never read (spied), and a shard holding
    only (huge, sparse) expert tensors is never even opened."""
    dm, dh, nq, nkv, L, E = 64, 24, 8, 2, 3, 4  # head_dim != d_model / n_heads, as in Qwen3
    sparse = {
        f"model.layers.{l}.mlp.experts.{e}.{w}.weight": ([512, dm], "BF16")
        for l in range(L)
        for e in range(E, E + 2)
        for w in ("gate_proj", "up_proj")
    }
    d, O, V = llama_like(
        tmp_path / "ck",
        model_type="qwen3_moe",
        n_layers=L,
        nq=nq,
        nkv=nkv,
        dm=dm,
        dh=dh,
        dtype=torch.bfloat16,
        n_experts=E,
        sparse=sparse,
    )
    # make the experts-only shard corrupt: opening it would fail
    last = sorted(d.glob("model-*.safetensors"))[-1]
    with open(last, "r+b") as f:
        f.truncate(os.path.getsize(last) - 1)

    from safetensors import safe_open as real_safe_open

    read, opened = [], []

    class Spy:
        def __init__(self, path, framework):
            opened.append(Path(path).name)
            self.f = real_safe_open(path, framework=framework)

        def keys(self):
            return self.f.keys()

        def get_slice(self, name):
            read.append(name)
            return self.f.get_slice(name)

        def get_tensor(self, name):  # pragma: no cover - must not be used
            read.append(name)
            return self.f.get_tensor(name)

    import safetensors

    monkeypatch.setattr(safetensors, "safe_open", Spy)
    rep = tli.idempotence_report(str(d), progress=False)
    assert read and all(("self_attn.v_proj" in n or "self_attn.o_proj" in n) for n in read), set(read)
    assert last.name not in opened
    lh = from_path(d).layer_heads(2)
    assert lh.O.dtype == torch.bfloat16 and lh.V.dtype == torch.bfloat16
    Ob = [o.to(torch.bfloat16) for o in O]
    Vb = [v.to(torch.bfloat16) for v in V]
    assert torch.equal(lh.O, Ob[2]) and torch.equal(lh.V, Vb[2])
    assert_matches(rep, Ob, Vb, nq, nkv)


def test_gpt_neox_fused_interleaved_qkv(tmp_path):
    d, O, V = neox_like(tmp_path / "ck")
    src = from_path(d)
    for l in range(2):
        lh = src.layer_heads(l)
        assert torch.equal(lh.O, O[l]) and torch.equal(lh.V, V[l])
    assert_matches(tli.idempotence_report(str(d), progress=False), O, V, 4, 4)


def test_gpt2_conv1d(tmp_path):
    d, O, V = gpt2_like(tmp_path / "ck")
    src = from_path(d)
    assert src.root == "transformer."
    for l in range(2):
        lh = src.layer_heads(l)
        assert torch.equal(lh.O, O[l]) and torch.equal(lh.V, V[l])
    assert_matches(tli.idempotence_report(str(d), progress=False), O, V, 4, 4)


def test_single_file_and_path_forms(tmp_path):
    """model.safetensors without an index; the dir, the .safetensors file and config.json all work."""
    d, O, V = llama_like(tmp_path / "ck", n_shards=1, n_layers=2)
    (d / "model.safetensors.index.json").unlink()
    (d / "model-00001-of-00001.safetensors").rename(d / "model.safetensors")
    reps = [tli.idempotence_report(str(p), progress=False) for p in (d, d / "model.safetensors", d / "config.json")]
    for r in reps:
        assert_matches(r, O, V, 6, 2)
    assert len(reps[0].summary["processing"]["header_sha256"]["model.safetensors"]) == 64


# ---- against TransformerLens's own conversion, for every architecture in the table


@pytest.mark.parametrize("arch", ["llama", "gpt2", "bert"])
def test_tiny_hf_dir_equals_bridge(tmp_path, arch):
    d = tiny_hf_dir(tmp_path / f"ck_{arch[:2]}", arch=arch, n_kv_heads=3 if arch == "llama" else 9)
    r_file = tli.idempotence_report(str(d), progress=False)
    r_tl = tli.idempotence_report(bridge_from_dir(d), progress=False)
    np.testing.assert_allclose(r_file.heads["P"], r_tl.heads["P"], rtol=0, atol=1e-10)
    np.testing.assert_allclose(r_file.heads["alpha"], r_tl.heads["alpha"], rtol=1e-10, atol=0)
    assert r_file.summary["processing"]["raw"] is True


# --------------------------------------------------------------------------- bad files


def test_truncated_shard(tmp_path):
    """A truncated shard that holds attention tensors fails when the source is made (before any work).
    Shards holding only other tensors are never opened (see the Qwen3-MoE test)."""
    d, _, _ = llama_like(tmp_path / "ck")
    wm = json.loads((d / "model.safetensors.index.json").read_text())["weight_map"]
    shard = d / wm["model.layers.1.self_attn.v_proj.weight"]
    with open(shard, "r+b") as f:
        f.truncate(os.path.getsize(shard) - 100)
    with pytest.raises(CheckpointError, match=rf"{shard.name}.*truncated"):
        from_path(d)


def test_missing_tensor(tmp_path):
    d, _, _ = llama_like(tmp_path / "ck")
    idx = d / "model.safetensors.index.json"
    m = json.loads(idx.read_text())
    del m["weight_map"]["model.layers.2.self_attn.v_proj.weight"]
    idx.write_text(json.dumps(m))
    with pytest.raises(
        CheckpointError, match=r"Missing tensor 'model\.layers\.2\.self_attn\.v_proj\.weight'.*index\.json"
    ):
        from_path(d)


def test_tensor_missing_from_its_shard(tmp_path):
    d, _, _ = llama_like(tmp_path / "ck")
    idx = d / "model.safetensors.index.json"
    m = json.loads(idx.read_text())
    name = "model.layers.1.self_attn.o_proj.weight"
    other = next(f for f in sorted(set(m["weight_map"].values())) if f != m["weight_map"][name])
    m["weight_map"][name] = other
    idx.write_text(json.dumps(m))
    with pytest.raises(CheckpointError, match=rf"'{name}' is missing from shard .*{other}"):
        from_path(d)


def test_shape_mismatch_with_config(tmp_path):
    d, _, _ = llama_like(tmp_path / "ck", nq=6, nkv=2, dh=8)
    cfg = json.loads((d / "config.json").read_text())
    cfg["num_key_value_heads"] = 3
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(
        CheckpointError,
        match=r"'model\.layers\.0\.self_attn\.v_proj\.weight' in "
        r".*model-0000\d-of-00003"
        r"\.safetensors has shape \[16, 48\].*need \[24, 48\]",
    ):
        from_path(d)


def test_nan_in_weight_names_file_tensor_layer_head(tmp_path):
    d, _O, _V = llama_like(tmp_path / "ck")
    # poison layer 1, head 4 of W_O on disk
    idx = json.loads((d / "model.safetensors.index.json").read_text())["weight_map"]
    name = "model.layers.1.self_attn.o_proj.weight"
    from safetensors.torch import load_file

    shard = d / idx[name]
    t = load_file(str(shard))
    t[name][5, 4 * 8 + 2] = float("nan")
    save_file(t, str(shard))
    src = from_path(d)
    src.layer_heads(0)  # other layers fine
    with pytest.raises(WeightError, match=rf"'{name}' \(.*{shard.name}\), layer 1, .*NaN or inf at head 4\b"):
        src.layer_heads(1)
    with pytest.raises(WeightError, match=r"layer 1, .*head 4"):
        tli.idempotence_report(str(d), progress=False)


def test_index_points_to_missing_shard(tmp_path):
    d, _, _ = llama_like(tmp_path / "ck")
    shard = sorted(d.glob("model-*.safetensors"))[0]
    shard.unlink()
    with pytest.raises(MissingFileError, match=rf"Shard .*{shard.name} does not exist.*model\.layers"):
        from_path(d)


def test_unknown_architecture_lists_supported_and_how_to_add(tmp_path):
    d, O, V = llama_like(tmp_path / "ck", model_type="frobnicator")
    with pytest.raises(CheckpointError, match=r"frobnicator.*gpt_neox.*llama.*architecture='<that name>'.*\"layer\""):
        from_path(d)
    # the documented escape hatches: an existing entry, or a custom entry dict
    assert_matches(tli.idempotence_report(str(d), architecture="llama", progress=False), O, V, 6, 2)
    entry = {
        "layer": "layers.{l}.",
        "v": {"tensor": "self_attn.v_proj.weight", "layout": "linear"},
        "o": {"tensor": "self_attn.o_proj.weight", "layout": "linear"},
    }
    assert_matches(tli.idempotence_report(str(d), architecture=entry, progress=False), O, V, 6, 2)


def test_not_a_path_or_model(tmp_path):
    with pytest.raises(UnsupportedModelError, match=r"Cannot read attention heads from a float\. Supported: "):
        head_source(3.5)
    with pytest.raises(MissingFileError, match="nothing is downloaded"):
        from_path("no/such/dir")
    with pytest.raises(MissingFileError, match="nothing is downloaded"):
        head_source("no/such/dir")
    (tmp_path / "weights.bin").write_bytes(b"x")
    with pytest.raises(
        CheckpointError, match=r"weights\.bin: not a \.gguf file, a \.safetensors file or a model directory"
    ):
        from_path(tmp_path / "weights.bin")
    with pytest.raises(UnknownOptionError, match=r"'architectur' \(did you mean 'architecture'"):
        tli.idempotence_report(str(tmp_path), architectur="llama")


def test_table_is_well_formed():
    t = architecture_table()
    layouts = set(t["_format"]["layouts"])
    for name, e in t["architectures"].items():
        assert "{l}" in e["layer"], name
        assert e["v"]["layout"] in layouts and e["o"]["layout"] in layouts, name
    for alias, target in t["aliases"].items():
        assert target in t["architectures"], alias
    assert {
        "llama",
        "mistral",
        "qwen2",
        "qwen3",
        "qwen3_moe",
        "gemma",
        "gemma2",
        "gemma3_text",
        "gpt_neox",
        "gpt2",
        "olmo",
        "olmo2",
        "phi3",
        "bert",
    } <= set(supported_architectures())


# --------------------------------------------------------------------------- float32 products


def test_float32_products_accuracy_bound(tmp_path):
    """``compute_dtype=torch.float32`` (d_model-long products in float32, d_head algebra in float64) on a bf16
    checkpoint with P spread over [0, 1]: |ΔP| <= 1e-6 and |Δα| <= 1e-5 ‖T‖_F against the float64 path.
    Measured (d_model 4096, d_head 128, 16 heads): max |ΔP| = 5.8e-9, max relative Δα on closed heads 2.3e-7."""
    dm, dh, nq, nkv = 1024, 64, 12, 4
    O, V, _g = random_heads(1, nq, nkv, dm, dh, seed=3)
    O, V = O[0], V[0]
    kv = kv_layout(nq, nkv)
    for h in range(nq):  # blend an exact oblique projection (P = 1) with a random head (P ~ 0)
        Vk = V[kv[h]].double()
        proj = (Vk @ torch.linalg.inv(Vk.T @ Vk)).float()
        w = h / (nq - 1)
        O[h] = (1 - w) * proj / proj.norm() * O[h].norm() + w * O[h]
    t = {
        "model.layers.0.self_attn.v_proj.weight": V.transpose(1, 2).reshape(nkv * dh, dm),
        "model.layers.0.self_attn.o_proj.weight": O.permute(1, 0, 2).reshape(dm, nq * dh),
    }
    cfg = {
        "model_type": "qwen3",
        "hidden_size": dm,
        "num_attention_heads": nq,
        "num_key_value_heads": nkv,
        "num_hidden_layers": 1,
        "head_dim": dh,
    }
    d = write_checkpoint(tmp_path / "ck", cfg, {k: v.to(torch.bfloat16) for k, v in t.items()}, n_shards=1)
    r64 = tli.idempotence_report(str(d), progress=False).heads
    r32 = tli.idempotence_report(str(d), compute_dtype=torch.float32, progress=False).heads
    P = r64["P"].to_numpy()
    assert P.max() > 0.999 and P.min() < 0.05  # the range is really covered
    assert np.abs(P - r32["P"].to_numpy()).max() <= 1e-6
    assert (np.abs(r64["alpha"] - r32["alpha"]) <= 1e-5 * r64["norm"]).all()
    assert np.abs(P - r32["P"].to_numpy()).max() > 0  # float32 was really used


# --------------------------------------------------------------------------- GGUF (synthetic, written with gguf)


def write_gguf(path: Path, O, V, fused: bool = False, nan_at=None) -> list:
    """llama.cpp layout: blk.{l}.attn_v (F32) or attn_qkv (F32, rows [q; k; v]) and attn_output (Q8_0).

    Returns the O each layer holds after Q8_0 quantization (what a reader must give back)."""
    import gguf

    nq, dm, dh = O[0].shape
    nkv = V[0].shape[0]
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(len(O))
    w.add_embedding_length(dm)
    w.add_head_count(nq)
    w.add_head_count_kv(nkv)
    w.add_key_length(dh)
    O_q = []
    for l in range(len(O)):
        v = V[l].transpose(1, 2).reshape(nkv * dh, dm).numpy().copy()
        if nan_at is not None and nan_at[0] == l:
            v[nan_at[1] * dh + 1, 5] = np.nan
        if fused:
            qk = np.random.default_rng(l).standard_normal(((nq + nkv) * dh, dm)).astype(np.float32)
            w.add_tensor(f"blk.{l}.attn_qkv.weight", np.concatenate([qk, v]))
        else:
            w.add_tensor(f"blk.{l}.attn_v.weight", v)
        o = O[l].permute(1, 0, 2).reshape(dm, nq * dh).numpy()
        q = gguf.quants.quantize(o, gguf.GGMLQuantizationType.Q8_0)
        w.add_tensor(f"blk.{l}.attn_output.weight", q, raw_shape=q.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        deq = torch.from_numpy(gguf.quants.dequantize(q, gguf.GGMLQuantizationType.Q8_0))
        O_q.append(deq.reshape(dm, nq, dh).permute(1, 0, 2))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return O_q


@pytest.mark.parametrize("fused", [False, True])
def test_gguf_synthetic(tmp_path, fused):
    O, V, _ = random_heads(2, 6, 2, 64, 16, seed=4)
    O_q = write_gguf(tmp_path / "m.gguf", O, V, fused=fused)
    src = from_path(tmp_path / "m.gguf")
    assert (src.info.n_heads, src.info.n_kv_heads, src.info.d_head) == (6, 2, 16)
    assert src.info.processing["dequantized"] == ["F32", "Q8_0"]
    for l in range(2):
        lh = src.layer_heads(l)
        assert torch.equal(lh.V, V[l]) and torch.equal(lh.O, O_q[l])
        assert not torch.equal(lh.O, O[l])  # Q8_0 really was dequantized
    assert_matches(tli.idempotence_report(str(tmp_path / "m.gguf"), progress=False), O_q, V, 6, 2)


def test_gguf_truncated_and_nan(tmp_path):
    O, V, _ = random_heads(2, 6, 2, 64, 16, seed=4)
    write_gguf(tmp_path / "m.gguf", O, V)
    data = (tmp_path / "m.gguf").read_bytes()
    (tmp_path / "cut.gguf").write_bytes(data[: len(data) - 3000])
    with pytest.raises(CheckpointError, match=r"cut\.gguf.*truncated"):
        from_path(tmp_path / "cut.gguf")
    write_gguf(tmp_path / "nan.gguf", O, V, nan_at=(1, 1))
    with pytest.raises(
        WeightError, match=r"'blk\.1\.attn_v\.weight' \(.*nan\.gguf\), layer 1, .*NaN or inf at kv head 1\b"
    ):
        tli.idempotence_report(str(tmp_path / "nan.gguf"), progress=False)


def test_gguf_in_the_other_byte_order_is_refused(tmp_path):
    """gguf parses a big-endian file's metadata but hands its tensors back as native-order views: its F32
    weights would be read byte-swapped (garbage, no error). Refused, naming the file and the fix."""
    import gguf

    O, V, _ = random_heads(1, 4, 2, 32, 8, seed=5)
    w = gguf.GGUFWriter(str(tmp_path / "be.gguf"), "llama", endianess=gguf.GGUFEndian.BIG)
    for k, v in {"block_count": 1, "embedding_length": 32, "attention.head_count": 4}.items():
        w.add_uint32(f"llama.{k}", v)
    w.add_uint32("llama.attention.head_count_kv", 2)
    w.add_uint32("llama.attention.key_length", 8)
    w.add_tensor("blk.0.attn_v.weight", V[0].transpose(1, 2).reshape(16, 32).numpy().copy().byteswap())
    w.add_tensor("blk.0.attn_output.weight", O[0].permute(1, 0, 2).reshape(32, 32).numpy().copy().byteswap())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert gguf.GGUFReader(str(tmp_path / "be.gguf")).byte_order == "S"  # really the other byte order
    with pytest.raises(CheckpointError, match=r"be\.gguf is stored in the other byte order \(big-endian"):
        from_path(tmp_path / "be.gguf")
    with pytest.raises(CheckpointError, match=r"be\.gguf .*gguf-convert-endian"):
        tli.idempotence_report(str(tmp_path / "be.gguf"), progress=False)


def test_root_detection_prefers_the_language_model():
    """Multimodal checkpoints (e.g. Gemma 3) hold other towers with layer-like names; the text model wins, and
    an explicit prefix= overrides."""
    entry = architecture_table()["architectures"]["gemma3_text"]
    s = Sizes(n_layers=2, n_heads=4, n_kv_heads=2, d_model=64, d_head=16)
    keys = [
        f"{root}layers.{l}.self_attn.{w}_proj.weight"
        for root in ("vision_tower.encoder.", "model.language_model.")
        for l in range(2)
        for w in ("v", "o")
    ]
    keys += [
        "multi_modal_projector.layers.0.self_attn.v_proj.weight",
        "multi_modal_projector.layers.0.self_attn.o_proj.weight",
    ]
    assert _find_root(keys, entry, s, None, "x") == "model.language_model."
    assert _find_root(keys, entry, s, "vision_tower.encoder.", "x") == "vision_tower.encoder."
    with pytest.raises(CheckpointError, match=r"missing tensor.*layers\.0\.self_attn\.v_proj\.weight"):
        _find_root(["model.embed.weight"], entry, s, None, "x")
