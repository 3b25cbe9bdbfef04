"""What the benchmarks share: the load average, wall and CPU time of a call with the peak resident set it added,
cores kept busy for a loaded run, and the markdown lines of ``benchmarks/RESULTS.md``.

A benchmark runs as ``python benchmarks/bench_<name>.py`` (this folder is first on ``sys.path``) and imports
``from _harness import ...``. Imports nothing beyond the standard library.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

__all__ = [
    "bench_parser",
    "busy_cores",
    "loadavg",
    "md_header",
    "md_row",
    "peak_above_start",
    "setting",
    "status_kb",
    "timed",
    "use_threads",
]


def loadavg() -> str:
    """The 1, 5 and 15 minute load averages, ``"0.52 0.61 0.70"``, or ``"n/a"`` where the system has none."""
    try:
        return " ".join(f"{v:.2f}" for v in os.getloadavg())
    except OSError:  # pragma: no cover - not Unix
        return "n/a"


def status_kb(key: str) -> int | None:
    """A ``kB`` field of ``/proc/self/status`` (``VmRSS``, ``VmHWM``), or None off Linux."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except OSError:  # pragma: no cover - not Linux
        return None
    return None


def timed(fn: Callable[[], Any]) -> tuple[float, float, Any]:
    """``(wall s, CPU s of the process, all threads, result)`` of ``fn()``."""
    t, c = time.perf_counter(), time.process_time()
    out = fn()
    return time.perf_counter() - t, time.process_time() - c, out


def smollm2_and_report() -> tuple[Any, Any, float, float]:
    """``(model, report, wall s of the load, wall s of the report)``: the zoo's SmolLM2-135M and its report, both
    timed (not part of any target) and said on stderr with the closed heads' count: what the forward-pass
    benchmarks start from."""
    import tl_idempotence as tli

    wall_load, _, model = timed(lambda: tli.models.load("smollm2-135m", progress=False))
    wall_rep, _, rep = timed(lambda: model.idempotence_report(progress=False))
    print(f"load {wall_load:.1f} s, report {wall_rep:.1f} s; {len(rep.closed_heads)} closed heads", file=sys.stderr)
    return model, rep, wall_load, wall_rep


def peak_above_start(fn: Callable[[], Any]) -> tuple[float, float, float | None, Any]:
    """``(wall s, CPU s, peak RSS above the RSS at the start in GiB or None, result)`` of ``fn()``: the process's
    peak resident set (Linux ``VmHWM``, reset through ``/proc/self/clear_refs`` before the call) above its resident
    set before the call."""
    try:
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS (Linux >= 4.0)
        start = status_kb("VmRSS")
    except OSError:  # pragma: no cover - not Linux
        start = None
    wall, cpu, out = timed(fn)
    hwm = status_kb("VmHWM")
    peak = (hwm - start) / 1024**2 if start is not None and hwm is not None else None
    return wall, cpu, peak, out


@contextlib.contextmanager
def busy_cores(n: int) -> Iterator[None]:
    """``n`` processes that each keep one core busy, for the duration of the block."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        time.sleep(1.0)
        yield
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


def md_row(*cells: object) -> str:
    """One markdown table row, ``| a | b |``."""
    return "| " + " | ".join(str(c) for c in cells) + " |"


def md_header(*columns: str) -> str:
    """A markdown table's header row and its rule, ``| a | b |`` then ``| --- | --- |``."""
    return md_row(*columns) + "\n" + md_row(*("---" for _ in columns))


def setting(load_before: str) -> str:
    """Where and when a benchmark ran: ``"2026-12-05, x86_64 with 2 CPUs, torch 2.13.0 (2 torch thread(s)); load
    average before 0.52 0.61 0.70, after ..."`` (the load after is read now)."""
    import datetime as dt
    import platform

    import torch

    return (
        f"{dt.date.today().isoformat()}, {platform.machine()} with {os.cpu_count()} CPUs, torch {torch.__version__} "
        f"({torch.get_num_threads()} torch thread(s)); load average before {load_before}, after {loadavg()}"
    )


def bench_parser(doc: str, threads: int = 0) -> argparse.ArgumentParser:
    """A benchmark's argument parser, described by its docstring's first line, with ``--threads`` (default
    ``threads``; 0: torch's own count, :func:`use_threads`)."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    own = ": torch's own" if threads == 0 else "; 0: torch's own"
    ap.add_argument("--threads", type=int, default=threads, help=f"torch intra-op threads (default {threads}{own})")
    return ap


def use_threads(n: int) -> None:
    """``torch.set_num_threads(n)`` for ``n > 0``; torch's own count otherwise."""
    if n > 0:
        import torch

        torch.set_num_threads(n)
