"""The analyses the report runs, registered once, in order (each declared beside its code: :mod:`.spec`).

Each entry is an analysis's :class:`~tl_idempotence.analyses.spec.AnalysisSpec` (from its torch-free
``<name>_spec.py``), added by :func:`register`, which refuses what it cannot run: a declaration with a field of the
wrong type, an analysis whose name, option, head column or summary field another one already has, and an
implementation that does not build an analysis of its name (a refused registration leaves the registry as it was).
The paper's five analyses, registered here when the registry is imported, are not built then (their classes import
torch, and ``import tl_idempotence`` and the CLI's ``--help`` must not): ``tests/unit/analyses/test_registry.py``
builds and checks each. Every later :func:`register` call (a user's) builds its implementation at once.

Everything that names the analyses or their options is assembled from this list:
the report options (:mod:`~tl_idempotence.analyses.report_options`: :class:`~tl_idempotence.analyses.
report_options.ReportOptions`' validation and defaults, the CLI's report flags, the options paragraph of every
entry point's docstring), ``compare``'s and the sweeps' compared options
(:func:`~tl_idempotence.report.identity.compared_options`), the report loop (:func:`report_analyses`), the report
summary's per-analysis records and the threshold-dependent outputs (:func:`threshold_rules`).

To add an analysis: its module (the ``Analysis`` class) and its declaration (an ``AnalysisSpec`` with its option,
head columns, summary record and a lazy reference to its class, :class:`~tl_idempotence.core.lazy.Lazy`), then its
entry in :data:`BUILT_IN` here and its typed option in :class:`~tl_idempotence.analyses.report_options.ReportOptions`.
Imports no torch (the CLI's ``--help`` reads it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..core.kwargs import by_name
from ..core.option_specs import GENERAL_OPTIONS, OptionSpec
from ..errors import OptionTypeError, RegistrationError
from . import algebra_spec, closure_spec, mismatch_spec, scramble_spec, search_spec
from .spec import AnalysisSpec

if TYPE_CHECKING:  # pragma: no cover
    from .base import Analysis
    from .threshold import ThresholdRule

__all__ = ["ANALYSES", "BUILT_IN", "analysis_options", "register", "report_analyses", "spec_of", "threshold_rules"]

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
    """Add ``spec`` to :data:`ANALYSES` (after the others), refusing what the report could not run (module
    docstring): its fields are checked again (:meth:`~tl_idempotence.analyses.spec.AnalysisSpec.check`), its names
    against the registered ones, and its implementation is built now and checked
    (:meth:`~tl_idempotence.analyses.spec.AnalysisSpec.analysis`: this imports its class, and torch with it).

    Returns ``spec``. Nothing is added when it is refused.

    Raises:
        OptionTypeError: not an :class:`~tl_idempotence.analyses.spec.AnalysisSpec` (a ``TypeError``); a field of the
            wrong type; an implementation that builds no analysis (names the analysis and what is wrong).
        OptionError: an implementation that builds an analysis of another name, or that raises.
        RegistrationError: its name, one of its options, head columns or summary fields is already another
            analysis's (or a report option's): the message names the name and both owners.
    """
    return _register(spec, build=True)


def _register(spec: AnalysisSpec, build: bool) -> AnalysisSpec:
    """:func:`register`; ``build=False`` for the paper's analyses at import (built by their unit test instead)."""
    global ANALYSES
    if not isinstance(spec, AnalysisSpec):
        raise OptionTypeError(f"register() takes an AnalysisSpec; got {type(spec).__name__}.")
    spec.check()  # a declaration edited after it was built (object.__setattr__) is checked too
    taken = _owners(ANALYSES)
    mine = [("name", spec.name)]
    mine += [("option", o.name) for o in spec.options]
    mine += [("head column", c) for c in spec.head_columns]
    mine += [("summary field", f) for f in (spec.summary.rules() if spec.summary is not None else ())]
    clashes = [f"its {what} {name!r} belongs to {taken[(what, name)]}" for what, name in mine if (what, name) in taken]
    if clashes:
        raise RegistrationError(f"cannot register analysis {spec.name!r}: " + "; ".join(clashes) + ".")
    if build:
        spec.analysis()
    ANALYSES = (*ANALYSES, spec)
    return spec


#: The paper's analyses, in column order (:data:`ANALYSES` starts with these).
BUILT_IN = (closure_spec.SPEC, scramble_spec.SPEC, mismatch_spec.SPEC, search_spec.SPEC, algebra_spec.SPEC)
for _spec in BUILT_IN:
    _register(_spec, build=False)  # torch-free: tests/unit/analyses/test_registry.py builds each
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
    return by_name(ANALYSES, name, lambda names: KeyError(f"no analysis {name!r}; registered: {names}"))
