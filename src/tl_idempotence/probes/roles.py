"""What heads do: TransformerLens's attention roles and the OV circuit's copying score, per query head (SPEC 11).

* ``previous_token``, ``duplicate_token``, ``induction``: TransformerLens's ``head_detector`` scores — a head's
  attention mass on a detection pattern (``get_*_head_detection_pattern`` and
  ``compute_head_attention_similarity_score`` with ``error_measure="mul"``, ``exclude_bos=True``) — on
  ``n_sequences`` seeded sequences ``BOS x x`` (``x``: ``repeat_len`` random non-special token ids), averaged
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

import dataclasses
import math
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import pandas as pd
import torch

from ..core.heads import ModelInfo, check_weights, kv_layout
from ..core.kwargs import warn_at_caller
from ..core.options import check_bool, check_int, check_seed, strict_kwargs
from ..core.outputs import check_save_target
from ..core.progress import progress_bar
from ..core.random import layer_generator
from ..core.records import index_column, json_like, read_tables_record, same_value, write_tables_record
from ..core.selection import head_label, head_labels
from ..core.store import saved_folder
from ..core.stored import StoredResult, StoreSpec, loads, saves
from ..core.tables import FrozenSummary, ModelResult
from ..errors import OptionError, ReportFileError, UnsupportedModelError, WeightError
from ..sources.tl import TLModelSource, is_tl_model
from ..views.results import DrawnResult
from .tokens import special_ids

if TYPE_CHECKING:  # pragma: no cover
    from ..core.hints import IntLike, TLModel

__all__ = [
    "ATTENTION_ROLES",
    "COPYING_NAN_REASON",
    "ROLES",
    "HeadRoles",
    "HeadRolesSummary",
    "copying_scores",
    "eigen_floor",
    "head_roles",
    "role_scores",
]

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
#: Stated maxima of ``repeat_len`` and ``n_sequences`` (checked before any allocation).
MAX_REPEAT_LEN = 1 << 14
MAX_SEQUENCES = 1 << 12


class HeadRolesSummary(FrozenSummary):
    """The summary of :class:`HeadRoles` (typed, read-only; a mapping of the fields given): what the attention
    roles ran on, the copying score's definition, the weights' processing and fingerprints, the median of each role.
    A field not given reads as None."""

    __slots__ = ()
    model_name: str | None
    model_class: str | None
    n_heads: int | None
    n_tokens: int | None
    n_sequences: int | None
    seed: int | None
    sequence: str | None
    exclude_bos: bool | None
    error_measure: str | None
    copying: str | None
    processing: Mapping[str, Any] | None
    layer_fingerprints: Mapping[str, str] | None
    median_previous_token: float | None
    median_duplicate_token: float | None
    median_induction: float | None
    median_copying: float | None


#: The record fields of its save that nothing derives or restates, with why (:attr:`StoreSpec.free_fields`).
HEAD_ROLES_FREE_FIELDS = (
    ("info.d_model", "the model's width, recorded once (identity checks compare it with a model)"),
    ("info.d_head", "the model's head size, recorded once (identity checks compare it with a model)"),
    ("summary.layer_fingerprints", "the weights' sha256 per layer, recorded once (joins compare them)"),
)
#: How head roles are stored (:class:`~tl_idempotence.core.stored.StoreSpec`): their record file (a role
#: association's too, :data:`ROLES_RECORD`) and format (:data:`HEAD_ROLES_FORMAT`).
HEAD_ROLES_STORE = StoreSpec(
    name="head_roles", record="roles.json", formats=("tl_idempotence.head_roles/1",), free_fields=HEAD_ROLES_FREE_FIELDS
)


class HeadRoles(
    StoredResult,
    ModelResult,
    DrawnResult,
    repr_keys="model_name n_heads n_tokens n_sequences seed",
    frozen=("head roles are", "compute them again"),
    summary_type=HeadRolesSummary,
):
    """Result of :func:`head_roles`. Immutable, like the report: :attr:`table` is a copy made on each read (editing
    it leaves the result as it is), :attr:`summary` (a typed :class:`HeadRolesSummary`) and :attr:`options` are
    read-only, and assigning an attribute raises
    ``dataclasses.FrozenInstanceError``.

    Attributes:
        table: one row per query head, indexed by TransformerLens labels (``"L10H8"``, like ``rep.heads``):
            ``layer, head, kv_head``, ``previous_token``, ``duplicate_token``, ``induction`` (TransformerLens's
            detector scores in [0, 1]), ``copying`` (in [-1, 1]; +1: the OV circuit copies tokens, -1:
            suppresses them; NaN with ``reason`` for a head whose OV circuit is zero).
        summary: ``model_name, model_class, n_heads, n_tokens, n_sequences, seed, sequence`` (what the
            attention roles ran on), ``exclude_bos``, ``error_measure``, ``copying`` (what the score is),
            ``processing`` (the weights' processing, as a report records it), ``layer_fingerprints``
            (``{"layer": sha256}`` of each layer's O and V as the scores were computed,
            :meth:`~tl_idempotence.core.heads.LayerHeads.fingerprint`: what ``rep.roles(roles=...)`` and
            ``rep.circuit(roles=...)`` compare with the report's), ``median_*`` per role.
        info: the model's :class:`~tl_idempotence.core.heads.ModelInfo`.
        options: ``n_tokens, n_sequences, seed`` (``n_tokens``: the length of ``x`` in ``BOS x x``, the
            ``repeat_len`` of :func:`head_roles`, under the record's name since 0.3.0; :attr:`repeat_len`).
        loaded_from: the folder :func:`~tl_idempotence.report.roles.load_roles` read it from (``save_roles``
            refuses to write there); None for a computed result.
    """

    store: ClassVar[StoreSpec] = HEAD_ROLES_STORE

    settable: ClassVar[frozenset[str]] = frozenset({"loaded_from"})  # set once by load_roles, never a number

    summary: HeadRolesSummary

    def __init__(
        self,
        table: pd.DataFrame,
        summary: Mapping[str, Any],
        info: ModelInfo,
        options: Mapping[str, Any] | None = None,
        loaded_from: str | None = None,
    ) -> None:
        self._freeze_result(table, summary, loaded_from, info=info, options=options)

    @property
    def repeat_len(self) -> int | None:
        """The length of ``x`` in each ``BOS x x`` sequence the attention roles ran on (:func:`head_roles`'
        ``repeat_len``; recorded as ``n_tokens`` in :attr:`options` and :attr:`summary`, the field saved roles hold
        since 0.3.0), or None when the options record none."""
        v = self.options.get("n_tokens")
        return None if v is None else int(v)

    @property
    def layer_fingerprints(self) -> dict[int, str] | None:
        """``{layer: sha256}`` of the attention weights the scores were computed from (``summary``'s
        ``layer_fingerprints`` with integer keys), or None when the summary records none."""
        fps = self.summary.get("layer_fingerprints")
        if not isinstance(fps, Mapping):
            return None
        try:
            return {int(k): str(v) for k, v in fps.items()}
        except (TypeError, ValueError):
            return None


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


def _check_vocab(W_E: torch.Tensor, W_U: torch.Tensor) -> None:
    """Refuse embeddings whose full OV circuit is not square or not finite (the copying score's eigenvalues).

    Raises:
        UnsupportedModelError: ``W_E`` ``[d_vocab, d_model]`` and ``W_U`` ``[d_model, d_vocab_out]`` of other
            vocabularies or widths (names both sizes).
        WeightError: non-float or NaN/inf ``W_E`` or ``W_U`` (names the token row or column).
    """
    if W_E.ndim != 2 or W_U.ndim != 2 or W_E.shape[1] != W_U.shape[0] or W_E.shape[0] != W_U.shape[1]:
        raise UnsupportedModelError(
            f"The copying score needs the full OV circuit W_E W_V W_O W_U to be square (the unembedding reads "
            f"the embedding's vocabulary): this model's W_E is {tuple(W_E.shape)} (d_vocab = "
            f"{W_E.shape[0] if W_E.ndim else '?'}) and W_U {tuple(W_U.shape)} (d_vocab_out = "
            f"{W_U.shape[-1] if W_U.ndim else '?'}). Its eigenvalues are undefined for d_vocab != d_vocab_out; "
            "head_roles cannot score this model."
        )
    check_weights(W_E.unsqueeze(-1), "W_E (the token embedding)", "token")  # [d_vocab, d_model, 1]: names the row
    check_weights(W_U.transpose(0, 1).unsqueeze(-1), "W_U (the unembedding)", "token")  # names the column


#: Why a copying score is NaN (its ``reason``).
COPYING_NAN_REASON = (
    "the full OV circuit has no nonzero eigenvalue beyond float rounding (Σ|λ| <= √(d_head u) ‖W_O W_U W_E W_V‖_F: a "
    "zero W_O, a zero W_V of its kv group, W_U = 0, or a nilpotent head)"
)


def eigen_floor(A: torch.Tensor) -> torch.Tensor:
    """``√(n u) ‖A‖_F`` per ``[..., n, n]`` matrix (float64 ``u = 2^-53``): below it, a spectrum's ``Σ|λ|`` is not
    told from float rounding (a defective, e.g. nilpotent, matrix's computed eigenvalues are of order
    ``√(u) ‖A‖``, not 0), so a copying score ``Re Σλ / Σ|λ|`` is NaN there. Raises nothing."""
    n = int(A.shape[-1])
    return math.sqrt(n * 2.0**-53) * torch.linalg.matrix_norm(A)


def copying_scores(model: Any) -> tuple[pd.DataFrame, ModelInfo, dict[str, str]]:
    """The copying score of every query head (module docstring): ``Re Σλ / Σ|λ|`` of ``W_E W_V W_O W_U``.

    Returns:
        ``(table, info, layer_fingerprints)``: ``table`` has ``layer, head, kv_head, copying, reason`` (one row
        per query head in layer, head order; ``reason`` says why a score is NaN: no eigenvalue beyond float rounding,
        :func:`eigen_floor`), ``info`` the model's ModelInfo,
        ``layer_fingerprints`` ``{"layer": sha256}`` of each layer's O and V as they were read
        (:meth:`~tl_idempotence.core.heads.LayerHeads.fingerprint`, the key a report records).

    Raises:
        UnsupportedModelError: not a TransformerLens model, no ``W_E``/``W_U``, or ``d_vocab != d_vocab_out``
            (names both).
        WeightError: NaN/inf in a layer's W_O or W_V (names layer and head, as ``idempotence_report``), in
            ``W_E`` or ``W_U``; a non-float dtype.
    """
    return _copying_scores(model, None)


def _copying_scores(model: Any, step: Callable[[], Any] | None) -> tuple[pd.DataFrame, ModelInfo, dict[str, str]]:
    """:func:`copying_scores`, calling ``step()`` after each layer (a progress bar's update; None: nothing)."""
    _check_model(model)
    from transformer_lens import FactoredMatrix

    src = TLModelSource(model)
    with torch.no_grad():
        W_E = model.W_E.detach()
        W_U = model.W_U.detach()
        _check_vocab(W_E, W_U)
        M = torch.zeros(W_U.shape[0], W_E.shape[1], dtype=torch.float64, device=W_E.device)
        for s in range(0, W_E.shape[0], VOCAB_CHUNK):  # W_U W_E [d_model, d_model], never d_vocab x d_vocab
            M += W_U[:, s : s + VOCAB_CHUNK].double() @ W_E[s : s + VOCAB_CHUNK].double()
        rows = []
        fingerprints: dict[str, str] = {}
        for lh in src:
            lh.check_finite()  # WeightError naming layer and head (the eigenvalues of NaN raise torch's error)
            fingerprints[str(lh.layer)] = lh.fingerprint()
            V = lh.V.double()[lh.kv_head_of.to(lh.V.device)]  # [n_heads, d_model, d_head]: model.OV's expansion
            W_O = lh.O.double().transpose(-1, -2)  # [n_heads, d_head, d_model]
            WOM = W_O @ M.to(V.device)  # [n_heads, d_head, d_model]
            lam = FactoredMatrix(V, WOM).eigenvalues  # [n_heads, d_head] complex
            num = lam.real.sum(-1).cpu().numpy()
            den = lam.abs().sum(-1).cpu().numpy()
            floor = eigen_floor(WOM @ V).cpu().numpy()  # the d_head x d_head product's rounding floor
            for h in range(len(num)):
                ok = bool(den[h] > floor[h]) and math.isfinite(float(den[h]))
                rows.append(
                    {
                        "layer": lh.layer,
                        "head": h,
                        "kv_head": int(lh.kv_head_of[h]),
                        "copying": float(num[h] / den[h]) if ok else float("nan"),
                        "reason": "" if ok else COPYING_NAN_REASON,
                    }
                )
            if step is not None:
                step()
    return pd.DataFrame(rows), src.info, fingerprints


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
    return _role_scores(model, tokens, layers, None)


def _role_scores(
    model: Any, tokens: torch.Tensor, layers: list[int] | None, step: Callable[[], Any] | None
) -> dict[str, np.ndarray]:
    """:func:`role_scores`, calling ``step()`` after each layer's patterns of each forward pass are scored."""
    if not is_tl_model(model):
        raise UnsupportedModelError(f"role_scores runs a TransformerLens model; got {type(model).__name__}.")
    from transformer_lens import head_detector as hd

    layers = list(TLModelSource(model).layers()) if layers is None else layers
    n_heads = int(model.cfg.n_heads)
    row_of = {layer: i for i, layer in enumerate(layers)}
    out = {r: np.zeros((len(layers), n_heads)) for r in ATTENTION_ROLES}
    chunk = _sequences_per_pass(model, tokens)
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
                if step is not None:
                    step()

            return hook

        with torch.no_grad():
            model.run_with_hooks(
                part.to(device),
                fwd_hooks=[(f"blocks.{layer}.attn.hook_pattern", make(layer)) for layer in layers],
                return_type=None,
            )
    return {r: v / tokens.shape[0] for r, v in out.items()}


def _sequences_per_pass(model: Any, tokens: torch.Tensor) -> int:
    """How many sequences of ``tokens`` one forward pass of :func:`role_scores` runs (its patterns' size bound,
    :data:`PATTERN_ELEMS`)."""
    L = int(tokens.shape[1])
    return max(1, PATTERN_ELEMS // (int(model.cfg.n_heads) * L * L))


def repeated_random_tokens(
    model: Any, n_tokens: int, n_sequences: int, seed: int, name: str = "repeat_len"
) -> tuple[torch.Tensor, Any]:
    """``[n_sequences, 1 + 2 n_tokens]`` sequences ``BOS x x`` (``x``: ``n_tokens`` random non-special ids, seeded),
    and the BOS id used (the tokenizer's ``bos_token_id``; ``None``: position 0 is a random id, still left out).
    ``name``: the keyword the length was given as (the error names it).

    Raises:
        OptionError: the sequence does not fit the context (``1 + 2 n_tokens >= n_ctx``), or no non-special id.
    """
    n_ctx = int(getattr(model.cfg, "n_ctx", 0) or 0)
    length = 1 + 2 * n_tokens
    if n_ctx and length >= n_ctx:
        raise OptionError(
            f"{name}={n_tokens} makes sequences of 1 + 2·{n_tokens} = {length} tokens, which do not fit the model's "
            f"context (TransformerLens's detector needs fewer than n_ctx = {n_ctx}); "
            f"use {name} <= {(n_ctx - 2) // 2}."
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
def head_roles(
    model: TLModel,
    repeat_len: IntLike = 24,
    n_sequences: IntLike = 8,
    seed: IntLike = 0,
    n_tokens: IntLike | None = None,
    *,
    progress: bool = True,
) -> HeadRoles:
    """What each head does (SPEC 11): TransformerLens's attention-role scores and the OV circuit's copying score.

    Args:
        model: a TransformerLens model (HookedTransformer or TransformerBridge; GQA/MQA: one row per query head).
        repeat_len: the length of the random block ``x`` of each ``BOS x x`` sequence (2 .. MAX_REPEAT_LEN = 16384;
            ``1 + 2 repeat_len`` must be below ``n_ctx``). The result records it as ``n_tokens`` in its
            ``options`` and ``summary`` (the field of saved roles since 0.3.0) and as :attr:`HeadRoles.repeat_len`.
        n_sequences: how many seeded sequences the attention scores average over (1 .. MAX_SEQUENCES = 4096).
        seed: the seed of the random tokens.
        n_tokens: the deprecated name of ``repeat_len`` (a ``DeprecationWarning``; its errors name it):
            ``n_tokens`` is the token readout's sample of source tokens (:func:`~tl_idempotence.probes.head_tokens.
            head_tokens`, ``rep.mechanism``).
        progress: one tqdm bar on stderr (as the report's) over the layers, twice: each layer's copying score,
            then each layer's detector scores in each forward pass. About 3 CPU-s with the defaults on
            SmolLM2-135M (30 layers, one forward pass), half each.

    Returns:
        :class:`HeadRoles`; ``.table`` ``[n_layers · n_heads rows]``, indexed by ``"L10H8"`` labels.

    Raises:
        UnsupportedModelError: not a TransformerLens model, no ``W_E``/``W_U``, or an unembedding of another
            vocabulary (``d_vocab_out != d_vocab``: names both sizes).
        WeightError: NaN/inf attention weights (names layer and head, as ``idempotence_report``), or NaN/inf
            ``W_E``/``W_U``; checked before the model is run.
        OptionTypeError / OptionError: ``repeat_len``, ``n_sequences`` or ``seed`` of the wrong type or range,
            sequences that do not fit the context, or both ``repeat_len`` (other than its default) and ``n_tokens``;
            ``progress`` not a bool.
    """
    name = "repeat_len"
    if n_tokens is not None:
        if not (isinstance(repeat_len, int) and not isinstance(repeat_len, bool) and repeat_len == 24):
            raise OptionError(
                "head_roles takes repeat_len (the length of x in each BOS x x sequence); n_tokens is its deprecated "
                "name: give repeat_len only."
            )
        warn_at_caller(
            "head_roles(n_tokens=...) is deprecated: use repeat_len=..., the length of x in each BOS x x sequence "
            "(n_tokens is the token readout's sample of source tokens, tli.head_tokens and rep.mechanism).",
            DeprecationWarning,
        )
        repeat_len, name = n_tokens, "n_tokens"
    _check_model(model)
    length = check_int(repeat_len, name, 2, MAX_REPEAT_LEN)
    n_sequences = check_int(n_sequences, "n_sequences", 1, MAX_SEQUENCES)
    seed = check_seed(seed)
    progress = check_bool(progress, "progress")
    tokens, bos = repeated_random_tokens(model, length, n_sequences, seed, name)
    n_layers = len(list(TLModelSource(model).layers()))
    n_passes = -(-n_sequences // _sequences_per_pass(model, tokens))  # each scores every layer once
    desc = "head roles (each layer's copying score, then its detector scores; ~0.05 CPU-s/layer on SmolLM2)"
    with progress_bar(desc=desc, total=n_layers * (1 + n_passes), unit="layer", enabled=progress) as bar:
        table, info, fingerprints = _copying_scores(model, bar.update)
        layers = sorted(set(table["layer"].tolist()))
        scores = _role_scores(model, tokens, layers, bar.update)
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
        "n_tokens": length,  # the record's field since 0.3.0: the repeat length (HeadRoles.repeat_len)
        "n_sequences": n_sequences,
        "seed": seed,
        "sequence": f"BOS x x, x = {length} random non-special token ids (BOS id {bos})",
        **FIXED_SUMMARY,
        "processing": dict(info.processing),
        "layer_fingerprints": fingerprints,
    }
    for role in ROLES:
        v = table[role].to_numpy(dtype=float)
        summary[f"median_{role}"] = float(np.nanmedian(v)) if np.isfinite(v).any() else float("nan")
    options = {"n_tokens": length, "n_sequences": n_sequences, "seed": seed}
    return HeadRoles(table=table, summary=summary, info=info, options=options)


# ----------------------------------------------------------------------------- save and load (no pickle)

#: The head-roles summary fields that state how the scores are defined (the same for every result).
FIXED_SUMMARY = {
    "exclude_bos": True,
    "error_measure": "mul",
    "copying": "Re Σλ / Σ|λ| of W_E W_V W_O W_U (eigenvalues via FactoredMatrix, d_head x d_head; no biases, no "
    "final norm)",
}
#: What a roles save refused for a file name says to use instead.
ROLES_HINT = "; for a page use rep.save_html(path, roles=...), for a table or JSON rep.export(path) (the CLI's --roles)"
#: The record file of a saved roles result and its two formats.
ROLES_RECORD = HEAD_ROLES_STORE.record
HEAD_ROLES_FORMAT = HEAD_ROLES_STORE.format
ASSOCIATION_FORMAT = "tl_idempotence.role_association/1"
#: The columns of a head-roles table, in order.
ROLE_TABLE_COLUMNS = ("layer", "head", "kv_head", *ROLES, "reason")
#: The record fields (at any depth) that hold floats: only these read "NaN"/"Infinity" back as floats, so a text
#: field that reads "NaN" (a model name, a note) stays text (:func:`~tl_idempotence.core.records.read_tables_record`).
ROLES_FLOAT_KEYS = frozenset({*(f"median_{r}" for r in ROLES), "threshold", "p_floor"})


def check_roles_record(
    rec: Any,
    f: Any,
    df: pd.DataFrame,
    L: np.ndarray,
    H: np.ndarray,
    info: ModelInfo,
    summary: dict[str, Any],
    options: dict[str, Any],
    error: type[Exception] = ReportFileError,
    edited: str = "the record or the table was edited",
) -> None:
    """A saved head-roles record must agree with itself: every measured layer has each of ``info.n_heads`` heads
    once, ``kv_head`` is the kv map of the info's sizes (:func:`~tl_idempotence.core.heads.kv_layout`: head roles
    run TransformerLens models, which use it), the summary's ``model_name``, ``model_class`` and ``processing`` are
    the info's, and its ``n_tokens``, ``n_sequences``, ``seed`` are the options' (``n_tokens`` also the one its
    ``sequence`` states).

    :func:`save_roles` runs the same check (``error=OptionError``): it never writes what :func:`load_roles` refuses.

    Raises:
        ReportFileError (``error``): names the file and the field or column (the first head that disagrees, ``L3H2``).
    """
    if len(df):
        per_layer = pd.Series(H).groupby(L).nunique()
        short = per_layer[per_layer != info.n_heads]
        if len(short):
            raise error(
                f"{f}: layer {int(short.index[0])} has {int(short.iloc[0])} heads, but the record's info.n_heads is "
                f"{info.n_heads} (every head of each measured layer is scored): {edited}."
            )
        K = index_column(df, "kv_head", Path(str(f)))
        try:
            want = kv_layout(info.n_heads, info.n_kv_heads).numpy()[H]
        except WeightError as e:
            raise error(f"{rec}: field info.n_kv_heads: {e}") from e
        bad = want != K
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise error(
                f"{f}: column 'kv_head' disagrees with the kv map of info.n_heads={info.n_heads}, "
                f"info.n_kv_heads={info.n_kv_heads} (tl_idempotence.kv_layout) at {head_label(L[i], H[i])} (first of "
                f"{int(bad.sum())}): {edited}."
            )
    for k in ("model_name", "model_class", "processing"):
        if k in summary and not same_value(json_like(summary[k]), json_like(getattr(info, k))):
            raise error(f"{rec}: summary[{k!r}] is {summary[k]!r} but info.{k} is {getattr(info, k)!r}: {edited}.")
    for k in ("n_tokens", "n_sequences", "seed"):
        if summary.get(k) != options.get(k) or type(summary.get(k)) is not type(options.get(k)):
            raise error(
                f"{rec}: summary[{k!r}] is {summary.get(k)!r} but options[{k!r}] is {options.get(k)!r}: {edited}."
            )
    if len(df) and sorted(set(L.tolist())) != list(range(info.n_layers)):
        raise error(
            f"{rec}: info.n_layers is {info.n_layers} but the table scores layers {sorted(set(L.tolist()))[:8]} "
            f"(head roles score every layer): {edited}."
        )
    for k, v in FIXED_SUMMARY.items():
        if k in summary and summary[k] != v:
            raise error(f"{rec}: summary[{k!r}] is {summary[k]!r}, not what tli.head_roles states: {edited}.")
    seq = summary.get("sequence")
    pattern = rf"BOS x x, x = {summary.get('n_tokens')} random non-special token ids \(BOS id ([0-9]+|None)\)"
    if ("sequence" in summary or "n_tokens" in summary) and not (isinstance(seq, str) and re.fullmatch(pattern, seq)):
        raise error(
            f"{rec}: summary['sequence'] ({seq!r}) does not state n_tokens={summary.get('n_tokens')!r}: {edited}."
        )


def restore_head_roles(where: Path, df: pd.DataFrame, fields: dict[str, Any]) -> HeadRoles:
    """A HeadRoles from its saved table and record, refusing a table that does not fit the record (names it)."""
    f = where / "roles.parquet"
    if tuple(df.columns) != ROLE_TABLE_COLUMNS:
        raise ReportFileError(f"{f} has columns {list(df.columns)}, not a head-roles table {list(ROLE_TABLE_COLUMNS)}.")
    try:
        info = ModelInfo(**fields["info"])
        summary = dict(fields["summary"])
        options = dict(fields["options"])
        L = index_column(df, "layer", f)
        H = index_column(df, "head", f)
    except (KeyError, TypeError, ValueError) as e:
        raise ReportFileError(f"{where / ROLES_RECORD}: a malformed record or table ({type(e).__name__}: {e}).") from e
    outside = len(df) > 0 and (H.max() >= info.n_heads or L.max() >= info.n_layers or min(H.min(), L.min()) < 0)
    if len(set(zip(L.tolist(), H.tolist()))) != len(df) or outside:
        raise ReportFileError(
            f"{f}: heads that repeat or that the record's model does not have (its sizes: {info.n_layers} layers of "
            f"{info.n_heads} heads)."
        )
    check_roles_record(where / ROLES_RECORD, f, df, L, H, info, summary, options)
    recomputed: dict[str, Any] = {"n_heads": len(df)}
    for role in ROLES:
        v = df[role].to_numpy(dtype=float)
        recomputed[f"median_{role}"] = float(np.nanmedian(v)) if np.isfinite(v).any() else float("nan")
    for k, v in recomputed.items():
        if not same_value(summary.get(k), v):
            raise ReportFileError(
                f"{where / ROLES_RECORD}: summary[{k!r}] is {summary.get(k)!r} but {v!r} from {f}: the record or the "
                "table was edited. Save the roles again from the model."
            )
    table = df.copy()
    table.index = head_labels(L, H)
    return HeadRoles(table=table, summary=summary, info=info, options=options)


def head_roles_fields(roles: HeadRoles) -> dict[str, Any]:
    """The record fields of a head-roles save (``summary``, ``options``, ``info``), checked as the loader checks them
    (:func:`check_roles_record`, ``OptionError``: never written what :func:`load_head_roles` refuses).

    Raises:
        OptionError: the result does not agree with itself (names the field).
    """
    t = roles._table
    check_roles_record(
        "the HeadRoles", "its table", t, t["layer"].to_numpy(dtype=np.int64), t["head"].to_numpy(dtype=np.int64),
        roles.info, dict(roles.summary), dict(roles.options), OptionError, "it would not load; nothing was written",
    )  # fmt: skip
    info = {f.name: getattr(roles.info, f.name) for f in dataclasses.fields(roles.info)}
    return {"summary": roles.summary, "options": roles.options, "info": info}


#: What a roles folder of either format holds (an overwrite replaces a save of either with one of either).
ROLES_REPLACES = {
    HEAD_ROLES_FORMAT: frozenset({"roles"}),
    ASSOCIATION_FORMAT: frozenset({"roles", "table", "association"}),
}


@saves("head_roles")
def _save_head_roles(result: HeadRoles, path: Any, overwrite: bool) -> str:
    """:meth:`HeadRoles.save`: a folder of parquet tables and one JSON record ``roles.json`` with their sha256s (no
    pickle; THE store: :func:`~tl_idempotence.core.records.write_tables_record`); :meth:`HeadRoles.load` (or
    ``tli.load_roles``) reads it back and refuses an edited file by name.

    Raises:
        OptionTypeError: ``path`` not a path; ``overwrite`` not a bool. OutputOverInputError (an ``OptionError``):
            the folder it was loaded from. OptionError: a file name (``.html``, ``.json``, ...); as
            :func:`~tl_idempotence.core.store.write_folder` (a non-empty folder, a missing parent, an earlier save of
            another kind; names it).
    """
    check_save_target(path, "save_roles", "roles", result.loaded_from, ROLES_HINT)
    tables = {"roles": result._table.loc[:, list(ROLE_TABLE_COLUMNS)]}
    fields = head_roles_fields(result)
    d = write_tables_record(path, HEAD_ROLES_FORMAT, ROLES_RECORD, tables, fields, overwrite, replaces=ROLES_REPLACES)
    return str(d)


@loads("head_roles")
def load_head_roles(path: Any) -> HeadRoles:
    """Read back a :class:`HeadRoles` saved by :meth:`HeadRoles.save` (or ``save_roles``), every digest checked and
    the record checked against its table (:func:`restore_head_roles`).

    Raises:
        MissingFileError: no such folder, no ``roles.json``, a listed table missing. ReportFileError: another format
            (a role association: ``tli.load_roles`` reads both), an edited record or table (names it).
        OptionTypeError: ``path`` is not a path.
    """
    fields, tables = read_tables_record(path, ROLES_RECORD, (HEAD_ROLES_FORMAT,), ROLES_FLOAT_KEYS)
    d = saved_folder(Path(path).expanduser(), ROLES_RECORD)
    if set(tables) != {"roles"}:
        raise ReportFileError(f"{d / ROLES_RECORD} lists tables {sorted(tables)}; a {HEAD_ROLES_FORMAT} has ['roles'].")
    roles = restore_head_roles(d, tables["roles"], fields)
    roles.loaded_from = str(d)  # its save refuses to write over the folder it was read from
    return roles
