"""Attention views of flagged heads with circuitsvis, offline.

Offline rendering: circuitsvis's ``RenderedHTML`` has two sources; ``str()`` and
``show_code()`` give the CDN version (an ES module import from unpkg.com, blank without
network) and ``_repr_html_`` probes the network first. This module always uses
``RenderedHTML.local_src`` (``circuitsvis.utils.render.render_local``: the package's
``dist/cdn/iife.js`` bundle, ~1.3 MB, inlined in a ``<script>``), so a saved report renders
with no network. One view (all flagged heads, selectable) inlines the bundle once.

Every view says what it shows: which heads and why (all closed heads, or the top heads by
P when none is closed), and whether the text was cut. P labels never round across the
threshold (:func:`tl_idempotence.views.text.format_P`).
"""

from __future__ import annotations

import html as _html
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from ..analyses.attention import FlaggedHeads, attention_patterns, flagged_heads
from ..errors import OptionError
from .text import format_P

__all__ = ["AttentionView", "attention_section_html", "attention_view", "report_attention_view"]


@dataclass(repr=False)
class AttentionView:
    """A rendered circuitsvis ``AttentionHeads`` view with the JS bundle inlined (offline).

    Attributes:
        html: the HTML fragment (caption, ``<div>`` and inline ``<script>``); renders with no network.
        heads: the ``(layer, head)`` pairs shown, in order.
        names: the label of each head in the view.
        tokens: the token strings.
        causal: whether the upper triangle was masked.
        caption: what is shown (which heads and why, and whether the text was cut).
    """

    html: str
    heads: list[tuple[int, int]]
    names: list[str]
    tokens: list[str]
    causal: bool
    caption: str = ""

    def __repr__(self) -> str:
        return (
            f"AttentionView({len(self.heads)} heads, {len(self.tokens)} tokens, causal={self.causal}: {self.caption!r})"
        )

    def _repr_html_(self) -> str:  # notebooks: always the inlined local bundle
        return self.html

    def __str__(self) -> str:
        return self.html

    def save(self, path: str | Path) -> str:
        """Write a standalone page with just this view; returns the path."""
        page = (
            '<!DOCTYPE html><html><head><meta charset="utf-8"><title>Attention</title></head><body>'
            f"{self.html}</body></html>"
        )
        Path(path).write_text(page, encoding="utf-8")
        return str(path)


def _head_names(heads: list[tuple[int, int]], table: pd.DataFrame | None, threshold: float | None) -> list[str]:
    names = []
    for layer, h in heads:
        label = f"L{layer}H{h}"
        if table is not None:
            row = table[(table["layer"] == layer) & (table["head"] == h)]
            if len(row):
                r = row.iloc[0]
                label += f" P={format_P(float(r['P']), threshold)} alpha={float(r['alpha']):.3g}"
        names.append(label)
    return names


def attention_view(
    model: Any,
    text: str,
    heads: list[tuple[int, int]],
    *,
    max_tokens: int = 64,
    head_table: pd.DataFrame | None = None,
    threshold: float | None = None,
    why: str | None = None,
) -> AttentionView:
    """Render the attention patterns of ``heads`` on ``text`` with circuitsvis, offline.

    Args:
        model: a TransformerLens model with a tokenizer.
        text: the text to run.
        heads: ``(layer, head)`` pairs (e.g. from :func:`~tl_idempotence.analyses.attention.flagged_heads`).
        max_tokens: cut the text to this many tokens (including special tokens); the caption says so.
        head_table: optional per-head table (``layer, head, P, alpha``) for the labels.
        threshold: the P threshold (labels never round across it).
        why: what these heads are, for the caption (default: a FlaggedHeads' own description).

    Returns:
        :class:`AttentionView` (``_repr_html_`` for notebooks; ``.html`` for pages).

    Raises:
        UnsupportedModelError / OptionError: see :func:`~tl_idempotence.analyses.attention.attention_patterns`.
    """
    from circuitsvis.attention import attention_heads

    pats = attention_patterns(model, text, list(heads), max_tokens=max_tokens)
    names = _head_names(pats.heads, head_table, threshold)
    rendered = attention_heads(
        attention=pats.patterns, tokens=pats.tokens, attention_head_names=names, mask_upper_tri=pats.causal
    )
    src = rendered.local_src  # never the CDN source (blank offline), never _repr_html_ (network probe)
    # circuitsvis writes a self-closing <div .../>, which HTML parses as an open div; close it explicitly.
    src = re.sub(r'(<div id="circuits-vis-[^"]+"[^>]*?)\s*/>', r"\1></div>", src, count=1)
    what = why or (heads.describe() if isinstance(heads, FlaggedHeads) else f"{len(pats.heads)} chosen heads")
    cut = (
        f"; the text has {pats.n_text_tokens} tokens, the first {len(pats.tokens)} (with special tokens) are shown"
        if pats.truncated
        else f"; all {pats.n_text_tokens} tokens of the text are shown"
    )
    caption = f"Showing {what}{cut}."
    body = f'<p class="tli-caption">{_html.escape(caption)}</p><div class="tli-attention">{src}</div>'
    return AttentionView(
        html=body, heads=pats.heads, names=names, tokens=pats.tokens, causal=pats.causal, caption=caption
    )


def report_attention_view(
    rep: Any, text: str, model: Any = None, heads: Any = None, top_k: int | None = None, max_tokens: int = 64
) -> AttentionView:
    """The attention view of a report's flagged heads (every closed head, else the top 8 by P).

    Raises:
        OptionError: no TransformerLens model (pass ``model=``; a report keeps only a weak reference).
    """
    m = model if model is not None else rep.model
    if m is None:
        raise OptionError(
            "No TransformerLens model to run: this report was made from a checkpoint file or a transformers model, "
            "or the model object is gone. Pass it: rep.show_attention(text, model=model)."
        )
    chosen = flagged_heads(rep, top_k=top_k) if heads is None else [tuple(h) for h in heads]
    return attention_view(m, text, chosen, max_tokens=max_tokens, head_table=rep.heads, threshold=rep.threshold)


def attention_section_html(
    rep: Any, text: str, model: Any = None, heads: Any = None, top_k: int | None = None, max_tokens: int = 64
) -> str:
    """An HTML section (heading, caption, circuitsvis view) of the report page."""
    view = report_attention_view(rep, text, model=model, heads=heads, top_k=top_k, max_tokens=max_tokens)
    intro = (
        "<h2>Attention patterns of the flagged heads</h2>"
        "<p>Patterns (query rows, key columns) from <code>hook_pattern</code>; click a head to enlarge. "
        f"Text: <q>{_html.escape(text[:200])}{'…' if len(text) > 200 else ''}</q></p>"
    )
    return intro + view.html
