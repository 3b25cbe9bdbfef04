"""The zoo cache: where it is, the records of built folders, sha256 verification on every use, the lock that
serializes builds, and disk-full errors that say what to do. Builds nothing itself (:mod:`.download`,
:mod:`.convert`)."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ...core.files import atomic_write_text, read_json, sha256_file
from ...errors import CacheError, ChecksumError, ZooError
from .registry import known_models, member_names, model_spec

__all__ = [
    "CACHE_ENV",
    "MARKER",
    "MARKER_FORMAT",
    "building",
    "cache_dir",
    "cache_folder_of",
    "cache_lock",
    "disk_error",
    "disk_guard",
    "files_present",
    "is_cached",
    "progress_steps",
    "read_marker",
    "verify",
    "verify_files",
    "write_marker",
]

#: Environment variable that overrides the cache directory.
CACHE_ENV = "TL_IDEMPOTENCE_CACHE"


#: The record written last in a built ``attention/`` or ``hf/`` folder.
MARKER = "tli_cache.json"


MARKER_FORMAT = "tl_idempotence.zoo-cache/1"


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


def _repair(name: str) -> str:
    return (
        f"Run `tl-idempotence fetch --force {name}` (or tl_idempotence.models.fetch({name!r}, force=True)) "
        "to rebuild it."
    )


def cache_folder_of(path: Any) -> Path | None:
    """The zoo cache folder that ``path`` lies in or is, else None.

    A zoo model's entry ``<cache>/<name>`` and its ``files/``, ``attention/`` and ``hf/`` folders are the
    library's own: ``files/`` is a safetensors model's checkpoint folder (a new ``*.json`` there is read with
    it), and ``fetch --force`` / a rebuild deletes them. An output written there is refused (the CLI's
    ``--out``, ``--csv``, ``--resume``, ``sweep --out`` / ``--html``). Symbolic links are resolved; ``<name>``
    must be a zoo model's name, so other files in a cache folder set by ``$TL_IDEMPOTENCE_CACHE`` are free.

    Returns:
        ``<cache>/<name>/<folder>`` for a path below it (``<cache>/<name>`` for the entry or a file directly in
        it); None for anything else (also a path that is not ``str`` / ``os.PathLike`` or is empty).

    Raises:
        Nothing of its own: a path that is not text or a path-like object, or that lies outside the cache, is None.
    """
    if not isinstance(path, (str, os.PathLike)) or not str(os.fspath(path)).strip():
        return None
    root = Path(os.path.realpath(cache_dir()))
    target = Path(os.path.realpath(Path(os.fspath(path)).expanduser()))
    try:
        parts = target.relative_to(root).parts
    except ValueError:
        return None
    if not parts or parts[0] not in known_models():
        return None
    return root.joinpath(*parts[: max(1, min(2, len(parts) - 1))])


def verify_files(d: Path, expected: dict[str, str], name: str, what: str) -> None:
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


def read_marker(d: Path, spec: dict[str, Any]) -> dict[str, Any] | None:
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


def files_present(spec: dict[str, Any], root: Path) -> bool:
    d = root / spec["name"] / "files"
    return all((d / f).is_file() for f in member_names(spec))


def is_cached(name: str) -> dict[str, bool]:
    """Which cache folders of ``name`` exist (not verified): ``{"files", "attention", "hf"}``."""
    spec = model_spec(name)
    base = cache_dir() / name
    return {
        "files": files_present(spec, cache_dir()),
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
    if files_present(spec, cache_dir()):
        verify_files(base / "files", member_names(spec), name, "wheel members")
        out["files"] = len(spec["members"])
    for kind in ("attention", "hf"):
        rec = read_marker(base / kind, spec)
        if rec is not None:
            verify_files(base / kind, rec["files"], name, f"{kind}/ folder")
            out[kind] = len(rec["files"])
    return out


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


def write_marker(d: Path, spec: dict[str, Any], kind: str, **extra: Any) -> None:
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


def disk_error(e: OSError, where: Path, spec: dict[str, Any]) -> ZooError:
    need_mb = int(3 * spec.get("wheel_size", 10**8) / 2**20) + 600
    return ZooError(
        f"Out of disk space while writing to {where} ({e.strerror}). The {spec['name']} cache needs about "
        f"{need_mb} MB free during conversion. Free space there, or set {CACHE_ENV} to a directory on a disk "
        "with room."
    )


@contextlib.contextmanager
def disk_guard(where: Path, spec: dict[str, Any]) -> Iterator[None]:
    """Turn ENOSPC/EDQUOT into a clear :class:`ZooError`."""
    try:
        yield
    except OSError as e:
        if e.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", -1)):
            raise disk_error(e, where, spec) from e
        raise


@contextlib.contextmanager
def building(out: Path, spec: dict[str, Any]) -> Iterator[Path]:
    """A temporary folder to build ``out`` in (``.<out's name>-*`` beside it: what :func:`cache_lock` removes
    when a killed build left it). When the block ends without an error the folder replaces ``out`` by an
    atomic rename, so no process ever sees a half-built ``out``; on any error it is removed and ``out`` is
    left as it was. Caller holds the lock.

    Raises:
        ZooError: the disk is full (:func:`disk_guard`); anything the block raises.
    """
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        with disk_guard(tmp, spec):
            yield tmp
            if out.exists():
                shutil.rmtree(out)
            os.replace(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def cache_lock(root: Path, name: str) -> Iterator[None]:
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


def progress_steps(desc: str, total: int, enabled: bool) -> Any:
    from ...core.progress import progress_bar

    return progress_bar(total=total, desc=desc, unit="step", enabled=enabled, leave=False)
