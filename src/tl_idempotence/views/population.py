"""The drawings of a population of mechanism results (``tli.compare_mechanisms``): its notebook display and its
figure, from the result's table and summary only (never recomputed).

* :func:`mechanism_comparison_html` — the headline, the combined test's numbers, the per-model table (refused models
  with their reason), plain HTML (it shows in a static render of a notebook);
* :func:`mechanism_comparison_figure` — per model, the closed heads' agreement rate (direction = sign(α)), their
  matched controls' and the non-closed heads' (the base rate), the pooled test in the title.
"""

from __future__ import annotations

import html
import math
from typing import TYPE_CHECKING, Any

import pandas as pd

from .role_figures import drawn_table
from .text import format_sig, plot_text

if TYPE_CHECKING:  # pragma: no cover
    import plotly.graph_objects as go

__all__ = ["mechanism_comparison_figure", "mechanism_comparison_html"]

#: The table's columns the display shows (every column stays in ``.table``).
DISPLAY_COLUMNS = (
    "model", "status", "tied", "n_heads", "n_closed", "n_agree", "n_sign_tested", "sign_test_p", "other_agree_rate",
    "n_matched_closed", "matched_difference", "matched_p", "spearman_rho", "spearman_p_within_layer",
    "copying_rate_closed", "copying_rate_other", "notes",
)  # fmt: skip
#: The summary entries the display shows first, in this order.
LEAD = (
    "n_models", "n_measured", "n_refused", "n_models_compared", "n_pooled_closed", "n_pooled_controls",
    "pooled_closed_rate", "pooled_control_rate", "pooled_difference", "pooled_p", "pooled_p_floor", "pooled_method",
    "n_models_positive", "n_models_negative", "models_sign_test_p", "spearman_rho_pooled", "spearman_p_within",
    "answer",
)  # fmt: skip


def _cell(v: Any) -> str:
    if isinstance(v, float):
        return "NaN" if math.isnan(v) else format_sig(v, None, sig=3)
    return "" if v is None else str(v)


def mechanism_comparison_html(cmp: Any) -> str:
    """A :class:`~tl_idempotence.studies.population.MechanismComparison`'s notebook display: the headline, the
    combined test's numbers, the per-model rows (``DISPLAY_COLUMNS``; every column in ``.table``). Raises nothing
    for a result of that class."""
    s = cmp.summary
    out = f"<div><b>{html.escape(type(cmp).__name__)}</b><p>{html.escape(str(cmp.headline))}</p>"
    lead = pd.DataFrame([(k, _cell(s[k])) for k in LEAD if k in s], columns=["", "value"])
    out += f"<details open><summary>the combined test</summary>{lead.to_html(index=False, border=0)}</details>"
    t = cmp.table
    shown = t[[c for c in DISPLAY_COLUMNS if c in t.columns]].copy()
    for col in shown.columns:
        shown[col] = [_cell(v) for v in shown[col]]
    out += (
        f"<details open><summary>models ({len(t)}; {len(shown.columns)} of {len(t.columns)} columns, every column in "
        f"<code>.table</code>)</summary>{shown.to_html(index=False, border=0)}</details>"
    )
    return out + "</div>"


def mechanism_comparison_figure(cmp: Any) -> go.Figure:
    """Per model (x, in the table's order): the closed heads' agreement rate (red diamonds), their matched
    controls' (blue squares) and the non-closed heads' (the base rate, grey dots); y = the share of heads whose
    direction (the sign of effect - null) is sign(α). A refused model has no marker and its reason in the hover of
    an empty x position. The title gives the pooled difference with its p and floor (the result's summary).

    Args:
        cmp: a :class:`~tl_idempotence.studies.population.MechanismComparison`.

    Raises:
        OptionTypeError: ``cmp`` has no such table.
    """
    import plotly.graph_objects as go

    t = drawn_table(
        cmp,
        {"model", "agree_rate", "matched_control_rate", "other_agree_rate", "status", "notes"},
        "mechanism_comparison_figure draws tli.compare_mechanisms(...)",
    )
    s = cmp.summary
    x = [plot_text(m) for m in t["model"]]
    fig = go.Figure()
    for col, name, marker, count in (
        ("other_agree_rate", "non-closed heads (base rate)", {"color": "#7f7f7f", "size": 7}, "n_other_tested"),
        ("matched_control_rate", "matched controls", {"color": "#1f77b4", "size": 8, "symbol": "square"},
         "n_matched_controls"),
        ("agree_rate", "closed heads", {"color": "#e8175d", "size": 10, "symbol": "diamond"}, "n_sign_tested"),
    ):  # fmt: skip
        y = t[col].to_numpy(dtype=float)
        fig.add_trace(
            go.Scatter(
                x=x,
                y=y,
                mode="markers",
                name=name,
                marker=marker,
                text=[
                    f"{m}: {name} {_cell(v)} over {n} heads" if st == "measured" else f"{m}: {notes}"
                    for m, v, n, st, notes in zip(x, y, t[count], t["status"], t["notes"])
                ],
                hovertemplate="%{text}<extra></extra>",
            )
        )
    fig.add_hline(y=0.5, line={"color": "#999", "width": 1, "dash": "dot"})

    def num(key: str) -> float:
        v = s.get(key)
        return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else math.nan

    stats = (
        f"pooled: closed {num('pooled_closed_rate'):.2f} vs matched controls {num('pooled_control_rate'):.2f}, "
        f"difference {num('pooled_difference'):+.2f}, p = {num('pooled_p'):.2g} (within model and layer; floor "
        f"{num('pooled_p_floor'):.2g}); answer: {plot_text(str(s.get('answer')))}"
    )
    fig.update_layout(
        title={"text": f"Does closure predict the sign of the effect? {len(t)} models<br><sub>{stats}</sub>"},
        xaxis_title="model",
        yaxis_title="share of heads with direction = sign(α)",
        yaxis={"range": [-0.05, 1.05]},
        template="plotly_white",
        legend={"orientation": "h", "y": -0.3},
    )
    return fig
