"""The runtime type checker the test run instruments tl_idempotence with (jaxtyping's import hook,
``--jaxtyping-packages`` in pyproject.toml): beartype on every **shape** annotation (jaxtyping's
``Float[Tensor, "n_heads d_model d_head"]`` and kin), and nothing else.

Plain annotations (``threshold: float``, ``path: str | os.PathLike[str]``) describe the public API for
editors, ``help()`` and type checkers; at run time every public argument is validated by the library itself
where it enters (the ``check_*`` functions of ``tl_idempotence.core.options``), which is what a user,
who runs without this hook, meets: the library's own ``OptionTypeError`` naming the argument. Checking those
annotations here too would answer a wrong type with jaxtyping's ``TypeCheckError`` first — the tests would
check an error users never see.
"""

from __future__ import annotations

import re
import types
from typing import Any

from beartype import BeartypeConf, beartype

#: int accepted where float is annotated, as PEP 484 says.
CONF = BeartypeConf(is_pep484_tower=True)
_ARRAY = re.compile(r"\b(Float|Float32|Float64|Int|Int64|UInt8|Bool|Complex|Shaped|Num|Real|Integer|Inexact)\[")


def _is_array_hint(hint: Any) -> bool:
    if isinstance(hint, str):
        return bool(_ARRAY.search(hint))
    return type(hint).__module__.startswith("jaxtyping") or bool(_ARRAY.search(repr(hint)))


def checker(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """``fn`` checked by beartype on its shape-annotated parameters and return only (unchanged when it has none)."""
    ann = getattr(fn, "__annotations__", None)
    if not isinstance(ann, dict) or not isinstance(fn, types.FunctionType):
        return fn
    keep = {k: v for k, v in ann.items() if _is_array_hint(v)}
    if not keep:
        return fn
    if len(keep) == len(ann):
        return beartype(fn, conf=CONF)
    proxy = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    proxy.__kwdefaults__ = fn.__kwdefaults__
    proxy.__qualname__, proxy.__module__, proxy.__doc__ = fn.__qualname__, fn.__module__, fn.__doc__
    proxy.__annotations__ = keep
    return beartype(proxy, conf=CONF)
