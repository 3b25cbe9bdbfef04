"""The ablation's statistics against references written here from their definitions (the mutation
target ``ablation_stats`` runs these): the moving-block bootstrap re-done draw by draw with explicit loops, the
percentile interval as linear interpolation between order statistics, the rank p-value counted by hand, every refusal's
words.

The bootstrap's random numbers are the documented stream (``layer_generator(seed, None, "ablation", 1)``: first
the block starts, ``[BOOTSTRAP_DRAWS, ceil(n_windows / ℓ)]`` integers in ``[0, n_windows − ℓ]``, then the control
picks, ``[BOOTSTRAP_DRAWS, n_controls]`` in ``[0, n_controls)``): pinning it keeps a saved report's intervals
reproducible across versions. Everything computed from those numbers is written here without the module.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from tl_idempotence.core.random import layer_generator
from tl_idempotence.errors import OptionError
from tl_idempotence.probes.ablation import BOOTSTRAP_DRAWS, bootstrap_intervals, percentile_interval, rank_p_value


def quantile_by_hand(x: np.ndarray, q: float) -> float:
    """numpy's default ("linear") quantile from its definition: position (n − 1) q between order statistics."""
    s = sorted(float(v) for v in x)
    pos = (len(s) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (pos - lo) * (s[hi] - s[lo])


def bootstrap_by_hand(clean, flagged, controls, n_tok, seed, ell, level=0.95):
    """The moving-block bootstrap of the module docstring, one draw at a time."""
    n_w = len(clean)
    gen = layer_generator(seed, None, "ablation", 1)
    n_blocks = -(-n_w // ell)
    starts = torch.randint(0, n_w - ell + 1, (BOOTSTRAP_DRAWS, n_blocks), generator=gen).tolist()
    picks = (
        torch.randint(0, len(controls), (BOOTSTRAP_DRAWS, len(controls)), generator=gen).tolist()
        if len(controls)
        else None
    )
    d_flag, excess = [], []
    for b in range(BOOTSTRAP_DRAWS):
        idx = [s + j for s in starts[b] for j in range(ell)][:n_w]
        tokens = sum(float(n_tok[i]) for i in idx)
        d = sum(float(flagged[i] - clean[i]) for i in idx) / tokens
        d_flag.append(d)
        if picks is not None:
            per_control = [sum(float(c[i] - clean[i]) for i in idx) / tokens for c in controls]
            excess.append(d - float(np.median([per_control[k] for k in picks[b]])))
    lo, hi = (1 - level) / 2, (1 + level) / 2
    out = {"delta_loss_ci_low": quantile_by_hand(d_flag, lo), "delta_loss_ci_high": quantile_by_hand(d_flag, hi)}
    if picks is None:
        return out | {"excess_ci_low": math.nan, "excess_ci_high": math.nan}
    return out | {"excess_ci_low": quantile_by_hand(excess, lo), "excess_ci_high": quantile_by_hand(excess, hi)}


@pytest.mark.parametrize(
    ("n_w", "ell", "n_controls", "seed", "level"),
    [
        (7, 2, 3, 0, 0.95),  # 7^(1/3) = 1.91 -> blocks of 2; 4 blocks cut to 7 windows
        (30, 3, 4, 5, 0.95),  # 30^(1/3) = 3.11 -> 3
        (2, 1, 2, 1, 0.8),  # 2^(1/3) = 1.26 -> 1; another level
        (9, 2, 0, 3, 0.95),  # 9^(1/3) = 2.08 -> 2; no controls: the excess is NaN
    ],
)
def test_bootstrap_equals_the_definition(n_w, ell, n_controls, seed, level):
    rng = np.random.default_rng(n_w)
    n_tok = rng.integers(1, 40, n_w)
    clean = rng.uniform(2.0, 4.0, n_w) * n_tok
    flagged = clean + rng.normal(0.3, 0.5, n_w) * n_tok
    controls = clean[None, :] + rng.normal(0.1, 0.3, (n_controls, n_w)) * n_tok[None, :]
    got, got_ell = bootstrap_intervals(clean, flagged, controls, n_tok, seed=seed, level=level)
    want = bootstrap_by_hand(clean, flagged, controls, n_tok, seed, ell, level)
    assert got_ell == ell
    assert list(got) == ["delta_loss_ci_low", "delta_loss_ci_high", "excess_ci_low", "excess_ci_high"]
    for k, v in want.items():
        if math.isnan(v):
            assert math.isnan(got[k]), k
        else:
            assert got[k] == pytest.approx(v, rel=1e-12, abs=1e-14), k
    assert got["delta_loss_ci_low"] <= got["delta_loss_ci_high"]


def test_the_last_window_can_start_a_block():
    """Block starts run over 0 .. n − ℓ inclusive: with 2 windows of one token (ℓ = 1) and Δ = 0, 1 a draw's Δ is
    0, 0.5 or 1 with probabilities 1/4, 1/2, 1/4, so its 5 % and 95 % quantiles are 0 and 1; starts that stopped
    short of the last window would give (0, 0)."""
    ci, ell = bootstrap_intervals(np.zeros(2), np.array([0.0, 1.0]), np.zeros((0, 2)), np.ones(2), seed=0, level=0.9)
    assert ell == 1 and (ci["delta_loss_ci_low"], ci["delta_loss_ci_high"]) == (0.0, 1.0)


@pytest.mark.parametrize("draws", [np.arange(41.0), np.array([3.0, -1.0, 7.5, 2.25, 0.0, 11.0, 4.0])])
@pytest.mark.parametrize("level", [0.95, 0.5, 0.8, 0.999])
def test_percentile_interval_is_linear_interpolation(draws, level):
    lo, hi = percentile_interval(draws, level)
    assert lo == pytest.approx(quantile_by_hand(draws, (1 - level) / 2), rel=1e-12, abs=1e-12)
    assert hi == pytest.approx(quantile_by_hand(draws, (1 + level) / 2), rel=1e-12, abs=1e-12)
    assert type(lo) is float and type(hi) is float


def test_percentile_interval_refuses_levels_outside_0_1():
    for bad in (0, 1, 0.0, 1.0, -0.5, 2):
        with pytest.raises(OptionError) as e:
            percentile_interval(np.arange(3.0), level=bad)
        assert str(e.value) == f"level must lie in (0, 1); got {bad!r}."
    assert percentile_interval([1, 2, 3], level=0.5) == (1.5, 2.5)  # a list of ints: float ends
    f32 = np.array([0.1, 0.7, 0.3], dtype=np.float32)  # float32 draws: the quantiles are taken in float64
    lo, hi = percentile_interval(f32, level=0.5)
    assert lo == quantile_by_hand(f32.astype(np.float64), 0.25) and hi == quantile_by_hand(f32.astype(np.float64), 0.75)
    with pytest.raises(OptionError, match=r"^level must lie in \(0, 1\); got 1\.0\.$"):
        bootstrap_intervals(np.zeros(3), np.ones(3), np.zeros((0, 3)), np.ones(3), seed=0, level=1.0)


def test_rank_p_value_counts_by_hand():
    controls = np.array([0.5, -1.0, 0.2, 0.2, 3.0, 0.19999, 0.21])
    for delta, at_least in [(0.2, 5), (0.21, 3), (3.0, 1), (3.5, 0), (-2.0, 7)]:
        p, floor, n = rank_p_value(delta, controls)
        assert n == at_least == sum(c >= delta for c in controls)
        assert p == (1 + at_least) / 8 and floor == 1 / 8
    p, floor, n = rank_p_value(0.0, [1.0])  # a list works like an array
    assert (p, floor, n) == (1.0, 0.5, 1)
    p, floor, n = rank_p_value(0.0, np.zeros((0,)))
    assert math.isnan(p) and math.isnan(floor) and n == 0
