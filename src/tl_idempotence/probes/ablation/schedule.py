"""The plan of an ablation's batched passes: which head sets share each window's forward pass, from which block,
with which heads replaced, and what that costs (section "Batched head sets" of the
:mod:`tl_idempotence.probes.ablation` package docstring).

Every window is run once per *chunk* of up to ``per_forward`` head sets; every chunk repeats the residual stream
at the same block (the first layer any set ablates), so the empty set (index 0, in the first chunk) checks that
one place for every chunk. The costs are estimates for the progress bar only.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

__all__ = ["Schedule", "layer_cost"]


def layer_cost(cfg: Any) -> tuple[float, float]:
    """Multiply-adds per token of one block, and of the unembedding + loss, from the config (estimates only).

    Args:
        cfg: a TransformerLens config (``d_model``, ``n_heads``, ``d_head``, ``n_key_value_heads``, ``d_mlp``,
            ``gated_mlp``, ``act_fn``, ``d_vocab``; a missing one counts as 1, or ``4 d_model`` for ``d_mlp``).

    Returns:
        ``(block, unembed)`` multiply-adds per token position.

    Raises:
        Nothing of its own.
    """
    d = int(getattr(cfg, "d_model", 1) or 1)
    nh, dh = int(getattr(cfg, "n_heads", 1) or 1), int(getattr(cfg, "d_head", 1) or 1)
    nkv = int(getattr(cfg, "n_key_value_heads", None) or nh)
    d_mlp = int(getattr(cfg, "d_mlp", None) or 4 * d)
    gated = bool(getattr(cfg, "gated_mlp", False)) or str(getattr(cfg, "act_fn", "")) in ("silu", "swiglu")
    block = d * (2 * nh * dh + 2 * nkv * dh) + (3 if gated else 2) * d * d_mlp
    unembed = 1.3 * d * int(getattr(cfg, "d_vocab", 1) or 1)  # the cross-entropy reads the logits again
    return float(block), float(unembed)


class Schedule:
    """The ablated passes: chunks of head sets, each run on one window per forward, all from block ``start``.

    Attributes:
        sets: every head set, ``{layer: heads}``; index 0 is the empty set (nothing ablated: the check).
        per_forward: head sets per forward pass. chunks: the set indices of each forward, in order.
        start: the first layer any set ablates (where the residual stream is repeated).
        layers: the layers some set ablates, ascending.
        masks: per chunk, ``{layer: [sets of the chunk, n_heads] bool}``: the heads each set of the chunk replaces.
        n_layers: blocks of the model; block, unembed: :func:`layer_cost` of its config.
    """

    def __init__(self, sets: list[dict[int, list[int]]], per_forward: int, cfg: Any) -> None:
        order = list(range(len(sets)))
        self.sets = sets
        self.per_forward = per_forward
        self.chunks = [order[i : i + per_forward] for i in range(0, len(order), per_forward)]
        self.start = min((min(s) for s in sets if s), default=0)
        self.layers = sorted({layer for s in sets for layer in s})
        self.block, self.unembed = layer_cost(cfg)
        self.n_layers = int(cfg.n_layers)
        self.masks = [self._masks(ch, int(cfg.n_heads)) for ch in self.chunks]

    def _masks(self, chunk: list[int], n_heads: int) -> dict[int, Tensor]:
        """``{layer: [len(chunk), n_heads] bool}``: row ``j`` marks the heads set ``chunk[j]`` ablates there."""
        masks = {}
        for layer in self.layers:
            m = torch.zeros(len(chunk), n_heads, dtype=torch.bool)
            for j, i in enumerate(chunk):
                m[j, self.sets[i].get(layer, [])] = True
            masks[layer] = m
        return masks

    def forward_cost(self, n_seq: int, start: int) -> float:
        """Multiply-adds per token position of one forward of ``n_seq`` sets repeated at block ``start``."""
        return start * self.block + n_seq * ((self.n_layers - start) * self.block + self.unembed)

    def cost(self) -> float:
        """Multiply-adds per token position of one window's ablated passes (every chunk)."""
        return sum(self.forward_cost(len(ch), self.start) for ch in self.chunks)

    def two_full_chunks(self) -> bool:
        """Whether the first two chunks exist and are full: window 0 can time one thread against torch's count."""
        return len(self.chunks) >= 2 and all(len(ch) == self.per_forward for ch in self.chunks[:2])
