"""The one record class of every summary: :class:`FrozenSummary`, typed, read-only, a mapping (torch-free).

Every result's summary record derives from :class:`FrozenSummary` (the per-head results' ``HeadRolesSummary``,
``MechanismSummary``, ``AblationSummary``, ...; the analyses' ``ClosureSummary``, ``ScrambleSummary``, ... through
:class:`SummaryRecord`; the report's ``ReportSummary``). A record is a
:class:`~tl_idempotence.core.frozen.FrozenDict` of the fields that are set:

* a mapping: ``summary["n_closed"]``, ``dict(summary)``, iteration over the fields that are set, ``json.dumps``,
  equality with a plain dict; read-only (an item assignment or any mutating method raises ``TypeError``, an
  attribute assignment ``dataclasses.FrozenInstanceError``; its dicts and lists are read-only too);
* typed: each field reads as an attribute (``summary.n_closed``, typed for mypy; ``None`` when not set);
* declared once: a key that is no declared field is refused (``OptionError`` naming it and the record); a field
  may carry a rule (:func:`rule`: ``count``, ``P``, ``fraction``, ...; :data:`SUMMARY_RULES`) checked when the
  record is built (:func:`check_summary_field`), :attr:`~FrozenSummary.bounds` relate its counts (a count that
  cannot exceed a total) and :meth:`~FrozenSummary.check` relates it to the report's fields;
* pickled as itself (Dask sends results between processes); ``copy.copy`` is the record itself.

Two ways to declare the fields, one class:

* **annotations** (the per-head results' records): ``class HeadRolesSummary(FrozenSummary)`` with
  ``n_heads: int | None`` in the order the producer writes them; built from a mapping
  (``HeadRolesSummary({"n_heads": 3})``), every field optional, a field given (even as ``None``) is set;
  ``copy.deepcopy`` gives a plain, editable dict.
* **a frozen dataclass** (:class:`SummaryRecord`, the analyses' records): ``n_closed: int =
  field(metadata=rule("count"))``; built by keyword, each field checked against its rule; a field with
  ``default=None`` that is ``None`` is not set; ``copy.deepcopy`` gives the record itself (it composes the report's
  summary).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
import numbers
from collections.abc import Iterable, Mapping
from dataclasses import FrozenInstanceError, dataclass
from typing import TYPE_CHECKING, Any, ClassVar, NoReturn, TypeVar

from ..errors import OptionError, OptionTypeError
from .frozen import FrozenDict, frozen, thawed

__all__ = [
    "SUMMARY_RULES",
    "FrozenSummary",
    "SummaryRecord",
    "check_summary_field",
    "nan_says_why",
    "rule",
]

_S = TypeVar("_S", bound="FrozenSummary")

#: The rules a summary field may have (:func:`check_summary_field`): ``"size"`` an int >= 1; ``"count"`` an
#: int >= 0 (``bool`` is not an int, a float is never truncated); ``"P"`` a float in [0, 1] or NaN (a median or
#: maximum of P over no defined value: undefined); ``"fraction"`` a float in [0, 1] or NaN (of nothing:
#: undefined); ``"threshold"`` a finite float in [0, 1]; ``"str"``; ``"layers"`` a list of layer indices (ints
#: >= 0); ``"strs"`` a list of str; ``"per_layer"`` a dict {layer index: count}; ``"dict"`` a dict keyed by str.
SUMMARY_RULES = frozenset({"size", "count", "P", "fraction", "threshold", "str", "layers", "strs", "per_layer", "dict"})


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
    :meth:`FrozenSummary.to_dict`, e.g. notes that exist only when there is one) has ``default=None``.

    Raises:
        OptionError: not a known rule.
    """
    if name not in SUMMARY_RULES:
        raise OptionError(f"summary rule {name!r} is not one of {sorted(SUMMARY_RULES)}.")
    return {"rule": name}


def _refuse_item(*_: Any, **__: Any) -> NoReturn:
    raise TypeError("a result's summary is read-only: edit a copy (summary.to_dict())")


def _remake(cls: type[_S], items: dict[str, Any]) -> _S:
    """A record of ``cls`` from its set fields (what a pickle holds)."""
    return cls._make(items)


class FrozenSummary(FrozenDict):
    """A typed, read-only summary record: THE record class of every summary (module docstring). Subclasses declare
    their fields as annotations, or as a frozen dataclass (:class:`SummaryRecord`).

    Raises (on construction from a mapping):
        OptionTypeError: not a mapping. OptionError: a key that is not a declared field (names it and the record).
    """

    __slots__ = ()
    #: ``(count, total)``: a count that cannot exceed another number, of this record (checked when it is built) or
    #: of the report (``n_heads``; checked by the report's summary).
    bounds: ClassVar[tuple[tuple[str, str], ...]] = ()

    def __init__(self, items: Mapping[str, Any] | Iterable[tuple[str, Any]] = (), /) -> None:
        if not isinstance(items, Mapping):
            try:
                items = dict(items)
            except (TypeError, ValueError) as e:
                raise OptionTypeError(
                    f"a {type(self).__name__} is made from a mapping of its fields; got {type(items).__name__}."
                ) from e
        known = self.fields()
        unknown = [k for k in items if k not in known]
        if unknown:
            raise OptionError(
                f"summary keys {unknown[:5]} are not fields of {type(self).__name__} (its fields: {list(known)})."
            )
        self._set_fields({k: frozen(v) for k, v in items.items()})

    def _set_fields(self, values: Mapping[str, Any]) -> None:
        """Store the set fields ``values`` (read-only values, in order) as the record's items, after checking
        :attr:`bounds` among them. For the constructors only.

        Raises:
            OptionError: a count more than its total (names both and their values).
        """
        for count, total in self.bounds:
            a, b = values.get(count), values.get(total)
            if a is not None and b is not None and a > b:
                raise OptionError(f"summary field {count}={a!r} is impossible: more than {total}={b!r}.")
        dict.update(self, values)

    # ---------------------------------------------------------------- the declaration
    @classmethod
    @functools.cache
    def fields(cls) -> tuple[str, ...]:
        """The declared fields, in order (the base classes' first)."""
        if dataclasses.is_dataclass(cls):
            return tuple(f.name for f in dataclasses.fields(cls))
        out: list[str] = []
        for c in reversed(cls.__mro__):
            if isinstance(c, type) and issubclass(c, FrozenSummary) and c is not FrozenSummary:
                out += [
                    k
                    for k, a in inspect.get_annotations(c).items()
                    if k not in out and not str(a).startswith(("ClassVar", "typing.ClassVar"))
                ]
        return tuple(out)

    @classmethod
    def rules(cls) -> dict[str, str]:
        """``{field: rule}`` in order, of the fields declared with a :func:`rule` (a :class:`SummaryRecord`'s, every
        field; an annotation-declared record's: none)."""
        if not dataclasses.is_dataclass(cls):
            return {}
        return {f.name: f.metadata["rule"] for f in dataclasses.fields(cls)}

    @classmethod
    def required(cls) -> tuple[str, ...]:
        """The fields that must be set (an annotation-declared record's: none)."""
        if not dataclasses.is_dataclass(cls):
            return ()
        return tuple(
            f.name
            for f in dataclasses.fields(cls)
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        )

    def check(self, report: Mapping[str, Any]) -> None:
        """Checks of this record against the report's flat summary fields ``report`` (this record's included), e.g.
        a NaN exactly when there is nothing to take it over; none by default. A field ``report`` lacks is not
        checked.

        Raises:
            OptionError: names the fields and their values.
        """

    # ---------------------------------------------------------------- conversions
    @classmethod
    def _make(cls: type[_S], items: Mapping[str, Any]) -> _S:
        """A record from its set fields: by keyword for a dataclass record, else from the mapping."""
        return cls(**dict(items)) if dataclasses.is_dataclass(cls) else cls(items)

    def to_dict(self) -> dict[str, Any]:
        """The fields that are set, in order (JSON values; the form a saved result holds): a plain, editable copy."""
        return {k: thawed(v) for k, v in self.items()}

    @classmethod
    def from_dict(cls: type[_S], d: Mapping[str, Any]) -> _S:
        """A record from :meth:`to_dict`, checked (its rules, :attr:`bounds` and :meth:`check` against itself).

        Raises:
            OptionTypeError: not a mapping; a field of the wrong type. OptionError: a key that is no field, a
                required field missing, an impossible value (each named).
        """
        if not isinstance(d, Mapping):
            raise OptionTypeError(f"a {cls.__name__} must be a mapping of its fields; got {type(d).__name__}.")
        known = cls.fields()
        unknown = [k for k in d if k not in known]
        if unknown:
            raise OptionError(f"summary keys {unknown[:5]} are not fields of {cls.__name__}")
        missing = [k for k in cls.required() if k not in d]
        if missing:
            raise OptionError(f"summary lacks {missing[:5]}")
        out = cls._make(d)
        out.check(out.to_dict())
        return out

    # ---------------------------------------------------------------- read-only
    if not TYPE_CHECKING:  # a declared field not set reads as None; mypy sees only the declared fields

        def __getattr__(self, name: str) -> Any:
            if not name.startswith("_") and name in type(self).fields():
                return self.get(name)
            raise AttributeError(f"{type(self).__name__} has no field {name!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        raise FrozenInstanceError(f"cannot assign to {name!r}: a result's summary is read-only (summary.to_dict()).")

    def __delattr__(self, name: str) -> None:
        raise FrozenInstanceError(f"cannot delete {name!r}: a result's summary is read-only.")

    __setitem__ = __delitem__ = _refuse_item

    def __reduce__(self) -> tuple[Any, ...]:
        return (_remake, (type(self), dict(self)))


@dataclass(frozen=True)
class SummaryRecord(FrozenSummary):
    """A :class:`FrozenSummary` declared as a frozen dataclass whose fields carry a :func:`rule` (an analysis's
    model-level numbers): built by keyword, each field checked against its rule (and :attr:`bounds` among its own
    fields) when the record is built; a read-only mapping of the fields that are set (a field with
    ``default=None`` is set when it is not ``None``).

    The checks against the rest of the report (a count against ``n_heads``, a NaN that must say why) are
    :attr:`bounds` naming report fields and :meth:`check`, which the report summary runs with its flat fields.

    Raises (on construction):
        OptionTypeError / OptionError: a field against its rule (:func:`check_summary_field`), a count more than
            its total (:attr:`bounds`).
    """

    def __post_init__(self) -> None:
        values: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if v is None and f.default is None:
                continue
            check_summary_field(f.name, f.metadata["rule"], v)
            v = frozen(v)  # its lists and dicts cannot be edited in place
            object.__setattr__(self, f.name, v)
            values[f.name] = v
        self._set_fields(values)

    def __deepcopy__(self, memo: dict[int, Any]) -> SummaryRecord:
        return self  # read-only all through: the record itself (the report's summary composes records)
