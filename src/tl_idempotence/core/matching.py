"""Matched controls, within-layer tests and base rates for closed heads (SPEC 13). numpy, pandas and scipy only.

A claim that closure predicts what a head does is tested against heads that are not closed but alike in what
confounds: the layer (depth) and the head's size.

* :func:`match_controls` — for each closed head, the ``k`` non-closed heads **of the same layer** nearest in size
  (``by="abs_alpha"``: ``|α|``; ``by="norm"``: ``‖T‖_F``; or any numeric column). Greedy nearest pairs: within a
  layer every (closed, candidate) pair is ranked by ``(|size gap|, closed head, candidate head)`` and taken in that
  order while the closed head has fewer than ``k`` controls and the candidate is unused (without replacement).
  When a layer has fewer than ``k`` x (its closed heads) candidates, the closed heads still short take their
  nearest candidates again (``reused=True``; a note says so); a layer with no candidate gives no control (a
  note). Deterministic: ties go to the lower head index. Heads whose size is NaN are never candidates (a note).
* :func:`matched_difference` — the difference ``f(closed) - f(controls)`` (``f`` the mean, e.g. an agreement rate
  of booleans, or the median) of a per-head quantity, with a two-sided p from relabelling **within each layer**
  (strata): under the null, the closed label is exchangeable among the layer's closed heads and their controls
  (the pool; a control reused counts once). Exact when the relabellings ``Π_l C(pool_l, closed_l)`` number at most
  ``max_exact`` (p = the share of relabellings with ``|difference| >=`` the observed one, the observed one
  included; floor ``1 / Π_l C(...)``), else ``n_permutations`` seeded draws (``numpy.random.default_rng(seed)``;
  p = ``(1 + #{|d*| >= |d|}) / (1 + n_permutations)``, floor ``1 / (1 + n_permutations)``). "``>=``" allows
  ``1e-9 · max|value|`` for rounding (discrete statistics tie exactly). Heads with a NaN value leave the pool
  (a note counts them).
* :func:`base_rates` — given per-head booleans (e.g. ``sign(copying) == sign(α)``), the rate among closed and among
  non-closed heads, Fisher's exact test of the 2 x 2 table (``scipy.stats.fisher_exact``, two-sided) and the
  binomial chance of the closed heads' count under the non-closed rate: ``P(X >= k_closed)`` for
  ``X ~ Binomial(n_closed, rate_other)`` (``scipy.stats.binom.sf``) beside the two-sided ``binomtest`` p. Missing
  values (None / NaN / ``pd.NA``) are left out and counted.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from ..errors import OptionError, OptionTypeError

__all__ = [
    "PAIR_COLUMNS",
    "BaseRates",
    "MatchedDifference",
    "Matching",
    "base_rates",
    "match_controls",
    "matched_difference",
]

#: The columns of :attr:`Matching.pairs`, in order.
PAIR_COLUMNS = (
    "layer", "closed_label", "control_label", "closed_head", "control_head", "size_closed", "size_control",
    "size_gap", "rank", "reused",
)  # fmt: skip

_SIZE_COLUMNS = {"abs_alpha": "alpha", "norm": "norm"}


@dataclass(frozen=True)
class Matching:
    """:func:`match_controls`' answer.

    Attributes:
        pairs: one row per (closed head, control): :data:`PAIR_COLUMNS` (labels ``"L10H8"``; ``size_gap`` =
            ``|size_control - size_closed|``; ``rank`` 1 for the nearest control of that closed head; ``reused``
            True for a control taken again because the layer had too few).
        notes: what could not be matched as asked, one sentence each.
        by: the size used (``"abs_alpha"``, ``"norm"`` or a column). k: controls asked per closed head.
    """

    pairs: pd.DataFrame
    notes: tuple[str, ...]
    by: str
    k: int

    @property
    def closed(self) -> list[str]:
        """The closed heads' labels that have at least one control, in layer, head order."""
        return list(dict.fromkeys(self.pairs["closed_label"]))

    @property
    def controls(self) -> list[str]:
        """The distinct controls' labels, in the order first matched."""
        return list(dict.fromkeys(self.pairs["control_label"]))


def _size(heads: pd.DataFrame, by: str) -> np.ndarray:
    if not isinstance(by, str):
        raise OptionTypeError(f"by must be a column name or 'abs_alpha' / 'norm'; got {type(by).__name__}.")
    col = _SIZE_COLUMNS.get(by, by)
    if col not in heads.columns:
        raise OptionError(f"by={by!r} needs the column {col!r}; the frame has {list(heads.columns)}.")
    x = pd.to_numeric(heads[col], errors="coerce").to_numpy(dtype=float)
    return np.abs(x) if by == "abs_alpha" else x


def _check_heads(heads: Any, closed: str) -> pd.DataFrame:
    if not isinstance(heads, pd.DataFrame):
        raise OptionTypeError(f"heads must be a DataFrame with layer, head and {closed!r}; got {type(heads).__name__}.")
    missing = [c for c in ("layer", "head", closed) if c not in heads.columns]
    if missing:
        raise OptionError(f"heads lacks the columns {missing} (it has {list(heads.columns)}).")
    if heads[closed].isna().any():
        raise OptionError(f"heads[{closed!r}] has missing values: every head must be closed or not.")
    return heads


def _label(layer: int, head: int) -> str:
    return f"L{int(layer)}H{int(head)}"


def _match_layer(layer: int, ch: np.ndarray, cs: np.ndarray, nh: np.ndarray, ns: np.ndarray, k: int) -> list[dict]:
    """Greedy nearest pairs of one layer (module docstring): closed heads ``ch`` (sizes ``cs``), candidates ``nh``
    (sizes ``ns``)."""
    order = sorted(
        (
            (abs(float(ns[j]) - float(cs[i])), int(ch[i]), int(nh[j]), i, j)
            for i in range(len(ch))
            for j in range(len(nh))
        ),
    )
    got: dict[int, list[tuple[int, bool]]] = {i: [] for i in range(len(ch))}
    used: set[int] = set()
    for _, _, _, i, j in order:
        if len(got[i]) < k and j not in used:
            got[i].append((j, False))
            used.add(j)
    for _, _, _, i, j in order:  # the closed heads still short: nearest candidates again (reused)
        if len(got[i]) < k and all(j != jj for jj, _ in got[i]):
            got[i].append((j, True))
    rows = []
    for i in range(len(ch)):
        ranked = sorted(got[i], key=lambda jr: (abs(float(ns[jr[0]]) - float(cs[i])), int(nh[jr[0]])))
        for rank, (j, reused) in enumerate(ranked, 1):
            rows.append({
                "layer": layer, "closed_label": _label(layer, ch[i]), "control_label": _label(layer, nh[j]),
                "closed_head": int(ch[i]), "control_head": int(nh[j]), "size_closed": float(cs[i]),
                "size_control": float(ns[j]), "size_gap": abs(float(ns[j]) - float(cs[i])), "rank": rank,
                "reused": reused,
            })  # fmt: skip
    return rows


def match_controls(heads: pd.DataFrame, *, k: int = 1, by: str = "abs_alpha", closed: str = "closed") -> Matching:
    """For each closed head, the ``k`` non-closed heads of its layer nearest in size (module docstring; SPEC 13).

    Args:
        heads: one row per head with ``layer``, ``head``, the boolean ``closed`` column and the size column
            (``alpha`` for ``by="abs_alpha"``, ``norm`` for ``by="norm"``, else ``by`` itself).
        k: controls per closed head (>= 1).
        by: ``"abs_alpha"`` (``|α|``), ``"norm"`` (``‖T‖_F``) or a numeric column.
        closed: the name of the boolean column that marks closed heads.

    Returns:
        :class:`Matching` (``pairs`` in layer, closed head, rank order; ``notes``).

    Raises:
        OptionTypeError: ``heads`` not a DataFrame, ``by`` not a string, ``k`` not an int.
        OptionError: a missing column, a missing ``closed`` value, ``k < 1``.
    """
    heads = _check_heads(heads, closed)
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
        raise OptionTypeError(f"k must be a whole number; got {type(k).__name__}.")
    if k < 1:
        raise OptionError(f"k must be >= 1; got {k}.")
    size = _size(heads, by)
    layer = heads["layer"].to_numpy(dtype=np.int64)
    head = heads["head"].to_numpy(dtype=np.int64)
    is_closed = heads[closed].to_numpy(dtype=bool)
    rows: list[dict] = []
    notes: list[str] = []
    for lay in sorted(set(layer[is_closed].tolist())):
        in_l = layer == lay
        c_idx = np.flatnonzero(in_l & is_closed)
        c_idx = c_idx[np.argsort(head[c_idx], kind="stable")]
        bad_c = c_idx[~np.isfinite(size[c_idx])]
        if len(bad_c):
            notes.append(
                f"layer {lay}: {', '.join(_label(lay, h) for h in head[bad_c])} have no size ({by}): no control."
            )
        c_idx = c_idx[np.isfinite(size[c_idx])]
        n_idx = np.flatnonzero(in_l & ~is_closed)
        n_nan = int((~np.isfinite(size[n_idx])).sum())
        if n_nan:
            notes.append(f"layer {lay}: {n_nan} non-closed heads have no size ({by}) and are not candidates.")
        n_idx = n_idx[np.isfinite(size[n_idx])]
        n_idx = n_idx[np.argsort(head[n_idx], kind="stable")]
        if not len(c_idx):
            continue
        if not len(n_idx):
            notes.append(f"layer {lay}: no non-closed head to match {len(c_idx)} closed heads with.")
            continue
        if len(n_idx) < k * len(c_idx):
            notes.append(
                f"layer {lay}: {len(n_idx)} non-closed heads for {len(c_idx)} closed x k = {k}: controls are reused."
            )
        rows += _match_layer(lay, head[c_idx], size[c_idx], head[n_idx], size[n_idx], k)
    pairs = pd.DataFrame(rows, columns=list(PAIR_COLUMNS))
    return Matching(pairs=pairs, notes=tuple(notes), by=by, k=int(k))


@dataclass(frozen=True)
class MatchedDifference:
    """:func:`matched_difference`'s answer (module docstring).

    Attributes:
        value: the quantity compared. statistic: ``"mean"`` or ``"median"``.
        closed, controls: ``f`` of the closed heads' and of the controls' values. difference: ``closed - controls``.
        p_value: two-sided, within-layer relabelling. method: ``"exact"`` or ``"permutation"``.
        n_relabelings: the relabellings counted (exact: all of them; permutation: the draws).
        p_floor: the smallest p the method can give. n_closed, n_controls: heads in each group (NaN values out).
        seed: the permutations' seed (None for exact). notes: heads left out, layers without a comparison.
    """

    value: str
    statistic: str
    closed: float
    controls: float
    difference: float
    p_value: float
    method: str
    n_relabelings: int
    p_floor: float
    n_closed: int
    n_controls: int
    seed: int | None
    notes: tuple[str, ...]


def _values(heads: pd.DataFrame, value: str) -> pd.Series:
    if value not in heads.columns:
        raise OptionError(f"value={value!r} is not a column of heads ({list(heads.columns)}).")
    v = heads[value]
    if v.dtype == object or str(v.dtype) == "boolean":
        v = v.map(lambda x: np.nan if x is None or x is pd.NA else x)
    try:
        return pd.Series(pd.to_numeric(v).to_numpy(dtype=float), index=heads.index)
    except (TypeError, ValueError) as e:
        raise OptionTypeError(f"heads[{value!r}] must be numbers or booleans ({e}).") from e


def _stat_rows(X: np.ndarray, mask: np.ndarray, f: str, n: int) -> np.ndarray:
    """``f`` (mean/median) of the values ``X`` [pool] where ``mask`` [rows, pool] is True (``n`` per row)."""
    if f == "mean":
        return (mask * X).sum(1) / n
    s = np.sort(np.where(mask, X, np.inf), axis=1)
    return (s[:, (n - 1) // 2] + s[:, n // 2]) / 2


def matched_difference(
    heads: pd.DataFrame,
    value: str,
    matching: Matching,
    *,
    statistic: str = "mean",
    n_permutations: int = 9999,
    seed: int = 0,
    max_exact: int = 100_000,
) -> MatchedDifference:
    """Closed heads against their matched controls in a per-head quantity, tested within layers (module docstring).

    Args:
        heads: indexed by ``"L10H8"`` labels (those of ``matching``), with ``layer`` and the ``value`` column
            (numbers or booleans; booleans compare as rates with ``statistic="mean"``).
        value: the column compared. matching: :func:`match_controls`' answer.
        statistic: ``"mean"`` or ``"median"``.
        n_permutations: draws when the relabellings are more than ``max_exact`` (>= 1). seed: their seed.
        max_exact: the most relabellings enumerated exactly.

    Returns:
        :class:`MatchedDifference` (NaN difference and p, with a note, when either group is empty).

    Raises:
        OptionTypeError: not a DataFrame / Matching, non-numeric values. OptionError: an unknown column or
            statistic, counts < 1, a matched label missing from ``heads``.
    """
    if not isinstance(heads, pd.DataFrame) or not isinstance(matching, Matching):
        raise OptionTypeError("matched_difference takes a heads DataFrame and a Matching (match_controls).")
    if statistic not in ("mean", "median"):
        raise OptionError(f"statistic must be 'mean' or 'median'; got {statistic!r}.")
    for name, v in (("n_permutations", n_permutations), ("max_exact", max_exact)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise OptionError(f"{name} must be a whole number >= 1; got {v!r}.")
    vals = _values(heads, value)
    labels = [*matching.closed, *matching.controls]
    missing = [x for x in labels if x not in vals.index]
    if missing:
        raise OptionError(f"heads has no rows for the matched heads {missing[:5]}.")
    layer_of = dict(zip(matching.pairs["closed_label"], matching.pairs["layer"], strict=False))
    layer_of.update(dict(zip(matching.pairs["control_label"], matching.pairs["layer"], strict=False)))
    is_closed = {x: True for x in matching.closed} | {x: False for x in matching.controls if x not in matching.closed}
    notes = list(matching.notes)
    dropped = [x for x in is_closed if not np.isfinite(vals[x])]
    if dropped:
        notes.append(f"{len(dropped)} heads without a finite {value!r} left out: {dropped[:8]}.")
    pool = [x for x in is_closed if np.isfinite(vals[x])]
    strata: dict[int, list[str]] = {}
    for x in pool:
        strata.setdefault(int(layer_of[x]), []).append(x)
    strata = {
        lay: xs for lay, xs in strata.items() if any(is_closed[x] for x in xs) and not all(is_closed[x] for x in xs)
    }
    pool = [x for xs in strata.values() for x in xs]
    X = np.array([vals[x] for x in pool], dtype=float)
    obs_mask = np.array([is_closed[x] for x in pool], dtype=bool)
    n_c, n_k = int(obs_mask.sum()), int((~obs_mask).sum())
    nan = float("nan")
    if n_c == 0 or n_k == 0:
        notes.append("no layer has both a closed head and a control with a value: nothing to compare.")
        return MatchedDifference(value, statistic, nan, nan, nan, nan, "none", 0, nan, n_c, n_k, None, tuple(notes))
    f_c = float(_stat_rows(X, obs_mask[None], statistic, n_c)[0])
    f_k = float(_stat_rows(X, ~obs_mask[None], statistic, n_k)[0])
    obs = f_c - f_k
    tol = 1e-9 * max(1.0, float(np.abs(X).max()))
    sizes = [(len(xs), sum(is_closed[x] for x in xs)) for xs in strata.values()]
    total = math.prod(math.comb(n, c) for n, c in sizes)
    offsets = np.cumsum([0, *(n for n, _ in sizes)])
    if total <= max_exact:
        method, n_rel, used_seed = "exact", total, None
        combos = []  # per layer: [C(n, c), n] masks of every choice of its closed heads
        for n, c in sizes:
            cm = np.zeros((math.comb(n, c), n), dtype=bool)
            for row, idx in enumerate(itertools.combinations(range(n), c)):
                cm[row, list(idx)] = True
            combos.append(cm)
        hits = 0
        for s0 in range(0, total, 4096):  # the relabellings in blocks (bounded memory)
            which = np.unravel_index(np.arange(s0, min(s0 + 4096, total)), [len(cm) for cm in combos])
            masks = np.concatenate([cm[w] for cm, w in zip(combos, which, strict=True)], axis=1)
            d = _stat_rows(X, masks, statistic, n_c) - _stat_rows(X, ~masks, statistic, n_k)
            hits += int((np.abs(d) >= abs(obs) - tol).sum())
        p = hits / total
        floor = 1.0 / total
    else:
        method, n_rel, used_seed = "permutation", int(n_permutations), int(seed)
        rng = np.random.default_rng(seed)
        hits, done = 0, 0
        while done < n_permutations:
            m = min(4096, n_permutations - done)
            masks = np.zeros((m, len(pool)), dtype=bool)
            for (n, c), off in zip(sizes, offsets[:-1], strict=True):
                lab = np.tile(np.arange(n) < c, (m, 1))
                masks[:, off : off + n] = rng.permuted(lab, axis=1)
            d = _stat_rows(X, masks, statistic, n_c) - _stat_rows(X, ~masks, statistic, n_k)
            hits += int((np.abs(d) >= abs(obs) - tol).sum())
            done += m
        p = (1 + hits) / (1 + n_permutations)
        floor = 1.0 / (1 + n_permutations)
    return MatchedDifference(
        value, statistic, f_c, f_k, obs, p, method, n_rel, floor, n_c, n_k, used_seed, tuple(notes)
    )


@dataclass(frozen=True)
class BaseRates:
    """:func:`base_rates`' answer (module docstring).

    Attributes:
        n_closed, k_closed, rate_closed: closed heads with a value, those True, the rate.
        n_other, k_other, rate_other: the same for non-closed heads.
        fisher_p: two-sided Fisher exact p of the 2 x 2 table; odds_ratio: its (sample) odds ratio.
        binomial_tail_p: ``P(X >= k_closed)``, ``X ~ Binomial(n_closed, rate_other)``: the chance of at least the
            closed heads' count if closure made no difference.
        binomial_p: two-sided ``binomtest(k_closed, n_closed, rate_other)``.
        n_missing: heads left out (no value).
    """

    n_closed: int
    k_closed: int
    rate_closed: float
    n_other: int
    k_other: int
    rate_other: float
    fisher_p: float
    odds_ratio: float
    binomial_tail_p: float
    binomial_p: float
    n_missing: int


def _bools(x: Any, name: str) -> np.ndarray:
    """A float array of 1/0/NaN from booleans with missing values."""
    s = pd.Series(list(x) if not isinstance(x, pd.Series) else x.to_list(), dtype=object)
    out = np.full(len(s), np.nan)
    for i, v in enumerate(s):
        if v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v)):
            continue
        if isinstance(v, (bool, np.bool_)) or (isinstance(v, (int, np.integer)) and v in (0, 1)):
            out[i] = float(bool(v))
        else:
            raise OptionTypeError(f"{name} must hold booleans (or missing values); got {v!r}.")
    return out


def base_rates(flags: Any, closed: Any) -> BaseRates:
    """The rate of a per-head boolean among closed and among non-closed heads, with exact tests (module docstring).

    Args:
        flags: per-head booleans (a sequence, array or Series; None / NaN / ``pd.NA`` for a head without a value).
        closed: per-head booleans, the same length, no missing value.

    Returns:
        :class:`BaseRates` (rates NaN where a group is empty; the tests NaN then).

    Raises:
        OptionTypeError: values that are not booleans. OptionError: lengths differ, ``closed`` has a missing value.
    """
    f = _bools(flags, "flags")
    c = _bools(closed, "closed")
    if len(f) != len(c):
        raise OptionError(f"flags ({len(f)}) and closed ({len(c)}) must have one value per head.")
    if np.isnan(c).any():
        raise OptionError("closed has missing values: every head must be closed or not.")
    ok = ~np.isnan(f)
    cb = c.astype(bool)
    n_c, n_o = int((ok & cb).sum()), int((ok & ~cb).sum())
    k_c, k_o = int((f[ok & cb] == 1).sum()), int((f[ok & ~cb] == 1).sum())
    nan = float("nan")
    r_c = k_c / n_c if n_c else nan
    r_o = k_o / n_o if n_o else nan
    from scipy.stats import binom, binomtest, fisher_exact

    fisher_p = odds = tail = two = nan
    if n_c and n_o:
        res = fisher_exact([[k_c, n_c - k_c], [k_o, n_o - k_o]], alternative="two-sided")
        fisher_p, odds = float(res.pvalue), float(res.statistic)
        tail = float(binom.sf(k_c - 1, n_c, r_o))
        two = float(binomtest(k_c, n_c, r_o).pvalue)
    return BaseRates(n_c, k_c, r_c, n_o, k_o, r_o, fisher_p, odds, tail, two, int((~ok).sum()))
