"""tli.attended_token_effect: a head's direct logit effect on the token it attends to, on text (SPEC 12).

A constructed attention-only HookedTransformer (positions one-hot, a previous-token head whose OV is +c times the
projection onto the embedding dimensions, W_U = W_Eᵀ, no final norm) gives exactly the hand-computed
standardized effect ``(g_t - mean g)/std g`` with ``g = c W_E W_E[t]``, and the negated head its negative; on a
tiny Llama/GQA model every per-position number equals one computed from TransformerLens's own ``run_with_cache``
(``hook_z``, ``hook_pattern``, ``ln_final.hook_scale``) and a dense float64 logit row; the sign test and BH
q-values are recomputed from the positions; every argument is checked.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tl_idempotence as tli
from helpers import hooked_or_skip
from tl_idempotence.errors import (
    OptionError,
    OptionTypeError,
    UnknownOptionError,
    UnsupportedModelError,
    WeightError,
)
from tl_idempotence.testing import tiny_hf_dir

pytestmark = pytest.mark.bridge  # the bridge tests run on both majors; the HookedTransformer ones skip on 4.x


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return tiny_hf_dir(tmp_path_factory.mktemp("token_effect") / "tiny", n_layers=2)


def _tokens(seed=0, n=3, length=20):
    toks = torch.randint(4, 100, (n, length), generator=torch.Generator().manual_seed(seed))
    toks[:, 0] = 1  # BOS of the tiny tokenizer: a special token, never a source or destination
    return toks


def constructed(c: float):
    """Attention-only, 16 positions (dims 0..15 one-hot), embeddings in dims 16..31; heads 0 and 1 attend to the
    previous position (score 400/sqrt(16) = 100 there); W_V reads dims 16..31, W_O[0] = +c, W_O[1] = -c times that
    read: OV = ±c Π onto the embedding dimensions. W_U = W_Eᵀ, no final norm."""
    try:
        from transformer_lens import HookedTransformer, HookedTransformerConfig
    except ImportError as e:
        pytest.skip(f"transformer-lens 4.x has no HookedTransformer: {e}")
    n, d_vocab = 16, 50
    cfg = HookedTransformerConfig(
        n_layers=1, d_model=2 * n, n_ctx=n, d_head=n, n_heads=2, d_vocab=d_vocab, attn_only=True,
        normalization_type=None, act_fn="relu", positional_embedding_type="standard", seed=0,
    )  # fmt: skip
    m = HookedTransformer(cfg)
    E = torch.zeros(d_vocab, 2 * n)
    E[:, n:] = torch.randn(d_vocab, n, generator=torch.Generator().manual_seed(0))
    read = torch.zeros(2 * n, n)
    read[n:] = torch.eye(n)
    with torch.no_grad():
        for p in m.parameters():
            p.zero_()
        m.pos_embed.W_pos[:, :n].copy_(torch.eye(n))
        m.embed.W_E.copy_(E)
        m.unembed.W_U.copy_(E.T)
        for h, sign in ((0, 1.0), (1, -1.0)):
            m.blocks[0].attn.W_Q[h][:n].copy_(400 * torch.eye(n))
            m.blocks[0].attn.W_K[h][:n].copy_(torch.diag(torch.ones(n - 1), 1))  # key of j: e_{j+1}
            m.blocks[0].attn.W_V[h].copy_(read)
            m.blocks[0].attn.W_O[h].copy_(sign * c * read.T)
    return m, E.double()


def test_a_constructed_copying_head_and_its_negation_give_the_hand_values():
    c = 2.5
    m, E = constructed(c)
    toks = torch.randint(0, 50, (4, 16), generator=torch.Generator().manual_seed(1))
    r = tli.attended_token_effect(m, texts=toks, seed=0)
    pos = r.positions
    assert r.summary["final_norm"] == "none"
    for label, sign in (("L0H0", 1.0), ("L0H1", -1.0)):
        p = pos[pos["label"] == label]
        assert len(p) == 4 * 16
        # attention on the previous position (position 0: on itself, the only key); the model has no tokenizer,
        # so no position is special
        np.testing.assert_array_equal(p["source_pos"], np.maximum(p["pos"] - 1, 0))
        t = toks[p["window"].to_numpy(), p["source_pos"].to_numpy()]
        np.testing.assert_array_equal(p["token"], t.numpy())
        g = (E @ E[t].T).T  # [positions, d_vocab]: the head's logits up to the factor ±c
        own = g[torch.arange(len(t)), t]
        want = sign * (own - g.mean(1)) / g.std(1, unbiased=False)
        np.testing.assert_allclose(p["effect"], want.numpy(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(p["raw_effect"], sign * c * own.numpy(), rtol=1e-5)
        nt = toks[p["window"].to_numpy(), p["null_source_pos"].to_numpy()]
        want_null = sign * (g[torch.arange(len(t)), nt] - g.mean(1)) / g.std(1, unbiased=False)
        np.testing.assert_allclose(p["null_effect"], want_null.numpy(), rtol=1e-5, atol=1e-6)
        assert (p["null_source_pos"] <= p["pos"]).all()
    t = r.table
    assert t.loc["L0H0", "effect_median"] > 2 and t.loc["L0H0", "frac_negative"] == 0
    assert t.loc["L0H1", "effect_median"] == pytest.approx(-t.loc["L0H0", "effect_median"], rel=1e-6)
    assert t.loc["L0H1", "frac_negative"] == 1
    # the sign test and BH, recomputed from the positions
    from scipy.stats import binomtest, false_discovery_control

    ps = []
    for label in t.index:
        p = pos[pos["label"] == label]
        d = (p["effect"] - p["null_effect"]).to_numpy()
        k, n = int((d > 0).sum()), int((d != 0).sum())
        assert (t.loc[label, "n_pos_diff"], t.loc[label, "n_pos_diff"] + t.loc[label, "n_neg_diff"]) == (k, n)
        ps.append(binomtest(k, n, 0.5).pvalue)
    np.testing.assert_allclose(t["p_value"], ps, rtol=1e-12)
    np.testing.assert_allclose(t["q_value"], false_discovery_control(ps, method="bh"), rtol=1e-12)
    assert t.loc["L0H0", "p_value"] < 1e-6
    assert "L0H1" in r.headline and "L0H0" in r.headline


def reference(model, toks, counted, layer, head):
    """Per destination position: (source, effect, raw) from run_with_cache and dense float64 logit rows."""
    _, cache = model.run_with_cache(toks)
    z = cache[f"blocks.{layer}.attn.hook_z"][:, :, head].double()
    pat = cache[f"blocks.{layer}.attn.hook_pattern"][:, head].double()
    scale = cache["ln_final.hook_scale"][..., 0].double()
    W_O = model.blocks[layer].attn.W_O[head].detach().double()
    W_U = model.W_U.detach().double()
    out = []
    for b in range(toks.shape[0]):
        logits = (z[b] @ W_O) / scale[b].unsqueeze(1) @ W_U  # [pos, d_vocab]: dense rows
        for q in range(toks.shape[1]):
            if not counted[b, q]:
                continue
            elig = [k for k in range(q + 1) if counted[b, k]]
            s = max(elig, key=lambda k: (pat[b, q, k].item(), -k))
            row = logits[q]
            t = int(toks[b, s])
            out.append((b, q, s, float((row[t] - row.mean()) / row.std(unbiased=False)), float(row[t])))
    return out


@pytest.mark.parametrize("cls", ["bridge", "hooked"])
def test_equals_transformer_lens_run_with_cache(cls, tiny_dir, bridge):
    model = bridge if cls == "bridge" else hooked_or_skip(tiny_dir)
    toks = _tokens()
    counted = toks != 1
    r = tli.attended_token_effect(model, heads=["L0H4", "L1H7"], texts=toks, batch_size=2)
    assert r.summary["final_norm"] == "/ hook_scale"
    pos = r.positions
    for label, (layer, head) in (("L0H4", (0, 4)), ("L1H7", (1, 7))):
        p = pos[pos["label"] == label].reset_index(drop=True)
        ref = reference(model, toks, counted, layer, head)
        assert len(p) == len(ref) == int(counted.sum())
        np.testing.assert_array_equal(p[["window", "pos", "source_pos"]].to_numpy(), [x[:3] for x in ref])
        np.testing.assert_allclose(p["effect"], [x[3] for x in ref], rtol=1e-9, atol=1e-9)
        np.testing.assert_allclose(p["raw_effect"], [x[4] for x in ref], rtol=1e-9, atol=1e-12)
        assert (p["source_pos"] > 0).all()  # BOS never a source
        row = r.table.loc[label]
        assert row["effect_median"] == np.median(p["effect"]) and row["n_positions"] == len(p)
        assert row["frac_negative"] == np.mean(p["effect"] < 0)


def test_result_hands_out_copies_and_the_seed_moves_only_the_null(bridge):
    toks = _tokens(1, n=2)
    a = tli.attended_token_effect(bridge, heads=[(0, 0)], texts=toks, seed=0)
    b = tli.attended_token_effect(bridge, heads=[(0, 0)], texts=toks, seed=1)
    np.testing.assert_array_equal(a.positions["effect"], b.positions["effect"])
    assert not np.array_equal(a.positions["null_source_pos"], b.positions["null_source_pos"])
    t = a.table
    t.loc["L0H0", "effect_median"] = 99.0
    p = a.positions
    p.loc[0, "effect"] = 99.0
    assert a.table.loc["L0H0", "effect_median"] != 99.0 and a.positions.loc[0, "effect"] != 99.0
    with pytest.raises(TypeError):
        a.summary["seed"] = 3
    assert "self-repair" in a.summary["convention"] and len(a.summary["weights_fingerprint"]) == 64
    assert "AttendedTokenEffect(" in repr(a) and a.headline in str(a)


def test_hostile_inputs(bridge, monkeypatch):
    toks = _tokens()
    with pytest.raises(UnsupportedModelError, match="TransformerLens model"):
        tli.attended_token_effect(torch.nn.Linear(2, 2))
    with pytest.raises(OptionError, match="Head 9 of layer 0"):
        tli.attended_token_effect(bridge, heads=["L0H9"], texts=toks)
    with pytest.raises(OptionTypeError, match="head label"):
        tli.attended_token_effect(bridge, heads=["head0"], texts=toks)
    with pytest.raises(OptionError, match="No texts given"):
        tli.attended_token_effect(bridge, texts=[])
    with pytest.raises(OptionError, match=r"no .*non-special.* token"):
        tli.attended_token_effect(bridge, texts="   ")
    with pytest.raises(OptionError, match="d_vocab=100"):
        tli.attended_token_effect(bridge, texts=torch.tensor([[1, 5, 100]]))
    with pytest.raises(OptionError, match="every position is a special token"):
        tli.attended_token_effect(bridge, texts=torch.tensor([[1, 1, 2]]))
    for kw, match in (({"seq_len": 1}, "seq_len"), ({"max_tokens": 0}, "max_tokens"), ({"batch_size": 0}, "batch")):
        with pytest.raises(OptionError, match=match):
            tli.attended_token_effect(bridge, texts=toks, **kw)
    with pytest.raises(OptionError, match="seed"):
        tli.attended_token_effect(bridge, texts=toks, seed=-1)
    with pytest.raises(OptionTypeError, match="seed"):
        tli.attended_token_effect(bridge, texts=toks, seed=0.5)
    with pytest.raises(UnknownOptionError, match="texts"):
        tli.attended_token_effect(bridge, text=toks)
    cls = type(bridge)
    with monkeypatch.context() as mp:
        mp.setattr(cls, "W_U", property(lambda self: torch.zeros(72, 120)))
        with pytest.raises(UnsupportedModelError, match=r"d_vocab_out \(120"):
            tli.attended_token_effect(bridge, texts=toks)
    with monkeypatch.context() as mp:
        bad = bridge.W_E.detach().clone()
        bad[3, 3] = float("nan")
        mp.setattr(cls, "W_E", property(lambda self: bad))
        with pytest.raises(WeightError, match="W_E"):
            tli.attended_token_effect(bridge, texts=toks)
