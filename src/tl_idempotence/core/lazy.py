"""THE lazy reference: a module's attribute named by strings, imported on first use (no torch, no pandas).

A declaration module (an analysis's ``analyses/<name>_spec.py``, a join's ``report/<name>_spec.py``) names the code
it declares without importing it, so that ``import tl_idempotence`` and the command line's ``--help`` stay torch-free:
``Lazy(module, name)`` of an analysis's class (``analyses/algebra_spec.py``: ``AlgebraAnalysis`` of ``.algebra``) is
imported when first called, and calling it calls the class (a zero-argument factory of the analysis);
``Lazy(module, name).load`` is a zero-argument factory of the attribute itself (a join's result type). Entry points
name code the same way (``module:attribute``). ``tests/unit/test_layering.py`` reads a ``Lazy`` of two literal strings
as an import: its layers, private names and cycles are checked like any other.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from ..errors import OptionTypeError

__all__ = ["Lazy"]


@dataclass(frozen=True)
class Lazy:
    """The attribute ``name`` of the module ``module`` (an absolute module name), imported on first use.

    Attributes:
        module: the module's absolute name (``tl_idempotence.`` and its dotted path).
        name: the attribute (a class, a function).

    Raises:
        OptionTypeError: ``module`` or ``name`` is not a non-empty str (at construction).
    """

    module: str
    name: str

    def __post_init__(self) -> None:
        for what in ("module", "name"):
            v = getattr(self, what)
            if not isinstance(v, str) or not v:
                raise OptionTypeError(f"a lazy reference's {what} must be a non-empty str; got {v!r}.")

    def load(self) -> Any:
        """The attribute, its module imported (once: Python keeps it).

        Raises:
            ImportError: no such module (or it fails to import). AttributeError: the module has no such attribute.
        """
        return getattr(importlib.import_module(self.module), self.name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """The attribute called with ``args`` and ``kwargs`` (:meth:`load` first). Raises what :meth:`load` and the
        call raise."""
        return self.load()(*args, **kwargs)

    def __repr__(self) -> str:
        return f"Lazy('{self.module}:{self.name}')"
