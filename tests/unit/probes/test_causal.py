"""tli's causal test of closure (probes/causal.py, SPEC 13): edit a head's OV, measure the attended token's final logit.

A tiny Llama/GQA checkpoint (9 heads on 3 kv heads, d_head 8) with three planted facts: query head L1H4 is exactly
closed (its kv group's ``V = 0.5 [e_0, e_9, ..., e_63]`` and ``O = -6 V``, so ``M = VᵀO = -1.5 I`` exactly in float32
and float64), query head L0H2 writes nothing (``W_O = 0``), and the final norm's weight is random (so the direct path's
weight matters). Run in float64 on one torch thread (the module's fixture; the machine's other jobs make torch's
threads slow on tiny products):

* closure-only leaves the closed head's outputs as they are (float64 precision);
* every variant's per-position total, direct, self-repair and loss changes equal a plain TransformerLens
  ``run_with_hooks`` on ``hook_z`` with ``N`` built independently (numpy from the checkpoint's tensors for
  closure-only; the mean from ``run_with_cache``), the direct path through the checkpoint's own norm weight;
* the GQA heads of one kv group get their own ``N``; the sign test and BH q are scipy's on the positions;
* the batched passes (several edits a forward pass, the prefix shared) give the numbers of one pass per edit, also
  when the shared prefix is refused (the check copy differs: the input is repeated instead);
* the head that writes nothing changes nothing, and says so (a reason, no sign test), and has no OV edit;
* bad arguments and a post-attention norm are refused; the result is frozen.

The TransformerBridge's run against a plain hook is tests/integration/probes/test_causal_bridge.py.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest
import torch
from safetensors.torch import load_file

from helpers import CAUSAL_DH as DH
from helpers import causal_closure_only_N as closure_only_N
from helpers import causal_O as O_of
from helpers import causal_reference as reference
from helpers import causal_V as V_of
from helpers import edit_safetensors, hooked_or_skip, plant_causal
from tl_idempotence.core.heads import LayerHeads
from tl_idempotence.errors import OptionError, UnknownOptionError, UnsupportedModelError
from tl_idempotence.maths.ov_edits import closure_free_edits
from tl_idempotence.probes import causal, causal_passes
from tl_idempotence.probes.causal import causal_closure
from tl_idempotence.probes.causal_passes import Edit, auto_edits_per_pass, chunk_edits
from tl_idempotence.probes.causal_tables import NO_CHANGE
from tl_idempotence.testing import tiny_hf_dir

pytestmark = [pytest.mark.bridge, pytest.mark.usefixtures("one_torch_thread")]

HEADS = ["L0H1", "L1H4", "L1H5"]  # L1H4 (closed) and L1H5 share kv head 1


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    d = tiny_hf_dir(tmp_path_factory.mktemp("causal") / "tiny", n_layers=2)
    edit_safetensors(d, plant_causal)
    return d


@pytest.fixture(scope="module")
def model64(tiny_dir):
    """The HookedTransformer in float64 (a forward pass costs ~1/10 of the bridge's; the bridge has its own test)."""
    m = hooked_or_skip(tiny_dir)
    m.to(torch.float64)
    return m


@pytest.fixture(scope="module")
def clean(model64):
    with torch.no_grad():
        return model64.run_with_cache(_toks())


@pytest.fixture(scope="module")
def weights(tiny_dir):
    return {k: v.double() for k, v in load_file(tiny_dir / "model.safetensors").items()}


def _toks():
    toks = torch.randint(4, 100, (3, 12), generator=torch.Generator().manual_seed(2))
    toks[:, 0] = 1  # BOS: special, never a source or destination
    return toks


@pytest.fixture(scope="module")
def result(model64):
    return causal_closure(model64, heads=HEADS, texts=_toks(), batch_size=2, progress=False)


def test_closure_only_leaves_an_exactly_closed_head_as_it_is(result, weights):
    N = closure_only_N(weights, 1, 4)
    assert torch.allclose(N, torch.eye(DH, dtype=torch.float64), atol=1e-14)
    ch = result.changes.set_index(["label", "variant"])
    assert ch.loc[("L1H4", "closure_only"), "rel_change"] < 1e-13
    pos = result.positions
    p = pos[(pos["label"] == "L1H4") & (pos["variant"] == "closure_only")]
    assert len(p) == 33
    for col in ("total", "direct", "self_repair"):
        assert np.abs(p[col]).max() < 1e-10
    assert np.nanmax(np.abs(p["loss"])) < 1e-10
    # the same head's other variants do change it
    assert np.abs(pos[(pos["label"] == "L1H4") & (pos["variant"] == "zero")]["total"]).max() > 1e-3
    assert result.table.loc["L1H4", "alpha"] == pytest.approx(-1.5, rel=1e-12)


@pytest.mark.parametrize("variant", ["closure_only", "closure_free", "zero", "mean"])
def test_each_variant_equals_a_plain_transformer_lens_hook(variant, model64, weights, result, clean):
    toks = _toks()
    pos = result.positions
    for label in HEADS:
        layer, h = int(label[1]), int(label[3])
        if variant == "closure_only":
            kind, value = "map", closure_only_N(weights, layer, h)
        elif variant == "closure_free":
            O = torch.stack([O_of(weights, layer, k) for k in range(9)])
            lh = LayerHeads(
                layer, O, torch.stack([V_of(weights, layer, 3 * g) for g in range(3)]), torch.arange(9) // 3
            )
            kind, value = "map", closure_free_edits(lh, [h]).N[h]
        elif variant == "zero":
            kind, value = "zero", None
        else:
            kind, value = "mean", clean[1][f"blocks.{layer}.attn.hook_z"][:, :, h][toks != 1].mean(0)
        ref = reference(model64, weights, toks, layer, h, kind, value, clean)
        p = pos[(pos["label"] == label) & (pos["variant"] == variant)].sort_values(["window", "pos"])
        np.testing.assert_array_equal(p[["window", "pos", "source_pos", "token"]].to_numpy(), ref[:, :4].astype(int))
        scale = np.abs(ref[:, 4]).max()
        if (label, variant) != ("L1H4", "closure_only"):  # that one changes nothing (the test above)
            assert scale > 1e-6
        np.testing.assert_allclose(p["total"], ref[:, 4], rtol=1e-8, atol=1e-10 * scale)
        np.testing.assert_allclose(p["direct"], ref[:, 5], rtol=1e-8, atol=1e-10 * scale)
        np.testing.assert_allclose(p["self_repair"], ref[:, 5] - ref[:, 4], rtol=1e-8, atol=1e-10 * scale)
        np.testing.assert_allclose(p["loss"], ref[:, 6], rtol=1e-8, atol=1e-12)


def test_gqa_heads_of_one_kv_group_get_their_own_map(result):
    ch = result.changes.set_index(["label", "variant"])
    a, b = ch.loc[("L1H4", "closure_only"), "rel_change"], ch.loc[("L1H5", "closure_only"), "rel_change"]
    assert a < 1e-13 < 0.1 < b
    assert ch.loc[("L1H4", "zero"), "rel_change"] == 1.0 and np.isnan(ch.loc[("L1H4", "mean"), "rel_change"])


def test_statistics_are_scipy_on_the_positions(result):
    from scipy.stats import binomtest, false_discovery_control

    ch, pos = result.changes, result.positions
    for v, g in ch.groupby("variant"):
        ps = []
        for _, row in g.iterrows():
            p = pos[(pos["label"] == row["label"]) & (pos["variant"] == v)]
            x = p["total"].to_numpy()
            k, n = int((x > 0).sum()), int((x != 0).sum())
            ps.append(binomtest(k, n, 0.5).pvalue if n else np.nan)  # no nonzero change: no test
            assert row["total_median"] == np.median(x) and row["direct_median"] == np.median(p["direct"])
            assert row["loss_change_mean"] == pytest.approx(np.nanmean(p["loss"]), rel=1e-12)
            assert (row["n_pos_total"], row["n_neg_total"], row["n_positions"]) == (k, n - k, len(p))
        np.testing.assert_allclose(g["p_value"], ps, rtol=1e-12)
        fin = np.isfinite(ps)
        np.testing.assert_allclose(
            g["q_value"][fin], false_discovery_control(np.array(ps)[fin], method="bh"), rtol=1e-12
        )
        assert g["q_value"][~fin].isna().all()
    t = result.table
    assert list(t.index) == HEADS
    np.testing.assert_array_equal(t["total_zero"], ch[ch["variant"] == "zero"].set_index("label")["total_median"])


def test_the_result_is_frozen_and_hands_out_copies(result):
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.summary = {}
    p = result.positions
    p["total"] = 0.0
    assert np.abs(result.positions["total"]).max() > 0
    assert "closure_free" in result.headline and result.summary["final_norm"].startswith("weight applied")
    assert result.summary["batching"] == "shared prefix" and result.summary["check_max_abs_diff"] < 1e-12


def test_bad_arguments_are_refused(model64, monkeypatch):
    toks = _toks()
    with pytest.raises(OptionError, match="variants"):
        causal_closure(model64, heads=["L0H1"], texts=toks, variants=["closure"], progress=False)
    with pytest.raises(OptionError, match="variants"):
        causal_closure(model64, heads=["L0H1"], texts=toks, variants=[], progress=False)
    with pytest.raises(OptionError):
        causal_closure(model64, heads=["L5H1"], texts=toks, progress=False)
    with pytest.raises(UnknownOptionError):
        causal_closure(model64, heads=["L0H1"], texts=toks, variant="zero")
    with pytest.raises(UnsupportedModelError):
        causal_closure(torch.nn.Linear(2, 2), texts=toks)

    class PostNorm(causal.TLModelSource):
        def __init__(self, model):
            super().__init__(model)
            self.info = dataclasses.replace(self.info, extra={**self.info.extra, "post_attention_norm": "ln1_post"})

    monkeypatch.setattr(causal, "TLModelSource", PostNorm)
    with pytest.raises(UnsupportedModelError, match="norm after W_O"):
        causal_closure(model64, heads=["L0H1"], texts=toks, progress=False)


def test_the_batched_passes_give_the_numbers_of_one_pass_per_edit(model64, result):
    one = causal_closure(model64, heads=HEADS, texts=_toks(), batch_size=2, edits_per_pass=1, progress=False)
    two = causal_closure(model64, heads=HEADS, texts=_toks(), batch_size=3, edits_per_pass=2, progress=False)
    assert result.summary["edits_per_pass"] == 12 and one.summary["batching"] == "one edit per pass"
    assert two.summary["edits_per_pass"] == 2 and two.summary["batching"] == "shared prefix"
    for other in (one, two):
        a, b = result.positions, other.positions
        assert list(a.columns) == list(b.columns) and len(a) == len(b) == 3 * 4 * 33
        for col in a.columns:
            if a[col].dtype.kind in "fc":
                np.testing.assert_allclose(b[col], a[col], rtol=1e-12, atol=1e-15, err_msg=col)
            else:
                assert list(a[col]) == list(b[col]), col
        pd.testing.assert_frame_equal(result.changes, other.changes, rtol=1e-10)


def test_a_refused_shared_prefix_falls_back_to_the_repeated_input(model64, result, monkeypatch):
    def shifted(n):  # the repeated residual comes back changed: the unedited copy no longer equals the clean pass
        return lambda x, hook=None: x.repeat(n, *([1] * (x.ndim - 1))) + 1e-3

    monkeypatch.setattr(causal_passes, "_repeat_hook", shifted)
    r = causal_closure(model64, heads=HEADS, texts=_toks(), batch_size=2, progress=False)
    assert r.summary["batching"] == "repeated input from window 0" and r.summary["check_max_abs_diff"] < 1e-12
    np.testing.assert_allclose(r.positions["total"], result.positions["total"], rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(r.positions["loss"], result.positions["loss"], rtol=1e-12, atol=1e-15)


def test_a_head_that_writes_nothing_changes_nothing_and_says_so(model64):
    r = causal_closure(model64, heads=["L0H2"], texts=_toks(), progress=False)
    ch = r.changes.set_index("variant")
    for v in ("closure_free", "closure_only"):  # T = 0: no closure to remove or keep
        assert ch.loc[v, "n_positions"] == 0 and ch.loc[v, "reason"] and np.isnan(ch.loc[v, "total_median"])
    for v in ("zero", "mean"):
        assert ch.loc[v, "n_positions"] == 33 and ch.loc[v, "reason"] == NO_CHANGE
        assert ch.loc[v, "total_median"] == 0.0 and np.isnan(ch.loc[v, "p_value"]) and np.isnan(ch.loc[v, "q_value"])
        assert ch.loc[v, "n_pos_total"] == ch.loc[v, "n_neg_total"] == 0
    pos = r.positions
    assert len(pos) == 66 and (pos[["total", "direct", "self_repair"]].to_numpy() == 0).all()
    assert np.nanmax(np.abs(pos["loss"])) == 0.0
    assert "0 lower and 0 raise it (of 2 heads" not in r.headline and "zero: 0 lower and 0 raise it" in r.headline


def test_edits_are_chunked_in_layer_order_within_their_spread_and_capacity():
    edits = [Edit(layer, h, "zero", "zero", None) for layer, h in [(9, 0), (0, 1), (1, 2), (0, 3), (2, 0), (3, 1)]]
    assert chunk_edits(edits, 3) == [[1, 3, 2], [4, 5], [0]]  # layers 0 0 1 | 2 3 | 9 (at most 2 layers past the first)
    assert chunk_edits(edits, 1) == [[1], [3], [2], [4], [5], [0]]
    assert chunk_edits(edits, 64) == [[1, 3, 2, 4], [5], [0]]
    assert auto_edits_per_pass(104, 128, 49152) == 20  # 2^27 logits: 21 copies, one the unedited check
    assert auto_edits_per_pass(3, 12, 100) == 3 and auto_edits_per_pass(500, 2, 10) == 64
    assert auto_edits_per_pass(5, 1 << 20, 1 << 20) == 1
