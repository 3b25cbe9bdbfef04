"""The post-attention-norm caveat is decided in one place for every source (SPEC section 10).

A norm applied to the attention output after W_O (Gemma-2/3, OLMo-2) is not part of T = O Vᵀ. The checkpoint
folder, the loaded transformers model and the TransformerBridge built from that folder must all say so, with
the same note; the bridge configs do not set ``use_normalization_before_and_after``, so the bridge route reads
the wrapped model's modules through the same table rule (``sources.checkpoint.post_attention_note``).
"""

from __future__ import annotations

import warnings

import pytest

from helpers import saved_tiny_model
from tl_idempotence.sources.dispatch import head_source

pytestmark = pytest.mark.bridge


def test_a_processed_bridge_keeps_the_note(tmp_path):
    """enable_compatibility_mode folds norms into W_V: the post-attention norm is still after W_O."""
    from tl_idempotence.testing import bridge_from_dir

    _model, d = saved_tiny_model(tmp_path, "gemma3_text", "Gemma3ForCausalLM")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bridge = bridge_from_dir(d)
        bridge.enable_compatibility_mode(disable_warnings=True)
    assert "norm after W_O" in head_source(bridge).info.extra["post_attention_norm"]


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ({"use_normalization_before_and_after": True}, "'blocks.0.ln1_post', every layer"),  # Gemma-2/3 in TL
        ({"original_architecture": "Olmo2ForCausalLM"}, "'blocks.0.ln1, Olmo2ForCausalLM's post_attention_layernorm'"),
        ({"original_architecture": "LlamaForCausalLM"}, None),
        ({}, None),
    ],
)
def test_hooked_transformer_post_norm_from_its_blocks(flags, expected):
    """HookedTransformer (transformer-lens 3.x): the blocks' ln1_post modules, or the table's entry for the
    config's original_architecture (TL applies OLMo-2's post-attention norm as ln1, after attention)."""
    try:
        from transformer_lens import HookedTransformer, HookedTransformerConfig
    except ImportError:
        pytest.skip("transformer-lens 4.x has no HookedTransformer")
    cfg = HookedTransformerConfig(
        n_layers=2, d_model=32, n_ctx=16, d_head=8, n_heads=4, d_vocab=50, act_fn="gelu", normalization_type="RMS",
        **flags,
    )  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = HookedTransformer(cfg)
    note = head_source(model).info.extra.get("post_attention_norm")
    if expected is None:
        assert note is None
    else:
        assert note is not None and expected in note and "norm after W_O" in note
