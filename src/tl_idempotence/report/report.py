"""The per-head idempotence report: one pass over the layers, every analysis per layer.

Data flow: a :class:`~tl_idempotence.core.heads.HeadSource` yields one
:class:`~tl_idempotence.core.heads.LayerHeads` at a time; the loop checks it (type,
layer index, sizes, dtype, NaN/inf — for every source, built-in or user-written),
fingerprints its bytes, computes its Gram products and closure once
(:class:`~tl_idempotence.analyses.base.LayerContext`) and runs every enabled analysis of
:func:`~tl_idempotence.analyses.registry.report_analyses` on it; the layer's weights are
then dropped, so memory is bounded by one layer.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from ..analyses.base import Analysis
from ..analyses.loop import LayerPart, concat_tables, iter_layers, run_layer
from ..analyses.registry import report_analyses
from ..analyses.report_options import ReportOptions, ReportOptionsArgs, documents_options
from ..core.files import check_work_folder, refuse_outputs_over_inputs
from ..core.heads import ModelInfo, source_info
from ..core.options import check_bool, resolve_layers
from ..core.selection import head_labels
from ..errors import OptionTypeError, ResumeError
from ..sources.dispatch import head_source, model_inputs
from .parts import ResumeDir
from .result import IdempotenceReport
from .store import add_q_values
from .summary import build_summary

if TYPE_CHECKING:  # pragma: no cover
    from typing_extensions import Unpack

    from ..core.hints import ArchitectureLike, ModelLike, PathLike

__all__ = [
    "REPORT_LEVEL_COLUMNS",
    "IdempotenceReport",
    "add_q_values",
    "assemble",
    "idempotence_report",
    "load_report",
    "report_with_options",
]

#: Measured cost of the constructive search per SmolLM2-135M layer (9 heads, d_head 64), one CPU thread
#: (``benchmarks/bench_costs.py``, README "What each analysis costs"); shown in the progress bar.
SEARCH_CPU_S_PER_LAYER = 1.4

#: Columns of :attr:`IdempotenceReport.heads` that depend on every measured head, not on one layer (derived by
#: :func:`add_q_values` after the per-layer rows; what the analyses' contract of layer independence leaves out).
REPORT_LEVEL_COLUMNS = ("q_value",)


def load_report(path: PathLike) -> IdempotenceReport:
    """A report saved with :meth:`IdempotenceReport.save`: the same tables, summary, figures and HTML.

    Raises:
        MissingFileError: no such folder, or a file its record lists is missing.
        ReportFileError (a ``ValueError``): a file that does not match its recorded sha256, a malformed
            record or another format (names the file); a summary that is impossible on its own
            (:meth:`ReportSummary.from_dict`'s rules) or that is not what the tables, the info and the options
            give (it is recomputed and compared exactly, floats bit for bit, never within a tolerance: names the
            field and both values); a ``closed``, ``kv_head`` or ``q_value`` column that is not, head by head, what
            P and the threshold, the kv map, or Benjamini-Hochberg of ``p_value`` give (names the column and the
            first head, ``L3H2``).
    """
    return IdempotenceReport.load(path)


@documents_options
def idempotence_report(
    model: ModelLike,
    *,
    progress: bool = True,
    resume: PathLike | None = None,
    architecture: ArchitectureLike | None = None,
    prefix: str | None = None,
    **options: Unpack[ReportOptionsArgs],
) -> IdempotenceReport:
    """Closure of every attention head of a model, with the paper's controls on request (SPEC 2-5, 7).

    Every argument is validated here, where it enters: the report options by
    :class:`~tl_idempotence.analyses.report_options.ReportOptions` (declared once, the same on every route), the others
    below.

    Args:
        model: a TransformerLens model (HookedTransformer, HookedEncoder,
            TransformerBridge), a ``transformers`` model, a path to a checkpoint
            directory or ``.gguf`` file, a zoo name, ``LayerHeads`` (one or a list) or a
            :class:`~tl_idempotence.core.heads.HeadSource` (how a string is read:
            :func:`~tl_idempotence.sources.dispatch.head_source`).
        progress: show a tqdm bar per layer on stderr.
        resume: a directory for per-layer parts (parquet + JSON), a ``str`` or ``os.PathLike``
            (not empty, not a file, its parent folder existing). Each finished layer is written
            there; a later call with the same directory and options reuses a layer's part only
            when that layer's weights have the same sha256 fingerprint (otherwise it is
            recomputed); other options refuse (``ResumeError``).
        architecture: for checkpoint directories / ``transformers`` models: force the architecture-table entry.
        prefix: for checkpoint directories / ``transformers`` models: force the tensor-name root.
        **options: the report options (REPORT_OPTIONS_DOC).

    Returns:
        :class:`IdempotenceReport`.

    Raises:
        UnknownOptionError: a misspelled keyword (names the closest valid ones).
        OptionTypeError / OptionError / DeviceError: a bad option (type, range, an unknown layer).
        UnsupportedModelError: unsupported model object.
        WeightError: NaN/inf, integer or mis-shaped weights (names layer and head).
        CheckpointError / MissingFileError: a checkpoint that cannot be read (names the file).
        ResumeError: a resume directory made with other options; ``resume`` empty, a file, or in a
            folder that does not exist (``resume`` not a path: OptionTypeError, before any folder is made).
        OutputOverInputError (an ``OptionError``): ``resume`` is the checkpoint folder or file, or the zoo cache.
    """
    opts = ReportOptions.from_kwargs("idempotence_report()", options, _OWN_PARAMETERS)
    return report_with_options(model, opts, progress=progress, resume=resume, architecture=architecture, prefix=prefix)


#: idempotence_report's own parameters (suggested, with the options, for a misspelled keyword).
_OWN_PARAMETERS = ("progress", "resume", "architecture", "prefix")


def report_with_options(
    model: ModelLike,
    options: ReportOptions,
    *,
    progress: bool = True,
    resume: PathLike | None = None,
    architecture: ArchitectureLike | None = None,
    prefix: str | None = None,
) -> IdempotenceReport:
    """:func:`idempotence_report` with options already validated (what comparisons, sweeps and
    trajectories call, so the options travel as one object).

    Args:
        model: as for :func:`idempotence_report`.
        options: the validated :class:`~tl_idempotence.analyses.report_options.ReportOptions`.
        progress, resume, architecture, prefix: as for :func:`idempotence_report`.

    Raises:
        The errors of :func:`idempotence_report`.
    """

    if not isinstance(options, ReportOptions):
        raise OptionTypeError(f"options must be a ReportOptions; got {type(options).__name__}.")
    opts = options
    progress = check_bool(progress, "progress")
    inputs = model_inputs(model)
    if resume is not None:
        check_work_folder(resume, "resume", ResumeError)  # not "", not a file, its parent existing: the CLI's rule
        refuse_outputs_over_inputs([("resume", resume)], inputs)  # parts never go into the checkpoint or the cache
    src = head_source(model, architecture=architecture, prefix=prefix)
    info = source_info(src)
    resolve_layers(opts.layers, list(src.layers()))  # an unknown layer is refused before the resume folder is made
    analyses = [a for a in report_analyses() if a.enabled(opts)]
    parts_dir = ResumeDir(resume, opts, info) if resume is not None else None
    desc = f"layers ({'+'.join(a.name for a in analyses)})"
    if opts.search:  # the one report option that takes minutes (README: "What each analysis costs")
        desc += f"; search ~{SEARCH_CPU_S_PER_LAYER:g} CPU-s/layer at SmolLM2 size"
    done: list[LayerPart] = []
    n_resumed = 0
    for work in iter_layers(src, info, opts, progress=progress, desc=desc):
        part = parts_dir.load(work.layer, work.fingerprint) if parts_dir is not None else None
        n_resumed += part is not None
        if part is None:
            part = run_layer(work.context(), analyses, work.fingerprint)
            if parts_dir is not None:
                parts_dir.save(part)
        del work
        done.append(part)
    rep = assemble(done, info, opts, analyses, model=model)
    read = [*inputs, *model_inputs(src)]
    if resume is not None:
        read.append(("the resume folder", Path(resume).expanduser()))
    rep = rep._evolve(inputs=tuple(dict.fromkeys((what, Path(p).expanduser().absolute()) for what, p in read)))
    if parts_dir is not None:
        rep = rep.with_summary(n_layers_resumed=n_resumed)
    return rep


def assemble(
    parts: Sequence[LayerPart], info: ModelInfo, options: ReportOptions, analyses: Sequence[Analysis], model: Any = None
) -> IdempotenceReport:
    """The report from finished layer parts (the end of the loop; also used by resumed and loaded reports)."""
    heads = add_q_values(pd.concat([p.heads for p in parts], ignore_index=True))
    heads.index = head_labels(heads["layer"], heads["head"])
    layers = pd.DataFrame([p.row for p in parts])
    tables = concat_tables(parts)
    summary = build_summary(heads, layers, tables, info, options, analyses)
    from ..sources.tl import is_tl_model

    return IdempotenceReport(
        heads=heads,
        layers=layers,
        tables=tables,
        summary=summary,
        info=info,
        options=options,
        model=model if is_tl_model(model) else None,
    )
