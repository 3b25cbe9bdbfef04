"""Everything a report says that depends on the P threshold, derived by one function from declared rules.

An analysis's threshold-dependent outputs (the closure's ``closed`` and ``n_closed``, the search's ``feasible`` and
``n_heads_feasible``, the mismatch's ``n_mismatch_closed``, the scramble's ``frac_scrambled_closed``, the algebra's
closed flags and closed-pair ranges) are declared beside it, in its :class:`~tl_idempotence.analyses.spec.
AnalysisSpec` (``threshold_rules``), as rules of this module:

* :class:`Flag`: a column ``source >= t`` of a frame (NaN is not closed: :func:`closed_flags`);
* :class:`CountPerLayer`: a layer value, the number of rows of a frame (the heads or a long table) per layer with
  ``source >= t``;
* :class:`FractionPerHead`: a head column, the fraction of a long table's defined rows (finite ``source``) of
  that head with ``source >= t`` (NaN for a head without a defined row);
* :class:`FunctionRule`: a function ``(heads, layers, tables, t) -> (heads, layers, tables)`` (the algebra's).

:func:`derive_at_threshold` applies rules to a report's frames and returns new frames (its inputs are never
changed): the report's :meth:`~tl_idempotence.report.report.IdempotenceReport.with_threshold` uses it, and an
analysis's ``run`` computes the same outputs for its layer with the kernels the rules apply (:func:`closed_flags`,
:func:`count_closed`, :func:`fractions_closed`), so each number has one code path. An analysis's module calls the
kernels, not its declared rules: the declaration (``<name>_spec.py``) imports the analysis's class, so the class does
not import it back (no import cycle, ``tests/unit/test_layering.py``). The analyses' contract test checks that the
rules applied at ``t`` to a run at another threshold give a run at ``t``.

Imports no torch, numpy or pandas at import (the analyses' declarations, and so the CLI's ``--help``, read it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np
    import pandas as pd

    #: The frames a rule reads and writes: the per-head table, the per-layer table and the long tables by name.
    Frames = tuple[pd.DataFrame, pd.DataFrame, dict[str, pd.DataFrame]]

__all__ = [
    "CountPerLayer",
    "Flag",
    "FractionPerHead",
    "FunctionRule",
    "ThresholdRule",
    "closed_flags",
    "count_closed",
    "derive_at_threshold",
    "fractions_closed",
]


def closed_flags(P: Any, threshold: float) -> np.ndarray:
    """``P >= threshold`` with NaN counted as not closed (SPEC 2): a bool array of ``P``'s shape.

    Args:
        P: squared closure alignments (any shape, dimensionless in [0, 1] or NaN).
        threshold: the P threshold (already validated, in [0, 1]).
    """
    import numpy as np

    return np.nan_to_num(np.asarray(P, dtype=float), nan=-1.0) >= threshold


def count_closed(P: Any, threshold: float) -> int:
    """How many of ``P`` (any shape) are ``>= threshold`` (NaN not counted): :class:`CountPerLayer`'s kernel."""
    return int(closed_flags(P, threshold).sum())


def fractions_closed(table: pd.DataFrame, source: str, layer: Any, head: Any, threshold: float) -> np.ndarray:
    """Per ``(layer[i], head[i])``, the fraction of its defined rows of the long table ``table`` (finite ``source``,
    a P column) with ``source >= threshold``: ``[n]`` float64, NaN for a head without a defined row (0 of 0 is not
    "never closed"). :class:`FractionPerHead`'s kernel."""
    import numpy as np
    import pandas as pd

    P = table[source].to_numpy(dtype=float)
    ok = np.isfinite(P)
    hits = pd.DataFrame({"layer": table["layer"], "head": table["head"], "hit": ok & closed_flags(P, threshold)})
    g = hits.assign(ok=ok).groupby(["layer", "head"])[["hit", "ok"]].sum()
    frac = (g["hit"] / g["ok"].clip(lower=1)).where(g["ok"] > 0)
    return frac.reindex(pd.MultiIndex.from_arrays([np.asarray(layer), np.asarray(head)])).to_numpy(dtype=float)


def _frame(heads: pd.DataFrame, layers: pd.DataFrame, tables: Mapping[str, pd.DataFrame], name: str) -> Any:
    """The frame a rule names: ``"heads"``, ``"layers"`` or a long table (None when the report has no such table)."""
    if name == "heads":
        return heads
    if name == "layers":
        return layers
    return tables.get(name)


def _put(frames: Frames, name: str, frame: pd.DataFrame) -> Frames:
    """``frames`` with the frame called ``name`` replaced (the others, and the tables dict given, kept)."""
    heads, layers, tables = frames
    if name == "heads":
        return frame, layers, tables
    if name == "layers":
        return heads, frame, tables
    return heads, layers, {**tables, name: frame}


@dataclass(frozen=True)
class Flag:
    """``frame[column] = source >= t`` (NaN: False; :func:`closed_flags`).

    Attributes:
        column: the flag column written. source: the P column it reads (dimensionless, NaN allowed).
        frame: ``"heads"``, ``"layers"`` or a long table's name (a report without that table: nothing to do).
    """

    column: str
    source: str
    frame: str = "heads"

    def flags(self, source: Any, threshold: float) -> np.ndarray:
        """The kernel: ``[n]`` bool flags of ``source`` values (any shape) at ``threshold``."""
        return closed_flags(source, threshold)

    def apply(self, heads: pd.DataFrame, layers: pd.DataFrame, tables: dict[str, pd.DataFrame], t: float) -> Frames:
        """The frames with the flag at ``t`` (new frames; the inputs are not changed)."""
        f = _frame(heads, layers, tables, self.frame)
        if f is None:
            return heads, layers, tables
        return _put((heads, layers, tables), self.frame, f.assign(**{self.column: self.flags(f[self.source], t)}))


@dataclass(frozen=True)
class CountPerLayer:
    """``layers[column]`` = the rows of ``over`` in that layer with ``source >= t`` (NaN not counted; 0 for a layer
    without a row).

    Attributes:
        column: the layer value written (an int). source: the P column it counts.
        over: ``"heads"`` or a long table's name (a report without that table: nothing to do).
    """

    column: str
    source: str
    over: str = "heads"

    def count(self, source: Any, threshold: float) -> int:
        """The kernel for one layer: how many ``source`` values are ``>= threshold`` (:func:`count_closed`)."""
        return count_closed(source, threshold)

    def apply(self, heads: pd.DataFrame, layers: pd.DataFrame, tables: dict[str, pd.DataFrame], t: float) -> Frames:
        """The frames with the count at ``t`` (a new layers frame; the inputs are not changed)."""
        f = _frame(heads, layers, tables, self.over)
        if f is None:
            return heads, layers, tables
        per_layer = f.groupby(f["layer"])[self.source].agg(lambda s: self.count(s.to_numpy(dtype=float), t))
        counts = layers["layer"].map(per_layer).fillna(0).astype(int).to_numpy()
        return heads, layers.assign(**{self.column: counts}), tables


@dataclass(frozen=True)
class FractionPerHead:
    """``heads[column]`` = per head, the fraction of its defined rows of the long table ``table`` (finite
    ``source``) with ``source >= t``: a float in [0, 1], NaN for a head without a defined row (0 of 0 is not
    "never closed"; the analysis's reason column says why).

    Attributes:
        column: the head column written. table: the long table (``layer``, ``head`` and ``source`` columns).
        source: its P column.
    """

    column: str
    table: str
    source: str = "P"

    def fractions(self, table: pd.DataFrame, layer: Any, head: Any, threshold: float) -> np.ndarray:
        """The kernel: the fraction of each ``(layer[i], head[i])``'s defined rows of ``table`` at ``threshold``
        (``[n]`` float64; NaN for a head without a defined row; :func:`fractions_closed`)."""
        return fractions_closed(table, self.source, layer, head, threshold)

    def apply(self, heads: pd.DataFrame, layers: pd.DataFrame, tables: dict[str, pd.DataFrame], t: float) -> Frames:
        """The frames with the fraction at ``t`` (a new heads frame; the inputs are not changed). A report without
        the table, or with an empty one, keeps the column as it is."""
        d = tables.get(self.table)
        if d is None or not len(d):
            return heads, layers, tables
        return heads.assign(**{self.column: self.fractions(d, heads["layer"], heads["head"], t)}), layers, tables


@dataclass(frozen=True)
class FunctionRule:
    """A rule written as a function ``(heads, layers, tables, t) -> (heads, layers, tables)`` that returns new frames
    and never changes its inputs (the algebra's closed flags and closed-pair ranges).

    Attributes:
        function: the function (in a torch-free declaration, a small function that imports the real one when
            called).
    """

    function: Callable[[pd.DataFrame, pd.DataFrame, dict[str, pd.DataFrame], float], Frames]

    def apply(self, heads: pd.DataFrame, layers: pd.DataFrame, tables: dict[str, pd.DataFrame], t: float) -> Frames:
        """The frames the function gives at ``t``."""
        return self.function(heads, layers, tables, t)


#: One threshold rule of an analysis's declaration.
ThresholdRule = Flag | CountPerLayer | FractionPerHead | FunctionRule


def derive_at_threshold(
    heads: pd.DataFrame,
    layers: pd.DataFrame,
    tables: Mapping[str, pd.DataFrame],
    rules: Sequence[ThresholdRule],
    threshold: float,
) -> Frames:
    """Every threshold-dependent column, layer value and table entry the ``rules`` declare, at ``threshold``.

    Args:
        heads: the per-head table (all layers; ``layer``, ``head`` and the analyses' columns).
        layers: the per-layer table (``layer`` and the analyses' values).
        tables: the long tables by name (e.g. ``scramble_draws``, ``mismatch_pairs``, ``algebra_*``).
        rules: the rules of the analyses that ran, in registry order (:func:`~tl_idempotence.analyses.registry.
            threshold_rules`).
        threshold: the P threshold, already validated (in [0, 1]).

    Returns:
        ``(heads, layers, tables)``: new frames (a frame no rule changes is the one given; the tables dict is new).
        The inputs are never changed.
    """
    frames: Frames = (heads, layers, dict(tables))
    for r in rules:
        frames = r.apply(*frames, threshold)
    return frames
