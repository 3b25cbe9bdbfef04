"""Benchmark: the causal test of closure on SmolLM2-135M's closed heads and their matched controls (issue 47).

Usage:  python benchmarks/bench_causal.py [--threads N] [--max-tokens N] [--unbatched]

In one process: load the zoo's SmolLM2-135M TransformerBridge and make its report (both timed, not part of the
test), then time

* ``rep.causal(model=m)`` with every default (the 13 closed heads and one matched control each, same layer, nearest
  |α|; the four variants closure_free, closure_only, zero and mean at hook_z; the default corpus cut at 512 counted
  tokens, in whole windows of 128): wall and CPU seconds of the process (all threads), how the edits were batched,
  the thread count the passes chose, the headline and the comparison table;
* ``--max-tokens N``: the same with ``max_tokens=N`` (2048: the probe's own default, about 4x the cost);
* ``--unbatched``: the same heads through ``tli.causal_closure(..., edits_per_pass=1)`` (one forward pass per edit
  and window, no shared prefix): what batching saves at equal settings. The two runs' per-position changes must
  agree to float rounding; the largest difference is printed.

``--threads 0`` (the default) leaves torch's own thread count (the probe then times its first chunks on that count
and on one thread and keeps the faster); ``--threads 1`` fixes one thread (what a run costs on one core). The output
is a markdown table with the date, the load average before and after and the command line (``RESULTS.md``).
"""

from __future__ import annotations

import sys

from _harness import bench_parser, loadavg, md_header, md_row, setting, smollm2_and_report, timed, use_threads


def main(argv: list[str] | None = None) -> None:
    ap = bench_parser(__doc__)
    ap.add_argument("--max-tokens", type=int, default=512, help="the text's token budget (default 512)")
    ap.add_argument("--unbatched", action="store_true", help="also time edits_per_pass=1 (one pass per edit)")
    args = ap.parse_args(argv)

    import numpy as np

    import tl_idempotence as tli

    use_threads(args.threads)
    load_before = loadavg()
    model, rep, wall_load, wall_rep = smollm2_and_report()

    wall, cpu, ct = timed(lambda: rep.causal(model=model, max_tokens=args.max_tokens, progress=False))
    print(f"rep.causal: wall {wall:.1f} s, CPU {cpu:.1f} s (load {loadavg()})", file=sys.stderr)
    runs = [("batched (defaults)", f"rep.causal(model=m, max_tokens={args.max_tokens})", wall, cpu, ct.probe)]
    if args.unbatched:
        heads = list(ct.table.index)
        call = lambda: tli.causal_closure(  # noqa: E731
            model, heads, max_tokens=args.max_tokens, edits_per_pass=1, progress=False
        )
        wall1, cpu1, p1 = timed(call)
        runs.append(("one pass per edit", "tli.causal_closure(m, heads, edits_per_pass=1)", wall1, cpu1, p1))
        a, b = ct.probe.positions, p1.positions
        diff = max(
            float(np.nanmax(np.abs(a[c].to_numpy(dtype=float) - b[c].to_numpy(dtype=float)), initial=0.0))
            for c in ("total", "direct", "loss", "total_std")
        )
        print(f"unbatched: wall {wall1:.1f} s, CPU {cpu1:.1f} s; largest difference {diff:.3g}", file=sys.stderr)

    cmd = " ".join(["python benchmarks/bench_causal.py", *(argv if argv is not None else sys.argv[1:])])
    s = ct.summary
    print(
        f"\nSmolLM2-135M (TransformerBridge, raw weights), {s['n_closed']} closed heads and {s['n_control_heads']} "
        f"matched controls, {setting(load_before)}.\nCommand: `{cmd}`. Loading the model: {wall_load:.1f} s; the "
        f"report: {wall_rep:.1f} s (not included).\n"
    )
    print(md_header("run", "call", "wall time", "CPU time", "tokens", "heads x variants", "batching", "threads"))
    for label, call, w, c, p in runs:
        ps = p.summary
        print(
            md_row(
                label,
                f"`{call}`",
                f"{w:.1f} s",
                f"{c:.1f} s",
                f"{ps['n_positions']} in {ps['n_windows']} windows",
                f"{ps['n_heads']} x {len(ps['variants'])}",
                f"{ps['batching']}, {ps['edits_per_pass']} edits a pass",
                ps["threads"],
            )
        )
    print(f"\n{ct.headline}\n")
    comp = ct.comparison
    cols = ["variant", "quantity", "closed", "controls", "difference", "p_value", "q_value", "p_floor", "method"]
    print(md_header(*cols, "heads"))
    for _, r in comp.iterrows():
        cells = [r[c] if isinstance(r[c], str) else f"{float(r[c]):.4g}" for c in cols]
        print(md_row(*cells, f"{r['n_closed']} vs {r['n_controls']}"))


if __name__ == "__main__":
    main()
