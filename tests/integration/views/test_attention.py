"""Attention views (circuitsvis, offline) of flagged heads, and their rendering in headless Chromium.

The Chromium test needs Debian's ``chromium`` package (``apt-get install -y chromium``)
and Pillow (``pip install pillow``, in the ``test`` extra); it is skipped with that reason
when either is missing.
"""

from __future__ import annotations

import gc
import json
import re
import shutil
import subprocess

import numpy as np
import pandas as pd
import pytest

import tl_idempotence as tli
from helpers import run_chromium
from tl_idempotence.errors import OptionError
from tl_idempotence.probes.attention import AttentionPatterns, FlaggedHeads, attention_patterns, flagged_heads
from tl_idempotence.report.attention import attention_view
from tl_idempotence.testing import bridge_from_dir, tiny_hf_dir
from tl_idempotence.views.attention import MAX_NAME_CHARS, AttentionView
from tl_idempotence.views.text import format_P

# integration tier: circuitsvis pages in headless Chromium
# bridge: TransformerBridge only, must also pass on transformer-lens 4.x
pytestmark = [pytest.mark.bridge, pytest.mark.integration]

TEXT = "w5 w6 w7 w8 w9 w4 w5 w6 w7 w8 w9 w4"


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return tiny_hf_dir(tmp_path_factory.mktemp("att") / "tq", arch="llama")  # 2 layers x 9 heads (3 kv)


@pytest.fixture(scope="module")
def tiny_q(tiny_dir):
    return bridge_from_dir(tiny_dir)


def test_flagged_heads_closed_first_then_top_k():
    df = pd.DataFrame({"layer": [0, 0, 1, 1], "head": [0, 1, 0, 1], "P": [0.95, 0.2, np.nan, 0.91]})
    df["closed"] = df["P"] >= 0.9
    f = flagged_heads(df)
    assert isinstance(f, FlaggedHeads) and f == [(0, 0), (1, 1)]
    assert (f.why, f.n_closed, f.top_k) == ("closed", 2, None) and f.describe() == "all 2 heads"
    f = flagged_heads(df, top_k=1)
    assert f == [(0, 0)] and (f.why, f.n_closed, f.top_k) == ("closed", 2, 1)
    assert f.describe() == "the 1 heads with the highest P of the 2"
    f = flagged_heads(df, threshold=0.99, top_k=2)  # none closed: top-2 by P (the NaN head never)
    assert f == [(0, 0), (1, 1)] and (f.why, f.n_closed) == ("top_k", 0)
    assert f.describe() == "no head with P >= 0.99: the 2 heads with the highest P"
    with pytest.raises(OptionError, match="top_k must be >= 1; got 0"):
        flagged_heads(df, top_k=0)
    with pytest.raises(OptionError, match="columns layer, head, P"):
        flagged_heads(df.drop(columns="P"))


def test_flagged_heads_default_is_every_closed_head_else_top_8():
    P = np.linspace(0.99, 0.01, 20)  # 20 heads, descending P; the first 10 are >= 0.5
    df = pd.DataFrame({"layer": np.repeat([0, 1], 10), "head": np.tile(np.arange(10), 2), "P": P[::-1]})
    df["closed"] = df["P"] >= 0.5
    by_P = list(zip(df.sort_values("P", ascending=False)["layer"], df.sort_values("P", ascending=False)["head"]))
    f = flagged_heads(df)  # default: ALL closed heads (10 > the old cap of 8), highest P first
    assert f == by_P[:10] and f.why == "closed" and f.n_closed == 10 and f.top_k is None
    assert f.describe() == "all 10 heads"
    f = flagged_heads(df, threshold=0.995)  # none closed: the top 8 by P
    assert f == by_P[:8] and f.why == "top_k" and f.n_closed == 0 and f.top_k == 8
    assert f.describe() == "no head with P >= 0.995: the 8 heads with the highest P"
    assert flagged_heads(df, threshold=0.995, top_k=3) == by_P[:3]


def test_patterns_and_offline_html(tiny_q):
    heads = [(1, 3), (0, 0)]
    ap = attention_patterns(tiny_q, TEXT, heads)
    assert isinstance(ap, AttentionPatterns) and ap.heads == heads
    assert ap.tokens[0] == "w1" and len(ap.tokens) == 13  # BOS + 12 words
    assert ap.patterns.shape == (2, 13, 13) and ap.causal
    assert ap.n_text_tokens == 12 and not ap.truncated
    np.testing.assert_allclose(ap.patterns.sum(-1), 1.0, atol=1e-5)
    # max_tokens cuts the text (special tokens included) and says so
    cut = attention_patterns(tiny_q, TEXT, heads, max_tokens=5)
    assert cut.tokens == ["w1", "w5", "w6", "w7", "w8"] and cut.patterns.shape == (2, 5, 5)
    assert cut.truncated and cut.n_text_tokens == 12
    np.testing.assert_allclose(cut.patterns, ap.patterns[:, :5, :5], rtol=1e-5, atol=1e-6)  # causal: a prefix
    view = attention_view(tiny_q, TEXT, heads)
    assert isinstance(view, AttentionView)
    assert "unpkg.com" not in view.html and "CircuitsVis.render" in view.html
    assert re.search(r'<div id="circuits-vis-[^"]+"[^>]*></div>', view.html)  # no self-closing div
    assert view.names == ["L1H3", "L0H0"] and view._repr_html_() == view.html
    assert view.labels == view.names  # no head table: no P or α to add
    assert ap.special_tokens == ["w1"] and (ap.n_special, ap.n_shown_text_tokens) == (1, 12)
    assert view.caption == (
        "Showing 2 chosen heads; all 12 tokens of the text are shown, with 1 special token (w1): 13 positions."
    )
    assert view.caption in view.html
    assert repr(view).startswith("AttentionView(2 heads, 13 positions (12 text tokens + 1 special), causal=True:")
    short = attention_view(tiny_q, TEXT, heads, max_tokens=5)
    assert short.caption == (
        "Showing 2 chosen heads; the text has 12 tokens, the first 4 are shown, with 1 special token (w1): "
        "5 positions (max_tokens=5)."
    )
    assert (cut.n_shown_text_tokens, len(short.tokens)) == (4, 5)
    with pytest.raises(OptionError, match="does not exist"):
        attention_patterns(tiny_q, TEXT, [(0, 42)])
    with pytest.raises(OptionError, match="No heads"):
        attention_patterns(tiny_q, TEXT, [])


def test_encoder_patterns_are_not_causal(tmp_path):
    model = bridge_from_dir(tiny_hf_dir(tmp_path / "tb", arch="bert", n_heads=6, n_kv_heads=6))
    ap = attention_patterns(model, TEXT, [(0, 1)])
    assert not ap.causal and np.abs(np.triu(ap.patterns, 1)).max() > 1e-3


def test_report_show_attention(tiny_q, tiny_dir):
    rep = tli.idempotence_report(tiny_q, progress=False)
    assert rep.summary["n_closed"] == 0  # a random model
    view = rep.show_attention(TEXT, top_k=3)
    top = rep.heads.sort_values("P", ascending=False, kind="stable")
    assert view.heads == list(zip(top["layer"], top["head"]))[:3]  # none closed: top-3 by P
    assert view.names[0] == f"L{top['layer'].iloc[0]}H{top['head'].iloc[0]}"
    assert view.labels[0].startswith(f"{view.names[0]} P=")
    assert view.caption.startswith("Showing no head with P >= 0.9: the 3 heads with the highest P;")
    # default (top_k=None): every closed head, or the top 8 by P when none is closed
    assert rep.show_attention(TEXT).heads == list(zip(top["layer"], top["head"]))[:8]
    # the report holds only a weak reference to its model: read-only, and None once the model is gone
    assert rep.model is tiny_q
    with pytest.raises(AttributeError):
        rep.model = None
    model = bridge_from_dir(tiny_dir)
    rep2 = tli.idempotence_report(model, progress=False)
    assert rep2.model is model
    del model
    gc.collect()
    assert rep2.model is None
    with pytest.raises(OptionError, match="No TransformerLens model to run"):
        rep2.show_attention(TEXT)
    assert rep2.show_attention(TEXT, model=tiny_q, top_k=3).heads == view.heads  # same weights, same heads
    # a model that is not the one the report measured is refused, naming both
    other = bridge_from_dir(tiny_hf_dir(tiny_dir.parent / "other", arch="llama", seed=1))
    with pytest.raises(OptionError, match=r"not the model this report measured .*layer 0's attention weights differ"):
        rep2.show_attention(TEXT, model=other)
    smaller = bridge_from_dir(tiny_hf_dir(tiny_dir.parent / "small", arch="llama", n_layers=1))
    with pytest.raises(OptionError, match=r"not the model this report measured .*: n_layers 2 vs 1"):
        rep2.show_attention(TEXT, model=smaller)
    # a report made from a checkpoint directory never had a TransformerLens model
    rep3 = tli.idempotence_report(tiny_dir, progress=False)
    assert rep3.model is None
    with pytest.raises(OptionError, match="No TransformerLens model to run"):
        rep3.show_attention(TEXT)


def _circuitsvis_props(html: str) -> dict:
    """The props the view passes to circuitsvis's AttentionHeads (the JSON after its name in the render call)."""
    start = html.index("CircuitsVis.AttentionHeads,") + len("CircuitsVis.AttentionHeads,")
    props, _ = json.JSONDecoder().raw_decode(html[start:].lstrip())
    return props


def test_head_names_fit_the_selector_and_the_caption_counts_positions(tiny_q):
    """circuitsvis's head selector clips a name wider than its ~80 px box ("10H8", "lpha=-19.4" of
    "L10H8 P=0.9512 alpha=-19.4"): the view names each head by its label only, and every head's P and α are in
    the legend table; the caption's counts are the text's own tokens, the special tokens and their sum, the
    positions the patterns have."""
    rep = tli.idempotence_report(tiny_q, progress=False)
    view = rep.show_attention(TEXT, top_k=4)
    props = _circuitsvis_props(view.html)
    assert props["attentionHeadNames"] == view.names == [f"L{layer}H{h}" for layer, h in view.heads]
    assert all(len(name) <= MAX_NAME_CHARS for name in view.names)
    assert len(f"L{999}H{999}") == MAX_NAME_CHARS  # the widest a name gets on a model of < 1000 layers and heads
    legend = view.html[view.html.index('<table class="tli-attention-heads"') : view.html.index("</table>")]
    for (layer, h), name, label in zip(view.heads, view.names, view.labels):
        row = rep.heads.loc[name]
        assert (row["layer"], row["head"]) == (layer, h)
        P, alpha = format_P(float(row["P"]), rep.threshold), f"{float(row['alpha']):.3g}"
        assert label == f"{name} P={P} α={alpha}"
        assert re.search(rf">{name}</td><td[^>]*>{re.escape(P)}</td><td[^>]*>{re.escape(alpha)}</td>", legend)
    # the caption's numbers are the view's: 12 text tokens + 1 BOS = 13 positions = the patterns' size
    n_pos = len(props["tokens"])
    assert n_pos == len(view.tokens) == 13 and len(props["attention"][0]) == n_pos
    assert view.n_special == 1 and view.tokens[0] == "w1"
    assert view.caption.endswith(f"all 12 tokens of the text are shown, with 1 special token (w1): {n_pos} positions.")
    assert f"{n_pos} positions (12 text tokens + 1 special)" in repr(view)
    cut = rep.show_attention(TEXT, top_k=4, max_tokens=8)
    assert len(cut.tokens) == 8 and cut.caption.endswith(
        "the text has 12 tokens, the first 7 are shown, with 1 special token (w1): 8 positions (max_tokens=8)."
    )


def _chromium(*args: str, tmp) -> subprocess.CompletedProcess:
    return run_chromium(tmp, "--virtual-time-budget=15000", *args, timeout=180)


@pytest.mark.skipif(
    shutil.which("chromium") is None and shutil.which("chromium-browser") is None,
    reason="headless Chromium is not installed (CI: apt-get install -y chromium)",
)
def test_report_with_attention_renders_offline_in_chromium(tiny_q, tmp_path):
    Image = pytest.importorskip("PIL.Image", reason="Pillow is needed to read the screenshot (pip install pillow)")
    rep = tli.idempotence_report(tiny_q, progress=False)
    page = rep.save_html(str(tmp_path / "report.html"), attention_text=TEXT, top_k=3)
    html = open(page, encoding="utf-8").read()
    assert "unpkg.com" not in html and "Attention patterns of the flagged heads" in html
    # 1. The full report: after its scripts ran, the circuitsvis div holds the rendered React view
    #    (head labels as <h4> elements, canvases), not just the inline script.
    dom = _chromium("--dump-dom", f"file://{page}", tmp=tmp_path / "profile1").stdout
    names = rep.show_attention(TEXT, top_k=3).names
    for name in names:
        assert re.search(rf"<h4[^>]*>{re.escape(name)}</h4>", dom), f"attention view for {name} did not render"
    assert "Head Selector" in dom and "<canvas" in dom
    # 2. A screenshot of the view: pixels are not uniform (a blank/unrendered view is all white).
    view_page = rep.show_attention(TEXT, top_k=3).save(str(tmp_path / "view.html"))
    shot = tmp_path / "view.png"
    _chromium("--window-size=1000,800", f"--screenshot={shot}", f"file://{view_page}", tmp=tmp_path / "profile2")
    img = np.asarray(Image.open(shot).convert("RGB"), dtype=float)
    assert img.shape[0] > 100 and img.std() > 10.0
    assert len(np.unique(img.reshape(-1, 3), axis=0)) > 20
