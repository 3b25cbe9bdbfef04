"""The shared-value algebra of the real SmolLM2-135M (slow: many draws on a real model); the algebra's unit tests are
tests/unit/analyses/test_algebra.py.
"""

from __future__ import annotations

import numpy as np
import pytest

import tl_idempotence as tli


@pytest.mark.slow
def test_smollm2_algebra(smollm2):
    """Real SmolLM2-135M (raw weights): 30 layers x 3 kv groups of 3 query heads."""
    rep = tli.idempotence_report(smollm2, algebra=True, progress=False)
    alg = rep.algebra
    assert len(alg.groups) == 90 and len(alg.pairs) == 810
    diag = alg.pairs[alg.pairs["diagonal"]].merge(rep.heads, left_on=["layer", "i"], right_on=["layer", "head"])
    assert np.array_equal(diag["P_ij"].to_numpy(), diag["P"].to_numpy())
    assert not alg.pairs["P_ij"].isna().any()
    closed = alg.heads[alg.heads["closed"]]
    assert len(closed) == int(rep.heads["closed"].sum()) == 13
    # Measured (raw weights): closed heads follow the right-action law closely: alpha_ij spread
    # over i <= 0.15 and law_P >= 0.88; across all groups the median off-diagonal P_ij is ~0.15.
    assert (closed["alpha_spread"] < 0.2).all()
    assert (closed["law_P"] > 0.85).all()
    s = alg.summary
    assert 0.1 < s["median_P_offdiag"] < 0.25
    # Closed heads sharing a kv group have distinct ranges (smallest principal angle ~19-27 degrees).
    assert len(alg.closed_ranges) == 4
    assert (alg.closed_ranges["min_angle_deg"] > 10).all()
