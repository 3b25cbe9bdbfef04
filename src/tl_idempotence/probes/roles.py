"""What heads do: TransformerLens's attention roles and the OV circuit's copying score, per query head (SPEC 11).

* ``previous_token``, ``duplicate_token``, ``induction``: TransformerLens's ``head_detector`` scores — a head's
  attention mass on a detection pattern (``get_*_head_detection_pattern`` and
  ``compute_head_attention_similarity_score`` with ``error_measure="mul"``, ``exclude_bos=True``) — on
  ``n_sequences`` seeded sequences ``BOS x x`` (``x``: ``n_tokens`` random non-special token ids), averaged
  over the sequences as ``detect_head`` averages a list of prompts. The patterns come from the
  ``blocks.{l}.attn.hook_pattern`` hooks (``[batch, n_heads, query, key]``, per query head on GQA), the same on
  HookedTransformer and TransformerBridge.
* ``copying`` (Elhage et al. 2021): ``Re Σλ / Σ|λ|`` over the eigenvalues λ of the full OV circuit
  ``W_E W_V W_O W_U`` (TransformerLens row form, ``d_vocab x d_vocab``; the kv head's ``W_V`` on GQA/MQA, as
  ``model.OV`` expands it). Its nonzero eigenvalues are those of the ``d_head x d_head`` product
  ``W_O (W_U W_E) W_V`` (TransformerLens's ``FactoredMatrix(W_V, W_O @ W_U W_E).eigenvalues``): the
  ``d_model x d_model`` matrix ``W_U W_E`` is accumulated once over vocabulary chunks, in float64, and no
  ``d_vocab²`` matrix is formed. Biases and the final norm are not part of the circuit (Elhage's convention);
  the weights are the model's as they are, their processing stated in ``summary["processing"]``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import pandas as pd
import torch

from ..core.heads import ModelInfo
from ..core.options import check_int, check_seed, strict_kwargs
from ..core.random import layer_generator
from ..core.results import Result
from ..core.selection import head_labels
from ..errors import OptionError, UnsupportedModelError
from ..sources.tl import TLModelSource, is_tl_model
from .tokens import special_ids

if TYPE_CHECKING:  # pragma: no cover
    from ..core.hints import IntLike

__all__ = ["ATTENTION_ROLES", "ROLES", "HeadRoles", "copying_scores", "head_roles", "role_scores"]

#: The attention roles: column name -> TransformerLens's detection pattern name.
ATTENTION_ROLES = {
    "previous_token": "previous_token_head",
    "duplicate_token": "duplicate_token_head",
    "induction": "induction_head",
}
#: Every role column of :attr:`HeadRoles.table`, in order.
ROLES = (*ATTENTION_ROLES, "copying")
#: Vocabulary rows per chunk when accumulating ``W_U W_E`` (bounds the float64 copies to ~chunk x d_model).
VOCAB_CHUNK = 8192
#: Attention-pattern elements per forward pass (``sequences · n_heads · pos²``; at least one sequence a pass).
PATTERN_ELEMS = 1 << 24
#: Stated maxima of ``n_tokens`` and ``n_sequences`` (checked before any allocation).
MAX_TOKENS = 1 << 14
MAX_SEQUENCES = 1 << 12


@dataclass(repr=False, eq=False)
class HeadRoles(Result):
    """Result of :func:`head_roles`.

    Attributes:
        table: one row per query head, indexed by TransformerLens labels (``"L10H8"``, like ``rep.heads``):
            ``layer, head, kv_head``, ``previous_token``, ``duplicate_token``, ``induction`` (TransformerLens's
            detector scores in [0, 1]), ``copying`` (in [-1, 1]; +1: the OV circuit copies tokens, -1:
            suppresses them; NaN with ``reason`` for a head whose OV circuit is zero).
        summary: ``model_name, model_class, n_heads, n_tokens, n_sequences, seed, sequence`` (what the
            attention roles ran on), ``exclude_bos``, ``error_measure``, ``copying`` (what the score is),
            ``processing`` (the weights' processing, as a report records it), ``median_*`` per role.
        info: the model's :class:`~tl_idempotence.core.heads.ModelInfo`.
    """

    table: pd.DataFrame
    summary: dict[str, Any]
    info: ModelInfo
    options: dict[str, Any] = field(default_factory=dict)
    #: The folder :func:`~tl_idempotence.report.roles.load_roles` read it from (``save_roles`` refuses to write there).
    loaded_from: str | None = field(default=None, repr=False, compare=False)

    repr_keys: ClassVar[tuple[str, ...]] = ("model_name", "n_heads", "n_tokens", "n_sequences", "seed")

    @property
    def heads(self) -> pd.DataFrame:
        """:attr:`table` (every result has ``heads``)."""
        return self.table


def _check_model(model: Any) -> None:
    if not is_tl_model(model):
        raise UnsupportedModelError(
            f"head_roles runs a TransformerLens model (HookedTransformer or TransformerBridge); got "
            f"{type(model).__name__}. A HeadSource, a checkpoint path or a transformers model gives weights only, "
            "not a model TransformerLens can run: load one (tli.models.load(name) for a zoo model, "
            "TransformerBridge.boot_transformers(folder) for a checkpoint folder) and pass it."
        )
    for name in ("W_E", "W_U"):
        try:
            getattr(model, name)
        except Exception as e:  # any failure means the model has no such matrix
            raise UnsupportedModelError(
                f"head_roles needs the model's embedding and unembedding (model.W_E, model.W_U) for the copying "
                f"score; {type(model).__name__} has no {name} ({type(e).__name__})."
            ) from e


def copying_scores(model: Any) -> tuple[pd.DataFrame, ModelInfo]:
    """The copying score of every query head (module docstring): ``Re Σλ / Σ|λ|`` of ``W_E W_V W_O W_U``.

    Returns:
        ``(table, info)``: ``table`` has ``layer, head, kv_head, copying, reason`` (one row per query head in
        layer, head order; ``reason`` says why a score is NaN), ``info`` the model's ModelInfo.

    Raises:
        UnsupportedModelError: not a TransformerLens model, or no ``W_E``/``W_U``.
    """
    _check_model(model)
    from transformer_lens import FactoredMatrix

    src = TLModelSource(model)
    with torch.no_grad():
        W_E = model.W_E.detach()
        W_U = model.W_U.detach()
        M = torch.zeros(W_U.shape[0], W_E.shape[1], dtype=torch.float64, device=W_E.device)
        for s in range(0, W_E.shape[0], VOCAB_CHUNK):  # W_U W_E [d_model, d_model], never d_vocab x d_vocab
            M += W_U[:, s : s + VOCAB_CHUNK].double() @ W_E[s : s + VOCAB_CHUNK].double()
        rows = []
        for lh in src:
            V = lh.V.double()[lh.kv_head_of.to(lh.V.device)]  # [n_heads, d_model, d_head]: model.OV's expansion
            W_O = lh.O.double().transpose(-1, -2)  # [n_heads, d_head, d_model]
            lam = FactoredMatrix(V, W_O @ M.to(V.device)).eigenvalues  # [n_heads, d_head] complex
            num = lam.real.sum(-1).cpu().numpy()
            den = lam.abs().sum(-1).cpu().numpy()
            for h in range(len(num)):
                ok = bool(den[h] > 0) and math.isfinite(float(den[h]))
                rows.append(
                    {
                        "layer": lh.layer,
                        "head": h,
                        "kv_head": int(lh.kv_head_of[h]),
                        "copying": float(num[h] / den[h]) if ok else float("nan"),
                        "reason": "" if ok else "the full OV circuit has no nonzero eigenvalue (Σ|λ| = 0)",
                    }
                )
    return pd.DataFrame(rows), src.info


def role_scores(model: Any, tokens: torch.Tensor, layers: list[int] | None = None) -> dict[str, np.ndarray]:
    """TransformerLens's detector scores of every head on ``tokens`` (module docstring), averaged over the batch.

    Args:
        model: a TransformerLens model.
        tokens: ``[batch, pos]`` token ids (position 0 is the BOS that ``exclude_bos`` leaves out).
        layers: the attention layers (default: all).

    Returns:
        ``{role: [n_layers_listed, n_heads] float64}`` for the roles of :data:`ATTENTION_ROLES`.

    Raises:
        UnsupportedModelError: not a TransformerLens model.
    """
    if not is_tl_model(model):
        raise UnsupportedModelError(f"role_scores runs a TransformerLens model; got {type(model).__name__}.")
    from transformer_lens import head_detector as hd

    layers = list(TLModelSource(model).layers()) if layers is None else layers
    n_heads = int(model.cfg.n_heads)
    row_of = {layer: i for i, layer in enumerate(layers)}
    out = {r: np.zeros((len(layers), n_heads)) for r in ATTENTION_ROLES}
    L = int(tokens.shape[1])
    chunk = max(1, PATTERN_ELEMS // (n_heads * L * L))  # sequences per forward pass
    device = getattr(model.cfg, "device", None) or "cpu"
    for start in range(0, tokens.shape[0], chunk):
        part = tokens[start : start + chunk].cpu()
        pattern_of = {r: getattr(hd, f"get_{name}_detection_pattern") for r, name in ATTENTION_ROLES.items()}
        dets = [{r: f(part[b : b + 1]).double() for r, f in pattern_of.items()} for b in range(part.shape[0])]

        def make(layer: int, dets: list[dict[str, torch.Tensor]] = dets) -> Any:
            def hook(p: torch.Tensor, hook: Any = None) -> None:  # scored here: no layer's pattern is kept
                i = row_of[layer]
                pat = p.detach()
                for b, det in enumerate(dets):
                    for h in range(n_heads):
                        ph = pat[b, h].double().cpu()
                        for role, d in det.items():
                            out[role][i, h] += hd.compute_head_attention_similarity_score(
                                ph, detection_pattern=d, exclude_bos=True, exclude_current_token=False,
                                error_measure="mul",
                            )  # fmt: skip

            return hook

        with torch.no_grad():
            model.run_with_hooks(
                part.to(device),
                fwd_hooks=[(f"blocks.{layer}.attn.hook_pattern", make(layer)) for layer in layers],
                return_type=None,
            )
    return {r: v / tokens.shape[0] for r, v in out.items()}


def repeated_random_tokens(model: Any, n_tokens: int, n_sequences: int, seed: int) -> tuple[torch.Tensor, Any]:
    """``[n_sequences, 1 + 2 n_tokens]`` sequences ``BOS x x`` (``x`` random non-special ids, seeded), and the BOS
    id used (the tokenizer's ``bos_token_id``; ``None``: position 0 is a random id, still left out).

    Raises:
        OptionError: the sequence does not fit the context (``1 + 2 n_tokens >= n_ctx``), or no non-special id.
    """
    n_ctx = int(getattr(model.cfg, "n_ctx", 0) or 0)
    length = 1 + 2 * n_tokens
    if n_ctx and length >= n_ctx:
        raise OptionError(
            f"n_tokens={n_tokens} makes sequences of 1 + 2·{n_tokens} = {length} tokens, which do not fit the model's "
            f"context (TransformerLens's detector needs fewer than n_ctx = {n_ctx}); "
            f"use n_tokens <= {(n_ctx - 2) // 2}."
        )
    d_vocab = int(model.cfg.d_vocab)
    tok = getattr(model, "tokenizer", None)
    specials = special_ids(tok) if tok is not None else set()
    allowed = torch.tensor([i for i in range(d_vocab) if i not in specials], dtype=torch.long)
    if not len(allowed):
        raise OptionError("The model's vocabulary has no non-special token to draw repeated sequences from.")
    g = layer_generator(seed, None, "roles")
    x = allowed[torch.randint(len(allowed), (n_sequences, n_tokens), generator=g)]
    bos = getattr(tok, "bos_token_id", None) if tok is not None else None
    if isinstance(bos, int) and 0 <= bos < d_vocab:
        first = torch.full((n_sequences, 1), bos, dtype=torch.long)
    else:
        bos = None
        first = allowed[torch.randint(len(allowed), (n_sequences, 1), generator=g)]
    return torch.cat([first, x, x], 1), bos


@strict_kwargs
def head_roles(model: Any, n_tokens: IntLike = 24, n_sequences: IntLike = 8, seed: IntLike = 0) -> HeadRoles:
    """What each head does (SPEC 11): TransformerLens's attention-role scores and the OV circuit's copying score.

    Args:
        model: a TransformerLens model (HookedTransformer or TransformerBridge; GQA/MQA: one row per query head).
        n_tokens: the length of the random block ``x`` of each ``BOS x x`` sequence (2 .. MAX_TOKENS = 16384;
            ``1 + 2 n_tokens`` must be below ``n_ctx``).
        n_sequences: how many seeded sequences the attention scores average over (1 .. MAX_SEQUENCES = 4096).
        seed: the seed of the random tokens.

    Returns:
        :class:`HeadRoles`; ``.table`` ``[n_layers · n_heads rows]``, indexed by ``"L10H8"`` labels.

    Raises:
        UnsupportedModelError: not a TransformerLens model, or no ``W_E``/``W_U``.
        OptionTypeError / OptionError: ``n_tokens``, ``n_sequences`` or ``seed`` of the wrong type or range, or
            sequences that do not fit the context.
    """
    _check_model(model)
    n_tokens = check_int(n_tokens, "n_tokens", 2, MAX_TOKENS)
    n_sequences = check_int(n_sequences, "n_sequences", 1, MAX_SEQUENCES)
    seed = check_seed(seed)
    tokens, bos = repeated_random_tokens(model, n_tokens, n_sequences, seed)
    table, info = copying_scores(model)
    layers = sorted(set(table["layer"].tolist()))
    scores = role_scores(model, tokens, layers)
    L = table["layer"].to_numpy()
    H = table["head"].to_numpy()
    row_of = {layer: i for i, layer in enumerate(layers)}
    idx = np.array([row_of[int(v)] for v in L])
    for i, role in enumerate(ATTENTION_ROLES):
        table.insert(3 + i, role, scores[role][idx, H])  # after layer, head, kv_head; before copying
    table.index = head_labels(L, H)
    summary: dict[str, Any] = {
        "model_name": info.model_name,
        "model_class": info.model_class,
        "n_heads": len(table),
        "n_tokens": n_tokens,
        "n_sequences": n_sequences,
        "seed": seed,
        "sequence": f"BOS x x, x = {n_tokens} random non-special token ids (BOS id {bos})",
        "exclude_bos": True,
        "error_measure": "mul",
        "copying": "Re Σλ / Σ|λ| of W_E W_V W_O W_U (eigenvalues via FactoredMatrix, d_head x d_head; no biases, no "
        "final norm)",
        "processing": dict(info.processing),
    }
    for role in ROLES:
        v = table[role].to_numpy(dtype=float)
        summary[f"median_{role}"] = float(np.nanmedian(v)) if np.isfinite(v).any() else float("nan")
    options = {"n_tokens": n_tokens, "n_sequences": n_sequences, "seed": seed}
    return HeadRoles(table=table, summary=summary, info=info, options=options)
