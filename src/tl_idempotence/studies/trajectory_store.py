"""A :class:`~tl_idempotence.studies.trajectory.Trajectory` saved and read back (THE store, issue 45).

:func:`save_trajectory` writes the folder (:func:`~tl_idempotence.core.records.write_tables_record`: parquet tables
and one JSON record with their sha256s and its own digest; no pickle; put in place in one step)::

    heads.parquet        the long per-head table (one row per checkpoint and head)
    layers.parquet       one row per checkpoint and layer (with each layer's weight fingerprint)
    checkpoints.parquet  one row per checkpoint
    trajectory.json      threshold, options (the report options and ``heads``), summary, float_keys

:func:`load_trajectory` checks every digest, then recomputes from the tables what the rest states: each checkpoint's
``n_heads``, ``threshold``, ``n_closed``, ``median_P`` and ``median_P_scrambled`` from its heads, its
``weights_fingerprint`` from its layers' fingerprints, ``identical_to``, ``shares_layers_with`` and
``n_shared_layers`` (:func:`~tl_idempotence.studies.trajectory.checkpoint_relations`) and ``processing_differs``;
the heads' ``closed`` against the threshold and their layer's ``feasible_P``; that the three tables name the same
checkpoints, orders and steps; the options the tables show (the threshold, ``layers``, ``heads``, and which
analyses ran: ``nulls``, ``search``, ``algebra``); and the summary. What nothing derives is declared in
:data:`TRAJECTORY_FREE_FIELDS`.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from ..analyses.report_options import ReportOptions
from ..core.frozen import thawed
from ..core.heads import combined_fingerprint
from ..core.outputs import check_save_target
from ..core.processing import T_PROCESSING
from ..core.records import float_keys, index_column, read_fields_record, same_value, write_tables_record
from ..core.stored import StoreSpec, saves
from ..errors import OptionError, OptionTypeError, ReportFileError
from .compare_store import check_same_table

if TYPE_CHECKING:  # pragma: no cover
    from ..core.hints import PathLike

__all__ = [
    "TRAJECTORY_FORMAT",
    "TRAJECTORY_FREE_FIELDS",
    "TRAJECTORY_RECORD",
    "TRAJECTORY_STORE",
    "TRAJECTORY_TABLES",
    "check_trajectory_summary",
    "checkpoint_relations",
    "read_trajectory",
    "save_trajectory",
]

TRAJECTORY_FORMAT = "tl_idempotence.trajectory/1"
TRAJECTORY_TABLES = ("heads", "layers", "checkpoints")
#: The record fields of a saved trajectory that its tables do not restate (``StoreSpec.free_fields``): a trajectory
#: keeps each checkpoint's per-head and per-layer results, not the draws or the run.
TRAJECTORY_FREE_FIELDS = (
    ("options.seed", "the seed of the null and search draws, recorded once: the draws themselves are not kept"),
    (
        "options.nulls",
        "the scrambled draws asked per head, recorded once: the heads' n_scramble_draws count the defined draws "
        "(checked to be at most it, and the scramble columns to be there exactly when it is not 0)",
    ),
    ("options.compute_dtype", "the dtype the closure was computed in, recorded once (no table restates it)"),
    (
        "options.device",
        "where the reports were computed: provenance (results agree across devices to float64 rounding)",
    ),
)
#: How a trajectory is stored (:class:`~tl_idempotence.core.stored.StoreSpec`), and its record's file name.
TRAJECTORY_STORE = StoreSpec(name="trajectory", formats=(TRAJECTORY_FORMAT,), free_fields=TRAJECTORY_FREE_FIELDS)
TRAJECTORY_RECORD = TRAJECTORY_STORE.record
_FIELDS = ["format", "threshold", "options", "summary", "float_keys"]
_LEAD = ["checkpoint", "order", "step"]


@saves("trajectory")
def save_trajectory(result: Any, path: PathLike, overwrite: bool = False) -> str:
    """Save a trajectory to the folder ``path`` (module docstring: three parquet tables and one JSON record; no
    pickle); :func:`load_trajectory` reads it back.

    Returns:
        The folder, as a string.

    Raises:
        OptionTypeError: ``result`` is not a ``Trajectory``; ``path`` not a path; ``overwrite`` not a bool.
        OutputOverInputError (an ``OptionError``): ``path`` is the folder ``result`` was loaded from.
        OptionError: ``path`` ends in a file extension; as :func:`~tl_idempotence.core.records.write_tables_record`
            (a non-empty folder without ``overwrite``, a missing parent, an edited earlier record; names it).
    """
    if not (hasattr(result, "checkpoints") and hasattr(result, "threshold")):  # a Trajectory (defined above this)
        raise OptionTypeError(f"save_trajectory saves a Trajectory (tli.trajectory); got {type(result).__name__}.")
    check_save_target(path, "A trajectory save", "trajectory", getattr(result, "loaded_from", None))
    fields: dict[str, Any] = {
        "threshold": float(result.threshold),
        "options": thawed(dict(result.options)),
        "summary": thawed(dict(result.summary)),
    }
    fields["float_keys"] = sorted(float_keys(fields))
    tables = {"heads": result.heads, "layers": result.layers, "checkpoints": result.checkpoints}
    return str(write_tables_record(path, TRAJECTORY_FORMAT, TRAJECTORY_RECORD, tables, fields, overwrite))


def read_trajectory(path: PathLike) -> tuple[Path, dict[str, Any], Any]:
    """Read what :func:`save_trajectory` wrote: every digest checked, and what the record and the checkpoints table
    state recomputed from the heads and layers tables (module docstring); what ``Trajectory.load`` builds its result
    from (then :func:`check_trajectory_summary`).

    Returns:
        ``(folder, the Trajectory's constructor arguments, the saved summary)``.

    Raises:
        MissingFileError: no such folder, no ``trajectory.json``, a listed table missing (names it).
        ReportFileError: another format; an edited record (digest) or table (sha256), each named; options or a
            column that is not what the tables give (names the file and the field).
        OptionTypeError: ``path`` is not a path.
    """
    d, fields, tables = read_fields_record(path, TRAJECTORY_RECORD, (TRAJECTORY_FORMAT,), frozenset(TRAJECTORY_TABLES))
    rec = d / TRAJECTORY_RECORD
    if list(fields) != _FIELDS:
        raise _edited(rec, f"fields {list(fields)} are not a trajectory record's {_FIELDS}")
    threshold = fields["threshold"]
    options, opts = _options(rec, fields["options"], threshold)
    heads, layers, ck = tables["heads"], tables["layers"], tables["checkpoints"]
    labels = _checkpoints(d, heads, layers, ck)
    fresh = _recomputed(d, heads, layers, ck, labels, threshold, opts, options["heads"])
    check_same_table(d / "checkpoints.parquet", ck, fresh, "its heads and layers", "tli.trajectory")
    kwargs = {"heads": heads, "layers": layers, "checkpoints": ck, "threshold": threshold, "options": options}
    return d, kwargs, fields["summary"]


def check_trajectory_summary(d: Path, summary: Any, fresh_summary: dict[str, Any]) -> None:
    """The saved summary must be the rebuilt trajectory's (``fresh_summary``), field for field and type for type.

    Raises:
        ReportFileError: names the record and the field.
    """
    rec = d / TRAJECTORY_RECORD
    if not isinstance(summary, dict) or list(summary) != list(fresh_summary):
        raise _edited(rec, f"summary fields {list(summary)[:10]} are not {list(fresh_summary)}")
    for k, v in fresh_summary.items():
        if not (same_value(summary[k], v) and type(summary[k]) is type(v)):
            raise _edited(rec, f"summary[{k!r}] is {summary[k]!r} but its tables give {v!r}")


def checkpoint_relations(fingerprints: dict[str, dict[int, str]]) -> pd.DataFrame:
    """Which checkpoints are identical to, or share layers with, an earlier one.

    Args:
        fingerprints: ``{label: {layer: sha256}}`` in checkpoint order.

    Returns:
        One row per checkpoint: ``checkpoint``, ``identical_to`` (the first earlier checkpoint
        whose every measured layer has the same fingerprint, else ""), ``shares_layers_with``
        (earlier checkpoints with some but not all layers identical, comma-separated, else ""),
        ``n_shared_layers`` (layers identical to some earlier checkpoint's same layer).
    """
    rows = []
    seen: list[tuple[str, dict[int, str]]] = []
    for label, fp in fingerprints.items():
        identical = ""
        partial: list[str] = []
        shared: set[int] = set()
        for other, ofp in seen:
            common = [layer for layer in fp if layer in ofp]
            same = [layer for layer in common if fp[layer] == ofp[layer]]
            shared.update(same)
            if common and len(same) == len(common) == len(fp) and not identical:
                identical = other
            elif same and len(same) < len(fp):
                partial.append(other)
        rows.append(
            {
                "checkpoint": label,
                "identical_to": identical,
                "shares_layers_with": ",".join(partial) if not identical else "",
                "n_shared_layers": len(shared),
            }
        )
        seen.append((label, fp))
    return pd.DataFrame(rows)


def _edited(f: Path, what: str) -> ReportFileError:
    return ReportFileError(f"{f}: {what}: the record or a table was edited. Compute tli.trajectory again.")


def _options(rec: Path, raw: Any, threshold: Any) -> tuple[dict[str, Any], ReportOptions]:
    """The saved options (``heads`` as ``(layer, head)`` tuples) and their :class:`ReportOptions`, checked: report
    options as :meth:`ReportOptions.as_dict` writes them, the record's ``threshold``, ``heads`` sorted distinct
    pairs on the ``layers`` they give.

    Raises:
        ReportFileError: names the record and the option.
    """
    if not (isinstance(raw, dict) and list(raw)[-1:] == ["heads"]):
        raise _edited(rec, f"options {list(raw) if isinstance(raw, dict) else raw!r} end in no 'heads'")
    try:
        opts = ReportOptions.from_record({k: v for k, v in raw.items() if k != "heads"})
    except (OptionError, OptionTypeError) as e:
        raise _edited(rec, f"options are not report options ({e})") from e
    canonical = {**opts.as_dict(), "heads": raw["heads"]}
    same = all(same_value(raw[k], v) and type(raw[k]) is type(v) for k, v in canonical.items())
    if list(canonical) != list(raw) or not same:
        raise _edited(rec, "options are not as a trajectory records them")
    if type(threshold) is not float or threshold != opts.threshold:
        raise _edited(rec, f"threshold is {threshold!r} but options['threshold'] {opts.threshold!r}")
    heads = raw["heads"]
    pairs: list[tuple[int, int]] | None = None
    if heads is not None:
        ok = (
            isinstance(heads, list)
            and heads
            and all(isinstance(p, list) and len(p) == 2 and all(type(x) is int and x >= 0 for x in p) for p in heads)
        )
        pairs = [(p[0], p[1]) for p in heads] if ok else []
        if not ok or pairs != sorted(set(pairs)) or list(opts.layers or []) != sorted({a for a, _ in pairs}):
            raise _edited(rec, f"options['heads'] {heads!r:.80} are not sorted (layer, head) pairs of its layers")
    return {**raw, "heads": pairs}, opts


def _checkpoints(d: Path, heads: pd.DataFrame, layers: pd.DataFrame, ck: pd.DataFrame) -> list[str]:
    """The checkpoints' labels, checked: distinct, in order ``0..n-1``, and the heads and layers tables name the
    same checkpoints with the same order and step, checkpoint after checkpoint.

    Raises:
        ReportFileError: names the file and what differs.
    """
    fc = d / "checkpoints.parquet"
    if list(ck.columns[:3]) != _LEAD or not len(ck):
        raise _edited(fc, f"columns {list(ck.columns)[:4]} do not lead with {_LEAD}, or it has no rows")
    labels = [str(x) for x in ck["checkpoint"]]
    order = index_column(ck, "order", fc)
    if len(set(labels)) != len(labels) or order.tolist() != list(range(len(ck))):
        raise _edited(fc, "checkpoint labels that repeat, or an order that is not 0, 1, ...")
    step = dict(zip(labels, ck["step"].to_numpy(dtype=np.float64)))
    for name, t in (("heads", heads), ("layers", layers)):
        f = d / f"{name}.parquet"
        if list(t.columns[:3]) != _LEAD:
            raise _edited(f, f"columns {list(t.columns)[:4]} do not lead with {_LEAD}")
        lab = [str(x) for x in t["checkpoint"]]
        want_order = [labels.index(x) if x in step else -1 for x in lab]
        if index_column(t, "order", f).tolist() != want_order or sorted(want_order) != want_order:
            raise _edited(f, "checkpoints or orders that are not the checkpoints table's, in its order")
        if not np.array_equal(
            t["step"].to_numpy(dtype=np.float64), np.array([step[x] for x in lab], dtype=np.float64), equal_nan=True
        ):
            raise _edited(f, "a step that is not its checkpoint's in checkpoints.parquet")
    if set(layers["checkpoint"].astype(str)) != set(labels):
        raise _edited(d / "layers.parquet", "a checkpoint without layers")
    return labels


def _recomputed(
    d: Path,
    heads: pd.DataFrame,
    layers: pd.DataFrame,
    ck: pd.DataFrame,
    labels: list[str],
    threshold: float,
    opts: ReportOptions,
    pairs: list[tuple[int, int]] | None,
) -> pd.DataFrame:
    """The checkpoints table with every column the heads and layers give recomputed (module docstring); the heads'
    ``closed``, feasible P and scramble columns and the options the tables show checked on the way.

    Raises:
        ReportFileError: names the file and what differs.
    """
    fh, fl = d / "heads.parquet", d / "layers.parquet"
    if ("P_scrambled_median" in heads.columns) != (opts.nulls > 0) or ("feasible_P" in layers.columns) != opts.search:
        raise _edited(d / TRAJECTORY_RECORD, "options nulls or search are not the analyses the tables hold")
    if ("algebra_ranges_threshold" in layers.columns) != opts.algebra:
        raise _edited(d / TRAJECTORY_RECORD, "options['algebra'] is not the analyses the tables hold")
    if opts.nulls and (heads["n_scramble_draws"].to_numpy() > opts.nulls).any():
        raise _edited(fh, f"n_scramble_draws above options['nulls'] = {opts.nulls}")
    P_all = heads["P"].to_numpy(dtype=np.float64)
    if not np.array_equal(heads["closed"].to_numpy(dtype=bool), np.nan_to_num(P_all, nan=-1.0) >= threshold):
        raise _edited(fh, f"column 'closed' is not P >= threshold ({threshold:g})")
    fresh = ck.copy()
    fps: dict[str, dict[int, str]] = {}
    for i, label in enumerate(labels):
        hd, ld = heads[heads["checkpoint"].astype(str) == label], layers[layers["checkpoint"].astype(str) == label]
        lay = index_column(ld, "layer", fl).tolist()
        if (opts.layers is not None and sorted(lay) != sorted(opts.layers)) or len(set(lay)) != len(lay):
            raise _edited(fl, f"{label}'s layers {lay[:8]} are not options['layers'] {opts.layers}")
        got = list(zip(index_column(hd, "layer", fh).tolist(), index_column(hd, "head", fh).tolist()))
        if len(set(got)) != len(got) or not set(x for x, _ in got) <= set(lay) or (pairs is not None and got != pairs):
            raise _edited(fh, f"{label}'s heads are not those of its layers and options['heads']")
        if "feasible_P" in ld.columns:
            lf = dict(zip(lay, ld["feasible_P"].to_numpy(dtype=np.float64)))
            want = np.array([lf[x] for x, _ in got], dtype=np.float64)
            for c in ("feasible_P", "layer_feasible_P"):
                if c not in hd.columns or not np.array_equal(hd[c].to_numpy(dtype=np.float64), want, equal_nan=True):
                    raise _edited(fh, f"{label}'s column {c!r} is not its layer's feasible_P")
        fp = [str(x) for x in ld["fingerprint"]] if "fingerprint" in ld.columns else []
        fps[label] = dict(zip(lay, fp))
        P = hd["P"].to_numpy(dtype=np.float64)
        fresh.loc[i, "n_heads"] = len(hd)
        fresh.loc[i, "threshold"] = threshold
        fresh.loc[i, "n_closed"] = int((np.nan_to_num(P, nan=-1.0) >= threshold).sum())
        fresh.loc[i, "median_P"] = float(np.nanmedian(P)) if np.isfinite(P).any() else float("nan")
        fresh.loc[i, "weights_fingerprint"] = combined_fingerprint(list(zip(lay, fp))) if fp else ""
        if "median_P_scrambled" in fresh.columns:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # every head's scramble median undefined: NaN
                fresh.loc[i, "median_P_scrambled"] = float(np.nanmedian(hd["P_scrambled_median"].to_numpy(dtype=float)))
    if ("median_P_scrambled" in ck.columns) != (opts.nulls > 0):
        raise _edited(d / "checkpoints.parquet", "a column median_P_scrambled where options['nulls'] says otherwise")
    rel = checkpoint_relations(fps).set_index("checkpoint")
    for c in ("identical_to", "shares_layers_with", "n_shared_layers"):
        fresh[c] = rel.loc[labels, c].to_numpy()
    fresh["processing_differs"] = _processing_differs(d / "checkpoints.parquet", ck)
    return fresh


def _processing_differs(fc: Path, ck: pd.DataFrame) -> list[str]:
    """Each checkpoint's ``processing_differs`` as :func:`~tl_idempotence.studies.trajectory.trajectory` writes it
    from the ``processing_*`` flags: the flags on which two checkpoints record different values, where this one's
    differs from the first checkpoint's ("" when none).

    Raises:
        ReportFileError: a ``processing_*`` column missing (names the file).
    """
    cols = [f"processing_{k}" for k in T_PROCESSING]
    if not set(cols) <= set(ck.columns):
        raise _edited(fc, f"no columns {cols}")
    keys = [tuple(None if _missing(v) else v for v in row) for row in ck[cols].itertuples(index=False)]
    conflicts = {k for n, k in enumerate(T_PROCESSING) if len({key[n] for key in keys if key[n] is not None}) > 1}
    ref = keys[0]
    return [
        ", ".join(
            f"{k}={key[n]} (first checkpoint: {ref[n]})"
            for n, k in enumerate(T_PROCESSING)
            if k in conflicts and key[n] is not None and ref[n] is not None and key[n] != ref[n]
        )
        for key in keys
    ]


def _missing(v: Any) -> bool:
    return v is None or (isinstance(v, float) and np.isnan(v)) or v is pd.NA
