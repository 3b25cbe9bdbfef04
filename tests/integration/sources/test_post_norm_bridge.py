"""A bridge carries the same post-attention-norm note as its folder, for every covered type (tiny models; moved out of
the unit tier for its time); the unit tests are tests/unit/sources/test_post_norm_routes.py.
"""

from __future__ import annotations

import warnings

import pytest

import tl_idempotence as tli
from helpers import saved_tiny_model
from tl_idempotence.sources.checkpoint import from_path, from_transformers
from tl_idempotence.sources.dispatch import head_source

pytestmark = pytest.mark.bridge


CASES = [
    ("gemma3_text", "Gemma3ForCausalLM", True),
    ("olmo2", "Olmo2ForCausalLM", True),
    ("gemma2", "Gemma2ForCausalLM", True),
    ("llama", "LlamaForCausalLM", False),  # its post_attention_layernorm is the pre-MLP norm
]


@pytest.mark.parametrize(("model_type", "hf_class", "noted"), CASES)
def test_bridge_carries_the_same_post_norm_note_as_its_folder(tmp_path, model_type, hf_class, noted):
    from tl_idempotence.testing import bridge_from_dir

    model, d = saved_tiny_model(tmp_path, model_type, hf_class)
    folder = from_path(d).info.extra.get("post_attention_norm")
    loaded = from_transformers(model).info.extra.get("post_attention_norm")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bridge = bridge_from_dir(d)
    bridged = head_source(bridge).info.extra.get("post_attention_norm")
    assert (folder is not None) == noted
    assert folder == loaded == bridged
    if noted:
        assert "'model.layers.0.post_attention_layernorm.weight', every layer" in folder
    # and the reports say it in their summaries, the same words
    rep_files = tli.idempotence_report(str(d), progress=False)
    rep_bridge = tli.idempotence_report(bridge, progress=False)
    assert rep_files.summary.get("notes") == rep_bridge.summary.get("notes")
    assert ("notes" in rep_bridge.summary) == noted
    # the numbers too: the bridge's raw W_V/W_O are the files' (float32 both)
    assert rep_files.heads.P.tolist() == pytest.approx(rep_bridge.heads.P.tolist(), abs=1e-12)
