"""Attention O/V weights straight from checkpoint files, one layer at a time (SPEC section 9).

A 235B-parameter MoE model does not fit in memory, but every analysis here needs only
each layer's attention value (V) and output (O) weights — a few GB in all. The sources
in this module stream them layer by layer as :class:`~tl_idempotence.core.heads.LayerHeads`
(column form, unexpanded kv heads, the stored dtype), reading nothing else:

* a Hugging Face model directory — ``config.json`` plus ``model.safetensors`` or shards
  with ``model.safetensors.index.json`` — memory-mapped with :func:`safetensors.safe_open`;
  per layer only the two tensors (for fused layouts only the V rows/columns, via
  ``get_slice``) are read, and the shard mappings are closed after every layer;
* a GGUF file (:class:`gguf.GGUFReader`, memory-mapped, and :func:`gguf.quants.dequantize`
  of the layer's two tensors only);
* a loaded ``transformers`` ``PreTrainedModel`` (its parameters, no copy of the model).

Where each architecture keeps those tensors is :mod:`.architectures`; how bytes are read
is :mod:`.stores`. The weights are the checkpoint's own: no LayerNorm folding, no centring
(``processing["raw"] = True``).

Errors name the file and the tensor (:class:`~tl_idempotence.errors.CheckpointError`): a
truncated shard, a missing tensor, a shape that does not match ``config.json``, NaN/inf
in a weight (also the layer and head), an index that points to a missing shard
(:class:`~tl_idempotence.errors.MissingFileError`), an unknown architecture.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from ..core.files import read_json, sha256_file
from ..core.heads import LayerHeads, ModelInfo, Sizes, check_weights, kv_layout
from ..core.options import check_bool
from ..errors import CheckpointError, MissingFileError, OptionError
from .architectures import architecture_table, expected_shape, how_to_add, resolve_architecture, sizes_from_config
from .stores import FLOAT_DTYPES, GGUFStore, ModuleStore, SafetensorsStore

__all__ = ["CheckpointSource", "from_gguf", "from_hf_dir", "from_path", "from_transformers", "is_transformers_model"]


def _find_root(keys: list[str], entry: dict[str, Any], s: Sizes, prefix: str | None, where: str) -> str:
    keyset = set(keys)
    v0 = entry["layer"].format(l=0) + entry["v"]["tensor"]
    o0 = entry["layer"].format(l=0) + entry["o"]["tensor"]
    if prefix is not None:
        if prefix + v0 not in keyset:
            raise CheckpointError(f"{where}: tensor {prefix + v0!r} not found (prefix={prefix!r}).")
        return prefix
    roots = [k[: -len(v0)] for k in keys if k.endswith(v0) and k[: -len(v0)] + o0 in keyset]
    roots = [r for r in roots if r == "" or r.endswith(".")]
    if not roots:
        near = [k for k in keys if ".0." in k and ("attn" in k or "attention" in k)][:6]
        raise CheckpointError(
            f"{where}: missing tensor — no '<root>{v0}' with a matching '<root>{o0}' among its {len(keys)} tensors "
            f"(layer-0 attention tensors present: {near}). The checkpoint lacks the attention weights or uses "
            f"another layout. {how_to_add()}"
        )
    last = entry["layer"].format(l=s.n_layers - 1) + entry["v"]["tensor"]

    def rank(r: str) -> tuple[int, int, int]:
        return (r + last not in keyset, not any(w in r for w in ("language_model", "text")), len(r))

    return sorted(set(roots), key=rank)[0]


class CheckpointSource:
    """A :class:`~tl_idempotence.core.heads.HeadSource` over a tensor store (files or a transformers model).

    Iterating yields one :class:`~tl_idempotence.core.heads.LayerHeads` per layer with
    ``O [n_heads, d_model, d_head]`` and ``V [n_kv_heads, d_model, d_head]`` in the
    stored dtype (bf16/fp16/fp32; GGUF: float32 after dequantization); analyses promote
    per layer. Memory: one layer's O and V.

    Every layer's tensor names, shapes and dtypes are checked against the config
    when the source is made (headers only), so a bad file fails before any work.

    Raises:
        ValueError: missing tensor, shape mismatch with the config, unsupported dtype,
            non-finite weight (on reading the layer; names file, tensor, layer, head).
    """

    def __init__(
        self,
        store: Any,
        sizes: Sizes,
        entry: dict[str, Any],
        arch: str,
        root: str,
        info: ModelInfo,
        check_finite: bool = True,
        v_entry: dict[str, Any] | None = None,
    ):
        self.store, self.sizes, self.arch, self.root = store, sizes, arch, root
        self.v_entry = v_entry or entry["v"]
        self.o_entry = entry["o"]
        self.layer_tpl = entry["layer"]
        self.check = check_finite
        self.info = info
        self._kv = kv_layout(sizes.n_heads, sizes.n_kv_heads)
        if self.v_entry["layout"] == "neox_qkv" and sizes.n_kv_heads != sizes.n_heads:
            raise CheckpointError(
                f"{arch}: the neox_qkv layout has one kv head per query head; config says "
                f"{sizes.n_heads} heads, {sizes.n_kv_heads} kv heads."
            )
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
                    raise CheckpointError(
                        f"Missing tensor {name!r} (layer {l} attention {'value' if kind == 'v' else 'output'}) in "
                        f"{self._where_all()}; config.json says {self.sizes.n_layers} layers."
                    )
                wanted.append((l, kind, name))
        meta = self.store.meta([n for _, _, n in wanted])
        for _, kind, name in wanted:
            shape, dtype = meta[name]
            entry = self.v_entry if kind == "v" else self.o_entry
            exp = expected_shape(entry["layout"], kind, self.sizes)
            if shape != exp:
                s = self.sizes
                raise CheckpointError(
                    f"Tensor {name!r} in {self.store.where(name)} has shape {list(shape)}, but the config "
                    f"(d_model={s.d_model}, n_heads={s.n_heads}, n_kv_heads={s.n_kv_heads}, d_head={s.d_head}) "
                    f"and layout {entry['layout']!r} need {list(exp)}. The config does not belong to these weights "
                    "(or head_dim is wrong)."
                )
            if self.store.format == "safetensors" and dtype not in FLOAT_DTYPES:
                raise CheckpointError(
                    f"Tensor {name!r} in {self.store.where(name)} is stored as {dtype}; only "
                    f"{sorted(FLOAT_DTYPES)} are supported (quantized FP8/int checkpoints need their scales: "
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
                V = (
                    r.read(v_name, rows=slice((nq + nkv) * dh, (nq + 2 * nkv) * dh))
                    .reshape(nkv, dh, dm)
                    .transpose(1, 2)
                )
            elif lv == "neox_qkv":
                V = torch.stack([r.read(v_name, rows=slice((3 * h + 2) * dh, (3 * h + 3) * dh)) for h in range(nq)])
                V = V.transpose(1, 2)
            elif lv == "conv1d_qkv":
                V = (
                    r.read(v_name, cols=slice((nq + nkv) * dh, (nq + 2 * nkv) * dh))
                    .reshape(dm, nkv, dh)
                    .permute(1, 0, 2)
                )
            else:  # pragma: no cover - checked in resolve_architecture
                raise CheckpointError(f"Unknown V layout {lv!r}.")
            lo = self.o_entry["layout"]
            if lo == "linear":
                O = r.read(o_name).reshape(dm, nq, dh).permute(1, 0, 2)
            elif lo == "conv1d":
                O = r.read(o_name).reshape(nq, dh, dm).transpose(1, 2)
            else:  # pragma: no cover
                raise CheckpointError(f"Unknown O layout {lo!r}.")
        if self.check:
            check_weights(V, f"Tensor {v_name!r} ({self.store.where(v_name)}), layer {layer},", "kv head")
            check_weights(O, f"Tensor {o_name!r} ({self.store.where(o_name)}), layer {layer},", "head")
        return LayerHeads(layer=int(layer), O=O, V=V, kv_head_of=self._kv.clone())

    def __iter__(self) -> Iterator[LayerHeads]:
        for layer in self.layers():
            yield self.layer_heads(layer)


def _info(name: str, cls: str, s: Sizes, processing: dict[str, Any], extra: dict[str, Any]) -> ModelInfo:
    return ModelInfo(**vars(s.sizes), model_name=name, model_class=cls, processing=processing, extra=extra)


def from_hf_dir(
    path: str | os.PathLike,
    architecture: str | dict[str, Any] | None = None,
    prefix: str | None = None,
    check_finite: bool = True,
) -> CheckpointSource:
    """Source over a Hugging Face directory (``config.json`` + safetensors shards).

    Args:
        path: the directory.
        architecture: force a table entry (a ``model_type`` key) or pass a custom entry dict.
        prefix: the tensor-name root (e.g. ``"model."``); auto-detected by default.
        check_finite: raise on NaN/inf weights (names file, tensor, layer, head).

    Raises:
        MissingFileError: no config.json, or the index points to a missing shard.
        CheckpointError: unknown architecture, malformed config, truncated shard, missing tensor,
            shape mismatch (each names the file).
    """
    check_finite = check_bool(check_finite, "check_finite")
    d = Path(path)
    cfg_file = d / "config.json"
    if not cfg_file.is_file():
        raise MissingFileError(f"{d} has no config.json: a Hugging Face model directory needs it for the head sizes.")
    config = read_json(cfg_file, CheckpointError, "config.json")
    arch, entry = resolve_architecture(config, architecture)
    sizes = sizes_from_config(config, str(cfg_file))
    store = SafetensorsStore(d)
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
        "config_sha256": sha256_file(cfg_file),
    }
    if store.index_file is not None:
        processing["index_sha256"] = sha256_file(store.index_file)
    else:
        headers: dict[str, str] = {}
        for f in files:  # the header (names, shapes, offsets) identifies a single-file checkpoint cheaply
            with open(d / f, "rb") as fh:
                n = int.from_bytes(fh.read(8), "little")
            headers[f] = sha256_file(d / f, limit=8 + n)
        processing["header_sha256"] = headers
    name = str(config.get("_name_or_path") or d.name)
    extra = {"format": "safetensors", "path": str(d), "architecture": arch, "tensor_root": root}
    info = _info(name, f"safetensors checkpoint ({arch})", sizes, processing, extra)
    return CheckpointSource(store, sizes, entry, arch, root, info, check_finite=check_finite)


def from_gguf(path: str | os.PathLike, check_finite: bool = True) -> CheckpointSource:
    """Source over a GGUF file: llama.cpp tensor names, sizes from its metadata.

    ``{arch}.attention.head_count`` / ``head_count_kv`` / ``embedding_length`` /
    ``block_count`` / ``key_length`` (d_head; default ``embedding_length // head_count``).
    Quantized tensors are dequantized one layer at a time with :func:`gguf.quants.dequantize`.

    Raises:
        CheckpointError: truncated/unreadable file, missing metadata or tensor, shape mismatch.
    """
    check_finite = check_bool(check_finite, "check_finite")
    p = Path(path)
    store = GGUFStore(p)
    arch = store.field("general.architecture")
    if not arch:
        raise CheckpointError(f"{p}: no general.architecture in the GGUF metadata.")

    def num(key: str, default: Any = None) -> int:
        v = store.field(f"{arch}.{key}", default)
        if v is None:
            raise CheckpointError(f"{p}: GGUF metadata lacks {arch}.{key}.")
        if isinstance(v, (list, tuple)):
            if len(set(v)) != 1:
                raise CheckpointError(
                    f"{p}: {arch}.{key} varies by layer ({v}); per-layer head counts are not supported."
                )
            v = v[0]
        return int(v)

    n_heads = num("attention.head_count")
    d_model = num("embedding_length")
    sizes = Sizes(
        n_layers=num("block_count"),
        n_heads=n_heads,
        n_kv_heads=num("attention.head_count_kv", n_heads),
        d_model=d_model,
        d_head=num("attention.key_length", d_model // n_heads),
    )
    entry = dict(architecture_table()["gguf"])
    v_entry = entry["v"]
    if entry["layer"].format(l=0) + entry["v"]["tensor"] not in store.tensors:
        v_entry = entry["v_fused"]
    entry = {**entry, "v": v_entry}
    processing = {
        "raw": True,
        "fold_ln": False,
        "center_writing_weights": False,
        "source": "checkpoint file",
        "format": "gguf",
        "path": str(p.resolve()),
        "files": [p.name],
        "file_size": p.stat().st_size,
        "header_sha256": sha256_file(p, limit=int(store.reader_.data_offset)),
        "dequantized": sorted(
            {
                store.tensors[n].tensor_type.name
                for n in store.tensors
                if n.endswith((v_entry["tensor"], entry["o"]["tensor"]))
            }
        ),
    }
    name = str(store.field("general.name") or p.stem)
    extra = {"format": "gguf", "path": str(p), "architecture": f"gguf:{arch}", "tensor_root": ""}
    info = _info(name, f"GGUF checkpoint ({arch})", sizes, processing, extra)
    return CheckpointSource(store, sizes, entry, f"gguf:{arch}", "", info, check_finite=check_finite)


def from_transformers(
    model: Any, architecture: str | dict[str, Any] | None = None, prefix: str | None = None, check_finite: bool = True
) -> CheckpointSource:
    """Source over a loaded ``transformers`` ``PreTrainedModel`` (read only; nothing is copied or modified).

    Raises:
        CheckpointError: unknown architecture, missing parameter, shape mismatch, meta-device weights.
    """
    check_finite = check_bool(check_finite, "check_finite")
    config = model.config.to_dict()
    arch, entry = resolve_architecture(config, architecture)
    sizes = sizes_from_config(config, f"{type(model).__name__}.config")
    store = ModuleStore(model)
    root = _find_root(store.keys(), entry, sizes, prefix, type(model).__name__)
    processing = {
        "raw": True,
        "fold_ln": False,
        "center_writing_weights": False,
        "source": "transformers model parameters",
        "format": "transformers",
    }
    name = str(config.get("_name_or_path") or type(model).__name__)
    extra = {"format": "transformers", "architecture": arch, "tensor_root": root}
    info = _info(name, type(model).__name__, sizes, processing, extra)
    return CheckpointSource(store, sizes, entry, arch, root, info, check_finite=check_finite)


def is_transformers_model(x: Any) -> bool:
    """Whether ``x`` is a loaded ``transformers`` ``PreTrainedModel`` (checked by class name; no import)."""
    return any(c.__name__ == "PreTrainedModel" for c in type(x).__mro__) and hasattr(x, "config")


def from_path(
    path: str | os.PathLike,
    *,
    architecture: str | dict[str, Any] | None = None,
    prefix: str | None = None,
    check_finite: bool = True,
) -> CheckpointSource:
    """A source over a checkpoint path: a HF model directory, a ``.gguf`` file, or a
    ``.safetensors`` / ``config.json`` file inside a model directory.

    Args:
        path: the path (``~`` expanded); nothing is downloaded.
        architecture, prefix: see :func:`from_hf_dir` (safetensors directories only).
        check_finite: raise on NaN/inf weights.

    Raises:
        MissingFileError: the path does not exist.
        OptionError: ``architecture``/``prefix`` given for a GGUF file (it uses llama.cpp names).
        CheckpointError: a file that is none of the above, or a bad checkpoint (see :func:`from_hf_dir`).
    """
    p = Path(path).expanduser()
    if p.is_dir():
        return from_hf_dir(p, architecture=architecture, prefix=prefix, check_finite=check_finite)
    if p.is_file():
        if p.suffix.lower() == ".gguf":
            if architecture is not None or prefix is not None:
                raise OptionError(
                    f"architecture= and prefix= apply to safetensors directories; the GGUF file {p} names its "
                    "tensors the llama.cpp way (blk.{l}.attn_v.weight) and needs neither."
                )
            return from_gguf(p, check_finite=check_finite)
        if p.suffix in (".safetensors", ".json"):
            return from_hf_dir(p.parent, architecture=architecture, prefix=prefix, check_finite=check_finite)
        raise CheckpointError(f"{p}: not a .gguf file, a .safetensors file or a model directory.")
    if p.exists():
        raise CheckpointError(f"{p} is neither a regular file nor a directory (a FIFO, socket or device?).")
    raise MissingFileError(
        f"{str(path)!r} is not an existing file or directory. Pass a local Hugging Face model directory or a .gguf "
        "file (nothing is downloaded), or a model from tl_idempotence.models.load(...)."
    )
