"""What a string or path names: the one rule every route uses (the report, ``compare``, ``sweep``, the CLI).

Imports no torch: the CLI resolves its arguments with it before anything heavy is loaded.

The rule (docs/api.md, "What a name means"):

* ``"zoo:NAME"`` is the zoo model NAME (an unknown NAME is refused, listing the known ones);
* a ``pathlib.Path`` (any ``os.PathLike`` that is not a ``str``) is always a path;
* a ``str`` that is both a zoo model name and an existing path is refused as ambiguous (write
  ``zoo:NAME`` for the model, ``./NAME`` or ``pathlib.Path(NAME)`` for the folder) — never guessed;
* otherwise an existing path is a path, a zoo name is the zoo model, and anything else is
  *unknown* (the caller decides: a missing path, or on the CLI a Hugging Face hub name).

A ``.safetensors`` or ``config.json`` file inside a checkpoint folder names that folder's checkpoint:
its label is the folder's name on every route (a ``.gguf`` file is its own checkpoint, labelled by
its name without the suffix).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ..errors import MissingFileError, OptionError, OptionTypeError
from .zoo import cache_dir, known_models, model_spec

__all__ = [
    "ZOO_PREFIX",
    "Named",
    "checkpoint_of",
    "missing_path_error",
    "named_inputs",
    "path_label",
    "resolve_name",
]

#: Written before a zoo name to name the zoo model whatever folders exist (``"zoo:smollm2-135m"``).
ZOO_PREFIX = "zoo:"
_CHECKPOINT_FILES = (".safetensors", ".json")


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


def missing_path_error(name: object, where: str = "model") -> MissingFileError:
    """The error for a name that is neither an existing path nor a zoo model (the same text on every route)."""
    return MissingFileError(
        f"{where}: {str(name)!r} is not an existing file or folder, nor a zoo model name "
        f"({', '.join(known_models())}); nothing is downloaded for paths."
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
