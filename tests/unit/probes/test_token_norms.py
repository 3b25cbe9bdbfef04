"""The norms and dtypes around the token probes, in the quick tier (issue 46; docs/definitions.md §12).

* LayerNorm: the direct effect centres ``W_U`` over ``d_model`` (what the final LayerNorm's centring does to a
  head's output): on a tiny GPT-2 bridge whose embeddings carry a per-token offset along the all-ones direction,
  every position equals TransformerLens's cache computed the other way round, and the uncentred numbers are far off.
* A norm after ``W_O`` (Gemma-2, by the one rule ``post_attention_note``): the direct effect passes through its
  run-time scale (``blocks.{l}.ln1_post.hook_scale``, read from the run, as the final norm's), or the model is
  refused; the readout's headline says the norm is left out.
* ``embedding_tie`` across dtypes: ``W_U`` a bfloat16 copy of a float32 ``W_Eᵀ`` is tied within the coarser
  dtype's rounding; a difference beyond it is not.
* ``summary["processing"]`` records every processing flag (``center_unembed`` inferred from ``W_U``).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import tl_idempotence as tli
from helpers import edit_safetensors, saved_tiny_model
from tl_idempotence.errors import UnsupportedModelError
from tl_idempotence.probes.tied import embedding_tie
from tl_idempotence.testing import bridge_from_dir, tiny_hf_dir

pytestmark = pytest.mark.bridge


def _reference(model, toks, layer, head, centre=False, post=False):
    """Per counted destination ``(window, pos, source, standardized effect, raw effect)`` from ``run_with_cache``:
    the head's ``hook_z @ W_O`` (centred over d_model for a LayerNorm; divided by the post-attention norm's scale),
    divided by ``ln_final.hook_scale``, through the raw ``W_U`` in dense float64 rows."""
    _, cache = model.run_with_cache(toks)
    z = cache[f"blocks.{layer}.attn.hook_z"][:, :, head].double()
    pat = cache[f"blocks.{layer}.attn.hook_pattern"][:, head].double()
    y = z @ model.blocks[layer].attn.W_O[head].detach().double()
    if centre:
        y = y - y.mean(-1, keepdim=True)
    if post:
        y = y / cache[f"blocks.{layer}.ln1_post.hook_scale"].double()
    logits = y / cache["ln_final.hook_scale"].double() @ model.W_U.detach().double()
    counted = toks != 1
    out = []
    for b in range(toks.shape[0]):
        for q in range(toks.shape[1]):
            if counted[b, q]:
                s = max((k for k in range(q + 1) if counted[b, k]), key=lambda k: (pat[b, q, k].item(), -k))
                row, t = logits[b, q], int(toks[b, s])
                out.append((b, q, s, float((row[t] - row.mean()) / row.std(unbiased=False)), float(row[t])))
    return out


def _tokens(vocab, n=2, length=14):
    toks = torch.randint(4, vocab, (n, length), generator=torch.Generator().manual_seed(0))
    toks[:, 0] = 1  # BOS of the tiny tokenizer
    return toks


def test_layernorm_effect_centres_w_u(tmp_path):
    d = tiny_hf_dir(tmp_path / "ln", arch="gpt2", n_layers=1, d_model=16, n_heads=2)

    def shift(t):
        w = t["transformer.wte.weight"]
        t["transformer.wte.weight"] = w + 0.5 * torch.randn(w.shape[0], 1, generator=torch.Generator().manual_seed(3))

    edit_safetensors(d, shift)
    m = bridge_from_dir(d)
    toks = _tokens(100)
    r = tli.attended_token_effect(m, heads=["L0H1"], texts=toks, progress=False)
    assert r.summary["final_norm"] == "LayerNorm (centred, / hook_scale)"
    p = r.positions
    ref = _reference(m, toks, 0, 1, centre=True)
    np.testing.assert_array_equal(p[["window", "pos", "source_pos"]].to_numpy(), [x[:3] for x in ref])
    np.testing.assert_allclose(p["effect"], [x[3] for x in ref], rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(p["raw_effect"], [x[4] for x in ref], rtol=1e-9, atol=1e-12)
    raw = _reference(m, toks, 0, 1, centre=False)  # the test can see a missing centring
    assert np.max(np.abs(np.array([x[3] for x in raw]) - p["effect"].to_numpy())) > 0.1


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _, d = saved_tiny_model(tmp_path_factory.mktemp("gemma2"), "gemma2", "Gemma2ForCausalLM")
        return bridge_from_dir(d)


def test_a_norm_after_w_o_is_passed_through_with_its_run_time_scale(gemma):
    toks = _tokens(128)
    _, cache = gemma.run_with_cache(toks)
    # the hook's scale is what divides the attention output (its normalized value is the output over the scale)
    out = cache["blocks.0.attn.hook_out"].double()
    np.testing.assert_allclose(
        (out / cache["blocks.0.ln1_post.hook_scale"].double()).numpy(),
        cache["blocks.0.ln1_post.hook_normalized"].double().numpy(),
        rtol=1e-4,
        atol=1e-5,
    )
    r = tli.attended_token_effect(gemma, heads=["L0H1", "L1H2"], texts=toks, progress=False)
    assert "ln1_post.hook_scale" in r.summary["final_norm"]
    pos = r.positions
    for lab, (layer, head) in (("L0H1", (0, 1)), ("L1H2", (1, 2))):
        p = pos[pos["label"] == lab]
        ref = _reference(gemma, toks, layer, head, post=True)
        np.testing.assert_allclose(p["raw_effect"], [x[4] for x in ref], rtol=1e-6)
        np.testing.assert_allclose(p["effect"], [x[3] for x in ref], rtol=1e-6, atol=1e-6)
        without = _reference(gemma, toks, layer, head, post=False)  # the scale changes the raw numbers
        assert np.max(np.abs(np.array([x[4] for x in without]) / p["raw_effect"].to_numpy() - 1)) > 0.1
    ht = tli.head_tokens(gemma, heads=["L0H0"], n_tokens=8, k=2, progress=False)
    assert "passes through a norm after W_O" in ht.headline and "leaves that norm out" in ht.headline


def test_a_norm_after_w_o_without_a_hook_for_its_scale_is_refused(gemma, monkeypatch):
    cls = type(gemma)
    hooks = cls.hook_dict.fget(gemma)
    monkeypatch.setattr(
        cls, "hook_dict", property(lambda self: {k: v for k, v in hooks.items() if "ln1_post" not in k})
    )
    missing = r"norm after W_O.*'blocks\.0\.ln1_post\.hook_scale' missing"
    with pytest.raises(UnsupportedModelError, match=missing):
        tli.attended_token_effect(gemma, texts=_tokens(128), progress=False)


def test_embedding_tie_takes_its_tolerance_from_the_coarser_dtype(bridge, monkeypatch):
    cls = type(bridge)
    W_E = bridge.W_E.detach().float().clone()
    U16 = W_E.T.to(torch.bfloat16)  # bfloat16 rounding: up to 2^-8 relative, far above float32's 2^-23
    assert float((U16.float() - W_E.T).abs().max()) > 1e-5
    monkeypatch.setattr(cls, "W_E", property(lambda self: W_E))
    monkeypatch.setattr(cls, "W_U", property(lambda self: U16))
    t = embedding_tie(bridge)
    assert (t.tied, t.how, t.dtypes) == (True, "float rounding", "float32 / bfloat16")
    off = U16.clone()
    off[3, 5] = off[3, 5] * 1.1 + 0.01  # beyond bfloat16's rounding
    monkeypatch.setattr(cls, "W_U", property(lambda self: off))
    assert embedding_tie(bridge).how == "untied"


def test_processing_records_every_flag(bridge):
    r = tli.head_tokens(bridge, heads=["L0H0"], n_tokens=4, k=1, progress=False)
    proc = r.summary["processing"]
    for flag in ("fold_ln", "center_writing_weights", "center_unembed", "fold_value_biases"):
        assert flag in proc, flag
    assert proc["center_unembed"] is False and "W_U's row means" in proc["center_unembed_note"]
    assert proc["fold_value_biases"] is None and "not recorded" in proc["fold_value_biases_note"]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return tiny_hf_dir(tmp_path_factory.mktemp("token_norms") / "tiny", n_layers=1)


def test_progress_bars_go_to_stderr_and_can_be_switched_off(bridge, capsys):
    from tl_idempotence.errors import OptionTypeError

    toks = torch.randint(4, 100, (2, 10), generator=torch.Generator().manual_seed(1))
    tli.head_tokens(bridge, heads=["L0H0"], n_tokens=4, k=1)
    tli.attended_token_effect(bridge, heads=["L0H0"], texts=toks, batch_size=1)
    out, err = capsys.readouterr()
    assert out == "" and "token readout (1 heads x 4 tokens" in err and "attended-token effect (2 windows" in err
    tli.head_tokens(bridge, heads=["L0H0"], n_tokens=4, k=1, progress=False)
    tli.attended_token_effect(bridge, heads=["L0H0"], texts=toks, progress=False)
    assert capsys.readouterr() == ("", "")
    for fn in (tli.head_tokens, tli.attended_token_effect):
        with pytest.raises(OptionTypeError, match="progress"):
            fn(bridge, heads=["L0H0"], progress="yes")
