"""A report's summary (what was measured, headline numbers) and the paper table (SPEC 2-5).

:func:`build_summary` collects the model's sizes, the weights' processing flags, the
options, package versions and a content fingerprint of the weights, then asks every
analysis that ran for its model-level numbers. :func:`paper_table` puts the abstract's
headline quantities for this model next to the paper's figures, as numbers.
"""

from __future__ import annotations

import importlib.metadata
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar

import numpy as np
import pandas as pd
import torch

from ..analyses import registry
from ..analyses.base import Analysis
from ..analyses.report_options import ReportOptions
from ..analyses.spec import AnalysisSpec, SummaryRecord, check_summary_field
from ..core.files import package_code_sha256
from ..core.frozen import frozen, thawed
from ..core.heads import ModelInfo, combined_fingerprint
from ..core.paper import PAPER, PAPER_THRESHOLD
from ..core.readings import MEASURED_FIELDS
from ..core.summaries import FrozenSummary
from ..errors import OptionError, OptionTypeError

__all__ = [
    "REPR_FIELDS",
    "ReportSummary",
    "build_summary",
    "combined_fingerprint",
    "field_rules",
    "format_paper_table",
    "paper_table",
    "versions",
]

_V = TypeVar("_V")


def versions() -> dict[str, str | None]:
    """Versions of this package (and the first 16 hex of its code's sha256,
    :func:`~tl_idempotence.core.files.package_code_sha256`), transformer-lens and torch (None when not
    installed)."""

    def v(pkg: str) -> str | None:
        try:
            return importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            return None

    return {
        "tl_idempotence": v("tl_idempotence"),
        "tl_idempotence_code": package_code_sha256()[:16],
        "transformer_lens": v("transformer-lens"),
        "torch": str(torch.__version__),  # a plain str (torch's TorchVersion does not survive JSON as itself)
    }


#: Fields shown by :meth:`ReportSummary.__repr__` (the rest: ``to_dict()``), read through the mapping view; the
#: report's one-line repr shows them too (but the mismatch count: it shows eight).
REPR_FIELDS = (
    "model_name",
    "n_heads",
    "n_closed",
    "threshold",
    "median_P",
    "median_P_scrambled",
    "frac_beats_scramble",
    "n_mismatch_closed",
    "n_feasible_layers",
)


class RecordMap(Mapping[str, _V]):
    """The analyses' records of a summary, read-only (:attr:`ReportSummary.analyses`): no record can be replaced,
    added or dropped after the summary validated them. Picklable (sweeps send reports between processes). Also the
    read-only base of other named collections of a report (its tables: ``report.result.FrameTables``)."""

    __slots__ = ("_records",)

    def __init__(self, records: Mapping[str, _V]) -> None:
        self._records = dict(records)

    def __getitem__(self, key: str) -> _V:
        return self._records[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._records)

    def __len__(self) -> int:
        return len(self._records)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._records!r})"

    def __getstate__(self) -> dict[str, _V]:
        return self._records

    def __setstate__(self, state: dict[str, _V]) -> None:
        self._records = dict(state)


@dataclass(frozen=True, repr=False, eq=False)  # equality is the mapping's: equal to a dict of the same items
class ReportSummary(FrozenSummary):
    """A report's summary: what was measured, each analysis's typed record, provenance. A
    :class:`~tl_idempotence.core.summaries.FrozenSummary` (the one record class of every summary) whose items are the
    flat view below.

    Composed: the report's own fields (below) and, under each analysis's name, that analysis's
    :class:`~tl_idempotence.analyses.spec.SummaryRecord` (declared beside its code, e.g.
    :class:`~tl_idempotence.analyses.scramble_spec.ScrambleSummary`): ``summary.scramble.median_P_scrambled``,
    ``summary.closure.n_closed``; ``None`` for an analysis that did not run. :attr:`analyses` holds them
    (registry order).

    A read-only compatibility view keeps the flat form: the summary is a mapping of every field that is set —
    the report's and every record's, flat (``summary["n_closed"]``, ``"median_P_scrambled" in summary``,
    ``dict(summary)``, ``json.dumps(summary)``; the flat names also read as attributes, ``summary.n_closed``,
    ``None`` when not set);
    :meth:`to_dict` gives this flat JSON form (what a saved report and ``--json`` hold) and
    :meth:`from_dict` reads it back (refusing unknown keys; :func:`field_rules` has every flat field's rule).

    The report's own fields: ``model_name, model_class, n_layers, n_attention_layers`` (measured), ``n_heads``
    (measured heads), ``n_heads_per_layer, n_kv_heads, d_model, d_head, threshold``; provenance: ``processing``
    (the weights' processing, SPEC 10), ``options``, ``versions``, ``weights_fingerprint`` (sha256 over the
    measured layers' fingerprints), ``source`` (format, file names), ``notes`` (e.g. a norm after ``W_O`` that T
    does not include); added by routes: ``n_layers_resumed`` (resume), ``n_params`` (comparisons). The analyses'
    fields: closure (SPEC 2) ``n_closed, frac_closed, median_P, n_undefined_P, closed_per_layer``; orientation
    scramble (SPEC 4b) ``n_scramble_draws, median_P_trained, median_P_scrambled, n_heads_compared,
    n_heads_beating_scramble, n_heads_q05, frac_beats_scramble, n_layers_trained_wins, layers_trained_loses``;
    O/V mismatch (SPEC 4a) ``n_mismatch_pairs, n_mismatch_closed, mismatch_P_max, mismatch_notes``; search
    (SPEC 5) ``n_feasible_layers, infeasible_layers``; shared-value algebra (SPEC 7) ``algebra`` (its summary
    dict, also the attribute ``summary.algebra``; its typed record is ``summary.analyses["algebra"]``),
    ``algebra_ranges_threshold``.
    """

    model_name: str
    model_class: str
    n_layers: int
    n_attention_layers: int
    n_heads: int
    n_heads_per_layer: int
    n_kv_heads: int
    d_model: int
    d_head: int
    threshold: float
    processing: dict[str, Any] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)
    versions: dict[str, Any] = field(default_factory=dict)
    weights_fingerprint: str | None = None
    source: dict[str, Any] | None = None
    notes: list[str] | None = None
    n_layers_resumed: int | None = None
    n_params: int | None = None
    analyses: Mapping[str, SummaryRecord] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.analyses, Mapping) or not all(
            isinstance(r, SummaryRecord) for r in self.analyses.values()
        ):
            raise OptionTypeError("ReportSummary.analyses must map analysis names to their SummaryRecord.")
        # a read-only copy (a record cannot be replaced or dropped after validation; it pickles, for Dask)
        object.__setattr__(self, "analyses", RecordMap(self.analyses))
        _validate(self)
        for f in fields(self):  # its lists and dicts (processing, versions, ...) cannot be edited in place
            if f.name != "analyses":
                object.__setattr__(self, f.name, frozen(getattr(self, f.name)))
        self._set_fields(self._flat())  # the flat view: the record's items (read-only)

    @classmethod
    def fields(cls) -> tuple[str, ...]:  # type: ignore[override]  # the flat view's (the registry's at each call)
        """Every flat field, in order (:func:`field_rules`)."""
        return tuple(field_rules())

    @classmethod
    def rules(cls) -> dict[str, str]:
        """Every flat field's rule (:func:`field_rules`)."""
        return field_rules()

    @classmethod
    def _make(cls, items: Mapping[str, Any]) -> ReportSummary:
        return cls.from_dict(items)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_summary_from_state, (type(self), dict(self.__dict__)))

    def __deepcopy__(self, memo: dict[int, Any]) -> ReportSummary:
        return self  # read-only all through (a deep copy of a report keeps its typed summary)

    # ---------------------------------------------------------------- the analyses' records
    def __getattr__(self, name: str) -> Any:
        """An analysis's record by its name (``summary.scramble``; None when it did not run), else a flat field of
        the compatibility view (``summary.median_P_scrambled``; None when not set). A name that is both (only
        ``algebra``) is the flat field (``summary.algebra`` is the algebra's summary dict, the same values as the
        record's); the record is ``summary.analyses["algebra"]``."""
        if name.startswith("_"):
            raise AttributeError(name)
        records = object.__getattribute__(self, "analyses")
        if name in records and name not in field_rules():  # "algebra" is also a flat field: that wins
            return records[name]
        if name in _analysis_names() and name not in field_rules():
            return None
        if name in field_rules():
            for r in records.values():
                if name in r.rules():
                    return getattr(r, name)
            return None
        raise AttributeError(f"ReportSummary has no field or analysis {name!r}")

    # ---------------------------------------------------------------- read-only flat mapping of the set fields
    def _flat(self) -> dict[str, Any]:
        """Every field that is set, flat, in order, as stored (its lists and dicts read-only)."""
        out = {k: getattr(self, k) for k in MEASURED_FIELDS}
        for r in self.analyses.values():
            out.update(r)  # a record's mapping: its set fields, as stored
        for f in fields(self):
            if f.name not in MEASURED_FIELDS and f.name != "analyses" and getattr(self, f.name) is not None:
                out[f.name] = getattr(self, f.name)
        return out

    def to_dict(self) -> dict[str, Any]:
        """Every field that is set, flat, in order (what was measured, each analysis's record in registry order,
        provenance), as a plain dict (JSON values): an editable copy."""
        return thawed(self._flat())

    # ---------------------------------------------------------------- conversions
    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ReportSummary:
        """A summary from :meth:`to_dict` (a saved report's record, ``--json``): each key goes to the report's own
        fields or to the registered analysis that declares it, validated like every summary (the types and ranges
        of :func:`field_rules`, and counts that fit their totals).

        Raises:
            OptionTypeError: ``d`` is not a mapping; a field of the wrong type (``n_closed="3"``, ``True`` for a
                count, ``1.5`` for a count; names the field).
            OptionError: a key that is not a field (names it), a required field missing, an impossible value
                (a negative count, ``median_P=2.0``, ``threshold=nan``, more closed heads than heads; names
                the field and the value).
        """
        if not isinstance(d, Mapping):
            raise OptionTypeError(
                f"a report summary must be a mapping of its fields (ReportSummary.to_dict()); got {type(d).__name__}."
            )
        rules = field_rules()
        unknown = [k for k in d if k not in rules]
        if unknown:
            raise OptionError(f"summary keys {unknown[:5]} are not fields of a report summary")
        own = {f.name for f in fields(cls)} - {"analyses"}
        missing = [k for k in MEASURED_FIELDS if k not in d]
        records: dict[str, SummaryRecord] = {}
        for spec in _records():
            assert spec.summary is not None
            part = {k: d[k] for k in spec.summary.rules() if k in d and d[k] is not None}
            if part or spec.name == "closure":  # the closure always runs
                missing += [k for k in spec.summary.required() if k not in part]
                if not missing:
                    records[spec.name] = spec.summary(**part)
        if missing:
            raise OptionError(f"summary lacks {missing[:5]}")
        return cls(**{k: v for k, v in d.items() if k in own}, analyses=records)

    def replace(self, **changes: Any) -> ReportSummary:
        """A copy with some flat fields changed (``None`` unsets an optional one; the summary itself never changes),
        validated as :meth:`from_dict` is.

        Raises:
            OptionTypeError / OptionError: as :meth:`from_dict`; a keyword that is not a field.
        """
        unknown = [k for k in changes if k not in field_rules()]
        if unknown:
            raise OptionError(f"summary keys {unknown[:5]} are not fields of a report summary")
        merged = {**self.to_dict(), **changes}
        own = {f.name for f in fields(self)}
        return ReportSummary.from_dict({k: v for k, v in merged.items() if v is not None or k in own})

    def __repr__(self) -> str:
        items = []
        for k in REPR_FIELDS:
            v = self.get(k)
            if v is not None:
                items.append(f"{k}={v!r}" if not isinstance(v, float) else f"{k}={v:.4g}")
        return f"ReportSummary({', '.join(items)}; every field: .to_dict())"

    def _repr_html_(self) -> str:
        import html

        cells = [(k, self.get(k)) for k in REPR_FIELDS if self.get(k) is not None]
        rows = "".join(
            f"<tr><td>{html.escape(k)}</td><td>{html.escape(f'{v:.4g}' if isinstance(v, float) else str(v))}</td></tr>"
            for k, v in cells
        )
        return (
            f"<div><b>ReportSummary</b> ({len(self)} fields; every one in <code>.to_dict()</code>)"
            f"<table>{rows}</table></div>"
        )


def _summary_from_state(cls: type[ReportSummary], state: dict[str, Any]) -> ReportSummary:
    """A pickled :class:`ReportSummary` (its fields and records as they were: no registry needed to read it)."""
    out = cls.__new__(cls)
    out.__dict__.update(state)
    out._set_fields(out._flat())
    return out


#: The rules of the report's own fields (the analyses' are in their records: :func:`field_rules` has all).
OWN_FIELD_RULES: dict[str, str] = {
    "model_name": "str",
    "model_class": "str",
    "n_layers": "size",
    "n_attention_layers": "count",
    "n_heads": "count",
    "n_heads_per_layer": "size",
    "n_kv_heads": "size",
    "d_model": "size",
    "d_head": "size",
    "threshold": "threshold",
    "processing": "dict",
    "options": "dict",
    "versions": "dict",
    "weights_fingerprint": "str",
    "source": "dict",
    "notes": "strs",
    "n_layers_resumed": "count",
    "n_params": "count",
}

#: Counts of the report's own fields that cannot exceed another: ``(count, total)`` (the analyses' records
#: declare theirs: :attr:`~tl_idempotence.analyses.spec.SummaryRecord.bounds`).
_AT_MOST = (
    ("n_attention_layers", "n_layers"),
    ("n_kv_heads", "n_heads_per_layer"),
)
_AT_MOST_LAST = (("n_layers_resumed", "n_attention_layers"),)


def _records() -> list[AnalysisSpec]:
    return [s for s in registry.ANALYSES if s.summary is not None]


def _analysis_names() -> set[str]:
    return {s.name for s in registry.ANALYSES}


def field_rules() -> dict[str, str]:
    """Every flat summary field's rule (:data:`~tl_idempotence.analyses.spec.SUMMARY_RULES`): the report's own
    and every registered analysis's record's (read from the registry at each call)."""
    out = dict(OWN_FIELD_RULES)
    for spec in _records():
        assert spec.summary is not None
        out.update(spec.summary.rules())
    return out


def optional_field(name: str) -> bool:
    """Whether the flat summary field ``name`` may be unset in a summary whose analysis ran (a provenance field
    such as ``n_params``, or a record field with ``default=None`` such as ``mismatch_notes``)."""
    own = {f.name: f for f in fields(ReportSummary)}
    if name in own:
        return own[name].default is None
    for spec in _records():
        assert spec.summary is not None
        if name in spec.summary.rules():
            return name not in spec.summary.required()
    return False


def _check_sizes(flat: Mapping[str, Any]) -> None:
    """Every size bounded by the others (what a report measures: every head of each measured layer):
    ``n_kv_heads`` divides ``n_heads_per_layer`` (query heads are grouped onto kv heads), ``n_heads`` is
    ``n_attention_layers × n_heads_per_layer``, ``closed_per_layer`` has one entry per measured layer and none above
    ``n_heads_per_layer``, ``n_mismatch_pairs`` is at most ``n_attention_layers × n_heads_per_layer²`` (pairs within
    a layer), ``infeasible_layers`` and ``layers_trained_loses`` list distinct measured layers only.

    Raises:
        OptionError: names the field, its value and the fields that bound it.
    """
    n_layers, n_att = flat["n_layers"], flat["n_attention_layers"]
    per, n_kv, n_heads = flat["n_heads_per_layer"], flat["n_kv_heads"], flat["n_heads"]
    if per % n_kv:
        raise OptionError(
            f"summary field n_kv_heads={n_kv!r} is impossible: it must divide n_heads_per_layer={per!r} (query heads "
            "are grouped onto kv heads)."
        )
    if n_heads != n_att * per:
        raise OptionError(
            f"summary field n_heads={n_heads!r} is impossible: a report measures every head of each measured layer, "
            f"n_attention_layers × n_heads_per_layer = {n_att!r} × {per!r} = {n_att * per!r}."
        )
    cpl = flat.get("closed_per_layer")
    if isinstance(cpl, Mapping):
        if len(cpl) != n_att:
            raise OptionError(
                f"summary field closed_per_layer has {len(cpl)} layers, but n_attention_layers={n_att!r} (one entry "
                "per measured layer)."
            )
        over = [(k, v) for k, v in cpl.items() if v > per]
        if over:
            raise OptionError(
                f"summary field closed_per_layer has {over[0][1]!r} closed heads in layer {over[0][0]!r}, more than "
                f"n_heads_per_layer={per!r}."
            )
    pairs = flat.get("n_mismatch_pairs")
    if pairs is not None and pairs > n_att * per * per:
        raise OptionError(
            f"summary field n_mismatch_pairs={pairs!r} is impossible: more than n_attention_layers × "
            f"n_heads_per_layer² = {n_att * per * per!r} (pairs within a layer)."
        )
    for name in ("infeasible_layers", "layers_trained_loses"):
        v = flat.get(name)
        if isinstance(v, list) and (len(set(v)) != len(v) or len(v) > n_att or any(x >= n_layers for x in v)):
            raise OptionError(
                f"summary field {name}={v[:10]!r} is impossible: it must list distinct measured layers (at most "
                f"n_attention_layers={n_att!r}, each below n_layers={n_layers!r})."
            )


def _validate(s: ReportSummary) -> None:
    """The report's own fields against their rules, then every count against its total (the report's and each
    record's bounds), then each record's checks against the report (:meth:`SummaryRecord.check`).

    Raises:
        OptionTypeError / OptionError: names the first field that is wrong (and the value, or both values).
    """
    required = set(MEASURED_FIELDS) | {"processing", "options", "versions"}
    for name, rule in OWN_FIELD_RULES.items():
        v = getattr(s, name)
        if v is not None or name in required:  # None is "not set", for the fields that may be unset
            check_summary_field(name, rule, v)
    flat = s.to_dict()
    bounds = [*_AT_MOST, *(b for r in s.analyses.values() for b in r.bounds), *_AT_MOST_LAST]
    for count, total in bounds:
        a, b = flat.get(count), flat.get(total)
        if a is not None and b is not None and a > b:
            raise OptionError(f"summary field {count}={a!r} is impossible: more than {total}={b!r}.")
    _check_sizes(flat)
    for r in s.analyses.values():
        r.check(flat)


def build_summary(
    heads: pd.DataFrame,
    layers: pd.DataFrame,
    tables: dict[str, pd.DataFrame],
    info: ModelInfo,
    options: ReportOptions,
    analyses: Sequence[Analysis],
) -> ReportSummary:
    """The report's :class:`ReportSummary`: what was measured, each analysis's model-level numbers
    (:meth:`~tl_idempotence.analyses.base.Analysis.summarize`), provenance."""
    s: dict[str, Any] = {
        "model_name": info.model_name,
        "model_class": info.model_class,
        "n_layers": info.n_layers,
        "n_attention_layers": int(heads["layer"].nunique()),
        "n_heads": len(heads),
        "n_heads_per_layer": info.n_heads,
        "n_kv_heads": info.n_kv_heads,
        "d_model": info.d_model,
        "d_head": info.d_head,
        "threshold": options.threshold,
    }
    for a in analyses:
        s.update(a.summarize(heads, layers, tables, options))
    s["processing"] = dict(info.processing)
    s["options"] = options.as_dict()
    s["versions"] = versions()
    if "fingerprint" in layers.columns:
        s["weights_fingerprint"] = combined_fingerprint(list(zip(layers["layer"], layers["fingerprint"])))
    if info.extra:
        s["source"] = dict(info.extra)
    notes = []
    if info.extra.get("post_attention_norm"):
        notes.append(f"{info.extra['post_attention_norm']}: T = O V^T is measured on W_O alone, before that norm")
    if notes:
        s["notes"] = notes
    return ReportSummary.from_dict(s)


def _frac(n: Any, of: Any) -> float:
    return float(n) / float(of) if of else float("nan")


def paper_table(summary: ReportSummary, n_layers: int) -> pd.DataFrame:
    """The abstract's headline quantities for this model next to the paper's, as numbers (SPEC 4-5).

    Args:
        summary: a report's summary (its analyses' records are read: ``summary.closure``, ``summary.scramble``, ...).
        n_layers: how many layers were measured (denominator of the per-layer rows).

    Returns:
        DataFrame, one row per quantity, columns ``quantity`` (str), ``value`` (float: a
        fraction in [0, 1] or a median P), ``n`` and ``of`` (the counts behind a fraction, or
        NaN), ``paper_low``, ``paper_high`` (the paper's figure or range), ``note`` ("" or why
        the value is NaN, e.g. the controls did not run; at a threshold other than the paper's
        0.9 the threshold rows say that their paper figure is at P >= 0.9). Rows: heads with P >= threshold;
        matched mismatch pairs with P >= threshold (paper: none); median P trained; median P
        scrambled; heads whose trained orientation beats its scramble median; layers where the
        trained orientation wins; layers where P >= threshold is feasible (search).
    """
    t = summary.threshold
    closure, scramble, mismatch, search = summary.closure, summary.scramble, summary.mismatch, summary.search
    nan = float("nan")
    rows: list[dict[str, Any]] = []

    at_other_threshold = t != PAPER_THRESHOLD

    def row(q: str, key: str, value: float, n: Any = nan, of: Any = nan, note: str = "") -> None:
        lo, hi = PAPER[key]
        if (
            at_other_threshold
            and math.isfinite(value)
            and key in ("frac_closed", "mismatch_closed", "frac_layers_feasible")
        ):
            other = f"the paper's figure is at P >= {PAPER_THRESHOLD:g}, this model's at P >= {t:g}"
            note = f"{note}; {other}" if note else other
        rows.append({"quantity": q, "value": value, "n": n, "of": of, "paper_low": lo, "paper_high": hi, "note": note})

    row(f"heads with P >= {t:g}", "frac_closed", closure.frac_closed, closure.n_closed, summary.n_heads)
    no_nulls = "not run: make the report with nulls=True / --nulls 64 (orientation scramble + O/V mismatch)"
    if mismatch is not None:
        if mismatch.n_mismatch_pairs:
            row(
                f"matched O/V mismatch pairs with P >= {t:g}",
                "mismatch_closed",
                _frac(mismatch.n_mismatch_closed, mismatch.n_mismatch_pairs),
                mismatch.n_mismatch_closed,
                mismatch.n_mismatch_pairs,
            )
        else:
            row(
                f"matched O/V mismatch pairs with P >= {t:g}",
                "mismatch_closed",
                nan,
                0,
                0,
                "; ".join(
                    mismatch.mismatch_notes
                    if mismatch.mismatch_notes is not None
                    else ["no valid pair: one kv head (MQA)"]
                ),
            )
    else:
        row(f"matched O/V mismatch pairs with P >= {t:g}", "mismatch_closed", nan, note=no_nulls)
    if scramble is not None:
        row("median P, trained", "median_P_trained", scramble.median_P_trained, n=summary.n_heads)
        row(
            "median P, orientation-scrambled",
            "median_P_scrambled",
            scramble.median_P_scrambled,
            n=scramble.n_heads_compared,
        )
        row(
            "heads whose trained orientation beats its scramble median",
            "frac_beats_scramble",
            scramble.frac_beats_scramble,
            scramble.n_heads_beating_scramble,
            scramble.n_heads_compared,
        )
        row(
            "layers where the trained orientation wins (median P)",
            "frac_layers_trained_wins",
            _frac(scramble.n_layers_trained_wins, n_layers),
            scramble.n_layers_trained_wins,
            n_layers,
        )
    else:
        row("median P, trained", "median_P_trained", closure.median_P, n=summary.n_heads)
        row("median P, orientation-scrambled", "median_P_scrambled", nan, note=no_nulls)
        row("heads whose trained orientation beats its scramble median", "frac_beats_scramble", nan, note=no_nulls)
        row("layers where the trained orientation wins (median P)", "frac_layers_trained_wins", nan, note=no_nulls)
    if search is not None:
        row(
            f"layers where P >= {t:g} is feasible (constructive search)",
            "frac_layers_feasible",
            _frac(search.n_feasible_layers, n_layers),
            search.n_feasible_layers,
            n_layers,
        )
    else:
        row(
            f"layers where P >= {t:g} is feasible (constructive search)",
            "frac_layers_feasible",
            nan,
            note="not run: make the report with search=True / --search",
        )
    df = pd.DataFrame(rows)
    for c in ("n", "of"):
        df[c] = pd.array([None if (isinstance(v, float) and math.isnan(v)) else int(v) for v in df[c]], dtype="Int64")
    return df


def _pct(v: float) -> str:
    return "not run" if not np.isfinite(v) else f"{100 * v:.2f} %"


def format_paper_table(table: pd.DataFrame) -> pd.DataFrame:
    """The paper table as display strings: ``quantity``, ``this model``, ``paper``.

    Fractions print as percentages with their counts, medians with 3 significant digits; a
    value that was not computed prints its note.
    """
    out = []
    for r in table.itertuples(index=False):
        median = r.quantity.startswith("median")
        if not np.isfinite(r.value):
            this = r.note or "undefined"
        elif median:
            this = f"{r.value:.3g}"
        else:
            this = _pct(r.value) + (f" ({r.n}/{r.of})" if not pd.isna(r.n) and not pd.isna(r.of) else "")
        if median:
            paper = f"{r.paper_low:.3g}"
        elif r.paper_low == r.paper_high:
            paper = "none" if r.paper_low == 0 else ("all" if r.paper_low == 1 else _pct(r.paper_low))
        else:
            paper = f"{100 * r.paper_low:.2f}-{100 * r.paper_high:.2f} % (per model)"
        if np.isfinite(r.value) and r.note:  # a defined value with a caveat (another threshold than the paper's)
            paper += f" [{r.note}]"
        out.append({"quantity": r.quantity, "this model": this, "paper": paper})
    return pd.DataFrame(out)
