"""Activation returns on tiny models: max_tokens in whole windows, the bridge and HookedTransformer agree, heads
indexed like the report, the deprecated n_control_draws (moved out of the unit tier for their time); the probe's
unit tests are tests/unit/probes/test_activations.py.
"""

from __future__ import annotations

import inspect
import warnings

import numpy as np
import pytest
import torch

from tl_idempotence.probes.activations import activation_returns
from tl_idempotence.testing import bridge_from_dir, tiny_hf_dir


def _tokens(n=4, pos=24, seed=0):
    t = torch.randint(4, 100, (n, pos), generator=torch.Generator().manual_seed(seed))
    t[:, 0] = 1  # BOS (w1), a special token: excluded from the statistics
    return t


def test_bridge_and_hooked_agree_and_random_control(tmp_path):
    from tl_idempotence.testing import hooked_from_dir

    d = tiny_hf_dir(tmp_path / "tq", arch="llama")
    b, h = bridge_from_dir(d), hooked_from_dir(d)
    toks = _tokens(n=3, pos=16)
    rb = activation_returns(b, toks, progress=False)
    rh = activation_returns(h, toks, progress=False)
    assert len(rb.heads) == 18
    for col in ("a_median", "cos2_median", "cos2_iqr", "ctrl_cos2_median"):
        np.testing.assert_allclose(rb.heads[col], rh.heads[col], rtol=1e-4, atol=1e-6)
    rr = activation_returns(b, toks, heads=[(1, 2), (0, 4)], control="random", progress=False)
    assert list(zip(rr.heads["layer"], rr.heads["head"])) == [(0, 4), (1, 2)]
    assert list(rr.heads.index) == ["L0H4", "L1H2"] and rr.heads.index.name == "label"
    assert rr.options["control"] == "random" and rr.heads["ctrl_cos2_median"].between(0, 1).all()
    # Seeded: same numbers twice.
    rr2 = activation_returns(b, toks, heads=[(1, 2), (0, 4)], control="random", progress=False)
    np.testing.assert_array_equal(rr.heads["ctrl_cos2_median"], rr2.heads["ctrl_cos2_median"])
    assert rr.options["nulls"] is None  # the draw count applies to the scramble control only


@pytest.mark.bridge
def test_heads_are_indexed_like_the_report(tmp_path):
    """One index convention for per-head tables: TransformerLens labels "L1H2", as in rep.heads."""
    import tl_idempotence as tli

    model = bridge_from_dir(tiny_hf_dir(tmp_path / "tq", arch="llama"))
    rep = tli.idempotence_report(model, progress=False)
    res = activation_returns(model, _tokens(n=2, pos=10), heads=[(1, 2), (0, 4), (1, 0)], nulls=2, progress=False)
    assert list(res.heads.index) == ["L0H4", "L1H0", "L1H2"]
    assert res.heads.index.name == rep.heads.index.name == "label" and res.heads.index.dtype == rep.heads.index.dtype
    joined = rep.heads[["alpha", "P"]].join(res.heads[["a_median", "P"]], how="inner", rsuffix="_act")
    assert list(joined.index) == ["L0H4", "L1H0", "L1H2"]
    np.testing.assert_array_equal(joined["P"], joined["P_act"])  # the same head on both sides of the join
    every = activation_returns(model, _tokens(n=2, pos=10), nulls=2, progress=False)
    assert list(every.heads.index) == list(rep.heads.index)


@pytest.mark.bridge
def test_n_control_draws_is_a_deprecated_alias_of_nulls(tmp_path):
    model = bridge_from_dir(tiny_hf_dir(tmp_path / "tq", arch="llama", n_layers=1))
    toks = _tokens(n=2, pos=10)
    new = activation_returns(model, toks, heads=[(0, 1), (0, 3)], nulls=3, progress=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        line = inspect.currentframe().f_lineno + 1
        old = activation_returns(model, toks, heads=[(0, 1), (0, 3)], n_control_draws=3, progress=False)
    (w,) = [w for w in caught if issubclass(w.category, DeprecationWarning) and "n_control_draws" in str(w.message)]
    assert "activation_returns(n_control_draws=...) is deprecated; use nulls=" in str(w.message)
    # attributed to the caller's line (here), not to the library's strict_kwargs wrapper (core/kwargs.py)
    assert (w.filename, w.lineno) == (__file__, line)
    assert old.options["nulls"] == new.options["nulls"] == 3
    np.testing.assert_array_equal(old.heads["ctrl_cos2_median"], new.heads["ctrl_cos2_median"])


@pytest.mark.bridge
def test_max_tokens_is_a_lower_bound_in_whole_windows_and_n_tokens_says_what_was_used(tmp_path):
    """What max_tokens bounds and what n_tokens counts, for both probes on one call each (the README's
    "634 target tokens ... max_tokens=512"): windows are taken whole until they hold >= max_tokens counted
    tokens; activation_returns' n_tokens is those counted tokens, ablation's the targets (counted positions
    after each window's first), and options record the max_tokens asked for."""
    from tl_idempotence.probes.ablation import ablation

    model = bridge_from_dir(tiny_hf_dir(tmp_path / "tq", arch="llama", n_layers=1))
    text = " ".join(["w4 w5 w6 w7 w8 w9"] * 9)  # 54 single-token words, no separator among them
    # seq_len 10 = BOS + 9 counted tokens per window: 9, 18, 27 < 30 <= 36 -> 4 windows, 36 counted tokens
    ret = activation_returns(model, [text], seq_len=10, max_tokens=30, heads=[(0, 1)], nulls=2, progress=False)
    assert (ret.summary["n_windows"], ret.summary["n_tokens"], ret.options["max_tokens"]) == (4, 36, 30)
    assert int(ret.heads["n_tokens"].iloc[0]) == 36
    abl = ablation(model, [(0, 1)], [text], seq_len=10, max_tokens=30, n_controls=0, progress=False)
    assert (abl.summary["n_windows"], abl.summary["n_tokens"], abl.options["max_tokens"]) == (4, 36, 30)
    assert abl.window_losses["n_tokens"].tolist() == [9, 9, 9, 9]
    # exactly a window's worth: no fifth window; one more token: the fifth, whole
    assert (
        activation_returns(model, [text], seq_len=10, max_tokens=36, heads=[(0, 1)], progress=False).summary["n_tokens"]
        == 36
    )
    assert (
        activation_returns(model, [text], seq_len=10, max_tokens=37, heads=[(0, 1)], progress=False).summary["n_tokens"]
        == 45
    )
    # token ids: whole rows; every position counts (no special id) but a row's first is no ablation target
    toks = _tokens(n=4, pos=10)
    toks[:, 0] = 5  # no BOS: 10 counted positions per row, 9 of them targets
    assert activation_returns(model, toks, max_tokens=15, heads=[(0, 1)], progress=False).summary["n_tokens"] == 20
    abl_ids = ablation(model, [(0, 1)], toks, max_tokens=15, n_controls=0, progress=False)
    assert (abl_ids.summary["n_windows"], abl_ids.summary["n_tokens"]) == (2, 18)
