"""The ablation kinds and the hooks each uses (imported by the ablation's entry and by its store). Imports nothing."""

from __future__ import annotations

__all__ = ["ABLATION_HOOKS", "ABLATION_KINDS"]

#: Ablation kinds: replace a head's ``hook_z`` by its clean mean, or by zeros.
ABLATION_KINDS = ("mean", "zero")
#: What an ablation of each kind records of its hook (its ``options``).
ABLATION_HOOKS: dict[str, dict[str, str | None]] = {
    "mean": {
        "hook": "blocks.{l}.attn.hook_z",
        "mean_over": "every counted (non-special) position of the evaluated windows, clean run, per head",
    },
    "zero": {"hook": "blocks.{l}.attn.hook_z", "mean_over": None},
}
