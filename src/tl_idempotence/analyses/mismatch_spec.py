"""The matched O/V mismatch's declaration (SPEC 4a): runs with ``nulls`` (the scramble's option); its summary.

Torch-free (the registry, and so the CLI's ``--help``, reads it); the code is :mod:`.mismatch`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..core.lazy import Lazy
from .spec import AnalysisSpec, SummaryRecord, rule
from .threshold import CountPerLayer

__all__ = ["N_MISMATCH_CLOSED", "SPEC", "MismatchSummary", "analysis"]


@dataclass(frozen=True)
class MismatchSummary(SummaryRecord):
    """Matched within-layer O/V mismatch pairs (SPEC 4a).

    Attributes:
        n_mismatch_pairs: valid pairs; n_mismatch_closed: those with ``P >= threshold``; mismatch_P_max: their
        largest P (NaN when there is none); mismatch_notes: why a layer has no pair (unset when every layer has).
    """

    bounds = (("n_mismatch_closed", "n_mismatch_pairs"),)

    n_mismatch_pairs: int = field(metadata=rule("count"))
    n_mismatch_closed: int = field(metadata=rule("count"))
    mismatch_P_max: float = field(metadata=rule("P"))
    mismatch_notes: list[str] | None = field(default=None, metadata=rule("strs"))


#: Per layer: ``n_mismatch_closed``, the layer's mismatched pairs (``mismatch_pairs``) with ``P >= threshold``.
N_MISMATCH_CLOSED = CountPerLayer("n_mismatch_closed", "P", over="mismatch_pairs")


#: The mismatch analysis (:class:`.mismatch.MismatchAnalysis`): calling it imports the class and builds one.
analysis = Lazy("tl_idempotence.analyses.mismatch", "MismatchAnalysis")


SPEC = AnalysisSpec(
    name="mismatch",
    implementation=analysis,
    summary=MismatchSummary,
    threshold_rules=(N_MISMATCH_CLOSED,),
)
