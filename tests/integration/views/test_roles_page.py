"""The report page's "What the closed heads do" section and the roles figure (score vs P per role, closed marked).

On the trained lineage's last checkpoint (four closed layer-1 heads): the figure has one panel per role whose
closed and other traces hold exactly the table's P and scores, titled with the association's ρ and q; the page's
section lists the closed heads' scores, the medians beside all heads (numpy's medians), the association and the
top heads; a page without roles has no section; roles of another report or of the wrong type are refused.
"""

from __future__ import annotations

import numpy as np
import pytest

import tl_idempotence as tli
from tl_idempotence.errors import OptionError, OptionTypeError
from tl_idempotence.testing import bridge_from_dir
from tl_idempotence.views.figures import ROLE_PANELS
from tl_idempotence.views.page import roles_section_tables

pytestmark = pytest.mark.bridge

ROLES4 = ["previous_token", "duplicate_token", "induction", "copying"]


@pytest.fixture(scope="module")
def rep_and_roles(lineage):
    model = bridge_from_dir(lineage.checkpoints[-1][1])
    rep = tli.idempotence_report(model, progress=False)
    yield rep, rep.roles(model=model, n_tokens=16, n_permutations=99)
    del model  # held alive for the module: rep.model is a weak reference


def test_figure_panels_hold_the_table(rep_and_roles):
    _, assoc = rep_and_roles
    fig = assoc.figure()
    t = assoc.table
    closed, other = t[t["closed"]], t[~t["closed"]]
    assert len(fig.data) == 2 * len(ROLES4)
    for i, role in enumerate(ROLES4):
        o, c = fig.data[2 * i], fig.data[2 * i + 1]
        np.testing.assert_array_equal(c.x, closed["P"].to_numpy())
        np.testing.assert_array_equal(c.y, closed[role].to_numpy())
        np.testing.assert_array_equal(o.y, other[role].to_numpy())
        assert c.marker.symbol == "diamond" and c.text[0].startswith(closed.index[0] + ": P = ")
        rho, q = assoc.association.loc[role, ["spearman_rho", "spearman_q"]]
        # two short lines (the score, then ρ and q): four panels' titles side by side never overlap
        assert fig.layout.annotations[i].text == f"{ROLE_PANELS[role]}<br>ρ = {rho:.2f}, q = {q:.2g}"
        assert all(len(line) <= 30 for line in fig.layout.annotations[i].text.split("<br>"))
    assert fig.layout.annotations[0].font.size == 12 and fig.layout.margin.t >= 100  # room above the titles
    vlines = [s for s in fig.layout.shapes if s.type == "line"]
    assert len(vlines) == len(ROLES4) and all(s.x0 == 0.9 for s in vlines)


def test_section_tables(rep_and_roles):
    rep, assoc = rep_and_roles
    tabs = roles_section_tables(assoc, rep.threshold)
    assert tabs["closed"]["head"].tolist() == ["L1H1", "L1H0", "L1H2", "L1H3"]  # by P
    assert tabs["closed"]["induction"].tolist() == [
        f"{v:.4g}" for v in assoc.table.loc[["L1H1", "L1H0", "L1H2", "L1H3"], "induction"]
    ]
    beside = tabs["beside"].set_index("role")
    for role in ROLES4[:3]:
        assert beside.loc[role, "all heads (median)"] == f"{np.median(assoc.table[role]):.3g}"
        assert (
            beside.loc[role, "closed heads (median)"]
            == f"{np.median(assoc.table.loc[assoc.table['closed'], role]):.3g}"
        )
    # copying is signed: shown by sign, never a median of a mixed set
    for col, mask in (("all heads (median)", True), ("closed heads (median)", assoc.table["closed"])):
        c = assoc.table.loc[mask, "copying"] if col != "all heads (median)" else assoc.table["copying"]
        pos, neg = c[c > 0], -c[c < 0]
        want = (
            f"{len(pos)} copying ({'median |copying| ' + format(np.median(pos), '.3g') if len(pos) else '–'}), "
            f"{len(neg)} suppressing ({'median |copying| ' + format(np.median(neg), '.3g') if len(neg) else '–'})"
        )
        assert beside.loc["copying", col] == want
    top = tabs["top"].set_index("role").iloc[:, 0]
    assert top["induction"].startswith("L1H") and ", closed" in top["induction"]


def test_page_has_the_section_only_with_roles(rep_and_roles, tmp_path):
    rep, assoc = rep_and_roles
    rep.save_html(tmp_path / "with.html", roles=assoc)
    rep.save_html(tmp_path / "without.html")
    page = (tmp_path / "with.html").read_text("utf-8")
    assert 'id="roles"' in page and "What the closed heads do" in page
    for caption in ("Role scores of the closed heads", "next to all heads", "Association of each role", "top heads"):
        assert caption in page
    assert page.count("plotly.js v") == 1  # the roles figure uses the page's one plotly.js
    assert f"{assoc.table.loc['L1H0', 'induction']:.4g}" in page
    assert 'id="roles"' not in (tmp_path / "without.html").read_text("utf-8")


def test_roles_of_another_report_are_refused(rep_and_roles, tmp_path):
    rep, assoc = rep_and_roles
    with pytest.raises(OptionError, match=r"joined with another report .* threshold 0\.9 != 0\.95"):
        rep.with_threshold(0.95).save_html(tmp_path / "p.html", roles=assoc)
    with pytest.raises(OptionTypeError, match=r"roles must be the RoleAssociation of rep\.roles"):
        rep.save_html(tmp_path / "p.html", roles=assoc.roles)
    sub = tli.idempotence_report(rep.model, progress=False, layers=[1])  # the fixture's bridge is alive
    with pytest.raises(OptionError, match=r"not of this report's heads \(the report lacks \['L0H0'"):
        sub.save_html(tmp_path / "p.html", roles=assoc)
    assert not (tmp_path / "p.html").exists()
