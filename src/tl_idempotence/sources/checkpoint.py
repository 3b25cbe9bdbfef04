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
is :mod:`.stores` (GGUF: :mod:`.gguf_store`). The weights are the checkpoint's own: no LayerNorm folding, no centring
(``processing["raw"] = True``).

Files are checked before anything is measured, and every way a file can lie is refused with
an error naming the file (:class:`~tl_idempotence.errors.CheckpointError` unless said otherwise;
details in :mod:`.stores` and :mod:`.gguf_store`):

* **ambiguous directories** — without an index, two ``*.safetensors`` files holding a tensor of
  the same name, or two complete sets of attention tensors (different roots) in disjoint files;
  with an index, an unindexed ``*.safetensors`` file holding attention tensors. Safe, and read
  together: unindexed shards with disjoint tensor names; unindexed files without attention
  tensors next to an index;
* **layer counts that lie** — a config / GGUF ``block_count`` declaring fewer layers than the
  files hold tensors for (``layers.{l}.`` / ``blk.{l}.`` with ``l >= n_layers``; extra
  multi-token-prediction layers declared by ``num_nextn_predict_layers`` are allowed), or more
  than they hold (a missing tensor; both name the declared and the found counts);
* **malformed metadata** — a ``config.json`` that is not a JSON object or not UTF-8, a size
  that is not a positive integer (``"four"``, ``4.0``, ``true``, ``0``, ``-1``), an index whose
  ``weight_map`` is not an object of ``.safetensors`` file names in the directory, GGUF
  metadata that is missing, not an integer or not positive (names the file and the field);
* **broken files** — missing (:class:`~tl_idempotence.errors.MissingFileError`), a directory,
  FIFO or other non-regular file (never opened), a dangling symbolic link or a link loop,
  permission denied, empty, a Git LFS pointer, a corrupt header, a truncated file, a file with
  trailing bytes, a missing tensor, a shape that does not match the config, NaN/inf in a
  weight (also the layer and head);
* **options** — ``architecture`` (``None``, a table name, an entry dict), ``prefix`` (``None``
  or a string), ``check_finite`` (a bool) and unknown keywords
  (:class:`~tl_idempotence.errors.UnknownOptionError`) are checked where they enter.

Models whose attention output passes through a norm after ``W_O`` (Gemma-2/3, OLMo-2: the
table entry's ``post_attention_norm``, checked to be in the files) are measured on ``W_O``
alone; ``info.extra["post_attention_norm"]`` says so, and the report's summary notes it.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..core.files import sha256_file, shareable_name
from ..core.heads import LayerHeads, ModelInfo, Sizes, kv_layout
from ..core.options import check_bool, strict_kwargs
from ..errors import CheckpointError, MissingFileError, OptionError, OptionTypeError
from .architectures import (
    architecture_table,
    attention_regex,
    check_architecture,
    how_to_add,
    layer_regex,
    resolve_architecture,
    sizes_from_config,
)
from .gguf_store import GGUFStore
from .layouts import get_layout
from .stores import FLOAT_DTYPES, ModuleStore, SafetensorsStore, check_file, read_metadata_json

__all__ = [
    "CheckpointSource",
    "from_gguf",
    "from_hf_dir",
    "from_path",
    "from_transformers",
    "is_transformers_model",
    "post_attention_note",
    "transformers_post_attention_note",
]


def _complete_roots(keys: list[str], entry: dict[str, Any]) -> list[str]:
    """Tensor-name roots under which layer 0 has both its V and its O tensor."""
    keyset = set(keys)
    v0 = entry["layer"].format(l=0) + entry["v"]["tensor"]
    o0 = entry["layer"].format(l=0) + entry["o"]["tensor"]
    roots = {k[: -len(v0)] for k in keys if k.endswith(v0) and k[: -len(v0)] + o0 in keyset}
    return sorted(r for r in roots if r == "" or r.endswith("."))


def _find_root(keys: list[str], entry: dict[str, Any], s: Sizes, prefix: str | None, where: str) -> str:
    keyset = set(keys)
    v0 = entry["layer"].format(l=0) + entry["v"]["tensor"]
    o0 = entry["layer"].format(l=0) + entry["o"]["tensor"]
    if prefix is not None:
        if prefix + v0 not in keyset:
            raise CheckpointError(f"{where}: tensor {prefix + v0!r} not found (prefix={prefix!r}).")
        return prefix
    roots = _complete_roots(keys, entry)
    if not roots:
        near = [k for k in keys if ".0." in k and ("attn" in k or "attention" in k)][:6]
        raise CheckpointError(
            f"{where}: missing tensor — no '<root>{v0}' with a matching '<root>{o0}' among its {len(keys)} tensors "
            f"(layer-0 attention tensors present: {near}). The checkpoint lacks the attention weights or uses "
            f"another layout. {how_to_add()}"
        )
    return _best_root(roots, keyset, entry, s.n_layers)


def _best_root(roots: list[str], keyset: set[str], entry: dict[str, Any], n_layers: int) -> str:
    """The root to measure among complete ones: one that holds the last layer's V too, then a language
    model's (``language_model``, ``text``) before another tower's, then the shortest."""
    last = entry["layer"].format(l=n_layers - 1) + entry["v"]["tensor"]

    def rank(r: str) -> tuple[int, int, int]:
        return (r + last not in keyset, not any(w in r for w in ("language_model", "text")), len(r))

    return sorted(roots, key=rank)[0]


def _layer_list(layers: list[int]) -> str:
    """``"layers 0..29"`` for a contiguous run, else the first indices."""
    if layers == list(range(layers[0], layers[-1] + 1)):
        return f"layers {layers[0]}..{layers[-1]}"
    return f"layers {layers[:12]}{' ...' if len(layers) > 12 else ''}"


def _attention_files(store: SafetensorsStore, entry: dict[str, Any], root: str) -> set[str]:
    """The files that hold ``root``'s attention V/O tensors (any layer)."""
    rx = layer_regex(root, entry)
    ends = (entry["v"]["tensor"], entry["o"]["tensor"])
    return {f for k, f in store.map.items() if rx.match(k) and k.endswith(ends)}


def _check_roots_unambiguous(store: SafetensorsStore, entry: dict[str, Any], root: str) -> None:
    """Without an index, two complete attention sets in disjoint files are two models, not one."""
    if store.index_file is not None or len(set(store.map.values())) < 2:
        return
    mine = _attention_files(store, entry, root)
    for other in _complete_roots(store.keys(), entry):
        theirs = _attention_files(store, entry, other)
        if other != root and not (theirs & mine):
            raise CheckpointError(
                f"{store.dir} is ambiguous: it holds two complete sets of attention tensors in different files and "
                f"no model.safetensors.index.json — root {root!r} in {sorted(mine)} and root {other!r} in "
                f"{sorted(theirs)}. One is likely a stray file from another model: move it out of the directory, "
                "or pass prefix= to say which root to measure."
            )


def post_attention_note(keys: list[str], entry: dict[str, Any], root: str, n_layers: int) -> str | None:
    """Whether a norm follows ``W_O`` in these tensors: THE one rule every source uses (SPEC section 10).

    The table entry names the norm (``post_attention_norm``, only where that tensor normalizes the
    attention output before the residual add: Gemma-2/3, OLMo-2; Llama's ``post_attention_layernorm`` is
    its pre-MLP norm and is not named); the note is made when the tensors hold it.

    Args:
        keys: tensor (or parameter) names. entry: the architecture entry. root: their root (``"model."``).
        n_layers: layers to look in.

    Returns:
        ``"the attention output passes through a norm after W_O ('<first name>', every layer)"`` (or
        ``k of n layers``), or ``None``.
    """
    name = entry.get("post_attention_norm")
    if not name:
        return None
    keyset = set(keys)
    have = [l for l in range(n_layers) if root + entry["layer"].format(l=l) + name in keyset]
    if not have:
        return None
    example = root + entry["layer"].format(l=have[0]) + name
    layers = "every layer" if len(have) == n_layers else f"{len(have)} of {n_layers} layers ({have[:8]})"
    return f"the attention output passes through a norm after W_O ({example!r}, {layers})"


_WRAPPER = re.compile(r"(?<![^.])_original_component\.")


def transformers_post_attention_note(model: Any) -> tuple[bool, str | None]:
    """:func:`post_attention_note` for a loaded ``transformers`` model (the TransformerBridge's wrapped model too).

    Returns:
        ``(known, note)``: ``known`` is False when the table has no entry for the model's config or its
        parameter names hold no root with the entry's V and O (then nothing is decided here).
    """
    try:
        config = model.config.to_dict()
        _arch, entry = resolve_architecture(config, None, type(model).__name__)
        sizes = sizes_from_config(config, type(model).__name__, entry)
    except (CheckpointError, AttributeError, TypeError):
        return False, None
    # a TransformerBridge wraps each module of the model it holds: "layers.0._original_component.self_attn...."
    keys = [_WRAPPER.sub("", n) for n, _ in model.named_parameters()]
    roots = _complete_roots(keys, entry)
    if not roots:
        return False, None
    root = _best_root(roots, set(keys), entry, sizes.n_layers)
    return True, post_attention_note(keys, entry, root, sizes.n_layers)


class CheckpointSource:
    """A :class:`~tl_idempotence.core.heads.HeadSource` over a tensor store (files or a transformers model).

    Iterating yields one :class:`~tl_idempotence.core.heads.LayerHeads` per layer with
    ``O [n_heads, d_model, d_head]`` and ``V [n_kv_heads, d_model, d_head]`` in the
    stored dtype (bf16/fp16/fp32; GGUF: float32 after dequantization); analyses promote
    per layer. Memory: one layer's O and V.

    Every layer's tensor names, shapes and dtypes are checked against the config
    when the source is made (headers only), so a bad file fails before any work; so is
    the layer count: tensors of a layer ``>= n_layers`` (beyond ``extra_layers`` declared
    multi-token-prediction layers) mean the config does not describe these files.

    Args:
        store, sizes, entry, arch, root, info: the tensor store, the config's sizes, the
            architecture entry and name, the tensor-name root, what is measured.
        check_finite: raise on NaN/inf as each layer is read.
        v_entry: the V part to use instead of ``entry["v"]`` (GGUF fused QKV).
        declared_by: where ``sizes.n_layers`` comes from, for messages.
        extra_layers: layers after ``n_layers`` the files may hold and that are not measured.
        sizes_from: where the other sizes come from, for messages (default ``declared_by``).

    Raises:
        CheckpointError: missing tensor, more or fewer layers in the files than declared, shape
            mismatch with the config, unsupported dtype (names the file and the tensor);
            non-finite weight on reading the layer (names file, tensor, layer, head).
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
        declared_by: str = "the config",
        extra_layers: int = 0,
        sizes_from: str | None = None,
    ):
        self.store, self.sizes, self.arch, self.root = store, sizes, arch, root
        self.v_entry = v_entry or entry["v"]
        self.o_entry = entry["o"]
        self.layer_tpl = entry["layer"]
        self.check = check_finite
        self.info = info
        self.declared_by = declared_by
        self.sizes_from = sizes_from or declared_by
        self.extra_layers = extra_layers
        self.v_layout = get_layout("v", self.v_entry["layout"])
        self.o_layout = get_layout("o", self.o_entry["layout"])
        self.v_layout.check_sizes(sizes, arch, declared_by)
        self._validate()
        self._kv = kv_layout(sizes.n_heads, sizes.n_kv_heads)  # after _validate: the sizes fit the tensors

    def names(self, layer: int) -> tuple[str, str]:
        """Full tensor names ``(v_name, o_name)`` of one layer."""
        pre = self.root + self.layer_tpl.format(l=layer)
        return pre + self.v_entry["tensor"], pre + self.o_entry["tensor"]

    def _layers_found(self, keys: set[str]) -> dict[int, str]:
        """Layer index -> one tensor name of that layer, for every layer the store holds tensors of."""
        rx = layer_regex(self.root, {"layer": self.layer_tpl})
        found: dict[int, str] = {}
        for k in sorted(keys):
            m = rx.match(k)
            if m:
                found.setdefault(int(m.group(1)), k)
        return found

    def _validate(self) -> None:
        keys = set(self.store.keys())
        n = self.sizes.n_layers
        found = self._layers_found(keys)
        beyond = sorted(l for l in found if l >= n + self.extra_layers)
        if beyond:
            mtp = f" (+{self.extra_layers} multi-token-prediction layers)" if self.extra_layers else ""
            key = found[beyond[0]]
            raise CheckpointError(
                f"{self._where_all()} holds tensors of {len(found)} layers ({_layer_list(sorted(found))}; e.g. "
                f"{key!r} in {self.store.where(key)}), but {self.declared_by} declares {n} layers{mtp}: measuring "
                f"only the first {n} would silently leave layers out. The config does not describe these files: fix "
                "its layer count or use the matching config."
            )
        wanted: list[tuple[int, str, str]] = []
        for l in range(n):
            for kind, name in zip(("v", "o"), self.names(l)):
                if name not in keys:
                    held = f"{len(found)} layers ({_layer_list(sorted(found))})" if found else "no layer tensors"
                    raise CheckpointError(
                        f"Missing tensor {name!r} (layer {l} attention {'value' if kind == 'v' else 'output'}) in "
                        f"{self._where_all()}; {self.declared_by} declares {n} layers, the files hold tensors of "
                        f"{held}."
                    )
                wanted.append((l, kind, name))
        meta = self.store.meta([n for _, _, n in wanted])
        for _, kind, name in wanted:
            shape, dtype = meta[name]
            layout = self.v_layout if kind == "v" else self.o_layout
            exp = layout.shape(self.sizes)
            if shape != exp:
                s = self.sizes
                raise CheckpointError(
                    f"Tensor {name!r} in {self.store.where(name)} has shape {list(shape)}, but the sizes of "
                    f"{self.sizes_from} (d_model={s.d_model}, n_heads={s.n_heads}, n_kv_heads={s.n_kv_heads}, "
                    f"d_head={s.d_head}) and layout {layout.name!r} need {list(exp)}. The config does not belong "
                    "to these weights (or head_dim is wrong)."
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

    @property
    def path(self) -> Path | None:
        """The checkpoint folder or GGUF file this source streams (None for a ``transformers`` model in memory):
        what an output of a run over it must never replace
        (:func:`~tl_idempotence.core.files.refuse_outputs_over_inputs`)."""
        if isinstance(self.store, SafetensorsStore):
            return Path(self.store.dir)
        if isinstance(self.store, GGUFStore):
            return Path(self.store.path)
        return None

    def layers(self) -> Iterator[int]:
        """The attention layer indices (every layer of the checkpoint)."""
        return iter(range(self.sizes.n_layers))

    def layer_heads(self, layer: int) -> LayerHeads:
        """Read one layer's O and V (only those two tensors) as :class:`LayerHeads`."""
        if not 0 <= int(layer) < self.sizes.n_layers:
            raise IndexError(f"Layer {layer} out of range: the checkpoint has layers 0..{self.sizes.n_layers - 1}.")
        v_name, o_name = self.names(layer)
        with self.store.reader() as r:
            V = self.v_layout.read(r, v_name, self.sizes)
            O = self.o_layout.read(r, o_name, self.sizes)
        lh = LayerHeads(layer=int(layer), O=O, V=V, kv_head_of=self._kv.clone())
        if self.check:
            lh.check_finite(
                o_name=f"Tensor {o_name!r} ({self.store.where(o_name)}), layer {layer},",
                v_name=f"Tensor {v_name!r} ({self.store.where(v_name)}), layer {layer},",
            )
        return lh

    def __iter__(self) -> Iterator[LayerHeads]:
        for layer in self.layers():
            yield self.layer_heads(layer)


def _raw_processing(source: str, fmt: str, **more: Any) -> dict[str, Any]:
    """``info.processing`` of every route: the raw weights (nothing folded, nothing centred), what they were read
    from (``source``, ``fmt``), then ``more`` (the route's path, files and sha256s) in the order given."""
    return {"raw": True, "fold_ln": False, "center_writing_weights": False, "source": source, "format": fmt, **more}


def _described_source(
    store: Any,
    sizes: Sizes,
    entry: dict[str, Any],
    arch: str,
    root: str,
    *,
    name: str,
    cls: str,
    processing: dict[str, Any],
    **options: Any,
) -> CheckpointSource:
    """The :class:`CheckpointSource` of every route and its :class:`ModelInfo`: ``name`` as it may be shared
    (:func:`~tl_idempotence.core.files.shareable_name`), ``cls``, ``processing``, and ``info.extra`` the format (and
    path) of ``processing``, the architecture, the tensor root and a note of a norm after ``W_O`` when the tensors
    hold one (:func:`post_attention_note`, the one rule); ``options`` as :class:`CheckpointSource`'s."""
    name = shareable_name(name)
    extra: dict[str, Any] = {"format": processing["format"]}
    if "path" in processing:
        extra["path"] = processing["path"]
    extra.update(architecture=arch, tensor_root=root)
    note = post_attention_note(store.keys(), entry, root, sizes.n_layers)
    if note:
        extra["post_attention_norm"] = note
    info = ModelInfo(**vars(sizes.sizes), model_name=name, model_class=cls, processing=processing, extra=extra)
    return CheckpointSource(store, sizes, entry, arch, root, info, **options)


def _check_prefix(prefix: Any) -> str | None:
    if prefix is not None and not isinstance(prefix, str):
        raise OptionTypeError(
            f"prefix must be None (auto-detect) or the tensor-name root as a string such as 'model.'; got "
            f"{type(prefix).__name__} {prefix!r}."
        )
    return prefix


def _check_path(path: Any, name: str = "path") -> Path:
    if isinstance(path, bytes) or not isinstance(path, (str, os.PathLike)):
        raise OptionTypeError(f"{name} must be a str or os.PathLike path; got {type(path).__name__} {path!r}.")
    p = Path(path).expanduser()
    if str(path) == "":
        raise OptionError(f"{name} is an empty string; pass a model directory or a .gguf file.")
    return p


def _stat_path(p: Path, what: str) -> os.stat_result:
    """``os.stat`` of a path given by the user, every failure turned into a message naming it."""
    try:
        return os.stat(p)
    except FileNotFoundError as e:
        if os.path.islink(p):
            raise CheckpointError(
                f"{what} {p} is a dangling symbolic link: it points to {os.readlink(p)!r}, which does not exist."
            ) from e
        raise MissingFileError(
            f"{str(p)!r} is not an existing file or directory. Pass a local Hugging Face model directory or a .gguf "
            "file (nothing is downloaded), or a model from tl_idempotence.models.load(...)."
        ) from e
    except PermissionError as e:
        raise CheckpointError(f"Cannot read {what} {p}: permission denied ({e.strerror}).") from e
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise CheckpointError(f"{what} {p} is a symbolic-link loop; replace it with the real path.") from e
        raise CheckpointError(f"Cannot read {what} {p}: {e.strerror or e}.") from e


def _extra_layers(config: dict[str, Any], where: str) -> int:
    """Multi-token-prediction layers stored after the declared ones (``num_nextn_predict_layers``)."""
    v = config.get("num_nextn_predict_layers")
    if v is None:
        return 0
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise CheckpointError(f"{where}: 'num_nextn_predict_layers' = {v!r} is not a non-negative integer.")
    return v


@strict_kwargs
def from_hf_dir(path: Any, architecture: Any = None, prefix: Any = None, check_finite: Any = True) -> CheckpointSource:
    """Source over a Hugging Face directory (``config.json`` + safetensors shards).

    What a directory may hold: ``model.safetensors.index.json`` naming the shard of every
    tensor (other ``*.safetensors`` files must then hold no attention tensors), or, without an
    index, ``*.safetensors`` shards with disjoint tensor names (see the module docstring for
    everything that is refused).

    Args:
        path: the directory (``str`` or ``os.PathLike``).
        architecture: ``None`` (from ``config.json``), a table name (a ``model_type`` key or
            alias) to force, or a custom entry dict
            (:func:`~tl_idempotence.sources.architectures.check_entry`).
        prefix: ``None`` or the tensor-name root (e.g. ``"model."``); auto-detected by default.
        check_finite: raise on NaN/inf weights (names file, tensor, layer, head).

    Raises:
        OptionTypeError / OptionError / UnknownOptionError: a bad argument; OptionError also for a folder that
            holds a saved report (``rep.save``) instead of a checkpoint.
        MissingFileError: no directory, no config.json, or the index points to a missing shard.
        CheckpointError: an ambiguous directory, a malformed config or index, a broken shard
            (truncated, trailing bytes, corrupt header, not a file, ...), a layer count that
            does not match the files, a missing tensor, a shape mismatch, an unknown
            architecture (each names the file).
    """
    d = _check_path(path)
    architecture = check_architecture(architecture)
    prefix = _check_prefix(prefix)
    check_finite = check_bool(check_finite, "check_finite")
    st = _stat_path(d, "model directory")
    if not stat.S_ISDIR(st.st_mode):
        raise CheckpointError(f"{d} is not a directory: a Hugging Face checkpoint is a folder with config.json.")
    try:  # a folder without read/search permission would otherwise read as "has no config.json"
        with os.scandir(d) as it:
            next(it, None)
    except OSError as e:
        raise CheckpointError(
            f"{d} cannot be listed ({e.strerror or type(e).__name__}): this process may not read the folder. "
            "Check its permissions (ls -ld) or run as a user who can read it."
        ) from e
    cfg_file = d / "config.json"
    if not os.path.lexists(cfg_file):
        if os.path.lexists(d / "report.json") and os.path.lexists(d / "heads.parquet"):
            # a folder rep.save wrote (the file names of report/store.py): say what it is instead
            raise OptionError(
                f"{d} holds a saved idempotence report (report.json, heads.parquet), not a model checkpoint: read it "
                "with tli.load_report(path); to measure a model, give its checkpoint folder or a zoo name."
            )
        raise MissingFileError(f"{d} has no config.json: a Hugging Face model directory needs it for the head sizes.")
    config = read_metadata_json(cfg_file, "config.json")
    if not isinstance(config, dict):
        raise CheckpointError(
            f"config.json {cfg_file} is a JSON {type(config).__name__}, not an object: it is not a model config."
        )
    arch, entry = resolve_architecture(config, architecture, str(cfg_file))
    sizes = sizes_from_config(config, str(cfg_file), entry)
    extra_layers = _extra_layers(config, str(cfg_file))
    store = SafetensorsStore(d, attention=attention_regex(entry))
    root = _find_root(store.keys(), entry, sizes, prefix, str(store.index_file or d))
    if prefix is None:
        _check_roots_unambiguous(store, entry, root)
    files = sorted(set(store.map.values()))
    processing = _raw_processing(
        "checkpoint file",
        "safetensors",
        path=d.name,  # the folder's name: what is shared never holds a machine path (its files' sha256 follow)
        files=files,
        config_sha256=sha256_file(cfg_file),
    )
    if store.index_file is not None:
        processing["index_sha256"] = sha256_file(store.index_file)
    else:
        # the header (names, shapes, offsets) identifies a single-file checkpoint cheaply
        processing["header_sha256"] = {f: sha256_file(d / f, limit=8 + store.header(f).header_len) for f in files}
    return _described_source(
        store,
        sizes,
        entry,
        arch,
        root,
        name=str(config.get("_name_or_path") or d.name),
        cls=f"safetensors checkpoint ({arch})",
        processing=processing,
        check_finite=check_finite,
        declared_by=f"config.json ({cfg_file})",
        extra_layers=extra_layers,
    )


def _refuse_split_gguf(store: GGUFStore, p: Path) -> None:
    """A part of a split GGUF holds only some layers: refused, saying how to merge the parts."""
    parts = store.field("split.count")
    if isinstance(parts, int) and not isinstance(parts, bool) and parts > 1:
        no = store.field("split.no")
        which = f"part {no + 1} of {parts}" if isinstance(no, int) else f"one of {parts} parts"
        raise CheckpointError(
            f"GGUF file {p} is {which} of a split GGUF (split.count = {parts}): it holds only some of the layers. "
            "Merge the parts first (llama-gguf-split --merge FIRST_PART OUT.gguf)."
        )


def _gguf_sizes(store: GGUFStore, p: Path) -> tuple[str, Sizes]:
    """``general.architecture`` and the attention sizes from a GGUF file's metadata (see :func:`from_gguf`)."""
    arch = store.field("general.architecture")
    if arch is None:
        raise CheckpointError(f"GGUF file {p}: no general.architecture in its metadata (the key that names the sizes).")
    if not isinstance(arch, str) or not arch:
        raise CheckpointError(f"GGUF file {p}: general.architecture = {arch!r} is not an architecture name.")

    def num(key: str, default: int | None = None) -> int:
        full = f"{arch}.{key}"
        v = store.field(full)
        if v is None:
            if default is None:
                raise CheckpointError(f"GGUF file {p}: its metadata lacks {full} (needed for the attention sizes).")
            return default
        if isinstance(v, (list, tuple)):
            if not v or len(set(v)) != 1:
                raise CheckpointError(
                    f"GGUF file {p}: {full} varies by layer ({v[:8]}{' ...' if len(v) > 8 else ''}); per-layer head "
                    "counts are not supported."
                )
            v = v[0]
        if isinstance(v, bool) or not isinstance(v, int):
            raise CheckpointError(f"GGUF file {p}: {full} = {v!r} is a {type(v).__name__}, not an integer.")
        if v <= 0:
            raise CheckpointError(f"GGUF file {p}: {full} = {v} must be a positive integer.")
        return v

    n_heads = num("attention.head_count")
    d_model = num("embedding_length")
    n_layers = num("block_count")
    n_kv = num("attention.head_count_kv", n_heads)
    if store.field(f"{arch}.attention.value_length") is not None:  # V and O are value_length wide
        d_head = num("attention.value_length")
    elif store.field(f"{arch}.attention.key_length") is not None:
        d_head = num("attention.key_length")
    elif d_model % n_heads:
        raise CheckpointError(
            f"GGUF file {p}: no {arch}.attention.value_length or key_length, and embedding_length={d_model} is not "
            f"a multiple of head_count={n_heads}: the head size is unknown."
        )
    else:
        d_head = d_model // n_heads
    try:
        sizes = Sizes(n_layers=n_layers, n_heads=n_heads, n_kv_heads=n_kv, d_model=d_model, d_head=d_head)
    except ValueError as e:
        raise CheckpointError(f"GGUF file {p}: inconsistent attention sizes ({e})") from e
    return arch, sizes


@strict_kwargs
def from_gguf(path: Any, check_finite: Any = True) -> CheckpointSource:
    """Source over a GGUF file: llama.cpp tensor names, sizes from its metadata.

    ``{arch}.attention.head_count`` / ``head_count_kv`` / ``embedding_length`` /
    ``block_count`` / ``value_length`` (d_head, the width of V and O per head; else
    ``key_length``, else ``embedding_length // head_count``),
    where ``arch`` is ``general.architecture``; each must be a positive integer (a per-layer
    array must be constant). Quantized tensors are dequantized one layer at a time with
    :func:`gguf.quants.dequantize`.

    Raises:
        OptionTypeError / UnknownOptionError: a bad argument.
        MissingFileError: no such file.
        CheckpointError: not a regular file / not GGUF / truncated / trailing bytes / corrupt
            metadata / a tensor type that is invalid or does not fit the tensor; a missing,
            non-integer or non-positive metadata value (names the key); a layer count that does not
            match the tensors; a missing tensor; a shape mismatch.
    """
    p = _check_path(path)
    check_finite = check_bool(check_finite, "check_finite")
    store = GGUFStore(p)
    _refuse_split_gguf(store, p)
    arch, sizes = _gguf_sizes(store, p)
    n_layers = sizes.n_layers
    entry = dict(architecture_table()["gguf"])
    v_entry = entry["v"]
    if entry["layer"].format(l=0) + entry["v"]["tensor"] not in store.tensors:
        v_entry = entry["v_fused"]
    entry = {**entry, "v": v_entry}
    processing = _raw_processing(
        "checkpoint file",
        "gguf",
        path=p.name,
        files=[p.name],
        file_size=p.stat().st_size,
        header_sha256=sha256_file(p, limit=int(store.reader_.data_offset)),
        dequantized=sorted(
            {
                store.tensors[n].tensor_type.name
                for n in store.tensors
                if n.endswith((v_entry["tensor"], entry["o"]["tensor"]))
            }
        ),
    )
    return _described_source(
        store,
        sizes,
        entry,
        f"gguf:{arch}",
        "",
        name=str(store.field("general.name") or p.stem),
        cls=f"GGUF checkpoint ({arch})",
        processing=processing,
        check_finite=check_finite,
        declared_by=f"the GGUF metadata ({arch}.block_count = {n_layers})",
        sizes_from=f"the GGUF metadata of {p}",
    )


@strict_kwargs
def from_transformers(
    model: Any, architecture: Any = None, prefix: Any = None, check_finite: Any = True
) -> CheckpointSource:
    """Source over a loaded ``transformers`` ``PreTrainedModel`` (read only; nothing is copied or modified).

    Args:
        model: the model.
        architecture, prefix, check_finite: see :func:`from_hf_dir`.

    Raises:
        OptionTypeError / OptionError / UnknownOptionError: a bad argument.
        CheckpointError: unknown architecture, a config that is not a dict of sizes, missing
            parameter, more layers than the config declares, shape mismatch, meta-device weights.
    """
    architecture = check_architecture(architecture)
    prefix = _check_prefix(prefix)
    check_finite = check_bool(check_finite, "check_finite")
    config = model.config.to_dict()
    where = f"{type(model).__name__}.config"
    if not isinstance(config, dict):
        raise CheckpointError(f"{where}.to_dict() gave a {type(config).__name__}, not a dict.")
    arch, entry = resolve_architecture(config, architecture, where)
    sizes = sizes_from_config(config, where, entry)
    store = ModuleStore(model)
    root = _find_root(store.keys(), entry, sizes, prefix, type(model).__name__)
    return _described_source(
        store,
        sizes,
        entry,
        arch,
        root,
        name=str(config.get("_name_or_path") or type(model).__name__),
        cls=type(model).__name__,
        processing=_raw_processing("transformers model parameters", "transformers"),
        check_finite=check_finite,
        declared_by=where,
        extra_layers=_extra_layers(config, where),
    )


def is_transformers_model(x: Any) -> bool:
    """Whether ``x`` is a loaded ``transformers`` ``PreTrainedModel`` (checked by class name; no import)."""
    return any(c.__name__ == "PreTrainedModel" for c in type(x).__mro__) and hasattr(x, "config")


@strict_kwargs
def from_path(path: Any, *, architecture: Any = None, prefix: Any = None, check_finite: Any = True) -> CheckpointSource:
    """A source over a checkpoint path: a HF model directory, a ``.gguf`` file, or a
    ``.safetensors`` / ``config.json`` file inside a model directory.

    Args:
        path: the path (``str`` or ``os.PathLike``; ``~`` expanded); nothing is downloaded.
        architecture, prefix: see :func:`from_hf_dir` (safetensors directories only).
        check_finite: raise on NaN/inf weights.

    Raises:
        OptionTypeError / OptionError / UnknownOptionError: a bad argument;
            ``architecture``/``prefix`` given for a GGUF file (it uses llama.cpp names).
        MissingFileError: the path does not exist.
        CheckpointError: a path that is none of the above (a FIFO, a symbolic-link loop, a
            dangling link, another suffix), or a bad checkpoint (see :func:`from_hf_dir`,
            :func:`from_gguf`).
    """
    p = _check_path(path)
    architecture = check_architecture(architecture)
    prefix = _check_prefix(prefix)
    check_finite = check_bool(check_finite, "check_finite")
    st = _stat_path(p, "checkpoint path")
    if stat.S_ISDIR(st.st_mode):
        return from_hf_dir(p, architecture=architecture, prefix=prefix, check_finite=check_finite)
    if p.suffix.lower() == ".gguf":
        if architecture is not None or prefix is not None:
            raise OptionError(
                f"architecture= and prefix= apply to safetensors directories; the GGUF file {p} names its "
                "tensors the llama.cpp way (blk.{l}.attn_v.weight) and needs neither."
            )
        return from_gguf(p, check_finite=check_finite)
    if p.suffix in (".safetensors", ".json"):
        if not stat.S_ISREG(st.st_mode):
            check_file(p, "checkpoint file")  # says what it is instead (a FIFO, a socket, ...)
        return from_hf_dir(p.parent, architecture=architecture, prefix=prefix, check_finite=check_finite)
    if not stat.S_ISREG(st.st_mode):
        check_file(p, "checkpoint path")
    raise CheckpointError(f"{p}: not a .gguf file, a .safetensors file or a model directory.")
