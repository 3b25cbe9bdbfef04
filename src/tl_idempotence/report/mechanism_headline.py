"""The sentence a mechanism result leads with (SPEC 12-13): what holds and what does not, each with its size and floor.

:func:`mechanism_headline` reads only the summary (what :func:`~tl_idempotence.report.mechanism_stats.derive_tests`
and :func:`~tl_idempotence.report.mechanism_controls.derive_controls` give) and the embedding tie, so a loader
recomputes it from a saved table. In order: the question and its answer by the sign test among the closed heads,
with the agreement count's bootstrap interval; the matched-control comparison (the answer is "Yes" only when the
closed heads also beat their controls; "against chance (matched controls not measured)" when the summary has no
comparison, a result read from a 0.3.0 save); the Spearman test within layers with the across-layers p beside it; the
stability across text sets; the copy-suppression split; the weights-only results with their base rates among the
non-closed heads and the closed heads' distance from the algebra's case; the tie of the embeddings.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from ..probes.tied import EmbeddingTie
from .mechanism_stats import LEVEL, sign_test_floor

__all__ = ["NEAR_PROJECTION", "QUESTION", "fmt_p", "mechanism_headline"]

#: The question every headline asks first.
QUESTION = "Does sign(α) predict the sign of a closed head's direct effect on the token it attends to?"

_SIZE = {"abs_alpha": "|α|", "norm": "‖T‖"}
#: A closed head whose ``T/α`` is within this relative distance of an orthogonal projection is "near" one.
NEAR_PROJECTION = 0.1


def fmt_p(p: Any) -> str:
    """A p-value as the headlines write it ("undefined" for NaN or None). Raises nothing."""
    if p is None or not math.isfinite(p):
        return "undefined"
    return f"{p:.2g}" if p >= 1e-3 else f"{p:.1e}"


def _first(s: Mapping[str, Any]) -> str:
    """The question, the answer and the sign test."""
    n, k, p = s["n_sign_tested"], s["n_agree"], s["sign_test_p"]
    if s["n_closed"] == 0:
        return f"{QUESTION} No head is closed"
    if n == 0:
        return (
            f"{QUESTION} Undefined: no closed head of {s['n_closed']} has both α ≠ 0 and a direction (effect - null "
            "with more positions one way than the other)"
        )
    agree = (
        f"{k} of {n} closed heads agree (direction: the sign of effect - null, what each head's test tests; "
        f"two-sided sign test p = {fmt_p(p)}"
    )
    floor = sign_test_floor(n)
    boot = s.get("stability") or {}
    if boot.get("n_agree") is not None and math.isfinite(boot.get("n_agree_lo", math.nan)):
        agree += f"; {boot['level']:.0%} bootstrap interval {boot['n_agree_lo']:g}-{boot['n_agree_hi']:g} heads"
    if floor > LEVEL:
        return (
            f"{QUESTION} Too few closed heads to tell: {agree}, and with {n} heads it cannot be below "
            f"{floor:.3g} > {LEVEL:g})"
        )
    if not (math.isfinite(p) and p <= LEVEL):
        return f"{QUESTION} Not detectably: {agree})"
    answer = "Yes" if 2 * k > n else "The opposite"
    mp = ((s.get("matched") or {}).get("agreement") or {}).get("p_value", math.nan)
    if s.get("matched") is None:  # a result read from a 0.3.0 save: its summary says so ("not_measured")
        answer += " against chance (matched controls not measured)"
    elif mp is None or not math.isfinite(mp):
        answer += " against chance (no matched control to compare with)"
    elif mp > LEVEL:
        answer += " against chance, but not beyond matched controls"
    else:
        answer += ", beyond matched controls"
    return f"{QUESTION} {answer}: {agree})"


def _matched(s: Mapping[str, Any]) -> str | None:
    m = s.get("matched") or {}
    a, e = m.get("agreement") or {}, m.get("aligned") or {}
    if not m or not s["n_closed"]:
        return None
    size = _SIZE.get(str(m.get("by")), str(m.get("by")))
    if a.get("method") == "none":
        return f"no closed head has a control of its layer with a direction (matched on {size})"
    text = (
        f"against {a['n_controls']} non-closed heads of the same layers matched on {size}, the {a['n_closed']} "
        f"closed heads agree at {a['value_closed']:.0%} vs {a['value_controls']:.0%} (difference "
        f"{a['difference']:+.2f}, {a['method']} within-layer p = {fmt_p(a['p_value'])}, floor {a['p_floor']:.2g})"
    )
    if e.get("method") != "none":
        text += (
            f"; effect - null in the direction of α: median {e['value_closed']:+.2g} vs {e['value_controls']:+.2g} "
            f"(p = {fmt_p(e['p_value'])})"
        )
    return text


def _spearman(s: Mapping[str, Any]) -> str:
    rho = s["spearman_rho"]
    if not math.isfinite(rho):
        return f"across {s['n_spearman']} heads the Spearman correlation of α·P with the effect is undefined"
    return (
        f"across {s['n_spearman']} heads, Spearman ρ(α·P, effect) = {rho:+.2f} (within-layer permutation p = "
        f"{fmt_p(s['spearman_p'])}, {s['n_strata']} layers with two or more heads; across layers p = "
        f"{fmt_p(s['spearman_p_unstratified'])}, which depth confounds)"
    )


def _stability(s: Mapping[str, Any]) -> str | None:
    st = s.get("stability") or {}
    if st.get("n_sets", 1) < 2 or not st.get("n_compared"):
        return None
    by_set = ", ".join(str(x) for x in st["n_agree_by_set"])
    return (
        f"across {st['n_sets']} text sets {st['n_kept']} of {st['n_compared']} closed heads keep their direction "
        f"({st['n_changed']} change it; agreement by set {by_set})"
    )


def _condition(s: Mapping[str, Any]) -> str | None:
    c = s.get("copy_suppression") or {}
    if c.get("k") is None or not s["n_closed"]:
        return None
    pr, un = c["predicted"], c["unpredicted"]
    share = c["n_positions_predicted"] / c["n_positions"] if c["n_positions"] else math.nan
    return (
        f"where the attended token is already among the top {c['k']} at the head's input ({share:.1%} of the closed "
        f"heads' positions) {pr['n_agree']} of {pr['n_tested']} agree and {pr['n_lower']} lower it, elsewhere "
        f"{un['n_agree']} of {un['n_tested']} agree and {un['n_lower']} lower it"
    )


def _weights(s: Mapping[str, Any], tie: EmbeddingTie) -> str:
    text = f"the model {tie.describe()}"
    br = s.get("base_rates") or {}
    c, o = br.get("copying") or {}, br.get("copying_own") or {}
    if c.get("n_closed"):
        text += (
            f"; weights: sign(copying) = sign(α) for {c['k_closed']} of {c['n_closed']} closed heads and "
            f"{c['rate_other']:.0%} of {c['n_other']} non-closed heads (chance of {c['k_closed']} or more at that rate "
            f"{fmt_p(c['binomial_tail_p'])}, Fisher p = {fmt_p(c['fisher_p'])})"
        )
    if not (tie.tied and s["n_closed"]):
        return text
    if o.get("n_closed"):
        text += (
            f"; T's own eigenvalues (G = I) give the sign of α for {o['k_closed']} of {o['n_closed']} closed heads and "
            f"{o['rate_other']:.0%} of {o['n_other']} non-closed heads (real median |copying| among the closed "
            f"{s['median_abs_copying_closed']:.3f})"
        )
    pj = s.get("projection") or {}
    if pj.get("n_measured"):
        lo, hi = pj["proj_distance_min"], pj["proj_distance_max"]
        which = "near" if hi <= NEAR_PROJECTION else ("not" if lo > NEAR_PROJECTION else "not all")
        text += (
            "; with tied embeddings 'closed ⇒ copying = sign(α)' is algebra only for T = α·Π with Π an orthogonal "
            f"projection, and the closed heads are {which} orthogonal projections (‖T - Tᵀ‖/‖T‖ "
            f"{pj['asymmetry_min']:.2f}-{pj['asymmetry_max']:.2f}; distance of T/α from the nearest "
            f"{lo:.2f}-{hi:.2f})"
        )
    return text


def mechanism_headline(s: Mapping[str, Any], tie: EmbeddingTie) -> str:
    """The headline of a mechanism summary ``s`` (module docstring). Raises nothing for a summary its derivations
    made."""
    parts = [_first(s), _matched(s), _spearman(s), _stability(s), _condition(s), _weights(s, tie)]
    return "; ".join(p for p in parts if p) + "."
