"""The Dask machinery that sweeps and trajectories share: a ``LocalCluster`` sized to this machine, the
``if __name__ == "__main__":`` check, and a task runner for which a dying worker is an ordinary event.

:func:`run_jobs` submits one Dask task per job and decides each job's outcome itself, never from a
future's status after Dask rescheduled it:

* a task that returns gives the job its result (fetched at once, then the future is released, so a
  worker that dies later cannot make Dask run it again);
* a task that raises is retried ``retries`` times (each retry a new task), then the job is an error;
* a task whose worker died (``KilledWorker``, a cancelled future) is looked up on disk through the
  caller's ``probe``: it may have finished (its result was lost with the worker: the job is done), it may
  have started and never ended (a death charged to this job: retried like an error, then the job is
  ``died`` with each death's exit code when the worker's nanny logged it), or it never started (it only
  waited on that worker: resubmitted without charge, at most :data:`MAX_REQUEUES` times);
* while the cluster has no worker at all for ``worker_timeout`` seconds, the runner stops with
  :class:`~tl_idempotence.errors.ClusterError` instead of waiting forever.

:func:`local_cluster` starts the ``LocalCluster`` a sweep uses when it is given no cluster: one
single-threaded worker process per core, Dask's ``allowed-failures`` set to 0 (a worker death is
reported at once, not retried behind the runner's back up to 3 times, each costing a worker),
``worker-saturation`` 1.0 (a worker holds only the task it runs, so a death takes no queued task with
it) and ``lost-worker-timeout`` 10 minutes (Dask's 15 s closed for good the nanny of a worker that took
longer to restart on a loaded machine: the sweep was then left without workers). It refuses, in one
line, a script that would start it outside the ``__main__`` guard (Dask's workers re-import the main
script; without the guard each would start a sweep of its own).

:func:`run_trajectory_on_cluster` is the trajectory's cluster runner (``trajectory(client=...)``): one job
per checkpoint on :func:`run_jobs`, its resume parts in :func:`cache_name`'s folder. The sweep's driver is
:mod:`tl_idempotence.studies.sweep`.
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import json
import os
import re
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..analyses.report_options import ReportOptions
from ..core.options import check_int
from ..errors import ClusterError, MissingExtraError, OptionError, OptionTypeError
from ..report.report import IdempotenceReport, report_with_options

__all__ = [
    "CLUSTER_INSTALL",
    "DEFAULT_RETRIES",
    "DEFAULT_WORKER_TIMEOUT",
    "LOCAL_CLUSTER_SETTINGS",
    "MAX_REQUEUES",
    "UNSAFE_CHARS",
    "Job",
    "Outcome",
    "Probe",
    "cache_name",
    "check_cluster_trajectory",
    "check_main_guard",
    "describe_deaths",
    "local_cluster",
    "machine_cores",
    "main_guard_problem",
    "require_cluster",
    "run_jobs",
    "run_trajectory_on_cluster",
]

#: The pip command that installs the cluster engine (the ``[cluster]`` extra: ``dask`` and ``distributed``).
CLUSTER_INSTALL = 'pip install "tl_idempotence[cluster]"'
#: Default number of retries of a failed task (so up to 3 attempts).
DEFAULT_RETRIES = 2
#: Characters a folder name made from a label never holds (each run of them becomes ``_``).
UNSAFE_CHARS = re.compile(r"[^A-Za-z0-9._-]+")
#: Seconds :func:`run_jobs` waits while the cluster has no worker at all before it raises ClusterError.
DEFAULT_WORKER_TIMEOUT = 120.0
#: Resubmissions of a job whose task a worker death took down before it started (not charged to the job).
MAX_REQUEUES = 10
#: The Dask settings of the LocalCluster a sweep starts (module docstring), in force while it runs.
#: ``lost-worker-timeout``: a LocalCluster closes for good a nanny whose worker has not come back within
#: this time (Dask's default 15 s); a worker restart (spawn a process, import torch) on a loaded machine
#: can take longer — measured 15.1 s here — after which the sweep had no worker left and waited forever.
LOCAL_CLUSTER_SETTINGS = {
    "distributed.scheduler.allowed-failures": 0,
    "distributed.scheduler.worker-saturation": 1.0,
    "distributed.deploy.lost-worker-timeout": "10 minutes",
}
#: Seconds between two looks at the cluster's workers.
_WORKER_CHECK_EVERY = 2.0
_UNKNOWN = "died (exit code unknown)"
#: How long :func:`describe_deaths` waits for the nannies' exit lines (bounded: a nanny killed with its
#: worker never logs one).
_DEATH_LOG_WAIT_S = 5.0
_DEATH_RE = re.compile(r"Worker process (\d+) (exited with status (-?\d+)|was killed by (unknown signal|signal (\d+)))")


def machine_cores() -> int:
    """The cores this process may run on (its CPU affinity where the OS has one, else ``os.cpu_count()``)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - macOS / Windows
        return os.cpu_count() or 1


# --------------------------------------------------------------------------- the __main__ guard


def _is_main_check(node: ast.expr) -> bool:
    """``__name__ == "__main__"`` (either side)."""
    if not (isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], ast.Eq)):
        return False
    sides = [node.left, node.comparators[0]]
    names = [s for s in sides if isinstance(s, ast.Name) and s.id == "__name__"]
    consts = [s for s in sides if isinstance(s, ast.Constant) and s.value == "__main__"]
    return len(names) == 1 and len(consts) == 1


#: Attempts at :func:`ast.parse` that meet CPython's ``SystemError: AST constructor recursion depth mismatch``.
AST_PARSE_ATTEMPTS = 5

#: ``{(path, mtime_ns, size): guarded line ranges}`` of main scripts already read (:func:`main_guard_problem`).
_GUARDED_CACHE: dict[tuple[str, int, int], list[tuple[int, int]]] = {}


def _parse(source: str) -> ast.Module:
    """``ast.parse(source)``, retried when CPython 3.11 raises ``SystemError: AST constructor recursion depth
    mismatch``: its AST constructor keeps its recursion depth in interpreter-wide state, so a parse in another
    thread at another stack depth (Python 3.11 formats every traceback with :mod:`ast`: Dask's and tornado's
    threads in this process, when a task fails and its error is logged) that a garbage collection interleaves
    with ours makes a correct parse fail (python/cpython#106905). The parse itself is deterministic: a retry
    gives the tree.

    Raises:
        SyntaxError / ValueError: as ``ast.parse``. SystemError: any other, or the mismatch on every one of
            :data:`AST_PARSE_ATTEMPTS` attempts.
    """
    for attempt in range(1, AST_PARSE_ATTEMPTS + 1):
        try:
            return ast.parse(source)
        except SystemError as e:
            if "recursion depth mismatch" not in str(e) or attempt == AST_PARSE_ATTEMPTS:
                raise
            time.sleep(0.01 * attempt)  # let the other thread's parse finish
    raise AssertionError("unreachable")  # pragma: no cover


def _guarded_lines(source: str) -> list[tuple[int, int]]:
    """Line ranges (first, last) of the bodies of ``if __name__ == "__main__":`` blocks in ``source``."""
    tree = _parse(source)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _is_main_check(node.test) and node.body:
            out.append((node.body[0].lineno, max(n.end_lineno or n.lineno for n in node.body)))
    return out


def main_guard_problem(what: str) -> str | None:
    """The one-line answer when ``what`` (e.g. ``"tli.sweep()"``) is being called where starting Dask worker
    processes would re-run it, or None.

    Two cases: this process is itself a worker that is importing the main script (``__mp_main__``), or the
    call runs while the main script's top-level code runs and the line of the script that leads to it is not
    inside an ``if __name__ == "__main__":`` block (read from the script's source with :mod:`ast`, once per
    version of the file; a parse that meets CPython's AST recursion-depth race is retried, :func:`_parse`). A
    notebook, ``python -c``, an interactive session, a call from a function that runs after the script's
    top level (or a script whose source cannot be read, or that CPython's race keeps from being parsed) is never
    flagged.
    """
    import inspect
    import multiprocessing

    main = sys.modules.get("__main__")
    fix = (
        f"{what} starts Dask worker processes, which re-import the main script: put the call under "
        '`if __name__ == "__main__":` (see docs/sweeps.md)'
    )
    if multiprocessing.parent_process() is not None and getattr(main, "__name__", None) == "__mp_main__":
        return f"{what} was called while a Dask worker process imported the main script. {fix}."
    path = getattr(main, "__file__", None)
    if main is None or not path:
        return None
    frame = inspect.currentframe()
    line = None
    while frame is not None:
        if frame.f_globals is vars(main) and frame.f_code.co_name == "<module>":
            line = frame.f_lineno
        frame = frame.f_back
    if line is None:
        return None
    try:
        st = os.stat(path)
        key = (os.path.realpath(path), st.st_mtime_ns, st.st_size)
        guarded = _GUARDED_CACHE.get(key)
        if guarded is None:  # read once per version of the script: later sweeps of a session parse nothing
            with open(path, "rb") as f:
                source = f.read().decode("utf-8")
            guarded = _GUARDED_CACHE[key] = _guarded_lines(source)
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
        return None
    except SystemError:  # CPython's AST race on every attempt (_parse): the source cannot be read now
        return None
    if any(first <= line <= last for first, last in guarded):
        return None
    return f"{path}, line {line}: {fix}."


def require_cluster(what: str) -> None:
    """Refuse, before any work, an entry point that needs the cluster engine when ``dask`` or ``distributed``
    is not installed (they are the optional ``[cluster]`` extra).

    Args:
        what: the entry point, as the message names it (``"tli.sweep()"``, ``"tl-idempotence sweep"``).

    Raises:
        MissingExtraError: ``dask`` or ``distributed`` cannot be imported (one line naming
            ``pip install "tl_idempotence[cluster]"``).
    """
    missing = []
    for name in ("dask", "distributed"):
        try:
            __import__(name)
        except ImportError:
            missing.append(name)
    if missing:
        verb = "is" if len(missing) == 1 else "are"
        raise MissingExtraError(
            f"{what} runs on a Dask cluster and needs {' and '.join(missing)}, which {verb} not installed: "
            f"{CLUSTER_INSTALL} (a job array, --task-index, and tli.load_sweep need neither)."
        )


def check_main_guard(what: str) -> None:
    """Raise :class:`ClusterError` with the one-line fix when :func:`main_guard_problem` finds one."""
    problem = main_guard_problem(what)
    if problem is not None:
        raise ClusterError(problem)


@contextlib.contextmanager
def local_cluster(n_workers: int, what: str = "tli.sweep()") -> Iterator[tuple[Any, Any]]:
    """``(client, cluster)`` of a fresh ``distributed.LocalCluster`` (closed on exit).

    ``n_workers`` single-threaded worker processes (Dask's nannies start them with ``OMP_NUM_THREADS=1``),
    :data:`LOCAL_CLUSTER_SETTINGS` in force until it is closed (module docstring), no dashboard port clash.
    The client is closed first, then the cluster, with distributed's closed-connection logging of that shutdown dropped
    (:mod:`tl_idempotence.studies.quiet`: a successful run leaves no traceback on stderr).

    Raises:
        MissingExtraError: ``dask`` or ``distributed`` is not installed (:func:`require_cluster`).
        ClusterError: the call is not under the ``__main__`` guard of a script (checked before anything
            starts); the cluster's workers could not start (the first line of Dask's error, and the guard hint).
    """
    require_cluster(what)
    check_main_guard(what)
    import logging

    import dask
    from distributed import Client, LocalCluster

    with dask.config.set(LOCAL_CLUSTER_SETTINGS):  # for the cluster's whole life: the deploy setting is read
        try:  # each time a worker leaves
            cluster = LocalCluster(
                n_workers=n_workers,
                threads_per_worker=1,
                processes=True,
                dashboard_address=":0",
                silence_logs=logging.ERROR,
            )
        except Exception as e:
            first = (str(e).strip().splitlines() or [""])[0]
            raise ClusterError(
                f"Dask could not start a LocalCluster of {n_workers} worker process(es) for {what} "
                f"({type(e).__name__}: {first}). In a script, the call must be under "
                '`if __name__ == "__main__":`; otherwise check memory and the temporary folder.'
            ) from e
        client = Client(cluster)
        from .quiet import QuietClose, quiet_shutdown

        with contextlib.suppress(Exception):  # best effort: without it a closing worker may log its closed links
            client.register_plugin(QuietClose())
        try:
            yield client, cluster
        finally:  # every task has an outcome: a connection found closed from here on is shutdown noise
            with quiet_shutdown():
                client.close()  # the client first: the scheduler it talks to is still up
                cluster.close()


# --------------------------------------------------------------------------- the runner


@dataclass(frozen=True)
class Job:
    """One unit of work: ``fn(*args, attempt)`` runs on a worker (``attempt`` counts from 1).

    Attributes:
        name: unique among the jobs of one run (a label; used in task keys and messages).
        fn: a function the workers can import (or that cloudpickle ships by value).
        args: its arguments (small: paths, names, options).
    """

    name: str
    fn: Callable[..., Any]
    args: tuple[Any, ...]


@dataclass(frozen=True)
class Probe:
    """What the disk says about an attempt of a job that ended without a result.

    Attributes:
        done: the attempt (or an earlier one of this run) finished; its result is ``value``.
        value: the result as the task recorded it.
        died: ``(host, pid, worker address)`` of each start of the attempt that never ended (a death
            charged to the job). Empty and not done: the attempt never started (only waited on a worker).
    """

    done: bool = False
    value: Any = None
    died: tuple[tuple[str, int, str], ...] = ()


@dataclass
class Outcome:
    """How a job ended.

    Attributes:
        name: the job's name.
        status: ``"ok"`` (``value`` is its result), ``"error"`` (``error`` is the last exception it
            raised) or ``"died"`` (its worker died on every attempt; ``deaths`` says how).
        attempts: attempts that ran (the successful one included).
        deaths: one line per worker death charged to the job (exit code when the nanny logged it).
        died: ``(host, pid, worker address)`` of each of those deaths (``pid`` -1 when unknown).
        requeues: resubmissions after deaths that were not its own (it had not started).
    """

    name: str
    status: str = "pending"
    value: Any = None
    error: BaseException | None = None
    attempts: int = 0
    deaths: list[str] = field(default_factory=list)
    died: list[tuple[str, int, str]] = field(default_factory=list)
    requeues: int = 0


def _n_workers(client: Any) -> int:
    """Workers the scheduler knows now (0 when it cannot be asked within 10 s)."""
    try:
        try:  # distributed >= 2025: a count without every worker's details
            info = client.sync(client.scheduler.identity, n_workers=1, callback_timeout=10)
        except TypeError:
            info = client.sync(client.scheduler.identity, callback_timeout=10)
        return int(info.get("n_workers", len(info.get("workers", {}))))
    except Exception:  # noqa: BLE001 - a scheduler that cannot be asked counts as one without workers
        return 0


def _nanny_logs(client: Any, cluster: Any) -> list[tuple[str, str]]:
    """``(worker host, log line)`` of every nanny that can be asked (best effort, bounded)."""
    lines: list[tuple[str, str]] = []
    if cluster is not None:  # our LocalCluster: the nannies live in this process
        for nanny in list(getattr(cluster, "workers", {}).values()):
            with contextlib.suppress(Exception):
                lines += [("", str(msg)) for _, msg in nanny.get_logs()]
        return lines
    with contextlib.suppress(Exception):
        logs = client.sync(client.scheduler.worker_logs, n=None, workers=None, nanny=True, callback_timeout=10)
        for addr, entries in (logs or {}).items():
            host = _host_of(str(addr))
            lines += [(host, str(e[-1])) for e in entries if isinstance(e, (list, tuple)) and e]
    return lines


def _host_of(address: str) -> str:
    rest = address.split("://", 1)[-1]
    return rest.rsplit(":", 1)[0]


def describe_deaths(client: Any, cluster: Any, died: Sequence[tuple[str, int, str]]) -> list[str]:
    """One line per death: ``"worker process 1234 exited with status 1"``, ``"... was killed by signal 9"``
    or ``"... exit code unknown"`` — from the lines the workers' nannies logged (a nanny that died with its
    worker, as in a batch job killed at its wall time, logged nothing).

    Args:
        client: the ``distributed.Client``.
        cluster: our ``LocalCluster`` (its nannies are read in this process), or None (asked through the
            scheduler, 10 s at most).
        died: ``(host, pid, worker address)`` of each death.
    """
    if not died:
        return []
    wanted = {("" if cluster is not None else _host_of(address), pid) for _, pid, address in died if pid >= 0}
    codes: dict[tuple[str, int], str] = {}
    deadline = time.monotonic() + _DEATH_LOG_WAIT_S
    while True:  # a nanny may log its worker's exit a moment after the scheduler saw the worker go
        for host, line in _nanny_logs(client, cluster):
            m = _DEATH_RE.search(line)
            if m is None:
                continue
            pid = int(m.group(1))
            if m.group(3) is not None:
                text = f"exited with status {m.group(3)}"
            elif m.group(5) is not None:
                text = f"was killed by signal {m.group(5)}"
            else:
                text = "was killed by an unknown signal"
            codes[(host, pid)] = text
        if wanted <= codes.keys() or time.monotonic() >= deadline:
            break
        time.sleep(0.5)
    out = []
    for _, pid, address in died:
        if pid < 0:
            out.append("a worker process died (exit code unknown)")
            continue
        host = "" if cluster is not None else _host_of(address)
        out.append(f"worker process {pid} {codes.get((host, pid), _UNKNOWN)}")
    return out


def run_jobs(
    client: Any,
    jobs: Sequence[Job],
    *,
    retries: int,
    key_prefix: str,
    probe: Callable[[Job, int], Probe] | None = None,
    cluster: Any = None,
    worker_timeout: float | None = DEFAULT_WORKER_TIMEOUT,
    on_done: Callable[[Outcome], None] | None = None,
    poll: float = 0.1,
) -> dict[str, Outcome]:
    """Run every job as Dask tasks until each has an outcome (module docstring).

    Args:
        client: a ``distributed.Client``.
        jobs: the jobs (unique names).
        retries: attempts after the first for a job whose task raised or whose worker died (0..100).
        key_prefix: task keys are ``{key_prefix}-{name}-{run}-{n}``.
        probe: ``probe(job, attempt)`` reads the disk after an attempt ended without a result (see
            :class:`Probe`); without one, every ``KilledWorker`` counts as a death of that job.
        cluster: our LocalCluster (exit codes are read from its nannies), or None.
        worker_timeout: seconds with no worker in the cluster before :class:`ClusterError` (None: wait).
        on_done: called with each job's final outcome as it is decided (progress bars).
        poll: seconds between looks at the futures while none changed.

    Returns:
        ``{name: Outcome}`` for every job.

    Raises:
        MissingExtraError: ``dask`` or ``distributed`` is not installed (:func:`require_cluster`).
        ClusterError: the cluster had no worker for ``worker_timeout`` seconds (the unfinished tasks are
            cancelled; what finished is on disk wherever the tasks wrote it).
    """
    require_cluster(f"the Dask runner ({key_prefix})")
    from distributed import KilledWorker

    from .quiet import QuietTaskErrors

    with contextlib.suppress(Exception):  # best effort: the workers' "Compute Failed" tracebacks of errors we record
        client.register_plugin(QuietTaskErrors(key_prefix))
    outcomes = {j.name: Outcome(j.name) for j in jobs}
    state = _JobsRun(client, retries, key_prefix, probe, cluster, on_done, KilledWorker, outcomes)
    for j in jobs:
        state.submit(j, 1)
    watch = _WorkerWatch(worker_timeout, next_check=time.monotonic() + _WORKER_CHECK_EVERY)
    try:
        while state.pending:
            changed = False
            for fut in list(state.pending):
                status = fut.status
                if status not in ("finished", "error", "cancelled"):
                    continue
                changed = True
                state.settle(fut, status)
            watch.check(client, state.outcomes, len(jobs))
            if not changed:
                time.sleep(poll)
    finally:
        for fut in state.pending:
            fut.cancel()
    _redescribe(client, cluster, state.outcomes)
    return state.outcomes


@dataclass
class _JobsRun:
    """One :func:`run_jobs` call: every job's outcome so far and the futures still pending (``{future: (job,
    attempt)}``); its steps decide what an ended attempt means (module docstring)."""

    client: Any
    retries: int
    key_prefix: str
    probe: Callable[[Job, int], Probe] | None
    cluster: Any
    on_done: Callable[[Outcome], None] | None
    killed: type[BaseException]  # distributed.KilledWorker
    outcomes: dict[str, Outcome]
    run: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    pending: dict[Any, tuple[Job, int]] = field(default_factory=dict)
    submitted: dict[str, int] = field(default_factory=dict)

    def submit(self, job: Job, attempt: int) -> None:
        """A new task for ``attempt`` of ``job`` (its key numbered by the job's submissions)."""
        n = self.submitted[job.name] = self.submitted.get(job.name, 0) + 1
        key = f"{self.key_prefix}-{job.name}-{self.run}-{n}"
        fut = self.client.submit(job.fn, *job.args, attempt, key=key, retries=0, pure=False)
        self.pending[fut] = (job, attempt)

    def finish(self, o: Outcome, status: str) -> None:
        """The job's final outcome (a death's exit codes asked of the nannies), told to ``on_done``."""
        o.status = status
        if status == "died":
            o.deaths = describe_deaths(self.client, self.cluster, o.died) + o.deaths
        if self.on_done is not None:
            self.on_done(o)

    def failed_attempt(self, job: Job, attempt: int, status: str) -> None:
        """An attempt that raised or died: retried while retries are left, else the job ends with ``status``."""
        o = self.outcomes[job.name]
        o.attempts += 1
        if o.attempts <= self.retries:
            self.submit(job, attempt + 1)
        else:
            self.finish(o, status)

    def lost(self, job: Job, attempt: int, charged_without_probe: bool) -> None:
        """The attempt ended without a result: decide from the disk."""
        o = self.outcomes[job.name]
        p = self.probe(job, attempt) if self.probe is not None else None
        if p is not None and p.done:
            o.value = p.value
            o.attempts += 1
            self.finish(o, "ok")
        elif (p is not None and p.died) or (p is None and charged_without_probe):
            o.died += list(p.died) if p is not None else [("", -1, "")]
            self.failed_attempt(job, attempt, "died")
        else:
            o.requeues += 1
            if o.requeues > MAX_REQUEUES:
                o.deaths.append(f"its task was lost {o.requeues} times before it started (workers died or left)")
                self.finish(o, "died")
            else:
                self.submit(job, attempt)

    def settle(self, fut: Any, status: str) -> None:
        """A future that ended (``status``: ``"finished"``, ``"error"`` or ``"cancelled"``): its result fetched
        once and the future released, or the attempt retried, charged or resubmitted."""
        from concurrent.futures import CancelledError

        job, attempt = self.pending.pop(fut)
        o = self.outcomes[job.name]
        if status == "finished":
            try:
                o.value = fut.result(timeout=10)
            except (TimeoutError, CancelledError):  # its data went with a worker: the disk decides
                fut.release()
                self.lost(job, attempt, charged_without_probe=False)
                return
            except Exception as e:  # noqa: BLE001 - a result that cannot be fetched is that attempt's error
                o.error = e
                fut.release()
                self.failed_attempt(job, attempt, "error")
                return
            fut.release()
            o.attempts += 1
            self.finish(o, "ok")
        elif status == "error":
            try:
                exc = fut.exception(timeout=10)
            except Exception as e:  # noqa: BLE001 - an error that cannot be fetched: the disk decides
                exc = e
            fut.release()
            if isinstance(exc, (self.killed, CancelledError, TimeoutError)):
                self.lost(job, attempt, charged_without_probe=isinstance(exc, self.killed))
            else:
                o.error = exc
                self.failed_attempt(job, attempt, "error")
        else:  # cancelled by the scheduler or a reconnecting client, not by us
            fut.release()
            self.lost(job, attempt, charged_without_probe=False)


@dataclass
class _WorkerWatch:
    """How long the cluster has had no worker (looked at every :data:`_WORKER_CHECK_EVERY` seconds)."""

    worker_timeout: float | None
    next_check: float
    no_worker_since: float | None = None

    def check(self, client: Any, outcomes: dict[str, Outcome], n_jobs: int) -> None:
        """Look at the cluster's workers when it is time to.

        Raises:
            ClusterError: no worker for more than ``worker_timeout`` seconds (names the unfinished jobs).
        """
        now = time.monotonic()
        if now < self.next_check:
            return
        self.next_check = now + _WORKER_CHECK_EVERY
        if _n_workers(client):
            self.no_worker_since = None
        elif self.no_worker_since is None:
            self.no_worker_since = now
        elif self.worker_timeout is not None and now - self.no_worker_since > self.worker_timeout:
            left = [o.name for o in outcomes.values() if o.status == "pending"]
            raise ClusterError(
                f"The Dask cluster has had no worker for {self.worker_timeout:g} s with {len(left)} of {n_jobs} "
                f"tasks unfinished ({', '.join(left[:10])}{', ...' if len(left) > 10 else ''}): its workers "
                "died or left and none came back. What finished is kept; rerun to finish the rest (give the "
                "cluster workers, or a larger worker_timeout while a batch system starts them)."
            )


def _redescribe(client: Any, cluster: Any, outcomes: dict[str, Outcome], budget: float = 10.0) -> None:
    """Ask a remote cluster's nannies again, for at most ``budget`` seconds, for exit codes still unknown: the
    scheduler reaches a nanny only through its worker, and a nanny whose worker died is reachable again only
    once it has restarted that worker (a nanny that died with it, as in a batch job killed at its wall time,
    never answers: the code stays unknown)."""
    if cluster is not None:
        return
    todo = [o for o in outcomes.values() if o.status == "died" and any(_UNKNOWN in d for d in o.deaths)]
    end = time.monotonic() + budget
    while todo and time.monotonic() < end:
        time.sleep(1.0)
        for o in todo:
            o.deaths = describe_deaths(client, cluster, o.died) + [d for d in o.deaths if d.startswith("its task")]
        todo = [o for o in todo if any(_UNKNOWN in d for d in o.deaths)]


# --------------------------------------------------------------------------- trajectories


def _trajectory_task(
    path: str, record: dict[str, Any], device: str, resume: str | None, attempt: int = 1
) -> tuple[IdempotenceReport, float]:
    """One checkpoint's report on a worker and the seconds it took to open and measure it."""
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
    key = hashlib.sha256(json.dumps(opts.key(), sort_keys=True).encode()).hexdigest()[:12]
    return f"{order:04d}-{_slug(label)}-{key}"


def _slug(label: str) -> str:
    return UNSAFE_CHARS.sub("_", label)[:60] or "ckpt"


def check_cluster_trajectory(ckpts: Sequence[Any], client: Any, loader: Any = None) -> None:
    """Refuse, before any work, a trajectory that cannot run on a Dask cluster.

    Args:
        ckpts: the trajectory's checkpoint records (``label``, ``kind``).
        client: what was given as ``client``.
        loader: what was given as ``loader`` (must be None: workers open paths with the built-in reader).

    Raises:
        MissingExtraError: ``dask`` or ``distributed`` is not installed (:func:`require_cluster`).
        OptionTypeError: ``client`` is not a ``distributed.Client``.
        OptionError: a ``loader`` (it would never run), checkpoints that are not paths (a model object,
            a hub spec or a callable cannot be opened on a worker).
    """
    require_cluster("tli.trajectory(client=...)")
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
    """One task per checkpoint on ``client`` for :func:`~tl_idempotence.studies.trajectory.trajectory` (SPEC §6).

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
        MissingExtraError: ``dask`` or ``distributed`` is not installed.
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
