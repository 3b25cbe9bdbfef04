"""Shared-value algebra (SPEC section 7) on exact constructions with known answers: the off-diagonal
``T_i T_j ≈ 0`` decision at its boundaries, pairs that the scale-free decision takes apart from the core's,
an irregular kv map, and the threshold's re-derivation on hand-written tables (expected values
never come from the package's own functions)."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pandas as pd
import pytest
import torch

from tl_idempotence.analyses.algebra_maths import (
    GROUP_COLUMNS,
    HEAD_COLUMNS,
    PAIR_COLUMNS,
    RANGE_COLUMNS,
    SharedValueAlgebra,
    _offdiagonal_nilpotent,
    empty_table,
    layer_algebra,
)
from tl_idempotence.core.factors import DEGENERATE_RTOL
from tl_idempotence.core.heads import LayerHeads, ModelInfo
from tl_idempotence.maths.closure import layer_grams


def test_offdiagonal_nilpotent_decision_on_exact_norms():
    """``T_i T_j ≈ 0`` iff ``‖T_iT_j‖ ≤ DEGENERATE_RTOL ‖T_i‖ ‖T_j‖`` (the boundary included), and always when
    the right factor is zero (``‖T_j‖ = 0``, whatever ``‖T_iT_j‖`` reads)."""
    assert _offdiagonal_nilpotent(DEGENERATE_RTOL, 1.0, 1.0) == (True, DEGENERATE_RTOL)  # on the boundary
    assert _offdiagonal_nilpotent(4 * DEGENERATE_RTOL, 2.0, 2.0) == (True, DEGENERATE_RTOL)  # scale-free
    nil, ratio = _offdiagonal_nilpotent(3 * DEGENERATE_RTOL, 1.0, 1.0)
    assert not nil and ratio == 3 * DEGENERATE_RTOL
    assert _offdiagonal_nilpotent(1.0, 1.0, 1.0) == (False, 1.0)  # ||T_i T_j|| = 1 is not special
    assert _offdiagonal_nilpotent(0.0, 2.0, 3.0) == (True, 0.0)
    for norm_TiTj in (0.0, 0.5, 1.0):  # a zero right factor: T_i T_j = 0, the ratio undefined
        nil, ratio = _offdiagonal_nilpotent(norm_TiTj, 2.0, 0.0)
        assert nil and math.isnan(ratio)


def _law_group(alphas: list[float], seed: int, d: int = 12, r: int = 3):
    """One kv group with ``Vᵀ O_j = alpha_j I`` exactly (``O_j = alpha_j V (VᵀV)⁻¹``): ``T_i T_j = alpha_j T_i``,
    so ``alpha_ij = alpha_j`` and ``P_ij = 1`` for every pair."""
    g = torch.Generator().manual_seed(seed)
    V = torch.randn(1, d, r, generator=g, dtype=torch.float64)
    Vp = V[0] @ torch.linalg.inv(V[0].T @ V[0])
    O = torch.stack([a * Vp for a in alphas])
    return O, V, torch.zeros(len(alphas), dtype=torch.long)


@pytest.mark.parametrize("seed", range(6))
def test_a_small_right_factor_keeps_the_law(seed):
    """``alpha_1 = 1e-9``: ``‖T_0 T_1‖ = 1e-9 ‖T_0‖`` is below the core's ``DEGENERATE_RTOL ‖T_0‖²`` but far above
    ``DEGENERATE_RTOL ‖T_0‖ ‖T_1‖`` (``‖T_1‖ ~ 1e-9``), so the pair is not nilpotent and its alpha_ij, P_ij are
    re-derived: they keep the exact law, P_ij within [0, 1] (rounding puts the raw ratio a few ulps above 1
    for some seeds)."""
    O, V, kv = _law_group([1.0, 1e-9], seed)
    lh = LayerHeads(0, O, V, kv)
    p = layer_algebra(lh, layer_grams(lh.O, lh.V, lh.kv_head_of))
    assert (p.pairs["reason"] == "").all()
    for row in p.pairs.itertuples():
        assert row.alpha_ij == pytest.approx([1.0, 1e-9][row.j], rel=1e-12)
        assert 0.0 <= row.P_ij <= 1.0 and row.P_ij == pytest.approx(1.0, abs=1e-12)


def test_a_zero_left_factor_is_named_so():
    """``O_1 = 0``: every pair with ``T_1`` on the left is undefined, and its reason names the zero left factor
    (the diagonal keeps the core's "zero head")."""
    g = torch.Generator().manual_seed(2)
    O = torch.randn(3, 10, 3, generator=g, dtype=torch.float64)
    O[1] = 0.0
    V = torch.randn(1, 10, 3, generator=g, dtype=torch.float64)
    lh = LayerHeads(0, O, V, torch.zeros(3, dtype=torch.long))
    pairs = layer_algebra(lh, layer_grams(lh.O, lh.V, lh.kv_head_of)).pairs.set_index(["i", "j"])
    for j in (0, 2):
        assert pairs.loc[(1, j), "reason"].startswith("zero left factor T_i")
        assert "zero head" not in pairs.loc[(1, j), "reason"] and np.isnan(pairs.loc[(1, j), "alpha_ij"])
    assert pairs.loc[(1, 1), "reason"].startswith("zero head")


def _near_nilpotent_pair(scale: float, eps: float = 1e-9, d: int = 16, r: int = 4):
    """Two heads of one group with ``T_0 T_1 = O_0 (Vᵀ O_1) Vᵀ ~ eps`` (``Vᵀ O_1`` has rows 0, 1 only and
    ``O_0``'s columns 0, 1 are ``eps``-small), ``O_1`` times ``scale``."""
    g = torch.Generator().manual_seed(3)
    V = torch.randn(1, d, r, generator=g, dtype=torch.float64)
    Vp = V[0] @ torch.linalg.inv(V[0].T @ V[0])  # Vᵀ Vp = I
    Nperp = torch.eye(d, dtype=torch.float64) - Vp @ V[0].T  # Vᵀ Nperp = 0
    M1 = torch.zeros(r, r, dtype=torch.float64)
    M1[:2] = torch.randn(2, r, generator=g, dtype=torch.float64)
    O1 = Vp @ M1 + Nperp @ torch.randn(d, r, generator=g, dtype=torch.float64)
    O0 = torch.randn(d, r, generator=g, dtype=torch.float64)
    O0[:, :2] *= eps
    return torch.stack([O0, scale * O1]), V, torch.zeros(2, dtype=torch.long)


@pytest.mark.parametrize("scale", [1e3, 1e6])
def test_a_large_right_factor_leaves_a_near_nilpotent_pair_nilpotent(scale):
    """``‖T_0 T_1‖ ~ 1e-9 · scale · ‖T_0‖`` exceeds the core's ``DEGENERATE_RTOL ‖T_0‖²`` once ``O_1`` is
    scaled up, but stays below ``DEGENERATE_RTOL ‖T_0‖ ‖T_1‖``: the pair is nilpotent, alpha_ij = 0, P_ij NaN."""
    O, V, kv = _near_nilpotent_pair(scale)
    lh = LayerHeads(0, O, V, kv)
    pairs = layer_algebra(lh, layer_grams(lh.O, lh.V, lh.kv_head_of)).pairs.set_index(["i", "j"])
    assert pairs.loc[(0, 1), "alpha_ij"] == 0.0 and np.isnan(pairs.loc[(0, 1), "P_ij"])
    assert pairs.loc[(0, 1), "reason"].startswith("T_i T_j ~ 0: ||T_i T_j||_F / (||T_i||_F ||T_j||_F) = ")
    assert pairs.loc[(1, 0), "reason"] == "" and 0.0 < pairs.loc[(1, 0), "P_ij"] <= 1.0


def _dense_scalars(O: torch.Tensor, V: torch.Tensor) -> tuple[float, float]:
    """alpha and P of one head from the dense ``T = O Vᵀ`` (SPEC 2)."""
    T = O @ V.T
    T2 = T @ T
    ip = float((T2 * T).sum())
    nT, nT2 = float((T * T).sum()), float((T2 * T2).sum())
    return ip / nT, ip**2 / (nT2 * nT)


def test_a_kv_group_of_one_head_beside_a_group_of_two():
    """An irregular kv map ``[0, 0, 1]``: the group of one head has one (diagonal) pair with the head's own alpha
    and P, the group of two its four pairs."""
    g = torch.Generator().manual_seed(7)
    O = torch.randn(3, 10, 3, generator=g, dtype=torch.float64)
    V = torch.randn(2, 10, 3, generator=g, dtype=torch.float64)
    kv = torch.tensor([0, 0, 1])
    lh = LayerHeads(0, O, V, kv)
    p = layer_algebra(lh, layer_grams(lh.O, lh.V, lh.kv_head_of))
    assert list(p.groups["n_heads"]) == [2, 1] and len(p.pairs) == 5
    one = p.pairs[p.pairs["kv_head"] == 1].iloc[0]
    assert (one.i, one.j, bool(one.diagonal)) == (2, 2, True)
    alpha, P = _dense_scalars(O[2], V[1])
    assert one.alpha_ij == pytest.approx(alpha, rel=1e-10) and one.P_ij == pytest.approx(P, rel=1e-9)
    assert list(zip(p.ranges["head_a"], p.ranges["head_b"])) == [(0, 1)]  # no pair in a group of one


def _table(cols: list[str], rows: list[dict]) -> pd.DataFrame:
    return pd.DataFrame([{c: r.get(c, np.nan) for c in cols} for r in rows], columns=cols)


def _hand_algebra() -> SharedValueAlgebra:
    """Two layers' tables written by hand: heads' P as Python objects (a table read back from storage), a group
    (layer 1, kv 5) with no head rows, every pair's angles in ``ranges``."""
    heads = _table(
        HEAD_COLUMNS,
        [
            {"layer": 0, "kv_head": 0, "head": 0, "P": 0.5, "closed": False},
            {"layer": 0, "kv_head": 0, "head": 1, "P": 0.25, "closed": False},
            {"layer": 0, "kv_head": 1, "head": 2, "P": float("nan"), "closed": False},
            {"layer": 0, "kv_head": 1, "head": 3, "P": 0.75, "closed": False},
            {"layer": 1, "kv_head": 0, "head": 0, "P": 1.0, "closed": False},
            {"layer": 1, "kv_head": 0, "head": 1, "P": 0.5, "closed": False},
        ],
    )
    heads["P"] = heads["P"].astype(object)
    groups = _table(
        GROUP_COLUMNS,
        [
            {"layer": 0, "kv_head": 0, "n_closed": 9},
            {"layer": 0, "kv_head": 1, "n_closed": 9},
            {"layer": 1, "kv_head": 0, "n_closed": 9},
            {"layer": 1, "kv_head": 5, "n_closed": 9},
        ],
    )
    ranges = _table(
        RANGE_COLUMNS,
        [
            {"layer": 0, "kv_head": 0, "head_a": 0, "head_b": 1, "min_angle_deg": 10.0},
            {"layer": 0, "kv_head": 1, "head_a": 2, "head_b": 3, "min_angle_deg": 20.0},
            {"layer": 1, "kv_head": 0, "head_a": 0, "head_b": 1, "min_angle_deg": 30.0},
        ],
    )
    pairs = _table(PAIR_COLUMNS, [{"layer": 0, "kv_head": 0, "i": 0, "j": 0, "P_ij": 0.5, "diagonal": True}])
    info = ModelInfo(n_layers=2, n_heads=4, n_kv_heads=2, d_model=8, d_head=2, model_name="hand")
    return SharedValueAlgebra(
        pairs=pairs,
        heads=heads,
        groups=groups,
        closed_ranges=ranges.iloc[:0],
        reason="",
        info=info,
        threshold=0.9,
        ranges=ranges,
    )


def test_at_threshold_rederives_flags_counts_and_closed_pairs_exactly():
    """At 0.5: a P equal to the threshold is closed, a NaN P never; the counts per group (0 for a group without
    head rows); the closed pairs are the ``ranges`` rows whose two heads are closed; ``closed`` is a bool column
    and no warning is raised (a NaN P) even when P is stored as objects; the rest of the algebra is kept as it was."""
    alg = _hand_algebra()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = alg.at_threshold(0.5)
    assert list(got.heads["closed"]) == [True, False, False, True, True, True]
    assert got.heads["closed"].dtype == np.dtype(bool)
    assert list(got.groups["n_closed"]) == [1, 1, 2, 0]
    assert list(zip(got.closed_ranges["layer"], got.closed_ranges["head_a"])) == [(1, 0)]
    assert got.threshold == 0.5 and got.ranges_threshold == 0.5
    # the same pairs and ranges (equal copies: the algebra is immutable and hands out copies, core/tables.py)
    assert got.reason == "" and got.info is alg.info and got.pairs.equals(alg.pairs) and got.ranges.equals(alg.ranges)
    assert list(alg.heads["closed"]) == [False] * 6 and list(alg.groups["n_closed"]) == [9] * 4  # not edited
    lower = alg.at_threshold(0.25)
    assert list(lower.heads["closed"]) == [True, True, False, True, True, True]
    assert list(lower.groups["n_closed"]) == [2, 1, 2, 0]
    assert list(zip(lower.closed_ranges["layer"], lower.closed_ranges["head_a"])) == [(0, 0), (1, 0)]


def _scipy_angles_deg(Oa: torch.Tensor, Ob: torch.Tensor) -> np.ndarray:
    import scipy.linalg

    return np.degrees(scipy.linalg.subspace_angles(Oa.double().numpy(), Ob.double().numpy()))


def test_range_angles_of_a_rank_one_head_and_their_dtypes():
    """A rank-1 head has one angle with every other head (its max angle is its min angle, ``mean_cos2`` that
    angle's cos²); the table's columns are RANGE_COLUMNS with integer heads, kv heads and counts."""
    g = torch.Generator().manual_seed(11)
    O = torch.randn(4, 20, 4, generator=g, dtype=torch.float64)
    O[1] = torch.randn(20, 1, generator=g, dtype=torch.float64) @ torch.randn(1, 4, generator=g, dtype=torch.float64)
    V = torch.randn(2, 20, 4, generator=g, dtype=torch.float64)
    lh = LayerHeads(0, O, V, torch.tensor([0, 0, 1, 1]))
    ranges = layer_algebra(lh, layer_grams(lh.O, lh.V, lh.kv_head_of)).ranges
    assert list(ranges.columns) == RANGE_COLUMNS
    for c in ("layer", "kv_head", "head_a", "head_b", "n_angles"):
        assert ranges[c].dtype == np.dtype(np.int64), c
    one = ranges.iloc[0]
    ang = _scipy_angles_deg(O[0], O[1])
    assert (one.head_a, one.head_b, one.n_angles) == (0, 1, 1) and ang.size == 1
    assert one.min_angle_deg == pytest.approx(ang[0], abs=1e-6) and one.max_angle_deg == one.min_angle_deg
    assert one.mean_cos2 == pytest.approx(np.cos(np.radians(ang[0])) ** 2, abs=1e-10)


@pytest.mark.parametrize("kv", [[0, 1, 1], [0, 0, 1]])
def test_range_angles_skip_a_group_of_one_wherever_it_stands(kv):
    """The group of one head has no pair; the group of two has its pair, whether it comes first or last."""
    g = torch.Generator().manual_seed(12)
    O = torch.randn(3, 16, 3, generator=g, dtype=torch.float64)
    V = torch.randn(2, 16, 3, generator=g, dtype=torch.float64)
    lh = LayerHeads(0, O, V, torch.tensor(kv))
    ranges = layer_algebra(lh, layer_grams(lh.O, lh.V, lh.kv_head_of)).ranges
    a, b = [h for h in range(3) if kv.count(kv[h]) == 2]
    assert list(zip(ranges["head_a"], ranges["head_b"])) == [(a, b)]
    assert ranges["min_angle_deg"].iloc[0] == pytest.approx(_scipy_angles_deg(O[a], O[b]).min(), abs=1e-6)


@pytest.mark.parametrize("seed", range(8))
def test_heads_with_one_range_have_zero_angles(seed):
    """``O_b = O_a R`` (R invertible): the same range, every angle 0 (cosines that round a few ulps above 1
    are 1, never a NaN angle)."""
    g = torch.Generator().manual_seed(seed)
    Oa = torch.randn(24, 4, generator=g, dtype=torch.float64)
    O = torch.stack([Oa, Oa @ torch.randn(4, 4, generator=g, dtype=torch.float64)])
    V = torch.randn(1, 24, 4, generator=g, dtype=torch.float64)
    lh = LayerHeads(0, O, V, torch.zeros(2, dtype=torch.long))
    row = layer_algebra(lh, layer_grams(lh.O, lh.V, lh.kv_head_of)).ranges.iloc[0]
    assert 0.0 <= row.min_angle_deg <= row.max_angle_deg < 1e-3 and row.mean_cos2 == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize("compute_dtype", [torch.float64, torch.float32])
def test_range_angles_of_float32_weights_in_the_compute_dtype(compute_dtype):
    """float32 weights (as real models have): the cross products run in ``compute_dtype``, so float64 gives the
    angles of the float32 weights to ~1e-9 degrees and float32 to ~1e-3."""
    g = torch.Generator().manual_seed(13)
    O = torch.randn(3, 32, 4, generator=g)
    V = torch.randn(1, 32, 4, generator=g)
    lh = LayerHeads(0, O, V, torch.zeros(3, dtype=torch.long))
    ranges = layer_algebra(lh, layer_grams(lh.O, lh.V, lh.kv_head_of), compute_dtype=compute_dtype).ranges
    tol = 1e-9 if compute_dtype == torch.float64 else 1e-3
    for row in ranges.itertuples():
        ang = _scipy_angles_deg(O[row.head_a], O[row.head_b])
        assert row.min_angle_deg == pytest.approx(ang.min(), abs=tol)
        assert row.max_angle_deg == pytest.approx(ang.max(), abs=tol)


def test_closed_rows_of_edge_tables():
    """No head closed (or no head rows): no closed pair, as the empty object-typed table every empty algebra
    table is; a column-less ranges table (read back empty) gives that table too; ``closed`` stored as 0/1 is
    read as flags; the kept rows are renumbered with no index column."""
    alg = _hand_algebra()
    none = SharedValueAlgebra(
        pairs=alg.pairs,
        heads=alg.heads.iloc[:0],
        groups=alg.groups,
        closed_ranges=alg.ranges,
        reason="",
        ranges=alg.ranges,
    ).at_threshold(0.5)
    pd.testing.assert_frame_equal(none.closed_ranges, empty_table(RANGE_COLUMNS))
    bare = SharedValueAlgebra(
        pairs=alg.pairs, heads=alg.heads, groups=alg.groups, closed_ranges=pd.DataFrame(), reason="", ranges=None
    ).at_threshold(0.5)
    pd.testing.assert_frame_equal(bare.closed_ranges, empty_table(RANGE_COLUMNS))
    typed = alg.ranges.iloc[:0]
    kept = SharedValueAlgebra(
        pairs=alg.pairs, heads=alg.heads, groups=alg.groups, closed_ranges=typed, reason="", ranges=typed
    ).at_threshold(0.5)
    pd.testing.assert_frame_equal(kept.closed_ranges, typed)
    heads = alg.heads.copy()
    heads["P"] = [0.9, 0.9, 0.9, 0.1, 0.9, 0.9]
    got = SharedValueAlgebra(
        pairs=alg.pairs, heads=heads, groups=alg.groups, closed_ranges=alg.ranges, reason="", ranges=alg.ranges
    ).at_threshold(0.5)
    assert list(got.closed_ranges.columns) == RANGE_COLUMNS and list(got.closed_ranges.index) == [0, 1]
    assert list(zip(got.closed_ranges["layer"], got.closed_ranges["head_a"])) == [(0, 0), (1, 0)]
