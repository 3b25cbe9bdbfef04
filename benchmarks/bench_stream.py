"""Streaming a Qwen3-235B-shaped attention checkpoint from safetensors shards (issue 6, SPEC section 9).

Writes a synthetic checkpoint with Qwen3-235B-A22B's attention shapes (94 layers,
64 query / 4 kv heads, d_model 4096, d_head 128, bf16, q/k/v/o projections, ~13 GB in
several shards) to a temp dir, then measures, each in a fresh subprocess (wall time
and peak RSS = ``ru_maxrss`` of that process):

* floor "read": reading every layer's O and V with ``safetensors`` (page cache warm,
  and cold: the shards' pages are evicted with ``posix_fadvise(DONTNEED)`` — no root
  needed; ``/proc/sys/vm/drop_caches`` is used instead when writable);
* floor "products": ``VᵀO`` and ``OᵀO`` for every head (and ``VᵀV`` per kv head) with
  plain ``torch.matmul`` at the compute dtype, on in-memory tensors of the same shapes;
* the closure report (float64, and with ``compute_dtype=torch.float32``);
* the report with 64 scramble draws (``nulls=64``; skipped with ``--skip-nulls``).

The checkpoint is deleted afterwards (``--keep`` keeps it). Usage::

    python benchmarks/bench_stream.py                 # full 94 layers (~13 GB on disk)
    python benchmarks/bench_stream.py --layers 4      # quick run
    python benchmarks/bench_stream.py --dir /big/tmp --skip-nulls
    python benchmarks/bench_stream.py --dir /big/tmp --keep ...   # then: --checkpoint /big/tmp/bench_stream_XXXX
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from _harness import status_kb

N_HEADS, N_KV, D_MODEL, D_HEAD = 64, 4, 4096, 128


def write_checkpoint(d: Path, n_layers: int, layers_per_shard: int) -> int:
    from safetensors.torch import save_file

    d.mkdir(parents=True, exist_ok=True)
    cfg = {
        "model_type": "qwen3_moe",
        "architectures": ["Qwen3MoeForCausalLM"],
        "hidden_size": D_MODEL,
        "num_attention_heads": N_HEADS,
        "num_key_value_heads": N_KV,
        "head_dim": D_HEAD,
        "num_hidden_layers": n_layers,
        "torch_dtype": "bfloat16",
        "_name_or_path": "synthetic-qwen3-235b-attention",
    }
    (d / "config.json").write_text(json.dumps(cfg))
    g = torch.Generator().manual_seed(0)
    qk = {  # q/k are never read: one random block, written once per layer
        "q": (torch.randn(N_HEADS * D_HEAD, D_MODEL, generator=g) * 0.02).to(torch.bfloat16),
        "k": (torch.randn(N_KV * D_HEAD, D_MODEL, generator=g) * 0.02).to(torch.bfloat16),
    }
    n_shards = -(-n_layers // layers_per_shard)
    weight_map, total = {}, 0
    for s in range(n_shards):
        part = {}
        for l in range(s * layers_per_shard, min(n_layers, (s + 1) * layers_per_shard)):
            p = f"model.layers.{l}.self_attn."
            part[p + "q_proj.weight"] = qk["q"]
            part[p + "k_proj.weight"] = qk["k"]
            part[p + "v_proj.weight"] = (torch.randn(N_KV * D_HEAD, D_MODEL, generator=g) * 0.02).to(torch.bfloat16)
            part[p + "o_proj.weight"] = (torch.randn(D_MODEL, N_HEADS * D_HEAD, generator=g) * 0.02).to(torch.bfloat16)
        fname = f"model-{s + 1:05d}-of-{n_shards:05d}.safetensors"
        save_file(
            {k: v.clone() if v is qk["q"] or v is qk["k"] else v for k, v in part.items()},
            str(d / fname),
            metadata={"format": "pt"},
        )
        weight_map.update({k: fname for k in part})
        total += (d / fname).stat().st_size
        print(f"  wrote {fname} ({(d / fname).stat().st_size / 1e9:.2f} GB)", file=sys.stderr, flush=True)
    (d / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map})
    )
    return total


def evict(d: Path) -> str:
    """Evict the shards from the page cache: posix_fadvise(DONTNEED) per file (no root), plus drop_caches if allowed."""
    subprocess.run(["sync"], check=False)
    how = ["posix_fadvise(DONTNEED)"]
    for f in d.glob("*.safetensors"):
        fd = os.open(f, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        how.append("drop_caches")
    except OSError:
        pass
    return " + ".join(how)


# --------------------------------------------------------------------------- phases (run in a child)


def phase_read(d: Path) -> dict:
    from tl_idempotence.sources.checkpoint import from_path

    src = from_path(d, check_finite=False)
    t = time.perf_counter()
    nbytes = 0
    for l in src.layers():
        v, o = src.names(l)
        with src.store.reader() as r:  # the slices are memory-mapped: clone() makes the bytes actually come in
            nbytes += r.read(v).clone().numel() * 2 + r.read(o).clone().numel() * 2
    return {"seconds": time.perf_counter() - t, "GB_read": nbytes / 1e9}


def phase_products(n_layers: int, dtype: torch.dtype) -> dict:
    g = torch.Generator().manual_seed(1)
    O = torch.randn(N_HEADS, D_MODEL, D_HEAD, generator=g).to(dtype)
    V = torch.randn(N_KV, D_MODEL, D_HEAD, generator=g).to(dtype)
    Ot, Vt = O.transpose(-1, -2), V.transpose(-1, -2)
    grp = N_HEADS // N_KV
    t = time.perf_counter()
    for _ in range(n_layers):
        torch.matmul(Ot, O)  # O^T O per head
        torch.matmul(Vt, V)  # V^T V per kv head
        for k in range(N_KV):
            torch.matmul(Vt[k], O[k * grp : (k + 1) * grp])  # V^T O per head
    return {"seconds": time.perf_counter() - t}


def phase_report(d: Path, dtype: torch.dtype, nulls: int, only: int = 0) -> dict:
    import tl_idempotence as tli

    t = time.perf_counter()
    rep = tli.idempotence_report(
        str(d), nulls=nulls, compute_dtype=dtype, progress=False, layers=list(range(only)) if only else None
    )
    out = {"seconds": time.perf_counter() - t, "n_heads": len(rep.heads), "median_P": rep.summary["median_P"]}
    if nulls:
        out["frac_beats_scramble"] = float(rep.heads["beats_scramble"].mean())
    return out


def vm_hwm_bytes() -> int:
    """Peak resident set size of this process (``VmHWM`` in /proc/self/status; ``ru_maxrss`` elsewhere), bytes."""
    hwm = status_kb("VmHWM")
    return (hwm if hwm is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def child(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads) if args.threads else None
    d = Path(args.dir)
    dtype = getattr(torch, args.dtype)
    if args.phase == "read":
        out = phase_read(d)
    elif args.phase == "products":
        out = phase_products(args.layers, dtype)
    else:
        out = phase_report(d, dtype, args.nulls, args.only)
    # VmHWM: this process's own peak resident set. (ru_maxrss of a child started by fork+exec starts at the
    # parent's RSS at fork time on Linux, so it over-reports after the parent wrote the checkpoint.)
    out["peak_rss_GB"] = vm_hwm_bytes() / 1e9
    out["ru_maxrss_GB"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9
    print(json.dumps(out))


def run_child(args: argparse.Namespace, phase: str, **kw) -> dict:
    cmd = [
        sys.executable,
        __file__,
        "--child",
        "--phase",
        phase,
        "--dir",
        str(args.dir),
        "--layers",
        str(args.layers),
        "--threads",
        str(args.threads),
    ]
    for k, v in kw.items():
        cmd += [f"--{k}", str(v)]
    p = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    if p.returncode:
        raise RuntimeError(f"{phase} failed:\n{p.stderr[-3000:]}")
    out = json.loads(p.stdout.strip().splitlines()[-1])
    print(f"  {phase} {kw}: {json.dumps(out)}", file=sys.stderr, flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=94, help="number of layers (94 = Qwen3-235B)")
    ap.add_argument("--layers-per-shard", type=int, default=12)
    ap.add_argument("--dir", default=None, help="where to write the checkpoint (default: a new temp dir)")
    ap.add_argument("--keep", action="store_true", help="keep the checkpoint afterwards")
    ap.add_argument(
        "--checkpoint",
        default=None,
        help="measure a checkpoint this script wrote before (kept with --keep) instead of writing a new one",
    )
    ap.add_argument("--skip-nulls", action="store_true")
    ap.add_argument(
        "--nulls-layers",
        type=int,
        default=0,
        help="run the nulls=64 report on only the first N layers (0 = all); time is also given per layer",
    )
    ap.add_argument("--skip-float32", action="store_true", help="skip the compute_dtype=float32 report")
    ap.add_argument("--threads", type=int, default=0, help="torch threads in the children (0 = torch default)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--phase", default="report", help=argparse.SUPPRESS)
    ap.add_argument("--dtype", default="float64", help=argparse.SUPPRESS)
    ap.add_argument("--nulls", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--only", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args)

    need = args.layers * (2 * N_HEADS + 2 * N_KV) * D_MODEL * D_HEAD * 2
    if args.checkpoint:
        d = Path(args.checkpoint)
        cfg = json.loads((d / "config.json").read_text())
        if cfg.get("_name_or_path") != "synthetic-qwen3-235b-attention" or cfg["num_hidden_layers"] != args.layers:
            sys.exit(
                f"{d} is not a {args.layers}-layer checkpoint written by this script (its config.json says otherwise)."
            )
        args.keep = True
    else:
        base = Path(args.dir) if args.dir else Path(tempfile.gettempdir())
        base.mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(base).free
        print(f"checkpoint: {args.layers} layers, {need / 1e9:.1f} GB; free at {base}: {free / 1e9:.1f} GB", flush=True)
        if free < need * 1.2 + 2e9:
            sys.exit(f"Not enough disk at {base}: need {need * 1.2 / 1e9:.1f} GB free. Use --dir or --layers N.")
        d = Path(tempfile.mkdtemp(prefix="bench_stream_", dir=base))
    args.dir = str(d)
    res: dict = {
        "layers": args.layers,
        "heads": args.layers * N_HEADS,
        "cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads() if not args.threads else args.threads,
        "load_avg_at_start": os.getloadavg(),
        "checkpoint": str(d),
    }
    try:
        if args.checkpoint:
            res["checkpoint_GB"] = sum(f.stat().st_size for f in d.glob("*.safetensors")) / 1e9
        else:
            t = time.perf_counter()
            res["checkpoint_GB"] = write_checkpoint(d, args.layers, args.layers_per_shard) / 1e9
            res["write_seconds"] = time.perf_counter() - t
        res["O_V_GB"] = args.layers * (N_HEADS + N_KV) * D_MODEL * D_HEAD * 2 / 1e9
        res["evict_method"] = evict(d)
        res["floor_read_cold"] = run_child(args, "read")
        res["floor_read_warm"] = run_child(args, "read")
        res["floor_products_float64"] = run_child(args, "products", dtype="float64")
        res["floor_products_float32"] = run_child(args, "products", dtype="float32")
        res["report_float64"] = run_child(args, "report", dtype="float64")
        if not args.skip_float32:
            res["report_float32"] = run_child(args, "report", dtype="float32")
        if not args.skip_nulls:
            n = args.nulls_layers or args.layers
            r = run_child(args, "report", dtype="float64", nulls=64, only=n)
            r["layers"] = n
            r["seconds_per_layer"] = r["seconds"] / n
            res["report_nulls64_float64"] = r
        for dt in [x for x in ("float64", "float32") if f"report_{x}" in res]:
            floor = max(res["floor_read_warm"]["seconds"], res[f"floor_products_{dt}"]["seconds"])
            res[f"report_{dt}_over_larger_floor"] = res[f"report_{dt}"]["seconds"] / floor
            # Reading the weights and the products both have to happen: their sum is the honest floor.
            both = res["floor_read_warm"]["seconds"] + res[f"floor_products_{dt}"]["seconds"]
            res[f"report_{dt}_over_read_plus_products"] = res[f"report_{dt}"]["seconds"] / both
        res["load_avg_at_end"] = os.getloadavg()
    finally:
        if not args.keep:
            shutil.rmtree(d, ignore_errors=True)
    print(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
