"""Rows without spread are NaN with a reason, never "the strongest copier" (issue 46; docs/definitions.md §12).

A tiny Llama/GQA model (9 query heads on 3 kv heads) with L0H1's W_O zeroed (kv group 0, beside L0H0 and L0H2 that
still write), kv group 2's W_V zeroed (L0H6, L0H7, L0H8) and token 50's embedding row zeroed; and the same model
with W_U = 0. Every self-rank statistic, both copying scores and the attended-token effect of a head that writes
nothing are NaN with a reason; a zero embedding row is left out of every head's statistics; no headline names a
head without spread. Also: the token lists never call a suppressed token promoted (a constructed suppressor has
no promoted list), the written tokens of an untied model are scored with W_U (not W_Eᵀ), and a byte token prints
as the repr of its bytes.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tl_idempotence as tli
from helpers import edit_safetensors
from tl_idempotence.probes.roles import copying_scores
from tl_idempotence.probes.tied import own_copying_scores
from tl_idempotence.testing import bridge_from_dir, tiny_hf_dir

pytestmark = pytest.mark.bridge

D_HEAD = 8
DEAD = ["L0H1", "L0H6", "L0H7", "L0H8"]
TOKENS = [4, 9, 17, 50, 63, 81, 99]


@pytest.fixture(scope="module")
def dead(tmp_path_factory):
    d = tiny_hf_dir(tmp_path_factory.mktemp("no_spread") / "tiny", n_layers=1)

    def zero(t):
        t["model.layers.0.self_attn.o_proj.weight"][:, D_HEAD : 2 * D_HEAD] = 0  # L0H1's W_O
        t["model.layers.0.self_attn.v_proj.weight"][2 * D_HEAD : 3 * D_HEAD] = 0  # kv group 2's W_V
        t["model.embed_tokens.weight"][50] = 0  # token 50's embedding row

    edit_safetensors(d, zero)
    return bridge_from_dir(d)


def test_heads_that_write_nothing_have_nan_self_ranks_with_a_reason(dead, tmp_path):
    r = tli.head_tokens(dead, tokens=TOKENS, k=3, progress=False)
    t = r.table
    for lab in DEAD:
        assert np.isnan(r.self_ranks.loc[lab]).all()
        assert np.isnan(t.loc[lab, ["self_rank_median", "frac_top_k", "frac_bottom_k"]].to_numpy(float)).all()
        assert t.loc[lab, "n_ranked"] == 0 and "no token's row has spread" in t.loc[lab, "reason"]
        assert r.top_tokens(lab)["kind"].str.startswith(("read", "write")).all()  # in no token list
    live = [lab for lab in t.index if lab not in DEAD]
    assert t.loc[live, "self_rank_median"].notna().all() and (t.loc[live, "n_ranked"] == len(TOKENS) - 1).all()
    # token 50 (zero embedding row) is left out of every head, and said so
    assert r.self_ranks[50].isna().all() and r.self_ranks.drop(columns=50).loc[live].notna().all().all()
    assert t.loc[live, "reason"].str.startswith("1 of 7 tokens' rows have no spread").all()
    # the heads of kv group 0 still differ: L0H0 and L0H2 write, L0H1 does not
    assert not np.array_equal(r.self_ranks.loc["L0H0"], r.self_ranks.loc["L0H2"])
    for lab in DEAD:
        assert lab not in r.headline
    assert "4 of 9 heads have no defined self-rank" in r.headline
    assert np.isfinite(r.summary["median_self_rank"])
    back = tli.load_head_tokens(r.save(tmp_path / "ht"))  # the loader recomputes the NaNs and their reasons
    assert back.table.equals(r.table) and back.self_ranks.equals(r.self_ranks)


def test_copying_scores_and_the_effect_of_a_silent_head_are_nan_with_a_reason(dead):
    cop, _, _ = copying_scores(dead)
    cop.index = [f"L{a}H{b}" for a, b in zip(cop["layer"], cop["head"])]
    own, _ = own_copying_scores(dead)
    for lab in DEAD:
        assert np.isnan(cop.loc[lab, "copying"]) and "no nonzero eigenvalue" in cop.loc[lab, "reason"]
        assert np.isnan(own.loc[lab, "copying_own"]) and "no nonzero eigenvalue" in own.loc[lab, "reason"]
    assert cop.loc[["L0H0", "L0H2"], "copying"].notna().all() and (own.loc[["L0H0", "L0H2"], "reason"] == "").all()
    toks = torch.randint(4, 100, (2, 12), generator=torch.Generator().manual_seed(0))
    toks[:, 0] = 1
    e = tli.attended_token_effect(dead, heads=["L0H0", "L0H1", "L0H6"], texts=toks, progress=False)
    t = e.table
    assert np.isnan(t.loc[["L0H1", "L0H6"], "effect_median"].to_numpy(float)).all()
    assert t.loc[["L0H1", "L0H6"], "reason"].str.contains("no spread").all() and t.loc["L0H0", "reason"] == ""
    assert "L0H1" not in e.headline and "L0H6" not in e.headline and "2 head(s) have no defined effect" in e.headline


def test_a_zero_unembedding_leaves_no_row_with_spread(dead, monkeypatch):
    monkeypatch.setattr(type(dead), "W_U", property(lambda self: torch.zeros(72, 100)))
    r = tli.head_tokens(dead, heads=["L0H0", "L0H3"], tokens=TOKENS, progress=False)
    assert r.table["self_rank_median"].isna().all() and (r.table["n_ranked"] == 0).all()
    assert "0 of 0 heads with a defined self-rank" in r.headline and "copier" not in r.headline
    assert r.summary["processing"]["center_unembed"] is None
    cop, _, _ = copying_scores(dead)
    assert cop["copying"].isna().all() and cop["reason"].str.contains("W_U = 0").all()


def test_a_suppressor_has_no_promoted_list_and_the_cosine_lists_beside_it(tmp_path):
    """OV = ±3 Π (Π onto 8 embedding rows), W_U = W_Eᵀ: the negated head suppresses every token it reads."""
    d = tiny_hf_dir(tmp_path / "sup", n_layers=1)

    def build(t):
        E = t["model.embed_tokens.weight"]
        t["lm_head.weight"] = E.clone()
        Q, _ = torch.linalg.qr(E[10:18].T.double())
        t["model.layers.0.self_attn.v_proj.weight"][0:D_HEAD] = Q.T.float()
        o = t["model.layers.0.self_attn.o_proj.weight"]
        o[:, 0:D_HEAD] = 3 * Q.float()
        o[:, D_HEAD : 2 * D_HEAD] = -3 * Q.float()

    edit_safetensors(d, build)
    m = bridge_from_dir(d)
    r = tli.head_tokens(m, heads=["L0H0", "L0H1"], tokens=list(range(4, 100)), k=5, progress=False)
    sup, cop = r.top_tokens("L0H1"), r.top_tokens("L0H0")
    assert (r.self_ranks.loc["L0H1"].dropna() > 0.5).all()
    assert not (sup["kind"] == "promoted").any() and not (sup["kind"] == "promoted_cosine").any()
    s = sup[sup["kind"] == "suppressed"]
    assert len(s) == 5 and (s["value"] > 0.5).all() and s["value"].is_monotonic_decreasing
    sc = sup[sup["kind"] == "suppressed_cosine"]
    assert len(sc) == 5 and (sc["value"] < 0).all() and sc["value"].is_monotonic_increasing
    cos = r.self_cosines.loc["L0H1"]
    assert sc["token_id"].tolist() == cos.sort_values(kind="stable").index[:5].tolist()
    np.testing.assert_allclose(r.self_cosines.loc["L0H0"], -cos, rtol=1e-12)  # the negation mirrors the cosine
    p = cop[cop["kind"] == "promoted"]
    assert len(p) == 5 and (p["value"] < 0.5).all()


def test_the_written_tokens_of_an_untied_model_are_scored_with_w_u(dead):
    """write_i @ W_U, not write_i @ W_Eᵀ (the tiny model is untied: the two give other lists)."""
    m = dead
    r = tli.head_tokens(m, heads=["L0H4"], tokens=[5, 6], k=5, n_directions=1, progress=False)
    attn = m.blocks[0].attn
    W_V = getattr(attn, "_W_V", None)
    W_V = attn.W_V if W_V is None or W_V.shape[0] != 3 else W_V
    M = W_V[4 // 3].detach().double() @ attn.W_O[4].detach().double()  # V W_O, d_model x d_model
    U, _, Vh = torch.linalg.svd(M)
    read, write = U[:, 0], Vh[0]
    rs = m.W_E.detach().double() @ read
    if float(rs.max()) < -float(rs.min()):
        write = -write
    want = torch.topk(write @ m.W_U.detach().double(), 5).indices.tolist()
    wrong = torch.topk(write @ m.W_E.detach().double().T, 5).indices.tolist()
    top = r.top_tokens("L0H4")
    assert top[top["kind"] == "write_1"]["token_id"].tolist() == want and want != wrong


def test_a_byte_token_prints_as_its_bytes():
    from tl_idempotence.probes.tokens import token_texts

    class ByteLevel:  # GPT-2's byte-level alphabet: "Ġ" is the space byte, "â" and "Ģ" bytes 0xE2 and 0xA2
        def decode(self, ids):
            return {0: "\ufffd", 1: " the", 2: "\ufffd"}[ids[0]]

        def convert_ids_to_tokens(self, i):
            return {0: "â", 1: "Ġthe", 2: "<0xE2>"}[i]

    assert token_texts(ByteLevel(), [0, 1, 2]) == ["b'\\xe2'", " the", "b'\\xe2'"]
    assert token_texts(None, [0]) == [None]
