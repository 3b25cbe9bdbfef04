"""probes/effect_stability.py: bootstrap intervals of the attended-token effect and sign stability across texts
(SPEC 13), on positions frames built here.

* directions by hand (sign of n_pos - n_neg of effect - null; ties dropped; the median-effect rule);
* with one position per window the two-stage bootstrap is scipy's percentile bootstrap of the median over
  windows (``scipy.stats.bootstrap``; Monte Carlo agreement); constant values give degenerate intervals;
  window-level differences widen the interval beyond an iid bootstrap over positions; a head's numbers do not
  depend on the other heads in the frame; seeded;
* the agreement count and its interval against the per-replicate directions; sign stability by hand.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy.stats import bootstrap

from tl_idempotence.errors import OptionError, OptionTypeError
from tl_idempotence.probes.effect_stability import bootstrap_effects, directions, sign_stability


def positions(spec, seed=0, n_windows=8, per_window=(5, 20), window_sd=0.0):
    """A positions frame: for each head ``label -> mean of effect - null``, windows with their own offsets."""
    rng = np.random.default_rng(seed)
    rows = []
    sizes = rng.integers(*per_window, size=n_windows)
    offsets = rng.normal(0, window_sd, size=n_windows)
    for w in range(n_windows):
        for q in range(1, 1 + sizes[w]):
            for label, mu in spec.items():
                null = rng.normal()
                rows.append((label, w, q, mu + offsets[w] + null + rng.normal(), null))
    p = pd.DataFrame(rows, columns=["label", "window", "pos", "effect", "null_effect"])
    p["source_pos"], p["token"], p["null_source_pos"], p["raw_effect"] = 0, 5, 0, p["effect"]
    return p


def test_directions_by_hand():
    p = pd.DataFrame({
        "label": ["A"] * 5 + ["B"] * 4 + ["C"] * 2,
        "window": 0, "pos": range(11),
        "effect": [1, 2, -1, 3, 0.5, -1, -2, 1, 0, 1, 1],
        "null_effect": [0, 0, 0, 3, 0, 0, 0, 0, 0, 1, np.nan],  # A: +,+,-,tie,+ ; B: -,-,+,tie ; C: tie (NaN row out)
    })  # fmt: skip
    assert directions(p).to_dict() == {"A": 1, "B": -1, "C": 0}
    assert directions(p, "effect").to_dict() == {"A": 1, "B": -1, "C": 1}  # medians 1, -0.5, 1


def test_one_position_per_window_is_scipys_percentile_bootstrap_of_windows():
    p = positions({"A": 0.3}, n_windows=60, per_window=(1, 2))
    b = bootstrap_effects(p, n_boot=4000, seed=1)
    d = (p["effect"] - p["null_effect"]).to_numpy()
    ref = bootstrap((d,), np.median, n_resamples=4000, method="percentile", random_state=np.random.default_rng(2))
    row = b.heads.loc["A"]
    assert row["median_diff"] == np.median(d)
    spread = ref.confidence_interval.high - ref.confidence_interval.low
    assert row["median_diff_lo"] == pytest.approx(ref.confidence_interval.low, abs=0.15 * spread)
    assert row["median_diff_hi"] == pytest.approx(ref.confidence_interval.high, abs=0.15 * spread)


def test_window_effects_widen_the_interval_and_constants_do_not_move():
    p = positions({"A": 0.0}, n_windows=10, per_window=(30, 31), window_sd=2.0)
    b = bootstrap_effects(p, n_boot=500)
    d = (p["effect"] - p["null_effect"]).to_numpy()
    iid = bootstrap((d,), np.median, n_resamples=500, method="percentile", random_state=np.random.default_rng(0))
    width = b.heads.loc["A", "median_diff_hi"] - b.heads.loc["A", "median_diff_lo"]
    assert width > 2 * (iid.confidence_interval.high - iid.confidence_interval.low)  # texts are the unit
    c = p.assign(effect=1.5, null_effect=0.5)
    row = bootstrap_effects(c, n_boot=50).heads.loc["A"]
    assert row[["median_diff", "median_diff_lo", "median_diff_hi"]].tolist() == [1.0, 1.0, 1.0]
    assert row[["median_effect_lo", "median_effect_hi"]].tolist() == [1.5, 1.5]
    assert row["direction"] == 1 and row["direction_stability"] == 1.0


def test_seeded_and_independent_of_the_other_heads():
    p = positions({"A": 0.2, "B": -0.4, "C": 0.0})
    one = bootstrap_effects(p, n_boot=200, seed=3)
    pd.testing.assert_frame_equal(one.heads, bootstrap_effects(p, n_boot=200, seed=3).heads)
    alone = bootstrap_effects(p[p["label"] == "B"], n_boot=200, seed=3)
    pd.testing.assert_frame_equal(alone.heads, one.heads.loc[["B"]])
    assert not one.heads.equals(bootstrap_effects(p, n_boot=200, seed=4).heads)
    h = one.heads
    assert (h["median_diff_lo"] <= h["median_diff"]).all() and (h["median_diff"] <= h["median_diff_hi"]).all()
    assert h.loc["A", "n_positions"] == (p["label"] == "A").sum() and h.loc["A", "n_windows"] == 8


def test_the_agreement_count_and_its_interval():
    p = positions({"A": 3.0, "B": -3.0, "C": 0.0}, n_windows=6)
    b = bootstrap_effects(p, n_boot=300, alpha={"A": 1.0, "B": 2.0, "C": -1.0})
    dirs = directions(p)
    want = sum(int(dirs[lab] == s) for lab, s in (("A", 1), ("B", 1), ("C", -1)))
    a = b.agreement
    assert a["n_heads"] == 3 and a["n_agree"] == want and a["direction"] == "diff"
    assert 1 <= a["n_agree_lo"] <= a["n_agree_hi"] <= 2  # A always agrees, B never, C sometimes
    assert b.heads.loc["A", "direction_stability"] == 1.0
    with pytest.raises(OptionError, match="lacks"):
        bootstrap_effects(p, alpha={"D": 1.0})


def test_sign_stability_by_hand():
    base = positions({"A": 2.0, "B": -2.0, "C": 2.0}, seed=1)
    flipped = positions({"A": 2.0, "B": -2.0, "C": -2.0}, seed=2)
    third = positions({"A": 2.0, "B": -2.0}, seed=3)  # C not measured: left out
    s = sign_stability([base, flipped, third], names=["x", "y", "z"], alpha={"A": 1.0, "B": 1.0})
    assert list(s.heads.index) == ["A", "B"] and s.missing == ("C",)
    assert s.heads["kept"].tolist() == [True, True] and (s.n_heads, s.n_kept, s.n_changed) == (2, 2, 0)
    assert s.sets["n_agree"].tolist() == [1, 1, 1] and s.sets["name"].tolist() == ["x", "y", "z"]
    s2 = sign_stability([base, flipped])
    assert s2.heads.loc["C"].tolist() == [1, -1, False] and (s2.n_kept, s2.n_changed) == (2, 1)
    assert s2.sets[["n_raise", "n_lower"]].values.tolist() == [[2, 1], [1, 2]]


def test_refusals():
    p = positions({"A": 0.0})
    with pytest.raises(OptionTypeError):
        bootstrap_effects(p.to_dict())
    with pytest.raises(OptionError, match="lacks the columns"):
        bootstrap_effects(p.drop(columns="window"))
    with pytest.raises(OptionError, match="n_boot"):
        bootstrap_effects(p, n_boot=5)
    with pytest.raises(OptionError, match="level"):
        bootstrap_effects(p, level=1.0)
    with pytest.raises(OptionError, match="direction"):
        directions(p, "median")
    with pytest.raises(OptionError, match="two or more"):
        sign_stability([p])
    with pytest.raises(OptionError, match="names"):
        sign_stability([p, p], names=["a", "a"])
    with pytest.raises(OptionError, match="finite"):
        bootstrap_effects(p.assign(effect=np.nan))
