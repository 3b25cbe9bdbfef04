"""What a head's OV circuit does to tokens, read from the weights (SPEC 12, token readout).

For a head ``h`` of layer ``l`` (TransformerLens row form; the kv head's ``W_V`` on GQA/MQA, as ``model.OV``
expands it), row ``t`` of the full OV circuit ``W_E W_V[h] W_O[h] W_U`` (``d_vocab x d_vocab``) holds the
logits the head writes when it reads source token ``t``. Its **self-rank**

    self_rank(t) = #{u != t : logit_u > logit_t} / (d_vocab - 1)

is 0 when the head promotes ``t`` above every other token, 1 when it suppresses ``t`` most. Per head,
over a seeded sample of source tokens (or the ``tokens`` given): the median self-rank (numpy's median),
the fraction of tokens in their own row's top ``k`` (``#{u != t : logit_u > logit_t} < k``) and bottom ``k``
(``#{u != t : logit_u < logit_t} < k``).

Computation (never a ``d_vocab²`` matrix), per layer and per tile of ``VOCAB_TILE`` vocabulary columns: one
float64 product ``W_U[:, tile]ᵀ @ W_O[heads]ᵀ`` gives the ``W_OU = W_O[h] @ W_U`` columns of every selected head of
the layer (``[tile, heads · d_head]``; float64 because ``W_O W_U`` cancels heavily: a float32 product's rounding
bound, in ``|W_O| |W_U|``, left ~200 close calls per row on SmolLM2, this one ~2); per head and chunk of ``chunk``
source tokens the float32 logits ``fl32(x) @ fl32(W_OU)`` (``x = W_E[tokens] @ W_V``, inner dimension
``d_head``) are compared with ``logit_t ± b`` (one ``>``, one ``<`` and their counts per block). The ranks are
those of the float64 rows ``ℓ_u = fl64(fl64(x @ W_O) · W_U[:, u])`` (the row form's association): ``b`` is a
rigorous bound on ``|logit32_u - ℓ_u|`` over the tile (``γ_n = n u / (1 - n u)`` of the standard dot-product
analysis, Cauchy-Schwarz over the inner dimension: ``g1 ‖x‖ max ‖W_OU[:, u]‖ + g2 ‖|x| |W_O|‖ max ‖W_U[:, u]‖``,
:func:`_layer_counts`), and the logits within ``b`` of ``logit_t`` (the source token itself among them) are
recomputed as ``ℓ_u`` and compared exactly, so a rank never depends on float32 rounding. TF32 is switched off on
CUDA while the products run.

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
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import pandas as pd
import torch

from ..core.heads import ModelInfo, check_weights, combined_fingerprint, read_layer
from ..core.options import check_int, check_seed, strict_kwargs
from ..core.random import layer_generator
from ..core.records import index_column, tables_record_files
from ..core.selection import head_label, head_labels, select_heads
from ..core.stored import StoreSpec
from ..core.tables import FrozenSummary
from ..errors import OptionError, OptionTypeError, ReportFileError, UnsupportedModelError
from ..sources.tl import TLModelSource, is_tl_model
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
from .tokens import special_ids

if TYPE_CHECKING:  # pragma: no cover
    from ..core.hints import IntLike, PathLike

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
#: Largest float64 copy of W_U kept for one call (larger unembeddings are converted tile by tile).
U64_CACHE_BYTES = 1 << 29
#: float64 elements gathered at a time by the recount of close calls.
RECOUNT_ELEMS = 1 << 22
#: Leading singular directions kept per head by default.
N_DIRECTIONS = 3
#: What the readout includes, stated in every result.
CONVENTION = (
    "rows of W_E W_V W_O W_U (TransformerLens row form; the kv head's W_V on GQA): no biases, no positional "
    "embedding, no final norm"
)
_U32 = 2.0**-24  # float32 unit roundoff
_U64 = 2.0**-53  # float64 unit roundoff


def _gamma(n: int) -> float:
    return n * _U32 / (1 - n * _U32)


def _gamma64(n: int) -> float:
    return n * _U64 / (1 - n * _U64)


def _row_norms(rows: torch.Tensor) -> torch.Tensor:
    """float64 Euclidean norms of ``rows`` (``[m, d]``), 8192 rows at a time (no float64 copy of the whole)."""
    return torch.cat([rows[s : s + 8192].double().norm(dim=1) for s in range(0, rows.shape[0], 8192)])


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
    kinds = sorted({str(x) for x in top["kind"]} - {"promoted", "suppressed"})
    nd = opts.get("n_directions")
    want = sorted([f"read_{i}" for i in range(1, (nd or 0) + 1)] + [f"write_{i}" for i in range(1, (nd or 0) + 1)])
    if not isinstance(nd, int) or not 1 <= nd <= info.d_head or kinds != want:
        raise edited(fo, f"its directions {kinds[:4]} are not options['n_directions'] = {nd!r} (at most d_head)")
    for lab, sig in sigmas.items():
        if list(sig) != [f"sigma_{i}" for i in range(1, nd + 1)] or sig["sigma_1"] != float(table.loc[lab, "sv_1"]):
            raise edited(ft, f"{lab}'s sigmas in {rec.name} are not its sv_1 and options['n_directions'] = {nd}")


HEAD_TOKENS_FORMAT = "tl_idempotence.head_tokens/1"
HEAD_TOKENS_RECORD = "head_tokens.json"


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


class HeadTokens(TokenResult):
    """Result of :func:`head_tokens` (SPEC 12, token readout). Immutable: every frame and array handed out is a copy
    made on each read, :attr:`summary` (a typed :class:`HeadTokensSummary`) and :attr:`options` are read-only, and
    assigning an attribute raises ``dataclasses.FrozenInstanceError``.

    Attributes (properties):
        table: one row per head, indexed by ``"L10H8"`` labels: ``layer, head, kv_head``, ``self_rank_median``
            (numpy's median over the tokens; 0: promotes its source token most, 1: suppresses it most),
            ``frac_top_k``, ``frac_bottom_k`` (fractions of the tokens in their own row's top / bottom ``k``),
            ``n_tokens``, ``sv_1`` (the largest singular value of ``W_V W_O``).
        self_ranks: ``[heads, tokens]`` DataFrame of every self-rank (columns: the token ids).
        tokens: the source token ids (int64 array, a copy).
        summary: ``model_name, model_class, n_heads, n_tokens, k, seed, d_vocab, tokens`` (how they were
            chosen), ``convention``, ``processing``, ``weights_fingerprint`` (the report's combined key over the
            measured layers), ``embedding_fingerprint`` (sha256 of W_E and W_U), ``median_self_rank``, ``headline``.
        info: the model's :class:`~tl_idempotence.core.heads.ModelInfo`.
        options: ``k, n_tokens, seed, n_directions, chunk``.
        loaded_from: the folder :func:`load_head_tokens` read it from (:meth:`save` refuses to write there), else
            None.
    """

    repr_keys: ClassVar[tuple[str, ...]] = ("model_name", "n_heads", "n_tokens", "k", "median_self_rank")
    frozen_name: ClassVar[str] = "a head-tokens result is"
    frozen_hint: ClassVar[str] = "tli.head_tokens again"
    summary_type: ClassVar[type[FrozenSummary]] = HeadTokensSummary
    probe_name: ClassVar[str] = "head_tokens"
    store: ClassVar[StoreSpec] = StoreSpec(
        name="head_tokens",
        record=HEAD_TOKENS_RECORD,
        formats=(HEAD_TOKENS_FORMAT,),
        free_fields=(
            *FREE_MODEL_FIELDS,
            ("options.chunk", "a performance setting: source tokens per product; no number depends on it"),
            ("sigmas.*.sigma_[2-9]", "the singular values beyond the first, recorded once for the direction lists"),
            ("sigmas.*.sigma_[1-9][0-9]*", "the singular values beyond the first, recorded once"),
        ),
    )

    _ranks: np.ndarray  # [heads, tokens] float64
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
    ) -> None:
        self._freeze_result(
            table,
            summary,
            loaded_from,
            _ranks=np.array(ranks, dtype=np.float64),  # never handed out: the properties give copies
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
    def tokens(self) -> np.ndarray:
        """The source token ids measured (a copy)."""
        return self._tokens.copy()

    def top_tokens(self, head: str) -> pd.DataFrame:
        """What one head does to tokens: ``kind, rank, token_id, token, value`` rows (a copy).

        ``kind``: ``"promoted"`` / ``"suppressed"`` (the sampled source tokens the head ranks highest / lowest in
        their own row; ``value``: the self-rank), ``"read_i"`` / ``"write_i"`` (the tokens the ``i``-th singular
        direction of ``W_V W_O`` reads via ``W_E`` and writes via ``W_U``; ``value``: the token's score on it,
        ``sigma_i`` in ``summary`` of the frame's ``attrs``). ``token``: the tokenizer's text, or None.

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

    @classmethod
    def load(cls, path: PathLike) -> HeadTokens:
        """:func:`load_head_tokens`: a folder :meth:`save` wrote, checked (raises as it does)."""
        return load_head_tokens(path)

    @strict_kwargs
    def save(self, path: PathLike, overwrite: bool = False) -> str:
        """Save to the folder ``path`` (:func:`save_head_tokens`: parquet tables and one JSON record with their
        sha256s and its own digest; no pickle); :func:`load_head_tokens` reads it back.

        Raises:
            OptionTypeError, OptionError, OutputOverInputError: as :func:`save_head_tokens`.
        """
        return save_head_tokens(self, path, overwrite=overwrite)


def embedding_matrices(model: Any, where: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``(W_E [d_vocab, d_model], W_U [d_model, d_vocab])`` of a TransformerLens model, checked (SPEC 12).

    Raises:
        UnsupportedModelError: not a TransformerLens model, no ``W_E``/``W_U``, shapes that do not chain, or
            ``d_vocab_out != d_vocab`` (names which).
        WeightError: NaN/inf, non-float, sparse or meta weights (:func:`~tl_idempotence.core.heads.check_weights`).
    """
    if not is_tl_model(model):
        raise UnsupportedModelError(
            f"{where} reads a TransformerLens model (HookedTransformer or TransformerBridge); got "
            f"{type(model).__name__}. Load one with tli.models.load(name)."
        )
    mats = []
    for name in ("W_E", "W_U"):
        try:
            w = getattr(model, name)
        except Exception as e:  # any failure means the model has no such matrix
            raise UnsupportedModelError(
                f"{where} needs the model's embedding and unembedding (model.W_E, model.W_U); "
                f"{type(model).__name__} has no {name} ({type(e).__name__})."
            ) from e
        if not isinstance(w, torch.Tensor) or w.ndim != 2:
            raise UnsupportedModelError(
                f"{where}: model.{name} must be a 2-D tensor; got {getattr(w, 'shape', type(w).__name__)}."
            )
        mats.append(w.detach())
    W_E, W_U = mats
    d_model = int(model.cfg.d_model)
    if W_E.shape[1] != d_model or W_U.shape[0] != d_model:
        raise UnsupportedModelError(
            f"{where}: W_E {tuple(W_E.shape)} and W_U {tuple(W_U.shape)} do not chain through d_model={d_model}."
        )
    if W_U.shape[1] != W_E.shape[0]:
        raise UnsupportedModelError(
            f"{where}: d_vocab_out ({W_U.shape[1]}, W_U's columns) != d_vocab ({W_E.shape[0]}, W_E's rows); a "
            "token's row of the OV circuit has no logit of its own token to compare."
        )
    if W_E.shape[0] < 2:
        raise UnsupportedModelError(f"{where}: d_vocab = {W_E.shape[0]}; a rank needs at least two tokens.")
    check_weights(W_E, "W_E (model.W_E)")
    check_weights(W_U, "W_U (model.W_U)")
    return W_E, W_U


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


def _up32(v: torch.Tensor) -> torch.Tensor:
    """float32 values ``>= v`` (float64), the nearest such (inf when beyond float32's range)."""
    f = v.to(torch.float32)
    low = f.double() < v
    return torch.where(low, torch.nextafter(f, torch.full_like(f, float("inf"))), f)


def _down32(v: torch.Tensor) -> torch.Tensor:
    """float32 values ``<= v`` (float64), the nearest such (-inf when beyond float32's range)."""
    f = v.to(torch.float32)
    high = f.double() > v
    return torch.where(high, torch.nextafter(f, torch.full_like(f, float("-inf"))), f)


def _layer_counts(
    xs: list[torch.Tensor],
    O64: torch.Tensor,
    U_rows: torch.Tensor,
    u_norm: torch.Tensor,
    tok: torch.Tensor,
    chunk: int,
    tile: int,
    U_tiles: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(above, below)`` ``[heads, n]`` int64 counts of the selected heads of one layer (module docstring).

    ``xs``: per head ``[n, d_head]`` float64 ``W_E[tokens] @ W_V[kv]``; ``O64``: ``[heads, d_head, d_model]``
    float64 ``W_O``; ``U_rows``: ``[d_vocab, d_model]`` (``W_U`` transposed; float32 or float64);
    ``u_norm``: ``[d_vocab]`` float64 norms of its rows; ``tok``: ``[n]`` ids; ``U_tiles(a, T)``: its rows
    ``a .. a+T`` in float64 (:func:`_float64_tiles`).

    Per tile of ``tile`` vocabulary columns, one float64 product ``W_U[:, tile]ᵀ @ W_O[heads]ᵀ`` gives every
    head's ``W_OU`` columns (``[tile, heads * d_head]``); each head's float32 logits ``fl32(x) @ fl32(W_OU)``
    (inner dimension ``d_head``) are compared with per-row thresholds ``logit_t ± b``. With
    ``y = fl64(x @ W_O)`` and the reference logits ``ℓ_u = fl64(y · W_U[:, u])`` (the row form's association;
    ``logit_t = ℓ_t``), the standard dot-product bounds give, for every ``u`` of the tile,

        |logit32_u - ℓ_u| <= g1 ‖x‖ max_tile ‖W_OU[:, u]‖ + g2 ‖|x| |W_O|‖ max_tile ‖W_U[:, u]‖ = b

    (Cauchy-Schwarz over the inner dimensions; ``g1 = γ_{d_head}(1+u)² + 2u + u²`` for the float32 product and
    the two float32 casts, ``g2 = γ64_{d_head} + 3 γ64_{d_model}`` for the float64 products on both sides).
    A logit above ``fl32↑(logit_t + b)`` or below ``fl32↓(logit_t - b)`` is surely above / below; the rest
    (the source token itself always among them) are recomputed as ``ℓ_u`` and compared exactly.
    """
    H, d_head, d_model = O64.shape
    n = len(tok)
    d_vocab = U_rows.shape[0]
    dev = O64.device
    OT = O64.reshape(H * d_head, d_model).T  # [d_model, H * d_head]
    ys = [x @ O64[j] for j, x in enumerate(xs)]  # [n, d_model] float64
    U_tok = U_rows[tok].double()
    Ls = [(y * U_tok).sum(-1) for y in ys]  # [n] float64: ℓ_t
    x32s = [x.to(torch.float32) for x in xs]
    g1 = _gamma(d_head) * (1 + _U32) ** 2 + 2 * _U32 + _U32**2
    g2 = _gamma64(d_head) + 3 * _gamma64(d_model)
    slack = 1 + 1e-9  # the norms' and the bound's own float64 rounding (relative <= 1e-13)
    xn = [x.norm(dim=1) for x in xs]
    zn = [(x.abs() @ O64[j].abs()).norm(dim=1) for j, x in enumerate(xs)]
    above = torch.zeros(H, n, dtype=torch.long, device=dev)
    below = torch.zeros(H, n, dtype=torch.long, device=dev)
    c_rows = min(chunk, n)
    width = min(tile, d_vocab)
    buf = torch.empty(c_rows, width, dtype=torch.float32, device=dev)
    m_up = torch.empty(c_rows, width, dtype=torch.bool, device=dev)
    m_dn = torch.empty_like(m_up)
    for a in range(0, d_vocab, tile):
        T = min(tile, d_vocab - a)
        W64 = U_tiles(a, T) @ OT  # [T, H * d_head]: W_OU's columns of this tile, every head
        W32 = W64.to(torch.float32)
        c_max = W64.view(T, H, d_head).norm(dim=2).amax(0)  # [H]
        u_max = float(u_norm[a : a + T].max())
        in_tile = ((tok >= a) & (tok < a + T)).to(torch.int32)
        for j in range(H):
            b = (g1 * xn[j] * float(c_max[j]) + g2 * zn[j] * u_max) * slack
            b = b + (Ls[j].abs() + b) * 2.0**-51  # L ± b's own float64 rounding
            hi, lo = _up32(Ls[j] + b), _down32(Ls[j] - b)
            Wt = W32[:, j * d_head : (j + 1) * d_head].T  # [d_head, T]
            for c in range(0, n, chunk):
                cs = min(chunk, n - c)
                lg = torch.mm(x32s[j][c : c + cs], Wt, out=buf[:cs, :T])
                up = torch.gt(lg, hi[c : c + cs, None], out=m_up[:cs, :T])
                dn = torch.lt(lg, lo[c : c + cs, None], out=m_dn[:cs, :T])
                n_up = up.view(torch.uint8).sum(1, dtype=torch.int32)
                n_dn = dn.view(torch.uint8).sum(1, dtype=torch.int32)
                above[j, c : c + cs] += n_up
                below[j, c : c + cs] += n_dn
                # rows with close calls besides their source token (always close: |logit32_t - ℓ_t| <= b)
                rows = (n_up + n_dn + in_tile[c : c + cs] < T).nonzero().squeeze(1)
                if len(rows):
                    rr, u = (~(up[rows] | dn[rows])).nonzero(as_tuple=True)
                    r, u = rows[rr] + c, u + a
                    keep = u != tok[r]
                    _recount(ys[j], Ls[j], U_rows, r[keep], u[keep], above[j], below[j])
    return above, below


def _float64_tiles(U_rows: torch.Tensor) -> Any:
    """``f(a, T)``: rows ``a .. a+T`` of ``U_rows`` in float64 (from one float64 copy when it takes at most
    ``U64_CACHE_BYTES``, else converted per call)."""
    if U_rows.dtype == torch.float64:
        return lambda a, T: U_rows[a : a + T]
    if U_rows.numel() * 8 <= U64_CACHE_BYTES:
        U64 = U_rows.double()
        return lambda a, T: U64[a : a + T]
    return lambda a, T: U_rows[a : a + T].double()


def _recount(
    y: torch.Tensor,
    L: torch.Tensor,
    U_rows: torch.Tensor,
    r: torch.Tensor,
    u: torch.Tensor,
    above: torch.Tensor,
    below: torch.Tensor,
) -> None:
    """Adds to ``above[r]`` / ``below[r]`` whether ``ℓ_u = fl64(y[r] · W_U[:, u]) > / < L[r]`` (in place)."""
    step = max(1, RECOUNT_ELEMS // y.shape[1])
    for s in range(0, len(r), step):
        rr, uu = r[s : s + step], u[s : s + step]
        exact = (y[rr] * U_rows[uu].double()).sum(-1)
        Lr = L[rr]
        above.index_add_(0, rr, (exact > Lr).long())
        below.index_add_(0, rr, (exact < Lr).long())


def _svd_directions(V: torch.Tensor, W_O: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Leading ``n`` singular triplets of ``V @ W_O`` (``[d_model, d_head] @ [d_head, d_model]``, float64) from the
    factors: ``(read [d_model, n], sigma [n], write [d_model, n])`` with ``V W_O = Σ σ_i read_i write_iᵀ``."""
    Qv, Rv = torch.linalg.qr(V)
    Qo, Ro = torch.linalg.qr(W_O.T)
    A, S, Bt = torch.linalg.svd(Rv @ Ro.T)
    return Qv @ A[:, :n], S[:n], Qo @ Bt.T[:, :n]


def _decode(tok: Any, ids: list[int]) -> list[str | None]:
    if tok is None:
        return [None] * len(ids)
    out: list[str | None] = []
    for i in ids:
        try:
            out.append(str(tok.decode([int(i)])))
        except Exception:  # noqa: BLE001 - a display string only
            out.append(None)
    return out


def _headline(table: pd.DataFrame, k: int, n_tokens: int) -> str:
    med = table["self_rank_median"].to_numpy(dtype=float)
    n = len(table)
    n_copy = int((med < 0.5).sum())
    i_lo, i_hi = int(np.argmin(med)), int(np.argmax(med))
    lo, hi = table.index[i_lo], table.index[i_hi]
    return (
        f"Do the heads' OV circuits promote the token they read? {n_copy} of {n} heads rank their source token in "
        f"the upper half of its own row (median self-rank < 0.5, over {n_tokens} tokens); the strongest copier is "
        f"{lo} (median self-rank {med[i_lo]:.3g}, {table['frac_top_k'].iloc[i_lo]:.0%} of tokens in their own "
        f"top {k}) and the strongest suppressor {hi} (median self-rank {med[i_hi]:.3g}, "
        f"{table['frac_bottom_k'].iloc[i_hi]:.0%} in their bottom {k})."
    )


@strict_kwargs
def head_tokens(
    model: Any,
    heads: Any = None,
    tokens: Any = None,
    k: IntLike = 20,
    n_tokens: IntLike = 512,
    seed: IntLike = 0,
    *,
    n_directions: IntLike = N_DIRECTIONS,
    chunk: IntLike | None = None,
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
            ``max(1, 2^19 // min(VOCAB_TILE, d_vocab))``, 256 on SmolLM2; memory ``~ chunk · VOCAB_TILE`` floats,
            a ``VOCAB_TILE x heads · d_head`` float64 tile per layer and a float64 copy of ``W_U`` up to 512 MiB,
            never ``d_vocab²``).

    Returns:
        :class:`HeadTokens` (``.table`` indexed by ``"L10H8"``; ``.top_tokens(label)``; ``.headline``).

    Raises:
        UnsupportedModelError: not a TransformerLens model, no ``W_E``/``W_U``, ``d_vocab_out != d_vocab``.
        WeightError: NaN/inf in ``W_E``, ``W_U`` or a measured layer's ``W_V``/``W_O`` (names which).
        OptionTypeError / OptionError: an unknown head or label, ``k`` outside ``1 .. d_vocab``, empty or
            out-of-range ``tokens``, ``n_tokens``/``seed``/``n_directions``/``chunk`` of the wrong type or range.
    """
    W_E, W_U = embedding_matrices(model, "head_tokens")
    d_vocab = int(W_E.shape[0])
    src = TLModelSource(model)
    info = src.info
    sel = select_heads(heads, list(src.layers()), info.n_heads, labels=True)
    k = check_int(k, "k", 1, d_vocab)
    n_tokens = check_int(n_tokens, "n_tokens", 1, MAX_TOKENS)
    seed = check_seed(seed)
    n_directions = check_int(n_directions, "n_directions", 1, info.d_head)
    default_chunk = max(1, LOGIT_ELEMS // min(VOCAB_TILE, d_vocab))
    chunk = default_chunk if chunk is None else check_int(chunk, "chunk", 1, MAX_TOKENS)
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
            table, ranks, top = _compute(model, W_E, W_U, layers, sel, tok_ids, k, n_directions, chunk, dev)
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
        "weights_fingerprint": combined_fingerprint([(lay, lh.fingerprint()) for lay, lh in layers.items()]),
        "embedding_fingerprint": embedding_fingerprint(W_E, W_U),
        "median_self_rank": float(np.median(table["self_rank_median"].to_numpy(dtype=float))),
        "headline": _headline(table, k, len(tok_ids)),
    }
    options = {"k": k, "n_tokens": n_tokens, "seed": seed, "n_directions": n_directions, "chunk": chunk}
    return HeadTokens(table=table, ranks=ranks, tokens=tok_ids, top=top, summary=summary, info=info, options=options)


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
) -> tuple[pd.DataFrame, np.ndarray, dict[str, pd.DataFrame]]:
    d_vocab = int(W_E.shape[0])
    tok = torch.as_tensor(tok_ids, dtype=torch.long, device=dev)
    W_U32 = W_U.to(dev, torch.float32)
    E_tok64 = W_E[tok.to(W_E.device)].to(dev, torch.float64)  # [n, d_model]
    # W_U's columns as rows, in its own precision when that is float64 (else float32, exact for bf16/fp16): the
    # reference logits are computed from them; a view of W_E, no copy, on a tied float32 model
    U_rows = (W_U.to(dev, torch.float64) if W_U.dtype == torch.float64 else W_U32).T.contiguous()
    u_norm = _row_norms(U_rows)
    U_tiles = _float64_tiles(U_rows)

    tokenizer = getattr(model, "tokenizer", None)
    rows, ranks = [], []
    top: dict[str, pd.DataFrame] = {}
    for lay, hs in sel.items():
        lh = layers[lay]
        V64 = lh.V.to(dev, torch.float64)  # [n_kv, d_model, d_head]
        x_kv: dict[int, torch.Tensor] = {}
        for h in hs:
            kv = int(lh.kv_head_of[h])
            if kv not in x_kv:
                x_kv[kv] = E_tok64 @ V64[kv]
        O64 = torch.stack([lh.O[h].to(dev, torch.float64).T for h in hs])  # [heads, d_head, d_model]
        xs = [x_kv[int(lh.kv_head_of[h])] for h in hs]
        above_l, below_l = _layer_counts(xs, O64, U_rows, u_norm, tok, chunk, VOCAB_TILE, U_tiles)
        reads, writes, sigmas = [], [], []
        for j, h in enumerate(hs):
            kv = int(lh.kv_head_of[h])
            W_O64 = O64[j]
            above, below = above_l[j], below_l[j]
            r = (above.double() / (d_vocab - 1)).cpu().numpy()
            ranks.append(r)
            rd, sg, wr = _svd_directions(V64[kv], W_O64, n_directions)
            reads.append(rd)
            writes.append(wr)
            sigmas.append(sg)
            rows.append(
                {
                    "layer": lay,
                    "head": h,
                    "kv_head": kv,
                    "self_rank_median": float(np.median(r)),
                    "frac_top_k": float((above < k).double().mean()),
                    "frac_bottom_k": float((below < k).double().mean()),
                    "n_tokens": len(r),
                    "sv_1": float(sg[0]),
                }
            )
        # token scores of every selected head's directions in one product per side: [d_vocab, heads * n]
        R = torch.cat(reads, 1).to(torch.float32)
        Wr = torch.cat(writes, 1).to(torch.float32)
        read_scores = torch.cat([W_E[s : s + 8192].to(dev, torch.float32) @ R for s in range(0, d_vocab, 8192)])
        write_scores = Wr.T @ W_U32  # [heads * n, d_vocab]
        nd = reads[0].shape[1]
        for j, h in enumerate(hs):
            label = head_label(lay, h)
            r = ranks[len(ranks) - len(hs) + j]
            order = np.lexsort((tok_ids, r))  # by self-rank, then id
            recs: list[tuple[str, int, int, float]] = []
            for i, o in enumerate(order[:k]):
                recs.append(("promoted", i + 1, int(tok_ids[o]), float(r[o])))
            for i, o in enumerate(np.lexsort((tok_ids, -r))[:k]):
                recs.append(("suppressed", i + 1, int(tok_ids[o]), float(r[o])))
            sig = {}
            for d in range(nd):
                rs = read_scores[:, j * nd + d].double()
                ws = write_scores[j * nd + d].double()
                if float(rs.max()) < -float(rs.min()):  # the pair's sign: the read side's largest |score| > 0
                    rs, ws = -rs, -ws
                kk = min(k, d_vocab)
                for name, sc in ((f"read_{d + 1}", rs), (f"write_{d + 1}", ws)):
                    val, idx = torch.topk(sc, kk)
                    for i in range(kk):
                        recs.append((name, i + 1, int(idx[i]), float(val[i])))
                sig[f"sigma_{d + 1}"] = float(sigmas[j][d])
            df = pd.DataFrame(recs, columns=["kind", "rank", "token_id", "value"])
            df.insert(3, "token", _decode(tokenizer, df["token_id"].tolist()))
            df.attrs = sig
            top[label] = df
    table = pd.DataFrame(rows)
    table.index = head_labels(table["layer"], table["head"])
    return table, np.stack(ranks), top


#: The columns of :attr:`HeadTokens.table` and of its ``top_tokens`` frames, in order.
TABLE_COLUMNS = ("layer", "head", "kv_head", "self_rank_median", "frac_top_k", "frac_bottom_k", "n_tokens", "sv_1")
TOP_COLUMNS = ("kind", "rank", "token_id", "token", "value")


@strict_kwargs
def save_head_tokens(result: HeadTokens, path: PathLike, overwrite: bool = False) -> str:
    """Save a :class:`HeadTokens` to the folder ``path``: ``table.parquet`` (:attr:`HeadTokens.table`; labels
    rebuilt from ``layer``/``head``), ``self_ranks.parquet`` (a ``token_id`` column and one column of self-ranks per
    head label, in the table's order), ``top.parquet`` (every head's ``top_tokens`` frame with a ``label`` column)
    and ``head_tokens.json`` (summary, options, info, the frames' ``sigma_i``, the sha256 of every table and the
    record's own digest; no pickle).

    Returns:
        The folder, as a string.

    Raises:
        OptionTypeError: ``result`` is not a :class:`HeadTokens`; ``path`` not a path; ``overwrite`` not a bool.
        OutputOverInputError (an ``OptionError``): ``path`` is the folder ``result`` was loaded from, or in it.
        OptionError: ``path`` ends in a file extension; a non-empty folder without ``overwrite``, a missing parent,
            an edited earlier record (:func:`~tl_idempotence.core.records.write_tables_record`; names it).
    """
    if not isinstance(result, HeadTokens):
        raise OptionTypeError(f"save_head_tokens saves a HeadTokens (tli.head_tokens); got {type(result).__name__}.")
    tables, sigmas = _saved_tables(result)
    return write_probe("head_tokens", path, HEAD_TOKENS_FORMAT, HEAD_TOKENS_RECORD, tables, result, overwrite, sigmas)


def _saved_tables(result: HeadTokens) -> tuple[dict[str, pd.DataFrame], dict[str, Any]]:
    """The tables of a head-tokens save and its ``sigmas`` record field."""
    labels = list(result._table.index)
    ranks = pd.DataFrame({"token_id": result._tokens, **{lab: result._ranks[i] for i, lab in enumerate(labels)}})
    top = pd.concat([result._top[lab].assign(label=lab) for lab in labels], ignore_index=True)[["label", *TOP_COLUMNS]]
    tables = {"table": result._table.loc[:, list(TABLE_COLUMNS)], "self_ranks": ranks, "top": top}
    return tables, {"sigmas": {lab: dict(result._top[lab].attrs) for lab in labels}}


def head_tokens_files(result: HeadTokens) -> dict[str, bytes]:
    """The files :func:`save_head_tokens` writes, as bytes (a mechanism save holds them as a part)."""
    tables, sigmas = _saved_tables(result)
    return tables_record_files(HEAD_TOKENS_FORMAT, HEAD_TOKENS_RECORD, tables, probe_fields(result, sigmas))


def load_head_tokens(path: PathLike) -> HeadTokens:
    """Read back what :func:`save_head_tokens` wrote, checking every digest and recomputing what the tables give:
    each head's ``self_rank_median``, ``frac_top_k`` and ``n_tokens`` and its promoted / suppressed tokens from
    the self-ranks, and the summary's ``n_heads``, ``n_tokens``, ``median_self_rank`` and ``headline``.

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
    d, fields, tables, info = read_probe(
        path, HEAD_TOKENS_FORMAT, HEAD_TOKENS_RECORD, frozenset({"table", "self_ranks", "top"}), ("seed", "k")
    )
    rec, ft, fr, fo = d / HEAD_TOKENS_RECORD, d / "table.parquet", d / "self_ranks.parquet", d / "top.parquet"
    edited = functools.partial(edited_error, again="tli.head_tokens")

    table, ranks, top = tables["table"], tables["self_ranks"], tables["top"]
    if tuple(table.columns) != TABLE_COLUMNS:
        raise ReportFileError(f"{ft} has columns {list(table.columns)}, not a head-tokens table {list(TABLE_COLUMNS)}.")
    labels = label_heads(table, ft, "tli.head_tokens")
    if list(ranks.columns) != ["token_id", *labels]:
        raise edited(fr, f"columns {list(ranks.columns)[:6]} are not token_id and the table's heads")
    try:
        summary = HeadTokensSummary(fields["summary"])
        d_vocab, k = int(summary["d_vocab"]), int(summary["k"])
        sigmas = {lab: {str(a): float(b) for a, b in fields["sigmas"][lab].items()} for lab in labels}
    except (KeyError, TypeError, ValueError, AttributeError, OptionError) as e:
        raise ReportFileError(f"{rec}: a malformed summary or record ({type(e).__name__}: {e}).") from e
    tok = index_column(ranks, "token_id", fr)
    R = ranks.loc[:, labels].to_numpy(dtype=np.float64).T  # [heads, tokens]
    if len(np.unique(tok)) != len(tok) or (len(tok) and (tok.min() < 0 or tok.max() >= d_vocab)):
        raise edited(fr, f"token ids that repeat or lie outside [0, d_vocab = {d_vocab})")
    above = np.round(R * (d_vocab - 1))
    if not (np.isfinite(R).all() and (R >= 0).all() and (R <= 1).all() and same_floats(above / (d_vocab - 1), R)):
        raise edited(fr, f"self-ranks that are not counts / (d_vocab - 1) = {d_vocab - 1}")
    for col, fresh in (
        ("self_rank_median", np.median(R, axis=1)),
        ("frac_top_k", (above < k).mean(axis=1)),
        ("n_tokens", np.full(len(labels), R.shape[1])),
    ):
        if not same_floats(table[col].to_numpy(dtype=float), fresh):
            raise edited(ft, f"{col!r} is not what {fr.name} gives")
    if tuple(top.columns) != ("label", *TOP_COLUMNS):
        raise edited(fo, f"columns {list(top.columns)} are not {['label', *TOP_COLUMNS]}")
    top_of: dict[str, pd.DataFrame] = {}
    for i, lab in enumerate(labels):
        t = top[top["label"] == lab].drop(columns="label").reset_index(drop=True)
        order = {"promoted": np.lexsort((tok, R[i]))[:k], "suppressed": np.lexsort((tok, -R[i]))[:k]}
        for kind, o in order.items():
            rows = t[t["kind"] == kind]
            if list(rows["token_id"]) != tok[o].tolist() or not same_floats(rows["value"], R[i][o]):
                raise edited(fo, f"{lab}'s {kind} tokens are not what {fr.name} gives")
        t.attrs = sigmas[lab]
        top_of[lab] = t
    fresh_summary = {
        "n_heads": len(labels),
        "n_tokens": R.shape[1],
        "median_self_rank": float(np.median(table["self_rank_median"].to_numpy(dtype=float))),
        "headline": _headline(table, k, R.shape[1]),
    }
    check_summary(summary, fresh_summary, rec, "tli.head_tokens")
    opts = fields["options"]
    _check_stated(rec, ft, fo, summary, opts, info, table, top, sigmas, R.shape[1])
    return HeadTokens(
        table=table, ranks=R, tokens=tok, top=top_of, summary=summary, info=info, options=opts, loaded_from=str(d)
    )
