"""Benchmark: what each analysis costs on a zoo model (SmolLM2-135M by default) on this CPU (the README's cost table).

Usage:  python benchmarks/bench_costs.py [--model smollm2-135m] [--repeats 3] [--threads 1] [--skip search,activations]

One run measures, with the weights read from the zoo's cached files (``tli.models.checkpoint_dir``,
fetched once when missing) and nothing else of the process timed:

* ``idempotence_report(path)`` — closure of all 270 heads;
* ``idempotence_report(path, nulls=64)`` — orientation scramble (64 Haar draws per head) and the
  matched O/V mismatch;
* ``idempotence_report(path, search=True)`` — the constructive search, per layer;
* ``idempotence_report(path, algebra=True)`` — the shared-value algebra of every kv group;
* ``activation_returns(model)`` — activation-level returns on the default corpus (stdlib
  docstrings, ``max_tokens`` default 8,192, a lower bound taken in whole windows: 8,207 tokens) with its
  default scramble control, on the SmolLM2 TransformerBridge (its loading is timed separately);
* ``rep.ablation(model=model)`` — the closed heads mean-ablated against 39 matched control sets on
  the default corpus (``max_tokens`` default 512: 5 windows, 634 targets; ``benchmarks/bench_ablation.py``
  times it alone, with its numbers).

Each is timed ``--repeats`` times (median) when one run takes under 20 CPU seconds, once otherwise, as wall
seconds and as CPU seconds of the process (all threads). The result is printed as a markdown table
with the date, the machine's load average, torch's thread count and the command line. With one
torch thread (the default here) the CPU seconds are what the run costs on an idle core and barely
change when other jobs share the machine, while the wall seconds grow with the load; a laptop with
several cores and torch's default threads finishes the batched parts faster than the CPU column.
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Callable
from typing import Any

from _harness import bench_parser, loadavg, md_header, md_row, setting, use_threads
from _harness import timed as timed_once

CHEAP_S = 20.0


def timed(fn: Callable[[], Any], repeats: int) -> tuple[float, float, int, Any]:
    """(median wall seconds, median CPU seconds, runs, the last result): repeats only when one run is cheap."""
    walls, cpus = [], []
    out = None
    for i in range(repeats):
        wall, cpu, out = timed_once(fn)
        walls.append(wall)
        cpus.append(cpu)
        if i == 0 and cpus[0] >= CHEAP_S:
            break
    return statistics.median(walls), statistics.median(cpus), len(walls), out


def main(argv: list[str] | None = None) -> None:
    ap = bench_parser(__doc__, threads=1)
    ap.add_argument("--repeats", type=int, default=3, help="runs per cheap measurement (median); default 3")
    ap.add_argument("--model", default="smollm2-135m", help="a zoo model name (default smollm2-135m)")
    steps = ("report", "nulls", "search", "algebra", "load", "activations")
    ap.add_argument("--skip", default="", help=f"comma-separated steps to leave out, of {', '.join(steps)}")
    args = ap.parse_args(argv)
    skip = {x for x in args.skip.split(",") if x}
    if skip - set(steps):
        ap.error(f"--skip: unknown step(s) {sorted(skip - set(steps))}; valid: {', '.join(steps)}")

    import tl_idempotence as tli

    use_threads(args.threads)
    name = args.model
    if name not in tli.models.known_models():
        ap.error(f"--model: not a zoo model: {name!r} (known: {', '.join(tli.models.known_models())})")
    path = str(tli.models.checkpoint_dir(name, progress=False))
    rows: list[tuple[str, str, float, float, int, str]] = []

    def add(label: str, call: str, wall: float, cpu: float, n: int, unit: str) -> None:
        rows.append((label, call, wall, cpu, n, unit))
        print(f"{label}: wall {wall:.2f} s, CPU {cpu:.2f} s (median of {n})", file=sys.stderr, flush=True)

    def report(label: str, call: str, **kw: Any) -> None:
        wall, cpu, n, rep = timed(lambda: tli.idempotence_report(path, progress=False, **kw), args.repeats)
        add(label, call, wall, cpu, n, f"{cpu / len(rep.layers):.2f} s/layer (CPU)")

    load_before = loadavg()
    if "report" not in skip:
        report("report (closure)", "tli.idempotence_report(model)")
    if "nulls" not in skip:
        report("controls, 64 draws", "tli.idempotence_report(model, nulls=64)", nulls=64)
    if "search" not in skip:
        report("constructive search", "tli.idempotence_report(model, search=True)", search=True)
    if "algebra" not in skip:
        report("shared-value algebra", "tli.idempotence_report(model, algebra=True)", algebra=True)

    if not {"load", "activations"} <= skip:
        wall, cpu, model = timed_once(lambda: tli.models.load(name, progress=False))
        add("load the TransformerBridge", f'tli.models.load("{name}")', wall, cpu, 1, "")
    if "activations" not in skip:
        wall, cpu, n, ret = timed(lambda: tli.activation_returns(model, progress=False), args.repeats)
        add(
            "activation returns, default corpus",
            "tli.activation_returns(model)",
            wall,
            cpu,
            n,
            f"{int(ret.summary['n_tokens']):,} tokens, {int(ret.summary['n_heads'])} heads",
        )

    rep = model.idempotence_report(progress=False)
    wall, cpu, n, abl = timed(lambda: rep.ablation(model=model, progress=False), args.repeats)
    add(
        "ablation of the closed heads, defaults",
        "rep.ablation(model=model)",
        wall,
        cpu,
        n,
        f"{int(abl.summary['n_tokens']):,} tokens, {1 + int(abl.summary['n_controls'])} head sets",
    )

    cmd = " ".join(["python benchmarks/bench_costs.py", *(argv if argv is not None else sys.argv[1:])])
    a = tli.models.model_spec(name)["architecture"]
    print(
        f"\n{name} ({a['n_layers']} layers x {a['n_heads']} heads, {a['n_kv_heads']} kv heads, d_head {a['d_head']}; "
        f"weights from the zoo's cached files), {setting(load_before)}.\nCommand: `{cmd}`\n"
    )
    print(md_header("analysis", "call", "CPU time", "wall time", "runs", "per unit"))

    def fmt(sec: float) -> str:
        return f"{sec:.1f} s" if sec < 120 else f"{sec / 60:.1f} min"

    for label, call, wall, cpu, n, unit in rows:
        runs = f"median of {n}" if n > 1 else "1"
        print(md_row(label, f"`{call}`", fmt(cpu), fmt(wall), runs, unit))


if __name__ == "__main__":
    main()
