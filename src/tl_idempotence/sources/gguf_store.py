"""The GGUF tensor store: a llama.cpp GGUF file's tensors, read on demand one layer at a time (SPEC section 9).

:class:`GGUFStore` has the interface of the stores in :mod:`.stores` (``keys()``, ``where(name)``,
``meta(names)``, ``reader()``). The file is checked before :mod:`gguf` maps it and every way it can lie is
refused by name: not GGUF (its magic), metadata or tensor table cut off or corrupt, tensors that are
unaligned, overlap or leave gaps (a type or shape edited in the tensor table), a tensor type that is no
valid ggml type or does not fit the tensor's shape or bytes (named as such, not as a truncation), tensor
data truncated, trailing bytes after the last tensor.
"""

from __future__ import annotations

import contextlib
import functools
import math
import mmap
import sys
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..errors import CheckpointError
from .stores import check_file, read_prefix, sniff_format

__all__ = ["GGUFStore"]


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
        first = read_prefix(path, 64, "GGUF file")
        if not first.startswith(b"GGUF"):
            raise CheckpointError(
                f"GGUF file {path} is not a GGUF file: it starts with {first[:8]!r}, a GGUF file with b'GGUF'."
                f"{sniff_format(first)}"
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
