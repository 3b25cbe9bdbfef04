"""The runtime type checker the test run instruments tl_idempotence with (jaxtyping's import hook, installed by
:func:`install` from the root conftest.py before anything imports the package): beartype on every **shape**
annotation (jaxtyping's ``Float[Tensor, "n_heads d_model d_head"]`` and kin), and nothing else.

Only the modules whose source carries a shape annotation are instrumented (:func:`instrumented_modules`): the
hook wraps *every* function of a module it instruments in a checking wrapper (a signature bind per call), which
on the ~150 modules without one checked nothing and cost the quick tier ~50 of its ~160 seconds.
``tests/unit/test_shapecheck.py`` fails if a shape annotation (or an alias of one) stands in a module not
instrumented.

Plain annotations (``threshold: float``, ``path: str | os.PathLike[str]``) describe the public API for
editors, ``help()`` and type checkers; at run time every public argument is validated by the library itself
where it enters (the ``check_*`` functions of ``tl_idempotence.core.options``), which is what a user,
who runs without this hook, meets: the library's own ``OptionTypeError`` naming the argument. Checking those
annotations here too would answer a wrong type with jaxtyping's ``TypeCheckError`` first — the tests would
check an error users never see.
"""

from __future__ import annotations

import os
import re
import sys
import types
from pathlib import Path
from typing import Any

from beartype import BeartypeConf, beartype

#: int accepted where float is annotated, as PEP 484 says.
CONF = BeartypeConf(is_pep484_tower=True)
#: The package the test run instruments, and where its sources are.
PACKAGE = "tl_idempotence"
SRC = Path(__file__).resolve().parents[1] / "src"
#: A jaxtyping array annotation in source text (``Float[``, ``Int64[``, ...).
_ARRAY = re.compile(r"\b(Float|Float32|Float64|Int|Int64|UInt8|Bool|Complex|Shaped|Num|Real|Integer|Inexact)\[")


def is_array_hint(hint: Any) -> bool:
    if isinstance(hint, str):
        return bool(_ARRAY.search(hint))
    return type(hint).__module__.startswith("jaxtyping") or bool(_ARRAY.search(repr(hint)))


def checker(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """``fn`` checked by beartype on its shape-annotated parameters and return only (unchanged when it has none)."""
    ann = getattr(fn, "__annotations__", None)
    if not isinstance(ann, dict) or not isinstance(fn, types.FunctionType):
        return fn
    keep = {k: v for k, v in ann.items() if is_array_hint(v)}
    if not keep:
        return fn
    if len(keep) == len(ann):
        return beartype(fn, conf=CONF)
    proxy = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    proxy.__kwdefaults__ = fn.__kwdefaults__
    proxy.__qualname__, proxy.__module__, proxy.__doc__ = fn.__qualname__, fn.__module__, fn.__doc__
    proxy.__annotations__ = keep
    return beartype(proxy, conf=CONF)


def instrumented_modules(src: Path = SRC) -> list[str]:
    """The dotted names of the modules of :data:`PACKAGE` under ``src`` whose source has a shape annotation."""
    names = []
    for path in sorted((src / PACKAGE).rglob("*.py")):
        if _ARRAY.search(path.read_text(encoding="utf-8")):
            parts = path.relative_to(src).with_suffix("").parts
            names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def install() -> list[str]:
    """jaxtyping's import hook with :func:`checker` on :func:`instrumented_modules`; returns their names.

    Raises:
        RuntimeError: one of them is already imported (it could not be checked), as jaxtyping's own
            ``--jaxtyping-packages`` option does.
    """
    from jaxtyping import install_import_hook

    names = instrumented_modules()
    early = sorted(n for n in names if n in sys.modules)
    if early:
        raise RuntimeError(f"shapecheck cannot check these modules because they are already imported: {early}")
    install_import_hook(names, "shapecheck.checker")
    return names


#: The environment switch: ``TLI_SHAPECHECK=off`` runs the tests without the hook (scripts/mutation.py: mutmut
#: imports the package before pytest starts, which :func:`install` refuses); ``on`` (the default) installs it.
SWITCH = "TLI_SHAPECHECK"


def install_unless_switched_off() -> list[str]:
    """:func:`install` unless ``TLI_SHAPECHECK=off``; returns the instrumented modules (none when off).

    Raises:
        RuntimeError: ``TLI_SHAPECHECK`` is neither ``on`` nor ``off`` (a typo must not switch the checks off), or
            :func:`install` refused.
    """
    value = os.environ.get(SWITCH, "on")
    if value not in ("on", "off"):
        raise RuntimeError(f"{SWITCH} must be 'on' or 'off'; got {value!r}")
    return install() if value == "on" else []
