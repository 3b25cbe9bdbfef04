"""What must hold for head roles on the induction-trained lineage (sources/lineage.py, seed 0, 200 steps).

* At the lineage's last checkpoint (induction accuracy 1.0) the heads with the highest ``induction`` score are its
  four layer-1 heads — the heads that read the repeat (measured: 0.529-0.542 on ``BOS x x`` with ``x`` as long as
  the training sequences, 16 tokens) — well above the layer-0 heads (<= 0.023). They are the four closed heads
  (P 0.907-0.928) and copy (copying score > 0.999).
* The lineage learned the task's fixed offset: with ``x`` of 24 tokens (an offset it never saw) the same heads
  score below 0.05 — what the demo notebook states next to the numbers.
* ``head_roles`` on a HookedTransformer and on a TransformerBridge of the same checkpoint gives the same table to
  float rounding (HookedTransformer: transformer-lens 3.x; skipped on 4.x).
"""

from __future__ import annotations

import numpy as np
import pytest

import tl_idempotence as tli
from helpers import hooked_or_skip
from tl_idempotence.probes.roles import ROLES

pytestmark = pytest.mark.bridge

LAYER1 = ["L1H0", "L1H1", "L1H2", "L1H3"]
LAYER0 = ["L0H0", "L0H1", "L0H2", "L0H3"]


@pytest.fixture(scope="module")
def last(lineage):
    return lineage.checkpoints[-1][1]


@pytest.fixture(scope="module")
def roles(lineage_bridge):
    return tli.head_roles(lineage_bridge, n_tokens=16)  # the lineage's seq_len: BOS x x as in training


def test_the_lineage_solves_induction(lineage):
    assert lineage.metrics["induction_acc"].iloc[-1] == 1.0


def test_top_induction_heads_are_the_layer1_heads(roles, lineage):
    t = roles.table
    top = t.sort_values("induction", ascending=False).index[:4]
    assert sorted(top) == LAYER1
    ind = t["induction"]
    assert ind[LAYER1].min() > 0.5  # measured 0.529-0.542
    assert ind[LAYER0].max() < 0.03  # measured 0.0195-0.0226
    assert ind[LAYER1].min() > 15 * ind[LAYER0].max()
    # the induction heads copy: their full OV circuit's eigenvalues are positive (Re Σλ / Σ|λ| ~ 1)
    assert t.loc[LAYER1, "copying"].min() > 0.999
    # and they are the closed heads of the report
    rep = tli.idempotence_report(lineage.checkpoints[-1][1], progress=False)
    assert sorted(rep.closed_heads.index) == LAYER1
    assoc = rep.roles(roles=roles, n_permutations=199)
    assert assoc.association.loc["induction", "median_closed"] > 0.5
    assert assoc.association.loc["induction", "median_other"] < 0.03
    assert assoc.association.loc["induction", "mannwhitney_p"] == pytest.approx(2 / 70)  # exact: 4 vs 4 separated


def test_the_lineage_learned_the_fixed_offset(lineage_bridge):
    t = tli.head_roles(lineage_bridge, n_tokens=24).table  # a repeat 24 tokens back, never seen in training
    assert t.loc[LAYER1, "induction"].max() < 0.05


def test_hooked_and_bridge_of_the_lineage_give_the_same_table(last, roles):
    hooked = hooked_or_skip(last)
    a = tli.head_roles(hooked, n_tokens=16).table
    b = roles.table
    assert list(a.index) == list(b.index)
    assert (a[["layer", "head", "kv_head"]].to_numpy() == b[["layer", "head", "kv_head"]].to_numpy()).all()
    np.testing.assert_allclose(a[list(ROLES)].to_numpy(), b[list(ROLES)].to_numpy(), rtol=0, atol=1e-6)
    assert a["reason"].tolist() == b["reason"].tolist()
