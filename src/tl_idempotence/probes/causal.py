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
dropped; NaN when every change is 0), Benjamini-Hochberg q over the heads of each variant. A variant a head has
not (a singular ``M``, a rank-deficient head, ``α = 0``) is NaN with its ``reason``. ``rel_change`` is
``‖T - T'‖_F / ‖T‖_F`` of the weight edits (1 for ``zero``; NaN for ``mean``, which is no OV edit).

Refused: a model whose attention output passes through a norm after ``W_O`` (Gemma-2/3: the direct path is not
``z W_O`` there).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import pandas as pd
import torch

from ..core.heads import ModelInfo, combined_fingerprint, read_layer
from ..core.options import check_bool, check_int, strict_kwargs
from ..core.progress import progress_bar
from ..core.selection import head_labels, select_heads
from ..core.tables import FrozenSummary, ModelResult
from ..errors import OptionError, OptionTypeError, UnsupportedModelError
from ..maths.closure import closure
from ..maths.ov_edits import closure_free_edits, closure_only_edits
from ..sources.tl import TLModelSource
from ..views.results import DrawnResult
from .head_tokens import embedding_matrices
from .token_records import embedding_fingerprint
from .tokens import corpus_name, prepare_tokens

if TYPE_CHECKING:  # pragma: no cover
    from ..core.hints import IntLike

__all__ = ["CHANGE_COLUMNS", "POSITION_COLUMNS", "VARIANTS", "CausalClosure", "CausalClosureSummary", "causal_closure"]

#: The variants, in the order they run.
VARIANTS = ("closure_free", "closure_only", "zero", "mean")

CONVENTION = (
    "edited - clean at each counted destination; token = the clean run's most-attended counted source; total = "
    "final-logit change; direct = (z' - z) W_O through the final norm at the clean scale (weight applied) and W_U; "
    "self_repair = direct - total; loss = next-token cross-entropy change (nats)"
)
TEST = "two-sided sign test of the total change over positions (scipy binomtest), BH q over heads per variant"

POSITION_COLUMNS = (
    "label", "variant", "window", "pos", "source_pos", "token", "total", "total_std", "direct", "direct_std",
    "self_repair", "loss",
)  # fmt: skip
CHANGE_COLUMNS = (
    "label", "layer", "head", "kv_head", "variant", "rel_change", "n_positions", "total_median", "total_std_median",
    "direct_median", "direct_std_median", "self_repair_median", "loss_change_mean", "loss_change_median", "n_loss",
    "n_pos_total", "n_neg_total", "p_value", "q_value", "reason",
)  # fmt: skip
#: The per-variant columns of :attr:`CausalClosure.table` (``{column}_{variant}``) and where each comes from.
_WIDE = {
    "total": "total_median", "direct": "direct_median", "self_repair": "self_repair_median", "loss": "loss_change_mean",
    "p": "p_value", "q": "q_value", "rel_change": "rel_change",
}  # fmt: skip


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
    headline: str


class CausalClosure(ModelResult, DrawnResult):
    """Result of :func:`causal_closure` (SPEC 13; module docstring). Immutable: frames are copies made on each
    read, :attr:`summary` and :attr:`options` are read-only, assigning an attribute raises
    ``dataclasses.FrozenInstanceError``. Not saved (no ``save``).

    Attributes (properties):
        table: one row per head, indexed by ``"L10H8"``: ``layer, head, kv_head, alpha, P, n_positions`` and, per
            variant ``v``: ``total_{v}, direct_{v}, self_repair_{v}`` (medians, logit units), ``loss_{v}`` (mean
            change, nats), ``p_{v}, q_{v}`` (sign test of the total change, BH q), ``rel_change_{v}``.
        changes: one row per (head, variant): :data:`CHANGE_COLUMNS`.
        positions: one row per (head, variant, window, destination): :data:`POSITION_COLUMNS`.
        summary: :class:`CausalClosureSummary`. info: the model's ModelInfo. options: the run's settings.
    """

    repr_keys: ClassVar[tuple[str, ...]] = ("model_name", "n_heads", "n_positions", "n_windows")
    frozen_name: ClassVar[str] = "a causal closure test is"
    frozen_hint: ClassVar[str] = "tli.causal_closure again"
    summary_type: ClassVar[type[FrozenSummary]] = CausalClosureSummary

    _positions: pd.DataFrame
    _changes: pd.DataFrame
    summary: CausalClosureSummary

    def __init__(
        self,
        table: pd.DataFrame,
        changes: pd.DataFrame,
        positions: pd.DataFrame,
        summary: Mapping[str, Any],
        info: ModelInfo,
        options: Mapping[str, Any] | None = None,
    ) -> None:
        self._freeze_result(
            table, summary, None, _changes=changes.copy(), _positions=positions.copy(), info=info, options=options
        )

    @property
    def changes(self) -> pd.DataFrame:
        """One row per (head, variant) (a copy)."""
        return self._changes.copy()

    @property
    def positions(self) -> pd.DataFrame:
        """One row per (head, variant, window, destination position) (a copy)."""
        return self._positions.copy()

    @property
    def headline(self) -> str:
        """One sentence per variant: how many heads' edits lower or raise the attended token's final logit."""
        return str(self.summary["headline"])

    def __str__(self) -> str:
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


def _edit_hook(h: int, kind: str, value: torch.Tensor | None) -> Any:
    """``hook_z`` edit of head ``h``: ``z Nᵀ`` (``kind="map"``, ``value = N``), 0, or the mean ``value``."""

    def hook(z: torch.Tensor, hook: Any = None) -> torch.Tensor:
        z = z.clone()
        if kind == "map":
            assert value is not None
            z[:, :, h] = z[:, :, h] @ value.to(z.device, z.dtype).T
        elif kind == "zero":
            z[:, :, h] = 0.0
        else:
            assert value is not None
            z[:, :, h] = value.to(z.device, z.dtype)
        return z

    return hook


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


def _ce(logits: torch.Tensor, batch: torch.Tensor, cnt: torch.Tensor) -> torch.Tensor:
    """``[B, P]`` float64 next-token cross-entropy at each position (NaN without a counted next token)."""
    lp = torch.log_softmax(logits.double(), -1)
    out = torch.full(batch.shape, float("nan"), dtype=torch.float64, device=logits.device)
    ce = -lp[:, :-1].gather(-1, batch[:, 1:, None].to(logits.device))[..., 0]
    out[:, :-1] = torch.where(cnt[:, 1:].to(logits.device), ce, torch.full_like(ce, float("nan")))
    return out


def _standardize(raw: torch.Tensor, mean: torch.Tensor, sq: torch.Tensor) -> torch.Tensor:
    std = (sq - mean**2).clamp_min(0).sqrt()
    ok = std > 1e-12 * (sq.abs().sqrt() + 1e-300)
    return torch.where(
        ok, (raw - mean) / torch.where(ok, std, torch.ones_like(std)), torch.full_like(raw, float("nan"))
    )


def _run(
    model: Any, toks: torch.Tensor, counted: torch.Tensor, plan: list[tuple[Any, ...]],
    W_O: dict[int, torch.Tensor], U: torch.Tensor, has_scale: bool, bs: int, bar: Any,
) -> dict[tuple[int, int, str], dict[str, list[np.ndarray]]]:  # fmt: skip
    """Every batch: a clean pass (z, pattern, scale, logits), then one pass per planned (layer, head, variant)."""
    dev = U.device
    u_bar = U.mean(1)
    C = (U @ U.T) / U.shape[1]
    layers = sorted({p[0] for p in plan})
    store: dict[str, torch.Tensor] = {}

    def keep(name: str) -> Any:
        def hook(x: torch.Tensor, hook: Any = None) -> None:
            store[name] = x.detach()

        return hook

    names = [f"blocks.{lay}.attn.hook_{w}" for lay in layers for w in ("z", "pattern")]
    names += ["ln_final.hook_scale"] if has_scale else []
    fwd = [(n, keep(n)) for n in names]
    recs: dict[tuple[int, int, str], dict[str, list[np.ndarray]]] = {(p[0], p[1], p[2]): {} for p in plan}
    device = getattr(model.cfg, "device", None) or "cpu"
    for start in range(0, len(toks), bs):
        batch = toks[start : start + bs].to(device)
        cnt = counted[start : start + bs].to(dev)
        store.clear()
        clean = model.run_with_hooks(batch, fwd_hooks=fwd, return_type="logits").detach().to(dev, torch.float64)
        ce0 = _ce(clean, batch, cnt)
        P = batch.shape[1]
        elig = torch.ones(P, P, dtype=torch.bool, device=dev).tril().unsqueeze(0) & cnt.unsqueeze(1)
        b_idx, q_idx = (cnt & elig.any(-1)).nonzero(as_tuple=True)
        scale = (
            store["ln_final.hook_scale"].to(dev, torch.float64)[b_idx, q_idx, 0]
            if has_scale
            else torch.ones(len(b_idx), dtype=torch.float64, device=dev)
        )
        tb = batch.to(dev)
        for lay, h, variant, kind, value in plan:
            z = store[f"blocks.{lay}.attn.hook_z"][b_idx, q_idx, h].to(dev, torch.float64)  # [n, d_head]
            pat = store[f"blocks.{lay}.attn.hook_pattern"][b_idx, h, q_idx].to(dev, torch.float64)  # [n, k]
            src = torch.where(elig[b_idx, q_idx], pat, torch.full_like(pat, -1.0)).argmax(-1)
            t = tb[b_idx, src]
            hooks = [(f"blocks.{lay}.attn.hook_z", _edit_hook(h, kind, value))]
            edited = model.run_with_hooks(batch, fwd_hooks=hooks, return_type="logits").detach().to(dev, torch.float64)
            bar.update(1)
            delta = (edited - clean)[b_idx, q_idx]  # [n, d_vocab]
            total = delta.gather(1, t[:, None])[:, 0]
            total_std = _standardize(total, delta.mean(1), (delta**2).mean(1))
            if kind == "map":
                z_new = z @ value.to(dev, torch.float64).T
            elif kind == "zero":
                z_new = torch.zeros_like(z)
            else:
                z_new = value.to(dev, torch.float64).expand_as(z)
            y = ((z_new - z) @ W_O[lay][h]) / scale[:, None]  # [n, d_model], before the norm's linear part
            direct = (y * U[:, t].T).sum(-1)
            mean = y @ u_bar
            direct_std = _standardize(direct, mean, (y @ C * y).sum(-1))
            loss = (_ce(edited, batch, cnt) - ce0)[b_idx, q_idx]
            r = recs[(lay, h, variant)]
            for key, val in (
                ("window", b_idx + start), ("pos", q_idx), ("source_pos", src), ("token", t), ("total", total),
                ("total_std", total_std), ("direct", direct), ("direct_std", direct_std),
                ("self_repair", direct - total), ("loss", loss),
            ):  # fmt: skip
                r.setdefault(key, []).append(val.cpu().numpy())
    return recs


def _sign_test(x: np.ndarray) -> tuple[int, int, float]:
    from scipy.stats import binomtest

    pos, neg = int((x > 0).sum()), int((x < 0).sum())
    if pos + neg == 0:
        return pos, neg, float("nan")
    return pos, neg, float(binomtest(pos, pos + neg, 0.5).pvalue)


def _med(x: np.ndarray) -> float:
    x = x[np.isfinite(x)]
    return float(np.median(x)) if x.size else float("nan")


def _change_row(pos: pd.DataFrame) -> dict[str, Any]:
    tot = pos["total"].to_numpy(dtype=float)
    loss = pos["loss"].to_numpy(dtype=float)
    npos, nneg, p = _sign_test(tot[np.isfinite(tot)])
    fin = loss[np.isfinite(loss)]
    return {
        "n_positions": len(pos), "total_median": _med(tot), "total_std_median": _med(pos["total_std"].to_numpy()),
        "direct_median": _med(pos["direct"].to_numpy()), "direct_std_median": _med(pos["direct_std"].to_numpy()),
        "self_repair_median": _med(pos["self_repair"].to_numpy()),
        "loss_change_mean": float(fin.mean()) if fin.size else float("nan"), "loss_change_median": _med(fin),
        "n_loss": int(fin.size),
        "n_pos_total": npos, "n_neg_total": nneg, "p_value": p,
    }  # fmt: skip


def _q_values(changes: pd.DataFrame) -> np.ndarray:
    from scipy.stats import false_discovery_control

    q = np.full(len(changes), np.nan)
    for _, idx in changes.groupby("variant", sort=False).indices.items():
        p = changes["p_value"].to_numpy(dtype=float)[idx]
        fin = np.isfinite(p)
        if fin.any():
            q[idx[fin]] = false_discovery_control(p[fin], method="bh")
    return q


def _headline(changes: pd.DataFrame) -> str:
    parts = []
    for v, g in changes.groupby("variant", sort=False):
        q, tot = g["q_value"].to_numpy(dtype=float), g["total_median"].to_numpy(dtype=float)
        sig = np.isfinite(q) & (q <= 0.05)
        n_def = int(np.isfinite(tot).sum())
        parts.append(
            f"{v}: {int((sig & (tot < 0)).sum())} lower and {int((sig & (tot > 0)).sum())} raise it (of {n_def} heads "
            "with the variant)"
        )
    return (
        "What does editing each head do to the final logit of the token it attends to (sign test of the total change, "
        "BH q <= 0.05)? " + "; ".join(parts) + "."
    )


@strict_kwargs
def causal_closure(
    model: Any,
    heads: Any = None,
    texts: Any = None,
    *,
    variants: Any = VARIANTS,
    seq_len: IntLike = 128,
    max_tokens: IntLike | None = 2048,
    batch_size: IntLike = 8,
    text_column: str = "text",
    progress: bool = True,
) -> CausalClosure:
    """Edit each head's OV (closure removed, closure only, zero, mean) and measure the change of the attended token's
    final logit, its direct part, self-repair and the loss (SPEC 13; module docstring).

    Args:
        model: a TransformerLens model (HookedTransformer or TransformerBridge; causal), with ``W_E``/``W_U`` and no
            norm after ``W_O``.
        heads: ``None`` (every head: one forward pass per head, variant and batch), ``(layer, head)`` pairs,
            ``"L10H8"`` labels or a DataFrame with ``layer``/``head`` columns.
        texts: as :func:`~tl_idempotence.probes.token_effect.attended_token_effect`.
        variants: names from :data:`VARIANTS` (a string or a sequence).
        seq_len, max_tokens, batch_size, text_column: as the attended-token effect.
        progress: show a progress bar (forward passes).

    Returns:
        :class:`CausalClosure`.

    Raises:
        UnsupportedModelError: not a TransformerLens model, no ``W_E``/``W_U``, a norm after ``W_O``, a final norm
            that is not affine at a fixed scale.
        WeightError: NaN/inf weights. OptionTypeError / OptionError: unknown heads or variants, bad text or counts.
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
                        plan.append([lay, h, v, kind, value])
        n_b = math.ceil(len(toks) / batch_size)
        total_steps = n_b * (len(plan) + ("mean" in vs))
        was_training = bool(getattr(model, "training", False))
        model.eval()
        try:
            with progress_bar(total=total_steps, desc="causal closure (forward passes)", enabled=progress) as bar:
                if "mean" in vs:
                    means = _means(model, toks, counted, sel, batch_size, bar)
                    for p in plan:
                        if p[3] == "mean":
                            p[4] = means[p[0]][p[1]]
                recs = _run(model, toks, counted, [tuple(p) for p in plan], W_O, U, has_scale, batch_size, bar)
        finally:
            if was_training:
                model.train()
    return _assemble(recs, rows, layers, vs, info, toks, W_E, W_U, norm_text, {
        "seq_len": seq_len, "max_tokens": max_tokens, "batch_size": batch_size, "variants": list(vs),
        "corpus": corpus_name(texts),
    })  # fmt: skip


def _assemble(
    recs: dict, rows: list[dict], layers: dict, vs: tuple[str, ...], info: ModelInfo, toks: torch.Tensor,
    W_E: torch.Tensor, W_U: torch.Tensor, norm_text: str, options: dict,
) -> CausalClosure:  # fmt: skip
    """The result's frames and summary from the passes' records."""
    frames, changes = [], []
    for row in rows:
        lay, h, v = row["layer"], row["head"], row["variant"]
        r = recs.get((lay, h, v))
        label = f"L{lay}H{h}"
        if r:
            pos = pd.DataFrame({k: np.concatenate(x) for k, x in r.items()})
            for col in ("window", "pos", "source_pos", "token"):
                pos[col] = pos[col].astype(np.int64)
            pos.insert(0, "variant", v)
            pos.insert(0, "label", label)
            frames.append(pos)
            stats = _change_row(pos)
        else:
            stats = _change_row(pd.DataFrame({c: np.zeros(0) for c in POSITION_COLUMNS[6:]}))
            stats["n_positions"] = 0
        kv = int(layers[lay].kv_head_of[h])
        changes.append({"label": label, "layer": lay, "head": h, "kv_head": kv, "variant": v,
                        "rel_change": row["rel_change"], **stats, "reason": row["reason"]})  # fmt: skip
    ch = pd.DataFrame(changes)
    ch.insert(ch.columns.get_loc("p_value") + 1, "q_value", _q_values(ch))
    ch = ch.loc[:, list(CHANGE_COLUMNS)]
    positions = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=list(POSITION_COLUMNS))
    positions = positions.loc[:, list(POSITION_COLUMNS)]
    base = pd.DataFrame(rows).drop_duplicates(["layer", "head"]).loc[:, ["layer", "head", "alpha", "P"]]
    base.insert(
        2, "kv_head", [int(layers[lay].kv_head_of[h]) for lay, h in zip(base["layer"], base["head"], strict=True)]
    )
    base.index = head_labels(base["layer"], base["head"])
    base["n_positions"] = ch.groupby("label")["n_positions"].max().reindex(base.index).to_numpy()
    for v in vs:
        g = ch[ch["variant"] == v].set_index("label")
        for col, src_col in _WIDE.items():
            base[f"{col}_{v}"] = g[src_col].reindex(base.index).to_numpy()
    summary = {
        "model_name": info.model_name,
        "model_class": info.model_class,
        "n_heads": len(base),
        "n_positions": int(base["n_positions"].max()) if len(base) else 0,
        "n_windows": len(toks),
        "variants": list(vs),
        "convention": CONVENTION,
        "test": TEST,
        "final_norm": norm_text,
        "processing": dict(info.processing),
        "weights_fingerprint": combined_fingerprint([(lay, lh.fingerprint()) for lay, lh in layers.items()]),
        "embedding_fingerprint": embedding_fingerprint(W_E, W_U),
        "headline": _headline(ch),
    }
    return CausalClosure(table=base, changes=ch, positions=positions, summary=summary, info=info, options=options)
