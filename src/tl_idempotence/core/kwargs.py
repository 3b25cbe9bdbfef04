"""Keyword checking for public functions, without importing torch (the zoo and the CLI's ``--help``
path use it too).

* :func:`strict_kwargs` — decorator: an unknown keyword raises
  :class:`~tl_idempotence.errors.UnknownOptionError` naming the closest valid ones.
* :func:`unknown_option_error` — that error, for code that checks keywords itself.
* :func:`by_name` — THE lookup of a declaration (an option, an analysis, a join) by its name.
* :func:`warn_at_caller` — a warning attributed to the first caller outside the package (a deprecated
  keyword warns at the user's line, through :func:`strict_kwargs`'s wrapper or any other).
"""

from __future__ import annotations

import difflib
import functools
import inspect
import warnings
from collections.abc import Callable, Iterable
from typing import Any, Protocol, TypeVar

from ..errors import UnknownOptionError

__all__ = ["by_name", "strict_kwargs", "unknown_option_error", "warn_at_caller"]

#: Top-level modules whose frames a warning skips: the package, and the runtime type checkers that may wrap
#: its functions (jaxtyping's import hook instruments it with beartype while the tests run).
_SKIPPED_MODULES = frozenset({__name__.partition(".")[0], "jaxtyping", "beartype", "typeguard"})


def warn_at_caller(message: str, category: type[Warning] = DeprecationWarning) -> None:
    """``warnings.warn(message, category)`` attributed to the first caller outside ``tl_idempotence``.

    A fixed ``stacklevel`` counts frames, so a decorator's wrapper (:func:`strict_kwargs`) or a helper in
    between shifts it onto the library's own file: Python's default filters then hide a
    ``DeprecationWarning`` (they show it only where ``__main__`` triggers it), and any filter or
    traceback names the wrong line. Walking to the user's frame (by module name: the package's own
    and a runtime type checker's wrappers are skipped) keeps both right whatever the call path.
    """
    level, frame = 2, inspect.currentframe()
    frame = frame.f_back if frame is not None else None  # the frame that called warn_at_caller: level 2
    while frame is not None and str(frame.f_globals.get("__name__", "")).partition(".")[0] in _SKIPPED_MODULES:
        frame, level = frame.f_back, level + 1
    del frame  # no reference cycle through the frames
    warnings.warn(message, category, stacklevel=level)


def unknown_option_error(where: str, unknown: Iterable[str], valid: Iterable[str]) -> UnknownOptionError:
    """The error for unknown keywords: names each and the closest valid names (difflib)."""
    valid = sorted(set(valid))
    parts = []
    for k in unknown:
        close = difflib.get_close_matches(k, valid, n=3, cutoff=0.5)
        parts.append(f"{k!r}" + (f" (did you mean {', '.join(repr(c) for c in close)}?)" if close else ""))
    return UnknownOptionError(f"{where} got unknown option(s) {', '.join(parts)}. Valid options: {', '.join(valid)}.")


class _Named(Protocol):
    @property
    def name(self) -> str: ...


N = TypeVar("N", bound=_Named)


def by_name(items: Iterable[N], name: str, missing: Callable[[list[str]], Exception]) -> N:
    """THE lookup of a declaration by its ``name`` (an option, an analysis, a join): the first of ``items`` so named.

    Raises:
        ``missing(names)``, with every item's name in order: none is called ``name``.
    """
    items = tuple(items)
    for x in items:
        if x.name == name:
            return x
    raise missing([x.name for x in items])


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
