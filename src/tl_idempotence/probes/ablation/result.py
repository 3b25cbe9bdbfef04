"""The result of an ablation: the :class:`Ablation` type (its tables and summary are made by
:mod:`tl_idempotence.probes.ablation.tables`, saved and read back by :mod:`tl_idempotence.probes.ablation.store`).
Definitions: the :mod:`tl_idempotence.probes.ablation` package docstring.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import pandas as pd

from ...core.heads import ModelInfo
from ...core.stored import StoredResult, StoreSpec, loads
from ...core.tables import ImmutableResult
from ...views.results import DrawnResult
from .store import ABLATION_FORMAT, ABLATION_FREE_FIELDS, ABLATION_RECORD, ABLATION_STORE, read_ablation
from .tables import (
    AblationSummary,
    Losses,
    ablation_summary,
    ablation_tables,
    set_names,
    window_sums_table,
)
from .tables import SummaryValue as _SummaryValue

__all__ = [
    "ABLATION_FORMAT",
    "ABLATION_FREE_FIELDS",
    "ABLATION_RECORD",
    "Ablation",
    "AblationSummary",
    "Losses",
    "ablation_summary",
    "ablation_tables",
    "load_ablation",
    "set_names",
    "window_sums_table",
]


@dataclass(repr=False)
class Ablation(
    StoredResult,
    ImmutableResult,
    DrawnResult,
    repr_keys="delta_loss control_delta_median p_value n_controls n_heads kind n_tokens loss_clean",
    display_kind="ablation",
    frozen=(
        "an ablation result is",
        "rep.ablation(...) or tli.ablation(...) again, dataclasses.replace(...) for a changed copy",
    ),
):
    """Result of :func:`ablation`. Immutable (:class:`~tl_idempotence.core.tables.ImmutableResult`): assigning a
    field raises ``dataclasses.FrozenInstanceError``, its tables are copies made on each read, :attr:`summary` and
    :attr:`options` are read-only.

    Attributes:
        heads: one row per flagged head, indexed by ``"L10H8"`` labels like ``rep.heads`` (joinable by
            index or on ``layer, head``): ``layer, head, kv_head``, ``loss_ablated`` (nats, this head
            alone ablated), ``delta_loss`` (``loss_ablated − loss_clean``), ``reason`` (why they are NaN:
            ``singles=False``; empty when measured).
        controls: one row per matched control set: ``control`` (0..n-1), ``heads`` (labels,
            space-separated), ``n_flagged_in_set``, ``loss_ablated``, ``delta_loss``.
        window_losses: one row per text window: ``n_tokens`` (counted targets), then the mean loss
            (nats) of ``clean``, ``flagged``, ``control 0..n-1`` and, with ``singles``, each head's
            label on that window; a set's loss is ``Σ n_tokens · loss / Σ n_tokens``.
        summary: leads with ``delta_loss`` (the flagged set's Δ, nats per token), ``control_delta_median``,
            ``p_value``; then ``p_value_floor``, ``n_controls`` (the distinct control sets used: the rows of
            ``controls``), ``n_controls_requested``, ``n_distinct_controls`` (how many distinct matched sets
            exist), ``controls_exhaustive`` (every one of them was used), ``controls_warning`` (only when fewer
            than :data:`MIN_CONTROLS_FOR_P_005` exist: ``p <= 0.05`` is impossible), ``n_controls_at_least``
            (controls with Δ ≥ the flagged Δ), ``excess_over_controls`` and the intervals ``delta_loss_ci_low/high``,
            ``excess_ci_low/high``; ``loss_clean, loss_ablated``; ``control_delta_mean, _q05, _q95,
            _max``; ``model_name, kind, n_heads`` (flagged), ``layers``, ``n_windows, n_tokens``
            (counted targets), ``sum_delta_single`` (with ``singles``), ``control_rule``, ``ci_method``,
            ``batching``, ``threads``, ``threads_seconds_per_set``, ``check_max_abs_diff``, ``seconds`` and,
            where it applies, ``note``.
        info: the measured model's :class:`~tl_idempotence.core.heads.ModelInfo`.
        options: the arguments (kind, n_controls, seed, seq_len, max_tokens, batch_size, singles, corpus).
        window_sums: ``window_losses``' columns as summed losses (nats; ``n_tokens`` as is): the exact numbers every
            loss and statistic above is computed from (what :meth:`save` keeps, and :meth:`load` recomputes from).
        run_info: the passes' record (``batching, fallback_window, check_max_abs_diff, check_tolerance, threads,
            threads_seconds_per_set, seconds``; :func:`~tl_idempotence.probes.ablation.passes.set_losses`).

    The headline numbers are also typed attributes, read from ``summary`` (one source): ``delta_loss``,
    ``p_value``, ``p_value_floor``, ``n_controls``, ``n_distinct_controls``, ``n_controls_at_least``,
    ``control_delta_median``, ``excess_over_controls``, ``delta_loss_ci_low/high``, ``excess_ci_low/high``,
    ``loss_clean``, ``loss_ablated``. ``repr`` ends with ``controls_warning`` when there is one.
    """

    store: ClassVar[StoreSpec] = ABLATION_STORE

    heads: pd.DataFrame
    controls: pd.DataFrame
    summary: AblationSummary
    info: ModelInfo
    options: dict[str, Any] = field(default_factory=dict)
    window_losses: pd.DataFrame = field(default_factory=pd.DataFrame)
    window_sums: pd.DataFrame = field(default_factory=pd.DataFrame)
    run_info: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.summary, AblationSummary):  # typed and read-only, whatever mapping was given
            self._freeze(summary=AblationSummary(self.summary))

    def __repr__(self) -> str:
        base = super().__repr__()
        warn = self.summary.get("controls_warning") if isinstance(self.summary, dict) else None
        return f"{base[:-1]}, controls_warning={str(warn)!r})" if warn and base.endswith(")") else base

    delta_loss = _SummaryValue(float)
    """The flagged set's loss change ``loss_ablated − loss_clean`` (nats per counted token)."""
    p_value = _SummaryValue(float)
    """The exact rank p-value of the flagged set among the matched controls (NaN without controls)."""
    p_value_floor = _SummaryValue(float)
    """The smallest p-value possible: ``1 / (n_controls + 1)`` (NaN without controls)."""
    n_controls = _SummaryValue(int)
    """The distinct matched control sets used (at most the number asked for)."""
    n_distinct_controls = _SummaryValue(int)
    """How many distinct matched control sets exist (the flagged set excluded)."""
    n_controls_at_least = _SummaryValue(int)
    """Controls whose Δ is at least the flagged set's."""
    control_delta_median = _SummaryValue(float)
    """The median Δ of the controls (nats per token)."""
    excess_over_controls = _SummaryValue(float)
    """``delta_loss − control_delta_median`` (nats per token)."""
    delta_loss_ci_low = _SummaryValue(float)
    """Lower end of the 95 % bootstrap interval of ``delta_loss``."""
    delta_loss_ci_high = _SummaryValue(float)
    """Upper end of the 95 % bootstrap interval of ``delta_loss``."""
    excess_ci_low = _SummaryValue(float)
    """Lower end of the 95 % bootstrap interval of ``excess_over_controls``."""
    excess_ci_high = _SummaryValue(float)
    """Upper end of the 95 % bootstrap interval of ``excess_over_controls``."""
    loss_clean = _SummaryValue(float)
    """The clean next-token loss (nats per counted token)."""
    loss_ablated = _SummaryValue(float)
    """The next-token loss with the flagged set ablated (nats per counted token)."""


@loads("ablation")
def load_ablation(path: Any) -> Ablation:
    """Read back what :meth:`Ablation.save` wrote, checking every digest and recomputing from the window sums what
    the record and the other tables state (:func:`~tl_idempotence.probes.ablation.store.read_ablation`).

    Returns:
        The :class:`Ablation` (equal tables and summary; ``loaded_from`` the folder, which its ``save`` refuses to
        write over).

    Raises:
        MissingFileError: no such folder, no ``ablation.json``, a listed table missing (names it).
        ReportFileError: another format; an edited record (digest) or table (sha256), each named; a table, an
            option or a summary field that is not what the window sums, the options and the info give (names the
            file and the field).
        OptionTypeError: ``path`` is not a path.
    """
    kwargs, folder = read_ablation(path)
    result = Ablation(**kwargs)
    object.__setattr__(result, "loaded_from", folder)  # set once by its loader (a frozen result allows it)
    return result
