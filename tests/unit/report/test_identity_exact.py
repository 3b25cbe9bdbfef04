"""``report/identity.py`` decision by decision (the mutation target ``sweep_identity`` runs
these): every compared option, the processing key's ``raw`` rule, each
reason's words in full, the order in which expectations are checked, and which layer's fingerprint is named
first.

The reports and sources here are stand-ins holding exactly what the check reads (a summary, options, sizes, a
``layers`` table; a source's info, layers and per-layer fingerprints), so that each case differs from a
matching one in one field; the real files route is tests/report/test_identity.py.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any

import pandas as pd
import pytest

import tl_idempotence as tli
from tl_idempotence.core.heads import Sizes
from tl_idempotence.errors import ReportMismatchError
from tl_idempotence.report.identity import (
    Origin,
    check_report_matches,
    compared_options,
    describe_report,
    option_differences,
    origin_of,
    processing_key,
    report_mismatch,
)

SIZES = Sizes(3, 4, 2, 16, 8)
FP = {0: "f0" * 32, 1: "f1" * 32, 2: "f2" * 32}
RAW = {"raw": True, "fold_ln": False, "center_writing_weights": False, "fold_value_biases": False}


def fake_report(summary: dict[str, Any] | None = None, options: Any = None, sizes: Sizes = SIZES, layers=(2, 0, 1)):
    """A report as the check reads it; its ``layers`` table lists layers in the order given (not sorted)."""
    s = {"model_name": "m", "processing": {"path": "ckA", **RAW}, "weights_fingerprint": "ab" * 32}
    s.update(summary or {})
    table = pd.DataFrame({"layer": list(layers), "fingerprint": [FP[i] for i in layers]})
    return SimpleNamespace(summary=s, options=options or tli.ReportOptions(), info=sizes, layers=table)


class FakeSource:
    """A head source: sizes, processing, layers and each layer's fingerprint; records which layers were read."""

    def __init__(self, fps=None, sizes=SIZES, processing=None, layers=(0, 1, 2)):
        self.fps = dict(FP if fps is None else fps)
        proc = dict(RAW if processing is None else processing)
        self.info = SimpleNamespace(**dataclasses.asdict(sizes), sizes=sizes, processing=proc)
        self._layers = list(layers)
        self.read: list[int] = []

    def layers(self):
        return list(self._layers)

    def layer_heads(self, layer):
        self.read.append(layer)
        return SimpleNamespace(fingerprint=lambda: self.fps[layer])


def test_origin_fields():
    assert origin_of({"processing": {"zoo_model": "", "path": "ck"}}) == Origin("checkpoint", "ck")
    assert origin_of({"processing": {"zoo_model": 3, "path": "ck"}}) == Origin("checkpoint", "ck")
    assert origin_of({"processing": {"zoo_model": "z", "path": ""}}) == Origin("zoo model", "z")
    assert origin_of({"processing": {"path": ""}}) is None
    assert origin_of({"processing": {"path": 7}}) is None
    assert origin_of({"processing": None}) is None and origin_of({}) is None
    assert str(Origin("zoo model", "smollm2-135m")) == "zoo model 'smollm2-135m'"


@pytest.mark.parametrize(
    ("proc", "want"),
    [
        ({}, (True, False, False, False)),  # nothing recorded: raw
        ({"raw": False}, (False, False, False, False)),  # said not raw, no flag named
        ({"fold_ln": True}, (False, True, False, False)),  # raw not recorded: a flag means processed
        ({"center_writing_weights": 1}, (False, False, True, False)),
        ({"fold_value_biases": True, "center_unembed": True}, (False, False, False, True)),  # center_unembed: not T
        ({"raw": True, "fold_ln": True}, (True, True, False, False)),  # what is recorded is kept
        ({"center_unembed": True}, (True, False, False, False)),
    ],
)
def test_processing_key(proc, want):
    assert processing_key({"processing": proc}) == want
    assert processing_key({"processing": None}) == (True, False, False, False)


def test_every_compared_option_is_compared():
    assert compared_options() == ("threshold", "nulls", "seed", "search", "algebra", "compute_dtype", "layers")
    base = tli.ReportOptions()
    assert option_differences(base, tli.ReportOptions()) == {}
    for change, want in [
        ({"threshold": 0.5}, {"threshold": (0.9, 0.5)}),
        ({"nulls": 8}, {"nulls": (0, 8)}),
        ({"seed": 3}, {"seed": (0, 3)}),
        ({"search": True}, {"search": (False, True)}),
        ({"algebra": True}, {"algebra": (False, True)}),
        ({"compute_dtype": "float32"}, {"compute_dtype": ("float64", "float32")}),
        ({"layers": [2, 0]}, {"layers": (None, [0, 2])}),  # sorted
        ({"nulls": 4, "seed": 1}, {"nulls": (0, 4), "seed": (0, 1)}),
    ]:
        assert option_differences(base, tli.ReportOptions(**change)) == want, change
    # the same layers in another order are the same layers; the device is not an option compared here
    assert option_differences(tli.ReportOptions(layers=[1, 0]), tli.ReportOptions(layers=[0, 1])) == {}
    assert list(option_differences(tli.ReportOptions(seed=1, threshold=0.5), base)) == ["threshold", "seed"]


def test_describe_report():
    assert describe_report(fake_report()) == f"'m' (checkpoint 'ckA', weights sha256 {'ab' * 6})"
    assert describe_report(fake_report({"processing": {}, "weights_fingerprint": None})) == "'m'"
    assert describe_report(fake_report({"processing": {}, "model_name": None})) == f"'None' (weights sha256 {'ab' * 6})"
    r = fake_report({"processing": {"zoo_model": "z"}, "weights_fingerprint": 5})
    del r.summary["model_name"]
    assert describe_report(r) == "'?' (zoo model 'z')"


def test_each_reason_in_full():
    rep = fake_report()
    assert report_mismatch(rep) is None
    assert report_mismatch(rep, origin=Origin("checkpoint", "ckA"), fingerprint="ab" * 32, source=FakeSource()) is None
    bare = fake_report({"processing": {}, "weights_fingerprint": None})
    assert report_mismatch(bare, origin=Origin("checkpoint", "ckA")) == (
        "the report was measured from a model object (no checkpoint recorded), not from checkpoint 'ckA'"
    )
    assert report_mismatch(bare, fingerprint="cd" * 32) == (
        "the report's weights fingerprint is none recorded, not cdcdcdcdcdcd"
    )
    want = "the report's weights fingerprint is abababababab, not cdcdcdcdcdcd"
    assert report_mismatch(rep, fingerprint="cd" * 32) == want
    two = tli.ReportOptions(nulls=4, seed=1)
    assert report_mismatch(rep, options=two) == "options differ: nulls 0 -> 4, seed 0 -> 1"
    assert report_mismatch(rep, options=tli.ReportOptions(compute_dtype="float32")) == (
        "options differ: compute_dtype 'float64' -> 'float32'"
    )
    other_device = SimpleNamespace(key=tli.ReportOptions().key, layers=None, device=SimpleNamespace(type="cuda"))
    assert report_mismatch(rep, options=other_device) == "options differ: device 'cpu' -> 'cuda'"
    small = Sizes(3, 4, 4, 16, 4)
    want = "model sizes differ: n_kv_heads 2 vs 4, d_head 8 vs 4"
    assert report_mismatch(rep, source=FakeSource(sizes=small)) == want
    processed = {**RAW, "raw": False, "fold_ln": True}
    assert report_mismatch(rep, source=FakeSource(processing=processed)) == "weight processing differs"
    src = FakeSource(processing=processed, fps={0: "x", 1: "y", 2: "z"})
    assert report_mismatch(rep, source=src, processing_may_differ=True) is None and src.read == []


def test_layers_and_fingerprints():
    rep = fake_report()
    # measured layers against the options' layers (sorted on both sides)
    assert report_mismatch(rep, options=tli.ReportOptions(), source=FakeSource()) is None
    rep01 = fake_report(options=tli.ReportOptions(layers=[0, 1]), layers=(1, 0))
    assert report_mismatch(rep01, options=tli.ReportOptions(layers=[1, 0]), source=FakeSource()) is None
    # a report whose table lacks a layer its options asked for
    lacking = fake_report(layers=(1, 0))
    assert report_mismatch(lacking, options=tli.ReportOptions(), source=FakeSource()) == (
        "measured layers differ: [0, 1] -> [0, 1, 2]"
    )
    assert report_mismatch(rep, options=tli.ReportOptions(), source=FakeSource(layers=(0, 1, 2, 3))) == (
        "measured layers differ: [0, 1, 2] -> [0, 1, 2, 3]"
    )
    # without options the report's own measured layers are checked, and only those
    src = FakeSource(fps={**FP, 2: "changed"})
    assert report_mismatch(rep01, source=src) is None and src.read == [0, 1]
    # the first differing layer in layer order is named, and nothing after it is read
    src = FakeSource(fps={0: "x", 1: FP[1], 2: "y"})
    assert report_mismatch(rep, source=src) == "layer 0's attention weights differ (weight fingerprint)"
    assert src.read == [0]
    src = FakeSource(fps={**FP, 1: "x"})
    assert report_mismatch(rep, source=src) == "layer 1's attention weights differ (weight fingerprint)"
    assert src.read == [0, 1]
    # the expectations are checked in order: origin, fingerprint, options, source
    bad_all = {"origin": Origin("zoo model", "z"), "fingerprint": "cd" * 32, "options": tli.ReportOptions(seed=2)}
    src = FakeSource(sizes=Sizes(1, 4, 2, 16, 8))
    assert report_mismatch(rep, **bad_all, source=src).startswith("the report was measured from checkpoint 'ckA'")
    bad_all.pop("origin")
    assert report_mismatch(rep, **bad_all, source=src).startswith("the report's weights fingerprint is")
    bad_all.pop("fingerprint")
    assert report_mismatch(rep, **bad_all, source=src) == "options differ: seed 0 -> 2"
    assert report_mismatch(rep, source=src) == "model sizes differ: n_layers 3 vs 1"


def test_check_report_matches_message():
    rep = fake_report()
    assert check_report_matches(rep, what="W", fix="F", source=FakeSource()) is None
    with pytest.raises(ReportMismatchError) as e:
        check_report_matches(
            rep,
            what="The model given",
            fix="Pass the model.",
            origin=Origin("zoo model", "z"),
            fingerprint="cd" * 32,
            options=tli.ReportOptions(seed=2),
            source=FakeSource(processing={**RAW, "raw": False}),
            processing_may_differ=True,
        )
    assert str(e.value) == (
        f"The model given is not the model this report measured ('m' (checkpoint 'ckA', weights sha256 {'ab' * 6})): "
        "the report was measured from checkpoint 'ckA', not from zoo model 'z'. Pass the model."
    )
    # each expectation reaches the check
    for kw, start in [
        ({"fingerprint": "cd" * 32}, "the report's weights fingerprint"),
        ({"options": tli.ReportOptions(seed=2)}, "options differ"),
        ({"source": FakeSource(processing={**RAW, "raw": False})}, "weight processing differs"),
    ]:
        with pytest.raises(ReportMismatchError, match=start):
            check_report_matches(rep, what="W", fix="F", **kw)
    src = FakeSource(processing={**RAW, "raw": False})
    check_report_matches(rep, what="W", fix="F", source=src, processing_may_differ=True)
