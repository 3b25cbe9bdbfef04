"""Keyword checking for public functions, without importing torch (the zoo and the CLI's ``--help``
path use it too).

* :func:`strict_kwargs` — decorator: an unknown keyword raises
  :class:`~tl_idempotence.errors.UnknownOptionError` naming the closest valid ones.
* :func:`unknown_option_error` — that error, for code that checks keywords itself.
"""

from __future__ import annotations

import difflib
import functools
import inspect
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from ..errors import UnknownOptionError

__all__ = ["strict_kwargs", "unknown_option_error"]


def unknown_option_error(where: str, unknown: Iterable[str], valid: Iterable[str]) -> UnknownOptionError:
    """The error for unknown keywords: names each and the closest valid names (difflib)."""
    valid = sorted(set(valid))
    parts = []
    for k in unknown:
        close = difflib.get_close_matches(k, valid, n=3, cutoff=0.5)
        parts.append(f"{k!r}" + (f" (did you mean {', '.join(repr(c) for c in close)}?)" if close else ""))
    return UnknownOptionError(f"{where} got unknown option(s) {', '.join(parts)}. Valid options: {', '.join(valid)}.")


F = TypeVar("F", bound=Callable[..., Any])


def strict_kwargs(fn: F) -> F:
    """Decorator: an unknown keyword raises :class:`UnknownOptionError` naming the closest valid ones.

    The wrapper keeps the real signature (``inspect.signature`` follows ``__wrapped__``).
    Functions that take ``**kwargs`` on purpose are not decorated with it.
    """
    sig = inspect.signature(fn)
    names = [
        p.name
        for p in sig.parameters.values()
        if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    ]
    # A method's self/cls is not an option to suggest (it can still be passed by keyword, as Python allows).
    shown = [n for i, n in enumerate(names) if not (i == 0 and n in ("self", "cls"))]

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        unknown = [k for k in kwargs if k not in names]
        if unknown:
            raise unknown_option_error(f"{fn.__qualname__}()", unknown, shown)
        return fn(*args, **kwargs)

    return wrapper  # type: ignore[return-value]
