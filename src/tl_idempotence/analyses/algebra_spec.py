"""The shared-value algebra's declaration (SPEC 7): the ``algebra`` option and its summary.

Torch-free (the registry, and so the CLI's ``--help``, reads it); the code is :mod:`.algebra`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..core.option_specs import OptionSpec, check_bool
from .spec import AnalysisSpec, SummaryRecord, rule
from .threshold import FunctionRule

__all__ = ["ALGEBRA", "AT_THRESHOLD", "SPEC", "AlgebraSummary"]

#: ``algebra``: run the shared-value algebra.
ALGEBRA = OptionSpec(
    "algebra",
    False,
    "shared-value algebra per kv group (GQA/MQA)",
    "flag",
    check=check_bool,
    position=40,
)


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
AT_THRESHOLD = FunctionRule("algebra:AlgebraAnalysis.at_threshold")


SPEC = AnalysisSpec(
    name="algebra",
    implementation="algebra:AlgebraAnalysis",
    options=(ALGEBRA,),
    summary=AlgebraSummary,
    threshold_rules=(AT_THRESHOLD,),
)
