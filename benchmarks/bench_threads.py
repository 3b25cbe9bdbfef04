"""Where one torch thread beats torch's default for a layer's products: the calibration of
``tl_idempotence.core.threads.SMALL_LAYER_MACS``, quiet and with one busy process per core, in one run.

Usage:  python benchmarks/bench_threads.py [--repeat 3] [--layers 4] [--load]

For each layer shape (n_heads, n_kv_heads, d_model, d_head) — from MiniLM-L6 to a Qwen3-235B layer — a
seeded random float32 layer is measured by ``tli.idempotence_report`` (the closure; ``--nulls`` adds the
scramble) with ``--layers`` copies, at 1 thread and at torch's default count (``torch.set_num_threads`` is
explicit, so the library's own choice is bypassed). Median wall time per layer of ``--repeat`` runs; the
ratio > 1 means one thread was faster. ``--load`` repeats the table while one ``while True: pass`` process
per core keeps every core busy (a shared machine).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
from _harness import busy_cores, md_header, md_row

import tl_idempotence as tli
from tl_idempotence.core.threads import SMALL_LAYER_MACS, layer_macs

SHAPES = {
    "MiniLM-L6 (12/12, 384, 32)": (12, 12, 384, 32),
    "SmolLM2-135M (9/3, 576, 64)": (9, 3, 576, 64),
    "Gemma-3-270M (4/1, 640, 256)": (4, 1, 640, 256),
    "Qwen2.5-0.5B (14/2, 896, 64)": (14, 2, 896, 64),
    "Llama-3.2-1B (32/8, 2048, 64)": (32, 8, 2048, 64),
    "Llama-2-7B (32/32, 4096, 128)": (32, 32, 4096, 128),
    "Qwen3-235B (64/4, 4096, 128)": (64, 4, 4096, 128),
}


def layers_of(shape: tuple[int, int, int, int], n: int) -> list[tli.LayerHeads]:
    nq, nkv, dm, dh = shape
    g = torch.Generator().manual_seed(0)
    O = torch.randn(nq, dm, dh, generator=g) / dm**0.5
    V = torch.randn(nkv, dm, dh, generator=g) / dm**0.5
    kv = torch.arange(nq) // (nq // nkv)
    return [tli.LayerHeads(i, O, V, kv) for i in range(n)]


def per_layer(lhs: list[tli.LayerHeads], threads: int, repeat: int, nulls: int) -> float:
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        tli.idempotence_report(lhs[:1], progress=False, nulls=nulls)  # warm-up
        times = []
        for _ in range(repeat):
            t = time.perf_counter()
            tli.idempotence_report(lhs, progress=False, nulls=nulls)
            times.append((time.perf_counter() - t) / len(lhs))
        return statistics.median(times)
    finally:
        torch.set_num_threads(before)


def table(label: str, args: argparse.Namespace, default: int) -> None:
    print(f"\n### {label} (load average {os.getloadavg()[0]:.2f} at the start)\n")
    print(md_header("layer shape", "multiply-adds", "1 thread", f"{default} threads", f"{default} threads / 1 thread"))
    for name, shape in SHAPES.items():
        n = args.layers if shape[2] * shape[0] * shape[3] < 50_000_000 else 2
        lhs = layers_of(shape, n)
        one = per_layer(lhs, 1, args.repeat, args.nulls)
        many = per_layer(lhs, default, args.repeat, args.nulls)
        macs = layer_macs(*shape)
        mark = " (one thread chosen)" if macs < SMALL_LAYER_MACS else ""
        print(md_row(name, f"{macs:.2e}{mark}", f"{one * 1e3:.1f} ms", f"{many * 1e3:.1f} ms", f"{many / one:.2f}"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--layers", type=int, default=4, help="layers per report for the small shapes")
    ap.add_argument("--nulls", type=int, default=0, help="scramble draws per head (0: the closure alone)")
    ap.add_argument("--load", action="store_true", help="also with one busy process per core")
    args = ap.parse_args()
    default = torch.get_num_threads()
    print(
        f"torch {torch.__version__}, {os.cpu_count()} CPUs, default threads {default}, nulls {args.nulls}; "
        f"SMALL_LAYER_MACS = {SMALL_LAYER_MACS:.1e}"
    )
    table("quiet machine", args, default)
    if args.load:
        with busy_cores(os.cpu_count() or 1):
            table(f"one busy process per core ({os.cpu_count()})", args, default)


if __name__ == "__main__":
    main()
