"""Read-only JSON containers: what a result hands out cannot be edited in place.

A report's summary holds dicts and lists (``closed_per_layer``, ``processing``, ``versions``, ...). Handed out
as they are, ``rep.summary["closed_per_layer"][0] = 99`` changed the summary; ``rep.save`` then wrote a record
``load_report`` refuses, and a report made by ``with_threshold`` shared the edit. :func:`frozen` turns such a
value into :class:`FrozenDict` / :class:`FrozenList`: subclasses of ``dict`` and ``list`` (equal to, encoded in
JSON as, and ``isinstance`` of the plain types) whose every mutating method raises ``TypeError``. They pickle
and copy as themselves (``copy.deepcopy`` of one is a plain, editable copy, :func:`thawed`).
"""

from __future__ import annotations

from typing import Any, NoReturn

__all__ = ["FrozenDict", "FrozenList", "frozen", "thawed"]

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
