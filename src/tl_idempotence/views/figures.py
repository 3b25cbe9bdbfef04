"""Every plotly figure of the package, drawn from result objects (never from a model).

* :func:`heads_heatmap` — a numeric head column over layer x head, closed heads marked.
* :func:`scramble_figures` — trained P against the orientation-scramble null (log P up to 1).
* :func:`algebra_summary_figure`, :func:`algebra_figures` — the shared-value algebra.
* :func:`activation_figure` — activation-level returns vs weight-level P.
* :func:`trajectory_figure`, :func:`trajectory_summary_figure` — closure over training.
* :func:`report_figures` — the figures of a report page, in order.

The figures of the probes joined to a report — :func:`roles_figure` (``rep.roles(...)``) and
:func:`mechanism_figure` (``rep.mechanism(...)``) — are drawn in :mod:`.role_figures` and importable from here too.

Log-P axes run from just below the smallest positive value shown to 1 (P is at most 1).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from .role_figures import ROLE_PANELS, mechanism_figure, roles_figure
from .text import format_P_list, plot_text

if TYPE_CHECKING:  # pragma: no cover
    import plotly.graph_objects as go

__all__ = [
    "ROLE_PANELS",
    "activation_figure",
    "algebra_figures",
    "algebra_summary_figure",
    "heads_heatmap",
    "heads_heatmap_spec",
    "log_P_range",
    "mechanism_figure",
    "report_figures",
    "roles_figure",
    "scramble_figures",
    "trajectory_figure",
    "trajectory_summary_figure",
]


def log_P_range(*arrays: Any, floor: float = 1e-8) -> list[float]:
    """The ``range`` of a plotly log axis of P values in (0, 1]: ``[log10 lo, 0]``.

    The axis ends exactly at P = 1 (``log10 1 = 0``; P is at most 1), so the band
    ``P >= threshold`` sits at the top of the plot; it starts a quarter decade (plus a
    margin) below the smallest positive finite value of ``arrays`` (at least ``floor``;
    ``1e-4`` when there is none). Traces drawn on such an axis set ``cliponaxis=False`` so
    a marker at P = 1 is not cut in half.
    """
    vals = np.concatenate([np.asarray(a, dtype=float).ravel() for a in arrays]) if arrays else np.zeros(0)
    vals = vals[np.isfinite(vals) & (vals > 0)]
    lo = max(float(vals.min()), floor) if vals.size else 1e-4
    return [math.floor(math.log10(lo) * 4) / 4 - 0.1, 0.0]


def _threshold_band(fig: Any, threshold: float, x0: float, x1: float, row: int | None = None) -> None:
    """Shade ``threshold <= P <= 1`` and draw the threshold as a legend entry (shapes are in data units
    on log axes, annotations are not, so the label goes to the legend)."""
    import plotly.graph_objects as go

    kw: dict[str, Any] = {} if row is None else {"row": row, "col": 1}
    fig.add_hrect(y0=threshold, y1=1.0, fillcolor="#e8175d", opacity=0.08, line_width=0, layer="below", **kw)
    fig.add_trace(
        go.Scatter(
            x=[x0, x1],
            y=[threshold, threshold],
            mode="lines",
            name=f"P = {threshold:g} (closed above)",
            line={"color": "#e8175d", "width": 1, "dash": "dot"},
            hoverinfo="skip",
            showlegend=row is None or row == 1,
        ),
        **kw,
    )


def heads_heatmap_spec(rep: Any, value: str = "P", height: int | None = None) -> dict[str, Any]:
    """The figure of :func:`heads_heatmap` as a plain plotly figure dict (``{"data": [...], "layout": {...}}``).

    What the report page draws: it renders the dict with ``plotly.io.to_html(..., validate=False)`` and
    the default plotly template, skipping the construction and validation of ``plotly.graph_objects``
    (~0.1 s of the main job); :func:`heads_heatmap` validates the same dict into a ``go.Figure``.
    Arguments and errors as :func:`heads_heatmap`.
    """
    from plotly.colors import get_colorscale

    from ..errors import OptionError

    df = rep.heads
    if value not in df.columns or df[value].dtype.kind not in "biuf":
        raise OptionError(f"{value!r} is not a numeric column of report.heads; columns: {list(df.columns)}")
    piv = df.pivot(index="layer", columns="head", values=value)
    custom_cols = ["alpha", "P", "norm", "kv_head", "rank_O", "rank_V"]
    custom = np.stack(
        [df.pivot(index="layer", columns="head", values=c).to_numpy(dtype=float) for c in custom_cols], -1
    )
    P_piv = df.pivot(index="layer", columns="head", values="P")
    P_text = np.array(format_P_list(P_piv.to_numpy(dtype=float).ravel(), rep.threshold)).reshape(P_piv.shape)
    heat: dict[str, Any] = {
        "type": "heatmap",
        "z": piv.to_numpy(dtype=float),
        "x": [int(h) for h in piv.columns],
        "y": [int(layer) for layer in piv.index],
        "colorscale": get_colorscale("Viridis"),  # as plotly's validation expands the name
        "colorbar": {"title": {"text": value}},
        "customdata": custom,
        "text": P_text.tolist(),
        "hovertemplate": (
            "L%{y}H%{x}<br>P = %{text}<br>alpha = %{customdata[0]:.4g}"
            "<br>||T||_F = %{customdata[2]:.4g}<br>kv head %{customdata[3]}"
            "<br>rank O/V = %{customdata[4]}/%{customdata[5]}<extra></extra>"
        ),
    }
    if value == "P":
        heat.update(zmin=0.0, zmax=1.0)
    data = [heat]
    closed = df[df["closed"]]
    if len(closed):
        data.append(
            {
                "type": "scatter",
                "x": [int(h) for h in closed["head"]],
                "y": [int(layer) for layer in closed["layer"]],
                "mode": "markers",
                "name": f"P >= {rep.threshold:g}",
                "marker": {"symbol": "circle-open", "size": 14, "color": "#e8175d", "line": {"width": 2.5}},
                "text": [
                    f"L{a}H{b}: P = {p}"
                    for a, b, p in zip(closed["layer"], closed["head"], format_P_list(closed["P"], rep.threshold))
                ],
                "hovertemplate": "%{text}<extra>closed</extra>",
                "showlegend": True,
            }
        )
    s = rep.summary
    xaxis: dict[str, Any] = {"title": {"text": "head"}}
    if rep.info.n_heads <= 32:
        xaxis["dtick"] = 1
    layout = {
        "title": {
            "text": f"{value} per head: {plot_text(s.model_name)} ({s.closure.n_closed} of {s.n_heads} heads with "
            f"P >= {rep.threshold:g}, ringed)"
        },
        "xaxis": xaxis,
        "yaxis": {"title": {"text": "layer"}, "autorange": "reversed"},
        "legend": {"orientation": "h", "y": -0.08},
        "height": height or max(350, 22 * len(piv.index) + 170),
    }
    return {"data": data, "layout": layout}


def heads_heatmap(rep: Any, value: str = "P", height: int | None = None) -> go.Figure:
    """Heatmap of ``value`` over layer (y) x head (x); closed heads (P >= threshold) marked with a ring.

    Hover: the head's label (``L10H8``), P, α, ‖T‖, kv head, ranks. The figure is
    :func:`heads_heatmap_spec` validated by ``plotly.graph_objects``.

    Args:
        rep: an :class:`~tl_idempotence.report.report.IdempotenceReport`.
        value: a numeric column of ``rep.heads`` (default ``"P"``; the colour scale is [0, 1] for P).
        height: figure height in px (default: 22 px per layer).

    Raises:
        OptionError: ``value`` is not a numeric column of ``rep.heads``.
    """
    import plotly.graph_objects as go

    return go.Figure(heads_heatmap_spec(rep, value=value, height=height))


def scramble_figures(rep: Any) -> list[go.Figure]:
    """Trained P vs the orientation-scramble null (log P axis ending at P = 1; SPEC 4b).

    1. per head (x = heads in layer order): trained P (closed heads ringed), the scramble
       median and q95, the band ``P >= threshold`` shaded;
    2. per layer: median trained P vs median scrambled P, max mismatch P, feasible P.

    Raises:
        OptionError: the report has no scramble columns (run with ``nulls=True``).
    """
    from ..errors import OptionError

    if "P_scrambled_median" not in rep.heads.columns:
        raise OptionError("This report has no scramble columns: run idempotence_report(model, nulls=True).")
    return [_scramble_per_head(rep), _scramble_per_layer(rep.layers, rep.threshold)]


def _scramble_per_head(rep: Any) -> go.Figure:
    """Figure 1 of :func:`scramble_figures`: per head, trained P against its scramble median and q95."""
    import plotly.graph_objects as go

    h, t = rep.heads, rep.threshold
    label = [f"L{a}H{b}" for a, b in zip(h["layer"], h["head"])]
    x = np.arange(len(h))
    hover = "%{text}<br>%{y:.3g}<extra>%{fullData.name}</extra>"
    f1 = go.Figure()
    for col, name, line in (
        ("P_scrambled_q95", "scrambled q95", {"color": "rgba(150,150,150,0.9)", "width": 1}),
        ("P_scrambled_median", "scrambled median", {"color": "gray", "width": 1.5}),
    ):
        f1.add_trace(go.Scatter(x=x, y=h[col], mode="lines", name=name, line=line, text=label, hovertemplate=hover))
    P_txt = format_P_list(h["P"], t)
    f1.add_trace(
        go.Scatter(
            x=x,
            y=h["P"],
            mode="markers",
            name="trained P",
            marker={"size": 5, "color": "crimson"},
            text=[f"{lab}: P = {p}" for lab, p in zip(label, P_txt)],
            hovertemplate="%{text}<extra></extra>",
            cliponaxis=False,
        )
    )
    closed = h["closed"].to_numpy(dtype=bool)
    if closed.any():
        f1.add_trace(
            go.Scatter(
                x=x[closed],
                y=h["P"][closed],
                mode="markers",
                name=f"closed (P >= {t:g})",
                marker={"symbol": "circle-open", "size": 11, "color": "#e8175d", "line": {"width": 2}},
                hoverinfo="skip",
                cliponaxis=False,
            )
        )
    _threshold_band(f1, t, 0, max(len(h) - 1, 1))
    scramble = rep.summary.scramble
    frac = float("nan") if scramble is None else scramble.frac_beats_scramble
    draws = "" if scramble is None else scramble.n_scramble_draws
    f1.update_layout(
        title=(
            f"Trained P vs orientation scramble per head ({draws} Haar draws): "
            f"{100 * frac:.2f}% of heads beat their scramble median"
        ),
        xaxis_title="head (layer order)",
        yaxis_title="P (log scale, up to 1)",
        yaxis={"type": "log", "range": log_P_range(h["P"], h["P_scrambled_median"], h["P_scrambled_q95"])},
        height=420,
    )
    return f1


#: The per-layer traces of :func:`scramble_figures`' second figure: ``(column, name, mode, marker)``; the last two
#: are drawn when the report has the column (the mismatch control, the search).
_PER_LAYER_TRACES = (
    ("median_P", "median trained P", "lines+markers", None),
    ("median_P_scrambled", "median scrambled P", "lines+markers", None),
    ("mismatch_P_max", "max mismatch P", "markers", {"symbol": "x"}),
    ("feasible_P", "feasible P (search)", "markers", {"symbol": "triangle-up"}),
)


def _scramble_per_layer(L: pd.DataFrame, t: float) -> go.Figure:
    """Figure 2 of :func:`scramble_figures`: per layer, median trained P against median scrambled P, with the
    layer's max mismatch P and feasible P when they were measured."""
    import plotly.graph_objects as go

    f2 = go.Figure()
    arrays = []
    for col, name, mode, marker in _PER_LAYER_TRACES:
        if col in ("median_P", "median_P_scrambled") or col in L.columns:
            f2.add_trace(go.Scatter(x=L["layer"], y=L[col], mode=mode, name=name, marker=marker, cliponaxis=False))
            arrays.append(L[col])
    layer_x = L["layer"].to_numpy(dtype=float)
    _threshold_band(f2, t, float(layer_x.min()) if layer_x.size else 0.0, float(layer_x.max()) if layer_x.size else 1.0)
    f2.update_layout(
        title="Per layer: trained vs scrambled median P",
        xaxis_title="layer",
        yaxis_title="P (log scale, up to 1)",
        yaxis={"type": "log", "range": log_P_range(*arrays)},
        height=380,
    )
    return f2


def algebra_summary_figure(alg: Any) -> go.Figure:
    """Per layer and kv group: median off-diagonal P_ij and median α spread (SPEC 7) — one compact figure."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    g = alg.groups
    fig = make_subplots(
        rows=1, cols=2, subplot_titles=("median off-diagonal P_ij (law: 1)", "median alpha spread over i (law: 0)")
    )
    from plotly.colors import qualitative

    for i, (k, d) in enumerate(g.groupby("kv_head")):
        line = {"color": qualitative.Plotly[i % len(qualitative.Plotly)]}  # one colour per group in both panels
        for col, y, showlegend in ((1, "median_P_offdiag", None), (2, "median_alpha_spread", False)):
            trace = go.Scatter(
                x=d["layer"],
                y=d[y],
                mode="lines+markers",
                name=f"kv group {k}",
                legendgroup=str(k),
                showlegend=showlegend,  # the legend once per group (None: plotly's default)
                line=line,
            )
            fig.add_trace(trace, row=1, col=col)
    fig.update_yaxes(range=[0, 1.02], row=1, col=1)
    fig.update_xaxes(title_text="layer")
    fig.update_layout(title="Shared-value algebra T_i T_j ≈ α_j T_i, per layer and kv group", height=380)
    return fig


def algebra_figures(alg: Any, layers: list[int] | None = None) -> list[go.Figure]:
    """One plotly figure per layer: α_ij (top row) and P_ij (bottom row) per kv group.

    Rows of each matrix are the left factor ``i``, columns the right factor ``j``; the
    right-action law predicts constant columns of α_ij and P_ij ≈ 1. α_ij uses a diverging
    colour scale centred at 0 (α can be negative). Empty when there is no value sharing.
    """
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    figs = []
    for layer in alg.layers:
        if layers is not None and layer not in layers:
            continue
        mats = alg.matrices(layer)
        ks = sorted(mats)
        titles = [f"alpha_ij, kv {k}" for k in ks] + [f"P_ij, kv {k}" for k in ks]
        fig = make_subplots(rows=2, cols=len(ks), subplot_titles=titles, horizontal_spacing=0.04, vertical_spacing=0.12)
        amax = max(float(np.nanmax(np.abs(m[1]))) if np.isfinite(m[1]).any() else 1.0 for m in mats.values()) or 1.0
        for c, k in enumerate(ks, start=1):
            heads, A, P = mats[k]
            labels = [str(h) for h in heads]
            for row, z, axis, value in (
                (1, A, "coloraxis", "alpha_ij=%{z:.4g}"),
                (2, P, "coloraxis2", "P_ij=%{z:.4f}"),
            ):
                hover = f"i=%{{y}}, j=%{{x}}<br>{value}<extra></extra>"
                fig.add_trace(go.Heatmap(z=z, x=labels, y=labels, coloraxis=axis, hovertemplate=hover), row=row, col=c)
            for row in (1, 2):
                fig.update_yaxes(autorange="reversed", row=row, col=c)
        fig.update_layout(
            title=f"Shared-value algebra, layer {layer}: rows i (left factor), columns j (right factor)",
            coloraxis={
                "colorscale": "RdBu",
                "cmin": -amax,
                "cmax": amax,
                "colorbar": {"title": "alpha_ij", "y": 0.78, "len": 0.42},
            },
            coloraxis2={
                "colorscale": "Viridis",
                "cmin": 0.0,
                "cmax": 1.0,
                "colorbar": {"title": "P_ij", "y": 0.22, "len": 0.42},
            },
            height=560,
        )
        figs.append(fig)
    return figs


def activation_figure(res: Any) -> go.Figure:
    """Per head, median cos²(T y_t, y_t) on text vs weight-level P (control in grey; SPEC 8)."""
    import plotly.graph_objects as go

    df = res.heads
    fig = go.Figure()
    text = [f"L{a}H{b}" for a, b in zip(df["layer"], df["head"])]
    if "ctrl_cos2_median" in df:
        fig.add_trace(
            go.Scatter(
                x=df["P"],
                y=df["ctrl_cos2_median"],
                mode="markers",
                name=f"control ({res.options.get('control')})",
                marker={"color": "lightgrey", "size": 5},
                text=text,
            )
        )
    fig.add_trace(
        go.Scatter(
            x=df["P"],
            y=df["cos2_median"],
            mode="markers",
            name="trained head on text",
            marker={"color": np.where(df["closed"], "crimson", "steelblue"), "size": 6},
            text=[
                f"{t}<br>P={p}" for t, p in zip(text, format_P_list(df["P"], float(res.options.get("threshold", 0.9))))
            ],
            hovertemplate="%{text}<br>median cos2=%{y:.4f}<extra></extra>",
        )
    )
    fig.update_layout(
        title="Activation-level returns: median cos²(T y_t, y_t) over tokens vs weight-level P",
        xaxis_title="weight-level P",
        yaxis_title="median cos²(T y_t, y_t)",
    )
    return fig


def _suspect_points(tr: Any) -> pd.DataFrame:
    ck = tr.checkpoints
    if "identical_to" not in ck:
        return ck.iloc[0:0]
    return ck[(ck["identical_to"].astype(str) != "") | (ck["shares_layers_with"].astype(str) != "")]


def trajectory_figure(tr: Any, top_k: int = 5, log_y: bool = True) -> go.Figure:
    """P over training for the tracked heads (``tr.tracked_heads``), one panel per layer (SPEC 6).

    Each head's P is a solid line; its scramble-null median (``nulls``) the same colour dotted;
    with ``search`` its own searched P the same colour long-dashed and the layer's feasible P
    (best searched P in the layer) a black dashed line; the threshold a grey line. Checkpoints
    identical to an earlier one, or sharing layers with one, are marked with a grey band.
    """
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    tracked = tr.tracked_heads(top_k=top_k)
    xcol, xtitle = tr.x_axis()
    if tracked.empty:
        fig = go.Figure()
        fig.update_layout(title="No head has a defined P at the final checkpoint")
        return fig
    layers = sorted(tracked["layer"].unique().tolist())
    fig = make_subplots(
        rows=len(layers),
        cols=1,
        shared_xaxes=True,
        vertical_spacing=min(0.08, 0.3 / max(len(layers), 1)),
        subplot_titles=[f"layer {layer}" for layer in layers],
    )
    has_search, has_null, arrays = _tracked_head_traces(fig, tr, tracked, layers, xcol)
    arrays += _layer_feasible_traces(fig, tr, layers, xcol)
    _mark_suspect_checkpoints(fig, tr, xcol)
    if log_y:
        fig.update_yaxes(title_text="P", type="log", range=log_P_range(*arrays))
    else:
        fig.update_yaxes(title_text="P", range=[0, 1.02])
    fig.update_xaxes(title_text=xtitle, row=len(layers), col=1)
    fig.update_layout(
        title=_trajectory_title(tr, tracked, has_null, has_search),
        height=260 * len(layers) + 120,
        template="plotly_white",
    )
    return fig


def _dashed_trace(x: Any, y: Any, name: str, line: dict[str, Any], legendgroup: str | None = None) -> go.Scatter:
    """A line without markers on a trajectory panel (a head's searched P or scramble median, a layer's feasible P)."""
    import plotly.graph_objects as go

    return go.Scatter(x=x, y=y, mode="lines", name=name, legendgroup=legendgroup, line=line)


def _tracked_head_traces(
    fig: Any, tr: Any, tracked: pd.DataFrame, layers: list[int], xcol: str
) -> tuple[bool, bool, list[Any]]:
    """Each tracked head's P over training on its layer's panel, with its searched P and scramble median when
    measured. Returns ``(has_search, has_null, the P values drawn)``."""
    import plotly.graph_objects as go
    from plotly.colors import qualitative

    colors = qualitative.Plotly
    has_search = has_null = False
    arrays = []
    for i, (layer, head) in enumerate(zip(tracked["layer"], tracked["head"])):
        row = layers.index(layer) + 1
        d = tr.heads[(tr.heads["layer"] == layer) & (tr.heads["head"] == head)].sort_values("order")
        color = colors[i % len(colors)]
        name = f"L{layer}H{head}"
        arrays.append(d["P"])
        fig.add_trace(
            go.Scatter(
                x=d[xcol],
                y=d["P"],
                mode="lines+markers",
                name=f"{name} P",
                legendgroup=name,
                line={"color": color},
                customdata=np.stack(
                    [[plot_text(c) for c in d["checkpoint"]], d["alpha"], format_P_list(d["P"], tr.threshold)], -1
                ),
                hovertemplate=f"{name}<br>%{{customdata[0]}}<br>P=%{{customdata[2]}}<br>α=%{{customdata[1]:.4g}}"
                "<extra></extra>",
            ),
            row=row,
            col=1,
        )
        if "P_searched" in d and d["P_searched"].notna().any():
            has_search = True
            arrays.append(d["P_searched"])
            line = {"color": color, "dash": "longdash", "width": 1}
            trace = _dashed_trace(d[xcol], d["P_searched"], f"{name} searched P (constructive search)", line, name)
            fig.add_trace(trace, row=row, col=1)
        if "P_scrambled_median" in d:
            has_null = True
            arrays.append(d["P_scrambled_median"])
            line = {"color": color, "dash": "dot"}
            trace = _dashed_trace(d[xcol], d["P_scrambled_median"], f"{name} scramble median", line, name)
            fig.add_trace(trace, row=row, col=1)
    return has_search, has_null, arrays


def _layer_feasible_traces(fig: Any, tr: Any, layers: list[int], xcol: str) -> list[Any]:
    """Each panel's feasible P (the best searched P in the layer, when searched) and the threshold line; returns
    the feasible P values drawn."""
    lay = tr.layers.sort_values("order")
    arrays = []
    for layer in layers:
        row = layers.index(layer) + 1
        ld = lay[lay["layer"] == layer]
        if "feasible_P" in ld and ld["feasible_P"].notna().any():
            arrays.append(ld["feasible_P"])
            name = f"layer {layer} feasible P (best searched P in the layer)"
            fig.add_trace(
                _dashed_trace(ld[xcol], ld["feasible_P"], name, {"color": "black", "dash": "dash"}), row=row, col=1
            )
        fig.add_hline(y=tr.threshold, line={"color": "grey", "width": 1, "dash": "dashdot"}, row=row, col=1)
    return arrays


def _mark_suspect_checkpoints(fig: Any, tr: Any, xcol: str) -> None:
    """A grey band at each checkpoint identical to an earlier one or sharing layers with one, saying which."""
    for _, ck in _suspect_points(tr).iterrows():
        x = ck[xcol]
        what = (
            f"identical to {ck['identical_to']}"
            if ck["identical_to"]
            else f"shares layers with {ck['shares_layers_with']}"
        )
        fig.add_vrect(
            x0=x,
            x1=x,
            line={"color": "grey", "width": 6},
            opacity=0.3,
            annotation_text=what,
            annotation_position="top left",
        )


def _trajectory_title(tr: Any, tracked: pd.DataFrame, has_null: bool, has_search: bool) -> str:
    """The title of :func:`trajectory_figure`: which heads are tracked, and the key to its line styles."""
    why = tracked["why"].iloc[0]
    head_note = (
        f"heads with final P ≥ {tr.threshold:g}"
        if why == "final P >= threshold"
        else (
            f"NO head reached P ≥ {tr.threshold:g}: top {len(tracked)} heads by final P"
            if why.startswith("top")
            else "selected heads"
        )
    )
    keys = (
        ["solid: P"]
        + (["dotted: scramble null"] if has_null else [])
        + (["long-dash: searched P", "black dashed: layer feasible P"] if has_search else [])
    )
    return f"Closure over training — {head_note}; " + ", ".join(keys)


def trajectory_summary_figure(tr: Any, log_y: bool = True) -> go.Figure:
    """Per checkpoint: median P over all heads and (nulls) median scrambled P on the P axis (log, ending at
    P = 1), and the fraction of heads with P >= threshold on its own linear axis (right; a fraction of 0
    has no place on a log axis)."""
    import plotly.graph_objects as go

    ck = tr.checkpoints.sort_values("order")
    xcol, xtitle = tr.x_axis()

    def on_P_axis(v: Any) -> np.ndarray:
        """Values as drawn on the P axis: on a log axis a 0 is left out (a gap), never drawn off the axis."""
        a = np.asarray(v, dtype=float)
        return np.where(a > 0, a, np.nan) if log_y else a

    fig = go.Figure()

    def trace(rows: pd.DataFrame, y: Any, mode: str, name: str, **style: Any) -> None:
        """One trace over the checkpoints (``rows``) on the x axis of the trajectory."""
        fig.add_trace(go.Scatter(x=rows[xcol], y=y, mode=mode, name=name, **style))

    hover: dict[str, Any] = {"customdata": format_P_list(ck["median_P"], tr.threshold)}  # never rounded across t
    hover["hovertemplate"] = "median P=%{customdata}<extra></extra>"
    trace(ck, on_P_axis(ck["median_P"]), "lines+markers", "median P (all heads)", **hover)
    trace(ck, ck["n_closed"] / ck["n_heads"], "lines+markers", f"fraction with P ≥ {tr.threshold:g}", yaxis="y2")
    arrays = [ck["median_P"]]
    if "median_P_scrambled" in ck:
        arrays.append(ck["median_P_scrambled"])
        scrambled = "median scrambled P (heads' scramble medians)"
        trace(ck, on_P_axis(ck["median_P_scrambled"]), "lines", scrambled, line={"dash": "dot"})
    sus = _suspect_points(tr)
    if len(sus):
        suspect = {"symbol": "x-open", "size": 14, "color": "black"}
        trace(sus, on_P_axis(sus["median_P"]), "markers", "identical / shared-layer checkpoint", marker=suspect)
    fig.update_layout(
        title=f"All heads over training: median P and the fraction closed (P ≥ {tr.threshold:g})",
        xaxis_title=xtitle,
        yaxis={
            "title": "median P",
            **({"type": "log", "range": log_P_range(*arrays)} if log_y else {"range": [0, 1.02]}),
        },
        yaxis2={
            "title": f"fraction of heads with P ≥ {tr.threshold:g}",
            "overlaying": "y",
            "side": "right",
            "range": [0, 1.02],
            "showgrid": False,
        },
        legend={"orientation": "h", "y": -0.2},
        template="plotly_white",
    )
    return fig


def report_figures(rep: Any) -> list[go.Figure]:
    """The figures of a report page, in order: heatmap; with controls the scramble figures;
    with the algebra its per-layer summary."""
    figs = [heads_heatmap(rep)]
    if "P_scrambled_median" in rep.heads.columns:
        figs += scramble_figures(rep)
    alg = rep.algebra
    if alg is not None and not alg.empty:
        figs.append(algebra_summary_figure(alg))
    return figs
