"""What holds a mechanism's finding up (SPEC 13; docs/definitions.md §13): matched controls, base rates, the
distance from the algebra's case, stability and the copy-suppression condition, computed from a mechanism's tables.

:func:`derive_controls` gives, from the joined table, the weights-only table of every measured head, the attended-
token effect's positions and the per-set directions, every derived column and summary section below; ``rep.mechanism``
makes a result with it and :func:`~tl_idempotence.report.mechanism.load_mechanism` recomputes a saved one with it.

* **Matched controls** (:func:`~tl_idempotence.core.matching.match_controls`): each joined closed head's ``k``
  non-closed heads of the **same layer** nearest in size (``|α|``, or ``‖T‖_F`` with ``by="norm"``), drawn from every
  head the report measured (closed heads not joined are not candidates); the table's ``control_of`` names the closed
  head(s) each control is matched to. The closed heads' agreement ``direction = sign(α)`` (``agrees_alpha``, defined
  for every head with α ≠ 0 and a nonzero direction) and their effect against the null in the direction their α
  predicts (``aligned_diff = sign(α) · median_diff``) against their controls':
  :func:`~tl_idempotence.core.matching.matched_difference` (mean of the agreement, median of ``aligned_diff``, and
  median of ``|median_diff|``, how far the effect is from its null either way: ``abs_median_diff``),
  relabelling closed and control heads **within each layer**, exact when the relabellings are few (p floor
  ``1 / #relabellings``), else seeded draws (floor ``1 / (n_permutations + 1)``).
* **Base rates** (:func:`~tl_idempotence.core.matching.base_rates`) of the weights-only results over every measured
  head: ``sign(copying) = sign(α)`` and ``sign(copying_own) = sign(α)`` among the closed heads beside the
  **non-closed** heads, Fisher's exact test and the binomial chance of the closed heads' count at the non-closed rate.
* **The algebra's case** (:func:`~tl_idempotence.maths.projection_facts.projection_facts`, columns ``asymmetry``
  ``‖T - Tᵀ‖/‖T‖`` and ``proj_distance``, the distance of ``T/α`` from the nearest orthogonal projection of T's rank):
  their range over the closed heads (0 for ``T = α Π``, ``Π`` orthogonal, the only case §12's proof covers).
* **Stability** (:func:`~tl_idempotence.probes.effect_stability.bootstrap_effects`, two-stage: windows, then
  positions): for the closed heads and their controls, 95 % percentile intervals of the median of effect - null and
  of the effect, the share of replicates keeping the direction, and the closed heads' agreement count with its
  interval; with several text sets (:func:`~tl_idempotence.probes.effect_stability.sign_stability`), how many closed
  heads keep the same nonzero direction in every set (``direction_kept``) and the agreement count per set.
* **The copy-suppression condition** (the effect's ``_predicted``/``_unpredicted`` columns): among the closed heads,
  how many agree with sign(α), lower or raise the attended token, where it is already predicted at the head's input
  and where it is not.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from ..core.matching import Matching, base_rates, match_controls, matched_difference
from ..probes.effect_stability import SCHEME, bootstrap_effects, sign_stability
from .mechanism_stats import agreement, stream

__all__ = [
    "BOOT_LEVEL",
    "DERIVED_COLUMNS",
    "STABILITY_COLUMNS",
    "WEIGHT_COLUMNS",
    "controls_matching",
    "derive_controls",
    "weights_frame",
]

#: The columns of the weights-only table of every measured head (``Mechanism.weights``), in order.
WEIGHT_COLUMNS = ("layer", "head", "P", "alpha", "norm", "closed", "copying", "copying_own")
#: The columns of the per-set directions (``Mechanism.stability``), in order: one row per (compared head, set).
STABILITY_COLUMNS = ("label", "set", "direction")
#: The bootstrap intervals' coverage.
BOOT_LEVEL = 0.95
#: The columns :func:`derive_controls` gives (derived: a loader recomputes them), in the table's order.
DERIVED_COLUMNS = (
    "control_of", "agrees_alpha", "aligned_diff", "median_diff_lo", "median_diff_hi", "effect_median_lo",
    "effect_median_hi", "direction_stability", "direction_kept",
)  # fmt: skip


def weights_frame(heads: pd.DataFrame, copying: pd.DataFrame, own: pd.DataFrame) -> pd.DataFrame:
    """The weights-only table of every measured head (:data:`WEIGHT_COLUMNS`, indexed by ``"L10H8"``): the report's
    ``P, alpha, norm, closed`` with both copying scores (``copying`` with ``layer, head, copying``; ``own`` with
    ``copying_own``, indexed by label)."""
    t = heads.loc[:, ["layer", "head", "P", "alpha", "norm", "closed"]].copy()
    cop = pd.Series(copying["copying"].to_numpy(dtype=float), index=[f"L{int(a)}H{int(b)}" for a, b in zip(
        copying["layer"], copying["head"], strict=True)])  # fmt: skip
    t["copying"] = cop.reindex(t.index).to_numpy(dtype=float)
    t["copying_own"] = own["copying_own"].reindex(t.index).to_numpy(dtype=float)
    return t.astype({"layer": "int64", "head": "int64", "closed": bool})


def controls_matching(weights: pd.DataFrame, joined: Sequence[str], k: int, by: str) -> Matching:
    """Each joined closed head's ``k`` non-closed heads of its layer nearest in size (module docstring), among every
    measured head but the closed heads not joined. Raises what ``match_controls`` raises."""
    keep = ~weights["closed"].to_numpy(dtype=bool) | weights.index.isin(list(joined))
    return match_controls(weights.loc[keep], k=k, by=by)


def _control_of(labels: Sequence[str], matching: Matching) -> list[str]:
    of: dict[str, list[str]] = {}
    for c, x in zip(matching.pairs["closed_label"], matching.pairs["control_label"], strict=True):
        of.setdefault(str(x), []).append(str(c))
    return [", ".join(dict.fromkeys(of.get(lab, []))) for lab in labels]


def _difference(frame: pd.DataFrame, col: str, matching: Matching, stat: str, seed: int, n_perm: int) -> dict:
    r = matched_difference(frame, col, matching, statistic=stat, n_permutations=n_perm, seed=seed)
    return {
        "statistic": r.statistic, "value_closed": r.closed, "value_controls": r.controls, "difference": r.difference,
        "p_value": r.p_value, "method": r.method, "n_relabelings": r.n_relabelings, "p_floor": r.p_floor,
        "n_closed": r.n_closed, "n_controls": r.n_controls, "seed": r.seed,
    }  # fmt: skip


def _seed_of(seed: int, which: int) -> int:
    return int(stream(seed, which).integers(0, 2**31 - 1))


def _matched(t: pd.DataFrame, matching: Matching, seed: int, n_perm: int) -> dict[str, Any]:
    pairs = matching.pairs
    joined_closed = list(t.index[t["closed"].to_numpy(dtype=bool)])
    frame = pd.DataFrame(
        {
            "layer": t["layer"].to_numpy(),
            "agrees": t["agrees_alpha"].astype("Float64").to_numpy(dtype=float, na_value=np.nan),
            "aligned": t["aligned_diff"].to_numpy(dtype=float),
            "size": np.abs(t["median_diff"].to_numpy(dtype=float)),
        },
        index=t.index,
    )
    return {
        "by": matching.by,
        "k": matching.k,
        "n_closed": len(joined_closed),
        "n_matched": len(matching.closed),
        "n_controls": len(matching.controls),
        "n_reused": int(pairs["reused"].sum()) if len(pairs) else 0,
        "agreement": _difference(frame, "agrees", matching, "mean", _seed_of(seed, 2), n_perm),
        "aligned": _difference(frame, "aligned", matching, "median", _seed_of(seed, 3), n_perm),
        "abs_median_diff": _difference(frame, "size", matching, "median", _seed_of(seed, 5), n_perm),
        "notes": " ".join(matching.notes),
    }


def _rates(flags: Any, closed: np.ndarray) -> dict[str, Any]:
    b = base_rates(flags, closed)
    return {k: getattr(b, k) for k in b.__dataclass_fields__}


def _base_rates(w: pd.DataFrame) -> dict[str, Any]:
    closed = w["closed"].to_numpy(dtype=bool)
    alpha = w["alpha"].to_numpy(dtype=float)
    out = {}
    for col in ("copying", "copying_own"):
        v = w[col].to_numpy(dtype=float)
        ok = np.isfinite(v) & (v != 0) & np.isfinite(alpha) & (alpha != 0)
        flags = [bool(np.sign(x) == np.sign(a)) if o else None for x, a, o in zip(v, alpha, ok, strict=True)]
        out[col] = _rates(flags, closed)
    return out


def _range(v: np.ndarray) -> tuple[float, float, float]:
    v = v[np.isfinite(v)]
    return (float(v.min()), float(np.median(v)), float(v.max())) if len(v) else (math.nan,) * 3


def _projection(t: pd.DataFrame) -> dict[str, Any]:
    c = t[t["closed"].to_numpy(dtype=bool)]
    a = _range(c["asymmetry"].to_numpy(dtype=float))
    d = _range(c["proj_distance"].to_numpy(dtype=float))
    return {
        "n_closed": len(c),
        "n_measured": int(np.isfinite(c["proj_distance"].to_numpy(dtype=float)).sum()),
        "asymmetry_min": a[0], "asymmetry_median": a[1], "asymmetry_max": a[2],
        "proj_distance_min": d[0], "proj_distance_median": d[1], "proj_distance_max": d[2],
    }  # fmt: skip


def _closed_alpha(t: pd.DataFrame, labels: set[str]) -> dict[str, float]:
    """α of the closed heads with α ≠ 0 that a frame measured (the agreement counts' heads)."""
    c = t[t["closed"].to_numpy(dtype=bool)]
    return {lab: float(a) for lab, a in c["alpha"].items() if lab in labels and np.isfinite(a) and a != 0}


def _bootstrap(
    t: pd.DataFrame, positions: pd.DataFrame, compared: list[str], seed: int, n_boot: int
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    n = len(t)
    cols = {c: np.full(n, np.nan) for c in DERIVED_COLUMNS[3:8]}
    e = pd.to_numeric(positions["effect"], errors="coerce").to_numpy(dtype=float)
    nu = pd.to_numeric(positions["null_effect"], errors="coerce").to_numpy(dtype=float)
    p = positions.loc[positions["label"].isin(compared).to_numpy() & np.isfinite(e) & np.isfinite(nu)]
    bseed = _seed_of(seed, 4)
    out: dict[str, Any] = {
        "n_boot": n_boot, "level": BOOT_LEVEL, "seed": bseed, "scheme": SCHEME, "n_heads": 0, "n_agree_heads": 0,
        "n_agree": None, "n_agree_lo": math.nan, "n_agree_hi": math.nan,
    }  # fmt: skip
    if not len(p):
        return cols, out
    alpha = _closed_alpha(t, set(p["label"]))
    b = bootstrap_effects(p, n_boot=n_boot, level=BOOT_LEVEL, seed=bseed, alpha=alpha or None)
    at = t.index.get_indexer(b.heads.index)
    for col, src in (("median_diff_lo", "median_diff_lo"), ("median_diff_hi", "median_diff_hi"),
                     ("effect_median_lo", "median_effect_lo"), ("effect_median_hi", "median_effect_hi"),
                     ("direction_stability", "direction_stability")):  # fmt: skip
        cols[col][at] = b.heads[src].to_numpy(dtype=float)
    out["n_heads"] = len(b.heads)
    if b.agreement is not None:
        a = b.agreement
        out.update(n_agree_heads=a["n_heads"], n_agree=a["n_agree"], n_agree_lo=a["n_agree_lo"])
        out["n_agree_hi"] = a["n_agree_hi"]
    return cols, out


def _stability(
    t: pd.DataFrame, stability: pd.DataFrame, compared: list[str], sets: Sequence[str]
) -> tuple[Any, dict[str, Any]]:
    kept = pd.arrays.BooleanArray(np.zeros(len(t), dtype=bool), np.ones(len(t), dtype=bool))
    out: dict[str, Any] = {"sets": list(sets), "n_sets": len(sets), "n_compared": 0, "n_kept": None,
                           "n_changed": None, "n_agree_by_set": []}  # fmt: skip
    if len(sets) < 2 or not compared:
        return kept, out
    frames = []
    for name in sets:  # one row per (head, set) whose direction is defined: its sign is the head's direction there
        s = stability[(stability["set"] == name) & np.isfinite(stability["direction"].to_numpy(dtype=float))]
        d = s["direction"].to_numpy(dtype=float)
        frames.append(pd.DataFrame({"label": s["label"].to_numpy(), "window": 0, "pos": 0, "effect": d,
                                    "null_effect": np.zeros(len(d))}))  # fmt: skip
    closed = set(t.index[t["closed"].to_numpy(dtype=bool)])
    st = sign_stability(frames, names=list(sets), alpha=_closed_alpha(t, closed))
    at = t.index.get_indexer(st.heads.index)
    vals = np.zeros(len(t), dtype=bool)
    mask = np.ones(len(t), dtype=bool)
    vals[at], mask[at] = st.heads["kept"].to_numpy(dtype=bool), False
    kept = pd.arrays.BooleanArray(vals, mask)
    c = st.heads.loc[[lab for lab in st.heads.index if lab in closed]]
    M = c.drop(columns="kept").to_numpy()
    out.update(
        n_compared=len(c),
        n_kept=int(c["kept"].sum()),
        n_changed=int(((M != 0).all(1) & ~(M == M[:, :1]).all(1)).sum()) if len(c) else 0,
        n_agree_by_set=[int(x) for x in st.sets["n_agree"]],
    )
    return kept, out


def _condition(t: pd.DataFrame, k: int | None) -> dict[str, Any]:
    c = t[t["closed"].to_numpy(dtype=bool)]
    alpha = c["alpha"].to_numpy(dtype=float)
    out: dict[str, Any] = {"k": k, "n_positions": int(c["n_positions"].sum()),
                           "n_positions_predicted": int(c["n_predicted"].sum())}  # fmt: skip
    for cond in ("predicted", "unpredicted"):
        d = c[f"direction_{cond}"].to_numpy(dtype=float)
        a = agreement(alpha, d)
        md = c[f"median_diff_{cond}"].to_numpy(dtype=float)
        aligned = np.sign(alpha) * md
        aligned = aligned[np.isfinite(aligned)]
        out[cond] = {
            "n_tested": int((~a.isna()).sum()),
            "n_agree": int(a.fillna(False).to_numpy(dtype=bool).sum()),
            "n_lower": int((d < 0).sum()),
            "n_raise": int((d > 0).sum()),
            "median_aligned": float(np.median(aligned)) if len(aligned) else math.nan,
        }
    return out


def derive_controls(
    table: pd.DataFrame,
    weights: pd.DataFrame,
    positions: pd.DataFrame,
    stability: pd.DataFrame,
    *,
    seed: int,
    n_permutations: int,
    match_by: str,
    n_controls: int,
    n_boot: int,
    sets: Sequence[str],
    predicted_k: int | None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The derived columns (:data:`DERIVED_COLUMNS`) and summary sections of a mechanism (module docstring).

    Args:
        table: the joined table's measured columns (``layer, alpha, closed, direction, median_diff, n_positions``,
            the projection facts and the split columns), indexed by label.
        weights: :func:`weights_frame` of every measured head. positions: the attended-token effect's positions
            (those of the joined heads). stability: the per-set directions (:data:`STABILITY_COLUMNS`; set
            ``sets[0]`` the table's). seed, n_permutations: the mechanism's. match_by, n_controls, n_boot, sets,
            predicted_k: its settings.

    Returns:
        ``(columns, summary)``: ``{column: values}`` and ``{"matched", "base_rates", "projection", "stability",
        "copy_suppression"}``.

    Raises:
        OptionError / OptionTypeError: as ``match_controls`` / ``matched_difference`` / ``bootstrap_effects``.
    """
    t = table.copy()
    matching = controls_matching(weights, list(t.index), n_controls, match_by)
    alpha = t["alpha"].to_numpy(dtype=float)
    t["control_of"] = _control_of(list(t.index), matching)
    t["agrees_alpha"] = agreement(alpha, t["direction"].to_numpy(dtype=float))
    with np.errstate(invalid="ignore"):
        t["aligned_diff"] = np.where(np.isfinite(alpha) & (alpha != 0), np.sign(alpha), np.nan) * t["median_diff"]
    compared = [lab for lab, c, of in zip(t.index, t["closed"], t["control_of"], strict=True) if c or of]
    boot_cols, boot = _bootstrap(t, positions, compared, seed, n_boot)
    kept, stab = _stability(t, stability, compared, sets)
    columns = {
        "control_of": t["control_of"].tolist(),
        "agrees_alpha": t["agrees_alpha"].array,
        "aligned_diff": t["aligned_diff"].to_numpy(dtype=float),
        **boot_cols,
        "direction_kept": kept,
    }
    summary = {
        "matched": _matched(t, matching, seed, n_permutations),
        "base_rates": _base_rates(weights),
        "projection": _projection(t),
        "stability": {**boot, **stab},
        "copy_suppression": _condition(t, predicted_k),
    }
    return columns, summary
