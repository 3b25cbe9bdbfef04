"""SmolLM2-135M's copying scores against TransformerLens's full OV circuit (slow); the roles' unit tests are
tests/unit/probes/test_roles.py.
"""

from __future__ import annotations

import pytest
import torch

import tl_idempotence as tli
from tl_idempotence.probes.roles import ATTENTION_ROLES

pytestmark = pytest.mark.bridge  # no HookedTransformer needed (its tests skip on 4.x): runs on both majors


@pytest.mark.slow
def test_smollm2_copying_equals_tl_full_ov_circuit(smollm2):
    """On SmolLM2-135M (the zoo's TransformerBridge, raw weights): ``copying`` equals, to 1e-6, Re Σλ / Σ|λ| of the
    eigenvalues of TransformerLens's ``model.W_E @ model.OV[l, h] @ model.W_U`` (a FactoredMatrix; checked on a
    spread of heads, each product d_vocab x d_head), and every attention score is a share of attention mass."""
    from transformer_lens import FactoredMatrix

    r = tli.head_roles(smollm2)
    t = r.table
    assert len(t) == 270 and t["reason"].eq("").all()
    for r_ in ATTENTION_ROLES:
        assert ((t[r_] >= 0) & (t[r_] <= 1)).all()
    n_kv = int(smollm2.cfg.n_key_value_heads)
    group = smollm2.cfg.n_heads // n_kv
    for layer, head in [(0, 0), (5, 4), (10, 8), (17, 3), (29, 8)]:
        OV = getattr(smollm2, "OV", None)
        if OV is not None:
            f = smollm2.W_E.double() @ FactoredMatrix(OV.A[layer, head].double(), OV.B[layer, head].double())
        else:  # the kv head's V, as model.OV expands it
            attn = smollm2.blocks[layer].attn
            W_V = attn.W_V[head // group] if attn.W_V.shape[0] == n_kv else attn.W_V[head]
            f = smollm2.W_E.double() @ FactoredMatrix(W_V.double(), attn.W_O[head].double())
        with torch.no_grad():
            lam = (f @ smollm2.W_U.double()).eigenvalues
        want = float(lam.real.sum() / lam.abs().sum())
        assert t.loc[f"L{layer}H{head}", "copying"] == pytest.approx(want, abs=1e-6)
