"""SmolLM2-135M's reports (raw weights; two layers with every analysis): to_tensor's layout and NaN for layers not
measured, hook points of the closed heads and their refusals, with_threshold round trips, pickling (moved out of
the unit tier for the reports' time); the unit tests of the TL outputs (tiny models) are
tests/unit/report/test_tl_outputs.py."""

from __future__ import annotations

import copy
import math
import pickle

import numpy as np
import pytest
import torch

import tl_idempotence as tli
from helpers import assert_same_value, frames_identical
from tl_idempotence.errors import OptionError, OptionTypeError

pytestmark = pytest.mark.bridge  # checkpoint files and TransformerBridge only


@pytest.fixture(scope="module")
def smol(smol_path):
    """The whole model, closure only."""
    return tli.idempotence_report(smol_path, progress=False)


def state(rep) -> tuple:
    return (
        rep.heads.copy(),
        rep.layers.copy(),
        {k: v.copy() for k, v in rep.tables.items()},
        copy.deepcopy(rep.summary),
        rep.options,
    )


def assert_same_state(rep, before) -> None:
    heads, layers, tables, summary, options = before
    frames_identical(rep.heads, heads)
    frames_identical(rep.layers, layers)
    assert sorted(rep.tables) == sorted(tables)
    for k in tables:
        frames_identical(rep.tables[k], tables[k])
    assert_same_value(rep.summary, summary)
    assert rep.options == options


def test_to_tensor_is_nan_for_layers_not_measured(smol_full):
    P = smol_full.to_tensor("P")
    assert P.shape == (30, 9)
    measured = [5, 10]
    assert torch.isfinite(P[measured]).all()
    others = [layer for layer in range(30) if layer not in measured]
    assert torch.isnan(P[others]).all()
    assert float(P[10, 8]) == pytest.approx(0.953258, abs=5e-7)
    assert torch.isfinite(smol_full.to_tensor("P_scrambled_median")[measured]).all()


def test_hook_points_refuse_bad_selectors(smol, smol_full):
    with pytest.raises(OptionError, match="hook must be one of"):
        smol.hook_points(hook="hook_z")
    with pytest.raises(OptionError, match="heads must be 'closed', 'all'"):
        smol.hook_points(heads="clsoed")
    with pytest.raises(OptionError):
        smol.hook_points(heads=[(10, 9)])  # head 9 does not exist (9 heads: 0..8)
    with pytest.raises(OptionError):
        smol_full.hook_points(heads=[(11, 4)])  # layer 11 was not measured
    with pytest.raises(OptionTypeError):
        smol.hook_points(heads=[10, 8])


def test_the_same_threshold_changes_nothing(smol_full):
    before = state(smol_full)
    assert_same_state(smol_full.with_threshold(0.9), before)
    assert_same_state(smol_full, before)


def test_threshold_round_trip_restores_the_tables(smol_full):
    before = state(smol_full)
    n0 = smol_full.summary["n_closed"]
    assert n0 == 3 and list(smol_full.closed_heads.index) == ["L10H8", "L5H2", "L10H6"]
    low_rep = smol_full.with_threshold(0.5)
    assert_same_state(smol_full, before)  # a new report: this one is not changed
    low = low_rep.closed_heads
    assert low_rep.threshold == 0.5 and low_rep.options.threshold == 0.5 and low_rep.summary.threshold == 0.5
    assert len(low) == low_rep.summary["n_closed"] == int((low_rep.heads["P"] >= 0.5).sum()) > n0
    assert (low["P"] >= 0.5).all() and low["P"].is_monotonic_decreasing
    assert low_rep.hook_points()[0] == ("blocks.10.attn.hook_z", 8)
    assert len(low_rep.hook_points()) == len(low)
    high = low_rep.with_threshold(0.95)  # only L10H8 (0.953258) is above
    assert list(high.closed_heads.index) == ["L10H8"] and high.summary["n_closed"] == 1
    assert_same_state(high.with_threshold(0.9), before)


def test_assigning_the_threshold_still_works_but_is_deprecated(smol_full):
    before = state(smol_full)
    rep = smol_full.with_threshold(0.9)
    with pytest.warns(DeprecationWarning, match=r"rep\.with_threshold\(t\)"):
        rep.threshold = 0.5
    assert rep.threshold == 0.5 and rep.summary["n_closed"] == int((rep.heads["P"] >= 0.5).sum())
    assert_same_state(smol_full, before)


@pytest.mark.parametrize(
    ("value", "error"),
    [
        (1.5, OptionError),
        (-0.1, OptionError),
        (math.nan, OptionError),
        ("0.9", OptionTypeError),
        (True, OptionTypeError),
        (None, OptionTypeError),
    ],
)
def test_a_bad_threshold_is_refused_and_changes_nothing(smol_full, value, error):
    before = state(smol_full)
    with pytest.raises(error, match="threshold"):
        smol_full.with_threshold(value)
    assert_same_state(smol_full, before)


def test_pickle_round_trip_is_identical_and_holds_no_model(smol_full, tiny_llama):
    back = pickle.loads(pickle.dumps(smol_full))
    assert_same_state(back, state(smol_full))
    assert back.info == smol_full.info
    assert list(back.closed_heads.index) == list(smol_full.closed_heads.index)
    rep = tli.idempotence_report(tiny_llama, progress=False)
    assert rep.model is tiny_llama  # a weak reference while the model lives ...
    blob = pickle.dumps(rep)
    assert len(blob) < 200_000  # ... that is never pickled (the model's weights are not in it)
    back = pickle.loads(blob)
    assert back.model is None
    np.testing.assert_array_equal(back.to_tensor("P").numpy(), rep.to_tensor("P").numpy())


#: SmolLM2-135M-Instruct, raw weights: the 13 heads with P >= 0.9, by P (tests/data/v0_1 holds the full table).
SMOL_CLOSED = "L10H8 L27H1 L28H5 L12H5 L29H1 L5H2 L11H6 L29H0 L11H4 L6H8 L29H2 L26H4 L10H6".split()


def test_to_tensor_is_layer_by_head_in_tl_layout(smol):
    P = smol.to_tensor("P")
    assert isinstance(P, torch.Tensor) and P.shape == (30, 9) and P.dtype == torch.float64
    assert float(P[10, 8]) == float(smol.heads.loc["L10H8", "P"]) == pytest.approx(0.953258, abs=5e-7)
    for label, row in smol.heads.iterrows():  # every cell is its head's row, bit for bit
        assert float(P[row["layer"], row["head"]]) == row["P"], label
    closed = torch.nonzero(P >= 0.9).tolist()
    assert sorted(f"L{a}H{b}" for a, b in closed) == sorted(SMOL_CLOSED)
    kv = smol.to_tensor("kv_head")
    assert kv[0].tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2]  # GQA: 9 query heads on 3 kv heads
    assert smol.to_tensor("closed").sum() == 13


def test_to_tensor_refuses_what_is_not_a_numeric_column(smol):
    with pytest.raises(OptionError, match=r"'p' is not a column of report\.heads"):
        smol.to_tensor("p")
    with pytest.raises(OptionError, match="'reason' is not numeric"):
        smol.to_tensor("reason")


def test_hook_points_of_the_closed_heads(smol):
    pts = smol.hook_points()
    assert pts[0] == ("blocks.10.attn.hook_z", 8)  # the highest P first
    assert [f"L{name.split('.')[1]}H{h}" for name, h in pts] == SMOL_CLOSED
    assert len(smol.hook_points(heads="all")) == 270
    assert smol.hook_points(heads=[(10, 8), (5, 2)], hook="pattern") == [
        ("blocks.5.attn.hook_pattern", 2),
        ("blocks.10.attn.hook_pattern", 8),
    ]
    assert smol.hook_points(heads=smol.closed_heads.head(2), hook="result") == [
        ("blocks.10.attn.hook_result", 8),
        ("blocks.27.attn.hook_result", 1),
    ]
