"""File helpers every layer shares: sha256 of files and bytes, atomic writes, JSON that names its file.

* :func:`sha256_file` — streamed hex sha256 (optionally of the first ``limit`` bytes).
* :func:`atomic_write_bytes` / :func:`atomic_write_text` — write a temp file in the same
  directory, ``fsync``, ``os.replace``: a file with its final name is always complete.
* :func:`read_json` — parse a JSON file; an unreadable or malformed file raises the
  caller's error class with the file's name (never a bare ``JSONDecodeError``).
* :func:`package_code_sha256` — sha256 of this package's own code and data files: what resumed
  parts and reused sweep results key on besides the version number (an editable install or a
  source tree keeps one version number across changes of the maths).

Imports the standard library only.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import uuid
from pathlib import Path
from typing import Any

__all__ = [
    "atomic_write_bytes",
    "atomic_write_text",
    "package_code_sha256",
    "read_json",
    "sha256_bytes",
    "sha256_file",
    "shareable_name",
]


#: The file types of the package that make up its behaviour (code, architecture table, templates).
_CODE_SUFFIXES = (".py", ".json", ".j2")


@functools.lru_cache(maxsize=1)
def package_code_sha256() -> str:
    """Hex sha256 over the relative path and bytes of every ``.py``, ``.json`` and ``.j2`` file of the
    installed ``tl_idempotence`` package, in path order (computed once per process, ~5 ms).

    Two installations with the same value run the same code; any edit changes it.
    """
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for p in sorted(q for q in root.rglob("*") if q.suffix in _CODE_SUFFIXES and q.is_file()):
        if "__pycache__" in p.parts:
            continue
        h.update(f"{p.relative_to(root).as_posix()}\0{p.stat().st_size}\0".encode())
        h.update(p.read_bytes())
    return h.hexdigest()


def shareable_name(name: str) -> str:
    """A model name or path as it may appear in what a report shares (its page, ``--json``, a saved report):
    a local path (absolute, ``~``-relative or ``./``-relative, e.g. a ``transformers`` ``_name_or_path`` or a
    TransformerLens ``cfg.model_name`` of a model booted from a folder) becomes its last component, so no home
    folder or machine layout leaks; a hub-style name (``org/model``) stays as it is."""
    text = str(name)
    if os.path.isabs(text) or text.startswith(("~", "./", "../", ".\\", "..\\")) or "\\" in text:
        return Path(text.replace("\\", "/")).name or text
    return text


def sha256_file(path: str | os.PathLike[str], limit: int | None = None, chunk: int = 1 << 20) -> str:
    """Hex sha256 of a file (or of its first ``limit`` bytes), streamed.

    Raises:
        OSError: the file cannot be read (the caller turns it into an error naming the file).
    """
    h = hashlib.sha256()
    remaining = limit
    with open(path, "rb") as f:
        while True:
            n = chunk if remaining is None else min(chunk, remaining)
            if n <= 0:
                break
            block = f.read(n)
            if not block:
                break
            h.update(block)
            if remaining is not None:
                remaining -= len(block)
    return h.hexdigest()


def sha256_bytes(data: bytes) -> str:
    """Hex sha256 of bytes."""
    return hashlib.sha256(data).hexdigest()


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (temp file in the same directory + fsync + ``os.replace``).

    Returns the path. A killed writer leaves at most a ``*.tmp<pid>-<random>`` file, never a partial
    file under the final name. The temporary name is unique per call (the pid alone is not: processes
    on two machines, or in two containers, writing one file on a shared filesystem can share a pid).
    """
    p = Path(path)
    tmp = p.with_name(f"{p.name}.tmp{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
    finally:
        if tmp.exists():
            tmp.unlink()
    return p


def atomic_write_text(path: str | os.PathLike[str], text: str) -> Path:
    """:func:`atomic_write_bytes` of UTF-8 text."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def read_json(path: str | os.PathLike[str], error: type[Exception], what: str = "JSON file") -> Any:
    """Parse a JSON file, raising ``error`` with the file's name when it cannot be read or parsed.

    Args:
        path: the file.
        error: the exception class to raise (e.g. ``CheckpointError``).
        what: what the file is, for the message ("config.json", "resume manifest").
    """
    p = Path(path)
    try:
        raw = p.read_bytes()
    except IsADirectoryError as e:
        raise error(f"{what} {p} is a directory, not a file.") from e
    except OSError as e:
        raise error(f"Cannot read {what} {p}: {e.strerror or e}.") from e
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise error(f"{what} {p} is not UTF-8 text (byte {e.start}): the file is corrupt or not JSON.") from e
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise error(f"{what} {p} is not valid JSON (line {e.lineno}, column {e.colno}: {e.msg}).") from e
    except RecursionError as e:
        raise error(f"{what} {p} nests too deeply to be read: the file is corrupt or not what it claims.") from e
    except ValueError as e:  # e.g. an integer of more than 4300 digits
        raise error(f"{what} {p} holds a value that cannot be read: {e}.") from e
