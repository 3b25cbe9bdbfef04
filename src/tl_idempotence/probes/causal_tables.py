"""The tables of the causal test of closure (:mod:`tl_idempotence.probes.causal`, SPEC 13) from its per-position
records: the per-(head, variant) statistics, the per-head table and the headline. :func:`check_saved` recomputes them
from a save's positions table (what the loader of a :class:`~tl_idempotence.probes.causal.CausalClosure` checks).
numpy, pandas and scipy only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..core.selection import head_labels
from ..errors import ReportFileError

__all__ = [
    "CHANGE_COLUMNS",
    "CONVENTION",
    "NO_CHANGE",
    "POSITION_COLUMNS",
    "TEST",
    "VARIANTS",
    "change_stats",
    "changes_frame",
    "check_saved",
    "headline",
    "q_values",
    "wide_table",
]

#: The variants, in the order they run.
VARIANTS = ("closure_free", "closure_only", "zero", "mean")

CONVENTION = (
    "edited - clean at each counted destination; token = the clean run's most-attended counted source; total = "
    "final-logit change; direct = (z' - z) W_O through the final norm at the clean scale (weight applied) and W_U; "
    "self_repair = direct - total; loss = next-token cross-entropy change (nats)"
)
TEST = "two-sided sign test of the total change over positions (scipy binomtest), BH q over heads per variant"
#: The ``reason`` of a (head, variant) whose every total change is exactly 0 (no sign test: p and q are NaN).
NO_CHANGE = "every total change is 0: the edit leaves the attended token's final logit as it is (nothing to test)"

POSITION_COLUMNS = (
    "label", "variant", "window", "pos", "source_pos", "token", "total", "total_std", "direct", "direct_std",
    "self_repair", "loss",
)  # fmt: skip
CHANGE_COLUMNS = (
    "label", "layer", "head", "kv_head", "variant", "rel_change", "n_positions", "total_median", "total_std_median",
    "direct_median", "direct_std_median", "self_repair_median", "loss_change_mean", "loss_change_median", "n_loss",
    "n_pos_total", "n_neg_total", "p_value", "q_value", "reason",
)  # fmt: skip
#: The columns of the changes table its positions give (the others come from the weights' edits).
DERIVED = CHANGE_COLUMNS[6:19]
#: The per-variant columns of the per-head table (``{column}_{variant}``) and where each comes from.
WIDE = {
    "total": "total_median", "direct": "direct_median", "self_repair": "self_repair_median", "loss": "loss_change_mean",
    "p": "p_value", "q": "q_value", "rel_change": "rel_change",
}  # fmt: skip
#: The per-head table's first columns (the weights'); the per-variant ones follow.
BASE_COLUMNS = ("layer", "head", "kv_head", "alpha", "P", "n_positions")


def _sign_test(x: np.ndarray) -> tuple[int, int, float]:
    from scipy.stats import binomtest

    pos, neg = int((x > 0).sum()), int((x < 0).sum())
    if pos + neg == 0:
        return pos, neg, float("nan")
    return pos, neg, float(binomtest(pos, pos + neg, 0.5).pvalue)


def _med(x: np.ndarray) -> float:
    x = np.asarray(x, dtype=float)
    x = x[np.isfinite(x)]
    return float(np.median(x)) if x.size else float("nan")


def change_stats(pos: pd.DataFrame) -> dict[str, Any]:
    """The statistics of one (head, variant) from its positions (:data:`DERIVED` but ``q_value``)."""
    tot = pos["total"].to_numpy(dtype=float)
    loss = pos["loss"].to_numpy(dtype=float)
    npos, nneg, p = _sign_test(tot[np.isfinite(tot)])
    fin = loss[np.isfinite(loss)]
    return {
        "n_positions": len(pos), "total_median": _med(tot), "total_std_median": _med(pos["total_std"].to_numpy()),
        "direct_median": _med(pos["direct"].to_numpy()), "direct_std_median": _med(pos["direct_std"].to_numpy()),
        "self_repair_median": _med(pos["self_repair"].to_numpy()),
        "loss_change_mean": float(fin.mean()) if fin.size else float("nan"), "loss_change_median": _med(fin),
        "n_loss": int(fin.size),
        "n_pos_total": npos, "n_neg_total": nneg, "p_value": p,
    }  # fmt: skip


def q_values(changes: pd.DataFrame) -> np.ndarray:
    """Benjamini-Hochberg q of ``p_value`` within each variant (NaN p: NaN q)."""
    from scipy.stats import false_discovery_control

    q = np.full(len(changes), np.nan)
    for _, idx in changes.groupby("variant", sort=False).indices.items():
        p = changes["p_value"].to_numpy(dtype=float)[idx]
        fin = np.isfinite(p)
        if fin.any():
            q[idx[fin]] = false_discovery_control(p[fin], method="bh")
    return q


def headline(changes: pd.DataFrame) -> str:
    """One sentence per variant: how many heads' edits lower or raise the attended token's final logit (q <= 0.05)."""
    parts = []
    for v, g in changes.groupby("variant", sort=False):
        q, tot = g["q_value"].to_numpy(dtype=float), g["total_median"].to_numpy(dtype=float)
        sig = np.isfinite(q) & (q <= 0.05)
        n_def = int(np.isfinite(tot).sum())
        parts.append(
            f"{v}: {int((sig & (tot < 0)).sum())} lower and {int((sig & (tot > 0)).sum())} raise it (of {n_def} heads "
            "with the variant)"
        )
    return (
        "What does editing each head do to the final logit of the token it attends to (sign test of the total change, "
        "BH q <= 0.05)? " + "; ".join(parts) + "."
    )


def _empty_positions() -> pd.DataFrame:
    return pd.DataFrame({c: np.zeros(0) for c in POSITION_COLUMNS[6:]})


def changes_frame(edits: pd.DataFrame, positions: pd.DataFrame) -> pd.DataFrame:
    """The changes table (:data:`CHANGE_COLUMNS`): ``edits`` (one row per (head, variant): ``label, layer, head,
    kv_head, variant, rel_change, reason``, the edit's reason or "" where it ran) with the statistics of its positions
    (:func:`change_stats`), BH q, and :data:`NO_CHANGE` as the reason of a row whose every total change is 0."""
    groups = {k: g for k, g in positions.groupby(["label", "variant"], sort=False)}
    rows = []
    for r in edits.to_dict("records"):
        g = groups.get((r["label"], r["variant"]))
        stats = change_stats(g if g is not None else _empty_positions())
        reason = r["reason"]
        if g is not None and len(g) and not reason and stats["n_pos_total"] + stats["n_neg_total"] == 0:
            reason = NO_CHANGE
        rows.append({**r, **stats, "reason": reason})
    ch = pd.DataFrame(rows, columns=[c for c in CHANGE_COLUMNS if c != "q_value"])
    ch.insert(ch.columns.get_loc("p_value") + 1, "q_value", q_values(ch))
    for col in ("layer", "head", "kv_head", "n_positions", "n_loss", "n_pos_total", "n_neg_total"):
        ch[col] = ch[col].astype(np.int64)
    return ch.loc[:, list(CHANGE_COLUMNS)]


def wide_table(base: pd.DataFrame, changes: pd.DataFrame, variants: Sequence[str]) -> pd.DataFrame:
    """The per-head table: ``base`` (indexed by label: ``layer, head, kv_head, alpha, P``) with ``n_positions`` (the
    most of any variant) and, per variant ``v``, :data:`WIDE`'s ``{column}_{v}`` from ``changes``."""
    t = base.loc[:, list(BASE_COLUMNS[:5])].copy()
    t["n_positions"] = changes.groupby("label")["n_positions"].max().reindex(t.index).to_numpy(dtype=np.int64)
    for v in variants:
        g = changes[changes["variant"] == v].set_index("label")
        for col, src in WIDE.items():
            t[f"{col}_{v}"] = g[src].reindex(t.index).to_numpy(dtype=float)
    return t


def _same(a: pd.Series, b: pd.Series) -> bool:
    if not (pd.api.types.is_numeric_dtype(a.dtype) and pd.api.types.is_numeric_dtype(b.dtype)):
        return [str(x) for x in a] == [str(x) for x in b]
    return bool(np.array_equal(a.to_numpy(dtype=float), b.to_numpy(dtype=float), equal_nan=True))


def check_saved(
    table: pd.DataFrame,
    changes: pd.DataFrame,
    positions: pd.DataFrame,
    variants: Sequence[str],
    files: Mapping[str, Path],
) -> str:
    """A saved causal closure's tables recomputed from its positions (the loader's check). ``table`` is indexed by
    label already; ``files``: ``{"table": ..., "changes": ..., "positions": ...}`` (named by a refusal).

    Returns:
        The headline the tables give.

    Raises:
        ReportFileError: columns, labels, heads, variants or a number that are not what the positions give (names
            the file and the column).
    """

    def refuse(name: str, what: str) -> ReportFileError:
        return ReportFileError(
            f"{files[name]}: {what}: the record or a table was edited. Compute tli.causal_closure again."
        )

    if tuple(changes.columns) != CHANGE_COLUMNS:
        raise ReportFileError(f"{files['changes']} has columns {list(changes.columns)}, not {list(CHANGE_COLUMNS)}.")
    if tuple(positions.columns) != POSITION_COLUMNS:
        raise ReportFileError(
            f"{files['positions']} has columns {list(positions.columns)}, not {list(POSITION_COLUMNS)}."
        )
    want_cols = [*BASE_COLUMNS, *(f"{c}_{v}" for v in variants for c in WIDE)]
    if list(table.columns) != want_cols:
        raise ReportFileError(f"{files['table']} has columns {list(table.columns)}, not {want_cols}.")
    labels = list(head_labels(changes["layer"], changes["head"]))
    if [str(x) for x in changes["label"]] != labels:
        raise refuse("changes", "'label' is not L{layer}H{head}")
    want = [(lab, v) for lab in table.index for v in variants]
    if list(zip(changes["label"], changes["variant"], strict=True)) != want:
        raise refuse("changes", "its rows are not one per head of the table and variant, in order")
    bad = set(zip(positions["label"], positions["variant"], strict=True)) - set(want)
    if bad:
        raise refuse("positions", f"positions of (head, variant) the changes lack ({sorted(bad)[:3]})")
    ran = set(zip(positions["label"], positions["variant"], strict=True))
    given = changes.loc[:, ["label", "layer", "head", "kv_head", "variant", "rel_change", "reason"]].copy()
    given["reason"] = [
        "" if (lab, v) in ran and r == NO_CHANGE else r
        for lab, v, r in zip(given["label"], given["variant"], given["reason"], strict=True)
    ]
    if any(((lab, v) in ran) == bool(r) for lab, v, r in zip(given["label"], given["variant"], given["reason"])):
        raise refuse("changes", "a 'reason' where the edit ran, or none where it did not")
    fresh = changes_frame(given, positions)
    for col in (*DERIVED, "reason"):
        if not _same(changes[col], fresh[col]):
            raise refuse("changes", f"{col!r} is not what {files['positions'].name} gives")
    per_head = changes.drop_duplicates("label").set_index("label")
    for col in ("layer", "head", "kv_head"):
        if not _same(table[col], per_head[col].reindex(table.index)):
            raise refuse("table", f"{col!r} is not the changes'")
    wide = wide_table(table, fresh, variants)
    for col in wide.columns[5:]:
        if not _same(table[col], wide[col]):
            raise refuse("table", f"{col!r} is not what {files['changes'].name} gives")
    return headline(fresh)
