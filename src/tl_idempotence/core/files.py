"""File helpers every layer shares: sha256 of files and bytes, atomic writes, JSON that names its file.

* :func:`sha256_file` — streamed hex sha256 (optionally of the first ``limit`` bytes).
* :func:`atomic_write_bytes` / :func:`atomic_write_text` — write a temp file in the same
  directory, ``fsync``, ``os.replace``: a file with its final name is always complete; a stream
  (:func:`is_stream`: ``/dev/null``, ``/dev/stdout``, a named pipe) is written in place.
* :func:`is_stdout` — whether a path is this process's standard output (by name, or the same file as file
  descriptor 1): where a command writes its data, its human text goes to stderr.
* :func:`read_json` — parse a JSON file; an unreadable or malformed file raises the
  caller's error class with the file's name (never a bare ``JSONDecodeError``).
* :func:`package_code_sha256` — sha256 of this package's own code and data files: what resumed
  parts and reused sweep results key on besides the version number (an editable install or a
  source tree keeps one version number across changes of the maths).

* :func:`check_work_folder` — the one rule for a folder a run creates or reuses (``resume=``,
  ``sweep(out=)``, ``--resume``, ``sweep --out``).
* :func:`refuse_outputs_over_inputs` — the one rule that an output (a page, a CSV, a saved report, a
  resume or sweep folder) never replaces a file or folder the run reads.

Imports the standard library only (and the package's errors).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import stat
import sys
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any, TypeGuard

__all__ = [
    "atomic_write_bytes",
    "atomic_write_text",
    "check_work_folder",
    "is_stdout",
    "is_stream",
    "package_code_sha256",
    "read_json",
    "record_digest",
    "refuse_outputs_over_inputs",
    "sha256_bytes",
    "sha256_file",
    "shareable_name",
]


def check_work_folder(x: Any, name: str, error: type[Exception] | None = None) -> Path:
    """A folder a run creates or reuses, checked before any work: a ``str``/``os.PathLike`` that is not
    empty (``""`` would be the current folder), not an existing file, and whose parent folder exists
    (the run creates the folder, never a chain of folders from a typo). The same rule on every route.

    Args:
        x: the folder. name: how messages name it (``"resume"``, ``"out"``).
        error: the error class of a refused value (default :class:`OptionError`; the report's ``resume=``
            raises :class:`ResumeError`, a ``ValueError`` too).

    Returns:
        The user-expanded path (not created here).

    Raises:
        OptionTypeError: not a path. OptionError (or ``error``): empty, a file, or a missing parent folder.
    """
    from ..errors import OptionError, OptionTypeError

    error = error or OptionError

    if not isinstance(x, (str, os.PathLike)):
        raise OptionTypeError(f"{name} must be a folder path; got {type(x).__name__}.")
    if not str(os.fspath(x)).strip():
        raise error(f"{name} must not be empty; give a folder (an empty path would be the current folder).")
    p = Path(x).expanduser()
    if p.exists() and not p.is_dir():
        raise error(f"{name}: {os.fspath(x)} is a file, not a directory; give a folder.")
    if not p.exists() and not p.absolute().parent.is_dir():
        raise error(f"{name}: the folder {p.absolute().parent} does not exist.")
    return p


#: How many folder levels below an input folder :func:`refuse_outputs_over_inputs` looks at: the zoo cache
#: keeps its files at ``<cache>/<name>/<kind>/<file>``; a checkpoint, resume or saved report folder at its top.
INPUT_FOLDER_DEPTH = 3

#: A path given to :func:`refuse_outputs_over_inputs`: ``(how messages name it, the path or None)``.
NamedPath = tuple[str, str | os.PathLike[str] | None]


def _is_path(p: Any) -> TypeGuard[str | os.PathLike[str]]:
    """A non-empty ``str`` or ``os.PathLike`` (anything else is left to the writer's own checks, which name it)."""
    return isinstance(p, (str, os.PathLike)) and bool(str(os.fspath(p)).strip())


def _file_id(p: str | os.PathLike[str]) -> tuple[int, int] | None:
    """``(st_dev, st_ino)`` of the file ``p`` names, symbolic links followed; None for no file (or a folder)."""
    try:
        st = os.stat(p)
    except (OSError, ValueError):
        return None
    return (st.st_dev, st.st_ino) if not stat.S_ISDIR(st.st_mode) else None


def _files_below(root: str, depth: int) -> Iterable[str]:
    """The files in the folder ``root`` and its subfolders down to ``depth`` levels (symbolic links to folders
    are not descended; links to files are listed: what they point to is what a reader reads)."""
    try:
        with os.scandir(root) as it:
            entries = list(it)
    except OSError:
        return
    for e in entries:
        try:
            is_dir = e.is_dir(follow_symlinks=False)
        except OSError:
            continue
        if is_dir:
            if depth > 1:
                yield from _files_below(e.path, depth - 1)
        else:
            yield e.path


def refuse_outputs_over_inputs(outputs: Iterable[NamedPath], inputs: Iterable[NamedPath]) -> None:
    """Refuse, before any work, an output that would replace a file or folder the run reads.

    The one rule of every writer (the CLI's ``--out``, ``--csv``, ``--html``, ``--resume`` and ``sweep --out``;
    ``rep.save_html``, ``rep.save``, the comparison and sweep pages, ``resume=``). An output is refused when

    * its path with symbolic links resolved (:func:`os.path.realpath`) is an input's path (a file or a folder,
      existing or not); or
    * it exists and is the same file (``st_dev`` and ``st_ino``, so a hard link or a symbolic link is seen
      through) as an input file, or as a file in an input folder (down to :data:`INPUT_FOLDER_DEPTH` levels;
      a symbolic link in the folder counts as the file it points to, as a reader reads it).

    A new file in an input folder (``CK/report.html`` beside a checkpoint) replaces nothing and is allowed.
    Input folders are listed only when an output already exists (the common case costs a ``stat`` per path).

    Args:
        outputs: ``(name, path)`` pairs: how a message names the output (``"--out"``, ``"path"``, ``"resume"``)
            and the file or folder it writes (``str`` or ``os.PathLike``; ``None``, an empty path or another type is
            skipped: the writer's own checks refuse it).
        inputs: ``(what, path)`` pairs: what the run reads (``"the checkpoint"``, ``"the zoo cache"``, ``"the resume
            folder"``) and its file or folder (``None`` is skipped; it need not exist).

    Raises:
        OutputOverInputError (an :class:`OptionError`): an output over an input; the message names both paths
            (and the file they share).
    """
    from ..errors import OutputOverInputError

    outs = [(name, Path(p).expanduser()) for name, p in outputs if _is_path(p)]
    if not outs:
        return
    ins = [(what, Path(p).expanduser()) for what, p in inputs if _is_path(p)]
    real: dict[str, tuple[str, Path]] = {}
    for what, p in ins:
        real.setdefault(os.path.realpath(p), (what, p))
    for name, out in outs:
        hit = real.get(os.path.realpath(out))
        if hit is not None:
            how = "is a symbolic link to" if out.is_symlink() and not hit[1].is_symlink() else "is"
            raise OutputOverInputError(
                f"{name} {out} {how} {hit[0]} {hit[1]}, which this run reads: an output never replaces an input. "
                "Give another path."
            )
    existing = [(name, out, fid) for name, out in outs if (fid := _file_id(out)) is not None]
    if not existing:
        return
    wanted = {fid: (name, out) for name, out, fid in existing}
    for what, p in ins:
        candidates = _files_below(str(p), INPUT_FOLDER_DEPTH) if p.is_dir() else [str(p)]
        for f in candidates:
            fid = _file_id(f)
            if fid is not None and fid in wanted:
                name, out = wanted[fid]
                where = f"{what} {p}" if Path(f) == p else f"{f}, a file of {what} {p}"
                if os.path.realpath(out) != os.path.realpath(f):
                    how = "is the same file (a hard link) as"
                elif out.is_symlink():
                    how = "is a symbolic link to"
                elif os.path.islink(f):  # a folder of links (a Hugging Face snapshot) to the files they name
                    how, where = "is the file that", f"{f} (of {what} {p}) links to"
                else:  # the path itself (or a path through linked folders)
                    how, where = "is", (f"a file of {what} {p}" if Path(f) != p else f"{what} {p}")
                raise OutputOverInputError(
                    f"{name} {out} {how} {where}, which this run reads: an output never replaces an input. "
                    "Give another path."
                )


#: The file types of the package that make up its behaviour (code, architecture table, templates).
_CODE_SUFFIXES = (".py", ".json", ".j2")


@functools.lru_cache(maxsize=1)
def package_code_sha256() -> str:
    """Hex sha256 over the relative path and bytes of every ``.py``, ``.json`` and ``.j2`` file of the
    installed ``tl_idempotence`` package, in path order (computed once per process, ~5 ms).

    Two installations with the same value run the same code; any edit changes it.
    """
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for p in sorted(q for q in root.rglob("*") if q.suffix in _CODE_SUFFIXES and q.is_file()):
        if "__pycache__" in p.parts:
            continue
        h.update(f"{p.relative_to(root).as_posix()}\0{p.stat().st_size}\0".encode())
        h.update(p.read_bytes())
    return h.hexdigest()


def shareable_name(name: str) -> str:
    """A model name or path as it may appear in what a report shares (its page, ``--json``, a saved report):
    a local path (absolute, ``~``-relative or ``./``-relative, e.g. a ``transformers`` ``_name_or_path`` or a
    TransformerLens ``cfg.model_name`` of a model booted from a folder) becomes its last component, so no home
    folder or machine layout leaks; a hub-style name (``org/model``) stays as it is."""
    text = str(name)
    if os.path.isabs(text) or text.startswith(("~", "./", "../", ".\\", "..\\")) or "\\" in text:
        return Path(text.replace("\\", "/")).name or text
    return text


def sha256_file(path: str | os.PathLike[str], limit: int | None = None, chunk: int = 1 << 20) -> str:
    """Hex sha256 of a file (or of its first ``limit`` bytes), streamed.

    Raises:
        OSError: the file cannot be read (the caller turns it into an error naming the file).
    """
    h = hashlib.sha256()
    remaining = limit
    with open(path, "rb") as f:
        while True:
            n = chunk if remaining is None else min(chunk, remaining)
            if n <= 0:
                break
            block = f.read(n)
            if not block:
                break
            h.update(block)
            if remaining is not None:
                remaining -= len(block)
    return h.hexdigest()


def sha256_bytes(data: bytes) -> str:
    """Hex sha256 of bytes."""
    return hashlib.sha256(data).hexdigest()


def record_digest(record: dict[str, Any]) -> str:
    """Hex sha256 of a JSON record without its ``digest`` field (canonical JSON: sorted keys, no spaces), or ""
    when the rest is not strict JSON (never a real digest, so such a record does not verify). Raises nothing.

    A saved record holds its own numbers, so an edit or a damaged byte anywhere in it (a number, a layer, a
    fingerprint, a table's sha256) changes the digest.
    """
    body = {k: v for k, v in record.items() if k != "digest"}
    try:
        text = json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError):
        return ""
    return sha256_bytes(text.encode("utf-8"))


# the names of this process's own streams, whatever they point to (a pipe, a terminal, a regular file)
_OWN_STREAM = re.compile(r"/dev/(stdout|stderr|fd/[0-9]+)|/proc/(self|thread-self)/fd/[0-9]+")


def _absolute(path: Any) -> str | None:
    """``path`` absolute, ``~`` expanded (links not followed): the name :func:`is_stream` and :func:`is_stdout`
    match; None where ``path`` is no path (another type, a NUL byte)."""
    try:
        return os.path.abspath(os.path.expanduser(os.fspath(path)))
    except (TypeError, ValueError):
        return None


def is_stream(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` names a stream rather than a file to replace: an existing character device, FIFO or
    socket (``/dev/null``, a terminal, a named pipe made by ``mkfifo``), or one of this process's own streams by
    name (``/dev/stdout``, ``/dev/stderr``, ``/dev/fd/N``, ``/proc/self/fd/N``, whatever they point to). A
    stream has no extension to choose a format and is written in place (:func:`atomic_write_bytes`). Symbolic
    links are followed; a path that does not exist, a regular file or a folder is not a stream. Raises nothing.
    """
    s = _absolute(path)
    if s is None:
        return False
    if _OWN_STREAM.fullmatch(s):
        return True
    try:
        mode = os.stat(s).st_mode
    except (OSError, ValueError):
        return False
    return stat.S_ISCHR(mode) or stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


#: This process's standard output by name (whatever it points to).
_STDOUT_NAME = re.compile(r"/dev/stdout|/dev/fd/1|/proc/(self|thread-self)/fd/1")


def _stdout_id() -> tuple[int, int] | None:
    """``(st_dev, st_ino)`` of what file descriptor 1 is (a file, a pipe, a terminal); None when it is closed."""
    try:
        st = os.fstat(1)
    except (OSError, ValueError):
        return None
    return st.st_dev, st.st_ino


def is_stdout(path: str | os.PathLike[str]) -> bool:
    """Whether writing ``path`` writes this process's standard output: its name (``/dev/stdout``, ``/dev/fd/1``,
    ``/proc/self/fd/1``, whatever they point to), or the file, pipe or terminal it names is the one file
    descriptor 1 is (``st_dev`` and ``st_ino``, links followed: ``report --csv f.csv > f.csv``, ``/dev/fd/3`` with
    ``3>&1``). The null device is never standard output here (what is written there is discarded either way).
    Raises nothing."""
    s = _absolute(path)
    if s is None:
        return False
    if _STDOUT_NAME.fullmatch(s):
        return True
    mine = _stdout_id()
    if mine is None:
        return False
    try:
        st = os.stat(s)
        null = os.stat(os.devnull)
    except (OSError, ValueError):
        return False
    same = (st.st_dev, st.st_ino) == mine
    return same and not stat.S_ISDIR(st.st_mode) and (st.st_dev, st.st_ino) != (null.st_dev, null.st_ino)


def _write_stdout(data: bytes) -> None:
    """``data`` written to file descriptor 1 itself, after what ``sys.stdout`` holds: the offset it shares with
    every print of this process moves past it (a second open of ``/dev/stdout`` has its own offset, so a later
    print into a redirected file would overwrite the data from its start)."""
    for stream in {id(s): s for s in (sys.stdout, sys.__stdout__) if s is not None}.values():
        stream.flush()
    view = memoryview(data)
    while view:
        view = view[os.write(1, view) :]


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (temp file in the same directory + fsync + ``os.replace``).

    Returns the path. A killed writer leaves at most a ``*.tmp<pid>-<random>`` file, never a partial
    file under the final name. The temporary name is unique per call (the pid alone is not: processes
    on two machines, or in two containers, writing one file on a shared filesystem can share a pid).

    A stream (:func:`is_stream`: ``/dev/null``, ``/dev/stdout``, a named pipe) is not replaced but written in
    place: this process's standard output (:func:`is_stdout`) through file descriptor 1 itself, after
    ``sys.stdout`` is flushed (so what the process printed before and prints after keeps its order, in a
    redirected file too), another stream opened for appending. ``BrokenPipeError`` (the reader went away,
    ``| head``) propagates.
    """
    p = Path(path)
    if is_stream(p):
        if is_stdout(p):
            _write_stdout(data)
            return p
        if sys.stdout is not None:
            sys.stdout.flush()
        with open(p, "ab") as f:
            f.write(data)
        return p
    tmp = p.with_name(f"{p.name}.tmp{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
    finally:
        if tmp.exists():
            tmp.unlink()
    return p


def atomic_write_text(path: str | os.PathLike[str], text: str) -> Path:
    """:func:`atomic_write_bytes` of UTF-8 text."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def read_json(path: str | os.PathLike[str], error: type[Exception], what: str = "JSON file") -> Any:
    """Parse a JSON file, raising ``error`` with the file's name when it cannot be read or parsed.

    Args:
        path: the file.
        error: the exception class to raise (e.g. ``CheckpointError``).
        what: what the file is, for the message ("config.json", "resume manifest").
    """
    p = Path(path)
    try:
        raw = p.read_bytes()
    except IsADirectoryError as e:
        raise error(f"{what} {p} is a directory, not a file.") from e
    except OSError as e:
        raise error(f"Cannot read {what} {p}: {e.strerror or e}.") from e
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise error(f"{what} {p} is not UTF-8 text (byte {e.start}): the file is corrupt or not JSON.") from e
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise error(f"{what} {p} is not valid JSON (line {e.lineno}, column {e.colno}: {e.msg}).") from e
    except RecursionError as e:
        raise error(f"{what} {p} nests too deeply to be read: the file is corrupt or not what it claims.") from e
    except ValueError as e:  # e.g. an integer of more than 4300 digits
        raise error(f"{what} {p} holds a value that cannot be read: {e}.") from e
