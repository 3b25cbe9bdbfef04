"""The one report-identity check (``report/identity.py``): a report against the origin, weights, options and
source it is taken for, each difference named with both sides.

Reports of tiny synthetic checkpoints on disk (``helpers``): two folders with other weights and sizes
(``ckA``, ``ckB``), and a copy of ``ckA`` under another name whose layer 1 values were changed in place (same
names, sizes and config: only the weight fingerprint tells it apart).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

import tl_idempotence as tli
from helpers import gpt2_like, llama_like
from tl_idempotence.errors import OptionError, ReportMismatchError
from tl_idempotence.report.identity import (
    Origin,
    check_report_matches,
    describe_report,
    origin_of,
    report_mismatch,
)
from tl_idempotence.sources.dispatch import head_source
from tl_idempotence.studies.compare import Item
from tl_idempotence.studies.sweep import item_origin

OPTS = {"nulls": 2, "seed": 1}


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("identity")
    a = llama_like(root / "ckA")[0]
    b = gpt2_like(root / "ckB")[0]
    changed = root / "other" / "ckA"  # the same folder name as ckA, one layer's values changed
    shutil.copytree(a, changed)
    name = "model.layers.1.self_attn.v_proj.weight"
    shard = next(f for f in Path(changed).glob("*.safetensors") if name in load_file(f))
    tensors = load_file(shard)
    tensors[name] = tensors[name] * 1.5 + 0.01
    save_file(tensors, str(shard), metadata={"format": "pt"})
    return {"A": Path(a), "B": Path(b), "A_changed": changed}


@pytest.fixture(scope="module")
def reports(ckpts):
    return {k: tli.idempotence_report(p, progress=False, **OPTS) for k, p in ckpts.items()}


def test_origin_is_what_the_report_records(ckpts, reports):
    assert origin_of(reports["A"].summary) == Origin("checkpoint", "ckA")
    assert origin_of(reports["A_changed"].summary) == Origin("checkpoint", "ckA")  # names alone cannot tell them
    assert origin_of({"processing": {"zoo_model": "smollm2-135m", "path": "<cache>/smollm2-135m/x"}}) == Origin(
        "zoo model", "smollm2-135m"
    )
    assert origin_of({"processing": {"raw": False}}) is None  # a model object records no file
    # what a sweep item's report will record, known without opening it
    assert item_origin(Item("a", "path", ckpts["A"])) == Origin("checkpoint", "ckA")
    shard = sorted(ckpts["A"].glob("*.safetensors"))[0]
    assert item_origin(Item("a", "path", shard)) == Origin("checkpoint", "ckA")  # a file names its folder
    assert origin_of(tli.idempotence_report(shard, progress=False, **OPTS).summary) == Origin("checkpoint", "ckA")
    assert item_origin(Item("z", "zoo", "smollm2-135m")) == Origin("zoo model", "smollm2-135m")
    assert item_origin(Item("c", "callable", lambda: None)) is None
    fp = reports["B"].summary["weights_fingerprint"]
    assert describe_report(reports["B"]) == f"'ckB' (checkpoint 'ckB', weights sha256 {fp[:12]})"


def test_each_difference_is_named_with_both_sides(ckpts, reports):
    a, b = reports["A"], reports["B"]
    fa, fb = a.summary["weights_fingerprint"], b.summary["weights_fingerprint"]
    assert fa != fb
    # the report's own identity matches: nothing to say
    assert report_mismatch(a, origin=Origin("checkpoint", "ckA"), fingerprint=fa, options=a.options) is None
    assert report_mismatch(a, source=head_source(ckpts["A"]), options=a.options) is None
    # another checkpoint's report
    assert report_mismatch(b, origin=Origin("checkpoint", "ckA")) == (
        "the report was measured from checkpoint 'ckB', not from checkpoint 'ckA'"
    )
    assert report_mismatch(a, origin=Origin("zoo model", "smollm2-135m")) == (
        "the report was measured from checkpoint 'ckA', not from zoo model 'smollm2-135m'"
    )
    assert report_mismatch(b, fingerprint=fa) == f"the report's weights fingerprint is {fb[:12]}, not {fa[:12]}"
    other = tli.ReportOptions(threshold=0.5, **OPTS)
    assert report_mismatch(a, options=other) == "options differ: threshold 0.9 -> 0.5"
    assert report_mismatch(b, source=head_source(ckpts["A"])).startswith("model sizes differ: n_layers 2 vs 3")
    # same name, sizes and processing, one layer's values changed: only the per-layer fingerprint tells
    changed = head_source(ckpts["A_changed"])
    assert report_mismatch(a, origin=origin_of({"processing": changed.info.processing})) is None
    assert report_mismatch(a, source=changed) == "layer 1's attention weights differ (weight fingerprint)"
    part = tli.ReportOptions(layers=[0], **OPTS)
    assert report_mismatch(a, source=head_source(ckpts["A"]), options=part).startswith("options differ: layers")


def test_check_report_matches_raises_the_librarys_error(ckpts, reports):
    a = reports["A"]
    check_report_matches(a, what="ckA", fix="-", source=head_source(ckpts["A"]))  # no error
    with pytest.raises(ReportMismatchError) as e:
        check_report_matches(
            a, what="The model given, 'x' (CheckpointSource),", fix="Pass the model.", source=head_source(ckpts["B"])
        )
    fa = a.summary["weights_fingerprint"][:12]
    msg = str(e.value)
    assert msg.startswith("The model given, 'x' (CheckpointSource), is not the model this report measured ('ckA' (")
    assert f"weights sha256 {fa}" in msg and ": model sizes differ: n_layers 3 vs 2" in msg
    assert msg.endswith("Pass the model.")
    assert isinstance(e.value, OptionError)  # a refused input: exit 2 on the CLI, except ValueError works
