"""Headline sentences that cannot be misread: what was asked, the answer, the number that supports it.

* :func:`report_headline` (``rep.headline``): the closed count (an effect size: ``P >= threshold``) and the count
  with scramble ``q <= 0.05`` (a significance: trained orientation vs Haar-scrambled orientation with the same
  spectra) in separate clauses, so "247 of 270 survive FDR" never reads as "247 are closed".
* :func:`copying_by_sign`: a signed score over a set of heads shown by sign (counts of copying, ``> 0``, and
  suppressing, ``< 0``, heads with the median ``|score|`` of each) and its sign agreement with α; never a signed
  median of a mixed set.
* :func:`roles_headline` (``RoleAssociation.headline``) and :func:`circuit_headline` (``Circuit.headline``).

Numbers only from the results' own tables and summaries; the views draw these sentences.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np
import pandas as pd

from .paper import FDR_LEVEL

__all__ = [
    "CLOSED_HEAD_COLUMNS",
    "MEASURED_FIELDS",
    "SCRAMBLE_TEST",
    "HeadlineSummary",
    "circuit_headline",
    "copying_by_sign",
    "copying_sign_sentence",
    "report_headline",
    "roles_headline",
]

#: The per-head columns a list of closed heads leads with, after the head's label (those its table has): the JSON
#: export's ``closed_heads`` (:data:`~tl_idempotence.report.export.EXPORT_HEAD_COLUMNS`) and a comparison page's.
CLOSED_HEAD_COLUMNS = ("layer", "head", "kv_head", "alpha", "P", "P_scrambled_median", "p_value")

#: A report summary's own fields (not an analysis's), in the order they lead it: what was measured.
MEASURED_FIELDS = (
    "model_name",
    "model_class",
    "n_layers",
    "n_attention_layers",
    "n_heads",
    "n_heads_per_layer",
    "n_kv_heads",
    "d_model",
    "d_head",
    "threshold",
)

#: What the scramble p- and q-values test, in the words every display uses beside them.
SCRAMBLE_TEST = "trained orientation vs Haar-scrambled orientation with the same spectra (not closure)"


class _ClosedCount(Protocol):
    @property
    def n_closed(self) -> int: ...


class _ScrambleCounts(Protocol):
    @property
    def n_heads_compared(self) -> int: ...
    @property
    def n_heads_q05(self) -> int | None: ...


class HeadlineSummary(Protocol):
    """What :func:`report_headline` reads of a report's summary
    (:class:`~tl_idempotence.report.summary.ReportSummary` is one)."""

    @property
    def n_heads(self) -> int: ...
    @property
    def closure(self) -> _ClosedCount: ...
    @property
    def scramble(self) -> _ScrambleCounts | None: ...


def report_headline(summary: HeadlineSummary, threshold: float) -> str:
    """The report's first sentence: how many heads are closed, and separately how many beat their scramble.

    E.g. ``"13 of 270 heads are closed (P ≥ 0.9); q ≤ 0.05 for 247 of 270 (trained orientation beats its scramble
    almost everywhere, as in the paper)."`` The q count is over the heads with a defined scramble comparison
    (``n_heads_compared``); "almost everywhere" is at least 90 % of them (the paper: 98.64 % win).

    Args:
        summary: a report's :class:`~tl_idempotence.report.summary.ReportSummary` (``n_heads``, the closure and
            scramble records).
        threshold: the report's P threshold.
    """
    n, k = int(summary.n_heads), int(summary.closure.n_closed)
    lead = f"{k} of {n} heads are closed (P ≥ {threshold:g})"
    sc = summary.scramble
    if sc is None:
        return f"{lead}; no scramble null was run (nulls=0), so there is no p- or q-value."
    nc = int(sc.n_heads_compared)
    if nc == 0 or sc.n_heads_q05 is None:
        why = "no head has a defined scramble comparison" if nc == 0 else "the record has no q-values"
        return f"{lead}; {why}, so there is no q-value."
    nq = int(sc.n_heads_q05)
    of = f"{nc}" if nc == n else f"{nc} heads compared"
    if nq >= 0.9 * nc:
        reading = "trained orientation beats its scramble almost everywhere, as in the paper"
    elif nq == 0:
        reading = "trained orientation beats its scramble significantly for no head"
    else:
        reading = f"trained orientation beats its scramble significantly for {100 * nq / nc:.1f} % of them"
    return f"{lead}; q ≤ {FDR_LEVEL:g} for {nq} of {of} ({reading})."


def copying_by_sign(score: Any, alpha: Any = None) -> dict[str, Any]:
    """A signed score in [-1, 1] over a set of heads, by sign (SPEC 11: copying vs suppression).

    Args:
        score: ``[n]`` signed scores (NaN: not counted).
        alpha: ``[n]`` the heads' α (optional): the sign agreement ``sign(score) == sign(α)`` over the heads with a
            nonzero score and a nonzero finite α.

    Returns:
        ``n_copying`` (score > 0), ``median_abs_copying`` (their median score), ``n_suppressing`` (score < 0),
        ``median_abs_suppressing`` (their median ``|score|``), ``n_zero`` (score = 0), ``n_sign_compared`` and
        ``n_sign_agrees`` (with ``alpha``; absent without). A median of no head is NaN.
    """
    s = np.asarray(score, dtype=np.float64).reshape(-1)
    ok = np.isfinite(s)
    pos, neg = s[ok & (s > 0)], s[ok & (s < 0)]
    out: dict[str, Any] = {
        "n_copying": len(pos),
        "median_abs_copying": float(np.median(pos)) if len(pos) else float("nan"),
        "n_suppressing": len(neg),
        "median_abs_suppressing": float(np.median(-neg)) if len(neg) else float("nan"),
        "n_zero": int((ok & (s == 0)).sum()),
    }
    if alpha is not None:
        a = np.asarray(alpha, dtype=np.float64).reshape(-1)
        cmp = ok & (s != 0) & np.isfinite(a) & (a != 0)
        out["n_sign_compared"] = int(cmp.sum())
        out["n_sign_agrees"] = int((np.sign(s[cmp]) == np.sign(a[cmp])).sum())
    return out


def _m(v: float) -> str:
    return "–" if math.isnan(v) else f"{v:.3g}"


def copying_sign_sentence(by_sign: Mapping[str, Any], who: str = "closed heads") -> str:
    """``"closed heads: 6 copying (median |copying| 0.998), 7 suppressing (median |copying| 0.997);
    sign(copying) = sign(α) for 13 of 13"`` from :func:`copying_by_sign`."""
    b = by_sign
    text = (
        f"{who}: {b['n_copying']} copying (median |copying| {_m(b['median_abs_copying'])}), "
        f"{b['n_suppressing']} suppressing (median |copying| {_m(b['median_abs_suppressing'])})"
    )
    if b.get("n_zero"):
        text += f", {b['n_zero']} at 0"
    if "n_sign_compared" in b:
        text += f"; sign(copying) = sign(α) for {b['n_sign_agrees']} of {b['n_sign_compared']}"
    return text


def _closed_copying(table: pd.DataFrame) -> dict[str, Any] | None:
    if "copying" not in table.columns:
        return None
    c = table[table["closed"].to_numpy(dtype=bool)]
    return copying_by_sign(c["copying"], c["alpha"])


def roles_headline(table: pd.DataFrame, association: pd.DataFrame, summary: Mapping[str, Any]) -> str:
    """``rep.roles(...)``'s first sentence: which role separates the closed heads from the others, and how the closed
    heads copy (by sign, with the sign agreement with α).

    The role named is the one with the smallest Mann-Whitney q (closed vs other heads, BH across the roles) with its
    q; ``|copying|`` counts as a role (the strength of copying or suppressing, sign apart). Then the closed heads'
    copying by sign (:func:`copying_sign_sentence`).

    Args:
        table, association, summary: a :class:`~tl_idempotence.report.roles.RoleAssociation`'s.
    """
    n, k = int(summary.get("n_heads", len(table))), int(summary.get("n_closed", 0))
    head = f"What the {k} closed heads of {n} do"
    q = pd.to_numeric(association.get("mannwhitney_q", pd.Series(dtype=float)), errors="coerce").dropna()
    if not len(q):
        answer = "no role can be compared between closed and other heads (Mann-Whitney undefined; see the note)"
    else:
        best, qv = str(q.idxmin()), float(q.min())
        if qv <= FDR_LEVEL:
            answer = f"{best} separates them from the other heads (Mann-Whitney q {qv:.2g}, closed vs other heads)"
        else:
            answer = f"no role separates them from the other heads (smallest Mann-Whitney q {qv:.2g}, {best})"
    text = f"{head}: {answer}."
    by_sign = _closed_copying(table)
    if by_sign is not None and k:
        text += f" {copying_sign_sentence(by_sign)}."
    return text


def circuit_headline(summary: Mapping[str, Any]) -> str:
    """``rep.circuit(...)``'s first sentence: does the circuit overlap the closed set more than chance?

    E.g. ``"Circuit of 6 heads vs the 13 closed heads: 0 overlap (chance expects 0.289 of 270 measured heads);
    enrichment (hypergeometric) p 1, layer-matched p 1 (floor 0.001)."`` The expectation is the hypergeometric mean
    ``n_heads · n_closed / n_measured``.
    """
    s = summary
    n, k, N, K = int(s["n_heads"]), int(s["n_overlap"]), int(s["n_measured"]), int(s["n_closed"])
    expected = n * K / N if N else float("nan")
    more = "more than chance" if k > expected else "no more than chance"
    return (
        f"Circuit of {n} heads vs the {K} closed heads: {k} of them closed, {more} (chance expects "
        f"{expected:.3g} among {N} measured heads); enrichment (hypergeometric) p {s['p_hypergeom']:.3g}, "
        f"layer-matched p {s['p_layer_matched']:.3g} (floor {s['p_layer_matched_floor']:.3g})."
    )
