"""Readings that cannot mislead: the report's headline separates closure (an effect size) from the
scramble q (a significance), every display leads with it, the p- and q-values say what they test, and a signed
score (copying) is shown by sign with its agreement with α, never as a signed median of a mixed set. Exact
sentences on constructed reports (tests/helpers.py)."""

from __future__ import annotations

import html

import markupsafe
import numpy as np
import pytest
import torch

import tl_idempotence as tli
from helpers import closed_pairs_layers, fake_roles, gaussian_layer
from tl_idempotence.core.heads import LayerHeads
from tl_idempotence.core.readings import copying_by_sign, copying_sign_sentence
from tl_idempotence.report.export import export_record
from tl_idempotence.report.roles import role_association
from tl_idempotence.views.notebook import result_html
from tl_idempotence.views.page import closed_heads_table, p_value_note, report_html, roles_section_tables

pytestmark = pytest.mark.bridge  # no model


@pytest.fixture(scope="module")
def rep():
    """12 heads in 2 layers, 4 closed (α = +0.5 in layer 0, −0.5 in layer 1), 99 scramble draws."""
    return tli.idempotence_report(closed_pairs_layers(), nulls=99, progress=False)


# ----------------------------------------------------------------------------- the report's headline


def test_headline_separates_closed_from_significant(rep):
    assert rep.headline == (
        "4 of 12 heads are closed (P ≥ 0.9); q ≤ 0.05 for 4 of 12 (trained orientation beats its scramble "
        "significantly for 33.3 % of them)."
    )
    assert int(rep.heads["closed"].sum()) == 4 and int((rep.heads["q_value"] <= 0.05).sum()) == 4
    # at another threshold the closed count moves, the q count does not
    assert rep.with_threshold(0.2).headline.startswith("6 of 12 heads are closed (P ≥ 0.2); q ≤ 0.05 for 4 of 12 ")


def test_headline_almost_everywhere_none_no_null_and_heads_not_compared():
    g = torch.Generator().manual_seed(0)
    V = torch.stack([torch.linalg.qr(torch.randn(12, 3, generator=g, dtype=torch.float64)).Q for _ in range(3)])
    projections = [LayerHeads(0, V.clone(), V, torch.arange(3))]  # O = V orthonormal: P = 1, beats every draw
    assert tli.idempotence_report(projections, nulls=19, progress=False).headline == (
        "3 of 3 heads are closed (P ≥ 0.9); q ≤ 0.05 for 3 of 3 (trained orientation beats its scramble almost "
        "everywhere, as in the paper)."
    )
    few = tli.idempotence_report([gaussian_layer(0, 4, 4, 16, 4, seed=1)], nulls=9, progress=False)
    assert few.heads["p_value"].min() >= 0.1  # 9 draws: p >= 1/10, so no q <= 0.05
    assert few.headline == (
        "0 of 4 heads are closed (P ≥ 0.9); q ≤ 0.05 for 0 of 4 (trained orientation beats its scramble "
        "significantly for no head)."
    )
    none = tli.idempotence_report(closed_pairs_layers(), progress=False)
    assert none.headline == (
        "4 of 12 heads are closed (P ≥ 0.9); no scramble null was run (nulls=0), so there is no p- or q-value."
    )
    zero = tli.idempotence_report(closed_pairs_layers(alpha=(1.0, 1.0), zero_l1h5=True), nulls=99, progress=False)
    assert zero.headline.startswith("4 of 12 heads are closed (P ≥ 0.9); q ≤ 0.05 for 4 of 11 heads compared (")


def test_every_display_leads_with_the_headline(rep, tmp_path):
    nb = result_html(rep)
    assert nb.startswith(f"<div><b>IdempotenceReport</b><p>{html.escape(rep.headline)} ")
    page = report_html(rep)
    assert f'<p class="headline" id="headline">{html.escape(rep.headline, quote=True)} ' in page
    rec = export_record(rep)
    assert next(iter(rec)) == "headline" and rec["headline"] == rep.headline
    assert "scramble_effect" in rec["closed_heads"][0]
    assert tli.load_report(rep.save(tmp_path / "r")).headline == rep.headline


def test_p_and_q_say_what_they_test_and_the_effect_is_beside_them(rep):
    note = p_value_note(rep)
    assert note.startswith(
        "The scramble p and its BH q test trained orientation vs Haar-scrambled orientation with the same spectra "
        "(not closure): "
    )
    assert "cannot go below 1/100 = 0.01" in note and "scramble effect = log10(P / the median" in note
    for shown in (result_html(rep), report_html(rep)):
        assert html.escape(note) in shown or str(markupsafe.escape(note)) in shown
    t = closed_heads_table(rep)
    cols = list(t.columns)
    assert cols.index("scramble effect (log10 P / null median)") == cols.index("BH q-value") + 1
    # four heads at the p floor (p = 0.01, the same q): the effect tells them apart
    assert t["scramble p-value"].tolist() == ["0.01"] * 4 and t["BH q-value"].nunique() == 1
    want = [f"{v:.3g}" for v in rep.closed_heads["scramble_effect"]]
    assert t["scramble effect (log10 P / null median)"].tolist() == want and len(set(want)) == 4


# ----------------------------------------------------------------------------- a signed score, by sign


#: Copying of the 12 heads (rows of closed_pairs_layers: L0H0..L0H5, L1H0..L1H5). Closed: L0H0, L0H1 (α = +0.5) copy,
#: L1H0, L1H1 (α = −0.5) suppress, so the signed median of the closed heads is (0.97 − 0.96) / 2 = 0.005: near 0
#: although every closed head copies or suppresses at |copying| ≈ 0.97.
COPYING = [0.99, 0.97, 0.2, -0.3, 0.1, 0.4, -0.98, -0.96, -0.5, 0.6, -0.7, 0.0]


def test_copying_by_sign_counts_medians_and_agreement():
    b = copying_by_sign([0.99, 0.97, -0.98, -0.96, np.nan, 0.0], [0.5, 0.5, -0.5, 0.5, 1.0, 1.0])
    assert b == {
        "n_copying": 2,
        "median_abs_copying": pytest.approx(0.98),
        "n_suppressing": 2,
        "median_abs_suppressing": pytest.approx(0.97),
        "n_zero": 1,
        "n_sign_compared": 4,
        "n_sign_agrees": 3,
    }
    assert copying_sign_sentence(b) == (
        "closed heads: 2 copying (median |copying| 0.98), 2 suppressing (median |copying| 0.97), 1 at 0; "
        "sign(copying) = sign(α) for 3 of 4"
    )


@pytest.fixture(scope="module")
def assoc(rep):
    roles = fake_roles(rep, previous_token=0.1, duplicate_token=0.1, induction=0.1, copying=COPYING)
    return role_association(rep.heads, roles, rep.threshold, n_permutations=99, seed=0)


def test_roles_headline(assoc):
    q = assoc.association["mannwhitney_q"]
    assert q.idxmin() == "|copying|"
    assert assoc.headline == (
        f"What the 4 closed heads of 12 do: |copying| separates them from the other heads (Mann-Whitney q "
        f"{q.min():.2g}, closed vs other heads). closed heads: 2 copying (median |copying| 0.98), 2 suppressing "
        "(median |copying| 0.97); sign(copying) = sign(α) for 4 of 4."
    )
    assert q.min() <= 0.05


def test_the_page_and_the_notebook_show_copying_by_sign_never_its_signed_median(rep, assoc):
    tabs = roles_section_tables(assoc, rep.threshold)
    beside = tabs["beside"].set_index("role")
    assert beside.loc["copying", "closed heads (median)"] == (
        "2 copying (median |copying| 0.98), 2 suppressing (median |copying| 0.97)"
    )
    # other heads: 0.2, 0.1, 0.4, 0.6 copy; -0.3, -0.5, -0.7 suppress; 0.0 neither
    assert beside.loc["copying", "other heads (median)"] == (
        "4 copying (median |copying| 0.3), 3 suppressing (median |copying| 0.5)"
    )
    assert beside.loc["copying", "all heads (median)"] == (
        "6 copying (median |copying| 0.5), 5 suppressing (median |copying| 0.7)"
    )
    assoc_tab = tabs["association"].set_index("role")
    assert assoc_tab.loc["copying", "sign(copying) = sign(α), closed"] == "4 of 4"
    top = tabs["top"].set_index("role")
    assert top.loc["copying (by |copying|)"].iloc[0].startswith("L0H0 (0.99, P 1.0000, closed); L1H0 (-0.98, ")
    nb = result_html(assoc)
    assert nb.startswith(f"<div><b>RoleAssociation</b><p>{html.escape(assoc.headline)}</p>")
    assert (
        "closed heads: 2 copying (median |copying| 0.98), 2 suppressing (median |copying| 0.97); sign(copying) = "
        "sign(α) for 4 of 4; other heads: 4 copying (median |copying| 0.3), 3 suppressing (median |copying| 0.5), "
        "1 at 0" in html.unescape(nb)
    )
    # the signed medians of the copying row (closed 0.005) are not shown
    signed = assoc.association.loc["copying", "median_closed"]
    assert signed == pytest.approx(0.005)
    assert "by sign, below" in nb and format(signed, ".4g") not in nb
    # the sign agreement is the table's first column (it was the last, off-screen at 1280 px)
    table = nb[nb.index("association with closure") :]
    header = table[table.index("<thead>") : table.index("</thead>")]
    assert header.index("frac_sign_agrees_alpha") < header.index("spearman_rho"), header
    page = report_html(rep, roles=assoc)
    assert f"Roles: {html.escape(assoc.headline)}" in page
    # the first screen (before the first section) names every section the run computed, roles among them
    first = page[: page.index('<h2 id="closed-heads">')]
    contents = first[first.index('<p class="note" id="contents">') :]
    for anchor, name in (("controls", "Null controls"), ("roles", "What the closed heads do")):
        assert f'<a href="#{anchor}">{name}' in contents, contents[:600]
        assert f'<h2 id="{anchor}">' in page
    plain = report_html(rep)
    assert '<a href="#roles">' not in plain and '<a href="#controls">' in plain  # only the sections computed


def test_circuit_headline_names_the_enrichment_test_and_what_chance_gives(rep):
    c = rep.circuit(["L0H0", "L0H2", "L1H3"])
    assert c.headline == (
        "Circuit of 3 heads vs the 4 closed heads: 1 of them closed, no more than chance (chance expects 1 among 12 "
        f"measured heads); enrichment (hypergeometric) p 0.745, layer-matched p {c.p_layer_matched:.3g} (floor "
        "0.001)."
    )
    assert c.p_hypergeom == pytest.approx(1 - 56 / 220, rel=1e-12)  # 1 - C(8,3)/C(12,3)
    two = rep.circuit(["L0H0", "L1H1", "L1H3"])
    assert two.headline.startswith("Circuit of 3 heads vs the 4 closed heads: 2 of them closed, more than chance ")
    assert f"<p>{html.escape(c.headline)}</p>" in result_html(c)
