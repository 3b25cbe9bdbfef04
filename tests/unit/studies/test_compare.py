"""tli.compare: the paper's cross-model table from reports, checkpoints, saved reports and zoo names.

Checked: every table value against the reports it comes from (and the paper's row against the abstract's
figures); one set of options for every model (a report made with others is refused, naming it and the
options); processed vs raw weights and identical weights flagged; labels unique; the real zoo model
minilm-l6 read from its checkpoint files gives the stored 0.1 per-head P; the figure and the offline page.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from safetensors.torch import load_file

import tl_idempotence as tli
from helpers import SyntheticSource, gaussian_layer, oblique_projection, rewrite_saved
from tl_idempotence.core.paper import PAPER
from tl_idempotence.errors import (
    MissingFileError,
    OptionError,
    ReportFileError,
    UnknownModelError,
    UnknownOptionError,
)
from tl_idempotence.studies.compare import TABLE_COLUMNS, Comparison, ModelCount, comparison_table, resolve_items

pytestmark = pytest.mark.bridge


def synthetic(processing: dict | None = None, seed: int = 3) -> SyntheticSource:
    src = SyntheticSource([gaussian_layer(layer, 4, 2, 16, 4, seed + layer) for layer in range(2)], name="syn")
    if processing is not None:
        src.info = dataclasses.replace(src.info, processing=processing)
    return src


def test_table_values_come_from_the_reports(compare_ckpts, tmp_path):
    rep_a = tli.idempotence_report(compare_ckpts["A"], nulls=8, progress=False)
    rep_b = tli.idempotence_report(compare_ckpts["B"], nulls=8, progress=False)
    rep_b.save(tmp_path / "saved_b")
    with pytest.warns(UserWarning, match=r"identical measured weights.*\[\['a', 'a-again'\]\]"):
        cmp = tli.compare({"a": rep_a, "b": tmp_path / "saved_b", "a-again": compare_ckpts["A"]}, progress=False)
    t = cmp.table
    assert list(t.columns) == TABLE_COLUMNS
    assert list(t["model"]) == ["a", "b", "a-again", "paper (low)", "paper (high)"]
    numeric = [c for c in t.columns if c not in ("model", "model_name")]
    assert all(pd.api.types.is_numeric_dtype(t[c]) or pd.api.types.is_bool_dtype(t[c]) for c in numeric)
    for label, rep in (("a", rep_a), ("b", rep_b)):
        row = t.set_index("model").loc[label]
        s = rep.summary
        assert row["n_closed"] == s["n_closed"] and row["n_heads_total"] == s["n_heads"]
        assert row["pct_closed"] == 100 * s["frac_closed"]
        assert row["median_P"] == s["median_P"] == float(np.median(rep.heads["P"]))
        assert row["median_P_scrambled"] == s["median_P_scrambled"]
        assert row["pct_beats_scramble"] == 100 * s["frac_beats_scramble"]
        assert row["n_layers_trained_wins"] == int(rep.layers["trained_wins"].sum())
        assert row["pct_layers_trained_wins"] == 100 * s["n_layers_trained_wins"] / len(rep.layers)
        assert row["mismatch_P_max"] == rep.layers["mismatch_P_max"].max()
        assert row["n_heads_per_layer"] == rep.info.n_heads and row["n_kv_heads"] == rep.info.n_kv_heads
        assert pd.isna(row["n_feasible_layers"]) and np.isnan(row["pct_layers_feasible"])  # search did not run
        assert bool(row["raw_weights"]) and not bool(row["processing_differs"])
    # the report items' options were taken (nulls=8) and applied to the checkpoint item
    assert cmp.options.nulls == 8 and cmp.reports["a-again"].options.nulls == 8
    pd.testing.assert_frame_equal(cmp.reports["a-again"].heads, rep_a.heads, check_exact=True)
    # a and a-again: the same weights, flagged; n_params from the checkpoint's headers (no data read)
    m = cmp.models_table.set_index("model")
    assert list(m["identical_weights"]) == [True, False, True]
    assert list(m["weights_group"]) == [1, 2, 1]
    n_params = sum(v.numel() for f in Path(compare_ckpts["A"]).glob("*.safetensors") for v in load_file(f).values())
    assert m.loc["a-again", "n_params"] == n_params and pd.isna(m.loc["a", "n_params"])
    assert any("identical measured weights" in w and "['a', 'a-again']" in w for w in cmp.warnings)
    # the heads of every model, with the model first
    assert list(cmp.heads.columns[:2]) == ["model", "head_label"]
    got = cmp.heads[cmp.heads["model"] == "b"].drop(columns=["model", "head_label"]).reset_index(drop=True)
    pd.testing.assert_frame_equal(got, rep_b.heads.reset_index(drop=True), check_exact=True)
    assert cmp.summary["n_heads"] == 2 * rep_a.summary["n_heads"] + rep_b.summary["n_heads"]
    assert repr(cmp).startswith("Comparison(n_models=3, threshold=0.9")


def test_paper_rows_hold_the_abstract_figures():
    cmp = Comparison.from_reports({"syn": tli.idempotence_report(synthetic(), progress=False)})
    p = cmp.paper.set_index("model")
    assert list(p.index) == ["paper (low)", "paper (high)"]
    assert p["pct_closed"].tolist() == [3.98, 8.0]  # PAPER["frac_closed"] in percent, without binary noise
    assert PAPER["frac_closed"] == (0.0398, 0.0800)
    assert p["median_P"].tolist() == [0.336, 0.336]
    assert p["median_P_scrambled"].tolist() == [1.04e-4, 1.04e-4]
    assert p["pct_beats_scramble"].tolist() == [98.64, 98.64]
    assert p["pct_layers_trained_wins"].tolist() == [100.0, 100.0] == p["pct_layers_feasible"].tolist()
    assert p["n_mismatch_closed"].tolist() == [0, 0]
    assert p["n_heads_total"].isna().all() and p["is_paper"].all()
    assert len(comparison_table({"syn": cmp.reports["syn"]}, paper=False)) == 1


def test_one_set_of_options_for_every_model(compare_ckpts):
    rep8 = tli.idempotence_report(compare_ckpts["A"], nulls=8, progress=False)
    rep0 = tli.idempotence_report(compare_ckpts["B"], progress=False)
    with pytest.raises(OptionError, match=r"Item 'ckA' is a report made with other options: nulls=8 \(asked: 0\)"):
        tli.compare([rep8, compare_ckpts["B"]], nulls=0, progress=False)
    with pytest.raises(OptionError, match=r"different nulls \(ckA: 8, ckB: 0\).*Pass nulls="):
        tli.compare([rep8, rep0], progress=False)
    with pytest.raises(OptionError, match=r"threshold=0.9 \(asked: 0.5\).*rep\.with_threshold\(t\)"):
        tli.compare([rep0], threshold=0.5, progress=False)
    with pytest.raises(OptionError, match=r"layers=None \(asked: \[0\]\)"):
        tli.compare([rep0], layers=[0], progress=False)
    part = tli.idempotence_report(compare_ckpts["B"], layers=[1, 0], progress=False)
    assert tli.compare([part], layers=[0, 1], progress=False).options.layers == (0, 1)  # order does not matter
    # layers not given: the layers the reports share; new items are measured on them too
    one = tli.idempotence_report(compare_ckpts["B"], layers=[1], progress=False)
    inferred = tli.compare({"one": one, "new": compare_ckpts["A"]}, progress=False)
    assert list(inferred.options.layers) == [1]
    assert inferred.heads.groupby("model")["layer"].unique().map(list).to_dict() == {"new": [1], "one": [1]}
    assert inferred.table.set_index("model").loc["one", "n_heads_total"] == one.summary["n_heads"]
    with pytest.raises(OptionError, match=r"measured on different layers \(one: \[1\], all: all\)"):
        tli.compare({"one": one, "all": rep0}, progress=False)
    f32 = tli.idempotence_report(compare_ckpts["B"], compute_dtype="float32", progress=False)
    with pytest.raises(OptionError, match=r"compute_dtype='float32' \(asked: 'float64'\)"):
        tli.compare([f32], compute_dtype="float64", progress=False)
    with pytest.raises(OptionError, match=r"Item 'b' is a report made with other options: seed=3 \(asked: 0\)"):
        Comparison.from_reports({"a": rep0, "b": tli.idempotence_report(compare_ckpts["A"], seed=3, progress=False)})


def test_processed_weights_are_flagged():
    raw = tli.idempotence_report(synthetic({"raw": True, "fold_ln": False}), progress=False)
    raw2 = tli.idempotence_report(synthetic({"raw": True}, seed=7), progress=False)
    folded = tli.idempotence_report(synthetic({"raw": False, "fold_ln": True}, seed=9), progress=False)
    with pytest.warns(UserWarning, match=r"Models \['folded'\] were measured on weights processed differently"):
        cmp = tli.compare({"raw": raw, "raw2": raw2, "folded": folded}, progress=False)
    m = cmp.models_table.set_index("model")
    assert m["processing_differs"].tolist() == [False, False, True]
    assert m["raw_weights"].tolist() == [True, True, False]
    assert cmp.summary["n_processing_differs"] == 1
    from tl_idempotence.studies import compare, trajectory

    assert compare.PROCESSING_FLAGS == trajectory.PROCESSING_FLAGS  # models and trajectories compare the same flags


def test_labels_and_items(compare_ckpts, tmp_path, monkeypatch):
    shutil.copytree(compare_ckpts["A"], tmp_path / "other" / "ckA")
    with pytest.raises(OptionError, match=r"repeated labels \['ckA'\].*dict \{label: item\}"):
        tli.compare([compare_ckpts["A"], tmp_path / "other" / "ckA"], progress=False)
    with pytest.raises(OptionError, match="is a callable and has no name"):
        tli.compare([lambda: compare_ckpts["A"]], progress=False)
    cmp = tli.compare({"fn": lambda: compare_ckpts["A"], "syn": synthetic()}, progress=False)
    assert list(cmp.reports) == ["fn", "syn"]
    with pytest.raises(OptionError, match="got no items"):
        tli.compare([], progress=False)
    with pytest.raises(OptionError, match="must not be empty"):
        tli.compare({" ": compare_ckpts["A"]}, progress=False)
    with pytest.raises(TypeError, match="cannot compare a int"):
        tli.compare([5], progress=False)
    with pytest.raises(MissingFileError, match="is not an existing file or folder, nor a zoo model name"):
        tli.compare(["no/such/dir"], progress=False)
    with pytest.raises(MissingFileError, match="does not exist"):
        tli.compare([tmp_path / "nothing"], progress=False)
    with pytest.raises(UnknownModelError, match="Unknown zoo model 'nope'"):
        tli.compare(["zoo:nope"], progress=False)
    with pytest.raises(UnknownOptionError, match="did you mean 'nulls'"):
        tli.compare([compare_ckpts["A"]], nuls=8)
    with pytest.raises(TypeError, match="threshold"):
        tli.compare([compare_ckpts["A"]], threshold="0.5", progress=False)
    with pytest.raises(OptionError, match=r"threshold must be in \[0, 1\]"):
        tli.compare([compare_ckpts["A"]], threshold=1.5, progress=False)
    # a local folder named like a zoo model is never silently replaced by (or taken for) the zoo model
    monkeypatch.chdir(tmp_path)
    (tmp_path / "minilm-l6").mkdir()
    with pytest.raises(OptionError, match=r"both a zoo model name and an existing path.*'zoo:minilm-l6'"):
        resolve_items(["minilm-l6"])
    assert resolve_items(["zoo:minilm-l6"])[0].kind == "zoo"
    assert resolve_items([Path("minilm-l6")])[0].kind == "path"


def test_an_item_whose_opener_raises_is_named():
    """A callable item that raises: the error names the item (ItemError, the cause chained), not a bare
    RuntimeError from somewhere inside the comparison."""
    from helpers import SyntheticSource, gaussian_layer
    from tl_idempotence.errors import ItemError

    def opener():
        raise RuntimeError("the cluster's filesystem is not mounted")

    good = SyntheticSource([gaussian_layer(0, 4, 2, 16, 4, 0)], name="good")
    with pytest.raises(ItemError, match=r"item 'broken' \(callable .*opener\) raised RuntimeError: the cluster") as e:
        tli.compare({"good": good, "broken": opener}, progress=False)
    assert isinstance(e.value.__cause__, RuntimeError)


def test_the_overview_is_the_tables_headline_columns():
    """What a notebook shows and the CLI prints: ten columns at most, those of analyses that ran, paper rows
    included; every column stays in .table."""
    from tl_idempotence.studies.compare import OVERVIEW_COLUMNS

    cmp = tli.compare({"a": synthetic(seed=1), "b": synthetic(seed=2)}, nulls=4, progress=False)
    ov = cmp.overview
    assert list(ov.columns) == [c for c in OVERVIEW_COLUMNS if c != "pct_layers_feasible"]  # no search was run
    assert len(ov) == len(cmp.table) == 4 and ov["model"].tolist()[:2] == ["a", "b"]
    pd.testing.assert_frame_equal(ov, cmp.table[list(ov.columns)])
    html = cmp._repr_html_()
    assert "every column in <code>.table</code>" in html and "pct_beats_scramble" in html
    assert "weights_group" not in html  # the full table is not dumped into the display


def with_closed(n_closed_per_layer: int, seed: int, name: str) -> SyntheticSource:
    """2 layers x 4 MHA heads (d_model 16, d_head 4): the first ``n_closed_per_layer`` heads of each layer exact
    oblique projections (P = 1), the others Gaussian (P far below 0.9)."""
    import torch

    from tl_idempotence.core.heads import LayerHeads, kv_layout

    lhs = []
    for layer in range(2):
        g = torch.Generator().manual_seed(seed + layer)
        O = torch.randn(4, 16, 4, generator=g, dtype=torch.float64)
        V = torch.randn(4, 16, 4, generator=g, dtype=torch.float64)
        for h in range(n_closed_per_layer):
            O[h], V[h] = oblique_projection(16, 4, g)
        lhs.append(LayerHeads(layer, O, V, kv_layout(4, 4)))
    return SyntheticSource(lhs, name=name)


def test_the_headline_answers_first_which_model_has_most_closed_heads(tmp_path):
    """Two small synthetic models, 2 and 0 of 8 heads closed: cmp.headline says which has the largest share and
    which the smallest, with the counts of the table; the notebook display and the page lead with it, then the
    overview; the full table stays in .table (and folded on the page). A tie names every tied model."""
    reps = {
        "two": tli.idempotence_report(with_closed(1, 0, "two"), progress=False),
        "none": tli.idempotence_report(with_closed(0, 10, "none"), progress=False),
    }
    assert [r.summary["n_closed"] for r in reps.values()] == [2, 0]
    cmp = Comparison.from_reports(reps)
    head = cmp.headline
    t = cmp.models_table.set_index("model")
    assert head.most_closed == (ModelCount("two", 2, 8, 25.0),) and head.fewest_closed == (
        ModelCount("none", 0, 8, 0.0),
    )
    assert (t.loc["two", "n_closed"], t.loc["two", "n_heads_total"], t.loc["two", "pct_closed"]) == (2, 8, 25.0)
    assert head.n_models == 2 and head.threshold == 0.9 and head.paper_pct_closed == (3.98, 8.0)
    sentence = (
        "two (2 of 8, 25.00 %) has the largest share of closed heads (P ≥ 0.9); none (0 of 8, 0.00 %) the smallest "
        "(the paper, at P ≥ 0.9: 3.98–8.00 % per model)."
    )
    assert str(head) == head.sentence == sentence
    assert cmp.summary["most_closed"] == "two"
    assert repr(cmp).startswith("Comparison(n_models=2, threshold=0.9, most_closed='two', max_pct_closed=25,")
    # the notebook display: the sentence, then the overview (10 columns at most), the full table not dumped
    html = cmp._repr_html_()
    assert html.index(sentence) < html.index("<details open><summary>models (") < html.index("<summary>summary")
    assert f"models ({len(cmp.overview.columns)} of {len(TABLE_COLUMNS)} columns" in html
    assert len(cmp.overview.columns) <= 10 < len(cmp.table.columns) == len(TABLE_COLUMNS)
    assert "weights_group" not in html and "<script" not in html
    # the page: the answer first, the overview, then every column folded
    page = Path(cmp.save_html(tmp_path / "cmp.html")).read_text(encoding="utf-8")
    assert page.index(sentence) < page.index("2 models measured with the same options") < page.index("weights_group")
    assert page.index('<details id="full-table">') < page.index("weights_group")
    assert f"Every column ({len(TABLE_COLUMNS)}, <code>Comparison.table</code>)" in page
    # a tie for the largest share names both; every model equal says so; one model states its count
    tie = Comparison.from_reports({**reps, "two-b": tli.idempotence_report(with_closed(1, 20, "b"), progress=False)})
    assert [c.model for c in tie.headline.most_closed] == ["two", "two-b"]
    assert str(tie.headline).startswith(
        "two (2 of 8, 25.00 %) and two-b (2 of 8, 25.00 %) have the largest share of closed heads (P ≥ 0.9); none "
    )
    same = Comparison.from_reports(
        {"a": reps["none"], "b": tli.idempotence_report(with_closed(0, 30, "b"), progress=False)}
    )
    assert str(same.headline).startswith(
        "Every model has the same share of closed heads (P ≥ 0.9): a (0 of 8, 0.00 %) and b (0 of 8, 0.00 %)"
    )
    assert same.headline.fewest_closed == ()
    one = Comparison.from_reports({"two": reps["two"]})
    assert str(one.headline) == (
        "two: 2 of 8 heads are closed (P ≥ 0.9), 25.00 % (the paper, at P ≥ 0.9: 3.98–8.00 % per model)."
    )


def test_a_saved_comparison_is_rebuilt_from_its_reports(tmp_path):
    """A saved comparison holds its reports: read back, it is rebuilt from them with the saved options, and a table
    or a report that is not what was saved (its sha256 and the record's digest recomputed) is refused naming the file
    (the contract test, tests/unit/test_result_contract.py, edits every field of the record)."""
    cmp = tli.compare({"a": synthetic(seed=3), "b": synthetic(seed=5)}, progress=False)
    d = Path(cmp.save(tmp_path / "c"))
    back = tli.load_comparison(d)
    assert list(back.reports) == ["a", "b"] and back.options == cmp.options and back.summary == cmp.summary
    pd.testing.assert_frame_equal(back.table, cmp.table, check_exact=True)
    pd.testing.assert_frame_equal(back.heads, cmp.heads, check_exact=True)
    e = tmp_path / "edited_table"
    shutil.copytree(d, e)
    rewrite_saved(e, "comparison.json", "table", lambda t: t.assign(median_P=t["median_P"] * 1.001))
    with pytest.raises(ReportFileError, match=re.escape(str(e / "table.parquet"))):
        tli.load_comparison(e)
    swapped = tmp_path / "swapped"  # a's report under b's label and b's under a's: every row is another model's
    shutil.copytree(d, swapped)
    for a, b in (("report_0", "tmp"), ("report_1", "report_0"), ("tmp", "report_1")):
        (swapped / a).rename(swapped / b)
    with pytest.raises(ReportFileError, match=re.escape(str(swapped / "table.parquet"))):
        tli.load_comparison(swapped)
    other = tmp_path / "other_options"  # b's report replaced by one made with nulls
    shutil.copytree(d, other)
    shutil.rmtree(other / "report_1")
    tli.idempotence_report(synthetic(seed=5), nulls=2, progress=False).save(other / "report_1")
    with pytest.raises(ReportFileError, match=re.escape(str(other / "comparison.json")) + ".*nulls"):
        tli.load_comparison(other)
    with pytest.raises(OptionError, match="not empty"):
        cmp.save(d)
