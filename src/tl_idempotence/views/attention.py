"""Attention views of flagged heads with circuitsvis, offline: drawn from the probe's result, never run here.

This module draws only: :func:`draw_attention` takes attention patterns already computed
(:class:`AttentionPatterns`, which :func:`tl_idempotence.probes.attention.attention_patterns` computes);
:mod:`tl_idempotence.report.attention` runs the probe, checks a model against a report and calls it
(``tli.attention_view``, ``rep.show_attention``, the attention section of ``rep.save_html``).

Offline rendering: circuitsvis's ``RenderedHTML`` has two sources; ``str()`` and
``show_code()`` give the CDN version (an ES module import from unpkg.com, blank without
network) and ``_repr_html_`` probes the network first. This module always uses
``RenderedHTML.local_src`` (``circuitsvis.utils.render.render_local``: the package's
``dist/cdn/iife.js`` bundle, ~1.3 MB, inlined in a ``<script>``), so a saved report renders
with no network. One view (all flagged heads, selectable) inlines the bundle once.

Every view says what it shows: which heads and why (all closed heads, or the top heads by
P when none is closed), and whether the text was cut, counting the text's own tokens and the
special tokens around it (BOS) separately: "all 16 tokens of the text are shown, with 1 special
token (<|im_start|>): 17 positions". P labels never round across the threshold
(:func:`tl_idempotence.views.text.format_P`).

Head labels: circuitsvis's head selector draws each name in a box about 80 px wide (a twelfth of
its container) and clips what does not fit, so the view names a head by its label only
(``L10H8``); its P and α are in a legend table above the view (:attr:`AttentionView.labels`),
each head in the colour circuitsvis gives it.
"""

from __future__ import annotations

import html as _html
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from ..core.outputs import Output, write_output
from .text import format_P

if TYPE_CHECKING:  # pragma: no cover
    from ..core.hints import PathLike

__all__ = ["MAX_NAME_CHARS", "AttentionPatterns", "AttentionView", "attention_section", "draw_attention"]


@dataclass(repr=False)
class AttentionView:
    """A rendered circuitsvis ``AttentionHeads`` view with the JS bundle inlined (offline).

    Attributes:
        html: the HTML fragment (caption, legend, ``<div>`` and inline ``<script>``); renders with no network.
        heads: the ``(layer, head)`` pairs shown, in order.
        names: the name of each head in circuitsvis's head selector: its TransformerLens label (``L10H8``),
            short enough for the selector's boxes (at most :data:`MAX_NAME_CHARS` characters).
        tokens: the token strings, one per position (special tokens included).
        causal: whether the upper triangle was masked.
        caption: what is shown (which heads and why, how many of the text's tokens and special tokens).
        labels: each head's full label for the legend (``L10H8 P=0.9512 α=-19.4``; just the name without a
            head table).
        n_special: how many of the positions are special tokens (BOS, ...), not the text's.
    """

    html: str
    heads: list[tuple[int, int]]
    names: list[str]
    tokens: list[str]
    causal: bool
    caption: str = ""
    labels: list[str] = field(default_factory=list)
    n_special: int = 0

    def __repr__(self) -> str:
        n_text = len(self.tokens) - self.n_special
        return (
            f"AttentionView({len(self.heads)} heads, {len(self.tokens)} positions ({n_text} text tokens + "
            f"{self.n_special} special), causal={self.causal}: {self.caption!r})"
        )

    def _repr_html_(self) -> str:  # notebooks: always the inlined local bundle
        return self.html

    def __str__(self) -> str:
        return self.html

    def save(self, path: PathLike) -> str:
        """Write a standalone page with just this view; returns the path.

        Raises:
            OptionError: ``path`` is empty or a folder, its folder does not exist, or it cannot be written.
            OptionTypeError: ``path`` is not a path.
        """
        page = (
            '<!DOCTYPE html><html><head><meta charset="utf-8"><title>Attention</title></head><body>'
            f"{self.html}</body></html>"
        )
        return str(write_output(Output("attention", page=lambda: page), path, ("html",)))


#: The longest head name the view gives circuitsvis (``L999H999``): its head selector clips longer ones.
MAX_NAME_CHARS = 8


def _head_values(
    heads: list[tuple[int, int]], table: pd.DataFrame | None, threshold: float | None
) -> list[tuple[str, str | None, str | None]]:
    """``(name, P text, α text)`` per head; P and α are None without a head table (or a row for the head)."""
    out: list[tuple[str, str | None, str | None]] = []
    for layer, h in heads:
        name, P, alpha = f"L{layer}H{h}", None, None
        if table is not None:
            row = table[(table["layer"] == layer) & (table["head"] == h)]
            if len(row):
                r = row.iloc[0]
                P, alpha = format_P(float(r["P"]), threshold), f"{float(r['alpha']):.3g}"
        out.append((name, P, alpha))
    return out


def _head_color(idx: int, n: int) -> str:
    """The colour circuitsvis gives head ``idx`` of ``n`` (``attentionHeadColor`` in its AttentionHeads.tsx)."""
    return f"hsl({round(idx / n * 360)}, 70%, 50%)"


def _legend_html(values: list[tuple[str, str | None, str | None]]) -> str:
    """The heads' P and α in a small table above the view, each name in its head's colour."""
    if all(P is None for _, P, _ in values):
        return ""
    rows = "".join(
        f'<tr><td style="background:{_head_color(i, len(values))};color:white;padding:1px 6px;font-weight:bold">'
        f"{_html.escape(name)}</td><td style='padding:1px 6px'>{_html.escape(P or '')}</td>"
        f"<td style='padding:1px 6px'>{_html.escape(alpha or '')}</td></tr>"
        for i, (name, P, alpha) in enumerate(values)
    )
    return (
        '<table class="tli-attention-heads" style="border-collapse:collapse;font-size:0.9em;margin:4px 0">'
        "<tr><th style='padding:1px 6px'>head</th><th style='padding:1px 6px'>P</th>"
        f"<th style='padding:1px 6px'>α</th></tr>{rows}</table>"
    )


def _count(n: int, what: str) -> str:
    return f"{n} {what}" + ("" if n == 1 else "s")


def _positions_text(pats: AttentionPatterns, max_tokens: int) -> str:
    """How many of the text's tokens are shown and how many special tokens are added, e.g. "all 16 tokens of
    the text are shown, with 1 special token (<|im_start|>): 17 positions"."""
    sp = pats.n_special
    special = f"with {_count(sp, 'special token')} ({', '.join(pats.special_tokens)})" if sp else "no special tokens"
    if pats.truncated:
        shown = (
            f"the text has {pats.n_text_tokens} tokens, the first {pats.n_shown_text_tokens} are shown, {special}: "
            f"{len(pats.tokens)} positions (max_tokens={max_tokens})"
        )
    else:
        shown = f"all {_count(pats.n_text_tokens, 'token')} of the text are shown, {special}"
        shown += f": {len(pats.tokens)} positions"
    return shown


@dataclass
class AttentionPatterns:
    """Attention patterns of some heads on one text (:func:`tl_idempotence.probes.attention.attention_patterns`
    computes them; :func:`draw_attention` draws them).

    Positions: ``len(tokens) == n_special + n_shown_text_tokens`` (the model's special tokens around the text,
    e.g. SmolLM2's BOS ``<|im_start|>``, and the text's own tokens that were kept).

    Attributes:
        heads: the ``(layer, head)`` pairs, in order.
        tokens: the token strings (with the model's special tokens): one per position.
        patterns: ``[n_heads_sel, query, key]`` float32, rows sum to 1 (query and key: ``len(tokens)`` positions).
        causal: every pattern is zero above the diagonal.
        n_text_tokens: tokens the whole text has (without special tokens).
        truncated: the text was cut to ``max_tokens`` (``n_text_tokens`` says how long it was).
        special_tokens: the special tokens put around the text (their strings, in order), e.g. ``["<|im_start|>"]``.
    """

    heads: list[tuple[int, int]]
    tokens: list[str]
    patterns: np.ndarray
    causal: bool
    n_text_tokens: int
    truncated: bool
    special_tokens: list[str] = field(default_factory=list)

    @property
    def n_special(self) -> int:
        """How many of the positions are special tokens (not the text's)."""
        return len(self.special_tokens)

    @property
    def n_shown_text_tokens(self) -> int:
        """How many of the text's own tokens are shown (``len(tokens) - n_special``)."""
        return len(self.tokens) - self.n_special


def draw_attention(
    pats: AttentionPatterns,
    *,
    why: str,
    max_tokens: int,
    head_table: pd.DataFrame | None = None,
    threshold: float | None = None,
) -> AttentionView:
    """Draw attention patterns already computed (the probe's result) with circuitsvis, offline. Runs nothing.

    Args:
        pats: the patterns ``[n_heads_sel, query, key]`` of ``pats.heads`` on ``pats.tokens``
            (:func:`tl_idempotence.probes.attention.attention_patterns`).
        why: what these heads are, for the caption (e.g. ``"all 13 heads with P >= 0.9"``).
        max_tokens: the cut the patterns were computed with (the caption names it when the text was cut).
        head_table: optional per-head table (``layer, head, P, alpha``) for the legend.
        threshold: the P threshold (labels never round across it).

    Returns:
        :class:`AttentionView` (``_repr_html_`` for notebooks; ``.html`` for pages). Its caption counts the
        text's own tokens and the special tokens separately, and their sum, the positions drawn.
    """
    from circuitsvis.attention import attention_heads

    values = _head_values(pats.heads, head_table, threshold)
    names = [name for name, _, _ in values]
    labels = [name + ("" if P is None else f" P={P} α={alpha}") for name, P, alpha in values]
    rendered = attention_heads(
        attention=pats.patterns, tokens=pats.tokens, attention_head_names=names, mask_upper_tri=pats.causal
    )
    src = rendered.local_src  # never the CDN source (blank offline), never _repr_html_ (network probe)
    # circuitsvis writes a self-closing <div .../>, which HTML parses as an open div; close it explicitly.
    src = re.sub(r'(<div id="circuits-vis-[^"]+"[^>]*?)\s*/>', r"\1></div>", src, count=1)
    caption = f"Showing {why}; {_positions_text(pats, int(max_tokens))}."
    body = (
        f'<p class="tli-caption">{_html.escape(caption)}</p>{_legend_html(values)}'
        f'<div class="tli-attention">{src}</div>'
    )
    return AttentionView(
        html=body,
        heads=list(pats.heads),
        names=names,
        tokens=pats.tokens,
        causal=pats.causal,
        caption=caption,
        labels=labels,
        n_special=pats.n_special,
    )


def attention_section(view: AttentionView, text: str) -> str:
    """An HTML section of the report page (heading, the text, the view's caption and circuitsvis view)."""
    intro = (
        "<h2>Attention patterns of the flagged heads</h2>"
        "<p>Patterns (query rows, key columns) from <code>hook_pattern</code>; click a head to enlarge. "
        f"Text: <q>{_html.escape(text[:200])}{'…' if len(text) > 200 else ''}</q></p>"
    )
    return intro + view.html
