"""Pure maths of OV closure on batched head factors (SPEC sections 1-3).

This module imports torch, numpy and jaxtyping only: no TransformerLens.

Conventions
-----------
Everything here is in the paper's **column form**: a head has a value read
``V`` and an output write ``O``, both ``[d_model, d_head]``, and its OV operator
is ``T = O Vᵀ`` (``d_model x d_model``, never formed). TransformerLens's row
form is ``W_V = V`` and ``W_O = Oᵀ``, so ``W_V @ W_O == Tᵀ``; every quantity
computed here is invariant under that transposition.

All metrics reduce to three ``d_head x d_head`` Gram products per head
(SPEC section 3)::

    G_O = Oᵀ O,   G_V = Vᵀ V,   M = Vᵀ O
    ‖T‖²_F     = ⟨G_O, G_V⟩_F
    ⟨T², T⟩_F  = ⟨M, G_O G_V⟩_F
    ‖T²‖²_F    = ⟨G_O M, M G_V⟩_F

so the cost is ``O(d_model · d_head²)`` per head and nothing ``d_model x
d_model`` is ever materialized. Products are accumulated in float64 whatever
the weight dtype (or in float32 when ``compute_dtype=torch.float32`` is asked
for the ``d_model``-long products; the ``d_head``-sized algebra is always
float64).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import torch
from jaxtyping import Complex, Float, Int
from torch import Tensor

__all__ = [
    "DEGENERATE_RTOL",
    "GRAM_RTOL_FLOOR",
    "Closure",
    "Grams",
    "check_finite",
    "closure",
    "closure_from_grams",
    "closure_scalars",
    "principal_factors",
    "grams",
    "layer_grams",
    "rank_rtol",
]

#: The smallest relative singular value that Gram-based factors can resolve in
#: float64 (≈ sqrt(float64 eps), rounded up). Ranks never count singular values
#: below ``GRAM_RTOL_FLOOR * sigma_max``.
GRAM_RTOL_FLOOR = 1e-7


def rank_rtol(d_model: int, d_head: int, input_dtype: torch.dtype | None = None) -> float:
    """Relative tolerance for the numerical rank of O and V.

    ``rtol = max(max(d_model, d_head) · eps(float32), GRAM_RTOL_FLOOR)``: the NumPy
    ``matrix_rank`` default for a float32 matrix (the precision checkpoints are
    trained in), used for every storage dtype so that the fp32/fp16/bf16 copies of
    the same weights get the same ranks, and floored at the float64 resolution of the
    Gram products. A singular value ``s`` of O (or V) counts toward the rank when
    ``s > rtol · s_max``. ``input_dtype`` is accepted for API stability and ignored.

    Source: ours (SPEC section 3, "use the rank that is numerically there").
    """
    return max(max(d_model, d_head) * torch.finfo(torch.float32).eps, GRAM_RTOL_FLOOR)


#: Relative tolerance of the degeneracy tests (zero / nilpotent head): the float64
#: noise level of the Gram-based norms (‖T‖ and ‖T²‖ carry an absolute error of about
#: sqrt(eps64) relative to ‖O‖‖V‖ and ‖T‖² respectively).
DEGENERATE_RTOL = GRAM_RTOL_FLOOR


def check_finite(x: Tensor, name: str, index_names: tuple[str, ...] = ()) -> None:
    """Raise ``ValueError`` naming the first non-finite entry's leading index.

    Args:
        x: tensor ``[*batch, ...]``; the last two dims are the matrix dims.
        name: what ``x`` is ("W_V", "O of layer 3", ...), used in the message.
        index_names: names of the leading dims (e.g. ``("head",)``) for the message.

    Raises:
        ValueError: if ``x`` holds NaN or ±inf.
    """
    if x.is_floating_point() and not bool(torch.isfinite(x).all()):
        bad = (~torch.isfinite(x)).nonzero()[0].tolist()
        lead = bad[: x.ndim - 2]
        where = ", ".join(f"{n}={i}" for n, i in zip(index_names, lead)) if index_names else str(tuple(lead))
        raise ValueError(
            f"{name} contains NaN or inf (first at {where or 'the matrix'}, entry {tuple(bad[x.ndim - 2:])}). "
            "Closure is undefined for non-finite weights: check the checkpoint file or the weight processing "
            "that produced these weights."
        )


@dataclass(frozen=True)
class Grams:
    """The three ``d_head x d_head`` products a head's closure needs (column form).

    Attributes:
        G_O: ``Oᵀ O``, ``[*batch, d_head, d_head]``, float64.
        G_V: ``Vᵀ V``, ``[*batch, d_head, d_head]``, float64.
        M: ``Vᵀ O``, ``[*batch, d_head, d_head]``, float64. Its eigenvalues are the
            nonzero eigenvalues of ``T`` (SPEC section 3).
        d_model: residual width (for tolerances).
        input_dtype: dtype the weights were stored in (for tolerances).
    """

    G_O: Float[Tensor, "*batch r r"]
    G_V: Float[Tensor, "*batch r r"]
    M: Float[Tensor, "*batch r r"]
    d_model: int
    input_dtype: torch.dtype


def _as_tensor(x: Any, name: str) -> Tensor:
    if isinstance(x, Tensor):
        return x.detach()
    if isinstance(x, np.ndarray):
        return torch.from_numpy(x)
    raise TypeError(f"{name} must be a torch.Tensor or numpy array, got {type(x).__name__}.")


def _mm(a: Tensor, b: Tensor, compute_dtype: torch.dtype) -> Tensor:
    return torch.matmul(a.to(compute_dtype), b.to(compute_dtype)).to(torch.float64)


def grams(
    O: Float[Tensor, "*batch d_model d_head"],
    V: Float[Tensor, "*batch d_model d_head"],
    compute_dtype: torch.dtype = torch.float64,
) -> Grams:
    """Gram products of paired factors (leading dims broadcast).

    Args:
        O: output write, column form (``= W_Oᵀ``), ``[*batch, d_model, d_head]``.
        V: value read (``= W_V``), ``[*batch, d_model, d_head]``.
        compute_dtype: dtype of the ``d_model``-long products (float64 default;
            float32 trades ~1e-6 relative accuracy for speed).

    Returns:
        :class:`Grams` in float64.
    """
    lead = torch.broadcast_shapes(O.shape[:-2], V.shape[:-2])
    O = O.expand(*lead, *O.shape[-2:])
    V = V.expand(*lead, *V.shape[-2:])
    Ot = O.transpose(-1, -2)
    Vt = V.transpose(-1, -2)
    return Grams(
        G_O=_mm(Ot, O, compute_dtype),
        G_V=_mm(Vt, V, compute_dtype),
        M=_mm(Vt, O, compute_dtype),
        d_model=int(O.shape[-2]),
        input_dtype=torch.promote_types(O.dtype, V.dtype),
    )


def layer_grams(
    O: Float[Tensor, "n_heads d_model d_head"],
    V: Float[Tensor, "n_kv_heads d_model d_head"],
    kv_head_of: Int[Tensor, " n_heads"],
    compute_dtype: torch.dtype = torch.float64,
) -> Grams:
    """Gram products for one layer with shared value heads (MHA, GQA, MQA).

    ``Vᵀ V`` is computed once per kv head and ``Vᵀ O`` once per query head, so a
    GQA layer costs ``n_heads + n_kv_heads`` products, not ``2 n_heads``.

    Args:
        O: ``[n_heads, d_model, d_head]`` column form.
        V: ``[n_kv_heads, d_model, d_head]`` unexpanded value weights.
        kv_head_of: ``[n_heads]`` query head -> kv head index.

    Returns:
        :class:`Grams` with batch shape ``[n_heads]``.
    """
    kv = kv_head_of.long()
    Vc = V.to(compute_dtype)
    Oc = O.to(compute_dtype)
    G_V = torch.matmul(Vc.transpose(-1, -2), Vc).to(torch.float64)[kv]
    G_O = torch.matmul(Oc.transpose(-1, -2), Oc).to(torch.float64)
    M = torch.empty_like(G_O)
    for g in torch.unique(kv).tolist():
        idx = (kv == g).nonzero().flatten()
        M[idx] = torch.matmul(Vc[g].transpose(-1, -2), Oc[idx]).to(torch.float64)
    return Grams(G_O=G_O, G_V=G_V, M=M, d_model=int(O.shape[-2]), input_dtype=torch.promote_types(O.dtype, V.dtype))


@dataclass(frozen=True)
class Closure:
    """Closure of a batch of heads (SPEC sections 2-3). All tensors float64 on CPU.

    Attributes:
        alpha: best scale ``α = ⟨T², T⟩_F / ‖T‖²_F``, ``[*batch]`` (units of the
            weights: α scales like ‖O‖·‖V‖). 0 for nilpotent heads, NaN for zero heads.
        P: squared closure alignment ``⟨T², T⟩² / (‖T²‖² ‖T‖²) ∈ [0, 1]``, ``[*batch]``;
            NaN when undefined (see ``reason``).
        norm: ``‖T‖_F``, ``[*batch]``.
        norm_T2: ``‖T²‖_F``, ``[*batch]``.
        inner: ``⟨T², T⟩_F``, ``[*batch]``.
        rank_O, rank_V: numerical ranks (``s > rtol · s_max``, see :func:`rank_rtol`), ``[*batch]`` int64.
        rtol: the relative rank tolerance used (degeneracy uses ``DEGENERATE_RTOL``).
        K: principal-coordinate transport ``[*batch, d_head, d_head]`` with
            ``T = Q_O K Q_Vᵀ`` and ``T² = Q_O (K D K) Q_Vᵀ`` (SPEC 3); ``None`` unless
            ``factors=True``. Rows/columns beyond the numerical ranks are zero.
        D: ``[*batch, d_head]`` diagonal of ``Q_Vᵀ Q_O`` in principal coordinates =
            cosines of the principal angles between span(V) and span(O), descending.
            Entries at index ``>= min(rank_O, rank_V)`` are structural zeros.
            ``None`` unless ``factors=True``.
        eigenvalues: ``[*batch, d_head]`` complex128 eigenvalues of ``Vᵀ O`` (= the
            nonzero eigenvalues of T, padded with zeros), sorted by descending
            modulus; ``None`` unless ``factors=True``.
        reason: numpy object array ``[*batch]``: "" where P is defined, otherwise why not.
    """

    alpha: Float[Tensor, "*batch"]
    P: Float[Tensor, "*batch"]
    norm: Float[Tensor, "*batch"]
    norm_T2: Float[Tensor, "*batch"]
    inner: Float[Tensor, "*batch"]
    rank_O: Int[Tensor, "*batch"]
    rank_V: Int[Tensor, "*batch"]
    rtol: float
    reason: np.ndarray
    K: Float[Tensor, "*batch r r"] | None = None
    D: Float[Tensor, "*batch r"] | None = None
    eigenvalues: Complex[Tensor, "*batch r"] | None = None

    @property
    def shape(self) -> torch.Size:
        """Leading (batch) shape."""
        return self.P.shape

    def __getitem__(self, idx: Any) -> "Closure":
        """Index every field by the same leading index (e.g. ``c[3]`` or ``c[:, 2]``)."""
        out = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, Tensor):
                out[f.name] = v[idx]
            elif isinstance(v, np.ndarray):
                out[f.name] = np.asarray(v[idx if not isinstance(idx, Tensor) else idx.numpy()], dtype=object)
            else:
                out[f.name] = v
        return Closure(**out)


def _ranks(G: Tensor, rtol: float, vectors: bool) -> tuple[Tensor, Tensor | None, Tensor]:
    """Eigen-decomposition of a PSD Gram matrix -> (sqrt eigenvalues, eigenvectors or None, mask)."""
    if vectors:
        lam, W = torch.linalg.eigh(G)
    else:
        lam, W = torch.linalg.eigvalsh(G), None
    s = lam.clamp_min(0).sqrt()
    smax = s.amax(-1, keepdim=True)
    mask = (s > rtol * smax) & (smax > 0)
    return s, W, mask


def principal_factors(
    g: Grams, rtol: float, principal_K: bool = True
) -> tuple[Float[Tensor, "*batch r r"], Float[Tensor, "*batch r"], Int[Tensor, "*batch"], Int[Tensor, "*batch"]]:
    """Principal-coordinate factors ``K``, ``D`` and the numerical ranks, from Grams (SPEC 3).

    With the eigenbases of the Grams (``G_O = W_O Λ_O W_Oᵀ``), ``Q_O = O W_O Λ_O^{-1/2}``
    and ``Q_V = V W_V Λ_V^{-1/2}`` (columns beyond the numerical rank dropped), so
    ``T = Q_O K_raw Q_Vᵀ`` with ``K_raw = Λ_O^{1/2} W_Oᵀ W_V Λ_V^{1/2}``. The SVD
    ``Q_Vᵀ Q_O = U Σ Wᵀ`` rotates to principal coordinates: ``K = Wᵀ K_raw U``,
    ``D = Σ`` (cosines of the principal angles, descending; entries at index
    ``>= min(rank_O, rank_V)`` set to 0).

    Args:
        g: Gram products ``[*batch]``.
        rtol: relative rank tolerance (:func:`rank_rtol`).
        principal_K: rotate K to principal coordinates (full SVD). ``False`` returns
            ``K_raw`` (same singular values, orientation not principal) and needs only
            the singular values of ``Q_Vᵀ Q_O`` — enough for orientation-only controls.

    Returns:
        ``(K [*batch, r, r], D [*batch, r], rank_O [*batch], rank_V [*batch])``.
    """
    s_O, W_O, mask_O = _ranks(g.G_O, rtol, True)
    s_V, W_V, mask_V = _ranks(g.G_V, rtol, True)
    assert W_O is not None and W_V is not None
    zero = torch.zeros_like(s_O)
    inv_O = torch.where(mask_O, 1.0 / torch.where(mask_O, s_O, torch.ones_like(s_O)), zero)
    inv_V = torch.where(mask_V, 1.0 / torch.where(mask_V, s_V, torch.ones_like(s_V)), zero)
    sO = torch.where(mask_O, s_O, zero)
    sV = torch.where(mask_V, s_V, zero)
    C = inv_V.unsqueeze(-1) * (W_V.transpose(-1, -2) @ g.M @ W_O) * inv_O.unsqueeze(-2)  # Q_Vᵀ Q_O
    K = sO.unsqueeze(-1) * (W_O.transpose(-1, -2) @ W_V) * sV.unsqueeze(-2)  # T = Q_O K_raw Q_Vᵀ
    if principal_K:
        U, S, Wh = torch.linalg.svd(C)
        K = Wh @ K @ U
    else:
        S = torch.linalg.svdvals(C)
    rank_O, rank_V = mask_O.sum(-1), mask_V.sum(-1)
    n_ang = torch.minimum(rank_O, rank_V).unsqueeze(-1)
    D = torch.where(torch.arange(S.shape[-1]).expand_as(S) < n_ang, S, torch.zeros_like(S))
    return K, D, rank_O, rank_V


def closure_scalars(
    G_O: Float[Tensor, "*batch r r"], G_V: Float[Tensor, "*batch r r"], M: Float[Tensor, "*batch r r"]
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, np.ndarray]:
    """α, P, ‖T‖, ‖T²‖, ⟨T², T⟩ and the degeneracy reasons from Gram products (SPEC 2).

    The scalar part of :func:`closure_from_grams`, shared with the shared-value
    algebra (where ``(G_O, G_V, M) = (G_O_i, G_V, M_j)`` gives ``α_ij``, ``P_ij``).

    Args:
        G_O, G_V, M: ``[*batch, r, r]`` float64 (``OᵀO``, ``VᵀV``, ``VᵀO``; broadcast).

    Returns:
        ``(alpha, P, norm, norm_T2, inner, reason)``: tensors ``[*batch]`` and a numpy
        object array of reasons ("" where P is defined). Zero head (``‖T‖ ≤
        DEGENERATE_RTOL · ‖O‖_F‖V‖_F``): α = P = NaN; nilpotent head (``‖T²‖ ≤
        DEGENERATE_RTOL · ‖T‖²``): α = 0, P = NaN.
    """
    G_O, G_V, M = torch.broadcast_tensors(G_O, G_V, M)
    norm2 = (G_O * G_V).sum((-1, -2)).clamp_min(0)
    inner = (M * (G_O @ G_V)).sum((-1, -2))
    norm2_T2 = ((G_O @ M) * (M @ G_V)).sum((-1, -2)).clamp_min(0)
    norm = norm2.sqrt()
    norm_T2 = norm2_T2.sqrt()

    # Degeneracy: ‖T‖ ≤ ‖O‖_F ‖V‖_F and ‖T²‖ ≤ ‖T‖², so both tests are scale-free.
    scale = (G_O.diagonal(dim1=-2, dim2=-1).sum(-1) * G_V.diagonal(dim1=-2, dim2=-1).sum(-1)).sqrt()
    dtol = DEGENERATE_RTOL
    zero = (norm <= dtol * scale) | (norm == 0)
    nil = ~zero & (norm_T2 <= dtol * norm2)

    safe_norm2 = torch.where(zero, torch.ones_like(norm2), norm2)
    safe_T2 = torch.where(zero | nil, torch.ones_like(norm2_T2), norm2_T2)
    alpha = inner / safe_norm2
    P = (inner**2 / (safe_T2 * safe_norm2)).clamp(0.0, 1.0)
    nan = torch.full_like(P, float("nan"))
    alpha = torch.where(zero, nan, torch.where(nil, torch.zeros_like(alpha), alpha))
    P = torch.where(zero | nil, nan, P)

    reason = np.full(tuple(P.shape), "", dtype=object)
    zero_np = zero.numpy()
    nil_np = nil.numpy()
    ratio = (norm_T2 / safe_norm2).numpy()
    reason[zero_np] = f"zero head: ||T||_F <= {dtol:.0e} * ||O||_F ||V||_F"
    for idx in np.argwhere(nil_np):
        idx = tuple(idx)
        reason[idx] = f"nilpotent head: ||T^2||_F / ||T||_F^2 = {float(ratio[idx]):.2e} <= {dtol:.0e}"

    return alpha, P, norm, norm_T2, inner, reason


def closure_from_grams(g: Grams, factors: bool = False) -> Closure:
    """Closure metrics from precomputed :class:`Grams` (SPEC sections 2-3).

    Args:
        g: Gram products, batch shape ``[*batch]``.
        factors: also compute K, D (principal coordinates) and eigenvalues of T.

    Returns:
        :class:`Closure` with batch shape ``[*batch]``.

    Degenerate heads never raise: ``‖T‖ ≈ 0`` (zero head) gives α = P = NaN;
    ``‖T²‖ ≈ 0`` relative to ``‖T‖²`` (nilpotent head) gives α = 0 and P = NaN;
    ``reason`` says which, with the tolerance (:data:`DEGENERATE_RTOL`, relative).
    """
    G_O, G_V, M = g.G_O, g.G_V, g.M
    r = G_O.shape[-1]
    rtol = rank_rtol(g.d_model, r, g.input_dtype)

    alpha, P, norm, norm_T2, inner, reason = closure_scalars(G_O, G_V, M)
    K = D = eig = None
    if factors:
        K, D, rank_O, rank_V = principal_factors(g, rtol)
        ev = torch.linalg.eigvals(M)
        order = ev.abs().argsort(dim=-1, descending=True)
        eig = torch.gather(ev, -1, order)
    else:
        rank_O = _ranks(G_O, rtol, False)[2].sum(-1)
        rank_V = _ranks(G_V, rtol, False)[2].sum(-1)

    return Closure(
        alpha=alpha,
        P=P,
        norm=norm,
        norm_T2=norm_T2,
        inner=inner,
        rank_O=rank_O,
        rank_V=rank_V,
        rtol=rtol,
        reason=reason,
        K=K,
        D=D,
        eigenvalues=eig,
    )


def _pair_from(x: Any) -> tuple[Tensor, Tensor]:
    """(W_V, W_O) in TL row form from a FactoredMatrix or a pair."""
    if hasattr(x, "A") and hasattr(x, "B") and not isinstance(x, (tuple, list)):
        return _as_tensor(x.A, "FactoredMatrix.A (W_V)"), _as_tensor(x.B, "FactoredMatrix.B (W_O)")
    if isinstance(x, (tuple, list)) and len(x) == 2:
        return _as_tensor(x[0], "W_V"), _as_tensor(x[1], "W_O")
    raise TypeError(
        "closure() expects a TransformerLens FactoredMatrix (e.g. model.OV, A = W_V, B = W_O) or a "
        f"(W_V, W_O) pair of tensors in TransformerLens row form; got {type(x).__name__}."
    )


def closure(
    x: Any,
    factors: bool = True,
    compute_dtype: torch.dtype = torch.float64,
) -> Closure:
    """Closure of every head in a FactoredMatrix or a ``(W_V, W_O)`` pair (SPEC 2-3).

    Args:
        x: a TransformerLens ``FactoredMatrix`` such as ``model.OV`` (``A = W_V``
            ``[*batch, d_model, d_head]``, ``B = W_O`` ``[*batch, d_head, d_model]``;
            TL row form, ``A @ B = Tᵀ``), or a pair ``(W_V, W_O)`` of tensors (or
            numpy arrays) with those shapes. Leading dims broadcast. Any float dtype.
        factors: also return K, D and the eigenvalues (default True).
        compute_dtype: dtype of the ``d_model``-long products (default float64).

    Returns:
        :class:`Closure` with the broadcast leading shape, float64.

    Raises:
        TypeError: ``x`` is neither a FactoredMatrix nor a pair of arrays.
        ValueError: shapes do not pair (``W_V`` must be ``[..., d_model, d_head]``
            and ``W_O`` ``[..., d_head, d_model]``), or weights contain NaN/inf.
    """
    W_V, W_O = _pair_from(x)
    if W_V.ndim < 2 or W_O.ndim < 2:
        raise ValueError(f"W_V and W_O must be at least 2-D; got shapes {tuple(W_V.shape)} and {tuple(W_O.shape)}.")
    d_model, d_head = W_V.shape[-2:]
    if W_O.shape[-2:] != (d_head, d_model):
        raise ValueError(
            f"W_V {tuple(W_V.shape)} and W_O {tuple(W_O.shape)} do not pair: expected W_V [..., d_model, d_head] and "
            f"W_O [..., d_head, d_model] (TransformerLens row form). Did you pass (W_O, W_V) or the column form?"
        )
    try:
        torch.broadcast_shapes(W_V.shape[:-2], W_O.shape[:-2])
    except RuntimeError as e:
        raise ValueError(f"Leading dims of W_V {tuple(W_V.shape)} and W_O {tuple(W_O.shape)} do not broadcast.") from e
    if not (W_V.is_floating_point() and W_O.is_floating_point()):
        raise TypeError(f"W_V and W_O must be floating point; got {W_V.dtype} and {W_O.dtype}.")
    check_finite(W_V, "W_V")
    check_finite(W_O, "W_O")
    O = W_O.transpose(-1, -2).cpu()
    V = W_V.cpu()
    return closure_from_grams(grams(O, V, compute_dtype=compute_dtype), factors=factors)
