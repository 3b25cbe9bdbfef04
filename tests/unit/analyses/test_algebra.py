"""Shared-value algebra (SPEC section 7): exact constructions, dense float64 reference, real model."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

import tl_idempotence as tli
from helpers import dense_T
from tl_idempotence.analyses.algebra import MHA_REASON, SharedValueAlgebra, layer_algebra, shared_value_algebra
from tl_idempotence.core.heads import LayerHeads, kv_layout
from tl_idempotence.errors import OptionError
from tl_idempotence.maths.closure import closure_from_grams, layer_grams


def _law_layer(seed: int = 1, d: int = 24, r: int = 4, n: int = 6, n_kv: int = 2, alphas=None):
    """A GQA layer with Vᵀ O_j = alpha_j I exactly: O_j = alpha_j V (VᵀV)⁻¹ + N_j with Vᵀ N_j = 0."""
    g = torch.Generator().manual_seed(seed)
    V = torch.randn(n_kv, d, r, generator=g, dtype=torch.float64)
    alphas = torch.tensor(alphas if alphas is not None else [1.5, -0.7, 2.0, 0.3, -3.0, 1.0][:n], dtype=torch.float64)
    kv = kv_layout(n, n_kv)
    O = []
    for j in range(n):
        Vg = V[kv[j]]
        N = torch.randn(d, r, generator=g, dtype=torch.float64)
        N = N - Vg @ torch.linalg.solve(Vg.T @ Vg, Vg.T @ N)
        O.append(alphas[j] * Vg @ torch.linalg.inv(Vg.T @ Vg) + N)
    return torch.stack(O), V, kv, alphas, g


def _part(O, V, kv, threshold=0.9):
    lh = LayerHeads(0, O, V, kv)
    return layer_algebra(lh, layer_grams(lh.O, lh.V, lh.kv_head_of), threshold)


def test_exact_right_action_law():
    O, V, kv, alphas, _ = _law_layer()
    p = _part(O, V, kv)
    assert isinstance(p, SharedValueAlgebra) and p.reason == "" and not p.empty and p.layers == [0]
    assert len(p.pairs) == 2 * 3 * 3
    for row in p.pairs.itertuples():
        assert row.alpha_ij == pytest.approx(float(alphas[row.j]), abs=1e-10, rel=1e-10)
        assert abs(row.P_ij - 1.0) < 1e-10
    h = p.heads.set_index("head")
    assert (h["alpha_spread"] < 1e-10).all()
    assert (np.abs(h["law_P"] - 1) < 1e-10).all()
    np.testing.assert_allclose(h["law_alpha"], alphas.numpy(), rtol=1e-10)
    assert (h["kernel_defect"] < 1e-10).all()
    assert (h["idempotence_defect"] < 1e-6).all()  # sqrt(1/P - 1) with P = 1 - O(1e-16)
    assert h["closed"].all()
    g = p.groups
    assert list(g["n_closed"]) == [3, 3]
    assert (np.abs(g["median_P_offdiag"] - 1) < 1e-10).all()
    # Every pair of closed heads of a group: distinct ranges (random N_j), angles in degrees.
    assert len(p.closed_ranges) == 2 * 3
    assert (p.closed_ranges["min_angle_deg"] > 1.0).all()
    assert (p.closed_ranges["max_angle_deg"] <= 90.0 + 1e-9).all()
    # matrices(layer): {kv: (heads, alpha_ij [i, j], P_ij [i, j])}, rows = left factor i
    mats = p.matrices(0)
    assert sorted(mats) == [0, 1]
    for k, (heads, A, P) in mats.items():
        assert heads == [h for h in range(6) if int(kv[h]) == k] and A.shape == P.shape == (3, 3)
        np.testing.assert_allclose(A, np.tile(alphas.numpy()[heads], (3, 1)), rtol=1e-10, atol=1e-10)
        np.testing.assert_allclose(P, 1.0, atol=1e-10)
    assert p.matrices(5) == {}


def test_perturbation_lowers_P_monotonically():
    O, V, kv, _, g = _law_layer()
    E = torch.randn(O.shape, generator=g, dtype=torch.float64)
    prev = None
    for eps in [0.0, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1]:
        P = _part(O + eps * E, V, kv).pairs["P_ij"].to_numpy()
        if prev is not None:
            assert (P < prev).all(), f"P_ij did not drop at eps={eps}"
        prev = P
    assert prev.max() < 0.999


def _dense_pair(Oi, Oj, V):
    Ti, Tj = dense_T(Oi, V), dense_T(Oj, V)
    TT = Ti @ Tj
    ip = (TT * Ti).sum()
    return float(ip / (Ti * Ti).sum()), float(ip**2 / ((TT * TT).sum() * (Ti * Ti).sum()))


@pytest.mark.parametrize("n,n_kv", [(6, 2), (4, 1), (8, 2)])
def test_pairs_match_dense_reference(n, n_kv):
    g = torch.Generator().manual_seed(10 * n + n_kv)
    d, r = 40, 5
    O = torch.randn(n, d, r, generator=g, dtype=torch.float64)
    V = torch.randn(n_kv, d, r, generator=g, dtype=torch.float64)
    kv = kv_layout(n, n_kv)
    p = _part(O, V, kv)
    assert len(p.pairs) == n_kv * (n // n_kv) ** 2
    for row in p.pairs.itertuples():
        assert kv[row.i] == kv[row.j] == row.kv_head
        a, P = _dense_pair(O[row.i], O[row.j], V[row.kv_head])
        assert row.alpha_ij == pytest.approx(a, rel=1e-10)
        assert row.P_ij == pytest.approx(P, rel=1e-9, abs=1e-14)
    # Per-head derived columns against dense matrices.
    for row in p.heads.itertuples():
        Oj, Vg = O[row.head], V[row.kv_head]
        T = dense_T(Oj, Vg)
        Ebest = T / row.alpha
        idem = float(torch.linalg.norm(Ebest @ Ebest - Ebest) / torch.linalg.norm(Ebest))
        assert row.idempotence_defect == pytest.approx(idem, rel=1e-8)
        Eproj = Oj @ torch.linalg.inv(Vg.T @ Oj) @ Vg.T  # projection onto span(O_j) along ker(Vᵀ)
        assert torch.allclose(Eproj @ Eproj, Eproj, atol=1e-8)
        kd = float(torch.linalg.norm(Ebest - Eproj) / torch.linalg.norm(Eproj))
        assert row.kernel_defect == pytest.approx(kd, rel=1e-8)
        MV = (Vg.T @ Oj) @ Vg.T
        law_P = float((MV * Vg.T).sum() ** 2 / ((MV * MV).sum() * (Vg * Vg).sum()))
        assert row.law_P == pytest.approx(law_P, rel=1e-9)
        col = p.pairs[p.pairs["j"] == row.head]["alpha_ij"].to_numpy()
        assert row.alpha_spread == pytest.approx((col.max() - col.min()) / np.abs(col).max(), rel=1e-12)


def test_diagonal_is_core_closure_exactly():
    g = torch.Generator().manual_seed(3)
    O = torch.randn(9, 64, 8, generator=g)  # float32 weights, as in a real model
    V = torch.randn(3, 64, 8, generator=g)
    lh = LayerHeads(4, O, V, kv_layout(9, 3))
    gr = layer_grams(lh.O, lh.V, lh.kv_head_of)
    c = closure_from_grams(gr)
    p = layer_algebra(lh, gr)
    diag = p.pairs[p.pairs["diagonal"]].sort_values("i")
    assert np.array_equal(diag["alpha_ij"].to_numpy(), c.alpha.numpy())
    assert np.array_equal(diag["P_ij"].to_numpy(), c.P.numpy())
    h = p.heads.sort_values("head")
    assert np.array_equal(h["P"].to_numpy(), c.P.numpy())


def test_closed_range_angles_match_independent_qr():
    O, V, kv, _, _ = _law_layer(seed=5)
    p = _part(O, V, kv)
    for row in p.closed_ranges.itertuples():
        Qa, _ = torch.linalg.qr(O[row.head_a])
        Qb, _ = torch.linalg.qr(O[row.head_b])
        cos = torch.linalg.svdvals(Qa.T @ Qb).clamp(max=1.0)
        ang = np.degrees(np.arccos(cos.numpy()))
        assert row.min_angle_deg == pytest.approx(ang.min(), abs=1e-6)
        assert row.max_angle_deg == pytest.approx(ang.max(), abs=1e-6)
        assert row.mean_cos2 == pytest.approx(float((cos**2).mean()), abs=1e-10)


@pytest.mark.parametrize("scale", [1.0, 2.0**-70, 1e40])
def test_every_pairs_range_angles_match_scipy(scale):
    """The angles of every pair of a group (closed or not), from the Grams and the cross products, are
    scipy.linalg.subspace_angles's; a rank-deficient head gets min(rank) angles, a zero head none (NaN); weights
    far outside float64's comfortable range (rescaled by powers of two inside) give the same angles."""
    import scipy.linalg

    g = torch.Generator().manual_seed(21)
    n, n_kv, d, r = 8, 2, 40, 5
    O = torch.randn(n, d, r, generator=g, dtype=torch.float64)
    O[1] = O[1] @ torch.diag(torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0], dtype=torch.float64))  # rank 4
    O[2] = O[0] @ torch.randn(r, r, generator=g, dtype=torch.float64) + 1e-4 * O[3]  # span close to O_0's
    O[5] = 0.0  # a zero head
    V = torch.randn(n_kv, d, r, generator=g, dtype=torch.float64)
    kv = kv_layout(n, n_kv)
    p = _part(O * scale, V, kv)
    assert len(p.ranges) == 2 * (4 * 3 // 2)
    assert list(zip(p.ranges["head_a"], p.ranges["head_b"]))[:6] == [(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)]
    for row in p.ranges.itertuples():
        assert kv[row.head_a] == kv[row.head_b] == row.kv_head and row.layer == 0
        if 5 in (row.head_a, row.head_b):
            assert row.n_angles == 0 and np.isnan([row.min_angle_deg, row.max_angle_deg, row.mean_cos2]).all()
            continue
        ang = scipy.linalg.subspace_angles(O[row.head_a].numpy(), O[row.head_b].numpy())
        assert row.n_angles == ang.size == (4 if 1 in (row.head_a, row.head_b) else 5)
        assert row.min_angle_deg == pytest.approx(np.degrees(ang.min()), abs=1e-6)
        assert row.max_angle_deg == pytest.approx(np.degrees(ang.max()), abs=1e-6)
        assert row.mean_cos2 == pytest.approx(float(np.mean(np.cos(ang) ** 2)), abs=1e-10)
    near = p.ranges[(p.ranges["head_a"] == 0) & (p.ranges["head_b"] == 2)].iloc[0]
    assert near["min_angle_deg"] < 0.1  # the case the test can fail on: a small angle from cosines near 1


def test_mha_is_empty_with_reason():
    g = torch.Generator().manual_seed(0)
    O = torch.randn(4, 16, 4, generator=g)
    V = torch.randn(4, 16, 4, generator=g)
    p = _part(O, V, kv_layout(4, 4))
    assert p.reason == MHA_REASON and len(p.pairs) == 0 and p.empty
    res = SharedValueAlgebra.concat([p])
    assert isinstance(res, SharedValueAlgebra) and res.empty and res.reason == MHA_REASON
    assert res.figures() == [] and res.layers == []
    assert res.summary == {"algebra_reason": MHA_REASON}  # a property now


def test_concat_of_layers_keeps_every_row():
    O, V, kv, _alphas, _ = _law_layer()
    parts = []
    for layer in (0, 2):
        lh = LayerHeads(layer, O, V, kv)
        parts.append(layer_algebra(lh, layer_grams(lh.O, lh.V, lh.kv_head_of), 0.9))
    g = torch.Generator().manual_seed(0)
    Omha = torch.randn(4, 24, 4, generator=g, dtype=torch.float64)
    lh_mha = LayerHeads(1, Omha, torch.randn(4, 24, 4, generator=g, dtype=torch.float64), kv_layout(4, 4))
    parts.append(layer_algebra(lh_mha, layer_grams(lh_mha.O, lh_mha.V, lh_mha.kv_head_of), 0.9))
    res = SharedValueAlgebra.concat(parts, threshold=0.9)
    assert res.reason == "" and res.layers == [0, 2]  # the MHA layer contributes nothing
    assert len(res.pairs) == 2 * 18 and len(res.heads) == 2 * 6 and len(res.groups) == 2 * 2
    assert sorted(set(res.pairs["layer"])) == [0, 2]
    assert res.summary["n_groups"] == 4 and res.summary["n_pairs_offdiag"] == 2 * 12
    assert res.summary["median_P_offdiag"] == pytest.approx(1.0, abs=1e-10)
    assert res.summary["n_closed_range_pairs"] == 2 * 6
    # at another threshold: closed flags, counts and closed_ranges follow (every pair's angles are kept in ranges)
    E = torch.randn(O.shape, generator=g, dtype=torch.float64)
    O2 = O.clone()
    O2[[1, 4]] += 0.3 * E[[1, 4]]  # heads 1 and 4 leave the law: P = 0.42 and 0.60
    lh2 = LayerHeads(3, O2, V, kv)
    part = layer_algebra(lh2, layer_grams(lh2.O, lh2.V, lh2.kv_head_of), 0.5)
    assert list(part.heads["closed"]) == [True, False, True, True, True, True]
    assert list(part.groups["n_closed"]) == [2, 3]
    assert list(zip(part.closed_ranges["head_a"], part.closed_ranges["head_b"])) == [(0, 2), (3, 4), (3, 5), (4, 5)]
    assert list(zip(part.ranges["head_a"], part.ranges["head_b"])) == [(0, 1), (0, 2), (1, 2), (3, 4), (3, 5), (4, 5)]
    hi = part.at_threshold(0.9)
    # the same pairs and ranges (equal copies: the algebra is immutable and hands out copies, core/tables.py)
    assert hi.threshold == 0.9 and hi.ranges_threshold == 0.9
    assert hi.pairs.equals(part.pairs) and hi.ranges.equals(part.ranges) and hi.pairs is not hi.pairs
    assert list(hi.heads["closed"]) == [True, False, True, True, False, True]
    assert list(hi.groups["n_closed"]) == [2, 2]
    assert list(zip(hi.closed_ranges["head_a"], hi.closed_ranges["head_b"])) == [(0, 2), (3, 5)]
    pd.testing.assert_frame_equal(hi.closed_ranges, part.closed_ranges.iloc[[0, 2]].reset_index(drop=True))
    # lowered again, and lower than the run: the pairs closed there, with their angles, as a run there gives
    pd.testing.assert_frame_equal(hi.at_threshold(0.5).closed_ranges, part.closed_ranges, check_exact=True)
    low = part.at_threshold(0.3)  # head 1 (P = 0.42) closes: its pairs (0, 1), (1, 2) join
    run_low = layer_algebra(lh2, layer_grams(lh2.O, lh2.V, lh2.kv_head_of), 0.3)
    assert list(zip(low.closed_ranges["head_a"], low.closed_ranges["head_b"])) == [
        (0, 1), (0, 2), (1, 2), (3, 4), (3, 5), (4, 5)
    ]  # fmt: skip
    pd.testing.assert_frame_equal(low.closed_ranges, run_low.closed_ranges, check_exact=True)
    assert low.summary == run_low.summary
    # an algebra read from a report saved before every pair's angles were kept (no ranges): closed_ranges can
    # only keep the pairs closed at both thresholds, and ranges_threshold stays the run's
    old = SharedValueAlgebra(
        pairs=part.pairs, heads=part.heads, groups=part.groups, closed_ranges=part.closed_ranges, reason="",
        threshold=0.5,
    )  # fmt: skip
    assert old.ranges is None and old.ranges_threshold == 0.5
    old_hi = old.at_threshold(0.9)
    assert old_hi.ranges_threshold == 0.5 and list(
        zip(old_hi.closed_ranges["head_a"], old_hi.closed_ranges["head_b"])
    ) == [(0, 2), (3, 5)]
    assert len(old.at_threshold(0.3).closed_ranges) == 4  # pairs (0, 1), (1, 2) have no angles there


def test_degenerate_heads_give_nan_with_reason():
    O, V, kv, _, _ = _law_layer(n=3, n_kv=1, alphas=[1.0, 2.0, 0.5])
    O[1] = 0.0  # zero head: T_1 = 0
    p = _part(O, V, kv)
    row = p.pairs[(p.pairs.i == 1)]
    assert row["alpha_ij"].isna().all() and row["P_ij"].isna().all()
    assert row["reason"].str.contains("zero").all()
    # Right factor 1 (T_i T_1 = 0 for every i): alpha 0, P NaN, reason about the product.
    col = p.pairs[(p.pairs.j == 1) & (p.pairs.i != 1)]
    assert (col["alpha_ij"] == 0).all() and col["P_ij"].isna().all()
    assert col["reason"].str.contains("T_i T_j ~ 0").all()
    h1 = p.heads.set_index("head").loc[1]
    assert np.isnan(h1["kernel_defect"]) and "kernel defect" in h1["reason"]
    # The other heads are unaffected: exact law.
    ok = p.pairs[(p.pairs.i != 1) & (p.pairs.j != 1)]
    assert (np.abs(ok["P_ij"] - 1) < 1e-10).all()


@pytest.mark.bridge
def test_report_and_public_api_on_tiny_gqa_bridge(tmp_path):
    from tl_idempotence.testing import bridge_from_dir, tiny_hf_dir

    model = bridge_from_dir(tiny_hf_dir(tmp_path / "tinyq", arch="llama", n_heads=8, n_kv_heads=2, d_model=64))
    rep = tli.idempotence_report(model, algebra=True, progress=False)
    alg = rep.algebra
    assert alg.reason == "" and len(alg.groups) == 2 * 2 and len(alg.pairs) == 2 * 2 * 16
    merged = alg.heads.merge(rep.heads, on=["layer", "head"], suffixes=("", "_core"))
    assert np.array_equal(merged["P"].to_numpy(), merged["P_core"].to_numpy())
    assert np.array_equal(merged["alpha"].to_numpy(), merged["alpha_core"].to_numpy())
    figs = alg.figures()
    assert len(figs) == 2 and len(figs[0].data) == 2 * 2  # alpha and P heatmap per kv group
    assert rep.summary["algebra"] == alg.summary and rep.summary["algebra"]["n_groups"] == 4
    for layer in (0, 1):  # matrices(layer): per kv group the 4 x 4 alpha_ij and P_ij of the pairs table
        mats = alg.matrices(layer)
        assert sorted(mats) == [0, 1]
        for k, (heads, A, P) in mats.items():
            d = alg.pairs[(alg.pairs.layer == layer) & (alg.pairs.kv_head == k)]
            assert heads == sorted(set(d["i"])) and A.shape == P.shape == (4, 4)
            for row in d.itertuples():
                assert P[heads.index(row.i), heads.index(row.j)] == row.P_ij
                assert A[heads.index(row.i), heads.index(row.j)] == row.alpha_ij
    direct = shared_value_algebra(model, progress=False, layers=[1])
    assert np.array_equal(direct.pairs["P_ij"].to_numpy(), alg.pairs[alg.pairs.layer == 1]["P_ij"].to_numpy())
    with pytest.raises(OptionError, match=r"Unknown layer index \[7\]"):
        shared_value_algebra(model, layers=[7], progress=False)
    with pytest.raises(OptionError, match="threshold must be in"):
        shared_value_algebra(model, threshold=2.0, progress=False)
    with pytest.raises(TypeError):  # threshold is keyword-only
        shared_value_algebra(model, 0.5)
    html = rep.save_html(str(tmp_path / "r.html"))
    assert "Shared-value algebra, layer 1" in open(html, encoding="utf-8").read()


@pytest.mark.bridge
def test_mha_model_says_so(tmp_path):
    from tl_idempotence.testing import bridge_from_dir, tiny_hf_dir

    model = bridge_from_dir(tiny_hf_dir(tmp_path / "tinyg", arch="gpt2", n_heads=4, d_model=32))
    res = shared_value_algebra(model, progress=False)
    assert res.empty and res.reason == "no exact value sharing (MHA)"
    rep = tli.idempotence_report(model, algebra=True, progress=False)
    assert rep.algebra.reason == "no exact value sharing (MHA)" and rep.algebra.figures() == []


def _near_nilpotent_pair_layer(eps: float = 1e-9):
    """One kv group of 3 heads: T_0 T_1 = O_0 (Vᵀ O_1) Vᵀ ~ eps (O_0 nearly kills range(Vᵀ O_1)), T_1 itself is not
    nilpotent, head 2 Gaussian."""
    g = torch.Generator().manual_seed(3)
    d, r = 16, 4
    V = torch.randn(1, d, r, generator=g, dtype=torch.float64)
    Vp = V[0] @ torch.linalg.inv(V[0].T @ V[0])  # Vᵀ Vp = I
    Nperp = torch.eye(d, dtype=torch.float64) - Vp @ V[0].T  # projector along span(V)
    M1 = torch.zeros(r, r, dtype=torch.float64)
    M1[:2] = torch.randn(2, r, generator=g, dtype=torch.float64)  # range(M_1) = span(e_1, e_2)
    O1 = Vp @ M1 + Nperp @ torch.randn(d, r, generator=g, dtype=torch.float64)
    O0 = torch.randn(d, r, generator=g, dtype=torch.float64)
    O0[:, :2] *= eps
    O2 = torch.randn(d, r, generator=g, dtype=torch.float64)
    return torch.stack([O0, O1, O2]), V, torch.zeros(3, dtype=torch.long)


@pytest.mark.parametrize("scale", [2.0**30, 2.0**-30, 1e3, 1e-3, 1e150, 1e-150])
@pytest.mark.parametrize("which", ["all", "O_1", "O_0"])
def test_offdiagonal_nilpotent_decision_is_scale_free(scale, which):
    """Whether T_i T_j ~ 0 is decided relative to ||T_i|| ||T_j|| in the weights' units, so rescaling
    every weight, or one head's O, by 2^k, 1e3 or 1e±150 (power-of-two rescaled Grams) changes no decision; and
    P_ij, which is invariant under those rescalings, keeps its value."""
    O, V, kv = _near_nilpotent_pair_layer()
    base = _part(O, V, kv).pairs
    nil0 = base["reason"].str.startswith("T_i T_j ~ 0").to_numpy()
    b01 = base[(base.i == 0) & (base.j == 1)].iloc[0]
    assert b01["alpha_ij"] == 0 and np.isnan(b01["P_ij"]) and "(||T_i||_F ||T_j||_F)" in b01["reason"]
    assert nil0.sum() == 1 and base["P_ij"].isna().sum() == 1  # only the pair (0, 1)
    O2, V2 = O.clone(), V.clone()
    if which == "all":
        O2, V2 = O2 * scale, V2 * scale
    else:
        O2[int(which[-1])] *= scale
    got = _part(O2, V2, kv).pairs
    assert np.array_equal(got["reason"].str.startswith("T_i T_j ~ 0").to_numpy(), nil0)
    assert np.array_equal(got["P_ij"].isna().to_numpy(), base["P_ij"].isna().to_numpy())
    fin = base["P_ij"].notna().to_numpy()
    np.testing.assert_allclose(got["P_ij"].to_numpy()[fin], base["P_ij"].to_numpy()[fin], rtol=1e-9)
    assert (got["diagonal"] | (got["reason"] == "") | nil0).all()
