"""tli.head_roles on a GQA model whose heads differ in kind within a kv group.

Two query heads that read the same kv head share ``W_K`` and ``W_V`` but not ``W_Q`` or ``W_O``: their attention
patterns and OV circuits differ, so a head mix-up (a query head given the scores, pattern or ``W_O`` of its kv head's
first query head, or of query head ``kv_head``) changes the table. The random tiny checkpoints of test_roles.py
only differ by chance; here every head is built by hand and every score is checked against a value computed by
hand from the construction (no TransformerLens code in the reference):

A two-layer attention-only HookedTransformer (no norms, no attention scale, no biases), 4 query heads on 2 kv
heads, residual stream ``[position one-hot (32) | token one-hot (20) | previous token one-hot (20)]``:

* layer 0: head 0 is a previous-token head (query of position i matches the key of position i - 1 with weight
  400) whose OV copies the token into the "previous token" slot; heads 1-3 have no query (uniform attention) and
  no output.
* layer 1, kv head 0 (its key: the shifted position and the previous token): head 0 queries the position
  (previous-token head), head 1 the current token (induction head: attends to the token after an earlier copy).
  kv head 1 (its key: the token and the position): head 2 queries the token minus its own position
  (duplicate-token head), head 3 nothing (uniform).
* the OV circuits ``W_E W_V W_O W_U`` are, by construction: layer 1 head 0 the identity (copying +1), head 1
  minus the identity (-1, the same ``W_V``), head 2 ``diag(+1 x 15, -1 x 5)`` (0.5), head 3 random (checked
  against a dense float64 eigendecomposition); layer 0 head 0 the identity (+1), heads 1-3 zero (NaN, a reason).

Softmax logits differ by 0 or 400, so the float32 patterns are one-hot or uniform over ties, exactly; the
reference recomputes them in float64 from the rules above and scores them with TransformerLens's documented
``"mul"`` measure (mass on the detection pattern over the mass left once the BOS column is excluded).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tl_idempotence as tli
from tl_idempotence.probes.roles import repeated_random_tokens

P, V, C = 32, 20, 400.0  # n_ctx (position slots), d_vocab, logit of a match
D_MODEL, D_HEAD, NQ, NKV = P + 2 * V, P + V, 4, 2
TOK, PREV = P, P + V  # offsets of the token and previous-token slots in the residual stream
N_TOKENS, N_SEQ, SEED = 10, 3, 0
SIGNS = np.array([1.0] * 15 + [-1.0] * 5)  # layer 1 kv head 1's W_V: head 2's OV circuit is diag(SIGNS)


def _model():
    try:
        from transformer_lens import HookedTransformer, HookedTransformerConfig
    except ImportError as e:  # pragma: no cover - transformer-lens 4.x
        pytest.skip(f"transformer-lens 4.x has no HookedTransformer: {e}")
    cfg = HookedTransformerConfig(
        n_layers=2, d_model=D_MODEL, n_ctx=P, d_head=D_HEAD, n_heads=NQ, n_key_value_heads=NKV, d_vocab=V,
        attn_only=True, normalization_type=None, act_fn="relu", positional_embedding_type="standard",
        use_attn_scale=False, seed=0,
    )  # fmt: skip
    m = HookedTransformer(cfg)
    eye_v = torch.eye(V)
    with torch.no_grad():
        for p in m.parameters():
            p.zero_()
        m.pos_embed.W_pos.copy_(torch.eye(P, D_MODEL))
        m.embed.W_E[:, TOK : TOK + V] = eye_v
        m.unembed.W_U[TOK : TOK + V] = eye_v  # reads the token and the previous-token slot
        m.unembed.W_U[PREV : PREV + V] = eye_v
        shift = torch.diag(torch.ones(P - 1), 1)  # key of position j -> slot j + 1
        a0, a1 = m.blocks[0].attn, m.blocks[1].attn
        # layer 0, head 0: previous-token head writing the token into the previous-token slot
        a0.W_Q[0, :P, :P] = C * torch.eye(P)
        a0._W_K[0, :P, :P] = shift
        a0._W_V[0, TOK : TOK + V, :V] = eye_v
        a0.W_O[0, :V, PREV : PREV + V] = eye_v
        # layer 1, kv head 0: key = (shifted position, previous token); head 0 previous-token, head 1 induction
        a1._W_K[0, :P, :P] = shift
        a1._W_K[0, PREV : PREV + V, P : P + V] = eye_v
        a1.W_Q[0, :P, :P] = C * torch.eye(P)
        a1.W_Q[1, TOK : TOK + V, P : P + V] = C * eye_v
        a1._W_V[0, TOK : TOK + V, :V] = eye_v
        a1.W_O[0, :V, TOK : TOK + V] = eye_v  # OV circuit: identity
        a1.W_O[1, :V, TOK : TOK + V] = -eye_v  # same W_V: minus the identity
        # layer 1, kv head 1: key = (token, position); head 2 duplicate-token (own position -C), head 3 uniform
        a1._W_K[1, TOK : TOK + V, :V] = eye_v
        a1._W_K[1, :P, V : V + P] = torch.eye(P)
        a1.W_Q[2, TOK : TOK + V, :V] = C * eye_v
        a1.W_Q[2, :P, V : V + P] = -C * torch.eye(P)
        a1._W_V[1, TOK : TOK + V, :V] = torch.diag(torch.tensor(SIGNS, dtype=torch.float32))
        a1.W_O[2, :V, TOK : TOK + V] = eye_v  # OV circuit: diag(SIGNS)
        a1.W_O[3].normal_(generator=torch.Generator().manual_seed(3))  # OV circuit: random
    return m


@pytest.fixture(scope="module")
def model():
    return _model()


@pytest.fixture(scope="module")
def roles(model):
    return tli.head_roles(model, n_tokens=N_TOKENS, n_sequences=N_SEQ, seed=SEED)


def _softmax_rows(logits: np.ndarray) -> np.ndarray:
    L = len(logits)
    z = np.where(np.tril(np.ones((L, L), dtype=bool)), logits, -np.inf)
    z = np.exp(z - z.max(1, keepdims=True))
    return z / z.sum(1, keepdims=True)


def _patterns(t: np.ndarray) -> dict[str, np.ndarray]:
    """The attention pattern of each kind of head built above, on token ids ``t`` (float64, by the rules)."""
    L = len(t)
    i, j = np.meshgrid(np.arange(L), np.arange(L), indexing="ij")
    prev_tok = np.concatenate([t[:1], t[:-1]])  # what layer 0 wrote at each position (position 0: itself)
    return {
        "previous": _softmax_rows(C * (j == i - 1)),
        "induction": _softmax_rows(C * (prev_tok[j] == t[i])),
        "duplicate": _softmax_rows(C * (t[j] == t[i]) - C * (j == i)),
        "uniform": _softmax_rows(np.zeros((L, L))),
    }


def _detections(t: np.ndarray) -> dict[str, np.ndarray]:
    """TransformerLens's detection patterns, written from their documented definitions."""
    L = len(t)
    i, j = np.meshgrid(np.arange(L), np.arange(L), indexing="ij")
    dup = (t[j] == t[i]) & (j < i)  # an earlier copy of the current token
    ind = np.zeros((L, L), dtype=bool)
    ind[:, 1:] = dup[:, :-1]  # the token after an earlier copy
    return {"previous_token": j == i - 1, "duplicate_token": dup, "induction": ind & (j <= i)}


def _mul_score(pattern: np.ndarray, det: np.ndarray) -> float:
    a = pattern.copy()
    a[:, 0] = 0.0  # exclude_bos
    return float((a * det).sum() / a.sum())


def expected_role_scores(tokens: torch.Tensor) -> dict[str, dict[tuple[int, int], float]]:
    """``{role: {(layer, head): score}}`` averaged over the sequences, by hand."""
    kinds = {(0, 0): "previous", (0, 1): "uniform", (0, 2): "uniform", (0, 3): "uniform"}
    kinds |= {(1, 0): "previous", (1, 1): "induction", (1, 2): "duplicate", (1, 3): "uniform"}
    out: dict[str, dict[tuple[int, int], float]] = {r: dict.fromkeys(kinds, 0.0) for r in _detections(np.zeros(2))}
    for row in tokens.numpy():
        pats, dets = _patterns(row), _detections(row)
        for lh, kind in kinds.items():
            for role, det in dets.items():
                out[role][lh] += _mul_score(pats[kind], det) / len(tokens)
    return out


def test_the_construction_gives_the_intended_heads(model):
    """The model does what the reference assumes: layer 1's patterns are the hand-computed ones."""
    toks, _ = repeated_random_tokens(model, N_TOKENS, N_SEQ, SEED)
    _, cache = model.run_with_cache(toks, names_filter=lambda n: n.endswith("hook_pattern"))
    for b, row in enumerate(toks.numpy()):
        pats = _patterns(row)
        for layer, kinds in ((0, ("previous", "uniform", "uniform", "uniform")), (1, tuple(pats))):
            got = cache["pattern", layer][b].double().numpy()
            for h, kind in enumerate(kinds):
                np.testing.assert_allclose(got[h], pats[kind], rtol=0, atol=1e-6, err_msg=f"L{layer}H{h} {kind}")


def test_each_query_head_has_its_own_role_scores(roles, model):
    toks, _ = repeated_random_tokens(model, N_TOKENS, N_SEQ, SEED)
    want = expected_role_scores(toks)
    t = roles.table
    assert t["kv_head"].tolist() == [0, 0, 1, 1] * 2
    for role, per_head in want.items():
        for (layer, h), v in per_head.items():
            assert t.loc[f"L{layer}H{h}", role] == pytest.approx(v, abs=1e-6), (role, layer, h)
    # the kinds are told apart within each kv group (what a mix-up of head and kv head would hide)
    assert t.loc["L1H0", "previous_token"] == pytest.approx(1.0, abs=1e-9)  # every row on i - 1 (row 1: BOS only)
    assert t.loc["L1H1", "induction"] > 0.5 > t.loc["L1H1", "previous_token"]
    assert t.loc["L1H2", "duplicate_token"] > 0.5 > t.loc["L1H2", "induction"]
    assert t.loc["L1H0", "induction"] < 0.2 and t.loc["L1H3", "induction"] < 0.2
    assert t.loc["L0H0", "previous_token"] == pytest.approx(1.0, abs=1e-9)
    assert t.loc["L0H1", "previous_token"] < 0.3


def test_each_query_head_has_its_own_copying_score(roles, model):
    t = roles.table
    assert t.loc["L1H0", "copying"] == pytest.approx(1.0, abs=1e-12)  # identity
    assert t.loc["L1H1", "copying"] == pytest.approx(-1.0, abs=1e-12)  # minus the identity, the same W_V
    assert t.loc["L1H2", "copying"] == pytest.approx(0.5, abs=1e-12)  # diag(+1 x 15, -1 x 5)
    assert t.loc["L0H0", "copying"] == pytest.approx(1.0, abs=1e-12)
    W_E, W_U = model.W_E.detach().double(), model.W_U.detach().double()
    a1 = model.blocks[1].attn
    full = (W_E @ a1._W_V[1].detach().double() @ a1.W_O[3].detach().double() @ W_U).numpy()
    lam = np.linalg.eigvals(full)
    assert t.loc["L1H3", "copying"] == pytest.approx(float(lam.real.sum() / np.abs(lam).sum()), abs=1e-9)
    for h in (1, 2, 3):  # no output: zero OV circuit
        assert np.isnan(t.loc[f"L0H{h}", "copying"]) and "no nonzero eigenvalue" in t.loc[f"L0H{h}", "reason"]
    assert (t.loc[[f"L1H{h}" for h in range(4)], "reason"] == "").all()
