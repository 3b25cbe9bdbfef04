"""The head sets one ablation runs: the flagged set, its matched control sets and each flagged head alone.

The matching rule, the exhaustive use of few distinct sets and the seeded draws of many are the section
"Matched controls" of the :mod:`tl_idempotence.probes.ablation` package docstring (the "module docstring" below).
:func:`plan_sets` is the step :func:`~tl_idempotence.probes.ablation.ablation` takes after checking its
arguments: every set, in the order of their losses, with the warning when ``p <= 0.05`` is impossible.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import torch

from ...core.random import layer_generator
from ...core.selection import head_label
from ...errors import OptionError

__all__ = [
    "ENUMERATE_AT_MOST",
    "MIN_CONTROLS_FOR_P_005",
    "SetPlan",
    "count_matched_sets",
    "matched_controls",
    "plan_sets",
    "set_labels",
]

#: With fewer distinct matched control sets than this, ``p <= 0.05`` is impossible (floor ``1/(n + 1) > 0.05``):
#: the result says so and a warning is issued.
MIN_CONTROLS_FOR_P_005 = 19
#: Up to this many distinct matched sets are enumerated (and put in a seeded order); more are drawn per layer.
ENUMERATE_AT_MOST = 20_000
_MAX_CANDIDATES_PER_SET = 8


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


def set_labels(s: dict[int, list[int]]) -> str:
    """The heads of set ``s`` as labels (``"L0H3 L1H0"``), layer by layer, space-separated (``controls.heads``)."""
    return " ".join(head_label(layer, h) for layer, hs in sorted(s.items()) for h in hs)


@dataclass(frozen=True)
class SetPlan:
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


def plan_sets(flagged: dict[int, list[int]], n_heads: int, n_controls: int, seed: int, singles: bool) -> SetPlan:
    """The flagged set, its matched controls (:func:`matched_controls`, seeded) and, with ``singles``, each head
    alone; the warning when fewer than :data:`MIN_CONTROLS_FOR_P_005` distinct matched sets exist.

    Args:
        flagged: ``{layer: heads}`` (checked by the caller); n_heads: query heads per layer; n_controls: the
            controls asked for (0..1000); seed: the seed of their draw; singles: also each head alone.

    Returns:
        The :class:`SetPlan`; its ``sets`` are ``[flagged, *controls, *singles]``.

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
        n_used = len(controls)  # the floor is that of the sets used (rank_p_value: 1 / (n_used + 1))
        exist = f"only {n_distinct} distinct matched control set{'s' if n_distinct != 1 else ''} exist"
        used = "" if n_used == n_distinct else f" and n_controls={n_controls} uses {n_used} of them"
        warning = f"{exist}{used}, so p >= {1 / (n_used + 1):.3g}: p <= 0.05 is impossible for this flagged set"
    pairs = [(layer, h) for layer, hs in flagged.items() for h in hs]
    single_sets = [{layer: [h]} for layer, h in pairs] if singles else []
    return SetPlan(
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
