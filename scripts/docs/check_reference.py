"""Check the built API reference against ``tl_idempotence.__all__``; exit 1 naming every gap.

Run after ``mkdocs build --strict`` (CI's docs stage; CONTRIBUTING.md, "Documentation"), in the docs venv:

    python scripts/docs/check_reference.py [--site site]

For every public name (``__all__`` is ``sorted(_EXPORTS) + sorted(_MODULES)`` of ``__init__.py``;
``public_api.public_names``) it requires, in the built site:

- an entry ``tl_idempotence.<name>`` in ``objects.inv`` (read with mkdocstrings' inventory parser) whose page
  holds that anchor;
- a function: its rendered signature naming every parameter with its type annotation (the annotation read
  from the source by griffe), and a rendered ``Raises:`` section;
- a class: its rendered signature with the constructor's typed parameters, and every public method rendered
  with its signature and typed parameters, with a ``Raises:`` section when it takes arguments;
- a module (``tli.models``, ``tli.errors``): every name of its ``__all__`` rendered, its functions and
  classes under the rules above.

:data:`NO_RAISES` names the callables known to lack a ``Raises:`` section, each with its reason; any other
one fails.

The objects are loaded with griffe and this repository's extension (``public_api.py``), with the docstring
options of ``mkdocs.yml``, so the check sees what the build rendered.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import griffe
import yaml
from bs4 import BeautifulSoup, Tag
from mkdocstrings import Inventory

sys.path.insert(0, str(Path(__file__).resolve().parent))
from exports import SPHINX_ROLE
from public_api import PACKAGE, PublicExports, public_names

ROOT = Path(__file__).resolve().parents[2]

#: Callables that may lack a ``Raises:`` section (``Class.method`` or ``module.function`` as rendered) -> why.
#: "owed": it raises but its docstring does not say so yet (to be written, then removed here). Shrink only.
NO_RAISES: dict[str, str] = {
    "HeadSource.layer_heads": "owed (a protocol: what a source raises is the source's)",
    "IdempotenceReport.figure": "owed",
    "IdempotenceReport.ablation": "owed (passes **kwargs to tli.ablation, whose Raises lists them)",
    "LayerHeads.check_finite": "owed",
    "ReportOptions.with_threshold": "owed",
    "SharedValueAlgebra.matrices": "owed",
    "SharedValueAlgebra.concat": "owed",
    "Trajectory.tracked_heads": "owed",
    "Trajectory.figures": "owed",
    "RoleAssociation.save": "owed (delegates to save_roles, whose Raises lists them)",
    "models.known_models": "raises nothing",
    "models.cache_dir": "raises nothing",
    "models.is_cached": "owed (UnknownModelError)",
    "models.files_dir": "owed (as models.fetch)",
    "models.attention_dir": "owed (as models.fetch)",
}


class _IgnoreTags(yaml.SafeLoader):
    """mkdocs.yml may hold ``!ENV``/``!!python/name`` tags; only the handler options are read here."""


_IgnoreTags.add_multi_constructor("", lambda loader, suffix, node: None)


def handler_options(mkdocs_yml: Path) -> dict[str, Any]:
    """The python handler's ``options`` of ``mkdocs.yml`` (docstring style and options)."""
    config = yaml.load(mkdocs_yml.read_text(encoding="utf-8"), Loader=_IgnoreTags)
    for plugin in config["plugins"]:
        if isinstance(plugin, dict) and "mkdocstrings" in plugin:
            return plugin["mkdocstrings"]["handlers"]["python"]["options"]
    raise SystemExit(f"{mkdocs_yml}: no mkdocstrings python handler")


class Site:
    """The built site: its inventory and pages (parsed once each)."""

    def __init__(self, site: Path) -> None:
        inv_path = site / "objects.inv"
        if not inv_path.is_file():
            raise SystemExit(f"{inv_path} not found: run `mkdocs build --strict` first")
        with inv_path.open("rb") as f:
            self.inventory = Inventory.parse_sphinx(f)
        self.site = site
        self._pages: dict[str, BeautifulSoup] = {}

    def entry(self, path: str) -> Tag | None:
        """The rendered ``<div class="doc doc-object ...">`` of ``path``, or None."""
        item = self.inventory.get(path)
        if item is None:
            return None
        page, _, anchor = item.uri.partition("#")
        if page not in self._pages:
            self._pages[page] = BeautifulSoup((self.site / page).read_text(encoding="utf-8"), "html.parser")
        heading = self._pages[page].find(id=anchor or path)
        return heading.parent if isinstance(heading, Tag) and isinstance(heading.parent, Tag) else None


def _own(entry: Tag, selector: str) -> list[Tag]:
    """Elements matching ``selector`` inside ``entry`` but not inside a nested object's entry."""
    return [t for t in entry.select(selector) if t.find_parent("div", class_="doc-object") is entry]


def _typed_parameters(fn: griffe.Function) -> list[griffe.Parameter]:
    return [p for p in fn.parameters if p.name not in ("self", "cls")]


def check_callable(site: Site, path: str, fn: griffe.Function, need_raises: bool, problems: list[str]) -> None:
    """Signature with every parameter and its type; a Raises section when ``need_raises``."""
    entry = site.entry(path)
    if entry is None:
        problems.append(f"{path}: no rendered entry in objects.inv")
        return
    signatures = _own(entry, "div.doc-signature")
    if not signatures:
        problems.append(f"{path}: no rendered signature")
        return
    text = " ".join(signatures[0].get_text().split())
    for p in _typed_parameters(fn):
        if p.annotation is None:
            problems.append(f"{path}: parameter {p.name!r} has no type annotation")
        elif f"{p.name}:" not in text:
            problems.append(f"{path}: parameter {p.name!r} and its type not in the rendered signature")
    if need_raises:
        titles = [t.get_text(strip=True) for t in _own(entry, "span.doc-section-title")]
        if "Raises:" not in titles:
            problems.append(f"{path}: no 'Raises:' section (the errors it raises)")


def check_class(site: Site, path: str, cls: griffe.Class, problems: list[str], inherited: tuple[str, ...] = ()) -> None:
    """The class's constructor and every public method it defines, and those of ``inherited`` it inherits (rendered
    by mkdocs.yml's ``inherited_members``), as :func:`check_callable`."""
    init = cls.members.get("__init__")
    init_fn = init.final_target if init is not None and init.is_alias else init
    if isinstance(init_fn, griffe.Function):
        check_callable(site, path, init_fn, need_raises=False, problems=problems)
    elif site.entry(path) is None:
        problems.append(f"{path}: no rendered entry in objects.inv")
    members = dict(cls.members)
    for name in inherited:
        if name not in members and name in cls.inherited_members:
            members[name] = cls.inherited_members[name]
    for name, member in members.items():
        if name.startswith("_"):
            continue
        target = member.final_target if member.is_alias else member
        if isinstance(target, griffe.Function):
            has_args = bool(_typed_parameters(target))
            need = has_args and f"{cls.name}.{name}" not in NO_RAISES
            check_callable(site, f"{path}.{name}", target, need_raises=need, problems=problems)


def check(site_dir: Path, mkdocs_yml: Path = ROOT / "mkdocs.yml") -> list[str]:
    """Every gap between ``tl_idempotence.__all__`` and the site built in ``site_dir`` (empty: none)."""
    options = handler_options(mkdocs_yml)
    loader_options = {"returns_multiple_items": True, **options.get("docstring_options", {})}
    pkg = griffe.load(
        PACKAGE,
        search_paths=[str(ROOT / "src")],
        extensions=griffe.load_extensions(PublicExports()),
        docstring_parser=options.get("docstring_style", "google"),
        docstring_options=loader_options,
    )
    site = Site(site_dir)
    listed = options.get("inherited_members")
    inherited = tuple(listed) if isinstance(listed, list) else ()
    problems: list[str] = []
    for name in sorted(public_names()):
        path = f"{PACKAGE}.{name}"
        obj = pkg[name].final_target if pkg[name].is_alias else pkg[name]
        if isinstance(obj, griffe.Function):
            check_callable(site, path, obj, need_raises=True, problems=problems)
        elif isinstance(obj, griffe.Class):
            check_class(site, path, obj, problems, inherited)
        elif isinstance(obj, griffe.Module):
            if site.entry(path) is None:
                problems.append(f"{path}: no rendered entry in objects.inv")
            for member in sorted(obj.exports or []):
                target = obj[member].final_target if obj[member].is_alias else obj[member]
                if isinstance(target, griffe.Function):
                    need = f"{name}.{member}" not in NO_RAISES
                    check_callable(site, f"{path}.{member}", target, need_raises=need, problems=problems)
                elif isinstance(target, griffe.Class):
                    check_class(site, f"{path}.{member}", target, problems, inherited)
                elif site.entry(f"{path}.{member}") is None:
                    problems.append(f"{path}.{member}: no rendered entry in objects.inv")
        else:
            problems.append(f"{path}: a {obj.kind.value}, not a function, class or module")
    for page in sorted((site_dir / "reference").glob("*.html")):
        text = BeautifulSoup(page.read_text(encoding="utf-8"), "html.parser").get_text()
        left = {m.group(0) for m in SPHINX_ROLE.finditer(text)} | (
            {"REPORT_OPTIONS_DOC"} if "REPORT_OPTIONS_DOC" in text else set()
        )
        for raw in sorted(left):
            problems.append(f"{page.relative_to(site_dir)}: {raw!r} shown as it is in the source")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--site", type=Path, default=ROOT / "site", help="the built site (default: site/)")
    args = parser.parse_args(argv)
    problems = check(args.site)
    n = len(public_names())
    if problems:
        print(f"API reference: {len(problems)} gap(s) against tl_idempotence.__all__ ({n} names):", file=sys.stderr)
        for p in problems:
            print(f"  {p}", file=sys.stderr)
        return 1
    print(
        f"API reference: every one of the {n} names of tl_idempotence.__all__ is rendered with its signature, "
        "typed parameters and errors"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
