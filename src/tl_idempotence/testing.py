"""Test support only: tiny offline models for tests, demos and benchmarks (no hub, seeded).

This module is never imported by the library's own code (``tests/unit/test_layering.py`` checks it);
it is public so that tests, demos and users' own test suites can build small seeded models.

* :func:`tiny_tokenizer` — a word-level ``PreTrainedTokenizerFast`` (``w0 .. w{n-1}``).
* :func:`tiny_hf_dir` — writes a small random Hugging Face checkpoint directory
  (Llama/GQA by default; any ``transformers`` config class works).
* :func:`bridge_from_dir` / :func:`hooked_from_dir` — the same weights as a
  TransformerBridge and (transformer-lens 3.x only) a HookedTransformer, raw
  (no weight processing), so both classes can be compared on identical weights; both are
  loaded by the zoo's loader (:func:`~tl_idempotence.sources.zoo.loaders.model_from_dir`), as
  ``tli.models.load`` loads the real models.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from .sources.lineage import tiny_llama_config, tiny_tokenizer
from .sources.tl import bridge_from_dir
from .sources.zoo import model_from_dir

__all__ = [
    "TINY_SIZES",
    "TINY_TWEAKS",
    "bridge_from_dir",
    "hooked_from_dir",
    "ov_by_forward",
    "post_norm_by_forward",
    "tiny_hf_dir",
    "tiny_model",
    "tiny_tokenizer",
]


#: The (config, model) classes of :func:`tiny_hf_dir`'s MHA architectures (Llama: ``tiny_llama_config``).
_TINY_CLASSES = {"gpt2": ("GPT2Config", "GPT2LMHeadModel"), "bert": ("BertConfig", "BertForMaskedLM")}


def _tiny_fields(arch: str, d_model: int, n_layers: int, n_heads: int) -> dict[str, Any]:
    """The size fields of a tiny GPT-2 or BERT config, each under its config's own name."""
    if arch == "gpt2":
        return {
            "n_embd": d_model,
            "n_layer": n_layers,
            "n_head": n_heads,
            "n_positions": 128,
            "bos_token_id": 1,
            "eos_token_id": 2,
        }
    return {
        "hidden_size": d_model,
        "num_hidden_layers": n_layers,
        "num_attention_heads": n_heads,
        "intermediate_size": 2 * d_model,
        "max_position_embeddings": 128,
    }


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
        cfg = tiny_llama_config(d_model, n_layers, n_heads, n_kv_heads, vocab_size, 128, **config_kwargs)
    elif arch in _TINY_CLASSES:
        cfg = getattr(transformers, _TINY_CLASSES[arch][0])(
            **_tiny_fields(arch, d_model, n_layers, n_heads), vocab_size=vocab_size, **config_kwargs
        )
    else:
        raise ValueError(f"Unknown arch {arch!r}; use 'llama', 'gpt2' or 'bert'.")
    model = getattr(transformers, _TINY_CLASSES.get(arch, ("", "LlamaForCausalLM"))[1])(cfg)
    model.save_pretrained(path)
    tiny_tokenizer(vocab_size).save_pretrained(path)
    return path


def hooked_from_dir(path: str | Path, hf_model: Any = None):
    """HookedTransformer over a local HF directory with raw weights (transformer-lens 3.x only), on the CPU.

    Loaded by the zoo's loader (:func:`~tl_idempotence.sources.zoo.loaders.model_from_dir`, as
    ``tli.models.load(..., cls="hooked")``): TL's own config and weight conversion (``convert_hf_model_config``,
    ``get_pretrained_state_dict``) and ``load_and_process_state_dict`` with every processing step off, so its
    W_V/W_O equal the checkpoint's.

    Args:
        path: the folder (as written by :func:`tiny_hf_dir`).
        hf_model: its ``transformers`` model if already loaded (else loaded in float32).

    Raises:
        ImportError: the installed transformer-lens has no HookedTransformer (4.x).
        MissingFileError: ``path`` is not a folder.
    """
    return model_from_dir(path, "raw", "hooked", hf_model=hf_model)[0]


# ----------------------------------------------------------------------------- tiny models of any type

#: Sizes of the tiny random models :func:`tiny_model` builds (set where the config class has the field).
#: d_head * n_heads (32) != d_model (64), so a transposed or misread O cannot have the right shape.
TINY_SIZES: dict[str, Any] = {
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "num_hidden_layers": 2,
    "intermediate_size": 64,
    "vocab_size": 128,
    "max_position_embeddings": 64,
    "n_embd": 64,
    "n_head": 4,
    "n_layer": 2,
    "n_positions": 64,
    "n_inner": 64,
    "d_model": 64,
    "n_heads": 4,
    "n_layers": 2,
    "num_layers": 2,
    "num_heads": 4,
    "ffn_dim": 64,
    "d_ff": 64,
    "num_experts": 4,
    "num_local_experts": 4,
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 32,
    "expert_intermediate_size": 32,
    "image_size": 16,
    "patch_size": 8,
    "num_channels": 3,
    "sliding_window": 16,
    "pad_token_id": 0,
    "layer_types": None,
}

#: Per-model-type corrections to :data:`TINY_SIZES` (config fields whose defaults do not fit a tiny model).
TINY_TWEAKS: dict[str, dict[str, Any]] = {
    "gpt_neo": {"attention_types": [[["global", "local"], 1]], "window_size": 16},
    "gptj": {"rotary_dim": 4},
    "codegen": {"rotary_dim": 4},
    "audio-spectrogram-transformer": {"max_length": 32, "num_mel_bins": 32, "frequency_stride": 16, "time_stride": 16},
    # num_key_value_heads is what FalconConfig derives from num_kv_heads (1 under multi_query): setting it too
    # would save a config whose two fields disagree whenever a caller passes num_kv_heads
    "falcon": {"num_kv_heads": 2, "_drop": ["num_key_value_heads"]},
    "gpt_bigcode": {"_drop": ["num_key_value_heads"]},  # derived from multi_query
    "falcon_h1": {"mamba_d_ssm": 64, "mamba_n_heads": 8, "mamba_d_state": 16, "mamba_chunk_size": 16},
    "qwen2_audio": {"audio_config": {"d_model": 64, "encoder_attention_heads": 4, "encoder_layers": 1}},
    "phi3": {"pad_token_id": 0},
    "distilbert": {"dim": 64, "hidden_dim": 64, "n_heads": 4, "n_layers": 2},
    "modernbert": {"global_attn_every_n_layers": 1},
}


def _shrink(cfg: Any, tweaks: dict[str, Any]) -> dict[str, Any]:
    import transformers

    out: dict[str, Any] = {}
    fields = cfg.to_dict()  # the fields a saved config.json of this type has (no aliases, no properties)
    drop = set(tweaks.get("_drop", ()))
    for k, v in {**TINY_SIZES, **tweaks}.items():
        if k == "_drop" or k in drop:
            continue
        if k in tweaks or k in fields:
            out[k] = v
    for k, v in list(cfg.__dict__.items()):
        if isinstance(v, transformers.PretrainedConfig):
            sub = v.to_dict()
            sub.update(_shrink(v, tweaks.get(k, {}) if isinstance(tweaks.get(k), dict) else {}))
            out[k] = sub
    return out


def tiny_model(model_type: str, hf_class: str, seed: int = 0, **config: Any) -> Any:
    """A tiny random ``transformers`` model of ``model_type`` built as class ``hf_class`` (float32, eval mode).

    The config is the type's default config with :data:`TINY_SIZES` and :data:`TINY_TWEAKS` applied
    (only fields the config class has), then ``config``; every parameter then gets seeded noise
    (std 0.02) so that no two tensors are equal (norm weights start as ones). Raises whatever
    ``transformers`` raises for a config it cannot build.
    """
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    cls = CONFIG_MAPPING[model_type]
    kw = _shrink(cls(), TINY_TWEAKS.get(model_type, {}))
    kw.update(config)
    cfg = cls(**kw)
    torch.manual_seed(seed)
    model = getattr(transformers, hf_class)(cfg).float().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.02 * torch.randn_like(p))
    return model


def _forward_inputs(model: Any, batch: int) -> dict[str, torch.Tensor]:
    cfg = model.config
    g = torch.Generator().manual_seed(0)
    dt = next(model.parameters()).dtype
    if model.main_input_name == "pixel_values":
        image = (batch, cfg.num_channels, cfg.image_size, cfg.image_size)
        return {"pixel_values": torch.randn(*image, generator=g, dtype=torch.float64).to(dt)}
    if model.main_input_name == "input_values":
        bins = getattr(cfg, "num_mel_bins", None)
        audio = (batch, cfg.max_length, bins) if bins else (batch, 400)
        return {"input_values": torch.randn(*audio, generator=g, dtype=torch.float64).to(dt)}
    text = getattr(cfg, "text_config", None) or cfg
    vocab = int(getattr(text, "vocab_size", 100) or 100)
    return {"input_ids": torch.randint(4, min(vocab, 100), (batch, 1), generator=g)}  # one position: weight 1


def ov_by_forward(model: Any, v_module: str, o_module: str, n_heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Every head's value read and output write of one layer, measured by running the model (float64).

    Independent of any tensor-layout convention: a forward pass is run with the input of the
    module that computes the values (``v_module``: a V projection, or a fused QKV projection)
    replaced by the basis vectors ``e_1 .. e_d`` (and 0), the same vector at every position, so
    each position's attention mix of values is exactly ``V_hᵀ e_b + b_V`` (attention weights sum
    to 1; text models get one position, so the one weight is exactly 1, and attention runs as sdpa
    in float64 where the model allows it); the input of ``o_module`` (the output projection) is
    captured and cut into ``n_heads`` contiguous head blocks. ``O_h`` is ``o_module`` applied to the
    basis of head ``h``'s block, minus its bias. Attention sinks (a ``sinks`` parameter) are set
    to -1e4 first so that the weights sum to 1.

    Args:
        model: a ``transformers`` model (converted to float64 in place).
        v_module, o_module: module paths (``model.named_modules()`` names).
        n_heads: query heads of the layer.

    Returns:
        ``(V, O)``, each ``[n_heads, d_model, d_head]`` float64 (column form: ``T_h = O[h] @ V[h].T``).

    Raises:
        RuntimeError: a hook did not fire, or the value input is not ``[batch, pos, d_model]``.
    """
    model.double().eval()
    # grouped_mm has no float64 kernel; eager attention takes its softmax in float32 (weights that sum to 1
    # only within 1e-7 where several positions are mixed), sdpa in float64.
    for impl, value in (("set_experts_implementation", "eager"), ("set_attn_implementation", "sdpa")):
        try:
            getattr(model, impl)(value)
        except Exception:  # noqa: BLE001 - a model without that switch (or that value) runs as it is
            pass
    mods = dict(model.named_modules())
    vm, om = mods[v_module], mods[o_module]
    for name, p in model.named_parameters():
        if name.rsplit(".", 1)[-1] == "sinks":
            with torch.no_grad():
                p.fill_(-1e4)
    d = int(vm.weight.shape[-1] if type(vm).__name__ != "Conv1D" else vm.weight.shape[0])
    batch = d + 1
    basis = torch.zeros(batch, d, dtype=torch.float64)
    basis[:d] = torch.eye(d, dtype=torch.float64)
    seen: dict[str, torch.Tensor] = {}

    def replace(_m: Any, args: tuple, kwargs: dict) -> Any:
        x = args[0] if args else kwargs["hidden_states"]
        if x.ndim != 3 or x.shape[0] != batch or x.shape[-1] != d:
            raise RuntimeError(f"value input of {v_module} has shape {tuple(x.shape)}, not [{batch}, pos, {d}]")
        new = basis[:, None, :].expand(batch, x.shape[1], d).contiguous()
        if args:
            return (new, *args[1:]), kwargs
        return args, {**kwargs, "hidden_states": new}

    def capture(_m: Any, args: tuple) -> None:
        seen.setdefault("z", args[0].detach())

    h1 = vm.register_forward_pre_hook(replace, with_kwargs=True)
    h2 = om.register_forward_pre_hook(capture)
    default = torch.get_default_dtype()
    try:
        # float64 default: XGLM builds its mask fill value with torch.full((), finfo(float64).min)
        torch.set_default_dtype(torch.float64)
        with torch.no_grad():
            model(**_forward_inputs(model, batch))
    finally:
        torch.set_default_dtype(default)
        h1.remove()
        h2.remove()
    if "z" not in seen:
        raise RuntimeError(f"{o_module} was not called in the forward pass")
    z = seen["z"]
    z = z[:, 0] if z.ndim == 3 else z
    width = z.shape[-1]
    dh = width // n_heads
    V = (z[:d] - z[d]).reshape(d, n_heads, dh).permute(1, 0, 2).contiguous()
    with torch.no_grad():
        E = torch.eye(width, dtype=torch.float64)
        out = om(E) - om(torch.zeros(1, width, dtype=torch.float64))
    O = out.reshape(n_heads, dh, -1).transpose(1, 2).contiguous()
    return V, O


def post_norm_by_forward(model: Any, layer_module: str, o_module: str) -> str | None:
    """The norm module of a layer whose input is the attention output projection's output, if any.

    Runs the model once and compares, by value, the output of ``o_module`` with the input of every
    module of ``layer_module`` whose class name contains ``Norm``: equality means a norm is applied
    to the attention output after ``W_O``, before the residual add (Gemma-2/3, OLMo-2). Returns its
    path relative to ``layer_module`` (``"post_attention_layernorm"``), or ``None``.
    """
    mods = dict(model.named_modules())
    layer, om = mods[layer_module], mods[o_module]
    seen: dict[str, list[torch.Tensor]] = {"o": []}
    hooks = [om.register_forward_hook(lambda _m, _a, out: seen["o"].append(out.detach()))]
    norms = {n: m for n, m in layer.named_modules() if n and "Norm" in type(m).__name__}
    for n, m in norms.items():
        seen[n] = []
        hooks.append(m.register_forward_pre_hook(lambda _m, args, n=n: seen[n].append(args[0].detach())))
    default = torch.get_default_dtype()
    try:
        torch.set_default_dtype(next(model.parameters()).dtype)
        with torch.no_grad():
            model(**_forward_inputs(model, 3))
    finally:
        torch.set_default_dtype(default)
        for h in hooks:
            h.remove()
    if not seen["o"]:
        raise RuntimeError(f"{o_module} was not called in the forward pass")
    out = seen["o"][0]
    for n in norms:
        if any(x.shape == out.shape and torch.equal(x, out) for x in seen[n]):
            return n
    return None
