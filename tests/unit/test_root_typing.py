"""Typed at the root: ``tl_idempotence/__init__.py`` hands its public names out lazily (``_EXPORTS``, ``_MODULES``
and a module ``__getattr__``), and names each of them again in an ``if TYPE_CHECKING:`` import block so that a type
checker sees its real type. The two lists must agree, name for name and module for module: read here from the
source with ``ast`` (what mypy sees is replayed on a user's script in tests/integration/test_root_typing_mypy.py)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

INIT = Path(__file__).resolve().parents[2] / "src" / "tl_idempotence" / "__init__.py"


def lazy_names(tree: ast.Module) -> tuple[dict[str, str], dict[str, str]]:
    """``_EXPORTS`` (name -> the module that defines it) and ``_MODULES`` (name -> the module it is)."""
    found: dict[str, dict[str, str]] = {}
    for node in tree.body:
        if isinstance(node, ast.AnnAssign | ast.Assign):
            target = node.target if isinstance(node, ast.AnnAssign) else node.targets[0]
            if isinstance(target, ast.Name) and target.id in ("_EXPORTS", "_MODULES"):
                found[target.id] = ast.literal_eval(node.value)  # type: ignore[arg-type]
    return found["_EXPORTS"], found["_MODULES"]


def type_checking_block(tree: ast.Module) -> ast.If:
    blocks = [n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING"]
    assert len(blocks) == 1, f"{INIT}: {len(blocks)} top-level `if TYPE_CHECKING:` blocks (want one)"
    return blocks[0]


def typed_names(block: ast.If) -> dict[str, tuple[str, str]]:
    """The names the ``TYPE_CHECKING`` block binds: ``name -> (module it imports from, name imported there)``.

    Raises:
        AssertionError: a statement that is not ``from <absolute module> import x as name`` (an explicit
            re-export, which strict type checkers require), or a name bound twice.
    """
    out: dict[str, tuple[str, str]] = {}
    for node in block.body:
        assert isinstance(node, ast.ImportFrom) and node.level == 0 and node.module, (
            f"{INIT}:{node.lineno}: the TYPE_CHECKING block holds only `from tl_idempotence.x import y as y` imports"
        )
        for alias in node.names:
            assert alias.asname is not None, f"{INIT}:{node.lineno}: `{alias.name}` needs `as` (an explicit re-export)"
            assert alias.asname not in out, f"{INIT}:{node.lineno}: {alias.asname} is imported twice"
            out[alias.asname] = (node.module, alias.name)
    return out


def mismatches(source: str) -> list[str]:
    """How the ``TYPE_CHECKING`` block of an ``__init__.py`` source differs from its lazy loader's lists."""
    tree = ast.parse(source)
    exports, modules = lazy_names(tree)
    typed = typed_names(type_checking_block(tree))
    bad = []
    for name, module in exports.items():
        if name not in typed:
            bad.append(f"{name}: in _EXPORTS ({module}), not in the TYPE_CHECKING block")
        elif typed[name] != (module, name):
            bad.append(f"{name}: _EXPORTS takes it from {module}, the TYPE_CHECKING block from {'.'.join(typed[name])}")
    for name, module in modules.items():
        if name not in typed:
            bad.append(f"{name}: in _MODULES ({module}), not in the TYPE_CHECKING block")
        elif ".".join(typed[name]) != module:
            bad.append(f"{name}: _MODULES names {module}, the TYPE_CHECKING block {'.'.join(typed[name])}")
    bad += [
        f"{name}: in the TYPE_CHECKING block, in neither _EXPORTS nor _MODULES"
        for name in typed
        if name not in exports and name not in modules
    ]
    return bad


def test_the_type_checking_block_names_exactly_what_the_lazy_loader_hands_out():
    source = INIT.read_text(encoding="utf-8")
    assert mismatches(source) == []
    exports, modules = lazy_names(ast.parse(source))
    assert len(exports) + len(modules) >= 50 and {"idempotence_report", "head_tokens", "models", "errors"} <= {
        *exports,
        *modules,
    }


def _planted(edit: str) -> str:
    """The real ``__init__.py`` with one planted difference between the two lists."""
    source = INIT.read_text(encoding="utf-8")
    if edit == "exports only":  # a name added to _EXPORTS and not to the block
        return source.replace(
            '"Closure": "tl_idempotence.maths.closure",',
            '"Closure": "tl_idempotence.maths.closure",\n    "frobnicate": "tl_idempotence.maths.closure",',
        )
    if edit == "block only":  # a name added to the block and not to _EXPORTS
        return source.replace(
            "    from tl_idempotence.maths.closure import closure as closure\n",
            "    from tl_idempotence.maths.closure import closure as closure\n"
            "    from tl_idempotence.maths.closure import frobnicate as frobnicate\n",
        )
    if edit == "other module":  # the block takes a name from another module than the loader does
        return source.replace(
            "from tl_idempotence.probes.head_tokens import head_tokens as head_tokens",
            "from tl_idempotence.probes.token_effect import head_tokens as head_tokens",
        )
    if edit == "other submodule":
        return source.replace(
            "from tl_idempotence.sources import zoo as models", "from tl_idempotence import zoo as models"
        )
    raise AssertionError(edit)


@pytest.mark.parametrize(
    ("edit", "says"),
    [
        ("exports only", "frobnicate: in _EXPORTS (tl_idempotence.maths.closure), not in the TYPE_CHECKING block"),
        ("block only", "frobnicate: in the TYPE_CHECKING block, in neither _EXPORTS nor _MODULES"),
        (
            "other module",
            "head_tokens: _EXPORTS takes it from tl_idempotence.probes.head_tokens, the TYPE_CHECKING block from "
            "tl_idempotence.probes.token_effect.head_tokens",
        ),
        (
            "other submodule",
            "models: _MODULES names tl_idempotence.sources.zoo, the TYPE_CHECKING block tl_idempotence.zoo",
        ),
    ],
)
def test_a_name_on_one_list_only_or_from_another_module_is_named(edit, says):
    planted = _planted(edit)
    assert planted != INIT.read_text(encoding="utf-8")
    assert mismatches(planted) == [says]


def test_an_import_without_its_explicit_re_export_is_refused():
    source = INIT.read_text(encoding="utf-8").replace("import closure as closure\n", "import closure\n")
    with pytest.raises(AssertionError, match="`closure` needs `as`"):
        mismatches(source)


def test_the_lazy_loader_is_hidden_from_type_checkers():
    """``__getattr__`` only in the block's ``else:``: a type checker that saw it would take a misspelled name
    (``tli.idempotense_report``) for ``Any`` instead of an error."""
    tree = ast.parse(INIT.read_text(encoding="utf-8"))
    block = type_checking_block(tree)
    top = [n.name for n in tree.body if isinstance(n, ast.FunctionDef)]
    assert "__getattr__" not in top
    assert [n.name for n in block.orelse if isinstance(n, ast.FunctionDef)] == ["__getattr__"]


HEAVY = ("torch", "pandas", "numpy", "transformer_lens", "transformers", "plotly")


def test_import_tl_idempotence_stays_light_and_names_load_on_first_use():
    """The block does not run at run time: a fresh ``import tl_idempotence`` (and its ``__all__``, ``dir``) imports
    none of the heavy libraries; the first use of a name loads its module (``tli.errors``)."""
    code = (
        "import sys, tl_idempotence as tli\n"
        "names = (len(tli.__all__), 'idempotence_report' in dir(tli))\n"
        f"heavy = [m for m in {HEAVY!r} if m in sys.modules]\n"
        "loaded = 'tl_idempotence.errors' in sys.modules\n"
        "tli.errors.OptionError\n"
        "print(names, heavy, loaded, 'tl_idempotence.errors' in sys.modules)"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(INIT.parents[1]), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    n = len(lazy_names(ast.parse(INIT.read_text(encoding="utf-8")))[0]) + 2
    assert proc.stdout.strip() == f"({n}, True) [] False True", proc.stdout
