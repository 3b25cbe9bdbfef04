"""Words and numbers for displays: P that never rounds across the threshold, and the report's headline.

* :func:`format_P` — P with as many decimals as it takes to stay on its side of the
  threshold (0.8998 at threshold 0.9 prints ``0.8998``, never ``0.900``).
* :func:`format_P_list` — :func:`format_P` of each value of an array (the figures' hover text).
* :func:`format_sig` — the same guarantee with significant digits, for tables of mixed scales.
* :func:`headline` — one sentence that leads a report: the model, what weights were
  measured, how many heads closed, and against what null.
* :func:`summary_sections` — a report's summary as readable (key, value) tables.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Protocol

from ..core.processing import T_PROCESSING
from ..core.readings import MEASURED_FIELDS, SCRAMBLE_TEST, HeadlineSummary, report_headline

__all__ = [
    "P_VALUE_TESTS",
    "ReportSummaryLike",
    "format_P",
    "format_P_list",
    "format_sig",
    "headline",
    "summary_sections",
    "weights_phrase",
]


class ReportSummaryLike(HeadlineSummary, Protocol):
    """What the words around a report read of its summary (:class:`~tl_idempotence.report.summary.ReportSummary`
    is one): the headline's counts (:class:`~tl_idempotence.core.readings.HeadlineSummary`), the flat form
    (``to_dict``) and, by name, ``model_name``, ``model_class``, ``n_attention_layers``, ``processing`` and the
    ``closure``, ``scramble``, ``mismatch`` and ``search`` records (``None`` for one that did not run), as the
    summary's fields and its ``__getattr__`` give them."""

    @property
    def closure(self) -> Any: ...
    @property
    def scramble(self) -> Any: ...
    def __getattr__(self, name: str) -> Any: ...
    def to_dict(self) -> dict[str, Any]: ...


def plot_text(value: Any) -> str:
    """A user-given string (model name, label, checkpoint) made safe for plotly text: plotly renders titles,
    tick labels and hover text as a subset of HTML (``<b>``, ``<br>``, ``<a href>``), so ``<``, ``>`` and ``&``
    are written as entities (plotly shows them literally)."""
    return str(value).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def format_P(P: float, threshold: float | None = None, digits: int = 4) -> str:
    """``P`` with ``digits`` decimals, or more when fewer would round it across ``threshold``.

    NaN prints as ``"undefined"``.
    """
    if P is None or (isinstance(P, float) and math.isnan(P)):
        return "undefined"
    P = float(P)
    return _on_its_side(P, threshold, lambda d: f"{P:.{d}f}", digits)


def format_P_list(values: Any, threshold: float) -> list[str]:
    """P values (any array-like of numbers) as text that never rounds across ``threshold`` (:func:`format_P` each):
    the hover text of the figures."""
    import numpy as np

    return [format_P(float(v), threshold) for v in np.asarray(values, dtype=float)]


def format_sig(value: float, threshold: float | None = None, sig: int = 6) -> str:
    """``value`` with ``sig`` significant digits (``g`` format), or more when fewer would round it
    across ``threshold``; NaN prints as ``"NaN"``. For tables where P sits next to small numbers
    (scrambled medians ~1e-4) that fixed decimals would flatten."""
    v = float(value)
    if math.isnan(v):
        return "NaN"
    return _on_its_side(v, threshold, lambda d: f"{v:.{d}g}", sig)


def _on_its_side(v: float, threshold: float | None, text_at: Callable[[int], str], digits: int) -> str:
    """``text_at(digits)``, or with more digits when fewer would round ``v`` across ``threshold`` (``repr`` at 17)."""
    d = digits
    while d < 17:
        text = text_at(d)
        if threshold is None or (float(text) >= threshold) == (v >= threshold):
            return text
        d += 1
    return repr(v)  # pragma: no cover


def weights_phrase(summary: ReportSummaryLike) -> str:
    """What weights were measured, in words (SPEC 10): ``"raw checkpoint weights"``, the
    TransformerLens processing that was applied (where the flags came from is in the summary's
    ``processing`` table), or ``"weight processing not recorded"`` when the summary does not say
    (never a guess at raw or processed).

    Args:
        summary: a report's :class:`~tl_idempotence.report.summary.ReportSummary` (its ``processing`` is read).
    """
    proc = summary.processing
    proc = proc if isinstance(proc, dict) else {}
    flags = [k for k in T_PROCESSING[1:] if proc.get(k)]
    if proc.get("raw") is None and not flags:
        return "weight processing not recorded"
    if proc.get("raw") and not flags:
        return "raw checkpoint weights"
    return "TransformerLens-processed weights (" + ", ".join(flags) + ")" if flags else "processed weights"


def headline(summary: ReportSummaryLike, threshold: float) -> str:
    """The report's lead: ``rep.headline`` (closed count and scramble q count in separate clauses,
    :func:`~tl_idempotence.core.readings.report_headline`), then model, weights, closed heads, and the null they
    were measured against.

    E.g. ``"13 of 270 heads are closed (P ≥ 0.9); q ≤ 0.05 for 247 of 270 (trained orientation beats its scramble
    almost everywhere, as in the paper). smollm2-135m (TransformerBridge, raw checkpoint weights): 13 of 270 heads
    (4.81 %) are near-idempotent, P ≥ 0.9; median P 0.265. Against the orientation-scramble null ..."``.

    Args:
        summary: a report's :class:`~tl_idempotence.report.summary.ReportSummary` (its own fields and the
            closure, scramble, mismatch and search records are read).
        threshold: the report's P threshold.
    """
    s = summary
    closure, scramble, mismatch, search = s.closure, s.scramble, s.mismatch, s.search
    n, k = int(s.n_heads), int(closure.n_closed)
    pct = 100.0 * k / n if n else float("nan")
    text = report_headline(s, threshold) + " "
    text += (
        f"{s.model_name} ({s.model_class}, {weights_phrase(s)}): {k} of {n} heads ({pct:.2f} %) are "
        f"near-idempotent, P ≥ {threshold:g}; median P {closure.median_P:.3g}."
    )
    if scramble is not None:
        text += (
            f" Against the orientation-scramble null ({scramble.n_scramble_draws} Haar draws per head) "
            f"{100 * scramble.frac_beats_scramble:.2f} % of heads beat their scramble median (median scrambled P "
            f"{scramble.median_P_scrambled:.3g})"
        )
        if mismatch is not None and mismatch.n_mismatch_pairs:
            text += (
                f", and {mismatch.n_mismatch_closed} of {mismatch.n_mismatch_pairs} matched O/V mismatch pairs reach "
                f"P ≥ {threshold:g}."
            )
        else:
            text += "; there is no matched O/V mismatch pair (one kv head)."
    else:
        text += (
            " No null control was run (nulls=0): use nulls=64 (CLI --nulls 64) for the scramble and mismatch controls."
        )
    if search is not None:
        n_layers = int(s.n_attention_layers)
        text += (
            f" Constructive search: P ≥ {threshold:g} is feasible in {search.n_feasible_layers} of {n_layers} layers."
        )
    return text


def summary_sections(summary: ReportSummaryLike) -> list[tuple[str, list[tuple[str, str]]]]:
    """A summary as titled (key, value) tables: what was measured, processing, options, versions, source.

    Args:
        summary: a report's :class:`~tl_idempotence.report.summary.ReportSummary`; every field that is set is
            shown, in the order of its flat form (:meth:`~tl_idempotence.report.summary.ReportSummary.to_dict`).
    """

    def fmt(v: Any) -> str:
        if isinstance(v, float):
            return "NaN" if math.isnan(v) else f"{v:.6g}"
        if isinstance(v, (list, tuple)):
            return ", ".join(fmt(x) for x in v) if v else "(none)"
        if isinstance(v, dict):
            return "; ".join(f"{a}: {fmt(b)}" for a, b in v.items())
        return str(v)

    s = summary.to_dict()  # every field that is set, flat, in order: what the tables show
    measured = [(k, fmt(s[k])) for k in (*MEASURED_FIELDS, "weights_fingerprint") if k in s]
    headline_keys = [
        k
        for k in s
        if k not in {m for m, _ in measured} and not isinstance(s[k], dict) and k not in ("closed_per_layer",)
    ]
    out: list[tuple[str, list[tuple[str, str]]]] = [
        ("What was measured", measured),
        ("Headline numbers", [(k, fmt(s[k])) for k in headline_keys]),
    ]
    for title, key in (
        ("Weights: processing flags (SPEC 10)", "processing"),
        ("Options", "options"),
        ("Source", "source"),
        ("Shared-value algebra", "algebra"),
        ("Versions", "versions"),
    ):
        if isinstance(s.get(key), dict) and s[key]:
            out.append((title, [(k, fmt(v)) for k, v in s[key].items()]))
    return out


#: What the scramble p- and q-values test, beside them wherever they are shown (page, notebook, column docs).
P_VALUE_TESTS = f"scramble p and its BH q test {SCRAMBLE_TEST}"
