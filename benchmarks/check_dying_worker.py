"""Issue 21's check: a sweep whose one item kills its worker, run N times, each in a fresh process.

Each run calls, on a fresh ``OUT``::

    tli.sweep({"good0": ck0, "good1": ck1, "good2": ck2, "dies": f}, out=OUT, workers=2)

where ``f`` is a zero-argument callable that calls ``os._exit(1)`` on the worker (what an OOM kill or a
wall-time kill looks like), with the default LocalCluster. A run passes when it finishes within 3 minutes,
``.failed`` is exactly ``dies`` and the three healthy items are ``computed``. Prints one line per run
(outcome, wall time measured outside the process, the load average) and exits 1 if any run failed.

The checkpoints are three small random Llama checkpoints (``tl_idempotence.testing.tiny_hf_dir``, seeds
0-2), written once into the work folder. Usage::

    python benchmarks/check_dying_worker.py                # 5 runs
    python benchmarks/check_dying_worker.py --runs 2 --dir /tmp/dying
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LIMIT = 180.0  # seconds: the bound for one run

ONE_RUN = """
import json, os, sys, time, warnings
import tl_idempotence as tli


def dies():
    os._exit(1)


if __name__ == "__main__":
    items = json.loads(sys.argv[1])
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the failed item is in res.failed
        res = tli.sweep({**items, "dies": dies}, out=sys.argv[2], workers=2, progress=False)
    print(json.dumps({
        "seconds_in_sweep": time.perf_counter() - t0,
        "status": dict(zip(res.tasks["label"], res.tasks["status"])),
        "attempts": dict(zip(res.tasks["label"], res.tasks["attempts"].astype(int).tolist())),
        "failed": res.failed.to_dict(orient="records"),
    }))
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--dir", type=Path, default=None, help="work folder (default: a new temporary folder, kept)")
    args = ap.parse_args()
    work = args.dir or Path(tempfile.mkdtemp(prefix="tli-dying-"))
    work.mkdir(parents=True, exist_ok=True)
    from tl_idempotence.testing import tiny_hf_dir

    items = {}
    for i in range(3):
        ck = work / f"ckpt{i}"
        if not (ck / "config.json").exists():
            tiny_hf_dir(ck, seed=i)
        items[f"good{i}"] = str(ck)
    script = work / "one_run.py"
    script.write_text(ONE_RUN)
    print(f"{args.runs} runs, {os.cpu_count()} cores, work folder {work}")
    bad = 0
    for run in range(1, args.runs + 1):
        out = work / f"out-{run}-{time.time_ns()}"
        load = os.getloadavg()[0]
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(
                [sys.executable, str(script), json.dumps(items), str(out)],
                capture_output=True,
                text=True,
                timeout=600,
            )
            wall = time.perf_counter() - t0
            got = json.loads(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 else None
        except subprocess.TimeoutExpired:
            wall, got, proc = time.perf_counter() - t0, None, None
        if got is None:
            ok = False
            what = "no result: " + ("timed out after 600 s" if proc is None else proc.stderr.strip()[-500:])
        else:
            failed = [f["label"] for f in got["failed"]]
            healthy = all(got["status"][f"good{i}"] == "computed" for i in range(3))
            ok = failed == ["dies"] and healthy and wall < LIMIT
            cause = got["failed"][0]["message"] if got["failed"] else ""
            what = (
                f"status {got['status']}, attempts {got['attempts']}, failed {failed} "
                f"({got['failed'][0]['error_type'] if got['failed'] else '-'}: {cause})"
            )
        bad += not ok
        print(
            f"run {run}: {'PASS' if ok else 'FAIL'}  {wall:6.1f} s wall  load average {load:.2f} at start, "
            f"{os.getloadavg()[0]:.2f} at end  {what}",
            flush=True,
        )
    print(f"{args.runs - bad} of {args.runs} runs passed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
