"""tli.head_tokens: the OV circuit read in tokens (SPEC 12).

On a tiny Llama/GQA checkpoint (9 query heads on 3 kv heads, d_vocab 100) booted as a TransformerBridge: every
self-rank equals the rank in a dense float64 row ``W_E[t] @ W_V[kv] @ W_O[h] @ W_U`` (several source-token chunks
exercised); query heads of one kv group read the same W_V but differ; a head built to copy (OV = +c · a
projection onto embedding directions, W_U = W_Eᵀ) ranks its tokens near the top and its negation exactly
mirrored; the HookedTransformer of the same weights gives the same table; every argument is checked.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tl_idempotence as tli
from helpers import edit_safetensors, hooked_or_skip
from tl_idempotence.errors import (
    OptionError,
    OptionTypeError,
    UnknownOptionError,
    UnsupportedModelError,
    WeightError,
)
from tl_idempotence.testing import bridge_from_dir, tiny_hf_dir

pytestmark = pytest.mark.bridge  # runs on both transformer-lens majors (the HookedTransformer test skips on 4.x)

D_HEAD = 8


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return tiny_hf_dir(tmp_path_factory.mktemp("head_tokens") / "tiny", n_layers=2)


def dense_counts(model, layer: int, head: int, tokens) -> tuple[np.ndarray, np.ndarray]:
    """(#{u != t: logit_u > logit_t}, #{u != t: logit_u < logit_t}) from dense float64 rows of W_E W_V W_O W_U."""
    n_kv = int(model.cfg.n_key_value_heads or model.cfg.n_heads)
    kv = head // (model.cfg.n_heads // n_kv)
    attn = model.blocks[layer].attn
    W_V = getattr(attn, "_W_V", None)
    W_V = attn.W_V if W_V is None or W_V.shape[0] != n_kv else W_V
    W_V = W_V[kv] if W_V.shape[0] == n_kv else W_V[head]
    W_E, W_U, W_O = (w.detach().double() for w in (model.W_E, model.W_U, attn.W_O[head]))
    rows = W_E[torch.as_tensor(tokens)] @ W_V.detach().double() @ W_O @ W_U  # [n, d_vocab]
    self_logit = rows[torch.arange(len(tokens)), torch.as_tensor(tokens)].unsqueeze(1)
    above = (rows > self_logit).sum(1).numpy()  # the self entry is never > itself
    below = (rows < self_logit).sum(1).numpy()
    return above, below


def test_self_ranks_equal_dense_float64_rows(bridge):
    r = tli.head_tokens(bridge, n_tokens=40, k=5, seed=3, chunk=7)  # 40 tokens in chunks of 7: 6 chunks, a 5-tail
    toks = r.tokens
    assert len(toks) == 40 and len(set(toks)) == 40 and r.summary["n_tokens"] == 40
    ranks = r.self_ranks
    t = r.table
    assert list(t.index) == [f"L{a}H{b}" for a in range(2) for b in range(9)] and t.index.name == "label"
    assert list(ranks.columns) == list(toks)
    for lab, row in t.iterrows():
        above, below = dense_counts(bridge, int(row["layer"]), int(row["head"]), toks)
        np.testing.assert_array_equal(ranks.loc[lab].to_numpy(), above / 99)
        assert row["self_rank_median"] == np.median(above / 99)
        assert row["frac_top_k"] == np.mean(above < 5) and row["frac_bottom_k"] == np.mean(below < 5)
        assert row["n_tokens"] == 40


@pytest.mark.parametrize("tile", [None, 7])
def test_near_ties_below_float32_resolution_are_ranked_in_float64(tmp_path, monkeypatch, tile):
    """W_U's columns 51..59 are columns 50..58 moved by one float32 ulp: logit_{u+1} - logit_u is ~1e-7 relative,
    below what the float32 products resolve, so only the float64 recount of the close calls ranks them right
    (also with 7-column vocabulary tiles: the close calls then lie in tiles that start past column 0)."""
    if tile is not None:
        import tl_idempotence.probes.head_tokens as ht

        monkeypatch.setattr(ht, "VOCAB_TILE", tile)
    d = tiny_hf_dir(tmp_path / "ties", n_layers=1)

    def nudge(t):
        U = t["lm_head.weight"]  # [d_vocab, d_model]: W_U's columns are its rows
        U[51:60] = torch.nextafter(U[50:59], torch.full_like(U[50:59], float("inf")))

    edit_safetensors(d, nudge)
    m = bridge_from_dir(d)
    toks = list(range(45, 65))
    r = tli.head_tokens(m, tokens=toks, chunk=6)
    n_close = 0
    for lab, row in r.table.iterrows():
        above, below = dense_counts(m, 0, int(row["head"]), toks)
        np.testing.assert_array_equal(r.self_ranks.loc[lab].to_numpy(), above / 99)
        assert row["frac_bottom_k"] == np.mean(below < 20)
        n_close += 1
    assert n_close == 9


def test_chunk_size_does_not_change_the_ranks(bridge):
    a = tli.head_tokens(bridge, heads=["L1H4", (0, 2)], n_tokens=30, chunk=1)
    b = tli.head_tokens(bridge, heads=[(0, 2), "L1H4"], n_tokens=30, chunk=1000)
    assert list(a.table.index) == ["L0H2", "L1H4"]
    np.testing.assert_array_equal(a.self_ranks.to_numpy(), b.self_ranks.to_numpy())


@pytest.mark.parametrize(("tile", "chunk"), [(7, 5), (33, 1), (99, 64), (100, 3)])
def test_vocabulary_tiles_do_not_change_the_ranks(bridge, monkeypatch, tile, chunk):
    """The logits are formed in [chunk, tile] blocks with one W_OU tile per layer (module docstring): tiles of 7 (a
    2-column tail), 33, 99 (a 1-column tail) and the whole vocabulary, chunks down to one token, give the dense
    float64 counts of every head of both layers."""
    import tl_idempotence.probes.head_tokens as ht

    monkeypatch.setattr(ht, "VOCAB_TILE", tile)
    toks = list(range(0, 100, 3))
    r = tli.head_tokens(bridge, tokens=toks, k=4, chunk=chunk)
    for lab, row in r.table.iterrows():
        above, below = dense_counts(bridge, int(row["layer"]), int(row["head"]), toks)
        keep = above + below > 0  # token 3 (PAD) has a zero embedding row: a row without spread, NaN (issue 46)
        assert keep.tolist() == [t != 3 for t in toks]
        np.testing.assert_array_equal(r.self_ranks.loc[lab].to_numpy(), np.where(keep, above / 99, np.nan))
        assert row["frac_bottom_k"] == np.mean(below[keep] < 4) and row["n_ranked"] == len(toks) - 1


def test_gqa_heads_of_one_kv_group_differ(bridge):
    """Heads 0, 1, 2 share kv head 0 (the same W_V): their rows still differ through W_O, and each equals the
    dense row built with the kv head's W_V (a head paired with another kv head's W_V would not)."""
    toks = list(range(4, 100, 3))
    r = tli.head_tokens(bridge, heads=[(1, 0), (1, 1), (1, 2), (1, 3)], tokens=toks)
    assert r.table["kv_head"].tolist() == [0, 0, 0, 1]
    ranks = r.self_ranks
    assert not np.array_equal(ranks.loc["L1H0"], ranks.loc["L1H1"])
    assert not np.array_equal(ranks.loc["L1H1"], ranks.loc["L1H2"])
    for h in range(4):
        above, _ = dense_counts(bridge, 1, h, toks)
        np.testing.assert_array_equal(ranks.loc[f"L1H{h}"].to_numpy(), above / 99)
    # the wrong pairing (query head 3 with kv head 0's W_V) gives other ranks: the check above can fail
    attn = bridge.blocks[1].attn
    W_V = getattr(attn, "_W_V", None)
    W_V = attn.W_V if W_V is None or W_V.shape[0] != 3 else W_V
    rows = bridge.W_E.double()[toks] @ W_V[0].double() @ attn.W_O[3].double() @ bridge.W_U.double()
    wrong = (rows > rows[torch.arange(len(toks)), toks].unsqueeze(1)).sum(1).numpy() / 99
    assert not np.array_equal(ranks.loc["L1H3"].to_numpy(), wrong)


def test_hooked_and_bridge_give_the_same_table(tiny_dir, bridge):
    hooked = hooked_or_skip(tiny_dir)
    a = tli.head_tokens(hooked, n_tokens=25, seed=1)
    b = tli.head_tokens(bridge, n_tokens=25, seed=1)
    assert list(a.table.index) == list(b.table.index)
    np.testing.assert_array_equal(a.self_ranks.to_numpy(), b.self_ranks.to_numpy())


@pytest.fixture(scope="module")
def copy_dir(tmp_path_factory):
    """Layer 0: kv head 0's W_V = Q (orthonormal basis of 8 embedding rows), head 0's W_O = +3 Qᵀ (OV = 3·Π, a copier),
    head 1's W_O = -3 Qᵀ (its negation), head 2 random; W_U = W_Eᵀ (lm_head set to the embedding)."""
    d = tiny_hf_dir(tmp_path_factory.mktemp("head_tokens_copy") / "tiny", n_layers=1)

    def build(t):
        E = t["model.embed_tokens.weight"]  # [100, 72]
        t["lm_head.weight"] = E.clone()
        Q, _ = torch.linalg.qr(E[10:18].T.double())  # [72, 8]
        t["model.layers.0.self_attn.v_proj.weight"][0:D_HEAD] = Q.T.float()
        o = t["model.layers.0.self_attn.o_proj.weight"]  # [d_model, n_heads * d_head]
        o[:, 0:D_HEAD] = 3 * Q.float()
        o[:, D_HEAD : 2 * D_HEAD] = -3 * Q.float()

    edit_safetensors(d, build)
    return d


def test_a_constructed_copying_head_and_its_negation(copy_dir):
    m = bridge_from_dir(copy_dir)
    toks = list(range(4, 100))
    r = tli.head_tokens(m, heads=["L0H0", "L0H1", "L0H2"], tokens=toks, k=3, chunk=11)
    t = r.table
    ranks = r.self_ranks
    # The projection's own tokens (10..17 lie in span Q, so Π e_t = e_t and the self logit 3‖e_t‖² is the row's
    # largest by Cauchy-Schwarz unless another token's projection is longer): self-rank 0 for the copier, 1 negated.
    own = [c for c in ranks.columns if 10 <= c < 18]
    assert (ranks.loc["L0H0", own] <= 2 / 99).all()
    assert t.loc["L0H0", "self_rank_median"] < 0.1 and t.loc["L0H1", "self_rank_median"] > 0.9
    # The negation mirrors every rank exactly (no ties in a random embedding).
    np.testing.assert_array_equal(ranks.loc["L0H1"].to_numpy(), 1 - ranks.loc["L0H0"].to_numpy())
    assert t.loc["L0H0", "frac_top_k"] == t.loc["L0H1", "frac_bottom_k"] > 0.3
    above, _ = dense_counts(m, 0, 0, toks)
    np.testing.assert_array_equal(ranks.loc["L0H0"].to_numpy(), above / 99)
    # Its singular directions: OV = 3Π has singular values 3 (x8); what it reads and writes are the same tokens.
    top = r.top_tokens("L0H0")
    assert top.attrs["sigma_1"] == pytest.approx(3.0, rel=1e-5)
    read = top[top["kind"] == "read_1"]["token_id"].tolist()
    write = top[top["kind"] == "write_1"]["token_id"].tolist()
    assert read == write and len(read) == 3
    promoted = top[top["kind"] == "promoted"]
    assert (promoted["value"] <= ranks.loc["L0H0"].min() + 1e-12).iloc[0] and promoted["token"].iloc[0].startswith("w")
    supp = r.top_tokens("L0H1")
    assert supp[supp["kind"] == "suppressed"]["token_id"].tolist()[:1] == promoted["token_id"].tolist()[:1]
    assert "L0H0" in r.headline and "L0H1" in r.headline and "strongest copier is L0H0" in r.headline


def test_result_hands_out_copies_and_states_its_convention(bridge):
    r = tli.head_tokens(bridge, heads=["L0H0"], n_tokens=10)
    t = r.table
    t.loc["L0H0", "self_rank_median"] = 99.0
    sr = r.self_ranks
    sr.iloc[0, 0] = 99.0
    r.tokens[0] = 99
    top = r.top_tokens("L0H0")
    top.loc[0, "value"] = 99.0
    assert r.table.loc["L0H0", "self_rank_median"] <= 1
    assert r.self_ranks.iloc[0, 0] <= 1 and r.tokens[0] != 99 and r.top_tokens("L0H0").loc[0, "value"] <= 1
    with pytest.raises(TypeError):
        r.summary["k"] = 3
    assert "no biases" in r.summary["convention"] and "no final norm" in r.summary["convention"]
    assert len(r.summary["weights_fingerprint"]) == 64 and len(r.summary["embedding_fingerprint"]) == 64
    assert "HeadTokens(" in repr(r) and r.headline in str(r) and "HeadTokens" in r._repr_html_()
    assert r.heads.equals(r.table)


def test_hostile_inputs(bridge, tiny_dir, tmp_path, monkeypatch):
    with pytest.raises(UnsupportedModelError, match="TransformerLens model"):
        tli.head_tokens(torch.nn.Linear(2, 2))
    with pytest.raises(OptionError, match="Head 9 of layer 0"):
        tli.head_tokens(bridge, heads=[(0, 9)])
    with pytest.raises(OptionError, match="Layer 5"):
        tli.head_tokens(bridge, heads=["L5H0"])
    with pytest.raises(OptionTypeError, match="head label"):
        tli.head_tokens(bridge, heads=["L0 H0"])
    with pytest.raises(OptionError, match="heads is empty"):
        tli.head_tokens(bridge, heads=[])
    for k in (0, -1, 101):
        with pytest.raises(OptionError, match="k must be"):
            tli.head_tokens(bridge, k=k)
    with pytest.raises(OptionTypeError, match="k must be an integer"):
        tli.head_tokens(bridge, k=2.0)
    with pytest.raises(OptionError, match="tokens is empty"):
        tli.head_tokens(bridge, tokens=[])
    for bad in ([100], [-1], torch.tensor([0, 100])):
        with pytest.raises(OptionError, match=r"tokens: token ids must lie in \[0, d_vocab=100\)"):
            tli.head_tokens(bridge, tokens=bad)
    for bad in ([1.5], [True], "abc", [[1, 2]]):
        with pytest.raises(OptionTypeError, match="tokens"):
            tli.head_tokens(bridge, tokens=bad)
    with pytest.raises(OptionError, match="n_tokens"):
        tli.head_tokens(bridge, n_tokens=0)
    with pytest.raises(OptionError, match="chunk"):
        tli.head_tokens(bridge, chunk=0)
    with pytest.raises(OptionError, match="n_directions"):
        tli.head_tokens(bridge, n_directions=9)
    with pytest.raises(UnknownOptionError, match="n_tokens"):
        tli.head_tokens(bridge, n_token=8)
    r = tli.head_tokens(bridge, heads=["L0H0"], n_tokens=5)
    with pytest.raises(OptionError, match="L0H1"):
        r.top_tokens("L0H1")
    with pytest.raises(OptionTypeError, match="label"):
        r.top_tokens((0, 0))
    cls = type(bridge)
    W_E, W_U = bridge.W_E.detach().clone(), bridge.W_U.detach().clone()
    with monkeypatch.context() as mp:
        mp.setattr(cls, "W_U", property(lambda self: torch.zeros(72, 120)))
        with pytest.raises(UnsupportedModelError, match=r"d_vocab_out \(120.*!= d_vocab \(100"):
            tli.head_tokens(bridge)
    with monkeypatch.context() as mp:
        bad = W_E.clone()
        bad[7, 3] = float("nan")
        mp.setattr(cls, "W_E", property(lambda self: bad))
        with pytest.raises(WeightError, match="W_E"):
            tli.head_tokens(bridge)
    with monkeypatch.context() as mp:
        mp.setattr(cls, "W_U", property(lambda self: W_U.clone().fill_(float("inf"))))
        with pytest.raises(WeightError, match="W_U"):
            tli.head_tokens(bridge)
    with monkeypatch.context() as mp:

        def no_we(self):
            raise AttributeError("no embedding")

        mp.setattr(cls, "W_E", property(no_we))
        with pytest.raises(UnsupportedModelError, match="has no W_E"):
            tli.head_tokens(bridge)
    nan_dir = tiny_hf_dir(tmp_path / "nan", n_layers=1)
    edit_safetensors(nan_dir, lambda t: t["model.layers.0.self_attn.o_proj.weight"][:, 20].fill_(float("nan")))
    with pytest.raises(WeightError, match=r"W_O of layer 0 .*head 2"):
        tli.head_tokens(bridge_from_dir(nan_dir))
