"""Where each architecture keeps its attention value (V) and output (O) weights (SPEC section 9).

ONE shipped table, ``data/architectures.json`` (see its ``_format`` entry for the format
and how to add an architecture), maps a config's ``model_type`` to the two tensor names
of one layer and their layouts. This module parses the table and a ``config.json``'s
attention sizes. Biases never enter ``T = O Vᵀ`` and are not read.
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources
from typing import Any

from ..core.heads import Sizes
from ..errors import CheckpointError, OptionError, OptionTypeError, WeightError

__all__ = [
    "architecture_table",
    "expected_shape",
    "how_to_add",
    "resolve_architecture",
    "sizes_from_config",
    "supported_architectures",
]


@lru_cache(maxsize=1)
def architecture_table() -> dict[str, Any]:
    """The shipped architecture table (``data/architectures.json``), parsed."""
    text = resources.files("tl_idempotence").joinpath("data/architectures.json").read_text(encoding="utf-8")
    return json.loads(text)


def supported_architectures() -> list[str]:
    """``model_type`` names with a table entry (aliases not included)."""
    return sorted(architecture_table()["architectures"])


def how_to_add() -> str:
    """One paragraph on the supported model types and how to add one (for error messages)."""
    t = architecture_table()
    example = json.dumps({"layer": "layers.{l}.", **{k: t["architectures"]["llama"][k] for k in ("v", "o")}})
    return (
        f"Supported model types: {', '.join(supported_architectures())} (and aliases "
        f"{', '.join(sorted(k for k in t['aliases'] if k[0].islower()))}). For a model whose attention uses the "
        "same tensor names as one of these, pass architecture='<that name>'. To add one, pass "
        f"architecture={{...}} with an entry like {example} (layouts: {', '.join(t['_format']['layouts'])}), "
        "or add it to tl_idempotence/data/architectures.json."
    )


def resolve_architecture(
    config: dict[str, Any], architecture: str | dict[str, Any] | None
) -> tuple[str, dict[str, Any]]:
    """The table entry for a config (by ``model_type``, ``architectures`` or ``text_config``), or the forced one.

    Args:
        config: a parsed ``config.json``.
        architecture: ``None`` (look it up), a table key / alias, or a custom entry dict
            ``{"layer": ..., "v": {"tensor", "layout"}, "o": {"tensor", "layout"}}``.

    Returns:
        ``(name, entry)``.

    Raises:
        OptionTypeError / OptionError: a malformed ``architecture`` argument.
        CheckpointError: no entry is known for the config (lists the supported ones).
    """
    t = architecture_table()
    archs, aliases = t["architectures"], t["aliases"]
    if isinstance(architecture, dict):
        missing = [k for k in ("layer", "v", "o") if k not in architecture]
        if missing:
            raise OptionError(f"architecture entry lacks {missing}. {how_to_add()}")
        for k in ("v", "o"):
            sub = architecture[k]
            if not isinstance(sub, dict) or not isinstance(sub.get("tensor"), str):
                raise OptionError(f"architecture['{k}'] must be {{'tensor': name, 'layout': layout}}; got {sub!r}.")
            if sub.get("layout") not in t["_format"]["layouts"]:
                raise OptionError(
                    f"architecture['{k}']['layout'] = {sub.get('layout')!r} is not a known layout. {how_to_add()}"
                )
        if not isinstance(architecture["layer"], str) or "{l}" not in architecture["layer"]:
            raise OptionError(
                f"architecture['layer'] must be a name template with '{{l}}'; got {architecture['layer']!r}."
            )
        return "custom", architecture
    if architecture is not None and not isinstance(architecture, str):
        raise OptionTypeError(
            f"architecture must be None, a model_type name or an entry dict; got {type(architecture).__name__}."
        )
    candidates: list[str] = []
    if architecture is not None:
        candidates = [architecture]
    else:
        candidates.append(str(config.get("model_type", "")))
        names = config.get("architectures")
        candidates += [str(a) for a in names] if isinstance(names, list) else []
        text = config.get("text_config")
        if isinstance(text, dict):
            candidates.append(str(text.get("model_type", "")))
    for name in candidates:
        key = aliases.get(name, name)
        if key in archs:
            return key, archs[key]
    what = (
        f"architecture={architecture!r}"
        if architecture is not None
        else (f"model_type={config.get('model_type')!r} (architectures={config.get('architectures')})")
    )
    raise CheckpointError(f"No attention-tensor layout is known for {what}. {how_to_add()}")


def sizes_from_config(config: dict[str, Any], where: str) -> Sizes:
    """Attention sizes from a parsed ``config.json`` (its ``text_config`` when multimodal).

    Raises:
        CheckpointError: a missing or non-integer size field, or inconsistent sizes (names ``where``).
    """
    if not isinstance(config, dict):
        raise CheckpointError(f"{where}: the config is a JSON {type(config).__name__}, not an object.")
    fields = architecture_table()["config_fields"]
    text = config.get("text_config")
    cfg: dict[str, Any] = text if isinstance(text, dict) else config

    def get(key: str, required: bool = True) -> int | None:
        for name in fields[key]:
            v = cfg.get(name, config.get(name))
            if v is not None:
                if isinstance(v, bool) or not isinstance(v, int):
                    raise CheckpointError(f"{where}: {name!r} = {v!r} is not an integer (it gives {key}).")
                return v
        if required:
            raise CheckpointError(f"{where}: no {key} in the config (looked for {fields[key]}).")
        return None

    n_heads = get("n_heads")
    d_model = get("d_model")
    if not n_heads or not d_model or n_heads <= 0 or d_model <= 0:
        raise CheckpointError(f"{where}: n_heads={n_heads} and d_model={d_model} must be positive integers.")
    n_kv = get("n_kv_heads", required=False) or n_heads
    d_head = get("d_head", required=False) or d_model // n_heads
    n_layers = get("n_layers")
    assert n_heads is not None and d_model is not None and n_layers is not None
    try:
        return Sizes(n_layers=n_layers, n_heads=n_heads, n_kv_heads=n_kv, d_model=d_model, d_head=d_head)
    except WeightError as e:
        raise CheckpointError(f"{where}: inconsistent attention sizes ({e})") from e


def expected_shape(layout: str, kind: str, s: Sizes) -> tuple[int, int]:
    """The stored 2-D shape of a layer's V (``kind="v"``) or O (``kind="o"``) tensor in ``layout``."""
    nq, nkv, dh, dm = s.n_heads, s.n_kv_heads, s.d_head, s.d_model
    if kind == "o":
        return {"linear": (dm, nq * dh), "conv1d": (nq * dh, dm)}[layout]
    return {
        "linear": (nkv * dh, dm),
        "fused_qkv": ((nq + 2 * nkv) * dh, dm),
        "neox_qkv": (3 * nq * dh, dm),
        "conv1d_qkv": (dm, (nq + 2 * nkv) * dh),
    }[layout]
