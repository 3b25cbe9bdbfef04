"""Read-only JSON containers: what a result hands out cannot be edited in place.

A report's summary holds dicts and lists (``closed_per_layer``, ``processing``, ``versions``, ...). Handed out
as they are, ``rep.summary["closed_per_layer"][0] = 99`` changed the summary; ``rep.save`` then wrote a record
``load_report`` refuses, and a report made by ``with_threshold`` shared the edit. :func:`frozen` turns such a
value into :class:`FrozenDict` / :class:`FrozenList`: subclasses of ``dict`` and ``list`` (equal to, encoded in
JSON as, and ``isinstance`` of the plain types) whose every mutating method raises ``TypeError``. They pickle
and copy as themselves (``copy.deepcopy`` of one is a plain, editable copy, :func:`thawed`).

:class:`NamedValue` is a typed, read-only attribute whose value its owner holds under the attribute's own name (the
options' typed attributes, :class:`~tl_idempotence.core.option_specs.Option`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, NoReturn, TypeVar, overload

__all__ = ["FrozenDict", "FrozenList", "NamedValue", "frozen", "thawed"]

T = TypeVar("T")

_HINT = "a result's summary is read-only: edit a copy (copy.deepcopy(value), or summary.to_dict())"


def _refuse(*_: Any, **__: Any) -> NoReturn:
    raise TypeError(_HINT)


class FrozenDict(dict):
    """A ``dict`` whose mutating methods raise ``TypeError`` (module docstring)."""

    __slots__ = ()
    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = __ior__ = _refuse

    def __reduce__(self) -> tuple[Any, ...]:
        return (FrozenDict, (dict(self),))

    def __copy__(self) -> FrozenDict:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> dict[str, Any]:
        return thawed(self)


class FrozenList(list):
    """A ``list`` whose mutating methods raise ``TypeError`` (module docstring)."""

    __slots__ = ()
    __setitem__ = __delitem__ = append = extend = insert = pop = remove = clear = sort = reverse = _refuse
    __iadd__ = __imul__ = _refuse

    def __reduce__(self) -> tuple[Any, ...]:
        return (FrozenList, (list(self),))

    def __copy__(self) -> FrozenList:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> list[Any]:
        return thawed(self)


def frozen(value: Any) -> Any:
    """``value`` with every dict and list in it (recursively) read-only; other values as they are.

    Raises: nothing.
    """
    if isinstance(value, dict):
        return FrozenDict({k: frozen(v) for k, v in value.items()})
    if isinstance(value, list):
        return FrozenList(frozen(v) for v in value)
    if isinstance(value, tuple) and not hasattr(value, "_fields"):  # its items (a named tuple is left as it is)
        return tuple(frozen(v) for v in value)
    return value


def thawed(value: Any) -> Any:
    """A plain, editable deep copy of ``value``'s dicts and lists (the inverse of :func:`frozen`).

    Raises: nothing.
    """
    if isinstance(value, dict):
        return {k: thawed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [thawed(v) for v in value]
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(thawed(v) for v in value)
    return value


class NamedValue(Generic[T]):
    """A typed, read-only attribute whose value its owner holds under the attribute's own name (one source):
    ``read(obj, name)`` gives it; on the class, the descriptor itself. Static tools read ``x: NamedValue[int]`` on
    an instance as an ``int``.

    Attributes:
        name: the attribute's name (set when the owner class is built).
    """

    def __init__(self, read: Callable[[Any, str], T], doc: str | None = None) -> None:
        self.read = read
        self.name = ""
        self.__doc__ = doc

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> NamedValue[T]: ...

    @overload
    def __get__(self, obj: object, owner: type | None = None) -> T: ...

    def __get__(self, obj: object | None, owner: type | None = None) -> T | NamedValue[T]:
        return self if obj is None else self.read(obj, self.name)

    def __set__(self, obj: object, value: Any) -> None:
        raise AttributeError(f"{self.name} is read-only")
