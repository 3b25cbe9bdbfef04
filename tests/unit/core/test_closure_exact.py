"""What ``layer_grams`` and ``closure_from_grams`` record beside α and P (the mutation target
``closure`` runs these): ``d_model`` and the input dtype of the Grams, the rank tolerance of SPEC 3
(``max(max(d_model, d_head) · eps(float32), 1e-7)``, written here from its definition) on a batch of any shape,
no principal factors unless asked, and the products on the device given (CUDA only).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

import tl_idempotence.maths.closure as closure_mod
from tl_idempotence.maths.closure import closure_from_grams, grams, layer_grams

EPS32 = 2.0**-23  # float32 machine epsilon


def _factors(*shape: int, seed: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(dtype)


def test_layer_grams_records_d_model_and_the_input_dtype():
    O = _factors(6, 40, 4, seed=0, dtype=torch.float32)  # 6 query heads, d_model 40, d_head 4
    V = _factors(3, 40, 4, seed=1, dtype=torch.float16)  # 3 kv heads
    kv = torch.tensor([0, 0, 1, 1, 2, 2], dtype=torch.int32)
    g = layer_grams(O, V, kv)
    assert g.d_model == 40
    assert g.input_dtype == torch.float32  # float32 with float16: float32
    assert g.kv_head_of.dtype == torch.int64 and g.kv_head_of.device.type == "cpu"
    assert g.kv_head_of.tolist() == [0, 0, 1, 1, 2, 2]
    assert layer_grams(O.double(), V, kv).input_dtype == torch.float64
    assert g.G_O.shape == g.G_V.shape == g.M.shape == (6, 4, 4)


def test_the_rank_tolerance_on_a_batch_of_any_shape():
    # batch (3, 50): a tolerance taken from a batch size instead of d_head would be 50 · eps, not 16 · eps
    O = _factors(3, 50, 16, 4, seed=2)
    V = _factors(3, 50, 16, 4, seed=3)
    c = closure_from_grams(grams(O, V))
    assert c.shape == (3, 50)
    assert c.rtol == max(16 * EPS32, 1e-7)
    # d_head larger than d_model: the larger one decides
    wide = closure_from_grams(grams(_factors(2, 4, 24, seed=4), _factors(2, 4, 24, seed=5)))
    assert wide.rtol == 24 * EPS32
    # tiny sizes (the floor 1e-7 is below 1 · eps(float32), so it never decides for float32 tolerances)
    assert closure_from_grams(grams(_factors(2, 3, 2, seed=6), _factors(2, 3, 2, seed=7))).rtol == 3 * EPS32


def test_no_principal_factors_unless_asked():
    g = grams(_factors(5, 12, 3, seed=8), _factors(5, 12, 3, seed=9))
    c = closure_from_grams(g)
    assert c.K is None and c.D is None and c.eigenvalues is None
    f = closure_from_grams(g, factors=True)
    assert f.K is not None and f.K.shape == (5, 3, 3) and f.D.shape == (5, 3) and f.eigenvalues.shape == (5, 3)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_layer_grams_runs_the_products_on_the_device_given(monkeypatch):  # pragma: no cover - CPU-only CI
    seen: dict[str, str] = {}
    real: Callable = closure_mod._safe_gram_products

    def spy(O, V, kv, *args):
        seen.update(O=O.device.type, V=V.device.type, kv=kv.device.type)
        return real(O, V, kv, *args)

    monkeypatch.setattr(closure_mod, "_safe_gram_products", spy)
    O, V = _factors(4, 32, 8, seed=10), _factors(2, 32, 8, seed=11)
    kv = torch.tensor([0, 0, 1, 1])
    g = layer_grams(O, V, kv, device="cuda")
    assert seen == {"O": "cuda", "V": "cuda", "kv": "cuda"}
    assert g.G_O.device.type == "cpu" and g.kv_head_of.device.type == "cpu"
    on_cpu = layer_grams(O, V, kv)
    torch.testing.assert_close(g.M, on_cpu.M, rtol=1e-12, atol=1e-12)
    g2 = layer_grams(O.cuda(), V.cuda(), kv.cuda())  # device None: where O is
    assert seen == {"O": "cuda", "V": "cuda", "kv": "cuda"} and g2.kv_head_of.device.type == "cpu"
