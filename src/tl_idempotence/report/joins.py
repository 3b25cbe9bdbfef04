"""The probes joined to the report, registered once, in order (each declared beside its code: :mod:`.join_spec`).

Each entry is a join's :class:`~tl_idempotence.report.join_spec.JoinSpec` (from its torch-free
``report/<name>_spec.py``), added by :func:`register_join`, which refuses a join whose name or command-line flag
another one already has. Everything that names the joins is assembled from this list, in its order: the report's
methods (``rep.roles``, ``rep.mechanism``, ``rep.circuit``, ``rep.ablation``, ``rep.causal``,
``rep.show_attention``: thin calls of their declarations, and
:meth:`~tl_idempotence.report.report.IdempotenceReport.join` for any registered join), the page's sections
(:func:`page_sections`), the JSON export's records and the exports' per-head columns
(:func:`~tl_idempotence.report.export.export_record`, :func:`~tl_idempotence.report.export.report_output`, both
taking a ``joins`` mapping of join name -> result), the command line's flags and what ``report`` computes for them
(``cli/parser.py``, ``cli/report_command.py``) and the notebook displays a join brings
(:data:`~tl_idempotence.core.results.DISPLAYS`).

To add a joined probe: its module (the probe and its result type) and its declaration (a ``JoinSpec``), then one
:func:`register_join` line (here for the package's own; anywhere for a user's). docs/architecture.md, "Where to add
a joined probe". Imports no torch and no pandas (the command line's ``--help`` reads it).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from ..core.kwargs import by_name
from ..core.results import register_display
from ..errors import OptionError, RegistrationError
from .ablation_spec import ABLATION
from .attention_spec import ATTENTION
from .causal_spec import CAUSAL
from .join_spec import JoinSpec
from .mechanism_spec import MECHANISM
from .roles_spec import CIRCUIT, ROLES

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

__all__ = ["JOINS", "join_spec", "joined", "joined_heads", "page_sections", "register_join"]

#: The joins in the order their sections, records and columns appear (and their flags in ``--help``).
JOINS: tuple[JoinSpec, ...] = ()


def register_join(spec: JoinSpec) -> JoinSpec:
    """Add ``spec`` to :data:`JOINS` (after the others) and its notebook display, if it brings one, to the display
    registry; returns ``spec``. Nothing is added when it is refused.

    Raises:
        RegistrationError: not a :class:`~tl_idempotence.report.join_spec.JoinSpec`; its name or flag is another
            join's (names both); its display kind is drawn by another function.
    """
    global JOINS
    if not isinstance(spec, JoinSpec):
        raise RegistrationError(f"register_join() takes a JoinSpec; got {type(spec).__name__}.")
    clashes = [f"its name {spec.name!r} belongs to join {s.name!r}" for s in JOINS if s.name == spec.name]
    if spec.cli is not None:
        clashes += [
            f"its flag {spec.cli.flag} belongs to join {s.name!r}"
            for s in JOINS
            if s.cli is not None and s.cli.dest == spec.cli.dest
        ]
    if clashes:
        raise RegistrationError(f"cannot register join {spec.name!r}: " + "; ".join(clashes) + ".")
    if spec.display is not None:
        register_display(spec.display_kind, spec.display)
    JOINS = (*JOINS, spec)
    return spec


for _spec in (ATTENTION, ROLES, MECHANISM, CIRCUIT, ABLATION, CAUSAL):
    register_join(_spec)
del _spec


def join_spec(name: str) -> JoinSpec:
    """The registered join called ``name``.

    Raises:
        OptionError: no such join (names the registered ones).
    """
    return by_name(JOINS, name, lambda names: OptionError(f"no join {name!r}; registered: {names}."))


def joined(rep: Any, joins: Mapping[str, Any] | None = None, **legacy: Any) -> dict[str, Any]:
    """The joins given for ``rep``'s page or exports, by name in registry order, each checked as this report's by its
    declaration (``fits``: a result of another report is refused, never joined to the wrong heads by label).

    ``legacy``: the keywords of before the joins were declared (``roles=``, ``mechanism=``, ``attention=``), merged
    with ``joins``; None values are dropped.

    Raises:
        OptionTypeError: ``joins`` is not a mapping. OptionError: an unknown join (names the registered ones), a join
            with no page or export, a join given twice; the errors of each join's ``fits``.
    """
    from ..errors import OptionTypeError

    if joins is not None and not isinstance(joins, Mapping):
        raise OptionTypeError(f"joins must be a mapping of join name -> result; got {type(joins).__name__}.")
    given = {k: v for k, v in dict(joins or {}).items() if v is not None}
    for k, v in legacy.items():
        if v is not None:
            if k in given:
                raise OptionError(f"join {k!r} is given twice (by its own keyword and in joins=): give it once.")
            given[k] = v
    names = [s.name for s in JOINS]
    unknown = [k for k in given if k not in names]
    if unknown:
        raise OptionError(f"unknown join(s) {unknown}: the registered joins are {names}.")
    out: dict[str, Any] = {}
    for s in JOINS:
        if s.name in given:
            if s.fits is None:
                raise OptionError(f"join {s.name!r} ({s.call}) has no page section or export to add.")
            out[s.name] = s.fits(rep, given[s.name])
    return out


def _items(joins: Mapping[str, Any]) -> Iterator[tuple[JoinSpec, Any]]:
    """``(spec, value)`` of the checked ``joins`` (:func:`joined`), in registry order."""
    for s in JOINS:
        if s.name in joins:
            yield s, joins[s.name]


def page_sections(rep: Any, joins: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The page's sections of the checked ``joins`` (:func:`joined`), in registry order (the views draw them:
    :func:`~tl_idempotence.views.page.report_html`'s ``sections``). Runs what a section runs (the attention view)."""
    return [s.page(rep, v) for s, v in _items(joins) if s.page is not None]


def records(joins: Mapping[str, Any]) -> dict[str, Any]:
    """``{name: record}`` of the checked ``joins`` that add one to the JSON export, in registry order."""
    return {s.name: s.record(v) for s, v in _items(joins) if s.record is not None}


def joined_heads(heads: pd.DataFrame, joins: Mapping[str, Any]) -> tuple[pd.DataFrame, list[str]]:
    """``heads`` with the per-head columns of the checked ``joins`` joined on the head label (each join's columns
    that ``heads`` does not have yet; NaN for a head a join did not cover), and the names of every join's columns in
    order without repeats (what the JSON export's ``closed_heads`` lists after the report's own)."""
    added: list[str] = []
    for s, v in _items(joins):
        if s.columns is None:
            continue
        frame = s.columns(v)
        heads = heads.join(frame[[c for c in frame.columns if c not in heads.columns]])
        added += [c for c in frame.columns if c not in added]
    return heads, added
