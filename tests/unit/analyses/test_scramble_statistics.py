"""Statistical properties of the orientation scramble's draws, tested directly.

Each test is deterministic (fixed seeds); the thresholds are those of a test whose false-alarm rate is
stated (``ALPHA``): with a correct sampler, a fresh seed would fail such a check with probability ALPHA.
The references are written from the definitions (Haar measure on O(r), the module docstring's draw design),
never through the package's own helpers.
"""

from __future__ import annotations

import numpy as np
import scipy.stats
import torch

import tl_idempotence as tli
from tl_idempotence.core.heads import LayerHeads
from tl_idempotence.core.random import haar_orthogonal, layer_generator

F64 = torch.float64
ALPHA = 1e-3  # the false-alarm rate of every statistical check in this file
Z = scipy.stats.norm.isf(ALPHA / 2)  # two-sided normal quantile at ALPHA (3.29)


def test_haar_draws_on_O3_have_the_haar_marginals():
    """Under Haar measure on O(3): an entry is Uniform(-1, 1) (Archimedes: a coordinate of a uniform point of
    S²), det = ±1 with probability 1/2 each, tr Q has mean 0 and E[tr(Q)²] = 1, and the distribution is
    invariant under a fixed rotation (Q and Q R₀ have the same law)."""
    n = 6000
    Q = haar_orthogonal(n, 3, layer_generator(11, 0)).numpy()
    for i, j in ((0, 0), (1, 2), (2, 1)):
        assert scipy.stats.kstest(Q[:, i, j], scipy.stats.uniform(loc=-1, scale=2).cdf).pvalue > ALPHA, (i, j)
    n_pos = int((np.linalg.det(Q) > 0).sum())
    assert scipy.stats.binomtest(n_pos, n, 0.5).pvalue > ALPHA, n_pos
    tr = np.trace(Q, axis1=1, axis2=2)
    assert abs(tr.mean()) < Z * tr.std() / np.sqrt(n)  # E[tr Q] = 0
    sq = tr**2
    assert abs(sq.mean() - 1.0) < Z * sq.std() / np.sqrt(n)  # E[tr(Q)^2] = 1 on O(r), r >= 2
    R0 = scipy.stats.special_ortho_group.rvs(3, random_state=np.random.default_rng(5))
    QR = Q @ R0
    assert scipy.stats.ks_2samp(np.trace(QR, axis1=1, axis2=2), tr).pvalue > ALPHA


def _heads(O_list, V_list) -> LayerHeads:
    O, V = torch.stack(O_list), torch.stack(V_list)
    return LayerHeads(0, O, V, torch.arange(len(O_list)))


def test_one_heads_draws_are_iid_and_identical_heads_draw_differently():
    """Two heads with the same O and V (so the same null law) in one layer: their draws are not the same
    sequence (the per-head re-pairing σ_h exists), follow the same law (two-sample KS), and within a head
    successive draws are uncorrelated (lag-1 Spearman). Draws of different heads re-pair the same pools (the
    module's documented design), so they are not exactly independent: their j-th draws correlate weakly
    (Spearman ρ ≈ 0.08 at n = 4000 here); the check bounds that coupling at 0.2."""
    g = torch.Generator().manual_seed(0)
    d, r, n = 32, 4, 4000
    O1, V1 = torch.randn(d, r, generator=g, dtype=F64), torch.randn(d, r, generator=g, dtype=F64)
    O3, V3 = torch.randn(d, r, generator=g, dtype=F64), torch.randn(d, r, generator=g, dtype=F64)
    sc = tli.orientation_scramble(_heads([O1, O1, O3], [V1, V1, V3]), nulls=n, seed=0, return_K=False)
    P = sc.P_draws.numpy()
    assert not np.array_equal(P[0], P[1])
    assert scipy.stats.ks_2samp(P[0], P[1]).pvalue > ALPHA
    for h in range(3):
        rho = scipy.stats.spearmanr(P[h, :-1], P[h, 1:]).statistic
        assert abs(rho) < Z / np.sqrt(n - 1), (h, rho)
    assert abs(scipy.stats.spearmanr(P[0], P[1]).statistic) < 0.2
    # the same head alone in its layer draws the same law (only its pairing differs)
    alone = tli.orientation_scramble(_heads([O1], [V1]), nulls=n, seed=7, return_K=False).P_draws.numpy()[0]
    assert scipy.stats.ks_2samp(P[0], alone).pvalue > ALPHA


def test_scramble_p_value_floor_and_ties_as_documented():
    """p = (1 + #{P~ >= P}) / (n + 1): an exactly closed head (P = 1) beats every draw, so p is the floor
    1/(n+1); another head's p is that count over its own draws."""
    g = torch.Generator().manual_seed(2)
    d, r, n = 24, 3, 19
    A = torch.randn(d, r, generator=g, dtype=F64)
    B = torch.randn(r, d, generator=g, dtype=F64)
    O_closed, V_closed = A @ torch.linalg.inv(B @ A), B.T.contiguous()  # T = A (BA)^-1 B: P = 1
    O2, V2 = torch.randn(d, r, generator=g, dtype=F64), torch.randn(d, r, generator=g, dtype=F64)
    sc = tli.orientation_scramble(_heads([O_closed, O2], [V_closed, V2]), nulls=n, seed=0, return_K=False)
    assert float(sc.P[0]) == 1.0 or abs(float(sc.P[0]) - 1.0) < 1e-12
    heads = sc.heads
    assert heads["p_value"].iloc[0] == 1 / (n + 1)
    P_draws = sc.P_draws.numpy()[1]
    expected = (1 + int((P_draws >= float(sc.P[1])).sum())) / (n + 1)
    assert heads["p_value"].iloc[1] == expected
