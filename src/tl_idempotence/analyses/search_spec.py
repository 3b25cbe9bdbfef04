"""The constructive search's declaration (SPEC 5): the ``search`` option, its head columns and summary.

Torch-free (the registry, and so the CLI's ``--help``, reads it); the code is :mod:`.search`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..core.lazy import Lazy
from ..core.option_specs import on_off
from .spec import AnalysisSpec, SummaryRecord, rule
from .threshold import CountPerLayer, Flag

__all__ = ["FEASIBLE", "N_HEADS_FEASIBLE", "SEARCH", "SPEC", "SearchSummary", "analysis"]

#: ``search``: run the constructive search.
SEARCH = on_off("search", "constructive search: the feasible P per head and layer (minutes)", position=30)


@dataclass(frozen=True)
class SearchSummary(SummaryRecord):
    """Where ``P >= threshold`` is feasible (SPEC 5).

    Attributes:
        n_feasible_layers: layers where the search reached the threshold; infeasible_layers: the others.
    """

    bounds = (("n_feasible_layers", "n_attention_layers"),)

    n_feasible_layers: int = field(metadata=rule("count"))
    infeasible_layers: list[int] = field(metadata=rule("layers"))


#: Per layer: ``n_heads_feasible``, the heads whose searched P reaches the threshold.
N_HEADS_FEASIBLE = CountPerLayer("n_heads_feasible", "P_searched")
#: Per layer: ``feasible = feasible_P >= threshold`` (NaN, no head searched: not feasible).
FEASIBLE = Flag("feasible", "feasible_P", frame="layers")


#: The search analysis (:class:`.search.SearchAnalysis`): calling it imports the class and builds one.
analysis = Lazy("tl_idempotence.analyses.search", "SearchAnalysis")


SPEC = AnalysisSpec(
    name="search",
    implementation=analysis,
    options=(SEARCH,),
    head_columns=("P_searched", "search_iters", "search_stopped_on", "search_best_restart", "search_reason"),
    summary=SearchSummary,
    threshold_rules=(N_HEADS_FEASIBLE, FEASIBLE),
)
