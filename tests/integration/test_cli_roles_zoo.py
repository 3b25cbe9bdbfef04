"""The CLI's --roles on the zoo route, replayed on the trained lineage's last checkpoint (training the lineage takes a
minute on a loaded machine); the CLI roles' unit tests are tests/unit/test_cli_roles.py.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

import tl_idempotence as tli
from tl_idempotence import cli
from tl_idempotence.probes.roles import ROLES

pytestmark = pytest.mark.bridge


@pytest.fixture
def zoo_is_tiny(monkeypatch, lineage_bridge):
    """``zoo.load`` returns the tiny bridge and records its arguments (the route ``--roles`` takes)."""
    from tl_idempotence.sources import zoo

    calls = []

    def load(name, **kw):
        calls.append((name, kw))
        return lineage_bridge

    monkeypatch.setattr(zoo, "load", load)
    return calls


def test_zoo_route_joins_the_roles(zoo_is_tiny, lineage_bridge, tmp_path, capsys):
    csv, page = tmp_path / "h.csv", tmp_path / "r.html"
    args = ["report", "smollm2-135m", "--roles", "--seed", "4", "--quiet", "--csv", str(csv), "--out", str(page)]
    assert cli.main(args) == 0
    out = capsys.readouterr().out
    assert zoo_is_tiny and zoo_is_tiny[0][0] == "smollm2-135m"  # a model object was loaded (not the file source)
    assert "head roles vs closure" in out and "induction" in out
    heads = pd.read_csv(csv).set_index("label")
    want = tli.head_roles(lineage_bridge, seed=4).table
    assert list(heads.columns[-4:]) == list(ROLES)
    np.testing.assert_array_equal(heads.loc[want.index, list(ROLES)].to_numpy(), want[list(ROLES)].to_numpy())
    html = page.read_text("utf-8")
    assert 'id="roles"' in html and "What the closed heads do" in html and "Association of each role" in html


def test_zoo_route_json_carries_the_association(zoo_is_tiny, lineage_bridge, tmp_path, capsys):
    assert cli.main(["report", "smollm2-135m", "--roles", "--json", "--quiet", "--threshold", "0.91"]) == 0
    got = json.loads(capsys.readouterr().out)
    rep = tli.idempotence_report(lineage_bridge, threshold=0.91, progress=False)
    assoc = rep.roles(model=lineage_bridge, seed=0)
    rows = {r["role"]: r for r in got["roles"]["association"]}
    assert list(rows) == list(assoc.association.index)
    for role, row in assoc.association.iterrows():
        for col in ("spearman_rho", "spearman_p", "spearman_q", "mannwhitney_p", "median_closed"):
            v = row[col]
            assert rows[role][col] == (None if np.isnan(v) else pytest.approx(v, rel=1e-15, abs=0)), (role, col)
    assert got["roles"]["summary"]["n_closed"] == int(rep.summary["n_closed"])
    closed = {h["label"]: h for h in got["closed_heads"]}
    assert set(closed) == set(rep.closed_heads.index) == {"L1H0", "L1H1"}  # P 0.918 and 0.928 (seed 0 lineage)
    for lab, h in closed.items():
        for role in ROLES:
            assert h[role] == pytest.approx(assoc.table.loc[lab, role], rel=1e-15, abs=0)
