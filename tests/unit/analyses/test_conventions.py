"""How our P and α map onto other closure conventions (docs/definitions.md §11), on the heads of a real
TransformerLens model (a tiny GPT-2 TransformerBridge booted from a checkpoint folder; its report's numbers).

* A cos(OV², OV) probe on TransformerLens's row-form ``OV = W_V W_O`` (= Tᵀ) gives ``P = cos²`` and
  ``sign(α) = sign(cos)`` for every head.
* A BA-based tool works on ``M = Vᵀ O`` (d_head x d_head, for T = O Vᵀ = A B: M = B A): M has T's nonzero
  eigenvalues, but its α_M and P_M differ from T's in general, and change under ``V -> V G, O -> O G⁻ᵀ`` (which
  leaves T, and every number of the report, unchanged); for ``M = αI`` both conventions give P = 1 and the same α.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tl_idempotence as tli
from tl_idempotence.testing import bridge_from_dir, tiny_hf_dir

pytestmark = pytest.mark.bridge  # no HookedTransformer needed (its tests skip on 4.x): runs on both majors


def alpha_P(X: np.ndarray) -> tuple[float, float]:
    """α and P of a dense square matrix, from their definitions (SPEC 2)."""
    X2 = X @ X
    inner = float((X2 * X).sum())
    return inner / float((X * X).sum()), inner**2 / (float((X2 * X2).sum()) * float((X * X).sum()))


def cos(A: np.ndarray, B: np.ndarray) -> float:
    return float((A * B).sum() / (np.linalg.norm(A) * np.linalg.norm(B)))


@pytest.fixture(scope="module")
def model_and_report(tmp_path_factory):
    d = tiny_hf_dir(tmp_path_factory.mktemp("conv") / "tiny", arch="gpt2", n_layers=2, d_model=64, n_heads=4)
    m = bridge_from_dir(d)
    return m, tli.idempotence_report(m, progress=False)


def heads_of(m):
    for layer in range(m.cfg.n_layers):
        attn = m.blocks[layer].attn
        for h in range(m.cfg.n_heads):
            yield layer, h, attn.W_V[h].detach().double().numpy(), attn.W_O[h].detach().double().numpy()


def test_cos_probe_is_sqrt_P_with_the_sign_of_alpha(model_and_report):
    m, rep = model_and_report
    for layer, h, W_V, W_O in heads_of(m):
        OV = W_V @ W_O  # TransformerLens row form, d_model x d_model (= Tᵀ)
        c = cos(OV @ OV, OV)
        row = rep.heads.loc[f"L{layer}H{h}"]
        assert c**2 == pytest.approx(row["P"], rel=1e-9, abs=1e-15)
        assert np.sign(c) == np.sign(row["alpha"])
        a, P = alpha_P(OV.T)  # T = O Vᵀ = OVᵀ: the same numbers
        assert a == pytest.approx(row["alpha"], rel=1e-9) and P == pytest.approx(row["P"], rel=1e-9, abs=1e-15)


def test_ba_convention_shares_the_spectrum_not_alpha_or_P(model_and_report):
    m, rep = model_and_report
    differ = 0
    for layer, h, W_V, W_O in heads_of(m):
        O, V = W_O.T, W_V  # column form: T = O Vᵀ (d_model x d_model), M = Vᵀ O (d_head x d_head)
        T, M = O @ V.T, V.T @ O
        lam_T = np.linalg.eigvals(T)
        lam_T = lam_T[np.argsort(-np.abs(lam_T))][: M.shape[0]]
        lam_M = np.linalg.eigvals(M)
        np.testing.assert_allclose(np.sort_complex(lam_T), np.sort_complex(lam_M), rtol=1e-7, atol=1e-10)
        a_M, P_M = alpha_P(M)
        row = rep.heads.loc[f"L{layer}H{h}"]
        differ += abs(P_M - row["P"]) > 1e-3 and abs(a_M - row["alpha"]) > 1e-3 * abs(row["alpha"])
        # a reparametrization V -> V G, O -> O G^-T keeps T (and our α, P) but moves the BA numbers
        G = np.eye(M.shape[0]) + 0.5 * np.random.default_rng(layer * 10 + h).standard_normal(M.shape)
        O2, V2 = O @ np.linalg.inv(G).T, V @ G
        np.testing.assert_allclose(O2 @ V2.T, T, rtol=1e-9, atol=1e-12)
        assert alpha_P(O2 @ V2.T)[1] == pytest.approx(row["P"], rel=1e-7, abs=1e-12)
        assert abs(alpha_P(V2.T @ O2)[1] - P_M) > 1e-6
    assert differ == 8  # every head of the model


def test_ba_and_T_agree_when_M_is_alpha_identity():
    g = torch.Generator().manual_seed(0)
    V = torch.randn(32, 4, generator=g, dtype=torch.float64)
    alpha = -0.7
    O = alpha * V @ torch.linalg.inv(V.T @ V)  # M = Vᵀ O = α I, T² = α T
    M = (V.T @ O).numpy()
    np.testing.assert_allclose(M, alpha * np.eye(4), atol=1e-12)
    c = tli.closure((V, O.T))  # TransformerLens form: W_V [d_model, d_head], W_O [d_head, d_model]
    a_M, P_M = alpha_P(M)
    assert float(c.alpha) == pytest.approx(alpha, rel=1e-10) and float(c.P) == pytest.approx(1.0, rel=1e-10)
    assert a_M == pytest.approx(alpha, rel=1e-12) and P_M == pytest.approx(1.0, rel=1e-12)
