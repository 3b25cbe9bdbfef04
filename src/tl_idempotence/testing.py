"""Test support only: tiny offline models for tests, demos and benchmarks (no hub, seeded).

This module is never imported by the library's own code (``tests/test_layering.py`` checks it);
it is public so that tests, demos and users' own test suites can build small seeded models.

* :func:`tiny_tokenizer` — a word-level ``PreTrainedTokenizerFast`` (``w0 .. w{n-1}``).
* :func:`tiny_hf_dir` — writes a small random Hugging Face checkpoint directory
  (Llama/GQA by default; any ``transformers`` config class works).
* :func:`bridge_from_dir` / :func:`hooked_from_dir` — the same weights as a
  TransformerBridge and (transformer-lens 3.x only) a HookedTransformer, raw
  (no weight processing), so both classes can be compared on identical weights.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from .sources.lineage import tiny_tokenizer
from .sources.tl import bridge_from_dir

__all__ = ["bridge_from_dir", "hooked_from_dir", "tiny_hf_dir", "tiny_tokenizer"]


def tiny_hf_dir(
    path: str | Path,
    arch: str = "llama",
    n_layers: int = 2,
    d_model: int = 72,
    n_heads: int = 9,
    n_kv_heads: int = 3,
    vocab_size: int = 100,
    seed: int = 0,
    **config_kwargs: Any,
) -> Path:
    """Write a random HF checkpoint directory (config.json, model.safetensors, tokenizer).

    Args:
        path: directory to create. Avoid model-family words ("llama", "gpt2", ...) in its
            name: transformer-lens 3.x dispatches on substrings of the name.
        arch: "llama" (GQA via ``n_kv_heads``), "gpt2" or "bert" (MHA).
        n_layers, d_model, n_heads, n_kv_heads, vocab_size: sizes; ``d_head = d_model // n_heads``.
        seed: torch seed for the random init.
        **config_kwargs: extra fields for the transformers config.

    Returns:
        The directory path.
    """
    import transformers

    cfg: Any
    model: Any

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    if arch == "llama":
        cfg = transformers.LlamaConfig(
            hidden_size=d_model,
            intermediate_size=2 * d_model,
            num_hidden_layers=n_layers,
            num_attention_heads=n_heads,
            num_key_value_heads=n_kv_heads,
            vocab_size=vocab_size,
            max_position_embeddings=128,
            bos_token_id=1,
            eos_token_id=2,
            pad_token_id=3,
            **config_kwargs,
        )
        model = transformers.LlamaForCausalLM(cfg)
    elif arch == "gpt2":
        cfg = transformers.GPT2Config(
            n_embd=d_model,
            n_layer=n_layers,
            n_head=n_heads,
            vocab_size=vocab_size,
            n_positions=128,
            bos_token_id=1,
            eos_token_id=2,
            **config_kwargs,
        )
        model = transformers.GPT2LMHeadModel(cfg)
    elif arch == "bert":
        cfg = transformers.BertConfig(
            hidden_size=d_model,
            num_hidden_layers=n_layers,
            num_attention_heads=n_heads,
            intermediate_size=2 * d_model,
            vocab_size=vocab_size,
            max_position_embeddings=128,
            **config_kwargs,
        )
        model = transformers.BertForMaskedLM(cfg)
    else:
        raise ValueError(f"Unknown arch {arch!r}; use 'llama', 'gpt2' or 'bert'.")
    model.save_pretrained(path)
    tiny_tokenizer(vocab_size).save_pretrained(path)
    return path


def hooked_from_dir(path: str | Path, hf_model: Any = None):
    """HookedTransformer over a local HF directory with raw weights (transformer-lens 3.x only).

    Uses TL's own config and weight conversion (``convert_hf_model_config``,
    ``get_pretrained_state_dict``) and ``load_and_process_state_dict`` with every
    processing step off, so its W_V/W_O equal the checkpoint's.

    Raises:
        ImportError: the installed transformer-lens has no HookedTransformer (4.x).
    """
    try:
        import transformer_lens.loading_from_pretrained as lfp
        from transformer_lens import HookedTransformer, HookedTransformerConfig
    except ImportError as e:  # pragma: no cover - TL 4.x
        raise ImportError("HookedTransformer needs transformer-lens 3.x; use bridge_from_dir on 4.x.") from e
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = str(path)
    cd = lfp.convert_hf_model_config(path)
    fields = HookedTransformerConfig.__dataclass_fields__
    cfg = HookedTransformerConfig(**{k: v for k, v in cd.items() if k in fields})
    hf = hf_model if hf_model is not None else AutoModelForCausalLM.from_pretrained(path)
    sd = lfp.get_pretrained_state_dict(path, cfg, hf_model=hf)
    model = HookedTransformer(cfg, tokenizer=AutoTokenizer.from_pretrained(path))
    model.load_and_process_state_dict(
        sd,
        fold_ln=False,
        center_writing_weights=False,
        center_unembed=False,
        fold_value_biases=False,
        refactor_factored_attn_matrices=False,
    )
    model.eval()
    return model
