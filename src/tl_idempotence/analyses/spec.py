"""What an analysis declares about itself, beside its code, without importing torch.

Each report analysis has a small declaration module (``analyses/<name>_spec.py``, torch-free so that
``tl-idempotence --help`` stays fast) holding one :class:`AnalysisSpec`: its name, the report option(s) that
switch it on (:class:`~tl_idempotence.core.option_specs.OptionSpec`: name, default, type, validator, help, CLI
flag), the per-head columns it adds to ``rep.heads``, the summary numbers it contributes (and their field rules),
how its threshold-dependent outputs are derived (:mod:`.threshold`), and its code: a factory function that imports
its class when first called (so the declaration stays torch-free and every tool follows the call).
:mod:`tl_idempotence.analyses.registry` lists the specs once; the report options, the CLI's flags, the options
docstrings and ``compare``'s option checks are assembled from it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..core.option_specs import OptionSpec
from ..core.summaries import SUMMARY_RULES, SummaryRecord, check_summary_field, nan_says_why, rule
from ..errors import OptionError

if TYPE_CHECKING:  # pragma: no cover
    from .base import Analysis
    from .threshold import ThresholdRule

__all__ = ["SUMMARY_RULES", "AnalysisSpec", "SummaryRecord", "check_summary_field", "nan_says_why", "rule"]

_LOADED: dict[int, tuple[AnalysisSpec, Analysis]] = {}


@dataclass(frozen=True)
class AnalysisSpec:
    """One report analysis, declared once (module docstring).

    Attributes:
        name: short name (``"scramble"``); the progress bar and error messages use it.
        implementation: a zero-argument factory returning its :class:`~tl_idempotence.analyses.base.Analysis`
            (a small function that imports the class, called on first use; or the class itself).
        options: the report options this analysis declares (usually one on/off option; none for the closure).
        head_columns: the per-head columns its ``run`` adds to ``rep.heads``, in order (the contract test checks
            them against what it returns).
        summary: its :class:`SummaryRecord` subclass: the model-level numbers its ``summarize`` returns, with their
            rules (:class:`~tl_idempotence.report.summary.ReportSummary` composes them: ``summary.scramble``);
            None for an analysis without summary numbers.
        compared: the summary fields ``compare``'s table shows for it, a column each under the field's name (after
            the built-in analyses' columns); the five analyses of the paper have their columns (percentages, the
            paper's rows) written in :mod:`tl_idempotence.studies.compare` and declare none here.
        threshold_rules: how its outputs that depend on the P threshold are derived
            (:mod:`~tl_idempotence.analyses.threshold`: ``closed``, counts of closed rows, fractions): the report
            derives them at another threshold with these rules alone (``rep.with_threshold``), and ``run`` computes
            them through the same rules' kernels; none for an analysis without such outputs.
    """

    name: str
    implementation: Callable[[], Analysis]
    options: tuple[OptionSpec, ...] = ()
    head_columns: tuple[str, ...] = ()
    summary: type[SummaryRecord] | None = None
    compared: tuple[str, ...] = ()
    threshold_rules: tuple[ThresholdRule, ...] = ()

    def __post_init__(self) -> None:
        if not self.name.isidentifier() or self.name.startswith("_"):
            raise OptionError(f"an analysis name must be a public identifier; got {self.name!r}.")
        object.__setattr__(self, "options", tuple(self.options))
        object.__setattr__(self, "head_columns", tuple(self.head_columns))
        object.__setattr__(self, "threshold_rules", tuple(self.threshold_rules))
        known = self.summary.rules() if self.summary is not None else {}
        stray = [c for c in self.compared if c not in known]
        if stray:
            raise OptionError(f"analysis {self.name}: compared fields {stray} are not fields of its summary record.")

    def analysis(self) -> Analysis:
        """The analysis object (imported and built once per spec).

        Raises:
            OptionError: ``implementation`` builds an object whose ``name`` is
                not this spec's.
        """
        if id(self) not in _LOADED:
            made = self.implementation()
            if getattr(made, "name", None) != self.name:
                raise OptionError(f"analysis {self.name}: its implementation is named {getattr(made, 'name', None)!r}.")
            _LOADED[id(self)] = (self, made)  # the spec kept alive with it: its id is never reused
        return _LOADED[id(self)][1]
