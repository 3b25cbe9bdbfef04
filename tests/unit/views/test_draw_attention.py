"""The attention view only draws: :func:`tl_idempotence.views.attention.draw_attention` takes patterns
already computed — here built by hand, exact values, no model — and draws exactly them."""

from __future__ import annotations

import json
import re

import numpy as np
import pandas as pd
import pytest

from tl_idempotence.probes.attention import AttentionPatterns
from tl_idempotence.views.attention import AttentionView, attention_section, draw_attention

pytestmark = pytest.mark.bridge  # no TransformerLens model


def _patterns(truncated: bool) -> AttentionPatterns:
    p = np.array(
        [
            [[1, 0, 0], [0.5, 0.5, 0], [0.125, 0.375, 0.5]],
            [[1, 0, 0], [0.25, 0.75, 0], [0.0625, 0.4375, 0.5]],
        ],
        dtype=np.float32,
    )
    return AttentionPatterns(
        heads=[(1, 2), (0, 0)],
        tokens=["<s>", "a", "b"],
        patterns=p,
        causal=True,
        n_text_tokens=5 if truncated else 2,
        truncated=truncated,
        special_tokens=["<s>"],
    )


def _drawn(view: AttentionView) -> dict:
    """The props the page hands to circuitsvis (``CircuitsVis.render(id, AttentionHeads, {...})``)."""
    m = re.search(r"CircuitsVis\.AttentionHeads,\s*(\{.*?\})\s*\)", view.html, re.S)
    assert m, "no circuitsvis call in the view"
    return json.loads(m.group(1))


def test_the_view_draws_exactly_the_patterns_it_is_given():
    pats = _patterns(truncated=True)
    table = pd.DataFrame({"layer": [0, 1], "head": [0, 2], "P": [0.8999999, 0.95], "alpha": [1.0, -2.5]})
    view = draw_attention(pats, why="the 2 heads with the highest P", max_tokens=3, head_table=table, threshold=0.9)
    props = _drawn(view)
    assert props["attention"] == pats.patterns.tolist() and props["tokens"] == ["<s>", "a", "b"]
    assert props["attentionHeadNames"] == ["L1H2", "L0H0"] and props["maskUpperTri"] is True
    assert view.heads == [(1, 2), (0, 0)] and view.n_special == 1 and view.causal
    assert view.caption == (
        "Showing the 2 heads with the highest P; the text has 5 tokens, the first 2 are shown, with 1 special token "
        "(<s>): 3 positions (max_tokens=3)."
    )
    assert view.labels == ["L1H2 P=0.9500 α=-2.5", "L0H0 P=0.8999999 α=1"]  # never rounded up across 0.9
    assert '<div id="circuits-vis-' in view.html and "/>" not in view.html.split('<div class="tli-attention">')[1][:200]


def test_without_a_head_table_the_view_has_no_legend_and_names_only():
    view = draw_attention(_patterns(truncated=False), why="2 chosen heads", max_tokens=64)
    assert view.labels == ["L1H2", "L0H0"] and "tli-attention-heads" not in view.html
    assert (
        view.caption
        == "Showing 2 chosen heads; all 2 tokens of the text are shown, with 1 special token (<s>): 3 positions."
    )
    section = attention_section(view, "a b " * 60)
    assert section.startswith("<h2>Attention patterns of the flagged heads</h2>") and "…</q>" in section
    assert section.endswith(view.html)
