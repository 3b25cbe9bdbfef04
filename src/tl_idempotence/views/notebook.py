"""Notebook displays (``_repr_html_``) of result objects: a few lines that say what the result is.

* :func:`result_html` — any result: its class, its headline numbers and the first rows of
  its ``heads`` table.
* a report: the headline sentence, the closed heads and a small colour-table heatmap of
  P (plain HTML and inline CSS, so it shows in a static render of a notebook, offline).
"""

from __future__ import annotations

import html
import math
from typing import Any

import numpy as np
import pandas as pd

from .text import format_P, headline

__all__ = ["mini_heatmap", "result_html"]


def _value(v: Any) -> str | None:
    if isinstance(v, bool) or v is None or isinstance(v, (int, str)):
        return str(v)
    if isinstance(v, float):
        return "NaN" if math.isnan(v) else f"{v:.4g}"
    if isinstance(v, np.generic):
        return _value(v.item())
    return None


def _summary_table(summary: dict[str, Any], limit: int = 14) -> str:
    values = [(k, _value(v)) for k, v in summary.items()]
    rows = [(k, v) for k, v in values if v is not None][:limit]
    return pd.DataFrame(rows, columns=["", "value"]).to_html(index=False, border=0)


def mini_heatmap(rep: Any, value: str = "P") -> str:
    """A small layer x head table coloured by ``value`` (Viridis, [0, 1] for P), closed heads outlined."""
    from plotly.colors import sample_colorscale

    piv = rep.heads.pivot(index="layer", columns="head", values=value)
    closed = rep.heads.pivot(index="layer", columns="head", values="closed")
    z = piv.to_numpy(dtype=float)
    lo, hi = (0.0, 1.0) if value == "P" else (float(np.nanmin(z)), float(np.nanmax(z)))
    cells = []
    for i, layer in enumerate(piv.index):
        tds = []
        for j, head in enumerate(piv.columns):
            v = z[i, j]
            if not np.isfinite(v):
                color = "#ddd"
            else:
                color = sample_colorscale("Viridis", [min(max((v - lo) / ((hi - lo) or 1.0), 0.0), 1.0)])[0]
            ring = "outline:2px solid #e8175d;outline-offset:-2px;" if bool(closed.iloc[i, j]) else ""
            title = f"L{layer}H{head}: {value} = {format_P(v, rep.threshold) if value == 'P' else f'{v:.4g}'}"
            tds.append(
                f'<td title="{html.escape(title)}" '
                f'style="background:{color};{ring}width:12px;height:9px;padding:0"></td>'
            )
        cells.append(f'<tr><th style="font-size:9px;padding:0 3px">{layer}</th>{"".join(tds)}</tr>')
    return (
        '<table style="border-collapse:collapse;margin:4px 0">' + "".join(cells) + "</table>"
        f'<div style="font-size:11px;color:#555">{value} per layer (rows) x head (columns), Viridis [{lo:g}, {hi:g}];'
        " ringed: closed heads. Hover a cell for its value.</div>"
    )


def _report_html(rep: Any) -> str:
    from .page import closed_heads_table

    table = closed_heads_table(rep, limit=20).to_html(index=False, border=0)
    n = int(rep.summary["n_closed"])
    more = f"<div style='font-size:11px'>({n - 20} more in <code>rep.closed_heads</code>)</div>" if n > 20 else ""
    title = f"Near-idempotent heads ({n}), by P" if n else "No head is closed; the highest P"
    return (
        f"<div><b>IdempotenceReport</b><p>{html.escape(headline(rep.summary, rep.threshold))}</p>"
        f"<details open><summary>{title}</summary>{table}{more}</details>"
        f"<details><summary>P over layer x head</summary>{mini_heatmap(rep)}</details></div>"
    )


def result_html(obj: Any) -> str:
    """The notebook display of a result object (reports get their own, see the module docstring)."""
    from ..report.report import IdempotenceReport

    if isinstance(obj, IdempotenceReport):
        return _report_html(obj)
    name = type(obj).__name__
    try:
        summary = obj.summary
    except Exception as e:  # noqa: BLE001 - a display must not raise
        return f"<b>{html.escape(name)}</b> (summary unavailable: {html.escape(type(e).__name__)})"
    out = f"<div><b>{html.escape(name)}</b>{_summary_table(summary)}"
    heads = getattr(obj, "heads", None)
    if isinstance(heads, pd.DataFrame) and len(heads):
        out += (
            f"<details><summary>heads ({len(heads)} rows; first 10)</summary>"
            f"{heads.head(10).to_html(border=0, float_format=lambda v: f'{v:.4g}')}</details>"
        )
    return out + "</div>"
