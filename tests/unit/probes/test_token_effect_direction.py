"""tli.attended_token_effect: the tested direction, the null's draws, BH over every layer, what it refuses (issue 46).

* A constructed head whose effect on the attended token is positive while a random earlier token fares better:
  its direction (the sign of effect - null, what its sign test tests) is -1 although its median effect is +; the
  headline's counts, the summary and ``rep.mechanism``'s ``sign_agrees`` follow the direction.
* The null's draws: one generator per call in window order (identical windows get different draws; the batch size
  changes nothing), never on BOS or another special token, and a position may be its own source (docs say so).
* BH q-values over the heads of every layer together, not per layer.
* Refused with the library's errors: an encoder (bidirectional), ``seq_len``/token rows longer than ``n_ctx`` (the
  default clamped to it); ``W_U = 0`` gives NaN with a reason, not a raw error.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

import tl_idempotence as tli
from tl_idempotence.errors import OptionError, UnsupportedModelError
from tl_idempotence.testing import bridge_from_dir, tiny_hf_dir, tiny_tokenizer

pytestmark = [pytest.mark.bridge, pytest.mark.filterwarnings("ignore:HookedTransformer is deprecated")]

N = 16


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return tiny_hf_dir(tmp_path_factory.mktemp("effect_direction") / "tiny", n_layers=2)


def hub_model():
    """Attention-only, one head attending to its own position (positions one-hot in dims 0..15), OV = Π onto the
    embedding dims 16..31, W_U = W_Eᵀ, no final norm. Token 1 ("hub") has embedding h, token 2 has 2h: a head
    reading the hub writes h, whose logit on token 2 (2‖h‖²) beats the hub's own (‖h‖²)."""
    try:
        from transformer_lens import HookedTransformer, HookedTransformerConfig
    except ImportError as e:  # pragma: no cover - transformer-lens 4.x
        pytest.skip(f"transformer-lens 4.x has no HookedTransformer: {e}")
    cfg = HookedTransformerConfig(
        n_layers=1, d_model=2 * N, n_ctx=N, d_head=N, n_heads=1, d_vocab=20, attn_only=True,
        normalization_type=None, act_fn="relu", positional_embedding_type="standard", seed=0,
    )  # fmt: skip
    m = HookedTransformer(cfg)
    E = torch.zeros(20, 2 * N)
    E[:, N:] = torch.randn(20, N, generator=torch.Generator().manual_seed(0)) * 0.3
    E[1, N:] = torch.ones(N)
    E[2, N:] = 2 * torch.ones(N)
    read = torch.zeros(2 * N, N)
    read[N:] = torch.eye(N)
    with torch.no_grad():
        for p in m.parameters():
            p.zero_()
        m.pos_embed.W_pos[:, :N].copy_(torch.eye(N))
        m.embed.W_E.copy_(E)
        m.unembed.W_U.copy_(E.T)
        m.blocks[0].attn.W_Q[0][:N].copy_(400 * torch.eye(N))
        m.blocks[0].attn.W_K[0][:N].copy_(torch.eye(N))  # query q attends to key q (itself)
        m.blocks[0].attn.W_V[0].copy_(read)
        m.blocks[0].attn.W_O[0].copy_(read.T)
    return m


def test_the_direction_is_what_the_test_tests_not_the_sign_of_the_effect():
    """Windows [2, 1, 1, ..., 1]: every destination from position 1 on attends to a hub (itself): a positive
    standardized effect; its null lands on a hub (a tie, dropped) or on token 2 at position 0, which the head's
    output raises more: effect - null < 0 wherever it is not 0. Direction -1, median effect +."""
    m = hub_model()
    toks = torch.ones(12, N, dtype=torch.long)
    toks[:, 0] = 2
    r = tli.attended_token_effect(m, texts=toks, seed=0, progress=False)
    row = r.table.loc["L0H0"]
    assert row["effect_median"] > 0.5 and row["n_pos_diff"] == 0 and row["n_neg_diff"] >= 10
    assert row["direction"] == -1.0 and row["effect_q"] <= 0.05
    assert row["effect_p"] == row["p_value"] and row["effect_q"] == row["q_value"]  # the deprecated names agree
    assert (r.summary["n_negative_q05"], r.summary["n_positive_q05"]) == (1, 0)
    assert "1 lower it and 0 raise it" in r.headline and "effect - null" in r.headline
    # rep.mechanism: the head is closed with α = +1 (OV = Π); its sign agrees with α by the raw effect, not by the
    # tested direction
    rep = tli.idempotence_report(m, progress=False)
    assert bool(rep.heads.loc["L0H0", "closed"]) and rep.heads.loc["L0H0", "alpha"] == pytest.approx(1.0)
    mech = rep.mechanism(texts=toks, n_tokens=10, k=2, n_permutations=9)
    t = mech.table
    assert t.loc["L0H0", "direction"] == -1.0 and t.loc["L0H0", "effect_median"] > 0
    assert t["sign_agrees"].tolist() == [False]
    assert (mech.summary["n_sign_tested"], mech.summary["n_agree"]) == (1, 0)
    sg = mech.signs.loc[("direction", "closed")]
    assert (sg["n_positive"], sg["n_negative"]) == (0, 1)
    assert "0 of 1 closed heads agree (direction: the sign of effect - null" in mech.headline
    assert "Too few closed heads to tell" in mech.headline and "cannot be below 1 > 0.05" in mech.headline


def test_derive_tests_counts_by_direction():
    """The mechanism's statistics read the direction column: a closed head with α > 0, a positive median effect
    and direction -1 disagrees; a head with direction 0 is not tested."""
    from tl_idempotence.report.mechanism import derive_tests

    t = pd.DataFrame(
        {
            "layer": [0, 0, 0, 0],
            "alpha": [2.0, 1.0, -1.0, 3.0],
            "P": [0.95, 0.95, 0.95, 0.5],
            "closed": [True, True, True, False],
            "effect_median": [0.3, 0.4, -0.2, 0.1],
            "median_diff": [-0.2, 0.0, -0.4, 0.1],
            "direction": [-1.0, 0.0, -1.0, 1.0],
            "copying": [1.0, 1.0, -1.0, 0.5],
            "copying_own": [1.0, 1.0, -1.0, 0.5],
        },
        index=["L0H0", "L0H1", "L0H2", "L0H3"],
    )
    t["alpha_P"] = t["alpha"] * t["P"]
    agrees, signs, stats = derive_tests(t, 9, 0)
    assert agrees.tolist()[:3] == [False, pd.NA, True] and pd.isna(agrees[3])
    assert (stats["n_sign_tested"], stats["n_agree"], stats["sign_test_floor"]) == (2, 1, 0.5)
    d = signs.loc[("direction", "all")]
    assert (d["n_positive"], d["n_negative"], d["n_zero"]) == (1, 2, 1)
    assert d["median_abs_negative"] == pytest.approx(0.3)  # the median |median_diff| of the heads that lower


@pytest.fixture(scope="module")
def repeated(bridge):
    """Four identical windows (BOS, then an EOS in the middle: two special positions): one per pass and all in one."""
    row = torch.randint(4, 100, (24,), generator=torch.Generator().manual_seed(5))
    row[0], row[11] = 1, 2
    toks = row.repeat(4, 1)
    kw = dict(heads=["L0H0", "L1H4"], texts=toks, seed=3, progress=False)
    return toks, tli.attended_token_effect(bridge, batch_size=1, **kw), tli.attended_token_effect(bridge, **kw)


def test_the_null_draws_continue_across_batches_and_ignore_the_batch_size(repeated):
    _, one, four = repeated
    a, b = one.positions, four.positions
    pd.testing.assert_frame_equal(a, b)  # no number depends on batch_size
    p = a[a["label"] == "L0H0"]
    by_window = [p[p["window"] == w]["null_source_pos"].to_numpy() for w in range(4)]
    assert all(len(x) == len(by_window[0]) for x in by_window)
    # identical windows, one per forward pass: the draws go on (a generator restarted per batch repeats them)
    assert not np.array_equal(by_window[0], by_window[1]) and not np.array_equal(by_window[1], by_window[2])


def test_sources_and_null_sources_are_never_special_and_a_position_may_read_itself(repeated):
    toks, one, _ = repeated
    special = {1, 2}
    pos = one.positions
    toks = toks.numpy()
    w, q = pos["window"].to_numpy(), pos["pos"].to_numpy()
    s, ns = pos["source_pos"].to_numpy(), pos["null_source_pos"].to_numpy()
    assert not set(toks[w, q].tolist()) & special  # no special destination
    assert not set(toks[w, s].tolist()) & special and not set(toks[w, ns].tolist()) & special
    assert (s <= q).all() and (ns <= q).all()
    # the first counted position has itself as its only eligible source: itself, for the head and the null
    first = pos[pos["pos"] == 1]
    assert (first["source_pos"] == 1).all() and (first["null_source_pos"] == 1).all()
    # the null covers the eligible positions (the draws are not stuck on one of them)
    last = pos[(pos["pos"] == 23) & (pos["label"] == "L0H0")]
    assert len(set(last["null_source_pos"])) >= 2


def test_bh_runs_over_the_heads_of_every_layer_together(bridge):
    from scipy.stats import false_discovery_control

    toks = torch.randint(4, 100, (4, 24), generator=torch.Generator().manual_seed(1))
    toks[:, 0] = 1
    heads = [(0, h) for h in range(5)] + [(1, h) for h in range(5)]
    t = tli.attended_token_effect(bridge, heads=heads, texts=toks, progress=False).table
    p = t["effect_p"].to_numpy()
    np.testing.assert_allclose(t["effect_q"].to_numpy(), false_discovery_control(p, method="bh"), rtol=1e-12)
    per_layer = np.concatenate([false_discovery_control(p[:5], method="bh"), false_discovery_control(p[5:])])
    assert not np.allclose(per_layer, t["effect_q"].to_numpy())  # the test can tell the two apart


def test_an_encoder_is_refused(tmp_path, bridge, monkeypatch):
    bert = bridge_from_dir(tiny_hf_dir(tmp_path / "enc", arch="bert", n_layers=1, d_model=16, n_heads=2))
    with pytest.raises(UnsupportedModelError, match=r"causal language model.*bidirectionally"):
        tli.attended_token_effect(bert, texts=torch.tensor([[5, 6, 7]]), progress=False)
    hf = bridge.__dict__.get("original_model") or bridge.original_model
    monkeypatch.setattr(hf, "can_generate", lambda: False)  # a bridge over a model that cannot generate
    with pytest.raises(UnsupportedModelError, match="causal language model"):
        tli.attended_token_effect(bridge, texts=torch.tensor([[1, 6, 7]]), progress=False)


def test_the_context_length_is_checked_and_the_default_window_fits_it(bridge):
    assert int(bridge.cfg.n_ctx) == 128
    with pytest.raises(OptionError, match=r"129 positions .*n_ctx = 128"):
        tli.attended_token_effect(bridge, texts=torch.full((1, 129), 5), progress=False)
    with pytest.raises(OptionError, match=r"seq_len=200 .*n_ctx = 128"):
        tli.attended_token_effect(bridge, texts="w5 w6 w7", seq_len=200, progress=False)
    m = hub_model()  # n_ctx 16: the default window (128) is clamped to it
    m.tokenizer = tiny_tokenizer(20)
    r = tli.attended_token_effect(m, texts=" ".join(f"w{i % 17 + 3}" for i in range(90)), progress=False)
    assert r.options["seq_len"] == 16 and r.positions["pos"].max() <= 15
    with pytest.raises(OptionError, match=r"seq_len=17 .*n_ctx = 16"):
        tli.attended_token_effect(m, texts="w5 w6", seq_len=17, progress=False)


def test_a_zero_unembedding_gives_nan_with_a_reason(bridge, monkeypatch):
    cls = type(bridge)
    monkeypatch.setattr(cls, "W_U", property(lambda self: torch.zeros(72, 100)))
    toks = torch.randint(4, 100, (2, 12), generator=torch.Generator().manual_seed(2))
    r = tli.attended_token_effect(bridge, heads=["L0H0", "L1H2"], texts=toks, progress=False)
    t = r.table
    assert t["effect_median"].isna().all() and t["direction"].isna().all() and (t["n_positions"] == 0).all()
    assert t["reason"].str.contains("no spread").all()
    assert "no head has a defined effect" in r.headline
    assert r.summary["processing"]["center_unembed"] is None  # W_U = 0: nothing to infer from
