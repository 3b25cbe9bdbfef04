"""The forward passes of :func:`~tl_idempotence.probes.token_effect.attended_token_effect` and their per-position
records (SPEC 12-13; that module's docstring says what is measured): :class:`LayerOps` (a layer's selected heads in
``d_head`` form), :class:`EffectRun` (the hooked passes, window by window) and :func:`top_k_flags` (the
copy-suppression condition).

**The copy-suppression condition** (McDougall et al. 2023; SPEC 13). At a destination position ``q`` of layer ``l``
the residual stream at the head's input, ``x = blocks.{l}.hook_resid_pre[q]``, is read as the direct effect reads a
head's output: through ``W_U~`` (``W_U``, centred over ``d_model`` for a LayerNorm; the final norm's scale at ``q``
divides every logit alike and cannot change a rank; no norm weight, no ``b_U``). The attended token ``t`` (the token
at the source the head attends to most) is **predicted** when it is among the ``k`` largest of those logits:
``#{u != t : x·W_U~[:, u] > x·W_U~[:, t]} < k`` (ties go to ``t``), in float64. Computed without forming every
position's ``d_vocab`` float64 logits: a first pass reads a stride sample of the vocabulary in float32, and a token
with at least ``k`` sampled tokens above it by more than the float32 error bound is not predicted; the positions it
leaves open read the whole vocabulary in float32, and those within the bound of the ``k``-th are recounted in
float64. The bound: ``2 γ_{d+3} ‖x‖ max_u ‖W_U~[:, u]‖`` (``γ_n = n u / (1 - n u)``, ``u`` float32's unit roundoff;
any summation order), so every answer is the float64 count's.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ..core.random import layer_generator

__all__ = ["RESID_HOOK", "EffectRun", "LayerOps", "top_k_flags"]

#: The residual stream at a layer's input (the copy-suppression condition reads it).
RESID_HOOK = "blocks.{l}.hook_resid_pre"
#: Tokens of the vocabulary in the first pass of :func:`top_k_flags` (a stride sample; all of a smaller one).
SAMPLE_TOKENS = 3072
#: Positions per block of the whole-vocabulary pass (a ``[block, d_vocab]`` float32 matrix at a time).
ROW_BLOCK = 256


def _gamma(n: int, u: float) -> float:
    return n * u / (1 - n * u)


def top_k_flags(
    X: torch.Tensor, T: torch.Tensor, U: torch.Tensor, U_rows: torch.Tensor, U32_rows: torch.Tensor, k: int
) -> torch.Tensor:
    """Whether each token of ``T`` is among the ``k`` largest logits of its position (module docstring).

    Args:
        X: ``[n, d_model]`` float64 residual streams. T: ``[n, h]`` int64 token ids (one column per head).
        U: ``[d_model, d_vocab]`` float64 ``W_U~``; U_rows: its transpose, contiguous; U32_rows: the same in
            float32.
        k: the top size (1 .. d_vocab).

    Returns:
        ``[n, h]`` bool: ``#{u != t : logit_u > logit_t} < k`` with float64 logits ``X @ U``.
    """
    n, h = T.shape
    d_vocab = U.shape[1]
    out = torch.zeros(n, h, dtype=torch.bool, device=X.device)
    if n == 0 or h == 0:
        return out
    lt = torch.einsum("nd,nhd->nh", X, U_rows[T])  # [n, h] the attended tokens' logits, float64
    u32 = float(torch.finfo(torch.float32).eps) / 2
    umax = float(U_rows.norm(dim=1).max())
    tol = 2 * _gamma(X.shape[1] + 3, u32) * X.norm(dim=1) * umax  # [n] float32 error bound of any logit
    X32 = X.float()
    stride = max(1, d_vocab // SAMPLE_TOKENS)
    sample = U32_rows[::stride]  # [S, d_model]
    above = (X32 @ sample.T).double()  # [n, S]
    n_above = (above[:, None, :] > (lt + tol[:, None])[..., None]).sum(-1)  # [n, h]: surely above t (t is not)
    open_ = n_above < k  # the sample does not decide
    rows = torch.nonzero(open_.any(1)).squeeze(1)
    for s in range(0, len(rows), ROW_BLOCK):
        r = rows[s : s + ROW_BLOCK]
        L = (X32[r] @ U32_rows.T).double()  # [m, d_vocab]
        for j in range(h):
            lj, tj = lt[r, j], tol[r]
            hi = (L > (lj + tj)[:, None]).sum(1)  # surely above t
            lo = (L > (lj - tj)[:, None]).sum(1) - 1  # possibly above t (t itself counted once: subtracted)
            yes, no = lo < k, hi >= k
            out[r, j] = yes
            close = ~yes & ~no
            for i in torch.nonzero(close).squeeze(1).tolist():  # within the bound of the k-th: float64 recount
                q = int(r[i])
                L64 = X[q] @ U
                t = int(T[q, j])
                own = L64[t].clone()
                L64[t] = -torch.inf
                out[q, j] = bool(int((L64 > own).sum()) < k)
    return out


class LayerOps:
    """One layer's selected heads in ``d_head`` form (module docstring): ``W_O`` ``[heads, d_head, d_model]``,
    ``W_O ū`` ``[heads, d_head]`` and ``W_O C W_Oᵀ`` ``[heads, d_head, d_head]`` (float64)."""

    def __init__(self, O: torch.Tensor, heads: list[int], u_bar: torch.Tensor, C: torch.Tensor) -> None:
        W_O = O.transpose(-1, -2)[heads]  # [h, d_head, d_model]
        self.index = {h: j for j, h in enumerate(heads)}
        self.W_O = W_O
        self.w_mean = W_O @ u_bar  # [h, d_head]
        self.G = W_O @ C @ W_O.transpose(-1, -2)  # [h, d_head, d_head]


#: The per-position records each head collects (:meth:`EffectRun.collect`), in order.
RECORD_KEYS = ("window", "pos", "src", "tok", "eff", "nsrc", "neff", "raw", "pred")


class EffectRun:
    """The forward passes of ``attended_token_effect`` and the per-position records of every selected head.

    Args:
        model, sel, ops, U: the model, ``{layer: [heads]}``, each layer's :class:`LayerOps`, ``W_U~`` float64.
        has_scale: the model has ``ln_final.hook_scale``. post_hooks: ``{layer: hook}`` of a norm after ``W_O``.
        batch_size, seed, progress: windows per pass, the null draws' seed, the bar.
        predicted_k: the copy-suppression condition's ``k`` (None: not measured).
        predicted: ``{layer: {heads}}`` whose positions get the condition.
    """

    def __init__(
        self,
        model: Any,
        sel: dict[int, list[int]],
        ops: dict[int, LayerOps],
        U: torch.Tensor,
        has_scale: bool,
        post_hooks: dict[int, str],
        batch_size: int,
        seed: int,
        progress: bool,
        predicted_k: int | None = None,
        predicted: dict[int, set[int]] | None = None,
    ) -> None:
        self.model, self.sel, self.ops, self.U = model, sel, ops, U
        self.U_rows = U.T.contiguous()  # [d_vocab, d_model]: a token's column of W_U~ as one contiguous row
        self.has_scale, self.post_hooks, self.batch_size, self.progress = has_scale, post_hooks, batch_size, progress
        self.predicted_k = predicted_k
        self.predicted = {lay: hs for lay, hs in (predicted or {}).items() if hs} if predicted_k is not None else {}
        self.U32_rows = self.U_rows.float() if self.predicted else None
        self.gen = layer_generator(seed, None, "token_effect")  # one stream for the whole call, in window order
        self.store: dict[str, torch.Tensor] = {}
        self.recs: dict[tuple[int, int], dict[str, list[np.ndarray]]] = {
            (lay, h): {k: [] for k in RECORD_KEYS} for lay, hs in sel.items() for h in hs
        }

    def _hook(self, name: str) -> Any:
        def hook(x: torch.Tensor, hook: Any = None) -> None:
            self.store[name] = x.detach()

        return hook

    def collect(self, toks: torch.Tensor, counted: torch.Tensor) -> dict[tuple[int, int], dict[str, list[np.ndarray]]]:
        """Run every window (``batch_size`` at a time, the model in eval mode and back) and return the records."""
        from ..core.progress import progress_bar

        names = [f"blocks.{lay}.attn.hook_{w}" for lay in self.sel for w in ("z", "pattern")]
        names += list(self.post_hooks.values())
        names += [RESID_HOOK.format(l=lay) for lay in self.predicted]
        if self.has_scale:
            names.append("ln_final.hook_scale")
        fwd = [(n, self._hook(n)) for n in names]  # stored under the name asked for (a bridge's alias included)
        device = getattr(self.model.cfg, "device", None) or "cpu"
        was_training = bool(getattr(self.model, "training", False))
        n_heads = sum(len(hs) for hs in self.sel.values())
        cost = f"~{6 + len(self.predicted)} CPU-ms/token on SmolLM2"  # ~1 per layer of the copy-suppression split
        desc = f"attended-token effect ({len(toks)} windows x {toks.shape[1]} tokens, {n_heads} heads; {cost})"
        starts = range(0, len(toks), self.batch_size)
        self.model.eval()
        try:
            for start in progress_bar(starts, desc=desc, total=len(starts), unit="batch", enabled=self.progress):
                batch = toks[start : start + self.batch_size]
                self.store.clear()
                self.model.run_with_hooks(batch.to(device), fwd_hooks=fwd, return_type=None)
                self._batch(batch, counted[start : start + self.batch_size], start)
        finally:
            if was_training:
                self.model.train()
        return self.recs

    def _batch(self, batch: torch.Tensor, cnt: torch.Tensor, start: int) -> None:
        dev = self.U.device
        cnt = cnt.to(dev)
        P = batch.shape[1]
        tb = batch.to(dev)
        # eligible sources of destination q: counted keys k <= q (q itself included)
        causal = torch.ones(P, P, dtype=torch.bool, device=dev).tril()
        elig = causal.unsqueeze(0) & cnt.unsqueeze(1)  # [B, q, k]
        dest = cnt & elig.any(-1)  # [B, q]
        b_idx, q_idx = dest.nonzero(as_tuple=True)
        if not len(b_idx):
            return
        # the null: a uniform draw among the eligible keys of each destination (one draw per position, shared by
        # the heads of a pass; the call's one generator, row by row in window order)
        w = elig[b_idx, q_idx].double()
        null_src = torch.multinomial(w.cpu(), 1, generator=self.gen).squeeze(1).to(dev)
        scale = torch.ones(len(b_idx), dtype=torch.float64, device=dev)
        if self.has_scale:
            scale = self.store["ln_final.hook_scale"].to(dev, torch.float64)[b_idx, q_idx, 0]
        window = (b_idx + start).cpu().numpy()
        pos = q_idx.cpu().numpy()
        nsrc = null_src.cpu().numpy()
        for lay, hs in self.sel.items():
            op = self.ops[lay]
            z = self.store[f"blocks.{lay}.attn.hook_z"][b_idx, q_idx].to(dev, torch.float64)  # [n, n_heads, d_head]
            pat = self.store[f"blocks.{lay}.attn.hook_pattern"]  # [B, n_heads, q, k]
            s = scale
            if lay in self.post_hooks:
                s = s * self.store[self.post_hooks[lay]].to(dev, torch.float64)[b_idx, q_idx, 0]
            srcs = {}
            for h in hs:
                p = pat[b_idx, h, q_idx].to(dev, torch.float64)  # [n, k]
                srcs[h] = torch.where(elig[b_idx, q_idx], p, torch.full_like(p, -1.0)).argmax(-1)
            pred = self._predicted(lay, hs, srcs, tb, b_idx, q_idx)
            for h in hs:
                j = op.index[h]
                src = srcs[h]
                zh = z[:, h]  # [n, d_head]
                mean = zh @ op.w_mean[j]
                std = ((zh @ op.G[j] * zh).sum(-1) - mean**2).clamp_min(0).sqrt()
                y = zh @ op.W_O[j]  # [n, d_model]: the head's output (before the scales)
                t_src, t_null = tb[b_idx, src], tb[b_idx, null_src]
                raw = (y * self.U_rows[t_src]).sum(-1)
                raw_null = (y * self.U_rows[t_null]).sum(-1)
                r = self.recs[(lay, h)]
                r["window"].append(window)
                r["pos"].append(pos)
                r["src"].append(src.cpu().numpy())
                r["tok"].append(t_src.cpu().numpy())
                r["eff"].append(((raw - mean) / std).cpu().numpy())
                r["nsrc"].append(nsrc)
                r["neff"].append(((raw_null - mean) / std).cpu().numpy())
                r["raw"].append((raw / s).cpu().numpy())
                r["pred"].append(pred.get(h, np.full(len(b_idx), -1, dtype=np.int8)))

    def _predicted(
        self,
        lay: int,
        hs: list[int],
        srcs: dict[int, torch.Tensor],
        tb: torch.Tensor,
        b_idx: torch.Tensor,
        q_idx: torch.Tensor,
    ) -> dict[int, np.ndarray]:
        """``{head: int8 [n]}``: 1 where the token at the head's source is among the ``k`` largest logits of the
        residual stream at the layer's input at the destination, 0 where not (module docstring); only the heads
        the condition is measured for."""
        want = [h for h in hs if h in self.predicted.get(lay, ())]
        if not want or self.predicted_k is None or self.U32_rows is None:
            return {}
        X = self.store[RESID_HOOK.format(l=lay)][b_idx, q_idx].to(self.U.device, torch.float64)  # [n, d_model]
        T = torch.stack([tb[b_idx, srcs[h]] for h in want], 1)  # [n, h]: the tokens at the SOURCES
        flags = top_k_flags(X, T, self.U, self.U_rows, self.U32_rows, self.predicted_k).cpu().numpy()
        return {h: flags[:, j].astype(np.int8) for j, h in enumerate(want)}
