"""A population of mechanism results in one table, with a test across models (SPEC 13, "Population").

:func:`compare_mechanisms` takes ``{label: Mechanism}`` (``rep.mechanism(model=...)`` of each model; a model whose
mechanism was refused, such as an encoder, is given as the exception that refused it) and returns a
:class:`MechanismComparison`: one row per model (refused models included, with the reason: never dropped), the
pooled heads, a combined test across models and a headline that states the answer at the population level and what
does not hold. The statistics are :mod:`tl_idempotence.studies.population_stats`' (computed from each mechanism's
per-head table with :mod:`tl_idempotence.core.matching` and :mod:`tl_idempotence.core.stats`; docs/population.md,
"The statistics").

The result is not stored (no ``save``): :meth:`MechanismComparison.export` writes its table (``.csv``,
``.parquet``) or its summary and table (``.json``) through the output registry (:mod:`tl_idempotence.core.outputs`);
the mechanisms themselves save with ``Mechanism.save``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pandas as pd

from ..core.options import check_bool, check_int, check_seed, strict_kwargs
from ..core.outputs import Output, write_output
from ..core.summaries import FrozenSummary
from ..core.tables import ImmutableResult
from ..errors import OptionError, OptionTypeError
from ..report.mechanism import Mechanism
from ..views.results import DrawnResult
from .population_stats import HEAD_COLUMNS, LEVEL, ROW_COLUMNS, combined_tests, model_row, refused_row

if TYPE_CHECKING:  # pragma: no cover
    from ..core.hints import IntLike, PathLike

__all__ = [
    "QUESTION",
    "MechanismComparison",
    "MechanismComparisonSummary",
    "compare_mechanisms",
    "population_headline",
]

#: The question the headline answers first.
QUESTION = (
    "Across the population, does closure predict the sign of a head's direct effect on the token it attends to, "
    "beyond non-closed heads of the same model, layer and size?"
)
#: Permutation draws of the tests when the relabellings are too many to enumerate.
DEFAULT_N_PERMUTATIONS = 9999


class MechanismComparisonSummary(FrozenSummary):
    """The summary of :class:`MechanismComparison` (typed, read-only; the fields are described there)."""

    __slots__ = ()
    n_models: int
    n_measured: int
    n_refused: int
    refused: Sequence[str]
    n_tied: int
    n_untied: int
    threshold: float
    n_heads: int
    n_closed: int
    n_models_compared: int
    pooled_closed_rate: float
    pooled_control_rate: float
    pooled_difference: float
    pooled_p: float
    pooled_p_floor: float
    pooled_method: str
    pooled_n_relabelings: int
    n_pooled_closed: int
    n_pooled_controls: int
    n_models_positive: int
    n_models_negative: int
    n_models_zero: int
    models_sign_test_p: float
    models_sign_test_floor: float
    n_sign_tested: int
    n_agree: int
    agree_rate: float
    sign_test_p: float
    sign_test_floor: float
    n_other_tested: int
    n_other_agree: int
    other_agree_rate: float
    n_copying_closed: int
    copying_rate_closed: float
    n_copying_other: int
    copying_rate_other: float
    n_spearman_pooled: int
    spearman_rho_pooled: float
    spearman_p_within: float
    n_models_spearman_05: int
    pooled_notes: Sequence[str]
    answer: str
    holds: Sequence[str]
    does_not_hold: Sequence[str]
    untestable: Sequence[str]
    match_by: str
    n_controls: int
    n_permutations: int
    seed: int
    max_exact: int
    level: float
    headline: str


def _p(p: float) -> str:
    return "undefined" if not math.isfinite(p) else (f"{p:.2g}" if p >= 1e-3 else f"{p:.1e}")


def _answer(s: Mapping[str, Any]) -> str:
    """``"yes"``, ``"opposite"``, ``"not detectably"``, ``"too few"`` or ``"undefined"`` (the pooled test)."""
    if not s["n_pooled_closed"] or not math.isfinite(s["pooled_p"]):
        return "undefined"
    if s["pooled_p_floor"] > LEVEL:
        return "too few"
    if s["pooled_p"] <= LEVEL:
        return "yes" if s["pooled_difference"] > 0 else "opposite"
    return "not detectably"


_ANSWER_WORDS = {
    "yes": "Yes",
    "opposite": "The opposite",
    "not detectably": "Not detectably",
    "too few": "Too few matched heads to tell",
}


def _findings(s: Mapping[str, Any], rows: pd.DataFrame) -> tuple[list[str], list[str], list[str]]:
    """What holds, what does not and what cannot be tested, one clause each, from the summary and the rows (the
    headline's words)."""
    holds: list[str] = []
    fails: list[str] = []
    untestable: list[str] = []
    measured = rows[rows["status"] == "measured"]
    if s["n_sign_tested"]:
        base = (
            f"non-closed heads: {s['n_other_agree']} of {s['n_other_tested']}, {s['other_agree_rate']:.0%}"
            if s["n_other_tested"]
            else "no non-closed head has a direction"
        )
        numbers = (
            f"{s['n_agree']} of {s['n_sign_tested']}, {s['agree_rate']:.0%}, two-sided sign test p = "
            f"{_p(s['sign_test_p'])}; {base}"
        )
        if s["sign_test_p"] <= LEVEL and s["agree_rate"] > 0.5:
            holds.append(f"closed heads agree more often than 1/2 ({numbers}): against chance alone")
        else:
            fails.append(f"closed heads agree more often than 1/2 ({numbers})")
    rho, p_in = s["spearman_rho_pooled"], s["spearman_p_within"]
    if math.isfinite(p_in):
        numbers = (
            f"pooled ρ = {rho:+.2f}, p = {_p(p_in)} permuted within them; within layers p <= {LEVEL:g} in "
            f"{s['n_models_spearman_05']} of {len(measured)} models"
        )
        if p_in <= LEVEL:
            holds.append(f"α·P tracks the effect within (model, layer) strata ({numbers})")
        else:
            fails.append(f"α·P tracks the effect within (model, layer) strata ({numbers})")
    no_closed = measured[measured["n_closed"] == 0]
    no_control = measured[(measured["n_closed"] > 0) & (measured["n_matched_closed"] == 0)]
    if len(no_closed):
        untestable.append(f"{len(no_closed)} of {len(measured)} models have no closed head ({_names(no_closed)})")
    if len(no_control):
        untestable.append(
            f"{len(no_control)} of {len(measured)} models have no matched control (every head of the layers with "
            f"closed heads is closed, or no closed head has a direction: {_names(no_control)})"
        )
    if math.isfinite(s["copying_rate_closed"]) and math.isfinite(s["copying_rate_other"]):
        untestable.append(  # a description beside its base rate, not a tested finding: no pooled test of it
            f"whether copying has the sign of α more often for closed heads ({s['copying_rate_closed']:.0%}) than for "
            f"non-closed heads ({s['copying_rate_other']:.0%}) across models (weights only; no pooled test: each "
            "model's Fisher p is in the table)"
        )
    return holds, fails, untestable


def _names(rows: pd.DataFrame, n: int = 4) -> str:
    names = list(rows["model"])
    return ", ".join(names[:n]) + (f", ... ({len(names) - n} more)" if len(names) > n else "")


def population_headline(s: Mapping[str, Any]) -> str:
    """The headline of a :class:`MechanismComparison` from its summary (the question, the answer with the pooled
    test, the per-model signs, what holds, what does not, the refused models). Raises nothing."""
    answer = s["answer"]
    if answer == "undefined":
        first = (
            f"{QUESTION} Undefined: no model of {s['n_measured']} measured has a closed head with a non-closed head "
            "of its layer (and a direction) to compare"
        )
    else:
        first = (
            f"{QUESTION} {_ANSWER_WORDS[answer]}: pooled over the {s['n_models_compared']} of {s['n_measured']} "
            f"measured models with matched controls, closed heads agree (direction = sign(α)) at rate "
            f"{s['pooled_closed_rate']:.2f} ({s['n_pooled_closed']} heads) and their matched controls at "
            f"{s['pooled_control_rate']:.2f} ({s['n_pooled_controls']} heads), difference "
            f"{s['pooled_difference']:+.2f}, p = {_p(s['pooled_p'])} (the closed label relabelled within model and "
            f"layer, {s['pooled_method']}; floor {s['pooled_p_floor']:.2g})"
        )
    n_signed = s["n_models_positive"] + s["n_models_negative"]
    second = (
        f"per model the matched difference is positive in {s['n_models_positive']}, negative in "
        f"{s['n_models_negative']} and zero in {s['n_models_zero']}"
        + (
            f" (sign test p = {_p(s['models_sign_test_p'])}, floor {s['models_sign_test_floor']:.2g})"
            if n_signed
            else ""
        )
    )
    parts = [f"{first}; {second}."]
    for key, words in (("holds", "Holds"), ("does_not_hold", "Does not hold"), ("untestable", "Not testable")):
        if s[key]:
            parts.append(f"{words}: " + "; ".join(s[key]) + ".")
    if s["n_refused"]:
        parts.append(f"Refused ({s['n_refused']}, rows with the reason): {', '.join(s['refused'])}.")
    return " ".join(parts)


class MechanismComparison(
    ImmutableResult,
    DrawnResult,
    display_kind="mechanism_comparison",
    repr_keys="n_models n_measured n_refused n_models_compared pooled_difference pooled_p answer",
    frozen=("a mechanism comparison is", "tli.compare_mechanisms(...) again"),
):
    """Result of :func:`compare_mechanisms`: a population of mechanism results and the tests across them. Immutable
    (:class:`~tl_idempotence.core.tables.ImmutableResult`): :attr:`table` and :attr:`heads` are copies made on each
    read, :attr:`summary` and :attr:`options` are read-only.

    Attributes:
        table: one row per model, in the order given (:data:`~tl_idempotence.studies.population_stats.ROW_COLUMNS`):
            ``model`` (the label), ``model_name``, ``status`` (``"measured"`` or ``"refused"``: a refused model's
            numbers are NaN and ``notes`` gives the reason), ``tied``, ``n_heads``, ``n_closed``; the closed heads'
            agreement (``n_sign_tested``, ``n_agree``, ``agree_rate``, the two-sided ``sign_test_p`` against 1/2 and
            its ``sign_test_floor``); the base rate among non-closed heads (``n_other_tested``, ``n_other_agree``,
            ``other_agree_rate``, Fisher's ``base_rate_fisher_p``); matched controls (``n_matched_closed``,
            ``n_matched_controls``, ``matched_closed_rate``, ``matched_control_rate``, ``matched_difference`` =
            closed - controls, its within-layer ``matched_p``, ``matched_p_floor``, ``matched_method``); the Spearman
            ρ of α·P with the effect (``n_spearman``, ``spearman_rho``, ``spearman_p_within_layer``, and
            ``spearman_p_unstratified`` beside it); the copying sign's base rate (``n_copying_closed``,
            ``copying_rate_closed``, ``n_copying_other``, ``copying_rate_other``, ``copying_fisher_p``); ``notes``.
        heads: every measured head: ``model, label, layer, head, closed, P, alpha, alpha_P, direction,
            effect_median, copying, agrees`` (1/0/NaN: ``direction == sign(α)``), ``copying_agrees``,
            ``matched`` (``"closed"``, ``"control"`` or ``""``).
        summary: the counts (``n_models, n_measured, n_refused, refused, n_tied, n_untied, threshold, n_heads,
            n_closed``), **the combined test** (``n_models_compared, pooled_closed_rate, pooled_control_rate,
            pooled_difference, pooled_p, pooled_p_floor, pooled_method, pooled_n_relabelings, n_pooled_closed,
            n_pooled_controls, pooled_notes``), the secondary (``n_models_positive, n_models_negative,
            n_models_zero, models_sign_test_p, models_sign_test_floor``), the pooled rates (``n_sign_tested,
            n_agree, agree_rate, sign_test_p, sign_test_floor, n_other_tested, n_other_agree, other_agree_rate,
            n_copying_closed, copying_rate_closed, n_copying_other, copying_rate_other``), the pooled Spearman
            (``n_spearman_pooled, spearman_rho_pooled, spearman_p_within``; ``n_models_spearman_05``: models whose
            within-layer p is at most ``level``), ``answer`` (``"yes"``, ``"opposite"``, ``"not detectably"``,
            ``"too few"``, ``"undefined"``), ``holds``, ``does_not_hold`` and ``untestable`` (clauses: the claims beside
            the test that hold, those that do not, the models no test reaches), the options (``match_by, n_controls,
            n_permutations, seed, max_exact, level``) and ``headline``.
        options: ``match_by, n_controls, n_permutations, seed, max_exact``.
    """

    table: pd.DataFrame
    heads: pd.DataFrame
    summary: MechanismComparisonSummary
    options: Mapping[str, Any]

    def __init__(
        self, table: pd.DataFrame, heads: pd.DataFrame, summary: Mapping[str, Any], options: Mapping[str, Any]
    ) -> None:
        self._freeze(table=table, heads=heads, summary=MechanismComparisonSummary(summary), options=dict(options))

    @property
    def headline(self) -> str:
        """The answer at the population level first, then the per-model signs, what holds, what does not and the
        refused models (one paragraph)."""
        return str(self.summary["headline"])

    def figure(self) -> Any:
        """Plotly figure: per model, the closed heads' agreement rate, their matched controls' and the non-closed
        heads' (the base rate); the pooled test in the title
        (:func:`tl_idempotence.views.mechanism_comparison_figure`)."""
        from ..views import mechanism_comparison_figure

        return mechanism_comparison_figure(self)

    def to_text(self) -> str:
        """The headline and the table's leading columns, as plain text."""
        cols = [
            "model", "status", "tied", "n_closed", "n_agree", "n_sign_tested", "other_agree_rate",
            "matched_difference", "matched_p", "spearman_rho", "spearman_p_within_layer",
        ]  # fmt: skip
        return f"{self.headline}\n{self.table[cols].to_string(index=False)}"

    def __str__(self) -> str:
        return self.to_text()

    @strict_kwargs
    def export(self, path: PathLike, overwrite: bool = False) -> str:
        """Write the comparison in the format the extension of ``path`` chooses (the output registry,
        :mod:`tl_idempotence.core.outputs`): ``.csv``/``.parquet`` :attr:`table` (one row per model, refused ones
        included); ``.json`` ``{"summary": ..., "table": [one record per model]}`` (NaN as ``null``).

        Returns:
            The path written.

        Raises:
            OptionError: another extension (``.html`` included: this result has no page; names the known ones); an
                empty path, a folder, a missing folder, an existing file without ``overwrite=True``, or a file that
                cannot be written. OptionTypeError: ``path`` is not a path, ``overwrite`` is not a bool.
        """
        overwrite = check_bool(overwrite, "overwrite")
        return str(write_output(self._output(), path, replace_files=overwrite))

    def _output(self) -> Output:
        return Output(
            what="mechanism comparison",
            record=lambda: {"summary": dict(self.summary), "table": self.table.to_dict(orient="records")},
            table=lambda: self.table.reset_index(drop=True),
        )


def _items(mechanisms: Any) -> dict[str, Mechanism | BaseException]:
    """The labelled items, checked.

    Raises:
        OptionTypeError: not a mapping; a label that is not a str; a value neither a Mechanism nor an exception.
        OptionError: no items; an empty label; one Mechanism under two labels, or two equal ones (a saved and a fresh
            result of one model); mechanisms of different thresholds.
    """
    if not isinstance(mechanisms, Mapping):
        raise OptionTypeError(
            f"compare_mechanisms takes {{label: rep.mechanism(...)}} (a mapping); got {type(mechanisms).__name__}."
        )
    if not mechanisms:
        raise OptionError("compare_mechanisms needs at least one mechanism.")
    seen: dict[int, str] = {}
    tables: dict[str, pd.DataFrame] = {}
    thresholds: dict[str, float] = {}
    for label, m in mechanisms.items():
        if not isinstance(label, str) or not label:
            raise OptionTypeError(f"every label must be a non-empty str; got {label!r}.")
        if isinstance(m, Mechanism):
            if id(m) in seen:
                raise OptionError(f"{label!r} and {seen[id(m)]!r} are the same mechanism result: one model twice.")
            table = m.table
            same = next((lab for lab, t in tables.items() if t.equals(table)), None)
            if same is not None:  # a saved result and a fresh one of one model: counted twice otherwise
                raise OptionError(
                    f"{label!r} and {same!r} are equal mechanism results (the same table, e.g. one loaded with "
                    "tli.load_mechanism and one fresh): one model twice. Give each model once."
                )
            seen[id(m)], tables[label] = label, table
            thresholds[label] = float(m.summary.get("threshold", math.nan))
        elif not isinstance(m, BaseException):
            raise OptionTypeError(
                f"{label!r}: a value must be a Mechanism (rep.mechanism(model=...)) or the exception that refused "
                f"it (an encoder's UnsupportedModelError); got {type(m).__name__}."
            )
    if len({repr(t) for t in thresholds.values()}) > 1:
        raise OptionError(
            f"The mechanisms were made at different P thresholds ({thresholds}): 'closed' must mean one thing "
            "across the population. Make every report at one threshold."
        )
    return dict(mechanisms)


@strict_kwargs
def compare_mechanisms(
    mechanisms: Mapping[str, Mechanism | BaseException],
    *,
    match_by: str = "abs_alpha",
    n_controls: IntLike = 1,
    n_permutations: IntLike = DEFAULT_N_PERMUTATIONS,
    seed: IntLike = 0,
    max_exact: IntLike = 100_000,
) -> MechanismComparison:
    """A population of mechanism results in one table, with a combined test across models (SPEC 13; the module
    docstring of :mod:`tl_idempotence.studies.population_stats` defines every statistic).

    Args:
        mechanisms: ``{label: rep.mechanism(model=...)}``, in the order the table lists them; a model whose
            mechanism was refused (an encoder: ``UnsupportedModelError``) is given as that exception and becomes a
            row with ``status="refused"`` and the reason.
        match_by: the size the matched controls are matched on (as ``rep.mechanism``'s and ``rep.causal``'s):
            ``"abs_alpha"`` (``|α|``) or a numeric column of every
            mechanism table (e.g. ``"P"``).
        n_controls: matched controls per closed head (>= 1), from the non-closed heads of its layer.
        n_permutations: seeded draws of each test whose relabellings or permutations are more than ``max_exact`` (the
            matched differences) or than this (the Spearman tests); 1 .. 2^20.
        seed: the draws' seed.
        max_exact: the most relabellings a matched difference enumerates exactly (1 .. 10^7).

    Returns:
        :class:`MechanismComparison` (``.headline``, ``.table``, ``.heads``, ``.summary``, ``.figure()``,
        ``.export(path)``).

    Raises:
        OptionTypeError: not a mapping; a label not a str; a value neither a Mechanism nor an exception; an option
            of the wrong type. OptionError: no items; one Mechanism under two labels or two equal ones (one model
            twice, e.g. a saved and a fresh result); mechanisms at different thresholds; a mechanism saved by an
            earlier version with parts not measured (``summary["not_measured"]``: a 0.3.0 save); a mechanism table
            without the columns needed (names the model); ``match_by`` not a column; a count out of range.
        UnknownOptionError: an unknown keyword.
    """
    items = _items(mechanisms)
    if not isinstance(match_by, str):
        raise OptionTypeError(f"match_by must be 'abs_alpha' or a column name; got {type(match_by).__name__}.")
    n_controls = check_int(n_controls, "n_controls", 1, 1 << 10)
    n_permutations = check_int(n_permutations, "n_permutations", 1, 1 << 20)
    seed = check_seed(seed)
    max_exact = check_int(max_exact, "max_exact", 1, 10_000_000)
    rows: list[dict[str, Any]] = []
    heads: list[pd.DataFrame] = []
    matchings = {}
    threshold = math.nan
    for i, (label, m) in enumerate(items.items()):
        if isinstance(m, BaseException):
            rows.append(refused_row(label, f"{type(m).__name__}: {m}"))
            continue
        s = m.summary
        if s.get("not_measured"):
            raise OptionError(
                f"mechanisms[{label!r}] was saved by an earlier version and has parts not measured "
                f"({', '.join(s['not_measured'])}): a population needs every model measured the same way; "
                "compute it again with rep.mechanism(model=...)."
            )
        threshold = float(s.get("threshold", math.nan))
        row, h, match = model_row(
            label, m.table, model_name=s.get("model_name"), tied=s.get("tied"), by=match_by, k=n_controls,
            n_permutations=n_permutations, seed=seed, max_exact=max_exact, index=i,
        )  # fmt: skip
        rows.append(row)
        heads.append(h)
        matchings[label] = match
    table = pd.DataFrame(rows, columns=list(ROW_COLUMNS))
    pooled = pd.concat(heads, ignore_index=True) if heads else pd.DataFrame(columns=list(HEAD_COLUMNS))
    measured = table[table["status"] == "measured"]
    combined = combined_tests(table, pooled, matchings, n_permutations=n_permutations, seed=seed, max_exact=max_exact)
    options = {"match_by": match_by, "n_controls": n_controls, "n_permutations": n_permutations, "seed": seed}
    options["max_exact"] = max_exact
    tied = [t for t in measured["tied"] if isinstance(t, bool)]
    summary: dict[str, Any] = {
        "n_models": len(table),
        "n_measured": len(measured),
        "n_refused": len(table) - len(measured),
        "refused": [str(x) for x in table.loc[table["status"] == "refused", "model"]],
        "n_tied": sum(tied),
        "n_untied": len(tied) - sum(tied),
        "threshold": threshold,
        "n_heads": int(measured["n_heads"].sum()),
        "n_closed": int(measured["n_closed"].sum()),
        **combined,
        "n_models_spearman_05": int((measured["spearman_p_within_layer"] <= LEVEL).sum()),
        **options,
        "level": LEVEL,
    }
    summary["answer"] = _answer(summary)
    summary["holds"], summary["does_not_hold"], summary["untestable"] = _findings(summary, table)
    summary["headline"] = population_headline(summary)
    return MechanismComparison(table, pooled, summary, options)
