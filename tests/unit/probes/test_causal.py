"""tli's causal test of closure (probes/causal.py, SPEC 13): edit a head's OV, measure the attended token's final logit.

A tiny Llama/GQA checkpoint (9 heads on 3 kv heads, d_head 8) with two planted facts: query head L1H4 is exactly
closed (its kv group's ``V = 0.5 [e_0, e_9, ..., e_63]`` and ``O = -6 V``, so ``M = VᵀO = -1.5 I`` exactly in float32
and float64), and the final norm's weight is random (so the direct path's weight matters). Run in float64:

* closure-only leaves the closed head's outputs as they are (float64 precision);
* every variant's per-position total, direct, self-repair and loss changes equal a plain TransformerLens
  ``run_with_hooks`` on ``hook_z`` with ``N`` built independently (numpy from the checkpoint's tensors for
  closure-only; the mean from ``run_with_cache``), the direct path through the checkpoint's own norm weight;
* the GQA heads of one kv group get their own ``N``; the sign test and BH q are scipy's on the positions;
* bad arguments and a post-attention norm are refused; the result is frozen.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from helpers import edit_safetensors, hooked_or_skip
from tl_idempotence.core.heads import LayerHeads
from tl_idempotence.errors import OptionError, UnknownOptionError, UnsupportedModelError
from tl_idempotence.maths.ov_edits import closure_free_edits
from tl_idempotence.probes import causal
from tl_idempotence.probes.causal import causal_closure
from tl_idempotence.testing import bridge_from_dir, tiny_hf_dir

pytestmark = pytest.mark.bridge

DH = 8
HEADS = ["L0H1", "L1H4", "L1H5"]  # L1H4 (closed) and L1H5 share kv head 1


def _plant(t: dict) -> None:
    g = torch.Generator().manual_seed(5)
    t["model.norm.weight"] = 0.5 + torch.rand(72, generator=g)
    V = torch.zeros(72, DH)
    V[torch.arange(DH) * 9, torch.arange(DH)] = 0.5
    t["model.layers.1.self_attn.v_proj.weight"][DH : 2 * DH] = V.T
    t["model.layers.1.self_attn.o_proj.weight"][:, 4 * DH : 5 * DH] = -6.0 * V


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    d = tiny_hf_dir(tmp_path_factory.mktemp("causal") / "tiny", n_layers=2)
    edit_safetensors(d, _plant)
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


def O_of(w, layer, h):
    return w[f"model.layers.{layer}.self_attn.o_proj.weight"][:, h * DH : (h + 1) * DH]  # [d_model, d_head]


def V_of(w, layer, h):
    g = h // 3
    return w[f"model.layers.{layer}.self_attn.v_proj.weight"][g * DH : (g + 1) * DH].T  # [d_model, d_head]


def closure_only_N(w, layer, h):
    O, V = O_of(w, layer, h).numpy(), V_of(w, layer, h).numpy()
    T = O @ V.T
    alpha = np.sum((T @ T) * T) / np.sum(T * T)
    return torch.from_numpy(alpha * np.linalg.inv(V.T @ O))


def reference(model, w, toks, layer, h, kind, value, clean_run=None):
    """Per counted destination: (window, pos, source, token, total, direct, loss) by a plain hook on hook_z."""
    counted = toks != 1
    with torch.no_grad():
        clean, cache = clean_run or model.run_with_cache(toks)

        def hook(z, hook):
            z = z.clone()
            z[:, :, h] = {"map": lambda x: x @ value.T, "zero": lambda x: 0 * x, "mean": lambda x: value + 0 * x}[kind](
                z[:, :, h]
            )
            return z

        edited = model.run_with_hooks(toks, fwd_hooks=[(f"blocks.{layer}.attn.hook_z", hook)])
    z = cache[f"blocks.{layer}.attn.hook_z"][:, :, h]
    pat = cache[f"blocks.{layer}.attn.hook_pattern"][:, h]
    scale = cache["ln_final.hook_scale"][..., 0]
    W_O, W_U, norm_w = O_of(w, layer, h).T, model.W_U.detach().double(), w["model.norm.weight"]
    lp0, lp1 = torch.log_softmax(clean, -1), torch.log_softmax(edited, -1)
    out = []
    for b in range(toks.shape[0]):
        for q in range(toks.shape[1]):
            if not counted[b, q]:
                continue
            s = max((k for k in range(q + 1) if counted[b, k]), key=lambda k: (pat[b, q, k].item(), -k))
            t = int(toks[b, s])
            z_new = {"map": z[b, q] @ value.T if kind == "map" else None, "zero": 0 * z[b, q], "mean": value}[kind]
            direct = float(((z_new - z[b, q]) @ W_O / scale[b, q] * norm_w) @ W_U[:, t])
            loss = np.nan
            if q + 1 < toks.shape[1] and counted[b, q + 1]:
                nxt = int(toks[b, q + 1])
                loss = float(lp0[b, q, nxt] - lp1[b, q, nxt])
            out.append((b, q, s, t, float(edited[b, q, t] - clean[b, q, t]), direct, loss))
    return np.array(out, dtype=float)


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
    assert not hasattr(result, "save")


def test_a_transformer_bridge_gives_what_a_plain_hook_gives(tiny_dir, weights):
    bridge = bridge_from_dir(tiny_dir)
    bridge.to(torch.float64)
    toks = _toks()[:1]
    r = causal_closure(bridge, heads=["L1H4", "L1H5"], texts=toks, variants=("closure_only", "zero"), progress=False)
    pos = r.positions
    assert np.abs(pos[(pos["label"] == "L1H4") & (pos["variant"] == "closure_only")]["total"]).max() < 1e-10
    p = pos[(pos["label"] == "L1H5") & (pos["variant"] == "zero")].sort_values("pos")
    ref = reference(bridge, weights, toks, 1, 5, "zero", None)
    np.testing.assert_array_equal(p["source_pos"], ref[:, 2].astype(int))
    for col, i in (("total", 4), ("direct", 5), ("loss", 6)):
        np.testing.assert_allclose(p[col], ref[:, i], rtol=1e-8, atol=1e-12)


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
