"""Saving and loading a mechanism result (:mod:`tl_idempotence.report.mechanism`, its docstring says the layout):
:func:`write_mechanism` and :func:`read_mechanism`, behind ``tli.save_mechanism`` / ``tli.load_mechanism``.

A load checks every digest, then recomputes from the tables what the record states: ``closed`` against the
threshold, ``alpha_P``, the joined rows against the weights table, the parts (the attended-token effect, required:
its positions give the bootstrap and the split; the token readout when held) against the joined columns, every
derived column (``sign_agrees``, the matched controls, the intervals, ``direction_kept``), the signs, the tests and
comparisons of the summary, and the headline, each with the settings the summary records; a field or column that
disagrees is refused naming the file and the field.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from ..core.legacy import NOT_MEASURED, register, summary_after_check
from ..core.outputs import check_save_target
from ..core.records import (
    index_column,
    json_like,
    read_summary_record,
    same_value,
    write_summary_record,
)
from ..core.selection import head_labels
from ..errors import OptionError, OptionTypeError, ReportFileError
from ..probes.head_tokens import head_tokens_files, load_head_tokens
from ..probes.legacy import V030
from ..probes.tied import EmbeddingTie
from ..probes.token_effect import attended_token_effect_files, load_attended_token_effect
from .mechanism_controls import DERIVED_COLUMNS, STABILITY_COLUMNS, WEIGHT_COLUMNS, controls_matching
from .mechanism_headline import mechanism_headline
from .mechanism_legacy import (
    V030_MECHANISM_FORMAT,
    V030_NOT_MEASURED,
    check_unmeasured_v030,
    derived_v030,
    mechanism_v030,
)
from .mechanism_stats import SIGNED
from .mechanism_tables import (
    COPYING_OWN_CONVENTION,
    MECHANISM_RECORD,
    PART_COLUMNS,
    RECOMPUTED,
    ROLE_COLUMNS,
    SIGNS_COLUMNS,
    TABLE_COLUMNS,
    check_part_summary,
    derived,
)

if TYPE_CHECKING:  # pragma: no cover
    from ..core.hints import PathLike
    from ..probes.head_tokens import HeadTokens
    from ..probes.token_effect import AttendedTokenEffect

__all__ = ["SIGNS_COLUMNS", "read_mechanism", "write_mechanism"]

#: The tables of a mechanism save.
TABLES = frozenset({"table", "signs", "weights", "stability"})


def write_mechanism(result: Any, path: PathLike, overwrite: bool = False) -> str:
    """:func:`~tl_idempotence.report.mechanism.save_mechanism` (its docstring says what it writes and raises; it
    checks that ``result`` is a ``Mechanism``)."""
    from ..core.options import check_bool

    check_bool(overwrite, "overwrite")
    check_save_target(
        path,
        "A mechanism save",
        "mechanism",
        result.loaded_from,
        "; for a page use rep.save_html(path, mechanism=...), for a table or JSON rep.export(path) (the CLI's "
        "--mechanism)",
    )
    table = result._table
    cols = [c for c in table.columns if c not in ROLE_COLUMNS]
    if tuple(cols) != TABLE_COLUMNS:
        raise OptionError(f"This Mechanism's table has columns {list(table.columns)}, not rep.mechanism's: not saved.")
    if result.effect is None:
        raise OptionError(
            "This Mechanism holds no attended-token effect (its positions give its intervals): not saved."
        )
    tables = {
        "table": table,
        "signs": result.signs.reset_index(),
        "weights": result.weights,
        "stability": result.stability,
    }
    files = {
        "head_tokens": None if result.tokens is None else head_tokens_files(result.tokens),
        "attended_token_effect": attended_token_effect_files(result.effect),
    }
    parts = {name: fs for name, fs in files.items() if fs is not None}  # one folder, put in place in one step
    return str(write_summary_record(path, result.store, tables, result.summary, parts, overwrite))


def _refuse(f: Path, what: str) -> ReportFileError:
    return ReportFileError(f"{f}: {what}: the record or a table was edited. Save the mechanism again (rep.mechanism).")


def _columns(d: Path, tables: Mapping[str, pd.DataFrame]) -> None:
    """Refuse a table whose columns are not a mechanism save's (names the file)."""
    cols = tuple(tables["table"].columns)
    if cols not in (TABLE_COLUMNS, (*TABLE_COLUMNS, *ROLE_COLUMNS)):
        raise ReportFileError(f"{d / 'table.parquet'} has columns {list(cols)}, not a mechanism table.")
    for name, want in (("signs", SIGNS_COLUMNS), ("weights", WEIGHT_COLUMNS), ("stability", STABILITY_COLUMNS)):
        if tuple(tables[name].columns) != want:
            raise ReportFileError(
                f"{d / f'{name}.parquet'} has columns {list(tables[name].columns)}, not {list(want)}."
            )


def _same_column(a: pd.Series, b: Any) -> bool:
    """Equal values, NaN equal to NaN and NA to NA (floats exactly); flags and texts of the same kind."""
    b = pd.Series(b, index=a.index)
    kinds = {str(a.dtype) == "boolean", str(b.dtype) == "boolean"}
    if kinds == {True} or not (pd.api.types.is_numeric_dtype(a) and pd.api.types.is_numeric_dtype(b)):
        if len(kinds) > 1:
            return False
        return same_value([None if pd.isna(x) else x for x in a], [None if pd.isna(x) else x for x in b])
    if len(kinds) > 1:
        return False
    return bool(np.array_equal(a.to_numpy(dtype=float), b.to_numpy(dtype=float), equal_nan=True))


def _check_table(ft: Path, table: pd.DataFrame, threshold: float) -> None:
    """The table's own rules: closed against the threshold, ``alpha_P``, directions, texts, flags, projections."""
    P, alpha = table["P"].to_numpy(dtype=float), table["alpha"].to_numpy(dtype=float)
    if table["closed"].dtype != bool or not (table["closed"].to_numpy() == (P >= threshold)).all():
        raise _refuse(ft, f"'closed' disagrees with P >= threshold ({threshold:g})")
    if not same_value((alpha * P).tolist(), table["alpha_P"].to_numpy(dtype=float).tolist()):
        raise _refuse(ft, "'alpha_P' is not alpha * P")
    direction, effect = table["direction"].to_numpy(dtype=float), table["effect_median"].to_numpy(dtype=float)
    if not (np.isin(direction[np.isfinite(direction)], (-1.0, 0.0, 1.0)).all()) or not (
        np.array_equal(np.isnan(direction), np.isnan(effect))
    ):
        raise _refuse(ft, "'direction' is not -1, 0 or +1 where the effect is defined and NaN where it is not")
    if not all(isinstance(x, str) for x in table["reason"]) or not all(isinstance(x, str) for x in table["control_of"]):
        raise _refuse(ft, "'reason' or 'control_of' is not text")
    if table["asked"].dtype != bool or ((~table["asked"]) & (table["control_of"] == "")).any():
        raise _refuse(ft, "'asked' is not a flag, or a head neither asked for nor a matched control")
    for col in ("proj_rank", "proj_rank_any"):
        if table[col].dtype != np.int64 or (table[col] < -1).any():
            raise _refuse(ft, f"{col!r} is not a rank (-1 where undefined)")
    for col in ("asymmetry", "proj_distance", "proj_distance_any"):
        v = table[col].to_numpy(dtype=float)
        if (v[np.isfinite(v)] < 0).any():
            raise _refuse(ft, f"{col!r} is negative")


def _check_weights(fw: Path, ft: Path, weights: pd.DataFrame, table: pd.DataFrame, threshold: float) -> None:
    """The weights table: its heads once each, ``closed`` against the threshold, and the joined rows' numbers."""
    weights.index = head_labels(index_column(weights, "layer", fw), index_column(weights, "head", fw))
    if weights.index.duplicated().any():
        raise _refuse(fw, "a head repeats")
    P = weights["P"].to_numpy(dtype=float)
    if weights["closed"].dtype != bool or not (weights["closed"].to_numpy() == (P >= threshold)).all():
        raise _refuse(fw, f"'closed' disagrees with P >= threshold ({threshold:g})")
    lack = [x for x in table.index if x not in weights.index]
    if lack:
        raise _refuse(fw, f"it lacks joined heads {lack[:5]}")
    w = weights.loc[table.index]
    for col in ("P", "alpha", "closed", "copying", "copying_own"):
        if not _same_column(table[col].astype(float), w[col].astype(float)):
            raise _refuse(ft, f"{col!r} is not {fw.name}'s")


def _check_stability(fs: Path, stability: pd.DataFrame, table: pd.DataFrame, sets: Any) -> None:
    """The per-set directions: the compared heads (closed heads and matched controls) in every set named by the
    summary, ``set0`` the table's own."""
    if not (isinstance(sets, list) and sets and sets[0] == "set0" and len(set(sets)) == len(sets)):
        raise _refuse(fs, f"summary['settings']['sets'] {sets!r} is not a list of set names starting with 'set0'")
    compared = [lab for lab, c, of in zip(table.index, table["closed"], table["control_of"], strict=True) if c or of]
    want = [(lab, name) for name in sets for lab in compared]
    got = list(zip(stability["label"].astype(str), stability["set"].astype(str), strict=True))
    if got != want:
        raise _refuse(fs, "its rows are not each closed head and control in each text set the summary names")
    d = stability["direction"].to_numpy(dtype=float)
    if not np.isin(d[np.isfinite(d)], (-1.0, 0.0, 1.0)).all():
        raise _refuse(fs, "'direction' is not -1, 0 or +1")
    own = stability[stability["set"] == "set0"]
    if not _same_column(pd.Series(own["direction"].to_numpy(dtype=float)), table.loc[compared, "direction"].to_numpy()):
        raise _refuse(fs, "set0's directions are not the table's")


def read_mechanism(path: PathLike, make: Any) -> Any:
    """:func:`~tl_idempotence.report.mechanism.load_mechanism` (its docstring says what it checks and raises);
    ``make`` is the ``Mechanism`` class (passed in: this module does not import the one that imports it)."""
    d, raw, summary, tables = read_summary_record(
        path, make.store, TABLES, "a mechanism", old_formats=(V030_MECHANISM_FORMAT,)
    )
    legacy = _legacy(d / MECHANISM_RECORD, summary)
    rec, ft, fs = d / MECHANISM_RECORD, d / "table.parquet", d / "signs.parquet"
    _columns(d, tables)
    table, signs, weights, stability = (tables[k] for k in ("table", "signs", "weights", "stability"))
    table.index = head_labels(index_column(table, "layer", ft), index_column(table, "head", ft))
    if table.index.duplicated().any():
        raise _refuse(ft, f"head {table.index[table.index.duplicated()][0]} repeats")
    try:
        threshold, n_perm = float(summary["threshold"]), int(summary["n_permutations"])
        tie = EmbeddingTie(**summary["embedding_tie"])
    except (KeyError, TypeError, ValueError) as e:
        raise ReportFileError(f"{rec}: a malformed summary ({type(e).__name__}: {e}).") from e
    if not (0.0 <= threshold <= 1.0):
        raise _refuse(rec, f"summary['threshold'] is {threshold!r}, not a P threshold in [0, 1]")
    _check_table(ft, table, threshold)
    _check_weights(d / "weights.parquet", ft, weights, table, threshold)
    if legacy:
        check_unmeasured_v030(ft, d / "weights.parquet", table, weights)
    elif not np.isfinite(weights["norm"].to_numpy(dtype=float)).all():  # every measured head's ‖T‖_F
        raise _refuse(d / "weights.parquet", "'norm' is not a number for every head (only a 0.3.0 save lacks it)")
    _check_stability(d / "stability.parquet", stability, table, (summary.get("settings") or {}).get("sets"))
    parts = raw.get("parts")
    if not (isinstance(parts, list) and set(parts) <= set(PART_COLUMNS) and len(set(parts)) == len(parts)):
        raise ReportFileError(f"{rec}: parts {parts!r} are not a list of {sorted(PART_COLUMNS)}.")
    if "attended_token_effect" not in parts:
        raise ReportFileError(
            f"{rec}: a mechanism save holds its attended-token effect (attended_token_effect/: its positions give the "
            "intervals and the split); this one lists none. Save the mechanism again (rep.mechanism)."
        )
    for name in parts if raw.get("format") != V030_MECHANISM_FORMAT else ():  # the upgrade checked a 0.3.0 one's
        check_part_summary(d, name, summary)  # first, from the parts' records alone (no table read)
    effect = _load_parts(d, parts, table, summary, "attended_token_effect")
    if legacy:  # what a 0.3.0 save determines (mechanism_legacy); the rest is not measured
        fresh_table, fresh_signs, stats = derived_v030(table, summary)
    else:
        fresh_table, fresh_signs, stats = _recompute(rec, table, weights, effect, stability, summary)
    for col in ("sign_agrees", *DERIVED_COLUMNS):
        if not _same_column(table[col], fresh_table[col].array):
            raise _refuse(ft, f"{col!r} is not what the tables give")
    stored = signs.set_index(["quantity", "group"])
    same_signs = list(stored.index) == list(fresh_signs.index) and list(stored.columns) == list(fresh_signs.columns)
    for col in fresh_signs.columns if same_signs else []:
        same_signs = same_signs and same_value(stored[col].tolist(), fresh_signs[col].tolist())
    if not same_signs:
        raise _refuse(fs, f"the signs are not what {ft.name} gives (recomputed over {list(SIGNED)})")
    fresh = {
        "n_heads": len(table),
        "n_closed": int(table["closed"].sum()),
        "n_asked": int(table["asked"].sum()),
        **{k: stats[k] for k in RECOMPUTED},
    }
    for k, v in fresh.items():
        if not same_value(json_like(summary.get(k)), json_like(v)):
            raise _refuse(rec, f"summary[{k!r}] is {summary.get(k)!r} but {v!r} from the tables")
    summary = _check_stated(rec, summary, tie, n_perm)
    tokens = _load_parts(d, parts, table, summary, "head_tokens")  # last: every cheaper check first
    return make(
        table=table, signs=stored, summary=summary, tokens=tokens, effect=effect, tie=tie, loaded_from=str(d),
        weights=weights, stability=stability,
    )  # fmt: skip


def _recompute(
    rec: Path,
    table: pd.DataFrame,
    weights: pd.DataFrame,
    effect: AttendedTokenEffect,
    stability: pd.DataFrame,
    summary: Mapping[str, Any],
) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, Any]]:
    """:func:`~tl_idempotence.report.mechanism.derived` of the saved tables, its controls checked to be joined.

    Raises:
        ReportFileError: settings the derivations refuse, or a matched control the table lacks (names the record).
    """
    try:
        m = summary["settings"]
        matching = controls_matching(weights, list(table.index), m["n_controls"], m["match_by"])
        lack = [x for x in matching.controls if x not in table.index]
        if lack:
            raise _refuse(rec, f"the matched controls {lack[:5]} of summary['matched'] are not joined")
        k = effect.summary.get("predicted_k")
        if m["predicted_k"] != k or type(m["predicted_k"]) is not type(k):
            raise _refuse(rec, "summary['settings']['predicted_k'] is not the attended-token effect's predicted_k")
        return derived(table, weights, effect.positions, stability, summary)
    except (KeyError, TypeError, ValueError, AttributeError, OptionError, OptionTypeError) as e:
        if isinstance(e, ReportFileError):
            raise
        raise _refuse(rec, f"the summary's settings are refused ({type(e).__name__}: {e})") from e


def _check_stated(rec: Path, summary: Mapping[str, Any], tie: EmbeddingTie, n_perm: int) -> Any:
    """What the summary states besides the recomputed fields: the tie, the headline (followed by what was not
    measured, :func:`~tl_idempotence.core.legacy.summary_after_check`), the permutations' floor, the bootstrap's level
    and what it restates of its probes (:func:`_check_restated`). Returns the summary (an upgraded one's headline
    set)."""
    if tie.tied is not summary.get("tied"):
        raise _refuse(rec, f"summary['tied'] is {summary.get('tied')!r} but embedding_tie.tied is {tie.tied!r}")
    summary, want = summary_after_check(summary, mechanism_headline(summary, tie))
    if summary.get("headline") != want:
        raise _refuse(rec, "summary['headline'] is not what the table and the summary give")
    if not (1 <= n_perm <= 1 << 20) or summary.get("p_floor") != min(1.0, 2 / (n_perm + 1)):
        raise _refuse(
            rec, f"summary['n_permutations'] {n_perm!r} and summary['p_floor'] {summary.get('p_floor')!r} disagree"
        )
    if not isinstance(summary.get("seed"), int) or isinstance(summary.get("seed"), bool) or summary["seed"] < 0:
        raise _refuse(rec, f"summary['seed'] {summary.get('seed')!r} is not a seed")
    _check_restated(rec, summary)
    return summary


def _legacy(rec: Path, summary: Mapping[str, Any]) -> bool:
    """Whether ``summary`` is of a mechanism read from a 0.3.0 save (upgraded now, or saved again since): its
    ``not_measured`` field is :data:`~tl_idempotence.report.mechanism_legacy.V030_NOT_MEASURED` (another one is
    refused, naming ``rec``)."""
    nm = summary.get(NOT_MEASURED)
    if nm is None:
        return False
    if not same_value(json_like(nm), V030_NOT_MEASURED):
        raise _refuse(rec, f"summary[{NOT_MEASURED!r}] is not what a mechanism of a {V030} save holds")
    return True


def _check_restated(rec: Path, summary: Mapping[str, Any]) -> None:
    """What a mechanism summary restates of its probes' summaries (``head_tokens``, ``attended_token_effect``): the
    model's name, the seed and the conventions; and the G = I convention's text.

    Raises:
        ReportFileError: names the record and the field that differs.
    """
    conv = summary.get("conventions")
    if not isinstance(conv, Mapping) or conv.get("copying_own") != COPYING_OWN_CONVENTION:
        raise _refuse(rec, "summary['conventions'] is not what rep.mechanism writes")
    for part, key in (("head_tokens", "tokens"), ("attended_token_effect", "effect")):
        ps = summary.get(part)
        if not isinstance(ps, Mapping):
            raise _refuse(rec, f"summary[{part!r}] is missing")
        for field, mine in (("model_name", summary.get("model_name")), ("seed", summary.get("seed"))):
            if ps.get(field) != mine or type(ps.get(field)) is not type(mine):
                raise _refuse(
                    rec, f"summary[{field!r}] is {mine!r} but summary[{part!r}][{field!r}] is {ps.get(field)!r}"
                )
        if conv.get(key) != ps.get("convention"):
            raise _refuse(rec, f"summary['conventions'][{key!r}] is not summary[{part!r}]['convention']")


def _load_parts(d: Path, parts: Any, table: pd.DataFrame, summary: Mapping[str, Any], name: str) -> Any:
    """The probe's result ``name`` a mechanism save holds (None when ``parts`` of its record does not list it),
    loaded and checked against the joined table and the summary.

    Raises:
        ReportFileError: ``parts`` names something else; a part whose numbers or summary are not the joined
            table's (names the part's folder and the column). As the part's loader (its files named).
    """
    from ..core.frozen import thawed

    rec = d / MECHANISM_RECORD
    if not (isinstance(parts, list) and set(parts) <= set(PART_COLUMNS) and len(set(parts)) == len(parts)):
        raise ReportFileError(f"{rec}: parts {parts!r} are not a list of {sorted(PART_COLUMNS)}.")
    if name not in parts:
        return None
    part: HeadTokens | AttendedTokenEffect = (
        load_head_tokens if name == "head_tokens" else load_attended_token_effect
    )(d / name)
    where = d / name
    pt = part._table
    lack = [x for x in table.index if x not in pt.index]
    if lack:
        raise _refuse(where, f"it lacks joined heads {lack[:5]}")
    for col, src in PART_COLUMNS[name]:
        if not same_value(table[col].astype(float).tolist(), pt.loc[table.index, src].astype(float).tolist()):
            raise _refuse(where, f"its {src!r} is not table.parquet's {col!r}")
    if not same_value(json_like(thawed(part.summary)), json_like(thawed(summary.get(name)))):
        raise _refuse(where, f"its summary is not summary[{name!r}] of {MECHANISM_RECORD}")
    return part


register(MECHANISM_RECORD, mechanism_v030)  # a save of 0.3.0 (mechanism/1): mechanism_legacy
