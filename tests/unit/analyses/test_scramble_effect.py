"""The scramble effect size (docs/definitions.md, "Scramble effect"): ``log10(P / median of the head's scramble
draws)``, checked against a dense hand computation of the draws with the same seed, its NaN reasons, and that it
ranks heads the scramble p cannot tell apart (the p floor ``1/(n + 1)``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tl_idempotence as tli
from helpers import SyntheticSource, closed_head_for, dense_closure, dense_closure_T, principal_bases
from tl_idempotence.analyses.scramble import EFFECT_ZERO_NULL, EFFECT_ZERO_P, scramble_effect
from tl_idempotence.core.heads import LayerHeads
from tl_idempotence.core.random import haar_orthogonal, layer_generator

F64 = torch.float64


def _two_heads(layer: int = 0, d: int = 24, r: int = 4) -> LayerHeads:
    """Head 0 closed (an oblique projection, P = 1), head 1 Gaussian; MHA (each head its own V)."""
    g = torch.Generator().manual_seed(11)
    V = torch.randn(2, d, r, generator=g, dtype=F64)
    O = torch.randn(2, d, r, generator=g, dtype=F64)
    O[0] = closed_head_for(V[0], torch.linspace(0.95, 0.6, r, dtype=F64), g)
    return LayerHeads(layer, O, V, torch.tensor([0, 1]))


def _dense_null_draws(O: torch.Tensor, V: torch.Tensor, n: int, seed: int, layer: int) -> np.ndarray:
    """Every head's n scrambled P, by hand: the draw design of analyses/scramble.py (one pool of n Haar matrices per
    side from ``layer_generator(seed, layer, "scramble", r, r)``, head h pairs ``pool_O[j]`` with
    ``pool_V[perm_h[j]]``), each draw's ``T~ = Q_O R1 diag(S) R2ᵀ Q_Vᵀ`` materialized (d x d) and its P dense."""
    n_heads, _, r = O.shape
    gen = layer_generator(seed, layer, "scramble", r, r)
    pool_O = haar_orthogonal(n, r, gen)
    pool_V = haar_orthogonal(n, r, gen)
    perm = torch.rand(n_heads, n, generator=gen, dtype=F64).argsort(-1)
    out = np.zeros((n_heads, n))
    for h in range(n_heads):
        T = O[h] @ V[h].T
        S = torch.linalg.svdvals(T)[:r]
        Q_O, Q_V, _ = principal_bases(O[h], V[h])
        for j in range(n):
            K = (pool_O[j] * S) @ pool_V[perm[h, j]].T
            out[h, j] = float(dense_closure_T(Q_O @ K @ Q_V.T))
    return out


def test_scramble_effect_equals_a_dense_hand_computation_on_two_heads():
    lh = _two_heads()
    n, seed = 33, 5
    rep = tli.idempotence_report(SyntheticSource([lh]), nulls=n, seed=seed, progress=False)
    draws = _dense_null_draws(lh.O, lh.V, n, seed, lh.layer)
    P = dense_closure(lh.O, lh.V)["P"].numpy()
    want = np.log10(P / np.median(draws, axis=1))
    got = rep.heads["scramble_effect"].to_numpy()
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=0)
    # the closed head sits decades above its null, the Gaussian head near it; both are finite and distinct
    assert got[0] > 1.0 and abs(got[1]) < 1.0
    assert list(rep.heads["scramble_reason"]) == ["", ""]
    # the public function's per-head table gives the same column
    sc = tli.orientation_scramble(lh, nulls=n, seed=seed, return_K=False)
    np.testing.assert_allclose(sc.heads["scramble_effect"].to_numpy(), want, rtol=1e-9, atol=0)


def test_scramble_effect_ranks_heads_at_the_p_floor():
    """Closed heads with different cosines all beat every draw (p = 1/(n + 1), the same q), yet their effects differ."""
    g = torch.Generator().manual_seed(3)
    d, r, nh = 32, 4, 4
    V = torch.randn(nh, d, r, generator=g, dtype=F64)
    O = torch.stack([closed_head_for(V[h], torch.linspace(0.99 - 0.2 * h, 0.3, r, dtype=F64), g) for h in range(nh)])
    rep = tli.idempotence_report(SyntheticSource([LayerHeads(0, O, V, torch.arange(nh))]), nulls=16, progress=False)
    h = rep.heads
    assert (h["p_value"] == 1 / 17).all() and h["q_value"].nunique() == 1
    assert h["scramble_effect"].nunique() == nh and (h["scramble_effect"] > 0).all()


def test_scramble_effect_targets_a_property_of_the_head_not_of_the_number_of_draws():
    """The p floor moves with n (1/66 vs 1/8194); the effect does not: its mean over 40 seeds at n = 65 is the value
    at n = 8193 (seeded; measured: 1.355 vs 1.374 and -0.078 vs -0.086, standard errors 0.02)."""
    lh = _two_heads()
    few = np.array(
        [tli.orientation_scramble(lh, nulls=65, seed=s, return_K=False).heads["scramble_effect"] for s in range(40)]
    )
    many = tli.orientation_scramble(lh, nulls=8193, seed=1000, return_K=False).heads
    np.testing.assert_allclose(few.mean(0), many["scramble_effect"], atol=0.06, rtol=0)
    assert many["p_value"][0] == 1 / 8194  # the closed head beats every draw at both n: p is the floor, 1/(n + 1)
    assert tli.orientation_scramble(lh, nulls=65, seed=0, return_K=False).p_value[0] == 1 / 66


def test_scramble_effect_nan_reasons_and_no_epsilon():
    eff, why = scramble_effect([0.5, 0.0, 0.3, np.nan, 0.2, 0.0], [0.005, 0.1, 0.0, 0.2, np.nan, 0.0])
    assert eff[0] == pytest.approx(2.0, rel=1e-15) and np.isnan(eff[1:]).all()
    assert list(why) == ["", EFFECT_ZERO_P, EFFECT_ZERO_NULL, "", "", EFFECT_ZERO_P]


def test_a_head_with_trained_P_zero_gets_a_nan_effect_with_its_reason():
    # T = e1 e2ᵀ + e2 e3ᵀ: T² = e1 e3ᵀ ≠ 0 but ⟨T², T⟩ = 0, so P = 0 (defined, not nilpotent); its scrambles are not 0
    d = 8
    e = torch.eye(d, dtype=F64)
    O = torch.stack(
        [torch.stack([e[0], e[1]], 1), torch.randn(d, 2, generator=torch.Generator().manual_seed(0), dtype=F64)]
    )
    V = torch.stack(
        [torch.stack([e[1], e[2]], 1), torch.randn(d, 2, generator=torch.Generator().manual_seed(1), dtype=F64)]
    )
    rep = tli.idempotence_report(SyntheticSource([LayerHeads(0, O, V, torch.arange(2))]), nulls=8, progress=False)
    h = rep.heads
    assert h["P"].iloc[0] == 0 and np.isfinite(h["p_value"].iloc[0]) and h["P_scrambled_median"].iloc[0] > 0
    assert np.isnan(h["scramble_effect"].iloc[0]) and h["scramble_reason"].iloc[0] == EFFECT_ZERO_P
    assert np.isfinite(h["scramble_effect"].iloc[1]) and h["scramble_reason"].iloc[1] == ""
