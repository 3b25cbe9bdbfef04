"""SmolLM2-135M's per-head tables (its files with nulls, its search layers, the bridge with nulls and algebra) bit for
bit as tl_idempotence 0.1 gave them (tests/data/v0_1, tests/reference_bits.py); the unit tier keeps the GGUF file's
and MiniLM's (tests/unit/report/test_v01_values.py).
"""

from __future__ import annotations

import pytest

import tl_idempotence as tli
from reference_bits import assert_same_bits


@pytest.fixture(scope="module")
def smol_files(zoo_ready):
    return str(tli.models.checkpoint_dir("smollm2-135m", progress=False))


def test_smollm2_checkpoint_files_nulls(smol_files):
    rep = tli.idempotence_report(smol_files, nulls=16, progress=False)
    assert_same_bits(rep.heads, "smollm2_files_nulls16.heads")
    assert_same_bits(rep.layers, "smollm2_files_nulls16.layers")


def test_smollm2_search_layers(smol_files):
    rep = tli.idempotence_report(smol_files, layers=[5, 10], nulls=8, search=True, progress=False)
    assert_same_bits(rep.heads, "smollm2_bridge_l5_l10_search.heads")
    assert_same_bits(rep.layers, "smollm2_bridge_l5_l10_search.layers")


@pytest.mark.bridge
def test_smollm2_bridge_nulls_and_algebra(smollm2):
    rep = tli.idempotence_report(smollm2, nulls=16, algebra=True, progress=False)
    assert_same_bits(rep.heads, "smollm2_bridge_nulls16_algebra.heads")
    assert_same_bits(rep.layers, "smollm2_bridge_nulls16_algebra.layers")
    assert_same_bits(rep.algebra.pairs, "smollm2_bridge_nulls16_algebra.algebra_pairs")
    assert_same_bits(rep.algebra.heads, "smollm2_bridge_nulls16_algebra.algebra_heads")


def test_smollm2_gguf_file(zoo_ready):
    rep = tli.idempotence_report(str(tli.models.gguf_path("smollm2-135m", progress=False)), progress=False)
    assert_same_bits(rep.heads, "smollm2_gguf.heads")
