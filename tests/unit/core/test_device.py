"""The device path: ``device=`` on the report and every analysis.

On a CPU-only machine: ``"cpu"``, ``torch.device("cpu")`` and ``"auto"`` give the same numbers
bit for bit, the options carry the device, every result is CPU float64, and the device reaches
the functions that run the products (spied, not faked); ``"cuda"`` / ``"cuda:0"`` raise
``DeviceError``. Where CUDA is present, the CUDA results are compared with the CPU results to
float64 rounding instead.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

import tl_idempotence as tli
import tl_idempotence.analyses.base as base_mod
import tl_idempotence.analyses.mismatch as mismatch_mod
import tl_idempotence.analyses.scramble as scramble_mod
import tl_idempotence.analyses.search as search_mod
import tl_idempotence.maths.closure as closure_mod
from helpers import SyntheticSource, gaussian_layer
from tl_idempotence.analyses.report_options import ReportOptions
from tl_idempotence.errors import DeviceError

CUDA = torch.cuda.is_available()
CPU_SPELLINGS = ["cpu", torch.device("cpu"), "auto"] if not CUDA else ["cpu", torch.device("cpu")]


@pytest.fixture(scope="module")
def source():
    return SyntheticSource([gaussian_layer(l, 6, 2, 24, 4, seed=20 + l) for l in range(2)])


@pytest.fixture(scope="module")
def lh(source):
    return source.layer_heads(1)


def run_all(source, lh, device):
    """Every analysis on ``device``; returns named tables / tensors."""
    rep = tli.idempotence_report(source, nulls=6, search=True, algebra=True, device=device, progress=False)
    out = {
        "report.heads": rep.heads,
        "report.layers": rep.layers.drop(columns=["note"]),
        "report.scramble_draws": rep.tables["scramble_draws"],
        "report.mismatch_pairs": rep.tables["mismatch_pairs"],
        "report.algebra_pairs": rep.tables["algebra_pairs"],
    }
    c = tli.closure(lh, device=device)
    out["closure"] = pd.DataFrame({"P": c.P.numpy(), "alpha": c.alpha.numpy(), "norm": c.norm.numpy()})
    s = tli.orientation_scramble(lh, nulls=5, device=device)
    out["scramble"] = pd.DataFrame(s.P_draws.numpy())
    out["scramble.K"] = pd.DataFrame(s.K_draws.reshape(-1, 16).numpy())
    r = tli.constructive_search(lh, heads=[0, 3], max_iters=20, device=device)
    out["search"] = r.table
    out["search.K"] = pd.DataFrame(r.K.reshape(-1, 16).numpy())
    out["mismatch"] = tli.mismatch(source, device=device).pairs
    out["algebra"] = tli.shared_value_algebra(source, device=device, progress=False).pairs
    return rep, out


@pytest.fixture(scope="module")
def on_cpu(source, lh):
    return run_all(source, lh, "cpu")[1]


@pytest.mark.parametrize("device", CPU_SPELLINGS[1:], ids=str)
def test_cpu_spellings_give_the_same_numbers_bit_for_bit(source, lh, on_cpu, device):
    ref = on_cpu
    _, got = run_all(source, lh, device)
    for name in ref:
        pd.testing.assert_frame_equal(got[name], ref[name], check_exact=True, obj=name)


def test_results_are_cpu_float64_and_the_options_carry_the_device(source, lh):
    rep, out = run_all(source, lh, "auto")
    want = torch.device("cuda" if CUDA else "cpu")
    assert rep.options.device == want and rep.summary["options"]["device"] == want.type
    assert ReportOptions(device="auto").key()["device"] == want.type
    for name, df in out.items():
        for col in df.columns:
            if df[col].dtype.kind == "f":
                assert df[col].dtype == np.float64, (name, col)
    c = tli.closure(lh, device="auto")
    for t in (c.P, c.alpha, c.norm, c.norm_T2, c.K, c.D):
        assert t.device.type == "cpu" and t.dtype == torch.float64
    assert c.eigenvalues.device.type == "cpu" and c.eigenvalues.dtype == torch.complex128
    s = tli.orientation_scramble(lh, nulls=3, device="auto")
    for t in (s.P, s.P_draws, s.S, s.D, s.K_draws):
        assert t.device.type == "cpu" and t.dtype == torch.float64
    r = tli.constructive_search(lh, heads=[1], max_iters=5, device="auto")
    assert r.K.device.type == "cpu" and r.K.dtype == torch.float64


def test_the_device_reaches_the_products(monkeypatch, source, lh):
    """Spy the functions that run the products and the batches: each gets the validated device."""
    seen: dict[str, list] = {}

    def spy(mod, name, key="device"):
        real = getattr(mod, name)

        def wrapped(*a, **kw):
            seen.setdefault(name, []).append(kw.get(key, a[-1] if a else None))
            return real(*a, **kw)

        monkeypatch.setattr(mod, name, wrapped)

    spy(base_mod, "layer_grams")
    spy(closure_mod, "layer_grams")
    spy(closure_mod, "grams")
    spy(scramble_mod, "scramble_draws")
    spy(search_mod, "search_factors")
    spy(mismatch_mod, "mismatch_pairs")
    dev = torch.device("cuda" if CUDA else "cpu")
    tli.idempotence_report(source, nulls=4, search=True, device="auto", progress=False)
    assert seen["layer_grams"] == [dev, dev]  # LayerContext.build, one per layer
    assert seen["scramble_draws"] == [dev, dev]
    assert seen["search_factors"] == [dev, dev]
    assert seen["mismatch_pairs"] == [dev, dev]
    seen.clear()
    tli.closure(lh, device="auto")
    W_V, W_O = lh.V[lh.kv_head_of], lh.O.transpose(-1, -2)
    tli.closure((W_V, W_O), device="auto")
    tli.orientation_scramble(lh, nulls=2, device="auto")
    tli.constructive_search(lh, heads=[0], max_iters=2, device="auto")
    tli.mismatch(source, device="auto")
    # closure(lh), scramble's and search's closure, then mismatch's layer contexts (the one layer loop), one per layer
    assert seen["layer_grams"] == [dev] * 5
    assert seen["grams"] == [dev]
    assert seen["scramble_draws"] == [dev] and seen["search_factors"] == [dev]
    assert seen["mismatch_pairs"] == [dev, dev]


@pytest.mark.skipif(CUDA, reason="this machine has CUDA: see test_cuda_matches_cpu")
@pytest.mark.parametrize("device", ["cuda", "cuda:0", torch.device("cuda")], ids=str)
def test_cuda_without_cuda_is_a_device_error(source, lh, device):
    calls = [
        lambda: tli.idempotence_report(source, device=device, progress=False),
        lambda: tli.closure(lh, device=device),
        lambda: tli.orientation_scramble(lh, device=device),
        lambda: tli.constructive_search(lh, device=device),
        lambda: tli.mismatch(source, device=device),
        lambda: tli.shared_value_algebra(source, device=device, progress=False),
        lambda: tli.trajectory([("a", source)], device=device, progress=False),
    ]
    for call in calls:
        with pytest.raises(DeviceError) as ei:
            call()
        assert type(ei.value) is DeviceError
        assert "CUDA is not available" in str(ei.value) and "device='cpu'" in str(ei.value)


@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_cuda_matches_cpu(source, lh, on_cpu):  # pragma: no cover - CPU-only CI
    ref = on_cpu
    _, got = run_all(source, lh, "cuda")
    for name in ("report.heads", "closure", "scramble", "mismatch", "algebra"):
        a, b = got[name], ref[name]
        for col in b.columns:
            if b[col].dtype.kind == "f":
                np.testing.assert_allclose(
                    a[col].to_numpy(), b[col].to_numpy(), rtol=1e-9, atol=1e-10, err_msg=f"{name}.{col}"
                )


def test_a_report_made_on_a_gpu_loads_here():
    """The device is recorded, not re-checked, when a saved record is read on a CPU-only machine."""
    o = ReportOptions.from_record({**ReportOptions().as_dict(), "device": "cuda"})
    assert o.device == torch.device("cuda") and o.key()["device"] == "cuda"
