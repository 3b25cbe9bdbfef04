"""tli.ablation: next-token loss with flagged heads ablated at hook_z, against matched random head sets.

Exact mechanics on tiny models whose weights the test sets (TransformerBridge, and HookedTransformer on
transformer-lens 3.x): a head whose W_O is zero changes nothing (Δ = 0 exactly, mean and zero ablation);
zero-ablating every head of a layer equals replacing the layer's attention output by b_O (exactly; and not
by 0 when b_O ≠ 0); mean ablation is the mean of z over the counted positions; controls are matched layer by
layer and deterministic for the seed; the p-value is the documented formula; every argument is checked.
Head sets batched in one forward pass (the window repeated after the shared prefix) give the losses of one
forward pass per set (the reference below), with 8 sets or 1 set a pass, on HookedTransformer and
TransformerBridge; a model that refuses the repeated residual stream, or disagrees with the clean pass, is
run with the window repeated at the input; an error of a hook the user registered always propagates. Controls
are pairwise distinct and never the flagged set (all of them when few exist, with a warning below 19; none: an
error). The bootstrap intervals are checked on exact constructions and their 95 % level by coverage. One
real run on SmolLM2 (slow) replays the default `rep.ablation(model=m)`: p <= 0.05 for the 13 closed heads.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import re
import shutil
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

import tl_idempotence as tli
from helpers import (
    ABLATION_TOKENS,
    ABLATION_ZERO_HEAD,
    ablation_tiny_dir,
    edit_safetensors,
    losses_with,
    reference_losses,
    rewrite_saved,
)
from tl_idempotence.core.random import layer_generator
from tl_idempotence.errors import OptionError, ReportFileError, UnknownOptionError, UnsupportedModelError
from tl_idempotence.probes.ablation import (
    BOOTSTRAP_DRAWS,
    DEFAULT_N_CONTROLS,
    ENUMERATE_AT_MOST,
    INTERVAL_LEVEL,
    MAX_CONTROLS,
    MIN_CONTROLS_FOR_P_005,
    ablation,
    bootstrap_intervals,
    count_matched_sets,
    matched_controls,
    next_token_loss,
    next_token_losses,
    percentile_interval,
    rank_p_value,
)
from tl_idempotence.probes.tokens import prepare_tokens
from tl_idempotence.testing import bridge_from_dir, tiny_hf_dir

ZERO_HEAD = ABLATION_ZERO_HEAD
TOKENS = ABLATION_TOKENS
TEXTS = ["w5 w6 w7 w8 w9 w10 w11 w12 w13 w14 w15 w16"] * 4


KW = {"seq_len": 24, "progress": False}


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    """Llama/GQA (2 layers, 9 heads on 3 kv heads, d_head 8) with head L1H4's W_O zeroed in the HF weights."""
    return ablation_tiny_dir(tmp_path_factory.mktemp("abl"))


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

    ref = losses_with(model, [("blocks.0.hook_attn_out", removed)], toks, counted)
    assert ref == pytest.approx(ab.summary["loss_ablated"], rel=1e-6)
    assert losses_with(model, [], toks, counted) == pytest.approx(ab.summary["loss_clean"], rel=1e-9)
    assert abs(ref - ab.summary["loss_clean"]) > 1e-3


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

    ref = losses_with(model, [("blocks.0.hook_attn_out", only_bias)], toks, counted)
    assert ref == pytest.approx(ab.summary["loss_ablated"], rel=1e-6)
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
    got = ab.summary["loss_ablated"]  # the flagged set is L1H3 alone
    assert losses_with(bridge, replaced_by(mean_counted), toks, counted) == pytest.approx(got, rel=1e-7)
    # the mean over every position (BOS included) is another ablation: the test can tell them apart
    other = losses_with(bridge, replaced_by(z.reshape(-1, z.shape[-1]).mean(0)), toks, counted)
    assert abs(other - got) > 1e-5
    # the mean does not depend on how the windows are batched
    ab3 = ablation(bridge, [(layer, head)], TOKENS, kind="mean", n_controls=0, batch_size=2, **KW)
    assert ab3.summary["loss_ablated"] == pytest.approx(got, rel=1e-6)


def as_keys(sets):
    return [tuple(tuple(hs) for _, hs in sorted(c.items())) for c in sets]


def test_matched_controls_rule():
    flagged = {0: [1, 2], 3: list(range(8))}
    sets, fallback = matched_controls(flagged, n_heads=9, n_controls=50, seed=0)
    assert fallback == [3]  # layer 3 has 1 non-flagged head for 8 flagged ones: drawn from all 9
    for s in sets:
        assert len(s[0]) == 2 and not {1, 2} & set(s[0]) and len(s[3]) == 8 == len(set(s[3]))
    assert len(sets) == 50 == len(set(as_keys(sets)))  # pairwise distinct
    assert len({tuple(s[0]) for s in sets}) > 10  # the draws vary
    again, _ = matched_controls(flagged, n_heads=9, n_controls=50, seed=0)
    assert again == sets
    assert matched_controls(flagged, n_heads=9, n_controls=50, seed=1)[0] != sets
    # a smaller n_controls gives the first controls of a larger one
    assert matched_controls(flagged, n_heads=9, n_controls=20, seed=0)[0] == sets[:20]
    # 21 pairs of layer 0's 7 non-flagged heads x 9 ways to take 8 of layer 3's 9 heads: all used, once each
    assert count_matched_sets(flagged, 9) == 21 * 9
    every, _ = matched_controls(flagged, n_heads=9, n_controls=MAX_CONTROLS, seed=0)
    pairs, eights = itertools.combinations([0, 3, 4, 5, 6, 7, 8], 2), list(itertools.combinations(range(9), 8))
    want = {(p, q) for p in pairs for q in eights}
    assert len(every) == 189 and set(as_keys(every)) == want and every[:50] == sets


@pytest.mark.parametrize(
    "flagged, n_heads, want",
    [
        ({0: [0, 1, 2]}, 4, 3),  # from all 4 heads (1 non-flagged): C(4,3) = 4 sets, less the flagged one
        ({0: [0, 1, 2, 3]}, 4, 0),  # every head flagged: the flagged set is the only one
        ({0: [0, 1, 2, 3], 1: [0, 1, 2, 3]}, 4, 0),
        ({0: [1, 3]}, 4, 1),  # the 2 non-flagged heads: 1 set
        ({0: [0, 1, 2], 1: [0]}, 4, 4 * 3),  # layer 1 draws from its 3 non-flagged heads: no set is the flagged one
        ({0: [0, 1, 2], 1: [0, 1, 2]}, 4, 4 * 4 - 1),
        ({0: [1, 2], 1: [5]}, 9, 21 * 8),
        ({k: [0, 1, 2] for k in range(30)}, 9, 20**30),  # C(6,3) = 20 per layer: exact beyond float precision
    ],
)
def test_count_matched_sets(flagged, n_heads, want):
    assert count_matched_sets(flagged, n_heads) == want
    if want <= ENUMERATE_AT_MOST:  # the count is the number of sets the draw finds
        sets, _ = matched_controls(flagged, n_heads, n_controls=MAX_CONTROLS, seed=0)
        assert len(sets) == len(set(as_keys(sets))) == min(want, MAX_CONTROLS)
        assert as_keys([flagged])[0] not in set(as_keys(sets))


def test_drawn_controls_reject_the_flagged_set_and_repeats(monkeypatch):
    """Above ENUMERATE_AT_MOST sets, candidates come from one stream per layer; the flagged set and repeats are
    rejected. Forced on a 3-of-4 layer (3 distinct sets out of 4 candidates) the draw still finds each once."""
    import tl_idempotence.probes.ablation.controls as mod  # where matched_controls reads it

    monkeypatch.setattr(mod, "ENUMERATE_AT_MOST", 0)
    assert matched_controls.__module__ == mod.__name__  # the function tested reads the patched module's value
    for seed in range(5):
        sets, fallback = matched_controls({0: [0, 1, 2]}, n_heads=4, n_controls=10, seed=seed)
        assert fallback == [0] and sorted(as_keys(sets)) == [((0, 1, 3),), ((0, 2, 3),), ((1, 2, 3),)]
    # without a rejection, candidate j is the j-th draw of each layer's stream
    flagged = {0: [0, 1, 2], 1: [0, 1, 2]}
    sets, _ = matched_controls(flagged, n_heads=16, n_controls=30, seed=4)
    gens = [layer_generator(4, layer, "ablation") for layer in (0, 1)]
    pool = list(range(3, 16))
    for c in sets[:5]:
        for layer, g in zip((0, 1), gens):
            assert c[layer] == sorted(pool[i] for i in torch.randperm(13, generator=g)[:3].tolist())
    assert len(set(as_keys(sets))) == 30 and matched_controls(flagged, 16, 10, seed=4)[0] == sets[:10]


@pytest.mark.bridge
def test_three_of_four_heads_use_the_three_other_sets_once(gpt2_bridge):
    """3 flagged heads of a 4-head layer: 200 controls asked for, but only 3 distinct matched sets exist (from all
    4 heads, the flagged set excluded); each is used once, the floor is 1/4 and a warning says p <= 0.05 cannot
    happen (it used to draw 200 sets from 4, the flagged set among them, with a floor of 1/201)."""
    flagged = [(0, 0), (0, 1), (0, 2)]
    with pytest.warns(UserWarning, match=r"only 3 distinct matched control sets exist, so p >= 0.25: p <= 0.05 is"):
        ab = ablation(gpt2_bridge, flagged, TOKENS, n_controls=200, **KW)
    heads = list(ab.controls["heads"])
    assert sorted(heads) == ["L0H0 L0H1 L0H3", "L0H0 L0H2 L0H3", "L0H1 L0H2 L0H3"]  # distinct, never L0H0 L0H1 L0H2
    assert len(set(heads)) == 3 and "L0H0 L0H1 L0H2" not in heads
    assert (ab.controls["n_flagged_in_set"] == 2).all()
    s = ab.summary
    assert (s["n_controls"], s["n_controls_requested"], s["n_distinct_controls"]) == (3, 200, 3)
    assert ab.n_controls == 3 == ab.n_distinct_controls and s["controls_exhaustive"] is True
    assert s["p_value_floor"] == ab.p_value_floor == 1 / (3 + 1)
    cd = ab.controls["delta_loss"].to_numpy()
    assert ab.p_value == (1 + int((cd >= ab.delta_loss).sum())) / 4 and ab.p_value in (0.25, 0.5, 0.75, 1.0)
    assert list(ab.window_losses.columns[3:]) == ["control 0", "control 1", "control 2"]
    assert "p <= 0.05 is impossible" in s["controls_warning"] and s["controls_warning"] in s["note"]
    assert "200 controls were asked for, but only 3 distinct matched sets exist" in s["note"]
    assert "distinct sets, never the flagged set; all of them" in s["control_rule"]
    assert "controls_warning='only 3 distinct matched control sets exist" in repr(ab)
    page = ab._repr_html_()
    assert "all 3 distinct matched sets" in page and "Warning: only 3 distinct matched control sets" in page
    # the losses are those of the three sets, each ablated on its own
    toks, counted = prepare_tokens(gpt2_bridge, TOKENS, seq_len=24, max_tokens=4096)
    sets = [{0: [int(x.split("H")[1]) for x in h.split()]} for h in heads]
    np.testing.assert_allclose(
        ab.controls["loss_ablated"], reference_losses(gpt2_bridge, toks, counted, sets, "mean"), rtol=2e-6
    )


@pytest.mark.bridge
def test_enough_distinct_sets_give_no_warning(gpt2_bridge):
    """Two 4-head layers with 3 flagged each: 4 x 4 - 1 = 15 sets (warned); no controls asked for: no warning."""
    with pytest.warns(UserWarning, match="only 15 distinct"):
        ab = ablation(gpt2_bridge, [(0, 0), (0, 1), (0, 2), (1, 1), (1, 2), (1, 3)], TOKENS, n_controls=39, **KW)
    assert ab.n_controls == 15 == len(set(ab.controls["heads"])) and ab.p_value_floor == 1 / 16
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        gpt = ablation(gpt2_bridge, [(0, 0)], TOKENS, n_controls=0, **KW)  # no controls asked for: no warning
    assert gpt.n_distinct_controls == 3 and "controls_warning" not in gpt.summary


@pytest.mark.bridge
def test_enough_distinct_sets_in_a_wider_layer(bridge):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # 21 distinct sets: no warning
        ab = ablation(bridge, [(1, 2), (1, 5)], TOKENS, n_controls=39, **KW)
    assert ab.n_distinct_controls == 21 == ab.n_controls == len(set(ab.controls["heads"]))
    assert ab.summary["controls_exhaustive"] is True and ab.p_value_floor == 1 / 22
    assert "controls_warning" not in ab.summary and "all 21 distinct matched sets" in ab._repr_html_()
    assert (ab.controls["n_flagged_in_set"] == 0).all()


@pytest.mark.bridge
@pytest.mark.parametrize("heads", [[(0, h) for h in range(4)], [(k, h) for k in (0, 1) for h in range(4)]])
def test_every_head_flagged_has_no_control(gpt2_bridge, heads):
    """Every head of every flagged layer flagged: the only matched set is the flagged set itself. It used to be
    drawn as every "control", giving p = 1.0 against itself; now n_controls > 0 is refused."""
    with pytest.raises(OptionError, match=r"No matched control set exists: every head of layer\(s\) \[0"):
        ablation(gpt2_bridge, heads, TOKENS, n_controls=5, **KW)
    alone = ablation(gpt2_bridge, heads, TOKENS, n_controls=0, **KW)  # the loss change alone is still measured
    assert alone.n_distinct_controls == 0 and np.isnan(alone.p_value) and np.isfinite(alone.delta_loss)


class UserHookError(Exception):
    pass


@pytest.mark.parametrize("name", [pytest.param("bridge", marks=pytest.mark.bridge), "hooked"])
@pytest.mark.parametrize("fail_on", [1, 2, 3])
def test_an_error_of_a_users_hook_propagates(request, name, fail_on):
    """A hook the user added with model.add_hook raises on its 1st, 2nd or 3rd call: the clean pass, window 0's
    shared-prefix pass, window 1's. The error reaches the caller each time (on the 2nd and 3rd call it used to be
    taken for the model refusing the repeated residual: the pass was rerun and a normal result returned)."""
    model = model_of(request, name)
    calls = []

    def hook(z, hook):
        calls.append(z.shape[0])
        if len(calls) == fail_on:
            raise UserHookError(f"call {fail_on}")

    model.add_hook("blocks.1.attn.hook_z", hook)
    try:
        with pytest.raises(UserHookError, match=f"call {fail_on}") as err:
            ablation(model, [(1, 2)], TOKENS, n_controls=3, **KW)  # 6 windows in one clean forward, 5 sets a window
    finally:
        model.reset_hooks(including_permanent=True)
    assert len(calls) == fail_on  # nothing ran after the failing pass
    assert calls[0] == len(TOKENS) and all(n == 5 for n in calls[1:])  # the clean pass, then shared-prefix passes
    if fail_on > 1 and hasattr(err.value, "__notes__"):
        assert "it is not retried with the input repeated" in "\n".join(err.value.__notes__)
    calls.clear()
    ok = ablation(model, [(1, 2)], TOKENS, n_controls=3, **KW)  # without the hook: as before
    assert ok.summary["batching"] == "shared prefix" and not calls


@pytest.mark.bridge
def test_report_ablation_joins_its_heads(bridge):
    rep0 = tli.idempotence_report(bridge, progress=False)
    top = rep0.heads["P"].sort_values(ascending=False)
    rep = tli.idempotence_report(bridge, threshold=float(top.iloc[1]), progress=False)
    assert len(rep.closed_heads) == 2
    # text: tokenized by the model's tokenizer; the report's own (weakly referenced) model
    ab = rep.ablation(texts=TEXTS, n_controls=3, singles=True, **KW)
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
        ({"single": True}, UnknownOptionError, "did you mean 'singles'"),
        ({"singles": "yes"}, TypeError, "singles must be True or False"),
        ({"singles": 1}, TypeError, "singles must be True or False"),
        ({"batch_size": 0}, OptionError, "batch_size must be >= 1"),
        ({"batch_size": 4097}, OptionError, "batch_size must be <= 4096"),
        ({"batch_size": 10**12}, OptionError, "batch_size must be <= 4096"),
        ({"batch_size": 8.0}, TypeError, "batch_size must be an integer"),
        ({"n_controls": "39"}, TypeError, "n_controls must be an integer"),
        ({"seed": 0.5}, TypeError, "seed must be an integer"),
    ],
)
def test_bad_arguments(bridge, kwargs, err, match):
    args = {"heads": [(0, 1)], "texts": TEXTS, **KW, **kwargs}
    with pytest.raises(err, match=match):
        ablation(bridge, args.pop("heads"), args.pop("texts"), **args)


def test_bootstrap_intervals_on_exact_constructions():
    n_tok = np.array([10, 20, 30, 40, 50])
    clean = np.array([30.0, 60.0, 90.0, 120.0, 150.0])  # 3 nats/token in every window
    flagged = clean + 0.5 * n_tok  # Δ = 0.5 nats/token in every window
    controls = clean[None, :] + np.array([[0.1], [0.2], [0.3]]) * n_tok[None, :]
    ci, ell = bootstrap_intervals(clean, flagged, controls, n_tok, seed=0)
    assert ell == 2  # round(5 ** (1/3))
    # the same Δ in every window: any resampling of windows gives it back
    assert ci["delta_loss_ci_low"] == pytest.approx(0.5, abs=1e-12) == ci["delta_loss_ci_high"]
    # the excess varies only through which controls are drawn: medians of 3 resampled controls lie in [0.1, 0.3]
    assert 0.5 - 0.3 - 1e-12 <= ci["excess_ci_low"] < ci["excess_ci_high"] <= 0.5 - 0.1 + 1e-12
    # a window that disagrees widens the Δ interval; the seed decides the draws
    flagged2 = flagged.copy()
    flagged2[4] += 20.0  # window 4: Δ = 0.9
    a, _ = bootstrap_intervals(clean, flagged2, controls, n_tok, seed=0)
    assert 0.5 <= a["delta_loss_ci_low"] < a["delta_loss_ci_high"] <= 0.9
    point = (flagged2 - clean).sum() / n_tok.sum()
    assert a["delta_loss_ci_low"] < point < a["delta_loss_ci_high"]
    # windows are resampled whole, never tokens: with 2 windows the interval's ends are the windows' own Δs
    # or their pooled Δ (only 3 distinct resamples exist)
    two, ell2 = bootstrap_intervals(clean[:2], flagged2[:2] + np.array([0.0, 4.0]), controls[:, :2], n_tok[:2], seed=0)
    assert ell2 == 1
    allowed = {0.5, 0.7, (5 + 14) / 30}
    assert min(abs(two["delta_loss_ci_low"] - v) for v in allowed) < 1e-12
    assert min(abs(two["delta_loss_ci_high"] - v) for v in allowed) < 1e-12
    assert BOOTSTRAP_DRAWS == 2000
    # seeded: the same seed gives the same intervals, another seed other draws
    rng = np.random.default_rng(0)
    noisy = clean + n_tok * rng.uniform(0.3, 0.7, 5)
    ctrl = clean[None, :] + n_tok[None, :] * rng.uniform(0.0, 0.2, (7, 5))
    a, _ = bootstrap_intervals(clean, noisy, ctrl, n_tok, seed=0)
    again, other = (bootstrap_intervals(clean, noisy, ctrl, n_tok, seed=s)[0] for s in (0, 1))
    assert a == again != other


def test_percentile_interval_uses_the_2_5_and_97_5_percent_quantiles():
    """On 0, 1, ..., 40 numpy's linear quantiles are exact: 2.5 % -> 1, 97.5 % -> 39 (a 10 % quantile would give 4)."""
    assert INTERVAL_LEVEL == 0.95
    exact = {"abs": 1e-12}  # (1 - 0.95) / 2 is 0.025 to float rounding
    assert percentile_interval(np.arange(41.0)) == pytest.approx((1.0, 39.0), **exact)
    assert percentile_interval(np.arange(41.0)[::-1]) == pytest.approx((1.0, 39.0), **exact)  # order: no matter
    assert percentile_interval(np.arange(41.0), level=0.5) == pytest.approx((10.0, 30.0), **exact)
    assert percentile_interval(np.arange(5.0), level=0.5) == pytest.approx((1.0, 3.0), **exact)
    for bad in (0.0, 1.0, 1.5, -0.1):
        with pytest.raises(OptionError, match="level must lie in"):
            percentile_interval(np.arange(5.0), level=bad)
    # the bootstrap's ends are quantiles of its draws at its level: with 2 windows of one token each the flagged
    # Δ resamples to 0 (both picks window 0: P = 1/4), 0.5 (1/2) or 1 (1/4); the 2.5 % and 97.5 % quantiles of
    # 2000 such draws are 0 and 1, the 40 % and 60 % ones (level=0.2) both 0.5
    clean, n_tok = np.zeros(2), np.ones(2, dtype=np.int64)
    ci, _ = bootstrap_intervals(clean, np.array([0.0, 1.0]), np.zeros((0, 2)), n_tok, seed=0)
    assert (ci["delta_loss_ci_low"], ci["delta_loss_ci_high"]) == (0.0, 1.0)  # 2.5 % and 97.5 %: the extremes
    mid, _ = bootstrap_intervals(clean, np.array([0.0, 1.0]), np.zeros((0, 2)), n_tok, seed=0, level=0.2)
    assert (mid["delta_loss_ci_low"], mid["delta_loss_ci_high"]) == (0.5, 0.5)


def test_percentile_interval_covers_95_percent_of_a_known_distribution():
    """Known answer: for M draws from a continuous F, numpy's linear quantile at q lies between the order statistics
    around position (M - 1) q, and E[F(X_(k))] = k / (M + 1) (k counted from 1), so the interval holds on average
    exactly ((M - 1) 0.95) / (M + 1) of F's mass: 0.94905 for M = 2000. Over 200 seeded repetitions of M standard
    normal draws the mean of Φ(high) - Φ(low) has standard deviation about 0.00035 (each repetition's about
    0.0049); the tolerance 0.002 is ~5.7 of them (false alarm < 1e-7). A 90 % or 80 % interval is far outside."""
    from scipy.stats import norm

    M = BOOTSTRAP_DRAWS
    rng = np.random.default_rng(20240607)
    mass = []
    for _ in range(200):
        lo, hi = percentile_interval(rng.standard_normal(M))
        mass.append(norm.cdf(hi) - norm.cdf(lo))
    assert np.mean(mass) == pytest.approx((M - 1) * 0.95 / (M + 1), abs=0.002)
    assert np.std(mass) < 0.01


def test_bootstrap_interval_covers_the_true_delta():
    """Coverage of the flagged Δ's interval over 250 seeded repetitions of 64 windows whose per-window Δ are
    independent N(0.5, 1) nats/token (10 tokens each, so the true Δ is 0.5). The percentile moving-block bootstrap
    is 95 % only asymptotically: at 64 windows (blocks of 4) 8000 repetitions gave 0.918 (± 0.003), and 0.765 for
    its 80 % interval (the 10 % and 90 % quantiles). The band [0.86, 0.98] (215..245 of 250) holds at coverage 0.918
    with probability 0.9993 (binomial; false alarm 7e-4 over seeds; 0.995 at 0.95), at 0.765 with probability 1.3e-4
    (0.009 at 0.80): the level is what the test checks."""
    n_w, reps = 64, 250
    rng = np.random.default_rng(31)
    n_tok = np.full(n_w, 10, dtype=np.int64)
    clean = rng.uniform(20.0, 40.0, n_w)
    covered = 0
    for r in range(reps):
        flagged = clean + n_tok * rng.normal(0.5, 1.0, n_w)
        ci, ell = bootstrap_intervals(clean, flagged, np.zeros((0, n_w)), n_tok, seed=r)
        covered += ci["delta_loss_ci_low"] <= 0.5 <= ci["delta_loss_ci_high"]
    assert ell == 4
    assert 0.86 <= covered / reps <= 0.98, covered / reps


def test_rank_p_value():
    assert rank_p_value(0.3, np.array([0.1, 0.2, 0.3, 0.4])) == (3 / 5, 1 / 5, 2)  # ties count against the flagged set
    assert rank_p_value(1.0, np.zeros(39)) == (1 / 40, 1 / 40, 0)
    p, floor, n = rank_p_value(1.0, np.zeros(0))
    assert np.isnan(p) and np.isnan(floor) and n == 0
    assert MIN_CONTROLS_FOR_P_005 == 19 and 1 / (18 + 1) > 0.05 >= 1 / (19 + 1)


@pytest.mark.bridge
def test_one_window_has_no_interval(bridge):
    ab = ablation(bridge, [(1, 2)], TOKENS[:1], n_controls=3, **KW)
    s = ab.summary
    assert s["n_windows"] == 1 and np.isnan(s["delta_loss_ci_low"]) and np.isnan(s["excess_ci_high"])
    assert "one text window cannot be resampled" in s["note"]
    assert np.isfinite(s["p_value"]) and s["p_value_floor"] == 0.25


def test_next_token_losses_per_sequence():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 7, generator=g)
    toks = torch.randint(0, 7, (3, 5), generator=g)
    counted = torch.rand(3, 5, generator=g) > 0.3
    s, k = next_token_losses(logits, toks, counted)
    for i in range(3):
        want = sum(
            float(-torch.log_softmax(logits[i, p].double(), -1)[toks[i, p + 1]]) for p in range(4) if counted[i, p + 1]
        )
        assert s[i].item() == pytest.approx(want, rel=1e-6) and k[i].item() == int(counted[i, 1:].sum())
    total, n = next_token_loss(logits, toks, counted)
    assert total == pytest.approx(float(s.sum()), rel=1e-6) and n == int(k.sum())
    # one window under several head sets: tokens and mask of batch 1 broadcast
    s1, k1 = next_token_losses(logits, toks[:1], counted[:1])
    s0, _ = next_token_losses(logits[:1], toks[:1], counted[:1])
    assert s1[0] == s0[0] and (k1 == k1[0]).all()


@pytest.mark.bridge
def test_progress_bar_says_how_long(bridge, capsys):
    ablation(bridge, [(1, 2)], TOKENS, n_controls=3, seq_len=24, progress=True)
    err = capsys.readouterr().err
    assert "4 head sets x 6 windows" in err and "s in all (estimated from the first forward)" in err
    assert "s in all (estimated from the first window)" in err


@pytest.mark.bridge
def test_display_leads_with_delta_controls_and_p(bridge):
    ab = ablation(bridge, [(0, 1), (1, 2)], TOKENS, n_controls=5, **KW)
    page = ab._repr_html_()
    s = ab.summary
    sentence = page[page.index("<p>") : page.index("</p>")]
    assert sentence.index("Δ =") < sentence.index("5 matched random sets") < sentence.index("p = ")
    assert f"p = {s['p_value']:.3g}" in sentence and f"{s['delta_loss']:.3g} nats/token" in sentence
    table = page[page.index("</p>") :]
    assert (
        table.index("delta_loss")
        < table.index("control_delta_median")
        < table.index("p_value")
        < table.index("loss_clean")
    )
    assert page.index("control sets (5") < page.index("flagged heads (2)")


def test_default_controls_reach_p_005():
    assert DEFAULT_N_CONTROLS == 39 and 2 / (DEFAULT_N_CONTROLS + 1) <= 0.05  # beating all but one suffices


def test_not_a_transformer_lens_model():
    with pytest.raises(UnsupportedModelError, match="needs a TransformerLens model"):
        ablation(torch.nn.Linear(2, 2), [(0, 0)])


@pytest.mark.parametrize("name", [pytest.param("bridge", marks=pytest.mark.bridge), "hooked"])
@pytest.mark.parametrize("kind", ["forward", "forward_pre", "global"])
@pytest.mark.parametrize("fail_on", [2, 3])
def test_an_error_of_a_users_plain_torch_hook_propagates(request, name, kind, fail_on):
    """The same with a plain torch hook (``module.register_forward_hook``, a pre-hook, torch's global module hook)
    instead of TransformerLens's ``add_hook``: raised on window 0's or window 1's shared-prefix pass, it used to be
    taken for the model refusing the repeated residual (only hook points' ``fwd_hooks`` were counted as the
    user's), the pass rerun with the input repeated and a normal-looking result returned."""
    from torch.nn.modules.module import register_module_forward_hook

    model = model_of(request, name)
    calls = []

    def hook(module, *args):
        if kind == "global" and module is not model.blocks[1]:
            return None
        calls.append(1)
        if len(calls) == fail_on:
            raise UserHookError(f"call {fail_on}")
        return None

    if kind == "forward":
        handle = model.blocks[1].register_forward_hook(hook)
    elif kind == "forward_pre":
        handle = model.blocks[1].register_forward_pre_hook(hook)
    else:
        handle = register_module_forward_hook(hook)
    try:
        with pytest.raises(UserHookError, match=f"call {fail_on}") as err:
            ablation(model, [(1, 2)], TOKENS, n_controls=3, **KW)
    finally:
        handle.remove()
    assert len(calls) == fail_on  # nothing ran after the failing pass
    if hasattr(err.value, "__notes__"):
        assert "it is not retried with the input repeated" in "\n".join(err.value.__notes__)


@pytest.mark.parametrize("name", [pytest.param("bridge", marks=pytest.mark.bridge), "hooked"])
def test_the_models_own_torch_hooks_are_not_taken_for_the_users(request, name):
    """A TransformerBridge keeps torch hooks of its own on its wrapped modules: without a hook of the user's, none
    is listed (else a model refusing the repeated residual would be reported as the user's error); the user's
    plain torch hook is listed by its module's name."""
    from tl_idempotence.probes.ablation.passes import _registered_hooks

    model = model_of(request, name)
    assert _registered_hooks(model) == []
    handle = model.blocks[1].register_forward_hook(lambda m, i, o: None)
    try:
        assert _registered_hooks(model) == ["blocks.1"]
    finally:
        handle.remove()
    assert _registered_hooks(model) == []


@pytest.mark.bridge
def test_the_controls_warning_names_the_users_line_through_the_report_too(gpt2_bridge):
    """``rep.ablation(...)`` adds a frame between the user and ``tli.ablation``: the few-controls warning used a
    fixed stacklevel and named the report's own file there, which Python's default filters hide in a script."""
    rep = tli.idempotence_report(gpt2_bridge, progress=False)
    rep = rep.with_threshold(float(rep.heads["P"].max()))
    assert len(rep.closed_heads) == 1  # one head of a 4-head layer: 3 distinct matched sets
    for call in (
        lambda: rep.ablation(gpt2_bridge, texts=TOKENS, n_controls=200, **KW),
        lambda: ablation(gpt2_bridge, rep.closed_heads, TOKENS, n_controls=200, **KW),
    ):
        with pytest.warns(UserWarning, match="only 3 distinct matched control sets") as rec:
            call()
        assert [w.filename for w in rec if "distinct matched" in str(w.message)] == [__file__]


def test_the_few_controls_warning_quotes_the_floor_of_the_sets_used():
    """10 distinct matched sets exist for L0H0 of an 11-head layer; ``n_controls=3`` uses 3 of them, so the p-value's
    floor is 1/4 (rank_p_value over 3 controls), not 1/11 = 0.0909 (every distinct set). The warning quotes the
    floor of the sets used, the same number as ``p_value_floor``."""
    from tl_idempotence.probes.ablation.controls import plan_sets

    flagged = {0: [0]}
    assert count_matched_sets(flagged, 11) == 10 < MIN_CONTROLS_FOR_P_005
    for n_controls, n_used, says in [
        (3, 3, "only 10 distinct matched control sets exist and n_controls=3 uses 3 of them, so p >= 0.25:"),
        (9, 9, "only 10 distinct matched control sets exist and n_controls=9 uses 9 of them, so p >= 0.1:"),
        (10, 10, "only 10 distinct matched control sets exist, so p >= 0.0909:"),
        (200, 10, "only 10 distinct matched control sets exist, so p >= 0.0909:"),
    ]:
        plan = plan_sets(flagged, 11, n_controls, seed=0, singles=False)
        assert plan.n_controls == n_used and plan.warning is not None
        assert plan.warning.startswith(says) and plan.warning.endswith("p <= 0.05 is impossible for this flagged set")
        _p, floor, _n = rank_p_value(0.0, np.zeros(n_used))
        assert f"p >= {floor:.3g}:" in plan.warning
    assert plan_sets({0: [0]}, 21, 3, seed=0, singles=False).warning is None  # 20 distinct sets: no warning


def test_a_saved_ablation_is_what_its_window_sums_give(bridge, tmp_path):
    """Every table of a saved ablation is recomputed from its summed losses when it is read back: an edit of one,
    its sha256 and the record's digest recomputed, is refused naming the file (the contract test,
    tests/unit/test_result_contract.py, edits every field of the record)."""
    ab = ablation(bridge, [(0, 1), (1, 0)], TEXTS, n_controls=3, seed=3, singles=True, **KW)
    d = Path(ab.save(tmp_path / "ab"))
    back = tli.load_ablation(d)
    for name in ("heads", "controls", "window_losses", "window_sums"):
        pd.testing.assert_frame_equal(getattr(back, name), getattr(ab, name), check_exact=True)
    assert json.dumps(dict(back.summary)) == json.dumps(dict(ab.summary)) and back.run_info == ab.run_info
    edits = {
        "heads": (lambda t: t.assign(delta_loss=t["delta_loss"] + 1e-12), "heads.parquet"),
        "window_losses": (lambda t: t.assign(flagged=t["flagged"].iloc[::-1].to_numpy()), "window_losses.parquet"),
        "window_sums": (lambda t: t.assign(clean=t["clean"] * (1 + 1e-12)), "heads.parquet"),
        "controls": (lambda t: t.assign(heads=["L0H1 L1H0", *t["heads"].iloc[1:]]), "controls.parquet"),
    }
    for i, (table, (edit, named)) in enumerate(edits.items()):
        e = tmp_path / f"edit{i}"
        shutil.copytree(d, e)
        rewrite_saved(e, "ablation.json", table, edit)
        with pytest.raises(ReportFileError, match=re.escape(str(e / named))):
            tli.load_ablation(e)
    made = dataclasses.replace(ab, window_sums=pd.DataFrame())  # built by hand: nothing to recompute from
    with pytest.raises(OptionError, match="window_sums"):
        made.save(tmp_path / "by_hand")
