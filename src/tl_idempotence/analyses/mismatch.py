"""The matched within-layer O/V mismatch control (SPEC 4a; paper: no mismatched pair reaches P >= 0.9).

``T_ig = O_i V_gᵀ`` for every query head ``i`` and every kv head ``g ≠ kv(i)`` of the same
layer: each distinct product once (MHA: ``n(n-1)`` ordered pairs; GQA: pairs only across
kv groups — in GQA ``O_i V_jᵀ`` depends only on j's kv head; MQA: none). Computed
factored from the layer's Gram products (``G_O``, ``G_V`` per kv head) and one GEMM for
the cross products ``V_gᵀ O_i``; nothing ``d_model x d_model`` is formed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import pandas as pd
import torch

from ..core.defaults import DEFAULT_COMPUTE_DTYPE, DEFAULT_DEVICE, DEFAULT_THRESHOLD
from ..core.frozen import frozen
from ..core.heads import LayerHeads
from ..core.option_specs import GeneralOptions
from ..core.options import strict_kwargs
from ..core.tables import ImmutableResult
from ..maths.closure import Grams, apply_exponents, closure_from_grams, layer_grams
from ..views.results import DrawnResult
from .base import LayerContext, LayerResult, nan_max, nan_median
from .threshold import closed_flags, count_closed

if TYPE_CHECKING:  # pragma: no cover
    from ..core.hints import ArchitectureLike, DeviceLike, DtypeLike, LayersLike, ModelLike, RealLike

__all__ = ["MismatchAnalysis", "MismatchResult", "mismatch", "mismatch_pairs"]

#: Elements per chunk of the cross-product GEMM.
CHUNK_ELEMS = 1 << 22
MQA_NOTE = "no valid pair: one kv head (MQA), every query head reads the same V"
PAIR_COLUMNS = ["layer", "head", "kv_head", "v_head", "alpha", "P", "norm", "reason"]


def mismatch_pairs(
    lh: LayerHeads,
    g: Grams | None = None,
    compute_dtype: torch.dtype = torch.float64,
    device: torch.device | str | None = None,
) -> tuple[pd.DataFrame, str]:
    """Every distinct mismatched product ``T_ig = O_i V_gᵀ``, ``g ≠ kv(i)``, of one layer (SPEC 4a).

    Args:
        lh: the layer's heads (``O [n_heads, d_model, d_head]``, unexpanded ``V [n_kv, ...]``).
        g: the layer's :class:`~tl_idempotence.maths.closure.Grams` if already computed (reuses
            ``G_O``, ``G_V`` and their power-of-two exponents; only ``V_gᵀ O_i`` is new).
        compute_dtype: dtype of the ``d_model``-long products (float64 default).
        device: where the GEMM runs (default: where ``lh.O`` is).

    Returns:
        ``(table, note)``: one row per pair with ``layer, head, kv_head, v_head, alpha, P, norm,
        reason`` (``head`` = i, ``kv_head`` = kv(i), ``v_head`` = g), ordered by ``v_head`` then
        ``head``; ``note`` is "" or why there is no valid pair.

    Cost: one GEMM ``[n_kv·r, d] @ [d, n·r]`` (chunked over query heads), i.e. ``2 d r²``
    flops per (query head, kv head), plus ``r x r`` algebra per pair.
    """
    kv = lh.kv_head_of.long().cpu()
    if lh.n_kv_heads < 2:
        return pd.DataFrame({k: [] for k in PAIR_COLUMNS}), MQA_NOTE
    if g is None:
        g = layer_grams(lh.O, lh.V, lh.kv_head_of, compute_dtype=compute_dtype, device=device)
    n, d, r, nkv = lh.n_heads, lh.d_model, lh.d_head, lh.n_kv_heads
    O, V = (lh.O, lh.V) if device is None else (lh.O.to(device), lh.V.to(device))
    first = torch.stack([(kv == gk).nonzero().flatten()[0] for gk in range(nkv)])
    G_O, G_V = g.G_O, g.G_V[first]
    e_O = g.e_O
    e_Vk = None if g.e_V is None else g.e_V[first]
    Vc = apply_exponents(V, e_Vk, compute_dtype)
    Vt = Vc.transpose(-1, -2).reshape(nkv * r, d)
    M = torch.empty(nkv, n, r, r, dtype=torch.float64)  # M[g, i] = V_gᵀ O_i
    hc = max(1, CHUNK_ELEMS // (d * r))
    for a in range(0, n, hc):
        e_chunk = None if e_O is None else e_O[a : a + hc]
        Of = apply_exponents(O[a : a + hc], e_chunk, compute_dtype).permute(1, 0, 2).reshape(d, -1)
        M[:, a : a + hc] = (Vt @ Of).reshape(nkv, r, -1, r).permute(0, 2, 1, 3).to(torch.float64).cpu()
        del Of
    gi, hi = (kv.unsqueeze(0) != torch.arange(nkv).unsqueeze(1)).nonzero(as_tuple=True)  # ordered by g, then head
    cl = closure_from_grams(
        Grams(
            G_O=G_O[hi],
            G_V=G_V[gi],
            M=M[gi, hi],
            d_model=d,
            input_dtype=torch.promote_types(lh.O.dtype, lh.V.dtype),
            e_O=None if e_O is None else e_O[hi],
            e_V=None if e_Vk is None else e_Vk[gi],
        )
    )
    tab = pd.DataFrame(
        {
            "layer": lh.layer,
            "head": hi.numpy(),
            "kv_head": kv[hi].numpy(),
            "v_head": gi.numpy(),
            "alpha": cl.alpha.numpy(),
            "P": cl.P.numpy(),
            "norm": cl.norm.numpy(),
            "reason": np.asarray(cl.reason, dtype=object).astype(str),
        }
    )
    return tab, ""


def _layer_values(tab: pd.DataFrame, note: str, threshold: float) -> tuple[dict[str, Any], dict[str, str]]:
    P = tab["P"].to_numpy(dtype=float)
    fin = P[np.isfinite(P)]
    values = {
        "n_mismatch_pairs": len(tab),
        "mismatch_P_max": nan_max(fin),
        "mismatch_P_median": nan_median(fin),
        "n_mismatch_closed": count_closed(P, threshold),
        "mismatch_note": note,
    }
    notes = {}
    if not fin.size:
        why = note or "no mismatched pair has a defined P (see the pairs' reason)"
        notes = {"mismatch_P_max": why, "mismatch_P_median": why}
    return values, notes


class MismatchResult(ImmutableResult, DrawnResult):
    """Result of :func:`mismatch`. Immutable (:class:`~tl_idempotence.core.tables.ImmutableResult`): assigning an
    attribute raises ``dataclasses.FrozenInstanceError``, its tables are copies made on each read.

    Attributes:
        pairs: one row per mismatched product (``PAIR_COLUMNS`` plus ``closed``); also :attr:`heads`.
        layers: one row per layer: ``n_mismatch_pairs, mismatch_P_max, mismatch_P_median,
            n_mismatch_closed, mismatch_note``.
        threshold: the P threshold.
    """

    repr_keys: ClassVar[tuple[str, ...]] = ("n_pairs", "n_closed", "max_P", "threshold")
    frozen_name: ClassVar[str] = "a mismatch result is"
    frozen_hint: ClassVar[str] = "MismatchResult(pairs, layers, threshold) for a changed one"

    pairs: pd.DataFrame
    layers: pd.DataFrame
    threshold: float

    def __init__(self, pairs: pd.DataFrame, layers: pd.DataFrame, threshold: float):
        self._freeze(pairs=pairs, layers=layers, threshold=float(threshold))

    @property
    def heads(self) -> pd.DataFrame:
        """The pairs table (one row per mismatched product)."""
        return self.pairs

    @property
    def summary(self) -> dict[str, Any]:
        """``n_pairs``, ``n_closed`` (P >= threshold), ``max_P``, ``threshold``, ``notes`` (read-only)."""
        pairs = self.pairs
        P = pairs["P"].to_numpy(dtype=float) if len(pairs) else np.zeros(0)
        notes = sorted({str(v) for v in self.layers.get("mismatch_note", []) if str(v)})
        return frozen(
            {
                "n_pairs": len(pairs),
                "n_closed": int(closed_flags(P, self.threshold).sum()),
                "max_P": nan_max(P),
                "threshold": self.threshold,
                "notes": notes,
            }
        )


@strict_kwargs
def mismatch(
    model: ModelLike,
    *,
    threshold: RealLike = DEFAULT_THRESHOLD,
    layers: LayersLike = None,
    compute_dtype: DtypeLike = DEFAULT_COMPUTE_DTYPE,
    device: DeviceLike = DEFAULT_DEVICE,
    architecture: ArchitectureLike | None = None,
    prefix: str | None = None,
) -> MismatchResult:
    """Matched within-layer O/V mismatch control (SPEC 4a; paper: no mismatched pair reaches P >= 0.9).

    Args:
        model: a :class:`~tl_idempotence.core.heads.LayerHeads` or anything
            :func:`~tl_idempotence.sources.dispatch.head_source` accepts (TransformerLens model,
            ``transformers`` model, checkpoint path, HeadSource).
        threshold (float): P threshold in [0, 1].
        layers (Iterable[int] | None): restrict to these layers (default: all attention layers).
        compute_dtype (torch.dtype | str): dtype of the ``d_model``-long products.
        device (str | torch.device): where the products run; results are CPU float64.
        architecture: checkpoint option (see ``head_source``).
        prefix: checkpoint option (see ``head_source``).

    Every argument is validated here, where it enters.

    Returns:
        :class:`MismatchResult`.

    Raises:
        OptionError / OptionTypeError: bad threshold, layers, dtype; an unknown layer.
        UnsupportedModelError: unsupported ``model``.
    """
    from .loop import open_model

    opts = GeneralOptions(threshold=threshold, layers=layers, compute_dtype=compute_dtype, device=device)
    threshold = opts.threshold
    walk = open_model(model, opts, architecture=architecture, prefix=prefix)
    analysis = MismatchAnalysis()
    tabs, rows = [], []
    for ctx in walk.contexts(progress=False, desc="mismatch"):
        res = analysis.run(ctx)
        tabs.append(res.tables["mismatch_pairs"])
        rows.append({"layer": ctx.heads.layer, **res.values})
    pairs = pd.concat(tabs, ignore_index=True) if tabs else pd.DataFrame(columns=PAIR_COLUMNS)
    pairs["closed"] = closed_flags(pairs["P"].to_numpy(dtype=float), threshold)
    return MismatchResult(pairs=pairs, layers=pd.DataFrame(rows), threshold=threshold)


class MismatchAnalysis:
    """Per-layer mismatch summary of the report (SPEC 4a); runs when ``nulls > 0``.

    Tables: ``mismatch_pairs`` (every pair, from which the declared rule
    :data:`~tl_idempotence.analyses.mismatch_spec.N_MISMATCH_CLOSED`, whose kernel gives ``n_mismatch_closed`` here,
    derives it at another
    threshold).
    """

    name: ClassVar[str] = "mismatch"
    reason_column: ClassVar[str | None] = None

    def enabled(self, options: GeneralOptions) -> bool:
        """Whether the report runs this analysis (when the scramble's option ``nulls > 0``)."""
        return bool(options["nulls"] > 0)

    def run(self, ctx: LayerContext) -> LayerResult:
        """This analysis of one layer (SPEC 4a): the columns, values, tables and notes of the class docstring.

        Raises: nothing of its own for a valid context (the context was built from checked heads and options).
        """
        tab, note = mismatch_pairs(ctx.heads, g=ctx.grams, compute_dtype=ctx.options.compute_dtype, device=ctx.device)
        values, notes = _layer_values(tab, note, ctx.options.threshold)
        return LayerResult(values=values, notes=notes, tables={"mismatch_pairs": tab})

    def summarize(
        self, heads: pd.DataFrame, layers: pd.DataFrame, tables: dict[str, pd.DataFrame], options: GeneralOptions
    ) -> dict[str, Any]:
        """Model-level headline numbers (SPEC 4a) from the concatenated per-layer results (JSON values)."""
        s: dict[str, Any] = {
            "n_mismatch_pairs": int(layers["n_mismatch_pairs"].sum()),
            "n_mismatch_closed": int(layers["n_mismatch_closed"].sum()),
            "mismatch_P_max": nan_max(layers["mismatch_P_max"]),
        }
        notes = sorted({str(n) for n in layers["mismatch_note"] if str(n)})
        if notes:
            s["mismatch_notes"] = notes
        return s
