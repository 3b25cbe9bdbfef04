"""Layer 6 — every figure, page and display: plotly figures (:mod:`.figures`), the standalone
HTML report (:mod:`.page`), circuitsvis attention views (:mod:`.attention`), notebook
displays and :func:`use_offline_plotly` (figures that also render in a static HTML render of an
executed notebook, offline; :mod:`.notebook`) and the words around the numbers (:mod:`.text`).

Result objects reach these functions by this module's name
(:data:`tl_idempotence.core.results.VIEWS_MODULE`); nothing below imports it.
"""

from __future__ import annotations

from .attention import AttentionView, attention_view, report_attention_view
from .compare import comparison_figure, comparison_headline, comparison_html, save_comparison_html
from .figures import (
    activation_figure,
    algebra_figures,
    algebra_summary_figure,
    heads_heatmap,
    report_figures,
    scramble_figures,
    trajectory_figure,
    trajectory_summary_figure,
)
from .notebook import result_html, use_offline_plotly
from .page import report_html, save_report_html

__all__ = [
    "AttentionView",
    "activation_figure",
    "algebra_figures",
    "algebra_summary_figure",
    "attention_view",
    "comparison_figure",
    "comparison_headline",
    "comparison_html",
    "heads_heatmap",
    "report_attention_view",
    "report_figures",
    "report_html",
    "result_html",
    "save_comparison_html",
    "save_report_html",
    "scramble_figures",
    "trajectory_figure",
    "trajectory_summary_figure",
    "use_offline_plotly",
]
