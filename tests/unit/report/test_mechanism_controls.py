"""The mechanism's statistics of issue 47 (SPEC 13) against direct computations on a table with a known answer:
the Spearman test of α·P permuted within layers (exact: every within-layer ordering enumerated here) beside the
unstratified one, the matched-control comparison (every within-layer relabelling of the closed heads and **their
matched controls** enumerated here, not all non-closed heads), the base rates of the weights-only signs among the
non-closed heads (scipy's Fisher and binomial), the bootstrap on constant positions and the summary's headline.

Ten heads in two layers: L0H0, L0H1, L1H0 closed. Sizes |α| make the matched controls L0H2, L0H3, L1H1 (nearest in
their layer); the other non-closed heads all agree with sign α, the matched ones mostly do not, so a comparison
against every non-closed head gives another number than against the matched ones. α·P and the effect both grow
with the layer, so the unstratified Spearman p is small and the within-layer one is not.
"""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest
from scipy.stats import binom, fisher_exact, spearmanr

from tl_idempotence.report.mechanism_controls import derive_controls
from tl_idempotence.report.mechanism_headline import mechanism_headline
from tl_idempotence.report.mechanism_stats import derive_tests

LABELS = [f"L{lay}H{h}" for lay in (0, 1) for h in range(5)]
LAYER = [0] * 5 + [1] * 5
CLOSED = [True, True, False, False, False, True, False, False, False, False]
ALPHA = [2.0, -1.0, 1.9, -1.2, 5.0, 3.0, 2.8, 0.3, 0.5, 10.0]
#: the tested direction: the closed heads agree with sign α; controls L0H2, L0H3 do not, L1H1 does; the rest do.
DIRECTION = [1.0, -1.0, -1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]
MEDIAN_DIFF = [0.4, -0.3, -0.1, 0.2, 0.5, 0.6, 0.1, 0.3, 0.2, 0.7]
#: within each layer the effect is not ordered like α·P; across layers both rise
EFFECT = [0.12, 0.11, 0.14, 0.10, 0.13, 0.92, 0.95, 0.91, 0.94, 0.93]
P = [0.05] * 5 + [0.95] * 5  # the closed flags are given: α·P rises with the layer
COPYING = [0.9, -0.8, 0.5, -0.4, 0.7, 0.6, -0.3, 0.2, -0.1, 0.4]  # sign = sign α but for L1H1, L1H3
COPYING_OWN = [1.0, -1.0, 0.3, 0.2, 0.6, 1.0, 0.5, -0.2, -0.4, 0.9]  # L0H3, L1H2, L1H3 differ from sign α
CONTROLS = {"L0H2": "L0H0", "L0H3": "L0H1", "L1H1": "L1H0"}
SEED, N_PERM = 3, 999


def _tables():
    n = len(LABELS)
    table = pd.DataFrame(
        {
            "layer": LAYER, "head": [h for _ in (0, 1) for h in range(5)], "P": P, "alpha": ALPHA, "closed": CLOSED,
            "alpha_P": np.array(ALPHA) * np.array(P), "effect_median": EFFECT, "n_positions": [4] * n,
            "copying": COPYING, "copying_own": COPYING_OWN, "median_diff": MEDIAN_DIFF, "direction": DIRECTION,
            "asymmetry": [0.8, 0.7, *[np.nan] * 3, 0.9, *[np.nan] * 4],
            "proj_distance": [0.5, 0.6, *[np.nan] * 3, 0.4, *[np.nan] * 4],
            "n_predicted": [0] * n, "direction_predicted": [np.nan] * n, "median_diff_predicted": [np.nan] * n,
            "direction_unpredicted": DIRECTION, "median_diff_unpredicted": MEDIAN_DIFF,
        },
        index=LABELS,
    )  # fmt: skip
    weights = table.loc[:, ["layer", "head", "P", "alpha", "closed", "copying", "copying_own"]].copy()
    weights["norm"] = np.abs(ALPHA)
    # each head: 2 windows x 2 positions, effect - null = median_diff at every one (a constant: known intervals)
    rows = [
        {"label": lab, "window": w, "pos": q, "effect": EFFECT[i], "null_effect": EFFECT[i] - MEDIAN_DIFF[i]}
        for i, lab in enumerate(LABELS)
        for w in (0, 1)
        for q in (1, 2)
    ]
    positions = pd.DataFrame(rows)
    compared = [lab for lab, c in zip(LABELS, CLOSED, strict=True) if c or lab in CONTROLS]
    stability = pd.DataFrame(
        {"label": compared, "set": "set0", "direction": [DIRECTION[LABELS.index(x)] for x in compared]}
    )
    return table, weights, positions, stability


@pytest.fixture(scope="module")
def derived():
    table, weights, positions, stability = _tables()
    _, _, stats = derive_tests(table, N_PERM, SEED)
    cols, sections = derive_controls(
        table, weights, positions, stability, seed=SEED, n_permutations=N_PERM, match_by="abs_alpha", n_controls=1,
        n_boot=50, sets=["set0"], predicted_k=10,
    )  # fmt: skip
    t = table.copy()
    for col, v in cols.items():
        t[col] = v
    return t, None, {**stats, **sections}


def _two_sided(null: np.ndarray, obs: float) -> float:
    tol = 1e-12 * max(1.0, abs(obs))
    return min(1.0, 2 * min(np.mean(null <= obs + tol), np.mean(null >= obs - tol)))


def test_the_spearman_p_is_permuted_within_layers_with_the_unstratified_one_beside_it(derived):
    _, _, s = derived
    x, y = np.array(ALPHA) * np.array(P), np.array(EFFECT)
    rho = spearmanr(x, y).statistic
    assert s["spearman_rho"] == pytest.approx(rho, abs=1e-12) and s["n_spearman"] == 10 and s["n_strata"] == 2
    # every within-layer ordering of x (5! x 5! = 14,400 > 999: drawn, so compare with the enumeration's p)
    g0, g1 = list(itertools.permutations(range(5))), list(itertools.permutations(range(5, 10)))
    ry = y.argsort().argsort().astype(float)
    rx = x.argsort().argsort().astype(float)
    perms = np.array([list(a) + list(b) for a in g0 for b in g1])
    rxp = rx[perms]
    rc, yc = rxp - rxp.mean(1, keepdims=True), ry - ry.mean()
    null = (rc @ yc) / np.sqrt((rc * rc).sum(1) * (yc @ yc))
    p_within = _two_sided(null, rho)
    assert p_within > 0.2  # nothing within the layers
    assert s["spearman_p"] == s["spearman_p_within_layer"]
    assert s["spearman_p"] == pytest.approx(p_within, abs=0.06)  # 999 seeded draws of the enumerated null
    # across layers: depth alone makes ρ large; the unstratified p is small and kept, named
    assert rho > 0.8 and s["spearman_p_unstratified"] < 0.01 and s["spearman_p"] > 0.15


def test_the_within_layer_p_is_exact_when_the_orderings_are_few():
    """Five heads (3 + 2 a layer): 3! x 2! = 12 orderings <= 999, enumerated: equal to the hand enumeration."""
    x = np.array([1.0, 2.0, 3.0, 7.0, 8.0])
    y = np.array([0.3, 0.1, 0.2, 0.9, 0.8])
    t = pd.DataFrame({"layer": [0, 0, 0, 1, 1], "alpha": x, "P": 1.0, "closed": False, "direction": 1.0,
                      "median_diff": 0.1, "effect_median": y, "alpha_P": x, "copying": 0.1,
                      "copying_own": 0.1})  # fmt: skip
    _, _, s = derive_tests(t, 999, 0)
    rho = spearmanr(x, y).statistic
    null = np.array(
        [spearmanr(x[list(a) + list(b)], y).statistic
         for a in itertools.permutations(range(3)) for b in itertools.permutations(range(3, 5))]
    )  # fmt: skip
    assert s["spearman_p"] == pytest.approx(_two_sided(null, rho), abs=1e-12)
    # across layers: 5! = 120 <= 999 orderings, scipy enumerates them too
    allp = np.array([spearmanr(x[list(a)], y).statistic for a in itertools.permutations(range(5))])
    assert s["spearman_p_unstratified"] == pytest.approx(_two_sided(allp, rho), abs=1e-12)
    assert s["spearman_p_unstratified"] < s["spearman_p"]


def test_the_matched_comparison_is_against_the_matched_controls(derived):
    t, _, s = derived
    m = s["matched"]
    assert {lab: of for lab, of in t["control_of"].items() if of} == CONTROLS
    assert (m["n_closed"], m["n_controls"], m["by"]) == (3, 3, "abs_alpha")
    a = m["agreement"]
    closed, controls = ["L0H0", "L0H1", "L1H0"], list(CONTROLS)
    agrees = {lab: float(np.sign(ALPHA[i]) == DIRECTION[i]) for i, lab in enumerate(LABELS)}
    assert t["agrees_alpha"].astype(float).to_dict() == agrees
    assert a["value_closed"] == 1.0 and a["value_controls"] == pytest.approx(1 / 3)
    assert a["difference"] == pytest.approx(2 / 3)
    # every relabelling within layers: layer 0 {L0H0, L0H1, L0H2, L0H3} with 2 closed, layer 1 {L1H0, L1H1} with 1
    pool0, pool1 = ["L0H0", "L0H1", "L0H2", "L0H3"], ["L1H0", "L1H1"]
    diffs = []
    for c0 in itertools.combinations(pool0, 2):
        for c1 in itertools.combinations(pool1, 1):
            cl = [*c0, *c1]
            ct = [x for x in pool0 + pool1 if x not in cl]
            diffs.append(np.mean([agrees[x] for x in cl]) - np.mean([agrees[x] for x in ct]))
    p = np.mean(np.abs(diffs) >= 2 / 3 - 1e-9)
    assert a["method"] == "exact" and a["n_relabelings"] == 12 and a["p_value"] == pytest.approx(p)
    # against every non-closed head instead (the confounded comparison): another rate
    others = [lab for lab, c in zip(LABELS, CLOSED, strict=True) if not c]
    assert np.mean([agrees[x] for x in others]) == pytest.approx(5 / 7) != a["value_controls"]
    e = m["aligned"]
    aligned = {lab: np.sign(ALPHA[i]) * MEDIAN_DIFF[i] for i, lab in enumerate(LABELS)}
    assert e["value_closed"] == pytest.approx(np.median([aligned[x] for x in closed]))
    assert e["value_controls"] == pytest.approx(np.median([aligned[x] for x in controls]))
    z = m["abs_median_diff"]  # the size either way, closed against their controls
    size = {lab: abs(MEDIAN_DIFF[i]) for i, lab in enumerate(LABELS)}
    assert z["value_closed"] == pytest.approx(np.median([size[x] for x in closed]))
    assert z["value_controls"] == pytest.approx(np.median([size[x] for x in controls]))
    sdiffs = []
    for c0 in itertools.combinations(pool0, 2):
        for c1 in itertools.combinations(pool1, 1):
            cl = [*c0, *c1]
            ct = [x for x in pool0 + pool1 if x not in cl]
            sdiffs.append(np.median([size[x] for x in cl]) - np.median([size[x] for x in ct]))
    obs = z["difference"]
    assert z["p_value"] == pytest.approx(np.mean(np.abs(sdiffs) >= abs(obs) - 1e-9))
    assert "matched on |α|" in mechanism_headline(s | {"n_closed": 3}, _tie())


def _tie():
    from tl_idempotence.probes.tied import EmbeddingTie

    return EmbeddingTie(tied=True, how="exact", max_abs_diff=0.0, max_rel_diff=0.0, declared=True, dtypes="f32 / f32")


def test_the_base_rates_are_among_the_non_closed_heads(derived):
    _, _, s = derived
    closed = np.array(CLOSED)
    for col, vals in (("copying", COPYING), ("copying_own", COPYING_OWN)):
        agree = np.sign(vals) == np.sign(ALPHA)
        k_c, n_c = int(agree[closed].sum()), int(closed.sum())
        k_o, n_o = int(agree[~closed].sum()), int((~closed).sum())
        b = s["base_rates"][col]
        assert (b["k_closed"], b["n_closed"], b["k_other"], b["n_other"]) == (k_c, n_c, k_o, n_o)
        assert b["rate_other"] == pytest.approx(k_o / n_o)
        assert b["fisher_p"] == pytest.approx(fisher_exact([[k_c, n_c - k_c], [k_o, n_o - k_o]]).pvalue)
        assert b["binomial_tail_p"] == pytest.approx(binom.sf(k_c - 1, n_c, k_o / n_o))
    assert (s["base_rates"]["copying"]["k_other"], s["base_rates"]["copying_own"]["k_other"]) == (5, 4)


def test_projection_range_bootstrap_and_split(derived):
    t, _, s = derived
    pj = s["projection"]
    assert (pj["asymmetry_min"], pj["asymmetry_max"], pj["proj_distance_min"], pj["proj_distance_max"]) == (
        0.7, 0.9, 0.4, 0.6,
    )  # fmt: skip
    compared = ["L0H0", "L0H1", "L0H2", "L0H3", "L1H0", "L1H1"]
    # constant effect - null at every position: every replicate's median is it, the interval a point
    np.testing.assert_allclose(t.loc[compared, "median_diff_lo"], t.loc[compared, "median_diff"], atol=1e-12)
    np.testing.assert_allclose(t.loc[compared, "median_diff_hi"], t.loc[compared, "median_diff"], atol=1e-12)
    np.testing.assert_allclose(t.loc[compared, "effect_median_lo"], t.loc[compared, "effect_median"], atol=1e-12)
    assert (t.loc[compared, "direction_stability"] == 1.0).all()
    assert t.loc[["L0H4", "L1H2"], "median_diff_lo"].isna().all()  # neither closed nor a control
    st = s["stability"]
    assert (st["n_agree"], st["n_agree_lo"], st["n_agree_hi"]) == (3, 3, 3)
    cs = s["copy_suppression"]
    assert cs["predicted"]["n_tested"] == 0 and cs["unpredicted"]["n_agree"] == 3


def test_the_headline_writes_small_aligned_medians_with_their_digits():
    """Medians of effect - null are often ~1e-3 logits: '+0.00 vs +0.00' hid SmolLM2's +0.0015 vs 0."""
    from tl_idempotence.report.mechanism_headline import _matched

    agreement = dict(
        n_controls=13, n_closed=13, value_closed=0.62, value_controls=0.62, difference=0.0, method="exact",
        p_value=1.0, p_floor=2.2e-5,
    )  # fmt: skip
    aligned = dict(value_closed=0.0015, value_controls=-0.00042, p_value=0.66, method="exact")
    text = _matched({"n_closed": 13, "matched": {"by": "abs_alpha", "agreement": agreement, "aligned": aligned}})
    assert "matched on |α|" in text and "62% vs 62% (difference +0.00, exact within-layer p = 1, floor 2.2e-05)" in text
    assert "median +0.0015 vs -0.00042 (p = 0.66)" in text
