"""The analyses the report runs, registered once, in order (each declared beside its code: :mod:`.spec`).

Each entry is an analysis's :class:`~tl_idempotence.analyses.spec.AnalysisSpec` (from its torch-free
``<name>_spec.py``), added by :func:`register`, which refuses an analysis whose name, option, head column or summary
field another one already has. Everything that names the analyses or their options is assembled from this list:
the report options (:mod:`~tl_idempotence.analyses.report_options`: :class:`~tl_idempotence.analyses.
report_options.ReportOptions`' validation and defaults, the CLI's report flags, the options paragraph of every
entry point's docstring), ``compare``'s and the sweeps' compared options
(:func:`~tl_idempotence.report.identity.compared_options`), the report loop (:func:`report_analyses`), the report
summary's per-analysis records and the threshold-dependent outputs (:func:`threshold_rules`).

To add an analysis: its module (the ``Analysis`` class) and its declaration (an ``AnalysisSpec`` with its option,
head columns, summary record and a factory that imports its class), then one ``register`` line here and its
typed option in :class:`~tl_idempotence.analyses.report_options.ReportOptions`. Imports no torch (the CLI's
``--help`` reads it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..core.option_specs import GENERAL_OPTIONS, OptionSpec
from ..errors import RegistrationError
from . import algebra_spec, closure_spec, mismatch_spec, scramble_spec, search_spec
from .spec import AnalysisSpec

if TYPE_CHECKING:  # pragma: no cover
    from .base import Analysis
    from .threshold import ThresholdRule

__all__ = ["ANALYSES", "analysis_options", "register", "report_analyses", "spec_of", "threshold_rules"]

#: The report's analyses in the order their columns appear (closure first), as :func:`register` adds them.
ANALYSES: tuple[AnalysisSpec, ...] = ()


def _owners(specs: Sequence[AnalysisSpec]) -> dict[tuple[str, str], str]:
    """``{(what, name): owner}`` of every name taken: analyses, options (the report's own too), head columns and
    summary fields."""
    taken = {("option", o.name): "the report's own options" for o in GENERAL_OPTIONS}
    for s in specs:
        owner = f"analysis {s.name!r}"
        taken[("name", s.name)] = owner
        taken.update({("option", o.name): owner for o in s.options})
        taken.update({("head column", c): owner for c in s.head_columns})
        taken.update({("summary field", f): owner for f in (s.summary.rules() if s.summary is not None else ())})
    return taken


def register(spec: AnalysisSpec) -> AnalysisSpec:
    """Add ``spec`` to :data:`ANALYSES` (after the others), refusing a name that is taken.

    Returns ``spec``. Nothing is added when it is refused.

    Raises:
        RegistrationError: its name, one of its options, head columns or summary fields is already another
            analysis's (or a report option's): the message names the name and both owners.
        TypeError: not an :class:`~tl_idempotence.analyses.spec.AnalysisSpec`.
    """
    global ANALYSES
    if not isinstance(spec, AnalysisSpec):
        raise TypeError(f"register() takes an AnalysisSpec; got {type(spec).__name__}.")
    taken = _owners(ANALYSES)
    mine = [("name", spec.name)]
    mine += [("option", o.name) for o in spec.options]
    mine += [("head column", c) for c in spec.head_columns]
    mine += [("summary field", f) for f in (spec.summary.rules() if spec.summary is not None else ())]
    clashes = [f"its {what} {name!r} belongs to {taken[(what, name)]}" for what, name in mine if (what, name) in taken]
    if clashes:
        raise RegistrationError(f"cannot register analysis {spec.name!r}: " + "; ".join(clashes) + ".")
    ANALYSES = (*ANALYSES, spec)
    return spec


for _spec in (closure_spec.SPEC, scramble_spec.SPEC, mismatch_spec.SPEC, search_spec.SPEC, algebra_spec.SPEC):
    register(_spec)
del _spec


def analysis_options() -> tuple[OptionSpec, ...]:
    """The options the registered analyses declare, in registry order (read at each call)."""
    return tuple(o for s in ANALYSES for o in s.options)


def report_analyses() -> tuple[Analysis, ...]:
    """The registered analyses' objects, in order (each imported on first use: this imports torch)."""
    return tuple(s.analysis() for s in ANALYSES)


def threshold_rules(analyses: Sequence[Analysis]) -> tuple[ThresholdRule, ...]:
    """The threshold rules (:mod:`.threshold`) of ``analyses`` (the analyses a report ran), in their order: what
    :func:`~tl_idempotence.analyses.threshold.derive_at_threshold` applies.

    Raises:
        KeyError: an analysis that is not registered (names the registered ones).
    """
    return tuple(r for a in analyses for r in spec_of(a.name).threshold_rules)


def spec_of(name: str) -> AnalysisSpec:
    """The registered analysis called ``name``.

    Raises:
        KeyError: no such analysis (names the registered ones).
    """
    for s in ANALYSES:
        if s.name == name:
            return s
    raise KeyError(f"no analysis {name!r}; registered: {[s.name for s in ANALYSES]}")
