"""Plotly figures whose notebook output renders anywhere: in Jupyter and in a static HTML export, offline.

Every figure the library returns (``rep.figure()``, ``cmp.figure()``, ...) is an :class:`ExportableFigure`:
a ``plotly.graph_objects.Figure`` in every respect (``update_layout``, ``show``, ``write_html``, pickling)
whose notebook display (``_repr_mimebundle_``) carries two representations:

* ``application/vnd.plotly.v1+json`` — what JupyterLab, Notebook 7 and VS Code draw with their plotly
  renderer (the same output as plotly's default);
* ``text/html`` — a ``<div>`` and its drawing script, what a static export (``jupyter nbconvert --to html``,
  a rendered notebook on a website) shows. The first figure displayed in a kernel embeds plotly.js itself
  (~4.7 MB, from the installed plotly package, no CDN), later ones reuse it, so the export draws every
  figure with no network and no extra call.

Only the library's own figures change; the user's plotly defaults (``plotly.io.renderers``) are untouched.
This module imports plotly: it is loaded only when a figure is made.
"""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go

from .notebook import PLOTLYJS_EMBEDDED, figure_bundle

__all__ = ["ExportableFigure", "exportable"]


class ExportableFigure(go.Figure):
    """A ``plotly.graph_objects.Figure`` whose notebook output also renders in a static HTML export, offline
    (module docstring)."""

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None, validate: bool = True, **kwargs: Any) -> Any:
        bundle = figure_bundle(self.to_dict(), embed=not PLOTLYJS_EMBEDDED["done"])
        PLOTLYJS_EMBEDDED["done"] = True
        return bundle

    def _repr_html_(self) -> str:
        return str(self._repr_mimebundle_()["text/html"])

    def _ipython_display_(self) -> None:
        # plotly's Figure displays itself through its default renderer (JSON only in a kernel); this bundle instead
        from IPython.display import display

        display(self._repr_mimebundle_(), raw=True)


def exportable(fig: go.Figure) -> ExportableFigure:
    """The same figure object as an :class:`ExportableFigure` (its class is switched in place: no copy, no
    re-validation)."""
    if not isinstance(fig, ExportableFigure):
        fig.__class__ = ExportableFigure
    return fig
