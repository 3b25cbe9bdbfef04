"""The result of an ablation: its tables and summary from the summed losses, and the :class:`Ablation` type.

:class:`Losses` turns the passes' summed losses (:func:`~tl_idempotence.probes.ablation.passes.set_losses`) into
mean losses; :func:`ablation_tables` lays them out per head, per control set and per window;
:func:`ablation_summary` adds the statistics (:mod:`tl_idempotence.probes.ablation.stats`) and a note for every
NaN and caveat. Definitions: the :mod:`tl_idempotence.probes.ablation` package docstring.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, TypeVar, overload

import numpy as np
import pandas as pd

from ...core.heads import ModelInfo
from ...core.options import strict_kwargs
from ...core.selection import head_label, head_labels
from ...core.stored import StoredResult, StoreSpec
from ...core.tables import FrozenSummary
from ...views.results import DrawnResult
from .controls import SetPlan, set_labels
from .stats import BOOTSTRAP_DRAWS, bootstrap_intervals, rank_p_value

__all__ = [
    "ABLATION_FORMAT",
    "ABLATION_FREE_FIELDS",
    "ABLATION_RECORD",
    "Ablation",
    "AblationSummary",
    "Losses",
    "ablation_summary",
    "ablation_tables",
    "set_names",
    "window_sums_table",
]

#: The record format of a saved ablation (:mod:`tl_idempotence.probes.ablation.store`) and its file name.
ABLATION_FORMAT = "tl_idempotence.ablation/1"
ABLATION_RECORD = "ablation.json"
#: The record fields of a saved ablation that nothing in the save derives or restates (``StoreSpec.free_fields``):
#: the run's provenance and the model's sizes no number depends on. Every other field is recomputed or checked by
#: :func:`~tl_idempotence.probes.ablation.store.load_ablation`.
ABLATION_FREE_FIELDS = (
    ("summary.seconds", "the run's wall time: provenance"),
    ("summary.threads", "the torch threads the passes ran on: provenance (numbers agree across thread counts)"),
    ("summary.threads_seconds_per_set", "the timings that chose the thread count: provenance"),
    (
        "summary.check_max_abs_diff",
        "the run's own check (the empty head set against the clean pass, whose losses are not kept); the note it "
        "gives against the tolerance is recomputed",
    ),
    ("options.seq_len", "the window length asked for (the window sums hold the windows as run; checked to fit)"),
    ("options.max_tokens", "the token budget asked for (the window sums hold what was run)"),
    ("options.batch_size", "a performance setting: head sets per forward pass; numbers agree across values"),
    ("options.corpus", "the name of the text given, recorded once"),
    ("info.n_layers", "the model's layer count, recorded once (the heads' layers are checked to lie within it)"),
    ("info.d_model", "the model's width, recorded once: no number of an ablation depends on it"),
    ("info.d_head", "the model's head size, recorded once: no number of an ablation depends on it"),
    ("info.model_class", "the model's class, recorded once (the summary does not restate it)"),
    ("info.processing", "the weights' processing, recorded once (the summary does not restate it)"),
    ("info.extra", "free-form notes of the model's source"),
)

_T = TypeVar("_T")


class _SummaryValue(Generic[_T]):
    """A read-only attribute of a result read from its ``summary`` under the attribute's own name (one source),
    converted by ``convert`` (``float``, ``int``); on the class, the descriptor itself."""

    def __init__(self, convert: Callable[[Any], _T]) -> None:
        self.convert = convert
        self.key = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.key = name

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> _SummaryValue[_T]: ...

    @overload
    def __get__(self, obj: object, owner: type | None = None) -> _T: ...

    def __get__(self, obj: object | None, owner: type | None = None) -> _T | _SummaryValue[_T]:
        if obj is None:
            return self
        return self.convert(obj.summary[self.key])  # type: ignore[attr-defined]

    def __set__(self, obj: object, value: Any) -> None:
        raise AttributeError(f"{self.key} is read from summary[{self.key!r}]; it cannot be set")


class AblationSummary(FrozenSummary):
    """The summary of :class:`Ablation` (typed, read-only; a mapping of the fields given, in the order
    :func:`ablation_summary` writes them; ``controls_warning`` and ``note`` only where they apply, else None)."""

    __slots__ = ()
    delta_loss: float
    control_delta_median: float
    p_value: float
    p_value_floor: float
    n_controls: int
    n_controls_requested: int
    n_distinct_controls: int
    controls_exhaustive: bool
    controls_warning: str | None
    n_controls_at_least: int
    excess_over_controls: float
    delta_loss_ci_low: float
    delta_loss_ci_high: float
    excess_ci_low: float
    excess_ci_high: float
    loss_clean: float
    loss_ablated: float
    control_delta_mean: float
    control_delta_q05: float
    control_delta_q95: float
    control_delta_max: float
    model_name: str
    kind: str
    n_heads: int
    layers: Sequence[int]
    n_windows: int
    n_tokens: int
    sum_delta_single: float
    control_rule: str
    ci_method: str
    batching: str
    threads: int
    threads_seconds_per_set: Mapping[str, float]
    check_max_abs_diff: float
    seconds: float
    note: str | None


@dataclass(repr=False)
class Ablation(StoredResult, DrawnResult):
    """Result of :func:`ablation`.

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

    heads: pd.DataFrame
    controls: pd.DataFrame
    summary: AblationSummary
    info: ModelInfo
    options: dict[str, Any] = field(default_factory=dict)
    window_losses: pd.DataFrame = field(default_factory=pd.DataFrame)
    window_sums: pd.DataFrame = field(default_factory=pd.DataFrame)
    run_info: Mapping[str, Any] = field(default_factory=dict)

    display_kind: ClassVar[str] = "ablation"
    store: ClassVar[StoreSpec] = StoreSpec(
        name="ablation", record=ABLATION_RECORD, formats=(ABLATION_FORMAT,), free_fields=ABLATION_FREE_FIELDS
    )
    repr_keys: ClassVar[tuple[str, ...]] = (
        "delta_loss",
        "control_delta_median",
        "p_value",
        "n_controls",
        "n_heads",
        "kind",
        "n_tokens",
        "loss_clean",
    )

    def __post_init__(self) -> None:
        if not isinstance(self.summary, AblationSummary):  # typed and read-only, whatever mapping was given
            self.summary = AblationSummary(self.summary)

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

    @strict_kwargs
    def save(self, path: Any, overwrite: bool = False) -> str:
        """Save to the folder ``path`` (:func:`~tl_idempotence.probes.ablation.store.save_ablation`: parquet tables
        and one JSON record; no pickle); :meth:`load` reads it back.

        Raises:
            OptionTypeError, OptionError, OutputOverInputError: as :func:`~tl_idempotence.probes.ablation.store.
                save_ablation`.
        """
        from .store import save_ablation

        return save_ablation(self, path, overwrite=overwrite)

    @classmethod
    def load(cls, path: Any) -> Ablation:
        """:func:`~tl_idempotence.probes.ablation.store.load_ablation`: a folder :meth:`save` wrote, checked."""
        from .store import load_ablation

        return load_ablation(path)


@dataclass(frozen=True)
class Losses:
    """The summed next-token losses of one ablation run and the mean losses they give (nats per counted target).

    Attributes:
        clean: ``[windows]`` summed clean losses. sums: ``[sets, windows]`` summed losses of every set.
        n_tok: ``[windows]`` counted targets. n_total: their sum. loss_clean: the clean mean loss.
        set_loss: ``[sets]`` mean loss of every set. loss_flagged: the flagged set's. ctrl_loss: ``[controls]``.
        delta: flagged minus clean. cd: ``[controls]`` every control minus clean.
    """

    clean: np.ndarray
    sums: np.ndarray
    n_tok: np.ndarray
    n_total: float
    loss_clean: float
    set_loss: np.ndarray
    loss_flagged: float
    ctrl_loss: np.ndarray
    delta: float
    cd: np.ndarray

    @staticmethod
    def of(clean: np.ndarray, sums: np.ndarray, n_tok: np.ndarray, n_controls: int) -> Losses:
        """The mean losses of :func:`~tl_idempotence.probes.ablation.passes.set_losses`' sums (the flagged set
        first, then ``n_controls`` controls; nats per counted target)."""
        n_total = float(n_tok.sum())
        loss_clean = float(clean.sum() / n_total)
        set_loss = sums.sum(1) / n_total
        loss_flagged = float(set_loss[0])
        ctrl_loss = set_loss[1 : 1 + n_controls]
        return Losses(
            clean=clean,
            sums=sums,
            n_tok=n_tok,
            n_total=n_total,
            loss_clean=loss_clean,
            set_loss=set_loss,
            loss_flagged=loss_flagged,
            ctrl_loss=ctrl_loss,
            delta=loss_flagged - loss_clean,
            cd=ctrl_loss - loss_clean,
        )


def ablation_tables(
    plan: SetPlan, L: Losses, kv_of: Any, singles: bool
) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """The ablation's ``heads`` (each head alone, with ``singles``), ``controls`` and ``window_losses`` tables.

    Args:
        plan: the head sets run; L: their losses; kv_of: ``[n_heads]`` the kv head of each query head
            (:func:`~tl_idempotence.core.heads.kv_layout`); singles: whether each head was ablated alone.

    Returns:
        ``(heads, controls, window_losses)``, the columns :class:`Ablation` documents.

    Raises:
        Nothing of its own.
    """
    pairs, n_controls = plan.pairs, plan.n_controls
    labels = [head_label(layer, h) for layer, h in pairs]
    single_loss = L.set_loss[1 + n_controls :] if singles else np.full(len(pairs), np.nan)
    heads_df = pd.DataFrame(
        {
            "layer": [p[0] for p in pairs],
            "head": [p[1] for p in pairs],
            "kv_head": [int(kv_of[h]) for _, h in pairs],
            "loss_ablated": single_loss.astype(float),
            "delta_loss": (single_loss - L.loss_clean).astype(float),
            "reason": ["" if singles else "not ablated alone (singles=False)"] * len(pairs),
        },
        index=head_labels([p[0] for p in pairs], [p[1] for p in pairs]),
    )
    flagged_pairs = set(pairs)
    ctrl_df = pd.DataFrame(
        {
            "control": np.arange(n_controls, dtype=np.int64),
            "heads": [set_labels(s) for s in plan.controls],
            "n_flagged_in_set": np.array(
                [sum((layer, h) in flagged_pairs for layer, hs in s.items() for h in hs) for s in plan.controls],
                dtype=np.int64,
            ),
            "loss_ablated": L.ctrl_loss.astype(float),
            "delta_loss": L.cd.astype(float),
        },
        columns=["control", "heads", "n_flagged_in_set", "loss_ablated", "delta_loss"],
    )
    names = ["flagged", *[f"control {c}" for c in range(n_controls)], *(labels if singles else [])]
    with np.errstate(invalid="ignore", divide="ignore"):
        per_window = np.vstack([L.clean, L.sums]) / L.n_tok[None, :]
    win_df = pd.DataFrame(per_window.T, columns=["clean", *names])
    win_df.insert(0, "n_tokens", L.n_tok)
    win_df.index.name = "window"
    return heads_df, ctrl_df, win_df


def set_names(plan: SetPlan) -> list[str]:
    """The head sets' column names in ``window_losses`` and ``window_sums``, in the order of their losses:
    ``flagged``, ``control 0..n-1`` and, with singles, each head's label. Raises nothing."""
    labels = [head_label(layer, h) for layer, h in plan.pairs] if plan.singles else []
    return ["flagged", *[f"control {c}" for c in range(plan.n_controls)], *labels]


def window_sums_table(plan: SetPlan, L: Losses) -> pd.DataFrame:
    """The ablation's ``window_sums``: one row per text window, ``n_tokens`` (counted targets) and the summed loss
    (nats) of ``clean`` and of every head set (:func:`set_names`): ``window_losses``' columns, before the division
    by ``n_tokens``. Raises nothing of its own."""
    sums_df = pd.DataFrame(np.vstack([L.clean, L.sums]).T, columns=["clean", *set_names(plan)])
    sums_df.insert(0, "n_tokens", L.n_tok)
    sums_df.index.name = "window"
    return sums_df


def _effect(plan: SetPlan, L: Losses, seed: int) -> tuple[dict[str, Any], int, int]:
    """The flagged set's effect against its controls: the summary's entries ``delta_loss`` to ``control_delta_max``,
    in order (:func:`rank_p_value`, :func:`bootstrap_intervals` over the windows with a counted target), the
    bootstrap's block length ``ℓ`` (0 when not run) and the number of windows it resampled."""
    n_controls, n_requested, n_distinct = plan.n_controls, plan.n_requested, plan.n_distinct
    cd, delta = L.cd, L.delta
    p_value, p_floor, n_at_least = rank_p_value(delta, cd)
    nan = float("nan")
    has = L.n_tok > 0  # a window without a counted target adds nothing to any loss
    n_resampled = int(has.sum())
    ci, ell = (
        bootstrap_intervals(L.clean[has], L.sums[0][has], L.sums[1 : 1 + n_controls][:, has], L.n_tok[has], seed)
        if n_resampled > 1
        else ({}, 0)
    )
    effect: dict[str, Any] = {
        "delta_loss": delta,
        "control_delta_median": float(np.median(cd)) if cd.size else nan,
        "p_value": p_value,
        "p_value_floor": p_floor,
        "n_controls": n_controls,
        "n_controls_requested": n_requested,
        "n_distinct_controls": n_distinct,
        "controls_exhaustive": bool(n_controls) and n_controls == n_distinct,
        **({"controls_warning": plan.warning} if plan.warning else {}),
        "n_controls_at_least": n_at_least,
        "excess_over_controls": delta - float(np.median(cd)) if cd.size else nan,
        "delta_loss_ci_low": ci.get("delta_loss_ci_low", nan),
        "delta_loss_ci_high": ci.get("delta_loss_ci_high", nan),
        "excess_ci_low": ci.get("excess_ci_low", nan),
        "excess_ci_high": ci.get("excess_ci_high", nan),
        "loss_clean": L.loss_clean,
        "loss_ablated": L.loss_flagged,
        "control_delta_mean": float(cd.mean()) if cd.size else nan,
        "control_delta_q05": float(np.quantile(cd, 0.05)) if cd.size else nan,
        "control_delta_q95": float(np.quantile(cd, 0.95)) if cd.size else nan,
        "control_delta_max": float(cd.max()) if cd.size else nan,
    }
    return effect, ell, n_resampled


def _control_rule(plan: SetPlan) -> str:
    """How the controls were drawn (the summary's ``control_rule``), with the layers that drew from all heads."""
    n_controls, n_distinct = plan.n_controls, plan.n_distinct
    rule = (
        "same number of heads per layer, drawn from the layer's non-flagged heads; distinct sets, never the "
        "flagged set" + ("; all of them" if bool(n_controls) and n_controls == n_distinct else "")
    )
    if plan.fallback:
        rule += (
            f"; layers {plan.fallback} have fewer non-flagged than flagged heads, so their draws come from all heads"
        )
    return rule


def _notes(plan: SetPlan, run: dict[str, Any], n_resampled: int) -> list[str]:
    """A note for every NaN of the summary and every caveat of the run (the summary's ``note``, joined by ``; ``)."""
    n_controls, n_requested, n_distinct = plan.n_controls, plan.n_requested, plan.n_distinct
    notes = []
    if not n_controls:
        notes.append("p_value and excess_over_controls are NaN: no control set was drawn (n_controls=0)")
    if plan.warning:
        notes.append(plan.warning)
    if n_controls < n_requested:
        notes.append(
            f"{n_requested} controls were asked for, but only {n_distinct} distinct matched sets exist: all of them "
            f"were used once (the p-value's floor is 1/{n_controls + 1})"
        )
    if n_resampled < 2:
        notes.append("the 95% intervals are NaN: one text window cannot be resampled (give more text)")
    if not plan.singles:
        notes.append("heads.delta_loss is NaN: each head alone is ablated with singles=True")
    if plan.fallback:
        notes.append(f"controls in layers {plan.fallback} may contain flagged heads (see controls.n_flagged_in_set)")
    if run["fallback_window"] is not None:
        notes.append(
            f"from window {run['fallback_window']} on, the model refused the repeated residual stream (or its empty "
            "set disagreed with the clean pass): those windows were repeated at the input"
        )
    if run["check_max_abs_diff"] > run["check_tolerance"]:
        notes.append(
            f"the empty head set differs from the clean pass by {run['check_max_abs_diff']:.3g} nats/token "
            f"(> {run['check_tolerance']:g}): compare with batch_size=1"
        )
    return notes


def ablation_summary(
    plan: SetPlan,
    L: Losses,
    run: dict[str, Any],
    heads_df: pd.DataFrame,
    seed: int,
    kind: str,
    model_name: str,
    n_windows: int,
) -> dict[str, Any]:
    """The ablation's statistics (:func:`rank_p_value`, :func:`bootstrap_intervals`) and its summary, with a
    ``note`` for every NaN and every caveat of the run.

    Args:
        plan: the head sets run; L: their losses; run: the passes' record (``batching``, ``fallback_window``,
            ``threads``, ``threads_seconds_per_set``, ``check_max_abs_diff``, ``check_tolerance``, ``seconds``);
            heads_df: the ``heads`` table (:func:`ablation_tables`); seed: the bootstrap's seed; kind, model_name,
            n_windows: recorded as they are.

    Returns:
        The summary, its keys in the order :class:`Ablation` documents (``note`` last, when there is one).

    Raises:
        OptionError: a bad seed (from the bootstrap's generator).
    """
    effect, ell, n_resampled = _effect(plan, L, seed)
    summary: dict[str, Any] = {
        **effect,
        "model_name": model_name,
        "kind": kind,
        "n_heads": len(plan.pairs),
        "layers": plan.layers,
        "n_windows": n_windows,
        "n_tokens": int(L.n_total),
        "sum_delta_single": float(heads_df["delta_loss"].sum()) if plan.singles else float("nan"),
        "control_rule": _control_rule(plan),
        "ci_method": (
            f"percentile bootstrap, {BOOTSTRAP_DRAWS} draws: text windows resampled in moving blocks of {ell} "
            "consecutive windows (the excess also resamples the control sets); seeded"
        ),
        "batching": run["batching"],
        "threads": run["threads"],
        "threads_seconds_per_set": run["threads_seconds_per_set"],
        "check_max_abs_diff": run["check_max_abs_diff"],
        "seconds": run["seconds"],
    }
    notes = _notes(plan, run, n_resampled)
    if notes:
        summary["note"] = "; ".join(notes)
    return summary
