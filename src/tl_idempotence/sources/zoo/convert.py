"""The zoo's built folders of a GGUF model: ``attention/`` (the attention V and O of every layer, dequantized
with the ``gguf`` package) and ``hf/`` (the fp32 Hugging Face folder ``transformers`` converts), each built in a
temporary folder, recorded with the sha256 of its files and renamed into place."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .cache import building, write_marker
from .download import ensure_files
from .registry import weights_name

__all__ = ["build_entry"]


def _build_attention(spec: dict[str, Any], files: Path, out: Path) -> None:
    """The attention V and O of every layer of the GGUF, dequantized with the ``gguf`` package (exactly the
    values transformers' GGUF loader produces), as a safetensors checkpoint in ``out`` named as the
    architecture's transformers checkpoints are (``model_type`` of the registry: ``llama`` for SmolLM2,
    ``gemma3_text`` for Gemma-3). A norm the GGUF applies after ``W_O`` (``blk.{l}.post_attention_norm``)
    is kept as ``post_attention_layernorm.weight`` (as llama.cpp stores it; never measured) so the
    report says that a norm follows ``W_O``."""
    import gguf
    import numpy as np
    import safetensors.torch
    import torch

    from ..checkpoint import from_gguf

    src = from_gguf(files / weights_name(spec))
    s = src.info
    model_type = spec["architecture"].get("model_type", "llama")
    norm = "blk.{l}.post_attention_norm.weight"
    tensors = {}
    for layer in src.layers():
        lh = src.layer_heads(layer)
        pre = f"model.layers.{layer}."
        tensors[pre + "self_attn.v_proj.weight"] = (
            lh.V.transpose(1, 2).reshape(s.n_kv_heads * s.d_head, s.d_model).contiguous()
        )
        tensors[pre + "self_attn.o_proj.weight"] = (
            lh.O.permute(1, 0, 2).reshape(s.d_model, s.n_heads * s.d_head).contiguous()
        )
        t = src.store.tensors.get(norm.format(l=layer))
        if t is not None:  # a 1-D norm weight (F32 in llama.cpp files): kept as stored
            arr = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type)
            tensors[pre + "post_attention_layernorm.weight"] = torch.from_numpy(np.array(arr, dtype=np.float32))
    safetensors.torch.save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = {
        "model_type": model_type,
        "architectures": [spec["architecture"]["hf_class"]],
        "_name_or_path": spec["name"],
        "hidden_size": s.d_model,
        "num_attention_heads": s.n_heads,
        "num_key_value_heads": s.n_kv_heads,
        "num_hidden_layers": s.n_layers,
        "head_dim": s.d_head,
        "tli_note": (
            f"Attention V (v_proj) and O (o_proj) weights only, dequantized to float32 with the gguf package "
            f"from {spec['weights']} of {spec['package']}=={spec['version']} (sha256 "
            f"{spec['members'][spec['weights']]}); nothing else of the model is here"
            + (
                ", except the norm the GGUF applies after W_O (post_attention_layernorm, as llama.cpp stores it)."
                if any(k.endswith("post_attention_layernorm.weight") for k in tensors)
                else "."
            )
        ),
    }
    (out / "config.json").write_text(json.dumps(config, indent=1), encoding="utf-8")


def _convert_gguf(files: Path, spec: dict[str, Any], out: Path) -> None:
    """Dequantize the GGUF with transformers and save an fp32 HF directory in ``out``."""
    import safetensors.torch
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    from ...core.progress import quiet_transformers

    gguf_file = Path(spec["weights"]).name
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        with quiet_transformers():  # our own bar says what is happening; no transformers bars in a notebook
            model = AutoModelForCausalLM.from_pretrained(str(files), gguf_file=gguf_file, dtype=torch.float32)
            tok = AutoTokenizer.from_pretrained(str(files), gguf_file=gguf_file)
    finally:
        hf_logging.set_verbosity(verbosity)
    cfg = model.config
    if hasattr(cfg, "quantization_config"):
        delattr(cfg, "quantization_config")
    cfg.dtype = "float32"
    if not getattr(cfg, "architectures", None):
        cfg.architectures = [spec["architecture"]["hf_class"]]
    safetensors.torch.save_model(model, str(out / "model.safetensors"), metadata={"format": "pt"})
    cfg.save_pretrained(str(out))
    tok.save_pretrained(str(out))


def build_entry(spec: dict[str, Any], root: Path, kind: str, bar: Any) -> Path:
    """Build ``<root>/<name>/<kind>`` (attention or hf) from the verified files. Caller holds the lock."""
    name = spec["name"]
    files = ensure_files(spec, root, None, bar)
    out = root / name / kind
    with building(out, spec) as tmp:
        if kind == "attention":
            bar.set_description(f"{name}: dequantizing the attention weights (once, ~5 s)")
            _build_attention(spec, files, tmp)
        else:
            bar.set_description(f"{name}: converting the GGUF to a TransformerLens-loadable folder (once, ~30 s)")
            _convert_gguf(files, spec, tmp)
        write_marker(tmp, spec, kind)
        bar.update(1)
    return out
