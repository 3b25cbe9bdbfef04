"""The shared-value algebra's declaration (SPEC 7): the ``algebra`` option and its summary.

Torch-free (the registry, and so the CLI's ``--help``, reads it); the code is :mod:`.algebra`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..core.lazy import Lazy
from ..core.option_specs import on_off
from .spec import AnalysisSpec, SummaryRecord, rule
from .threshold import FunctionRule

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd


__all__ = ["ALGEBRA", "AT_THRESHOLD", "SPEC", "AlgebraSummary", "analysis", "at_threshold"]

#: ``algebra``: run the shared-value algebra.
ALGEBRA = on_off("algebra", "shared-value algebra per kv group (GQA/MQA)", position=40)


@dataclass(frozen=True)
class AlgebraSummary(SummaryRecord):
    """The shared-value algebra's summary (SPEC 7).

    Attributes:
        algebra: :attr:`SharedValueAlgebra.summary <tl_idempotence.analyses.algebra.SharedValueAlgebra.summary>`.
        algebra_ranges_threshold: the P threshold its closed-pair range angles are at.
    """

    bounds = ()

    algebra: dict[str, Any] = field(metadata=rule("dict"))
    algebra_ranges_threshold: float = field(metadata=rule("threshold"))


#: The algebra's closed flags, group counts, closed-pair ranges and ``algebra_ranges_threshold`` at a threshold
#: (:meth:`~tl_idempotence.analyses.algebra.AlgebraAnalysis.at_threshold`).
def at_threshold(
    heads: pd.DataFrame, layers: pd.DataFrame, tables: dict[str, pd.DataFrame], t: float
) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, pd.DataFrame]]:
    """:meth:`.algebra.AlgebraAnalysis.at_threshold` (imported here, on first use: this module stays torch-free)."""
    from .algebra import AlgebraAnalysis

    return AlgebraAnalysis.at_threshold(heads, layers, tables, t)


AT_THRESHOLD = FunctionRule(at_threshold)


#: The algebra analysis (:class:`.algebra.AlgebraAnalysis`): calling it imports the class and builds one.
analysis = Lazy("tl_idempotence.analyses.algebra", "AlgebraAnalysis")


SPEC = AnalysisSpec(
    name="algebra",
    implementation=analysis,
    options=(ALGEBRA,),
    summary=AlgebraSummary,
    threshold_rules=(AT_THRESHOLD,),
)
