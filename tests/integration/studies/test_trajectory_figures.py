"""Identical and shared checkpoints are marked in a trajectory's figures; the trajectory's integrity unit tests are
tests/unit/studies/test_trajectory_integrity.py.
"""

from __future__ import annotations


def test_identical_and_shared_checkpoints_are_marked_in_the_figures(mixed_traj):
    t, _ = mixed_traj
    fig = t.figure(log_y=False)
    notes = [a.text for a in fig.layout.annotations if a.text]
    assert any("identical to step1" in n for n in notes), notes
    assert any("shares layers with step0,step1,step2" in n for n in notes), notes
    assert len(fig.layout.shapes) >= 2
    summ = t.summary_figure(log_y=False)
    marked = [tr for tr in summ.data if tr.name == "identical / shared-layer checkpoint"]
    assert len(marked) == 1 and list(marked[0].x) == [2.0, 3.0]  # x = the step parsed from "step2", "step3"
