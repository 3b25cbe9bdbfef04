"""The population run (issue 47, SPEC 13 "Population"): every lineage seed, tied and untied, and every zoo model in
one table, with the combined test across models (``tli.compare_mechanisms``).

Usage::

    python scripts/population.py [--out DIR] [--seeds 10] [--models NAME ...] [--md benchmarks/population.md]

* the induction lineage (``tli.train_lineage``: 2 layers, 4 query / 2 kv heads, 200 steps) for seeds
  ``0 .. seeds-1``, trained tied and untied, under ``DIR/lineages/{tied,untied}_s{seed}`` (re-used when a verified,
  identical lineage is there: ``train_lineage(reuse=True)``); each judged at the length it was trained on: 64 seeded
  sequences ``BOS x x`` of 33 tokens (``x`` 16 uniform non-special tokens, the generator seeded 0; as
  ``demos/06_head_tokens.ipynb``), ``rep.mechanism(model, texts=..., max_tokens=None, k=5, seed=0)``;
* every zoo model (``tli.models.known_models()``; ``--models`` to choose): ``rep.mechanism(model, n_tokens=128,
  seed=0)`` on the default corpus (2048 counted tokens in 128-token windows; the readout's 128 tokens are not read by
  the population statistics). A model whose mechanism is refused (an encoder) is a row with the reason; a model that
  cannot be fetched is one too (``status`` "refused", the error named), never left out;
* ``tli.compare_mechanisms`` of them all (defaults: 1 control per closed head matched on |α| within its layer,
  9999 draws, seed 0), written to ``DIR/population.csv``, ``DIR/population.json`` (the table and the summary) and
  ``DIR/population_heads.csv`` (every head), and a markdown note (``--md``) with the command, the CPU seconds
  (``time.process_time`` plus the children's), the wall time, the machine's load, the per-model table and the answer.

Runs on a 2-core machine (torch's threads as set; ``--threads`` to choose). The default run took 1,021 CPU-s and
26.5 min wall on this project's 2-core machine at load 4-7 (2026-12-07; docs/population.md): the 20 lineages 152
CPU-s (trained and measured), Gemma-3-270M 664 (its readout over a 262k vocabulary), SmolLM2-135M 199. Cheaper:
``--models smollm2-135m minilm-l6`` (about 355 CPU-s), ``--seeds N``, smaller ``--n-tokens``/``--max-tokens``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

#: The lineage's training steps (``train_lineage``'s default); only the last checkpoint is kept.
STEPS = 200


def cpu_seconds() -> float:
    """CPU seconds of this process (every thread) and of its finished children."""
    t = os.times()
    return time.process_time() + t.children_user + t.children_system


def loadavg() -> str:
    try:
        return " ".join(f"{v:.2f}" for v in os.getloadavg())
    except OSError:  # pragma: no cover - not Unix
        return "n/a"


def lineage_texts() -> Any:
    """``[64, 33]`` token ids: ``BOS x x`` with ``x`` 16 uniform tokens 4..63, the generator seeded 0."""
    import torch

    x = torch.randint(4, 64, (64, 16), generator=torch.Generator().manual_seed(0))
    return torch.cat([torch.ones(64, 1, dtype=torch.long), x, x], dim=1)


def lineage_mechanism(root: Path, seed: int, tied: bool, texts: Any) -> tuple[Any, dict[str, Any]]:
    """Train (or re-use) one lineage and measure its mechanism; returns it and what the note says of it."""
    from transformer_lens.model_bridge import TransformerBridge

    import tl_idempotence as tli

    folder = root / f"{'tied' if tied else 'untied'}_s{seed}"
    reused = (folder / "lineage.json").exists()
    lin = tli.train_lineage(folder, seed=seed, tie_word_embeddings=tied, steps=STEPS, save_steps=(STEPS,))
    model = TransformerBridge.boot_transformers(str(lin.checkpoints[-1][1]), device="cpu")
    rep = tli.idempotence_report(model, progress=False)
    mech = rep.mechanism(model=model, texts=texts, max_tokens=None, k=5, seed=0)
    acc = float(lin.metrics["induction_acc"].iloc[-1])
    return mech, {"reused": reused, "induction_acc": acc}


def zoo_mechanism(name: str, n_tokens: int, max_tokens: int) -> Any:
    """The mechanism of a zoo model, or the exception that refused it (fetching included)."""
    import tl_idempotence as tli

    try:
        model = tli.models.load(name, progress=False)
        rep = tli.idempotence_report(model, progress=False)
        return rep.mechanism(model=model, n_tokens=n_tokens, max_tokens=max_tokens, seed=0)
    except Exception as e:  # noqa: BLE001 - a refused model is a row with its reason, never dropped
        return e


def _fmt(v: Any, digits: int = 2) -> str:
    if isinstance(v, bool) or v is None:
        return "" if v is None else str(v)
    if isinstance(v, float):
        if v != v:
            return "—"
        return f"{v:.{digits}g}" if abs(v) < 1e-2 and v != 0 else f"{v:.{digits}f}"
    return str(v)


def markdown(cmp: Any, command: str, timing: dict[str, Any], extra: dict[str, dict[str, Any]]) -> str:
    """The note: command, cost, machine, answer, per-model table."""
    t = cmp.table
    s = cmp.summary
    lines = [
        "# The population run (issue 47)",
        "",
        'Made by `scripts/population.py` (SPEC 13 "Population"; docs/population.md).',
        "",
        f"Command: `{command}`",
        "",
        "| date | machine | torch threads | CPU s (process + children) | wall s | load before | load after | "
        "lineages trained / re-used |",
        "|---|---|---|---|---|---|---|---|",
        f"| {timing['date']} | {timing['machine']} | {timing['threads']} | {timing['cpu']:.0f} | {timing['wall']:.0f} "
        f"| {timing['load_before']} | {timing['load_after']} | {timing['trained']} / {timing['reused']} |",
        "",
        "Per part (CPU s): " + ", ".join(f"{k} {v:.0f}" for k, v in timing["parts"].items()) + ".",
        "",
        "## The answer",
        "",
        cmp.headline,
        "",
        f"Combined test: pooled closed-vs-matched-control difference in agreement (direction = sign(α)), "
        f"{_fmt(s['pooled_difference'], 3)} (closed {_fmt(s['pooled_closed_rate'], 3)} over {s['n_pooled_closed']} "
        f"heads, controls {_fmt(s['pooled_control_rate'], 3)} over {s['n_pooled_controls']}), p = "
        f"{_fmt(s['pooled_p'], 3)} "
        f"({s['pooled_method']}, {s['pooled_n_relabelings']} relabellings within (model, layer); floor "
        f"{_fmt(s['pooled_p_floor'], 2)}). Secondary: matched differences positive in {s['n_models_positive']}, "
        f"negative in {s['n_models_negative']}, zero in {s['n_models_zero']} models (sign test p = "
        f"{_fmt(s['models_sign_test_p'], 3)}). Pooled Spearman ρ(α·P, effect) {_fmt(s['spearman_rho_pooled'], 3)}, "
        f"p within (model, layer) {_fmt(s['spearman_p_within'], 3)}.",
        "",
        "## Per model",
        "",
        "| model | status | tied | heads | closed | agree / tested (closed) | sign p | non-closed agree | matched "
        "closed − control (n) | matched p | ρ(α·P, effect) | p within layers | p unstratified | copying = sign(α): "
        "closed / other | notes |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for _, r in t.iterrows():
        if r["status"] == "refused":
            lines.append(f"| {r['model']} | refused | | | | | | | | | | | | | {r['notes']} |")
            continue
        other = f"{r['n_other_agree']}/{r['n_other_tested']}" if r["n_other_tested"] else "—"
        matched = (
            f"{_fmt(r['matched_closed_rate'])} − {_fmt(r['matched_control_rate'])} ({r['n_matched_closed']})"
            if r["n_matched_closed"]
            else "—"
        )
        note = r["notes"]
        more = extra.get(r["model"], {})
        if "induction_acc" in more:
            note = f"induction acc {more['induction_acc']:.3f}" + (f"; {note}" if note else "")
        lines.append(
            f"| {r['model']} | measured | {r['tied']} | {r['n_heads']} | {r['n_closed']} | "
            f"{r['n_agree']}/{r['n_sign_tested']} | {_fmt(r['sign_test_p'])} | {other} | {matched} | "
            f"{_fmt(r['matched_p'])} | {_fmt(r['spearman_rho'])} | {_fmt(r['spearman_p_within_layer'])} | "
            f"{_fmt(r['spearman_p_unstratified'])} | {_fmt(r['copying_rate_closed'])} / "
            f"{_fmt(r['copying_rate_other'])} | {note} |"
        )
    lines += [
        "",
        "Agreement: a head's direction (the sign of effect − null, what its own test tests) equals sign(α); "
        "matched controls: for each closed head the non-closed head of its layer nearest in |α|; p values two-sided. "
        "Direct effects only (no indirect paths, no self-repair).",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path.home() / ".cache" / "tli_population", help="work folder")
    ap.add_argument("--seeds", type=int, default=10, help="lineage seeds 0 .. N-1, each tied and untied (10)")
    ap.add_argument("--models", nargs="*", default=None, help="zoo models (default: every one)")
    ap.add_argument("--md", type=Path, default=Path("benchmarks/population.md"), help="the markdown note")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    ap.add_argument("--n-tokens", type=int, default=128, help="zoo models: the token readout's sample (128)")
    ap.add_argument("--max-tokens", type=int, default=2048, help="zoo models: the effect's token budget (2048)")
    args = ap.parse_args(argv)
    if args.seeds < 0:
        ap.error("--seeds must be >= 0")
    if args.n_tokens < 1 or args.max_tokens < 1:
        ap.error("--n-tokens and --max-tokens must be >= 1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    cpu0, wall0, load_before = cpu_seconds(), time.perf_counter(), loadavg()
    import torch

    import tl_idempotence as tli
    from tl_idempotence.core.files import atomic_write_text
    from tl_idempotence.core.progress import quiet_transformers

    if args.threads:
        torch.set_num_threads(args.threads)
    models = tli.models.known_models() if args.models is None else list(args.models)
    for sub in ("lineages", "mechanisms"):
        (args.out / sub).mkdir(parents=True, exist_ok=True)
    texts = lineage_texts()
    items: dict[str, Any] = {}
    extra: dict[str, dict[str, Any]] = {}
    parts: dict[str, float] = {}
    with quiet_transformers():
        c = cpu_seconds()
        for seed in range(args.seeds):
            for tied in (True, False):
                label = f"lineage-{'tied' if tied else 'untied'}-s{seed}"
                items[label], extra[label] = lineage_mechanism(args.out / "lineages", seed, tied, texts)
                print(label, "done", flush=True)
        parts[f"{2 * args.seeds} lineages"] = cpu_seconds() - c
        for name in models:
            c = cpu_seconds()
            items[name] = zoo_mechanism(name, args.n_tokens, args.max_tokens)
            parts[name] = cpu_seconds() - c
            print(name, "refused" if isinstance(items[name], BaseException) else "done", flush=True)
    c = cpu_seconds()
    cmp = tli.compare_mechanisms(items)
    parts["compare_mechanisms"] = cpu_seconds() - c
    cmp.export(args.out / "population.csv", overwrite=True)
    cmp.export(args.out / "population.json", overwrite=True)
    atomic_write_text(args.out / "population_heads.csv", cmp.heads.to_csv(index=False))
    for label, item in items.items():  # each mechanism as the library saves it (tli.load_mechanism reads it back)
        if not isinstance(item, BaseException):
            item.save(args.out / "mechanisms" / label, overwrite=True)
    timing = {
        "date": dt.date.today().isoformat(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "threads": torch.get_num_threads(),
        "cpu": cpu_seconds() - cpu0,
        "wall": time.perf_counter() - wall0,
        "load_before": load_before,
        "load_after": loadavg(),
        "trained": sum(1 for e in extra.values() if not e["reused"]),
        "reused": sum(1 for e in extra.values() if e["reused"]),
        "parts": parts,
    }
    command = "python scripts/population.py " + " ".join(sys.argv[1:] if argv is None else argv)
    args.md.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.md, markdown(cmp, command.strip(), timing, extra))
    print(cmp.headline)
    print(f"CPU {timing['cpu']:.0f} s, wall {timing['wall']:.0f} s; wrote {args.md} and {args.out}/population.*")
    return 0


if __name__ == "__main__":
    sys.exit(main())
