"""The report save format: a folder of parquet tables and one JSON record (no pickle).

Layout written by :func:`write_record`::

    report.json            format, summary, options, what was measured (ModelInfo), the
                           sha256 of every table file, and the sha256 ``digest`` of the
                           record itself (so an edited summary number is detected)
    heads.parquet          per-head rows
    layers.parquet         per-layer rows
    <table>.parquet        the analyses' long tables (scramble_draws, mismatch_pairs, algebra_*)

:func:`read_record` refuses a folder whose files do not match their recorded sha256, a
record that was edited after it was written, a missing file, or a record of another
format — each error names the file — so what is read back is exactly what was written. An edit whose
digest was recomputed is refused where it makes the record disagree with itself: the summary is
recomputed from the tables, the info and the options and must be what they give. The report object
(:mod:`tl_idempotence.report.report`) saves and loads itself through these two functions.
"""

from __future__ import annotations

import io
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..analyses.registry import report_analyses
from ..analyses.report_options import ReportOptions, with_absent
from ..analyses.scramble import bh_q_values, scramble_effect
from ..core.files import record_digest, sha256_bytes
from ..core.heads import ModelInfo, kv_layout
from ..core.jsonio import RECORD as JSON_RECORD
from ..core.jsonio import json_text
from ..core.options import check_bool
from ..core.records import (
    RecordWords,
    index_column,
    open_record,
    read_listed_tables,
    tag_int_keys,
    untag_int_keys,
)
from ..core.selection import head_label
from ..core.store import write_folder
from ..core.stored import StoreSpec
from ..errors import OptionError, OptionTypeError, ReportFileError
from .parts import json_restore, json_safe
from .summary import ReportSummary, build_summary, field_rules, optional_field

__all__ = [
    "FORMAT",
    "RECORD",
    "REPORT_STORE",
    "TABLE_NAMES",
    "ReportFileError",
    "ReportRecord",
    "add_q_values",
    "read_record",
    "record_files",
    "write_record",
]

#: The record fields of a saved report that nothing derives or restates, with why (``StoreSpec.free_fields``).
REPORT_FREE_FIELDS = (
    ("summary.versions", "the versions of the code that computed the numbers: recorded once, provenance"),
    ("summary.n_layers_resumed", "how many layers a resumed run took from its resume folder: provenance"),
    ("summary.n_params", "a route's addition (a comparison's parameter count from checkpoint headers)"),
    ("info.extra", "free-form notes of the source (its file names, the architecture's note)"),
)
#: How a report is stored (:class:`~tl_idempotence.core.stored.StoreSpec`).
REPORT_STORE = StoreSpec(name="report", formats=("tl_idempotence.report/1",), free_fields=REPORT_FREE_FIELDS)
FORMAT = REPORT_STORE.format
RECORD = REPORT_STORE.record


@dataclass
class ReportRecord:
    """Everything a saved report holds: its tables, summary, what was measured and the options."""

    heads: pd.DataFrame
    layers: pd.DataFrame
    tables: dict[str, pd.DataFrame]
    summary: ReportSummary
    info: ModelInfo
    options: ReportOptions

    @classmethod
    def of(cls, rep: Any) -> ReportRecord:
        """The record of a report (anything with a report's ``heads``, ``layers``, ``tables``, ``summary``, ``info``
        and ``options``): what ``rep.save`` and a comparison's report parts write. Raises nothing."""
        return cls(rep.heads, rep.layers, dict(rep.tables), rep.summary, rep.info, rep.options)


def _info_record(info: ModelInfo) -> dict[str, Any]:
    return dict(
        json_safe(
            {
                "n_layers": info.n_layers,
                "n_heads": info.n_heads,
                "n_kv_heads": info.n_kv_heads,
                "d_model": info.d_model,
                "d_head": info.d_head,
                "model_name": info.model_name,
                "model_class": info.model_class,
                "processing": info.processing,
                "extra": info.extra,
            }
        )
    )


#: Every table a report save can write (``<name>.parquet``): the per-head and per-layer tables and the analyses'
#: long tables. ``overwrite=True`` deletes only these, and only when the earlier record lists them and passes its
#: own digest (``tests/unit/report/test_store_hostile.py`` checks that a report with every analysis writes no other).
TABLE_NAMES = frozenset(
    {
        "heads",
        "layers",
        "scramble_draws",
        "mismatch_pairs",
        "algebra_pairs",
        "algebra_heads",
        "algebra_groups",
        "algebra_ranges",
        "algebra_closed_ranges",
    }
)


def _own_files(d: Path) -> list[str]:
    """The files an earlier report save wrote in ``d``: ``report.json`` and the ``<table>.parquet`` its record
    lists, read from a record that passes its own digest and lists only tables the format writes.

    Raises:
        OptionError: no ``report.json``, or it is unreadable, not a record of this format, fails its digest (it was
            edited: the files it lists may be anyone's), or lists a file the format does not write (names the file;
            nothing was deleted).
    """
    rec_file = d / RECORD
    if not rec_file.is_file():
        raise OptionError(f"{d} is not a saved report folder (no {RECORD}); refusing to overwrite it.")
    refuse = (
        f"refusing to overwrite {d}: nothing was deleted. Delete the old report's files yourself or save to "
        "another folder."
    )
    try:
        rec = json.loads(rec_file.read_text("utf-8"))
    except (OSError, ValueError) as e:
        raise OptionError(f"{rec_file} cannot be read as a report record ({type(e).__name__}: {e}); {refuse}") from e
    if not isinstance(rec, dict) or rec.get("format") != FORMAT:
        raise OptionError(f"{rec_file} is not a {FORMAT} record; {refuse}")
    if rec.get("digest") != record_digest(rec):
        raise OptionError(
            f"{rec_file} does not match its recorded sha256 digest (it was edited or damaged), so the files it "
            f"lists may not be the report's; {refuse}"
        )
    files = rec.get("files")
    if not isinstance(files, dict):
        raise OptionError(f"{rec_file} lists no files; {refuse}")
    foreign = [n for n in files if not (isinstance(n, str) and n in TABLE_NAMES)]
    if foreign:
        raise OptionError(
            f"{rec_file} lists {d / (str(foreign[0]) + '.parquet')}, which is not a table a report save writes; "
            f"{refuse}"
        )
    return [RECORD, *(f"{n}.parquet" for n in files)]


def write_record(rec: ReportRecord, path: Any, overwrite: Any = False) -> Path:
    """Write ``rec`` to the folder ``path`` through THE store (:func:`~tl_idempotence.core.store.write_folder`):
    every file is written into a new folder beside ``path`` and put in place in one step, so a kill at any instant
    leaves the earlier report or this one (never neither, never a mix), and of two saves into one fresh folder
    exactly one wins (the other is refused, naming the folder).

    With ``overwrite=True`` over an earlier report, only the files that report wrote are replaced
    (``report.json`` and the tables its record lists, by name, among :data:`TABLE_NAMES`): anything else
    in the folder — a user's notes, a figure — is carried into the new save. An earlier ``report.json`` that fails
    its own digest (edited) or lists a file the format does not write is refused before anything is written. A
    symbolic link to a folder is followed (the report replaces the folder it points to).

    Args:
        rec: what to save.
        path: a folder that does not exist yet (or is empty), or an existing report folder with ``overwrite=True``.
        overwrite: replace an existing report's files.

    Returns:
        The folder.

    Raises:
        OptionError: ``path`` is a file, a broken symbolic link, a non-empty folder (without
            ``overwrite``), a folder that holds no saved report or one whose ``report.json`` fails its
            digest or lists a file the format does not write (names it), or its parent folder does not exist;
            another save put a folder there first; a folder that cannot be listed or written (names it).
        OptionTypeError: ``path`` is not a path or ``overwrite`` not a bool.
    """
    overwrite = check_bool(overwrite, "overwrite")
    if not isinstance(path, (str, os.PathLike)):
        raise OptionTypeError(f"The report folder must be a path; got {type(path).__name__}.")
    files = record_files(rec)
    return write_folder(path, files, overwrite=overwrite, owned=_own_files, what=" the report")


def record_files(rec: ReportRecord) -> dict[str, bytes]:
    """The files :func:`write_record` writes for ``rec``, as bytes, ``report.json`` last (a comparison's save holds
    each of its reports so, as a part of its folder).

    Raises:
        What pandas/pyarrow raise for a table they cannot write.
    """
    files: dict[str, bytes] = {}
    digests: dict[str, str] = {}
    for name, df in {"heads": rec.heads, "layers": rec.layers, **rec.tables}.items():
        buf = io.BytesIO()
        df.to_parquet(buf, index=False)
        files[f"{name}.parquet"] = buf.getvalue()
        digests[name] = sha256_bytes(buf.getvalue())
    record = {
        "format": FORMAT,
        "summary": json_safe(tag_int_keys(rec.summary.to_dict())),
        "options": rec.options.as_dict(),
        "info": _info_record(rec.info),
        "files": digests,
        "tables": sorted(rec.tables),
    }
    kv_map = _stated_kv_map(rec.heads, rec.info)
    if kv_map:  # only a report of LayerHeads with their own kv_head_of: every model source uses kv_layout
        record[KV_MAP] = kv_map
    record["digest"] = record_digest(record)
    # insertion order: the summary reads back as it was
    files[RECORD] = json_text(record, JSON_RECORD, indent=1).encode("utf-8")
    return files


def _check_tables_fit_info(d: Path, heads: pd.DataFrame, layers: pd.DataFrame, info: ModelInfo) -> None:
    """What the record says was measured (``info``: layers, heads, kv heads) must be what the tables hold.

    Raises:
        ReportFileError: a head or layer the info does not have, a layer without all its heads, a kv head
            out of range, layer rows that are not the layers of the heads (names the file).
    """
    where = d / "heads.parquet"
    if not {"layer", "head"} <= set(heads.columns):
        raise ReportFileError(f"{where} has no layer/head columns: it is not a report's per-head table.")
    # index_column refuses a value that is not a whole number itself, naming its own file and column
    L = index_column(heads, "layer", where)
    H = index_column(heads, "head", where)
    K = index_column(heads, "kv_head", where) if "kv_head" in heads.columns else None
    layer_rows = index_column(layers, "layer", d / "layers.parquet") if "layer" in layers.columns else None
    problems = []
    if len(L) and (L.min() < 0 or L.max() >= info.n_layers):
        problems.append(f"layers {sorted(set(L.tolist()))[:10]} but the record says n_layers={info.n_layers}")
    if len(H) and (H.min() < 0 or H.max() >= info.n_heads):
        problems.append(f"head indices up to {int(H.max())} but the record says n_heads={info.n_heads}")
    if K is not None and len(K) and (K.min() < 0 or K.max() >= info.n_kv_heads):
        problems.append(f"kv heads up to {int(K.max())} but the record says n_kv_heads={info.n_kv_heads}")
    if not problems:
        counts = pd.Series(H).groupby(L).nunique()
        short = counts[counts != info.n_heads]
        if len(short) or len(set(zip(L.tolist(), H.tolist()))) != len(L):
            problems.append(f"layers whose heads are not exactly 0..{info.n_heads - 1} once each")
    if layer_rows is None:
        problems.append(f"{d / 'layers.parquet'} has no layer column")
    elif sorted(layer_rows.tolist()) != sorted(set(L.tolist())):
        problems.append(
            f"{d / 'layers.parquet'} lists layers {sorted(layer_rows.tolist())[:10]}, not those of the heads"
        )
    if problems:
        raise ReportFileError(
            f"{where} does not fit what {d / RECORD} says was measured: {'; '.join(problems)}. The tables and the "
            "record do not belong together."
        )


#: summary fields of the "dict" rule that hold text only (weights' processing, versions, file names)
_TEXT_DICT_FIELDS = frozenset({"processing", "versions", "source"})


def _restore_summary(raw: Any) -> Any:
    """A saved summary with its RECORD-policy floats back (``"NaN"`` -> nan), except in its text: fields of rule
    ``str``/``strs`` and the text dicts keep what was written (a model named "NaN" is a name, not a float).

    Raises: nothing (a malformed record is refused by ``ReportSummary.from_dict``)."""
    restored = json_restore(raw)
    if isinstance(raw, dict) and isinstance(restored, dict):
        for k, rule in field_rules().items():
            if k in raw and (rule in ("str", "strs") or k in _TEXT_DICT_FIELDS):
                restored[k] = json_restore(raw[k], set())  # int keys back, no "NaN" restored
    return restored


#: How :func:`read_record`'s refusals name a saved report.
_WORDS = RecordWords(
    "The report folder", "the folder written by rep.save(...)", "report", "report record",
    "the record (summary, options, file list)",
)  # fmt: skip


def read_record(path: Any) -> ReportRecord:
    """Read a folder written by :func:`write_record`, checking every file against its recorded sha256.

    Raises:
        MissingFileError: no such folder, or a file the record lists is missing.
        ReportFileError (a ``CheckpointError``/``ValueError``): the record is malformed, edited (its
            digest does not match) or of another format, or a table file does not match its recorded
            sha256 (names the file); the record's sizes or ``closed`` column do not fit its tables, or ``P`` and
            ``closed`` are not columns of floats and booleans (never cast: a cast would hide what they hold); a summary
            field that is impossible (:meth:`ReportSummary.from_dict`) or not what the tables give
            (:func:`_check_summary_fits_tables`: names the field and both values).
        OptionTypeError: ``path`` is not a path.
    """
    d, rec_file, rec = open_record(path, RECORD, (FORMAT,), _WORDS)
    files = rec.get("files")
    if not isinstance(files, dict) or not {"heads", "layers"} <= set(files):
        raise ReportFileError(f"{rec_file} lists no heads/layers tables.")
    frames = read_listed_tables(d, rec_file, files)
    if rec.get("tables") != sorted(set(files) - {"heads", "layers"}):
        raise ReportFileError(
            f"{rec_file}: its list of tables {rec.get('tables')!r} is not the tables it holds "
            f"{sorted(set(files) - {'heads', 'layers'})}: the record was edited. Save the report again from its source."
        )
    try:
        info = ModelInfo(**json_restore(rec["info"], set()))
        options = ReportOptions.from_record(rec["options"])
        summary = ReportSummary.from_dict(untag_int_keys(_restore_summary(rec["summary"])))
    except (KeyError, TypeError, ValueError) as e:
        raise ReportFileError(
            f"{rec_file} has a malformed info/options/summary record ({type(e).__name__}: {e})."
        ) from e
    heads = frames.pop("heads")
    layers = frames.pop("layers")
    _check_tables_fit_info(d, heads, layers, info)
    # The sizes are recorded twice (info and summary): an edit of one (with the digest recomputed) is refused.
    sizes = {
        "n_layers": info.n_layers,
        "n_heads_per_layer": info.n_heads,
        "n_kv_heads": info.n_kv_heads,
        "d_model": info.d_model,
        "d_head": info.d_head,
        "n_heads": len(heads),
        "n_attention_layers": int(heads["layer"].nunique()),
    }
    differ = {k: (summary.get(k), v) for k, v in sizes.items() if k in summary and summary.get(k) != v}
    if differ:
        raise ReportFileError(
            f"{rec_file}: the summary and what was measured (info, tables) disagree on "
            + ", ".join(f"{k} ({a!r} vs {b!r})" for k, (a, b) in differ.items())
            + ": the record was edited. Save the report again from its source."
        )
    _check_head_elements(d, rec_file, heads, info, options, rec.get("kv_map"))
    added = _check_summary_fits_tables(rec_file, rec["summary"], heads, layers, frames, info, options)
    if added:  # a record of an earlier version: the fields it predates, as its tables give them
        summary = summary.replace(**added)
    return ReportRecord(heads=heads, layers=layers, tables=frames, summary=summary, info=info, options=options)


def add_q_values(heads: pd.DataFrame) -> pd.DataFrame:
    """``heads`` with ``q_value`` (Benjamini-Hochberg across every measured head,
    :func:`~tl_idempotence.analyses.scramble.bh_q_values`) right after ``p_value``, when it has per-head scramble
    p-values; a table without ``p_value`` is returned as it is. A report-level column: it depends on every
    layer, so it is derived here, after the per-layer rows, never in a layer's part."""
    if "p_value" not in heads.columns:
        return heads
    heads = heads.drop(columns="q_value", errors="ignore")
    heads.insert(heads.columns.get_loc("p_value") + 1, "q_value", bh_q_values(heads["p_value"]))
    return heads


#: The record's key for a kv map other than :func:`~tl_idempotence.core.heads.kv_layout`'s (``{layer: [kv head of
#: each query head]}``, layers as strings); absent when every layer follows it (every model source does).
KV_MAP = "kv_map"


def _stated_kv_map(heads: pd.DataFrame, info: ModelInfo) -> dict[str, list[int]]:
    """The layers whose ``kv_head`` column is not ``kv_layout(n_heads, n_kv_heads)``, with their map (``LayerHeads``
    given directly may read their kv heads in any order); ``{}`` when every layer follows the standard layout."""
    if "kv_head" not in heads.columns or not len(heads):
        return {}
    standard = kv_layout(info.n_heads, info.n_kv_heads).tolist()
    out: dict[str, list[int]] = {}
    for layer, g in heads.sort_values(["layer", "head"]).groupby("layer", sort=True):
        kv = [int(v) for v in g["kv_head"]]
        if kv != standard:
            out[str(int(layer))] = kv
    return out


def _first_head(heads: pd.DataFrame, bad: np.ndarray) -> str:
    """``"L3H2 (first of 2 heads)"``: the first head (table order) where ``bad`` is True, and how many there are."""
    i = int(np.flatnonzero(bad)[0])
    n = int(bad.sum())
    label = head_label(heads["layer"].iloc[i], heads["head"].iloc[i])
    return f"{label} (first of {n} head{'s' if n != 1 else ''})"


def _check_head_elements(
    d: Path, rec_file: Path, heads: pd.DataFrame, info: ModelInfo, options: ReportOptions, kv_map: Any
) -> None:
    """Every per-head column the record determines must be, head by head, what it determines (never counts: two
    values swapped within a layer keep every count): ``closed`` is ``P >= threshold``; ``kv_head`` is the kv map
    (:func:`~tl_idempotence.core.heads.kv_layout` of ``n_heads``/``n_kv_heads``, or the record's stated
    :data:`KV_MAP` for a layer that reads its kv heads otherwise); ``q_value`` is Benjamini-Hochberg of the stored
    ``p_value`` (:func:`~tl_idempotence.analyses.scramble.bh_q_values`), exactly (NaN where p is NaN);
    ``scramble_effect`` (a heads table without it loads, and it stays absent) is
    ``log10(P / P_scrambled_median)`` (:func:`~tl_idempotence.analyses.scramble.scramble_effect`), exactly.

    Raises:
        ReportFileError: names ``heads.parquet``, the column and the first head that disagrees (``L3H2``), or the
            record's ``kv_map`` when it is malformed.
    """
    where = d / "heads.parquet"
    if {"P", "closed"} <= set(heads.columns):
        P, closed = heads["P"].dtype, heads["closed"].dtype
        if not (isinstance(P, np.dtype) and P.kind == "f") or closed != np.bool_:  # a cast would hide what they hold
            raise ReportFileError(
                f"{where}: P and 'closed' are columns of {P} and {closed}, not of floats and booleans: "
                "the tables and the record do not belong together."
            )
        want = (heads["P"] >= options.threshold).to_numpy(dtype=bool)
        got = heads["closed"].to_numpy(dtype=bool)
        if not (want == got).all():
            raise ReportFileError(
                f"{where}: column 'closed' disagrees with P >= threshold ({options.threshold:g}) at "
                f"{_first_head(heads, want != got)}: the tables and the record do not belong together."
            )
    if "kv_head" in heads.columns and len(heads):
        standard = kv_layout(info.n_heads, info.n_kv_heads).numpy()
        stated: dict[int, np.ndarray] = {}
        if kv_map is not None:
            ok = isinstance(kv_map, dict) and bool(kv_map)
            for k, v in kv_map.items() if ok else ():
                good = (
                    isinstance(k, str)
                    and k.isdigit()
                    and isinstance(v, list)
                    and len(v) == info.n_heads
                    and all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x < info.n_kv_heads for x in v)
                    and v != standard.tolist()
                )
                if not good:
                    ok = False
                    break
                stated[int(k)] = np.asarray(v, dtype=np.int64)
            if not ok:
                raise ReportFileError(
                    f"{rec_file}: field {KV_MAP!r} is not a map {{layer: [the kv head of each of the {info.n_heads} "
                    f"query heads, below n_kv_heads={info.n_kv_heads}]}} of layers that differ from the standard "
                    "layout: the record was edited."
                )
        L = heads["layer"].to_numpy(dtype=np.int64)  # whole numbers in range: _check_tables_fit_info
        H = heads["head"].to_numpy(dtype=np.int64)
        K = heads["kv_head"].to_numpy(dtype=np.int64)
        want_kv = np.array([stated[lay][h] if lay in stated else standard[h] for lay, h in zip(L, H)], dtype=np.int64)
        if not (want_kv == K).all():
            also = f", or the layers of its {KV_MAP!r}" if stated else ""
            raise ReportFileError(
                f"{where}: column 'kv_head' disagrees with the kv map of n_heads={info.n_heads}, "
                f"n_kv_heads={info.n_kv_heads} (tl_idempotence.kv_layout{also}) at {_first_head(heads, want_kv != K)}: "
                "the tables and the record do not belong together."
            )
        extra = sorted(set(stated) - set(L.tolist()))
        if extra:
            raise ReportFileError(f"{rec_file}: field {KV_MAP!r} names layer {extra[0]}, which was not measured.")
    if "q_value" in heads.columns:
        if "p_value" not in heads.columns:
            raise ReportFileError(f"{where}: column 'q_value' without the 'p_value' it is derived from.")
        try:
            p = heads["p_value"].to_numpy(dtype=np.float64)
            q = heads["q_value"].to_numpy(dtype=np.float64)
        except (TypeError, ValueError) as e:
            raise ReportFileError(f"{where}: column 'p_value' or 'q_value' is not numeric ({e}).") from e
        want_q = bh_q_values(p)
        bad = ~((want_q == q) | (np.isnan(want_q) & np.isnan(q)))
        if bad.any():
            raise ReportFileError(
                f"{where}: column 'q_value' is not Benjamini-Hochberg of its 'p_value' column at "
                f"{_first_head(heads, bad)}: the tables and the record do not belong together."
            )
    if "scramble_effect" in heads.columns:  # absent in an earlier version's record: stays absent
        if not {"P", "P_scrambled_median"} <= set(heads.columns):
            raise ReportFileError(
                f"{where}: column 'scramble_effect' without the 'P' and 'P_scrambled_median' it is derived from."
            )
        try:
            got_e = heads["scramble_effect"].to_numpy(dtype=np.float64)
            want_e, _ = scramble_effect(
                heads["P"].to_numpy(dtype=np.float64), heads["P_scrambled_median"].to_numpy(dtype=np.float64)
            )
        except (TypeError, ValueError) as e:
            raise ReportFileError(
                f"{where}: column 'scramble_effect' or what it is derived from is not numeric ({e})."
            ) from e
        bad = ~((want_e == got_e) | (np.isnan(want_e) & np.isnan(got_e)))
        if bad.any():
            raise ReportFileError(
                f"{where}: column 'scramble_effect' is not log10(P / P_scrambled_median) at "
                f"{_first_head(heads, bad)}: the tables and the record do not belong together."
            )


#: Summary fields the tables cannot give: the code that computed the numbers, and what a route added (a resumed
#: report's ``n_layers_resumed``, a comparison's ``n_params``).
NOT_DERIVED = frozenset({"versions", "n_layers_resumed", "n_params"})

#: Derived summary fields a record may lack, each with the first version that writes it: a record without one
#: loads (the field is computed from its tables); any other missing field is an edit and is refused.
OPTIONAL_SINCE = {"n_heads_q05": "0.3.0"}


def _first_difference(a: Any, b: Any, where: str) -> tuple[str, Any, Any] | None:
    """The first place (``where``, then ``[key]`` / ``[index]``) where two JSON values differ, with both values."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in list(a) + [k for k in b if k not in a]:
            if k not in a or k not in b:
                return (f"{where}[{k!r}]", a.get(k, "(absent)"), b.get(k, "(absent)"))
            d = _first_difference(a[k], b[k], f"{where}[{k!r}]")
            if d is not None:
                return d
        return None
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            d = _first_difference(x, y, f"{where}[{i}]")
            if d is not None:
                return d
        return None
    same = type(a) is type(b) or (
        isinstance(a, (int, float))
        and isinstance(b, (int, float))
        and not isinstance(a, bool)
        and not isinstance(b, bool)
    )
    return None if same and a == b else (where, a, b)


def _check_summary_fits_tables(
    rec_file: Path,
    stored: Any,
    heads: pd.DataFrame,
    layers: pd.DataFrame,
    tables: dict[str, pd.DataFrame],
    info: ModelInfo,
    options: ReportOptions,
) -> dict[str, Any]:
    """Every summary field the tables, the info and the options give (all but :data:`NOT_DERIVED`) must be what
    they give (returns the :data:`OPTIONAL_SINCE` fields an earlier version's record lacks, as the tables give
    them): the summary is recomputed (:func:`~tl_idempotence.report.summary.build_summary`, the analyses the
    options ran) and compared with the record's, in its JSON form (floats exactly, NaN equal to NaN).

    Raises:
        ReportFileError: a field that differs (names it, nested keys included, with the record's value and the
            recomputed one), one the record has that the tables do not give, or one it lacks.
    """
    ran = [a for a in report_analyses() if a.enabled(options)]
    try:
        fresh = build_summary(heads, layers, tables, info, options, ran)
    except Exception as e:  # tables that fit their sha256 and the info but not the analyses' columns
        raise ReportFileError(
            f"{rec_file}: the summary cannot be recomputed from the tables ({type(e).__name__}: {e}): the tables "
            "and the record do not belong together."
        ) from e
    want = untag_int_keys(json_safe(tag_int_keys(fresh.to_dict())))  # JSON form, NaN as "NaN", int keys
    got = {k: v for k, v in untag_int_keys(stored).items() if k not in NOT_DERIVED}
    want = {k: v for k, v in want.items() if k not in NOT_DERIVED}
    # An option declared after the record was written (OptionSpec.absent): the record's options lack it and mean
    # its declared absent value, as ReportOptions.from_record reads them (a report with the option's analysis run
    # has its columns, so its options are not the absent value and still differ).
    if isinstance(got.get("options"), dict):
        got = {**got, "options": json_safe(with_absent(got["options"]))}
    # Optional fields (OPTIONAL_SINCE, e.g. n_heads_q05) a record may lack: they are derived, so the loaded
    # summary takes them from the tables (never a number the record claims).
    fresh_fields = fresh.to_dict()
    added = {k: fresh_fields[k] for k in want if k not in got and k in OPTIONAL_SINCE and optional_field(k)}
    want = {k: v for k, v in want.items() if k not in added}
    diff = _first_difference(got, want, "summary")
    if diff is not None:
        where, a, b = diff
        raise ReportFileError(
            f"{rec_file}: {where} is {a!r} in the record but {b!r} from its tables, info and options: the record "
            "was edited. Save the report again from its source."
        )
    return added
