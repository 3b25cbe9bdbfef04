"""Weights-only facts of each head that say how far it is from an orthogonal projection (SPEC 12, 13).

docs/definitions.md §12 proves ``copying = sign(α)`` on a tied model for ``T = α Π`` with ``Π`` an **orthogonal**
projection; these numbers say how far each head is from that case. Column form ``T = O Vᵀ`` (SPEC 1; GQA: the kv
head's ``V``), every number from ``d_head``-sized products (``G_O = Oᵀ O``, ``G_V = Vᵀ V``, ``M = Vᵀ O``); nothing
``d_model x d_model`` is formed.

* **asymmetry** ``‖T - Tᵀ‖_F / ‖T‖_F ∈ [0, 2]``: ``‖T - Tᵀ‖² = 2‖T‖² - 2 tr(T²)`` with ``‖T‖² = ⟨G_O, G_V⟩`` and
  ``tr(T²) = tr(M²)``. 0 for a symmetric ``T`` (an orthogonal projection times α), > 0 for an oblique one. The
  difference cancels for a nearly symmetric head: the absolute error is about ``sqrt(eps64) ≈ 1e-8``.
* **distance from the nearest orthogonal projection** of ``A = T / α`` (α the closure scale, SPEC 2, so that a
  suppressing head ``T = α Π`` with α < 0 compares with ``Π``). For an orthogonal projection ``Π = U Uᵀ`` of rank
  ``k`` (``U`` with ``k`` orthonormal columns), ``‖A - Π‖² = ‖A‖² - 2 tr(Uᵀ A U) + k`` and
  ``tr(Uᵀ A U) = tr(Uᵀ sym(A) U)`` with ``sym(A) = (A + Aᵀ)/2``, largest for the eigenvectors of the ``k`` largest
  eigenvalues ``λ_1 >= ... >= λ_k`` of ``sym(A)`` (Ky Fan), so

      dist_k(A)² = ‖A‖² + k - 2 (λ_1 + ... + λ_k).

  ``proj_rank`` ``k`` is the numerical rank of ``T`` (the singular values of ``R_O R_Vᵀ``, SPEC 3, counted with
  :func:`~tl_idempotence.core.factors.rank_rtol`): "the nearest orthogonal projection of the same rank".
  ``proj_distance = dist_k / ‖A‖`` (relative; 0 for ``T = α Π``). The nearest projection of any rank keeps the
  eigenvalues above 1/2: ``dist_any² = ‖A‖² + Σ_i min(0, 1 - 2λ_i)``, reported as ``proj_distance_any`` with its rank
  ``proj_rank_any`` (a near-idempotent head whose eigenvalues cluster at α and 0 can be close to a projection of
  lower rank than ``T``). ``sym(T) = W S Wᵀ`` with ``W = [O, V]`` and ``S = ½[[0, I], [I, 0]]``, so its nonzero
  eigenvalues are those of ``G^{1/2} S G^{1/2}`` with ``G = Wᵀ W = [[G_O, Mᵀ], [M, G_V]]`` (``2 d_head`` square);
  the other ``d_model - 2 d_head`` eigenvalues are 0. Error: the subtraction leaves about ``1e-8 · sqrt(k)``.
  α zero or undefined: NaN with a reason.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import torch

from ..core.factors import rank_rtol
from ..core.heads import LayerHeads
from ..core.selection import head_labels
from ..errors import OptionError
from .closure import closure
from .ov_edits import principal_frame

if TYPE_CHECKING:  # pragma: no cover
    from collections.abc import Iterable

__all__ = ["PROJECTION_FACT_COLUMNS", "projection_facts"]

#: The columns of :func:`projection_facts`, in order.
PROJECTION_FACT_COLUMNS = (
    "layer", "head", "kv_head", "alpha", "asymmetry", "proj_rank", "proj_distance", "proj_rank_any",
    "proj_distance_any", "reason",
)  # fmt: skip


def _sym_eigenvalues(G_O: torch.Tensor, G_V: torch.Tensor, M: torch.Tensor) -> np.ndarray:
    """The ``2 r`` eigenvalues of ``G^{1/2} S G^{1/2}`` (those of ``sym(T)`` that can be nonzero), descending."""
    r = G_O.shape[0]
    G = torch.cat([torch.cat([G_O, M.T], 1), torch.cat([M, G_V], 1)], 0)
    G = (G + G.T) / 2
    lam, E = torch.linalg.eigh(G)
    root = (E * lam.clamp_min(0).sqrt()) @ E.T
    eye = torch.eye(r, dtype=torch.float64)
    zero = torch.zeros(r, r, dtype=torch.float64)
    S = torch.cat([torch.cat([zero, eye], 1), torch.cat([eye, zero], 1)], 0) / 2
    B = root @ S @ root
    return np.sort(torch.linalg.eigvalsh((B + B.T) / 2).numpy())[::-1]


def _head_facts(O: torch.Tensor, V: torch.Tensor, alpha: float, d_model: int) -> dict:
    O64, V64 = O.detach().to("cpu", torch.float64), V.detach().to("cpu", torch.float64)
    G_O, G_V, M = O64.T @ O64, V64.T @ V64, V64.T @ O64
    nT2 = float((G_O * G_V).sum())
    nan = float("nan")
    out = {"asymmetry": nan, "proj_rank": -1, "proj_distance": nan, "proj_rank_any": -1, "proj_distance_any": nan}
    if not nT2 > 0:
        return {**out, "reason": "zero head (‖T‖ = 0)"}
    out["asymmetry"] = float(np.sqrt(max(2 * nT2 - 2 * float((M * M.T).sum()), 0.0) / nT2))
    if not np.isfinite(alpha) or alpha == 0:
        return {**out, "reason": f"α = {alpha:g}: T/α is undefined"}
    fr = principal_frame(O64, V64)
    s = torch.linalg.svdvals(fr.K)
    k = int(((s > rank_rtol(O.shape[0], O.shape[1]) * s.max()) & (s.max() > 0)).sum())
    lam = _sym_eigenvalues(G_O, G_V, M) / alpha
    n_zero = max(min(k, d_model - lam.size), 0)
    lam = np.sort(np.concatenate([lam, np.zeros(n_zero)]))[::-1]
    nA2 = nT2 / alpha**2
    d_k = nA2 + k - 2 * float(lam[:k].sum())
    d_any = nA2 + float(np.minimum(0.0, 1 - 2 * lam).sum())
    out.update(
        proj_rank=k,
        proj_distance=float(np.sqrt(max(d_k, 0.0) / nA2)),
        proj_rank_any=int((lam > 0.5).sum()),
        proj_distance_any=float(np.sqrt(max(d_any, 0.0) / nA2)),
    )
    return {**out, "reason": ""}


def projection_facts(layers: Iterable[LayerHeads], heads: dict[int, list[int]] | None = None) -> pd.DataFrame:
    """Each head's asymmetry and distance from the nearest orthogonal projection (module docstring; SPEC 12-13).

    Args:
        layers: :class:`~tl_idempotence.core.heads.LayerHeads` (column form; GQA: kv heads shared).
        heads: ``{layer: [head, ...]}`` to measure (None: every head of every layer given).

    Returns:
        One row per head, indexed by ``"L10H8"``: :data:`PROJECTION_FACT_COLUMNS` (``alpha`` in the weights' units,
        the distances and the asymmetry dimensionless; ``proj_rank`` -1 and NaN distances with a ``reason``).

    Raises:
        WeightError: non-finite weights (names layer and head). OptionError: ``heads`` names a layer not given, or a
            head outside its layer.
    """
    rows, seen = [], set()
    for lh in layers:
        seen.add(lh.layer)
        if heads is not None and lh.layer not in heads:
            continue
        lh.check_finite()
        alpha = closure(lh, factors=False).alpha
        hs = range(lh.n_heads) if heads is None else heads[lh.layer]
        bad = [h for h in hs if not 0 <= int(h) < lh.n_heads]
        if bad:
            raise OptionError(f"heads {bad} are not heads of layer {lh.layer} (it has {lh.n_heads}).")
        for h in hs:
            kv = int(lh.kv_head_of[h])
            f = _head_facts(lh.O[h], lh.V[kv], float(alpha[h]), lh.d_model)
            rows.append({"layer": lh.layer, "head": int(h), "kv_head": kv, "alpha": float(alpha[h]), **f})
    missing = sorted(set(heads or {}) - seen)
    if missing:
        raise OptionError(f"heads names layers {missing} that were not given.")
    t = pd.DataFrame(rows, columns=list(PROJECTION_FACT_COLUMNS))
    t.index = head_labels(t["layer"], t["head"])
    return t.astype({"proj_rank": "int64", "proj_rank_any": "int64"})
