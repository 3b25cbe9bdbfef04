"""The null controls end to end on the real SmolLM2-135M (slow); the controls' unit tests are
tests/unit/analyses/test_controls.py.
"""

from __future__ import annotations

import pytest


@pytest.mark.slow
def test_smollm2_controls_end_to_end(smollm2):
    """Measured on SmolLM2-135M-Instruct (raw weights, 64 draws, seed 0):
    13/270 heads closed (4.81 %), 0 of 540 mismatch pairs closed (max P 0.023), median P
    0.265 trained vs 3.3e-4 scrambled, 97.4 % of heads beat their scramble, all 30 layers won."""
    rep = smollm2.idempotence_report(nulls=64, search=True, progress=False)
    s, L = rep.summary, rep.layers
    assert s["n_heads"] == 270 and s["n_mismatch_pairs"] == 30 * 18
    assert 0.0398 <= s["frac_closed"] <= 0.08  # inside the paper's range
    assert s["n_mismatch_closed"] == 0 and s["mismatch_P_max"] < 0.1
    assert s["median_P_trained"] > 0.2 and s["median_P_scrambled"] < 1e-3
    assert s["median_P_trained"] / s["median_P_scrambled"] > 300
    assert s["frac_beats_scramble"] > 0.95
    assert s["n_layers_trained_wins"] == 30 and (L["median_P"] > L["median_P_scrambled"]).all()
    assert (L["median_P_scrambled"] < 0.05).all()  # layer 0 is the highest: 0.016
    # internal consistency of the per-head columns
    h = rep.heads
    assert ((h["P"] > h["P_scrambled_median"]) == h["beats_scramble"]).all()
    assert ((h["p_value"] > 0) & (h["p_value"] <= 1)).all()
    # constructive search: feasible in every layer, never below the attained P
    assert s["n_feasible_layers"] == 30
    assert (h["P_searched"] >= h["P"] - 1e-6).all()
    assert (L["feasible_P"] >= L["max_P"] - 1e-6).all()
    tab = rep.paper_table()
    for i in (5, 6):  # trained orientation wins / P >= 0.9 feasible: every layer
        assert tab.loc[i, "value"] == 1.0 and (tab.loc[i, "n"], tab.loc[i, "of"]) == (30, 30)


def test_smollm2_controls_on_three_layers(smollm2):
    """Measured (seed 0, 32 draws): in layers 5, 10, 27 the trained median P (0.48, 0.50, 0.81) is
    >= 300x the scrambled median (~3e-4) and no cross-kv pair gets near closure (max P < 0.02)."""
    rep = smollm2.idempotence_report(layers=[5, 10, 27], nulls=32, progress=False)
    L, s = rep.layers, rep.summary
    assert list(L["layer"]) == [5, 10, 27] and (L["n_mismatch_pairs"] == 18).all()
    assert (L["mismatch_P_max"] < 0.05).all() and s["n_mismatch_closed"] == 0
    assert (L["median_P"] > 300 * L["median_P_scrambled"]).all() and L["trained_wins"].all()
    assert s["frac_beats_scramble"] >= 0.85
    assert (rep.heads["P_scrambled_q95"] < 0.05).all()
    tab = rep.paper_table()
    assert tab.loc[5, "value"] == 1.0 and (tab.loc[5, "n"], tab.loc[5, "of"]) == (3, 3)
    assert rep.paper_table(formatted=True).loc[5, "this model"] == "100.00 % (3/3)"
