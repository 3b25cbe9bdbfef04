"""Activation-level returns (SPEC section 8): dense reference, exact projection heads, real text."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from helpers import dense_T
from tl_idempotence.errors import OptionError, OptionTypeError, UnsupportedModelError
from tl_idempotence.probes.activations import activation_returns, head_returns
from tl_idempotence.probes.tokens import default_corpus, prepare_tokens
from tl_idempotence.testing import bridge_from_dir, tiny_hf_dir


def test_head_returns_match_dense():
    g = torch.Generator().manual_seed(0)
    h, d, r = 3, 20, 4
    O = torch.randn(h, d, r, generator=g, dtype=torch.float64)
    V = torch.randn(h, d, r, generator=g, dtype=torch.float64)
    z = torch.randn(7, h, r, generator=g, dtype=torch.float64)
    a, c2 = head_returns(z, O.mT @ O, V.mT @ O)
    for k in range(h):
        T = dense_T(O[k], V[k])
        y = z[:, k] @ O[k].T  # [tok, d] = (O z)ᵀ
        Ty = y @ T.T
        ip = (Ty * y).sum(-1)
        torch.testing.assert_close(a[:, k], ip / (y * y).sum(-1), rtol=1e-12, atol=0)
        torch.testing.assert_close(c2[:, k], ip**2 / ((Ty * Ty).sum(-1) * (y * y).sum(-1)), rtol=1e-12, atol=0)
    # Row form of TransformerLens: T y = y @ W_V @ W_O with W_V = V, W_O = Oᵀ.
    y = z[:, 0] @ O[0].T
    torch.testing.assert_close((y @ V[0] @ O[0].T), y @ dense_T(O[0], V[0]).T)
    zero = torch.zeros(1, h, r, dtype=torch.float64)
    a0, c0 = head_returns(zero, O.mT @ O, V.mT @ O)
    assert torch.isnan(a0).all() and torch.isnan(c0).all()


def test_default_corpus_is_deterministic_english():
    a, b = default_corpus(), default_corpus()
    assert a == b and len(a) > 100
    text = " ".join(a)
    assert len(text) > 100_000 and text.count(" the ") > 1000


def _projection_dir(tmp_path, arch: str, alpha: float, seed: int = 0):
    """Tiny checkpoint whose layer-0 head-0 OV is an exact scaled oblique projection (Vᵀ O = alpha I)."""
    import shutil

    import transformers

    tag = {"llama": "q", "bert": "b"}[arch]  # no family words in paths (TL 3.x dispatches on them)
    src = tiny_hf_dir(
        tmp_path / f"src_{tag}", arch=arch, seed=seed, **({"n_heads": 6, "n_kv_heads": 6} if arch == "bert" else {})
    )
    if arch == "bert":
        model = transformers.BertForMaskedLM.from_pretrained(src)
        att = model.bert.encoder.layer[0].attention
        Wv, Wo = att.self.value.weight, att.output.dense.weight
    else:
        model = transformers.LlamaForCausalLM.from_pretrained(src)
        att = model.model.layers[0].self_attn
        Wv, Wo = att.v_proj.weight, att.o_proj.weight
    dh = model.config.hidden_size // model.config.num_attention_heads
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        V0 = Wv[:dh].T.double()  # column form d_model x d_head (head 0 reads kv head 0)
        N = torch.randn(V0.shape, generator=g, dtype=torch.float64)
        N = N - V0 @ torch.linalg.solve(V0.T @ V0, V0.T @ N)
        O0 = alpha * V0 @ torch.linalg.inv(V0.T @ V0) + N
        Wo[:, :dh] = O0.float()
    out = tmp_path / f"proj_{tag}"
    model.save_pretrained(out)
    for f in src.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens")):
            shutil.copy(f, out / f.name)
    return out


def _tokens(n=4, pos=24, seed=0):
    t = torch.randint(4, 100, (n, pos), generator=torch.Generator().manual_seed(seed))
    t[:, 0] = 1  # BOS (w1), a special token: excluded from the statistics
    return t


@pytest.mark.parametrize(
    "arch,cls",
    [
        pytest.param("llama", "bridge", marks=pytest.mark.bridge),
        ("llama", "hooked"),
        pytest.param("bert", "bridge", marks=pytest.mark.bridge),
    ],
)
def test_exact_scaled_projection_returns_alpha(tmp_path, arch, cls):
    alpha = -2.5
    d = _projection_dir(tmp_path, arch, alpha)
    if cls == "hooked":
        from tl_idempotence.testing import hooked_from_dir

        model = hooked_from_dir(d)
    else:
        model = bridge_from_dir(d)
    toks = _tokens()
    res = activation_returns(model, toks, heads=[(0, 0), (0, 1)], progress=False, nulls=8)
    assert res.options["nulls"] == 8 and res.options["control"] == "scramble" and "n_control_draws" not in res.options
    assert res.options["corpus"] == type(toks).__name__ != "default (stdlib docstrings)"
    row = res.heads.set_index("head").loc[0]
    assert row["P"] == pytest.approx(1.0, abs=1e-6) and row["alpha"] == pytest.approx(alpha, rel=1e-5)
    assert row["n_tokens"] == 4 * 23  # position 0 (BOS) excluded
    for col in ("a_min", "a_max", "a_median"):
        assert row[col] == pytest.approx(alpha, rel=1e-6), col
    assert row["cos2_min"] == pytest.approx(1.0, abs=1e-6)
    # The scramble null of the same head does not return its outputs.
    assert row["ctrl_cos2_median"] < 0.6 and row["cos2_beats_control"]
    other = res.heads.set_index("head").loc[1]
    assert other["cos2_median"] < 0.9  # a random head of the same layer


@pytest.mark.bridge
def test_prepare_tokens_windows_and_special_positions(tmp_path):
    model = bridge_from_dir(tiny_hf_dir(tmp_path / "tq", arch="llama", n_layers=1))
    texts = [" ".join(["w4 w5 w6 w7 w8 w9"] * 9), " ".join(["w9 w8 w7"] * 10)]  # tiny tokenizer: single digits
    toks, counted = prepare_tokens(model, texts, seq_len=10, max_tokens=None)
    assert toks.shape[1] == 10 and (toks[:, 0] == 1).all()  # BOS prepended (cfg.default_prepend_bos)
    assert not counted[:, 0].any()
    sep = toks == 2  # EOS separators between documents are excluded too
    assert sep.sum() >= 1 and not counted[sep].any()
    # Stream: 54 tokens + EOS + 30 tokens + EOS = 86; 9 text tokens per window -> 9 windows (81 tokens,
    # the partial tail of 5 dropped), of which one is the EOS between the documents.
    assert toks.shape[0] == 9
    assert int(counted.sum()) == int(((toks != 1) & (toks != 2)).sum()) == 80
    with pytest.raises(OptionError, match="seq_len=1 leaves no room"):
        prepare_tokens(model, texts, seq_len=1)
    with pytest.raises(OptionTypeError, match="strings"):
        prepare_tokens(model, [3.0])


@pytest.mark.bridge
def test_early_stop_leaves_model_untouched(tmp_path):
    """Hooking only layer 0 stops the forward pass early; no hook stays registered, outputs unchanged."""
    model = bridge_from_dir(tiny_hf_dir(tmp_path / "tq", arch="llama"))
    toks = _tokens(n=2, pos=10)
    with torch.no_grad():
        before = model(toks)
    r1 = activation_returns(model, toks, heads=[(0, 1)], progress=False)
    r2 = activation_returns(model, toks, heads=[(0, 1)], progress=False)
    with torch.no_grad():
        after = model(toks)
    assert torch.equal(before, after) and r1.heads.equals(r2.heads)
    assert len(model.hook_dict["blocks.0.attn.hook_z"].fwd_hooks) == 0


@pytest.mark.bridge
def test_text_sources_files_and_datasets(tmp_path):
    model = bridge_from_dir(tiny_hf_dir(tmp_path / "tq", arch="llama", n_layers=1))
    text = " ".join(["w4 w5 w6 w7 w8 w9"] * 5)
    f = tmp_path / "doc.txt"
    f.write_text(text, encoding="utf-8")
    ref = prepare_tokens(model, [text], seq_len=8, max_tokens=None)
    got = prepare_tokens(model, [f], seq_len=8, max_tokens=None)
    assert torch.equal(ref[0], got[0]) and torch.equal(ref[1], got[1])
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_dict({"body": [text]})
    got = prepare_tokens(model, ds, seq_len=8, max_tokens=None, text_column="body")
    assert torch.equal(ref[0], got[0])
    with pytest.raises(OptionError, match="no column 'text'"):
        prepare_tokens(model, ds)
    res = activation_returns(model, [f], seq_len=8, progress=False)
    assert res.summary["n_tokens"] == int(ref[1].sum()) == int(res.heads["n_tokens"].iloc[0])


@pytest.mark.bridge
def test_errors(tmp_path):
    model = bridge_from_dir(tiny_hf_dir(tmp_path / "tq", arch="llama", n_layers=1))
    toks = _tokens(n=1, pos=8)
    with pytest.raises(OptionError, match="control must be 'scramble', 'random' or None; got 'shuffle'"):
        activation_returns(model, toks, control="shuffle", progress=False)
    with pytest.raises(OptionError, match="Head 99 of layer 0 does not exist"):
        activation_returns(model, toks, heads=[(0, 99)], progress=False)
    with pytest.raises(OptionError, match="Layer 5 is not an attention layer"):
        activation_returns(model, toks, heads=[(5, 0)], progress=False)
    with pytest.raises(OptionError, match="heads is empty"):  # [] no longer means "every head"
        activation_returns(model, toks, heads=[], progress=False)
    with pytest.raises(UnsupportedModelError, match="TransformerLens"):
        activation_returns(object(), toks, progress=False)
    with pytest.raises(OptionError, match="special token"):
        activation_returns(model, torch.ones(1, 4, dtype=torch.long), progress=False)
    with pytest.raises(OptionError, match="nulls must be >= 1"):
        activation_returns(model, toks, nulls=0, progress=False)


def _rank_one_dir(tmp_path, zero_O: bool = False):
    """Tiny llama checkpoint: kv head 0 reads a rank-1 V (one nonzero column, column form) and query head 0
    writes through a rank-1 O, so T_0 = O_0 V_0ᵀ has rank 1 exactly; head 4 (kv head 1) stays random."""
    import shutil

    import transformers

    src = tiny_hf_dir(tmp_path / "src_r1", arch="llama", n_layers=1)
    model = transformers.LlamaForCausalLM.from_pretrained(src)
    att = model.model.layers[0].self_attn
    dh = model.config.hidden_size // model.config.num_attention_heads
    with torch.no_grad():
        att.v_proj.weight[1:dh] = 0.0  # V_0 = v e_0ᵀ
        att.o_proj.weight[:, 1:dh] = 0.0  # O_0 = o e_0ᵀ
        if zero_O:
            att.o_proj.weight[:, :dh] = 0.0  # T_0 = 0: head 0 writes nothing
    out = tmp_path / ("z0" if zero_O else "r1")
    model.save_pretrained(out)
    for f in src.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens")):
            shutil.copy(f, out / f.name)
    return out


def test_scramble_control_keeps_a_rank_deficient_heads_rank(tmp_path):
    """Findings F1/F4: the control draws within the head's own ranks. A head of rank 1 on both sides can only
    be scrambled to ±T, so its control's cos² equals its own on every token (a full O(d_head) draw would not);
    and a head's control depends on (seed, layer, head) only, not on which other heads were selected."""
    from tl_idempotence.testing import hooked_from_dir

    model = hooked_from_dir(_rank_one_dir(tmp_path))
    toks = _tokens(n=2, pos=12)
    res = activation_returns(model, toks, heads=[(0, 0), (0, 4)], nulls=6, progress=False)
    row = res.heads.set_index("head").loc[0]
    assert np.isfinite(row["cos2_median"])
    assert row["ctrl_cos2_median"] == pytest.approx(row["cos2_median"], rel=1e-9, abs=1e-12)
    assert row["ctrl_cos2_iqr"] == pytest.approx(row["cos2_iqr"], rel=1e-9, abs=1e-12)
    assert not row["cos2_beats_control"]  # equal, not better
    alone = activation_returns(model, toks, heads=[(0, 4)], nulls=6, progress=False).heads.iloc[0]
    other = res.heads.set_index("head").loc[4]
    for col in ("ctrl_a_median", "ctrl_cos2_median", "ctrl_cos2_iqr"):
        assert alone[col] == other[col], col


def test_public_entry_points_refuse_typod_keywords():
    """Every public entry point of analyses/ refuses an unknown keyword naming the close match."""
    from tl_idempotence.errors import UnknownOptionError
    from tl_idempotence.probes.attention import attention_patterns, flagged_heads

    with pytest.raises(UnknownOptionError, match=r"'min_char' \(did you mean 'min_chars'"):
        default_corpus(min_char=10)
    with pytest.raises(OptionTypeError, match="min_chars must be an integer; got bool"):
        default_corpus(min_chars=True)
    with pytest.raises(UnknownOptionError, match=r"'seqlen' \(did you mean 'seq_len'"):
        prepare_tokens(None, torch.ones(1, 3, dtype=torch.long), seqlen=4)
    with pytest.raises(UnknownOptionError, match=r"'topk' \(did you mean 'top_k'"):
        flagged_heads(None, topk=3)
    with pytest.raises(UnknownOptionError, match=r"'max_token' \(did you mean 'max_tokens'"):
        attention_patterns(None, "x", [(0, 0)], max_token=3)
    with pytest.raises(UnknownOptionError, match=r"'null' \(did you mean 'nulls'"):
        activation_returns(None, null=3)


def test_fraction_beating_the_control_is_over_compared_heads(tmp_path):
    """A head whose output is always 0 has no defined cos²: it is in neither count of frac_beats_control."""
    from tl_idempotence.testing import hooked_from_dir

    model = hooked_from_dir(_rank_one_dir(tmp_path, zero_O=True))
    res = activation_returns(model, _tokens(n=2, pos=12), heads=[(0, 0), (0, 4)], nulls=4, progress=False)
    h = res.heads.set_index("head")
    assert np.isnan(h.loc[0, "cos2_median"]) and np.isfinite(h.loc[4, "cos2_median"])
    assert res.summary["n_heads_compared"] == 1
    assert res.summary["frac_beats_control"] == float(h.loc[4, "cos2_beats_control"])


def test_the_corpus_is_recorded_by_name():
    from tl_idempotence.probes.tokens import corpus_name

    assert corpus_name(None) == "default (stdlib docstrings)"
    assert corpus_name(["some text"]) == "list" and corpus_name(torch.zeros(1, 2)) == "Tensor"
