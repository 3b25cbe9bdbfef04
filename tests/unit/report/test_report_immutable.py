"""A report cannot be edited through what it hands out: ``rep.heads``,
``rep.layers``, ``rep.closed_heads`` and every ``rep.tables[name]`` are copies, ``rep.tables`` is read-only, so
editing them leaves the report, its summary and what it derives (``with_threshold``, ``to_tensor``, the save)
as they were."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pandas as pd
import pytest

import tl_idempotence as tli
from helpers import SyntheticSource, gaussian_layer


@pytest.fixture(scope="module")
def rep():
    src = SyntheticSource([gaussian_layer(layer, 4, 2, 16, 4, seed=layer) for layer in range(2)], name="gqa")
    return tli.idempotence_report(src, nulls=4, seed=1, algebra=True, threshold=0.3, progress=False)


def _snapshot(rep) -> tuple:
    """Everything the report says, by value (frames deep-copied, the summary as JSON)."""
    return (
        rep.heads.copy(deep=True),
        rep.layers.copy(deep=True),
        {k: v.copy(deep=True) for k, v in rep.tables.items()},
        rep.closed_heads.copy(deep=True),
        json.dumps(rep.summary.to_dict(), sort_keys=True, default=str),
        json.dumps(rep.with_threshold(0.5).summary.to_dict(), sort_keys=True, default=str),
    )


def _same(a: tuple, b: tuple) -> None:
    pd.testing.assert_frame_equal(a[0], b[0], check_exact=True)
    pd.testing.assert_frame_equal(a[1], b[1], check_exact=True)
    assert list(a[2]) == list(b[2])
    for k in a[2]:
        pd.testing.assert_frame_equal(a[2][k], b[2][k], check_exact=True)
    pd.testing.assert_frame_equal(a[3], b[3], check_exact=True)
    assert a[4:] == b[4:]


def test_editing_what_the_report_hands_out_changes_nothing(rep):
    assert len(rep.closed_heads) and {"scramble_draws", "mismatch_pairs", "algebra_pairs"} <= set(rep.tables)
    before = _snapshot(rep)
    P0 = rep.to_tensor("P").clone()
    heads = rep.heads
    heads.loc[heads.index[0], "P"] = 9.0
    heads["closed"] = False
    del heads["alpha"]
    layers = rep.layers
    layers.loc[0, "n_closed"] = 99
    layers["fingerprint"] = "x"
    closed = rep.closed_heads
    closed.loc[closed.index[0], "P"] = -1.0
    del closed["layer"]
    for name in list(rep.tables):
        t = rep.tables[name]
        if len(t):
            t.iloc[0, t.columns.get_loc("layer")] = 123
        del t[t.columns[-1]]
    for col in ("P", "layer"):  # numpy views of a copy are a copy's too
        a = rep.heads[col].to_numpy()
        if a.flags.writeable:
            a[:] = 0
    _same(before, _snapshot(rep))
    assert np.array_equal(rep.to_tensor("P").numpy(), P0.numpy(), equal_nan=True)


def test_the_tables_mapping_is_read_only(rep):
    with pytest.raises(TypeError):
        rep.tables["scramble_draws"] = pd.DataFrame()  # type: ignore[index]
    with pytest.raises(TypeError):
        del rep.tables["scramble_draws"]  # type: ignore[attr-defined]
    assert rep.tables.get("no such table") is None and "mismatch_pairs" in rep.tables
    assert rep.tables["scramble_draws"] is not rep.tables["scramble_draws"]  # a copy on each read


def test_a_report_at_another_threshold_and_a_pickled_one_are_copies_too(rep, tmp_path):
    before = _snapshot(rep)
    moved = rep.with_threshold(0.5)
    mh, md = moved.heads, moved.tables["scramble_draws"]
    mh.loc[mh.index[0], "P"] = 9.0
    md.loc[0, "P"] = 9.0
    assert moved.heads.loc[mh.index[0], "P"] != 9.0 and moved.tables["scramble_draws"].loc[0, "P"] != 9.0
    back = pickle.loads(pickle.dumps(rep))
    h = back.heads
    h.loc[h.index[0], "P"] = 9.0
    assert back.heads.equals(rep.heads) and back.summary == rep.summary
    _same(before, _snapshot(rep))
    assert tli.load_report(rep.save(tmp_path / "r")).heads.equals(rep.heads)


def test_a_report_pickled_with_public_frames_still_loads(rep):
    """A report pickled before its frames were private (its state had ``heads``/``layers``/``tables``)."""
    state = dict(rep.__dict__)
    for name in ("heads", "layers", "tables"):
        state[name] = state.pop(f"_{name}")
    old = object.__new__(type(rep))
    old.__setstate__(state)
    assert old.heads.equals(rep.heads) and old.layers.equals(rep.layers) and list(old.tables) == list(rep.tables)


def test_the_algebras_frames_are_copies_of_the_reports(rep):
    """``rep.algebra`` wrapped the report's own algebra tables, which ``with_threshold`` shares with the report it
    came from: editing ``rep2.algebra.pairs`` in place changed ``rep``'s tables, its save and later summaries."""
    sibling = rep.with_threshold(0.5)
    before, before_sibling = _snapshot(rep), _snapshot(sibling)
    for r in (rep, sibling):
        alg = r.algebra
        for frame in (alg.pairs, alg.heads, alg.groups, alg.closed_ranges):
            if len(frame):
                frame.iloc[0, frame.columns.get_loc(frame.select_dtypes("number").columns[0])] = -999
    _same(before, _snapshot(rep))
    _same(before_sibling, _snapshot(sibling))


def test_the_summarys_lists_and_dicts_cannot_be_edited_in_place(rep, tmp_path):
    """``rep.summary["closed_per_layer"][0] = 99`` changed the summary; ``rep.save`` then wrote a record
    ``load_report`` refuses, and a ``with_threshold`` sibling shared ``versions``. Now every list and dict the
    summary hands out (flat view, attributes, the analyses' records) refuses an edit with ``TypeError``; a copy
    (``to_dict()``, ``copy.deepcopy``) is the user's to edit."""
    import copy

    s = rep.summary
    before = json.dumps(s.to_dict(), sort_keys=True, default=str)
    edits = [
        lambda: s["closed_per_layer"].__setitem__(0, 99),
        lambda: s.closure.closed_per_layer.update({0: 99}),
        lambda: s.versions.__setitem__("torch", "0"),
        lambda: s.processing.clear(),
        lambda: s.options.pop("seed"),
        lambda: s["algebra"].setdefault("x", 1),
        lambda: s.scramble.layers_trained_loses.append(7),
        lambda: rep.with_threshold(0.5).summary.versions.update(torch="0"),
    ]
    for edit in edits:
        with pytest.raises(TypeError, match="read-only"):
            edit()
    assert json.dumps(s.to_dict(), sort_keys=True, default=str) == before
    mine = s.to_dict()
    mine["closed_per_layer"][0] = 99  # a plain copy
    mine2 = copy.deepcopy(s["processing"])
    mine2["x"] = 1
    assert type(mine2) is dict and json.dumps(s.to_dict(), sort_keys=True, default=str) == before
    assert pickle.loads(pickle.dumps(s)).to_dict() == s.to_dict()
    rep.save(tmp_path / "r")
    assert tli.load_report(tmp_path / "r").summary.to_dict() == s.to_dict()
