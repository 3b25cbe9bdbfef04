"""What a string or path names: the one rule every route uses (the report, ``compare``, ``sweep``, the CLI).

Imports no torch: the CLI resolves its arguments with it before anything heavy is loaded.

The rule (docs/api.md, "What a name means"):

* ``"zoo:NAME"`` is the zoo model NAME (an unknown NAME is refused, listing the known ones);
* a ``pathlib.Path`` (any ``os.PathLike`` that is not a ``str``) is always a path;
* a ``str`` that is both a zoo model name and an existing path is refused as ambiguous (write
  ``zoo:NAME`` for the model, ``./NAME`` or ``pathlib.Path(NAME)`` for the folder) — never guessed;
* otherwise an existing path is a path, a zoo name is the zoo model, and anything else is
  *unknown* (the caller decides: the API refuses it as a missing path; the CLI tries it on the Hugging Face
  hub only when it is a plausible hub id, ``owner/name`` (:func:`is_hub_id`), and the hub is not switched
  off (:func:`hub_offline`) or the model is in the local Hugging Face cache (:func:`in_hub_cache`)).

A name that is none of these is refused with the nearest zoo names (:func:`close_zoo_names`), before any
network or hub attempt.

A ``.safetensors`` or ``config.json`` file inside a checkpoint folder names that folder's checkpoint:
its label is the folder's name on every route (a ``.gguf`` file is its own checkpoint, labelled by
its name without the suffix).
"""

from __future__ import annotations

import difflib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ..errors import MissingFileError, OptionError, OptionTypeError
from .zoo import cache_dir, known_models, model_spec

__all__ = [
    "ZOO_PREFIX",
    "Named",
    "checkpoint_of",
    "close_zoo_names",
    "hub_offline",
    "in_hub_cache",
    "is_hub_id",
    "known_and_close",
    "missing_path_error",
    "named_inputs",
    "path_label",
    "resolve_name",
]

#: Written before a zoo name to name the zoo model whatever folders exist (``"zoo:smollm2-135m"``).
ZOO_PREFIX = "zoo:"
_CHECKPOINT_FILES = (".safetensors", ".json")
# A Hugging Face hub repo id as the hub accepts it: "owner/name", each part letters, digits, "-", "_", "."
# (not first), at most 96 characters; "--" and ".." are not allowed (huggingface_hub.utils.validate_repo_id).
_HUB_PART = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,95}"
_HUB_ID = re.compile(rf"{_HUB_PART}/{_HUB_PART}")
_PATH_SUFFIXES = (".gguf", ".safetensors", ".json", ".bin", ".pt", ".pth")
_TRUE = ("1", "on", "yes", "true")


@dataclass(frozen=True)
class Named:
    """What a name resolved to.

    Attributes:
        kind: ``"zoo"`` (``value`` is the zoo name), ``"path"`` (``value`` is the ``Path``, user-expanded;
            it may not exist when a ``Path`` object was given) or ``"unknown"`` (``value`` is the string).
        value: the zoo name, the path or the string as given.
    """

    kind: Literal["zoo", "path", "unknown"]
    value: str | Path


def resolve_name(name: str | os.PathLike[str], where: str = "model") -> Named:
    """Decide what ``name`` names, by the one rule of this module's docstring.

    Args:
        name: a zoo name, ``"zoo:NAME"``, a path string or an ``os.PathLike``.
        where: how errors name the argument (``"model"``, ``"items['a']"``, ``"ITEM"``).

    Raises:
        OptionTypeError: ``name`` is not a ``str`` or ``os.PathLike``.
        UnknownModelError: ``"zoo:NAME"`` with an unknown NAME (lists the known ones).
        OptionError: a ``str`` that is both a zoo name and an existing path (ambiguous).
    """
    if isinstance(name, str):
        if name.startswith(ZOO_PREFIX):
            model_spec(name[len(ZOO_PREFIX) :])  # UnknownModelError naming the known models
            return Named("zoo", name[len(ZOO_PREFIX) :])
        p = Path(name).expanduser()
        zoo = name in known_models()
        exists = os.path.lexists(p)  # a dangling link or a link loop is a path (the file route says what it is)
        if zoo and exists:
            raise OptionError(
                f"{where}: {name!r} is both a zoo model name and an existing path ({p.name}/ here). Write "
                f"{ZOO_PREFIX + name!r} for the zoo model, or './{name}' (or pathlib.Path({name!r})) for the folder."
            )
        if exists:
            return Named("path", p)
        if zoo:
            return Named("zoo", name)
        return Named("unknown", name)
    if isinstance(name, os.PathLike):
        return Named("path", Path(name).expanduser())
    raise OptionTypeError(f"{where} must be a str or a path; got {type(name).__name__}.")


def close_zoo_names(name: str, n: int = 3) -> list[str]:
    """The zoo model names nearest to ``name`` (``difflib``, case-folded, at most ``n``, best first; ``[]`` when
    none is close): ``close_zoo_names("smollm2-13m") == ["smollm2-135m"]``. A ``"zoo:"`` prefix is ignored.
    Reads no file but the package's registry; raises nothing."""
    s = str(name)
    s = s[len(ZOO_PREFIX) :] if s.startswith(ZOO_PREFIX) else s
    s = s.rsplit("/", 1)[-1].lower()  # "HuggingFaceTB/SmolLM2-135" -> "smollm2-135"
    by_lower = {m.lower(): m for m in known_models()}
    return [by_lower[m] for m in difflib.get_close_matches(s, list(by_lower), n=n, cutoff=0.6)]


def known_and_close(name: str) -> str:
    """The zoo names for a message about ``name``: ``"gemma-3-270m, minilm-l6, smollm2-135m; did you mean
    'smollm2-135m'?"`` (every known name, then the nearest, :func:`close_zoo_names`, when one is close). Raises
    nothing."""
    close = close_zoo_names(name)
    hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    return ", ".join(known_models()) + hint


def is_hub_id(name: str) -> bool:
    """Whether ``name`` is a plausible Hugging Face hub model id, ``owner/name`` (``"HuggingFaceTB/SmolLM2-135M"``):
    exactly one ``/``, each part of letters, digits, ``-``, ``_`` and ``.`` (not first, no ``--`` or ``..``,
    at most 96 characters), not a file name (``.gguf``, ``.safetensors``, ``.json``, ``.bin``, ``.pt``).
    A bare name (``"gpt2"``) is not one: the hub's own short names are written in full
    (``"openai-community/gpt2"``), so a mistyped zoo name is never sent to the network. Raises nothing."""
    return (
        isinstance(name, str)
        and _HUB_ID.fullmatch(name) is not None
        and "--" not in name
        and ".." not in name
        and not name.lower().endswith(_PATH_SUFFIXES)
    )


def hub_offline() -> str | None:
    """The environment variable that switches the Hugging Face hub off in this process, ``"HF_HUB_OFFLINE"`` or
    ``"TRANSFORMERS_OFFLINE"`` (set to 1/on/yes/true, case-insensitive, as huggingface_hub reads them), else
    ``None``. Raises nothing."""
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        if os.environ.get(var, "").strip().lower() in _TRUE:
            return var
    return None


def in_hub_cache(repo_id: str, cache_dir: str | os.PathLike[str] | None = None) -> bool:
    """Whether the local Hugging Face cache (``cache_dir``, default huggingface_hub's ``HF_HUB_CACHE``) holds a
    snapshot of model ``repo_id`` with its ``config.json`` (``huggingface_hub.try_to_load_from_cache``: reads the
    cache folder, never the network). ``False`` when huggingface_hub is not installed, the cache cannot be read or
    ``repo_id`` is not a hub id (:func:`is_hub_id`). Raises nothing."""
    if not is_hub_id(repo_id):
        return False
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:  # pragma: no cover - transformers brings it
        return False
    try:
        hit = try_to_load_from_cache(repo_id, "config.json", cache_dir=None if cache_dir is None else Path(cache_dir))
    except (OSError, ValueError):  # a cache folder that cannot be read is not a cached model
        return False
    return isinstance(hit, str) and os.path.isfile(hit)


def missing_path_error(name: object, where: str = "model") -> MissingFileError:
    """The error for a name that is neither an existing path nor a zoo model (the same text on every route):
    names the nearest zoo models (:func:`close_zoo_names`) and every known one."""
    return MissingFileError(
        f"{where}: {str(name)!r} is not an existing file or folder, nor a zoo model name "
        f"({known_and_close(str(name))}); nothing is downloaded for paths."
    )


def checkpoint_of(p: Path) -> Path:
    """The checkpoint a path names: a ``.safetensors``/``config.json`` file names its folder; any other path
    names itself. Raises nothing."""
    p = Path(p)
    return p.parent if not p.is_dir() and p.suffix.lower() in _CHECKPOINT_FILES else p


def named_inputs(named: Named) -> list[tuple[str, Path]]:
    """What a run over ``named`` reads, as ``(what, path)`` pairs for
    :func:`~tl_idempotence.core.files.refuse_outputs_over_inputs`: a zoo model reads the zoo cache
    (:func:`~tl_idempotence.sources.zoo.cache_dir`); a path reads its checkpoint (:func:`checkpoint_of`: the
    folder of a ``.safetensors``/``config.json`` file, else the folder or file itself); an unknown name
    reads nothing here. Reads no file."""
    if named.kind == "zoo":
        return [("the zoo cache", cache_dir())]
    if named.kind == "path":
        return [("the checkpoint", checkpoint_of(Path(named.value)))]
    return []


def path_label(p: Path) -> str:
    """The label of a checkpoint path: a folder's name; for a ``.safetensors``/``config.json`` file inside a
    checkpoint folder, that folder's name (:func:`checkpoint_of`); a ``.gguf`` file's name without the suffix."""
    p = Path(p).absolute()
    if p.is_dir():
        return p.name
    if p.suffix.lower() in _CHECKPOINT_FILES:
        return checkpoint_of(p).name
    if p.suffix.lower() == ".gguf":
        return p.stem
    return p.name
