"""The paper's reference figures and conventions (arXiv 2609.01129), as numbers: what a report, a comparison and
their pages compare a model with, and the false-discovery level at which the scramble's q-values are counted.

Constants only (no import): every layer that reads them (the scramble analysis, the report's summary and readings,
the comparison's table, the views) imports them from here.
"""

from __future__ import annotations

__all__ = ["FDR_LEVEL", "PAPER", "PAPER_THRESHOLD"]

#: The threshold of the paper's "closed" figures (``frac_closed``, ``mismatch_closed``,
#: ``frac_layers_feasible``).
PAPER_THRESHOLD = 0.9

#: The abstract's headline figures (arXiv 2609.01129), as numbers: (low, high) over the paper's models.
PAPER = {
    "frac_closed": (0.0398, 0.0800),  # 3.98-8.00 % of heads with P >= 0.9, per model (six endpoints)
    "mismatch_closed": (0.0, 0.0),  # no matched within-layer O/V mismatch reaches P >= 0.9
    "median_P_trained": (0.336, 0.336),  # over 7,304 heads in nine MHA/GQA models
    "median_P_scrambled": (1.04e-4, 1.04e-4),
    "frac_beats_scramble": (0.9864, 0.9864),
    "frac_layers_trained_wins": (1.0, 1.0),  # "in every layer"
    "frac_layers_feasible": (1.0, 1.0),  # "feasible in every surveyed layer"
}

#: The false-discovery level at which the summary counts heads (``n_heads_q05``: heads with ``q_value <= 0.05``).
FDR_LEVEL = 0.05
