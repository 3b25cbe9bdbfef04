"""A mechanism saved by version 0.3.0 (``mechanism/1``, commit 13de6bd) in this version's layout
(:mod:`tl_idempotence.core.legacy`; registered by :mod:`.mechanism_store`).

A 0.3.0 save holds the joined table (``P, α, closed, α·P``, the probes' columns and both copying scores of the
joined heads), its signs, a summary (the sign test by the sign of the median effect, an across-layers Spearman
test, the headline) and its two parts. The upgrade first checks it **as written**: the columns and summary fields
0.3.0 wrote, and every number 0.3.0 derived from its table recomputed with 0.3.0's rules (``sign_agrees``, the sign
test, the signs, the copying counts, ρ and its permutation p, the notes, the headline); a folder that disagrees is
refused naming its record. Then, in memory:

* **recomputed** from the saved tables with this version's rules: the parts through their own upgrades
  (:mod:`tl_idempotence.probes.legacy`), each head's ``median_diff`` and ``direction`` (the effect's tested
  direction) and so ``sign_agrees``, the sign test, ``agrees_alpha``, ``aligned_diff``, the signs, the Spearman test
  within layers and across them (the latter is 0.3.0's own p, checked equal), the copying counts and the headline;
  every joined head is ``asked`` (0.3.0 joined no control);
* **not measured** (:data:`V030_NOT_MEASURED`, in ``summary["not_measured"]`` and at the end of the headline):
  what needs the weights of every head the report measured or the model itself: the matched controls (0.3.0 kept
  only the joined heads' weights; ``control_of`` is empty, ``summary["matched"]`` None, and the headline's answer
  says "against chance (matched controls not measured)", never a bare "Yes"), the base rates over the non-closed
  heads (``summary["base_rates"]`` None, ``weights``' ``norm`` NaN), the projection facts (NaN, ranks -1,
  ``summary["projection"]`` None), the bootstrap intervals (they are over the closed heads *and their controls*:
  NaN, ``summary["stability"]`` None) and the copy-suppression split (the effect part's, ``summary
  ["copy_suppression"]`` None).

:func:`derived_v030` is what a loader recomputes for such a result (also once it is saved again in this version's
layout, with its ``not_measured`` field, and read back).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..core.frozen import thawed
from ..core.jsonio import json_restore
from ..core.legacy import NOT_MEASURED, not_in_save, pending_headline
from ..core.records import float_keys, json_like, same_value
from ..core.selection import head_labels
from ..core.stats import spearman_permutation
from ..errors import ReportFileError
from ..probes.legacy import V030, malformed_v030
from ..probes.tied import EmbeddingTie
from .mechanism_controls import DERIVED_COLUMNS, STABILITY_COLUMNS, WEIGHT_COLUMNS
from .mechanism_headline import QUESTION, fmt_p
from .mechanism_stats import agreement, derive_tests, joined_reasons, sign_summary, stream
from .mechanism_tables import (
    COPYING_OWN_CONVENTION,
    PROJECTION_COLUMNS,
    ROLE_COLUMNS,
    SIGNS_COLUMNS,
    TABLE_COLUMNS,
    check_part_summary,
)

__all__ = [
    "V030_MECHANISM_FORMAT",
    "V030_MECHANISM_SUMMARY",
    "V030_NOT_MEASURED",
    "V030_TABLE_COLUMNS",
    "check_unmeasured_v030",
    "derived_v030",
    "mechanism_v030",
]

V030_MECHANISM_FORMAT = "tl_idempotence.mechanism/1"
#: The joined table of 0.3.0 (the roles' columns may follow).
V030_TABLE_COLUMNS = TABLE_COLUMNS[: TABLE_COLUMNS.index("sign_agrees") + 1]
#: The summary fields of 0.3.0.
V030_MECHANISM_SUMMARY = frozenset({
    "model_name", "n_heads", "n_closed", "threshold", "n_sign_tested", "n_agree", "sign_test_p", "n_spearman",
    "spearman_rho", "spearman_p", "n_permutations", "p_floor", "seed", "tied", "embedding_tie",
    "n_closed_own_sign_alpha", "median_abs_copying_closed", "notes", "conventions", "head_tokens",
    "attended_token_effect", "headline",
})  # fmt: skip
_AGAIN = "rep.mechanism(model, texts=...)"
#: What a 0.3.0 mechanism does not hold, and why (``summary["not_measured"]`` of the upgraded result).
V030_NOT_MEASURED = {
    "the matched controls (control_of, summary['matched'])": not_in_save(
        V030, f"{_AGAIN}; it holds the joined heads' weights only, not every measured head's"
    ),
    "the base rates among non-closed heads (summary['base_rates'], weights' norm)": not_in_save(V030, _AGAIN),
    "the projection facts (" + ", ".join(PROJECTION_COLUMNS) + ", summary['projection'])": not_in_save(V030, _AGAIN),
    "the bootstrap intervals (*_lo, *_hi, direction_stability, summary['stability'])": not_in_save(
        V030, f"{_AGAIN}; they cover the matched controls too"
    ),
    "the copy-suppression split (n_predicted, *_predicted, *_unpredicted, summary['copy_suppression'])": not_in_save(
        V030, _AGAIN
    ),
}
#: The parts a 0.3.0 save can list.
_PARTS = (["head_tokens"], ["attended_token_effect"], ["head_tokens", "attended_token_effect"])
#: The summary sections of this version a 0.3.0 save cannot give (None in the upgraded summary).
V030_SECTIONS = ("matched", "base_rates", "projection", "stability", "copy_suppression")


def _edited(rec: Path, what: str) -> ReportFileError:
    return ReportFileError(f"{rec} was edited: {what}, not what {V030} wrote. Make it again with {_AGAIN}.")


def _old_tests(table: pd.DataFrame, n_perm: int, seed: int) -> tuple[Any, pd.DataFrame, dict[str, Any]]:
    """0.3.0's own derivation from its table: ``sign_agrees`` by the sign of the median effect, the signs of
    ``alpha, effect_median, copying, copying_own``, the counts and the Spearman test across every head (0.3.0's
    stream: this version's ``spearman_p_unstratified``)."""
    from scipy.stats import binomtest

    alpha, eff = table["alpha"].to_numpy(dtype=float), table["effect_median"].to_numpy(dtype=float)
    closed = table["closed"].to_numpy(dtype=bool)
    tested = closed & np.isfinite(alpha) & (alpha != 0) & np.isfinite(eff) & (eff != 0)
    agrees = np.sign(alpha) == np.sign(eff)
    sign_agrees = pd.array([bool(a) if t else pd.NA for a, t in zip(agrees, tested, strict=True)], dtype="boolean")
    n, k = int(tested.sum()), int((agrees & tested).sum())
    notes = [] if n else ["sign test undefined: no closed head with α ≠ 0 and a nonzero median effect"]
    rows = []
    for col in ("alpha", "effect_median", "copying", "copying_own"):
        v = table[col].to_numpy(dtype=float)
        for group, mask in (("closed", closed), ("all", np.ones(len(v), dtype=bool))):
            rows.append({"quantity": col, "group": group, **sign_summary(v[mask])})
    ap = table["alpha_P"].to_numpy(dtype=float)
    ok = np.isfinite(ap) & np.isfinite(eff)
    rho, p_rho = spearman_permutation(ap[ok], eff[ok], n_perm, stream(seed, 0))  # 0.3.0's stream and test
    if int(ok.sum()) < 3:
        notes.append(f"Spearman undefined: {int(ok.sum())} head(s) with a defined α·P and effect (need 3)")
    elif not math.isfinite(rho):
        notes.append("Spearman undefined: α·P or the effect is constant over the heads")
    own_v = table["copying_own"].to_numpy(dtype=float)
    cv = np.abs(table["copying"].to_numpy(dtype=float))[closed]
    stats = {
        "n_sign_tested": n,
        "n_agree": k,
        "sign_test_p": float(binomtest(k, n, 0.5).pvalue) if n else math.nan,
        "n_spearman": int(ok.sum()),
        "spearman_rho": rho,
        "spearman_p": p_rho,
        "n_closed_own_sign_alpha": int(
            (closed & np.isfinite(own_v) & (np.sign(own_v) == np.sign(alpha)) & (alpha != 0)).sum()
        ),
        "median_abs_copying_closed": float(np.median(cv[np.isfinite(cv)])) if np.isfinite(cv).any() else math.nan,
        "notes": "; ".join(notes),
    }
    return sign_agrees, pd.DataFrame(rows), stats


def _old_headline(s: Mapping[str, Any], tie: EmbeddingTie) -> str:
    """0.3.0's headline of its summary ``s``."""
    n, k, p = s["n_sign_tested"], s["n_agree"], s["sign_test_p"]
    if s["n_closed"] == 0:
        first = f"{QUESTION} No head is closed"
    elif n == 0:
        first = f"{QUESTION} Undefined: no closed head of {s['n_closed']} has both α ≠ 0 and a nonzero median effect"
    else:
        answer = ("Yes" if 2 * k > n else "The opposite") if math.isfinite(p) and p <= 0.05 else "Not detectably"
        first = f"{QUESTION} {answer}: {k} of {n} closed heads agree (two-sided sign test p = {fmt_p(p)})"
    rho = s["spearman_rho"]
    second = (
        f"across {s['n_spearman']} heads, Spearman ρ(α·P, effect) = {rho:+.2f} (permutation p = "
        f"{fmt_p(s['spearman_p'])})"
        if math.isfinite(rho)
        else f"across {s['n_spearman']} heads the Spearman correlation of α·P with the effect is undefined"
    )
    third = f"the model {tie.describe()}"
    if tie.tied and s["n_closed"]:
        third += (
            f"; T's own eigenvalues (G = I) give copying of the sign of α for {s['n_closed_own_sign_alpha']} of "
            f"{s['n_closed']} closed heads (real median |copying| among them {s['median_abs_copying_closed']:.3f}): "
            "that part of 'closed ⇒ copying = sign(α)' is algebra"
        )
    return f"{first}; {second}; {third}."


def _check_as_written(rec: Path, table: pd.DataFrame, signs: pd.DataFrame, s: Mapping[str, Any]) -> EmbeddingTie:
    """Refuse a 0.3.0 record whose fields are not what 0.3.0 derived from its table (names ``rec``)."""
    cols = tuple(table.columns)
    if cols not in (V030_TABLE_COLUMNS, (*V030_TABLE_COLUMNS, *ROLE_COLUMNS)) or tuple(signs.columns) != SIGNS_COLUMNS:
        raise _edited(rec, "its table or signs have other columns")
    if set(s) != V030_MECHANISM_SUMMARY:
        raise _edited(rec, f"its summary has fields {sorted(set(s) ^ V030_MECHANISM_SUMMARY)[:5]} (added or missing)")
    tie = EmbeddingTie(**s["embedding_tie"])
    agrees, old_signs, stats = _old_tests(table, int(s["n_permutations"]), int(s["seed"]))
    if not same_value([None if pd.isna(x) else bool(x) for x in table["sign_agrees"]], [
            None if pd.isna(x) else bool(x) for x in agrees]):  # fmt: skip
        raise _edited(rec, "table.parquet's 'sign_agrees' is not its effect's sign against α's")
    if not all(same_value(signs[c].tolist(), old_signs[c].tolist()) for c in SIGNS_COLUMNS):
        raise _edited(rec, "signs.parquet is not the table's signs")
    for key, v in {**stats, "n_closed": int(table["closed"].sum())}.items():
        if not same_value(json_like(s[key]), json_like(v)):
            raise _edited(rec, f"summary[{key!r}] is {s[key]!r} but {v!r} from the table")
    if s["headline"] != _old_headline(s, tie):
        raise _edited(rec, "summary['headline'] is not the summary's")
    conv = s["conventions"]
    for part, key in (("head_tokens", "tokens"), ("attended_token_effect", "effect")):
        if conv.get(key) != (s[part] or {}).get("convention"):
            raise _edited(rec, f"summary['conventions'][{key!r}] is not summary[{part!r}]'s")
    return tie


def _part(d: Path, name: str, summary: Mapping[str, Any]) -> Any:
    """The part ``name`` loaded by its own loader (its 0.3.0 upgrade), its record's summary as written checked to be
    the mechanism's ``summary[name]``."""
    check_part_summary(d, name, summary)
    if name == "head_tokens":
        from ..probes.head_tokens import load_head_tokens

        return load_head_tokens(d / name)
    from ..probes.token_effect import load_attended_token_effect

    return load_attended_token_effect(d / name)


def check_unmeasured_v030(ft: Path, fw: Path, table: pd.DataFrame, weights: pd.DataFrame) -> None:
    """Refuse the tables of a mechanism read from a 0.3.0 save whose unmeasured columns hold a number (the projection
    facts NaN, their ranks -1, ``weights``' ``norm`` NaN) or whose weights are not of the joined heads (names the
    file)."""
    for col in PROJECTION_COLUMNS:
        v = table[col].to_numpy(dtype=float)
        if not ((v == -1).all() if col.startswith("proj_rank") else np.isnan(v).all()):
            raise ReportFileError(f"{ft}: {col!r} holds numbers a {V030} save does not measure: it was edited.")
    if list(weights.index) != list(table.index) or not np.isnan(weights["norm"].to_numpy(dtype=float)).all():
        raise ReportFileError(f"{fw}: not the joined heads' weights with no norm ({V030} save): it was edited.")


def derived_v030(table: pd.DataFrame, summary: Mapping[str, Any]) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    """What the tables of a mechanism read from a 0.3.0 save give (module docstring): the table with its derived
    columns (the controls' and the bootstrap's not measured: empty, NaN, NA), the signs and the summary fields
    :data:`~tl_idempotence.report.mechanism_tables.RECOMPUTED` (the sections of :data:`V030_SECTIONS` None).

    Raises:
        KeyError / TypeError / ValueError: a summary without ``seed`` or ``n_permutations``.
    """
    base = table.drop(columns=["sign_agrees", *DERIVED_COLUMNS], errors="ignore")
    agrees, signs, stats = derive_tests(base, int(summary["n_permutations"]), int(summary["seed"]))
    out = base.copy()
    n = len(out)
    alpha = out["alpha"].to_numpy(dtype=float)
    out["sign_agrees"] = agrees
    out["control_of"] = [""] * n
    out["agrees_alpha"] = agreement(alpha, out["direction"].to_numpy(dtype=float))
    with np.errstate(invalid="ignore"):
        sign = np.where(np.isfinite(alpha) & (alpha != 0), np.sign(alpha), np.nan)
        out["aligned_diff"] = sign * out["median_diff"].to_numpy(dtype=float)
    for col in DERIVED_COLUMNS[3:8]:
        out[col] = np.full(n, np.nan)
    out["direction_kept"] = pd.arrays.BooleanArray(np.zeros(n, dtype=bool), np.ones(n, dtype=bool))
    extra = [c for c in out.columns if c not in TABLE_COLUMNS]
    return out[[*TABLE_COLUMNS, *extra]], signs, {**stats, **dict.fromkeys(V030_SECTIONS)}


def mechanism_v030(rec: Path, fields: dict[str, Any], tables: dict[str, Any]) -> tuple[dict, dict] | None:
    """The upgrade of a 0.3.0 mechanism save (module docstring; :data:`~tl_idempotence.core.legacy.Upgrade`)."""
    if fields.get("format") != V030_MECHANISM_FORMAT:
        return None
    try:
        parts = fields.get("parts")
        if set(tables) != {"table", "signs"} or parts not in ([], *_PARTS):
            raise _edited(rec, f"it lists tables {sorted(tables)} and parts {parts!r}")
        if "attended_token_effect" not in parts:
            raise ReportFileError(
                f"{rec}: a {V030} mechanism saved without its attended-token effect (parts {parts!r}): each head's "
                f"tested direction, the sign test and every comparison need its positions. Make it again with {_AGAIN}."
            )
        s = json_restore(fields["summary"], frozenset(fields["float_keys"]), int_keys=False)
        old = tables["table"]
        tie = _check_as_written(rec, old, tables["signs"], s)
        d = rec.parent
        loaded = {name: _part(d, name, s) for name in parts}
        effect, tokens = loaded["attended_token_effect"], loaded.get("head_tokens")
        labels = list(head_labels(old["layer"].to_numpy(dtype=np.int64), old["head"].to_numpy(dtype=np.int64)))
        t = old.drop(columns="sign_agrees").set_axis(labels)
        e = effect._table.loc[labels]
        for col in ("median_diff", "direction"):
            t[col] = e[col].to_numpy(dtype=float)
        none = pd.DataFrame(index=labels)
        t["reason"] = joined_reasons(labels, e, none if tokens is None else tokens._table.loc[labels], none, none)
        t["asked"] = True
        for col in PROJECTION_COLUMNS:
            t[col] = np.full(len(t), -1, dtype=np.int64) if col.startswith("proj_rank") else np.nan
        for col in TABLE_COLUMNS[TABLE_COLUMNS.index("n_predicted") :]:
            t[col] = e[col].to_numpy()
        summary: dict[str, Any] = {
            "model_name": s["model_name"], "n_heads": len(t), "n_closed": int(t["closed"].sum()), "n_asked": len(t),
            "threshold": s["threshold"],
        }  # fmt: skip
        table, signs, stats = derived_v030(t, {**s, "settings": None})
        weights = table.loc[:, [c for c in WEIGHT_COLUMNS if c != "norm"]].assign(norm=np.nan)
        weights = weights.loc[:, list(WEIGHT_COLUMNS)].reset_index(drop=True)
        closed = list(table.index[table["closed"].to_numpy(dtype=bool)])
        stability = pd.DataFrame({"label": closed, "set": "set0", "direction": table.loc[closed, "direction"]})
        summary.update(
            **stats,
            n_permutations=s["n_permutations"], p_floor=s["p_floor"], seed=s["seed"], tied=tie.tied,
            embedding_tie=s["embedding_tie"],
            conventions={"effect": effect.summary.get("convention"), "tokens": s["conventions"]["tokens"],
                         "copying_own": COPYING_OWN_CONVENTION},
            head_tokens=s["head_tokens"] if tokens is None else thawed(tokens.summary),
            attended_token_effect=thawed(effect.summary),
            settings={"match_by": None, "n_controls": None, "n_boot": None, "sets": ["set0"],
                      "predicted_k": effect.summary.get("predicted_k")},
            headline=pending_headline(),
        )  # fmt: skip
        summary[NOT_MEASURED] = dict(V030_NOT_MEASURED)
    except ReportFileError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise malformed_v030(rec, e) from e
    new = {**fields, "summary": summary, "float_keys": sorted(float_keys({"summary": summary}))}
    cols = list(STABILITY_COLUMNS)
    return new, {
        "table": table.reset_index(drop=True),
        "signs": signs.reset_index(),
        "weights": weights,
        "stability": stability.reset_index(drop=True)[cols].astype({"direction": float}),
    }
