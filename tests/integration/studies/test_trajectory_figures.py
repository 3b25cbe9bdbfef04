"""Identical and shared checkpoints are marked in a trajectory's figures; the trajectory's integrity unit tests are
tests/unit/studies/test_trajectory_integrity.py.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

import tl_idempotence as tli
from helpers import llama_like

N_LAYERS = 4


def index_of(d: Path) -> dict[str, str]:
    return json.loads((d / "model.safetensors.index.json").read_text())["weight_map"]


def resave(d: Path, change) -> None:
    """Re-save every shard with ``change(name, tensor)`` applied (None: keep)."""
    for shard in sorted(set(index_of(d).values())):
        t = load_file(str(d / shard))
        for name in list(t):
            new = change(name, t[name])
            if new is not None:
                t[name] = new.contiguous()
        save_file(t, str(d / shard), metadata={"format": "pt"})


@pytest.fixture(scope="module")
def lineage(tmp_path_factory):
    """A (step 0), B (step 1: every o_proj changed), C (a byte copy of B), D (B with A's shard holding
    layer 0's o_proj): D's layers come partly from A, partly from B."""
    root = tmp_path_factory.mktemp("lineage")
    A, _, _ = llama_like(root / "A", n_layers=N_LAYERS, nq=6, nkv=2, dm=32, dh=4, n_shards=4)
    B = root / "B"
    shutil.copytree(A, B)
    resave(B, lambda n, t: 0.5 * t + 0.02 if n.endswith("o_proj.weight") else None)
    C = root / "C"
    shutil.copytree(B, C)
    D = root / "D"
    shutil.copytree(B, D)
    wm = index_of(A)
    shard = wm["model.layers.0.self_attn.o_proj.weight"]
    shutil.copyfile(A / shard, D / shard)
    from_A = {l for l in range(N_LAYERS) if wm[f"model.layers.{l}.self_attn.o_proj.weight"] == shard}
    assert 0 < len(from_A) < N_LAYERS  # the test needs a genuinely mixed checkpoint
    return {"A": A, "B": B, "C": C, "D": D, "from_A": from_A}


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
