"""Benchmark: ``rep.mechanism(model=...)`` on SmolLM2-135M with its defaults, against its floor (issue 46).

Usage:  python benchmarks/bench_mechanism.py [--threads N] [--parts] [--repeat R]

In one process: load the zoo's SmolLM2-135M TransformerBridge and make its report (both timed, not part of the
target), then time

* **the call**: ``rep.mechanism(model=m)`` with its defaults (every one of the 270 heads; the attended-token effect
  on 2048 counted tokens of the default corpus in 128-token windows, 8 windows a pass; the token readout of 512
  seeded tokens, k = 20; both copying scores; 999 permutations). Target: at most 60 s on a quiet 2-core machine.
* **the floor**: what any exact implementation of the call has to do: the forward passes over the same windows
  with the same hooks (``hook_z``, ``hook_pattern`` of every layer, ``ln_final.hook_scale``), plus the readout's
  float64 products ``W_U[:, tile]ᵀ @ W_O[heads]ᵀ`` of every layer and tile (the ``W_O W_U`` columns the exact
  self-ranks need; ``probes/readout.py``).
* with ``--parts``, each part of the call alone (the effect, the readout, ``copying_scores``,
  ``own_copying_scores``, ``embedding_tie``, the report's identity check), to see where the rest goes.

Prints the headline and markdown rows with the date, wall and CPU time (``time.process_time``: the steadier
figure on a shared machine), torch's thread count, and the load average before and after each
(``benchmarks/RESULTS.md``). The machine's load is the caller's to report: a loaded machine stretches the wall
time, not the CPU time.
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import sys

from _harness import bench_parser, loadavg, md_header, md_row, timed, use_threads


def floor(model, rep) -> None:
    """The forward passes of the call's windows with its hooks, and the readout's float64 ``W_O W_U`` products."""
    import torch

    from tl_idempotence.probes.head_tokens import VOCAB_TILE
    from tl_idempotence.probes.readout import float64_tiles
    from tl_idempotence.probes.tokens import prepare_tokens

    toks, _ = prepare_tokens(model, None, seq_len=128, max_tokens=2048)
    layers = sorted(int(x) for x in rep.heads["layer"].unique())
    names = [f"blocks.{lay}.attn.hook_{w}" for lay in layers for w in ("z", "pattern")] + ["ln_final.hook_scale"]
    keep: dict[str, torch.Tensor] = {}

    def hook(x, hook=None):
        keep[hook.name] = x.detach()

    model.eval()
    with torch.no_grad():
        for s in range(0, len(toks), 8):
            model.run_with_hooks(toks[s : s + 8], fwd_hooks=[(n, hook) for n in names], return_type=None)
        U_rows = model.W_U.detach().float().T.contiguous()
        tiles = float64_tiles(U_rows)
        d_vocab = U_rows.shape[0]
        for lay in layers:
            OT = model.blocks[lay].attn.W_O.detach().double().reshape(-1, model.cfg.d_model).T
            for a in range(0, d_vocab, VOCAB_TILE):
                tiles(a, min(VOCAB_TILE, d_vocab - a)) @ OT


def parts(model, rep) -> list[tuple[str, float, float, str, str]]:
    """Each part of the call alone: ``(what, wall s, CPU s, load before, load after)``."""
    import tl_idempotence as tli
    from tl_idempotence.probes.roles import copying_scores
    from tl_idempotence.probes.tied import embedding_tie, own_copying_scores

    out = []
    for what, fn in (
        ("attended_token_effect (270 heads, defaults)", lambda: tli.attended_token_effect(model, progress=False)),
        ("head_tokens (270 heads x 512 tokens)", lambda: tli.head_tokens(model, progress=False)),
        ("copying_scores", lambda: copying_scores(model)),
        ("own_copying_scores", lambda: own_copying_scores(model)),
        ("embedding_tie", lambda: embedding_tie(model)),
        ("rep.check_joins(model=...)", lambda: rep.check_joins(model=model)),
    ):
        before = loadavg()
        wall, cpu, _ = timed(fn)
        out.append((what, wall, cpu, before, loadavg()))
    return out


def main(argv: list[str] | None = None) -> None:
    ap = bench_parser(__doc__)
    ap.add_argument("--parts", action="store_true", help="also time each part of the call alone")
    ap.add_argument("--repeat", type=int, default=1, help="time the call this many times (default 1)")
    args = ap.parse_args(argv)

    import torch

    import tl_idempotence as tli

    use_threads(args.threads)
    load_start = loadavg()
    wall_load, cpu_load, model = timed(lambda: tli.models.load("smollm2-135m", progress=False))
    wall_rep, cpu_rep, rep = timed(lambda: tli.idempotence_report(model, progress=False))
    rows = []
    before = loadavg()
    wall_f, cpu_f, _ = timed(lambda: floor(model, rep))
    rows.append(("floor: forward passes + float64 W_O W_U products", wall_f, cpu_f, before, loadavg()))
    for _ in range(args.repeat):
        before = loadavg()
        wall, cpu, mech = timed(lambda: rep.mechanism(model=model))
        rows.append(("rep.mechanism(model=m), defaults", wall, cpu, before, loadavg()))
    if args.parts:
        rows += parts(model, rep)
    print(mech.headline)
    print()
    print(md_header("date", "what", "wall s", "CPU s", "threads", "load before / after"))
    for what, w, c, b, a in rows:
        print(md_row(dt.date.today(), what, f"{w:.1f}", f"{c:.1f}", torch.get_num_threads(), f"{b} / {a}"))
    print(
        f"\n(load {wall_load:.1f} s wall / {cpu_load:.1f} CPU-s, report {wall_rep:.1f} s / {cpu_rep:.1f} CPU-s; load "
        f"average at start {load_start})"
    )
    print(
        f"{platform.platform()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, torch {torch.__version__};"
        f" command: {' '.join([os.path.basename(sys.executable), *sys.argv])}"
    )


if __name__ == "__main__":
    main()
