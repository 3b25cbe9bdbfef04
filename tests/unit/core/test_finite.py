"""The NaN/inf check every layer passes (core.heads.all_finite, check_weights, LayerHeads.check_finite).

``all_finite`` reduces a tensor in its storage order (one ``aminmax``, no copy) whatever its layout;
it must agree with the elementwise ``torch.isfinite(x).all()`` on every layout a source or a user can
hand over: contiguous, permuted (a checkpoint's ``o_proj`` split into heads), sliced with gaps,
expanded (stride 0), size-0/size-1 dims, every weight dtype, with one bad element anywhere.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tl_idempotence.core.heads import LayerHeads, all_finite, kv_layout, read_layer
from tl_idempotence.errors import WeightError

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    shape=st.lists(st.integers(0, 5), min_size=1, max_size=4),
    dtype=st.sampled_from(DTYPES),
    bad=st.sampled_from([None, float("nan"), float("inf"), float("-inf")]),
    where=st.integers(0, 10_000),
    layout=st.sampled_from(["contiguous", "permuted", "stepped", "expanded", "transposed_last"]),
    seed=st.integers(0, 2**16),
)
def test_all_finite_equals_the_elementwise_check(shape, dtype, bad, where, layout, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g).to(dtype)
    if bad is not None and x.numel():
        x.view(-1)[where % x.numel()] = bad
    if layout == "permuted" and x.ndim > 1:
        x = x.permute(*torch.randperm(x.ndim, generator=g).tolist())
    elif layout == "stepped":
        x = x[..., ::2]
    elif layout == "expanded":
        x = x.unsqueeze(0).expand(3, *x.shape)
    elif layout == "transposed_last" and x.ndim > 1:
        x = x.transpose(-1, -2)
    assert all_finite(x) == bool(torch.isfinite(x).all())


def _layer(bad_head: int | None = None) -> LayerHeads:
    g = torch.Generator().manual_seed(0)
    O = torch.randn(6, 16, 4, generator=g)
    if bad_head is not None:
        O[bad_head, 3, 1] = float("nan")
    return LayerHeads(layer=2, O=O, V=torch.randn(2, 16, 4, generator=g), kv_head_of=kv_layout(6, 2))


def test_a_checked_layer_is_not_scanned_again_and_an_unchecked_one_is(monkeypatch):
    import tl_idempotence.core.heads as heads

    calls = []
    real = heads.check_weights
    monkeypatch.setattr(heads, "check_weights", lambda x, name, idx=None: calls.append(name) or real(x, name, idx))
    lh = _layer()
    lh.check_finite(o_name="Tensor 'o' (f.safetensors), layer 2,", v_name="Tensor 'v' (f.safetensors), layer 2,")
    assert calls == ["Tensor 'v' (f.safetensors), layer 2,", "Tensor 'o' (f.safetensors), layer 2,"]
    lh.check_finite()
    assert len(calls) == 2  # the same object: remembered
    _layer().check_finite()
    assert len(calls) == 4  # another object: scanned


class _Source:
    def __init__(self, lh: LayerHeads, check: bool) -> None:
        self.lh, self.check = lh, check

    def layer_heads(self, layer: int) -> LayerHeads:
        if self.check:
            self.lh.check_finite(o_name="Tensor 'o_proj' (shard-1), layer 2,")
        return self.lh


def test_a_source_that_checks_names_its_tensor_and_read_layer_catches_one_that_does_not():
    with pytest.raises(WeightError, match=r"Tensor 'o_proj' \(shard-1\), layer 2, contains NaN or inf at head 4"):
        read_layer(_Source(_layer(bad_head=4), check=True), 2)
    with pytest.raises(WeightError, match=r"W_O of layer 2 contains NaN or inf at head 4"):
        read_layer(_Source(_layer(bad_head=4), check=False), 2)


def test_a_failed_check_is_not_remembered():
    lh = _layer(bad_head=1)
    for _ in range(2):
        with pytest.raises(WeightError, match="head 1"):
            lh.check_finite()
