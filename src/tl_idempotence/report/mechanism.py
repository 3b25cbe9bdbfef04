"""What the closed heads do to tokens, joined with closure, and what holds it up (SPEC 12-13):
``rep.mechanism(model=...)``.

:func:`mechanism_join` joins a report's ``P``, ``α`` and ``closed`` (and head roles when given) with the token
readout (:func:`~tl_idempotence.probes.head_tokens.head_tokens`), the attended-token effect on text
(:func:`~tl_idempotence.probes.token_effect.attended_token_effect`), the real copying score
(:func:`~tl_idempotence.probes.roles.copying_scores`), the copying score with ``G = I``
(:func:`~tl_idempotence.probes.tied.own_copying_scores`) and each head's distance from an orthogonal projection
(:func:`~tl_idempotence.maths.projection_facts.projection_facts`), and answers, each against a control group and
the confounds, not against chance alone (SPEC 13):

* among closed heads with ``α ≠ 0`` and a nonzero direction: how many have ``direction = sign(α)``, with a
  two-sided sign test (``scipy.stats.binomtest``, p = 1/2; :mod:`.mechanism_stats`). A head's **direction** is the
  direction its own test tests: the sign of ``effect - null`` counted over its positions (``n_pos_diff -
  n_neg_diff`` of :func:`~tl_idempotence.probes.token_effect.attended_token_effect`), not the sign of its median
  effect by itself (``effect_median``, shown beside it). With ``n`` heads the two-sided sign test's smallest p is
  ``2^(1 - n)`` (``summary["sign_test_floor"]``): with fewer than 6 heads the headline says "too few closed heads
  to tell";
* the same agreement and the effect against the null in the direction α predicts, closed heads against
  **non-closed heads of the same layer matched on size** (``|α|`` or ``‖T‖``; added to the join when not asked
  for, ``control_of`` names whom each matches), with an exact or permutation test that relabels within layers
  (``summary["matched"]``; :mod:`.mechanism_controls`); the headline answers "Yes" only beyond the controls;
* among all joined heads with a defined ``α·P`` and effect: the Spearman correlation of ``α·P`` with
  ``effect_median`` with a seeded permutation p **within layers** (``spearman_p``: both grow with depth), the
  across-layers p beside it (``spearman_p_unstratified``);
* the weights-only results (``sign(copying)`` and ``sign(copying_own)`` against ``sign(α)``) among the closed heads
  beside the rate among **every non-closed head measured** (``summary["base_rates"]``), and the closed heads'
  ``‖T - Tᵀ‖/‖T‖`` and distance from an orthogonal projection (``summary["projection"]``): the tied-embedding proof
  of docs/definitions.md §12 covers ``T = α Π`` with ``Π`` orthogonal only;
* stability: bootstrap intervals over windows and positions, the agreement count's interval, and with several text
  sets how many closed heads keep their direction (``summary["stability"]``);
* the copy-suppression condition: the effect split by whether the attended token is already predicted at the head's
  input (``summary["copy_suppression"]``).

Signed scores (α, the direction with ``|median_diff|``, the effect by itself, both copying scores) are summarized by
sign (:attr:`Mechanism.signs`), never as one median of a mixed set. Whether the model ties its embeddings
(:func:`~tl_idempotence.probes.tied.embedding_tie`) is stated.

Saving (:func:`save_mechanism`, ``Mechanism.save``; :func:`load_mechanism`, :mod:`.mechanism_store`) is as the
report is saved: a folder of parquet tables (``table``, ``signs``, ``weights``: every measured head's weights-only
numbers, ``stability``: each compared head's direction in each text set) and one JSON record ``mechanism.json``
holding their sha256s and its own digest (no pickle), with the probes' results as parts (``attended_token_effect/``
always: the bootstrap and the split are recomputed from its positions; ``head_tokens/`` when held). A load
recomputes from the tables what the record states (every derived column, the tests, the comparisons, the counts and
the headline), so an edit whose sha256s and digest were recomputed is refused where it makes the record disagree
with itself, naming the file.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import pandas as pd

from ..core.frozen import thawed
from ..core.stored import StoredResult, StoreSpec, loads, saves
from ..core.tables import FrozenResult, FrozenSummary
from ..probes.tied import EmbeddingTie
from ..views.results import DrawnResult
from .join_defaults import DEFAULT_N_PERMUTATIONS as DEFAULT_N_PERMUTATIONS
from .join_defaults import EXPORT_MECHANISM_COLUMNS
from .mechanism_controls import STABILITY_COLUMNS, controls_matching
from .mechanism_headline import QUESTION as QUESTION
from .mechanism_headline import mechanism_headline
from .mechanism_stats import LEVEL as LEVEL
from .mechanism_stats import SIGNED as SIGNED
from .mechanism_stats import derive_tests as derive_tests
from .mechanism_stats import joined_reasons
from .mechanism_stats import sign_summary as sign_summary
from .mechanism_tables import (
    COPYING_OWN_CONVENTION,
    MECHANISM_STORE,
    PART_COLUMNS,
    PROJECTION_COLUMNS,
    ROLE_COLUMNS,
    derive_all,
)
from .mechanism_tables import MECHANISM_FORMAT as MECHANISM_FORMAT
from .mechanism_tables import MECHANISM_RECORD as MECHANISM_RECORD
from .mechanism_tables import RECOMPUTED as RECOMPUTED
from .mechanism_tables import TABLE_COLUMNS as TABLE_COLUMNS
from .mechanism_tables import derived as derived

if TYPE_CHECKING:  # pragma: no cover
    from ..core.hints import PathLike
    from ..probes.head_tokens import HeadTokens
    from ..probes.roles import HeadRoles
    from ..probes.token_effect import AttendedTokenEffect

__all__ = [
    "MECHANISM_FORMAT",
    "MECHANISM_RECORD",
    "Mechanism",
    "MechanismSummary",
    "derive_tests",
    "load_mechanism",
    "mechanism_headline",
    "mechanism_join",
    "save_mechanism",
    "sign_summary",
]


class MechanismSummary(FrozenSummary):
    """The summary of :class:`Mechanism` (typed, read-only; a mapping of the fields given; a field not given reads
    as None). ``embedding_tie`` is the :class:`~tl_idempotence.probes.tied.EmbeddingTie` as a dict; ``head_tokens``
    and ``attended_token_effect`` are the probes' own summaries; ``matched``, ``base_rates``, ``projection``,
    ``stability`` and ``copy_suppression`` the sections of :mod:`~tl_idempotence.report.mechanism_controls` (None,
    each, for a result read from a 0.3.0 save: ``not_measured`` says why, :mod:`.mechanism_legacy`)."""

    __slots__ = ()
    model_name: str | None
    n_heads: int
    n_closed: int
    n_asked: int
    threshold: float
    n_sign_tested: int
    n_agree: int
    sign_test_p: float
    sign_test_floor: float
    n_spearman: int
    spearman_rho: float
    spearman_p: float
    spearman_p_within_layer: float
    spearman_p_unstratified: float
    n_strata: int
    n_permutations: int
    p_floor: float
    seed: int
    tied: bool
    embedding_tie: Mapping[str, Any]
    n_closed_own_sign_alpha: int
    median_abs_copying_closed: float
    matched: Mapping[str, Any]
    base_rates: Mapping[str, Any]
    projection: Mapping[str, Any]
    stability: Mapping[str, Any]
    copy_suppression: Mapping[str, Any]
    settings: Mapping[str, Any]
    notes: Sequence[str]
    conventions: Mapping[str, Any]
    head_tokens: Mapping[str, Any]
    attended_token_effect: Mapping[str, Any]
    headline: str
    not_measured: Mapping[str, str]


class Mechanism(
    StoredResult,
    FrozenResult,
    DrawnResult,
    repr_keys="model_name n_heads n_closed n_agree n_sign_tested sign_test_p spearman_rho tied",
    display_kind="mechanism",
    frozen=("a mechanism result is", "rep.mechanism again"),
    summary_type=MechanismSummary,
):
    """Result of ``rep.mechanism(model=...)`` (module docstring). Immutable, like the report: :attr:`table`,
    :attr:`signs`, :attr:`weights` and :attr:`stability` are copies made on each read, :attr:`summary` is
    read-only, and assigning an attribute raises ``dataclasses.FrozenInstanceError``.

    Attributes:
        table: one row per joined head (the heads asked for and their matched controls), indexed by ``"L10H8"``:
            ``layer, head, kv_head, P, alpha, closed, alpha_P`` (the report's), ``effect_median, frac_negative,
            null_median, effect_p, effect_q, n_positions`` (the attended-token effect: standardized, direct, on
            text; ``effect_median`` by itself, not against its null), ``self_rank_median, frac_top_k,
            frac_bottom_k`` (the token readout), ``copying`` (the full OV circuit's score), ``copying_own`` (the
            same with ``G = I``: T's own eigenvalues), ``sign_agrees`` (closed heads with ``α ≠ 0`` and a nonzero
            direction: ``direction == sign(α)``; NA otherwise), ``median_diff`` (median of effect - null),
            ``direction`` (the tested direction: +1 raises the attended token against the null, -1 lowers it, 0
            even, NaN without a position), ``reason`` (why a number of the row is NaN, by part; "" if none);
            ``asked`` (False: joined only as a matched control), ``control_of`` (the closed head(s) it is a matched
            control of; "" if none), ``agrees_alpha`` (``direction == sign(α)`` for every head with both nonzero;
            what the matched comparison compares), ``aligned_diff`` (``sign(α) · median_diff``: effect - null in the
            direction α predicts), ``median_diff_lo, median_diff_hi, effect_median_lo, effect_median_hi``
            (95 % bootstrap intervals over windows and positions) and ``direction_stability`` (the share of
            replicates keeping the direction), for closed heads and controls (NaN for the others),
            ``direction_kept`` (the same nonzero direction in every text set; NA with one set), ``asymmetry,
            proj_rank, proj_distance, proj_rank_any, proj_distance_any`` (the distance from an orthogonal
            projection), the copy-suppression split ``n_predicted, effect_median_predicted,
            median_diff_predicted, effect_p_predicted, direction_predicted`` and the same ``_unpredicted`` (measured
            for closed heads and controls), and the attention roles (``previous_token, duplicate_token,
            induction``) when roles were given.
        signs: one row per (signed column, group ``closed``/``all``): ``n_positive, median_abs_positive,
            n_negative, median_abs_negative, n_zero, n_nan`` (``direction``: heads by direction, the median
            ``|median_diff|`` of each side).
        weights: every head the report measured, weights only: ``layer, head, P, alpha, norm, closed, copying,
            copying_own`` (the base rates' and the matching's heads).
        stability: ``label, set, direction``: each closed head's and control's direction in each text set
            (``set0`` the one the table is of).
        summary: ``model_name, n_heads, n_closed, n_asked, threshold, n_sign_tested, n_agree, sign_test_p,
            sign_test_floor, n_spearman, spearman_rho, spearman_p`` (within layers; also named
            ``spearman_p_within_layer``), ``spearman_p_unstratified, n_strata, n_permutations, p_floor, seed, tied,
            embedding_tie, n_closed_own_sign_alpha, median_abs_copying_closed``, the sections ``matched, base_rates,
            projection, stability, copy_suppression``, ``headline``, ``notes``, and the probes' ``conventions``.
        tokens: the :class:`~tl_idempotence.probes.head_tokens.HeadTokens` joined (its ``top_tokens``); None for
            a result read back from a save that holds none.
        effect: the :class:`~tl_idempotence.probes.token_effect.AttendedTokenEffect` joined (its positions).
        tie: the :class:`~tl_idempotence.probes.tied.EmbeddingTie`.
        loaded_from: the folder :func:`~tl_idempotence.report.mechanism.load_mechanism` read it from
            (:meth:`save` refuses to write there), else None.
    """

    store: ClassVar[StoreSpec] = MECHANISM_STORE

    signs: pd.DataFrame
    weights: pd.DataFrame
    stability: pd.DataFrame
    summary: MechanismSummary
    tokens: HeadTokens | None
    effect: AttendedTokenEffect | None
    tie: EmbeddingTie

    def __init__(
        self,
        table: pd.DataFrame,
        signs: pd.DataFrame,
        summary: Mapping[str, Any],
        tokens: HeadTokens | None,
        effect: AttendedTokenEffect | None,
        tie: EmbeddingTie,
        loaded_from: str | None = None,
        weights: pd.DataFrame | None = None,
        stability: pd.DataFrame | None = None,
    ) -> None:
        # every frame is stored copied and handed out as a copy made on each read (ImmutableResult)
        self._freeze_result(
            table, summary, loaded_from, signs=signs, tokens=tokens, effect=effect, tie=tie,
            weights=pd.DataFrame() if weights is None else weights,
            stability=pd.DataFrame(columns=list(STABILITY_COLUMNS)) if stability is None else stability,
        )  # fmt: skip

    @property
    def headline(self) -> str:
        """One sentence: the question, the answer, the comparisons that hold it up (or not), each with its size and
        floor, and the tie of the embeddings."""
        return str(self.summary["headline"])

    def top_tokens(self, head: str) -> pd.DataFrame:
        """The tokens one head promotes and suppresses (:meth:`HeadTokens.top_tokens`; a copy).

        Args:
            head: a joined head's label, ``"L10H8"``.

        Returns:
            The :meth:`HeadTokens.top_tokens` frame of that head.

        Raises:
            OptionTypeError: not a label. OptionError: a head this result did not join; a result read back by
                :func:`~tl_idempotence.report.mechanism.load_mechanism` from a save without the token readout
                (run ``tli.head_tokens(model, heads=[head])`` or ``rep.mechanism(model=...)`` again).
        """
        if self.tokens is None:
            from ..errors import OptionError

            raise OptionError(
                f"This mechanism result was read back from {self.loaded_from or 'a saved folder'}, a save that holds "
                "the joined table, signs and summary but not the token readout: run tli.head_tokens(model, "
                f"heads=[{head!r}]).top_tokens({head!r}) or rep.mechanism(model=...) again."
            )
        return self.tokens.top_tokens(head)

    def figure(self) -> Any:
        """Plotly figure: each joined head's attended-token effect against α·P, closed heads marked, the sign
        agreement and the Spearman ρ in its title (:func:`tl_idempotence.views.figures.mechanism_figure`)."""
        from ..views import mechanism_figure

        return mechanism_figure(self)

    def to_text(self, n: int = 20) -> str:
        """The headline, the closed heads' rows (by P), their controls and the sign summary, as plain text.

        Raises:
            TypeError / ValueError: ``n`` is not a non-negative whole number (pandas' ``head``).
        """
        cols = ["P", "alpha", "effect_median", "median_diff", "direction", "effect_q", "median_diff_lo",
                "median_diff_hi", "copying", "copying_own", "proj_distance"]  # fmt: skip
        t = self._table
        closed = t[t["closed"]].sort_values("P", ascending=False, kind="stable")[cols]
        parts = [self.headline, f"closed heads ({len(closed)}):", closed.head(n).to_string() if len(closed) else "-"]
        if len(closed) > n:
            parts.append(f"... ({len(closed) - n} more)")
        controls = t[t["control_of"] != ""][["control_of", "alpha", "median_diff", "direction", "agrees_alpha"]]
        if len(controls):
            parts += [f"matched controls ({len(controls)}):", controls.head(n).to_string()]
        parts += ["by sign:", self.signs.to_string()]
        return "\n".join(parts)

    def __str__(self) -> str:
        return self.to_text()


def stability_frame(sets: Sequence[tuple[str, pd.DataFrame]], compared: Sequence[str]) -> pd.DataFrame:
    """``Mechanism.stability``: each compared head's direction (the effect table's) in each named text set."""
    rows = [
        {"label": lab, "set": name, "direction": float(t.loc[lab, "direction"])} for name, t in sets for lab in compared
    ]
    return pd.DataFrame(rows, columns=list(STABILITY_COLUMNS)).astype({"direction": float})


def _probe_columns(table: pd.DataFrame, labels: list[str], tokens: HeadTokens, effect: AttendedTokenEffect) -> None:
    from ..errors import OptionError

    tt, et = tokens.table, effect.table
    for what, frame in (("head_tokens", tt), ("attended_token_effect", et)):
        lack = [x for x in labels if x not in frame.index]
        if lack:
            raise OptionError(f"The {what} result lacks {len(lack)} joined head(s) ({lack[:5]}).")
    for part, frame in (("attended_token_effect", et), ("head_tokens", tt)):
        for col, src in PART_COLUMNS[part]:
            table[col] = frame.loc[labels, src].to_numpy()


def mechanism_join(
    heads: pd.DataFrame,
    threshold: float,
    tokens: HeadTokens,
    effect: AttendedTokenEffect,
    copying: pd.DataFrame,
    own: pd.DataFrame,
    tie: EmbeddingTie,
    roles: HeadRoles | None,
    *,
    weights: pd.DataFrame,
    projection: pd.DataFrame,
    asked: Sequence[str],
    sets: Sequence[tuple[str, pd.DataFrame]] = (),
    n_permutations: int,
    seed: int,
    match_by: str = "abs_alpha",
    n_controls: int = 1,
    n_boot: int = 1000,
) -> Mechanism:
    """Join and test (module docstring). The inputs are already checked to be of one model (the caller,
    ``rep.mechanism``, runs the report's identity check first and computes every probe from that model).

    Args:
        heads: the report's heads restricted to the joined ones (``layer, head, kv_head, P, alpha, closed``): the
            heads asked for and their matched controls (``controls_matching`` of ``weights``).
        threshold: the report's P threshold. tokens, effect: the probes' results on those heads (``effect`` on the
            first text set). copying: the real copying score (``layer, head, copying, reason``); own: the G = I
            score (``copying_own, reason``, indexed by label), both for every head (their reasons join the
            table's). tie: the embedding tie. roles: head roles of the same model, or None. weights:
            :func:`~tl_idempotence.report.mechanism_controls.weights_frame` of every measured head (both copying
            scores). projection: ``projection_facts`` of the joined heads.
        asked: the heads asked for (the others are matched controls). sets: ``(name, effect table)`` of every
            further text set (their directions). n_permutations, seed: the tests' permutations and seed.
            match_by, n_controls, n_boot: the matched controls' size and count, the bootstrap's replicates.

    Raises:
        OptionError: a probe result lacks a joined head (it was not computed on them).
    """
    labels = list(heads.index)
    table = heads.loc[:, ["layer", "head", "kv_head", "P", "alpha", "closed"]].copy()
    table["alpha_P"] = table["alpha"].to_numpy(dtype=float) * table["P"].to_numpy(dtype=float)
    _probe_columns(table, labels, tokens, effect)
    table["copying"] = weights.loc[labels, "copying"].to_numpy(dtype=float)
    table["copying_own"] = weights.loc[labels, "copying_own"].to_numpy(dtype=float)
    cop = copying.copy()
    cop.index = [f"L{int(a)}H{int(b)}" for a, b in zip(cop["layer"], cop["head"], strict=True)]
    e = effect.table.loc[labels]
    table["reason"] = joined_reasons(labels, e, tokens.table.loc[labels], cop.loc[labels], own.loc[labels])
    table["asked"] = np.isin(labels, list(asked))
    for col in PROJECTION_COLUMNS:
        table[col] = projection.loc[labels, col].to_numpy()
    matching = controls_matching(weights, labels, n_controls, match_by)
    compared = [lab for lab in labels if bool(table.loc[lab, "closed"]) or lab in set(matching.controls)]
    stability = stability_frame([("set0", effect.table), *sets], compared)
    settings = {
        "match_by": match_by, "n_controls": n_controls, "n_boot": n_boot, "sets": ["set0", *(n for n, _ in sets)],
        "predicted_k": effect.summary.get("predicted_k"),
    }  # fmt: skip
    table, signs, summary = derive_all(
        table, weights, effect.positions, stability, {**settings, "seed": seed, "n_permutations": n_permutations}
    )
    if roles is not None:
        rt = roles.table
        for col in ROLE_COLUMNS:
            table[col] = rt.loc[labels, col].to_numpy(dtype=float)
    summary = {
        "model_name": tokens.summary.get("model_name"),
        "n_heads": len(table),
        "n_closed": int(table["closed"].to_numpy(dtype=bool).sum()),
        "n_asked": int(table["asked"].sum()),
        "threshold": float(threshold),
        **summary,
        "n_permutations": n_permutations,
        "p_floor": min(1.0, 2 / (n_permutations + 1)),
        "seed": seed,
        "tied": tie.tied,
        "embedding_tie": tie.to_dict(),
        "conventions": {
            "effect": effect.summary.get("convention"),
            "tokens": tokens.summary.get("convention"),
            "copying_own": COPYING_OWN_CONVENTION,
        },
        "head_tokens": thawed(tokens.summary),
        "attended_token_effect": thawed(effect.summary),
        "settings": settings,
    }
    summary["headline"] = mechanism_headline(summary, tie)
    return Mechanism(
        table=table, signs=signs, summary=summary, tokens=tokens, effect=effect, tie=tie, weights=weights,
        stability=stability,
    )  # fmt: skip


def check_mechanism_fits_report(heads: pd.DataFrame, threshold: float, mech: Any) -> Mechanism:
    """A mechanism result joined with *this* report: every head it joined and every head of its weights table is
    one of the report's, with the report's P, α and closed flag, at the report's threshold (no second identity
    check: ``rep.mechanism`` ran the report's; this refuses a result of another report, never joining it to the
    wrong heads by label).

    Raises:
        OptionTypeError: not a :class:`Mechanism`. OptionError: heads, P, α or threshold that are not the report's
            (names the first heads).
    """
    from ..errors import OptionError, OptionTypeError

    if not isinstance(mech, Mechanism):
        raise OptionTypeError(f"mechanism must be the result of rep.mechanism(model=...); got {type(mech).__name__}.")
    bad: list[str] = []
    for t in (mech._table, mech.weights):
        lack = [x for x in t.index if x not in heads.index]
        if lack:
            raise OptionError(
                f"This mechanism result joined heads the report did not measure ({lack[:5]}): it is of another "
                "report; make it with this report, rep.mechanism(model=...)."
            )
        h = heads.loc[t.index]
        for col in ("P", "alpha"):
            a, b = t[col].to_numpy(dtype=float), h[col].to_numpy(dtype=float)
            bad += [lab for lab, d in zip(t.index, ~((a == b) | (np.isnan(a) & np.isnan(b)))) if d]
    if bad or float(mech.summary.get("threshold", math.nan)) != float(threshold):
        raise OptionError(
            f"This mechanism result was joined with another report (P or α differ at {sorted(set(bad))[:5]}, or "
            f"threshold {mech.summary.get('threshold')} != {threshold:g}): make it with this report, "
            "rep.mechanism(model=...)."
        )
    return mech


def mechanism_columns(mech: Mechanism) -> pd.DataFrame:
    """The :data:`EXPORT_MECHANISM_COLUMNS` of ``mech`` (nullable booleans as object: True/False/None)."""
    t = mech._table.rename(columns={"reason": "mechanism_reason"}).loc[:, list(EXPORT_MECHANISM_COLUMNS)].copy()
    for col in ("sign_agrees", "agrees_alpha", "direction_kept"):
        if col in t.columns:
            t[col] = pd.Series([None if pd.isna(v) else bool(v) for v in t[col]], index=t.index, dtype=object)
    return t


def mechanism_record(mech: Mechanism) -> dict[str, Any]:
    """The JSON export of a mechanism result: its summary (without the probes' own summaries), its ``signs`` rows
    and its matched pairs (closed head, control), under ``"mechanism"`` of the report's ``--json``."""
    s = {k: v for k, v in thawed(mech.summary).items() if k not in ("head_tokens", "attended_token_effect")}
    signs = [{"quantity": q, "group": g, **row.to_dict()} for (q, g), row in mech.signs.iterrows()]
    t = mech._table
    pairs = [
        {"closed": c.strip(), "control": lab}
        for lab, of in zip(t.index, t["control_of"], strict=True)
        if of
        for c in str(of).split(",")
    ]
    return {"summary": s, "signs": signs, "controls": pairs}


@saves("mechanism")
def save_mechanism(result: Mechanism, path: PathLike, overwrite: bool = False) -> str:
    """Save a mechanism result (``rep.mechanism``) to the folder ``path`` (module docstring); ``Mechanism.save``.

    Args:
        result: the result to save.
        path: a folder that does not exist yet (or is empty), or an earlier mechanism save with ``overwrite``.
        overwrite: replace an earlier mechanism save's files (only ``mechanism.json`` and the tables it lists).

    Returns:
        The folder, as a string.

    Raises:
        OptionTypeError: ``result`` is not a :class:`Mechanism`; ``path`` not a path; ``overwrite`` not a bool.
        OutputOverInputError (an ``OptionError``): ``path`` is the folder ``result`` was loaded from, or in it.
        OptionError: as :func:`~tl_idempotence.core.records.write_tables_record` (non-empty folder, missing parent,
            an edited earlier record; names it); ``path`` ends in a file extension (``.html``, ``.json``, ``.csv``,
            ``.parquet``): a mechanism save is a folder; a result without the attended-token effect it was made
            with; as the probes' savers for its parts (``head_tokens/``, ``attended_token_effect/``).
    """
    from ..errors import OptionTypeError
    from .mechanism_store import write_mechanism

    if not isinstance(result, Mechanism):
        raise OptionTypeError(f"save_mechanism saves a Mechanism (rep.mechanism); got {type(result).__name__}.")
    return write_mechanism(result, path, overwrite=overwrite)


@loads("mechanism")
def load_mechanism(path: PathLike) -> Mechanism:
    """Read back what :func:`save_mechanism` wrote, checking every digest and recomputing what the tables give.

    Args:
        path: the folder.

    Returns:
        The :class:`Mechanism`, with ``effect`` read back from its part, ``tokens`` from its part (None when the
        record lists none; ``top_tokens`` says so) and ``loaded_from`` the folder.

    Raises:
        MissingFileError: no such folder, no ``mechanism.json``, a listed table missing (names it).
        ReportFileError: another format (a save of an earlier development version: make it again; a 0.3.0 save,
            ``mechanism/1``, loads with what it does not hold NaN / None and named in ``summary["not_measured"]``,
            :mod:`.mechanism_legacy`); an edited
            record (digest) or table (sha256), each named; a table whose columns, derived columns, matched
            controls, intervals or signs, or a summary whose counts, tests, comparisons or headline, are not what
            the tables give (an edit whose digests were recomputed; names the file and the field); a save without
            its attended-token effect; a part (``head_tokens/``, ``attended_token_effect/``) refused by its loader
            or whose numbers or summary are not the joined table's (names its folder and the column).
        OptionTypeError: ``path`` is not a path.
    """
    from .mechanism_store import read_mechanism

    return read_mechanism(path, Mechanism)
