"""The public surface of ``tl_idempotence`` as the API reference sees it (a griffe extension).

``tl_idempotence/__init__.py`` exports its names lazily (PEP 562, ``_EXPORTS`` and ``_MODULES``); griffe reads
sources statically and cannot run that ``__getattr__``. This extension adds each public name as an alias
member of ``tl_idempotence`` (``exports.public_names``): the reference pages say ``::: tl_idempotence.closure``,
the rendered entry and ``objects.inv`` carry the public path ``tl_idempotence.closure``, and a module moved by a
refactor needs no change to the pages (only ``_EXPORTS`` changes, as it must for the package itself). It also
shows the docstrings' Sphinx roles (``:func:`~x.y` ``) as code spans, leaves out ``@overload`` signatures (for
type checkers; the reference shows the real one), and writes the report options where a
docstring says ``**options: the report options (REPORT_OPTIONS_DOC).``, as ``documents_options`` does at
import (griffe reads the source, not ``__doc__``), from ``tl_idempotence.analyses.report_options`` (torch-free).

Loaded by mkdocstrings (``mkdocs.yml``: ``handlers.python.options.extensions``) and by
``check_reference.py``. Runs in the docs venv (griffe; no torch).
"""

from __future__ import annotations

import importlib
import sys
import types
from pathlib import Path
from typing import Any

import griffe

sys.path.insert(0, str(Path(__file__).resolve().parent))
from exports import INIT, PACKAGE, public_names, raises_parentheticals_as_text, sphinx_roles_as_code

__all__ = ["PACKAGE", "PublicExports", "public_names"]


def _option_specs() -> types.ModuleType:
    """``tl_idempotence.analyses.report_options`` (torch-free: the report options assembled from the analyses'
    registry), imported from ``src/`` without running the package's ``__init__`` (stand-in package modules,
    removed afterwards).

    Raises:
        ImportError: the module (or what it imports) needs a package the docs venv does not have.
    """
    src = INIT.parent
    before = set(sys.modules)
    for name, folder in ((PACKAGE, src), (f"{PACKAGE}.core", src / "core"), (f"{PACKAGE}.analyses", src / "analyses")):
        stub = types.ModuleType(name)
        stub.__path__ = [str(folder)]
        sys.modules[name] = stub
    try:
        return importlib.import_module(f"{PACKAGE}.analyses.report_options")
    except ImportError as e:
        raise ImportError(
            f"scripts/docs/public_api.py: {PACKAGE}.analyses.report_options must import without torch and the "
            "package's "
            f"dependencies (the reference writes the report options from it): {e}"
        ) from e
    finally:
        for name in set(sys.modules) - before:
            del sys.modules[name]


def _report_options_markdown(option_specs: types.ModuleType, indent: str) -> str:
    """The docstring line ``**options: ... (REPORT_OPTIONS_DOC).`` as the site shows it: a list of the report
    options from ``options_doc`` (name, type, help, default; the same text ``help()`` shows)."""
    items = [line.strip() for line in option_specs.options_doc("").splitlines() if line.strip()]
    listed = "\n".join(f"{indent}    - `{name}` ({rest}" for name, _, rest in (i.partition(" (") for i in items))
    return f"{indent}**options: the report options, each validated where it enters (`ReportOptions`):\n\n{listed}"


def _docstrings(obj: griffe.Object, option_specs: types.ModuleType) -> None:
    if isinstance(obj, griffe.Function):
        # griffe gives ``*args``/``**kwargs`` the defaults "()"/"{}", which the parameter tables would print as
        # the default of a parameter that has none
        for param in obj.parameters:
            if param.kind in (griffe.ParameterKind.var_positional, griffe.ParameterKind.var_keyword):
                param.default = None
        # ``@overload`` signatures are for type checkers (``tli.models.load``'s model class follows ``cls``); the
        # reference shows the one real signature, every parameter with its type and default, and the docstring
        obj.overloads = None
    if obj.docstring is not None:
        text = raises_parentheticals_as_text(sphinx_roles_as_code(obj.docstring.value))
        marker = option_specs.OPTIONS_DOC_MARKER
        if marker in text:  # what documents_options writes into __doc__ at import
            lines = text.splitlines()
            for i, line in enumerate(lines):
                if marker in line:
                    lines[i] = _report_options_markdown(option_specs, line[: len(line) - len(line.lstrip())])
            text = "\n".join(lines)
        obj.docstring.value = text
    for member in obj.members.values():
        if not member.is_alias:
            _docstrings(member, option_specs)  # type: ignore[arg-type]


class PublicExports(griffe.Extension):
    """Adds every public name of ``tl_idempotence`` as an alias member of the package; roles as code, a
    ``Raises:`` item's parenthetical as text, no default shown for ``*args``/``**kwargs``, no ``@overload``
    signatures (the real signature only)."""

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        if pkg.name != PACKAGE:
            return
        _docstrings(pkg, _option_specs())
        names = public_names(pkg.filepath if isinstance(pkg.filepath, Path) else INIT)
        for name, target in names.items():
            if target != f"{pkg.path}.{name}":  # tli.errors is the submodule itself: nothing to alias
                pkg.set_member(name, griffe.Alias(name, target, parent=pkg))
        # __all__ is computed (sorted(_EXPORTS) + sorted(_MODULES)), so griffe cannot read it: state it
        pkg.exports = list(names)
