"""Do the flagged heads matter? Next-token loss with them ablated, against matched random head sets.

A near-idempotent head is interesting if the model needs it. :func:`ablation` runs a causal
TransformerLens model (``HookedTransformer`` or ``TransformerBridge``) on real text and
measures the next-token loss

* clean;
* with the given heads ablated together (the *flagged set*);
* with each given head ablated alone;
* with ``n_controls`` random head sets *matched* to the flagged set (below),

and returns the loss change ``Δ = loss_ablated − loss_clean`` (nats) of each, the control
distribution and an empirical p-value. It is not a per-layer weight analysis: nothing is
registered in the report loop.

**Ablation** is done at ``blocks.{l}.attn.hook_z`` ``[batch, pos, n_heads, d_head]`` — the
head's value-weighted mix before ``W_O`` (on a ``HookedTransformer`` the hook itself; on a
``TransformerBridge`` the alias of ``attn.o.hook_in``, reshaped by the bridge to the same
layout and reshaped back after the hook), so a head's contribution ``z_h @ W_O[h]`` to the
residual stream is replaced while every other head, ``b_O`` and the rest of the model are
untouched. ``kind="zero"`` sets ``z_h = 0`` (the head writes nothing; ``b_O``, which belongs
to no head, stays). ``kind="mean"`` sets ``z_h`` to its mean over the clean run: the mean of
``z[b, p, h, :]`` over every *counted* position ``(b, p)`` of all evaluated windows (the
same mask as the loss: special-token positions such as BOS, an attention sink whose head
outputs are atypical, are left out of the mean), computed once per head in the clean pass —
so it does not depend on ``batch_size``. The replacement is applied at every position.
Zero-ablating every head of a layer therefore leaves exactly ``b_O`` as the layer's
attention output (0 for bias-free models such as Llama: the attention output is removed).

**Loss**: mean cross-entropy (nats) of the token at position ``p + 1`` given positions
``0..p``, over the target positions whose token is not a special token (BOS/EOS/PAD/...),
accumulated in float64 over every window (:func:`~tl_idempotence.analyses.tokens.prepare_tokens`:
the default corpus of standard-library docstrings when ``texts`` is None).

**Matched controls**: for control ``c`` and each layer ``l`` holding ``k_l`` flagged heads,
``k_l`` distinct heads are drawn uniformly from the layer's *non-flagged* heads when it has
at least ``k_l`` of them, otherwise from all of the layer's heads (the control may then
contain flagged heads; ``n_flagged_in_set`` counts them and the summary says so). So a control
set has the flagged set's size and per-layer composition. Draws come from
``layer_generator(seed, l, "ablation")`` (one stream per layer, ``c``-th draw for control
``c``): deterministic for ``seed``, and a layer's draws do not depend on the other layers.

**p-value**: ``(1 + #{controls with Δ ≥ Δ_flagged}) / (n_controls + 1)`` — small when the
flagged set hurts the loss more than random matched sets do (NaN with a note when
``n_controls = 0``).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import pandas as pd
import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from ..core.heads import ModelInfo, kv_layout
from ..core.options import check_bool, check_int, check_seed, strict_kwargs
from ..core.random import layer_generator
from ..core.results import Result
from ..errors import OptionError, OptionTypeError, UnsupportedModelError
from ..sources.tl import TLModelSource, is_tl_model
from .tokens import prepare_tokens, select_heads

__all__ = ["ABLATION_KINDS", "MAX_CONTROLS", "Ablation", "ablation", "matched_controls", "next_token_loss"]

#: Ablation kinds: replace a head's ``hook_z`` by its clean mean, or by zeros.
ABLATION_KINDS = ("mean", "zero")
#: The most control sets accepted (each is one forward pass over the whole text).
MAX_CONTROLS = 1000


@dataclass(repr=False)
class Ablation(Result):
    """Result of :func:`ablation`.

    Attributes:
        heads: one row per flagged head, indexed by ``"L10H8"`` labels (joinable to
            ``rep.heads`` by index or on ``layer, head``): ``layer, head, kv_head``,
            ``loss_ablated`` (nats, this head alone ablated), ``delta_loss`` (``loss_ablated −
            loss_clean``).
        controls: one row per matched control set: ``control`` (0..n-1), ``heads`` (labels,
            space-separated), ``n_flagged_in_set``, ``loss_ablated``, ``delta_loss``.
        summary: ``model_name, kind, n_heads`` (flagged), ``layers``, ``n_windows, n_tokens``
            (counted target positions), ``loss_clean, loss_ablated, delta_loss`` (the flagged
            set), ``sum_delta_single`` (the heads alone, summed), ``n_controls``,
            ``control_delta_mean, control_delta_median, control_delta_q05, control_delta_q95,
            control_delta_max``, ``n_controls_at_least`` (controls with Δ ≥ the flagged Δ),
            ``p_value``, ``control_rule`` and, where it applies, ``note``.
        info: the measured model's :class:`~tl_idempotence.core.heads.ModelInfo`.
        options: the arguments (kind, n_controls, seed, seq_len, max_tokens, batch_size, corpus).
    """

    heads: pd.DataFrame
    controls: pd.DataFrame
    summary: dict[str, Any]
    info: ModelInfo
    options: dict[str, Any] = field(default_factory=dict)

    repr_keys: ClassVar[tuple[str, ...]] = (
        "kind",
        "n_heads",
        "n_tokens",
        "loss_clean",
        "delta_loss",
        "control_delta_median",
        "p_value",
    )


def _is_causal(model: Any) -> bool:
    names = [c.__name__ for c in type(model).__mro__]
    if "HookedEncoder" in names or "HookedEncoderDecoder" in names:
        return False
    if "TransformerBridge" in names:
        hf = getattr(model, "original_model", None)
        can = getattr(hf, "can_generate", None)
        if callable(can):
            return bool(can())
    return getattr(getattr(model, "cfg", None), "attention_dir", "causal") == "causal"


def next_token_loss(
    logits: Float[Tensor, "batch pos vocab"], tokens: Int[Tensor, "batch pos"], counted: Bool[Tensor, "batch pos"]
) -> tuple[float, int]:
    """Sum of the next-token cross-entropies (nats, float64) over counted target positions, and their number.

    Position ``p``'s logits predict ``tokens[:, p + 1]``; a target counts when ``counted[:, p + 1]``
    (the ablation check of the module docstring; not a SPEC quantity).

    Args:
        logits: ``[batch, pos, d_vocab]`` (any float dtype; evaluated in float32).
        tokens: ``[batch, pos]`` int64 ids; counted: ``[batch, pos]`` bool.

    Returns:
        ``(sum of cross-entropies in nats, number of counted targets)``.

    Raises:
        Nothing of its own (internal; the caller checked the shapes).
    """
    ce = torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]).float(), tokens[:, 1:].reshape(-1), reduction="none"
    )
    mask = counted[:, 1:].reshape(-1)
    return float(ce[mask].double().sum()), int(mask.sum())


def matched_controls(
    flagged: dict[int, list[int]], n_heads: int, n_controls: int, seed: int
) -> tuple[list[dict[int, list[int]]], list[int]]:
    """Random head sets matched to ``flagged`` layer by layer (the rule is in the module docstring).

    Args:
        flagged: ``{layer: heads}``; n_heads: query heads per layer; n_controls: sets to draw (>= 0);
        seed: seed of ``layer_generator(seed, layer, "ablation")`` (one stream per layer).

    Raises:
        OptionError / OptionTypeError: a bad seed (from the generator).

    Returns:
        ``(sets, fallback_layers)``: ``n_controls`` dicts ``{layer: sorted heads}``, and the layers
        whose draws came from all heads because fewer than ``k_l`` non-flagged heads exist.
    """
    sets: list[dict[int, list[int]]] = [{} for _ in range(n_controls)]
    fallback: list[int] = []
    for layer, hs in sorted(flagged.items()):
        k = len(hs)
        pool = [h for h in range(n_heads) if h not in set(hs)]
        if len(pool) < k:
            pool = list(range(n_heads))
            fallback.append(layer)
        gen = layer_generator(seed, layer, "ablation")
        for c in range(n_controls):
            pick = torch.randperm(len(pool), generator=gen)[:k].tolist()
            sets[c][layer] = sorted(pool[i] for i in pick)
    return sets, fallback


def _label(layer: int, head: int) -> str:
    return f"L{int(layer)}H{int(head)}"


def _set_labels(s: dict[int, list[int]]) -> str:
    return " ".join(_label(layer, h) for layer, hs in sorted(s.items()) for h in hs)


@strict_kwargs
def ablation(
    model: Any,
    heads: Any,
    texts: Any = None,
    *,
    kind: str = "mean",
    n_controls: int = 16,
    seed: int = 0,
    seq_len: int = 128,
    max_tokens: int | None = 4096,
    batch_size: int = 8,
    text_column: str = "text",
    progress: bool = True,
) -> Ablation:
    """Next-token loss change when the given heads are ablated, against matched random head sets.

    Runs ``2 + len(heads) + n_controls`` passes over the text (clean, the flagged set, each
    head alone, each control) with TransformerLens hooks on ``blocks.{l}.attn.hook_z``; no
    weight is changed. Definitions (ablation, loss, matched controls, p-value): module docstring.

    Args:
        model: a causal ``HookedTransformer`` or ``TransformerBridge`` (with a tokenizer for text).
        heads: ``(layer, head)`` pairs or a DataFrame with ``layer``/``head`` columns
            (``rep.closed_heads``; ``rep.ablation(model=...)`` passes it).
        texts: ``None`` (the default corpus: standard-library docstrings), a string, a list of
            strings / ``pathlib.Path`` files, a ``datasets.Dataset`` or token ids ``[batch, pos]``.
        kind: ``"mean"`` (replace ``z_h`` by its clean mean over the counted positions) or ``"zero"``.
        n_controls: matched random sets (0..1000; 0 gives no p-value).
        seed: seed of the control draws.
        seq_len: window length in tokens (with the special tokens), >= 2.
        max_tokens: counted tokens to use (rounded up to whole windows); None: all of ``texts``.
        batch_size: windows per forward pass (does not change any number).
        text_column: text column of a ``datasets.Dataset``.
        progress: tqdm bar over the passes.

    Returns:
        :class:`Ablation` (``.heads`` per flagged head, ``.controls``, ``.summary`` with the p-value).

    Raises:
        UnsupportedModelError: not a TransformerLens model, or not a causal LM (an encoder has no
            next-token loss).
        OptionError: ``heads`` empty or naming a layer/head the model lacks, an unknown ``kind``,
            ``n_controls`` outside 0..1000, empty texts, no counted target token, bad counts.
        OptionTypeError: an argument of the wrong type.
    """
    from ..core.progress import progress_bar

    if not is_tl_model(model):
        raise UnsupportedModelError(
            f"ablation needs a TransformerLens model (HookedTransformer or TransformerBridge) to run with hooks; got "
            f"{type(model).__name__}. Load one with tl_idempotence.models.load(...)."
        )
    if not _is_causal(model):
        raise UnsupportedModelError(
            f"ablation measures next-token loss, which needs a causal language model; {type(model).__name__} "
            f"({getattr(model.cfg, 'model_name', '?')}) is an encoder (bidirectional attention)."
        )
    if not isinstance(kind, str):
        raise OptionTypeError(f"kind must be 'mean' or 'zero'; got {type(kind).__name__} {kind!r}.")
    if kind not in ABLATION_KINDS:
        close = difflib.get_close_matches(kind, ABLATION_KINDS, n=1, cutoff=0.4)
        raise OptionError(
            f"kind must be 'mean' or 'zero'; got {kind!r}" + (f" (did you mean {close[0]!r}?)" if close else "") + "."
        )
    n_controls = check_int(n_controls, "n_controls", 0, MAX_CONTROLS)
    seed = check_seed(seed)
    seq_len = check_int(seq_len, "seq_len", 2, 1 << 20)
    batch_size = check_int(batch_size, "batch_size", 1, 1 << 20)
    progress = check_bool(progress, "progress")
    if heads is None:
        raise OptionError("heads is None: give the (layer, head) pairs to ablate, e.g. rep.closed_heads.")
    if hasattr(heads, "__len__") and not isinstance(heads, (str, bytes)) and len(heads) == 0:
        raise OptionError(
            "heads is empty: give the (layer, head) pairs to ablate (rep.closed_heads is empty when no head "
            "reaches the report's threshold)."
        )
    src = TLModelSource(model)
    n_heads = src.info.n_heads
    flagged = select_heads(heads, list(src.layers()), n_heads)
    toks, counted = prepare_tokens(model, texts, seq_len=seq_len, max_tokens=max_tokens, text_column=text_column)
    if toks.shape[1] < 2 or not bool(counted[:, 1:].any()):
        raise OptionError(
            "No counted target token: next-token loss needs windows of at least 2 tokens with a non-special "
            "token after the first position."
        )
    controls, fallback = matched_controls(flagged, n_heads, n_controls, seed)
    layers = sorted(flagged)
    device = getattr(model.cfg, "device", None) or "cpu"
    d_head = int(model.cfg.d_head)

    def hook_for(layer: int, hs: list[int], value: Tensor | None) -> tuple[str, Any]:
        idx = torch.tensor(hs, dtype=torch.long)

        def hook(z: Tensor, hook: Any = None) -> Tensor:
            out = z.clone()
            if value is None:
                out[..., idx.to(z.device), :] = 0.0
            else:
                out[..., idx.to(z.device), :] = value[idx].to(device=z.device, dtype=z.dtype)
            return out

        return f"blocks.{layer}.attn.hook_z", hook

    sums = {layer: torch.zeros(n_heads, d_head, dtype=torch.float64) for layer in layers}
    cur: dict[str, Tensor] = {}

    def mean_hook(layer: int) -> tuple[str, Any]:
        def hook(z: Tensor, hook: Any = None) -> None:
            m = cur["counted"].to(z.device)
            sums[layer] += z.detach()[m].double().sum(0).cpu()

        return f"blocks.{layer}.attn.hook_z", hook

    def run(fwd_hooks: list[tuple[str, Any]]) -> float:
        total, n = 0.0, 0
        for start in range(0, len(toks), batch_size):
            batch = toks[start : start + batch_size]
            cur["counted"] = counted[start : start + batch_size]
            logits = model.run_with_hooks(batch.to(device), fwd_hooks=fwd_hooks, return_type="logits").detach()
            s, k = next_token_loss(logits, batch.to(logits.device), cur["counted"].to(logits.device))
            total += s
            n += k
        return total / n

    conditions: list[tuple[str, dict[int, list[int]]]] = [("flagged", flagged)]
    conditions += [(_label(layer, h), {layer: [h]}) for layer, hs in flagged.items() for h in hs]
    conditions += [(f"control {c}", s) for c, s in enumerate(controls)]
    losses: dict[str, float] = {}
    was_training = bool(getattr(model, "training", False))
    model.eval()
    bar = progress_bar(total=1 + len(conditions), desc=f"ablation ({kind})", unit="pass", enabled=bool(progress))
    try:
        with torch.no_grad():
            clean_hooks = [mean_hook(layer) for layer in layers] if kind == "mean" else []
            loss_clean = run(clean_hooks)
            bar.update(1)
            n_mean = counted.sum().double()  # the positions the mean hooks summed over
            means = {layer: sums[layer] / n_mean for layer in layers} if kind == "mean" else {}
            for name, cond in conditions:
                hooks = [hook_for(layer, hs, means.get(layer)) for layer, hs in sorted(cond.items())]
                losses[name] = run(hooks)
                bar.update(1)
    finally:
        bar.close()
        if was_training:
            model.train()

    kv_of = kv_layout(n_heads, src.info.n_kv_heads)
    head_rows = []
    for layer, hs in flagged.items():
        for h in hs:
            loss = losses[_label(layer, h)]
            head_rows.append(
                {
                    "layer": layer,
                    "head": h,
                    "kv_head": int(kv_of[h]),
                    "loss_ablated": loss,
                    "delta_loss": loss - loss_clean,
                }
            )
    heads_df = pd.DataFrame(head_rows)
    heads_df.index = pd.Index([_label(layer, h) for layer, hs in flagged.items() for h in hs], name="label")
    flagged_pairs = {(layer, h) for layer, hs in flagged.items() for h in hs}
    ctrl_rows = []
    for c, s in enumerate(controls):
        loss = losses[f"control {c}"]
        ctrl_rows.append(
            {
                "control": c,
                "heads": _set_labels(s),
                "n_flagged_in_set": sum((layer, h) in flagged_pairs for layer, hs in s.items() for h in hs),
                "loss_ablated": loss,
                "delta_loss": loss - loss_clean,
            }
        )
    ctrl_df = pd.DataFrame(
        ctrl_rows, columns=["control", "heads", "n_flagged_in_set", "loss_ablated", "delta_loss"]
    ).astype({"control": "int64", "n_flagged_in_set": "int64", "loss_ablated": "float64", "delta_loss": "float64"})
    delta = losses["flagged"] - loss_clean
    cd = ctrl_df["delta_loss"].to_numpy(dtype=float)
    n_at_least = int((cd >= delta).sum())
    nan = float("nan")
    summary: dict[str, Any] = {
        "model_name": src.info.model_name,
        "kind": kind,
        "n_heads": len(flagged_pairs),
        "layers": layers,
        "n_windows": int(toks.shape[0]),
        "n_tokens": int(counted[:, 1:].sum()),
        "loss_clean": loss_clean,
        "loss_ablated": losses["flagged"],
        "delta_loss": delta,
        "sum_delta_single": float(heads_df["delta_loss"].sum()),
        "n_controls": n_controls,
        "control_delta_mean": float(cd.mean()) if cd.size else nan,
        "control_delta_median": float(np.median(cd)) if cd.size else nan,
        "control_delta_q05": float(np.quantile(cd, 0.05)) if cd.size else nan,
        "control_delta_q95": float(np.quantile(cd, 0.95)) if cd.size else nan,
        "control_delta_max": float(cd.max()) if cd.size else nan,
        "n_controls_at_least": n_at_least,
        "p_value": (1 + n_at_least) / (n_controls + 1) if n_controls else nan,
        "control_rule": "same number of heads per layer, drawn from the layer's non-flagged heads",
    }
    notes = []
    if not n_controls:
        notes.append("p_value is NaN: no control set was drawn (n_controls=0)")
    if fallback:
        summary["control_rule"] += (
            f"; layers {fallback} have fewer non-flagged than flagged heads, so their draws come from all heads"
        )
        notes.append(f"controls in layers {fallback} may contain flagged heads (see controls.n_flagged_in_set)")
    if notes:
        summary["note"] = "; ".join(notes)
    options = {
        "kind": kind,
        "n_controls": n_controls,
        "seed": seed,
        "seq_len": seq_len,
        "max_tokens": max_tokens,
        "batch_size": batch_size,
        "corpus": "default (stdlib docstrings)" if texts is None else type(texts).__name__,
        "hook": "blocks.{l}.attn.hook_z",
        "mean_over": "every counted (non-special) position of the evaluated windows, clean run, per head"
        if kind == "mean"
        else None,
    }
    return Ablation(heads=heads_df, controls=ctrl_df, summary=summary, info=src.info, options=options)
