"""maths/ov_edits.py: the closure-only and closure-free versions of a head's OV (SPEC 2, 3, 13), against dense float64.

* ``z <- z Nᵀ`` (TransformerLens row form) is ``T' = O N Vᵀ`` (dense, on random inputs);
* closure-only: ``N = α (VᵀO)⁻¹`` (numpy), ``T_c² = α T_c`` and the range and kernel of ``T`` (dense); an exactly
  closed head (``M = αI``) gets ``N = I``; a singular ``M`` and a nilpotent head are refused with a reason;
* closure-free: ``⟨T_f², T_f⟩ = 0`` (dense), the change equals the dense ``‖T - T_f‖/‖T‖`` and no point of the
  constraint found by scipy's SLSQP (several starts) or by exact roots along random lines is nearer; the closed
  orthogonal head (``K = aI``, ``D = I``, where Newton steps along ``∇g`` only shrink ``K``) matches the optimum over
  diagonal ``K'`` found by a one-dimensional search; a rank-deficient head is refused.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.optimize import minimize, minimize_scalar

from tl_idempotence.core.heads import LayerHeads
from tl_idempotence.errors import OptionError
from tl_idempotence.maths.ov_edits import (
    CLOSURE_ONLY_RCOND,
    closure_free_edits,
    closure_only_edits,
    nearest_closure_free,
    principal_frame,
)

D_MODEL, R = 20, 4


def layer(seed=0, closed_alpha=-2.5):
    """4 query heads on 2 kv heads; head 0 exactly closed (O = a V (VᵀV)⁻¹: T = a Π, orthogonal), head 1 near it."""
    g = torch.Generator().manual_seed(seed)
    V = torch.randn(2, D_MODEL, R, generator=g, dtype=torch.float64)
    O = torch.randn(4, D_MODEL, R, generator=g, dtype=torch.float64)
    pinv = V[0] @ torch.linalg.inv(V[0].T @ V[0])
    O[0] = closed_alpha * pinv
    O[1] = 1.5 * pinv + 0.05 * O[1]
    return LayerHeads(0, O, V, torch.tensor([0, 0, 1, 1]))


def dense(lh, h, N):
    O, V = lh.O[h].numpy(), lh.V[int(lh.kv_head_of[h])].numpy()
    return O, V, O @ V.T, O @ N.numpy() @ V.T


def alpha_of(T):
    return np.sum((T @ T) * T) / np.sum(T * T)


def test_z_times_N_transposed_is_O_N_V_transposed():
    lh = layer()
    e = closure_only_edits(lh)
    x = np.random.default_rng(0).standard_normal((7, D_MODEL))  # residual rows (TL row form)
    for h in range(4):
        O, V, _, Tp = dense(lh, h, e.N[h])
        z = x @ V  # the head's z (one source, attention 1)
        np.testing.assert_allclose((z @ e.N[h].numpy().T) @ O.T, (Tp @ x.T).T, rtol=1e-10, atol=1e-10)


def test_closure_only_is_alpha_idempotent_with_the_range_and_kernel_of_T():
    lh = layer()
    e = closure_only_edits(lh)
    assert (e.reason == "").all()
    for h in range(4):
        O, V, T, Tc = dense(lh, h, e.N[h])
        a = alpha_of(T)
        np.testing.assert_allclose(e.N[h].numpy(), a * np.linalg.inv(V.T @ O), rtol=1e-9, atol=1e-12 * abs(a))
        assert float(e.alpha[h]) == pytest.approx(a, rel=1e-10)
        np.testing.assert_allclose(Tc @ Tc, a * Tc, atol=1e-9 * np.abs(a * Tc).max())
        Q_O, Q_V = np.linalg.qr(O)[0], np.linalg.qr(V)[0]
        assert np.abs(Tc - Q_O @ Q_O.T @ Tc).max() < 1e-9 * np.abs(Tc).max()  # range(T_c) = span(O)
        assert np.abs(Tc - Tc @ Q_V @ Q_V.T).max() < 1e-9 * np.abs(Tc).max()  # kernel ⊇ span(V)^⊥
        assert np.linalg.matrix_rank(Tc) == R
        assert float(e.rel_change[h]) == pytest.approx(np.linalg.norm(T - Tc) / np.linalg.norm(T), rel=1e-9)
        assert float(e.alpha_after[h]) == pytest.approx(a, rel=1e-9) and float(e.P_after[h]) == pytest.approx(
            1, abs=1e-9
        )


def test_an_exactly_closed_head_is_its_own_closure_only_version():
    e = closure_only_edits(layer())
    np.testing.assert_allclose(e.N[0].numpy(), np.eye(R), atol=1e-13)
    assert float(e.rel_change[0]) < 1e-13 and float(e.rel_change[1]) > 0.01


def test_closure_only_refuses_a_singular_M_and_a_nilpotent_head():
    lh = layer()
    O, V = lh.O.clone(), lh.V.clone()
    Q = torch.linalg.qr(V[1])[0]
    O[2] = O[2] - Q @ (Q.T @ O[2])  # span(O) ⟂ span(V): M = 0, α = 0
    O[3][:, 0] = O[3][:, 0] - Q @ torch.linalg.lstsq(Q, O[3][:, 0:1]).solution[:, 0]  # one column ⟂ span(V)
    e = closure_only_edits(LayerHeads(0, O, V, lh.kv_head_of))
    assert "α = 0" in e.reason[2] and "no closure-only version" in e.reason[2]
    assert "ill-conditioned" in e.reason[3] and f"{CLOSURE_ONLY_RCOND:g}" in e.reason[3]
    assert torch.isnan(e.N[2]).all() and torch.isnan(e.N[3]).all() and torch.isnan(e.rel_change[2:]).all()
    assert e.reason[0] == "" and closure_only_edits(lh, [1]).reason[0] == "not asked"
    with pytest.raises(OptionError, match="not heads of layer 0"):
        closure_only_edits(lh, [4])


def g_of(K, d):
    return float(np.sum(((K * d) @ K) * K))


def grad_of(K, d):
    return (K * d) @ K + (K @ K.T) * d[None, :] + d[:, None] * (K.T @ K)


def slsqp_best(K, d, starts=3):
    """The nearest point of g = 0 scipy's SLSQP finds from several seeded starts (relative distance)."""
    r, rng, best = K.shape[0], np.random.default_rng(1), np.inf
    cons = {
        "type": "eq",
        "fun": lambda x: g_of(x.reshape(r, r), d),
        "jac": lambda x: grad_of(x.reshape(r, r), d).ravel(),
    }
    for _ in range(starts):
        x0 = (K + 0.3 * rng.standard_normal(K.shape) * np.linalg.norm(K) / r).ravel()
        res = minimize(
            lambda x: 0.5 * np.sum((x - K.ravel()) ** 2), x0, jac=lambda x: x - K.ravel(), method="SLSQP",
            constraints=[cons], options={"ftol": 1e-14, "maxiter": 500},
        )  # fmt: skip
        if res.success and abs(g_of(res.x.reshape(r, r), d)) < 1e-9 * np.linalg.norm(K) ** 3:
            best = min(best, np.linalg.norm(res.x - K.ravel()) / np.linalg.norm(K))
    return best


def line_search_best(K, d, n=100):
    """The nearest root of g along n seeded random lines through K (relative distance)."""
    rng, best = np.random.default_rng(2), np.inf
    for _ in range(n):
        E = rng.standard_normal(K.shape)
        E /= np.linalg.norm(E)
        coef = [g_of(E, d), float(np.sum(grad_of(E, d) * K)), float(np.sum(grad_of(K, d) * E)), g_of(K, d)]
        for t in np.roots(coef):
            if abs(t.imag) < 1e-12:
                best = min(best, abs(t.real) / np.linalg.norm(K))
    return best


def test_closure_free_has_no_closure_and_is_the_nearest_point_found():
    lh = layer()
    e = closure_free_edits(lh)
    for h in range(1, 4):
        assert e.reason[h] == ""
        _, _, T, Tf = dense(lh, h, e.N[h])
        assert abs(np.sum((Tf @ Tf) * Tf)) <= 1e-11 * np.linalg.norm(Tf) ** 3  # ⟨T_f², T_f⟩ = 0: α = P = 0
        assert abs(float(e.alpha_after[h])) < 1e-10 and float(e.P_after[h]) < 1e-20
        rel = np.linalg.norm(T - Tf) / np.linalg.norm(T)
        assert float(e.rel_change[h]) == pytest.approx(rel, rel=1e-8)
        fr = principal_frame(lh.O[h], lh.V[int(lh.kv_head_of[h])])
        K, dg = fr.K.numpy(), fr.D.numpy()
        assert rel <= slsqp_best(K, dg) + 1e-8
        assert rel <= line_search_best(K, dg) + 1e-12
    assert float(e.rel_change[1]) > 0.3  # a nearly closed head needs a large change


def test_a_closed_orthogonal_head_matches_the_best_diagonal_point():
    """K = aI, D = I: the nearest point of Σ y_i³ = 0 to (a, ..., a) among diagonal K' (k entries p, r - k entries
    -p (k/(r-k))^(1/3)), by a one-dimensional search for each k; the search may not do worse."""
    e = closure_free_edits(layer(), [0])
    assert e.reason[0] == ""
    r = R

    def dist(p, k):
        q = -p * (k / (r - k)) ** (1 / 3)
        return np.sqrt(k * (p - 1) ** 2 + (r - k) * (q - 1) ** 2) / np.sqrt(r)

    best = min(
        minimize_scalar(dist, bounds=(0, 3), args=(k,), method="bounded", options={"xatol": 1e-12}).fun
        for k in range(1, r)
    )
    assert float(e.rel_change[0]) <= best + 1e-9
    assert float(e.rel_change[0]) == pytest.approx(best, rel=1e-6)


def test_nearest_closure_free_leaves_a_point_of_the_cone_and_refuses_nonsense():
    K = np.diag([1.0, -1.0, 0.5, -0.5])  # g = Σ d_i K_ii³ = 0 with D = I
    s = nearest_closure_free(K, np.ones(4))
    np.testing.assert_allclose(s.K_free, K, atol=1e-12)
    assert s.reason == "" and s.iterations == 0
    with pytest.raises(OptionError):
        nearest_closure_free(np.zeros((3, 3)), np.ones(3))
    with pytest.raises(OptionError):
        nearest_closure_free(np.eye(3), np.ones(2))


def test_a_rank_deficient_head_has_no_closure_free_version():
    lh = layer()
    O = lh.O.clone()
    O[2][:, 3] = O[2][:, 0] + O[2][:, 1]
    e = closure_free_edits(LayerHeads(0, O, lh.V, lh.kv_head_of), [2])
    assert "rank-deficient" in e.reason[2] and "rank O = 3" in e.reason[2] and torch.isnan(e.N[2]).all()
