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

The item model shared with :mod:`tl_idempotence.studies.sweep` lives here: :func:`resolve_items`
turns the user's items into labelled :class:`Item` records, :func:`open_item` opens one as a
head source (checkpoint files are streamed layer by layer; a zoo name is read from its cached
checkpoint files, no TransformerLens model is loaded).
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import pandas as pd

from ..analyses import registry
from ..core.heads import HeadSource, LayerHeads
from ..core.option_specs import ReportOptionsArgs, check_option_names, default, documents_options
from ..core.options import ReportOptions, check_bool, check_layers, strict_kwargs
from ..core.processing import T_PROCESSING
from ..core.results import Result, views
from ..errors import ItemError, MissingFileError, OptionError, OptionTypeError, TLIError
from ..report.identity import compared_options, option_differences, processing_key
from ..report.outputs import Output, write_output
from ..report.report import IdempotenceReport, load_report, report_with_options
from ..report.store import RECORD
from ..report.summary import PAPER, PAPER_THRESHOLD, field_rules
from ..sources.checkpoint import CheckpointSource, is_transformers_model
from ..sources.dispatch import head_source
from ..sources.names import Named, missing_path_error, named_inputs, path_label, resolve_name
from ..sources.tl import TLModelSource, is_tl_model
from ..sources.zoo import known_models
from ..sources.zoo import source as zoo_source

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
    "measure_item",
    "open_item",
    "option_differences",
    "parameter_count",
    "processing_key",
    "resolve_items",
    "table_columns",
]

#: What an item can be: a report object, a saved report folder, a checkpoint path, a zoo name,
#: a model object (TransformerLens / transformers / HeadSource / LayerHeads) or a zero-argument callable.
ITEM_KINDS = ("report", "saved", "path", "zoo", "object", "callable")
# COMPARED_OPTIONS (the options every compared report must share), option_differences and processing_key are
# the report-identity check's (report/identity.py), named here too.
#: The processing flags that change T (SPEC 10), compared between models:
#: :data:`~tl_idempotence.core.processing.T_PROCESSING` (the same flags a trajectory compares along its checkpoints).
PROCESSING_FLAGS = T_PROCESSING
#: ``model`` of the paper's reference rows.
PAPER_LABEL = "paper"
#: Columns of :attr:`Comparison.table`, in order.
TABLE_COLUMNS = [
    "model",
    "model_name",
    "is_paper",
    "n_params",
    "n_layers",
    "n_attention_layers",
    "n_heads_per_layer",
    "n_kv_heads",
    "n_heads_total",
    "d_model",
    "d_head",
    "n_closed",
    "pct_closed",
    "median_P",
    "median_P_scrambled",
    "pct_beats_scramble",
    "n_layers_trained_wins",
    "pct_layers_trained_wins",
    "n_mismatch_closed",
    "mismatch_P_max",
    "n_feasible_layers",
    "pct_layers_feasible",
    "raw_weights",
    "processing_differs",
    "identical_weights",
    "weights_group",
]


def table_columns() -> list[str]:
    """The columns of :attr:`Comparison.table`: :data:`TABLE_COLUMNS` (the paper's analyses), with every registered
    analysis's declared columns (:attr:`~tl_idempotence.analyses.spec.AnalysisSpec.compared`) before
    ``raw_weights`` (read from the registry at each call)."""
    extra = [c for spec in registry.ANALYSES for c in spec.compared if c not in TABLE_COLUMNS]
    at = TABLE_COLUMNS.index("raw_weights")
    return [*TABLE_COLUMNS[:at], *extra, *TABLE_COLUMNS[at:]]


#: The columns of :attr:`Comparison.overview`: what a researcher reads first (the full table has every column).
OVERVIEW_COLUMNS = [
    "model",
    "n_heads_total",
    "n_closed",
    "pct_closed",
    "median_P",
    "median_P_scrambled",
    "pct_beats_scramble",
    "n_mismatch_closed",
    "pct_layers_feasible",
    "raw_weights",
]
_INT_COLUMNS = (
    "n_params",
    "n_layers",
    "n_attention_layers",
    "n_heads_per_layer",
    "n_kv_heads",
    "n_heads_total",
    "d_model",
    "d_head",
    "n_closed",
    "n_layers_trained_wins",
    "n_mismatch_closed",
    "n_feasible_layers",
    "weights_group",
)
_BOOL_COLUMNS = ("is_paper", "raw_weights", "processing_differs", "identical_weights")


# --------------------------------------------------------------------------- items


@dataclass(frozen=True)
class Item:
    """One thing to compare or sweep, with its label.

    Attributes:
        label: the model's label in tables (unique within a comparison).
        kind: one of :data:`ITEM_KINDS`.
        value: the report, the ``Path``, the zoo name, the model object or the callable.
    """

    label: str
    kind: str
    value: Any

    def describe(self) -> str:
        """The item in words (for tables, errors and the sweep record)."""
        if self.kind in ("path", "saved"):
            return f"{self.kind} {self.value}"
        if self.kind == "zoo":
            return f"zoo model {self.value}"
        if self.kind == "callable":
            return f"callable {getattr(self.value, '__qualname__', type(self.value).__name__)}"
        return f"{self.kind} {type(self.value).__name__}"


def _classify_path(p: Path, given: Any) -> str:
    if not p.exists():
        raise MissingFileError(
            f"{str(given)!r} does not exist. Give an existing checkpoint directory or .gguf file, a saved report "
            f"folder, or a zoo model name ({', '.join(known_models())})."
        )
    if p.is_dir() and (p / RECORD).is_file() and not (p / "config.json").exists():
        return "saved"
    return "path"


def _classify(value: Any, where: str) -> tuple[str, Any]:
    """``(kind, value)`` of one item."""
    if isinstance(value, IdempotenceReport):
        return "report", value
    if isinstance(value, (str, os.PathLike)):
        named = resolve_name(value, where)  # the one rule (sources/names.py): ambiguous names are refused
        if named.kind == "zoo":
            return "zoo", named.value
        if named.kind == "unknown":
            raise missing_path_error(value, where)
        p = Path(named.value)
        return _classify_path(p, value), p
    if is_tl_model(value) or is_transformers_model(value) or isinstance(value, (HeadSource, LayerHeads)):
        return "object", value
    if isinstance(value, (list, tuple)) and value and all(isinstance(x, LayerHeads) for x in value):
        return "object", value
    if callable(value):
        return "callable", value
    raise OptionTypeError(
        f"{where}: cannot compare a {type(value).__name__}. Give a report, a TransformerLens or transformers model, "
        "a checkpoint path, a saved report folder, a zoo model name, LayerHeads, a HeadSource, or a zero-argument "
        "callable returning one of those."
    )


def _default_label(kind: str, value: Any, where: str) -> str:
    if kind == "report":
        return str(value.summary.get("model_name") or "report")
    if kind in ("path", "saved"):
        return path_label(Path(value))
    if kind == "zoo":
        return str(value)
    if kind == "object":
        for owner, attr in (("cfg", "model_name"), ("info", "model_name"), ("config", "_name_or_path")):
            name = getattr(getattr(value, owner, None), attr, None)
            if isinstance(name, str) and name:
                return name
        return type(value).__name__
    raise OptionError(
        f"{where} is a callable and has no name to show: give the items as a dict {{label: item}} to label it."
    )


def _check_label(label: Any, where: str) -> str:
    if isinstance(label, bool) or not isinstance(label, (str, int, np.integer)):
        raise OptionTypeError(f"{where}: a label must be a string (or an int); got {type(label).__name__}.")
    text = str(label).strip()
    if not text:
        raise OptionError(f"{where}: a label must not be empty.")
    return text


def item_inputs(items: Sequence[Item]) -> list[tuple[str, Path]]:
    """What measuring ``items`` reads from disk, as ``(what, path)`` pairs for
    :func:`~tl_idempotence.core.files.refuse_outputs_over_inputs`: each path item's checkpoint, each saved
    report's folder, the zoo cache for zoo items (model objects and callables: nothing known). Reads no file."""
    out: list[tuple[str, Path]] = []
    for it in items:
        if it.kind == "path":
            out += [(f"the checkpoint of item {it.label!r}", p) for _, p in named_inputs(Named("path", it.value))]
        elif it.kind == "saved":
            out.append((f"the saved report of item {it.label!r}", Path(it.value)))
        elif it.kind == "zoo":
            out += named_inputs(Named("zoo", it.value))
    return list(dict.fromkeys(out))


def resolve_items(items: Any, allowed: Sequence[str] = ITEM_KINDS, what: str = "compare") -> list[Item]:
    """Labelled :class:`Item` records from the user's items (order kept).

    Args:
        items: one item, a sequence of items, or a dict ``{label: item}``. An item is a report,
            a saved report folder, a checkpoint path (``str``/``Path``), a zoo name (or
            ``"zoo:NAME"``), a model object or a zero-argument callable (see :data:`ITEM_KINDS`).
        allowed: the kinds the caller accepts (a sweep runs items on workers: no objects).
        what: the caller's name, for messages.

    Returns:
        The items with labels: a dict's keys, else the report's model name, the folder name
        (or the file stem), the zoo name, the model's ``cfg.model_name``.

    Raises:
        OptionError: no items, a repeated or empty label, an unlabelled callable, an item kind the
            caller does not accept, a string that is both a zoo name and a local folder.
        OptionTypeError: an item of an unsupported type, a label that is not a string.
        MissingFileError: a path that does not exist. UnknownModelError: ``"zoo:NAME"`` with an unknown name.
    """
    if isinstance(items, Mapping):
        pairs: list[tuple[Any, Any]] = list(items.items())
        labelled = True
    else:
        if isinstance(items, (str, os.PathLike, IdempotenceReport)) or not isinstance(items, Sequence):
            items = [items]
        pairs = [(None, v) for v in items]
        labelled = False
    if not pairs:
        raise OptionError(f"{what}() got no items: give reports, models, checkpoint paths or zoo names.")
    out: list[Item] = []
    for i, (label, value) in enumerate(pairs):
        where = f"{what} item {label!r}" if labelled else f"{what} item {i}"
        kind, val = _classify(value, where)
        if kind not in allowed:
            raise OptionError(
                f"{where} is a {kind} ({type(value).__name__}); {what}() accepts {', '.join(allowed)} items."
                + (
                    " A sweep opens each item on a worker process: give a checkpoint path, a zoo name or a "
                    "zero-argument callable, not a loaded model (use tli.compare for models in memory)."
                    if kind in ("object", "report", "saved")
                    else ""
                )
            )
        text = _check_label(label, where) if labelled else _default_label(kind, val, where)
        out.append(Item(label=text, kind=kind, value=val))
    labels = [it.label for it in out]
    dup = sorted({lab for lab in labels if labels.count(lab) > 1})
    if dup:
        raise OptionError(
            f"{what}() got repeated labels {dup}: every model needs its own label. Give the items as a dict "
            "{label: item}."
        )
    return out


def open_item(item: Item) -> Any:
    """What :func:`~tl_idempotence.report.report.idempotence_report` is given for an item.

    A checkpoint path and a zoo name become a streaming head source over the checkpoint
    files (the zoo's cached fp32 directory, :func:`~tl_idempotence.sources.zoo.checkpoint_dir`);
    a callable is called (its result is opened the same way); a model object is returned as is.

    Raises:
        OptionError: a report or saved report (nothing to open), a callable returning a report.
        ItemError: the item's callable raised (names the item; its error is chained).
        The errors of :func:`~tl_idempotence.sources.dispatch.head_source` and of the zoo.
    """
    if item.kind in ("report", "saved"):
        raise OptionError(f"Item {item.label!r} is already a report; there is nothing to measure.")
    if item.kind == "path":
        return head_source(Path(item.value))
    if item.kind == "zoo":
        # The whole checkpoint (its headers give the parameter count), described as the zoo model.
        return zoo_source(str(item.value), progress=False, files="checkpoint")
    if item.kind == "callable":
        try:
            value = item.value()
        except TLIError:
            raise
        except Exception as e:
            raise ItemError(
                f"The callable of item {item.label!r} ({item.describe()}) raised {type(e).__name__}: {e}"
            ) from e
        if isinstance(value, IdempotenceReport):
            raise OptionError(f"The callable of item {item.label!r} returned a report; return a model or a path.")
        if isinstance(value, (str, os.PathLike)):
            kind, val = _classify(value, f"the result of item {item.label!r}")
            if kind in ("report", "saved"):
                raise OptionError(f"The callable of item {item.label!r} returned a saved report folder {val}.")
            return open_item(Item(item.label, kind, val))
        return value
    return item.value


def parameter_count(source: Any) -> int | None:
    """Parameters of what a source reads, if known: every tensor of a checkpoint (from the file
    headers, no data read) or every parameter of a TransformerLens model; else None."""
    if isinstance(source, CheckpointSource):
        store = source.store
        keys = list(store.keys())
        meta = store.meta(keys)
        return int(sum(math.prod(shape) for shape, _ in meta.values()))
    if isinstance(source, TLModelSource):
        source = source.model
    if is_tl_model(source) or is_transformers_model(source):
        return int(sum(p.numel() for p in source.parameters()))
    return None


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
        seen = {label: getattr(rep.options, name) for label, rep in reports.items()}
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


# --------------------------------------------------------------------------- the table


def _nan(x: Any) -> float:
    return float("nan") if x is None else float(x)


def _pct(n: Any, of: Any) -> float:
    return 100.0 * float(n) / float(of) if n is not None and of else float("nan")


def _model_row(label: str, rep: IdempotenceReport) -> dict[str, Any]:
    s = rep.summary
    closure, scramble, mismatch, search = s.closure, s.scramble, s.mismatch, s.search
    n_att = int(s.n_attention_layers)
    wins = None if scramble is None else scramble.n_layers_trained_wins
    feasible = None if search is None else search.n_feasible_layers
    row: dict[str, Any] = {
        "model": label,
        "model_name": str(s.model_name),
        "is_paper": False,
        "n_params": s.n_params,
        "n_layers": int(s.n_layers),
        "n_attention_layers": n_att,
        "n_heads_per_layer": int(s.n_heads_per_layer),
        "n_kv_heads": int(s.n_kv_heads),
        "n_heads_total": int(s.n_heads),
        "d_model": int(s.d_model),
        "d_head": int(s.d_head),
        "n_closed": int(closure.n_closed),
        "pct_closed": 100.0 * float(closure.frac_closed),
        "median_P": _nan(closure.median_P),
        "median_P_scrambled": _nan(None if scramble is None else scramble.median_P_scrambled),
        "pct_beats_scramble": 100.0 * _nan(None if scramble is None else scramble.frac_beats_scramble),
        "n_layers_trained_wins": wins,
        "pct_layers_trained_wins": _pct(wins, n_att),
        "n_mismatch_closed": None if mismatch is None else mismatch.n_mismatch_closed,
        "mismatch_P_max": _nan(None if mismatch is None else mismatch.mismatch_P_max),
        "n_feasible_layers": feasible,
        "pct_layers_feasible": _pct(feasible, n_att),
        "raw_weights": processing_key(s)[0],
    }
    for spec in registry.ANALYSES:  # the columns an analysis declares (spec.compared): None when it did not run
        record = s.analyses.get(spec.name)
        row.update({c: None if record is None else getattr(record, c) for c in spec.compared})
    return row


def _pct_exact(frac: float) -> float:
    """A fraction from the paper as a percentage without binary noise (0.0398 -> 3.98, not 3.9800000000000004)."""
    return round(100.0 * frac, 10)


def _paper_rows() -> list[dict[str, Any]]:
    rows = []
    for end, i in (("low", 0), ("high", 1)):
        rows.append(
            {
                "model": f"{PAPER_LABEL} ({end})",
                "model_name": "arXiv 2609.01129",
                "is_paper": True,
                "pct_closed": _pct_exact(PAPER["frac_closed"][i]),
                "median_P": PAPER["median_P_trained"][i],
                "median_P_scrambled": PAPER["median_P_scrambled"][i],
                "pct_beats_scramble": _pct_exact(PAPER["frac_beats_scramble"][i]),
                "pct_layers_trained_wins": _pct_exact(PAPER["frac_layers_trained_wins"][i]),
                "n_mismatch_closed": 0 if PAPER["mismatch_closed"][i] == 0 else None,
                "pct_layers_feasible": _pct_exact(PAPER["frac_layers_feasible"][i]),
            }
        )
    return rows


def comparison_table(reports: Mapping[str, IdempotenceReport], paper: bool = True) -> pd.DataFrame:
    """The cross-model table (see :attr:`Comparison.table` for the columns).

    Args:
        reports: ``{label: report}`` in display order.
        paper: append the paper's reference rows.
    """
    rows = [_model_row(label, rep) for label, rep in reports.items()]
    keys = [processing_key(rep.summary) for rep in reports.values()]
    if keys:
        counts = {k: keys.count(k) for k in keys}
        best = max(counts.values())
        majority = next(k for k in keys if counts[k] == best)  # ties: the first model's
        for row, k in zip(rows, keys):
            row["processing_differs"] = k != majority
    fps = [str(rep.summary.get("weights_fingerprint", "")) for rep in reports.values()]
    first: dict[str, int] = {}
    for row, fp in zip(rows, fps):
        group = first.setdefault(fp, len(first) + 1) if fp else None
        row["weights_group"] = group
        row["identical_weights"] = bool(fp) and fps.count(fp) > 1
    if paper:
        rows += _paper_rows()
    columns = table_columns()
    df = pd.DataFrame(rows, columns=columns)
    declared_ints = {c for c in columns if c not in TABLE_COLUMNS and field_rules().get(c) in ("count", "size")}
    for c in (*_INT_COLUMNS, *sorted(declared_ints)):
        df[c] = pd.array(
            [None if v is None or (isinstance(v, float) and math.isnan(v)) else int(v) for v in df[c]], dtype="Int64"
        )
    for c in _BOOL_COLUMNS:
        df[c] = pd.array(
            [None if v is None or (isinstance(v, float) and math.isnan(v)) else bool(v) for v in df[c]], dtype="boolean"
        )
    for c in columns:
        if (
            c not in _INT_COLUMNS
            and c not in declared_ints
            and c not in _BOOL_COLUMNS
            and c not in ("model", "model_name")
        ):
            df[c] = df[c].astype("float64")
    return df


@dataclass(frozen=True)
class ModelCount:
    """One model's closed heads: ``n_closed`` of ``n_heads`` measured heads, ``pct_closed`` percent of them."""

    model: str
    n_closed: int
    n_heads: int
    pct_closed: float

    def describe(self) -> str:
        """``"smollm2 (13 of 270, 4.81 %)"``."""
        return f"{self.model} ({self.n_closed} of {self.n_heads}, {self.pct_closed:.2f} %)"


@dataclass(frozen=True)
class ComparisonHeadline:
    """The answer of a comparison, first: which model has the largest share of closed heads, and which the smallest.

    Attributes:
        n_models: the models compared (the paper's rows not counted).
        threshold: the P threshold every model was measured at.
        most_closed: the model(s) with the largest ``pct_closed`` (several on a tie), in table order.
        fewest_closed: the model(s) with the smallest ``pct_closed`` (empty with fewer than two models, or when
            every model has the same share).
        no_heads: models with no measured head (no share; left out of both).
        paper_pct_closed: the paper's per-model range of closed heads, percent at P ≥ 0.9 (3.98, 8.00).
        sentence: the answer in one sentence (``str(headline)``).
    """

    n_models: int
    threshold: float
    most_closed: tuple[ModelCount, ...]
    fewest_closed: tuple[ModelCount, ...]
    no_heads: tuple[str, ...]
    paper_pct_closed: tuple[float, float]
    sentence: str

    def __str__(self) -> str:
        return self.sentence


def _names(counts: Sequence[ModelCount], limit: int = 3) -> str:
    """``"a (…)"``, ``"a (…) and b (…)"``, ``"a (…), b (…) and 4 more"``."""
    parts = [c.describe() for c in counts[:limit]]
    if len(counts) > limit:
        return ", ".join(parts) + f" and {len(counts) - limit} more"
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def comparison_headline_of(table: pd.DataFrame, threshold: float) -> ComparisonHeadline:
    """The :class:`ComparisonHeadline` of a comparison table (its rows without the paper's).

    Args:
        table: :attr:`Comparison.models_table` (columns ``model, n_closed, n_heads_total, pct_closed``).
        threshold: the P threshold the models were measured at.

    Returns:
        The headline; ties list every tied model (the sentence names three, then counts the rest).
    """
    counts = [
        ModelCount(str(r.model), int(r.n_closed), int(r.n_heads_total), float(r.pct_closed))
        for r in table.itertuples()
        if not pd.isna(r.n_heads_total) and int(r.n_heads_total) > 0 and math.isfinite(float(r.pct_closed))
    ]
    no_heads = tuple(str(m) for m in table["model"] if str(m) not in {c.model for c in counts})
    lo, hi = (_pct_exact(PAPER["frac_closed"][0]), _pct_exact(PAPER["frac_closed"][1]))
    paper = f"the paper, at P ≥ {PAPER_THRESHOLD:g}: {lo:.2f}–{hi:.2f} % per model"
    t = f"P ≥ {float(threshold):g}"
    most: tuple[ModelCount, ...] = ()
    fewest: tuple[ModelCount, ...] = ()
    if not counts:
        sentence = "No model finished." if not len(table) else f"No model has a measured head ({paper})."
    else:
        top = max(c.pct_closed for c in counts)
        low = min(c.pct_closed for c in counts)
        most = tuple(c for c in counts if c.pct_closed == top)
        if len(counts) == 1:
            c = counts[0]
            sentence = f"{c.model}: {c.n_closed} of {c.n_heads} heads are closed ({t}), {c.pct_closed:.2f} % ({paper})."
        elif top == low:
            sentence = f"Every model has the same share of closed heads ({t}): {_names(counts)} ({paper})."
        else:
            fewest = tuple(c for c in counts if c.pct_closed == low)
            verb = "has" if len(most) == 1 else "have"
            sentence = (
                f"{_names(most)} {verb} the largest share of closed heads ({t}); {_names(fewest)} the smallest "
                f"({paper})."
            )
        if no_heads:
            sentence += f" No measured head: {', '.join(no_heads)}."
    return ComparisonHeadline(
        n_models=len(table),
        threshold=float(threshold),
        most_closed=most,
        fewest_closed=fewest,
        no_heads=no_heads,
        paper_pct_closed=(lo, hi),
        sentence=sentence,
    )


def _combined_heads(reports: Mapping[str, IdempotenceReport]) -> pd.DataFrame:
    frames = []
    for label, rep in reports.items():
        h = rep.heads.reset_index(names="head_label") if rep.heads.index.name else rep.heads.reset_index(drop=True)
        h.insert(0, "model", label)
        frames.append(h)
    if not frames:
        return pd.DataFrame(columns=["model", "head_label", "layer", "head"])
    return pd.concat(frames, ignore_index=True)


class Comparison(Result):
    """Result of :func:`compare`: many models measured with the same options.

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
            (:data:`tl_idempotence.report.summary.PAPER`); where the paper gives one figure
            (median P 0.336 trained and 1.04e-4 scrambled, 98.64 % beating the scramble — pooled
            over 7,304 heads; every layer; no mismatch pair closed) both rows hold it, where it gives
            a per-model range (3.98–8.00 % closed) the rows hold its ends.
        heads: every per-head row of every report with ``model`` (label) and ``head_label`` (``L10H8``) first.
        headline: the answer first (:class:`ComparisonHeadline`): which model has the largest share of closed
            heads, which the smallest, in one sentence; ``overview``: :attr:`table` in its ten headline columns.
            The notebook display shows the sentence, then the overview; ``table`` keeps every column.
        options: the :class:`~tl_idempotence.core.options.ReportOptions` every report shares.
        warnings: the warnings raised when the comparison was made (processing, identical weights).
        inputs: what its reports were read from on this machine (``(what, path)`` pairs, the union of every
            report's :attr:`~tl_idempotence.report.report.IdempotenceReport.inputs`): what :meth:`save_html`
            refuses to write over.
    """

    display_kind: ClassVar[str] = "comparison"
    repr_keys: ClassVar[tuple[str, ...]] = (
        "n_models",
        "threshold",
        "most_closed",
        "max_pct_closed",
        "n_heads",
        "n_closed",
        "n_processing_differs",
        "n_identical_weights",
    )

    def __init__(
        self,
        reports: Mapping[str, IdempotenceReport],
        options: ReportOptions,
        warn: bool = True,
    ) -> None:
        self.reports: dict[str, IdempotenceReport] = dict(reports)
        self.options = options
        self.inputs: tuple[tuple[str, Path], ...] = tuple(
            dict.fromkeys(pair for rep in self.reports.values() for pair in rep.inputs)
        )
        self.table = comparison_table(self.reports)
        self.heads = _combined_heads(self.reports)
        self.warnings: list[str] = []
        models = self.models_table
        differs = models.loc[models["processing_differs"].fillna(False).astype(bool), "model"].tolist()
        if differs:
            detail = "; ".join(
                f"{lab}: " + ", ".join(f"{k}={v}" for k, v in zip(PROCESSING_FLAGS, processing_key(rep.summary)))
                for lab, rep in self.reports.items()
            )
            self.warnings.append(
                f"Models {differs} were measured on weights processed differently from the others ({detail}); "
                "processing changes T and so P (SPEC 10): measure every model raw (or every model processed)."
            )
        ident = models[models["identical_weights"].fillna(False).astype(bool)]
        if len(ident):
            groups = ident.groupby("weights_group")["model"].apply(list).tolist()
            self.warnings.append(
                f"Models with identical measured weights (same weights_fingerprint): {groups}; they are one model "
                "counted more than once."
            )
        if warn:
            for w in self.warnings:
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
        cols = [c for c in OVERVIEW_COLUMNS if c == "model" or self.models_table[c].notna().any()]
        return self.table[cols]

    @property
    def models_table(self) -> pd.DataFrame:
        """:attr:`table` without the paper's rows."""
        return self.table[~self.table["is_paper"].astype(bool)].reset_index(drop=True)

    @property
    def paper(self) -> pd.DataFrame:
        """The paper's reference rows of :attr:`table`."""
        return self.table[self.table["is_paper"].astype(bool)].reset_index(drop=True)

    @property
    def threshold(self) -> float:
        """The P threshold every report shares."""
        return self.options.threshold

    @property
    def summary(self) -> dict[str, Any]:
        """``n_models, threshold, most_closed`` (the label of the model with the largest share of closed heads,
        the first on a tie, None without one: :attr:`headline`), ``nulls, n_heads, n_closed, min_pct_closed,
        max_pct_closed, n_processing_differs, n_identical_weights``."""
        m = self.models_table
        pct = m["pct_closed"].to_numpy(dtype=float)
        most = self.headline.most_closed
        return {
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

    def figure(self) -> Any:
        """Per model: the distribution of trained P against the scramble null on one log axis (views)."""
        return views().comparison_figure(self)

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
        :mod:`tl_idempotence.report.outputs`; docs/definitions.md "Output formats"): ``.html``/``.htm`` the page of
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
        return Output(
            what="comparison",
            inputs=self.inputs,
            page=lambda: str(views().comparison_html(self)),
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


def measure_item(
    item: Item,
    options: ReportOptions,
    resume: str | os.PathLike[str] | None = None,
    source: Any = None,
) -> IdempotenceReport:
    """The report of one item with ``options`` (its summary gets ``n_params`` when the source knows it).

    Args:
        item: the item.
        options: the validated report options.
        resume: a resume directory for the report's per-layer parts (see ``idempotence_report``).
        source: what :func:`open_item` returned for ``item`` already (not opened again), or None.

    Raises:
        The errors of :func:`open_item` and :func:`~tl_idempotence.report.report.idempotence_report`.
    """
    src = open_item(item) if source is None else source
    rep = report_with_options(src, options, progress=False, resume=resume)
    try:
        n = parameter_count(src)
    except (TLIError, OSError):  # informational: n_params stays unknown (NA) when the headers cannot be read
        n = None
    if n is not None:
        rep = rep.with_summary(n_params=n)
    return rep


def __getattr__(name: str) -> Any:
    """:data:`COMPARED_OPTIONS` (:func:`~tl_idempotence.report.identity.compared_options`, named here too)."""
    if name == "COMPARED_OPTIONS":
        return compared_options()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
