"""The causal test of closure drawn (``rep.causal``, SPEC 13): its section of the report page and its notebook display,
from the result only (its ``comparison``, ``table`` and ``summary``; nothing recomputed)."""

from __future__ import annotations

import html
from typing import Any

import pandas as pd

from .text import format_P, format_sig

__all__ = ["causal_html", "causal_section", "causal_tables"]

#: What the page and the display say each variant and sign means.
CONVENTIONS = (
    "Each closed head and its matched controls (non-closed heads of the same layer, nearest in size) have their OV "
    "edited at hook_z: closure_free (the nearest OV with α = P = 0), closure_only (the head reduced to its closure, "
    "T_c² = α T_c), zero and mean ablation. Every change is edited − clean at each counted destination, for the token "
    "the head attends to most there: total = the change of its final logit (through every later layer), direct = the "
    "head's own path through the final norm at the clean scale, self-repair = direct − total (the part of the direct "
    "change the rest of the model takes back: negative when it compensates a drop, positive when it amplifies), Δ loss "
    "= the next-token cross-entropy change (nats). Per head: medians over positions (the loss: the mean); closed "
    "against controls: the mean over heads, a two-sided p from relabelling closed and control within each layer "
    "(exact where the relabellings are few), Benjamini-Hochberg q over the comparisons, and the smallest p that "
    "relabelling can give."
)


def _num(x: Any) -> str:
    return format_sig(float(x), None, sig=3)


def causal_tables(result: Any) -> dict[str, pd.DataFrame]:
    """The page's tables as display strings: ``comparison`` (one row per variant and quantity) and ``heads`` (closed
    heads by layer, each followed by its controls; per variant the median total change, self-repair and Δ loss)."""
    c = result.comparison
    comp = pd.DataFrame({
        "variant": c["variant"], "quantity": c["quantity"], "closed (mean)": [_num(x) for x in c["closed"]],
        "controls (mean)": [_num(x) for x in c["controls"]], "difference": [_num(x) for x in c["difference"]],
        "p": [_num(x) for x in c["p_value"]], "BH q": [_num(x) for x in c["q_value"]],
        "p floor": [_num(x) for x in c["p_floor"]], "method": c["method"],
        "heads": [f"{a} vs {b}" for a, b in zip(c["n_closed"], c["n_controls"], strict=True)],
    })  # fmt: skip
    t = result.table
    threshold = float(result.summary["threshold"])
    rows = []
    for lab, r in t.sort_values(["layer", "group", "head"], kind="stable").iterrows():
        row = {
            "head": lab, "group": r["group"], "matched with": r["matched_with"], "α": f"{r['alpha']:.4g}",
            "P": format_P(r["P"], threshold),
        }  # fmt: skip
        for v in result.summary["variants"]:
            why = str(r[f"reason_{v}"])
            row[f"{v}: total / self-repair / Δ loss"] = (
                f"{_num(r[f'total_{v}'])} / {_num(r[f'self_repair_{v}'])} / {_num(r[f'loss_{v}'])}"
                + (f" ({why})" if why else "")
            )
        rows.append(row)
    return {"comparison": comp, "heads": pd.DataFrame(rows)}


def causal_section(result: Any) -> dict[str, Any]:
    """The page's section "A causal test of closure" of a ``rep.causal(...)`` result (the page's ``sections``)."""
    tabs = causal_tables(result)
    notes = list(result.summary.get("notes") or [])
    return {
        "id": "causal",
        "title": "A causal test of closure",
        "note": f"{result.headline} {CONVENTIONS}" + (f" Notes: {' '.join(notes)}" if notes else ""),
        "tables": [
            ("Closed heads against matched controls", tabs["comparison"]),
            ("Each head (medians over positions)", tabs["heads"] if len(tabs["heads"]) else ""),
        ],
        "headline": "Causal test: " + _short(result),
    }


def _short(result: Any) -> str:
    """The page headline's sentence: the verdict of the headline (its last sentences)."""
    text = str(result.headline)
    cut = text.find(" Holds (q <=")
    return text[cut + 1 :] if cut >= 0 else text


def causal_html(result: Any) -> str:
    """The notebook display of a causal test: the headline, the comparison, the heads folded."""
    tabs = causal_tables(result)
    out = f"<div><b>{html.escape(type(result).__name__)}</b><p>{html.escape(str(result.headline))}</p>"
    out += tabs["comparison"].to_html(index=False, border=0, escape=True)
    out += (
        f"<details><summary>heads ({len(tabs['heads'])}: closed and controls)</summary>"
        f"{tabs['heads'].to_html(index=False, border=0, escape=True)}</details>"
    )
    return out + f"<p style='font-size:11px'>{html.escape(CONVENTIONS)}</p></div>"
