"""SmolLM2-135M's token readout against dense float64 rows, and its attended-token effect against TransformerLens's
own cache (slow). The unit tests on tiny models are tests/unit/probes/test_head_tokens.py and
test_token_effect.py.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tl_idempotence as tli
import tl_idempotence.probes.head_tokens as ht

pytestmark = pytest.mark.bridge  # no HookedTransformer needed: runs on both majors

#: Two closed heads of opposite alpha and one head that is not closed (checked against the report below).
HEADS = [(10, 8), (27, 1), (5, 3)]


def dense_rows(model, layer: int, head: int, tokens: np.ndarray) -> torch.Tensor:
    """``W_E[t] @ W_V[kv] @ W_O[h] @ W_U`` in float64, ``[n, d_vocab]`` (the issue's reference rows)."""
    n_kv = int(model.cfg.n_key_value_heads or model.cfg.n_heads)
    attn = model.blocks[layer].attn
    W_V = getattr(attn, "_W_V", None)
    W_V = attn.W_V if W_V is None or W_V.shape[0] != n_kv else W_V
    W_V = W_V[head // (model.cfg.n_heads // n_kv)] if W_V.shape[0] == n_kv else W_V[head]
    W_E, W_U, W_O = (w.detach().double() for w in (model.W_E, model.W_U, attn.W_O[head]))
    return W_E[torch.as_tensor(tokens)] @ W_V.detach().double() @ W_O @ W_U


def dense_counts(rows: torch.Tensor, tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    t = torch.as_tensor(tokens)
    self_logit = rows[torch.arange(len(t)), t].unsqueeze(1)
    return (rows > self_logit).sum(1).numpy(), (rows < self_logit).sum(1).numpy()


@pytest.fixture(scope="module")
def closure(smollm2):
    return tli.idempotence_report(smollm2).heads


@pytest.mark.slow
def test_smollm2_self_ranks_equal_dense_float64_rows(smollm2, closure, monkeypatch):
    """Every self-rank of 96 seeded tokens (and 8 chosen ones: the first ids, the last, the tile edges) of L10H8
    (closed, alpha < 0), L27H1 (closed, alpha > 0) and L5H3 (not closed) equals the count from the dense float64
    row; once with the default tiling, once with 1000-column tiles and 37-token chunks (ragged tails), and the
    closed heads promote / suppress their own tokens as the sign of alpha says."""
    c = closure
    assert bool(c.loc["L10H8", "closed"]) and c.loc["L10H8", "alpha"] < 0
    assert bool(c.loc["L27H1", "closed"]) and c.loc["L27H1", "alpha"] > 0
    assert not bool(c.loc["L5H3", "closed"])
    d_vocab = int(smollm2.W_E.shape[0])
    sample = tli.head_tokens(smollm2, heads=[(0, 0)], n_tokens=96, seed=1).tokens
    extra = [0, 1, 2047, 2048, 2049, 40959, d_vocab - 2, d_vocab - 1]
    toks = np.unique(np.concatenate([sample, extra]))
    a = tli.head_tokens(smollm2, heads=HEADS, tokens=toks, k=20)
    monkeypatch.setattr(ht, "VOCAB_TILE", 1000)
    b = tli.head_tokens(smollm2, heads=HEADS, tokens=toks, k=20, chunk=37)
    assert list(a.table.index) == ["L5H3", "L10H8", "L27H1"]
    for layer, head in HEADS:
        lab = f"L{layer}H{head}"
        above, below = dense_counts(dense_rows(smollm2, layer, head, toks), toks)
        want = above / (d_vocab - 1)
        np.testing.assert_array_equal(a.self_ranks.loc[lab].to_numpy(), want)
        np.testing.assert_array_equal(b.self_ranks.loc[lab].to_numpy(), want)
        row = a.table.loc[lab]
        assert row["self_rank_median"] == np.median(want)
        assert row["frac_top_k"] == np.mean(above < 20) and row["frac_bottom_k"] == np.mean(below < 20)
    assert a.table.loc["L10H8", "self_rank_median"] > 0.9  # alpha < 0: suppresses what it reads
    assert a.table.loc["L27H1", "self_rank_median"] < 0.1  # alpha > 0: promotes it


def _reference_effects(model, toks: torch.Tensor, layer: int, head: int) -> dict[str, np.ndarray]:
    """The module docstring's quantities from ``run_with_cache``: per counted destination, the most-attended
    counted source, the standardized direct effect on its token (dense float64 logits over the vocabulary)."""
    _, cache = model.run_with_cache(toks)
    tok = model.tokenizer
    special = set(tok.all_special_ids) | {
        v for v in (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) if isinstance(v, int)
    }
    ids = toks[0].tolist()
    counted = np.array([i not in special for i in ids])
    z = cache[f"blocks.{layer}.attn.hook_z"][0, :, head].double()  # [P, d_head]
    scale = cache["ln_final.hook_scale"][0, :, 0].double()  # [P]
    pat = cache[f"blocks.{layer}.attn.hook_pattern"][0, head].double()  # [q, k]
    W_O = model.blocks[layer].attn.W_O[head].detach().double()
    logits = (z @ W_O / scale[:, None]) @ model.W_U.detach().double()  # [P, d_vocab]
    out: dict[str, list] = {"pos": [], "src": [], "effect": [], "raw": []}
    for q in range(len(ids)):
        elig = [k for k in range(q + 1) if counted[k]]
        if not counted[q] or not elig:
            continue
        s = max(elig, key=lambda k: float(pat[q, k]))
        e = logits[q]
        out["pos"].append(q)
        out["src"].append(s)
        out["effect"].append(float((e[ids[s]] - e.mean()) / e.std(unbiased=False)))
        out["raw"].append(float(e[ids[s]]))
    return {k: np.asarray(v) for k, v in out.items()}


@pytest.mark.slow
def test_smollm2_attended_token_effect_equals_tl_cache(smollm2):
    """On one short text (BOS first; repeated words, so heads attend back): every position's source, standardized
    and raw effect of three heads equals the computation from TransformerLens's ``run_with_cache`` (``hook_z``,
    ``hook_pattern``, ``ln_final.hook_scale``, dense logits) to float rounding, and the table's medians and
    fraction negative are those of the reference effects."""
    tok = smollm2.tokenizer
    text = "The cat sat on the mat. The cat sat on the mat again, and the dog watched the cat."
    ids = tok(text, add_special_tokens=False)["input_ids"]
    bos = tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id
    toks = torch.tensor([[bos, *ids]])
    r = tli.attended_token_effect(smollm2, heads=HEADS, texts=toks, max_tokens=None)
    pos = r.positions
    for layer, head in HEADS:
        lab = f"L{layer}H{head}"
        want = _reference_effects(smollm2, toks, layer, head)
        got = pos[pos["label"] == lab].sort_values("pos")
        assert len(want["pos"]) == len(ids) and got["window"].eq(0).all()
        np.testing.assert_array_equal(got["pos"].to_numpy(), want["pos"])
        np.testing.assert_array_equal(got["source_pos"].to_numpy(), want["src"])
        np.testing.assert_array_equal(got["token"].to_numpy(), toks[0, want["src"]].numpy())
        np.testing.assert_allclose(got["effect"].to_numpy(), want["effect"], rtol=1e-9, atol=1e-9)
        np.testing.assert_allclose(got["raw_effect"].to_numpy(), want["raw"], rtol=1e-9, atol=1e-12)
        row = r.table.loc[lab]
        assert row["n_positions"] == len(want["pos"])
        assert row["effect_median"] == pytest.approx(np.median(want["effect"]), rel=1e-9, abs=1e-12)
        assert row["frac_negative"] == np.mean(want["effect"] < 0)
        assert row["raw_effect_median"] == pytest.approx(np.median(want["raw"]), rel=1e-9, abs=1e-12)
