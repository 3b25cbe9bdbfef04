"""Shared-value algebra of GQA/MQA heads (SPEC section 7): the entry point :func:`shared_value_algebra` and
the report analysis :class:`AlgebraAnalysis`.

The maths (``α_ij``, ``P_ij``, the right-action law, the kernel defects, the range angles; the formulas are in
its module docstring) and the result :class:`SharedValueAlgebra` are in
:mod:`tl_idempotence.analyses.algebra_maths`; their public names are importable from here too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

import pandas as pd

from ..core.defaults import DEFAULT_COMPUTE_DTYPE, DEFAULT_DEVICE, DEFAULT_THRESHOLD
from ..core.heads import ModelInfo
from ..core.option_specs import GeneralOptions
from ..core.options import check_bool, resolve_layers, strict_kwargs
from .algebra_maths import MHA_REASON, TABLES, SharedValueAlgebra, layer_algebra
from .algebra_maths import empty_table as _empty
from .base import LayerContext, LayerResult

if TYPE_CHECKING:  # pragma: no cover
    from ..core.hints import ArchitectureLike, DeviceLike, DtypeLike, LayersLike, ModelLike, RealLike

__all__ = ["MHA_REASON", "AlgebraAnalysis", "SharedValueAlgebra", "layer_algebra", "shared_value_algebra"]


@strict_kwargs
def shared_value_algebra(
    model: ModelLike,
    *,
    threshold: RealLike = DEFAULT_THRESHOLD,
    layers: LayersLike = None,
    compute_dtype: DtypeLike = DEFAULT_COMPUTE_DTYPE,
    device: DeviceLike = DEFAULT_DEVICE,
    progress: bool = True,
    architecture: ArchitectureLike | None = None,
    prefix: str | None = None,
) -> SharedValueAlgebra:
    """Shared-value algebra ``T_i T_j ≈ α_j T_i`` of every kv group of a model (SPEC section 7).

    For each GQA/MQA kv group and each ordered pair ``(i, j)`` of its query heads:
    ``α_ij = ⟨T_iT_j, T_i⟩/‖T_i‖²`` and ``P_ij = cos²(T_iT_j, T_i)`` in ``d_head x d_head``
    form; per right factor ``j`` the spread of ``α_ij`` over ``i``; per group the law score;
    for closed heads the principal angles between their ranges and the distance of
    ``T_j/α_j`` from the projection along the shared kernel ker(Vᵀ). See the module
    docstring of :mod:`~tl_idempotence.analyses.algebra_maths` for the formulas. Paper: Feng & Li,
    arXiv 2609.01129 ("shared-value algebras").

    Args:
        model: anything :func:`~tl_idempotence.sources.dispatch.head_source` accepts
            (TransformerLens model, ``transformers`` model, checkpoint path, HeadSource, LayerHeads).
        threshold (float): P threshold for "closed" heads, in [0, 1].
        layers (Iterable[int] | None): restrict to these attention layers (default: all).
        compute_dtype (torch.dtype | str): dtype of the ``d_model``-long Gram products (float64 default).
        device (str | torch.device): where the products run; results are CPU float64.
        progress (bool): tqdm bar over layers.
        architecture: checkpoint option: ``None``, an architecture-table name or entry dict.
        prefix: checkpoint option: ``None`` or the tensor-name root as a ``str``.

    Every argument is validated here, where it enters.

    Returns:
        :class:`SharedValueAlgebra`; empty with ``reason == "no exact value sharing (MHA)"``
        for MHA models.

    Raises:
        OptionError / OptionTypeError: bad threshold, unknown layer indices.
        WeightError: NaN/inf weights. UnsupportedModelError: unsupported model object.
    """
    from .loop import open_model

    opts = GeneralOptions(threshold=threshold, layers=layers, compute_dtype=compute_dtype, device=device)
    progress = check_bool(progress, "progress")
    walk = open_model(model, opts, architecture=architecture, prefix=prefix)
    resolve_layers(opts.layers, list(walk.source.layers()))  # unknown layers are refused for MHA models too
    if walk.info.n_kv_heads == walk.info.n_heads:
        return SharedValueAlgebra.concat([], walk.info, opts.threshold)
    analysis = AlgebraAnalysis()
    parts = [analysis.layer(ctx) for ctx in walk.contexts(progress=progress, desc="algebra")]
    return SharedValueAlgebra.concat(parts, walk.info, opts.threshold)


#: The layer value naming the threshold a layer's closed ranges were computed at.
RANGES_THRESHOLD = "algebra_ranges_threshold"


class AlgebraAnalysis:
    """The shared-value algebra as a report analysis (SPEC 7); runs when ``algebra=True``.

    Tables: ``algebra_pairs``, ``algebra_heads``, ``algebra_groups``, ``algebra_closed_ranges``,
    ``algebra_ranges`` (the :class:`SharedValueAlgebra` tables of the layer; empty for MHA layers). The
    layer value ``algebra_ranges_threshold`` is the threshold ``algebra_closed_ranges`` is at.
    """

    name: ClassVar[str] = "algebra"
    reason_column: ClassVar[str | None] = None

    def enabled(self, options: GeneralOptions) -> bool:
        """Whether the report runs this analysis (when its option ``algebra`` is on)."""
        return bool(options["algebra"])

    def layer(self, ctx: LayerContext) -> SharedValueAlgebra:
        """The algebra of one layer's context (SPEC 7), as a :class:`SharedValueAlgebra` of that layer."""
        return layer_algebra(
            ctx.heads,
            ctx.grams,
            threshold=ctx.options.threshold,
            compute_dtype=ctx.options.compute_dtype,
            device=ctx.device,
        )

    def run(self, ctx: LayerContext) -> LayerResult:
        """This analysis of one layer (SPEC 7): the columns, values, tables and notes of the class docstring.

        Raises: nothing of its own for a valid context (the context was built from checked heads and options).
        """
        part = self.layer(ctx)
        tables = {f"algebra_{k}": getattr(part, k) for k in TABLES}
        # the threshold the closed ranges are at (the rule at_threshold moves it with the threshold)
        return LayerResult(tables=tables, values={RANGES_THRESHOLD: ctx.options.threshold}, notes={})

    @staticmethod
    def ranges_threshold(layers: pd.DataFrame, default: float) -> float:
        """The threshold a report's ``algebra_closed_ranges`` were computed at (its layer rows say; ``default``
        for layer rows that do not say)."""
        if RANGES_THRESHOLD in layers.columns and len(layers):
            return float(layers[RANGES_THRESHOLD].iloc[0])
        return float(default)

    @staticmethod
    def combine(
        tables: dict[str, pd.DataFrame],
        info: ModelInfo | None,
        threshold: float,
        ranges_threshold: float | None = None,
        mha: bool | None = None,
    ) -> SharedValueAlgebra:
        """The model's :class:`SharedValueAlgebra` from the report's concatenated ``algebra_*`` tables (``mha``:
        whether every kv group has one query head, by default from ``info``)."""
        got = {k: tables.get(f"algebra_{k}", _empty(cols)) for k, cols in TABLES.items()}
        got = {k: (v if len(v) else _empty(TABLES[k])) for k, v in got.items()}
        # a saved report without every pair's angles has no algebra_ranges table
        ranges = got["ranges"] if "algebra_ranges" in tables else None
        if mha is None:
            mha = info is not None and info.n_kv_heads == info.n_heads
        if len(got["pairs"]):
            reason = ""
        elif mha:
            reason = MHA_REASON
        else:
            reason = "no layer with a kv group of two or more query heads was analysed"
        rt = ranges_threshold if ranges_threshold is not None else threshold
        alg = SharedValueAlgebra(
            pairs=got["pairs"],
            heads=got["heads"],
            groups=got["groups"],
            closed_ranges=got["closed_ranges"],
            reason=reason,
            info=info,
            threshold=threshold,
            ranges_threshold=rt,
            ranges=ranges,
        )
        # closed_ranges is at the threshold when every pair is known (at_threshold keeps it there); a
        # report without algebra_ranges keeps the pairs closed at ranges_threshold, viewed at both (at_threshold)
        if ranges is not None:
            return alg
        return alg.at_threshold(threshold) if threshold != rt and len(alg.closed_ranges) else alg

    @staticmethod
    def at_threshold(
        heads: pd.DataFrame, layers: pd.DataFrame, tables: dict[str, pd.DataFrame], threshold: float
    ) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, pd.DataFrame]]:
        """The algebra's threshold rule (:data:`~tl_idempotence.analyses.algebra_spec.AT_THRESHOLD`, applied by
        :func:`~tl_idempotence.analyses.threshold.derive_at_threshold`): the frames with the algebra's ``closed``
        flags, group counts and ``algebra_closed_ranges`` (the rows of ``algebra_ranges``, every pair's angles,
        whose two heads are closed at ``threshold``) and the layer value ``algebra_ranges_threshold`` at
        ``threshold``: what a run at that threshold gives. New frames; the inputs are not changed.

        A saved report without the ``algebra_ranges`` table has the angles of the pairs closed at its run's
        threshold only: its ``algebra_closed_ranges`` is left as computed and its ``algebra_ranges_threshold``
        stays (so a threshold can be raised and set back without losing pairs; :meth:`combine` filters it).
        """
        known = "algebra_ranges" in tables
        moved = known and RANGES_THRESHOLD in layers.columns
        new_layers = layers.assign(**{RANGES_THRESHOLD: threshold}) if moved else layers
        if "algebra_heads" not in tables or not len(tables["algebra_heads"]):
            return heads, new_layers, tables
        alg = SharedValueAlgebra(
            pairs=tables["algebra_pairs"],
            heads=tables["algebra_heads"],
            groups=tables["algebra_groups"],
            closed_ranges=tables["algebra_closed_ranges"],
            reason="",
            ranges=tables["algebra_ranges"] if known else None,
        ).at_threshold(threshold)
        new = {**tables, "algebra_heads": alg.heads, "algebra_groups": alg.groups}
        if known:
            new["algebra_closed_ranges"] = alg.closed_ranges
        return heads, new_layers, new

    def summarize(
        self, heads: pd.DataFrame, layers: pd.DataFrame, tables: dict[str, pd.DataFrame], options: GeneralOptions
    ) -> dict[str, Any]:
        """Model-level headline numbers (SPEC 7) from the concatenated per-layer results (JSON values):
        ``algebra`` (the :class:`SharedValueAlgebra` summary at the options' threshold) and
        ``algebra_ranges_threshold``."""
        rt = self.ranges_threshold(layers, options.threshold)
        mha = bool(len(layers)) and bool((layers["n_kv_heads"] == layers["n_heads"]).all())
        alg = self.combine(tables, None, options.threshold, rt, mha=mha)
        return {"algebra": alg.summary, "algebra_ranges_threshold": rt}
