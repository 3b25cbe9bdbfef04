"""The part of the copying score that is algebra (SPEC 12, tied embeddings).

In TransformerLens row form a head maps ``x ↦ x @ W_V @ W_O`` (``W_V [d_model, d_head]``, ``W_O [d_head,
d_model]``), so ``W_V W_O = Tᵀ`` (SPEC 1). The full OV circuit ``W_E W_V W_O W_U`` (``d_vocab x d_vocab``) has
the nonzero eigenvalues of ``W_V W_O W_U W_E = Tᵀ G`` with ``G = W_U W_E`` (``d_model x d_model``), and for a
model that ties its embeddings (``W_U = W_Eᵀ``) ``G = W_Eᵀ W_E`` is positive semidefinite.

* :func:`own_copying_scores`: the copying score with ``G = I``: ``Re Σλ / Σ|λ|`` over the eigenvalues of ``Tᵀ``
  (those of ``T``). ``W_V W_O`` (``d_model x d_model``) and ``W_O W_V`` (``d_head x d_head``) have the same
  nonzero eigenvalues (``AB`` and ``BA``), and zero eigenvalues add nothing to either sum, so the score is
  computed from the ``d_head x d_head`` product ``W_O W_V`` (TransformerLens's
  ``FactoredMatrix(W_V, W_O).eigenvalues``), the kv head's ``W_V`` on GQA/MQA. For a head with ``T = α Π`` and
  ``Π`` any projection (``Π² = Π``, oblique or not) the eigenvalues are α (``rank Π`` times) and 0: the score is
  exactly ``sign(α)``. The real copying score (:func:`~tl_idempotence.probes.roles.copying_scores`) differs
  from it only through ``G``.
* :func:`embedding_tie`: whether ``W_U == W_Eᵀ`` for the matrices the model holds now: exactly (every element
  equal), within float rounding (every element within two units in the last place of the coarser dtype, as a
  cast between dtypes leaves them), or not. A tied checkpoint loaded with TransformerLens's processing
  (``fold_ln`` scales ``W_U`` by the final norm's weight, ``center_unembed`` centres it) is untied by this test:
  the algebra is about the matrices, not the config flag, which the result records beside it when the model
  states one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch

from ..core.heads import ModelInfo
from ..core.selection import head_labels
from ..errors import UnsupportedModelError
from ..sources.tl import TLModelSource, is_tl_model
from .roles import eigen_floor
from .token_records import embedding_matrices

__all__ = ["EmbeddingTie", "embedding_tie", "own_copying_scores"]

#: Why a G = I copying score is NaN (its ``reason``; :func:`~tl_idempotence.probes.roles.eigen_floor`).
OWN_NAN_REASON = (
    "T has no nonzero eigenvalue beyond float rounding (Σ|λ| <= √(d_head u) ‖W_O W_V‖_F: a zero W_O, a zero W_V "
    "of its kv group, or a nilpotent head)"
)
#: Vocabulary rows per block when comparing W_U with W_Eᵀ.
_ROWS = 8192


@dataclass(frozen=True)
class EmbeddingTie:
    """Whether a model ties its embeddings (:func:`embedding_tie`).

    Attributes:
        tied: ``W_U == W_Eᵀ`` exactly or within float rounding.
        how: ``"exact"``, ``"float rounding"`` or ``"untied"``.
        max_abs_diff: ``max |W_U - W_Eᵀ|`` (float64).
        max_rel_diff: ``max_abs_diff / max |W_E|`` (NaN for an all-zero ``W_E``).
        declared: the model's ``tie_word_embeddings`` when its config states one, else None.
        dtypes: ``"W_E dtype / W_U dtype"``.
    """

    tied: bool
    how: str
    max_abs_diff: float
    max_rel_diff: float
    declared: bool | None
    dtypes: str

    def describe(self) -> str:
        """One phrase for a headline, e.g. ``"ties its embeddings (W_U = W_Eᵀ exactly)"``."""
        if self.how == "exact":
            return "ties its embeddings (W_U = W_Eᵀ exactly)"
        if self.how == "float rounding":
            return f"ties its embeddings (W_U = W_Eᵀ within float rounding, max |diff| {self.max_abs_diff:.2g})"
        extra = " although its config declares tie_word_embeddings (its W_U was processed)" if self.declared else ""
        return f"does not tie its embeddings (max |W_U - W_Eᵀ| {self.max_abs_diff:.3g}{extra})"

    def to_dict(self) -> dict[str, Any]:
        """The fields as a JSON-able dict."""
        return {
            "tied": self.tied,
            "how": self.how,
            "max_abs_diff": self.max_abs_diff,
            "max_rel_diff": self.max_rel_diff,
            "declared": self.declared,
            "dtypes": self.dtypes,
        }


def _declared_tie(model: Any) -> bool | None:
    for obj in (getattr(model, "cfg", None), getattr(getattr(model, "original_model", None), "config", None)):
        v = getattr(obj, "tie_word_embeddings", None) if obj is not None else None
        if isinstance(v, bool):
            return v
    return None


def embedding_tie(model: Any) -> EmbeddingTie:
    """Whether ``model.W_U`` equals ``model.W_E.T`` (module docstring), compared in float64 row blocks (no
    ``d_vocab x d_model`` float64 copy).

    Args:
        model: a TransformerLens model with ``W_E [d_vocab, d_model]`` and ``W_U [d_model, d_vocab]``.

    Returns:
        :class:`EmbeddingTie`.

    Raises:
        UnsupportedModelError / WeightError: as :func:`~tl_idempotence.probes.head_tokens.embedding_matrices`
            (not a TransformerLens model, no ``W_E``/``W_U``, ``d_vocab_out != d_vocab``, NaN/inf).
    """
    W_E, W_U = embedding_matrices(model, "embedding_tie")
    eps = max(torch.finfo(W_E.dtype).eps, torch.finfo(W_U.dtype).eps)  # the coarser dtype's unit in the last place
    exact = True
    within = True
    max_abs = 0.0
    max_e = 0.0
    with torch.no_grad():
        for s in range(0, W_E.shape[0], _ROWS):
            e = W_E[s : s + _ROWS].to(torch.float64)
            u = W_U[:, s : s + _ROWS].to(W_E.device, torch.float64).T
            d = (u - e).abs()
            exact = exact and bool((d == 0).all())
            within = within and bool((d <= 2 * eps * torch.maximum(e.abs(), u.abs())).all())
            max_abs = max(max_abs, float(d.max()) if d.numel() else 0.0)
            max_e = max(max_e, float(e.abs().max()) if e.numel() else 0.0)
    how = "exact" if exact else ("float rounding" if within else "untied")
    return EmbeddingTie(
        tied=how != "untied",
        how=how,
        max_abs_diff=max_abs,
        max_rel_diff=max_abs / max_e if max_e > 0 else math.nan,
        declared=_declared_tie(model),
        dtypes=f"{str(W_E.dtype).removeprefix('torch.')} / {str(W_U.dtype).removeprefix('torch.')}",
    )


def own_copying_scores(model: Any) -> tuple[pd.DataFrame, ModelInfo]:
    """The copying score of every query head with ``G = I`` (module docstring): ``Re Σλ / Σ|λ|`` over the
    eigenvalues of ``T`` (float64, from the ``d_head x d_head`` product ``W_O W_V``).

    Args:
        model: a TransformerLens model (the kv head's ``W_V`` on GQA/MQA, as ``model.OV`` expands it).

    Returns:
        ``(table, info)``: ``table`` indexed by ``"L10H8"`` labels with ``layer, head, kv_head, copying_own,
        reason`` (``reason`` says why a score is NaN: ``T`` has no eigenvalue beyond float rounding, e.g. a
        nilpotent or zero head, :func:`~tl_idempotence.probes.roles.eigen_floor`), one row per query head in layer,
        head order.

    Raises:
        UnsupportedModelError: not a TransformerLens model.
        WeightError: NaN/inf in a layer's W_O or W_V (names layer and head), a non-float dtype.
    """
    from transformer_lens import FactoredMatrix

    if not is_tl_model(model):
        raise UnsupportedModelError(
            f"own_copying_scores reads a TransformerLens model (HookedTransformer or TransformerBridge); got "
            f"{type(model).__name__}."
        )
    src = TLModelSource(model)
    rows = []
    with torch.no_grad():
        for lh in src:
            lh.check_finite()  # WeightError naming layer and head
            V = lh.V.double()[lh.kv_head_of.to(lh.V.device)]  # [n_heads, d_model, d_head]
            W_O = lh.O.double().transpose(-1, -2)  # [n_heads, d_head, d_model]
            lam = FactoredMatrix(V, W_O).eigenvalues  # [n_heads, d_head]: those of W_O W_V
            num = lam.real.sum(-1).cpu().tolist()
            den = lam.abs().sum(-1).cpu().tolist()
            floor = eigen_floor(W_O @ V).cpu().tolist()
            for h, (a, b) in enumerate(zip(num, den)):
                ok = b > floor[h] and math.isfinite(b)
                rows.append(
                    {
                        "layer": lh.layer,
                        "head": h,
                        "kv_head": int(lh.kv_head_of[h]),
                        "copying_own": a / b if ok else math.nan,
                        "reason": "" if ok else OWN_NAN_REASON,
                    }
                )
    table = pd.DataFrame(rows, columns=["layer", "head", "kv_head", "copying_own", "reason"])
    table.index = head_labels(table["layer"], table["head"])
    return table, src.info
