"""The defaults, in one place: the general options' (:data:`DEFAULT_THRESHOLD`, :data:`DEFAULT_COMPUTE_DTYPE`,
:data:`DEFAULT_DEVICE`) and the draw counts' table: each entry point's default of ``nulls`` and its siblings, with why.

The report's options (:data:`~tl_idempotence.core.option_specs.GENERAL_OPTIONS`) and every standalone function
taking the same parameter (``closure``, ``orientation_scramble``, ``mismatch``, ``constructive_search``,
``shared_value_algebra``, ``activation_returns``) read the general defaults here, so ``help()`` on each shows the
same value.

The same word means different work at different entry points, so its default differs: a report runs no null
unless asked (a control over every head of a model is the costliest part of a report), the one-head scramble is
the control itself, the activation control is pooled over thousands of tokens. :data:`DEFAULTS_TABLE` says each
one once; the entry points read their defaults from it (:func:`default_of`) and ``docs/api.md``'s table is
generated from it (:func:`defaults_markdown`; ``python scripts/docs/defaults_table.py`` rewrites it, and
``tests/unit/core/test_defaults_table.py`` fails when the two differ).

Imports nothing (the CLI's ``--help`` reads it through the report options).
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = [
    "DEFAULTS_TABLE",
    "DEFAULT_COMPUTE_DTYPE",
    "DEFAULT_DEVICE",
    "DEFAULT_THRESHOLD",
    "Default",
    "default_of",
    "defaults_markdown",
]

#: P threshold of a "closed" head, in [0, 1] (SPEC 3; the paper's 0.9).
DEFAULT_THRESHOLD = 0.9

#: dtype of the ``d_model``-long Gram products, by name (``torch.float64``; the ``d_head``-sized algebra is
#: float64 whatever is chosen).
DEFAULT_COMPUTE_DTYPE = "float64"

#: where the products and the controls run (results are CPU float64 wherever they run).
DEFAULT_DEVICE = "cpu"


class Default(NamedTuple):
    """One entry point's default of one draw count.

    Attributes:
        entry: the entry point, as the docs name it (``tli.idempotence_report``).
        option: its keyword (``nulls``).
        value: the default (an int).
        reason: why this default, in one sentence.
    """

    entry: str
    option: str
    value: int
    reason: str


#: Each entry point's default draw count, with the reason (the one place these numbers are written).
DEFAULTS_TABLE: tuple[Default, ...] = (
    Default(
        "tli.idempotence_report, model.idempotence_report, tli.compare, tli.sweep, tli.trajectory, "
        "tl-idempotence report / sweep",
        "nulls",
        0,
        "the scramble null and the O/V mismatch over every head are the costliest part of a report: off unless asked",
    ),
    Default(
        "nulls=True",
        "nulls",
        64,
        "what nulls=True means at every entry point that takes the report options: the usual null, whose p-value "
        "floor 1/65 = 0.015 is below 0.05",
    ),
    Default(
        "tli.orientation_scramble",
        "nulls",
        64,
        "the scramble is the whole call: the usual null (as nulls=True)",
    ),
    Default(
        "tli.activation_returns",
        "nulls",
        4,
        "the scramble control is pooled over every token of the corpus: a few draws per head give its median",
    ),
    Default(
        "tli.ablation",
        "n_controls",
        39,
        "matched random head sets: the exact rank p-value's floor is 1/40 = 0.025, so a flagged set that beats all "
        "of them, or all but one, gets p <= 0.05",
    ),
)


def default_of(entry: str, option: str) -> int:
    """The default of ``option`` at ``entry`` (one of the entry points a row names: ``"tli.idempotence_report"``;
    ``"nulls=True"`` for the count ``nulls=True`` means).

    Raises:
        KeyError: no such row (names the entries of the table).
    """
    for d in DEFAULTS_TABLE:
        if d.option == option and entry in [n.strip() for n in d.entry.split(",")]:
            return d.value
    raise KeyError(f"no default of {option!r} at {entry!r}; the table has {[d.entry for d in DEFAULTS_TABLE]}")


def defaults_markdown() -> str:
    """:data:`DEFAULTS_TABLE` as the Markdown table ``docs/api.md`` holds (between its ``defaults-table`` markers)."""
    rows = ["| entry point | option | default | why |", "| --- | --- | --- | --- |"]
    for d in DEFAULTS_TABLE:
        entries = ", ".join(f"`{n.strip()}`" for n in d.entry.split(","))
        rows.append(f"| {entries} | `{d.option}` | {d.value} | {d.reason} |")
    return "\n".join(rows) + "\n"
