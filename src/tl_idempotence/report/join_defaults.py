"""The defaults and stated maxima the joined probes share with their declarations (``roles_spec.py``,
``mechanism_spec.py``): here, below both, so a probe's implementation (``roles.py``, ``mechanism.py``) never imports
its declaration, which imports it (no import cycle, also not through lazy imports). Imports nothing.
"""

from __future__ import annotations

__all__ = [
    "CAUSAL_N_PERMUTATIONS",
    "CAUSAL_VARIANTS",
    "DEFAULT_N_PERMUTATIONS",
    "DEFAULT_N_SETS",
    "EXPORT_MECHANISM_COLUMNS",
    "EXPORT_ROLE_COLUMNS",
    "MAX_BATCH_SIZE",
    "MAX_BOOT",
    "MAX_RESAMPLES",
    "MAX_SEQ_LEN",
]

#: Permutations of a Spearman test (per role in ``rep.roles``; ``rep.mechanism``'s): two-sided p floor
#: 2/(n + 1) = 0.002.
DEFAULT_N_PERMUTATIONS = 999
#: Random layer-matched sets of the circuit test (p floor 1/(n + 1) = 0.001).
DEFAULT_N_SETS = 999
#: The causal test's OV edits (``rep.causal``), in the order they run: ``probes.causal_tables.VARIANTS`` (a test
#: checks the two agree; here so that the declaration imports no pandas).
CAUSAL_VARIANTS = ("closure_free", "closure_only", "zero", "mean")
#: Relabellings ``rep.causal`` draws where more than 100,000 exist (p floor 1/(n + 1) = 1e-4); fewer are enumerated.
CAUSAL_N_PERMUTATIONS = 9999
#: Stated maximum of both counts (checked before any allocation).
MAX_RESAMPLES = 1 << 20
#: The longest window (``seq_len``) a join's probe runs: ``probes.tokens.MAX_SEQ_LEN`` (a test checks the two agree;
#: here so that the declarations import no torch).
MAX_SEQ_LEN = 1 << 24
#: The most windows per forward pass (``batch_size``) a join's probe takes.
MAX_BATCH_SIZE = 1 << 20
#: ``rep.mechanism``'s most bootstrap replicates: ``probes.effect_stability.MAX_BOOT`` (a test checks the two agree;
#: here so that the declaration imports no pandas).
MAX_BOOT = 10_000
#: The role columns a report's exports add with ``roles`` (the CLI's ``--roles``: ``--csv`` and ``--json``).
EXPORT_ROLE_COLUMNS = ("previous_token", "duplicate_token", "induction", "copying")
#: The per-head columns the report's exports add with a mechanism result (``--csv``, ``--json``); the table's
#: ``reason`` goes out as ``mechanism_reason`` (the report's own ``reason`` is the closure's).
EXPORT_MECHANISM_COLUMNS = (
    "effect_median", "frac_negative", "null_median", "effect_p", "effect_q", "self_rank_median", "frac_top_k",
    "frac_bottom_k", "copying", "copying_own", "sign_agrees", "median_diff", "direction", "mechanism_reason",
)  # fmt: skip
