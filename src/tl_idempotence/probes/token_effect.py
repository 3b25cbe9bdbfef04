"""What a head does, on real text, to the token it attends to (SPEC 12, behaviour; cf. copy suppression).

For a head ``h`` of layer ``l``, at each destination position ``q`` of a window (a counted, non-special
position), the source position it attends to most, BOS and every special-token position excluded:
``s = argmax_{k <= q, k counted} pattern[q, k]`` (``blocks.{l}.attn.hook_pattern``), and its token
``t = tokens[s]``. The head's **direct logit effect** there is

    e = (z_q @ W_O[h]) / scale_q @ W_U~          (TransformerLens row form, ``d_vocab`` logits)

with ``z_q`` the head's ``blocks.{l}.attn.hook_z``, ``scale_q`` the final norm's ``ln_final.hook_scale`` at
``q`` (1 when the model has no final norm) and ``W_U~ = W_U`` centred over ``d_model`` when the final norm is a
LayerNorm (what the norm's centring does to a direct contribution; TransformerLens's ``apply_ln_to_stack``
convention). The norm's weight and bias and ``b_U`` are not applied (``fold_ln`` folds the weight into
``W_U``; the model's processing is recorded). The **standardized effect** on ``t`` is
``(e_t - mean_u e_u) / std_u e_u`` over the whole vocabulary (population std). It is computed in ``d_model``
form: ``mean_u e_u = y · ū`` and ``mean_u e_u² = y C yᵀ`` with ``ū = W_U~ 1 / d_vocab`` and
``C = W_U~ W_U~ᵀ / d_vocab`` (``d_model x d_model``, accumulated once in float64), so no position's
``d_vocab`` logits are formed. Negative: the head lowers the logit of what it reads (suppression).

Null: the same head's standardized effect at the same position on a seeded random source among the same
eligible positions (counted, ``<= q``): the token it would carry if attention were not chosen. Test: the
two-sided sign test (``scipy.stats.binomtest``, p = 1/2) of ``effect - null`` over the positions (ties
dropped), a test that assumes no distribution; q-values by Benjamini-Hochberg over the heads
(``scipy.stats.false_discovery_control``).

Direct effects only: what the head's output does through later layers (indirect paths) and what other
components do in response (self-repair) are not measured.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import pandas as pd
import torch

from ..core.heads import ModelInfo, combined_fingerprint, read_layer
from ..core.options import check_int, check_seed, strict_kwargs
from ..core.random import layer_generator
from ..core.records import index_column, tables_record_files
from ..core.selection import head_labels, select_heads
from ..core.stored import StoreSpec
from ..core.tables import FrozenSummary
from ..errors import OptionError, OptionTypeError, ReportFileError
from ..sources.tl import TLModelSource
from .head_tokens import embedding_matrices
from .token_records import (
    FREE_MODEL_FIELDS,
    TokenResult,
    check_summary,
    edited_error,
    embedding_fingerprint,
    label_heads,
    probe_fields,
    read_probe,
    same_floats,
    write_probe,
)
from .tokens import corpus_name, prepare_tokens

if TYPE_CHECKING:  # pragma: no cover
    from ..core.hints import IntLike, PathLike

__all__ = [
    "AttendedTokenEffect",
    "AttendedTokenEffectSummary",
    "attended_token_effect",
    "load_attended_token_effect",
    "save_attended_token_effect",
]

#: What the effect includes, stated in every result.
CONVENTION = (
    "direct effect: hook_z @ W_O / ln_final.hook_scale @ W_U (centred over d_model for a LayerNorm), standardized "
    "over the vocabulary; source = the most-attended counted position (BOS and special tokens excluded); no norm "
    "weight/bias, no b_U; indirect paths and self-repair not measured"
)


EFFECT_FORMAT = "tl_idempotence.attended_token_effect/1"
EFFECT_RECORD = "attended_token_effect.json"


#: What ``summary["test"]`` says.
TEST = "two-sided sign test of effect - null over positions (scipy binomtest), BH q over heads"


class AttendedTokenEffectSummary(FrozenSummary):
    """The summary of :class:`AttendedTokenEffect` (typed, read-only; a mapping of the fields given)."""

    __slots__ = ()
    model_name: str
    model_class: str
    n_heads: int
    n_positions: int
    n_windows: int
    seed: int
    convention: str
    final_norm: str
    test: str
    processing: Mapping[str, Any]
    weights_fingerprint: str
    embedding_fingerprint: str
    n_negative_q05: int
    n_positive_q05: int
    headline: str


class AttendedTokenEffect(TokenResult):
    """Result of :func:`attended_token_effect` (SPEC 12, behaviour). Immutable: every frame handed out is a
    copy made on each read, :attr:`summary` (a typed :class:`AttendedTokenEffectSummary`) and :attr:`options` are
    read-only, and assigning an attribute raises ``dataclasses.FrozenInstanceError``.

    Attributes (properties):
        table: one row per head, indexed by ``"L10H8"``: ``layer, head, kv_head, n_positions``,
            ``effect_median`` (median standardized effect on the attended token), ``frac_negative``,
            ``null_median`` (the same on a random eligible source), ``median_diff`` (of effect - null),
            ``n_pos_diff, n_neg_diff`` (sign test counts), ``p_value`` (two-sided sign test), ``q_value`` (BH over
            the heads), ``raw_effect_median`` (logit units, after the final-norm scale).
        positions: every (head, window, position) record: ``label, window, pos, source_pos, token, effect,
            null_source_pos, null_effect, raw_effect``.
        summary: ``model_name, n_heads, n_positions, n_windows, seed, convention, test, processing,
            weights_fingerprint, embedding_fingerprint``, ``n_negative_q05, n_positive_q05``, ``headline``.
        info: the model's :class:`~tl_idempotence.core.heads.ModelInfo`.
        options: ``seq_len, max_tokens, batch_size, seed, corpus``.
        loaded_from: the folder :func:`load_attended_token_effect` read it from (:meth:`save` refuses to write
            there), else None.
    """

    repr_keys: ClassVar[tuple[str, ...]] = ("model_name", "n_heads", "n_positions", "n_negative_q05", "n_positive_q05")
    frozen_name: ClassVar[str] = "an attended-token effect is"
    frozen_hint: ClassVar[str] = "tli.attended_token_effect again"
    summary_type: ClassVar[type[FrozenSummary]] = AttendedTokenEffectSummary
    probe_name: ClassVar[str] = "attended_token_effect"
    store: ClassVar[StoreSpec] = StoreSpec(
        name="attended_token_effect",
        record=EFFECT_RECORD,
        formats=(EFFECT_FORMAT,),
        free_fields=(
            *FREE_MODEL_FIELDS,
            ("summary.final_norm", "how the model's final norm was read, recorded once from the model"),
            ("summary.n_windows", "the windows run (the positions table holds those with a counted position)"),
            ("options.seq_len", "the window length asked for (the positions table holds the windows as run)"),
            ("options.max_tokens", "the token budget asked for (the positions table holds what was run)"),
            ("options.batch_size", "a performance setting: windows per forward pass; no number depends on it"),
            ("options.corpus", "the name of the text given, recorded once"),
        ),
    )

    _positions: pd.DataFrame
    summary: AttendedTokenEffectSummary

    def __init__(
        self,
        table: pd.DataFrame,
        positions: pd.DataFrame,
        summary: Mapping[str, Any],
        info: ModelInfo,
        options: Mapping[str, Any] | None = None,
        loaded_from: str | None = None,
    ) -> None:
        # _positions is never handed out: the property gives copies
        self._freeze_result(table, summary, loaded_from, _positions=positions.copy(), info=info, options=options)

    @property
    def positions(self) -> pd.DataFrame:
        """The per-position records (a copy)."""
        return self._positions.copy()

    def to_text(self, n: int = 10) -> str:
        """The headline and the ``n`` heads with the most negative and most positive median effect.

        Raises:
            TypeError / ValueError: ``n`` is not a non-negative whole number (pandas' ``head``/``tail``).
        """
        cols = ["effect_median", "frac_negative", "null_median", "p_value", "q_value", "n_positions"]
        return self.ranked_text("effect_median", cols, n)

    @classmethod
    def load(cls, path: PathLike) -> AttendedTokenEffect:
        """:func:`load_attended_token_effect`: a folder :meth:`save` wrote, checked (raises as it does)."""
        return load_attended_token_effect(path)

    @strict_kwargs
    def save(self, path: PathLike, overwrite: bool = False) -> str:
        """Save to the folder ``path`` (:func:`save_attended_token_effect`: parquet tables and one JSON record with
        their sha256s and its own digest; no pickle); :func:`load_attended_token_effect` reads it back.

        Raises:
            OptionTypeError, OptionError, OutputOverInputError: as :func:`save_attended_token_effect`.
        """
        return save_attended_token_effect(self, path, overwrite=overwrite)


def _final_norm(model: Any) -> tuple[bool, bool]:
    """``(has a final norm with hook_scale, is a LayerNorm (centres))`` of a TransformerLens model."""
    names = set(getattr(model, "hook_dict", {}) or {})
    has = "ln_final.hook_scale" in names
    norm_type = str(getattr(model.cfg, "normalization_type", "") or "")
    return has, norm_type in ("LN", "LNPre")


def _sign_test(d: np.ndarray) -> tuple[int, int, float]:
    from scipy.stats import binomtest

    pos, neg = int((d > 0).sum()), int((d < 0).sum())
    if pos + neg == 0:
        return pos, neg, float("nan")
    return pos, neg, float(binomtest(pos, pos + neg, 0.5, alternative="two-sided").pvalue)


def _headline(t: pd.DataFrame) -> str:
    q = t["q_value"].to_numpy(dtype=float)
    eff = t["effect_median"].to_numpy(dtype=float)
    sig = np.isfinite(q) & (q <= 0.05)
    neg, pos = int((sig & (eff < 0)).sum()), int((sig & (eff > 0)).sum())
    i_lo, i_hi = int(np.nanargmin(eff)), int(np.nanargmax(eff))
    return (
        f"Does each head raise or lower the logit of the token it attends to? Of {len(t)} heads, {neg} lower it and "
        f"{pos} raise it against a random earlier token (sign test, BH q <= 0.05); the most negative median "
        f"standardized effect is {t.index[i_lo]}'s ({eff[i_lo]:+.3g}), the most positive {t.index[i_hi]}'s "
        f"({eff[i_hi]:+.3g})."
    )


@strict_kwargs
def attended_token_effect(
    model: Any,
    heads: Any = None,
    texts: Any = None,
    *,
    seq_len: IntLike = 128,
    max_tokens: IntLike | None = 2048,
    batch_size: IntLike = 8,
    seed: IntLike = 0,
    text_column: str = "text",
) -> AttendedTokenEffect:
    """The direct effect of each head on the token it attends to most, on real text (SPEC 12; module docstring).

    Args:
        model: a TransformerLens model (HookedTransformer or TransformerBridge; causal), with ``W_E``/``W_U``.
        heads: ``None`` (every head), ``(layer, head)`` pairs, ``"L10H8"`` labels or a DataFrame with
            ``layer``/``head`` columns.
        texts: ``None`` (the default corpus, as :func:`~tl_idempotence.activation_returns`), a string, a list of
            strings / ``pathlib.Path`` files, a ``datasets.Dataset`` or an int tensor ``[batch, pos]`` of token ids
            (:func:`~tl_idempotence.probes.tokens.prepare_tokens`).
        seq_len: window length in tokens (text input). max_tokens: counted tokens to collect at least (None: all).
        batch_size: windows per forward pass. seed: the null sources' seed. text_column: a Dataset's text column.

    Returns:
        :class:`AttendedTokenEffect` (``.table`` indexed by ``"L10H8"``, ``.positions``, ``.headline``).

    Raises:
        UnsupportedModelError: not a TransformerLens model, no ``W_E``/``W_U``, ``d_vocab_out != d_vocab``.
        WeightError: NaN/inf in ``W_E``, ``W_U`` or a selected layer's weights.
        OptionTypeError / OptionError: unknown heads, empty or out-of-range text/token input, counts < 1, a bad
            seed; no destination position with an eligible source.
    """
    W_E, W_U = embedding_matrices(model, "attended_token_effect")
    src = TLModelSource(model)
    info = src.info
    sel = select_heads(heads, list(src.layers()), info.n_heads, labels=True)
    seq_len = check_int(seq_len, "seq_len", 2, 1 << 24)
    if max_tokens is not None:
        max_tokens = check_int(max_tokens, "max_tokens", 1)
    batch_size = check_int(batch_size, "batch_size", 1, 1 << 20)
    seed = check_seed(seed)
    toks, counted = prepare_tokens(model, texts, seq_len=seq_len, max_tokens=max_tokens, text_column=text_column)
    if not bool(counted.any()):
        raise OptionError("texts: every position is a special token (BOS/EOS/PAD/...): there is nothing to measure.")
    layers = {lay: read_layer(src, lay, info) for lay in sel}
    has_scale, centre = _final_norm(model)
    dev = W_U.device
    with torch.no_grad():
        U = W_U.to(dev, torch.float64)
        if centre:
            U = U - U.mean(0, keepdim=True)
        d_vocab = U.shape[1]
        u_bar = U.mean(1)  # [d_model]
        C = torch.zeros(U.shape[0], U.shape[0], dtype=torch.float64, device=dev)
        for s in range(0, d_vocab, 8192):
            C += U[:, s : s + 8192] @ U[:, s : s + 8192].T
        C /= d_vocab
        W_O = {lay: lh.O.to(dev, torch.float64).transpose(-1, -2) for lay, lh in layers.items()}  # [h, d_head, d_model]
        recs = _collect(model, toks, counted, sel, W_O, U, u_bar, C, has_scale, batch_size, seed)
    table, positions = _tables(recs, sel, layers)
    summary: dict[str, Any] = {
        "model_name": info.model_name,
        "model_class": info.model_class,
        "n_heads": len(table),
        "n_positions": int(table["n_positions"].max()) if len(table) else 0,
        "n_windows": len(toks),
        "seed": seed,
        "convention": CONVENTION,
        "final_norm": ("LayerNorm (centred, / hook_scale)" if centre else "/ hook_scale") if has_scale else "none",
        "test": TEST,
        "processing": dict(info.processing),
        "weights_fingerprint": combined_fingerprint([(lay, lh.fingerprint()) for lay, lh in layers.items()]),
        "embedding_fingerprint": embedding_fingerprint(W_E, W_U),
    }
    q = table["q_value"].to_numpy(dtype=float)
    e = table["effect_median"].to_numpy(dtype=float)
    summary["n_negative_q05"] = int(((q <= 0.05) & (e < 0)).sum())
    summary["n_positive_q05"] = int(((q <= 0.05) & (e > 0)).sum())
    summary["headline"] = _headline(table)
    options = {
        "seq_len": seq_len,
        "max_tokens": max_tokens,
        "batch_size": batch_size,
        "seed": seed,
        "corpus": corpus_name(texts),
    }
    return AttendedTokenEffect(table=table, positions=positions, summary=summary, info=info, options=options)


def _collect(
    model: Any,
    toks: torch.Tensor,
    counted: torch.Tensor,
    sel: dict[int, list[int]],
    W_O: dict[int, torch.Tensor],
    U: torch.Tensor,
    u_bar: torch.Tensor,
    C: torch.Tensor,
    has_scale: bool,
    batch_size: int,
    seed: int,
) -> dict[tuple[int, int], dict[str, list[np.ndarray]]]:
    """Forward passes with hooks on hook_z, hook_pattern of the selected layers and ln_final.hook_scale; the
    per-position records of every selected head."""
    gen = layer_generator(seed, None, "token_effect")
    store: dict[str, torch.Tensor] = {}

    def keep(name: str):
        def hook(x: torch.Tensor, hook: Any = None) -> None:
            store[name] = x.detach()

        return hook

    names = [f"blocks.{lay}.attn.hook_{w}" for lay in sel for w in ("z", "pattern")]
    if has_scale:
        names.append("ln_final.hook_scale")
    fwd = [(n, keep(n)) for n in names]
    recs: dict[tuple[int, int], dict[str, list[np.ndarray]]] = {
        (lay, h): {k: [] for k in ("window", "pos", "src", "tok", "eff", "nsrc", "neff", "raw")}
        for lay, hs in sel.items()
        for h in hs
    }
    device = getattr(model.cfg, "device", None) or "cpu"
    was_training = bool(getattr(model, "training", False))
    model.eval()
    try:
        for start in range(0, len(toks), batch_size):
            batch = toks[start : start + batch_size]
            cnt = counted[start : start + batch_size].to(U.device)
            store.clear()
            model.run_with_hooks(batch.to(device), fwd_hooks=fwd, return_type=None)
            P = batch.shape[1]
            tb = batch.to(U.device)
            # eligible sources of destination q: counted keys k <= q
            causal = torch.ones(P, P, dtype=torch.bool, device=U.device).tril()
            elig = causal.unsqueeze(0) & cnt.unsqueeze(1)  # [B, q, k]
            dest = cnt & elig.any(-1)  # [B, q]
            b_idx, q_idx = dest.nonzero(as_tuple=True)
            if not len(b_idx):
                continue
            # the null: a uniform draw among the eligible keys of each destination (one draw per position, shared
            # by the heads of a pass; seeded)
            w = elig[b_idx, q_idx].double()
            null_src = torch.multinomial(w.cpu(), 1, generator=gen).squeeze(1).to(U.device)
            scale = (
                store["ln_final.hook_scale"].to(U.device, torch.float64)[b_idx, q_idx, 0]
                if has_scale
                else torch.ones(len(b_idx), dtype=torch.float64, device=U.device)
            )
            for lay, hs in sel.items():
                z = store[f"blocks.{lay}.attn.hook_z"].to(U.device, torch.float64)  # [B, P, n_heads, d_head]
                pat = store[f"blocks.{lay}.attn.hook_pattern"].to(U.device, torch.float64)  # [B, n_heads, q, k]
                for h in hs:
                    p = pat[b_idx, h, q_idx]  # [n, k]
                    p = torch.where(elig[b_idx, q_idx], p, torch.full_like(p, -1.0))
                    src = p.argmax(-1)
                    y = (z[b_idx, q_idx, h] @ W_O[lay][h]) / scale.unsqueeze(1)  # [n, d_model]
                    mean = y @ u_bar
                    std = ((y @ C * y).sum(-1) - mean**2).clamp_min(0).sqrt()
                    t_src = tb[b_idx, src]
                    t_null = tb[b_idx, null_src]
                    raw = (y * U[:, t_src].T).sum(-1)
                    raw_null = (y * U[:, t_null].T).sum(-1)
                    r = recs[(lay, h)]
                    r["window"].append((b_idx + start).cpu().numpy())
                    r["pos"].append(q_idx.cpu().numpy())
                    r["src"].append(src.cpu().numpy())
                    r["tok"].append(t_src.cpu().numpy())
                    r["eff"].append(((raw - mean) / std).cpu().numpy())
                    r["nsrc"].append(null_src.cpu().numpy())
                    r["neff"].append(((raw_null - mean) / std).cpu().numpy())
                    r["raw"].append(raw.cpu().numpy())
    finally:
        if was_training:
            model.train()
    return recs


def _head_stats(eff: np.ndarray, neff: np.ndarray, raw: np.ndarray) -> dict[str, Any]:
    """One head's row from its positions' standardized effects, null effects and raw effects (a position whose
    effect or null is not finite, a zero output, is left out), from ``n_positions`` to ``raw_effect_median``."""
    ok = np.isfinite(eff) & np.isfinite(neff)  # a zero output (std 0) has no standardized effect
    d = eff[ok] - neff[ok]
    npos, nneg, p = _sign_test(d)
    nan = float("nan")
    return {
        "n_positions": int(ok.sum()),
        "effect_median": float(np.median(eff[ok])) if ok.any() else nan,
        "frac_negative": float((eff[ok] < 0).mean()) if ok.any() else nan,
        "null_median": float(np.median(neff[ok])) if ok.any() else nan,
        "median_diff": float(np.median(d)) if ok.any() else nan,
        "n_pos_diff": npos,
        "n_neg_diff": nneg,
        "p_value": p,
        "raw_effect_median": float(np.median(raw[ok])) if ok.any() else nan,
    }


def _insert_q_values(table: pd.DataFrame) -> None:
    """Insert ``q_value`` (BH over the heads with a finite ``p_value``; NaN for the others) after ``p_value``."""
    from scipy.stats import false_discovery_control

    p = table["p_value"].to_numpy(dtype=float)
    q = np.full(p.shape, np.nan)
    fin = np.isfinite(p)
    if fin.any():
        q[fin] = false_discovery_control(p[fin], method="bh")
    table.insert(table.columns.get_loc("p_value") + 1, "q_value", q)


def _tables(
    recs: dict[tuple[int, int], dict[str, list[np.ndarray]]], sel: dict[int, list[int]], layers: dict[int, Any]
) -> tuple[pd.DataFrame, pd.DataFrame]:
    rows, frames = [], []
    for (lay, h), r in recs.items():
        cat = {k: np.concatenate(v) if v else np.zeros(0) for k, v in r.items()}
        eff, neff = cat["eff"], cat["neff"]
        rows.append(
            {"layer": lay, "head": h, "kv_head": int(layers[lay].kv_head_of[h]), **_head_stats(eff, neff, cat["raw"])}
        )
        frames.append(
            pd.DataFrame(
                {
                    "label": f"L{lay}H{h}",
                    "window": cat["window"].astype(np.int64),
                    "pos": cat["pos"].astype(np.int64),
                    "source_pos": cat["src"].astype(np.int64),
                    "token": cat["tok"].astype(np.int64),
                    "effect": eff,
                    "null_source_pos": cat["nsrc"].astype(np.int64),
                    "null_effect": neff,
                    "raw_effect": cat["raw"],
                }
            )
        )
    table = pd.DataFrame(rows)
    table.index = head_labels(table["layer"], table["head"])
    _insert_q_values(table)
    return table, pd.concat(frames, ignore_index=True)


#: The columns of :attr:`AttendedTokenEffect.table` and :attr:`AttendedTokenEffect.positions`, in order.
TABLE_COLUMNS = (
    "layer", "head", "kv_head", "n_positions", "effect_median", "frac_negative", "null_median", "median_diff",
    "n_pos_diff", "n_neg_diff", "p_value", "q_value", "raw_effect_median",
)  # fmt: skip
POSITION_COLUMNS = (
    "label", "window", "pos", "source_pos", "token", "effect", "null_source_pos", "null_effect", "raw_effect",
)  # fmt: skip


@strict_kwargs
def save_attended_token_effect(result: AttendedTokenEffect, path: PathLike, overwrite: bool = False) -> str:
    """Save an :class:`AttendedTokenEffect` to the folder ``path``: ``table.parquet``
    (:attr:`~AttendedTokenEffect.table`; labels rebuilt from ``layer``/``head``), ``positions.parquet``
    (:attr:`~AttendedTokenEffect.positions`) and ``attended_token_effect.json`` (summary, options, info, the sha256
    of both tables and the record's own digest; no pickle).

    Returns:
        The folder, as a string.

    Raises:
        OptionTypeError: ``result`` is not an :class:`AttendedTokenEffect`; ``path`` not a path; ``overwrite`` not a
            bool.
        OutputOverInputError (an ``OptionError``): ``path`` is the folder ``result`` was loaded from, or in it.
        OptionError: ``path`` ends in a file extension; a non-empty folder without ``overwrite``, a missing parent,
            an edited earlier record (:func:`~tl_idempotence.core.records.write_tables_record`; names it).
    """
    if not isinstance(result, AttendedTokenEffect):
        raise OptionTypeError(
            f"save_attended_token_effect saves an AttendedTokenEffect (tli.attended_token_effect); got "
            f"{type(result).__name__}."
        )
    tables = _saved_tables(result)
    return write_probe("attended_token_effect", path, EFFECT_FORMAT, EFFECT_RECORD, tables, result, overwrite)


def _saved_tables(result: AttendedTokenEffect) -> dict[str, pd.DataFrame]:
    return {"table": result._table.loc[:, list(TABLE_COLUMNS)], "positions": result._positions}


def attended_token_effect_files(result: AttendedTokenEffect) -> dict[str, bytes]:
    """The files :func:`save_attended_token_effect` writes, as bytes (a mechanism save holds them as a part)."""
    return tables_record_files(EFFECT_FORMAT, EFFECT_RECORD, _saved_tables(result), probe_fields(result))


def load_attended_token_effect(path: PathLike) -> AttendedTokenEffect:
    """Read back what :func:`save_attended_token_effect` wrote, checking every digest and recomputing from the
    positions every column of the table (medians, counts, sign test, BH q-values) and the summary's ``n_heads``,
    ``n_positions``, ``n_negative_q05``, ``n_positive_q05`` and ``headline``.

    Args:
        path: the folder.

    Returns:
        The :class:`AttendedTokenEffect` (equal tables and summary; ``loaded_from`` the folder). Join it with a
        model only after :meth:`AttendedTokenEffect.check_model`.

    Raises:
        MissingFileError: no such folder, no ``attended_token_effect.json``, a listed table missing (names it).
        ReportFileError: another format; an edited record (digest) or table (sha256), each named; columns, a
            table value or a summary field that are not what the positions give (an edit whose digests were
            recomputed; names the file and the field).
        OptionTypeError: ``path`` is not a path.
    """
    names = frozenset({"table", "positions"})
    d, fields, tables, info = read_probe(path, EFFECT_FORMAT, EFFECT_RECORD, names)
    rec, ft, fp = d / EFFECT_RECORD, d / "table.parquet", d / "positions.parquet"
    edited = functools.partial(edited_error, again="tli.attended_token_effect")

    table, positions = tables["table"], tables["positions"]
    if tuple(table.columns) != TABLE_COLUMNS:
        raise ReportFileError(f"{ft} has columns {list(table.columns)}, not an attended-token-effect table.")
    if tuple(positions.columns) != POSITION_COLUMNS:
        raise ReportFileError(f"{fp} has columns {list(positions.columns)}, not {list(POSITION_COLUMNS)}.")
    labels = label_heads(table, ft, "tli.attended_token_effect")
    try:
        summary = AttendedTokenEffectSummary(fields["summary"])
    except (TypeError, ValueError, OptionError) as e:
        raise ReportFileError(f"{rec}: a malformed summary ({type(e).__name__}: {e}).") from e
    for col in (*POSITION_COLUMNS[1:5], "null_source_pos"):
        index_column(positions, col, fp)  # whole numbers
    if set(positions["label"]) - set(labels):
        raise edited(fp, f"positions of heads the table lacks ({sorted(set(positions['label']) - set(labels))[:5]})")
    groups = {lab: g for lab, g in positions.groupby("label", sort=False)}
    rows = []
    for lab in labels:
        g = groups.get(lab, positions.iloc[:0])
        rows.append(_head_stats(*(g[c].to_numpy(dtype=np.float64) for c in ("effect", "null_effect", "raw_effect"))))
    fresh = pd.DataFrame(rows, index=table.index)
    fresh.insert(0, "kv_head", table["kv_head"].to_numpy())
    _insert_q_values(fresh)
    for col in TABLE_COLUMNS[3:]:
        if not same_floats(table[col].to_numpy(dtype=float), fresh[col].to_numpy(dtype=float)):
            raise edited(ft, f"{col!r} is not what {fp.name} gives")
    q, med = fresh["q_value"].to_numpy(dtype=float), fresh["effect_median"].to_numpy(dtype=float)
    fresh_summary = {
        "n_heads": len(labels),
        "n_positions": int(fresh["n_positions"].max()),
        "n_negative_q05": int(((q <= 0.05) & (med < 0)).sum()),
        "n_positive_q05": int(((q <= 0.05) & (med > 0)).sum()),
        "headline": _headline(table),
    }
    check_summary(summary, fresh_summary, rec, "tli.attended_token_effect")
    for key, want in (("convention", CONVENTION), ("test", TEST)):
        if summary.get(key) != want:
            raise edited(rec, f"summary[{key!r}] is not what tli.attended_token_effect writes")
    return AttendedTokenEffect(
        table=table, positions=positions, summary=summary, info=info, options=fields["options"], loaded_from=str(d)
    )
