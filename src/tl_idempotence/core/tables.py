"""The one way a result is frozen (:class:`ImmutableResult`), and the results that hold a per-head table.

Every public result (every class deriving from :class:`~tl_idempotence.core.results.Result`: the closure maths'
``Closure``, the analyses' results, the probes', the report, comparisons, sweeps, trajectories) derives from
:class:`ImmutableResult`, one idiom:

* **attributes are set once, by the constructor**: a dataclass result's generated ``__init__`` sets each field
  once (its constructor, fields and ``dataclasses.replace`` stay as they are), any other ``__init__`` (and a
  dataclass's ``__post_init__``) stores with :meth:`~ImmutableResult._freeze`. After that, assigning or deleting an
  attribute raises ``dataclasses.FrozenInstanceError`` naming the result and how to get a changed one
  (:attr:`~ImmutableResult.frozen_name`, :attr:`~ImmutableResult.frozen_hint`), but for the names a class lists in
  :attr:`~ImmutableResult.settable` (``loaded_from``, set by a loader; never a number).
* **tables are copied**: a DataFrame is copied when it is stored, and every public DataFrame attribute is handed
  out as a copy made on each read (editing it leaves the result as it is; take it once in a loop). A property that
  hands out a frame (``heads`` of a ``_table``, ``signs``, ``tables[name]``) copies it too; a property that builds
  a new frame on each read already is one.
* **dicts and lists are read-only**: stored as :func:`~tl_idempotence.core.frozen.frozen` values (``FrozenDict``,
  ``FrozenList``; equal to and JSON-encoded as the plain types); a summary is a
  :class:`~tl_idempotence.core.summaries.FrozenSummary` or such a read-only dict.

``tests/unit/core/test_frozen_results.py`` finds every ``Result`` subclass of the package and checks each of these
on a small instance (a result type without a factory there fails it).

:class:`FrozenResult` is the :class:`ImmutableResult` of the results that hold a per-head table (``HeadRoles``,
``RoleAssociation``, ``HeadTokens``, ``AttendedTokenEffect``, ``Mechanism``): its :attr:`~FrozenResult.table` and
:attr:`~FrozenResult.heads` are copies of ``_table`` and its ``summary`` is stored as its :attr:`summary_type`
(:meth:`~FrozenResult._freeze_result`). :class:`FrozenSummary` (re-exported from :mod:`.summaries`) is the one
record class of every summary.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import FrozenInstanceError
from typing import TYPE_CHECKING, Any, ClassVar

from ..errors import RegistrationError
from .frozen import FrozenDict, FrozenList, frozen
from .results import Result
from .summaries import FrozenSummary

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

    from .heads import ModelInfo

__all__ = ["FrozenResult", "FrozenSummary", "ImmutableResult", "ModelResult", "is_frame", "read_only"]


def is_frame(value: Any) -> bool:
    """Whether ``value`` is a pandas DataFrame (without importing pandas: a frame exists only once it is)."""
    pd = sys.modules.get("pandas")
    return pd is not None and isinstance(value, pd.DataFrame)


def read_only(value: Any) -> Any:
    """What a result stores for ``value``: a copy of a DataFrame, a dict or list made read-only
    (:func:`~tl_idempotence.core.frozen.frozen`; one that already is, a typed summary included, as it is), any
    other value as it is. Raises nothing."""
    if isinstance(value, (FrozenDict, FrozenList)):
        return value
    if isinstance(value, (dict, list)):
        return frozen(value)
    if is_frame(value):
        return value.copy()
    return value


class ImmutableResult(Result):
    """THE base of every public result: frozen attributes, tables copied, dicts and lists read-only (module
    docstring).

    A subclass names itself in :attr:`frozen_name` (``"a report is"``) and how to get a changed one in
    :attr:`frozen_hint` (``"rep.with_threshold(t) for another threshold"``), for the error: both in one class
    keyword, ``frozen=(name, hint)`` (:meth:`__init_subclass__`).
    """

    #: Subject of the immutability error: ``"cannot assign to 'x': {frozen_name} immutable ({frozen_hint})."``.
    frozen_name: ClassVar[str] = "this result is"
    frozen_hint: ClassVar[str] = "compute it again"
    #: Attributes that may be set after construction (``loaded_from``, set by a loader; never a number).
    settable: ClassVar[frozenset[str]] = frozenset()

    def __init_subclass__(cls, *, frozen: tuple[str, str] | None = None, **kwargs: Any) -> None:
        """A subclass declares ``frozen=(frozen_name, frozen_hint)`` as a class keyword
        (``class Scramble(ImmutableResult, frozen=("a scramble result is", "compute it again"))``); left out, it keeps
        what its body or a base says.

        Raises:
            RegistrationError: ``frozen`` is not a tuple of two non-empty str (at the class statement, naming it).
        """
        super().__init_subclass__(**kwargs)
        if frozen is not None:
            if not (isinstance(frozen, tuple) and len(frozen) == 2 and all(isinstance(x, str) and x for x in frozen)):
                raise RegistrationError(
                    f"class {cls.__name__}: frozen must be (frozen_name, frozen_hint), two non-empty str; "
                    f"got {frozen!r}."
                )
            cls.frozen_name, cls.frozen_hint = frozen

    def _freeze(self, **attrs: Any) -> None:
        """Store ``attrs`` on a result whose ``__setattr__`` refuses (for ``__init__`` and ``__post_init__``), each as
        :func:`read_only` gives it (a frame copied, a dict or list read-only). Raises nothing."""
        for name, value in attrs.items():
            object.__setattr__(self, name, read_only(value))

    def __setattr__(self, name: str, value: Any) -> None:
        # a dataclass's generated __init__ sets each field once; settable names any time
        if name in self.settable or (
            name in getattr(type(self), "__dataclass_fields__", ()) and name not in self.__dict__
        ):
            object.__setattr__(self, name, read_only(value))
            return
        raise FrozenInstanceError(f"cannot assign to {name!r}: {self.frozen_name} immutable ({self.frozen_hint}).")

    def __delattr__(self, name: str) -> None:
        raise FrozenInstanceError(f"cannot delete {name!r}: {self.frozen_name} immutable ({self.frozen_hint}).")

    def __getattribute__(self, name: str) -> Any:
        value = object.__getattribute__(self, name)
        if name[:1] != "_" and is_frame(value) and name in object.__getattribute__(self, "__dict__"):
            return value.copy()  # a stored table, handed out: a copy made on each read
        return value


class FrozenResult(ImmutableResult):
    """An :class:`ImmutableResult` with a per-head table (module docstring).

    Subclasses store ``_table`` (never handed out) and their other attributes with :meth:`_freeze` or
    :meth:`_freeze_result` in their ``__init__``.
    """

    #: The typed record :meth:`_freeze_result` stores ``summary`` as (a :class:`FrozenSummary` subclass).
    summary_type: ClassVar[type[FrozenSummary]]

    def __init_subclass__(cls, *, summary_type: type[FrozenSummary] | None = None, **kwargs: Any) -> None:
        """A subclass declares its :attr:`summary_type` as a class keyword (``summary_type=HeadRolesSummary``).

        Raises:
            RegistrationError: ``summary_type`` is not a :class:`FrozenSummary` subclass (at the class statement).
        """
        super().__init_subclass__(**kwargs)
        if summary_type is not None:
            if not (isinstance(summary_type, type) and issubclass(summary_type, FrozenSummary)):
                raise RegistrationError(
                    f"class {cls.__name__}: summary_type must be a FrozenSummary subclass; got {summary_type!r}."
                )
            cls.summary_type = summary_type

    _table: pd.DataFrame
    summary: FrozenSummary
    loaded_from: str | None

    def _freeze_result(
        self, table: pd.DataFrame, summary: Mapping[str, Any], loaded_from: str | None, **attrs: Any
    ) -> None:
        """:meth:`_freeze` of a result's ``_table`` (copied), ``summary`` (stored as :attr:`summary_type`),
        ``loaded_from`` and ``attrs``; an ``options`` attribute is stored read-only (``None``: empty).

        Raises:
            OptionTypeError / OptionError: ``summary`` is not a mapping of :attr:`summary_type`'s fields.
        """
        if "options" in attrs:
            attrs["options"] = dict(attrs["options"] or {})
        self._freeze(_table=table, summary=self.summary_type(summary), loaded_from=loaded_from, **attrs)

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
