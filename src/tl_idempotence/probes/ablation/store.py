"""An :class:`~tl_idempotence.probes.ablation.result.Ablation` saved and read back (THE store, issue 45).

:func:`save_ablation` writes the folder (:func:`~tl_idempotence.core.records.write_tables_record`: parquet tables and
one JSON record with their sha256s and its own digest; no pickle; written beside the folder and put in place in one
step)::

    heads.parquet          the heads table (layer, head, kv_head, loss_ablated, delta_loss, reason)
    controls.parquet       the matched control sets (control, heads, n_flagged_in_set, loss_ablated, delta_loss)
    window_losses.parquet  the mean loss of every set on every window
    window_sums.parquet    the summed losses every number above is computed from (n_tokens, clean, every set)
    ablation.json          summary, options, info (the model's ModelInfo), run (fallback_window, check_tolerance:
                           what the summary's note reads of the run besides its own fields), float_keys

:func:`load_ablation` checks every digest and recomputes from the window sums what the rest states: the per-window
mean losses, every set's loss and Δ, the control sets' counts of flagged heads, and the summary's statistics (the
p-value, the medians and quantiles, the bootstrap intervals with the saved seed, the counts, the control rule, the
interval method and the note), with THE identity check of every loader
(:func:`~tl_idempotence.core.records.check_identity`: the summary's model name against the info, the summary's
``kind`` against the options, the heads against the model's sizes and kv map). The control sets themselves are
checked to be matched (the flagged set's number of heads in each flagged layer, drawn from the layer's pool,
pairwise distinct, never the flagged set), not redrawn. What nothing derives is declared in
:data:`~tl_idempotence.probes.ablation.result.ABLATION_FREE_FIELDS`.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from ...core.heads import ModelInfo, kv_layout
from ...core.outputs import check_save_target
from ...core.records import check_identity, index_column, same_value, write_tables_record
from ...core.stored import StoreSpec, saves
from ...errors import OptionError, OptionTypeError, ReportFileError
from ..token_records import edited_error, probe_fields, read_probe
from .controls import SetPlan, plan_sets, set_labels
from .kinds import ABLATION_HOOKS, ABLATION_KINDS
from .passes import CHECK_TOLERANCES
from .tables import AblationSummary, Losses, ablation_summary, ablation_tables, set_names, window_sums_table

if TYPE_CHECKING:  # pragma: no cover
    from ...core.hints import PathLike

__all__ = [
    "ABLATION_FORMAT",
    "ABLATION_FREE_FIELDS",
    "ABLATION_RECORD",
    "ABLATION_STORE",
    "ABLATION_TABLES",
    "read_ablation",
    "save_ablation",
]

#: The record format of a saved ablation (:mod:`tl_idempotence.probes.ablation.store`).
ABLATION_FORMAT = "tl_idempotence.ablation/1"
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
#: How an ablation is stored (:class:`~tl_idempotence.core.stored.StoreSpec`), and its record's file name.
ABLATION_STORE = StoreSpec(name="ablation", formats=(ABLATION_FORMAT,), free_fields=ABLATION_FREE_FIELDS)
ABLATION_RECORD = ABLATION_STORE.record


#: The tables of a saved ablation.
ABLATION_TABLES = ("heads", "controls", "window_losses", "window_sums")
#: The options an ablation records (:func:`~tl_idempotence.probes.ablation.ablation`), in order.
_OPTION_NAMES = ("kind", "n_controls", "seed", "seq_len", "max_tokens", "batch_size", "singles", "corpus")
#: The summary's bootstrap interval ends: recomputed to 1e-9 (relative), not bit for bit, because the bootstrap's
#: matrix products go through BLAS, whose kernels may sum in another order on another machine.
_INTERVAL_ENDS = ("delta_loss_ci_low", "delta_loss_ci_high", "excess_ci_low", "excess_ci_high")
_AGAIN = "tli.ablation"
_LABEL = re.compile(r"L(\d+)H(\d+)")


@saves("ablation")
def save_ablation(result: Any, path: PathLike, overwrite: bool = False) -> str:
    """Save an :class:`~tl_idempotence.probes.ablation.result.Ablation` to the folder ``path`` (module docstring:
    parquet tables and one JSON record; no pickle); :func:`load_ablation` reads it back.

    Returns:
        The folder, as a string.

    Raises:
        OptionTypeError: ``result`` is not an ``Ablation``; ``path`` not a path; ``overwrite`` not a bool.
        OptionError: an ablation without its window sums or run record (made by hand: compute it again);
            ``path`` ends in a file extension; as :func:`~tl_idempotence.core.records.write_tables_record` (a
            non-empty folder without ``overwrite``, a missing parent, an edited earlier record; names it).
        OutputOverInputError (an ``OptionError``): ``path`` is the folder ``result`` was loaded from.
    """
    if type(result).__name__ != "Ablation" or not hasattr(result, "window_sums"):  # (this module is below its class)
        raise OptionTypeError(f"save_ablation saves an Ablation (tli.ablation); got {type(result).__name__}.")
    run = dict(result.run_info)
    if not len(result.window_sums) or not {"fallback_window", "check_tolerance"} <= set(run):
        raise OptionError(
            "This ablation holds no summed losses per window (window_sums) or no run record (run_info): a save "
            "keeps them so that every number can be recomputed when it is read back. Compute it again with "
            "tli.ablation (or rep.ablation)."
        )
    check_save_target(path, "An ablation save", "ablation", getattr(result, "loaded_from", None))
    tables = {
        "heads": result.heads,
        "controls": result.controls,
        "window_losses": result.window_losses,
        "window_sums": result.window_sums,
    }
    extra = {"run": {"fallback_window": run["fallback_window"], "check_tolerance": run["check_tolerance"]}}
    fields = probe_fields(result, extra)
    return str(write_tables_record(path, ABLATION_FORMAT, ABLATION_RECORD, tables, fields, overwrite))


def read_ablation(path: PathLike) -> tuple[dict[str, Any], str]:
    """Read back what :func:`save_ablation` wrote, checking every digest and recomputing from the window sums what
    the record and the other tables state (module docstring): what ``Ablation.load`` builds its result from.

    Args:
        path: the folder.

    Returns:
        ``(the Ablation's constructor arguments, the folder read)`` (equal tables and summary).

    Raises:
        MissingFileError: no such folder, no ``ablation.json``, a listed table missing (names it).
        ReportFileError: another format; an edited record (digest) or table (sha256), each named; a table, an
            option or a summary field that is not what the window sums, the options and the info give (an edit whose
            digests were recomputed; names the file and the field).
        OptionTypeError: ``path`` is not a path.
    """
    d, fields, tables, info = read_probe(path, ABLATION_FORMAT, ABLATION_RECORD, frozenset(ABLATION_TABLES), ("kind",))
    rec = d / ABLATION_RECORD
    summary, options = fields["summary"], fields["options"]
    check_identity(rec, summary, options, (), info, tables["heads"], d / "heads.parquet")
    kind, n_requested, seed, singles = _checked_options(rec, options, summary)
    run_info = _run_info(rec, fields.get("run"), summary)
    plan = _plan(d, tables, info, n_requested, seed, singles)
    L = _losses(d, tables["window_sums"], plan, options["seq_len"])
    heads_df, ctrl_df, win_df = ablation_tables(plan, L, kv_layout(info.n_heads, info.n_kv_heads), singles)
    for name, fresh in (("heads", heads_df), ("controls", ctrl_df), ("window_losses", win_df)):
        _check_table(d / f"{name}.parquet", tables[name], fresh)
    n_windows = len(L.clean)
    try:
        fresh_summary = ablation_summary(plan, L, run_info, heads_df, seed, kind, info.model_name, n_windows)
    except OptionError as e:  # a seed the bootstrap's generator refuses
        raise edited_error(rec, f"options['seed'] = {seed!r} is refused ({e})", _AGAIN) from e
    _check_summary(rec, summary, fresh_summary)
    kwargs = {
        "heads": heads_df,
        "controls": ctrl_df,
        "summary": AblationSummary(summary),
        "info": info,
        "options": options,
        "window_losses": win_df,
        "window_sums": window_sums_table(plan, L),
        "run_info": run_info,
    }
    return kwargs, str(d)


def _checked_options(rec: Path, options: Mapping[str, Any], summary: Mapping[str, Any]) -> tuple[str, int, int, bool]:
    """``(kind, n_controls, seed, singles)`` of a saved ablation's options, checked: the names the function records,
    a known kind and its hook, the summary's ``n_controls_requested``.

    Raises:
        ReportFileError: names the record and the option.
    """
    names = (*_OPTION_NAMES, "hook", "mean_over")
    if tuple(options) != names:
        raise edited_error(rec, f"options {list(options)} are not an ablation's {list(names)}", _AGAIN)
    kind, n_req, seed, singles = (options[k] for k in ("kind", "n_controls", "seed", "singles"))
    if kind not in ABLATION_KINDS or {k: options[k] for k in ("hook", "mean_over")} != ABLATION_HOOKS[kind]:
        raise edited_error(rec, f"options kind={kind!r}, hook and mean_over are not an ablation kind's", _AGAIN)
    for name, value in (("n_controls", n_req), ("seed", seed), ("seq_len", options["seq_len"])):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise edited_error(rec, f"options[{name!r}] is {value!r}, not a count", _AGAIN)
    if not isinstance(singles, bool):
        raise edited_error(rec, f"options['singles'] is {singles!r}, not a bool", _AGAIN)
    stated = summary.get("n_controls_requested")
    if type(stated) is not int or stated != n_req:
        what = f"summary['n_controls_requested'] is {stated!r} but options['n_controls'] {n_req}"
        raise edited_error(rec, what, _AGAIN)
    return kind, n_req, seed, singles


def _run_info(rec: Path, run: Any, summary: Mapping[str, Any]) -> dict[str, Any]:
    """The passes' record of a saved ablation: the summary's fields of it and the record's ``run``
    (``fallback_window``, ``check_tolerance``), checked: a tolerance a run checks with, and the batching mode the
    fallback window gives.

    Raises:
        ReportFileError: names the record and the field.
    """
    if not isinstance(run, dict) or list(run) != ["fallback_window", "check_tolerance"]:
        raise edited_error(rec, f"run {run!r} is not an ablation's run record", _AGAIN)
    fw, tol = run["fallback_window"], run["check_tolerance"]
    if fw is not None and (isinstance(fw, bool) or not isinstance(fw, int) or fw < 0):
        raise edited_error(rec, f"run['fallback_window'] is {fw!r}, not a window", _AGAIN)
    if not isinstance(tol, float) or tol not in CHECK_TOLERANCES:
        raise edited_error(rec, f"run['check_tolerance'] is {tol!r}, not one of {list(CHECK_TOLERANCES)}", _AGAIN)
    batching = "shared prefix" if fw is None else "repeated input"
    if summary.get("batching") != batching:
        raise edited_error(
            rec, f"summary['batching'] is {summary.get('batching')!r} but run['fallback_window'] = {fw!r}", _AGAIN
        )
    keys = ("check_max_abs_diff", "threads", "threads_seconds_per_set", "seconds")
    if any(k not in summary for k in keys):
        raise ReportFileError(f"{rec}: a malformed summary (no {[k for k in keys if k not in summary]}).")
    return {
        "batching": batching,
        "fallback_window": fw,
        "check_max_abs_diff": summary["check_max_abs_diff"],
        "check_tolerance": tol,
        "threads": summary["threads"],
        "threads_seconds_per_set": summary["threads_seconds_per_set"],
        "seconds": summary["seconds"],
    }


def _plan(
    d: Path, tables: Mapping[str, pd.DataFrame], info: ModelInfo, n_requested: int, seed: int, singles: bool
) -> SetPlan:
    """The head sets a saved ablation ran: the flagged set from the heads table, the control sets from the controls
    table (checked to be matched: :func:`_controls`), the rest as :func:`~tl_idempotence.probes.ablation.controls.
    plan_sets` gives it for the options.

    Raises:
        ReportFileError: heads not grouped by layer, no heads, controls that are not matched, fewer or more controls
            than the options give (names the file).
    """
    fh, fc = d / "heads.parquet", d / "controls.parquet"
    heads = tables["heads"]
    pairs = list(zip(index_column(heads, "layer", fh).tolist(), index_column(heads, "head", fh).tolist()))
    flagged: dict[int, list[int]] = {}
    for layer, h in pairs:
        flagged.setdefault(layer, []).append(h)
    if not pairs or pairs != [(layer, h) for layer, hs in flagged.items() for h in hs]:
        raise edited_error(fh, "no heads, or heads not grouped by layer as an ablation lists them", _AGAIN)
    try:
        plan = plan_sets(flagged, info.n_heads, n_requested, seed, singles)
    except OptionError as e:
        raise edited_error(d / ABLATION_RECORD, f"options n_controls={n_requested} cannot be run: {e}", _AGAIN) from e
    controls = _controls(fc, tables["controls"], flagged, info.n_heads, plan.fallback)
    if len(controls) != plan.n_controls:
        raise edited_error(
            fc, f"{len(controls)} control sets, but n_controls={n_requested} gives {plan.n_controls}", _AGAIN
        )
    sets = [plan.sets[0], *controls, *plan.sets[1 + plan.n_controls :]]
    return dataclasses.replace(plan, controls=controls, sets=sets)


def _controls(
    fc: Path, ctrl: pd.DataFrame, flagged: dict[int, list[int]], n_heads: int, fallback: list[int]
) -> list[dict[int, list[int]]]:
    """The control sets of a saved controls table, each checked to be matched to ``flagged`` (module docstring).

    Raises:
        ReportFileError: names the file and the first control that is not (labels, counts, pool, repeats).
    """
    if "heads" not in ctrl.columns:
        raise edited_error(fc, f"columns {list(ctrl.columns)} have no 'heads'", _AGAIN)
    want = {layer: len(hs) for layer, hs in sorted(flagged.items())}
    own = tuple(tuple(sorted(hs)) for _, hs in sorted(flagged.items()))
    seen: set[tuple[tuple[int, ...], ...]] = set()
    out: list[dict[int, list[int]]] = []
    for i, text in enumerate(ctrl["heads"].tolist()):
        s: dict[int, list[int]] = {}
        for lab in str(text).split(" "):
            m = _LABEL.fullmatch(lab)
            if m is None:
                raise edited_error(fc, f"control {i}'s heads {text!r} are not head labels", _AGAIN)
            s.setdefault(int(m[1]), []).append(int(m[2]))
        s = dict(sorted(s.items()))
        key = tuple(tuple(hs) for hs in s.values())
        matched = (
            isinstance(text, str)
            and set_labels(s) == text
            and {layer: len(hs) for layer, hs in s.items()} == want
            and all(hs == sorted(set(hs)) for hs in s.values())
            and all(h < n_heads and (lay in fallback or h not in flagged[lay]) for lay, hs in s.items() for h in hs)
        )
        if not matched:
            raise edited_error(fc, f"control {i} ({text!r}) is not a set matched to the flagged heads", _AGAIN)
        if key == own or key in seen:
            raise edited_error(fc, f"control {i} ({text!r}) is the flagged set or an earlier control", _AGAIN)
        seen.add(key)
        out.append(s)
    return out


def _losses(d: Path, sums: pd.DataFrame, plan: SetPlan, seq_len: int) -> Losses:
    """The :class:`~tl_idempotence.probes.ablation.result.Losses` of a saved ``window_sums`` table (its columns those
    ``plan`` gives, its counts whole and within the windows).

    Raises:
        ReportFileError: names the file and what is wrong.
    """
    fs = d / "window_sums.parquet"
    want = ["n_tokens", "clean", *set_names(plan)]
    if list(sums.columns) != want:
        raise edited_error(fs, f"columns {list(sums.columns)[:6]} are not the head sets run {want[:6]}", _AGAIN)
    n_tok = index_column(sums, "n_tokens", fs)
    if not len(n_tok) or (n_tok < 0).any() or (n_tok > max(seq_len - 1, 0)).any() or not n_tok.sum():
        raise edited_error(fs, f"counts n_tokens that are not those of windows of seq_len={seq_len}", _AGAIN)
    values = sums[want[1:]].to_numpy(dtype=np.float64)
    if not np.isfinite(values).all():
        raise edited_error(fs, "a summed loss that is not finite", _AGAIN)
    clean, set_sums = values[:, 0].copy(), np.ascontiguousarray(values[:, 1:].T)
    return Losses.of(clean, set_sums, n_tok, plan.n_controls)


def _check_table(f: Path, saved: pd.DataFrame, fresh: pd.DataFrame) -> None:
    """Refuse a saved table that is not, column for column and bit for bit, what the window sums give.

    Raises:
        ReportFileError: names the file and the first column that differs.
    """
    fresh = fresh.reset_index(drop=True)
    if list(saved.columns) != list(fresh.columns) or len(saved) != len(fresh):
        raise edited_error(f, f"columns {list(saved.columns)[:6]} are not {list(fresh.columns)[:6]}", _AGAIN)
    for c in fresh.columns:
        a, b = saved[c], fresh[c]
        if b.dtype.kind in "fiub":
            same = a.dtype.kind == b.dtype.kind and np.array_equal(
                a.to_numpy(dtype=b.dtype), b.to_numpy(), equal_nan=b.dtype.kind == "f"
            )
        else:
            same = a.astype(object).tolist() == b.astype(object).tolist()
        if not same:
            raise edited_error(f, f"column {c!r} is not what window_sums.parquet gives", _AGAIN)


def _check_summary(rec: Path, summary: Mapping[str, Any], fresh: Mapping[str, Any]) -> None:
    """Refuse a saved summary whose fields are not those :func:`ablation_summary` gives from the window sums.

    Raises:
        ReportFileError: names the record and the first field that differs.
    """
    if list(summary) != list(fresh):
        raise edited_error(rec, f"summary fields {list(summary)} are not {list(fresh)}", _AGAIN)
    for k, v in fresh.items():
        a = summary[k]
        if same_value(a, v) and type(a) is type(v):
            continue
        near = (
            k in _INTERVAL_ENDS
            and isinstance(a, float)
            and isinstance(v, float)
            and math.isfinite(v)
            and math.isclose(a, v, rel_tol=1e-9, abs_tol=1e-15)
        )
        if not near:
            raise edited_error(rec, f"summary[{k!r}] is {a!r} but the window sums give {v!r}", _AGAIN)
