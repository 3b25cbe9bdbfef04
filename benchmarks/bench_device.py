"""Benchmark: the closure (Gram products) and a 64-draw orientation scramble of the Qwen3-235B
attention-layer shape on the CPU and, when CUDA is present, on the GPU (issue 12, "a device path").

Usage:  python benchmarks/bench_device.py [--layers 2] [--nulls 64] [--threads N] [--devices cpu,cuda]

Shape: d_model 4096, 64 query heads on 4 kv heads, d_head 128, bf16 weights (random, seeded; the
real checkpoint has 94 such layers). Per device and layer it times, with the weights in CPU memory
as a streaming checkpoint source leaves them:

* ``closure``: ``LayerContext.build`` — the Gram products ``OᵀO``, ``VᵀV``, ``VᵀO`` in float64 on
  the device (the layer is copied there first), then α, P and the ranks (``d_head``-sized, CPU);
* ``products only`` (GPU): the same products with the layer already on the device (a model that
  lives on the GPU is read layer by layer without a copy);
* ``scramble``: the report's scramble analysis with ``nulls`` draws per head — principal factors,
  Haar pools (drawn on the CPU generator, so identical on every device) and the batched
  ``[heads, draws, r, r]`` products on the device.

It prints per-layer seconds (median over the layers), the projection to 94 layers, the GPU/CPU
speed ratio, and the largest difference between the devices of every head's P and of every
scrambled draw's P (float64 rounding expected: ~1e-12). GPU timings are bracketed by
``torch.cuda.synchronize()``; every device first runs one untimed warm-up layer (CUDA context,
cuBLAS handles; CPU thread pools).
Numbers depend on the machine and on what else runs on it; print ``os.getloadavg()`` alongside.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from tl_idempotence.analyses.base import LayerContext
from tl_idempotence.analyses.report_options import ReportOptions
from tl_idempotence.analyses.scramble import ScrambleAnalysis
from tl_idempotence.core.heads import LayerHeads, kv_layout
from tl_idempotence.maths.closure import layer_grams

D_MODEL, N_HEADS, N_KV, D_HEAD, N_LAYERS_REAL = 4096, 64, 4, 128, 94


def make_layer(layer: int) -> LayerHeads:
    """A random bf16 layer of the Qwen3-235B attention shape (column form), seeded by its index."""
    g = torch.Generator().manual_seed(1000 + layer)
    O = (torch.randn(N_HEADS, D_MODEL, D_HEAD, generator=g) / D_MODEL**0.5).to(torch.bfloat16)
    V = (torch.randn(N_KV, D_MODEL, D_HEAD, generator=g) / D_MODEL**0.5).to(torch.bfloat16)
    return LayerHeads(layer, O, V, kv_layout(N_HEADS, N_KV))


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def timed(fn, dev: torch.device):
    sync(dev)
    t = time.perf_counter()
    out = fn()
    sync(dev)
    return out, time.perf_counter() - t


def run_device(dev: torch.device, layers: list[LayerHeads], nulls: int) -> dict:
    opts = ReportOptions(nulls=nulls, device=dev)
    scr = ScrambleAnalysis()
    res: dict = {"closure": [], "products": [], "scramble": [], "P": [], "draws": []}
    # Untimed warm-up on every device: CUDA context and cuBLAS handles; CPU thread pools, first allocations.
    scr.run(LayerContext.build(layers[0], ReportOptions(nulls=2, device=dev)))
    for lh in layers:
        ctx, t_c = timed(lambda lh=lh: LayerContext.build(lh, opts), dev)
        res["closure"].append(t_c)
        if dev.type == "cuda":
            O, V, kv = lh.O.to(dev), lh.V.to(dev), lh.kv_head_of
            _, t_p = timed(lambda O=O, V=V, kv=kv: layer_grams(O, V, kv, device=dev), dev)
            res["products"].append(t_p)
            del O, V
        r, t_s = timed(lambda ctx=ctx: scr.run(ctx), dev)
        res["scramble"].append(t_s)
        res["P"].append(ctx.closure.P.clone())
        res["draws"].append(torch.tensor(r.tables["scramble_draws"]["P"].to_numpy(copy=True)))
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=2, help="layers measured per device (default 2)")
    ap.add_argument("--nulls", type=int, default=64, help="scramble draws per head (default 64)")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    ap.add_argument("--devices", default=None, help="comma-separated, default: cpu and cuda when present")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    devices = (
        [torch.device(d) for d in args.devices.split(",")]
        if args.devices
        else [torch.device("cpu")] + ([torch.device("cuda")] if torch.cuda.is_available() else [])
    )
    print(
        f"torch {torch.__version__}, CPU threads {torch.get_num_threads()}, load average "
        f"{', '.join(f'{x:.1f}' for x in os.getloadavg())}"
    )
    if torch.cuda.is_available():
        print(f"CUDA: {torch.cuda.get_device_name(0)}, torch.version.cuda {torch.version.cuda}")
    else:
        print("CUDA: not available (CPU figures only)")
    print(
        f"shape: d_model {D_MODEL}, {N_HEADS} query heads / {N_KV} kv heads, d_head {D_HEAD}, bf16; "
        f"{args.layers} layer(s) measured, projected to {N_LAYERS_REAL}; scramble {args.nulls} draws per head"
    )
    layers = [make_layer(i) for i in range(args.layers)]
    results = {}
    for dev in devices:
        results[dev.type] = r = run_device(dev, layers, args.nulls)
        med = {k: statistics.median(v) for k, v in r.items() if k in ("closure", "products", "scramble") and v}
        for k, v in med.items():
            per = ", ".join(f"{x:.3f}" for x in r[k])
            print(
                f"[{dev.type:4s}] {k:9s} per layer {v:8.3f} s (layers: {per}) -> {N_LAYERS_REAL} layers "
                f"{v * N_LAYERS_REAL:8.1f} s ({v * N_LAYERS_REAL / 60:.2f} min)"
            )
    if "cpu" in results and "cuda" in results:
        c, g = results["cpu"], results["cuda"]
        for k in ("closure", "scramble"):
            print(
                f"GPU/CPU speed ratio, {k}: {statistics.median(c[k]) / statistics.median(g[k]):.1f}x faster on the GPU"
            )
        dP = max(float((a - b).abs().max()) for a, b in zip(c["P"], g["P"]))
        dD = max(float((a - b).abs().nan_to_num(0.0).max()) for a, b in zip(c["draws"], g["draws"]))
        nan_same = all(bool((a.isnan() == b.isnan()).all()) for a, b in zip(c["draws"], g["draws"]))
        print(f"max |ΔP| CPU vs GPU: closure {dP:.2e}, scramble draws {dD:.2e} (NaN in the same places: {nan_same})")


if __name__ == "__main__":
    main()
