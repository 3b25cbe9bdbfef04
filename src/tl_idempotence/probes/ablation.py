"""Do the flagged heads matter? Next-token loss with them ablated, against matched random head sets.

A near-idempotent head is interesting if the model needs it. :func:`ablation` runs a causal
TransformerLens model (``HookedTransformer`` or ``TransformerBridge``) on real text and
measures the next-token loss

* clean;
* with the given heads ablated together (the *flagged set*);
* with ``n_controls`` random head sets *matched* to the flagged set (below);
* with ``singles=True``, with each given head ablated alone;

and returns the loss change ``Δ = loss_ablated − loss_clean`` (nats per target token) of each,
the control distribution, an exact p-value over head sets, and an effect size with a 95 %
bootstrap interval. It is not a per-layer weight analysis: nothing is registered in the report loop.

**Ablation** is done at ``blocks.{l}.attn.hook_z`` ``[batch, pos, n_heads, d_head]`` — the
head's value-weighted mix before ``W_O`` (on a ``HookedTransformer`` the hook itself; on a
``TransformerBridge`` the alias of ``attn.o.hook_in``, reshaped by the bridge to the same
layout and reshaped back after the hook), so a head's contribution ``z_h @ W_O[h]`` to the
residual stream is replaced while every other head, ``b_O`` and the rest of the model are
untouched. ``kind="zero"`` sets ``z_h = 0`` (the head writes nothing; ``b_O``, which belongs
to no head, stays). ``kind="mean"`` sets ``z_h`` to its mean over the clean run: the mean of
``z[b, p, h, :]`` over every *counted* position ``(b, p)`` of all evaluated windows (the
same mask as the loss: special-token positions such as BOS, an attention sink whose head
outputs are atypical, are left out of the mean), computed once per head in the clean pass —
so it does not depend on ``batch_size``. The replacement is applied at every position.
Zero-ablating every head of a layer therefore leaves exactly ``b_O`` as the layer's
attention output (0 for bias-free models such as Llama: the attention output is removed).

**Loss**: mean cross-entropy (nats) of the token at position ``p + 1`` given positions
``0..p``, over the target positions whose token is not a special token (BOS/EOS/PAD/...),
accumulated in float64 per window (:func:`~tl_idempotence.probes.tokens.prepare_tokens`:
the default corpus of standard-library docstrings when ``texts`` is None). A set's loss is
the sum over windows divided by the number of counted targets; ``window_losses`` keeps each
window's mean so every number can be recomputed.

**Batched head sets** (what makes many controls cheap): after the clean pass, each window is
run once per *chunk* of up to ``batch_size`` head sets. The window enters the model with
batch 1; at ``blocks.{k}.hook_resid_pre`` — ``k`` the first layer any set ablates (for matched
controls, the flagged set's first layer) — its residual stream is repeated once per set, and
each set's ``hook_z`` replacement is applied to its own copy. Layers before ``k`` are therefore
computed once per chunk instead of once per set, and the sets share each matrix product. The
numbers are those of one forward pass per set to float rounding (a test compares both on tiny
models). Every window's first chunk also holds an empty set (nothing ablated), whose loss is
compared with the clean pass's (the largest
difference, nats per token, is ``check_max_abs_diff`` in the summary). When a model refuses the
repeated residual (raises in a window's first shared-prefix pass), or a window's empty set differs by more
than :data:`CHECK_TOLERANCE` (1e-3 nats per token; 5e-2 for float16/bfloat16 models), that window and every
later one are run with the window repeated at the input instead (no shared prefix; ``summary["batching"]``
says which). A difference above the tolerance that remains is reported in the summary's ``note``. An error
raised while hooks of the user's are registered on the model (TransformerLens forward hooks present when
:func:`ablation` starts: ``model.add_hook``, a ``hooks()`` context) is never taken for a refusal: it
propagates in every pass, with a note saying so.

**Threads** (CPU): the first window's first two chunks run on one thread and on torch's thread
count; the faster (seconds per head set; torch's count on a tie) runs the rest, and torch's count
is restored at the end
(``summary["threads"]``, ``summary["threads_seconds_per_set"]``). On a machine whose cores other
processes keep busy, torch's intra-op threads mostly wait for each other: on this project's 2-core
machine a SmolLM2 forward pass took 2.5-3.3x longer on 2 threads than on 1 (``benchmarks/RESULTS.md``).
Nothing is changed when the user chose the count (``OMP_NUM_THREADS``, ``MKL_NUM_THREADS``, or
``torch.set_num_threads`` after this module was imported), on a GPU, or when there are fewer than
two full chunks (a small run).
Thread counts change float32 rounding only.

**Matched controls**: for each layer ``l`` holding ``k_l`` flagged heads, a control holds ``k_l``
distinct heads of the layer's *non-flagged* heads when it has at least ``k_l`` of them, otherwise of all
of the layer's heads (the control may then contain flagged heads; ``n_flagged_in_set`` counts them and the
summary says so). So a control set has the flagged set's size and per-layer composition. The controls are
pairwise **distinct** head sets and **never the flagged set**: ``n_distinct_controls``
(:func:`count_matched_sets`) is ``Π_l C(|pool_l|, k_l)``, less one when every layer draws from all its
heads (the flagged set is then one of the products). When ``n_distinct_controls <= n_controls`` every one
of them is used once (``controls_exhaustive``; ``n_controls`` in the summary is then the number used, and
``n_controls_requested`` the number asked for); otherwise ``n_controls`` are drawn uniformly without
replacement: with at most :data:`ENUMERATE_AT_MOST` distinct sets, the first ``n_controls`` of a seeded
random order of all of them (``layer_generator(seed, None, "ablation", 2)``); with more, candidate ``j``
takes the ``j``-th draw of one stream per layer (``layer_generator(seed, l, "ablation")``) and is rejected
when it is the flagged set or an earlier control. Deterministic for ``seed``, and the first ``n`` controls
of a larger ``n_controls`` are the ``n`` controls of a smaller one. With every head of every flagged layer
flagged no control exists: ``n_controls > 0`` is refused (:class:`~tl_idempotence.errors.OptionError`;
``n_controls=0`` measures Δ alone). With fewer than :data:`MIN_CONTROLS_FOR_P_005` (19) distinct sets,
``p <= 0.05`` is impossible: ``summary["controls_warning"]``, the note, ``repr`` and a ``UserWarning`` say so.

**p-value** (what it means, :func:`rank_p_value`): ``(1 + #{controls with Δ ≥ Δ_flagged}) / (n + 1)`` over
the ``n`` distinct controls used, the exact rank test of the flagged set among the matched sets. Under the
null hypothesis that the flagged heads are, for the loss, like a random matched set — the flagged set's Δ
and those of the controls (distinct sets, drawn without replacement) are exchangeable — ``P(p ≤ x) ≤ x``.
It is conditional on the text: every set is evaluated on the same windows, so no
assumption about how tokens or windows depend on each other enters it. Its smallest possible value is
``1/(n + 1)`` (``p_value_floor``): with the default 39 controls 0.025, so a flagged set that beats all
controls, or all but one, gets ``p ≤ 0.05``. NaN with a note when ``n_controls = 0``.

**Effect size and 95 % intervals**: ``excess_over_controls = Δ_flagged − median(Δ_controls)``
(nats per token). ``delta_loss_ci_*`` and ``excess_ci_*`` (:func:`bootstrap_intervals`) are percentile
intervals — the 2.5 % and 97.5 % quantiles (:func:`percentile_interval`, :data:`INTERVAL_LEVEL`) — of
:data:`BOOTSTRAP_DRAWS` seeded bootstrap draws (``layer_generator(seed, None, "ablation", 1)``)
that resample **text windows** in moving blocks of ``ℓ = max(1, round(n_windows^(1/3)))``
consecutive windows (tokens are never resampled one by one: those of a window share their
context, and neighbouring windows come from the same documents), recomputing each set's loss
on the resampled windows; ``excess_ci_*`` also resamples the control **sets** (with
replacement), so it covers both which text was read and which controls were drawn. They
describe uncertainty; the test is the p-value above. With a single window the intervals are
NaN with a note.
"""

from __future__ import annotations

import difflib
import itertools
import math
import os
import time
import warnings
from collections.abc import Sized
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, TypedDict, cast

import numpy as np
import pandas as pd
import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from ..core.heads import ModelInfo, kv_layout
from ..core.options import check_bool, check_int, check_seed, strict_kwargs
from ..core.random import layer_generator
from ..core.results import Result
from ..core.selection import head_label, head_labels, select_heads
from ..errors import OptionError, OptionTypeError, UnsupportedModelError
from ..sources.tl import TLModelSource, is_tl_model
from .tokens import prepare_tokens

if TYPE_CHECKING:  # pragma: no cover
    from typing import Literal

    from ..core.hints import HeadsLike, IntLike, TextsLike, TLModel

__all__ = [
    "ABLATION_KINDS",
    "BOOTSTRAP_DRAWS",
    "DEFAULT_N_CONTROLS",
    "ENUMERATE_AT_MOST",
    "INTERVAL_LEVEL",
    "MAX_CONTROLS",
    "MIN_CONTROLS_FOR_P_005",
    "Ablation",
    "AblationArgs",
    "ablation",
    "bootstrap_intervals",
    "count_matched_sets",
    "matched_controls",
    "next_token_loss",
    "next_token_losses",
    "percentile_interval",
    "rank_p_value",
]

#: Ablation kinds: replace a head's ``hook_z`` by its clean mean, or by zeros.
ABLATION_KINDS = ("mean", "zero")
#: The most control sets accepted.
MAX_CONTROLS = 1000
#: Default number of matched control sets: the p-value's floor is 1/40 = 0.025, so a flagged set that beats
#: all of them, or all but one, gets p <= 0.05.
DEFAULT_N_CONTROLS = 39
#: Bootstrap draws of the 95 % intervals.
BOOTSTRAP_DRAWS = 2000
#: The level of the effect-size intervals: :func:`percentile_interval` takes the 2.5 % and 97.5 % quantiles.
INTERVAL_LEVEL = 0.95
#: With fewer distinct matched control sets than this, ``p <= 0.05`` is impossible (floor ``1/(n + 1) > 0.05``):
#: the result says so and a warning is issued.
MIN_CONTROLS_FOR_P_005 = 19
#: Up to this many distinct matched sets are enumerated (and put in a seeded order); more are drawn per layer.
ENUMERATE_AT_MOST = 20_000
_MAX_CANDIDATES_PER_SET = 8
#: Largest accepted |loss(empty set in a batched pass) − loss(clean pass)| per window, nats per token, for
#: float32/float64 models (half precision: :data:`_HALF_CHECK_TOLERANCE`).
CHECK_TOLERANCE = 1e-3
_HALF_CHECK_TOLERANCE = 5e-2
#: torch's thread count when this module was imported: a different count later means the user chose one.
_IMPORT_THREADS = torch.get_num_threads()


def _user_chose_threads() -> bool:
    """Whether the user fixed torch's thread count (``OMP_NUM_THREADS``/``MKL_NUM_THREADS``, or
    ``torch.set_num_threads`` since this module was imported): the ablation then never changes it."""
    return any(os.environ.get(k, "").strip() for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")) or (
        torch.get_num_threads() != _IMPORT_THREADS
    )


@dataclass(repr=False)
class Ablation(Result):
    """Result of :func:`ablation`.

    Attributes:
        heads: one row per flagged head, indexed by ``"L10H8"`` labels like ``rep.heads`` (joinable by
            index or on ``layer, head``): ``layer, head, kv_head``, ``loss_ablated`` (nats, this head
            alone ablated), ``delta_loss`` (``loss_ablated − loss_clean``), ``reason`` (why they are NaN:
            ``singles=False``; empty when measured).
        controls: one row per matched control set: ``control`` (0..n-1), ``heads`` (labels,
            space-separated), ``n_flagged_in_set``, ``loss_ablated``, ``delta_loss``.
        window_losses: one row per text window: ``n_tokens`` (counted targets), then the mean loss
            (nats) of ``clean``, ``flagged``, ``control 0..n-1`` and, with ``singles``, each head's
            label on that window; a set's loss is ``Σ n_tokens · loss / Σ n_tokens``.
        summary: leads with ``delta_loss`` (the flagged set's Δ, nats per token), ``control_delta_median``,
            ``p_value``; then ``p_value_floor``, ``n_controls`` (the distinct control sets used: the rows of
            ``controls``), ``n_controls_requested``, ``n_distinct_controls`` (how many distinct matched sets
            exist), ``controls_exhaustive`` (every one of them was used), ``controls_warning`` (only when fewer
            than :data:`MIN_CONTROLS_FOR_P_005` exist: ``p <= 0.05`` is impossible), ``n_controls_at_least``
            (controls with Δ ≥ the flagged Δ), ``excess_over_controls`` and the intervals ``delta_loss_ci_low/high``,
            ``excess_ci_low/high``; ``loss_clean, loss_ablated``; ``control_delta_mean, _q05, _q95,
            _max``; ``model_name, kind, n_heads`` (flagged), ``layers``, ``n_windows, n_tokens``
            (counted targets), ``sum_delta_single`` (with ``singles``), ``control_rule``, ``ci_method``,
            ``batching``, ``threads``, ``threads_seconds_per_set``, ``check_max_abs_diff``, ``seconds`` and,
            where it applies, ``note``.
        info: the measured model's :class:`~tl_idempotence.core.heads.ModelInfo`.
        options: the arguments (kind, n_controls, seed, seq_len, max_tokens, batch_size, singles, corpus).

    The headline numbers are also typed attributes, read from ``summary`` (one source): ``delta_loss``,
    ``p_value``, ``p_value_floor``, ``n_controls``, ``n_distinct_controls``, ``n_controls_at_least``,
    ``control_delta_median``, ``excess_over_controls``, ``delta_loss_ci_low/high``, ``excess_ci_low/high``,
    ``loss_clean``, ``loss_ablated``. ``repr`` ends with ``controls_warning`` when there is one.
    """

    heads: pd.DataFrame
    controls: pd.DataFrame
    summary: dict[str, Any]
    info: ModelInfo
    options: dict[str, Any] = field(default_factory=dict)
    window_losses: pd.DataFrame = field(default_factory=pd.DataFrame)

    display_kind: ClassVar[str] = "ablation"
    repr_keys: ClassVar[tuple[str, ...]] = (
        "delta_loss",
        "control_delta_median",
        "p_value",
        "n_controls",
        "n_heads",
        "kind",
        "n_tokens",
        "loss_clean",
    )

    def __repr__(self) -> str:
        base = super().__repr__()
        warn = self.summary.get("controls_warning") if isinstance(self.summary, dict) else None
        return f"{base[:-1]}, controls_warning={str(warn)!r})" if warn and base.endswith(")") else base

    def _number(self, key: str) -> float:
        return float(self.summary[key])

    @property
    def delta_loss(self) -> float:
        """The flagged set's loss change ``loss_ablated − loss_clean`` (nats per counted token)."""
        return self._number("delta_loss")

    @property
    def p_value(self) -> float:
        """The exact rank p-value of the flagged set among the matched controls (NaN without controls)."""
        return self._number("p_value")

    @property
    def p_value_floor(self) -> float:
        """The smallest p-value possible: ``1 / (n_controls + 1)`` (NaN without controls)."""
        return self._number("p_value_floor")

    @property
    def n_controls(self) -> int:
        """The distinct matched control sets used (at most the number asked for)."""
        return int(self.summary["n_controls"])

    @property
    def n_distinct_controls(self) -> int:
        """How many distinct matched control sets exist (the flagged set excluded)."""
        return int(self.summary["n_distinct_controls"])

    @property
    def n_controls_at_least(self) -> int:
        """Controls whose Δ is at least the flagged set's."""
        return int(self.summary["n_controls_at_least"])

    @property
    def control_delta_median(self) -> float:
        """The median Δ of the controls (nats per token)."""
        return self._number("control_delta_median")

    @property
    def excess_over_controls(self) -> float:
        """``delta_loss − control_delta_median`` (nats per token)."""
        return self._number("excess_over_controls")

    @property
    def delta_loss_ci_low(self) -> float:
        """Lower end of the 95 % bootstrap interval of ``delta_loss``."""
        return self._number("delta_loss_ci_low")

    @property
    def delta_loss_ci_high(self) -> float:
        """Upper end of the 95 % bootstrap interval of ``delta_loss``."""
        return self._number("delta_loss_ci_high")

    @property
    def excess_ci_low(self) -> float:
        """Lower end of the 95 % bootstrap interval of ``excess_over_controls``."""
        return self._number("excess_ci_low")

    @property
    def excess_ci_high(self) -> float:
        """Upper end of the 95 % bootstrap interval of ``excess_over_controls``."""
        return self._number("excess_ci_high")

    @property
    def loss_clean(self) -> float:
        """The clean next-token loss (nats per counted token)."""
        return self._number("loss_clean")

    @property
    def loss_ablated(self) -> float:
        """The next-token loss with the flagged set ablated (nats per counted token)."""
        return self._number("loss_ablated")


def _is_causal(model: Any) -> bool:
    names = [c.__name__ for c in type(model).__mro__]
    if "HookedEncoder" in names or "HookedEncoderDecoder" in names:
        return False
    if "TransformerBridge" in names:
        hf = getattr(model, "original_model", None)
        can = getattr(hf, "can_generate", None)
        if callable(can):
            return bool(can())
    return getattr(getattr(model, "cfg", None), "attention_dir", "causal") == "causal"


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


def _control_pools(flagged: dict[int, list[int]], n_heads: int) -> tuple[list[tuple[int, list[int], int]], list[int]]:
    """Per flagged layer, in order: ``(layer, pool, k_l)`` — the heads a control draws its ``k_l`` from — and the
    layers whose pool is all of their heads (fewer than ``k_l`` non-flagged heads)."""
    pools: list[tuple[int, list[int], int]] = []
    fallback: list[int] = []
    for layer, hs in sorted(flagged.items()):
        k = len(hs)
        pool = [h for h in range(n_heads) if h not in set(hs)]
        if len(pool) < k:
            pool = list(range(n_heads))
            fallback.append(layer)
        pools.append((layer, pool, k))
    return pools, fallback


def count_matched_sets(flagged: dict[int, list[int]], n_heads: int) -> int:
    """How many distinct control sets the matching rule allows (module docstring, "Matched controls").

    ``Π_l C(|pool_l|, k_l)`` over the flagged layers, where ``pool_l`` is the layer's non-flagged heads when it
    has at least ``k_l`` of them and all its heads otherwise; less one when every layer draws from all its heads
    (the flagged set itself is then one of the products, and it is never a control). 0 when every head of every
    flagged layer is flagged.

    Args:
        flagged: ``{layer: heads}`` (non-empty, heads distinct and ``< n_heads``); n_heads: query heads per layer.

    Returns:
        The exact count (a Python int: it can exceed any float's precision).

    Raises:
        Nothing of its own.
    """
    pools, fallback = _control_pools(flagged, n_heads)
    total = math.prod(math.comb(len(pool), k) for _, pool, k in pools)
    return total - (1 if len(fallback) == len(pools) else 0)


def matched_controls(
    flagged: dict[int, list[int]], n_heads: int, n_controls: int, seed: int
) -> tuple[list[dict[int, list[int]]], list[int]]:
    """Distinct random head sets matched to ``flagged`` layer by layer, never ``flagged`` itself (module docstring).

    ``min(n_controls, count_matched_sets(flagged, n_heads))`` sets: all of them when they are at most
    ``n_controls`` (exhaustive), otherwise a uniform draw without replacement. With at most
    :data:`ENUMERATE_AT_MOST` distinct sets they are enumerated and put in a seeded random order
    (``layer_generator(seed, None, "ablation", 2)``); with more, candidates are drawn from one stream per layer
    (``layer_generator(seed, l, "ablation")``, candidate ``j`` from each layer's ``j``-th draw) and a candidate
    that is the flagged set or an earlier control is rejected. Either way the first ``n`` sets of a larger
    ``n_controls`` are the sets of ``n_controls = n``.

    Args:
        flagged: ``{layer: heads}``; n_heads: query heads per layer; n_controls: sets wanted (>= 0);
        seed: the seed of the order / of the per-layer streams.

    Raises:
        OptionError / OptionTypeError: a bad seed (from the generator).

    Returns:
        ``(sets, fallback_layers)``: the dicts ``{layer: sorted heads}`` (pairwise distinct, none equal to
        ``flagged``), and the layers whose draws came from all heads because fewer than ``k_l`` non-flagged
        heads exist.
    """
    pools, fallback = _control_pools(flagged, n_heads)
    want = min(n_controls, count_matched_sets(flagged, n_heads))
    own = tuple(tuple(sorted(hs)) for _, hs in sorted(flagged.items()))
    layers = [layer for layer, _, _ in pools]
    picked: list[tuple[tuple[int, ...], ...]] = []
    if want and count_matched_sets(flagged, n_heads) <= ENUMERATE_AT_MOST:
        every = [c for c in itertools.product(*(itertools.combinations(p, k) for _, p, k in pools)) if c != own]
        order = torch.randperm(len(every), generator=layer_generator(seed, None, "ablation", 2))
        picked = [every[i] for i in order[:want].tolist()]
    elif want:
        gens = [layer_generator(seed, layer, "ablation") for layer in layers]
        seen = {own}
        for _ in range(_MAX_CANDIDATES_PER_SET * (want + 16)):  # rejections are rarer than 1 in 19 here
            cand = tuple(
                tuple(sorted(pool[i] for i in torch.randperm(len(pool), generator=g)[:k].tolist()))
                for g, (_, pool, k) in zip(gens, pools, strict=True)
            )
            if cand not in seen:
                seen.add(cand)
                picked.append(cand)
                if len(picked) == want:
                    break
        else:  # pragma: no cover - odds below 1e-160 with a working generator
            raise RuntimeError(f"matched_controls drew {len(picked)} of {want} distinct sets; the generator repeats")
    return [dict(zip(layers, map(list, c), strict=True)) for c in picked], fallback


def _set_labels(s: dict[int, list[int]]) -> str:
    return " ".join(head_label(layer, h) for layer, hs in sorted(s.items()) for h in hs)


# --------------------------------------------------------------------------- batched evaluation


def _layer_cost(cfg: Any) -> tuple[float, float]:
    """Multiply-adds per token of one block, and of the unembedding + loss, from the config (estimates only)."""
    d = int(getattr(cfg, "d_model", 1) or 1)
    nh, dh = int(getattr(cfg, "n_heads", 1) or 1), int(getattr(cfg, "d_head", 1) or 1)
    nkv = int(getattr(cfg, "n_key_value_heads", None) or nh)
    d_mlp = int(getattr(cfg, "d_mlp", None) or 4 * d)
    gated = bool(getattr(cfg, "gated_mlp", False)) or str(getattr(cfg, "act_fn", "")) in ("silu", "swiglu")
    block = d * (2 * nh * dh + 2 * nkv * dh) + (3 if gated else 2) * d * d_mlp
    unembed = 1.3 * d * int(getattr(cfg, "d_vocab", 1) or 1)  # the cross-entropy reads the logits again
    return float(block), float(unembed)


class _Plan:
    """The ablated passes: chunks of head sets, each run on one window per forward, all from block ``start``.

    Every chunk starts at the first layer any set ablates, so every forward pass repeats the residual stream at
    the same hook: the empty set (index 0, in the first chunk) checks that one place for every chunk.
    """

    def __init__(self, sets: list[dict[int, list[int]]], per_forward: int, n_layers: int, cfg: Any) -> None:
        order = list(range(len(sets)))
        self.chunks = [order[i : i + per_forward] for i in range(0, len(order), per_forward)]
        self.start = min((min(s) for s in sets if s), default=0)
        self.block, self.unembed = _layer_cost(cfg)
        self.n_layers = n_layers

    def forward_cost(self, n_seq: int, start: int) -> float:
        """Multiply-adds per token position of one forward of ``n_seq`` sets repeated at block ``start``."""
        return start * self.block + n_seq * ((self.n_layers - start) * self.block + self.unembed)

    def cost(self) -> float:
        return sum(self.forward_cost(len(ch), self.start) for ch in self.chunks)


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


def _registered_hooks(model: Any) -> list[str]:
    """Names of the model's hook points that hold TransformerLens forward hooks (``model.add_hook``, a ``hooks()``
    context): before :func:`ablation` adds its own, every one is the user's. Hooks a ``TransformerBridge`` keeps
    on its wrapped modules for its own use are plain torch hooks, not hook points' ``fwd_hooks``, and not counted.

    Args:
        model: a TransformerLens model (a ``torch.nn.Module`` whose hook points have ``fwd_hooks`` lists).

    Returns:
        The module names, in ``named_modules`` order (empty when no hook is registered).

    Raises:
        Nothing of its own.
    """
    return [name for name, mod in model.named_modules() if getattr(mod, "fwd_hooks", None)]


def _set_losses(
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
        model: a causal TransformerLens model (checked by :func:`ablation`).
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
        Whatever the model raises on a forward pass (internal: :func:`ablation` checks the arguments).
    """
    from ..core.progress import progress_bar

    t0 = time.perf_counter()
    user_hooks = _registered_hooks(model)  # before any of ours: every one is the user's
    n_w = int(toks.shape[0])
    n_layers = int(model.cfg.n_layers)
    n_heads = int(model.cfg.n_heads)
    d_head = int(model.cfg.d_head)
    device = getattr(model.cfg, "device", None) or "cpu"
    layers = sorted({layer for s in sets for layer in s})
    all_sets: list[dict[int, list[int]]] = [{}, *sets]  # 0: the check (nothing ablated)
    per_forward = max(1, min(batch_size, len(all_sets)))
    plan = _Plan(all_sets, per_forward, n_layers, model.cfg)
    masks = {}
    for ch in plan.chunks:
        for layer in layers:
            m = torch.zeros(len(ch), n_heads, dtype=torch.bool)
            for j, i in enumerate(ch):
                m[j, all_sets[i].get(layer, [])] = True
            masks[(tuple(ch), layer)] = m
    n_clean = (n_w + batch_size - 1) // batch_size
    desc = f"{desc}: {len(sets)} head sets x {n_w} windows"
    bar = progress_bar(
        total=n_clean + n_w * len(plan.chunks),
        desc=f"{desc}, clean pass (time estimate next)",
        unit="forward",
        enabled=progress,
    )
    pos = int(toks.shape[1])
    clean_cost = pos * n_w * plan.forward_cost(1, 0)
    ablated_cost = pos * n_w * plan.cost()

    sums = {layer: torch.zeros(n_heads, d_head, dtype=torch.float64) for layer in layers}
    cur: dict[str, Tensor] = {}

    def mean_hook(layer: int) -> tuple[str, Any]:
        def hook(z: Tensor, hook: Any = None) -> None:
            m = cur["counted"].to(z.device)
            sums[layer] += z.detach()[m].double().sum(0).cpu()

        return f"blocks.{layer}.attn.hook_z", hook

    clean = np.zeros(n_w)
    n_tok = np.zeros(n_w, dtype=np.int64)
    losses = np.full((len(all_sets), n_w), np.nan)
    mode, fallback_window = "shared prefix", None
    n_threads = torch.get_num_threads()
    on_cpu = torch.device(device).type == "cpu"
    # two full chunks of window 0 time the two counts: one thread first (a first-pass overhead counts against
    # it, so a close call keeps torch's count), then torch's count
    full = len(plan.chunks) >= 2 and all(len(ch) == per_forward for ch in plan.chunks[:2])
    tune = on_cpu and n_threads > 1 and full and not _user_chose_threads()
    per_set_s: dict[int, float] = {}  # seconds per head set and window, by thread count (window 0's chunks)
    try:
        t_clean = time.perf_counter()
        clean_hooks = [mean_hook(layer) for layer in layers] if kind == "mean" else []
        for start in range(0, n_w, batch_size):
            batch = toks[start : start + batch_size].to(device)
            cur["counted"] = counted[start : start + batch_size]
            logits = model.run_with_hooks(batch, fwd_hooks=clean_hooks, return_type="logits").detach()
            s, k = next_token_losses(logits, batch, cur["counted"].to(logits.device))
            clean[start : start + len(batch)] = s.cpu().numpy()
            n_tok[start : start + len(batch)] = k.cpu().numpy()
            del logits
            bar.update(1)
            if start == 0:
                done = time.perf_counter() - t_clean
                frac = min(batch_size, n_w) / n_w
                est = done / max(frac * clean_cost, 1.0) * (clean_cost + ablated_cost)
                bar.set_description(f"{desc}, ~{est:.0f} s in all (estimated from the first forward)")
        n_mean = float(counted.sum())
        value = {layer: (sums[layer] / n_mean if kind == "mean" and n_mean else None) for layer in layers}
        half = getattr(model.cfg, "dtype", None) in (torch.float16, torch.bfloat16)
        tol = _HALF_CHECK_TOLERANCE if half else CHECK_TOLERANCE

        timing: dict[str, float] = {}

        def forward(w: int, ch: list[int], k: int, shared: bool) -> np.ndarray:
            n = len(ch)
            hooks = [
                (f"blocks.{layer}.attn.hook_z", _z_hook(masks[(tuple(ch), layer)], value[layer]))
                for layer in layers
                if bool(masks[(tuple(ch), layer)].any())  # a layer this chunk leaves alone gets no hook
            ]
            x = toks[w : w + 1].to(device)
            if shared:
                hooks.insert(0, (f"blocks.{k}.hook_resid_pre", _repeat_hook(n)))
            else:
                x = x.repeat(n, 1)
            t = time.perf_counter()
            logits = model.run_with_hooks(x, fwd_hooks=hooks, return_type="logits").detach()
            timing["last"] = (time.perf_counter() - t) / n
            if logits.shape[0] != n:
                raise RuntimeError(f"the model returned {logits.shape[0]} sequences for {n} head sets")
            s, _ = next_token_losses(logits, x[:1], counted[w : w + 1].to(logits.device))
            return s.cpu().numpy()

        t_ablated = time.perf_counter()
        for w in range(n_w):
            k = plan.start
            for ci, ch in enumerate(plan.chunks):
                if tune and w == 0 and ci < 2:  # window 0: chunk 0 on one thread, chunk 1 on torch's count
                    torch.set_num_threads(1 if ci == 0 else n_threads)
                if ci == 0 and mode == "shared prefix":  # the chunk with the empty set: checked
                    try:
                        got = forward(w, ch, k, True)
                        ok = n_tok[w] == 0 or abs(got[ch.index(0)] - clean[w]) / n_tok[w] <= tol
                    except Exception as e:
                        if user_hooks:  # the user's hooks ran in this pass: their error is never taken for a refusal
                            if hasattr(e, "add_note"):  # Python >= 3.11
                                e.add_note(
                                    f"tli.ablation: raised in a shared-prefix pass (window {w}) while hooks of yours "
                                    f"are registered on the model ({', '.join(user_hooks[:5])}"
                                    f"{', ...' if len(user_hooks) > 5 else ''}); it is not retried with the input "
                                    "repeated. Remove them (model.reset_hooks(including_permanent=True)) if they "
                                    "should not run."
                                )
                            raise
                        ok = False  # the model refused the repeated residual: repeat the input (re-raises if it fails)
                    if not ok:
                        mode, fallback_window = "repeated input", w
                        got = forward(w, ch, k, False)
                else:
                    got = forward(w, ch, k, mode == "shared prefix")
                losses[ch, w] = got
                bar.update(1)
                if tune and w == 0 and ci < 2:
                    per_set_s[torch.get_num_threads()] = timing["last"]
                    if ci == 1:  # keep the faster for every later forward pass (torch's count on a tie)
                        torch.set_num_threads(1 if per_set_s[1] < per_set_s[n_threads] else n_threads)
            if w == 0:
                done = time.perf_counter() - t_ablated
                left = done * (n_w - 1) + (time.perf_counter() - t0)
                bar.set_description(f"{desc}, ~{left:.0f} s in all (estimated from the first window)")
        used = torch.get_num_threads()
    finally:
        bar.close()
        torch.set_num_threads(n_threads)
    with np.errstate(invalid="ignore", divide="ignore"):
        diff = np.abs(losses[0] - clean) / n_tok
    diff = diff[n_tok > 0]
    info = {
        "batching": mode,
        "fallback_window": fallback_window,
        "check_max_abs_diff": float(diff.max()) if diff.size else float("nan"),
        "check_tolerance": tol,
        "threads": used,
        "threads_seconds_per_set": {str(n): round(v, 4) for n, v in sorted(per_set_s.items())},
        "seconds": time.perf_counter() - t0,
    }
    return clean, losses[1:], n_tok, info


# --------------------------------------------------------------------------- statistics


def rank_p_value(delta: float, control_deltas: np.ndarray) -> tuple[float, float, int]:
    """The exact rank p-value of ``delta`` among ``control_deltas`` (module docstring, "p-value").

    Args:
        delta: the flagged set's Δ; control_deltas: ``[n_controls]`` the controls' Δ (distinct sets).

    Returns:
        ``(p, floor, n_at_least)``: ``(1 + n_at_least) / (n_controls + 1)``, ``1 / (n_controls + 1)`` and the
        number of controls with Δ ≥ ``delta``; ``p`` and ``floor`` are NaN when there is no control.

    Raises:
        Nothing of its own.
    """
    n = int(np.size(control_deltas))
    at_least = int((np.asarray(control_deltas) >= delta).sum())
    if not n:
        return float("nan"), float("nan"), 0
    return (1 + at_least) / (n + 1), 1 / (n + 1), at_least


def percentile_interval(draws: np.ndarray, level: float = INTERVAL_LEVEL) -> tuple[float, float]:
    """The percentile interval of bootstrap ``draws``: their ``(1 − level)/2`` and ``(1 + level)/2`` quantiles.

    numpy's default (linear) quantiles; with the default level the 2.5 % and 97.5 % quantiles.

    Args:
        draws: ``[n_draws]`` finite draws (>= 1); level: the interval's level, in (0, 1).

    Returns:
        ``(low, high)``.

    Raises:
        OptionError: ``level`` outside (0, 1).
    """
    if not 0.0 < float(level) < 1.0:
        raise OptionError(f"level must lie in (0, 1); got {level!r}.")
    lo, hi = np.quantile(np.asarray(draws, dtype=float), [(1.0 - level) / 2.0, (1.0 + level) / 2.0])
    return float(lo), float(hi)


def bootstrap_intervals(
    clean: np.ndarray,
    flagged: np.ndarray,
    controls: np.ndarray,
    n_tok: np.ndarray,
    seed: int,
    level: float = INTERVAL_LEVEL,
) -> tuple[dict[str, float], int]:
    """Percentile intervals of the flagged Δ and of the excess over the control median (module docstring).

    :data:`BOOTSTRAP_DRAWS` draws (``layer_generator(seed, None, "ablation", 1)``) resample the windows in moving
    blocks of ``ℓ = max(1, round(n_windows^(1/3)))``; the excess also resamples the control sets with
    replacement; the ends are :func:`percentile_interval` of the draws. A pure function of its arguments.

    Args:
        clean, flagged: ``[n_windows]`` summed losses (nats); controls: ``[n_controls, n_windows]`` (may have 0
        rows); n_tok: ``[n_windows]`` counted targets (> 0 each); seed: the bootstrap's seed; level: in (0, 1).

    Returns:
        ``({delta_loss_ci_low, delta_loss_ci_high, excess_ci_low, excess_ci_high}, ℓ)``; the excess ends are NaN
        without controls.

    Raises:
        OptionError: a bad ``level`` or seed.
    """
    n_w = len(clean)
    ell = max(1, round(n_w ** (1 / 3)))
    gen = layer_generator(seed, None, "ablation", 1)
    n_blocks = math.ceil(n_w / ell)
    starts = torch.randint(0, n_w - ell + 1, (BOOTSTRAP_DRAWS, n_blocks), generator=gen).numpy()
    idx = (starts[:, :, None] + np.arange(ell)[None, None, :]).reshape(BOOTSTRAP_DRAWS, -1)[:, :n_w]
    C = np.zeros((BOOTSTRAP_DRAWS, n_w))
    np.add.at(C, (np.repeat(np.arange(BOOTSTRAP_DRAWS), n_w), idx.reshape(-1)), 1.0)
    n = C @ n_tok.astype(float)
    d_flag = C @ (flagged - clean) / n
    lo, hi = percentile_interval(d_flag, level)
    out = {"delta_loss_ci_low": lo, "delta_loss_ci_high": hi}
    if len(controls):
        d_ctrl = (C @ (controls - clean[None, :]).T) / n[:, None]  # [draws, n_controls]
        pick = torch.randint(0, len(controls), (BOOTSTRAP_DRAWS, len(controls)), generator=gen).numpy()
        excess = d_flag - np.median(np.take_along_axis(d_ctrl, pick, 1), axis=1)
        lo, hi = percentile_interval(excess, level)
        out |= {"excess_ci_low": lo, "excess_ci_high": hi}
    else:
        out |= {"excess_ci_low": float("nan"), "excess_ci_high": float("nan")}
    return out, ell


# ----------------------------------------------------------------------------- the steps of ablation()


#: What an ablation of each kind records of its hook (its ``options``).
_ABLATION_HOOK: dict[str, dict[str, str | None]] = {
    "mean": {
        "hook": "blocks.{l}.attn.hook_z",
        "mean_over": "every counted (non-special) position of the evaluated windows, clean run, per head",
    },
    "zero": {"hook": "blocks.{l}.attn.hook_z", "mean_over": None},
}


def _check_model(model: Any) -> None:
    """Refuse what ``ablation`` cannot run: not a TransformerLens model, or not a causal LM.

    Raises:
        UnsupportedModelError: either (names the class).
    """
    if not is_tl_model(model):
        raise UnsupportedModelError(
            f"ablation needs a TransformerLens model (HookedTransformer or TransformerBridge) to run with hooks; got "
            f"{type(model).__name__}. Load one with tl_idempotence.models.load(...)."
        )
    if not _is_causal(model):
        raise UnsupportedModelError(
            f"ablation measures next-token loss, which needs a causal language model; {type(model).__name__} "
            f"({getattr(model.cfg, 'model_name', '?')}) is an encoder (bidirectional attention)."
        )


def _check_kind(kind: Any) -> None:
    """``kind`` checked: ``"mean"`` or ``"zero"``.

    Raises:
        OptionTypeError: not a string. OptionError: another string (names the closest kind).
    """
    if not isinstance(kind, str):
        raise OptionTypeError(f"kind must be 'mean' or 'zero'; got {type(kind).__name__} {kind!r}.")
    if kind not in ABLATION_KINDS:
        close = difflib.get_close_matches(kind, ABLATION_KINDS, n=1, cutoff=0.4)
        raise OptionError(
            f"kind must be 'mean' or 'zero'; got {kind!r}" + (f" (did you mean {close[0]!r}?)" if close else "") + "."
        )


def _check_heads_given(heads: Any) -> None:
    """Refuse no heads at all (None or empty) with what to pass; the pairs themselves are checked by
    :func:`~tl_idempotence.core.selection.select_heads`.

    Raises:
        OptionError: ``heads`` is None or empty.
    """
    if heads is None:
        raise OptionError("heads is None: give the (layer, head) pairs to ablate, e.g. rep.closed_heads.")
    if hasattr(heads, "__len__") and not isinstance(heads, (str, bytes)) and len(cast(Sized, heads)) == 0:
        raise OptionError(
            "heads is empty: give the (layer, head) pairs to ablate (rep.closed_heads is empty when no head "
            "reaches the report's threshold)."
        )


@dataclass(frozen=True)
class _SetPlan:
    """The head sets one ablation runs, in the order of their losses: the flagged set, the controls, the singles.

    Attributes:
        flagged: ``{layer: [heads]}`` ablated together. pairs: its ``(layer, head)`` pairs, in order.
        controls: the matched control sets; fallback: layers whose controls may hold flagged heads.
        n_distinct: how many distinct matched sets exist; n_requested: the controls asked for; n_controls: used.
        warning: why ``p <= 0.05`` is impossible (too few distinct sets), or None.
        sets: every set, ``[flagged, *controls, *singles]``; singles: each head is also ablated alone.
    """

    flagged: dict[int, list[int]]
    pairs: list[tuple[int, int]]
    controls: list[dict[int, list[int]]]
    fallback: list[int]
    n_distinct: int
    n_requested: int
    warning: str | None
    sets: list[dict[int, list[int]]]
    singles: bool

    @property
    def n_controls(self) -> int:
        """The control sets used (at most the distinct matched sets)."""
        return len(self.controls)

    @property
    def layers(self) -> list[int]:
        """The flagged layers, ascending."""
        return sorted(self.flagged)


def _plan_sets(flagged: dict[int, list[int]], n_heads: int, n_controls: int, seed: int, singles: bool) -> _SetPlan:
    """The flagged set, its matched controls (:func:`matched_controls`, seeded) and, with ``singles``, each head
    alone; the warning when fewer than :data:`MIN_CONTROLS_FOR_P_005` distinct matched sets exist.

    Raises:
        OptionError: ``n_controls > 0`` when no matched control set exists (every head of every flagged layer is
            flagged).
    """
    n_distinct = count_matched_sets(flagged, n_heads)
    if n_controls and not n_distinct:
        raise OptionError(
            f"No matched control set exists: every head of layer(s) {sorted(flagged)} is flagged, so the only set "
            "with the flagged set's number of heads per layer is the flagged set itself and no p-value can be "
            f"computed (n_controls={n_controls}). Pass n_controls=0 to measure the loss change alone, or flag "
            "fewer heads."
        )
    controls, fallback = matched_controls(flagged, n_heads, n_controls, seed)
    warning = None
    if n_controls and n_distinct < MIN_CONTROLS_FOR_P_005:
        warning = (
            f"only {n_distinct} distinct matched control set{'s' if n_distinct != 1 else ''} exist, so p >= "
            f"{1 / (n_distinct + 1):.3g}: p <= 0.05 is impossible for this flagged set"
        )
    pairs = [(layer, h) for layer, hs in flagged.items() for h in hs]
    single_sets = [{layer: [h]} for layer, h in pairs] if singles else []
    return _SetPlan(
        flagged=flagged,
        pairs=pairs,
        controls=controls,
        fallback=fallback,
        n_distinct=n_distinct,
        n_requested=n_controls,
        warning=warning,
        sets=[flagged, *controls, *single_sets],
        singles=singles,
    )


def _run_sets(
    model: Any, toks: Tensor, counted: Tensor, plan: _SetPlan, kind: str, batch_size: int, progress: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
    """:func:`_set_losses` of every set of ``plan`` in eval mode without gradients (the model's mode restored)."""
    was_training = bool(getattr(model, "training", False))
    model.eval()
    try:
        with torch.no_grad():
            return _set_losses(
                model,
                toks,
                counted,
                plan.sets,
                kind=kind,
                batch_size=batch_size,
                progress=progress,
                desc=f"ablation ({kind})",
            )
    finally:
        if was_training:
            model.train()


@dataclass(frozen=True)
class _Losses:
    """The summed next-token losses of one ablation run and the mean losses they give (nats per counted target).

    Attributes:
        clean: ``[windows]`` summed clean losses. sums: ``[sets, windows]`` summed losses of every set.
        n_tok: ``[windows]`` counted targets. n_total: their sum. loss_clean: the clean mean loss.
        set_loss: ``[sets]`` mean loss of every set. loss_flagged: the flagged set's. ctrl_loss: ``[controls]``.
        delta: flagged minus clean. cd: ``[controls]`` every control minus clean.
    """

    clean: np.ndarray
    sums: np.ndarray
    n_tok: np.ndarray
    n_total: float
    loss_clean: float
    set_loss: np.ndarray
    loss_flagged: float
    ctrl_loss: np.ndarray
    delta: float
    cd: np.ndarray

    @staticmethod
    def of(clean: np.ndarray, sums: np.ndarray, n_tok: np.ndarray, n_controls: int) -> _Losses:
        """The mean losses of :func:`_set_losses`' sums (the flagged set first, then ``n_controls`` controls)."""
        n_total = float(n_tok.sum())
        loss_clean = float(clean.sum() / n_total)
        set_loss = sums.sum(1) / n_total
        loss_flagged = float(set_loss[0])
        ctrl_loss = set_loss[1 : 1 + n_controls]
        return _Losses(
            clean=clean,
            sums=sums,
            n_tok=n_tok,
            n_total=n_total,
            loss_clean=loss_clean,
            set_loss=set_loss,
            loss_flagged=loss_flagged,
            ctrl_loss=ctrl_loss,
            delta=loss_flagged - loss_clean,
            cd=ctrl_loss - loss_clean,
        )


def _ablation_tables(
    plan: _SetPlan, L: _Losses, kv_of: Any, singles: bool
) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """The ablation's ``heads`` (each head alone, with ``singles``), ``controls`` and ``window_losses`` tables."""
    pairs, n_controls = plan.pairs, plan.n_controls
    labels = [head_label(layer, h) for layer, h in pairs]
    single_loss = L.set_loss[1 + n_controls :] if singles else np.full(len(pairs), np.nan)
    heads_df = pd.DataFrame(
        {
            "layer": [p[0] for p in pairs],
            "head": [p[1] for p in pairs],
            "kv_head": [int(kv_of[h]) for _, h in pairs],
            "loss_ablated": single_loss.astype(float),
            "delta_loss": (single_loss - L.loss_clean).astype(float),
            "reason": ["" if singles else "not ablated alone (singles=False)"] * len(pairs),
        },
        index=head_labels([p[0] for p in pairs], [p[1] for p in pairs]),
    )
    flagged_pairs = set(pairs)
    ctrl_df = pd.DataFrame(
        {
            "control": np.arange(n_controls, dtype=np.int64),
            "heads": [_set_labels(s) for s in plan.controls],
            "n_flagged_in_set": np.array(
                [sum((layer, h) in flagged_pairs for layer, hs in s.items() for h in hs) for s in plan.controls],
                dtype=np.int64,
            ),
            "loss_ablated": L.ctrl_loss.astype(float),
            "delta_loss": L.cd.astype(float),
        },
        columns=["control", "heads", "n_flagged_in_set", "loss_ablated", "delta_loss"],
    )
    names = ["flagged", *[f"control {c}" for c in range(n_controls)], *(labels if singles else [])]
    with np.errstate(invalid="ignore", divide="ignore"):
        per_window = np.vstack([L.clean, L.sums]) / L.n_tok[None, :]
    win_df = pd.DataFrame(per_window.T, columns=["clean", *names])
    win_df.insert(0, "n_tokens", L.n_tok)
    win_df.index.name = "window"
    return heads_df, ctrl_df, win_df


def _ablation_summary(
    plan: _SetPlan,
    L: _Losses,
    run: dict[str, Any],
    heads_df: pd.DataFrame,
    seed: int,
    kind: str,
    model_name: str,
    n_windows: int,
) -> dict[str, Any]:
    """The ablation's statistics (:func:`rank_p_value`, :func:`bootstrap_intervals`) and its summary, with a
    ``note`` for every NaN and every caveat of the run."""
    n_controls, n_requested, n_distinct = plan.n_controls, plan.n_requested, plan.n_distinct
    cd, delta, singles = L.cd, L.delta, plan.singles
    p_value, p_floor, n_at_least = rank_p_value(delta, cd)
    nan = float("nan")
    has = L.n_tok > 0  # a window without a counted target adds nothing to any loss
    n_resampled = int(has.sum())
    ci, ell = (
        bootstrap_intervals(L.clean[has], L.sums[0][has], L.sums[1 : 1 + n_controls][:, has], L.n_tok[has], seed)
        if n_resampled > 1
        else ({}, 0)
    )
    summary: dict[str, Any] = {
        "delta_loss": delta,
        "control_delta_median": float(np.median(cd)) if cd.size else nan,
        "p_value": p_value,
        "p_value_floor": p_floor,
        "n_controls": n_controls,
        "n_controls_requested": n_requested,
        "n_distinct_controls": n_distinct,
        "controls_exhaustive": bool(n_controls) and n_controls == n_distinct,
        **({"controls_warning": plan.warning} if plan.warning else {}),
        "n_controls_at_least": n_at_least,
        "excess_over_controls": delta - float(np.median(cd)) if cd.size else nan,
        "delta_loss_ci_low": ci.get("delta_loss_ci_low", nan),
        "delta_loss_ci_high": ci.get("delta_loss_ci_high", nan),
        "excess_ci_low": ci.get("excess_ci_low", nan),
        "excess_ci_high": ci.get("excess_ci_high", nan),
        "loss_clean": L.loss_clean,
        "loss_ablated": L.loss_flagged,
        "control_delta_mean": float(cd.mean()) if cd.size else nan,
        "control_delta_q05": float(np.quantile(cd, 0.05)) if cd.size else nan,
        "control_delta_q95": float(np.quantile(cd, 0.95)) if cd.size else nan,
        "control_delta_max": float(cd.max()) if cd.size else nan,
        "model_name": model_name,
        "kind": kind,
        "n_heads": len(plan.pairs),
        "layers": plan.layers,
        "n_windows": n_windows,
        "n_tokens": int(L.n_total),
        "sum_delta_single": float(heads_df["delta_loss"].sum()) if singles else nan,
        "control_rule": (
            "same number of heads per layer, drawn from the layer's non-flagged heads; distinct sets, never the "
            "flagged set" + ("; all of them" if bool(n_controls) and n_controls == n_distinct else "")
        ),
        "ci_method": (
            f"percentile bootstrap, {BOOTSTRAP_DRAWS} draws: text windows resampled in moving blocks of {ell} "
            "consecutive windows (the excess also resamples the control sets); seeded"
        ),
        "batching": run["batching"],
        "threads": run["threads"],
        "threads_seconds_per_set": run["threads_seconds_per_set"],
        "check_max_abs_diff": run["check_max_abs_diff"],
        "seconds": run["seconds"],
    }
    notes = []
    if not n_controls:
        notes.append("p_value and excess_over_controls are NaN: no control set was drawn (n_controls=0)")
    if plan.warning:
        notes.append(plan.warning)
    if n_controls < n_requested:
        notes.append(
            f"{n_requested} controls were asked for, but only {n_distinct} distinct matched sets exist: all of them "
            f"were used once (the p-value's floor is 1/{n_controls + 1})"
        )
    if n_resampled < 2:
        notes.append("the 95% intervals are NaN: one text window cannot be resampled (give more text)")
    if not singles:
        notes.append("heads.delta_loss is NaN: each head alone is ablated with singles=True")
    if plan.fallback:
        summary["control_rule"] += (
            f"; layers {plan.fallback} have fewer non-flagged than flagged heads, so their draws come from all heads"
        )
        notes.append(f"controls in layers {plan.fallback} may contain flagged heads (see controls.n_flagged_in_set)")
    if run["fallback_window"] is not None:
        notes.append(
            f"from window {run['fallback_window']} on, the model refused the repeated residual stream (or its empty "
            "set disagreed with the clean pass): those windows were repeated at the input"
        )
    if run["check_max_abs_diff"] > run["check_tolerance"]:
        notes.append(
            f"the empty head set differs from the clean pass by {run['check_max_abs_diff']:.3g} nats/token "
            f"(> {run['check_tolerance']:g}): compare with batch_size=1"
        )
    if notes:
        summary["note"] = "; ".join(notes)
    return summary


class AblationArgs(TypedDict, total=False):
    """The keyword options of :func:`ablation` besides ``model`` and ``heads`` (``**kwargs: Unpack[AblationArgs]``
    where they are forwarded, e.g. ``rep.ablation(model, ...)``); meaning and validation in :func:`ablation`."""

    texts: TextsLike | None
    kind: Literal["mean", "zero"]
    n_controls: IntLike
    seed: IntLike
    seq_len: IntLike
    max_tokens: IntLike | None
    batch_size: IntLike
    singles: bool
    text_column: str
    progress: bool


@strict_kwargs
def ablation(
    model: TLModel,
    heads: HeadsLike,
    texts: TextsLike | None = None,
    *,
    kind: Literal["mean", "zero"] = "mean",
    n_controls: IntLike = DEFAULT_N_CONTROLS,
    seed: IntLike = 0,
    seq_len: IntLike = 128,
    max_tokens: IntLike | None = 512,
    batch_size: IntLike = 8,
    singles: bool = False,
    text_column: str = "text",
    progress: bool = True,
) -> Ablation:
    """Next-token loss change when the given heads are ablated, against matched random head sets.

    Runs a clean pass over the text, then every head set (the flagged set, ``n_controls`` matched
    controls and, with ``singles``, each head alone) batched ``batch_size`` at a time on each window,
    sharing the layers before the first ablated one, with TransformerLens hooks on
    ``blocks.{l}.attn.hook_z``; no weight is changed. Definitions (ablation, loss, batching,
    matched controls, p-value, intervals): module docstring. Cost: roughly ``(2 + n_controls)``
    forward passes over ``max_tokens`` tokens, less the shared prefix; on SmolLM2-135M with its 13
    closed heads (first ablated layer 5) and the defaults about 40 s on one idle core (README,
    "What each analysis costs"); the progress bar shows an estimate after the first forward pass.

    Args:
        model: a causal ``HookedTransformer`` or ``TransformerBridge`` (with a tokenizer for text).
        heads: ``(layer, head)`` pairs or a DataFrame with ``layer``/``head`` columns
            (``rep.closed_heads``; ``rep.ablation(model=...)`` passes it).
        texts: ``None`` (the default corpus: standard-library docstrings), a string, a list of
            strings / ``pathlib.Path`` files, a ``datasets.Dataset`` or token ids ``[batch, pos]``.
        kind: ``"mean"`` (replace ``z_h`` by its clean mean over the counted positions) or ``"zero"``.
        n_controls: matched random sets (0..1000; 0 gives no p-value), pairwise distinct and never the flagged
            set; when at most that many distinct matched sets exist, all of them are used (``summary
            ["n_distinct_controls"]``). The p-value cannot go below ``1/(controls used + 1)``.
        seed: seed of the control draws and of the bootstrap.
        seq_len: window length in tokens (with the special tokens), >= 2.
        max_tokens: counted tokens to use at least, in whole windows
            (:func:`~tl_idempotence.probes.tokens.prepare_tokens`); None: all of ``texts``.
            ``summary["n_tokens"]`` counts the targets measured (the counted positions after each
            window's first): on the default corpus with SmolLM2's tokenizer the default 512 takes 5
            windows of 128, 634 targets.
        batch_size: sequences per forward pass (1..4096): windows in the clean pass, head sets of one
            window afterwards. Memory ~ ``batch_size × seq_len × d_vocab`` floats; numbers agree across
            values to float rounding; 1 runs one forward pass per set.
        singles: also ablate each head alone (one more set per head) for ``heads.delta_loss``.
        text_column: text column of a ``datasets.Dataset``.
        progress: tqdm bar over forward passes, with a time estimate.

    Every argument is validated here, where it enters.

    Returns:
        :class:`Ablation` (``.summary`` leads with the flagged Δ, the control median and the p-value;
        ``.controls``, ``.heads``, ``.window_losses``).

    Raises:
        UnsupportedModelError: not a TransformerLens model, or not a causal LM (an encoder has no
            next-token loss).
        OptionError: ``heads`` empty or naming a layer/head the model lacks, an unknown ``kind``,
            ``n_controls`` outside 0..1000, ``batch_size`` outside 1..4096, empty texts, no counted
            target token, bad counts; ``n_controls > 0`` when no matched control set exists (every head of
            every flagged layer is flagged).
        OptionTypeError: an argument of the wrong type (``singles="yes"``, ``n_controls=2.0``, ...).
        Exception: whatever the model or a hook registered on it raises (an error in a shared-prefix pass is
            taken for the model refusing the repeated residual only when no hook of the user's is registered).

    Warns:
        UserWarning: ``n_controls > 0`` and fewer than :data:`MIN_CONTROLS_FOR_P_005` distinct matched sets exist
            (``p <= 0.05`` is impossible; also in ``summary["controls_warning"]``, the note and ``repr``).
    """
    _check_model(model)
    _check_kind(kind)
    n_controls = check_int(n_controls, "n_controls", 0, MAX_CONTROLS)
    seed = check_seed(seed)
    seq_len = check_int(seq_len, "seq_len", 2, 1 << 20)
    batch_size = check_int(batch_size, "batch_size", 1, 4096)
    singles = check_bool(singles, "singles")
    progress = check_bool(progress, "progress")
    _check_heads_given(heads)
    src = TLModelSource(model)
    n_heads = src.info.n_heads
    flagged = select_heads(heads, list(src.layers()), n_heads)
    toks, counted = prepare_tokens(model, texts, seq_len=seq_len, max_tokens=max_tokens, text_column=text_column)
    if toks.shape[1] < 2 or not bool(counted[:, 1:].any()):
        raise OptionError(
            "No counted target token: next-token loss needs windows of at least 2 tokens with a non-special "
            "token after the first position."
        )
    plan = _plan_sets(flagged, n_heads, n_controls, seed, singles)
    if plan.warning:
        warnings.warn(f"tli.ablation: {plan.warning}.", UserWarning, stacklevel=3)

    clean_s, sums, n_tok, run = _run_sets(model, toks, counted, plan, kind, batch_size, progress)
    losses = _Losses.of(clean_s, sums, n_tok, plan.n_controls)
    heads_df, ctrl_df, win_df = _ablation_tables(plan, losses, kv_layout(n_heads, src.info.n_kv_heads), singles)
    summary = _ablation_summary(plan, losses, run, heads_df, seed, kind, src.info.model_name, int(toks.shape[0]))
    options = {
        "kind": kind,
        "n_controls": plan.n_requested,
        "seed": seed,
        "seq_len": seq_len,
        "max_tokens": max_tokens,
        "batch_size": batch_size,
        "singles": singles,
        "corpus": "default (stdlib docstrings)" if texts is None else type(texts).__name__,
        **_ABLATION_HOOK[kind],
    }
    return Ablation(
        heads=heads_df, controls=ctrl_df, summary=summary, info=src.info, options=options, window_losses=win_df
    )
