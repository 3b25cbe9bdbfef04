"""THE list of stored result types: every result that saves itself declares it here, once, and passes one contract.

A stored result class derives from :class:`StoredResult` and declares, in its class body, a :class:`StoreSpec`
(``store = StoreSpec(name="report", record="report.json", formats=(...), ...)``): the class is then in
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

Imports the standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

__all__ = ["STORED", "StoreSpec", "StoredResult"]


@dataclass(frozen=True)
class StoreSpec:
    """How one result type is stored (module docstring).

    Attributes:
        name: the type's name in :data:`STORED` (``"report"``, ``"head_roles"``).
        record: the record's file name in the folder (``"report.json"``).
        formats: the record ``format`` values its loader reads (this version's first).
        free_fields: record fields (dotted paths into the JSON record, a list index as ``*``) that nothing derives
            or restates, with why: an edit of one loads as edited (provenance such as the versions that computed the
            numbers, or wall-clock seconds). Every other field's edit is refused by the loader.
    """

    name: str
    record: str
    formats: tuple[str, ...]
    free_fields: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if not (self.name.isidentifier() and self.record.endswith(".json") and self.formats):
            raise ValueError(f"a StoreSpec needs a name, a .json record and its formats; got {self!r}.")


#: Every stored result type by its :attr:`StoreSpec.name` (filled as their modules are imported).
STORED: dict[str, type[StoredResult]] = {}


class StoredResult:
    """Base of a result that saves itself (module docstring): subclasses declare :attr:`store` in their class body
    and implement :meth:`save` and :meth:`load`."""

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

    def save(self, path: Any, overwrite: bool = False) -> str:  # pragma: no cover - every stored type defines it
        """Save to the folder ``path`` (THE store); returns the folder."""
        raise NotImplementedError

    @classmethod
    def load(cls, path: Any) -> Any:  # pragma: no cover - every stored type defines it
        """Read a folder this type saved, checked."""
        raise NotImplementedError
