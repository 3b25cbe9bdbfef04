"""The columns, record names and derivations of a mechanism result (SPEC 13), shared by
:mod:`~tl_idempotence.report.mechanism` (which makes one) and :mod:`~tl_idempotence.report.mechanism_store` (which
saves and reads one back, recomputing every derived column and summary field with :func:`derived`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from ..core.jsonio import json_restore
from ..core.records import json_like, same_value
from ..core.stored import StoreSpec
from ..errors import ReportFileError
from .mechanism_controls import DERIVED_COLUMNS, derive_controls
from .mechanism_stats import derive_tests

__all__ = [
    "COPYING_OWN_CONVENTION",
    "MECHANISM_FORMAT",
    "MECHANISM_RECORD",
    "MECHANISM_STORE",
    "PART_COLUMNS",
    "PROJECTION_COLUMNS",
    "RECOMPUTED",
    "ROLE_COLUMNS",
    "SIGNS_COLUMNS",
    "TABLE_COLUMNS",
    "check_part_summary",
    "derive_all",
    "derived",
]

#: How a mechanism result is stored (:class:`~tl_idempotence.core.stored.StoreSpec`): its record's format and the
#: record fields of its save that nothing derives or restates, with why.
MECHANISM_STORE = StoreSpec(
    name="mechanism",
    formats=("tl_idempotence.mechanism/2",),
    free_fields=(
        ("summary.embedding_tie.how", "how the embeddings' tie was read off the model, recorded once"),
        ("summary.embedding_tie.max_rel_diff", "the measured gap between W_U and W_Eᵀ, recorded once"),
        ("summary.embedding_tie.dtypes", "the embeddings' dtypes, recorded once"),
    ),
)
MECHANISM_FORMAT = MECHANISM_STORE.format
MECHANISM_RECORD = MECHANISM_STORE.record

#: What ``summary["conventions"]["copying_own"]`` says (the G = I copying score).
COPYING_OWN_CONVENTION = "Re Σλ / Σ|λ| over T's own eigenvalues (G = I)"
#: The columns every mechanism table has, in order; the roles' columns may follow.
TABLE_COLUMNS = (
    "layer", "head", "kv_head", "P", "alpha", "closed", "alpha_P", "effect_median", "frac_negative", "null_median",
    "effect_p", "effect_q", "n_positions", "self_rank_median", "frac_top_k", "frac_bottom_k", "copying",
    "copying_own", "sign_agrees", "median_diff", "direction", "reason", "asked", *DERIVED_COLUMNS, "asymmetry",
    "proj_rank", "proj_distance", "proj_rank_any", "proj_distance_any", "n_predicted", "effect_median_predicted",
    "median_diff_predicted", "effect_p_predicted", "direction_predicted", "n_unpredicted",
    "effect_median_unpredicted", "median_diff_unpredicted", "effect_p_unpredicted", "direction_unpredicted",
)  # fmt: skip
ROLE_COLUMNS = ("previous_token", "duplicate_token", "induction")
#: The columns of ``signs.parquet`` (:attr:`~tl_idempotence.report.mechanism.Mechanism.signs` with its index).
SIGNS_COLUMNS = (
    "quantity", "group", "n_positive", "median_abs_positive", "n_negative", "median_abs_negative", "n_zero", "n_nan",
)  # fmt: skip
#: The projection facts the table joins (:func:`~tl_idempotence.maths.projection_facts.projection_facts`).
PROJECTION_COLUMNS = ("asymmetry", "proj_rank", "proj_distance", "proj_rank_any", "proj_distance_any")
#: The joined table's columns each probe gives (mechanism column, probe column).
PART_COLUMNS = {
    "head_tokens": (
        ("self_rank_median", "self_rank_median"), ("frac_top_k", "frac_top_k"), ("frac_bottom_k", "frac_bottom_k"),
    ),
    "attended_token_effect": (
        ("effect_median", "effect_median"), ("frac_negative", "frac_negative"), ("null_median", "null_median"),
        ("effect_p", "effect_p"), ("effect_q", "effect_q"), ("n_positions", "n_positions"),
        ("median_diff", "median_diff"), ("direction", "direction"),
        *((c, c) for c in TABLE_COLUMNS[TABLE_COLUMNS.index("n_predicted") :]),
    ),
}  # fmt: skip


#: The summary fields :func:`derived` recomputes from the tables (with the settings it reads from the summary).
RECOMPUTED = (
    "n_sign_tested", "n_agree", "sign_test_p", "sign_test_floor", "n_spearman", "spearman_rho", "spearman_p",
    "spearman_p_within_layer",
    "spearman_p_unstratified", "n_strata", "n_closed_own_sign_alpha", "median_abs_copying_closed", "matched",
    "base_rates", "projection", "stability", "copy_suppression", "notes",
)  # fmt: skip


def derive_all(
    table: pd.DataFrame,
    weights: pd.DataFrame,
    positions: pd.DataFrame,
    stability: pd.DataFrame,
    settings: Mapping[str, Any],
) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, Any]]:
    """``table`` with every derived column (in :data:`TABLE_COLUMNS` order), its signs and the summary fields
    :data:`RECOMPUTED` (``settings``: ``seed, n_permutations, match_by, n_controls, n_boot, sets, predicted_k``)."""
    s = dict(settings)
    agrees, signs, stats = derive_tests(table, s["n_permutations"], s["seed"])
    columns, sections = derive_controls(
        table, weights, positions, stability, seed=s["seed"], n_permutations=s["n_permutations"],
        match_by=s["match_by"], n_controls=s["n_controls"], n_boot=s["n_boot"], sets=s["sets"],
        predicted_k=s["predicted_k"],
    )  # fmt: skip
    out = table.copy()
    out["sign_agrees"] = agrees
    for col, v in columns.items():
        out[col] = v
    extra = [c for c in out.columns if c not in TABLE_COLUMNS]
    out = out[[*TABLE_COLUMNS, *extra]]
    return out, signs, {**stats, **sections}


def derived(
    table: pd.DataFrame, weights: pd.DataFrame, positions: pd.DataFrame, stability: pd.DataFrame, summary: Any
) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, Any]]:
    """What a saved mechanism's tables give (:func:`~tl_idempotence.report.mechanism_store.load_mechanism`): the
    table with its derived columns recomputed, the signs and the summary fields :data:`RECOMPUTED`, with the
    settings the summary records.

    Raises:
        KeyError / TypeError / ValueError: a summary without its settings. OptionError / OptionTypeError: settings
            the derivations refuse.
    """
    s = summary["settings"]
    settings = {
        "seed": int(summary["seed"]),
        "n_permutations": int(summary["n_permutations"]),
        "match_by": s["match_by"],
        "n_controls": s["n_controls"],
        "n_boot": s["n_boot"],
        "sets": list(s["sets"]),
        "predicted_k": s["predicted_k"],
    }
    base = table.drop(columns=["sign_agrees", *DERIVED_COLUMNS])
    return derive_all(base, weights, positions, stability, settings)


def check_part_summary(d: Path, name: str, summary: Mapping[str, Any]) -> None:
    """Refuse ``summary[name]`` of the mechanism save ``d`` when it is not the summary the part's own record holds
    (read as JSON, nothing else: the part's loader checks the part later).

    Raises:
        ReportFileError: names the part's folder (a missing or unreadable record: its loader's refusal later).
    """
    f = d / name / f"{name}.json"
    try:
        raw = json.loads(f.read_text(encoding="utf-8"))
        theirs = json_restore(raw["summary"], frozenset(raw["float_keys"]), int_keys=False)
    except (OSError, ValueError, KeyError, TypeError):
        return  # the part's loader names what is wrong with it
    if not same_value(json_like(theirs), json_like(summary.get(name))):
        raise ReportFileError(
            f"{d / name}: its summary is not summary[{name!r}] of {MECHANISM_RECORD}: the record or a table was "
            "edited. Save the mechanism again (rep.mechanism)."
        )
