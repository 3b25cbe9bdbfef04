"""Scale-proof maths: P and α are right for every finite input.

Property tests (hypothesis, derandomized) over weight scales 1e-30..1e30 (1e-100..1e100 for
float64 inputs; fp16 at the scales it represents), input dtypes (float16, bfloat16, float32,
float64), shapes (d_model 4..64, d_head 1..8, GQA/MHA/MQA layouts, batches 1..4), a scale of
its own per head, rank-deficient factors (exact zero columns, exact in every dtype), zero heads
and nilpotent heads. Every route — ``tli.closure`` (LayerHeads and (W_V, W_O) pairs), the report
through a LayerHeads source, the mismatch pairs, the shared-value algebra's α_ij / P_ij, the
scramble's draws and the constructive search's P — is compared with the dense float64 reference
computed on the *rescaled* inputs (``P_ref = P(O/s_O, V/s_V)``, ``α_ref = α(O/s_O, V/s_V)·s_O·s_V``;
``s`` is the scale each head was multiplied by, the reference uses the tensors as stored).

Tolerances (justified): both paths compute in float64. ``‖T²‖²`` is a sum whose terms are
bounded by ``(‖O‖‖V‖)⁴`` while the sum itself is ``ρ²‖T‖⁴`` with ``ρ = ‖T²‖/‖T‖²``, so its
relative rounding error is ``O(d·eps/ρ²)`` on either path; hence
``|ΔP| ≤ 1e-9 + 1e-13/ρ²`` and ``|Δα| ≤ (1e-9 + 1e-13/ρ²)·‖T²‖/‖T‖`` (Cauchy-Schwarz:
``|α| ≤ ‖T²‖/‖T‖``). Heads with ``ρ < 1e-9`` are true nilpotent heads (exactly constructed
ones, ρ ≈ eps) and must be NaN with a "nilpotent" reason; between 1e-9 and 1e-5 (float32/16
rounding of a nilpotent construction lands there) only consistency is asserted (NaN has a
reason, a number lies in [0, 1]). With ``compute_dtype=float32`` products the bound is
``1e-3`` for heads with ``ρ > 1e-2``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.linalg
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tl_idempotence as tli
from tl_idempotence.core.factors import rank_rtol
from tl_idempotence.core.heads import LayerHeads, kv_layout

F64 = torch.float64
SETTINGS = dict(
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)
#: log10 of the weight scales each input dtype is tested at (fp16: what it represents with
#: Gaussian entries, max 65504; float64 up to 1e±100).
LOG10_RANGE = {torch.float16: (-3, 2), torch.bfloat16: (-30, 30), torch.float32: (-30, 30), torch.float64: (-100, 100)}
DTYPES = list(LOG10_RANGE)


# --------------------------------------------------------------------------- dense reference


def dense(O: torch.Tensor, V: torch.Tensor) -> dict:
    """Closure of T = O Vᵀ materialized in float64 (column form, one head)."""
    T = O @ V.T
    T2 = T @ T
    nT, nT2 = float(torch.linalg.norm(T)), float(torch.linalg.norm(T2))
    inner = float((T2 * T).sum())
    out = {"norm": nT, "norm_T2": nT2, "rho": nT2 / nT**2 if nT > 0 else float("nan"), "T": T}
    out["alpha"] = inner / nT**2 if nT > 0 else float("nan")
    out["P"] = inner**2 / (nT2**2 * nT**2) if nT > 0 and nT2 > 0 else float("nan")
    return out


def dense_P(T: torch.Tensor) -> float:
    T2 = T @ T
    return float((T2 * T).sum() ** 2 / ((T2 * T2).sum() * (T * T).sum()))


def tol_P(rho: float) -> float:
    return 1e-9 + 1e-13 / rho**2


def check_head(P: float, alpha: float, reason: str, ref: dict, what: str, s_alpha: float = 1.0) -> None:
    """One head's (P, α / s_alpha, reason) against its dense reference (module docstring for the bands)."""
    if not ref["norm"] > 0:
        assert math.isnan(P) and math.isnan(alpha), what
        assert reason.startswith("zero head"), (what, reason)
        return
    rho = ref["rho"]
    if rho < 1e-9:
        assert math.isnan(P) and alpha == 0.0, (what, P, alpha)
        assert reason.startswith("nilpotent head"), (what, reason)
        return
    if rho < 1e-5:
        assert (math.isnan(P) and reason) or (0.0 <= P <= 1.0), (what, P, reason)
        return
    assert reason == "", (what, reason, rho)
    assert abs(P - ref["P"]) <= tol_P(rho), (what, P, ref["P"], rho)
    bound = tol_P(rho) * ref["norm_T2"] / ref["norm"]
    assert abs(alpha / s_alpha - ref["alpha"]) <= bound, (what, alpha / s_alpha, ref["alpha"], bound)


# --------------------------------------------------------------------------- generated layers


@st.composite
def layers(draw, dtypes=DTYPES, max_d=64, max_r=8):
    """A LayerHeads at random scales (one per query head and per kv head) with its float64 unscaled copy."""
    dtype = draw(st.sampled_from(dtypes))
    lo, hi = LOG10_RANGE[dtype]
    n_kv = draw(st.integers(1, 3))
    group = draw(st.integers(1, 3))
    r = draw(st.integers(1, max_r))
    d = draw(st.integers(max(4, r), max_d))
    seed = draw(st.integers(0, 2**31 - 1))
    n = n_kv * group
    g = torch.Generator().manual_seed(seed)
    O = torch.randn(n, d, r, generator=g, dtype=F64)
    V = torch.randn(n_kv, d, r, generator=g, dtype=F64)
    kv = kv_layout(n, n_kv)
    kinds = draw(st.lists(st.sampled_from(["full", "rank", "zero", "nilpotent"]), min_size=n, max_size=n))
    for h, kind in enumerate(kinds):
        if kind == "rank" and r > 1:
            k = draw(st.integers(1, r - 1))
            O[h, :, k:] = 0.0  # rank(O_h) <= k, exact in every dtype
        elif kind == "zero":
            O[h] = 0.0
        elif kind == "nilpotent" and d >= 2 * r:
            Q, _ = torch.linalg.qr(V[kv[h]])
            X = torch.randn(d, r, generator=g, dtype=F64)
            O[h] = X - Q @ (Q.T @ X)  # span(O_h) ⟂ span(V): T² = 0, T ≠ 0
    if draw(st.booleans()) and r > 1:
        V[0, :, draw(st.integers(1, r - 1)) :] = 0.0  # a rank-deficient kv head
    s_O = [10.0 ** draw(st.floats(lo, hi)) for _ in range(n)]
    s_V = [10.0 ** draw(st.floats(lo, hi)) for _ in range(n_kv)]
    Os = torch.stack([(O[h] * s_O[h]).to(dtype) for h in range(n)])
    Vs = torch.stack([(V[k] * s_V[k]).to(dtype) for k in range(n_kv)])
    # The reference: the tensors as stored, divided by their scales, in float64.
    O_ref = torch.stack([Os[h].to(F64) / s_O[h] for h in range(n)])
    V_ref = torch.stack([Vs[k].to(F64) / s_V[k] for k in range(n_kv)])
    return LayerHeads(0, Os, Vs, kv), O_ref, V_ref, s_O, s_V


def principal_bases(O: torch.Tensor, V: torch.Tensor, rtol: float):
    """Test-side principal coordinates of span(O), span(V) (scipy, at the package's rank tolerance)."""
    Q_O0 = torch.from_numpy(scipy.linalg.orth(O.numpy(), rcond=rtol))
    Q_V0 = torch.from_numpy(scipy.linalg.orth(V.numpy(), rcond=rtol))
    U, sig, Wh = torch.linalg.svd(Q_V0.T @ Q_O0)
    return Q_O0 @ Wh.T, Q_V0 @ U, sig


def dense_T_of_K(K: torch.Tensor, D: torch.Tensor, O: torch.Tensor, V: torch.Tensor, rtol: float) -> torch.Tensor:
    """T = Q_O K Q_Vᵀ built from the test-side principal bases of (O, V); checks that D are their cosines."""
    Q_O, Q_V, sig = principal_bases(O, V, rtol)
    rO, rV = Q_O.shape[1], Q_V.shape[1]
    k = min(rO, rV)
    np.testing.assert_allclose(D[:k].numpy(), sig[:k].numpy(), atol=1e-7)
    return Q_O @ K[:rO, :rV] @ Q_V.T


# --------------------------------------------------------------------------- closure: LayerHeads and pairs


@settings(max_examples=60, **SETTINGS)
@given(layers())
def test_closure_of_layer_heads_matches_dense_reference_at_any_scale(case):
    lh, O, V, s_O, s_V = case
    c = tli.closure(lh)
    for h in range(lh.n_heads):
        k = int(lh.kv_head_of[h])
        ref = dense(O[h], V[k])
        check_head(float(c.P[h]), float(c.alpha[h]), str(c.reason[h]), ref, f"head {h}", s_O[h] * s_V[k])
        if ref["norm"] > 0 and ref["rho"] > 1e-5:
            # ‖T‖ in the weights' units, and the eigenvalues of VᵀO (nonzero eigenvalues of T), rescaled back.
            assert float(c.norm[h]) / (s_O[h] * s_V[k]) == pytest.approx(ref["norm"], rel=1e-9)
            ev = torch.linalg.eigvals(V[k].T @ O[h]).abs().sort(descending=True).values
            got = (c.eigenvalues[h].abs() / (s_O[h] * s_V[k])).sort(descending=True).values
            np.testing.assert_allclose(got.numpy(), ev.numpy(), atol=1e-6 * float(ev.max()) + 1e-300)


@settings(max_examples=40, **SETTINGS)
@given(st.sampled_from(DTYPES), st.integers(1, 4), st.integers(1, 8), st.integers(4, 64), st.data())
def test_closure_of_pairs_matches_dense_reference_at_any_scale(dtype, batch, r, d, data):
    d = max(d, r)
    lo, hi = LOG10_RANGE[dtype]
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 2**31 - 1)))
    s_O = [10.0 ** data.draw(st.floats(lo, hi)) for _ in range(batch)]
    s_V = [10.0 ** data.draw(st.floats(lo, hi)) for _ in range(batch)]
    O = torch.randn(batch, d, r, generator=g, dtype=F64)
    V = torch.randn(batch, d, r, generator=g, dtype=F64)
    Os = torch.stack([(O[b] * s_O[b]).to(dtype) for b in range(batch)])
    Vs = torch.stack([(V[b] * s_V[b]).to(dtype) for b in range(batch)])
    c = tli.closure((Vs, Os.transpose(-1, -2)))  # TL row form: W_V = V, W_O = Oᵀ
    assert c.P.shape == (batch,)
    for b in range(batch):
        ref = dense(Os[b].to(F64) / s_O[b], Vs[b].to(F64) / s_V[b])
        check_head(float(c.P[b]), float(c.alpha[b]), str(c.reason[b]), ref, f"pair {b}", s_O[b] * s_V[b])


@settings(max_examples=25, **SETTINGS)
@given(layers(dtypes=[torch.float32, torch.float64]))
def test_float32_products_do_not_overflow_at_any_scale(case):
    """compute_dtype=float32 at 1e±30 (float32 products overflow near 1e±9 without the rescaling)."""
    lh, O, V, s_O, s_V = case
    c = tli.closure(lh, compute_dtype="float32")
    for h in range(lh.n_heads):
        k = int(lh.kv_head_of[h])
        ref = dense(O[h], V[k])
        if not ref["norm"] > 0:
            assert math.isnan(float(c.P[h])) and str(c.reason[h]).startswith("zero head")
        elif ref["rho"] > 1e-2:
            assert str(c.reason[h]) == "", c.reason[h]
            assert abs(float(c.P[h]) - ref["P"]) <= 1e-3
            assert float(c.alpha[h]) / (s_O[h] * s_V[k]) == pytest.approx(
                ref["alpha"], abs=1e-3 * ref["norm_T2"] / ref["norm"]
            )


# --------------------------------------------------------------------------- the report, the mismatch and the algebra


@settings(max_examples=20, **SETTINGS)
@given(layers(max_d=32, max_r=6))
def test_report_mismatch_and_algebra_match_dense_reference_at_any_scale(case):
    lh, O, V, s_O, s_V = case
    rep = tli.idempotence_report(lh, nulls=4, algebra=True, progress=False)
    kv = lh.kv_head_of.tolist()
    heads = rep.heads.reset_index(drop=True)
    for h in range(lh.n_heads):
        row = heads.iloc[h]
        assert (row["layer"], row["head"]) == (0, h)
        ref = dense(O[h], V[kv[h]])
        check_head(float(row["P"]), float(row["alpha"]), str(row["reason"]), ref, f"report L0H{h}", s_O[h] * s_V[kv[h]])
    # mismatch: every pair T_ig = O_i V_gᵀ, g != kv(i)
    pairs = rep.tables["mismatch_pairs"]
    n_expected = sum(1 for i in range(lh.n_heads) for gk in range(lh.n_kv_heads) if gk != kv[i])
    assert len(pairs) == n_expected
    for _, p in pairs.iterrows():
        i, gk = int(p["head"]), int(p["v_head"])
        assert gk != kv[i]
        ref = dense(O[i], V[gk])
        check_head(float(p["P"]), float(p["alpha"]), str(p["reason"]), ref, f"mismatch {i},{gk}", s_O[i] * s_V[gk])
    # shared-value algebra: α_ij, P_ij of T_i T_j against T_i (same kv group)
    alg = rep.tables.get("algebra_pairs")
    if lh.n_heads == lh.n_kv_heads:
        assert alg is None or len(alg) == 0
        return
    for _, p in alg.iterrows():
        i, j = int(p["i"]), int(p["j"])
        k = kv[i]
        assert kv[j] == k
        Ti, Tj = O[i] @ V[k].T, O[j] @ V[k].T
        X = Ti @ Tj
        nTi, nX = float(torch.linalg.norm(Ti)), float(torch.linalg.norm(X))
        P_ij, a_ij, why = float(p["P_ij"]), float(p["alpha_ij"]), str(p["reason"])
        if not nTi > 0:
            assert math.isnan(P_ij) and why, (i, j, why)
            continue
        rho = nX / nTi**2
        if rho < 1e-9:
            assert math.isnan(P_ij) and a_ij == 0.0 and why, (i, j, why)
            continue
        if rho < 1e-5:
            continue
        inner = float((X * Ti).sum())
        assert why == "", why
        assert abs(P_ij - inner**2 / (nX**2 * nTi**2)) <= tol_P(rho)
        s = s_O[j] * s_V[k]  # α_ij scales like T_j
        assert abs(a_ij / s - inner / nTi**2) <= tol_P(rho) * nX / nTi


# --------------------------------------------------------------------------- the scramble and the search


@settings(max_examples=25, **SETTINGS)
@given(layers(max_d=32, max_r=6))
def test_scramble_draws_match_dense_reference_at_any_scale(case):
    lh, O, V, s_O, s_V = case
    sc = tli.orientation_scramble(lh, nulls=3, seed=1)
    rtol = rank_rtol(lh.d_model, lh.d_head)
    kv = lh.kv_head_of.tolist()
    for h in range(lh.n_heads):
        ref = dense(O[h], V[kv[h]])
        reason = str(sc.reason[h])
        if not ref["norm"] > 0:
            assert reason.startswith("zero head") and torch.isnan(sc.P_draws[h]).all()
            continue
        if ref["rho"] < 1e-5 or reason:
            continue  # (near-)nilpotent trained head, or span(O) ⟂ span(V): consistency only
        # S is kept by every draw and is in the weights' units.
        s = s_O[h] * s_V[kv[h]]
        sv = torch.linalg.svdvals(ref["T"])[: lh.d_head]
        k = int(min(sc.rank_O[h], sc.rank_V[h]))
        np.testing.assert_allclose((sc.S[h, :k] / s).numpy(), sv[:k].numpy(), rtol=1e-7)
        for j in range(3):
            Pd = float(sc.P_draws[h, j])
            T = dense_T_of_K(sc.K_draws[h, j] / s, sc.D[h], O[h], V[kv[h]], rtol)
            rho = float(torch.linalg.norm(T @ T) / torch.linalg.norm(T) ** 2)
            if math.isnan(Pd):  # a nilpotent orientation (‖KDK‖ <= rtol ‖K‖²)
                assert rho <= 10 * rtol, (h, j, rho)
            else:
                assert rho > 0.1 * rtol and abs(Pd - dense_P(T)) <= 1e-7 + 1e-13 / rho**2, (h, j, Pd, dense_P(T))


@settings(max_examples=12, **SETTINGS)
@given(layers(max_d=24, max_r=5))
def test_search_P_matches_dense_reference_at_any_scale(case):
    lh, O, V, s_O, s_V = case
    res = tli.constructive_search(lh, heads=[0], restarts=1, max_iters=25)
    row = res.table.iloc[0]
    ref = dense(O[0], V[int(lh.kv_head_of[0])])
    rtol = rank_rtol(lh.d_model, lh.d_head)
    why = str(row["search_reason"])
    if not ref["norm"] > 0:
        assert why.startswith("zero head") and math.isnan(float(row["P_searched"]))
        return
    if ref["rho"] >= 1e-5:
        assert abs(float(row["P"]) - ref["P"]) <= tol_P(ref["rho"])
    if why and not why.startswith("trained P undefined"):
        assert math.isnan(float(row["P_searched"]))
        return
    s = s_O[0] * s_V[int(lh.kv_head_of[0])]
    Pref = dense_P(dense_T_of_K(res.K[0] / s, res.D[0], O[0], V[int(lh.kv_head_of[0])], rtol))
    assert abs(float(row["P_searched"]) - Pref) <= 1e-7, (float(row["P_searched"]), Pref)
    if ref["rho"] >= 1e-5:
        assert float(row["P_searched"]) >= ref["P"] - 1e-6  # restart 0 starts at the trained orientation


# --------------------------------------------------------------------------- exact statements of the issue


@pytest.mark.parametrize(
    "dtype,scale", [(torch.float32, 1e30), (torch.float32, 1e-30), (torch.float64, 1e100), (torch.float64, 1e-100)]
)
def test_extreme_scales_give_the_scale_free_P_and_the_scaled_alpha(dtype, scale):
    g = torch.Generator().manual_seed(7)
    O = torch.randn(3, 48, 6, generator=g, dtype=F64)
    V = torch.randn(3, 48, 6, generator=g, dtype=F64)
    Os, Vs = (O * scale).to(dtype), (V * scale).to(dtype)
    c = tli.closure(LayerHeads(0, Os, Vs, kv_layout(3, 3)))
    # the same stored values brought back to ordinary size, in float64
    base = tli.closure(LayerHeads(0, Os.double() / scale, Vs.double() / scale, kv_layout(3, 3)))
    assert list(c.reason) == ["", "", ""]  # never "zero head", never NaN
    np.testing.assert_allclose(c.P.numpy(), base.P.numpy(), atol=1e-9)
    np.testing.assert_allclose((c.alpha / scale**2).numpy(), base.alpha.numpy(), rtol=1e-9)


def test_a_1e_minus_100_head_is_not_a_zero_head_but_an_exact_zero_is():
    g = torch.Generator().manual_seed(8)
    O = torch.randn(2, 16, 4, generator=g, dtype=F64)
    V = torch.randn(1, 16, 4, generator=g, dtype=F64)
    O[0] *= 1e-100
    O[1] = 0.0
    c = tli.closure(LayerHeads(0, O, V, kv_layout(2, 1)))
    ref = dense(O[0] / 1e-100, V[0])
    assert c.reason[0] == "" and abs(float(c.P[0]) - ref["P"]) < 1e-12
    assert float(c.alpha[0]) / 1e-100 == pytest.approx(ref["alpha"], rel=1e-10)
    assert c.reason[1].startswith("zero head") and math.isnan(float(c.P[1]))


def test_ordinary_weights_are_never_rescaled():
    """Weights of ordinary size keep the plain products bit for bit (the 0.1 numbers)."""
    from tl_idempotence.maths.closure import layer_grams

    g = torch.Generator().manual_seed(9)
    O = torch.randn(4, 32, 8, generator=g) / 32**0.5
    V = torch.randn(2, 32, 8, generator=g) / 32**0.5
    gr = layer_grams(O, V, kv_layout(4, 2))
    assert gr.e_O is None and gr.e_V is None
    O64, V64 = O.double(), V.double()
    assert torch.equal(gr.G_O, O64.transpose(-1, -2) @ O64)
    assert torch.equal(gr.M[1], V64[0].T @ O64[1])
