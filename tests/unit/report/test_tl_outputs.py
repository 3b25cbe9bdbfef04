"""TransformerLens-shaped outputs of a report: ``to_tensor``, ``hook_points``, the ``threshold`` setter, pickling.

Real values: SmolLM2-135M-Instruct's raw weights from the zoo's cached checkpoint files (13 heads with
P >= 0.9, L10H8 the highest at P = 0.953258); the hooks are run on the tiny random bridge model of
``tl_idempotence.testing``.
"""

from __future__ import annotations

import pickle

import pytest
import torch

import tl_idempotence as tli
from tl_idempotence.errors import OptionError

pytestmark = pytest.mark.bridge  # checkpoint files and TransformerBridge only


# --------------------------------------------------------------------------- to_tensor


# --------------------------------------------------------------------------- hook_points


def test_hook_points_zero_the_flagged_heads_in_run_with_hooks(tiny_llama):
    """The pairs drive TransformerLens hooks directly: zero the chosen heads' z and check the recorded z."""
    rep = tli.idempotence_report(tiny_llama, progress=False)
    top3 = rep.heads.sort_values("P", ascending=False, kind="stable").head(3)
    rep = rep.with_threshold(float(top3["P"].min()))  # the 3 highest-P heads of the random model are now "closed"
    pts = rep.hook_points()
    assert len(pts) == 3 and {(f"blocks.{a}.attn.hook_z", int(b)) for a, b in zip(top3["layer"], top3["head"])} == set(
        pts
    )
    toks = tiny_llama.to_tokens("w5 w6 w7 w8 w9 w4 w5 w6")
    seen: dict[str, torch.Tensor] = {}

    def zero_head(h):
        def hook(z, hook):
            z = z.clone()
            z[:, :, h, :] = 0.0
            return z

        return hook

    def record(name):
        def hook(z, hook):
            seen[name] = z.detach().clone()

        return hook

    names = ["blocks.0.attn.hook_z", "blocks.1.attn.hook_z"]  # the tiny model's two layers
    hooks = [(name, zero_head(h)) for name, h in pts] + [(name, record(name)) for name in names]
    logits = tiny_llama.run_with_hooks(toks, fwd_hooks=hooks)
    clean = tiny_llama(toks)
    for name in names:
        z = seen[name]  # [batch, pos, head, d_head]
        zeroed = {h for n, h in pts if n == name}
        for h in range(z.shape[2]):
            if h in zeroed:
                assert torch.count_nonzero(z[:, :, h]) == 0, (name, h)
            else:
                assert torch.count_nonzero(z[:, :, h]) > 0, (name, h)
    assert not torch.allclose(logits, clean)  # ablating them changes the output


def test_kv_hooks_get_kv_head_indices_deduplicated_with_the_query_heads_they_serve(tiny_llama):
    """hook_k/hook_v are [batch, pos, n_kv_heads, d_head] on GQA: a query head's index there would be wrong."""

    from tl_idempotence.report.hooks import HookPoint

    rep = tli.idempotence_report(tiny_llama, progress=False)  # 9 query heads on 3 kv heads
    sel = [(0, 0), (0, 2), (0, 4), (1, 8)]
    for hook in ("v", "k"):
        pts = rep.hook_points(heads=sel, hook=hook)
        assert pts == [
            (f"blocks.0.attn.hook_{hook}", 0),
            (f"blocks.0.attn.hook_{hook}", 1),
            (f"blocks.1.attn.hook_{hook}", 2),
        ]
        assert [p.query_heads for p in pts] == [(0, 2), (4,), (8,)]
        assert all(isinstance(p, HookPoint) and p.axis == 2 for p in pts)
    assert len(rep.hook_points(heads="all", hook="v")) == 2 * 3  # one per (layer, kv head)
    z = rep.hook_points(heads=sel, hook="z")
    assert [p.head for p in z] == [0, 2, 4, 8] and [p.query_heads for p in z] == [(0,), (2,), (4,), (8,)]
    assert [p.axis for p in rep.hook_points(heads=sel, hook="pattern")] == [1] * 4
    p = pts[0]
    back = pickle.loads(pickle.dumps(p))
    assert back == p and back.query_heads == p.query_heads and back.layer == p.layer
    name, index = p
    assert (name, index) == (p.name, p.head) == ("blocks.0.attn.hook_k", 0)


def test_result_hook_needs_use_attn_result(tiny_llama):
    rep = tli.idempotence_report(tiny_llama, progress=False)
    assert not tiny_llama.cfg.use_attn_result
    with pytest.raises(OptionError, match=r"model\.set_use_attn_result\(True\)"):
        rep.hook_points(hook="result")  # the report's own model (alive) is checked
    tiny_llama.set_use_attn_result(True)
    try:
        assert rep.hook_points(heads=[(1, 3)], hook="result") == [("blocks.1.attn.hook_result", 3)]
    finally:
        tiny_llama.set_use_attn_result(False)


# --------------------------------------------------------------------------- another threshold


# --------------------------------------------------------------------------- pickling
