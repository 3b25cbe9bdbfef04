"""Notebook displays of result objects and of plotly figures, online and in static renders, offline.

* :func:`result_html` — the ``_repr_html_`` of any result, chosen by its class's ``display_kind`` in one registry
  (:data:`DISPLAYS`, :func:`register_display`): by default its class, its headline numbers and
  the first rows of its ``heads`` table; a report shows its headline sentence, the closed
  heads and a small colour-table heatmap of P; a comparison its headline sentence (which model has
  the largest share of closed heads) and its overview table (plain HTML and inline CSS, so it shows
  in a static render of a notebook, offline).
* :func:`figure_bundle` — one figure's notebook output, renderable anywhere, offline: the plotly JSON
  mimetype (JupyterLab, VS Code) and an HTML ``<div>`` with its drawing script (static renders: nbconvert,
  a notebook on a website), plotly.js embedded once per kernel, in the first output that needs it. Every
  figure the library returns displays itself this way (:mod:`.exportable`), with no call needed.
* :func:`use_offline_plotly` — the same for every *other* plotly figure of the kernel (the user's own):
  makes it plotly's default renderer. Plotly's own ``"notebook"`` renderer embeds plotly.js too but adds a
  MathJax ``<script>`` from a CDN to every figure; the default renderer in JupyterLab writes only the JSON
  mimetype, which static renders cannot draw — figures come out blank.
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping
from functools import cache
from typing import Any

import numpy as np
import pandas as pd

from ..core.readings import copying_by_sign, copying_sign_sentence
from ..core.results import DISPLAYS, register_display
from .population import mechanism_comparison_html
from .text import format_P, format_sig, headline

__all__ = [
    "DISPLAYS",
    "OFFLINE_RENDERER",
    "PLOTLYJS_EMBEDDED",
    "figure_bundle",
    "generic_html",
    "mini_heatmap",
    "plotlyjs_html",
    "register_display",
    "result_html",
    "use_offline_plotly",
]

#: Name under which :func:`use_offline_plotly` registers its renderer in ``plotly.io.renderers``.
OFFLINE_RENDERER = "tli_offline"

#: Set once an output of this process (one kernel) has embedded plotly.js: later outputs reuse it.
PLOTLYJS_EMBEDDED = {"done": False}


def plotlyjs_html() -> str:
    """plotly.js inline in a ``<script>`` (from the installed plotly package; no CDN)."""
    from plotly.offline import get_plotlyjs

    return (
        "<!-- plotly.js, embedded by tl_idempotence (offline figures) -->"
        '<script type="text/javascript">window.PlotlyConfig = {MathJaxConfig: "local"};</script>'
        f'<script charset="utf-8" type="text/javascript">{get_plotlyjs()}</script>'
    )


def figure_bundle(
    fig_dict: dict[str, Any], config: dict[str, Any] | None = None, embed: bool = False
) -> dict[str, Any]:
    """One figure's notebook output: plotly's JSON mimetype (JupyterLab, VS Code) and an HTML ``<div>`` with its
    drawing script (static renders), with plotly.js in front when ``embed``."""
    from plotly.io import to_html
    from plotly.io.base_renderers import PlotlyRenderer

    div = to_html(
        fig_dict,
        config=config or {},
        include_plotlyjs=False,
        include_mathjax=False,
        full_html=False,
        default_width="100%",
        default_height=525,
        validate=False,
    )
    bundle = dict(PlotlyRenderer(config=config or {}).to_mimebundle(dict(fig_dict)))
    bundle["text/html"] = (plotlyjs_html() if embed else "") + div
    return bundle


@cache
def _offline_renderer_class() -> type:
    """The renderer class (built on first use, so that importing this module does not import plotly)."""
    from plotly.io.base_renderers import MimetypeRenderer

    class OfflineNotebookRenderer(MimetypeRenderer):
        """plotly.js embedded once (on activation); per figure the plotly mimetype plus an HTML div."""

        def __init__(self, config: dict[str, Any] | None = None) -> None:
            self.config = dict(config or {})

        def activate(self) -> None:
            try:
                from IPython import get_ipython
                from IPython.display import HTML, display
            except ImportError:  # pragma: no cover - plotly calls this only under IPython
                return
            if get_ipython() is None or PLOTLYJS_EMBEDDED["done"]:
                return
            display(HTML(plotlyjs_html()))
            PLOTLYJS_EMBEDDED["done"] = True

        def to_mimebundle(self, fig_dict: dict[str, Any]) -> dict[str, Any]:
            return figure_bundle(fig_dict, self.config)

    return OfflineNotebookRenderer


def use_offline_plotly() -> str:
    """Show the user's own plotly figures so that they also render offline in static HTML (module docstring;
    the library's figures do without it).

    Call it once, near the top of a notebook::

        from tl_idempotence.views import use_offline_plotly
        use_offline_plotly()

    It registers a renderer named :data:`OFFLINE_RENDERER` and makes it plotly's default
    (``plotly.io.renderers.default``); plotly.js (~5 MB) is embedded once per kernel, in the first
    output that needs it (shared with the library's own figures). Outside IPython it only sets the default.

    Returns:
        The renderer's name.
    """
    import plotly.io as pio

    if OFFLINE_RENDERER not in pio.renderers:
        pio.renderers[OFFLINE_RENDERER] = _offline_renderer_class()()
    pio.renderers.default = OFFLINE_RENDERER
    return OFFLINE_RENDERER


def _value(v: Any) -> str | None:
    if isinstance(v, bool) or v is None or isinstance(v, (int, str)):
        return str(v)
    if isinstance(v, float):
        return "NaN" if math.isnan(v) else f"{v:.4g}"
    if isinstance(v, np.generic):
        return _value(v.item())
    return None


def _summary_table(summary: Mapping[str, Any], limit: int = 14) -> str:
    values = [(k, _value(v)) for k, v in summary.items()]
    rows = [(k, v) for k, v in values if v is not None][:limit]
    return pd.DataFrame(rows, columns=["", "value"]).to_html(index=False, border=0)


def mini_heatmap(rep: Any, value: str = "P") -> str:
    """A small layer x head table coloured by ``value`` (Viridis, [0, 1] for P), closed heads outlined."""
    from plotly.colors import sample_colorscale

    from ..errors import OptionError

    numeric = [c for c in rep.heads.columns if rep.heads[c].dtype.kind in "iuf" and c not in ("layer", "head")]
    if not isinstance(value, str) or value not in numeric:
        raise OptionError(f"value={value!r} is not a numeric column of the report's heads table; columns: {numeric}.")
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
    head_row = "".join(f'<th style="font-size:8px;padding:0;font-weight:normal">{h}</th>' for h in piv.columns)
    return (
        '<table style="border-collapse:collapse;margin:4px 0">'
        f'<tr><th style="font-size:8px;padding:0 3px;font-weight:normal">L\\H</th>{head_row}</tr>'
        + "".join(cells)
        + "</table>"
        f'<div style="font-size:11px;color:#555">{value} per layer (rows) x head (columns), Viridis [{lo:g}, {hi:g}];'
        " ringed: closed heads. Hover a cell for its value.</div>"
    )


def _report_html(rep: Any) -> str:
    from .page import closed_heads_table, p_value_note

    table = closed_heads_table(rep, limit=20).to_html(index=False, border=0)
    n = int(rep.summary.closure.n_closed)
    more = f"<div style='font-size:11px'>({n - 20} more in <code>rep.closed_heads</code>)</div>" if n > 20 else ""
    title = f"Near-idempotent heads ({n}), by P" if n else "No head is closed; the highest P"
    note = p_value_note(rep)  # what the p- and q-values test, their floor, and the effect size beside them
    note_html = f"<div style='font-size:11px'>{html.escape(note)}</div>" if note else ""
    return (
        f"<div><b>IdempotenceReport</b><p>{html.escape(headline(rep.summary, rep.threshold))}</p>"
        f"<details open><summary>{title}</summary>{table}{more}{note_html}</details>"
        f"<details open><summary>P over layer x head</summary>{mini_heatmap(rep)}</details></div>"
    )


def _frame_html(df: pd.DataFrame, threshold: float | None) -> str:
    """A small DataFrame as HTML, floats with 4 significant digits never rounded across ``threshold``."""
    out = df.copy()
    for col in out.columns:
        if out[col].dtype.kind == "f":
            out[col] = out[col].map(lambda v: format_sig(v, threshold, sig=4))
    return str(out.to_html(border=0))


def _nats(v: Any) -> str:
    return "NaN" if not isinstance(v, (int, float)) or math.isnan(float(v)) else f"{float(v):.3g}"


def _ci(s: dict[str, Any], low: str, high: str) -> str:
    """``"95 % CI a to b"``, or what replaces it when the interval is NaN (the summary's note says why)."""
    a, b = s.get(low), s.get(high)
    if not isinstance(a, (int, float)) or not isinstance(b, (int, float)) or math.isnan(a) or math.isnan(b):
        return "no 95 % interval, see the note"
    return f"95 % CI {_nats(a)} to {_nats(b)}"


def _ablation_headline(summary: dict[str, Any]) -> str:
    """One sentence for an :class:`~tl_idempotence.probes.ablation.Ablation`: the flagged set's Δ loss with its
    interval, the matched controls, and the p-value with its floor (numbers from ``summary`` only)."""
    s = summary
    n_c = int(s.get("n_controls", 0) or 0)
    out = (
        f"Ablating the {s.get('n_heads', '?')} flagged heads ({s.get('kind', '?')} at hook_z) changes the next-token "
        f"loss by Δ = {_nats(s.get('delta_loss'))} nats/token ({_ci(s, 'delta_loss_ci_low', 'delta_loss_ci_high')}; "
        f"{s.get('n_tokens', '?')} tokens, clean loss "
        f"{_nats(s.get('loss_clean'))})."
    )
    if n_c:
        at_least = int(s.get("n_controls_at_least", 0) or 0)
        sets = f"all {n_c} distinct matched sets" if s.get("controls_exhaustive") else f"{n_c} matched random sets"
        out += (
            f" {sets}: median Δ {_nats(s.get('control_delta_median'))}, 95th percentile "
            f"{_nats(s.get('control_delta_q95'))}; {at_least} of {n_c} reach the flagged Δ, so p = "
            f"{_nats(s.get('p_value'))} (the smallest possible with {n_c} sets: {_nats(s.get('p_value_floor'))}). "
            f"Excess over the control median {_nats(s.get('excess_over_controls'))} nats/token "
            f"({_ci(s, 'excess_ci_low', 'excess_ci_high')})."
        )
        if s.get("controls_warning"):
            out += f" Warning: {s['controls_warning']}."
    else:
        out += " No control set was drawn (n_controls=0): no p-value."
    return out


#: The summary entries an ablation's display shows first, in this order.
_ABLATION_LEAD = (
    "delta_loss",
    "control_delta_median",
    "p_value",
    "p_value_floor",
    "n_controls",
    "n_distinct_controls",
    "n_controls_at_least",
    "excess_over_controls",
    "excess_ci_low",
    "excess_ci_high",
    "delta_loss_ci_low",
    "delta_loss_ci_high",
    "loss_clean",
    "n_tokens",
    "kind",
)


def _ablation_html(ab: Any) -> str:
    s = ab.summary
    lead = {k: s[k] for k in _ABLATION_LEAD if k in s}
    out = f"<div><b>Ablation</b><p>{html.escape(_ablation_headline(s))}</p>{_summary_table(lead, limit=len(lead))}"
    if s.get("note"):
        out += f"<div style='font-size:11px'>Note: {html.escape(str(s['note']))}</div>"
    ctrl = getattr(ab, "controls", None)
    if isinstance(ctrl, pd.DataFrame) and len(ctrl):
        top = ctrl.sort_values("delta_loss", ascending=False, kind="stable").head(10)
        out += (
            f"<details><summary>control sets ({len(ctrl)}, largest Δ first"
            f"{'; the first 10' if len(ctrl) > 10 else ''})</summary>{_frame_html(top.set_index('control'), None)}"
            "</details>"
        )
    heads = getattr(ab, "heads", None)
    if isinstance(heads, pd.DataFrame) and len(heads):
        out += f"<details><summary>flagged heads ({len(heads)})</summary>{_frame_html(heads.head(20), None)}</details>"
    return out + "</div>"


#: The summary entries a mechanism result's display shows first, in this order.
_MECHANISM_LEAD = (
    "n_heads", "n_closed", "n_sign_tested", "n_agree", "sign_test_p", "n_spearman", "spearman_rho", "spearman_p",
    "p_floor", "tied", "n_closed_own_sign_alpha", "median_abs_copying_closed", "seed",
)  # fmt: skip


def _mechanism_html(mech: Any) -> str:
    """``rep.mechanism(...)``: the headline sentence, its leading numbers, the closed heads' rows (by P), the
    signed columns by sign, and every head folded (rows of the result's table, never recomputed)."""
    s = mech.summary
    lead = {k: s[k] for k in _MECHANISM_LEAD if k in s}
    out = f"<div><b>{html.escape(type(mech).__name__)}</b><p>{html.escape(str(mech.headline))}</p>"
    out += _summary_table(lead, limit=len(lead))
    if s.get("notes"):
        out += f"<div style='font-size:11px'>Note: {html.escape(str(s['notes']))}</div>"
    t = mech.table
    t_ = float(s["threshold"]) if isinstance(s.get("threshold"), float) else None
    cols = [c for c in ("P", "alpha", "effect_median", "effect_q", "self_rank_median", "copying", "copying_own",
                        "sign_agrees") if c in t.columns]  # fmt: skip
    closed = t[t["closed"]].sort_values("P", ascending=False, kind="stable")
    out += (
        f"<details open><summary>closed heads ({len(closed)}{'; the first 20' if len(closed) > 20 else ''})</summary>"
        f"{_frame_html(closed[cols].head(20), t_) if len(closed) else '<p>none</p>'}</details>"
    )
    out += f"<details><summary>signed scores by sign</summary>{_frame_html(mech.signs, None)}</details>"
    out += f"<details><summary>every head ({len(t)}; the first 50)</summary>{_frame_html(t.head(50), t_)}</details>"
    return out + "</div>"


def _comparison_html(cmp: Any) -> str:
    """A comparison (or sweep): the headline sentence, its warnings, the overview table; the summary and the
    heads folded (the summary open when items failed or are missing)."""
    name = type(cmp).__name__
    t = float(cmp.threshold)
    out = f"<div><b>{html.escape(name)}</b><p>{html.escape(str(cmp.headline))}</p>"
    if cmp.warnings:
        out += "<ul>" + "".join(f"<li>{html.escape(w)}</li>" for w in cmp.warnings) + "</ul>"
    ov = cmp.overview
    if len(ov):
        out += (
            f"<details open><summary>models ({len(ov.columns)} of {len(cmp.table.columns)} columns; every column in "
            f"<code>.table</code>)</summary>{_frame_html(ov.set_index('model'), t)}</details>"
        )
    s = cmp.summary
    trouble = bool(s.get("n_failed") or s.get("n_missing"))
    out += f"<details{' open' if trouble else ''}><summary>summary</summary>{_summary_table(s, limit=len(s))}</details>"
    heads = cmp.heads
    if isinstance(heads, pd.DataFrame) and len(heads) and "P" in heads.columns:
        first = heads.sort_values("P", ascending=False, kind="stable").head(10)
        out += (
            f"<details><summary>heads ({len(heads)} rows of every model, highest P first; the first 10)</summary>"
            f"{_frame_html(first, t)}</details>"
        )
    return out + "</div>"


def _association_by_sign(assoc: pd.DataFrame, table: Any) -> tuple[pd.DataFrame, str]:
    """The association table as shown: the signed ``copying`` row without its medians of a mixed set (blank), and
    the sentence that replaces them (closed and other heads by sign, with the sign agreement with α)."""
    if "copying" not in assoc.index or not isinstance(table, pd.DataFrame) or "copying" not in table.columns:
        return assoc, ""
    shown = assoc.copy()
    if "frac_sign_agrees_alpha" in shown.columns:  # first, where a 1280 px screen shows it (it was the last column)
        shown = shown[["frac_sign_agrees_alpha", *(c for c in shown.columns if c != "frac_sign_agrees_alpha")]]
    for col in ("median_closed", "median_other"):
        if col in shown.columns:
            shown[col] = [format_sig(v, None, sig=4) for v in shown[col]]
            shown.loc["copying", col] = "by sign, below"
    closed = table["closed"].to_numpy(dtype=bool)
    c, o = table[closed], table[~closed]
    text = (
        "copying is signed (+ copies, − suppresses), so it is shown by sign, never as a median of a mixed set: "
        + copying_sign_sentence(copying_by_sign(c["copying"], c["alpha"]))
        + "; "
        + copying_sign_sentence(copying_by_sign(o["copying"]), who="other heads")
    )
    return shown, text


for _kind, _draw in (
    ("report", _report_html),
    ("ablation", _ablation_html),
    ("comparison", _comparison_html),
    ("mechanism", _mechanism_html),
    ("mechanism_comparison", mechanism_comparison_html),
):
    register_display(_kind, _draw)
del _kind, _draw


def result_html(obj: Any) -> str:
    """The notebook display of a result object: the display its class's ``display_kind`` names in the one registry
    (:data:`~tl_idempotence.core.results.DISPLAYS`: the report, a comparison, an ablation and a mechanism result
    registered here, a joined probe's own by its declaration, ``report/joins.py``), else the generic one below.

    The generic display: its class name, its headline sentence (when it has one), its scalar summary numbers, its
    ``checkpoints`` table when it has one (a trajectory), its ``association`` (``rep.roles``), and its ``heads``
    rows (the 10 with the highest P when there is a P column). Plain HTML, no script: it shows in static renders too.
    """
    kind = getattr(type(obj), "display_kind", "result")  # Result.display_kind: the class says which display
    draw = DISPLAYS.get(kind) if isinstance(kind, str) else None
    if draw is not None:
        return str(draw(obj))
    return generic_html(obj)


def generic_html(obj: Any) -> str:
    """The generic notebook display of a result (what :func:`result_html` draws for a ``display_kind`` without a
    registered display)."""
    name = type(obj).__name__
    try:
        summary = obj.summary
    except Exception as e:  # noqa: BLE001 - a display must not raise
        return f"<b>{html.escape(name)}</b> (summary unavailable: {html.escape(type(e).__name__)})"
    t = summary.get("threshold") if isinstance(summary, Mapping) else None
    t = float(t) if isinstance(t, (int, float)) and not isinstance(t, bool) else None
    out = f"<div><b>{html.escape(name)}</b>"
    try:  # roles, circuit: the sentence first (what was asked, the answer, the number)
        lead = getattr(obj, "headline", None)
    except Exception:  # noqa: BLE001 - a display must not raise
        lead = None
    if isinstance(lead, str):
        out += f"<p>{html.escape(lead)}</p>"
    out += _summary_table(summary)
    ck = getattr(obj, "checkpoints", None)
    if isinstance(ck, pd.DataFrame) and len(ck):
        out += (
            f"<details><summary>checkpoints ({len(ck)} rows{'; first 20' if len(ck) > 20 else ''})</summary>"
            f"{_frame_html(ck.head(20), t)}</details>"
        )
    assoc = getattr(obj, "association", None)  # rep.roles(...): one row per role
    if isinstance(assoc, pd.DataFrame) and len(assoc):
        shown, signed = _association_by_sign(assoc, getattr(obj, "table", None))
        out += (
            "<details open><summary>association with closure (one row per role)</summary>"
            f"{_frame_html(shown, None)}" + (f"<p><i>{html.escape(signed)}.</i></p>" if signed else "") + "</details>"
        )
    heads = getattr(obj, "heads", None)
    if isinstance(heads, pd.DataFrame) and len(heads):
        by_P = "P" in heads.columns and heads["P"].dtype.kind == "f"
        first = heads.sort_values("P", ascending=False, kind="stable") if by_P else heads
        what = ("highest P first" if by_P else "in order") + ("; the first 10" if len(heads) > 10 else "")
        out += (
            f"<details><summary>heads ({len(heads)} rows, {what})</summary>{_frame_html(first.head(10), t)}</details>"
        )
    return out + "</div>"
