"""The scramble's per-head summary of its draws (SPEC 4b) on a hand-made draw table, every value written here
from its definition (the mutation target ``scramble_summary`` runs these, its fastest killing tests):
the median and 95 % quantile of the defined draws, ``p = (1 + #{P~ >= P}) / (n + 1)`` over the defined draws
(ties count against the head; the floor ``1/(n + 1)``), ``beats_scramble`` as ``P > median`` (False when
undefined), the number of defined draws, and the fraction of defined draws at or above a threshold.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch

from tl_idempotence.analyses.scramble import _summarize_draws
from tl_idempotence.analyses.scramble_spec import FRAC_SCRAMBLED_CLOSED

NAN = math.nan
#                    trained P, its draws (NaN: an undefined draw)
ROWS = [
    (0.5, [0.1, 0.5, 0.7, NAN, 0.3]),  # 4 defined; 0.5 and 0.7 reach 0.5 (a tie counts)
    (NAN, [0.2, NAN, 0.4, 0.6, NAN]),  # the head's own P undefined: no p, never beats
    (0.3, [NAN, NAN, NAN, NAN, NAN]),  # no defined draw: no p, no median
    (0.2, [0.2, 0.2, 0.2, 0.2, 0.2]),  # all ties: p = 1; not above its median
    (0.99, [0.05, 0.1, 0.15, 0.2, 0.25]),  # above every draw: the floor 1/6
    (0.0, [0.0, 0.3, NAN, NAN, NAN]),  # P = 0 with a tie at 0
    (0.4, [NAN, NAN, 0.6, NAN, NAN]),  # one defined draw: p = 2/2, its fraction 0 or 1
]


def by_hand():
    med, q95, p, beats, n = [], [], [], [], []
    for P, draws in ROWS:
        d = sorted(x for x in draws if not math.isnan(x))
        n.append(len(d))
        if d:
            m = (d[(len(d) - 1) // 2] + d[len(d) // 2]) / 2
            pos = (len(d) - 1) * 0.95
            lo = math.floor(pos)
            q = d[lo] + (pos - lo) * (d[min(lo + 1, len(d) - 1)] - d[lo])
        else:
            m = q = NAN
        med.append(m)
        q95.append(q)
        defined = not math.isnan(P) and len(d) > 0
        p.append((1 + sum(x >= P for x in d)) / (len(d) + 1) if defined else NAN)
        beats.append(defined and not math.isnan(m) and P > m)
    return med, q95, p, beats, n


def test_summary_equals_the_definitions():
    P = torch.tensor([r[0] for r in ROWS], dtype=torch.float64)
    Pd = torch.tensor([r[1] for r in ROWS], dtype=torch.float64)
    out = _summarize_draws(P, Pd)
    med, q95, p, beats, n = by_hand()
    assert list(out) == ["P_scrambled_median", "P_scrambled_q95", "p_value", "beats_scramble", "n_scramble_draws"]
    np.testing.assert_allclose(out["P_scrambled_median"], med, rtol=1e-15, atol=0)
    np.testing.assert_allclose(out["P_scrambled_q95"], q95, rtol=1e-14, atol=1e-16)
    np.testing.assert_array_equal(out["p_value"], p)
    assert out["beats_scramble"].tolist() == beats == [True, False, False, False, True, False, False]
    assert out["n_scramble_draws"].tolist() == n == [4, 3, 0, 5, 5, 2, 1]
    assert out["n_scramble_draws"].dtype == np.int64
    # the values themselves, for a reader
    assert out["p_value"][0] == 3 / 5 and out["p_value"][3] == 1.0 and out["p_value"][4] == 1 / 6
    assert out["p_value"][5] == 1.0 and out["P_scrambled_median"][0] == pytest.approx(0.4, abs=1e-15)
    assert out["P_scrambled_q95"][0] == pytest.approx(0.5 + 0.85 * 0.2, abs=1e-15)
    assert np.isnan(out["p_value"][[1, 2]]).all() and np.isnan(out["P_scrambled_median"][2])


def test_a_head_whose_median_is_undefined_never_beats_it():
    # the trained P is defined, every draw undefined: the median is NaN and P > NaN must not count as beating
    out = _summarize_draws(torch.tensor([0.7]), torch.tensor([[NAN, NAN]]))
    assert out["beats_scramble"].tolist() == [False] and np.isnan(out["p_value"][0])
    assert out["n_scramble_draws"].tolist() == [0]


def _frac_closed(Pd: np.ndarray, threshold: float) -> np.ndarray:
    """The scramble's declared rule (FRAC_SCRAMBLED_CLOSED) on the long table of ``[heads, draws]`` draws."""
    b, n = Pd.shape
    draws = pd.DataFrame({"layer": 3, "head": np.repeat(np.arange(b), n), "draw": np.tile(np.arange(n), b)})
    draws["P"] = Pd.reshape(-1)
    return FRAC_SCRAMBLED_CLOSED.fractions(draws, np.full(b, 3), np.arange(b), threshold)


def test_fraction_of_draws_at_or_above_the_threshold():
    Pd = np.array([r[1] for r in ROWS])
    got = _frac_closed(Pd, 0.2)
    want = [3 / 4, 1.0, NAN, 1.0, 2 / 5, 1 / 2, 1.0]  # >= 0.2 among the defined draws
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(_frac_closed(Pd, 0.7), [1 / 4, 0.0, NAN, 0.0, 0.0, 0.0, 0.0])
    assert got.dtype == np.float64
