"""Identical and shared checkpoints are marked in a trajectory's figures; the trajectory's integrity unit tests are
tests/unit/studies/test_trajectory_integrity.py.
"""

from __future__ import annotations

import pytest

import tl_idempotence as tli
from helpers import mixed_lineage

N_LAYERS = 4


@pytest.fixture(scope="module")
def lineage(tmp_path_factory):
    """A (step 0), B (step 1: every o_proj changed), C (a byte copy of B), D (B with A's shard holding
    layer 0's o_proj): D's layers come partly from A, partly from B (helpers.mixed_lineage)."""
    return mixed_lineage(tmp_path_factory.mktemp("lineage"), N_LAYERS)


@pytest.fixture(scope="module")
def traj(lineage):
    ck = [(f"step{i}", lineage[k]) for i, k in enumerate("ABCD")]
    with pytest.warns(UserWarning) as rec:
        t = tli.trajectory(ck, progress=False)
    return t, [str(w.message) for w in rec]


def test_identical_and_shared_checkpoints_are_marked_in_the_figures(traj):
    t, _ = traj
    fig = t.figure(log_y=False)
    notes = [a.text for a in fig.layout.annotations if a.text]
    assert any("identical to step1" in n for n in notes), notes
    assert any("shares layers with step0,step1,step2" in n for n in notes), notes
    assert len(fig.layout.shapes) >= 2
    summ = t.summary_figure(log_y=False)
    marked = [tr for tr in summ.data if tr.name == "identical / shared-layer checkpoint"]
    assert len(marked) == 1 and list(marked[0].x) == [2.0, 3.0]  # x = the step parsed from "step2", "step3"
