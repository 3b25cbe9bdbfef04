"""The per-layer contract, checked for every report analysis (analyses/base.py):

one row per query head in head order; deterministic for (seed, layer); independent of which other
layers ran; every NaN it writes has a reason (per head in its reason column or the closure's reason,
per layer in LayerResult.notes).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

import tl_idempotence as tli
from helpers import SyntheticSource, gaussian_layer
from tl_idempotence.analyses.base import LayerContext, LayerResult
from tl_idempotence.analyses.registry import report_analyses
from tl_idempotence.analyses.report_options import ReportOptions
from tl_idempotence.analyses.scramble import bh_q_values
from tl_idempotence.core.heads import LayerHeads
from tl_idempotence.report.report import REPORT_LEVEL_COLUMNS

OPTIONS = ReportOptions(nulls=8, seed=3, search=True, algebra=True)
REPORT_ANALYSES = report_analyses()
ANALYSES = {a.name: a for a in REPORT_ANALYSES}


# the search's code path with a small budget: what this contract checks holds at any budget (shared_fixtures.py)
pytestmark = pytest.mark.usefixtures("small_search_budget")


def degenerate_layer(layer: int = 1) -> LayerHeads:
    """6 query heads on 2 kv heads: head 0 zero, head 1 with span(O) ⟂ span(V) (nilpotent), head 4 exactly
    idempotent (T = projection), the rest Gaussian."""
    lh = gaussian_layer(layer, 6, 2, 24, 4, seed=11)
    g = torch.Generator().manual_seed(5)
    O = lh.O.clone()
    O[0] = 0.0
    Q, _ = torch.linalg.qr(torch.cat([lh.V[0], torch.randn(24, 4, generator=g, dtype=torch.float64)], 1))
    O[1] = Q[:, 4:] @ torch.randn(4, 4, generator=g, dtype=torch.float64)  # range ⟂ span(V_0): T² = 0
    A = torch.randn(24, 4, generator=g, dtype=torch.float64)
    O[4] = A @ torch.linalg.inv(lh.V[1].T @ A)  # T = A (Vᵀ A)⁻¹ Vᵀ, an oblique projection
    return LayerHeads(layer, O, lh.V, lh.kv_head_of)


def run(name: str, lh: LayerHeads, options: ReportOptions = OPTIONS) -> LayerResult:
    return ANALYSES[name].run(LayerContext.build(lh, options))


def test_every_report_analysis_is_checked_here():
    assert [a.name for a in REPORT_ANALYSES] == ["closure", "scramble", "mismatch", "search", "algebra"]
    assert REPORT_ANALYSES[0].name == "closure"  # its columns come first in the report


@pytest.mark.parametrize("name", list(ANALYSES))
def test_one_row_per_head_in_order(name):
    lh = degenerate_layer()
    res = run(name, lh)
    for col, v in res.columns.items():
        assert len(v) == lh.n_heads, col
    for tname, t in res.tables.items():
        assert (t["layer"] == lh.layer).all(), tname
    if name == "closure":
        c = tli.closure(lh, factors=False)
        np.testing.assert_array_equal(res.columns["P"], c.P.numpy())  # head order = LayerHeads order
    if name == "scramble":
        d = res.tables["scramble_draws"]
        assert list(d["head"].unique()) == list(range(lh.n_heads))


@pytest.mark.parametrize("name", list(ANALYSES))
def test_deterministic_for_seed_and_layer(name):
    a, b = run(name, degenerate_layer()), run(name, degenerate_layer())
    for col in a.columns:
        np.testing.assert_array_equal(np.asarray(a.columns[col]), np.asarray(b.columns[col]))
    assert a.values.keys() == b.values.keys()
    for k in a.values:
        assert a.values[k] == b.values[k] or (a.values[k] != a.values[k] and b.values[k] != b.values[k]), k
    for t in a.tables:
        pd.testing.assert_frame_equal(a.tables[t], b.tables[t])
    if name in ("scramble", "search"):  # another seed, or another layer index, gives other draws
        other = run(name, degenerate_layer(), ReportOptions(nulls=8, seed=4, search=True, algebra=True))
        moved = run(name, degenerate_layer(layer=2))
        col = "P_scrambled_median" if name == "scramble" else "search_best_restart"
        key = "scramble_draws" if name == "scramble" else None
        if key:
            assert not a.tables[key]["P"].equals(other.tables[key]["P"])
            assert not a.tables[key]["P"].equals(moved.tables[key]["P"])
        else:
            assert np.isfinite(np.asarray(other.columns["P_searched"], dtype=float)).sum() > 0
        assert col in a.columns


@pytest.mark.parametrize("name", list(ANALYSES))
def test_independent_of_which_other_layers_ran(name):
    lhs = [gaussian_layer(0, 6, 2, 24, 4, seed=1), degenerate_layer(1), gaussian_layer(2, 6, 2, 24, 4, seed=2)]
    src = SyntheticSource(lhs)
    kw = {"nulls": 8, "seed": 3, "search": name == "search", "algebra": name == "algebra", "progress": False}
    full = tli.idempotence_report(src, **kw)
    alone = tli.idempotence_report(src, layers=[1], **kw)
    # q_value is BH across the measured heads (the family), so it depends on them by definition; each report's is
    # BH of its own p-values
    for r in (full, alone):
        np.testing.assert_array_equal(r.heads["q_value"].to_numpy(), bh_q_values(r.heads["p_value"]))
    per_layer = [c for c in alone.heads.columns if c not in REPORT_LEVEL_COLUMNS]
    assert per_layer == [c for c in full.heads.columns if c not in REPORT_LEVEL_COLUMNS]
    pd.testing.assert_frame_equal(full.heads.loc[full.heads["layer"] == 1, per_layer], alone.heads[per_layer])
    pd.testing.assert_frame_equal(full.layers[full.layers["layer"] == 1].reset_index(drop=True), alone.layers)
    for t, df in alone.tables.items():
        pd.testing.assert_frame_equal(full.tables[t][full.tables[t]["layer"] == 1].reset_index(drop=True), df)


@pytest.mark.parametrize("name", list(ANALYSES))
def test_every_nan_has_a_reason(name):
    lh = degenerate_layer()
    closure = run("closure", lh)
    res = run(name, lh)
    reason_col = ANALYSES[name].reason_column
    reasons = np.asarray(res.columns.get(reason_col, closure.columns["reason"]), dtype=str)
    base = np.asarray(closure.columns["reason"], dtype=str)
    n_nan = 0
    for col, v in res.columns.items():
        arr = np.asarray(v)
        if arr.dtype.kind != "f":
            continue
        for i in np.nonzero(np.isnan(arr))[0]:
            n_nan += 1
            assert reasons[i] or base[i], f"{name}: {col}[{i}] is NaN without a reason"
    for k, v in res.values.items():
        if isinstance(v, float) and np.isnan(v):
            assert res.notes.get(k), f"{name}: layer value {k} is NaN without a note"
    for tname, t in res.tables.items():
        if "reason" in t.columns:
            for col in t.columns:
                if t[col].dtype.kind == "f":
                    bad = t[np.isnan(t[col].to_numpy()) & (t["reason"].astype(str) == "")]
                    if tname != "scramble_draws":
                        assert bad.empty, f"{name}: {tname}.{col} NaN without a reason:\n{bad}"
    if name in ("closure", "scramble", "search"):
        assert n_nan >= 2  # the zero and the nilpotent head: the check above did run


def test_degenerate_layer_is_what_it_says():
    c = tli.closure(degenerate_layer(), factors=False)
    assert "zero head" in c.reason[0] and "nilpotent" in c.reason[1]
    assert float(c.P[4]) == pytest.approx(1.0, abs=1e-10) and float(c.alpha[4]) == pytest.approx(1.0, abs=1e-8)


def _frame_equal(a: pd.DataFrame, b: pd.DataFrame, what: str) -> None:
    a, b = a.reset_index(drop=True), b.reset_index(drop=True)
    assert list(a.columns) == list(b.columns), what
    for c in a.columns:
        x, y = a[c].to_numpy(), b[c].to_numpy()
        if x.dtype.kind == "f" or y.dtype.kind == "f":
            assert np.array_equal(x.astype(float), y.astype(float), equal_nan=True), f"{what}: {c}"
        else:
            assert [str(v) for v in x] == [str(v) for v in y], f"{what}: {c}"


def test_threshold_outputs_are_declared_rules_not_a_method_of_the_analysis():
    """The threshold-dependent outputs are derived on read from the analyses' declared rules
    (analyses/threshold.py), by one function; the Analysis protocol has no apply_threshold."""
    from tl_idempotence.analyses.base import Analysis
    from tl_idempotence.analyses.registry import spec_of

    assert "apply_threshold" not in Analysis.__dict__
    for a in REPORT_ANALYSES:
        assert isinstance(a, Analysis) and not hasattr(a, "apply_threshold"), a.name
    assert {a.name for a in REPORT_ANALYSES if spec_of(a.name).threshold_rules} == set(ANALYSES)


@pytest.mark.parametrize("name", list(ANALYSES))
@pytest.mark.parametrize("t_new", [0.0, 0.5, 1.0])
def test_derived_at_a_threshold_equals_a_run_at_that_threshold(name, t_new):
    """Re-deriving the threshold-dependent results of a run at 0.9 gives what a run at ``t_new`` gives
    (every column, layer value and table; the algebra's closed_ranges too, re-derived from every pair's
    angles in algebra_ranges, and the layer value algebra_ranges_threshold that says where closed_ranges is).
    By the declared rules and one function (derive_at_threshold), which never changes its inputs."""
    from tl_idempotence.analyses.registry import spec_of
    from tl_idempotence.analyses.threshold import derive_at_threshold

    lh = degenerate_layer()
    old = run(name, lh)
    new = run(name, lh, ReportOptions(nulls=8, seed=3, search=True, algebra=True, threshold=t_new))
    heads0 = pd.DataFrame({"layer": lh.layer, "head": np.arange(lh.n_heads), **old.columns})
    layers0 = pd.DataFrame([{"layer": lh.layer, **old.values}])
    tables0 = {k: v.copy() for k, v in old.tables.items()}
    kept = (heads0.copy(), layers0.copy(), {k: v.copy() for k, v in tables0.items()})
    heads, layers, tables = derive_at_threshold(heads0, layers0, tables0, spec_of(name).threshold_rules, t_new)
    _frame_equal(heads0, kept[0], "heads input")  # the inputs are not changed
    _frame_equal(layers0, kept[1], "layers input")
    assert set(tables0) == set(kept[2])
    for k in tables0:
        _frame_equal(tables0[k], kept[2][k], f"{k} input")
    _frame_equal(heads, pd.DataFrame({"layer": lh.layer, "head": np.arange(lh.n_heads), **new.columns}), "heads")
    if "algebra_ranges_threshold" in old.values:
        assert old.values["algebra_ranges_threshold"] == 0.9 and new.values["algebra_ranges_threshold"] == t_new
    _frame_equal(layers, pd.DataFrame([{"layer": lh.layer, **new.values}]), "layers")
    assert set(tables) == set(new.tables)
    for k in tables:
        _frame_equal(tables[k], new.tables[k], k)
    if name == "algebra" and t_new == 0.0:  # pairs closed at 0.0 only, with their angles: the check can fail
        assert len(tables["algebra_closed_ranges"]) > len(old.tables["algebra_closed_ranges"])
