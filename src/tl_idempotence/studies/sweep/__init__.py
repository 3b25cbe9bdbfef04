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

The package, one module per job: :mod:`~tl_idempotence.studies.sweep.plan` (items, their folders, the plan
``OUT/sweep.json``), :mod:`~tl_idempotence.studies.sweep.task` (one task: an item's lock, task record, start
markers and report), :mod:`~tl_idempotence.studies.sweep.driver` (the Dask driver, :func:`sweep`),
:mod:`~tl_idempotence.studies.sweep.arrays` (job arrays, :func:`run_sweep_item`) and
:mod:`~tl_idempotence.studies.sweep.results` (:class:`SweepResult`, :func:`load_sweep`); the names below are
imported from this package. The Dask runner that sweeps and trajectories share is
:mod:`tl_idempotence.studies.cluster`.
"""

from .arrays import ARRAY_INDEX_VARIABLES, array_task_index, run_sweep_item
from .driver import sweep
from .plan import (
    ITEMS_DIR,
    LOCK_NAME,
    RECORD_NAME,
    RESERVED_NAMES,
    SWEEP_ITEM_KINDS,
    SweepPlan,
    item_dirname,
    item_origin,
    read_sweep_plan,
)
from .results import SweepResult, load_sweep
from .task import TASK_COLUMNS, SweepTask, run_sweep_task, saved_report_matches

__all__ = [
    "ARRAY_INDEX_VARIABLES",
    "ITEMS_DIR",
    "LOCK_NAME",
    "RECORD_NAME",
    "RESERVED_NAMES",
    "SWEEP_ITEM_KINDS",
    "TASK_COLUMNS",
    "SweepPlan",
    "SweepResult",
    "SweepTask",
    "array_task_index",
    "item_dirname",
    "item_origin",
    "load_sweep",
    "read_sweep_plan",
    "run_sweep_item",
    "run_sweep_task",
    "saved_report_matches",
    "sweep",
]
