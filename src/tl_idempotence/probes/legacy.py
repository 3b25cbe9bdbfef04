"""The token probes' saves of version 0.3.0 (commit 13de6bd) in this version's layout (:mod:`..core.legacy`).

Two layouts changed after 0.3.0 (issue 46), under the same format names:

* **head tokens** (``head_tokens/1`` without ``self_cosines.parquet``): the table gains ``n_ranked`` and ``reason``
  (counted from the saved self-ranks, :func:`~tl_idempotence.probes.head_tokens.no_spread_reason`), the
  ``promoted``/``suppressed`` lists are read again from the saved self-ranks (only tokens of self-rank below / above
  0.5: :func:`~tl_idempotence.probes.head_tokens.self_lists`), the singular-direction lists are kept as saved. The
  self-cosines need ``W_E``, ``W_V W_O`` and ``W_U``: NaN, and no ``*_cosine`` list, with the reason in
  ``summary["not_measured"]`` and the headline.
* **attended-token effect** (``attended_token_effect/1`` with the 13 columns of 0.3.0): the positions are what they
  were (the same effect and null, to float rounding), so every column of the table is recomputed from them by the
  loader; ``direction``, ``effect_p``/``effect_q`` and ``reason`` follow from the saved counts and tests, and the
  summary's ``n_negative_q05``/``n_positive_q05`` are counted by the tested direction (0.3.0 counted by the sign of
  the effect's own median). The copy-suppression split needs the residual stream at each head's input: not measured
  (``predicted`` NA, ``predicted_k`` None, the split's counts 0 and the rest NaN, as ``predicted_k=None`` gives), with
  the reason in ``summary["not_measured"]`` and the headline.

Before either upgrade, the save is checked **as written** (as :mod:`..report.mechanism_legacy` checks a mechanism):
its summary and options hold exactly the fields 0.3.0 wrote, and what 0.3.0 derived from its tables is recomputed
with 0.3.0's rules and compared (the head tokens' ``self_rank_median``, ``promoted``/``suppressed`` rows, the labels
and kinds of ``top.parquet`` and the headline; the effect's ``n_negative_q05``/``n_positive_q05`` by the median's
sign and the headline); a save that disagrees is refused naming its file, never overwritten. Not checkable without
the model: the direction rows' tokens and scores, ``frac_top_k``/``frac_bottom_k``, the token texts, the effect's
positions (the loader checks the table against them) and ``final_norm``.

Each upgrade is registered by the module that owns the result (a ``register`` call at its end, with the functions it
needs), so this module imports no probe.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..core.legacy import NOT_MEASURED, Upgrade, not_in_save, pending_headline
from ..core.selection import head_labels
from ..errors import ReportFileError

__all__ = [
    "V030",
    "V030_COSINES",
    "V030_EFFECT_COLUMNS",
    "V030_TOKENS_COLUMNS",
    "effect_v030",
    "head_tokens_v030",
    "malformed_v030",
]

#: The version whose layouts this module reads.
V030 = "0.3.0"
#: The ``summary["not_measured"]`` key of a head-tokens result read from a 0.3.0 save: what it lacks.
V030_COSINES = "self_cosines and the *_cosine token lists"
#: The head-tokens table of 0.3.0.
V030_TOKENS_COLUMNS = (
    "layer", "head", "kv_head", "self_rank_median", "frac_top_k", "frac_bottom_k", "n_tokens", "sv_1",
)  # fmt: skip
#: The attended-token-effect table of 0.3.0.
V030_EFFECT_COLUMNS = (
    "layer", "head", "kv_head", "n_positions", "effect_median", "frac_negative", "null_median", "median_diff",
    "n_pos_diff", "n_neg_diff", "p_value", "q_value", "raw_effect_median",
)  # fmt: skip
#: The attended-token effect's convention as 0.3.0 wrote it (this version's adds the copy-suppression condition).
V030_EFFECT_CONVENTION = (
    "direct effect: hook_z @ W_O / ln_final.hook_scale @ W_U (centred over d_model for a LayerNorm), standardized "
    "over the vocabulary; source = the most-attended counted position (BOS and special tokens excluded); no norm "
    "weight/bias, no b_U; indirect paths and self-repair not measured"
)
#: The summary and options fields 0.3.0 wrote (a 0.3.0 record holding another was edited).
V030_TOKENS_FIELDS = {
    "summary": frozenset({
        "model_name", "model_class", "n_heads", "n_tokens", "k", "seed", "d_vocab", "tokens", "convention",
        "processing", "weights_fingerprint", "embedding_fingerprint", "median_self_rank", "headline",
    }),
    "options": frozenset({"k", "n_tokens", "seed", "n_directions", "chunk"}),
}  # fmt: skip
V030_EFFECT_FIELDS = {
    "summary": frozenset({
        "model_name", "model_class", "n_heads", "n_positions", "n_windows", "seed", "convention", "final_norm",
        "test", "processing", "weights_fingerprint", "embedding_fingerprint", "n_negative_q05", "n_positive_q05",
        "headline",
    }),
    "options": frozenset({"seq_len", "max_tokens", "batch_size", "seed", "corpus"}),
}  # fmt: skip


def malformed_v030(rec: Path, e: Exception) -> ReportFileError:
    """The refusal of a 0.3.0 save (its record ``rec``) whose tables or record are malformed (``e`` says how)."""
    return ReportFileError(f"{rec}: a {V030} save whose tables or record are malformed ({type(e).__name__}: {e}).")


def _refuse_marked(rec: Path, fields: dict[str, Any]) -> None:
    """Refuse a 0.3.0 record holding the field only an upgrade sets (0.3.0 never wrote it)."""
    if NOT_MEASURED in fields.get("summary", {}):
        raise ReportFileError(f"{rec} was edited: summary[{NOT_MEASURED!r}] is a field {V030} never wrote.")


def _edited(rec: Path, what: str) -> ReportFileError:
    return ReportFileError(f"{rec} was edited: {what}, not what {V030} wrote.")


def _check_fields(rec: Path, fields: dict[str, Any], want: dict[str, frozenset[str]]) -> None:
    """Refuse a 0.3.0 record whose summary or options have other fields than 0.3.0 wrote (``want``)."""
    for part, keys in want.items():
        got = set(fields.get(part) or {})
        if got != keys:
            raise _edited(rec, f"its {part} has fields {sorted(got ^ keys)[:5]} (added or missing)")


def _old_tokens_headline(table: pd.DataFrame, labels: list[str], k: int, n_tokens: int) -> str:
    """0.3.0's head-tokens headline of its table (``probes/head_tokens.py`` at 13de6bd, ``_headline``)."""
    med = table["self_rank_median"].to_numpy(dtype=float)
    i_lo, i_hi = int(np.argmin(med)), int(np.argmax(med))
    return (
        f"Do the heads' OV circuits promote the token they read? {int((med < 0.5).sum())} of {len(table)} heads rank "
        f"their source token in the upper half of its own row (median self-rank < 0.5, over {n_tokens} tokens); the "
        f"strongest copier is {labels[i_lo]} (median self-rank {med[i_lo]:.3g}, "
        f"{table['frac_top_k'].iloc[i_lo]:.0%} of tokens in their own top {k}) and the strongest suppressor "
        f"{labels[i_hi]} (median self-rank {med[i_hi]:.3g}, {table['frac_bottom_k'].iloc[i_hi]:.0%} in their bottom "
        f"{k})."
    )


def _check_top_v030(
    rec: Path,
    table: pd.DataFrame,
    top: pd.DataFrame,
    labels: list[str],
    tok: np.ndarray,
    R: np.ndarray,
    fields: dict[str, Any],
) -> None:
    """Refuse a 0.3.0 table whose ``self_rank_median`` is not the median of the saved self-ranks ``R``
    ``[heads, tokens]``, or a ``top.parquet`` whose ``promoted``/``suppressed`` rows are not what 0.3.0 read from them
    (the ``k`` lowest / highest, ties by token id, none skipped), or holding a label or kind 0.3.0 did not write (its
    kinds: those two and ``read_i``/``write_i`` for each of the head's ``sigma_i``). The direction rows need
    ``W_E``, ``W_V W_O`` and ``W_U``: kept as saved."""
    k, ft = int(fields["summary"]["k"]), rec.parent / "top.parquet"
    if not np.array_equal(np.median(R, axis=1), table["self_rank_median"].to_numpy(dtype=float), equal_nan=True):
        raise _edited(rec.parent / "table.parquet", "'self_rank_median' is not the median of self_ranks.parquet")
    if not set(top["label"]) <= set(labels):
        raise _edited(ft, f"it lists heads {sorted(set(top['label']) - set(labels))[:3]} the table does not")
    for i, lab in enumerate(labels):
        rows = top[top["label"] == lab]
        nd = len(fields["sigmas"][lab])
        kinds = {"promoted", "suppressed"} | {f"{s}_{d}" for d in range(1, nd + 1) for s in ("read", "write")}
        if not set(rows["kind"]) <= kinds:
            raise _edited(ft, f"it lists {lab}'s kinds {sorted(set(rows['kind']) - kinds)[:3]}")
        r = R[i]
        want = [
            (kind, j + 1, int(tok[o]), float(r[o]))
            for kind, key in (("promoted", r), ("suppressed", -r))
            for j, o in enumerate(np.lexsort((tok, key))[:k])
        ]
        saved = rows[rows["kind"].isin(["promoted", "suppressed"])]
        got = list(zip(saved["kind"], saved["rank"].astype(int), saved["token_id"].astype(int), saved["value"]))
        if [(a, b, c, float(v)) for a, b, c, v in got] != want:
            raise _edited(ft, f"{lab}'s promoted/suppressed rows are not those of its saved self-ranks")


def _old_effect_summary(table: pd.DataFrame, labels: list[str]) -> dict[str, Any]:
    """0.3.0's counts (by the sign of the median effect) and headline of its effect table (``probes/token_effect.py``
    at 13de6bd, ``attended_token_effect`` and ``_headline``)."""
    q = table["q_value"].to_numpy(dtype=float)
    eff = table["effect_median"].to_numpy(dtype=float)
    sig = np.isfinite(q) & (q <= 0.05)
    neg, pos = int((sig & (eff < 0)).sum()), int((sig & (eff > 0)).sum())
    i_lo, i_hi = int(np.nanargmin(eff)), int(np.nanargmax(eff))
    headline = (
        f"Does each head raise or lower the logit of the token it attends to? Of {len(table)} heads, {neg} lower it "
        f"and {pos} raise it against a random earlier token (sign test, BH q <= 0.05); the most negative median "
        f"standardized effect is {labels[i_lo]}'s ({eff[i_lo]:+.3g}), the most positive {labels[i_hi]}'s "
        f"({eff[i_hi]:+.3g})."
    )
    return {"n_negative_q05": neg, "n_positive_q05": pos, "headline": headline}


def _labels(table: pd.DataFrame) -> list[str]:
    return list(head_labels(table["layer"].to_numpy(dtype=np.int64), table["head"].to_numpy(dtype=np.int64)))


def head_tokens_v030(
    self_lists: Callable[[np.ndarray, np.ndarray, np.ndarray, int], list[tuple[str, int, int, float]]],
    no_spread_reason: Callable[[np.ndarray], str],
    self_kinds: Sequence[str],
) -> Upgrade:
    """The upgrade of a 0.3.0 head-tokens save (module docstring), with the head-tokens module's ``self_lists``,
    ``no_spread_reason`` and ``SELF_KINDS``."""

    def upgrade(rec: Path, fields: dict[str, Any], tables: dict[str, Any]) -> tuple[dict, dict] | None:
        if set(tables) != {"table", "self_ranks", "top"} or tuple(tables["table"].columns) != V030_TOKENS_COLUMNS:
            return None
        _refuse_marked(rec, fields)
        _check_fields(rec, fields, V030_TOKENS_FIELDS)
        table = tables["table"]
        try:
            ranks, top = tables["self_ranks"], tables["top"]
            labels = _labels(table)
            k = int(fields["summary"]["k"])
            tok = ranks["token_id"].to_numpy(dtype=np.int64)
            R = ranks.loc[:, labels].to_numpy(dtype=np.float64).T  # [heads, tokens]
            _check_top_v030(rec, table, top, labels, tok, R, fields)
            if fields["summary"]["headline"] != _old_tokens_headline(
                table, labels, k, int(fields["summary"]["n_tokens"])
            ):
                raise _edited(rec, "summary['headline'] is not its table's")
            text = dict(zip(top["token_id"].tolist(), top["token"].tolist(), strict=True))
            n_ranked = np.isfinite(R).sum(axis=1).astype(np.int64)
            new = table.assign(n_ranked=n_ranked, reason=[no_spread_reason(r) for r in R])
            nan = np.full(R.shape[1], np.nan)
            cos = pd.DataFrame({"token_id": tok, **{lab: nan.copy() for lab in labels}})
            frames = []
            for i, lab in enumerate(labels):
                rows = pd.DataFrame(self_lists(tok, R[i], nan, k), columns=["kind", "rank", "token_id", "value"])
                rows.insert(3, "token", [text.get(t) for t in rows["token_id"]])
                kept = top[(top["label"] == lab) & ~top["kind"].isin(list(self_kinds))].drop(columns="label")
                frames.append(pd.concat([rows, kept], ignore_index=True).assign(label=lab))
            cols = ["label", "kind", "rank", "token_id", "token", "value"]
            new_top = pd.concat(frames, ignore_index=True)[cols].astype({"rank": np.int64, "token_id": np.int64})
        except ReportFileError:
            raise
        except (KeyError, TypeError, ValueError) as e:
            raise malformed_v030(rec, e) from e
        summary = {
            **fields["summary"],
            "headline": pending_headline(),
            NOT_MEASURED: {V030_COSINES: not_in_save(V030, "tli.head_tokens(model, ...)")},
        }
        tables = {"table": new, "self_ranks": ranks, "self_cosines": cos, "top": new_top}
        return {**fields, "summary": summary}, tables

    return upgrade


def effect_v030(
    columns: Sequence[str],
    convention: str,
    reasons: tuple[str, str],
    direction_counts: Callable[[pd.DataFrame], tuple[int, int]],
) -> Upgrade:
    """The upgrade of a 0.3.0 attended-token-effect save (module docstring), with the attended-token-effect module's
    ``TABLE_COLUMNS``, ``CONVENTION``, ``(REASON_NO_SPREAD, REASON_ALL_TIED)`` and ``direction_counts``."""

    def upgrade(rec: Path, fields: dict[str, Any], tables: dict[str, Any]) -> tuple[dict, dict] | None:
        if set(tables) != {"table", "positions"} or tuple(tables["table"].columns) != V030_EFFECT_COLUMNS:
            return None
        _refuse_marked(rec, fields)
        _check_fields(rec, fields, V030_EFFECT_FIELDS)
        table, positions = tables["table"], tables["positions"]
        try:
            if fields["summary"].get("convention") != V030_EFFECT_CONVENTION:
                raise ReportFileError(f"{rec} was edited: summary['convention'] is not what {V030} wrote.")
            for key, v in _old_effect_summary(table, _labels(table)).items():
                if fields["summary"][key] != v:
                    raise _edited(rec, f"summary[{key!r}] is not its table's (by {V030}'s rule)")
            n = table["n_positions"].to_numpy(dtype=np.int64)
            npos, nneg = (table[c].to_numpy(dtype=np.int64) for c in ("n_pos_diff", "n_neg_diff"))
            nan = np.full(len(table), np.nan)
            new = table.assign(
                direction=np.where(n > 0, np.sign(npos - nneg).astype(float), np.nan),
                effect_p=table["p_value"].to_numpy(dtype=float),
                effect_q=table["q_value"].to_numpy(dtype=float),
                reason=[
                    reasons[0] if a == 0 else reasons[1] if b + c == 0 else ""
                    for a, b, c in zip(n, npos, nneg, strict=True)
                ],
            )
            for name in ("predicted", "unpredicted"):
                new = new.assign(
                    **{
                        f"n_{name}": np.zeros(len(table), dtype=np.int64),
                        f"effect_median_{name}": nan,
                        f"median_diff_{name}": nan,
                        f"effect_p_{name}": nan,
                        f"direction_{name}": nan,
                    }
                )
            new = new.loc[:, list(columns)]
            new.index = pd.Index(_labels(table))
            neg, pos = direction_counts(new)
            pos_new = positions.assign(predicted=pd.array([pd.NA] * len(positions), dtype="boolean"))
        except ReportFileError:
            raise
        except (KeyError, TypeError, ValueError) as e:
            raise malformed_v030(rec, e) from e
        why = not_in_save(V030, "tli.attended_token_effect(model, texts, predicted_k=10)")
        summary = {
            **fields["summary"],
            "predicted_k": None,
            "convention": convention,
            "n_negative_q05": neg,
            "n_positive_q05": pos,
            "headline": pending_headline(),
            NOT_MEASURED: {"the copy-suppression split (n_predicted, *_predicted, *_unpredicted)": why},
        }
        options = {**fields["options"], "predicted_k": None}
        tables = {"table": new.reset_index(drop=True), "positions": pos_new}
        return {**fields, "summary": summary, "options": options}, tables

    return upgrade
