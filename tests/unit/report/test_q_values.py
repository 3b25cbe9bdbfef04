"""Benjamini-Hochberg q-values across every measured head (``rep.heads["q_value"]``, SPEC 11).

Replays: a report with scramble p-values (``nulls=``) gets ``q_value`` equal to a BH written here from its
definition (``q_(i) = min_{k >= i} min(1, m p_(k) / k)``), on a fixed p array and on a small report of
synthetic layers (closed heads with the smallest p, a zero head whose p is NaN); NaN p-values are outside the
family (their q is NaN and their ``scramble_reason`` says why); the summary counts the heads with q <= 0.05;
the column survives ``with_threshold``, ``save``/``load_report`` (real files in tmp_path), and the page's
closed-heads table shows q next to p.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import tl_idempotence as tli
from helpers import closed_pairs_layers
from tl_idempotence.analyses.scramble import bh_q_values
from tl_idempotence.core.paper import FDR_LEVEL
from tl_idempotence.report.report import add_q_values
from tl_idempotence.views.page import closed_heads_table, report_html

pytestmark = pytest.mark.bridge  # no HookedTransformer needed (its tests skip on 4.x): runs on both majors


def bh_by_definition(p: np.ndarray) -> np.ndarray:
    """BH from its definition, NaN p-values outside the family (loops, no library)."""
    p = np.asarray(p, dtype=float)
    q = np.full(len(p), np.nan)
    idx = [i for i in range(len(p)) if np.isfinite(p[i])]
    m = len(idx)
    order = sorted(idx, key=lambda i: p[i])
    for rank, i in enumerate(order, start=1):
        q[i] = min(min(1.0, m * p[order[k - 1]] / k) for k in range(rank, m + 1))
    return q


P_FIXED = np.array([0.001, 0.008, 0.039, 0.041, 0.042, 0.06, 0.074, 0.205, 0.212, 0.216, 0.222, 0.251, 0.269, 0.275,
                    0.34, 0.341, 0.384, 0.569, 0.594, 0.696, 0.762, 0.94, 0.942, 0.975, 0.986, 1.0])  # fmt: skip


def test_bh_matches_definition_on_a_fixed_array():
    q = bh_q_values(P_FIXED)
    np.testing.assert_allclose(q, bh_by_definition(P_FIXED), rtol=1e-12, atol=0)
    assert q[0] == pytest.approx(0.026) and q[1] == pytest.approx(0.104)  # 26 * 0.001 / 1, 26 * 0.008 / 2
    assert (q >= P_FIXED).all() and (q <= 1).all()
    rng = np.random.default_rng(0)
    p = rng.uniform(size=200) ** 3
    np.testing.assert_allclose(bh_q_values(p), bh_by_definition(p), rtol=1e-12, atol=0)


def test_nan_p_values_are_outside_the_family():
    p = P_FIXED.copy()
    p[[3, 10]] = np.nan
    q = bh_q_values(p)
    assert np.isnan(q[[3, 10]]).all() and np.isfinite(np.delete(q, [3, 10])).all()
    np.testing.assert_allclose(np.delete(q, [3, 10]), bh_q_values(np.delete(p, [3, 10])), rtol=0, atol=0)
    np.testing.assert_allclose(q, bh_by_definition(p), rtol=1e-12, atol=0)  # m = 24, not 26
    assert np.isnan(bh_q_values([np.nan, np.nan])).all() and bh_q_values([]).shape == (0,)


@pytest.fixture(scope="module")
def rep():
    return tli.idempotence_report(closed_pairs_layers(alpha=(1.0, 1.0), zero_l1h5=True), nulls=99, progress=False)


def test_report_q_values_are_bh_of_its_p_values(rep, tmp_path):
    h = rep.heads
    assert list(h.columns).index("q_value") == list(h.columns).index("p_value") + 1
    np.testing.assert_allclose(h["q_value"], bh_by_definition(h["p_value"].to_numpy()), rtol=1e-12, atol=0)
    # the zero head: NaN p, NaN q, a reason
    z = h.loc["L1H5"]
    assert np.isnan(z["p_value"]) and np.isnan(z["q_value"]) and z["scramble_reason"]
    assert h["q_value"].notna().sum() == 11
    # the four projections have p = 1/100 and, 11 heads in the family, q <= 11 * 0.01 / 4
    for lab in ("L0H0", "L0H1", "L1H0", "L1H1"):
        assert h.loc[lab, "p_value"] == pytest.approx(0.01) and h.loc[lab, "q_value"] <= 11 * 0.01 / 4 + 1e-15
    n = int((bh_by_definition(h["p_value"].to_numpy()) <= FDR_LEVEL).sum())
    assert rep.summary["n_heads_q05"] == n and n >= 4
    # another threshold: q does not depend on it
    r2 = rep.with_threshold(0.5)
    assert r2.heads["q_value"].to_numpy().tobytes() == h["q_value"].to_numpy().tobytes()
    assert r2.summary["n_heads_q05"] == n
    # saved and loaded: the same column, bit for bit
    back = tli.load_report(rep.save(tmp_path / "rep"))
    assert back.heads["q_value"].to_numpy().tobytes() == h["q_value"].to_numpy().tobytes()
    assert back.summary["n_heads_q05"] == n
    # a table saved before q-values (no q_value column) gets it derived on load's path
    old = h.drop(columns="q_value")
    again = add_q_values(old)
    assert again["q_value"].to_numpy().tobytes() == h["q_value"].to_numpy().tobytes()
    assert add_q_values(old.drop(columns="p_value")).columns.tolist() == old.drop(columns="p_value").columns.tolist()


def test_page_shows_q_next_to_p(rep):
    t = closed_heads_table(rep)
    cols = list(t.columns)
    assert cols.index("BH q-value") == cols.index("scramble p-value") + 1
    for lab, q in zip(t["head"], t["BH q-value"]):
        assert q == f"{rep.heads.loc[lab, 'q_value']:.3g}"
    html = report_html(rep)
    assert "BH q-value" in html and f"{rep.summary['n_heads_q05']} heads have q ≤ 0.05" in html


def test_no_p_values_no_q_column():
    r = tli.idempotence_report(closed_pairs_layers(alpha=(1.0, 1.0), zero_l1h5=True), progress=False)
    assert "q_value" not in r.heads.columns and "n_heads_q05" not in r.summary
    assert "BH q-value" not in closed_heads_table(r).columns
    assert isinstance(r.heads, pd.DataFrame)
