"""tli.head_roles: TransformerLens's head-detector scores and the OV circuit's copying score per query head.

Replays what a user does on tiny models (a Llama/GQA checkpoint folder booted as a TransformerBridge, and as a
HookedTransformer on transformer-lens 3.x): the attention scores equal TransformerLens's own ``detect_head``
on the same tokens; a head built to attend to the previous token scores ~1 as previous-token head (and a head
with no query reads scores the uniform share); ``copying`` equals ``Re Σλ / Σ|λ|`` of a dense float64
eigendecomposition of the 100 x 100 full OV circuit (the kv head's W_V on GQA), also with W_U W_E accumulated
over chunks of 1 .. 101 vocabulary rows; the same weights on the two classes give the same table; the seed
decides the tokens; every argument is checked.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tl_idempotence as tli
from tl_idempotence.errors import OptionError, OptionTypeError, UnknownOptionError, UnsupportedModelError
from tl_idempotence.probes.roles import ATTENTION_ROLES, ROLES, repeated_random_tokens, role_scores
from tl_idempotence.sources.tl import tl_processing
from tl_idempotence.testing import tiny_hf_dir

pytestmark = pytest.mark.bridge  # no HookedTransformer needed (its tests skip on 4.x): runs on both majors

SCORES = [*ATTENTION_ROLES, "copying"]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return tiny_hf_dir(tmp_path_factory.mktemp("roles") / "tiny", n_layers=2)  # 9 heads on 3 kv heads, d_vocab 100


@pytest.fixture(scope="module")
def roles(bridge):
    return tli.head_roles(bridge, n_tokens=12, n_sequences=3, seed=5)


def dense_copying(model, layer: int, head: int) -> float:
    """Re Σλ / Σ|λ| of the d_vocab x d_vocab matrix W_E W_V W_O W_U, float64, numpy's dense eig."""
    n_kv = int(getattr(model.cfg, "n_key_value_heads", None) or model.cfg.n_heads)
    kv = head // (model.cfg.n_heads // n_kv)
    attn = model.blocks[layer].attn
    W_V = getattr(attn, "_W_V", None)
    W_V = attn.W_V if W_V is None or W_V.shape[0] != n_kv else W_V
    W_V = W_V[kv] if W_V.shape[0] == n_kv else W_V[head]
    W_E, W_U, W_O = (w.detach().double() for w in (model.W_E, model.W_U, attn.W_O[head]))
    full = (W_E @ W_V.detach().double() @ W_O @ W_U).numpy()
    lam = np.linalg.eigvals(full)
    return float(lam.real.sum() / np.abs(lam).sum())


def test_table_layout_and_summary(roles, bridge):
    t = roles.table
    assert list(t.index) == [f"L{a}H{b}" for a in range(2) for b in range(9)] and t.index.name == "label"
    assert list(t.columns) == ["layer", "head", "kv_head", *SCORES, "reason"] and tuple(SCORES) == ROLES
    assert t["kv_head"].tolist() == [h // 3 for h in range(9)] * 2
    for r in ATTENTION_ROLES:
        assert ((t[r] >= 0) & (t[r] <= 1)).all()
    assert ((t["copying"] >= -1) & (t["copying"] <= 1)).all() and (t["reason"] == "").all()
    s = roles.summary
    assert s["processing"] == tl_processing(bridge) and s["n_tokens"] == 12 and s["n_sequences"] == 3
    assert s["seed"] == 5 and s["exclude_bos"] is True and "BOS id 1" in s["sequence"]
    assert s["median_copying"] == pytest.approx(float(np.median(t["copying"])))
    assert roles.heads.equals(roles.table) and "HeadRoles(" in repr(roles) and "HeadRoles" in roles._repr_html_()


def test_copying_equals_dense_eigendecomposition(roles, bridge):
    for lab, row in roles.table.iterrows():
        want = dense_copying(bridge, int(row["layer"]), int(row["head"]))
        assert row["copying"] == pytest.approx(want, abs=1e-9), lab
    # GQA: heads reading the same kv head have different O, so different scores
    assert roles.table["copying"].nunique() == 18


@pytest.fixture(scope="module")
def dense_copying_all(bridge):
    return {(layer, h): dense_copying(bridge, layer, h) for layer in range(2) for h in range(9)}


@pytest.mark.parametrize("chunk", [1, 7, 33, 99, 100, 101])
def test_copying_over_several_vocabulary_chunks(bridge, dense_copying_all, monkeypatch, chunk):
    """W_U W_E accumulated over chunks of 1, 7, 33, 99 (the last chunk one row), 100 (one chunk, exactly) and
    101 rows of the 100-token vocabulary equals the dense float64 circuit: a chunk boundary that overlaps or skips
    a row (the default chunk, 8192, is one chunk on every unit-tier model) changes W_U W_E, so the scores."""
    import tl_idempotence.probes.roles as roles_mod

    monkeypatch.setattr(roles_mod, "VOCAB_CHUNK", chunk)
    table, _info, _fingerprints = roles_mod.copying_scores(bridge)
    got = {(int(r.layer), int(r.head)): float(r.copying) for r in table.itertuples()}
    assert got.keys() == dense_copying_all.keys()
    for k, want in dense_copying_all.items():
        assert got[k] == pytest.approx(want, abs=1e-9), (chunk, k)


def test_attention_scores_equal_tl_detect_head(bridge, request):
    from transformer_lens.head_detector import detect_head

    text = "w5 w9 w7 w5 w6 w7 w12 w5 w9 w7 w5 w6 w7 w12"
    models = [bridge]
    try:
        models.append(request.getfixturevalue("hooked"))
    except pytest.skip.Exception:
        pass
    for m in models:
        toks = m.to_tokens(text)
        got = role_scores(m, toks)
        for role, name in ATTENTION_ROLES.items():
            ref = detect_head(m, text, name, exclude_bos=True).double().numpy()
            np.testing.assert_allclose(got[role], ref, rtol=0, atol=1e-6, err_msg=f"{type(m).__name__} {role}")


def test_tokens_are_seeded_bos_x_x(bridge, roles):
    toks, bos = repeated_random_tokens(bridge, 12, 3, 5)
    assert bos == 1 and toks.shape == (3, 25) and (toks[:, 0] == 1).all()
    assert torch.equal(toks[:, 1:13], toks[:, 13:]) and int(toks[:, 1:].min()) >= 4  # ids 0..3: specials
    assert torch.equal(toks, repeated_random_tokens(bridge, 12, 3, 5)[0])
    assert not torch.equal(toks, repeated_random_tokens(bridge, 12, 3, 6)[0])
    again = tli.head_roles(bridge, n_tokens=12, n_sequences=3, seed=5)
    assert again.table.equals(roles.table)
    other = tli.head_roles(bridge, n_tokens=12, n_sequences=3, seed=6)
    assert not np.allclose(other.table["induction"], roles.table["induction"])
    assert other.table["copying"].equals(roles.table["copying"])  # weights only


def test_one_sequence_a_pass_gives_the_same_scores(bridge, monkeypatch):
    import tl_idempotence.probes.roles as roles_mod

    toks, _ = repeated_random_tokens(bridge, 12, 3, 5)
    together = role_scores(bridge, toks)
    monkeypatch.setattr(roles_mod, "PATTERN_ELEMS", 1)  # every sequence its own forward pass
    apart = role_scores(bridge, toks)
    for r in ATTENTION_ROLES:
        np.testing.assert_allclose(apart[r], together[r], rtol=0, atol=1e-6)


def test_hooked_and_bridge_give_the_same_table(hooked, bridge):
    a = tli.head_roles(hooked, n_tokens=12, n_sequences=3, seed=5).table
    b = tli.head_roles(bridge, n_tokens=12, n_sequences=3, seed=5).table
    assert list(a.index) == list(b.index)
    np.testing.assert_allclose(a[SCORES].to_numpy(), b[SCORES].to_numpy(), rtol=0, atol=1e-6)


def test_a_constructed_previous_token_head():
    """One attention-only layer, positions one-hot in the residual stream: head 0's query of position i matches
    the key of position i - 1 with weight 400 (attention ~1 there), head 1 has W_Q = 0 (uniform attention)."""
    try:
        from transformer_lens import HookedTransformer, HookedTransformerConfig
    except ImportError as e:
        pytest.skip(f"transformer-lens 4.x has no HookedTransformer: {e}")
    n = 32
    cfg = HookedTransformerConfig(
        n_layers=1, d_model=n, n_ctx=n, d_head=n, n_heads=2, d_vocab=50, attn_only=True, normalization_type=None,
        act_fn="relu", positional_embedding_type="standard", seed=0,
    )  # fmt: skip
    m = HookedTransformer(cfg)
    with torch.no_grad():
        for p in m.parameters():
            p.zero_()
        m.pos_embed.W_pos.copy_(torch.eye(n))
        m.embed.W_E.copy_(torch.randn(50, n, generator=torch.Generator().manual_seed(0)) * 1e-3)
        m.blocks[0].attn.W_Q[0].copy_(400 * torch.eye(n))
        m.blocks[0].attn.W_K[0].copy_(torch.diag(torch.ones(n - 1), 1))  # key of j reads e_j -> e_{j+1}
        m.blocks[0].attn.W_O.normal_(generator=torch.Generator().manual_seed(1))
        m.blocks[0].attn.W_V.normal_(generator=torch.Generator().manual_seed(2))
        m.unembed.W_U.normal_(generator=torch.Generator().manual_seed(3))
    r = tli.head_roles(m, n_tokens=10, n_sequences=2, seed=0)
    assert r.table.loc["L0H0", "previous_token"] > 0.999
    toks, _ = repeated_random_tokens(m, 10, 2, 0)
    L = toks.shape[1]
    # uniform attention 1/(i+1) over keys 0..i, BOS column left out; TL's "mul" score: mass on (i, i-1) over all mass
    uniform = sum(1 / (i + 1) for i in range(2, L)) / sum(i / (i + 1) for i in range(1, L))
    assert r.table.loc["L0H1", "previous_token"] == pytest.approx(uniform, abs=1e-6)
    assert r.table.loc["L0H1", "previous_token"] < 0.3


def test_hostile_inputs(bridge):
    with pytest.raises(UnsupportedModelError, match="TransformerLens model"):
        tli.head_roles(torch.nn.Linear(2, 2))
    with pytest.raises(UnsupportedModelError, match="TransformerLens model"):
        tli.head_roles("smollm2-135m")
    with pytest.raises(OptionError, match="n_tokens"):
        tli.head_roles(bridge, n_tokens=1)
    with pytest.raises(OptionError, match=r"do not fit the model's context.*n_ctx = 128.*n_tokens <= 63"):
        tli.head_roles(bridge, n_tokens=64)
    with pytest.raises(OptionTypeError, match="n_tokens"):
        tli.head_roles(bridge, n_tokens=2.0)
    with pytest.raises(OptionError, match="n_sequences"):
        tli.head_roles(bridge, n_sequences=0)
    with pytest.raises(OptionError, match="seed"):
        tli.head_roles(bridge, seed=-1)
    with pytest.raises(OptionTypeError, match="seed"):
        tli.head_roles(bridge, seed="0")
    with pytest.raises(UnknownOptionError, match="n_tokens"):
        tli.head_roles(bridge, n_token=8)


def test_progress_bars_go_to_stderr_count_every_layer_and_can_be_switched_off(bridge, capsys, monkeypatch):
    """head_roles' one bar: each layer's copying score, then each layer in each detector pass (2 layers, 3
    sequences in one pass: 4 steps; one sequence a pass: 2 + 2·3 = 8); rep.roles adds the association's bar."""
    import tl_idempotence.probes.roles as roles_mod

    tli.head_roles(bridge, repeat_len=4, n_sequences=3)
    out, err = capsys.readouterr()
    assert out == "" and "head roles (each layer's copying score, then its detector scores" in err
    assert "| 4/4 [" in err and "/4 [" in err.replace("| 4/4 [", "")  # drawn as it goes, and ends at its total
    monkeypatch.setattr(roles_mod, "PATTERN_ELEMS", 1)  # every sequence its own forward pass
    tli.head_roles(bridge, repeat_len=4, n_sequences=3)
    assert "| 8/8 [" in capsys.readouterr().err
    monkeypatch.undo()
    rep = tli.idempotence_report(bridge, progress=False)
    rep.roles(model=bridge, repeat_len=4, n_sequences=3, n_permutations=9)
    out, err = capsys.readouterr()
    assert out == "" and "| 4/4 [" in err and "association with closure (5 roles x 9 permutations" in err
    assert "| 5/5 [" in err
    tli.head_roles(bridge, repeat_len=4, n_sequences=3, progress=False)
    rep.roles(model=bridge, repeat_len=4, n_sequences=3, n_permutations=9, progress=False)
    assert capsys.readouterr() == ("", "")
    with pytest.raises(OptionTypeError, match="progress"):
        tli.head_roles(bridge, progress="yes")
    with pytest.raises(OptionTypeError, match="progress"):
        rep.roles(model=bridge, progress=1)
