"""Constructive search (SPEC section 5): how much closure a head's spectrum and angles allow.

For a head with singular values ``S`` of ``K`` (= of ``T``) and principal cosines
``D`` (SPEC 3), keep both fixed and maximize ``P`` over orientations
``K = R₁ S R₂ᵀ``, ``R₁ ∈ O(rank_O)``, ``R₂ ∈ O(rank_V)``. The paper's claim is that
high closure is *feasible* in every surveyed layer but usually not *attained*: the
searched P is the feasible P, the trained P the attained one.

Method (ours): with ``X = R₂ᵀ D R₁`` (see :mod:`tl_idempotence.analyses.orientation`)::

    P(R₁, R₂) = (Σ_i s_i³ X_ii)² / (Σ_i s_i² · Σ_ij s_i² s_j² X_ij²)

The Euclidean gradient ``G_X = ∂P/∂X`` is closed form; the Riemannian gradients in
the left trivialization are ``Ω₁ = skew(Xᵀ G_X)`` and ``Ω₂ = skew(X G_Xᵀ)`` (restricted
to the rank blocks). Each restart does Adam on these Lie-algebra coordinates and
moves by the Cayley retraction ``R ← R (I − A/2)⁻¹ (I + A/2)`` (exactly orthogonal),
halving its step after ``patience`` iterations without an improvement of ``tol``;
it stops on *tolerance* after ``n_decays`` such halvings (or at P ≥ 1 − 10·eps of the working dtype) and on
*budget* after ``max_iters``. Restart 0 starts at the trained orientation (full-rank
heads), so the searched P is never below the trained P by more than rounding; the
others start at Haar-random orientations seeded by ``(seed, layer, head)`` (one generator
per head, :func:`~tl_idempotence.core.random.head_generator`: a head's result never depends
on which other heads or layers were searched, nor in what order). Restarts and
heads are batched.

Honesty: the reported ``P_searched`` is recomputed in float64 from the returned
``K = R₁ S R₂ᵀ`` (``R``'s re-orthonormalized first) with the plain ``r x r`` formula
``⟨KDK, K⟩² / (‖KDK‖² ‖K‖²)``, never the optimizer's running value.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, cast

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from ..core.defaults import DEFAULT_COMPUTE_DTYPE, DEFAULT_DEVICE, DEFAULT_THRESHOLD
from ..core.frozen import frozen
from ..core.heads import LayerHeads, source_info
from ..core.option_specs import GeneralOptions
from ..core.options import check_compute_dtype, check_device, check_int, check_seed, check_threshold, strict_kwargs
from ..core.random import embed_orthogonal, haar_orthogonal, head_generator, sign_fixed_qr
from ..core.selection import select_heads
from ..core.tables import ImmutableResult
from ..errors import OptionError, OptionTypeError
from ..maths.closure import Closure, closure, closure_from_grams
from ..sources.dispatch import head_source
from ..views.results import DrawnResult
from .base import LayerContext, LayerResult, nan_max, nan_median
from .orientation import Factors, P_of_K, defined_for_orientation, factors_of, factors_of_closure
from .threshold import closed_flags, count_closed

if TYPE_CHECKING:  # pragma: no cover
    from ..core.hints import (
        ArchitectureLike,
        DeviceLike,
        DtypeLike,
        FloatLike,
        HeadsLike,
        HeadWeightsLike,
        IntLike,
        ModelLike,
        RealLike,
    )

__all__ = ["DEFAULTS", "SearchAnalysis", "SearchResult", "constructive_search", "search_factors"]

#: Default search budget: a SmolLM2 layer (9 heads, d_head 64) takes a few seconds.
DEFAULTS: dict[str, Any] = {
    "restarts": 2,
    "max_iters": 200,
    "lr": 0.1,
    "tol": 1e-6,
    "patience": 20,
    "n_decays": 3,
    "dtype": torch.float32,
}


def _skew(A: Tensor) -> Tensor:
    return 0.5 * (A - A.transpose(-1, -2))


def _optimize(
    s: Tensor,
    cos: Tensor,
    blk_O: Tensor,
    blk_V: Tensor,
    R1: Tensor,
    R2: Tensor,
    max_iters: int,
    lr: float,
    tol: float,
    patience: int,
    n_decays: int,
    dtype: torch.dtype = torch.float32,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Riemannian Adam on O(r) x O(r) for a batch of problems.

    Args:
        s, cos: ``[B, r]``; blk_O, blk_V: ``[B, r, r]`` 0/1 masks of the rank blocks;
        R1, R2: ``[B, r, r]`` starting orientations.
        dtype: working dtype of the iterations (float32 halves the cost; the caller
            re-orthonormalizes and re-evaluates the result in float64).

    Returns:
        best R1, best R2 (``[B, r, r]``, ``dtype``), iterations ``[B]``, converged ``[B]`` bool.
    """
    s, cos, blk_O, blk_V, R1, R2 = (t.to(dtype) for t in (s, cos, blk_O, blk_V, R1, R2))
    one_minus = 1.0 - max(1e-12, 10 * torch.finfo(dtype).eps)
    tiny = torch.finfo(dtype).tiny
    s = s / s.amax(-1, keepdim=True).clamp_min(tiny)  # P is invariant to the scale of s
    B, r = s.shape
    s2 = s * s
    s3 = s2 * s
    z = s2.sum(-1)
    w = s2.unsqueeze(-1) * s2.unsqueeze(-2)
    D = cos.unsqueeze(-1)  # scales rows
    eye = torch.eye(r, dtype=s.dtype, device=s.device)
    m1 = torch.zeros_like(R1)
    v1 = torch.zeros_like(R1)
    m2 = torch.zeros_like(R2)
    v2 = torch.zeros_like(R2)
    b1, b2, eps = 0.9, 0.999, 1e-12
    best = torch.full((B,), -1.0, dtype=s.dtype, device=s.device)
    best_R1, best_R2 = R1.clone(), R2.clone()
    since = torch.zeros(B, dtype=torch.long, device=s.device)
    decays = torch.zeros(B, dtype=torch.long, device=s.device)
    step_scale = torch.full((B,), float(lr), dtype=s.dtype, device=s.device)
    done = torch.zeros(B, dtype=torch.bool, device=s.device)
    iters = torch.full((B,), max_iters, dtype=torch.long, device=s.device)
    for it in range(1, max_iters + 1):
        X = R2.transpose(-1, -2) @ (D * R1)
        N = (s3 * X.diagonal(dim1=-2, dim2=-1)).sum(-1)
        Q = (w * X * X).sum((-1, -2)).clamp_min(tiny)
        f = N * N / (z * Q)
        # Track the best point; plateau -> decay the step; enough decays -> converged.
        improved = f > best + tol
        better = f > best
        best_R1[better] = R1[better]
        best_R2[better] = R2[better]
        best = torch.where(better, f, best)
        since = torch.where(improved, torch.zeros_like(since), since + 1)
        plateau = ~done & (since >= patience)
        decays = decays + plateau.long()
        step_scale = torch.where(plateau, step_scale * 0.5, step_scale)
        since = torch.where(plateau, torch.zeros_like(since), since)
        newly = ~done & ((decays >= n_decays) | (best >= one_minus))
        iters = torch.where(newly, torch.full_like(iters, it), iters)
        done = done | newly
        if bool(done.all()):
            break
        c1 = (2.0 * N / (z * Q)).unsqueeze(-1)
        c2 = (2.0 * N * N / (z * Q * Q)).unsqueeze(-1).unsqueeze(-1)
        Gx = -c2 * (w * X)
        Gx.diagonal(dim1=-2, dim2=-1).add_(c1 * s3)
        O1 = _skew(X.transpose(-1, -2) @ Gx) * blk_O
        O2 = _skew(X @ Gx.transpose(-1, -2)) * blk_V
        m1.mul_(b1).add_(O1, alpha=1 - b1)
        v1.mul_(b2).addcmul_(O1, O1, value=1 - b2)
        m2.mul_(b1).add_(O2, alpha=1 - b1)
        v2.mul_(b2).addcmul_(O2, O2, value=1 - b2)
        bc1, bc2 = 1 - b1**it, 1 - b2**it
        sc = (step_scale * (~done).to(s.dtype)).view(B, 1, 1)
        A1 = sc * (m1 / bc1) / ((v1 / bc2).sqrt() + eps)
        A2 = sc * (m2 / bc1) / ((v2 / bc2).sqrt() + eps)
        A = torch.stack([A1, A2])  # skew (m skew, v symmetric)
        C = torch.linalg.solve(eye - 0.5 * A, eye + 0.5 * A)  # Cayley: orthogonal
        R1 = R1 @ C[0]
        R2 = R2 @ C[1]
        if it % 50 == 0:
            R1, R2 = sign_fixed_qr(R1), sign_fixed_qr(R2)
    else:
        X = R2.transpose(-1, -2) @ (D * R1)
        N = (s3 * X.diagonal(dim1=-2, dim2=-1)).sum(-1)
        Q = (w * X * X).sum((-1, -2)).clamp_min(tiny)
        f = N * N / (z * Q)
        better = f > best
        best_R1[better] = R1[better]
        best_R2[better] = R2[better]
    return best_R1, best_R2, iters, done


@dataclass(repr=False)
class SearchResult(ImmutableResult, DrawnResult):
    """Result of :func:`constructive_search`. Immutable (:class:`~tl_idempotence.core.tables.ImmutableResult`):
    assigning a field raises ``dataclasses.FrozenInstanceError``, :attr:`table` is a copy made on each read.

    Attributes:
        table: one row per searched head: ``layer, head, P`` (trained, attained),
            ``P_searched`` (feasible; float64 check of ``K``), ``search_iters``,
            ``search_stopped_on`` ("tolerance" | "budget"), ``search_best_restart``
            (0 = the trained start), ``search_reason``, ``feasible``. Also :attr:`heads`.
        K: ``[n_rows, r, r]`` float64, the best orientation ``K = R₁ S R₂ᵀ`` per row in
            principal coordinates (``T = Q_O K Q_Vᵀ`` with ``Q_Vᵀ Q_O = diag(D)``; rows
            act on the first ``rank_O`` O-side coordinates, columns on the first
            ``rank_V`` V-side ones), in the weights' units.
        D: ``[n_rows, r]`` the principal cosines (unchanged by the search).
        S: ``[n_rows, r]`` the singular values (unchanged by the search).
        threshold: the P threshold of ``feasible``.
    """

    table: pd.DataFrame
    K: Tensor
    D: Tensor
    S: Tensor
    threshold: float = DEFAULT_THRESHOLD

    repr_keys: ClassVar[tuple[str, ...]] = ("n_heads", "max_P_searched", "n_feasible", "n_budget_stops")
    frozen_name: ClassVar[str] = "a search result is"
    frozen_hint: ClassVar[str] = "dataclasses.replace(r, ...) for a changed copy"

    @property
    def heads(self) -> pd.DataFrame:
        """The per-head table (:attr:`table`)."""
        return self.table

    @property
    def summary(self) -> dict[str, Any]:
        """``n_heads, max_P_searched, median_P_searched, n_feasible, n_budget_stops, threshold`` (read-only)."""
        table = self.table
        Ps = table["P_searched"].to_numpy(dtype=float)
        fin = Ps[np.isfinite(Ps)]
        return frozen(
            {
                "n_heads": len(table),
                "max_P_searched": nan_max(fin),
                "median_P_searched": nan_median(fin),
                "n_feasible": int((fin >= self.threshold).sum()),
                "n_budget_stops": int((table["search_stopped_on"] == "budget").sum()),
                "threshold": self.threshold,
            }
        )


def search_factors(
    f: Factors,
    rows: list[int],
    gen_of: Callable[[int], torch.Generator],
    budget: dict[str, Any],
    device: torch.device | str = "cpu",
) -> tuple[Tensor, Tensor, Tensor, Tensor, np.ndarray, Tensor, Tensor, Tensor]:
    """Constructive search (SPEC 5) of heads ``rows`` of flattened :class:`~.orientation.Factors`.

    Args:
        f: the heads' factors.
        rows: indices into ``f``'s batch.
        gen_of: ``row -> generator`` of that row's random restarts (a per-head generator,
            :func:`~tl_idempotence.core.random.head_generator`), so a head's result depends only on
            ``(seed, layer, head)``, never on which other heads were searched.
        budget: the validated budget (:data:`DEFAULTS` keys).
        device: where the optimizer iterations run.

    Returns:
        ``(P_searched [n], iters [n], converged [n] bool, best_restart [n], reason [n],
        K [n, r, r], D [n, r], S [n, r])``, CPU, K and S in ``f``'s units (``2^e_S``).

    Raises:
        OptionError / OptionTypeError: from ``gen_of`` (a bad seed or head index).
    """
    restarts = int(budget["restarts"])
    r = f.S.shape[-1]
    idx = torch.as_tensor(rows, dtype=torch.long)
    n = len(rows)
    reason = f.reason[idx.numpy()] if n else np.array([], dtype=object)
    ok = defined_for_orientation(reason)
    P_out = torch.full((n,), float("nan"), dtype=torch.float64)
    it_out = torch.zeros(n, dtype=torch.long)
    conv_out = torch.zeros(n, dtype=torch.bool)
    best_out = torch.full((n,), -1, dtype=torch.long)
    K_out = torch.zeros((n, r, r), dtype=torch.float64)
    S = f.S[idx]
    cos = f.cos[idx]
    if not ok.any():
        return P_out, it_out, conv_out, best_out, reason, K_out, cos, S
    sub = torch.from_numpy(np.nonzero(ok)[0])
    hs = idx[sub]
    b = len(hs)
    rO, rV = f.rank_O[hs], f.rank_V[hs]
    ar = torch.arange(r)
    mO = (ar < rO.unsqueeze(-1)).to(torch.float64)
    mV = (ar < rV.unsqueeze(-1)).to(torch.float64)
    blk_O = mO.unsqueeze(-1) * mO.unsqueeze(-2)
    blk_V = mV.unsqueeze(-1) * mV.unsqueeze(-2)
    # Starts: restart 0 = trained orientation (full-rank heads), the others Haar in the rank blocks.
    R1 = torch.empty(b, restarts, r, r, dtype=torch.float64)
    R2 = torch.empty_like(R1)
    for j in range(b):
        gen = gen_of(int(hs[j]))
        R1[j] = embed_orthogonal(haar_orthogonal(restarts, int(rO[j]), gen), r)
        R2[j] = embed_orthogonal(haar_orthogonal(restarts, int(rV[j]), gen), r)
    U, _, Wh = torch.linalg.svd(f.K[hs])
    Sk = f.S[hs]  # descending like svd's, exactly zero beyond min(rank_O, rank_V)
    full = (rO == r) & (rV == r)
    R1[full, 0] = U[full]
    R2[full, 0] = Wh[full].transpose(-1, -2)
    s_b = Sk.unsqueeze(1).expand(b, restarts, r).reshape(-1, r)
    cos_b = f.cos[hs].unsqueeze(1).expand(b, restarts, r).reshape(-1, r)
    bo = blk_O.unsqueeze(1).expand(b, restarts, r, r).reshape(-1, r, r)
    bv = blk_V.unsqueeze(1).expand(b, restarts, r, r).reshape(-1, r, r)
    dev = torch.device(device)
    R1b, R2b, iters, conv = _optimize(
        s_b.to(dev),
        cos_b.to(dev),
        bo.to(dev),
        bv.to(dev),
        R1.reshape(-1, r, r).to(dev),
        R2.reshape(-1, r, r).to(dev),
        max_iters=int(budget["max_iters"]),
        lr=float(budget["lr"]),
        tol=float(budget["tol"]),
        patience=int(budget["patience"]),
        n_decays=int(budget["n_decays"]),
        dtype=budget["dtype"],
    )
    R1b, R2b = sign_fixed_qr(R1b.double().cpu()), sign_fixed_qr(R2b.double().cpu())
    iters, conv = iters.cpu(), conv.cpu()
    K = (R1b * s_b.unsqueeze(-2)) @ R2b.transpose(-1, -2)
    Pk = P_of_K(K, cos_b).reshape(b, restarts)  # the honest float64 value
    Pk = torch.nan_to_num(Pk, nan=-1.0)
    best = Pk.argmax(-1)
    ar_b = torch.arange(b)
    P_out[sub] = Pk[ar_b, best]
    it_out[sub] = iters.reshape(b, restarts)[ar_b, best]
    conv_out[sub] = conv.reshape(b, restarts)[ar_b, best]
    best_out[sub] = best
    K_out[sub] = K.reshape(b, restarts, r, r)[ar_b, best]
    S[sub] = Sk
    return P_out, it_out, conv_out, best_out, reason, K_out, cos, S


def _budget(restarts: Any, max_iters: Any, lr: Any, tol: Any) -> dict[str, Any]:
    bud = dict(DEFAULTS)
    if restarts is not None:
        bud["restarts"] = check_int(restarts, "restarts", 1, 10_000)
    if max_iters is not None:
        bud["max_iters"] = check_int(max_iters, "max_iters", 1, 10_000_000)
    for k, v in (("lr", lr), ("tol", tol)):
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float, np.floating)):
            raise OptionTypeError(f"{k} must be a real number; got {type(v).__name__} {v!r}.")
        bud[k] = float(v)
    if not (np.isfinite(bud["lr"]) and bud["lr"] > 0) or not (np.isfinite(bud["tol"]) and bud["tol"] >= 0):
        raise OptionError(f"lr must be a finite number > 0 and tol finite >= 0; got {bud['lr']} and {bud['tol']}.")
    return bud


def _is_pair(x: Any) -> bool:
    """A ``(W_V, W_O)`` pair of tensors / arrays (not a list of LayerHeads or of (layer, head) pairs)."""
    return isinstance(x, (tuple, list)) and len(x) == 2 and all(isinstance(t, (Tensor, np.ndarray)) for t in x)


def _table(layer: Any, heads: Any, P: Tensor, res: tuple) -> pd.DataFrame:
    P_s, it, conv, best, reason, *_ = res
    return pd.DataFrame(
        {
            "layer": layer,
            "head": heads,
            "P": P.numpy(),
            "P_searched": P_s.numpy(),
            "search_iters": it.numpy(),
            "search_stopped_on": np.where(conv.numpy(), "tolerance", "budget"),
            "search_best_restart": best.numpy(),
            "search_reason": np.asarray(reason, dtype=object).astype(str),
        }
    )


@strict_kwargs
def constructive_search(
    model: ModelLike | Closure | HeadWeightsLike,
    heads: HeadsLike | Iterable[IntLike] | None = None,
    *,
    restarts: IntLike | None = None,
    max_iters: IntLike | None = None,
    lr: FloatLike | None = None,
    tol: FloatLike | None = None,
    seed: IntLike = 0,
    threshold: RealLike = DEFAULT_THRESHOLD,
    compute_dtype: DtypeLike = DEFAULT_COMPUTE_DTYPE,
    device: DeviceLike = DEFAULT_DEVICE,
    architecture: ArchitectureLike | None = None,
    prefix: str | None = None,
) -> SearchResult:
    """Maximize P over orientations with S and D fixed, for chosen heads (SPEC 5; paper:
    "high closure is feasible in every surveyed layer, but usually not attained").

    Args:
        model: a model or checkpoint (anything :func:`~tl_idempotence.sources.dispatch.head_source`
            takes), a :class:`~tl_idempotence.core.heads.LayerHeads`, a factored
            :class:`~tl_idempotence.maths.closure.Closure` (``tli.closure(...)``), a
            ``FactoredMatrix`` or a ``(W_V, W_O)`` pair.
        heads: for a model, ``[(layer, head), ...]`` (default: every head); for a
            LayerHeads, head indices; for a Closure/pair, indices into the flattened
            batch (default: all).
        restarts (int): overrides :data:`DEFAULTS` (restart 0 starts at the trained orientation).
        max_iters (int): overrides :data:`DEFAULTS`.
        lr (float): overrides :data:`DEFAULTS`.
        tol (float): overrides :data:`DEFAULTS`.
        seed (int): non-negative seed (mixed with the layer and head, see
            :func:`~tl_idempotence.core.random.head_generator`).
        threshold (float): P threshold, reported as ``feasible`` per row.
        compute_dtype (torch.dtype | str): dtype of the ``d_model``-long products.
        device (str | torch.device): where the Gram products and the optimizer run ("cpu",
            "cuda", "auto"); results are CPU float64.
        architecture: checkpoint option (see ``head_source``).
        prefix: checkpoint option (see ``head_source``).

    Every argument is validated here, where it enters.

    Returns:
        :class:`SearchResult` (``table`` has ``feasible = P_searched >= threshold``).

    Raises:
        OptionError / OptionTypeError: bad budget, unknown layer/head, threshold outside [0, 1].
        UnsupportedModelError: unsupported ``model``.
    """
    threshold = check_threshold(threshold)
    seed = check_seed(seed)
    dtype = check_compute_dtype(compute_dtype)
    dev = check_device(device)
    bud = _budget(restarts, max_iters, lr, tol)
    if isinstance(model, (LayerHeads, Closure)) or _is_pair(model) or (hasattr(model, "A") and hasattr(model, "B")):
        c = (
            model
            if isinstance(model, Closure)
            else closure(cast("HeadWeightsLike", model), factors=True, compute_dtype=dtype, device=dev)
        )
        layer = model.layer if isinstance(model, LayerHeads) else None
        parts = [_search_rows(factors_of_closure(c), c.P, layer, _head_rows(heads, int(c.P.numel())), seed, bud, dev)]
    else:
        src = head_source(cast("ModelLike", model), architecture=architecture, prefix=prefix)
        parts = _search_source(src, heads, seed, dtype, dev, bud)
    return _search_result(parts, threshold)


#: One searched block of heads: its table rows and the best orientation's K, D and S (see :class:`SearchResult`).
_Part = tuple[pd.DataFrame, Tensor, Tensor, Tensor]


def _head_rows(hs: Any, n: int) -> list[int]:
    """The head indices to search among ``n`` heads (``None``: every one), validated.

    Raises:
        OptionTypeError: ``hs`` is not a sequence of ints. OptionError: empty, or a head repeated.
    """
    if hs is None:
        return list(range(n))
    if isinstance(hs, (str, bytes)) or not isinstance(hs, Iterable):
        raise OptionTypeError(f"heads must be a sequence of head indices here; got {type(hs).__name__} {hs!r:.80}.")
    out = [check_int(h, f"heads[{i}]", 0) for i, h in enumerate(hs)]
    if not out:
        raise OptionError("heads is empty; pass None for every head.")
    dup = sorted({h for h in out if out.count(h) > 1})
    if dup:
        raise OptionError(f"heads repeats head(s) {dup}: each head is searched once.")
    return out


def _search_rows(
    f: Factors, P: Tensor, layer: int | None, rows: list[int], seed: int, bud: dict[str, Any], dev: Any
) -> _Part:
    """Search heads ``rows`` of one block of factors (a layer, or a batch when ``layer`` is None).

    Returns:
        The block's table rows (``layer`` -1 for a batch) and its K, D, S (K and S unscaled to the heads' norms).

    Raises:
        OptionError: a head index out of range (names the layer).
    """
    n = int(P.numel())
    bad = [h for h in rows if not 0 <= h < n]
    if bad:
        where = f" in layer {layer}." if layer is not None else "."
        raise OptionError(f"Head index {bad} out of range: there are {n} heads{where}")
    res = search_factors(f, rows, lambda h: head_generator(seed, layer, h, "search"), bud, dev)
    table = _table(
        layer if layer is not None else -1, rows, P.reshape(-1)[torch.as_tensor(rows, dtype=torch.long)], res
    )
    sel = torch.as_tensor(rows, dtype=torch.long)
    e = Factors(
        S=f.S[sel],
        cos=f.cos[sel],
        rank_O=f.rank_O[sel],
        rank_V=f.rank_V[sel],
        P=f.P[sel],
        K=f.K[sel],
        rtol=f.rtol,
        reason=f.reason[sel.numpy()],
        e_S=f.e_S[sel],
    )
    return table, e.unscale(res[5]), res[6], e.unscale(res[7])


def _wanted_heads(heads: Any, all_layers: list[int], n_heads: int) -> dict[int, list[int] | None]:
    """``{layer: head indices}`` of a model to search (``None``: every head of the layer).

    Raises:
        OptionError: a ``(layer, head)`` pair names a layer that is not an attention layer; the errors of
            :func:`~tl_idempotence.core.selection.select_heads`.
    """
    want: dict[int, list[int] | None] = {}
    if heads is None:
        return {layer: None for layer in all_layers}
    if isinstance(heads, Iterable) and not isinstance(heads, (str, bytes)) and not hasattr(heads, "columns"):
        heads = list(heads)
        named = [it[0] for it in heads if isinstance(it, (tuple, list)) and len(it) == 2]
        bad = sorted({int(v) for v in named if isinstance(v, int) and not isinstance(v, bool) and v not in all_layers})
        if bad:
            raise OptionError(f"Unknown layer index {bad}: attention layers are {all_layers}.")
    want.update(select_heads(heads, all_layers, n_heads))
    return want


def _search_source(src: Any, heads: Any, seed: int, dtype: Any, dev: Any, bud: dict[str, Any]) -> list[_Part]:
    """Search the chosen heads of a head source, layer by layer (each layer's Gram products computed once)."""
    from .loop import iter_layers

    info = source_info(src)
    want = _wanted_heads(heads, list(src.layers()), info.n_heads)
    opts = GeneralOptions(seed=seed, compute_dtype=dtype, device=dev)
    parts = []
    for w in iter_layers(src, info, opts, layers=list(want), progress=False, desc="search"):
        c = closure_from_grams(w.context().grams, factors=True)  # = closure(heads, factors=True), grams reused
        rows = _head_rows(want[w.layer], w.heads.n_heads)
        parts.append(_search_rows(factors_of_closure(c), c.P, w.layer, rows, seed, bud, dev))
    return parts


def _search_result(parts: list[_Part], threshold: float) -> SearchResult:
    """The :class:`SearchResult` of the searched blocks, in order (``feasible = P_searched >= threshold``)."""
    table = pd.concat([p[0] for p in parts], ignore_index=True)
    table["feasible"] = np.nan_to_num(table["P_searched"].to_numpy(dtype=float), nan=-1.0) >= threshold
    return SearchResult(
        table=table,
        K=torch.cat([p[1] for p in parts]),
        D=torch.cat([p[2] for p in parts]),
        S=torch.cat([p[3] for p in parts]),
        threshold=threshold,
    )


class SearchAnalysis:
    """Constructive search of every head of a layer (report contract, SPEC 5); runs when ``search=True``.

    Per head: ``P_searched, search_iters, search_stopped_on, search_best_restart, search_reason``.
    Per layer: ``feasible_P`` (best searched P in the layer), ``feasible`` (``feasible_P >=
    threshold``), ``feasible_head``, ``n_heads_feasible``, ``n_search_budget_stops``. ``feasible`` and
    ``n_heads_feasible`` are the declared threshold rules (:data:`~tl_idempotence.analyses.search_spec.FEASIBLE`,
    :data:`~tl_idempotence.analyses.search_spec.N_HEADS_FEASIBLE`), computed here with their kernels
    (:func:`~tl_idempotence.analyses.threshold.closed_flags`, :func:`~tl_idempotence.analyses.threshold.count_closed`).
    """

    name: ClassVar[str] = "search"
    reason_column: ClassVar[str | None] = "search_reason"

    def enabled(self, options: GeneralOptions) -> bool:
        """Whether the report runs this analysis (when its option ``search`` is on)."""
        return bool(options["search"])

    def run(self, ctx: LayerContext) -> LayerResult:
        """This analysis of one layer (SPEC 5): the columns, values, tables and notes of the class docstring.

        Raises: nothing of its own for a valid context (the context was built from checked heads and options).
        """
        K, D, rank_O, rank_V = ctx.principal(principal_K=True)
        f = factors_of(K, D, rank_O, rank_V, ctx.closure, ctx.grams.e_T)
        rows = list(range(ctx.n_heads))
        res = search_factors(f, rows, lambda h: ctx.head_generator("search", h), dict(DEFAULTS), ctx.device)
        df = _table(ctx.layer, rows, ctx.closure.P, res)
        Ps = df["P_searched"].to_numpy(dtype=float)
        fin = np.isfinite(Ps)
        fP = float(Ps[fin].max()) if fin.any() else float("nan")
        values = {
            "feasible_P": fP,
            "feasible": bool(closed_flags(fP, ctx.options.threshold)),
            "feasible_head": int(np.nanargmax(np.where(fin, Ps, -np.inf))) if fin.any() else -1,
            "n_heads_feasible": count_closed(Ps, ctx.options.threshold),
            "n_search_budget_stops": int((df["search_stopped_on"] == "budget").sum()),
        }
        notes = {} if fin.any() else {"feasible_P": "no head of the layer could be searched (see search_reason)"}
        cols = {
            c: df[c].to_numpy()
            for c in ("P_searched", "search_iters", "search_stopped_on", "search_best_restart", "search_reason")
        }
        return LayerResult(columns=cols, values=values, notes=notes)

    def summarize(
        self, heads: pd.DataFrame, layers: pd.DataFrame, tables: dict[str, pd.DataFrame], options: GeneralOptions
    ) -> dict[str, Any]:
        """Model-level headline numbers (SPEC 5) from the concatenated per-layer results (JSON values)."""
        feas = layers["feasible"].to_numpy(dtype=bool)
        return {"n_feasible_layers": int(feas.sum()), "infeasible_layers": [int(v) for v in layers.loc[~feas, "layer"]]}
