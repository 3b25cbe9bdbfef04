"""What a report is of, checked in one place: a saved or finished report against the item, source or
options it is taken for.

A report records what it measured: the checkpoint it was read from (its folder or file name) or the
zoo model (``summary.processing``: ``path``, ``zoo_model``), the sha256 fingerprint of every measured
layer's O and V (``layers.fingerprint``, combined into ``summary.weights_fingerprint``), its sizes, its
weight processing (SPEC 10) and its options. :func:`report_mismatch` compares any of these with what
is expected and says what differs, naming both sides; :func:`check_report_matches` raises
:class:`~tl_idempotence.errors.ReportMismatchError` instead. Every reader that takes a report *for*
something uses it: a sweep task deciding whether a saved report still stands for its item
(:func:`tl_idempotence.studies.sweep.saved_report_matches`), :func:`tl_idempotence.studies.sweep.load_sweep`
reading an item's folder back, and every join of a report with a model or with a result made from a model
(:meth:`tl_idempotence.report.result.IdempotenceReport.check_joins`: ``rep.roles``, ``rep.circuit(roles=...)``,
the attention views, ``rep.ablation``), by content (per-layer weight fingerprints), never object identity.

The option comparison (:func:`option_differences`, :func:`compared_options`) and the processing key
(:func:`processing_key`) live here too; :mod:`tl_idempotence.studies.compare` uses them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypedDict

from ..analyses.report_options import report_options
from ..core.options import resolve_layers
from ..core.processing import T_PROCESSING
from ..errors import ReportMismatchError

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd
    from typing_extensions import Unpack

    from ..analyses.report_options import ReportOptions
    from ..core.heads import HeadSource, ModelInfo

__all__ = [
    "Expectations",
    "MeasuredReport",
    "Origin",
    "check_report_matches",
    "compared_options",
    "describe_report",
    "option_differences",
    "origin_of",
    "processing_key",
    "recorded_flags",
    "report_layer_fingerprints",
    "report_mismatch",
]


def compared_options() -> tuple[str, ...]:
    """Options that change the numbers and must agree between reports that are compared or reused: every report
    option of :meth:`ReportOptions.key` but the device (results agree across devices to float64 rounding), then
    ``layers`` (assembled from the registry at each call)."""
    return (*(o.name for o in report_options() if o.in_key and o.name != "device"), "layers")


class MeasuredReport(Protocol):
    """What the identity check reads of a report (an :class:`~tl_idempotence.report.report.IdempotenceReport`):
    named by attributes, so that this module, which the report's attention views use, never imports the report."""

    @property
    def summary(self) -> Any: ...  # a Mapping[str, Any]: model_name, processing, weights_fingerprint

    @property
    def options(self) -> ReportOptions: ...

    @property
    def info(self) -> ModelInfo: ...

    @property
    def layers(self) -> pd.DataFrame: ...  # with the per-layer ``fingerprint``


@dataclass(frozen=True)
class Origin:
    """Where a report's weights were read from, as the report records it.

    Attributes:
        kind: ``"checkpoint"`` (a checkpoint folder or file, by its name) or ``"zoo model"`` (by the zoo's name).
        name: the folder or file name (``summary.processing["path"]``; never a machine path), or the zoo name.
    """

    kind: str
    name: str

    def __str__(self) -> str:
        return f"{self.kind} {self.name!r}"


def origin_of(summary: Mapping[str, Any]) -> Origin | None:
    """The :class:`Origin` a summary (or ``{"processing": info.processing}`` of a source) records: the zoo
    model when it names one, else the checkpoint folder or file name; None when it records neither (a model
    object, ``LayerHeads``, a transformers model)."""
    proc = summary.get("processing") or {}
    zoo = proc.get("zoo_model")
    if isinstance(zoo, str) and zoo:
        return Origin("zoo model", zoo)
    path = proc.get("path")
    if isinstance(path, str) and path:
        return Origin("checkpoint", path)
    return None


def recorded_flags(summary: Mapping[str, Any], names: Sequence[str]) -> tuple[bool | None, ...]:
    """The processing flags ``names`` as a summary's ``processing`` records them: each a bool, or ``None`` where
    the source does not record it. Raises nothing."""
    proc = summary.get("processing") or {}
    return tuple(None if proc.get(k) is None else bool(proc.get(k)) for k in names)


def processing_key(summary: Mapping[str, Any]) -> tuple[bool, ...]:
    """The processing flags that change T (SPEC 10) as a tuple: ``raw`` then
    :data:`~tl_idempotence.core.processing.T_PROCESSING` without it; a flag a source does not record counts
    as not applied."""
    raw, *recorded = recorded_flags(summary, T_PROCESSING)
    flags = tuple(bool(f) for f in recorded)
    return (bool(raw) if raw is not None else not any(flags), *flags)


def _option_values(opts: ReportOptions) -> dict[str, Any]:
    key = opts.key()
    out = {k: key[k] for k in compared_options() if k != "layers"}
    out["layers"] = None if opts.layers is None else sorted(opts.layers)
    return out


def option_differences(have: ReportOptions, want: ReportOptions) -> dict[str, tuple[Any, Any]]:
    """``{option: (have, want)}`` for the :func:`compared_options` that differ (the device is not compared:
    results agree across devices to float64 rounding)."""
    a, b = _option_values(have), _option_values(want)
    return {k: (a[k], b[k]) for k in compared_options() if a[k] != b[k]}


def describe_report(report: MeasuredReport) -> str:
    """A report in words for messages: its model name, origin and weights fingerprint (first 12 hex digits),
    e.g. ``"'ckB' (checkpoint 'ckB', weights sha256 0a1b2c3d4e5f)"``."""
    s = report.summary
    parts = []
    origin = origin_of(s)
    if origin is not None:
        parts.append(str(origin))
    fp = s.get("weights_fingerprint")
    if isinstance(fp, str):
        parts.append(f"weights sha256 {fp[:12]}")
    return f"{str(s.get('model_name', '?'))!r}" + (f" ({', '.join(parts)})" if parts else "")


def _sizes_text(have: Any, want: Any) -> str:
    return ", ".join(
        f"{k} {getattr(have, k)} vs {getattr(want, k)}"
        for k in ("n_layers", "n_heads", "n_kv_heads", "d_model", "d_head")
        if getattr(have, k) != getattr(want, k)
    )


def _processing_text(summary: Mapping[str, Any]) -> str:
    key = processing_key(summary)
    names = [k for k in T_PROCESSING if k != "raw"]
    on = [n for n, v in zip(names, key[1:]) if v]
    return "raw weights" if key[0] and not on else ("+".join(on) or "none")


def report_layer_fingerprints(report: MeasuredReport) -> dict[int, str] | str:
    """``{layer: sha256}`` of every layer the report measured (its ``layers.fingerprint``), or the reason it has
    none to compare (a report that records no fingerprint of a layer cannot be joined by content).

    Raises: nothing.
    """
    layers = report.layers
    if "fingerprint" not in layers.columns:
        return "the report records no weight fingerprints (make the report again)"
    out: dict[int, str] = {}
    for layer, fp in zip(layers["layer"].tolist(), layers["fingerprint"].tolist()):
        if not isinstance(fp, str) or not fp:
            return f"the report records no weight fingerprint of layer {int(layer)} (make the report again)"
        out[int(layer)] = fp
    return out


def _fingerprints_differ(saved: Mapping[int, str], current: Any, whose: str) -> str | None:
    """The first measured layer whose fingerprint ``current(layer)`` is not the report's ``saved[layer]``, in
    words; None when every one is equal. ``current`` returns None for a layer it has no fingerprint of."""
    for layer in sorted(saved):
        have = current(layer)
        if have is None:
            return f"{whose} record no weight fingerprint of layer {layer}, which the report measured"
        if have != saved[layer]:
            return f"layer {layer}'s attention weights differ (weight fingerprint)"
    return None


class Expectations(TypedDict, total=False):
    """The keyword expectations of :func:`report_mismatch`, for :func:`check_report_matches`'s ``**expected``."""

    origin: Origin | None
    fingerprint: str | None
    options: ReportOptions | None
    source: HeadSource | None
    processing_may_differ: bool
    info: ModelInfo | None
    fingerprints: Mapping[int, str] | None


def report_mismatch(
    report: MeasuredReport,
    *,
    origin: Origin | None = None,
    fingerprint: str | None = None,
    options: ReportOptions | None = None,
    source: HeadSource | None = None,
    processing_may_differ: bool = False,
    info: ModelInfo | None = None,
    fingerprints: Mapping[int, str] | None = None,
) -> str | None:
    """Why ``report`` is not a report of what is expected — or None when every given expectation holds.

    Each argument is one expectation, checked in this order (the first that fails is the answer):

    * ``origin``: the checkpoint (folder or file name) or zoo model the report must record (:func:`origin_of`);
    * ``fingerprint``: the combined weights fingerprint it must record (``summary.weights_fingerprint``);
    * ``options``: the options it must have been made with (:func:`option_differences`, and the device type);
    * ``source``: a head source the report must have measured: the same sizes, the same weight processing
      (``processing_may_differ=True``: a source processed otherwise cannot be compared byte for byte and is
      accepted), with ``options`` the same measured layers, and every measured layer's current O/V sha256
      fingerprint (:meth:`~tl_idempotence.core.heads.LayerHeads.fingerprint`, read from ``source`` now,
      stopping at the first that differs) equal to the one the report records;
    * ``info``: what a result made from a model records of it (a :class:`~tl_idempotence.probes.roles.HeadRoles`'
      ``info``, which keeps no weights): the same sizes and the same weight processing (``processing_may_differ``
      does not apply: a score of weights processed otherwise is another number);
    * ``fingerprints``: ``{layer: sha256}`` of the attention weights another result was computed from (a
      ``HeadRoles``' ``layer_fingerprints``): every layer the report measured must be there with the fingerprint
      the report records (content, never object identity: a model edited in place after the report was made has
      other fingerprints).

    The weights are compared by the same element-by-element comparison of per-layer fingerprints
    (:func:`report_layer_fingerprints` against ``source``'s current layers or the ``fingerprints`` recorded), the
    one path of every join of a report with a model or with a result made from a model.

    Names of models are never compared (a checkpoint folder and a TransformerLens model of the same weights
    carry different names): ``origin`` compares what the report says it was read from.

    Args:
        report: the report (an :class:`~tl_idempotence.report.report.IdempotenceReport`, e.g. from ``load_report``).
        origin, fingerprint, options, source, processing_may_differ, info, fingerprints: the expectations (None:
            not checked).

    Returns:
        None, or a short reason naming both sides, e.g. ``"the report was measured from checkpoint 'ckB', not
        from checkpoint 'ckA'"``, ``"options differ: threshold 0.9 -> 0.5"`` (the report's, then the one expected),
        ``"model sizes differ: n_layers 3 vs 2"``, ``"layer 2's attention weights differ (weight fingerprint)"``.

    Raises:
        Whatever reading a layer of ``source`` raises (its own errors name the file).
    """
    s = report.summary
    if origin is not None:
        have = origin_of(s)
        if have != origin:
            shown = have or "a model object (no checkpoint recorded)"
            return f"the report was measured from {shown}, not from {origin}"
    if fingerprint is not None:
        have_fp = s.get("weights_fingerprint")
        if have_fp != fingerprint:
            shown = have_fp[:12] if isinstance(have_fp, str) else "none recorded"
            return f"the report's weights fingerprint is {shown}, not {fingerprint[:12]}"
    if options is not None:
        diff = option_differences(report.options, options)
        if report.options.device.type != options.device.type:
            diff["device"] = (report.options.device.type, options.device.type)
        if diff:
            return "options differ: " + ", ".join(f"{k} {a!r} -> {b!r}" for k, (a, b) in diff.items())
    if info is not None:
        if info.sizes != report.info.sizes:
            return f"model sizes differ: {_sizes_text(report.info, info)}"
        if processing_key({"processing": info.processing}) != processing_key(s):
            theirs = _processing_text({"processing": info.processing})
            return f"weight processing differs: {_processing_text(s)} vs {theirs}"
    if fingerprints is not None:
        saved_fp = report_layer_fingerprints(report)
        if isinstance(saved_fp, str):
            return saved_fp
        recorded = dict(fingerprints)
        why = _fingerprints_differ(saved_fp, recorded.get, "the roles")
        if why is not None:
            return why
    if source is None:
        return None
    info = source.info
    if info.sizes != report.info.sizes:
        return f"model sizes differ: {_sizes_text(report.info, info)}"
    if processing_key({"processing": info.processing}) != processing_key(s):
        return None if processing_may_differ else "weight processing differs"
    saved = report_layer_fingerprints(report)
    if isinstance(saved, str):
        return saved
    if options is not None:
        want = resolve_layers(options.layers, list(source.layers()))
        if sorted(want) != sorted(saved):
            return f"measured layers differ: {sorted(saved)} -> {sorted(want)}"
    return _fingerprints_differ(saved, lambda layer: source.layer_heads(layer).fingerprint(), "the model")


def check_report_matches(
    report: MeasuredReport,
    *,
    what: str,
    fix: str,
    **expected: Unpack[Expectations],
) -> None:
    """:func:`report_mismatch`, raising when it finds a difference.

    Args:
        report: the report.
        what: the expected side in words, for the message (e.g. ``"The model given, 'gpt2' (HookedTransformer),"``).
        fix: what to do, for the message.
        expected: the expectations, as for :func:`report_mismatch` (:class:`Expectations`).

    Raises:
        ReportMismatchError: ``"{what} is not the model this report measured ({the report}): {reason}. {fix}"``.
    """
    why = report_mismatch(report, **expected)
    if why is not None:
        raise ReportMismatchError(
            f"{what} is not the model this report measured ({describe_report(report)}): {why}. {fix}"
        )
