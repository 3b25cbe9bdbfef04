"""Displays say what they show: the threshold a comparison used (not the paper's 0.9 when it differs), the
constructive search's P as "searched P", "weight processing not recorded" when a report does not say, and a P
just below the threshold (0.89996 at 0.9) never shown as 0.9000 in the closed-heads table, the notebook cells
or the trajectory hover.

Synthetic Gaussian heads (seeded) measured for real; the P values placed at 0.89996 are set by hand on the
report's table, as the displays read it.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

import tl_idempotence as tli
from helpers import SyntheticSource, gaussian_layer
from tl_idempotence.core.paper import PAPER_THRESHOLD
from tl_idempotence.report.report import IdempotenceReport
from tl_idempotence.studies.trajectory import Trajectory
from tl_idempotence.views.compare import comparison_figure, comparison_headline, comparison_html
from tl_idempotence.views.notebook import mini_heatmap
from tl_idempotence.views.page import closed_heads_table
from tl_idempotence.views.text import headline, weights_phrase

NEAR = 0.89996  # below 0.9; "0.9000" at 4 decimals


def synthetic(seed: int = 3) -> SyntheticSource:
    return SyntheticSource([gaussian_layer(layer, 4, 2, 16, 4, seed + layer) for layer in range(2)], name="syn")


@pytest.fixture(scope="module")
def rep():
    return tli.idempotence_report(synthetic(), search=True, progress=False)


def test_a_P_just_below_the_threshold_is_never_shown_as_the_threshold(rep):
    r = tli.idempotence_report(synthetic(), search=True, progress=False)
    heads = r.heads  # a copy (the report is immutable): edited, then made into a report of its own
    label = heads.index[0]
    heads.loc[:, "P"] = 0.1
    heads.loc[label, "P"] = NEAR
    heads.loc[label, "P_searched"] = NEAR
    r = IdempotenceReport(heads, r.layers, r.tables, r.summary, r.info, r.options)
    assert not r.heads["closed"].any()  # Gaussian heads: none closed
    table = closed_heads_table(r)  # none closed: the top 10 by P
    row = table[table["head"] == label].iloc[0]
    assert row["P"] == "0.89996" and row["searched P"] == "0.89996"
    assert "feasible P (search)" not in table.columns
    cell = mini_heatmap(r)
    assert f"{label}: P = 0.89996" in cell and "P = 0.9000" not in cell


def test_trajectory_hover_and_labels_keep_P_on_its_side():
    heads = pd.DataFrame(
        {
            "checkpoint": ["a", "b"],
            "order": [0, 1],
            "step": [0.0, 10.0],
            "layer": [0, 0],
            "head": [1, 1],
            "alpha": [1.0, 1.0],
            "P": [0.5, NEAR],
            "closed": [False, False],
        }
    )
    layers = pd.DataFrame({"checkpoint": ["a", "b"], "order": [0, 1], "step": [0.0, 10.0], "layer": [0, 0]})
    ck = pd.DataFrame(
        {
            "order": [0, 1],
            "checkpoint": ["a", "b"],
            "step": [0.0, 10.0],
            "n_heads": [1, 1],
            "threshold": [0.9, 0.9],
            "n_closed": [0, 0],
            "median_P": [0.5, NEAR],
            "identical_to": ["", ""],
            "shares_layers_with": ["", ""],
        }
    )
    tr = Trajectory(heads=heads, layers=layers, checkpoints=ck, threshold=0.9)
    fig = tr.figure()
    assert [row[2] for row in fig.data[0].customdata] == ["0.5000", "0.89996"]
    assert "P=%{customdata[2]}" in fig.data[0].hovertemplate
    summ = tr.summary_figure()
    assert list(summ.data[0].customdata) == ["0.5000", "0.89996"]
    assert "P ≥ 0.9" in summ.layout.title.text and "fraction of heads with P ≥ 0.9" == summ.layout.yaxis2.title.text


def test_comparison_at_another_threshold_says_so(rep):
    other = tli.idempotence_report(synthetic(seed=11), threshold=0.5, progress=False)
    low = tli.compare({"x": other, "y": tli.idempotence_report(synthetic(seed=5), threshold=0.5, progress=False)})
    fig = comparison_figure(low)
    lines = [a.text for a in fig.layout.annotations]
    assert f"threshold P = 0.5 (paper: {PAPER_THRESHOLD:g})" in lines
    assert not any(t == "P = 0.9" for t in lines)
    assert "closed: P ≥ 0.5 (the paper counts at P ≥ 0.9; these models at P ≥ 0.5)" in fig.layout.title.text
    text = comparison_headline(low)
    assert (
        "heads with P ≥ 0.5 range" in text and "paper, at P ≥ 0.9: 3.98–8.00 %; not comparable at threshold 0.5" in text
    )
    page = comparison_html(low)
    assert "The paper counts a head closed at P ≥ 0.9; the models here at P ≥ 0.5." in page
    at_paper = tli.compare({"x": rep, "y": tli.idempotence_report(synthetic(seed=5), search=True, progress=False)})
    fig09 = comparison_figure(at_paper)
    assert "threshold P = 0.9" in [a.text for a in fig09.layout.annotations]
    assert "the paper counts" not in fig09.layout.title.text
    assert "not comparable" not in comparison_headline(at_paper)


def test_weights_phrase_says_when_processing_is_not_recorded(rep):
    assert rep.summary.get("processing") in (None, {})  # a synthetic source records no processing
    assert weights_phrase(rep.summary) == "weight processing not recorded"
    assert "(SyntheticSource, weight processing not recorded)" in headline(rep.summary, rep.threshold)
    with_processing = rep.summary.replace  # the typed summary with other processing flags
    assert weights_phrase(with_processing(processing={"raw": True})) == "raw checkpoint weights"
    assert weights_phrase(with_processing(processing={"raw": False, "fold_ln": True})) == (
        "TransformerLens-processed weights (fold_ln)"
    )
    only_fold = with_processing(processing={"fold_ln": True})
    assert weights_phrase(only_fold) == "TransformerLens-processed weights (fold_ln)"
    lying = SimpleNamespace(processing="raw")  # a record that lies (a ReportSummary refuses it)
    assert weights_phrase(lying) == "weight processing not recorded"  # type: ignore[arg-type]
    assert np.isfinite(rep.heads["P"]).all()


MARKUP = '<b>x</b><img src=x onerror="alert(1)">&co'


def test_model_names_and_labels_with_markup_are_shown_literally_everywhere(tmp_path):
    """A model name or label is data: plotly titles, tick labels and hover text render markup, so it is written
    as entities there; the pages (jinja2, autoescaped) and the notebook display escape it."""
    from tl_idempotence.views.text import plot_text

    r = tli.idempotence_report(SyntheticSource(list(synthetic()), name=MARKUP), progress=False)
    assert r.summary["model_name"] == MARKUP
    safe = plot_text(MARKUP)
    assert safe == '&lt;b&gt;x&lt;/b&gt;&lt;img src=x onerror="alert(1)"&gt;&amp;co'
    assert safe in r.figure().layout.title.text and MARKUP not in r.figure().layout.title.text
    page = r.save_html(tmp_path / "r.html")
    html = open(page, encoding="utf-8").read()
    assert "<img src=x" not in html and "<b>x</b>" not in html
    assert "<img src=x" not in r._repr_html_()
    cmp = tli.compare({MARKUP: r, "plain": tli.idempotence_report(synthetic(4), progress=False)}, progress=False)
    xs = {x for tr in comparison_figure(cmp).data for x in tr.x}
    assert safe in xs and MARKUP not in xs
    assert "<img src=x" not in comparison_html(cmp)
