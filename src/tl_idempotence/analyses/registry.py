"""The analyses the report runs, in order (each implements :class:`~tl_idempotence.analyses.base.Analysis`).

To add an analysis to the report: implement ``name``, ``reason_column``, ``enabled``,
``run``, ``apply_threshold`` and ``summarize`` (see :mod:`tl_idempotence.analyses.base`),
add an instance here, and an option to :class:`~tl_idempotence.core.options.ReportOptions`
that enables it. The report loop does not change.
"""

from __future__ import annotations

from .algebra import AlgebraAnalysis
from .base import Analysis
from .closure import ClosureAnalysis
from .mismatch import MismatchAnalysis
from .scramble import ScrambleAnalysis
from .search import SearchAnalysis

__all__ = ["REPORT_ANALYSES"]

#: The report's analyses in the order their columns appear (closure first).
REPORT_ANALYSES: tuple[Analysis, ...] = (
    ClosureAnalysis(),
    ScrambleAnalysis(),
    MismatchAnalysis(),
    SearchAnalysis(),
    AlgebraAnalysis(),
)
