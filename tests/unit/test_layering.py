"""The package's data flow, enforced: every import in src/ runs down the layers, never up or sideways
into another module's private names, never in a cycle, and library code never imports ``testing``.

Layers (docs/architecture.md): errors < core < views < maths < sources < analyses = probes < report < studies
< cli, with the package ``__init__`` (the public façade) on top. The views sit just above ``core`` so that every
result (``maths`` and up) draws itself with a plain ``from ..views import ...`` that this walk sees: there is no
locator and no hand-down from the root; no module names a higher layer in a string.
"""

from __future__ import annotations

import ast
import functools
import re
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "tl_idempotence"
LAYERS = {
    "errors": 0,
    "core": 1,
    "views": 2,  # every figure, page and display: imports errors and core only (see below)
    "maths": 3,  # the closure maths; its Closure draws itself, so above the views
    "sources": 4,
    "analyses": 5,
    "probes": 5,  # beside analyses: forward-pass probes (neither imports the other: see below)
    "report": 6,
    "studies": 7,
    "cli": 8,
    "testing": 9,
    "__init__": 10,
    "__main__": 10,  # python -m tl_idempotence: the command line
}
#: (module, the higher-layer module it may name in a string): none.
NAMED_BY_STRING: set[tuple[str, str]] = set()


def module_name(path: Path) -> str:
    rel = path.relative_to(SRC.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def layer_of(mod: str) -> int:
    parts = mod.split(".")
    if len(parts) == 1:
        return LAYERS["__init__"]
    return LAYERS[parts[1]]


def resolve(mod: str, is_pkg: bool, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = mod.split(".")
    if not is_pkg:
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports() -> list[tuple[str, str, str | None, int]]:
    """(importer, imported module, imported name or None, line) for every import in src/, a lazy reference
    ``Lazy("tl_idempotence.<module>", "<name>")`` (``core/lazy.py``) included (parsed once per tree and content: a
    planted tree, or an edited file, is parsed again)."""
    files = tuple((p, p.stat().st_mtime_ns, p.stat().st_size) for p in sorted(SRC.rglob("*.py")))
    return list(_imports(SRC, files))


@functools.lru_cache(maxsize=4)
def _imports(src: Path, files: tuple[tuple[Path, int, int], ...]) -> tuple[tuple[str, str, str | None, int], ...]:
    out = []
    for path, _, _ in files:
        mod = module_name(path)
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            ref = lazy_reference(node)
            if ref is not None:
                out.append((mod, *ref, node.lineno))
            elif isinstance(node, ast.Import):
                out += [(mod, a.name, None, node.lineno) for a in node.names if a.name.startswith("tl_idempotence")]
            elif isinstance(node, ast.ImportFrom):
                target = resolve(mod, path.name == "__init__.py", node)
                if target.startswith("tl_idempotence"):
                    for a in node.names:
                        full = f"{target}.{a.name}"
                        is_mod = (SRC.parent / Path(*full.split("."))).with_suffix(".py").exists() or (
                            SRC.parent / Path(*full.split(".")) / "__init__.py"
                        ).exists()
                        out.append((mod, full if is_mod else target, None if is_mod else a.name, node.lineno))
    return tuple(out)


def lazy_arguments(node: ast.AST) -> tuple[object, object] | None:
    """(module, name) of a ``Lazy(...)`` call, positional or by keyword, each the literal str it is or None where
    it is not a literal (a computed reference, which :func:`test_every_lazy_reference_is_two_literal_strings`
    refuses); None for any other node."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Lazy"):
        return None
    given = dict(zip(("module", "name"), node.args, strict=False)) | {k.arg: k.value for k in node.keywords if k.arg}

    def literal(v: ast.AST | None) -> object:
        return v.value if isinstance(v, ast.Constant) and isinstance(v.value, str) else None

    return literal(given.get("module")), literal(given.get("name"))


def lazy_reference(node: ast.AST) -> tuple[str, str | None] | None:
    """(module, name or None) of ``Lazy("tl_idempotence...", "name")`` (positional or by keyword), the way an import
    of it is recorded (a submodule by its module name); None for any other node."""
    args = lazy_arguments(node)
    if args is None or not all(isinstance(a, str) for a in args) or not str(args[0]).startswith("tl_idempotence"):
        return None
    args = (str(args[0]), str(args[1]))
    full = f"{args[0]}.{args[1]}"
    is_mod = (SRC.parent / Path(*full.split("."))).with_suffix(".py").exists()
    return (full, None) if is_mod else (args[0], args[1])


def test_the_walk_sees_the_package():
    found = imports()
    importers = {a for a, *_ in found}
    assert {"tl_idempotence.report.report", "tl_idempotence.analyses.scramble", "tl_idempotence.cli"} <= importers
    assert len(found) > 100
    assert ("tl_idempotence.analyses.algebra_spec", "tl_idempotence.analyses.algebra", "AlgebraAnalysis") in {
        (a, b, n) for a, b, n, _ in found
    }  # a lazy reference is an import


def test_every_lazy_reference_is_two_literal_strings():
    """A ``Lazy`` in src/ names its module and attribute by literal strings, so that the walk above sees it as an
    import (layers, private names, cycles) and the views' rule sees a model library named in one."""
    bad = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            args = lazy_arguments(node)
            if args is not None and not all(isinstance(a, str) for a in args):
                bad.append(f"{path.relative_to(SRC)}:{node.lineno}")
    assert not bad, f"Lazy references not of two literal strings: {bad}"


def test_the_lazy_rules_see_every_form(tmp_path):
    """Planted: a Lazy by keyword is recorded as an import; a computed one is found by the rule above."""
    keyword = ast.parse('Lazy(module="tl_idempotence.analyses.loop", name="_private")').body[0].value  # type: ignore[attr-defined]
    assert lazy_reference(keyword) == ("tl_idempotence.analyses.loop", "_private")
    computed = ast.parse('Lazy("tl_idempotence.analyses." + "algebra", "_priv")').body[0].value  # type: ignore[attr-defined]
    assert lazy_arguments(computed) == (None, "_priv")
    library = ast.parse('Lazy("torch", "zeros")').body[0].value  # type: ignore[attr-defined]
    assert lazy_arguments(library) == ("torch", "zeros") and lazy_reference(library) is None


def test_imports_only_run_down_the_layers():
    bad = [
        f"{a} (layer {layer_of(a)}) imports {b} (layer {layer_of(b)}) at line {line}"
        for a, b, _, line in imports()
        if layer_of(b) > layer_of(a)
    ]
    assert not bad, "\n".join(bad)


def test_no_private_name_of_another_module():
    bad = []
    for a, b, name, line in imports():
        private_name = name is not None and name.startswith("_") and not name.startswith("__")
        private_mod = any(p.startswith("_") and p != "__init__" for p in b.split("."))
        if (private_name or private_mod) and b != a:
            bad.append(f"{a} imports {b}{'.' + name if name else ''} at line {line}")
    assert not bad, "\n".join(bad)


def test_library_never_imports_testing():
    bad = [
        f"{a} imports {b} at line {line}"
        for a, b, _, line in imports()
        if b.startswith("tl_idempotence.testing") and a != "tl_idempotence.testing"
    ]
    assert not bad, "\n".join(bad)


def import_cycles() -> list[list[str]]:
    """Every strongly connected component of more than one module in the graph of all imports of src/ (at module
    level, inside a function and under ``if TYPE_CHECKING`` alike: a lazy or a typing import is a dependency too),
    each as one cycle through it (``a -> b -> ... -> a``), sorted."""
    graph: dict[str, set[str]] = {}
    for a, b, _, _ in imports():
        if a != b:
            graph.setdefault(a, set()).add(b)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    components: list[set[str]] = []

    def strong(v: str) -> None:  # Tarjan
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set(stack[stack.index(v) :])
            del stack[stack.index(v) :]
            if len(comp) > 1:
                components.append(comp)

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return sorted(_cycle_through(graph, comp) for comp in components)


def _cycle_through(graph: dict[str, set[str]], comp: set[str]) -> list[str]:
    """One cycle through the first module of a strongly connected component, inside it (breadth-first: shortest)."""
    start = min(comp)
    paths = {start: [start]}
    todo = [start]
    while todo:
        v = todo.pop(0)
        for w in sorted(graph.get(v, ()) & comp):
            if w == start:
                return [*paths[v], start]
            if w not in paths:
                paths[w] = [*paths[v], w]
                todo.append(w)
    raise AssertionError(f"no cycle through {start} in {sorted(comp)}")  # pragma: no cover - a component has one


def test_no_import_cycles():
    """No cycle among the imports of src/, counting the lazy ones (inside a function) and the ``TYPE_CHECKING`` ones:
    each is a dependency a reader and a type checker follow. An analysis's declaration (``<name>_spec.py``) imports
    its class in its factory, so the class imports neither its declaration nor the registry or the report options
    assembled from it (it reads its own option by name from ``core.option_specs.GeneralOptions``)."""
    cycles = import_cycles()
    assert not cycles, "import cycles (one through each group of modules that import each other):\n" + "\n".join(
        " -> ".join(c) for c in cycles
    )


def planted_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, files: dict[str, str]) -> Path:
    """A fake ``tl_idempotence`` under ``tmp_path`` holding ``files`` (path in the package -> source; every folder
    gets an empty ``__init__.py``), made the tree these rules walk (``SRC``) for the test."""
    fake = tmp_path / "tl_idempotence"
    for rel, text in files.items():
        for folder in (fake, *(fake / p for p in reversed(Path(rel).parents[:-1]))):  # top down
            folder.mkdir(exist_ok=True)
            (folder / "__init__.py").touch()
        (fake / rel).write_text(text)
    monkeypatch.setattr(sys.modules[__name__], "SRC", fake)
    return fake


def test_the_cycle_rule_fails_on_a_planted_cycle(tmp_path, monkeypatch):
    """The rule above can fail, also on a cycle closed only by a lazy import and a ``TYPE_CHECKING`` one."""
    planted_package(
        tmp_path,
        monkeypatch,
        {
            "analyses/a_spec.py": "def analysis():\n    from .a import A\n\n    return A()\n",
            "analyses/a.py": (
                "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from .a_spec import analysis\n\n"
                "class A: ...\n"
            ),
            "analyses/b.py": "from .a import A\n",  # on the way in, not in the cycle
        },
    )
    assert import_cycles() == [
        ["tl_idempotence.analyses.a", "tl_idempotence.analyses.a_spec", "tl_idempotence.analyses.a"]
    ]
    with pytest.raises(AssertionError, match=r"tl_idempotence\.analyses\.a -> tl_idempotence\.analyses\.a_spec -> "):
        test_no_import_cycles()


def test_the_cycle_rule_sees_a_lazy_reference(tmp_path, monkeypatch):
    """A cycle closed by a lazy reference (``Lazy("module", "name")``, imported on first use) is a cycle too."""
    planted_package(
        tmp_path,
        monkeypatch,
        {
            "analyses/a_spec.py": 'analysis = Lazy("tl_idempotence.analyses.a", "A")\n',
            "analyses/a.py": "from .a_spec import analysis\n\nclass A: ...\n",
        },
    )
    assert import_cycles() == [
        ["tl_idempotence.analyses.a", "tl_idempotence.analyses.a_spec", "tl_idempotence.analyses.a"]
    ]


def test_no_higher_layer_named_in_a_string():
    """importlib by name would hide an upward import from the checks above: only the documented backend may."""
    pat = re.compile(r"""["'](tl_idempotence(?:\.[a-z_]+)+)["']""")
    bad = []
    for path in sorted(SRC.rglob("*.py")):
        mod = module_name(path)
        if mod == "tl_idempotence":
            continue  # the façade's lazy export table names every module, by design
        for m in pat.finditer(path.read_text(encoding="utf-8")):
            target = m.group(1)
            try:
                higher = layer_of(target) > layer_of(mod)
            except KeyError:
                continue
            if higher and (mod, target) not in NAMED_BY_STRING:
                bad.append(f"{mod} names {target}")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("sub", ["core", "views", "maths", "sources", "analyses", "probes", "report", "studies"])
def test_every_module_is_in_a_layer(sub):
    assert (SRC / sub / "__init__.py").is_file()
    for path in (SRC / sub).glob("*.py"):
        assert layer_of(module_name(path)) == LAYERS[sub]


def test_results_draw_through_a_plain_import_of_the_views():
    """No locator: nothing in src/ hands the views down or looks them up, and every result class draws through
    :class:`~tl_idempotence.views.results.DrawnResult` (a display the import walk above sees)."""
    import tl_idempotence
    from tl_idempotence.core import results
    from tl_idempotence.views.results import DrawnResult

    for path in sorted(SRC.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        assert "use_views" not in text and "_load_views" not in text and "views()" not in text, path
    assert not hasattr(results, "views") and not hasattr(tl_idempotence, "_load_views")
    assert "_repr_html_" not in vars(results.Result)
    for name in ("Closure", "Scramble", "SearchResult", "MismatchResult", "SharedValueAlgebra", "ActivationReturns",
                 "Ablation", "HeadRoles", "HeadTokens", "AttendedTokenEffect", "IdempotenceReport", "RoleAssociation",
                 "Mechanism", "Trajectory", "Comparison"):  # fmt: skip
        assert issubclass(getattr(tl_idempotence, name), DrawnResult), name


def test_weight_only_analyses_and_forward_pass_probes_do_not_import_each_other():
    bad = [
        f"{a} imports {b} at line {line}"
        for a, b, _, line in imports()
        if {a.split(".")[1:2][0] if "." in a else "", b.split(".")[1:2][0] if "." in b else ""}
        == {"analyses", "probes"}
    ]
    assert not bad, "\n".join(bad)


#: What a view never imports: the layers that open models and files or run them ("views only draw"); the layer rule
#: refuses these too (they all sit above the views), this check says why.
VIEWS_NEVER_IMPORT = ("sources", "probes", "studies")
#: Libraries that load or run a model; a view draws results and imports none of them.
MODEL_LIBRARIES = ("torch", "transformer_lens", "transformers", "safetensors", "gguf")
#: Calls that open a model or run a forward pass.
RUNNING_CALLS = {"run_with_hooks", "run_with_cache", "from_pretrained", "boot_transformers", "head_source", "forward"}


def _views_modules() -> list[Path]:
    return sorted((SRC / "views").rglob("*.py"))


def test_views_import_no_source_probe_or_study():
    """Nothing under views/ imports sources, probes or studies — also not under TYPE_CHECKING or in a function."""
    bad = [
        f"{a} imports {b} at line {line}"
        for a, b, _, line in imports()
        if a.startswith("tl_idempotence.views") and b.split(".")[1:2] and b.split(".")[1] in VIEWS_NEVER_IMPORT
    ]
    assert not bad, "\n".join(bad)


def test_views_open_no_model_and_run_no_forward_pass():
    """A view imports no model library and calls nothing that loads or runs a model: it draws results."""
    bad = []
    for path in _views_modules():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            elif (lazy := lazy_arguments(node)) is not None and isinstance(lazy[0], str):
                names = [lazy[0]]  # a lazy reference to a library is an import of it
            bad += [f"{path.name}:{node.lineno} imports {n}" for n in names if n.split(".")[0] in MODEL_LIBRARIES]
            if isinstance(node, ast.Call):
                f = node.func
                called = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
                if called in RUNNING_CALLS:
                    bad.append(f"{path.name}:{node.lineno} calls {called}")
    assert not bad, "\n".join(bad)


def test_the_views_rule_fails_on_a_view_that_runs_a_model(tmp_path, monkeypatch):
    """The two checks above can fail: a views module that imports the probes and runs a model is caught."""
    import tl_idempotence

    fake_src = planted_package(
        tmp_path,
        monkeypatch,
        {
            "probes/attention.py": "def attention_patterns(m, t, h):\n    return None\n",
            "views/bad.py": (
                "import torch\nfrom ..probes.attention import attention_patterns\n\n"
                "def draw(model, toks):\n    return model.run_with_hooks(toks)\n"
            ),
        },
    )
    with pytest.raises(AssertionError, match=r"tl_idempotence\.views\.bad imports tl_idempotence\.probes\.attention"):
        test_views_import_no_source_probe_or_study()
    with pytest.raises(AssertionError, match=r"bad\.py:1 imports torch[\s\S]*bad\.py:5 calls run_with_hooks"):
        test_views_open_no_model_and_run_no_forward_pass()
    assert Path(tl_idempotence.__file__).parent != fake_src  # the real package is untouched


#: The most lines a module of the package may have (the brief's size rule; issue 45 found two over it).
MAX_MODULE_LINES = 800


def _long_modules(root: Path) -> list[str]:
    return sorted(
        f"{p.relative_to(root)} ({n} lines)"
        for p in root.rglob("*.py")
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES
    )


def test_no_module_is_over_the_size_rule():
    assert _long_modules(SRC) == []


def test_the_size_rule_fails_on_a_planted_long_module(tmp_path):
    (tmp_path / "short.py").write_text("x = 1\n" * MAX_MODULE_LINES)
    (tmp_path / "long.py").write_text("x = 1\n" * (MAX_MODULE_LINES + 1))
    assert _long_modules(tmp_path) == [f"long.py ({MAX_MODULE_LINES + 1} lines)"]
