"""The checkpoint reader in a fresh process (peak memory) and on the real SmolLM2 GGUF file; its unit tests are
tests/unit/sources/test_checkpoint.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

import tl_idempotence as tli
from helpers import (
    random_heads,
    write_sparse_shard,
)
from tl_idempotence.sources.checkpoint import from_path
from tl_idempotence.testing import bridge_from_dir, tiny_tokenizer


@pytest.mark.slow
def test_real_smollm2_gguf_equals_zoo_model(smollm2_gguf, smollm2):
    """The Q4_1 GGUF dequantized layer by layer equals the zoo's (fp32, raw) TransformerBridge report."""
    r_gguf = tli.idempotence_report(str(smollm2_gguf), progress=False)
    r_zoo = tli.idempotence_report(smollm2, progress=False)
    assert r_gguf.info.n_layers == 30 and r_gguf.info.n_kv_heads == 3 and r_gguf.info.d_head == 64
    assert r_gguf.summary["processing"]["format"] == "gguf"
    np.testing.assert_allclose(r_gguf.heads["P"], r_zoo.heads["P"], rtol=0, atol=1e-10)
    np.testing.assert_allclose(r_gguf.heads["alpha"], r_zoo.heads["alpha"], rtol=1e-10, atol=0)


_RSS_CHILD = textwrap.dedent(
    """
    import sys, json
    import tl_idempotence as tli
    from tl_idempotence.sources.checkpoint import from_path

    def hwm_kb():  # this process's peak RSS (ru_maxrss would start at the forking parent's RSS)
        return int(next(l for l in open("/proc/self/status") if l.startswith("VmHWM:")).split()[1])

    src = from_path(sys.argv[1])
    # warm imports and allocator on a one-layer report (tl_idempotence imports lazily: the report's
    # modules, pandas and tqdm load on first use and must not count as weight memory)
    tli.idempotence_report(src, layers=[0], progress=False)
    base = hwm_kb()
    rep = tli.idempotence_report(src, progress=False)
    print(json.dumps({"base_kb": base, "peak_kb": hwm_kb(), "n": len(rep.heads)}))
    """
)


@pytest.mark.integration  # fresh processes or a real model's files read whole: CI's integration tier
def test_peak_rss_independent_of_mlp_and_layers(tmp_path):
    """8 layers whose shards hold 6 GiB of (sparse) expert tensors next to the attention tensors, memory-mapped
    whole: peak RSS grows by a few layers' O and V in float64 over a one-layer read, far below the file size."""
    L, dm, dh, nq, nkv = 8, 256, 32, 8, 2
    O, V, _g = random_heads(L, nq, nkv, dm, dh)
    d = tmp_path / "ck"
    d.mkdir()
    weight_map = {}
    for s in range(2):  # two shards, each: 4 layers of attention + 4 x 2 x 384 MiB expert holes
        att, holes = {}, {}
        for l in range(4 * s, 4 * s + 4):
            p = f"model.layers.{l}."
            att[p + "self_attn.v_proj.weight"] = V[l].transpose(1, 2).reshape(nkv * dh, dm)
            att[p + "self_attn.o_proj.weight"] = O[l].permute(1, 0, 2).reshape(dm, nq * dh)
            for e in range(2):
                holes[p + f"mlp.experts.{e}.down_proj.weight"] = ([dm, 768 * 1024], "BF16")
        fname = f"model-{s + 1:05d}-of-00002.safetensors"
        write_sparse_shard(d / fname, holes, tensors=dict(reversed(list(att.items()))))
        weight_map.update({n: fname for n in [*att, *holes]})
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    cfg = {
        "model_type": "qwen3_moe",
        "hidden_size": dm,
        "num_attention_heads": nq,
        "num_key_value_heads": nkv,
        "num_hidden_layers": L,
        "head_dim": dh,
    }
    (d / "config.json").write_text(json.dumps(cfg))
    apparent = sum(os.path.getsize(f) for f in d.glob("*.safetensors"))
    on_disk = sum(os.stat(f).st_blocks * 512 for f in d.glob("*.safetensors"))
    assert apparent > 6e9 and on_disk < 50e6, (apparent, on_disk)
    assert torch.equal(from_path(d).layer_heads(5).O, O[5])

    out = subprocess.run(
        [sys.executable, "-c", _RSS_CHILD, str(d)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert out.returncode == 0, out.stderr[-2000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["n"] == L * nq
    print("peak RSS", r)
    grow_mb = (r["peak_kb"] - r["base_kb"]) / 1024
    layer_f64_mb = (nq + nkv) * dm * dh * 8 / 2**20
    assert grow_mb < 64 + 4 * layer_f64_mb, r
    assert r["peak_kb"] * 1024 < apparent / 8, r


def _tiny_transformers(model_type: str, path: Path):
    import transformers

    kw = dict(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=96,
        vocab_size=100,
        max_position_embeddings=64,
        pad_token_id=3,
        bos_token_id=1,
        eos_token_id=2,
    )
    if model_type == "gpt_neox":
        kw.pop("num_key_value_heads")
    if model_type in ("gemma", "gemma2", "gemma3_text", "qwen3", "qwen3_moe"):
        kw["head_dim"] = 24  # != 64 / 4
    if model_type == "qwen3_moe":
        kw.update(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)
    cfg = transformers.AutoConfig.for_model(model_type, **kw)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    model.save_pretrained(path)
    tiny_tokenizer(100).save_pretrained(path)
    return model


TABLE_ARCHS = [
    "mistral",
    "qwen2",
    "qwen3",
    "qwen3_moe",
    "gemma",
    "gemma2",
    "gemma3_text",
    "olmo",
    "olmo2",
    "phi3",
    "gpt_neox",
]


@pytest.mark.parametrize("model_type", TABLE_ARCHS)
def test_table_layout_matches_transformerbridge(tmp_path, model_type):
    """File source == transformers-model source == TransformerBridge (raw weights), to 1e-10 (here: exactly)."""
    d = tmp_path / f"m{abs(hash(model_type)) % 10**6}"  # keep family names out of the path (TL 3.x dispatch)
    model = _tiny_transformers(model_type, d)
    r_file = tli.idempotence_report(str(d), progress=False)
    r_model = tli.idempotence_report(model, progress=False)
    r_tl = tli.idempotence_report(bridge_from_dir(d), progress=False)
    assert r_file.info.n_kv_heads == (4 if model_type == "gpt_neox" else 2)
    assert r_file.info.d_head == (24 if model_type in ("gemma", "gemma2", "gemma3_text", "qwen3", "qwen3_moe") else 16)
    for r in (r_model, r_tl):
        np.testing.assert_allclose(r_file.heads["P"], r.heads["P"], rtol=0, atol=1e-10)
        np.testing.assert_allclose(r_file.heads["alpha"], r.heads["alpha"], rtol=1e-10, atol=0)
    assert np.isfinite(r_file.heads["P"]).all()
