"""Benchmark: the default ablation of SmolLM2-135M's closed heads, as a researcher runs it (issue 23).

Usage:  python benchmarks/bench_ablation.py [--threads N] [--unbatched]

In one process: load the zoo's SmolLM2-135M TransformerBridge and make its report (both timed, not part
of the ablation), then time

* ``rep.ablation(model=m)`` with every default (mean ablation at hook_z of the 13 closed heads, 39 matched
  control sets, the default corpus cut at 512 counted tokens, ``batch_size=8``): wall and CPU seconds of
  the process (all threads), and its numbers (Δ loss, control median and maximum, p-value, intervals,
  how the head sets were batched);
* with ``--unbatched``, the same call with ``batch_size=1``: one forward pass per head set and window, no
  shared prefix — what batching saves at equal settings. The two runs' losses must agree to float
  rounding; the largest difference is printed.

``--threads 0`` (the default) leaves torch's own thread count (what a researcher gets: the ablation then
times its first forward passes on that count and on one thread and keeps the faster); ``--threads 1``
fixes one thread (what a run costs on one core). The output is a markdown table with the date, the load average
before and after, torch's thread count and the command line (``benchmarks/RESULTS.md``).
"""

from __future__ import annotations

import sys
from typing import Any

from _harness import bench_parser, loadavg, md_header, md_row, setting, smollm2_and_report, timed, use_threads


def main(argv: list[str] | None = None) -> None:
    ap = bench_parser(__doc__)
    ap.add_argument("--unbatched", action="store_true", help="also time batch_size=1 (one forward per head set)")
    args = ap.parse_args(argv)

    import numpy as np

    use_threads(args.threads)
    load_before = loadavg()
    model, rep, wall_load, wall_rep = smollm2_and_report()

    runs: list[tuple[str, str, float, float, Any]] = []
    wall, cpu, ab = timed(lambda: rep.ablation(model=model))
    runs.append(("defaults", "rep.ablation(model=m)", wall, cpu, ab))
    print(f"defaults: wall {wall:.1f} s, CPU {cpu:.1f} s (load {loadavg()})", file=sys.stderr)
    if args.unbatched:
        wall1, cpu1, ab1 = timed(lambda: rep.ablation(model=model, batch_size=1))
        runs.append(("one forward pass per set", "rep.ablation(model=m, batch_size=1)", wall1, cpu1, ab1))
        print(f"unbatched: wall {wall1:.1f} s, CPU {cpu1:.1f} s (load {loadavg()})", file=sys.stderr)

    cmd = " ".join(["python benchmarks/bench_ablation.py", *(argv if argv is not None else sys.argv[1:])])
    s = ab.summary
    print(
        f"\nSmolLM2-135M (TransformerBridge, raw weights), {s['n_heads']} closed heads in layers {s['layers']}, "
        f"{setting(load_before)}.\n"
        f"Command: `{cmd}`. Loading the model: {wall_load:.1f} s; the report: {wall_rep:.1f} s (not included).\n"
    )
    print(md_header("run", "call", "wall time", "CPU time", "tokens", "head sets", "Δ loss (95 % CI)",
                    "controls: median, max", "p (floor)", "batching", "threads (s per set tried)"))  # fmt: skip
    for label, call, w, c, r in runs:
        t = r.summary
        tried = ", ".join(f"{k}: {v:.2f}" for k, v in t["threads_seconds_per_set"].items()) or "not tried"
        print(
            md_row(
                label,
                f"`{call}`",
                f"{w:.1f} s",
                f"{c:.1f} s",
                f"{t['n_tokens']} in {t['n_windows']} windows",
                f"1 + {t['n_controls']}",
                f"{t['delta_loss']:.4f} ({t['delta_loss_ci_low']:.3f} to {t['delta_loss_ci_high']:.3f})",
                f"{t['control_delta_median']:.4f}, {t['control_delta_max']:.4f}",
                f"{t['p_value']:.3f} ({t['p_value_floor']:.3f})",
                t["batching"],
                f"{t['threads']} ({tried})",
            )
        )
    print(
        f"\nExcess over the control median: {s['excess_over_controls']:.4f} nats/token (95 % CI "
        f"{s['excess_ci_low']:.4f} to {s['excess_ci_high']:.4f}); {s['n_controls_at_least']} of {s['n_controls']} "
        f"controls reach the flagged Δ; empty set vs clean pass: {s['check_max_abs_diff']:.2e} nats/token."
    )
    if args.unbatched:
        a, b = runs[0][4], runs[1][4]
        la = np.array([a.summary["loss_ablated"], *a.controls["loss_ablated"]])
        lb = np.array([b.summary["loss_ablated"], *b.controls["loss_ablated"]])
        print(
            f"Batched vs one forward pass per set: largest |loss difference| {np.abs(la - lb).max():.2e} nats/token "
            f"over {len(la)} head sets; {runs[1][2] / runs[0][2]:.2f}x the wall time, "
            f"{runs[1][3] / runs[0][3]:.2f}x the CPU time."
        )


if __name__ == "__main__":
    main()
