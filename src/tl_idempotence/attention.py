"""Attention views of flagged heads with circuitsvis, offline.

The evidence a researcher wants next to the numbers: where do the closed heads
(or the top-k heads by P) attend on a chosen text. Patterns come from TransformerLens
hooks ``blocks.{l}.attn.hook_pattern`` (``[batch, n_heads, query, key]`` on
HookedTransformer, HookedEncoder and TransformerBridge) and are drawn with
``circuitsvis.attention.attention_heads``.

Offline rendering: circuitsvis's ``RenderedHTML`` has two sources; ``str()`` and
``show_code()`` give the CDN version (an ES module import from unpkg.com, blank
without network) and ``_repr_html_`` probes the network first. This module always
uses ``RenderedHTML.local_src`` (``circuitsvis.utils.render.render_local``: the
package's ``dist/cdn/iife.js`` bundle, ~1.3 MB, inlined in a ``<script>``), so a
saved report renders with no network. One view (all flagged heads, selectable)
inlines the bundle once.
"""

from __future__ import annotations

import html as _html
import re
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch

from .activations import _tokenizer, _wrapping
from .heads import _attn_layers, _is_tl_model

__all__ = ["AttentionView", "attention_patterns", "attention_section_html", "attention_view", "flagged_heads"]


def flagged_heads(heads: Any, top_k: int = 8, threshold: float | None = None) -> list[tuple[int, int]]:
    """Heads worth looking at: the closed ones (P >= threshold), else the top-k by P.

    Args:
        heads: an :class:`~tl_idempotence.report.IdempotenceReport` or its ``heads``
            DataFrame (columns ``layer, head, P`` and ``closed`` unless ``threshold`` is given).
        top_k: at most this many heads, highest P first (>= 1).
        threshold: P threshold for "closed" (default: the report's, or the ``closed`` column).

    Returns:
        ``[(layer, head), ...]`` sorted by P descending: the closed heads (at most
        ``top_k``), or, when no head is closed, the ``top_k`` heads by P.

    Raises:
        ValueError: ``top_k < 1`` or missing columns.
    """
    if top_k < 1:
        raise ValueError(f"top_k must be >= 1; got {top_k}.")
    if hasattr(heads, "heads") and isinstance(heads.heads, pd.DataFrame):
        threshold = heads.threshold if threshold is None else threshold
        heads = heads.heads
    if not {"layer", "head", "P"} <= set(heads.columns):
        raise ValueError(f"Need columns layer, head, P; got {list(heads.columns)}.")
    df = heads[np.isfinite(heads["P"].to_numpy(dtype=float))].sort_values("P", ascending=False, kind="stable")
    closed = df["P"] >= threshold if threshold is not None else df.get("closed", pd.Series(False, index=df.index)).astype(bool)
    pick = df[closed] if closed.any() else df
    return [(int(l), int(h)) for l, h in zip(pick["layer"].head(top_k), pick["head"].head(top_k))]


def _tokens_for(model: Any, text: str, max_tokens: int) -> tuple[torch.Tensor, list[str]]:
    tok = _tokenizer(model)
    prefix, suffix = _wrapping(model, tok)
    body = max_tokens - len(prefix) - len(suffix)
    if body < 1:
        raise ValueError(f"max_tokens={max_tokens} leaves no room for text between the special tokens.")
    ids = list(tok(text, add_special_tokens=False)["input_ids"])[:body]
    if not ids:
        raise ValueError("The text tokenized to nothing; pass a non-empty text.")
    ids = prefix + ids + suffix
    strs = [tok.decode([i]) for i in ids]
    return torch.tensor([ids], dtype=torch.long), strs


def attention_patterns(
    model: Any, text: str, heads: list[tuple[int, int]], max_tokens: int = 48
) -> tuple[list[str], np.ndarray, bool]:
    """Attention patterns of ``heads`` on ``text`` via ``blocks.{l}.attn.hook_pattern``.

    Args:
        model: a TransformerLens model with a tokenizer.
        text: the text (tokenized like :func:`~tl_idempotence.activations.prepare_tokens`:
            the model's special tokens around it, e.g. SmolLM2's ``<|im_start|>`` BOS).
        heads: ``(layer, head)`` pairs.
        max_tokens: truncate to this many tokens (circuitsvis draws q x k squares).

    Returns:
        ``(tokens, patterns [n_heads_sel, q, k] float32, causal)``; ``causal`` is True when
        every pattern is zero above the diagonal (then circuitsvis masks that triangle).

    Raises:
        TypeError: not a TransformerLens model. ValueError: unknown layer/head, empty text.
    """
    if not _is_tl_model(model):
        raise TypeError(f"Attention views need a TransformerLens model to run; got {type(model).__name__}.")
    if not heads:
        raise ValueError("No heads to show.")
    layers_ok = _attn_layers(model)
    n = int(model.cfg.n_heads)
    for l, h in heads:
        if l not in layers_ok or not 0 <= h < n:
            raise ValueError(f"Head ({l}, {h}) does not exist (attention layers {layers_ok}, n_heads {n}).")
    toks, strs = _tokens_for(model, text, max_tokens)
    need = sorted({l for l, _ in heads})
    got: dict[int, torch.Tensor] = {}

    def make(l: int):
        def hook(p: torch.Tensor, hook: Any = None) -> None:
            got[l] = p.detach()[0].float().cpu()

        return hook

    device = getattr(model.cfg, "device", None) or "cpu"
    with torch.no_grad():
        model.run_with_hooks(toks.to(device), fwd_hooks=[(f"blocks.{l}.attn.hook_pattern", make(l)) for l in need], return_type=None)
    pats = torch.stack([got[l][h] for l, h in heads]).numpy()
    causal = bool(np.abs(np.triu(pats, k=1)).max() < 1e-6) if pats.shape[-1] > 1 else True
    return strs, pats, causal


@dataclass
class AttentionView:
    """A rendered circuitsvis ``AttentionHeads`` view with the JS bundle inlined (offline).

    Attributes:
        html: the HTML fragment (``<div>`` + inline ``<script>``); renders with no network.
        heads: the ``(layer, head)`` pairs shown, in order.
        names: the label of each head in the view.
        tokens: the token strings.
        causal: whether the upper triangle was masked.
    """

    html: str
    heads: list[tuple[int, int]]
    names: list[str]
    tokens: list[str]
    causal: bool

    def _repr_html_(self) -> str:  # notebooks: always the inlined local bundle
        return self.html

    def __str__(self) -> str:
        return self.html

    def save(self, path: str) -> str:
        """Write a standalone page with just this view; returns the path."""
        page = f'<!DOCTYPE html><html><head><meta charset="utf-8"><title>Attention</title></head><body>{self.html}</body></html>'
        with open(path, "w", encoding="utf-8") as f:
            f.write(page)
        return str(path)


def _head_names(heads: list[tuple[int, int]], table: pd.DataFrame | None) -> list[str]:
    names = []
    for l, h in heads:
        label = f"L{l}H{h}"
        if table is not None:
            row = table[(table["layer"] == l) & (table["head"] == h)]
            if len(row):
                r = row.iloc[0]
                label += f" P={float(r['P']):.3f} alpha={float(r['alpha']):.3g}"
        names.append(label)
    return names


def attention_view(
    model: Any,
    text: str,
    heads: list[tuple[int, int]],
    *,
    max_tokens: int = 48,
    head_table: pd.DataFrame | None = None,
) -> AttentionView:
    """Render the attention patterns of ``heads`` on ``text`` with circuitsvis, offline.

    Args:
        model: a TransformerLens model with a tokenizer.
        text: the text to run.
        heads: ``(layer, head)`` pairs (e.g. from :func:`flagged_heads`).
        max_tokens: truncate the text to this many tokens (including special tokens).
        head_table: optional per-head table (``layer, head, P, alpha``) for the labels.

    Returns:
        :class:`AttentionView` (``_repr_html_`` for notebooks; ``.html`` for pages).

    Raises:
        TypeError / ValueError: see :func:`attention_patterns`.
    """
    from circuitsvis.attention import attention_heads

    strs, pats, causal = attention_patterns(model, text, heads, max_tokens=max_tokens)
    names = _head_names(heads, head_table)
    rendered = attention_heads(attention=pats, tokens=strs, attention_head_names=names, mask_upper_tri=causal)
    src = rendered.local_src  # never the CDN source (blank offline), never _repr_html_ (network probe)
    # circuitsvis writes a self-closing <div .../>, which HTML parses as an open div; close it explicitly.
    src = re.sub(r'(<div id="circuits-vis-[^"]+"[^>]*?)\s*/>', r"\1></div>", src, count=1)
    return AttentionView(html=f'<div class="tli-attention">{src}</div>', heads=list(heads), names=names, tokens=strs, causal=causal)


def attention_section_html(rep: Any, text: str, heads: list[tuple[int, int]] | None = None, top_k: int = 8, max_tokens: int = 48) -> str:
    """An HTML section (heading, explanation, circuitsvis view) for the report page.

    Args:
        rep: an :class:`~tl_idempotence.report.IdempotenceReport` made from a
            TransformerLens model (``rep.model`` is set).
        text: the text to run.
        heads: ``(layer, head)`` pairs (default: :func:`flagged_heads` of ``rep``).
        top_k: how many heads by default.
        max_tokens: truncation of ``text``.

    Raises:
        ValueError: the report has no model (made from a checkpoint file): load the
            model with ``tl_idempotence.models.load`` or TransformerLens and pass it.
    """
    if getattr(rep, "model", None) is None:
        raise ValueError(
            "This report has no TransformerLens model attached (it was made from a checkpoint file or a "
            "transformers model), so attention patterns cannot be computed. Make the report from a TL model "
            "(e.g. tl_idempotence.models.load(...)) or call attention_view(model, text, heads) directly."
        )
    heads = list(heads) if heads is not None else flagged_heads(rep, top_k=top_k)
    view = attention_view(rep.model, text, heads, max_tokens=max_tokens, head_table=rep.heads)
    intro = (
        "<h2>Attention patterns of flagged heads</h2>"
        f"<p>Patterns (query rows, key columns) of {len(view.heads)} heads (the closed heads, or the top heads by P "
        f"when none is closed, unless chosen) on the text below, from "
        f"<code>hook_pattern</code>; click a head to enlarge. Text: <q>{_html.escape(text[:200])}</q></p>"
    )
    return intro + view.html
