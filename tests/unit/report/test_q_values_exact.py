"""BH q-values on inputs tests/report/test_q_values.py leaves out (the mutation target ``q_values`` runs these):
any array shape comes back as ``[n]``, a column of object dtype (a JSON column with nulls) has its nulls
outside the family, and a table that already holds a (stale) ``q_value`` gets it recomputed in place.

Expected values by the BH formula written here (``q_(i) = min_{k >= i} min(1, m p_(k) / k)``).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from tl_idempotence.analyses.scramble import bh_q_values
from tl_idempotence.report.report import add_q_values

NAN = math.nan


def test_any_shape_comes_back_flat():
    q = bh_q_values(np.array([[0.01, 0.04], [0.03, 0.2]]))
    # m = 4, sorted 0.01, 0.03, 0.04, 0.2: 4·0.01/1 = 0.04, min(4·0.03/2, 4·0.04/3) = 0.0533.., 0.0533.., 0.2
    np.testing.assert_allclose(q, [0.04, 4 * 0.04 / 3, 4 * 0.04 / 3, 0.2], rtol=1e-15, atol=0)
    assert q.shape == (4,) and q.dtype == np.float64
    one = bh_q_values(0.3)
    assert one.shape == (1,) and one[0] == 0.3


def test_a_column_of_object_dtype_with_nulls():
    col = pd.Series([0.02, None, 0.01, "0.5"], dtype=object)  # a JSON column: numbers, a null, a number as text
    q = bh_q_values(col)
    assert q.dtype == np.float64 and np.isnan(q[1])
    np.testing.assert_allclose(q[[0, 2, 3]], [0.03, 0.03, 0.5], rtol=1e-15, atol=0)  # m = 3


def test_a_stale_q_column_is_recomputed_in_place():
    heads = pd.DataFrame({"layer": [0, 0, 1], "p_value": [0.01, 0.5, NAN], "q_value": [0.0, 0.0, 0.0], "P": 1.0})
    out = add_q_values(heads)
    assert list(out.columns) == ["layer", "p_value", "q_value", "P"]
    np.testing.assert_array_equal(out["q_value"], [0.02, 0.5, NAN])  # m = 2
    assert heads["q_value"].tolist() == [0.0, 0.0, 0.0]  # the table given is not changed
    moved = heads[["q_value", "layer", "p_value", "P"]]  # a q column elsewhere: moved right after p
    assert list(add_q_values(moved).columns) == ["layer", "p_value", "q_value", "P"]
    no_p = heads.drop(columns=["p_value", "q_value"])  # no scramble p-values: the table as it is
    assert add_q_values(no_p) is no_p


def test_a_table_saved_before_q_values_gets_them():
    heads = pd.DataFrame({"layer": [0, 1], "p_value": [0.04, 0.01], "P": [0.5, 0.95]})  # no q_value column yet
    out = add_q_values(heads)
    assert list(out.columns) == ["layer", "p_value", "q_value", "P"]
    np.testing.assert_allclose(out["q_value"], [0.04, 0.02], rtol=1e-15, atol=0)  # m = 2: 2·0.01/1, 2·0.04/2
