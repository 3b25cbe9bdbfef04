"""An ablation's tables and summary from its summed losses (what :func:`~tl_idempotence.probes.ablation.ablation`
computes and what :func:`~tl_idempotence.probes.ablation.store.load_ablation` recomputes from a save).

:class:`Losses` turns the passes' summed losses (:func:`~tl_idempotence.probes.ablation.passes.set_losses`) into
mean losses; :func:`ablation_tables` lays them out per head, per control set and per window;
:func:`ablation_summary` adds the statistics (:mod:`tl_idempotence.probes.ablation.stats`) and a note for every
NaN and caveat; :class:`AblationSummary` is the summary's typed record. Definitions: the
:mod:`tl_idempotence.probes.ablation` package docstring.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import pandas as pd

from ...core.frozen import NamedValue
from ...core.selection import head_label, head_labels
from ...core.tables import FrozenSummary
from .controls import SetPlan, set_labels
from .stats import BOOTSTRAP_DRAWS, bootstrap_intervals, rank_p_value

__all__ = [
    "AblationSummary",
    "Losses",
    "SummaryValue",
    "ablation_summary",
    "ablation_tables",
    "set_names",
    "window_sums_table",
]

_T = TypeVar("_T")


class SummaryValue(NamedValue[_T]):
    """A read-only attribute of a result read from its ``summary`` under the attribute's own name (one source),
    converted by ``convert`` (``float``, ``int``); on the class, the descriptor itself."""

    def __init__(self, convert: Callable[[Any], _T]) -> None:
        super().__init__(lambda obj, key: convert(obj.summary[key]))

    def __set__(self, obj: object, value: Any) -> None:
        raise AttributeError(f"{self.name} is read from summary[{self.name!r}]; it cannot be set")


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
