"""The orientation-scramble null's declaration (SPEC 4b): the ``nulls`` option, its head columns and summary.

Torch-free (the registry, and so the CLI's ``--help``, reads it); the code is :mod:`.scramble`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..core.defaults import default_of
from ..core.lazy import Lazy
from ..core.option_specs import OptionSpec
from ..core.options import check_nulls
from .spec import AnalysisSpec, SummaryRecord, nan_says_why, rule
from .threshold import FractionPerHead

__all__ = ["FRAC_SCRAMBLED_CLOSED", "NULLS", "SPEC", "ScrambleSummary", "analysis"]

#: ``nulls``: scramble draws per head (0 = off); it also switches on the matched O/V mismatch.
NULLS = OptionSpec(
    "nulls",
    default_of("tli.idempotence_report", "nulls"),
    "orientation-scramble draws per head, with the matched O/V mismatch: an integer, 0 = off, 64 the usual "
    "(the Python API also takes True for 64)",
    "count",
    "N",
    types="bool | int",
    hint="NullsLike",
    check=check_nulls,
    position=10,
)


@dataclass(frozen=True)
class ScrambleSummary(SummaryRecord):
    """The trained orientation against its scramble (SPEC 4b).

    Attributes:
        n_scramble_draws: draws per head. median_P_trained / median_P_scrambled: medians over heads (of each
        head's scramble median). n_heads_compared: heads with a defined comparison; n_heads_beating_scramble:
        those whose trained P beats their scramble median; frac_beats_scramble: their fraction (NaN when none
        is compared). n_layers_trained_wins / layers_trained_loses: layers whose median trained P beats / does
        not beat the scramble's. n_heads_q05: heads whose Benjamini-Hochberg q-value is <= 0.05 (unset in a
        record without it; a loaded report derives it from its tables).
    """

    bounds = (
        ("n_heads_compared", "n_heads"),
        ("n_heads_beating_scramble", "n_heads_compared"),
        ("n_heads_q05", "n_heads"),
        ("n_layers_trained_wins", "n_attention_layers"),
    )

    n_scramble_draws: int = field(metadata=rule("count"))
    median_P_trained: float = field(metadata=rule("P"))
    median_P_scrambled: float = field(metadata=rule("P"))
    n_heads_compared: int = field(metadata=rule("count"))
    n_heads_beating_scramble: int = field(metadata=rule("count"))
    frac_beats_scramble: float = field(metadata=rule("fraction"))
    n_layers_trained_wins: int = field(metadata=rule("count"))
    layers_trained_loses: list[int] = field(metadata=rule("layers"))
    n_heads_q05: int | None = field(default=None, metadata=rule("count"))  # a record may lack it (OPTIONAL_SINCE)

    def check(self, report: Mapping[str, Any]) -> None:
        """``frac_beats_scramble`` is NaN exactly when ``n_heads_compared = 0``.

        Raises:
            OptionError: it is NaN with heads compared, or a number without.
        """
        why = f"n_heads_compared = 0 (here n_heads_compared={self.n_heads_compared!r})"
        nan_says_why("frac_beats_scramble", self.frac_beats_scramble, self.n_heads_compared == 0, why)


#: Per head: ``frac_scrambled_closed``, the fraction of its defined scrambled draws (``scramble_draws``) with
#: ``P~ >= threshold`` (NaN for a head without a defined draw: its ``scramble_reason`` says why).
FRAC_SCRAMBLED_CLOSED = FractionPerHead("frac_scrambled_closed", "scramble_draws", "P")


#: The scramble analysis (:class:`.scramble.ScrambleAnalysis`): calling it imports the class and builds one.
analysis = Lazy("tl_idempotence.analyses.scramble", "ScrambleAnalysis")


SPEC = AnalysisSpec(
    name="scramble",
    implementation=analysis,
    options=(NULLS,),
    head_columns=(
        "P_scrambled_median",
        "P_scrambled_q95",
        "p_value",
        "beats_scramble",
        "n_scramble_draws",
        "frac_scrambled_closed",
        "scramble_effect",
        "scramble_reason",
    ),
    summary=ScrambleSummary,
    threshold_rules=(FRAC_SCRAMBLED_CLOSED,),
)
