"""Rank statistics the joined results share (numpy, scipy; no torch).

:func:`spearman_permutation` is THE Spearman test of the report's joins: ``rep.roles`` (P against each role score)
and ``rep.mechanism`` (α·P against the attended-token effect) call it with their own seeded generator. Without
strata it is scipy's ``permutation_test`` of the pairings (``x`` permuted against a fixed ``y``; exact when
``n_permutations >= n!``), so its numbers are scipy's; with ``strata`` (an int label per pair, e.g. the layer) only
pairs of one stratum trade places, the same p-value convention.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np

from ..errors import OptionError, OptionTypeError

__all__ = ["spearman_permutation"]

#: Null values within ``RELATIVE_TIE · |observed|`` of the observed statistic count as equal to it (scipy's
#: ``permutation_test`` rule: numerically distinct, theoretically equal values).
RELATIVE_TIE = float(np.finfo(np.float64).eps) * 100


def spearman_permutation(
    x: Any, y: Any, n_permutations: int, rng: np.random.Generator, strata: Any = None
) -> tuple[float, float]:
    """Spearman's ρ of ``x`` and ``y`` and its two-sided permutation p-value.

    Args:
        x, y: ``[n]`` paired values (dimensionless; NaN-free: the callers keep the defined pairs).
        n_permutations: permutations of ``x`` drawn (>= 1); when there are at most this many distinct ones (``n!``,
            or with ``strata`` the product of each stratum's ``k!``) every one is enumerated instead (an exact test).
        rng: the generator of the draws (the caller's seeded stream; not used by an exact test).
        strata: ``None`` (every pair may trade places), or ``[n]`` integer labels: ``x`` is permuted only within
            each stratum (e.g. the layer of each head), keeping what differs between strata out of the null.

    Returns:
        ``(rho, p)``: ρ in [-1, 1] (scipy's ``spearmanr``); ``p = min(1, 2 · min(P[null <= ρ], P[null >= ρ]))``
        over the permutations, with ``+1`` in numerator and denominator when they are drawn (never 0; floor
        ``2 / (n_permutations + 1)``) and none when enumerated; null values within :data:`RELATIVE_TIE` of ρ count
        as equal to it. ``(NaN, NaN)`` when undefined: fewer than 3 pairs, or ``x`` or ``y`` constant.

    Raises:
        OptionTypeError: ``strata`` not integers. OptionError: ``strata`` not one label per pair.
    """
    from scipy.stats import permutation_test, spearmanr

    if len(x) < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return float("nan"), float("nan")
    rho = float(spearmanr(x, y).statistic)
    if strata is None:

        def stat(a: np.ndarray) -> float:
            return float(spearmanr(a, y).statistic)

        res = permutation_test((x,), stat, permutation_type="pairings", n_resamples=n_permutations, rng=rng)
        return rho, float(res.pvalue)
    return rho, _stratified_p(np.asarray(x, dtype=float), np.asarray(y, dtype=float), n_permutations, rng, strata)


def _groups(strata: Any, n: int) -> list[np.ndarray]:
    """The positions of each stratum with more than one pair (in order of first appearance).

    Raises:
        OptionTypeError: not integers. OptionError: not ``n`` labels.
    """
    s = np.asarray(strata)
    if s.dtype.kind not in "iu":
        raise OptionTypeError(f"strata must be integer labels (one per pair); got dtype {s.dtype}.")
    if s.shape != (n,):
        raise OptionError(f"strata must hold one label per pair ({n}); got shape {s.shape}.")
    _, first, inverse = np.unique(s, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")
    return [g for g in (np.flatnonzero(inverse == k) for k in order) if len(g) > 1]


def _rank_corr(rx: np.ndarray, ry_c: np.ndarray) -> np.ndarray:
    """``[m]`` Pearson correlation of each row of ``rx`` (``[m, n]`` ranks of x, permuted) with the centred ranks
    of y ``ry_c``: Spearman's ρ of each permutation."""
    rc = rx - rx.mean(axis=1, keepdims=True)
    return np.asarray((rc @ ry_c) / np.sqrt((rc * rc).sum(axis=1) * (ry_c @ ry_c)))


def _stratified_p(x: np.ndarray, y: np.ndarray, n_perm: int, rng: np.random.Generator, strata: Any) -> float:
    """The two-sided p of :func:`spearman_permutation` with ``x`` permuted within strata (its docstring)."""
    from scipy.stats import rankdata

    n = len(x)
    groups = _groups(strata, n)
    rx, ry = rankdata(x), rankdata(y)  # a permutation of x permutes its ranks: rank once
    ry_c = ry - ry.mean()
    n_max = math.prod(math.factorial(len(g)) for g in groups)
    if n_perm >= n_max:  # every within-stratum permutation once (the identity included)
        exact, count = True, n_max
        idx = np.tile(np.arange(n), (n_max, 1))
        for row, perms in enumerate(itertools.product(*(itertools.permutations(g) for g in groups))):
            for g, p in zip(groups, perms):
                idx[row, g] = p
    else:
        exact, count = False, n_perm
        idx = np.tile(np.arange(n), (n_perm, 1))
        for g in groups:
            idx[:, g] = g[rng.permuted(np.tile(np.arange(len(g)), (n_perm, 1)), axis=1)]
    observed = float(_rank_corr(rx[None, :], ry_c)[0])
    null = _rank_corr(rx[idx], ry_c)
    gamma = abs(observed) * RELATIVE_TIE
    adjust = 0 if exact else 1
    less = (np.count_nonzero(null <= observed + gamma) + adjust) / (count + adjust)
    greater = (np.count_nonzero(null >= observed - gamma) + adjust) / (count + adjust)
    return float(min(1.0, 2.0 * min(less, greater)))
