"""The constructive search's analysis contract and determinism on a tiny model (the contract test checks every analysis
in the unit tier: tests/unit/analyses/test_contract.py).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

import tl_idempotence as tli
from helpers import (
    dense_check,
    gaussian_layer,
    haar_head,
    pair,
    stack_heads,
)
from tl_idempotence.analyses import search
from tl_idempotence.analyses.base import LayerContext
from tl_idempotence.analyses.report_options import ReportOptions
from tl_idempotence.analyses.search import SearchAnalysis
from tl_idempotence.maths.closure import closure_from_grams, layer_grams


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


F64 = torch.float64


@pytest.mark.parametrize(
    "case",
    ["equal_spans_flat_spectrum", "s_times_cos_constant"],
)
def test_search_reaches_attainable_closure(case):
    """S and D that admit K D K = α K: (a) D = 1 (span O = span V) and S flat: K orthogonal up to
    scale, KDK = K² = αK at R1 = R2; (b) s_i cos_i = c: K = diag(S) in principal coordinates gives
    KDK = c K. A Haar-random orientation of each is far from closed; the search must find P >= 0.999."""
    r, d = 16, 48
    if case == "equal_spans_flat_spectrum":
        S, cos = torch.full((r,), 2.0, dtype=F64), torch.ones(r, dtype=F64)
    else:
        cos = torch.linspace(1.0, 0.3, r, dtype=F64)
        S = 1.0 / cos
    O, V = stack_heads([haar_head(S, cos, d, seed) for seed in range(3)])
    res = tli.constructive_search(pair(O, V), restarts=2, max_iters=1500, seed=0)
    t = res.table
    assert (t["P"] < 0.5).all()  # the starting (trained) orientations are far from closed
    assert (t["P_searched"] >= 0.999).all(), t
    for i in range(3):
        Pd = dense_check(O[i], V[i], res.K[i])
        assert t.loc[i, "P_searched"] <= Pd + 1e-12 and abs(t.loc[i, "P_searched"] - Pd) < 1e-10
        assert torch.allclose(torch.linalg.svdvals(res.K[i]), S.sort(descending=True).values, atol=1e-10)  # S kept
    assert torch.allclose(res.D, cos.expand(3, r), atol=1e-10)  # D kept
