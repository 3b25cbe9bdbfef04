"""compare on the three zoo models in one call (slow); compare's unit tests are tests/unit/studies/test_compare.py."""

from __future__ import annotations

import os

import pytest

import tl_idempotence as tli

pytestmark = pytest.mark.bridge


@pytest.mark.slow
def test_the_three_zoo_models_in_one_call():
    """SmolLM2 (GQA 9/3), MiniLM (MHA encoder) and Gemma-3-270M (MQA 4/1, d_head 256): one call, one table."""
    try:
        from tl_idempotence.sources.zoo import checkpoint_dir

        for name in ("smollm2-135m", "minilm-l6", "gemma-3-270m"):
            checkpoint_dir(name, progress=False)
    except Exception as e:
        if os.environ.get("CI"):
            pytest.fail(f"zoo models not available: {e}")
        pytest.skip(f"zoo models not available: {e}")
    cmp = tli.compare(["smollm2-135m", "minilm-l6", "gemma-3-270m"], progress=False)
    t = cmp.models_table.set_index("model")
    assert list(t.index) == ["smollm2-135m", "minilm-l6", "gemma-3-270m"]
    assert t.n_heads_total.tolist() == [270, 72, 72]
    assert t.n_kv_heads.tolist() == [3, 12, 1] and t.d_head.tolist() == [64, 32, 256]
    assert t.weights_group.nunique() == 3 and t.raw_weights.all()
    g = cmp.reports["gemma-3-270m"]
    assert any("norm after W_O" in n for n in g.summary["notes"])
    assert "notes" not in cmp.reports["smollm2-135m"].summary
    assert len(cmp.table) == 5  # the three models and the paper's two rows
