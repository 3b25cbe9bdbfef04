"""Many models or checkpoints, one report each, saved as it finishes: as tasks on a Dask cluster, or as
the tasks of a scheduler's job array with no Dask at all.

:func:`sweep` runs one task per item on Dask's distributed scheduler (``dask``,
``distributed``): ``client=None`` starts a ``LocalCluster`` sized to this machine (one worker
process per core, one thread each) and closes it afterwards; any ``distributed.Client`` works,
so the same call runs on a SLURM/PBS cluster through ``dask-jobqueue`` or on a Kubernetes Dask
cluster (``docs/sweeps.md``). Each task opens its own source on the worker — a checkpoint path
is streamed layer by layer, a zoo name is read from the zoo's cached checkpoint files, a
zero-argument callable is called there; no model object travels between processes — and
writes its finished report to ``OUT/<dir>/`` in the report's save format (parquet + JSON,
:mod:`tl_idempotence.report.store`). The call returns the combined :func:`compare` result.

:func:`run_sweep_item` is one task of a job array (``tl-idempotence sweep ITEMS --out DIR
--task-index I``): it measures item ``I`` in this process and exits; :func:`load_sweep` (``--collect``)
reads the folder back into the same :class:`SweepResult`, naming the items still missing.

How an item's outcome is decided. Every task works on its item under a per-item lock
(``OUT/.tli-items/<dir>/lock``; array tasks on one ``OUT`` never wait for each other) and leaves its
outcome on disk: a record ``OUT/.tli-items/<dir>/record.json`` (status, reason, the sweep run it belongs
to, and the sha256 of the ``report.json`` it describes) and, while it runs, a start marker. A Dask sweep
takes an item's outcome from its task's own result, or — when a worker died and the result never came —
from that record and the markers, never from a future's status after Dask rescheduled the task:

* a record of this run describing the report now in ``OUT/<dir>`` means the item is done (a task that ran
  twice is "computed" once: the second run finds the first one's report and record);
* a start marker of the attempt that never ended means its worker died while measuring it: the item is
  retried (``retries``), then listed in ``SweepResult.failed`` as ``WorkerDied`` with the exit code when
  the worker's nanny logged it;
* neither means the task only waited on the worker that died: it is resubmitted, not charged.

Rerunning with the same ``OUT`` is cheap and never stale. A task first compares the saved
report with the item's *current* content (the report-identity check,
:func:`~tl_idempotence.report.identity.report_mismatch`): the checkpoint or zoo model it was read
from, the saved options (threshold, nulls, seed, search,
algebra, compute dtype, layers, device) and, layer by layer, the sha256 fingerprint of the
attention weights it reads now (:meth:`~tl_idempotence.core.heads.LayerHeads.fingerprint`,
one pass over the O and V bytes, no analysis run) against the fingerprints the saved report
records. It skips the item only when every one matches; otherwise — other options, changed
weights, a folder without ``report.json`` or with a file that does not match its recorded
sha256 (an interrupted or damaged save) — it recomputes. A report is written to a temporary
folder and renamed into place, so ``OUT/<dir>`` never holds a half-written report.

``OUT/sweep.json`` is the plan: one list of items per folder. A task (or a Dask sweep) given other items
is refused with the plan left as it is, unless ``replan=True``; :func:`load_sweep` checks each item's
saved report against the plan's item (its checkpoint or zoo name) and the weights fingerprint its task
recorded, so another item's report in its folder is listed as failed, never as its result.

The numbers are those of :func:`~tl_idempotence.report.report.idempotence_report` run on the
item in one process — bit for bit when that process uses as many torch threads as a worker
(Dask starts workers with ``OMP_NUM_THREADS=1``); multi-threaded float64 products can differ in
the last bits (measured on SmolLM2-135M: at most 2.5e-16, P identical).

``OUT`` must be one folder that the workers (or array tasks) and this process all see (on a cluster: a
shared filesystem with working file locks). One Dask sweep at a time per ``OUT`` (``OUT/.tli-sweep.lock``).

:func:`run_trajectory_on_cluster` is the same runner (:mod:`tl_idempotence.studies.cluster`) for
:func:`tl_idempotence.studies.trajectory.trajectory` (``client=...``).
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
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import pandas as pd

from ..core.files import atomic_write_text, check_work_folder, read_json, refuse_outputs_over_inputs, sha256_file
from ..core.option_specs import ReportOptionsArgs, documents_options
from ..core.options import (
    ReportOptions,
    check_bool,
    check_device,
    check_device_name,
    check_int,
    strict_kwargs,
)
from ..errors import (
    ClusterError,
    MissingFileError,
    OptionError,
    OptionTypeError,
    ReportFileError,
    ReportMismatchError,
    TLIError,
)
from ..report.identity import Origin, describe_report, option_differences, origin_of, report_mismatch
from ..report.report import IdempotenceReport, load_report, report_with_options
from ..report.store import RECORD
from ..report.summary import versions
from .cluster import (
    DEFAULT_WORKER_TIMEOUT,
    Job,
    Outcome,
    Probe,
    check_main_guard,
    local_cluster,
    machine_cores,
    run_jobs,
)
from .compare import (
    Comparison,
    Item,
    item_inputs,
    measure_item,
    open_item,
    resolve_items,
)

if TYPE_CHECKING:  # pragma: no cover
    from collections.abc import Callable
    from typing import TypeAlias

    from typing_extensions import Unpack

    from ..core.hints import ClientLike, IntLike, ModelLike, PathLike

    #: One item of a sweep: a checkpoint path, a zoo name, or a zero-argument callable (run on the worker) returning
    #: a model, a source or a path.
    SweepItem: TypeAlias = PathLike | Callable[[], ModelLike]
    #: The items of a sweep: one item, a sequence of items, or ``{label: item}``.
    SweepItems: TypeAlias = SweepItem | Sequence[SweepItem] | Mapping[str, SweepItem] | Mapping[int, SweepItem]

__all__ = [
    "ARRAY_INDEX_VARIABLES",
    "ITEMS_DIR",
    "LOCK_NAME",
    "RECORD_NAME",
    "RESERVED_NAMES",
    "SWEEP_ITEM_KINDS",
    "SweepPlan",
    "SweepResult",
    "SweepTask",
    "array_task_index",
    "cache_name",
    "check_cluster_trajectory",
    "item_dirname",
    "item_origin",
    "load_sweep",
    "read_sweep_plan",
    "run_sweep_item",
    "run_sweep_task",
    "run_trajectory_on_cluster",
    "saved_report_matches",
    "sweep",
]

#: Item kinds a sweep accepts: things a worker can open by itself.
SWEEP_ITEM_KINDS = ("path", "zoo", "callable")
#: The sweep's own record in ``OUT``: the plan (labels, folders, options), and after a Dask sweep what happened.
RECORD_NAME = "sweep.json"
#: Lock file that keeps two Dask sweeps from writing one ``OUT`` at once (array tasks take only item locks).
LOCK_NAME = ".tli-sweep.lock"
#: Folder of ``OUT`` with each item's lock, task record and start markers (``OUT/.tli-items/<dir>/``).
ITEMS_DIR = ".tli-items"
#: Environment variables a job array's task index is read from, in this order, with the index of the
#: first item: SLURM and PBS count items from 0 (``--array=0-7``, ``-J 0-7``); LSF and SGE from 1
#: (``-J "tli[1-8]"``, ``-t 1-8``: item ``index - 1``). LSF sets 0 and SGE "undefined" outside an array.
ARRAY_INDEX_VARIABLES = (
    ("SLURM_ARRAY_TASK_ID", 0),
    ("PBS_ARRAY_INDEX", 0),
    ("PBS_ARRAYID", 0),
    ("LSB_JOBINDEX", 1),
    ("SGE_TASK_ID", 1),
)
_PLAN_FORMATS = ("tl_idempotence.sweep/1", "tl_idempotence.sweep/2")
_ITEM_FORMAT = "tl_idempotence.sweep-item/1"
_TMP_PREFIX = ".tli-tmp-"
_OLD_PREFIX = ".tli-old-"
_SAFE = re.compile(r"[^A-Za-z0-9._-]+")
_MARKER = re.compile(r"^started-([0-9a-f]{12})-(\d+)-([0-9a-f]{8})\.json$")
#: Default number of retries of a failed task (so up to 3 attempts).
DEFAULT_RETRIES = 2
#: ``SweepResult.tasks`` columns, in order.
TASK_COLUMNS = ["label", "dir", "status", "reason", "device", "seconds", "host", "pid", "attempts"]


def item_dirname(label: str) -> str:
    """A filesystem-safe folder name for a label: characters other than ``A-Za-z0-9._-`` become ``_``,
    leading dots and dashes are dropped, at most 100 characters.

    Raises:
        OptionError: nothing usable is left (e.g. ``"..."``).
    """
    name = _SAFE.sub("_", label).lstrip(".-")[:100]
    if not name or name in (".", ".."):
        raise OptionError(f"Label {label!r} leaves no usable folder name; give a label with letters or digits.")
    return name


#: Names in ``OUT`` that the sweep itself writes (compared case-insensitively): no item folder may take them.
RESERVED_NAMES = ("sweep", "sweep.json", "tli-sweep.lock", "tli-items")


def _dirnames(items: Sequence[Item]) -> list[str]:
    """Each item's folder under ``OUT``; refuses labels with path separators, reserved names and collisions.

    Raises:
        OptionError: a label holding ``/`` or ``\\`` (a sweep label names one folder, never a path), a label
            whose folder would be a name the sweep writes itself (:data:`RESERVED_NAMES`, case ignored: the
            record ``sweep.json``, the lock), two labels mapping to one folder (case ignored, for macOS and
            Windows filesystems).
    """
    for it in items:
        if "/" in it.label or "\\" in it.label or "\x00" in it.label:
            raise OptionError(
                f"Sweep label {it.label!r} holds a path separator: a label names one folder under out, not a path. "
                "Give the items as a dict {label: item} with labels such as 'pythia-70m_step1000'."
            )
    names = [item_dirname(it.label) for it in items]
    for it, name in zip(items, names):
        if name.lower() in RESERVED_NAMES or name.lower().startswith(("tli-tmp-", "tli-old-")):
            raise OptionError(
                f"Sweep label {it.label!r} would use the folder {name!r}, a name the sweep keeps for itself "
                f"({', '.join(RESERVED_NAMES)}, case ignored): give it another label."
            )
    seen: dict[str, str] = {}
    for it, name in zip(items, names):
        other = seen.setdefault(name.lower(), it.label)  # case-insensitive filesystems (macOS, Windows)
        if other != it.label:
            raise OptionError(
                f"Labels {other!r} and {it.label!r} map to the same folder {name!r} (characters other than "
                "A-Za-z0-9._- become '_', case is ignored): give them distinct labels."
            )
    return names


def item_origin(item: Item) -> Origin | None:
    """What a report of ``item`` records as its origin (:func:`~tl_idempotence.report.identity.origin_of`),
    known without opening it: a checkpoint path's folder or file name (a ``.safetensors``/``config.json`` file
    names its folder, :func:`~tl_idempotence.sources.names.checkpoint_of`), a zoo name; None for a callable
    (what it returns is known only once it runs)."""
    from ..sources.names import checkpoint_of

    if item.kind == "path":
        return Origin("checkpoint", checkpoint_of(Path(item.value)).name)
    if item.kind == "zoo":
        return Origin("zoo model", str(item.value))
    return None


def _absolute(item: Item) -> Item:
    """A path item with an absolute path (workers and array tasks may start in another folder)."""
    if item.kind == "path":
        return Item(item.label, item.kind, Path(item.value).absolute())
    return item


# --------------------------------------------------------------------------- one item's files in OUT


class _ItemFiles:
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
            rec = read_json(self.record_path, ReportFileError, "sweep task record")
        except ReportFileError as e:
            return None, str(e)
        ok = (
            isinstance(rec, dict)
            and rec.get("format") == _ITEM_FORMAT
            and rec.get("dir") == self.dirname
            and rec.get("status") in ("computed", "skipped", "failed")
            and isinstance(rec.get("run"), str)
            and isinstance(rec.get("reason"), str)
        )
        if not ok:
            return None, f"the task record {self.record_path} is not one this version writes (ignored)"
        return rec, None

    def write_record(self, row: Mapping[str, Any], item: Item) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        rec = {"format": _ITEM_FORMAT, "item": item.describe(), "time": time.time(), **row}
        atomic_write_text(self.record_path, json.dumps(rec, indent=1, default=str))

    def report_digest(self) -> str | None:
        """sha256 of ``OUT/<dir>/report.json`` (it holds the sha256 of every table: it keys the whole report)."""
        try:
            return sha256_file(self.target / RECORD)
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
        atomic_write_text(path, json.dumps({**info, "started": time.time()}))
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
            died.append(_marker_text(info))
            p.unlink(missing_ok=True)
        return died

    def clean_leftovers(self) -> None:
        """Temporary folders of this item left by a killed task (never another item's, never a finished report)."""
        pattern = re.compile(
            rf"^(?:{re.escape(_TMP_PREFIX)}|{re.escape(_OLD_PREFIX)}){re.escape(self.dirname)}-[0-9a-f]{{8}}$"
        )
        for p in self.out.iterdir():
            if pattern.match(p.name) and p.is_dir():
                shutil.rmtree(p, ignore_errors=True)


def _marker_text(info: Mapping[str, Any]) -> str:
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


def _task_options(task: SweepTask) -> ReportOptions:
    return ReportOptions.at_device(task.options, task.device)


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
    return _saved_report(folder, source, options)[1]


def _saved_report(
    folder: str | os.PathLike[str], source: Any, options: ReportOptions
) -> tuple[IdempotenceReport | None, str | None]:
    """``(the saved report, None)`` when it stands for ``source`` (:func:`saved_report_matches`), else
    ``(the report or None, why not)``."""
    from ..sources.dispatch import head_source

    d = Path(folder)
    if not (d / RECORD).is_file():
        return None, f"no {RECORD}"
    try:
        rep = load_report(d)
    except (TLIError, OSError) as e:
        return None, f"the saved report is unreadable ({type(e).__name__}: {e})"
    saved_v = rep.summary.get("versions") or {}
    now_v = versions()
    for key in ("tl_idempotence", "tl_idempotence_code"):
        if saved_v.get(key) != now_v.get(key):
            return rep, f"made by another tl_idempotence ({key} {saved_v.get(key)!r} -> {now_v.get(key)!r})"
    src = head_source(source)
    origin = origin_of({"processing": src.info.processing})
    return rep, report_mismatch(rep, origin=origin, options=options, source=src)


def _our_files_only(d: Path) -> bool:
    """Whether a folder holds only what a report save writes (parquet tables, report.json, temp files)."""
    for p in d.iterdir():
        if p.is_dir() or not (p.suffix == ".parquet" or p.name == RECORD or ".tmp" in p.name):
            return False
    return True


def _install(tmp: Path, target: Path) -> None:
    """Put the finished report folder ``tmp`` at ``target`` (renames; the old copy is removed last)."""
    old = None
    if target.exists():
        old = target.with_name(f"{_OLD_PREFIX}{target.name}-{uuid.uuid4().hex[:8]}")
        os.replace(target, old)
    os.replace(tmp, target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


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
    opts = _task_options(task)
    files = _ItemFiles(Path(task.out), task.dirname)
    lock = files.lock(wait)
    try:
        marker = files.start(task.run, attempt)
        try:
            return _run_locked(task, attempt, opts, files, t0)
        finally:
            with contextlib.suppress(OSError):
                marker.unlink()
    finally:
        lock.release()


def _run_locked(task: SweepTask, attempt: int, opts: ReportOptions, files: _ItemFiles, t0: float) -> dict[str, Any]:
    def row(status: str, reason: str, digest: str | None, fingerprint: Any = None) -> dict[str, Any]:
        return {
            **_task_record(task, status, reason, t0),
            "run": task.run,
            "attempt": attempt,
            "report_sha256": digest,
            "weights_fingerprint": fingerprint,  # what load_sweep checks OUT/<dir>'s report against
        }

    earlier = files.clear_stale_markers(task.run)
    files.clean_leftovers()
    target = files.target
    try:
        if target.exists() and (not target.is_dir() or not _our_files_only(target)):
            raise OptionError(
                f"{target} (the folder of item {task.item.label!r}) exists and holds files that are not a saved "
                "report; move them away or choose another out folder (nothing was computed)."
            )
        reason = "no saved report"
        src = None
        if target.exists():
            src = open_item(task.item)
            saved, why = _saved_report(target, src, opts)
            if why is None:
                assert saved is not None
                fingerprint = saved.summary.get("weights_fingerprint")
                digest = files.report_digest()
                rec, _ = files.read_record()
                if (
                    rec is not None
                    and rec.get("run") == task.run
                    and rec.get("status") == "computed"
                    and rec.get("report_sha256") == digest
                ):  # this run computed it already (the task ran twice): computed once
                    return row("computed", str(rec["reason"]), digest, fingerprint)
                out = row("skipped", "saved report matches the weights and options", digest, fingerprint)
                files.write_record(out, task.item)
                return out
            reason = why
        if earlier:
            reason += f" (an earlier attempt {'; '.join(earlier)})"
        rep = measure_item(task.item, opts, source=src)
        del src
        tmp = files.out / f"{_TMP_PREFIX}{task.dirname}-{uuid.uuid4().hex[:8]}"
        try:
            rep.save(tmp)
            out = row("computed", reason, sha256_file(tmp / RECORD), rep.summary.get("weights_fingerprint"))
            files.write_record(out, task.item)  # before the rename: a death in between leaves a record that
            _install(tmp, target)  # does not describe OUT/<dir>, so the next attempt computes again
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
        return out
    except Exception as e:
        failed = {**row("failed", f"{type(e).__name__}: {e}", None), "error_type": type(e).__name__, "message": str(e)}
        with contextlib.suppress(OSError):
            files.write_record(failed, task.item)
        raise


def _task_record(task: SweepTask, status: str, reason: str, t0: float) -> dict[str, Any]:
    """The row of ``SweepResult.tasks`` for a task that ran (``device`` is filled from the saved report)."""
    return {
        "label": task.item.label,
        "dir": task.dirname,
        "status": status,
        "reason": reason,
        "seconds": time.perf_counter() - t0,
        "host": socket.gethostname(),
        "pid": os.getpid(),
    }


def _probe(out: Path, run: str) -> Callable[[Job, int], Probe]:
    """What the disk says about an attempt of a sweep task that ended without a result (module docstring)."""

    def probe(job: Job, attempt: int) -> Probe:
        task: SweepTask = job.args[0]
        files = _ItemFiles(out, task.dirname)
        rec, _ = files.read_record()
        if (
            rec is not None
            and rec.get("run") == run
            and rec.get("status") in ("computed", "skipped")
            and rec.get("report_sha256") == files.report_digest()
        ):
            return Probe(done=True, value={k: rec.get(k) for k in (*TASK_COLUMNS, "run", "attempt", "report_sha256")})
        died = []
        for path, info in files.markers():
            if info.get("run") == run and info.get("attempt") == attempt:
                pid = info.get("pid")
                died.append(
                    (str(info.get("host", "")), pid if isinstance(pid, int) else -1, str(info.get("worker", "")))
                )
                path.unlink(missing_ok=True)
        return Probe(died=tuple(died))

    return probe


# --------------------------------------------------------------------------- the result


class SweepResult(Comparison):
    """Result of :func:`sweep` and :func:`load_sweep`: the
    :class:`~tl_idempotence.studies.compare.Comparison` of every item that finished, plus what happened
    to each task.

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

    repr_keys: ClassVar[tuple[str, ...]] = (
        "n_models",
        "n_computed",
        "n_skipped",
        "n_failed",
        "n_missing",
        "threshold",
        "n_closed",
        "min_pct_closed",
        "max_pct_closed",
    )

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
        self.inputs = (*self.inputs, ("the sweep folder", Path(out).absolute()))  # no page over its plan or reports
        self.device = device
        self.out = out
        self.tasks = tasks
        self.failed = failed
        self.missing = missing if missing is not None else pd.DataFrame(columns=["label", "dir", "item", "reason"])
        self.seconds = seconds

    @property
    def summary(self) -> dict[str, Any]:
        """The comparison's summary plus ``device`` (the device type of the reports, or the one asked),
        ``n_computed, n_skipped, n_failed, n_missing, seconds``."""
        st = self.tasks["status"] if len(self.tasks) else pd.Series([], dtype=str)
        return {
            **super().summary,
            "device": self.options.device.type,
            "n_computed": int((st == "computed").sum()),
            "n_skipped": int((st == "skipped").sum()),
            "n_failed": int((st == "failed").sum()),
            "n_missing": int((st == "missing").sum()),
            "seconds": self.seconds,
        }


@dataclass(frozen=True)
class _Entry:
    """One item of a sweep as the result lists it (``origin``: what its report must record, :func:`item_origin`)."""

    label: str
    dir: str
    item: str
    origin: Origin | None = None


def _entry(task: SweepTask) -> _Entry:
    return _Entry(task.item.label, task.dirname, task.item.describe(), item_origin(task.item))


def _result(
    d: Path,
    entries: Sequence[_Entry],
    reports: dict[str, IdempotenceReport],
    rows: dict[str, dict[str, Any]],
    failures: dict[str, dict[str, Any]],
    missing: dict[str, str],
    record: dict[str, Any],
    device_name: str,
    seconds: float,
    what: str,
) -> SweepResult:
    """The :class:`SweepResult` of a sweep's outcome (one row per entry in ``rows``), with its warnings."""
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
    if len(failed_df):
        warnings.warn(
            f"{len(failed_df)} of {len(entries)} sweep items failed{what}: "
            + "; ".join(f"{r.label}: {r.error_type}: {r.message[:200]}" for r in failed_df.itertuples())
            + " (listed in SweepResult.failed; every other result is kept).",
            UserWarning,
            stacklevel=4,
        )
    if len(missing_df):
        warnings.warn(
            f"{len(missing_df)} of {len(entries)} sweep items have no report yet: "
            + "; ".join(f"{r.label}: {r.reason[:200]}" for r in missing_df.itertuples())
            + " (listed in SweepResult.missing).",
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


def _load_finished(d: Path, entry: _Entry, digest: str | None, host: Any) -> IdempotenceReport | str:
    """The report a task wrote, or why it cannot be used (replaced meanwhile, unreadable)."""
    files = _ItemFiles(d, entry.dir)
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


# --------------------------------------------------------------------------- checks shared by the entry points


def _check_worker_timeout(x: Any) -> float | None:
    if x is None:
        return None
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise OptionTypeError(f"worker_timeout must be a number of seconds or None; got {type(x).__name__}.")
    if not (1 <= float(x) <= 7 * 24 * 3600):  # also refuses nan
        raise OptionError(f"worker_timeout must be in [1, 604800] seconds (or None to wait); got {x!r}.")
    return float(x)


@contextlib.contextmanager
def _cluster(client: Any, scheduler: str | None, n_workers: int) -> Iterator[tuple[Any, Any]]:
    """``(client, our LocalCluster or None)``: the given client, one connected to ``scheduler``, or a
    LocalCluster's (closed at exit)."""
    if client is not None:
        yield client, None
        return
    if scheduler is not None:
        from distributed import Client

        try:
            own = Client(scheduler)
        except (OSError, ValueError, TimeoutError) as e:
            raise OptionError(
                f"Cannot connect to the Dask scheduler at scheduler={scheduler!r} ({type(e).__name__}: {e}). Give the "
                "address of a running scheduler, e.g. 'tcp://host:8786' (see docs/sweeps.md)."
            ) from e
        try:
            yield own, None
        finally:
            own.close()
        return
    with local_cluster(n_workers, "tli.sweep()") as (own, cluster):
        yield own, cluster


def _check_client(client: Any) -> None:
    if client is None:
        return
    if not all(hasattr(client, m) for m in ("submit", "gather")):
        raise OptionTypeError(
            f"client must be a distributed.Client (or None for a LocalCluster); got {type(client).__name__}."
        )


def _prepare_out(out: Any) -> Path:
    d = check_work_folder(out, "out")
    try:
        d.mkdir(exist_ok=True)
    except OSError as e:
        raise OptionError(f"Cannot create the sweep folder {d}: {e.strerror or e}.") from e
    if not os.access(d, os.W_OK):
        raise OptionError(f"The sweep folder {d} is not writable.")
    return d


# --------------------------------------------------------------------------- the plan (OUT/sweep.json)


@dataclass(frozen=True)
class SweepPlan:
    """What ``OUT/sweep.json`` says a sweep is: its items and options (:func:`read_sweep_plan`).

    Attributes:
        path: the ``sweep.json`` file.
        items: ``(label, dir, item)`` per item, in order (``item``: the item in words, e.g. ``path /abs/ckpt``).
        options: the report options without the device (``ReportOptions.as_dict()`` keys).
        device_asked: the device the sweep asked for (``"cpu"``, ``"cuda"``, ``"auto"``, ...).
        origins: per item, what its report must record as its origin (:func:`item_origin`: the checkpoint's
            folder or file name, the zoo name; None for a callable, or a plan written before origins were kept).
    """

    path: Path
    items: tuple[tuple[str, str, str], ...]
    options: dict[str, Any]
    device_asked: str
    origins: tuple[Origin | None, ...] = ()


def _plan_record(entries: Sequence[_Entry], record: dict[str, Any], device_name: str) -> dict[str, Any]:
    items = []
    for e in entries:
        it: dict[str, Any] = {"label": e.label, "dir": e.dir, "item": e.item}
        if e.origin is not None:
            it["origin"] = {"kind": e.origin.kind, "name": e.origin.name}
        items.append(it)
    return {"format": _PLAN_FORMATS[-1], "options": dict(record), "device_asked": device_name, "items": items}


def read_sweep_plan(out: Any) -> SweepPlan:
    """The plan of the sweep in ``out`` (its ``sweep.json``), checked.

    Raises:
        MissingFileError: ``out`` is not a folder, or holds no ``sweep.json`` (no sweep task has started there).
        ReportFileError: a ``sweep.json`` that is not one (malformed, another format, an item folder that is not
            its label's safe name — e.g. ``../x`` —, repeated folders, invalid options); names the file.
        OptionTypeError: ``out`` is not a path.
    """
    if not isinstance(out, (str, os.PathLike)):
        raise OptionTypeError(f"out must be a folder path; got {type(out).__name__}.")
    d = Path(out).expanduser()
    if not d.is_dir():
        raise MissingFileError(f"{d} is not a folder: no sweep to read there.")
    path = d / RECORD_NAME
    if not path.is_file():
        raise MissingFileError(
            f"{path} does not exist: no sweep has started in {d} (every sweep and array task writes it first)."
        )
    rec = read_json(path, ReportFileError, "sweep record")

    def bad(why: str) -> ReportFileError:
        return ReportFileError(
            f"Sweep record {path} {why}; it cannot say what the sweep is. Rerun a task to rewrite it."
        )

    if not isinstance(rec, dict) or rec.get("format") not in _PLAN_FORMATS:
        raise bad(f"is not a sweep record of a known format ({', '.join(_PLAN_FORMATS)})")
    raw_items = rec.get("items")
    if not isinstance(raw_items, list) or not raw_items:
        raise bad("has no list of items")
    items = []
    origins: list[Origin | None] = []
    for it in raw_items:
        if not (isinstance(it, dict) and all(isinstance(it.get(k), str) for k in ("label", "dir", "item"))):
            raise bad("has an item without a label, dir and item text")
        origin = it.get("origin")
        if origin is None:
            origins.append(None)
        elif (
            isinstance(origin, dict)
            and origin.get("kind") in ("checkpoint", "zoo model")
            and isinstance(origin.get("name"), str)
            and origin["name"]
        ):
            origins.append(Origin(origin["kind"], origin["name"]))
        else:
            raise bad(f"gives item {it['label']!r} an origin that is not a checkpoint or zoo model name")
        try:
            safe = item_dirname(it["label"])
        except OptionError:
            safe = None
        if it["dir"] != safe:
            raise bad(f"gives item {it['label']!r} the folder {it['dir']!r}, not its label's folder {safe!r}")
        items.append((it["label"], it["dir"], it["item"]))
    if len({i[1].lower() for i in items}) != len(items):
        raise bad("lists one folder twice")
    options = rec.get("options")
    device = rec.get("device_asked", "cpu")
    if not isinstance(options, dict) or not isinstance(device, str):
        raise bad("has no options")
    record = {k: v for k, v in options.items() if k != "device"}
    try:
        ReportOptions.from_record({**record, "device": "cpu"})
        check_device_name(device)
    except TLIError as e:
        raise bad(f"holds options that are not valid ({e})") from e
    return SweepPlan(path=path, items=tuple(items), options=record, device_asked=device, origins=tuple(origins))


def _item_differences(plan: SweepPlan, entries: Sequence[_Entry]) -> str | None:
    """What differs between a plan's items and the items given (labels, folders, what each item is), or None."""
    given = [(e.label, e.dir, e.item) for e in entries]
    if list(plan.items) == given:
        return None
    have = {i[0]: i for i in plan.items}
    want = {i[0]: i for i in given}
    only_plan = [lab for lab in have if lab not in want]
    only_given = [lab for lab in want if lab not in have]
    changed = [lab for lab in want if lab in have and have[lab] != want[lab]]
    parts = []
    if only_plan:
        parts.append(f"items only in the folder's sweep: {only_plan[:5]}")
    if only_given:
        parts.append(f"items only given now: {only_given[:5]}")
    if changed:
        lab = changed[0]
        parts.append(f"item {lab!r} is {have[lab][2]!r} there and {want[lab][2]!r} now")
    if not parts:
        parts.append("the items are in another order")
    return "; ".join(parts)


def _plan_matches(plan: SweepPlan, entries: Sequence[_Entry], record: dict[str, Any], device_name: str) -> list[str]:
    """What differs between a plan and the items and options given (empty: the same sweep)."""
    diff = []
    items = _item_differences(plan, entries)
    if items is not None:
        diff.append(items)
    for k in sorted(set(plan.options) | set(record)):
        if plan.options.get(k) != record.get(k):
            diff.append(f"{k} {plan.options.get(k)!r} there, {record.get(k)!r} now")
    if plan.device_asked != device_name:
        diff.append(f"device {plan.device_asked!r} there, {device_name!r} now")
    return diff


@contextlib.contextmanager
def _plan_lock(d: Path) -> Iterator[None]:
    """The lock under which ``OUT/sweep.json`` is read and written (``OUT/.tli-items/.plan.lock``: no item
    folder starts with a dot), so that two tasks given different items cannot both find no plan and write theirs.

    Raises:
        OptionError: the filesystem of ``OUT`` has no file locks.
    """
    from filelock import FileLock

    folder = d / ITEMS_DIR
    folder.mkdir(exist_ok=True)
    lock = FileLock(str(folder / ".plan.lock"))
    try:
        lock.acquire(poll_interval=0.1)
    except NotImplementedError as e:
        raise OptionError(
            f"The filesystem of {d} does not support file locks ({e}); sweep tasks need them to share the folder. "
            "Use a folder on a filesystem with locks (NFSv4, GPFS, Lustre mounted with -o flock)."
        ) from e
    try:
        yield
    finally:
        lock.release()


def _write_plan(d: Path, entries: Sequence[_Entry], record: dict[str, Any], device_name: str, replan: bool) -> None:
    """Write ``OUT/sweep.json`` unless it already holds this plan (array tasks all write the same one).

    A plan of the same items with other options or device is rewritten (the items' reports are then
    recomputed with the new ones); a plan that cannot be read is rewritten; a plan of *other items* is refused
    unless ``replan`` (the file is left as it is).

    Raises:
        OptionError: ``OUT/sweep.json`` is the plan of other items and ``replan`` is False (says what differs);
            the filesystem has no file locks.
    """
    with _plan_lock(d):
        plan: SweepPlan | None = None
        with contextlib.suppress(TLIError, OSError):  # none yet, or one that lies: written anew
            plan = read_sweep_plan(d)
        if plan is not None:
            items = _item_differences(plan, entries)
            if items is not None and not replan:
                raise OptionError(
                    f"{plan.path} is the plan of a sweep of other items ({items}): nothing was measured and "
                    f"{RECORD_NAME} is unchanged. Give every task of the sweep the same items, use another out "
                    "folder for another list, or pass replan=True (CLI: --replan) to make these items the "
                    "folder's plan (items no longer listed then drop out of load_sweep / --collect)."
                )
            if not _plan_matches(plan, entries, record, device_name) and plan.origins == tuple(
                e.origin for e in entries
            ):
                return
        atomic_write_text(d / RECORD_NAME, json.dumps(_plan_record(entries, record, device_name), indent=1))


def _write_record(d: Path, result: SweepResult, entries: Sequence[_Entry], record: dict[str, Any]) -> None:
    """The plan plus what a Dask sweep ended with (statuses, each report's device, what failed); not written
    (with a warning) when ``sweep.json`` was replanned with other items while the sweep ran."""
    from ..report.parts import json_safe

    rec = _plan_record(entries, record, result.device)
    rec["options"] = result.options.as_dict()
    for item, status, dev in zip(rec["items"], result.tasks["status"], result.tasks["device"]):
        item.update(status=status, device=dev)
    rec["failed"] = result.failed.to_dict(orient="records")
    with _plan_lock(d):
        plan: SweepPlan | None = None
        with contextlib.suppress(TLIError, OSError):
            plan = read_sweep_plan(d)
        items = None if plan is None else _item_differences(plan, entries)
        if items is not None:
            warnings.warn(
                f"{d / RECORD_NAME} was replanned with other items while this sweep ran ({items}); it is left as "
                "it is (this sweep's outcome is the result returned).",
                UserWarning,
                stacklevel=3,
            )
            return
        atomic_write_text(d / RECORD_NAME, json.dumps(json_safe(rec), indent=1))


# --------------------------------------------------------------------------- the Dask driver


#: sweep's own parameters (suggested, with the options, for a misspelled keyword).
_SWEEP_PARAMETERS = (
    "items",
    "out",
    "client",
    "scheduler",
    "workers",
    "oversubscribe",
    "retries",
    "worker_timeout",
    "progress",
    "replan",
)


@documents_options
def sweep(
    items: SweepItems,
    out: PathLike,
    client: ClientLike | None = None,
    *,
    scheduler: str | None = None,
    workers: IntLike | None = None,
    oversubscribe: bool = False,
    retries: IntLike = DEFAULT_RETRIES,
    worker_timeout: float | None = DEFAULT_WORKER_TIMEOUT,
    progress: bool = True,
    replan: bool = False,
    **options: Unpack[ReportOptionsArgs],
) -> SweepResult:
    """Measure many models or checkpoints as tasks on a Dask cluster; save each report; compare them.

    Each item is one task that opens its own source on the worker and writes ``out/<dir>/`` in the
    report save format; a rerun skips an item whose saved report matches its current weights
    (per-layer sha256 fingerprints, read from the item now) and the options, and recomputes anything
    else. An item's outcome is decided from its task's result and the files it left (module
    docstring): a worker that dies is an ordinary event — the item it was measuring is retried, then
    listed in ``.failed`` (``WorkerDied``, with the exit code when known); an item that only waited on
    that worker is resubmitted; the sweep ends with :class:`~tl_idempotence.errors.ClusterError` when
    the cluster has had no worker for ``worker_timeout`` seconds. With ``client=None`` and
    ``scheduler=None`` a ``distributed.LocalCluster`` (worker processes, one thread each) is started
    and closed afterwards; a script that calls this needs the ``if __name__ == "__main__":`` guard
    (checked: a script without it gets a one-line ClusterError before anything starts).

    The CLI (``tl-idempotence sweep ITEM... --out DIR [--workers N] [--scheduler ADDRESS]``)
    calls ``sweep(items, out, scheduler=ADDRESS, workers=N, progress=True, **report_options)``.

    Every argument is validated here, where it enters.

    Args:
        items: a list of items or a dict ``{label: item}``; an item is a checkpoint directory or
            ``.gguf`` path, a zoo name (or ``"zoo:NAME"``), or a zero-argument callable returning
            a model / source / path (called on the worker; needs a label). Not a loaded model:
            nothing large travels between processes (use :func:`~tl_idempotence.studies.compare.compare`).
        out: the sweep folder (created). ``out/<dir>`` per item, ``dir`` the label made
            filesystem-safe (:func:`item_dirname`; two labels mapping to one folder are refused).
            Must be visible to the workers and to this process (a shared filesystem on a cluster).
        client: a ``distributed.Client``, or None.
        scheduler: the address of a running Dask scheduler (``"tcp://host:8786"``) to connect to
            instead of ``client`` (the connection is closed afterwards).
        workers: worker processes of the LocalCluster (default: min(items, cores); never more than the
            items); only without ``client``/``scheduler``; at most the cores this process may use unless
            ``oversubscribe=True``.
        oversubscribe: allow ``workers`` above the cores (each worker is a process with its own torch).
        retries: attempts after the first for an item whose task raised or whose worker died (0..100).
        worker_timeout: seconds the sweep waits while the cluster has no worker at all before it stops
            with ClusterError (1..604800; None waits indefinitely, e.g. while a batch queue starts workers).
        progress: a tqdm bar over tasks.
        replan: when ``out/sweep.json`` is the plan of other items (another list, other labels, another
            path for a label), make these items the folder's plan instead of refusing (items no longer
            listed drop out of :func:`load_sweep`; their folders stay on disk).
        **options: the report options (REPORT_OPTIONS_DOC).

    The options are the same for every item; ``device`` is resolved on the workers (with the LocalCluster,
    on this machine: checked here before the cluster starts).

    Returns:
        :class:`SweepResult`: the comparison of every item that finished (``.table``, ``.heads``,
        ``.reports``, ``.figure()``, ``.save_html()``), ``.tasks`` (computed / skipped / failed
        per item) and ``.failed`` (label, item, error type, message).

    Raises:
        OptionError / OptionTypeError / UnknownOptionError: bad items, labels or options, ``out``
            a file or not writable, ``client`` with ``scheduler``/``workers``, ``workers`` above the
            cores without ``oversubscribe``, another sweep running on ``out``, a folder ``out/<dir>``
            holding files that are not a report, a ``scheduler`` that cannot be reached, an ``out`` whose
            ``sweep.json`` is the plan of other items (without ``replan=True``; the file is left unchanged).
        DeviceError: with the LocalCluster, a device this machine does not have (before it starts).
        ClusterError: a script without the ``__main__`` guard (before anything starts), a LocalCluster
            whose workers cannot start, a cluster without workers for ``worker_timeout`` seconds.
        MissingFileError / UnknownModelError: an item path that does not exist, an unknown zoo name.

    Warns:
        UserWarning: items that failed (also in ``.failed``); models with processed or identical weights.
    """
    from filelock import FileLock, Timeout

    from ..core.progress import progress_bar

    t_start = time.perf_counter()
    progress = check_bool(progress, "progress")
    replan = check_bool(replan, "replan")
    retries = check_int(retries, "retries", 0, 100)
    oversubscribe = check_bool(oversubscribe, "oversubscribe")
    worker_timeout = _check_worker_timeout(worker_timeout)
    if workers is not None:
        workers = check_int(workers, "workers", 1, 4096)
        cores = machine_cores()
        if workers > cores and not oversubscribe:
            raise OptionError(
                f"workers={workers} is more worker processes than the {cores} cores this process may use (each worker "
                "is a process with its own torch); give workers <= cores, or oversubscribe=True "
                "(--oversubscribe) to go above."
            )
    _check_client(client)
    if client is not None and (scheduler is not None or workers is not None):
        raise OptionError("Give client, or scheduler, or workers (for a LocalCluster) — not several.")
    if scheduler is not None and workers is not None:
        raise OptionError("workers sizes a LocalCluster; with scheduler=... the cluster is sized where it runs.")
    if scheduler is not None and not isinstance(scheduler, str):
        raise OptionTypeError(f"scheduler must be an address such as 'tcp://host:8786'; got {scheduler!r}.")
    resolved = [_absolute(it) for it in resolve_items(items, allowed=SWEEP_ITEM_KINDS, what="sweep")]
    dirnames = _dirnames(resolved)
    record, device_name = ReportOptions.for_elsewhere("sweep()", options, _SWEEP_PARAMETERS)
    local = client is None and scheduler is None
    if local:  # the workers are on this machine: a device it lacks fails here, before a cluster starts
        check_device(device_name)
        check_main_guard("tli.sweep()")
    refuse_outputs_over_inputs([("out", out)], item_inputs(resolved))  # never an item's checkpoint folder
    d = _prepare_out(out)  # checked (check_work_folder) before it is created
    lock = FileLock(str(d / LOCK_NAME))
    try:
        lock.acquire(timeout=0)
    except Timeout as e:
        raise OptionError(
            f"Another sweep is writing {d} (lock {d / LOCK_NAME}); wait for it, or use another folder."
        ) from e
    try:
        for it, name in zip(resolved, dirnames):
            target = d / name
            if target.exists() and (not target.is_dir() or not _our_files_only(target)):
                raise OptionError(
                    f"{target} (the folder of item {it.label!r}) exists and holds files that are not a saved report; "
                    "move them away or choose another out folder (nothing was computed)."
                )
        run = uuid.uuid4().hex[:12]
        tasks = [SweepTask(it, name, str(d), record, device_name, run) for it, name in zip(resolved, dirnames)]
        entries = [_entry(t) for t in tasks]
        _write_plan(d, entries, record, device_name, replan)
        n_workers = min(workers if workers is not None else machine_cores(), len(tasks))
        label_of = {t.dirname: t.item.label for t in tasks}
        bar = progress_bar(total=len(tasks), desc="sweep", unit="task", enabled=bool(progress))

        def done(o: Outcome) -> None:
            bar.update(1)
            bar.set_postfix_str(label_of[o.name])

        try:
            with _cluster(client, scheduler, n_workers) as (cl, cluster):
                outcomes = run_jobs(
                    cl,
                    [Job(t.dirname, run_sweep_task, (t,)) for t in tasks],
                    retries=retries,
                    key_prefix="tli-sweep",
                    probe=_probe(d, run),
                    cluster=cluster,
                    worker_timeout=worker_timeout,
                    on_done=done,
                )
        finally:
            bar.close()
            for t in tasks:  # deaths that Dask retried by itself (a client's allowed-failures) left markers
                for path, info in _ItemFiles(d, t.dirname).markers():
                    if info.get("run") == run:
                        path.unlink(missing_ok=True)
        rows: dict[str, dict[str, Any]] = {}
        failures: dict[str, dict[str, Any]] = {}
        reports: dict[str, IdempotenceReport] = {}
        for t, ent in zip(tasks, entries):
            o = outcomes[t.dirname]
            if o.status == "ok":
                row = {k: o.value.get(k) for k in TASK_COLUMNS}
                row["attempts"] = o.attempts
                loaded = _load_finished(d, ent, o.value.get("report_sha256"), row.get("host"))
                if isinstance(loaded, IdempotenceReport):
                    reports[ent.label] = loaded
                    rows[ent.label] = row
                    continue
                failures[ent.label] = {
                    "label": ent.label,
                    "item": ent.item,
                    "error_type": "ReportFileError",
                    "message": loaded,
                }
                rows[ent.label] = {**row, "status": "failed", "reason": loaded}
                continue
            if o.status == "died":
                kind = "WorkerDied"
                msg = (
                    f"the worker process measuring it died ({'; '.join(o.deaths)}); {o.attempts} attempt(s), "
                    f"retries={retries}"
                )
                died = {"label": ent.label, "dir": ent.dir, "status": "failed", "reason": f"{kind}: {msg}", "run": run}
                with contextlib.suppress(OSError):  # the folder remembers it too (load_sweep); no task of it runs now
                    _ItemFiles(d, t.dirname).write_record(
                        {**died, "attempt": o.attempts, "report_sha256": None, "error_type": kind, "message": msg},
                        t.item,
                    )
            else:
                kind, msg = type(o.error).__name__, str(o.error)
            failures[ent.label] = {"label": ent.label, "item": ent.item, "error_type": kind, "message": msg}
            rows[ent.label] = {
                "label": ent.label,
                "dir": ent.dir,
                "status": "failed",
                "reason": f"{kind}: {msg}",
                "attempts": o.attempts,
            }
        result = _result(
            d,
            entries,
            reports,
            rows,
            failures,
            {},
            record,
            device_name,
            time.perf_counter() - t_start,
            f" after {retries} retries",
        )
        result.inputs = (*result.inputs, *item_inputs(resolved))  # result.save_html never over an item's files
        _write_record(d, result, entries, record)
        return result
    finally:
        lock.release()


# --------------------------------------------------------------------------- job arrays


def array_task_index(environ: Mapping[str, str] | None = None) -> tuple[int, str] | None:
    """The item index of this job-array task from the scheduler's environment, or None outside an array.

    Reads :data:`ARRAY_INDEX_VARIABLES` in order (``SLURM_ARRAY_TASK_ID``, ``PBS_ARRAY_INDEX``,
    ``PBS_ARRAYID``, ``LSB_JOBINDEX``, ``SGE_TASK_ID``); LSF's and SGE's indices count from 1.

    Returns:
        ``(index counted from 0, "NAME=value")`` of the first variable set.

    Raises:
        OptionError: a variable that is set but is not an index (or below its first index).
    """
    env = os.environ if environ is None else environ
    for name, first in ARRAY_INDEX_VARIABLES:
        raw = env.get(name, "").strip()
        if not raw or raw == "undefined" or (name == "LSB_JOBINDEX" and raw == "0"):
            continue
        try:
            value = int(raw)
        except ValueError:
            raise OptionError(f"{name}={raw!r} is not an array task index.") from None
        if value < first:
            raise OptionError(f"{name}={raw}: this scheduler's array indices start at {first}.")
        return value - first, f"{name}={raw}"
    return None


@documents_options
def run_sweep_item(
    items: Any,
    out: Any,
    index: Any = None,
    *,
    retries: int = DEFAULT_RETRIES,
    replan: bool = False,
    **options: Unpack[ReportOptionsArgs],
) -> dict[str, Any]:
    """One task of a job array: measure item ``index`` of ``items`` in this process, save it to
    ``out/<dir>/`` and return (``tl-idempotence sweep ITEMS --out DIR --task-index I``).

    Every task of the array is given the same ``items`` and options; each writes the same plan
    (``out/sweep.json``) and works only on its own item, under that item's lock, so tasks on one ``out``
    run concurrently without waiting for each other. The item is skipped when its saved report matches
    its current weights and options, as in :func:`sweep`. A task that raises is retried here ``retries``
    times; a task killed by the scheduler (wall time, memory) leaves a start marker that :func:`load_sweep`
    reports and the next run of the same index notes. :func:`load_sweep` reads the results back.

    Args:
        items, out: as for :func:`sweep` (no Dask: the items are opened in this process).
        index: the item's position in ``items`` (from 0). None: from the scheduler's environment
            (:func:`array_task_index`: ``SLURM_ARRAY_TASK_ID``, ``PBS_ARRAY_INDEX``, ``PBS_ARRAYID``,
            ``LSB_JOBINDEX`` - 1, ``SGE_TASK_ID`` - 1).
        retries: attempts after the first for a task that raises (0..100).
        replan: when ``out/sweep.json`` is the plan of other items, make these the folder's plan instead of
            refusing (as for :func:`sweep`; the tasks of one array all get the same items, so this is for a
            deliberate new list on an old folder).
        **options: the report options (REPORT_OPTIONS_DOC).

    ``device`` is where this process computes (checked here, before any work).

    Returns:
        The task's row: ``label, dir, status`` (``computed`` / ``skipped``), ``reason, seconds, host, pid,
        attempts, index, index_from`` (``"argument"`` or the variable read).

    Raises:
        OptionError / OptionTypeError / UnknownOptionError: bad items, labels or options; no index given
            and none in the environment; an index outside the items; another process measuring the
            same item (its lock is held); ``out/<dir>`` holding files that are not a report; an ``out``
            whose ``sweep.json`` is the plan of other items (another array's list; without ``replan=True``:
            nothing is measured and the file is left unchanged).
        DeviceError: a device this machine does not have.
        The item's own last error after its retries (also left in its task record).
    """
    retries = check_int(retries, "retries", 0, 100)
    replan = check_bool(replan, "replan")
    resolved = [_absolute(it) for it in resolve_items(items, allowed=SWEEP_ITEM_KINDS, what="sweep")]
    dirnames = _dirnames(resolved)
    if index is None:
        found = array_task_index()
        if found is None:
            raise OptionError(
                "No task index given and none of " + ", ".join(n for n, _ in ARRAY_INDEX_VARIABLES) + " is set: "
                "give the item's index (--task-index I), or run this as a task of a job array."
            )
        index, index_from = found
    else:
        index = check_int(index, "index", 0, None)
        index_from = "argument"
    if index >= len(resolved):
        raise OptionError(
            f"Task index {index} ({index_from}) is outside the {len(resolved)} items (0..{len(resolved) - 1}); "
            f"the array must run indices 0..{len(resolved) - 1} (LSF/SGE: 1..{len(resolved)})."
        )
    record, device_name = ReportOptions.for_elsewhere(
        "run_sweep_item()", options, ("items", "out", "index", "retries", "replan")
    )
    check_device(device_name)  # this process computes: a device it lacks fails before any work
    refuse_outputs_over_inputs([("out", out)], item_inputs(resolved))  # never an item's checkpoint folder
    d = _prepare_out(out)  # checked (check_work_folder) before it is created
    run = uuid.uuid4().hex[:12]
    tasks = [SweepTask(it, name, str(d), record, device_name, run) for it, name in zip(resolved, dirnames)]
    _write_plan(d, [_entry(t) for t in tasks], record, device_name, replan)
    task = tasks[index]
    last: Exception | None = None
    for attempt in range(1, retries + 2):
        try:
            row = run_sweep_task(task, attempt, wait=False)
        except (OptionError, OptionTypeError):  # busy, foreign files, options the model refuses: no retry helps
            raise
        except Exception as e:  # noqa: BLE001 - retried like a Dask task, then raised
            last = e
            continue
        return {
            **{k: row.get(k) for k in TASK_COLUMNS if k != "device"},
            "attempts": attempt,
            "index": index,
            "index_from": index_from,
        }
    assert last is not None
    raise last


def _dead_attempts(files: _ItemFiles) -> list[str]:
    """Start markers whose process is gone (the item's lock is free): one line each."""
    return [_marker_text(info) for _, info in files.markers()]


@strict_kwargs
def load_sweep(out: PathLike, items: SweepItems | None = None) -> SweepResult:
    """The :class:`SweepResult` of the sweep in ``out`` as its tasks left it (job-array tasks or a Dask sweep).

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
        items: the items the caller means (as given to :func:`sweep` / :func:`run_sweep_item`), or None to
            take the plan's. When given they must be the plan's items (labels, folders, paths).

    Returns:
        :class:`SweepResult` (``.table``, ``.heads``, ``.reports`` of the finished items, ``.tasks``,
        ``.failed``, ``.missing``), as :func:`sweep` returns it.

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
    origins = plan.origins or (None,) * len(plan.items)
    entries = [_Entry(*i, origin) for i, origin in zip(plan.items, origins)]
    if items is not None:
        resolved = [_absolute(it) for it in resolve_items(items, allowed=SWEEP_ITEM_KINDS, what="sweep")]
        given = [_Entry(it.label, name, it.describe()) for it, name in zip(resolved, _dirnames(resolved))]
        differs = _plan_matches(plan, given, plan.options, plan.device_asked)
        if differs:
            raise OptionError(
                f"{plan.path} is a sweep of other items: {'; '.join(differs)}. Give its items, or another out."
            )
    want = ReportOptions.from_record({**plan.options, "device": "cpu"})
    want_device = None if plan.device_asked == "auto" else check_device_name(plan.device_asked)
    reports: dict[str, IdempotenceReport] = {}
    rows: dict[str, dict[str, Any]] = {}
    failures: dict[str, dict[str, Any]] = {}
    missing: dict[str, str] = {}
    for e in entries:
        files = _ItemFiles(d, e.dir)
        rec, rec_problem = files.read_record()
        digest = files.report_digest()
        base = {"label": e.label, "dir": e.dir, "attempts": 0}
        busy = files.busy()
        dead = [] if busy else _dead_attempts(files)

        def fail(kind: str, msg: str, e: _Entry = e, base: dict[str, Any] = base) -> None:
            failures[e.label] = {"label": e.label, "item": e.item, "error_type": kind, "message": msg}
            rows[e.label] = {**base, "status": "failed", "reason": f"{kind}: {msg}"}

        def miss(why: str, e: _Entry = e, base: dict[str, Any] = base) -> None:
            missing[e.label] = why
            rows[e.label] = {**base, "status": "missing", "reason": why}

        if rec is not None and rec["status"] == "failed" and rec.get("report_sha256") is None:
            fail(str(rec.get("error_type") or "Error"), str(rec.get("message") or rec["reason"]))
            continue
        if digest is None:
            if busy:
                miss("being measured now (its lock is held)")
            elif dead:
                fail("WorkerDied", f"the process measuring it died: {'; '.join(dead)} (killed: wall time or memory?)")
            elif files.target.exists():
                miss(f"{files.target} has no {RECORD} (an interrupted save): rerun its task")
            else:
                miss("not measured yet")
            continue
        try:
            rep = load_report(files.target)
        except (TLIError, OSError) as err:
            miss(f"its saved report is unreadable ({type(err).__name__}: {err}): rerun its task")
            continue
        # the report-identity check: the plan's item (its checkpoint or zoo name) and the weights its own task
        # recorded having measured; a report copied in from another item's folder is never this item's result
        recorded = rec.get("weights_fingerprint") if rec is not None else None
        recorded = recorded if isinstance(recorded, str) else None
        foreign = report_mismatch(rep, origin=e.origin, fingerprint=recorded)
        if foreign is not None:
            measured = "" if recorded is None else f", whose task measured weights sha256 {recorded[:12]}"
            fail(
                ReportMismatchError.__name__,
                f"{files.target} holds a report of {describe_report(rep)}, not of item {e.label!r} ({e.item}"
                f"{measured}): {foreign}. Its numbers are not used; rerun its task (it measures the item again)",
            )
            continue
        diff = option_differences(rep.options, want)
        if want_device is not None and rep.options.device.type != _device_type(want_device):
            diff["device"] = (rep.options.device.type, _device_type(want_device))
        if diff:
            miss(
                "its saved report was made with other options ("
                + ", ".join(f"{k} {a!r}, the sweep asks {b!r}" for k, (a, b) in diff.items())
                + "): rerun its task"
            )
            continue
        reports[e.label] = rep
        if rec is not None and rec.get("report_sha256") == digest and rec["status"] in ("computed", "skipped"):
            rows[e.label] = {
                **base,
                **{k: rec.get(k) for k in ("status", "reason", "seconds", "host", "pid")},
                "attempts": rec.get("attempt") or 0,
            }
        else:
            why = rec_problem or "its task record describes another report"
            rows[e.label] = {**base, "status": "computed", "reason": f"report found ({why})"}
    return _result(
        d, entries, reports, rows, failures, missing, plan.options, plan.device_asked, time.perf_counter() - t0, ""
    )


def _device_type(name: str) -> str:
    import torch

    return torch.device(name).type


# --------------------------------------------------------------------------- trajectories


def _trajectory_task(
    path: str, record: dict[str, Any], device: str, resume: str | None, attempt: int = 1
) -> tuple[IdempotenceReport, float]:
    t0 = time.perf_counter()
    opts = ReportOptions.at_device(record, device)
    rep = report_with_options(path, opts, progress=False, resume=resume)
    return rep, time.perf_counter() - t0


def cache_name(order: int, label: str, opts: ReportOptions) -> str:
    """The cache folder (under ``cache_dir``) of one checkpoint, the same on both routes (serial and
    ``client=``): its order, label and a hash of the options key (another set of options is another
    folder, never a refusal; the weights are keyed per layer inside).

    Args:
        order: the checkpoint's position in the input (>= 0).
        label: its label (made filesystem-safe, at most 60 characters).
        opts: the validated report options.
    """
    import hashlib

    key = hashlib.sha256(json.dumps(opts.key(), sort_keys=True).encode()).hexdigest()[:12]
    return f"{order:04d}-{_slug(label)}-{key}"


def _slug(label: str) -> str:
    return _SAFE.sub("_", label)[:60] or "ckpt"


def check_cluster_trajectory(ckpts: Sequence[Any], client: Any, loader: Any = None) -> None:
    """Refuse, before any work, a trajectory that cannot run on a Dask cluster.

    Args:
        ckpts: the trajectory's checkpoint records (``label``, ``kind``).
        client: what was given as ``client``.
        loader: what was given as ``loader`` (must be None: workers open paths with the built-in reader).

    Raises:
        OptionTypeError: ``client`` is not a ``distributed.Client``.
        OptionError: a ``loader`` (it would never run), checkpoints that are not paths (a model object,
            a hub spec or a callable cannot be opened on a worker).
    """
    if client is None or not all(hasattr(client, m) for m in ("submit", "gather")):
        raise OptionTypeError(f"client must be a distributed.Client; got {type(client).__name__}.")
    if loader is not None:
        raise OptionError(
            "client=... and loader=... cannot be combined: with a client each checkpoint is opened on a worker from "
            "its path by the built-in reader, so the loader would never run. Drop loader, or run without client."
        )
    bad = [c.label for c in ckpts if c.kind != "path"]
    if bad:
        raise OptionError(
            f"trajectory(client=...) runs each checkpoint on a worker from its path; checkpoints {bad} are not paths "
            "(a model object, hub spec or callable). Save them to disk, or run without client."
        )


def run_trajectory_on_cluster(
    ckpts: Sequence[Any],
    options: ReportOptions,
    *,
    client: Any,
    cache_dir: str | os.PathLike[str] | None = None,
    progress: bool = True,
    retries: int = DEFAULT_RETRIES,
    worker_timeout: float | None = DEFAULT_WORKER_TIMEOUT,
) -> list[tuple[Any, IdempotenceReport, float]]:
    """One task per checkpoint on ``client`` for :func:`~tl_idempotence.studies.trajectory.trajectory`.

    Runs on :func:`~tl_idempotence.studies.cluster.run_jobs`: each checkpoint's report is its task's own
    result (fetched once, never taken from a future's status after a reschedule); a task that raises, or
    whose worker dies, is retried ``retries`` times; the first checkpoint that still fails stops the
    trajectory (the other tasks are cancelled).

    Args:
        ckpts: the trajectory's checkpoint records (``order``, ``label``, ``spec``, ``kind``, ``step``);
            only ``kind == "path"`` (a checkpoint directory or file, opened on the worker).
        options: the validated report options (device included: the workers must have it).
        client: a ``distributed.Client``.
        cache_dir: per-checkpoint resume parts, as in the serial route (a folder the workers see).
        progress: tqdm bar over tasks.
        retries: retries of a task that raised or whose worker died.
        worker_timeout: seconds without any worker before ClusterError (None: wait).

    Returns:
        ``[(ckpt, report, seconds)]`` in checkpoint order (seconds: wall time to open and measure it on its worker).

    Raises:
        OptionError: a checkpoint that is not a path (a model object, a hub spec, a callable), a client
            that is not a ``distributed.Client``.
        ClusterError: a checkpoint whose worker died on every attempt; no worker for ``worker_timeout`` s.
        The error of the first checkpoint that failed after its retries (with a note naming it).
    """
    from ..core.progress import progress_bar

    check_cluster_trajectory(ckpts, client)
    retries = check_int(retries, "retries", 0, 100)
    record = {k: v for k, v in options.as_dict().items() if k != "device"}
    device = str(options.device)
    by_name = {f"{c.order:04d}": c for c in ckpts}
    jobs = []
    for name, c in by_name.items():
        resume = (
            None if cache_dir is None else str(Path(cache_dir).expanduser() / cache_name(c.order, c.label, options))
        )
        jobs.append(Job(name, _trajectory_task, (str(Path(c.spec).expanduser()), record, device, resume)))
    bar = progress_bar(total=len(ckpts), desc="checkpoints", unit="ckpt", enabled=bool(progress))

    def done(o: Outcome) -> None:
        c = by_name[o.name]
        if o.status == "died":
            raise ClusterError(
                f"Trajectory checkpoint {c.label!r} ({c.spec}): the worker process measuring it died on every attempt "
                f"({'; '.join(o.deaths)}); {o.attempts} attempt(s), retries={retries}. Give the workers more memory."
            )
        if o.status == "error":
            exc = o.error
            assert exc is not None
            if hasattr(exc, "add_note"):  # Python >= 3.11
                exc.add_note(f"(trajectory checkpoint {c.label!r}, {c.spec}, failed on the Dask cluster)")
            raise exc
        bar.update(1)

    try:
        outcomes = run_jobs(
            client, jobs, retries=retries, key_prefix="tli-trajectory", worker_timeout=worker_timeout, on_done=done
        )
    finally:
        bar.close()
    out = []
    for name, c in by_name.items():
        rep, seconds = outcomes[name].value
        out.append((c, rep, seconds))
    return out
