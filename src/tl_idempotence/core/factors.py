"""Numerical ranks and the principal-coordinate factorization from Gram products (SPEC section 3).

Column form throughout (``T = O Vᵀ``). With the Gram eigenbases
``G_O = Oᵀ O = W_O Λ_O W_Oᵀ`` and ``G_V = Vᵀ V = W_V Λ_V W_Vᵀ``, the orthonormal bases
of the spans are ``Q_O = O W_O Λ_O^{-1/2}`` and ``Q_V = V W_V Λ_V^{-1/2}`` (columns beyond
the numerical rank dropped), so ``T = Q_O K Q_Vᵀ`` and ``T² = Q_O (K D K) Q_Vᵀ`` with
``D = Q_Vᵀ Q_O`` (SPEC 3). Nothing ``d_model``-sized is formed here: every input is
``d_head x d_head``. Imports torch and jaxtyping only.
"""

from __future__ import annotations

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

__all__ = ["DEGENERATE_RTOL", "GRAM_RTOL_FLOOR", "gram_eig", "gram_rank", "principal_factors", "rank_rtol"]

#: The smallest relative singular value that Gram-based factors can resolve in
#: float64 (≈ sqrt(float64 eps), rounded up). Ranks never count singular values
#: below ``GRAM_RTOL_FLOOR * sigma_max``.
GRAM_RTOL_FLOOR = 1e-7

#: Relative tolerance of the degeneracy tests (zero / nilpotent head): the float64
#: noise level of the Gram-based norms (‖T‖ and ‖T²‖ carry an absolute error of about
#: sqrt(eps64) relative to ‖O‖‖V‖ and ‖T‖² respectively).
DEGENERATE_RTOL = GRAM_RTOL_FLOOR


def rank_rtol(d_model: int, d_head: int) -> float:
    """Relative tolerance for the numerical rank of O and V (dimensionless).

    ``rtol = max(max(d_model, d_head) · eps(float32), GRAM_RTOL_FLOOR)``: the NumPy
    ``matrix_rank`` default for a float32 matrix (the precision checkpoints are
    trained in), used for every storage dtype so that the fp32/fp16/bf16 copies of
    the same weights get the same ranks, and floored at the float64 resolution of the
    Gram products. A singular value ``s`` of O (or V) counts toward the rank when
    ``s > rtol · s_max``.

    Source: ours (SPEC section 3, "use the rank that is numerically there").
    """
    return max(max(int(d_model), int(d_head)) * torch.finfo(torch.float32).eps, GRAM_RTOL_FLOOR)


def gram_eig(
    G: Float[Tensor, "*batch r r"], rtol: float, vectors: bool
) -> tuple[Float[Tensor, "*batch r"], Float[Tensor, "*batch r r"] | None, Bool[Tensor, "*batch r"]]:
    """Singular values of a factor from its PSD Gram matrix ``G = Xᵀ X``.

    Args:
        G: ``[*batch, r, r]`` float64 Gram matrices.
        rtol: relative rank tolerance (:func:`rank_rtol`).
        vectors: also return the eigenvectors ``W`` (``G = W diag(s²) Wᵀ``).

    Returns:
        ``(s, W or None, mask)``: ``s = sqrt(max(eig(G), 0))`` ascending ``[*batch, r]``,
        eigenvectors ``[*batch, r, r]`` and the mask of singular values counted in the
        numerical rank (``s > rtol · s_max`` and ``s_max > 0``).
    """
    if vectors:
        lam, W = torch.linalg.eigh(G)
    else:
        lam, W = torch.linalg.eigvalsh(G), None
    s = lam.clamp_min(0).sqrt()
    smax = s.amax(-1, keepdim=True)
    mask = (s > rtol * smax) & (smax > 0)
    return s, W, mask


def gram_rank(G: Float[Tensor, "*batch r r"], rtol: float) -> Int[Tensor, " *batch"]:
    """Numerical rank of each factor from its Gram matrix: exactly ``gram_eig(G, rtol, False)[2].sum(-1)``.

    The rule is :func:`gram_eig`'s (a singular value ``s`` counts when ``s > rtol · s_max``); what
    differs is the work. Most heads of a trained model have full rank with room to spare, and for
    those a Cholesky factorization of ``G - τ I`` (3-5x cheaper than the eigenvalues at ``r = 128``)
    proves it: if it completes in float64, every eigenvalue of ``G`` exceeds ``τ`` minus the
    factorization's backward error ``γ_{r+1} trace(G)`` (Higham, *Accuracy and Stability of Numerical
    Algorithms*, Thm 10.3; no underflow), and ``τ`` is twice ``(rtol² + 2 r u) U + 2 (r+1) u trace(G)``
    with ``U ≥ λ_max`` (the smaller of the trace and the largest absolute row sum of the matrix both
    routines read: the lower triangle, mirrored) and ``u = 2⁻⁵³``, so the eigenvalues :func:`gram_eig`
    computes (backward error ``≤ r u λ_max``) pass its test too. Every head without that proof
    (rank-deficient, ill-conditioned, within a factor ~2 of the threshold, or ~2r when the trace is
    the bound; zero; so small that ``τ`` is near float64's subnormals; non-finite: these raise as the
    eigenvalue route does, the message counting only the heads without a proof) gets its eigenvalues
    computed and the rule applied to them as before.

    Args:
        G: ``[*batch, r, r]`` float64 Gram matrices (``Xᵀ X``; symmetric positive semidefinite).
        rtol: relative rank tolerance (:func:`rank_rtol`).

    Returns:
        ``[*batch]`` int64 ranks, equal to the eigenvalue route's
        (``tests/unit/core/test_closure.py::test_gram_rank_equals_the_eigenvalue_rule``: spectra around the
        threshold, scales 1e-160..1e150, Grams whose upper triangle differs from the lower).
    """
    r = G.shape[-1]
    lead = G.shape[:-2]
    flat = G.reshape(-1, r, r)
    rank = torch.full((flat.shape[0],), r, dtype=torch.int64, device=G.device)
    if flat.shape[0] == 0:
        return rank.reshape(lead)
    u = 2.0**-53
    tr = flat.diagonal(dim1=-2, dim2=-1).sum(-1)
    # U >= λ_max of the matrix eigvalsh and cholesky read (the lower triangle, mirrored): Gershgorin over its
    # rows, or the trace (valid for a PSD matrix; a factorization that completes proves G is PSD up to its
    # backward error, which the factor 1 + 1e-9 covers for r up to ~3000).
    low = torch.tril(flat).abs()
    rows = low.sum(-1) + low.sum(-2) - low.diagonal(dim1=-2, dim2=-1)
    U = torch.minimum(tr, rows.amax(-1)) * (1 + 1e-9)
    tau = 2 * ((rtol**2 + 2 * r * u) * U + 2 * (r + 1) * u * tr)
    eye = torch.eye(r, dtype=flat.dtype, device=flat.device)
    _, info = torch.linalg.cholesky_ex(flat - tau[:, None, None] * eye)
    # The error bound assumes no underflow: a τ within 2^60 of float64's subnormals proves nothing.
    proved = (info == 0) & torch.isfinite(U) & (tau > 2.0**-960) & torch.isfinite(flat).flatten(1).all(-1)
    if not bool(proved.all()):
        rest = (~proved).nonzero().flatten()
        rank[rest] = gram_eig(flat[rest], rtol, False)[2].sum(-1)
    return rank.reshape(lead)


def principal_factors(
    G_O: Float[Tensor, "*batch r r"],
    G_V: Float[Tensor, "*batch r r"],
    M: Float[Tensor, "*batch r r"],
    rtol: float,
    principal_K: bool = True,
) -> tuple[Float[Tensor, "*batch r r"], Float[Tensor, "*batch r"], Int[Tensor, "*batch"], Int[Tensor, "*batch"]]:
    """Principal-coordinate factors ``K``, ``D`` and the numerical ranks, from Grams (SPEC 3).

    ``T = Q_O K_raw Q_Vᵀ`` with ``K_raw = Λ_O^{1/2} W_Oᵀ W_V Λ_V^{1/2}`` (module docstring).
    The SVD ``Q_Vᵀ Q_O = U Σ Wᵀ`` rotates to principal coordinates: ``K = Wᵀ K_raw U``,
    ``D = Σ`` (cosines of the principal angles, descending; entries at index
    ``>= min(rank_O, rank_V)`` set to 0).

    ``K`` is in the units of the Grams: when :func:`~tl_idempotence.maths.closure.layer_grams`
    rescaled a head by a power of two (``Grams.e_O``, ``Grams.e_V``), ``K`` carries the factor
    ``2^(e_O + e_V)``; ``D`` and the ranks do not depend on scale.

    Args:
        G_O, G_V, M: the Gram products ``Oᵀ O``, ``Vᵀ V``, ``Vᵀ O``, ``[*batch, r, r]`` float64.
        rtol: relative rank tolerance (:func:`rank_rtol`).
        principal_K: rotate K to principal coordinates (full SVD). ``False`` returns
            ``K_raw`` (same singular values, orientation not principal) and needs only
            the singular values of ``Q_Vᵀ Q_O`` — enough for orientation-only controls.

    Returns:
        ``(K [*batch, r, r], D [*batch, r], rank_O [*batch], rank_V [*batch])``, float64 / int64.
    """
    s_O, W_O, mask_O = gram_eig(G_O, rtol, True)
    s_V, W_V, mask_V = gram_eig(G_V, rtol, True)
    assert W_O is not None and W_V is not None
    zero = torch.zeros_like(s_O)
    inv_O = torch.where(mask_O, 1.0 / torch.where(mask_O, s_O, torch.ones_like(s_O)), zero)
    inv_V = torch.where(mask_V, 1.0 / torch.where(mask_V, s_V, torch.ones_like(s_V)), zero)
    sO = torch.where(mask_O, s_O, zero)
    sV = torch.where(mask_V, s_V, zero)
    C = inv_V.unsqueeze(-1) * (W_V.transpose(-1, -2) @ M @ W_O) * inv_O.unsqueeze(-2)  # Q_Vᵀ Q_O
    K = sO.unsqueeze(-1) * (W_O.transpose(-1, -2) @ W_V) * sV.unsqueeze(-2)  # T = Q_O K_raw Q_Vᵀ
    if principal_K:
        U, S, Wh = torch.linalg.svd(C)
        K = Wh @ K @ U
    else:
        S = torch.linalg.svdvals(C)
    rank_O, rank_V = mask_O.sum(-1), mask_V.sum(-1)
    n_ang = torch.minimum(rank_O, rank_V).unsqueeze(-1)
    D = torch.where(torch.arange(S.shape[-1], device=S.device).expand_as(S) < n_ang, S, torch.zeros_like(S))
    return K, D, rank_O, rank_V
