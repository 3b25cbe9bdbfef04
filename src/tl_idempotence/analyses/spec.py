"""What an analysis declares about itself, beside its code, without importing torch.

Each report analysis has a small declaration module (``analyses/<name>_spec.py``, torch-free so that
``tl-idempotence --help`` stays fast) holding one :class:`AnalysisSpec`: its name, the report option(s) that
switch it on (:class:`~tl_idempotence.core.option_specs.OptionSpec`: name, default, type, validator, help, CLI
flag), the per-head columns it adds to ``rep.heads``, the summary numbers it contributes (and their field rules),
how its threshold-dependent outputs are derived (:mod:`.threshold`), and its code: a lazy reference to its class
(:class:`~tl_idempotence.core.lazy.Lazy`, imported when first called, so the declaration stays torch-free; the
class does not import its declaration back, ``tests/unit/test_layering.py``). Each field's type is checked when the
declaration is built; what the factory builds is checked (:func:`check_analysis`) when a user registers it and at
first use.
:mod:`tl_idempotence.analyses.registry` lists the specs once; the report options, the CLI's flags, the options
docstrings and ``compare``'s option checks are assembled from it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..core.option_specs import OptionSpec
from ..core.summaries import SUMMARY_RULES, SummaryRecord, check_summary_field, nan_says_why, rule
from ..errors import OptionError, OptionTypeError, TLIError
from .threshold import CountPerLayer, Flag, FractionPerHead, FunctionRule

if TYPE_CHECKING:  # pragma: no cover
    from .base import Analysis
    from .threshold import ThresholdRule

__all__ = [
    "ANALYSIS_MEMBERS",
    "SUMMARY_RULES",
    "AnalysisSpec",
    "SummaryRecord",
    "check_analysis",
    "check_summary_field",
    "nan_says_why",
    "rule",
]

_LOADED: dict[int, tuple[AnalysisSpec, Analysis]] = {}

#: What an analysis object has: the members of the :class:`~tl_idempotence.analyses.base.Analysis` protocol
#: (``tests/unit/analyses/test_registry.py`` checks the two agree; this module stays torch-free, ``base`` is not).
ANALYSIS_MEMBERS = ("name", "reason_column", "enabled", "run", "summarize")
_RULE_TYPES = (Flag, CountPerLayer, FractionPerHead, FunctionRule)


@dataclass(frozen=True)
class AnalysisSpec:
    """One report analysis, declared once (module docstring).

    Attributes:
        name: short name (``"scramble"``); the progress bar and error messages use it.
        implementation: a zero-argument factory returning its :class:`~tl_idempotence.analyses.base.Analysis`
            (a :class:`~tl_idempotence.core.lazy.Lazy` reference to its class, imported on first use; a function;
            or the class itself).
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
        self.check()

    def check(self) -> None:
        """Every field of the declaration against its type (at construction; :func:`~tl_idempotence.analyses.
        registry.register` checks again), the lists made tuples. Its implementation is built and checked by
        :meth:`analysis`.

        Raises:
            OptionTypeError: a field of the wrong type: a name that is no str, an implementation that is not
                callable, options that are not :class:`~tl_idempotence.core.option_specs.OptionSpec`, head columns or
                compared fields that are not a tuple or list of str (a str alone is refused), a summary that is no
                :class:`SummaryRecord` subclass, threshold rules that are not rules of :mod:`.threshold`. OptionError:
                a name that is no public identifier, a head column named twice, compared fields that are not fields
                of its summary record. Each message names the field and the analysis.
        """
        if not isinstance(self.name, str):
            raise OptionTypeError(f"an analysis name must be a str; got {type(self.name).__name__} {self.name!r}.")
        if not self.name.isidentifier() or self.name.startswith("_"):
            raise OptionError(f"an analysis name must be a public identifier; got {self.name!r}.")
        if not callable(self.implementation):
            want = "a zero-argument callable returning its Analysis (a factory or the class)"
            raise self._wrong("implementation", want, self.implementation)
        options = self._items("options", OptionSpec, "OptionSpec")
        head_columns = self._items("head_columns", str, "str")
        twice = sorted({c for c in head_columns if head_columns.count(c) > 1})
        if twice:
            raise OptionError(f"analysis {self.name!r}: head_columns names {twice} twice.")
        summary = self.summary
        if summary is not None and not (isinstance(summary, type) and issubclass(summary, SummaryRecord)):
            raise self._wrong("summary", "a SummaryRecord subclass or None", summary)
        compared = self._items("compared", str, "str")
        rules = self._items("threshold_rules", _RULE_TYPES, "Flag, CountPerLayer, FractionPerHead or FunctionRule")
        for r in rules:
            if isinstance(r, FunctionRule) and not callable(r.function):
                raise self._wrong("threshold_rules", "rules whose FunctionRule.function is callable", r.function)
        for name, value in (("options", options), ("head_columns", head_columns), ("compared", compared)):
            object.__setattr__(self, name, value)
        object.__setattr__(self, "threshold_rules", rules)
        known = summary.rules() if summary is not None else {}
        stray = [c for c in compared if c not in known]
        if stray:
            raise OptionError(f"analysis {self.name}: compared fields {stray} are not fields of its summary record.")

    def _wrong(self, field: str, want: str, got: Any, given: str = "got") -> OptionTypeError:
        """The error of a field of the wrong type (names the field, the analysis and what was given)."""
        return OptionTypeError(
            f"analysis {self.name!r}: {field} must be {want}; {given} {type(got).__name__} {_short(got)}."
        )

    def _items(self, field: str, kind: type | tuple[type, ...], what: str) -> tuple[Any, ...]:
        """The field, a tuple or list of ``kind``, as a tuple.

        Raises:
            OptionTypeError: not a tuple or list (a str alone included), or an item that is no ``kind``.
        """
        value = getattr(self, field)
        if not isinstance(value, (tuple, list)):
            raise self._wrong(field, f"a tuple (or list) of {what}", value)
        bad = [v for v in value if not isinstance(v, kind)]
        if bad:
            raise self._wrong(field, f"a tuple (or list) of {what}", bad[0], given="it holds")
        return tuple(value)

    def analysis(self) -> Analysis:
        """The analysis object (imported and built once per spec), checked (:func:`check_analysis`).

        Raises:
            OptionTypeError: ``implementation`` builds no :class:`~tl_idempotence.analyses.base.Analysis` (a member
                missing or of the wrong type). OptionError: it builds one whose ``name`` is not this spec's, or it
                raises an error that is not the library's (chained).
        """
        if id(self) not in _LOADED:
            try:
                made = self.implementation()
            except TLIError:
                raise
            except Exception as e:
                raise OptionError(
                    f"analysis {self.name!r}: its implementation {self.implementation!r} raised {type(e).__name__}: {e}"
                ) from e
            check_analysis(self.name, made)
            _LOADED[id(self)] = (self, made)  # the spec kept alive with it: its id is never reused
        return _LOADED[id(self)][1]


def check_analysis(name: str, made: Any) -> None:
    """``made`` is an analysis called ``name``: it has every member of :data:`ANALYSIS_MEMBERS`, ``name`` and
    ``reason_column`` (a str, or None) as attributes and ``enabled``, ``run`` and ``summarize`` callable.

    Raises:
        OptionTypeError: a class instead of an object; a member missing or of the wrong type (names the analysis,
            the member and what it got).
        OptionError: ``made.name`` is not ``name``.
    """
    if isinstance(made, type):
        raise OptionTypeError(
            f"analysis {name!r}: its implementation returned the class {made.__name__}, not an analysis object (give "
            "the class itself as the implementation, or a factory that returns an instance)."
        )
    missing = [m for m in ANALYSIS_MEMBERS if not hasattr(made, m)]
    if missing:
        raise OptionTypeError(
            f"analysis {name!r}: its implementation returned {type(made).__name__} {_short(made)}, which is no "
            f"Analysis: it has no {', '.join(missing)} (an Analysis has {', '.join(ANALYSIS_MEMBERS)}: "
            "tl_idempotence.analyses.base.Analysis)."
        )
    if made.name != name:
        raise OptionError(f"analysis {name}: its implementation is named {made.name!r}.")
    if made.reason_column is not None and not isinstance(made.reason_column, str):
        raise OptionTypeError(
            f"analysis {name!r}: its reason_column must be a str or None; got {type(made.reason_column).__name__} "
            f"{made.reason_column!r}."
        )
    not_callable = [m for m in ANALYSIS_MEMBERS[2:] if not callable(getattr(made, m))]
    if not_callable:
        raise OptionTypeError(f"analysis {name!r}: its implementation's {', '.join(not_callable)} must be methods.")


def _short(x: Any) -> str:
    """``repr(x)``, cut to 80 characters."""
    r = repr(x)
    return r if len(r) <= 80 else r[:77] + "..."
