"""A report's summary (what was measured, headline numbers) and the paper table (SPEC 2-5).

:func:`build_summary` collects the model's sizes, the weights' processing flags, the
options, package versions and a content fingerprint of the weights, then asks every
analysis that ran for its model-level numbers. :func:`paper_table` puts the abstract's
headline quantities for this model next to the paper's figures, as numbers.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import math
import numbers
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

import numpy as np
import pandas as pd
import torch

from ..analyses.base import Analysis
from ..core.files import package_code_sha256
from ..core.heads import ModelInfo
from ..core.options import ReportOptions
from ..errors import OptionError, OptionTypeError

__all__ = [
    "PAPER",
    "PAPER_THRESHOLD",
    "ReportSummary",
    "build_summary",
    "combined_fingerprint",
    "format_paper_table",
    "paper_table",
    "versions",
]

#: The abstract's headline figures (arXiv 2609.01129), as numbers.
#: The threshold of the paper's "closed" figures (``frac_closed``, ``mismatch_closed``,
#: ``frac_layers_feasible``).
PAPER_THRESHOLD = 0.9

PAPER = {
    "frac_closed": (0.0398, 0.0800),  # 3.98-8.00 % of heads with P >= 0.9, per model (six endpoints)
    "mismatch_closed": (0.0, 0.0),  # no matched within-layer O/V mismatch reaches P >= 0.9
    "median_P_trained": (0.336, 0.336),  # over 7,304 heads in nine MHA/GQA models
    "median_P_scrambled": (1.04e-4, 1.04e-4),
    "frac_beats_scramble": (0.9864, 0.9864),
    "frac_layers_trained_wins": (1.0, 1.0),  # "in every layer"
    "frac_layers_feasible": (1.0, 1.0),  # "feasible in every surveyed layer"
}


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


def combined_fingerprint(layer_fingerprints: Sequence[tuple[int, str]]) -> str:
    """sha256 over ``layer:fingerprint`` lines in layer order: one key for all measured weights."""
    h = hashlib.sha256()
    for layer, fp in sorted(layer_fingerprints):
        h.update(f"{int(layer)}:{fp}\n".encode())
    return h.hexdigest()


#: Scalar fields shown by :meth:`ReportSummary.__repr__` (the rest: ``to_dict()``).
_REPR_FIELDS = (
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


@dataclass(frozen=True, repr=False, eq=False)  # equality is the mapping's: equal to a dict of the same items
class ReportSummary(Mapping[str, Any]):
    """A report's summary: what was measured and its headline numbers (JSON values), typed.

    Fields are grouped by what computed them; an analysis that did not run leaves its fields ``None``.
    It is also a read-only mapping of the fields that are set (``summary["n_closed"]``,
    ``"median_P_scrambled" in summary``, ``dict(summary)``), in this order; :meth:`to_dict` gives the JSON
    form a saved report and ``--json`` hold, :meth:`from_dict` reads it back (refusing unknown keys).

    What was measured: ``model_name, model_class, n_layers, n_attention_layers`` (measured), ``n_heads``
    (measured heads), ``n_heads_per_layer, n_kv_heads, d_model, d_head, threshold``.
    Closure (SPEC 2): ``n_closed, frac_closed, median_P, n_undefined_P, closed_per_layer`` ({layer: n}).
    Orientation scramble (SPEC 4b, ``nulls``): ``n_scramble_draws, median_P_trained, median_P_scrambled,
    n_heads_compared, n_heads_beating_scramble, frac_beats_scramble, n_layers_trained_wins,
    layers_trained_loses``, ``n_heads_q05`` (heads whose Benjamini-Hochberg q-value across every measured head is
    <= 0.05; ``heads["q_value"]``). O/V mismatch (SPEC 4a): ``n_mismatch_pairs, n_mismatch_closed, mismatch_P_max,
    mismatch_notes``. Constructive search (SPEC 5): ``n_feasible_layers, infeasible_layers``.
    Provenance: ``processing`` (the weights' processing, SPEC 10), ``options``, ``versions``,
    ``weights_fingerprint`` (sha256 over the measured layers' fingerprints), ``source`` (format, file names),
    ``notes`` (e.g. a norm after ``W_O`` that T does not include). Shared-value algebra (SPEC 7):
    ``algebra`` (its summary), ``algebra_ranges_threshold``. Added by routes: ``n_layers_resumed``
    (resume), ``n_params`` (comparisons).
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
    n_closed: int
    frac_closed: float
    median_P: float
    n_undefined_P: int
    closed_per_layer: dict[int, int]
    n_scramble_draws: int | None = None
    median_P_trained: float | None = None
    median_P_scrambled: float | None = None
    n_heads_compared: int | None = None
    n_heads_beating_scramble: int | None = None
    frac_beats_scramble: float | None = None
    n_layers_trained_wins: int | None = None
    layers_trained_loses: list[int] | None = None
    n_heads_q05: int | None = None
    n_mismatch_pairs: int | None = None
    n_mismatch_closed: int | None = None
    mismatch_P_max: float | None = None
    mismatch_notes: list[str] | None = None
    n_feasible_layers: int | None = None
    infeasible_layers: list[int] | None = None
    processing: dict[str, Any] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)
    versions: dict[str, Any] = field(default_factory=dict)
    weights_fingerprint: str | None = None
    source: dict[str, Any] | None = None
    notes: list[str] | None = None
    algebra: dict[str, Any] | None = None
    algebra_ranges_threshold: float | None = None
    n_layers_resumed: int | None = None
    n_params: int | None = None

    def __post_init__(self) -> None:
        _validate(self)

    # ---------------------------------------------------------------- mapping of the fields that are set
    def _keys(self) -> list[str]:
        return [f.name for f in fields(self) if getattr(self, f.name) is not None]

    def __getitem__(self, key: str) -> Any:
        if not isinstance(key, str) or key not in _FIELDS or getattr(self, key) is None:
            raise KeyError(key)
        return getattr(self, key)

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys())

    def __len__(self) -> int:
        return len(self._keys())

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and key in _FIELDS and getattr(self, key) is not None

    # ---------------------------------------------------------------- conversions
    def to_dict(self) -> dict[str, Any]:
        """The fields that are set, in order, as a plain dict (JSON values)."""
        return {k: getattr(self, k) for k in self._keys()}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ReportSummary:
        """A summary from :meth:`to_dict` (a saved report's record, ``--json``), validated like every summary
        (the types and ranges of :data:`FIELD_RULES`, and counts that fit their totals).

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
        unknown = [k for k in d if k not in _FIELDS]
        if unknown:
            raise OptionError(f"summary keys {unknown[:5]} are not fields of a report summary")
        missing = [
            f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING and f.name not in d
        ]
        if missing:
            raise OptionError(f"summary lacks {missing[:5]}")
        return cls(**dict(d))

    def replace(self, **changes: Any) -> ReportSummary:
        """A copy with some fields changed (the summary itself never changes), validated as :meth:`from_dict` is.

        Raises:
            OptionTypeError / OptionError: as :meth:`from_dict`; a keyword that is not a field.
        """
        unknown = [k for k in changes if k not in _FIELDS]
        if unknown:
            raise OptionError(f"summary keys {unknown[:5]} are not fields of a report summary")
        return dataclasses.replace(self, **changes)

    def __repr__(self) -> str:
        items = []
        for k in _REPR_FIELDS:
            v = getattr(self, k)
            if v is not None:
                items.append(f"{k}={v!r}" if not isinstance(v, float) else f"{k}={v:.4g}")
        return f"ReportSummary({', '.join(items)}; every field: .to_dict())"

    def _repr_html_(self) -> str:
        import html

        cells = [(k, getattr(self, k)) for k in _REPR_FIELDS if getattr(self, k) is not None]
        rows = "".join(
            f"<tr><td>{html.escape(k)}</td><td>{html.escape(f'{v:.4g}' if isinstance(v, float) else str(v))}</td></tr>"
            for k, v in cells
        )
        return (
            f"<div><b>ReportSummary</b> ({len(self)} fields; every one in <code>.to_dict()</code>)"
            f"<table>{rows}</table></div>"
        )


_FIELDS = frozenset(f.name for f in fields(ReportSummary))
_REQUIRED = frozenset(f.name for f in fields(ReportSummary) if f.default is MISSING and f.default_factory is MISSING)

#: What each field of a :class:`ReportSummary` must be (``None`` is "not set" for every optional field):
#: ``"size"`` an int >= 1; ``"count"`` an int >= 0 (``bool`` is not an int, a float is never truncated);
#: ``"P"`` a float in [0, 1] or NaN (a median or maximum of P over no defined value: undefined);
#: ``"fraction"`` a float in [0, 1] or NaN (of nothing: undefined); ``"threshold"`` a finite float in [0, 1];
#: ``"str"``; ``"layers"`` a list of layer indices (ints >= 0); ``"strs"`` a list of str; ``"per_layer"`` a
#: dict {layer index: count}; ``"dict"`` a dict keyed by str.
FIELD_RULES: dict[str, str] = {
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
    "n_closed": "count",
    "frac_closed": "fraction",
    "median_P": "P",
    "n_undefined_P": "count",
    "closed_per_layer": "per_layer",
    "n_scramble_draws": "count",
    "median_P_trained": "P",
    "median_P_scrambled": "P",
    "n_heads_compared": "count",
    "n_heads_beating_scramble": "count",
    "n_heads_q05": "count",
    "frac_beats_scramble": "fraction",
    "n_layers_trained_wins": "count",
    "layers_trained_loses": "layers",
    "n_mismatch_pairs": "count",
    "n_mismatch_closed": "count",
    "mismatch_P_max": "P",
    "mismatch_notes": "strs",
    "n_feasible_layers": "count",
    "infeasible_layers": "layers",
    "processing": "dict",
    "options": "dict",
    "versions": "dict",
    "weights_fingerprint": "str",
    "source": "dict",
    "notes": "strs",
    "algebra": "dict",
    "algebra_ranges_threshold": "threshold",
    "n_layers_resumed": "count",
    "n_params": "count",
}

#: Counts that cannot exceed another field: ``(count, total)``.
_AT_MOST = (
    ("n_attention_layers", "n_layers"),
    ("n_kv_heads", "n_heads_per_layer"),
    ("n_closed", "n_heads"),
    ("n_undefined_P", "n_heads"),
    ("n_heads_compared", "n_heads"),
    ("n_heads_beating_scramble", "n_heads_compared"),
    ("n_heads_q05", "n_heads"),
    ("n_layers_trained_wins", "n_attention_layers"),
    ("n_mismatch_closed", "n_mismatch_pairs"),
    ("n_feasible_layers", "n_attention_layers"),
    ("n_layers_resumed", "n_attention_layers"),
)


def _is_int(v: Any) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, (bool, np.bool_))


def _is_real(v: Any) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, (bool, np.bool_))


def _check_field(name: str, rule: str, v: Any) -> None:
    """One field against its rule of :data:`FIELD_RULES` (raises OptionTypeError / OptionError naming it)."""

    def wrong_type(want: str) -> OptionTypeError:
        return OptionTypeError(f"summary field {name} must be {want}; got {type(v).__name__} {v!r}.")

    if rule == "str":
        if not isinstance(v, str):
            raise wrong_type("a str")
    elif rule in ("size", "count"):
        if not _is_int(v):
            raise wrong_type("an int (not a bool or a float)")
        lo = 1 if rule == "size" else 0
        if v < lo:
            raise OptionError(f"summary field {name}={v!r} is impossible: it must be an int >= {lo}.")
    elif rule in ("P", "fraction", "threshold"):
        if not _is_real(v):
            raise wrong_type("a real number (not a bool or a str)")
        x = float(v)
        if math.isnan(x) and rule != "threshold":
            return  # undefined (over no defined value); the fields that say why are checked with the counts
        if not (math.isfinite(x) and 0.0 <= x <= 1.0):
            what = "a finite number in [0, 1]" if rule == "threshold" else "in [0, 1] (or NaN: undefined)"
            raise OptionError(f"summary field {name}={v!r} is impossible: it must be {what}.")
    elif rule in ("layers", "strs"):
        if not isinstance(v, list):
            raise wrong_type("a list")
        for x in v:
            if rule == "strs" and not isinstance(x, str):
                raise OptionTypeError(f"summary field {name} must be a list of str; it holds {type(x).__name__} {x!r}.")
            if rule == "layers" and not (_is_int(x) and x >= 0):
                raise OptionError(f"summary field {name} must be a list of layer indices (ints >= 0); it holds {x!r}.")
    elif rule == "per_layer":
        if not isinstance(v, dict):
            raise wrong_type("a dict {layer: count}")
        for k, x in v.items():
            if not (_is_int(k) and k >= 0) or not (_is_int(x) and x >= 0):
                raise OptionError(
                    f"summary field {name} must map layer indices (ints >= 0) to counts (ints >= 0); it holds "
                    f"{k!r}: {x!r}."
                )
    elif rule == "dict":
        if not isinstance(v, dict):
            raise wrong_type("a dict")
        bad = [k for k in v if not isinstance(k, str)]
        if bad:
            raise OptionTypeError(f"summary field {name} must be keyed by str; it has the key {bad[0]!r}.")
    else:  # pragma: no cover - a rule this function does not know
        raise AssertionError(rule)


def _validate(s: ReportSummary) -> None:
    """Every field of ``s`` against :data:`FIELD_RULES`, then the counts against their totals.

    Raises:
        OptionTypeError / OptionError: names the first field that is wrong (and the value, or both values).
    """
    for name, rule in FIELD_RULES.items():
        v = getattr(s, name)
        if v is not None or name in _REQUIRED:  # None is "not set", for the fields that may be unset
            _check_field(name, rule, v)
    for count, total in _AT_MOST:
        a, b = getattr(s, count), getattr(s, total)
        if a is not None and b is not None and a > b:
            raise OptionError(f"summary field {count}={a!r} is impossible: more than {total}={b!r}.")
    per_layer = sum(s.closed_per_layer.values())
    if per_layer != s.n_closed:
        raise OptionError(
            f"summary field closed_per_layer counts {per_layer} closed heads, but n_closed={s.n_closed!r}."
        )
    bad_layers = [k for k in s.closed_per_layer if k >= s.n_layers]
    if bad_layers:
        raise OptionError(f"summary field closed_per_layer has layer {bad_layers[0]}, but n_layers={s.n_layers!r}.")
    # NaN exactly when there is nothing to take it over (the counts that say so are named)
    for name, undefined, why in (
        ("frac_closed", s.n_heads == 0, f"n_heads = 0 (here n_heads={s.n_heads!r})"),
        (
            "median_P",
            s.n_undefined_P == s.n_heads,
            f"n_undefined_P = n_heads (here {s.n_undefined_P!r} and {s.n_heads!r})",
        ),
        (
            "frac_beats_scramble",
            s.n_heads_compared == 0,
            f"n_heads_compared = 0 (here n_heads_compared={s.n_heads_compared!r})",
        ),
    ):
        v = getattr(s, name)
        if v is not None and math.isnan(float(v)) != bool(undefined):
            raise OptionError(f"summary field {name}={v!r} is impossible: it is NaN (undefined) exactly when {why}.")


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


def paper_table(summary: Mapping[str, Any], n_layers: int) -> pd.DataFrame:
    """The abstract's headline quantities for this model next to the paper's, as numbers (SPEC 4-5).

    Args:
        summary: a report's summary.
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
    t = summary["threshold"]
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

    row(f"heads with P >= {t:g}", "frac_closed", summary["frac_closed"], summary["n_closed"], summary["n_heads"])
    no_nulls = "not run: make the report with nulls=True / --nulls 64 (orientation scramble + O/V mismatch)"
    if "n_mismatch_pairs" in summary:
        if summary["n_mismatch_pairs"]:
            row(
                f"matched O/V mismatch pairs with P >= {t:g}",
                "mismatch_closed",
                _frac(summary["n_mismatch_closed"], summary["n_mismatch_pairs"]),
                summary["n_mismatch_closed"],
                summary["n_mismatch_pairs"],
            )
        else:
            row(
                f"matched O/V mismatch pairs with P >= {t:g}",
                "mismatch_closed",
                nan,
                0,
                0,
                "; ".join(summary.get("mismatch_notes", ["no valid pair: one kv head (MQA)"])),
            )
    else:
        row(f"matched O/V mismatch pairs with P >= {t:g}", "mismatch_closed", nan, note=no_nulls)
    if "median_P_scrambled" in summary:
        row("median P, trained", "median_P_trained", summary["median_P_trained"], n=summary["n_heads"])
        row(
            "median P, orientation-scrambled",
            "median_P_scrambled",
            summary["median_P_scrambled"],
            n=summary["n_heads_compared"],
        )
        row(
            "heads whose trained orientation beats its scramble median",
            "frac_beats_scramble",
            summary["frac_beats_scramble"],
            summary["n_heads_beating_scramble"],
            summary["n_heads_compared"],
        )
        row(
            "layers where the trained orientation wins (median P)",
            "frac_layers_trained_wins",
            _frac(summary["n_layers_trained_wins"], n_layers),
            summary["n_layers_trained_wins"],
            n_layers,
        )
    else:
        row("median P, trained", "median_P_trained", summary["median_P"], n=summary["n_heads"])
        row("median P, orientation-scrambled", "median_P_scrambled", nan, note=no_nulls)
        row("heads whose trained orientation beats its scramble median", "frac_beats_scramble", nan, note=no_nulls)
        row("layers where the trained orientation wins (median P)", "frac_layers_trained_wins", nan, note=no_nulls)
    if "n_feasible_layers" in summary:
        row(
            f"layers where P >= {t:g} is feasible (constructive search)",
            "frac_layers_feasible",
            _frac(summary["n_feasible_layers"], n_layers),
            summary["n_feasible_layers"],
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
