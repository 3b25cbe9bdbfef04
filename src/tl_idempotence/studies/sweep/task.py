"""One task of a sweep: one item measured (or skipped) in one process — a Dask worker or a job-array task —
its report saved into ``OUT/<dir>`` under the item's lock, its outcome left in the item's task record.

:class:`ItemFiles` is every file of one item in ``OUT``: the report folder ``OUT/<dir>`` and
``OUT/.tli-items/<dir>/`` (the lock, the task record ``record.json``, one start marker per running
attempt). :func:`run_sweep_task` is the task; :func:`saved_report_matches` is the check that lets it skip
an item (the module docstring of :mod:`tl_idempotence.studies.sweep` says how outcomes are decided).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...analyses.report_options import ReportOptions
from ...core.files import atomic_write_text, read_json, sha256_file
from ...core.jsonio import RECORD as RECORD_NAN_POLICY
from ...core.jsonio import json_restore, json_text
from ...core.store import OLD_MARK, install_folder, saved_folder
from ...errors import OptionError, ReportFileError, TLIError
from ...report.identity import origin_of, report_mismatch
from ...report.report import IdempotenceReport, load_report
from ...report.store import RECORD
from ...report.summary import versions
from ..compare import Item, measure_item, open_item
from .plan import ITEMS_DIR, Entry, item_origin

__all__ = [
    "ITEM_FORMAT",
    "OLD_PREFIX",
    "TASK_COLUMNS",
    "TMP_PREFIX",
    "ItemFiles",
    "SweepTask",
    "marker_text",
    "our_files_only",
    "refuse_foreign_folder",
    "run_sweep_task",
    "saved_report",
    "saved_report_matches",
    "task_entry",
]

#: The format of an item's task record (``OUT/.tli-items/<dir>/record.json``).
ITEM_FORMAT = "tl_idempotence.sweep-item/1"
#: Prefix of the folder a report is written to before it is renamed to ``OUT/<dir>``.
TMP_PREFIX = ".tli-tmp-"
#: Prefix of the name a replaced report took while the new one was put in place, before the sweep put its reports
#: in place through THE store (:func:`~tl_idempotence.core.store.install_folder`, which keeps it as
#: ``.<dir>.tli-old-RANDOM`` where the file system has no atomic exchange); such leftovers are still removed.
OLD_PREFIX = ".tli-old-"
_MARKER = re.compile(r"^started-([0-9a-f]{12})-(\d+)-([0-9a-f]{8})\.json$")
#: The task record's float fields: the only ones whose "NaN"/"Infinity" strings are read back as floats
#: (core/jsonio.py's record policy; a reason that reads "NaN" stays text).
RECORD_FLOAT_KEYS = frozenset({"seconds", "time"})

#: ``SweepResult.tasks`` columns, in order.
TASK_COLUMNS = ["label", "dir", "status", "reason", "device", "seconds", "host", "pid", "attempts"]


# --------------------------------------------------------------------------- one item's files in OUT


class ItemFiles:
    """``OUT/<dir>`` (the report) and ``OUT/.tli-items/<dir>/`` (lock, task record, start markers) of one item."""

    def __init__(self, out: Path, dirname: str) -> None:
        self.out = out
        self.dirname = dirname
        self.target = out / dirname
        self.folder = out / ITEMS_DIR / dirname
        self.record_path = self.folder / "record.json"

    def lock(self, wait: bool) -> Any:
        """The item's lock, acquired (``wait``: until it is free; else OptionError when another process holds it).

        Raises:
            OptionError: the lock is held (``wait=False``) or the filesystem of ``OUT`` has no file locks.
        """
        from filelock import FileLock, Timeout

        self.folder.mkdir(parents=True, exist_ok=True)
        lock = FileLock(str(self.folder / "lock"))
        try:
            lock.acquire(timeout=-1 if wait else 0, poll_interval=0.5)
        except Timeout as e:
            raise OptionError(
                f"Item {self.dirname!r} is being measured by another process (its lock {self.folder / 'lock'} is "
                "held): this task did nothing. Give each array task its own index, or wait for the other one."
            ) from e
        except NotImplementedError as e:  # filelock: flock() unsupported (e.g. Lustre mounted without -o flock)
            raise OptionError(
                f"The filesystem of {self.out} does not support file locks ({e}); sweep tasks need them to share "
                "the folder. Use a folder on a filesystem with locks (NFSv4, GPFS, Lustre mounted with -o flock)."
            ) from e
        return lock

    def busy(self) -> bool:
        """Whether another process holds the item's lock now."""
        from filelock import FileLock, Timeout

        if not (self.folder / "lock").exists():
            return False
        lock = FileLock(str(self.folder / "lock"))
        try:
            lock.acquire(timeout=0)
        except Timeout:
            return True
        except NotImplementedError:
            return False
        lock.release()
        return False

    def read_record(self) -> tuple[dict[str, Any] | None, str | None]:
        """``(record, None)``, or ``(None, why)`` when there is none or it cannot be trusted."""
        if not self.record_path.is_file():
            return None, f"no task record {self.record_path.name}"
        try:
            rec = json_restore(read_json(self.record_path, ReportFileError, "sweep task record"), RECORD_FLOAT_KEYS)
        except ReportFileError as e:
            return None, str(e)
        ok = (
            isinstance(rec, dict)
            and rec.get("format") == ITEM_FORMAT
            and rec.get("dir") == self.dirname
            and rec.get("status") in ("computed", "skipped", "failed")
            and isinstance(rec.get("run"), str)
            and isinstance(rec.get("reason"), str)
        )
        if not ok:
            return None, f"the task record {self.record_path} is not one this version writes (ignored)"
        return rec, None

    def record_of_another_item(self, item: str) -> str | None:
        """Why the task record in this item's folder is another item's (a copy of another item's folder with its
        record), or None: a record of :data:`ITEM_FORMAT` that names another folder (``dir``) or another item
        (``item``: the full source in words, ``path /abs/x/ck``, never a folder name), given the plan's ``item``."""
        try:
            rec = json.loads(self.record_path.read_text("utf-8"))
        except (OSError, ValueError):
            return None
        if not isinstance(rec, dict) or rec.get("format") != ITEM_FORMAT:
            return None
        if rec.get("dir") != self.dirname:
            return f"its task record {self.record_path} is of the item in folder {rec.get('dir')!r}"
        if rec.get("item") != item:
            return f"its task record {self.record_path} is of {rec.get('item')!r}"
        return None

    def write_record(self, row: Mapping[str, Any], item: Item) -> None:
        """Write the item's task record (``row`` plus the format, the item in words and the time), atomically."""
        self.folder.mkdir(parents=True, exist_ok=True)
        rec = {"format": ITEM_FORMAT, "item": item.describe(), "time": time.time(), **row}
        atomic_write_text(self.record_path, json_text(rec, RECORD_NAN_POLICY, indent=1, default=str))

    def report_digest(self) -> str | None:
        """sha256 of ``OUT/<dir>/report.json`` (it holds the sha256 of every table: it keys the whole report); of
        the earlier report kept beside it when a replacement was stopped between its two renames
        (:func:`~tl_idempotence.core.store.saved_folder`, as :func:`~tl_idempotence.report.report.load_report`
        reads it)."""
        try:
            return sha256_file(saved_folder(self.target, RECORD) / RECORD)
        except OSError:
            return None

    def start(self, run: str, attempt: int) -> Path:
        """Write this attempt's start marker (removed when the attempt ends, left behind when its process dies)."""
        worker = ""
        with contextlib.suppress(Exception):
            from distributed import get_worker

            worker = str(get_worker().address)
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / f"started-{run}-{attempt}-{uuid.uuid4().hex[:8]}.json"
        info = {"run": run, "attempt": attempt, "pid": os.getpid(), "host": socket.gethostname(), "worker": worker}
        atomic_write_text(path, json_text({**info, "started": time.time()}, RECORD_NAN_POLICY))
        return path

    def markers(self) -> list[tuple[Path, dict[str, Any]]]:
        """Start markers left in the item's folder: ``(path, content)`` (content ``{}`` when unreadable)."""
        out: list[tuple[Path, dict[str, Any]]] = []
        if not self.folder.is_dir():
            return out
        for p in sorted(self.folder.iterdir()):
            m = _MARKER.match(p.name)
            if m is None:
                continue
            try:
                info = json.loads(p.read_text("utf-8"))
            except (OSError, ValueError):
                info = {}
            if not isinstance(info, dict):
                info = {}
            info.setdefault("run", m.group(1))
            info.setdefault("attempt", int(m.group(2)))
            out.append((p, info))
        return out

    def clear_stale_markers(self, run: str) -> list[str]:
        """Remove the markers of other runs (the caller holds the lock: their processes are gone); returns
        one line per earlier attempt that died."""
        died = []
        for p, info in self.markers():
            if info.get("run") == run:
                continue
            died.append(marker_text(info))
            p.unlink(missing_ok=True)
        return died

    def clean_leftovers(self) -> None:
        """Temporary folders of this item left by a killed task (never another item's, never a finished report; an
        earlier report kept beside ``OUT/<dir>`` by a replacement stopped between its two renames only once a report
        is in place again)."""
        pattern = re.compile(
            rf"^(?:{re.escape(TMP_PREFIX)}|{re.escape(OLD_PREFIX)}){re.escape(self.dirname)}-[0-9a-f]{{8}}$"
        )
        kept = re.compile(rf"^\.{re.escape(self.dirname)}{re.escape(OLD_MARK)}[0-9a-f]{{8}}$")
        for p in self.out.iterdir():
            if (pattern.match(p.name) or (kept.match(p.name) and self.target.is_dir())) and p.is_dir():
                shutil.rmtree(p, ignore_errors=True)


def marker_text(info: Mapping[str, Any]) -> str:
    """One line about an attempt whose start marker is ``info``: when and where it started, and that it never ended."""
    started = info.get("started")
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)) if isinstance(started, (int, float)) else "?"
    return f"started {when} on {info.get('host', '?')} (pid {info.get('pid', '?')}) and never finished"


# --------------------------------------------------------------------------- one task (a Dask worker or an array task)


@dataclass(frozen=True)
class SweepTask:
    """One item of a sweep, as sent to a worker (small: a path, a zoo name or a callable, and options).

    Attributes:
        item: the labelled item (``path`` — absolute —, ``zoo`` or ``callable``).
        dirname: its folder under ``out``.
        out: the sweep folder.
        options: ``ReportOptions.as_dict()`` without the device.
        device: the device name, resolved on the worker (``"cpu"``, ``"cuda"``, ``"auto"``, ...).
        run: the sweep run (a Dask sweep call or one array task) this task belongs to: 12 hex digits.
    """

    item: Item
    dirname: str
    out: str
    options: dict[str, Any]
    device: str
    run: str = "000000000000"


def task_entry(task: SweepTask) -> Entry:
    """The plan's entry of a task's item (label, folder, the item in words, its origin)."""
    return Entry(task.item.label, task.dirname, task.item.describe(), item_origin(task.item))


def saved_report_matches(folder: str | os.PathLike[str], source: Any, options: ReportOptions) -> str | None:
    """Why the report saved in ``folder`` cannot stand for ``source`` measured with ``options`` — or None
    when it can (made by this version and code of tl_idempotence, from the checkpoint or zoo model the
    source reads, with the same options, sizes and processing, and every layer's current weight fingerprint
    equal to the saved one).

    The report-identity check (:func:`~tl_idempotence.report.identity.report_mismatch`). The current
    fingerprints are computed by reading each layer's O and V from ``source``
    (:meth:`~tl_idempotence.core.heads.LayerHeads.fingerprint`, the same bytes the report loop
    hashes), stopping at the first layer that differs; no analysis runs.

    Args:
        folder: a report folder (``rep.save``).
        source: a head source (or anything :func:`~tl_idempotence.sources.dispatch.head_source` accepts).
        options: the options asked for.

    Returns:
        None, or a short reason (``"no report.json"``, ``"the report was measured from checkpoint 'ckB', not
        from checkpoint 'ckA'"``, ``"options differ: ..."``, ``"layer 2's attention weights differ (weight
        fingerprint)"``, ...).
    """
    return saved_report(folder, source, options)[1]


def saved_report(
    folder: str | os.PathLike[str], source: Any, options: ReportOptions
) -> tuple[IdempotenceReport | None, str | None]:
    """``(the saved report, None)`` when it stands for ``source`` (:func:`saved_report_matches`), else
    ``(the report or None, why not)``."""
    from ...sources.dispatch import head_source

    d = Path(folder)
    if not (d / RECORD).is_file():
        return None, f"no {RECORD}"
    try:
        rep = load_report(d)
    except (TLIError, OSError) as e:
        return None, f"the saved report is unreadable ({type(e).__name__}: {e})"
    saved_v = rep.summary.versions or {}
    now_v = versions()
    for key in ("tl_idempotence", "tl_idempotence_code"):
        if saved_v.get(key) != now_v.get(key):
            return rep, f"made by another tl_idempotence ({key} {saved_v.get(key)!r} -> {now_v.get(key)!r})"
    src = head_source(source)
    origin = origin_of({"processing": src.info.processing})
    return rep, report_mismatch(rep, origin=origin, options=options, source=src)


def our_files_only(d: Path) -> bool:
    """Whether a folder holds only what a report save writes (parquet tables, report.json, temp files)."""
    for p in d.iterdir():
        if p.is_dir() or not (p.suffix == ".parquet" or p.name == RECORD or ".tmp" in p.name):
            return False
    return True


def refuse_foreign_folder(target: Path, label: str) -> None:
    """Refuse an item folder ``OUT/<dir>`` that exists and holds anything but a saved report.

    Raises:
        OptionError: ``target`` is a file, or a folder holding files a report save does not write.
    """
    if target.exists() and (not target.is_dir() or not our_files_only(target)):
        raise OptionError(
            f"{target} (the folder of item {label!r}) exists and holds files that are not a saved report; "
            "move them away or choose another out folder (nothing was computed)."
        )


def run_sweep_task(task: SweepTask, attempt: int = 1, wait: bool = True) -> dict[str, Any]:
    """Run one sweep item (on a worker, or in an array task): skip it when its saved report still matches,
    else measure and save it; leave the outcome in the item's task record.

    Works under the item's lock. A start marker exists while it runs (a process that dies leaves it: that
    is how a death is told from a task that never started). When the saved report matches and the item's
    record says *this run* computed it (the task ran twice: its first run's result was lost with a worker),
    the status is ``computed``, not ``skipped``.

    Args:
        task: the item and options.
        attempt: which attempt of this run this is (from 1).
        wait: wait for the item's lock (a Dask task; a duplicate task then finds the first one's report);
            else refuse at once when another process holds it (an array task).

    Returns:
        ``{"label", "dir", "status": "skipped" | "computed", "reason", "seconds", "host", "pid", "run",
        "attempt", "report_sha256", "weights_fingerprint"}`` (the last two: of the report now in ``OUT/<dir>``).

    Raises:
        OptionError: ``wait=False`` and another process holds the item's lock; ``OUT/<dir>`` holds files that
            are not a saved report; the filesystem has no file locks.
        Whatever opening or measuring the item raises (recorded as the item's latest outcome, then raised).
    """
    t0 = time.perf_counter()
    opts = ReportOptions.at_device(task.options, task.device)
    files = ItemFiles(Path(task.out), task.dirname)
    lock = files.lock(wait)
    try:
        marker = files.start(task.run, attempt)
        try:
            return _run_locked(_Attempt(task, attempt, t0), opts, files)
        finally:
            with contextlib.suppress(OSError):
                marker.unlink()
    finally:
        lock.release()


@dataclass(frozen=True)
class _Attempt:
    """One attempt of a task (its clock started at ``t0``): what each row it leaves says."""

    task: SweepTask
    attempt: int
    t0: float

    def row(self, status: str, reason: str, digest: str | None, fingerprint: Any = None) -> dict[str, Any]:
        """The task's row and record: ``SweepResult.tasks`` columns (``device`` is filled from the saved
        report), the run and attempt, and what ``OUT/<dir>`` holds (``load_sweep`` checks it against them)."""
        task = self.task
        return {
            "label": task.item.label,
            "dir": task.dirname,
            "status": status,
            "reason": reason,
            "seconds": time.perf_counter() - self.t0,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "run": task.run,
            "attempt": self.attempt,
            "report_sha256": digest,
            "weights_fingerprint": fingerprint,  # what load_sweep checks OUT/<dir>'s report against
        }


def _run_locked(at: _Attempt, opts: ReportOptions, files: ItemFiles) -> dict[str, Any]:
    """The task under its item's lock: skip, or measure and install the report; a failure is recorded, then raised."""
    task = at.task
    earlier = files.clear_stale_markers(task.run)
    files.clean_leftovers()
    try:
        refuse_foreign_folder(files.target, task.item.label)
        reason = "no saved report"
        src = None
        if files.target.exists():
            src = open_item(task.item)
            saved, why = saved_report(files.target, src, opts)
            if why is None:
                assert saved is not None
                return _skip(at, files, saved)
            reason = why
        if earlier:
            reason += f" (an earlier attempt {'; '.join(earlier)})"
        rep = measure_item(task.item, opts, source=src)
        del src
        return _save(at, files, rep, reason)
    except Exception as e:
        failed = {
            **at.row("failed", f"{type(e).__name__}: {e}", None),
            "error_type": type(e).__name__,
            "message": str(e),
        }
        with contextlib.suppress(OSError):
            files.write_record(failed, task.item)
        raise


def _skip(at: _Attempt, files: ItemFiles, saved: IdempotenceReport) -> dict[str, Any]:
    """The outcome of a task whose saved report stands for its item: ``computed`` when this run computed it
    already (the task ran twice: computed once), else ``skipped`` (recorded)."""
    fingerprint = saved.summary.weights_fingerprint
    digest = files.report_digest()
    rec, _ = files.read_record()
    if (
        rec is not None
        and rec.get("run") == at.task.run
        and rec.get("status") == "computed"
        and rec.get("report_sha256") == digest
    ):  # this run computed it already (the task ran twice): computed once
        return at.row("computed", str(rec["reason"]), digest, fingerprint)
    out = at.row("skipped", "saved report matches the weights and options", digest, fingerprint)
    files.write_record(out, at.task.item)
    return out


def _save(at: _Attempt, files: ItemFiles, rep: IdempotenceReport, reason: str) -> dict[str, Any]:
    """Save a measured report to a temporary folder, record it, then put it at ``OUT/<dir>`` in one step (THE store's
    :func:`~tl_idempotence.core.store.install_folder`: an atomic exchange with an earlier report where the system
    offers one, else two renames whose gap readers see through, :func:`~tl_idempotence.core.store.saved_folder`)."""
    tmp = files.out / f"{TMP_PREFIX}{at.task.dirname}-{uuid.uuid4().hex[:8]}"
    try:
        rep.save(tmp)
        out = at.row("computed", reason, sha256_file(tmp / RECORD), rep.summary.weights_fingerprint)
        # recorded before it is put in place: a death in between leaves a record that does not describe OUT/<dir>,
        # so the next attempt computes again
        files.write_record(out, at.task.item)
        install_folder(tmp, files.target, replace=files.target.exists())
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out
