"""Benchmark: head roles on SmolLM2-135M (issue 29): ``tli.head_roles`` with its defaults and the copying scores.

Usage:  python benchmarks/bench_roles.py [--threads N]

In one process: load the zoo's SmolLM2-135M TransformerBridge (raw weights) and make its report (both timed, not
part of the targets), then time

* ``copying_scores(model)``: the copying score ``Re Σλ / Σ|λ|`` of the full OV circuit of all 270 heads
  (target < 5 s), with its peak memory: the process's peak resident set (Linux ``VmHWM``, reset through
  ``/proc/self/clear_refs`` before the call) above its resident set before the call, against the
  ``d_vocab x d_vocab`` float64 matrix the computation never forms (49,152² x 8 B = 18.0 GiB);
* ``tli.head_roles(model)`` with every default (24-token ``x``, 8 sequences, seed 0; includes the copying scores)
  (target < 30 s), with its peak memory the same way;
* ``rep.roles(roles=...)``: the association with closure alone (5 Spearman permutation tests of 999 permutations,
  Mann-Whitney, BH), given the roles;
* ``rep.roles(model=model)`` with every default: what ``--roles`` runs (the model checked against the report by
  content, ``head_roles`` and the association), with its progress bars (``--no-bars`` turns them off).

Wall and CPU seconds of the process (all threads). ``--threads 0`` (the default) leaves torch's own thread count.
The output is a markdown table with the date, the load average before and after, torch's thread count and the
command line (``benchmarks/RESULTS.md``).
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import sys

from _harness import bench_parser, loadavg, md_header, md_row, peak_above_start, use_threads


def main(argv: list[str] | None = None) -> None:
    ap = bench_parser(__doc__)
    ap.add_argument("--no-bars", action="store_true", help="time rep.roles(model=model) with progress=False")
    args = ap.parse_args(argv)

    import torch

    import tl_idempotence as tli
    from tl_idempotence.probes.roles import copying_scores

    use_threads(args.threads)
    load_before = loadavg()
    wall_load, _, _, model = peak_above_start(lambda: tli.models.load("smollm2-135m", progress=False))
    wall_rep, _, _, rep = peak_above_start(lambda: model.idempotence_report(progress=False))
    d_vocab = int(model.cfg.d_vocab)
    dense_gb = d_vocab**2 * 8 / 1024**3
    w_cop, c_cop, m_cop, (table, _, _) = peak_above_start(lambda: copying_scores(model))
    w_roles, c_roles, m_roles, roles = peak_above_start(lambda: tli.head_roles(model, progress=False))
    w_assoc, c_assoc, _, assoc = peak_above_start(lambda: rep.roles(roles=roles, progress=False))
    w_full, c_full, m_full, _ = peak_above_start(lambda: rep.roles(model=model, progress=not args.no_bars))
    load_after = loadavg()

    def gb(v: float | None) -> str:
        return "n/a" if v is None else f"{v:.3f} GiB ({v / dense_gb:.2%} of d_vocab² float64)"

    print(f"## head roles on SmolLM2-135M — `python {' '.join(sys.argv)}`\n")
    print(
        f"{dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC, {platform.machine()}, {os.cpu_count()} CPUs, torch "
        f"{torch.__version__} ({torch.get_num_threads()} threads), load average {load_before} before, "
        f"{load_after} after. Model load {wall_load:.1f} s and report {wall_rep:.1f} s (not part of the targets). "
        f"d_vocab = {d_vocab}: a d_vocab² float64 matrix would take {dense_gb:.1f} GiB.\n"
    )
    print(md_header("what", "wall", "CPU", "peak RSS above start", "target"))
    print(md_row(f"copying scores, {len(table)} heads", f"{w_cop:.2f} s", f"{c_cop:.2f} s", gb(m_cop), "< 5 s"))
    print(md_row("`tli.head_roles(model)`, defaults", f"{w_roles:.2f} s", f"{c_roles:.2f} s", gb(m_roles), "< 30 s"))
    print(md_row("`rep.roles(roles=...)`: association only", f"{w_assoc:.2f} s", f"{c_assoc:.2f} s", "", ""))
    bars = "no bars" if args.no_bars else "with its bars"
    print(md_row(f"`rep.roles(model=model)`, defaults, {bars}", f"{w_full:.2f} s", f"{c_full:.2f} s", gb(m_full), ""))
    a = assoc.association
    print(
        f"\nassociation: |copying| ρ = {a.loc['|copying|', 'spearman_rho']:.3f}, Mann-Whitney q = "
        f"{a.loc['|copying|', 'mannwhitney_q']:.2g}; closed heads {int(assoc.summary['n_closed'])}."
    )


if __name__ == "__main__":
    main()
