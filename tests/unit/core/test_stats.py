"""core/stats.py: the one Spearman permutation test of rep.roles and rep.mechanism, and its within-strata form.

Without strata it is scipy's permutation test of the pairings with the caller's generator, draw for draw (the
roles' and mechanism's p-values are unchanged); with strata it is checked against a direct enumeration of the
within-stratum permutations (scipy's spearmanr on each), a case derived by hand, and the drawn test against the
enumerated one."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy.stats import permutation_test, spearmanr

from tl_idempotence.core.stats import RELATIVE_TIE, spearman_permutation
from tl_idempotence.errors import OptionError, OptionTypeError


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([seed, 6, 1]))


def direct_p(x: np.ndarray, y: np.ndarray, strata: list[int]) -> float:
    """Two-sided p over every within-stratum permutation of x, each rho by scipy (the definition, written out)."""
    observed = spearmanr(x, y).statistic
    groups = [[i for i, s in enumerate(strata) if s == k] for k in dict.fromkeys(strata)]
    null = []
    for perms in itertools.product(*(itertools.permutations(g) for g in groups)):
        xp = x.copy()
        for g, p in zip(groups, perms):
            xp[g] = x[list(p)]
        null.append(spearmanr(xp, y).statistic)
    null_a = np.array(null)
    tie = abs(observed) * RELATIVE_TIE
    less, greater = np.mean(null_a <= observed + tie), np.mean(null_a >= observed - tie)
    return min(1.0, 2 * min(less, greater))


def test_without_strata_it_is_scipys_pairings_test_draw_for_draw():
    g = np.random.default_rng(5)
    for n, n_perm in ((9, 99), (12, 49), (5, 199)):  # drawn, drawn, exact (5! = 120 <= 199)
        x, y = g.normal(size=n), g.normal(size=n)
        rho, p = spearman_permutation(x, y, n_perm, rng(n))
        ref = permutation_test(
            (x,), lambda a, y=y: spearmanr(a, y).statistic, permutation_type="pairings", n_resamples=n_perm, rng=rng(n)
        )
        assert rho == spearmanr(x, y).statistic and p == ref.pvalue


def test_undefined_when_fewer_than_three_pairs_or_a_constant_side():
    for x, y in (([1.0, 2.0], [2.0, 1.0]), ([1.0, 1.0, 1.0], [1.0, 2.0, 3.0]), ([1.0, 2.0, 3.0], [4.0, 4.0, 4.0])):
        for strata in (None, [0] * len(x)):
            rho, p = spearman_permutation(np.array(x), np.array(y), 9, rng(), strata=strata)
            assert math.isnan(rho) and math.isnan(p)


def test_within_strata_by_hand():
    # y = x: rho = 1; within two strata of 3 the 3! * 3! = 36 permutations give rho >= 1 only unpermuted:
    # P[null >= 1] = 1/36, P[null <= 1] = 1, so p = 2/36 (all 720 permutations: 2/720)
    x = np.arange(6.0)
    rho, p = spearman_permutation(x, x.copy(), 999, rng(), strata=np.array([0, 0, 0, 1, 1, 1]))
    assert rho == 1.0 and p == 2 / 36
    assert spearman_permutation(x, x.copy(), 999, rng(), strata=np.zeros(6, dtype=int))[1] == 2 / 720
    # every pair its own stratum: no permutation but the identity, p = 1
    assert spearman_permutation(x, x.copy(), 999, rng(), strata=np.arange(6))[1] == 1.0


def test_within_strata_equals_the_direct_enumeration():
    g = np.random.default_rng(11)
    for strata in ([0, 0, 0, 1, 1, 2, 2], [3, 1, 3, 1, 3, 1, 3], [0] * 6):
        n = len(strata)
        x, y = g.normal(size=n), g.normal(size=n)
        y[:2] = x[:2]  # some association
        rho, p = spearman_permutation(x, y, 10_000, rng(), strata=np.array(strata))  # every permutation: exact
        assert rho == spearmanr(x, y).statistic and p == pytest.approx(direct_p(x, y, strata), abs=1e-15)
    # one stratum is the unstratified exact test (scipy's)
    x, y = g.normal(size=6), g.normal(size=6)
    assert spearman_permutation(x, y, 999, rng(), strata=np.zeros(6, dtype=np.int64))[1] == pytest.approx(
        spearman_permutation(x, y, 999, rng())[1], abs=1e-15
    )


def test_drawn_within_strata_estimates_the_exact_p_and_keeps_strata_apart():
    # x and y share only their strata's offsets: pooled, a strong correlation; within strata, none to speak of
    g = np.random.default_rng(2)
    strata = np.repeat([0, 1], 5)
    x, y = 10.0 * strata + g.normal(size=10), 10.0 * strata + g.normal(size=10)
    exact = spearman_permutation(x, y, 20_000, rng(), strata=strata)[1]  # all 5! * 5! = 14,400 (checked above)
    p = spearman_permutation(x, y, 2_000, rng(3), strata=strata)[1]
    assert p == spearman_permutation(x, y, 2_000, rng(3), strata=strata)[1]  # the caller's stream decides
    assert p != spearman_permutation(x, y, 2_000, rng(4), strata=strata)[1]  # drawn, not enumerated
    assert p >= 2 / 2_001 and abs(p - exact) < 4 * math.sqrt(exact * (1 - exact) / 2_000) + 2 / 2_001
    assert exact > 0.2 and spearman_permutation(x, y, 99, rng(3))[1] < 0.05  # pooled: strata not kept apart
    # drawn, the observed permutation counts once: the floor 2 / (n + 1), never 0 (6! * 6! = 518,400 permutations)
    x = np.arange(12.0)
    assert spearman_permutation(x, x.copy(), 999, rng(), strata=np.repeat([0, 1], 6)) == (1.0, 2 / 1_000)


def test_strata_are_checked():
    x = np.arange(5.0)
    with pytest.raises(OptionTypeError, match="integer labels"):
        spearman_permutation(x, x, 9, rng(), strata=np.zeros(5))
    with pytest.raises(OptionError, match=r"one label per pair \(5\)"):
        spearman_permutation(x, x, 9, rng(), strata=[0, 0, 1])
