"""``tl-idempotence report --roles``: head roles computed on the model the report measured and joined with it.

The zoo route is replayed on the trained lineage's last checkpoint (GQA, four closed heads) booted as a
TransformerBridge (``zoo.load`` replaced by a loader
that records what it was asked for): the CSV's role columns equal ``tli.head_roles`` of the same model with the
same seed, the JSON carries the association table (equal to ``rep.roles``), the page gets the section, and the
text summary the association. A checkpoint path has no model to run: ``--roles`` on it exits 2 before any work,
saying why; a report measured from weights only refuses ``rep.roles()`` naming what it was measured from.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

import tl_idempotence as tli
from tl_idempotence import cli
from tl_idempotence.errors import OptionError, UnsupportedModelError
from tl_idempotence.probes.roles import ROLES
from tl_idempotence.testing import bridge_from_dir, tiny_hf_dir

pytestmark = pytest.mark.bridge


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return tiny_hf_dir(tmp_path_factory.mktemp("cli_roles") / "tiny", n_layers=2, seed=3)  # 18 heads, 3 kv heads


@pytest.fixture(scope="module")
def bridge(lineage):
    return bridge_from_dir(lineage.checkpoints[-1][1])


@pytest.fixture
def zoo_is_tiny(monkeypatch, bridge):
    """``zoo.load`` returns the tiny bridge and records its arguments (the route ``--roles`` takes)."""
    from tl_idempotence.sources import zoo

    calls = []

    def load(name, **kw):
        calls.append((name, kw))
        return bridge

    monkeypatch.setattr(zoo, "load", load)
    return calls


def _exit_code(argv) -> int:
    with pytest.raises(SystemExit) as ei:
        cli.main(argv)
    return ei.value.code


def test_roles_on_a_checkpoint_path_exits_2_saying_why(tiny_dir, tmp_path, capsys):
    assert _exit_code(["report", str(tiny_dir), "--roles", "--out", str(tmp_path / "r.html")]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert (
        "--roles runs TransformerLens's head detector on the model, and a checkpoint path is read as weights only"
        in err
    )
    assert not (tmp_path / "r.html").exists()


def test_roles_flag_in_help(capsys):
    assert _exit_code(["report", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "--roles" in out and "seeded by --seed" in out


def test_zoo_route_joins_the_roles(zoo_is_tiny, bridge, tmp_path, capsys):
    csv, page = tmp_path / "h.csv", tmp_path / "r.html"
    args = ["report", "smollm2-135m", "--roles", "--seed", "4", "--quiet", "--csv", str(csv), "--out", str(page)]
    assert cli.main(args) == 0
    out = capsys.readouterr().out
    assert zoo_is_tiny and zoo_is_tiny[0][0] == "smollm2-135m"  # a model object was loaded (not the file source)
    assert "head roles vs closure" in out and "induction" in out
    heads = pd.read_csv(csv).set_index("label")
    want = tli.head_roles(bridge, seed=4).table
    assert list(heads.columns[-4:]) == list(ROLES)
    np.testing.assert_array_equal(heads.loc[want.index, list(ROLES)].to_numpy(), want[list(ROLES)].to_numpy())
    html = page.read_text("utf-8")
    assert 'id="roles"' in html and "What the closed heads do" in html and "Association of each role" in html


def test_zoo_route_json_carries_the_association(zoo_is_tiny, bridge, tmp_path, capsys):
    assert cli.main(["report", "smollm2-135m", "--roles", "--json", "--quiet", "--threshold", "0.91"]) == 0
    got = json.loads(capsys.readouterr().out)
    rep = tli.idempotence_report(bridge, threshold=0.91, progress=False)
    assoc = rep.roles(model=bridge, seed=0)
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


def test_a_report_from_weights_only_refuses_roles_naming_its_source(tiny_dir):
    rep = tli.idempotence_report(tiny_dir, progress=False)  # a checkpoint path: weights only
    with pytest.raises(OptionError, match=r"needs a TransformerLens model to run .* gives weights only"):
        rep.roles()
    from tl_idempotence.sources.checkpoint import from_path

    with pytest.raises(UnsupportedModelError, match="gives weights only, not a model TransformerLens can run"):
        rep.roles(model=from_path(tiny_dir))  # a bare HeadSource
