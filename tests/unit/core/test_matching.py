"""core/matching.py: matched controls, the within-layer test and base rates (SPEC 13), against hand computations,
a brute-force enumeration written here and scipy."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest
from scipy.stats import binom, binomtest, fisher_exact

from tl_idempotence.core.matching import PAIR_COLUMNS, base_rates, match_controls, matched_difference
from tl_idempotence.errors import OptionError, OptionTypeError


def frame(rows):
    t = pd.DataFrame(rows, columns=["layer", "head", "closed", "alpha", "norm", "value"])
    t.index = [f"L{lay}H{h}" for lay, h in zip(t["layer"], t["head"], strict=True)]
    return t


HAND = frame([
    # layer 0: closed A=H0 (|α| 1.0), B=H1 (|α| 1.2); candidates H2 (1.15), H3 (0.5), H4 (3.0)
    (0, 0, True, -1.0, 5.0, 1.0), (0, 1, True, 1.2, 1.0, 1.0), (0, 2, False, 1.15, 4.0, 0.0),
    (0, 3, False, -0.5, 2.0, 0.0), (0, 4, False, 3.0, 1.1, 1.0),
    # layer 1: one closed head, candidates tied in size (ties go to the lower head)
    (1, 0, True, 2.0, 1.0, 1.0), (1, 1, False, 2.5, 1.0, 0.0), (1, 2, False, 1.5, 1.0, 1.0),
    # layer 2: closed heads only; layer 3: no closed head
    (2, 0, True, 1.0, 1.0, 1.0), (3, 0, False, 1.0, 1.0, 0.0),
])  # fmt: skip


def test_greedy_nearest_pairs_by_hand():
    m = match_controls(HAND, k=1)
    assert list(m.pairs.columns) == list(PAIR_COLUMNS)
    got = list(zip(m.pairs["closed_label"], m.pairs["control_label"], strict=True))
    # layer 0: the globally nearest pair (H1, H2: gap 0.05) first, so H0 gets H3 (gap 0.5), not H2 (gap 0.15)
    # layer 1: H1 and H2 tie (gap 0.5): the lower head wins
    assert got == [("L0H0", "L0H3"), ("L0H1", "L0H2"), ("L1H0", "L1H1")]
    assert m.pairs["size_gap"].tolist() == pytest.approx([0.5, 0.05, 0.5])
    assert m.notes == ("layer 2: no non-closed head to match 1 closed heads with.",)
    assert m.closed == ["L0H0", "L0H1", "L1H0"] and m.controls == ["L0H3", "L0H2", "L1H1"]
    by_norm = match_controls(HAND, k=1, by="norm")  # norm: H0 5.0 -> H2 4.0; H1 1.0 -> H4 1.1
    assert list(by_norm.pairs["control_label"][:2]) == ["L0H2", "L0H4"]


def test_too_few_candidates_are_reused_with_a_note():
    m = match_controls(HAND, k=2)
    p = m.pairs[m.pairs["layer"] == 1]
    assert list(p["control_label"]) == ["L1H1", "L1H2"] and list(p["rank"]) == [1, 2]
    p0 = m.pairs[m.pairs["layer"] == 0]
    # 3 candidates for 2 x 2: H1 takes H2, H0 H3, H1 H4 (gap 1.8 < H0's 2.0); H0 reuses H2 (ranked by gap)
    assert list(zip(p0["closed_label"], p0["control_label"], p0["reused"], strict=True)) == [
        ("L0H0", "L0H2", True), ("L0H0", "L0H3", False), ("L0H1", "L0H2", False), ("L0H1", "L0H4", False),
    ]  # fmt: skip
    assert any("layer 0: 3 non-closed heads for 2 closed x k = 2" in n for n in m.notes)


def test_nan_sizes_and_bad_arguments():
    t = HAND.copy()
    t.loc["L0H3", "alpha"] = np.nan
    t.loc["L1H0", "alpha"] = np.nan
    m = match_controls(t)
    assert "L0H3" not in m.controls and "L1H0" not in m.closed
    assert any("no size" in n for n in m.notes)
    with pytest.raises(OptionError, match="k must be"):
        match_controls(HAND, k=0)
    with pytest.raises(OptionError, match="column"):
        match_controls(HAND, by="size")
    with pytest.raises(OptionTypeError):
        match_controls(HAND.to_dict())
    with pytest.raises(OptionError, match="missing"):
        match_controls(HAND.assign(closed=[None] + [False] * 9))


def brute_force(values, layer, closed, stat):
    """All relabellings of the closed label within layers, written out: (observed difference, two-sided p)."""
    layers = sorted(set(layer))
    idx = {lay: [i for i in range(len(values)) if layer[i] == lay] for lay in layers}
    n_c = {lay: sum(closed[i] for i in idx[lay]) for lay in layers}

    def diff(mask):
        a = [v for v, m in zip(values, mask, strict=True) if m]
        b = [v for v, m in zip(values, mask, strict=True) if not m]
        return stat(a) - stat(b)

    obs = diff(closed)
    ds = []
    for choice in itertools.product(*[itertools.combinations(idx[lay], n_c[lay]) for lay in layers]):
        chosen = {i for c in choice for i in c}
        ds.append(diff([i in chosen for i in range(len(values))]))
    return obs, np.mean(np.abs(ds) >= abs(obs) - 1e-12), len(ds)


@pytest.mark.parametrize("statistic", ["mean", "median"])
def test_the_exact_test_is_the_brute_force_enumeration(statistic):
    rng = np.random.default_rng(3)
    rows = [
        (lay, h, h < 2, rng.normal(), 1.0, rng.normal() + (0.8 if h < 2 else 0)) for lay in range(3) for h in range(6)
    ]
    t = frame(rows)
    m = match_controls(t, k=2)
    r = matched_difference(t, "value", m, statistic=statistic)
    pool = [*m.closed, *m.controls]
    f = np.mean if statistic == "mean" else np.median
    obs, p, n = brute_force(
        t.loc[pool, "value"].tolist(), t.loc[pool, "layer"].tolist(), [x in m.closed for x in pool], f
    )
    assert r.method == "exact" and r.n_relabelings == n == 15**3
    assert r.difference == pytest.approx(obs, rel=1e-12) and r.p_value == pytest.approx(p, rel=1e-12)
    assert r.p_floor == pytest.approx(1 / n) and (r.n_closed, r.n_controls) == (6, 12)


def test_a_rate_of_booleans_and_the_seeded_permutation():
    t = HAND.assign(value=HAND["value"].astype(bool))
    m = match_controls(t)
    r = matched_difference(t, "value", m)
    # closed L0H0, L0H1, L1H0 all True (rate 1); controls L0H3, L0H2, L1H1 all False (rate 0)
    assert (r.closed, r.controls, r.difference) == (1.0, 0.0, 1.0)
    # within layers: layer 0 has C(4,2) = 6 labellings, layer 1 C(2,1) = 2; |d| = 1 for the observed one and its
    # mirror (closed := the controls), so p = 2/12
    assert r.method == "exact" and r.n_relabelings == 12 and r.p_value == pytest.approx(2 / 12)
    rng = np.random.default_rng(4)
    big = frame(
        [(lay, h, h < 2, rng.normal(), 1.0, rng.normal() + (0.7 if h < 2 else 0)) for lay in range(4) for h in range(6)]
    )
    mb = match_controls(big, k=2)
    exact = matched_difference(big, "value", mb)  # 15^4 = 50625 relabellings: exact
    assert exact.method == "exact" and exact.n_relabelings == 15**4
    perm = matched_difference(big, "value", mb, max_exact=10, n_permutations=4000, seed=7)
    assert perm.method == "permutation" and perm.p_floor == pytest.approx(1 / 4001) and perm.seed == 7
    assert perm.p_value == pytest.approx(
        exact.p_value, abs=4 * np.sqrt(exact.p_value * (1 - exact.p_value) / 4000) + 1e-3
    )
    assert matched_difference(big, "value", mb, max_exact=10, n_permutations=4000, seed=7) == perm


def test_values_left_out_and_refusals():
    t = HAND.copy()
    t.loc["L1H1", "value"] = np.nan
    m = match_controls(t)
    r = matched_difference(t, "value", m)
    assert r.n_controls == 2 and any("left out" in n for n in r.notes)  # layer 1 has no control left: dropped
    with pytest.raises(OptionError, match="statistic"):
        matched_difference(t, "value", m, statistic="max")
    with pytest.raises(OptionError, match="column"):
        matched_difference(t, "nope", m)
    with pytest.raises(OptionError, match="n_permutations"):
        matched_difference(t, "value", m, n_permutations=0)


def test_base_rates_against_scipy_and_the_smollm2_numbers():
    # the numbers: 13 of 13 closed heads, 229 of 257 others (89 %)
    flags = [True] * 13 + [True] * 229 + [False] * 28
    closed = [True] * 13 + [False] * 257
    b = base_rates(flags, closed)
    assert (b.n_closed, b.k_closed, b.n_other, b.k_other) == (13, 13, 257, 229)
    assert b.binomial_tail_p == pytest.approx((229 / 257) ** 13, rel=1e-12)
    assert 0.2 < b.binomial_tail_p < 0.23
    res = fisher_exact([[13, 0], [229, 28]])
    assert b.fisher_p == pytest.approx(res.pvalue, rel=1e-12)
    assert b.binomial_p == pytest.approx(binomtest(13, 13, 229 / 257).pvalue, rel=1e-12)
    b2 = base_rates(pd.array([True, False, None, True, False], dtype="boolean"), [True, True, True, False, False])
    assert (b2.n_closed, b2.k_closed, b2.n_other, b2.k_other, b2.n_missing) == (2, 1, 2, 1, 1)
    assert b2.binomial_tail_p == pytest.approx(binom.sf(0, 2, 0.5))
    with pytest.raises(OptionError):
        base_rates([True], [True, False])
    with pytest.raises(OptionTypeError):
        base_rates(["yes"], [True])
