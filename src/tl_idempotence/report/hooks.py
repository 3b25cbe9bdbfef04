"""The hook points of a report's heads: TransformerLens's per-head hooks and the ``(hook name, index)`` pairs
:meth:`~tl_idempotence.report.report.IdempotenceReport.hook_points` returns (which axis a head indexes, which query
heads a kv-head point stands for)."""

from __future__ import annotations

from typing import Any

from ..errors import OptionError, OptionTypeError

__all__ = ["HOOK_AXES", "HookPoint", "hook_points_of"]


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


def hook_points_of(rep: Any, heads: Any, hook: Any, model: Any) -> list[HookPoint]:
    """:meth:`~tl_idempotence.report.report.IdempotenceReport.hook_points` of ``rep`` (its docstring).

    Raises:
        OptionTypeError: ``hook`` is not a string. OptionError: an unknown selector or hook name; ``"result"`` on a
            model without ``use_attn_result``.
    """
    if not isinstance(hook, str):
        raise OptionTypeError(f"hook must be one of {tuple(HOOK_AXES)}; got {type(hook).__name__} {hook!r}.")
    if hook not in HOOK_AXES:
        raise OptionError(f"hook must be one of {tuple(HOOK_AXES)}; got {hook!r}.")
    if hook == "result":
        m = model if model is not None else rep.model
        cfg = getattr(m, "cfg", None)
        if cfg is not None and not getattr(cfg, "use_attn_result", False):
            raise OptionError(
                "hook_result fires only when the model computes per-head results, and this model's "
                "cfg.use_attn_result is off: call model.set_use_attn_result(True) first (it costs a "
                "[batch, pos, n_heads, d_model] tensor per layer), or use hook='z' (the same heads, before W_O)."
            )
    if isinstance(heads, str):
        if heads == "closed":
            df = rep.closed_heads
        elif heads == "all":
            df = rep.heads
        else:
            raise OptionError(f"heads must be 'closed', 'all' or (layer, head) pairs; got {heads!r}.")
        pairs = [(int(a), int(b)) for a, b in zip(df["layer"], df["head"])]
    else:
        from ..core.selection import select_heads

        sel = select_heads(heads, sorted({int(v) for v in rep.heads["layer"]}), rep.info.n_heads)
        pairs = [(layer, h) for layer, hs in sel.items() for h in hs]
    kind, axis = HOOK_AXES[hook]
    if kind == "query":
        return [HookPoint(f"blocks.{layer}.attn.hook_{hook}", h, layer, axis, (h,)) for layer, h in pairs]
    h = rep.heads
    kv_of = {(int(a), int(b)): int(k) for a, b, k in zip(h["layer"], h["head"], h["kv_head"])}
    served: dict[tuple[int, int], list[int]] = {}
    for layer, h in pairs:
        served.setdefault((layer, kv_of[(layer, h)]), []).append(h)
    return [
        HookPoint(f"blocks.{layer}.attn.hook_{hook}", kv, layer, axis, tuple(hs)) for (layer, kv), hs in served.items()
    ]
