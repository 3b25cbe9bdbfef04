"""Where each architecture keeps its attention value (V) and output (O) weights (SPEC section 9).

ONE shipped table, ``data/architectures.json`` (see its ``_format`` entry for the format
and how to add an architecture), maps a config's ``model_type`` to the two tensor names
of one layer and their layouts. This module parses the table and a ``config.json``'s
attention sizes. Biases never enter ``T = O Vᵀ`` and are not read.
"""

from __future__ import annotations

import copy
import difflib
import json
import re
from functools import lru_cache
from importlib import resources
from typing import Any

from ..core.heads import Sizes
from ..errors import CheckpointError, OptionError, OptionTypeError, WeightError

__all__ = [
    "architecture_table",
    "attention_regex",
    "check_architecture",
    "check_entry",
    "expected_shape",
    "how_to_add",
    "layer_regex",
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


#: Keys a custom ``architecture={...}`` entry may have, and those of its ``v`` / ``o`` parts.
_ENTRY_KEYS = ("layer", "v", "o", "post_attention_norm", "note")
_PART_KEYS = ("tensor", "layout")
_V_LAYOUTS = ("linear", "fused_qkv", "neox_qkv", "conv1d_qkv")
_O_LAYOUTS = ("linear", "conv1d")


def _closest(x: str, names: list[str]) -> str:
    close = difflib.get_close_matches(x, names, n=3, cutoff=0.5)
    return f" (did you mean {', '.join(repr(c) for c in close)}?)" if close else ""


def check_entry(entry: Any, where: str = "architecture") -> dict[str, Any]:
    """Check a custom architecture entry (the ``architecture={...}`` argument, or a table entry).

    Args:
        entry: ``{"layer": "layers.{l}.", "v": {"tensor", "layout"}, "o": {"tensor", "layout"}}``
            with optional ``"post_attention_norm"`` (the name, below the layer prefix, of a norm
            applied to the attention output after ``W_O``) and ``"note"``.
        where: the argument's name, for messages.

    Returns:
        The entry (unchanged).

    Raises:
        OptionTypeError: not a dict. OptionError: a missing or unknown key (with the closest
            valid ones), a part that is not ``{"tensor": str, "layout": known layout}``, or a
            ``layer`` template without ``{l}`` or with another ``{...}`` field.
    """
    if not isinstance(entry, dict):
        raise OptionTypeError(f"{where} must be a dict entry; got {type(entry).__name__}.")
    unknown = [k for k in entry if k not in _ENTRY_KEYS]
    if unknown:
        k = str(unknown[0])
        raise OptionError(
            f"{where} has unknown key {k!r}{_closest(k, list(_ENTRY_KEYS))}; valid keys: {', '.join(_ENTRY_KEYS)}."
        )
    missing = [k for k in ("layer", "v", "o") if k not in entry]
    if missing:
        raise OptionError(f"{where} entry lacks {missing}. {how_to_add()}")
    for k in ("v", "o"):
        sub = entry[k]
        if not isinstance(sub, dict):
            raise OptionError(f"{where}['{k}'] must be {{'tensor': name, 'layout': layout}}; got {sub!r}.")
        bad = [x for x in sub if x not in _PART_KEYS]
        if bad:
            b = str(bad[0])
            raise OptionError(
                f"{where}['{k}'] has unknown key {b!r}{_closest(b, list(_PART_KEYS))}; valid: tensor, layout."
            )
        if not isinstance(sub.get("tensor"), str) or not sub["tensor"]:
            raise OptionError(f"{where}['{k}']['tensor'] must be a non-empty tensor name; got {sub.get('tensor')!r}.")
        lay = sub.get("layout")
        allowed = _V_LAYOUTS if k == "v" else _O_LAYOUTS
        if lay not in allowed:
            hint = _closest(lay, list(allowed)) if isinstance(lay, str) else ""
            raise OptionError(
                f"{where}['{k}']['layout'] = {lay!r} is not a layout of a {'value' if k == 'v' else 'output'} "
                f"tensor{hint} (valid: {', '.join(allowed)}). {how_to_add()}"
            )
    tpl = entry["layer"]
    if not isinstance(tpl, str) or tpl.count("{l}") != 1:
        raise OptionError(f"{where}['layer'] must be a name template with '{{l}}' exactly once; got {tpl!r}.")
    try:
        ok = tpl.format(l=7) == tpl.replace("{l}", "7")
    except (KeyError, IndexError, ValueError):
        ok = False
    if not ok:
        raise OptionError(
            f"{where}['layer'] = {tpl!r}: the template may hold '{{l}}' (the layer index) and no other '{{...}}'."
        )
    pan = entry.get("post_attention_norm")
    if pan is not None and (not isinstance(pan, str) or not pan):
        raise OptionError(f"{where}['post_attention_norm'] must be a tensor name below the layer prefix; got {pan!r}.")
    # A copy: a source keeps reading with the entry it was checked with, whatever the caller's dict becomes.
    return copy.deepcopy(entry)


def check_architecture(x: Any, name: str = "architecture") -> str | dict[str, Any] | None:
    """The ``architecture=`` argument, checked where it enters: ``None``, a table name or a valid entry dict.

    Raises:
        OptionTypeError: another type. OptionError: a name not in the table (with the closest
            ones and how to add one), or a malformed entry dict (see :func:`check_entry`).
    """
    if x is None:
        return None
    if isinstance(x, dict):
        return check_entry(x, name)
    if not isinstance(x, str):
        raise OptionTypeError(
            f"{name} must be None, a model_type name (str) or an entry dict; got {type(x).__name__} {x!r}."
        )
    t = architecture_table()
    archs, aliases = t["architectures"], t["aliases"]
    if aliases.get(x, x) not in archs:
        raise OptionError(
            f"{name}={x!r} is not in the architecture table{_closest(x, sorted(archs) + sorted(aliases))}. "
            f"{how_to_add()}"
        )
    return x


def resolve_architecture(
    config: dict[str, Any], architecture: Any, where: str = "the config"
) -> tuple[str, dict[str, Any]]:
    """The table entry for a config (by ``model_type``, ``architectures`` or ``text_config``), or the forced one.

    Args:
        config: a parsed ``config.json``.
        architecture: ``None`` (look it up), a table key / alias (``str``), or a custom entry
            dict (see :func:`check_entry`).
        where: the config's file (or object), for messages.

    Returns:
        ``(name, entry)``.

    Raises:
        OptionTypeError / OptionError: a malformed ``architecture`` (see :func:`check_architecture`).
        CheckpointError: the config is not an object, or no entry is known for it (lists the
            supported ones and how to add one).
    """
    t = architecture_table()
    archs, aliases = t["architectures"], t["aliases"]
    forced = check_architecture(architecture)
    if isinstance(forced, dict):
        return "custom", forced
    if forced is not None:
        key = aliases.get(forced, forced)
        return key, archs[key]
    if not isinstance(config, dict):
        raise CheckpointError(f"{where}: the config is a JSON {type(config).__name__}, not an object.")
    candidates = [str(config.get("model_type", ""))]
    names = config.get("architectures")
    candidates += [str(a) for a in names] if isinstance(names, list) else []
    text = config.get("text_config")
    if isinstance(text, dict):
        candidates.append(str(text.get("model_type", "")))
    for name in candidates:
        key = aliases.get(name, name)
        if key in archs:
            return key, archs[key]
    what = f"model_type={config.get('model_type')!r} (architectures={config.get('architectures')})"
    raise CheckpointError(f"{where}: no attention-tensor layout is known for {what}. {how_to_add()}")


def sizes_from_config(config: dict[str, Any], where: str) -> Sizes:
    """Attention sizes from a parsed ``config.json`` (its ``text_config`` when multimodal).

    Each size is read from the first of its field names (``config_fields`` of the table) that
    is present and not ``null``; it must be a positive integer (``"four"``, ``4.0``, ``true``,
    ``0`` and ``-1`` are refused, never converted). ``n_kv_heads`` defaults to ``n_heads``,
    ``d_head`` to ``d_model // n_heads`` (which must then divide evenly).

    Raises:
        CheckpointError: the config (or its ``text_config``) is not an object, a missing size,
            a value that is not a positive integer (names ``where`` and the field), or
            inconsistent sizes.
    """
    if not isinstance(config, dict):
        raise CheckpointError(f"{where}: the config is a JSON {type(config).__name__}, not an object.")
    fields = architecture_table()["config_fields"]
    text = config.get("text_config")
    if text is not None and not isinstance(text, dict):
        raise CheckpointError(f"{where}: 'text_config' is a JSON {type(text).__name__}, not an object.")
    cfg: dict[str, Any] = text if isinstance(text, dict) else config

    scopes = [("text_config.", cfg), ("", config)] if cfg is not config else [("", config)]

    def get(key: str, required: bool = True) -> int | None:
        for name in fields[key]:
            for scope, d in scopes:
                v = d.get(name)
                if v is None:  # absent, or null (HF writes null for unset optional sizes)
                    continue
                field = scope + name
                if isinstance(v, bool) or not isinstance(v, int):
                    raise CheckpointError(
                        f"{where}: {field!r} = {v!r} is a {type(v).__name__}, not an integer (it gives {key})."
                    )
                if v <= 0:
                    raise CheckpointError(f"{where}: {field!r} = {v} must be a positive integer (it gives {key}).")
                return v
        if required:
            raise CheckpointError(f"{where}: no {key} in the config (looked for {fields[key]}).")
        return None

    n_heads = get("n_heads")
    d_model = get("d_model")
    n_layers = get("n_layers")
    assert n_heads is not None and d_model is not None and n_layers is not None
    n_kv = get("n_kv_heads", required=False) or n_heads
    d_head = get("d_head", required=False)
    if d_head is None:
        if d_model % n_heads:
            raise CheckpointError(
                f"{where}: no head_dim, and d_model={d_model} is not a multiple of n_heads={n_heads}: the head "
                "size is unknown."
            )
        d_head = d_model // n_heads
    try:
        return Sizes(n_layers=n_layers, n_heads=n_heads, n_kv_heads=n_kv, d_model=d_model, d_head=d_head)
    except WeightError as e:
        raise CheckpointError(f"{where}: inconsistent attention sizes ({e})") from e


def layer_regex(root: str, entry: dict[str, Any]) -> re.Pattern[str]:
    """A pattern matching ``root + entry["layer"]`` for any layer; group 1 is the layer index."""
    pre, post = entry["layer"].split("{l}", 1)
    return re.compile(re.escape(root + pre) + r"(\d+)" + re.escape(post))


def attention_regex(entry: dict[str, Any]) -> re.Pattern[str]:
    """A pattern that finds an attention V or O tensor of ``entry`` under any root, any layer."""
    pre, post = entry["layer"].split("{l}", 1)
    tensors = "|".join(re.escape(entry[k]["tensor"]) for k in ("v", "o", "v_fused") if k in entry)
    return re.compile(r"(?:^|\.)" + re.escape(pre) + r"\d+" + re.escape(post) + f"(?:{tensors})$")


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
