"""Benchmark: batched factored closure of one layer vs the dense float64 reference.

Usage:  python benchmarks/bench_closure.py [--dense-heads 2] [--repeats 3]

Prints heads/second of the factored path (``layer_grams`` + ``closure_from_grams``,
float64) at three layer shapes, the dense reference (materialize T = O Vᵀ and T²,
d_model x d_model, float64) on a few heads only, and their ratio. Finally times the
closure of a whole SmolLM2-135M-shaped model (30 layers x 9/3 heads) on random weights
already in memory. Numbers depend on the machine and on what else runs on it.
"""

from __future__ import annotations

import argparse
import time

import torch

from tl_idempotence.maths.closure import closure_from_grams, layer_grams

SHAPES = [  # (label, d_model, n_heads, n_kv_heads, d_head)
    ("SmolLM2-135M layer", 576, 9, 3, 64),
    ("Llama-2-7B layer (MHA)", 4096, 32, 32, 128),
    ("Qwen3-235B layer (GQA 64/4)", 4096, 64, 4, 128),
]


def factored(O, V, kv):
    return closure_from_grams(layer_grams(O, V, kv))


def dense(O, V):
    T = O.double() @ V.double().transpose(-1, -2)
    T2 = T @ T
    inner = (T2 * T).sum((-1, -2))
    return inner**2 / ((T2 * T2).sum((-1, -2)) * (T * T).sum((-1, -2)))


def best_time(fn, repeats):
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dense-heads", type=int, default=2, help="heads timed with the dense reference (default 2)")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}")
    print(f"{'shape':32s} {'factored heads/s':>17s} {'dense heads/s':>14s} {'speed-up':>9s}")
    for label, d, h, kv, r in SHAPES:
        O = torch.randn(h, d, r) / d**0.5
        V = torch.randn(kv, d, r) / d**0.5
        kvmap = torch.arange(h) // (h // kv)
        tf = best_time(lambda: factored(O, V, kvmap), args.repeats)
        nd = min(args.dense_heads, h)
        td = best_time(lambda: dense(O[:nd], V[kvmap[:nd]]), 1)
        hf, hd = h / tf, nd / td
        print(f"{label:32s} {hf:17.1f} {hd:14.2f} {hf / hd:8.0f}x")
    # whole SmolLM2-135M-shaped model, weights in memory
    layers = [(torch.randn(9, 576, 64), torch.randn(3, 576, 64)) for _ in range(30)]
    kvmap = torch.arange(9) // 3
    t = best_time(lambda: [factored(O, V, kvmap) for O, V in layers], args.repeats)
    print(f"SmolLM2-135M shape, 30 layers x 9 heads: {t:.3f} s ({270 / t:.0f} heads/s)")


if __name__ == "__main__":
    main()
