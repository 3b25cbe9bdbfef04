"""Job arrays: a sweep as the tasks of a scheduler's job array (SLURM, PBS, SGE, LSF), no Dask at all.
:func:`run_sweep_item` is one task (``tl-idempotence sweep ITEMS --out DIR --task-index I``): it measures
item ``I`` in this process (:func:`~.task.run_sweep_task`, under the item's lock, without waiting for it) and
exits; :func:`array_task_index` reads ``I`` from the scheduler's environment;
:func:`~tl_idempotence.studies.sweep.load_sweep` (``--collect``) reads the folder back.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ...analyses.report_options import ReportOptions, ReportOptionsArgs, documents_options
from ...core.files import refuse_outputs_over_inputs
from ...core.options import check_bool, check_device, check_int
from ...errors import OptionError, OptionTypeError
from ..cluster import DEFAULT_RETRIES
from ..compare import item_inputs
from .plan import item_dirnames, prepare_out, resolve_sweep_items, write_plan
from .task import TASK_COLUMNS, SweepTask, run_sweep_task, task_entry

if TYPE_CHECKING:  # pragma: no cover
    from typing_extensions import Unpack

__all__ = ["ARRAY_INDEX_VARIABLES", "array_task_index", "run_sweep_item"]

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
    ``out/<dir>/`` and return (``tl-idempotence sweep ITEMS --out DIR --task-index I``; SPEC §9, scale).

    Every task of the array is given the same ``items`` and options; each writes the same plan
    (``out/sweep.json``) and works only on its own item, under that item's lock, so tasks on one ``out``
    run concurrently without waiting for each other. The item is skipped when its saved report matches
    its current weights and options, as in :func:`~tl_idempotence.studies.sweep.sweep`. A task that raises
    is retried here ``retries`` times; a task killed by the scheduler (wall time, memory) leaves a start
    marker that :func:`~tl_idempotence.studies.sweep.load_sweep` reports and the next run of the same index
    notes. :func:`~tl_idempotence.studies.sweep.load_sweep` reads the results back.

    Args:
        items, out: as for :func:`~tl_idempotence.studies.sweep.sweep` (no Dask: the items are opened in this
            process).
        index: the item's position in ``items`` (from 0). None: from the scheduler's environment
            (:func:`array_task_index`: ``SLURM_ARRAY_TASK_ID``, ``PBS_ARRAY_INDEX``, ``PBS_ARRAYID``,
            ``LSB_JOBINDEX`` - 1, ``SGE_TASK_ID`` - 1).
        retries: attempts after the first for a task that raises (0..100).
        replan: when ``out/sweep.json`` is the plan of other items, make these the folder's plan instead of
            refusing (as for :func:`~tl_idempotence.studies.sweep.sweep`; the tasks of one array all get the
            same items, so this is for a deliberate new list on an old folder).
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
    resolved = resolve_sweep_items(items)
    dirnames = item_dirnames(resolved)
    index, index_from = _task_index(index, len(resolved))
    record, device_name = ReportOptions.for_elsewhere(
        "run_sweep_item()", options, ("items", "out", "index", "retries", "replan")
    )
    check_device(device_name)  # this process computes: a device it lacks fails before any work
    refuse_outputs_over_inputs([("out", out)], item_inputs(resolved))  # never an item's checkpoint folder
    d = prepare_out(out)  # checked (check_work_folder) before it is created
    run = uuid.uuid4().hex[:12]
    tasks = [SweepTask(it, name, str(d), record, device_name, run) for it, name in zip(resolved, dirnames)]
    write_plan(d, [task_entry(t) for t in tasks], record, device_name, replan)
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


def _task_index(index: Any, n_items: int) -> tuple[int, str]:
    """``(the item index, where it came from)``: ``index`` checked, or the scheduler's (:func:`array_task_index`).

    Raises:
        OptionError / OptionTypeError: no index given and none in the environment; an index that is not an
            integer >= 0, or outside the ``n_items`` items.
    """
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
    if index >= n_items:
        raise OptionError(
            f"Task index {index} ({index_from}) is outside the {n_items} items (0..{n_items - 1}); "
            f"the array must run indices 0..{n_items - 1} (LSF/SGE: 1..{n_items})."
        )
    return index, index_from
