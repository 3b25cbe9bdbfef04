"""Layer 2 — every figure, page and display, drawn from results (never a model, a forward pass, a source, a probe or a
study: ``tests/unit/test_layering.py``): plotly figures (:mod:`.figures`; those of the probes joined to a report in
:mod:`.role_figures`), the standalone HTML report (:mod:`.page`), circuitsvis attention views of computed patterns
(:mod:`.attention`), notebook displays and :func:`use_offline_plotly` (figures that also render in a static HTML
render of an executed notebook, offline; :mod:`.notebook`) and the words around the numbers (:mod:`.text`).

The views import only ``errors`` and ``core`` and sit just above ``core``, below every layer that defines a result:
a result's figure or page imports what it draws with here where it is used (``from ..views import heads_heatmap``),
and its notebook display comes from :class:`.results.DrawnResult`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, ParamSpec

from . import compare as _compare
from . import figures as _figures
from . import population as _population
from . import role_figures as _role_figures
from .attention import AttentionView, attention_section, draw_attention
from .compare import comparison_headline, comparison_html
from .notebook import result_html, use_offline_plotly
from .page import report_html

_P = ParamSpec("_P")


def _returns_exportable(fn: Callable[_P, Any]) -> Callable[_P, Any]:
    """``fn`` whose figure (or list of figures) comes back as :class:`.exportable.ExportableFigure`: the figures
    the library hands to users render in a static notebook export too (:mod:`.exportable`); a type checker sees
    ``fn``'s parameters."""

    @functools.wraps(fn)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> Any:
        from .exportable import exportable

        out = fn(*args, **kwargs)
        return [exportable(f) for f in out] if isinstance(out, list) else exportable(out)

    return wrapper


activation_figure = _returns_exportable(_figures.activation_figure)
algebra_figures = _returns_exportable(_figures.algebra_figures)
algebra_summary_figure = _returns_exportable(_figures.algebra_summary_figure)
heads_heatmap = _returns_exportable(_figures.heads_heatmap)
report_figures = _returns_exportable(_figures.report_figures)
roles_figure = _returns_exportable(_role_figures.roles_figure)
mechanism_figure = _returns_exportable(_role_figures.mechanism_figure)
scramble_figures = _returns_exportable(_figures.scramble_figures)
trajectory_figure = _returns_exportable(_figures.trajectory_figure)
trajectory_summary_figure = _returns_exportable(_figures.trajectory_summary_figure)
comparison_figure = _returns_exportable(_compare.comparison_figure)
mechanism_comparison_figure = _returns_exportable(_population.mechanism_comparison_figure)

__all__ = [
    "AttentionView",
    "activation_figure",
    "algebra_figures",
    "algebra_summary_figure",
    "attention_section",
    "comparison_figure",
    "comparison_headline",
    "comparison_html",
    "draw_attention",
    "heads_heatmap",
    "mechanism_comparison_figure",
    "mechanism_figure",
    "report_figures",
    "report_html",
    "result_html",
    "roles_figure",
    "scramble_figures",
    "trajectory_figure",
    "trajectory_summary_figure",
    "use_offline_plotly",
]
