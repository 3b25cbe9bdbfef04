"""The default ablation of SmolLM2-135M's closed heads (slow: a real model, many windows); the ablation's unit tests
are tests/unit/probes/test_ablation.py.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import tl_idempotence as tli


@pytest.mark.slow
@pytest.mark.bridge
def test_smollm2_default_ablation_of_the_closed_heads_is_significant(smollm2):
    """The researcher's call, with the defaults: rep.ablation(model=m) on SmolLM2's 13 closed heads.

    Measured (benchmarks/RESULTS.md): Δ = 0.195 nats/token on 634 tokens, all 39 matched sets below it
    (median 0.060, max 0.119), p = 0.025.
    """
    rep = tli.idempotence_report(smollm2, progress=False)
    closed = rep.closed_heads
    assert len(closed) == 13  # tests/data/v0_1: 13 of 270 heads with P >= 0.9 (raw weights)
    ab = rep.ablation(model=smollm2, progress=False)
    s = ab.summary
    print("\nSmolLM2-135M, default ablation:", {k: s[k] for k in list(s)[:16]})
    print(ab.controls[["heads", "delta_loss"]].to_string())
    assert s["n_heads"] == 13 and s["n_controls"] == 39 and s["n_tokens"] >= 512 and s["kind"] == "mean"
    assert s["batching"] == "shared prefix" and s["check_max_abs_diff"] <= 1e-4
    assert np.isfinite([s["loss_clean"], s["loss_ablated"]]).all() and 0 < s["loss_clean"] < 10
    assert s["p_value"] <= 0.05 and s["delta_loss"] > s["control_delta_q95"]
    assert s["delta_loss_ci_low"] > 0 and s["excess_ci_low"] > 0
    per_layer = closed.groupby("layer").size().to_dict()
    for heads in ab.controls["heads"]:
        got = pd.Series([int(x[1:].split("H")[0]) for x in heads.split()]).value_counts().to_dict()
        assert got == per_layer
