"""Save and load a :class:`~tl_idempotence.report.mechanism.Mechanism` (``rep.mechanism``) as the report and the
head roles are saved: a folder of parquet tables and one JSON record ``mechanism.json`` holding their sha256s and its
own digest (:func:`~tl_idempotence.report.store.write_tables_record`; no pickle).

Layout: ``table.parquet`` (:attr:`Mechanism.table`, labels rebuilt from ``layer``/``head`` on load) and
``signs.parquet`` (:attr:`Mechanism.signs`, its ``quantity``/``group`` index as columns); the summary (with the
embedding tie and the probes' own summaries) is in the record. The probes' own results (``tokens``: the token
readout behind ``top_tokens``; ``effect``: the per-position effects) are not saved: a loaded result has them None
and its ``top_tokens`` says so.

A load recomputes from ``table.parquet`` what the rest of the record states (``alpha_P``, ``closed`` against the
threshold, ``sign_agrees``, the signs, the sign test, the Spearman test, the counts and the headline), so an edit
whose sha256s and digest were recomputed is refused where it makes the record disagree with itself, naming the file.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from ..core.jsonio import json_restore
from ..core.options import strict_kwargs
from ..core.selection import head_labels
from ..errors import OptionError, OptionTypeError, ReportFileError
from ..probes.tied import EmbeddingTie
from .mechanism import SIGNED, Mechanism, derive_tests, mechanism_headline
from .roles import json_like, same_value
from .store import index_column, read_tables_record, write_tables_record

if TYPE_CHECKING:  # pragma: no cover
    from ..core.hints import PathLike

__all__ = ["MECHANISM_FORMAT", "MECHANISM_RECORD", "load_mechanism", "save_mechanism"]

MECHANISM_FORMAT = "tl_idempotence.mechanism/1"
MECHANISM_RECORD = "mechanism.json"
#: The columns every mechanism table has, in order; the roles' columns may follow.
TABLE_COLUMNS = (
    "layer", "head", "kv_head", "P", "alpha", "closed", "alpha_P", "effect_median", "frac_negative", "null_median",
    "effect_p", "effect_q", "n_positions", "self_rank_median", "frac_top_k", "frac_bottom_k", "copying",
    "copying_own", "sign_agrees",
)  # fmt: skip
ROLE_COLUMNS = ("previous_token", "duplicate_token", "induction")
SIGNS_COLUMNS = (
    "quantity", "group", "n_positive", "median_abs_positive", "n_negative", "median_abs_negative", "n_zero", "n_nan",
)  # fmt: skip
#: The summary fields :func:`load_mechanism` recomputes from the table.
_RECOMPUTED = (
    "n_sign_tested", "n_agree", "sign_test_p", "n_spearman", "spearman_rho", "spearman_p", "n_closed_own_sign_alpha",
    "median_abs_copying_closed", "notes",
)  # fmt: skip
_FILE_SUFFIXES = (".html", ".htm", ".json", ".csv", ".parquet")


def _float_keys(x: Any, out: set[str]) -> set[str]:
    """The keys (at any depth) whose values are floats: only these read "NaN"/"Infinity" back as floats."""
    if isinstance(x, dict):
        for k, v in x.items():
            if isinstance(v, (float, np.floating)):
                out.add(str(k))
            _float_keys(v, out)
    elif isinstance(x, (list, tuple)):
        for v in x:
            _float_keys(v, out)
    return out


@strict_kwargs
def save_mechanism(result: Mechanism, path: PathLike, overwrite: bool = False) -> str:
    """Save a mechanism result (``rep.mechanism``) to the folder ``path`` (module docstring); ``Mechanism.save``.

    Args:
        result: the result to save.
        path: a folder that does not exist yet (or is empty), or an earlier mechanism save with ``overwrite``.
        overwrite: replace an earlier mechanism save's files (only ``mechanism.json`` and the tables it lists).

    Returns:
        The folder, as a string.

    Raises:
        OptionTypeError: ``result`` is not a :class:`Mechanism`; ``path`` not a path; ``overwrite`` not a bool.
        OutputOverInputError (an ``OptionError``): ``path`` is the folder ``result`` was loaded from, or in it.
        OptionError: as :func:`~tl_idempotence.report.store.write_tables_record` (non-empty folder, missing parent,
            an edited earlier record; names it); ``path`` ends in a file extension (``.html``, ``.json``, ``.csv``,
            ``.parquet``): a mechanism save is a folder.
    """
    from ..core.files import refuse_outputs_over_inputs

    if not isinstance(result, Mechanism):
        raise OptionTypeError(f"save_mechanism saves a Mechanism (rep.mechanism); got {type(result).__name__}.")
    if isinstance(path, (str, os.PathLike)) and Path(path).suffix.lower() in _FILE_SUFFIXES:
        raise OptionError(
            f"A mechanism save writes a folder, not a file: {str(path)!r} ends in {Path(path).suffix!r}. Give a "
            "folder name without extension; for a page use rep.save_html(path, mechanism=...), for a table or JSON "
            "rep.export(path) (the CLI's --mechanism)."
        )
    loaded = result.loaded_from
    refuse_outputs_over_inputs([("path", path)], [("the saved mechanism", loaded)] if loaded else [])
    table = result._table
    cols = [c for c in table.columns if c not in ROLE_COLUMNS]
    if tuple(cols) != TABLE_COLUMNS:
        raise OptionError(f"This Mechanism's table has columns {list(table.columns)}, not rep.mechanism's: not saved.")
    summary = dict(result.summary)
    fields = {"summary": summary, "float_keys": sorted(_float_keys(summary, set()))}
    tables = {"table": table, "signs": result._signs.reset_index()}
    return str(write_tables_record(path, MECHANISM_FORMAT, MECHANISM_RECORD, tables, fields, overwrite))


def _refuse(f: Path, what: str) -> ReportFileError:
    return ReportFileError(f"{f}: {what}: the record or a table was edited. Save the mechanism again (rep.mechanism).")


def load_mechanism(path: PathLike) -> Mechanism:
    """Read back what :func:`save_mechanism` wrote, checking every digest and recomputing what the table gives.

    Args:
        path: the folder.

    Returns:
        The :class:`Mechanism`, with ``tokens`` and ``effect`` None (not saved; ``top_tokens`` says so) and
        ``loaded_from`` the folder.

    Raises:
        MissingFileError: no such folder, no ``mechanism.json``, a listed table missing (names it).
        ReportFileError: another format; an edited record (digest) or table (sha256), each named; a table whose
            columns, ``alpha_P``, ``closed``, ``sign_agrees`` or signs, or a summary whose counts, tests or headline,
            are not what the table gives (an edit whose digests were recomputed; names the file and the field).
        OptionTypeError: ``path`` is not a path.
    """
    raw, tables = read_tables_record(path, MECHANISM_RECORD, (MECHANISM_FORMAT,), frozenset())
    d = Path(path).expanduser()
    rec, ft, fs = d / MECHANISM_RECORD, d / "table.parquet", d / "signs.parquet"
    if set(tables) != {"table", "signs"}:
        raise ReportFileError(f"{rec} lists tables {sorted(tables)}; a mechanism save has ['signs', 'table'].")
    fk = raw.get("float_keys")
    if not (isinstance(fk, list) and all(isinstance(k, str) for k in fk)) or not isinstance(raw.get("summary"), dict):
        raise ReportFileError(f"{rec}: a malformed record (no summary or float_keys).")
    summary: dict[str, Any] = json_restore(raw["summary"], frozenset(fk), int_keys=False)
    table, signs = tables["table"], tables["signs"]
    cols = tuple(table.columns)
    if cols not in (TABLE_COLUMNS, (*TABLE_COLUMNS, *ROLE_COLUMNS)):
        raise ReportFileError(f"{ft} has columns {list(cols)}, not a mechanism table.")
    if tuple(signs.columns) != SIGNS_COLUMNS:
        raise ReportFileError(f"{fs} has columns {list(signs.columns)}, not a mechanism signs table.")
    table.index = head_labels(index_column(table, "layer", ft), index_column(table, "head", ft))
    if table.index.duplicated().any():
        raise _refuse(ft, f"head {table.index[table.index.duplicated()][0]} repeats")
    try:
        threshold, n_perm, seed = float(summary["threshold"]), int(summary["n_permutations"]), int(summary["seed"])
        tie = EmbeddingTie(**summary["embedding_tie"])
    except (KeyError, TypeError, ValueError) as e:
        raise ReportFileError(f"{rec}: a malformed summary ({type(e).__name__}: {e}).") from e
    P, alpha = table["P"].to_numpy(dtype=float), table["alpha"].to_numpy(dtype=float)
    if table["closed"].dtype != bool or not (table["closed"].to_numpy() == (P >= threshold)).all():
        raise _refuse(ft, f"'closed' disagrees with P >= threshold ({threshold:g})")
    if not same_value((alpha * P).tolist(), table["alpha_P"].to_numpy(dtype=float).tolist()):
        raise _refuse(ft, "'alpha_P' is not alpha * P")
    agrees, fresh_signs, stats = derive_tests(table, n_perm, seed)
    if str(table["sign_agrees"].dtype) != "boolean" or not table["sign_agrees"].equals(
        pd.Series(agrees, index=table.index, name="sign_agrees")
    ):
        raise _refuse(ft, "'sign_agrees' is not what alpha, closed and effect_median give")
    stored = signs.set_index(["quantity", "group"])
    same_signs = list(stored.index) == list(fresh_signs.index) and list(stored.columns) == list(fresh_signs.columns)
    for col in fresh_signs.columns if same_signs else []:
        same_signs = same_signs and same_value(stored[col].tolist(), fresh_signs[col].tolist())
    if not same_signs:
        raise _refuse(fs, f"the signs are not what {ft.name} gives (recomputed over {list(SIGNED)})")
    fresh = {
        "n_heads": len(table),
        "n_closed": int(table["closed"].sum()),
        **{k: stats[k] for k in _RECOMPUTED},
    }
    for k, v in fresh.items():
        if not same_value(json_like(summary.get(k)), json_like(v)):
            raise _refuse(rec, f"summary[{k!r}] is {summary.get(k)!r} but {v!r} from {ft.name}")
    if tie.tied is not summary.get("tied"):
        raise _refuse(rec, f"summary['tied'] is {summary.get('tied')!r} but embedding_tie.tied is {tie.tied!r}")
    head = mechanism_headline(summary, tie, stats["n_closed_own_sign_alpha"], stats["median_abs_copying_closed"])
    if summary.get("headline") != head:
        raise _refuse(rec, "summary['headline'] is not what the table and the summary give")
    if not math.isfinite(threshold):
        raise _refuse(rec, f"summary['threshold'] is {threshold!r}")
    return Mechanism(table=table, signs=stored, summary=summary, tokens=None, effect=None, tie=tie, loaded_from=str(d))
