"""THE list of stored result types: every result that saves itself declares it here, once, and passes one contract.

A stored result class derives from :class:`StoredResult` and declares, in its class body, a :class:`StoreSpec`
(``store = StoreSpec(name="report", formats=(...), ...)``, its record ``report.json``): the class is then in
:data:`STORED` under that name. Every stored result

* saves through THE store (:func:`~tl_idempotence.core.store.write_folder`: written beside its folder and put in
  place in one step; created exclusively) with ``result.save(path, overwrite=False)``;
* loads with ``Class.load(path)``, which checks every file's sha256 and the record's digest, recomputes from the
  tables what the record states, and checks the identity fields every loader checks
  (:func:`~tl_idempotence.core.records.check_identity`: sizes, kv map, model, and every summary field that restates an
  option or the model's info);
* is frozen (:class:`~tl_idempotence.core.tables.FrozenResult`'s idiom: assigning an attribute raises, frames handed
  out are copies);
* passes ``tests/unit/test_result_contract.py``, parametrized over :data:`STORED`: a SIGKILL at every step of a save
  and of an overwrite, two saves at once, every record field edited with the digests recomputed, truncated and
  missing files, frozen attributes, copied frames, the headline's counts recomputed from the table. A stored type
  without a case there, or a result class with a ``save`` that is not a stored type, fails that test.

:meth:`StoredResult.save` and :meth:`StoredResult.load` are THE front ends of every stored type (one docstring, one
keyword check): each calls the function its type's module declares with :func:`saves` / :func:`loads`
(``@saves("head_tokens")`` on ``save_head_tokens``), found by the :class:`StoreSpec` name the class declares or
inherits. A type whose save or load needs more (a report, a role association) overrides the method.

Imports the standard library only (and the package's keyword check and errors).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from .kwargs import unknown_option_error

if TYPE_CHECKING:  # pragma: no cover
    from typing_extensions import Self

    from .hints import PathLike

__all__ = ["STORED", "StoreSpec", "StoredResult", "loads", "saves"]

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class StoreSpec:
    """How one result type is stored (module docstring).

    Attributes:
        name: the type's name in :data:`STORED` (``"report"``, ``"head_roles"``).
        record: the record's file name in the folder (``"report.json"``); not given (``""``): ``f"{name}.json"``.
        formats: the record ``format`` values its loader reads (this version's first: :attr:`format`).
        free_fields: record fields (dotted paths into the JSON record, a list index as ``*``) that nothing derives
            or restates, with why: an edit of one loads as edited (provenance such as the versions that computed the
            numbers, or wall-clock seconds). Every other field's edit is refused by the loader.
    """

    name: str
    record: str = ""
    formats: tuple[str, ...] = ()
    free_fields: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not isinstance(self.record, str):
            raise ValueError(f"a StoreSpec's name and record are str; got {self!r}.")
        if not self.record and self.name.isidentifier():
            object.__setattr__(self, "record", f"{self.name}.json")
        if not (self.name.isidentifier() and self.record.endswith(".json") and self.formats):
            raise ValueError(f"a StoreSpec needs a name, a .json record and its formats; got {self!r}.")

    @property
    def format(self) -> str:
        """The record ``format`` this version writes (the first of :attr:`formats`)."""
        return self.formats[0]


#: Every stored result type by its :attr:`StoreSpec.name` (filled as their modules are imported).
STORED: dict[str, type[StoredResult]] = {}
#: The save function (``fn(result, path, overwrite=...)``) and the load function (``fn(path)``) of each stored type,
#: by its :attr:`StoreSpec.name` (filled by :func:`saves` and :func:`loads` as their modules are imported).
_SAVE: dict[str, Callable[..., str]] = {}
_LOAD: dict[str, Callable[[Any], Any]] = {}


def saves(name: str) -> Callable[[F], F]:
    """Decorator: the function (``fn(result, path, overwrite=...)``) is what ``save`` of the stored type ``name``
    calls (module docstring). Raises nothing; returns the function unchanged."""

    def register(fn: F) -> F:
        _SAVE[name] = fn
        return fn

    return register


def loads(name: str) -> Callable[[F], F]:
    """Decorator: the function (``fn(path)``) is what ``load`` of the stored type ``name`` calls (module docstring).
    Raises nothing; returns the function unchanged."""

    def register(fn: F) -> F:
        _LOAD[name] = fn
        return fn

    return register


def _declaring(cls: type) -> type:
    """The class of ``cls``'s MRO that declares its :class:`StoreSpec` (a sweep's result: the comparison)."""
    return next((c for c in cls.__mro__ if "store" in c.__dict__), cls)


def _function(table: dict[str, Callable[..., Any]], cls: type[StoredResult], what: str) -> Callable[..., Any]:
    fn = table.get(cls.store.name)
    if fn is None:  # pragma: no cover - the contract test saves and loads every stored type
        raise NotImplementedError(f"{cls.__qualname__} declares no {what} function (core.stored.{what}s).")
    return fn


def _strict_save(fn: F) -> F:
    """:func:`~tl_idempotence.core.kwargs.strict_kwargs` for :meth:`StoredResult.save`, naming the stored type (an
    unknown keyword raises :class:`~tl_idempotence.errors.UnknownOptionError`: ``HeadTokens.save() got ...``)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        unknown = [k for k in kwargs if k not in ("self", "path", "overwrite")]
        if unknown:
            owner = _declaring(type(args[0])) if args else StoredResult
            raise unknown_option_error(f"{owner.__qualname__}.save()", unknown, ("path", "overwrite"))
        return fn(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


class StoredResult:
    """Base of a result that saves itself (module docstring): subclasses declare :attr:`store` in their class body;
    their module declares the type's save and load functions (:func:`saves`, :func:`loads`)."""

    store: ClassVar[StoreSpec]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        spec = cls.__dict__.get("store")
        if spec is None:
            return
        if not isinstance(spec, StoreSpec):
            raise TypeError(f"{cls.__qualname__}.store must be a StoreSpec; got {type(spec).__name__}.")
        other = STORED.get(spec.name)
        if other is not None and other.__qualname__ != cls.__qualname__:
            raise TypeError(f"stored result name {spec.name!r} is taken by {other.__qualname__}.")
        STORED[spec.name] = cls

    @_strict_save
    def save(self, path: PathLike, overwrite: bool = False) -> str:
        """Save to the folder ``path`` through THE store (:func:`~tl_idempotence.core.store.write_folder`): the
        result's tables as parquet files and one JSON record (the ``record`` of its :attr:`store`) with their
        sha256s and its own digest, no pickle, written beside the folder and put in place in one step. The type's
        ``save_*`` function (``tli.save_head_tokens``, ...) says its tables; :meth:`load` reads the folder back.

        Args:
            path: a folder that does not exist yet (or is empty), or an earlier save of this type with ``overwrite``.
            overwrite: replace an earlier save of this type (its own files; other files in the folder are kept).

        Returns:
            The folder, as a string.

        Raises:
            OptionTypeError: ``path`` not a path; ``overwrite`` not a bool.
            UnknownOptionError: a keyword other than ``path`` and ``overwrite``.
            OutputOverInputError (an ``OptionError``): ``path`` is the folder the result was loaded from, or in it
                (or another file or folder it was read from).
            OptionError: ``path`` ends in a file extension; as :func:`~tl_idempotence.core.store.write_folder` (a
                file, a non-empty folder without ``overwrite``, an earlier save of another kind, a missing parent;
                names it); a result without what its save needs (one made by hand: compute it again).
        """
        return str(_function(_SAVE, type(self), "save")(self, path, overwrite=overwrite))

    @classmethod
    def load(cls, path: PathLike) -> Self:
        """Read back a folder :meth:`save` wrote (the type's ``load_*`` function: ``tli.load_head_tokens``, ...),
        checking every file's sha256 and the record's digest and recomputing from the tables what the record states.

        Args:
            path: the folder.

        Returns:
            The result (equal tables and summary), ``loaded_from`` the folder (its :meth:`save` refuses to write
            there).

        Raises:
            MissingFileError: no such folder, or a file its record lists is missing (names it).
            ReportFileError: another format, an edited or foreign file, or a field that is not what the saved tables
                give (names the file and the field).
            OptionTypeError: ``path`` is not a path.
        """
        result: Self = _function(_LOAD, cls, "load")(path)
        return result
