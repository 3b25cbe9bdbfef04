"""The public names of ``tl_idempotence``, read from its ``__init__.py`` without importing it (stdlib only).

``__init__.py`` exports lazily (PEP 562): ``_EXPORTS`` maps each public name to the module that defines it,
``_MODULES`` each public submodule (``tli.models``, ``tli.errors``) to its module, and ``__all__`` is
``sorted(_EXPORTS) + sorted(_MODULES)``. The docs build (``public_api.py``, ``check_reference.py``) reads the
two literal dicts here; ``tests/unit/test_docs_reference.py`` checks them against the imported package.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = "tl_idempotence"
INIT = Path(__file__).resolve().parents[2] / "src" / PACKAGE / "__init__.py"


def literal_dicts(source: str, where: str = str(INIT)) -> dict[str, dict[str, str]]:
    """``_EXPORTS`` and ``_MODULES`` of an ``__init__.py`` source, each a literal ``{name: module}`` dict.

    Raises:
        ValueError: either assignment is missing, or is not a literal dict of str -> str (names ``where``).
    """
    found: dict[str, dict[str, str]] = {}
    for node in ast.parse(source).body:
        target = node.target if isinstance(node, ast.AnnAssign) else None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
        if not (isinstance(target, ast.Name) and target.id in ("_EXPORTS", "_MODULES")):
            continue
        try:
            value = ast.literal_eval(node.value) if node.value is not None else None
        except ValueError as e:
            raise ValueError(f"{where}: {target.id} is not a literal dict ({e})") from None
        if not (isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())):
            raise ValueError(f"{where}: {target.id} is not a literal dict of str -> str")
        found[target.id] = value
    missing = sorted({"_EXPORTS", "_MODULES"} - set(found))
    if missing:
        raise ValueError(f"{where}: no {' or '.join(missing)} (the API reference is built from them)")
    return found


def public_names(init: Path = INIT) -> dict[str, str]:
    """Every name of ``tl_idempotence.__all__`` -> the dotted path of the object it is.

    A function or class maps to ``<module>.<name>``, a public submodule to its module.

    Raises:
        ValueError: as :func:`literal_dicts`.
    """
    d = literal_dicts(init.read_text(encoding="utf-8"), str(init))
    names = {name: f"{module}.{name}" for name, module in d["_EXPORTS"].items()}
    names.update(d["_MODULES"])
    return names


#: A Sphinx cross-reference role (``:func:`~a.b.c` ``), which Markdown would print as it is.
SPHINX_ROLE = re.compile(r":(?:py:)?(?:func|class|meth|data|attr|mod|exc|obj|const):`(~?)([^`]+)`")


def sphinx_roles_as_code(text: str) -> str:
    """``:func:`~a.b.c` `` -> `` `c` ``, ``:class:`a.B` `` -> `` `a.B` `` (Markdown code spans).

    The docstrings keep their roles (the package's convention, read by ``help()``); the site shows code.
    """
    return SPHINX_ROLE.sub(lambda m: f"`{m.group(2).rsplit('.', 1)[-1] if m.group(1) else m.group(2)}`", text)


#: A Google-style ``Raises:`` item whose exception name carries a parenthetical before its colon
#: (``OutputOverInputError (an ``OptionError``): ...``): griffe takes all of it for the exception's name and the
#: site prints it as it is, double backticks included.
_RAISES_ITEM = re.compile(r"^(\s+)([A-Za-z_][\w.]*) \(([^()]*)\):(\s|$)")


def raises_parentheticals_as_text(text: str) -> str:
    """In the ``Raises:`` section of a Google-style docstring, ``Name (an ``Base``): why`` ->
    ``Name: (an `Base`) why``: the exception's name alone is its type, the parenthetical goes to the description
    (where Markdown renders its code spans). Other lines and sections are returned as they are."""
    out: list[str] = []
    indent: int | None = None  # the indentation of the "Raises:" header while inside that section
    item: int | None = None  # the indentation of its items (a deeper line continues an item)
    for line in text.splitlines(keepends=True):
        stripped = line.strip()
        here = len(line) - len(line.lstrip())
        if stripped == "Raises:":
            indent, item = here, None
        elif indent is not None and stripped and here <= indent:
            indent = None  # the next section (or the end of the Raises block)
        elif indent is not None and stripped:
            item = here if item is None else item
            m = _RAISES_ITEM.match(line) if here == item else None
            if m:
                note = m.group(3).replace("``", "`")
                line = f"{m.group(1)}{m.group(2)}: ({note}){m.group(4)}{line[m.end() :]}"
        out.append(line)
    return "".join(out)
