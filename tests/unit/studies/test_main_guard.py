"""The ``__main__``-guard check of the cluster routes (``studies/cluster.py``: ``main_guard_problem``) under
CPython 3.11's AST race: ``ast.parse`` raises ``SystemError: AST constructor recursion depth mismatch`` when another
thread's parse (Python 3.11 formats tracebacks with ``ast``: Dask's threads, when a task fails) interleaves with
it; that SystemError must not come out of ``tli.sweep``. The race is replayed by an ``ast.parse`` that
raises it; the real race needs a garbage collection at the right moment and is not replayable on demand."""

from __future__ import annotations

import ast
import types

import pytest

from tl_idempotence.studies import cluster

MISMATCH = SystemError("AST constructor recursion depth mismatch (before=6, after=104)")
SRC = 'x = 1\nif "__main__" == __name__:\n    run()\n    more()\n'


@pytest.fixture
def parses(monkeypatch):
    """``parses(fail)``: ast.parse raises ``fail(n)`` when it returns an exception (n = the call, from 1), else
    parses; returns the list of calls made."""
    real = ast.parse
    calls: list[int] = []

    def install(fail):
        def fake(source, *a, **k):
            calls.append(len(calls) + 1)
            e = fail(len(calls))
            if e is not None:
                raise e
            return real(source, *a, **k)

        # cluster's own ast (pytest formats its tracebacks with the real one)
        monkeypatch.setattr(cluster, "ast", types.SimpleNamespace(**{**vars(ast), "parse": fake}))
        monkeypatch.setattr(cluster, "_GUARDED_CACHE", {})
        monkeypatch.setattr(cluster.time, "sleep", lambda s: None)
        return calls

    return install


def test_a_parse_that_meets_the_race_is_retried(parses):
    calls = parses(lambda n: MISMATCH if n <= 2 else None)
    assert cluster._guarded_lines(SRC) == [(3, 4)] and calls == [1, 2, 3]


def test_the_race_on_every_attempt_skips_the_check_and_never_escapes(parses):
    calls = parses(lambda n: MISMATCH)
    with pytest.raises(SystemError, match="recursion depth mismatch"):
        cluster._guarded_lines(SRC)
    assert len(calls) == cluster.AST_PARSE_ATTEMPTS
    calls.clear()
    # pytest's own __main__ (a <module> frame on this stack) is what the check reads here
    assert cluster.main_guard_problem("tli.sweep()") is None
    assert len(calls) == cluster.AST_PARSE_ATTEMPTS


def test_another_system_error_is_not_retried(parses):
    calls = parses(lambda n: SystemError("something else"))
    with pytest.raises(SystemError, match="something else"):
        cluster._guarded_lines(SRC)
    assert calls == [1]


def test_the_main_script_is_parsed_once_per_version(parses):
    calls = parses(lambda n: None)
    assert cluster.main_guard_problem("tli.sweep()") is None  # pytest's __main__ is guarded
    first = len(calls)
    assert first == 1 and len(cluster._GUARDED_CACHE) == 1
    assert cluster.main_guard_problem("tli.sweep()") is None and len(calls) == first  # read from the cache
