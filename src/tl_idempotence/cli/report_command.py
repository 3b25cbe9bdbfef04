"""``tl-idempotence report``: checks every argument before any work (exit 2), measures the model and writes what
was asked for (the page, ``--csv``, ``--json`` or the text summary)."""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import sys
from pathlib import Path
from typing import Any

from .common import (
    DEFAULT_PAGE,
    EXIT_OK,
    Failure,
    check_format,
    one_line,
    refuse_over_inputs,
    report_options_of,
    zoo_names,
)


def _looks_like_path(name: str) -> bool:
    """A local path rather than a Hugging Face repo id (``owner/name``)."""
    return (
        name.startswith(("/", ".", "~"))
        or name.count("/") > 1
        or "\\" in name
        or name.endswith((".gguf", ".safetensors", ".json", ".bin"))
    )


def _resolve_model(args: argparse.Namespace, parser: argparse.ArgumentParser) -> tuple[str, str]:
    """``(kind, value)``: ("zoo", name), ("path", path) or ("hub", name). Usage errors exit 2.

    A name that is neither an existing path, a zoo name nor a plausible hub id (``owner/name``,
    :func:`~tl_idempotence.sources.names.is_hub_id`) exits 2 naming the nearest zoo models, before any network or
    hub attempt; with the hub switched off (``HF_HUB_OFFLINE``/``TRANSFORMERS_OFFLINE``) a hub id that the local
    Hugging Face cache does not hold fails in one line (exit 1), before transformers is imported.
    """
    from ..errors import TLIError
    from ..sources.names import hub_offline, in_hub_cache, is_hub_id, known_and_close, resolve_name

    name = args.model
    try:
        named = resolve_name(name, "MODEL")  # the one rule of every route (sources/names.py)
    except TLIError as e:
        parser.error(str(e))
    kind: str = named.kind
    value = str(named.value)
    if kind == "unknown":
        zoo = ", ".join(zoo_names())
        if _looks_like_path(name):
            parser.error(f"no such file or folder: {name!r} (and not a zoo model: {known_and_close(name)})")
        if not is_hub_id(name):
            parser.error(
                f"MODEL {name!r} is not a zoo model ({known_and_close(name)}), nor an existing file or folder, nor "
                "a Hugging Face hub id (owner/name, e.g. HuggingFaceTB/SmolLM2-135M)"
            )
        offline = hub_offline()
        if offline and not in_hub_cache(name):
            raise Failure(
                f"{name!r} is not a zoo model ({zoo}) nor an existing path, and {offline} is set and the local "
                "Hugging Face cache does not hold it, so it cannot be read from the hub. Pass a local checkpoint "
                "folder or .gguf file."
            )
        kind = "hub"
    if kind == "path" and (args.processing != "raw" or args.cls != "bridge"):
        parser.error(
            "--processing and --cls apply to zoo models (and hub names); a checkpoint path is read raw from its files"
        )
    if kind == "path":  # the joins asked for that run a model: none on weights only
        for spec, _ in asked_joins(args):
            if spec.cli is not None and spec.cli.needs_model is not None:
                parser.error(spec.cli.needs_model)
    return kind, value


def _hub_model(name: str, args: argparse.Namespace) -> Any:
    """The hub model ``name`` (``TransformerBridge.boot_transformers``); a hub id that is not there fails in one
    line. Only reached for a plausible hub id that the hub may serve (:func:`_resolve_model`)."""
    try:
        from transformer_lens.model_bridge import TransformerBridge

        model = TransformerBridge.boot_transformers(name, device=args.device if args.device != "auto" else "cpu")
    except OSError as e:
        raise Failure(
            f"{name!r} is not a zoo model ({', '.join(zoo_names())}) nor an existing path, and loading it from the "
            f"Hugging Face hub failed ({one_line(e)}). Check the name and the network, or pass a local checkpoint."
        ) from e
    if args.processing == "tl":
        model.enable_compatibility_mode(disable_warnings=True)
    return model


def _summary_text(rep: Any) -> str:
    import pandas as pd

    from ..views.text import format_P, headline

    s = rep.summary
    lines = [
        headline(s, rep.threshold),
        f"model: {s.model_name} ({s.model_class}), {s.n_attention_layers} attention layers x "
        f"{s.n_heads_per_layer} heads ({s.n_kv_heads} kv heads), d_model {s.d_model}, d_head {s.d_head}",
    ]
    closed = rep.closed_heads
    if len(closed):
        cols = [c for c in ("layer", "head", "kv_head", "alpha", "P") if c in closed.columns]
        table = closed[cols].copy()
        table["P"] = [format_P(v, rep.threshold) for v in table["P"]]
        with pd.option_context("display.float_format", "{:.4f}".format, "display.max_rows", 500):
            lines += ["closed heads:", table.to_string()]
    else:
        lines.append("closed heads: none")
    return "\n".join(lines)


def summary_json(rep: Any, roles: Any = None, mechanism: Any = None, *, joins: Any = None) -> str:
    """``--json``: the report's JSON export (:func:`~tl_idempotence.report.export.export_record`, with the joins
    asked for: ``--roles`` adds the role columns and the association, ...) under the export NaN policy (NaN as null,
    :data:`~tl_idempotence.core.jsonio.EXPORT`), as a ``.json`` output holds it."""
    from ..core.jsonio import EXPORT, json_text
    from ..report.export import export_record

    return json_text(export_record(rep, roles, mechanism, joins=joins), EXPORT, indent=1)


def asked_joins(args: argparse.Namespace) -> list[tuple[Any, Any]]:
    """``(spec, value)`` of the joined probes whose flag was given (:mod:`tl_idempotence.report.joins`), in the
    registry's order: what ``report`` computes after the report, in that order."""
    from ..report.joins import JOINS

    out = []
    for spec in JOINS:
        value = getattr(args, spec.cli.dest, None) if spec.cli is not None else None
        if value is not None and value is not False:
            out.append((spec, value))
    return out


def _same_file(a: str, b: str) -> bool:
    """Whether ``--csv`` and ``--out`` name one regular file (two streams, ``/dev/null`` twice, may be one)."""
    from ..core.files import is_stream

    pa, pb = Path(a).expanduser(), Path(b).expanduser()
    if is_stream(pa) or is_stream(pb):
        return False
    if pa.exists() and pb.exists():
        return os.path.samefile(pa, pb)
    return pa.resolve() == pb.resolve()


def _model_inputs(kind: str, value: str) -> list[tuple[str, Any]]:
    """What the run over MODEL reads (``(what, path)`` pairs): a checkpoint path, the zoo cache, or for a hub name
    the Hugging Face cache it downloads into (sources/names.py: named_inputs)."""
    from ..sources.names import Named, named_inputs

    if kind == "hub":
        try:
            from huggingface_hub import constants
        except ImportError:  # pragma: no cover - transformers brings it
            return []
        return [("the Hugging Face cache", constants.HF_HUB_CACHE)]
    return named_inputs(Named("zoo" if kind == "zoo" else "path", value))


def _page_path(args: argparse.Namespace) -> str | None:
    """Where the page goes: ``--out``, else :data:`DEFAULT_PAGE` when no other output (``--json``, ``--csv``) was
    asked for, else nowhere (a run that asked for JSON writes no page beside it)."""
    if args.out is not None:
        return str(args.out)
    return None if (args.json or args.csv) else DEFAULT_PAGE


#: The formats ``--out`` writes (the output registry, :mod:`tl_idempotence.core.outputs`; ``--csv`` writes "csv").
OUT_FORMATS = ("html", "json", "csv", "parquet")


def _out_stream_format(args: argparse.Namespace) -> str:
    """The format ``--out`` is written as when it names a stream (``/dev/null``, ``/dev/stdout``, a named pipe: no
    extension to choose by): the page, or the JSON export with ``--json``."""
    return "json" if args.json else "html"


def _check_formats(
    parser: argparse.ArgumentParser, page: str | None, csv: str | None, out_stream: str = "html"
) -> str | None:
    """Exit 2, before any work, when ``--out`` or ``--csv`` has an extension the registry does not write there
    (names the known ones); a stream is written as the flag implies (``--csv`` CSV, ``--out`` ``out_stream``).
    Returns the format of ``--out`` (None without a page)."""
    if csv is not None:
        check_format(parser, csv, ("csv",), "--csv", stream_format="csv")
    return check_format(parser, page, OUT_FORMATS, "--out", stream_format=out_stream) if page is not None else None


def _written(path: str, existed: bool) -> str:
    from ..core.files import is_stream

    return f"{path} (replaced the file that was there)" if existed and not is_stream(path) else path


def _stdout_data(
    parser: argparse.ArgumentParser, args: argparse.Namespace, page: str | None, page_format: str | None
) -> list[str]:
    """The outputs that write this process's standard output (:func:`~tl_idempotence.core.files.is_stdout`: by
    name, ``/dev/stdout``, or because file descriptor 1 is that file or pipe), as ``--json``, ``--out PATH``,
    ``--csv PATH``; with any, stdout is data only and every human line goes to stderr. ``--json`` with ``--out``
    writing the JSON export to stdout is one output (the same record, written once). Two others exit 2 (before any
    work): their bytes would mix."""
    from ..core.files import is_stdout

    out = [f"--out {page}"] if page is not None and is_stdout(page) else []
    if args.json and not (out and page_format == "json"):
        out.append("--json")
    if args.csv and is_stdout(args.csv):
        out.append(f"--csv {args.csv}")
    if len(out) > 1:
        both = "both" if len(out) == 2 else "all"
        parser.error(
            f"{' and '.join(out)} {both} write to standard output, where their data would mix: give all but one of "
            "them a file"
        )
    return out


def cmd_report(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """``report``: every argument checked (exit 2) before the model is read, then the report measured and
    written as asked (the page, ``--csv``, ``--json`` or the text summary); returns the exit code.

    Standard output holds the data alone when data goes there (``--json``, ``--csv /dev/stdout``, ``--out
    /dev/stdout``, or an output that is the file stdout is redirected to: :func:`_stdout_data`): the text
    summary, the joins' text, what was written and anything a library prints while the run goes on (the model's
    loader) go to stderr, and the data is written once, parseable."""
    page = _page_path(args)
    if args.csv and page and _same_file(args.csv, page):
        parser.error(f"--csv {args.csv} and --out {page} name the same file; give each its own file")
    asked = asked_joins(args)
    page_only = [(spec.cli.flag, spec.cli.page_only) for spec, _ in asked if spec.cli.page_only]
    for flag, what in page_only if page is None else ():
        parser.error(f"{flag} {what}: give --out (no page is written with --json or --csv alone)")
    kind, value = _resolve_model(args, parser)
    reads = _model_inputs(kind, value)
    refuse_over_inputs(parser, [("--resume", args.resume)], reads)  # parts never go into the checkpoint
    refuse_over_inputs(parser, [("--out", page), ("--csv", args.csv)], [*reads, ("the resume folder", args.resume)])
    page_format = _check_formats(parser, page, args.csv, _out_stream_format(args))
    for flag, what in page_only if page_format != "html" else ():
        parser.error(f"{flag} {what}: --out {page} is not a page (.html)")
    data_out = _stdout_data(parser, args, page, page_format)
    from ..core.options import check_device

    check_device(args.device)  # a missing GPU fails before anything is loaded
    stdout = sys.stdout
    human = sys.stderr if data_out else stdout
    # stdout is data: a library's own prints while the run goes on (TransformerLens's loaders) go to stderr too
    with contextlib.redirect_stdout(sys.stderr) if data_out else contextlib.nullcontext():
        rep, joins = _measure(args, kind, value, asked)
        wrote = _write_files(args, page, rep, joins)
    if "--json" in data_out:  # (else --out wrote this record to stdout already)
        print(summary_json(rep, joins=joins), file=stdout)
    if not args.json:
        print(_summary_text(rep), file=human)
        for spec, _ in asked:
            if spec.cli.text is not None and spec.name in joins:
                print(spec.cli.text(joins[spec.name]), file=human)
    if wrote and (args.json or data_out):  # stdout is the data alone: what was written goes to stderr
        print(f"tl-idempotence: wrote {' and '.join(wrote)}", file=sys.stderr)
    elif wrote:
        print(f"wrote {' and '.join(wrote)}", file=human)
    return EXIT_OK


def _measure(
    args: argparse.Namespace, kind: str, value: str, asked: list[tuple[Any, Any]]
) -> tuple[Any, dict[str, Any]]:
    """The model read (zoo source or model, hub model or checkpoint path), the report measured and the joins
    asked for computed, with their progress on stderr (none with ``--quiet``): ``(report, {join name: result})``."""
    from ..report.report import idempotence_report

    # torch and pandas are imported now: ~200,000 objects that every full collection of the run, and
    # the interpreter's collections at exit, would traverse again (~0.5 s of the main job). Freeze
    # them (gc.freeze, public API; refcounting still frees everything); main() unfreezes on return
    # unless this process is the console script and ends right after.
    if args.freeze_gc:
        gc.freeze()

    needs_model = args.processing == "tl" or args.cls == "hooked" or any(spec.cli.needs_model for spec, _ in asked)
    model: Any
    if kind == "zoo" and not needs_model:
        from ..sources import zoo

        model = zoo.source(value, progress=not args.quiet)
    elif kind == "zoo":
        from ..sources import zoo

        model = zoo.load(value, processing=args.processing, cls=args.cls, progress=not args.quiet)
    elif kind == "hub":
        model = _hub_model(value, args)
    else:
        model = value
    rep = idempotence_report(model, resume=args.resume, progress=not args.quiet, **report_options_of(args))
    joins: dict[str, Any] = {}
    for spec, value in asked:  # in the registry's order: a join may use the ones before it (--mechanism --roles)
        if spec.cli.progress and not args.quiet:
            print(spec.cli.progress, file=sys.stderr)
        joins[spec.name] = spec.cli.run(rep, model, value, joins, args, progress=not args.quiet)
    return rep, joins


def _write_files(args: argparse.Namespace, page: str | None, rep: Any, joins: dict[str, Any]) -> list[str]:
    """``--out`` and ``--csv`` written (a stream in place: :func:`~tl_idempotence.core.outputs.write_output`);
    returns what was written, for the line that says so."""
    from ..core.outputs import write_output
    from ..report.export import report_output

    wrote = []
    if page is not None:
        existed = os.path.lexists(page)
        write_output(
            report_output(rep, joins=joins), page, OUT_FORMATS, flag="--out", stream_format=_out_stream_format(args)
        )
        wrote.append(_written(page, existed))
    if args.csv:
        existed = os.path.lexists(args.csv)
        write_output(report_output(rep, joins=joins), args.csv, ("csv",), flag="--csv", stream_format="csv")
        wrote.append(_written(args.csv, existed))
    return wrote
