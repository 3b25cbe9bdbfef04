"""The shape checks of the test run (tests/shapecheck.py) reach every shape annotation of the package.

The import hook instruments only the modules whose source text has a jaxtyping annotation; an annotation spelled
through an alias (``Heads = Float[Tensor, "..."]`` in one module, ``x: Heads`` in another) or imported under
another name would escape that scan, so this walks every function and method of every module, resolves each
annotation in the function's globals and fails on a jaxtyping type in a module the hook left out.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import pkgutil
import sys
from pathlib import Path
from typing import Any

import jaxtyping
import pytest
import torch

import shapecheck
import tl_idempotence


def _is_shape(hint: Any, namespace: dict[str, Any]) -> bool:
    if isinstance(hint, str):
        try:
            hint = eval(hint, dict(namespace))  # the package's own annotation strings
        except Exception:  # a TYPE_CHECKING-only name: the text scan is all there is
            return shapecheck.is_array_hint(hint)
    return shapecheck.is_array_hint(hint) or any(_is_shape(a, namespace) for a in getattr(hint, "__args__", ()))


def _functions(module: Any) -> list[Any]:
    found = []
    for obj in vars(module).values():
        if getattr(obj, "__module__", None) != module.__name__:
            continue
        if inspect.isfunction(obj):
            found.append(obj)
        elif inspect.isclass(obj):
            found.extend(f for f in vars(obj).values() if inspect.isfunction(f))
            if "__annotations__" in vars(obj):
                found.append(obj)
    return found


def _shape_annotated(module: Any) -> list[str]:
    names = []
    for fn in _functions(module):
        fn = inspect.unwrap(fn)
        ann = vars(fn).get("__annotations__", {}) if inspect.isclass(fn) else getattr(fn, "__annotations__", {})
        namespace = getattr(fn, "__globals__", vars(module))
        if any(_is_shape(h, namespace) for h in ann.values()):
            names.append(fn.__qualname__)
    return names


def test_every_shape_annotation_stands_in_an_instrumented_module():
    instrumented = set(shapecheck.instrumented_modules())
    missed = {}
    for info in pkgutil.walk_packages(tl_idempotence.__path__, "tl_idempotence."):
        if info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        found = _shape_annotated(module)
        if found and info.name not in instrumented:
            missed[info.name] = found
    assert not missed, f"shape annotations the test run does not check (tests/shapecheck.py): {missed}"
    assert "tl_idempotence.maths.closure" in instrumented and len(instrumented) >= 5


def test_the_walk_sees_an_annotation_spelled_through_an_alias(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The planted escape: an alias defined in one module and used in another with no ``Float[`` of its own."""
    pkg = tmp_path / "src" / "tl_idempotence"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "aliases.py").write_text('from jaxtyping import Float\nfrom torch import Tensor\nX = Float[Tensor, "n"]\n')
    (pkg / "user.py").write_text("from tl_idempotence.aliases import X\ndef f(x: X) -> None: ...\n")
    (pkg / "plain.py").write_text("def g(x: int) -> int:\n    return x\n")
    assert shapecheck.instrumented_modules(tmp_path / "src") == ["tl_idempotence.aliases"]
    monkeypatch.syspath_prepend(str(tmp_path / "src"))
    for name in ("tl_idempotence.aliases", "tl_idempotence.user", "tl_idempotence.plain"):
        spec = importlib.util.spec_from_file_location(name, pkg / f"{name.split('.')[1]}.py")
        module = importlib.util.module_from_spec(spec)
        monkeypatch.setitem(sys.modules, name, module)
        spec.loader.exec_module(module)
    assert _shape_annotated(sys.modules["tl_idempotence.user"]) == ["f"]
    assert _shape_annotated(sys.modules["tl_idempotence.plain"]) == []


def test_installing_after_the_package_is_imported_is_refused():
    with pytest.raises(RuntimeError, match="already imported"):
        shapecheck.install()


def test_the_checker_is_on_an_instrumented_function_and_off_elsewhere():
    from tl_idempotence.core.options import check_int
    from tl_idempotence.maths.closure import closure_sums

    assert hasattr(closure_sums, "__wrapped__")  # jaxtyping's wrapper
    assert not hasattr(check_int, "__wrapped__")
    with pytest.raises(jaxtyping.TypeCheckError):
        closure_sums(*(torch.ones(1, 3, 2, dtype=torch.float64),) * 3)


@pytest.mark.parametrize("value", ["of", "OFF", "0", ""])
def test_a_switch_that_is_not_on_or_off_is_refused(value: str, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv(shapecheck.SWITCH, value)
    with pytest.raises(RuntimeError, match="must be 'on' or 'off'"):
        shapecheck.install_unless_switched_off()


def test_off_installs_nothing_and_on_installs(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv(shapecheck.SWITCH, "off")
    assert shapecheck.install_unless_switched_off() == []
    monkeypatch.setenv(shapecheck.SWITCH, "on")
    with pytest.raises(RuntimeError, match="already imported"):  # on: it tries, and the package is imported here
        shapecheck.install_unless_switched_off()
