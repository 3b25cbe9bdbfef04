"""The paper's null controls (SPEC 4): orientation scramble and matched O/V mismatch.

Every check is against an exact construction or the dense float64 reference
(``tests/helpers.py``); the real-model test measures SmolLM2-135M.
"""

from __future__ import annotations

import inspect
import warnings

import numpy as np
import pandas as pd
import pytest
import scipy.linalg
import scipy.stats
import torch

import tl_idempotence as tli
from helpers import (
    SyntheticSource,
    closed_head_for,
    dense_closure,
    dense_closure_T,
    gaussian_layer,
    head_with,
    oblique_projection,
    pair,
    principal_bases,
    principal_cosines,
)
from tl_idempotence.analyses.base import LayerContext
from tl_idempotence.analyses.mismatch import MismatchAnalysis, mismatch_pairs
from tl_idempotence.analyses.report_options import ReportOptions
from tl_idempotence.analyses.scramble import ScrambleAnalysis, orientation_scramble
from tl_idempotence.analyses.scramble_spec import FRAC_SCRAMBLED_CLOSED
from tl_idempotence.analyses.threshold import derive_at_threshold
from tl_idempotence.core.heads import LayerHeads
from tl_idempotence.core.random import haar_orthogonal, layer_generator
from tl_idempotence.errors import OptionError, OptionTypeError
from tl_idempotence.maths.closure import closure_from_grams, layer_grams
from tl_idempotence.views.figures import scramble_figures

F64 = torch.float64


# ----------------------------------------------------------------------------- scramble


def test_haar_sampler_is_orthogonal_and_seeded():
    g = layer_generator(0, 3)
    Q = haar_orthogonal(50, 6, g)
    assert torch.allclose(Q.transpose(-1, -2) @ Q, torch.eye(6, dtype=F64).expand(50, 6, 6), atol=1e-13)
    # Same (seed, layer) -> same stream; the seed hash is numpy's SeedSequence (platform independent).
    a = torch.randn(4, generator=layer_generator(0, 3), dtype=F64)
    b = torch.randn(4, generator=layer_generator(0, 3), dtype=F64)
    c = torch.randn(4, generator=layer_generator(0, 4), dtype=F64)
    assert torch.equal(a, b) and not torch.equal(a, c)
    # Sign fix: the mean of Q[0, 0] over Haar draws is 0 (without it, QR's diag(R) > 0 convention
    # of LAPACK biases it); the first column is uniform on the sphere so E[Q00^2] = 1/r.
    Q = haar_orthogonal(20000, 6, layer_generator(1, 0))
    assert abs(float(Q[:, 0, 0].mean())) < 0.02
    assert abs(float((Q[:, 0, 0] ** 2).mean()) - 1 / 6) < 0.01
    with pytest.raises(OptionError, match=r"seed must be >= 0; got -1"):
        layer_generator(-1, 0)


def test_scramble_preserves_singular_values_norm_angles_and_spans():
    g = torch.Generator().manual_seed(0)
    d, r = 48, 8
    O = torch.randn(3, d, r, generator=g, dtype=F64)
    V = torch.randn(3, d, r, generator=g, dtype=F64)
    # head 2: rank-deficient O (rank 5) — the scramble must stay inside span(O).
    O[2] = torch.randn(d, 5, generator=g, dtype=F64) @ torch.randn(5, r, generator=g, dtype=F64)
    n = 6
    sc = tli.orientation_scramble(pair(O, V), nulls=n, seed=3)
    assert sc.K_draws.shape == (3, n, r, r)
    assert sc.rank_O.tolist() == [8, 8, 5] and sc.rank_V.tolist() == [8, 8, 8]
    for h in range(3):
        ref = dense_closure(O[h], V[h])
        T = ref["T"]
        sv_T = torch.linalg.svdvals(T)[:r]
        Q_O, Q_V, cosines = principal_bases(O[h], V[h])
        rO, rV = Q_O.shape[1], Q_V.shape[1]
        k = min(rO, rV)
        assert torch.allclose(sc.D[h, :k], cosines[:k], atol=1e-10)
        assert torch.allclose(sc.S[h], sv_T, rtol=0, atol=1e-10 * float(sv_T[0]))
        for j in range(n):
            Kt = sc.K_draws[h, j]
            # support: rows beyond rank_O / columns beyond rank_V are exactly zero
            assert float(Kt[rO:].abs().sum()) == 0 and float(Kt[:, rV:].abs().sum()) == 0
            Tt = Q_O @ Kt[:rO, :rV] @ Q_V.T  # dense scrambled head
            assert torch.allclose(torch.linalg.svdvals(Kt), sc.S[h], atol=1e-10 * float(sv_T[0]))
            assert torch.allclose(torch.linalg.svdvals(Tt)[:r], sv_T, atol=1e-10 * float(sv_T[0]))
            assert abs(float(torch.linalg.norm(Tt)) - float(ref["norm"])) < 1e-10 * float(ref["norm"])
            # spans: range(T~) ⊆ span(O), corange(T~) ⊆ span(V)
            P_O = Q_O @ Q_O.T
            P_V = Q_V @ Q_V.T
            assert float(torch.linalg.norm(Tt - P_O @ Tt)) < 1e-10 * float(ref["norm"])
            assert float(torch.linalg.norm(Tt - Tt @ P_V)) < 1e-10 * float(ref["norm"])
            if rO == rV == r:  # full rank: range/corange are the spans, so the principal angles are D
                got = principal_cosines(Tt, Tt.T)[:r]
                assert np.allclose(got, sc.D[h].numpy(), atol=1e-10)
            # the reported P of this draw is the dense P of T~
            assert abs(float(dense_closure_T(Tt)) - float(sc.P_draws[h, j])) < 1e-10
    # the trained K of every head is unchanged by construction and P matches the closure
    c = tli.closure(pair(O, V))
    assert torch.allclose(sc.P, c.P, atol=1e-12)


def test_oblique_projection_beats_every_draw():
    g = torch.Generator().manual_seed(1)
    # reference construction A (BA)^-1 B; its scramble can come close to 1 when one principal
    # angle is near 90° (singular values 1/cos: nearly rank one), but never reaches P = 1.
    Os, Vs = zip(*[oblique_projection(40, 6, g) for _ in range(3)])
    # well-conditioned projections (cosines in [0.5, 1]): no scrambled orientation is even near closed
    V2 = torch.randn(2, 40, 6, generator=g, dtype=F64)
    O2 = torch.stack([closed_head_for(V2[i], torch.linspace(1.0, 0.5, 6, dtype=F64), g) for i in range(2)])
    O = torch.cat([torch.stack(Os), O2])
    V = torch.cat([torch.stack(Vs), V2])
    n = 99
    sc = tli.orientation_scramble(pair(O, V), nulls=n, seed=0, return_K=False)
    assert torch.allclose(sc.P, torch.ones(5, dtype=F64), atol=1e-10)
    assert float(sc.P_draws.max()) < 1 - 1e-6
    assert float(sc.P_draws[3:].max()) < 0.5
    assert torch.allclose(sc.p_value, torch.full((5,), 1 / (n + 1), dtype=F64))
    assert bool(sc.beats_scramble.all())
    assert sc.K_draws is None


def test_p_value_uniform_when_trained_K_is_itself_haar():
    """Exchangeability: if K's orientation is Haar, the trained P is one more draw of the null,
    so p = (1 + #{P~ >= P})/(n + 1) is uniform on {1/(n+1), ..., 1}."""
    d, r, n = 30, 6, 19
    S = torch.linspace(2.0, 0.5, r, dtype=F64)
    cos = torch.linspace(0.95, 0.2, r, dtype=F64)
    ps = []
    gen = torch.Generator().manual_seed(11)
    for batch in range(40):
        heads = []
        for _ in range(10):
            R1, R2 = haar_orthogonal(2, r, gen)
            heads.append(head_with(S, cos, d, gen, R1, R2))
        O = torch.stack([h[0] for h in heads])
        V = torch.stack([h[1] for h in heads])
        sc = tli.orientation_scramble(pair(O, V), nulls=n, seed=5, layer=batch, return_K=False)
        ps.append(sc.p_value)
    p = torch.cat(ps).numpy()
    assert np.all(np.isin(np.round(p * (n + 1)), np.arange(1, n + 2)))
    # Randomized (continuous) p-values: exactly U(0, 1) under the null.
    u = np.random.default_rng(0).uniform(size=p.size)
    p_cont = p - u / (n + 1)
    ks = scipy.stats.kstest(p_cont, "uniform")
    assert ks.statistic < 0.08, ks
    assert abs(p.mean() - (1 + n / 2) / (n + 1)) < 0.05


@pytest.mark.parametrize("r", [64, 128])
def test_gaussian_heads_scrambled_median_is_order_one_over_r_squared(r):
    """Derivation: with X = R2ᵀ D R1 (Haar R's), E[X_ii²] = Σ D²/r² and E[X_ij²] ≈ Σ D²/r², so
    ⟨K~DK~,K~⟩ = Σ s_i³ X_ii is ≈ Gaussian with variance Σ s⁶ ΣD²/r² while ‖K~DK~‖² concentrates at
    (Σ s²)² ΣD²/r². Hence P~ ≈ χ²₁ · Σs⁶/(Σs²)³, median ≈ 0.4549 Σs⁶/(Σs²)³, which is 0.4549/r² for a
    flat spectrum (and a small multiple of it for Gaussian heads)."""
    lh = gaussian_layer(0, 8, 8, 4 * r, r, seed=r)
    g = layer_grams(lh.O, lh.V, lh.kv_head_of)
    c = closure_from_grams(g, factors=True)
    sc = orientation_scramble(c, nulls=64, seed=0, return_K=False)
    s2 = sc.S**2
    predicted = scipy.stats.chi2(1).median() * (s2**3).sum(-1) / s2.sum(-1) ** 3
    ratio = (sc.P_scrambled_median / predicted).numpy()
    assert np.all((ratio > 1 / 3) & (ratio < 3)), ratio
    med = float(sc.P_scrambled_median.median())
    assert 0.1 / r**2 < med < 10 / r**2
    # A Gaussian head is itself a random orientation: its trained P is of the same order.
    assert 0.01 / r**2 < float(c.P.median()) < 10 / r**2


def _scramble_run(lh, seed, nulls=16, threshold=0.9):
    return ScrambleAnalysis().run(LayerContext.build(lh, ReportOptions(nulls=nulls, seed=seed, threshold=threshold)))


def test_scramble_analysis_contract_and_determinism():
    lh = gaussian_layer(4, 9, 3, 40, 8, seed=2)
    a = _scramble_run(lh, seed=7)
    b = _scramble_run(lh, seed=7)
    other = _scramble_run(lh, seed=8)
    assert list(a.columns)[:4] == ["P_scrambled_median", "P_scrambled_q95", "p_value", "beats_scramble"]
    assert set(a.columns) == {
        "P_scrambled_median",
        "P_scrambled_q95",
        "p_value",
        "beats_scramble",
        "n_scramble_draws",
        "frac_scrambled_closed",
        "scramble_effect",
        "scramble_reason",
    }
    assert all(len(v) == 9 for v in a.columns.values())
    A, B = pd.DataFrame(a.columns), pd.DataFrame(b.columns)
    pd.testing.assert_frame_equal(A, B)
    pd.testing.assert_frame_equal(a.tables["scramble_draws"], b.tables["scramble_draws"])
    assert a.values == b.values
    assert not np.allclose(A["P_scrambled_median"], pd.DataFrame(other.columns)["P_scrambled_median"])
    # same numbers as the public function on the same layer (a LayerHeads supplies its layer to the seed)
    sc = tli.orientation_scramble(lh, nulls=16, seed=7, return_K=False)
    assert np.allclose(A["P_scrambled_median"], sc.P_scrambled_median.numpy(), rtol=0, atol=1e-15)
    assert np.array_equal(A["p_value"], sc.p_value.numpy())
    assert np.array_equal(A["beats_scramble"], sc.beats_scramble.numpy())
    assert (A["P_scrambled_q95"] >= A["P_scrambled_median"]).all()
    assert (A["n_scramble_draws"] == 16).all() and (A["scramble_reason"] == "").all()
    # every draw is in the long table, in (head, draw) order, equal to the public function's draws
    d = a.tables["scramble_draws"]
    assert list(d.columns) == ["layer", "head", "draw", "P"] and len(d) == 9 * 16 and (d["layer"] == 4).all()
    assert np.allclose(d["P"].to_numpy(), sc.P_draws.reshape(-1).numpy(), rtol=0, atol=1e-15)
    # Gaussian heads never reach P >= 0.9 in a scrambled orientation; at threshold 0 every draw does
    assert (A["frac_scrambled_closed"] == 0).all()
    assert (pd.DataFrame(_scramble_run(lh, seed=7, threshold=0.0).columns)["frac_scrambled_closed"] == 1).all()
    # per-layer values
    P = closure_from_grams(layer_grams(lh.O, lh.V, lh.kv_head_of)).P.numpy()
    assert a.values["median_P_scrambled"] == pytest.approx(float(np.median(A["P_scrambled_median"])), rel=1e-12)
    assert a.values["frac_beats_scramble"] == pytest.approx(float(A["beats_scramble"].mean()))
    assert a.values["trained_wins"] == bool(np.median(P) > a.values["median_P_scrambled"])
    assert a.notes == {}


def test_n_draws_is_a_deprecated_alias_of_nulls():
    lh = gaussian_layer(1, 4, 2, 24, 4, seed=3)
    new = tli.orientation_scramble(lh, nulls=8, seed=2, return_K=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        line = inspect.currentframe().f_lineno + 1
        old = tli.orientation_scramble(lh, n_draws=8, seed=2, return_K=False)
    (w,) = [w for w in caught if issubclass(w.category, DeprecationWarning)]
    assert "n_draws=...) is deprecated; use nulls=" in str(w.message)
    # attributed to the caller's line (here), not to the library's strict_kwargs wrapper (core/kwargs.py)
    assert (w.filename, w.lineno) == (__file__, line)
    assert old.P_draws.shape == (4, 8) and torch.equal(old.P_draws, new.P_draws)


def test_degenerate_heads_get_nan_and_reason():
    g = torch.Generator().manual_seed(0)
    d, r = 20, 4
    O = torch.randn(3, d, r, generator=g, dtype=F64)
    V = torch.randn(3, d, r, generator=g, dtype=F64)
    O[0] = 0.0  # zero head
    # head 1: span(O) ⟂ span(V) -> every orientation is nilpotent
    E, _ = torch.linalg.qr(torch.randn(d, 2 * r, generator=g, dtype=F64))
    V[1], O[1] = E[:, :r], E[:, r:] @ torch.randn(r, r, generator=g, dtype=F64)
    sc = tli.orientation_scramble(pair(O, V), nulls=8, seed=0, return_K=False)
    assert torch.isnan(sc.P_draws[:2]).all() and torch.isnan(sc.p_value[:2]).all()
    assert not bool(sc.beats_scramble[:2].any())
    assert "zero head" in sc.reason[0] and "orthogonal" in sc.reason[1]
    assert sc.reason[2] == "" and torch.isfinite(sc.P_draws[2]).all()


def _layer_with_undefined_heads(n_bad: int) -> LayerHeads:
    """4 heads on 4 kv heads (MHA): the first ``n_bad`` are zero heads (no comparison, no draw), head 2 (when not
    zeroed) an exact oblique projection (beats every draw), head 3 Gaussian."""
    lh = gaussian_layer(2, 4, 4, 24, 4, seed=13)
    O = lh.O.clone()
    A = torch.randn(24, 4, generator=torch.Generator().manual_seed(1), dtype=F64)
    O[2] = A @ torch.linalg.inv(lh.V[2].T @ A)
    O[:n_bad] = 0.0
    return LayerHeads(2, O, lh.V, lh.kv_head_of)


def test_layer_fractions_are_over_defined_heads_and_nan_without_one():
    """Findings F2/F3: per-layer frac_beats_scramble counts only the heads whose comparison is defined (NaN heads
    are in neither the numerator nor the denominator); frac_scrambled_closed of a head without a defined draw is
    NaN with a reason (also after a threshold change), never 0; a layer without a defined head gets NaN + note."""
    lh = _layer_with_undefined_heads(2)
    res = _scramble_run(lh, seed=3, nulls=8, threshold=0.0)
    A = pd.DataFrame(res.columns)
    assert np.isnan(A["p_value"][:2]).all() and np.isfinite(A["p_value"][2:]).all()
    beats = A["beats_scramble"].to_numpy(dtype=bool)
    assert beats[2]  # the projection beats its scramble median
    assert res.values["frac_beats_scramble"] == beats[2:].mean()  # of the 2 compared heads, not of all 4
    assert res.values["frac_beats_scramble"] != beats.mean()
    assert res.values["n_heads_compared"] == 2
    fc = A["frac_scrambled_closed"].to_numpy()
    assert np.isnan(fc[:2]).all() and (fc[2:] == 1.0).all()  # threshold 0: every defined draw is closed
    assert all("zero head" in r for r in A["scramble_reason"][:2])
    # a threshold change re-derives the column from the stored draws, keeping NaN where there is no draw
    heads = pd.DataFrame({"layer": 2, "head": range(4), "frac_scrambled_closed": fc})
    heads, _, _ = derive_at_threshold(heads, pd.DataFrame({"layer": [2]}), res.tables, [FRAC_SCRAMBLED_CLOSED], 1.1)
    got = heads["frac_scrambled_closed"].to_numpy()
    assert np.isnan(got[:2]).all() and (got[2:] == 0.0).all()
    # no defined head at all
    none = _scramble_run(_layer_with_undefined_heads(4), seed=3, nulls=8)
    assert np.isnan(none.values["frac_beats_scramble"]) and none.values["n_heads_compared"] == 0
    assert "no head of the layer" in none.notes["frac_beats_scramble"]
    assert np.isnan(pd.DataFrame(none.columns)["frac_scrambled_closed"]).all()


def test_a_defined_head_without_a_defined_draw_gets_a_reason():
    from tl_idempotence.analyses.scramble import NO_DRAWS, _scramble_reasons

    Pd = np.array([[np.nan, np.nan], [0.2, 0.95]])
    n_valid = np.array([0, 2])
    draws = pd.DataFrame({"layer": 0, "head": np.repeat([0, 1], 2), "P": Pd.reshape(-1)})
    fc = FRAC_SCRAMBLED_CLOSED.fractions(draws, [0, 0], [0, 1], 0.9)
    assert np.isnan(fc[0]) and fc[1] == 0.5
    assert list(_scramble_reasons(np.array(["", ""], dtype=object), n_valid)) == [NO_DRAWS, ""]


def test_scramble_counts_refuse_bools_floats_negatives_and_huge():
    W = (torch.randn(8, 2, dtype=F64), torch.randn(2, 8, dtype=F64))
    with pytest.raises(OptionTypeError, match="nulls must be an integer; got bool True"):
        tli.orientation_scramble(W, nulls=True)
    with pytest.warns(DeprecationWarning), pytest.raises(OptionTypeError, match="nulls must be an integer"):
        tli.orientation_scramble(W, n_draws=False)
    with pytest.raises(OptionTypeError, match=r"nulls must be an integer; got float 2\.0"):
        tli.orientation_scramble(W, nulls=2.0)
    with pytest.raises(OptionError, match="nulls must be >= 1; got -3"):
        tli.orientation_scramble(W, nulls=-3)
    with pytest.raises(OptionError, match="nulls must be <= "):
        tli.orientation_scramble(W, nulls=10**12)
    with pytest.raises(OptionTypeError, match="seed"):
        tli.orientation_scramble(W, seed=True)
    with pytest.raises(OptionTypeError, match="layer must be an integer"):
        tli.orientation_scramble(W, layer=1.0)


def test_scramble_bad_input():
    with pytest.raises(OptionError, match=r"nulls must be >= 1; got 0"):
        tli.orientation_scramble((torch.randn(8, 2), torch.randn(2, 8)), nulls=0)
    with pytest.raises(OptionError, match="factors"):
        tli.orientation_scramble(tli.closure((torch.randn(8, 2), torch.randn(2, 8)), factors=False))
    with pytest.raises(OptionTypeError, match="FactoredMatrix"):
        tli.orientation_scramble("not a head")


# ----------------------------------------------------------------------------- mismatch


@pytest.mark.parametrize("n_heads,n_kv", [(4, 4), (9, 3), (9, 1)])
def test_mismatch_pairs_are_exactly_the_cross_kv_pairs(n_heads, n_kv):
    lh = gaussian_layer(2, n_heads, n_kv, 36, 6, seed=n_heads + n_kv)
    tab, note = mismatch_pairs(lh)
    kv = lh.kv_head_of.tolist()
    expected = {(i, g) for i in range(n_heads) for g in range(n_kv) if g != kv[i]}
    got = set(zip(tab["head"].tolist(), tab["v_head"].tolist())) if len(tab) else set()
    assert got == expected and len(tab) == len(expected)
    assert len(expected) == n_heads * (n_kv - 1)
    res = MismatchAnalysis().run(LayerContext.build(lh, ReportOptions(nulls=16, threshold=0.9)))
    summ = res.values
    assert set(summ) == {
        "n_mismatch_pairs",
        "mismatch_P_max",
        "mismatch_P_median",
        "n_mismatch_closed",
        "mismatch_note",
    }
    pd.testing.assert_frame_equal(res.tables["mismatch_pairs"], tab)
    assert summ["n_mismatch_pairs"] == len(expected)
    if n_kv == 1:
        assert "one kv head" in note and summ["mismatch_note"] == note
        assert np.isnan(summ["mismatch_P_max"]) and summ["n_mismatch_closed"] == 0
        assert res.notes == {"mismatch_P_max": note, "mismatch_P_median": note}
        return
    assert note == ""
    for _, row in tab.sample(n=min(5, len(tab)), random_state=0).iterrows():
        ref = dense_closure(lh.O[int(row["head"])], lh.V[int(row["v_head"])])
        assert abs(row["P"] - float(ref["P"])) < 1e-10
        assert abs(row["alpha"] - float(ref["alpha"])) < 1e-10 * abs(float(ref["alpha"])) + 1e-12
        assert int(row["kv_head"]) == kv[int(row["head"])]
    assert summ["mismatch_P_max"] == pytest.approx(tab["P"].max())
    # reusing the layer's Gram products gives the same table
    tab_g, _ = mismatch_pairs(lh, g=layer_grams(lh.O, lh.V, lh.kv_head_of))
    pd.testing.assert_frame_equal(tab, tab_g, check_exact=False, rtol=1e-12)
    assert summ["mismatch_P_median"] == pytest.approx(tab["P"].median())
    assert summ["n_mismatch_closed"] == int((tab["P"] >= 0.9).sum()) and res.notes == {}


def test_mismatch_counts_a_closed_cross_pair():
    """Make O_0 V_2ᵀ an exact oblique projection (head 0 reads kv 0): the mismatch must find it."""
    lh = gaussian_layer(0, 9, 3, 30, 5, seed=1)
    g = torch.Generator().manual_seed(9)
    A = torch.randn(30, 5, generator=g, dtype=F64)
    B = lh.V[2].T
    O = lh.O.clone()
    O[0] = A @ torch.linalg.inv(B @ A)
    lh2 = LayerHeads(0, O, lh.V, lh.kv_head_of)
    res = tli.mismatch(lh2, threshold=0.9)
    closed = res.pairs[res.pairs["closed"]]
    assert list(zip(closed["head"], closed["v_head"])) == [(0, 2)]
    assert float(closed["P"].iloc[0]) == pytest.approx(1.0, abs=1e-10)
    assert res.layers.loc[0, "n_mismatch_closed"] == 1 and res.layers.loc[0, "mismatch_P_max"] == pytest.approx(1.0)


# ----------------------------------------------------------------------------- report integration


def _synthetic_model():
    lhs = [gaussian_layer(l, 9, 3, 48, 8, seed=100 + l) for l in range(3)]
    # Layer 1, head 4: an exact oblique projection (closed), so the trained orientation clearly wins.
    g = torch.Generator().manual_seed(5)
    O = lhs[1].O.clone()
    O[4] = closed_head_for(lhs[1].V[1], torch.linspace(1.0, 0.5, 8, dtype=F64), g)
    lhs[1] = LayerHeads(1, O, lhs[1].V, lhs[1].kv_head_of)
    return SyntheticSource(lhs)


PAPER_TABLE_COLUMNS = ["quantity", "value", "n", "of", "paper_low", "paper_high", "note"]
PAPER_ROWS = [  # (quantity, paper_low, paper_high) in row order
    ("heads with P >= 0.9", 0.0398, 0.08),
    ("matched O/V mismatch pairs with P >= 0.9", 0.0, 0.0),
    ("median P, trained", 0.336, 0.336),
    ("median P, orientation-scrambled", 1.04e-4, 1.04e-4),
    ("heads whose trained orientation beats its scramble median", 0.9864, 0.9864),
    ("layers where the trained orientation wins (median P)", 1.0, 1.0),
    ("layers where P >= 0.9 is feasible (constructive search)", 1.0, 1.0),
]


def _check_paper_columns(tab):
    assert list(tab.columns) == PAPER_TABLE_COLUMNS and len(tab) == len(PAPER_ROWS)
    assert list(tab["quantity"]) == [q for q, _, _ in PAPER_ROWS]
    assert list(tab["paper_low"]) == [lo for _, lo, _ in PAPER_ROWS]
    assert list(tab["paper_high"]) == [hi for _, _, hi in PAPER_ROWS]
    assert tab["value"].dtype == np.float64 and str(tab["n"].dtype) == "Int64" and str(tab["of"].dtype) == "Int64"


def test_report_with_controls_and_paper_table():
    src = _synthetic_model()
    rep = tli.idempotence_report(src, nulls=16, seed=1, progress=False)
    for col in ["P_scrambled_median", "P_scrambled_q95", "p_value", "beats_scramble"]:
        assert col in rep.heads.columns
    for col in ["median_P_scrambled", "trained_wins", "n_mismatch_pairs", "mismatch_P_max", "n_mismatch_closed"]:
        assert col in rep.layers.columns
    s = rep.summary
    assert s["n_mismatch_pairs"] == 3 * 18
    assert s["n_closed"] == 1
    row = rep.heads.loc["L1H4"]  # heads are indexed by TransformerLens labels
    assert row["layer"] == 1 and row["head"] == 4
    assert row["P"] == pytest.approx(1.0) and row["beats_scramble"] and row["p_value"] == pytest.approx(1 / 17)
    assert s["median_P_trained"] == pytest.approx(float(np.median(rep.heads["P"])))
    assert s["median_P_scrambled"] == pytest.approx(float(np.median(rep.heads["P_scrambled_median"])))
    assert s["n_heads_beating_scramble"] == int(rep.heads["beats_scramble"].sum())
    assert s["n_layers_trained_wins"] == int(rep.layers["trained_wins"].sum())
    # the paper table: numbers (one row per headline quantity of the abstract)
    tab = rep.paper_table()
    _check_paper_columns(tab)
    assert tab.loc[0, "value"] == pytest.approx(1 / 27) and (tab.loc[0, "n"], tab.loc[0, "of"]) == (1, 27)
    assert tab.loc[1, "value"] == pytest.approx(s["n_mismatch_closed"] / 54)
    assert (tab.loc[1, "n"], tab.loc[1, "of"]) == (s["n_mismatch_closed"], 54)
    assert tab.loc[2, "value"] == pytest.approx(s["median_P_trained"]) and tab.loc[2, "n"] == 27
    assert tab.loc[3, "value"] == pytest.approx(s["median_P_scrambled"]) and tab.loc[3, "n"] == 27
    assert tab.loc[4, "value"] == pytest.approx(s["n_heads_beating_scramble"] / 27)
    assert (tab.loc[4, "n"], tab.loc[4, "of"]) == (s["n_heads_beating_scramble"], 27)
    assert tab.loc[5, "value"] == pytest.approx(s["n_layers_trained_wins"] / 3)
    assert (tab.loc[5, "n"], tab.loc[5, "of"]) == (s["n_layers_trained_wins"], 3)
    assert list(tab["note"][:6]) == [""] * 6
    # search did not run: NaN with a note, no exception
    assert np.isnan(tab.loc[6, "value"]) and pd.isna(tab.loc[6, "n"]) and pd.isna(tab.loc[6, "of"])
    assert tab.loc[6, "note"] == "not run: make the report with search=True / --search"
    # ... and the same table as display strings
    f = rep.paper_table(formatted=True)
    assert list(f.columns) == ["quantity", "this model", "paper"] and len(f) == 7
    assert list(f["quantity"]) == list(tab["quantity"])
    assert f.loc[0, "this model"] == f"{100 / 27:.2f} % (1/27)"
    assert f.loc[0, "paper"] == "3.98-8.00 % (per model)" and f.loc[1, "paper"] == "none"
    assert f.loc[2, "this model"] == f"{s['median_P_trained']:.3g}" and f.loc[2, "paper"] == "0.336"
    assert f.loc[3, "paper"] == "0.000104" and f.loc[4, "paper"] == "98.64 %" and f.loc[5, "paper"] == "all"
    assert f.loc[6, "this model"] == "not run: make the report with search=True / --search"
    figs = scramble_figures(rep)
    assert len(figs) == 2 and all(f.layout.yaxis.type == "log" for f in figs)
    names = [tr.name for tr in figs[0].data]
    assert names == ["scrambled q95", "scrambled median", "trained P", "closed (P >= 0.9)", "P = 0.9 (closed above)"]
    assert len(figs[0].data[2].y) == 27 and np.array_equal(figs[0].data[2].y, rep.heads["P"].to_numpy())
    assert len(figs[0].data[3].y) == 1 and figs[0].data[3].y[0] == rep.heads.loc[rep.heads["closed"], "P"].iloc[0]
    # the log P axis runs up to 1 (P <= 1) and down to below the smallest positive P shown
    for fig, shown in zip(
        figs,
        [
            rep.heads[["P", "P_scrambled_median", "P_scrambled_q95"]],
            rep.layers[["median_P", "median_P_scrambled", "mismatch_P_max"]],
        ],
    ):
        lo, hi = fig.layout.yaxis.range
        v = shown.to_numpy(dtype=float)
        assert 0.0 <= hi <= 0.1 and lo < np.log10(v[np.isfinite(v) & (v > 0)].min())
    # per-layer seeding: a report on layer 2 alone gives the same scramble columns for layer 2
    rep2 = tli.idempotence_report(src, nulls=16, seed=1, layers=[2], progress=False)
    a = rep.heads[rep.heads["layer"] == 2]
    assert list(rep2.heads.index) == list(a.index) == [f"L2H{h}" for h in range(9)]
    assert np.array_equal(a["P_scrambled_median"].to_numpy(), rep2.heads["P_scrambled_median"].to_numpy())


def test_paper_table_without_controls_has_nan_rows_with_notes():
    rep = tli.idempotence_report(_synthetic_model(), progress=False)
    tab = rep.paper_table()  # never raises: rows that did not run are NaN and say why
    _check_paper_columns(tab)
    assert tab.loc[0, "value"] == pytest.approx(1 / 27) and (tab.loc[0, "n"], tab.loc[0, "of"]) == (1, 27)
    assert tab.loc[2, "value"] == pytest.approx(rep.summary["median_P"]) and tab.loc[2, "note"] == ""
    no_nulls = "not run: make the report with nulls=True / --nulls 64 (orientation scramble + O/V mismatch)"
    for i in (1, 3, 4, 5):
        assert np.isnan(tab.loc[i, "value"])
        assert tab.loc[i, "note"] == no_nulls
    no_search = "not run: make the report with search=True / --search"
    assert np.isnan(tab.loc[6, "value"]) and tab.loc[6, "note"] == no_search
    f = rep.paper_table(formatted=True)
    assert f.loc[1, "this model"].startswith("not run: make the report with nulls=True / --nulls 64")
    with pytest.raises(OptionError, match="nulls=True"):
        scramble_figures(rep)


def test_mqa_report_says_no_pair():
    lhs = [gaussian_layer(l, 6, 1, 24, 4, seed=l) for l in range(2)]
    rep = tli.idempotence_report(SyntheticSource(lhs), nulls=8, progress=False)
    assert rep.summary["n_mismatch_pairs"] == 0
    tab = rep.paper_table()
    assert np.isnan(tab.loc[1, "value"]) and (tab.loc[1, "n"], tab.loc[1, "of"]) == (0, 0)
    assert tab.loc[1, "note"].startswith("no valid pair: ")
    assert tab.loc[1, "note"].endswith("one kv head (MQA), every query head reads the same V")
    assert rep.paper_table(formatted=True).loc[1, "this model"] == tab.loc[1, "note"]


def test_mqa_paper_table_note_says_no_valid_pair_once():
    lhs = [gaussian_layer(l, 6, 1, 24, 4, seed=l) for l in range(2)]
    rep = tli.idempotence_report(SyntheticSource(lhs), nulls=8, progress=False)
    assert rep.paper_table().loc[1, "note"].count("no valid pair") == 1


# ----------------------------------------------------------------------------- real model
