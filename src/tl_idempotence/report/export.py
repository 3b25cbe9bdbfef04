"""What a report is written as: its JSON export, its heads table with the label first (and the joins' per-head
columns), its page and its save format, as one :class:`~tl_idempotence.core.outputs.Output` (:func:`report_output`)
that the output registry's writers (:mod:`tl_idempotence.core.outputs`) write by the target's extension:
``rep.save``, ``rep.save_html``, ``rep.export`` and the CLI's ``--out``/``--json``/``--csv``. What the joined probes
add (their sections, records and columns) comes from their declarations (:mod:`tl_idempotence.report.joins`)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ..core.outputs import Output
from ..core.readings import CLOSED_HEAD_COLUMNS, report_headline
from .attention_spec import ATTENTION, AttentionRequest
from .join_defaults import EXPORT_ROLE_COLUMNS
from .joins import joined, joined_heads, page_sections, records
from .store import ReportRecord, write_record

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

    from ..analyses.report_options import ReportOptions
    from ..core.heads import ModelInfo
    from ..core.hints import HeadPairs, IntLike, TLModel
    from .mechanism import Mechanism
    from .roles import RoleAssociation
    from .summary import ReportSummary

__all__ = [
    "EXPORT_HEAD_COLUMNS",
    "EXPORT_ROLE_COLUMNS",
    "export_record",
    "heads_with_mechanism",
    "heads_with_roles",
    "report_output",
]


class WrittenReport(Protocol):
    """What the writers read of a report (an :class:`~tl_idempotence.report.report.IdempotenceReport`)."""

    @property
    def heads(self) -> pd.DataFrame: ...
    @property
    def closed_heads(self) -> pd.DataFrame: ...
    @property
    def layers(self) -> pd.DataFrame: ...
    @property
    def tables(self) -> Mapping[str, pd.DataFrame]: ...
    @property
    def threshold(self) -> float: ...
    @property
    def inputs(self) -> tuple[tuple[str, Path], ...]: ...

    summary: ReportSummary
    info: ModelInfo
    options: ReportOptions


#: The attention section's default cut of its text (the attention join's declared ``max_tokens``).
_ATTENTION_MAX_TOKENS = ATTENTION.option("max_tokens").default

#: The per-head columns of the JSON export's ``closed_heads`` (those the report has), after the head's label.
EXPORT_HEAD_COLUMNS = (*CLOSED_HEAD_COLUMNS, "q_value", "scramble_effect", "P_searched")


def heads_with_roles(heads: pd.DataFrame, roles: RoleAssociation | None) -> pd.DataFrame:
    """``heads`` with the :data:`EXPORT_ROLE_COLUMNS` of ``roles`` (a ``rep.roles(...)`` of the same report)
    joined on the head label; ``heads`` itself without roles (the roles join's ``columns``, :mod:`.roles_spec`)."""
    return heads if roles is None else joined_heads(heads, {"roles": roles})[0]


def heads_with_mechanism(heads: pd.DataFrame, mechanism: Mechanism | None) -> pd.DataFrame:
    """``heads`` with the mechanism columns (:data:`~tl_idempotence.report.mechanism_spec.EXPORT_MECHANISM_COLUMNS`
    that ``heads`` does not have yet: the role export's ``copying`` is the same score) joined on the head label
    (NaN for a head the mechanism did not join); ``heads`` itself without one."""
    return heads if mechanism is None else joined_heads(heads, {"mechanism": mechanism})[0]


def export_record(
    rep: WrittenReport,
    roles: RoleAssociation | None = None,
    mechanism: Mechanism | None = None,
    *,
    joins: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The report's JSON export (``.json`` outputs and the CLI's ``--json``): ``{"headline": rep.headline (closed
    count and scramble q count in separate clauses), "summary": rep.summary,
    "closed_heads": [{"label": "L10H8", "layer": .., "head": .., "alpha": .., "P": .., ...}, ...]}``, closed heads
    highest P first, with the :data:`EXPORT_HEAD_COLUMNS` the report has; then, for each join given (``joins``: join
    name -> result, :mod:`tl_idempotence.report.joins`, in its registry order), the per-head columns it declares
    after those and its record under its name. With ``roles`` (``rep.roles(...)``): their
    :data:`EXPORT_ROLE_COLUMNS` and ``"roles": {"headline", "summary", "association": [one record per role]}``; with
    ``mechanism`` (``rep.mechanism(...)``): its per-head columns and ``"mechanism": {"summary", "signs"}``
    (:func:`~tl_idempotence.report.mechanism.mechanism_record`).
    ``p_value`` and ``q_value`` test trained vs Haar-scrambled orientation with the same spectra (not closure);
    ``scramble_effect`` is ``log10(P / P_scrambled_median)`` (docs/definitions.md).
    Written under the export NaN policy (:data:`~tl_idempotence.core.jsonio.EXPORT`: NaN as ``null``).

    Raises:
        OptionError / OptionTypeError: a join not joined with this report
            (:func:`~tl_idempotence.report.roles.check_roles_fit_report`,
            :func:`~tl_idempotence.report.mechanism.check_mechanism_fits_report`); an unknown join."""
    return _export(rep, joined(rep, joins, roles=roles, mechanism=mechanism))


def _export(rep: WrittenReport, joins: Mapping[str, Any]) -> dict[str, Any]:
    """:func:`export_record` of the checked ``joins`` (:func:`~tl_idempotence.report.joins.joined`)."""
    cols = [c for c in EXPORT_HEAD_COLUMNS if c in rep.heads.columns]
    closed_heads, added = joined_heads(rep.closed_heads, joins)
    cols += [c for c in added if c not in cols]
    closed = [{"label": lab, **{c: row[c] for c in cols}} for lab, row in closed_heads.iterrows()]
    out: dict[str, Any] = {"headline": report_headline(rep.summary, rep.threshold), "summary": rep.summary}
    out["closed_heads"] = closed
    return {**out, **records(joins)}


def report_output(
    rep: WrittenReport,
    *,
    joins: Mapping[str, Any] | None = None,
    attention_text: str | None = None,
    model: TLModel | None = None,
    attention_heads: HeadPairs | None = None,
    top_k: IntLike | None = None,
    max_tokens: IntLike = _ATTENTION_MAX_TOKENS,
    roles: RoleAssociation | None = None,
    mechanism: Mechanism | None = None,
) -> Output:
    """What a report can be written as (:class:`~tl_idempotence.core.outputs.Output`): its page (the report's own
    sections, then each join's section in registry order), its JSON export (:func:`export_record`), its ``heads``
    table with the label first (and the joins' per-head columns), and the save format
    (:meth:`IdempotenceReport.save`). Nothing is rendered or run until a writer asks; the joins are checked against
    the report here, before any of it (each declaration's ``fits``: a result of another report is refused, never
    joined to the wrong heads by label).

    Args:
        rep: the report.
        joins: join name -> result (:mod:`tl_idempotence.report.joins`): ``"roles"`` (``rep.roles(...)``: the
            section "What the closed heads do"), ``"mechanism"`` (``rep.mechanism(...)``), ``"attention"`` (a text
            or an :class:`~tl_idempotence.report.attention_spec.AttentionRequest`: the attention section, the probe
            runs the model when the page is rendered), or a registered join's.
        attention_text, model, attention_heads, top_k, max_tokens: the attention section (as ``joins``'
            ``"attention"``: the text, the model it runs, the heads, their cap, the text's cut).
        roles, mechanism: as ``joins``' ``"roles"`` and ``"mechanism"``.
    """
    request = None
    if attention_text is not None:
        request = AttentionRequest(attention_text, model, attention_heads, top_k, max_tokens)
    checked = joined(rep, joins, attention=request, roles=roles, mechanism=mechanism)

    def page() -> str:
        sections = page_sections(rep, checked)
        from ..views import report_html

        return str(report_html(rep, sections=sections))

    def folder(path: Path, overwrite: bool) -> Path:
        return write_record(ReportRecord.of(rep), path, overwrite=overwrite)

    return Output(
        what="report",
        inputs=rep.inputs,
        page=page,
        record=lambda: _export(rep, checked),
        table=lambda: joined_heads(rep.heads, checked)[0].reset_index(names="label"),
        folder=folder,
    )
