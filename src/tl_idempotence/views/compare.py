"""Figures and the standalone page of a comparison of models (:mod:`tl_idempotence.studies.compare`).

* :func:`comparison_figure` — per model, the distribution of trained P next to the scramble
  null (each head's scramble median) on one log axis, with the threshold and the paper's medians.
* :func:`comparison_html` — the offline page (written by :mod:`tl_idempotence.core.outputs`): the answer first (which
  model has the largest share of closed heads, :attr:`~tl_idempotence.studies.compare.Comparison.headline`),
  what was compared and how, warnings, the overview table (every column folded below it, with the paper's
  rows), the figure, the closed heads of every model.

Plotly and the table code are inlined (no CDN); the page is a jinja2 template.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ..core.paper import PAPER, PAPER_THRESHOLD
from ..core.readings import CLOSED_HEAD_COLUMNS
from .figures import log_P_range
from .page import datatable_html, datatables_init_html, display_frame
from .text import plot_text

if TYPE_CHECKING:  # pragma: no cover
    import plotly.graph_objects as go

__all__ = [
    "comparison_figure",
    "comparison_headline",
    "comparison_html",
    "paper_threshold_note",
]

#: The abstract's pooled medians, drawn as reference lines (arXiv 2609.01129).
_PAPER_MEDIAN_TRAINED = PAPER["median_P_trained"][0]
_PAPER_MEDIAN_SCRAMBLED = PAPER["median_P_scrambled"][0]


def paper_threshold_note(threshold: float) -> str:
    """What the paper's "closed" figures are counted at, said where this comparison's threshold is not the
    paper's (e.g. ``" (the paper counts at P ≥ 0.9; these models at P ≥ 0.8)"``); "" when they agree."""
    if float(threshold) == PAPER_THRESHOLD:
        return ""
    return f" (the paper counts at P ≥ {PAPER_THRESHOLD:g}; these models at P ≥ {float(threshold):g})"


def _positive(values: Any) -> tuple[np.ndarray, int]:
    v = np.asarray(values, dtype=float)
    keep = np.isfinite(v) & (v > 0)
    return v[keep], int((~keep).sum())


def comparison_figure(cmp: Any) -> go.Figure:
    """Per model (x): box plots of trained P and, with controls, of the per-head scramble medians (log y).

    Heads whose P is undefined (NaN) or exactly 0 cannot sit on a log axis; their count is in
    the title. Dotted lines: the comparison's threshold (labelled with its value, and with the
    paper's 0.9 when it differs) and the paper's pooled medians (0.336 trained, 1.04e-4 scrambled).
    """
    import plotly.graph_objects as go

    fig = go.Figure()
    dropped = 0
    arrays = []
    any_null = False
    first = plot_text(next(iter(cmp.reports), ""))

    def box(label: str, values: np.ndarray, group: str, name: str, color: str) -> None:
        fig.add_trace(
            go.Box(
                x=[label] * len(values),
                y=values,
                name=name,
                legendgroup=group,
                showlegend=label == first,
                marker={"color": color},
                offsetgroup=group,
                boxpoints="outliers",
            )
        )

    for name, rep in cmp.reports.items():
        label = plot_text(name)  # a category tick label: plotly renders markup in it
        P, n_bad = _positive(rep.heads["P"])
        dropped += n_bad
        arrays.append(P)
        box(label, P, "trained", "trained P", "crimson")
        if "P_scrambled_median" in rep.heads.columns:
            any_null = True
            S, _ = _positive(rep.heads["P_scrambled_median"])
            arrays.append(S)
            box(label, S, "scrambled", "scrambled (each head's median)", "gray")
    t = cmp.threshold
    fig.add_hline(
        y=t,
        line_dash="dot",
        annotation_text=f"threshold P = {t:g}" + ("" if t == PAPER_THRESHOLD else f" (paper: {PAPER_THRESHOLD:g})"),
    )
    paper_lines = [(_PAPER_MEDIAN_TRAINED, "crimson", "paper median trained P")]
    if any_null:
        paper_lines.append((_PAPER_MEDIAN_SCRAMBLED, "gray", "paper median scrambled P"))
        arrays.append(np.array([_PAPER_MEDIAN_SCRAMBLED]))
    for y, color, text in paper_lines:
        fig.add_hline(y=y, line_dash="dot", line_color=color, annotation_text=text, annotation_position="bottom right")
    title = f"P per head across {len(cmp.reports)} models" + (
        " against the orientation-scramble null" if any_null else " (no null: compare with nulls=...)"
    )
    title += f"; closed: P ≥ {t:g}" + paper_threshold_note(t)
    if dropped:
        title += f"; {dropped} heads with undefined or zero P not drawn"
    fig.update_layout(
        title=title,
        boxmode="group",
        xaxis_title="model",
        yaxis_title="P",
        yaxis={"type": "log", "range": log_P_range(*arrays) if arrays else None},
        height=460,
        legend={"orientation": "h", "y": -0.2},
    )
    return fig


def comparison_headline(cmp: Any) -> str:
    """One sentence: how many models, with which options, and the range of closed heads against the paper's."""
    m = cmp.models_table
    o = cmp.options
    pct = m["pct_closed"].to_numpy(dtype=float)
    med = m["median_P"].to_numpy(dtype=float)
    opts = (
        f"threshold {o.threshold:g}, nulls {o.nulls}, seed {o.seed}"
        + (", search" if o.search else "")
        + (", algebra" if o.algebra else "")
    )
    if not len(m):
        return f"No model finished ({opts})."
    text = (
        f"{len(m)} models measured with the same options ({opts}): heads with P ≥ {o.threshold:g} range "
        f"{np.nanmin(pct):.2f}–{np.nanmax(pct):.2f} % per model (paper, at P ≥ {PAPER_THRESHOLD:g}: "
        f"{100 * PAPER['frac_closed'][0]:.2f}–{100 * PAPER['frac_closed'][1]:.2f} %"
        + ("" if o.threshold == PAPER_THRESHOLD else f"; not comparable at threshold {o.threshold:g}")
        + "); median P "
        f"{np.nanmin(med):.3g}–{np.nanmax(med):.3g} (paper: 0.336 over 7,304 heads)."
    )
    if o.nulls:
        scr = m["median_P_scrambled"].to_numpy(dtype=float)
        beats = m["pct_beats_scramble"].to_numpy(dtype=float)
        text += (
            f" Median scrambled P {np.nanmin(scr):.3g}–{np.nanmax(scr):.3g} (paper: 1.04e-4); heads beating their "
            f"scramble median {np.nanmin(beats):.2f}–{np.nanmax(beats):.2f} % (paper: 98.64 %)."
        )
    return text


_TEMPLATE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{{ title }}</title>
<style>
body { font-family: system-ui, sans-serif; margin: 1.5em auto; max-width: 1400px; padding: 0 1em; color: #222; }
h2 { border-bottom: 1px solid #ccc; margin-top: 1.6em; }
p.headline { font-size: 1.1em; line-height: 1.45; background: #f3f6fa; border-left: 4px solid #3b6fb6;
  padding: 0.7em 1em; }
ul.warnings li { color: #8a1c1c; margin: 0.3em 0; }
table.tli { border-collapse: collapse; font-size: 0.92em; }
table.tli th, table.tli td { border-bottom: 1px solid #ddd; padding: 0.25em 0.7em; text-align: left; }
p.note { color: #555; font-size: 0.92em; }
</style>
{{ datatables_init | safe }}
</head>
<body>
<h1>{{ title }}</h1>
<p class="headline" id="answer"><b>{{ answer }}</b></p>
<p class="headline" id="headline">{{ headline }}</p>
{% if warnings %}<h2 id="warnings">Warnings</h2>
<ul class="warnings">{% for w in warnings %}<li>{{ w }}</li>{% endfor %}</ul>{% endif %}
<h2 id="table">The models next to the paper</h2>
<p class="note">One row per model; the last two rows are the paper's figures (arXiv 2609.01129): where the paper
gives a per-model range (3.98–8.00 % of heads closed) they hold its ends, elsewhere both hold its single figure.
The paper counts a head closed at P ≥ {{ paper_threshold }}; the models here at P ≥ {{ threshold }}.
pct_* columns are percentages; NaN / &lt;NA&gt;: not run with these options. The headline columns
(<code>Comparison.overview</code>) first; every column below.</p>
{{ overview | safe }}
<details id="full-table"><summary>Every column ({{ n_columns }}, <code>Comparison.table</code>)</summary>
{{ table | safe }}
</details>
<h2 id="figure">P against the scramble null</h2>
<div class="figure">{{ figure | safe }}</div>
<h2 id="closed">Closed heads of every model ({{ n_closed }})</h2>
{{ closed | safe }}
<h2 id="options">Options (the same for every model)</h2>
<table class="tli">{% for k, v in options %}<tr><th>{{ k }}</th><td>{{ v }}</td></tr>{% endfor %}</table>
<p class="note">Every per-head row of every model is in <code>Comparison.heads</code>; each model's full report in
<code>Comparison.reports</code>.</p>
</body>
</html>
"""


def comparison_html(cmp: Any) -> str:
    """The standalone comparison page as a string (plotly.js and DataTables inlined; no remote scripts)."""
    import jinja2

    fig = comparison_figure(cmp).to_html(full_html=False, include_plotlyjs=True)
    h = cmp.heads
    closed = h[h["closed"].astype(bool)] if "closed" in h.columns else h.iloc[0:0]
    cols = [c for c in ("model", "head_label", *CLOSED_HEAD_COLUMNS, "P_searched") if c in closed.columns]
    if len(closed):
        closed = closed[cols].sort_values(["model", "P"], ascending=[True, False], kind="stable")
    env = jinja2.Environment(autoescape=jinja2.select_autoescape(default=True))
    return env.from_string(_TEMPLATE).render(
        title=f"Comparison of {len(cmp.reports)} models",
        threshold=f"{cmp.threshold:g}",
        paper_threshold=f"{PAPER_THRESHOLD:g}",
        answer=str(cmp.headline),
        headline=comparison_headline(cmp),
        overview=datatable_html(display_frame(cmp.overview, cmp.threshold)),
        n_columns=len(cmp.table.columns),
        warnings=list(cmp.warnings),
        table=datatable_html(display_frame(cmp.table, cmp.threshold)),
        figure=fig,
        closed=(
            datatable_html(display_frame(closed.rename(columns={"P_searched": "searched P"}), cmp.threshold))
            if len(closed)
            else "<p>No head is closed in any model.</p>"
        ),
        n_closed=len(closed),
        options=[(k, str(v)) for k, v in cmp.options.as_dict().items()],
        datatables_init=datatables_init_html(),
    )
