"""What a head does, on real text, to the token it attends to (SPEC 12, behaviour; cf. copy suppression).

For a head ``h`` of layer ``l``, at each destination position ``q`` of a window (a counted, non-special
position), the source position it attends to most among the counted positions at or before ``q`` (``q`` itself
included: a head may attend to its own position; BOS and every special-token position excluded):
``s = argmax_{k <= q, k counted} pattern[q, k]`` (``blocks.{l}.attn.hook_pattern``; the first of equal
weights), and its token ``t = tokens[s]``. The head's **direct logit effect** there is

    e = (z_q @ W_O[h]) / post_q / scale_q @ W_U~          (TransformerLens row form, ``d_vocab`` logits)

with ``z_q`` the head's ``blocks.{l}.attn.hook_z``, ``scale_q`` the final norm's ``ln_final.hook_scale`` at
``q`` (1 when the model has no final norm), ``post_q`` the run-time scale of a norm that follows ``W_O``
(Gemma-2/3: ``blocks.{l}.ln1_post.hook_scale``; 1 for a model without one, by the one rule
:func:`~tl_idempotence.sources.checkpoint.post_attention_note`; a model with such a norm and no hook to read its
scale from is refused) and ``W_U~ = W_U`` centred over ``d_model`` when the final norm is a LayerNorm (what the
norm's centring does to a direct contribution; TransformerLens's ``apply_ln_to_stack`` convention). The norms'
weights and biases and ``b_U`` are not applied (``fold_ln`` folds the final norm's weight into ``W_U``; the
model's processing is recorded). The **standardized effect** on ``t`` is ``(e_t - mean_u e_u) / std_u e_u`` over
the whole vocabulary (population std; the scales divide every logit of the position alike, so only the raw
effect, in logit units, depends on them). It is computed in ``d_head`` form: ``mean_u e_u ∝ z · (W_O ū)`` and
``mean_u e_u² ∝ z (W_O C W_Oᵀ) zᵀ`` with ``ū = W_U~ 1 / d_vocab`` and ``C = W_U~ W_U~ᵀ / d_vocab``
(``d_model x d_model``, accumulated once in float64), so no position's ``d_vocab`` logits are formed. Negative:
the head lowers the logit of what it reads (suppression). A position whose logits have no spread (a zero
output: ``std = 0``) has no standardized effect (NaN) and is left out of the head's statistics.

Null: the same head's standardized effect at the same position on a seeded random source among the same
eligible positions (counted, ``<= q``): the token it would carry if attention were not chosen. The draws come
from one generator per call, in window order (no number depends on ``batch_size``). Test: the two-sided sign test
(``scipy.stats.binomtest``, p = 1/2) of ``effect - null`` over the positions (ties dropped), a test that assumes
no distribution (``effect_p``); q-values by Benjamini-Hochberg over all the heads measured (``effect_q``;
``scipy.stats.false_discovery_control``). A head's **direction** is the sign of what its test tests,
``n_pos_diff - n_neg_diff`` (+1: the head raises the attended token's logit relative to the null, -1: lowers
it; SPEC 13); the effect's own median (``effect_median``, not against the null) is shown beside it. A two-sided
sign test over ``n`` positions cannot give ``p`` below ``2^(1 - n)``: a head with fewer than 6 positions cannot
reach 0.05, and the headline says how many such heads there are.

**The copy-suppression condition** (McDougall et al. 2023; SPEC 13): at each position, whether the attended token
``t`` is already **predicted** at the head's input, i.e. among the ``predicted_k`` (default 10) largest logits of the
residual stream before the head's layer, ``blocks.{l}.hook_resid_pre`` at the destination ``q`` read as the output
is read (through ``W_U~``; the final norm's scale at ``q`` divides every logit alike and leaves the ranks; no norm
weight, no ``b_U``): ``#{u != t : logit_u > logit_t} < k`` in float64 (ties go to ``t``;
:func:`~tl_idempotence.probes.token_effect_run.top_k_flags`, exact without every position's float64 logits). Each
head's effect, effect - null and its sign test are split by it (``_predicted`` / ``_unpredicted`` columns):
suppression heads are expected to act where the token is predicted. ``predicted_heads`` limits it to some heads
(its cost is ``d_vocab`` logits per position and layer).

Direct effects only: what the head's output does through later layers (indirect paths) and what other
components do in response (self-repair) are not measured.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import pandas as pd
import torch

from ..core.heads import ModelInfo, read_layer
from ..core.legacy import register
from ..core.options import check_bool, check_int, check_seed, strict_kwargs
from ..core.records import index_column, tables_record_files
from ..core.selection import head_labels, select_heads
from ..core.stored import StoreSpec, loads, saves
from ..core.tables import FrozenSummary
from ..errors import OptionError, OptionTypeError, ReportFileError, UnsupportedModelError
from ..sources.tl import is_causal_lm
from .legacy import effect_v030
from .token_effect_run import EffectRun, LayerOps
from .token_records import (
    FREE_MODEL_FIELDS,
    FREE_WINDOW_FIELDS,
    TokenResult,
    check_summary,
    model_fingerprints,
    probe_fields,
    probe_model,
    read_probe_save,
    same_floats,
    write_probe,
)
from .tokens import corpus_name, prepare_tokens, tokenizer_of

if TYPE_CHECKING:  # pragma: no cover
    from pathlib import Path

    from ..core.hints import HeadsLike, IntLike, PathLike, TextsLike, TLModel

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
    "weight/bias, no b_U; indirect paths and self-repair not measured; predicted: the attended token among the "
    "predicted_k largest logits of blocks.{l}.hook_resid_pre at the destination read through W_U (as the output)"
)


#: The record fields of its save that nothing derives or restates, with why (:attr:`StoreSpec.free_fields`).
EFFECT_FREE_FIELDS = (
    *FREE_MODEL_FIELDS,
    *FREE_WINDOW_FIELDS,
    ("options.batch_size", "a performance setting: windows per forward pass; no number depends on it"),
)
#: How an attended-token effect is stored (:class:`~tl_idempotence.core.stored.StoreSpec`).
EFFECT_STORE = StoreSpec(
    name="attended_token_effect", formats=("tl_idempotence.attended_token_effect/1",), free_fields=EFFECT_FREE_FIELDS
)
EFFECT_FORMAT = EFFECT_STORE.format
EFFECT_RECORD = EFFECT_STORE.record


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
    predicted_k: int | None
    convention: str
    final_norm: str
    test: str
    processing: Mapping[str, Any]
    weights_fingerprint: str
    embedding_fingerprint: str
    n_negative_q05: int
    n_positive_q05: int
    headline: str
    not_measured: Mapping[str, str]


class AttendedTokenEffect(
    TokenResult,
    repr_keys="model_name n_heads n_positions n_negative_q05 n_positive_q05",
    frozen=("an attended-token effect is", "tli.attended_token_effect again"),
    summary_type=AttendedTokenEffectSummary,
):
    """Result of :func:`attended_token_effect` (SPEC 12, behaviour). Immutable: every frame handed out is a
    copy made on each read, :attr:`summary` (a typed :class:`AttendedTokenEffectSummary`) and :attr:`options` are
    read-only, and assigning an attribute raises ``dataclasses.FrozenInstanceError``.

    Attributes (properties):
        table: one row per head, indexed by ``"L10H8"``: ``layer, head, kv_head, n_positions``,
            ``effect_median`` (median standardized effect on the attended token, by itself: not against its
            null), ``frac_negative``, ``null_median`` (the same on a random eligible source), ``median_diff`` (of
            effect - null), ``n_pos_diff, n_neg_diff`` (sign test counts), ``p_value``/``q_value`` (deprecated
            names of ``effect_p``/``effect_q``, equal to them), ``raw_effect_median`` (logit units, after the
            norms' scales; "raw" means unstandardized), ``direction`` (the tested direction, SPEC 13: the sign of
            ``n_pos_diff - n_neg_diff``, +1 raises the attended token's logit against the null, -1 lowers it, 0 as
            many positions each way, NaN without a position), ``effect_p`` (two-sided sign test of effect - null),
            ``effect_q`` (BH over all the heads measured), ``reason`` (why a head's numbers are NaN; "" if none),
            and the copy-suppression split (module docstring): ``n_predicted, effect_median_predicted,
            median_diff_predicted, effect_p_predicted, direction_predicted`` over the positions where the attended
            token is already predicted at the head's input, the same ``_unpredicted`` where it is not (``n_``
            both 0 and the rest NaN: not measured).
        positions: every (head, window, position) record: ``label, window, pos, source_pos, token, effect,
            null_source_pos, null_effect, raw_effect, predicted`` (nullable boolean: NA where not measured).
        summary: ``model_name, n_heads, n_positions, n_windows, seed, convention, test, processing,
            weights_fingerprint, embedding_fingerprint``, ``n_negative_q05, n_positive_q05`` (heads whose test
            reaches ``effect_q <= 0.05`` with direction -1 / +1: they lower / raise the attended token against
            the null), ``headline``.
        info: the model's :class:`~tl_idempotence.core.heads.ModelInfo`.
        options: ``seq_len, max_tokens, batch_size, seed, corpus``.
        loaded_from: the folder :func:`load_attended_token_effect` read it from (:meth:`save` refuses to write
            there), else None.
    """

    store: ClassVar[StoreSpec] = EFFECT_STORE

    positions: pd.DataFrame
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
        self._freeze_result(table, summary, loaded_from, positions=positions, info=info, options=options)

    def to_text(self, n: int = 10) -> str:
        """The headline and the ``n`` heads with the most negative and most positive median effect (by itself), with
        the null's median, the tested direction, p and q.

        Raises:
            TypeError / ValueError: ``n`` is not a non-negative whole number (pandas' ``head``/``tail``).
        """
        cols = ["effect_median", "frac_negative", "null_median", "direction", "effect_p", "effect_q", "n_positions"]
        return self.ranked_text("effect_median", cols, n)


def _final_norm(model: Any) -> tuple[bool, bool]:
    """``(has a final norm with hook_scale, is a LayerNorm (centres))`` of a TransformerLens model."""
    names = set(getattr(model, "hook_dict", {}) or {})
    has = "ln_final.hook_scale" in names
    norm_type = str(getattr(model.cfg, "normalization_type", "") or "")
    return has, norm_type in ("LN", "LNPre")


#: The run-time scale of the norm after ``W_O`` (Gemma-2/3 in TransformerLens and its bridge), per layer.
POST_NORM_HOOK = "blocks.{l}.ln1_post.hook_scale"
#: The window length when ``seq_len`` is not given (the model's ``n_ctx`` when that is smaller).
DEFAULT_SEQ_LEN = 128
#: The copy-suppression condition's ``k`` when not given: the attended token among the 10 largest logits.
DEFAULT_PREDICTED_K = 10
#: The two-sided sign test's smallest p over ``n`` positions is ``2^(1 - n)``: below 6 it cannot reach 0.05.
MIN_POSITIONS_05 = 6


def _check_runnable(model: Any, info: ModelInfo, layers: list[int]) -> dict[int, str]:
    """Refuse what the probe cannot measure, before any forward pass; the post-attention norm's hook per layer.

    Raises:
        UnsupportedModelError: a non-causal model (an encoder: its positions also attend to later ones, so "the
            source it attends to among earlier positions" is not what the head reads); a norm after ``W_O`` (the
            one rule, ``info.extra["post_attention_norm"]``) without a ``blocks.{l}.ln1_post.hook_scale`` to read
            its run-time scale from (names the note).
    """
    if not is_causal_lm(model):
        raise UnsupportedModelError(
            f"attended_token_effect needs a causal language model (each position attends to itself and earlier "
            f"positions); {type(model).__name__} ({getattr(model.cfg, 'model_name', '?')}) attends bidirectionally "
            "(an encoder), so the source a head attends to is not among earlier positions only."
        )
    note = info.extra.get("post_attention_norm")
    if not note:
        return {}
    names = set(getattr(model, "hook_dict", {}) or {})
    hooks = {lay: POST_NORM_HOOK.format(l=lay) for lay in layers}
    lack = [h for h in hooks.values() if h not in names]
    if lack:
        raise UnsupportedModelError(
            f"attended_token_effect: in this model {note}; a head's direct effect passes through that norm, whose "
            f"run-time scale this model exposes at no hook ({lack[0]!r} missing): refused rather than measured "
            "without it."
        )
    return hooks


def _check_context(model: Any, seq_len: Any, texts: Any) -> int:
    """The window length: ``None`` gives 128, or the model's ``n_ctx`` when smaller; an explicit ``seq_len`` above
    ``n_ctx`` is refused when it is used (text input; token ids are run as given, checked by :func:`_check_windows`).

    Raises:
        OptionTypeError / OptionError: ``seq_len`` not an integer in ``2 .. 2^24``, or above ``n_ctx`` (names it).
    """
    n_ctx = int(getattr(model.cfg, "n_ctx", 0) or 0)
    if seq_len is None:
        return min(DEFAULT_SEQ_LEN, n_ctx) if n_ctx >= 2 else DEFAULT_SEQ_LEN
    seq_len = check_int(seq_len, "seq_len", 2, 1 << 24)
    text_input = not isinstance(texts, (torch.Tensor, np.ndarray))
    if text_input:
        tokenizer_of(model)  # text needs a tokenizer: that refusal first (OptionError)
    if text_input and n_ctx and seq_len > n_ctx:
        raise OptionError(
            f"seq_len={seq_len} is longer than the model's context (n_ctx = {n_ctx}): use seq_len <= {n_ctx}, or "
            "leave it out (128, or n_ctx when smaller)."
        )
    return seq_len


def _check_windows(model: Any, toks: torch.Tensor) -> None:
    """Refuse token windows longer than the model's ``n_ctx`` (names both).

    Raises:
        OptionError: ``toks.shape[1] > n_ctx``.
    """
    n_ctx = int(getattr(model.cfg, "n_ctx", 0) or 0)
    if n_ctx and toks.shape[1] > n_ctx:
        raise OptionError(
            f"texts: token windows of {toks.shape[1]} positions are longer than the model's context (n_ctx = "
            f"{n_ctx}): pass at most {n_ctx} positions per row."
        )


def _sign_test(d: np.ndarray) -> tuple[int, int, float]:
    from scipy.stats import binomtest

    pos, neg = int((d > 0).sum()), int((d < 0).sum())
    if pos + neg == 0:
        return pos, neg, float("nan")
    return pos, neg, float(binomtest(pos, pos + neg, 0.5, alternative="two-sided").pvalue)


def direction_counts(t: pd.DataFrame, level: float = 0.05) -> tuple[int, int]:
    """``(lower, raise)``: heads whose test reaches ``q <= level`` with direction -1 / +1 (SPEC 13). Raises
    nothing."""
    q = t["effect_q"].to_numpy(dtype=float)
    d = t["direction"].to_numpy(dtype=float)
    sig = np.isfinite(q) & (q <= level)
    return int((sig & (d < 0)).sum()), int((sig & (d > 0)).sum())


def _headline(t: pd.DataFrame) -> str:
    neg, pos = direction_counts(t)
    eff = t["effect_median"].to_numpy(dtype=float)
    first = (
        f"Does each head raise or lower the logit of the token it attends to? Of {len(t)} heads, {neg} lower it and "
        f"{pos} raise it against a random earlier token (the direction of effect - null, sign test, BH q <= 0.05)"
    )
    n_nan = int((~np.isfinite(eff)).sum())
    if n_nan == len(t):
        return f"{first}; no head has a defined effect (NaN: see the table's reason)."
    i_lo, i_hi = int(np.nanargmin(eff)), int(np.nanargmax(eff))
    parts = [
        f"{first}; the most negative median standardized effect (by itself, not against its null) is "
        f"{t.index[i_lo]}'s ({eff[i_lo]:+.3g}), the most positive {t.index[i_hi]}'s ({eff[i_hi]:+.3g})"
    ]
    n_few = int((np.isfinite(eff) & (t["n_positions"].to_numpy() < MIN_POSITIONS_05)).sum())
    if n_few:
        parts.append(
            f"{n_few} head(s) have fewer than {MIN_POSITIONS_05} positions, too few for the sign test to reach 0.05"
        )
    if n_nan:
        parts.append(f"{n_nan} head(s) have no defined effect (NaN: see the table's reason)")
    return "; ".join(parts) + "."


@strict_kwargs
def attended_token_effect(
    model: TLModel,
    heads: HeadsLike | Iterable[str] | None = None,
    texts: TextsLike | None = None,
    *,
    seq_len: IntLike | None = None,
    max_tokens: IntLike | None = 2048,
    batch_size: IntLike = 8,
    seed: IntLike = 0,
    text_column: str = "text",
    progress: bool = True,
    predicted_k: IntLike | None = DEFAULT_PREDICTED_K,
    predicted_heads: HeadsLike | Iterable[str] | None = None,
) -> AttendedTokenEffect:
    """The direct effect of each head on the token it attends to most, on real text (SPEC 12-13; module docstring).

    Args:
        model: a causal TransformerLens model (HookedTransformer or TransformerBridge), with ``W_E``/``W_U``.
        heads: ``None`` (every head), ``(layer, head)`` pairs, ``"L10H8"`` labels or a DataFrame with
            ``layer``/``head`` columns.
        texts: ``None`` (the default corpus, as :func:`~tl_idempotence.activation_returns`), a string, a list of
            strings / ``pathlib.Path`` files, a ``datasets.Dataset`` or an int tensor ``[batch, pos]`` of token ids
            (:func:`~tl_idempotence.probes.tokens.prepare_tokens`; at most ``n_ctx`` positions per row).
        seq_len: window length in tokens (text input); ``None``: 128, or the model's ``n_ctx`` when smaller.
        max_tokens: counted tokens to collect at least (None: all).
        batch_size: windows per forward pass (no number depends on it). seed: the null sources' seed.
        text_column: a Dataset's text column.
        progress: a tqdm bar over the forward passes on stderr (as the report's).
        predicted_k: the copy-suppression condition's ``k`` (module docstring: whether the attended token is among
            the ``k`` largest logits of the residual stream at the head's input), 1 .. d_vocab; None: not measured
            (every ``predicted`` NA, the split columns 0 / NaN).
        predicted_heads: the heads whose positions get the condition (as ``heads``; None: every head measured; a
            head not measured here is refused, and so is any with ``predicted_k=None``). The condition reads
            ``d_vocab`` logits per position and layer: on SmolLM2 about 0.5-1 CPU-s per layer and 2048 tokens.

    Returns:
        :class:`AttendedTokenEffect` (``.table`` indexed by ``"L10H8"``, ``.positions``, ``.headline``).

    Cost: one forward pass per ``batch_size`` windows (hooks on the selected layers' ``hook_z``/``hook_pattern``),
    then ``~positions · d_head²`` multiply-adds per head (SmolLM2-135M, 270 heads, 2048 tokens: ~20 CPU-s), and the
    condition's logits (``predicted_heads``).

    Raises:
        UnsupportedModelError: not a TransformerLens model, no ``W_E``/``W_U``, ``d_vocab_out != d_vocab``; not a
            causal model (an encoder); a norm after ``W_O`` whose run-time scale no hook exposes.
        WeightError: NaN/inf in ``W_E``, ``W_U`` or a selected layer's weights.
        OptionTypeError / OptionError: unknown heads, empty or out-of-range text/token input, counts < 1, a bad
            seed; an explicit ``seq_len`` (text) or token rows longer than the model's ``n_ctx`` (names it); no
            destination position with an eligible source.
    """
    W_E, W_U, src, info, sel = probe_model(model, heads, "attended_token_effect")
    post_hooks = _check_runnable(model, info, list(sel))
    seq_len = _check_context(model, seq_len, texts)
    if max_tokens is not None:
        max_tokens = check_int(max_tokens, "max_tokens", 1)
    batch_size = check_int(batch_size, "batch_size", 1, 1 << 20)
    seed = check_seed(seed)
    progress = check_bool(progress, "progress")
    k_pred, pred_sel = _check_predicted(
        predicted_k, predicted_heads, sel, list(src.layers()), info.n_heads, int(W_U.shape[1])
    )
    toks, counted = prepare_tokens(model, texts, seq_len=seq_len, max_tokens=max_tokens, text_column=text_column)
    _check_windows(model, toks)
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
        ops = {lay: LayerOps(lh.O.to(dev, torch.float64), sel[lay], u_bar, C) for lay, lh in layers.items()}
        run = EffectRun(model, sel, ops, U, has_scale, post_hooks, batch_size, seed, progress, k_pred, pred_sel)
        recs = run.collect(toks, counted)
    table, positions = _tables(recs, sel, layers)
    final = ("LayerNorm (centred, / hook_scale)" if centre else "/ hook_scale") if has_scale else "none"
    if post_hooks:
        final += f"; the attention output / {POST_NORM_HOOK} (the norm after W_O: its run-time scale, not its weight)"
    summary: dict[str, Any] = {
        "model_name": info.model_name,
        "model_class": info.model_class,
        "n_heads": len(table),
        "n_positions": int(table["n_positions"].max()) if len(table) else 0,
        "n_windows": len(toks),
        "seed": seed,
        "predicted_k": k_pred,
        "convention": CONVENTION,
        "final_norm": final,
        "test": TEST,
        "processing": dict(info.processing),
        **model_fingerprints(layers, W_E, W_U),
    }
    summary["n_negative_q05"], summary["n_positive_q05"] = direction_counts(table)
    summary["headline"] = _headline(table)
    options = {
        "seq_len": seq_len,
        "max_tokens": max_tokens,
        "batch_size": batch_size,
        "seed": seed,
        "predicted_k": k_pred,
        "corpus": corpus_name(texts),
    }
    return AttendedTokenEffect(table=table, positions=positions, summary=summary, info=info, options=options)


def _check_predicted(
    k: Any, heads: Any, sel: dict[int, list[int]], layers: list[int], n_heads: int, d_vocab: int
) -> tuple[int | None, dict[int, set[int]]]:
    """The copy-suppression condition's ``k`` (None: not measured) and ``{layer: {heads}}`` it is measured for.

    Raises:
        OptionTypeError / OptionError: ``k`` not an integer in ``1 .. d_vocab``; ``predicted_heads`` that are not
            heads, or heads this call does not measure (names them), or given with ``k`` None.
    """
    if k is None:
        if heads is not None:  # never silently ignored: the condition is not measured at all
            raise OptionError("predicted_heads is given but predicted_k is None (the condition is not measured).")
        return None, {}
    k = check_int(k, "predicted_k", 1, d_vocab)
    if heads is None:
        return k, {lay: set(hs) for lay, hs in sel.items()}
    if isinstance(heads, (list, tuple)) and not heads:
        return k, {}
    try:
        want = select_heads(heads, layers, n_heads, labels=True)
    except (OptionError, OptionTypeError) as e:  # the same class, naming the argument
        raise type(e)(f"predicted_heads: {e}") from e
    extra = [f"L{lay}H{h}" for lay, hs in want.items() for h in hs if h not in sel.get(lay, ())]
    if extra:
        raise OptionError(f"predicted_heads {extra[:5]} are not among the heads measured (heads=).")
    return k, {lay: set(hs) for lay, hs in want.items()}


#: Why a head's statistics are NaN (the table's ``reason``; "" when every number is defined).
REASON_NO_SPREAD = (
    "no position with a defined effect: the head's direct logits have no spread over the vocabulary at any "
    "position (a zero output: W_O, its kv group's W_V or W_U zero)"
)
REASON_ALL_TIED = "every position's effect equals its null's: the sign test has nothing to count"


def _head_stats(eff: np.ndarray, neff: np.ndarray, raw: np.ndarray, pred: np.ndarray | None = None) -> dict[str, Any]:
    """One head's row from its positions' standardized effects, null effects, raw effects and copy-suppression
    condition (``pred``: 1 predicted, 0 not, -1 not measured; a position whose effect or null is not finite, a zero
    output, is left out), from ``n_positions`` to ``reason`` and the split columns (:data:`SPLIT_COLUMNS`)."""
    ok = np.isfinite(eff) & np.isfinite(neff)  # a zero output (std 0) has no standardized effect
    d = eff[ok] - neff[ok]
    npos, nneg, p = _sign_test(d)
    nan = float("nan")
    reason = "" if ok.any() else REASON_NO_SPREAD
    if ok.any() and npos + nneg == 0:
        reason = REASON_ALL_TIED
    row = {
        "n_positions": int(ok.sum()),
        "effect_median": float(np.median(eff[ok])) if ok.any() else nan,
        "frac_negative": float((eff[ok] < 0).mean()) if ok.any() else nan,
        "null_median": float(np.median(neff[ok])) if ok.any() else nan,
        "median_diff": float(np.median(d)) if ok.any() else nan,
        "n_pos_diff": npos,
        "n_neg_diff": nneg,
        "p_value": p,
        "raw_effect_median": float(np.median(raw[ok])) if ok.any() else nan,
        "direction": float(np.sign(npos - nneg)) if ok.any() else nan,
        "reason": reason,
    }
    flags = np.full(len(eff), -1, dtype=np.int8) if pred is None else np.asarray(pred, dtype=np.int8)
    for name, value in (("predicted", 1), ("unpredicted", 0)):
        m = ok & (flags == value)
        dm = eff[m] - neff[m]
        n_p, n_n, p_m = _sign_test(dm)
        row[f"n_{name}"] = int(m.sum())
        row[f"effect_median_{name}"] = float(np.median(eff[m])) if m.any() else nan
        row[f"median_diff_{name}"] = float(np.median(dm)) if m.any() else nan
        row[f"effect_p_{name}"] = p_m
        row[f"direction_{name}"] = float(np.sign(n_p - n_n)) if m.any() else nan
    return row


def _pred_flags(predicted: pd.Series) -> np.ndarray:
    """The positions' ``predicted`` column (nullable boolean) as int8: 1, 0, or -1 where not measured."""
    v = predicted.astype("boolean")
    return np.where(v.isna().to_numpy(), -1, v.fillna(False).to_numpy(dtype=bool).astype(np.int8)).astype(np.int8)


def _insert_q_values(table: pd.DataFrame) -> None:
    """Insert ``q_value`` (BH over every head of the table with a finite ``p_value``, all layers together; NaN for
    the others) after ``p_value``, and ``effect_p``/``effect_q`` (the same test's p and q under their one name)
    after ``direction``."""
    from scipy.stats import false_discovery_control

    p = table["p_value"].to_numpy(dtype=float)
    q = np.full(p.shape, np.nan)
    fin = np.isfinite(p)
    if fin.any():
        q[fin] = false_discovery_control(p[fin], method="bh")
    table.insert(table.columns.get_loc("p_value") + 1, "q_value", q)
    at = table.columns.get_loc("direction") + 1
    table.insert(at, "effect_p", p.copy())
    table.insert(at + 1, "effect_q", q.copy())


def _tables(
    recs: dict[tuple[int, int], dict[str, list[np.ndarray]]], sel: dict[int, list[int]], layers: dict[int, Any]
) -> tuple[pd.DataFrame, pd.DataFrame]:
    rows, frames = [], []
    for (lay, h), r in recs.items():
        cat = {k: np.concatenate(v) if v else np.zeros(0) for k, v in r.items()}
        eff, neff = cat["eff"], cat["neff"]
        rows.append(
            {
                "layer": lay,
                "head": h,
                "kv_head": int(layers[lay].kv_head_of[h]),
                **_head_stats(eff, neff, cat["raw"], cat["pred"]),
            }
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
                    "predicted": pd.arrays.BooleanArray(cat["pred"] == 1, cat["pred"] < 0),
                }
            )
        )
    table = pd.DataFrame(rows)
    table.index = head_labels(table["layer"], table["head"])
    _insert_q_values(table)
    table = table[list(TABLE_COLUMNS)]
    return table, pd.concat(frames, ignore_index=True)


#: The columns of :attr:`AttendedTokenEffect.table` and :attr:`AttendedTokenEffect.positions`, in order.
TABLE_COLUMNS = (
    "layer", "head", "kv_head", "n_positions", "effect_median", "frac_negative", "null_median", "median_diff",
    "n_pos_diff", "n_neg_diff", "p_value", "q_value", "raw_effect_median", "direction", "effect_p", "effect_q",
    "reason", "n_predicted", "effect_median_predicted", "median_diff_predicted", "effect_p_predicted",
    "direction_predicted", "n_unpredicted", "effect_median_unpredicted", "median_diff_unpredicted",
    "effect_p_unpredicted", "direction_unpredicted",
)  # fmt: skip
#: The columns of the copy-suppression split (module docstring): each head's positions where the attended token is
#: already predicted at the head's input (``_predicted``) and where it is not (``_unpredicted``).
SPLIT_COLUMNS = TABLE_COLUMNS[TABLE_COLUMNS.index("n_predicted") :]
#: ``p_value``/``q_value`` are the deprecated names of ``effect_p``/``effect_q`` (the same test; kept, equal, until
#: 0.5.0 at the earliest): the mechanism and the report's exports name it ``effect_p``/``effect_q``, since their
#: ``p_value``/``q_value`` are the scramble test's.
DEPRECATED_ALIASES = {"p_value": "effect_p", "q_value": "effect_q"}
POSITION_COLUMNS = (
    "label", "window", "pos", "source_pos", "token", "effect", "null_source_pos", "null_effect", "raw_effect",
    "predicted",
)  # fmt: skip


@saves("attended_token_effect")
@strict_kwargs
def save_attended_token_effect(result: AttendedTokenEffect, path: PathLike, overwrite: bool = False) -> str:
    """Save an :class:`AttendedTokenEffect` to the folder ``path``: ``table.parquet``
    (:attr:`~AttendedTokenEffect.table`; labels rebuilt from ``layer``/``head``), ``positions.parquet``
    (:attr:`~AttendedTokenEffect.positions`) and ``attended_token_effect.json`` (summary, options, info, the sha256
    of both tables and the record's own digest; no pickle).

    Returns:
        The folder, as a string.

    Raises:
        OptionTypeError: ``result`` is not an :class:`AttendedTokenEffect`; every other error as
            :meth:`StoredResult.save <tl_idempotence.core.stored.StoredResult.save>`.
    """
    if not isinstance(result, AttendedTokenEffect):
        raise OptionTypeError(
            f"save_attended_token_effect saves an AttendedTokenEffect (tli.attended_token_effect); got "
            f"{type(result).__name__}."
        )
    tables = _saved_tables(result)
    return write_probe("attended_token_effect", path, EFFECT_FORMAT, EFFECT_RECORD, tables, result, overwrite)


def _saved_tables(result: AttendedTokenEffect) -> dict[str, pd.DataFrame]:
    return {"table": result._table.loc[:, list(TABLE_COLUMNS)], "positions": result.positions}


def attended_token_effect_files(result: AttendedTokenEffect) -> dict[str, bytes]:
    """The files :func:`save_attended_token_effect` writes, as bytes (a mechanism save holds them as a part)."""
    return tables_record_files(EFFECT_FORMAT, EFFECT_RECORD, _saved_tables(result), probe_fields(result))


def _check_predicted_column(positions: pd.DataFrame, k: Any, fp: Path, edited: Any) -> None:
    """Refuse a ``predicted`` column that is not a nullable boolean, that is measured at some of a head's positions
    and not at others, or measured although the record's ``predicted_k`` is None (names the file)."""
    col = positions["predicted"]
    if str(col.dtype) != "boolean":
        raise edited(fp, f"'predicted' is {col.dtype}, not a nullable boolean")
    na = col.isna()
    if k is None and not na.all():
        raise edited(fp, "'predicted' is measured although predicted_k is None")
    if not (isinstance(k, int) and not isinstance(k, bool)) and k is not None:
        raise edited(fp, f"predicted_k {k!r} is not a whole number or None")
    mixed = na.groupby(positions["label"], sort=False).nunique()
    if (mixed > 1).any():
        raise edited(fp, f"'predicted' is measured at some positions of {list(mixed[mixed > 1].index)[:3]} only")


@loads("attended_token_effect")
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
    columns = {
        "table": (TABLE_COLUMNS, "an attended-token-effect table"),
        "positions": (POSITION_COLUMNS, f"{list(POSITION_COLUMNS)}"),
    }
    save = read_probe_save(
        path,
        EFFECT_FORMAT,
        EFFECT_RECORD,
        frozenset(columns),
        ("seed", "predicted_k"),
        "tli.attended_token_effect",
        columns,
    )
    d, rec, fields, info, labels, edited = save.folder, save.record, save.fields, save.info, save.labels, save.edited
    ft, fp = save.file("table"), save.file("positions")
    table, positions = save.tables["table"], save.tables["positions"]
    try:
        summary = AttendedTokenEffectSummary(fields["summary"])
    except (TypeError, ValueError, OptionError) as e:
        raise ReportFileError(f"{rec}: a malformed summary ({type(e).__name__}: {e}).") from e
    for col in (*POSITION_COLUMNS[1:5], "null_source_pos"):
        index_column(positions, col, fp)  # whole numbers
    if set(positions["label"]) - set(labels):
        raise edited(fp, f"positions of heads the table lacks ({sorted(set(positions['label']) - set(labels))[:5]})")
    _check_predicted_column(positions, summary.get("predicted_k"), fp, edited)
    groups = {lab: g for lab, g in positions.groupby("label", sort=False)}
    rows = []
    for lab in labels:
        g = groups.get(lab, positions.iloc[:0])
        eff, ne, raw = (g[c].to_numpy(dtype=np.float64) for c in ("effect", "null_effect", "raw_effect"))
        rows.append(_head_stats(eff, ne, raw, _pred_flags(g["predicted"])))
    fresh = pd.DataFrame(rows, index=table.index)
    fresh.insert(0, "kv_head", table["kv_head"].to_numpy())
    _insert_q_values(fresh)
    for col in TABLE_COLUMNS[3:]:
        if col == "reason":
            same = table[col].astype(object).tolist() == fresh[col].tolist()
        else:
            same = same_floats(table[col].to_numpy(dtype=float), fresh[col].to_numpy(dtype=float))
        if not same:
            raise edited(ft, f"{col!r} is not what {fp.name} gives")
    n_neg, n_pos = direction_counts(fresh)
    fresh_summary = {
        "n_heads": len(labels),
        "n_positions": int(fresh["n_positions"].max()),
        "n_negative_q05": n_neg,
        "n_positive_q05": n_pos,
        "headline": _headline(table),
    }
    summary = check_summary(summary, fresh_summary, rec, "tli.attended_token_effect")
    for key, want in (("convention", CONVENTION), ("test", TEST)):
        if summary.get(key) != want:
            raise edited(rec, f"summary[{key!r}] is not what tli.attended_token_effect writes")
    return AttendedTokenEffect(
        table=table, positions=positions, summary=summary, info=info, options=fields["options"], loaded_from=str(d)
    )


register(  # 0.3.0 saves (issue 45)
    EFFECT_RECORD, effect_v030(TABLE_COLUMNS, CONVENTION, (REASON_NO_SPREAD, REASON_ALL_TIED), direction_counts)
)
