"""The orientation-scramble null's declaration (SPEC 4b): the ``nulls`` option, its head columns and summary.

Torch-free (the registry, and so the CLI's ``--help``, reads it); the code is :mod:`.scramble`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..core.option_specs import OptionSpec, check_nulls
from ..errors import OptionError
from .spec import AnalysisSpec, SummaryRecord, rule

__all__ = ["NULLS", "SPEC", "ScrambleSummary"]

#: ``nulls``: scramble draws per head (0 = off); it also switches on the matched O/V mismatch.
NULLS = OptionSpec(
    "nulls",
    0,
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
        is compared). n_heads_q05: heads whose Benjamini-Hochberg q-value is <= 0.05. n_layers_trained_wins /
        layers_trained_loses: layers whose median trained P beats / does not beat the scramble's.
    """

    bounds = (
        ("n_heads_compared", "n_heads"),
        ("n_heads_q05", "n_heads"),
        ("n_layers_trained_wins", "n_attention_layers"),
    )

    n_scramble_draws: int = field(metadata=rule("count"))
    median_P_trained: float = field(metadata=rule("P"))
    median_P_scrambled: float = field(metadata=rule("P"))
    n_heads_compared: int = field(metadata=rule("count"))
    n_heads_beating_scramble: int = field(metadata=rule("count"))
    n_heads_q05: int = field(metadata=rule("count"))
    frac_beats_scramble: float = field(metadata=rule("fraction"))
    n_layers_trained_wins: int = field(metadata=rule("count"))
    layers_trained_loses: list[int] = field(metadata=rule("layers"))

    def check(self) -> None:
        """At most ``n_heads_compared`` heads beat their scramble.

        Raises:
            OptionError: more (names both).
        """
        if self.n_heads_beating_scramble > self.n_heads_compared:
            raise OptionError(
                f"summary field n_heads_beating_scramble={self.n_heads_beating_scramble!r} is impossible: more than "
                f"n_heads_compared={self.n_heads_compared!r}."
            )


SPEC = AnalysisSpec(
    name="scramble",
    implementation="scramble:ScrambleAnalysis",
    options=(NULLS,),
    head_columns=(
        "P_scrambled_median",
        "P_scrambled_q95",
        "p_value",
        "beats_scramble",
        "n_scramble_draws",
        "frac_scrambled_closed",
        "scramble_reason",
    ),
    summary=ScrambleSummary,
)
