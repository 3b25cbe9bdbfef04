"""Closure maths (SPEC 2-3) against exact constructions and the dense float64 reference."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

import tl_idempotence as tli
from helpers import dense_closure, oblique_projection, principal_cosines
from tl_idempotence.core.factors import rank_rtol
from tl_idempotence.errors import OptionTypeError, WeightError
from tl_idempotence.maths.closure import CastBuffer, closure_from_grams, closure_sums, grams, layer_grams


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def pair(O: torch.Tensor, V: torch.Tensor):
    """(W_V, W_O) in TL row form from column-form (O, V)."""
    return V, O.transpose(-1, -2)


# ---------------------------------------------------------------- exact constructions


def test_oblique_projection_has_P_1_alpha_1():
    O, V = oblique_projection(40, 7, gen(1))
    c = tli.closure(pair(O, V))
    assert c.P.item() == pytest.approx(1.0, abs=1e-12)
    assert c.alpha.item() == pytest.approx(1.0, abs=1e-12)
    assert c.reason.item() == ""
    # its eigenvalues are exactly 1 (r times)
    assert torch.allclose(c.eigenvalues, torch.ones(7, dtype=torch.complex128), atol=1e-10)


@pytest.mark.parametrize("scale", [3.5, -0.25, 1e-3])
def test_scaled_projection_gives_alpha_c_same_P(scale):
    O, V = oblique_projection(30, 5, gen(2))
    c = tli.closure(pair(O * scale, V))
    assert c.alpha.item() == pytest.approx(scale, rel=1e-12)
    assert c.P.item() == pytest.approx(1.0, abs=1e-12)


def test_nilpotent_head_alpha_zero_P_nan_with_reason():
    d, r = 20, 4
    E = torch.eye(d, dtype=torch.float64)
    O = E[:, :r] @ torch.randn(r, r, generator=gen(3), dtype=torch.float64)
    V = E[:, r : 2 * r]  # span(O) ⊂ ker(Vᵀ): T² = 0 but T ≠ 0
    c = tli.closure(pair(O, V))
    assert c.alpha.item() == 0.0
    assert np.isnan(c.P.item())
    assert "nilpotent" in c.reason.item()
    assert c.norm.item() > 0


def test_zero_head_nan_with_reason():
    O = torch.zeros(16, 4, dtype=torch.float64)
    V = torch.randn(16, 4, generator=gen(4), dtype=torch.float64)
    c = tli.closure(pair(O, V))
    assert np.isnan(c.alpha.item()) and np.isnan(c.P.item())
    assert "zero head" in c.reason.item()
    assert c.rank_O.item() == 0 and c.rank_V.item() == 4


def test_degenerate_heads_in_a_batch_do_not_poison_others():
    g = gen(5)
    O = torch.randn(3, 16, 4, generator=g, dtype=torch.float64)
    V = torch.randn(3, 16, 4, generator=g, dtype=torch.float64)
    O[1] = 0
    c = tli.closure(pair(O, V))
    ref = dense_closure(O, V)
    assert np.isnan(c.P[1].item())
    for i in (0, 2):
        assert c.P[i].item() == pytest.approx(ref["P"][i].item(), rel=1e-10)
    assert list(c.reason) == ["", c.reason[1], ""]


def test_negative_alpha_is_kept():
    O, V = oblique_projection(25, 3, gen(6))
    c = tli.closure(pair(-2.0 * O, V))
    assert c.alpha.item() == pytest.approx(-2.0, rel=1e-12)


# ---------------------------------------------------------------- dense reference


def _rank_deficient(d: int, r: int, k: int, g: torch.Generator) -> torch.Tensor:
    return torch.randn(d, k, generator=g, dtype=torch.float64) @ torch.randn(k, r, generator=g, dtype=torch.float64)


@pytest.mark.parametrize(
    "d,r,rank_O,rank_V",
    [(48, 8, 8, 8), (96, 16, 16, 16), (300, 64, 64, 64), (600, 256, 256, 256), (64, 16, 10, 16), (64, 16, 12, 7)],
)
def test_every_field_matches_dense_reference(d, r, rank_O, rank_V):
    g = gen(d + r)
    O = _rank_deficient(d, r, rank_O, g)
    V = _rank_deficient(d, r, rank_V, g)
    c = tli.closure(pair(O, V))
    ref = dense_closure(O, V)
    for k in ["alpha", "P", "norm", "norm_T2", "inner"]:
        assert getattr(c, k).item() == pytest.approx(ref[k].item(), rel=1e-10), k
    assert c.rank_O.item() == rank_O and c.rank_V.item() == rank_V
    assert c.rank_O.item() == np.linalg.matrix_rank(O.numpy())
    # K: same singular values as T, ⟨KDK, K⟩ = ⟨T², T⟩, ‖KDK‖ = ‖T²‖
    K, D = c.K, c.D
    sv_T = torch.linalg.svdvals(ref["T"])[:r]
    sv_K = torch.linalg.svdvals(K)
    n = min(rank_O, rank_V)
    assert torch.allclose(sv_K[:n], sv_T[:n], rtol=1e-10, atol=1e-10 * sv_T[0].item())
    KDK = K @ torch.diag(D) @ K
    assert (KDK * K).sum().item() == pytest.approx(ref["inner"].item(), rel=1e-10)
    assert KDK.norm().item() == pytest.approx(ref["norm_T2"].item(), rel=1e-10)
    # D: cosines of the principal angles between span(V) and span(O) (scipy)
    cos_ref = principal_cosines(O, V)[:n]
    assert np.allclose(D[:n].numpy(), cos_ref, atol=1e-10)
    assert torch.all(D[n:] == 0)
    # nonzero eigenvalues of T = eigenvalues of Vᵀ O
    ev_T = torch.linalg.eigvals(ref["T"])
    ev_T = ev_T[ev_T.abs().argsort(descending=True)][:n]
    assert torch.allclose(c.eigenvalues[:n].abs(), ev_T.abs(), rtol=1e-8, atol=1e-8 * ev_T.abs()[0].item())


def test_reconstruction_from_principal_coordinates():
    """T = Q_O K Q_Vᵀ and T² = Q_O KDK Q_Vᵀ with Q's recovered from the returned factors."""
    g = gen(11)
    O = torch.randn(50, 6, generator=g, dtype=torch.float64)
    V = torch.randn(50, 6, generator=g, dtype=torch.float64)
    c = tli.closure(pair(O, V))
    ref = dense_closure(O, V)
    # Q_O, Q_V in principal coordinates: orthonormal bases with Q_Vᵀ Q_O = diag(D)
    Qo, _ = torch.linalg.qr(O)
    Qv, _ = torch.linalg.qr(V)
    U, S, Wh = torch.linalg.svd(Qv.T @ Qo)
    Qo, Qv = Qo @ Wh.T, Qv @ U
    assert torch.allclose(S, c.D, atol=1e-12)
    K = Qo.T @ ref["T"] @ Qv  # the principal-coordinate K up to signs of paired columns
    assert torch.allclose(torch.linalg.svdvals(K), torch.linalg.svdvals(c.K), rtol=1e-10)
    T2 = Qo @ (K @ torch.diag(S) @ K) @ Qv.T
    assert torch.allclose(T2, ref["T2"], rtol=1e-9, atol=1e-9 * ref["T2"].abs().max().item())


def test_batched_leading_dims_and_broadcast():
    g = gen(12)
    O = torch.randn(2, 3, 40, 8, generator=g, dtype=torch.float64)
    V = torch.randn(1, 3, 40, 8, generator=g, dtype=torch.float64)
    c = tli.closure(pair(O, V))
    assert c.P.shape == (2, 3) and c.K.shape == (2, 3, 8, 8) and c.reason.shape == (2, 3)
    ref = dense_closure(O, V.expand(2, 3, 40, 8))
    assert torch.allclose(c.P, ref["P"], rtol=1e-10)
    assert c[1, 2].P.item() == pytest.approx(ref["P"][1, 2].item(), rel=1e-10)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_low_precision_input_gives_float64_on_the_stored_values(dtype):
    g = gen(13)
    O = torch.randn(64, 8, generator=g).to(dtype)
    V = torch.randn(64, 8, generator=g).to(dtype)
    c = tli.closure(pair(O, V))
    assert c.P.dtype == torch.float64 and c.alpha.dtype == torch.float64
    ref = dense_closure(O.double(), V.double())  # exactly the stored values, in float64
    assert c.P.item() == pytest.approx(ref["P"].item(), rel=1e-10)
    assert c.rtol == rank_rtol(64, 8)
    # the tolerance does not depend on the storage dtype (same ranks for fp32/fp16/bf16 copies)
    assert c.rtol == tli.closure(pair(O.double(), V.double())).rtol == 64 * torch.finfo(torch.float32).eps


def test_float32_products_accuracy_bound():
    g = gen(14)
    O = torch.randn(16, 512, 64, generator=g)
    V = torch.randn(16, 512, 64, generator=g)
    c64 = closure_from_grams(grams(O, V))
    c32 = closure_from_grams(grams(O, V, compute_dtype=torch.float32))
    rel = ((c32.alpha - c64.alpha).abs() / c64.alpha.abs()).max().item()
    assert rel < 1e-3
    assert (c32.P - c64.P).abs().max().item() < 1e-5


def test_factored_matrix_input_equals_pair():
    from transformer_lens import FactoredMatrix

    g = gen(15)
    W_V = torch.randn(4, 32, 8, generator=g)
    W_O = torch.randn(4, 8, 32, generator=g)
    a = tli.closure(FactoredMatrix(W_V, W_O))
    b = tli.closure((W_V, W_O))
    assert torch.equal(a.P, b.P) and torch.equal(a.alpha, b.alpha)
    ref = dense_closure(W_O.transpose(-1, -2), W_V)
    assert torch.allclose(a.P, ref["P"], rtol=1e-10)


def test_rotation_of_residual_basis_leaves_alpha_and_P_unchanged():
    g = gen(16)
    O = torch.randn(5, 64, 8, generator=g, dtype=torch.float64)
    V = torch.randn(5, 64, 8, generator=g, dtype=torch.float64)
    R, _ = torch.linalg.qr(torch.randn(64, 64, generator=g, dtype=torch.float64))
    a = tli.closure(pair(O, V))
    b = tli.closure(pair(R @ O, R @ V))
    assert torch.allclose(a.P, b.P, rtol=1e-10) and torch.allclose(a.alpha, b.alpha, rtol=1e-10)
    assert torch.allclose(a.D, b.D, atol=1e-10)


def test_layer_grams_matches_expanded_pairs():
    g = gen(17)
    O = torch.randn(9, 48, 8, generator=g, dtype=torch.float64)
    V = torch.randn(3, 48, 8, generator=g, dtype=torch.float64)
    kv = torch.arange(9) // 3
    a = closure_from_grams(layer_grams(O, V, kv))
    b = closure_from_grams(grams(O, V[kv]))
    assert torch.allclose(a.P, b.P, rtol=1e-12) and torch.allclose(a.alpha, b.alpha, rtol=1e-12)


@pytest.mark.parametrize(
    "kv",
    [torch.arange(9) // 3, torch.tensor([0, 1, 2, 0, 1, 2, 0, 1, 2]), torch.tensor([2, 2, 0, 1, 0, 2, 1, 1, 0])],
    ids=["contiguous", "interleaved", "scattered"],
)
def test_layer_grams_any_kv_layout_equals_per_head_products(kv):
    # M is computed per kv group (a slice for contiguous groups, an index otherwise) and the rank of
    # G_V once per kv head: every head must get exactly its own products and ranks.
    g = gen(18)
    O = torch.randn(9, 48, 8, generator=g, dtype=torch.float64)
    V = torch.randn(3, 48, 8, generator=g, dtype=torch.float64)
    V[1, :, 5:] = 0  # kv head 1 has rank 5: a wrong kv lookup shows up in rank_V
    lg = layer_grams(O, V, kv)
    assert lg.kv_head_of is not None and lg.kv_head_of.tolist() == kv.tolist()
    for h in range(9):
        Vh = V[kv[h]]
        assert torch.equal(lg.M[h], Vh.T @ O[h]) and torch.equal(lg.G_V[h], Vh.T @ Vh)
    a = closure_from_grams(lg)
    assert a.rank_V.tolist() == [5 if int(k) == 1 else 8 for k in kv]
    b = closure_from_grams(grams(O, V[kv]))
    assert torch.equal(a.P, b.P) and torch.equal(a.alpha, b.alpha) and torch.equal(a.rank_V, b.rank_V)
    sub = closure_from_grams(lg.index(torch.tensor([4, 0])))
    assert sub.rank_V.tolist() == a.rank_V[[4, 0]].tolist()


def _checkpoint_layer(seed: int, n_heads: int, n_kv: int, d_model: int, d_head: int, dtype: torch.dtype):
    """O as a checkpoint gives it: a strided view of o_proj [d_model, n_heads * d_head] split into heads."""
    g = gen(seed)
    o_proj = torch.randn(d_model, n_heads * d_head, generator=g).to(dtype)
    O = o_proj.reshape(d_model, n_heads, d_head).permute(1, 0, 2)
    V = torch.randn(n_kv * d_head, d_model, generator=g).to(dtype).reshape(n_kv, d_head, d_model).transpose(1, 2)
    return O, V, torch.arange(n_heads) // (n_heads // n_kv)


def test_cast_buffer_gives_the_same_bits_layer_after_layer():
    """A report loop reuses one block of memory for every layer's compute-dtype copy of O (CastBuffer):
    each layer's Grams must equal, bit for bit, those computed with a fresh copy — whatever came before
    in the buffer (other values, another shape, another dtype) — and the block is reused when it fits."""
    buf = CastBuffer()
    layers = [
        (_checkpoint_layer(1, 8, 2, 64, 16, torch.bfloat16), torch.float64),
        (_checkpoint_layer(2, 8, 2, 64, 16, torch.bfloat16), torch.float64),  # same shape: same block
        (_checkpoint_layer(3, 8, 2, 64, 16, torch.float16), torch.float32),  # other compute dtype
        (_checkpoint_layer(4, 6, 3, 40, 8, torch.float32), torch.float64),  # other shape
        (_checkpoint_layer(5, 6, 3, 40, 8, torch.float32), torch.float64),
    ]
    ptrs = []
    for (O, V, kv), dt in layers:
        fresh = layer_grams(O, V, kv, compute_dtype=dt)
        reused = layer_grams(O, V, kv, compute_dtype=dt, buffer=buf)
        for name in ("G_O", "G_V", "M"):
            assert torch.equal(getattr(fresh, name), getattr(reused, name)), name
        held = buf.get(O.shape, dt, O.device)
        assert held.dtype == dt and held.shape == O.shape and held.is_contiguous()
        ptrs.append(held.data_ptr())
    assert ptrs[0] == ptrs[1] and ptrs[3] == ptrs[4]  # reused while the shape and dtype stay
    # weights already in the compute dtype and contiguous are used as they are (no copy into the buffer)
    O = torch.randn(4, 32, 8, generator=gen(6), dtype=torch.float64)
    V = torch.randn(2, 32, 8, generator=gen(7), dtype=torch.float64)
    kv = torch.arange(4) // 2
    before = buf.get((4, 32, 8), torch.float64, O.device).fill_(float("nan"))
    g = layer_grams(O, V, kv, buffer=buf)
    assert torch.isnan(before).all() and torch.equal(g.G_O, O.transpose(-1, -2) @ O)


def test_cast_buffer_leaves_autograd_of_earlier_layers_intact():
    """Weights that require grad get their own copy: reusing the buffer for a later layer must not break the
    backward pass of an earlier layer's Grams (an in-place overwrite would)."""
    buf = CastBuffer()
    O1, V1, kv = _checkpoint_layer(9, 4, 2, 32, 8, torch.float32)
    O2, V2, _ = _checkpoint_layer(10, 4, 2, 32, 8, torch.float32)
    O1, O2 = O1.clone().requires_grad_(), O2.clone().requires_grad_()
    g1 = layer_grams(O1, V1, kv, buffer=buf)
    layer_grams(O2, V2, kv, buffer=buf)
    g1.G_O.diagonal(dim1=-2, dim2=-1).sum().backward()
    assert torch.allclose(O1.grad, 2 * O1.detach(), rtol=1e-6)  # d/dO sum_ij O_ij^2 = 2 O


def test_cast_buffer_is_not_used_on_the_rescaled_path():
    """Heads whose Gram diagonals leave the safe range are recomputed rescaled by powers of two (no buffer);
    the buffer's first (overflowing) pass must not leak into the result."""
    O, V, kv = _checkpoint_layer(8, 4, 2, 32, 8, torch.float32)
    O = O * 1e30  # squares overflow float32 products
    fresh = layer_grams(O, V, kv, compute_dtype=torch.float32)
    reused = layer_grams(O, V, kv, compute_dtype=torch.float32, buffer=CastBuffer())
    assert fresh.e_O is not None and bool((fresh.e_O != 0).all())
    for name in ("G_O", "G_V", "M", "e_O"):
        assert torch.equal(getattr(fresh, name), getattr(reused, name)), name
    assert torch.isfinite(closure_from_grams(reused).P).all()


def test_closure_sums_are_the_dense_norms_and_inner_product():
    """closure_sums gives ‖T‖², ⟨T², T⟩, ‖T²‖² of T = O Vᵀ (no degeneracy rule: a nilpotent T gives 0s)."""
    g = gen(21)
    O = torch.randn(3, 40, 6, generator=g, dtype=torch.float64)
    V = torch.randn(3, 40, 6, generator=g, dtype=torch.float64)
    O[2], V[2] = 0.0, 0.0
    O[2, 0, 0], V[2, 1, 0] = 1.0, 1.0  # T = e0 e1ᵀ: nilpotent, T² = 0
    G = grams(O, V)
    norm2, inner, norm2_T2 = closure_sums(G.G_O, G.G_V, G.M)
    T = O @ V.transpose(-1, -2)
    T2 = T @ T
    assert torch.allclose(norm2, (T * T).sum((-1, -2)), rtol=1e-12)
    assert torch.allclose(inner, (T2 * T).sum((-1, -2)), rtol=1e-12, atol=1e-12)
    assert torch.allclose(norm2_T2, (T2 * T2).sum((-1, -2)), rtol=1e-12, atol=1e-12)
    assert norm2[2] == 1.0 and inner[2] == 0.0 and norm2_T2[2] == 0.0


def test_random_gaussian_heads_have_small_P():
    """SPEC 2: a random Gaussian head gives P = O(1/r²) on average."""
    g = gen(18)
    r = 32
    O = torch.randn(200, 256, r, generator=g, dtype=torch.float64)
    V = torch.randn(200, 256, r, generator=g, dtype=torch.float64)
    P = tli.closure(pair(O, V), factors=False).P
    assert 0.1 / r**2 < P.mean().item() < 10 / r**2


# ---------------------------------------------------------------- bad input


def test_bad_inputs_raise_clear_errors():
    W_V = torch.randn(32, 8)
    W_O = torch.randn(8, 32)
    with pytest.raises(WeightError, match="do not pair"):
        tli.closure((W_O, W_V.T.contiguous()[:4]))
    with pytest.raises(WeightError, match="do not pair"):
        tli.closure((W_V, torch.randn(8, 31)))
    with pytest.raises(OptionTypeError, match="FactoredMatrix"):
        tli.closure(W_V)
    with pytest.raises(OptionTypeError, match=r"torch\.Tensor or numpy"):
        tli.closure(([1.0], [2.0]))
    with pytest.raises(WeightError, match="broadcast"):
        tli.closure((torch.randn(3, 32, 8), torch.randn(2, 8, 32)))
    bad = W_V.clone()
    bad[5, 2] = float("nan")
    with pytest.raises(WeightError, match="NaN or inf"):
        tli.closure((bad, W_O))
    # integer weights: a WeightError (a ValueError, no longer a TypeError) naming the dtype
    with pytest.raises(WeightError, match=r"torch\.int64.*real floating point"):
        tli.closure((W_V.long(), W_O.long()))
    # the new error classes keep the built-in bases callers catch
    assert issubclass(WeightError, ValueError) and issubclass(OptionTypeError, TypeError)


def test_numpy_input_accepted():
    g = np.random.default_rng(0)
    W_V = g.standard_normal((32, 8))
    W_O = g.standard_normal((8, 32))
    c = tli.closure((W_V, W_O))
    ref = dense_closure(torch.from_numpy(W_O.T), torch.from_numpy(W_V))
    assert c.P.item() == pytest.approx(ref["P"].item(), rel=1e-10)


# ---------------------------------------------------------------- edges of shape, stride and storage


def test_d_head_1_heads_equal_the_dense_T_on_every_route(tmp_path):
    """d_head = 1: O = W_Oᵀ keeps stride d_model in its size-1 last dim (the fingerprint's byte view refused it).
    LayerHeads, a safetensors checkpoint and a GGUF file: every head's P and α equal the dense T."""
    from helpers import assert_matches, llama_like, write_gguf_file

    d, O, V = llama_like(tmp_path / "ck", n_layers=2, nq=4, nkv=2, dm=16, dh=1)
    g = write_gguf_file(tmp_path / "m.gguf", O, V)
    kv = torch.arange(4) // 2
    lhs = [tli.LayerHeads(l, O[l], V[l], kv) for l in range(2)]
    assert lhs[0].fingerprint() != lhs[1].fingerprint() and len(lhs[0].fingerprint()) == 64
    for model in (lhs, str(d), str(g)):
        rep = tli.idempotence_report(model, nulls=4, progress=False)
        assert_matches(rep, O, V, 4, 2)
        # rank 1: T = o vᵀ, T² = (vᵀo) T, so P = 1 and α = vᵀo exactly
        np.testing.assert_allclose(rep.heads["P"].to_numpy(), 1.0, rtol=0, atol=1e-12)
        want = [float(V[l][kv[h], :, 0].double() @ O[l][h, :, 0].double()) for l in range(2) for h in range(4)]
        np.testing.assert_allclose(rep.heads["alpha"].to_numpy(), want, rtol=1e-6)  # checkpoints are float32


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (lambda t: t.to("meta"), "'meta' device"),
        (lambda t: t.to_sparse(), "sparse tensor (torch.sparse_coo)"),
        (lambda t: t.to_sparse_csr(), "sparse tensor (torch.sparse_csr)"),
    ],
    ids=["meta", "sparse_coo", "sparse_csr"],
)
def test_meta_and_sparse_tensors_are_refused_naming_them(make, says):
    W_V, W_O = torch.randn(16, 4, generator=gen(3)), torch.randn(4, 16, generator=gen(4))
    with pytest.raises(
        WeightError, match=re.escape(f"W_V is a {says}" if "sparse" in says else f"W_V is on the {says}")
    ):
        tli.closure((make(W_V), W_O))
    with pytest.raises(WeightError, match="W_O"):
        tli.closure((W_V, make(W_O)))
    with pytest.raises(WeightError, match="Layer 0: O"):
        tli.LayerHeads(
            0,
            make(W_O.T.contiguous())[None] if "sparse" not in says else make(W_O.T.contiguous()[None]),
            W_V[None],
            torch.tensor([0]),
        )


def test_shape_annotations_are_checked_while_the_tests_run():
    """tests/shapecheck.py instruments every shape annotation (jaxtyping + beartype): a non-square Gram product
    is refused by the annotation itself, so a wrong shape inside the library cannot pass silently in the tests."""
    import jaxtyping

    from tl_idempotence.maths.closure import closure_sums

    good = torch.eye(3, dtype=torch.float64)[None]
    closure_sums(good, good, good)
    with pytest.raises(jaxtyping.TypeCheckError):
        closure_sums(good, good, torch.ones(1, 3, 2, dtype=torch.float64))


def _grams_with_spectrum(s: torch.Tensor, d_model: int, seed: int) -> torch.Tensor:
    """``Xᵀ X`` for ``X [d_model, r]`` with singular values ``s`` ``[batch, r]`` in random orientations."""
    g = torch.Generator().manual_seed(seed)
    b, r = s.shape
    U, _ = torch.linalg.qr(torch.randn(b, d_model, r, generator=g, dtype=torch.float64))
    W, _ = torch.linalg.qr(torch.randn(b, r, r, generator=g, dtype=torch.float64))
    X = (U * s[:, None, :]) @ W.transpose(-1, -2)
    return X.transpose(-1, -2) @ X


@pytest.mark.parametrize("d_model, r", [(8, 1), (16, 4), (64, 16), (576, 64)])  # 4096 x 128: tests/integration
def test_gram_rank_equals_the_eigenvalue_rule(d_model, r):
    """The Cholesky certificate never changes a rank: every spectrum (well-conditioned, exact zeros, singular
    values at 0.5-2x and 10x the threshold, scales from subnormal Grams to 1e300, a zero Gram, Grams whose
    upper triangle is zero: both routines read the lower one) gives the rank the eigenvalues give;
    well-conditioned heads are decided without eigenvalues."""
    from tl_idempotence.core.factors import gram_eig, gram_rank

    rtol = rank_rtol(d_model, r)
    g = torch.Generator().manual_seed(r)
    rows = [torch.rand(r, generator=g, dtype=torch.float64) + 0.5 for _ in range(3)]  # well conditioned
    for k in (1, r // 2, r - 1):  # k smallest singular values near or below the threshold
        for f in (0.0, 1e-3, 0.5, 0.99, 1.0, 1.01, 2.0, 10.0, 1e3):
            row = torch.rand(r, generator=g, dtype=torch.float64) + 1.0
            row[0] = 1.5  # s_max
            if k and r > 1:
                row[-k:] = f * rtol * 1.5
            rows.append(row)
    s = torch.stack(rows)
    G = base = _grams_with_spectrum(s, d_model, seed=d_model)
    scales = [1e-160, 1e-155, 1e-30, 1e-8, 1.0, 1e8, 1e30, 1e150]  # Grams from subnormal to 1e300
    G = torch.cat([G * c**2 for c in scales] + [torch.tril(G)])  # tril: the upper triangle differs from the lower
    G = torch.cat([G, torch.zeros(1, r, r, dtype=torch.float64)])
    want = gram_eig(G, rtol, False)[2].sum(-1)
    assert torch.equal(gram_rank(G, rtol), want)
    assert torch.equal(gram_rank(G.reshape(1, -1, r, r), rtol), want.reshape(1, -1))  # any leading shape
    deficient = (want < r).sum()
    assert 0 < deficient < len(G) if r > 1 else True  # both kinds are in the table

    calls = []
    real = torch.linalg.eigvalsh
    try:
        torch.linalg.eigvalsh = lambda x, *a, **k: calls.append(x.shape[0]) or real(x, *a, **k)
        assert torch.equal(gram_rank(base[:3], rtol), torch.full((3,), r))
    finally:
        torch.linalg.eigvalsh = real
    assert calls == []  # three well-conditioned heads: proved by the Cholesky certificate alone


def test_gram_rank_of_a_subnormal_and_a_one_triangle_gram():
    """Two Grams on which a careless certificate would claim full rank: a subnormal one (its τ
    underflowed to 0) and one whose upper triangle is zero (the Gershgorin bound read both triangles)."""
    from tl_idempotence.core.factors import gram_eig, gram_rank

    d = 2.0**-1074
    G = torch.tensor([[1.0, 100.0], [100.0, 10001.0]], dtype=torch.float64) * d  # = XᵀX, X = √d [[1, 100], [0, 1]]
    for rtol in (1e-7, 1e-5, 1e-3, 1e-2):
        assert gram_rank(G, rtol).item() == gram_eig(G, rtol, False)[2].sum(-1).item() == 1
    r, rtol = 16, 1e-3
    v = torch.arange(1, r + 1, dtype=torch.float64) ** -0.5
    Gs = torch.outer(v, v)
    Gs += 0.99 * rtol**2 * torch.linalg.eigvalsh(Gs)[-1] * torch.eye(r, dtype=torch.float64)
    for M in (Gs, torch.tril(Gs)):
        assert gram_rank(M, rtol).item() == gram_eig(M, rtol, False)[2].sum(-1).item() == 1
