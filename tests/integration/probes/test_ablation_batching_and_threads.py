"""The ablation's batched head sets against one forward pass per set, a model that refuses the repeated residual
stream, and the thread-count choice (a fake clock decides it), on tiny models: the heavier ablation checks, moved
out of the unit tier for its time; the ablation's unit tests are tests/unit/probes/test_ablation.py.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from helpers import (
    ABLATION_TOKENS,
    ABLATION_ZERO_HEAD,
    ablation_tiny_dir,
    losses_with,
    reference_losses,
)
from tl_idempotence.probes.ablation import (
    ablation,
    matched_controls,
)
from tl_idempotence.probes.tokens import prepare_tokens

ZERO_HEAD = ABLATION_ZERO_HEAD
TOKENS = ABLATION_TOKENS


KW = {"seq_len": 24, "progress": False}


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    """Llama/GQA (2 layers, 9 heads on 3 kv heads, d_head 8) with head L1H4's W_O zeroed in the HF weights."""
    return ablation_tiny_dir(tmp_path_factory.mktemp("abl"))


def model_of(request, name):
    return request.getfixturevalue(name)


@pytest.mark.parametrize("name", [pytest.param("bridge", marks=pytest.mark.bridge), "hooked"])
@pytest.mark.parametrize("kind", ["mean", "zero"])
def test_batched_head_sets_equal_one_forward_pass_per_set(request, name, kind):
    """Up to 8 head sets share a forward pass (the window repeated after the first ablated layer); the losses
    equal those of one forward pass per set over all windows, to float32 rounding, with 8 sets a pass (two
    chunks) and with 1."""
    model = model_of(request, name)
    flagged = [(0, 7), (1, 2), (1, 5)]
    runs = {
        bs: ablation(model, flagged, TOKENS, kind=kind, n_controls=6, seed=1, singles=True, batch_size=bs, **KW)
        for bs in (1, 8)  # 8: the empty set and 10 head sets in two chunks of 8 and 3; 1: one set per forward
    }
    ab = runs[8]
    assert ab.summary["batching"] == "shared prefix" and ab.summary["check_max_abs_diff"] <= 1e-6
    toks, counted = prepare_tokens(model, TOKENS, seq_len=24, max_tokens=4096)
    sets = [{0: [7], 1: [2, 5]}]
    sets += [
        {layer: [int(x[1:].split("H")[1]) for x in hs.split() if x.startswith(f"L{layer}H")] for layer in (0, 1)}
        for hs in ab.controls["heads"]
    ]
    sets += [{0: [7]}, {1: [2]}, {1: [5]}]
    ref = reference_losses(model, toks, counted, sets, kind)
    ref_clean = losses_with(model, [], toks, counted)
    for bs, run in runs.items():
        got = [run.summary["loss_ablated"], *run.controls["loss_ablated"], *run.heads["loss_ablated"]]
        np.testing.assert_allclose(got, ref, rtol=2e-6, err_msg=f"batch_size={bs}")
        assert run.summary["loss_clean"] == pytest.approx(ref_clean, rel=1e-9)
    # the reference tells the sets apart (a test of equal numbers that could not fail would prove nothing)
    assert np.ptp(ref) > 1e-3


class Refusing:
    """Wraps a model's run_with_hooks: from the ``after``-th forward pass that repeats the residual stream on,
    refuses it (a shape error) or, with ``corrupt``, returns wrong logits (a model that mixes the copies up)."""

    def __init__(self, model, corrupt, after=0):
        self.model, self.corrupt, self.after, self.calls = model, corrupt, after, 0

    def __call__(self, x, fwd_hooks=(), **kw):
        shared = any(n.endswith("hook_resid_pre") for n, _ in fwd_hooks)
        bad = shared and self.calls >= self.after
        self.calls += shared
        if bad and not self.corrupt:
            raise RuntimeError("The size of tensor a (8) must match the size of tensor b (2)")
        out = type(self.model).run_with_hooks(self.model, x, fwd_hooks=list(fwd_hooks), **kw)
        return out + torch.linspace(0, 1, out.shape[-1]) if bad else out


@pytest.mark.bridge
@pytest.mark.parametrize("corrupt", [False, True])
@pytest.mark.parametrize("after", [0, 2])
def test_a_model_refusing_the_repeated_residual_is_run_with_the_input_repeated(bridge, monkeypatch, corrupt, after):
    """On the first window (after=0) or a later one (after=2: windows 0 and 1 share the prefix, one chunk each)."""
    flagged = [(0, 7), (1, 2)]
    want = ablation(bridge, flagged, TOKENS, n_controls=5, **KW)
    spy = Refusing(bridge, corrupt, after)
    monkeypatch.setattr(bridge, "run_with_hooks", spy)
    got = ablation(bridge, flagged, TOKENS, n_controls=5, **KW)
    assert spy.calls == after + 1  # the shared prefix is not tried again after a refusal
    assert got.summary["batching"] == "repeated input"
    assert f"from window {after} on, the model refused the repeated residual stream" in got.summary["note"]
    assert got.summary["check_max_abs_diff"] <= 1e-6
    np.testing.assert_allclose(got.controls["loss_ablated"], want.controls["loss_ablated"], rtol=2e-6)
    assert got.summary["loss_ablated"] == pytest.approx(want.summary["loss_ablated"], rel=2e-6)


class FakeClock:
    """The ablation passes' ``time``: a clock that only moves when a forward pass says so (no wall clock)."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


class SlowOn:
    """Wraps run_with_hooks: a forward pass "takes" 0.5 s of the fake clock while torch runs on ``n`` threads
    (a busy machine) and 0.01 s otherwise; the real time a pass takes never enters the choice."""

    def __init__(self, model, n, clock):
        self.model, self.n, self.clock, self.threads_seen = model, n, clock, []

    def __call__(self, x, fwd_hooks=(), **kw):
        self.threads_seen.append(torch.get_num_threads())
        self.clock.now += 0.5 if torch.get_num_threads() == self.n else 0.01
        return type(self.model).run_with_hooks(self.model, x, fwd_hooks=list(fwd_hooks), **kw)


@pytest.fixture
def two_threads(monkeypatch):
    """torch on 2 threads, as if that were its count at import (the user chose nothing); restored after."""
    import tl_idempotence.core.threads as threads  # the thread count the user chose nothing against

    before = torch.get_num_threads()
    for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.delenv(k, raising=False)
    torch.set_num_threads(2)
    monkeypatch.setattr(threads, "_DEFAULT_THREADS", 2)
    yield
    torch.set_num_threads(before)


@pytest.mark.bridge
@pytest.mark.parametrize("slow", [1, 2])
def test_the_faster_thread_count_runs_the_ablated_passes(bridge, monkeypatch, two_threads, slow):
    """Window 0's first two chunks run on 1 thread and on torch's 2; the faster runs the rest; 2 is restored."""
    import tl_idempotence.probes.ablation.passes as mod  # the passes read the clock and the thread count

    flagged = [(0, 7), (1, 2)]
    clock = FakeClock()
    monkeypatch.setattr(mod, "time", clock)  # the module reads only time.perf_counter
    spy = SlowOn(bridge, slow, clock)
    monkeypatch.setattr(bridge, "run_with_hooks", spy)
    ab = ablation(bridge, flagged, TOKENS, n_controls=14, **KW)  # the empty set and 15 sets: 2 chunks of 8
    s = ab.summary
    assert set(s["threads_seconds_per_set"]) == {"1", "2"}
    assert s["threads"] == 3 - slow and torch.get_num_threads() == 2
    # the clean pass (1 forward) on torch's 2, window 0's first chunks on 1 and 2 threads, then the faster
    assert spy.threads_seen[:3] == [2, 1, 2] and set(spy.threads_seen[3:]) == {3 - slow}
    assert len(spy.threads_seen) == 1 + 2 * len(TOKENS)
    monkeypatch.setattr(bridge, "run_with_hooks", type(bridge).run_with_hooks.__get__(bridge))
    monkeypatch.setenv("OMP_NUM_THREADS", "2")  # the user's choice: nothing is tried
    fixed = ablation(bridge, flagged, TOKENS, n_controls=14, **KW)
    assert fixed.summary["threads"] == 2 and fixed.summary["threads_seconds_per_set"] == {}
    np.testing.assert_allclose(fixed.controls["loss_ablated"], ab.controls["loss_ablated"], rtol=2e-6)


@pytest.mark.bridge
def test_a_thread_count_the_user_set_is_kept(bridge, two_threads, monkeypatch):
    import tl_idempotence.core.threads as threads

    monkeypatch.setattr(threads, "_DEFAULT_THREADS", 4)  # imported on 4 threads; torch.set_num_threads(2) since
    ab = ablation(bridge, [(0, 7), (1, 2)], TOKENS, n_controls=14, **KW)  # 2 full chunks: a count could be tried
    assert ab.summary["threads"] == 2 and ab.summary["threads_seconds_per_set"] == {}
    assert torch.get_num_threads() == 2


@pytest.mark.parametrize("name", [pytest.param("bridge", marks=pytest.mark.bridge), "hooked"])
@pytest.mark.parametrize("kind", ["mean", "zero"])
def test_a_head_whose_W_O_is_zero_changes_nothing(request, name, kind):
    model = model_of(request, name)
    layer, head = ZERO_HEAD
    assert torch.count_nonzero(model.blocks[layer].attn.W_O[head]) == 0
    ab = ablation(model, [ZERO_HEAD, (layer, 3)], TOKENS, kind=kind, n_controls=0, singles=True, **KW)
    h = ab.heads
    # the clean pass (6 windows a batch) and the ablated passes (one window, repeated) agree to float rounding
    assert h.loc["L1H4", "delta_loss"] == pytest.approx(0.0, abs=1e-6)
    assert abs(h.loc["L1H3", "delta_loss"]) > 1e-4  # a head that writes something does change the loss
    # the set = L1H3 alone + a silent head
    assert ab.summary["delta_loss"] == pytest.approx(ab.heads.loc["L1H3", "delta_loss"], abs=1e-6)
    assert (h["reason"] == "").all()
    assert np.isnan(ab.summary["p_value"]) and "n_controls=0" in ab.summary["note"]
    assert np.isnan(ab.summary["excess_over_controls"]) and np.isnan(ab.summary["excess_ci_low"])


@pytest.mark.bridge
def test_controls_are_matched_and_deterministic(bridge):
    flagged = [(0, 1), (0, 2), (1, 5)]
    a = ablation(bridge, flagged, TOKENS, n_controls=6, seed=3, **KW)
    b = ablation(bridge, flagged, TOKENS, n_controls=6, seed=3, **KW)
    other_seed, _ = matched_controls({0: [1, 2], 1: [5]}, n_heads=9, n_controls=6, seed=4)
    pd.testing.assert_frame_equal(a.controls, b.controls, check_exact=True)
    pd.testing.assert_frame_equal(a.heads, b.heads, check_exact=True)
    assert list(a.controls["heads"]) == [
        " ".join(f"L{k}H{h}" for k, hs in sorted(c.items()) for h in hs)
        for c in matched_controls({0: [1, 2], 1: [5]}, n_heads=9, n_controls=6, seed=3)[0]
    ]
    assert [c for c in other_seed] != matched_controls({0: [1, 2], 1: [5]}, n_heads=9, n_controls=6, seed=3)[0]
    for s in a.controls["heads"]:
        labels = s.split()
        assert sum(x.startswith("L0H") for x in labels) == 2 and sum(x.startswith("L1H") for x in labels) == 1
        assert not {"L0H1", "L0H2", "L1H5"} & set(labels)
    assert (a.controls["n_flagged_in_set"] == 0).all()
    d, cd = a.summary["delta_loss"], a.controls["delta_loss"].to_numpy()
    assert a.summary["p_value"] == (1 + int((cd >= d).sum())) / 7 and a.summary["p_value_floor"] == 1 / 7
    assert a.summary["n_controls_at_least"] == int((cd >= d).sum())
    # the headline numbers are typed attributes too (the summary stays the one source)
    for key in (
        "delta_loss", "p_value", "p_value_floor", "control_delta_median", "excess_over_controls",
        "delta_loss_ci_low", "delta_loss_ci_high", "excess_ci_low", "excess_ci_high", "loss_clean", "loss_ablated",
    ):  # fmt: skip
        got = getattr(a, key)
        assert type(got) is float and got == a.summary[key], key
    assert (a.n_controls, a.n_distinct_controls, a.n_controls_at_least) == (6, 21 * 8, a.summary["n_controls_at_least"])
    assert a.summary["n_controls_requested"] == 6 and a.summary["controls_exhaustive"] is False
    assert "controls_warning" not in a.summary and "controls_warning" not in repr(a)
    assert len(set(a.controls["heads"])) == 6 and "L0H1 L0H2 L1H5" not in set(a.controls["heads"])
    assert a.summary["control_delta_median"] == float(np.median(cd))
    assert a.summary["excess_over_controls"] == d - float(np.median(cd))
    assert np.isnan(a.summary["sum_delta_single"]) and a.heads["delta_loss"].isna().all()
    assert (a.heads["reason"] == "not ablated alone (singles=False)").all() and "singles=True" in a.summary["note"]
    assert list(a.heads.index) == ["L0H1", "L0H2", "L1H5"] and list(a.heads["kv_head"]) == [0, 0, 1]
    assert a.heads.index.name == "label"
    assert repr(a).startswith("Ablation(delta_loss=") and "control_delta_median=" in repr(a) and "p_value=" in repr(a)
    # a smaller n_controls gives the first controls of a larger one
    c3 = ablation(bridge, flagged, TOKENS, n_controls=3, seed=3, **KW)
    assert list(c3.controls["heads"]) == list(a.controls["heads"][:3])
    # every loss is recomputable from the per-window table
    w = a.window_losses
    assert list(w.columns[:3]) == ["n_tokens", "clean", "flagged"] and len(w) == len(TOKENS)
    for col, want in [("clean", a.summary["loss_clean"]), ("flagged", a.summary["loss_ablated"])]:
        assert (w[col] * w["n_tokens"]).sum() / w["n_tokens"].sum() == pytest.approx(want, rel=1e-12)
    for c in range(6):
        got = (w[f"control {c}"] * w["n_tokens"]).sum() / w["n_tokens"].sum()
        assert got == pytest.approx(a.controls["loss_ablated"][c], rel=1e-12)
