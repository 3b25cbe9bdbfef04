"""The figures of what the closed heads do, from the probes joined to a report: heads as points, closed ones marked.

* :func:`roles_figure` — each head role's score against P (``rep.roles(...)``), one panel per role.
* :func:`mechanism_figure` — each head's attended-token effect against α·P (``rep.mechanism(...)``).

Both draw the closed heads (``P >= threshold``) as red diamonds over the others' grey dots
(:func:`_closed_and_other`); both are also importable from :mod:`.figures` and drawn for users by the views'
package (``tl_idempotence.views.roles_figure``, ``mechanism_figure``).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import pandas as pd

from .text import format_P_list, plot_text

if TYPE_CHECKING:  # pragma: no cover
    import plotly.graph_objects as go

__all__ = ["ROLE_PANELS", "mechanism_figure", "roles_figure"]


def drawn_table(result: Any, columns: set[str], draws: str) -> pd.DataFrame:
    """``result.table``, the table a figure draws, when it is a DataFrame with ``columns``.

    Raises:
        OptionTypeError: no such table (``"{draws}; got {type(result).__name__}."``).
    """
    from ..errors import OptionTypeError

    table = getattr(result, "table", None)
    if not isinstance(table, pd.DataFrame) or not columns <= set(table.columns):
        raise OptionTypeError(f"{draws}; got {type(result).__name__}.")
    return table


#: The panels of :func:`roles_figure`: role column -> axis title.
ROLE_PANELS = {
    "previous_token": "previous-token score",
    "duplicate_token": "duplicate-token score",
    "induction": "induction score",
    "copying": "copying score (Re Σλ / Σ|λ|)",
}


def _closed_and_other(table: pd.DataFrame, ok: pd.Series, t: float) -> list[tuple[str, dict[str, Any], pd.DataFrame]]:
    """``(legend name, marker, rows)`` of the heads selected by ``ok``: the other heads (grey) first, then the
    closed ones (``P >= t``, red diamonds), as the scatter figures of heads draw them."""
    return [
        (name, marker, table[ok & (table["closed"].astype(bool) == closed)])
        for closed, name, marker in (
            (False, "other heads", {"color": "#7f7f7f", "size": 6, "opacity": 0.6}),
            (True, f"closed (P >= {t:g})", {"color": "#e8175d", "size": 10, "symbol": "diamond"}),
        )
    ]


def roles_figure(assoc: Any) -> go.Figure:
    """Each head role's score (y) against the head's P (x), one panel per role, from ``rep.roles(model=...)``.

    Closed heads (P >= the report's threshold) are red diamonds, the others grey dots; the threshold is a dotted
    vertical line; each panel's title gives the role's Spearman ρ with P and its BH q-value (the association table).
    Hover: the head's label, P (never rounded across the threshold), α and the score. Heads with a NaN P or score
    are left out (the association counts them out too; ``assoc.association["n"]``). Each panel's title names its
    score (the y axis) on one line and ρ, q on a second, so titles of neighbouring panels do not overlap.

    Args:
        assoc: a :class:`~tl_idempotence.report.roles.RoleAssociation` (``.table`` with ``P``, ``alpha``,
            ``closed`` and the role columns; ``.association``; ``.summary["threshold"]``).

    Raises:
        OptionTypeError: ``assoc`` has no role table (not a ``rep.roles`` result).
    """
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    from ..errors import OptionTypeError

    table = getattr(assoc, "table", None)
    association = getattr(assoc, "association", None)
    if not isinstance(table, pd.DataFrame) or not isinstance(association, pd.DataFrame):
        raise OptionTypeError(
            f"roles_figure draws rep.roles(model=...) (a RoleAssociation); got {type(assoc).__name__}."
        )
    t = float(assoc.summary["threshold"])
    roles = [r for r in ROLE_PANELS if r in table.columns]
    titles = []
    for r in roles:
        row = association.loc[r] if r in association.index else None
        rho = float(row["spearman_rho"]) if row is not None else math.nan
        q = float(row["spearman_q"]) if row is not None else math.nan
        # two short lines (what the panel's y is; ρ and q), so that neighbouring panels' titles never overlap
        stats = f"ρ = {rho:.2f}, q = {q:.2g}" if math.isfinite(rho) else "ρ undefined"
        titles.append(f"{ROLE_PANELS[r]}<br>{stats}")
    fig = make_subplots(rows=1, cols=len(roles), subplot_titles=titles, horizontal_spacing=0.07)
    fig.update_annotations(font={"size": 12})  # the subplot titles (the only annotations here)
    for i, r in enumerate(roles, start=1):
        ok = table["P"].notna() & table[r].notna()
        for name, marker, part in _closed_and_other(table, ok, t):
            fig.add_trace(
                go.Scatter(
                    x=part["P"].to_numpy(dtype=float),
                    y=part[r].to_numpy(dtype=float),
                    mode="markers",
                    name=name,
                    legendgroup=name,
                    showlegend=i == 1,
                    marker=marker,
                    text=[
                        f"{lab}: P = {p}, α = {a:.4g}, {r} = {v:.4g}"
                        for lab, p, a, v in zip(part.index, format_P_list(part["P"], t), part["alpha"], part[r])
                    ],
                    hovertemplate="%{text}<extra></extra>",
                ),
                row=1,
                col=i,
            )
        fig.add_vline(x=t, line={"color": "#e8175d", "width": 1, "dash": "dot"}, row=1, col=i)
        fig.update_xaxes(title_text="P", range=[0, 1.02], row=1, col=i)
    name = plot_text(str(assoc.summary.get("model_name", "model")))
    fig.update_layout(
        title={
            "text": f"What the closed heads do: head roles against P, {name} ({int(table['closed'].sum())} closed)",
            "y": 0.97,
            "yanchor": "top",
        },
        height=420,
        margin={"t": 120, "l": 50, "r": 30},  # room for the title above the two-line panel titles
        legend={"orientation": "h", "y": -0.2},
        template="plotly_white",
    )
    return fig


def mechanism_figure(mech: Any) -> go.Figure:
    """Each joined head's attended-token effect (y: the median standardized direct logit effect on the token it
    attends to most, on text) against α·P (x), closed heads marked, from ``rep.mechanism(model=...)`` (SPEC §12).

    Closed heads are red diamonds, the others grey dots; y = 0 and x = 0 are dotted lines, so a closed head in the
    top-right or bottom-left quadrant is one whose effect has the sign of α. The title gives the sign agreement
    among closed heads with its sign-test p and the Spearman ρ of α·P with the effect with its permutation p (the
    result's summary). Hover: the head's label, P, α and the effect with its BH q. Heads with a NaN α·P or effect
    are left out (the statistics count them out too).

    Args:
        mech: a :class:`~tl_idempotence.report.mechanism.Mechanism` (``.table`` with ``alpha_P``, ``P``,
            ``alpha``, ``closed``, ``effect_median``, ``effect_q``; ``.summary``).

    Raises:
        OptionTypeError: ``mech`` has no such table (not a ``rep.mechanism`` result).
    """
    import plotly.graph_objects as go

    table = drawn_table(
        mech,
        {"alpha_P", "P", "alpha", "closed", "effect_median", "effect_q"},
        "mechanism_figure draws rep.mechanism(model=...) (a Mechanism)",
    )
    s = mech.summary
    t = float(s["threshold"])
    ok = table["alpha_P"].notna() & table["effect_median"].notna()
    fig = go.Figure()
    for name, marker, part in _closed_and_other(table, ok, t):
        fig.add_trace(
            go.Scatter(
                x=part["alpha_P"].to_numpy(dtype=float),
                y=part["effect_median"].to_numpy(dtype=float),
                mode="markers",
                name=name,
                marker=marker,
                text=[
                    f"{lab}: P = {p}, α = {a:.4g}, effect = {e:.3g} (q = {q:.2g})"
                    for lab, p, a, e, q in zip(
                        part.index, format_P_list(part["P"], t), part["alpha"], part["effect_median"], part["effect_q"]
                    )
                ],
                hovertemplate="%{text}<extra></extra>",
            )
        )
    fig.add_hline(y=0, line={"color": "#999", "width": 1, "dash": "dot"})
    fig.add_vline(x=0, line={"color": "#999", "width": 1, "dash": "dot"})

    def num(key: str) -> float:
        v = s.get(key)
        return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else math.nan

    agree = f"sign(effect) = sign(α) for {s.get('n_agree')} of {s.get('n_sign_tested')} closed heads"
    stats = f"{agree} (sign test p = {num('sign_test_p'):.2g}); Spearman ρ(α·P, effect) = {num('spearman_rho'):.2f}"
    stats += f" (permutation p = {num('spearman_p'):.2g})"
    name = plot_text(str(s.get("model_name", "model")))
    fig.update_layout(
        title={"text": f"What the heads do to the tokens they attend to: {name}<br><sub>{stats}</sub>"},
        xaxis_title="α·P (sign of α, size of closure)",
        yaxis_title="median attended-token effect (standardized over the vocabulary)",
        height=480,
        margin={"t": 100, "l": 60, "r": 30},
        legend={"orientation": "h", "y": -0.18},
        template="plotly_white",
    )
    return fig
