"""The save format of a result: a folder of parquet tables and one JSON record with their sha256s and its own
digest (no pickle).

:func:`write_tables_record` writes ``<name>.parquet`` for each table and the record
``{"format": ..., **fields, "files": {name: sha256}, "digest": sha256}``; :func:`read_tables_record` refuses a
folder whose files do not match their recorded sha256, a record edited after it was written (its digest), a missing
file or a record of another format, each error naming the file. The report's own save
(:mod:`tl_idempotence.report.store`) uses the same digest, int-key tagging and table reading.
"""

from __future__ import annotations

import io
import json
import math
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import pandas as pd

from ..errors import MissingFileError, OptionError, OptionTypeError, ReportFileError
from .files import read_json, record_digest, sha256_bytes, sha256_file
from .jsonio import RECORD, json_ready, json_restore, json_text
from .legacy import upgrade as upgrade_layout
from .options import check_bool
from .store import saved_folder, write_folder

if TYPE_CHECKING:  # pragma: no cover
    from .stored import StoreSpec

__all__ = [
    "INFO_FIELDS",
    "INT_KEYS",
    "RecordWords",
    "check_float_keys",
    "check_identity",
    "float_keys",
    "index_column",
    "json_like",
    "open_record",
    "owned_files",
    "read_fields_record",
    "read_listed_tables",
    "read_summary_record",
    "read_tables_record",
    "same_value",
    "tables_record_files",
    "tag_int_keys",
    "untag_int_keys",
    "write_summary_record",
    "write_tables_record",
]

#: The key of an int-keyed dict in a record (JSON keys are strings).
INT_KEYS = "__int_keys__"


def tag_int_keys(x: Any) -> Any:
    """Dicts keyed by ints (``closed_per_layer``) as ``{"__int_keys__": [[k, v], ...]}``: JSON keys are strings."""
    if isinstance(x, dict):
        if x and all(isinstance(k, int) and not isinstance(k, bool) for k in x):
            return {INT_KEYS: [[k, tag_int_keys(v)] for k, v in x.items()]}
        return {k: tag_int_keys(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [tag_int_keys(v) for v in x]
    return x


def untag_int_keys(x: Any) -> Any:
    if isinstance(x, dict):
        if set(x) == {INT_KEYS} and isinstance(x[INT_KEYS], list):
            return {int(k): untag_int_keys(v) for k, v in x[INT_KEYS]}
        return {k: untag_int_keys(v) for k, v in x.items()}
    if isinstance(x, list):
        return [untag_int_keys(v) for v in x]
    return x


def index_column(df: pd.DataFrame, name: str, where: Path) -> np.ndarray:
    """A saved table's integer index column (``layer``, ``head``, ``kv_head``) as int64, or a refusal.

    An integer column is taken as it is; a float column only when every value is a finite whole number (a
    table another tool rewrote). Anything else — ``-0.5``, NaN, text, booleans — is refused: a cast would
    truncate a lying value to another head (``-0.5`` to head 0) and attribute its numbers to it.

    Raises:
        ReportFileError: the column holds a value that is not a whole number (names the file and the column).
    """
    col = df[name]
    if pd.api.types.is_integer_dtype(col.dtype) and not pd.api.types.is_bool_dtype(col.dtype):
        if col.isna().any():  # a nullable Int64 column with a missing value (pandas would raise its own ValueError)
            raise ReportFileError(f"{where}: column {name!r} has {int(col.isna().sum())} missing value(s).")
        return col.to_numpy(dtype="int64")
    if pd.api.types.is_float_dtype(col.dtype):
        v = col.to_numpy(dtype="float64")
        whole = np.isfinite(v) & (v == np.round(v)) & (np.abs(v) < 2**53)
        if whole.all():
            return v.astype("int64")
        bad = v[~whole][:3].tolist()
        raise ReportFileError(f"{where}: column {name!r} holds values that are not whole numbers ({bad}).")
    raise ReportFileError(f"{where}: column {name!r} is of type {col.dtype}, not an integer index.")


def read_listed_tables(d: Path, rec_file: Path, files: dict[Any, Any]) -> dict[str, pd.DataFrame]:
    """The parquet tables a record lists (``{name: sha256}``), each checked against its sha256 before it is read.

    Raises:
        ReportFileError: a name that is not a table name, a file whose sha256 differs, an unreadable parquet file
            (each names the file). MissingFileError: a listed file is missing.
    """
    tables: dict[str, pd.DataFrame] = {}
    for name, digest in files.items():
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_]+", name):
            raise ReportFileError(f"{rec_file} lists a table named {name!r}, which is not a table name.")
        f = d / f"{name}.parquet"
        if not f.is_file():
            raise MissingFileError(f"{f} is missing (listed in {rec_file}).")
        if sha256_file(f) != digest:
            raise ReportFileError(f"{f} does not match the sha256 recorded in {rec_file}: it was changed or damaged.")
        try:
            tables[name] = pd.read_parquet(f)
        except Exception as e:
            raise ReportFileError(f"{f} is not a readable parquet file ({type(e).__name__}: {e}).") from e
    return tables


def write_tables_record(
    path: Any,
    fmt: str,
    record_name: str,
    tables: dict[str, pd.DataFrame],
    fields: dict[str, Any],
    overwrite: Any,
    replaces: dict[str, frozenset[str]] | None = None,
    parts: Mapping[str, Mapping[str, bytes]] | None = None,
) -> Path:
    """Save a result as the report is saved (parquet tables + one JSON record with their sha256s and its own
    ``digest``; no pickle): ``<name>.parquet`` for each of ``tables`` (written without the index), then
    ``record_name`` (``{"format": fmt, **fields, "files": {name: sha256}, "digest": ...}``; ``fields`` are made
    strict JSON by ``json_ready`` under the record policy), through THE store (:func:`~tl_idempotence.core.store.
    write_folder`: written beside the folder and put in place in one step; a kill leaves the earlier save or the new
    one, and of two saves into one fresh folder one wins, the other is refused). Used by the head roles, the
    mechanism, the token readout and the attended-token effect.

    With ``overwrite=True`` a folder holding an earlier save is replaced when its record is of a format of
    ``replaces`` (``{format: the tables it writes}``; default ``{fmt: tables}``), passes its digest and lists only
    tables of its format: anything else in the folder (a user's notes) is carried into the new save.

    ``parts`` (``{sub-folder: {file name: bytes}}``, each a save of its own, e.g. a mechanism's ``head_tokens/``) are
    written with it, in the same one step; ``fields`` must list them as ``"parts"`` (what an overwrite replaces).

    Raises:
        OptionError: ``path`` is a file, a non-empty folder (without ``overwrite``), a folder without a record
            of this format or with an edited record (names it; nothing is deleted), its parent does not exist,
            another save put a folder there first, or a write fails (names the file).
        OptionTypeError: ``path`` is not a path or ``overwrite`` not a bool.
    """
    overwrite = check_bool(overwrite, "overwrite")
    if not isinstance(path, (str, os.PathLike)):
        raise OptionTypeError(f"The folder to save to must be a path; got {type(path).__name__}.")
    own = replaces if replaces is not None else {fmt: frozenset(tables)}
    files = {f"{sub}/{name}": data for sub, fs in (parts or {}).items() for name, data in fs.items()}
    files.update(tables_record_files(fmt, record_name, tables, fields))  # the record last
    return write_folder(path, files, overwrite=overwrite, owned=lambda d: owned_files(d, record_name, own))


def tables_record_files(
    fmt: str, record_name: str, tables: Mapping[str, pd.DataFrame], fields: Mapping[str, Any]
) -> dict[str, bytes]:
    """The files of a save (:func:`write_tables_record`) as bytes, the record last: ``<name>.parquet`` of each table
    (without the index) and ``record_name``, ``{"format": fmt, **fields, "files": {name: sha256}, "digest": ...}``
    (``fields`` strict JSON under the record policy). Raises what pandas/pyarrow raise for a table they cannot write.
    """
    files: dict[str, bytes] = {}
    digests: dict[str, str] = {}
    for name, df in tables.items():
        buf = io.BytesIO()
        df.to_parquet(buf, index=False)
        files[f"{name}.parquet"] = buf.getvalue()
        digests[name] = sha256_bytes(buf.getvalue())
    record = {"format": fmt, **json_ready(tag_int_keys(dict(fields)), RECORD), "files": digests}
    record["digest"] = record_digest(record)
    files[record_name] = json_text(record, RECORD, indent=1).encode("utf-8")
    return files


def owned_files(d: Path, record_name: str, own: dict[str, frozenset[str]]) -> list[str]:
    """The files an earlier save wrote in ``d`` (its record and the tables it lists), read from a record of a format
    of ``own`` (``{format: the tables it writes}``) that passes its own digest and lists only tables of its format.

    Raises:
        OptionError: no record, an unreadable one, one of another format, an edited one or one that lists a table its
            format does not write (names it; "nothing was deleted").
    """
    rec_file = d / record_name
    refuse = f"refusing to overwrite {d}: nothing was deleted."
    if not rec_file.is_file():
        raise OptionError(f"{d} holds no {record_name}; {refuse}")
    try:
        prev = json.loads(rec_file.read_text("utf-8"))
    except (OSError, ValueError) as e:
        raise OptionError(f"{rec_file} cannot be read ({type(e).__name__}); {refuse}") from e
    if not isinstance(prev, dict) or prev.get("format") not in own or prev.get("digest") != record_digest(prev):
        raise OptionError(f"{rec_file} is not an unedited {' or '.join(own)} record; {refuse}")
    listed = prev.get("files")
    names: dict[str, Any] = listed if isinstance(listed, dict) else {}
    bad = [n for n in names if not (isinstance(n, str) and n in own[prev["format"]])]
    if bad:
        raise OptionError(f"{rec_file} lists {bad[0]!r}, which this format does not write; {refuse}")
    parts = prev.get("parts") or []
    if not (isinstance(parts, list) and all(isinstance(p, str) and re.fullmatch(r"[A-Za-z0-9_]+", p) for p in parts)):
        raise OptionError(f"{rec_file} lists parts {parts!r} that are not folder names; {refuse}")
    return [record_name, *(f"{n}.parquet" for n in names), *parts]


class RecordWords(NamedTuple):
    """How the refusals of :func:`open_record` name what they read (the defaults: any saved result's; the report's
    own loader names a report)."""

    folder: str = "The saved folder"
    saved_by: str = "the folder the result was saved to"
    result: str = "result"
    record: str = "saved record"
    edited: str = "the record"


def open_record(
    path: Any, record_name: str, formats: tuple[str, ...], words: RecordWords | None = None
) -> tuple[Path, Path, dict[str, Any]]:
    """The record of a saved folder, opened as every loader opens it: the folder (the earlier save kept beside
    ``path`` by an overwrite stopped between its two renames, :func:`~tl_idempotence.core.store.saved_folder`), its
    record read as JSON, of one of ``formats`` and passing its own digest (its tables are not read here).

    Returns:
        ``(folder, record file, record)``, the record as written (``files`` and ``digest`` included).

    Raises:
        OptionTypeError: ``path`` is not a path. MissingFileError: no such folder, no record (names it).
        ReportFileError: an unreadable record, a record of another format, an edited record (digest); names the file.
    """
    words = words or RecordWords()
    if not isinstance(path, (str, os.PathLike)):
        raise OptionTypeError(f"{words.folder} must be a path; got {type(path).__name__}.")
    d = saved_folder(Path(path).expanduser(), record_name)  # an overwrite stopped between its two renames
    if not d.is_dir():
        raise MissingFileError(f"{d} is not a folder; pass {words.saved_by}.")
    rec_file = d / record_name
    if not rec_file.is_file():
        why = f"it is not a saved {words.result} (or the save was interrupted)"
        raise MissingFileError(f"{d} has no {record_name}: {why}.")
    rec = read_json(rec_file, ReportFileError, words.record)
    if not isinstance(rec, dict) or rec.get("format") not in formats:
        fmt = rec.get("format") if isinstance(rec, dict) else type(rec).__name__
        raise ReportFileError(f"{rec_file} is not a {' or '.join(formats)} record (format {fmt!r}).")
    if rec.get("digest") != record_digest(rec):
        raise ReportFileError(
            f"{rec_file} does not match its recorded sha256 digest: {words.edited} was edited or damaged. Save the "
            f"{words.result} again from its source."
        )
    return d, rec_file, rec


def read_tables_record(
    path: Any, record_name: str, formats: tuple[str, ...], float_keys: frozenset[str]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Read a folder written by :func:`write_tables_record`, checking the record's digest and every table's sha256.

    Args:
        path, record_name, formats: the folder, its record's file name and the formats accepted.
        float_keys: the record's fields (at any depth) that hold floats: only their ``"NaN"``/``"Infinity"``
            strings become floats again, so a text field that reads ``"NaN"`` (a model name, a note) stays text.

    Returns:
        ``(record, tables)``: the record's fields (NaN restored in ``float_keys``, the tagged int-keyed dicts back;
        other keys as written) and ``{name: DataFrame}``.

    Raises:
        MissingFileError: no such folder, no record, or a listed table is missing (names it).
        ReportFileError: a record of another format, an edited record (digest), a table that does not match its
            recorded sha256 or is not parquet (names the file).
        OptionTypeError: ``path`` is not a path.
    """
    d, rec_file, rec = open_record(path, record_name, formats)
    files = rec.get("files")
    if not isinstance(files, dict):
        raise ReportFileError(f"{rec_file} lists no tables.")
    tables = read_listed_tables(d, rec_file, files)
    body = {k: v for k, v in rec.items() if k not in ("files", "digest")}
    fields = untag_int_keys(json_restore(body, float_keys, int_keys=False))
    return fields, tables


def read_fields_record(
    path: Any, record_name: str, formats: tuple[str, ...], names: frozenset[str]
) -> tuple[Path, dict[str, Any], dict[str, pd.DataFrame]]:
    """Read a folder written by :func:`write_tables_record` whose record lists its float fields in ``float_keys``
    (the loaders of a comparison and a trajectory): :func:`read_tables_record` (every digest checked), the
    ``"NaN"``/``"Infinity"`` strings of the listed fields read back as floats, the list checked
    (:func:`check_float_keys`) and the tables the record lists checked to be ``names``.

    Returns:
        ``(folder, record fields, {name: DataFrame})``: the folder read (the earlier save kept beside ``path`` by an
        overwrite stopped between its two renames, :func:`~tl_idempotence.core.store.saved_folder`, else ``path``).

    Raises:
        MissingFileError, ReportFileError, OptionTypeError: as :func:`read_tables_record`; a ``float_keys`` that is
            not a list of names or not the fields that hold floats; tables other than ``names`` (names the record).
    """
    if not isinstance(path, (str, os.PathLike)):
        raise OptionTypeError(f"The saved folder must be a path; got {type(path).__name__}.")
    d = saved_folder(Path(path).expanduser(), record_name)
    rec_file = d / record_name
    raw, tables = read_tables_record(d, record_name, formats, frozenset())
    listed = raw.get("float_keys")
    if not (isinstance(listed, list) and all(isinstance(k, str) for k in listed)):
        raise ReportFileError(f"{rec_file}: a malformed record (float_keys is not a list of names).")
    fields = json_restore(raw, frozenset(listed), int_keys=False)
    check_float_keys(rec_file, fields, listed)
    if set(tables) != set(names):
        raise ReportFileError(f"{rec_file} lists tables {sorted(tables)}; this save has {sorted(names)}.")
    return d, fields, tables


def write_summary_record(
    path: Any,
    store: StoreSpec,
    tables: dict[str, pd.DataFrame],
    summary: Mapping[str, Any],
    parts: Mapping[str, Mapping[str, bytes]],
    overwrite: Any,
) -> Path:
    """:func:`write_tables_record` of a stored type (its ``store``: the record's name, this version's format) whose
    record holds its ``summary`` (its float fields listed in ``float_keys``) and the names of the sub-folders it
    holds (``parts``: ``{name: {file: bytes}}``, each written as ``name/``): a causal test, a mechanism;
    :func:`read_summary_record` reads it back.

    Raises:
        OptionError, OptionTypeError: as :func:`write_tables_record` (names the folder or file).
    """
    summary = dict(summary)
    fields = {"summary": summary, "float_keys": sorted(float_keys(summary)), "parts": list(parts)}
    return write_tables_record(path, store.formats[0], store.record, tables, fields, overwrite, parts=parts)


def read_summary_record(
    path: Any, store: StoreSpec, names: frozenset[str], what: str, old_formats: tuple[str, ...] = ()
) -> tuple[Path, dict[str, Any], dict[str, Any], dict[str, pd.DataFrame]]:
    """Read a folder written by :func:`write_summary_record` (a causal test, a mechanism): :func:`read_tables_record`
    of the ``store``'s record and formats (every digest checked; ``old_formats``: formats of an earlier layout also
    read, then turned into this version's by the upgrade registered for the record,
    :func:`~tl_idempotence.core.legacy.upgrade`), the tables the record lists checked to be ``names``, and the
    summary's ``"NaN"`` / ``"Infinity"`` strings of the fields ``float_keys`` lists read back as floats, the list
    checked (:func:`check_float_keys`).

    Returns:
        ``(folder, raw record, summary, {name: DataFrame})``: the folder read (the earlier save kept beside ``path``
        by an overwrite stopped between its two renames, :func:`~tl_idempotence.core.store.saved_folder`, else
        ``path``).

    Raises:
        MissingFileError, ReportFileError, OptionTypeError: as :func:`read_tables_record`; tables other than
            ``names`` (names the record and ``what`` the save is, ``"a mechanism"``); no summary, a ``float_keys``
            that is not a list of names or not the fields that hold floats.
    """
    raw, tables = read_tables_record(path, store.record, (*store.formats, *old_formats), frozenset())
    d = saved_folder(Path(path).expanduser(), store.record)  # an overwrite stopped between its two renames
    rec = d / store.record
    raw, tables = upgrade_layout(rec, raw, tables)  # a save of an earlier layout (0.3.0), checked as written
    if set(tables) != set(names):
        raise ReportFileError(f"{rec} lists tables {sorted(tables)}; {what} save has {sorted(names)}.")
    fk = raw.get("float_keys")
    if not (isinstance(fk, list) and all(isinstance(k, str) for k in fk)) or not isinstance(raw.get("summary"), dict):
        raise ReportFileError(f"{rec}: a malformed record (no summary or float_keys).")
    summary: dict[str, Any] = json_restore(raw["summary"], frozenset(fk), int_keys=False)
    check_float_keys(rec, {"summary": summary}, fk)
    return d, raw, summary, tables


def same_value(a: Any, b: Any) -> bool:
    """Equal, NaN equal to NaN (floats exactly), through dicts and lists."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_value(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return bool(a == b)


def float_keys(x: Any, out: set[str] | None = None) -> set[str]:
    """The keys (at any depth) whose values are floats: the ``float_keys`` of :func:`read_tables_record` (only
    these read "NaN"/"Infinity" back as floats). Raises nothing."""
    out = set() if out is None else out
    if isinstance(x, dict):
        for k, v in x.items():
            if isinstance(v, (float, np.floating)):
                out.add(str(k))
            float_keys(v, out)
    elif isinstance(x, (list, tuple)):
        for v in x:
            float_keys(v, out)
    return out


#: The summary fields that restate the measured model's :class:`~tl_idempotence.core.heads.ModelInfo` fields.
INFO_FIELDS = ("model_name", "model_class", "processing")


def check_identity(
    rec_file: Path,
    summary: Mapping[str, Any],
    options: Mapping[str, Any],
    restated: tuple[str, ...] = (),
    info: Any = None,
    table: pd.DataFrame | None = None,
    table_file: Path | None = None,
) -> None:
    """THE identity check every loader of a saved result runs (issue 45): what the record says was measured and how
    must agree wherever it is stated twice, and the table's heads must be heads of that model.

    * every summary field that restates the model's info (:data:`INFO_FIELDS`: name, class, weight processing) is
      the info's;
    * every option the summary restates (``restated``: ``seed``, ``k``, ...) is the same value of the same type in
      both (``1`` is not ``True``);
    * the table's ``layer``/``head`` are whole numbers within the info's sizes, each head once, and its ``kv_head``
      (when it has one) is the kv map of the info's ``n_heads``/``n_kv_heads``
      (:func:`~tl_idempotence.core.heads.kv_layout`: every model source reads its kv heads so).

    Args:
        rec_file: the record (named by a refusal). summary, options: the record's. restated: the options its summary
            restates (a summary field of the same name may mean another thing: what was measured, not asked). info: its
            :class:`~tl_idempotence.core.heads.ModelInfo` (None: a result without one). table, table_file: a per-head
            table and its file (None: none).

    Raises:
        ReportFileError: names the file, the field or column, both values and the first head that disagrees.
    """
    from .heads import kv_layout

    def refuse(where: Path, what: str) -> ReportFileError:
        return ReportFileError(f"{where}: {what}: the record or a table was edited. Save the result again.")

    def refuse_first(bad: np.ndarray, what: Callable[[int], str]) -> None:
        """Refuse the table at its first row where ``bad`` holds (``what(row)`` says what is wrong there)."""
        if bad.any():
            raise refuse(where, what(int(np.flatnonzero(bad)[0])))

    if info is not None:
        for k in INFO_FIELDS:
            if k in summary and not same_value(json_like(summary[k]), json_like(getattr(info, k))):
                raise refuse(rec_file, f"summary[{k!r}] is {summary[k]!r} but info.{k} is {getattr(info, k)!r}")
    for k in restated:
        a, b = summary.get(k), options.get(k)
        if type(a) is not type(b) or not same_value(json_like(a), json_like(b)):
            raise refuse(rec_file, f"summary[{k!r}] is {a!r} but options[{k!r}] is {b!r}")
    if table is None or info is None or not len(table):
        return
    where = table_file or rec_file
    L, H = index_column(table, "layer", where), index_column(table, "head", where)
    refuse_first(
        (L < 0) | (L >= info.n_layers) | (H < 0) | (H >= info.n_heads),
        lambda i: (
            f"head L{L[i]}H{H[i]} is not a head of the record's model (info: {info.n_layers} layers of "
            f"{info.n_heads} heads)"
        ),
    )
    if len(set(zip(L.tolist(), H.tolist()))) != len(L):
        raise refuse(where, "a head repeats")
    if "kv_head" in table.columns:
        K = index_column(table, "kv_head", where)
        try:
            want = kv_layout(info.n_heads, info.n_kv_heads).numpy()[H]
        except Exception as e:  # a kv layout the sizes cannot have (WeightError)
            raise refuse(rec_file, f"info.n_heads={info.n_heads}, info.n_kv_heads={info.n_kv_heads}: {e}") from e
        bad = want != K
        refuse_first(
            bad,
            lambda i: (
                f"column 'kv_head' disagrees with the kv map of info.n_heads={info.n_heads}, info.n_kv_heads="
                f"{info.n_kv_heads} (tl_idempotence.kv_layout) at L{L[i]}H{H[i]} (first of {int(bad.sum())})"
            ),
        )


def check_float_keys(rec_file: Path, fields: Mapping[str, Any], listed: Any) -> None:
    """A record's ``float_keys`` (the fields whose ``"NaN"`` strings read back as floats) must be the keys that hold
    floats in its fields as read back (:func:`float_keys`): an edited list is refused.

    Raises:
        ReportFileError: names the record and the keys that differ.
    """
    fresh = sorted(float_keys({k: v for k, v in fields.items() if k != "float_keys"}))
    if listed != fresh:
        extra = sorted(set(listed or []) ^ set(fresh))[:5]
        raise ReportFileError(
            f"{rec_file}: float_keys is not the fields that hold floats (differs at {extra}): the "
            "record was edited. Save the result again."
        )


def json_like(x: Any) -> Any:
    """``x`` with tuples as lists and numpy scalars as Python scalars (how a value reads back from JSON)."""
    if isinstance(x, Mapping):
        return {str(k): json_like(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_like(v) for v in x]
    if isinstance(x, np.generic):
        return x.item()
    return x
