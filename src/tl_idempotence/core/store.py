"""THE store of every saved result: one folder, written beside its place and put there in one step.

Every result that saves itself (a report, head roles, a role association, a mechanism, head tokens, an attended-token
effect, an ablation, a comparison, a trajectory, a sweep's items) is a folder of files (parquet tables and one JSON
record, :mod:`tl_idempotence.core.records`), and every one of them is written by :func:`write_folder`:

1. **checks first**, before anything is written: the path's type, a file or a broken symbolic link where the folder
   goes, a non-empty folder without ``overwrite=True``, a folder that is not an earlier save of the same kind (the
   caller's ``owned`` callback reads its record and refuses it, naming it: nothing is deleted), a missing parent
   folder, the current folder (or one that holds it);
2. **writes every file into a new hidden folder beside the target** (``.NAME.tli-new-HOST-PID-RANDOM``), each file
   and the folder synced to disk;
3. **puts it in place in one step**: a fresh target (absent, or an empty folder) by ``rename(new, target)``, which the
   kernel refuses once another save has put a folder there, so of two saves into one fresh folder exactly one wins
   and the other raises :class:`~tl_idempotence.errors.OptionError` naming the folder (nothing of it is kept); an
   earlier save (``overwrite=True``) by exchanging the two folders atomically (Linux ``renameat2(RENAME_EXCHANGE)``,
   macOS ``renamex_np(RENAME_SWAP)``), after the folder's other files (a user's notes, a figure) are carried into
   the new one as hard links; where the system or file system has no exchange, by two renames, the earlier folder
   kept as ``.NAME.tli-old-RANDOM`` until the new one is in place, which :func:`saved_folder` reads when it finds no
   folder at the target (a kill between the two renames);
4. removes the earlier folder.

So a kill at any instant leaves the earlier save or the new one where a reader looks (never neither, never a mix),
and a reader never sees a folder that is still being written. What a killed save leaves beside the target is a
hidden ``.tli-new-`` folder, removed by the next save to that target on the same host once its writer is gone.

The test seam :data:`step_hook` is called before every change to the file system (and once at the end), so a test can
stop a save at any instant (``tests/unit/test_result_contract.py`` copies the folder there: what a ``SIGKILL`` at that
instant would leave).

Imports the standard library only (and the package's errors).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import shutil
import socket
import sys
import uuid
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

__all__ = [
    "NEW_MARK",
    "OLD_MARK",
    "exchange_folders",
    "install_folder",
    "saved_folder",
    "step_hook",
    "write_folder",
]

#: The infix of a save's folder while it is written (``.NAME.tli-new-HOST-PID-RANDOM``, beside the target).
NEW_MARK = ".tli-new-"
#: The infix of an earlier save kept while the new one is renamed into place (no atomic exchange on this system).
OLD_MARK = ".tli-old-"

#: Called as ``step_hook(step, path)`` before every change a save makes to the file system, and with ``"done"`` at
#: the end: a test seam (a test stops a save at any instant there). None in normal use.
step_hook: Callable[[str, Path], None] | None = None


def _step(step: str, path: Path) -> None:
    hook = step_hook
    if hook is not None:
        hook(step, path)


def _host() -> str:
    return "".join(c if c.isalnum() else "_" for c in socket.gethostname())[:32] or "host"


def _new_name(target: Path) -> Path:
    return target.with_name(f".{target.name}{NEW_MARK}{_host()}-{os.getpid()}-{uuid.uuid4().hex[:8]}")


def _fsync_dir(d: Path) -> None:
    try:
        fd = os.open(d, os.O_RDONLY)
    except OSError:  # pragma: no cover - a system that cannot open folders (Windows)
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover - some file systems refuse fsync of a folder
        pass
    finally:
        os.close(fd)


# ----------------------------------------------------------------------------- the atomic exchange of two folders

_RENAME_EXCHANGE = 2  # linux/fs.h
_RENAME_SWAP = 2  # macOS sys/stdio.h
_AT_FDCWD = -100


def _libc() -> Any:
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name, use_errno=True)
    except OSError:  # pragma: no cover - no C library to load
        return None


_LIBC = _libc() if sys.platform in ("linux", "darwin") else None


def exchange_folders(a: Path, b: Path) -> bool:
    """Exchange the folders ``a`` and ``b`` in one step (each name then names the other's contents); False where the
    system or the file system offers no atomic exchange (nothing was changed then).

    Raises:
        OSError: the exchange was refused for another reason (permissions, a missing folder).
    """
    if _LIBC is None:
        return False
    fa, fb = os.fsencode(a), os.fsencode(b)
    if sys.platform == "linux":
        fn = getattr(_LIBC, "renameat2", None)
        if fn is None:  # pragma: no cover - a C library before glibc 2.28
            return False
        fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
        rc = fn(_AT_FDCWD, fa, _AT_FDCWD, fb, _RENAME_EXCHANGE)
    else:  # pragma: no cover - macOS
        fn = getattr(_LIBC, "renamex_np", None)
        if fn is None:
            return False
        fn.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_uint]
        rc = fn(fa, fb, _RENAME_SWAP)
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV):
        return False  # not offered here (an older kernel, NFS, a FUSE file system)
    raise OSError(err, os.strerror(err), str(a), None, str(b))


#: How :func:`install_folder` put the last folder in place on this system: tests force the two-rename fallback by
#: setting ``exchange`` to a function returning False.
exchange: Callable[[Path, Path], bool] = exchange_folders


def _kept_old(target: Path) -> list[Path]:
    """Earlier saves kept beside ``target`` by a two-rename overwrite (``.NAME.tli-old-...``), newest first."""
    try:
        found = [p for p in target.parent.iterdir() if p.name.startswith(f".{target.name}{OLD_MARK}") and p.is_dir()]
    except OSError:
        return []
    return sorted(found, key=lambda p: p.stat().st_mtime_ns, reverse=True)


def saved_folder(path: Path, record_name: str) -> Path:
    """The folder a reader reads for the save at ``path``: ``path`` itself, or, where ``path`` is missing and a
    two-rename overwrite was stopped between its renames, the earlier save it kept beside it (one that holds
    ``record_name``). Raises nothing (a missing folder is the reader's to refuse, naming ``path``)."""
    if path.exists() or not path.parent.is_dir():
        return path
    for p in _kept_old(path):
        if (p / record_name).is_file():
            return p
    return path


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True
    return True


def _remove_stale(target: Path) -> None:
    """Remove what killed saves to ``target`` left beside it: new folders of this host whose writer is gone, and kept
    earlier saves (the target is in place again). Raises nothing."""
    prefix = f".{target.name}{NEW_MARK}{_host()}-"
    try:
        siblings = list(target.parent.iterdir())
    except OSError:
        return
    for p in siblings:
        if p.name.startswith(prefix):
            pid = p.name[len(prefix) :].split("-", 1)[0]
            if pid.isdigit() and not _alive(int(pid)):
                shutil.rmtree(p, ignore_errors=True)
        elif p.name.startswith(f".{target.name}{OLD_MARK}") and target.is_dir():
            shutil.rmtree(p, ignore_errors=True)


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst, follow_symlinks=False)
    except OSError:
        shutil.copy2(src, dst, follow_symlinks=False)


def _carry(entries: Iterable[Path], new: Path) -> set[str]:
    """Hard links (copies where a link is refused) of ``entries`` (files, links, folders) in the folder ``new``."""
    carried: set[str] = set()
    for p in entries:
        dst = new / p.name
        _step(f"carry {p.name}", dst)
        if p.is_dir() and not p.is_symlink():
            shutil.copytree(p, dst, symlinks=True, copy_function=_link_or_copy)
        elif p.is_symlink():
            os.symlink(os.readlink(p), dst)
        else:
            _link_or_copy(str(p), str(dst))
        carried.add(p.name)
    return carried


def install_folder(new: Path, target: Path, replace: bool, keep: Callable[[Path], bool] | None = None) -> None:
    """Put the complete folder ``new`` (a sibling of ``target``) at ``target`` in one step (module docstring, step 3).

    Args:
        new: the folder written (removed or moved: it is gone when this returns).
        target: where it goes; absent or an empty folder (``replace=False``), or an earlier save (``replace=True``).
        replace: exchange with the folder at ``target``.
        keep: with ``replace``, which entries of the earlier folder are not the earlier save's own (a user's files),
            carried into the new folder (default: none).

    Raises:
        FileExistsError: ``replace=False`` and another folder is at ``target`` (another save won).
        OSError: the file system refused a rename (the caller names the folder).
    """
    if not replace:
        _step("rename new to target", target)
        try:
            os.rename(new, target)
        except OSError as e:
            if e.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.EISDIR, errno.ENOTDIR):
                shutil.rmtree(new, ignore_errors=True)
                raise FileExistsError(errno.EEXIST, "another save is in place", str(target)) from e
            raise
        _fsync_dir(target.parent)
        return
    carried = _carry([p for p in target.iterdir() if keep is not None and keep(p)], new) if keep else set()
    _fsync_dir(new)
    _step("exchange new and target", target)
    if exchange(new, target):
        old = new  # the exchange left the earlier folder at the new one's name
    else:
        old = target.with_name(f".{target.name}{OLD_MARK}{uuid.uuid4().hex[:8]}")
        _step("rename target to old", old)
        os.rename(target, old)
        _step("rename new to target", target)
        os.rename(new, target)
    _fsync_dir(target.parent)
    if keep is not None:  # a user's file written into the earlier folder while this save ran: moved, not deleted
        for p in list(old.iterdir()):
            if p.name not in carried and keep(p) and not (target / p.name).exists():
                _step(f"move late {p.name}", target / p.name)
                os.rename(p, target / p.name)
    _step("remove old", old)
    shutil.rmtree(old, ignore_errors=True)


def write_folder(
    path: Any,
    files: Mapping[str, bytes],
    *,
    overwrite: bool,
    owned: Callable[[Path], Iterable[str]],
    what: str = "",
) -> Path:
    """Write ``files`` (``{file name: bytes}``, the record last) as the folder ``path``, atomically (module docstring).

    Args:
        path: the folder (``str`` or ``os.PathLike``, checked by the caller); a symbolic link to a folder is followed
            (the save replaces the folder it points to).
        files: every file of the save, by its path in the folder (``"a/b.parquet"`` for a part in a sub-folder),
            in the order written (the record last).
        overwrite: replace an earlier save at ``path``.
        owned: called with an existing non-empty folder when ``overwrite``: the names of the files the earlier save
            wrote there (everything else in it is carried into the new save), or it raises
            :class:`~tl_idempotence.errors.OptionError` naming why the folder is not an earlier save of this kind
            (nothing is deleted then).
        what: how messages name the result after "Cannot save" (``" the report"``; default nothing).

    Returns:
        The folder as given (expanded), holding the new save.

    Raises:
        OptionError: ``path`` is a file, a broken symbolic link, a non-empty folder without ``overwrite``, not an
            earlier save of this kind (``owned``), the current folder or one holding it; its parent folder does not
            exist; another save put a folder there while this one was written (two saves into one fresh folder: the
            first to finish wins); the file system refused a write (names the file). Nothing of a refused save stays.
    """
    from ..errors import OptionError

    d = Path(path).expanduser()
    where = f"Cannot save{what} to {d}"
    if d.is_symlink() and not d.exists():
        raise OptionError(f"{where}: it is a symbolic link to {os.readlink(d)}, which does not exist.")
    target = Path(os.path.realpath(d))
    cwd = Path(os.path.realpath(os.getcwd()))
    if target == cwd or target in cwd.parents:
        raise OptionError(
            f"{where}: it is the current folder or holds it, and a save replaces its folder as a whole. Give a folder "
            "below the current one, or change the current folder first."
        )
    replace = False
    owned_names: frozenset[str] = frozenset()
    try:
        if target.exists():
            if not target.is_dir():
                raise OptionError(f"{where}: it is a file.")
            if any(target.iterdir()):
                if not overwrite:
                    raise OptionError(f"{d} exists and is not empty; pass overwrite=True or another folder.")
                owned_names = frozenset(owned(target))
                replace = True
        if not target.parent.is_dir():
            raise OptionError(f"{where}: the folder {d.parent} does not exist.")
        _remove_stale(target)
        new = _new_name(target)
        _step("make new folder", new)
        new.mkdir()
    except OSError as e:
        raise OptionError(f"{where}: {e.strerror or e} ({e.filename or d}).") from e
    try:
        for name, data in files.items():
            f = new / name
            _step(f"write {name}", f)
            if f.parent != new:  # a part of the save in a sub-folder (a mechanism's head_tokens/)
                f.parent.mkdir(parents=True, exist_ok=True)
            with open(f, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
        _fsync_dir(new)
        install_folder(new, target, replace, keep=(lambda p: p.name not in owned_names) if replace else None)
    except FileExistsError as e:
        raise OptionError(
            f"{where}: another save put a folder there while this one was being written (two saves into one folder: "
            "the first to finish wins). Nothing of this save was kept; load that folder, or save to another."
        ) from e
    except OSError as e:
        raise OptionError(f"{where}: {e.strerror or e} ({e.filename or d}).") from e
    finally:
        if new.exists():  # a save refused or failed part-way: nothing of it stays
            shutil.rmtree(new, ignore_errors=True)
    _step("done", target)
    return d
