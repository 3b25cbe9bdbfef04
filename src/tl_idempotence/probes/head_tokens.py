"""What a head's OV circuit does to tokens, read from the weights (SPEC 12, token readout).

For a head ``h`` of layer ``l`` (TransformerLens row form; the kv head's ``W_V`` on GQA/MQA, as ``model.OV``
expands it), row ``t`` of the full OV circuit ``W_E W_V[h] W_O[h] W_U`` (``d_vocab x d_vocab``) holds the
logits the head writes when it reads source token ``t``. Its **self-rank**

    self_rank(t) = #{u != t : logit_u > logit_t} / (d_vocab - 1)

is 0 when the head promotes ``t`` above every other token, 1 when it suppresses ``t`` most. Per head,
over a seeded sample of source tokens (or the ``tokens`` given): the median self-rank (numpy's median),
the fraction of tokens in their own row's top ``k`` (``#{u != t : logit_u > logit_t} < k``) and bottom ``k``
(``#{u != t : logit_u < logit_t} < k``).

Computation (never a ``d_vocab²`` matrix): per layer and per tile of ``VOCAB_TILE`` vocabulary columns, float32
logits with a rigorous rounding bound and the close calls recounted in float64, so a rank is that of the float64
row ``ℓ_u = fl64(fl64(x @ W_O) · W_U[:, u])`` (``x = W_E[t] @ W_V``) and never depends on float32 rounding
(:mod:`.readout`). TF32 is switched off on CUDA while the products run.

**Rows without spread** (SPEC 13). A row has no spread when the head's float64 output for the token,
``y = x @ W_O``, is zero within the rounding bound of its own computation (``‖y‖ <= γ_{d_head} ‖|x| |W_O|‖ +
‖γ_{d_model} |W_E[t]| |W_V| |W_O|‖``: a zero ``W_O``, a zero ``W_V`` of its kv group, a zero embedding row), or
when no logit of the row differs from the source token's (every logit tied: ``W_U = 0``). Its self-rank would be
0 (a tied logit is not counted above), so it is NaN instead, left out of every statistic, with the head's
``reason``; a head with no row of spread has NaN statistics and no headline names it.

The leading singular directions of ``W_V[h] W_O[h]`` (``d_model x d_model``, rank ``<= d_head``) are
computed from the ``d_head``-sized factors (QR of ``W_V`` and ``W_O^T``, SVD of the ``d_head x d_head``
core), SVDInterpreter-style: the tokens whose embeddings the ``i``-th input direction reads most
(``W_E @ read_i``) and whose logits its output direction writes most (``write_i @ W_U``), with the pair's
sign fixed so that the read side's largest-magnitude token score is positive.

Biases (``b_V``, ``b_O``, ``b_U``), positional embeddings and the final norm are left out (Elhage et al.'s
convention, as the copying score of :mod:`.roles`): the result says so in ``summary["convention"]``.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import pandas as pd
import torch

from ..core.heads import ModelInfo, read_layer
from ..core.legacy import register
from ..core.options import check_bool, check_int, check_seed, strict_kwargs
from ..core.random import layer_generator
from ..core.records import index_column, tables_record_files
from ..core.selection import head_label, head_labels
from ..core.stored import StoreSpec, loads, saves
from ..core.tables import FrozenSummary
from ..errors import OptionError, OptionTypeError, ReportFileError
from .legacy import head_tokens_v030
from .readout import direction_extremes, float64_tiles, gamma64, layer_counts, row_norms, svd_directions
from .token_records import (
    FREE_MODEL_FIELDS,
    TokenResult,
    check_missing_cosines,
    check_summary,
    edited_error,
    embedding_matrices,
    model_fingerprints,
    probe_fields,
    probe_model,
    read_probe_save,
    same_floats,
    write_probe,
)
from .tokens import special_ids, token_texts

if TYPE_CHECKING:  # pragma: no cover
    from ..core.hints import ArrayLike, HeadsLike, IntLike, PathLike, TLModel

__all__ = [
    "CONVENTION",
    "HeadTokens",
    "HeadTokensSummary",
    "embedding_matrices",
    "head_tokens",
    "load_head_tokens",
    "save_head_tokens",
    "token_ids",
]

#: Stated maximum of ``n_tokens`` (checked before any allocation).
MAX_TOKENS = 1 << 20
#: Vocabulary columns per logit block (one float64 ``W_OU`` tile of every selected head of a layer).
VOCAB_TILE = 2048
#: Logit elements per block when ``chunk`` is not given (``chunk = max(1, LOGIT_ELEMS // min(VOCAB_TILE, d_vocab))``).
LOGIT_ELEMS = 1 << 19
#: Leading singular directions kept per head by default.
N_DIRECTIONS = 3
#: What the readout includes, stated in every result.
CONVENTION = (
    "rows of W_E W_V W_O W_U (TransformerLens row form; the kv head's W_V on GQA): no biases, no positional "
    "embedding, no final norm"
)


def _check_stated(
    rec: Path,
    ft: Path,
    fo: Path,
    summary: Mapping[str, Any],
    opts: Mapping[str, Any],
    info: ModelInfo,
    table: pd.DataFrame,
    top: pd.DataFrame,
    sigmas: Mapping[str, Mapping[str, float]],
    n: int,
) -> None:
    """What a saved head-tokens record states that its tables give: the convention, how the tokens were chosen (and
    the ``n_tokens`` asked), the number of singular directions (``n_directions``: the top table's ``read_d`` kinds,
    each head's ``sigma_1..sigma_d``, ``sigma_1`` the table's ``sv_1``, at most ``d_head`` of them).

    Raises:
        ReportFileError: names the file and the field.
    """
    edited = functools.partial(edited_error, again="tli.head_tokens")
    if summary.get("convention") != CONVENTION:
        raise edited(rec, "summary['convention'] is not what tli.head_tokens writes")
    seed, asked = summary.get("seed"), opts.get("n_tokens")
    ways = {
        f"{n} non-special token ids drawn without replacement (seed {seed})": asked == n,
        f"every non-special token ({n}; n_tokens={asked} asked)": isinstance(asked, int) and asked >= n,
        f"{n} token ids given": True,
    }
    if not ways.get(str(summary.get("tokens")), False):
        raise edited(
            rec,
            f"summary['tokens'] ({summary.get('tokens')!r}) and options['n_tokens'] ({asked!r}) are not "
            f"how {n} tokens are chosen",
        )
    kinds = sorted({str(x) for x in top["kind"]} - set(SELF_KINDS))
    nd = opts.get("n_directions")
    want = sorted([f"read_{i}" for i in range(1, (nd or 0) + 1)] + [f"write_{i}" for i in range(1, (nd or 0) + 1)])
    if not isinstance(nd, int) or not 1 <= nd <= info.d_head or kinds != want:
        raise edited(fo, f"its directions {kinds[:4]} are not options['n_directions'] = {nd!r} (at most d_head)")
    for lab, sig in sigmas.items():
        if list(sig) != [f"sigma_{i}" for i in range(1, nd + 1)] or sig["sigma_1"] != float(table.loc[lab, "sv_1"]):
            raise edited(ft, f"{lab}'s sigmas in {rec.name} are not its sv_1 and options['n_directions'] = {nd}")
        v = np.array(list(sig.values()), dtype=np.float64)
        if not (np.isfinite(v).all() and (v >= 0).all() and (np.diff(v) <= 0).all()):
            raise edited(rec, f"{lab}'s sigmas are not singular values (finite, >= 0, non-increasing)")


#: The record fields of its save that nothing derives or restates, with why (:attr:`StoreSpec.free_fields`).
HEAD_TOKENS_FREE_FIELDS = (
    *FREE_MODEL_FIELDS,
    ("options.chunk", "a performance setting: source tokens per product; no number depends on it"),
    ("sigmas.*.sigma_[2-9]", "the singular values beyond the first, recorded once for the direction lists"),
    ("sigmas.*.sigma_[1-9][0-9]*", "the singular values beyond the first, recorded once"),
)
#: How a head-tokens result is stored (:class:`~tl_idempotence.core.stored.StoreSpec`).
HEAD_TOKENS_STORE = StoreSpec(
    name="head_tokens", formats=("tl_idempotence.head_tokens/1",), free_fields=HEAD_TOKENS_FREE_FIELDS
)
HEAD_TOKENS_FORMAT = HEAD_TOKENS_STORE.format
HEAD_TOKENS_RECORD = HEAD_TOKENS_STORE.record


class HeadTokensSummary(FrozenSummary):
    """The summary of :class:`HeadTokens` (typed, read-only; a mapping of the fields given)."""

    __slots__ = ()
    model_name: str
    model_class: str
    n_heads: int
    n_tokens: int
    k: int
    seed: int
    d_vocab: int
    tokens: str
    convention: str
    processing: Mapping[str, Any]
    weights_fingerprint: str
    embedding_fingerprint: str
    median_self_rank: float
    headline: str
    not_measured: Mapping[str, str]


class HeadTokens(
    TokenResult,
    repr_keys="model_name n_heads n_tokens k median_self_rank",
    frozen=("a head-tokens result is", "tli.head_tokens again"),
    summary_type=HeadTokensSummary,
):
    """Result of :func:`head_tokens` (SPEC 12, token readout). Immutable: every frame and array handed out is a copy
    made on each read, :attr:`summary` (a typed :class:`HeadTokensSummary`) and :attr:`options` are read-only, and
    assigning an attribute raises ``dataclasses.FrozenInstanceError``.

    Attributes (properties):
        table: one row per head, indexed by ``"L10H8"`` labels: ``layer, head, kv_head``, ``self_rank_median``
            (numpy's median over the tokens with a defined self-rank; 0: promotes its source token most, 1:
            suppresses it most), ``frac_top_k``, ``frac_bottom_k`` (fractions of those tokens in their own row's top
            / bottom ``k``), ``n_tokens`` (tokens read), ``sv_1`` (the largest singular value of ``W_V W_O``),
            ``n_ranked`` (tokens with a defined self-rank) and ``reason`` (why some or all are NaN: rows without
            spread, module docstring; "" when none is).
        self_ranks: ``[heads, tokens]`` DataFrame of every self-rank (columns: the token ids; NaN: no spread).
        self_cosines: ``[heads, tokens]`` DataFrame of ``cos(y_t, W_U[:, t]) = ℓ_t / (‖y_t‖ ‖W_U[:, t]‖)``, the
            source token's logit with both norms divided out (``y_t = W_E[t] W_V W_O``; NaN without spread or for a
            zero unembedding column): the ``*_cosine`` lists of ``top_tokens``.
        tokens: the source token ids (int64 array, a copy).
        summary: ``model_name, model_class, n_heads, n_tokens, k, seed, d_vocab, tokens`` (how they were
            chosen), ``convention``, ``processing``, ``weights_fingerprint`` (the report's combined key over the
            measured layers), ``embedding_fingerprint`` (sha256 of W_E and W_U), ``median_self_rank``, ``headline``.
        info: the model's :class:`~tl_idempotence.core.heads.ModelInfo`.
        options: ``k, n_tokens, seed, n_directions, chunk``.
        loaded_from: the folder :func:`load_head_tokens` read it from (:meth:`save` refuses to write there), else
            None.
    """

    store: ClassVar[StoreSpec] = HEAD_TOKENS_STORE

    _ranks: np.ndarray  # [heads, tokens] float64
    _cosines: np.ndarray  # [heads, tokens] float64
    _tokens: np.ndarray  # [tokens] int64
    _top: Mapping[str, pd.DataFrame]
    summary: HeadTokensSummary

    def __init__(
        self,
        table: pd.DataFrame,
        ranks: np.ndarray,
        tokens: np.ndarray,
        top: Mapping[str, pd.DataFrame],
        summary: Mapping[str, Any],
        info: ModelInfo,
        options: Mapping[str, Any] | None = None,
        loaded_from: str | None = None,
        cosines: np.ndarray | None = None,
    ) -> None:
        ranks = np.array(ranks, dtype=np.float64)
        self._freeze_result(
            table,
            summary,
            loaded_from,
            _ranks=ranks,  # never handed out: the properties give copies
            _cosines=np.full_like(ranks, np.nan) if cosines is None else np.array(cosines, dtype=np.float64),
            _tokens=np.array(tokens, dtype=np.int64),
            _top=MappingProxyType(dict(top)),
            info=info,
            options=options,
        )

    @property
    def self_ranks(self) -> pd.DataFrame:
        """Every self-rank, ``[heads, tokens]`` (index: labels; columns: token ids; a copy)."""
        return pd.DataFrame(self._ranks.copy(), index=self._table.index.copy(), columns=pd.Index(self._tokens.copy()))

    @property
    def self_cosines(self) -> pd.DataFrame:
        """Every self-cosine, ``[heads, tokens]`` (class docstring; index: labels; columns: token ids; a copy)."""
        return pd.DataFrame(self._cosines.copy(), index=self._table.index.copy(), columns=pd.Index(self._tokens.copy()))

    @property
    def tokens(self) -> np.ndarray:
        """The source token ids measured (a copy)."""
        return self._tokens.copy()

    def top_tokens(self, head: str) -> pd.DataFrame:
        """What one head does to tokens: ``kind, rank, token_id, token, value`` rows (a copy).

        ``kind``: ``"promoted"`` (at most ``k`` of the source tokens read whose self-rank is below 0.5, i.e. the
        head ranks them in the upper half of their own row, lowest self-rank first; ``value``: the self-rank),
        ``"suppressed"`` (self-rank above 0.5, highest first): a head that suppresses every token it reads has no
        promoted list, never a list of suppressed tokens called promoted. ``"promoted_cosine"`` /
        ``"suppressed_cosine"``: the same by the self-cosine (``value``; positive / negative, largest ``|cos|``
        first), the ranking with the norms of the token's embedding path and of its unembedding divided out, so a
        token does not lead the list by a large ``‖W_U[:, t]‖`` (compare the two). ``"read_i"`` / ``"write_i"``
        (the tokens the ``i``-th singular direction of ``W_V W_O`` reads via ``W_E`` and writes via ``W_U``;
        ``value``: the token's score on it, ``sigma_i`` in the frame's ``attrs``). ``token``: the tokenizer's
        text (a token that is not whole UTF-8 text, e.g. one byte of a character, as the ``repr`` of its bytes:
        ``"b'\\xe2\\x80'"``), or None. Tokens without a defined self-rank are in no list.

        Raises:
            OptionTypeError: ``head`` not a label string. OptionError: a head this result did not measure.
        """
        if not isinstance(head, str):
            raise OptionTypeError(f"top_tokens takes a head label like 'L10H8'; got {type(head).__name__}.")
        if head not in self._top:
            raise OptionError(
                f"top_tokens: {head!r:.40} is not a head of this result (measured: {list(self._top)[:8]}"
                f"{' ...' if len(self._top) > 8 else ''})."
            )
        out = self._top[head].copy()
        out.attrs = dict(self._top[head].attrs)
        return out

    def to_text(self, n: int = 10) -> str:
        """The headline and the ``n`` heads with the lowest and highest median self-rank, as plain text.

        Raises:
            TypeError / ValueError: ``n`` is not a non-negative whole number (pandas' ``head``/``tail``).
        """
        return self.ranked_text("self_rank_median", ["self_rank_median", "frac_top_k", "frac_bottom_k", "n_tokens"], n)


def token_ids(tokens: Any, d_vocab: int, name: str = "tokens") -> np.ndarray:
    """Distinct token ids (sorted int64) from a list, numpy array or tensor of integers.

    Raises:
        OptionTypeError: not a 1-D collection of integers. OptionError: empty, or an id outside ``[0, d_vocab)``.
    """
    if isinstance(tokens, (str, bytes)) or isinstance(tokens, dict):
        raise OptionTypeError(f"{name} must be a list or 1-D array of token ids; got {type(tokens).__name__}.")
    if isinstance(tokens, torch.Tensor):
        tokens = tokens.detach().cpu().numpy()
    try:
        arr = np.asarray(list(tokens) if not isinstance(tokens, np.ndarray) else tokens)
    except TypeError as e:
        raise OptionTypeError(f"{name} must be a list or 1-D array of token ids; got {type(tokens).__name__}.") from e
    if arr.ndim != 1:
        raise OptionTypeError(f"{name} must be 1-D (token ids); got shape {arr.shape}.")
    if arr.size == 0:
        raise OptionError(f"{name} is empty: pass None for a seeded sample, or the token ids to read.")
    if arr.dtype == bool or not np.issubdtype(arr.dtype, np.integer):
        if arr.dtype == object and all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in arr):
            arr = arr.astype(np.int64)
        else:
            raise OptionTypeError(f"{name} must hold integer token ids; got dtype {arr.dtype}.")
    lo, hi = int(arr.min()), int(arr.max())
    if lo < 0 or hi >= d_vocab:
        raise OptionError(f"{name}: token ids must lie in [0, d_vocab={d_vocab}); got ids from {lo} to {hi}.")
    return np.unique(arr.astype(np.int64))


def _sample_tokens(model: Any, d_vocab: int, n_tokens: int, seed: int) -> tuple[np.ndarray, str]:
    tok = getattr(model, "tokenizer", None)
    specials = special_ids(tok) if tok is not None else set()
    allowed = torch.tensor([i for i in range(d_vocab) if i not in specials], dtype=torch.long)
    if not len(allowed):
        raise OptionError("The model's vocabulary has no non-special token to sample.")
    if n_tokens >= len(allowed):
        return allowed.numpy(), f"every non-special token ({len(allowed)}; n_tokens={n_tokens} asked)"
    g = layer_generator(seed, None, "head_tokens")
    pick = torch.randperm(len(allowed), generator=g)[:n_tokens]
    return np.sort(allowed[pick].numpy()), f"{n_tokens} non-special token ids drawn without replacement (seed {seed})"


def _headline(table: pd.DataFrame, k: int, n_tokens: int, post_norm: str | None = None) -> str:
    med = table["self_rank_median"].to_numpy(dtype=float)
    fin = np.isfinite(med)
    n = len(table)
    n_copy = int((fin & (med < 0.5)).sum())
    parts = [
        f"Do the heads' OV circuits promote the token they read? {n_copy} of {int(fin.sum())} heads with a defined "
        f"self-rank rank their source token in the upper half of its own row (median self-rank < 0.5, over "
        f"{n_tokens} tokens)"
    ]
    if fin.any():
        i_lo = int(np.nanargmin(med))
        i_hi = int(np.nanargmax(med))
        if med[i_lo] < 0.5:
            parts.append(
                f"the strongest copier is {table.index[i_lo]} (median self-rank {med[i_lo]:.3g}, "
                f"{table['frac_top_k'].iloc[i_lo]:.0%} of tokens in their own top {k})"
            )
        if med[i_hi] > 0.5:
            parts.append(
                f"the strongest suppressor {table.index[i_hi]} (median self-rank {med[i_hi]:.3g}, "
                f"{table['frac_bottom_k'].iloc[i_hi]:.0%} in their bottom {k})"
            )
    if n - int(fin.sum()):
        parts.append(f"{n - int(fin.sum())} of {n} heads have no defined self-rank (NaN, no spread: see reason)")
    text = "; ".join(parts) + "."
    if post_norm:
        text += f" In this model {post_norm}; the readout (W_E W_V W_O W_U) leaves that norm out."
    return text


@strict_kwargs
def head_tokens(
    model: TLModel,
    heads: HeadsLike | Iterable[str] | None = None,
    tokens: Iterable[IntLike] | ArrayLike | None = None,
    k: IntLike = 20,
    n_tokens: IntLike = 512,
    seed: IntLike = 0,
    *,
    n_directions: IntLike = N_DIRECTIONS,
    chunk: IntLike | None = None,
    progress: bool = True,
) -> HeadTokens:
    """The OV circuit read in tokens, weights only (SPEC 12): each head's self-rank of its source tokens.

    Args:
        model: a TransformerLens model (HookedTransformer or TransformerBridge; GQA/MQA: one row per query head,
            the kv head's ``W_V``), with ``W_E`` and ``W_U`` of the same vocabulary.
        heads: ``None`` (every head), ``(layer, head)`` pairs, ``"L10H8"`` labels, or a DataFrame with
            ``layer``/``head`` columns.
        tokens: the source token ids to read (a list / 1-D array / tensor; duplicates merged), or ``None``: a
            seeded sample of ``n_tokens`` non-special ids (every one when the vocabulary has no more).
        k: the top/bottom size of ``frac_top_k``/``frac_bottom_k`` and of the token lists (1 .. d_vocab).
        n_tokens: the sample size when ``tokens`` is None (1 .. 2^20).
        seed: the sample's seed.
        n_directions: leading singular directions of ``W_V W_O`` read per head (1 .. d_head).
        chunk: source tokens per ``[chunk, VOCAB_TILE]`` float32 logit block (default
            ``max(1, 2^19 // min(VOCAB_TILE, d_vocab))``, 256 on SmolLM2; the heads of a layer are taken together,
            as many as fit ``2^21`` logits a block, :data:`~tl_idempotence.probes.readout.HEAD_BLOCK_ELEMS`; memory
            ``~ heads · chunk · VOCAB_TILE`` floats up to that, a ``VOCAB_TILE x heads · d_head`` float64 tile per
            layer and a float64 copy of ``W_U`` up to 512 MiB, never ``d_vocab²``).
        progress: a tqdm bar over the layers on stderr (as the report's).

    Returns:
        :class:`HeadTokens` (``.table`` indexed by ``"L10H8"``; ``.top_tokens(label)``; ``.headline``).

    Raises:
        UnsupportedModelError: not a TransformerLens model, no ``W_E``/``W_U``, ``d_vocab_out != d_vocab``.
        WeightError: NaN/inf in ``W_E``, ``W_U`` or a measured layer's ``W_V``/``W_O`` (names which).
        OptionTypeError / OptionError: an unknown head or label, ``k`` outside ``1 .. d_vocab``, empty or
            out-of-range ``tokens``, ``n_tokens``/``seed``/``n_directions``/``chunk`` of the wrong type or range.
    """
    W_E, W_U, src, info, sel = probe_model(model, heads, "head_tokens")
    d_vocab = int(W_E.shape[0])
    k = check_int(k, "k", 1, d_vocab)
    n_tokens = check_int(n_tokens, "n_tokens", 1, MAX_TOKENS)
    seed = check_seed(seed)
    n_directions = check_int(n_directions, "n_directions", 1, info.d_head)
    default_chunk = max(1, LOGIT_ELEMS // min(VOCAB_TILE, d_vocab))
    chunk = default_chunk if chunk is None else check_int(chunk, "chunk", 1, MAX_TOKENS)
    progress = check_bool(progress, "progress")
    if tokens is None:
        tok_ids, how = _sample_tokens(model, d_vocab, n_tokens, seed)
    else:
        tok_ids = token_ids(tokens, d_vocab)
        how = f"{len(tok_ids)} token ids given"
    layers = {lay: read_layer(src, lay, info) for lay in sel}  # checks W_V/W_O finite, names layer and head
    dev = W_U.device
    precision = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")  # no TF32 / bf16 float32 products: the bounds assume float32
    try:
        with torch.no_grad():
            table, ranks, cosines, top = _compute(
                model, W_E, W_U, layers, sel, tok_ids, k, n_directions, chunk, dev, progress
            )
    finally:
        torch.set_float32_matmul_precision(precision)
    summary: dict[str, Any] = {
        "model_name": info.model_name,
        "model_class": info.model_class,
        "n_heads": len(table),
        "n_tokens": len(tok_ids),
        "k": k,
        "seed": seed,
        "d_vocab": d_vocab,
        "tokens": how,
        "convention": CONVENTION,
        "processing": dict(info.processing),
        **model_fingerprints(layers, W_E, W_U),
        "median_self_rank": rank_stats(table["self_rank_median"].to_numpy(dtype=float))["self_rank_median"],
        "headline": _headline(table, k, len(tok_ids), info.extra.get("post_attention_norm")),
    }
    options = {"k": k, "n_tokens": n_tokens, "seed": seed, "n_directions": n_directions, "chunk": chunk}
    return HeadTokens(
        table=table,
        ranks=ranks,
        tokens=tok_ids,
        top=top,
        summary=summary,
        info=info,
        options=options,
        cosines=cosines,
    )


def _compute(
    model: Any,
    W_E: torch.Tensor,
    W_U: torch.Tensor,
    layers: dict[int, Any],
    sel: dict[int, list[int]],
    tok_ids: np.ndarray,
    k: int,
    n_directions: int,
    chunk: int,
    dev: torch.device,
    progress: bool,
) -> tuple[pd.DataFrame, np.ndarray, np.ndarray, dict[str, pd.DataFrame]]:
    from ..core.progress import progress_bar

    d_vocab = int(W_E.shape[0])
    tok = torch.as_tensor(tok_ids, dtype=torch.long, device=dev)
    W_U32 = W_U.to(dev, torch.float32)
    E_tok64 = W_E[tok.to(W_E.device)].to(dev, torch.float64)  # [n, d_model]
    # W_U's columns as rows, in its own precision when that is float64 (else float32, exact for bf16/fp16): the
    # reference logits are computed from them; a view of W_E, no copy, on a tied float32 model
    U_rows = (W_U.to(dev, torch.float64) if W_U.dtype == torch.float64 else W_U32).T.contiguous()
    u_norm = row_norms(U_rows)
    U_tiles = float64_tiles(U_rows)
    u_tok = u_norm[tok]  # [n]: ‖W_U[:, t]‖
    g_x = gamma64(int(W_E.shape[1]))  # rounding of x = fl64(W_E[t] @ W_V)

    tokenizer = getattr(model, "tokenizer", None)
    rows, ranks, cosines = [], [], []
    reads, writes, sigmas, labels = [], [], [], []
    top: dict[str, pd.DataFrame] = {}
    n_heads = sum(len(hs) for hs in sel.values())
    desc = f"token readout ({n_heads} heads x {len(tok_ids)} tokens; ~0.2 CPU-s/head on SmolLM2)"
    for lay in progress_bar(list(sel), desc=desc, total=len(sel), unit="layer", enabled=progress):
        hs = sel[lay]
        lh = layers[lay]
        V64 = lh.V.to(dev, torch.float64)  # [n_kv, d_model, d_head]
        x_kv: dict[int, torch.Tensor] = {}
        ex_kv: dict[int, torch.Tensor] = {}
        for h in hs:
            kv = int(lh.kv_head_of[h])
            if kv not in x_kv:
                x_kv[kv] = E_tok64 @ V64[kv]
                ex_kv[kv] = g_x * (E_tok64.abs() @ V64[kv].abs())  # bound on |x - e_t W_V|
        O64 = torch.stack([lh.O[h].to(dev, torch.float64).T for h in hs])  # [heads, d_head, d_model]
        xs = [x_kv[int(lh.kv_head_of[h])] for h in hs]
        above_l, below_l, L_l, yn_l, zn_l = layer_counts(xs, O64, U_rows, u_norm, tok, chunk, VOCAB_TILE, U_tiles)
        for j, h in enumerate(hs):
            kv = int(lh.kv_head_of[h])
            W_O64 = O64[j]
            above, below = above_l[j], below_l[j]
            # no spread (module docstring): y = x W_O zero within its float64 rounding, or every logit tied
            y_noise = gamma64(int(W_O64.shape[0])) * zn_l[j] + (ex_kv[kv] @ W_O64.abs()).norm(dim=1)
            flat = (yn_l[j] <= y_noise) | (above + below == 0)
            r = (above.double() / (d_vocab - 1)).masked_fill(flat, float("nan")).cpu().numpy()
            cos = (L_l[j] / (yn_l[j] * u_tok)).masked_fill(flat | (u_tok == 0), float("nan")).cpu().numpy()
            ranks.append(r)
            cosines.append(cos)
            rd, sg, wr = svd_directions(V64[kv], W_O64, n_directions)
            reads.append(rd)
            writes.append(wr)
            sigmas.append(sg)
            labels.append(head_label(lay, h))
            keep = ~flat
            rows.append(
                {
                    "layer": lay,
                    "head": h,
                    "kv_head": kv,
                    **rank_stats(r),
                    "frac_top_k": _share(above < k, keep),
                    "frac_bottom_k": _share(below < k, keep),
                    "n_tokens": len(r),
                    "sv_1": float(sg[0]),
                    "n_ranked": int(keep.sum()),
                    "reason": no_spread_reason(r),
                }
            )
    # the tokens every head's singular directions read (W_E) and write (W_U): one pass over the vocabulary for all
    nd = reads[0].shape[1]
    kk = min(k, d_vocab)
    ext = direction_extremes(W_E, W_U32, torch.cat(reads, 1), torch.cat(writes, 1), kk, dev)
    for i, label in enumerate(labels):
        recs = self_lists(tok_ids, ranks[i], cosines[i], k)
        sig = {}
        for d in range(nd):
            c = i * nd + d
            # the pair's sign: the read side's largest |score| positive (else both sides negated)
            flip = float(ext["read_top"][0][0, c]) < -float(ext["read_bottom"][0][0, c])
            for name, side in ((f"read_{d + 1}", "read"), (f"write_{d + 1}", "write")):
                val, idx = ext[f"{side}_bottom"] if flip else ext[f"{side}_top"]
                for q in range(kk):
                    recs.append((name, q + 1, int(idx[q, c]), -float(val[q, c]) if flip else float(val[q, c])))
            sig[f"sigma_{d + 1}"] = float(sigmas[i][d])
        df = pd.DataFrame(recs, columns=["kind", "rank", "token_id", "value"])
        df.insert(3, "token", token_texts(tokenizer, df["token_id"].tolist()))
        df.attrs = sig
        top[label] = df
    table = pd.DataFrame(rows)
    table.index = head_labels(table["layer"], table["head"])
    return table, np.stack(ranks), np.stack(cosines), top


def _share(hit: torch.Tensor, keep: torch.Tensor) -> float:
    """The fraction of ``hit`` among the ``keep`` entries (NaN when none is kept)."""
    n = int(keep.sum())
    return float((hit & keep).sum()) / n if n else float("nan")


def rank_stats(r: np.ndarray) -> dict[str, float]:
    """``{"self_rank_median": numpy's median of the finite self-ranks}`` (NaN when none is). Raises nothing."""
    fin = r[np.isfinite(r)]
    return {"self_rank_median": float(np.median(fin)) if len(fin) else float("nan")}


#: Why self-ranks are NaN (the table's ``reason``; "" when every token read has one).
REASON_NONE_RANKED = (
    "no token's row has spread: the head's output is zero within float rounding for every token read (its W_O or "
    "its kv group's W_V is zero) or every logit of each row ties (W_U is zero)"
)


def no_spread_reason(r: np.ndarray) -> str:
    """The ``reason`` of a head's self-ranks ``r`` (NaN: a row without spread). Raises nothing."""
    n_nan = int((~np.isfinite(r)).sum())
    if not n_nan:
        return ""
    if n_nan == len(r):
        return REASON_NONE_RANKED
    return (
        f"{n_nan} of {len(r)} tokens' rows have no spread and are left out (NaN self-rank): the head's output for "
        "them is zero within float rounding (a zero embedding row) or every logit ties"
    )


#: The self-rank lists of ``top_tokens`` and their rule: a token is promoted only in the upper half of its own row.
PROMOTED, SUPPRESSED = "promoted", "suppressed"
PROMOTED_COS, SUPPRESSED_COS = "promoted_cosine", "suppressed_cosine"
SELF_KINDS = (PROMOTED, SUPPRESSED, PROMOTED_COS, SUPPRESSED_COS)


def self_lists(tok_ids: np.ndarray, r: np.ndarray, cos: np.ndarray, k: int) -> list[tuple[str, int, int, float]]:
    """The ``top_tokens`` rows read from the self-ranks ``r`` and self-cosines ``cos`` of the tokens ``tok_ids``:
    ``promoted`` (at most ``k`` tokens of self-rank < 0.5, lowest first), ``suppressed`` (self-rank > 0.5, highest
    first), ``promoted_cosine`` (cosine > 0, highest first) and ``suppressed_cosine`` (cosine < 0, lowest first);
    ties by token id; NaN entries never listed. Raises nothing."""
    out: list[tuple[str, int, int, float]] = []
    for kind, v, keep, sign in (
        (PROMOTED, r, r < 0.5, 1.0),
        (SUPPRESSED, r, r > 0.5, -1.0),
        (PROMOTED_COS, cos, cos > 0, -1.0),
        (SUPPRESSED_COS, cos, cos < 0, 1.0),
    ):
        with np.errstate(invalid="ignore"):
            idx = np.flatnonzero(np.isfinite(v) & keep)
        order = idx[np.lexsort((tok_ids[idx], sign * v[idx]))][:k]
        out += [(kind, i + 1, int(tok_ids[o]), float(v[o])) for i, o in enumerate(order)]
    return out


#: The columns of :attr:`HeadTokens.table` and of its ``top_tokens`` frames, in order.
TABLE_COLUMNS = (
    "layer", "head", "kv_head", "self_rank_median", "frac_top_k", "frac_bottom_k", "n_tokens", "sv_1", "n_ranked",
    "reason",
)  # fmt: skip
TOP_COLUMNS = ("kind", "rank", "token_id", "token", "value")
register(HEAD_TOKENS_RECORD, head_tokens_v030(self_lists, no_spread_reason, SELF_KINDS))  # 0.3.0 saves (issue 45)


@saves("head_tokens")
@strict_kwargs
def save_head_tokens(result: HeadTokens, path: PathLike, overwrite: bool = False) -> str:
    """Save a :class:`HeadTokens` to the folder ``path``: ``table.parquet`` (:attr:`HeadTokens.table`; labels
    rebuilt from ``layer``/``head``), ``self_ranks.parquet`` and ``self_cosines.parquet`` (a ``token_id`` column and
    one column of self-ranks / self-cosines per head label, in the table's order), ``top.parquet`` (every head's
    ``top_tokens`` frame with a ``label`` column) and ``head_tokens.json`` (summary, options, info, the frames'
    ``sigma_i``, the sha256 of every table and the record's own digest; no pickle).

    Returns:
        The folder, as a string.

    Raises:
        OptionTypeError: ``result`` is not a :class:`HeadTokens`; every other error as
            :meth:`StoredResult.save <tl_idempotence.core.stored.StoredResult.save>`.
    """
    if not isinstance(result, HeadTokens):
        raise OptionTypeError(f"save_head_tokens saves a HeadTokens (tli.head_tokens); got {type(result).__name__}.")
    tables, sigmas = _saved_tables(result)
    return write_probe("head_tokens", path, HEAD_TOKENS_FORMAT, HEAD_TOKENS_RECORD, tables, result, overwrite, sigmas)


def _saved_tables(result: HeadTokens) -> tuple[dict[str, pd.DataFrame], dict[str, Any]]:
    """The tables of a head-tokens save and its ``sigmas`` record field."""
    labels = list(result._table.index)
    ranks = pd.DataFrame({"token_id": result._tokens, **{lab: result._ranks[i] for i, lab in enumerate(labels)}})
    cos = pd.DataFrame({"token_id": result._tokens, **{lab: result._cosines[i] for i, lab in enumerate(labels)}})
    top = pd.concat([result._top[lab].assign(label=lab) for lab in labels], ignore_index=True)[["label", *TOP_COLUMNS]]
    tables = {"table": result._table.loc[:, list(TABLE_COLUMNS)], "self_ranks": ranks, "self_cosines": cos, "top": top}
    return tables, {"sigmas": {lab: dict(result._top[lab].attrs) for lab in labels}}


def head_tokens_files(result: HeadTokens) -> dict[str, bytes]:
    """The files :func:`save_head_tokens` writes, as bytes (a mechanism save holds them as a part)."""
    tables, sigmas = _saved_tables(result)
    return tables_record_files(HEAD_TOKENS_FORMAT, HEAD_TOKENS_RECORD, tables, probe_fields(result, sigmas))


@loads("head_tokens")
def load_head_tokens(path: PathLike) -> HeadTokens:
    """Read back what :func:`save_head_tokens` wrote, checking every digest and recomputing what the tables give:
    each head's ``self_rank_median``, ``frac_top_k``, ``n_tokens``, ``n_ranked`` and ``reason`` and its token lists
    from the self-ranks and self-cosines, and the summary's ``n_heads``, ``n_tokens``, ``median_self_rank`` and
    ``headline``.

    Args:
        path: the folder.

    Returns:
        The :class:`HeadTokens` (equal tables and summary; ``loaded_from`` the folder; :meth:`HeadTokens.check_model`).

    Raises:
        MissingFileError: no such folder, no ``head_tokens.json``, a listed table missing (names it).
        ReportFileError: another format; an edited record (digest) or table (sha256), each named; tables, columns,
            ranks or a summary field that are not what the tables give (an edit whose digests were recomputed;
            names the file and the field).
        OptionTypeError: ``path`` is not a path.
    """
    names = ("table", "self_ranks", "self_cosines", "top")
    columns = {"table": (TABLE_COLUMNS, f"a head-tokens table {list(TABLE_COLUMNS)}")}
    save = read_probe_save(
        path, HEAD_TOKENS_FORMAT, HEAD_TOKENS_RECORD, frozenset(names), ("seed", "k"), "tli.head_tokens", columns
    )
    d, rec, fields, info, labels, edited = save.folder, save.record, save.fields, save.info, save.labels, save.edited
    ft, fr, fc, fo = (save.file(n) for n in names)
    table, ranks, cosines, top = (save.tables[n] for n in names)
    for f, frame in ((fr, ranks), (fc, cosines)):
        if list(frame.columns) != ["token_id", *labels]:
            raise edited(f, f"columns {list(frame.columns)[:6]} are not token_id and the table's heads")
    try:
        summary = HeadTokensSummary(fields["summary"])
        d_vocab, k = int(summary["d_vocab"]), int(summary["k"])
        sigmas = {lab: {str(a): float(b) for a, b in fields["sigmas"][lab].items()} for lab in labels}
    except (KeyError, TypeError, ValueError, AttributeError, OptionError) as e:
        raise ReportFileError(f"{rec}: a malformed summary or record ({type(e).__name__}: {e}).") from e
    tok = index_column(ranks, "token_id", fr)
    if not np.array_equal(index_column(cosines, "token_id", fc), tok):
        raise edited(fc, f"its token ids are not those of {fr.name}")
    R = ranks.loc[:, labels].to_numpy(dtype=np.float64).T  # [heads, tokens]
    Cs = cosines.loc[:, labels].to_numpy(dtype=np.float64).T
    if len(np.unique(tok)) != len(tok) or (len(tok) and (tok.min() < 0 or tok.max() >= d_vocab)):
        raise edited(fr, f"token ids that repeat or lie outside [0, d_vocab = {d_vocab})")
    fin = np.isfinite(R)
    above = np.round(np.where(fin, R, 0) * (d_vocab - 1))
    Rf = np.where(fin, R, 0)
    if not (np.isnan(R[~fin]).all() and (Rf >= 0).all() and (Rf <= 1).all() and same_floats(above / (d_vocab - 1), Rf)):
        raise edited(fr, f"self-ranks that are not counts / (d_vocab - 1) = {d_vocab - 1} (or NaN)")
    if not (np.isnan(Cs[~np.isfinite(Cs)]).all() and (np.abs(Cs[np.isfinite(Cs)]) <= 1 + 1e-12).all()):
        raise edited(fc, "self-cosines outside [-1, 1]")
    if (np.isfinite(Cs) & ~fin).any():
        raise edited(fc, f"a self-cosine where {fr.name} has no self-rank (a row without spread)")
    check_missing_cosines(fc, fr, fin, np.isfinite(Cs), fields.get("summary"))
    for col, fresh in (
        ("self_rank_median", [rank_stats(r)["self_rank_median"] for r in R]),
        ("frac_top_k", [float((a[f] < k).mean()) if f.any() else np.nan for a, f in zip(above, fin)]),
        ("n_tokens", np.full(len(labels), R.shape[1])),
        ("n_ranked", fin.sum(axis=1)),
    ):
        if not same_floats(table[col].to_numpy(dtype=float), fresh):
            raise edited(ft, f"{col!r} is not what {fr.name} gives")
    if table["reason"].astype(object).tolist() != [no_spread_reason(r) for r in R]:
        raise edited(ft, f"'reason' is not what {fr.name} gives")
    if tuple(top.columns) != ("label", *TOP_COLUMNS):
        raise edited(fo, f"columns {list(top.columns)} are not {['label', *TOP_COLUMNS]}")
    top_of: dict[str, pd.DataFrame] = {}
    for i, lab in enumerate(labels):
        t = top[top["label"] == lab].drop(columns="label").reset_index(drop=True)
        want = pd.DataFrame(self_lists(tok, R[i], Cs[i], k), columns=["kind", "rank", "token_id", "value"])
        if t[t["kind"].isin(SELF_KINDS)]["kind"].tolist() != want["kind"].tolist():
            raise edited(fo, f"{lab}'s token lists are not what {fr.name} and {fc.name} give")
        for kind in SELF_KINDS:
            got, w = t[t["kind"] == kind], want[want["kind"] == kind]
            same = got["token_id"].tolist() == w["token_id"].tolist() and got["rank"].tolist() == w["rank"].tolist()
            if not (same and same_floats(got["value"], w["value"])):
                raise edited(fo, f"{lab}'s {kind} tokens are not what {fr.name} and {fc.name} give")
        t.attrs = sigmas[lab]
        top_of[lab] = t
    fresh_summary = {
        "n_heads": len(labels),
        "n_tokens": R.shape[1],
        "median_self_rank": rank_stats(table["self_rank_median"].to_numpy(dtype=float))["self_rank_median"],
        "headline": _headline(table, k, R.shape[1], info.extra.get("post_attention_norm")),
    }
    summary = check_summary(summary, fresh_summary, rec, "tli.head_tokens")
    opts = fields["options"]
    _check_stated(rec, ft, fo, summary, opts, info, table, top, sigmas, R.shape[1])
    return HeadTokens(
        table=table,
        ranks=R,
        tokens=tok,
        top=top_of,
        summary=summary,
        info=info,
        options=opts,
        loaded_from=str(d),
        cosines=Cs,
    )
