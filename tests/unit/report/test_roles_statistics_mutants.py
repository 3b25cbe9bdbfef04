"""``role_association`` value by value, each test calling it itself (a mutation tool attributes a module-scoped
fixture to the first test that uses it only, so the other tests' checks would not run against a changed
line), on a table whose answers are written here by hand or by
enumeration: the exact column layout, ``n_closed`` and the medians of a role whose closed head has no score,
every note's words and separator, the role's own random stream, a P that spans exactly 0 .. 1, no warning where a
value is undefined, columns of Python objects read as numbers, and the roles kept in the result.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pandas as pd
import pytest

from helpers import bh_list, mannwhitney_exact_p
from tl_idempotence.core.heads import ModelInfo
from tl_idempotence.errors import OptionError
from tl_idempotence.probes.roles import HeadRoles
from tl_idempotence.report.roles import role_association

NAN = math.nan
LABELS = [f"L{a}H{b}" for a in range(2) for b in range(4)]
#                 L0H0  L0H1  L0H2  L0H3  L1H0  L1H1  L1H2  L1H3
P = np.array([1.00, 0.20, 0.50, NAN, 0.97, 0.00, 0.92, 0.30])  # spans exactly 0 .. 1; closed: L0H0 L1H0 L1H2
ALPHA = np.array([0.5, 0.1, -0.2, NAN, -0.7, 0.3, -0.4, 0.2])
PREVIOUS = np.array([0.15, 0.25, 0.35, 0.45, 0.55, 0.65, 0.75, 0.85])  # distinct (no tie: no warning)
INDUCTION = np.array([0.9, 0.1, 0.35, 0.6, 0.4, 0.05, 0.7, 0.2])  # distinct
COPYING = np.array([0.8, -0.1, 0.4, 0.2, NAN, 0.5, 0.9, -0.3])  # closed L1H0 has no copying score
DUPLICATE = np.array([NAN, 0.3, 0.2, NAN, NAN, NAN, NAN, NAN])  # two scores, neither of a closed head
COLUMNS = [
    "n",
    "spearman_rho",
    "spearman_p",
    "spearman_q",
    "n_closed",
    "median_closed",
    "median_other",
    "mannwhitney_p",
    "mannwhitney_q",
    "frac_sign_agrees_alpha",
    "note",
]


def heads_table(P=P, alpha=ALPHA, threshold=0.9) -> pd.DataFrame:
    t = pd.DataFrame(
        {"layer": [0] * 4 + [1] * 4, "head": [0, 1, 2, 3] * 2, "P": P, "alpha": alpha}, index=pd.Index(LABELS)
    )
    t["closed"] = t["P"] >= threshold
    return t


def roles_for(previous=PREVIOUS, duplicate=DUPLICATE, induction=INDUCTION, copying=COPYING) -> HeadRoles:
    t = pd.DataFrame({"layer": [0] * 4 + [1] * 4, "head": [0, 1, 2, 3] * 2, "kv_head": [0, 1, 2, 3] * 2})
    t.index = pd.Index(LABELS)
    t["previous_token"], t["duplicate_token"], t["induction"], t["copying"] = previous, duplicate, induction, copying
    t["reason"] = ""
    return HeadRoles(table=t, summary={"model_name": "made"}, info=ModelInfo(2, 4, 4, 16, 4))


def spearman_rho(x, y) -> float:
    """Spearman's ρ of distinct values: 1 − 6 Σd² / (n (n² − 1)) on the ranks."""
    rx = [sorted(x).index(v) + 1 for v in x]
    ry = [sorted(y).index(v) + 1 for v in y]
    n = len(x)
    return 1 - 6 * sum((a - b) ** 2 for a, b in zip(rx, ry)) / (n * (n * n - 1))


def test_columns_counts_medians_and_mann_whitney():
    roles = roles_for()
    r = role_association(heads_table(), roles, 0.9, n_permutations=9, seed=1)
    a = r.association
    assert r.roles is roles  # the roles joined are kept
    assert a.index.name == "role" and list(a.index) == ["previous_token", "duplicate_token", "induction", "copying",
                                                        "|copying|"]  # fmt: skip
    assert list(a.columns) == COLUMNS
    assert a["n"].tolist() == [7, 2, 7, 6, 6]  # L0H3 has no P; L1H0 no copying score
    assert a["n_closed"].tolist() == [3, 0, 3, 2, 2]  # closed L1H0 has no copying score: not counted
    # induction: closed 0.9, 0.4, 0.7; other 0.1, 0.35, 0.05, 0.2
    assert a.loc["induction", "median_closed"] == 0.7
    assert a.loc["induction", "median_other"] == pytest.approx(0.15, abs=1e-15)
    closed, other = [0, 4, 6], [1, 2, 5, 7]
    assert a.loc["induction", "mannwhitney_p"] == pytest.approx(
        mannwhitney_exact_p(INDUCTION[closed], INDUCTION[other]), rel=1e-12
    )
    # copying: closed 0.8, 0.9 (L1H0 left out); other −0.1, 0.4, 0.5, −0.3
    assert a.loc["copying", "median_closed"] == pytest.approx(0.85, abs=1e-15)
    assert a.loc["copying", "median_other"] == pytest.approx(0.15, abs=1e-15)
    assert a.loc["copying", "mannwhitney_p"] == pytest.approx(
        mannwhitney_exact_p([0.8, 0.9], [-0.1, 0.4, 0.5, -0.3]), rel=1e-12
    )
    assert a.loc["|copying|", "median_closed"] == pytest.approx(0.85, abs=1e-15)
    assert a.loc["|copying|", "median_other"] == pytest.approx(0.35, abs=1e-15)  # 0.1, 0.4, 0.5, 0.3
    # closed L0H0 (+0.8, α +0.5) agrees, L1H2 (+0.9, α −0.4) does not
    assert a.loc["copying", "frac_sign_agrees_alpha"] == 0.5
    # duplicate_token: only two scores, both of open heads
    dup = a.loc["duplicate_token"]
    assert np.isnan(dup["median_closed"]) and dup["median_other"] == 0.25 and np.isnan(dup["mannwhitney_p"])
    assert dup["note"] == (
        "Spearman undefined (fewer than 3 heads or a constant P/score); Mann-Whitney undefined: no closed head"
    )
    for col in ("spearman", "mannwhitney"):
        p = [float(v) for v in a[f"{col}_p"]]
        assert a[f"{col}_q"].dtype == np.float64
        np.testing.assert_allclose(a[f"{col}_q"].to_numpy(), bh_list(p), rtol=1e-12, atol=0)


def test_a_p_that_spans_exactly_0_to_1_has_a_correlation():
    """P from 0.0 to 1.0 (its range is 1): ρ is defined, not the constant-P NaN."""
    a = role_association(heads_table(), roles_for(), 0.9, n_permutations=9, seed=0).association
    ok = ~np.isnan(P)
    assert np.ptp(P[ok]) == 1.0
    assert a.loc["induction", "spearman_rho"] == pytest.approx(spearman_rho(P[ok], INDUCTION[ok]), abs=1e-12)
    assert np.isfinite(a.loc["induction", "spearman_p"]) and a.loc["induction", "note"] == ""


def test_all_closed_has_no_other_head_and_says_so():
    P_all = np.array([0.95, 0.96, 0.99, NAN, NAN, NAN, NAN, NAN])
    r = role_association(heads_table(P=P_all), roles_for(), 0.9, n_permutations=6)
    row = r.association.loc["induction"]
    assert row["n_closed"] == 3 and row["median_closed"] == 0.35 and np.isnan(row["median_other"])
    assert np.isnan(row["mannwhitney_p"]) and row["note"] == "Mann-Whitney undefined: no other head"


def test_no_warning_where_a_value_is_undefined():
    """An empty group's median, an empty sign agreement: NaN with a note, never numpy's 'Mean of empty slice'."""
    cop = COPYING.copy()
    cop[[0, 6]] = 0.0  # no closed head with a signed copying score
    P_all = np.array([0.95, 0.96, 0.99, NAN, NAN, NAN, NAN, NAN])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        a = role_association(heads_table(), roles_for(copying=cop), 0.9, n_permutations=9).association
        b = role_association(heads_table(P=P_all), roles_for(), 0.9, n_permutations=6).association
    assert np.isnan(a.loc["copying", "frac_sign_agrees_alpha"])
    assert a.loc["copying", "note"] == "no closed head with a signed copying score and α"
    assert np.isnan(a.loc["duplicate_token", "median_closed"])  # no closed head
    assert np.isnan(b.loc["induction", "median_other"])  # no other head


def test_each_role_permutes_with_its_own_stream():
    """Role i's permutations come from default_rng(SeedSequence([seed, 6, i])), not one stream for all."""
    import scipy.stats

    r = role_association(heads_table(), roles_for(), 0.9, n_permutations=9, seed=5).association
    ok = ~np.isnan(P)
    okc = ok & ~np.isnan(COPYING)
    for i, role, x, y in [
        (0, "previous_token", P[ok], PREVIOUS[ok]),
        (2, "induction", P[ok], INDUCTION[ok]),
        (3, "copying", P[okc], COPYING[okc]),
        (4, "|copying|", P[okc], np.abs(COPYING[okc])),
    ]:
        want = scipy.stats.permutation_test(
            (x,),
            lambda v, y=y: scipy.stats.spearmanr(v, y).statistic,
            permutation_type="pairings",
            n_resamples=9,
            rng=np.random.default_rng(np.random.SeedSequence([5, 6, i])),
        ).pvalue
        assert r.loc[role, "spearman_p"] == want, role


def test_columns_of_python_objects_are_read_as_numbers():
    """A P, closed or score column of dtype object (Python floats and bools) gives the same numbers."""
    heads = heads_table().astype({"P": object, "closed": object})
    roles = roles_for()
    roles = HeadRoles(
        table=roles.table.astype({"induction": object, "copying": object}), summary=roles.summary, info=roles.info
    )
    a = role_association(heads, roles, 0.9, n_permutations=9).association
    ok = ~np.isnan(P)
    assert a["n"].tolist() == [7, 2, 7, 6, 6] and a["n_closed"].tolist() == [3, 0, 3, 2, 2]
    assert a.loc["induction", "spearman_rho"] == pytest.approx(spearman_rho(P[ok], INDUCTION[ok]), abs=1e-12)
    assert a.loc["induction", "median_closed"] == 0.7
    assert a.loc["|copying|", "median_other"] == pytest.approx(0.35, abs=1e-15)


def test_the_missing_heads_message_names_five():
    short = roles_for()
    short = HeadRoles(table=short.table.iloc[:1], summary=short.summary, info=short.info)
    with pytest.raises(OptionError) as e:
        role_association(heads_table(), short, 0.9)
    assert str(e.value) == (
        "The head roles lack 7 head(s) the report measured (['L0H1', 'L0H2', 'L0H3', 'L1H0', 'L1H1']): they are not "
        "of the report's model."
    )
