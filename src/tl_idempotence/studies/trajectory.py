"""Closure of every head across training checkpoints (SPEC section 6).

:func:`trajectory` runs :func:`~tl_idempotence.report.report.idempotence_report` on an
ordered list of checkpoints — loading ONE checkpoint at a time, measuring it, dropping it
and collecting garbage before the next is loaded, so memory is bounded by one checkpoint —
and returns a long table (one row per checkpoint x head) plus figures that track the
heads closed at the end back through training, next to their layer's feasible P (the
constructive search's capacity, SPEC 5) and their orientation-scramble null (SPEC 4b).
That is what separates "capacity was available early" (feasible P high from the start)
from "orientation was attained late" (P rises towards it only later).

A checkpoint can be given as

* a TransformerLens model (or any object ``idempotence_report`` accepts) — already
  resident, so it is not loaded or dropped by this function;
* a path to a checkpoint directory / ``.safetensors`` / ``.gguf`` file (read layer by
  layer by :mod:`tl_idempotence.sources.checkpoint`);
* ``(model_name, {"checkpoint_index": i})`` or ``{"checkpoint_value": v}`` —
  TransformerLens's published-lineage route (Pythia, ...) through
  ``TransformerBridge.boot_transformers``; this one needs the Hugging Face hub;
* a zero-argument callable returning a model (your own loader).

What goes into a trajectory is checked: every checkpoint's attention weights are
fingerprinted layer by layer (sha256), so checkpoints that are byte-identical, or that
share some layers with another checkpoint (a shard copied between releases), are marked in
``checkpoints`` (``identical_to``, ``shares_layers_with``) and in the figures, with a
warning; checkpoints whose weights were processed differently (raw vs ``fold_ln``) are
refused unless ``allow_mixed_processing=True`` (then marked and warned about).

Results are cached per checkpoint (``cache_dir``) as resume parts of the report
(:mod:`tl_idempotence.report.parts`): keyed on each layer's weight fingerprint and the
options, so a cached layer is reused only when its weights are byte for byte the same.
"""

from __future__ import annotations

import gc
import math
import numbers
import os
import re
import time
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import pandas as pd

from ..analyses.report_options import ReportOptions, ReportOptionsArgs, documents_options
from ..core.frozen import frozen
from ..core.heads import HeadSource, LayerHeads
from ..core.options import check_bool, check_int, strict_kwargs
from ..core.processing import T_PROCESSING
from ..core.stored import StoredResult, StoreSpec, loads
from ..core.tables import ImmutableResult
from ..errors import MissingFileError, OptionError, OptionTypeError
from ..report.identity import recorded_flags
from ..report.report import report_with_options
from ..sources.dispatch import head_source
from ..sources.lineage import Lineage, lineage_checkpoints
from ..sources.tl import bridge_from_dir, is_tl_model
from ..views.results import DrawnResult
from .cluster import cache_name, check_cluster_trajectory, run_trajectory_on_cluster
from .trajectory_store import (
    TRAJECTORY_STORE,
    check_trajectory_summary,
    checkpoint_relations,
    read_trajectory,
)

if TYPE_CHECKING:  # pragma: no cover
    from typing import TypeAlias

    from typing_extensions import Unpack

    from ..core.hints import ClientLike, HeadPairs, IntLike, ModelLike, PathLike, RealLike

    #: One checkpoint: a model or source, a path, ``(model_name, {"checkpoint_index": i})`` (or
    #: ``{"checkpoint_value": v}``), or a zero-argument callable returning a model.
    CheckpointSpec: TypeAlias = ModelLike | tuple[str, dict[str, Any]] | Callable[[], ModelLike]
    #: Ordered checkpoints: ``[(label, spec)]`` / ``[(label, spec, step)]`` (tuples or lists), ``{label: spec}``,
    #: a lineage directory or a :class:`~tl_idempotence.sources.lineage.Lineage`.
    CheckpointsLike: TypeAlias = (
        PathLike
        | Lineage
        | Sequence[tuple[str | int, CheckpointSpec] | tuple[str | int, CheckpointSpec, RealLike] | list[Any]]
        | Mapping[str, CheckpointSpec]
        | Mapping[int, CheckpointSpec]
    )

__all__ = ["STEP_SOURCES", "Trajectory", "cache_name", "checkpoint_relations", "load_trajectory", "trajectory"]

_HUB_KEYS = {"checkpoint_index", "checkpoint_value", "revision"}
#: The processing flags that must agree along a trajectory (they change T; SPEC 10):
#: :data:`~tl_idempotence.core.processing.T_PROCESSING`.
PROCESSING_FLAGS = T_PROCESSING


#: Where a checkpoint's ``step`` came from (``Trajectory.checkpoints.step_source``): given in a
#: ``(label, spec, step)`` triple, the hub spec's ``checkpoint_value``, the ``global_step`` of a
#: Hugging Face ``trainer_state.json`` in the checkpoint folder, a lineage's ``lineage.json``
#: manifest, the label (``step1000``, ``checkpoint-500``, an integer), or "" (unknown: NaN).
STEP_SOURCES = ("given", "checkpoint_value", "trainer_state.json", "lineage manifest", "label", "")
#: Labels whose number is a training step: an integer, or ending in step/ckpt/checkpoint/iter + digits.
_STEP_LABEL = re.compile(r"(?:^|[^A-Za-z0-9])(?:step|ckpt|checkpoint|iter|iteration)[_-]?(\d+)$", re.IGNORECASE)


@dataclass
class _Ckpt:
    order: int
    label: str
    spec: Any
    kind: str  # "object" | "path" | "hub" | "callable"
    step: float
    step_source: str = ""


def _is_module(x: Any) -> bool:
    import torch

    return isinstance(x, torch.nn.Module)


def _is_model_object(x: Any) -> bool:
    return is_tl_model(x) or isinstance(x, (HeadSource, LayerHeads)) or _is_module(x)


def _kind(label: str, spec: Any) -> str:
    if isinstance(spec, (str, os.PathLike)):
        p = Path(spec).expanduser()
        if not p.exists():
            raise MissingFileError(
                f"Checkpoint {label!r}: {str(spec)!r} does not exist. Pass an existing checkpoint directory or file "
                "(nothing is downloaded for paths)."
            )
        return "path"
    if _is_model_object(spec):
        return "object"
    if isinstance(spec, tuple) and len(spec) == 2 and isinstance(spec[0], str) and isinstance(spec[1], dict):
        bad = set(spec[1]) - _HUB_KEYS
        if bad or not spec[1]:
            raise OptionError(
                f"Checkpoint {label!r}: a (model_name, options) checkpoint takes options from {sorted(_HUB_KEYS)}, "
                f"e.g. ('EleutherAI/pythia-70m', {{'checkpoint_index': 3}}); got {spec[1]!r}."
            )
        return "hub"
    if callable(spec):
        return "callable"
    raise OptionTypeError(
        f"Checkpoint {label!r}: cannot load a {type(spec).__name__}. Give a TransformerLens model, a path to a "
        "checkpoint directory/file, (model_name, {'checkpoint_index': i}), or a zero-argument callable returning "
        "a model."
    )


def _label_step(label: Any) -> float | None:
    """The step a label names: an integer label, or one ending in ``step``/``ckpt``/``checkpoint``/``iter``
    and digits (``"step1000"``, ``"ckpt_step20"``, ``"checkpoint-500"``); None otherwise (``"pythia-70m"``
    names no step: its 70 is a size)."""
    if isinstance(label, (int, np.integer)) and not isinstance(label, bool):
        return float(label)
    text = str(label).strip()
    if text.isdigit():
        return float(text)
    m = _STEP_LABEL.search(text)
    return float(m.group(1)) if m else None


def _recorded_step(label: str, spec: Any) -> tuple[float | None, str]:
    """The step the checkpoint itself records: a hub spec's ``checkpoint_value``, or the ``global_step`` of
    the ``trainer_state.json`` that Hugging Face's Trainer writes into a checkpoint folder.

    Raises:
        OptionTypeError: a ``checkpoint_value`` that is not a number. CheckpointError: an unreadable
            ``trainer_state.json`` or one whose ``global_step`` is not a non-negative integer (names the file).
    """
    from ..core.files import read_json
    from ..errors import CheckpointError

    if isinstance(spec, tuple) and len(spec) == 2 and isinstance(spec[1], dict) and "checkpoint_value" in spec[1]:
        v = spec[1]["checkpoint_value"]
        if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(float(v)):
            raise OptionTypeError(f"Checkpoint {label!r}: checkpoint_value must be a finite number; got {v!r:.40}.")
        return float(v), "checkpoint_value"
    if isinstance(spec, (str, os.PathLike)):
        state = Path(spec).expanduser() / "trainer_state.json"
        if state.is_file():
            rec = read_json(state, CheckpointError, "trainer state")
            g = rec.get("global_step") if isinstance(rec, dict) else None
            if isinstance(g, bool) or not isinstance(g, int) or g < 0:
                raise CheckpointError(f"{state}: global_step must be a non-negative integer; got {g!r:.40}.")
            return float(g), "trainer_state.json"
    return None, ""


def _resolve_step(where: str, label: Any, spec: Any, given: float | None, given_source: str) -> tuple[float, str]:
    """``(step, step_source)`` of one checkpoint: what it records, else what was given, else its label.

    Raises:
        OptionError: a given step or a label's step that disagrees with the step the checkpoint records.
    """
    recorded, source = _recorded_step(str(label), spec)
    claimed, how = (given, given_source) if given is not None else (_label_step(label), "label")
    if recorded is not None and claimed is not None and claimed != recorded:
        said = (
            f"the label {label!r} names step {claimed:g}"
            if how == "label"
            else f"step {claimed:g} was given for {label!r} ({how})"
        )
        raise OptionError(
            f"{where}: {said} but the checkpoint records step {recorded:g} ({source}); relabel it, or give "
            "(label, spec, step) with the right step."
        )
    if claimed is not None and (given is not None or recorded is None):
        return claimed, how
    return (recorded, source) if recorded is not None else (float("nan"), "")


def _normalize(checkpoints: Any) -> list[_Ckpt]:
    manifest = False  # the steps come from a lineage's manifest (lineage.json), not from folder names
    if isinstance(checkpoints, Lineage):
        steps = checkpoints.steps
        if len(steps) == len(checkpoints.checkpoints):
            checkpoints = [(lab, p, s) for (lab, p), s in zip(checkpoints.checkpoints, steps)]
            manifest = True
        else:
            checkpoints = checkpoints.checkpoints
    elif isinstance(checkpoints, (str, os.PathLike)):
        root = Path(checkpoints).expanduser()
        manifest = (root / "lineage.json").is_file()
        checkpoints = lineage_checkpoints(checkpoints)
        if manifest:  # lineage_checkpoints labels each "step{N}" with N from the manifest's saved_steps
            checkpoints = [(lab, p, int(lab.removeprefix("step"))) for lab, p in checkpoints]
    if isinstance(checkpoints, dict):
        checkpoints = list(checkpoints.items())
    if not isinstance(checkpoints, Sequence) or isinstance(checkpoints, (str, bytes)):
        raise OptionTypeError(
            "checkpoints must be an ordered sequence of (label, model-or-path) pairs (or (label, spec, step) triples), "
            f"a lineage directory or a Lineage; got {type(checkpoints).__name__}."
        )
    if len(checkpoints) == 0:
        raise OptionError("checkpoints is empty: give at least one (label, model-or-path) pair.")
    out: list[_Ckpt] = []
    for i, entry in enumerate(checkpoints):
        if not isinstance(entry, (tuple, list)) or len(entry) not in (2, 3):
            raise OptionTypeError(
                f"checkpoints[{i}] must be a (label, model-or-path) pair or (label, spec, step) triple; "
                f"got {entry!r:.80}."
            )
        label, spec = entry[0], entry[1]
        given: float | None = None
        if len(entry) == 3:
            st = entry[2]
            if isinstance(st, bool) or not isinstance(st, numbers.Real) or not math.isfinite(float(st)):
                raise OptionTypeError(
                    f"checkpoints[{i}]: the step (third item) must be a finite number; got {type(st).__name__} "
                    f"{st!r:.40}."
                )
            given = float(st)
        kind = _kind(str(label), spec)
        step, source = _resolve_step(
            f"checkpoints[{i}]", label, spec, given, "lineage manifest" if manifest else "given"
        )
        out.append(_Ckpt(order=i, label=str(label), spec=spec, kind=kind, step=step, step_source=source))
    labels = [c.label for c in out]
    dup = sorted({lab for lab in labels if labels.count(lab) > 1})
    if dup:
        raise OptionError(f"Checkpoint labels must be unique; repeated: {dup}.")
    return out


def _head_pairs(heads: Any) -> list[tuple[int, int]]:
    """Sorted distinct ``(layer, head)`` pairs of non-negative integers (floats are refused, never truncated)."""
    if isinstance(heads, (str, bytes)) or not isinstance(heads, Iterable):
        raise OptionTypeError(
            f"heads must be a sequence of (layer, head) integer pairs; got {type(heads).__name__} {heads!r:.80}."
        )
    out: set[tuple[int, int]] = set()
    for i, item in enumerate(heads):
        if isinstance(item, (str, bytes)) or not isinstance(item, (tuple, list)) or len(item) != 2:
            raise OptionTypeError(f"heads[{i}] must be a (layer, head) pair of integers; got {item!r:.60}.")
        out.add((check_int(item[0], f"heads[{i}] layer", 0), check_int(item[1], f"heads[{i}] head", 0)))
    if not out:
        raise OptionError("heads is empty; pass None for all heads.")
    return sorted(out)


def _load_hub(name: str, options: dict[str, Any]) -> Any:
    """``TransformerBridge.boot_transformers(name, checkpoint_index=...)`` with a clear offline error."""
    from transformer_lens.model_bridge import TransformerBridge

    try:
        return TransformerBridge.boot_transformers(name, device="cpu", **options)
    except OSError as e:
        offline = any(
            os.environ.get(v, "").strip().lower() in ("1", "true", "yes")
            for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
        )
        raise OSError(
            f"Could not load {name!r} with {options}: published training checkpoints are downloaded from the "
            "Hugging Face "
            f"hub{' and HF_HUB_OFFLINE/TRANSFORMERS_OFFLINE is set' if offline else ' and it could not be reached'}. "
            "Download the checkpoints once (e.g. huggingface_hub.snapshot_download(name, revision='step1000')) "
            "and pass "
            f"their local directories instead. Original error: {e}"
        ) from e


@dataclass(repr=False)
class Trajectory(
    StoredResult,
    ImmutableResult,
    DrawnResult,
    repr_keys="n_checkpoints first final n_closed_final n_identical n_mixed",
    frozen=("a trajectory is", "tli.trajectory(...) again, dataclasses.replace(...) for a changed copy"),
):
    """Result of :func:`trajectory`. Immutable (:class:`~tl_idempotence.core.tables.ImmutableResult`): assigning a
    field raises ``dataclasses.FrozenInstanceError``, its tables are copies made on each read (take one once in a
    loop), :attr:`options` is read-only.

    Attributes:
        heads: long table, one row per (checkpoint, layer, head): ``checkpoint`` (label),
            ``order`` (position in the input), ``step`` (training step: what the checkpoint
            records, else the step given, else the step its label names; NaN if unknown; see
            ``checkpoints.step_source``), then every column of the report's ``heads`` table
            (``layer, head, kv_head, alpha, P, closed, ...``; with ``nulls`` the scramble
            columns incl. ``P_scrambled_median``) and, with ``search``, ``feasible_P``
            (the head's layer's feasible P) and ``layer_feasible_P``.
        layers: one row per (checkpoint, layer) with the report's ``layers`` columns
            (incl. the layer's weight ``fingerprint``).
        checkpoints: one row per checkpoint: ``order, checkpoint, step, step_source`` (where the
            step came from, one of :data:`STEP_SOURCES`), ``kind, cached`` (every layer came from
            the cache), ``seconds`` (wall time in seconds to load and measure), ``n_heads``,
            ``threshold`` (the P threshold ``n_closed`` counts against), ``n_closed`` (heads with
            P >= threshold), ``median_P`` (median P over the checkpoint's heads; and
            ``median_P_scrambled``, the median of the heads' scramble medians, with nulls),
            ``weights_fingerprint``, ``identical_to``, ``shares_layers_with``,
            ``n_shared_layers`` (see :func:`checkpoint_relations`), the processing flags
            (``processing_raw``, ``processing_fold_ln``, ...) and ``processing_differs`` (the flags
            on which this checkpoint's weights were processed differently from the first
            checkpoint's, "" when none; only with ``allow_mixed_processing=True``).
        threshold: P threshold of "closed" (paper: 0.9).
        options: the analysis options (nulls, seed, search, layers, heads).

    :meth:`save` writes a folder (the three tables and one record); :meth:`load` reads it back, checked.
    """

    store: ClassVar[StoreSpec] = TRAJECTORY_STORE

    heads: pd.DataFrame
    layers: pd.DataFrame
    checkpoints: pd.DataFrame
    threshold: float
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def summary(self) -> dict[str, Any]:
        """``n_checkpoints, first, final, n_closed_final, n_identical, n_mixed, threshold`` (read-only)."""
        ck = self.checkpoints.sort_values("order")
        return frozen(
            {
                "n_checkpoints": len(ck),
                "first": str(ck["checkpoint"].iloc[0]),
                "final": self.final_label,
                "n_closed_final": int(ck["n_closed"].iloc[-1]),
                "n_identical": int((ck["identical_to"].astype(str) != "").sum()) if "identical_to" in ck else 0,
                "n_mixed": int((ck["shares_layers_with"].astype(str) != "").sum()) if "shares_layers_with" in ck else 0,
                "threshold": self.threshold,
            }
        )

    @property
    def final_label(self) -> str:
        """Label of the last checkpoint (the one "final-closed" refers to)."""
        return str(self.checkpoints.sort_values("order")["checkpoint"].iloc[-1])

    def final(self) -> pd.DataFrame:
        """Rows of :attr:`heads` at the last checkpoint."""
        heads = self.heads
        return heads[heads["checkpoint"] == self.final_label]

    @strict_kwargs
    def tracked_heads(self, top_k: IntLike = 5) -> pd.DataFrame:
        """The heads the figures follow: ``layer, head, final_P, why``.

        The heads with final ``P >= threshold`` (``why = "final P >= threshold"``), or —
        if none closed — the ``top_k`` heads by final P (``why = "top-k by final P (none closed)"``).
        When ``heads=`` was given to :func:`trajectory`, exactly those heads.
        """
        top_k = check_int(top_k, "top_k", 1)
        fin = self.final().dropna(subset=["P"]).sort_values("P", ascending=False)
        if self.options.get("heads"):
            sel, why = fin, "selected"
        else:
            closed = fin[fin["P"] >= self.threshold]
            sel, why = (
                (closed, "final P >= threshold") if len(closed) else (fin.head(top_k), "top-k by final P (none closed)")
            )
        out = sel[["layer", "head", "P"]].rename(columns={"P": "final_P"}).reset_index(drop=True)
        out["why"] = why
        return out

    @strict_kwargs
    def wide(self, value: str = "P") -> pd.DataFrame:
        """``value`` as a (layer, head) x checkpoint table, checkpoints in input order.

        Raises:
            OptionError: ``value`` is not a numeric column of :attr:`heads`.
        """
        heads = self.heads
        if not isinstance(value, str) or value not in heads.columns or heads[value].dtype.kind not in "biuf":
            raise OptionError(
                f"value={value!r} is not a numeric column of the trajectory's heads table; columns: "
                f"{[c for c in heads.columns if heads[c].dtype.kind in 'biuf']}."
            )
        order = self.checkpoints.sort_values("order")["checkpoint"].tolist()
        w = heads.pivot_table(index=["layer", "head"], columns="checkpoint", values=value, sort=False)
        return w[[c for c in order if c in w.columns]]

    def x_axis(self) -> tuple[str, str]:
        """``(column, title)`` of the figures' x axis: the training step when every checkpoint has one."""
        return ("step", "training step") if self.heads["step"].notna().all() else ("order", "checkpoint")

    @strict_kwargs
    def figure(self, top_k: IntLike = 5, log_y: bool = True) -> Any:
        """P over training for the tracked heads (:meth:`tracked_heads`), one panel per layer (drawn by views).

        Args:
            top_k (int): heads to follow when none closed (>= 1).
            log_y (bool): log P axis.

        Raises:
            OptionError / OptionTypeError / UnknownOptionError: a bad ``top_k`` or ``log_y``, an unknown keyword.
        """
        top_k = check_int(top_k, "top_k", 1)
        from ..views import trajectory_figure

        return trajectory_figure(self, top_k=top_k, log_y=check_bool(log_y, "log_y"))

    @strict_kwargs
    def summary_figure(self, log_y: bool = True) -> Any:
        """Per checkpoint: median P over all heads, fraction closed, (nulls) median scrambled P.

        Raises:
            OptionTypeError / UnknownOptionError: ``log_y`` not a bool, an unknown keyword.
        """
        from ..views import trajectory_summary_figure

        return trajectory_summary_figure(self, log_y=check_bool(log_y, "log_y"))

    @strict_kwargs
    def figures(self, top_k: IntLike = 5) -> list[Any]:
        """``[figure(), summary_figure()]``."""
        return [self.figure(top_k=top_k), self.summary_figure()]


def _load(c: _Ckpt, loader: Callable[[Any], Any] | None) -> Any:
    if c.kind == "callable":
        return c.spec()
    if c.kind == "hub":
        return loader(c.spec) if loader is not None else _load_hub(*c.spec)
    if c.kind == "path":
        if loader is not None:
            return loader(c.spec)
        try:
            return head_source(c.spec)  # streams the file layer by layer
        except OptionTypeError:  # pragma: no cover - no file source for this path: boot it with TransformerBridge
            return bridge_from_dir(c.spec)
    return c.spec


#: trajectory's own parameters (suggested, with the options, for a misspelled keyword).
_OWN_PARAMETERS = ("checkpoints", "heads", "cache_dir", "loader", "allow_mixed_processing", "progress", "client")


@documents_options
def trajectory(
    checkpoints: CheckpointsLike,
    heads: HeadPairs | None = None,
    *,
    cache_dir: PathLike | None = None,
    loader: Callable[[Any], Any] | None = None,
    allow_mixed_processing: bool = False,
    progress: bool = True,
    client: ClientLike | None = None,
    **options: Unpack[ReportOptionsArgs],
) -> Trajectory:
    """Per-head closure across an ordered list of training checkpoints (SPEC section 6).

    Each checkpoint is loaded, measured with :func:`~tl_idempotence.report.report.idempotence_report`
    (same options for all), and dropped (``del``, and :func:`gc.collect` for a loaded
    ``nn.Module``) before the next one is loaded: at most one checkpoint loaded by this
    function is resident at a time.

    Args:
        checkpoints: ordered ``[(label, spec)]`` or ``[(label, spec, step)]`` where ``spec``
            is a TransformerLens model, a path (checkpoint directory, ``.safetensors``,
            ``.gguf``), ``(model_name, {"checkpoint_index": i})`` /
            ``{"checkpoint_value": v}`` (downloads through
            ``TransformerBridge.boot_transformers``: needs the hub), or a zero-argument
            callable returning a model. Also accepted: a lineage directory of
            ``ckpt_step{N}`` dirs or a :class:`~tl_idempotence.sources.lineage.Lineage`. A
            checkpoint's step is the one it records (the hub spec's ``checkpoint_value``, the
            ``global_step`` of a ``trainer_state.json`` in its folder, the lineage manifest),
            else the step given in a triple, else the one its label names (an integer, or
            ``"step1000"``, ``"checkpoint-500"``: never a size such as ``"pythia-70m"``); NaN if
            none (figures then use the order). A label or a given step that disagrees with the
            recorded step is refused.
        heads: ``[(layer, head)]`` to keep (default: all heads); only their layers are measured.
        cache_dir: directory of per-checkpoint resume parts (parquet +
            JSON), keyed on each layer's weight fingerprint and the options (see the module
            docstring): a cached layer is reused only when its weights are byte for byte the
            same, whatever the file's name, size or mtime.
        loader (Callable | None): ``loader(spec) -> model`` used instead of the built-in loading
            for path and hub checkpoints (e.g. ``tl_idempotence.sources.tl.bridge_from_dir``).
        allow_mixed_processing (bool): measure checkpoints whose weights were processed
            differently (raw vs TransformerLens ``fold_ln``/centring) anyway, marking them; by
            default refuse.
        progress (bool): tqdm bar over checkpoints.
        client: a ``distributed.Client``: run one task per checkpoint on that Dask cluster
            (see :func:`tl_idempotence.studies.sweep.sweep`); paths only.
        **options: the report options (REPORT_OPTIONS_DOC).

    The options are the same for every checkpoint (``nulls`` adds ``P_scrambled_median``, ``search`` the
    layer's ``feasible_P``, ``algebra`` the shared-value algebra of each checkpoint's report).

    Returns:
        :class:`Trajectory` (``.heads`` long table, ``.layers``, ``.checkpoints``, ``.figure()``).

    Raises:
        OptionTypeError: ``checkpoints`` is not a sequence of pairs, or a spec of unknown type.
        OptionError: empty or duplicate labels, bad hub options, bad threshold/layers,
            a ``heads`` entry that is not a head of the measured model, mixed processing, a step
            that disagrees with the checkpoint's recorded step, ``client`` with ``loader`` or with
            checkpoints that are not paths.
        MissingFileError: a checkpoint path that does not exist.
        MissingExtraError: ``client`` given without ``dask``/``distributed`` installed (``pip install
            "tl_idempotence[cluster]"``), before any checkpoint is opened.
        OSError: a hub checkpoint that cannot be downloaded (offline); the message says what to do.
    """
    from ..core.progress import progress_bar

    base = ReportOptions.from_kwargs("trajectory()", options, _OWN_PARAMETERS)  # validated before any work
    progress = check_bool(progress, "progress")
    allow_mixed_processing = check_bool(allow_mixed_processing, "allow_mixed_processing")
    if loader is not None and not callable(loader):
        raise OptionTypeError(f"loader must be None or a callable loader(spec) -> model; got {type(loader).__name__}.")
    if cache_dir is not None and not isinstance(cache_dir, (str, os.PathLike)):
        raise OptionTypeError(f"cache_dir must be None or a directory path; got {type(cache_dir).__name__}.")
    ckpts = _normalize(checkpoints)
    if client is not None:
        check_cluster_trajectory(ckpts, client, loader)
    head_set: list[tuple[int, int]] | None = None
    if heads is not None:
        head_set = _head_pairs(heads)
    want = base.layers
    run_layers: list[int] | None = None if want is None else sorted(want)
    if head_set is not None:
        hl = sorted({a for a, _ in head_set})
        if run_layers is not None:
            missing = sorted(set(hl) - set(run_layers))
            if missing:
                raise OptionError(f"heads name layers {missing} that are not in layers={run_layers}.")
        run_layers = hl
    asked: dict[str, Any] = {**options, "layers": run_layers}
    opts = ReportOptions.from_kwargs("trajectory()", asked, _OWN_PARAMETERS)
    record = {**opts.as_dict(), "heads": head_set}
    if cache_dir is not None:
        cdir = Path(cache_dir).expanduser()
        if cdir.exists() and not cdir.is_dir():
            raise OptionError(f"cache_dir={str(cache_dir)!r} is a file, not a directory.")
        try:
            cdir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise OptionError(f"Cannot create cache_dir {cdir}: {e.strerror or e}.") from e
    if client is not None:
        results = run_trajectory_on_cluster(ckpts, opts, client=client, cache_dir=cache_dir, progress=progress)
    else:
        results = []
        bar = progress_bar(ckpts, desc="checkpoints", unit="ckpt", enabled=progress)
        for c in bar:
            bar.set_postfix_str(c.label)
            t0 = time.perf_counter()
            model = _load(c, loader)
            collect = c.kind != "object" and _is_module(model)
            try:
                resume = (
                    None if cache_dir is None else Path(cache_dir).expanduser() / cache_name(c.order, c.label, opts)
                )
                rep = report_with_options(model, opts, progress=False, resume=resume)
            finally:
                del model  # drop our reference before the next checkpoint is loaded
                if collect:
                    gc.collect()
            if head_set is not None:
                _check_heads(c, rep, head_set)
            results.append((c, rep, time.perf_counter() - t0))
    return _combine(results, opts, record, head_set, allow_mixed_processing)


def _differs(key: tuple[Any, ...], ref: tuple[Any, ...], conflicts: list[str]) -> str:
    """The conflicting processing flags on which ``key`` differs from the first checkpoint's ``ref`` ("" if none)."""
    out = []
    for n, k in enumerate(PROCESSING_FLAGS):
        if k in conflicts and key[n] is not None and ref[n] is not None and key[n] != ref[n]:
            out.append(f"{k}={key[n]} (first checkpoint: {ref[n]})")
    return ", ".join(out)


def _check_heads(c: _Ckpt, rep: Any, head_set: list[tuple[int, int]]) -> None:
    """Refuse ``heads`` that the checkpoint does not have (checked as soon as it is measured)."""
    hd = rep.heads
    have = set(zip(hd["layer"].astype(int), hd["head"].astype(int)))
    absent = [lh for lh in head_set if lh not in have]
    if absent:
        raise OptionError(
            f"Checkpoint {c.label!r} has no heads {absent[:10]} (layer, head): it has {rep.info.n_heads} heads per "
            "layer."
        )


def _combine(
    results: list[tuple[_Ckpt, Any, float]],
    opts: ReportOptions,
    options: dict[str, Any],
    head_set: list[tuple[int, int]] | None,
    allow_mixed: bool,
) -> Trajectory:
    """The trajectory tables from per-checkpoint reports (in checkpoint order)."""
    threshold = opts.threshold
    procs = {c.label: recorded_flags(rep.summary, PROCESSING_FLAGS) for c, rep, _ in results}
    # A flag conflicts when two checkpoints record different known values (None = not recorded).
    conflicts = [
        k for n, k in enumerate(PROCESSING_FLAGS) if len({key[n] for key in procs.values() if key[n] is not None}) > 1
    ]
    if conflicts:
        detail = "; ".join(
            f"{lab}: " + ", ".join(f"{k}={v}" for k, v in zip(PROCESSING_FLAGS, key) if k in conflicts)
            for lab, key in procs.items()
        )
        msg = (
            f"The checkpoints' weights were processed differently ({detail}); processing changes T and so P "
            "(SPEC 10), so a jump between them is not training."
        )
        if not allow_mixed:
            raise OptionError(msg + " Measure them all raw (or all processed), or pass allow_mixed_processing=True.")
        warnings.warn(msg, UserWarning, stacklevel=3)
    first_proc = procs[results[0][0].label] if results else ()
    fps = {c.label: dict(zip(rep.layers["layer"].astype(int), rep.layers["fingerprint"])) for c, rep, _ in results}
    rel = checkpoint_relations(fps).set_index("checkpoint")
    dup = rel[(rel["identical_to"] != "") | (rel["shares_layers_with"] != "")]
    if len(dup):
        parts = [
            f"{lab} is identical to {r.identical_to}"
            if r.identical_to
            else f"{lab} shares {r.n_shared_layers} layer(s) with {r.shares_layers_with}"
            for lab, r in dup.iterrows()
        ]
        warnings.warn(
            "Checkpoints that are not genuine distinct points: "
            + "; ".join(parts)
            + " (marked in Trajectory.checkpoints and the figures).",
            UserWarning,
            stacklevel=3,
        )
    head_tables, layer_tables, rows = [], [], []
    for c, rep, seconds in results:
        hd, ld = rep.heads.reset_index(drop=True), rep.layers
        if head_set is not None:
            _check_heads(c, rep, head_set)
            keep = [(int(a), int(b)) in set(head_set) for a, b in zip(hd["layer"], hd["head"])]
            hd = hd[keep]
        if "feasible_P" in ld:
            lf = ld.set_index("layer")["feasible_P"]
            hd = hd.assign(feasible_P=hd["layer"].map(lf).to_numpy(), layer_feasible_P=hd["layer"].map(lf).to_numpy())
        meta = {"checkpoint": c.label, "order": c.order, "step": c.step}
        hd = hd.assign(**meta)
        ld = ld.assign(**meta)
        meta = {**meta, "step_source": c.step_source}
        head_tables.append(hd)
        layer_tables.append(ld)
        P = hd["P"].to_numpy(dtype=float)
        r = rel.loc[c.label]
        row = {
            **meta,
            "kind": c.kind,
            "cached": bool((rep.summary.n_layers_resumed or 0) == len(rep.layers)),
            "seconds": seconds,
            "n_heads": len(hd),
            "threshold": threshold,
            "n_closed": int((np.nan_to_num(P, nan=-1.0) >= threshold).sum()),
            "median_P": float(np.nanmedian(P)) if np.isfinite(P).any() else float("nan"),
            "weights_fingerprint": rep.summary.weights_fingerprint or "",
            "identical_to": r["identical_to"],
            "shares_layers_with": r["shares_layers_with"],
            "n_shared_layers": int(r["n_shared_layers"]),
            **{f"processing_{k}": v for k, v in zip(PROCESSING_FLAGS, procs[c.label])},
            "processing_differs": _differs(procs[c.label], first_proc, conflicts),
        }
        if "P_scrambled_median" in hd:
            row["median_P_scrambled"] = float(np.nanmedian(hd["P_scrambled_median"].to_numpy(dtype=float)))
        rows.append(row)
    lead = ["checkpoint", "order", "step"]
    heads_df = pd.concat(head_tables, ignore_index=True)
    heads_df = heads_df[lead + [c for c in heads_df.columns if c not in lead]]
    layers_df = pd.concat(layer_tables, ignore_index=True)
    layers_df = layers_df[lead + [c for c in layers_df.columns if c not in lead]]
    return Trajectory(
        heads=heads_df, layers=layers_df, checkpoints=pd.DataFrame(rows), threshold=threshold, options=options
    )


@loads("trajectory")
def load_trajectory(path: PathLike) -> Trajectory:
    """Read back what :meth:`Trajectory.save` wrote (:mod:`tl_idempotence.studies.trajectory_store`): every digest
    checked, and what the record and the checkpoints table state recomputed from the heads and layers tables.

    Args:
        path: the folder.

    Returns:
        The :class:`Trajectory` (equal tables, options and summary; its ``save`` refuses to write over the folder).

    Raises:
        MissingFileError: no such folder, no ``trajectory.json``, a listed table missing (names it).
        ReportFileError: another format; an edited record (digest) or table (sha256), each named; options, a column
            or a summary field that is not what the tables give (names the file and the field).
        OptionTypeError: ``path`` is not a path.
    """
    d, kwargs, summary = read_trajectory(path)
    result = Trajectory(**kwargs)
    check_trajectory_summary(d, summary, dict(result.summary))
    object.__setattr__(result, "loaded_from", str(d))  # set once by its loader (a frozen result allows it)
    return result
