"""Which heads: TransformerLens's head labels (``L10H8``) and head selection, shared by the weight-only
analyses (the constructive search) and the forward-pass probes (activations, ablation).

Imports no torch (pandas only inside :func:`head_labels`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from ..errors import OptionError, OptionTypeError
from .options import check_int

__all__ = ["head_label", "head_labels", "select_heads"]

_LABEL = re.compile(r"L(\d+)H(\d+)")


def head_label(layer: int, head: int) -> str:
    """TransformerLens's head label, e.g. ``"L10H8"`` (the index of every per-head table). Raises nothing."""
    return f"L{int(layer)}H{int(head)}"


def head_labels(layers: Iterable[Any], heads: Iterable[Any]) -> Any:
    """A ``pandas.Index`` named ``"label"`` of :func:`head_label` for paired ``layers`` and ``heads`` (the index
    convention of ``rep.heads``). Raises nothing of its own."""
    import pandas as pd

    return pd.Index([head_label(a, b) for a, b in zip(layers, heads)], name="label")


def select_heads(heads: Any, layers: list[int], n_heads: int, *, labels: bool = False) -> dict[int, list[int]]:
    """``{layer: sorted heads}`` from ``None`` (all), ``(layer, head)`` pairs or a DataFrame with
    ``layer``/``head`` columns (e.g. ``report.closed_heads``); duplicates are merged (head selection for
    SPEC 5, 8 and the ablation). With ``labels``, TransformerLens labels (``"L10H8"``, or one such string) are
    accepted too (SPEC 12's probes).

    Args:
        heads: the selection.
        layers: the model's attention layers.
        n_heads: query heads per layer.
        labels: accept ``"L10H8"`` labels as items.

    Raises:
        OptionTypeError: not pairs of integers / no layer, head columns.
        OptionError: an empty selection, an unknown layer or head.
    """
    if heads is None:
        return {layer: list(range(n_heads)) for layer in layers}
    if hasattr(heads, "columns") and hasattr(heads, "__getitem__"):
        if not {"layer", "head"} <= set(heads.columns):
            raise OptionTypeError(f"A heads DataFrame needs 'layer' and 'head' columns; got {list(heads.columns)}.")
        items = list(zip(heads["layer"], heads["head"]))
    else:
        if labels and isinstance(heads, str):
            heads = [heads]
        if isinstance(heads, (str, bytes)) or not isinstance(heads, Iterable):
            raise OptionTypeError(
                "heads must be None, a DataFrame with layer/head columns, or (layer, head) pairs; got "
                f"{type(heads).__name__} {heads!r:.60}."
            )
        items = list(heads)
    pairs: list[tuple[int, int]] = []
    for item in items:
        if labels and isinstance(item, str):
            m = _LABEL.fullmatch(item)
            if not m:
                raise OptionTypeError(f"heads: {item!r:.60} is not a head label like 'L10H8'.")
            item = (int(m[1]), int(m[2]))
        try:
            if isinstance(item, (str, bytes)):
                raise TypeError("a string is not a (layer, head) pair")
            layer, head = item
        except (TypeError, ValueError) as e:
            raise OptionTypeError(
                "heads must be None, a DataFrame with layer/head columns, or (layer, head) pairs; "
                f"got an item {item!r:.60}."
            ) from e
        pairs.append((check_int(layer, "layer of a head", 0), check_int(head, "head index", 0)))
    if not pairs:
        raise OptionError("heads is empty: pass None for every head, or the (layer, head) pairs to use.")
    out: dict[int, list[int]] = {}
    for layer, head in pairs:
        if layer not in layers:
            raise OptionError(f"Layer {layer} is not an attention layer of this model (attention layers: {layers}).")
        if not 0 <= head < n_heads:
            raise OptionError(f"Head {head} of layer {layer} does not exist (n_heads = {n_heads}).")
        out.setdefault(layer, [])
        if head not in out[layer]:
            out[layer].append(head)
    return {layer: sorted(v) for layer, v in sorted(out.items())}
