"""The result every result class derives from: :class:`~tl_idempotence.core.results.Result`'s short ``repr`` and a
notebook display (``_repr_html_``) drawn by :func:`.notebook.result_html`.

The views sit just above ``core`` and below every layer that defines a result (``maths``, ``analyses``, ``probes``,
``report``, ``studies``), so a result's display is a plain import, seen by the layering test.
"""

from __future__ import annotations

from ..core.results import Result

__all__ = ["DrawnResult"]


class DrawnResult(Result):
    """:class:`~tl_idempotence.core.results.Result` with its notebook display: ``x._repr_html_()`` draws the display
    its class's ``display_kind`` names (:func:`tl_idempotence.views.notebook.result_html`)."""

    def _repr_html_(self) -> str:
        from .notebook import result_html

        return str(result_html(self))
