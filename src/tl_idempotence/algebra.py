"""Shared-value algebra of GQA/MQA heads (SPEC section 7).

**[paper]** In GQA/MQA the query heads of one kv group share the value read ``V``,
so (column form) ``T_i = O_i Vᵀ`` and::

    T_i T_j = O_i (Vᵀ O_j) Vᵀ = O_i M_j Vᵀ,     M_j = Vᵀ O_j   (d_head x d_head)

If ``M_j ≈ α_j I`` then ``T_i T_j ≈ α_j T_i`` for every ``i`` of the group: a right
action whose scale depends only on the right factor ``j``.

**[ours]** Everything reduces to the Gram products the core already has
(``G_O_i = O_iᵀ O_i``, ``G_V = Vᵀ V``, ``M_j = Vᵀ O_j``; :mod:`tl_idempotence.linalg`).
Using ``‖O X Vᵀ‖²_F = ⟨G_O X, X G_V⟩_F`` and ``⟨O X Vᵀ, O Y Vᵀ⟩_F = ⟨G_O X, Y G_V⟩_F``::

    ‖T_i‖²            = ⟨G_O_i, G_V⟩
    ⟨T_i T_j, T_i⟩    = tr(V M_jᵀ O_iᵀ O_i Vᵀ)        = ⟨M_j, G_O_i G_V⟩
    ‖T_i T_j‖²        = tr(V M_jᵀ G_O_i M_j Vᵀ)        = ⟨G_O_i M_j, M_j G_V⟩

    α_ij = ⟨M_j, G_O_i G_V⟩ / ⟨G_O_i, G_V⟩
    P_ij = ⟨M_j, G_O_i G_V⟩² / (⟨G_O_i M_j, M_j G_V⟩ ⟨G_O_i, G_V⟩)

These are exactly the core's formulas for ``α`` and ``P`` with ``M`` replaced by
``M_j`` and ``G_O`` by ``G_O_i``; so this module evaluates them with
:func:`~tl_idempotence.linalg.closure_from_grams` on the Grams ``(G_O_i, G_V, M_j)``,
and ``i = j`` reproduces the core's ``α`` and ``P`` bit for bit, with the same
degeneracy rules (zero ``T_i`` -> NaN; ``T_i T_j ≈ 0`` -> ``α_ij = 0``, ``P_ij`` NaN).

Per right factor ``j`` (table ``heads``):

* ``alpha_spread`` — the right-action law predicts ``α_ij`` independent of ``i``:
  ``(max_i α_ij − min_i α_ij) / max_i |α_ij|`` (0 when the law holds; at most 2).
* ``law_P`` / ``law_alpha`` — the law for *every* possible left factor: ``T T_j = α T``
  for all ``T = O Vᵀ`` iff ``M_j Vᵀ = α Vᵀ``; ``law_P = cos²(M_j Vᵀ, Vᵀ) =
  ⟨M_j, G_V⟩² / (⟨M_j G_V, M_j⟩ tr G_V)`` and ``law_alpha = ⟨M_j, G_V⟩ / tr G_V``.
* ``idempotence_defect = ‖E² − E‖_F / ‖E‖_F`` for ``E = T_j / α_j``. Expanding with
  ``⟨T², T⟩ = α‖T‖²`` gives exactly ``sqrt(1/P_j − 1)``: the core's ``P`` already is the
  projection test; it is reported in this unit for reading convenience.
* ``kernel_defect`` — how close ``T_j / α_j`` is to *the* projection onto span(O_j)
  along the shared kernel ker(Vᵀ), ``E_j = O_j M_j⁻¹ Vᵀ`` (the unique idempotent with
  that range and kernel; every head of the group shares ker(Vᵀ), so the group's
  ``E_j`` are a family of projections with one kernel and distinct ranges):
  ``‖T_j/α_j − E_j‖_F / ‖E_j‖_F`` with ``X = I/α_j − M_j⁻¹``:
  ``sqrt(⟨G_O X, X G_V⟩ / ⟨G_O M_j⁻¹, M_j⁻¹ G_V⟩)``. It is 0 iff ``M_j = α_j I``
  (then ``α_ij = α_j`` for all ``i``). A closed head whose ``Vᵀ O_j`` has eigenvalues
  at ``α`` *and* at 0 is a projection with a kernel larger than ker(Vᵀ) and gets a
  large kernel defect although its ``P`` is high. NaN when ``M_j`` is singular
  (condition number above ``1/rtol``) or ``α_j`` is 0/NaN.

Closed heads of one group (table ``closed_ranges``): principal angles between their
ranges span(O_a) and span(O_b) (``scipy.linalg.subspace_angles`` on the
``d_model x d_head`` factors; never ``d_model x d_model``).

Group membership comes from the model's kv layout (``LayerHeads.kv_head_of``), never
from comparing floats. MHA layers (every kv group has one query head) have no exact
value sharing: the result is empty with ``reason = "no exact value sharing (MHA)"``.
No approximate-sharing analysis is offered.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import scipy.linalg
import torch

from .heads import LayerHeads, ModelInfo, head_source
from .linalg import Grams, closure_scalars, layer_grams, rank_rtol

__all__ = ["AlgebraPart", "SharedValueAlgebra", "combine_layers", "layer_algebra", "shared_value_algebra"]

MHA_REASON = "no exact value sharing (MHA)"

PAIR_COLUMNS = ["layer", "kv_head", "i", "j", "alpha_ij", "P_ij", "norm_TiTj", "diagonal", "reason"]
HEAD_COLUMNS = [
    "layer", "kv_head", "head", "alpha", "P", "closed", "alpha_ij_min", "alpha_ij_max", "alpha_spread",
    "law_alpha", "law_P", "idempotence_defect", "kernel_defect", "reason",
]
GROUP_COLUMNS = [
    "layer", "kv_head", "n_heads", "heads", "n_closed", "median_P_pairs", "median_P_offdiag", "min_P_offdiag",
    "median_alpha_spread", "max_alpha_spread", "law_score",
]
RANGE_COLUMNS = ["layer", "kv_head", "head_a", "head_b", "min_angle_deg", "max_angle_deg", "mean_cos2", "n_angles"]


@dataclass
class AlgebraPart:
    """One layer's shared-value algebra (see the module docstring for every column).

    Attributes:
        layer: layer index.
        pairs: one row per ordered pair ``(i, j)`` of a kv group (``PAIR_COLUMNS``).
        heads: one row per right factor ``j`` (``HEAD_COLUMNS``).
        groups: one row per kv group (``GROUP_COLUMNS``).
        closed_ranges: one row per unordered pair of closed heads of a group (``RANGE_COLUMNS``).
        matrices: ``{kv_head: (heads, alpha [n, n], P [n, n])}`` with row = ``i`` (left),
            column = ``j`` (right), for the figures.
        reason: "" or why the layer has no algebra (MHA).
    """

    layer: int
    pairs: pd.DataFrame
    heads: pd.DataFrame
    groups: pd.DataFrame
    closed_ranges: pd.DataFrame
    matrices: dict[int, tuple[list[int], np.ndarray, np.ndarray]] = field(default_factory=dict)
    reason: str = ""
    threshold: float = 0.9


def _empty(cols: list[str]) -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=object) for c in cols})


def _inner(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a * b).sum((-1, -2))


def _row(G_Oi: torch.Tensor, G_V: torch.Tensor, M: torch.Tensor):
    """α_ij, P_ij, ‖T_iT_j‖ and reasons for one left factor ``i`` against right factors ``M = M_j`` [n, r, r].

    :func:`~tl_idempotence.linalg.closure_scalars` with ``(G_O, G_V, M) = (G_O_i, G_V, M_j)``,
    so ``i = j`` reproduces the core's α and P bit for bit (tested), degeneracy rules included.
    """
    alpha, P, _, norm_T2, _, reason = closure_scalars(G_Oi.expand_as(M), G_V.expand_as(M), M)
    return alpha, P, norm_T2, [str(x) for x in reason]


def _kernel_defects(G_O: torch.Tensor, G_V: torch.Tensor, M: torch.Tensor, alpha: np.ndarray, rtol: float):
    """``‖T_j/α_j − O_j M_j⁻¹ Vᵀ‖_F / ‖O_j M_j⁻¹ Vᵀ‖_F`` from r x r Grams (module docstring), batched over j.

    Args: ``G_O, M`` ``[n, r, r]``, ``G_V`` ``[r, r]``, ``alpha`` ``[n]``. Returns (defects ``[n]``, reasons).
    """
    n, r = M.shape[0], M.shape[-1]
    s = torch.linalg.svdvals(M)
    singular = (s[:, 0] == 0) | (s[:, -1] <= rtol * s[:, 0])
    Msafe = torch.where(singular[:, None, None], torch.eye(r, dtype=M.dtype).expand_as(M), M)
    Minv = torch.linalg.inv(Msafe)
    a = torch.as_tensor(np.where(np.isfinite(alpha) & (alpha != 0), alpha, 1.0), dtype=M.dtype)
    X = torch.eye(r, dtype=M.dtype) / a[:, None, None] - Minv
    num = _inner(G_O @ X, X @ G_V).clamp_min(0)
    den = _inner(G_O @ Minv, Minv @ G_V)
    out = (num / den).sqrt().numpy().copy()
    reasons = [""] * n
    for j in range(n):
        if not np.isfinite(alpha[j]) or alpha[j] == 0:
            out[j], reasons[j] = np.nan, "kernel defect: alpha is 0 or undefined"
        elif bool(singular[j]):
            out[j] = np.nan
            reasons[j] = f"kernel defect: V^T O_j is singular (cond > 1/{rtol:.1e}), no projection along ker(V^T) onto span(O_j)"
    return out, reasons


def layer_algebra(lh: LayerHeads, g: Grams, threshold: float = 0.9) -> AlgebraPart:
    """Shared-value algebra of one layer from its Gram products (SPEC section 7).

    Args:
        lh: the layer's heads (column form; ``V`` unexpanded, ``kv_head_of`` from the layout).
        g: ``layer_grams(lh.O, lh.V, lh.kv_head_of)``: ``G_O, G_V, M`` with batch ``[n_heads]``, float64.
        threshold: P threshold for "closed" heads (paper: 0.9).

    Returns:
        :class:`AlgebraPart`. Cost: ``n_group²`` products of ``d_head x d_head``
        matrices per group (plus ``subspace_angles`` on ``d_model x d_head`` factors
        for pairs of closed heads); nothing ``d_model x d_model``.

    Raises:
        ValueError: ``g`` does not have one Gram triple per query head of ``lh``.
    """
    if tuple(g.M.shape[:1]) != (lh.n_heads,):
        raise ValueError(f"Grams have batch shape {tuple(g.M.shape[:-2])}; expected ({lh.n_heads},) = one per query head.")
    kv = lh.kv_head_of.long()
    groups = [(int(k), (kv == k).nonzero().flatten().tolist()) for k in torch.unique(kv).tolist()]
    if all(len(idx) == 1 for _, idx in groups):
        return AlgebraPart(
            layer=lh.layer, pairs=_empty(PAIR_COLUMNS), heads=_empty(HEAD_COLUMNS), groups=_empty(GROUP_COLUMNS),
            closed_ranges=_empty(RANGE_COLUMNS), reason=MHA_REASON, threshold=threshold,
        )
    pair_rows: list[dict[str, Any]] = []
    head_rows: list[dict[str, Any]] = []
    group_rows: list[dict[str, Any]] = []
    range_rows: list[dict[str, Any]] = []
    matrices: dict[int, tuple[list[int], np.ndarray, np.ndarray]] = {}
    for k, idx in groups:
        n = len(idx)
        it = torch.tensor(idx)
        G_V = g.G_V[it[0]]
        M_g = g.M[it]
        A = np.empty((n, n))
        P = np.empty((n, n))
        rtol = rank_rtol(g.d_model, int(G_V.shape[-1]), g.input_dtype)
        diag_reason = [""] * n
        for a, i in enumerate(idx):
            # Row i: left factor O_i against every right factor j of the group.
            al, pp, nT2, reasons = _row(g.G_O[i], G_V, M_g)
            A[a] = al.numpy()
            P[a] = pp.numpy()
            diag_reason[a] = reasons[a]
            for b, j in enumerate(idx):
                reason = reasons[b]
                if i != j and reason.startswith("nilpotent head"):
                    reason = reason.replace("nilpotent head: ||T^2||_F / ||T||_F^2", "T_i T_j ~ 0: ||T_i T_j||_F / ||T_i||_F^2")
                elif i != j and reason.startswith("zero head"):
                    reason = reason.replace("zero head", "zero left factor T_i")
                pair_rows.append(
                    {"layer": lh.layer, "kv_head": k, "i": i, "j": j, "alpha_ij": A[a, b], "P_ij": P[a, b],
                     "norm_TiTj": float(nT2[b]), "diagonal": i == j, "reason": reason}
                )
        matrices[k] = (list(idx), A.copy(), P.copy())
        trGV = float(G_V.diagonal().sum())
        closed = []
        spreads = []
        kdefs, kreasons = _kernel_defects(g.G_O[it], G_V, M_g, np.diag(A).copy(), rtol)
        for b, j in enumerate(idx):
            col = A[:, b]
            fin = col[np.isfinite(col)]
            alpha_j, P_j = float(A[b, b]), float(P[b, b])
            if fin.size and np.abs(fin).max() > 0:
                spread = float((fin.max() - fin.min()) / np.abs(fin).max())
            else:
                spread = float("nan")
            spreads.append(spread)
            Mj = g.M[j]
            ip = float(_inner(Mj, G_V))
            nMV = float(_inner(Mj @ G_V, Mj))
            law_alpha = ip / trGV if trGV > 0 else float("nan")
            law_P = ip**2 / (nMV * trGV) if nMV > 0 and trGV > 0 else float("nan")
            idem = float(np.sqrt(1.0 / P_j - 1.0)) if np.isfinite(P_j) and P_j > 0 else float("nan")
            kd, kreason = float(kdefs[b]), kreasons[b]
            is_closed = bool(np.isfinite(P_j) and P_j >= threshold)
            if is_closed:
                closed.append(j)
            head_rows.append(
                {"layer": lh.layer, "kv_head": k, "head": j, "alpha": alpha_j, "P": P_j, "closed": is_closed,
                 "alpha_ij_min": float(fin.min()) if fin.size else float("nan"),
                 "alpha_ij_max": float(fin.max()) if fin.size else float("nan"),
                 "alpha_spread": spread, "law_alpha": law_alpha, "law_P": law_P, "idempotence_defect": idem,
                 "kernel_defect": kd, "reason": "; ".join(r for r in (diag_reason[b], kreason) if r)}
            )
        off = P[~np.eye(n, dtype=bool)]
        off = off[np.isfinite(off)]
        allp = P[np.isfinite(P)]
        sp = np.asarray(spreads, dtype=float)
        sp = sp[np.isfinite(sp)]
        group_rows.append(
            {"layer": lh.layer, "kv_head": k, "n_heads": n, "heads": ",".join(map(str, idx)), "n_closed": len(closed),
             "median_P_pairs": float(np.median(allp)) if allp.size else float("nan"),
             "median_P_offdiag": float(np.median(off)) if off.size else float("nan"),
             "min_P_offdiag": float(off.min()) if off.size else float("nan"),
             "median_alpha_spread": float(np.median(sp)) if sp.size else float("nan"),
             "max_alpha_spread": float(sp.max()) if sp.size else float("nan"),
             "law_score": float(np.median(off)) if off.size else float("nan")}
        )
        if len(closed) >= 2:
            Os = {j: lh.O[j].double().numpy() for j in closed}
            for x in range(len(closed)):
                for y in range(x + 1, len(closed)):
                    a_, b_ = closed[x], closed[y]
                    ang = scipy.linalg.subspace_angles(Os[a_], Os[b_])
                    range_rows.append(
                        {"layer": lh.layer, "kv_head": k, "head_a": a_, "head_b": b_,
                         "min_angle_deg": float(np.degrees(ang.min())), "max_angle_deg": float(np.degrees(ang.max())),
                         "mean_cos2": float(np.mean(np.cos(ang) ** 2)), "n_angles": int(ang.size)}
                    )
    return AlgebraPart(
        layer=lh.layer,
        pairs=pd.DataFrame(pair_rows, columns=PAIR_COLUMNS),
        heads=pd.DataFrame(head_rows, columns=HEAD_COLUMNS),
        groups=pd.DataFrame(group_rows, columns=GROUP_COLUMNS),
        closed_ranges=pd.DataFrame(range_rows, columns=RANGE_COLUMNS) if range_rows else _empty(RANGE_COLUMNS),
        matrices=matrices,
        threshold=threshold,
    )


@dataclass
class SharedValueAlgebra:
    """Shared-value algebra of a model (SPEC section 7), from :func:`shared_value_algebra`
    or ``idempotence_report(..., algebra=True).algebra``.

    Attributes:
        pairs: one row per ordered pair ``(i, j)`` within a kv group: ``alpha_ij``
            (units of the weights, like α), ``P_ij`` in [0, 1], ``norm_TiTj``, ``diagonal``
            (``i == j``: equals the core's α, P), ``reason`` (why NaN).
        heads: one row per right factor ``j``: α, P, ``alpha_ij_min/max``,
            ``alpha_spread`` (dimensionless, 0 when the right-action law holds),
            ``law_alpha``, ``law_P``, ``idempotence_defect``, ``kernel_defect``.
        groups: one row per (layer, kv group): ``median_P_pairs``, ``median_P_offdiag``,
            ``min_P_offdiag``, ``median/max_alpha_spread``, ``law_score`` (= median
            off-diagonal ``P_ij``).
        closed_ranges: principal angles (degrees) between span(O_a), span(O_b) for
            pairs of closed heads in one group.
        reason: "" when there is value sharing, else why the result is empty
            (``"no exact value sharing (MHA)"``).
        info: what was measured.
        threshold: P threshold for "closed".
    """

    pairs: pd.DataFrame
    heads: pd.DataFrame
    groups: pd.DataFrame
    closed_ranges: pd.DataFrame
    reason: str
    info: ModelInfo | None = None
    threshold: float = 0.9
    matrices: dict[int, dict[int, tuple[list[int], np.ndarray, np.ndarray]]] = field(default_factory=dict, repr=False)

    @property
    def empty(self) -> bool:
        """True when no layer has value sharing (see :attr:`reason`)."""
        return len(self.pairs) == 0

    def summary(self) -> dict[str, Any]:
        """Headline numbers: pair counts, median off-diagonal P_ij, spreads, closed-range angles."""
        if self.empty:
            return {"algebra_reason": self.reason}
        off = self.pairs.loc[~self.pairs["diagonal"].astype(bool), "P_ij"].to_numpy(dtype=float)
        off = off[np.isfinite(off)]
        sp = self.heads["alpha_spread"].to_numpy(dtype=float)
        sp = sp[np.isfinite(sp)]
        out = {
            "n_groups": int(len(self.groups)),
            "n_pairs_offdiag": int(off.size),
            "median_P_offdiag": float(np.median(off)) if off.size else float("nan"),
            "frac_offdiag_P_ge_threshold": float((off >= self.threshold).mean()) if off.size else float("nan"),
            "median_alpha_spread": float(np.median(sp)) if sp.size else float("nan"),
            "n_closed_range_pairs": int(len(self.closed_ranges)),
        }
        if len(self.closed_ranges):
            out["median_min_angle_deg_closed"] = float(self.closed_ranges["min_angle_deg"].median())
        return out

    def figures(self, layers: list[int] | None = None) -> list[Any]:
        """One plotly figure per layer: α_ij (top row) and P_ij (bottom row) per kv group.

        Rows of each matrix are the left factor ``i``, columns the right factor ``j``;
        the right-action law predicts constant columns of α_ij and P_ij ≈ 1.
        α_ij uses a diverging colour scale centred at 0 (α can be negative).
        Returns an empty list when there is no value sharing.
        """
        import plotly.graph_objects as go
        from plotly.subplots import make_subplots

        figs = []
        for layer in sorted(self.matrices):
            if layers is not None and layer not in layers:
                continue
            mats = self.matrices[layer]
            ks = sorted(mats)
            titles = [f"alpha_ij, kv {k}" for k in ks] + [f"P_ij, kv {k}" for k in ks]
            fig = make_subplots(rows=2, cols=len(ks), subplot_titles=titles, horizontal_spacing=0.04, vertical_spacing=0.12)
            amax = max(float(np.nanmax(np.abs(m[1]))) if np.isfinite(m[1]).any() else 1.0 for m in mats.values()) or 1.0
            for c, k in enumerate(ks, start=1):
                heads, A, P = mats[k]
                labels = [str(h) for h in heads]
                fig.add_trace(
                    go.Heatmap(z=A, x=labels, y=labels, coloraxis="coloraxis",
                               hovertemplate="i=%{y}, j=%{x}<br>alpha_ij=%{z:.4g}<extra></extra>"),
                    row=1, col=c,
                )
                fig.add_trace(
                    go.Heatmap(z=P, x=labels, y=labels, coloraxis="coloraxis2",
                               hovertemplate="i=%{y}, j=%{x}<br>P_ij=%{z:.4f}<extra></extra>"),
                    row=2, col=c,
                )
                fig.update_yaxes(autorange="reversed", row=1, col=c)
                fig.update_yaxes(autorange="reversed", row=2, col=c)
            fig.update_layout(
                title=f"Shared-value algebra, layer {layer}: rows i (left factor), columns j (right factor)",
                coloraxis={"colorscale": "RdBu", "cmin": -amax, "cmax": amax,
                           "colorbar": {"title": "alpha_ij", "y": 0.78, "len": 0.42}},
                coloraxis2={"colorscale": "Viridis", "cmin": 0.0, "cmax": 1.0,
                            "colorbar": {"title": "P_ij", "y": 0.22, "len": 0.42}},
                height=560,
            )
            figs.append(fig)
        return figs

    def _repr_html_(self) -> str:  # notebooks
        if self.empty:
            return f"<b>SharedValueAlgebra</b>: empty ({self.reason})"
        s = self.summary()
        return (
            f"<b>SharedValueAlgebra</b>: {s['n_groups']} kv groups, median off-diagonal P_ij "
            f"{s['median_P_offdiag']:.4g}, median alpha spread {s['median_alpha_spread']:.3g}"
        )


def combine_layers(parts: list[AlgebraPart], info: ModelInfo | None = None, threshold: float | None = None) -> SharedValueAlgebra:
    """Concatenate per-layer :class:`AlgebraPart` s into a :class:`SharedValueAlgebra`.

    Args:
        parts: outputs of :func:`layer_algebra`, one per layer.
        info: the model's :class:`~tl_idempotence.heads.ModelInfo`.
        threshold: the P threshold (default: the one the parts were computed with, else 0.9).

    Returns:
        :class:`SharedValueAlgebra`; its ``reason`` is ``"no exact value sharing (MHA)"``
        when no layer has a kv group with two or more query heads.
    """
    shared = [p for p in parts if not p.reason]
    if threshold is None:
        threshold = parts[0].threshold if parts else 0.9

    def cat(attr: str, cols: list[str]) -> pd.DataFrame:
        frames = [getattr(p, attr) for p in shared if len(getattr(p, attr))]
        return pd.concat(frames, ignore_index=True) if frames else _empty(cols)

    if shared:
        reason = ""
    elif parts:
        reason = parts[0].reason or MHA_REASON
    else:
        reason = "no layers were analysed"
    if not shared and info is not None and info.n_kv_heads == info.n_heads:
        reason = MHA_REASON
    return SharedValueAlgebra(
        pairs=cat("pairs", PAIR_COLUMNS),
        heads=cat("heads", HEAD_COLUMNS),
        groups=cat("groups", GROUP_COLUMNS),
        closed_ranges=cat("closed_ranges", RANGE_COLUMNS),
        reason=reason,
        info=info,
        threshold=threshold,
        matrices={p.layer: p.matrices for p in shared},
    )


def shared_value_algebra(
    model_or_source: Any,
    threshold: float = 0.9,
    *,
    layers: list[int] | None = None,
    compute_dtype: torch.dtype = torch.float64,
    progress: bool = True,
    **source_kwargs: Any,
) -> SharedValueAlgebra:
    """Shared-value algebra ``T_i T_j ≈ α_j T_i`` of every kv group of a model (SPEC section 7).

    For each GQA/MQA kv group and each ordered pair ``(i, j)`` of its query heads:
    ``α_ij = ⟨T_iT_j, T_i⟩/‖T_i‖²`` and ``P_ij = cos²(T_iT_j, T_i)`` in ``d_head x d_head``
    form; per right factor ``j`` the spread of ``α_ij`` over ``i``; per group the law score;
    for closed heads the principal angles between their ranges and the distance of
    ``T_j/α_j`` from the projection along the shared kernel ker(Vᵀ). See the module
    docstring for the formulas. Paper: Feng & Li, arXiv 2609.01129 ("shared-value algebras").

    Args:
        model_or_source: anything :func:`~tl_idempotence.heads.head_source` accepts
            (TransformerLens model, ``transformers`` model, checkpoint path, HeadSource).
        threshold: P threshold for "closed" heads, in [0, 1].
        layers: restrict to these attention layers (default: all).
        compute_dtype: dtype of the ``d_model``-long Gram products (float64 default).
        progress: tqdm bar over layers.
        **source_kwargs: passed to :func:`~tl_idempotence.heads.head_source`.

    Returns:
        :class:`SharedValueAlgebra`; empty with ``reason == "no exact value sharing (MHA)"``
        for MHA models.

    Raises:
        ValueError: threshold outside [0, 1], unknown layer indices, NaN/inf weights.
        TypeError: unsupported model object.
    """
    from tqdm.auto import tqdm

    if not (0.0 <= float(threshold) <= 1.0):
        raise ValueError(f"threshold must be in [0, 1] (P is a squared cosine); got {threshold}.")
    src = head_source(model_or_source, **source_kwargs)
    all_layers = list(src.layers())
    if layers is not None:
        bad = [l for l in layers if l not in all_layers]
        if bad:
            raise ValueError(f"Unknown layer index {bad}: this model's attention layers are {all_layers}.")
    todo = all_layers if layers is None else list(layers)
    if src.info.n_kv_heads == src.info.n_heads:
        return combine_layers([], src.info, threshold)
    parts = []
    for layer in tqdm(todo, desc="algebra", unit="layer", disable=not progress):
        lh = src.layer_heads(layer)
        g = layer_grams(lh.O, lh.V, lh.kv_head_of, compute_dtype=compute_dtype)
        parts.append(layer_algebra(lh, g, threshold))
    return combine_layers(parts, src.info, threshold)
