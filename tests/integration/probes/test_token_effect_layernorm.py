"""tli.attended_token_effect on a LayerNorm model (the centring path, SPEC 12) against TransformerLens's own cache.

A LayerNorm centres the residual stream before dividing by ``ln_final.hook_scale``, so a head's direct logit effect is
``centre(z @ W_O) / scale @ W_U`` (TransformerLens's ``apply_ln_to_stack``). The library applies the centring to
``W_U`` (over ``d_model``) instead; this test recomputes every position from ``run_with_cache`` the other way round
(centring the head's output in the residual, raw ``W_U``, dense float64 logits over the vocabulary). The tiny GPT-2
gets a per-token offset along the all-ones direction of its (tied) embedding, which the centring removes, so an
effect computed without the centring is far off (asserted below). The SmolLM2 counterpart (RMSNorm, no centring)
is test_head_tokens_smollm2.py.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tl_idempotence as tli
from helpers import edit_safetensors, hooked_or_skip
from tl_idempotence.testing import bridge_from_dir, tiny_hf_dir

HEADS = [(0, 1), (1, 2), (1, 3)]


@pytest.fixture(scope="module")
def ln_dir(tmp_path_factory):
    """Tiny GPT-2 (LayerNorm, tied W_U = W_Eᵀ; 2 layers, 4 heads, d_model 48, 100 tokens), each token's embedding
    shifted by its own multiple of the all-ones vector (std 0.5; the init's entries have std 0.02)."""
    d = tiny_hf_dir(tmp_path_factory.mktemp("ln_effect") / "tinyg", arch="gpt2", n_layers=2, d_model=48, n_heads=4,
                    n_ctx=128)  # fmt: skip

    def shift(t):
        g = torch.Generator().manual_seed(3)
        w = t["transformer.wte.weight"]  # [d_vocab, d_model]
        t["transformer.wte.weight"] = w + 0.5 * torch.randn(w.shape[0], 1, generator=g)

    edit_safetensors(d, shift)
    return d


def _tokens() -> torch.Tensor:
    toks = torch.randint(4, 100, (3, 24), generator=torch.Generator().manual_seed(0))
    toks[:, 0] = 1  # BOS of the tiny tokenizer: never a source or a destination
    return toks


def reference(model, toks: torch.Tensor, layer: int, head: int, centre: bool = True) -> list[tuple]:
    """Per counted destination (window, pos, source, standardized effect, raw effect) from ``run_with_cache``: the
    head's ``hook_z @ W_O`` centred over ``d_model`` as the LayerNorm centres the residual, divided by
    ``ln_final.hook_scale``, through the raw ``W_U`` (dense float64 rows)."""
    _, cache = model.run_with_cache(toks)
    z = cache[f"blocks.{layer}.attn.hook_z"][:, :, head].double()  # [B, P, d_head]
    pat = cache[f"blocks.{layer}.attn.hook_pattern"][:, head].double()  # [B, q, k]
    scale = cache["ln_final.hook_scale"][..., 0].double()  # [B, P]
    y = z @ model.blocks[layer].attn.W_O[head].detach().double()  # [B, P, d_model]
    if centre:
        y = y - y.mean(-1, keepdim=True)
    logits = y / scale.unsqueeze(-1) @ model.W_U.detach().double()  # [B, P, d_vocab]
    counted = toks != 1
    out = []
    for b in range(toks.shape[0]):
        for q in range(toks.shape[1]):
            if not counted[b, q]:
                continue
            s = max((k for k in range(q + 1) if counted[b, k]), key=lambda k: (pat[b, q, k].item(), -k))
            row, t = logits[b, q], int(toks[b, s])
            out.append((b, q, s, float((row[t] - row.mean()) / row.std(unbiased=False)), float(row[t])))
    return out


@pytest.mark.parametrize("cls", [pytest.param("bridge", marks=pytest.mark.bridge), "hooked"])
def test_layernorm_effect_equals_transformer_lens_cache_with_the_centring(cls, ln_dir):
    """Every position's source, standardized and raw effect of three heads equals the cache computation to float
    rounding; the table's medians are those of the positions; without the centring the reference is far off."""
    model = bridge_from_dir(ln_dir) if cls == "bridge" else hooked_or_skip(ln_dir)
    assert model.cfg.normalization_type == "LN"
    toks = _tokens()
    r = tli.attended_token_effect(model, heads=HEADS, texts=toks, batch_size=2, max_tokens=None)
    assert r.summary["final_norm"] == "LayerNorm (centred, / hook_scale)"
    pos = r.positions
    for layer, head in HEADS:
        lab = f"L{layer}H{head}"
        p = pos[pos["label"] == lab].reset_index(drop=True)
        ref = reference(model, toks, layer, head)
        assert len(p) == len(ref) == int((toks != 1).sum())
        np.testing.assert_array_equal(p[["window", "pos", "source_pos"]].to_numpy(), [x[:3] for x in ref])
        np.testing.assert_array_equal(p["token"], [int(toks[x[0], x[2]]) for x in ref])
        np.testing.assert_allclose(p["effect"], [x[3] for x in ref], rtol=1e-9, atol=1e-9)
        np.testing.assert_allclose(p["raw_effect"], [x[4] for x in ref], rtol=1e-9, atol=1e-12)
        row = r.table.loc[lab]
        assert row["n_positions"] == len(p) and row["effect_median"] == np.median(p["effect"])
        assert row["frac_negative"] == np.mean(p["effect"] < 0)
        # the test can see a missing centring: the uncentred numbers differ by far more than rounding
        raw = reference(model, toks, layer, head, centre=False)
        assert np.max(np.abs(np.array([x[3] for x in raw]) - p["effect"].to_numpy())) > 0.1
