"""The causal test of closure (probes/causal.py) on a TransformerBridge against a plain hook: moved out of the unit
tier for its time (booting the bridge of tests/unit/probes/test_causal.py's planted checkpoint, in float64).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from helpers import causal_reference, edit_safetensors, plant_causal
from tl_idempotence.probes.causal import causal_closure
from tl_idempotence.testing import bridge_from_dir, tiny_hf_dir

pytestmark = pytest.mark.bridge


def test_a_transformer_bridge_gives_what_a_plain_hook_gives(tmp_path):
    d = tiny_hf_dir(tmp_path / "tiny", n_layers=2)
    edit_safetensors(d, plant_causal)
    weights = {k: v.double() for k, v in load_file(d / "model.safetensors").items()}
    bridge = bridge_from_dir(d)
    bridge.to(torch.float64)
    toks = torch.randint(4, 100, (2, 12), generator=torch.Generator().manual_seed(2))
    toks[:, 0] = 1
    r = causal_closure(bridge, heads=["L1H4", "L1H5"], texts=toks, variants=("closure_only", "zero"), progress=False)
    assert r.summary["batching"] == "shared prefix" and r.summary["check_max_abs_diff"] < 1e-12
    pos = r.positions
    assert np.abs(pos[(pos["label"] == "L1H4") & (pos["variant"] == "closure_only")]["total"]).max() < 1e-10
    p = pos[(pos["label"] == "L1H5") & (pos["variant"] == "zero")].sort_values(["window", "pos"])
    ref = causal_reference(bridge, weights, toks, 1, 5, "zero", None)
    np.testing.assert_array_equal(p["source_pos"], ref[:, 2].astype(int))
    for col, i in (("total", 4), ("direct", 5), ("loss", 6)):
        np.testing.assert_allclose(p[col], ref[:, i], rtol=1e-8, atol=1e-12)
    one = causal_closure(bridge, heads=["L1H4", "L1H5"], texts=toks, edits_per_pass=1, progress=False)
    both = r.positions.merge(one.positions, on=["label", "variant", "window", "pos"], suffixes=("", "_one"))
    assert len(both) == len(r.positions)
    for col in ("total", "direct", "loss"):
        np.testing.assert_allclose(both[col], both[f"{col}_one"], rtol=1e-12, atol=1e-15)
