"""Attention views (circuitsvis, offline) of flagged heads, and their rendering in headless Chromium.

The Chromium test needs Debian's ``chromium`` package (``apt-get install -y chromium``)
and Pillow (``pip install pillow``, in the ``test`` extra); it is skipped with that reason
when either is missing.
"""

from __future__ import annotations

import re
import shutil
import subprocess

import numpy as np
import pandas as pd
import pytest

import tl_idempotence as tli
from tl_idempotence.attention import attention_patterns, attention_view, flagged_heads
from tl_idempotence.testing import bridge_from_dir, tiny_hf_dir

pytestmark = pytest.mark.bridge  # TransformerBridge only: must also pass on transformer-lens 4.x

TEXT = "w5 w6 w7 w8 w9 w4 w5 w6 w7 w8 w9 w4"


@pytest.fixture(scope="module")
def tiny_q(tmp_path_factory):
    return bridge_from_dir(tiny_hf_dir(tmp_path_factory.mktemp("att") / "tq", arch="llama"))


def test_flagged_heads_closed_first_then_top_k():
    df = pd.DataFrame({"layer": [0, 0, 1, 1], "head": [0, 1, 0, 1], "P": [0.95, 0.2, np.nan, 0.91]})
    df["closed"] = df["P"] >= 0.9
    assert flagged_heads(df) == [(0, 0), (1, 1)]
    assert flagged_heads(df, top_k=1) == [(0, 0)]
    assert flagged_heads(df, threshold=0.99, top_k=2) == [(0, 0), (1, 1)]  # none closed: top-2 by P
    with pytest.raises(ValueError, match="top_k"):
        flagged_heads(df, top_k=0)


def test_patterns_and_offline_html(tiny_q):
    heads = [(1, 3), (0, 0)]
    toks, pats, causal = attention_patterns(tiny_q, TEXT, heads)
    assert toks[0] == "w1" and len(toks) == 13  # BOS + 12 words
    assert pats.shape == (2, 13, 13) and causal
    np.testing.assert_allclose(pats.sum(-1), 1.0, atol=1e-5)
    view = attention_view(tiny_q, TEXT, heads)
    assert "unpkg.com" not in view.html and "CircuitsVis.render" in view.html
    assert re.search(r'<div id="circuits-vis-[^"]+"[^>]*></div>', view.html)  # no self-closing div
    assert view.names == ["L1H3", "L0H0"] and view._repr_html_() == view.html
    with pytest.raises(ValueError, match="does not exist"):
        attention_patterns(tiny_q, TEXT, [(0, 42)])


def test_encoder_patterns_are_not_causal(tmp_path):
    model = bridge_from_dir(tiny_hf_dir(tmp_path / "tb", arch="bert", n_heads=6, n_kv_heads=6))
    _, pats, causal = attention_patterns(model, TEXT, [(0, 1)])
    assert not causal and np.abs(np.triu(pats, 1)).max() > 1e-3


def test_report_show_attention(tiny_q):
    rep = tli.idempotence_report(tiny_q, progress=False)
    view = rep.show_attention(TEXT, top_k=3)
    top = rep.heads.sort_values("P", ascending=False).head(3)
    assert view.heads == list(zip(top["layer"], top["head"]))  # none closed in a random model: top-3 by P
    assert view.names[0].startswith(f"L{top['layer'].iloc[0]}H{top['head'].iloc[0]} P=")
    rep.model = None
    with pytest.raises(ValueError, match="no TransformerLens model"):
        rep.show_attention(TEXT)


def _chromium(*args: str, tmp) -> subprocess.CompletedProcess:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    cmd = [
        exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        f"--user-data-dir={tmp}", "--virtual-time-budget=15000", *args,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=180)


@pytest.mark.skipif(
    shutil.which("chromium") is None and shutil.which("chromium-browser") is None,
    reason="headless Chromium is not installed (CI: apt-get install -y chromium)",
)
def test_report_with_attention_renders_offline_in_chromium(tiny_q, tmp_path):
    Image = pytest.importorskip("PIL.Image", reason="Pillow is needed to read the screenshot (pip install pillow)")
    rep = tli.idempotence_report(tiny_q, progress=False)
    page = rep.save_html(str(tmp_path / "report.html"), attention_text=TEXT, top_k=3)
    html = open(page, encoding="utf-8").read()
    assert "unpkg.com" not in html and "Attention patterns of flagged heads" in html
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
