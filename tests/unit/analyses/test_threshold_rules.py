"""The threshold rules (analyses/threshold.py): every number that depends on the P threshold — ``closed``,
the per-layer counts, the scramble's closed fractions — comes from these kernels, at run time and in
``with_threshold``. Expected values are written by hand from the definitions (SPEC 2: closed iff P >= t, an
undefined P is never closed; a fraction of no defined draw is undefined, not 0)."""

from __future__ import annotations

import copy

import numpy as np
import pandas as pd
import pytest

from tl_idempotence.analyses.threshold import (
    CountPerLayer,
    Flag,
    FractionPerHead,
    FunctionRule,
    closed_flags,
    derive_at_threshold,
)

NAN = float("nan")


@pytest.mark.parametrize(
    ("t", "want"),
    [
        (0.5, [True, False, False, True, False, True]),  # P == t is closed; NaN never
        (0.0, [True, True, False, True, True, True]),  # t = 0: every defined P, still not NaN
        (1.0, [False, False, False, True, False, False]),
    ],
)
def test_closed_flags_by_the_definition(t, want):
    P = [0.5, 0.4999, NAN, 1.0, 0.0, 0.75]
    got = closed_flags(P, t)
    assert got.dtype == bool and got.tolist() == want
    assert closed_flags(np.array(P, dtype=np.float32).reshape(2, 3), t).tolist() == [want[:3], want[3:]]
    assert closed_flags([NAN, NAN], 0.0).tolist() == [False, False]  # not "nan_to_num(0) >= 0"


def _frames():
    heads = pd.DataFrame(
        {"layer": [0, 0, 0, 2, 2], "head": [0, 1, 2, 0, 1], "P": [0.9, NAN, 0.5, 0.2, 0.6], "closed": [False] * 5}
    )
    layers = pd.DataFrame({"layer": [0, 1, 2], "n_closed": [7, 7, 7], "best": [0.4, NAN, 0.95]})
    draws = pd.DataFrame(
        {
            "layer": [0, 0, 0, 0, 0, 0, 2],
            "head": [0, 0, 0, 1, 1, 2, 0],
            "P": [0.9, 0.1, NAN, NAN, NAN, 0.5, 0.49],
        }
    )
    pairs = pd.DataFrame({"layer": [1, 1, 2, 2, 2], "P": [0.7, 0.2, 0.8, NAN, 0.61]})
    return heads, layers, {"draws": draws, "pairs": pairs}


def _deep(frames):
    h, ly, t = frames
    return h.copy(deep=True), ly.copy(deep=True), {k: v.copy(deep=True) for k, v in t.items()}


def _assert_unchanged(before, after):
    pd.testing.assert_frame_equal(before[0], after[0], check_exact=True)
    pd.testing.assert_frame_equal(before[1], after[1], check_exact=True)
    assert list(before[2]) == list(after[2])
    for k in before[2]:
        pd.testing.assert_frame_equal(before[2][k], after[2][k], check_exact=True)


def test_a_flag_of_heads_and_of_layers():
    frames = _frames()
    before = _deep(frames)
    h, ly, t = Flag("closed", "P").apply(*frames, 0.6)
    assert h["closed"].tolist() == [True, False, False, False, True]
    assert ly is frames[1] and t is frames[2]
    h2, ly2, _ = Flag("feasible", "best", frame="layers").apply(*frames, 0.4)
    assert ly2["feasible"].tolist() == [True, False, True] and h2 is frames[0]
    _, _, t3 = Flag("closed", "P", frame="draws").apply(*frames, 0.5)
    assert t3["draws"]["closed"].tolist() == [True, False, False, False, False, True, False]
    assert set(t3) == {"draws", "pairs"} and t3["pairs"] is frames[2]["pairs"]
    assert Flag("closed", "P", frame="absent").apply(*frames, 0.5) == frames  # no such table: nothing to do
    _assert_unchanged(before, frames)


def test_a_count_per_layer_over_heads_and_over_a_long_table():
    frames = _frames()
    before = _deep(frames)
    _, ly, _ = CountPerLayer("n_closed", "P").apply(*frames, 0.5)
    assert ly["n_closed"].tolist() == [2, 0, 1]  # layer 0: 0.9 and 0.5 (== t), not NaN; layer 1 has no head: 0
    assert ly["n_closed"].dtype.kind == "i"
    _, ly, _ = CountPerLayer("n_pairs_closed", "P", over="pairs").apply(*frames, 0.61)
    assert ly["n_pairs_closed"].tolist() == [0, 1, 2]  # layer 0 has no pair; 0.61 == t counts; NaN does not
    _, ly, _ = CountPerLayer("n_closed", "P").apply(*frames, 0.0)
    assert ly["n_closed"].tolist() == [2, 0, 2]  # t = 0: every defined P, never the NaN one
    assert CountPerLayer("n", "P", over="absent").apply(*frames, 0.5) == frames
    assert CountPerLayer("x", "P").count(np.array([0.5, 0.4999, NAN, 1.0]), 0.5) == 2
    _assert_unchanged(before, frames)


def test_a_fraction_per_head_of_its_defined_draws():
    frames = _frames()
    before = _deep(frames)
    h, ly, _ = FractionPerHead("frac", "draws").apply(*frames, 0.5)
    # (0,0): 0.9 of {0.9, 0.1} defined = 1/2; (0,1): no defined draw = NaN; (0,2): {0.5} = 1; (2,0): {0.49} = 0;
    # (2,1): no row = NaN
    np.testing.assert_array_equal(h["frac"].to_numpy(), [0.5, NAN, 1.0, 0.0, NAN])
    assert h["frac"].dtype == np.float64 and ly is frames[1]
    h, _, _ = FractionPerHead("frac", "draws").apply(*frames, 0.05)
    np.testing.assert_array_equal(h["frac"].to_numpy(), [1.0, NAN, 1.0, 1.0, NAN])
    assert FractionPerHead("frac", "absent").apply(*frames, 0.5) == frames
    empty = (frames[0], frames[1], {"draws": frames[2]["draws"].iloc[:0]})
    assert FractionPerHead("frac", "draws").apply(*empty, 0.5) == empty  # no draw at all: the column stays
    _assert_unchanged(before, frames)


def test_a_function_rule_and_the_algebras_factory():
    frames = _frames()
    seen = []

    def rule(h, ly, t, thr):
        seen.append(thr)
        return h.assign(x=thr), ly, t

    h, _, _ = FunctionRule(rule).apply(*frames, 0.25)
    assert seen == [0.25] and h["x"].tolist() == [0.25] * 5
    from tl_idempotence.analyses import algebra_spec

    assert algebra_spec.AT_THRESHOLD.function is algebra_spec.at_threshold  # a function, imported on first call
    out = algebra_spec.AT_THRESHOLD.apply(*frames, 0.5)  # a report without algebra tables: returned as it is
    pd.testing.assert_frame_equal(out[0], frames[0])


def test_derive_applies_every_rule_in_order_and_never_changes_its_inputs():
    frames = _frames()
    before = _deep(frames)
    rules = [
        Flag("closed", "P"),
        CountPerLayer("n_closed", "P"),
        CountPerLayer("n_pairs_closed", "P", over="pairs"),
        FractionPerHead("frac", "draws"),
        FunctionRule(lambda h, ly, t, thr: (h, ly.assign(n_both=ly["n_closed"] + ly["n_pairs_closed"]), t)),
    ]
    h, ly, t = derive_at_threshold(*frames, rules, 0.6)
    assert h["closed"].tolist() == [True, False, False, False, True]
    assert ly["n_closed"].tolist() == [1, 0, 1] and ly["n_pairs_closed"].tolist() == [0, 1, 2]
    assert ly["n_both"].tolist() == [1, 1, 3]  # a later rule sees the earlier rules' output
    np.testing.assert_array_equal(h["frac"].to_numpy(), [0.5, NAN, 0.0, 0.0, NAN])
    assert t is not frames[2] and t == frames[2]  # a new dict, the same unchanged tables
    _assert_unchanged(before, frames)
    same = derive_at_threshold(*frames, [], 0.6)
    assert same[0] is frames[0] and same[1] is frames[1] and same[2] == frames[2]
    assert copy.deepcopy(rules[:4]) == rules[:4]  # rules are plain frozen values


def test_a_fraction_of_draws_stored_as_objects():
    """A long table read back with its P column as objects (None for an undefined draw) gives the same fractions
    as floats (the kernel reads P as float: an object array has no isfinite)."""
    frames = _frames()
    draws = frames[2]["draws"].assign(P=pd.Series([0.9, 0.1, None, None, None, 0.5, 0.49], dtype=object))
    h, _, _ = FractionPerHead("frac", "draws").apply(frames[0], frames[1], {"draws": draws}, 0.5)
    np.testing.assert_array_equal(h["frac"].to_numpy(), [0.5, NAN, 1.0, 0.0, NAN])


def test_undefined_p_stored_as_none_is_not_closed():
    """P read back as Python objects (None where undefined): the flags and the counts read it as float, so None is
    an undefined P, never closed (an object array has no NaN to replace, and ``None >= t`` raises)."""
    assert closed_flags([0.9, None, 0.5, 0.1], 0.5).tolist() == [True, False, True, False]
    assert closed_flags(pd.Series([None, 0.7], dtype=object), 0.0).tolist() == [False, True]
    frames = _frames()
    heads = frames[0].assign(P=pd.Series([0.9, None, 0.5, 0.2, 0.6], dtype=object))
    _, ly, _ = CountPerLayer("n_closed", "P").apply(heads, frames[1], frames[2], 0.5)
    assert ly["n_closed"].tolist() == [2, 0, 1]
    h, _, _ = Flag("closed", "P").apply(heads, frames[1], frames[2], 0.5)
    assert h["closed"].tolist() == [True, False, True, False, True]
