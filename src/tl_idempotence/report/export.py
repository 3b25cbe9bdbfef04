"""What a report is written as: its JSON export, its heads table with the label first (and the role columns), its
page and its save format, as one :class:`~tl_idempotence.core.outputs.Output` (:func:`report_output`) that the
output registry's writers (:mod:`tl_idempotence.core.outputs`) write by the target's extension: ``rep.save``,
``rep.save_html``, ``rep.export`` and the CLI's ``--out``/``--json``/``--csv``."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ..core.outputs import Output
from ..core.readings import report_headline
from .store import ReportRecord, write_record

if TYPE_CHECKING:  # pragma: no cover
    from collections.abc import Mapping

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


#: The per-head columns of the JSON export's ``closed_heads`` (those the report has), after the head's label.
EXPORT_HEAD_COLUMNS = (
    "layer",
    "head",
    "kv_head",
    "alpha",
    "P",
    "P_scrambled_median",
    "p_value",
    "q_value",
    "scramble_effect",
    "P_searched",
)


#: The role columns a report's exports add with ``roles`` (the CLI's ``--roles``: ``--csv`` and ``--json``).
EXPORT_ROLE_COLUMNS = ("previous_token", "duplicate_token", "induction", "copying")


def heads_with_roles(heads: pd.DataFrame, roles: RoleAssociation | None) -> pd.DataFrame:
    """``heads`` with the :data:`EXPORT_ROLE_COLUMNS` of ``roles`` (a ``rep.roles(...)`` of the same report)
    joined on the head label; ``heads`` itself without roles."""
    return heads if roles is None else heads.join(roles.table[list(EXPORT_ROLE_COLUMNS)])


def heads_with_mechanism(heads: pd.DataFrame, mechanism: Mechanism | None) -> pd.DataFrame:
    """``heads`` with the mechanism columns (:data:`~tl_idempotence.report.mechanism.EXPORT_MECHANISM_COLUMNS`
    that ``heads`` does not have yet: the role export's ``copying`` is the same score) joined on the head label
    (NaN for a head the mechanism did not join); ``heads`` itself without one."""
    if mechanism is None:
        return heads
    from .mechanism import mechanism_columns

    m = mechanism_columns(mechanism)
    return heads.join(m[[c for c in m.columns if c not in heads.columns]])


def export_record(
    rep: WrittenReport, roles: RoleAssociation | None = None, mechanism: Mechanism | None = None
) -> dict[str, Any]:
    """The report's JSON export (``.json`` outputs and the CLI's ``--json``): ``{"headline": rep.headline (closed
    count and scramble q count in separate clauses), "summary": rep.summary,
    "closed_heads": [{"label": "L10H8", "layer": .., "head": .., "alpha": .., "P": .., ...}, ...]}``, closed heads
    highest P first, with the :data:`EXPORT_HEAD_COLUMNS` the report has; with ``roles`` (``rep.roles(...)``) also
    their :data:`EXPORT_ROLE_COLUMNS` and ``"roles": {"headline", "summary", "association": [one record per role]}``.
    ``p_value`` and ``q_value`` test trained vs Haar-scrambled orientation with the same spectra (not closure);
    ``scramble_effect`` is ``log10(P / P_scrambled_median)`` (docs/definitions.md).
    Written under the export NaN policy (:data:`~tl_idempotence.core.jsonio.EXPORT`: NaN as ``null``).

    With ``mechanism`` (``rep.mechanism(...)``) also its per-head columns and ``"mechanism": {"summary", "signs"}``
    (:func:`~tl_idempotence.report.mechanism.mechanism_record`).

    Raises:
        OptionError / OptionTypeError: ``roles`` or ``mechanism`` not joined with this report
            (:func:`~tl_idempotence.report.roles.check_roles_fit_report`,
            :func:`~tl_idempotence.report.mechanism.check_mechanism_fits_report`)."""
    if roles is not None:
        from .roles import check_roles_fit_report

        check_roles_fit_report(rep.heads, rep.threshold, roles)
    if mechanism is not None:
        from .mechanism import check_mechanism_fits_report

        check_mechanism_fits_report(rep.heads, rep.threshold, mechanism)
    cols = [c for c in EXPORT_HEAD_COLUMNS if c in rep.heads.columns]
    cols += list(EXPORT_ROLE_COLUMNS) if roles is not None else []
    closed_heads = heads_with_mechanism(heads_with_roles(rep.closed_heads, roles), mechanism)
    if mechanism is not None:
        from .mechanism import EXPORT_MECHANISM_COLUMNS

        cols += [c for c in EXPORT_MECHANISM_COLUMNS if c in closed_heads.columns and c not in cols]
    closed = [{"label": lab, **{c: row[c] for c in cols}} for lab, row in closed_heads.iterrows()]
    out: dict[str, Any] = {"headline": report_headline(rep.summary, rep.threshold), "summary": rep.summary}
    out["closed_heads"] = closed
    if roles is not None:
        out["roles"] = {
            "headline": roles.headline,
            "summary": roles.summary,
            "association": [{"role": r, **row.to_dict()} for r, row in roles.association.iterrows()],
        }
    if mechanism is not None:
        from .mechanism import mechanism_record

        out["mechanism"] = mechanism_record(mechanism)
    return out


def report_output(
    rep: WrittenReport,
    *,
    attention_text: str | None = None,
    model: TLModel | None = None,
    attention_heads: HeadPairs | None = None,
    top_k: IntLike | None = None,
    max_tokens: IntLike = 64,
    roles: RoleAssociation | None = None,
    mechanism: Mechanism | None = None,
) -> Output:
    """What a report can be written as (:class:`~tl_idempotence.core.outputs.Output`): its page (with an
    attention section on ``attention_text``: the probe runs ``model``, the view draws; with ``roles``, the section
    "What the closed heads do"), its JSON export (:func:`export_record`), its ``heads`` table with the label first
    (and the role columns with ``roles``), and the save format (:meth:`IdempotenceReport.save`). Nothing is
    rendered or run until a writer asks; ``roles`` is checked against the report here, before any of it
    (:func:`~tl_idempotence.report.roles.check_roles_fit_report`: roles of another report are refused, never
    joined to the wrong heads by label)."""
    if roles is not None:
        from .roles import check_roles_fit_report

        check_roles_fit_report(rep.heads, rep.threshold, roles)
    if mechanism is not None:  # with ``mechanism`` the page's section "What the closed heads do to tokens"
        from .mechanism import check_mechanism_fits_report

        check_mechanism_fits_report(rep.heads, rep.threshold, mechanism)

    def page() -> str:
        extra = []
        if attention_text is not None:
            from .attention import attention_section_html

            extra.append(
                attention_section_html(
                    rep, attention_text, model=model, heads=attention_heads, top_k=top_k, max_tokens=max_tokens
                )
            )
        more = {} if mechanism is None else {"mechanism": mechanism}
        from ..views import report_html

        return str(report_html(rep, extra_html=extra, roles=roles, **more))

    def folder(path: Path, overwrite: bool) -> Path:
        rec = ReportRecord(
            heads=rep.heads,
            layers=rep.layers,
            tables=dict(rep.tables),
            summary=rep.summary,
            info=rep.info,
            options=rep.options,
        )
        return write_record(rec, path, overwrite=overwrite)

    return Output(
        what="report",
        inputs=rep.inputs,
        page=page,
        record=lambda: export_record(rep, roles, mechanism),
        table=lambda: heads_with_mechanism(heads_with_roles(rep.heads, roles), mechanism).reset_index(names="label"),
        folder=folder,
    )
