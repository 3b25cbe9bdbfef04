"""The analyses the report runs, listed once, in order (each declared beside its code: :mod:`.spec`).

Each entry is an analysis's :class:`~tl_idempotence.analyses.spec.AnalysisSpec` (from its torch-free
``<name>_spec.py``). Everything that names the analyses or their options is assembled from this list:
the report options (:func:`~tl_idempotence.core.option_specs.report_options`, which the package root points at
:func:`analysis_options`), :class:`~tl_idempotence.core.options.ReportOptions`' fields and defaults, the CLI's
report flags, the options paragraph of every entry point's docstring, ``compare``'s and the sweeps' compared
options (:func:`~tl_idempotence.report.identity.compared_options`), the report loop
(:func:`report_analyses`), the report summary's per-analysis records and the threshold-dependent outputs
(:func:`threshold_rules`).

To add an analysis: its module (the ``Analysis`` class) and its declaration (an ``AnalysisSpec`` with its option,
head columns and summary record), then one line here. Imports no torch (the CLI's ``--help`` reads it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..core.option_specs import OptionSpec
from . import algebra_spec, closure_spec, mismatch_spec, scramble_spec, search_spec
from .spec import AnalysisSpec

if TYPE_CHECKING:  # pragma: no cover
    from .base import Analysis
    from .threshold import ThresholdRule

__all__ = ["ANALYSES", "analysis_options", "report_analyses", "spec_of", "threshold_rules"]

#: The report's analyses in the order their columns appear (closure first). Tests may extend it (monkeypatch).
ANALYSES: tuple[AnalysisSpec, ...] = (
    closure_spec.SPEC,
    scramble_spec.SPEC,
    mismatch_spec.SPEC,
    search_spec.SPEC,
    algebra_spec.SPEC,
)


def analysis_options() -> tuple[OptionSpec, ...]:
    """The options the registered analyses declare, in registry order (read at each call)."""
    return tuple(o for s in ANALYSES for o in s.options)


def report_analyses() -> tuple[Analysis, ...]:
    """The registered analyses' objects, in order (each imported on first use: this imports torch)."""
    return tuple(s.analysis() for s in ANALYSES)


def threshold_rules(analyses: Sequence[Analysis]) -> tuple[ThresholdRule, ...]:
    """The threshold rules (:mod:`.threshold`) of ``analyses`` (the analyses a report ran), in their order: what
    :func:`~tl_idempotence.analyses.threshold.derive_at_threshold` applies.

    Raises:
        KeyError: an analysis that is not registered (names the registered ones).
    """
    return tuple(r for a in analyses for r in spec_of(a.name).threshold_rules)


def spec_of(name: str) -> AnalysisSpec:
    """The registered analysis called ``name``.

    Raises:
        KeyError: no such analysis (names the registered ones).
    """
    for s in ANALYSES:
        if s.name == name:
            return s
    raise KeyError(f"no analysis {name!r}; registered: {[s.name for s in ANALYSES]}")


def __getattr__(name: str) -> Any:
    """:data:`REPORT_ANALYSES`: :func:`report_analyses` (kept for callers of the earlier constant)."""
    if name == "REPORT_ANALYSES":
        return report_analyses()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
