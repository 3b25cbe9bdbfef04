"""Many models or checkpoints as tasks on a Dask cluster, each report saved as it finishes.

:func:`sweep` runs one task per item on Dask's distributed scheduler (``dask``,
``distributed``): ``client=None`` starts a ``LocalCluster`` sized to this machine (one worker
process per core, one thread each) and closes it afterwards; any ``distributed.Client`` works,
so the same call runs on a SLURM/PBS cluster through ``dask-jobqueue`` or on a Kubernetes Dask
cluster (``docs/sweeps.md``). Each task opens its own source on the worker — a checkpoint path
is streamed layer by layer, a zoo name is read from the zoo's cached checkpoint files, a
zero-argument callable is called there; no model object travels between processes — and
writes its finished report to ``OUT/<dir>/`` in the report's save format (parquet + JSON,
:mod:`tl_idempotence.report.store`). The call returns the combined :func:`compare` result.

Rerunning with the same ``OUT`` is cheap and never stale. A task first compares the saved
report with the item's *current* content: the saved options (threshold, nulls, seed, search,
algebra, compute dtype, layers, device) and, layer by layer, the sha256 fingerprint of the
attention weights it reads now (:meth:`~tl_idempotence.core.heads.LayerHeads.fingerprint`,
one pass over the O and V bytes, no analysis run) against the fingerprints the saved report
records. It skips the item only when every one matches; otherwise — other options, changed
weights, a folder without ``report.json`` or with a file that does not match its recorded
sha256 (an interrupted or damaged save) — it recomputes. A report is written to a temporary
folder and renamed into place, so ``OUT/<dir>`` never holds a half-written report.

A task that raises is retried (Dask ``retries``); one that still fails is listed in
``SweepResult.failed`` with its error while every other result is kept.

The numbers are those of :func:`~tl_idempotence.report.report.idempotence_report` run on the
item in one process — bit for bit when that process uses as many torch threads as a worker
(Dask starts workers with ``OMP_NUM_THREADS=1``); multi-threaded float64 products can differ in
the last bits (measured on SmolLM2-135M: at most 2.5e-16, P identical).

``OUT`` must be one folder that the workers and this process both see (on a cluster: a
shared filesystem). One sweep at a time per ``OUT`` (a lock file ``OUT/.tli-sweep.lock``).

:func:`run_trajectory_on_cluster` is the same machinery for
:func:`tl_idempotence.studies.trajectory.trajectory` (``client=...``).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import time
import uuid
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import pandas as pd

from ..core.files import atomic_write_text
from ..core.options import ReportOptions, check_bool, check_int, resolve_layers, strict_kwargs
from ..errors import OptionError, OptionTypeError, TLIError
from ..report.report import IdempotenceReport, load_report, report_with_options
from ..report.store import RECORD
from ..report.summary import versions
from .compare import (
    Comparison,
    Item,
    measure_item,
    open_item,
    option_differences,
    processing_key,
    resolve_items,
)

__all__ = [
    "LOCK_NAME",
    "RECORD_NAME",
    "RESERVED_NAMES",
    "SWEEP_ITEM_KINDS",
    "SweepResult",
    "SweepTask",
    "cache_name",
    "check_cluster_trajectory",
    "item_dirname",
    "run_sweep_task",
    "run_trajectory_on_cluster",
    "saved_report_matches",
    "sweep",
]

#: Item kinds a sweep accepts: things a worker can open by itself.
SWEEP_ITEM_KINDS = ("path", "zoo", "callable")
#: The sweep's own record in ``OUT`` (labels, folders, options, what failed), written last.
RECORD_NAME = "sweep.json"
#: Lock file that keeps two sweeps from writing one ``OUT`` at once.
LOCK_NAME = ".tli-sweep.lock"
_TMP_PREFIX = ".tli-tmp-"
_OLD_PREFIX = ".tli-old-"
_SAFE = re.compile(r"[^A-Za-z0-9._-]+")
#: Default number of retries of a failed task (so up to 3 attempts).
DEFAULT_RETRIES = 2


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
RESERVED_NAMES = ("sweep", "sweep.json", "tli-sweep.lock")


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


# --------------------------------------------------------------------------- one task (runs on a worker)


@dataclass(frozen=True)
class SweepTask:
    """One item of a sweep, as sent to a worker (small: a path, a zoo name or a callable, and options).

    Attributes:
        item: the labelled item (``path``, ``zoo`` or ``callable``).
        dirname: its folder under ``out``.
        out: the sweep folder.
        options: ``ReportOptions.as_dict()`` without the device.
        device: the device name, resolved on the worker (``"cpu"``, ``"cuda"``, ``"auto"``, ...).
    """

    item: Item
    dirname: str
    out: str
    options: dict[str, Any]
    device: str


def _task_options(task: SweepTask) -> ReportOptions:
    record = {k: v for k, v in task.options.items() if k != "device"}
    return ReportOptions(**record, device=task.device)


def saved_report_matches(folder: str | os.PathLike[str], source: Any, options: ReportOptions) -> str | None:
    """Why the report saved in ``folder`` cannot stand for ``source`` measured with ``options`` — or None
    when it can (made by this version and code of tl_idempotence, same options, same sizes and processing,
    and every layer's current weight fingerprint equal to the saved one).

    The current fingerprints are computed by reading each layer's O and V from ``source``
    (:meth:`~tl_idempotence.core.heads.LayerHeads.fingerprint`, the same bytes the report loop
    hashes), stopping at the first layer that differs; no analysis runs.

    Args:
        folder: a report folder (``rep.save``).
        source: a head source (or anything :func:`~tl_idempotence.sources.dispatch.head_source` accepts).
        options: the options asked for.

    Returns:
        None, or a short reason (``"no report.json"``, ``"options differ: ..."``, ``"layer 2 changed"``, ...).
    """
    from ..sources.dispatch import head_source

    d = Path(folder)
    if not (d / RECORD).is_file():
        return f"no {RECORD}"
    try:
        rep = load_report(d)
    except (TLIError, OSError) as e:
        return f"the saved report is unreadable ({type(e).__name__}: {e})"
    saved_v = rep.summary.get("versions") or {}
    now_v = versions()
    for key in ("tl_idempotence", "tl_idempotence_code"):
        if saved_v.get(key) != now_v.get(key):
            return f"made by another tl_idempotence ({key} {saved_v.get(key)!r} -> {now_v.get(key)!r})"
    diff = option_differences(rep.options, options)
    if rep.options.device.type != options.device.type:
        diff["device"] = (rep.options.device.type, options.device.type)
    if diff:
        return "options differ: " + ", ".join(f"{k} {a!r} -> {b!r}" for k, (a, b) in diff.items())
    src = head_source(source)
    info = src.info
    if info.sizes != rep.info.sizes:
        return f"model sizes differ: {rep.info.sizes} -> {info.sizes}"
    if processing_key({"processing": info.processing}) != processing_key(rep.summary):
        return "weight processing differs"
    want = resolve_layers(options.layers, list(src.layers()))
    saved = dict(zip(rep.layers["layer"].astype(int), rep.layers["fingerprint"].astype(str)))
    if sorted(want) != sorted(saved):
        return f"measured layers differ: {sorted(saved)} -> {sorted(want)}"
    for layer in want:
        if src.layer_heads(layer).fingerprint() != saved[layer]:
            return f"layer {layer} changed (weight fingerprint differs)"
    return None


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


def run_sweep_task(task: SweepTask) -> dict[str, Any]:
    """Run one sweep item (on a worker): skip it when its saved report still matches, else measure and save.

    Returns:
        ``{"label", "dir", "status": "skipped" | "computed", "reason", "seconds", "host", "pid"}``.

    Raises:
        Whatever opening or measuring the item raises (the scheduler retries it, then reports it).
    """
    t0 = time.perf_counter()
    opts = _task_options(task)
    out = Path(task.out)
    target = out / task.dirname
    reason = "no saved report"
    src = None
    if target.exists():
        src = open_item(task.item)
        why = saved_report_matches(target, src, opts)
        if why is None:
            return _task_record(task, "skipped", "saved report matches the weights and options", t0)
        reason = why
    rep = measure_item(task.item, opts, source=src)
    del src
    tmp = out / f"{_TMP_PREFIX}{task.dirname}-{uuid.uuid4().hex[:8]}"
    try:
        rep.save(tmp)
        _install(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return _task_record(task, "computed", reason, t0)


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


# --------------------------------------------------------------------------- the driver


class SweepResult(Comparison):
    """Result of :func:`sweep`: the :class:`~tl_idempotence.studies.compare.Comparison` of every item
    that finished, plus what happened to each task.

    Attributes:
        out: the sweep folder (``out/<dir>/`` holds each item's report; ``out/sweep.json`` the record).
        tasks: one row per item in input order: ``label, dir, status`` (``computed``, ``skipped``
            — its saved report matched the current weights and options — or ``failed``), ``reason``
            (why it was computed, skipped or failed), ``device`` (the device type its saved report
            was computed on, as the report records it: ``"cpu"``, ``"cuda"``; None when it failed),
            ``seconds`` (on the worker), ``host``, ``pid``.
        device: the device asked for (``"cpu"``, ``"cuda"``, ``"cuda:1"``, ``"auto"``); ``options.device``
            is the device type the reports were computed on (with ``"auto"``: the one every report
            records; the one asked when they differ — then ``tasks.device`` says which is which and a
            warning was given).
        failed: one row per item that failed after its retries: ``label, item, error_type, message``.
        seconds: wall time of the whole sweep.
        (and every attribute of :class:`Comparison`: ``table``, ``heads``, ``reports``, ...)
    """

    repr_keys: ClassVar[tuple[str, ...]] = (
        "n_models",
        "n_computed",
        "n_skipped",
        "n_failed",
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
    ) -> None:
        super().__init__(reports, options, warn=warn)
        self.device = device
        self.out = out
        self.tasks = tasks
        self.failed = failed
        self.seconds = seconds

    @property
    def summary(self) -> dict[str, Any]:
        """The comparison's summary plus ``device`` (the device type of the reports, or the one asked),
        ``n_computed, n_skipped, n_failed, seconds``."""
        st = self.tasks["status"] if len(self.tasks) else pd.Series([], dtype=str)
        return {
            **super().summary,
            "device": self.options.device.type,
            "n_computed": int((st == "computed").sum()),
            "n_skipped": int((st == "skipped").sum()),
            "n_failed": int((st == "failed").sum()),
            "seconds": self.seconds,
        }


def _check_device_name(device: Any) -> str:
    """A device name to resolve on the workers (they may have GPUs this process lacks)."""
    import torch

    if isinstance(device, torch.device):
        device = str(device)
    if not isinstance(device, str):
        raise OptionTypeError(f"device must be a device name such as 'cpu', 'cuda' or 'auto'; got {device!r}.")
    if device != "auto":
        try:
            kind = torch.device(device).type
        except RuntimeError as e:
            raise OptionError(f"device={device!r} is not a device name; use 'cpu', 'cuda', 'cuda:N' or 'auto'.") from e
        if kind not in ("cpu", "cuda"):
            raise OptionError(f"device={device!r}: a sweep runs on 'cpu' or 'cuda' workers (or 'auto').")
    return device


def _machine_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - macOS / Windows
        return os.cpu_count() or 1


@contextlib.contextmanager
def _cluster(client: Any, scheduler: str | None, workers: int | None, n_tasks: int) -> Iterator[Any]:
    """The client to submit to: the given one, one connected to ``scheduler``, or a LocalCluster's (closed at exit)."""
    if client is not None:
        yield client
        return
    import logging

    from distributed import Client, LocalCluster

    if scheduler is not None:
        try:
            own = Client(scheduler)
        except (OSError, ValueError, TimeoutError) as e:
            raise OptionError(
                f"Cannot connect to the Dask scheduler at scheduler={scheduler!r} ({type(e).__name__}: {e}). Give the "
                "address of a running scheduler, e.g. 'tcp://host:8786' (see docs/sweeps.md)."
            ) from e
        try:
            yield own
        finally:
            own.close()
        return
    n = workers if workers is not None else max(1, min(n_tasks, _machine_cores()))
    cluster = LocalCluster(
        n_workers=n, threads_per_worker=1, processes=True, dashboard_address=":0", silence_logs=logging.ERROR
    )
    own = Client(cluster)
    try:
        yield own
    finally:
        own.close()
        cluster.close()


def _check_client(client: Any) -> None:
    if client is None:
        return
    if not all(hasattr(client, m) for m in ("submit", "gather")):
        raise OptionTypeError(
            f"client must be a distributed.Client (or None for a LocalCluster); got {type(client).__name__}."
        )


def _prepare_out(out: Any) -> Path:
    if not isinstance(out, (str, os.PathLike)):
        raise OptionTypeError(f"out must be a folder path; got {type(out).__name__}.")
    d = Path(out).expanduser()
    if d.exists() and not d.is_dir():
        raise OptionError(f"out={str(out)!r} is a file; give a folder for the sweep's reports.")
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OptionError(f"Cannot create the sweep folder {d}: {e.strerror or e}.") from e
    if not os.access(d, os.W_OK):
        raise OptionError(f"The sweep folder {d} is not writable.")
    return d


def _clean_leftovers(d: Path) -> None:
    """Temporary folders of an interrupted sweep (never a finished report)."""
    for p in d.iterdir():
        if p.is_dir() and p.name.startswith((_TMP_PREFIX, _OLD_PREFIX)):
            shutil.rmtree(p, ignore_errors=True)


def _error_row(item: Item, exc: BaseException | None, status: str) -> dict[str, Any]:
    if exc is None:
        return {"label": item.label, "item": item.describe(), "error_type": status, "message": f"task {status}"}
    return {"label": item.label, "item": item.describe(), "error_type": type(exc).__name__, "message": str(exc)}


def _future_error(fut: Any) -> BaseException | None:
    try:
        return fut.exception()
    except BaseException as e:  # noqa: BLE001 - a cancelled future raises here instead of returning its error
        return e


@strict_kwargs
def sweep(
    items: Any,
    out: Any,
    client: Any = None,
    *,
    scheduler: Any = None,
    workers: Any = None,
    retries: Any = DEFAULT_RETRIES,
    threshold: Any = 0.9,
    nulls: Any = False,
    seed: Any = 0,
    search: Any = False,
    algebra: Any = False,
    layers: Any = None,
    compute_dtype: Any = "float64",
    device: Any = "cpu",
    progress: Any = True,
) -> SweepResult:
    """Measure many models or checkpoints as tasks on a Dask cluster; save each report; compare them.

    Each item is one task (``client.submit(..., retries=retries)``) that opens its own source on
    the worker and writes ``out/<dir>/`` in the report save format; a rerun skips an item whose
    saved report matches its current weights (per-layer sha256 fingerprints, read from the item
    now) and the options, and recomputes anything else (module docstring). With ``client=None``
    and ``scheduler=None`` a ``distributed.LocalCluster`` (worker processes, one thread each) is
    started and closed afterwards; like every multiprocessing program, a script that calls this
    needs the ``if __name__ == "__main__":`` guard.

    The CLI (``tl-idempotence sweep ITEM... --out DIR [--workers N] [--scheduler ADDRESS]``)
    calls ``sweep(items, out, scheduler=ADDRESS, workers=N, progress=True, **report_options)``.

    Options are annotated ``Any``: each is validated here, where it enters (types named in the docs below).

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
        workers: worker processes of the LocalCluster (default: min(items, cores)); only without
            ``client``/``scheduler``.
        retries: how many times a failed task is retried (0..100).
        threshold, nulls, seed, search, algebra, layers, compute_dtype: the report options
            (:func:`~tl_idempotence.report.report.idempotence_report`), the same for every item.
        device: where each worker computes (``"cpu"``, ``"cuda"``, ``"auto"``; resolved on the worker).
        progress: a tqdm bar over tasks.

    Returns:
        :class:`SweepResult`: the comparison of every item that finished (``.table``, ``.heads``,
        ``.reports``, ``.figure()``, ``.save_html()``), ``.tasks`` (computed / skipped / failed
        per item) and ``.failed`` (label, item, error type, message).

    Raises:
        OptionError / OptionTypeError / UnknownOptionError: bad items, labels or options, ``out``
            a file or not writable, ``client`` with ``scheduler``/``workers``, another sweep
            running on ``out``, a folder ``out/<dir>`` holding files that are not a report, a
            ``scheduler`` that cannot be reached.
        MissingFileError / UnknownModelError: an item path that does not exist, an unknown zoo name.

    Warns:
        UserWarning: items that failed (also in ``.failed``); models with processed or identical weights.
    """
    from filelock import FileLock, Timeout

    from ..core.progress import progress_bar

    t_start = time.perf_counter()
    progress = check_bool(progress, "progress")
    retries = check_int(retries, "retries", 0, 100)
    if workers is not None:
        workers = check_int(workers, "workers", 1, 4096)
    _check_client(client)
    if client is not None and (scheduler is not None or workers is not None):
        raise OptionError("Give client, or scheduler, or workers (for a LocalCluster) — not several.")
    if scheduler is not None and workers is not None:
        raise OptionError("workers sizes a LocalCluster; with scheduler=... the cluster is sized where it runs.")
    if scheduler is not None and not isinstance(scheduler, str):
        raise OptionTypeError(f"scheduler must be an address such as 'tcp://host:8786'; got {scheduler!r}.")
    resolved = resolve_items(items, allowed=SWEEP_ITEM_KINDS, what="sweep")
    dirnames = _dirnames(resolved)
    device_name = _check_device_name(device)
    opts = ReportOptions(
        threshold=threshold,
        nulls=nulls,
        seed=seed,
        search=search,
        algebra=algebra,
        layers=layers,
        compute_dtype=compute_dtype,
    )
    record = {k: v for k, v in opts.as_dict().items() if k != "device"}
    if device_name != "auto":  # the device changes numbers in their last bits: it is part of the options
        opts = ReportOptions.from_record({**record, "device": device_name})
    d = _prepare_out(out)
    lock = FileLock(str(d / LOCK_NAME))
    try:
        lock.acquire(timeout=0)
    except Timeout as e:
        raise OptionError(
            f"Another sweep is writing {d} (lock {d / LOCK_NAME}); wait for it, or use another folder."
        ) from e
    try:
        _clean_leftovers(d)
        for it, name in zip(resolved, dirnames):
            target = d / name
            if target.exists() and (not target.is_dir() or not _our_files_only(target)):
                raise OptionError(
                    f"{target} (the folder of item {it.label!r}) exists and holds files that are not a saved report; "
                    "move them away or choose another out folder (nothing was computed)."
                )
        tasks = [SweepTask(it, name, str(d), record, device_name) for it, name in zip(resolved, dirnames)]
        rows: dict[str, dict[str, Any]] = {}
        failures: dict[str, dict[str, Any]] = {}
        with _cluster(client, scheduler, workers, len(tasks)) as cl:
            from distributed import as_completed

            token = uuid.uuid4().hex[:8]
            futures = {
                cl.submit(run_sweep_task, t, key=f"tli-sweep-{t.dirname}-{token}", retries=retries, pure=False): t
                for t in tasks
            }
            bar = progress_bar(total=len(tasks), desc="sweep", unit="task", enabled=bool(progress))
            try:
                for fut in as_completed(list(futures)):
                    t = futures[fut]
                    if fut.status == "finished":
                        rows[t.item.label] = fut.result()
                    else:
                        exc = _future_error(fut)
                        failures[t.item.label] = _error_row(t.item, exc, fut.status)
                        rows[t.item.label] = {
                            "label": t.item.label,
                            "dir": t.dirname,
                            "status": "failed",
                            "reason": f"{type(exc).__name__}: {exc}" if exc is not None else fut.status,
                        }
                    bar.update(1)
                    bar.set_postfix_str(t.item.label)
            finally:
                bar.close()
                for fut in futures:
                    fut.release()
        reports: dict[str, IdempotenceReport] = {}
        for t in tasks:
            lab = t.item.label
            if lab in failures:
                continue
            try:
                reports[lab] = load_report(d / t.dirname)
            except (TLIError, OSError) as e:
                failures[lab] = {
                    "label": lab,
                    "item": t.item.describe(),
                    "error_type": type(e).__name__,
                    "message": f"{e} (the task finished on {rows[lab].get('host')}: is {d} shared between the "
                    "workers and this process?)",
                }
                rows[lab] = {**rows[lab], "status": "failed", "reason": f"{type(e).__name__}: {e}"}
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
                stacklevel=3,
            )
        task_rows = [rows[t.item.label] for t in tasks]
        tasks_df = pd.DataFrame(
            task_rows, columns=["label", "dir", "status", "reason", "device", "seconds", "host", "pid"]
        )
        failed_df = pd.DataFrame(
            [failures[t.item.label] for t in tasks if t.item.label in failures],
            columns=["label", "item", "error_type", "message"],
        )
        if len(failed_df):
            warnings.warn(
                f"{len(failed_df)} of {len(tasks)} sweep items failed after {retries} retries: "
                + "; ".join(f"{r.label}: {r.error_type}: {r.message[:200]}" for r in failed_df.itertuples())
                + " (listed in SweepResult.failed; every other result is kept).",
                UserWarning,
                stacklevel=3,
            )
        result = SweepResult(
            reports,
            opts,
            d,
            tasks_df,
            failed_df,
            seconds=time.perf_counter() - t_start,
            warn=bool(reports),
            device=device_name,
        )
        _write_record(d, result, tasks)
        return result
    finally:
        lock.release()


def _write_record(d: Path, result: SweepResult, tasks: Sequence[SweepTask]) -> None:
    import json

    from ..report.parts import json_safe

    rec = {
        "format": "tl_idempotence.sweep/1",
        "options": result.options.as_dict(),
        "device_asked": result.device,
        "items": [
            {"label": t.item.label, "dir": t.dirname, "item": t.item.describe(), "status": s, "device": dev}
            for t, s, dev in zip(tasks, result.tasks["status"], result.tasks["device"])
        ],
        "failed": result.failed.to_dict(orient="records"),
    }
    atomic_write_text(d / RECORD_NAME, json.dumps(json_safe(rec), indent=1))


# --------------------------------------------------------------------------- trajectories


def _trajectory_task(
    path: str, record: dict[str, Any], device: str, resume: str | None
) -> tuple[IdempotenceReport, float]:
    t0 = time.perf_counter()
    opts = ReportOptions(**{k: v for k, v in record.items() if k != "device"}, device=device)
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
    import json

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
) -> list[tuple[Any, IdempotenceReport, float]]:
    """One task per checkpoint on ``client`` for :func:`~tl_idempotence.studies.trajectory.trajectory`.

    Args:
        ckpts: the trajectory's checkpoint records (``order``, ``label``, ``spec``, ``kind``, ``step``);
            only ``kind == "path"`` (a checkpoint directory or file, opened on the worker).
        options: the validated report options (device included: the workers must have it).
        client: a ``distributed.Client``.
        cache_dir: per-checkpoint resume parts, as in the serial route (a folder the workers see).
        progress: tqdm bar over tasks.
        retries: retries of a failed task.

    Returns:
        ``[(ckpt, report, seconds)]`` in checkpoint order (seconds: wall time to open and measure it on its worker).

    Raises:
        OptionError: a checkpoint that is not a path (a model object, a hub spec, a callable), a client
            that is not a ``distributed.Client``.
        The first error of a checkpoint that failed after its retries (with a note naming it).
    """
    from ..core.progress import progress_bar

    check_cluster_trajectory(ckpts, client)
    retries = check_int(retries, "retries", 0, 100)
    from distributed import as_completed

    record = {k: v for k, v in options.as_dict().items() if k != "device"}
    device = str(options.device)
    token = uuid.uuid4().hex[:8]
    futures = {}
    for c in ckpts:
        resume = (
            None if cache_dir is None else str(Path(cache_dir).expanduser() / cache_name(c.order, c.label, options))
        )
        fut = client.submit(
            _trajectory_task,
            str(Path(c.spec).expanduser()),
            record,
            device,
            resume,
            key=f"tli-trajectory-{c.order:04d}-{token}",
            retries=retries,
            pure=False,
        )
        futures[fut] = c
    done: dict[int, tuple[Any, IdempotenceReport, float]] = {}
    bar = progress_bar(total=len(ckpts), desc="checkpoints", unit="ckpt", enabled=bool(progress))
    try:
        for fut in as_completed(list(futures)):
            c = futures[fut]
            if fut.status != "finished":
                exc = _future_error(fut)
                for other in futures:
                    other.cancel()
                if exc is None:
                    raise OptionError(f"Checkpoint {c.label!r}: its task was {fut.status}.")
                if hasattr(exc, "add_note"):  # Python >= 3.11
                    exc.add_note(f"(trajectory checkpoint {c.label!r}, {c.spec}, failed on the Dask cluster)")
                raise exc
            rep, seconds = fut.result()
            done[c.order] = (c, rep, seconds)
            bar.update(1)
    finally:
        bar.close()
    return [done[c.order] for c in ckpts]
