"""Attention patterns of flagged heads on a text: the data behind the attention views.

The evidence a researcher wants next to the numbers: where do the closed heads (or the
top-k heads by P) attend on a chosen text. Patterns come from TransformerLens hooks
``blocks.{l}.attn.hook_pattern`` (``[batch, n_heads, query, key]`` on HookedTransformer,
HookedEncoder and TransformerBridge). :mod:`tl_idempotence.views.attention` draws them
with circuitsvis.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import torch

from ..core.options import check_int, check_threshold, strict_kwargs
from ..errors import OptionError, OptionTypeError, UnsupportedModelError
from ..sources.tl import attention_layers, is_tl_model
from ..views.attention import AttentionPatterns
from .tokens import special_wrapping, tokenizer_of

if TYPE_CHECKING:  # pragma: no cover
    from ..core.hints import HeadsReport, IntLike, RealLike

__all__ = ["AttentionPatterns", "FlaggedHeads", "attention_patterns", "flagged_heads"]


class FlaggedHeads(list[tuple[int, int]]):
    """The heads an attention view shows: a list of ``(layer, head)`` pairs, highest P first,
    that also says why they were chosen.

    Attributes:
        why: ``"closed"`` (heads with P >= threshold), ``"top_k"`` (none closed: the top heads
            by P) or ``"given"``.
        n_closed: how many heads are closed at ``threshold``.
        threshold: the P threshold.
        top_k: the cap that was applied (None: no cap).
    """

    why: str = "given"
    n_closed: int = 0
    threshold: float | None = None
    top_k: int | None = None

    def describe(self) -> str:
        """One sentence: which heads these are, e.g. "all 13 heads with P >= 0.9" or "the top 8 of 13 ..."."""
        t = "" if self.threshold is None else f" with P >= {self.threshold:g}"
        if self.why == "closed":
            if len(self) == self.n_closed:
                return f"all {self.n_closed} heads{t}"
            return f"the {len(self)} heads with the highest P of the {self.n_closed}{t}"
        if self.why == "top_k":
            return f"no head{t or ' is closed'}: the {len(self)} heads with the highest P"
        return f"{len(self)} chosen heads"


@strict_kwargs
def flagged_heads(
    heads: HeadsReport | pd.DataFrame, top_k: IntLike | None = None, threshold: RealLike | None = None
) -> FlaggedHeads:
    """Heads worth looking at: the closed ones (P >= threshold, SPEC 2), else the top-k by P.

    Args:
        heads: an :class:`~tl_idempotence.report.report.IdempotenceReport` or its ``heads``
            DataFrame (columns ``layer, head, P`` and ``closed`` unless ``threshold`` is given).
        top_k: at most this many heads, highest P first (>= 1). ``None``: every closed head,
            or 8 when none is closed.
        threshold: P threshold for "closed" (default: the report's, or the ``closed`` column).

    Returns:
        :class:`FlaggedHeads` (a list of ``(layer, head)``) sorted by P descending, with ``why``.

    Raises:
        OptionError / OptionTypeError: ``top_k < 1``, a bad threshold or missing columns.
    """
    if top_k is not None:
        top_k = check_int(top_k, "top_k", 1)
    if hasattr(heads, "heads") and isinstance(heads.heads, pd.DataFrame):
        threshold = heads.threshold if threshold is None else threshold
        heads = heads.heads
    if threshold is not None:
        threshold = check_threshold(threshold)
    if not isinstance(heads, pd.DataFrame) or not {"layer", "head", "P"} <= set(heads.columns):
        cols = list(heads.columns) if isinstance(heads, pd.DataFrame) else type(heads).__name__
        raise OptionError(f"Need a report or a DataFrame with columns layer, head, P; got {cols}.")
    df = heads[np.isfinite(heads["P"].to_numpy(dtype=float))].sort_values("P", ascending=False, kind="stable")
    if threshold is not None:
        closed = df["P"] >= threshold
    else:
        closed = df["closed"].astype(bool) if "closed" in df.columns else pd.Series(False, index=df.index)
    n_closed = int(closed.sum())
    if n_closed:
        pick, why, cap = df[closed], "closed", top_k
    else:
        pick, why, cap = df, "top_k", top_k or 8
    if cap is not None:
        pick = pick.head(cap)
    out = FlaggedHeads((int(a), int(b)) for a, b in zip(pick["layer"], pick["head"]))
    out.why, out.n_closed, out.threshold, out.top_k = why, n_closed, threshold, cap
    return out


def _tokens_for(model: Any, text: str, max_tokens: int) -> tuple[torch.Tensor, list[str], int, int, list[str]]:
    tok = tokenizer_of(model)
    prefix, suffix = special_wrapping(model, tok)
    body = max_tokens - len(prefix) - len(suffix)
    if body < 1:
        raise OptionError(f"max_tokens={max_tokens} leaves no room for text between the special tokens.")
    all_ids = list(tok(text, add_special_tokens=False)["input_ids"])
    ids = all_ids[:body]
    if not ids:
        raise OptionError("The text tokenized to nothing; pass a non-empty text.")
    kept = len(ids)
    ids = prefix + ids + suffix
    strs = [tok.decode([i]) for i in ids]
    special = [tok.decode([i]) for i in prefix + suffix]
    return torch.tensor([ids], dtype=torch.long), strs, len(all_ids), kept, special


@strict_kwargs
def attention_patterns(model: Any, text: Any, heads: Any, max_tokens: Any = 64) -> AttentionPatterns:
    """Attention patterns of ``heads`` on ``text`` via ``blocks.{l}.attn.hook_pattern`` (a view for the
    flagged heads of SPEC 2; not a SPEC quantity).

    Args:
        model: a TransformerLens model with a tokenizer.
        text: the text (tokenized like :func:`~tl_idempotence.probes.tokens.prepare_tokens`:
            the model's special tokens around it, e.g. SmolLM2's ``<|im_start|>`` BOS).
        heads: ``(layer, head)`` pairs.
        max_tokens: cut the text to this many tokens including special tokens (circuitsvis
            draws q x k squares); the result says whether it was cut.

    Returns:
        :class:`AttentionPatterns`.

    Raises:
        UnsupportedModelError: not a TransformerLens model.
        OptionError: unknown layer/head, no heads, empty text, ``max_tokens`` too small.
        OptionTypeError: ``text`` not a string, ``heads`` not (layer, head) pairs of integers.
    """
    if not is_tl_model(model):
        raise UnsupportedModelError(f"Attention views need a TransformerLens model to run; got {type(model).__name__}.")
    if not isinstance(text, str):
        raise OptionTypeError(f"text must be a string; got {type(text).__name__}.")
    max_tokens = check_int(max_tokens, "max_tokens", 2)
    if isinstance(heads, (str, bytes)) or not isinstance(heads, Iterable):
        raise OptionTypeError(f"heads must be (layer, head) pairs; got {type(heads).__name__} {heads!r:.60}.")
    pairs = []
    for item in heads:
        if isinstance(item, (str, bytes)) or not isinstance(item, (tuple, list)) or len(item) != 2:
            raise OptionTypeError(f"heads must be (layer, head) pairs; got an item {item!r:.60}.")
        pairs.append((check_int(item[0], "layer", 0), check_int(item[1], "head", 0)))
    heads = pairs
    if not heads:
        raise OptionError("No heads to show.")
    layers_ok = attention_layers(model)
    n = int(model.cfg.n_heads)
    for layer, h in heads:
        if layer not in layers_ok or not 0 <= h < n:
            raise OptionError(f"Head ({layer}, {h}) does not exist (attention layers {layers_ok}, n_heads {n}).")
    toks, strs, n_text, kept, special = _tokens_for(model, text, max_tokens)
    need = sorted({layer for layer, _ in heads})
    got: dict[int, torch.Tensor] = {}

    def make(layer: int) -> Any:
        def hook(p: torch.Tensor, hook: Any = None) -> None:
            got[layer] = p.detach()[0].float().cpu()

        return hook

    device = getattr(model.cfg, "device", None) or "cpu"
    with torch.no_grad():
        model.run_with_hooks(
            toks.to(device),
            fwd_hooks=[(f"blocks.{layer}.attn.hook_pattern", make(layer)) for layer in need],
            return_type=None,
        )
    pats = torch.stack([got[layer][h] for layer, h in heads]).numpy()
    causal = bool(np.abs(np.triu(pats, k=1)).max() < 1e-6) if pats.shape[-1] > 1 else True
    return AttentionPatterns(
        heads=list(heads),
        tokens=strs,
        patterns=pats,
        causal=causal,
        n_text_tokens=n_text,
        truncated=n_text > kept,
        special_tokens=special,
    )
