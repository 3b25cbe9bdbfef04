"""The closure of every head as a report analysis (SPEC sections 2-3): α, P, norms, ranks, closed.

Per head: ``alpha, P, norm, norm_T2, rank_O, rank_V, closed`` (``P >= threshold``) and
``reason`` (why P is NaN: a zero or nilpotent head). Per layer: ``n_closed``,
``median_P``, ``max_P``. Always enabled. ``closed`` and ``n_closed`` are the declared threshold rules
(:data:`~tl_idempotence.analyses.closure_spec.CLOSED`, :data:`~tl_idempotence.analyses.closure_spec.N_CLOSED`),
computed here with their kernels (:func:`closed_flags`, :func:`~tl_idempotence.analyses.threshold.count_closed`) and
at another threshold by :func:`~tl_idempotence.analyses.threshold.derive_at_threshold`. :func:`closed_flags` lives in
:mod:`~tl_idempotence.analyses.threshold` (importable from here too).
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import pandas as pd

from ..core.option_specs import GeneralOptions
from .base import LayerContext, LayerResult, nan_max, nan_median
from .threshold import closed_flags, count_closed

__all__ = ["ClosureAnalysis", "closed_flags"]

_NO_P = "no head of the layer has a defined P (see the heads' reason)"


class ClosureAnalysis:
    """α, P and the closed flag per head (always runs first)."""

    name: ClassVar[str] = "closure"
    reason_column: ClassVar[str | None] = "reason"

    def enabled(self, options: GeneralOptions) -> bool:
        """Whether the report runs this analysis (always)."""
        return True

    def run(self, ctx: LayerContext) -> LayerResult:
        """This analysis of one layer (SPEC 2-3): the columns, values, tables and notes of the class docstring.

        Raises: nothing of its own for a valid context (the context was built from checked heads and options).
        """
        c = ctx.closure
        P = c.P.numpy()
        t = ctx.options.threshold
        closed = closed_flags(P, t)
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
            values={"n_closed": count_closed(P, t), "median_P": nan_median(P), "max_P": nan_max(P)},
        )
        if not np.isfinite(P).any():
            res.notes.update(median_P=_NO_P, max_P=_NO_P)
        return res

    def summarize(
        self, heads: pd.DataFrame, layers: pd.DataFrame, tables: dict[str, pd.DataFrame], options: GeneralOptions
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
