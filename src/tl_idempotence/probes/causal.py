"""A causal test of closure: what a head's closure does to the token it attends to, through the whole model (SPEC 13).

For each selected head ``h`` of layer ``l`` the model is run on token windows
(:func:`~tl_idempotence.probes.tokens.prepare_tokens`) clean and with the head's ``z``
(``blocks.{l}.attn.hook_z``, row form ``[batch, pos, n_heads, d_head]``) edited, one variant at a time:

* ``closure_free``: ``z <- z Nᵀ`` with ``T' = O N Vᵀ`` the nearest closure-free version of ``T`` (α' = P' = 0;
  :func:`~tl_idempotence.maths.ov_edits.closure_free_edits`): what the head does without its closure;
* ``closure_only``: ``z <- z Nᵀ`` with ``T_c = O (α M⁻¹) Vᵀ``, ``T_c² = α T_c``, same range and kernel as ``T``
  (:func:`~tl_idempotence.maths.ov_edits.closure_only_edits`): the head reduced to its closure;
* ``zero``: ``z <- 0``; ``mean``: ``z <- z̄``, its mean over every counted position of the run (a first pass).

GQA/MQA: each query head's ``N`` is built with its kv group's ``V``; only that query head's ``z`` is edited.

**Positions.** As :func:`~tl_idempotence.probes.token_effect.attended_token_effect`: at each counted destination
``q`` the source ``s = argmax_{k <= q, k counted} pattern[q, k]`` of the **clean** run (BOS and special tokens
excluded) and its token ``t = tokens[s]``. Every change is **edited - clean** at ``q``:

* ``total``: the change of the final logit of ``t`` (logit units; the model's own logits, every later layer,
  norm and ``b_U`` included); ``total_std``: the same standardized over the vocabulary at ``q``
  (``(Δ_t - mean_u Δ_u) / std_u Δ_u``, population std; NaN when the change is the same for every token);
* ``direct``: the head's own path, ``Δy = (z' - z) W_O[h]`` (float64, ``z`` of the clean run: the layers before
  ``l`` are unchanged), through the final norm **at the clean run's scale** and ``W_U``:
  ``direct = L(Δy / scale_q) · W_U[:, t]``, where ``L`` is the final norm's linear part read from the model's
  own ``ln_final`` with its ``hook_scale`` set to 1 (centring for a LayerNorm, the weight: ``w`` or Gemma's
  ``1 + w``; the bias cancels in a change). Unlike the attended-token effect, which leaves the norm's weight out
  (it is folded into ``W_U`` by ``fold_ln``), the weight is applied here, so that ``direct`` and ``total`` are in
  the same units on raw weights too. ``direct_std``: standardized over the vocabulary as the effect probe does
  (``d_model`` form, ``ū`` and ``C`` of ``L W_U``);
* ``self_repair = direct - total`` (logit units): the part of the head's direct change that does not reach the
  final logit. With a direct change that lowers ``t`` (``direct < 0``), ``self_repair < 0`` means the rest of the
  model gives some of it back (compensation; it also holds the change of the final norm's scale and every
  indirect path through later layers); ``self_repair > 0`` means the total change is larger than the direct
  one (amplification);
* ``loss``: the change of the next-token cross-entropy at ``q`` (nats; target ``tokens[q + 1]``, counted; NaN
  at the last position or before a special token), computed in float64 from the logits.

**Per head and variant** (:attr:`CausalClosure.changes`): the medians of the changes, the mean and median loss
change, and the two-sided sign test of ``total`` over the positions (``scipy.stats.binomtest``, p = 1/2, zeros
dropped), Benjamini-Hochberg q over the heads of each variant. A variant a head has not (a singular ``M``, a
rank-deficient head, ``α = 0``) is NaN with its ``reason``; a variant whose every total change is exactly 0 (a head
whose ``W_O`` is zero; closure-only of an exactly closed head) has p and q NaN and the reason
:data:`~tl_idempotence.probes.causal_tables.NO_CHANGE`, never a best score. ``rel_change`` is
``‖T - T'‖_F / ‖T‖_F`` of the weight edits (1 for ``zero``; NaN for ``mean``, which is no OV edit).

**Passes** (:mod:`~tl_idempotence.probes.causal_passes`): a first pass for the means (with ``mean``), then per batch
of windows a clean pass and every edit batched, ``edits_per_pass`` edits a forward pass sharing the layers before the
first edited one; the numbers are those of one pass per edit to float rounding (``edits_per_pass=1``).

Saved as the token probes are (:meth:`CausalClosure.save`, :func:`load_causal_closure`: parquet tables and one
digested JSON record; the loader recomputes every statistic from the positions).

Refused: a model whose attention output passes through a norm after ``W_O`` (Gemma-2/3: the direct path is not
``z W_O`` there).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import pandas as pd
import torch

from ..core.heads import ModelInfo, combined_fingerprint, read_layer
from ..core.options import check_bool, check_int, strict_kwargs
from ..core.progress import progress_bar
from ..core.selection import head_labels, select_heads
from ..core.stored import StoreSpec, loads, saves
from ..core.tables import FrozenSummary
from ..core.threads import threads_for
from ..errors import OptionError, OptionTypeError, ReportFileError, UnsupportedModelError
from ..maths.closure import closure
from ..maths.ov_edits import closure_free_edits, closure_only_edits
from ..sources.tl import TLModelSource
from .causal_passes import Edit, auto_edits_per_pass, run_passes
from .causal_tables import (
    CHANGE_COLUMNS,
    CONVENTION,
    NO_CHANGE,
    POSITION_COLUMNS,
    TEST,
    VARIANTS,
    changes_frame,
    check_saved,
    headline,
    wide_table,
)
from .head_tokens import embedding_matrices
from .token_records import (
    FREE_MODEL_FIELDS,
    FREE_WINDOW_FIELDS,
    TokenResult,
    check_summary,
    embedding_fingerprint,
    read_probe_save,
    write_probe,
)
from .tokens import corpus_name, prepare_tokens

if TYPE_CHECKING:  # pragma: no cover
    from ..core.hints import HeadsLike, IntLike, PathLike, TextsLike, TLModel

__all__ = [
    "CAUSAL_FORMAT",
    "CAUSAL_RECORD",
    "CAUSAL_STORE",
    "CHANGE_COLUMNS",
    "NO_CHANGE",
    "POSITION_COLUMNS",
    "VARIANTS",
    "CausalClosure",
    "CausalClosureSummary",
    "causal_closure",
    "load_causal_closure",
    "save_causal_closure",
]

#: The record fields of its save that nothing derives or restates, with why (:attr:`StoreSpec.free_fields`).
CAUSAL_FREE_FIELDS = (
    *FREE_MODEL_FIELDS,
    *FREE_WINDOW_FIELDS,
    ("summary.batching", "how the passes were batched: no number depends on it beyond float rounding"),
    ("summary.edits_per_pass", "a performance setting: edits per forward pass"),
    ("summary.check_max_abs_diff", "measured during the run (the batched check copy), recorded once"),
    ("summary.threads", "a performance setting: torch's thread count of the edited passes"),
    ("options.batch_size", "a performance setting: windows per clean pass; no number depends on it"),
    ("options.edits_per_pass", "a performance setting: edits per forward pass, as asked (None: automatic)"),
)
#: How a causal closure is stored (:class:`~tl_idempotence.core.stored.StoreSpec`).
CAUSAL_STORE = StoreSpec(name="causal_closure", formats=("tli-causal-closure-1",), free_fields=CAUSAL_FREE_FIELDS)
CAUSAL_FORMAT = CAUSAL_STORE.format
CAUSAL_RECORD = CAUSAL_STORE.record


class CausalClosureSummary(FrozenSummary):
    """The summary of :class:`CausalClosure` (typed, read-only)."""

    __slots__ = ()
    model_name: str
    model_class: str
    n_heads: int
    n_positions: int
    n_windows: int
    variants: list[str]
    convention: str
    test: str
    final_norm: str
    processing: Mapping[str, Any]
    weights_fingerprint: str
    embedding_fingerprint: str
    batching: str
    edits_per_pass: int
    check_max_abs_diff: float
    threads: int
    headline: str


class CausalClosure(
    TokenResult,
    repr_keys="model_name n_heads n_positions n_windows",
    frozen=("a causal closure test is", "tli.causal_closure again"),
    summary_type=CausalClosureSummary,
):
    """Result of :func:`causal_closure` (SPEC 13; module docstring). Immutable: frames are copies made on each
    read, :attr:`summary` and :attr:`options` are read-only, assigning an attribute raises
    ``dataclasses.FrozenInstanceError``.

    Attributes (properties):
        table: one row per head, indexed by ``"L10H8"``: ``layer, head, kv_head, alpha, P, n_positions`` and, per
            variant ``v``: ``total_{v}, direct_{v}, self_repair_{v}`` (medians, logit units), ``loss_{v}`` (mean
            change, nats), ``p_{v}, q_{v}`` (sign test of the total change, BH q), ``rel_change_{v}``.
        changes: one row per (head, variant): :data:`CHANGE_COLUMNS`.
        positions: one row per (head, variant, window, destination): :data:`POSITION_COLUMNS`.
        summary: :class:`CausalClosureSummary` (``batching``, ``edits_per_pass``: how the passes ran;
            ``check_max_abs_diff``: the batched unedited copy's largest logit difference from the clean pass, NaN
            without a check). info: the model's ModelInfo. options: the run's settings.
        loaded_from: the folder :func:`load_causal_closure` read it from, else None.
    """

    store: ClassVar[StoreSpec] = CAUSAL_STORE

    positions: pd.DataFrame
    changes: pd.DataFrame
    summary: CausalClosureSummary

    def __init__(
        self,
        table: pd.DataFrame,
        changes: pd.DataFrame,
        positions: pd.DataFrame,
        summary: Mapping[str, Any],
        info: ModelInfo,
        options: Mapping[str, Any] | None = None,
        loaded_from: str | None = None,
    ) -> None:
        self._freeze_result(
            table, summary, loaded_from, changes=changes, positions=positions, info=info,
            options=options,
        )  # fmt: skip

    def to_text(self, n: int = 10) -> str:
        """The headline, the convention and the per-head table (``n`` is not used: every head is shown).

        Raises:
            Nothing of its own: ``n`` is accepted for the common ``to_text(n)`` signature and not read.
        """
        return "\n".join([self.headline, f"({self.summary['convention']})", self._table.to_string()])


def _check_variants(variants: Any) -> tuple[str, ...]:
    if isinstance(variants, str):
        variants = (variants,)
    try:
        vs = tuple(variants)
    except TypeError as e:
        raise OptionTypeError(f"variants must be names from {VARIANTS}; got {type(variants).__name__}.") from e
    bad = [v for v in vs if not isinstance(v, str) or v not in VARIANTS]
    if bad or not vs or len(set(vs)) != len(vs):
        raise OptionError(f"variants must be distinct names from {VARIANTS}; got {list(vs)}.")
    return tuple(v for v in VARIANTS if v in vs)


def _norm_map(model: Any, d_model: int, dev: torch.device) -> tuple[torch.Tensor, bool, str]:
    """``(L [d_model, d_model] float64, has a final-norm scale, description)``: the final norm's linear part at unit
    scale, read from the model's ``ln_final`` (module docstring); the identity without a final norm.

    Raises:
        UnsupportedModelError: the norm at a fixed scale is not affine (it moves a test vector off its linear map).
    """
    names = set(getattr(model, "hook_dict", {}) or {})
    eye = torch.eye(d_model, dtype=torch.float64, device=dev)
    if "ln_final.hook_scale" not in names:
        return eye, False, "none"
    p = next(iter(model.parameters()))

    def unit(x: torch.Tensor, hook: Any = None) -> torch.Tensor:
        return torch.ones_like(x)

    x = torch.cat([torch.zeros(1, d_model), torch.eye(d_model)], 0).to(p.device, p.dtype)
    probe = torch.randn(1, d_model, generator=torch.Generator().manual_seed(0)).to(p.device, p.dtype)
    with warnings.catch_warnings(), torch.no_grad(), model.hooks(fwd_hooks=[("ln_final.hook_scale", unit)]):
        warnings.filterwarnings("ignore", message=".*hook_scale.*")
        out = model.ln_final(torch.cat([x, probe], 0)[None])[0].to(dev, torch.float64)
    L = out[1 : d_model + 1] - out[0]
    lin = out[-1] - out[0]
    want = probe.to(dev, torch.float64)[0] @ L
    if not torch.allclose(lin, want, rtol=1e-4, atol=1e-5 * float(lin.abs().max().clamp_min(1e-30))):
        raise UnsupportedModelError(
            "causal_closure: the model's final norm is not affine at a fixed scale (its hook_scale set to 1), so the "
            "direct path through it cannot be read; this model is not supported."
        )
    centred = bool((L.sum(1).abs().max() <= 1e-6 * L.abs().max()).item())
    return (
        L,
        True,
        (
            "LayerNorm (centred), weight applied, / clean hook_scale"
            if centred
            else "weight applied, / clean hook_scale"
        ),
    )


def _means(model: Any, toks: torch.Tensor, counted: torch.Tensor, sel: dict[int, list[int]], bs: int, bar: Any) -> dict:
    """``{layer: [n_heads, d_head] float64}``: ``z`` averaged over every counted position (the mean ablation)."""
    sums: dict[int, torch.Tensor] = {}
    cur: dict[str, torch.Tensor] = {}

    def hook_for(layer: int) -> Any:
        def hook(z: torch.Tensor, hook: Any = None) -> None:
            s = z.detach()[cur["m"].to(z.device)].double().sum(0).cpu()
            sums[layer] = sums.get(layer, 0) + s

        return hook

    device = getattr(model.cfg, "device", None) or "cpu"
    fwd = [(f"blocks.{lay}.attn.hook_z", hook_for(lay)) for lay in sel]
    for start in range(0, len(toks), bs):
        cur["m"] = counted[start : start + bs]
        model.run_with_hooks(toks[start : start + bs].to(device), fwd_hooks=fwd, return_type=None)
        bar.update(1)
    n = float(counted.sum())
    return {lay: s / n for lay, s in sums.items()}


@strict_kwargs
def causal_closure(
    model: TLModel,
    heads: HeadsLike | Iterable[str] | None = None,
    texts: TextsLike | None = None,
    *,
    variants: str | Sequence[str] = VARIANTS,
    seq_len: IntLike = 128,
    max_tokens: IntLike | None = 2048,
    batch_size: IntLike = 8,
    edits_per_pass: IntLike | None = None,
    text_column: str = "text",
    progress: bool = True,
) -> CausalClosure:
    """Edit each head's OV (closure removed, closure only, zero, mean) and measure the change of the attended token's
    final logit, its direct part, self-repair and the loss (SPEC 13; module docstring).

    Args:
        model: a TransformerLens model (HookedTransformer or TransformerBridge; causal), with ``W_E``/``W_U`` and no
            norm after ``W_O``.
        heads: ``None`` (every head), ``(layer, head)`` pairs, ``"L10H8"`` labels or a DataFrame with
            ``layer``/``head`` columns.
        texts: as :func:`~tl_idempotence.probes.token_effect.attended_token_effect`.
        variants: names from :data:`VARIANTS` (a string or a sequence).
        seq_len: as the attended-token effect.
        max_tokens: as the attended-token effect.
        text_column: as the attended-token effect.
        batch_size: windows per clean pass (and per pass of the means).
        edits_per_pass: edits batched into one forward pass of a window (None: as many as
            :data:`~tl_idempotence.probes.causal_passes.LOGITS_BUDGET` logits allow, at most 64; 1: one forward pass
            per edit and window, the unbatched path). Numbers do not depend on it beyond float rounding.
        progress: show a progress bar (forward passes).

    Returns:
        :class:`CausalClosure`.

    Cost: per edit, the layers from its own on and the unembedding, on every window (the layers before it shared by
    the edits of a pass); SmolLM2's 26 heads x 4 variants on 634 tokens: about 200 CPU-s on one thread, ~0.37 CPU-s per
    edit and window of 128 tokens (README's cost table).

    Raises:
        UnsupportedModelError: not a TransformerLens model, no ``W_E``/``W_U``, a norm after ``W_O``, a final norm
            that is not affine at a fixed scale.
        WeightError: NaN/inf weights. OptionTypeError / OptionError: unknown heads or variants, bad text or counts.
        RuntimeError: the model's output depends on the batch (module :mod:`~tl_idempotence.probes.causal_passes`).
    """
    W_E, W_U = embedding_matrices(model, "causal_closure")
    src = TLModelSource(model)
    info = src.info
    if info.extra.get("post_attention_norm"):
        raise UnsupportedModelError(
            f"causal_closure: this model's attention output passes through a norm after W_O "
            f"({info.extra['post_attention_norm']}), so a head's direct path is not z W_O; not supported yet."
        )
    sel = select_heads(heads, list(src.layers()), info.n_heads, labels=True)
    vs = _check_variants(variants)
    seq_len = check_int(seq_len, "seq_len", 2, 1 << 24)
    max_tokens = None if max_tokens is None else check_int(max_tokens, "max_tokens", 1)
    batch_size = check_int(batch_size, "batch_size", 1, 1 << 20)
    per_pass_asked = None if edits_per_pass is None else check_int(edits_per_pass, "edits_per_pass", 1, 1 << 16)
    progress = check_bool(progress, "progress")
    toks, counted = prepare_tokens(model, texts, seq_len=seq_len, max_tokens=max_tokens, text_column=text_column)
    if not bool(counted.any()):
        raise OptionError("texts: every position is a special token (BOS/EOS/PAD/...): there is nothing to measure.")
    layers = {lay: read_layer(src, lay, info) for lay in sel}
    dev = W_U.device
    with torch.no_grad():
        L, has_scale, norm_text = _norm_map(model, info.d_model, dev)
        U = L @ W_U.to(dev, torch.float64)
        W_O = {lay: lh.O.to(dev, torch.float64).transpose(-1, -2) for lay, lh in layers.items()}
        plan, rows = _plan(layers, sel, vs)
        per_pass = per_pass_asked or auto_edits_per_pass(len(plan), int(toks.shape[1]), int(W_U.shape[1]))
        recs, run_info = _measure(
            model, toks, counted, plan, vs, sel, W_O, U, has_scale, batch_size, per_pass, progress
        )
    options = {
        "seq_len": seq_len, "max_tokens": max_tokens, "batch_size": batch_size, "edits_per_pass": per_pass_asked,
        "variants": list(vs), "corpus": corpus_name(texts),
    }  # fmt: skip
    return _assemble(recs, rows, layers, vs, info, toks, W_E, W_U, norm_text, run_info, options)


def _plan(layers: dict, sel: dict[int, list[int]], vs: tuple[str, ...]) -> tuple[list[Edit], list[dict[str, Any]]]:
    """The edits to run (``"mean"`` values filled later) and one row per (head, variant): its α, P, the edit's
    ``rel_change`` and ``reason`` ("" where it runs)."""
    edits = {}
    for lay, lh in layers.items():
        if "closure_free" in vs:
            edits[(lay, "closure_free")] = closure_free_edits(lh, sel[lay])
        if "closure_only" in vs:
            edits[(lay, "closure_only")] = closure_only_edits(lh, sel[lay])
    plan, rows = [], []
    for lay, hs in sel.items():
        c = closure(layers[lay], factors=False)
        for h in hs:
            for v in vs:
                reason, rel, value, kind = "", float("nan"), None, v
                if v in ("closure_free", "closure_only"):
                    e = edits[(lay, v)]
                    reason, rel, value, kind = str(e.reason[h]), float(e.rel_change[h]), e.N[h], "map"
                elif v == "zero":
                    rel = 1.0
                rows.append({"layer": lay, "head": h, "variant": v, "rel_change": rel, "reason": reason,
                             "alpha": float(c.alpha[h]), "P": float(c.P[h])})  # fmt: skip
                if not reason:
                    plan.append(Edit(lay, h, v, kind, value))
    return plan, rows


def _measure(
    model: Any, toks: torch.Tensor, counted: torch.Tensor, plan: list[Edit], vs: tuple[str, ...],
    sel: dict[int, list[int]], W_O: dict, U: torch.Tensor, has_scale: bool, batch_size: int, per_pass: int,
    progress: bool,
) -> tuple[dict, dict[str, Any]]:  # fmt: skip
    """The passes (the means first, with ``mean``), in eval mode, on the thread count the clean passes' size takes."""
    from .causal_passes import chunk_edits

    if not plan:
        info = {"batching": "no edit ran", "edits_per_pass": per_pass, "check_max_abs_diff": float("nan")}
        return {}, {**info, "threads": torch.get_num_threads()}
    n_b = math.ceil(len(toks) / batch_size)
    steps = n_b * (1 + ("mean" in vs)) + len(toks) * len(chunk_edits(plan, per_pass))
    macs = _clean_macs(model, int(toks.shape[1]), batch_size)
    was_training = bool(getattr(model, "training", False))
    model.eval()
    try:
        with (
            progress_bar(total=steps, desc="causal closure (forward passes)", enabled=progress) as bar,
            threads_for(macs),
        ):
            if "mean" in vs:
                means = _means(model, toks, counted, sel, batch_size, bar)
                plan = [Edit(e.layer, e.head, e.variant, e.kind, means[e.layer][e.head]) if e.kind == "mean" else e
                        for e in plan]  # fmt: skip
            return run_passes(model, toks, counted, plan, W_O, U, has_scale, batch_size, per_pass, bar)
    finally:
        if was_training:
            model.train()


def _clean_macs(model: Any, seq_len: int, batch_size: int) -> int:
    from .ablation.schedule import layer_cost

    block, unembed = layer_cost(model.cfg)
    return int(batch_size * seq_len * (int(model.cfg.n_layers) * block + unembed))


def _assemble(
    recs: dict, rows: list[dict], layers: dict, vs: tuple[str, ...], info: ModelInfo, toks: torch.Tensor,
    W_E: torch.Tensor, W_U: torch.Tensor, norm_text: str, run_info: Mapping[str, Any], options: dict,
) -> CausalClosure:  # fmt: skip
    """The result's frames and summary from the passes' records."""
    frames = []
    for key, r in recs.items():
        pos = pd.DataFrame({k: np.concatenate(x) for k, x in r.items()})
        for col in ("window", "pos", "source_pos", "token"):
            pos[col] = pos[col].astype(np.int64)
        pos.insert(0, "variant", key[2])
        pos.insert(0, "label", f"L{key[0]}H{key[1]}")
        frames.append(pos)
    order = {(f"L{r['layer']}H{r['head']}", r["variant"]): i for i, r in enumerate(rows)}
    positions = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=list(POSITION_COLUMNS))
    positions = positions.loc[:, list(POSITION_COLUMNS)]
    if len(positions):  # the rows' order (head, variant), then window and position
        rank = [order[(lab, v)] for lab, v in zip(positions["label"], positions["variant"], strict=True)]
        positions = positions.iloc[np.lexsort((positions["pos"], positions["window"], rank))].reset_index(drop=True)
    edits = pd.DataFrame([
        {"label": f"L{r['layer']}H{r['head']}", "layer": r["layer"], "head": r["head"],
         "kv_head": int(layers[r["layer"]].kv_head_of[r["head"]]), "variant": r["variant"],
         "rel_change": r["rel_change"], "reason": r["reason"]}
        for r in rows
    ])  # fmt: skip
    ch = changes_frame(edits, positions)
    base = pd.DataFrame(rows).drop_duplicates(["layer", "head"]).loc[:, ["layer", "head", "alpha", "P"]]
    base.insert(2, "kv_head", [int(layers[a].kv_head_of[b]) for a, b in zip(base["layer"], base["head"], strict=True)])
    base.index = head_labels(base["layer"], base["head"])
    table = wide_table(base, ch, vs)
    summary = {
        "model_name": info.model_name,
        "model_class": info.model_class,
        "n_heads": len(table),
        "n_positions": int(table["n_positions"].max()) if len(table) else 0,
        "n_windows": len(toks),
        "variants": list(vs),
        "convention": CONVENTION,
        "test": TEST,
        "final_norm": norm_text,
        "processing": dict(info.processing),
        "weights_fingerprint": combined_fingerprint([(lay, lh.fingerprint()) for lay, lh in layers.items()]),
        "embedding_fingerprint": embedding_fingerprint(W_E, W_U),
        **run_info,
        "headline": headline(ch),
    }
    return CausalClosure(table=table, changes=ch, positions=positions, summary=summary, info=info, options=options)


@saves("causal_closure")
@strict_kwargs
def save_causal_closure(result: CausalClosure, path: PathLike, overwrite: bool = False) -> str:
    """Save a causal closure test to the folder ``path``: ``table.parquet``, ``changes.parquet``,
    ``positions.parquet`` and ``causal_closure.json`` (summary, options, info, the sha256 of each table and the
    record's digest; no pickle), through the one store.

    Raises:
        OptionTypeError: ``result`` is not a :class:`CausalClosure`; every other error as
            :meth:`StoredResult.save <tl_idempotence.core.stored.StoredResult.save>`.
    """
    if not isinstance(result, CausalClosure):
        raise OptionTypeError(
            f"save_causal_closure saves a CausalClosure (tli.causal_closure); got {type(result).__name__}."
        )
    return write_probe("causal_closure", path, CAUSAL_FORMAT, CAUSAL_RECORD, closure_tables(result), result, overwrite)


def closure_tables(result: CausalClosure) -> dict[str, pd.DataFrame]:
    """The tables a causal closure save holds (``table`` with ``layer``/``head`` as columns, not the index)."""
    return {"table": result._table, "changes": result.changes, "positions": result.positions}


@loads("causal_closure")
def load_causal_closure(path: PathLike) -> CausalClosure:
    """Read back what :func:`save_causal_closure` wrote, checking every digest and recomputing from the positions the
    changes (medians, loss means, sign tests, BH q, the no-change reason), the per-head table and the summary's
    ``n_heads``, ``n_positions``, ``variants`` and ``headline``.

    Raises:
        MissingFileError: no such folder, no ``causal_closure.json``, a listed table missing (names it).
        ReportFileError: another format; an edited record (digest) or table (sha256), each named; a column, number or
            summary field that is not what the positions give (names the file and the field).
        OptionTypeError: ``path`` is not a path.
    """
    names = frozenset({"table", "changes", "positions"})
    save = read_probe_save(path, CAUSAL_FORMAT, CAUSAL_RECORD, names, (), "tli.causal_closure", {})
    d, rec, fields, info, edited = save.folder, save.record, save.fields, save.info, save.edited
    files = {n: save.file(n) for n in names}
    table, changes, positions = save.tables["table"], save.tables["changes"], save.tables["positions"]
    try:
        summary = CausalClosureSummary(fields["summary"])
        variants = _check_variants(fields["options"].get("variants"))
    except (TypeError, ValueError, OptionError) as e:
        raise ReportFileError(f"{rec}: a malformed summary or options ({type(e).__name__}: {e}).") from e
    if list(variants) != list(fields["options"]["variants"]) or summary.get("variants") != list(variants):
        raise edited(rec, "summary['variants'] and options['variants'] are not the same variants in order")
    for col in ("window", "pos", "source_pos", "token"):
        if len(positions):
            positions[col] = np.asarray(positions[col], dtype=np.int64)
    head = check_saved(table, changes, positions, variants, files)
    fresh = {
        "n_heads": len(table),
        "n_positions": int(table["n_positions"].max()) if len(table) else 0,
        "convention": CONVENTION,
        "test": TEST,
        "headline": head,
    }
    check_summary(summary, fresh, rec, "tli.causal_closure")
    if isinstance(summary.get("n_windows"), bool) or not isinstance(summary.get("n_windows"), int):
        raise edited(rec, "summary['n_windows'] is not a count")
    if len(positions) and int(positions["window"].max()) >= summary["n_windows"]:
        raise edited(rec, f"summary['n_windows'] {summary['n_windows']} is fewer than the windows of the positions")
    return CausalClosure(
        table=table, changes=changes, positions=positions, summary=summary, info=info, options=fields["options"],
        loaded_from=str(d),
    )  # fmt: skip
