"""Every join of two results takes one content check, and every result is immutable.

Replays, on tiny constructed models: the report's own model edited in place after the report was made
(``W_V[0] += 1`` on a HookedTransformer; the same edit on a TransformerBridge, whose ``W_V`` is a view of the
checkpoint's ``v_proj``) is refused by ``rep.roles()``, ``rep.roles(model=m)``, the attention view's and the
ablation's join (:meth:`IdempotenceReport.check_joins`), never joined to the old P; ``rep.roles(roles=hr,
model=other)`` is refused; ``rep.circuit(roles=...)`` refuses roles of a bigger model, of other weights, roles made
by hand without weight fingerprints and a RoleAssociation of another report; every frame a result hands out can be
edited without changing the result, its summary and the report's ``info.processing``/``info.extra`` refuse
edits, and ``save`` then ``load`` round-trips after such edits; ``head_roles`` on NaN/inf weights raises
``WeightError`` naming layer and head, and on ``d_vocab_out != d_vocab`` ``UnsupportedModelError`` naming both.
"""

from __future__ import annotations

import copy
import dataclasses
import pickle

import numpy as np
import pandas as pd
import pytest
import torch

import tl_idempotence as tli
from helpers import closed_pairs_layers, fake_roles
from tl_idempotence.errors import OptionError, ReportMismatchError, UnsupportedModelError, WeightError
from tl_idempotence.probes.roles import ROLES, HeadRoles
from tl_idempotence.testing import bridge_from_dir, tiny_hf_dir

pytestmark = pytest.mark.filterwarnings("ignore:HookedTransformer is deprecated:DeprecationWarning")

FAST = {"n_tokens": 4, "n_sequences": 1}


def tiny_hooked(seed: int = 0, n_layers: int = 2, d_vocab: int = 40, d_vocab_out: int = -1):
    """A HookedTransformer with random weights (2 layers of 4 heads, d_model 16, d_head 4)."""
    try:
        from transformer_lens import HookedTransformer, HookedTransformerConfig
    except ImportError as e:  # pragma: no cover - transformer-lens 4.x
        pytest.skip(f"transformer-lens 4.x has no HookedTransformer: {e}")
    cfg = HookedTransformerConfig(
        n_layers=n_layers, d_model=16, n_ctx=32, d_head=4, n_heads=4, d_vocab=d_vocab, d_vocab_out=d_vocab_out,
        attn_only=True, normalization_type=None, act_fn="relu", seed=seed,
    )  # fmt: skip
    m = HookedTransformer(cfg)
    m.eval()
    return m


@pytest.fixture
def hooked_report():
    m = tiny_hooked()
    return m, tli.idempotence_report(m, progress=False, threshold=0.3)


@pytest.fixture(scope="module")
def synthetic():
    return tli.idempotence_report(closed_pairs_layers(), progress=False)


# 1. one content check for every join ---------------------------------------------------------------------------


def test_the_reports_own_model_edited_in_place_is_refused(hooked_report):
    m, rep = hooked_report
    before = rep.roles(n_permutations=9, **FAST)  # the same model, unchanged: joined
    assert len(before.table) == 8 and rep.model is m
    saved = m.blocks[0].attn.W_V.detach().clone()
    with torch.no_grad():
        m.blocks[0].attn.W_V[0] += 1
    for call in (
        lambda: rep.roles(n_permutations=9, **FAST),
        lambda: rep.roles(model=m, n_permutations=9, **FAST),
        lambda: rep.check_joins(model=m, processing_may_differ=True),  # the attention view's and ablation's join
    ):
        with pytest.raises(ReportMismatchError, match=r"own model.*changed in place.*layer 0's attention weights"):
            call()
    # roles computed before the edit are of the measured weights (content): still joined, and the same numbers
    again = rep.roles(roles=before.roles, n_permutations=9)
    pd.testing.assert_frame_equal(again.association, before.association)
    assert rep.circuit(["L0H0"], roles=before.roles, n_sets=9).heads.loc["L0H0", "induction"] == pytest.approx(
        before.table.loc["L0H0", "induction"]
    )
    edited = tli.head_roles(m, **FAST)  # roles of the edited model: refused by rep.roles(roles=) and rep.circuit
    with pytest.raises(ReportMismatchError, match="layer 0's attention weights differ"):
        rep.roles(roles=edited, n_permutations=9)
    with pytest.raises(ReportMismatchError, match="layer 0's attention weights differ"):
        rep.circuit(["L0H0"], roles=edited)
    with torch.no_grad():
        m.blocks[0].attn.W_V.copy_(saved)  # undone, bit for bit: joined again
    assert rep.roles(n_permutations=9, **FAST).association.equals(before.association)


def test_a_bridge_edited_in_place_is_refused(tmp_path):
    b = bridge_from_dir(tiny_hf_dir(tmp_path / "tiny", n_layers=2))
    rep = tli.idempotence_report(b, progress=False, threshold=0.05)
    assert rep.model is b
    with torch.no_grad():
        b.blocks[1].attn.W_V[0] += 1  # a view of layer 1's v_proj weight: the checkpoint model changes
    with pytest.raises(ReportMismatchError, match=r"own model.*layer 1's attention weights differ"):
        rep.roles(n_permutations=9, **FAST)
    with pytest.raises(ReportMismatchError, match=r"own model.*layer 1's attention weights differ"):
        rep.roles(model=b, n_permutations=9, **FAST)


def test_roles_with_another_model_is_refused(hooked_report):
    m, rep = hooked_report
    hr = tli.head_roles(m, **FAST)
    other = tiny_hooked(seed=1)  # the same sizes and name, other weights
    with pytest.raises(ReportMismatchError, match=r"The model given.*layer 0's attention weights differ"):
        rep.roles(roles=hr, model=other, n_permutations=9)
    twin = tiny_hooked(seed=0)  # another object of the same weights: by content the roles' model, accepted
    assert rep.roles(roles=hr, model=twin, n_permutations=9).roles is hr


def test_circuit_roles_must_be_the_reports(hooked_report, synthetic):
    _, rep = hooked_report
    bigger = tli.head_roles(tiny_hooked(n_layers=3), **FAST)
    with pytest.raises(ReportMismatchError, match="model sizes differ: n_layers 2 vs 3"):
        rep.circuit(["L0H0"], roles=bigger)
    other = tli.head_roles(tiny_hooked(seed=1), **FAST)
    with pytest.raises(ReportMismatchError, match="layer 0's attention weights differ"):
        rep.circuit(["L0H0"], roles=other)
    by_hand = HeadRoles(
        table=fake_roles(synthetic, **dict.fromkeys(ROLES, 0.5)).table, summary={"model_name": "x"}, info=synthetic.info
    )
    with pytest.raises(ReportMismatchError, match="the roles record no weight fingerprint of layer 0"):
        synthetic.circuit(["L0H0"], roles=by_hand)
    with pytest.raises(ReportMismatchError, match="the roles record no weight fingerprint of layer 0"):
        synthetic.roles(roles=by_hand, n_permutations=9)
    assoc = synthetic.roles(roles=fake_roles(synthetic, **dict.fromkeys(ROLES, 0.5)), n_permutations=9)
    with pytest.raises(OptionError, match="another report"):
        synthetic.with_threshold(0.5).circuit(["L0H0"], roles=assoc)
    c = synthetic.circuit(["L0H0"], roles=assoc)
    assert c.heads.loc["L0H0", "copying"] == 0.5


# 2. immutable results, and save -> load after edits of what they hand out -------------------------------------


def test_frames_handed_out_are_copies_and_saves_round_trip(synthetic, tmp_path):
    made = fake_roles(synthetic, **{**dict.fromkeys(ROLES, 0.25), "copying": np.linspace(-1, 1, 12)})
    summary = {**made.summary, "n_heads": 12, **{f"median_{r}": 0.25 for r in ROLES}, "median_copying": 0.0}
    given = made.table
    hr = HeadRoles(table=given, summary=summary, info=made.info)  # a record load_roles takes
    given.loc["L0H1", "induction"] = 7.0  # the frame it was made from, edited afterwards: not the result's
    summary["n_heads"] = 5
    assert hr.table.loc["L0H1", "induction"] == 0.25 and hr.summary["n_heads"] == 12
    want = hr.table
    t = hr.table
    t.loc["L0H0", "copying"] = 99.0
    t["extra"] = 1
    assert hr.table.equals(want) and hr.heads.equals(want)
    with pytest.raises(TypeError):
        hr.summary["n_heads"] = 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        hr.table = t
    back = tli.load_roles(tli.save_roles(hr, tmp_path / "hr"))
    pd.testing.assert_frame_equal(back.table, want, check_names=False, check_index_type=False)
    assert back.summary == hr.summary and back.info == hr.info

    a = synthetic.roles(roles=hr, n_permutations=9)
    table, assoc = a.table, a.association
    t2, a2 = a.table, a.association  # edits of what was handed out
    t2.loc["L0H0", "P"] = -1.0
    t2.iloc[0, 0] = 5
    a2.loc["copying", "spearman_p"] = 2.0
    a2["note"] = "edited"
    assert a.table.equals(table) and a.association.equals(assoc) and a.heads.equals(table)
    with pytest.raises(TypeError):
        a.summary["roles"]["n_heads"] = 3
    back_a = tli.load_roles(a.save(tmp_path / "a"))
    pd.testing.assert_frame_equal(back_a.association, assoc)
    pd.testing.assert_frame_equal(back_a.table, table, check_names=False, check_index_type=False)
    assert back_a.summary == a.summary

    for r in (hr, a):  # pickle and deepcopy keep the class and its numbers (results are never stored so)
        for twin in (pickle.loads(pickle.dumps(r)), copy.deepcopy(r)):
            assert type(twin) is type(r) and twin.table.equals(r.table) and twin.summary == r.summary
    c = synthetic.circuit(["L0H0", "L1H1"], n_sets=9)
    h, h2 = c.heads, c.heads
    h2.loc["L0H0", "closed"] = False
    assert c.heads.equals(h) and not c.heads.equals(h2) and c.n_overlap == 2
    with pytest.raises(ValueError):
        c.set_overlaps[0] = 7


def test_report_info_is_frozen_and_saves_round_trip(synthetic, tmp_path):
    rep = tli.idempotence_report(tiny_hooked(), progress=False)
    for edit in (
        lambda: rep.info.processing.__setitem__("fold_ln", True),
        lambda: rep.info.processing.update({"raw": False}),
        lambda: rep.info.extra.__setitem__("note", "x"),
        lambda: rep.info.extra.setdefault("note", "x"),
    ):
        with pytest.raises(TypeError, match="read-only"):
            edit()
    back = tli.load_report(rep.save(tmp_path / "rep"))
    assert back.info == rep.info and dict(back.info.processing) == dict(rep.info.processing)
    pd.testing.assert_frame_equal(back.heads, rep.heads)
    changed = dataclasses.replace(rep.info, processing={**rep.info.processing, "fold_ln": True})
    assert changed.processing["fold_ln"] is True and rep.info.processing.get("fold_ln") is not True


# 4. head_roles' errors are the library's ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("where", "value", "says"),
    [
        ("W_V", float("nan"), r"W_V of layer 1 contains NaN or inf at kv head 2"),
        ("W_O", float("inf"), r"W_O of layer 1 contains NaN or inf at head 2"),
        ("W_E", float("nan"), r"W_E \(the token embedding\) contains NaN or inf at token 3"),
        ("W_U", float("-inf"), r"W_U \(the unembedding\) contains NaN or inf at token 3"),
    ],
)
def test_head_roles_on_non_finite_weights(where, value, says):
    m = tiny_hooked()
    with torch.no_grad():
        if where == "W_V":
            m.blocks[1].attn.W_V[2, 0, 1] = value
        elif where == "W_O":
            m.blocks[1].attn.W_O[2, 1, 0] = value
        elif where == "W_E":
            m.embed.W_E[3, 5] = value
        else:
            m.unembed.W_U[5, 3] = value
    with pytest.raises(WeightError, match=says):
        tli.head_roles(m, **FAST)


def test_head_roles_on_another_output_vocabulary():
    m = tiny_hooked(d_vocab=40, d_vocab_out=30)
    with pytest.raises(UnsupportedModelError, match=r"d_vocab = 40\) and W_U \(16, 30\) \(d_vocab_out = 30\)"):
        tli.head_roles(m, **FAST)


def test_every_role_column_is_saved(synthetic, tmp_path):
    """The roles' summary records the fingerprint of every layer, and they survive a save (what the join reads)."""
    m = tiny_hooked()
    hr = tli.head_roles(m, **FAST)
    rep = tli.idempotence_report(m, progress=False)
    fps = {int(a): b for a, b in zip(rep.layers["layer"], rep.layers["fingerprint"])}
    assert hr.layer_fingerprints == fps and set(ROLES) <= set(hr.table.columns)
    back = tli.load_roles(tli.save_roles(hr, tmp_path / "r"))
    assert back.layer_fingerprints == fps
    assert len(rep.roles(roles=back, n_permutations=9).table) == 8
