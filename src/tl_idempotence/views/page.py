"""The standalone report page: leads with the answer, then the evidence, then the details.

Order: a headline sentence (model, weights, how many heads closed, against what null);
the closed heads sorted by P; the heatmap with closed cells ringed; the paper comparison;
the controls' figures; the shared-value algebra summarized (per-layer panels folded
away); the attention view when asked; then every head and layer in sortable tables and
the summary as readable tables. Figures are plotly (plotly.js inlined once), sortable tables
itables' DataTables in offline mode, the page a jinja2 template
(``data/report.html.j2``): it renders with no network.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from importlib import resources
from typing import Any

import numpy as np
import pandas as pd

from ..core.readings import copying_by_sign
from .figures import (
    algebra_figures,
    algebra_summary_figure,
    heads_heatmap_spec,
    mechanism_figure,
    roles_figure,
    scramble_figures,
)
from .text import P_VALUE_TESTS, format_P, format_sig, headline, summary_sections

__all__ = [
    "closed_heads_table",
    "datatable_html",
    "datatables_init_html",
    "display_frame",
    "mechanism_section",
    "mechanism_section_tables",
    "p_value_note",
    "report_html",
    "roles_section",
    "roles_section_tables",
]


def _fig_div(fig: Any, first: bool) -> str:
    """A figure as an HTML div (plotly.js inlined when ``first``): a ``go.Figure``, or a figure dict from a
    ``*_spec`` function, rendered unvalidated in the default plotly template (as a ``go.Figure`` would be)."""
    import plotly.io as pio

    if isinstance(fig, dict):
        template = pio.templates[pio.templates.default] if pio.templates.default else None
        layout = dict(fig.get("layout", {}))
        if template is not None and "template" not in layout:
            layout["template"] = template.to_plotly_json()
        fig = {**fig, "layout": layout}
        return str(pio.to_html(fig, validate=False, full_html=False, include_plotlyjs=True if first else False))
    return str(pio.to_html(fig, full_html=False, include_plotlyjs=True if first else False))


def _table_html(df: pd.DataFrame) -> str:
    return str(df.to_html(index=False, classes="tli", border=0, escape=True))


def closed_heads_table(rep: Any, limit: int | None = None) -> pd.DataFrame:
    """The closed heads sorted by P as display strings (or, when none is closed, the top 10 by P).

    Columns: ``head`` (``L10H8``), ``layer``, ``head index``, ``kv head``, ``α``, ``P`` (never
    rounded across the threshold); with controls ``scramble median P``, ``scramble p-value`` and
    ``BH q-value`` (Benjamini-Hochberg across every measured head; both test trained vs Haar-scrambled orientation
    with the same spectra, not closure) and ``scramble effect (log10 P / null median)`` (``scramble_effect``, which
    ranks heads at the p floor; absent for a saved report whose heads table lacks it);
    with the search ``searched P`` (the constructive search's P for this head, SPEC 5 — not the
    head's own P). P-valued columns never round across the threshold.
    """
    df = rep.closed_heads
    if not len(df):
        df = rep.heads.dropna(subset=["P"]).sort_values("P", ascending=False).head(10)
    if limit is not None:
        df = df.head(limit)
    t = rep.threshold
    out = pd.DataFrame(
        {
            "head": list(df.index),
            "layer": df["layer"].astype(int).to_numpy(),
            "head index": df["head"].astype(int).to_numpy(),
            "kv head": df["kv_head"].astype(int).to_numpy(),
            "α": [f"{a:.4g}" for a in df["alpha"]],
            "P": [format_P(p, t) for p in df["P"]],
        }
    )
    if "P_scrambled_median" in df.columns:
        out["scramble median P"] = [format_sig(v, t, sig=3) for v in df["P_scrambled_median"]]
        out["scramble p-value"] = [f"{v:.3g}" for v in df["p_value"]]
        if "q_value" in df.columns:
            out["BH q-value"] = [f"{v:.3g}" for v in df["q_value"]]
        if "scramble_effect" in df.columns:  # absent in a report saved by a version before it
            out["scramble effect (log10 P / null median)"] = [format_sig(v, None, sig=3) for v in df["scramble_effect"]]
    if "P_searched" in df.columns:
        out["searched P"] = [format_P(v, t) for v in df["P_searched"]]
    return out


def _datatables_init() -> str:
    """itables' offline init block (DataTables JS/CSS inlined)."""
    import itables
    from itables.javascript import generate_init_offline_itables_html

    bundle = resources.files(itables).joinpath("html/dt_bundle.js")
    return str(generate_init_offline_itables_html(str(bundle)))


def _datatable(df: pd.DataFrame) -> str:
    """A sortable, searchable table (itables, offline mode)."""
    from itables import to_html_datatable

    # the options are fixed here and tested; itables' per-call typeguard check of them costs ~15 ms a table
    return str(
        to_html_datatable(
            df,
            connected=False,
            display_logo_when_loading=False,
            showIndex=False,
            maxBytes=0,
            text_in_header_can_be_selected=False,  # a click anywhere on a header sorts (not only on its arrow)
            warn_on_unexpected_option_type=False,
        )
    )


def _p_value_note(rep: Any) -> str:
    """What the scramble p-value can resolve with this many draws (empty without controls)."""
    scramble = rep.summary.scramble
    n = None if scramble is None else scramble.n_scramble_draws
    if "p_value" not in rep.heads.columns or not n:
        return ""
    text = (
        f"The {P_VALUE_TESTS}: a small p says the head's trained orientation gives a higher P than Haar-random "
        "orientations with the same singular values and principal angles, which almost every trained head does (the "
        "paper: 98.64 %); closure is P ≥ the threshold. scramble p-value = (1 + number of draws with scrambled P ≥ "
        f"P) / (n + 1) over n = {int(n)} Haar draws per head, so it cannot go below 1/{int(n) + 1} = "
        f"{1 / (int(n) + 1):.3g}; more draws (nulls=...) resolve smaller p-values."
    )
    if "q_value" in rep.heads.columns and scramble.n_heads_q05 is not None:
        text += (
            " BH q-value: the Benjamini-Hochberg q-value of the p-value across all "
            f"{int(rep.heads['q_value'].notna().sum())} "
            "heads with a p-value (the smallest false-discovery rate at which BH declares the head); "
            f"{scramble.n_heads_q05} heads have q ≤ 0.05."
        )
    if "scramble_effect" in rep.heads.columns:
        text += (
            " scramble effect = log10(P / the median of the head's own scrambled P): how many decades the head sits "
            "above its null (0: at its median), which ranks the heads the p floor cannot tell apart and does not "
            "depend on the number of draws."
        )
    return text


def p_value_note(rep: Any) -> str:
    """What the scramble p- and q-values test, the p floor with this many draws, and the effect size beside them
    (the page's and the notebook display's note under the closed heads; empty without controls)."""
    return _p_value_note(rep)


def _display_frame(df: pd.DataFrame, threshold: float | None = None) -> pd.DataFrame:
    """Float columns as text with 6 significant digits, never rounded across ``threshold`` (when given)."""
    out = df.copy()
    for col in out.columns:
        if out[col].dtype.kind == "f":
            out[col] = out[col].map(lambda v: format_sig(v, threshold))
    return out


def datatables_init_html() -> str:
    """The offline DataTables block (JS/CSS inlined) that a page with :func:`datatable_html` tables needs once."""
    return _datatables_init()


def datatable_html(df: pd.DataFrame) -> str:
    """A sortable, searchable HTML table of ``df`` (itables, offline mode)."""
    return _datatable(df)


def display_frame(df: pd.DataFrame, threshold: float | None = None) -> pd.DataFrame:
    """A copy of ``df`` with float columns as 6-significant-digit strings, for display tables; with
    ``threshold``, a value is never printed rounded across it (:func:`~tl_idempotence.views.text.format_sig`)."""
    return _display_frame(df, threshold)


#: Role columns of the page's roles section, in order.
_ROLE_COLUMNS = ("previous_token", "duplicate_token", "induction", "copying")


def roles_section_tables(assoc: Any, threshold: float, top: int = 3) -> dict[str, pd.DataFrame]:
    """The tables of the page's "what the closed heads do" section, as display strings, from ``rep.roles(...)``.

    Returns:
        ``closed``: every closed head (by P) with its role scores; ``beside``: per role, the median score of the
        closed heads, of the other heads and of all heads, except the signed ``copying``, shown by sign (the number
        of copying, > 0, and suppressing, < 0, heads with the median |copying| of each: never a signed median of a
        mixed set); ``association``: per role, Spearman ρ of P and the score with its permutation p and BH q,
        Mann-Whitney p and q (closed vs other), and for ``copying`` the closed heads whose copying sign equals the
        sign of α (``"13 of 13"``); ``top``: the ``top`` heads of each role by score (``copying`` by |copying|, the
        sign shown) with their P (a display only: no threshold on a role enters the statistics).
    """
    t = assoc.table
    roles = [r for r in _ROLE_COLUMNS if r in t.columns]
    closed = t[t["closed"].astype(bool)].sort_values("P", ascending=False, kind="stable")
    closed_df = pd.DataFrame(
        {
            "head": list(closed.index),
            "P": [format_P(v, threshold) for v in closed["P"]],
            "α": [f"{v:.4g}" for v in closed["alpha"]],
            **{r: [f"{v:.4g}" for v in closed[r]] for r in roles},
        }
    )
    a = assoc.association
    names = [r for r in a.index if r in roles or r == "|copying|"]

    P = t["P"].to_numpy(dtype=float)

    def median(x: pd.Series) -> str:  # over the heads the association counts: P and score defined
        v = x.to_numpy(dtype=float)
        v = v[np.isfinite(v) & np.isfinite(P)]
        return f"{np.median(v):.3g}" if len(v) else "–"

    counted = np.isfinite(P)
    closed_mask = t["closed"].to_numpy(dtype=bool)

    def by_sign(mask: np.ndarray) -> str:  # a signed score over a mixed set: by sign, never a signed median
        b = copying_by_sign(t["copying"].to_numpy(dtype=float)[mask & counted])
        return (
            f"{b['n_copying']} copying ({_median_text(b['median_abs_copying'])}), "
            f"{b['n_suppressing']} suppressing ({_median_text(b['median_abs_suppressing'])})"
        )

    def cell(r: str, which: str, mask: np.ndarray) -> str:
        if r == "copying":
            return by_sign(mask)
        if which == "all":
            return median(t["copying"].abs() if r == "|copying|" else t[r])
        return f"{a.loc[r, which]:.3g}"

    beside = pd.DataFrame(
        {
            "role": names,
            "closed heads (median)": [cell(r, "median_closed", closed_mask) for r in names],
            "other heads (median)": [cell(r, "median_other", ~closed_mask) for r in names],
            "all heads (median)": [cell(r, "all", np.ones(len(t), dtype=bool)) for r in names],
            "note": [
                "signed score by sign: heads with copying > 0 and < 0, each with its median |copying|"
                if r == "copying"
                else ""
                for r in names
            ],
        }
    )
    assoc_df = pd.DataFrame(
        {
            "role": names,
            "heads": [int(a.loc[r, "n"]) for r in names],
            "Spearman ρ (P, score)": [f"{a.loc[r, 'spearman_rho']:.3g}" for r in names],
            "permutation p": [f"{a.loc[r, 'spearman_p']:.3g}" for r in names],
            "BH q (ρ)": [f"{a.loc[r, 'spearman_q']:.3g}" for r in names],
            "Mann-Whitney p": [f"{a.loc[r, 'mannwhitney_p']:.3g}" for r in names],
            "BH q (M-W)": [f"{a.loc[r, 'mannwhitney_q']:.3g}" for r in names],
            "sign(copying) = sign(α), closed": [_sign_agreement(t) if r == "copying" else "" for r in names],
            "note": [str(a.loc[r, "note"]) for r in names],
        }
    )
    top_rows = []
    for r in roles:
        d = t.dropna(subset=[r])
        # copying is signed: the strongest copiers and suppressors alike (by |copying|), each with its sign
        key = d[r].abs() if r == "copying" else d[r]
        best = d.loc[key.sort_values(ascending=False, kind="stable").index].head(top)
        top_rows.append(
            {
                "role": r + (" (by |copying|)" if r == "copying" else ""),
                f"top {top} heads (score, P)": "; ".join(
                    f"{lab} ({v:.4g}, P {format_P(p, threshold)}{', closed' if c else ''})"
                    for lab, v, p, c in zip(best.index, best[r], best["P"], best["closed"])
                ),
            }
        )
    return {"closed": closed_df, "beside": beside, "association": assoc_df, "top": pd.DataFrame(top_rows)}


def _median_text(v: float) -> str:
    return "–" if not np.isfinite(v) else f"median |copying| {v:.3g}"


def _sign_agreement(t: pd.DataFrame) -> str:
    """``"13 of 13"``: closed heads whose sign(copying) = sign(α), over those with both signs nonzero."""
    c = t[t["closed"].to_numpy(dtype=bool)]
    b = copying_by_sign(c["copying"], c["alpha"])
    return f"{b['n_sign_agrees']} of {b['n_sign_compared']}" if b["n_sign_compared"] else "no closed head"


def _roles_note(assoc: Any) -> str:
    s = assoc.summary
    r = s.get("roles", {})
    proc = r.get("processing", {})
    weights = "raw checkpoint weights" if proc.get("raw") else f"processed weights ({proc})"
    return (
        f"TransformerLens's head-detector scores (attention mass on the previous-token, duplicate-token and induction "
        f"patterns; BOS excluded) on {r.get('n_sequences')} seeded sequences {r.get('sequence')} (seed "
        f"{r.get('seed')}), and the copying score of each head's full OV circuit W_E W_V W_O W_U (Re Σλ / Σ|λ|: +1 "
        f"copies tokens, −1 suppresses them), on {weights}. Association with closure over {s.get('n_heads')} heads "
        f"({s.get('n_closed')} closed): Spearman ρ of P and each score with a two-sided permutation p "
        f"({s.get('n_permutations')} permutations, seed {s.get('seed')}; p ≥ {s.get('p_floor', float('nan')):.3g}), "
        "Mann-Whitney p of closed vs other heads, and Benjamini-Hochberg q-values across the roles. No threshold on a "
        "role enters these statistics."
    )


def _tokens_text(top: pd.DataFrame, kind: str, n: int) -> str:
    rows = top[top["kind"] == kind].head(n)
    return ", ".join(repr(t) if isinstance(t, str) else f"#{i}" for t, i in zip(rows["token"], rows["token_id"]))


def mechanism_section_tables(mech: Any, threshold: float, n_tokens: int = 5) -> dict[str, pd.DataFrame]:
    """The tables of the page's "What the closed heads do to tokens" section, as display strings, from
    ``rep.mechanism(...)``.

    Returns:
        ``closed``: per closed head (by P): α, P, the ``n_tokens`` source tokens it promotes and suppresses most for
        themselves (``mech.top_tokens``), its median attended-token effect with the null's median, the sign-test
        p and BH q, the copying score and the G = I score; ``signs``: the signed columns by sign
        (``mech.signs``: counts and median |x| of each sign, never one median of a mixed set).
    """
    t = mech.table
    closed = t[t["closed"].astype(bool)].sort_values("P", ascending=False, kind="stable")
    rows = []
    for lab, r in closed.iterrows():
        top = mech.top_tokens(lab)
        rows.append(
            {
                "head": lab,
                "α": f"{r['alpha']:.4g}",
                "P": format_P(r["P"], threshold),
                f"promoted (top {n_tokens})": _tokens_text(top, "promoted", n_tokens),
                f"suppressed (top {n_tokens})": _tokens_text(top, "suppressed", n_tokens),
                "median self-rank": f"{r['self_rank_median']:.3g}",
                "effect (median)": f"{r['effect_median']:+.3g}",
                "null (median)": f"{r['null_median']:+.3g}",
                "p / BH q": f"{r['effect_p']:.2g} / {r['effect_q']:.2g}",
                "direction (effect - null)": _direction_text(r["direction"]),
                "median effect - null (95% interval)": _interval_text(r),
                "sign = sign(α)": "" if pd.isna(r["sign_agrees"]) else ("yes" if r["sign_agrees"] else "no"),
                "copying": f"{r['copying']:+.3g}",
                "copying (G = I)": f"{r['copying_own']:+.3g}",
                "‖T - Tᵀ‖/‖T‖": f"{r['asymmetry']:.2f}" if "asymmetry" in r else "",
                "distance from an orthogonal projection": f"{r['proj_distance']:.2f}" if "proj_distance" in r else "",
                "matched control(s)": _controls_of(t, lab),
            }
        )
    signs = mech.signs.reset_index()
    for col in ("median_abs_positive", "median_abs_negative"):
        signs[col] = [f"{v:.3g}" for v in signs[col]]
    return {"closed": pd.DataFrame(rows), "signs": signs, "compared": _compared_table(mech.summary)}


def _controls_of(t: pd.DataFrame, lab: str) -> str:
    of = t["control_of"] if "control_of" in t.columns else pd.Series("", index=t.index)
    return ", ".join(x for x, o in of.items() if lab in str(o).split(", "))


def _direction_text(d: Any) -> str:
    return "" if not np.isfinite(d) else {1.0: "raises", -1.0: "lowers", 0.0: "even"}[float(d)]


def _interval_text(r: Any) -> str:
    lo, hi = r.get("median_diff_lo", np.nan), r.get("median_diff_hi", np.nan)
    return f"{r['median_diff']:+.3g}" + ("" if not np.isfinite(lo) else f" ({lo:+.3g} to {hi:+.3g})")


def _compared_table(s: Any) -> pd.DataFrame:
    """Closed heads beside their matched controls (direction vs sign α, effect - null along α) and the
    weights-only signs beside the non-closed heads' base rate (SPEC 13)."""
    rows = []
    m = s.get("matched") or {}
    for key, what in (("agreement", "direction = sign(α), share"), ("aligned", "median sign(α)·(effect - null)"),
                      ("abs_median_diff", "median |effect - null|")):  # fmt: skip
        a = m.get(key) or {}
        if a and a.get("method") != "none":
            rows.append({"quantity": what, "closed heads": f"{a['value_closed']:.3g} (n = {a['n_closed']})",
                         "comparison heads": f"{a['value_controls']:.3g} (n = {a['n_controls']}, matched controls)",
                         "p": f"{a['p_value']:.2g} ({a['method']}, within layers)"})  # fmt: skip
    for key, what in (("copying", "sign(copying) = sign(α), share"), ("copying_own", "sign(G = I score) = sign(α)")):
        b = (s.get("base_rates") or {}).get(key) or {}
        if b.get("n_closed"):
            rows.append({"quantity": what, "closed heads": f"{b['k_closed']} of {b['n_closed']}",
                         "comparison heads": f"{b['k_other']} of {b['n_other']} (every non-closed head)",
                         "p": f"{b['fisher_p']:.2g} (Fisher)"})  # fmt: skip
    return pd.DataFrame(rows, columns=["quantity", "closed heads", "comparison heads", "p"])


def _mechanism_note(mech: Any) -> str:
    s = mech.summary
    conv = s.get("conventions", {})
    return (
        f"{mech.headline} Attended-token effect: {conv.get('effect')}; null: the same head's effect on a seeded random "
        f"earlier token, two-sided sign test, BH q over the heads. Token readout: {conv.get('tokens')}. Copying "
        "(G = I): Re Σλ / Σ|λ| over T's own eigenvalues, exactly sign(α) for T = α·(any projection); on a tied model "
        "copying = sign(α) is algebra only for T = α·Π with Π an orthogonal projection (docs/definitions.md §12): "
        "each closed head's distance from one is in the table, and the non-closed heads' rate beside it. Direct "
        "effects only: indirect paths and self-repair are not measured."
    )


def roles_section(assoc: Any, threshold: float) -> dict[str, Any]:
    """The page's section "What the closed heads do" of a ``rep.roles(...)`` result (:func:`report_html`'s
    ``sections``): its tables (:func:`roles_section_tables`), the note on what was measured, the figure of each
    role's score against P, and the page headline's "Roles: ..." sentence."""
    tabs = roles_section_tables(assoc, threshold)
    return {
        "id": "roles",
        "title": "What the closed heads do",
        "note": f"{assoc.headline} {_roles_note(assoc)}",
        "tables": [
            ("Role scores of the closed heads, by P", tabs["closed"] if len(tabs["closed"]) else ""),
            ("The closed heads next to all heads", tabs["beside"]),
            ("Association of each role with closure", tabs["association"]),
            ("The top heads of each role", tabs["top"]),
        ],
        "figures": [roles_figure(assoc)],
        "headline": f"Roles: {assoc.headline}",
    }


def mechanism_section(mech: Any, threshold: float) -> dict[str, Any]:
    """The page's section "What the closed heads do to tokens" of a ``rep.mechanism(...)`` result
    (:func:`report_html`'s ``sections``): the closed heads' rows and the signed scores by sign
    (:func:`mechanism_section_tables`), the note, and the figure."""
    mtabs = mechanism_section_tables(mech, threshold)
    return {
        "id": "mechanism",
        "title": "What the closed heads do to tokens",
        "note": _mechanism_note(mech),
        "tables": [
            ("The closed heads, by P", mtabs["closed"] if len(mtabs["closed"]) else ""),
            ("Closed heads against matched controls and base rates", mtabs["compared"]),
            ("Signed scores by sign", mtabs["signs"]),
        ],
        "figures": [mechanism_figure(mech)],
    }


def report_html(
    rep: Any,
    extra_html: list[str] | None = None,
    roles: Any = None,
    mechanism: Any = None,
    *,
    sections: Sequence[Mapping[str, Any]] = (),
) -> str:
    """The standalone report page as a string (plotly.js inlined once; no remote scripts).

    Args:
        rep: the report.
        extra_html: HTML blocks after the sections.
        roles: a ``rep.roles(model=...)`` result of this report (already checked by the caller); adds the section
            "What the closed heads do" (:func:`roles_section`).
        mechanism: a ``rep.mechanism(...)`` result of this report (checked by the caller); adds the section "What
            the closed heads do to tokens" (:func:`mechanism_section`).
        sections: the joined probes' sections, in order after the report's own (what a join's declaration returns
            for the page, ``report/joins.py``; the report layer passes these instead of ``roles``/``mechanism``):
            each a mapping with ``id``, ``title``, ``note``, ``tables`` (``(caption, DataFrame or HTML)`` pairs; an
            empty one reads "None."), ``figures`` and ``folded`` (figures: drawn here, plotly.js inlined once),
            ``folded_title``, and ``headline`` (a sentence added to the page's headline); or ``html``, a block
            placed after the sections (the attention view), with no heading of the page's own.
    """
    import jinja2

    first = True

    def div(fig: Any) -> str:
        nonlocal first
        out = _fig_div(fig, first)
        first = False
        return out

    heat = div(heads_heatmap_spec(rep))
    more = [dict(sec) for sec in sections]
    shown: list[dict[str, Any]] = []  # the page's sections: the report's own, then the joined probes'
    s = rep.summary
    if "P_scrambled_median" in rep.heads.columns:
        shown.append(
            {
                "id": "controls",
                "title": "Null controls: orientation scramble and O/V mismatch",
                "note": "Each head's P against its own scramble null (same singular values, spans and "
                "principal angles; Haar-random orientation), and per layer the matched O/V mismatch.",
                "figures": [div(f) for f in scramble_figures(rep)],
                "folded": [],
            }
        )
    alg = rep.algebra
    if alg is not None:
        if alg.empty:
            shown.append(
                {"id": "algebra", "title": "Shared-value algebra", "note": alg.reason, "figures": [], "folded": []}
            )
        else:
            per_layer = [div(f) for f in algebra_figures(alg)]
            a = alg.summary
            shown.append(
                {
                    "id": "algebra",
                    "title": "Shared-value algebra (GQA kv groups)",
                    "note": (
                        f"{a['n_groups']} kv groups; median off-diagonal P_ij {a['median_P_offdiag']:.3g} "
                        f"(the right-action law T_i T_j = α_j T_i predicts 1); median α spread "
                        f"{a['median_alpha_spread']:.3g} (law: 0)."
                    ),
                    "figures": [div(algebra_summary_figure(alg))],
                    "folded": per_layer,
                    "folded_title": f"Per-layer α_ij and P_ij matrices ({len(per_layer)} layers)",
                }
            )
    if roles is not None:  # ``rep.roles(...)`` of this report (checked by the caller)
        more.insert(0, roles_section(roles, rep.threshold))
    if mechanism is not None:  # ``rep.mechanism(...)`` of this report (checked by the caller)
        more.insert(1 if roles is not None else 0, mechanism_section(mechanism, rep.threshold))
    extra = list(extra_html or [])
    lead = headline(s, rep.threshold)
    for sec in more:  # the joined probes' sections, drawn in their order after the report's own
        if sec.get("headline"):
            lead += f" {sec['headline']}"
        if sec.get("html") is not None:  # a block after the sections (the attention view)
            extra.append(str(sec["html"]))
            continue
        shown.append(
            {
                "id": sec["id"],
                "title": sec["title"],
                "note": sec.get("note", ""),
                "tables": [
                    (cap, _table_html(t) if isinstance(t, pd.DataFrame) else t) for cap, t in sec.get("tables", [])
                ],
                "figures": [div(f) for f in sec.get("figures", ())],
                "folded": [div(f) for f in sec.get("folded", ())],
                "folded_title": sec.get("folded_title", ""),
            }
        )
    paper = rep.paper_table(formatted=True)
    template = resources.files("tl_idempotence").joinpath("data/report.html.j2").read_text(encoding="utf-8")
    env = jinja2.Environment(autoescape=jinja2.select_autoescape(default=True))
    heads = _display_frame(rep.heads.reset_index(), rep.threshold)
    return env.from_string(template).render(
        title=f"Idempotence report: {s.model_name}",
        headline=lead,
        threshold=f"{rep.threshold:g}",
        n_closed=int(s.closure.n_closed),
        closed_table=_table_html(closed_heads_table(rep)),
        closed_note=_p_value_note(rep),
        heatmap=heat,
        paper_table=_table_html(paper),
        paper_note=(
            "paper: the figures of the paper's abstract (arXiv 2609.01129), over the models it surveyed; "
            "rows that say 'not run' need an analysis this report did not run."
        ),
        sections=shown,
        # the first screen names every section this run computed (the sections after the fixed three)
        contents=[
            ("closed-heads", "near-idempotent heads"),
            ("heatmap", "P over layer × head"),
            ("paper", "this model next to the paper"),
            *((sec["id"], sec["title"]) for sec in shown),
            ("details", "details: every head and layer, the summary"),
        ],
        extra_html=extra,
        n_heads=len(rep.heads),
        n_layers=len(rep.layers),
        heads_table=_datatable(heads),
        layers_table=_datatable(_display_frame(rep.layers, rep.threshold)),
        summary_tables=summary_sections(s),
        datatables_init=_datatables_init(),
    )
