"""The mechanism's statistics that need no test of their own (SPEC 12-13): signed scores by sign, the sign test's
floor, and each joined head's reasons for a NaN. :mod:`tl_idempotence.report.mechanism` uses them."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

__all__ = ["joined_reasons", "sign_summary", "sign_test_floor", "signs_frame"]


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
