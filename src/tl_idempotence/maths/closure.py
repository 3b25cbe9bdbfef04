"""Closure of OV circuits from Gram products (SPEC sections 1-3): α, P, norms, ranks, K, D.

Conventions
-----------
Everything here is in the paper's **column form**: a head has a value read ``V`` and an
output write ``O``, both ``[d_model, d_head]``, and its OV operator is ``T = O Vᵀ``
(``d_model x d_model``, never formed). TransformerLens's row form is ``W_V = V`` and
``W_O = Oᵀ``, so ``W_V @ W_O == Tᵀ``; every quantity computed here is invariant under that
transposition.

All metrics reduce to three ``d_head x d_head`` Gram products per head (SPEC 3)::

    G_O = Oᵀ O,   G_V = Vᵀ V,   M = Vᵀ O
    ‖T‖²_F     = ⟨G_O, G_V⟩_F
    ⟨T², T⟩_F  = ⟨M, G_O G_V⟩_F
    ‖T²‖²_F    = ⟨G_O M, M G_V⟩_F

so the cost is ``O(d_model · d_head²)`` per head. Products are accumulated in float64
whatever the weight dtype (or float32 for the ``d_model``-long products when
``compute_dtype=torch.float32``); the ``d_head``-sized algebra is always float64.

Scale
-----
``P`` does not depend on the scale of O or V and ``α`` scales like ``‖O‖·‖V‖``, but the
products above are of degree up to 12 in the weights and over/underflow float64 for
weights of size ~1e±25 (float32 products: ~1e±9). :func:`layer_grams` and :func:`grams`
therefore check the Gram diagonals (the squared column norms) and, only when they leave
``[2^-64, 2^64]``, rescale each offending head by an exact power of two ``2^e``
(``e_O``, ``e_V`` in :class:`Grams`) before the products. Powers of two commute with every
floating-point operation, so the scale-free outputs (``P``, ranks, ``D``) are exactly
those of the rescaled weights and the scaled ones (``α``, norms, ``K``, eigenvalues) are
rescaled back exactly (``torch.ldexp``); weights of ordinary size are never touched, so
their numbers are bit for bit what the plain products give. Only outputs whose own value
exceeds float64 (``‖T²‖`` of weights ~1e±100) become ``inf``/0.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch
from jaxtyping import Complex, Float, Int
from torch import Tensor

from ..core.defaults import DEFAULT_COMPUTE_DTYPE, DEFAULT_DEVICE
from ..core.factors import DEGENERATE_RTOL, gram_rank, principal_factors, rank_rtol
from ..core.frozen import frozen
from ..core.heads import LayerHeads, check_storage, check_weights
from ..core.options import check_bool, check_compute_dtype, check_device, strict_kwargs
from ..core.tables import ImmutableResult
from ..errors import OptionError, OptionTypeError, WeightError
from ..views.results import DrawnResult

if TYPE_CHECKING:  # pragma: no cover
    from ..core.hints import DeviceLike, DtypeLike, HeadWeightsLike

__all__ = [
    "CastBuffer",
    "Closure",
    "Grams",
    "apply_exponents",
    "closure",
    "closure_from_grams",
    "closure_scalars",
    "closure_sums",
    "flat_fields",
    "grams",
    "head_pair",
    "layer_grams",
    "pow2_scale",
]

#: Gram diagonals (squared column norms) inside ``[2^-LOG2_SAFE, 2^LOG2_SAFE]`` are used as
#: computed; outside, the head is rescaled by a power of two first (module docstring).
LOG2_SAFE = 64


def broadcast_batch(*shapes: tuple[int, ...] | torch.Size) -> torch.Size:
    """``torch.broadcast_shapes`` without its first-call cost.

    ``torch.broadcast_shapes`` goes through ``torch._refs``, whose first use imports
    ``torch.fx.experimental.symbolic_shapes`` and sympy (~0.5 s, a fifth of the main job);
    numpy's rule is the same. Raises ``RuntimeError`` when the shapes do not broadcast, as torch does.
    """
    try:
        return torch.Size(np.broadcast_shapes(*(tuple(s) for s in shapes)))
    except ValueError as e:
        raise RuntimeError(f"shapes {[tuple(s) for s in shapes]} do not broadcast") from e


@dataclass(frozen=True)
class Grams:
    """The three ``d_head x d_head`` products a head's closure needs (column form).

    Attributes:
        G_O: ``Oᵀ O``, ``[*batch, d_head, d_head]``, float64, CPU.
        G_V: ``Vᵀ V`` (of the head's kv head), ``[*batch, d_head, d_head]``, float64, CPU.
        M: ``Vᵀ O``, ``[*batch, d_head, d_head]``, float64, CPU. Its eigenvalues are the
            nonzero eigenvalues of ``T`` (SPEC section 3).
        d_model: residual width (for tolerances).
        input_dtype: dtype the weights were stored in.
        e_O, e_V: ``[*batch]`` int64 power-of-two exponents the products were computed
            with (``O·2^e_O``, ``V·2^e_V``), or ``None`` when no head needed rescaling
            (module docstring). ``M`` carries ``2^(e_O + e_V)``.
        kv_head_of: ``[n_heads]`` int64 kv head of each query head (batch shape ``[n_heads]``
            only), or ``None``. Heads with the same entry share ``G_V``, so its spectrum is
            computed once per kv head (GQA/MQA); :func:`layer_grams` sets it.

    Raises:
        OptionError: only one of ``e_O``/``e_V`` given, or one whose shape does not fit the batch.
    """

    G_O: Float[Tensor, "*batch r r"]
    G_V: Float[Tensor, "*batch r r"]
    M: Float[Tensor, "*batch r r"]
    d_model: int
    input_dtype: torch.dtype
    e_O: Int[Tensor, "*batch"] | None = None
    e_V: Int[Tensor, "*batch"] | None = None
    kv_head_of: Int[Tensor, " n_heads"] | None = None

    def __post_init__(self) -> None:
        # Exponents half given would be silently ignored by e_T (M left in scaled units).
        if (self.e_O is None) != (self.e_V is None):
            raise OptionError("Grams: give both e_O and e_V (the power-of-two exponents) or neither.")
        batch = broadcast_batch(self.G_O.shape[:-2], self.G_V.shape[:-2], self.M.shape[:-2])
        for name, e in (("e_O", self.e_O), ("e_V", self.e_V)):
            if e is not None and broadcast_batch(e.shape, batch) != batch:
                raise OptionError(f"Grams: {name} has shape {tuple(e.shape)}; the batch shape is {tuple(batch)}.")

    @property
    def e_T(self) -> Int[Tensor, "*batch"] | None:
        """Exponent of ``T`` in these Grams (``e_O + e_V``), or None when unscaled."""
        if self.e_O is None or self.e_V is None:
            return None
        return self.e_O + self.e_V

    def index(self, idx: Any) -> Grams:
        """The Grams of a subset of heads (``idx`` indexes the leading dim)."""
        return Grams(
            G_O=self.G_O[idx],
            G_V=self.G_V[idx],
            M=self.M[idx],
            d_model=self.d_model,
            input_dtype=self.input_dtype,
            e_O=None if self.e_O is None else self.e_O[idx],
            e_V=None if self.e_V is None else self.e_V[idx],
            kv_head_of=None if self.kv_head_of is None else self.kv_head_of[idx],
        )


# --------------------------------------------------------------------------- scaling


def _pow2(x: Tensor, e: Tensor) -> Tensor:
    """``x · 2^e`` exactly (float64; two steps so that neither factor overflows)."""
    e = e.to(torch.float64)
    half = torch.floor(e / 2)
    return x * torch.exp2(half) * torch.exp2(e - half)


def pow2_scale(x: Tensor, e: Tensor | None) -> Tensor:
    """``x · 2^e`` exactly, ``e`` indexing the leading dims of ``x`` (identity when ``e`` is None or zero).

    Powers of two commute with every floating-point operation, so this is how every rescaling of
    this package is applied and undone (module docstring).
    """
    if e is None or not bool(e.any()):
        return x
    e = e.to(x.device)
    while e.ndim < x.ndim:
        e = e.unsqueeze(-1)
    return _pow2(x, e)


def _unscale(x: Tensor, e: Tensor | None) -> Tensor:
    """``x · 2^-e`` (identity when ``e`` is None or zero)."""
    return pow2_scale(x, None if e is None else -e)


def scale_exponents(X: Float[Tensor, "*lead d r"]) -> Int[Tensor, "*lead"]:
    """Per-matrix power-of-two exponents that bring ``max|X|`` into ``[0.5, 1)``; 0 when it is
    already inside ``[2^-16, 2^16]`` (those matrices are never touched) or zero."""
    m = X.detach().abs().amax(dim=(-1, -2)).to(torch.float64)
    _, e = torch.frexp(m)
    outside = (m > 0) & ((m < 2.0**-16) | (m > 2.0**16))
    return torch.where(outside, -e.to(torch.int64), torch.zeros_like(e, dtype=torch.int64)).cpu()


class CastBuffer:
    """Memory reused, layer after layer, for the compute-dtype copy of a layer's O.

    That copy (``[n_heads, d_model, d_head]``; 268 MB in float64 for a Qwen3-235B layer) is a
    layer's largest allocation. A fresh block that size comes from the OS each time and its pages
    fault in as the cast writes them (~0.13 s of a ~0.8 s 235B layer on this project's 2-core
    machine; the copy itself ~0.02 s); reused, the cast writes into pages already mapped. The
    copied values are the same bits either way (an exact cast). Holds one tensor, replaced when a
    layer of another shape, dtype or device comes; not thread-safe: one per report loop, dropped
    with it.
    """

    def __init__(self) -> None:
        self._t: Tensor | None = None

    def get(self, shape: torch.Size | tuple[int, ...], dtype: torch.dtype, device: torch.device) -> Tensor:
        """An uninitialized contiguous tensor of ``shape``/``dtype`` on ``device`` (the held one when it fits)."""
        t = self._t
        if t is None or t.shape != tuple(shape) or t.dtype != dtype or t.device != device:
            self._t = None  # release the old block before allocating the new one
            t = self._t = torch.empty(tuple(shape), dtype=dtype, device=device)
        return t


def apply_exponents(
    X: Tensor, e: Tensor | None, dtype: torch.dtype, contiguous: bool = False, buffer: CastBuffer | None = None
) -> Tensor:
    """``X · 2^e`` per leading index (``e`` ``[*lead]`` or None), exactly, cast to ``dtype``
    (``contiguous``: in a contiguous copy whatever the layout of ``X``).

    ``buffer`` (with ``contiguous``): when a copy is needed, ``e`` is all zero and ``X`` does not
    require grad, the copy is written into the buffer's memory and the buffer's tensor itself is
    returned: it is valid only until the buffer's next use (:func:`layer_grams` uses it for products
    only and returns none of it). A tensor that requires grad always gets its own copy (an in-place
    reuse would break the backward pass of an earlier result).

    See :func:`layer_grams` for when heads are rescaled.
    """
    fmt = torch.contiguous_format if contiguous else torch.preserve_format
    if e is None or not bool(e.any()):
        if buffer is not None and contiguous and not X.requires_grad and (X.dtype != dtype or not X.is_contiguous()):
            return buffer.get(X.shape, dtype, X.device).copy_(X)
        out = X.to(dtype, memory_format=fmt)
    else:
        out = _pow2(X.to(torch.float64), e.to(X.device)[..., None, None]).to(dtype, memory_format=fmt)
    # .to() returns X itself when nothing changes, whatever its layout
    return out.contiguous() if contiguous else out


def _needs_scale(G: Tensor, X: Tensor) -> bool:
    """Whether the Gram diagonals of ``X`` left the safe range (overflow, underflow, lost precision)."""
    d = G.diagonal(dim1=-2, dim2=-1)
    if not bool(torch.isfinite(d).all()):
        return True
    m = d.amax(-1)
    if bool((m > 2.0**LOG2_SAFE).any()):
        return True
    small = m < 2.0**-LOG2_SAFE
    if bool(small.any()):
        # A zero Gram is fine for an all-zero factor; for anything else it is underflow.
        flat = X.reshape(-1, *X.shape[-2:])
        idx = small.reshape(-1).nonzero().flatten().to(X.device)
        return bool((flat[idx] != 0).any())
    return False


def _gram_products(
    O: Tensor,
    V: Tensor,
    kv: Tensor | None,
    dtype: torch.dtype,
    e_O: Tensor | None,
    e_V: Tensor | None,
    buffer: CastBuffer | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """(G_O [n], G_V [n_kv or n], M [n]) on O's device in float64; ``kv`` None = paired (broadcast) form."""
    # One layer's heads (kv given; never a broadcast view): the products of O as a strided view (a
    # checkpoint's o_proj split into heads) run ~1.5x slower than of a contiguous copy made in the
    # cast, with the same bits (tests/unit/report/test_v01_values.py). V keeps its layout: a contiguous
    # V changes the last bit of VᵀO for some shapes.
    Oc = apply_exponents(O, e_O, dtype, contiguous=kv is not None, buffer=buffer if kv is not None else None)
    Vc = apply_exponents(V, e_V, dtype)
    G_O = torch.matmul(Oc.transpose(-1, -2), Oc).to(torch.float64)
    G_V = torch.matmul(Vc.transpose(-1, -2), Vc).to(torch.float64)
    if kv is None:
        M = torch.matmul(Vc.transpose(-1, -2), Oc).to(torch.float64)
        return G_O, G_V, M
    M = torch.empty_like(G_O)
    kv_list = kv.tolist()
    for g in sorted(set(kv_list)):
        idx = [i for i, k in enumerate(kv_list) if k == g]
        # The usual layouts (MHA, GQA's repeat_interleave, MQA) give each kv head a contiguous run
        # of query heads: a slice is a view, where a fancy index would copy the group's O.
        rows: slice | Tensor = (
            slice(idx[0], idx[-1] + 1) if idx[-1] - idx[0] + 1 == len(idx) else torch.tensor(idx, device=O.device)
        )
        M[rows] = torch.matmul(Vc[g].transpose(-1, -2), Oc[rows]).to(torch.float64)
    return G_O, G_V, M


def _safe_gram_products(
    O: Tensor, V: Tensor, kv: Tensor | None, dtype: torch.dtype, buffer: CastBuffer | None = None
) -> tuple[Tensor, Tensor, Tensor, Tensor | None, Tensor | None]:
    """The products as computed, or — when a Gram diagonal left the safe range — recomputed with every
    head rescaled by its power of two: ``(G_O, G_V, M, e_O or None, e_V or None)`` (module docstring)."""
    G_O, G_V, M = _gram_products(O, V, kv, dtype, None, None, buffer)
    if not (_needs_scale(G_O, O) or _needs_scale(G_V, V)):
        return G_O, G_V, M, None, None
    e_O, e_V = scale_exponents(O), scale_exponents(V)
    G_O, G_V, M = _gram_products(O, V, kv, dtype, e_O, e_V)
    return G_O, G_V, M, e_O, e_V


def layer_grams(
    O: Float[Tensor, "n_heads d_model d_head"],
    V: Float[Tensor, "n_kv_heads d_model d_head"],
    kv_head_of: Int[Tensor, " n_heads"],  # type: ignore[name-defined]
    compute_dtype: torch.dtype = torch.float64,
    device: torch.device | str | None = None,
    buffer: CastBuffer | None = None,
) -> Grams:
    """Gram products for one layer with shared value heads (MHA, GQA, MQA).

    ``Vᵀ V`` is computed once per kv head and ``Vᵀ O`` once per query head, so a GQA
    layer costs ``n_heads + n_kv_heads`` products, not ``2 n_heads``. The products run on
    ``device`` (default: where ``O`` is); the returned Grams are CPU float64.

    Args:
        O: ``[n_heads, d_model, d_head]`` column form.
        V: ``[n_kv_heads, d_model, d_head]`` unexpanded value weights.
        kv_head_of: ``[n_heads]`` query head -> kv head index.
        compute_dtype: dtype of the ``d_model``-long products (float64 or float32).
        device: where to run the products.
        buffer: a :class:`CastBuffer` reused across the layers of a loop for the compute-dtype copy of
            ``O`` (saves the page faults of a fresh block per layer; same numbers), or None.

    Returns:
        :class:`Grams` with batch shape ``[n_heads]`` (rescaled heads: module docstring).
    """
    kv = kv_head_of.long().to("cpu")
    if device is not None:
        O, V = O.to(device), V.to(device)
    kv_dev = kv.to(O.device)
    G_O, G_Vk, M, e_O, e_Vk = _safe_gram_products(O, V, kv_dev, compute_dtype, buffer)
    e_V = None if e_Vk is None else e_Vk[kv]
    return _cpu_grams(O, V, (G_O, G_Vk[kv_dev], M, e_O, e_V), kv)


def grams(
    O: Float[Tensor, "*batch_o d_model d_head"],
    V: Float[Tensor, "*batch_v d_model d_head"],
    compute_dtype: torch.dtype = torch.float64,
    device: torch.device | str | None = None,
) -> Grams:
    """Gram products of paired factors; the leading dims of ``O`` and ``V`` broadcast.

    Args:
        O: output write, column form (``= W_Oᵀ``), ``[*batch_o, d_model, d_head]``.
        V: value read (``= W_V``), ``[*batch_v, d_model, d_head]``.
        compute_dtype: dtype of the ``d_model``-long products (float64 default;
            float32 trades ~1e-6 relative accuracy for speed).
        device: where to run the products (default: where ``O`` is).

    Returns:
        :class:`Grams` in float64 on the CPU, batch shape ``broadcast(batch_o, batch_v)``.
    """
    lead = broadcast_batch(O.shape[:-2], V.shape[:-2])
    if device is not None:
        O, V = O.to(device), V.to(device)
    O = O.expand(*lead, *O.shape[-2:])
    V = V.expand(*lead, *V.shape[-2:])
    return _cpu_grams(O, V, _safe_gram_products(O, V, None, compute_dtype))


def _cpu_grams(
    O: Tensor,
    V: Tensor,
    products: tuple[Tensor, Tensor, Tensor, Tensor | None, Tensor | None],
    kv: Tensor | None = None,
) -> Grams:
    """:class:`Grams` on the CPU from ``(G_O, G_V, M, e_O, e_V)`` computed from the factors ``O`` and ``V`` (their
    ``d_model`` and input dtype), with ``kv`` as ``kv_head_of``."""
    G_O, G_V, M, e_O, e_V = products
    return Grams(
        G_O=G_O.cpu(),
        G_V=G_V.cpu(),
        M=M.cpu(),
        d_model=int(O.shape[-2]),
        input_dtype=torch.promote_types(O.dtype, V.dtype),
        e_O=e_O,
        e_V=e_V,
        kv_head_of=kv,
    )


# --------------------------------------------------------------------------- closure


def closure_sums(
    G_O: Float[Tensor, "*batch r r"], G_V: Float[Tensor, "*batch r r"], M: Float[Tensor, "*batch r r"]
) -> tuple[Float[Tensor, "*batch"], Float[Tensor, "*batch"], Float[Tensor, "*batch"]]:
    """``(‖T‖², ⟨T², T⟩, ‖T²‖²)`` from Gram products (SPEC 2), with no degeneracy rule applied.

    ``‖T‖² = ⟨G_O, G_V⟩``, ``⟨T², T⟩ = ⟨M, G_O G_V⟩``, ``‖T²‖² = ⟨G_O M, M G_V⟩`` (Frobenius inner
    products over the last two dims; the squared norms clamped at 0). The raw sums behind
    :func:`closure_scalars`, which turns them into α and P with its zero/nilpotent rules; the
    shared-value algebra uses them where it re-decides ``T_i T_j ≈ 0`` on its own scale.

    Args:
        G_O, G_V, M: ``[*batch, r, r]`` float64 (``OᵀO``, ``VᵀV``, ``VᵀO``), same shape (in the Grams' units).

    Returns:
        Three ``[*batch]`` tensors, in the Grams' units (``‖T‖²`` carries their exponents squared).
    """
    norm2 = (G_O * G_V).sum((-1, -2)).clamp_min(0)
    inner = (M * (G_O @ G_V)).sum((-1, -2))
    norm2_T2 = ((G_O @ M) * (M @ G_V)).sum((-1, -2)).clamp_min(0)
    return norm2, inner, norm2_T2


def closure_scalars(
    G_O: Float[Tensor, "*batch r r"],
    G_V: Float[Tensor, "*batch r r"],
    M: Float[Tensor, "*batch r r"],
    exponents: tuple[Tensor, Tensor, Tensor] | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, np.ndarray]:
    """α, P, ‖T‖, ‖T²‖, ⟨T², T⟩ and the degeneracy reasons from Gram products (SPEC 2).

    The scalar part of :func:`closure_from_grams`, shared with the mismatch control and the
    shared-value algebra (where ``(G_O, G_V, M) = (G_O_i, G_V, M_j)`` gives ``α_ij``, ``P_ij``).

    Args:
        G_O, G_V, M: ``[*batch, r, r]`` float64 (``OᵀO``, ``VᵀV``, ``VᵀO``; broadcast).
        exponents: ``(e_O, e_V, e_M)``, each ``[*batch]``: the power-of-two exponents the
            three Grams carry (``G_O`` is in units of ``2^(2 e_O)``, ``G_V`` of ``2^(2 e_V)``,
            ``M`` of ``2^e_M``); the outputs are rescaled back. ``None``: unscaled.

    Returns:
        ``(alpha, P, norm, norm_T2, inner, reason)``: tensors ``[*batch]`` and a numpy
        object array of reasons ("" where P is defined). Zero head (``‖T‖ ≤
        DEGENERATE_RTOL · ‖O‖_F‖V‖_F``): α = P = NaN; nilpotent head (``‖T²‖ ≤
        DEGENERATE_RTOL · ‖T‖²``): α = 0, P = NaN.
    """
    G_O, G_V, M = torch.broadcast_tensors(G_O, G_V, M)
    norm2, inner, norm2_T2 = closure_sums(G_O, G_V, M)
    norm = norm2.sqrt()
    norm_T2 = norm2_T2.sqrt()

    # Degeneracy: ‖T‖ ≤ ‖O‖_F ‖V‖_F and ‖T²‖ ≤ ‖T‖², so both tests are scale-free.
    scale = (G_O.diagonal(dim1=-2, dim2=-1).sum(-1) * G_V.diagonal(dim1=-2, dim2=-1).sum(-1)).sqrt()
    dtol = DEGENERATE_RTOL
    zero = (norm <= dtol * scale) | (norm == 0)
    exps = None
    if exponents is not None:
        exps = tuple(torch.broadcast_to(e.to(norm.device), norm.shape) for e in exponents)
    # ‖T²‖/‖T‖² carries 2^(e_M - e_O - e_V): compare it in the weights' own units.
    T2_unscaled = norm_T2 if exps is None else _unscale(norm_T2, exps[2] - exps[0] - exps[1])
    nil = ~zero & (T2_unscaled <= dtol * norm2)

    safe_norm2 = torch.where(zero, torch.ones_like(norm2), norm2)
    safe_T2 = torch.where(zero | nil, torch.ones_like(norm2_T2), norm2_T2)
    alpha = inner / safe_norm2
    P = (inner**2 / (safe_T2 * safe_norm2)).clamp(0.0, 1.0)
    nan = torch.full_like(P, float("nan"))
    alpha = torch.where(zero, nan, torch.where(nil, torch.zeros_like(alpha), alpha))
    P = torch.where(zero | nil, nan, P)
    ratio = norm_T2 / safe_norm2
    if exps is not None:
        e_O, e_V, e_M = exps
        alpha = _unscale(alpha, e_M)
        inner = _unscale(inner, e_M + 2 * e_O + 2 * e_V)
        norm = _unscale(norm, e_O + e_V)
        norm_T2 = _unscale(norm_T2, e_O + e_V + e_M)
        ratio = _unscale(ratio, e_M - e_O - e_V)

    reason = np.full(tuple(P.shape), "", dtype=object)
    zero_np = zero.cpu().numpy()
    nil_np = nil.cpu().numpy()
    ratio_np = ratio.cpu().numpy()
    reason[zero_np] = f"zero head: ||T||_F <= {dtol:.0e} * ||O||_F ||V||_F"
    for idx in np.argwhere(nil_np):
        key = tuple(idx)
        reason[key] = f"nilpotent head: ||T^2||_F / ||T||_F^2 = {float(ratio_np[key]):.2e} <= {dtol:.0e}"
    return alpha, P, norm, norm_T2, inner, reason


@dataclass(repr=False)
class Closure(ImmutableResult, DrawnResult):
    """Closure of a batch of heads (SPEC sections 2-3). All tensors float64 on the CPU. Immutable
    (:class:`~tl_idempotence.core.tables.ImmutableResult`): assigning a field raises
    ``dataclasses.FrozenInstanceError``; ``dataclasses.replace`` gives a changed copy.

    Attributes:
        alpha: best scale ``α = ⟨T², T⟩_F / ‖T‖²_F``, ``[*batch]`` (units of the
            weights: α scales like ‖O‖·‖V‖). 0 for nilpotent heads, NaN for zero heads.
        P: squared closure alignment ``⟨T², T⟩² / (‖T²‖² ‖T‖²) ∈ [0, 1]``, ``[*batch]``;
            NaN when undefined (see ``reason``).
        norm: ``‖T‖_F``, ``[*batch]``.
        norm_T2: ``‖T²‖_F``, ``[*batch]``.
        inner: ``⟨T², T⟩_F``, ``[*batch]``.
        rank_O, rank_V: numerical ranks (``s > rtol · s_max``, see
            :func:`~tl_idempotence.core.factors.rank_rtol`), ``[*batch]`` int64.
        rtol: the relative rank tolerance used (degeneracy uses ``DEGENERATE_RTOL``).
        reason: numpy object array ``[*batch]``: "" where P is defined, otherwise why not.
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

    frozen_name: ClassVar[str] = "a closure result is"
    frozen_hint: ClassVar[str] = "dataclasses.replace(c, ...) for a changed copy, c[idx] for some heads"

    @property
    def shape(self) -> torch.Size:
        """Leading (batch) shape."""
        return self.P.shape

    def __getitem__(self, idx: Any) -> Closure:
        """Index every field by the same leading index (e.g. ``c[3]`` or ``c[:, 2]``)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, Tensor):
                out[f.name] = v[idx]
            elif isinstance(v, np.ndarray):
                out[f.name] = np.asarray(v[idx if not isinstance(idx, Tensor) else idx.numpy()], dtype=object)
            else:
                out[f.name] = v
        return Closure(**out)

    @property
    def heads(self) -> Any:
        """One row per head (flattened batch): ``index, alpha, P, norm, norm_T2, rank_O, rank_V, reason``."""
        import pandas as pd

        cols = flat_fields(self, "alpha", "P", "norm", "norm_T2", "rank_O", "rank_V")
        reason = np.asarray(self.reason, dtype=object).reshape(-1).astype(str)
        return pd.DataFrame({"index": np.arange(int(self.P.numel())), **cols, "reason": reason})

    @property
    def summary(self) -> dict[str, Any]:
        """``n_heads``, ``median_P``, ``max_P``, ``n_undefined_P``, ``batch_shape`` (read-only)."""
        P = self.P.reshape(-1).numpy()
        fin = P[np.isfinite(P)]
        return frozen(
            {
                "n_heads": int(P.size),
                "batch_shape": list(self.P.shape),
                "median_P": float(np.median(fin)) if fin.size else float("nan"),
                "max_P": float(fin.max()) if fin.size else float("nan"),
                "n_undefined_P": int(P.size - fin.size),
            }
        )


def flat_fields(result: Any, *names: str) -> dict[str, np.ndarray]:
    """The tensor fields ``names`` of a batch result, each flattened to a column (``[n]``, the batch in row-major
    order, the field's own units): one row per head (:attr:`Closure.heads`, the scramble's ``heads``)."""
    return {k: getattr(result, k).reshape(-1).numpy() for k in names}


def closure_from_grams(g: Grams, factors: bool = False) -> Closure:
    """Closure metrics from precomputed :class:`Grams` (SPEC sections 2-3).

    Args:
        g: Gram products, batch shape ``[*batch]``.
        factors: also compute K, D (principal coordinates) and eigenvalues of T.

    Returns:
        :class:`Closure` with batch shape ``[*batch]``, in the weights' own units (any
        power-of-two rescaling of ``g`` undone).

    Degenerate heads never raise: ``‖T‖ ≈ 0`` (zero head) gives α = P = NaN;
    ``‖T²‖ ≈ 0`` relative to ``‖T‖²`` (nilpotent head) gives α = 0 and P = NaN;
    ``reason`` says which, with the tolerance (:data:`DEGENERATE_RTOL`, relative).
    """
    G_O, G_V, M = g.G_O, g.G_V, g.M
    rtol = rank_rtol(g.d_model, G_O.shape[-1])
    exps = None if g.e_T is None else (g.e_O, g.e_V, g.e_T)
    alpha, P, norm, norm_T2, inner, reason = closure_scalars(G_O, G_V, M, exps)  # type: ignore[arg-type]
    K = D = eig = None
    if factors:
        K, D, rank_O, rank_V = principal_factors(G_O, G_V, M, rtol)
        ev = torch.linalg.eigvals(M)
        order = ev.abs().argsort(dim=-1, descending=True)
        eig = torch.gather(ev, -1, order)
        K = _unscale(K, g.e_T)
        if g.e_T is not None and bool(g.e_T.any()):
            eig = torch.complex(_unscale(eig.real, g.e_T), _unscale(eig.imag, g.e_T))
    else:
        rank_O = gram_rank(G_O, rtol)
        rank_V = _shared_rank(G_V, g.kv_head_of, rtol)
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


def _shared_rank(G_V: Tensor, kv_head_of: Tensor | None, rtol: float) -> Tensor:
    """Numerical rank of each ``G_V``; one eigendecomposition per kv head when heads share it."""
    if kv_head_of is None or G_V.ndim != 3 or kv_head_of.shape != G_V.shape[:1]:
        return gram_rank(G_V, rtol)
    kvs, inverse = torch.unique(kv_head_of, return_inverse=True)
    if len(kvs) == len(kv_head_of):
        return gram_rank(G_V, rtol)
    first = torch.stack([(kv_head_of == k).nonzero()[0, 0] for k in kvs])
    return gram_rank(G_V[first], rtol)[inverse]


def _as_tensor(x: Any, name: str) -> Tensor:
    if isinstance(x, Tensor):
        check_storage(x, name)
        return x.detach()
    if isinstance(x, np.ndarray):
        if x.dtype == object:
            raise OptionTypeError(f"{name} is a numpy object array; pass numbers.")
        return torch.from_numpy(x)
    raise OptionTypeError(f"{name} must be a torch.Tensor or numpy array, got {type(x).__name__}.")


def head_pair(x: Any, what: str = "closure()") -> tuple[Tensor, Tensor]:
    """``(W_V, W_O)`` in TransformerLens row form from a FactoredMatrix or a pair, checked.

    Args:
        x: a TransformerLens ``FactoredMatrix`` (``A = W_V [*batch, d_model, d_head]``,
            ``B = W_O [*batch, d_head, d_model]``, ``A @ B = Tᵀ``) such as ``model.OV`` or
            ``model.OV[l, h]``, or a pair ``(W_V, W_O)`` of tensors / numpy arrays.
        what: the caller, for messages.

    Returns:
        ``(W_V [*batch, d_model, d_head], W_O [*batch, d_head, d_model])``.

    Raises:
        OptionTypeError: neither a FactoredMatrix nor a pair of arrays.
        WeightError: shapes that do not pair or broadcast, non-float or non-finite weights.
    """
    if hasattr(x, "A") and hasattr(x, "B") and not isinstance(x, (tuple, list)):
        W_V, W_O = _as_tensor(x.A, "FactoredMatrix.A (W_V)"), _as_tensor(x.B, "FactoredMatrix.B (W_O)")
    elif isinstance(x, (tuple, list)) and len(x) == 2:
        W_V, W_O = _as_tensor(x[0], "W_V"), _as_tensor(x[1], "W_O")
    else:
        raise OptionTypeError(
            f"{what} expects a TransformerLens FactoredMatrix (e.g. model.OV or model.OV[l, h]; A = W_V, B = W_O), a "
            f"(W_V, W_O) pair of tensors in TransformerLens row form, or a LayerHeads; got {type(x).__name__}."
        )
    if W_V.ndim < 2 or W_O.ndim < 2:
        raise WeightError(f"W_V and W_O must be at least 2-D; got shapes {tuple(W_V.shape)} and {tuple(W_O.shape)}.")
    d_model, d_head = W_V.shape[-2:]
    if W_O.shape[-2:] != (d_head, d_model):
        raise WeightError(
            f"W_V {tuple(W_V.shape)} and W_O {tuple(W_O.shape)} do not pair: expected W_V [..., d_model, d_head] and "
            "W_O [..., d_head, d_model] (TransformerLens row form). Did you pass (W_O, W_V) or the column form?"
        )
    try:
        broadcast_batch(W_V.shape[:-2], W_O.shape[:-2])
    except RuntimeError as e:
        raise WeightError(f"Leading dims of W_V {tuple(W_V.shape)} and W_O {tuple(W_O.shape)} do not broadcast.") from e
    if d_model == 0 or d_head == 0:
        raise WeightError(f"Empty heads: W_V {tuple(W_V.shape)}, W_O {tuple(W_O.shape)}.")
    check_weights(W_V, "W_V", "head")
    check_weights(W_O, "W_O", "head")
    return W_V, W_O


@strict_kwargs
def closure(
    heads: HeadWeightsLike,
    *,
    factors: bool = True,
    compute_dtype: DtypeLike = DEFAULT_COMPUTE_DTYPE,
    device: DeviceLike = DEFAULT_DEVICE,
) -> Closure:
    """Closure of every head in a FactoredMatrix, a ``(W_V, W_O)`` pair or a LayerHeads (SPEC 2-3).

    Args:
        heads: a TransformerLens ``FactoredMatrix`` such as ``model.OV`` (all heads) or
            ``model.OV[l, h]`` (one), a pair ``(W_V, W_O)`` of tensors / numpy arrays in TL
            row form (``W_V [*batch, d_model, d_head]``, ``W_O [*batch, d_head, d_model]``,
            leading dims broadcast; ``W_V @ W_O == Tᵀ``), or a
            :class:`~tl_idempotence.core.heads.LayerHeads` (column form, kv heads shared).
            Any real float dtype.
        factors (bool): also return K, D and the eigenvalues (default True).
        compute_dtype (torch.dtype | str): dtype of the ``d_model``-long products (float64
            default, or float32).
        device (str | torch.device): where the products run ("cpu", "cuda", "auto"); results
            are CPU float64. (Every argument is validated here, where it enters.)

    Returns:
        :class:`Closure` with the broadcast leading shape (``[n_heads]`` for a LayerHeads).

    Raises:
        OptionTypeError: ``heads`` is not one of the above; a bad option type.
        WeightError: shapes do not pair, non-float or NaN/inf weights (names the head).
        OptionError / DeviceError: a bad ``compute_dtype`` or ``device``.
    """
    factors = check_bool(factors, "factors")
    dtype = check_compute_dtype(compute_dtype)
    dev = check_device(device)
    if isinstance(heads, LayerHeads):
        heads.check_finite()
        g = layer_grams(heads.O, heads.V, heads.kv_head_of, compute_dtype=dtype, device=dev)
        return closure_from_grams(g, factors=factors)
    W_V, W_O = head_pair(heads)
    return closure_from_grams(grams(W_O.transpose(-1, -2), W_V, compute_dtype=dtype, device=dev), factors=factors)
