"""A :class:`~tl_idempotence.studies.compare.Comparison` saved and read back (THE store, issue 45).

:func:`save_comparison` writes ONE folder, put in place in one step
(:func:`~tl_idempotence.core.records.write_tables_record` with its reports as parts; no pickle)::

    report_0/, report_1/, ...  each report, saved as ``rep.save`` saves it (its own record and tables)
    table.parquet              the comparison's table (the paper's rows included)
    comparison.json            labels (in order, one per report part), parts, options, summary, float_keys

:func:`load_comparison` checks every digest, loads each report (:meth:`IdempotenceReport.load
<tl_idempotence.report.report.IdempotenceReport.load>`, which checks its own), rebuilds the comparison from them with
the saved options (:meth:`Comparison.from_reports <tl_idempotence.studies.compare.Comparison.from_reports>`: a report
made with other options is refused), and refuses a saved table or summary that is not the rebuilt one. A
:class:`~tl_idempotence.studies.sweep.SweepResult` saves as the comparison of its finished items (its tasks are
the sweep folder's: :func:`~tl_idempotence.studies.sweep.load_sweep` reads them).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from ..analyses.report_options import ReportOptions
from ..core.files import refuse_outputs_over_inputs
from ..core.frozen import thawed
from ..core.outputs import refuse_file_name
from ..core.records import float_keys, read_fields_record, same_value, write_tables_record
from ..core.stored import StoreSpec, saves
from ..errors import OptionError, OptionTypeError, ReportFileError
from ..report.report import IdempotenceReport
from ..report.store import ReportRecord, record_files

if TYPE_CHECKING:  # pragma: no cover
    from ..core.hints import PathLike

__all__ = [
    "COMPARISON_FORMAT",
    "COMPARISON_FREE_FIELDS",
    "COMPARISON_RECORD",
    "COMPARISON_STORE",
    "check_comparison",
    "check_same_table",
    "edited_comparison",
    "read_comparison",
    "save_comparison",
]

COMPARISON_FORMAT = "tl_idempotence.comparison/1"
#: The record fields of a saved comparison that nothing in it restates (``StoreSpec.free_fields``).
COMPARISON_FREE_FIELDS = (
    (
        "options.device",
        "where the comparison's new reports were computed: each report records its own, and the device is not "
        "compared (results agree across devices to float64 rounding)",
    ),
)
#: How a comparison is stored (:class:`~tl_idempotence.core.stored.StoreSpec`), and its record's file name.
COMPARISON_STORE = StoreSpec(name="comparison", formats=(COMPARISON_FORMAT,), free_fields=COMPARISON_FREE_FIELDS)
COMPARISON_RECORD = COMPARISON_STORE.record
_FIELDS = ["format", "labels", "parts", "options", "summary", "float_keys"]


def _part(i: int) -> str:
    return f"report_{i}"


@saves("comparison")
def save_comparison(result: Any, path: PathLike, overwrite: bool = False) -> str:
    """Save a comparison to the folder ``path`` (module docstring: its reports as sub-folders, its table and one
    JSON record, put in place in one step; no pickle); :func:`load_comparison` reads it back.

    Returns:
        The folder, as a string.

    Raises:
        OptionTypeError: ``result`` is not a ``Comparison``; ``path`` not a path; ``overwrite`` not a bool.
        OutputOverInputError (an ``OptionError``): ``path`` is a file or folder the comparison was read from (its
            reports' inputs, the folder it was loaded from, a sweep's folder).
        OptionError: ``path`` ends in a file extension; as :func:`~tl_idempotence.core.records.write_tables_record`
            (a non-empty folder without ``overwrite``, a missing parent, an edited earlier record; names it).
    """
    if not (hasattr(result, "reports") and hasattr(result, "table") and hasattr(result, "options")):  # a Comparison
        raise OptionTypeError(f"save_comparison saves a Comparison (tli.compare); got {type(result).__name__}.")
    refuse_file_name(path, "A comparison save", " (cmp.export(path) writes the table or the page)")
    loaded = getattr(result, "loaded_from", None)
    inputs = [*result.inputs, *([("the saved comparison", loaded)] if loaded else [])]
    refuse_outputs_over_inputs([("path", path)], inputs)
    parts = {_part(i): record_files(ReportRecord.of(rep)) for i, rep in enumerate(result.reports.values())}
    fields: dict[str, Any] = {
        "labels": list(result.reports),
        "parts": list(parts),
        "options": result.options.as_dict(),
        "summary": thawed(dict(result.summary)),
    }
    fields["float_keys"] = sorted(float_keys(fields))
    tables = {"table": result.table}
    return str(write_tables_record(path, COMPARISON_FORMAT, COMPARISON_RECORD, tables, fields, overwrite, parts=parts))


def read_comparison(path: PathLike) -> tuple[Path, dict[str, IdempotenceReport], ReportOptions, dict[str, Any]]:
    """Read what :func:`save_comparison` wrote (module docstring): every digest checked, each report loaded and
    checked; what ``Comparison.load`` rebuilds the comparison from (then :func:`check_comparison`).

    Returns:
        ``(folder, {label: report}, options, the record's fields with its table as "table")``.

    Raises:
        MissingFileError: no such folder, no ``comparison.json``, a listed table or report file missing (names it).
        ReportFileError: another format; an edited record (digest), table or report file (sha256), each named;
            labels, parts or options that are not a comparison's.
        OptionTypeError: ``path`` is not a path.
    """
    d, fields, tables = read_fields_record(path, COMPARISON_RECORD, (COMPARISON_FORMAT,), frozenset({"table"}))
    rec = d / COMPARISON_RECORD
    labels, parts = fields.get("labels"), fields.get("parts")
    if list(fields) != _FIELDS:
        raise _edited(rec, f"fields {list(fields)} are not a comparison record's {_FIELDS}")
    if not (isinstance(labels, list) and labels and all(isinstance(x, str) for x in labels)) or len(set(labels)) != len(
        labels
    ):
        raise _edited(rec, f"labels {labels!r:.80} are not distinct names")
    if parts != [_part(i) for i in range(len(labels))]:
        raise _edited(rec, f"parts {parts!r:.80} are not one report folder per label")
    try:
        options = ReportOptions.from_record(fields["options"])
    except (OptionError, OptionTypeError) as e:
        raise _edited(rec, f"options are not report options ({e})") from e
    reports = {label: IdempotenceReport.load(d / part) for label, part in zip(labels, parts)}
    return d, reports, options, {**fields, "table": tables["table"]}


def check_comparison(d: Path, fields: dict[str, Any], result: Any) -> None:
    """The saved table and summary (``fields`` of :func:`read_comparison`) must be the comparison rebuilt from the
    saved reports (``result``).

    Raises:
        ReportFileError: names the file and the column or field that differs.
    """
    rec = d / COMPARISON_RECORD
    check_same_table(d / "table.parquet", fields["table"], result.table, "its reports", "tli.compare")
    summary, fresh = fields["summary"], dict(result.summary)
    if not isinstance(summary, dict) or list(summary) != list(fresh):
        raise _edited(rec, f"summary fields {list(summary)[:12]} are not {list(fresh)}")
    for k, v in fresh.items():
        if not (same_value(summary[k], v) and type(summary[k]) is type(v)):
            raise _edited(rec, f"summary[{k!r}] is {summary[k]!r} but its reports give {v!r}")


def edited_comparison(d: Path, what: str) -> ReportFileError:
    """The refusal of a comparison record that does not agree with its reports (names the record)."""
    return _edited(d / COMPARISON_RECORD, what)


def _edited(f: Path, what: str) -> ReportFileError:
    return ReportFileError(f"{f}: {what}: the record or a table was edited. Compute tli.compare again.")


def check_same_table(f: Path, saved: pd.DataFrame, fresh: pd.DataFrame, source: str, again: str) -> None:
    """Refuse a saved table that is not, column for column and value for value (NaN and NA equal to themselves,
    floats exactly), the table ``source`` gives.

    Args:
        f: the table's file (named by a refusal). saved, fresh: the table read and the table rebuilt. source: what
            the table is rebuilt from, in words. again: what to compute again.

    Raises:
        ReportFileError: names the file and the first column that differs.
    """
    fresh = fresh.reset_index(drop=True)
    if saved.equals(fresh) and list(saved.columns) == list(fresh.columns):  # the common case, in one step
        return
    if list(saved.columns) != list(fresh.columns) or len(saved) != len(fresh):
        raise ReportFileError(
            f"{f}: columns {list(saved.columns)[:8]} ({len(saved)} rows) are not {list(fresh.columns)[:8]} "
            f"({len(fresh)} rows), what {source} give: the table was edited. Compute {again} again."
        )
    for c in fresh.columns:
        if not _same_column(saved[c], fresh[c]):
            raise ReportFileError(
                f"{f}: column {c!r} is not what {source} give: the table was edited. Compute {again} again."
            )


def _same_column(a: pd.Series, b: pd.Series) -> bool:
    """Whether two columns hold the same values (NaN/NA where the other has NaN/NA; numbers exactly; same kind)."""
    na, nb = a.isna().to_numpy(), b.isna().to_numpy()
    if not np.array_equal(na, nb):
        return False
    x, y = a[~na], b[~nb]
    numeric = pd.api.types.is_numeric_dtype
    if numeric(b.dtype) and not pd.api.types.is_bool_dtype(b.dtype):
        return bool(
            numeric(a.dtype)
            and not pd.api.types.is_bool_dtype(a.dtype)
            and np.array_equal(x.to_numpy(dtype=np.float64), y.to_numpy(dtype=np.float64))
        )
    return [_plain(v) for v in x.tolist()] == [_plain(v) for v in y.tolist()]


def _plain(v: Any) -> Any:
    return v.item() if isinstance(v, np.generic) else v
