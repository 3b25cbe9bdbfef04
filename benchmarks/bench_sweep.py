"""A sweep on a LocalCluster, as job-array tasks, and the same items one after another (issues 14, 21).

Items: the two zoo models (``smollm2-135m``, ``minilm-l6``, read from their cached checkpoint
files) and the checkpoints of a small training lineage (``tli.train_lineage``, seeded; trained
once into the work folder). Measured, with the same report options for every item:

1. ``tli.compare(items)`` — every item measured in this process, one after another, with torch's
   default threads and with one thread (what each sweep worker uses: Dask starts workers with
   ``OMP_NUM_THREADS=1``);
2. ``tli.sweep(items, out, workers=N)`` — one task per item on a fresh ``distributed.LocalCluster``
   (N worker processes, one thread each), cluster start-up and shutdown included;
3. the same sweep again (every item's saved report matches: read-and-fingerprint only);
4. the job-array mode: ``tl-idempotence sweep ITEMS --out DIR --task-index I`` as one process per item,
   all N started at once, then at most ``--workers`` at a time (what ``--array=0-N%W`` does), each
   with ``OMP_NUM_THREADS=1`` like a Dask worker; then ``tli.load_sweep(DIR)`` (``--collect``).

It checks whether the sweep's and the array's per-head tables equal the serial ones bit for bit
(they do against the one-thread run; multi-threaded float64 products may differ in the last bits),
and prints the comparison table. Usage::

    python benchmarks/bench_sweep.py                      # nulls=64, 2 workers, lineage of 6 checkpoints
    python benchmarks/bench_sweep.py --nulls 16 --workers 2 --dir /tmp/bench_sweep
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import torch

import tl_idempotence as tli

COLUMNS = [
    "model",
    "n_params",
    "n_attention_layers",
    "n_heads_per_layer",
    "n_kv_heads",
    "n_closed",
    "pct_closed",
    "median_P",
    "median_P_scrambled",
    "pct_beats_scramble",
    "pct_layers_trained_wins",
    "n_mismatch_closed",
    "mismatch_P_max",
    "identical_weights",
]


def run_array(items: dict[str, str], out: Path, nulls: int, at_once: int) -> tuple[float, float]:
    """Every item as its own ``--task-index`` process, at most ``at_once`` running; returns (wall of the
    tasks, wall of load_sweep)."""
    shutil.rmtree(out, ignore_errors=True)
    base = [sys.executable, "-m", "tl_idempotence.cli", "sweep", *(f"{k}={v}" for k, v in items.items())]
    base += ["--out", str(out), "--nulls", str(nulls), "--seed", "0", "--quiet"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    todo = list(range(len(items)))
    running: list[subprocess.Popen] = []
    t0 = time.perf_counter()
    while todo or running:
        while todo and len(running) < at_once:
            i = todo.pop(0)
            running.append(
                subprocess.Popen(
                    [*base, "--task-index", str(i)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
                )
            )
        for p in list(running):
            if p.poll() is not None:
                running.remove(p)
                if p.returncode != 0:
                    raise RuntimeError(f"array task failed: {p.args[-1]}: {p.stderr.read().decode()[-500:]}")
        time.sleep(0.05)
    t_tasks = time.perf_counter() - t0
    t0 = time.perf_counter()
    tli.load_sweep(out)
    return t_tasks, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nulls", type=int, default=64)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--dir", type=Path, default=None, help="work folder (default: a temp folder, deleted)")
    args = ap.parse_args()
    work = args.dir or Path(tempfile.mkdtemp(prefix="tli-bench-sweep-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        t0 = time.perf_counter()
        lin = tli.train_lineage(work / "lineage", steps=200, save_every=40)
        print(f"lineage: {len(lin.checkpoints)} checkpoints, trained/reused in {time.perf_counter() - t0:.1f} s")
        items = {"smollm2-135m": "smollm2-135m", "minilm-l6": "minilm-l6"}
        items.update({f"lineage-{label}": path for label, path in lin.checkpoints})
        for name in ("smollm2-135m", "minilm-l6"):
            tli.models.checkpoint_dir(name, progress=False)  # the zoo cache, outside the timings
        opts = {"nulls": args.nulls, "seed": 0}
        print(
            f"{len(items)} items, options {opts}, machine: {os.cpu_count()} cores, "
            f"load average {os.getloadavg()[0]:.1f} at start"
        )

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # identical-weights notes are in the table
            threads = torch.get_num_threads()
            serial = {}
            t_serial = {}
            for n in sorted({threads, 1}, reverse=True):
                torch.set_num_threads(n)
                t0 = time.perf_counter()
                serial[n] = tli.compare(items, **opts, progress=False)
                t_serial[n] = time.perf_counter() - t0
            torch.set_num_threads(threads)

            out = work / "sweep_out"
            shutil.rmtree(out, ignore_errors=True)
            t0 = time.perf_counter()
            res = tli.sweep(items, out, workers=args.workers, **opts, progress=False)
            t_sweep = time.perf_counter() - t0

            t0 = time.perf_counter()
            again = tli.sweep(items, out, workers=args.workers, **opts, progress=False)
            t_again = time.perf_counter() - t0

            arrays = {}
            for at_once in (len(items), args.workers):
                arrays[at_once] = run_array(items, work / f"array_out_{at_once}", args.nulls, at_once)
            array_res = tli.load_sweep(work / f"array_out_{args.workers}")

        for n, t in t_serial.items():
            print(f"one after another (tli.compare, this process, {n} torch thread(s)): {t:7.1f} s")
        print(
            f"sweep, LocalCluster {args.workers} workers x 1 thread (incl. start/stop): {t_sweep:7.1f} s   "
            f"tasks: {res.tasks['status'].value_counts().to_dict()}, failed: {len(res.failed)}"
        )
        print(
            f"sweep rerun, same out (all saved reports match):             {t_again:7.1f} s   "
            f"tasks: {again.tasks['status'].value_counts().to_dict()}"
        )
        for at_once, (t_tasks, t_collect) in arrays.items():
            print(
                f"job array, {len(items)} processes, at most {at_once} at once (incl. each process's start): "
                f"{t_tasks:7.1f} s   load_sweep: {t_collect:.2f} s"
            )
        print(
            "per-task seconds on the workers: "
            + ", ".join(f"{r.label} {r.seconds:.1f}" for r in res.tasks.itertuples())
        )
        for n, cmp in serial.items():
            same = all(res.reports[k].heads.equals(cmp.reports[k].heads) for k in items)
            diff = max(
                float(np.nanmax(np.abs(res.reports[k].heads[c].to_numpy() - cmp.reports[k].heads[c].to_numpy())))
                for k in items
                for c in cmp.reports[k].heads.columns
                if cmp.reports[k].heads[c].dtype.kind == "f"
            )
            print(
                f"sweep per-head tables vs serial with {n} thread(s): bit for bit {same}, max |difference| {diff:.3g}"
            )
            same = all(array_res.reports[k].heads.equals(cmp.reports[k].heads) for k in items)
            print(f"job-array per-head tables vs serial with {n} thread(s): bit for bit {same}")
        print(f"load average at end {os.getloadavg()[0]:.1f}\n")
        with pd.option_context(
            "display.width", 250, "display.max_columns", 30, "display.float_format", "{:.4g}".format
        ):
            print(res.table[COLUMNS].to_string(index=False))
    finally:
        if args.dir is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
