"""The numbers of a comparison: the cross-model table, its columns and its headline (SPEC 2-5).

:func:`comparison_table` gives one row per report (sizes, closure, the null controls, the search, the processing and
identical-weights checks) plus the paper's reference rows; :func:`comparison_headline_of` says which model has the
largest share of closed heads and which the smallest. :class:`~tl_idempotence.studies.compare.Comparison` holds them
(and :mod:`tl_idempotence.studies.compare` names everything here too).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from ..analyses import registry
from ..core.paper import PAPER, PAPER_THRESHOLD
from ..core.processing import T_PROCESSING
from ..report.identity import processing_key
from ..report.report import IdempotenceReport
from ..report.summary import field_rules

__all__ = [
    "OVERVIEW_COLUMNS",
    "PAPER_LABEL",
    "PROCESSING_FLAGS",
    "TABLE_COLUMNS",
    "ComparisonHeadline",
    "ModelCount",
    "comparison_headline_of",
    "comparison_table",
    "table_columns",
]

#: The processing flags that change T (SPEC 10), compared between models:
#: :data:`~tl_idempotence.core.processing.T_PROCESSING` (the same flags a trajectory compares along its checkpoints).
PROCESSING_FLAGS = T_PROCESSING
#: ``model`` of the paper's reference rows.
PAPER_LABEL = "paper"
#: The size columns of :attr:`~tl_idempotence.studies.compare.Comparison.table` (integers), in order.
_SIZE_COLUMNS = (
    "n_params",
    "n_layers",
    "n_attention_layers",
    "n_heads_per_layer",
    "n_kv_heads",
    "n_heads_total",
    "d_model",
    "d_head",
)
#: Columns of :attr:`~tl_idempotence.studies.compare.Comparison.table`, in order.
TABLE_COLUMNS = [
    "model",
    "model_name",
    "is_paper",
    *_SIZE_COLUMNS,
    "n_closed",
    "pct_closed",
    "median_P",
    "median_P_scrambled",
    "pct_beats_scramble",
    "n_layers_trained_wins",
    "pct_layers_trained_wins",
    "n_mismatch_closed",
    "mismatch_P_max",
    "n_feasible_layers",
    "pct_layers_feasible",
    "raw_weights",
    "processing_differs",
    "identical_weights",
    "weights_group",
]


def table_columns() -> list[str]:
    """The columns of :attr:`~tl_idempotence.studies.compare.Comparison.table`: :data:`TABLE_COLUMNS` (the paper's
    analyses), with every registered analysis's declared columns
    (:attr:`~tl_idempotence.analyses.spec.AnalysisSpec.compared`) before ``raw_weights`` (read from the registry at
    each call)."""
    extra = [c for spec in registry.ANALYSES for c in spec.compared if c not in TABLE_COLUMNS]
    at = TABLE_COLUMNS.index("raw_weights")
    return [*TABLE_COLUMNS[:at], *extra, *TABLE_COLUMNS[at:]]


#: The columns of :attr:`~tl_idempotence.studies.compare.Comparison.overview`: what a researcher reads first (the
#: full table has every column).
OVERVIEW_COLUMNS = [
    "model",
    "n_heads_total",
    "n_closed",
    "pct_closed",
    "median_P",
    "median_P_scrambled",
    "pct_beats_scramble",
    "n_mismatch_closed",
    "pct_layers_feasible",
    "raw_weights",
]
_INT_COLUMNS = (
    *_SIZE_COLUMNS,
    "n_closed",
    "n_layers_trained_wins",
    "n_mismatch_closed",
    "n_feasible_layers",
    "weights_group",
)
_BOOL_COLUMNS = ("is_paper", "raw_weights", "processing_differs", "identical_weights")


def _nan(x: Any) -> float:
    return float("nan") if x is None else float(x)


def _pct(n: Any, of: Any) -> float:
    return 100.0 * float(n) / float(of) if n is not None and of else float("nan")


def _model_row(label: str, rep: IdempotenceReport) -> dict[str, Any]:
    s = rep.summary
    closure, scramble, mismatch, search = s.closure, s.scramble, s.mismatch, s.search
    n_att = int(s.n_attention_layers)
    wins = None if scramble is None else scramble.n_layers_trained_wins
    feasible = None if search is None else search.n_feasible_layers
    row: dict[str, Any] = {
        "model": label,
        "model_name": str(s.model_name),
        "is_paper": False,
        "n_params": s.n_params,
        "n_layers": int(s.n_layers),
        "n_attention_layers": n_att,
        "n_heads_per_layer": int(s.n_heads_per_layer),
        "n_kv_heads": int(s.n_kv_heads),
        "n_heads_total": int(s.n_heads),
        "d_model": int(s.d_model),
        "d_head": int(s.d_head),
        "n_closed": int(closure.n_closed),
        "pct_closed": 100.0 * float(closure.frac_closed),
        "median_P": _nan(closure.median_P),
        "median_P_scrambled": _nan(None if scramble is None else scramble.median_P_scrambled),
        "pct_beats_scramble": 100.0 * _nan(None if scramble is None else scramble.frac_beats_scramble),
        "n_layers_trained_wins": wins,
        "pct_layers_trained_wins": _pct(wins, n_att),
        "n_mismatch_closed": None if mismatch is None else mismatch.n_mismatch_closed,
        "mismatch_P_max": _nan(None if mismatch is None else mismatch.mismatch_P_max),
        "n_feasible_layers": feasible,
        "pct_layers_feasible": _pct(feasible, n_att),
        "raw_weights": processing_key(s)[0],
    }
    for spec in registry.ANALYSES:  # the columns an analysis declares (spec.compared): None when it did not run
        record = s.analyses.get(spec.name)
        row.update({c: None if record is None else getattr(record, c) for c in spec.compared})
    return row


def _pct_exact(frac: float) -> float:
    """A fraction from the paper as a percentage without binary noise (0.0398 -> 3.98, not 3.9800000000000004)."""
    return round(100.0 * frac, 10)


def _paper_rows() -> list[dict[str, Any]]:
    rows = []
    for end, i in (("low", 0), ("high", 1)):
        rows.append(
            {
                "model": f"{PAPER_LABEL} ({end})",
                "model_name": "arXiv 2609.01129",
                "is_paper": True,
                "pct_closed": _pct_exact(PAPER["frac_closed"][i]),
                "median_P": PAPER["median_P_trained"][i],
                "median_P_scrambled": PAPER["median_P_scrambled"][i],
                "pct_beats_scramble": _pct_exact(PAPER["frac_beats_scramble"][i]),
                "pct_layers_trained_wins": _pct_exact(PAPER["frac_layers_trained_wins"][i]),
                "n_mismatch_closed": 0 if PAPER["mismatch_closed"][i] == 0 else None,
                "pct_layers_feasible": _pct_exact(PAPER["frac_layers_feasible"][i]),
            }
        )
    return rows


def comparison_table(reports: Mapping[str, IdempotenceReport], paper: bool = True) -> pd.DataFrame:
    """The cross-model table (see :attr:`~tl_idempotence.studies.compare.Comparison.table` for the columns).

    Args:
        reports: ``{label: report}`` in display order.
        paper: append the paper's reference rows.
    """
    rows = [_model_row(label, rep) for label, rep in reports.items()]
    keys = [processing_key(rep.summary) for rep in reports.values()]
    if keys:
        counts = {k: keys.count(k) for k in keys}
        best = max(counts.values())
        majority = next(k for k in keys if counts[k] == best)  # ties: the first model's
        for row, k in zip(rows, keys):
            row["processing_differs"] = k != majority
    fps = [str(rep.summary.weights_fingerprint or "") for rep in reports.values()]
    first: dict[str, int] = {}
    for row, fp in zip(rows, fps):
        group = first.setdefault(fp, len(first) + 1) if fp else None
        row["weights_group"] = group
        row["identical_weights"] = bool(fp) and fps.count(fp) > 1
    if paper:
        rows += _paper_rows()
    columns = table_columns()
    df = pd.DataFrame(rows, columns=columns)
    declared_ints = {c for c in columns if c not in TABLE_COLUMNS and field_rules().get(c) in ("count", "size")}
    for c in (*_INT_COLUMNS, *sorted(declared_ints)):
        df[c] = pd.array(
            [None if v is None or (isinstance(v, float) and math.isnan(v)) else int(v) for v in df[c]], dtype="Int64"
        )
    for c in _BOOL_COLUMNS:
        df[c] = pd.array(
            [None if v is None or (isinstance(v, float) and math.isnan(v)) else bool(v) for v in df[c]], dtype="boolean"
        )
    for c in columns:
        if (
            c not in _INT_COLUMNS
            and c not in declared_ints
            and c not in _BOOL_COLUMNS
            and c not in ("model", "model_name")
        ):
            df[c] = df[c].astype("float64")
    return df


@dataclass(frozen=True)
class ModelCount:
    """One model's closed heads: ``n_closed`` of ``n_heads`` measured heads, ``pct_closed`` percent of them."""

    model: str
    n_closed: int
    n_heads: int
    pct_closed: float

    def describe(self) -> str:
        """``"smollm2 (13 of 270, 4.81 %)"``."""
        return f"{self.model} ({self.n_closed} of {self.n_heads}, {self.pct_closed:.2f} %)"


@dataclass(frozen=True)
class ComparisonHeadline:
    """The answer of a comparison, first: which model has the largest share of closed heads, and which the smallest.

    Attributes:
        n_models: the models compared (the paper's rows not counted).
        threshold: the P threshold every model was measured at.
        most_closed: the model(s) with the largest ``pct_closed`` (several on a tie), in table order.
        fewest_closed: the model(s) with the smallest ``pct_closed`` (empty with fewer than two models, or when
            every model has the same share).
        no_heads: models with no measured head (no share; left out of both).
        paper_pct_closed: the paper's per-model range of closed heads, percent at P ≥ 0.9 (3.98, 8.00).
        sentence: the answer in one sentence (``str(headline)``).
    """

    n_models: int
    threshold: float
    most_closed: tuple[ModelCount, ...]
    fewest_closed: tuple[ModelCount, ...]
    no_heads: tuple[str, ...]
    paper_pct_closed: tuple[float, float]
    sentence: str

    def __str__(self) -> str:
        return self.sentence


def _names(counts: Sequence[ModelCount], limit: int = 3) -> str:
    """``"a (…)"``, ``"a (…) and b (…)"``, ``"a (…), b (…) and 4 more"``."""
    parts = [c.describe() for c in counts[:limit]]
    if len(counts) > limit:
        return ", ".join(parts) + f" and {len(counts) - limit} more"
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def comparison_headline_of(table: pd.DataFrame, threshold: float) -> ComparisonHeadline:
    """The :class:`ComparisonHeadline` of a comparison table (its rows without the paper's).

    Args:
        table: :attr:`~tl_idempotence.studies.compare.Comparison.models_table` (columns ``model, n_closed,
            n_heads_total, pct_closed``).
        threshold: the P threshold the models were measured at.

    Returns:
        The headline; ties list every tied model (the sentence names three, then counts the rest).
    """
    counts = [
        ModelCount(str(r.model), int(r.n_closed), int(r.n_heads_total), float(r.pct_closed))
        for r in table.itertuples()
        if not pd.isna(r.n_heads_total) and int(r.n_heads_total) > 0 and math.isfinite(float(r.pct_closed))
    ]
    no_heads = tuple(str(m) for m in table["model"] if str(m) not in {c.model for c in counts})
    lo, hi = (_pct_exact(PAPER["frac_closed"][0]), _pct_exact(PAPER["frac_closed"][1]))
    paper = f"the paper, at P ≥ {PAPER_THRESHOLD:g}: {lo:.2f}–{hi:.2f} % per model"
    t = f"P ≥ {float(threshold):g}"
    most: tuple[ModelCount, ...] = ()
    fewest: tuple[ModelCount, ...] = ()
    if not counts:
        sentence = "No model finished." if not len(table) else f"No model has a measured head ({paper})."
    else:
        top = max(c.pct_closed for c in counts)
        low = min(c.pct_closed for c in counts)
        most = tuple(c for c in counts if c.pct_closed == top)
        if len(counts) == 1:
            c = counts[0]
            sentence = f"{c.model}: {c.n_closed} of {c.n_heads} heads are closed ({t}), {c.pct_closed:.2f} % ({paper})."
        elif top == low:
            sentence = f"Every model has the same share of closed heads ({t}): {_names(counts)} ({paper})."
        else:
            fewest = tuple(c for c in counts if c.pct_closed == low)
            verb = "has" if len(most) == 1 else "have"
            sentence = (
                f"{_names(most)} {verb} the largest share of closed heads ({t}); {_names(fewest)} the smallest "
                f"({paper})."
            )
        if no_heads:
            sentence += f" No measured head: {', '.join(no_heads)}."
    return ComparisonHeadline(
        n_models=len(table),
        threshold=float(threshold),
        most_closed=most,
        fewest_closed=fewest,
        no_heads=no_heads,
        paper_pct_closed=(lo, hi),
        sentence=sentence,
    )
