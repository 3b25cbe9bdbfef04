"""Tensor stores: named 2-D tensors read on demand from safetensors shards, a GGUF file or a
loaded ``transformers`` model, one layer at a time (SPEC section 9).

Every store has ``keys()``, ``where(name)`` (the file a tensor lives in, for messages),
``meta(names)`` (shapes and dtypes from headers, no data read) and a ``reader()`` context
whose ``read(name, rows, cols)`` returns a CPU tensor; mappings opened for a layer are
released when the context exits, so resident memory stays one layer.
"""

from __future__ import annotations

import contextlib
import json
import mmap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..errors import CheckpointError, MissingFileError

__all__ = ["FLOAT_DTYPES", "GGUFStore", "ModuleStore", "SafetensorsStore"]

#: safetensors dtype names the sources read (quantized FP8/int checkpoints need their scales).
FLOAT_DTYPES = {"F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32, "F64": torch.float64}


class SafetensorsStore:
    """Tensor names -> shard files of a HF directory; opens shards only per layer."""

    format = "safetensors"

    def __init__(self, directory: Path):
        self.dir = directory
        index = directory / "model.safetensors.index.json"
        self.index_file: Path | None = None
        if index.is_file():
            self.index_file = index
            try:
                weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            except (json.JSONDecodeError, KeyError, TypeError) as e:
                raise CheckpointError(f"{index}: not a safetensors index (needs a 'weight_map' object): {e}") from e
            self.map = {str(k): str(v) for k, v in weight_map.items()}
        else:
            files = sorted(directory.glob("*.safetensors"))
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
            for f in files:
                for k in self._open(f.name).keys():
                    self.map[k] = f.name
        self._shapes: dict[str, tuple[tuple[int, ...], str]] = {}

    def keys(self) -> list[str]:
        return list(self.map)

    def where(self, name: str) -> str:
        return str(self.dir / self.map[name])

    def _open(self, fname: str):
        from safetensors import safe_open

        path = self.dir / fname
        if not path.is_file():
            users = [k for k, v in self.map.items() if v == fname][:3] if hasattr(self, "map") else []
            raise MissingFileError(
                f"Shard {path} does not exist, but {self.index_file or 'the directory'} maps tensors to it "
                f"(e.g. {users}). Re-download or re-save the checkpoint."
            )
        try:
            return safe_open(str(path), framework="pt")
        except Exception as e:  # safetensors raises SafetensorError (an Exception subclass)
            raise CheckpointError(
                f"Cannot open shard {path}: {e}. The file is truncated or corrupt (its header promises more "
                "bytes than the file holds, or the header is unreadable); re-download it."
            ) from e

    def meta(self, names: list[str]) -> dict[str, tuple[tuple[int, ...], str]]:
        """Shapes and dtypes of ``names`` from the shard headers (no tensor data is read)."""
        by_file: dict[str, list[str]] = {}
        for n in names:
            if n not in self._shapes:
                by_file.setdefault(self.map[n], []).append(n)
        for fname, ns in by_file.items():
            f = self._open(fname)
            try:
                keys = set(f.keys())
                for n in ns:
                    if n not in keys:
                        raise CheckpointError(
                            f"Tensor {n!r} is missing from shard {self.dir / fname} although "
                            f"{self.index_file} maps it there. Re-download the shard."
                        )
                    sl = f.get_slice(n)
                    self._shapes[n] = (tuple(int(x) for x in sl.get_shape()), str(sl.get_dtype()))
            finally:
                del f
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
        return list(self.params)

    def where(self, name: str) -> str:
        return f"{self.name} parameter"

    def meta(self, names: list[str]) -> dict[str, tuple[tuple[int, ...], str]]:
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
        params = self.params

        class _R:
            def read(self, name: str, rows: slice = slice(None), cols: slice = slice(None)) -> Tensor:
                with torch.no_grad():
                    return params[name].detach()[rows, cols].cpu()

        yield _R()


class GGUFStore:
    """Tensors of a GGUF file (memory-mapped); dequantized per layer, pages released after."""

    format = "gguf"

    def __init__(self, path: Path):
        import gguf

        try:
            self.reader_ = gguf.GGUFReader(str(path), "r")
        except Exception as e:
            raise CheckpointError(
                f"Cannot read GGUF file {path}: {e}. The file is truncated or not a GGUF file."
            ) from e
        self.path = path
        self.tensors = {t.name: t for t in self.reader_.tensors}
        end = max((int(t.data_offset) + int(t.n_bytes) for t in self.reader_.tensors), default=0)
        size = path.stat().st_size
        if end > size:
            raise CheckpointError(f"GGUF file {path} is truncated: its tensors need {end} bytes, the file has {size}.")

    def field(self, key: str, default: Any = None) -> Any:
        f = self.reader_.fields.get(key)
        if f is None:
            return default
        return f.contents()

    def keys(self) -> list[str]:
        return list(self.tensors)

    def where(self, name: str) -> str:
        return str(self.path)

    def meta(self, names: list[str]) -> dict[str, tuple[tuple[int, ...], str]]:
        # GGUF shapes are stored ne0-first (reversed); report the torch (row-major) shape.
        return {
            n: (tuple(int(x) for x in reversed(self.tensors[n].shape.tolist())), self.tensors[n].tensor_type.name)
            for n in names
        }

    @contextlib.contextmanager
    def reader(self) -> Iterator[Any]:
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
            mm = getattr(self.reader_.data, "_mmap", None)
            if mm is not None and hasattr(mmap, "MADV_DONTNEED"):
                with contextlib.suppress(OSError, ValueError):
                    mm.madvise(mmap.MADV_DONTNEED)  # file-backed: drops pages from RSS, not from the page cache
