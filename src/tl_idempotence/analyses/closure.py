"""The closure of every head as a report analysis (SPEC sections 2-3): α, P, norms, ranks, closed.

Per head: ``alpha, P, norm, norm_T2, rank_O, rank_V, closed`` (``P >= threshold``) and
``reason`` (why P is NaN: a zero or nilpotent head). Per layer: ``n_closed``,
``median_P``, ``max_P``. Always enabled.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import pandas as pd

from ..core.options import ReportOptions
from .base import LayerContext, LayerResult, nan_max, nan_median

__all__ = ["ClosureAnalysis", "closed_flags"]

_NO_P = "no head of the layer has a defined P (see the heads' reason)"


def closed_flags(P: Any, threshold: float) -> np.ndarray:
    """``P >= threshold`` with NaN counted as not closed (SPEC 2): a bool array of ``P``'s shape.

    Args:
        P: squared closure alignments (any shape, dimensionless in [0, 1] or NaN).
        threshold: the P threshold (already validated, in [0, 1]).
    """
    return np.nan_to_num(np.asarray(P, dtype=float), nan=-1.0) >= threshold


class ClosureAnalysis:
    """α, P and the closed flag per head (always runs first)."""

    name: ClassVar[str] = "closure"
    reason_column: ClassVar[str | None] = "reason"

    def enabled(self, options: ReportOptions) -> bool:
        """Whether the report runs this analysis (always)."""
        return True

    def run(self, ctx: LayerContext) -> LayerResult:
        """This analysis of one layer (SPEC 2-3): the columns, values, tables and notes of the class docstring.

        Raises: nothing of its own for a valid context (the context was built from checked heads and options).
        """
        c = ctx.closure
        P = c.P.numpy()
        closed = closed_flags(P, ctx.options.threshold)
        res = LayerResult(
            columns={
                "alpha": c.alpha.numpy(),
                "P": P,
                "norm": c.norm.numpy(),
                "norm_T2": c.norm_T2.numpy(),
                "rank_O": c.rank_O.numpy(),
                "rank_V": c.rank_V.numpy(),
                "closed": closed,
                "reason": np.asarray(c.reason, dtype=object).astype(str),
            },
            values={"n_closed": int(closed.sum()), "median_P": nan_median(P), "max_P": nan_max(P)},
        )
        if not np.isfinite(P).any():
            res.notes.update(median_P=_NO_P, max_P=_NO_P)
        return res

    def apply_threshold(
        self, heads: pd.DataFrame, layers: pd.DataFrame, tables: dict[str, pd.DataFrame], threshold: float
    ) -> None:
        """Recompute the threshold-dependent columns in place (``closed``, per-layer ``n_closed``)."""
        heads["closed"] = closed_flags(heads["P"], threshold)
        counts = heads.groupby("layer")["closed"].sum()
        layers["n_closed"] = layers["layer"].map(counts).fillna(0).astype(int).to_numpy()

    def summarize(
        self, heads: pd.DataFrame, layers: pd.DataFrame, tables: dict[str, pd.DataFrame], options: ReportOptions
    ) -> dict[str, Any]:
        """Model-level headline numbers (SPEC 2-3) from the concatenated per-layer results (JSON values)."""
        P = heads["P"].to_numpy(dtype=float)
        n = len(heads)
        n_closed = int(heads["closed"].sum())
        per_layer = heads.groupby("layer")["closed"].sum().astype(int).to_dict()
        return {
            "n_closed": n_closed,
            "frac_closed": n_closed / n if n else float("nan"),
            "median_P": float(np.nanmedian(P)) if np.isfinite(P).any() else float("nan"),
            "n_undefined_P": int(np.isnan(P).sum()),
            "closed_per_layer": {int(k): int(v) for k, v in per_layer.items()},
        }
