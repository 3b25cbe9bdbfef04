"""The public surface of ``tl_idempotence`` as the API reference sees it (a griffe extension).

``tl_idempotence/__init__.py`` exports its names lazily (PEP 562): ``_EXPORTS`` maps each public name to
the module that defines it and ``_MODULES`` each public submodule (``tli.models``, ``tli.errors``) to its
module. griffe reads sources statically and cannot run that ``__getattr__``, so this extension reads the
two literal dicts from the loaded package and adds each public name as an alias member of
``tl_idempotence``: the reference pages then say ``::: tl_idempotence.closure``, the rendered entry and
``objects.inv`` carry the public path ``tl_idempotence.closure``, and a module moved by a refactor needs
no change to the pages (only ``_EXPORTS`` changes, as it must for the package itself).

Loaded by mkdocstrings (``mkdocs.yml``: ``handlers.python.options.extensions``); ``public_names`` is also
used by ``scripts/docs/check_reference.py``. Runs in the docs venv only (griffe, no torch).
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import griffe

PACKAGE = "tl_idempotence"
INIT = Path(__file__).resolve().parents[2] / "src" / PACKAGE / "__init__.py"


def _literal_dicts(source: str) -> dict[str, dict[str, str]]:
    """``_EXPORTS`` and ``_MODULES`` of ``__init__.py``'s source, each a literal ``{name: module}`` dict.

    Raises:
        ValueError: either assignment is missing or is not a literal dict of strings.
    """
    found: dict[str, dict[str, str]] = {}
    for node in ast.parse(source).body:
        target = node.target if isinstance(node, ast.AnnAssign) else None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
        if isinstance(target, ast.Name) and target.id in ("_EXPORTS", "_MODULES") and node.value is not None:
            value = ast.literal_eval(node.value)
            if not (isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())):
                raise ValueError(f"{INIT}: {target.id} is not a literal dict of str -> str")
            found[target.id] = value
    missing = {"_EXPORTS", "_MODULES"} - set(found)
    if missing:
        raise ValueError(f"{INIT}: no literal {sorted(missing)} (the reference is built from them)")
    return found


def public_names(init: Path = INIT) -> dict[str, str]:
    """Every name of ``tl_idempotence.__all__`` -> the dotted path of the object it is.

    ``__all__`` is ``sorted(_EXPORTS) + sorted(_MODULES)``: a function or class maps to
    ``<module>.<name>``, a public submodule to its module.
    """
    d = _literal_dicts(init.read_text(encoding="utf-8"))
    names = {name: f"{module}.{name}" for name, module in d["_EXPORTS"].items()}
    names.update(d["_MODULES"])
    return names


class PublicExports(griffe.Extension):
    """Adds every public name of ``tl_idempotence`` as an alias member of the package."""

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        if pkg.name != PACKAGE:
            return
        names = public_names(pkg.filepath if isinstance(pkg.filepath, Path) else INIT)
        for name, target in names.items():
            if target != f"{pkg.path}.{name}":  # tli.errors is the submodule itself: nothing to alias
                pkg.set_member(name, griffe.Alias(name, target, parent=pkg))
        # __all__ is computed (sorted(_EXPORTS) + sorted(_MODULES)), so griffe cannot read it: state it
        pkg.exports = list(names)
