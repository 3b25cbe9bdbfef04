"""Shared-value algebra of GQA/MQA heads (SPEC section 7): the maths of one layer (:func:`layer_algebra`)
and its result (:class:`SharedValueAlgebra`); the entry point and the report analysis are in
:mod:`tl_idempotence.analyses.algebra`.

**[paper]** In GQA/MQA the query heads of one kv group share the value read ``V``,
so (column form) ``T_i = O_i Vᵀ`` and::

    T_i T_j = O_i (Vᵀ O_j) Vᵀ = O_i M_j Vᵀ,     M_j = Vᵀ O_j   (d_head x d_head)

If ``M_j ≈ α_j I`` then ``T_i T_j ≈ α_j T_i`` for every ``i`` of the group: a right
action whose scale depends only on the right factor ``j``.

**[ours]** Everything reduces to the Gram products the core already has
(``G_O_i = O_iᵀ O_i``, ``G_V = Vᵀ V``, ``M_j = Vᵀ O_j``; :mod:`tl_idempotence.maths.closure`).
Using ``‖O X Vᵀ‖²_F = ⟨G_O X, X G_V⟩_F`` and ``⟨O X Vᵀ, O Y Vᵀ⟩_F = ⟨G_O X, Y G_V⟩_F``::

    ‖T_i‖²            = ⟨G_O_i, G_V⟩
    ⟨T_i T_j, T_i⟩    = tr(V M_jᵀ O_iᵀ O_i Vᵀ)        = ⟨M_j, G_O_i G_V⟩
    ‖T_i T_j‖²        = tr(V M_jᵀ G_O_i M_j Vᵀ)        = ⟨G_O_i M_j, M_j G_V⟩

    α_ij = ⟨M_j, G_O_i G_V⟩ / ⟨G_O_i, G_V⟩
    P_ij = ⟨M_j, G_O_i G_V⟩² / (⟨G_O_i M_j, M_j G_V⟩ ⟨G_O_i, G_V⟩)

These are exactly the core's formulas for ``α`` and ``P`` with ``M`` replaced by
``M_j`` and ``G_O`` by ``G_O_i``; so this module evaluates them with
:func:`~tl_idempotence.maths.closure.closure_scalars` on the Grams ``(G_O_i, G_V, M_j)``,
and ``i = j`` reproduces the core's ``α`` and ``P`` bit for bit, with the same
degeneracy rules (zero ``T_i`` -> NaN; ``T_i T_j ≈ 0`` -> ``α_ij = 0``, ``P_ij`` NaN). Off the
diagonal, ``T_i T_j ≈ 0`` means ``‖T_iT_j‖_F ≤ DEGENERATE_RTOL · ‖T_i‖_F ‖T_j‖_F`` (a ratio of
norms in the weights' units, so rescaling the weights or one head by any factor changes no
decision); on the diagonal it is the core's ``‖T²‖ ≤ DEGENERATE_RTOL · ‖T‖²``, the same test.

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

Every pair of heads of one group (table ``ranges``): the principal angles between their
ranges span(O_a) and span(O_b), as the core's principal cosines (SPEC 3) with ``(G_O, G_V, M)``
replaced by ``(G_O_b, G_O_a, O_aᵀ O_b)`` (:func:`~tl_idempotence.core.factors.principal_factors`'s
``D``): ``d r² n (n − 1)`` flops per group of ``n`` for the cross products ``O_aᵀ O_b``, ranks at the
core's tolerance, never ``d_model x d_model``. Table ``closed_ranges``: the rows of ``ranges`` whose two heads are
closed at the threshold — a view, re-derived from ``ranges`` when the threshold changes, so a
report at another threshold has the angles of exactly the pairs closed there.

Group membership comes from the model's kv layout (``LayerHeads.kv_head_of``), never
from comparing floats. MHA layers (every kv group has one query head) have no exact
value sharing: the result is empty with ``reason = "no exact value sharing (MHA)"``.
No approximate-sharing analysis is offered.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import torch

from ..core.defaults import DEFAULT_THRESHOLD
from ..core.factors import DEGENERATE_RTOL, gram_eig, rank_rtol
from ..core.frozen import frozen
from ..core.heads import LayerHeads, ModelInfo
from ..core.options import check_layers, check_threshold, strict_kwargs
from ..core.tables import ImmutableResult
from ..errors import OptionError
from ..maths.closure import Grams, apply_exponents, closure_scalars, closure_sums
from ..views.results import DrawnResult

if TYPE_CHECKING:  # pragma: no cover
    from ..core.hints import LayersLike

__all__ = [
    "GROUP_COLUMNS",
    "HEAD_COLUMNS",
    "MHA_REASON",
    "PAIR_COLUMNS",
    "RANGE_COLUMNS",
    "TABLES",
    "SharedValueAlgebra",
    "empty_table",
    "layer_algebra",
]

MHA_REASON = "no exact value sharing (MHA)"

PAIR_COLUMNS = ["layer", "kv_head", "i", "j", "alpha_ij", "P_ij", "norm_TiTj", "diagonal", "reason"]
HEAD_COLUMNS = [
    "layer",
    "kv_head",
    "head",
    "alpha",
    "P",
    "closed",
    "alpha_ij_min",
    "alpha_ij_max",
    "alpha_spread",
    "law_alpha",
    "law_P",
    "idempotence_defect",
    "kernel_defect",
    "reason",
]
GROUP_COLUMNS = [
    "layer",
    "kv_head",
    "n_heads",
    "heads",
    "n_closed",
    "median_P_pairs",
    "median_P_offdiag",
    "min_P_offdiag",
    "median_alpha_spread",
    "max_alpha_spread",
    "law_score",
]
RANGE_COLUMNS = ["layer", "kv_head", "head_a", "head_b", "min_angle_deg", "max_angle_deg", "mean_cos2", "n_angles"]
TABLES = {
    "pairs": PAIR_COLUMNS,
    "heads": HEAD_COLUMNS,
    "groups": GROUP_COLUMNS,
    "closed_ranges": RANGE_COLUMNS,
    "ranges": RANGE_COLUMNS,
}


def empty_table(cols: list[str]) -> pd.DataFrame:
    """An empty table with these columns (object dtype), as every empty algebra table is."""
    return pd.DataFrame({c: pd.Series(dtype=object) for c in cols})


@dataclass(repr=False)
class SharedValueAlgebra(
    ImmutableResult,
    DrawnResult,
    repr_keys="n_groups median_P_offdiag median_alpha_spread algebra_reason",
    frozen=(
        "a shared-value algebra is",
        "algebra.at_threshold(t) for another threshold, dataclasses.replace(...) for a changed copy",
    ),
):
    """Shared-value algebra of one layer or a whole model (SPEC section 7), from
    :func:`~tl_idempotence.analyses.algebra.shared_value_algebra` or ``idempotence_report(..., algebra=True).algebra``.

    One record type for one layer (:func:`layer_algebra`) and many (:meth:`concat`). Immutable
    (:class:`~tl_idempotence.core.tables.ImmutableResult`): assigning a field raises
    ``dataclasses.FrozenInstanceError``, its tables are copies made on each read; :meth:`at_threshold` gives it at
    another threshold.

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
            pairs of heads of one group closed at ``ranges_threshold`` (the rows of ``ranges`` whose
            two heads are closed).
        reason: "" when there is value sharing, else why the result is empty
            (``"no exact value sharing (MHA)"``).
        info: what was measured.
        threshold: P threshold for "closed".
        ranges_threshold: the threshold ``closed_ranges`` was taken at: ``threshold`` whenever ``ranges``
            is known (every pair's angles); for a saved report without ``ranges``, the run's
            threshold (its ``closed_ranges`` has only the pairs closed there, and :meth:`at_threshold` can
            only drop pairs).
        ranges: the same columns as ``closed_ranges`` for every pair ``head_a < head_b`` of one group,
            closed or not (``n_angles = min(rank_O)`` of the two; NaN angles when one head is zero), or
            ``None`` for an algebra read from a saved report without it.
    """

    pairs: pd.DataFrame
    heads: pd.DataFrame
    groups: pd.DataFrame
    closed_ranges: pd.DataFrame
    reason: str
    info: ModelInfo | None = None
    threshold: float = DEFAULT_THRESHOLD
    ranges_threshold: float | None = None
    ranges: pd.DataFrame | None = None

    def __post_init__(self) -> None:
        if self.ranges_threshold is None:
            self._freeze(ranges_threshold=self.threshold)

    @property
    def empty(self) -> bool:
        """True when no layer has value sharing (see :attr:`reason`)."""
        return len(self.pairs) == 0

    @property
    def summary(self) -> dict[str, Any]:
        """Headline numbers: pair counts, median off-diagonal P_ij, spreads, closed-range angles (read-only)."""
        if self.empty:
            return frozen({"algebra_reason": self.reason})
        pairs, closed_ranges = self.pairs, self.closed_ranges
        off = pairs.loc[~pairs["diagonal"].astype(bool), "P_ij"].to_numpy(dtype=float)
        off = off[np.isfinite(off)]
        sp = self.heads["alpha_spread"].to_numpy(dtype=float)
        sp = sp[np.isfinite(sp)]
        out: dict[str, Any] = {
            "n_groups": len(self.groups),
            "n_pairs_offdiag": int(off.size),
            "median_P_offdiag": float(np.median(off)) if off.size else float("nan"),
            "frac_offdiag_P_ge_threshold": float((off >= self.threshold).mean()) if off.size else float("nan"),
            "median_alpha_spread": float(np.median(sp)) if sp.size else float("nan"),
            "n_closed_range_pairs": len(closed_ranges),
        }
        if len(closed_ranges):
            out["median_min_angle_deg_closed"] = float(closed_ranges["min_angle_deg"].median())
        return frozen(out)

    def matrices(self, layer: int) -> dict[int, tuple[list[int], np.ndarray, np.ndarray]]:
        """``{kv_head: (heads, alpha [n, n], P [n, n])}`` of one layer, row = ``i`` (left), column = ``j`` (right)."""
        out: dict[int, tuple[list[int], np.ndarray, np.ndarray]] = {}
        d = self.pairs[self.pairs["layer"] == layer]
        for k, grp in d.groupby("kv_head", sort=True):
            heads = sorted(set(grp["i"].astype(int)))
            pos = {h: n for n, h in enumerate(heads)}
            A = np.full((len(heads), len(heads)), np.nan)
            P = np.full_like(A, np.nan)
            for i, j, a, p in zip(grp["i"], grp["j"], grp["alpha_ij"], grp["P_ij"]):
                A[pos[int(i)], pos[int(j)]] = a
                P[pos[int(i)], pos[int(j)]] = p
            out[int(k)] = (heads, A, P)
        return out

    @property
    def layers(self) -> list[int]:
        """Layers with value sharing."""
        return sorted({int(v) for v in self.pairs["layer"]}) if len(self.pairs) else []

    @strict_kwargs
    def figures(self, layers: LayersLike = None) -> list[Any]:
        """One plotly figure per layer: α_ij and P_ij per kv group (drawn by ``tl_idempotence.views``).

        Args:
            layers: layer indices to draw (default: every layer with value sharing).

        Raises:
            OptionTypeError / OptionError: ``layers`` not a sequence of distinct non-negative ints, or naming a
                layer this algebra has no value sharing in (the layers it has are named).
        """
        want = check_layers(layers)
        if want is not None:
            missing = [v for v in want if v not in self.layers]
            if missing:
                raise OptionError(
                    f"layers {missing}: this algebra has no value sharing measured there; its layers are {self.layers}."
                )
        from ..views import algebra_figures

        return list(algebra_figures(self, layers=None if want is None else list(want)))

    @classmethod
    def concat(
        cls, parts: list[SharedValueAlgebra], info: ModelInfo | None = None, threshold: float | None = None
    ) -> SharedValueAlgebra:
        """Concatenate per-layer results (from :func:`layer_algebra`) into one.

        The ``reason`` is ``"no exact value sharing (MHA)"`` when no layer has a kv group with
        two or more query heads.
        """
        shared = [p for p in parts if not p.reason]
        if threshold is None:
            threshold = parts[0].threshold if parts else 0.9

        def cat(attr: str, cols: list[str]) -> pd.DataFrame:
            frames = [getattr(p, attr) for p in shared if len(getattr(p, attr))]
            return pd.concat(frames, ignore_index=True) if frames else empty_table(cols)

        if shared:
            reason = ""
        elif parts:
            reason = parts[0].reason or MHA_REASON
        else:
            reason = "no layers were analysed"
        if not shared and info is not None and info.n_kv_heads == info.n_heads:
            reason = MHA_REASON
        known = all(p.ranges is not None for p in shared)
        return cls(
            pairs=cat("pairs", PAIR_COLUMNS),
            heads=cat("heads", HEAD_COLUMNS),
            groups=cat("groups", GROUP_COLUMNS),
            closed_ranges=cat("closed_ranges", RANGE_COLUMNS),
            reason=reason,
            info=info,
            threshold=threshold,
            ranges_threshold=parts[0].ranges_threshold if parts else threshold,
            ranges=cat("ranges", RANGE_COLUMNS) if known else None,
        )

    def at_threshold(self, threshold: float) -> SharedValueAlgebra:
        """The same algebra with ``closed`` flags, group counts and ``closed_ranges`` at another threshold:
        the rows of :attr:`ranges` whose two heads are closed there, exactly what a run at that threshold
        gives. Without :attr:`ranges` (a saved report without it) ``closed_ranges`` can only keep
        the pairs closed at both thresholds, and :attr:`ranges_threshold` stays the run's.

        Raises:
            OptionTypeError / OptionError: a threshold that is not a real number in [0, 1].
        """
        t = check_threshold(threshold)
        heads = self.heads.copy()
        if len(heads):
            heads["closed"] = np.isfinite(heads["P"].to_numpy(dtype=float)) & (heads["P"].to_numpy(dtype=float) >= t)
        groups = self.groups.copy()
        if len(groups):
            n = heads.groupby(["layer", "kv_head"])["closed"].sum()
            groups["n_closed"] = [int(n.get((lay, k), 0)) for lay, k in zip(groups["layer"], groups["kv_head"])]
        known = self.ranges is not None
        ranges = _closed_rows(self.ranges if self.ranges is not None else self.closed_ranges, heads)
        return SharedValueAlgebra(
            pairs=self.pairs,
            heads=heads,
            groups=groups,
            closed_ranges=ranges,
            reason=self.reason,
            info=self.info,
            threshold=t,
            ranges_threshold=t if known else self.ranges_threshold,
            ranges=self.ranges,
        )


def _closed_rows(ranges: pd.DataFrame, heads: pd.DataFrame) -> pd.DataFrame:
    """The rows of a ranges table whose two heads are closed in ``heads`` (``layer, head, closed``), in order."""
    if not len(ranges):
        return ranges if len(ranges.columns) else empty_table(RANGE_COLUMNS)
    if len(heads):
        closed = heads["closed"].to_numpy(dtype=bool)
        ok = set(zip(heads.loc[closed, "layer"].tolist(), heads.loc[closed, "head"].tolist()))
    else:
        ok = set()
    keep = [
        (lay, a) in ok and (lay, b) in ok
        for lay, a, b in zip(ranges["layer"].tolist(), ranges["head_a"].tolist(), ranges["head_b"].tolist())
    ]
    out = ranges[keep].reset_index(drop=True)
    return out if len(out) else empty_table(RANGE_COLUMNS)


def _inner(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a * b).sum((-1, -2))


def _row(
    G_Oi: torch.Tensor, G_V: torch.Tensor, M: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[str], float]:
    """α_ij, P_ij, ‖T_iT_j‖, reasons and ‖T_i‖ for one left factor ``i`` against right factors ``M = M_j`` [n, r, r].

    :func:`~tl_idempotence.maths.closure.closure_scalars` with ``(G_O, G_V, M) = (G_O_i, G_V, M_j)``,
    so ``i = j`` reproduces the core's α and P bit for bit (tested), degeneracy rules included.
    The off-diagonal ``T_i T_j ≈ 0`` decision is re-made by :func:`_offdiagonal_nilpotent`
    (:func:`_pair_scalars` fills α_ij, P_ij where it disagrees).
    All in the Grams' units (``‖T_i‖`` carries ``2^E_i``, ``‖T_iT_j‖`` ``2^(E_i + E_j)``, α_ij ``2^E_j``).
    """
    alpha, P, norm, norm_T2, _, reason = closure_scalars(G_Oi.expand_as(M), G_V.expand_as(M), M)
    return alpha, P, norm_T2, [str(x) for x in reason], float(norm[0])


def _offdiagonal_nilpotent(norm_TiTj: float, norm_Ti: float, norm_Tj: float) -> tuple[bool, float]:
    """Whether ``T_i T_j ≈ 0`` (``i ≠ j``), scale-free, and the ratio it was decided on.

    The test is ``‖T_iT_j‖_F ≤ DEGENERATE_RTOL · ‖T_i‖_F ‖T_j‖_F`` (``‖T_iT_j‖ ≤ ‖T_i‖‖T_j‖``
    always): a ratio of norms in the same units (the Grams' ``2^(E_i+E_j)`` cancel), so rescaling
    the weights, or one head's weights, by any factor (``2^k``, ``1e3``, ...) changes no decision.
    The core's ``‖T²‖/‖T‖²`` compares ``T_iT_j`` against ``T_i`` alone, which is not scale-free
    when ``T_j`` has another scale than ``T_i``. A zero right factor (``‖T_j‖ = 0``) gives
    ``T_i T_j = 0``.

    Args:
        norm_TiTj, norm_Ti, norm_Tj: ``‖T_iT_j‖``, ``‖T_i‖``, ``‖T_j‖`` in the Grams' units (> 0 for ``T_i``).

    Returns:
        ``(nilpotent, ratio)``: ``ratio = ‖T_iT_j‖ / (‖T_i‖‖T_j‖)`` (NaN when ``T_j = 0``).
    """
    den = norm_Ti * norm_Tj
    ratio = norm_TiTj / den if den > 0 else float("nan")
    return norm_TiTj == 0 or not den > 0 or ratio <= DEGENERATE_RTOL, ratio


def _pair_scalars(G_Oi: torch.Tensor, G_V: torch.Tensor, M_j: torch.Tensor) -> tuple[float, float]:
    """α_ij and P_ij of one pair from the core's formulas (Grams' units), for a pair that
    :func:`~tl_idempotence.maths.closure.closure_scalars` called nilpotent but the scale-free test does not.

    Args:
        G_Oi: ``[r, r]`` ``O_iᵀO_i``; G_V: ``[r, r]``; M_j: ``[r, r]`` ``VᵀO_j`` (Grams' units).
    """
    norm2, inner, norm2_T2 = closure_sums(G_Oi, G_V, M_j)
    return float(inner / norm2), float((inner**2 / (norm2_T2 * norm2)).clamp(0.0, 1.0))


def _kernel_defects(
    G_O: torch.Tensor, G_V: torch.Tensor, M: torch.Tensor, alpha: np.ndarray, rtol: float
) -> tuple[np.ndarray, list[str]]:
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
            reasons[j] = (
                f"kernel defect: V^T O_j is singular (cond > 1/{rtol:.1e}), no projection along ker(V^T) onto span(O_j)"
            )
    return out, reasons


def _range_angles(
    lh: LayerHeads,
    g: Grams,
    groups: list[tuple[int, list[int]]],
    compute_dtype: torch.dtype,
    device: torch.device | str | None,
) -> pd.DataFrame:
    """Principal angles between span(O_a) and span(O_b) for every pair ``a < b`` of heads of one kv group.

    As the core's principal cosines (SPEC 3, :func:`~tl_idempotence.core.factors.principal_factors`) with
    ``(G_O, G_V, M)`` replaced by ``(G_O_b, G_O_a, O_aᵀ O_b)``: with ``G_O_j = W_j diag(s_j²) W_jᵀ``
    (:func:`~tl_idempotence.core.factors.gram_eig`, once per head), ``Q_aᵀ Q_b = diag(1/s_a) W_aᵀ (O_aᵀ O_b)
    W_b diag(1/s_b)`` over the singular values counted in the rank, and the cosines are its singular values,
    counted up to ``min(rank_O_a, rank_O_b)``. The cross products ``O_aᵀ O_b`` cost ``d r² n (n - 1)`` flops
    per group of ``n`` (``compute_dtype``, on ``device``, with the Grams' power-of-two exponents, which change
    no angle); everything else is ``r x r``. From cosines, an angle resolves to about 1e-6 degrees (a cosine
    within float64's eps of 1): ``tests/unit/analyses/test_algebra.py`` checks them against
    ``scipy.linalg.subspace_angles`` at 1e-6 degrees, a near-coincident pair included.

    Returns:
        ``RANGE_COLUMNS`` rows in group order, then ``(a, b)`` in head order: ``min_angle_deg``,
        ``max_angle_deg`` (degrees in [0, 90]), ``mean_cos2`` (mean squared cosine), ``n_angles``;
        NaN angles and ``n_angles = 0`` when one of the two heads is zero.
    """
    O = lh.O if device is None else lh.O.to(device)
    heads_a: list[int] = []
    heads_b: list[int] = []
    kvs: list[int] = []
    cross: list[torch.Tensor] = []
    for k, idx in groups:
        if len(idx) < 2:
            continue
        e = None if g.e_O is None else g.e_O[idx]
        Oc = apply_exponents(O[torch.tensor(idx, device=O.device)], e, compute_dtype)
        for x in range(len(idx) - 1):  # O_xᵀ O_y for y > x, batched over y
            cross.append(torch.matmul(Oc[x].transpose(0, 1), Oc[x + 1 :]).to(torch.float64).cpu())
            heads_a += [idx[x]] * (len(idx) - 1 - x)
            heads_b += idx[x + 1 :]
            kvs += [k] * (len(idx) - 1 - x)
        del Oc
    if not cross:
        return empty_table(RANGE_COLUMNS)
    a, b = torch.tensor(heads_a), torch.tensor(heads_b)
    used = sorted(set(heads_a) | set(heads_b))
    pos = torch.full((lh.n_heads,), -1, dtype=torch.long)
    pos[used] = torch.arange(len(used))
    s, W, mask = gram_eig(g.G_O[used], rank_rtol(g.d_model, lh.d_head), True)
    assert W is not None
    inv = torch.where(mask, 1.0 / torch.where(mask, s, torch.ones_like(s)), torch.zeros_like(s))
    rank = mask.sum(-1)
    pa, pb = pos[a], pos[b]
    C = inv[pa].unsqueeze(-1) * (W[pa].transpose(-1, -2) @ torch.cat(cross) @ W[pb]) * inv[pb].unsqueeze(-2)
    n_ang = torch.minimum(rank[pa], rank[pb]).numpy()
    cos = torch.linalg.svdvals(C).clamp(0.0, 1.0).numpy()  # descending
    cos = np.where(np.arange(cos.shape[1])[None, :] < n_ang[:, None], cos, 0.0)
    m = np.maximum(n_ang, 1)
    none = n_ang == 0
    nan = float("nan")
    return pd.DataFrame(
        {
            "layer": lh.layer,
            "kv_head": np.asarray(kvs, dtype=np.int64),
            "head_a": np.asarray(heads_a, dtype=np.int64),
            "head_b": np.asarray(heads_b, dtype=np.int64),
            "min_angle_deg": np.where(none, nan, np.degrees(np.arccos(cos[:, 0]))),
            "max_angle_deg": np.where(none, nan, np.degrees(np.arccos(cos[np.arange(len(cos)), m - 1]))),
            "mean_cos2": np.where(none, nan, (cos**2).sum(1) / m),
            "n_angles": n_ang.astype(np.int64),
        },
        columns=RANGE_COLUMNS,
    )


def _kv_groups(lh: LayerHeads) -> list[tuple[int, list[int]]]:
    """The layer's kv groups ``(kv_head, its query heads in order)``, from the model's kv layout
    (``LayerHeads.kv_head_of``), never from comparing floats."""
    kv = lh.kv_head_of.long().cpu()
    return [(int(k), (kv == k).nonzero().flatten().tolist()) for k in torch.unique(kv).tolist()]


def _mha_algebra(threshold: float) -> SharedValueAlgebra:
    """The empty algebra of a layer whose every kv group has one query head (``reason = MHA_REASON``)."""
    return SharedValueAlgebra(
        pairs=empty_table(PAIR_COLUMNS),
        heads=empty_table(HEAD_COLUMNS),
        groups=empty_table(GROUP_COLUMNS),
        closed_ranges=empty_table(RANGE_COLUMNS),
        reason=MHA_REASON,
        threshold=threshold,
        ranges=empty_table(RANGE_COLUMNS),
    )


@dataclass(frozen=True)
class _KvGroup:
    """One kv group of a layer in the Grams' units: its query heads, shared ``G_V`` and right factors ``M_j``."""

    layer: int
    kv_head: int
    heads: list[int]
    G_V: torch.Tensor  # [r, r], shared by the group
    M: torch.Tensor  # [n, r, r]: M_j = Vᵀ O_j, j in the group
    E: np.ndarray  # [n] int64: exponent of T_j (alpha_ij carries 2^E_j, ||T_i T_j|| 2^(E_i + E_j))


def _offdiagonal_pair(
    core_reason: str,
    alpha: float,
    P: float,
    norm_TiTj: float,
    norm_Ti: float,
    norm_Tj: float,
    pair_grams: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
) -> tuple[float, float, str]:
    """α_ij, P_ij and reason of one off-diagonal pair ``i ≠ j`` from :func:`_row`'s (core) values.

    ``T_i T_j ≈ 0`` is decided scale-free, relative to ``‖T_i‖ ‖T_j‖`` (:func:`_offdiagonal_nilpotent`, not
    the core's ``‖T_i‖²``); where the decision agrees with the core's, its α_ij and P_ij are kept bit for bit,
    else α_ij = 0, P_ij = NaN (newly nilpotent) or the core's formulas on ``pair_grams = (G_O_i, G_V, M_j)``
    (:func:`_pair_scalars`). A zero left factor keeps the core's values with the reason renamed.
    """
    if core_reason.startswith("zero head"):
        return alpha, P, core_reason.replace("zero head", "zero left factor T_i")
    nil, ratio = _offdiagonal_nilpotent(norm_TiTj, norm_Ti, norm_Tj)
    core_nil = core_reason.startswith("nilpotent head")
    if nil and not core_nil:
        alpha, P = 0.0, float("nan")
    elif core_nil and not nil:
        alpha, P = _pair_scalars(*pair_grams)
    reason = f"T_i T_j ~ 0: ||T_i T_j||_F / (||T_i||_F ||T_j||_F) = {ratio:.2e} <= {DEGENERATE_RTOL:.0e}" if nil else ""
    return alpha, P, reason


def _group_pairs(grp: _KvGroup, G_O: torch.Tensor) -> tuple[np.ndarray, np.ndarray, list[str], list[dict[str, Any]]]:
    """Every ordered pair ``(i, j)`` of one kv group: α_ij and P_ij ``[n, n]`` in the Grams' units (row = left
    factor ``i``), the diagonal's reasons, and the ``pairs`` rows (α_ij and ``‖T_iT_j‖`` in the weights' units).

    Args: ``grp``; ``G_O`` ``[n_heads, r, r]``, the layer's ``O_iᵀ O_i``.
    """
    idx, n, G_V, M_g, Ej = grp.heads, len(grp.heads), grp.G_V, grp.M, grp.E
    A = np.empty((n, n))
    P = np.empty((n, n))
    diag_reason = [""] * n
    rows = [_row(G_O[i], G_V, M_g) for i in idx]
    norm_T = [r_[4] for r_ in rows]  # ||T_i|| in the Grams' units (2^E_i)
    pair_rows: list[dict[str, Any]] = []
    for a, i in enumerate(idx):
        # Row i: left factor O_i against every right factor j of the group.
        al, pp, nT2, reasons, _ = rows[a]
        A[a] = al.numpy()
        P[a] = pp.numpy()
        with np.errstate(over="ignore", under="ignore"):  # ||T_i T_j|| of weights ~1e±100 exceeds float64
            nT2_true = np.ldexp(nT2.numpy(), -(Ej + Ej[a]))
        diag_reason[a] = reasons[a]
        for b, j in enumerate(idx):
            reason = reasons[b]
            if i != j:
                A[a, b], P[a, b], reason = _offdiagonal_pair(
                    reason, A[a, b], P[a, b], float(nT2[b]), norm_T[a], norm_T[b], (G_O[i], G_V, M_g[b])
                )
            pair_rows.append(
                {
                    "layer": grp.layer,
                    "kv_head": grp.kv_head,
                    "i": i,
                    "j": j,
                    "alpha_ij": float(np.ldexp(A[a, b], -Ej[b])),
                    "P_ij": P[a, b],
                    "norm_TiTj": float(nT2_true[b]),
                    "diagonal": i == j,
                    "reason": reason,
                }
            )
    return A, P, diag_reason, pair_rows


def _spread(col: np.ndarray) -> tuple[float, np.ndarray]:
    """``(max_i α_ij − min_i α_ij) / max_i |α_ij|`` over the finite α_ij of one right factor (NaN when none is
    finite and nonzero), and those finite values."""
    fin = col[np.isfinite(col)]
    if fin.size and np.abs(fin).max() > 0:
        return float((fin.max() - fin.min()) / np.abs(fin).max()), fin
    return float("nan"), fin


def _law(M_j: torch.Tensor, G_V: torch.Tensor, trGV: float, E_j: int) -> tuple[float, float]:
    """``(law_alpha, law_P)`` of one right factor: ``⟨M_j, G_V⟩ / tr G_V`` (weights' units) and
    ``⟨M_j, G_V⟩² / (⟨M_j G_V, M_j⟩ tr G_V)``; NaN where a denominator is 0."""
    ip = float(_inner(M_j, G_V))
    nMV = float(_inner(M_j @ G_V, M_j))
    law_alpha = float(np.ldexp(ip / trGV, -E_j)) if trGV > 0 else float("nan")
    law_P = ip**2 / (nMV * trGV) if nMV > 0 and trGV > 0 else float("nan")
    return law_alpha, law_P


def _group_heads(
    grp: _KvGroup,
    G_O: torch.Tensor,
    A: np.ndarray,
    P: np.ndarray,
    diag_reason: list[str],
    threshold: float,
    d_model: int,
) -> list[dict[str, Any]]:
    """The ``heads`` rows of one kv group, one per right factor ``j``: α, P, closed, the spread of α_ij over
    ``i``, the law for every left factor, the idempotence and kernel defects (module docstring).

    Args: ``grp``; ``G_O`` the layer's ``[n_heads, r, r]``; ``A, P`` ``[n, n]`` from :func:`_group_pairs`
    (Grams' units); the diagonal's reasons; the P threshold; ``d_model`` (the rank tolerance).
    """
    idx, G_V, Ej = grp.heads, grp.G_V, grp.E
    rtol = rank_rtol(d_model, int(G_V.shape[-1]))
    trGV = float(G_V.diagonal().sum())
    kdefs, kreasons = _kernel_defects(G_O[torch.tensor(idx)], G_V, grp.M, np.diag(A).copy(), rtol)
    A = np.ldexp(A, -Ej[None, :])  # alpha_ij in the weights' units (exact)
    head_rows: list[dict[str, Any]] = []
    for b, j in enumerate(idx):
        spread, fin = _spread(A[:, b])
        alpha_j, P_j = float(A[b, b]), float(P[b, b])
        law_alpha, law_P = _law(grp.M[b], G_V, trGV, int(Ej[b]))
        head_rows.append(
            {
                "layer": grp.layer,
                "kv_head": grp.kv_head,
                "head": j,
                "alpha": alpha_j,
                "P": P_j,
                "closed": bool(np.isfinite(P_j) and P_j >= threshold),
                "alpha_ij_min": float(fin.min()) if fin.size else float("nan"),
                "alpha_ij_max": float(fin.max()) if fin.size else float("nan"),
                "alpha_spread": spread,
                "law_alpha": law_alpha,
                "law_P": law_P,
                "idempotence_defect": float(np.sqrt(1.0 / P_j - 1.0)) if np.isfinite(P_j) and P_j > 0 else float("nan"),
                "kernel_defect": float(kdefs[b]),
                "reason": "; ".join(r for r in (diag_reason[b], kreasons[b]) if r),
            }
        )
    return head_rows


def _group_row(grp: _KvGroup, P: np.ndarray, head_rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The ``groups`` row of one kv group: its closed count, the medians of P_ij (all, off the diagonal), the
    smallest off-diagonal P_ij, the median and largest α spread, the law score (= median off-diagonal P_ij)."""
    n = len(grp.heads)
    off = P[~np.eye(n, dtype=bool)]
    off = off[np.isfinite(off)]
    allp = P[np.isfinite(P)]
    sp = np.asarray([h["alpha_spread"] for h in head_rows], dtype=float)
    sp = sp[np.isfinite(sp)]
    return {
        "layer": grp.layer,
        "kv_head": grp.kv_head,
        "n_heads": n,
        "heads": ",".join(map(str, grp.heads)),
        "n_closed": sum(bool(h["closed"]) for h in head_rows),
        "median_P_pairs": float(np.median(allp)) if allp.size else float("nan"),
        "median_P_offdiag": float(np.median(off)) if off.size else float("nan"),
        "min_P_offdiag": float(off.min()) if off.size else float("nan"),
        "median_alpha_spread": float(np.median(sp)) if sp.size else float("nan"),
        "max_alpha_spread": float(sp.max()) if sp.size else float("nan"),
        "law_score": float(np.median(off)) if off.size else float("nan"),
    }


def layer_algebra(
    lh: LayerHeads,
    g: Grams,
    threshold: float = DEFAULT_THRESHOLD,
    compute_dtype: torch.dtype = torch.float64,
    device: torch.device | str | None = None,
) -> SharedValueAlgebra:
    """Shared-value algebra of one layer from its Gram products (SPEC section 7).

    Steps: the kv groups from the layout (:func:`_kv_groups`; an MHA layer is empty), then per group every
    ordered pair (:func:`_group_pairs`), every right factor (:func:`_group_heads`) and the group's row
    (:func:`_group_row`), then the range angles of every pair of heads (:func:`_range_angles`) and the rows
    of those whose two heads are closed (:func:`_closed_rows`).

    Args:
        lh: the layer's heads (column form; ``V`` unexpanded, ``kv_head_of`` from the layout).
        g: ``layer_grams(lh.O, lh.V, lh.kv_head_of)``: ``G_O, G_V, M`` with batch ``[n_heads]``, float64.
        threshold: P threshold for "closed" heads (paper: 0.9).
        compute_dtype: dtype of the ``d_model``-long cross products ``O_bᵀ O_a`` of the range angles.
        device: where those products run (default: where ``lh.O`` is).

    Returns:
        :class:`SharedValueAlgebra` of this one layer (in the weights' units: the Grams' power-of-two
        rescaling, if any, is undone), with :attr:`~SharedValueAlgebra.ranges` for every pair of a group.
        Cost: ``n_group²`` products of ``d_head x d_head`` matrices per group, plus ``d r² n (n - 1)``
        flops per group of ``n`` heads for the range angles' cross products; nothing ``d_model x d_model``.

    Raises:
        OptionError: ``g`` does not have one Gram triple per query head of ``lh``.
    """
    if tuple(g.M.shape[:1]) != (lh.n_heads,):
        raise OptionError(
            f"Grams have batch shape {tuple(g.M.shape[:-2])}; expected ({lh.n_heads},) = one per query head."
        )
    # Exponent of T_j in the Grams (0 unless layer_grams rescaled a head by a power of two).
    E = np.zeros(lh.n_heads, dtype=np.int64) if g.e_T is None else g.e_T.numpy().astype(np.int64)
    groups = _kv_groups(lh)
    if all(len(idx) == 1 for _, idx in groups):
        return _mha_algebra(threshold)
    pair_rows: list[dict[str, Any]] = []
    head_rows: list[dict[str, Any]] = []
    group_rows: list[dict[str, Any]] = []
    for k, idx in groups:
        it = torch.tensor(idx)
        grp = _KvGroup(lh.layer, k, idx, g.G_V[it[0]], g.M[it], E[idx])
        A, P, diag_reason, pairs = _group_pairs(grp, g.G_O)
        heads = _group_heads(grp, g.G_O, A, P, diag_reason, threshold, g.d_model)
        pair_rows += pairs
        head_rows += heads
        group_rows.append(_group_row(grp, P, heads))
    heads_df = pd.DataFrame(head_rows, columns=HEAD_COLUMNS)
    ranges = _range_angles(lh, g, groups, compute_dtype, device)
    return SharedValueAlgebra(
        pairs=pd.DataFrame(pair_rows, columns=PAIR_COLUMNS),
        heads=heads_df,
        groups=pd.DataFrame(group_rows, columns=GROUP_COLUMNS),
        closed_ranges=_closed_rows(ranges, heads_df),
        reason="",
        threshold=threshold,
        ranges=ranges,
    )
