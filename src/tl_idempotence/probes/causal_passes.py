"""The forward passes of the causal test of closure (:mod:`tl_idempotence.probes.causal`, SPEC 13): a clean pass per
batch of windows, then every edit batched, several to one forward pass.

**Batched edits.** After a batch's clean pass (``batch_size`` windows: the clean ``z``, attention pattern, final-norm
scale and logits), each window is run once per *chunk* of up to ``edits_per_pass`` edits: the window enters the model
with batch 1, its residual stream is repeated once per edit at ``blocks.{k}.hook_resid_pre`` (``k`` the chunk's first
edited layer) and each edit's ``hook_z`` change is applied to its own copy. Layers before ``k`` are computed once per
chunk instead of once per edit, and the copies share each matrix product. Chunks take the edits in layer order and
span at most :data:`MAX_LAYER_SPREAD` + 1 layers (an edit of a later layer in a chunk pays for the layers between).
The numbers are those of one forward pass per edit to float rounding (equal bit for bit where the model's products do
not depend on the batch: ``tests/unit/probes/test_causal.py`` compares both).

Each window's first chunk also holds an unedited copy whose logits are compared with the clean pass's (the largest
difference, logit units, is ``check_max_abs_diff`` of the summary). When a model refuses the repeated residual
(raises in a shared-prefix pass), or the unedited copy differs by more than :data:`CHECK_RTOL` times the window's
largest clean logit (:data:`HALF_CHECK_RTOL` for float16/bfloat16 models), that window and every later one are run
with the window repeated at the input instead (no shared prefix; ``batching`` of the summary says from which window).
``edits_per_pass=1`` is the unbatched path: one forward pass per edit and window, nothing shared, no check.

**Per copy** (counted destinations ``q`` of the window, float64): ``d = logits' - logits`` over the vocabulary; the
total change ``d[t]``, its standardization over the vocabulary, and the loss change
``log Σ_u softmax(logits)_u exp(d_u) - d[target]`` (= the edited minus the clean cross-entropy, without the
cancellation of two ~10-nat numbers). The direct change is the clean run's (no pass): module docstring of
:mod:`~tl_idempotence.probes.causal`.

**Threads.** A forward pass whose multiply-adds are below
:data:`~tl_idempotence.core.threads.SMALL_LAYER_MACS` runs on one torch thread unless the user chose a count
(:func:`~tl_idempotence.core.threads.threads_for`): tiny models' passes are several times faster so on a busy machine.
Bigger ones, on a CPU and unless the user chose, time the first window's first two chunks on one thread and on
torch's count and keep the faster per copy (as :func:`~tl_idempotence.probes.ablation.ablation` does): on a machine
whose cores are busy with other processes one thread is often several times faster. ``threads`` of the summary says
which count ran.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..core.threads import explicit_threads, threads_for
from .ablation.schedule import layer_cost

__all__ = [
    "CHECK_RTOL",
    "HALF_CHECK_RTOL",
    "LOGITS_BUDGET",
    "MAX_EDITS_PER_PASS",
    "MAX_LAYER_SPREAD",
    "Edit",
    "auto_edits_per_pass",
    "chunk_edits",
    "run_passes",
    "standardize",
]

#: Largest accepted |unedited copy - clean pass| of a window's logits, relative to its largest |clean logit| (at least
#: 1), for float32/float64 models.
CHECK_RTOL = 1e-4
#: The same for float16/bfloat16 models.
HALF_CHECK_RTOL = 5e-2
#: Logit elements one edited pass may hold (``copies x pos x d_vocab``): 512 MiB of float32 logits.
LOGITS_BUDGET = 1 << 27
#: Most edits in one forward pass (automatic choice).
MAX_EDITS_PER_PASS = 64
#: A chunk's edits lie within this many layers of its first edited layer.
MAX_LAYER_SPREAD = 2


@dataclass(frozen=True)
class Edit:
    """One planned edit: head ``head`` of layer ``layer``, ``variant`` (``closure_free``, ...), applied as ``kind``:
    ``"map"`` (``z <- z Nᵀ``, ``value = N [d_head, d_head]``), ``"zero"`` or ``"mean"`` (``value = z̄ [d_head]``)."""

    layer: int
    head: int
    variant: str
    kind: str
    value: Tensor | None

    @property
    def key(self) -> tuple[int, int, str]:
        return (self.layer, self.head, self.variant)


def auto_edits_per_pass(n_edits: int, seq_len: int, d_vocab: int) -> int:
    """Edits per forward pass chosen for the memory of the logits: at most :data:`LOGITS_BUDGET` logit elements (the
    unedited check copy included), :data:`MAX_EDITS_PER_PASS`, and the number of edits; at least 1."""
    room = LOGITS_BUDGET // max(1, int(seq_len) * int(d_vocab)) - 1
    return max(1, min(MAX_EDITS_PER_PASS, int(n_edits), room))


def chunk_edits(edits: list[Edit], per_pass: int) -> list[list[int]]:
    """The edits' indices in chunks (module docstring): layer order (the plan's order within a layer), at most
    ``per_pass`` a chunk, within :data:`MAX_LAYER_SPREAD` layers of the chunk's first."""
    order = sorted(range(len(edits)), key=lambda i: edits[i].layer)
    out: list[list[int]] = []
    cur: list[int] = []
    for i in order:
        if cur and (len(cur) >= per_pass or edits[i].layer - edits[cur[0]].layer > MAX_LAYER_SPREAD):
            out.append(cur)
            cur = []
        cur.append(i)
    if cur:
        out.append(cur)
    return out


def standardize(raw: Tensor, mean: Tensor, sq: Tensor) -> Tensor:
    """``(raw - mean) / std`` with ``std = sqrt(sq - mean²)`` (population); NaN where ``std`` is 0 to rounding."""
    std = (sq - mean**2).clamp_min(0).sqrt()
    ok = std > 1e-12 * (sq.abs().sqrt() + 1e-300)
    return torch.where(
        ok, (raw - mean) / torch.where(ok, std, torch.ones_like(std)), torch.full_like(raw, float("nan"))
    )


def standardize_var(raw: Tensor, mean: Tensor, var: Tensor) -> Tensor:
    """``(raw - mean) / sqrt(var)`` (population variance); NaN where ``var`` is 0 to rounding (relative to
    ``var + mean²``, as :func:`standardize`)."""
    std = var.clamp_min(0).sqrt()
    ok = std > 1e-12 * ((var + mean**2).abs().sqrt() + 1e-300)
    return torch.where(
        ok, (raw - mean) / torch.where(ok, std, torch.ones_like(std)), torch.full_like(raw, float("nan"))
    )


def _repeat_hook(n: int) -> Callable[..., Tensor]:
    def hook(x: Tensor, hook: Any = None) -> Tensor:
        return x.repeat(n, *([1] * (x.ndim - 1)))

    return hook


def _z_hook(copies: list[tuple[int, Edit, Tensor | None]]) -> Callable[..., Tensor]:
    """``hook_z`` change of one layer: copy ``k`` of the batch gets its edit's head changed (``value`` already in the
    model's dtype and device)."""

    def hook(z: Tensor, hook: Any = None) -> Tensor:
        z = z.clone()
        for k, e, value in copies:
            if e.kind == "map":
                assert value is not None
                z[k, :, e.head] = z[k, :, e.head] @ value.T
            elif e.kind == "zero":
                z[k, :, e.head] = 0.0
            else:
                assert value is not None
                z[k, :, e.head] = value
        return z

    return hook


class _Threads:
    """torch's thread count for the edited passes (module docstring, "Threads"): on a CPU, unless the user chose the
    count or the passes are small, the first window's chunk 0 runs on one thread and chunk 1 on torch's count; the
    faster per copy (torch's count on a tie) runs every later pass; :meth:`restore` puts torch's count back."""

    def __init__(self, device: Any, n_chunks: int) -> None:
        self.n = torch.get_num_threads()
        self.tune = torch.device(device).type == "cpu" and self.n > 1 and n_chunks >= 2 and not explicit_threads()
        self.per_copy: dict[int, float] = {}

    def _trying(self, ci: int) -> bool:
        return self.tune and ci < 2 and len(self.per_copy) < 2

    def before(self, ci: int) -> None:
        if self._trying(ci):
            torch.set_num_threads(1 if ci == 0 else self.n)

    def after(self, ci: int, seconds_per_copy: float) -> None:
        if self._trying(ci):
            self.per_copy[torch.get_num_threads()] = seconds_per_copy
            if len(self.per_copy) == 2:
                torch.set_num_threads(1 if self.per_copy[1] < self.per_copy[self.n] else self.n)

    def restore(self) -> None:
        torch.set_num_threads(self.n)


@dataclass
class _State:
    """What every pass of one :func:`run_passes` call shares."""

    model: Any
    edits: list[Edit]
    values: list[Tensor | None]
    chunks: list[list[int]]
    device: Any
    check: bool
    rtol: float
    mode: str = "shared prefix"
    fallback_window: int | None = None
    max_diff: float = float("nan")
    threads: _Threads = field(default_factory=lambda: _Threads("cpu", 0))

    def forward(self, x1: Tensor, chunk: list[int], check: bool, shared: bool) -> Tensor:
        """One window ``x1 [1, pos]`` under the chunk's edits (copy 0 unedited when ``check``): ``[copies, pos,
        d_vocab]`` logits."""
        off = int(check)
        n = len(chunk) + off
        by_layer: dict[int, list[tuple[int, Edit, Tensor | None]]] = {}
        for k, i in enumerate(chunk):
            by_layer.setdefault(self.edits[i].layer, []).append((k + off, self.edits[i], self.values[i]))
        hooks: list[tuple[str, Any]] = [(f"blocks.{lay}.attn.hook_z", _z_hook(c)) for lay, c in by_layer.items()]
        x = x1
        if n > 1:
            if shared:
                hooks.insert(0, (f"blocks.{min(by_layer)}.hook_resid_pre", _repeat_hook(n)))
            else:
                x = x1.repeat(n, 1)
        logits = self.model.run_with_hooks(x, fwd_hooks=hooks, return_type="logits").detach()
        if logits.shape[0] != n:
            raise RuntimeError(f"the model returned {logits.shape[0]} sequences for {n} edited copies")
        return logits

    def first_chunk(self, x1: Tensor, clean_w: Tensor, window: int) -> Tensor:
        """The window's first chunk, its unedited copy checked against the clean pass (module docstring); falls back
        to the repeated input (this window and every later one) when the shared prefix is refused or differs.

        Raises:
            RuntimeError: the unedited copy differs from the clean pass with the input repeated too (the model's
                output depends on the batch); whatever the model raises with the input repeated.
        """
        tol = self.rtol * max(1.0, float(clean_w.abs().max()))
        if self.mode == "shared prefix":
            try:
                logits = self.forward(x1, self.chunks[0], True, True)
                diff = float((logits[0] - clean_w).abs().max())
                if diff <= tol:
                    self._record(diff)
                    return logits
            except Exception:  # noqa: BLE001 - the model refused the repeated residual: the input repeated instead
                pass
            self.mode, self.fallback_window = "repeated input", window
        logits = self.forward(x1, self.chunks[0], True, False)
        diff = float((logits[0] - clean_w).abs().max())
        if not diff <= tol:
            raise RuntimeError(
                f"causal_closure: window {window}'s unedited copy differs from the clean pass by {diff:.3g} logits "
                f"(> {tol:.3g}) with the input repeated: the model's output depends on the batch; run with "
                "edits_per_pass=1."
            )
        self._record(diff)
        return logits

    def _record(self, diff: float) -> None:
        self.max_diff = diff if not np.isfinite(self.max_diff) else max(self.max_diff, diff)


def _copy_changes(
    e: Tensor, c64: Tensor, p_c: Tensor, log_norm: Tensor, t: Tensor, target: Tensor, bufs: tuple[Tensor, Tensor]
) -> tuple[Tensor, Tensor, Tensor]:
    """One copy's changes at a window's counted destinations (module docstring, "Per copy"): ``(total, total_std,
    loss)``, each ``[n_q]`` float64, from its logits ``e [n_q, d_vocab]`` (the model's dtype), the clean ones ``c64``
    (float64), their softmax ``p_c`` and the log of its sum as the products below round it (``log_norm``), the
    attended tokens ``t`` and the next tokens ``target``. ``bufs``: two ``[n_q, d_vocab]`` float64 buffers
    (overwritten)."""
    d, ex = bufs
    torch.sub(e.to(d.device), c64, out=d)  # float64, as the difference of the two logits in float64
    total = d.gather(1, t[:, None])[:, 0]
    var, mean = torch.var_mean(d, 1, correction=0)
    total_std = standardize_var(total, mean, var)
    torch.exp(d, out=ex)
    s = torch.bmm(ex.unsqueeze(1), p_c.unsqueeze(2))[:, 0, 0]  # Σ_u softmax(clean)_u exp(d_u)
    lse = torch.log(s)
    bad = ~(torch.isfinite(s) & (s > 0))
    if bool(bad.any()):  # d beyond exp's range in float64: those rows shifted by their maximum
        db = d[bad]
        m = db.max(1).values
        lse[bad] = torch.log((p_c[bad] * torch.exp(db - m[:, None])).sum(1)) + m
    lse = lse - log_norm  # lse(logits') - lse(logits): exactly 0 where d is 0 (the softmax's sum, rounded as s is)
    return total, total_std, lse - d.gather(1, target[:, None])[:, 0]


def _clean_hooks(layers: list[int], has_scale: bool, store: dict[str, Tensor]) -> list[tuple[str, Any]]:
    def keep(name: str) -> Any:
        def hook(x: Tensor, hook: Any = None) -> None:
            store[name] = x.detach()

        return hook

    names = [f"blocks.{lay}.attn.hook_{w}" for lay in layers for w in ("z", "pattern")]
    names += ["ln_final.hook_scale"] if has_scale else []
    return [(n, keep(n)) for n in names]


def _pass_macs(model: Any, seq_len: int, copies: int) -> int:
    """Multiply-adds of one edited pass (an estimate, for the thread choice)."""
    block, unembed = layer_cost(model.cfg)
    return int(copies * seq_len * (int(model.cfg.n_layers) * block + unembed))


def run_passes(
    model: Any, toks: Tensor, counted: Tensor, edits: list[Edit], W_O: dict[int, Tensor], U: Tensor,
    has_scale: bool, batch_size: int, per_pass: int, bar: Any,
) -> tuple[dict[tuple[int, int, str], dict[str, list[np.ndarray]]], dict[str, Any]]:  # fmt: skip
    """Every batch of windows: a clean pass, then the edits batched per window (module docstring).

    Args:
        model: the TransformerLens model (eval mode). toks, counted: ``[n_windows, pos]`` int64 / bool.
        edits: the planned edits (``"mean"`` values filled). W_O: ``{layer: [n_heads, d_head, d_model]}`` float64.
        U: ``[d_model, d_vocab]`` float64, the final norm's linear part applied to ``W_U``. has_scale: the model has
            ``ln_final.hook_scale``. batch_size: windows per clean pass. per_pass: edits per forward pass (1: the
            unbatched path). bar: the progress bar (one step per forward pass).

    Returns:
        ``(records, info)``: per edit key ``(layer, head, variant)`` its per-position arrays (``window, pos,
        source_pos, token, total, total_std, direct, direct_std, self_repair, loss``; one array per batch, in window
        and position order), and ``info`` (``batching``, ``edits_per_pass``, ``check_max_abs_diff``, ``threads``:
        torch's thread count of the edited passes).

    Raises:
        RuntimeError: the model returned another number of sequences than copies, or its output depends on the batch
            (:meth:`_State.first_chunk`). Whatever the model raises.
    """
    dev = U.device
    device = getattr(model.cfg, "device", None) or "cpu"
    dtype = getattr(model.cfg, "dtype", torch.float32)
    u_bar = U.mean(1)
    C = (U @ U.T) / U.shape[1]
    layers = sorted({e.layer for e in edits})
    chunks = chunk_edits(edits, per_pass)
    values = [None if e.value is None else e.value.to(device=device, dtype=dtype) for e in edits]
    st = _State(
        model, edits, values, chunks, device, check=per_pass > 1,
        rtol=HALF_CHECK_RTOL if dtype in (torch.float16, torch.bfloat16) else CHECK_RTOL,
    )  # fmt: skip
    store: dict[str, Tensor] = {}
    fwd = _clean_hooks(layers, has_scale, store)
    recs: dict[tuple[int, int, str], dict[str, list[np.ndarray]]] = {e.key: {} for e in edits}
    P = int(toks.shape[1])
    with threads_for(_pass_macs(model, P, max(len(c) for c in chunks) + st.check if chunks else 1)):
        st.threads = _Threads(device, len(chunks))
        try:
            for start in range(0, len(toks), batch_size):
                batch = toks[start : start + batch_size].to(device)
                cnt = counted[start : start + batch_size].to(dev)
                store.clear()
                clean = model.run_with_hooks(batch, fwd_hooks=fwd, return_type="logits").detach()
                bar.update(1)
                _batch(st, batch, cnt, clean, store, start, W_O, U, u_bar, C, has_scale, recs, bar)
            threads = torch.get_num_threads()
        finally:
            st.threads.restore()
    info = {
        "batching": (
            "one edit per pass" if per_pass == 1
            else st.mode if st.fallback_window is None
            else f"repeated input from window {st.fallback_window}"
        ),
        "edits_per_pass": int(per_pass),
        "check_max_abs_diff": st.max_diff,
        "threads": threads,
    }  # fmt: skip
    return recs, info


def _batch(
    st: _State, batch: Tensor, cnt: Tensor, clean: Tensor, store: dict[str, Tensor], start: int,
    W_O: dict[int, Tensor], U: Tensor, u_bar: Tensor, C: Tensor, has_scale: bool, recs: dict, bar: Any,
) -> None:  # fmt: skip
    """One batch of windows after its clean pass: the clean side of every edit (source, token, direct change), then
    each window's chunks of edits (total change, loss change), appended to ``recs``."""
    dev = U.device
    B, P = batch.shape
    elig = torch.ones(P, P, dtype=torch.bool, device=dev).tril().unsqueeze(0) & cnt.unsqueeze(1)
    b_idx, q_idx = (cnt & elig.any(-1)).nonzero(as_tuple=True)
    n = len(b_idx)
    tb = batch.to(dev)
    scale = (
        store["ln_final.hook_scale"].to(dev, torch.float64)[b_idx, q_idx, 0]
        if has_scale
        else torch.ones(n, dtype=torch.float64, device=dev)
    )
    nxt = (q_idx + 1).clamp(max=P - 1)
    has_next = (q_idx + 1 < P) & cnt[b_idx, nxt]
    target = tb[b_idx, nxt]
    side: list[dict[str, Tensor]] = []
    for e in st.edits:
        z = store[f"blocks.{e.layer}.attn.hook_z"][b_idx, q_idx, e.head].to(dev, torch.float64)  # [n, d_head]
        pat = store[f"blocks.{e.layer}.attn.hook_pattern"][b_idx, e.head, q_idx].to(dev, torch.float64)  # [n, k]
        src = torch.where(elig[b_idx, q_idx], pat, torch.full_like(pat, -1.0)).argmax(-1)
        if e.kind == "map":
            assert e.value is not None
            z_new = z @ e.value.to(dev, torch.float64).T
        elif e.kind == "zero":
            z_new = torch.zeros_like(z)
        else:
            assert e.value is not None
            z_new = e.value.to(dev, torch.float64).expand_as(z)
        y = ((z_new - z) @ W_O[e.layer][e.head]) / scale[:, None]  # [n, d_model], before the norm's linear part
        t = tb[b_idx, src]
        direct = (y * U[:, t].T).sum(-1)
        side.append({
            "src": src, "t": t, "direct": direct, "direct_std": standardize(direct, y @ u_bar, (y @ C * y).sum(-1)),
            "total": torch.full((n,), float("nan"), dtype=torch.float64, device=dev),
            "total_std": torch.full((n,), float("nan"), dtype=torch.float64, device=dev),
            "loss": torch.full((n,), float("nan"), dtype=torch.float64, device=dev),
        })  # fmt: skip
    for w in range(B):
        rows = (b_idx == w).nonzero(as_tuple=True)[0]
        if not len(rows):
            continue
        qs = q_idx[rows]
        c64 = clean[w, qs.to(clean.device)].to(dev, torch.float64)  # [n_q, d_vocab]
        p_c = torch.softmax(c64, -1)
        bufs = (torch.empty_like(c64), torch.empty_like(c64))  # reused by every copy: no allocation per copy
        log_norm = torch.log(torch.bmm(torch.ones_like(p_c).unsqueeze(1), p_c.unsqueeze(2))[:, 0, 0])
        x1 = batch[w : w + 1]
        for ci, chunk in enumerate(st.chunks):
            st.threads.before(ci)
            t0 = time.perf_counter()
            if ci == 0 and st.check:
                logits, off = st.first_chunk(x1, clean[w], start + w), 1
            else:
                logits, off = st.forward(x1, chunk, False, st.mode == "shared prefix"), 0
            st.threads.after(ci, (time.perf_counter() - t0) / (len(chunk) + off))
            bar.update(1)
            for k, i in enumerate(chunk):
                s = side[i]
                total, total_std, loss = _copy_changes(
                    logits[k + off, qs.to(logits.device)], c64, p_c, log_norm, s["t"][rows], target[rows], bufs
                )
                s["total"][rows] = total
                s["total_std"][rows] = total_std
                s["loss"][rows] = torch.where(has_next[rows], loss, torch.full_like(loss, float("nan")))
    for e, s in zip(st.edits, side, strict=True):
        r = recs[e.key]
        for key, val in (
            ("window", b_idx + start), ("pos", q_idx), ("source_pos", s["src"]), ("token", s["t"]),
            ("total", s["total"]), ("total_std", s["total_std"]), ("direct", s["direct"]),
            ("direct_std", s["direct_std"]), ("self_repair", s["direct"] - s["total"]), ("loss", s["loss"]),
        ):  # fmt: skip
            r.setdefault(key, []).append(val.cpu().numpy())
