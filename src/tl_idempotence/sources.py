"""Attention O/V weights straight from checkpoint files, one layer at a time (SPEC section 9).

A 235B-parameter MoE model does not fit in memory, but every analysis here needs
only each layer's attention value (V) and output (O) weights — a few GB in all.
The sources in this module stream them layer by layer as
:class:`~tl_idempotence.heads.LayerHeads` (column form, unexpanded kv heads, the
stored dtype), reading nothing else:

* a Hugging Face model directory — ``config.json`` plus ``model.safetensors`` or
  shards with ``model.safetensors.index.json`` — memory-mapped with
  :func:`safetensors.safe_open`; per layer only the two tensors (for fused
  layouts only the V rows/columns, via ``get_slice``) are read, and the shard
  mappings are closed after every layer so resident memory stays one layer;
* a GGUF file (:class:`gguf.GGUFReader`, memory-mapped, and
  :func:`gguf.quants.dequantize` of the layer's two tensors only);
* a loaded ``transformers`` ``PreTrainedModel`` (its parameters, no copy of the model).

Where each architecture keeps those tensors is ONE shipped table,
``data/architectures.json`` (see its ``_format`` entry for the format and how to add
an architecture). Biases never enter ``T = O Vᵀ`` and are not read. The weights
are the checkpoint's own: no LayerNorm folding, no centring (``processing["raw"] = True``).

Errors (all ``ValueError`` unless noted) name the file and the tensor: a
truncated shard, a missing tensor, a shape that does not match ``config.json``,
NaN/inf in a weight (also the layer and head), an index that points to a missing
shard (``FileNotFoundError``), an unknown architecture (lists the supported ones).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import mmap
import os
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from .heads import LayerHeads, ModelInfo, kv_layout

__all__ = [
    "CheckpointSource",
    "architecture_table",
    "from_gguf",
    "from_hf_dir",
    "from_transformers",
    "maybe_source",
    "supported_architectures",
]

_FLOAT_DTYPES = {"F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32, "F64": torch.float64}


# --------------------------------------------------------------------------- the table


@lru_cache(maxsize=1)
def architecture_table() -> dict[str, Any]:
    """The shipped architecture table (``data/architectures.json``), parsed."""
    text = resources.files(__package__).joinpath("data/architectures.json").read_text(encoding="utf-8")
    return json.loads(text)


def supported_architectures() -> list[str]:
    """``model_type`` names with a table entry (aliases not included)."""
    return sorted(architecture_table()["architectures"])


def _how_to_add() -> str:
    t = architecture_table()
    example = json.dumps({"layer": "layers.{l}.", **{k: t["architectures"]["llama"][k] for k in ("v", "o")}})
    return (
        f"Supported model types: {', '.join(supported_architectures())} (and aliases "
        f"{', '.join(sorted(k for k in t['aliases'] if k[0].islower()))}). For a model whose attention uses the "
        "same tensor names as one of these, pass architecture='<that name>'. To add one, pass "
        f"architecture={{...}} with an entry like {example} (layouts: {', '.join(t['_format']['layouts'])}), "
        "or add it to tl_idempotence/data/architectures.json."
    )


def _resolve_architecture(config: dict[str, Any], architecture: str | dict[str, Any] | None) -> tuple[str, dict[str, Any]]:
    t = architecture_table()
    archs, aliases = t["architectures"], t["aliases"]
    if isinstance(architecture, dict):
        missing = [k for k in ("layer", "v", "o") if k not in architecture]
        if missing:
            raise ValueError(f"architecture entry lacks {missing}. {_how_to_add()}")
        for k in ("v", "o"):
            if architecture[k].get("layout") not in t["_format"]["layouts"]:
                raise ValueError(f"architecture['{k}']['layout'] = {architecture[k].get('layout')!r} is not a known layout. {_how_to_add()}")
        return "custom", architecture
    candidates: list[str] = []
    if architecture is not None:
        candidates = [architecture]
    else:
        candidates.append(str(config.get("model_type", "")))
        candidates += [str(a) for a in config.get("architectures") or []]
        text = config.get("text_config")
        if isinstance(text, dict):
            candidates.append(str(text.get("model_type", "")))
    for name in candidates:
        key = aliases.get(name, name)
        if key in archs:
            return key, archs[key]
    what = f"architecture={architecture!r}" if architecture is not None else (
        f"model_type={config.get('model_type')!r} (architectures={config.get('architectures')})"
    )
    raise ValueError(f"No attention-tensor layout is known for {what}. {_how_to_add()}")


@dataclass(frozen=True)
class Sizes:
    """Attention sizes from a config (``d_head`` may differ from ``d_model // n_heads``, e.g. Gemma)."""

    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_model: int
    d_head: int


def _sizes_from_config(config: dict[str, Any], where: str) -> Sizes:
    fields = architecture_table()["config_fields"]
    cfg = config.get("text_config") if isinstance(config.get("text_config"), dict) else config

    def get(key: str, required: bool = True) -> int | None:
        for name in fields[key]:
            v = cfg.get(name, config.get(name))
            if v is not None:
                return int(v)
        if required:
            raise ValueError(f"{where}: no {key} in the config (looked for {fields[key]}).")
        return None

    n_heads = get("n_heads")
    d_model = get("d_model")
    n_kv = get("n_kv_heads", required=False) or n_heads
    d_head = get("d_head", required=False) or d_model // n_heads
    s = Sizes(n_layers=get("n_layers"), n_heads=n_heads, n_kv_heads=n_kv, d_model=d_model, d_head=d_head)
    if min(s.n_layers, s.n_heads, s.n_kv_heads, s.d_model, s.d_head) <= 0 or s.n_heads % s.n_kv_heads:
        raise ValueError(f"{where}: inconsistent attention sizes {s} (n_heads must be a positive multiple of n_kv_heads).")
    return s


def _expected_shape(layout: str, kind: str, s: Sizes) -> tuple[int, int]:
    nq, nkv, dh, dm = s.n_heads, s.n_kv_heads, s.d_head, s.d_model
    if kind == "o":
        return {"linear": (dm, nq * dh), "conv1d": (nq * dh, dm)}[layout]
    return {
        "linear": (nkv * dh, dm),
        "fused_qkv": ((nq + 2 * nkv) * dh, dm),
        "neox_qkv": (3 * nq * dh, dm),
        "conv1d_qkv": (dm, (nq + 2 * nkv) * dh),
    }[layout]


# --------------------------------------------------------------------------- tensor stores


class _SafetensorsStore:
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
                raise ValueError(f"{index}: not a safetensors index (needs a 'weight_map' object): {e}") from e
            self.map = {str(k): str(v) for k, v in weight_map.items()}
        else:
            files = sorted(directory.glob("*.safetensors"))
            if not files:
                bins = sorted(p.name for p in directory.glob("*.bin"))
                hint = (f" It has {bins[:3]}: convert them to safetensors (e.g. load with transformers and "
                        "save_pretrained(safe_serialization=True)) or pass the loaded transformers model.") if bins else ""
                raise ValueError(f"{directory}: no *.safetensors files and no model.safetensors.index.json.{hint}")
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
            raise FileNotFoundError(
                f"Shard {path} does not exist, but {self.index_file or 'the directory'} maps tensors to it "
                f"(e.g. {users}). Re-download or re-save the checkpoint."
            )
        try:
            return safe_open(str(path), framework="pt")
        except Exception as e:  # safetensors raises SafetensorError (an Exception subclass)
            raise ValueError(
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
                        raise ValueError(
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
                    raise ValueError(f"Cannot read tensor {name!r} from {store.dir / fname}: {e}") from e

        try:
            yield _R()
        finally:
            handles.clear()  # drops the memory maps: pages read for this layer leave resident memory


class _ModuleStore:
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
                raise ValueError(f"Parameter {n!r} of the {self.name} is on the meta device (not loaded / offloaded).")
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


class _GGUFStore:
    """Tensors of a GGUF file (memory-mapped); dequantized per layer, pages released after."""

    format = "gguf"

    def __init__(self, path: Path):
        import gguf

        try:
            self.reader_ = gguf.GGUFReader(str(path), "r")
        except Exception as e:
            raise ValueError(f"Cannot read GGUF file {path}: {e}. The file is truncated or not a GGUF file.") from e
        self.path = path
        self.tensors = {t.name: t for t in self.reader_.tensors}
        end = max((int(t.data_offset) + int(t.n_bytes) for t in self.reader_.tensors), default=0)
        size = path.stat().st_size
        if end > size:
            raise ValueError(f"GGUF file {path} is truncated: its tensors need {end} bytes, the file has {size}.")

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
        return {n: (tuple(int(x) for x in reversed(self.tensors[n].shape.tolist())), self.tensors[n].tensor_type.name)
                for n in names}

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
                    raise ValueError(f"Cannot dequantize tensor {name!r} ({t.tensor_type.name}) of {path}: {e}") from e
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


# --------------------------------------------------------------------------- the source


def _find_root(keys: list[str], entry: dict[str, Any], s: Sizes, prefix: str | None, where: str) -> str:
    keyset = set(keys)
    v0 = entry["layer"].format(l=0) + entry["v"]["tensor"]
    o0 = entry["layer"].format(l=0) + entry["o"]["tensor"]
    if prefix is not None:
        if prefix + v0 not in keyset:
            raise ValueError(f"{where}: tensor {prefix + v0!r} not found (prefix={prefix!r}).")
        return prefix
    roots = [k[: -len(v0)] for k in keys if k.endswith(v0) and k[: -len(v0)] + o0 in keyset]
    roots = [r for r in roots if r == "" or r.endswith(".")]
    if not roots:
        near = [k for k in keys if ".0." in k and ("attn" in k or "attention" in k)][:6]
        raise ValueError(
            f"{where}: missing tensor — no '<root>{v0}' with a matching '<root>{o0}' among its {len(keys)} tensors "
            f"(layer-0 attention tensors present: {near}). The checkpoint lacks the attention weights or uses "
            f"another layout. {_how_to_add()}"
        )
    last = entry["layer"].format(l=s.n_layers - 1) + entry["v"]["tensor"]

    def rank(r: str) -> tuple[int, int, int]:
        return (r + last not in keyset, not any(w in r for w in ("language_model", "text")), len(r))

    return sorted(set(roots), key=rank)[0]


class CheckpointSource:
    """A :class:`~tl_idempotence.heads.HeadSource` over a tensor store (files or a transformers model).

    Iterating yields one :class:`~tl_idempotence.heads.LayerHeads` per layer with
    ``O [n_heads, d_model, d_head]`` and ``V [n_kv_heads, d_model, d_head]`` in the
    stored dtype (bf16/fp16/fp32; GGUF: float32 after dequantization); analyses promote
    per layer. Memory: one layer's O and V.

    Every layer's tensor names, shapes and dtypes are checked against the config
    when the source is made (headers only), so a bad file fails before any work.

    Raises:
        ValueError: missing tensor, shape mismatch with the config, unsupported dtype,
            non-finite weight (on reading the layer; names file, tensor, layer, head).
    """

    def __init__(self, store: Any, sizes: Sizes, entry: dict[str, Any], arch: str, root: str,
                 info: ModelInfo, check_finite: bool = True, v_entry: dict[str, Any] | None = None):
        self.store, self.sizes, self.arch, self.root = store, sizes, arch, root
        self.v_entry = v_entry or entry["v"]
        self.o_entry = entry["o"]
        self.layer_tpl = entry["layer"]
        self.check = check_finite
        self.info = info
        self._kv = kv_layout(sizes.n_heads, sizes.n_kv_heads)
        if self.v_entry["layout"] == "neox_qkv" and sizes.n_kv_heads != sizes.n_heads:
            raise ValueError(f"{arch}: the neox_qkv layout has one kv head per query head; config says "
                             f"{sizes.n_heads} heads, {sizes.n_kv_heads} kv heads.")
        self._validate()

    def names(self, layer: int) -> tuple[str, str]:
        """Full tensor names ``(v_name, o_name)`` of one layer."""
        pre = self.root + self.layer_tpl.format(l=layer)
        return pre + self.v_entry["tensor"], pre + self.o_entry["tensor"]

    def _validate(self) -> None:
        keys = set(self.store.keys())
        wanted: list[tuple[int, str, str]] = []
        for l in range(self.sizes.n_layers):
            for kind, name in zip(("v", "o"), self.names(l)):
                if name not in keys:
                    raise ValueError(
                        f"Missing tensor {name!r} (layer {l} attention {'value' if kind == 'v' else 'output'}) in "
                        f"{self._where_all()}; config.json says {self.sizes.n_layers} layers."
                    )
                wanted.append((l, kind, name))
        meta = self.store.meta([n for _, _, n in wanted])
        for l, kind, name in wanted:
            shape, dtype = meta[name]
            entry = self.v_entry if kind == "v" else self.o_entry
            exp = _expected_shape(entry["layout"], kind, self.sizes)
            if shape != exp:
                s = self.sizes
                raise ValueError(
                    f"Tensor {name!r} in {self.store.where(name)} has shape {list(shape)}, but the config "
                    f"(d_model={s.d_model}, n_heads={s.n_heads}, n_kv_heads={s.n_kv_heads}, d_head={s.d_head}) "
                    f"and layout {entry['layout']!r} need {list(exp)}. The config does not belong to these weights "
                    "(or head_dim is wrong)."
                )
            if self.store.format == "safetensors" and dtype not in _FLOAT_DTYPES:
                raise ValueError(
                    f"Tensor {name!r} in {self.store.where(name)} is stored as {dtype}; only "
                    f"{sorted(_FLOAT_DTYPES)} are supported (quantized FP8/int checkpoints need their scales: "
                    "use the bf16 release, or dequantize first)."
                )

    def _where_all(self) -> str:
        st = self.store
        if st.format == "safetensors":
            return str(st.index_file or st.dir)
        return str(getattr(st, "path", st.where("")))

    def layers(self) -> Iterator[int]:
        return iter(range(self.sizes.n_layers))

    def layer_heads(self, layer: int) -> LayerHeads:
        """Read one layer's O and V (only those two tensors) as :class:`LayerHeads`."""
        if not 0 <= int(layer) < self.sizes.n_layers:
            raise IndexError(f"Layer {layer} out of range: the checkpoint has layers 0..{self.sizes.n_layers - 1}.")
        s = self.sizes
        nq, nkv, dh, dm = s.n_heads, s.n_kv_heads, s.d_head, s.d_model
        v_name, o_name = self.names(layer)
        with self.store.reader() as r:
            lv = self.v_entry["layout"]
            if lv == "linear":
                V = r.read(v_name).reshape(nkv, dh, dm).transpose(1, 2)
            elif lv == "fused_qkv":
                V = r.read(v_name, rows=slice((nq + nkv) * dh, (nq + 2 * nkv) * dh)).reshape(nkv, dh, dm).transpose(1, 2)
            elif lv == "neox_qkv":
                V = torch.stack([r.read(v_name, rows=slice((3 * h + 2) * dh, (3 * h + 3) * dh)) for h in range(nq)])
                V = V.transpose(1, 2)
            elif lv == "conv1d_qkv":
                V = r.read(v_name, cols=slice((nq + nkv) * dh, (nq + 2 * nkv) * dh)).reshape(dm, nkv, dh).permute(1, 0, 2)
            else:  # pragma: no cover - checked in _resolve_architecture
                raise ValueError(f"Unknown V layout {lv!r}.")
            lo = self.o_entry["layout"]
            if lo == "linear":
                O = r.read(o_name).reshape(dm, nq, dh).permute(1, 0, 2)
            elif lo == "conv1d":
                O = r.read(o_name).reshape(nq, dh, dm).transpose(1, 2)
            else:  # pragma: no cover
                raise ValueError(f"Unknown O layout {lo!r}.")
        if self.check:
            self._check_finite(V, v_name, layer, "kv head")
            self._check_finite(O, o_name, layer, "head")
        return LayerHeads(layer=int(layer), O=O, V=V, kv_head_of=self._kv.clone())

    def _check_finite(self, X: Tensor, name: str, layer: int, what: str) -> None:
        # One float64 sum per head: NaN/inf propagate (no bf16/fp16/fp32 sum of finite values overflows float64),
        # and no boolean copy of the layer is made; the slow elementwise scan runs only on failure.
        if bool(torch.isfinite(X.sum(dim=(1, 2), dtype=torch.float64)).all()):
            return
        bad = ~torch.isfinite(X).flatten(1).all(dim=1)
        if bool(bad.any()):
            idx = bad.nonzero().flatten().tolist()
            n_nan = int(torch.isnan(X[idx[0]]).sum())
            raise ValueError(
                f"Non-finite values in tensor {name!r} ({self.store.where(name)}), layer {layer}, {what}"
                f"{'s' if len(idx) > 1 else ''} {idx[:10]}{' ...' if len(idx) > 10 else ''} "
                f"({n_nan} NaN in {what} {idx[0]}). The checkpoint is corrupt or overflowed; P is undefined there."
            )

    def __iter__(self) -> Iterator[LayerHeads]:
        for layer in self.layers():
            yield self.layer_heads(layer)

    def fingerprint(self) -> dict[str, Any]:
        """What identifies this checkpoint (for resume manifests): sizes, files and their hashes."""
        processing = {k: v for k, v in self.info.processing.items() if k != "path"}  # a moved directory still resumes
        # Config/index hashes do not tell two checkpoints of the same shape apart: hash layer 0's weights too.
        h = hashlib.sha256()
        with self.store.reader() as r:
            for name in self.names(0):
                t = r.read(name).contiguous()
                h.update(t.view(torch.uint8).numpy().tobytes())
        return {"architecture": self.arch, "sizes": dict(self.sizes.__dict__), "processing": processing,
                "v_tensor": self.names(0)[0], "o_tensor": self.names(0)[1], "layer0_sha256": h.hexdigest()}


def _sha256_file(path: Path, limit: int | None = None) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        remaining = limit
        while True:
            chunk = f.read(1 << 20 if remaining is None else min(1 << 20, remaining))
            if not chunk:
                break
            h.update(chunk)
            if remaining is not None:
                remaining -= len(chunk)
                if remaining <= 0:
                    break
    return h.hexdigest()


def _info(name: str, cls: str, s: Sizes, processing: dict[str, Any], extra: dict[str, Any]) -> ModelInfo:
    return ModelInfo(model_name=name, model_class=cls, n_layers=s.n_layers, n_heads=s.n_heads, n_kv_heads=s.n_kv_heads,
                     d_model=s.d_model, d_head=s.d_head, processing=processing, extra=extra)


_KNOWN_KW = {"architecture", "prefix", "check_finite"}


def _check_kwargs(kw: dict[str, Any]) -> None:
    unknown = set(kw) - _KNOWN_KW
    if unknown:
        raise TypeError(f"Unknown source option(s) {sorted(unknown)}; checkpoint sources accept {sorted(_KNOWN_KW)}.")


def from_hf_dir(path: str | os.PathLike, architecture: str | dict[str, Any] | None = None,
                prefix: str | None = None, check_finite: bool = True) -> CheckpointSource:
    """Source over a Hugging Face directory (``config.json`` + safetensors shards).

    Args:
        path: the directory.
        architecture: force a table entry (a ``model_type`` key) or pass a custom entry dict.
        prefix: the tensor-name root (e.g. ``"model."``); auto-detected by default.
        check_finite: raise on NaN/inf weights (names file, tensor, layer, head).

    Raises:
        FileNotFoundError: no config.json, or the index points to a missing shard.
        ValueError: unknown architecture, truncated shard, missing tensor, shape mismatch.
    """
    d = Path(path)
    cfg_file = d / "config.json"
    if not cfg_file.is_file():
        raise FileNotFoundError(f"{d} has no config.json: a Hugging Face model directory needs it for the head sizes.")
    try:
        config = json.loads(cfg_file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{cfg_file} is not valid JSON: {e}") from e
    arch, entry = _resolve_architecture(config, architecture)
    sizes = _sizes_from_config(config, str(cfg_file))
    store = _SafetensorsStore(d)
    root = _find_root(store.keys(), entry, sizes, prefix, str(store.index_file or d))
    files = sorted(set(store.map.values()))
    processing = {
        "raw": True,
        "fold_ln": False,
        "center_writing_weights": False,
        "source": "checkpoint file",
        "format": "safetensors",
        "path": str(d.resolve()),
        "files": files,
        "config_sha256": _sha256_file(cfg_file),
    }
    if store.index_file is not None:
        processing["index_sha256"] = _sha256_file(store.index_file)
    else:
        for f in files:  # the header (names, shapes, offsets) identifies a single-file checkpoint cheaply
            with open(d / f, "rb") as fh:
                n = int.from_bytes(fh.read(8), "little")
            processing.setdefault("header_sha256", {})[f] = _sha256_file(d / f, limit=8 + n)
    name = str(config.get("_name_or_path") or d.name)
    extra = {"format": "safetensors", "path": str(d), "architecture": arch, "tensor_root": root}
    info = _info(name, f"safetensors checkpoint ({arch})", sizes, processing, extra)
    return CheckpointSource(store, sizes, entry, arch, root, info, check_finite=check_finite)


def from_gguf(path: str | os.PathLike, check_finite: bool = True, **kw: Any) -> CheckpointSource:
    """Source over a GGUF file: llama.cpp tensor names, sizes from its metadata.

    ``{arch}.attention.head_count`` / ``head_count_kv`` / ``embedding_length`` /
    ``block_count`` / ``key_length`` (d_head; default ``embedding_length // head_count``).
    Quantized tensors are dequantized one layer at a time with :func:`gguf.quants.dequantize`.

    Raises:
        ValueError: truncated/unreadable file, missing metadata or tensor, shape mismatch.
    """
    p = Path(path)
    store = _GGUFStore(p)
    arch = store.field("general.architecture")
    if not arch:
        raise ValueError(f"{p}: no general.architecture in the GGUF metadata.")

    def num(key: str, default: Any = None) -> int:
        v = store.field(f"{arch}.{key}", default)
        if v is None:
            raise ValueError(f"{p}: GGUF metadata lacks {arch}.{key}.")
        if isinstance(v, (list, tuple)):
            if len(set(v)) != 1:
                raise ValueError(f"{p}: {arch}.{key} varies by layer ({v}); per-layer head counts are not supported.")
            v = v[0]
        return int(v)

    n_heads = num("attention.head_count")
    d_model = num("embedding_length")
    sizes = Sizes(n_layers=num("block_count"), n_heads=n_heads, n_kv_heads=num("attention.head_count_kv", n_heads),
                  d_model=d_model, d_head=num("attention.key_length", d_model // n_heads))
    entry = dict(architecture_table()["gguf"])
    v_entry = entry["v"]
    if entry["layer"].format(l=0) + entry["v"]["tensor"] not in store.tensors:
        v_entry = entry["v_fused"]
    entry = {**entry, "v": v_entry}
    processing = {
        "raw": True, "fold_ln": False, "center_writing_weights": False, "source": "checkpoint file", "format": "gguf",
        "path": str(p.resolve()), "files": [p.name], "file_size": p.stat().st_size,
        "header_sha256": _sha256_file(p, limit=int(store.reader_.data_offset)),
        "dequantized": sorted({store.tensors[n].tensor_type.name for n in store.tensors
                               if n.endswith((v_entry["tensor"], entry["o"]["tensor"]))}),
    }
    name = str(store.field("general.name") or p.stem)
    extra = {"format": "gguf", "path": str(p), "architecture": f"gguf:{arch}", "tensor_root": ""}
    info = _info(name, f"GGUF checkpoint ({arch})", sizes, processing, extra)
    return CheckpointSource(store, sizes, entry, f"gguf:{arch}", "", info, check_finite=check_finite)


def from_transformers(model: Any, architecture: str | dict[str, Any] | None = None, prefix: str | None = None,
                      check_finite: bool = True) -> CheckpointSource:
    """Source over a loaded ``transformers`` ``PreTrainedModel`` (read only; nothing is copied or modified).

    Raises:
        ValueError: unknown architecture, missing parameter, shape mismatch, meta-device weights.
    """
    config = model.config.to_dict()
    arch, entry = _resolve_architecture(config, architecture)
    sizes = _sizes_from_config(config, f"{type(model).__name__}.config")
    store = _ModuleStore(model)
    root = _find_root(store.keys(), entry, sizes, prefix, type(model).__name__)
    processing = {"raw": True, "fold_ln": False, "center_writing_weights": False,
                  "source": "transformers model parameters", "format": "transformers"}
    name = str(config.get("_name_or_path") or type(model).__name__)
    extra = {"format": "transformers", "architecture": arch, "tensor_root": root}
    info = _info(name, type(model).__name__, sizes, processing, extra)
    return CheckpointSource(store, sizes, entry, arch, root, info, check_finite=check_finite)


def _is_transformers_model(x: Any) -> bool:
    return any(c.__name__ == "PreTrainedModel" for c in type(x).__mro__) and hasattr(x, "config")


def maybe_source(x: Any, **kwargs: Any) -> CheckpointSource | None:
    """A checkpoint source for ``x``, or ``None`` when ``x`` is neither a path nor a ``transformers`` model.

    Args:
        x: a HF model directory, a ``.gguf`` file, a ``.safetensors`` file or ``config.json``
            inside a model directory, or a loaded ``transformers`` ``PreTrainedModel``.
        **kwargs: ``architecture``, ``prefix``, ``check_finite`` (see :func:`from_hf_dir`).

    Raises:
        FileNotFoundError: ``x`` is a path that does not exist (there is no hub download).
        TypeError: unknown keyword.
    """
    if isinstance(x, (str, os.PathLike)):
        _check_kwargs(kwargs)
        p = Path(x).expanduser()
        if p.is_dir():
            return from_hf_dir(p, **kwargs)
        if p.is_file():
            if p.suffix.lower() == ".gguf":
                return from_gguf(p, **{k: v for k, v in kwargs.items() if k == "check_finite"})
            if p.suffix in (".safetensors", ".json"):
                return from_hf_dir(p.parent, **kwargs)
            raise ValueError(f"{p}: not a .gguf file, a .safetensors file or a model directory.")
        raise FileNotFoundError(
            f"{str(x)!r} is not an existing file or directory. Pass a local Hugging Face model directory or a .gguf "
            "file (nothing is downloaded), or a model from tl_idempotence.models.load(...)."
        )
    if _is_transformers_model(x):
        _check_kwargs(kwargs)
        return from_transformers(x, **kwargs)
    return None
