"""TransformerLens models as head sources (HookedTransformer, HookedEncoder, TransformerBridge).

* ``HookedTransformer`` / ``HookedEncoder`` (transformer-lens 3.x): GQA/MQA value heads
  are read unexpanded from ``blocks[l].attn._W_V``.
* ``TransformerBridge`` (3.x and 4.x): its per-block ``attn.W_V`` is already unexpanded
  ``[n_kv_heads, d_model, d_head]``.

Query head ``h`` reads kv head ``h // (n_heads // n_kv_heads)``, the ``repeat_interleave``
layout TransformerLens itself uses — taken from the configuration, never by comparing
floats. Weights stay on the model's device (a model on a GPU is read one layer at a time,
never copied whole to the CPU). Nothing here imports transformer_lens: models are
recognised by class name.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from ..core.files import shareable_name
from ..core.heads import LayerHeads, ModelInfo, kv_layout
from ..errors import UnsupportedModelError, WeightError
from .architectures import architecture_table
from .checkpoint import is_transformers_model, transformers_post_attention_note

__all__ = [
    "TL_CLASSES",
    "TLModelSource",
    "attention_layers",
    "bridge_from_dir",
    "is_causal_lm",
    "is_tl_model",
    "tl_post_attention_note",
    "tl_processing",
]

#: TransformerLens model classes this package reads (by name, through the MRO).
TL_CLASSES = ("HookedTransformer", "HookedEncoder", "HookedEncoderDecoder", "TransformerBridge")


def _class_names(obj: Any) -> list[str]:
    return [c.__name__ for c in type(obj).__mro__]


def is_tl_model(model: Any) -> bool:
    """Whether ``model`` is a TransformerLens model (checked by class name; transformer_lens is not imported)."""
    return any(n in TL_CLASSES for n in _class_names(model))


def is_causal_lm(model: Any) -> bool:
    """Whether a TransformerLens model attends causally (a position sees itself and earlier positions only).

    ``HookedEncoder``/``HookedEncoderDecoder`` are not; a ``TransformerBridge`` is when the ``transformers`` model
    it wraps can generate (``can_generate()``: a BERT-like ``BertModel``/``BertForMaskedLM`` cannot); otherwise
    the config's ``attention_dir`` (``"causal"`` unless it says ``"bidirectional"``). Raises nothing.
    """
    names = _class_names(model)
    if "HookedEncoder" in names or "HookedEncoderDecoder" in names:
        return False
    if "TransformerBridge" in names:
        hf = model.__dict__.get("original_model", None) or getattr(model, "original_model", None)
        can = getattr(hf, "can_generate", None)
        if callable(can):
            try:
                return bool(can())
            except Exception:  # noqa: BLE001 - a model that cannot say: read the config below
                pass
    return getattr(getattr(model, "cfg", None), "attention_dir", "causal") == "causal"


def attention_layers(model: Any) -> list[int]:
    """Indices ``l`` of ``model.blocks`` whose ``attn`` has a ``W_O`` (the layers with an OV circuit)."""
    blocks = getattr(model, "blocks", None)
    if blocks is None:
        return []
    return [i for i, b in enumerate(blocks) if getattr(b, "attn", None) is not None and hasattr(b.attn, "W_O")]


def tl_processing(model: Any) -> dict[str, Any]:
    """Best-effort record of TransformerLens weight processing (SPEC section 10).

    A model from :func:`tl_idempotence.models.load` carries its exact record
    (``model._tli_processing``); otherwise the flags are read from the TransformerBridge
    (``_weights_processed``) or the HookedTransformer config (``normalization_type`` LNPre/RMSPre
    means fold_ln), and ``center_writing_weights`` is inferred from layer-0 ``W_O`` row means
    (TransformerLens keeps no flag for it). Whether the attention output passes through a norm
    after ``W_O`` is :func:`tl_post_attention_note` (the source's ``info.extra``).
    """
    recorded = getattr(model, "_tli_processing", None)
    live = _live_processing(model)
    if isinstance(recorded, dict):
        out = dict(recorded)
        if out.get("raw") and not live["raw"]:
            # Processed after tli.models.load (enable_compatibility_mode, process_weights_, ...):
            # the record of raw weights no longer describes what is measured.
            out.update(live)
            out["stale_record"] = (
                "the model was loaded with raw weights, but its weights were processed since "
                f"({'fold_ln' if live.get('fold_ln') else 'centred W_O'}): these flags are read from the model now"
            )
        return out
    return live


def _live_processing(model: Any) -> dict[str, Any]:
    """The processing flags read from the model itself (see :func:`tl_processing`)."""
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
    try:
        W_O = model.blocks[attention_layers(model)[0]].attn.W_O.detach().double()
        rel = (W_O.mean(-1).abs().max() / W_O.pow(2).mean().sqrt().clamp_min(1e-300)).item()
        out["center_writing_weights"] = bool(rel < 1e-6)
        out["center_writing_weights_note"] = "inferred from layer-0 W_O row means (TL records no flag)"
    except Exception:  # noqa: BLE001 - informational only  # pragma: no cover
        out["center_writing_weights"] = None
    out["raw"] = not out.get("fold_ln") and not out.get("center_writing_weights")
    return out


def tl_post_attention_note(model: Any) -> str | None:
    """Whether a norm follows ``W_O`` in a TransformerLens model: the same rule as for its checkpoint files.

    * TransformerBridge: the wrapped ``transformers`` model's parameters and the architecture table
      (:func:`~tl_idempotence.sources.checkpoint.transformers_post_attention_note`), so a bridge of a
      Gemma-2/3 or OLMo-2 model carries the note its checkpoint folder gives (bridge configs do not set
      ``use_normalization_before_and_after``);
    * otherwise (HookedTransformer, or a bridge of a type the table lacks) the blocks' modules: a
      ``blocks[l].ln1_post`` norm (Gemma-2/3 in TransformerLens), or, where the config's
      ``original_architecture`` has a table entry with a post-attention norm (OLMo-2, whose
      ``post_attention_layernorm`` TransformerLens applies as ``ln1`` after attention), ``blocks[l].ln1``.

    Returns:
        The note (``"the attention output passes through a norm after W_O (...)"``) or ``None``.
    """
    if "TransformerBridge" in _class_names(model):
        hf = model.__dict__.get("original_model")
        if hf is not None and is_transformers_model(hf):
            known, note = transformers_post_attention_note(hf)
            if known:
                return note
    blocks = list(getattr(model, "blocks", None) or [])
    n = len(blocks)
    where = [l for l, b in enumerate(blocks) if isinstance(getattr(b, "ln1_post", None), torch.nn.Module)]
    what = "ln1_post"
    if not where:
        arch = getattr(model.cfg, "original_architecture", None) or getattr(model.cfg, "architecture", None)
        t = architecture_table()
        entry = t["architectures"].get(t["aliases"].get(str(arch), str(arch)))
        if entry is not None and entry.get("post_attention_norm"):
            where = [l for l, b in enumerate(blocks) if isinstance(getattr(b, "ln1", None), torch.nn.Module)]
            what = f"ln1, {arch}'s {entry['post_attention_norm'].removesuffix('.weight')}"
    if not where:
        return None
    layers = "every layer" if len(where) == n else f"{len(where)} of {n} layers ({where[:8]})"
    return f"the attention output passes through a norm after W_O ('blocks.{where[0]}.{what}', {layers})"


class TLModelSource:
    """Streams :class:`~tl_idempotence.core.heads.LayerHeads` from a TransformerLens model
    (HookedTransformer, HookedEncoder or TransformerBridge), one layer at a time, on the
    model's device.

    Raises:
        UnsupportedModelError: not a TransformerLens model, or one without attention layers.
        WeightError: a config inconsistent with the weights (e.g. ``n_heads`` not a multiple
            of ``n_key_value_heads``, or ``W_V`` with another number of heads).
    """

    def __init__(self, model: Any):
        if not is_tl_model(model):
            raise UnsupportedModelError(f"TLModelSource needs a TransformerLens model; got {type(model).__name__}.")
        if "HookedEncoderDecoder" in _class_names(model):
            raise UnsupportedModelError(
                "HookedEncoderDecoder (T5-style) is not supported: its attention layers live in model.encoder and "
                "model.decoder (with cross-attention), not in model.blocks. Measure the checkpoint's files instead "
                "(idempotence_report(path, architecture=...) with an architecture entry for its layers)."
            )
        self.model = model
        cfg = model.cfg
        self._attn = attention_layers(model)
        if not self._attn:
            raise UnsupportedModelError(
                f"{type(model).__name__} has no attention layers (no blocks[l].attn with W_O): "
                "there is no OV circuit to measure."
            )
        n_heads = int(cfg.n_heads)
        n_kv = int(getattr(cfg, "n_key_value_heads", None) or n_heads)
        self._kv = kv_layout(n_heads, n_kv)
        extra: dict[str, Any] = {}
        note = tl_post_attention_note(model)
        if note:
            extra["post_attention_norm"] = note
        self.info = ModelInfo(
            n_layers=int(cfg.n_layers),
            n_heads=n_heads,
            n_kv_heads=n_kv,
            d_model=int(cfg.d_model),
            d_head=int(cfg.d_head),
            model_name=shareable_name(str(getattr(cfg, "model_name", None) or type(model).__name__)),
            model_class=type(model).__name__,
            processing=tl_processing(model),
            extra=extra,
        )

    def layers(self) -> Iterator[int]:
        """The attention layer indices."""
        return iter(self._attn)

    def layer_heads(self, layer: int) -> LayerHeads:
        """One layer's O (``= W_Oᵀ``) and unexpanded V, on the model's device.

        Raises:
            IndexError: not an attention layer. WeightError: shapes inconsistent with the config.
        """
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
            raise WeightError(
                f"Layer {layer}: unexpected W_V {tuple(W_V.shape)} / W_O {tuple(W_O.shape)}; expected "
                "[n_kv_heads, d_model, d_head] and [n_heads, d_head, d_model]."
            )
        if W_V.shape[0] == n_heads and n_kv != n_heads:
            # An expanded W_V (e.g. a custom attention module): keep one copy per kv head, after
            # checking that every query head's W_V is exactly its kv head's (TransformerLens expands
            # with repeat_interleave; any other layout would pair heads with the wrong V).
            kv = self._kv.to(W_V.device)
            first = torch.stack([(kv == k).nonzero()[0, 0] for k in range(n_kv)])
            kept = W_V[first]
            if not torch.equal(W_V, kept[kv]):
                bad = [h for h in range(n_heads) if not torch.equal(W_V[h], kept[kv[h]])]
                raise WeightError(
                    f"Layer {layer}: W_V is expanded to {n_heads} heads, but heads {bad[:10]} differ from the "
                    f"first head of their kv group (kv_head_of = {kv.tolist()}); the GQA layout of this model "
                    "is not the one its config gives (n_key_value_heads), so the value heads cannot be paired."
                )
            W_V = kept
        if W_V.shape[0] != n_kv or W_O.shape[0] != n_heads:
            raise WeightError(
                f"Layer {layer}: W_V has {W_V.shape[0]} heads and W_O {W_O.shape[0]}, but the config says "
                f"n_key_value_heads={n_kv}, n_heads={n_heads}."
            )
        return LayerHeads(layer=layer, O=W_O.transpose(-1, -2), V=W_V, kv_head_of=self._kv.clone())

    def __iter__(self) -> Iterator[LayerHeads]:
        for layer in self._attn:
            yield self.layer_heads(layer)


def bridge_from_dir(path: Any, **kwargs: Any) -> Any:
    """A local HF directory as a TransformerBridge with its raw weights (no processing), loaded by the zoo's
    loader (:func:`~tl_idempotence.sources.zoo.loaders.model_from_dir`): ``device`` defaults to ``"cpu"``, other
    keywords go to ``TransformerBridge.boot_transformers``. Imports transformer_lens.

    Raises:
        MissingFileError: ``path`` is not a folder. OptionTypeError / OptionError / DeviceError: a bad argument.
    """
    from .zoo.loaders import model_from_dir

    device = kwargs.pop("device", "cpu")
    return model_from_dir(path, "raw", "bridge", device=device, **kwargs)[0]
