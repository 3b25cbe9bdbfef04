"""What the closed heads do to tokens, joined with closure (SPEC 12): ``rep.mechanism(model=...)``.

:func:`mechanism_join` joins a report's ``P``, ``α`` and ``closed`` (and head roles when given) with the token
readout (:func:`~tl_idempotence.probes.head_tokens.head_tokens`), the attended-token effect on text
(:func:`~tl_idempotence.probes.token_effect.attended_token_effect`), the real copying score
(:func:`~tl_idempotence.probes.roles.copying_scores`) and the copying score with ``G = I``
(:func:`~tl_idempotence.probes.tied.own_copying_scores`), and answers two questions:

* among closed heads with ``α ≠ 0`` and a nonzero direction: how many have ``direction = sign(α)``, with a
  two-sided sign test (``scipy.stats.binomtest``, p = 1/2). A head's **direction** is the direction its own test
  tests (SPEC 13): the sign of ``effect - null`` counted over its positions (``n_pos_diff - n_neg_diff`` of
  :func:`~tl_idempotence.probes.token_effect.attended_token_effect`), not the sign of its median effect by itself
  (``effect_median``, shown beside it). With ``n`` heads the two-sided sign test's smallest p is ``2^(1 - n)``
  (``summary["sign_test_floor"]``): with fewer than 6 heads it cannot reach 0.05, and the headline says so instead
  of "not detectably";
* among all joined heads with a defined ``α·P`` and effect: the Spearman correlation of ``α·P`` with
  ``effect_median`` (scipy), with a seeded two-sided permutation p (scipy's ``permutation_test``, pairings;
  floor ``2/(n_permutations + 1)``).

Signed scores (α, the direction with ``|median_diff|``, the effect by itself, both copying scores) are summarized by
sign (:attr:`Mechanism.signs`: counts of positive and negative values and the median ``|x|`` of each), never as one
median of a mixed set. Whether the
model ties its embeddings (:func:`~tl_idempotence.probes.tied.embedding_tie`) is stated, and for a tied model
the headline says which part of "closed ⇒ copying = sign(α)" is algebra.

Saving (:func:`save_mechanism`, ``Mechanism.save``; :func:`load_mechanism`) is as the report and the head roles
are saved: a folder of parquet tables and one JSON record ``mechanism.json`` holding their sha256s and its own
digest (:func:`~tl_idempotence.core.records.write_tables_record`; no pickle).
Layout: ``table.parquet`` (:attr:`Mechanism.table`, labels rebuilt from ``layer``/``head`` on load) and
``signs.parquet`` (:attr:`Mechanism.signs`, its ``quantity``/``group`` index as columns); the summary (with the
embedding tie and the probes' own summaries) is in the record, which lists in ``parts`` the probes' own results
it holds (``tokens``: the token readout behind ``top_tokens``, saved to ``head_tokens/`` by
:func:`~tl_idempotence.probes.head_tokens.save_head_tokens`; ``effect``: the per-position effects, to
``attended_token_effect/`` by :func:`~tl_idempotence.probes.token_effect.save_attended_token_effect`). A folder
whose record lists no parts loads with them None (its ``top_tokens`` says so).

A load recomputes from ``table.parquet`` what the rest of the record states (``alpha_P``, ``closed`` against the
threshold, ``sign_agrees``, the signs, the sign test, the Spearman test, the counts and the headline), so an edit
whose sha256s and digest were recomputed is refused where it makes the record disagree with itself, naming the file.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import pandas as pd

from ..core.frozen import thawed
from ..core.jsonio import json_restore
from ..core.options import strict_kwargs
from ..core.outputs import check_save_target
from ..core.records import (
    check_float_keys,
    float_keys,
    index_column,
    read_tables_record,
    same_value,
    write_tables_record,
)
from ..core.selection import head_labels
from ..core.stats import spearman_permutation
from ..core.store import saved_folder
from ..core.stored import StoredResult, StoreSpec
from ..core.tables import FrozenResult, FrozenSummary
from ..errors import OptionError, OptionTypeError, ReportFileError
from ..probes.head_tokens import head_tokens_files, load_head_tokens
from ..probes.tied import EmbeddingTie
from ..probes.token_effect import attended_token_effect_files, load_attended_token_effect
from ..views.results import DrawnResult
from .join_defaults import DEFAULT_N_PERMUTATIONS as DEFAULT_N_PERMUTATIONS
from .join_defaults import EXPORT_MECHANISM_COLUMNS
from .mechanism_stats import joined_reasons, sign_summary, sign_test_floor, signs_frame
from .roles import json_like

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

#: numpy SeedSequence tag of the permutation stream (never shared with another module's streams).
_TAG_MECHANISM = 7
#: The question every headline asks first.
QUESTION = "Does sign(α) predict the sign of a closed head's direct effect on the token it attends to?"
#: The signed columns :attr:`Mechanism.signs` summarizes (``direction``: counted by sign, ``|median_diff|`` the size).
SIGNED = ("alpha", "direction", "effect_median", "copying", "copying_own")
#: The level the sign test is read at, and the smallest number of heads whose two-sided sign test can reach it.
LEVEL = 0.05


MECHANISM_FORMAT = "tl_idempotence.mechanism/1"
MECHANISM_RECORD = "mechanism.json"


class MechanismSummary(FrozenSummary):
    """The summary of :class:`Mechanism` (typed, read-only; a mapping of the fields given; a field not given reads
    as None). ``embedding_tie`` is the :class:`~tl_idempotence.probes.tied.EmbeddingTie` as a dict; ``head_tokens``
    and ``attended_token_effect`` are the probes' own summaries."""

    __slots__ = ()
    model_name: str | None
    n_heads: int
    n_closed: int
    threshold: float
    n_sign_tested: int
    n_agree: int
    sign_test_p: float
    sign_test_floor: float
    n_spearman: int
    spearman_rho: float
    spearman_p: float
    n_permutations: int
    p_floor: float
    seed: int
    tied: bool
    embedding_tie: Mapping[str, Any]
    n_closed_own_sign_alpha: int
    median_abs_copying_closed: float
    notes: Sequence[str]
    conventions: Mapping[str, Any]
    head_tokens: Mapping[str, Any]
    attended_token_effect: Mapping[str, Any]
    headline: str


class Mechanism(StoredResult, FrozenResult, DrawnResult):
    """Result of ``rep.mechanism(model=...)`` (module docstring). Immutable, like the report: :attr:`table` and
    :attr:`signs` are copies made on each read, :attr:`summary` is read-only, and assigning an attribute raises
    ``dataclasses.FrozenInstanceError``.

    Attributes:
        table: one row per joined head, indexed by ``"L10H8"``: ``layer, head, kv_head, P, alpha, closed,
            alpha_P`` (the report's), ``effect_median, frac_negative, null_median, effect_p, effect_q,
            n_positions`` (the attended-token effect: standardized, direct, on text; ``effect_median`` by itself,
            not against its null), ``self_rank_median, frac_top_k, frac_bottom_k`` (the token readout),
            ``copying`` (the full OV circuit's score), ``copying_own`` (the same with ``G = I``: T's own
            eigenvalues), ``sign_agrees`` (closed heads with ``α ≠ 0`` and a nonzero direction:
            ``direction == sign(α)``; NA otherwise), ``median_diff`` (median of effect - null), ``direction`` (the
            tested direction: +1 raises the attended token against the null, -1 lowers it, 0 even, NaN without a
            position), ``reason`` (why a number of the row is NaN, by part; "" if none), and the attention roles
            (``previous_token, duplicate_token, induction``) when roles were given.
        signs: one row per (signed column, group ``closed``/``all``): ``n_positive, median_abs_positive,
            n_negative, median_abs_negative, n_zero, n_nan`` (``direction``: heads by direction, the median
            ``|median_diff|`` of each side).
        summary: ``model_name, n_heads, n_closed, threshold, n_sign_tested, n_agree, sign_test_p, sign_test_floor``
            (the smallest p the two-sided sign test can give with ``n_sign_tested`` heads), ``n_spearman,
            spearman_rho, spearman_p, n_permutations, p_floor, seed, tied, embedding_tie`` (the
            :class:`~tl_idempotence.probes.tied.EmbeddingTie` as a dict), ``n_closed_own_sign_alpha`` (closed heads
            whose G = I score has the sign of α), ``headline``, ``notes``, and the probes' ``conventions``.
        tokens: the :class:`~tl_idempotence.probes.head_tokens.HeadTokens` joined (its ``top_tokens``); None for
            a result read back from a save that holds none.
        effect: the :class:`~tl_idempotence.probes.token_effect.AttendedTokenEffect` joined (its positions); None
            for a result read back from a save that holds none (its table's columns and its summary are in
            :attr:`table` and ``summary["attended_token_effect"]``).
        tie: the :class:`~tl_idempotence.probes.tied.EmbeddingTie`.
        loaded_from: the folder :func:`~tl_idempotence.report.mechanism.load_mechanism` read it from
            (:meth:`save` refuses to write there), else None.
    """

    repr_keys: ClassVar[tuple[str, ...]] = (
        "model_name", "n_heads", "n_closed", "n_agree", "n_sign_tested", "sign_test_p", "spearman_rho", "tied",
    )  # fmt: skip
    display_kind: ClassVar[str] = "mechanism"
    frozen_name: ClassVar[str] = "a mechanism result is"
    frozen_hint: ClassVar[str] = "rep.mechanism again"
    summary_type: ClassVar[type[FrozenSummary]] = MechanismSummary
    store: ClassVar[StoreSpec] = StoreSpec(
        name="mechanism",
        record=MECHANISM_RECORD,
        formats=(MECHANISM_FORMAT,),
        free_fields=(
            ("summary.embedding_tie.how", "how the embeddings' tie was read off the model, recorded once"),
            ("summary.embedding_tie.max_rel_diff", "the measured gap between W_U and W_Eᵀ, recorded once"),
            ("summary.embedding_tie.dtypes", "the embeddings' dtypes, recorded once"),
        ),
    )

    _signs: pd.DataFrame
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
    ) -> None:
        # _signs is never handed out: the property gives copies
        self._freeze_result(table, summary, loaded_from, _signs=signs.copy(), tokens=tokens, effect=effect, tie=tie)

    @property
    def signs(self) -> pd.DataFrame:
        """The signed columns summarized by sign (class docstring): a copy."""
        return self._signs.copy()

    @property
    def headline(self) -> str:
        """One sentence: the question, the answer, the supporting numbers, and the tie of the embeddings."""
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

    @classmethod
    def load(cls, path: PathLike) -> Mechanism:
        """:func:`~tl_idempotence.report.mechanism.load_mechanism`: a folder :meth:`save` wrote, checked.

        Raises:
            MissingFileError: no such folder, or a file its record lists is missing (names it).
            ReportFileError: another format, an edited or foreign file, or a field that is not what the saved tables
                give (names the file and the field).
        """
        return load_mechanism(path)

    def save(self, path: PathLike, overwrite: bool = False) -> str:
        """Save to the folder ``path`` (:func:`~tl_idempotence.report.mechanism.save_mechanism`): parquet
        tables and one JSON record with their sha256s and its own digest, no pickle.

        Args:
            path: a folder that does not exist yet (or is empty), or an earlier mechanism save with ``overwrite``.
            overwrite: replace an earlier mechanism save's files (only those).

        Returns:
            The folder, as a string.

        Raises:
            OptionTypeError, OptionError, OutputOverInputError: as
                :func:`~tl_idempotence.report.mechanism.save_mechanism`.
        """
        return save_mechanism(self, path, overwrite=overwrite)

    def figure(self) -> Any:
        """Plotly figure: each joined head's attended-token effect against α·P, closed heads marked, the sign
        agreement and the Spearman ρ in its title (:func:`tl_idempotence.views.figures.mechanism_figure`)."""
        from ..views import mechanism_figure

        return mechanism_figure(self)

    def to_text(self, n: int = 20) -> str:
        """The headline, the closed heads' rows (by P) and the sign summary, as plain text.

        Raises:
            TypeError / ValueError: ``n`` is not a non-negative whole number (pandas' ``head``).
        """
        cols = ["P", "alpha", "effect_median", "direction", "effect_q", "self_rank_median", "copying", "copying_own"]
        t = self._table
        closed = t[t["closed"]].sort_values("P", ascending=False, kind="stable")[cols]
        parts = [self.headline, f"closed heads ({len(closed)}):", closed.head(n).to_string() if len(closed) else "-"]
        if len(closed) > n:
            parts.append(f"... ({len(closed) - n} more)")
        parts += ["by sign:", self._signs.to_string()]
        return "\n".join(parts)

    def __str__(self) -> str:
        return self.to_text()


def _spearman(x: np.ndarray, y: np.ndarray, n_perm: int, seed: int) -> tuple[float, float, str]:
    if len(x) < 3:
        return math.nan, math.nan, f"Spearman undefined: {len(x)} head(s) with a defined α·P and effect (need 3)"
    if np.ptp(x) == 0 or np.ptp(y) == 0:
        return math.nan, math.nan, "Spearman undefined: α·P or the effect is constant over the heads"
    rng = np.random.default_rng(np.random.SeedSequence([seed, _TAG_MECHANISM]))
    rho, p = spearman_permutation(x, y, n_perm, rng)
    return rho, p, ""


def _fmt_p(p: float) -> str:
    return "undefined" if not math.isfinite(p) else (f"{p:.2g}" if p >= 1e-3 else f"{p:.1e}")


def mechanism_headline(s: dict[str, Any], tie: EmbeddingTie, n_closed_own: int, med_abs_copy: float) -> str:
    n, k, p = s["n_sign_tested"], s["n_agree"], s["sign_test_p"]
    floor = sign_test_floor(n)
    if s["n_closed"] == 0:
        first = f"{QUESTION} No head is closed"
    elif n == 0:
        first = (
            f"{QUESTION} Undefined: no closed head of {s['n_closed']} has both α ≠ 0 and a direction (effect - null "
            "with more positions one way than the other)"
        )
    else:
        agree = (
            f"{k} of {n} closed heads agree (direction: the sign of effect - null, what each head's test tests; "
            f"two-sided sign test p = {_fmt_p(p)}"
        )
        if floor > LEVEL:
            first = (
                f"{QUESTION} Too few closed heads to tell: {agree}, and with {n} heads it cannot be below "
                f"{floor:.3g} > {LEVEL:g})"
            )
        else:
            answer = ("Yes" if 2 * k > n else "The opposite") if math.isfinite(p) and p <= LEVEL else "Not detectably"
            first = f"{QUESTION} {answer}: {agree})"
    rho = s["spearman_rho"]
    second = (
        f"across {s['n_spearman']} heads, Spearman ρ(α·P, effect) = {rho:+.2f} (permutation p = "
        f"{_fmt_p(s['spearman_p'])})"
        if math.isfinite(rho)
        else f"across {s['n_spearman']} heads the Spearman correlation of α·P with the effect is undefined"
    )
    third = f"the model {tie.describe()}"
    if tie.tied and s["n_closed"]:
        third += (
            f"; T's own eigenvalues (G = I) give copying of the sign of α for {n_closed_own} of {s['n_closed']} "
            f"closed heads (real median |copying| among them {med_abs_copy:.3f}): that part of 'closed ⇒ copying = "
            "sign(α)' is algebra"
        )
    return f"{first}; {second}; {third}."


def derive_tests(table: pd.DataFrame, n_permutations: int, seed: int) -> tuple[Any, pd.DataFrame, dict[str, Any]]:
    """The tests a mechanism table gives (module docstring): its ``sign_agrees`` column, its :attr:`Mechanism.signs`
    and the summary's counts and p values. :func:`mechanism_join` makes a result with it and
    :func:`~tl_idempotence.report.mechanism.load_mechanism` recomputes a saved one with it.

    Args:
        table: the joined columns ``alpha, P, closed, direction, median_diff, effect_median, alpha_P, copying,
            copying_own`` (any others are ignored; ``sign_agrees``, when present, is not read).
        n_permutations, seed: the Spearman test's permutations and seed.

    Returns:
        ``(sign_agrees, signs, stats)``: a nullable boolean array (``direction == sign(α)`` for closed heads with
        ``α ≠ 0`` and a nonzero direction), the signs frame, and ``n_sign_tested, n_agree, sign_test_p,
        sign_test_floor, n_spearman, spearman_rho, spearman_p, n_closed_own_sign_alpha, median_abs_copying_closed,
        notes``.
    """
    from scipy.stats import binomtest

    alpha = table["alpha"].to_numpy(dtype=float)
    direction = table["direction"].to_numpy(dtype=float)
    eff = table["effect_median"].to_numpy(dtype=float)
    closed = table["closed"].to_numpy(dtype=bool)
    tested = closed & np.isfinite(alpha) & (alpha != 0) & np.isfinite(direction) & (direction != 0)
    agrees = np.sign(alpha) == direction
    sign_agrees = pd.array([bool(a) if t else pd.NA for a, t in zip(agrees, tested)], dtype="boolean")
    notes = []
    n_tested, n_agree = int(tested.sum()), int((agrees & tested).sum())
    if n_tested:
        p_sign = float(binomtest(n_agree, n_tested, 0.5, alternative="two-sided").pvalue)
        if sign_test_floor(n_tested) > LEVEL:
            notes.append(
                f"sign test: {n_tested} closed heads cannot give p below {sign_test_floor(n_tested):.3g} (> {LEVEL:g})"
            )
    else:
        p_sign = math.nan
        notes.append("sign test undefined: no closed head with α ≠ 0 and a nonzero direction (effect - null)")
    ap = table["alpha_P"].to_numpy(dtype=float)
    ok = np.isfinite(ap) & np.isfinite(eff)
    rho, p_rho, why = _spearman(ap[ok], eff[ok], n_permutations, seed)
    if why:
        notes.append(why)
    own_v = table["copying_own"].to_numpy(dtype=float)
    n_closed_own = int((closed & np.isfinite(own_v) & (np.sign(own_v) == np.sign(alpha)) & (alpha != 0)).sum())
    cv = np.abs(table["copying"].to_numpy(dtype=float))[closed]
    med_abs_copy = float(np.median(cv[np.isfinite(cv)])) if np.isfinite(cv).any() else math.nan
    stats = {
        "n_sign_tested": n_tested,
        "n_agree": n_agree,
        "sign_test_p": p_sign,
        "sign_test_floor": sign_test_floor(n_tested),
        "n_spearman": int(ok.sum()),
        "spearman_rho": rho,
        "spearman_p": p_rho,
        "n_closed_own_sign_alpha": n_closed_own,
        "median_abs_copying_closed": med_abs_copy,
        "notes": "; ".join(notes),
    }
    return sign_agrees, signs_frame(table, closed, SIGNED), stats


def mechanism_join(
    heads: pd.DataFrame,
    threshold: float,
    tokens: HeadTokens,
    effect: AttendedTokenEffect,
    copying: pd.DataFrame,
    own: pd.DataFrame,
    tie: EmbeddingTie,
    roles: HeadRoles | None,
    n_permutations: int,
    seed: int,
) -> Mechanism:
    """Join and test (module docstring). The inputs are already checked to be of one model (the caller,
    ``rep.mechanism``, runs the report's identity check first and computes every probe from that model).

    Args:
        heads: the report's heads restricted to the joined ones (``layer, head, kv_head, P, alpha, closed``).
        threshold: the report's P threshold. tokens, effect: the probes' results on those heads. copying: the
            real copying score (``layer, head, copying``); own: the G = I score (``copying_own``), both for every
            head. tie: the embedding tie. roles: head roles of the same model, or None.
        n_permutations, seed: the Spearman test's permutations (checked by the caller) and seed.

    Raises:
        OptionError: a probe result lacks a joined head (it was not computed on them).
    """
    from ..errors import OptionError

    labels = list(heads.index)
    tt, et = tokens.table, effect.table
    for what, frame in (("head_tokens", tt), ("attended_token_effect", et)):
        lack = [x for x in labels if x not in frame.index]
        if lack:
            raise OptionError(f"The {what} result lacks {len(lack)} joined head(s) ({lack[:5]}).")
    cop = copying.copy()
    cop.index = [f"L{int(a)}H{int(b)}" for a, b in zip(cop["layer"], cop["head"])]
    table = heads.loc[:, ["layer", "head", "kv_head", "P", "alpha", "closed"]].copy()
    table["alpha_P"] = table["alpha"].to_numpy(dtype=float) * table["P"].to_numpy(dtype=float)
    e = et.loc[labels]
    for col, src in _PART_COLUMNS["attended_token_effect"][:6]:
        table[col] = e[src].to_numpy()
    tk = tt.loc[labels]
    for col in ("self_rank_median", "frac_top_k", "frac_bottom_k"):
        table[col] = tk[col].to_numpy()
    table["copying"] = cop.loc[labels, "copying"].to_numpy(dtype=float)
    table["copying_own"] = own.loc[labels, "copying_own"].to_numpy(dtype=float)
    if roles is not None:
        rt = roles.table
        for col in ("previous_token", "duplicate_token", "induction"):
            table[col] = rt.loc[labels, col].to_numpy(dtype=float)
    table.insert(list(table.columns).index("copying_own") + 1, "median_diff", e["median_diff"].to_numpy(dtype=float))
    table.insert(list(table.columns).index("median_diff") + 1, "direction", e["direction"].to_numpy(dtype=float))
    table.insert(list(table.columns).index("direction") + 1, "reason", joined_reasons(labels, e, tk, cop, own))
    agrees_col, signs, stats = derive_tests(table, n_permutations, seed)
    table.insert(list(table.columns).index("copying_own") + 1, "sign_agrees", agrees_col)
    summary: dict[str, Any] = {
        "model_name": tokens.summary.get("model_name"),
        "n_heads": len(table),
        "n_closed": int(table["closed"].to_numpy(dtype=bool).sum()),
        "threshold": float(threshold),
        "n_sign_tested": stats["n_sign_tested"],
        "n_agree": stats["n_agree"],
        "sign_test_p": stats["sign_test_p"],
        "sign_test_floor": stats["sign_test_floor"],
        "n_spearman": stats["n_spearman"],
        "spearman_rho": stats["spearman_rho"],
        "spearman_p": stats["spearman_p"],
        "n_permutations": n_permutations,
        "p_floor": min(1.0, 2 / (n_permutations + 1)),
        "seed": seed,
        "tied": tie.tied,
        "embedding_tie": tie.to_dict(),
        "n_closed_own_sign_alpha": stats["n_closed_own_sign_alpha"],
        "median_abs_copying_closed": stats["median_abs_copying_closed"],
        "notes": stats["notes"],
        "conventions": {
            "effect": effect.summary.get("convention"),
            "tokens": tokens.summary.get("convention"),
            "copying_own": COPYING_OWN_CONVENTION,
        },
        "head_tokens": thawed(tokens.summary),
        "attended_token_effect": thawed(effect.summary),
    }
    summary["headline"] = mechanism_headline(
        summary, tie, stats["n_closed_own_sign_alpha"], stats["median_abs_copying_closed"]
    )
    return Mechanism(table=table, signs=signs, summary=summary, tokens=tokens, effect=effect, tie=tie)


def check_mechanism_fits_report(heads: pd.DataFrame, threshold: float, mech: Any) -> Mechanism:
    """A mechanism result joined with *this* report: every head it joined is one of the report's, with the
    report's P, α and closed flag, at the report's threshold (no second identity check: ``rep.mechanism`` ran the
    report's; this refuses a result of another report, never joining it to the wrong heads by label).

    Raises:
        OptionTypeError: not a :class:`Mechanism`. OptionError: heads, P, α or threshold that are not the report's
            (names the first heads).
    """
    from ..errors import OptionError, OptionTypeError

    if not isinstance(mech, Mechanism):
        raise OptionTypeError(f"mechanism must be the result of rep.mechanism(model=...); got {type(mech).__name__}.")
    t = mech._table
    lack = [x for x in t.index if x not in heads.index]
    if lack:
        raise OptionError(
            f"This mechanism result joined heads the report did not measure ({lack[:5]}): it is of another report; "
            "make it with this report, rep.mechanism(model=...)."
        )
    h = heads.loc[t.index]
    bad = []
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
    """The :data:`EXPORT_MECHANISM_COLUMNS` of ``mech`` (``sign_agrees`` as object: True/False/None)."""
    t = mech._table.rename(columns={"reason": "mechanism_reason"}).loc[:, list(EXPORT_MECHANISM_COLUMNS)].copy()
    t["sign_agrees"] = [None if pd.isna(v) else bool(v) for v in t["sign_agrees"]]
    return t.astype({"sign_agrees": object})


def mechanism_record(mech: Mechanism) -> dict[str, Any]:
    """The JSON export of a mechanism result: its summary (without the probes' own summaries) and its ``signs``
    rows, under ``"mechanism"`` of the report's ``--json``."""
    s = {k: v for k, v in thawed(mech.summary).items() if k not in ("head_tokens", "attended_token_effect")}
    signs = [{"quantity": q, "group": g, **row.to_dict()} for (q, g), row in mech._signs.iterrows()]
    return {"summary": s, "signs": signs}


#: The columns every mechanism table has, in order; the roles' columns may follow.
TABLE_COLUMNS = (
    "layer", "head", "kv_head", "P", "alpha", "closed", "alpha_P", "effect_median", "frac_negative", "null_median",
    "effect_p", "effect_q", "n_positions", "self_rank_median", "frac_top_k", "frac_bottom_k", "copying",
    "copying_own", "sign_agrees", "median_diff", "direction", "reason",
)  # fmt: skip
ROLE_COLUMNS = ("previous_token", "duplicate_token", "induction")
SIGNS_COLUMNS = (
    "quantity", "group", "n_positive", "median_abs_positive", "n_negative", "median_abs_negative", "n_zero", "n_nan",
)  # fmt: skip
#: The summary fields :func:`load_mechanism` recomputes from the table.
_RECOMPUTED = (
    "n_sign_tested", "n_agree", "sign_test_p", "sign_test_floor", "n_spearman", "spearman_rho", "spearman_p",
    "n_closed_own_sign_alpha", "median_abs_copying_closed", "notes",
)  # fmt: skip


@strict_kwargs
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
            ``.parquet``): a mechanism save is a folder; as the probes' savers for its parts (``head_tokens/``,
            ``attended_token_effect/``, written after the record).
    """

    if not isinstance(result, Mechanism):
        raise OptionTypeError(f"save_mechanism saves a Mechanism (rep.mechanism); got {type(result).__name__}.")
    check_save_target(
        path,
        "A mechanism save",
        "mechanism",
        result.loaded_from,
        "; for a page use rep.save_html(path, mechanism=...), for a table or JSON rep.export(path) (the CLI's "
        "--mechanism)",
    )
    table = result._table
    cols = [c for c in table.columns if c not in ROLE_COLUMNS]
    if tuple(cols) != TABLE_COLUMNS:
        raise OptionError(f"This Mechanism's table has columns {list(table.columns)}, not rep.mechanism's: not saved.")
    summary = dict(result.summary)
    parts = [name for name, part in (("head_tokens", result.tokens), ("attended_token_effect", result.effect)) if part]
    fields = {"summary": summary, "float_keys": sorted(float_keys(summary)), "parts": parts}
    tables = {"table": table, "signs": result._signs.reset_index()}
    files = {
        "head_tokens": None if result.tokens is None else head_tokens_files(result.tokens),
        "attended_token_effect": None if result.effect is None else attended_token_effect_files(result.effect),
    }
    parts_files = {name: fs for name, fs in files.items() if fs is not None}  # one folder, put in place in one step
    return str(
        write_tables_record(path, MECHANISM_FORMAT, MECHANISM_RECORD, tables, fields, overwrite, parts=parts_files)
    )


def _refuse(f: Path, what: str) -> ReportFileError:
    return ReportFileError(f"{f}: {what}: the record or a table was edited. Save the mechanism again (rep.mechanism).")


def load_mechanism(path: PathLike) -> Mechanism:
    """Read back what :func:`save_mechanism` wrote, checking every digest and recomputing what the table gives.

    Args:
        path: the folder.

    Returns:
        The :class:`Mechanism`, with ``tokens`` and ``effect`` read back from the parts the record lists (None
        when it lists none; ``top_tokens`` says so) and ``loaded_from`` the folder.

    Raises:
        MissingFileError: no such folder, no ``mechanism.json``, a listed table missing (names it).
        ReportFileError: another format; an edited record (digest) or table (sha256), each named; a table whose
            columns, ``alpha_P``, ``closed``, ``sign_agrees`` or signs, or a summary whose counts, tests or headline,
            are not what the table gives (an edit whose digests were recomputed; names the file and the field); a
            part (``head_tokens/``, ``attended_token_effect/``) refused by its loader or whose numbers or summary are
            not the joined table's (names its folder and the column).
        OptionTypeError: ``path`` is not a path.
    """
    raw, tables = read_tables_record(path, MECHANISM_RECORD, (MECHANISM_FORMAT,), frozenset())
    d = saved_folder(Path(path).expanduser(), MECHANISM_RECORD)  # an overwrite stopped between its two renames
    rec, ft, fs = d / MECHANISM_RECORD, d / "table.parquet", d / "signs.parquet"
    if set(tables) != {"table", "signs"}:
        raise ReportFileError(f"{rec} lists tables {sorted(tables)}; a mechanism save has ['signs', 'table'].")
    fk = raw.get("float_keys")
    if not (isinstance(fk, list) and all(isinstance(k, str) for k in fk)) or not isinstance(raw.get("summary"), dict):
        raise ReportFileError(f"{rec}: a malformed record (no summary or float_keys).")
    summary: dict[str, Any] = json_restore(raw["summary"], frozenset(fk), int_keys=False)
    check_float_keys(rec, {"summary": summary}, fk)
    table, signs = tables["table"], tables["signs"]
    cols = tuple(table.columns)
    if cols not in (TABLE_COLUMNS, (*TABLE_COLUMNS, *ROLE_COLUMNS)):
        raise ReportFileError(f"{ft} has columns {list(cols)}, not a mechanism table.")
    if tuple(signs.columns) != SIGNS_COLUMNS:
        raise ReportFileError(f"{fs} has columns {list(signs.columns)}, not a mechanism signs table.")
    table.index = head_labels(index_column(table, "layer", ft), index_column(table, "head", ft))
    if table.index.duplicated().any():
        raise _refuse(ft, f"head {table.index[table.index.duplicated()][0]} repeats")
    try:
        threshold, n_perm, seed = float(summary["threshold"]), int(summary["n_permutations"]), int(summary["seed"])
        tie = EmbeddingTie(**summary["embedding_tie"])
    except (KeyError, TypeError, ValueError) as e:
        raise ReportFileError(f"{rec}: a malformed summary ({type(e).__name__}: {e}).") from e
    P, alpha = table["P"].to_numpy(dtype=float), table["alpha"].to_numpy(dtype=float)
    if table["closed"].dtype != bool or not (table["closed"].to_numpy() == (P >= threshold)).all():
        raise _refuse(ft, f"'closed' disagrees with P >= threshold ({threshold:g})")
    if not same_value((alpha * P).tolist(), table["alpha_P"].to_numpy(dtype=float).tolist()):
        raise _refuse(ft, "'alpha_P' is not alpha * P")
    direction, effect = table["direction"].to_numpy(dtype=float), table["effect_median"].to_numpy(dtype=float)
    if not (np.isin(direction[np.isfinite(direction)], (-1.0, 0.0, 1.0)).all()) or not (
        np.array_equal(np.isnan(direction), np.isnan(effect))
    ):
        raise _refuse(ft, "'direction' is not -1, 0 or +1 where the effect is defined and NaN where it is not")
    if not all(isinstance(x, str) for x in table["reason"]):
        raise _refuse(ft, "'reason' is not text")
    agrees, fresh_signs, stats = derive_tests(table, n_perm, seed)
    if str(table["sign_agrees"].dtype) != "boolean" or not table["sign_agrees"].equals(
        pd.Series(agrees, index=table.index, name="sign_agrees")
    ):
        raise _refuse(ft, "'sign_agrees' is not what alpha, closed and direction give")
    stored = signs.set_index(["quantity", "group"])
    same_signs = list(stored.index) == list(fresh_signs.index) and list(stored.columns) == list(fresh_signs.columns)
    for col in fresh_signs.columns if same_signs else []:
        same_signs = same_signs and same_value(stored[col].tolist(), fresh_signs[col].tolist())
    if not same_signs:
        raise _refuse(fs, f"the signs are not what {ft.name} gives (recomputed over {list(SIGNED)})")
    fresh = {
        "n_heads": len(table),
        "n_closed": int(table["closed"].sum()),
        **{k: stats[k] for k in _RECOMPUTED},
    }
    for k, v in fresh.items():
        if not same_value(json_like(summary.get(k)), json_like(v)):
            raise _refuse(rec, f"summary[{k!r}] is {summary.get(k)!r} but {v!r} from {ft.name}")
    if tie.tied is not summary.get("tied"):
        raise _refuse(rec, f"summary['tied'] is {summary.get('tied')!r} but embedding_tie.tied is {tie.tied!r}")
    head = mechanism_headline(summary, tie, stats["n_closed_own_sign_alpha"], stats["median_abs_copying_closed"])
    if summary.get("headline") != head:
        raise _refuse(rec, "summary['headline'] is not what the table and the summary give")
    if not (0.0 <= threshold <= 1.0):
        raise _refuse(rec, f"summary['threshold'] is {threshold!r}, not a P threshold in [0, 1]")
    if not (1 <= n_perm <= 1 << 20) or summary.get("p_floor") != min(1.0, 2 / (n_perm + 1)):
        raise _refuse(
            rec, f"summary['n_permutations'] {n_perm!r} and summary['p_floor'] {summary.get('p_floor')!r} disagree"
        )
    _check_restated(rec, summary)
    tokens, effect = _load_parts(d, raw.get("parts", []), table, summary)
    return Mechanism(
        table=table, signs=stored, summary=summary, tokens=tokens, effect=effect, tie=tie, loaded_from=str(d)
    )


#: What ``summary["conventions"]["copying_own"]`` says (the G = I copying score).
COPYING_OWN_CONVENTION = "Re Σλ / Σ|λ| over T's own eigenvalues (G = I)"


def _check_restated(rec: Path, summary: Mapping[str, Any]) -> None:
    """What a mechanism summary restates of its probes' summaries (``head_tokens``, ``attended_token_effect``): the
    model's name, the seed and the conventions; and the G = I convention's text.

    Raises:
        ReportFileError: names the record and the field that differs.
    """
    conv = summary.get("conventions")
    if not isinstance(conv, Mapping) or conv.get("copying_own") != COPYING_OWN_CONVENTION:
        raise _refuse(rec, "summary['conventions'] is not what rep.mechanism writes")
    for part, key in (("head_tokens", "tokens"), ("attended_token_effect", "effect")):
        ps = summary.get(part)
        if not isinstance(ps, Mapping):
            raise _refuse(rec, f"summary[{part!r}] is missing")
        for field, mine in (("model_name", summary.get("model_name")), ("seed", summary.get("seed"))):
            if ps.get(field) != mine or type(ps.get(field)) is not type(mine):
                raise _refuse(
                    rec, f"summary[{field!r}] is {mine!r} but summary[{part!r}][{field!r}] is {ps.get(field)!r}"
                )
        if conv.get(key) != ps.get("convention"):
            raise _refuse(rec, f"summary['conventions'][{key!r}] is not summary[{part!r}]['convention']")


#: The joined table's columns each probe gives (mechanism column, probe column).
_PART_COLUMNS = {
    "head_tokens": (
        ("self_rank_median", "self_rank_median"), ("frac_top_k", "frac_top_k"), ("frac_bottom_k", "frac_bottom_k"),
    ),
    "attended_token_effect": (
        ("effect_median", "effect_median"), ("frac_negative", "frac_negative"), ("null_median", "null_median"),
        ("effect_p", "effect_p"), ("effect_q", "effect_q"), ("n_positions", "n_positions"),
        ("median_diff", "median_diff"), ("direction", "direction"),
    ),
}  # fmt: skip


def _load_parts(
    d: Path, parts: Any, table: pd.DataFrame, summary: Mapping[str, Any]
) -> tuple[HeadTokens | None, AttendedTokenEffect | None]:
    """The probes' results a mechanism save holds (``parts`` of its record; none in a save without them), each
    loaded and checked against the joined table and the summary.

    Raises:
        ReportFileError: ``parts`` names something else; a part whose numbers or summary are not the joined
            table's (names the part's folder and the column). As the parts' loaders (their files named).
    """
    rec = d / MECHANISM_RECORD
    if not (isinstance(parts, list) and set(parts) <= set(_PART_COLUMNS) and len(set(parts)) == len(parts)):
        raise ReportFileError(f"{rec}: parts {parts!r} are not a list of {sorted(_PART_COLUMNS)}.")
    loaded: dict[str, Any] = {}
    for name in parts:
        part = (load_head_tokens if name == "head_tokens" else load_attended_token_effect)(d / name)
        where = d / name
        pt = part._table
        lack = [x for x in table.index if x not in pt.index]
        if lack:
            raise _refuse(where, f"it lacks joined heads {lack[:5]}")
        for col, src in _PART_COLUMNS[name]:
            if not same_value(table[col].astype(float).tolist(), pt.loc[table.index, src].astype(float).tolist()):
                raise _refuse(where, f"its {src!r} is not {MECHANISM_RECORD}'s table's {col!r}")
        if not same_value(json_like(thawed(part.summary)), json_like(thawed(summary.get(name)))):
            raise _refuse(where, f"its summary is not summary[{name!r}] of {MECHANISM_RECORD}")
        loaded[name] = part
    return loaded.get("head_tokens"), loaded.get("attended_token_effect")
