"""maths/projection_facts.py: each head's asymmetry and distance from the nearest orthogonal projection (SPEC 12-13),
from d_head-sized products, against dense float64 (T formed here only).

An orthogonal projection (times a negative α) scores 0 on both; an oblique one does not; on random GQA heads every
column equals the dense computation (``‖T - Tᵀ‖/‖T‖``; the Ky Fan optimum from ``numpy.linalg.eigh`` of
``sym(T/α)``), the projection it names is at that distance, and no random orthogonal projection of the same rank is
nearer; a rank-deficient T gets its own rank.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from helpers import oblique_projection
from tl_idempotence.core.heads import LayerHeads
from tl_idempotence.errors import OptionError
from tl_idempotence.maths.projection_facts import PROJECTION_FACT_COLUMNS, projection_facts

D, R = 24, 5


def dense_facts(O, V):
    T = O @ V.T
    a = np.sum((T @ T) * T) / np.sum(T * T)
    A = T / a
    lam, E = np.linalg.eigh((A + A.T) / 2)
    lam, E = lam[::-1], E[:, ::-1]
    k = np.linalg.matrix_rank(T)
    P = E[:, :k] @ E[:, :k].T
    any_k = int((lam > 0.5).sum())
    P_any = E[:, :any_k] @ E[:, :any_k].T
    nA = np.linalg.norm(A)
    return {
        "alpha": a, "asymmetry": np.linalg.norm(T - T.T) / np.linalg.norm(T), "proj_rank": k,
        "proj_distance": np.linalg.norm(A - P) / nA, "proj_rank_any": any_k,
        "proj_distance_any": np.linalg.norm(A - P_any) / nA,
        "A": A,
    }  # fmt: skip


def heads(seed=0):
    g = torch.Generator().manual_seed(seed)
    V = torch.randn(3, D, R, generator=g, dtype=torch.float64)
    O = torch.randn(6, D, R, generator=g, dtype=torch.float64)
    O[0] = -2.0 * V[0] @ torch.linalg.inv(V[0].T @ V[0])  # T = -2 Π, Π orthogonal
    Oo, Vo = oblique_projection(D, R, g)
    O[2], V[1] = 3.0 * Oo, Vo  # T = 3 Π_oblique (head 2, kv head 1)
    O[5][:, 4] = O[5][:, 0] - O[5][:, 1]  # rank-deficient O: rank T = 4
    return LayerHeads(2, O, V, torch.tensor([0, 0, 1, 1, 2, 2]))


def test_an_orthogonal_projection_scores_zero_and_an_oblique_one_does_not():
    t = projection_facts([heads()])
    assert list(t.columns) == list(PROJECTION_FACT_COLUMNS) and list(t.index[:3]) == ["L2H0", "L2H1", "L2H2"]
    assert t.loc["L2H0", "alpha"] == pytest.approx(-2.0, rel=1e-12)
    assert t.loc["L2H0", "asymmetry"] < 1e-6 and t.loc["L2H0", "proj_distance"] < 1e-6
    assert t.loc["L2H0", "proj_rank"] == R and t.loc["L2H0", "reason"] == ""
    assert t.loc["L2H2", "alpha"] == pytest.approx(3.0, rel=1e-10)
    assert t.loc["L2H2", "asymmetry"] > 0.1 and t.loc["L2H2", "proj_distance"] > 0.1


def test_every_column_equals_the_dense_computation():
    lh = heads()
    t = projection_facts([lh])
    rng = np.random.default_rng(0)
    for h in range(6):
        O, V = lh.O[h].numpy(), lh.V[int(lh.kv_head_of[h])].numpy()
        want = dense_facts(O, V)
        row = t.loc[f"L2H{h}"]
        for col in ("alpha", "asymmetry", "proj_distance", "proj_distance_any"):
            assert row[col] == pytest.approx(want[col], rel=1e-6, abs=1e-6), (h, col)
        assert (row["proj_rank"], row["proj_rank_any"]) == (want["proj_rank"], want["proj_rank_any"])
        k, A = want["proj_rank"], want["A"]
        for _ in range(20):  # no random orthogonal projection of rank k is nearer
            U = np.linalg.qr(rng.standard_normal((D, k)))[0]
            assert np.linalg.norm(A - U @ U.T) / np.linalg.norm(A) >= row["proj_distance"] - 1e-9
    assert t.loc["L2H5", "proj_rank"] == 4


def test_selection_and_refusals():
    lh = heads()
    t = projection_facts([lh], heads={2: [1, 3]})
    assert list(t.index) == ["L2H1", "L2H3"]
    with pytest.raises(OptionError, match="layers"):
        projection_facts([lh], heads={3: [0]})
    with pytest.raises(OptionError, match="not heads of layer 2"):
        projection_facts([lh], heads={2: [6]})
    O = lh.O.clone()
    Q = torch.linalg.qr(lh.V[0])[0]
    O[1] = O[1] - Q @ (Q.T @ O[1])  # nilpotent: α = 0
    t = projection_facts([LayerHeads(2, O, lh.V, lh.kv_head_of)], heads={2: [1]})
    assert "α = 0" in t.loc["L2H1", "reason"] and np.isnan(t.loc["L2H1", "proj_distance"])
    assert t.loc["L2H1", "asymmetry"] > 0  # still defined
