"""The one place that knows model layouts: any model or weight file -> per-layer head factors.

Every adapter yields :class:`LayerHeads` (the paper's column form, one layer at a
time) and never computes a metric; every analysis consumes ``LayerHeads`` and
never touches a model. Supported sources:

* ``transformer_lens.HookedTransformer`` / ``HookedEncoder`` (transformer-lens 3.x):
  GQA/MQA value heads are read unexpanded from ``blocks[l].attn._W_V``.
* ``transformer_lens.model_bridge.TransformerBridge`` (3.x and 4.x): its per-block
  ``attn.W_V`` is already unexpanded ``[n_kv_heads, d_model, d_head]``.
* checkpoint files and ``transformers`` models via :mod:`tl_idempotence.sources`
  (see :func:`head_source`).

Query head ``h`` reads kv head ``kv_head_of[h]``; for TransformerLens models this is
the ``repeat_interleave`` layout (``h // (n_heads // n_kv_heads)``) that TL itself
uses to expand ``_W_V`` — taken from the configuration, never by comparing floats.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch
from jaxtyping import Float, Int
from torch import Tensor

from .linalg import check_finite

__all__ = ["HeadSource", "LayerHeads", "ModelInfo", "TLModelSource", "head_source", "kv_layout"]


@dataclass(frozen=True)
class LayerHeads:
    """One attention layer's heads in the paper's column form (SPEC section 1).

    Attributes:
        layer: layer index in the model.
        O: ``[n_heads, d_model, d_head]`` output writes, ``O = W_O[l].transpose(-1, -2)``.
        V: ``[n_kv_heads, d_model, d_head]`` value reads, unexpanded (``= W_V`` per kv head).
        kv_head_of: ``[n_heads]`` int64, query head -> kv head, from the model's layout.

    Tensors keep the stored dtype (fp32/fp16/bf16); analyses promote to float64.
    """

    layer: int
    O: Float[Tensor, "n_heads d_model d_head"]
    V: Float[Tensor, "n_kv_heads d_model d_head"]
    kv_head_of: Int[Tensor, " n_heads"]

    def __post_init__(self) -> None:
        n_heads, d_model, d_head = self.O.shape
        n_kv, d_model_v, d_head_v = self.V.shape
        if (d_model, d_head) != (d_model_v, d_head_v):
            raise ValueError(
                f"Layer {self.layer}: O {tuple(self.O.shape)} and V {tuple(self.V.shape)} disagree on "
                "(d_model, d_head)."
            )
        if self.kv_head_of.shape != (n_heads,):
            raise ValueError(f"Layer {self.layer}: kv_head_of has shape {tuple(self.kv_head_of.shape)}, expected ({n_heads},).")
        if n_heads and (int(self.kv_head_of.min()) < 0 or int(self.kv_head_of.max()) >= n_kv):
            raise ValueError(f"Layer {self.layer}: kv_head_of points outside the {n_kv} kv heads.")

    @property
    def n_heads(self) -> int:
        return int(self.O.shape[0])

    @property
    def n_kv_heads(self) -> int:
        return int(self.V.shape[0])

    @property
    def d_model(self) -> int:
        return int(self.O.shape[1])

    @property
    def d_head(self) -> int:
        return int(self.O.shape[2])

    def V_of_heads(self) -> Float[Tensor, "n_heads d_model d_head"]:
        """V expanded to query heads (a view-sized gather; avoid on huge layers)."""
        return self.V[self.kv_head_of]

    def check_finite(self) -> None:
        """Raise ``ValueError`` naming layer and head if O or V holds NaN/inf."""
        check_finite(self.O, f"W_O of layer {self.layer}", ("head",))
        check_finite(self.V, f"W_V of layer {self.layer}", ("kv_head",))


@dataclass
class ModelInfo:
    """What was measured: architecture sizes and the weight-processing state (SPEC 10)."""

    model_name: str
    model_class: str
    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_model: int
    d_head: int
    processing: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class HeadSource(Protocol):
    """Anything that streams :class:`LayerHeads` layer by layer."""

    info: ModelInfo

    def layers(self) -> Iterator[int]: ...

    def layer_heads(self, layer: int) -> LayerHeads: ...

    def __iter__(self) -> Iterator[LayerHeads]: ...


def kv_layout(n_heads: int, n_kv_heads: int) -> Int[Tensor, " n_heads"]:
    """Query head -> kv head for the standard ``repeat_interleave`` GQA layout.

    Used by TransformerLens, Hugging Face Llama/Qwen/Mistral/Gemma (``repeat_kv``)
    and llama.cpp: query head ``h`` reads kv head ``h // (n_heads // n_kv_heads)``.

    Raises:
        ValueError: ``n_heads`` is not a positive multiple of ``n_kv_heads``.
    """
    if n_kv_heads <= 0 or n_heads <= 0 or n_heads % n_kv_heads:
        raise ValueError(f"n_heads={n_heads} is not a positive multiple of n_kv_heads={n_kv_heads}.")
    return torch.arange(n_heads) // (n_heads // n_kv_heads)


def _class_names(obj: Any) -> list[str]:
    return [c.__name__ for c in type(obj).__mro__]


def _is_tl_model(model: Any) -> bool:
    names = _class_names(model)
    return any(n in ("HookedTransformer", "HookedEncoder", "HookedEncoderDecoder", "TransformerBridge") for n in names)


def _tl_processing(model: Any) -> dict[str, Any]:
    """Best-effort record of TransformerLens weight processing (SPEC section 10)."""
    recorded = getattr(model, "_tli_processing", None)
    if isinstance(recorded, dict):
        return dict(recorded)
    cfg = model.cfg
    names = _class_names(model)
    out: dict[str, Any] = {}
    if "TransformerBridge" in names:
        processed = bool(getattr(model, "_weights_processed", False))
        out["weights_processed"] = processed
        adapter = getattr(model, "adapter", None)
        fold = getattr(adapter, "_fold_ln_requested", None)
        out["fold_ln"] = bool(processed and (fold is None or fold))
        out["source"] = "TransformerBridge flags (_weights_processed, adapter._fold_ln_requested)"
    else:
        norm = getattr(cfg, "normalization_type", None)
        out["normalization_type"] = norm
        out["fold_ln"] = norm in ("LNPre", "RMSPre")
        out["source"] = "HookedTransformer cfg.normalization_type (LNPre/RMSPre => fold_ln)"
    # center_writing_weights leaves every W_O row with zero mean over d_model; TL keeps no flag for it.
    try:
        W_O = model.blocks[_attn_layers(model)[0]].attn.W_O.detach().double()
        rel = (W_O.mean(-1).abs().max() / W_O.pow(2).mean().sqrt().clamp_min(1e-300)).item()
        out["center_writing_weights"] = bool(rel < 1e-6)
        out["center_writing_weights_note"] = "inferred from layer-0 W_O row means (TL records no flag)"
    except Exception:  # pragma: no cover - informational only
        out["center_writing_weights"] = None
    out["raw"] = not out.get("fold_ln") and not out.get("center_writing_weights")
    return out


def _attn_layers(model: Any) -> list[int]:
    blocks = getattr(model, "blocks", None)
    if blocks is None:
        return []
    return [i for i, b in enumerate(blocks) if getattr(b, "attn", None) is not None and hasattr(b.attn, "W_O")]


class TLModelSource:
    """Streams :class:`LayerHeads` from a TransformerLens model (HookedTransformer,
    HookedEncoder or TransformerBridge), one layer at a time.

    Raises:
        ValueError: the model has no attention blocks, or its config is inconsistent
            with its weights (e.g. ``n_heads`` not a multiple of ``n_key_value_heads``).
    """

    def __init__(self, model: Any):
        self.model = model
        cfg = model.cfg
        self._attn = _attn_layers(model)
        if not self._attn:
            raise ValueError(
                f"{type(model).__name__} has no attention layers (no blocks[l].attn with W_O): "
                "there is no OV circuit to measure."
            )
        n_heads = int(cfg.n_heads)
        n_kv = int(getattr(cfg, "n_key_value_heads", None) or n_heads)
        self._kv = kv_layout(n_heads, n_kv)
        self.info = ModelInfo(
            model_name=str(getattr(cfg, "model_name", None) or type(model).__name__),
            model_class=type(model).__name__,
            n_layers=int(cfg.n_layers),
            n_heads=n_heads,
            n_kv_heads=n_kv,
            d_model=int(cfg.d_model),
            d_head=int(cfg.d_head),
            processing=_tl_processing(model),
        )

    def layers(self) -> Iterator[int]:
        return iter(self._attn)

    def layer_heads(self, layer: int) -> LayerHeads:
        if layer not in self._attn:
            raise IndexError(f"Layer {layer} is not an attention layer of this model (attention layers: {self._attn}).")
        attn = self.model.blocks[layer].attn
        with torch.no_grad():
            W_O = attn.W_O.detach()
            W_V = getattr(attn, "_W_V", None)
            if W_V is None or "TransformerBridge" in _class_names(self.model):
                W_V = attn.W_V
            W_V = W_V.detach()
        n_heads, n_kv = self.info.n_heads, self.info.n_kv_heads
        if W_V.ndim != 3 or W_O.ndim != 3:
            raise ValueError(
                f"Layer {layer}: unexpected W_V {tuple(W_V.shape)} / W_O {tuple(W_O.shape)}; expected "
                "[n_kv_heads, d_model, d_head] and [n_heads, d_head, d_model]."
            )
        if W_V.shape[0] == n_heads and n_kv != n_heads:
            # An expanded W_V (e.g. a custom attention module): keep the kv heads' first copy only.
            W_V = W_V[torch.arange(n_kv) * (n_heads // n_kv)]
        if W_V.shape[0] != n_kv or W_O.shape[0] != n_heads:
            raise ValueError(
                f"Layer {layer}: W_V has {W_V.shape[0]} heads and W_O {W_O.shape[0]}, but the config says "
                f"n_key_value_heads={n_kv}, n_heads={n_heads}."
            )
        lh = LayerHeads(layer=layer, O=W_O.transpose(-1, -2).cpu(), V=W_V.cpu(), kv_head_of=self._kv.clone())
        lh.check_finite()
        return lh

    def __iter__(self) -> Iterator[LayerHeads]:
        for layer in self._attn:
            yield self.layer_heads(layer)


def head_source(model: Any, **kwargs: Any) -> HeadSource:
    """Turn a model, a loaded ``transformers`` model, or a checkpoint path into a :class:`HeadSource`.

    Args:
        model: a TransformerLens model (HookedTransformer, HookedEncoder,
            TransformerBridge), a Hugging Face ``transformers`` ``PreTrainedModel``,
            a path (``str``/``Path``) to a model directory or ``.gguf`` file, or an
            existing :class:`HeadSource` (returned as is).
        **kwargs: passed to the file/transformers sources.

    Raises:
        TypeError: an unsupported object (names what is supported).
        ValueError: a model without attention or with an inconsistent config.
    """
    if isinstance(model, HeadSource) and not _is_tl_model(model):
        return model
    if _is_tl_model(model):
        return TLModelSource(model)
    try:
        from . import sources  # checkpoint files / transformers models (optional module)
    except ImportError:  # pragma: no cover
        sources = None
    if sources is not None:
        src = sources.maybe_source(model, **kwargs)
        if src is not None:
            return src
    raise TypeError(
        f"Cannot read attention heads from a {type(model).__name__}. Supported: transformer_lens "
        "HookedTransformer / HookedEncoder / TransformerBridge, a transformers PreTrainedModel, or a path to a "
        "Hugging Face model directory (config.json + *.safetensors) or a .gguf file."
    )
