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
* :class:`~.gguf_store.GGUFStore` (in :mod:`.gguf_store`) — not GGUF (its magic), metadata or tensor
  table cut off or corrupt, tensors that are unaligned, overlap or leave gaps (a type or shape edited in
  the tensor table), a tensor type that is no valid ggml type or does not fit the tensor's shape or
  bytes (named as such, not as a truncation), tensor data truncated, trailing bytes after the last tensor.
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ..core.files import read_json
from ..errors import CheckpointError, MissingFileError

__all__ = [
    "FLOAT_DTYPES",
    "ModuleStore",
    "SafetensorsHeader",
    "SafetensorsStore",
    "check_file",
    "read_metadata_json",
    "read_prefix",
    "safetensors_header",
    "sniff_format",
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


def sniff_format(first: bytes) -> str:
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


def read_prefix(p: Path, n: int, what: str) -> bytes:
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
    n, header = _header_json(p, what, size)
    tensors, spans = _tensor_entries(header, p, what)
    _check_spans(spans, p, what, size, n)
    return SafetensorsHeader(path=p, size=size, header_len=n, tensors=tensors)


def _header_json(p: Path, what: str, size: int) -> tuple[int, Any]:
    """The header length and the parsed header JSON (an object) of a safetensors file of ``size`` bytes."""
    first = read_prefix(p, 64, what)
    hint = sniff_format(first)
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
    raw = read_prefix(p, 8 + n, what)[8:]
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
    return n, header


def _tensor_entries(
    header: dict[str, Any], p: Path, what: str
) -> tuple[dict[str, tuple[tuple[int, ...], str]], list[tuple[int, int, str]]]:
    """Each tensor's ``(shape, dtype)`` and data span ``(begin, end, name)``, every entry checked."""
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
    return tensors, spans


def _check_spans(spans: list[tuple[int, int, str]], p: Path, what: str, size: int, n: int) -> None:
    """The tensors' data spans tile the data after the ``n``-byte header exactly: no overlap, gap,
    truncation or trailing bytes."""
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
