"""The statistics of a population of mechanism results (SPEC 13, "Population"): per model, then combined.

Everything here is computed from each model's per-head mechanism table (``rep.mechanism(...).table``: ``layer,
head, P, alpha, closed, alpha_P, direction, effect_median, copying``) with :mod:`tl_idempotence.core.matching` and
:mod:`tl_idempotence.core.stats`, never from a mechanism's own summary. numpy, pandas and scipy only.

Per head:

* ``agrees`` — ``direction == sign(α)`` (1.0 / 0.0) where ``α ≠ 0`` and the tested direction (the sign of
  effect - null, SPEC 13) is ``+1`` or ``-1``; NaN otherwise. For closed heads it is the mechanism's ``sign_agrees``;
  non-closed heads get the same definition (the base rate and the matched controls are read from it).
* ``copying_agrees`` — ``sign(copying) == sign(α)`` where both are finite and nonzero; NaN otherwise.

Per model (:func:`model_row`; one row of :data:`ROW_COLUMNS`):

* the closed heads' agreement: ``n_agree`` of ``n_sign_tested``, the two-sided sign test (``binomtest``, p = 1/2)
  and its floor ``min(1, 2^(1 - n))`` — against chance alone;
* the base rate: the same rate among non-closed heads, and Fisher's exact p of the 2 x 2 table
  (:func:`~tl_idempotence.core.matching.base_rates`);
* matched controls: each closed head's ``k`` non-closed heads of its layer nearest in size
  (:func:`~tl_idempotence.core.matching.match_controls`, ``by`` ``|α|`` by default), the difference of the
  agreement rates (closed - controls) and its two-sided p from relabelling within each layer
  (:func:`~tl_idempotence.core.matching.matched_difference`: exact, or seeded draws), with its floor;
* the rank correlation across heads: Spearman ρ of ``α·P`` with ``effect_median`` and its two-sided permutation p
  permuted **within layers** (:func:`~tl_idempotence.core.stats.spearman_permutation` with ``strata``), the p
  permuted across every head beside it, named ``unstratified``;
* the copying sign's base rate: ``sign(copying) == sign(α)`` among closed and among non-closed heads (Fisher's p).

Combined across models (:func:`combined_tests`):

* **the test** — the pooled matched difference: every model's closed heads and matched controls in one pool, the
  difference of their agreement rates, its two-sided p from relabelling the closed label **within each (model,
  layer)** stratum (:func:`~tl_idempotence.core.matching.matched_difference` over the pooled matching; exact when
  the relabellings number at most ``max_exact``, else ``n_permutations`` seeded draws, floor ``1/(1 + draws)``).
  Under the null (closure makes no difference to agreement once model, layer and size are fixed) the closed label
  is exchangeable within each stratum, so the test is valid however the models differ;
* a secondary: the per-model matched differences' signs (models with a defined nonzero difference), a two-sided
  sign test (p = 1/2) with its floor;
* beside them: the pooled agreement of closed heads against 1/2 and the pooled base rate, and the pooled Spearman ρ
  of ``α·P`` with the effect whose p permutes within (model, layer) strata (the ρ itself mixes models; the p
  does not).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd
from pandas.api.types import is_bool_dtype, is_numeric_dtype

from ..core.matching import PAIR_COLUMNS, Matching, base_rates, match_controls, matched_difference
from ..core.stats import spearman_permutation
from ..errors import OptionError

__all__ = [
    "HEAD_COLUMNS",
    "LEVEL",
    "NEEDED_COLUMNS",
    "ROW_COLUMNS",
    "combined_tests",
    "head_flags",
    "model_row",
    "refused_row",
    "sign_test",
]

#: The level the tests are read at (the headline's "Yes" / "Not detectably").
LEVEL = 0.05
#: The mechanism table's columns a population needs.
NEEDED_COLUMNS = ("layer", "head", "P", "alpha", "closed", "alpha_P", "direction", "effect_median", "copying")
#: The per-head columns of :attr:`MechanismComparison.heads` (after ``model``).
HEAD_COLUMNS = (
    "model", "label", "layer", "head", "closed", "P", "alpha", "alpha_P", "direction", "effect_median", "copying",
    "agrees", "copying_agrees", "matched",
)  # fmt: skip
#: The columns of one model's row (:func:`model_row`), in order.
ROW_COLUMNS = (
    "model", "model_name", "status", "tied", "n_heads", "n_closed",
    "n_sign_tested", "n_agree", "agree_rate", "sign_test_p", "sign_test_floor",
    "n_other_tested", "n_other_agree", "other_agree_rate", "base_rate_fisher_p",
    "n_matched_closed", "n_matched_controls", "matched_closed_rate", "matched_control_rate", "matched_difference",
    "matched_p", "matched_p_floor", "matched_method",
    "n_spearman", "spearman_rho", "spearman_p_within_layer", "spearman_p_unstratified",
    "n_copying_closed", "copying_rate_closed", "n_copying_other", "copying_rate_other", "copying_fisher_p",
    "notes",
)  # fmt: skip
#: numpy SeedSequence tag of this module's Spearman streams (never shared with another module's streams).
_TAG_POPULATION = 47
NAN = math.nan


def sign_test(k: int, n: int) -> tuple[float, float]:
    """Two-sided sign test of ``k`` successes of ``n`` (``scipy.stats.binomtest``, p = 1/2) and its floor
    ``min(1, 2^(1 - n))``; ``(NaN, NaN)`` for ``n = 0``. Raises nothing."""
    if n < 1:
        return NAN, NAN
    from scipy.stats import binomtest

    return float(binomtest(int(k), int(n), 0.5).pvalue), min(1.0, 2.0 ** (1 - n))


def head_flags(table: pd.DataFrame) -> pd.DataFrame:
    """``agrees`` and ``copying_agrees`` of every head (module docstring), as floats (1.0 / 0.0 / NaN).

    Args:
        table: a mechanism table (``alpha``, ``direction``, ``copying``).

    Returns:
        ``[heads, 2]``, indexed like ``table``.
    """
    alpha = table["alpha"].to_numpy(dtype=float)
    direction = table["direction"].to_numpy(dtype=float)
    copying = table["copying"].to_numpy(dtype=float)
    ok = np.isfinite(alpha) & (alpha != 0) & np.isfinite(direction) & (direction != 0)
    agrees = np.where(ok, (np.sign(alpha) == direction).astype(float), NAN)
    ok_c = np.isfinite(alpha) & (alpha != 0) & np.isfinite(copying) & (copying != 0)
    cop = np.where(ok_c, (np.sign(alpha) == np.sign(copying)).astype(float), NAN)
    return pd.DataFrame({"agrees": agrees, "copying_agrees": cop}, index=table.index)


def check_table(label: str, table: Any) -> pd.DataFrame:
    """A mechanism table with the columns a population reads (:data:`NEEDED_COLUMNS`), labels unique.

    Raises:
        OptionError: a missing column, a missing ``closed`` value, repeated head labels (names the model).
    """
    missing = [c for c in NEEDED_COLUMNS if c not in table.columns]
    if missing:
        raise OptionError(f"The mechanism of {label!r} lacks the columns {missing}: not a rep.mechanism table.")
    if table["closed"].isna().any():
        raise OptionError(f"The mechanism of {label!r} has heads that are neither closed nor not (NaN 'closed').")
    if table.index.duplicated().any():
        raise OptionError(f"The mechanism of {label!r} repeats head {table.index[table.index.duplicated()][0]!r}.")
    return table


def _bools(x: np.ndarray) -> list[bool | None]:
    """1.0 / 0.0 / NaN as True / False / None (what :func:`~tl_idempotence.core.matching.base_rates` reads)."""
    return [None if not math.isfinite(v) else bool(v) for v in np.asarray(x, dtype=float)]


def _rate(k: int, n: int) -> float:
    return k / n if n else NAN


def _spearman(table: pd.DataFrame, n_permutations: int, seed: int, index: int) -> tuple[int, float, float, float, str]:
    """``(n, ρ, p within layers, p unstratified, why undefined)`` of α·P against ``effect_median``."""
    x = table["alpha_P"].to_numpy(dtype=float)
    y = table["effect_median"].to_numpy(dtype=float)
    ok = np.isfinite(x) & np.isfinite(y)
    x, y, layer = x[ok], y[ok], table["layer"].to_numpy(dtype=np.int64)[ok]
    n = int(ok.sum())
    if n < 3:
        return n, NAN, NAN, NAN, f"Spearman undefined: {n} head(s) with a defined α·P and effect (need 3)"
    if np.ptp(x) == 0 or np.ptp(y) == 0:
        return n, NAN, NAN, NAN, "Spearman undefined: α·P or the effect is constant over the heads"
    ss = np.random.SeedSequence([seed, _TAG_POPULATION, index])
    within_rng, flat_rng = (np.random.default_rng(s) for s in ss.spawn(2))
    rho, p_within = spearman_permutation(x, y, n_permutations, within_rng, strata=layer)
    _, p_flat = spearman_permutation(x, y, n_permutations, flat_rng, strata=np.zeros(n, dtype=np.int64))
    why = "" if math.isfinite(p_within) else "Spearman within layers undefined"
    return n, rho, p_within, p_flat, why


def model_row(
    label: str,
    table: pd.DataFrame,
    *,
    model_name: Any,
    tied: Any,
    by: str,
    k: int,
    n_permutations: int,
    seed: int,
    max_exact: int,
    index: int,
) -> tuple[dict[str, Any], pd.DataFrame, Matching]:
    """One measured model's row of :data:`ROW_COLUMNS` (module docstring), its heads with their flags, and its
    matching.

    Args:
        label: the model's label. table: its mechanism table (checked by :func:`check_table`).
        model_name, tied: from the mechanism's summary (None when unknown).
        by, k: the matching's size and controls per closed head. n_permutations, seed, max_exact: the tests' draws.
        index: the model's position (its Spearman streams: ``SeedSequence([seed, 47, index])``).

    Returns:
        ``(row, heads, matching)``: ``heads`` has :data:`HEAD_COLUMNS` (``matched``: ``"closed"``, ``"control"``
        or ``""``).

    Raises:
        OptionError: as :func:`check_table`; as :func:`~tl_idempotence.core.matching.match_controls`.
    """
    t = check_table(label, table)
    closed = t["closed"].to_numpy(dtype=bool)
    flags = head_flags(t)
    agrees = flags["agrees"].to_numpy()
    notes: list[str] = []
    tested = np.isfinite(agrees)
    n_t, n_a = int((tested & closed).sum()), int((agrees[tested & closed] == 1).sum())
    p_sign, floor = sign_test(n_a, n_t)
    br = base_rates(_bools(agrees), closed)
    heads = pd.DataFrame({
        "model": label, "label": list(t.index), "layer": t["layer"].to_numpy(dtype=np.int64),
        "head": t["head"].to_numpy(dtype=np.int64), "closed": closed, "P": t["P"].to_numpy(dtype=float),
        "alpha": t["alpha"].to_numpy(dtype=float), "alpha_P": t["alpha_P"].to_numpy(dtype=float),
        "direction": t["direction"].to_numpy(dtype=float), "effect_median": t["effect_median"].to_numpy(dtype=float),
        "copying": t["copying"].to_numpy(dtype=float), "agrees": agrees,
        "copying_agrees": flags["copying_agrees"].to_numpy(), "matched": "",
    })  # fmt: skip
    heads.index = list(t.index)
    size = "alpha" if by == "abs_alpha" else by
    if size not in t.columns:
        raise OptionError(f"match_by={by!r}: the mechanism of {label!r} has no column {size!r} to match sizes on.")
    if size in ("layer", "head", "closed") or not is_numeric_dtype(t[size]) or is_bool_dtype(t[size]):
        raise OptionError(
            f"match_by={by!r}: the column {size!r} of the mechanism of {label!r} is not a size (a number per head; not "
            "layer, head or closed): use 'abs_alpha' or a numeric column such as 'P'."
        )
    match = match_controls(heads.assign(**{size: t[size].to_numpy()}), k=k, by=by)
    md = matched_difference(heads, "agrees", match, n_permutations=n_permutations, seed=seed, max_exact=max_exact)
    notes += ["no head is closed"] if int(closed.sum()) == 0 else list(md.notes)
    heads.loc[match.controls, "matched"] = "control"
    heads.loc[match.closed, "matched"] = "closed"
    n_sp, rho, p_in, p_flat, why = _spearman(t, n_permutations, seed, index)
    if why:
        notes.append(why)
    cr = base_rates(_bools(flags["copying_agrees"].to_numpy()), closed)
    row = {
        "model": label, "model_name": model_name, "status": "measured", "tied": tied,
        "n_heads": len(t), "n_closed": int(closed.sum()),
        "n_sign_tested": n_t, "n_agree": n_a, "agree_rate": _rate(n_a, n_t), "sign_test_p": p_sign,
        "sign_test_floor": floor,
        "n_other_tested": br.n_other, "n_other_agree": br.k_other, "other_agree_rate": br.rate_other,
        "base_rate_fisher_p": br.fisher_p,
        "n_matched_closed": md.n_closed, "n_matched_controls": md.n_controls, "matched_closed_rate": md.closed,
        "matched_control_rate": md.controls, "matched_difference": md.difference, "matched_p": md.p_value,
        "matched_p_floor": md.p_floor, "matched_method": md.method,
        "n_spearman": n_sp, "spearman_rho": rho, "spearman_p_within_layer": p_in, "spearman_p_unstratified": p_flat,
        "n_copying_closed": cr.n_closed, "copying_rate_closed": cr.rate_closed, "n_copying_other": cr.n_other,
        "copying_rate_other": cr.rate_other, "copying_fisher_p": cr.fisher_p,
        "notes": "; ".join(dict.fromkeys(n.rstrip(".") for n in notes)),
    }  # fmt: skip
    return row, heads.loc[:, list(HEAD_COLUMNS)], match


def refused_row(label: str, reason: str) -> dict[str, Any]:
    """The row of a model whose mechanism was refused (an encoder): every number NaN, ``status`` ``"refused"``,
    ``notes`` the reason."""
    row: dict[str, Any] = dict.fromkeys(ROW_COLUMNS, NAN)
    counts = [c for c in ROW_COLUMNS if c.startswith("n_")]
    row.update(dict.fromkeys(counts, 0))
    row.update({
        "model": label, "model_name": None, "status": "refused", "tied": None, "matched_method": "none",
        "notes": f"refused: {reason}",
    })  # fmt: skip
    return row


def _pooled_matching(matchings: Mapping[str, Matching], strata: Mapping[tuple[str, int], int]) -> Matching:
    """Every model's matching in one, labels ``"model:L1H2"`` and the ``layer`` column the (model, layer)
    stratum's number (``strata``), so :func:`matched_difference` relabels within each (model, layer)."""
    frames = []
    for label, m in matchings.items():
        p = m.pairs.copy()
        if not len(p):
            continue
        p["closed_label"] = [f"{label}:{x}" for x in p["closed_label"]]
        p["control_label"] = [f"{label}:{x}" for x in p["control_label"]]
        p["layer"] = [strata[(label, int(lay))] for lay in p["layer"]]
        frames.append(p)
    pairs = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=list(PAIR_COLUMNS))
    first = next(iter(matchings.values()), None)
    return Matching(pairs=pairs, notes=(), by=first.by if first else "abs_alpha", k=first.k if first else 1)


def combined_tests(
    rows: pd.DataFrame,
    heads: pd.DataFrame,
    matchings: Mapping[str, Matching],
    *,
    n_permutations: int,
    seed: int,
    max_exact: int,
) -> dict[str, Any]:
    """The tests across models (module docstring) from the measured models' rows, their pooled heads
    (:data:`HEAD_COLUMNS`) and their matchings.

    Returns:
        ``n_models_compared`` (models with a matched comparison), ``pooled_closed_rate, pooled_control_rate,
        pooled_difference, pooled_p, pooled_p_floor, pooled_method, pooled_n_relabelings, n_pooled_closed,
        n_pooled_controls`` (the test), ``n_models_positive, n_models_negative, n_models_zero, models_sign_test_p,
        models_sign_test_floor`` (the secondary), ``n_sign_tested, n_agree, agree_rate, sign_test_p,
        sign_test_floor`` (closed heads pooled, against 1/2), ``n_other_tested, n_other_agree, other_agree_rate``
        (the pooled base rate), ``n_copying_closed, copying_rate_closed, n_copying_other, copying_rate_other``,
        ``n_spearman_pooled, spearman_rho_pooled, spearman_p_within`` (permuted within (model, layer)), and
        ``pooled_notes``.
    """
    measured = rows[rows["status"] == "measured"]
    codes = {key: i for i, key in enumerate(dict.fromkeys(zip(heads["model"], heads["layer"].astype(int))))}
    pooled_heads = heads.copy()
    pooled_heads.index = [f"{m}:{x}" for m, x in zip(heads["model"], heads["label"])]
    md = matched_difference(
        pooled_heads,
        "agrees",
        _pooled_matching(matchings, codes),
        n_permutations=n_permutations,
        seed=seed,
        max_exact=max_exact,
    )
    diffs = measured["matched_difference"].to_numpy(dtype=float)
    pos, neg = int((diffs > 0).sum()), int((diffs < 0).sum())
    models_p, models_floor = sign_test(pos, pos + neg)
    closed = heads["closed"].to_numpy(dtype=bool)
    agrees = heads["agrees"].to_numpy(dtype=float)
    tested = np.isfinite(agrees)
    n_t, n_a = int((tested & closed).sum()), int((agrees[tested & closed] == 1).sum())
    n_o, k_o = int((tested & ~closed).sum()), int((agrees[tested & ~closed] == 1).sum())
    p_sign, floor = sign_test(n_a, n_t)
    cop = heads["copying_agrees"].to_numpy(dtype=float)
    c_ok = np.isfinite(cop)
    n_cc, n_co = int((c_ok & closed).sum()), int((c_ok & ~closed).sum())
    x = heads["alpha_P"].to_numpy(dtype=float)
    y = heads["effect_median"].to_numpy(dtype=float)
    ok = np.isfinite(x) & np.isfinite(y)
    strata = np.array([codes[(m, int(lay))] for m, lay in zip(heads["model"], heads["layer"])], dtype=np.int64)
    rho = p_within = NAN
    if ok.sum() >= 3 and np.ptp(x[ok]) > 0 and np.ptp(y[ok]) > 0:
        rng = np.random.default_rng(np.random.SeedSequence([seed, _TAG_POPULATION, 1 << 20]))
        rho, p_within = spearman_permutation(x[ok], y[ok], n_permutations, rng, strata=strata[ok])
    return {
        "n_models_compared": int(sum(1 for v in measured["n_matched_closed"] if v > 0)),
        "pooled_closed_rate": md.closed, "pooled_control_rate": md.controls, "pooled_difference": md.difference,
        "pooled_p": md.p_value, "pooled_p_floor": md.p_floor, "pooled_method": md.method,
        "pooled_n_relabelings": md.n_relabelings, "n_pooled_closed": md.n_closed, "n_pooled_controls": md.n_controls,
        "n_models_positive": pos, "n_models_negative": neg, "n_models_zero": int((diffs == 0).sum()),
        "models_sign_test_p": models_p, "models_sign_test_floor": models_floor,
        "n_sign_tested": n_t, "n_agree": n_a, "agree_rate": _rate(n_a, n_t), "sign_test_p": p_sign,
        "sign_test_floor": floor, "n_other_tested": n_o, "n_other_agree": k_o, "other_agree_rate": _rate(k_o, n_o),
        "n_copying_closed": n_cc, "copying_rate_closed": _rate(int((cop[c_ok & closed] == 1).sum()), n_cc),
        "n_copying_other": n_co, "copying_rate_other": _rate(int((cop[c_ok & ~closed] == 1).sum()), n_co),
        "n_spearman_pooled": int(ok.sum()), "spearman_rho_pooled": rho, "spearman_p_within": p_within,
        "pooled_notes": list(md.notes),
    }  # fmt: skip
