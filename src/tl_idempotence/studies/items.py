"""The items of a comparison or a sweep: what the user gives, labelled, opened and measured.

:func:`resolve_items` turns the user's items into labelled :class:`Item` records (a report, a saved report folder,
a checkpoint path, a zoo name, a model object or a zero-argument callable), :func:`open_item` opens one as a head
source (checkpoint files are streamed layer by layer; a zoo name is read from its cached checkpoint files, no
TransformerLens model is loaded), :func:`measure_item` makes its report and :func:`item_inputs` names what measuring
the items reads from disk. Shared by :func:`~tl_idempotence.studies.compare.compare` and
:mod:`tl_idempotence.studies.sweep` (both import them from :mod:`tl_idempotence.studies.compare`, too).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..analyses.report_options import ReportOptions
from ..core.heads import HeadSource, LayerHeads
from ..errors import ItemError, MissingFileError, OptionError, OptionTypeError, TLIError
from ..report.report import IdempotenceReport, report_with_options
from ..report.store import RECORD
from ..sources.checkpoint import CheckpointSource, is_transformers_model
from ..sources.dispatch import head_source
from ..sources.names import Named, missing_path_error, named_inputs, path_label, resolve_name
from ..sources.tl import TLModelSource, is_tl_model
from ..sources.zoo import known_models
from ..sources.zoo import source as zoo_source

__all__ = ["ITEM_KINDS", "Item", "item_inputs", "measure_item", "open_item", "parameter_count", "resolve_items"]

#: What an item can be: a report object, a saved report folder, a checkpoint path, a zoo name,
#: a model object (TransformerLens / transformers / HeadSource / LayerHeads) or a zero-argument callable.
ITEM_KINDS = ("report", "saved", "path", "zoo", "object", "callable")


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
        return str(value.summary.model_name or "report")
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
