"""The Dask driver of a sweep: :func:`sweep` runs one task per item (:func:`~.task.run_sweep_task`) on a
``distributed`` cluster through :func:`~tl_idempotence.studies.cluster.run_jobs`, decides each item's outcome
from its task's result or, when a worker died, from the files it left (:func:`probe_for`), and returns the
:class:`~.results.SweepResult`.

``sweep`` is its steps in order: check the arguments where they enter (:func:`check_sweep_arguments`),
resolve the items and options, take ``OUT``'s sweep lock (:func:`sweep_lock`), write the plan, run the tasks
(:func:`run_tasks`), turn their outcomes into the result's rows (:func:`collect_outcomes`), and record what
happened in ``OUT/sweep.json`` (:func:`write_outcome_record`).
"""

from __future__ import annotations

import contextlib
import time
import uuid
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...analyses.report_options import ReportOptions, ReportOptionsArgs, documents_options
from ...core.files import atomic_write_text, refuse_outputs_over_inputs
from ...core.jsonio import RECORD, json_text
from ...core.options import check_bool, check_device, check_int
from ...errors import OptionError, OptionTypeError, TLIError
from ...report.report import IdempotenceReport
from ..cluster import (
    DEFAULT_RETRIES,
    DEFAULT_WORKER_TIMEOUT,
    Job,
    Outcome,
    Probe,
    check_main_guard,
    local_cluster,
    machine_cores,
    require_cluster,
    run_jobs,
)
from ..compare import item_inputs
from .plan import (
    LOCK_NAME,
    RECORD_NAME,
    Entry,
    SweepPlan,
    item_differences,
    item_dirnames,
    plan_lock,
    plan_record,
    prepare_out,
    read_sweep_plan,
    resolve_sweep_items,
    write_plan,
)
from .results import SweepResult, build_result, load_finished
from .task import TASK_COLUMNS, ItemFiles, SweepTask, refuse_foreign_folder, run_sweep_task, task_entry

if TYPE_CHECKING:  # pragma: no cover
    from typing_extensions import Unpack

    from ...core.hints import ClientLike, IntLike, PathLike
    from .plan import SweepItems

__all__ = [
    "SWEEP_PARAMETERS",
    "check_sweep_arguments",
    "check_worker_timeout",
    "collect_outcomes",
    "connect",
    "probe_for",
    "run_tasks",
    "sweep",
    "sweep_lock",
    "write_outcome_record",
]

#: sweep's own parameters (suggested, with the options, for a misspelled keyword).
SWEEP_PARAMETERS = (
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
    """Measure many models or checkpoints as tasks on a Dask cluster; save each report; compare them (SPEC §9,
    scale: one model per process, each streamed layer by layer).

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
            filesystem-safe (:func:`~tl_idempotence.studies.sweep.item_dirname`; two labels mapping to one
            folder are refused). Must be visible to the workers and to this process (a shared filesystem on a
            cluster).
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
            listed drop out of :func:`~tl_idempotence.studies.sweep.load_sweep`; their folders stay on disk).
        **options: the report options (REPORT_OPTIONS_DOC).

    The options are the same for every item; ``device`` is resolved on the workers (with the LocalCluster,
    on this machine: checked here before the cluster starts).

    Returns:
        :class:`~tl_idempotence.studies.sweep.SweepResult`: the comparison of every item that finished
        (``.table``, ``.heads``, ``.reports``, ``.figure()``, ``.save_html()``), ``.tasks`` (computed /
        skipped / failed per item) and ``.failed`` (label, item, error type, message).

    Raises:
        MissingExtraError: ``dask`` or ``distributed`` is not installed (the ``[cluster]`` extra: ``pip install
            "tl_idempotence[cluster]"``), before anything else.
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
    require_cluster("tli.sweep()")  # the cluster engine is the [cluster] extra: refused before any work
    t_start = time.perf_counter()
    progress, replan, retries, worker_timeout, workers = check_sweep_arguments(
        progress, replan, retries, oversubscribe, worker_timeout, client, scheduler, workers
    )
    resolved = resolve_sweep_items(items)
    dirnames = item_dirnames(resolved)
    record, device_name = ReportOptions.for_elsewhere("sweep()", options, SWEEP_PARAMETERS)
    if client is None and scheduler is None:  # the workers are on this machine: a device it lacks fails here,
        check_device(device_name)  # before a cluster starts
        check_main_guard("tli.sweep()")
    refuse_outputs_over_inputs([("out", out)], item_inputs(resolved))  # never an item's checkpoint folder
    d = prepare_out(out)  # checked (check_work_folder) before it is created
    with sweep_lock(d):
        for it, name in zip(resolved, dirnames):
            refuse_foreign_folder(d / name, it.label)
        run = uuid.uuid4().hex[:12]
        tasks = [SweepTask(it, name, str(d), record, device_name, run) for it, name in zip(resolved, dirnames)]
        entries = [task_entry(t) for t in tasks]
        write_plan(d, entries, record, device_name, replan)
        n_workers = min(workers if workers is not None else machine_cores(), len(tasks))
        outcomes = run_tasks(d, tasks, run, client, scheduler, n_workers, retries, worker_timeout, progress)
        reports, rows, failures = collect_outcomes(d, tasks, entries, outcomes, retries)
        seconds, what = time.perf_counter() - t_start, f" after {retries} retries"
        result = build_result(d, entries, reports, rows, failures, {}, record, device_name, seconds, what)
        # set once before the result is handed out (a frozen result allows it): save_html never over an item's files
        object.__setattr__(result, "inputs", (*result.inputs, *item_inputs(resolved)))
        write_outcome_record(d, result, entries, record)
        return result


# --------------------------------------------------------------------------- the steps


def check_worker_timeout(x: Any) -> float | None:
    """``worker_timeout`` checked: None, or seconds in [1, 604800] as a float.

    Raises:
        OptionTypeError: not a number (a bool is not one).
        OptionError: outside [1, 604800] s, or NaN.
    """
    if x is None:
        return None
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise OptionTypeError(f"worker_timeout must be a number of seconds or None; got {type(x).__name__}.")
    if not (1 <= float(x) <= 7 * 24 * 3600):  # also refuses nan
        raise OptionError(f"worker_timeout must be in [1, 604800] seconds (or None to wait); got {x!r}.")
    return float(x)


def check_sweep_arguments(
    progress: Any,
    replan: Any,
    retries: Any,
    oversubscribe: Any,
    worker_timeout: Any,
    client: Any,
    scheduler: Any,
    workers: Any,
) -> tuple[bool, bool, int, float | None, int | None]:
    """:func:`sweep`'s own arguments checked before any work, in this order: ``(progress, replan, retries,
    worker_timeout, workers)``.

    Raises:
        OptionTypeError: ``progress``/``replan``/``oversubscribe`` not a bool, ``retries``/``workers`` not an
            integer, ``worker_timeout`` not a number; ``client`` not a ``distributed.Client``; ``scheduler`` not
            an address string.
        OptionError: ``retries`` outside 0..100, ``worker_timeout`` outside [1, 604800] s; ``workers`` outside
            1..4096 or above the cores this process may use without ``oversubscribe``; ``client`` with
            ``scheduler`` or ``workers``; ``scheduler`` with ``workers``.
    """
    progress = check_bool(progress, "progress")
    replan = check_bool(replan, "replan")
    retries = check_int(retries, "retries", 0, 100)
    oversubscribe = check_bool(oversubscribe, "oversubscribe")
    worker_timeout = check_worker_timeout(worker_timeout)
    if workers is not None:
        workers = check_int(workers, "workers", 1, 4096)
        cores = machine_cores()
        if workers > cores and not oversubscribe:
            raise OptionError(
                f"workers={workers} is more worker processes than the {cores} cores this process may use (each worker "
                "is a process with its own torch); give workers <= cores, or oversubscribe=True "
                "(--oversubscribe) to go above."
            )
    if client is not None and not all(hasattr(client, m) for m in ("submit", "gather")):
        raise OptionTypeError(
            f"client must be a distributed.Client (or None for a LocalCluster); got {type(client).__name__}."
        )
    if client is not None and (scheduler is not None or workers is not None):
        raise OptionError("Give client, or scheduler, or workers (for a LocalCluster) — not several.")
    if scheduler is not None and workers is not None:
        raise OptionError("workers sizes a LocalCluster; with scheduler=... the cluster is sized where it runs.")
    if scheduler is not None and not isinstance(scheduler, str):
        raise OptionTypeError(f"scheduler must be an address such as 'tcp://host:8786'; got {scheduler!r}.")
    return progress, replan, retries, worker_timeout, workers


@contextlib.contextmanager
def sweep_lock(d: Path) -> Iterator[None]:
    """``OUT``'s sweep lock (:data:`~.plan.LOCK_NAME`), held while the block runs: one Dask sweep per ``OUT``.

    Raises:
        OptionError: another sweep holds it.
    """
    from filelock import FileLock, Timeout

    lock = FileLock(str(d / LOCK_NAME))
    try:
        lock.acquire(timeout=0)
    except Timeout as e:
        raise OptionError(
            f"Another sweep is writing {d} (lock {d / LOCK_NAME}); wait for it, or use another folder."
        ) from e
    try:
        yield
    finally:
        lock.release()


@contextlib.contextmanager
def connect(client: Any, scheduler: str | None, n_workers: int) -> Iterator[tuple[Any, Any]]:
    """``(client, our LocalCluster or None)``: the given client, one connected to ``scheduler``, or a
    LocalCluster's (closed at exit).

    Raises:
        OptionError: ``scheduler`` cannot be reached.
        ClusterError: a LocalCluster whose workers cannot start.
    """
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


def probe_for(out: Path, run: str) -> Callable[[Job, int], Probe]:
    """What the disk says about an attempt of a sweep task that ended without a result (the module docstring of
    :mod:`tl_idempotence.studies.sweep`): done when this run's task record describes the report in ``OUT/<dir>``,
    else the deaths its start markers show (removed once read)."""

    def probe(job: Job, attempt: int) -> Probe:
        task: SweepTask = job.args[0]
        files = ItemFiles(out, task.dirname)
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


def run_tasks(
    d: Path,
    tasks: Sequence[SweepTask],
    run: str,
    client: Any,
    scheduler: str | None,
    n_workers: int,
    retries: int,
    worker_timeout: float | None,
    progress: bool,
) -> dict[str, Outcome]:
    """Every task of the sweep run ``run`` on the cluster (:func:`connect`) until each has an outcome
    (``{dirname: Outcome}``), with a progress bar; start markers of this run that Dask's own retries left behind
    are removed afterwards.

    Raises:
        OptionError / ClusterError: as :func:`connect` and :func:`~tl_idempotence.studies.cluster.run_jobs`.
    """
    from ...core.progress import progress_bar

    label_of = {t.dirname: t.item.label for t in tasks}
    bar = progress_bar(total=len(tasks), desc="sweep", unit="task", enabled=bool(progress))

    def done(o: Outcome) -> None:
        bar.update(1)
        bar.set_postfix_str(label_of[o.name])

    try:
        with connect(client, scheduler, n_workers) as (cl, cluster):
            return run_jobs(
                cl,
                [Job(t.dirname, run_sweep_task, (t,)) for t in tasks],
                retries=retries,
                key_prefix="tli-sweep",
                probe=probe_for(d, run),
                cluster=cluster,
                worker_timeout=worker_timeout,
                on_done=done,
            )
    finally:
        bar.close()
        for t in tasks:  # deaths that Dask retried by itself (a client's allowed-failures) left markers
            for path, info in ItemFiles(d, t.dirname).markers():
                if info.get("run") == run:
                    path.unlink(missing_ok=True)


def collect_outcomes(
    d: Path, tasks: Sequence[SweepTask], entries: Sequence[Entry], outcomes: dict[str, Outcome], retries: int
) -> tuple[dict[str, IdempotenceReport], dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    """``(reports, rows, failures)`` of a Dask sweep's outcomes, keyed by label, in item order: a task that
    returned gives its saved report (read back and checked against the sha256 it recorded); a task whose worker
    died on every attempt is recorded as ``WorkerDied`` in its item's folder too (for :func:`load_sweep`)."""
    rows: dict[str, dict[str, Any]] = {}
    failures: dict[str, dict[str, Any]] = {}
    reports: dict[str, IdempotenceReport] = {}
    for t, ent in zip(tasks, entries):
        o = outcomes[t.dirname]
        if o.status == "ok":
            row = {k: o.value.get(k) for k in TASK_COLUMNS}
            row["attempts"] = o.attempts
            loaded = load_finished(d, ent, o.value.get("report_sha256"), row.get("host"))
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
            _record_death(d, t, ent, o, kind, msg)
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
    return reports, rows, failures


def _record_death(d: Path, t: SweepTask, ent: Entry, o: Outcome, kind: str, msg: str) -> None:
    """Leave an item whose worker died on every attempt as failed in its task record (no task of it runs now)."""
    died = {"label": ent.label, "dir": ent.dir, "status": "failed", "reason": f"{kind}: {msg}", "run": t.run}
    with contextlib.suppress(OSError):  # the folder remembers it too (load_sweep)
        ItemFiles(d, t.dirname).write_record(
            {**died, "attempt": o.attempts, "report_sha256": None, "error_type": kind, "message": msg}, t.item
        )


def write_outcome_record(d: Path, result: SweepResult, entries: Sequence[Entry], record: dict[str, Any]) -> None:
    """The plan plus what a Dask sweep ended with (statuses, each report's device, what failed); not written
    (with a warning) when ``sweep.json`` was replanned with other items while the sweep ran.

    Called directly by :func:`sweep` (its warning names the caller of ``sweep``: ``stacklevel=3``).

    Raises:
        OptionError: the filesystem has no file locks.
    """

    rec = plan_record(entries, record, result.device)
    rec["options"] = result.options.as_dict()
    for item, status, dev in zip(rec["items"], result.tasks["status"], result.tasks["device"]):
        item.update(status=status, device=dev)
    rec["failed"] = result.failed.to_dict(orient="records")
    with plan_lock(d):
        plan: SweepPlan | None = None
        with contextlib.suppress(TLIError, OSError):
            plan = read_sweep_plan(d)
        items = None if plan is None else item_differences(plan, entries)
        if items is not None:
            warnings.warn(
                f"{d / RECORD_NAME} was replanned with other items while this sweep ran ({items}); it is left as "
                "it is (this sweep's outcome is the result returned).",
                UserWarning,
                stacklevel=3,
            )
            return
        atomic_write_text(d / RECORD_NAME, json_text(rec, RECORD, indent=1))
