"""tli.ablation: next-token loss with flagged heads ablated at hook_z, against matched random head sets.

Exact mechanics on tiny models whose weights the test sets (TransformerBridge, and HookedTransformer on
transformer-lens 3.x): a head whose W_O is zero changes nothing (Δ = 0 exactly, mean and zero ablation);
zero-ablating every head of a layer equals replacing the layer's attention output by b_O (exactly; and not
by 0 when b_O ≠ 0); mean ablation is the mean of z over the counted positions; controls are matched layer by
layer and deterministic for the seed; the p-value is the documented formula; every argument is checked.
One real run on SmolLM2 (slow) prints the closed heads against matched controls.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from safetensors.torch import load_file, save_file

import tl_idempotence as tli
from tl_idempotence.analyses.ablation import MAX_CONTROLS, ablation, matched_controls, next_token_loss
from tl_idempotence.analyses.tokens import prepare_tokens
from tl_idempotence.errors import OptionError, UnknownOptionError, UnsupportedModelError
from tl_idempotence.testing import bridge_from_dir, hooked_from_dir, tiny_hf_dir

ZERO_HEAD = (1, 4)  # layer 1, head 4: W_O set to zero in the checkpoint
# 6 windows of 24 token ids: BOS (id 1) then ordinary tokens (ids 4..99; 0..3 are the tiny tokenizer's specials)
_BODY = torch.randint(4, 100, (6, 23), generator=torch.Generator().manual_seed(0))
TOKENS = torch.cat([torch.ones(6, 1, dtype=torch.long), _BODY], 1)
TEXTS = ["w5 w6 w7 w8 w9 w10 w11 w12 w13 w14 w15 w16"] * 4
KW = {"seq_len": 24, "progress": False}


def edit_safetensors(path: Path, fn) -> None:
    f = path / "model.safetensors"
    t = load_file(f)
    fn(t)
    save_file(t, str(f), metadata={"format": "pt"})


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    """Llama/GQA (2 layers, 9 heads on 3 kv heads, d_head 8) with head L1H4's W_O zeroed in the HF weights."""
    d = tiny_hf_dir(tmp_path_factory.mktemp("abl") / "tiny", n_layers=2)
    layer, head = ZERO_HEAD

    def zero(t):
        W = t[f"model.layers.{layer}.self_attn.o_proj.weight"]  # [d_model, n_heads * d_head]: head h = columns h*8..
        W[:, head * 8 : (head + 1) * 8] = 0.0

    edit_safetensors(d, zero)
    return d


@pytest.fixture(scope="module")
def bridge(tiny_dir):
    return bridge_from_dir(tiny_dir)


@pytest.fixture(scope="module")
def hooked(tiny_dir):
    try:
        return hooked_from_dir(tiny_dir)
    except ImportError as e:  # transformer-lens 4.x has no HookedTransformer
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def gpt2_bridge(tmp_path_factory):
    """GPT-2 (MHA, attention output bias b_O) with a non-zero b_O in layer 0."""
    d = tiny_hf_dir(tmp_path_factory.mktemp("abl") / "tinyg", arch="gpt2", n_layers=2, d_model=64, n_heads=4)

    def bias(t):
        g = torch.Generator().manual_seed(1)
        t["transformer.h.0.attn.c_proj.bias"] = torch.randn(64, generator=g)

    edit_safetensors(d, bias)
    return bridge_from_dir(d)


def model_of(request, name):
    return request.getfixturevalue(name)


def losses_with(model, hooks, toks, counted, batch_size=8):
    """The loss as ablation computes it (same batches), with the given hooks."""
    total, n = 0.0, 0
    with torch.no_grad():
        for s in range(0, len(toks), batch_size):
            logits = model.run_with_hooks(toks[s : s + batch_size], fwd_hooks=hooks, return_type="logits")
            a, b = next_token_loss(logits, toks[s : s + batch_size], counted[s : s + batch_size])
            total += a
            n += b
    return total / n


@pytest.mark.parametrize("name", [pytest.param("bridge", marks=pytest.mark.bridge), "hooked"])
@pytest.mark.parametrize("kind", ["mean", "zero"])
def test_a_head_whose_W_O_is_zero_changes_nothing(request, name, kind):
    model = model_of(request, name)
    layer, head = ZERO_HEAD
    assert torch.count_nonzero(model.blocks[layer].attn.W_O[head]) == 0
    ab = ablation(model, [ZERO_HEAD, (layer, 3)], TOKENS, kind=kind, n_controls=0, **KW)
    h = ab.heads
    assert h.loc["L1H4", "delta_loss"] == 0.0 and h.loc["L1H4", "loss_ablated"] == ab.summary["loss_clean"]
    assert abs(h.loc["L1H3", "delta_loss"]) > 1e-5  # a head that writes something does change the loss
    assert ab.summary["delta_loss"] == ab.heads.loc["L1H3", "delta_loss"]  # the set = L1H3 alone + a silent head
    assert np.isnan(ab.summary["p_value"]) and "n_controls=0" in ab.summary["note"]


@pytest.mark.parametrize("name", [pytest.param("bridge", marks=pytest.mark.bridge), "hooked"])
def test_zero_ablating_a_layer_removes_its_attention_output(request, name):
    """Every head of layer 0 at z = 0 <=> the layer's attention output is b_O alone (0 for Llama: removed)."""
    model = model_of(request, name)
    ab = ablation(model, [(0, h) for h in range(9)], TOKENS, kind="zero", n_controls=0, **KW)
    toks, counted = prepare_tokens(model, TOKENS, seq_len=24, max_tokens=4096)
    b_O = model.blocks[0].attn.b_O
    assert b_O is None or torch.count_nonzero(b_O) == 0  # Llama: no output bias

    def removed(x, hook):
        return torch.zeros_like(x)

    assert losses_with(model, [("blocks.0.hook_attn_out", removed)], toks, counted) == ab.summary["loss_ablated"]
    assert losses_with(model, [], toks, counted) == ab.summary["loss_clean"]


@pytest.mark.bridge
def test_zero_ablation_keeps_the_output_bias(gpt2_bridge):
    """With b_O ≠ 0, zero-ablating every head leaves exactly b_O (it belongs to no head), not 0."""
    model = gpt2_bridge
    b_O = model.blocks[0].attn.b_O.detach()
    assert torch.count_nonzero(b_O) == 64
    ab = ablation(model, [(0, h) for h in range(4)], TOKENS, kind="zero", n_controls=0, **KW)
    toks, counted = prepare_tokens(model, TOKENS, seq_len=24, max_tokens=4096)

    def only_bias(x, hook):
        return torch.zeros_like(x) + b_O

    def nothing(x, hook):
        return torch.zeros_like(x)

    assert losses_with(model, [("blocks.0.hook_attn_out", only_bias)], toks, counted) == ab.summary["loss_ablated"]
    assert (
        abs(losses_with(model, [("blocks.0.hook_attn_out", nothing)], toks, counted) - ab.summary["loss_ablated"])
        > 1e-4
    )


@pytest.mark.bridge
def test_mean_ablation_uses_the_mean_over_counted_positions(bridge):
    layer, head = 1, 3
    ab = ablation(bridge, [(layer, head)], TOKENS, kind="mean", n_controls=0, **KW)
    toks, counted = prepare_tokens(bridge, TOKENS, seq_len=24, max_tokens=4096)
    assert not counted[:, 0].any() and counted[:, 1:].all()  # BOS at position 0 is the only special token
    with torch.no_grad():
        _, cache = bridge.run_with_cache(toks, names_filter=f"blocks.{layer}.attn.hook_z")
    z = cache[f"blocks.{layer}.attn.hook_z"][..., head, :].double()  # [batch, pos, d_head]

    def replaced_by(value):
        def hook(x, hook):
            x = x.clone()
            x[..., head, :] = value.to(x.dtype)
            return x

        return [(f"blocks.{layer}.attn.hook_z", hook)]

    mean_counted = z[counted].mean(0)
    got = ab.heads.loc["L1H3", "loss_ablated"]
    assert losses_with(bridge, replaced_by(mean_counted), toks, counted) == pytest.approx(got, rel=1e-7)
    # the mean over every position (BOS included) is another ablation: the test can tell them apart
    other = losses_with(bridge, replaced_by(z.reshape(-1, z.shape[-1]).mean(0)), toks, counted)
    assert abs(other - got) > 1e-5
    # the mean does not depend on how the windows are batched
    ab3 = ablation(bridge, [(layer, head)], TOKENS, kind="mean", n_controls=0, batch_size=2, **KW)
    assert ab3.heads.loc["L1H3", "loss_ablated"] == pytest.approx(got, rel=1e-6)


@pytest.mark.bridge
def test_controls_are_matched_and_deterministic(bridge):
    flagged = [(0, 1), (0, 2), (1, 5)]
    a = ablation(bridge, flagged, TOKENS, n_controls=6, seed=3, **KW)
    b = ablation(bridge, flagged, TOKENS, n_controls=6, seed=3, **KW)
    other_seed, _ = matched_controls({0: [1, 2], 1: [5]}, n_heads=9, n_controls=6, seed=4)
    pd.testing.assert_frame_equal(a.controls, b.controls, check_exact=True)
    pd.testing.assert_frame_equal(a.heads, b.heads, check_exact=True)
    assert list(a.controls["heads"]) == [
        " ".join(f"L{k}H{h}" for k, hs in sorted(c.items()) for h in hs)
        for c in matched_controls({0: [1, 2], 1: [5]}, n_heads=9, n_controls=6, seed=3)[0]
    ]
    assert [c for c in other_seed] != matched_controls({0: [1, 2], 1: [5]}, n_heads=9, n_controls=6, seed=3)[0]
    for s in a.controls["heads"]:
        labels = s.split()
        assert sum(x.startswith("L0H") for x in labels) == 2 and sum(x.startswith("L1H") for x in labels) == 1
        assert not {"L0H1", "L0H2", "L1H5"} & set(labels)
    assert (a.controls["n_flagged_in_set"] == 0).all()
    d, cd = a.summary["delta_loss"], a.controls["delta_loss"].to_numpy()
    assert a.summary["p_value"] == (1 + int((cd >= d).sum())) / 7
    assert a.summary["n_controls_at_least"] == int((cd >= d).sum())
    assert a.summary["control_delta_median"] == float(np.median(cd))
    assert a.summary["sum_delta_single"] == pytest.approx(a.heads["delta_loss"].sum(), abs=0)
    assert list(a.heads.index) == ["L0H1", "L0H2", "L1H5"] and list(a.heads["kv_head"]) == [0, 0, 1]
    assert repr(a).startswith("Ablation(kind='mean', n_heads=3")


def test_matched_controls_rule():
    sets, fallback = matched_controls({0: [1, 2], 3: list(range(8))}, n_heads=9, n_controls=50, seed=0)
    assert fallback == [3]  # layer 3 has 1 non-flagged head for 8 flagged ones: drawn from all 9
    for s in sets:
        assert len(s[0]) == 2 and not {1, 2} & set(s[0]) and len(s[3]) == 8 == len(set(s[3]))
    assert len({tuple(s[0]) for s in sets}) > 10  # the draws vary
    again, _ = matched_controls({0: [1, 2], 3: list(range(8))}, n_heads=9, n_controls=50, seed=0)
    assert again == sets
    # a layer's draws do not depend on the other layers
    alone, _ = matched_controls({0: [1, 2]}, n_heads=9, n_controls=50, seed=0)
    assert [s[0] for s in alone] == [s[0] for s in sets]


@pytest.mark.bridge
def test_report_ablation_joins_its_heads(bridge):
    rep0 = tli.idempotence_report(bridge, progress=False)
    top = rep0.heads["P"].sort_values(ascending=False)
    rep = tli.idempotence_report(bridge, threshold=float(top.iloc[1]), progress=False)
    assert len(rep.closed_heads) == 2
    ab = rep.ablation(
        texts=TEXTS, n_controls=3, **KW
    )  # text: tokenized by the model's tokenizer  # the report's own (weakly referenced) model
    assert sorted(ab.heads.index) == sorted(rep.closed_heads.index)
    joined = rep.heads.join(ab.heads[["delta_loss"]], how="inner")
    assert len(joined) == 2 and joined["closed"].all()
    merged = rep.heads.merge(ab.heads, on=["layer", "head"])
    assert len(merged) == 2


@pytest.mark.bridge
def test_an_encoder_is_refused(tmp_path):
    enc = bridge_from_dir(tiny_hf_dir(tmp_path / "enc", arch="bert", n_layers=1, d_model=32, n_heads=4))
    with pytest.raises(UnsupportedModelError, match=r"causal language model.*encoder"):
        ablation(enc, [(0, 1)], TEXTS, **KW)


@pytest.mark.bridge
@pytest.mark.parametrize(
    "kwargs, err, match",
    [
        ({"kind": "meen"}, OptionError, r"kind must be 'mean' or 'zero'; got 'meen' \(did you mean 'mean'\?\)"),
        ({"kind": "resample"}, OptionError, "kind must be 'mean' or 'zero'; got 'resample'"),
        ({"kind": 0}, TypeError, "kind"),
        ({"n_controls": -1}, OptionError, "n_controls must be >= 0"),
        ({"n_controls": MAX_CONTROLS + 1}, OptionError, f"n_controls must be <= {MAX_CONTROLS}"),
        ({"n_controls": 2.0}, TypeError, "n_controls"),
        ({"seed": -1}, OptionError, "seed must be >= 0"),
        ({"seq_len": 1}, OptionError, "seq_len must be >= 2"),
        ({"max_tokens": 0}, OptionError, "max_tokens must be >= 1"),
        ({"heads": []}, OptionError, "heads is empty: give the"),
        ({"heads": pd.DataFrame({"layer": [], "head": []})}, OptionError, "rep.closed_heads is empty"),
        ({"heads": None}, OptionError, "heads is None"),
        (
            {"heads": [(5, 0)]},
            OptionError,
            r"Layer 5 is not an attention layer of this model \(attention layers: \[0, 1\]\)",
        ),
        ({"heads": [(0, 9)]}, OptionError, r"Head 9 of layer 0 does not exist \(n_heads = 9\)"),
        ({"heads": "L0H1"}, TypeError, "heads must be"),
        ({"texts": []}, OptionError, "No texts given"),
        ({"texts": ""}, OptionError, "tokenized to no \\(non-special\\) token"),
        ({"texts": torch.tensor([[1, 5, 500]])}, OptionError, r"Token ids must lie in \[0, d_vocab=100\)"),
        ({"nconrols": 3}, UnknownOptionError, "did you mean 'n_controls'"),
    ],
)
def test_bad_arguments(bridge, kwargs, err, match):
    args = {"heads": [(0, 1)], "texts": TEXTS, **KW, **kwargs}
    with pytest.raises(err, match=match):
        ablation(bridge, args.pop("heads"), args.pop("texts"), **args)


def test_not_a_transformer_lens_model():
    with pytest.raises(UnsupportedModelError, match="needs a TransformerLens model"):
        ablation(torch.nn.Linear(2, 2), [(0, 0)])


@pytest.fixture(scope="module")
def smollm2():
    """SmolLM2-135M-Instruct from the zoo (TransformerBridge, raw weights); skip (fail under CI) if unavailable."""
    try:
        return tli.models.load("smollm2-135m", progress=False)
    except Exception as e:
        if os.environ.get("CI"):
            pytest.fail(f"zoo model smollm2-135m not available: {e}")
        pytest.skip(f"zoo model smollm2-135m not available: {e}")


@pytest.mark.slow
@pytest.mark.bridge
def test_smollm2_closed_heads_against_matched_controls(smollm2):
    rep = tli.idempotence_report(smollm2, progress=False)
    closed = rep.closed_heads
    assert len(closed) == 13  # tests/data/v0_1: 13 of 270 heads with P >= 0.9 (raw weights)
    ab = rep.ablation(model=smollm2, kind="mean", n_controls=16, seed=0, max_tokens=256, batch_size=2, progress=False)
    s = ab.summary
    print("\nSmolLM2-135M, mean ablation at hook_z, default corpus,", s["n_tokens"], "target tokens:")
    print(
        {
            k: s[k]
            for k in (
                "loss_clean",
                "loss_ablated",
                "delta_loss",
                "sum_delta_single",
                "control_delta_mean",
                "control_delta_median",
                "control_delta_q05",
                "control_delta_q95",
                "control_delta_max",
                "n_controls_at_least",
                "p_value",
                "control_rule",
            )
        }
    )
    print(rep.heads.join(ab.heads[["delta_loss"]], how="inner")[["P", "alpha", "delta_loss"]].to_string())
    print(ab.controls[["heads", "delta_loss"]].to_string())
    assert s["n_heads"] == 13 and s["n_controls"] == 16 and s["n_tokens"] >= 256
    assert np.isfinite([s["loss_clean"], s["loss_ablated"]]).all() and 0 < s["loss_clean"] < 10
    assert 1 / 17 <= s["p_value"] <= 1
    per_layer = closed.groupby("layer").size().to_dict()
    for heads in ab.controls["heads"]:
        got = pd.Series([int(x[1:].split("H")[0]) for x in heads.split()]).value_counts().to_dict()
        assert got == per_layer
