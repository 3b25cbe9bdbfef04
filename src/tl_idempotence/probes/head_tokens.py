"""What a head's OV circuit does to tokens, read from the weights (SPEC 12, token readout).

For a head ``h`` of layer ``l`` (TransformerLens row form; the kv head's ``W_V`` on GQA/MQA, as ``model.OV``
expands it), row ``t`` of the full OV circuit ``W_E W_V[h] W_O[h] W_U`` (``d_vocab x d_vocab``) holds the
logits the head writes when it reads source token ``t``. Its **self-rank**

    self_rank(t) = #{u != t : logit_u > logit_t} / (d_vocab - 1)

is 0 when the head promotes ``t`` above every other token, 1 when it suppresses ``t`` most. Per head,
over a seeded sample of source tokens (or the ``tokens`` given): the median self-rank (numpy's median),
the fraction of tokens in their own row's top ``k`` (``#{u != t : logit_u > logit_t} < k``) and bottom ``k``
(``#{u != t : logit_u < logit_t} < k``).

Computation (never a ``d_vocab²`` matrix): per kv head ``x = W_E[tokens] @ W_V`` (``[n_tokens, d_head]``,
float64); per query head ``W_OU = W_O[h] @ W_U`` (``[d_head, d_vocab]``, float32), then per chunk of
``chunk`` source tokens the float32 logits ``x @ W_OU`` (``[chunk, d_vocab]``). The ranks are those of the
float64 rows: each float32 logit carries a rigorous rounding bound (``γ_n = n u / (1 - n u)`` of the
standard summation analysis, times ``|x| @ |W_O[h]| @ |W_U|``, one more ``d_head``-sized product); the logits
that lie within their bound of the float64 self logit ``logit_t`` are recomputed in float64 and compared
exactly, so a rank never depends on float32 rounding. TF32 is switched off on CUDA while the products run.

The leading singular directions of ``W_V[h] W_O[h]`` (``d_model x d_model``, rank ``<= d_head``) are
computed from the ``d_head``-sized factors (QR of ``W_V`` and ``W_O^T``, SVD of the ``d_head x d_head``
core), SVDInterpreter-style: the tokens whose embeddings the ``i``-th input direction reads most
(``W_E @ read_i``) and whose logits its output direction writes most (``write_i @ W_U``), with the pair's
sign fixed so that the read side's largest-magnitude token score is positive.

Biases (``b_V``, ``b_O``, ``b_U``), positional embeddings and the final norm are left out (Elhage et al.'s
convention, as the copying score of :mod:`.roles`): the result says so in ``summary["convention"]``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import pandas as pd
import torch

from ..core.frozen import frozen
from ..core.heads import ModelInfo, check_weights, combined_fingerprint, read_layer
from ..core.options import check_int, check_seed, strict_kwargs
from ..core.random import layer_generator
from ..core.results import Result
from ..core.selection import head_label, head_labels, select_heads
from ..errors import OptionError, OptionTypeError, UnsupportedModelError
from ..sources.tl import TLModelSource, is_tl_model
from .tokens import special_ids

if TYPE_CHECKING:  # pragma: no cover
    from ..core.hints import IntLike

__all__ = [
    "CONVENTION",
    "HeadTokens",
    "embedding_fingerprint",
    "embedding_matrices",
    "head_tokens",
    "token_ids",
]

#: Stated maximum of ``n_tokens`` (checked before any allocation).
MAX_TOKENS = 1 << 20
#: Logit elements per chunk when ``chunk`` is not given (``chunk = max(1, LOGIT_ELEMS // d_vocab)``).
LOGIT_ELEMS = 1 << 22
#: Leading singular directions kept per head by default.
N_DIRECTIONS = 3
#: What the readout includes, stated in every result.
CONVENTION = (
    "rows of W_E W_V W_O W_U (TransformerLens row form; the kv head's W_V on GQA): no biases, no positional "
    "embedding, no final norm"
)
_U32 = 2.0**-24  # float32 unit roundoff


def _gamma(n: int) -> float:
    return n * _U32 / (1 - n * _U32)


@dataclass(repr=False, eq=False)
class HeadTokens(Result):
    """Result of :func:`head_tokens` (SPEC 12, token readout). Every frame handed out is a copy.

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
    """

    _table: pd.DataFrame
    _ranks: np.ndarray  # [heads, tokens] float64
    _tokens: np.ndarray  # [tokens] int64
    _top: dict[str, pd.DataFrame]
    summary: dict[str, Any]
    info: ModelInfo
    options: dict[str, Any] = field(default_factory=dict)

    repr_keys: ClassVar[tuple[str, ...]] = ("model_name", "n_heads", "n_tokens", "k", "median_self_rank")

    @property
    def table(self) -> pd.DataFrame:
        """The per-head table (a copy)."""
        return self._table.copy()

    @property
    def heads(self) -> pd.DataFrame:
        """:attr:`table` (every result has ``heads``; a copy)."""
        return self._table.copy()

    @property
    def self_ranks(self) -> pd.DataFrame:
        """Every self-rank, ``[heads, tokens]`` (index: labels; columns: token ids; a copy)."""
        return pd.DataFrame(self._ranks.copy(), index=self._table.index.copy(), columns=pd.Index(self._tokens.copy()))

    @property
    def tokens(self) -> np.ndarray:
        """The source token ids measured (a copy)."""
        return self._tokens.copy()

    @property
    def headline(self) -> str:
        """One sentence: what was asked, the answer, the supporting number."""
        return str(self.summary["headline"])

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
        t = self._table.sort_values("self_rank_median", kind="stable")
        cols = ["self_rank_median", "frac_top_k", "frac_bottom_k", "n_tokens"]
        parts = [self.headline, f"({self.summary['convention']})", t[cols].head(n).to_string()]
        if len(t) > n:
            parts.append("...")
            parts.append(t[cols].tail(min(n, len(t) - n)).to_string())
        return "\n".join(parts)

    def __str__(self) -> str:
        return self.to_text()


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


def embedding_fingerprint(W_E: torch.Tensor, W_U: torch.Tensor) -> str:
    """sha256 (hex) of W_E's and W_U's dtype, shape and bytes (C order). Raises nothing of its own."""
    h = hashlib.sha256()
    for name, w in (("W_E", W_E), ("W_U", W_U)):
        w = w.detach()
        h.update(f"{name}:{w.dtype}:{tuple(w.shape)};".encode())
        for s in range(0, w.shape[0], 4096):  # row blocks: no full copy of a transposed or tied matrix
            h.update(w[s : s + 4096].contiguous().view(torch.uint8).cpu().numpy().tobytes())
    return h.hexdigest()


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


def _self_ranks(
    x64: torch.Tensor,
    W_O: torch.Tensor,
    W_U32: torch.Tensor,
    absU32: torch.Tensor,
    U_rows32: torch.Tensor,
    tok: torch.Tensor,
    chunk: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(above, below)`` counts per source token of one head (module docstring), each ``[n_tokens]`` int64.

    ``x64``: ``[n, d_head]`` float64 ``W_E[tokens] @ W_V``; ``W_O``: ``[d_head, d_model]`` (float64);
    ``W_U32``: ``[d_model, d_vocab]`` float32, ``absU32`` its absolute values, ``U_rows32`` its transpose
    ``[d_vocab, d_model]`` (rows: the float64 recount gathers them); ``tok``: ``[n]`` ids.

    The bound: ``|fl(x32 @ fl(W_O32 @ W_U32)) - x @ W_O @ W_U| <= g · (|x| @ |W_O| @ |W_U|)`` elementwise with
    ``g = 2 (γ_{d_head} + γ_{d_model} + 2u)`` (each product's standard bound plus the float32 casts; the factor 2
    covers the rounding of the bound's own float32 product, whose terms are all non-negative).
    """
    d_head, d_model = W_O.shape
    W_O32 = W_O.to(torch.float32)
    WOU = W_O32 @ W_U32  # [d_head, d_vocab]
    A = W_O32.abs() @ absU32  # [d_head, d_vocab]: |W_O| |W_U|
    y64 = x64 @ W_O  # [n, d_model]
    L = (y64 * U_rows32[tok].double()).sum(-1)  # [n] float64 self logits
    g = 2.0 * (_gamma(d_head) + _gamma(d_model) + 2 * _U32)
    above = torch.empty(len(tok), dtype=torch.long, device=x64.device)
    below = torch.empty_like(above)
    for a in range(0, len(tok), chunk):
        sl = slice(a, a + chunk)
        x32 = x64[sl].to(torch.float32)
        logits = x32 @ WOU  # [c, d_vocab] float32
        Lc = L[sl].to(torch.float32).unsqueeze(1)
        diff = logits - Lc
        # |diff - (exact logit - L)| <= b: the products' bound, Lc's rounding and the subtraction's (a row constant
        # bounds |Lc| + |diff|), widened by 1e-6 relative for b's own rounding and a tiny absolute term
        row = (Lc.abs() + diff.abs().amax(1, keepdim=True)) * (2 * _U32) + 1e-30
        b = torch.addmm(row, x32.abs(), A, alpha=g * (1 + 1e-6))
        sure_up = diff > b
        sure_down = diff < -b
        rows = torch.arange(sure_up.shape[0], device=x64.device)
        self_col = tok[sl]
        cand = ~(sure_up | sure_down)
        for m in (sure_up, sure_down, cand):
            m[rows, self_col] = False  # u != t
        up = sure_up.sum(1)
        down = sure_down.sum(1)
        r, u = cand.nonzero(as_tuple=True)
        if len(r):
            exact = (y64[sl][r] * U_rows32[u].double()).sum(-1)  # float64 logits of the close calls
            Lr = L[sl][r]
            up = up.index_add(0, r, (exact > Lr).long())
            down = down.index_add(0, r, (exact < Lr).long())
        above[sl] = up
        below[sl] = down
    return above, below


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
        chunk: source tokens per ``[chunk, d_vocab]`` logit block (default ``max(1, 2^22 // d_vocab)``; memory
            ``~ chunk · d_vocab`` floats plus ``d_head · d_vocab`` per head, never ``d_vocab²``).

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
    chunk = max(1, LOGIT_ELEMS // d_vocab) if chunk is None else check_int(chunk, "chunk", 1, MAX_TOKENS)
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
    return HeadTokens(
        _table=table,
        _ranks=ranks,
        _tokens=tok_ids,
        _top=top,
        summary=frozen(summary),
        info=info,
        options=frozen(options),
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
) -> tuple[pd.DataFrame, np.ndarray, dict[str, pd.DataFrame]]:
    d_vocab = int(W_E.shape[0])
    tok = torch.as_tensor(tok_ids, dtype=torch.long, device=dev)
    W_U32 = W_U.to(dev, torch.float32)
    E_tok64 = W_E[tok.to(W_E.device)].to(dev, torch.float64)  # [n, d_model]
    absU32 = W_U32.abs()
    U_rows32 = W_U32.T.contiguous()  # a view when W_U is W_Eᵀ of a tied model

    tokenizer = getattr(model, "tokenizer", None)
    rows, ranks = [], []
    top: dict[str, pd.DataFrame] = {}
    for lay, hs in sel.items():
        lh = layers[lay]
        V64 = lh.V.to(dev, torch.float64)  # [n_kv, d_model, d_head]
        x_kv: dict[int, torch.Tensor] = {}
        reads, writes, sigmas = [], [], []
        for h in hs:
            kv = int(lh.kv_head_of[h])
            if kv not in x_kv:
                x_kv[kv] = E_tok64 @ V64[kv]
            W_O64 = lh.O[h].to(dev, torch.float64).T  # [d_head, d_model]
            above, below = _self_ranks(x_kv[kv], W_O64, W_U32, absU32, U_rows32, tok, chunk)
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
