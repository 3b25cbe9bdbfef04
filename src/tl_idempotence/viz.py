"""Views: plotly figures and the standalone offline HTML report (no CDN).

Figures are built with plotly; the page is assembled with jinja2 from the template
``data/report.html.j2``; sortable tables are itables' DataTables in offline mode
(its JS/CSS bundle inlined). plotly.js is embedded once (``include_plotlyjs=True``),
so the file renders with no network.
"""

from __future__ import annotations

import html
import json
from importlib import resources
from typing import TYPE_CHECKING, Any

import numpy as np
import plotly.graph_objects as go

if TYPE_CHECKING:  # pragma: no cover
    from .report import IdempotenceReport

__all__ = ["heads_heatmap", "report_html"]


def heads_heatmap(rep: "IdempotenceReport", value: str = "P") -> go.Figure:
    """Heatmap of ``value`` over layer (y) x head (x); hover: alpha, P, norm, kv head, ranks.

    Args:
        rep: an :class:`~tl_idempotence.report.IdempotenceReport`.
        value: a numeric column of ``rep.heads`` (default ``"P"``).

    Raises:
        KeyError: ``value`` is not a column of ``rep.heads``.
    """
    df = rep.heads
    if value not in df.columns:
        raise KeyError(f"{value!r} is not a column of report.heads; columns: {list(df.columns)}")
    piv = df.pivot(index="layer", columns="head", values=value)
    custom_cols = ["alpha", "P", "norm", "kv_head", "rank_O", "rank_V"]
    custom = np.stack([df.pivot(index="layer", columns="head", values=c).to_numpy(dtype=float) for c in custom_cols], -1)
    zmin, zmax = (0.0, 1.0) if value == "P" else (None, None)
    fig = go.Figure(
        go.Heatmap(
            z=piv.to_numpy(dtype=float),
            x=list(piv.columns),
            y=list(piv.index),
            zmin=zmin,
            zmax=zmax,
            colorscale="Viridis",
            colorbar={"title": value},
            customdata=custom,
            hovertemplate=(
                "layer %{y}, head %{x}<br>P = %{customdata[1]:.4f}<br>alpha = %{customdata[0]:.4g}"
                "<br>||T||_F = %{customdata[2]:.4g}<br>kv head %{customdata[3]}"
                "<br>rank O/V = %{customdata[4]}/%{customdata[5]}<extra></extra>"
            ),
        )
    )
    s = rep.summary
    fig.update_layout(
        title=f"{value} per head: {s['model_name']} ({s['n_closed']}/{s['n_heads']} heads with P >= {rep.threshold})",
        xaxis_title="head",
        yaxis_title="layer",
        yaxis={"autorange": "reversed"},
        height=max(350, 22 * len(piv.index) + 150),
    )
    return fig


def _fig_div(fig: go.Figure, first: bool) -> str:
    return fig.to_html(full_html=False, include_plotlyjs=True if first else False)


def report_html(rep: "IdempotenceReport", extra_figures: list[go.Figure] | None = None, extra_html: list[str] | None = None) -> str:
    """The standalone report page as a string (plotly.js inlined once; no remote scripts)."""
    import jinja2

    figs = [heads_heatmap(rep)]
    figs += _report_figures(rep)
    figs += list(extra_figures or [])
    divs = [_fig_div(f, i == 0) for i, f in enumerate(figs)]
    template = resources.files("tl_idempotence").joinpath("data/report.html.j2").read_text(encoding="utf-8")
    env = jinja2.Environment(autoescape=jinja2.select_autoescape(default=True))
    page = env.from_string(template)
    heads = rep.heads.copy()
    for col in heads.columns:
        if heads[col].dtype.kind == "f":
            heads[col] = heads[col].map(lambda v: f"{v:.6g}")
    layers_html = _datatable(rep.layers) if len(rep.layers) else ""
    paper = ""
    if hasattr(rep, "paper_table") and "P_scrambled_median" in rep.heads.columns:
        try:
            paper = rep.paper_table().to_html(index=False, border=0)
        except Exception:  # pragma: no cover - the page should still render
            paper = ""
    return page.render(
        title=f"Idempotence report: {rep.summary['model_name']}",
        summary_json=json.dumps(_jsonable(rep.summary), indent=2),
        figures=divs,
        heads_table=_datatable(heads),
        layers_table=layers_html,
        paper_table=paper,
        extra_html=list(extra_html or []),
        datatables_init=_datatables_init(),
    )


def _datatables_init() -> str:
    """itables' offline init block (DataTables JS/CSS inlined, base64)."""
    import itables
    from itables.javascript import generate_init_offline_itables_html

    bundle = resources.files(itables).joinpath("html/dt_bundle.js")
    return generate_init_offline_itables_html(str(bundle))


def _datatable(df: Any) -> str:
    """A sortable, searchable table (itables, offline mode)."""
    from itables import to_html_datatable

    return to_html_datatable(df, connected=False, display_logo_when_loading=False, showIndex=False, maxBytes=0)


def _report_figures(rep: "IdempotenceReport") -> list[go.Figure]:
    """Figures contributed by the analyses that ran (controls, algebra)."""
    out: list[go.Figure] = []
    if "P_scrambled_median" in rep.heads.columns:
        from .nulls import scramble_figures

        out += scramble_figures(rep)
    if rep.algebra is not None and hasattr(rep.algebra, "figures"):
        out += rep.algebra.figures()
    return out


def _jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (np.floating,)):
        return float(x)
    if isinstance(x, (str, int, float, bool)) or x is None:
        return x
    return html.escape(str(x))
