"""THE registry of output formats: every file or folder a result is written to is chosen by the target's extension.

One writer per format (docs/definitions.md, "Output formats"):

============  ===============================  ==========================================================
extension     format                           what is written
============  ===============================  ==========================================================
``.html``     standalone HTML page             the page (plotly.js and the table code inlined, offline)
``.htm``
``.json``     JSON export                      the result's record for other programs (NaN as ``null``,
                                               :data:`~tl_idempotence.core.jsonio.EXPORT`)
``.csv``      CSV table                        the result's main table (a report: ``heads``, label first)
``.parquet``  parquet table                    the same table as one parquet file
(a folder)    saved report                     the save format (:mod:`tl_idempotence.report.store`:
                                               parquet tables + ``report.json``), read back by ``load_report``
============  ===============================  ==========================================================

Every writer (``rep.save_html``, ``rep.save``, ``rep.export``, a comparison's or sweep's ``save_html`` and
``export``, an attention view's ``save``, the CLI's ``--out`` and ``--csv``) goes through :func:`write_output`,
which checks in this order, before anything is rendered:

1. the path's type and that it is not empty;
2. that it is not (nor links to) a file or folder the result was read from
   (:func:`~tl_idempotence.core.files.refuse_outputs_over_inputs`);
3. its format, by extension, among those the caller allows (an unknown one is refused naming the known ones);
   a stream (:func:`~tl_idempotence.core.files.is_stream`: ``/dev/null``, ``/dev/stdout``, a named pipe) has
   no extension to read: it is written as the caller's ``stream_format`` (the CLI: ``--csv`` a CSV table,
   ``--out`` the page, or the JSON export with ``--json``), or as the one file format allowed;
4. for a file: that it is not a folder and that its folder exists;

then renders what the format needs and writes it atomically (:func:`~tl_idempotence.core.files.atomic_write_bytes`:
a file with its final name is always complete); an operating-system refusal is an
:class:`~tl_idempotence.errors.OptionError` naming the file.

A result offers what it can be written as in an :class:`Output` (its page, record, table, folder writer); a
format it does not offer is refused naming the ones it does. Views render the page (the result's ``page``
callable imports them); this module writes.
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from ..core.files import atomic_write_bytes, is_stream, refuse_outputs_over_inputs
from ..core.jsonio import EXPORT, json_text
from ..errors import OptionError, OptionTypeError

__all__ = [
    "FOLDER",
    "OUTPUT_FORMATS",
    "Output",
    "OutputFormat",
    "check_save_target",
    "file_path_problem",
    "known_formats_text",
    "output_format",
    "refuse_file_name",
    "write_output",
]

#: The name of the folder format (the save format of a report).
FOLDER = "folder"


@dataclass(frozen=True)
class Output:
    """What a result can be written as; :func:`write_output` asks only for what the chosen format needs.

    Attributes:
        what: the result in words, for messages (``"report"``, ``"comparison"``, ``"attention"``).
        inputs: ``(what, path)`` pairs the result was read from: never written over.
        page: renders the standalone HTML page (None: no page).
        record: the JSON export, a mapping (None: no JSON export).
        table: the main table as written, every column (an index worth keeping already a column; None: no table).
        folder: writes the save format to ``(folder, overwrite)`` and returns the folder (None: no folder format).
    """

    what: str
    inputs: tuple[tuple[str, Any], ...] = ()
    page: Callable[[], str] | None = None
    record: Callable[[], Mapping[str, Any]] | None = None
    table: Callable[[], pd.DataFrame] | None = None
    folder: Callable[[Path, bool], Path] | None = None


def _write_page(out: Output, p: Path) -> None:
    assert out.page is not None
    atomic_write_bytes(p, out.page().encode("utf-8"))


def _write_json(out: Output, p: Path) -> None:
    assert out.record is not None
    atomic_write_bytes(p, (json_text(out.record(), EXPORT, indent=1) + "\n").encode("utf-8"))


def _write_csv(out: Output, p: Path) -> None:
    assert out.table is not None
    atomic_write_bytes(p, out.table().to_csv(index=False).encode("utf-8"))


def _write_parquet(out: Output, p: Path) -> None:
    assert out.table is not None
    buf = io.BytesIO()
    out.table().to_parquet(buf, index=False)
    atomic_write_bytes(p, buf.getvalue())


@dataclass(frozen=True)
class OutputFormat:
    """One output format of the registry.

    Attributes:
        name: ``"html"``, ``"json"``, ``"csv"``, ``"parquet"`` or :data:`FOLDER`.
        suffixes: the extensions that choose it (lower case; none for the folder).
        noun: what messages call the written thing (``"page"``: "the report page").
        needs: the :class:`Output` attribute it writes from (``"page"``, ``"record"``, ``"table"``, ``"folder"``).
        write: writes ``Output`` to a checked file path (None for the folder: the result's own writer).
    """

    name: str
    suffixes: tuple[str, ...]
    noun: str
    needs: str
    write: Callable[[Output, Path], None] | None


#: The registry, in the order messages list it.
OUTPUT_FORMATS: tuple[OutputFormat, ...] = (
    OutputFormat("html", (".html", ".htm"), "page", "page", _write_page),
    OutputFormat("json", (".json",), "JSON export", "record", _write_json),
    OutputFormat("csv", (".csv",), "CSV table", "table", _write_csv),
    OutputFormat("parquet", (".parquet",), "parquet table", "table", _write_parquet),
    OutputFormat(FOLDER, (), "saved folder", "folder", None),
)
_BY_NAME = {f.name: f for f in OUTPUT_FORMATS}


def _offered(out: Output | None, formats: Sequence[str] | None) -> list[OutputFormat]:
    names = list(_BY_NAME) if formats is None else list(formats)
    unknown = [n for n in names if n not in _BY_NAME]
    if unknown:
        raise ValueError(f"unknown output format(s) {unknown}; the registry has {list(_BY_NAME)}")
    return [_BY_NAME[n] for n in names if out is None or getattr(out, _BY_NAME[n].needs) is not None]


def known_formats_text(formats: Sequence[OutputFormat]) -> str:
    """The formats in words for messages, e.g. ``".html (page), .json (JSON export) or a folder (saved folder)"``."""
    parts = [f"{' or '.join(f.suffixes)} ({f.noun})" if f.suffixes else f"a folder ({f.noun})" for f in formats]
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " or " + parts[-1]


def output_format(
    path: str | os.PathLike[str],
    formats: Sequence[str] | None = None,
    *,
    flag: str = "path",
    out: Output | None = None,
    stream_format: str | None = None,
) -> OutputFormat:
    """The format ``path`` chooses among ``formats`` (default: every one ``out`` offers, or all).

    A known extension chooses its format. A stream (:func:`~tl_idempotence.core.files.is_stream`:
    ``/dev/null``, ``/dev/stdout``, a named pipe) without one is ``stream_format`` when that is allowed, else the
    one file format allowed (never the folder). The folder format is chosen by a path without extension or an
    existing folder, or by any path when it is the only format allowed (``rep.save(path)`` writes a folder
    whatever its name).

    Raises:
        OptionError: an extension none of the allowed formats has (names the known ones); a stream when
            several file formats are allowed and ``stream_format`` is not one of them.
    """
    allowed = _offered(out, formats)
    p = Path(path).expanduser()
    suffix = p.suffix.lower()
    files = [f for f in allowed if f.name != FOLDER]
    for f in files:
        if suffix in f.suffixes:
            return f
    if files and is_stream(p):
        chosen = [f for f in files if f.name == stream_format] or (files if len(files) == 1 else [])
        if chosen:
            return chosen[0]
        what = f"the {out.what} " if out is not None else ""
        raise OptionError(
            f"{flag} {os.fspath(path)} is a stream (a device or a pipe) with no extension to choose among "
            f"{known_formats_text(files)} for {what or 'it'}; write to a file name with one of these."
        )
    folder = _BY_NAME[FOLDER] if _BY_NAME[FOLDER] in allowed else None
    if folder is not None and (not files or not suffix or p.is_dir()):
        return folder
    what = f"the {out.what} " if out is not None else ""
    ext = f"the extension {p.suffix!r}" if p.suffix else "no extension"
    raise OptionError(
        f"{flag} {os.fspath(path)} has {ext}: {what}can be written as {known_formats_text(allowed)}; "
        "give a file name with one of these."
        if allowed
        else f"{flag}: {what}offers no output format here."
    )


def file_path_problem(path: str | os.PathLike[str]) -> str | None:
    """THE rule for a file a writer writes, the same for the API (:func:`write_output`) and the CLI's ``--out``,
    ``--csv``, ``--json`` (``cli/args.py``, checked before any work): what is wrong with ``path`` as a file to write,
    in words (``"the folder /x does not exist"``), or None. A stream (:func:`~tl_idempotence.core.files.is_stream`)
    is written in place: nothing is wrong with it. A path ending in a separator names a folder (``Path`` would drop
    the separator: ``"x.html/"`` is never the file ``x.html``); an existing folder is not a file; the file's folder
    must exist. Raises nothing."""
    raw = os.fsdecode(os.fspath(path))
    p = Path(raw).expanduser()
    if is_stream(p):
        return None
    if raw.endswith(tuple(c for c in (os.sep, os.altsep, "/") if c)):
        return f"a path ending in a separator names a folder; give a file name (e.g. {str(p)!r})"
    if p.is_dir():
        return "it is a folder; give a file name"
    if not p.parent.exists():
        return f"the folder {p.parent} does not exist"
    return None


def refuse_file_name(path: Any, saver: str, hint: str = "") -> None:
    """A result's save writes a folder: refuse a ``path`` whose extension is a file format's of the registry
    (``.html``, ``.json``, ``.csv``, ``.parquet``, ...: a page, a table or JSON was meant). One rule for every saver.

    Args:
        path: the folder given (anything else than a path is left to the saver's own checks).
        saver: how the message names the saver (``"A mechanism save"``, ``"save_roles"``).
        hint: what to call instead, after "Give a folder name without extension".

    Raises:
        OptionError: the path ends in such an extension (names it).
    """
    if not isinstance(path, (str, os.PathLike)):
        return
    suffix = Path(path).suffix
    if suffix.lower() in {s for f in OUTPUT_FORMATS for s in f.suffixes}:
        raise OptionError(
            f"{saver} writes a folder, not a file: {os.fsdecode(os.fspath(path))!r} ends in {suffix!r}. Give a folder "
            f"name without extension{hint}."
        )


def check_save_target(path: Any, saver: str, what: str, loaded_from: Any, hint: str = "") -> None:
    """What every result's save checks of its folder before anything is computed or written: not a file name
    (:func:`refuse_file_name`) and not the folder the result was loaded from, nor in it
    (:func:`~tl_idempotence.core.files.refuse_outputs_over_inputs`). The folder's own checks (a non-empty folder, a
    missing parent, an earlier save of another kind) are THE store's (:func:`~tl_idempotence.core.store.write_folder`).

    Args:
        path: the folder given. saver: how a refusal names the saver (``"A mechanism save"``). what: the result in
            words (``"mechanism"``: "the saved mechanism"). loaded_from: the folder it was loaded from, or None.
            hint: what to call instead for a page or a table.

    Raises:
        OptionError: a file name. OutputOverInputError (an ``OptionError``): the folder it was loaded from, or in it.
    """
    refuse_file_name(path, saver, hint)
    refuse_outputs_over_inputs([("path", path)], [(f"the saved {what}", loaded_from)] if loaded_from else [])


def _label(out: Output, fmt: OutputFormat | None, formats: Sequence[OutputFormat]) -> str:
    """``"report page"``, ``"comparison CSV table"``; ``"report output"`` while the format is not known."""
    if fmt is None:
        fmt = formats[0] if len(formats) == 1 else None
    return f"{out.what} {fmt.noun}" if fmt is not None else f"{out.what} output"


def write_output(
    out: Output,
    path: Any,
    formats: Sequence[str] | None = None,
    *,
    flag: str = "path",
    overwrite: bool = False,
    replace_files: bool = True,
    stream_format: str | None = None,
) -> Path:
    """Write ``out`` to ``path`` in the format its extension chooses among ``formats`` (module docstring).

    Args:
        out: what the result can be written as.
        path: the file (or folder) to write: ``str`` or ``os.PathLike``.
        formats: the format names allowed here (default: every format ``out`` offers).
        flag: how messages name ``path`` (``"path"``, ``"--out"``).
        overwrite: for the folder format, replace an earlier saved report there.
        replace_files: replace an existing file (the pages of ``save_html`` and the CLI's ``--out``/``--csv``/
            ``--json`` do); ``export(path, overwrite=False)`` passes False, so an existing file is refused.
        stream_format: the format a stream without extension is written as (:func:`output_format`; the CLI's
            ``--csv`` passes ``"csv"``); a stream is written in place, never replaced (``replace_files`` does
            not apply to it).

    Returns:
        The path written.

    Raises:
        OptionTypeError: ``path`` is not a path. OutputOverInputError (an ``OptionError``): ``path`` is (or links
            to) something ``out`` was read from. OptionError: empty; an extension none of the formats has (names
            the known ones); a folder where a file goes (an existing folder, or a path ending in a separator, e.g.
            ``"x.html/"``); a missing folder; an existing file when ``replace_files``
            is False; the file cannot be written (names it).
            The folder format: the errors of the result's own writer.
    """
    allowed = _offered(out, formats)
    only_folder = [f.name for f in allowed] == [FOLDER]
    if not only_folder:  # the folder writer checks its path with its own messages
        if not isinstance(path, (str, os.PathLike)):
            what = _label(out, None, allowed)
            raise OptionTypeError(f"{flag} of the {what} must be a file path; got {type(path).__name__}.")
        if not str(os.fspath(path)).strip():
            raise OptionError(f"{flag} of the {_label(out, None, allowed)} must not be empty; give a file name.")
    refuse_outputs_over_inputs([(flag, path)], out.inputs)
    if only_folder:  # any name is a folder here (``rep.save``); its writer checks the path
        assert out.folder is not None
        return out.folder(path, overwrite)
    p = Path(path).expanduser()
    if p.is_dir() and _BY_NAME[FOLDER] not in allowed:
        raise OptionError(f"Cannot write the {_label(out, None, allowed)} to {p}: it is a folder; give a file name.")
    fmt = output_format(path, [f.name for f in allowed], flag=flag, out=out, stream_format=stream_format)
    if fmt.name == FOLDER:
        assert out.folder is not None
        return out.folder(p, overwrite)
    label = _label(out, fmt, allowed)
    problem = file_path_problem(path)
    if problem is not None:
        raw = os.fsdecode(os.fspath(path))
        where = repr(raw) if problem.startswith("a path ending") else str(p)
        raise OptionError(f"Cannot write the {label} to {where}: {problem}.")
    if not replace_files and not is_stream(p) and (p.exists() or p.is_symlink()):
        raise OptionError(f"Cannot write the {label} to {p}: the file exists; pass overwrite=True to replace it.")
    assert fmt.write is not None
    try:
        fmt.write(out, p)
    except BrokenPipeError:  # a stream's reader went away (| head): the caller's to handle, not a bad path
        raise
    except OSError as e:
        raise OptionError(f"Cannot write the {label} to {p}: {e.strerror or e}.") from e
    return p
