"""A sweep's result: :class:`SweepResult` (the comparison of every item that finished, plus what happened to
each task), built from a Dask sweep's outcomes (:func:`build_result`) or read back from the folder its tasks
left (:func:`load_sweep`, the ``--collect`` of a job array).
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from ...analyses.report_options import ReportOptions
from ...core.frozen import frozen
from ...core.options import check_device_name, strict_kwargs
from ...errors import OptionError, ReportMismatchError, TLIError
from ...report.identity import describe_report, option_differences, report_mismatch
from ...report.report import IdempotenceReport, load_report
from ...report.store import RECORD
from ..compare import Comparison
from .plan import Entry, SweepPlan, item_dirnames, plan_matches, read_sweep_plan, resolve_sweep_items
from .task import TASK_COLUMNS, ItemFiles, marker_text

if TYPE_CHECKING:  # pragma: no cover
    from ...core.hints import PathLike
    from .plan import SweepItems

__all__ = ["SweepResult", "build_result", "load_finished", "load_sweep"]


class SweepResult(
    Comparison,
    repr_keys="n_models n_computed n_skipped n_failed n_missing threshold n_closed min_pct_closed max_pct_closed",
    frozen=("a sweep result is", "load_sweep(out) again"),
):
    """Result of :func:`~tl_idempotence.studies.sweep.sweep` and :func:`load_sweep`: the
    :class:`~tl_idempotence.studies.compare.Comparison` of every item that finished, plus what happened
    to each task. Immutable, like the comparison: its tables are copies made on each read.

    Attributes:
        out: the sweep folder (``out/<dir>/`` holds each item's report; ``out/sweep.json`` the plan).
        tasks: one row per item in input order: ``label, dir, status`` (``computed``, ``skipped``
            — its saved report matched the current weights and options —, ``failed``, or from
            :func:`load_sweep` also ``missing``), ``reason`` (why it was computed, skipped, failed or
            is missing), ``device`` (the device type its saved report was computed on, as the report
            records it: ``"cpu"``, ``"cuda"``; None without a report), ``seconds`` (on the worker),
            ``host``, ``pid``, ``attempts`` (attempts that ran; 0 when unknown).
        device: the device asked for (``"cpu"``, ``"cuda"``, ``"cuda:1"``, ``"auto"``); ``options.device``
            is the device type the reports were computed on (with ``"auto"``: the one every report
            records; the one asked when they differ — then ``tasks.device`` says which is which and a
            warning was given).
        failed: one row per item that failed after its retries: ``label, item, error_type, message``
            (``error_type`` ``WorkerDied``: the process measuring it died, the message says how).
        missing: one row per item without a usable report yet (:func:`load_sweep` of an array sweep):
            ``label, dir, item, reason``; empty after a Dask sweep.
        seconds: wall time of the whole sweep (of reading the folder, for :func:`load_sweep`).
        (and every attribute of :class:`Comparison`: ``table``, ``heads``, ``reports``, ...)
    """

    out: Path
    tasks: pd.DataFrame
    device: str
    failed: pd.DataFrame
    missing: pd.DataFrame
    seconds: float

    def __init__(
        self,
        reports: Mapping[str, IdempotenceReport],
        options: ReportOptions,
        out: Path,
        tasks: pd.DataFrame,
        failed: pd.DataFrame,
        seconds: float,
        warn: bool = True,
        device: str = "cpu",
        missing: pd.DataFrame | None = None,
    ) -> None:
        super().__init__(reports, options, warn=warn)
        self._freeze(
            inputs=(*self.inputs, ("the sweep folder", Path(out).absolute())),  # no page over its plan or reports
            device=device,
            out=out,
            tasks=tasks,
            failed=failed,
            missing=missing if missing is not None else pd.DataFrame(columns=["label", "dir", "item", "reason"]),
            seconds=seconds,
        )

    @classmethod
    def load(cls, path: PathLike) -> Comparison:  # type: ignore[override]  # a Comparison, as it always was
        """:meth:`Comparison.load`: a folder ``SweepResult.save`` wrote, read back as the :class:`Comparison` it
        is (what happened to each item is not saved: a sweep's own folder is read by :func:`load_sweep`).

        Raises:
            MissingFileError: no such folder, or a file its record lists is missing (names it).
            ReportFileError: another format, an edited or foreign file, or a field that is not what the saved tables
                give (names the file and the field).
            OptionTypeError: ``path`` is not a path.
        """
        return Comparison.load(path)

    @property
    def summary(self) -> dict[str, Any]:
        """The comparison's summary plus ``device`` (the device type of the reports, or the one asked),
        ``n_computed, n_skipped, n_failed, n_missing, seconds`` (read-only)."""
        tasks = self.tasks
        st = tasks["status"] if len(tasks) else pd.Series([], dtype=str)
        return frozen(
            {
                **super().summary,
                "device": self.options.device.type,
                "n_computed": int((st == "computed").sum()),
                "n_skipped": int((st == "skipped").sum()),
                "n_failed": int((st == "failed").sum()),
                "n_missing": int((st == "missing").sum()),
                "seconds": self.seconds,
            }
        )


def build_result(
    d: Path,
    entries: Sequence[Entry],
    reports: dict[str, IdempotenceReport],
    rows: dict[str, dict[str, Any]],
    failures: dict[str, dict[str, Any]],
    missing: dict[str, str],
    record: dict[str, Any],
    device_name: str,
    seconds: float,
    what: str,
) -> SweepResult:
    """The :class:`SweepResult` of a sweep's outcome (one row per entry in ``rows``), with its warnings.

    Called directly by the entry points (:func:`~tl_idempotence.studies.sweep.sweep`, :func:`load_sweep`):
    its warnings name their caller's caller (``stacklevel=4``).

    Args:
        d: the sweep folder.
        entries: the plan's items, in order.
        reports: ``{label: report}`` of the items that finished, in item order.
        rows: ``{label: row of .tasks}`` for every entry (``device`` is filled here from its report).
        failures: ``{label: row of .failed}``.
        missing: ``{label: why}`` of the items without a usable report.
        record: the report options without the device (``ReportOptions.as_dict()`` keys).
        device_name: the device asked for.
        seconds: wall time of the sweep (or of reading it back).
        what: words after "failed" in the warning (e.g. ``" after 2 retries"``).

    Warns:
        UserWarning: reports computed on different devices; failed items; missing items.
    """
    opts = ReportOptions.from_record({**record, "device": "cpu" if device_name == "auto" else device_name})
    for lab, row in rows.items():
        row["device"] = reports[lab].options.device.type if lab in reports else None
    used = sorted({rep.options.device.type for rep in reports.values()})
    if len(used) == 1 and used[0] != opts.device.type:  # device="auto": what the workers resolved it to
        opts = ReportOptions.from_record({**record, "device": used[0]})
    elif len(used) > 1:
        warnings.warn(
            f"The sweep's reports were computed on different devices ({', '.join(used)}; device={device_name!r} "
            "resolved differently on the workers): their numbers may differ in the last bits (SweepResult.tasks "
            "has each item's device).",
            UserWarning,
            stacklevel=4,
        )
    tasks_df = pd.DataFrame([rows[e.label] for e in entries], columns=TASK_COLUMNS)
    failed_df = pd.DataFrame(
        [failures[e.label] for e in entries if e.label in failures], columns=["label", "item", "error_type", "message"]
    )
    missing_df = pd.DataFrame(
        [
            {"label": e.label, "dir": e.dir, "item": e.item, "reason": missing[e.label]}
            for e in entries
            if e.label in missing
        ],
        columns=["label", "dir", "item", "reason"],
    )
    # one warning per kind of absent item: (table, what happened, each row's reason, where it is listed)
    kept = "failed; every other result is kept"
    absent: tuple[tuple[pd.DataFrame, str, Callable[[Any], str], str], ...] = (
        (failed_df, f"failed{what}", lambda r: f"{r.error_type}: {r.message[:200]}", kept),
        (missing_df, "have no report yet", lambda r: r.reason[:200], "missing"),
    )
    for df, happened, reason, listed in absent:
        if len(df):
            warnings.warn(
                f"{len(df)} of {len(entries)} sweep items {happened}: "
                + "; ".join(f"{r.label}: {reason(r)}" for r in df.itertuples())
                + f" (listed in SweepResult.{listed}).",
                UserWarning,
                stacklevel=4,
            )
    return SweepResult(
        reports,
        opts,
        d,
        tasks_df,
        failed_df,
        seconds=seconds,
        warn=bool(reports),
        device=device_name,
        missing=missing_df,
    )


def load_finished(d: Path, entry: Entry, digest: str | None, host: Any) -> IdempotenceReport | str:
    """The report a task wrote, or why it cannot be used (replaced meanwhile, unreadable)."""
    files = ItemFiles(d, entry.dir)
    if digest is not None and files.report_digest() != digest:
        return (
            f"{files.target / RECORD} is not the report its task wrote (sha256 differs): another process replaced it "
            "while the sweep ran; rerun the sweep"
        )
    try:
        return load_report(files.target)
    except (TLIError, OSError) as e:
        where = f"the task finished on {host}: is {d} shared between the workers and this process?"
        return f"{type(e).__name__}: {e} ({where})"


# --------------------------------------------------------------------------- reading a sweep back


@strict_kwargs
def load_sweep(out: PathLike, items: SweepItems | None = None) -> SweepResult:
    """The :class:`SweepResult` of the sweep in ``out`` as its tasks left it (job-array tasks or a Dask sweep;
    SPEC §9, scale).

    Reads the plan (``out/sweep.json``), and per item its saved report (checked against the sha256 of every
    table, and against the plan's options) and its task record. Nothing is measured and no item is opened:
    whether a report still matches its checkpoint's current weights is what rerunning the item's task checks.

    Each saved report is checked against its item (:func:`~tl_idempotence.report.identity.report_mismatch`):
    the checkpoint (folder or file name) or zoo model the plan names for it, and the weights fingerprint its
    own task recorded. A report of anything else — e.g. another item's folder copied over this one's — is
    listed in ``.failed`` (``error_type`` ``ReportMismatchError``, the message naming both), never as this
    item's result.

    An item is ``computed`` or ``skipped`` (its task record describes the report in ``out/<dir>``; a report
    without such a record counts as ``computed``, its reason says so), ``failed`` (its latest task raised,
    the process measuring it died — a start marker without a running process —, or ``out/<dir>`` holds a
    report that is not of this item: ``ReportMismatchError``, below) or ``missing`` (not run
    yet, running now — its lock is held —, or its report is damaged or was made with other options); the
    missing ones are named in ``.missing`` and in a warning.

    Args:
        out: the sweep folder.
        items: the items the caller means (as given to :func:`~tl_idempotence.studies.sweep.sweep` /
            :func:`~tl_idempotence.studies.sweep.run_sweep_item`), or None to take the plan's. When given
            they must be the plan's items (labels, folders, paths).

    Returns:
        :class:`SweepResult` (``.table``, ``.heads``, ``.reports`` of the finished items, ``.tasks``,
        ``.failed``, ``.missing``), as :func:`~tl_idempotence.studies.sweep.sweep` returns it.

    Raises:
        MissingFileError: ``out`` is not a folder or holds no ``sweep.json``.
        ReportFileError: a ``sweep.json`` that lies (names the file).
        OptionError: ``items`` that are not the plan's (says what differs).
        OptionTypeError / UnknownOptionError: bad argument types, unknown keywords.

    Warns:
        UserWarning: failed and missing items; models with processed or identical weights.
    """
    t0 = time.perf_counter()
    plan = read_sweep_plan(out)
    d = plan.path.parent
    entries = _plan_entries(plan, items)
    want = ReportOptions.from_record({**plan.options, "device": "cpu"})
    want_device = None if plan.device_asked == "auto" else check_device_name(plan.device_asked)
    found = _Found()
    shares = {e.label: [o.label for o in entries if o.origin == e.origin and o is not e] for e in entries}
    for e in entries:
        _read_item(d, e, want, want_device, found, shares[e.label] if e.origin is not None else [])
    return build_result(
        d,
        entries,
        found.reports,
        found.rows,
        found.failures,
        found.missing,
        plan.options,
        plan.device_asked,
        time.perf_counter() - t0,
        "",
    )


def _plan_entries(plan: SweepPlan, items: SweepItems | None) -> list[Entry]:
    """The plan's entries; ``items`` (when given) must be the plan's.

    Raises:
        OptionError: ``items`` that are not the plan's (says what differs).
    """
    origins = plan.origins or (None,) * len(plan.items)
    entries = [Entry(*i, origin) for i, origin in zip(plan.items, origins)]
    if items is not None:
        resolved = resolve_sweep_items(items)
        given = [Entry(it.label, name, it.describe()) for it, name in zip(resolved, item_dirnames(resolved))]
        differs = plan_matches(plan, given, plan.options, plan.device_asked)
        if differs:
            raise OptionError(
                f"{plan.path} is a sweep of other items: {'; '.join(differs)}. Give its items, or another out."
            )
    return entries


@dataclass
class _Found:
    """What :func:`load_sweep` found so far: the finished reports and each item's row, failure or absence."""

    reports: dict[str, IdempotenceReport] = field(default_factory=dict)
    rows: dict[str, dict[str, Any]] = field(default_factory=dict)
    failures: dict[str, dict[str, Any]] = field(default_factory=dict)
    missing: dict[str, str] = field(default_factory=dict)

    def fail(self, e: Entry, base: dict[str, Any], kind: str, msg: str) -> None:
        self.failures[e.label] = {"label": e.label, "item": e.item, "error_type": kind, "message": msg}
        self.rows[e.label] = {**base, "status": "failed", "reason": f"{kind}: {msg}"}

    def miss(self, e: Entry, base: dict[str, Any], why: str) -> None:
        self.missing[e.label] = why
        self.rows[e.label] = {**base, "status": "missing", "reason": why}


def _read_item(
    d: Path, e: Entry, want: ReportOptions, want_device: str | None, found: _Found, shares: list[str] | None = None
) -> None:
    """One item of :func:`load_sweep`: its report (checked against the item and the options) and task record.
    ``shares``: the labels of the plan's other items with the same origin (a checkpoint folder name), which only
    the item's own task record (its full source and weights fingerprint) tells apart."""
    files = ItemFiles(d, e.dir)
    rec, rec_problem = files.read_record()
    digest = files.report_digest()
    base = {"label": e.label, "dir": e.dir, "attempts": 0}
    busy = files.busy()
    dead = [] if busy else [marker_text(info) for _, info in files.markers()]  # processes gone: the lock is free
    if rec is not None and rec["status"] == "failed" and rec.get("report_sha256") is None:
        found.fail(e, base, str(rec.get("error_type") or "Error"), str(rec.get("message") or rec["reason"]))
        return
    if digest is None:
        if busy:
            found.miss(e, base, "being measured now (its lock is held)")
        elif dead:
            msg = f"the process measuring it died: {'; '.join(dead)} (killed: wall time or memory?)"
            found.fail(e, base, "WorkerDied", msg)
        elif files.target.exists():
            found.miss(e, base, f"{files.target} has no {RECORD} (an interrupted save): rerun its task")
        else:
            found.miss(e, base, "not measured yet")
        return
    try:
        rep = load_report(files.target)
    except (TLIError, OSError) as err:
        found.miss(e, base, f"its saved report is unreadable ({type(err).__name__}: {err}): rerun its task")
        return
    # a task record of another item (the item's folder and its record copied from another item's): its full
    # source says so even when both checkpoints have one folder name (x/ck, y/ck)
    other = files.record_of_another_item(e.item)
    if other is not None:
        found.fail(
            e,
            base,
            ReportMismatchError.__name__,
            f"{files.target} is not of item {e.label!r} ({e.item}): {other} (copied from another item's folder). "
            "Its numbers are not used; rerun its task (it measures the item again)",
        )
        return
    # the report-identity check: the plan's item (its checkpoint or zoo name) and the weights its own task
    # recorded having measured; a report copied in from another item's folder is never this item's result
    recorded = rec.get("weights_fingerprint") if rec is not None else None
    recorded = recorded if isinstance(recorded, str) else None
    if recorded is None and shares:
        found.miss(
            e,
            base,
            f"its report has no task record naming this item's weights fingerprint, and item(s) {shares} share its "
            f"{e.origin}: which of them it measured cannot be told. Rerun its task",
        )
        return
    foreign = report_mismatch(rep, origin=e.origin, fingerprint=recorded)
    if foreign is not None:
        measured = "" if recorded is None else f", whose task measured weights sha256 {recorded[:12]}"
        found.fail(
            e,
            base,
            ReportMismatchError.__name__,
            f"{files.target} holds a report of {describe_report(rep)}, not of item {e.label!r} ({e.item}"
            f"{measured}): {foreign}. Its numbers are not used; rerun its task (it measures the item again)",
        )
        return
    diff = option_differences(rep.options, want)
    if want_device is not None and rep.options.device.type != _device_type(want_device):
        diff["device"] = (rep.options.device.type, _device_type(want_device))
    if diff:
        found.miss(
            e,
            base,
            "its saved report was made with other options ("
            + ", ".join(f"{k} {a!r}, the sweep asks {b!r}" for k, (a, b) in diff.items())
            + "): rerun its task",
        )
        return
    found.reports[e.label] = rep
    if rec is not None and rec.get("report_sha256") == digest and rec["status"] in ("computed", "skipped"):
        found.rows[e.label] = {
            **base,
            **{k: rec.get(k) for k in ("status", "reason", "seconds", "host", "pid")},
            "attempts": rec.get("attempt") or 0,
        }
    else:
        why = rec_problem or "its task record describes another report"
        found.rows[e.label] = {**base, "status": "computed", "reason": f"report found ({why})"}


def _device_type(name: str) -> str:
    import torch

    return torch.device(name).type
