"""The hooked forward passes of an ablation: a clean pass, then every head set batched on each window.

Sections "Ablation", "Loss", "Batched head sets" and "Threads" of the :mod:`tl_idempotence.probes.ablation` package
docstring (the "module docstring" below) define what runs here: :func:`next_token_losses` is the loss;
:func:`set_losses` runs the clean pass (the means of ``z`` for ``kind="mean"``), then the chunks of
:class:`~tl_idempotence.probes.ablation.schedule.Schedule` on every window, checking the shared prefix against the
clean pass and falling back to repeating the input, and choosing torch's thread count on window 0.
An error raised while hooks of the user's are registered is never taken for the model refusing the repeated
residual: it propagates, with a note (:func:`_registered_hooks`, :func:`_checked_forward`).
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from ...core.threads import explicit_threads
from .schedule import Schedule

__all__ = ["CHECK_TOLERANCE", "CHECK_TOLERANCES", "next_token_loss", "next_token_losses", "run_sets", "set_losses"]

#: Largest accepted |loss(empty set in a batched pass) − loss(clean pass)| per window, nats per token, for
#: float32/float64 models (half precision: :data:`_HALF_CHECK_TOLERANCE`).
CHECK_TOLERANCE = 1e-3
_HALF_CHECK_TOLERANCE = 5e-2
#: Every tolerance a run checks with (a saved ablation's ``check_tolerance`` is one of them).
CHECK_TOLERANCES = (CHECK_TOLERANCE, _HALF_CHECK_TOLERANCE)


def next_token_losses(
    logits: Float[Tensor, "batch pos vocab"], tokens: Int[Tensor, "#batch pos"], counted: Bool[Tensor, "#batch pos"]
) -> tuple[Float[Tensor, " batch"], Int[Tensor, " batch"]]:  # type: ignore[name-defined]
    """Per sequence: the sum of next-token cross-entropies (nats, float64) over counted targets, and their number.

    Position ``p``'s logits predict ``tokens[:, p + 1]``; a target counts when ``counted[:, p + 1]``
    (the ablation loss of the module docstring; not a SPEC quantity). Cross-entropies are computed
    in float32 and summed in float64.

    Args:
        logits: ``[batch, pos, d_vocab]`` (any float dtype).
        tokens: ``[batch, pos]`` int64 ids; counted: ``[batch, pos]`` bool (either may have batch 1: the same
            window under every head set).

    Returns:
        ``(sums [batch] float64 nats, counts [batch] int64)`` on the logits' device.

    Raises:
        Nothing of its own (internal; the caller checked the shapes).
    """
    b, pos, vocab = logits.shape
    tgt = tokens[:, 1:].expand(b, pos - 1)
    ce = torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, vocab).float(), tgt.reshape(-1), reduction="none"
    ).view(b, pos - 1)
    mask = counted[:, 1:].expand(b, pos - 1)
    return torch.where(mask, ce, torch.zeros_like(ce)).double().sum(1), mask.sum(1)


def next_token_loss(
    logits: Float[Tensor, "batch pos vocab"], tokens: Int[Tensor, "batch pos"], counted: Bool[Tensor, "batch pos"]
) -> tuple[float, int]:
    """Sum of the next-token cross-entropies (nats, float64) over counted target positions, and their number.

    Position ``p``'s logits predict ``tokens[:, p + 1]``; a target counts when ``counted[:, p + 1]``
    (the ablation check of the module docstring; not a SPEC quantity).

    Args:
        logits: ``[batch, pos, d_vocab]`` (any float dtype; evaluated in float32).
        tokens: ``[batch, pos]`` int64 ids; counted: ``[batch, pos]`` bool.

    Returns:
        ``(sum of cross-entropies in nats, number of counted targets)``.

    Raises:
        Nothing of its own (internal; the caller checked the shapes).
    """
    ce = torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]).float(), tokens[:, 1:].reshape(-1), reduction="none"
    )
    mask = counted[:, 1:].reshape(-1)
    return float(ce[mask].double().sum()), int(mask.sum())


def _z_hook(mask: Bool[Tensor, "sets n_heads"], value: Tensor | None) -> Any:
    """hook_z replacement for a batch of sets: copy ``i`` of the batch gets ``mask[i]``'s heads replaced."""

    def hook(z: Tensor, hook: Any = None) -> Tensor:
        m = mask.to(z.device)[:, None, :, None]
        v = z.new_zeros(()) if value is None else value.to(device=z.device, dtype=z.dtype)
        return torch.where(m, v, z)

    return hook


def _repeat_hook(n: int) -> Any:
    def hook(x: Tensor, hook: Any = None) -> Tensor:
        return x.repeat(n, *([1] * (x.ndim - 1)))

    return hook


#: packages whose torch hooks are the model's own (a TransformerBridge keeps plain torch hooks on its wrapped modules;
#: a hook point's ``add_hook`` registers a wrapper defined in transformer_lens): not the user's
_LIBRARY_HOOK_PACKAGES = ("transformer_lens", "torch", "transformers", "accelerate", "tl_idempotence")


def _users_torch_hook(fn: Any) -> bool:
    """Whether a torch hook callable is the user's: defined outside :data:`_LIBRARY_HOOK_PACKAGES` (a
    ``functools.partial`` is judged by the function it wraps)."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    module = getattr(fn, "__module__", None) or getattr(type(fn), "__module__", "") or ""
    return module.split(".")[0] not in _LIBRARY_HOOK_PACKAGES


def _registered_hooks(model: Any) -> list[str]:
    """Names of the model's modules that hold hooks of the user's: TransformerLens forward hooks (``model.add_hook``,
    a ``hooks()`` context: a hook point's ``fwd_hooks``) and plain torch forward / forward-pre hooks
    (``module.register_forward_hook``; torch's global module hooks are listed as ``"<global torch hook>"``)
    whose function is defined outside transformer_lens, torch and transformers. Before :func:`ablation` adds its
    own, every one is the user's; hooks a ``TransformerBridge`` keeps on its wrapped modules for its own use are
    defined in transformer_lens and not counted.

    Args:
        model: a TransformerLens model (a ``torch.nn.Module`` whose hook points have ``fwd_hooks`` lists).

    Returns:
        The module names, in ``named_modules`` order (empty when no hook is registered).

    Raises:
        Nothing of its own.
    """
    from torch.nn.modules import module as torch_module

    names = []
    for name, mod in model.named_modules():
        torch_hooks = [*mod._forward_hooks.values(), *mod._forward_pre_hooks.values()]
        if getattr(mod, "fwd_hooks", None) or any(_users_torch_hook(f) for f in torch_hooks):
            names.append(name)
    global_hooks = [
        *getattr(torch_module, "_global_forward_hooks", {}).values(),
        *getattr(torch_module, "_global_forward_pre_hooks", {}).values(),
    ]
    if any(_users_torch_hook(f) for f in global_hooks):
        names.append("<global torch hook>")
    return names


@dataclass
class _Passes:
    """What the passes of one :func:`set_losses` call share, and the losses they fill in.

    Attributes:
        model, toks, counted: the model and its windows (``[n_windows, pos]``, checked by the caller).
        schedule: the chunks of head sets (set 0 is the empty set). device: where the windows go.
        user_hooks: the hook points holding the user's hooks when the call began (:func:`_registered_hooks`).
        clean: ``[n_windows]`` summed clean losses; n_tok: ``[n_windows]`` counted targets;
        losses: ``[sets, n_windows]`` summed losses of every set (NaN until run).
        value: per ablated layer, the replacement of ``z`` (``[n_heads, d_head]`` clean means, or None: zeros).
        mode: ``"shared prefix"``, or ``"repeated input"`` from ``fallback_window`` on.
        seconds_per_set: the last forward pass's seconds per head set (the thread choice reads it).
    """

    model: Any
    toks: Tensor
    counted: Tensor
    schedule: Schedule
    device: Any
    user_hooks: list[str]
    clean: np.ndarray
    n_tok: np.ndarray
    losses: np.ndarray
    value: dict[int, Tensor | None] = field(default_factory=dict)
    mode: str = "shared prefix"
    fallback_window: int | None = None
    seconds_per_set: float = 0.0

    @staticmethod
    def start(model: Any, toks: Tensor, counted: Tensor, sets: list[dict[int, list[int]]], batch_size: int) -> _Passes:
        """The passes of ``sets`` (the empty set put first, as the check), before any forward pass."""
        user_hooks = _registered_hooks(model)  # before any of ours: every one is the user's
        n_w = int(toks.shape[0])
        all_sets: list[dict[int, list[int]]] = [{}, *sets]  # 0: the check (nothing ablated)
        per_forward = max(1, min(batch_size, len(all_sets)))
        return _Passes(
            model=model,
            toks=toks,
            counted=counted,
            schedule=Schedule(all_sets, per_forward, model.cfg),
            device=getattr(model.cfg, "device", None) or "cpu",
            user_hooks=user_hooks,
            clean=np.zeros(n_w),
            n_tok=np.zeros(n_w, dtype=np.int64),
            losses=np.full((len(all_sets), n_w), np.nan),
        )

    @property
    def n_windows(self) -> int:
        return int(self.toks.shape[0])


class _Bar:
    """The progress bar over forward passes, with a time estimate after the first clean forward and another after
    window 0's ablated passes (from the schedule's multiply-add counts)."""

    def __init__(self, passes: _Passes, n_sets: int, batch_size: int, progress: bool, desc: str) -> None:
        from ...core.progress import progress_bar

        n_w, schedule = passes.n_windows, passes.schedule
        n_clean = (n_w + batch_size - 1) // batch_size
        self.desc = f"{desc}: {n_sets} head sets x {n_w} windows"
        self.bar = progress_bar(
            total=n_clean + n_w * len(schedule.chunks),
            desc=f"{self.desc}, clean pass (time estimate next)",
            unit="forward",
            enabled=progress,
        )
        pos = int(passes.toks.shape[1])
        self.clean_cost = pos * n_w * schedule.forward_cost(1, 0)
        self.ablated_cost = pos * n_w * schedule.cost()

    def first_clean_forward(self, done: float, frac: float) -> None:
        """The estimate after the first clean forward, which took ``done`` s for ``frac`` of the windows."""
        est = done / max(frac * self.clean_cost, 1.0) * (self.clean_cost + self.ablated_cost)
        self.bar.set_description(f"{self.desc}, ~{est:.0f} s in all (estimated from the first forward)")

    def first_window(self, left: float) -> None:
        """The estimate after window 0's ablated passes: ``left`` s in all."""
        self.bar.set_description(f"{self.desc}, ~{left:.0f} s in all (estimated from the first window)")


class _Threads:
    """torch's thread count for the ablated passes (module docstring, "Threads"): on a CPU, unless the user chose
    the count, window 0's first two (full) chunks run on one thread, then on torch's count; the faster (torch's
    count on a tie) runs every later pass; :meth:`restore` puts torch's count back."""

    def __init__(self, device: Any, schedule: Schedule) -> None:
        self.n_threads = torch.get_num_threads()
        on_cpu = torch.device(device).type == "cpu"
        # two full chunks of window 0 time the two counts: one thread first (a first-pass overhead counts against
        # it, so a close call keeps torch's count), then torch's count
        self.tune = on_cpu and self.n_threads > 1 and schedule.two_full_chunks() and not explicit_threads()
        self.per_set_s: dict[int, float] = {}  # seconds per head set and window, by thread count (window 0's chunks)

    def _trying(self, w: int, ci: int) -> bool:
        return self.tune and w == 0 and ci < 2

    def before(self, w: int, ci: int) -> None:
        """Before chunk ``ci`` of window ``w``: window 0's chunk 0 on one thread, chunk 1 on torch's count."""
        if self._trying(w, ci):
            torch.set_num_threads(1 if ci == 0 else self.n_threads)

    def after(self, w: int, ci: int, seconds_per_set: float) -> None:
        """After chunk ``ci`` of window ``w``: its time recorded; after window 0's chunk 1, the faster count kept."""
        if self._trying(w, ci):
            self.per_set_s[torch.get_num_threads()] = seconds_per_set
            if ci == 1:  # keep the faster for every later forward pass (torch's count on a tie)
                torch.set_num_threads(1 if self.per_set_s[1] < self.per_set_s[self.n_threads] else self.n_threads)

    def restore(self) -> None:
        torch.set_num_threads(self.n_threads)


def _clean_pass(passes: _Passes, kind: str, batch_size: int, bar: _Bar) -> None:
    """The clean pass, ``batch_size`` windows a forward: each window's summed loss and counted targets and, with
    ``kind="mean"``, the mean of ``z`` of every ablated layer over the counted positions (``passes.value``; None,
    zeros, for ``"zero"`` or when nothing is counted)."""
    toks, counted, n_w, layers = passes.toks, passes.counted, passes.n_windows, passes.schedule.layers
    n_heads, d_head = int(passes.model.cfg.n_heads), int(passes.model.cfg.d_head)
    sums = {layer: torch.zeros(n_heads, d_head, dtype=torch.float64) for layer in layers}
    cur: dict[str, Tensor] = {}

    def mean_hook(layer: int) -> tuple[str, Any]:
        def hook(z: Tensor, hook: Any = None) -> None:
            m = cur["counted"].to(z.device)
            sums[layer] += z.detach()[m].double().sum(0).cpu()

        return f"blocks.{layer}.attn.hook_z", hook

    t_clean = time.perf_counter()
    clean_hooks = [mean_hook(layer) for layer in layers] if kind == "mean" else []
    for start in range(0, n_w, batch_size):
        batch = toks[start : start + batch_size].to(passes.device)
        cur["counted"] = counted[start : start + batch_size]
        logits = passes.model.run_with_hooks(batch, fwd_hooks=clean_hooks, return_type="logits").detach()
        s, k = next_token_losses(logits, batch, cur["counted"].to(logits.device))
        passes.clean[start : start + len(batch)] = s.cpu().numpy()
        passes.n_tok[start : start + len(batch)] = k.cpu().numpy()
        del logits
        bar.bar.update(1)
        if start == 0:
            bar.first_clean_forward(time.perf_counter() - t_clean, min(batch_size, n_w) / n_w)
    n_mean = float(counted.sum())
    passes.value = {layer: (sums[layer] / n_mean if kind == "mean" and n_mean else None) for layer in layers}


def _check_tolerance(cfg: Any) -> float:
    """:data:`CHECK_TOLERANCE`, or the half-precision one for a float16/bfloat16 model."""
    half = getattr(cfg, "dtype", None) in (torch.float16, torch.bfloat16)
    return _HALF_CHECK_TOLERANCE if half else CHECK_TOLERANCE


def _forward(passes: _Passes, w: int, ci: int, shared: bool) -> np.ndarray:
    """Window ``w`` under the head sets of chunk ``ci``, one forward pass: their summed losses (float64 nats).

    With ``shared`` the window enters with batch 1 and its residual stream is repeated at the schedule's start
    block; otherwise the window is repeated at the input. Each set's heads get ``passes.value`` at ``hook_z``.

    Raises:
        RuntimeError: the model returned another number of sequences than sets; whatever the model raises.
    """
    schedule = passes.schedule
    n = len(schedule.chunks[ci])
    masks = schedule.masks[ci]
    hooks = [
        (f"blocks.{layer}.attn.hook_z", _z_hook(masks[layer], passes.value[layer]))
        for layer in schedule.layers
        if bool(masks[layer].any())  # a layer this chunk leaves alone gets no hook
    ]
    x = passes.toks[w : w + 1].to(passes.device)
    if shared:
        hooks.insert(0, (f"blocks.{schedule.start}.hook_resid_pre", _repeat_hook(n)))
    else:
        x = x.repeat(n, 1)
    t = time.perf_counter()
    logits = passes.model.run_with_hooks(x, fwd_hooks=hooks, return_type="logits").detach()
    passes.seconds_per_set = (time.perf_counter() - t) / n
    if logits.shape[0] != n:
        raise RuntimeError(f"the model returned {logits.shape[0]} sequences for {n} head sets")
    s, _ = next_token_losses(logits, x[:1], passes.counted[w : w + 1].to(logits.device))
    return s.cpu().numpy()


def _note_users_hooks(e: BaseException, w: int, user_hooks: list[str]) -> None:
    """Say on ``e`` (Python >= 3.11) that it was raised while the user's hooks were registered, and is not retried."""
    if hasattr(e, "add_note"):  # Python >= 3.11
        e.add_note(
            f"tli.ablation: raised in a shared-prefix pass (window {w}) while hooks of yours "
            f"are registered on the model ({', '.join(user_hooks[:5])}"
            f"{', ...' if len(user_hooks) > 5 else ''}); it is not retried with the input "
            "repeated. Remove them (model.reset_hooks(including_permanent=True)) if they "
            "should not run."
        )


def _checked_forward(passes: _Passes, w: int, tol: float) -> np.ndarray:
    """Chunk 0 of window ``w`` (it holds the empty set) with the shared prefix, its empty set checked against the
    clean pass; when the model refuses the repeated residual (raises) or the empty set differs by more than
    ``tol`` nats per token, the chunk is rerun with the input repeated, and so is every later window.

    Raises:
        Whatever the shared-prefix pass raises while hooks of the user's are registered (never taken for a
        refusal: with a note, not retried), and whatever the repeated-input pass raises.
    """
    ch = passes.schedule.chunks[0]
    try:
        got = _forward(passes, w, 0, True)
        ok = passes.n_tok[w] == 0 or abs(got[ch.index(0)] - passes.clean[w]) / passes.n_tok[w] <= tol
    except Exception as e:
        if passes.user_hooks:  # the user's hooks ran in this pass: their error is never taken for a refusal
            _note_users_hooks(e, w, passes.user_hooks)
            raise
        ok = False  # the model refused the repeated residual: repeat the input (re-raises if it fails)
    if not ok:
        passes.mode, passes.fallback_window = "repeated input", w
        got = _forward(passes, w, 0, False)
    return got


def _ablated_passes(passes: _Passes, threads: _Threads, bar: _Bar, tol: float, t0: float) -> None:
    """Every window under every chunk of head sets (``passes.losses``), the first chunk checked while the prefix
    is shared; torch's thread count chosen on window 0."""
    t_ablated = time.perf_counter()
    n_w, chunks = passes.n_windows, passes.schedule.chunks
    for w in range(n_w):
        for ci, ch in enumerate(chunks):
            threads.before(w, ci)
            if ci == 0 and passes.mode == "shared prefix":  # the chunk with the empty set: checked
                got = _checked_forward(passes, w, tol)
            else:
                got = _forward(passes, w, ci, passes.mode == "shared prefix")
            passes.losses[ch, w] = got
            bar.bar.update(1)
            threads.after(w, ci, passes.seconds_per_set)
        if w == 0:
            done = time.perf_counter() - t_ablated
            bar.first_window(done * (n_w - 1) + (time.perf_counter() - t0))


def _run_record(passes: _Passes, tol: float, used: int, threads: _Threads, t0: float) -> dict[str, Any]:
    """The passes' record (:func:`set_losses`' ``info``): batching mode, fallback window, the empty set's largest
    difference from the clean pass (nats per token; NaN when no window has a counted target), threads, seconds."""
    with np.errstate(invalid="ignore", divide="ignore"):
        diff = np.abs(passes.losses[0] - passes.clean) / passes.n_tok
    diff = diff[passes.n_tok > 0]
    return {
        "batching": passes.mode,
        "fallback_window": passes.fallback_window,
        "check_max_abs_diff": float(diff.max()) if diff.size else float("nan"),
        "check_tolerance": tol,
        "threads": used,
        "threads_seconds_per_set": {str(n): round(v, 4) for n, v in sorted(threads.per_set_s.items())},
        "seconds": time.perf_counter() - t0,
    }


def set_losses(
    model: Any,
    toks: Int[Tensor, "n_windows pos"],
    counted: Bool[Tensor, "n_windows pos"],
    sets: list[dict[int, list[int]]],
    *,
    kind: str = "mean",
    batch_size: int = 8,
    progress: bool = False,
    desc: str = "ablation",
) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
    """Per window: the clean loss and the loss with each head set ablated at ``hook_z`` (batched; module docstring).

    Args:
        model: a causal TransformerLens model (checked by :func:`~tl_idempotence.probes.ablation.ablation`).
        toks: ``[n_windows, pos]`` int64 token ids; counted: ``[n_windows, pos]`` bool, the targets that count.
        sets: head sets ``{layer: heads}`` to ablate (an empty dict: nothing ablated).
        kind: ``"mean"`` or ``"zero"`` (the mean is taken over the counted positions of the clean pass,
            for every head of every layer some set ablates).
        batch_size: sequences per forward pass: windows in the clean pass, head sets of one window after it.
        progress: a tqdm bar over forward passes, with a time estimate after the first clean forward.
        desc: the bar's label.

    Returns:
        ``(clean [n_windows], losses [n_sets, n_windows], n_tokens [n_windows], info)``: summed
        cross-entropies (float64 nats) per window and the counted targets per window; ``info`` has
        ``batching`` (``"shared prefix"`` or ``"repeated input"``, the mode at the end), ``fallback_window`` (the
        window from which the input was repeated, or None), ``check_max_abs_diff`` (nats per
        token, the empty set against the clean pass; NaN when no window has a counted target),
        ``threads`` (the count the ablated passes ran on after window 0), ``threads_seconds_per_set`` (the two
        counts tried, when tried) and ``seconds``.

    Raises:
        Whatever the model raises on a forward pass (internal: :func:`~tl_idempotence.probes.ablation.ablation`
        checks the arguments).
    """
    t0 = time.perf_counter()
    passes = _Passes.start(model, toks, counted, sets, batch_size)
    bar = _Bar(passes, len(sets), batch_size, progress, desc)
    threads = _Threads(passes.device, passes.schedule)
    try:
        _clean_pass(passes, kind, batch_size, bar)
        tol = _check_tolerance(model.cfg)
        _ablated_passes(passes, threads, bar, tol, t0)
        used = torch.get_num_threads()
    finally:
        bar.bar.close()
        threads.restore()
    return passes.clean, passes.losses[1:], passes.n_tok, _run_record(passes, tol, used, threads, t0)


def run_sets(
    model: Any,
    toks: Tensor,
    counted: Tensor,
    sets: list[dict[int, list[int]]],
    kind: str,
    batch_size: int,
    progress: bool,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
    """:func:`set_losses` of ``sets`` in eval mode without gradients (the model's mode restored).

    Args, returns and errors: :func:`set_losses` (the bar labelled ``ablation (kind)``).
    """
    was_training = bool(getattr(model, "training", False))
    model.eval()
    try:
        with torch.no_grad():
            return set_losses(
                model,
                toks,
                counted,
                sets,
                kind=kind,
                batch_size=batch_size,
                progress=progress,
                desc=f"ablation ({kind})",
            )
    finally:
        if was_training:
            model.train()
