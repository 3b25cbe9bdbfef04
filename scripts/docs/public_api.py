"""The public surface of ``tl_idempotence`` as the API reference sees it (a griffe extension).

``tl_idempotence/__init__.py`` exports its names lazily (PEP 562, ``_EXPORTS`` and ``_MODULES``); griffe reads
sources statically and cannot run that ``__getattr__``. This extension adds each public name as an alias
member of ``tl_idempotence`` (``exports.public_names``): the reference pages say ``::: tl_idempotence.closure``,
the rendered entry and ``objects.inv`` carry the public path ``tl_idempotence.closure``, and a module moved by a
refactor needs no change to the pages (only ``_EXPORTS`` changes, as it must for the package itself). It also
shows the docstrings' Sphinx roles (``:func:`~x.y` ``) as code spans.

Loaded by mkdocstrings (``mkdocs.yml``: ``handlers.python.options.extensions``) and by
``check_reference.py``. Runs in the docs venv (griffe; no torch).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import griffe

sys.path.insert(0, str(Path(__file__).resolve().parent))
from exports import INIT, PACKAGE, public_names, sphinx_roles_as_code

__all__ = ["PACKAGE", "PublicExports", "public_names"]


def _docstrings(obj: griffe.Object) -> None:
    if obj.docstring is not None:
        obj.docstring.value = sphinx_roles_as_code(obj.docstring.value)
    for member in obj.members.values():
        if not member.is_alias:
            _docstrings(member)  # type: ignore[arg-type]


class PublicExports(griffe.Extension):
    """Adds every public name of ``tl_idempotence`` as an alias member of the package; roles as code."""

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        if pkg.name != PACKAGE:
            return
        _docstrings(pkg)
        names = public_names(pkg.filepath if isinstance(pkg.filepath, Path) else INIT)
        for name, target in names.items():
            if target != f"{pkg.path}.{name}":  # tli.errors is the submodule itself: nothing to alias
                pkg.set_member(name, griffe.Alias(name, target, parent=pkg))
        # __all__ is computed (sorted(_EXPORTS) + sorted(_MODULES)), so griffe cannot read it: state it
        pkg.exports = list(names)
