"""What every result object shares: a short one-line ``repr``.

Every result of the library (``Closure``, ``Scramble``, ``SearchResult``,
``MismatchResult``, ``SharedValueAlgebra``, ``ActivationReturns``, ``IdempotenceReport``,
``Trajectory``, ...) has ``.heads`` (a DataFrame), ``.summary`` (a dict of JSON-able
headline numbers) and derives from :class:`Result`, which gives it ``repr(x)``: one line, the class
name and a few headline numbers — never a tensor dump.

The notebook display (``x._repr_html_()``) comes from
:class:`tl_idempotence.views.results.DrawnResult`, the :class:`Result` every result class derives from:
the views sit one layer above this one, so a result's display is an import the layering test sees.

:data:`DISPLAYS` is the one registry of notebook displays, keyed by a result class's :attr:`Result.display_kind`:
the views register the displays they draw (``views/notebook.py``: the report, a comparison, an ablation, a mechanism
result), and a joined probe's declaration registers its own (``report/joins.py``). It lives here, below the views,
so that registering a display imports neither pandas nor plotly (the command line's ``--help`` reads the joins'
declarations and stays light).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, ClassVar

from ..errors import RegistrationError

__all__ = ["DISPLAYS", "Result", "register_display", "short_value"]

#: The notebook displays by ``display_kind``: ``draw(result) -> HTML`` (plain HTML, no script); what
#: :func:`tl_idempotence.views.notebook.result_html` draws (``"result"``, the generic display, is not here).
DISPLAYS: dict[str, Callable[[Any], str]] = {}


def register_display(kind: str, draw: Callable[[Any], str]) -> Callable[[Any], str]:
    """Register ``draw`` as the notebook display of the result classes whose ``display_kind`` is ``kind``.

    Registering the same function again is a no-op; returns ``draw``.

    Raises:
        RegistrationError: ``kind`` is not a non-empty str, is ``"result"`` (the generic display), or another
            function already draws it (names the kind and both functions); ``draw`` is not callable.
    """
    if not isinstance(kind, str) or not kind or kind == "result":
        raise RegistrationError(f"a display kind must be a non-empty str other than 'result'; got {kind!r}.")
    if not callable(draw):
        raise RegistrationError(f"the display of {kind!r} must be a function (result) -> HTML; got {draw!r}.")
    have = DISPLAYS.get(kind)
    if have is not None and have is not draw:
        raise RegistrationError(
            f"cannot register {getattr(draw, '__qualname__', draw)!r} as the display of {kind!r}: "
            f"{getattr(have, '__qualname__', have)!r} already draws it."
        )
    DISPLAYS[kind] = draw
    return draw


def short_value(v: Any) -> str | None:
    """A scalar summary value as short text, or None for anything that is not a scalar."""
    if isinstance(v, bool) or v is None:
        return str(v)
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return "nan" if math.isnan(v) else f"{v:.4g}"
    if isinstance(v, str):
        return repr(v) if len(v) <= 40 else repr(v[:37] + "...")
    try:  # numpy scalars
        import numpy as np

        if isinstance(v, np.generic):
            return short_value(v.item())
    except ImportError:  # pragma: no cover
        pass
    return None


class Result:
    """Mixin of every result object: a short ``repr`` (module docstring).

    Subclasses provide ``heads`` and ``summary`` (attributes or properties; not declared
    here, so that dataclass fields of those names work); :attr:`repr_keys` chooses which summary
    entries the one-line ``repr`` shows (default: the first eight scalar ones).
    """

    repr_keys: ClassVar[tuple[str, ...]] = ()
    #: Which notebook display :func:`tl_idempotence.views.notebook.result_html` draws: a key of :data:`DISPLAYS`
    #: (``"report"``, ``"ablation"``, ``"comparison"``, ``"mechanism"``, a joined probe's own; ``"result"``: the
    #: generic one). Declared by the class, so the views never import the layer that defines it.
    display_kind: ClassVar[str] = "result"

    def __init_subclass__(
        cls, *, repr_keys: str | tuple[str, ...] | None = None, display_kind: str | None = None, **kwargs: Any
    ) -> None:
        """A subclass declares its :attr:`repr_keys` and :attr:`display_kind` as class keywords
        (``class Scramble(ImmutableResult, repr_keys="n_heads n_draws")``), the summary keys as one space-separated
        string (split into the tuple) or a tuple; a keyword left out keeps what the class body or a base says.

        Raises:
            RegistrationError: ``repr_keys`` not a str or a tuple of str; ``display_kind`` not a non-empty str (at
                the class statement, naming the class).
        """
        super().__init_subclass__(**kwargs)
        if repr_keys is not None:
            keys = tuple(repr_keys.split()) if isinstance(repr_keys, str) else repr_keys
            if not isinstance(keys, tuple) or not all(isinstance(k, str) and k for k in keys):
                raise RegistrationError(
                    f"class {cls.__name__}: repr_keys must be summary keys (one space-separated str, or a tuple of "
                    f"str); got {repr_keys!r}."
                )
            cls.repr_keys = keys
        if display_kind is not None:
            if not isinstance(display_kind, str) or not display_kind:
                raise RegistrationError(
                    f"class {cls.__name__}: display_kind must be a non-empty str; got {display_kind!r}."
                )
            cls.display_kind = display_kind

    def __repr__(self) -> str:
        try:
            s = self.summary  # type: ignore[attr-defined]
        except Exception as e:  # noqa: BLE001 - a repr must never raise
            return f"<{type(self).__name__} (summary unavailable: {type(e).__name__})>"
        keys = [k for k in self.repr_keys if k in s] or list(s)
        items = []
        for k in keys:
            t = short_value(s[k])
            if t is not None:
                items.append(f"{k}={t}")
            if len(items) >= 8:
                break
        return f"{type(self).__name__}({', '.join(items)})"
