"""The mechanism's tests of its own table (SPEC 12-13): signed scores by sign, the sign test and its floor, the
Spearman test of α·P against the effect (within layers, and across them beside it), and each joined head's reasons
for a NaN. :mod:`tl_idempotence.report.mechanism` makes a result with :func:`derive_tests` and its loader recomputes
a saved one with it; the comparisons with matched controls, the base rates and the stability are
:mod:`tl_idempotence.report.mechanism_controls`."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from ..core.stats import spearman_permutation

__all__ = [
    "LEVEL",
    "SIGNED",
    "agreement",
    "derive_tests",
    "joined_reasons",
    "sign_summary",
    "sign_test_floor",
    "signs_frame",
    "stream",
]

#: numpy SeedSequence tag of the mechanism's streams (never shared with another module's streams); the second
#: entropy word picks the stream: 0 the Spearman test across layers (the stream it always had), 1 within layers,
#: 2 and 3 the matched comparisons, 4 the bootstrap.
TAG_MECHANISM = 7
#: The level the tests are read at, and the smallest number of heads whose two-sided sign test can reach it.
LEVEL = 0.05
#: The signed columns :attr:`Mechanism.signs` summarizes (``direction``: counted by sign, ``|median_diff|`` the size).
SIGNED = ("alpha", "direction", "effect_median", "copying", "copying_own")


def stream(seed: int, which: int) -> np.random.Generator:
    """The mechanism's seeded generator number ``which`` (:data:`TAG_MECHANISM`). Raises nothing."""
    entropy = [seed, TAG_MECHANISM] if which == 0 else [seed, TAG_MECHANISM, which]
    return np.random.default_rng(np.random.SeedSequence(entropy))


def sign_summary(values: np.ndarray, signs: np.ndarray | None = None) -> dict[str, Any]:
    """A signed score by sign: ``n_positive, median_abs_positive, n_negative, median_abs_negative, n_zero, n_nan``
    (numpy's median; NaN for an empty side). Never one median of a mixed set. With ``signs``, the counts are by
    the sign of ``signs`` (a head's tested direction) and the medians of ``|values|`` on each side (its size)."""
    v = np.asarray(values, dtype=float)
    g = v if signs is None else np.asarray(signs, dtype=float)
    fin = np.isfinite(g)
    pos, neg = np.abs(v[fin & (g > 0)]), np.abs(v[fin & (g < 0)])
    return {
        "n_positive": len(pos),
        "median_abs_positive": _median(pos),
        "n_negative": len(neg),
        "median_abs_negative": _median(neg),
        "n_zero": int((fin & (g == 0)).sum()),
        "n_nan": int((~fin).sum()),
    }


def _median(x: np.ndarray) -> float:
    """numpy's median of the finite values of ``x`` (NaN for none)."""
    x = x[np.isfinite(x)]
    return float(np.median(x)) if len(x) else math.nan


def sign_test_floor(n: int) -> float:
    """The smallest p a two-sided sign test (p = 1/2) can give over ``n`` heads: ``min(1, 2^(1 - n))`` (NaN for
    none). Raises nothing."""
    return math.nan if n < 1 else min(1.0, 2.0 ** (1 - n))


def signs_frame(table: pd.DataFrame, closed: np.ndarray, signed: tuple[str, ...]) -> pd.DataFrame:
    """``Mechanism.signs`` of a mechanism table (``direction``: heads by direction, sized by ``|median_diff|``)."""
    rows = []
    for col in signed:
        g = table[col].to_numpy(dtype=float)
        v = table["median_diff"].to_numpy(dtype=float) if col == "direction" else g  # direction: sized by effect - null
        for group, mask in (("closed", closed), ("all", np.ones(len(v), dtype=bool))):
            rows.append({"quantity": col, "group": group, **sign_summary(v[mask], g[mask])})
    return pd.DataFrame(rows).set_index(["quantity", "group"])


def joined_reasons(
    labels: list[str], e: pd.DataFrame, tk: pd.DataFrame, cop: pd.DataFrame, own: pd.DataFrame
) -> list[str]:
    """Each joined head's ``reason``: the parts' own reasons for a NaN, each named ("" when there is none)."""
    out = []
    for lab in labels:
        parts = [
            (name, str(frame.loc[lab, "reason"]) if "reason" in frame.columns else "")
            for name, frame in (("effect", e), ("self-rank", tk), ("copying", cop), ("copying (G = I)", own))
        ]
        out.append("; ".join(f"{name}: {why}" for name, why in parts if why and why != "nan"))
    return out


def agreement(alpha: Any, direction: Any) -> Any:
    """``direction == sign(α)`` as a nullable boolean array, NA where α is zero or not finite or the direction is
    zero or not finite (the heads a sign test counts). Raises nothing."""
    a, d = np.asarray(alpha, dtype=float), np.asarray(direction, dtype=float)
    tested = np.isfinite(a) & (a != 0) & np.isfinite(d) & (d != 0)
    return pd.arrays.BooleanArray(np.where(tested, np.sign(a) == d, False), ~tested)


def _spearman(
    x: np.ndarray, y: np.ndarray, layers: np.ndarray, n_perm: int, seed: int
) -> tuple[float, float, float, int, str]:
    """``(rho, p within layers, p across layers, layers with two or more heads, why undefined)``."""
    nan = math.nan
    if len(x) < 3:
        return nan, nan, nan, 0, f"Spearman undefined: {len(x)} head(s) with a defined α·P and effect (need 3)"
    if np.ptp(x) == 0 or np.ptp(y) == 0:
        return nan, nan, nan, 0, "Spearman undefined: α·P or the effect is constant over the heads"
    rho, p_across = spearman_permutation(x, y, n_perm, stream(seed, 0))
    strata = np.asarray(layers, dtype=np.int64)
    _, p_within = spearman_permutation(x, y, n_perm, stream(seed, 1), strata=strata)
    n_strata = int((np.unique(strata, return_counts=True)[1] > 1).sum())
    why = "" if n_strata else "Spearman within layers: no layer has two heads, so nothing can trade places (p = 1)"
    return rho, p_within, p_across, n_strata, why


def derive_tests(table: pd.DataFrame, n_permutations: int, seed: int) -> tuple[Any, pd.DataFrame, dict[str, Any]]:
    """The tests a mechanism table gives: its ``sign_agrees`` column, its :attr:`Mechanism.signs` and the summary's
    counts and p values (:mod:`tl_idempotence.report.mechanism`'s docstring).

    The Spearman test of ``α·P`` against ``effect_median`` over the heads with both defined permutes the pairs
    **within layers** (``spearman_p``, SPEC 13: α·P and the effect both grow with depth, so pairs of different
    layers are not exchangeable under "no association"); ``spearman_p_unstratified`` permutes them across every
    head (the stream the test always had), shown beside it and named.

    Args:
        table: the joined columns ``layer, alpha, P, closed, direction, median_diff, effect_median, alpha_P,
            copying, copying_own`` (any others are ignored; ``sign_agrees``, when present, is not read).
        n_permutations, seed: the Spearman tests' permutations and seed.

    Returns:
        ``(sign_agrees, signs, stats)``: a nullable boolean array (``direction == sign(α)`` for closed heads with
        ``α ≠ 0`` and a nonzero direction), the signs frame, and ``n_sign_tested, n_agree, sign_test_p,
        sign_test_floor, n_spearman, spearman_rho, spearman_p, spearman_p_within_layer`` (the same p, named),
        ``spearman_p_unstratified, n_strata,
        n_closed_own_sign_alpha, median_abs_copying_closed, notes``.
    """
    from scipy.stats import binomtest

    alpha = table["alpha"].to_numpy(dtype=float)
    direction = table["direction"].to_numpy(dtype=float)
    eff = table["effect_median"].to_numpy(dtype=float)
    closed = table["closed"].to_numpy(dtype=bool)
    agrees = agreement(alpha, direction)
    tested = closed & ~agrees.isna()
    sign_agrees = pd.arrays.BooleanArray(agrees.fillna(False).to_numpy(dtype=bool) & tested, ~tested)
    notes = []
    n_tested, n_agree = int(tested.sum()), int(sign_agrees.fillna(False).to_numpy(dtype=bool).sum())
    if n_tested:
        p_sign = float(binomtest(n_agree, n_tested, 0.5, alternative="two-sided").pvalue)
        if sign_test_floor(n_tested) > LEVEL:
            notes.append(
                f"sign test: {n_tested} closed heads cannot give p below {sign_test_floor(n_tested):.3g} (> {LEVEL:g})"
            )
    else:
        p_sign = math.nan
        notes.append("sign test undefined: no closed head with α ≠ 0 and a nonzero direction (effect - null)")
    ap = table["alpha_P"].to_numpy(dtype=float)
    ok = np.isfinite(ap) & np.isfinite(eff)
    layers = table["layer"].to_numpy(dtype=np.int64)
    rho, p_within, p_across, n_strata, why = _spearman(ap[ok], eff[ok], layers[ok], n_permutations, seed)
    if why:
        notes.append(why)
    own_v = table["copying_own"].to_numpy(dtype=float)
    n_closed_own = int((closed & np.isfinite(own_v) & (np.sign(own_v) == np.sign(alpha)) & (alpha != 0)).sum())
    cv = np.abs(table["copying"].to_numpy(dtype=float))[closed]
    med_abs_copy = float(np.median(cv[np.isfinite(cv)])) if np.isfinite(cv).any() else math.nan
    stats = {
        "n_sign_tested": n_tested,
        "n_agree": n_agree,
        "sign_test_p": p_sign,
        "sign_test_floor": sign_test_floor(n_tested),
        "n_spearman": int(ok.sum()),
        "spearman_rho": rho,
        "spearman_p": p_within,
        "spearman_p_within_layer": p_within,
        "spearman_p_unstratified": p_across,
        "n_strata": n_strata,
        "n_closed_own_sign_alpha": n_closed_own,
        "median_abs_copying_closed": med_abs_copy,
        "notes": "; ".join(notes),
    }
    return sign_agrees, signs_frame(table, closed, SIGNED), stats
