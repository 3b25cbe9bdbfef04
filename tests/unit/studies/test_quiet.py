"""Distributed's shutdown noise is dropped while our cluster shuts down, and nothing else is
(``studies/quiet.py``): records replayed through the loggers distributed writes them to, as a stream handler
on stderr would print them."""

from __future__ import annotations

import io
import logging

import pytest
from distributed.comm.core import CommClosedError
from tornado.iostream import StreamClosedError

from tl_idempotence.studies.quiet import (
    NOISY_LOGGERS,
    QuietClose,
    QuietTaskErrors,
    is_comm_closed,
    quiet_shutdown,
)


def closed_connection() -> CommClosedError:
    """What a heartbeat that meets a closed scheduler raises: tornado's StreamClosedError, re-raised as
    distributed's CommClosedError."""
    try:
        try:
            raise StreamClosedError()
        except StreamClosedError as e:
            raise CommClosedError("in <TCP (closed) ConnectionPool.heartbeat_worker>: Stream is closed") from e
    except CommClosedError as e:
        return e


@pytest.fixture
def stderr_of():
    """``stderr_of(name)``: what a handler on logger ``name`` printed (distributed's own handler sits there)."""
    made = []

    def attach(name: str) -> io.StringIO:
        buf = io.StringIO()
        handler = logging.StreamHandler(buf)
        lg = logging.getLogger(name)
        lg.addHandler(handler)
        made.append((lg, handler))
        return buf

    yield attach
    for lg, handler in made:
        lg.removeHandler(handler)


def log_error(name: str, exc: BaseException, text: str) -> None:
    try:
        raise exc
    except BaseException:
        logging.getLogger(name).exception(text)


def test_closed_connections_are_dropped_only_during_the_shutdown(stderr_of):
    worker = stderr_of("distributed.worker")
    log_error("distributed.worker", closed_connection(), "Failed to communicate with scheduler during heartbeat.")
    assert "Traceback" in worker.getvalue() and "CommClosedError" in worker.getvalue()  # before: as distributed logs
    worker.truncate(0)
    worker.seek(0)
    with quiet_shutdown():
        log_error("distributed.worker", closed_connection(), "Failed to communicate with scheduler during heartbeat.")
        log_error("distributed.core", StreamClosedError(), "Exception while reading")
        assert worker.getvalue() == ""
        # a real error while shutting down is still written, traceback and all
        log_error("distributed.worker", ValueError("a real failure"), "Unexpected exception")
        assert "ValueError: a real failure" in worker.getvalue() and "Traceback" in worker.getvalue()
    worker.truncate(0)
    worker.seek(0)
    log_error("distributed.worker", closed_connection(), "after the shutdown")  # the filter is gone again
    assert "CommClosedError" in worker.getvalue()


def test_what_counts_as_a_closed_connection():
    def record(exc):
        return logging.LogRecord("distributed.core", logging.ERROR, "", 0, "x", (), (type(exc), exc, None))

    assert is_comm_closed(record(closed_connection()))
    assert is_comm_closed(record(StreamClosedError()))
    try:  # a closed connection found while handling it: the chain says so
        try:
            raise closed_connection()
        except CommClosedError:
            raise RuntimeError("while reconnecting")  # noqa: B904 - the implicit chain is what is checked
    except RuntimeError as e:
        assert is_comm_closed(record(e))
    assert not is_comm_closed(record(OSError("disk full")))
    assert not is_comm_closed(logging.LogRecord("distributed", logging.ERROR, "", 0, "no exception", (), None))


def all_filters() -> dict[str, list]:
    return {n: list(lg.filters) for n, lg in logging.root.manager.loggerDict.items() if isinstance(lg, logging.Logger)}


def test_a_closing_worker_drops_closed_connections(stderr_of):
    """The worker plugin's teardown (distributed calls it first in Worker.close) quiets that process's loggers
    (here: this process's, restored afterwards)."""
    buf = stderr_of("distributed.worker")
    for name in NOISY_LOGGERS:
        logging.getLogger(name)
    before = all_filters()
    try:
        QuietClose().teardown(worker=None)
        log_error("distributed.worker", closed_connection(), "Failed to communicate with scheduler during heartbeat.")
        assert buf.getvalue() == ""
        log_error("distributed.worker", KeyError("k"), "Unexpected exception")
        assert "KeyError: 'k'" in buf.getvalue()
    finally:
        for name, lg in logging.root.manager.loggerDict.items():
            if isinstance(lg, logging.Logger):
                lg.filters = before.get(name, [])


def compute_failed(key: str) -> None:
    """distributed.worker's record of a task that raised (worker.py, ``Worker._handle_stimulus_from_task``), with
    the same format and arguments."""
    logging.getLogger("distributed.worker").error(
        "Compute Failed\nKey:       %s\nState:     %s\nTask:  %s\nException: %r\nTraceback: %r\n",
        key,
        "executing",
        f"<Task {key!r} run_sweep_task(...)>",
        "CheckpointError('shard x is truncated')",
        '  File "task.py", line 355, in run_sweep_task\n',
    )


def test_a_recorded_task_error_is_not_logged_by_the_worker_and_nothing_else_is_dropped(stderr_of):
    """A sweep item that raises would be logged by each worker as "Compute Failed" with its traceback on
    stderr, though the sweep records it (res.tasks, res.failed). The worker plugin drops exactly that record for
    the keys of our runs; another task's failure, a worker's other errors and our own other records stay."""
    buf = stderr_of("distributed.worker")
    lg = logging.getLogger("distributed.worker")
    before = list(lg.filters)
    try:
        for prefix in ("tli-sweep", "tli-trajectory"):
            plugin = QuietTaskErrors(prefix)
            plugin.setup(worker=None)
            plugin.setup(worker=None)  # a worker that gets it twice filters once
        assert len(lg.filters) == len(before) + 2
        compute_failed("tli-sweep-bad-871182c2-1")
        compute_failed("tli-trajectory-ck1-0a1b2c3d-2")
        assert buf.getvalue() == ""
        compute_failed("users-own-task-1")  # a task that is not ours: logged as distributed logs it
        compute_failed("tli-sweeping-x")  # not a key of ours (the prefix is "tli-sweep-")
        log_error("distributed.worker", KeyError("k"), "Unexpected exception")  # any other worker error
        lg.error("Compute Failed but without a key")  # no arguments: kept
        out = buf.getvalue()
        assert out.count("Compute Failed") == 3 and "Key:       users-own-task-1" in out
        assert "Key:       tli-sweeping-x" in out and "KeyError: 'k'" in out
        assert QuietTaskErrors("tli-sweep").name != QuietTaskErrors("tli-trajectory").name
    finally:
        lg.filters = before
