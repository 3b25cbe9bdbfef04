"""The head-roles statistics (``report/roles.py``) against references written here from their definitions
(the mutation target ``roles_stats`` runs these): the exact permutation p of Spearman's ρ by enumerating every
pairing (integer sums of squared rank differences), the exact two-sided Mann-Whitney p by enumerating every
split, Benjamini-Hochberg across the roles by its formula, which heads enter each count (a NaN P or score is
left out, an α or score of 0 has no sign), every note's words, and the circuit's two p-values on constructions
whose answers are known (binomial coefficients; a layer whose heads are all closed; the layer-matched tail 1/6).
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pandas as pd
import pytest

from helpers import bh_list, mannwhitney_exact_p
from tl_idempotence.core.heads import ModelInfo
from tl_idempotence.probes.roles import HeadRoles
from tl_idempotence.report.roles import circuit_overlap, role_association

NAN = math.nan
LABELS = [f"L{a}H{b}" for a in range(2) for b in range(4)]
#                 L0H0  L0H1  L0H2  L0H3  L1H0  L1H1  L1H2  L1H3
P = np.array([0.95, 0.20, 0.50, NAN, 0.97, 0.10, 0.92, NAN])
ALPHA = np.array([0.5, 0.1, -0.2, NAN, -0.7, 0.3, 0.0, 0.2])
INDUCTION = np.array([0.9, 0.1, 0.35, 0.6, 0.4, 0.05, 0.7, 0.2])  # distinct: exact tests
COPYING = np.array([0.8, -0.1, 0.4, 0.2, 0.6, NAN, 0.9, 0.05])  # L1H0: +0.6 against α −0.7
DUPLICATE = np.array([NAN, 0.3, 0.2, NAN, NAN, NAN, NAN, NAN])  # two finite scores, neither closed head


def heads_table(P=P, alpha=ALPHA, threshold=0.9) -> pd.DataFrame:
    t = pd.DataFrame(
        {"layer": [0] * 4 + [1] * 4, "head": [0, 1, 2, 3] * 2, "P": P, "alpha": alpha}, index=pd.Index(LABELS)
    )
    t["closed"] = t["P"] >= threshold  # NaN P: not closed
    return t


def roles_for(**cols) -> HeadRoles:
    t = pd.DataFrame({"layer": [0] * 4 + [1] * 4, "head": [0, 1, 2, 3] * 2, "kv_head": [0, 1, 2, 3] * 2})
    t.index = pd.Index(LABELS)
    for k in ("previous_token", "duplicate_token", "induction", "copying"):
        t[k] = cols.get(k, 0.5)
    t["reason"] = ""
    return HeadRoles(table=t, summary={"model_name": "made"}, info=ModelInfo(2, 4, 4, 16, 4))


def ranks(x) -> list[int]:
    return [sorted(x).index(v) + 1 for v in x]  # distinct values


def spearman_exact_p(x, y) -> tuple[float, float]:
    """ρ and the two-sided exact permutation p: every pairing of y with x, compared on Σd² (integers)."""
    rx, ry = ranks(x), ranks(y)
    n = len(x)
    d2 = sum((a - b) ** 2 for a, b in zip(rx, ry))
    rho = 1 - 6 * d2 / (n * (n * n - 1))
    null = [sum((a - b) ** 2 for a, b in zip(rx, perm)) for perm in itertools.permutations(ry)]
    at_most = sum(v <= d2 for v in null)  # ρ_perm >= ρ
    at_least = sum(v >= d2 for v in null)  # ρ_perm <= ρ
    return rho, min(1.0, 2 * min(at_most, at_least) / len(null))


@pytest.fixture(scope="module")
def assoc():
    roles = roles_for(previous_token=0.5, duplicate_token=DUPLICATE, induction=INDUCTION, copying=COPYING)
    return role_association(heads_table(), roles, threshold=0.9, n_permutations=720, seed=4)


def test_spearman_is_the_exact_permutation_test(assoc):
    a = assoc.association
    ok = ~np.isnan(P)  # 6 heads: 6! = 720 pairings, all enumerated
    rho, p = spearman_exact_p(P[ok], INDUCTION[ok])
    assert a.loc["induction", "spearman_rho"] == pytest.approx(rho, abs=1e-12)
    assert a.loc["induction", "spearman_p"] == pytest.approx(p, rel=1e-12)
    ok_c = ok & ~np.isnan(COPYING)  # 5 heads: 120 pairings, all within 720
    rho, p = spearman_exact_p(P[ok_c], COPYING[ok_c])
    assert a.loc["copying", "spearman_rho"] == pytest.approx(rho, abs=1e-12)
    assert a.loc["copying", "spearman_p"] == pytest.approx(p, rel=1e-12)
    rho, p = spearman_exact_p(P[ok_c], np.abs(COPYING[ok_c]))
    assert a.loc["|copying|", "spearman_rho"] == pytest.approx(rho, abs=1e-12)
    assert a.loc["|copying|", "spearman_p"] == pytest.approx(p, rel=1e-12)
    # a constant score, and a score defined on 2 heads only: no ρ, with the reason
    for role in ("previous_token", "duplicate_token"):
        assert np.isnan(a.loc[role, "spearman_rho"]) and np.isnan(a.loc[role, "spearman_p"])
        assert a.loc[role, "note"].startswith("Spearman undefined (fewer than 3 heads or a constant P/score)")


def test_counts_medians_and_mann_whitney(assoc):
    a = assoc.association
    assert list(a.index) == ["previous_token", "duplicate_token", "induction", "copying", "|copying|"]
    assert a["n"].tolist() == [6, 2, 6, 5, 5]
    assert a["n_closed"].tolist() == [3, 0, 3, 3, 3]
    closed = [0, 4, 6]  # L0H0, L1H0, L1H2
    other = [1, 2, 5]  # L0H3 and L1H3 have no P
    assert a.loc["induction", "median_closed"] == 0.7 and a.loc["induction", "median_other"] == 0.1
    assert a.loc["induction", "mannwhitney_p"] == pytest.approx(
        mannwhitney_exact_p(INDUCTION[closed], INDUCTION[other]), rel=1e-12
    )
    other_c = [1, 2]  # L1H1 has no copying score
    assert a.loc["copying", "median_closed"] == 0.8 and a.loc["copying", "median_other"] == pytest.approx(
        0.15, abs=1e-15
    )
    assert a.loc["copying", "mannwhitney_p"] == pytest.approx(
        mannwhitney_exact_p(COPYING[closed], COPYING[other_c]), rel=1e-12
    )
    assert a.loc["|copying|", "median_other"] == 0.25
    dup = a.loc["duplicate_token"]
    assert np.isnan(dup["mannwhitney_p"]) and np.isnan(dup["median_closed"]) and dup["median_other"] == 0.25
    assert dup["note"] == (
        "Spearman undefined (fewer than 3 heads or a constant P/score); Mann-Whitney undefined: no closed head"
    )
    assert a.loc["previous_token", "mannwhitney_p"] == 1.0  # equal scores: no difference at all
    assert a.loc["induction", "note"] == "" and a.loc["copying", "note"] == ""


def test_sign_agreement_of_copying(assoc):
    a = assoc.association
    # closed heads with a signed score and α: L0H0 (+0.8, α +0.5: agrees), L1H0 (+0.6, α −0.7: not); L1H2 has α 0
    assert a.loc["copying", "frac_sign_agrees_alpha"] == 0.5
    for role in ("previous_token", "duplicate_token", "induction", "|copying|"):
        assert np.isnan(a.loc[role, "frac_sign_agrees_alpha"])
    # no closed head with a signed score: NaN with the reason
    cop = COPYING.copy()
    cop[[0, 4]] = 0.0
    r = role_association(heads_table(), roles_for(induction=INDUCTION, copying=cop), 0.9, n_permutations=9)
    row = r.association.loc["copying"]
    assert np.isnan(row["frac_sign_agrees_alpha"]) and row["note"] == "no closed head with a signed copying score and α"
    # every head agrees
    cop[[0, 4]] = [0.3, -0.3]
    r = role_association(heads_table(), roles_for(induction=INDUCTION, copying=cop), 0.9, n_permutations=9)
    assert r.association.loc["copying", "frac_sign_agrees_alpha"] == 1.0


def test_q_values_are_bh_across_the_roles(assoc):
    a = assoc.association
    for col in ("spearman", "mannwhitney"):
        p = a[f"{col}_p"].tolist()
        np.testing.assert_allclose(a[f"{col}_q"], bh_list(p), rtol=1e-12, atol=0)
        assert list(a.columns).index(f"{col}_q") == list(a.columns).index(f"{col}_p") + 1
    assert np.isnan(a.loc["previous_token", "spearman_q"])  # outside the family


def test_summary_and_table(assoc):
    s = assoc.summary
    assert {k: s[k] for k in ("model_name", "n_heads", "n_closed", "threshold", "n_permutations", "seed")} == {
        "model_name": "made",
        "n_heads": 8,
        "n_closed": 3,
        "threshold": 0.9,
        "n_permutations": 720,
        "seed": 4,
    }
    assert s["p_floor"] == 2 / 721 and s["roles"] == {"model_name": "made"}
    assert list(assoc.table.index) == LABELS and list(assoc.table.columns[-3:]) == ["P", "alpha", "closed"]
    one = role_association(heads_table(), roles_for(induction=INDUCTION), 0.9, n_permutations=1)
    assert one.summary["p_floor"] == 1.0
    assert role_association(heads_table(), roles_for(induction=INDUCTION), 0.9, n_permutations=2).summary[
        "p_floor"
    ] == pytest.approx(2 / 3)


def test_three_heads_are_enough_and_all_closed_has_no_other():
    P3 = np.array([0.95, 0.96, 0.99, NAN, NAN, NAN, NAN, NAN])
    r = role_association(heads_table(P=P3), roles_for(induction=INDUCTION), 0.9, n_permutations=6)
    row = r.association.loc["induction"]
    rho, p = spearman_exact_p(P3[:3], INDUCTION[:3])
    assert row["n"] == 3 and row["spearman_rho"] == pytest.approx(rho) and row["spearman_p"] == pytest.approx(p)
    assert np.isnan(row["mannwhitney_p"]) and row["note"] == "Mann-Whitney undefined: no other head"
    assert row["median_closed"] == 0.35 and np.isnan(row["median_other"])


def circuit_heads() -> pd.DataFrame:
    """Layer 0: 4 heads, H0 and H1 closed; layer 1: 4 heads, all closed."""
    t = heads_table(P=np.array([0.95, 0.99, 0.2, 0.3, 0.91, 0.92, 0.93, 0.94]), alpha=np.ones(8))
    assert t["closed"].tolist() == [True, True, False, False, True, True, True, True]
    return t


def test_circuit_p_values_on_known_constructions():
    t = circuit_heads()
    c = circuit_overlap(t, [(0, 0), (0, 1), (1, 2)], threshold=0.9, n_sets=20000, seed=7)
    # hypergeometric: 3 of 8 heads, 6 closed: P[X >= 3] = C(6,3) / C(8,3)
    assert c.p_hypergeom == pytest.approx(math.comb(6, 3) / math.comb(8, 3), rel=1e-12)
    # layer-matched: 2 of layer 0's 4 heads are both closed with probability 1/C(4,2); layer 1's head always is
    assert abs(c.p_layer_matched - 1 / 6) < 0.015  # sd 0.0026: 5.7 sd (false alarm < 1e-8)
    assert c.p_layer_matched == (1 + int((c.set_overlaps >= 3).sum())) / 20001
    assert set(c.set_overlaps.tolist()) == {1, 2, 3} and len(c.set_overlaps) == 20000
    assert c.summary == {
        "n_heads": 3,
        "n_overlap": 3,
        "n_measured": 8,
        "n_closed": 6,
        "threshold": 0.9,
        "p_hypergeom": c.p_hypergeom,
        "p_layer_matched": c.p_layer_matched,
        "p_layer_matched_floor": 1 / 20001,
        "n_sets": 20000,
        "seed": 7,
        "layers": {0: 2, 1: 1},
    }
    assert list(c.heads.columns) == ["layer", "head", "P", "alpha", "closed"]
    # a layer whose heads are all closed: every matched set overlaps as much as the circuit (ties count): p = 1
    all_closed = circuit_overlap(t, [(1, 0), (1, 3)], threshold=0.9, n_sets=50, seed=0)
    assert all_closed.p_layer_matched == 1.0 and all_closed.set_overlaps.tolist() == [2] * 50
    assert all_closed.p_hypergeom == pytest.approx(math.comb(6, 2) / math.comb(8, 2), rel=1e-12)
    # no closed head in the circuit: both p-values are 1
    none = circuit_overlap(t, [(0, 2), (0, 3)], threshold=0.9, n_sets=50, seed=0)
    assert none.n_overlap == 0 and none.p_hypergeom == 1.0 and none.p_layer_matched == 1.0
    # both of layer 0's open heads: matched sets are never below 0 and the circuit's 0 is the minimum
    assert none.set_overlaps.min() >= 0
    one = circuit_overlap(t, [(0, 1)], threshold=0.9, n_sets=40000, seed=1)
    assert abs(one.p_layer_matched - 0.5) < 0.02  # 1 of 4 heads, 2 closed: P[overlap 1] = 1/2; sd 0.0025
    assert one.p_hypergeom == pytest.approx(6 / 8, rel=1e-12)


def test_the_random_streams_are_the_documented_ones():
    """Seeded streams pinned (a saved result stays reproducible across versions): each role's permutations come
    from ``default_rng(SeedSequence([seed, 6, i]))`` (i: the role's row), the circuit's sets from
    ``default_rng(SeedSequence([seed, 5]))``, drawn layer by layer in increasing layer order, each set a uniformly
    random ordering's first heads. With fewer permutations than pairings the test is randomized: two-sided p in
    steps of 2/(n + 1)."""
    import scipy.stats

    roles = roles_for(induction=INDUCTION, copying=COPYING)
    r = role_association(heads_table(), roles, 0.9, n_permutations=9, seed=3)
    ok = ~np.isnan(P)
    for i, role in [(2, "induction")]:
        want = scipy.stats.permutation_test(
            (P[ok],),
            lambda a: scipy.stats.spearmanr(a, INDUCTION[ok]).statistic,
            permutation_type="pairings",
            n_resamples=9,
            rng=np.random.default_rng(np.random.SeedSequence([3, 6, i])),
        ).pvalue
        assert r.association.loc[role, "spearman_p"] == want
    for p in r.association["spearman_p"].dropna():
        assert round(p * 10 / 2, 9) in {1, 2, 3, 4, 5}  # randomized: (1 + count) / 10, doubled, at most 1
    t = circuit_heads()
    pairs = [(1, 2), (0, 0), (0, 1)]  # layers listed out of order
    c = circuit_overlap(t, pairs, threshold=0.9, n_sets=500, seed=9)
    rng = np.random.default_rng(np.random.SeedSequence([9, 5]))
    closed = t["closed"].to_numpy()
    overlaps = np.zeros(500, dtype=np.int64)
    for layer, cnt in [(0, 2), (1, 1)]:
        mine = closed[t["layer"].to_numpy() == layer]
        overlaps += mine[rng.random((500, 4)).argsort(1)[:, :cnt]].sum(1)
    assert c.set_overlaps.tolist() == overlaps.tolist()
    assert c.p_layer_matched == (1 + int((overlaps >= 3).sum())) / 501


def test_circuit_arguments_are_checked_where_they_enter():
    from tl_idempotence.errors import OptionError, OptionTypeError

    t = circuit_heads()
    pairs = [(0, 0), (1, 1)]
    assert circuit_overlap(t, pairs, 0.9).summary == circuit_overlap(t, pairs, 0.9, n_sets=999, seed=0).summary
    one = circuit_overlap(t, pairs, 0.9, n_sets=1)  # one set is allowed: p is 1/2 or 1
    assert (
        one.summary["n_sets"] == 1 and one.p_layer_matched in (0.5, 1.0) and one.summary["p_layer_matched_floor"] == 0.5
    )
    assert one.set_overlaps.dtype == np.int64
    for n, msg in [(0, "n_sets must be >= 1; got 0."), ((1 << 20) + 1, "n_sets must be <= 1048576; got 1048577.")]:
        with pytest.raises(OptionError) as e:
            circuit_overlap(t, pairs, 0.9, n_sets=n)
        assert str(e.value) == msg
    with pytest.raises(OptionTypeError) as e:
        circuit_overlap(t, pairs, 0.9, roles=t)
    assert str(e.value) == "roles must be a HeadRoles (tli.head_roles); got DataFrame."
    roles = roles_for(induction=INDUCTION, copying=COPYING)
    c = circuit_overlap(t, pairs, 0.9, roles=roles, n_sets=9)
    assert list(c.heads.columns) == ["layer", "head", "P", "alpha", "closed", "previous_token", "duplicate_token",
                                     "induction", "copying"]  # fmt: skip
    assert c.heads["induction"].tolist() == [INDUCTION[0], INDUCTION[5]]
    assert c.heads["copying"].tolist()[0] == COPYING[0] and np.isnan(c.heads["copying"].tolist()[1])
    partial = roles_for(induction=INDUCTION)
    partial = HeadRoles(
        table=partial.table.drop(columns=["copying"]), summary=partial.summary, info=partial.info
    )  # only the roles the table has
    assert list(circuit_overlap(t, pairs, 0.9, roles=partial, n_sets=9).heads.columns)[-1] == "induction"


def test_association_arguments_are_checked_where_they_enter():
    from tl_idempotence.errors import OptionError, OptionTypeError

    roles = roles_for(induction=INDUCTION, copying=COPYING)
    a = role_association(heads_table(), roles, 0.9, n_permutations=99)
    pd.testing.assert_frame_equal(a.association, role_association(heads_table(), roles, 0.9, 99, seed=0).association)
    assert a.summary["seed"] == 0
    with pytest.raises(OptionTypeError) as e:
        role_association(heads_table(), roles.table, 0.9)  # type: ignore[arg-type]
    assert str(e.value) == "roles must be the HeadRoles of tli.head_roles(model); got DataFrame."
    for n, msg in [
        (0, "n_permutations must be >= 1; got 0."),
        ((1 << 20) + 1, "n_permutations must be <= 1048576; got 1048577."),
    ]:
        with pytest.raises(OptionError) as e:
            role_association(heads_table(), roles, 0.9, n_permutations=n)
        assert str(e.value) == msg
    short = roles_for(induction=INDUCTION)
    short = HeadRoles(table=short.table.iloc[:5], summary=short.summary, info=short.info)
    with pytest.raises(OptionError) as e:
        role_association(heads_table(), short, 0.9)
    assert str(e.value) == (
        "The head roles lack 3 head(s) the report measured (['L1H1', 'L1H2', 'L1H3']): they are not of the "
        "report's model."
    )
    # a constant P: no Spearman, with the reason
    flat = role_association(heads_table(P=np.full(8, 0.5)), roles, 0.9, n_permutations=9).association
    assert np.isnan(flat.loc["induction", "spearman_rho"]) and flat.loc["induction", "note"].startswith(
        "Spearman undefined"
    )
    # the permutations come from the role's own stream, not a global one (99 resamples: p in steps of 0.02)
    import scipy.stats

    ok = ~np.isnan(P)
    for i, (role, s) in enumerate([("induction", INDUCTION), ("copying", COPYING)], start=2):
        okr = ok & ~np.isnan(s)
        want = scipy.stats.permutation_test(
            (P[okr],),
            lambda v, s=s, okr=okr: scipy.stats.spearmanr(v, s[okr]).statistic,
            permutation_type="pairings",
            n_resamples=99,
            rng=np.random.default_rng(np.random.SeedSequence([0, 6, i])),
        ).pvalue
        assert a.association.loc[role, "spearman_p"] == want, role
