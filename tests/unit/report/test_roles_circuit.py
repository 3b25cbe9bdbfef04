"""rep.roles(model=...) (closure beside head roles) and rep.circuit(heads) (a circuit against the closed set).

Replays: on a synthetic report (2 layers of 6 heads; heads 0-1 of each exact projections, so exactly 4 closed)
a circuit given as labels, (layer, head) pairs, hook names or ``rep.hook_points`` output gives the same heads;
its ``p_hypergeom`` equals scipy's hypergeometric tail and the tail written from binomial coefficients; its
layer-matched p is near the exact probability of the construction (1/45) and reproducible for the seed;
unknown, duplicate and unmeasured heads are refused naming them. The association table of a report joined with
roles equals scipy's Spearman, medians and Mann-Whitney computed here, its q-values are BH across the roles,
a perfectly monotone role has the floor-level permutation p, and ``rep.roles(model=bridge)`` runs end to end on
a tiny TransformerBridge.
"""

from __future__ import annotations

from math import comb

import numpy as np
import pandas as pd
import pytest
import scipy.stats

import tl_idempotence as tli
from helpers import closed_pairs_layers, fake_roles
from tl_idempotence.errors import OptionError, OptionTypeError
from tl_idempotence.probes.roles import HeadRoles
from tl_idempotence.testing import bridge_from_dir, tiny_hf_dir

pytestmark = pytest.mark.bridge  # no HookedTransformer needed (its tests skip on 4.x): runs on both majors


def test_circuit_counts_and_p_values(closed_pairs_report):
    c = closed_pairs_report.circuit(["L0H0", "L0H1", "L1H0"], n_sets=4999, seed=1)
    assert c.n_overlap == 3 and c.summary["n_measured"] == 12 and c.summary["n_closed"] == 4
    assert list(c.heads.index) == ["L0H0", "L0H1", "L1H0"] and c.heads["closed"].all()
    assert c.p_hypergeom == scipy.stats.hypergeom.sf(2, 12, 4, 3)
    assert c.p_hypergeom == pytest.approx(comb(4, 3) * comb(8, 0) / comb(12, 3), rel=1e-12)  # 4/220
    # layer-matched: 2 of layer 0's 6 heads (2 closed) and 1 of layer 1's 6 (2 closed): P[overlap 3] = 1/15 · 1/3
    assert c.summary["layers"] == {0: 2, 1: 1} and c.summary["p_layer_matched_floor"] == 1 / 5000
    assert abs(c.p_layer_matched - 1 / 45) < 0.009
    assert c.p_layer_matched == (1 + int((c.set_overlaps >= 3).sum())) / 5000
    assert (
        c.p_layer_matched == closed_pairs_report.circuit(["L0H0", "L0H1", "L1H0"], n_sets=4999, seed=1).p_layer_matched
    )
    none = closed_pairs_report.circuit([(0, 4), (1, 5)])
    assert none.n_overlap == 0 and none.p_hypergeom == 1.0 and none.p_layer_matched == 1.0


def test_circuit_inputs_name_the_same_heads(closed_pairs_report):
    want = ["L0H0", "L1H3"]
    for heads in (
        want,
        [(0, 0), (1, 3)],
        [("blocks.0.attn.hook_z", 0), ("blocks.1.attn.hook_pattern", 3)],
        closed_pairs_report.hook_points(heads=[(0, 0), (1, 3)], hook="z"),
        closed_pairs_report.hook_points(
            heads=[(0, 0), (1, 3)], hook="v"
        ),  # MHA: each kv point serves its one query head
        [(np.int64(0), np.int64(0)), (1, 3)],
        closed_pairs_report.heads.loc[want],  # rows of closed_pairs_report.heads
        pd.Index(want),
    ):
        assert list(closed_pairs_report.circuit(heads).heads.index) == want, heads


def test_circuit_refusals_name_the_heads(closed_pairs_report):
    with pytest.raises(OptionError, match=r"\['L0H9'\] do not exist"):
        closed_pairs_report.circuit(["L0H1", "L0H9"])
    with pytest.raises(OptionError, match=r"\['L5H0'\] do not exist"):
        closed_pairs_report.circuit([(5, 0)])
    with pytest.raises(OptionError, match=r"\['L0H1'\] are listed more than once"):
        closed_pairs_report.circuit([(0, 1), "L0H1"])
    with pytest.raises(OptionError, match="no heads"):
        closed_pairs_report.circuit([])
    with pytest.raises(OptionTypeError, match="list of"):
        closed_pairs_report.circuit("L0H1")
    with pytest.raises(OptionTypeError, match="'X1' is not a head label"):
        closed_pairs_report.circuit(["X1"])
    with pytest.raises(OptionTypeError, match="head"):
        closed_pairs_report.circuit([(0, 1.5)])
    with pytest.raises(OptionTypeError, match="hook_points"):
        closed_pairs_report.circuit([("blocks.0.attn.hook_v", 1)])
    with pytest.raises(OptionTypeError, match="'layer' and 'head' columns"):
        closed_pairs_report.circuit(closed_pairs_report.heads[["P"]])
    with pytest.raises(OptionError, match="n_sets"):
        closed_pairs_report.circuit(["L0H1"], n_sets=0)
    one = tli.idempotence_report(closed_pairs_layers(), layers=[0], progress=False)
    with pytest.raises(OptionError, match=r"\['L1H0'\] are outside the report's measured layers \[0\]"):
        one.circuit([(0, 1), (1, 0)])


def test_roles_refusals(closed_pairs_report):
    with pytest.raises(OptionError, match=r"rep.roles\(model=...\)"):
        closed_pairs_report.roles()
    other = fake_roles(closed_pairs_report, previous_token=0.0, duplicate_token=0.0, induction=0.0, copying=0.0)
    other = HeadRoles(table=other.table.iloc[:6], summary=other.summary, info=other.info)
    with pytest.raises(OptionError, match=r"lack 6 head\(s\) the report measured \(\['L1H0'"):
        closed_pairs_report.roles(roles=other)
    with pytest.raises(OptionTypeError, match="HeadRoles"):
        closed_pairs_report.roles(roles=pd.DataFrame())
    full = fake_roles(closed_pairs_report, previous_token=0.0, duplicate_token=0.0, induction=0.0, copying=0.0)
    with pytest.raises(OptionError, match="n_permutations"):
        closed_pairs_report.roles(roles=full, n_permutations=0)
    a = closed_pairs_report.roles(roles=full, n_permutations=9).association
    assert np.isnan(a.loc["induction", "spearman_rho"]) and "constant" in a.loc["induction", "note"]


def test_roles_of_a_tiny_bridge(tmp_path):
    b = bridge_from_dir(tiny_hf_dir(tmp_path / "tiny", n_layers=2))
    rep = tli.idempotence_report(b, progress=False, threshold=0.05)
    ra = rep.roles(model=b, n_tokens=8, n_sequences=2, n_permutations=99)
    assert len(ra.table) == 18 and ra.summary["n_closed"] == int(rep.heads["closed"].sum())
    direct = tli.head_roles(b, n_tokens=8, n_sequences=2, seed=0).table
    pd.testing.assert_frame_equal(ra.table[direct.columns], direct)
    html = ra._repr_html_()
    assert "RoleAssociation" in html and "association with closure" in html and "spearman_rho" in html
    assert "induction" in html and "mannwhitney_q" in html
