"""The closure analysis's declaration (SPEC 2-3): always runs; no option; α, P and closed per head.

Torch-free (the registry, and so the CLI's ``--help``, reads it); the code is :mod:`.closure`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..core.lazy import Lazy
from ..errors import OptionError
from .spec import AnalysisSpec, SummaryRecord, nan_says_why, rule
from .threshold import CountPerLayer, Flag

__all__ = ["CLOSED", "N_CLOSED", "SPEC", "ClosureSummary", "analysis"]

#: Per head: ``closed = P >= threshold`` (NaN: not closed; SPEC 2).
CLOSED = Flag("closed", "P")
#: Per layer: ``n_closed``, the heads with ``P >= threshold``.
N_CLOSED = CountPerLayer("n_closed", "P")


@dataclass(frozen=True)
class ClosureSummary(SummaryRecord):
    """Closure over the measured heads (SPEC 2).

    Attributes:
        n_closed: heads with ``P >= threshold``. frac_closed: ``n_closed / n_heads`` (NaN when no head).
        median_P: median of the defined P (NaN when none is). n_undefined_P: heads whose P is undefined.
        closed_per_layer: ``{layer: closed heads}`` for every measured layer.
    """

    bounds = (("n_closed", "n_heads"), ("n_undefined_P", "n_heads"))

    n_closed: int = field(metadata=rule("count"))
    frac_closed: float = field(metadata=rule("fraction"))
    median_P: float = field(metadata=rule("P"))
    n_undefined_P: int = field(metadata=rule("count"))
    closed_per_layer: dict[int, int] = field(metadata=rule("per_layer"))

    def check(self, report: Mapping[str, Any]) -> None:
        """``closed_per_layer`` sums to ``n_closed`` and names measured layers only (``< n_layers``); ``frac_closed``
        is NaN exactly when ``n_heads = 0``, ``median_P`` exactly when ``n_undefined_P = n_heads``.

        Raises:
            OptionError: names the fields and their values.
        """
        per_layer = sum(self.closed_per_layer.values())
        if per_layer != self.n_closed:
            raise OptionError(
                f"summary field closed_per_layer counts {per_layer} closed heads, but n_closed={self.n_closed!r}."
            )
        n_layers, n_heads = report.get("n_layers"), report.get("n_heads")
        bad_layers = [k for k in self.closed_per_layer if n_layers is not None and k >= n_layers]
        if bad_layers:
            raise OptionError(f"summary field closed_per_layer has layer {bad_layers[0]}, but n_layers={n_layers!r}.")
        if n_heads is None:
            return
        for name, undefined, why in (
            ("frac_closed", n_heads == 0, f"n_heads = 0 (here n_heads={n_heads!r})"),
            (
                "median_P",
                self.n_undefined_P == n_heads,
                f"n_undefined_P = n_heads (here {self.n_undefined_P!r} and {n_heads!r})",
            ),
        ):
            nan_says_why(name, getattr(self, name), undefined, why)


#: The closure analysis (:class:`.closure.ClosureAnalysis`): calling it imports the class and builds one.
analysis = Lazy("tl_idempotence.analyses.closure", "ClosureAnalysis")


SPEC = AnalysisSpec(
    name="closure",
    implementation=analysis,
    head_columns=("alpha", "P", "norm", "norm_T2", "rank_O", "rank_V", "closed", "reason"),
    summary=ClosureSummary,
    threshold_rules=(CLOSED, N_CLOSED),
)
