"""Frozen results with tables, and typed read-only summary records.

:class:`FrozenResult` is the base of the results that hold per-head tables (``HeadRoles``, ``RoleAssociation``,
``HeadTokens``, ``AttendedTokenEffect``, ``Mechanism``): its :attr:`~FrozenResult.table` and
:attr:`~FrozenResult.heads` are copies made on each read (editing one leaves the result as it is), and assigning or
deleting an attribute raises ``dataclasses.FrozenInstanceError`` (but the names a subclass lists in
:attr:`~FrozenResult.settable`, set once by a loader). A subclass's ``__init__`` stores its attributes with
:meth:`~FrozenResult._freeze`.

:class:`FrozenSummary` is the base of the typed summary records of those results and of ``Ablation``: a subclass
declares its fields as class annotations (``n_heads: int``, in the order the producer writes them), and a record is
a :class:`~tl_idempotence.core.frozen.FrozenDict` of the fields given: ``summary["n_heads"]``, ``dict(summary)``,
``json.dumps(summary)`` and equality with a plain dict work as for a dict, and ``summary.n_heads`` reads a field by
attribute (typed for mypy; ``None`` when the field was not given). A key that is no declared field is refused
(``OptionError`` naming it), and assigning an attribute or an item raises.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Iterable, Mapping
from dataclasses import FrozenInstanceError
from typing import TYPE_CHECKING, Any, ClassVar, NoReturn

from ..errors import OptionError, OptionTypeError
from .frozen import FrozenDict, frozen, thawed
from .results import Result

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

    from .heads import ModelInfo

__all__ = ["FrozenResult", "FrozenSummary", "ModelResult"]


class FrozenResult(Result):
    """Base of an immutable result with a per-head table (module docstring).

    Subclasses store ``_table`` (never handed out) and their other attributes with :meth:`_freeze` in their
    ``__init__``, and name themselves in :attr:`frozen_name` (``"head roles are"``) and how to get a changed one in
    :attr:`frozen_hint` (``"compute them again"``) for the error.
    """

    #: Subject of the immutability error: ``"cannot assign to 'x': {frozen_name} immutable ({frozen_hint})."``.
    frozen_name: ClassVar[str] = "this result is"
    frozen_hint: ClassVar[str] = "compute it again"
    #: Attributes that may be set after construction (``loaded_from``, set once by a loader; never a number).
    settable: ClassVar[frozenset[str]] = frozenset()
    #: The typed record :meth:`_freeze_result` stores ``summary`` as (a :class:`FrozenSummary` subclass).
    summary_type: ClassVar[type[FrozenSummary]]

    _table: pd.DataFrame
    summary: FrozenSummary
    loaded_from: str | None

    def _freeze(self, **attrs: Any) -> None:
        """Store ``attrs`` on a result whose ``__setattr__`` refuses (for ``__init__``); ``_table`` is copied (never
        handed out: :attr:`table` gives copies). Raises nothing."""
        for name, value in attrs.items():
            object.__setattr__(self, name, value.copy() if name == "_table" else value)

    def _freeze_result(
        self, table: pd.DataFrame, summary: Mapping[str, Any], loaded_from: str | None, **attrs: Any
    ) -> None:
        """:meth:`_freeze` of a result's ``_table`` (copied), ``summary`` (stored as :attr:`summary_type`),
        ``loaded_from`` and ``attrs``; an ``options`` attribute is stored read-only (``None``: empty).

        Raises:
            OptionTypeError / OptionError: ``summary`` is not a mapping of :attr:`summary_type`'s fields.
        """
        if "options" in attrs:
            attrs["options"] = frozen(dict(attrs["options"] or {}))
        self._freeze(_table=table, summary=self.summary_type(summary), loaded_from=loaded_from, **attrs)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self.settable:
            object.__setattr__(self, name, value)
            return
        raise FrozenInstanceError(f"cannot assign to {name!r}: {self.frozen_name} immutable ({self.frozen_hint}).")

    def __delattr__(self, name: str) -> None:
        raise FrozenInstanceError(f"cannot delete {name!r}: {self.frozen_name} immutable.")

    @property
    def table(self) -> pd.DataFrame:
        """One row per head, indexed by ``"L10H8"`` labels (the class docstring says its columns): a copy, made on
        each read (take it once in a loop)."""
        return self._table.copy()

    @property
    def heads(self) -> pd.DataFrame:
        """:attr:`table` (every result has ``heads``): a copy, made on each read."""
        return self._table.copy()


class ModelResult(FrozenResult):
    """A :class:`FrozenResult` computed from one model (``HeadRoles``, ``HeadTokens``, ``AttendedTokenEffect``): it
    also holds that model's :class:`~tl_idempotence.core.heads.ModelInfo` (:attr:`info`) and the read-only options
    it was computed with (:attr:`options`), both stored by :meth:`~FrozenResult._freeze_result`."""

    info: ModelInfo
    options: Mapping[str, Any]


def _refuse_item(*_: Any, **__: Any) -> NoReturn:
    raise TypeError("a result's summary is read-only: edit a copy (summary.to_dict())")


class FrozenSummary(FrozenDict):
    """A typed, read-only summary record (module docstring). Subclasses declare their fields as annotations.

    Raises (on construction):
        OptionTypeError: not a mapping. OptionError: a key that is not a declared field (names it and the record).
    """

    __slots__ = ()

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
        dict.__init__(self, {k: frozen(v) for k, v in items.items()})

    @classmethod
    @functools.cache
    def fields(cls) -> tuple[str, ...]:
        """The declared fields, in order (the base classes' first)."""
        out: list[str] = []
        for c in reversed(cls.__mro__):
            if isinstance(c, type) and issubclass(c, FrozenSummary) and c is not FrozenSummary:
                out += [k for k in inspect.get_annotations(c) if k not in out]
        return tuple(out)

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
        return (type(self), (dict(self),))

    def to_dict(self) -> dict[str, Any]:
        """The fields given, in order, as a plain, editable dict (JSON values)."""
        return {k: thawed(v) for k, v in self.items()}
