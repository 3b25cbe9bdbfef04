"""Benchmark: the OV circuit read in tokens on SmolLM2-135M (issue 39): ``tli.head_tokens`` on all 270 heads.

Usage:  python benchmarks/bench_head_tokens.py [--threads N] [--n-tokens 512]

In one process: load the zoo's SmolLM2-135M TransformerBridge (raw weights; timed, not part of the target), then
time ``tli.head_tokens(model, n_tokens=512)`` (every head, 512 seeded source tokens, k = 20; target < 30 s on a
quiet 2-core machine) with its peak memory: the process's peak resident set (Linux ``VmHWM``, reset through
``/proc/self/clear_refs`` before the call) above its resident set before the call, against the
``d_vocab x d_vocab`` float64 matrix the computation never forms (49,152² x 8 B = 18.0 GiB). Prints the headline,
a markdown row with the date, wall and CPU time (``time.process_time``: the steadier figure on a shared machine),
load average before and after, torch's thread count and the command line (``benchmarks/RESULTS.md``).
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import sys

from _harness import bench_parser, loadavg, md_header, md_row, peak_above_start, use_threads


def main(argv: list[str] | None = None) -> None:
    ap = bench_parser(__doc__)
    ap.add_argument("--n-tokens", type=int, default=512, help="source tokens per head (default 512)")
    args = ap.parse_args(argv)

    import torch

    import tl_idempotence as tli

    use_threads(args.threads)
    load_before = loadavg()
    wall_load, _, _, model = peak_above_start(lambda: tli.models.load("smollm2-135m", progress=False))
    wall, cpu, peak, r = peak_above_start(lambda: tli.head_tokens(model, n_tokens=args.n_tokens))
    load_after = loadavg()
    d_vocab = int(r.summary["d_vocab"])
    dense_gb = d_vocab**2 * 8 / 1024**3
    print(r.headline)
    print(r.to_text(5))
    peak_s = f"{peak:.2f} GB" if peak is not None else "n/a"
    print()
    print(md_header("date", "what", "wall s", "CPU s", "peak RSS above start", "d_vocab² float64", "threads",
                    "load before/after"))  # fmt: skip
    what = f"head_tokens, {r.summary['n_heads']} heads x {r.summary['n_tokens']} tokens (load {wall_load:.1f} s)"
    print(md_row(dt.date.today(), what, f"{wall:.1f}", f"{cpu:.1f}", peak_s, f"{dense_gb:.1f} GB",
                 torch.get_num_threads(), f"{load_before} / {load_after}"))  # fmt: skip
    print(f"\n{platform.platform()}, Python {platform.python_version()}, torch {torch.__version__}; "
          f"command: {' '.join([os.path.basename(sys.executable), *sys.argv])}")  # fmt: skip


if __name__ == "__main__":
    main()
