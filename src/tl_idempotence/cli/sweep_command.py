"""``tl-idempotence sweep``: many models or checkpoints as Dask tasks, one item per job-array task
(``--task-index``), or the reports of a sweep read back (``--collect``)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .args import FROM_ENV
from .common import EXIT_FAILURE, EXIT_OK, check_format, refuse_over_inputs, report_options_of, zoo_names


def _sweep_items(raw: Sequence[str], parser: argparse.ArgumentParser) -> dict[str, str]:
    """``{label: item}`` from the command line's ITEMs (usage errors exit 2).

    ``LABEL=ITEM`` names an item (unless the whole string is an existing path); a zoo name is its own label;
    a checkpoint path gets its folder name (a ``.safetensors``/``config.json`` file: its folder's name; a ``.gguf``
    file: its name without the suffix; :func:`~tl_idempotence.sources.names.path_label`). Paths whose names repeat
    get as many parent folder names as make them distinct (``runs/seed1/step200`` and
    ``runs/seed2/step200`` -> ``seed1_step200``, ``seed2_step200``). The same labels on every run of the
    same command line: job-array tasks agree on them.
    """
    from ..errors import TLIError
    from ..sources.names import checkpoint_of, path_label, resolve_name

    zoo = zoo_names()
    given: list[tuple[str | None, str]] = []
    for it in raw:
        label, eq, val = it.partition("=")
        if eq and label and not Path(it).expanduser().exists():
            if "/" in label or "\\" in label:
                parser.error(
                    f"item {it!r}: the label {label!r} holds a path separator; LABEL=ITEM takes a plain name "
                    "(e.g. step200=runs/ckpt_step200)"
                )
            if not val.strip():
                parser.error(f"item {it!r}: nothing after '='")
            given.append((label, val))
        else:
            given.append((None, it))
    labels: list[str] = []
    paths: dict[int, Path] = {}
    for i, (name, val) in enumerate(given):
        try:
            named = resolve_name(val, f"ITEM {val!r}")  # the one rule of every route (sources/names.py)
        except TLIError as e:
            parser.error(str(e))
        if named.kind == "unknown":
            parser.error(f"no such file or folder: {val!r} (and not a zoo model: {', '.join(zoo)})")
        if name is not None:
            labels.append(name)
        elif named.kind == "zoo":
            labels.append(str(named.value))
        elif named.kind == "path":
            paths[i] = Path(named.value).absolute()
            labels.append(path_label(paths[i]))
    seen_paths: dict[Path, str] = {}
    for i, p in paths.items():
        if p in seen_paths:
            parser.error(f"{given[i][1]!r} and {seen_paths[p]!r} are the same checkpoint; give it once")
        seen_paths[p] = given[i][1]
    for name in sorted({labels[i] for i in paths}):
        group = [i for i in paths if labels[i] == name]
        if len(group) < 2:
            continue
        depth = 2
        while True:
            parts = {i: [*checkpoint_of(paths[i]).parent.parts[1:], path_label(paths[i])] for i in group}
            cand = {i: "_".join(parts[i][-depth:]) for i in group}
            if len(set(cand.values())) == len(group) or depth > max(len(v) for v in parts.values()):
                break
            depth += 1
        for i in group:
            labels[i] = cand[i]
    items: dict[str, str] = {}
    for label, (_, val) in zip(labels, given):
        if label in items:
            parser.error(
                f"items {items[label]!r} and {val!r} would both be labelled {label!r}; name one with LABEL=ITEM"
            )
        items[label] = val
    return items


def _print_sweep(res: Any, args: argparse.Namespace) -> int:
    """The comparison table on stdout, failed and missing items on stderr; exit 1 when any."""
    import pandas as pd

    with pd.option_context("display.max_columns", 20, "display.width", 200, "display.float_format", "{:.4g}".format):
        print(res.overview.to_string(index=False))  # the headline columns; every column: --html or load_sweep(OUT)
    if args.html:
        res.save_html(args.html)
    if len(res.failed):
        print(f"{len(res.failed)} item(s) failed:", file=sys.stderr)
        for row in res.failed.itertuples(index=False):
            print(f"  {row.label}: {row.error_type}: {row.message}", file=sys.stderr)
    if len(res.missing):
        print(f"{len(res.missing)} item(s) have no report yet:", file=sys.stderr)
        for row in res.missing.itertuples(index=False):
            print(f"  {row.label}: {row.reason}", file=sys.stderr)
    return EXIT_FAILURE if len(res.failed) or len(res.missing) else EXIT_OK


def _refuse_with(args: argparse.Namespace, parser: argparse.ArgumentParser, mode: str, flags: Sequence[str]) -> None:
    for flag in flags:
        value = getattr(args, flag.lstrip("-").replace("-", "_"))
        if value not in (None, False):
            parser.error(f"{flag} does not apply with {mode}")


def _collect_options(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """--collect reads the options from DIR/sweep.json: an option given on the command line must equal them."""
    from ..analyses.report_options import report_options
    from ..studies.sweep import read_sweep_plan

    plan = read_sweep_plan(args.out)
    for name in (o.name for o in report_options()):
        value = getattr(args, name)
        if value == parser.get_default(name):
            continue
        have = plan.device_asked if name == "device" else plan.options.get(name)
        want = list(value) if name == "layers" else value
        if have != want:
            flag = "--" + name.replace("_", "-")
            shown, made = str(value), repr(have)
            if name == "layers":  # any number of layers, in a message of bounded length
                from ..core.options import index_summary

                shown, made = index_summary(want), index_summary(have) if isinstance(have, list) else repr(have)
            parser.error(
                f"{flag} {shown}: the sweep in {args.out} was made with {made} (its sweep.json); --collect reads "
                f"its reports as they are: leave {flag} out"
            )


def cmd_sweep(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """``sweep``: a Dask sweep, one job-array task (``--task-index``) or the reports read back (``--collect``);
    returns the exit code (1 when items failed or are missing)."""
    import warnings

    with warnings.catch_warnings():  # the failed and missing items are printed below, each on its own line
        warnings.filterwarnings("ignore", r"\d+ of \d+ sweep items (failed|have no report yet)", UserWarning)
        return _sweep_command(args, parser)


def _sweep_command(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    if args.task_index is None and not args.collect:  # the Dask route: its [cluster] extra, before any work
        from ..studies.cluster import require_cluster

        require_cluster("tl-idempotence sweep")
    items = _sweep_items(args.items, parser)
    from ..sources.names import named_inputs, resolve_name

    reads = [pair for val in items.values() for pair in named_inputs(resolve_name(val))]
    refuse_over_inputs(parser, [("--out", args.out)], reads)  # the reports never go into an item's checkpoint
    refuse_over_inputs(parser, [("--html", args.html)], [*reads, ("the sweep folder", args.out)])
    if args.html is not None:  # the page's extension, before the sweep runs (not after)
        check_format(parser, args.html, ("html",), "--html")
    opts = report_options_of(args)
    progress = not args.quiet
    if args.task_index is not None:
        _refuse_with(
            args,
            parser,
            "--task-index (one item in this process)",
            ["--collect", "--workers", "--oversubscribe", "--scheduler", "--worker-timeout", "--html"],
        )
        from ..studies.sweep import run_sweep_item

        index = None if args.task_index == FROM_ENV else args.task_index
        row = run_sweep_item(items, args.out, index, retries=args.retries, replan=args.replan, **opts)
        print(
            f"{row['label']}: {row['status']} ({row['reason']}) in {row['seconds']:.1f} s -> "
            f"{Path(args.out) / row['dir']}  [item {row['index']} of {len(items)}, index from {row['index_from']}]"
        )
        return EXIT_OK
    if args.collect:
        _refuse_with(
            args,
            parser,
            "--collect (reading DIR back)",
            ["--workers", "--oversubscribe", "--scheduler", "--worker-timeout", "--replan"],
        )
        from ..studies.sweep import load_sweep

        if not Path(args.out).is_dir():  # a mistyped folder is a bad argument (exit 2), not a failed sweep
            parser.error(
                f"--collect: {args.out} is not a folder: no sweep to read there (give the --out of a sweep whose "
                "tasks have run)"
            )
        _collect_options(args, parser)
        return _print_sweep(load_sweep(args.out, items=items), args)
    from ..studies.sweep import sweep

    extra: dict[str, Any] = {} if args.worker_timeout is None else {"worker_timeout": args.worker_timeout}
    res = sweep(
        items,
        args.out,
        scheduler=args.scheduler,
        workers=args.workers,
        oversubscribe=args.oversubscribe,
        retries=args.retries,
        progress=progress,
        replan=args.replan,
        **extra,
        **opts,
    )
    return _print_sweep(res, args)
