"""The query head -> kv head map (GQA/MQA), against its definition written here (a reference
independent of the code under test), and every refusal of its validator (one table)."""

from __future__ import annotations

import pytest
import torch

from tl_idempotence.core.heads import kv_layout
from tl_idempotence.errors import WeightError


@pytest.mark.parametrize("nq, nkv", [(1, 1), (6, 6), (6, 1), (6, 2), (6, 3), (32, 8), (14, 2), (9, 3)])
def test_kv_layout_is_the_contiguous_grouping(nq, nkv):
    """transformers' repeat_kv: query heads g·(nq/nkv) .. (g+1)·(nq/nkv) - 1 read kv head g."""
    group = nq // nkv
    want = [g for g in range(nkv) for _ in range(group)]
    got = kv_layout(nq, nkv)
    assert got.dtype == torch.int64 and got.shape == (nq,)
    assert got.tolist() == want


@pytest.mark.parametrize(
    "nq, nkv",
    [(0, 1), (-4, 2), (4, 0), (4, -2), (4, 3), (6, 4), (True, 1), (4, True), (True, True), (2, 4)],
)
def test_kv_layout_refuses_what_is_no_grouping(nq, nkv):
    with pytest.raises(WeightError, match=f"n_heads={nq} is not a positive multiple of n_kv_heads={nkv}"):
        kv_layout(nq, nkv)
