"""Activation-level returns on real text (SPEC section 8).

**[design card]** "α-scaled returns appear on real inputs": on real text a head's
output ``y_t = T u_t`` lies in range(T), so for a closed head ``T y_t = T² u_t ≈ α y_t``.

**[ours]** For each selected head and each (non-special) token ``t``:

* ``y_t = W_O[h]ᵀ z_t = O z_t`` (column form; TransformerLens row form
  ``y_t = z_t @ W_O[h]``), ``z_t`` from the hook ``blocks.{l}.attn.hook_z``
  ``[batch, pos, n_heads, d_head]`` (same name and layout on HookedTransformer,
  HookedEncoder and TransformerBridge, where it aliases ``attn.o.hook_in``). ``b_O``
  is not part of any head's output and is left out.
* return coefficient ``a_t = ⟨T y_t, y_t⟩ / ‖y_t‖²`` and alignment
  ``cos²(T y_t, y_t) = ⟨T y_t, y_t⟩² / (‖T y_t‖² ‖y_t‖²)``.

Nothing ``d_model``-sized is formed per token: with ``G_O = Oᵀ O`` and ``M = Vᵀ O``
(the core's Grams) and ``y = O z``::

    T y = O Vᵀ O z = O (M z)
    ⟨T y, y⟩ = (M z)ᵀ G_O z,    ‖y‖² = zᵀ G_O z,    ‖T y‖² = (M z)ᵀ G_O (M z)

(in row form ``T y`` is ``y @ W_V[kv] @ W_O[h]``; tested against that). Per head the
tokens are summarised by the median and interquartile range (IQR = q75 − q25) of
``a_t`` and ``cos²``, next to the weight-level α and P of :mod:`tl_idempotence.linalg`.

Controls (same tokens, same ``y_t``; both statistics are scale-invariant in ``y``, so
"norm-matched" holds automatically):

* ``control="scramble"`` (default): the orientation-scramble null of the same head
  (SPEC 4b), ``T̃ = Q_O K̃ Q_Vᵀ`` with ``K̃ = R₁ K R₂ᵀ`` (in law ``R₁ S R₂ᵀ``, ``S`` the
  singular values of ``T``), ``R₁`` Haar in ``O(rank_O)`` on span(O) and ``R₂`` Haar in
  ``O(rank_V)`` on span(V), within the head's own numerical ranks, so a rank-deficient head's
  control keeps its rank (``nulls`` draws, pooled over tokens; one generator per head, seeded
  by ``(seed, layer, head)``).
  ``Q_O, Q_V`` are orthonormal bases of span(O), span(V) taken from the Gram
  eigenbases (``Q_O = O W diag(1/s)``), so ``Q_Oᵀ y = diag(s) Wᵀ z`` and
  ``Q_Vᵀ y = diag(1/s_V) W_Vᵀ M z`` are ``d_head``-sized. Haar invariance makes the
  null independent of which bases are used.
* ``control="random"``: the head's real ``T`` applied to an isotropic Gaussian
  residual vector per token (what a head "returns" on an input unrelated to its own
  output).

Tokens and special positions: texts are tokenized without special tokens, joined with
a separator (``[SEP]`` when the tokenizer has one, else EOS) into one stream and cut
into windows of ``seq_len`` tokens, each wrapped the way the model expects (the tokenizer's own special tokens,
e.g. BERT's
``[CLS] … [SEP]``; otherwise, when ``cfg.default_prepend_bos`` is set, the BOS token
that TransformerLens's ``to_tokens`` would prepend — ``<|im_start|>`` for SmolLM2). So
no window is padded. Every position whose token is a special token of the tokenizer
(BOS/``[CLS]``, EOS/``[SEP]``, padding, ...) is run through the model but **excluded
from the statistics**: the BOS position is an attention sink whose head outputs are
atypical, and padding carries no text. User-given token tensors are run as given (no
attention mask) with the same exclusion rule.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import torch
from jaxtyping import Bool, Float
from torch import Tensor

from ..core.defaults import DEFAULT_THRESHOLD, default_of
from ..core.factors import gram_eig
from ..core.heads import ModelInfo, read_layer
from ..core.kwargs import warn_at_caller
from ..core.options import check_bool, check_int, check_seed, check_threshold, strict_kwargs
from ..core.random import haar_orthogonal, head_generator, layer_generator
from ..core.selection import head_labels, select_heads
from ..core.tables import ImmutableResult
from ..errors import OptionError, UnsupportedModelError, WeightError
from ..maths.closure import closure_from_grams, layer_grams
from ..sources.tl import TLModelSource, is_tl_model
from ..views.results import DrawnResult
from .tokens import corpus_name, default_corpus, prepare_tokens

if TYPE_CHECKING:  # pragma: no cover
    from typing import Literal

    from ..core.hints import HeadsLike, IntLike, RealLike, TextsLike, TLModel

__all__ = ["ActivationReturns", "activation_returns", "default_corpus", "head_returns", "prepare_tokens"]

#: The scramble control's draws per head by default (:mod:`tl_idempotence.core.defaults` says why).
CONTROL_NULLS = default_of("tli.activation_returns", "nulls")

# --------------------------------------------------------------------------- per-head maths


@dataclass
class _LayerOps:
    """Per-layer r x r operators (float64) for the selected heads of one layer."""

    layer: int
    heads: list[int]
    kv: list[int]
    G_O: Tensor  # [h, r, r]
    M: Tensor  # [h, r, r]
    alpha: np.ndarray
    P: np.ndarray
    ctrl: Tensor | None  # scramble: [draws, h, r, r] maps z -> K~ Q_V^T y ; with Aw
    Aw: Tensor | None  # [h, r, r]: z -> Q_O^T y
    V: Tensor | None  # random control: [n_kv, d_model, r] (unexpanded; index with kv)
    O: Tensor | None  # random control: [h, d_model, r]


def _eig_factors(G: Tensor, rtol: float) -> tuple[Tensor, Tensor, Tensor]:
    """Gram eigenbasis as in :mod:`tl_idempotence.core.factors`, singular values zeroed beyond the rank."""
    s, W, mask = gram_eig(G, rtol, True)
    assert W is not None
    return torch.where(mask, s, torch.zeros_like(s)), W, mask


def head_returns(
    z: Float[Tensor, "*tok h r"],
    G_O: Float[Tensor, "h r r"],
    M: Float[Tensor, "h r r"],
) -> tuple[Float[Tensor, "*tok h"], Float[Tensor, "*tok h"]]:
    """Return coefficient and alignment of ``T y`` vs ``y = O z`` in ``d_head`` form (SPEC 8).

    Args:
        z: per-token, per-head ``hook_z`` values ``[..., n_heads, d_head]`` (any float dtype).
        G_O: ``Oᵀ O`` per head, ``[n_heads, d_head, d_head]``.
        M: ``Vᵀ O`` per head (V of the head's kv group), ``[n_heads, d_head, d_head]``.

    Returns:
        ``(a, cos2)``, each ``[..., n_heads]`` float64: ``a = ⟨Ty, y⟩/‖y‖²`` (units of α)
        and ``cos²(Ty, y)`` in [0, 1]; NaN where ``y = 0`` (or ``Ty = 0`` for cos²).

    Raises:
        RuntimeError (torch): shapes that do not broadcast (internal; :func:`activation_returns` checks its inputs).
    """
    z = z.to(torch.float64)
    Mz = torch.einsum("hij,...hj->...hi", M, z)
    Gz = torch.einsum("hij,...hj->...hi", G_O, z)
    GMz = torch.einsum("hij,...hj->...hi", G_O, Mz)
    return _ratio((Mz * Gz).sum(-1), (z * Gz).sum(-1), (Mz * GMz).sum(-1))


def _ratio(ip: Tensor, ny2: Tensor, nTy2: Tensor) -> tuple[Tensor, Tensor]:
    nan = torch.full_like(ip, float("nan"))
    a = torch.where(ny2 > 0, ip / torch.where(ny2 > 0, ny2, torch.ones_like(ny2)), nan)
    den = ny2 * nTy2
    cos2 = torch.where(den > 0, ip**2 / torch.where(den > 0, den, torch.ones_like(den)), nan).clamp(0.0, 1.0)
    return a, cos2


def _layer_ops(
    src: TLModelSource, layer: int, heads: list[int], control: str | None, n_control_draws: int, seed: int
) -> _LayerOps:
    lh = read_layer(src, layer, src.info)
    g = layer_grams(lh.O, lh.V, lh.kv_head_of)
    if g.e_T is not None:
        raise WeightError(
            f"Layer {layer}: the weights are far outside the ordinary range (rescaled by "
            f"2^{int(g.e_T.abs().max())} for the products); a forward pass through them overflows, so activation "
            "returns are not defined."
        )
    c = closure_from_grams(g)
    idx = torch.tensor(heads, dtype=torch.long)
    G_O, M = g.G_O[idx], g.M[idx]
    G_V = g.G_V[idx]
    ops = _LayerOps(
        layer=layer,
        heads=list(heads),
        kv=lh.kv_head_of[idx].tolist(),
        G_O=G_O,
        M=M,
        alpha=c.alpha[idx].numpy(),
        P=c.P[idx].numpy(),
        ctrl=None,
        Aw=None,
        V=None,
        O=None,
    )
    if control == "scramble":
        s_O, W_O, m_O = _eig_factors(G_O, c.rtol)
        s_V, W_V, m_V = _eig_factors(G_V, c.rtol)
        inv_V = torch.where(m_V, 1.0 / torch.where(m_V, s_V, torch.ones_like(s_V)), torch.zeros_like(s_V))
        # Q_O = O W_O diag(1/s_O), Q_V = V W_V diag(1/s_V) (on the numerical ranks).
        Aw = s_O.unsqueeze(-1) * W_O.transpose(-1, -2)  # z -> Q_Oᵀ y
        Au = inv_V.unsqueeze(-1) * (W_V.transpose(-1, -2) @ M)  # z -> Q_Vᵀ y
        K = s_O.unsqueeze(-1) * (W_O.transpose(-1, -2) @ W_V) * s_V.unsqueeze(-2)  # T = Q_O K Q_Vᵀ
        ops.ctrl, ops.Aw = _scrambled_K(K, m_O, m_V, n_control_draws, seed, layer, heads) @ Au.unsqueeze(0), Aw
    elif control == "random":
        ops.V = lh.V.to("cpu", torch.float64)  # [n_kv, d_model, r], unexpanded
        ops.O = lh.O[idx.to(lh.O.device)].to("cpu", torch.float64)
    return ops


def _scrambled_K(
    K: Float[Tensor, "h r r"],
    mask_O: Bool[Tensor, "h r"],
    mask_V: Bool[Tensor, "h r"],
    n_draws: int,
    seed: int,
    layer: int,
    heads: list[int],
) -> Float[Tensor, "d h r r"]:
    """``n_draws`` orientation-scrambled ``K̃ = R₁ K R₂ᵀ`` per head, within the head's own ranks (SPEC 4b).

    ``R₁`` is Haar in ``O(rank_O)`` on the coordinates of span(O) (``mask_O``) and the identity
    elsewhere, ``R₂`` likewise in ``O(rank_V)`` on span(V) (``mask_V``): ``K̃`` keeps the
    singular values of ``K`` and lives in the same rank blocks, so ``T̃ = Q_O K̃ Q_Vᵀ`` has the
    head's rank and ``‖T̃‖_F = ‖T‖_F``. By Haar invariance this is the law of ``R₁ S R₂ᵀ`` of
    :mod:`.scramble` (whose rotations also act on the rank blocks only). A head of rank 1 on both
    sides gets ``K̃ = ±K``. Each head draws from its own generator
    (:func:`~tl_idempotence.core.random.head_generator` of ``(seed, layer, head)``), so its control
    never depends on which other heads were selected.

    Args:
        K: ``[h, r, r]`` float64, ``T = Q_O K Q_Vᵀ`` in the Gram eigenbases (zero outside the masks).
        mask_O, mask_V: ``[h, r]`` bool, the eigen-coordinates counted in the numerical ranks.
        n_draws: draws per head (>= 1).
        seed, layer, heads: seed the per-head generators (``heads``: the heads' indices in the layer).

    Returns:
        ``[n_draws, h, r, r]`` float64.
    """
    h, r = K.shape[0], K.shape[-1]
    out = torch.empty((n_draws, h, r, r), dtype=K.dtype)
    for k, head in enumerate(heads):
        gen = head_generator(seed, layer, head, "scramble", 8)  # 8: the activation-control stream
        rot = []
        for m in (mask_O[k], mask_V[k]):
            E = torch.eye(r, dtype=K.dtype).repeat(n_draws, 1, 1)
            i = m.nonzero().flatten()
            if len(i):
                E[:, i.unsqueeze(-1), i] = haar_orthogonal(n_draws, len(i), gen)
            rot.append(E)
        out[:, k] = rot[0] @ K[k] @ rot[1].transpose(-1, -2)
    return out


def _control_returns(
    ops: _LayerOps, z: Tensor, control: str | None, gen: torch.Generator | None
) -> tuple[Tensor, Tensor]:
    """Control (a, cos2) per token and head: ``[n_tok * draws, h]``."""
    z = z.to(torch.float64)  # [n_tok, h, r]
    if control == "scramble":
        assert ops.Aw is not None and ops.ctrl is not None
        w = torch.einsum("hij,thj->thi", ops.Aw, z)  # Q_Oᵀ y
        Bz = torch.einsum("dhij,thj->dthi", ops.ctrl, z)  # K~ Q_Vᵀ y
        ip = (Bz * w.unsqueeze(0)).sum(-1)
        ny2 = (w * w).sum(-1).expand_as(ip)
        nTy2 = (Bz * Bz).sum(-1)
        a, c2 = _ratio(ip, ny2, nTy2)
        return a.flatten(0, 1), c2.flatten(0, 1)
    # random: isotropic Gaussian residual vectors through the real T.
    assert ops.O is not None and ops.V is not None
    n_tok = z.shape[0]
    d = ops.O.shape[1]
    x = torch.randn(n_tok, d, generator=gen, dtype=torch.float64)
    Vx = torch.einsum("kdr,td->tkr", ops.V, x)[:, ops.kv]
    Ox = torch.einsum("hdr,td->thr", ops.O, x)
    GVx = torch.einsum("hij,thj->thi", ops.G_O, Vx)
    ip = (Vx * Ox).sum(-1)
    ny2 = (x * x).sum(-1, keepdim=True).expand_as(ip)
    nTy2 = (Vx * GVx).sum(-1)
    return _ratio(ip, ny2, nTy2)


# --------------------------------------------------------------------------- driver


class _Stop(Exception):
    """Raised by the last hook to skip the rest of the forward pass."""


def _q(x: np.ndarray, q: float) -> float:
    x = x[np.isfinite(x)]
    return float(np.quantile(x, q)) if x.size else float("nan")


@dataclass(repr=False)
class ActivationReturns(
    ImmutableResult,
    DrawnResult,
    repr_keys="n_heads n_tokens median_cos2_all median_cos2_closed median_ctrl_cos2_all",
    frozen=("activation returns are", "tli.activation_returns(...) again, dataclasses.replace(...) for a changed copy"),
):
    """Result of :func:`activation_returns` (SPEC section 8). Immutable
    (:class:`~tl_idempotence.core.tables.ImmutableResult`): assigning a field raises
    ``dataclasses.FrozenInstanceError``, :attr:`heads` is a copy made on each read, :attr:`summary` and
    :attr:`options` are read-only.

    Attributes:
        heads: one row per analysed head, indexed by ``"L10H8"`` labels like ``rep.heads`` (joinable by
            index or on ``layer, head``): ``layer, head, kv_head``, weight-level ``alpha, P,
            closed``; ``n_tokens`` counted; ``a_median, a_q25, a_q75, a_iqr, a_min, a_max`` (return
            coefficient, units of α); ``cos2_median, cos2_q25, cos2_q75, cos2_iqr, cos2_min`` (in [0, 1]);
            ``a_median_over_alpha`` (1 when returns are α-scaled); ``cos2_median_minus_P``;
            the control's ``ctrl_a_median, ctrl_a_iqr, ctrl_cos2_median, ctrl_cos2_iqr``;
            ``cos2_beats_control`` (``cos2_median > ctrl_cos2_median``).
        summary: headline numbers (closed vs other heads, vs control).
        info: what was measured; ``options``: the arguments (control, seq_len, tokens, ...).
    """

    heads: pd.DataFrame
    summary: dict[str, Any]
    info: ModelInfo
    options: dict[str, Any] = field(default_factory=dict)

    def figure(self) -> Any:
        """Plotly scatter: per head, median cos²(Ty, y) on text vs weight-level P (control in grey)."""
        from ..views import activation_figure

        return activation_figure(self)


def _collect_returns(
    model: Any,
    toks: Tensor,
    counted: Tensor,
    ops: dict[int, _LayerOps],
    control: str | None,
    rand_gen: dict[int, torch.Generator],
    batch_size: int,
    progress: bool,
) -> dict[int, dict[str, list[Tensor]]]:
    """The forward passes of :func:`activation_returns`: windows ``toks`` ``[windows, pos]`` in batches, a
    ``hook_z`` hook on every layer of ``ops`` reducing each counted position (``counted``, same shape) to the
    heads' returns (:func:`head_returns`) and, with ``control``, their control's (:func:`_control_returns`); the
    pass stops after the last needed layer. The model is put in eval mode and back.

    Returns:
        ``{layer: {"a", "c", "ca", "cc": [float32 tensors [n_tok, heads], one per batch]}}`` (``ca``/``cc`` empty
        without a control).
    """
    from ..core.progress import progress_bar

    last = max(ops)
    n_layers = int(model.cfg.n_layers)  # a TransformerLens model (checked by the caller)
    stats: dict[int, dict[str, list[Tensor]]] = {l: {"a": [], "c": [], "ca": [], "cc": []} for l in ops}
    cur_mask: dict[str, Tensor] = {}

    def make_hook(l: int):
        o = ops[l]
        hidx = torch.tensor(o.heads, dtype=torch.long)

        def hook(z: Tensor, hook: Any = None) -> None:
            zz = z.detach()[..., hidx, :].to("cpu")[cur_mask["m"]]  # [n_tok, h, r]
            a, c2 = head_returns(zz, o.G_O, o.M)
            stats[l]["a"].append(a.float())
            stats[l]["c"].append(c2.float())
            if control is not None:
                ca, cc = _control_returns(o, zz, control, rand_gen.get(l))
                stats[l]["ca"].append(ca.float())
                stats[l]["cc"].append(cc.float())
            if l == last and last < n_layers - 1:
                raise _Stop

        return hook

    fwd_hooks = [(f"blocks.{l}.attn.hook_z", make_hook(l)) for l in ops]
    was_training = bool(getattr(model, "training", False))
    model.eval()
    device = getattr(model.cfg, "device", None) or "cpu"
    try:
        with torch.no_grad():
            n_batches = (len(toks) + batch_size - 1) // batch_size
            desc = f"activation returns ({len(toks)} windows x {toks.shape[1]} tokens; ~6 CPU-ms/token on SmolLM2)"
            for start in progress_bar(
                range(0, len(toks), batch_size), desc=desc, total=n_batches, unit="batch", enabled=progress
            ):
                batch = toks[start : start + batch_size]
                cur_mask["m"] = counted[start : start + batch_size]
                if not bool(cur_mask["m"].any()):
                    continue
                try:
                    model.run_with_hooks(batch.to(device), fwd_hooks=fwd_hooks, return_type=None)
                except _Stop:
                    pass
    finally:
        if was_training:
            model.train()
    return stats


def _returns_table(
    ops: dict[int, _LayerOps], stats: dict[int, dict[str, list[Tensor]]], control: str | None, threshold: float
) -> pd.DataFrame:
    """One row per head (SPEC 8): its weight-level α, P and ``closed`` at ``threshold``, the quantiles of its
    returns ``a`` and ``cos²`` over the counted tokens (float64 from the float32 per-token values), their relation
    to α and P, and with ``control`` the control's medians and spreads; indexed by head label (``L10H8``)."""
    rows = []
    for l, o in ops.items():
        a = torch.cat(stats[l]["a"]).double().numpy()
        c2 = torch.cat(stats[l]["c"]).double().numpy()
        ca = torch.cat(stats[l]["ca"]).double().numpy() if control else None
        cc = torch.cat(stats[l]["cc"]).double().numpy() if control else None
        for k, h in enumerate(o.heads):
            ak, ck = a[:, k], c2[:, k]
            row = {
                "layer": l,
                "head": h,
                "kv_head": o.kv[k],
                "alpha": float(o.alpha[k]),
                "P": float(o.P[k]),
                "closed": bool(np.isfinite(o.P[k]) and o.P[k] >= threshold),
                "n_tokens": int(np.isfinite(ak).sum()),
                "a_median": _q(ak, 0.5),
                "a_q25": _q(ak, 0.25),
                "a_q75": _q(ak, 0.75),
                "a_min": _q(ak, 0.0),
                "a_max": _q(ak, 1.0),
                "cos2_median": _q(ck, 0.5),
                "cos2_q25": _q(ck, 0.25),
                "cos2_q75": _q(ck, 0.75),
                "cos2_min": _q(ck, 0.0),
            }
            row["a_iqr"] = row["a_q75"] - row["a_q25"]
            row["cos2_iqr"] = row["cos2_q75"] - row["cos2_q25"]
            row["a_median_over_alpha"] = row["a_median"] / row["alpha"] if row["alpha"] else float("nan")
            row["cos2_median_minus_P"] = row["cos2_median"] - row["P"]
            if control:
                assert ca is not None and cc is not None
                row["ctrl_a_median"] = _q(ca[:, k], 0.5)
                row["ctrl_a_iqr"] = _q(ca[:, k], 0.75) - _q(ca[:, k], 0.25)
                row["ctrl_cos2_median"] = _q(cc[:, k], 0.5)
                row["ctrl_cos2_iqr"] = _q(cc[:, k], 0.75) - _q(cc[:, k], 0.25)
                row["cos2_beats_control"] = bool(row["cos2_median"] > row["ctrl_cos2_median"])
            rows.append(row)
    df = pd.DataFrame(rows)
    df.index = head_labels(df["layer"], df["head"])  # "L10H8", the index of rep.heads
    return df


def _returns_summary(
    df: pd.DataFrame, control: str | None, model_name: str, n_tok: int, n_windows: int
) -> dict[str, Any]:
    """The summary of :func:`activation_returns`: medians over heads (closed and open apart; NaN heads left out,
    NaN when none is left) and, with ``control``, the fraction of the compared heads whose median cos² beats it."""
    closed = df["closed"].to_numpy(dtype=bool)

    def med(col: str, m: np.ndarray | None = None) -> float:
        v = df[col].to_numpy(dtype=float) if m is None else df.loc[m, col].to_numpy(dtype=float)
        v = v[np.isfinite(v)]
        return float(np.median(v)) if v.size else float("nan")

    summary: dict[str, Any] = {
        "model_name": model_name,
        "n_heads": len(df),
        "n_tokens": n_tok,
        "n_windows": n_windows,
        "n_closed": int(closed.sum()),
        "median_cos2_all": med("cos2_median"),
        "median_cos2_closed": med("cos2_median", closed),
        "median_cos2_open": med("cos2_median", ~closed),
        "median_a_over_alpha_closed": med("a_median_over_alpha", closed),
    }
    if control:
        # Over the heads whose comparison is defined (both medians finite): an undefined head is in neither count.
        compared = np.isfinite(df["cos2_median"].to_numpy(dtype=float)) & np.isfinite(
            df["ctrl_cos2_median"].to_numpy(dtype=float)
        )
        beats = df["cos2_beats_control"].to_numpy(dtype=bool)

        def frac(m: np.ndarray) -> float:
            return float(beats[m].mean()) if m.any() else float("nan")

        summary.update(
            {
                "control": control,
                "median_ctrl_cos2_all": med("ctrl_cos2_median"),
                "median_ctrl_cos2_closed": med("ctrl_cos2_median", closed),
                "n_heads_compared": int(compared.sum()),
                "frac_beats_control": frac(compared),
                "frac_closed_beats_control": frac(compared & closed),
            }
        )
    return summary


@strict_kwargs
def activation_returns(
    model: TLModel,
    texts_or_tokens: TextsLike | None = None,
    heads: HeadsLike | None = None,
    *,
    batch_size: IntLike = 8,
    seq_len: IntLike = 128,
    max_tokens: IntLike | None = 8192,
    control: Literal["scramble", "random"] | None = "scramble",
    nulls: IntLike = CONTROL_NULLS,
    seed: IntLike = 0,
    threshold: RealLike = DEFAULT_THRESHOLD,
    text_column: str = "text",
    progress: bool = True,
    n_control_draws: IntLike | None = None,
) -> ActivationReturns:
    """α-scaled returns on real text: ``a_t = ⟨T y_t, y_t⟩/‖y_t‖²`` and ``cos²(T y_t, y_t)`` per head (SPEC 8).

    Runs the model with TransformerLens hooks on ``blocks.{l}.attn.hook_z`` of the
    layers that hold a selected head only (no activation cache, no weight changes;
    the forward pass stops after the last needed layer), and reduces each head's
    per-token output to two scalars on the fly in ``d_head`` form (module docstring).

    Args:
        model: a TransformerLens ``HookedTransformer``, ``HookedEncoder`` or
            ``TransformerBridge`` (causal or encoder; MHA, GQA or MQA).
        texts_or_tokens: ``None`` (default: :func:`default_corpus`, stdlib docstrings),
            a string, a list of strings / ``pathlib.Path`` files, a ``datasets.Dataset``
            or an int tensor ``[batch, pos]`` of token ids (see :func:`prepare_tokens`).
        heads: ``None`` (all heads), ``(layer, head)`` pairs, or a DataFrame with
            ``layer``/``head`` columns (e.g. ``report.closed_heads``).
        batch_size (int): windows per forward pass.
        seq_len (int): window length in tokens (including special tokens).
        max_tokens (int | None): counted tokens to collect at least, in whole windows
            (:func:`prepare_tokens`; None: all): ``summary["n_tokens"]`` is the number measured,
            from ``max_tokens`` to below ``max_tokens + seq_len`` unless the texts run out (8,207
            for the default 8,192 on the default corpus and SmolLM2's tokenizer). Memory is
            ``O(max_tokens · n_heads · (1 + nulls))`` floats for the per-token
            statistics, plus one forward pass of ``batch_size x seq_len``.
        control (str | None): ``"scramble"`` (orientation-scramble null of the same head),
            ``"random"`` (Gaussian residual input to the real T) or ``None``.
        nulls (int): scramble-control draws per head (pooled over tokens), >= 1 when ``control="scramble"``.
        seed (int): seed of the control draws (per layer, see :func:`~tl_idempotence.core.random.layer_generator`).
        threshold (float): P threshold for the weight-level ``closed`` flag.
        text_column (str): text column of a ``datasets.Dataset``.
        progress (bool): tqdm bar over batches.
        n_control_draws (int | None): deprecated name of ``nulls``.

    Every argument is validated here, where it enters.

    Returns:
        :class:`ActivationReturns`.

    Raises:
        UnsupportedModelError: not a TransformerLens model.
        OptionTypeError: unsupported ``texts_or_tokens`` / ``heads`` / option types.
        OptionError: unknown layer/head, empty ``heads``, bad ``control``, token ids outside the
            vocabulary, empty input, no tokenizer for text, no counted tokens (every position was
            a special token), counts < 1.
    """
    if n_control_draws is not None:
        warn_at_caller("activation_returns(n_control_draws=...) is deprecated; use nulls=...", DeprecationWarning)
        nulls = n_control_draws
    if not is_tl_model(model):
        raise UnsupportedModelError(
            f"activation_returns needs a TransformerLens model (HookedTransformer, HookedEncoder or TransformerBridge) "
            f"to run with hooks; got {type(model).__name__}. Load one with tl_idempotence.models.load(...)."
        )
    if not (control is None or (isinstance(control, str) and control in ("scramble", "random"))):
        raise OptionError(f"control must be 'scramble', 'random' or None; got {control!r:.60}.")
    batch_size = check_int(batch_size, "batch_size", 1, 1 << 20)
    seq_len = check_int(seq_len, "seq_len", 1, 1 << 24)
    if max_tokens is not None:
        max_tokens = check_int(max_tokens, "max_tokens", 1)
    n_control_draws = check_int(nulls, "nulls", 1 if control == "scramble" else 0, 100_000)
    seed = check_seed(seed)
    threshold = check_threshold(threshold)
    progress = check_bool(progress, "progress")
    src = TLModelSource(model)
    sel = select_heads(heads, list(src.layers()), src.info.n_heads)
    toks, counted = prepare_tokens(
        model, texts_or_tokens, seq_len=seq_len, max_tokens=max_tokens, text_column=text_column
    )
    if not bool(counted.any()):
        raise OptionError("Every position is a special token (BOS/EOS/PAD/CLS/SEP): there is no text to measure.")
    ops = {l: _layer_ops(src, l, hs, control, n_control_draws, seed) for l, hs in sel.items()}
    rand_gen = {l: layer_generator(seed, l, "scramble", 9) for l in sel} if control == "random" else {}
    stats = _collect_returns(model, toks, counted, ops, control, rand_gen, batch_size, progress)
    df = _returns_table(ops, stats, control, threshold)
    summary = _returns_summary(df, control, src.info.model_name, int(counted.sum()), len(toks))
    options = {
        "control": control,
        "nulls": n_control_draws if control == "scramble" else None,
        "seed": seed,
        "seq_len": seq_len,
        "max_tokens": max_tokens,
        "batch_size": batch_size,
        "threshold": threshold,
        "corpus": corpus_name(texts_or_tokens),
        "excluded_positions": "special tokens (BOS/CLS/EOS/SEP/PAD)",
    }
    return ActivationReturns(heads=df, summary=summary, info=src.info, options=options)
