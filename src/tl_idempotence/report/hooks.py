"""The hook points of a report's heads: TransformerLens's per-head hooks and the ``(hook name, index)`` pairs
:meth:`~tl_idempotence.report.report.IdempotenceReport.hook_points` returns (which axis a head indexes, which query
heads a kv-head point stands for)."""

from __future__ import annotations

from typing import Any

__all__ = ["HOOK_AXES", "HookPoint"]


#: The per-head hooks of a TransformerLens attention block: ``hook -> (what the head axis counts, its dim)``.
#: ``"query"``: query heads; ``"kv"``: kv heads (``hook_k``/``hook_v`` are ``[batch, pos, n_kv_heads, d_head]``
#: on GQA/MQA, on HookedTransformer and TransformerBridge alike).
HOOK_AXES: dict[str, tuple[str, int]] = {
    "z": ("query", 2),
    "q": ("query", 2),
    "result": ("query", 2),
    "pattern": ("query", 1),
    "attn_scores": ("query", 1),
    "k": ("kv", 2),
    "v": ("kv", 2),
}


class HookPoint(tuple):
    """One hook point: a ``(hook_name, head)`` pair (it unpacks and compares as one; ``name`` and ``head`` name
    its two items) that also says which ``layer`` it is in, which ``axis`` of the activation ``head``
    indexes, and the ``query_heads`` it stands for (for ``hook_k``/``hook_v`` on GQA: the chosen query heads
    its kv head serves).
    """

    layer: int
    axis: int
    query_heads: tuple[int, ...]

    def __new__(cls, name: str, index: int, layer: int, axis: int, query_heads: tuple[int, ...]) -> HookPoint:
        self = super().__new__(cls, (name, int(index)))
        self.layer, self.axis, self.query_heads = int(layer), int(axis), tuple(int(h) for h in query_heads)
        return self

    @property
    def name(self) -> str:
        """The TransformerLens hook name, e.g. ``"blocks.10.attn.hook_z"``."""
        return str(self[0])

    @property
    def head(self) -> int:
        """The index along :attr:`axis` of the hook's activation: a query head (a kv head for ``hook_k``/``hook_v``)."""
        return int(self[1])

    def __repr__(self) -> str:
        return f"HookPoint({self[0]!r}, {self[1]}, axis={self.axis}, query_heads={self.query_heads})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (HookPoint, (self[0], self[1], self.layer, self.axis, self.query_heads))
