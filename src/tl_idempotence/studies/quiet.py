"""Distributed's shutdown noise, silenced while a cluster of ours shuts down, and nowhere else.

When a ``LocalCluster`` closes, the scheduler, the nannies, the client and the worker processes drop their
connections to each other in whatever order the machine's load gives them; a connection read or heartbeat
that meets one already closed is logged by distributed at ERROR with its whole traceback (``CommClosedError``,
tornado's ``StreamClosedError``), on stderr, although every task has ended and nothing failed.

:func:`quiet_shutdown` drops exactly those records — a record whose exception (or the exception it was raised
from) is a closed connection — from distributed's, tornado's and asyncio's loggers in this process, only
while it is active: :func:`~tl_idempotence.studies.cluster.local_cluster` closes its client and cluster under
it, once every task has an outcome. :class:`QuietClose` is a worker plugin that does the same in each worker
process from the moment that worker starts to close (its ``teardown``). Every other record, and every record
before the shutdown, is left as distributed writes it (a worker death, a task's error and a failing
scheduler are all decided and reported by the runner, and still logged).

:class:`QuietTaskErrors` is a worker plugin for the other noise: a task of ours that raises (an item whose
checkpoint is truncated) is logged by each worker as ``distributed.worker - ERROR - Compute Failed`` with its whole
traceback, although the runner records the failure, retries it and reports it in ``res.tasks`` / ``res.failed``
with its reason. It drops exactly those records, for task keys of our runs (``tli-sweep-...``,
``tli-trajectory-...``); a worker's death, a failing scheduler and any other task's error are logged as before.

This module imports ``distributed``; it is imported only where a cluster is started.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

from distributed.comm.core import CommClosedError
from distributed.diagnostics.plugin import WorkerPlugin
from tornado.iostream import StreamClosedError

__all__ = [
    "NOISY_LOGGERS",
    "CommClosedFilter",
    "QuietClose",
    "QuietTaskErrors",
    "RecordedTaskErrorFilter",
    "is_comm_closed",
    "quiet_shutdown",
]

#: Loggers that write distributed's shutdown noise (with every ``distributed.*`` logger that exists).
NOISY_LOGGERS = ("distributed", "tornado", "tornado.application", "tornado.general", "asyncio")


def is_comm_closed(record: logging.LogRecord) -> bool:
    """Whether a log record is about a connection that was closed: its exception, or one in the chain it was
    raised from (``__cause__`` / ``__context__``), is a ``CommClosedError`` or a ``StreamClosedError``."""
    exc = record.exc_info[1] if record.exc_info else None
    if exc is None and isinstance(record.msg, BaseException):
        exc = record.msg
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, (CommClosedError, StreamClosedError)):
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return False


class CommClosedFilter(logging.Filter):
    """Drops the records :func:`is_comm_closed` says are about a closed connection; keeps every other."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not is_comm_closed(record)


def _loggers() -> list[logging.Logger]:
    """:data:`NOISY_LOGGERS` and every ``distributed.*`` logger that exists now (a filter acts on the logger a
    record is made by, not on its parents)."""
    names = set(NOISY_LOGGERS)
    for name, lg in list(logging.root.manager.loggerDict.items()):
        if isinstance(lg, logging.Logger) and name.startswith("distributed."):
            names.add(name)
    return [logging.getLogger(n) for n in sorted(names)]


@contextlib.contextmanager
def quiet_shutdown() -> Iterator[None]:
    """While active, closed-connection records (:func:`is_comm_closed`) are dropped from distributed's,
    tornado's and asyncio's loggers in this process; everything else is logged as usual."""
    noise = CommClosedFilter()
    loggers = _loggers()
    for lg in loggers:
        lg.addFilter(noise)
    try:
        yield
    finally:
        for lg in loggers:
            lg.removeFilter(noise)


class QuietClose(WorkerPlugin):
    """A worker plugin: from the moment its worker starts to close (``teardown``, which distributed calls
    first in ``Worker.close``), closed-connection records are dropped in that worker's process (it ends)."""

    name = "tli-quiet-close"
    idempotent = True

    def teardown(self, worker: Any) -> None:
        noise = CommClosedFilter()
        for lg in _loggers():
            lg.addFilter(noise)


class RecordedTaskErrorFilter(logging.Filter):
    """Drops distributed's ``Compute Failed`` record (``distributed.worker``, one per task that raised, with its
    traceback) when the task's key starts with ``key_prefix``: a task whose error the runner records; keeps every
    other record."""

    def __init__(self, key_prefix: str) -> None:
        super().__init__()
        self.key_prefix = key_prefix

    def filter(self, record: logging.LogRecord) -> bool:
        if not (isinstance(record.msg, str) and record.msg.startswith("Compute Failed")):
            return True
        args = record.args if isinstance(record.args, tuple) else ()
        return not (args and str(args[0]).startswith(self.key_prefix))


class QuietTaskErrors(WorkerPlugin):
    """A worker plugin: in each worker process (present and future), :class:`RecordedTaskErrorFilter` for the
    task keys ``{key_prefix}-...`` of :func:`~tl_idempotence.studies.cluster.run_jobs` (module docstring)."""

    idempotent = True

    def __init__(self, key_prefix: str) -> None:
        self.key_prefix = key_prefix
        self.name = f"tli-quiet-task-errors-{key_prefix}"

    def setup(self, worker: Any) -> None:
        lg = logging.getLogger("distributed.worker")
        if not any(
            isinstance(f, RecordedTaskErrorFilter) and f.key_prefix == self.key_prefix + "-" for f in lg.filters
        ):
            lg.addFilter(RecordedTaskErrorFilter(self.key_prefix + "-"))
