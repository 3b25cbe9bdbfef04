"""The paper's cross-model table: many models measured with the same options, side by side.

:func:`compare` takes reports, or anything :func:`~tl_idempotence.report.report.idempotence_report`
accepts (a TransformerLens model, a checkpoint path, a zoo name, a saved report folder, ...),
measures the ones that are not reports yet with one validated set of options, and returns a
:class:`Comparison`: ``.table`` (one row per model, numbers only, and the paper's figures for
reference), ``.heads`` (every per-head row with a ``model`` column), ``.figure()`` and
``.save_html(path)`` (drawn by :mod:`tl_idempotence.views`).

What is compared is checked, never silently mixed:

* one set of options (threshold, nulls, seed, search, algebra, compute dtype, layers) for
  every model; a report made with other options is refused, naming it and the options;
* reports whose weights were processed differently (raw vs TransformerLens ``fold_ln`` /
  centring, SPEC 10) are flagged (``processing_differs``) and warned about;
* models with identical measured weights (the same ``weights_fingerprint``) are flagged
  (``identical_weights``, ``weights_group``) and warned about;
* labels are unique (a repeated label is refused).

Split by job: the items (what the user gives, labelled, opened and measured; shared with
:mod:`tl_idempotence.studies.sweep`) are :mod:`tl_idempotence.studies.items`, the table, its columns and its
headline are :mod:`tl_idempotence.studies.compare_table`; every public name of both is importable from here too.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import pandas as pd

from ..analyses.report_options import ReportOptions, ReportOptionsArgs, check_option_names, default, documents_options
from ..core.frozen import frozen
from ..core.options import check_bool, check_layers, strict_kwargs
from ..core.outputs import Output, write_output
from ..core.stored import StoredResult, StoreSpec, loads
from ..core.tables import ImmutableResult
from ..errors import OptionError
from ..report.identity import compared_options, option_differences, processing_key
from ..report.report import IdempotenceReport, load_report
from ..views.results import DrawnResult
from .compare_store import (
    COMPARISON_STORE,
    check_comparison,
    edited_comparison,
    read_comparison,
)
from .compare_table import (
    OVERVIEW_COLUMNS,
    PAPER_LABEL,
    PROCESSING_FLAGS,
    TABLE_COLUMNS,
    ComparisonHeadline,
    ModelCount,
    comparison_headline_of,
    comparison_table,
    table_columns,
)
from .items import ITEM_KINDS, Item, item_inputs, measure_item, open_item, parameter_count, resolve_items

if TYPE_CHECKING:  # pragma: no cover
    from collections.abc import Callable
    from typing import TypeAlias

    from typing_extensions import Unpack

    from ..core.hints import ModelLike, PathLike

    #: One item of :func:`compare`: a report, a saved report folder, a checkpoint path, a zoo name, a model object
    #: or a zero-argument callable returning a model, a source or a path.
    CompareItem: TypeAlias = IdempotenceReport | ModelLike | Callable[[], ModelLike]
    #: The items of :func:`compare`: one item, a sequence of items, or ``{label: item}``.
    CompareItems: TypeAlias = (
        CompareItem | Sequence[CompareItem] | Mapping[str, CompareItem] | Mapping[int, CompareItem]
    )

__all__ = [
    "ITEM_KINDS",
    "OVERVIEW_COLUMNS",
    "PAPER_LABEL",
    "PROCESSING_FLAGS",
    "TABLE_COLUMNS",
    "Comparison",
    "ComparisonHeadline",
    "Item",
    "ModelCount",
    "compare",
    "comparison_headline_of",
    "comparison_table",
    "item_inputs",
    "load_comparison",
    "measure_item",
    "open_item",
    "option_differences",
    "parameter_count",
    "processing_key",
    "resolve_items",
    "table_columns",
]


# --------------------------------------------------------------------------- options


def _shared_layers(reports: Mapping[str, IdempotenceReport]) -> list[int] | None:
    """The layers every report item was restricted to (None: all layers), when ``layers`` is not given.

    Raises:
        OptionError: report items measured on different layers (names each report and its layers).
    """
    seen = {label: None if rep.options.layers is None else sorted(rep.options.layers) for label, rep in reports.items()}
    distinct = {repr(v) for v in seen.values()}
    if len(distinct) > 1:
        detail = ", ".join(f"{lab}: {'all' if v is None else v}" for lab, v in seen.items())
        raise OptionError(
            f"The reports given were measured on different layers ({detail}): their fractions and medians are over "
            "different heads. Remake them on the same layers, or pass layers=... (reports made on other layers are "
            "then refused, naming them)."
        )
    return next(iter(seen.values()))


def _resolve_options(
    given: dict[str, Any], reports: dict[str, IdempotenceReport], layers: Any, device: Any
) -> ReportOptions:
    """Options: each one given, else the value every report item shares, else the report default."""
    chosen: dict[str, Any] = {}
    for name, value in given.items():
        if value is not None:
            chosen[name] = value
            continue
        seen = {label: rep.options[name] for label, rep in reports.items()}
        distinct = {str(v) for v in seen.values()}
        if len(distinct) > 1:
            detail = ", ".join(f"{lab}: {v}" for lab, v in seen.items())
            raise OptionError(
                f"The reports given were made with different {name} ({detail}); a comparison needs one value. "
                f"Pass {name}=... and remake the reports that differ."
            )
        if seen:
            chosen[name] = next(iter(seen.values()))
    return ReportOptions(**chosen, layers=layers, device=device)


# --------------------------------------------------------------------------- the comparison


def _combined_heads(reports: Mapping[str, IdempotenceReport]) -> pd.DataFrame:
    frames = []
    for label, rep in reports.items():
        h = rep.heads.reset_index(names="head_label") if rep.heads.index.name else rep.heads.reset_index(drop=True)
        h.insert(0, "model", label)
        frames.append(h)
    if not frames:
        return pd.DataFrame(columns=["model", "head_label", "layer", "head"])
    return pd.concat(frames, ignore_index=True)


class Comparison(
    StoredResult,
    ImmutableResult,
    DrawnResult,
    display_kind="comparison",
    repr_keys="n_models threshold most_closed max_pct_closed n_heads n_closed n_processing_differs n_identical_weights",
    frozen=("a comparison is", "tli.compare(...) or Comparison.from_reports(...) again"),
):
    """Result of :func:`compare`: many models measured with the same options. Immutable
    (:class:`~tl_idempotence.core.tables.ImmutableResult`): assigning an attribute raises
    ``dataclasses.FrozenInstanceError``, :attr:`table` and :attr:`heads` are copies made on each read,
    :attr:`reports` and :attr:`warnings` are read-only.

    Attributes:
        reports: ``{label: IdempotenceReport}`` in the order given.
        table: one row per model, then the paper's reference rows (``is_paper``). Numbers only
            besides ``model`` (the label) and ``model_name``:

            * sizes: ``n_params`` (every tensor of the checkpoint / parameter of the model, when
              known), ``n_layers``, ``n_attention_layers`` (measured), ``n_heads_per_layer``,
              ``n_kv_heads``, ``n_heads_total`` (measured), ``d_model``, ``d_head``;
            * closure: ``n_closed``, ``pct_closed`` (% of measured heads with P >= threshold),
              ``median_P``;
            * controls (``nulls``; NaN otherwise): ``median_P_scrambled`` (median over heads of each
              head's scramble median), ``pct_beats_scramble``, ``n_layers_trained_wins``,
              ``pct_layers_trained_wins``, ``n_mismatch_closed``, ``mismatch_P_max``;
            * search (``search``; NA otherwise): ``n_feasible_layers``, ``pct_layers_feasible``;
            * checks: ``raw_weights``, ``processing_differs`` (the weights' processing flags differ
              from the majority's: the rows are not comparable as they stand, SPEC 10),
              ``identical_weights`` (another row has the same ``weights_fingerprint``),
              ``weights_group`` (rows with identical weights share it).

            Paper rows: ``paper (low)`` and ``paper (high)`` hold the abstract's figures
            (:data:`tl_idempotence.core.paper.PAPER`); where the paper gives one figure
            (median P 0.336 trained and 1.04e-4 scrambled, 98.64 % beating the scramble — pooled
            over 7,304 heads; every layer; no mismatch pair closed) both rows hold it, where it gives
            a per-model range (3.98–8.00 % closed) the rows hold its ends.
        heads: every per-head row of every report with ``model`` (label) and ``head_label`` (``L10H8``) first.
        headline: the answer first (:class:`ComparisonHeadline`): which model has the largest share of closed
            heads, which the smallest, in one sentence; ``overview``: :attr:`table` in its ten headline columns.
            The notebook display shows the sentence, then the overview; ``table`` keeps every column.
        options: the :class:`~tl_idempotence.analyses.report_options.ReportOptions` every report shares.
        warnings: the warnings raised when the comparison was made (processing, identical weights).
        inputs: what its reports were read from on this machine (``(what, path)`` pairs, the union of every
            report's :attr:`~tl_idempotence.report.report.IdempotenceReport.inputs`): what :meth:`save_html`
            refuses to write over.

    :meth:`save` writes a folder (its reports, its table, one record); :meth:`load` reads it back, checked.
    """

    store: ClassVar[StoreSpec] = COMPARISON_STORE

    reports: Mapping[str, IdempotenceReport]
    options: ReportOptions
    inputs: tuple[tuple[str, Path], ...]
    table: pd.DataFrame
    heads: pd.DataFrame
    warnings: Sequence[str]

    def __init__(
        self,
        reports: Mapping[str, IdempotenceReport],
        options: ReportOptions,
        warn: bool = True,
    ) -> None:
        reps = dict(reports)
        self._freeze(
            reports=reps,
            options=options,
            inputs=tuple(dict.fromkeys(pair for rep in reps.values() for pair in rep.inputs)),
            table=comparison_table(reps),
            heads=_combined_heads(reps),
        )
        found: list[str] = []
        models = self.models_table
        differs = models.loc[models["processing_differs"].fillna(False).astype(bool), "model"].tolist()
        if differs:
            detail = "; ".join(
                f"{lab}: " + ", ".join(f"{k}={v}" for k, v in zip(PROCESSING_FLAGS, processing_key(rep.summary)))
                for lab, rep in self.reports.items()
            )
            found.append(
                f"Models {differs} were measured on weights processed differently from the others ({detail}); "
                "processing changes T and so P (SPEC 10): measure every model raw (or every model processed)."
            )
        ident = models[models["identical_weights"].fillna(False).astype(bool)]
        if len(ident):
            groups = ident.groupby("weights_group")["model"].apply(list).tolist()
            found.append(
                f"Models with identical measured weights (same weights_fingerprint): {groups}; they are one model "
                "counted more than once."
            )
        self._freeze(warnings=found)
        if warn:
            for w in found:
                warnings.warn(w, UserWarning, stacklevel=3)

    @classmethod
    def from_reports(
        cls, reports: Mapping[str, IdempotenceReport], options: ReportOptions | None = None, warn: bool = True
    ) -> Comparison:
        """A comparison of finished reports (e.g. loaded from a sweep folder), checking their options.

        Args:
            reports: ``{label: report}``.
            options: the options they must share (default: the first report's).
            warn: emit the processing / identical-weights warnings.

        Raises:
            OptionError: a report made with other options (names it and the options).
        """
        reps = dict(reports)
        if options is None:
            if not reps:
                raise OptionError("No reports to compare.")
            options = next(iter(reps.values())).options
        for label, rep in reps.items():
            diff = option_differences(rep.options, options)
            if diff:
                raise _options_error(label, diff)
        return cls(reps, options, warn=warn)

    @property
    def headline(self) -> ComparisonHeadline:
        """The answer first: which model has the largest share of closed heads and which the smallest, in one
        sentence (``str(cmp.headline)``) and as numbers (:class:`ComparisonHeadline`). The notebook display and
        the page lead with it, then :attr:`overview`."""
        return comparison_headline_of(self.models_table, self.threshold)

    @property
    def overview(self) -> pd.DataFrame:
        """:attr:`table` in ten columns (:data:`OVERVIEW_COLUMNS`: label, heads, closed, medians against the null,
        mismatch, feasibility, raw weights), paper rows included; columns of analyses that did not run (all
        NaN) are left out. What the notebook display and the CLI print; :attr:`table` has every column."""
        models = self.models_table
        cols = [c for c in OVERVIEW_COLUMNS if c == "model" or models[c].notna().any()]
        return self.table[cols]

    @property
    def models_table(self) -> pd.DataFrame:
        """:attr:`table` without the paper's rows."""
        table = self.table
        return table[~table["is_paper"].astype(bool)].reset_index(drop=True)

    @property
    def paper(self) -> pd.DataFrame:
        """The paper's reference rows of :attr:`table`."""
        table = self.table
        return table[table["is_paper"].astype(bool)].reset_index(drop=True)

    @property
    def threshold(self) -> float:
        """The P threshold every report shares."""
        return self.options.threshold

    @property
    def summary(self) -> dict[str, Any]:
        """``n_models, threshold, most_closed`` (the label of the model with the largest share of closed heads,
        the first on a tie, None without one: :attr:`headline`), ``nulls, n_heads, n_closed, min_pct_closed,
        max_pct_closed, n_processing_differs, n_identical_weights`` (read-only)."""
        m = self.models_table
        pct = m["pct_closed"].to_numpy(dtype=float)
        most = self.headline.most_closed
        return frozen(
            {
                "n_models": len(m),
                "threshold": self.threshold,
                "most_closed": most[0].model if most else None,
                "nulls": self.options.nulls,
                "n_heads": int(m["n_heads_total"].sum()) if len(m) else 0,
                "n_closed": int(m["n_closed"].sum()) if len(m) else 0,
                "min_pct_closed": float(np.min(pct)) if len(pct) else float("nan"),
                "max_pct_closed": float(np.max(pct)) if len(pct) else float("nan"),
                "n_processing_differs": int(m["processing_differs"].fillna(False).astype(bool).sum()),
                "n_identical_weights": int(m["identical_weights"].fillna(False).astype(bool).sum()),
            }
        )

    def figure(self) -> Any:
        """Per model: the distribution of trained P against the scramble null on one log axis (views)."""
        from ..views import comparison_figure

        return comparison_figure(self)

    @strict_kwargs
    def save_html(self, path: PathLike) -> str:
        """Write a standalone HTML page (plotly.js and the table code inlined, no CDN); returns the path.

        Raises:
            OutputOverInputError (an ``OptionError``): ``path`` is (or links to) a file the comparison was read
                from (:attr:`inputs`: a checkpoint's file, a saved report's file, a sweep's plan).
            OptionError: ``path`` is empty or a folder, its folder does not exist, or it cannot be written.
            OptionTypeError: ``path`` is not a path. UnknownOptionError: an unknown keyword.
        """
        return str(write_output(self._output(), path, ("html",)))

    @strict_kwargs
    def export(self, path: PathLike, overwrite: bool = False) -> str:
        """Write the comparison in the format the extension of ``path`` chooses (the output registry,
        :mod:`tl_idempotence.core.outputs`; docs/definitions.md "Output formats"): ``.html``/``.htm`` the page of
        :meth:`save_html`; ``.csv``/``.parquet`` :attr:`table` (the paper's rows included, ``is_paper``);
        ``.json`` ``{"summary": ..., "table": [one record per row]}`` (NaN as ``null``).

        Returns:
            The path written.

        Raises:
            OutputOverInputError (an ``OptionError``): ``path`` is (or links to) a file the comparison was read
                from (:attr:`inputs`).
            OptionError: another extension (names the known ones); empty, a folder, a missing folder, an existing
                file without ``overwrite=True``, or a file that cannot be written. OptionTypeError: ``path`` is not
                a path, ``overwrite`` is not a bool.
        """
        overwrite = check_bool(overwrite, "overwrite")
        return str(write_output(self._output(), path, replace_files=overwrite))

    def _output(self) -> Output:
        """What a comparison can be written as: its page, its JSON export and its table (no folder format)."""
        from ..views import comparison_html

        return Output(
            what="comparison",
            inputs=self.inputs,
            page=lambda: str(comparison_html(self)),
            record=lambda: {"summary": self.summary, "table": self.table.to_dict(orient="records")},
            table=lambda: self.table.reset_index(drop=True),
        )


def _options_error(label: str, diff: dict[str, tuple[Any, Any]]) -> OptionError:
    detail = ", ".join(f"{k}={have!r} (asked: {want!r})" for k, (have, want) in diff.items())
    hint = " rep.with_threshold(t) re-thresholds a report exactly." if set(diff) == {"threshold"} else ""
    return OptionError(
        f"Item {label!r} is a report made with other options: {detail}. A comparison uses one set of options for "
        f"every model: remake it with the options asked, or ask for its options.{hint}"
    )


@documents_options
def compare(
    items: CompareItems,
    *,
    progress: bool = True,
    **options: Unpack[ReportOptionsArgs],
) -> Comparison:
    """The paper's cross-model table: every item measured with the same options (SPEC 2-5).

    Args:
        items: one item, a list, or a dict ``{label: item}``. An item is an
            :class:`~tl_idempotence.report.report.IdempotenceReport`, a saved report folder
            (``rep.save(dir)``), a checkpoint directory or ``.gguf`` file (streamed layer by
            layer), a zoo name (``"smollm2-135m"``, or ``"zoo:NAME"`` when a local folder has
            the same name; read from the zoo's cached checkpoint files), a TransformerLens or
            ``transformers`` model, ``LayerHeads`` / a ``HeadSource``, or a zero-argument
            callable returning one of those (give it a label with a dict).
        progress: tqdm bar over the items that are measured.
        **options: the report options (REPORT_OPTIONS_DOC).

    The same options for every item. An option not given (or given as ``None``) is the value every report item
    shares, else its declared default; ``layers`` not given is the layers every report item was restricted to
    (report items measured on different layers are refused), else all layers. ``device`` is where new reports
    are computed and is not compared (results agree across devices to float64 rounding).

    Returns:
        :class:`Comparison` (``.table``, ``.heads``, ``.figure()``, ``.save_html(path)``).

    Raises:
        OptionError: no items, repeated labels, a report made with other options (names it and
            the options), report items that disagree on an option left to ``None`` (``layers``
            included), a bad option.
        OptionTypeError / UnknownOptionError / DeviceError: a bad option or item type.
        MissingFileError, UnknownModelError, CheckpointError, ZooError, WeightError: an item
            that cannot be read (each names it).

    Warns:
        UserWarning: models whose weights were processed differently, or are identical (both are
            flagged in the table).
    """
    from ..core.progress import progress_bar

    progress = check_bool(progress, "progress")
    check_option_names("compare()", options, ("items", "progress"))
    given = {k: options.get(k) for k in compared_options() if k != "layers"}  # None: shared by the reports, or default
    layers, device = options.get("layers"), options.get("device", default("device"))
    resolved = resolve_items(items)
    given_reports = {it.label: it.value for it in resolved if it.kind == "report"}
    for it in resolved:
        if it.kind == "saved":
            given_reports[it.label] = load_report(it.value)
    want_layers: Sequence[int] | None = check_layers(layers)
    if want_layers is None and given_reports:
        want_layers = _shared_layers(given_reports)
    opts = _resolve_options(given, given_reports, want_layers, device)
    for label, rep in given_reports.items():
        diff = option_differences(rep.options, opts)
        if diff:
            raise _options_error(label, diff)
    todo = [it for it in resolved if it.label not in given_reports]
    reports: dict[str, IdempotenceReport] = {}
    made: dict[str, IdempotenceReport] = {}
    bar = progress_bar(todo, desc="compare", unit="model", enabled=bool(progress and todo))
    for it in bar:
        bar.set_postfix_str(it.label)
        try:
            made[it.label] = measure_item(it, opts)
        except Exception as e:
            if hasattr(e, "add_note"):  # Python >= 3.11: the traceback says which item
                e.add_note(f"(while measuring compare item {it.label!r}: {it.describe()})")
            raise
    for it in resolved:
        reports[it.label] = given_reports[it.label] if it.label in given_reports else made[it.label]
    return Comparison(reports, opts)


@loads("comparison")
def load_comparison(path: PathLike) -> Comparison:
    """Read back what :meth:`Comparison.save` wrote (:mod:`tl_idempotence.studies.compare_store`): every digest
    checked, each report loaded and checked, the comparison rebuilt from them and the saved table and summary compared
    with the rebuilt ones.

    Args:
        path: the folder.

    Returns:
        The :class:`Comparison` (its reports' ``inputs`` their sub-folders; its ``save`` refuses to write over the
        folder).

    Raises:
        MissingFileError: no such folder, no ``comparison.json``, a listed table or report file missing (names it).
        ReportFileError: another format; an edited record (digest), table or report file (sha256), each named;
            labels, parts or options that are not a comparison's, reports made with other options than the saved
            ones, a table or summary that is not what the reports give (names the file and the field).
        OptionTypeError: ``path`` is not a path.
    """
    d, reports, options, fields = read_comparison(path)
    try:
        result = Comparison.from_reports(reports, options, warn=False)
    except OptionError as e:
        raise edited_comparison(d, f"its reports were not made with its options ({e})") from e
    check_comparison(d, fields, result)
    object.__setattr__(result, "loaded_from", str(d))  # set once by its loader (a frozen result allows it)
    return result
