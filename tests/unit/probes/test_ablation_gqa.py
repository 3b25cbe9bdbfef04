"""tli.ablation on a GQA model: each query head is ablated as itself and reported with its own kv head.

The tiny Llama of the ablation tests (9 query heads on 3 kv heads, head L1H4's W_O zeroed) with three heads of
two kv groups ablated alone: the ``kv_head`` column is ``head // 3`` head by head (not the query head, not an
MHA map), and each head's loss is the loss of one forward pass with that head's ``z`` zeroed (the unbatched
reference): L1H4 (no output) changes nothing exactly, its kv-group neighbour L1H5 does. A hook that ablated
another head of the set's kv group, or the next head, would move both.
"""

from __future__ import annotations

import pytest

from helpers import ABLATION_TOKENS, ABLATION_ZERO_HEAD, ablation_tiny_dir, reference_losses
from tl_idempotence.probes.ablation import ablation
from tl_idempotence.probes.tokens import prepare_tokens

pytestmark = pytest.mark.bridge

HEADS = [ABLATION_ZERO_HEAD, (1, 5), (0, 7)]  # L1H4 (W_O = 0) and L1H5 read kv head 1; L0H7 reads kv head 2


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return ablation_tiny_dir(tmp_path_factory.mktemp("abl-gqa"))


def test_each_head_is_ablated_as_itself_with_its_own_kv_head(bridge):
    ab = ablation(bridge, HEADS, ABLATION_TOKENS, kind="zero", n_controls=0, singles=True, seq_len=24, progress=False)
    h = ab.heads
    assert [h.loc[f"L{a}H{b}", "kv_head"] for a, b in HEADS] == [1, 1, 2]
    toks, counted = prepare_tokens(bridge, ABLATION_TOKENS, seq_len=24, max_tokens=4096)
    clean, *singles = reference_losses(bridge, toks, counted, [{}, *[{a: [b]} for a, b in HEADS]], "zero")
    assert ab.summary["loss_clean"] == pytest.approx(clean, rel=1e-9)
    for (a, b), want in zip(HEADS, singles, strict=True):
        assert h.loc[f"L{a}H{b}", "loss_ablated"] == pytest.approx(want, rel=1e-6), (a, b)
    assert h.loc["L1H4", "delta_loss"] == pytest.approx(0.0, abs=1e-6)  # no output: nothing changes
    assert abs(h.loc["L1H5", "delta_loss"]) > 1e-4 and abs(h.loc["L0H7", "delta_loss"]) > 1e-4
