"""The one layer loop: every route that measures a model's layers walks them here.

:func:`iter_layers` resolves the layers asked for against the source, reads each one through
:func:`~tl_idempotence.core.heads.read_layer` (type, index, sizes, NaN/inf: every source, built-in or
user-written), runs under the thread count the layer's size calls for
(:func:`~tl_idempotence.core.threads.threads_for`), shows one progress bar, and hands out one
:class:`LayerWork` per layer: the layer's heads, its weight fingerprint (sha256, computed on first use) and
its :class:`~tl_idempotence.analyses.base.LayerContext` (Gram products and closure, computed on first use, in
memory reused across layers). :func:`run_layer` runs analyses on one context and gathers their results into a
:class:`LayerPart`, the unit the report concatenates and the resume directory stores.

The report (with its resume parts), the shared-value algebra, the O/V mismatch and the constructive search
all iterate with :func:`iter_layers` and analyse with the analyses of :mod:`.registry`; a layer's weights are
dropped before the next is read, so memory is bounded by one layer (SPEC 9). An entry point that takes a model
without a report (the algebra, the mismatch) opens it with :func:`open_model` and walks its
:meth:`ModelWalk.contexts`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from ..core.heads import HeadSource, LayerHeads, ModelInfo, read_layer, source_info
from ..core.option_specs import GeneralOptions
from ..core.options import resolve_layers
from ..core.threads import layer_macs, threads_for
from ..maths.closure import CastBuffer
from ..sources.dispatch import head_source
from .base import Analysis, LayerContext

if TYPE_CHECKING:  # pragma: no cover
    from ..core.hints import ArchitectureLike, ModelLike

__all__ = ["LayerPart", "LayerWork", "ModelWalk", "iter_layers", "open_model", "run_layer"]


@dataclass
class LayerPart:
    """One layer's finished rows (what the report loop concatenates and a resume directory stores).

    Attributes:
        layer: the layer index.
        fingerprint: sha256 of the layer's O, V and kv layout (:meth:`LayerHeads.fingerprint`).
        heads: per-head rows (identity columns and every analysis's columns), head order.
        row: the layer row (identity, values, ``fingerprint``, ``note``).
        tables: the analyses' long tables of this layer.
    """

    layer: int
    fingerprint: str
    heads: pd.DataFrame
    row: dict[str, Any]
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)


class LayerWork:
    """One layer of :func:`iter_layers`: its checked heads, and its fingerprint and context on first use.

    Attributes:
        layer: the layer index.
        heads: the layer's :class:`~tl_idempotence.core.heads.LayerHeads` (read and checked).
    """

    def __init__(self, heads: LayerHeads, options: GeneralOptions, buffer: CastBuffer) -> None:
        self.layer = heads.layer
        self.heads = heads
        self._options = options
        self._buffer = buffer
        self._fingerprint: str | None = None
        self._context: LayerContext | None = None

    @property
    def fingerprint(self) -> str:
        """sha256 of exactly what is measured (:meth:`~tl_idempotence.core.heads.LayerHeads.fingerprint`)."""
        if self._fingerprint is None:
            self._fingerprint = self.heads.fingerprint()
        return self._fingerprint

    def context(self) -> LayerContext:
        """The layer's Gram products and closure (on ``options.device``), computed once."""
        if self._context is None:
            self._context = LayerContext.build(self.heads, self._options, self._buffer)
        return self._context


def iter_layers(
    src: HeadSource,
    info: ModelInfo,
    options: GeneralOptions,
    *,
    layers: Sequence[int] | None = None,
    progress: bool = True,
    desc: str = "layers",
) -> Iterator[LayerWork]:
    """The layers of ``src`` one at a time (module docstring).

    Args:
        src: a head source.
        info: its :class:`~tl_idempotence.core.heads.ModelInfo` (each layer's sizes are checked against it).
        options: the validated options (``options.layers`` chooses the layers unless ``layers`` is given).
        layers: the layers to walk instead of ``options.layers`` (``None``: ``options.layers``, else all).
        progress: one tqdm bar over the layers.
        desc: the bar's description.

    Yields:
        :class:`LayerWork`, in the order of the layers asked for.

    Raises:
        OptionError: a layer that is not an attention layer of the model (lists the available ones).
        The errors of :func:`~tl_idempotence.core.heads.read_layer` (WeightError, UnsupportedModelError).
    """
    from ..core.progress import progress_bar

    todo = resolve_layers(options.layers if layers is None else layers, list(src.layers()))
    buffer = CastBuffer()  # one block of memory for every layer's compute-dtype copy of O
    # small layers on one thread unless the user chose (core/threads.py): every layer has the model's sizes
    with threads_for(layer_macs(info.n_heads, info.n_kv_heads, info.d_model, info.d_head)):
        for layer in progress_bar(todo, desc=desc, unit="layer", enabled=progress):
            yield LayerWork(read_layer(src, layer, info), options, buffer)


@dataclass(frozen=True)
class ModelWalk:
    """A model opened by :func:`open_model` for an entry point's walk over its layers.

    Attributes:
        source: the model's :class:`~tl_idempotence.core.heads.HeadSource`.
        info: its :class:`~tl_idempotence.core.heads.ModelInfo`.
        options: the validated options (``options.layers`` chooses the layers walked).
    """

    source: HeadSource
    info: ModelInfo
    options: GeneralOptions

    def contexts(self, *, progress: bool, desc: str) -> Iterator[LayerContext]:
        """Each chosen layer's :class:`~tl_idempotence.analyses.base.LayerContext`, in order (:func:`iter_layers`,
        its bar shown when ``progress``, described by ``desc``; its errors)."""
        for work in iter_layers(self.source, self.info, self.options, progress=progress, desc=desc):
            yield work.context()


def open_model(
    model: ModelLike, options: GeneralOptions, *, architecture: ArchitectureLike | None, prefix: str | None
) -> ModelWalk:
    """``model``'s head source (:func:`~tl_idempotence.sources.dispatch.head_source` with the checkpoint options
    ``architecture`` and ``prefix``) and its info, to walk with ``options``; nothing is read yet.

    Raises:
        The errors of :func:`~tl_idempotence.sources.dispatch.head_source` (UnsupportedModelError, CheckpointError,
        MissingFileError, OptionError / OptionTypeError) and of :func:`~tl_idempotence.core.heads.source_info`.
    """
    src = head_source(model, architecture=architecture, prefix=prefix)
    return ModelWalk(src, source_info(src), options)


def run_layer(ctx: LayerContext, analyses: Sequence[Analysis], fingerprint: str) -> LayerPart:
    """Every analysis on one layer's context -> its :class:`LayerPart` (each analysis's columns must have one
    row per head, in head order: the per-layer contract of :mod:`.base`).

    Raises:
        AssertionError: an analysis broke the contract (a column of the wrong length).
    """
    lh = ctx.heads
    cols: dict[str, Any] = {"layer": lh.layer, "head": np.arange(lh.n_heads), "kv_head": lh.kv_head_of.cpu().numpy()}
    row: dict[str, Any] = {"layer": lh.layer, "n_heads": lh.n_heads, "n_kv_heads": lh.n_kv_heads}
    tables: dict[str, pd.DataFrame] = {}
    notes: dict[str, str] = {}
    for a in analyses:
        res = a.run(ctx)
        for k, v in res.columns.items():
            if len(v) != lh.n_heads:
                raise AssertionError(f"analysis {a.name} returned {len(v)} rows of {k!r} for {lh.n_heads} heads")
            cols[k] = v
        row.update(res.values)
        tables.update(res.tables)
        notes.update(res.notes)
    row["fingerprint"] = fingerprint
    row["note"] = "; ".join(f"{k}: {v}" for k, v in notes.items())
    return LayerPart(layer=lh.layer, fingerprint=fingerprint, heads=pd.DataFrame(cols), row=row, tables=tables)


def concat_tables(parts: Sequence[LayerPart]) -> dict[str, pd.DataFrame]:
    """The parts' long tables concatenated by name, in layer order (an all-empty table keeps its columns)."""
    tables: dict[str, pd.DataFrame] = {}
    for name in sorted({k for p in parts for k in p.tables}):
        frames = [p.tables[name] for p in parts if name in p.tables and len(p.tables[name])]
        tables[name] = (
            pd.concat(frames, ignore_index=True) if frames else next(p.tables[name] for p in parts if name in p.tables)
        )
    return tables
