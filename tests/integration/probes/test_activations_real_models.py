"""Activation returns of the real SmolLM2-135M and MiniLM (slow); the probe's unit tests are
tests/unit/probes/test_activations.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from tl_idempotence.probes.activations import activation_returns
from tl_idempotence.probes.tokens import prepare_tokens


@pytest.mark.slow
def test_smollm2_returns_on_stdlib_docstrings(smollm2):
    """Real SmolLM2-135M on the default corpus: all 270 heads, closed heads return alpha-scaled outputs."""
    res = activation_returns(smollm2, max_tokens=1024, progress=False)
    df = res.heads
    assert len(df) == 270 and res.summary["n_tokens"] >= 1024
    assert not df[["a_median", "a_iqr", "cos2_median", "cos2_iqr", "ctrl_cos2_median"]].isna().any().any()
    closed = df[df["closed"]]
    assert len(closed) == 13
    # Measured (4096 tokens): closed heads' median cos2 0.90-0.95 vs scramble control <= 0.01,
    # median return a_t / alpha 0.94-0.99; over all heads the trained head beats its control for 97%.
    assert (closed["cos2_median"] > 0.85).all()
    assert (closed["cos2_median"] > 10 * closed["ctrl_cos2_median"]).all()
    assert closed["a_median_over_alpha"].between(0.9, 1.05).all()
    assert res.summary["frac_beats_control"] > 0.9
    assert np.corrcoef(df["P"], df["cos2_median"])[0, 1] > 0.85


@pytest.mark.slow
def test_minilm_encoder_returns(minilm):
    model = minilm
    res = activation_returns(
        model, ["The encoder reads the whole sentence at once."] * 4, max_tokens=None, progress=False
    )
    assert len(res.heads) == 72 and not res.heads[["a_median", "cos2_median"]].isna().any().any()
    # [CLS] and [SEP] are excluded: 4 copies of the sentence, joined and wrapped once.
    toks, counted = prepare_tokens(model, ["The encoder reads the whole sentence at once."] * 4, max_tokens=None)
    assert toks[0, 0] == model.tokenizer.cls_token_id and not counted[0, 0]
    assert int(res.heads["n_tokens"].iloc[0]) == int(counted.sum())
