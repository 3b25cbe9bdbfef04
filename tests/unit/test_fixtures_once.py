"""Each test fixture is defined once (tests/shared_fixtures.py, registered by tests/conftest.py, holds the shared
ones):

* no fixture name is defined twice among the fixture modules (every conftest.py under tests/, and
  tests/shared_fixtures.py);
* no test module redefines a fixture of the fixture modules (it would shadow it there, and only there);
* no fixture is copied: one definition (its decorator, arguments and body, docstring aside) stands in one file.
  A fixture whose body is one ``return`` of a helper call is not counted: the helper is the one copy.

Read from the source with ``ast`` (nothing is imported or run), so a copy fails the unit tier wherever it is.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

from conftest import TESTS


def fixture_defs(path: Path) -> list[tuple[str, int, str]]:
    """(name, line, definition) of each module-level ``@pytest.fixture`` function of ``path``; the definition is its
    decorators, arguments and body without the docstring, as ``ast.unparse`` writes them."""
    out = []
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        decorators = [ast.unparse(d) for d in node.decorator_list]
        if not any(d.split("(")[0].endswith("fixture") for d in decorators):
            continue
        name = node.name
        for d in node.decorator_list:  # @pytest.fixture(name="...") names the fixture
            for kw in getattr(d, "keywords", []):
                if kw.arg == "name" and isinstance(kw.value, ast.Constant):
                    name = kw.value.value
        body = node.body
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            body = body[1:]
        if len(body) == 1 and isinstance(body[0], ast.Return) and isinstance(body[0].value, ast.Call):
            definition = ""  # one call of a helper: the helper is the copy that counts
        else:
            definition = "\n".join([*decorators, f"{name}({ast.unparse(node.args)})", *map(ast.unparse, body)])
        out.append((name, node.lineno, definition))
    return out


def fixture_modules(root: Path) -> list[Path]:
    """Where the shared fixtures live: every conftest.py under ``root`` and ``root``/shared_fixtures.py."""
    plugin = root / "shared_fixtures.py"
    return sorted([*root.rglob("conftest.py"), *([plugin] if plugin.exists() else [])])


def problems(root: Path) -> list[str]:
    """Every fixture defined twice under ``root``, each naming both places (relative paths and lines)."""
    shared = set(fixture_modules(root))
    where: dict[str, list[str]] = defaultdict(list)  # shared fixture name -> places
    copies: dict[str, list[str]] = defaultdict(list)  # definition -> places
    local: list[tuple[str, str]] = []  # (name, place) of each fixture of a test module
    for path in sorted(root.rglob("*.py")):
        if "data" in path.relative_to(root).parts:
            continue
        for name, line, definition in fixture_defs(path):
            place = f"{path.relative_to(root)}:{line}"
            if path in shared:
                where[name].append(place)
            else:
                local.append((name, place))
            if definition:
                copies[definition].append(place)
    found = [f"fixture {n!r} is defined in {' and '.join(p)}" for n, p in where.items() if len(p) > 1]
    found += [f"fixture {n!r} at {p} shadows the one at {where[n][0]}" for n, p in local if n in where]
    found += [
        f"one fixture copied: {' and '.join(p)}" for p in copies.values() if len({x.split(":")[0] for x in p}) > 1
    ]
    return found


def test_each_fixture_is_defined_once():
    assert problems(TESTS) == []


def test_the_check_finds_a_copied_a_shadowing_and_a_twice_shared_fixture(tmp_path):
    """The check on a tree made here: each way of defining a fixture twice is found, naming both places."""
    fixture = '''import pytest


@pytest.fixture(scope="module")
def {name}(tmp_path_factory):
    """{doc}"""
    d = tmp_path_factory.mktemp("x")
    return d / "{name}"
'''
    (tmp_path / "unit").mkdir()
    (tmp_path / "integration").mkdir()
    (tmp_path / "conftest.py").write_text(fixture.format(name="shared", doc="one"))
    (tmp_path / "shared_fixtures.py").write_text(
        fixture.format(name="shared", doc="two") + "\n\n" + "def helper(): pass\n"
    )
    (tmp_path / "unit" / "test_a.py").write_text(fixture.format(name="ckpt", doc="a"))
    (tmp_path / "integration" / "test_b.py").write_text(fixture.format(name="ckpt", doc="another docstring"))
    (tmp_path / "integration" / "test_c.py").write_text(fixture.format(name="shared", doc="c"))
    (tmp_path / "unit" / "test_d.py").write_text(  # a one-call fixture, twice: not a copy
        "import pytest\n\n\n@pytest.fixture\ndef tiny(tmp_path):\n    return make(tmp_path)\n"
    )
    (tmp_path / "integration" / "test_e.py").write_text(
        "import pytest\n\n\n@pytest.fixture\ndef tiny(tmp_path):\n    return make(tmp_path)\n"
    )
    assert problems(tmp_path) == [
        "fixture 'shared' is defined in conftest.py:5 and shared_fixtures.py:5",
        "fixture 'shared' at integration/test_c.py:5 shadows the one at conftest.py:5",
        "one fixture copied: conftest.py:5 and integration/test_c.py:5 and shared_fixtures.py:5",
        "one fixture copied: integration/test_b.py:5 and unit/test_a.py:5",
    ]
    (tmp_path / "shared_fixtures.py").unlink()
    (tmp_path / "integration" / "test_b.py").write_text(fixture.format(name="ckpt", doc="b").replace('"x"', '"y"'))
    (tmp_path / "integration" / "test_c.py").unlink()
    assert problems(tmp_path) == []
