"""Every number is unchanged by the redesign: the per-head tables of both zoo models and of their
checkpoint files are bit for bit what tl_idempotence 0.1 gave (stored in tests/data/v0_1/, written by
tests/data/v0_1/make_reference.py at commit 046f01e; per CPU kernel signature, tests/reference_bits.py).
Parquet keeps every float64 bit.
The search columns of smollm2_bridge_l5_l10_search were rewritten once, on purpose (per-head
generators; tests/data/v0_1/README.md says why)."""

from __future__ import annotations

import pytest

import tl_idempotence as tli
from reference_bits import assert_same_bits


def test_minilm_checkpoint_files_nulls(zoo_ready):
    rep = tli.idempotence_report(str(tli.models.checkpoint_dir("minilm-l6", progress=False)), nulls=16, progress=False)
    assert_same_bits(rep.heads, "minilm_files_nulls16.heads")
    assert_same_bits(rep.layers, "minilm_files_nulls16.layers")


@pytest.mark.bridge
def test_minilm_bridge_nulls(minilm):
    rep = tli.idempotence_report(minilm, nulls=16, progress=False)
    assert_same_bits(rep.heads, "minilm_bridge_nulls16.heads")
    assert_same_bits(rep.layers, "minilm_bridge_nulls16.layers")
