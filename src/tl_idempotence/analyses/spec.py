"""What an analysis declares about itself, beside its code, without importing torch.

Each report analysis has a small declaration module (``analyses/<name>_spec.py``, torch-free so that
``tl-idempotence --help`` stays fast) holding one :class:`AnalysisSpec`: its name, the report option(s) that
switch it on (:class:`~tl_idempotence.core.option_specs.OptionSpec`: name, default, type, validator, help, CLI
flag), the per-head columns it adds to ``rep.heads``, the summary numbers it contributes (and their field rules),
how its threshold-dependent outputs are derived (:mod:`.threshold`), and its code: a factory function that imports
its class when first called (so the declaration stays torch-free and every tool follows the call; the class does not
import its declaration back, ``tests/unit/test_layering.py``). Each field's type is checked when the declaration is
built; what the factory builds is checked (:func:`check_analysis`) when a user registers it and at first use.
:mod:`tl_idempotence.analyses.registry` lists the specs once; the report options, the CLI's flags, the options
docstrings and ``compare``'s option checks are assembled from it.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Iterator, Mapping
from dataclasses import MISSING, dataclass, fields
from typing import TYPE_CHECKING, Any, ClassVar

from ..core.frozen import frozen, thawed
from ..core.option_specs import OptionSpec
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

#: The rules a summary field may have (:func:`check_summary_field`): ``"size"`` an int >= 1; ``"count"`` an
#: int >= 0 (``bool`` is not an int, a float is never truncated); ``"P"`` a float in [0, 1] or NaN (a median or
#: maximum of P over no defined value: undefined); ``"fraction"`` a float in [0, 1] or NaN (of nothing:
#: undefined); ``"threshold"`` a finite float in [0, 1]; ``"str"``; ``"layers"`` a list of layer indices (ints
#: >= 0); ``"strs"`` a list of str; ``"per_layer"`` a dict {layer index: count}; ``"dict"`` a dict keyed by str.
SUMMARY_RULES = frozenset({"size", "count", "P", "fraction", "threshold", "str", "layers", "strs", "per_layer", "dict"})

_LOADED: dict[int, tuple[AnalysisSpec, Analysis]] = {}

#: What an analysis object has: the members of the :class:`~tl_idempotence.analyses.base.Analysis` protocol
#: (``tests/unit/analyses/test_registry.py`` checks the two agree; this module stays torch-free, ``base`` is not).
ANALYSIS_MEMBERS = ("name", "reason_column", "enabled", "run", "summarize")
_RULE_TYPES = (Flag, CountPerLayer, FractionPerHead, FunctionRule)


def _is_int(v: Any) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool) and type(v).__name__ != "bool_"


def _is_real(v: Any) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool) and type(v).__name__ != "bool_"


def check_summary_field(name: str, rule: str, v: Any) -> None:
    """One summary field against its rule (:data:`SUMMARY_RULES`).

    Raises:
        OptionTypeError: the wrong type (names the field and the value). OptionError: an impossible value.
    """

    def wrong_type(want: str) -> OptionTypeError:
        return OptionTypeError(f"summary field {name} must be {want}; got {type(v).__name__} {v!r}.")

    if rule == "str":
        if not isinstance(v, str):
            raise wrong_type("a str")
    elif rule in ("size", "count"):
        if not _is_int(v):
            raise wrong_type("an int (not a bool or a float)")
        lo = 1 if rule == "size" else 0
        if v < lo:
            raise OptionError(f"summary field {name}={v!r} is impossible: it must be an int >= {lo}.")
    elif rule in ("P", "fraction", "threshold"):
        if not _is_real(v):
            raise wrong_type("a real number (not a bool or a str)")
        x = float(v)
        if math.isnan(x) and rule != "threshold":
            return  # undefined (over no defined value); the fields that say why are checked with the counts
        if not (math.isfinite(x) and 0.0 <= x <= 1.0):
            what = "a finite number in [0, 1]" if rule == "threshold" else "in [0, 1] (or NaN: undefined)"
            raise OptionError(f"summary field {name}={v!r} is impossible: it must be {what}.")
    elif rule in ("layers", "strs"):
        if not isinstance(v, list):
            raise wrong_type("a list")
        for x in v:
            if rule == "strs" and not isinstance(x, str):
                raise OptionTypeError(f"summary field {name} must be a list of str; it holds {type(x).__name__} {x!r}.")
            if rule == "layers" and not (_is_int(x) and x >= 0):
                raise OptionError(f"summary field {name} must be a list of layer indices (ints >= 0); it holds {x!r}.")
    elif rule == "per_layer":
        if not isinstance(v, dict):
            raise wrong_type("a dict {layer: count}")
        for k, x in v.items():
            if not (_is_int(k) and k >= 0) or not (_is_int(x) and x >= 0):
                raise OptionError(
                    f"summary field {name} must map layer indices (ints >= 0) to counts (ints >= 0); it holds "
                    f"{k!r}: {x!r}."
                )
    elif rule == "dict":
        if not isinstance(v, dict):
            raise wrong_type("a dict")
        bad = [k for k in v if not isinstance(k, str)]
        if bad:
            raise OptionTypeError(f"summary field {name} must be keyed by str; it has the key {bad[0]!r}.")
    else:  # pragma: no cover - a rule this function does not know
        raise AssertionError(rule)


def nan_says_why(name: str, value: Any, undefined: bool, why: str) -> None:
    """A summary value that is NaN exactly when it is undefined (``undefined``: there is nothing to take it over).

    Raises:
        OptionError: NaN while defined, or a number while undefined (says ``why``: the counts that decide).
    """
    if value is not None and math.isnan(float(value)) != bool(undefined):
        raise OptionError(f"summary field {name}={value!r} is impossible: it is NaN (undefined) exactly when {why}.")


def rule(name: str) -> dict[str, str]:
    """The metadata of a :class:`SummaryRecord` field with its rule (:data:`SUMMARY_RULES`):
    ``n_closed: int = field(metadata=rule("count"))``; a field that may be unset (``None``, left out of
    :meth:`SummaryRecord.to_dict`, e.g. notes that exist only when there is one) has ``default=None``.

    Raises:
        OptionError: not a known rule.
    """
    if name not in SUMMARY_RULES:
        raise OptionError(f"summary rule {name!r} is not one of {sorted(SUMMARY_RULES)}.")
    return {"rule": name}


@dataclass(frozen=True)
class SummaryRecord(Mapping[str, Any]):
    """An analysis's model-level numbers: a frozen dataclass whose fields carry a :func:`rule`, each checked
    against its rule when the record is built (and :attr:`bounds` among its own fields); also a read-only mapping
    of the fields that are set.

    The checks against the rest of the report (a count against ``n_heads``, a NaN that must say why) are
    :attr:`bounds` naming report fields and :meth:`check`, which the report summary runs with its flat fields.
    """

    #: ``(count, total)``: a count that cannot exceed another number, of this record or of the report (``n_heads``).
    bounds: ClassVar[tuple[tuple[str, str], ...]] = ()

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if v is None and f.default is None:
                continue
            check_summary_field(f.name, f.metadata["rule"], v)
            object.__setattr__(self, f.name, frozen(v))  # its lists and dicts cannot be edited in place
        own = self.to_dict()
        for count, total in self.bounds:
            a, b = own.get(count), own.get(total)
            if a is not None and b is not None and a > b:
                raise OptionError(f"summary field {count}={a!r} is impossible: more than {total}={b!r}.")

    def check(self, report: Mapping[str, Any]) -> None:
        """Checks of this record against the report's flat summary fields ``report`` (this record's included), e.g.
        a NaN exactly when there is nothing to take it over; none by default. A field ``report`` lacks is not
        checked.

        Raises:
            OptionError: names the fields and their values.
        """

    @classmethod
    def rules(cls) -> dict[str, str]:
        """``{field: rule}`` in order."""
        return {f.name: f.metadata["rule"] for f in fields(cls)}

    @classmethod
    def required(cls) -> tuple[str, ...]:
        """The fields that must be set."""
        return tuple(f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING)

    def to_dict(self) -> dict[str, Any]:
        """The fields that are set, in order (JSON values; the form a saved report holds): a plain, editable copy."""
        return {f.name: thawed(getattr(self, f.name)) for f in fields(self) if getattr(self, f.name) is not None}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SummaryRecord:
        """A record from :meth:`to_dict`, checked.

        Raises:
            OptionTypeError: not a mapping; a field of the wrong type. OptionError: a key that is no field, a
                required field missing, an impossible value (each named).
        """
        if not isinstance(d, Mapping):
            raise OptionTypeError(f"a {cls.__name__} must be a mapping of its fields; got {type(d).__name__}.")
        known = cls.rules()
        unknown = [k for k in d if k not in known]
        if unknown:
            raise OptionError(f"summary keys {unknown[:5]} are not fields of {cls.__name__}")
        missing = [k for k in cls.required() if k not in d]
        if missing:
            raise OptionError(f"summary lacks {missing[:5]}")
        out = cls(**dict(d))
        out.check(out.to_dict())
        return out

    def __getitem__(self, key: str) -> Any:
        v = getattr(self, key, None) if isinstance(key, str) and key in self.rules() else None
        if v is None:
            raise KeyError(key)
        return v

    def __iter__(self) -> Iterator[str]:
        return (f.name for f in fields(self) if getattr(self, f.name) is not None)

    def __len__(self) -> int:
        return sum(1 for _ in self)


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
