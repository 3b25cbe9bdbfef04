"""The per-layer contract every report analysis implements.

An analysis is a callable from a :class:`LayerContext` — one layer's heads, its Gram
products, its closure and the validated options — to a :class:`LayerResult`: per-head
columns in head order, per-layer values, optional long tables (e.g. the algebra's
pairs), and a reason for every NaN it produces. The report loop
(:func:`tl_idempotence.report.report.idempotence_report`) runs the enabled analyses of
:func:`tl_idempotence.analyses.registry.report_analyses` on every layer and concatenates
their results; adding an analysis does not touch the loop. What an analysis is called, the option that switches it
on, the head columns it writes and its summary record are declared beside it, torch-free
(:class:`~tl_idempotence.analyses.spec.AnalysisSpec` in ``analyses/<name>_spec.py``), and so are its outputs that
depend on the P threshold (``threshold_rules``, :mod:`tl_idempotence.analyses.threshold`): ``run`` computes them
through those rules' kernels, and a report at another threshold derives them with the rules alone
(:func:`~tl_idempotence.analyses.threshold.derive_at_threshold`); an analysis has no method of its own for that.

Rules every analysis keeps (checked by one parametrized contract test):

* one entry per query head, in head order, in every per-head column;
* deterministic for ``(seed, layer)``: randomness comes from :meth:`LayerContext.generator`
  (per layer) or :meth:`LayerContext.head_generator` (per head, so a head's numbers depend only
  on ``(seed, layer, head)``);
* independent of which other layers ran (a context holds one layer only);
* every NaN it writes has a reason: per head in its ``reason_column`` (or the closure's
  ``reason``), per layer in ``LayerResult.notes`` under the value's key.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

import numpy as np
import torch

from ..core.factors import principal_factors
from ..core.heads import LayerHeads
from ..core.option_specs import GeneralOptions
from ..core.random import head_generator, layer_generator
from ..maths.closure import CastBuffer, Closure, Grams, closure_from_grams, layer_grams

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

__all__ = ["Analysis", "LayerContext", "LayerResult"]


@dataclass
class LayerContext:
    """Everything an analysis may use about one layer (and nothing about any other).

    Attributes:
        heads: the layer's :class:`~tl_idempotence.core.heads.LayerHeads` (column form).
        grams: its Gram products (``[n_heads]``, CPU float64; maybe power-of-two rescaled).
        closure: its :class:`~tl_idempotence.maths.closure.Closure` without factors.
        options: the validated options: a report's
            :class:`~tl_idempotence.analyses.report_options.ReportOptions`, or the report's own options alone
            (:class:`~tl_idempotence.core.option_specs.GeneralOptions`) for an entry point without a report. The
            report's own are typed attributes (``options.threshold``); an analysis reads its own by name
            (``options["nulls"]``).
    """

    heads: LayerHeads
    grams: Grams
    closure: Closure
    options: GeneralOptions
    _cache: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def build(cls, heads: LayerHeads, options: GeneralOptions, buffer: CastBuffer | None = None) -> LayerContext:
        """Compute the layer's Gram products (on ``options.device``) and closure once (``buffer``: memory reused
        across a loop's layers for the cast of O, :class:`~tl_idempotence.maths.closure.CastBuffer`)."""
        g = layer_grams(
            heads.O,
            heads.V,
            heads.kv_head_of,
            compute_dtype=options.compute_dtype,
            device=options.device,
            buffer=buffer,
        )
        return cls(heads=heads, grams=g, closure=closure_from_grams(g), options=options)

    @property
    def layer(self) -> int:
        """The layer's index in the model."""
        return self.heads.layer

    @property
    def n_heads(self) -> int:
        """Query heads of the layer."""
        return self.heads.n_heads

    @property
    def device(self) -> torch.device:
        """Where the batched products run (``options.device``)."""
        return self.options.device

    def principal(self, principal_K: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """``principal_factors(G_O, G_V, M, rtol, principal_K)`` computed once per flag: ``(K, D, rank_O, rank_V)``,
        K in the Grams' units (see :func:`~tl_idempotence.core.factors.principal_factors`)."""
        key = f"principal_{principal_K}"
        if key not in self._cache:
            g = self.grams
            self._cache[key] = principal_factors(g.G_O, g.G_V, g.M, self.closure.rtol, principal_K=principal_K)
        return self._cache[key]

    def generator(self, tag: str, *extra: int) -> torch.Generator:
        """The seeded generator of stream ``tag`` for this layer (``(seed, layer, tag, *extra)``)."""
        return layer_generator(self.options.seed, self.layer, tag, *extra)

    def head_generator(self, tag: str, head: int, *extra: int) -> torch.Generator:
        """The seeded generator of stream ``tag`` for one head of this layer (``(seed, layer, head, tag, *extra)``):
        a head's draws never depend on which other heads ran (:func:`~tl_idempotence.core.random.head_generator`)."""
        return head_generator(self.options.seed, self.layer, head, tag, *extra)


@dataclass
class LayerResult:
    """What an analysis returns for one layer.

    Attributes:
        columns: per-head columns, each a 1-D array of length ``n_heads`` in head order.
        values: per-layer values (JSON scalars or short lists).
        tables: named long tables (DataFrames with a ``layer`` column), concatenated over layers.
        notes: for every NaN in ``values``, the reason, under the same key.
    """

    columns: dict[str, np.ndarray] = field(default_factory=dict)
    values: dict[str, Any] = field(default_factory=dict)
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)


@runtime_checkable
class Analysis(Protocol):
    """A report analysis (module docstring).

    Attributes:
        name: short name (``"scramble"``).
        reason_column: the per-head column that explains this analysis's NaNs, or None when
            the closure's ``reason`` does.
    """

    name: ClassVar[str]
    reason_column: ClassVar[str | None]

    def enabled(self, options: GeneralOptions) -> bool:
        """Whether the options ask for this analysis (a report's options: it reads its own, ``options["name"]``)."""
        ...

    def run(self, ctx: LayerContext) -> LayerResult:
        """The analysis of one layer."""
        ...

    def summarize(
        self, heads: pd.DataFrame, layers: pd.DataFrame, tables: dict[str, pd.DataFrame], options: GeneralOptions
    ) -> dict[str, Any]:
        """Model-level headline numbers from the concatenated per-layer results (JSON values)."""
        ...


def nan_median(a: Any) -> float:
    """Median of the finite entries of ``a`` (any shape, flattened; NaN when there is none; same units as ``a``)."""
    x = np.asarray(a, dtype=float)
    x = x[np.isfinite(x)]
    return float(np.median(x)) if x.size else float("nan")


def nan_max(a: Any) -> float:
    """Max of the finite entries of ``a`` (any shape, flattened; NaN when there is none; same units as ``a``)."""
    x = np.asarray(a, dtype=float)
    x = x[np.isfinite(x)]
    return float(x.max()) if x.size else float("nan")
