"""The roles' association statistic against scipy on a tiny bridge (moved out of the unit tier for its time); the
roles' unit tests are tests/unit/report/test_roles_circuit.py.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import scipy.stats

from helpers import fake_roles

pytestmark = pytest.mark.bridge  # no HookedTransformer needed (its tests skip on 4.x): runs on both majors


def test_association_equals_scipy(closed_pairs_report):
    P = closed_pairs_report.heads["P"].to_numpy()
    rng = np.random.default_rng(0)
    induction = P + 0.0  # perfectly monotone in P
    noise = rng.uniform(size=12)
    copying = np.where(
        closed_pairs_report.heads["closed"],
        np.sign(closed_pairs_report.heads["alpha"]) * 0.8,
        rng.uniform(-0.2, 0.2, 12),
    )
    roles = fake_roles(closed_pairs_report, previous_token=noise, duplicate_token=noise[::-1].copy(),
                       induction=induction, copying=copying)  # fmt: skip
    ra = closed_pairs_report.roles(roles=roles, n_permutations=999, seed=2)
    a = ra.association
    assert list(a.index) == ["previous_token", "duplicate_token", "induction", "copying", "|copying|"]
    assert list(ra.table.columns[-3:]) == ["P", "alpha", "closed"] and list(ra.table.index) == list(
        closed_pairs_report.heads.index
    )
    closed = closed_pairs_report.heads["closed"].to_numpy()
    for role, s in [("previous_token", noise), ("induction", induction), ("copying", copying),
                    ("|copying|", np.abs(copying))]:  # fmt: skip
        r = a.loc[role]
        assert r["spearman_rho"] == pytest.approx(scipy.stats.spearmanr(P, s).statistic, abs=1e-12)
        assert r["median_closed"] == np.median(s[closed]) and r["median_other"] == np.median(s[~closed])
        assert r["mannwhitney_p"] == scipy.stats.mannwhitneyu(s[closed], s[~closed]).pvalue
        assert 2 / 1000 <= r["spearman_p"] <= 1  # two-sided: twice the one-sided (1 + count) / (n + 1)
    assert a.loc["induction", "spearman_rho"] == pytest.approx(1.0) and a.loc["induction", "spearman_p"] == 2 / 1000
    assert a.loc["copying", "frac_sign_agrees_alpha"] == 1.0 and np.isnan(a.loc["induction", "frac_sign_agrees_alpha"])
    for col in ("spearman", "mannwhitney"):
        np.testing.assert_allclose(
            a[f"{col}_q"], scipy.stats.false_discovery_control(a[f"{col}_p"], method="bh"), rtol=1e-12
        )
    again = closed_pairs_report.roles(roles=roles, n_permutations=999, seed=2).association
    pd.testing.assert_frame_equal(again, a)
    assert ra.summary["p_floor"] == 2 / 1000 and ra.summary["n_closed"] == 4
    c = closed_pairs_report.circuit(["L0H0"], roles=ra)
    assert c.heads.loc["L0H0", "induction"] == induction[0]
