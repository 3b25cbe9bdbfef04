"""Benchmark: the paper's controls (orientation scramble, O/V mismatch, constructive search).

Usage:  python benchmarks/bench_nulls.py [--threads N] [--draws 64] [--skip-throughput] [--skip-smollm2]
                                         [--skip-projection] [--projection-layers 2] [--search]
                                         [--compute-dtype float64|float32]

Prints
1. scramble throughput (heads x draws per second) at d_head 64 and 128, on the factors
   of a random layer already in memory (Haar pools + one r x r product per draw);
2. the whole SmolLM2-135M report with ``nulls=64`` (weights already in memory; zoo model,
   loaded first and not timed); with ``--search`` also ``search=True``;
3. a projection for a 6,016-head model at d_head 128 (Qwen3-235B's attention shape:
   94 layers x 64 query / 4 kv heads, d_model 4096): per-layer time of the core closure,
   the scramble and the mismatch, measured on ``--projection-layers`` random layers and
   multiplied by 94.

All numbers depend on the machine and on what else runs on it: the load average is
printed next to them. On a CPU shared with other jobs, ``--threads 1`` is usually faster
than oversubscribing the cores.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
from _harness import loadavg

from tl_idempotence.analyses.base import LayerContext
from tl_idempotence.analyses.mismatch import MismatchAnalysis
from tl_idempotence.analyses.orientation import factors_of_closure
from tl_idempotence.analyses.report_options import ReportOptions
from tl_idempotence.analyses.scramble import ScrambleAnalysis, scramble_draws
from tl_idempotence.core.heads import LayerHeads, kv_layout
from tl_idempotence.maths.closure import closure_from_grams, layer_grams


def load() -> str:
    return f"load average {loadavg()}"


def random_layer(layer: int, n_heads: int, n_kv: int, d_model: int, d_head: int, dtype=torch.float32) -> LayerHeads:
    g = torch.Generator().manual_seed(layer)
    O = torch.randn(n_heads, d_model, d_head, generator=g, dtype=dtype)
    V = torch.randn(n_kv, d_model, d_head, generator=g, dtype=dtype)
    return LayerHeads(layer, O, V, kv_layout(n_heads, n_kv))


def bench_throughput(draws: int) -> None:
    print(f"\n== scramble throughput ({draws} draws per head; {load()}, torch threads {torch.get_num_threads()})")
    for r, n_heads in ((64, 64), (128, 64)):
        lh = random_layer(0, n_heads, n_heads, 4 * r, r, dtype=torch.float64)
        c = closure_from_grams(layer_grams(lh.O, lh.V, lh.kv_head_of), factors=True)
        f = factors_of_closure(c)
        scramble_draws(f, 4, 0, 0, return_K=False)  # warm-up
        t = time.perf_counter()
        scramble_draws(f, draws, 0, 1, return_K=False)
        dt = time.perf_counter() - t
        print(
            f"d_head {r:4d}: {n_heads} heads x {draws} draws in {dt:6.2f} s -> {n_heads * draws / dt:9.0f} heads x draws / s"
        )


def bench_smollm2(draws: int, search: bool) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from tl_idempotence.sources import zoo

    model = zoo.load("smollm2-135m")
    model.idempotence_report(layers=[0], nulls=2, progress=False)  # warm-up
    t = time.perf_counter()
    rep = model.idempotence_report(nulls=draws, progress=False)
    dt = time.perf_counter() - t
    s = rep.summary
    print(f"\n== SmolLM2-135M report, nulls={draws} ({load()}, torch threads {torch.get_num_threads()})")
    print(f"{s['n_heads']} heads in {dt:.1f} s (weights in memory; target < 30 s)")
    print(rep.paper_table().to_string(index=False))
    if search:
        t = time.perf_counter()
        rep = model.idempotence_report(nulls=draws, search=True, progress=False)
        dt = time.perf_counter() - t
        print(f"with search=True: {dt:.1f} s ({dt / len(rep.layers):.1f} s per layer of 9 heads; {load()})")
        print(rep.paper_table().to_string(index=False))


def bench_projection(draws: int, n_layers_measured: int, compute_dtype: torch.dtype = torch.float64) -> None:
    L, n_heads, n_kv, d_model, r = 94, 64, 4, 4096, 128
    print(
        f"\n== projection: {L} layers x {n_heads}/{n_kv} heads, d_model {d_model}, d_head {r} "
        f"({L * n_heads} heads), nulls={draws}, compute_dtype={compute_dtype}; measured on {n_layers_measured} layers"
    )
    tot = {"core closure": 0.0, "scramble": 0.0, "mismatch": 0.0}
    for layer in range(n_layers_measured):
        lh = random_layer(layer, n_heads, n_kv, d_model, r)  # fp32 weights, like a bf16/fp32 checkpoint
        t = time.perf_counter()
        ctx = LayerContext.build(lh, ReportOptions(nulls=draws, compute_dtype=compute_dtype))
        tot["core closure"] += time.perf_counter() - t
        t = time.perf_counter()
        ScrambleAnalysis().run(ctx)
        tot["scramble"] += time.perf_counter() - t
        t = time.perf_counter()
        MismatchAnalysis().run(ctx)
        tot["mismatch"] += time.perf_counter() - t
    per = {k: v / n_layers_measured for k, v in tot.items()}
    for k, v in per.items():
        print(f"{k:13s}: {v:6.2f} s per layer -> {v * L / 60:6.2f} min for {L} layers")
    total = sum(per.values()) * L
    print(
        f"projected total: {total / 60:.1f} min for {L * n_heads} heads (target < 10 min; {load()}, "
        f"torch threads {torch.get_num_threads()})"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's choice)")
    ap.add_argument("--draws", type=int, default=64)
    ap.add_argument("--skip-smollm2", action="store_true")
    ap.add_argument("--skip-projection", action="store_true")
    ap.add_argument("--projection-layers", type=int, default=2)
    ap.add_argument("--search", action="store_true", help="also time the SmolLM2 report with search=True")
    ap.add_argument(
        "--compute-dtype",
        choices=["float64", "float32"],
        default="float64",
        help="dtype of the d_model-long products in the projection (the report's compute_dtype)",
    )
    ap.add_argument("--skip-throughput", action="store_true")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    if not a.skip_throughput:
        bench_throughput(a.draws)
    if not a.skip_smollm2:
        bench_smollm2(a.draws, a.search)
    if not a.skip_projection:
        bench_projection(a.draws, a.projection_layers, getattr(torch, a.compute_dtype))


if __name__ == "__main__":
    main()
