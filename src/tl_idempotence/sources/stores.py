"""Tensor stores: named 2-D tensors read on demand from safetensors shards, a GGUF file or a
loaded ``transformers`` model, one layer at a time (SPEC section 9).

Every store has ``keys()``, ``where(name)`` (the file a tensor lives in, for messages),
``meta(names)`` (shapes and dtypes from headers, no data read) and a ``reader()`` context
whose ``read(name, rows, cols)`` returns a CPU tensor; mappings opened for a layer are
released when the context exits, so resident memory stays one layer.

Files are checked before they are opened, and each way a file can lie gets its own message
naming the file (:class:`~tl_idempotence.errors.CheckpointError` unless said otherwise):

* :func:`check_file` — missing (:class:`~tl_idempotence.errors.MissingFileError`), a dangling
  symbolic link, a symbolic-link loop, a directory, a FIFO / socket / device (never opened, so
  nothing hangs), permission denied, an empty file;
* :func:`safetensors_header` — too short for the 8-byte length, a Git LFS pointer or an HTML
  page instead of weights, a header length beyond the file, a header that is not UTF-8 / not
  JSON / not an object, a malformed tensor entry, a shape that does not fill its
  ``data_offsets``, overlapping or gapped offsets, a **truncated** file (the header describes
  more data than the file holds) and a file with **trailing bytes** (it holds more) — the
  header is read with :mod:`json`; the tensor data is read by the ``safetensors`` library only;
* :class:`GGUFStore` — not GGUF (its magic), metadata or tensor table cut off or corrupt,
  tensors that are unaligned, overlap or leave gaps (a type or shape edited in the tensor table),
  a tensor type that is no valid ggml type or does not fit the tensor's shape or bytes (named as
  such, not as a truncation), tensor data truncated, trailing bytes after the last tensor.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import math
import mmap
import os
import re
import stat
import sys
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..core.files import read_json
from ..errors import CheckpointError, MissingFileError

__all__ = [
    "FLOAT_DTYPES",
    "GGUFStore",
    "ModuleStore",
    "SafetensorsHeader",
    "SafetensorsStore",
    "check_file",
    "read_metadata_json",
    "safetensors_header",
]

#: safetensors dtype names the sources read (quantized FP8/int checkpoints need their scales).
FLOAT_DTYPES = {"F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32, "F64": torch.float64}
#: Bits per element of the safetensors dtypes (a dtype not listed here is left to the library to judge).
_ST_BITS = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8, "I16": 16, "U16": 16, "F16": 16,
    "BF16": 16, "I32": 32, "U32": 32, "F32": 32, "C64": 64, "F64": 64, "I64": 64, "U64": 64, "F4": 4,
    "F6_E2M3": 6, "F6_E3M2": 6,
}  # fmt: skip
#: The largest header the safetensors library accepts (bytes).
_ST_MAX_HEADER = 100_000_000
_KINDS = {
    stat.S_IFIFO: "a FIFO (named pipe)",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
}


def _sniff(first: bytes) -> str:
    """What a file that is not the expected format looks like, from its first bytes ('' when unknown)."""
    if first.startswith(b"version https://git-lfs"):
        return (
            " It is a Git LFS pointer file, not the weights: fetch the real file (git lfs pull, or "
            "huggingface-cli download)."
        )
    low = first.lstrip()[:15].lower()
    if low.startswith((b"<!doctype html", b"<html")):
        return " It is an HTML page (a failed download saved under this name?): download the file again."
    if first.startswith(b"GGUF"):
        return " It is a GGUF file: pass the file itself (a .gguf path)."
    if first.startswith(b"PK\x03\x04"):
        return " It is a zip archive (a PyTorch .bin checkpoint?): convert it to safetensors."
    if first.startswith(b"\x80") and len(first) > 1 and first[1] in range(2, 6):
        return " It is a Python pickle (a PyTorch .bin checkpoint?): convert it to safetensors."
    if low.startswith((b"{", b"[")):
        return " It is JSON text, not tensor data."
    return ""


def check_file(path: str | os.PathLike[str], what: str) -> os.stat_result:
    """Check that ``path`` is a readable, non-empty regular file before anything opens it.

    Symbolic links are followed (a Hugging Face cache snapshot is made of them). Nothing is
    opened: a FIFO is refused by its ``stat`` mode, so a read never blocks.

    Args:
        path: the file.
        what: what it is, for the message ("config.json", "shard", "GGUF file").

    Returns:
        Its ``os.stat`` result (size in ``st_size``).

    Raises:
        MissingFileError: nothing exists at ``path``.
        CheckpointError: a dangling symbolic link, a symbolic-link loop, a directory, a FIFO,
            socket or device, permission denied, or an empty file (each says which).
    """
    p = Path(path)
    try:
        st = os.stat(p)
    except FileNotFoundError as e:
        if os.path.islink(p):
            raise CheckpointError(
                f"{what} {p} is a dangling symbolic link: it points to {os.readlink(p)!r}, which does not exist "
                "(a moved or deleted cache blob?). Re-download the file or fix the link."
            ) from e
        raise MissingFileError(f"{what} {p} does not exist.") from e
    except PermissionError as e:
        raise CheckpointError(
            f"Cannot read {what} {p}: permission denied ({e.strerror}). Fix the permissions of the file or of "
            "its folder (e.g. chmod a+r)."
        ) from e
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise CheckpointError(
                f"{what} {p} is a symbolic-link loop (the link points back to itself through other links): "
                "replace it with the real file."
            ) from e
        raise CheckpointError(f"Cannot read {what} {p}: {e.strerror or e}.") from e
    if stat.S_ISDIR(st.st_mode):
        raise CheckpointError(f"{what} {p} is a directory, not a file.")
    if not stat.S_ISREG(st.st_mode):
        kind = _KINDS.get(stat.S_IFMT(st.st_mode), "not a regular file")
        raise CheckpointError(f"{what} {p} is {kind}, not a regular file; it was not opened.")
    if not os.access(p, os.R_OK):
        raise CheckpointError(
            f"Cannot read {what} {p}: permission denied. Fix the permissions of the file (e.g. chmod a+r)."
        )
    if st.st_size == 0:
        raise CheckpointError(f"{what} {p} is empty (0 bytes): an interrupted download or copy? Re-download it.")
    return st


def _is_count(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


class _DuplicateKey(Exception):
    pass


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise _DuplicateKey(k)
        out[k] = v
    return out


def read_metadata_json(path: Path, what: str) -> Any:
    """A JSON metadata file (config.json, an index), checked with :func:`check_file` and parsed.

    Raises:
        MissingFileError / CheckpointError: see :func:`check_file`; not UTF-8, not JSON, a
            key twice in one object, nesting too deep, an integer too long to parse (names the file).
    """
    check_file(path, what)
    return read_json(path, CheckpointError, what)


def _read_prefix(p: Path, n: int, what: str) -> bytes:
    try:
        with open(p, "rb") as f:
            return f.read(n)
    except PermissionError as e:
        raise CheckpointError(
            f"Cannot read {what} {p}: permission denied ({e.strerror}). Fix the permissions (e.g. chmod a+r)."
        ) from e
    except OSError as e:
        raise CheckpointError(f"Cannot read {what} {p}: {e.strerror or e}.") from e


@dataclass(frozen=True)
class SafetensorsHeader:
    """A safetensors file's header, checked against the file's size (no tensor data read).

    Attributes:
        path: the file. size: its size in bytes. header_len: the header's length (bytes after
        the 8-byte length field). tensors: name -> (shape, dtype name).
    """

    path: Path
    size: int
    header_len: int
    tensors: dict[str, tuple[tuple[int, ...], str]]


def safetensors_header(path: str | os.PathLike[str], what: str = "safetensors file") -> SafetensorsHeader:
    """Read and check a safetensors file's header: every way it can be wrong gets its own message.

    The format: 8 bytes (little-endian header length ``n``), ``n`` bytes of JSON (tensor name ->
    ``{"dtype", "shape", "data_offsets": [begin, end]}``, optional ``__metadata__``), then the
    tensor data, which the offsets must cover exactly, without gap or overlap.

    Raises:
        MissingFileError / CheckpointError: see :func:`check_file`; and a file too short for the
            length field, a Git LFS pointer / HTML page / other format, a header length beyond
            the file, a header that is not UTF-8 / JSON / an object, a malformed entry (names the
            tensor and the field), a shape whose bytes do not fill its offsets, overlapping or
            gapped offsets, a truncated file, trailing bytes (each names the file).
    """
    p = Path(path)
    size = check_file(p, what).st_size
    first = _read_prefix(p, 64, what)
    hint = _sniff(first)
    if size < 8:
        raise CheckpointError(
            f"{what} {p} has {size} bytes: too short for a safetensors file (its header length alone takes 8 "
            f"bytes); it is truncated or not a safetensors file.{hint}"
        )
    n = int.from_bytes(first[:8], "little")
    if hint and (n > size - 8 or n > _ST_MAX_HEADER):
        raise CheckpointError(f"{what} {p} is not a safetensors file.{hint}")
    if n > _ST_MAX_HEADER:
        raise CheckpointError(
            f"{what} {p} is not a safetensors file (or its first 8 bytes are damaged): they give a header "
            f"length of {n} bytes, beyond the {_ST_MAX_HEADER} the format allows; the file starts with "
            f"{first[:16]!r}."
        )
    if n > size - 8:
        raise CheckpointError(
            f"{what} {p} is truncated within its header (or its length field is damaged): the header length "
            f"field says {n} bytes, but only {size - 8} bytes follow it. Re-download the file."
        )
    raw = _read_prefix(p, 8 + n, what)[8:]
    if len(raw) != n:  # the file shrank since stat
        raise CheckpointError(f"{what} {p} changed while being read (its header is {len(raw)} of {n} bytes).")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise CheckpointError(
            f"{what} {p} has a corrupt header: byte {8 + e.start} of the file is not UTF-8 text (a flipped byte, "
            "or not a safetensors file). Re-download the file."
        ) from e
    try:
        header = json.loads(text, object_pairs_hook=_unique_keys)
    except json.JSONDecodeError as e:
        raise CheckpointError(
            f"{what} {p} has a corrupt header: not valid JSON (header line {e.lineno}, column {e.colno}: {e.msg}); "
            "a flipped byte, a damaged length field, or not a safetensors file. Re-download the file."
        ) from e
    except _DuplicateKey as e:
        raise CheckpointError(
            f"{what} {p} has a corrupt header: {e.args[0]!r} appears twice in it (which entry is meant?). "
            "Re-download or re-save the file."
        ) from e
    except (ValueError, RecursionError) as e:  # an integer of > 4300 digits, nesting too deep
        raise CheckpointError(f"{what} {p} has a corrupt header: {type(e).__name__}: {e}") from e
    if not isinstance(header, dict):
        raise CheckpointError(f"{what} {p} has a corrupt header: a JSON {type(header).__name__}, not an object.")
    tensors: dict[str, tuple[tuple[int, ...], str]] = {}
    spans: list[tuple[int, int, str]] = []
    for name, ent in header.items():
        if name == "__metadata__":
            if not isinstance(ent, dict) or not all(isinstance(v, str) for v in ent.values()):
                raise CheckpointError(f"{what} {p} has a corrupt header: '__metadata__' is not an object of strings.")
            continue
        bad = f"{what} {p} has a corrupt header: the entry of tensor {name!r}"
        if not isinstance(ent, dict):
            raise CheckpointError(f"{bad} is a JSON {type(ent).__name__}, not an object.")
        for field in ("dtype", "shape", "data_offsets"):
            if field not in ent:
                raise CheckpointError(f"{bad} has no {field!r}.")
        dtype, shape, offs = ent["dtype"], ent["shape"], ent["data_offsets"]
        if not isinstance(dtype, str):
            raise CheckpointError(f"{bad} has 'dtype' = {dtype!r}, not a dtype name.")
        if not isinstance(shape, list) or not all(_is_count(x) for x in shape):
            raise CheckpointError(f"{bad} has 'shape' = {shape!r}, not a list of non-negative integers.")
        if not (isinstance(offs, list) and len(offs) == 2 and all(_is_count(x) for x in offs) and offs[0] <= offs[1]):
            raise CheckpointError(f"{bad} has 'data_offsets' = {offs!r}, not [begin, end] with 0 <= begin <= end.")
        if _ST_BITS.get(dtype, 1) % 8 == 0:  # sub-byte and unknown dtypes are left to the library
            nbytes = math.prod(shape) * (_ST_BITS[dtype] // 8)
            if nbytes != offs[1] - offs[0]:
                raise CheckpointError(
                    f"{bad}: shape {shape} of {dtype} takes {nbytes} bytes, but its data_offsets {offs} span "
                    f"{offs[1] - offs[0]} (a flipped byte in the header?). Re-download the file."
                )
        tensors[name] = (tuple(shape), dtype)
        spans.append((offs[0], offs[1], name))
    pos, prev = 0, None
    for begin, end, name in sorted(spans):
        if begin != pos:
            rel = "overlaps" if begin < pos else f"leaves a gap of {begin - pos} bytes after"
            after = f"tensor {prev!r} (ends at {pos})" if prev is not None else "the start of the data (0)"
            raise CheckpointError(
                f"{what} {p} has a corrupt header: tensor {name!r} (data_offsets [{begin}, {end}]) {rel} {after}. "
                "Re-download the file."
            )
        pos, prev = end, name
    data = size - 8 - n
    if pos > data:
        raise CheckpointError(
            f"{what} {p} is truncated: its header describes {pos} bytes of tensor data (a file of {8 + n + pos} "
            f"bytes), but the file has {size} bytes ({8 + n + pos - size} missing). An interrupted download or "
            "copy: re-download it."
        )
    if pos < data:
        raise CheckpointError(
            f"{what} {p} has {data - pos} trailing bytes after its last tensor: its header describes a file of "
            f"{8 + n + pos} bytes, the file has {size} (data appended to it, or an edited header). Re-download or "
            "re-save it."
        )
    return SafetensorsHeader(path=p, size=size, header_len=n, tensors=tensors)


def _is_plain_name(v: str) -> bool:
    return bool(v) and v not in (".", "..") and "/" not in v and "\\" not in v and "\0" not in v


class SafetensorsStore:
    """Tensor names -> shard files of a HF directory; headers checked up front, data opened per layer.

    With ``model.safetensors.index.json`` the index says which file holds each tensor (as in
    ``transformers``); without one, every ``*.safetensors`` file of the directory is a shard.

    What is refused (:class:`~tl_idempotence.errors.CheckpointError`, naming the files):

    * no index, and two files hold a tensor of the same name — whichever file was read last
      would win, so the directory is ambiguous (a stray file from another model); shards whose
      tensor names are disjoint are safe and read together;
    * an index, and a ``*.safetensors`` file it does not name holds attention tensors
      (``attention`` matches their names): the index's tensors would be read, but the directory
      holds two versions of the attention weights; unindexed files without attention tensors
      (e.g. Mistral's ``consolidated.safetensors``, other towers) are ignored;
    * an index that is not a JSON object with a ``weight_map`` object of file names in this
      directory ending in ``.safetensors`` (``../x.safetensors`` and absolute paths are refused).

    Args:
        directory: the model directory.
        attention: a compiled pattern that matches the names of attention V/O tensors (any root,
            any layer); ``None`` skips the unindexed-file check.
    """

    format = "safetensors"

    def __init__(self, directory: Path, attention: re.Pattern[str] | None = None):
        self.dir = directory
        self._attention = attention
        self._headers: dict[str, SafetensorsHeader] = {}
        self._shapes: dict[str, tuple[tuple[int, ...], str]] = {}
        index = directory / "model.safetensors.index.json"
        self.index_file: Path | None = None
        if os.path.lexists(index):
            self.index_file = index
            self.map = self._read_index(index)
            extra = [f for f in self._candidates() if f.name not in set(self.map.values())]
            if attention is not None:
                self._check_unindexed(extra, attention)
        else:
            files = self._candidates()
            if not files:
                bins = sorted(p.name for p in directory.glob("*.bin"))
                hint = (
                    (
                        f" It has {bins[:3]}: convert them to safetensors (e.g. load with transformers and "
                        "save_pretrained(safe_serialization=True)) or pass the loaded transformers model."
                    )
                    if bins
                    else ""
                )
                raise CheckpointError(f"{directory}: no *.safetensors files and no model.safetensors.index.json.{hint}")
            self.map = {}
            held: dict[str, list[str]] = {}
            for f in files:
                for k in self.header(f.name).tensors:
                    held.setdefault(k, []).append(f.name)
                    self.map[k] = f.name
            dup = {k: v for k, v in held.items() if len(v) > 1}
            if dup:
                pairs = sorted({tuple(v) for v in dup.values()})
                first = next(iter(dup))
                raise CheckpointError(
                    f"{directory} is ambiguous: {len(dup)} tensor name(s) are held by more than one file and there "
                    f"is no model.safetensors.index.json to say which is meant (e.g. {first!r} is in "
                    f"{' and '.join(dup[first])}; files that share names: "
                    f"{'; '.join(' + '.join(p) for p in pairs[:5])}). One of them is likely a stray file from "
                    "another model or an older save: move it out of the directory (or write an index)."
                )

    def _candidates(self) -> list[Path]:
        try:
            return sorted(self.dir.glob("*.safetensors"))
        except OSError as e:
            raise CheckpointError(f"Cannot list the model directory {self.dir}: {e.strerror or e}.") from e

    def _read_index(self, index: Path) -> dict[str, str]:
        doc = read_metadata_json(index, "safetensors index")
        what = f"safetensors index {index}"
        if not isinstance(doc, dict):
            raise CheckpointError(f"{what} is a JSON {type(doc).__name__}, not an object with a 'weight_map'.")
        if "weight_map" not in doc:
            raise CheckpointError(f"{what} has no 'weight_map' (tensor name -> shard file); keys: {sorted(doc)[:8]}.")
        wm = doc["weight_map"]
        if not isinstance(wm, dict):
            raise CheckpointError(
                f"{what}: 'weight_map' is a JSON {type(wm).__name__}, not an object (tensor name -> shard file)."
            )
        if not wm:
            raise CheckpointError(f"{what}: 'weight_map' is empty (it maps no tensor to a file).")
        for k, v in wm.items():
            if not isinstance(v, str):
                raise CheckpointError(
                    f"{what}: 'weight_map' maps tensor {k!r} to {v!r} ({type(v).__name__}), not a file name."
                )
            if not _is_plain_name(v):
                raise CheckpointError(
                    f"{what}: 'weight_map' maps tensor {k!r} to {v!r}, which is not a file name in the model "
                    "directory (paths such as '../x.safetensors', 'sub/x' or absolute paths are refused)."
                )
            if not v.endswith(".safetensors"):
                raise CheckpointError(
                    f"{what}: 'weight_map' maps tensor {k!r} to {v!r}, which is not a .safetensors file (an index "
                    "of another format?)."
                )
        return dict(wm)

    def _check_unindexed(self, extra: list[Path], attention: re.Pattern[str]) -> None:
        for f in extra:
            h = self.header(f.name, "unindexed file")
            hits = sorted(k for k in h.tensors if attention.search(k))
            if hits:
                raise CheckpointError(
                    f"{self.dir} is ambiguous: {f.name} is not named by {self.index_file} but holds "
                    f"{len(hits)} attention tensor(s) (e.g. {hits[0]!r}) that the index does not point to it for. "
                    "The directory holds two versions of the attention weights (a stray or older file?): move "
                    f"{f.name} out of the directory, or add it to the index."
                )

    def header(self, fname: str, what: str | None = None) -> SafetensorsHeader:
        """The checked header of one file of the directory (read once)."""
        if fname not in self._headers:
            what = what or ("shard" if self.index_file is not None else "safetensors file")
            path = self.dir / fname
            if not os.path.lexists(path) and self.index_file is not None:
                users = [k for k, v in self.map.items() if v == fname][:3]
                raise MissingFileError(
                    f"Shard {path} does not exist, but {self.index_file} maps tensors to it (e.g. {users}). "
                    "Re-download or re-save the checkpoint."
                )
            self._headers[fname] = safetensors_header(path, what)
        return self._headers[fname]

    def keys(self) -> list[str]:
        """Every tensor name the store holds."""
        return list(self.map)

    def where(self, name: str) -> str:
        """Where ``name`` lives (file or module), for messages."""
        return str(self.dir / self.map[name])

    def _open(self, fname: str) -> Any:
        from safetensors import safe_open

        path = self.dir / fname
        self.header(fname)  # every check of the file's own structure, with its own message
        try:
            return safe_open(str(path), framework="pt")
        except Exception as e:  # safetensors raises SafetensorError (an Exception subclass)
            raise CheckpointError(
                f"Cannot open shard {path}: the safetensors library refuses it ({e}) although its header is "
                "consistent with its size; re-download it."
            ) from e

    def meta(self, names: list[str]) -> dict[str, tuple[tuple[int, ...], str]]:
        """Shapes and dtypes of ``names`` from the shard headers (no tensor data is read).

        Each shard involved is also opened once by the ``safetensors`` library, so everything it
        checks fails here, before any work.
        """
        by_file: dict[str, list[str]] = {}
        for n in names:
            if n not in self._shapes:
                by_file.setdefault(self.map[n], []).append(n)
        for fname, ns in by_file.items():
            h = self.header(fname)
            for n in ns:
                if n not in h.tensors:
                    raise CheckpointError(
                        f"Tensor {n!r} is missing from shard {self.dir / fname} although "
                        f"{self.index_file} maps it there. Re-download the shard."
                    )
                self._shapes[n] = h.tensors[n]
            f = self._open(fname)
            del f
        if self.index_file is not None and self._attention is not None:
            for fname in by_file:
                rx = self._attention
                wrong = sorted(k for k in self.header(fname).tensors if rx.search(k) and self.map.get(k) != fname)
                if wrong:
                    other = self.map.get(wrong[0])
                    said = f"maps it to {other}" if other else "does not list it"
                    raise CheckpointError(
                        f"Shard {self.dir / fname} holds attention tensor {wrong[0]!r} ({len(wrong)} such tensor(s)), "
                        f"but {self.index_file} {said}: the shard and the index come from different saves. "
                        "Re-download or re-save the checkpoint."
                    )
        return {n: self._shapes[n] for n in names}

    @contextlib.contextmanager
    def reader(self) -> Iterator[Any]:
        """Per-layer read context: shard mappings opened on demand and released at exit."""
        handles: dict[str, Any] = {}
        store = self

        class _R:
            def read(self, name: str, rows: slice = slice(None), cols: slice = slice(None)) -> Tensor:
                fname = store.map[name]
                if fname not in handles:
                    handles[fname] = store._open(fname)
                sl = handles[fname].get_slice(name)
                try:
                    return sl[rows, cols]
                except Exception as e:
                    raise CheckpointError(f"Cannot read tensor {name!r} from {store.dir / fname}: {e}") from e

        try:
            yield _R()
        finally:
            handles.clear()  # drops the memory maps: pages read for this layer leave resident memory


class ModuleStore:
    """Parameters of a loaded ``transformers`` model, by their state-dict names."""

    format = "transformers"

    def __init__(self, model: Any):
        self.params = {n: p for n, p in model.named_parameters()}
        self.name = type(model).__name__

    def keys(self) -> list[str]:
        """Every tensor name the store holds."""
        return list(self.params)

    def where(self, name: str) -> str:
        """Where ``name`` lives (file or module), for messages."""
        return f"{self.name} parameter"

    def meta(self, names: list[str]) -> dict[str, tuple[tuple[int, ...], str]]:
        """``{name: (shape, dtype name)}`` of ``names``, read from headers only (no tensor data)."""
        out = {}
        for n in names:
            p = self.params[n]
            if p.device.type == "meta":
                raise CheckpointError(
                    f"Parameter {n!r} of the {self.name} is on the meta device (not loaded / offloaded)."
                )
            out[n] = (tuple(p.shape), str(p.dtype))
        return out

    @contextlib.contextmanager
    def reader(self) -> Iterator[Any]:
        """A context manager yielding an object whose ``read(name)`` returns that tensor."""
        params = self.params

        class _R:
            def read(self, name: str, rows: slice = slice(None), cols: slice = slice(None)) -> Tensor:
                with torch.no_grad():
                    return params[name].detach()[rows, cols].cpu()

        yield _R()


@functools.cache
def _plain_view_reader() -> type:
    """:class:`gguf.GGUFReader` parsing plain ``ndarray`` views of its memory map instead of ``np.memmap`` ones.

    GGUFReader slices its ``data`` (an ``np.memmap``) once per metadata value: ~10^6 slices for a
    file with a 49,152-token vocabulary, each running ``np.memmap``'s Python ``__array_finalize__``
    (3.6 s of SmolLM2's cold start on 2 cores, 1.7 s with plain views). Here ``data`` is set once to the
    memory map and read back as a plain view of the same pages: the same bytes, read by gguf's own parser
    (a test asserts every field and tensor equal to ``gguf.GGUFReader``'s). ``memmap`` keeps the
    ``np.memmap`` (for ``madvise``).
    """
    import gguf

    class PlainViewGGUFReader(gguf.GGUFReader):
        memmap: np.memmap

        @property  # type: ignore[override]
        def data(self) -> np.ndarray:
            return self._plain

        @data.setter
        def data(self, mm: np.memmap) -> None:
            self.memmap = mm
            self._plain = mm.view(np.ndarray)

        def _build_tensors(self, start_offs: int, fields: list[Any]) -> None:
            try:
                super()._build_tensors(start_offs, fields)
            except Exception as e:  # say which tensor's type field is wrong, when one is (else: gguf's error)
                why = _gguf_type_problem(fields, len(self._plain), int(self.alignment), start_offs)
                if why is not None:
                    raise _GGUFTypeError(why) from e
                raise

    return PlainViewGGUFReader


class _GGUFTypeError(ValueError):
    """A tensor-table entry whose ggml type gguf cannot read, or that does not fit the tensor's shape or bytes."""


def _gguf_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("gguf")
    except PackageNotFoundError:  # pragma: no cover - gguf is imported before this runs
        return "?"


def _gguf_type_problem(fields: list[Any], file_size: int, align: int, data_start: int) -> str | None:
    """What is wrong with the type field of a GGUF tensor table, or ``None`` when every type fits.

    Reads the tensor-info fields gguf parsed (``ReaderField.parts``: name, dims ne0-first, raw ggml type,
    data offset) and gguf's own type table (:data:`gguf.GGML_QUANT_SIZES`):

    * a raw type that is no :class:`gguf.GGMLQuantizationType` (an edited field, or a type newer than the
      installed gguf), or one gguf has no block size for;
    * a block-quantized type whose block does not divide the tensor's rows (``ne0``);
    * the last tensor (by offset), whose bytes run past the end of the file or stop short of it, when the
      bytes the file holds for it are exactly its shape in another type (its type field was changed).

    Args:
        fields: the tensor-info ``ReaderField``s (``GGUFReader.tensors[i].field`` or those ``_build_tensors`` gets).
        file_size: bytes in the file. align: its alignment. data_start: the data section's file offset.

    Returns:
        A sentence naming the tensor, the type and why, or ``None``.
    """
    import gguf

    spans = []
    for field in fields:
        _n, name_data, _nd, dims, raw_dtype, offset = field.parts
        name = bytes(name_data).decode("utf-8", "replace")
        raw = int(raw_dtype[0])
        try:
            ttype = gguf.GGMLQuantizationType(raw)
        except ValueError:
            values = sorted(t.value for t in gguf.GGMLQuantizationType)
            gaps = sorted(set(range(values[0], values[-1] + 1)) - set(values))
            return (
                f"tensor {name!r} has ggml type {raw}, which is not a valid ggml type for the installed gguf "
                f"library ({_gguf_version()}: types {values[0]}..{values[-1]}, except {gaps}): its type field is "
                "corrupt (edited?), or the file uses a quantization type newer than this gguf (pip install -U gguf)"
            )
        if ttype not in gguf.GGML_QUANT_SIZES:  # pragma: no cover - every type of gguf 0.19 has sizes
            return f"tensor {name!r} has ggml type {raw} ({ttype.name}), which the installed gguf cannot read"
        block, nbytes_block = gguf.GGML_QUANT_SIZES[ttype]
        shape = [int(x) for x in dims]
        ne0 = shape[0] if shape else 1
        if ne0 % block:
            return (
                f"tensor {name!r} has ggml type {ttype.name}, whose blocks hold {block} values, but its rows hold "
                f"{ne0} (shape {shape[::-1]}): its type field does not match its shape (edited?)"
            )
        n_el = math.prod(shape)
        spans.append((data_start + int(offset[0]), n_el * nbytes_block // block, name, ttype, shape, n_el))
    if not spans:
        return None
    begin, n_bytes, name, ttype, shape, n_el = max(spans, key=lambda x: x[0])
    have = file_size - begin

    def fits(n: int) -> bool:
        return have in (n, -(-n // align) * align)

    if have <= 0 or fits(n_bytes):
        return None
    other = [
        t.name
        for t, (b, nb) in gguf.GGML_QUANT_SIZES.items()
        if t != ttype and shape and shape[0] % b == 0 and fits(n_el * nb // b)
    ]
    if not other:
        return None
    return (
        f"tensor {name!r} (the last one) has ggml type {ttype.name}: {n_bytes} bytes for its shape {shape[::-1]}, "
        f"but the file holds {have} bytes for it (from file offset {begin} to its end), the size of that shape in "
        f"{' or '.join(other)}: its type field does not match its size (edited after writing?)"
    )


def _check_gguf_layout(path: Path, tensors: Any, data_start: int, align: int) -> None:
    """The tensor table of a GGUF file must lay its tensors out as every GGUF writer does: each at an offset
    that is a multiple of the file's alignment, the first at the start of the data section, each next one
    right after the previous (padded to the alignment), none overlapping.

    A type or shape edited in the tensor table changes a tensor's byte count without moving the next
    tensor: the space no longer fits (an overlap or a gap) — refused like a safetensors header whose shape
    does not fill its ``data_offsets``.

    Raises:
        CheckpointError: an unaligned offset, an overlap, or a gap (names the file, the tensors and their types).
    """
    spans = sorted(
        ((int(t.data_offset) - data_start, int(t.n_bytes), t.name, t.tensor_type.name) for t in tensors),
        key=lambda x: (x[0], x[2]),
    )
    pos, prev = 0, None
    for begin, n, name, ttype in spans:
        if begin % align:
            raise CheckpointError(
                f"GGUF file {path} has a corrupt tensor table: tensor {name!r} ({ttype}) starts at data offset "
                f"{begin}, not a multiple of the file's alignment ({align}). Re-download the file."
            )
        if begin != pos:
            if prev is None:
                where = f"the data section starts at 0 but its first tensor {name!r} ({ttype}) at {begin}"
            else:
                pname, ptype, pn, pbegin = prev
                rel = "overlaps" if begin < pbegin + pn else f"leaves a gap of {begin - pos} bytes after"
                where = (
                    f"tensor {name!r} ({ttype}, data offset {begin}) {rel} tensor {pname!r} ({ptype}, {pn} bytes from "
                    f"offset {pbegin}, so the next tensor belongs at {pos})"
                )
            raise CheckpointError(
                f"GGUF file {path} has a corrupt tensor table: {where}. A changed type or shape in the tensor table "
                "(the bytes no longer fit)? Re-download the file."
            )
        pos, prev = -(-(begin + n) // align) * align, (name, ttype, n, begin)


class GGUFStore:
    """Tensors of a GGUF file (memory-mapped); dequantized per layer, pages released after.

    The file is checked before :class:`gguf.GGUFReader` maps it (:func:`check_file`, the
    ``GGUF`` magic), and its size against the tensor table after: a truncated file, a file with
    bytes after its last (aligned) tensor, and one whose metadata cannot be parsed each get
    their own message.

    Raises:
        MissingFileError / CheckpointError: see :func:`check_file`; not a GGUF file; metadata or
            tensor table corrupt or cut off; a tensor's ggml type invalid, or not fitting its shape or
            bytes (names the tensor and the type); tensor data truncated; trailing bytes; stored in the
            other byte order (big-endian here) (names the file).
    """

    format = "gguf"

    def __init__(self, path: Path):
        size = check_file(path, "GGUF file").st_size
        first = _read_prefix(path, 64, "GGUF file")
        if not first.startswith(b"GGUF"):
            raise CheckpointError(
                f"GGUF file {path} is not a GGUF file: it starts with {first[:8]!r}, a GGUF file with b'GGUF'."
                f"{_sniff(first)}"
            )
        try:
            self.reader_ = _plain_view_reader()(str(path), "r")
        except Exception as e:
            stage = {f.name for f in traceback.extract_tb(e.__traceback__)}
            if isinstance(e, _GGUFTypeError):
                raise CheckpointError(f"GGUF file {path} has a corrupt tensor table: {e}. Re-download the file.") from e
            if "_build_tensors" in stage and "duplicate" in str(e).lower():
                raise CheckpointError(f"GGUF file {path} is corrupt: {e} (two tensors of one name).") from e
            if "_build_tensors" in stage:
                raise CheckpointError(
                    f"GGUF file {path} is truncated: its metadata and tensor table are intact, but the tensor data "
                    f"ends early (the file has {size} bytes; gguf: {e}). An interrupted download or copy: "
                    "re-download it."
                ) from e
            if "version" in str(e):
                raise CheckpointError(f"GGUF file {path} has a GGUF version this gguf library cannot read: {e}") from e
            raise CheckpointError(
                f"GGUF file {path} ({size} bytes) has corrupt or cut-off metadata or tensor table: the gguf reader "
                f"stops with {type(e).__name__}: {e}. The file is truncated within its header or damaged; "
                "re-download it."
            ) from e
        if self.reader_.byte_order != "I":
            # gguf parses the metadata of a file in the other byte order, but the tensor bytes reach
            # gguf.quants.dequantize unswapped: F32/F16 weights would read as byte-swapped garbage.
            raise CheckpointError(
                f"GGUF file {path} is stored in the other byte order ({self.reader_.endianess.name.lower()}-endian "
                f"on a {sys.byteorder}-endian machine); its tensors would be read byte-swapped. Convert it to "
                f"{sys.byteorder}-endian GGUF (the gguf package's gguf-convert-endian script) first."
            )
        self.path = path
        self.tensors = {t.name: t for t in self.reader_.tensors}
        align = int(self.reader_.alignment)
        _check_gguf_layout(path, self.reader_.tensors, int(self.reader_.data_offset), align)
        end = max((int(t.data_offset) + int(t.n_bytes) for t in self.reader_.tensors), default=0)
        padded = -(-end // align) * align
        if end > size:
            raise CheckpointError(f"GGUF file {path} is truncated: its tensors need {end} bytes, the file has {size}.")
        if self.reader_.tensors and size > padded:
            fields = [t.field for t in self.reader_.tensors]
            why = _gguf_type_problem(fields, size, align, int(self.reader_.data_offset))
            if why is not None:
                raise CheckpointError(f"GGUF file {path} has a corrupt tensor table: {why}. Re-download the file.")
            raise CheckpointError(
                f"GGUF file {path} has {size - padded} trailing bytes after its last tensor: its tensor table "
                f"describes a file of {padded} bytes (with {align}-byte alignment), the file has {size} (data "
                "appended to it?). Re-download it."
            )

    def field(self, key: str, default: Any = None) -> Any:
        """A metadata value (``default`` when absent).

        Raises:
            CheckpointError: the value cannot be decoded (names the file and the key).
        """
        f = self.reader_.fields.get(key)
        if f is None:
            return default
        try:
            return f.contents()
        except Exception as e:
            raise CheckpointError(f"GGUF file {self.path}: metadata {key!r} cannot be decoded ({e}).") from e

    def keys(self) -> list[str]:
        """Every tensor name the store holds."""
        return list(self.tensors)

    def where(self, name: str) -> str:
        """Where ``name`` lives (file or module), for messages."""
        return str(self.path)

    def meta(self, names: list[str]) -> dict[str, tuple[tuple[int, ...], str]]:
        """``{name: (shape, dtype name)}`` of ``names``, read from headers only (no tensor data)."""
        # GGUF shapes are stored ne0-first (reversed); report the torch (row-major) shape.
        return {
            n: (tuple(int(x) for x in reversed(self.tensors[n].shape.tolist())), self.tensors[n].tensor_type.name)
            for n in names
        }

    @contextlib.contextmanager
    def reader(self) -> Iterator[Any]:
        """A context manager yielding an object whose ``read(name)`` returns that tensor."""
        import gguf

        tensors, path = self.tensors, self.path

        class _R:
            def read(self, name: str, rows: slice = slice(None), cols: slice = slice(None)) -> Tensor:
                t = tensors[name]
                try:
                    # Quantization blocks run along ne0 (the torch last dim), so whole rows dequantize alone.
                    arr = gguf.quants.dequantize(np.asarray(t.data[rows]), t.tensor_type)
                except Exception as e:
                    raise CheckpointError(
                        f"Cannot dequantize tensor {name!r} ({t.tensor_type.name}) of {path}: {e}"
                    ) from e
                arr = arr[:, cols]
                if not (arr.flags.writeable and arr.flags.c_contiguous):  # F32/F16 come back as memmap views
                    arr = np.array(arr, order="C")
                return torch.from_numpy(arr)

        try:
            yield _R()
        finally:
            mm = getattr(self.reader_.memmap, "_mmap", None)
            if mm is not None and hasattr(mmap, "MADV_DONTNEED"):
                with contextlib.suppress(OSError, ValueError):
                    mm.madvise(mmap.MADV_DONTNEED)  # file-backed: drops pages from RSS, not from the page cache
