"""The constructive search's analysis contract and determinism on a tiny model (the contract test checks every analysis
in the unit tier: tests/unit/analyses/test_contract.py).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import tl_idempotence as tli
from helpers import gaussian_layer
from tl_idempotence.analyses import search
from tl_idempotence.analyses.base import LayerContext
from tl_idempotence.analyses.search import SearchAnalysis
from tl_idempotence.core.closure import closure_from_grams, layer_grams
from tl_idempotence.core.options import ReportOptions


def test_search_analysis_contract_and_determinism():
    """The report's per-layer search (default budget, ``DEFAULTS``) is the public search with that budget."""
    lh = gaussian_layer(3, 9, 3, 40, 8, seed=4)
    c = closure_from_grams(layer_grams(lh.O, lh.V, lh.kv_head_of))
    opts = ReportOptions(search=True, seed=2, threshold=0.9)
    a = SearchAnalysis().run(LayerContext.build(lh, opts))
    b = SearchAnalysis().run(LayerContext.build(lh, opts))
    assert list(a.columns) == [
        "P_searched",
        "search_iters",
        "search_stopped_on",
        "search_best_restart",
        "search_reason",
    ]
    assert all(len(v) == 9 for v in a.columns.values())
    df, row = pd.DataFrame(a.columns), a.values
    pd.testing.assert_frame_equal(df, pd.DataFrame(b.columns))
    assert row == b.values and a.notes == {} and a.tables == {}
    assert row["feasible_P"] == pytest.approx(df["P_searched"].max())
    assert row["feasible"] == (row["feasible_P"] >= 0.9)
    assert row["feasible_head"] == int(df["P_searched"].idxmax())
    assert row["n_heads_feasible"] == int((df["P_searched"] >= 0.9).sum())
    assert row["n_search_budget_stops"] == int((df["search_stopped_on"] == "budget").sum())
    assert (df["search_iters"] <= search.DEFAULTS["max_iters"]).all() and (df["search_reason"] == "").all()
    assert (df["P_searched"].to_numpy() >= c.P.numpy() - 1e-6).all()
    pub = tli.constructive_search(lh, seed=2)  # default budget = DEFAULTS, same (seed, layer) stream
    assert np.allclose(pub.table["P_searched"], df["P_searched"], rtol=0, atol=1e-12)
    assert np.array_equal(pub.table["search_iters"], df["search_iters"])
