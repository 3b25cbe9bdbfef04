"""Benchmark: head roles on SmolLM2-135M (issue 29): ``tli.head_roles`` with its defaults and the copying scores.

Usage:  python benchmarks/bench_roles.py [--threads N]

In one process: load the zoo's SmolLM2-135M TransformerBridge (raw weights) and make its report (both timed, not
part of the targets), then time

* ``copying_scores(model)``: the copying score ``Re Σλ / Σ|λ|`` of the full OV circuit of all 270 heads
  (target < 5 s), with its peak memory: the process's peak resident set (Linux ``VmHWM``, reset through
  ``/proc/self/clear_refs`` before the call) above its resident set before the call, against the
  ``d_vocab x d_vocab`` float64 matrix the computation never forms (49,152² x 8 B = 18.0 GiB);
* ``tli.head_roles(model)`` with every default (24-token ``x``, 8 sequences, seed 0; includes the copying scores)
  (target < 30 s), with its peak memory the same way;
* ``rep.roles(roles=...)``: the association with closure alone (5 Spearman permutation tests of 999 permutations,
  Mann-Whitney, BH), given the roles.

Wall and CPU seconds of the process (all threads). ``--threads 0`` (the default) leaves torch's own thread count.
The output is a markdown table with the date, the load average before and after, torch's thread count and the
command line (``benchmarks/RESULTS.md``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any


def loadavg() -> str:
    try:
        return " ".join(f"{v:.2f}" for v in os.getloadavg())
    except OSError:  # pragma: no cover
        return "n/a"


def _status_kb(key: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except OSError:  # pragma: no cover - not Linux
        return None
    return None


def peak_above_start(fn: Any) -> tuple[float, float, float | None, Any]:
    """``(wall s, CPU s, peak RSS above the RSS at the start in GB or None, result)`` of ``fn()``."""
    try:
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS (Linux >= 4.0)
        start = _status_kb("VmRSS")
    except OSError:  # pragma: no cover - not Linux
        start = None
    t, c = time.perf_counter(), time.process_time()
    out = fn()
    wall, cpu = time.perf_counter() - t, time.process_time() - c
    hwm = _status_kb("VmHWM")
    peak = (hwm - start) / 1024**2 if start is not None and hwm is not None else None
    return wall, cpu, peak, out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=0, help="torch intra-op threads (default 0: torch's own)")
    args = ap.parse_args(argv)

    import torch

    import tl_idempotence as tli
    from tl_idempotence.probes.roles import copying_scores

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    load_before = loadavg()
    wall_load, _, _, model = peak_above_start(lambda: tli.models.load("smollm2-135m", progress=False))
    wall_rep, _, _, rep = peak_above_start(lambda: model.idempotence_report(progress=False))
    d_vocab = int(model.cfg.d_vocab)
    dense_gb = d_vocab**2 * 8 / 1024**3
    w_cop, c_cop, m_cop, (table, _, _) = peak_above_start(lambda: copying_scores(model))
    w_roles, c_roles, m_roles, roles = peak_above_start(lambda: tli.head_roles(model))
    w_assoc, c_assoc, _, assoc = peak_above_start(lambda: rep.roles(roles=roles))
    load_after = loadavg()

    def gb(v: float | None) -> str:
        return "n/a" if v is None else f"{v:.3f} GiB ({v / dense_gb:.2%} of d_vocab² float64)"

    print(f"## head roles on SmolLM2-135M — `python {' '.join(sys.argv)}`\n")
    print(
        f"{dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC, {platform.machine()}, {os.cpu_count()} CPUs, torch "
        f"{torch.__version__} ({torch.get_num_threads()} threads), load average {load_before} before, "
        f"{load_after} after. Model load {wall_load:.1f} s and report {wall_rep:.1f} s (not part of the targets). "
        f"d_vocab = {d_vocab}: a d_vocab² float64 matrix would take {dense_gb:.1f} GiB.\n"
    )
    print("| what | wall | CPU | peak RSS above start | target |")
    print("| --- | --- | --- | --- | --- |")
    print(f"| copying scores, {len(table)} heads | {w_cop:.2f} s | {c_cop:.2f} s | {gb(m_cop)} | < 5 s |")
    print(f"| `tli.head_roles(model)`, defaults | {w_roles:.2f} s | {c_roles:.2f} s | {gb(m_roles)} | < 30 s |")
    print(f"| `rep.roles(roles=...)`: association only | {w_assoc:.2f} s | {c_assoc:.2f} s | | |")
    a = assoc.association
    print(
        f"\nassociation: |copying| ρ = {a.loc['|copying|', 'spearman_rho']:.3f}, Mann-Whitney q = "
        f"{a.loc['|copying|', 'mannwhitney_q']:.2g}; closed heads {int(assoc.summary['n_closed'])}."
    )


if __name__ == "__main__":
    main()
