"""The tied-embedding algebra of SPEC 12, checked numerically (docs/definitions.md, "What a head does to tokens").

* On a tied tiny Llama/GQA bridge (``tie_word_embeddings=True``: ``W_U`` is ``W_Eᵀ``, 9 query heads on 3 kv
  heads), the G = I copying score of every head equals ``Re Σλ / Σ|λ|`` of a dense float64 eig of ``Tᵀ = W_V W_O``
  (``d_model x d_model``).
* A constructed head ``T = α Π`` with ``Π`` an orthogonal projection has real copying exactly ``sign(α)`` on a tied
  model with random ``W_E`` (both signs of α); an oblique projection (``Π² = Π ≠ Πᵀ``) built so that
  ``Vᵀ G U = diag(1, -1/2)`` has real copying ``sign(α)/3``, while its G = I score stays ``sign(α)``.
* :func:`embedding_tie` tells exact, rounding-level and real differences apart.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tl_idempotence as tli
from tl_idempotence.errors import UnsupportedModelError, WeightError
from tl_idempotence.probes.roles import copying_scores
from tl_idempotence.probes.tied import embedding_tie, own_copying_scores
from tl_idempotence.testing import bridge_from_dir, tiny_hf_dir

pytestmark = pytest.mark.filterwarnings("ignore:HookedTransformer is deprecated:DeprecationWarning")

D_MODEL, D_HEAD = 16, 4


def hooked(seed: int = 0, n_heads: int = 2):
    """An attention-only HookedTransformer (1 layer, d_model 16, d_head 4, d_vocab 40) with W_U = W_Eᵀ (tied)."""
    try:
        from transformer_lens import HookedTransformer, HookedTransformerConfig
    except ImportError as e:  # pragma: no cover - transformer-lens 4.x
        pytest.skip(f"transformer-lens 4.x has no HookedTransformer: {e}")
    cfg = HookedTransformerConfig(
        n_layers=1, d_model=D_MODEL, n_ctx=16, d_head=D_HEAD, n_heads=n_heads, d_vocab=40, attn_only=True,
        normalization_type=None, act_fn="relu", seed=seed,
    )  # fmt: skip
    m = HookedTransformer(cfg)
    with torch.no_grad():
        m.unembed.W_U.copy_(m.embed.W_E.T)
    return m


def dense_copying(M: torch.Tensor) -> float:
    lam = torch.linalg.eigvals(M.double())
    return float(lam.real.sum() / lam.abs().sum())


def test_own_copying_is_the_dense_eigenvalue_score_of_T_on_a_tied_gqa_model(tmp_path):
    d = tiny_hf_dir(tmp_path / "tied", n_layers=2, tie_word_embeddings=True)
    m = bridge_from_dir(d)
    tie = embedding_tie(m)
    assert (tie.tied, tie.how, tie.max_abs_diff) == (True, "exact", 0.0)
    table, info = own_copying_scores(m)
    assert len(table) == 18 and info.n_heads == 9 and list(table.index[:2]) == ["L0H0", "L0H1"]
    n_kv = 3
    for layer in range(2):
        attn = m.blocks[layer].attn
        W_V = getattr(attn, "_W_V", None)
        W_V = attn.W_V if W_V is None or W_V.shape[0] != n_kv else W_V
        for h in range(9):
            kv = h // 3
            V = W_V[kv] if W_V.shape[0] == n_kv else W_V[h]
            Tt = V.detach().double() @ attn.W_O[h].detach().double()  # [d_model, d_model] = Tᵀ (row form)
            want = dense_copying(Tt)
            got = table.loc[f"L{layer}H{h}", "copying_own"]
            assert got == pytest.approx(want, abs=1e-10), (layer, h)
            assert table.loc[f"L{layer}H{h}", "kv_head"] == kv
    # the scores are not all one number (a random model's T is not a projection)
    assert table["copying_own"].std() > 0.05


def orthonormal(gen: torch.Generator, d: int, r: int) -> torch.Tensor:
    return torch.linalg.qr(torch.randn(d, r, generator=gen, dtype=torch.float64))[0]


def test_orthogonal_projection_gives_copying_sign_alpha_exactly_on_a_tied_model():
    m = hooked(seed=1)
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for h, alpha in ((0, -2.0), (1, 0.7)):
            Q = orthonormal(gen, D_MODEL, D_HEAD)  # W_V W_O = α Q Qᵀ = α Π, Π orthogonal (Π = Πᵀ = Π²)
            m.blocks[0].attn.W_V[h].copy_(Q.float())
            m.blocks[0].attn.W_O[h].copy_((alpha * Q.T).float())
    assert embedding_tie(m).how == "exact"
    real, _, _ = copying_scores(m)
    own, _ = own_copying_scores(m)
    np.testing.assert_allclose(real["copying"].to_numpy(), [-1.0, 1.0], atol=1e-6)
    np.testing.assert_allclose(own["copying_own"].to_numpy(), [-1.0, 1.0], atol=1e-6)
    rep = tli.idempotence_report(m, progress=False)
    np.testing.assert_allclose(rep.heads["alpha"].to_numpy(), [-2.0, 0.7], rtol=1e-5)
    np.testing.assert_allclose(rep.heads["P"].to_numpy(), [1.0, 1.0], atol=1e-6)


def test_an_oblique_projection_can_give_copying_below_one_in_size():
    """Π = U Vᵀ with Vᵀ U = I (an oblique projection of rank 2) and Vᵀ G U = N = diag(1, -1/2), G = W_Eᵀ W_E: the
    full OV circuit's nonzero eigenvalues are α·(1, -1/2), copying = sign(α)·(1 - 1/2)/(1 + 1/2) = sign(α)/3."""
    m = hooked(seed=2)
    E = m.embed.W_E.detach().double()
    G = E.T @ E
    gen = torch.Generator().manual_seed(7)
    U = torch.randn(D_MODEL, 2, generator=gen, dtype=torch.float64)
    N = torch.diag(torch.tensor([1.0, -0.5], dtype=torch.float64))
    Vt = torch.cat([torch.eye(2, dtype=torch.float64), N], 1) @ torch.linalg.pinv(torch.cat([U, G @ U], 1))
    torch.testing.assert_close(Vt @ U, torch.eye(2, dtype=torch.float64))
    torch.testing.assert_close(Vt @ G @ U, N)
    Pi = U @ Vt
    torch.testing.assert_close(Pi @ Pi, Pi)  # a projection ...
    assert float((Pi - Pi.T).abs().max()) > 0.1  # ... that is not orthogonal
    W_V = torch.zeros(D_MODEL, D_HEAD, dtype=torch.float64)
    W_V[:, :2] = U
    W_O = torch.zeros(D_HEAD, D_MODEL, dtype=torch.float64)
    W_O[:2] = Vt
    with torch.no_grad():
        for h, alpha in ((0, 1.5), (1, -0.4)):
            m.blocks[0].attn.W_V[h].copy_(W_V.float())
            m.blocks[0].attn.W_O[h].copy_((alpha * W_O).float())
    real, _, _ = copying_scores(m)
    own, _ = own_copying_scores(m)
    np.testing.assert_allclose(real["copying"].to_numpy(), [1 / 3, -1 / 3], atol=1e-4)
    np.testing.assert_allclose(own["copying_own"].to_numpy(), [1.0, -1.0], atol=1e-5)
    rep = tli.idempotence_report(m, progress=False)
    np.testing.assert_allclose(rep.heads["P"].to_numpy(), [1.0, 1.0], atol=1e-5)
    np.testing.assert_allclose(rep.heads["alpha"].to_numpy(), [1.5, -0.4], rtol=1e-4)


def test_embedding_tie_tells_exact_rounding_and_untied_apart():
    m = hooked()
    with torch.no_grad():
        m.unembed.W_U.copy_(torch.nextafter(m.embed.W_E.T, torch.tensor(float("inf"))))  # one ulp up everywhere
    t = embedding_tie(m)
    assert (t.tied, t.how) == (True, "float rounding") and 0 < t.max_abs_diff < 1e-6
    assert "within float rounding" in t.describe()
    with torch.no_grad():
        m.unembed.W_U[3, 5] += 1e-3
    t = embedding_tie(m)
    assert (t.tied, t.how) == (False, "untied") and t.max_abs_diff == pytest.approx(1e-3, rel=1e-2)
    assert t.to_dict()["how"] == "untied" and t.describe().startswith("does not tie")


def test_hostile_inputs():
    with pytest.raises(UnsupportedModelError, match="TransformerLens model"):
        own_copying_scores(torch.nn.Linear(2, 2))
    with pytest.raises(UnsupportedModelError, match="TransformerLens model"):
        embedding_tie(object())
    m = hooked()
    with torch.no_grad():
        m.blocks[0].attn.W_V[1, 2, 3] = float("nan")
    with pytest.raises(WeightError, match=r"layer 0.*head 1|L0H1"):
        own_copying_scores(m)
    m = hooked()
    with torch.no_grad():
        m.unembed.W_U[0, 0] = float("inf")
    with pytest.raises(WeightError, match="W_U"):
        embedding_tie(m)
