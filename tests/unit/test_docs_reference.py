"""The API reference's source of truth: the public names the docs build renders are tli.__all__.

The site itself is built and checked by ``bash scripts/docs/build.sh`` (CI's docs stage, its own venv:
``mkdocs build --strict`` and ``scripts/docs/check_reference.py``). These unit tests need no docs venv: they
check that ``scripts/docs/exports.py`` reads the same public names the imported package has, that every one
of them is on a reference page, and the release metadata agree on the version.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import sys
from pathlib import Path

import pytest
import yaml

import tl_idempotence as tli

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("tli_docs_exports", ROOT / "scripts/docs/exports.py")
assert _spec is not None and _spec.loader is not None
exports = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = exports
_spec.loader.exec_module(exports)


def test_public_names_are_all_and_name_the_objects():
    names = exports.public_names(ROOT / "src/tl_idempotence/__init__.py")
    assert sorted(names) == sorted(tli.__all__)
    assert len(names) == len(tli.__all__)  # no name twice
    for name, path in names.items():
        obj = getattr(tli, name)
        if isinstance(obj, type(tli)):  # a public submodule (tli.models, tli.errors)
            assert obj is importlib.import_module(path), name
        else:
            module, _, attr = path.rpartition(".")
            assert attr == name and getattr(importlib.import_module(module), attr) is obj, name


def test_every_public_name_is_on_a_reference_page():
    """A public name added to __init__.py without a `::: tl_idempotence.<name>` line fails here, before the
    docs build; a page naming something that is not public fails too."""
    pages = sorted((ROOT / "docs/reference").glob("*.md"))
    assert [p.name for p in pages] == [
        "analyses.md",
        "core.md",
        "errors.md",
        "index.md",
        "models.md",
        "probes.md",
        "report.md",
        "sources.md",
        "studies.md",
        "views.md",
    ]
    rendered: list[str] = []
    for page in pages:
        rendered += re.findall(r"^::: tl_idempotence\.(\w+)\s*$", page.read_text(encoding="utf-8"), flags=re.M)
    assert sorted(rendered) == sorted(tli.__all__)


def test_every_demo_notebook_and_page_is_in_the_site():
    """docs/demos/ links each notebook of demos/ (the site renders them from there), and mkdocs.yml's nav lists
    every page and notebook (mkdocs --strict refuses a page left out, but not a notebook)."""
    demos = sorted(p.name for p in (ROOT / "demos").glob("*.ipynb"))
    assert demos and sorted(p.name for p in (ROOT / "docs/demos").iterdir()) == demos
    for name in demos:
        link = ROOT / "docs/demos" / name
        assert link.is_symlink() and link.readlink() == Path("../../demos") / name, name
    nav: list[str] = []

    def walk(node):
        if isinstance(node, str):
            nav.append(node)
        elif isinstance(node, list):
            for x in node:
                walk(x)
        elif isinstance(node, dict):
            for x in node.values():
                walk(x)

    walk(yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))["nav"])
    docs = ROOT / "docs"
    pages = sorted(str(p.relative_to(docs)) for p in docs.rglob("*") if p.suffix in (".md", ".ipynb"))
    assert sorted(nav) == pages


def test_sphinx_roles_become_code_spans():
    f = exports.sphinx_roles_as_code
    assert f(":func:`~tl_idempotence.core.closure.closure_scalars`") == "`closure_scalars`"
    assert f("see :class:`tl_idempotence.report.roles.RoleAssociation` (x)") == (
        "see `tl_idempotence.report.roles.RoleAssociation` (x)"
    )
    assert f(":py:meth:`~IdempotenceReport.with_threshold` and :data:`DEFAULTS`") == ("`with_threshold` and `DEFAULTS`")
    plain = "``(alpha, P)``: tensors; ratio: 0.9; `code` :unknown:`x`"
    assert f(plain) == plain


def test_a_raises_parenthetical_leaves_the_exception_name():
    """``OutputOverInputError (an ``OptionError``)`` must not be printed with its backticks as the exception's
    name; the parenthetical moves to the description, other sections keep theirs."""
    f = exports.raises_parentheticals_as_text
    doc = (
        "Write it.\n\n    Args:\n        path (str): the file.\n\n    Raises:\n"
        "        OutputOverInputError (an ``OptionError``): ``path`` is an input.\n"
        "            OptionError (not an item): a continuation line.\n"
        "        ReportFileError (a ``ValueError``):\n"
        "        OptionError: empty.\n\n    Returns:\n        x (int): kept.\n"
    )
    assert f(doc) == (
        "Write it.\n\n    Args:\n        path (str): the file.\n\n    Raises:\n"
        "        OutputOverInputError: (an `OptionError`) ``path`` is an input.\n"
        "            OptionError (not an item): a continuation line.\n"
        "        ReportFileError: (a `ValueError`)\n"
        "        OptionError: empty.\n\n    Returns:\n        x (int): kept.\n"
    )
    assert (
        f("Raises:\n    E (x): y") == "Raises:\n    E: (x) y" and f("Args:\n    a (int): b") == "Args:\n    a (int): b"
    )


def test_constants_named_in_docstrings_carry_their_values():
    from tl_idempotence.probes import roles

    assert f"(2 .. MAX_REPEAT_LEN = {roles.MAX_REPEAT_LEN};" in (roles.head_roles.__doc__ or "")
    assert f"(1 .. MAX_SEQUENCES = {roles.MAX_SEQUENCES})." in (roles.head_roles.__doc__ or "")


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("_EXPORTS = {'a': 'm'}\n", "no _MODULES"),
        ("_MODULES = {}\n", "no _EXPORTS"),
        ("_EXPORTS = dict(a='m')\n_MODULES = {}\n", "_EXPORTS is not a literal dict"),
        ("_EXPORTS = {'a': 1}\n_MODULES = {}\n", "_EXPORTS is not a literal dict of str -> str"),
        ("_EXPORTS: dict[str, str] = {}\n_MODULES = ['m']\n", "_MODULES is not a literal dict of str -> str"),
    ],
)
def test_exports_that_are_not_literal_dicts_are_refused(source, message):
    with pytest.raises(ValueError, match=re.escape(message)) as e:
        exports.literal_dicts(source, "pkg/__init__.py")
    assert str(e.value).startswith("pkg/__init__.py: ")


def test_annotated_literal_dicts_are_read():
    got = exports.literal_dicts("_EXPORTS: dict[str, str] = {'f': 'p.m'}\n_MODULES = {'e': 'p.errors'}\n")
    assert got == {"_EXPORTS": {"f": "p.m"}, "_MODULES": {"e": "p.errors"}}


def test_release_metadata_agree_on_the_version():
    tomllib = pytest.importorskip("tomllib", reason="tomllib needs Python >= 3.11 (CI runs 3.11)")
    with (ROOT / "pyproject.toml").open("rb") as f:
        project = tomllib.load(f)["project"]
    cff = yaml.safe_load((ROOT / "CITATION.cff").read_text(encoding="utf-8"))
    assert project["version"] == "0.3.0"
    assert cff["version"] == project["version"]
    assert re.search(rf"^## \[{re.escape(project['version'])}\]", (ROOT / "CHANGELOG.md").read_text(), flags=re.M)
    assert any(r.get("url") == "https://arxiv.org/abs/2609.01129" for r in cff["references"])
